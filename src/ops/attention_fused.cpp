// The fused attention kernel: flash-style tiles with an online softmax (FlashAttention-2's loop
// order on a CPU). Forward saves only o and the log-sum-exp; backward recomputes the probabilities
// tile by tile. Nothing T×T is ever allocated: the workspace is a fixed number of per-thread tile
// slots (attention_memory_events lists every buffer; docs/attention.md §5 gives the formulas).
//
// Parallel over independent tasks, each writing outputs no other task writes, so results are
// bitwise the same from run to run and for any thread count (each task's arithmetic does not depend
// on the thread that runs it; oneDNN runs single-threaded inside the parallel region):
//   forward   task (b, hk, query tile):  o and lse of the tile's rows, all g heads of group hk
//   backward  two passes (the default):
//             pass A, task (b, hk, key tile):    dk, dv of the tile, summed over the group's heads
//             pass B, task (b, hk, query tile):  dq of the tile's rows
//             or one pass (one_pass_backward), task (b, hk, sub-group): for each key tile j, dk and
//             dv of the tile and the fp32 dq sums of the sub-group's rows += dS K_j, in j order;
//             a group split in sub-groups (few K/V heads; FusedTiles::split) sums its sub-groups'
//             fp32 dk, dv partials in sub-group order at the end
// Tasks are taken head-major (every tile of one (b, hk), longest first, then the next head):
// threads on neighbouring tiles of one head read the same K/V (or q, dout) rows from the shared
// cache. Neither uses FlashAttention-2's atomic dq update, which would make the sum order depend on
// timing: the one pass owns the group's dq rows; pass B recomputes S and dP (two extra products per
// pair). The products are laga::matmul (oneDNN) on tiles; the exponentials are vectorised row
// operations from attention_internal.hpp. Math and derivation: docs/attention.md §3–§4.
#include <omp.h>

#include "attention_internal.hpp"
#include "laga/ops/matmul.hpp"

namespace laga::attn {

namespace {

// C [M, N] fp32 (=, or += when accumulate) = A [M, K] · B [K, N], operands given by element
// strides.
MatmulParams product(int64_t M, int64_t N, int64_t K, DType ab, const void* a, int64_t a_m,
                     int64_t a_k, const void* b, int64_t b_k, int64_t b_n, float* c, int64_t c_m,
                     bool accumulate) {
  MatmulParams mp;
  mp.M = M, mp.N = N, mp.K = K;
  mp.ab_dtype = ab, mp.c_dtype = DType::f32;
  mp.a = a, mp.a_m_stride = a_m, mp.a_k_stride = a_k;
  mp.b = b, mp.b_k_stride = b_k, mp.b_n_stride = b_n;
  mp.c = c, mp.c_m_stride = c_m, mp.c_n_stride = 1;
  mp.accumulate = accumulate;
  return mp;
}

// Keys a query row (token t) sees in key tile [k0, k0 + nk).
inline int64_t visible(bool causal, int64_t t, int64_t k0, int64_t nk) {
  return causal ? std::clamp<int64_t>(t - k0 + 1, 0, nk) : nk;
}

// One thread's tiles, all dense row-major with the width in use as leading dimension (oneDNN's
// AMX/brgemm matmul takes only dense operands; a strided one falls back to a slower path).
template <class T>
struct Slot {
  T* qt;         // [rows, Dqk] the query tile's q rows
  T* dot;        // [rows, Dv] its dout rows (backward)
  T* kt;         // [bk, Dqk] a key tile, when k's rows are strided
  T* vt;         // [bk, Dv] a value tile, when v's rows are strided
  float* s;      // [rows · bk] S or Sᵀ, fp32
  float* dp;     // [rows · bk] dP or dPᵀ, fp32 (backward)
  T* pt;         // [rows · bk] P in the storage dtype (aliases s when fp32)
  T* ds;         // [rows · bk] dS in the storage dtype (aliases dp when fp32; backward)
  float* stat0;  // [rows] forward: running max m; backward: lse2
  float* stat1;  // [rows] forward: running sum l; backward: delta
  // forward [rows, Dv] o accumulator; backward [bk, Dqk + Dv] dk, dv or [rows, Dqk] dq
  float* acc;
};

template <class T>
struct FusedKernel {
  static constexpr bool low = !std::is_same_v<T, float>;  // bf16: P and dS get tiles of their own
  const AttentionFwdParams& p;
  FusedTiles tl;
  float c;  // scale · log2 e: probabilities are 2^(c·s − m) with s = q·k unscaled

