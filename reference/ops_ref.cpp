// fp64 reference ops: linear, RMSNorm and RoPE with YaRN, forward and backward, by their
// definitions (docs/design.md §1.1, §2.1; the backwards are derived in docs/block.md §4). Plain
// loops (the linears' rows on OpenMP threads, each sum in its one order).
//
// The RoPE frequencies and the attention factor are recomputed here from the config's raw fields
// (rope_theta, rope_scaling.*, qk_rope_head_dim, rope_interleaved) on purpose: the reference must
// not share a line with the fast code's MlaConfig::rope_inv_freq() / rope_attention_factor(), so a
// slip in either shows up as a disagreement. Nothing here is fast, and nothing here is used by
// src/.
#include "reference/ops_ref.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace laga::ref {

namespace {

// The product of all dims but the last: the number of rows an op over the last dim visits.
int64_t leading_rows(const Array& a) { return a.shape.empty() ? 1 : a.numel() / a.shape.back(); }

// docs/design.md §1.1: yarn_mscale(f, m) = 0.1 · m · ln(f) + 1, or 1 if f ≤ 1.
double yarn_mscale(double f, double m) { return f <= 1 ? 1.0 : 0.1 * m * std::log(f) + 1.0; }

// The rotation of RoPE/YaRN for one config: frequency of pair i and the factor on cos/sin.
struct Rope {
  std::vector<double> inv_freq;  // [Dr/2]
  double factor = 1;             // yarn_mscale(f, m) / yarn_mscale(f, ma), 1 without rope_scaling
  int64_t Dr = 0;
  bool interleaved = true;

  // Indices of pair i in the last dim: adjacent (2i, 2i+1) or halves (i, i + Dr/2).
  int64_t first(int64_t i) const { return interleaved ? 2 * i : i; }
  int64_t second(int64_t i) const { return interleaved ? 2 * i + 1 : i + Dr / 2; }
};

Rope make_rope(const MlaConfig& c) {
  Rope r;
  r.Dr = c.qk_rope_head_dim;
  r.interleaved = c.rope_interleaved;
  LAGA_CHECK(r.Dr > 0 && r.Dr % 2 == 0, "qk_rope_head_dim = {} must be positive and even; try 64",
             r.Dr);
  const double theta = c.rope_theta, Dr = double(r.Dr);
  r.inv_freq.resize(size_t(r.Dr / 2));
  for (int64_t i = 0; i < r.Dr / 2; ++i)
    r.inv_freq[size_t(i)] = std::pow(theta, -2.0 * double(i) / Dr);
  if (!c.rope_scaling.enabled) return r;

  const RopeScaling& s = c.rope_scaling;
  // corr(n): the (fractional) dimension index whose wavelength fits n times into L0.
  auto corr = [&](double n) {
    return Dr * std::log(double(s.original_max_position_embeddings) / (2 * std::numbers::pi * n)) /
           (2 * std::log(theta));
  };
  const double low = std::max(std::floor(corr(s.beta_fast)), 0.0);
  double high = std::min(std::ceil(corr(s.beta_slow)), Dr - 1);
  if (low == high) high += 0.001;  // keeps the ramp's division finite
  for (int64_t i = 0; i < r.Dr / 2; ++i) {
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double f = r.inv_freq[size_t(i)];
    // ramp 0: high-frequency pairs, kept (extrapolated); ramp 1: low-frequency pairs, interpolated
    // by 1/factor.
    r.inv_freq[size_t(i)] = f / s.factor * ramp + f * (1 - ramp);
  }
  r.factor = yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim);
  return r;
}

// y = factor · R(pos) x per pair (sign = +1), or its transpose dx = factor · R(pos)ᵀ dy (sign =
// -1): R = [[cos, -sin], [sin, cos]] acting on (x[first(i)], x[second(i)]) with angle pos ·
// inv_freq[i].
Array rope_apply(const Array& x, const MlaConfig& c, int64_t pos0, double sign) {
  const Rope r = make_rope(c);
  LAGA_CHECK(x.shape.size() >= 2 && x.shape.back() == r.Dr, "rope: x {} must be [T, ..., Dr = {}]",
             shape_str(x.shape), r.Dr);
  const int64_t T = x.shape[0];
  const int64_t per_token = x.numel() / (T * r.Dr);  // the middle dims (B, H, ...) flattened
  Array y(x.shape);
  for (int64_t t = 0; t < T; ++t) {
    const double pos = double(pos0 + t);
    for (int64_t m = 0; m < per_token; ++m) {
      const int64_t base = (t * per_token + m) * r.Dr;
      for (int64_t i = 0; i < r.Dr / 2; ++i) {
        const double angle = pos * r.inv_freq[size_t(i)];
        const double cs = std::cos(angle) * r.factor, sn = sign * std::sin(angle) * r.factor;
        const double a = x[base + r.first(i)], b = x[base + r.second(i)];
        y[base + r.first(i)] = a * cs - b * sn;
        y[base + r.second(i)] = a * sn + b * cs;
      }
    }
  }
  return y;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// linear: y[m, o] = Σ_i x[m, i] · w[o, i]
//
// All three products (y, dx, dw) are rows of sums out[j] = Σ_k a[k]·b_k[j] over contiguous rows
// b_k, each sum adding its terms in the order of k, one rounding (Sum::add) after each: the bits of
// summing one element at a time. The j of a row advance side by side (independent, contiguous,
// vectorised), four terms per pass over the row, and the rows run in blocks of kRefRows that share
// each chunk of kRefChunk rows b_k while it is in cache. Blocks run in parallel and each sum is one
// thread's, so the bits depend neither on the thread count nor on the blocking.

constexpr int64_t kRefRows = 8, kRefChunk = 8;

// out[0..n) ← out[j] + a[0]·b[j] + a[as]·b[ldb + j] + … over k < K, in the order of k.
template <class Sum>
void add_products(double* out, const double* a, int64_t as, const double* b, int64_t ldb, int64_t K,
                  int64_t n) {
  int64_t k = 0;
  for (; k + 4 <= K; k += 4) {
    const double a0 = a[k * as], a1 = a[(k + 1) * as], a2 = a[(k + 2) * as], a3 = a[(k + 3) * as];
    const double *b0 = b + k * ldb, *b1 = b0 + ldb, *b2 = b1 + ldb, *b3 = b2 + ldb;
    for (int64_t j = 0; j < n; ++j)
      out[j] = Sum::add(Sum::add(Sum::add(Sum::add(out[j], a0 * b0[j]), a1 * b1[j]), a2 * b2[j]),
                        a3 * b3[j]);
  }
  for (; k < K; ++k) {
    const double ak = a[k * as], *bk = b + k * ldb;
    for (int64_t j = 0; j < n; ++j) out[j] = Sum::add(out[j], ak * bk[j]);
  }
}

// out rows r < R (row r at out + r·ldo) += Σ_k a_r[k]·b_k, a_r[k] = a[r·ar + k·as], b_k = b +
// k·ldb, rows in parallel blocks of kRefRows, k in chunks of kRefChunk (above).
template <class Sum>
void product_rows(double* out, int64_t ldo, int64_t R, const double* a, int64_t ar, int64_t as,
                  const double* b, int64_t ldb, int64_t K, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t r0 = 0; r0 < R; r0 += kRefRows)
    for (int64_t k0 = 0; k0 < K; k0 += kRefChunk)
      for (int64_t r = r0; r < std::min(R, r0 + kRefRows); ++r)
        add_products<Sum>(out + r * ldo, a + r * ar + k0 * as, as, b + k0 * ldb, ldb,
                          std::min(kRefChunk, K - k0), n);
}

template <class Sum>
Array linear_forward_t(const Array& x, const Array& w) {
  LAGA_CHECK(w.shape.size() == 2 && !x.shape.empty() && x.shape.back() == w.shape[1],
             "linear: x {} must be [..., I] with I = w's dim 1, w {} is [O, I]", shape_str(x.shape),
             shape_str(w.shape));
  const int64_t M = leading_rows(x), O = w.shape[0], I = w.shape[1];
  Shape ys = x.shape;
  ys.back() = O;
  Array y(ys);                            // [..., O], zeros: the sums start there
  std::vector<double> wt(size_t(O * I));  // [I, O]: y's rows are sums of rows of wᵀ
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < I; ++i)
    for (int64_t o = 0; o < O; ++o) wt[size_t(i * O + o)] = w[o * I + i];
  product_rows<Sum>(y.data.data(), O, M, x.data.data(), I, 1, wt.data(), O, I, O);
  return y;
}

// Differentiates y[m, o] = Σ_i x[m, i] · w[o, i]:
//   dx[m, i] = Σ_o dy[m, o] · w[o, i]        (dx = dy · w: rows of w, in the order of o)
//   dw[o, i] = Σ_m dy[m, o] · x[m, i]        (dw = dyᵀ · x: rows of x, in the order of m)
template <class Sum>
LinearGrads linear_backward_t(const Array& x, const Array& w, const Array& dy) {
  const int64_t M = leading_rows(x), O = w.shape[0], I = w.shape[1];
  LAGA_CHECK(dy.numel() == M * O && dy.shape.back() == O,
             "linear backward: dy {} must be [..., O = {}] over {} rows", shape_str(dy.shape), O,
             M);
  LinearGrads g{Array(x.shape), Array(w.shape)};  // dx [..., I], dw [O, I]
  product_rows<Sum>(g.dx.data.data(), I, M, dy.data.data(), O, 1, w.data.data(), I, O, I);
  product_rows<Sum>(g.dw.data.data(), I, O, dy.data.data(), 1, O, x.data.data(), I, M, I);
  return g;
}

