// fp64 reference attention, forward and backward, by the definition: plain loops, one query row at
// a time, no tiling, no online softmax. It is the specification the kernels in
// src/ops/attention_*.cpp are checked against; the backward below differentiates the forward's
// lines in reverse (derivation in docs/attention.md §2). Query head h reads key/value head h / (Hq
// / Hkv).
#include "reference/attention_ref.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "laga/core/error.hpp"

namespace laga::ref {

namespace {

// Dimensions read off the arrays; shapes checked once here.
struct Dims {
  int64_t T, B, Hq, Hkv, Dqk, Dv, group;
};

Dims dims_of(const Array& q, const Array& k, const Array& v) {
  LAGA_CHECK(q.shape.size() == 4 && k.shape.size() == 4 && v.shape.size() == 4,
             "reference attention takes q, k, v as [T, B, H, D]; got {}, {}, {}",
             shape_str(q.shape), shape_str(k.shape), shape_str(v.shape));
  Dims d{q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3], 0};
  LAGA_CHECK(k.shape == Shape({d.T, d.B, d.Hkv, d.Dqk}),
             "k has shape {}; expected [{}, {}, Hkv, {}]", shape_str(k.shape), d.T, d.B, d.Dqk);
  LAGA_CHECK(v.shape == Shape({d.T, d.B, d.Hkv, d.Dv}), "v has shape {}; expected [{}, {}, {}, Dv]",
             shape_str(v.shape), d.T, d.B, d.Hkv);
  LAGA_CHECK(d.Hkv > 0 && d.Hq % d.Hkv == 0, "Hq {} is not a multiple of Hkv {}", d.Hq, d.Hkv);
  d.group = d.Hq / d.Hkv;
  return d;
}

void check_mask(const Array& q, const KeyMask* mask) {
  LAGA_CHECK(!mask || int64_t(mask->size()) == q.shape[1] * q.shape[0] * q.shape[0],
             "reference attention: the key mask holds {} entries; expected [B, T, T] = {}",
             mask ? mask->size() : 0, q.shape[1] * q.shape[0] * q.shape[0]);
}

int64_t at(int64_t t, int64_t b, int64_t h, int64_t B, int64_t H, int64_t D) {
  return ((t * B + b) * H + h) * D;
}

// Row t of head (b, h): p[j] = softmax_j(scale · q_t · k_j) over the keys j it sees (j ≤ t when
// causal, and mask[b][t][j] set when a mask is given); returns the span of keys considered (every
// seen key lies below it). p holds T entries, the unseen ones 0.
template <class Sum>
int64_t probabilities(const Array& q, const Array& k, const Dims& d, int64_t b, int64_t h,
                      int64_t t, double scale, bool causal, const KeyMask* mask,
                      std::vector<double>& p) {
  const int64_t hk = h / d.group, n = causal ? t + 1 : d.T;
  std::fill(p.begin(), p.end(), 0.0);
  double mx = -INFINITY;
  const double* qt = q.data.data() + at(t, b, h, d.B, d.Hq, d.Dqk);
  constexpr int64_t kKeys = 8;  // keys whose sums advance side by side, each over c in order
  for (int64_t j0 = 0; j0 < n; j0 += kKeys) {
    const int64_t nj = std::min(kKeys, n - j0);
    double s[kKeys] = {};
    for (int64_t c = 0; c < d.Dqk; ++c)
      for (int64_t j = 0; j < nj; ++j)
        s[j] = Sum::add(s[j], qt[c] * k[at(j0 + j, b, hk, d.B, d.Hkv, d.Dqk) + c]);
    for (int64_t j = 0; j < nj; ++j) {
      const bool seen = !mask || (*mask)[size_t((b * d.T + t) * d.T + j0 + j)];
      p[size_t(j0 + j)] = seen ? scale * s[j] : -INFINITY;
      mx = std::max(mx, p[size_t(j0 + j)]);
    }
  }
  LAGA_CHECK(mx > -INFINITY, "reference attention: query row {} (batch {}) sees no key", t, b);
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) sum = Sum::add(sum, p[size_t(j)] = std::exp(p[size_t(j)] - mx));
  for (int64_t j = 0; j < n; ++j) p[size_t(j)] /= sum;
  return n;
}

template <class Sum>
Array attention_forward_t(const Array& q, const Array& k, const Array& v, double scale, bool causal,
                          std::optional<DType> storage, const KeyMask* mask) {
  const Dims d = dims_of(q, k, v);
  Array o({d.T, d.B, d.Hq, d.Dv});  // [T, B, Hq, Dv]
  // Heads in parallel: each writes its own rows of o, so the bits do not depend on the thread
  // count.
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.Hq; ++h) {
      std::vector<double> p(size_t(d.T));  // [T] one row of probabilities
      for (int64_t t = 0; t < d.T; ++t) {
        // P = softmax(scale · q kᵀ) (masked);  o = P v
        const int64_t n = probabilities<Sum>(q, k, d, b, h, t, scale, causal, mask, p),
                      hk = h / d.group;
        if (storage)
          for (int64_t j = 0; j < n; ++j) p[size_t(j)] = rounded(*storage, p[size_t(j)]);
        for (int64_t j = 0; j < n; ++j)
          for (int64_t c = 0; c < d.Dv; ++c) {
            double& oc = o[at(t, b, h, d.B, d.Hq, d.Dv) + c];
            oc = Sum::add(oc, p[size_t(j)] * v[at(j, b, hk, d.B, d.Hkv, d.Dv) + c]);
          }
      }
    }
  return o;
}

