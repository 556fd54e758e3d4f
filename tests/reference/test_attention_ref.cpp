// AttentionRef: the fp64 reference attention (reference/attention_ref.cpp) checked against central
// finite differences of a random-projection loss ⟨g, o⟩ (never sum(o): the sum of a softmax row has
// zero gradient), and against properties that pin its definition down.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <functional>
#include <optional>
#include <vector>

#include "laga/core/random.hpp"
#include "reference/attention_ref.hpp"

using namespace laga;

namespace {

ref::Array random_array(const Shape& s, const char* name, uint64_t seed = 7) {
  ref::Array a(s);
  for (int64_t i = 0; i < a.numel(); ++i) a[i] = normal(seed, stream_id(name), uint64_t(i));
  return a;
}

double dot(const ref::Array& a, const ref::Array& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a[i] * b[i];
  return s;
}

// max |analytic − central difference| / max(1, max |analytic|) over every entry of x.
double fd_error(ref::Array& x, const ref::Array& analytic, const std::function<double()>& loss) {
  const double h = 1e-5;
  double err = 0, mag = 1;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = loss();
    x[i] = keep - h;
    const double down = loss();
    x[i] = keep;
    err = std::max(err, std::abs((up - down) / (2 * h) - analytic[i]));
    mag = std::max(mag, std::abs(analytic[i]));
  }
  return err / mag;
}

void check_finite_differences(int64_t T, int64_t B, int64_t Hq, int64_t Hkv, int64_t Dqk,
                              int64_t Dv, bool causal) {
  ref::Array q = random_array({T, B, Hq, Dqk}, "q"), k = random_array({T, B, Hkv, Dqk}, "k");
  ref::Array v = random_array({T, B, Hkv, Dv}, "v"), g = random_array({T, B, Hq, Dv}, "g");
  const double scale = 0.7;
  auto loss = [&] { return dot(g, ref::attention_forward(q, k, v, scale, causal)); };
  const ref::AttentionGrads grads = ref::attention_backward(q, k, v, g, scale, causal);
  EXPECT_LT(fd_error(q, grads.dq, loss), 1e-8) << "dq";
  EXPECT_LT(fd_error(k, grads.dk, loss), 1e-8) << "dk";
  EXPECT_LT(fd_error(v, grads.dv, loss), 1e-8) << "dv";
}

}  // namespace

TEST(AttentionRef, MatchesFiniteDifferences) { check_finite_differences(5, 2, 2, 2, 3, 2, true); }

TEST(AttentionRef, MatchesFiniteDifferencesWithGroupedHeads) {
  check_finite_differences(4, 1, 4, 2, 3, 5, true);
}

TEST(AttentionRef, MatchesFiniteDifferencesWithoutMask) {
  check_finite_differences(4, 2, 3, 1, 2, 3, false);
}

TEST(AttentionRef, FirstCausalRowCopiesItsValue) {
  const ref::Array q = random_array({6, 2, 4, 3}, "q"), k = random_array({6, 2, 2, 3}, "k");
  const ref::Array v = random_array({6, 2, 2, 5}, "v");
  const ref::Array o = ref::attention_forward(q, k, v, 0.5, true);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t d = 0; d < 5; ++d)
        EXPECT_DOUBLE_EQ(o[(b * 4 + h) * 5 + d], v[(b * 2 + h / 2) * 5 + d]);
}

TEST(AttentionRef, ZeroQueriesAverageTheVisibleValues) {
  const int64_t T = 5, Dv = 3;
  const ref::Array q({T, 1, 1, 4}), k = random_array({T, 1, 1, 4}, "k"),
                                    v = random_array({T, 1, 1, Dv}, "v");
  const ref::Array o = ref::attention_forward(q, k, v, 1.0, true);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < Dv; ++d) {
      double mean = 0;
      for (int64_t j = 0; j <= t; ++j) mean += v[j * Dv + d] / double(t + 1);
      EXPECT_NEAR(o[t * Dv + d], mean, 1e-14);
    }
}