  // Query tile (b, hk, sub, i): tokens t0 .. t0 + nq of the heads of sub-group sub of K/V head hk
  // (the whole group unless the one pass splits it), rows = heads · nq.
  struct QTile {
    int64_t b, hk, sub, t0, nq, rows;
  };
  QTile q_tile(int64_t b, int64_t hk, int64_t sub, int64_t i) const {
    const int64_t t0 = i * tl.bq, nq = std::min(tl.bq, p.T - t0);
    return {b, hk, sub, t0, nq, tl.heads * nq};
  }
  int64_t first_head(const QTile& q) const { return q.hk * tl.group + q.sub * tl.heads; }
  int64_t head(const QTile& q, int64_t r) const { return first_head(q) + r / q.nq; }
  int64_t token(const QTile& q, int64_t r) const { return q.t0 + r % q.nq; }
  // Whether token t's softmax is one key: its dS is exactly 0, while p·(dp − delta) would keep the
  // residue of delta = dO·O summed in another order than dp (docs/attention.md §2).
  bool alone(int64_t t) const { return t == 0 && p.causal && p.first_row_alone; }
  // Whether token t's every key is in the first key tile, of nk keys: its delta is then ΣP∘dP / ΣP
  // of that tile (tile_delta_*), as the plain implementations take it, so dS = P∘(dP − delta)
  // cancels dP's rounding as theirs does; dO·O's rounding is its own (rows of few keys;
  // docs/attention.md §2).
  bool in_first_tile(int64_t t, int64_t nk) const {
    return p.causal && p.first_row_alone && t < nk;
  }
  // dst [rows, D] = x rows of the tile's heads, packed head-major.
  void pack(T* dst, const void* x, const AttentionStrides& s, int64_t D, const QTile& q) const {
    for (int64_t u = 0; u < tl.heads; ++u)
      pack_rows(dst + u * q.nq * D, at<T>(x, s, q.t0, q.b, first_head(q) + u), q.nq, s.t, D);
  }
  void prefetch(const void* x, const AttentionStrides& s, int64_t D, const QTile& q) const {
    for (int64_t u = 0; u < tl.heads; ++u)
      prefetch_rows(at<T>(x, s, q.t0, q.b, first_head(q) + u), q.nq, s.t, D);
  }
  // Keys and values [k0, k0 + nk) of head (b, hk) as dense [nk, D] tiles: in place when the rows
  // are already dense, else copied into the slot.
  struct KvTile {
    const T *k, *v;
  };
  KvTile kv_tile(int64_t k0, int64_t nk, int64_t b, int64_t hk, const Slot<T>& w) const {
    const T* k = at<T>(p.k, p.k_stride, k0, b, hk);
    const T* v = at<T>(p.v, p.v_stride, k0, b, hk);
    if (p.k_stride.t != p.Dqk) {
      pack_rows(w.kt, k, nk, p.k_stride.t, p.Dqk);
      k = w.kt;
    }
    if (p.v_stride.t != p.Dv) {
      pack_rows(w.vt, v, nk, p.v_stride.t, p.Dv);
      v = w.vt;
    }
    return {k, v};
  }
  // Prefetches the key tile after [k0, k0 + nk) while this one's products run (kend: keys in use).
  void prefetch_next_kv(int64_t k0, int64_t kend, int64_t b, int64_t hk) const {
    const int64_t next = k0 + tl.bk;
    if (next >= kend) return;
    const int64_t nk = tile_keys(next, tl.bk, p.T, kend);
    if (p.k_stride.t != p.Dqk)
      prefetch_rows(at<T>(p.k, p.k_stride, next, b, hk), nk, p.k_stride.t, p.Dqk);
    if (p.v_stride.t != p.Dv)
      prefetch_rows(at<T>(p.v, p.v_stride, next, b, hk), nk, p.v_stride.t, p.Dv);
  }

  // Row blocks of query tile q against key tile [k0, k0 + nk): the whole tile, or, where a causal
  // tile is partly masked (the diagonal) and the tile has at least two chunks of kDiagTokens
  // tokens, per head the tile's tokens in chunks of kDiagTokens, each against only the keys its
  // last token sees (rounded up to kKeyGranule): the masked upper triangle is mostly not computed.
  struct RowBlock {
    int64_t r0, m, nk;  // rows [r0, r0 + m) against the tile's first nk keys
  };
  template <class F>
  void row_blocks(const QTile& q, int64_t k0, int64_t nk, F&& f) const {
    const int64_t first_keys = tile_keys(k0, nk, p.T, q.t0 + std::min(kDiagTokens, q.nq));
    if (!p.causal || q.nq < 2 * kDiagTokens || first_keys >= nk) return f(RowBlock{0, q.rows, nk});
    for (int64_t u = 0; u < tl.heads; ++u)
      for (int64_t a = 0; a < q.nq; a += kDiagTokens) {
        const int64_t m = std::min(kDiagTokens, q.nq - a);
        f(RowBlock{u * q.nq + a, m, tile_keys(k0, nk, p.T, q.t0 + a + m)});
      }
  }

