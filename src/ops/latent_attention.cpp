// The latent attention kernel (include/laga/ops/latent_attention.hpp): attention whose K and V are
// up-projected from the latent one key tile at a time, inside the kernel.
//
// Forward, for each key tile j in order (two parallel regions per tile):
//   up    task (b, h):           K_j, V_j of head (b, h) into the tile buffers (storage dtype)
//   fold  task (b, h, i ≥ j):    the online-softmax update of query tile i's rows with K_j, V_j:
//                                running max m, sum l and o_sum (fp32, whole sequence) of those
//                                rows
// then  task (b, h, i):          o = o_sum / l, lse = (m + log2 l)·ln 2.
// Backward (FlashAttention-2's dK/dV loop, delta = rowsum(dO∘O) in fp64, or the first key tile's
// ΣP∘dP / ΣP for the tokens it holds whole; docs/attention.md §2), for each key tile j in order:
//   up    task (b, h):           K_j, V_j again (the recomputed up-projection)
//   grad  task (b, h):           over the query tiles that see tile j: dV_j += Pᵀ dO, dK_j += dSᵀ Q
//                                and dq_sum rows += dS K_j (fp32); dK_j, dV_j rounded to the
//                                storage dtype into the tile's [dk_nope | dv] and dkpe buffers
//   latent task (b, col block):  dlatent rows of tile j = [dk_nope | dv]·W (+ Σ_h dkpe), rounded
//          once task (h, col block):  dwkv_sum rows of head h += [dk_nope | dv]ᵀ·ckv_j (fp32)
// then dwkv += dwkv_sum, rounded once; dq = scale·dq_sum (latent_attention_dq, once the caller has
// released what it no longer needs, so dq and the inputs are never live beside dq_sum together).
// Each task writes what no other task of its region writes, each sum runs in the fixed order of the
// key tiles, and every product runs single-threaded in its task: bitwise the same for any thread
// count. Row operations (online softmax, the gradient of the probabilities) are
// attention_internal.hpp's, the same arithmetic as the fused kernel's.
#include "laga/ops/latent_attention.hpp"

#include <omp.h>

#include <map>

#include "attention_internal.hpp"
#include "laga/core/work.hpp"
#include "laga/core/memory.hpp"
#include "laga/ops/matmul.hpp"

namespace laga {

namespace {

using attn::parallel_tasks;

// default tokens per query tile, keys per key tile
constexpr int64_t kLatentRows = 256, kLatentKeys = 256;
constexpr int64_t kColBlock = 128;  // dlatent / dwkv columns per task

struct LatentTiles {
  int64_t bq = 1, bk = 1, nqb = 1, nkb = 1;
  int64_t slots = 1;  // per-thread workspaces = threads used at most
  int64_t ncb = 1;    // column blocks of Lkv
};

LatentTiles latent_tiles(const LatentAttentionParams& p, bool backward) {
  LatentTiles t;
  t.bq = std::min(p.T, p.query_tile > 0 ? p.query_tile : kLatentRows);
  t.bk = std::min(p.T, p.key_tile > 0 ? p.key_tile : kLatentKeys);
  t.nqb = (p.T + t.bq - 1) / t.bq;
  t.nkb = (p.T + t.bk - 1) / t.bk;
  // forward's fold region has at most B·H·nqb tasks, backward's grad region B·H
  t.slots = std::min(kAttentionMaxThreads, p.B * p.H * (backward ? 1 : t.nqb));
  t.ncb = (p.Lkv + kColBlock - 1) / kColBlock;
  return t;
}

// C [M, N] (=, or += when accumulate) = A [M, K] · B [K, N] by element strides; C of dtype c_dt.
MatmulParams product(int64_t M, int64_t N, int64_t K, DType ab, const void* a, int64_t a_m,
                     int64_t a_k, const void* b, int64_t b_k, int64_t b_n, void* c, int64_t c_m,
                     DType c_dt, bool accumulate) {
  MatmulParams mp;
  mp.M = M, mp.N = N, mp.K = K;
  mp.ab_dtype = ab, mp.c_dtype = c_dt;
  mp.a = a, mp.a_m_stride = a_m, mp.a_k_stride = a_k;
  mp.b = b, mp.b_k_stride = b_k, mp.b_n_stride = b_n;
  mp.c = c, mp.c_m_stride = c_m, mp.c_n_stride = 1;
  mp.accumulate = accumulate;
  return mp;
}

inline int64_t visible(int64_t t, int64_t k0, int64_t nk) {
  return std::clamp<int64_t>(t - k0 + 1, 0, nk);
}

// The kernel's allocations, walked from its event list (as the attention kernels do).
AttentionSaved meta_walk(const LatentAttentionParams& p, bool backward) {
  std::map<std::string, Tensor> live;
  for (const auto& e : latent_attention_memory_events(p, backward)) {
    if (e.release)
      live.erase(e.tag);
    else
      live[e.tag] = Tensor::empty(e.shape, e.dtype, e.tag);
  }
  AttentionSaved saved;
  // (backward: what it leaves allocated)
  saved.lse = live.at(backward ? "attn.dq_sum" : "attn.lse");
  return saved;
}

template <class T>
struct LatentKernel {
  static constexpr bool low = !std::is_same_v<T, float>;
  const LatentAttentionParams& p;
  LatentTiles tl;
  float c;  // scale · log2 e
  int64_t Dqk, Dl, W;