template <class Sum>
AttentionGrads attention_backward_t(const Array& q, const Array& k, const Array& v,
                                    const Array& dout, double scale, bool causal,
                                    std::optional<DType> storage, const Array* o,
                                    const KeyMask* mask) {
  const Dims d = dims_of(q, k, v);
  LAGA_CHECK(dout.shape == Shape({d.T, d.B, d.Hq, d.Dv}),
             "dout has shape {}; expected [{}, {}, {}, {}]", shape_str(dout.shape), d.T, d.B, d.Hq,
             d.Dv);
  LAGA_CHECK(!o || o->shape == dout.shape, "o has shape {}; expected that of dout, {}",
             o ? shape_str(o->shape) : "", shape_str(dout.shape));
  AttentionGrads g{Array(q.shape), Array(k.shape), Array(v.shape)};
  // K/V heads in parallel, each with its group's query heads in order: dk and dv of a K/V head sum
  // over h, then t, as one thread would, so the bits do not depend on the thread count.
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t hk = 0; hk < d.Hkv; ++hk) {
      std::vector<double> p(size_t(d.T)), dp(size_t(d.T));  // [T] one row of P and of dP
      for (int64_t h = hk * d.group; h < (hk + 1) * d.group; ++h)
        for (int64_t t = 0; t < d.T; ++t) {
          const int64_t n = probabilities<Sum>(q, k, d, b, h, t, scale, causal, mask, p);
          const int64_t qo = at(t, b, h, d.B, d.Hq, d.Dqk), oo = at(t, b, h, d.B, d.Hq, d.Dv);
          if (storage)
            for (int64_t j = 0; j < n; ++j) p[size_t(j)] = rounded(*storage, p[size_t(j)]);
          // o = P v:  dv_j += p_j · do_t,  dp_j = do_t · v_j
          for (int64_t j = 0; j < n; ++j) {
            const int64_t vo = at(j, b, hk, d.B, d.Hkv, d.Dv);
            double s = 0;
            for (int64_t c = 0; c < d.Dv; ++c) {
              g.dv[vo + c] = Sum::add(g.dv[vo + c], p[size_t(j)] * dout[oo + c]);
              s = Sum::add(s, dout[oo + c] * v[vo + c]);
            }
            dp[size_t(j)] = s;
          }
          // P = softmax(S):  dS_j = p_j · (dp_j − delta),  delta = Σ_i p_i dp_i = dO_t · O_t
          double delta = 0;
          if (o)
            for (int64_t c = 0; c < d.Dv; ++c) delta = Sum::add(delta, dout[oo + c] * (*o)[oo + c]);
          else
            for (int64_t j = 0; j < n; ++j) delta = Sum::add(delta, p[size_t(j)] * dp[size_t(j)]);
          // S = scale · q kᵀ:  dq_t += scale · dS_j k_j,  dk_j += scale · dS_j q_t
          for (int64_t j = 0; j < n; ++j) {
            double ds = p[size_t(j)] * (dp[size_t(j)] - delta);
            if (storage) ds = rounded(*storage, ds);
            const int64_t ko = at(j, b, hk, d.B, d.Hkv, d.Dqk);
            for (int64_t c = 0; c < d.Dqk; ++c) {
              g.dq[qo + c] = Sum::add(g.dq[qo + c], scale * ds * k[ko + c]);
              g.dk[ko + c] = Sum::add(g.dk[ko + c], scale * ds * q[qo + c]);
            }
          }
        }
    }
  return g;
}

}  // namespace

// A plain implementation in a storage dtype sums in fp32; the exact reference in fp64.
Array attention_forward(const Array& q, const Array& k, const Array& v, double scale, bool causal,
                        std::optional<DType> storage, const KeyMask* mask) {
  check_mask(q, mask);
  return storage ? attention_forward_t<F32Sum>(q, k, v, scale, causal, storage, mask)
                 : attention_forward_t<ExactSum>(q, k, v, scale, causal, storage, mask);
}

AttentionGrads attention_backward(const Array& q, const Array& k, const Array& v, const Array& dout,
                                  double scale, bool causal, std::optional<DType> storage,
                                  const Array* o, const KeyMask* mask) {
  check_mask(q, mask);
  return storage ? attention_backward_t<F32Sum>(q, k, v, dout, scale, causal, storage, o, mask)
                 : attention_backward_t<ExactSum>(q, k, v, dout, scale, causal, storage, o, mask);
}

}  // namespace laga::ref
