// Internals shared by the attention kernels (attention.cpp, attention_eager.cpp,
// attention_fused.cpp, latent_attention.cpp, sparse_attention.cpp, indexer.cpp): their parallel
// regions, the fused kernel's tile sizes, the vectorised row operations of the softmax and its
// backward, and the copies of head rows between strided tensors and dense tiles. Not an API:
// nothing outside those kernels includes it. The math these rows implement is derived
// in docs/attention.md.
//
// The row operations are rows.hpp's (one Highway implementation, dispatched at run time); bf16 is
// rounded to nearest even, like to_bf16().
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include <omp.h>

#include "laga/ops/attention.hpp"
#include "src/ops/rows.hpp"

namespace laga::attn {

// Runs body(slot, task) for task in [0, tasks) on at most min(slots, tasks) threads; slot < slots
// is the thread's own workspace. Inside, every product runs on its calling thread alone
// (omp_set_num_threads(1) holds for the thread's nested regions: oneDNN runs sequentially), even in
// a team of one (which OpenMP does not count as a parallel region), so no result depends on the
// team size. Tasks are taken one at a time (dynamic): they differ in length.
template <class F>
void parallel_tasks(int64_t tasks, int64_t slots, F&& body) {
  const int nt =
      int(std::max<int64_t>(1, std::min<int64_t>({omp_get_max_threads(), slots, tasks})));
#pragma omp parallel num_threads(nt)
  {
    omp_set_num_threads(1);
    const int64_t slot = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) body(slot, task);
  }
}

inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2 = 0.693147180559945309f;

// ---- tiles of the fused kernel (a function of the config only) ---------------------------------

// Rows of a query tile: the heads of one K/V head (all g = Hq/Hkv of them, or a sub-group in the
// one pass, below) times bq tokens, packed head-major (row u·nq + tt is the sub-group's head u,
// token t0 + tt), so the heads share every K/V tile product. Key tiles hold bk keys.
inline constexpr int64_t kFwdRows = 256, kFwdKeys = 256;
inline constexpr int64_t kBwdRows = 256, kBwdKeys = 256;
// A causal key tile is trimmed to the keys its last query sees, rounded up to this many keys so
// that only a few product shapes occur (each shape is a cached oneDNN primitive).
inline constexpr int64_t kKeyGranule = 32;
// A query tile's causal diagonal tile runs in chunks of this many tokens, each against only the
// keys it sees (FusedKernel::row_blocks): with 256-token tiles the masked half of the diagonal
// tile, one tile product in nine at T 4096, shrinks to an eighth of it.
inline constexpr int64_t kDiagTokens = 64;
// The one-pass backward's task is a K/V head's sub-group of query heads: the fewest sub-groups (a
// divisor of g) that give B·Hkv·split ≥ this many tasks, so that a few K/V heads (MQA: one) still
// keep a rank's threads busy. Each sub-group beyond the first holds an fp32 partial of its K/V
// head's dk and dv, [T, Dqk + Dv], summed in sub-group order at the end. A constant, not the thread
// count: results and memory depend on the config alone.
inline constexpr int64_t kOnePassTasks = 4;

// The forward's task is a bundle of this many query tiles of one head (the last bundle of a head
// may hold fewer): each key tile is copied from its strided rows once per bundle instead of once
// per query tile. Each member has its own q tile, row statistics and o sums.
inline constexpr int64_t kFwdBundle = 2;

struct FusedTiles {
  int64_t group = 1;       // g = Hq / Hkv
  int64_t split = 1;       // sub-groups of a K/V head's query heads (the one pass; 1 otherwise)
  int64_t heads = 1;       // query heads of a tile: g / split
  int64_t bq = 1, bk = 1;  // tokens per query tile, keys per key tile
  int64_t rows = 1;        // heads · bq
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
    while (p.B * p.Hkv * t.split < kOnePassTasks && t.split < t.group) do
        ++t.split;
      while (t.group % t.split != 0);
  t.heads = t.group / t.split;
  t.bq = std::min(p.T, std::max<int64_t>(1, (backward ? kBwdRows : kFwdRows) / t.heads));
  t.bk = std::min(p.T, backward ? kBwdKeys : kFwdKeys);
  t.rows = t.heads * t.bq;
  t.nqb = (p.T + t.bq - 1) / t.bq;
  t.nkb = (p.T + t.bk - 1) / t.bk;
  if (!backward) t.bundle = std::min(kFwdBundle, t.nqb);
  const int64_t tasks = p.B * p.Hkv *
                        (!backward    ? (t.nqb + t.bundle - 1) / t.bundle
                         : t.one_pass ? t.split
                                      : std::max(t.nqb, t.nkb));
  t.slots = std::min(kAttentionMaxThreads, tasks);
  return t;
}