  LatentKernel(const LatentAttentionParams& params, bool backward)
      : p(params),
        tl(latent_tiles(params, backward)),
        c(params.scale * attn::kLog2e),
        Dqk(params.Dqk()),
        Dl(params.Dl()),
        W(params.Dn + params.Dv) {}

  int64_t tile_rows(int64_t j) const { return std::min(tl.bk, p.T - j * tl.bk); }
  int64_t first_query_tile(int64_t j) const { return j * tl.bk / tl.bq; }
  const T* latent_row(int64_t t, int64_t b) const {
    return static_cast<const T*>(p.latent) + (t * p.B + b) * Dl;
  }
  const T* q_row(int64_t t, int64_t b, int64_t h) const {
    return static_cast<const T*>(p.q) + ((t * p.B + b) * p.H + h) * Dqk;
  }
  int64_t stat_row(int64_t b, int64_t h, int64_t t) const { return (b * p.H + h) * p.T + t; }

  // K_j [nk, Dqk] = [ckv_j·W_UKᵀ | kpe_j] and V_j [nk, Dv] = ckv_j·W_UVᵀ of head (b, h), rounded
  // once.
  void up_project(int64_t j, int64_t b, int64_t h, T* kt, T* vt) const {
    const int64_t k0 = j * tl.bk, nk = tile_rows(j);
    const T* ckv = latent_row(k0, b);
    const T* wk = static_cast<const T*>(p.wkv) + h * W * p.Lkv;
    const T* wv = wk + p.Dn * p.Lkv;
    matmul(
        product(nk, p.Dn, p.Lkv, p.dtype, ckv, p.B * Dl, 1, wk, 1, p.Lkv, kt, Dqk, p.dtype, false));
    matmul(product(nk, p.Dv, p.Lkv, p.dtype, ckv, p.B * Dl, 1, wv, 1, p.Lkv, vt, p.Dv, p.dtype,
                   false));
    for (int64_t r = 0; r < nk; ++r)
      std::memcpy(kt + r * Dqk + p.Dn, latent_row(k0 + r, b) + p.Lkv, size_t(p.Dr) * sizeof(T));
  }
  // The tile buffers of head (b, h): [B, H, bk, ·].
  T* k_of(const Tensor& k_tile, int64_t b, int64_t h) const {
    return k_tile.data<T>() + (b * p.H + h) * tl.bk * Dqk;
  }
  T* v_of(const Tensor& v_tile, int64_t b, int64_t h) const {
    return v_tile.data<T>() + (b * p.H + h) * tl.bk * p.Dv;
  }
  void up_project_tile(int64_t j, const Tensor& k_tile, const Tensor& v_tile) const {
    parallel_tasks(p.B * p.H, kAttentionMaxThreads, [&](int64_t, int64_t task) {
      const int64_t b = task / p.H, h = task % p.H;
      up_project(j, b, h, k_of(k_tile, b, h), v_of(v_tile, b, h));
    });
  }