  // The same for the key-major products of key tile [k0, k0 + nk) against query tile q (Sᵀ [nk,
  // rows]): the whole pair, or where the tile's later keys are masked for the tile's first queries,
  // per chunk of kDiagTokens keys and per head, only the query columns from the first token that
  // sees the chunk's first key (rounded down to kKeyGranule); a chunk no query of the tile sees is
  // skipped.
  struct KeyBlock {
    int64_t k0, m, c0, nc;  // keys [k0, k0 + m) of the tile against query rows [c0, c0 + nc)
  };
  template <class F>
  void key_blocks(const QTile& q, int64_t k0, int64_t nk, F&& f) const {
    if (!p.causal || nk < 2 * kDiagTokens || k0 + nk - kDiagTokens <= q.t0)
      return f(KeyBlock{0, nk, 0, q.rows});
    for (int64_t a = 0; a < nk; a += kDiagTokens) {
      const int64_t first = std::max<int64_t>(0, k0 + a - q.t0) / kKeyGranule * kKeyGranule;
      if (first >= q.nq) break;  // later chunks start later still
      for (int64_t u = 0; u < tl.heads; ++u)
        f(KeyBlock{a, std::min(kDiagTokens, nk - a), u * q.nq + first, q.nq - first});
    }
  }

  // ---- forward --------------------------------------------------------------------------------
  // Online softmax over key tiles: m = running max of c·s, l = running Σ 2^(c·s − m),
  // acc = running Σ 2^(c·s − m) v; o = acc / l, lse = (m + log2 l) · ln 2. A task runs a bundle of
  // up to kFwdBundle query tiles of one head (its first the longest): each key tile is copied once
  // and used by every tile of the bundle that sees it. Each tile's arithmetic is the same as alone.
  void forward_task(const QTile* qs, int64_t n, const Slot<T>* ws, float* lse) const {
    for (int64_t u = 0; u < n; ++u) {
      const QTile& q = qs[u];
      const Slot<T>& w = ws[u];
      pack(w.qt, p.q, p.q_stride, p.Dqk, q);
      std::fill(w.stat0, w.stat0 + q.rows, -INFINITY);
      std::fill(w.stat1, w.stat1 + q.rows, 0.0f);
      std::fill(w.acc, w.acc + q.rows * p.Dv, 0.0f);
    }
    auto key_end = [&](const QTile& q) { return p.causal ? q.t0 + q.nq : p.T; };
    const int64_t kend = key_end(qs[0]);
    for (int64_t k0 = 0; k0 < kend; k0 += tl.bk) {
      const KvTile kv = kv_tile(k0, tile_keys(k0, tl.bk, p.T, kend), qs[0].b, qs[0].hk, ws[0]);
      prefetch_next_kv(k0, kend, qs[0].b, qs[0].hk);
      for (int64_t u = 0; u < n && k0 < key_end(qs[u]); ++u)
        forward_step(qs[u], ws[u], k0, tile_keys(k0, tl.bk, p.T, key_end(qs[u])), kv);
    }
    for (int64_t u = 0; u < n; ++u) {
      const QTile& q = qs[u];
      const Slot<T>& w = ws[u];
      for (int64_t r = 0; r < q.rows; ++r) {
        const int64_t h = head(q, r), t = token(q, r);
        if (p.o_f32)
          scale_row(w.acc + r * p.Dv, at<float>(p.o, p.o_stride, t, q.b, h), p.Dv,
                    1.0f / w.stat1[r]);
        else
          scale_row(w.acc + r * p.Dv, at<T>(p.o, p.o_stride, t, q.b, h), p.Dv, 1.0f / w.stat1[r]);
        lse[(q.b * p.Hq + h) * p.T + t] = (w.stat0[r] + std::log2(w.stat1[r])) * kLn2;
      }
    }
  }
  // Query tile q against the first nk keys of key tile k0 (kv: at least nk rows).
  void forward_step(const QTile& q, const Slot<T>& w, int64_t k0, int64_t nk,
                    const KvTile& kv) const {
    float *m = w.stat0, *l = w.stat1, *acc = w.acc;
    // s [rows, nk] = qt · K_jᵀ (per row block: a block's columns past its nk are not computed, and
    // its rows see none of them)
    row_blocks(q, k0, nk, [&](const RowBlock& bl) {
      matmul(product(bl.m, bl.nk, p.Dqk, p.dtype, w.qt + bl.r0 * p.Dqk, p.Dqk, 1, kv.k, 1, p.Dqk,
                     w.s + bl.r0 * nk, nk, false));
    });
    for (int64_t r = 0; r < q.rows; ++r) {
      const int64_t n = visible(p.causal, token(q, r), k0, nk);
      float* sr = w.s + r * nk;
      T* pr = w.pt + r * nk;
      if (n == 0) {
        zero_row(pr, nk);
        continue;
      }
      const float m_new = std::max(m[r], row_max(sr, n) * c);
      const float alpha = std::exp2(m[r] - m_new);
      l[r] = l[r] * alpha + row_exp2(sr, pr, n, nk, c, m_new);
      m[r] = m_new;
      if (alpha != 1.0f)
        for (float *a = acc + r * p.Dv, *e = a + p.Dv; a < e; ++a) *a *= alpha;
    }
    // acc [rows, Dv] += P [rows, nk] · V_j (per row block: P is 0 past the block's nk)
    row_blocks(q, k0, nk, [&](const RowBlock& bl) {
      matmul(product(bl.m, p.Dv, bl.nk, p.dtype, w.pt + bl.r0 * nk, nk, 1, kv.v, p.Dv, 1,
                     acc + bl.r0 * p.Dv, p.Dv, true));
    });
  }

