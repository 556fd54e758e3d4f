// Internals shared by the attention kernels (attention.cpp, attention_eager.cpp, attention_fused.cpp):
// the fused kernel's tile sizes, the vectorised row operations of the softmax and its backward, and
// the copies of head rows between strided tensors and dense tiles. Not an API: nothing outside
// src/ops/attention*.cpp includes it. The math these rows implement is derived in docs/attention.md.
//
// Every row operation has an AVX-512 path (guarded by __AVX512F__; bf16 conversion by __AVX512BF16__)
// and a scalar fallback; both round to bf16 to nearest even, like to_bf16().
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
// GCC 12 warns inside its own AVX-512 intrinsics (their _mm512_undefined_ps pass-through, GCC bug
// 105593); the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "laga/ops/attention.hpp"

namespace laga::attn {

inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2 = 0.693147180559945309f;

// ---- tiles of the fused kernel (a function of the config only) ---------------------------------

// Rows of a query tile: the heads of one K/V head (all g = Hq/Hkv of them, or a sub-group in the one
// pass, below) times bq tokens, packed head-major (row u·nq + tt is the sub-group's head u, token
// t0 + tt), so the heads share every K/V tile product. Key tiles hold bk keys.
inline constexpr int64_t kFwdRows = 256, kFwdKeys = 256;
inline constexpr int64_t kBwdRows = 256, kBwdKeys = 256;
// A causal key tile is trimmed to the keys its last query sees, rounded up to this many keys so that
// only a few product shapes occur (each shape is a cached oneDNN primitive).
inline constexpr int64_t kKeyGranule = 32;
// A query tile's causal diagonal tile runs in chunks of this many tokens, each against only the keys
// it sees (FusedKernel::row_blocks): with 256-token tiles the masked half of the diagonal tile, one
// tile product in nine at T 4096, shrinks to an eighth of it.
inline constexpr int64_t kDiagTokens = 64;
// The one-pass backward's task is a K/V head's sub-group of query heads: the fewest sub-groups (a
// divisor of g) that give B·Hkv·split ≥ this many tasks, so that a few K/V heads (MQA: one) still
// keep a rank's threads busy. Each sub-group beyond the first holds an fp32 partial of its K/V head's
// dk and dv, [T, Dqk + Dv], summed in sub-group order at the end. A constant, not the thread count:
// results and memory depend on the config alone.
inline constexpr int64_t kOnePassTasks = 4;

// The forward's task is a bundle of this many query tiles of one head (the last bundle of a head may
// hold fewer): each key tile is copied from its strided rows once per bundle instead of once per
// query tile. Each member has its own q tile, row statistics and o sums.
inline constexpr int64_t kFwdBundle = 2;

struct FusedTiles {
  int64_t group = 1;      // g = Hq / Hkv
  int64_t split = 1;      // sub-groups of a K/V head's query heads (the one pass; 1 otherwise)
  int64_t heads = 1;      // query heads of a tile: g / split
  int64_t bq = 1, bk = 1; // tokens per query tile, keys per key tile
  int64_t rows = 1;       // heads · bq
  int64_t nqb = 1, nkb = 1;
  int64_t slots = 1;      // per-thread workspaces = threads used at most
  int64_t bundle = 1;     // query tiles per forward task (kFwdBundle, at most nqb); 1 in backward
  bool one_pass = false;  // backward in one pass (AttentionFwdParams::one_pass_backward)
};

inline FusedTiles fused_tiles(const AttentionFwdParams& p, bool backward) {
  FusedTiles t;
  t.group = p.Hq / p.Hkv;
  t.one_pass = backward && p.one_pass_backward;
  if (t.one_pass)
    while (p.B * p.Hkv * t.split < kOnePassTasks && t.split < t.group)
      do ++t.split; while (t.group % t.split != 0);
  t.heads = t.group / t.split;
  t.bq = std::min(p.T, std::max<int64_t>(1, (backward ? kBwdRows : kFwdRows) / t.heads));
  t.bk = std::min(p.T, backward ? kBwdKeys : kFwdKeys);
  t.rows = t.heads * t.bq;
  t.nqb = (p.T + t.bq - 1) / t.bq;
  t.nkb = (p.T + t.bk - 1) / t.bk;
  if (!backward) t.bundle = std::min(kFwdBundle, t.nqb);
  const int64_t tasks =
      p.B * p.Hkv * (!backward ? (t.nqb + t.bundle - 1) / t.bundle : t.one_pass ? t.split : std::max(t.nqb, t.nkb));
  t.slots = std::min(kAttentionMaxThreads, tasks);
  return t;
}

// Keys of tile [k0, k0 + bk) that queries up to kend (exclusive) may see, rounded up to kKeyGranule.
inline int64_t tile_keys(int64_t k0, int64_t bk, int64_t T, int64_t kend) {
  const int64_t need = (kend - k0 + kKeyGranule - 1) / kKeyGranule * kKeyGranule;
  return std::min({bk, T - k0, need});
}

// ---- element access -------------------------------------------------------------------------------

template <class T>
inline const T* at(const void* base, const AttentionStrides& s, int64_t t, int64_t b, int64_t h) {
  return static_cast<const T*>(base) + t * s.t + b * s.b + h * s.h;
}
template <class T>
inline T* at(void* base, const AttentionStrides& s, int64_t t, int64_t b, int64_t h) {
  return static_cast<T*>(base) + t * s.t + b * s.b + h * s.h;
}

// dst[r, :D] = src row t0 + r of one head, r < n: a strided head slice packed into a dense tile.
template <class T>
inline void pack_rows(T* dst, const T* src, int64_t n, int64_t src_t_stride, int64_t D) {
  for (int64_t r = 0; r < n; ++r) std::memcpy(dst + r * D, src + r * src_t_stride, size_t(D) * sizeof(T));
}

// Asks for the same rows to be brought towards the L2 cache while other work runs: the next tile's
// copy then reads cache instead of waiting on memory.
template <class T>
inline void prefetch_rows(const T* src, int64_t n, int64_t src_t_stride, int64_t D) {
  for (int64_t r = 0; r < n; ++r) {
    const char* row = reinterpret_cast<const char*>(src + r * src_t_stride);
    for (int64_t byte = 0; byte < D * int64_t(sizeof(T)); byte += 64) __builtin_prefetch(row + byte, 0, 2);
  }
}

// ---- vectorised row operations ------------------------------------------------------------------

#if defined(__AVX512F__)
inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1u); }

