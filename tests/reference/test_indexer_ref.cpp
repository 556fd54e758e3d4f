// The fp64 reference of the lightning indexer and of LayerNorm (reference/indexer_ref.cpp) checked
// against central finite differences: the indexer's KL loss w.r.t. q, w and k in both candidate
// modes (every earlier key, and a selection with −1 entries), LayerNorm through a random-projection
// loss ⟨g, y⟩. The ReLU has a kink at q·k = 0: inputs are drawn so that no product lies within 1e-2
// of it, far beyond what a step of 1e-5 moves a product. Also the top-k's definition on a row
// worked out by hand. The math is in docs/sparse.md.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "laga/core/random.hpp"
#include "reference/indexer_ref.hpp"

using namespace laga;
using laga::ref::Array;

namespace {

Array random_array(const Shape& s, const std::string& name, uint64_t seed, double std = 1.0,
                   double mean = 0.0) {
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

// Central differences (step 1e-5) against the analytic gradient, relative to max(|analytic|, rms
// of the gradient): rounding ≈ 1e-16 · 10² / 1e-5 = 1e-9, truncation ≈ 1e-10, so 1e-6 leaves two
// orders of margin while a wrong term shows as 1e-2 or more (tests/reference/test_ops_ref.cpp).
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
    worst = std::max(
        worst, std::abs((up - down) / (2 * eps) - grad[i]) / std::max(std::abs(grad[i]), rms));
  }
  return worst;
}

void expect_fd(const std::string& what, const Array& param, const Array& grad,
               const std::function<double(const Array&)>& loss) {
  const double err = max_fd_error(param, grad, loss);
  EXPECT_LT(err, 1e-6) << what;
  EXPECT_GT(std::sqrt(dot(grad, grad)), 1e-3) << what << ": a vanishing gradient checks nothing";
  testing::Test::RecordProperty("max_relative_error." + what, fmt::format("{:.2e}", err));
}

// The smallest |q_j · k_s| over every pair the loss can touch.
double min_product(const Array& q, const Array& k) {
  const int64_t Tq = q.shape[0], B = q.shape[1], H = q.shape[2], D = q.shape[3], Tk = k.shape[0];
  double m = INFINITY;
  for (int64_t t = 0; t < Tq; ++t)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < H; ++j)
        for (int64_t s = 0; s < Tk; ++s) {
          double a = 0;
          for (int64_t d = 0; d < D; ++d)
            a += q[((t * B + b) * H + j) * D + d] * k[(s * B + b) * D + d];
          m = std::min(m, std::abs(a));
        }
  return m;
}

}  // namespace

TEST(IndexerRef, LossGradientsMatchFiniteDifferences) {
  const int64_t Tq = 4, B = 2, H = 3, D = 4, Tk = 7, q_pos0 = 3, topk = 3;
  // the first seed whose products all keep 1e-2 away from the ReLU's kink
  uint64_t seed = 1;
  Array q, k;
  for (;; ++seed) {
    q = random_array({Tq, B, H, D}, "q", seed), k = random_array({Tk, B, D}, "k", seed);
    if (min_product(q, k) > 1e-2) break;
  }
  const Array w = random_array({Tq, B, H}, "w", seed);
  const double w_scale = 1 / std::sqrt(double(H * D));
  // a selection with −1 entries, not in position order
  std::vector<int32_t> idx = {0, 2, 3, 1, 3, -1, 4, 0, 2, -1, 1, 4,
                              0, 3, 5, 2, 5, -1, 1, 4, 5, 0,  6, -1};
  for (bool sparse : {false, true}) {
    SCOPED_TRACE(sparse ? "selection" : "every earlier key");
    const int64_t C = sparse ? topk : Tk;
    // target: positive weights, not normalised (the loss L1-normalises them over C_t)
    Array target = random_array({Tq, B, C}, "target", seed, 0.3, 1.0);
    const auto* ip = sparse ? &idx : nullptr;
    const auto g = ref::indexer_loss(q, w, k, w_scale, q_pos0, ip, topk, target, 1.0);
    EXPECT_GT(g.loss, 0);
    auto L = [&](const Array& qq, const Array& ww, const Array& kk) {
      return ref::indexer_loss(qq, ww, kk, w_scale, q_pos0, ip, topk, target, 1.0).loss;
    };
    expect_fd(sparse ? "dq.sparse" : "dq.causal", q, g.dq,
              [&](const Array& p) { return L(p, w, k); });
    expect_fd(sparse ? "dw.sparse" : "dw.causal", w, g.dw,
              [&](const Array& p) { return L(q, p, k); });
    expect_fd(sparse ? "dk.sparse" : "dk.causal", k, g.dk,
              [&](const Array& p) { return L(q, w, p); });
    // loss_scale scales the gradient, not the loss
    const auto h = ref::indexer_loss(q, w, k, w_scale, q_pos0, ip, topk, target, 0.25);
    EXPECT_EQ(h.loss, g.loss);
    for (int64_t i = 0; i < g.dk.numel(); ++i) EXPECT_NEAR(h.dk[i], 0.25 * g.dk[i], 1e-12);
  }
}