  // ---- backward -------------------------------------------------------------------------------
  // Packs the tile's q and dout and its rows' statistics: lse2 = lse · log2 e, delta.
  void pack_grad_rows(const AttentionBwdParams& bp, const QTile& q, const Slot<T>& w,
                      const float* lse, const float* delta) const {
    pack(w.qt, bp.q, bp.q_stride, p.Dqk, q);
    pack(w.dot, bp.dout, bp.dout_stride, p.Dv, q);
    for (int64_t r = 0; r < q.rows; ++r) {
      const int64_t row = (q.b * p.Hq + head(q, r)) * p.T + token(q, r);
      w.stat0[r] = lse[row] * kLog2e;
      w.stat1[r] = delta[row];
    }
  }

  // Pass A, key tile (b, hk, j): the tile's dk, dv summed over the heads of sub-group sub and every
  // query tile that sees it. Products in the transposed space (Sᵀ [nk, rows]) so that every operand
  // is dense and read row-major: dV += Pᵀ dO, dK += dSᵀ Q.
  // With dq_sum (the one pass): also dq_sum rows of every query tile i that sees j, [rows of tile
  // i, Dqk] at i · tl.rows, += dS [R, nk] · K_j (dS read through the transpose of dSᵀ). With
  // partial (the one pass over a split group): the sums go unscaled to the sub-group's partial [T,
  // Dqk + Dv] (row: dk, then dv) instead of to dk and dv; reduce_partials adds the sub-groups.
  void key_task(const AttentionBwdParams& bp, int64_t b, int64_t hk, int64_t sub, int64_t j,
                const Slot<T>& w, const float* lse, const float* delta, float* dq_sum = nullptr,
                float* partial = nullptr) const {
    const int64_t k0 = j * tl.bk, nk = std::min(tl.bk, p.T - k0);
    float *dk_acc = w.acc, *dv_acc = w.acc + nk * p.Dqk;  // [nk, Dqk], [nk, Dv]
    std::fill(w.acc, w.acc + nk * (p.Dqk + p.Dv), 0.0f);
    const KvTile kv = kv_tile(k0, nk, b, hk, w);
    for (int64_t i = p.causal ? k0 / tl.bq : 0; i < tl.nqb; ++i) {
      const QTile q = q_tile(b, hk, sub, i);
      const int64_t R = q.rows;
      pack_grad_rows(bp, q, w, lse, delta);
      if (i + 1 < tl.nqb) {  // the next query tile's rows, while this one's products run
        const QTile next = q_tile(b, hk, sub, i + 1);
        prefetch(bp.q, bp.q_stride, p.Dqk, next);
        prefetch(bp.dout, bp.dout_stride, p.Dv, next);
      }
      // st [nk, R] = K_j · qtᵀ;  dpt [nk, R] = V_j · dotᵀ (per key block: what a block leaves out,
      // the loop below zeroes in P and dS, and the products after it do not read)
      key_blocks(q, k0, nk, [&](const KeyBlock& bl) {
        matmul(product(bl.m, bl.nc, p.Dqk, p.dtype, kv.k + bl.k0 * p.Dqk, p.Dqk, 1,
                       w.qt + bl.c0 * p.Dqk, 1, p.Dqk, w.s + bl.k0 * R + bl.c0, R, false));
        matmul(product(bl.m, bl.nc, p.Dv, p.dtype, kv.v + bl.k0 * p.Dv, p.Dv, 1,
                       w.dot + bl.c0 * p.Dv, 1, p.Dv, w.dp + bl.k0 * R + bl.c0, R, false));
      });
      if (k0 == 0 && in_first_tile(q.t0, nk))  // per head, its tokens t0 .. nk − 1
        for (int64_t u = 0, seg = 0; u < tl.heads; ++u, seg += q.nq)
          tile_delta_cols(w.s + seg, w.dp + seg, R, std::min(q.nq, nk - q.t0), q.t0, c,
                          w.stat0 + seg, w.stat1 + seg);
      for (int64_t kk = 0; kk < nk; ++kk) {
        const int64_t key = k0 + kk, o = kk * R;
        if (!p.causal || key <= q.t0) {
          span_grad(w.s + o, w.dp + o, w.pt + o, w.ds + o, R, c, w.stat0, w.stat1);
          continue;
        }
        for (int64_t u = 0; u < tl.heads; ++u) {  // token t0 + tt sees the key iff tt ≥ key − t0
          const int64_t seg = o + u * q.nq, first = std::min(key - q.t0, q.nq), f = seg + first;
          zero_row(w.pt + seg, first);
          zero_row(w.ds + seg, first);
          span_grad(w.s + f, w.dp + f, w.pt + f, w.ds + f, q.nq - first, c,
                    w.stat0 + u * q.nq + first, w.stat1 + u * q.nq + first);
        }
      }
      if (k0 == 0 && alone(q.t0))  // the first token of every head sees key 0 alone: its dS is 0
        for (int64_t u = 0; u < tl.heads; ++u) zero_row(w.ds + u * q.nq, 1);
      // dv_acc += Pᵀ [nk, R] · dot [R, Dv];  dk_acc += dSᵀ [nk, R] · qt [R, Dqk];  one pass:
      // dq_sum [R, Dqk] += dS [R, nk] · K_j (per key block)
      key_blocks(q, k0, nk, [&](const KeyBlock& bl) {
        const int64_t e = bl.k0 * R + bl.c0;
        matmul(product(bl.m, p.Dv, bl.nc, p.dtype, w.pt + e, R, 1, w.dot + bl.c0 * p.Dv, p.Dv, 1,
                       dv_acc + bl.k0 * p.Dv, p.Dv, true));
        matmul(product(bl.m, p.Dqk, bl.nc, p.dtype, w.ds + e, R, 1, w.qt + bl.c0 * p.Dqk, p.Dqk, 1,
                       dk_acc + bl.k0 * p.Dqk, p.Dqk, true));
        if (dq_sum)
          matmul(product(bl.nc, p.Dqk, bl.m, p.dtype, w.ds + e, 1, R, kv.k + bl.k0 * p.Dqk, p.Dqk,
                         1, dq_sum + (i * tl.rows + bl.c0) * p.Dqk, p.Dqk, true));
      });
    }
    for (int64_t kk = 0; kk < nk && partial; ++kk) {
      float* row = partial + (k0 + kk) * (p.Dqk + p.Dv);
      std::copy_n(dk_acc + kk * p.Dqk, p.Dqk, row);
      std::copy_n(dv_acc + kk * p.Dv, p.Dv, row + p.Dqk);
    }
    for (int64_t kk = 0; kk < nk && !partial; ++kk) {
      if (bp.grads_f32) {
        scale_row(dk_acc + kk * p.Dqk, at<float>(bp.dk, bp.dk_stride, k0 + kk, b, hk), p.Dqk,
                  p.scale);
        scale_row(dv_acc + kk * p.Dv, at<float>(bp.dv, bp.dv_stride, k0 + kk, b, hk), p.Dv, 1.0f);
      } else {
        scale_row(dk_acc + kk * p.Dqk, at<T>(bp.dk, bp.dk_stride, k0 + kk, b, hk), p.Dqk, p.scale);
        scale_row(dv_acc + kk * p.Dv, at<T>(bp.dv, bp.dv_stride, k0 + kk, b, hk), p.Dv, 1.0f);
      }
    }
  }