// 2^x for x ≤ ~0: 2^round(x) · poly(x − round(x)), degree-6 Taylor series of 2^f on [−½, ½]
// (relative error < 2e-7). Inputs below −150 give 0.
inline __m512 exp2_ps(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-150.0f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 y = _mm512_set1_ps(1.5403530393381609e-4f);
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.3333558146428443e-3f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(9.6181291076284772e-3f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(5.5504108664821580e-2f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.4022650695910071e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(6.9314718055994531e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const bf16* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline void store16(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
inline void store16(bf16* p, __m512 v, __mmask16 m) {
#if defined(__AVX512BF16__)
  _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(v));
#else
  __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
  _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
#endif
}
#endif

// Stores 0 in x[0..n).
template <class T>
inline void zero_row(T* x, int64_t n) {
  std::memset(static_cast<void*>(x), 0, size_t(std::max<int64_t>(n, 0)) * sizeof(T));
}

// max of x[0..n), n ≥ 1.
inline float row_max(const float* x, int64_t n) {
#if defined(__AVX512F__)
  __m512 m = _mm512_set1_ps(-INFINITY);
  for (int64_t k = 0; k < n; k += 16)
    m = _mm512_mask_max_ps(m, tail_mask(n - k), m, _mm512_maskz_loadu_ps(tail_mask(n - k), x + k));
  return _mm512_reduce_max_ps(m);
#else
  float m = -INFINITY;
  for (int64_t k = 0; k < n; ++k) m = std::max(m, x[k]);
  return m;
#endif
}

// p[k] = 2^(c·s[k] − m) for k < n, 0 for n ≤ k < nk; returns Σ p in fp32 (before p is rounded to
// P). p may alias s when P is float.
template <class P>
inline float row_exp2(const float* s, P* p, int64_t n, int64_t nk, float c, float m) {
#if defined(__AVX512F__)
  const __m512 vc = _mm512_set1_ps(c), vm = _mm512_set1_ps(-m);
  __m512 sum = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k < n; k += 16) {
    const __mmask16 mk = tail_mask(n - k);
    const __m512 e = _mm512_maskz_mov_ps(mk, exp2_ps(_mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, s + k), vc, vm)));
    sum = _mm512_add_ps(sum, e);
    store16(p + k, e, tail_mask(nk - k));
  }
  if (k < nk) zero_row(p + k, nk - k);
  return _mm512_reduce_add_ps(sum);
#else
  float sum = 0;
  for (int64_t k = 0; k < n; ++k) {
    const float e = std::exp2(s[k] * c - m);
    sum += e;
    p[k] = from_float<P>(e);
  }
  zero_row(p + n, nk - n);
  return sum;
#endif
}

// The delta of a query row whose every key is in the tile: Σ_k P_k·dP_k / Σ_k P_k, with P_k = 2^(c·s_k
// − lse2) rebuilt as span_grad and row_grad rebuild it, summed in fp64 and rounded once. The rebuilt P
// misses a sum of 1 by the rounding of lse (several ulps); dividing by its sum makes Σ_k P_k·(dP_k −
// delta) = 0, as the plain implementations' normalised softmax does, so a row of few keys cancels dP's
// rounding as theirs does (docs/attention.md §2). The fused kernels take it instead of dO·O for such
// rows: tile_delta_row for a row of S, dP (keys 0 .. n−1 contiguous), tile_delta_cols for the columns
// of transposed tiles Sᵀ, dPᵀ [keys, ld], column r (r < n) being token t0 + r, which sees keys 0 .. t0 + r.
#if defined(__AVX512F__)
// acc_lo, acc_hi += the 16 lanes of x·y (masked: lanes off add 0), in fp64.
inline void fma16_f64(__m512 x, __m512 y, __m512d& lo, __m512d& hi) {
  lo = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)), _mm512_cvtps_pd(_mm512_castps512_ps256(y)), lo);
  hi = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))),
                       _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(y), 1))), hi);
}
#endif