// The KL of a target equal to the indexer's own softmax is 0, and so is its gradient.
TEST(IndexerRef, LossVanishesWhenTheTargetIsTheSoftmax) {
  const int64_t Tq = 3, B = 1, H = 2, D = 3, Tk = 3;
  const Array q = random_array({Tq, B, H, D}, "q", 3), w = random_array({Tq, B, H}, "w", 3),
              k = random_array({Tk, B, D}, "k", 3);
  const Array I = ref::indexer_scores(q, w, k, 0.5, 0);
  Array target({Tq, B, Tk});
  for (int64_t t = 0; t < Tq; ++t)
    for (int64_t s = 0; s <= t; ++s) target[t * Tk + s] = 3.0 * std::exp(I[t * Tk + s]);
  const auto g = ref::indexer_loss(q, w, k, 0.5, 0, nullptr, 0, target, 1.0);
  EXPECT_NEAR(g.loss, 0, 1e-14);
  for (double v : g.dq.data) EXPECT_NEAR(v, 0, 1e-14);
}

// One row by hand: scores 1, 3, 3, 2, −inf: top-2 is {1, 2} (the tie at 3 keeps both), top-3 adds
// position 3, top-1 is position 1 (the tie goes to the lower position), top-6 lists all four then
// −1.
TEST(IndexerRef, TopkFollowsTheDefinition) {
  Array I({1, 1, 5});
  const double row[5] = {1, 3, 3, 2, -INFINITY};
  for (int i = 0; i < 5; ++i) I[i] = row[i];
  EXPECT_EQ(ref::indexer_topk(I, 2).idx, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(ref::indexer_topk(I, 3).idx, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(ref::indexer_topk(I, 1).idx, (std::vector<int32_t>{1}));
  const auto all = ref::indexer_topk(I, 6);
  EXPECT_EQ(all.idx, (std::vector<int32_t>{0, 1, 2, 3, -1, -1}));
  EXPECT_EQ(all.scores[2], 3.0);
  EXPECT_EQ(all.scores[5], -INFINITY);
}

TEST(LayerNormRef, GradientsMatchFiniteDifferences) {
  for (double eps : {1e-6, 0.5}) {
    SCOPED_TRACE(eps);
    const Array x = random_array({3, 2, 7}, "x", 5, 1.0, 0.3),
                w = random_array({7}, "w", 5, 0.1, 1.0), b = random_array({7}, "b", 5),
                g = random_array({3, 2, 7}, "g", 5);
    const auto grads = ref::layernorm_backward(x, w, g, eps);
    const std::string tag = fmt::format("eps_{}", eps);
    expect_fd("dx." + tag, x, grads.dx,
              [&](const Array& p) { return dot(g, ref::layernorm_forward(p, w, b, eps)); });
    expect_fd("dw." + tag, w, grads.dw,
              [&](const Array& p) { return dot(g, ref::layernorm_forward(x, p, b, eps)); });
    expect_fd("db." + tag, b, grads.db,
              [&](const Array& p) { return dot(g, ref::layernorm_forward(x, w, p, eps)); });
  }
}
