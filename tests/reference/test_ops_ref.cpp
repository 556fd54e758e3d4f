// The fp64 reference ops (reference/ops_ref.cpp) checked two ways: every backward against central
// finite differences of a random-projection loss L = ⟨g, y⟩ (g random: never sum(y)), and facts
// about RoPE/YaRN that hold independently of any code — norm preservation, the identity at
// position 0, plain frequencies, DeepSeek-V3's YaRN correction range worked out by hand, relative
// positions, the two layouts being one permutation apart. The math is in docs/design.md §1.1 and
// docs/block.md.
//
// Frequencies are measured through rope_forward itself (the angle a unit pair turns by at position
// 1), so no test reads MlaConfig::rope_inv_freq(): the reference and the fast code stay
// independent.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <functional>
#include <numbers>

#include "laga/mla/config.hpp"
#include "laga/core/random.hpp"
#include "reference/ops_ref.hpp"

using namespace laga;
using laga::ref::Array;

namespace {

Array random_array(const Shape& s, const std::string& name, double std = 1.0, double mean = 0.0,
                   uint64_t seed = 7) {
  Array a(s);
  const uint64_t stream = stream_id(name);
  for (int64_t i = 0; i < a.numel(); ++i) a[i] = mean + std * normal(seed, stream, uint64_t(i));
  return a;
}

double dot(const Array& a, const Array& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences on every entry of `param` against the analytic gradient `grad` of L(param).
// Step and tolerance: L here is a sum of ~10² terms of size O(1), so the rounding error of one
// difference is ≈ u · Σ|g·y| / ε ≈ 1e-16 · 1e2 / 1e-5 = 1e-9, and the truncation error ε²/6 · L'''
// is ≈ 1e-11 (RoPE and linear are linear in the checked input: no truncation error at all).
// Gradients are O(0.1–1), so the relative error should sit near 1e-8; 1e-6 keeps two orders of
// margin, while a wrong sign, a dropped term or a swapped index shows as 1e-2 or more. The error is
// taken relative to max(|analytic|, rms of the whole gradient), since the absolute error does not
// shrink with the entry.
double max_fd_error(Array param, const Array& grad,
                    const std::function<double(const Array&)>& loss) {
  constexpr double eps = 1e-5;
  double rms = 0;
  for (int64_t i = 0; i < grad.numel(); ++i) rms += grad[i] * grad[i];
  rms = std::sqrt(rms / double(grad.numel()));
  double worst = 0;
  for (int64_t i = 0; i < param.numel(); ++i) {
    const double p = param[i];
    param[i] = p + eps;
    const double up = loss(param);
    param[i] = p - eps;
    const double down = loss(param);
    param[i] = p;
    const double fd = (up - down) / (2 * eps);
    worst = std::max(worst, std::abs(fd - grad[i]) / std::max(std::abs(grad[i]), rms));
  }
  return worst;
}

constexpr double kFdTolerance = 1e-6;

// Checks one gradient and records the measured error in the test's XML output (--gtest_output=xml).
void expect_fd(const std::string& what, const Array& param, const Array& grad,
               const std::function<double(const Array&)>& loss) {
  const double err = max_fd_error(param, grad, loss);
  EXPECT_LT(err, kFdTolerance) << what;
  testing::Test::RecordProperty("max_relative_error." + what, fmt::format("{:.2e}", err));
}

MlaConfig rope_config(int64_t Dr, bool interleaved, bool yarn) {
  MlaConfig c = MlaConfig::preset("tiny");
  c.qk_rope_head_dim = Dr;
  c.rope_interleaved = interleaved;
  c.rope_scaling.enabled = yarn;
  return c;
}

// The two indices docs/design.md §1.1 pairs under each layout.
int64_t first(const MlaConfig& c, int64_t i) { return c.rope_interleaved ? 2 * i : i; }
int64_t second(const MlaConfig& c, int64_t i) {
  return c.rope_interleaved ? 2 * i + 1 : i + c.qk_rope_head_dim / 2;
}

// The frequency of each pair, measured: rotate (1, 0) at position 1 and read the angle.
std::vector<double> measured_inv_freq(const MlaConfig& c) {
  const int64_t Dr = c.qk_rope_head_dim;
  Array x({1, Dr});
  for (int64_t i = 0; i < Dr / 2; ++i) x[first(c, i)] = 1.0;
  const Array y = ref::rope_forward(x, c, /*pos0=*/1);
  std::vector<double> f;
  for (int64_t i = 0; i < Dr / 2; ++i) f.push_back(std::atan2(y[second(c, i)], y[first(c, i)]));
  return f;
}

double pair_norm(const Array& a, const MlaConfig& c, int64_t row, int64_t i) {
  const int64_t Dr = c.qk_rope_head_dim;
  return std::hypot(a[row * Dr + first(c, i)], a[row * Dr + second(c, i)]);
}

// Every (layout, YaRN) combination the tests sweep.
std::vector<MlaConfig> rope_variants(int64_t Dr) {
  std::vector<MlaConfig> v;
  for (bool interleaved : {true, false})
    for (bool yarn : {true, false}) v.push_back(rope_config(Dr, interleaved, yarn));
  return v;
}

std::string variant_name(const MlaConfig& c) {
  return std::string(c.rope_interleaved ? "interleaved" : "halves") +
         (c.rope_scaling.enabled ? ", yarn" : ", plain");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Finite differences

TEST(LinearRef, GradientsMatchFiniteDifferences) {
  const Array x = random_array({3, 2, 5}, "x"), w = random_array({4, 5}, "w"),
              g = random_array({3, 2, 4}, "g");
  const auto grads = ref::linear_backward(x, w, g);
  EXPECT_EQ(grads.dx.shape, x.shape);
  EXPECT_EQ(grads.dw.shape, w.shape);
  expect_fd("dx", x, grads.dx, [&](const Array& p) { return dot(g, ref::linear_forward(p, w)); });
  expect_fd("dw", w, grads.dw, [&](const Array& p) { return dot(g, ref::linear_forward(x, p)); });
}

// The reference's products run blocks of kRefRows output rows in parallel; every sum keeps the
// order one thread gives it, so the bits depend neither on the thread count nor on the blocks: 13
// rows and 11 output columns are one block of 8 and a part block either way, in both accumulations.
TEST(LinearRef, IsIndependentOfThreadCount) {
  const Array x = random_array({13, 7}, "x"), w = random_array({11, 7}, "w"),
              dy = random_array({13, 11}, "dy");
  for (ref::Accum acc : {ref::Accum::exact, ref::Accum::f32}) {
    std::vector<Array> runs[2];
    const int keep = omp_get_max_threads();
    for (int i = 0; i < 2; ++i) {
      omp_set_num_threads(i == 0 ? 1 : 3);
      const ref::LinearGrads g = ref::linear_backward(x, w, dy, acc);
      runs[i] = {ref::linear_forward(x, w, acc), g.dx, g.dw};
    }
    omp_set_num_threads(keep);
    for (size_t t = 0; t < runs[0].size(); ++t)
      EXPECT_EQ(runs[0][t].data, runs[1][t].data) << "output " << t;
  }
}

TEST(RmsNormRef, GradientsMatchFiniteDifferences) {
  // eps 1e-6 (DeepSeek's) and a large eps, so that the eps term inside the root is exercised too.
  for (double eps : {1e-6, 0.5}) {
    SCOPED_TRACE(eps);
    const Array x = random_array({3, 2, 7}, "x"), w = random_array({7}, "w", 0.1, 1.0),
                g = random_array({3, 2, 7}, "g");
    const auto grads = ref::rmsnorm_backward(x, w, g, eps);
    EXPECT_EQ(grads.dx.shape, x.shape);
    EXPECT_EQ(grads.dw.shape, w.shape);
    const std::string tag = fmt::format("eps_{}", eps);
    expect_fd("dx." + tag, x, grads.dx,
              [&](const Array& p) { return dot(g, ref::rmsnorm_forward(p, w, eps)); });
    expect_fd("dw." + tag, w, grads.dw,
              [&](const Array& p) { return dot(g, ref::rmsnorm_forward(x, p, eps)); });
  }
}

TEST(RopeRef, GradientsMatchFiniteDifferences) {
  for (MlaConfig c : rope_variants(8)) {
    c.rope_scaling.mscale_all_dim = 0.5;  // attention factor ≠ 1 when YaRN is on
    for (int64_t pos0 : {0, 5, 1000}) {
      SCOPED_TRACE(variant_name(c) + ", pos0 " + std::to_string(pos0));
      const Array x = random_array({4, 3, 8}, "x"), g = random_array({4, 3, 8}, "g");
      const Array dx = ref::rope_backward(g, c, pos0);
      EXPECT_EQ(dx.shape, x.shape);
      const std::string tag =
          fmt::format("{}_{}_pos{}", c.rope_interleaved ? "interleaved" : "halves",
                      c.rope_scaling.enabled ? "yarn" : "plain", pos0);
      expect_fd("dx." + tag, x, dx,
                [&](const Array& p) { return dot(g, ref::rope_forward(p, c, pos0)); });
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Facts about RoPE/YaRN that hold whatever the code

TEST(RopeRef, PreservesPairNorms) {
  // With mscale = mscale_all_dim (DeepSeek-V3's) the attention factor is 1: a pure rotation.
  for (const MlaConfig& c : rope_variants(8)) {
    SCOPED_TRACE(variant_name(c));
    const Array x = random_array({6, 2, 8}, "x");
    const Array y = ref::rope_forward(x, c, 3);
    for (int64_t row = 0; row < 12; ++row)
      for (int64_t i = 0; i < 4; ++i)
        EXPECT_NEAR(pair_norm(y, c, row, i), pair_norm(x, c, row, i), 1e-14);
  }
}

TEST(RopeRef, ScalesPairNormsByYarnAttentionFactor) {
  // factor 40, mscale 1, mscale_all_dim 0.5: yarn_mscale(40, 1) / yarn_mscale(40, 0.5)
  //   = (0.1 · ln 40 + 1) / (0.05 · ln 40 + 1) = 1.3688879 / 1.1844440 = 1.1557220.
  MlaConfig c = rope_config(8, true, true);
  c.rope_scaling.mscale_all_dim = 0.5;
  const double factor = (0.1 * std::log(40.0) + 1) / (0.05 * std::log(40.0) + 1);
  EXPECT_NEAR(factor, 1.1557220, 1e-7);
  const Array x = random_array({5, 8}, "x");
  const Array y = ref::rope_forward(x, c, 2);
  for (int64_t row = 0; row < 5; ++row)
    for (int64_t i = 0; i < 4; ++i)
      EXPECT_NEAR(pair_norm(y, c, row, i), factor * pair_norm(x, c, row, i), 1e-13);
}

TEST(RopeRef, IsIdentityAtPositionZero) {
  for (const MlaConfig& c : rope_variants(8)) {
    SCOPED_TRACE(variant_name(c));
    const Array x = random_array({1, 3, 8}, "x");
    const Array y = ref::rope_forward(x, c, 0);
    for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(y[i], x[i]);
  }
}

TEST(RopeRef, BackwardIsTheInverseRotation) {
  // Rᵀ R = 1, so rope_backward(rope_forward(x)) = factor² · x.
  for (MlaConfig c : rope_variants(8)) {
    c.rope_scaling.mscale_all_dim = 0.5;
    SCOPED_TRACE(variant_name(c));
    const double f2 = c.rope_scaling.enabled
                          ? std::pow((0.1 * std::log(40.0) + 1) / (0.05 * std::log(40.0) + 1), 2)
                          : 1.0;
    const Array x = random_array({4, 2, 8}, "x");
    const Array back = ref::rope_backward(ref::rope_forward(x, c, 77), c, 77);
    for (int64_t i = 0; i < x.numel(); ++i) EXPECT_NEAR(back[i], f2 * x[i], 1e-13);
  }
}

TEST(RopeRef, PlainFrequenciesAreThetaPowers) {
  // Without rope_scaling: inv_freq[i] = theta^(-2i/Dr), whatever the layout.
  for (bool interleaved : {true, false}) {
    MlaConfig c = rope_config(16, interleaved, false);
    const auto f = measured_inv_freq(c);
    for (int64_t i = 0; i < 8; ++i)
      EXPECT_NEAR(f[size_t(i)], std::pow(10000.0, -2.0 * double(i) / 16.0), 1e-15) << i;
  }
}

TEST(RopeRef, YarnCorrectionRangeMatchesDeepSeekV3ByHand) {
  // DeepSeek-V3: Dr 64, theta 10000, L0 4096, beta_fast 32, beta_slow 1, factor 40. By hand,
  // with 2 ln 10000 = 18.420681:
  //   corr(32) = 64 · ln(4096 / (2π · 32)) / 18.420681 = 64 · ln(20.371833) / 18.420681
  //            = 64 · 3.014153 / 18.420681 = 10.472  → low  = floor = 10
  //   corr(1)  = 64 · ln(4096 / 2π) / 18.420681      = 64 · ln(651.898658) / 18.420681
  //            = 64 · 6.479754 / 18.420681 = 22.513  → high = ceil  = 23
  // so pairs 0..10 keep theta^(-2i/64), pairs 23..31 are divided by 40, and pair i between
  // interpolates with ramp (i - 10) / 13.
  EXPECT_NEAR(64 * std::log(4096 / (2 * std::numbers::pi * 32)) / (2 * std::log(10000.0)), 10.472,
              1e-3);
  EXPECT_NEAR(64 * std::log(4096 / (2 * std::numbers::pi * 1)) / (2 * std::log(10000.0)), 22.513,
              1e-3);
  for (bool interleaved : {true, false}) {
    MlaConfig c = rope_config(64, interleaved, true);
    c.rope_theta = 10000;
    c.rope_scaling.factor = 40;
    c.rope_scaling.original_max_position_embeddings = 4096;
    c.rope_scaling.beta_fast = 32;
    c.rope_scaling.beta_slow = 1;
    const auto f = measured_inv_freq(c);
    for (int64_t i = 0; i < 32; ++i) {
      const double plain = std::pow(10000.0, -2.0 * double(i) / 64.0);
      const double ramp = std::clamp((double(i) - 10) / 13.0, 0.0, 1.0);
      const double expected = plain / 40 * ramp + plain * (1 - ramp);
      EXPECT_NEAR(f[size_t(i)] / expected, 1.0, 1e-12) << "pair " << i;
      if (i <= 10) {
        EXPECT_NEAR(f[size_t(i)] / plain, 1.0, 1e-12) << "pair " << i << " must be unscaled";
      }
      if (i >= 23) {
        EXPECT_NEAR(f[size_t(i)] / plain, 1.0 / 40, 1e-12)
            << "pair " << i << " must be divided by 40";
      }
    }
  }
}

TEST(RopeRef, DotProductDependsOnlyOnRelativePosition) {
  // ⟨rope(q, m), rope(k, n)⟩ = factor² · qᵀ R(m)ᵀ R(n) k = factor² · qᵀ R(n - m) k: the same for
  // every shift of both positions. With factor ≠ 1 it is factor² times the plain rotation's value.
  for (MlaConfig c : rope_variants(8)) {
    c.rope_scaling.mscale_all_dim = 0.5;
    SCOPED_TRACE(variant_name(c));
    const Array q = random_array({1, 8}, "q"), k = random_array({1, 8}, "k");
    for (int64_t delta : {0, 3, -5, 40}) {
      const double base = dot(ref::rope_forward(q, c, 50 + delta), ref::rope_forward(k, c, 50));
      for (int64_t shift : {-50, -17, 1, 900, 100000}) {
        const double other =
            dot(ref::rope_forward(q, c, 50 + delta + shift), ref::rope_forward(k, c, 50 + shift));
        EXPECT_NEAR(other, base, 1e-9 * (1 + std::abs(base)))
            << "delta " << delta << " shift " << shift;
      }
    }
  }
}

TEST(RopeRef, LayoutsDifferOnlyByAPermutation) {
  // Interleaved pair (2i, 2i+1) and rotate-half pair (i, i + Dr/2) rotate by the same angle, so
  // rope_interleaved(P x) = P rope_halves(x) with P moving index i → 2i and i + Dr/2 → 2i + 1.
  const int64_t Dr = 8;
  for (bool yarn : {true, false}) {
    const MlaConfig ci = rope_config(Dr, true, yarn), ch = rope_config(Dr, false, yarn);
    const Array x = random_array({5, 3, Dr}, "x");
    Array px(x.shape);
    for (int64_t row = 0; row < 15; ++row)
      for (int64_t i = 0; i < Dr / 2; ++i) {
        px[row * Dr + 2 * i] = x[row * Dr + i];
        px[row * Dr + 2 * i + 1] = x[row * Dr + i + Dr / 2];
      }
    const Array yi = ref::rope_forward(px, ci, 9), yh = ref::rope_forward(x, ch, 9);
    for (int64_t row = 0; row < 15; ++row)
      for (int64_t i = 0; i < Dr / 2; ++i) {
        EXPECT_EQ(yi[row * Dr + 2 * i], yh[row * Dr + i]);
        EXPECT_EQ(yi[row * Dr + 2 * i + 1], yh[row * Dr + i + Dr / 2]);
      }
  }
}
