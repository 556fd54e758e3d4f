// Linear, RMSNorm and RoPE (fast, fp32 and bf16) against the fp64 reference, with tolerances from
// a plain float implementation of the same op measured in the same test.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "laga/mla/config.hpp"
#include "laga/ops/linear.hpp"
#include "laga/ops/rmsnorm.hpp"
#include "laga/ops/rope.hpp"
#include "reference/ops_ref.hpp"
#include "testing.hpp"

using namespace laga;
using namespace laga::testing;

namespace {

// Plain float linear (the baseline): y = x·wᵀ with fp32 accumulation, rounded to dtype.
ref::Array plain_linear(const ref::Array& x, const ref::Array& w, DType t) {
  int64_t I = w.shape[1], O = w.shape[0], M = x.numel() / I;
  ref::Array y({M, O});
  for (int64_t m = 0; m < M; ++m)
    for (int64_t o = 0; o < O; ++o) {
      float s = 0;
      for (int64_t i = 0; i < I; ++i) s += float(x[m * I + i]) * float(w[o * I + i]);
      y[m * O + o] = round_to(t, s);
    }
  return y;
}

class OpsTest : public ::testing::TestWithParam<DType> {};

}  // namespace

TEST_P(OpsTest, LinearForwardAndBackwardMatchReference) {
  const DType t = GetParam();
  const int64_t M = 37, I = 70, O = 45;
  Tensor x = random_tensor({M, I}, t, 1, "x"), w = random_tensor({O, I}, t, 2, "w", 0.1);
  Tensor dy = random_tensor({M, O}, t, 3, "dy");
  ref::Array xr = ref::from_tensor(x), wr = ref::from_tensor(w), dyr = ref::from_tensor(dy);

  Tensor y = linear_forward(x, w, "y");
  ref::Array y_ref = ref::linear_forward(xr, wr);
  double base = max_abs_diff(plain_linear(xr, wr, t), y_ref);
  EXPECT_TRUE(within_baseline(max_abs_diff(y, y_ref), base, max_abs(y_ref)))
      << max_abs_diff(y, y_ref) << " vs " << base;

  Tensor dx = Tensor::empty({M, I}, t, "dx");
  Tensor dw = Tensor::zeros({O, I}, t, "dw");
  linear_backward(x, w, dy, &dx, false, dw);
  auto g = ref::linear_backward(xr, wr, dyr);
  // Baselines: the same plain float product for each gradient.
  ref::Array wt({I, O}), dyt({O, M});
  for (int64_t o = 0; o < O; ++o)
    for (int64_t i = 0; i < I; ++i) wt[i * O + o] = wr[o * I + i];
  for (int64_t m = 0; m < M; ++m)
    for (int64_t o = 0; o < O; ++o) dyt[o * M + m] = dyr[m * O + o];
  ref::Array xt({I, M});
  for (int64_t m = 0; m < M; ++m)
    for (int64_t i = 0; i < I; ++i) xt[i * M + m] = xr[m * I + i];
  double base_dx = max_abs_diff(plain_linear(dyr, wt, t), g.dx);
  double base_dw = max_abs_diff(plain_linear(dyt, xt, t), g.dw);
  EXPECT_TRUE(within_baseline(max_abs_diff(dx, g.dx), base_dx, max_abs(g.dx)));
  EXPECT_TRUE(within_baseline(max_abs_diff(dw, g.dw), base_dw, max_abs(g.dw)));

  // dx accumulates when asked: dx += dy·w once more doubles it.
  linear_backward(x, w, dy, &dx, true, dw);
  ref::Array twice = g.dx;
  for (double& v : twice.data) v *= 2;
  EXPECT_TRUE(within_baseline(max_abs_diff(dx, twice), 2 * base_dx, max_abs(twice)));
}

TEST_P(OpsTest, RmsNormForwardAndBackwardMatchReference) {
  const DType t = GetParam();
  const int64_t M = 29, C = 96;
  const double eps = 1e-6;
  Tensor x = random_tensor({M, C}, t, 4, "x"), w = random_tensor({C}, t, 5, "w", 0.2);
  Tensor dy = random_tensor({M, C}, t, 6, "dy");
  ref::Array xr = ref::from_tensor(x), wr = ref::from_tensor(w), dyr = ref::from_tensor(dy);
  Tensor y = rmsnorm_forward(x, w, eps, "y");
  ref::Array y_ref = ref::rmsnorm_forward(xr, wr, eps);
  Tensor dx = Tensor::empty({M, C}, t, "dx"), dw = Tensor::zeros({C}, t, "dw");
  rmsnorm_backward(x, w, dy, eps, dx, dw);
  auto g = ref::rmsnorm_backward(xr, wr, dyr, eps);
  // Baseline: the exact result rounded to the storage dtype (a plain float implementation cannot do
  // better than one rounding), with a floor for fp32 accumulation over C or M terms.
  auto check = [&](const Tensor& got, const ref::Array& want, const char* what) {
    double base = max_abs_diff(rounded(want, t), want);
    double floor = t == DType::f32 ? 1e-6 : 1e-3;
    EXPECT_TRUE(within_baseline(max_abs_diff(got, want), base, max_abs(want), 4.0, floor))
        << what << ": " << max_abs_diff(got, want) << " vs baseline " << base;
  };
  check(y, y_ref, "y");
  check(dx, g.dx, "dx");
  check(dw, g.dw, "dw");
}