  // The one pass, sub-group sub of head group (b, hk): every key tile in order, then dq = scale ·
  // dq_sum of each row. partial: where the sub-group's dk, dv sums go when the group is split.
  void group_task(const AttentionBwdParams& bp, int64_t b, int64_t hk, int64_t sub,
                  const Slot<T>& w, float* dq_sum, float* partial, const float* lse,
                  const float* delta) const {
    std::fill(dq_sum, dq_sum + tl.nqb * tl.rows * p.Dqk, 0.0f);
    for (int64_t j = 0; j < tl.nkb; ++j)
      key_task(bp, b, hk, sub, j, w, lse, delta, dq_sum, partial);
    for (int64_t i = 0; i < tl.nqb; ++i) {
      const QTile q = q_tile(b, hk, sub, i);
      write_dq(bp, q, dq_sum + i * tl.rows * p.Dqk);
    }
  }

  // A split group's dk = scale · Σ_sub partial, dv = Σ_sub partial, summed in sub-group order into
  // the first partial. partials: [B · Hkv, split, T, Dqk + Dv].
  void reduce_partials(const AttentionBwdParams& bp, float* partials) const {
    const int64_t width = p.Dqk + p.Dv, per_sub = p.T * width;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < p.B * p.Hkv * p.T; ++r) {
      const int64_t t = r % p.T, group = r / p.T, b = group / p.Hkv, hk = group % p.Hkv;
      float* sum = partials + group * tl.split * per_sub + t * width;
      for (int64_t sub = 1; sub < tl.split; ++sub)
        for (int64_t e = 0; e < width; ++e) sum[e] += sum[sub * per_sub + e];
      if (bp.grads_f32) {
        scale_row(sum, at<float>(bp.dk, bp.dk_stride, t, b, hk), p.Dqk, p.scale);
        scale_row(sum + p.Dqk, at<float>(bp.dv, bp.dv_stride, t, b, hk), p.Dv, 1.0f);
      } else {
        scale_row(sum, at<T>(bp.dk, bp.dk_stride, t, b, hk), p.Dqk, p.scale);
        scale_row(sum + p.Dqk, at<T>(bp.dv, bp.dv_stride, t, b, hk), p.Dv, 1.0f);
      }
    }
  }