inline float tile_delta_row(const float* s, const float* dp, int64_t n, float c, float lse2) {
#if defined(__AVX512F__)
  const __m512 vc = _mm512_set1_ps(c), vl = _mm512_set1_ps(lse2), one = _mm512_set1_ps(1.0f);
  __m512d sum_lo = _mm512_setzero_pd(), sum_hi = sum_lo, mass_lo = sum_lo, mass_hi = sum_lo;
  for (int64_t k = 0; k < n; k += 16) {
    const __mmask16 mk = tail_mask(n - k);
    const __m512 pr = _mm512_maskz_mov_ps(mk, exp2_ps(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(mk, s + k), vc, vl)));
    fma16_f64(pr, _mm512_maskz_loadu_ps(mk, dp + k), sum_lo, sum_hi);
    fma16_f64(pr, one, mass_lo, mass_hi);
  }
  return float(_mm512_reduce_add_pd(_mm512_add_pd(sum_lo, sum_hi)) / _mm512_reduce_add_pd(_mm512_add_pd(mass_lo, mass_hi)));
#else
  double sum = 0, mass = 0;
  for (int64_t k = 0; k < n; ++k) {
    const double pk = std::exp2(s[k] * c - lse2);
    sum += pk * dp[k], mass += pk;
  }
  return float(sum / mass);
#endif
}

inline void tile_delta_cols(const float* st, const float* dpt, int64_t ld, int64_t n, int64_t t0, float c,
                            const float* lse2, float* delta) {
#if defined(__AVX512F__)
  const __m512 vc = _mm512_set1_ps(c), one = _mm512_set1_ps(1.0f);
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (int64_t r = 0; r < n; r += 16) {
    const __mmask16 cols = tail_mask(n - r);
    const __m512 vl = _mm512_maskz_loadu_ps(cols, lse2 + r);
    const __m512i token = _mm512_add_epi32(lane, _mm512_set1_epi32(int(t0 + r)));
    __m512d sum_lo = _mm512_setzero_pd(), sum_hi = sum_lo, mass_lo = sum_lo, mass_hi = sum_lo;
    for (int64_t k = 0; k <= t0 + std::min<int64_t>(r + 15, n - 1); ++k) {  // lane sees key k iff k ≤ its token
      const __mmask16 mk = cols & _mm512_cmpge_epi32_mask(token, _mm512_set1_epi32(int(k)));
      const __m512 pr = _mm512_maskz_mov_ps(mk, exp2_ps(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(mk, st + k * ld + r), vc, vl)));
      fma16_f64(pr, _mm512_maskz_loadu_ps(mk, dpt + k * ld + r), sum_lo, sum_hi);
      fma16_f64(pr, one, mass_lo, mass_hi);
    }
    const __m256 d_lo = _mm512_cvtpd_ps(_mm512_div_pd(sum_lo, mass_lo)), d_hi = _mm512_cvtpd_ps(_mm512_div_pd(sum_hi, mass_hi));
    const __m512 d = _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(d_lo)), _mm256_castps_pd(d_hi), 1));
    _mm512_mask_storeu_ps(delta + r, cols, d);
  }