// The weight gradient is a sum over every row (every token of a rank: T·B/P of them) and is summed
// in fp64, rounded once into dw. With positive terms the exact sum is about M times a term, and the
// only other errors are the per-row rstd's fp32 rounding (random in sign, about eps/√M of the sum
// here), so the result is the exact gradient to about one rounding. Summed in fp32, 8192 such terms
// keep a relative error of tens of ulps (the old fp32 sum: 14 of these 16 elements off by more than
// one ulp, the worst by 23); the same kind of sum was the largest error of the norm gradients in
// every form (src/ops/rmsnorm.cpp).
TEST(Ops, RmsNormWeightGradientIsRoundedOnceOverManyRows) {
  const int64_t M = 8192, C = 16;
  const double eps = 1e-6;
  std::mt19937_64 rng(77);
  std::uniform_real_distribution<float> pos(0.5f, 1.5f);
  std::vector<float> xv(static_cast<size_t>(M * C)), dyv(xv.size()), wv(static_cast<size_t>(C)),
      dw0(wv.size());
  for (float& v : xv) v = pos(rng);
  for (float& v : dyv) v = pos(rng);
  for (float& v : wv) v = pos(rng);
  // dw accumulates (+=): a nonzero start is part of the one sum
  for (float& v : dw0) v = 100.0f * pos(rng);
  Tensor x = Tensor::from_floats({M, C}, DType::f32, xv, "x"),
         dy = Tensor::from_floats({M, C}, DType::f32, dyv, "dy");
  Tensor w = Tensor::from_floats({C}, DType::f32, wv, "w"),
         dw = Tensor::from_floats({C}, DType::f32, dw0, "dw");
  Tensor dx = Tensor::empty({M, C}, DType::f32, "dx");
  rmsnorm_backward(x, w, dy, eps, dx, dw);
  const auto g =
      ref::rmsnorm_backward(ref::from_tensor(x), ref::from_tensor(w), ref::from_tensor(dy), eps);
  const ref::Array got = ref::from_tensor(dw);
  for (int64_t c = 0; c < C; ++c) {
    const double want = double(dw0[size_t(c)]) + g.dw[c];
    const double ulps = std::abs(got[c] - want) / (std::abs(want) * 0x1p-23);
    EXPECT_LE(ulps, 1.0) << "dw[" << c << "] = " << got[c] << ", exact " << want;
  }
}

TEST_P(OpsTest, RopeForwardAndBackwardMatchReferenceBothLayouts) {
  const DType t = GetParam();
  for (bool interleaved : {true, false}) {
    MlaConfig c = MlaConfig::preset("tiny");
    c.dtype = t;
    c.rope_interleaved = interleaved;
    c.qk_rope_head_dim = 16;
    const int64_t T = 13, inner = 6, Dr = 16, pos0 = 4096 + 37;  // beyond YaRN's original length
    Tensor x = random_tensor({T, inner, Dr}, t, 7, "x");
    ref::Array xr = ref::from_tensor(x);
    RopeParams p = rope_params(c.rope(), c.dtype);
    p.x = x.raw(), p.T = T, p.inner = inner, p.t_stride = inner * Dr, p.inner_stride = Dr,
    p.pos0 = pos0;
    rope_forward(p);
    ref::Array y_ref = ref::rope_forward(xr, c, pos0);
    double floor = t == DType::f32 ? 1e-6 : 1e-3;
    EXPECT_TRUE(within_baseline(max_abs_diff(x, y_ref), max_abs_diff(rounded(y_ref, t), y_ref), 2.0,
                                4.0, floor))
        << "forward, interleaved " << interleaved;
    Tensor dy = random_tensor({T, inner, Dr}, t, 8, "dy");
    ref::Array dyr = ref::from_tensor(dy);
    p.x = dy.raw();
    rope_backward(p);
    ref::Array dx_ref = ref::rope_backward(dyr, c, pos0);
    EXPECT_TRUE(within_baseline(max_abs_diff(dy, dx_ref), max_abs_diff(rounded(dx_ref, t), dx_ref),
                                2.0, 4.0, floor))
        << "backward, interleaved " << interleaved;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, OpsTest, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });
