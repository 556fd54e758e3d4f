// fp64 reference sparse latent attention, forward, backward and head probabilities, by the
// definition (reference/sparse_attention_ref.hpp). It is the specification
// src/ops/sparse_attention.cpp is checked against; the backward differentiates the forward's lines
// in reverse (docs/attention.md §2, with the causal key range replaced by the row's selection).
#include "reference/sparse_attention_ref.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "laga/core/error.hpp"

namespace laga::ref {

namespace {

struct Dims {
  int64_t Tq, B, H, Dqk, Tk, Dv;
};

Dims dims_of(const Array& q, const Array& kv, int64_t Dv) {
  LAGA_CHECK(q.shape.size() == 4 && kv.shape.size() == 3,
             "reference sparse attention takes q [Tq, B, H, Dqk] and kv [Tk, B, Dqk]; got {}, {}",
             shape_str(q.shape), shape_str(kv.shape));
  const Dims d{q.shape[0], q.shape[1], q.shape[2], q.shape[3], kv.shape[0], Dv};
  LAGA_CHECK(kv.shape[1] == d.B && kv.shape[2] == d.Dqk && Dv >= 1 && Dv <= d.Dqk,
             "kv has shape {}; expected [Tk, {}, {}] with 1 ≤ Dv {} ≤ {}", shape_str(kv.shape), d.B,
             d.Dqk, Dv, d.Dqk);
  return d;
}

// The candidate key rows of query row (t, b), with their column in idx (or their row).
struct Candidate {
  int64_t s, col;
};
std::vector<Candidate> candidates(const Dims& d, const SparseSelection& sel, int64_t t, int64_t b) {
  std::vector<Candidate> c;
  if (!sel.idx) {
    for (int64_t s = 0; s <= std::min(sel.q_pos0 + t, d.Tk - 1); ++s) c.push_back({s, s});
    return c;
  }
  for (int64_t j = 0; j < sel.topk; ++j) {
    const int64_t s = sel.idx[(t * d.B + b) * sel.topk + j];
    if (s < 0) continue;
    LAGA_CHECK(s < d.Tk && s <= sel.q_pos0 + t,
               "idx[{}, {}, {}] = {} is not a key row ≤ q_pos0 + t = {} inside [0, {})", t, b, j, s,
               sel.q_pos0 + t, d.Tk);
    c.push_back({s, j});
  }
  return c;
}

// Row (t, b, h): s[i] = scale · q · kv[c_i], p = softmax(s); returns the log-sum-exp.
template <class Sum>
double probabilities(const Array& q, const Array& kv, const Dims& d, int64_t t, int64_t b,
                     int64_t h, const std::vector<Candidate>& c, double scale,
                     std::vector<double>& p) {
  p.assign(c.size(), 0.0);
  if (c.empty()) return -INFINITY;
  const double* qt = q.data.data() + ((t * d.B + b) * d.H + h) * d.Dqk;
  double mx = -INFINITY;
  for (size_t i = 0; i < c.size(); ++i) {
    const double* k = kv.data.data() + (c[i].s * d.B + b) * d.Dqk;
    double s = 0;
    for (int64_t e = 0; e < d.Dqk; ++e) s = Sum::add(s, qt[e] * k[e]);
    p[i] = scale * s;
    mx = std::max(mx, p[i]);
  }
  double sum = 0;
  for (double& x : p) sum = Sum::add(sum, x = std::exp(x - mx));
  for (double& x : p) x /= sum;
  return mx + std::log(sum);
}

template <class Sum>
SparseAttentionOut forward_t(const Array& q, const Array& kv, int64_t Dv,
                             const SparseSelection& sel, double scale,
                             std::optional<DType> storage) {
  const Dims d = dims_of(q, kv, Dv);
  SparseAttentionOut out{Array({d.Tq, d.B, d.H, d.Dv}), Array({d.B, d.H, d.Tq})};
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t t = 0; t < d.Tq; ++t)
    for (int64_t b = 0; b < d.B; ++b) {
      const std::vector<Candidate> c = candidates(d, sel, t, b);
      std::vector<double> p;
      for (int64_t h = 0; h < d.H; ++h) {
        // P = softmax(scale · q kᵀ) over the candidates;  o = P V
        out.lse[(b * d.H + h) * d.Tq + t] = probabilities<Sum>(q, kv, d, t, b, h, c, scale, p);
        if (storage)
          for (double& x : p) x = rounded(*storage, x);
        double* o = out.o.data.data() + ((t * d.B + b) * d.H + h) * d.Dv;
        for (size_t i = 0; i < c.size(); ++i)
          for (int64_t e = 0; e < d.Dv; ++e)
            o[e] = Sum::add(o[e], p[i] * kv[(c[i].s * d.B + b) * d.Dqk + e]);
      }
    }
  return out;
}

template <class Sum>
SparseAttentionGrads backward_t(const Array& q, const Array& kv, int64_t Dv,
                                const SparseSelection& sel, const Array& dout, double scale,
                                std::optional<DType> storage, const Array* o) {
  const Dims d = dims_of(q, kv, Dv);
  LAGA_CHECK(dout.shape == Shape({d.Tq, d.B, d.H, d.Dv}),
             "dout has shape {}; expected [{}, {}, {}, {}]", shape_str(dout.shape), d.Tq, d.B, d.H,
             d.Dv);
  LAGA_CHECK(!o || o->shape == dout.shape, "o has shape {}; expected that of dout",
             o ? shape_str(o->shape) : "");
  SparseAttentionGrads g{Array(q.shape), Array(kv.shape)};
  // One batch element per thread: dkv rows of b sum over t, h, then the candidates, in order.
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < d.B; ++b) {
    std::vector<double> p, dp;
    for (int64_t t = 0; t < d.Tq; ++t) {
      const std::vector<Candidate> c = candidates(d, sel, t, b);
      for (int64_t h = 0; h < d.H; ++h) {
        probabilities<Sum>(q, kv, d, t, b, h, c, scale, p);
        if (storage)
          for (double& x : p) x = rounded(*storage, x);
        const int64_t qo = ((t * d.B + b) * d.H + h) * d.Dqk, oo = ((t * d.B + b) * d.H + h) * d.Dv;
        // o = P V:  dV_s += p_s · dO,  dp_s = dO · V_s
        dp.assign(c.size(), 0.0);
        for (size_t i = 0; i < c.size(); ++i) {
          const int64_t ko = (c[i].s * d.B + b) * d.Dqk;
          double s = 0;
          for (int64_t e = 0; e < d.Dv; ++e) {
            g.dkv[ko + e] = Sum::add(g.dkv[ko + e], p[i] * dout[oo + e]);
            s = Sum::add(s, dout[oo + e] * kv[ko + e]);
          }
          dp[i] = s;
        }
        // P = softmax(S):  dS_s = p_s · (dp_s − delta),  delta = Σ_s p_s dp_s = dO · O
        double delta = 0;
        if (o)
          for (int64_t e = 0; e < d.Dv; ++e) delta = Sum::add(delta, dout[oo + e] * (*o)[oo + e]);
        else
          for (size_t i = 0; i < c.size(); ++i) delta = Sum::add(delta, p[i] * dp[i]);
        // S = scale · q kᵀ:  dq += scale · dS_s K_s,  dK_s += scale · dS_s q
        for (size_t i = 0; i < c.size(); ++i) {
          double ds = p[i] * (dp[i] - delta);
          if (storage) ds = rounded(*storage, ds);
          const int64_t ko = (c[i].s * d.B + b) * d.Dqk;
          for (int64_t e = 0; e < d.Dqk; ++e) {
            g.dq[qo + e] = Sum::add(g.dq[qo + e], scale * ds * kv[ko + e]);
            g.dkv[ko + e] = Sum::add(g.dkv[ko + e], scale * ds * q[qo + e]);
          }
        }
      }
    }
  }
  return g;
}

}  // namespace