// Keys of tile [k0, k0 + bk) that queries up to kend (exclusive) may see, rounded up to
// kKeyGranule.
inline int64_t tile_keys(int64_t k0, int64_t bk, int64_t T, int64_t kend) {
  const int64_t need = (kend - k0 + kKeyGranule - 1) / kKeyGranule * kKeyGranule;
  return std::min({bk, T - k0, need});
}

// ---- element access
// -------------------------------------------------------------------------------

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
  for (int64_t r = 0; r < n; ++r)
    std::memcpy(dst + r * D, src + r * src_t_stride, size_t(D) * sizeof(T));
}

// Asks for the same rows to be brought towards the L2 cache while other work runs: the next tile's
// copy then reads cache instead of waiting on memory.
template <class T>
inline void prefetch_rows(const T* src, int64_t n, int64_t src_t_stride, int64_t D) {
  for (int64_t r = 0; r < n; ++r) {
    const char* row = reinterpret_cast<const char*>(src + r * src_t_stride);
    for (int64_t byte = 0; byte < D * int64_t(sizeof(T)); byte += 64)
      __builtin_prefetch(row + byte, 0, 2);
  }
}

// ---- vectorised row operations (rows.hpp: Highway, the CPU's best target under LAGA_MAX_ISA)
// --------

// Stores 0 in x[0..n).
template <class T>
inline void zero_row(T* x, int64_t n) {
  std::memset(static_cast<void*>(x), 0, size_t(std::max<int64_t>(n, 0)) * sizeof(T));
}

// max of x[0..n), n ≥ 1.
inline float row_max(const float* x, int64_t n) { return rows::kernels().row_max(x, n); }

// p[k] = 2^(c·s[k] − m) for k < n, 0 for n ≤ k < nk; returns Σ p in fp32 (before p is rounded to
// P). p may alias s when P is float.
inline float row_exp2(const float* s, float* p, int64_t n, int64_t nk, float c, float m) {
  return rows::kernels().row_exp2_f32(s, p, n, nk, c, m);
}
inline float row_exp2(const float* s, bf16* p, int64_t n, int64_t nk, float c, float m) {
  return rows::kernels().row_exp2_bf16(s, p, n, nk, c, m);
}

// The delta of a query row whose every key is in the tile: Σ_k P_k·dP_k / Σ_k P_k, with P_k =
// 2^(c·s_k − lse2) rebuilt as span_grad and row_grad rebuild it, summed in fp64 and rounded once.
// The rebuilt P misses a sum of 1 by the rounding of lse (several ulps); dividing by its sum makes
// Σ_k P_k·(dP_k − delta) = 0, as the plain implementations' normalised softmax does, so a row of
// few keys cancels dP's rounding as theirs does (docs/attention.md §2). The fused kernels take it
// instead of dO·O for such rows: tile_delta_row for a row of S, dP (keys 0 .. n−1 contiguous),
// tile_delta_cols for the columns of transposed tiles Sᵀ, dPᵀ [keys, ld], column r (r < n) being
// token t0 + r, which sees keys 0 .. t0 + r.
inline float tile_delta_row(const float* s, const float* dp, int64_t n, float c, float lse2) {
  return rows::kernels().tile_delta_row(s, dp, n, c, lse2);
}
inline void tile_delta_cols(const float* st, const float* dpt, int64_t ld, int64_t n, int64_t t0,
                            float c, const float* lse2, float* delta) {
  rows::kernels().tile_delta_cols(st, dpt, ld, n, t0, c, lse2, delta);
}