  // ---- forward ----------------------------------------------------------------------------------
  struct FwdSlot {
    T* qt;     // [bq, Dqk]
    float* s;  // [bq, bk]
    T* pt;     // [bq, bk] (aliases s when fp32)
  };
  // Query tile i's rows of head (b, h) folded with key tile j: fused_forward's update, one head.
  void fold(int64_t j, int64_t b, int64_t h, int64_t i, const FwdSlot& w, const T* kt, const T* vt,
            float* m, float* l, float* osum) const {
    const int64_t t0 = i * tl.bq, nq = std::min(tl.bq, p.T - t0), k0 = j * tl.bk;
    const int64_t nk = attn::tile_keys(k0, tl.bk, p.T, t0 + nq);
    attn::pack_rows(w.qt, q_row(t0, b, h), nq, p.B * p.H * Dqk, Dqk);
    // s [nq, nk] = qt · K_jᵀ
    matmul(product(nq, nk, Dqk, p.dtype, w.qt, Dqk, 1, kt, 1, Dqk, w.s, nk, DType::f32, false));
    const int64_t row0 = stat_row(b, h, t0);
    float* acc0 = osum + row0 * p.Dv;
    for (int64_t r = 0; r < nq; ++r) {
      const int64_t n = visible(t0 + r, k0, nk);
      float* sr = w.s + r * nk;
      T* pr = w.pt + r * nk;
      if (n == 0) {
        attn::zero_row(pr, nk);
        continue;
      }
      float &mr = m[row0 + r], &lr = l[row0 + r];
      const float m_new = std::max(mr, attn::row_max(sr, n) * c);
      const float alpha = std::exp2(mr - m_new);
      lr = lr * alpha + attn::row_exp2(sr, pr, n, nk, c, m_new);
      mr = m_new;
      if (alpha != 1.0f)
        for (float *a = acc0 + r * p.Dv, *e = a + p.Dv; a < e; ++a) *a *= alpha;
    }
    // o_sum rows [nq, Dv] += P [nq, nk] · V_j
    matmul(product(nq, p.Dv, nk, p.dtype, w.pt, nk, 1, vt, p.Dv, 1, acc0, p.Dv, DType::f32, true));
  }

  AttentionSaved forward() const {
    attn::MemoryPlanWalker plan(latent_attention_memory_events(p, false));
    AttentionSaved saved;
    saved.lse = plan.allocate("attn.lse");               // [B, H, T] fp32
    Tensor osum = plan.allocate("attn.o_sum");           // [B, H, T, Dv] fp32
    Tensor stats = plan.allocate("attn.softmax_stats");  // [2, B, H, T] fp32: m, l
    Tensor k_tile = plan.allocate("attn.k_tile");        // [B, H, bk, Dqk]
    Tensor v_tile = plan.allocate("attn.v_tile");        // [B, H, bk, Dv]
    Tensor q_tile = plan.allocate("attn.q_tile");        // [slots, bq, Dqk]
    Tensor s_tile = plan.allocate("attn.s_tile");        // [slots, bq, bk] fp32
    Tensor p_tile;
    if (low) p_tile = plan.allocate("attn.p_tile");  // [slots, bq, bk]
    const int64_t rows = p.B * p.H * p.T;
    float *o_sum = osum.data<float>(), *m = stats.data<float>(), *l = m + rows,
          *lse = saved.lse.data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      m[r] = -INFINITY, l[r] = 0.0f;
      std::fill(o_sum + r * p.Dv, o_sum + (r + 1) * p.Dv, 0.0f);
    }
    auto slot = [&](int64_t i) {
      FwdSlot w;
      w.qt = q_tile.data<T>() + i * tl.bq * Dqk;
      w.s = s_tile.data<float>() + i * tl.bq * tl.bk;
      w.pt = low ? p_tile.data<T>() + i * tl.bq * tl.bk : reinterpret_cast<T*>(w.s);
      return w;
    };
    const int64_t heads = p.B * p.H;
    for (int64_t j = 0; j < tl.nkb; ++j) {
      up_project_tile(j, k_tile, v_tile);
      const int64_t i0 = first_query_tile(j), nq = tl.nqb - i0;
      parallel_tasks(heads * nq, tl.slots, [&](int64_t s, int64_t task) {
        const int64_t i = tl.nqb - 1 - task / heads, bh = task % heads, b = bh / p.H, h = bh % p.H;
        fold(j, b, h, i, slot(s), k_of(k_tile, b, h), v_of(v_tile, b, h), m, l, o_sum);
      });
    }
    parallel_tasks(heads * tl.nqb, tl.slots, [&](int64_t, int64_t task) {
      const int64_t i = task / heads, bh = task % heads, b = bh / p.H, h = bh % p.H;
      const int64_t t0 = i * tl.bq, nq = std::min(tl.bq, p.T - t0);
      for (int64_t r = 0; r < nq; ++r) {
        const int64_t row = stat_row(b, h, t0 + r);
        T* o = static_cast<T*>(p.o) + (((t0 + r) * p.B + b) * p.H + h) * p.Dv;
        attn::scale_row(o_sum + row * p.Dv, o, p.Dv, 1.0f / l[row]);
        lse[row] = (m[row] + std::log2(l[row])) * attn::kLn2;
      }
    });
    if (low) plan.release("attn.p_tile", p_tile);
    plan.release("attn.s_tile", s_tile);
    plan.release("attn.q_tile", q_tile);
    plan.release("attn.v_tile", v_tile);
    plan.release("attn.k_tile", k_tile);
    plan.release("attn.softmax_stats", stats);
    plan.release("attn.o_sum", osum);
    plan.finish();
    return saved;
  }