SparseAttentionOut sparse_attention_forward(const Array& q, const Array& kv, int64_t Dv,
                                            const SparseSelection& sel, double scale,
                                            std::optional<DType> storage) {
  return storage ? forward_t<F32Sum>(q, kv, Dv, sel, scale, storage)
                 : forward_t<ExactSum>(q, kv, Dv, sel, scale, storage);
}

SparseAttentionGrads sparse_attention_backward(const Array& q, const Array& kv, int64_t Dv,
                                               const SparseSelection& sel, const Array& dout,
                                               double scale, std::optional<DType> storage,
                                               const Array* o) {
  return storage ? backward_t<F32Sum>(q, kv, Dv, sel, dout, scale, storage, o)
                 : backward_t<ExactSum>(q, kv, Dv, sel, dout, scale, storage, o);
}

Array sparse_head_probs(const Array& q, const Array& kv, const SparseSelection& sel, double scale,
                        int64_t t0, int64_t t1) {
  const Dims d = dims_of(q, kv, 1);
  LAGA_CHECK(0 <= t0 && t0 < t1 && t1 <= d.Tq, "rows [{}, {}) must lie inside [0, {})", t0, t1,
             d.Tq);
  const int64_t width = sel.idx ? sel.topk : d.Tk;
  Array out({t1 - t0, d.B, width});
  std::vector<double> p;
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t b = 0; b < d.B; ++b) {
      const std::vector<Candidate> c = candidates(d, sel, t, b);
      for (int64_t h = 0; h < d.H; ++h) {
        probabilities<ExactSum>(q, kv, d, t, b, h, c, scale, p);
        for (size_t i = 0; i < c.size(); ++i)
          out[((t - t0) * d.B + b) * width + c[i].col] += p[i] / double(d.H);
      }
    }
  return out;
}

}  // namespace laga::ref