// ---------------------------------------------------------------------------------------------
// RMSNorm over the last dim C: r = (mean_c x² + eps)^(-1/2), y[c] = x[c] · r · w[c]

template <class Sum>
Array rmsnorm_forward_t(const Array& x, const Array& w, double eps) {
  LAGA_CHECK(w.shape.size() == 1 && !x.shape.empty() && x.shape.back() == w.shape[0],
             "rmsnorm: x {} must be [..., C] with C = w's length, w {}", shape_str(x.shape),
             shape_str(w.shape));
  const int64_t M = leading_rows(x), C = w.shape[0];
  Array y(x.shape);  // [..., C]
  for (int64_t m = 0; m < M; ++m) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss = Sum::add(ss, x[m * C + c] * x[m * C + c]);
    const double r = 1.0 / std::sqrt(ss / double(C) + eps);
    for (int64_t c = 0; c < C; ++c) y[m * C + c] = x[m * C + c] * r * w[c];
  }
  return y;
}

// Differentiates y[c] = x[c] · r · w[c] with r = (Σ_c x[c]² / C + eps)^(-1/2), per row:
//   dw[c] = Σ_rows dy[c] · x[c] · r
//   ∂r/∂x[j] = -r³ · x[j] / C, so
//   dx[j] = r · w[j] · dy[j] - (r³ / C) · x[j] · Σ_c dy[c] · w[c] · x[c]
template <class Sum>
RmsNormGrads rmsnorm_backward_t(const Array& x, const Array& w, const Array& dy, double eps) {
  LAGA_CHECK(dy.shape == x.shape, "rmsnorm backward: dy {} must match x {}", shape_str(dy.shape),
             shape_str(x.shape));
  const int64_t M = leading_rows(x), C = w.shape[0];
  RmsNormGrads g{Array(x.shape), Array(w.shape)};  // dx [..., C], dw [C]
  for (int64_t m = 0; m < M; ++m) {
    double ss = 0, dot = 0;
    for (int64_t c = 0; c < C; ++c) {
      ss = Sum::add(ss, x[m * C + c] * x[m * C + c]);
      dot = Sum::add(dot, dy[m * C + c] * w[c] * x[m * C + c]);
    }
    const double r = 1.0 / std::sqrt(ss / double(C) + eps);
    for (int64_t c = 0; c < C; ++c) {
      g.dw[c] = Sum::add(g.dw[c], dy[m * C + c] * x[m * C + c] * r);
      g.dx[m * C + c] = r * w[c] * dy[m * C + c] - r * r * r / double(C) * x[m * C + c] * dot;
    }
  }
  return g;
}

Array linear_forward(const Array& x, const Array& w, Accum acc) {
  return acc == Accum::f32 ? linear_forward_t<F32Sum>(x, w) : linear_forward_t<ExactSum>(x, w);
}
LinearGrads linear_backward(const Array& x, const Array& w, const Array& dy, Accum acc) {
  return acc == Accum::f32 ? linear_backward_t<F32Sum>(x, w, dy)
                           : linear_backward_t<ExactSum>(x, w, dy);
}
Array rmsnorm_forward(const Array& x, const Array& w, double eps, Accum acc) {
  return acc == Accum::f32 ? rmsnorm_forward_t<F32Sum>(x, w, eps)
                           : rmsnorm_forward_t<ExactSum>(x, w, eps);
}
RmsNormGrads rmsnorm_backward(const Array& x, const Array& w, const Array& dy, double eps,
                              Accum acc) {
  return acc == Accum::f32 ? rmsnorm_backward_t<F32Sum>(x, w, dy, eps)
                           : rmsnorm_backward_t<ExactSum>(x, w, dy, eps);
}

// ---------------------------------------------------------------------------------------------
// RoPE with YaRN: per pair i, (a, b) ← factor · R(pos · inv_freq[i]) (a, b)

Array rope_forward(const Array& x, const MlaConfig& c, int64_t pos0) {
  return rope_apply(x, c, pos0, +1.0);
}

// Differentiates y = factor · R x: R is a rotation, so dx = factor · Rᵀ dy, the rotation by the
// opposite angle (sin → -sin), with the same factor.
Array rope_backward(const Array& dy, const MlaConfig& c, int64_t pos0) {
  return rope_apply(dy, c, pos0, -1.0);
}

}  // namespace laga::ref