  // ---- backward ---------------------------------------------------------------------------------
  struct BwdSlot {
    T *qt, *dot;          // [bq, Dqk], [bq, Dv]
    float *s, *dp;        // [bk, bq] Sᵀ, dPᵀ
    T *pt, *ds;           // [bk, bq] (alias s and dp when fp32)
    float *lse2, *delta;  // [bq]
    float* acc;           // [bk, Dqk + Dv]: dK_j, dV_j
  };

  // Key tile j against every query tile that sees it, head (b, h): dK_j, dV_j, and dq_sum's rows.
  void grad(const LatentAttentionBwdParams& bp, int64_t j, int64_t b, int64_t h, const BwdSlot& w,
            const T* kt, const T* vt, const float* lse, const float* delta, float* dq_sum, T* dkv,
            T* dkpe) const {
    const int64_t k0 = j * tl.bk, nk = tile_rows(j);
    float *dk_acc = w.acc, *dv_acc = w.acc + nk * Dqk;
    std::fill(w.acc, w.acc + nk * (Dqk + p.Dv), 0.0f);
    for (int64_t i = first_query_tile(j); i < tl.nqb; ++i) {
      const int64_t t0 = i * tl.bq, R = std::min(tl.bq, p.T - t0), row0 = stat_row(b, h, t0);
      attn::pack_rows(w.qt, q_row(t0, b, h), R, p.B * p.H * Dqk, Dqk);
      attn::pack_rows(w.dot, static_cast<const T*>(bp.dout) + ((t0 * p.B + b) * p.H + h) * p.Dv, R,
                      p.B * p.H * p.Dv, p.Dv);
      for (int64_t r = 0; r < R; ++r)
        w.lse2[r] = lse[row0 + r] * attn::kLog2e, w.delta[r] = delta[row0 + r];
      // st [nk, R] = K_j · qtᵀ;  dpt [nk, R] = V_j · dotᵀ
      matmul(product(nk, R, Dqk, p.dtype, kt, Dqk, 1, w.qt, 1, Dqk, w.s, R, DType::f32, false));
      matmul(
          product(nk, R, p.Dv, p.dtype, vt, p.Dv, 1, w.dot, 1, p.Dv, w.dp, R, DType::f32, false));
      // A token whose every key is in the first key tile takes delta = ΣP∘dP / ΣP of the tile, as
      // the fused kernel does (docs/attention.md §2).
      if (k0 == 0 && t0 < nk)
        attn::tile_delta_cols(w.s, w.dp, R, std::min(R, nk - t0), t0, c, w.lse2, w.delta);
      for (int64_t kk = 0; kk < nk; ++kk) {
        const int64_t key = k0 + kk, o = kk * R;
        // token t0 + r sees the key iff r ≥ key − t0
        const int64_t first = std::clamp<int64_t>(key - t0, 0, R);
        attn::zero_row(w.pt + o, first);
        attn::zero_row(w.ds + o, first);
        if (first < R)
          attn::span_grad(w.s + o + first, w.dp + o + first, w.pt + o + first, w.ds + o + first,
                          R - first, c, w.lse2 + first, w.delta + first);
      }
      // The first token sees key 0 alone: its dS is exactly 0, which p·(dp − delta) misses by the
      // residue of delta = dO·O summed in another order than dp (docs/attention.md §2).
      if (k0 == 0 && t0 == 0) attn::zero_row(w.ds, 1);
      // dv_acc += Pᵀ [nk, R] · dot;  dk_acc += dSᵀ [nk, R] · qt;  dq_sum rows [R, Dqk] += dS [R,
      // nk] · K_j
      matmul(product(nk, p.Dv, R, p.dtype, w.pt, R, 1, w.dot, p.Dv, 1, dv_acc, p.Dv, DType::f32,
                     true));
      matmul(product(nk, Dqk, R, p.dtype, w.ds, R, 1, w.qt, Dqk, 1, dk_acc, Dqk, DType::f32, true));
      matmul(product(R, Dqk, nk, p.dtype, w.ds, 1, R, kt, Dqk, 1, dq_sum + row0 * Dqk, Dqk,
                     DType::f32, true));
    }
    // dk = scale·dk_acc and dv rounded to the storage dtype: [dk_nope | dv] rows [nk, B, H, W],
    // dkpe [nk, B, H, Dr]
    for (int64_t kk = 0; kk < nk; ++kk) {
      T* kv = dkv + ((kk * p.B + b) * p.H + h) * W;
      attn::scale_row(dk_acc + kk * Dqk, kv, p.Dn, p.scale);
      attn::scale_row(dv_acc + kk * p.Dv, kv + p.Dn, p.Dv, 1.0f);
      attn::scale_row(dk_acc + kk * Dqk + p.Dn, dkpe + ((kk * p.B + b) * p.H + h) * p.Dr, p.Dr,
                      p.scale);
    }
  }