TEST(AttentionRef, GroupedHeadsEqualRepeatedKeyValueHeads) {
  const int64_t T = 4, B = 2, Hq = 4, Hkv = 2, Dqk = 3, Dv = 2, g = Hq / Hkv;
  const ref::Array q = random_array({T, B, Hq, Dqk}, "q"), k = random_array({T, B, Hkv, Dqk}, "k");
  const ref::Array v = random_array({T, B, Hkv, Dv}, "v"), dout = random_array({T, B, Hq, Dv}, "g");
  ref::Array ke({T, B, Hq, Dqk}), ve({T, B, Hq, Dv});  // every query head with its own copy
  for (int64_t tb = 0; tb < T * B; ++tb)
    for (int64_t h = 0; h < Hq; ++h) {
      for (int64_t d = 0; d < Dqk; ++d)
        ke[(tb * Hq + h) * Dqk + d] = k[(tb * Hkv + h / g) * Dqk + d];
      for (int64_t d = 0; d < Dv; ++d) ve[(tb * Hq + h) * Dv + d] = v[(tb * Hkv + h / g) * Dv + d];
    }
  const ref::Array o = ref::attention_forward(q, k, v, 0.8, true),
                   oe = ref::attention_forward(q, ke, ve, 0.8, true);
  for (int64_t i = 0; i < o.numel(); ++i) EXPECT_NEAR(o[i], oe[i], 1e-14);
  const ref::AttentionGrads gr = ref::attention_backward(q, k, v, dout, 0.8, true);
  const ref::AttentionGrads ge = ref::attention_backward(q, ke, ve, dout, 0.8, true);
  for (int64_t i = 0; i < gr.dq.numel(); ++i) EXPECT_NEAR(gr.dq[i], ge.dq[i], 1e-14);
  for (int64_t tb = 0; tb < T * B; ++tb)  // a shared head's gradient is the sum over its group
    for (int64_t hk = 0; hk < Hkv; ++hk) {
      for (int64_t d = 0; d < Dqk; ++d) {
        double s = 0;
        for (int64_t u = 0; u < g; ++u) s += ge.dk[(tb * Hq + hk * g + u) * Dqk + d];
        EXPECT_NEAR(gr.dk[(tb * Hkv + hk) * Dqk + d], s, 1e-13);
      }
      for (int64_t d = 0; d < Dv; ++d) {
        double s = 0;
        for (int64_t u = 0; u < g; ++u) s += ge.dv[(tb * Hq + hk * g + u) * Dv + d];
        EXPECT_NEAR(gr.dv[(tb * Hkv + hk) * Dv + d], s, 1e-13);
      }
    }
}

// The reference runs heads (forward) and K/V heads with their query groups (backward) in parallel;
// every sum keeps the order one thread gives it, so its bits do not depend on the thread count. 11
// keys is a block of 8 key sums side by side and a part block; grouped heads share their K/V head's
// dk, dv.
TEST(AttentionRef, IsIndependentOfThreadCount) {
  const ref::Array q = random_array({11, 2, 4, 5}, "q"), k = random_array({11, 2, 2, 5}, "k");
  const ref::Array v = random_array({11, 2, 2, 3}, "v"), g = random_array({11, 2, 4, 3}, "g");
  for (std::optional<DType> storage : {std::optional<DType>(), std::optional<DType>(DType::bf16)}) {
    std::vector<ref::Array> runs[2];
    const int keep = omp_get_max_threads();
    for (int i = 0; i < 2; ++i) {
      omp_set_num_threads(i == 0 ? 1 : 3);
      const ref::AttentionGrads gr = ref::attention_backward(q, k, v, g, 0.7, true, storage);
      runs[i] = {ref::attention_forward(q, k, v, 0.7, true, storage), gr.dq, gr.dk, gr.dv};
    }
    omp_set_num_threads(keep);
    for (size_t t = 0; t < runs[0].size(); ++t)
      EXPECT_EQ(runs[0][t].data, runs[1][t].data)
          << "output " << t << (storage ? " (bf16 storage)" : " (exact)");
  }
}