#else
  for (int64_t r = 0; r < n; ++r) {
    double sum = 0, mass = 0;
    for (int64_t k = 0; k <= t0 + r; ++k) {
      const double pk = std::exp2(st[k * ld + r] * c - lse2[r]);
      sum += pk * dpt[k * ld + r], mass += pk;
    }
    delta[r] = float(sum / mass);
  }
#endif
}

// One row of the backward against one query's statistics (lse2 = log2-sum-exp2 of c·s, delta =
// rowsum(P∘dP), as §2 of docs/attention.md takes it): for k < n, p = 2^(c·s − lse2), ds = p·(dp − delta); 0 for n ≤ k < nk.
// ds may alias dp when D is float.
template <class D>
inline void row_grad(const float* s, const float* dp, D* ds, int64_t n, int64_t nk, float c, float lse2, float delta) {
#if defined(__AVX512F__)
  const __m512 vc = _mm512_set1_ps(c), vl = _mm512_set1_ps(-lse2), vd = _mm512_set1_ps(delta);
  int64_t k = 0;
  for (; k < n; k += 16) {
    const __mmask16 mk = tail_mask(n - k);
    const __m512 pr = exp2_ps(_mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, s + k), vc, vl));
    const __m512 g = _mm512_mul_ps(pr, _mm512_sub_ps(_mm512_maskz_loadu_ps(mk, dp + k), vd));
    store16(ds + k, _mm512_maskz_mov_ps(mk, g), tail_mask(nk - k));
  }
  if (k < nk) zero_row(ds + k, nk - k);
#else
  for (int64_t k = 0; k < n; ++k) {
    const float pr = std::exp2(s[k] * c - lse2);
    ds[k] = from_float<D>(pr * (dp[k] - delta));
  }
  zero_row(ds + n, nk - n);
#endif
}

// The same across queries (one key against n queries, each with its own lse2[r] and delta[r]),
// writing both p and ds. p may alias s and ds may alias dp when P is float.
template <class P>
inline void span_grad(const float* s, const float* dp, P* p, P* ds, int64_t n, float c, const float* lse2,
                      const float* delta) {
#if defined(__AVX512F__)
  const __m512 vc = _mm512_set1_ps(c);
  for (int64_t r = 0; r < n; r += 16) {
    const __mmask16 mk = tail_mask(n - r);
    const __m512 arg = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(mk, s + r), vc, _mm512_maskz_loadu_ps(mk, lse2 + r));
    const __m512 pr = exp2_ps(arg);
    const __m512 centred = _mm512_sub_ps(_mm512_maskz_loadu_ps(mk, dp + r), _mm512_maskz_loadu_ps(mk, delta + r));
    const __m512 g = _mm512_mul_ps(pr, centred);
    store16(p + r, pr, mk);
    store16(ds + r, g, mk);
  }
#else
  for (int64_t r = 0; r < n; ++r) {
    const float pr = std::exp2(s[r] * c - lse2[r]);
    const float g = pr * (dp[r] - delta[r]);
    p[r] = from_float<P>(pr);
    ds[r] = from_float<P>(g);
  }
#endif
}

// Σ_k a[k]·b[k] in fp32 over storage values.
template <class A, class B>
inline float dot_row(const A* a, const B* b, int64_t n) {
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (int64_t k = 0; k < n; k += 16) {
    const __mmask16 mk = tail_mask(n - k);
    acc = _mm512_fmadd_ps(load16(a + k, mk), load16(b + k, mk), acc);
  }
  return _mm512_reduce_add_ps(acc);
#else
  float acc = 0;
  for (int64_t k = 0; k < n; ++k) acc += to_float(a[k]) * to_float(b[k]);
  return acc;
#endif
}