  // dq of tile q's rows = scale · acc [rows, Dqk].
  void write_dq(const AttentionBwdParams& bp, const QTile& q, const float* acc) const {
    for (int64_t r = 0; r < q.rows; ++r) {
      if (bp.grads_f32)
        scale_row(acc + r * p.Dqk, at<float>(bp.dq, bp.dq_stride, token(q, r), q.b, head(q, r)),
                  p.Dqk, p.scale);
      else
        scale_row(acc + r * p.Dqk, at<T>(bp.dq, bp.dq_stride, token(q, r), q.b, head(q, r)), p.Dqk,
                  p.scale);
    }
  }

  // Pass B, query tile (b, hk, i): dq of its rows, dQ = scale · Σ_j dS_j K_j.
  void query_task(const AttentionBwdParams& bp, const QTile& q, const Slot<T>& w, const float* lse,
                  const float* delta) const {
    pack_grad_rows(bp, q, w, lse, delta);
    float* dq_acc = w.acc;  // [rows, Dqk]
    std::fill(dq_acc, dq_acc + q.rows * p.Dqk, 0.0f);
    const int64_t kend = p.causal ? q.t0 + q.nq : p.T;
    for (int64_t k0 = 0; k0 < kend; k0 += tl.bk) {
      const int64_t nk = tile_keys(k0, tl.bk, p.T, kend);
      const KvTile kv = kv_tile(k0, nk, q.b, q.hk, w);
      prefetch_next_kv(k0, kend, q.b, q.hk);
      // s [rows, nk] = qt · K_jᵀ;  dp [rows, nk] = dot · V_jᵀ (per row block, as in the forward)
      row_blocks(q, k0, nk, [&](const RowBlock& bl) {
        matmul(product(bl.m, bl.nk, p.Dqk, p.dtype, w.qt + bl.r0 * p.Dqk, p.Dqk, 1, kv.k, 1, p.Dqk,
                       w.s + bl.r0 * nk, nk, false));
        matmul(product(bl.m, bl.nk, p.Dv, p.dtype, w.dot + bl.r0 * p.Dv, p.Dv, 1, kv.v, 1, p.Dv,
                       w.dp + bl.r0 * nk, nk, false));
      });
      for (int64_t r = 0; r < q.rows && k0 == 0; ++r)
        if (in_first_tile(token(q, r), nk))
          w.stat1[r] = tile_delta_row(w.s + r * nk, w.dp + r * nk, token(q, r) + 1, c, w.stat0[r]);
      for (int64_t r = 0; r < q.rows; ++r)
        row_grad(w.s + r * nk, w.dp + r * nk, w.ds + r * nk,
                 alone(token(q, r)) ? 0 : visible(p.causal, token(q, r), k0, nk), nk, c, w.stat0[r],
                 w.stat1[r]);
      // dq_acc [rows, Dqk] += dS [rows, nk] · K_j (per row block: dS is 0 past the block's nk)
      row_blocks(q, k0, nk, [&](const RowBlock& bl) {
        matmul(product(bl.m, p.Dqk, bl.nk, p.dtype, w.ds + bl.r0 * nk, nk, 1, kv.k, p.Dqk, 1,
                       dq_acc + bl.r0 * p.Dqk, p.Dqk, true));
      });
    }
    write_dq(bp, q, dq_acc);
  }
};

// The workspace tensors of one call, in the order of its memory plan; slot(i) is thread i's share.
template <class T>
struct Workspace {
  static constexpr bool low = !std::is_same_v<T, float>;
  const AttentionFwdParams& p;
  const FusedTiles& tl;
  bool backward;
  Tensor q_tile, do_tile, kv_tile, s_tile, dp_tile, p_tile, ds_tile, stats, acc, dq_sum,
      dkv_partial;