  template <class L>
  void dlatent_rows(const LatentAttentionBwdParams& bp, int64_t j, int64_t b, int64_t cb,
                    const T* dkv, const T* dkpe) const {
    const int64_t k0 = j * tl.bk, nk = tile_rows(j), col = cb * kColBlock,
                  nc = std::min(kColBlock, p.Lkv - col);
    L* dl = static_cast<L*>(bp.dlatent) + (k0 * p.B + b) * Dl;
    // dckv [nk, nc] = [dk_nope | dv] [nk, H·W] · W [H·W, nc], rounded once
    matmul(product(nk, nc, p.H * W, p.dtype, dkv + b * p.H * W, p.B * p.H * W, 1,
                   static_cast<const T*>(p.wkv) + col, p.Lkv, 1, dl + col, p.B * Dl,
                   bp.dlatent_dtype, false));
    if (cb != 0) return;
    // dkpe = Σ_h dk[..., Dn:], fp32 over the storage values, rounded once
    for (int64_t kk = 0; kk < nk; ++kk)
      for (int64_t d = 0; d < p.Dr; ++d) {
        float acc = 0.0f;
        for (int64_t h = 0; h < p.H; ++h)
          acc += to_float(dkpe[((kk * p.B + b) * p.H + h) * p.Dr + d]);
        dl[kk * p.B * Dl + p.Lkv + d] = from_float<L>(acc);
      }
  }

  void dwkv_rows(int64_t j, int64_t h, int64_t cb, const T* dkv, float* dw_sum) const {
    const int64_t k0 = j * tl.bk, nk = tile_rows(j), col = cb * kColBlock,
                  nc = std::min(kColBlock, p.Lkv - col);
    // dW rows of head h [W, nc] += [dk_nope | dv]ᵀ [W, nk·B] · ckv_j [nk·B, nc]
    matmul(product(W, nc, nk * p.B, p.dtype, dkv + h * W, 1, p.H * W, latent_row(k0, 0) + col, Dl,
                   1, dw_sum + h * W * p.Lkv + col, p.Lkv, DType::f32, true));
  }