// Σ a[k]·b[k], k < n, summed in fp64 and rounded once: the fused backward's delta = rowsum(dO∘O), whose
// rounding dS = P∘(dP − delta) does not cancel (docs/attention.md §2). Dv per row, beside T·Dv of products.
template <class A, class B>
inline float dot_row_f64(const A* a, const B* b, int64_t n) {
#if defined(__AVX512F__)
  __m512d lo = _mm512_setzero_pd(), hi = lo;
  for (int64_t k = 0; k < n; k += 16) {
    const __mmask16 mk = tail_mask(n - k);
    fma16_f64(load16(a + k, mk), load16(b + k, mk), lo, hi);
  }
  return float(_mm512_reduce_add_pd(_mm512_add_pd(lo, hi)));
#else
  double acc = 0;
  for (int64_t k = 0; k < n; ++k) acc += double(to_float(a[k])) * to_float(b[k]);
  return float(acc);
#endif
}

// y[k] = mul·x[k] rounded to T, k < n.
template <class T>
inline void scale_row(const float* x, T* y, int64_t n, float mul) {
#if defined(__AVX512F__)
  const __m512 vm = _mm512_set1_ps(mul);
  for (int64_t k = 0; k < n; k += 16) {
    const __mmask16 mk = tail_mask(n - k);
    store16(y + k, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, x + k), vm), mk);
  }
#else
  for (int64_t k = 0; k < n; ++k) y[k] = from_float<T>(x[k] * mul);
#endif
}

// ds[k] = p[k]·(dp[k] − delta) rounded to P, k < n; ds may alias dp when P is float.
template <class P>
inline void softmax_grad_row(const P* p, const float* dp, P* ds, int64_t n, float delta) {
#if defined(__AVX512F__)
  const __m512 vd = _mm512_set1_ps(delta);
  for (int64_t k = 0; k < n; k += 16) {
    const __mmask16 mk = tail_mask(n - k);
    store16(ds + k, _mm512_mul_ps(load16(p + k, mk), _mm512_sub_ps(_mm512_maskz_loadu_ps(mk, dp + k), vd)), mk);
  }
#else
  for (int64_t k = 0; k < n; ++k) ds[k] = from_float<P>(to_float(p[k]) * (dp[k] - delta));
#endif
}

// ---- the memory plan, walked by the kernel that allocates ------------------------------------------

// The kernels allocate exactly attention_memory_events(), in order: each allocate() and release()
// must match the next event, so the plan the planner reads cannot drift from what the kernel does.
class MemoryPlanWalker {
 public:
  explicit MemoryPlanWalker(std::vector<AttentionMemoryEvent> events) : events_(std::move(events)) {}
  Tensor allocate(std::string_view tag) {
    const AttentionMemoryEvent& e = next(tag, false);
    return Tensor::empty(e.shape, e.dtype, e.tag);
  }
  void release(std::string_view tag, Tensor& t) {
    next(tag, true);
    LAGA_ASSERT(t.defined() && t.tag() == tag, "attention releases '{}' but holds '{}'", tag, t.tag());
    t = Tensor();
  }
  void finish() const {
    LAGA_ASSERT(pos_ == events_.size(), "attention walked {} of its {} memory events", pos_, events_.size());
  }

 private:
  const AttentionMemoryEvent& next(std::string_view tag, bool release) {
    LAGA_ASSERT(pos_ < events_.size() && events_[pos_].tag == tag && events_[pos_].release == release,
                "attention {} '{}' out of its memory plan (event {})", release ? "releases" : "allocates", tag, pos_);
    return events_[pos_++];
  }
  std::vector<AttentionMemoryEvent> events_;
  size_t pos_ = 0;
};

// The kernels (attention_eager.cpp, attention_fused.cpp); params already checked.
AttentionSaved eager_forward(const AttentionFwdParams& p);
void eager_backward(const AttentionBwdParams& p, const AttentionSaved& saved);
AttentionSaved fused_forward(const AttentionFwdParams& p);
void fused_backward(const AttentionBwdParams& p, const AttentionSaved& saved);

}  // namespace laga::attn
