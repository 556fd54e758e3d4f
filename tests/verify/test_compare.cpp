// The verification rule of verify/compare.hpp itself: the plain same-precision reference
// (block_ref's storage rounding) is a real, small baseline, and the rule fails when a tensor is off
// by a few allowances or holds a NaN. The forms judged by it, over a sweep:
// tests/mla/test_forms.cpp.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "laga/driver/run.hpp"
#include "verify/compare.hpp"

using namespace laga;
using namespace laga::verify;

namespace {

struct Case {
  std::string model;
  DType dt;
  Kernel kernel;
  int64_t T, L, B;
  std::string name() const {
    return fmt::format("{} {} {} T{} L{} B{}", model, dtype_name(dt), kernel_name(kernel), T, L, B);
  }
};

MlaConfig config_of(const Case& k, const std::string& form, int64_t P) {
  MlaConfig c = MlaConfig::preset(k.model);
  c.dtype = k.dt, c.kernel = k.kernel, c.seq_len = k.T, c.num_layers = k.L, c.batch = k.B;
  c.form = form, c.sp = P;
  return c;
}

// explicit at P = 1 on the case's weights and inputs (the same whatever P and form: one seed), the
// exact fp64 reference and, when asked, the plain same-precision reference on them.
struct Truth {
  Tensors explicit_1, exact, plain;
};

Truth truth_of(const Case& k, bool with_plain) {
  const MlaConfig one = config_of(k, "explicit", 1);
  RunOptions opt;
  opt.gather_tensors = true;
  const RankResult r = run_group(one, opt)[0];
  const ref::RefWeights w = ref::from_weights(r.weights);
  const ref::Array x = ref::from_tensor(r.x), dy = ref::from_tensor(r.dy);
  Truth t;
  t.explicit_1 = tensors_of(r.y, r.dx, r.grads);
  t.exact = reference_tensors(one, w, x, dy, std::nullopt);
  if (with_plain) t.plain = reference_tensors(one, w, x, dy, k.dt);
  return t;
}

TEST(Compare, PlainBf16BaselineIsNonZeroAndBelowBf16Eps) {
  // The plain baseline errs on every tensor (a baseline of 0 would make the rule demand
  // bit-exactness) and its error is the dtype's size. bf16, where storage rounding rules: y (two
  // roundings per layer on the residual stream) within eps in relative L2, every gradient (a chain
  // of some fifteen roundings per layer back to it) within 4 eps. fp32, where the sequential fp32
  // sums rule (hundreds of terms): within 32 eps. Measured (tiny, T 24, L 2, B 2), rel L2 of plain
  // vs fp64:
  //   bf16  y 5.4e-3, dx 1.0e-2, weight gradients 7.7e-3 .. 1.9e-2 (dq_norm.0)   eps 7.8e-3
  //   fp32  y 2.9e-7, dx 6.0e-7, weight gradients up to 8.2e-7 (dq_norm.0)       eps 1.2e-7
  for (DType dt : {DType::bf16, DType::f32}) {
    const Case k{"tiny", dt, Kernel::fused, 24, 2, 2};
    const Truth t = truth_of(k, /*with_plain=*/true);
    for (const auto& [name, e] : errors(t.plain, t.exact)) {
      if (name.starts_with("dindexer_")) {  // the dense block ignores the indexer: exactly zero
        EXPECT_EQ(e.scale, 0) << name;
        continue;
      }
      EXPECT_GT(e.max_abs, 0) << name << " " << dtype_name(dt);
      const double bound = dt == DType::bf16 ? (name == "y" ? 1 : 4) : 32;
      EXPECT_LT(e.rel_l2, bound * eps(dt)) << name << " " << dtype_name(dt);
      fmt::print("[measured] plain {} vs fp64 {}: rel L2 {:.2e}, max abs {:.2e} of scale {:.2e}\n",
                 dtype_name(dt), name, e.rel_l2, e.max_abs, e.scale);
    }
  }
}

TEST(Compare, RuleFailsOnATensorOffByAFewBaselineErrors) {
  const Case k{"tiny", DType::bf16, Kernel::fused, 24, 2, 1};
  const Truth t = truth_of(k, /*with_plain=*/false);
  const auto base = errors(t.explicit_1, t.exact);
  // explicit judged against itself passes, at half the allowance or less.
  const Verdict same = form_vs_explicit(base, base, k.dt);
  EXPECT_TRUE(same.pass) << summary(same);
  EXPECT_LE(same.worst_ratio, 0.5);
  // One element of one weight gradient moved by 3 allowances (3 × (2 × baseline + floor)) fails,
  // and the verdict names that tensor.
  for (const std::string name : {"dwkv_b.1", "dx", "y"}) {
    Tensors bad = t.explicit_1;
    const TensorError& b = base.at(name);
    const double allowed = kFormFactor * b.max_abs + kFloorUlps * eps(k.dt) * b.scale;
    ref::Array& a = bad.at(name);
    a[a.numel() / 2] = t.exact.at(name)[a.numel() / 2] + 3 * allowed;
    const Verdict v = form_vs_explicit(errors(bad, t.exact), base, k.dt);
    EXPECT_FALSE(v.pass) << name << ": " << summary(v);
    EXPECT_EQ(v.worst, name);
    EXPECT_NEAR(v.worst_ratio, 3.0, 1e-9);
    std::string where;
    EXPECT_FALSE(bitwise_equal(bad, t.explicit_1, &where));
    EXPECT_NE(where.find(name), std::string::npos) << where;
  }
  // A NaN fails, whatever the baseline.
  Tensors nan = t.explicit_1;
  nan.at("dx")[3] = std::numeric_limits<double>::quiet_NaN();
  const Verdict v = form_vs_explicit(errors(nan, t.exact), base, k.dt);
  EXPECT_FALSE(v.pass);
  EXPECT_EQ(v.worst, "dx");
}

// The sweep behind the rule's factors (verify/compare.hpp): tiny (T 24 L 1 B 2, T 40 L 2 B 1) and
// small (T 24 L 2 B 1), both dtypes and kernels, P 1, 2, 4, on one seed's weights and inputs per
// case. The two kernels of a shape and dtype are adjacent: they share the weights, the inputs and
// the references.
std::vector<Case> factor_sweep() {
  std::vector<Case> cases;
  for (DType dt : {DType::bf16, DType::f32})
    for (const auto& [model, T, L, B] :
         {std::tuple<std::string, int64_t, int64_t, int64_t>{"tiny", 24, 1, 2},
          {"tiny", 40, 2, 1},
          {"small", 24, 2, 1}})
      for (Kernel kernel : {Kernel::eager, Kernel::fused})
        cases.push_back({model, dt, kernel, T, L, B});
  return cases;
}

// The exact fp64 reference on a case's weights and inputs (r: a run of the case) and, when asked,
// the plain baseline's errors: functions of the model, shape and dtype, not of the kernel, so
// computed once for the adjacent cases that differ in kernel alone.
struct SweepTruth {
  std::string key;
  Tensors exact;
  std::map<std::string, TensorError> plain;
  void update(const Case& k, const RankResult& r, bool with_plain) {
    const std::string now =
        fmt::format("{} {} T{} L{} B{}", k.model, dtype_name(k.dt), k.T, k.L, k.B);
    if (now == key) return;
    const MlaConfig one = config_of(k, "explicit", 1);
    const ref::RefWeights w = ref::from_weights(r.weights);
    const ref::Array x = ref::from_tensor(r.x), dy = ref::from_tensor(r.dy);
    key = now;
    exact = reference_tensors(one, w, x, dy, std::nullopt);
    if (with_plain) plain = plain_errors(one, w, x, dy, exact);
  }
};

// Per tensor of truth, err(a) / err(b), the errors being max |· − exact| with no floor; tensors
// where b's error is 0 are left out (there the rule's floor decides).
std::map<std::string, double> ratios(const std::map<std::string, TensorError>& a,
                                     const std::map<std::string, TensorError>& b) {
  std::map<std::string, double> r;
  for (const auto& [name, e] : a)
    if (b.at(name).max_abs > 0) r[name] = e.max_abs / b.at(name).max_abs;
  return r;
}

// A run on the case's weights and inputs (the seed's: the same whatever form and P), gathered.
RankResult run_of(const Case& k, const std::string& form, int64_t P) {
  RunOptions opt;
  opt.gather_tensors = true;
  return run_group(config_of(k, form, P), opt)[0];
}
Tensors outputs_of(const Case& k, const std::string& form, int64_t P) {
  const RankResult r = run_of(k, form, P);
  return tensors_of(r.y, r.dx, r.grads);
}

// kExplicitFactor (F): explicit's error against the fp64 reference is within F times the plain
// same-precision implementation's (plain_errors, the rule's baseline) on every tensor of the sweep,
// with no floor. Prints the largest ratio per dtype and kernel, the evidence for F.
TEST(Compare, ExplicitWithinFOfPlainBaseline) {
  std::map<std::string, std::pair<double, std::string>> worst;  // "bf16 fused" -> ratio, where
  SweepTruth t;
  for (const Case& k : factor_sweep()) {
    const RankResult r = run_of(k, "explicit", 1);
    t.update(k, r, /*with_plain=*/true);
    for (int64_t P : {1, 2, 4}) {
      const Tensors got = P == 1 ? tensors_of(r.y, r.dx, r.grads) : outputs_of(k, "explicit", P);
      for (const auto& [name, ratio] : ratios(errors(got, t.exact), t.plain)) {
        EXPECT_LE(ratio, kExplicitFactor) << k.name() << " P" << P << " " << name;
        auto& [most, where] = worst[fmt::format("{} {}", dtype_name(k.dt), kernel_name(k.kernel))];
        if (ratio > most) most = ratio, where = fmt::format("{} P{} {}", k.name(), P, name);
      }
    }
  }
  for (const auto& [what, m] : worst)
    fmt::print("[measured] explicit / plain, {}: max {:.3f} ({}); F = {}\n", what, m.first,
               m.second, kExplicitFactor);
}

// kFormFactor (2, FlashAttention's): laga's and the absorbed forms' errors against the fp64
// reference are within twice explicit's at the same P and dtype, on every tensor of the sweep, with
// no floor. Prints the largest ratio per form, dtype and kernel, the evidence for the factor.
TEST(Compare, LagaAndAbsorbedWithinTwiceExplicit) {
  std::map<std::string, std::pair<double, std::string>> worst;  // "laga bf16 fused" -> ratio, where
  SweepTruth t;
  for (const Case& k : factor_sweep()) {
    const RankResult r = run_of(k, "explicit", 1);
    t.update(k, r, /*with_plain=*/false);
    for (int64_t P : {1, 2, 4}) {
      const Tensors explicit_P =
          P == 1 ? tensors_of(r.y, r.dx, r.grads) : outputs_of(k, "explicit", P);
      const auto base = errors(explicit_P, t.exact);
      for (const std::string form : {"laga", "absorbed-shared", "absorbed-expanded"})
        for (const auto& [name, ratio] : ratios(errors(outputs_of(k, form, P), t.exact), base)) {
          EXPECT_LE(ratio, kFormFactor) << form << " " << k.name() << " P" << P << " " << name;
          const std::string what =
              fmt::format("{} {} {}", form, dtype_name(k.dt), kernel_name(k.kernel));
          auto& [most, where] = worst[what];
          if (ratio > most) most = ratio, where = fmt::format("{} P{} {}", k.name(), P, name);
        }
    }
  }
  for (const auto& [what, m] : worst)
    fmt::print("[measured] form / explicit, {}: max {:.3f} ({}); factor {}\n", what, m.first,
               m.second, kFormFactor);
}

TEST(Compare, GradKeysNameWeightAndLayer) {
  EXPECT_EQ(grad_key("layers.0.wkv_b"), "dwkv_b.0");
  EXPECT_EQ(grad_key("layers.12.attn_norm"), "dattn_norm.12");
}

}  // namespace