// One row of the backward against one query's statistics (lse2 = log2-sum-exp2 of c·s, delta =
// rowsum(P∘dP), as §2 of docs/attention.md takes it): for k < n, p = 2^(c·s − lse2), ds = p·(dp −
// delta); 0 for n ≤ k < nk. ds may alias dp when D is float.
inline void row_grad(const float* s, const float* dp, float* ds, int64_t n, int64_t nk, float c,
                     float lse2, float delta) {
  rows::kernels().row_grad_f32(s, dp, ds, n, nk, c, lse2, delta);
}
inline void row_grad(const float* s, const float* dp, bf16* ds, int64_t n, int64_t nk, float c,
                     float lse2, float delta) {
  rows::kernels().row_grad_bf16(s, dp, ds, n, nk, c, lse2, delta);
}

// The same across queries (one key against n queries, each with its own lse2[r] and delta[r]),
// writing both p and ds. p may alias s and ds may alias dp when P is float.
inline void span_grad(const float* s, const float* dp, float* p, float* ds, int64_t n, float c,
                      const float* lse2, const float* delta) {
  rows::kernels().span_grad_f32(s, dp, p, ds, n, c, lse2, delta);
}
inline void span_grad(const float* s, const float* dp, bf16* p, bf16* ds, int64_t n, float c,
                      const float* lse2, const float* delta) {
  rows::kernels().span_grad_bf16(s, dp, p, ds, n, c, lse2, delta);
}

// Σ_k a[k]·b[k] in fp32 over storage values.
inline float dot_row(const float* a, const float* b, int64_t n) {
  return rows::kernels().dot_f32_f32(a, b, n);
}
inline float dot_row(const bf16* a, const float* b, int64_t n) {
  return rows::kernels().dot_bf16_f32(a, b, n);
}

// Σ a[k]·b[k], k < n, summed in fp64 and rounded once: the fused backward's delta = rowsum(dO∘O),
// whose rounding dS = P∘(dP − delta) does not cancel (docs/attention.md §2). Dv per row, beside
// T·Dv of products.
inline float dot_row_f64(const float* a, const float* b, int64_t n) {
  return rows::kernels().dot_f64_f32_f32(a, b, n);
}
inline float dot_row_f64(const bf16* a, const float* b, int64_t n) {
  return rows::kernels().dot_f64_bf16_f32(a, b, n);
}
inline float dot_row_f64(const bf16* a, const bf16* b, int64_t n) {
  return rows::kernels().dot_f64_bf16_bf16(a, b, n);
}

// y[k] = mul·x[k] rounded to T, k < n.
inline void scale_row(const float* x, float* y, int64_t n, float mul) {
  rows::kernels().scale_f32(x, y, n, mul);
}
inline void scale_row(const float* x, bf16* y, int64_t n, float mul) {
  rows::kernels().scale_bf16(x, y, n, mul);
}

// ds[k] = p[k]·(dp[k] − delta) rounded to P, k < n; ds may alias dp when P is float.
inline void softmax_grad_row(const float* p, const float* dp, float* ds, int64_t n, float delta) {
  rows::kernels().softmax_grad_f32(p, dp, ds, n, delta);
}
inline void softmax_grad_row(const bf16* p, const float* dp, bf16* ds, int64_t n, float delta) {
  rows::kernels().softmax_grad_bf16(p, dp, ds, n, delta);
}

// ---- the memory plan, walked by the kernel that allocates
// ------------------------------------------

// The kernels allocate exactly attention_memory_events(), in order: each allocate() and release()
// must match the next event, so the plan the planner reads cannot drift from what the kernel does.
class MemoryPlanWalker {
 public:
  explicit MemoryPlanWalker(std::vector<AttentionMemoryEvent> events)
      : events_(std::move(events)) {}
  Tensor allocate(std::string_view tag) {
    const AttentionMemoryEvent& e = next(tag, false);
    return Tensor::empty(e.shape, e.dtype, e.tag);
  }
  void release(std::string_view tag, Tensor& t) {
    next(tag, true);
    LAGA_ASSERT(t.defined() && t.tag() == tag, "attention releases '{}' but holds '{}'", tag,
                t.tag());
    t = Tensor();
  }
  void finish() const {
    LAGA_ASSERT(pos_ == events_.size(), "attention walked {} of its {} memory events", pos_,
                events_.size());
  }

 private:
  const AttentionMemoryEvent& next(std::string_view tag, bool release) {
    LAGA_ASSERT(
        pos_ < events_.size() && events_[pos_].tag == tag && events_[pos_].release == release,
        "attention {} '{}' out of its memory plan (event {})", release ? "releases" : "allocates",
        tag, pos_);
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