  Workspace(MemoryPlanWalker& plan, const AttentionFwdParams& params, const FusedTiles& tiles,
            bool bwd)
      : p(params), tl(tiles), backward(bwd) {
    // [slots, U · rows, Dqk] (U: forward bundle)
    q_tile = plan.allocate("attn.q_tile");
    if (backward) do_tile = plan.allocate("attn.do_tile");           // [slots, rows, Dv]
    kv_tile = plan.allocate("attn.kv_tile");                         // [slots, bk, Dqk + Dv]
    s_tile = plan.allocate("attn.s_tile");                           // [slots, rows, bk] fp32
    if (backward) dp_tile = plan.allocate("attn.dp_tile");           // [slots, rows, bk] fp32
    if (low) p_tile = plan.allocate("attn.p_tile");                  // [slots, rows, bk] bf16
    if (low && backward) ds_tile = plan.allocate("attn.ds_tile");    // [slots, rows, bk] bf16
    stats = plan.allocate("attn.row_stats");                         // [slots, U · 2 · rows] fp32
    acc = plan.allocate(backward ? "attn.grad_acc" : "attn.o_acc");  // [slots, ...] fp32
    // [slots, nqb · rows, Dqk] fp32
    if (backward && tl.one_pass) dq_sum = plan.allocate("attn.dq_sum");
    // [B·Hkv, split, T, Dqk+Dv] fp32
    if (backward && tl.split > 1) dkv_partial = plan.allocate("attn.dkv_partial");
  }
  void release(MemoryPlanWalker& plan) {
    if (backward && tl.split > 1) plan.release("attn.dkv_partial", dkv_partial);
    if (backward && tl.one_pass) plan.release("attn.dq_sum", dq_sum);
    plan.release(backward ? "attn.grad_acc" : "attn.o_acc", acc);
    plan.release("attn.row_stats", stats);
    if (low && backward) plan.release("attn.ds_tile", ds_tile);
    if (low) plan.release("attn.p_tile", p_tile);
    if (backward) plan.release("attn.dp_tile", dp_tile);
    plan.release("attn.s_tile", s_tile);
    plan.release("attn.kv_tile", kv_tile);
    if (backward) plan.release("attn.do_tile", do_tile);
    plan.release("attn.q_tile", q_tile);
  }
  // Thread i's tiles; u: the member of a forward bundle, with q, row statistics and o sums of its
  // own.
  Slot<T> slot(int64_t i, int64_t u = 0) const {
    const int64_t tile = tl.rows * tl.bk, U = backward ? 1 : tl.bundle;
    Slot<T> w{};
    w.qt = q_tile.data<T>() + (i * U + u) * tl.rows * p.Dqk;
    w.dot = backward ? do_tile.data<T>() + i * tl.rows * p.Dv : nullptr;
    w.kt = kv_tile.data<T>() + i * tl.bk * (p.Dqk + p.Dv);
    w.vt = w.kt + tl.bk * p.Dqk;
    w.s = s_tile.data<float>() + i * tile;
    w.dp = backward ? dp_tile.data<float>() + i * tile : nullptr;
    w.pt = low ? p_tile.data<T>() + i * tile : reinterpret_cast<T*>(w.s);
    w.ds = !backward ? nullptr : low ? ds_tile.data<T>() + i * tile : reinterpret_cast<T*>(w.dp);
    w.stat0 = stats.data<float>() + (i * U + u) * 2 * tl.rows;
    w.stat1 = w.stat0 + tl.rows;
    w.acc = acc.data<float>() + i * (acc.numel() / acc.dim(0)) + u * tl.rows * p.Dv;
    return w;
  }
  float* dq_sum_of(int64_t i) const {
    return dq_sum.data<float>() + i * (dq_sum.numel() / dq_sum.dim(0));
  }
};

template <class T>
AttentionSaved forward(const AttentionFwdParams& p) {
  MemoryPlanWalker plan(attention_memory_events(laga::Kernel::fused, p, false));
  const FusedKernel<T> k{p, fused_tiles(p, false), p.scale * kLog2e};
  const FusedTiles& tl = k.tl;
  AttentionSaved saved;
  saved.lse = plan.allocate("attn.lse");  // [B, Hq, T] fp32
  Workspace<T> ws(plan, p, tl, false);
  const int64_t groups = p.B * p.Hkv;
  float* lse = saved.lse.data<float>();
  const int64_t bundles = (tl.nqb + tl.bundle - 1) / tl.bundle;
  parallel_tasks(groups * bundles, tl.slots, [&](int64_t slot, int64_t task) {
    // head-major, longest (last) tiles first: bundle u of head g holds tiles nqb−1−U·u, nqb−2−U·u,
    // ...
    const int64_t g = task / bundles, first = tl.nqb - 1 - tl.bundle * (task % bundles);
    const int64_t n = std::min(tl.bundle, first + 1);
    typename FusedKernel<T>::QTile qs[kFwdBundle];
    Slot<T> w[kFwdBundle];
    for (int64_t u = 0; u < n; ++u)
      qs[u] = k.q_tile(g / p.Hkv, g % p.Hkv, 0, first - u), w[u] = ws.slot(slot, u);
    k.forward_task(qs, n, w, lse);
  });
  ws.release(plan);
  plan.finish();
  return saved;
}

template <class T>
void backward(const AttentionBwdParams& p, const AttentionSaved& saved) {
  MemoryPlanWalker plan(attention_memory_events(laga::Kernel::fused, p, true));
  const FusedKernel<T> k{p, fused_tiles(p, true), p.scale * kLog2e};
  const FusedTiles& tl = k.tl;
  // [B, Hq, T] fp32, rowsum(dO∘O) (the first key tile's rows: its own)
  Tensor delta = plan.allocate("attn.delta");
  float* d = delta.data<float>();
  const int64_t rows = p.B * p.Hq * p.T;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % p.T, h = (r / p.T) % p.Hq, b = r / (p.T * p.Hq);
    d[r] = p.o_f32 ? dot_row_f64(at<T>(p.dout, p.dout_stride, t, b, h),
                                 at<float>(p.o, p.o_stride, t, b, h), p.Dv)
                   : dot_row_f64(at<T>(p.dout, p.dout_stride, t, b, h),
                                 at<T>(p.o, p.o_stride, t, b, h), p.Dv);
  }
  Workspace<T> ws(plan, p, tl, true);
  const int64_t groups = p.B * p.Hkv;
  const float* lse = saved.lse.data<float>();
  if (tl.one_pass) {
    float* partials = tl.split > 1 ? ws.dkv_partial.template data<float>() : nullptr;
    parallel_tasks(groups * tl.split, tl.slots, [&](int64_t slot, int64_t task) {
      const int64_t group = task / tl.split, sub = task % tl.split;
      k.group_task(p, group / p.Hkv, group % p.Hkv, sub, ws.slot(slot), ws.dq_sum_of(slot),
                   partials ? partials + task * p.T * (p.Dqk + p.Dv) : nullptr, lse, d);
    });
    if (partials) k.reduce_partials(p, partials);
  } else {
    parallel_tasks(groups * tl.nkb, tl.slots, [&](int64_t slot, int64_t task) {
      // head-major, longest (first) key tiles first
      const int64_t g = task / tl.nkb, j = task % tl.nkb;
      k.key_task(p, g / p.Hkv, g % p.Hkv, 0, j, ws.slot(slot), lse, d);
    });
    parallel_tasks(groups * tl.nqb, tl.slots, [&](int64_t slot, int64_t task) {
      const int64_t g = task / tl.nqb, i = tl.nqb - 1 - task % tl.nqb;
      k.query_task(p, k.q_tile(g / p.Hkv, g % p.Hkv, 0, i), ws.slot(slot), lse, d);
    });
  }
  ws.release(plan);
  plan.release("attn.delta", delta);
  plan.finish();
}

}  // namespace

AttentionSaved fused_forward(const AttentionFwdParams& p) {
  return dispatch_dtype(
      p.dtype, [&](auto* tag) { return forward<std::remove_pointer_t<decltype(tag)>>(p); });
}

void fused_backward(const AttentionBwdParams& p, const AttentionSaved& saved) {
  dispatch_dtype(p.dtype,
                 [&](auto* tag) { backward<std::remove_pointer_t<decltype(tag)>>(p, saved); });
}

}  // namespace laga::attn