  Tensor backward(const LatentAttentionBwdParams& bp, const AttentionSaved& saved) const {
    attn::MemoryPlanWalker plan(latent_attention_memory_events(p, true));
    Tensor delta_t = plan.allocate("attn.delta");     // [B, H, T] fp32
    Tensor dq_t = plan.allocate("attn.dq_sum");       // [B, H, T, Dqk] fp32
    Tensor dw_t = plan.allocate("attn.dwkv_sum");     // [H·W, Lkv] fp32
    Tensor k_tile = plan.allocate("attn.k_tile");     // [B, H, bk, Dqk]
    Tensor v_tile = plan.allocate("attn.v_tile");     // [B, H, bk, Dv]
    Tensor dkv_t = plan.allocate("attn.dkv_tile");    // [bk, B, H, W]
    Tensor dkpe_t = plan.allocate("attn.dkpe_tile");  // [bk, B, H, Dr]
    Tensor q_tile = plan.allocate("attn.q_tile");     // [slots, bq, Dqk]
    Tensor do_tile = plan.allocate("attn.do_tile");   // [slots, bq, Dv]
    Tensor s_tile = plan.allocate("attn.s_tile");     // [slots, bk, bq] fp32
    Tensor dp_tile = plan.allocate("attn.dp_tile");   // [slots, bk, bq] fp32
    Tensor p_tile, ds_tile;
    // [slots, bk, bq]
    if (low) p_tile = plan.allocate("attn.p_tile"), ds_tile = plan.allocate("attn.ds_tile");
    Tensor stats = plan.allocate("attn.row_stats");  // [slots, 2, bq] fp32
    Tensor acc = plan.allocate("attn.grad_acc");     // [slots, bk·(Dqk + Dv)] fp32
    const int64_t rows = p.B * p.H * p.T, heads = p.B * p.H;
    float *delta = delta_t.data<float>(), *dq_sum = dq_t.data<float>(),
          *dw_sum = dw_t.data<float>();
    const float* lse = saved.lse.data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = r % p.T, h = (r / p.T) % p.H, b = r / (p.T * p.H),
                    off = ((t * p.B + b) * p.H + h) * p.Dv;
      delta[r] = attn::dot_row_f64(static_cast<const T*>(bp.dout) + off,
                                   static_cast<const T*>(p.o) + off, p.Dv);
      std::fill(dq_sum + r * Dqk, dq_sum + (r + 1) * Dqk, 0.0f);
    }
    std::fill(dw_sum, dw_sum + dw_t.numel(), 0.0f);
    const int64_t tile = tl.bk * tl.bq;
    auto slot = [&](int64_t i) {
      BwdSlot w;
      w.qt = q_tile.data<T>() + i * tl.bq * Dqk;
      w.dot = do_tile.data<T>() + i * tl.bq * p.Dv;
      w.s = s_tile.data<float>() + i * tile;
      w.dp = dp_tile.data<float>() + i * tile;
      w.pt = low ? p_tile.data<T>() + i * tile : reinterpret_cast<T*>(w.s);
      w.ds = low ? ds_tile.data<T>() + i * tile : reinterpret_cast<T*>(w.dp);
      w.lse2 = stats.data<float>() + i * 2 * tl.bq;
      w.delta = w.lse2 + tl.bq;
      w.acc = acc.data<float>() + i * tl.bk * (Dqk + p.Dv);
      return w;
    };
    T *dkv = dkv_t.data<T>(), *dkpe = dkpe_t.data<T>();
    for (int64_t j = 0; j < tl.nkb; ++j) {
      up_project_tile(j, k_tile, v_tile);
      parallel_tasks(heads, tl.slots, [&](int64_t s, int64_t task) {
        const int64_t b = task / p.H, h = task % p.H;
        grad(bp, j, b, h, slot(s), k_of(k_tile, b, h), v_of(v_tile, b, h), lse, delta, dq_sum, dkv,
             dkpe);
      });
      const int64_t lat_tasks = p.B * tl.ncb;
      parallel_tasks(lat_tasks + p.H * tl.ncb, kAttentionMaxThreads, [&](int64_t, int64_t task) {
        if (task < lat_tasks) {
          dispatch_dtype(bp.dlatent_dtype, [&](auto* tag) {
            dlatent_rows<std::remove_pointer_t<decltype(tag)>>(bp, j, task / tl.ncb, task % tl.ncb,
                                                               dkv, dkpe);
          });
        } else {
          dwkv_rows(j, (task - lat_tasks) / tl.ncb, (task - lat_tasks) % tl.ncb, dkv, dw_sum);
        }
      });
    }
    dispatch_dtype(bp.dwkv_dtype, [&](auto* tag) {  // dwkv += dwkv_sum, rounded once
      using G = std::remove_pointer_t<decltype(tag)>;
      G* g = static_cast<G*>(bp.dwkv);
      const int64_t n = dw_t.numel();
#pragma omp parallel for schedule(static)
      for (int64_t e = 0; e < n; ++e) g[e] = from_float<G>(to_float(g[e]) + dw_sum[e]);
    });
    plan.release("attn.grad_acc", acc);
    plan.release("attn.row_stats", stats);
    if (low) plan.release("attn.ds_tile", ds_tile), plan.release("attn.p_tile", p_tile);
    plan.release("attn.dp_tile", dp_tile);
    plan.release("attn.s_tile", s_tile);
    plan.release("attn.do_tile", do_tile);
    plan.release("attn.q_tile", q_tile);
    plan.release("attn.dkpe_tile", dkpe_t);
    plan.release("attn.dkv_tile", dkv_t);
    plan.release("attn.v_tile", v_tile);
    plan.release("attn.k_tile", k_tile);
    plan.release("attn.dwkv_sum", dw_t);
    plan.release("attn.delta", delta_t);
    plan.finish();
    return dq_t;
  }
};

}  // namespace

