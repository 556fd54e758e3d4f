// SparseAttentionRef: the fp64 reference sparse attention (reference/sparse_attention_ref.cpp)
// checked against central finite differences of a random-projection loss ⟨g, o⟩, against the dense
// reference attention (reference/attention_ref.hpp) where the selection is every earlier key, and
// for the head probabilities' defining properties.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "laga/core/random.hpp"
#include "reference/attention_ref.hpp"
#include "reference/sparse_attention_ref.hpp"

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

double max_diff(const ref::Array& a, const ref::Array& b) {
  double m = a.numel() == b.numel() ? 0 : INFINITY;
  for (int64_t i = 0; i < a.numel() && i < b.numel(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
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

// idx [Tq, B, topk]: per row min(topk, q_pos0 + t + 1) distinct key rows ≤ q_pos0 + t in a random
// order, then −1.
std::vector<int32_t> random_selection(int64_t Tq, int64_t B, int64_t topk, int64_t q_pos0,
                                      uint64_t seed) {
  std::vector<int32_t> idx(size_t(Tq * B * topk), -1);
  for (int64_t t = 0; t < Tq; ++t)
    for (int64_t b = 0; b < B; ++b) {
      std::vector<int32_t> keys;
      for (int64_t s = 0; s <= q_pos0 + t; ++s) keys.push_back(int32_t(s));
      for (size_t i = keys.size(); i > 1; --i)  // Fisher–Yates
        std::swap(keys[i - 1],
                  keys[size_t(uniform01(seed, 3, uint64_t((t * B + b) * 1000 + i)) * double(i))]);
      for (int64_t j = 0; j < std::min<int64_t>(topk, int64_t(keys.size())); ++j)
        idx[size_t((t * B + b) * topk + j)] = keys[size_t(j)];
    }
  return idx;
}

void check_finite_differences(bool with_idx) {
  const int64_t Tq = 4, B = 2, H = 3, Dqk = 5, Dv = 3, Tk = 7, q_pos0 = 2, topk = 4;
  const std::vector<int32_t> idx = random_selection(Tq, B, topk, q_pos0, 5);
  const ref::SparseSelection sel{with_idx ? idx.data() : nullptr, topk, q_pos0};
  ref::Array q = random_array({Tq, B, H, Dqk}, "q"), kv = random_array({Tk, B, Dqk}, "kv");
  const ref::Array g = random_array({Tq, B, H, Dv}, "g");
  const double scale = 0.7;
  auto loss = [&] { return dot(g, ref::sparse_attention_forward(q, kv, Dv, sel, scale).o); };
  const ref::SparseAttentionGrads grads = ref::sparse_attention_backward(q, kv, Dv, sel, g, scale);
  EXPECT_LT(fd_error(q, grads.dq, loss), 1e-8) << "dq";
  EXPECT_LT(fd_error(kv, grads.dkv, loss), 1e-8) << "dkv";
}

}  // namespace

TEST(SparseAttentionRef, BackwardMatchesFiniteDifferencesWithASelection) {
  check_finite_differences(true);
}

TEST(SparseAttentionRef, BackwardMatchesFiniteDifferencesOverEveryEarlierKey) {
  check_finite_differences(false);
}

// With topk ≥ T and every key s ≤ t selected (or no idx at all), sparse attention is causal MQA
// attention with one K/V head: K = kv, V = kv's first Dv columns; dkv = dK + dV.
TEST(SparseAttentionRef, FullCausalSelectionIsCausalMqaAttention) {
  const int64_t T = 9, B = 2, H = 4, Dqk = 6, Dv = 4;
  const ref::Array q = random_array({T, B, H, Dqk}, "q"), kv = random_array({T, B, Dqk}, "kv");
  const ref::Array dout = random_array({T, B, H, Dv}, "dout");
  ref::Array k({T, B, 1, Dqk}), v({T, B, 1, Dv});
  for (int64_t r = 0; r < T * B; ++r)
    for (int64_t e = 0; e < Dqk; ++e) {
      k[r * Dqk + e] = kv[r * Dqk + e];
      if (e < Dv) v[r * Dv + e] = kv[r * Dqk + e];
    }
  const double scale = 0.4;
  const ref::Array o = ref::attention_forward(q, k, v, scale, true);
  const ref::AttentionGrads g = ref::attention_backward(q, k, v, dout, scale, true);
  ref::Array dkv({T, B, Dqk});
  for (int64_t r = 0; r < T * B; ++r)
    for (int64_t e = 0; e < Dqk; ++e)
      dkv[r * Dqk + e] = g.dk[r * Dqk + e] + (e < Dv ? g.dv[r * Dv + e] : 0.0);
  const int64_t topk = T + 3;
  std::vector<int32_t> idx(size_t(T * B * topk), -1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s <= t; ++s) idx[size_t((t * B + b) * topk + s)] = int32_t(s);
  for (const ref::SparseSelection& sel :
       {ref::SparseSelection{idx.data(), topk, 0}, ref::SparseSelection{nullptr, 0, 0}}) {
    const std::string what = sel.idx ? "idx" : "no idx";
    EXPECT_LT(max_diff(ref::sparse_attention_forward(q, kv, Dv, sel, scale).o, o), 1e-12) << what;
    const ref::SparseAttentionGrads s = ref::sparse_attention_backward(q, kv, Dv, sel, dout, scale);
    EXPECT_LT(max_diff(s.dq, g.dq), 1e-12) << what;
    EXPECT_LT(max_diff(s.dkv, dkv), 1e-12) << what;
  }
}

// Each row's head-averaged probabilities sum to 1 over its candidates (0 for a row without any),
// are 0 at −1 and past the row's position, and agree between the two modes on a full selection.
TEST(SparseAttentionRef, HeadProbsAreAveragedDistributionsOverTheCandidates) {
  const int64_t Tq = 6, B = 2, H = 3, Dqk = 5, Tk = 10, q_pos0 = 3, topk = 5;
  const ref::Array q = random_array({Tq, B, H, Dqk}, "q"), kv = random_array({Tk, B, Dqk}, "kv");
  std::vector<int32_t> idx = random_selection(Tq, B, topk, q_pos0, 9);
  idx[0] = idx[1] = idx[2] = idx[3] = idx[4] = -1;  // row (0, 0) selects nothing
  const ref::Array p = ref::sparse_head_probs(q, kv, {idx.data(), topk, q_pos0}, 0.6, 0, Tq);
  const ref::Array dense = ref::sparse_head_probs(q, kv, {nullptr, 0, q_pos0}, 0.6, 0, Tq);
  for (int64_t t = 0; t < Tq; ++t)
    for (int64_t b = 0; b < B; ++b) {
      double sum = 0;
      for (int64_t s = 0; s < Tk; ++s) {
        const double x = dense[(t * B + b) * Tk + s];
        sum += x;
        if (s > q_pos0 + t) {
          EXPECT_EQ(x, 0.0);
        }
      }
      EXPECT_NEAR(sum, 1.0, 1e-12);
      sum = 0;
      for (int64_t j = 0; j < topk; ++j) {
        const double x = p[(t * B + b) * topk + j];
        sum += x;
        if (idx[size_t((t * B + b) * topk + j)] < 0) {
          EXPECT_EQ(x, 0.0);
        }
      }
      EXPECT_NEAR(sum, t == 0 && b == 0 ? 0.0 : 1.0, 1e-12);
    }
  // a full selection in idx order 0..pos: the same numbers at the same columns
  std::vector<int32_t> full(size_t(Tq * B * Tk), -1);
  for (int64_t t = 0; t < Tq; ++t)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s <= q_pos0 + t; ++s) full[size_t((t * B + b) * Tk + s)] = int32_t(s);
  EXPECT_LT(max_diff(ref::sparse_head_probs(q, kv, {full.data(), Tk, q_pos0}, 0.6, 0, Tq), dense),
            1e-15);
}