void check_latent_attention_params(const LatentAttentionParams& p) {
  LAGA_CHECK(p.B >= 1 && p.T >= 1 && p.H >= 1,
             "latent attention needs B, T, H ≥ 1; got B {}, T {}, H {}", p.B, p.T, p.H);
  LAGA_CHECK(
      p.Lkv >= 1 && p.Dr >= 0 && p.Dn >= 0 && p.Dn + p.Dr >= 1 && p.Dv >= 1,
      "latent attention needs Lkv ≥ 1, Dv ≥ 1 and Dn + Dr ≥ 1; got Lkv {}, Dr {}, Dn {}, Dv {}",
      p.Lkv, p.Dr, p.Dn, p.Dv);
  LAGA_CHECK(std::isfinite(p.scale) && p.scale > 0,
             "latent attention scale {} must be finite and > 0 (e.g. "
             "1/sqrt(Dqk))",
             p.scale);
  LAGA_CHECK(p.query_tile >= 0 && p.key_tile >= 0,
             "latent attention tiles must be ≥ 0 (0: the kernel's own); got "
             "query_tile {}, key_tile {}",
             p.query_tile, p.key_tile);
  LAGA_CHECK(p.latent && p.wkv && p.q && p.o,
             "latent attention forward needs latent, wkv, q and o; missing {}{}{}{}",
             p.latent ? "" : "latent ", p.wkv ? "" : "wkv ", p.q ? "" : "q ", p.o ? "" : "o");
}

void check_latent_attention_params(const LatentAttentionBwdParams& p) {
  check_latent_attention_params(static_cast<const LatentAttentionParams&>(p));
  LAGA_CHECK(p.dout && p.dlatent && p.dwkv,
             "latent attention backward needs dout, dlatent and dwkv; missing {}{}{}",
             p.dout ? "" : "dout ", p.dlatent ? "" : "dlatent ", p.dwkv ? "" : "dwkv");
  LAGA_CHECK(p.dlatent_dtype == p.dtype || p.dlatent_dtype == DType::f32,
             "latent attention's dlatent is {}; it is "
             "the storage dtype ({}) or fp32",
             dtype_name(p.dlatent_dtype), dtype_name(p.dtype));
}

namespace {
// The work ledger's record of one call (core/work.hpp): the attention's FLOPs (FlashAttention-3's
// convention) and the up-projection's products the kernel runs inside (forward once; backward
// three times: recomputed, then its dlatent and dwkv products), which its rate covers.
WorkRecord latent_work(const LatentAttentionParams& p, bool backward) {
  WorkRecord r;
  r.cls = backward ? WorkClass::attention_backward : WorkClass::attention_forward;
  r.op = "latent attention", r.dtype = p.dtype;
  r.flops = (backward ? 2.5 : 1.0) * attention_forward_flops(p.B, p.H, p.T, p.Dqk(), p.Dv, true) +
            (backward ? 3.0 : 1.0) * latent_up_projection_flops(p);
  r.dims[0] = p.T, r.dims[1] = p.H, r.dims[2] = p.H, r.dims[3] = p.Dqk(), r.dims[4] = p.Dv;
  r.kernel = AttentionKernel::latent;
  return r;
}
}  // namespace

AttentionSaved latent_attention_forward(const LatentAttentionParams& p) {
  check_latent_attention_params(p);
  WorkOp work(latent_work(p, false));
  if (meta_mode()) return meta_walk(p, false);
  return dispatch_dtype(p.dtype, [&](auto* tag) {
    return LatentKernel<std::remove_pointer_t<decltype(tag)>>(p, false).forward();
  });
}

Tensor latent_attention_backward(const LatentAttentionBwdParams& p, const AttentionSaved& saved) {
  check_latent_attention_params(p);
  check_shape(saved.lse, {p.B, p.H, p.T}, "saved.lse (latent attention)");
  check_dtype(saved.lse, DType::f32, "saved.lse (latent attention)");
  WorkOp work(latent_work(p, true));
  if (meta_mode()) return meta_walk(p, true).lse;
  return dispatch_dtype(p.dtype, [&](auto* tag) {
    return LatentKernel<std::remove_pointer_t<decltype(tag)>>(p, true).backward(p, saved);
  });
}

void latent_attention_dq(const LatentAttentionParams& p, Tensor& dq_sum, void* dq) {
  check_shape(dq_sum, {p.B, p.H, p.T, p.Dqk()}, "dq_sum (latent attention)");
  check_dtype(dq_sum, DType::f32, "dq_sum (latent attention)");
  LAGA_CHECK(dq, "latent attention's dq is missing");
  LAGA_ASSERT(dq_sum.tag() == "attn.dq_sum",
              "latent_attention_dq releases 'attn.dq_sum' but holds '{}'", dq_sum.tag());
  // dq_sum read (fp32), dq written, scaled and rounded
  WorkOp work(stream_work(WorkClass::accumulate, "convert", p.dtype,
                          double(dq_sum.nbytes() + dq_sum.numel() * dtype_size(p.dtype))));
  if (!meta_mode())
    dispatch_dtype(p.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      const float* s = dq_sum.data<float>();
      const int64_t rows = p.B * p.H * p.T, Dqk = p.Dqk();
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {  // [B, H, T] rows back to [T, B, H, Dqk]
        const int64_t t = r % p.T, h = (r / p.T) % p.H, b = r / (p.T * p.H);
        attn::scale_row(s + r * Dqk, static_cast<T*>(dq) + ((t * p.B + b) * p.H + h) * Dqk, Dqk,
                        p.scale);
      }
    });
  dq_sum = Tensor();
}

double latent_up_projection_flops(const LatentAttentionParams& p) {
  return 2.0 * double(p.T * p.B) * double(p.Lkv) * double(p.H) * double(p.Dn + p.Dv);
}

std::vector<AttentionMemoryEvent> latent_attention_memory_events(const LatentAttentionParams& p,
                                                                 bool backward) {
  const DType f32 = DType::f32, dt = p.dtype;
  const bool low = dt != DType::f32;
  const LatentTiles tl = latent_tiles(p, backward);
  const int64_t B = p.B, H = p.H, T = p.T, S = tl.slots, bq = tl.bq, bk = tl.bk, Dqk = p.Dqk(),
                W = p.Dn + p.Dv;
  std::vector<AttentionMemoryEvent> ev;
  auto alloc = [&](const char* tag, Shape s, DType t) {
    ev.push_back({false, tag, std::move(s), t});
  };
  size_t keep = 0;  // events [0, keep) stay allocated (forward's attn.lse)
  if (!backward) {
    alloc("attn.lse", {B, H, T}, f32);
    keep = 1;
    alloc("attn.o_sum", {B, H, T, p.Dv}, f32);
    alloc("attn.softmax_stats", {2, B, H, T}, f32);
    alloc("attn.k_tile", {B, H, bk, Dqk}, dt);
    alloc("attn.v_tile", {B, H, bk, p.Dv}, dt);
    alloc("attn.q_tile", {S, bq, Dqk}, dt);
    alloc("attn.s_tile", {S, bq, bk}, f32);
    if (low) alloc("attn.p_tile", {S, bq, bk}, dt);
  } else {
    alloc("attn.delta", {B, H, T}, f32);
    alloc("attn.dq_sum", {B, H, T, Dqk}, f32);
    alloc("attn.dwkv_sum", {H * W, p.Lkv}, f32);
    alloc("attn.k_tile", {B, H, bk, Dqk}, dt);
    alloc("attn.v_tile", {B, H, bk, p.Dv}, dt);
    alloc("attn.dkv_tile", {bk, B, H, W}, dt);
    alloc("attn.dkpe_tile", {bk, B, H, p.Dr}, dt);
    alloc("attn.q_tile", {S, bq, Dqk}, dt);
    alloc("attn.do_tile", {S, bq, p.Dv}, dt);
    alloc("attn.s_tile", {S, bk, bq}, f32);
    alloc("attn.dp_tile", {S, bk, bq}, f32);
    if (low) alloc("attn.p_tile", {S, bk, bq}, dt), alloc("attn.ds_tile", {S, bk, bq}, dt);
    alloc("attn.row_stats", {S, 2, bq}, f32);
    alloc("attn.grad_acc", {S, bk * (Dqk + p.Dv)}, f32);
  }
  // Released in reverse order of allocation (the kernels above release in this order); backward
  // keeps attn.dq_sum for latent_attention_dq.
  for (size_t i = ev.size(); i-- > keep;)
    if (ev[i].tag != "attn.dq_sum") ev.push_back({true, ev[i].tag, ev[i].shape, ev[i].dtype});
  return ev;
}

}  // namespace laga
