// Sparse latent attention (ops/sparse_attention.hpp): every query row (t, b) attends, with all H
// heads, to its own candidate key rows of one shared latent head: its selection (idx) or, without
// idx, every key row at a position ≤ its own. The math is the fused kernel's (docs/attention.md
// §2–§4) over a gathered key set instead of a causal range; docs/sparse.md states it for DSA.
//
// Forward, task (t, b), one query row: the candidates in chunks of kChunk key rows, gathered into
// dense tiles K [n, Dqk] and V [n, Dv]; S [H, n] = q_t · Kᵀ (the H heads share the keys: they are
// the product's M), an exp2 online softmax per head, acc [H, Dv] += P · V; o = acc / l and
// lse = (m + log2 l) · ln 2.
// Backward, one pass, task g of G = min(kAttentionMaxThreads, Tq) fixed row groups (rows t ≡ g mod
// G, ascending, each with every b): per row and chunk, Sᵀ [n, H] = K · q_tᵀ, dPᵀ = V · dO_tᵀ, Pᵀ
// and dSᵀ by span_grad, dq_t += dS · K (the task owns the row), and the row's contribution to its
// keys, scale · dSᵀ q_t + Pᵀ dO_t [n, Dqk], added to the group's own fp32 partial of dkv. dkv is
// the sum of the G partials in group order, rounded once. Every sum has one order fixed by the
// params, so results are bitwise independent of the thread count; no atomics. The price is G fp32
// partials of dkv ([G, Tk, B, Dqk], tag attn.dkv_partial) instead of a key-major second pass that
// recomputes S and dP (7 products per pair instead of 5). Not here: strided q, kv, o (the layout is
// dense, as the header says), fp32 o or fp32 partial gradients (the ring forms' modes of the dense
// kernel).
#include "laga/ops/sparse_attention.hpp"

#include <omp.h>

#include "laga/core/work.hpp"
#include "laga/ops/matmul.hpp"
#include "src/ops/attention_internal.hpp"

namespace laga {

namespace {

using attn::kLn2;
using attn::kLog2e;

// Key rows per gathered tile: the K and V tiles (fp32: 288 KiB and 256 KiB at 576/512) stay in a
// core's L2 cache beside S and the o sums.
constexpr int64_t kChunk = 128;

// Runs body(slot, task) for task in [0, tasks) on at most `slots` threads, every product on its
// calling thread alone (attention_fused.cpp's parallel_tasks).
template <class F>
void parallel_tasks(int64_t tasks, int64_t slots, F&& body) {
  const int nt = int(std::min<int64_t>(omp_get_max_threads(), slots));
#pragma omp parallel num_threads(nt)
  {
    omp_set_num_threads(1);
    const int64_t slot = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) body(slot, task);
  }
}

MatmulParams product(int64_t M, int64_t N, int64_t K, DType ab, const void* a, int64_t a_m,
                     int64_t a_k, const void* b, int64_t b_k, int64_t b_n, float* c, int64_t c_m,
                     bool accumulate, float alpha = 1.0f) {
  MatmulParams mp;
  mp.M = M, mp.N = N, mp.K = K;
  mp.ab_dtype = ab, mp.c_dtype = DType::f32;
  mp.a = a, mp.a_m_stride = a_m, mp.a_k_stride = a_k;
  mp.b = b, mp.b_k_stride = b_k, mp.b_n_stride = b_n;
  mp.c = c, mp.c_m_stride = c_m, mp.c_n_stride = 1;
  mp.alpha = alpha, mp.accumulate = accumulate;
  return mp;
}

// Candidates of query row (t, b): the selection's valid entries in idx order, or, without idx, key
// rows 0 .. min(q_pos0 + t, Tk − 1). list: [topk] scratch for the compacted selection.
struct Candidates {
  const int32_t* keys = nullptr;  // null: key i is row i
  int64_t n = 0;
  int64_t operator[](int64_t i) const { return keys ? keys[i] : i; }
};
Candidates candidates(const SparseAttentionParams& p, int64_t t, int64_t b, int32_t* list) {
  if (!p.idx) return {nullptr, std::min(p.q_pos0 + t + 1, p.Tk)};
  const int32_t* row = p.idx + (t * p.B + b) * p.topk;
  int64_t n = 0;
  for (int64_t j = 0; j < p.topk; ++j)
    if (row[j] >= 0) list[n++] = row[j];
  return {list, n};
}

// delta[h] = Σ_i P∘dP / Σ_i P over the n keys of transposed tiles st, dpt [n, H], P = 2^(c·s −
// lse2[h]) rebuilt as span_grad rebuilds it, summed in fp64 and rounded once (attn::tile_delta_row
// for a row of S).
void tile_delta(const float* st, const float* dpt, int64_t n, int64_t H, const float* lse2,
                float* delta, float c) {
  for (int64_t h = 0; h < H; ++h) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double pr = std::exp2(double(c * st[i * H + h] - lse2[h]));
      num += pr * double(dpt[i * H + h]), den += pr;
    }
    delta[h] = float(num / den);
  }
}

template <class T>
struct SparseKernel {
  static constexpr bool low = !std::is_same_v<T, float>;
  const SparseAttentionParams& p;
  float c;  // scale · log2 e

  const T* q_row(int64_t t, int64_t b) const {  // [H, Dqk]
    return static_cast<const T*>(p.q) + (t * p.B + b) * p.H * p.Dqk;
  }
  const T* kv_row(int64_t s, int64_t b) const {  // [Dqk]
    return static_cast<const T*>(p.kv) + (s * p.B + b) * p.Dqk;
  }
  // kt [n, Dqk] and, when vt, vt [n, Dv] = the candidates [c0, c0 + n) of one row.
  void gather(const Candidates& cand, int64_t c0, int64_t n, int64_t b, T* kt, T* vt) const {
    for (int64_t i = 0; i < n; ++i) {
      const T* src = kv_row(cand[c0 + i], b);
      std::memcpy(kt + i * p.Dqk, src, size_t(p.Dqk) * sizeof(T));
      if (vt) std::memcpy(vt + i * p.Dv, src, size_t(p.Dv) * sizeof(T));
    }
  }
};

// Checks shared by every entry point (the backward's version adds the gradients).
void check_common(const SparseAttentionParams& p) {
  LAGA_CHECK(p.B >= 1 && p.Tq >= 1 && p.Tk >= 1,
             "sparse attention needs B ≥ 1, Tq ≥ 1 and Tk ≥ 1; got B {}, Tq {}, Tk {}", p.B, p.Tq,
             p.Tk);
  LAGA_CHECK(p.H >= 1, "sparse attention needs H ≥ 1 query heads; got {}", p.H);
  LAGA_CHECK(p.Dqk >= 1 && p.Dv >= 1 && p.Dv <= p.Dqk,
             "sparse attention needs 1 ≤ Dv ≤ Dqk (V is the first Dv columns of kv); got Dqk {}, "
             "Dv {}",
             p.Dqk, p.Dv);
  LAGA_CHECK(p.q_pos0 >= 0, "sparse attention q_pos0 {} must be ≥ 0", p.q_pos0);
  LAGA_CHECK(p.idx || p.q_pos0 + p.Tq <= p.Tk,
             "sparse attention without idx attends to every key row ≤ q_pos0 + t: query rows "
             "[{}, {}) need Tk ≥ {}; got Tk {}",
             p.q_pos0, p.q_pos0 + p.Tq, p.q_pos0 + p.Tq, p.Tk);
  LAGA_CHECK(!p.idx || p.topk >= 1,
             "sparse attention with idx [Tq, B, topk] needs topk ≥ 1; got {}", p.topk);
  LAGA_CHECK(std::isfinite(p.scale) && p.scale > 0,
             "sparse attention scale {} must be finite and > 0 (e.g. 1/sqrt(Dqk))", p.scale);
  LAGA_CHECK(p.dtype == DType::f32 || p.dtype == DType::bf16,
             "sparse attention stores q, kv, o in fp32 or bf16; got {}", dtype_name(p.dtype));
  LAGA_CHECK(p.q && p.kv,
             "sparse attention needs q [Tq, B, H, Dqk] and kv [Tk, B, Dqk]; missing {}{}",
             p.q ? "" : "q ", p.kv ? "" : "kv");
}

// The work ledger's record: FLOPs by sparse_attention_forward_flops, dims {Tq, H, 1, Dqk, Dv}.
WorkRecord sparse_work(const SparseAttentionParams& p, bool backward) {
  WorkRecord r;
  r.cls = backward ? WorkClass::attention_backward : WorkClass::attention_forward;
  r.op = "attention", r.dtype = p.dtype;
  r.flops = (backward ? 2.5 : 1.0) * sparse_attention_forward_flops(p);
  r.dims[0] = p.Tq, r.dims[1] = p.H, r.dims[2] = 1, r.dims[3] = p.Dqk, r.dims[4] = p.Dv;
  r.kernel = AttentionKernel::sparse;
  return r;
}

// Selected (t, b) pairs of rows [t0, t1): Σ |S_t| · B.
double selected_pairs(const SparseAttentionParams& p, int64_t t0, int64_t t1) {
  double n = 0;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t seen = p.q_pos0 + t + 1;
    n += double(p.idx ? std::min(p.topk, seen) : seen);
  }
  return n * double(p.B);
}

// ---- forward ------------------------------------------------------------------------------------

template <class T>
AttentionSaved forward(const SparseAttentionParams& p) {
  const int64_t tasks = p.Tq * p.B, slots = std::min(kAttentionMaxThreads, tasks);
  const int64_t kc = kChunk, H = p.H;
  AttentionSaved saved;
  saved.lse = Tensor::empty({p.B, H, p.Tq}, DType::f32, "attn.lse");  // [B, H, Tq]
  // [slots, kc, Dqk + Dv]: the gathered K and V rows
  Tensor kv_tile = Tensor::empty({slots, kc, p.Dqk + p.Dv}, p.dtype, "attn.kv_tile");
  Tensor s_tile = Tensor::empty({slots, H, kc}, DType::f32, "attn.s_tile");  // S, fp32
  Tensor p_tile;  // [slots, H, kc] P in bf16 (fp32: rewritten in place in S)
  if (SparseKernel<T>::low) p_tile = Tensor::empty({slots, H, kc}, p.dtype, "attn.p_tile");
  Tensor stats = Tensor::empty({slots, 2, H}, DType::f32, "attn.row_stats");  // m, l
  Tensor acc = Tensor::empty({slots, H, p.Dv}, DType::f32, "attn.o_acc");
  Tensor list;  // [slots, topk] the compacted selection of a row
  if (p.idx) list = Tensor::empty({slots, p.topk}, DType::i32, "attn.key_list");
  if (meta_mode()) return saved;

  const SparseKernel<T> k{p, p.scale * kLog2e};
  float* lse = saved.lse.data<float>();
  parallel_tasks(tasks, slots, [&](int64_t slot, int64_t task) {
    // latest rows first: they have the most candidates
    const int64_t t = p.Tq - 1 - task / p.B, b = task % p.B;
    T* kt = kv_tile.data<T>() + slot * kc * (p.Dqk + p.Dv);
    T* vt = kt + kc * p.Dqk;
    float* s = s_tile.data<float>() + slot * H * kc;
    T* pt = SparseKernel<T>::low ? p_tile.data<T>() + slot * H * kc : reinterpret_cast<T*>(s);
    float *m = stats.data<float>() + slot * 2 * H, *l = m + H;
    float* o_acc = acc.data<float>() + slot * H * p.Dv;
    const Candidates cand =
        candidates(p, t, b, p.idx ? list.data<int32_t>() + slot * p.topk : nullptr);
    std::fill(m, m + H, -INFINITY);
    std::fill(l, l + H, 0.0f);
    std::fill(o_acc, o_acc + H * p.Dv, 0.0f);
    const T* q = k.q_row(t, b);
    for (int64_t c0 = 0; c0 < cand.n; c0 += kc) {
      const int64_t n = std::min(kc, cand.n - c0);
      k.gather(cand, c0, n, b, kt, vt);
      // s [H, n] = q_t [H, Dqk] · Kᵀ
      matmul(product(H, n, p.Dqk, p.dtype, q, p.Dqk, 1, kt, 1, p.Dqk, s, n, false));
      for (int64_t h = 0; h < H; ++h) {
        float* sr = s + h * n;
        const float m_new = std::max(m[h], attn::row_max(sr, n) * k.c);
        const float alpha = std::exp2(m[h] - m_new);
        l[h] = l[h] * alpha + attn::row_exp2(sr, pt + h * n, n, n, k.c, m_new);
        m[h] = m_new;
        if (alpha != 1.0f)
          for (float *a = o_acc + h * p.Dv, *e = a + p.Dv; a < e; ++a) *a *= alpha;
      }
      // acc [H, Dv] += P [H, n] · V [n, Dv]
      matmul(product(H, p.Dv, n, p.dtype, pt, n, 1, vt, p.Dv, 1, o_acc, p.Dv, true));
    }
    T* o = static_cast<T*>(p.o) + (t * p.B + b) * H * p.Dv;
    for (int64_t h = 0; h < H; ++h) {
      if (cand.n == 0) {
        attn::zero_row(o + h * p.Dv, p.Dv);
        lse[(b * H + h) * p.Tq + t] = -INFINITY;
        continue;
      }
      attn::scale_row(o_acc + h * p.Dv, o + h * p.Dv, p.Dv, 1.0f / l[h]);
      lse[(b * H + h) * p.Tq + t] = (m[h] + std::log2(l[h])) * kLn2;
    }
  });
  return saved;
}

// ---- backward -----------------------------------------------------------------------------------

// Row groups of the backward: G = min(kAttentionMaxThreads, Tq), a function of the params.
int64_t backward_groups(const SparseAttentionParams& p) {
  return std::min(kAttentionMaxThreads, p.Tq);
}

template <class T>
void backward(const SparseAttentionBwdParams& p, const AttentionSaved& saved) {
  const int64_t G = backward_groups(p), kc = kChunk, H = p.H;
  Tensor partial = Tensor::empty({G, p.Tk, p.B, p.Dqk}, DType::f32, "attn.dkv_partial");
  Tensor kv_tile = Tensor::empty({G, kc, p.Dqk + p.Dv}, p.dtype, "attn.kv_tile");
  Tensor s_tile = Tensor::empty({G, kc, H}, DType::f32, "attn.s_tile");    // Sᵀ, then Pᵀ (fp32)
  Tensor dp_tile = Tensor::empty({G, kc, H}, DType::f32, "attn.dp_tile");  // dPᵀ, then dSᵀ (fp32)
  Tensor p_tile, ds_tile;  // [slots, kc, H] Pᵀ and dSᵀ in bf16
  if (SparseKernel<T>::low) {
    p_tile = Tensor::empty({G, kc, H}, p.dtype, "attn.p_tile");
    ds_tile = Tensor::empty({G, kc, H}, p.dtype, "attn.ds_tile");
  }
  Tensor stats = Tensor::empty({G, 2, H}, DType::f32, "attn.row_stats");  // lse2, delta
  // [slots, H·Dqk + kc·Dqk]: dq sums of the row, then the row's contribution to its keys
  Tensor acc = Tensor::empty({G, (H + kc) * p.Dqk}, DType::f32, "attn.grad_acc");
  Tensor list;  // [slots, topk] the compacted selection of a row
  if (p.idx) list = Tensor::empty({G, p.topk}, DType::i32, "attn.key_list");
  if (meta_mode()) return;

  const SparseKernel<T> k{p, p.scale * kLog2e};
  const float* lse = saved.lse.data<float>();
  parallel_tasks(G, G, [&](int64_t slot, int64_t g) {
    float* part = partial.data<float>() + g * p.Tk * p.B * p.Dqk;  // [Tk, B, Dqk]
    std::fill(part, part + p.Tk * p.B * p.Dqk, 0.0f);
    T* kt = kv_tile.data<T>() + slot * kc * (p.Dqk + p.Dv);
    T* vt = kt + kc * p.Dqk;
    float* st = s_tile.data<float>() + slot * kc * H;
    float* dpt = dp_tile.data<float>() + slot * kc * H;
    T* pt = SparseKernel<T>::low ? p_tile.data<T>() + slot * kc * H : reinterpret_cast<T*>(st);
    T* dst = SparseKernel<T>::low ? ds_tile.data<T>() + slot * kc * H : reinterpret_cast<T*>(dpt);
    float *lse2 = stats.data<float>() + slot * 2 * H, *delta = lse2 + H;
    float* dq_acc = acc.data<float>() + slot * (H + kc) * p.Dqk;  // [H, Dqk]
    float* contrib = dq_acc + H * p.Dqk;                          // [kc, Dqk]
    int32_t* keys = p.idx ? list.data<int32_t>() + slot * p.topk : nullptr;
    for (int64_t t = g; t < p.Tq; t += G)
      for (int64_t b = 0; b < p.B; ++b) {
        const Candidates cand = candidates(p, t, b, keys);
        const T* q = k.q_row(t, b);
        const T* dout = static_cast<const T*>(p.dout) + (t * p.B + b) * H * p.Dv;
        const T* o = static_cast<const T*>(p.o) + (t * p.B + b) * H * p.Dv;
        for (int64_t h = 0; h < H; ++h) {
          lse2[h] = lse[(b * H + h) * p.Tq + t] * kLog2e;
          delta[h] = attn::dot_row_f64(dout + h * p.Dv, o + h * p.Dv, p.Dv);
        }
        std::fill(dq_acc, dq_acc + H * p.Dqk, 0.0f);
        for (int64_t c0 = 0; c0 < cand.n; c0 += kc) {
          const int64_t n = std::min(kc, cand.n - c0);
          k.gather(cand, c0, n, b, kt, vt);
          // st [n, H] = K · q_tᵀ;  dpt [n, H] = V · dO_tᵀ
          matmul(product(n, H, p.Dqk, p.dtype, kt, p.Dqk, 1, q, 1, p.Dqk, st, H, false));
          matmul(product(n, H, p.Dv, p.dtype, vt, p.Dv, 1, dout, 1, p.Dv, dpt, H, false));
          // A row whose every candidate is in this one tile takes delta = ΣP∘dP / ΣP of the tile
          // (the fused kernel's first-tile rows, docs/attention.md §2): dS then cancels dP's
          // rounding, as a plain implementation's does.
          if (c0 == 0 && cand.n <= kc) tile_delta(st, dpt, n, H, lse2, delta, k.c);
          for (int64_t i = 0; i < n; ++i)
            attn::span_grad(st + i * H, dpt + i * H, pt + i * H, dst + i * H, H, k.c, lse2, delta);
          // dq_acc [H, Dqk] += dS [H, n] · K (dS read through the transpose of dSᵀ)
          matmul(product(H, p.Dqk, n, p.dtype, dst, 1, H, kt, p.Dqk, 1, dq_acc, p.Dqk, true));
          // contrib [n, Dqk] = scale · dSᵀ q_t;  contrib[:, :Dv] += Pᵀ dO_t
          matmul(product(n, p.Dqk, H, p.dtype, dst, H, 1, q, p.Dqk, 1, contrib, p.Dqk, false,
                         p.scale));
          matmul(product(n, p.Dv, H, p.dtype, pt, H, 1, dout, p.Dv, 1, contrib, p.Dqk, true));
          for (int64_t i = 0; i < n; ++i) {
            float* dst_row = part + (cand[c0 + i] * p.B + b) * p.Dqk;
            const float* src = contrib + i * p.Dqk;
            for (int64_t d = 0; d < p.Dqk; ++d) dst_row[d] += src[d];
          }
        }
        T* dq = static_cast<T*>(p.dq) + (t * p.B + b) * H * p.Dqk;
        for (int64_t h = 0; h < H; ++h)
          attn::scale_row(dq_acc + h * p.Dqk, dq + h * p.Dqk, p.Dqk, p.scale);
      }
  });
  // dkv = Σ_g partial[g] in group order, rounded once to dkv_dtype
  const float* part = partial.data<float>();
  const int64_t rows = p.Tk * p.B, stride = rows * p.Dqk;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float sum[1024];
    for (int64_t d0 = 0; d0 < p.Dqk; d0 += 1024) {
      const int64_t w = std::min<int64_t>(1024, p.Dqk - d0);
      std::copy_n(part + r * p.Dqk + d0, w, sum);
      for (int64_t g = 1; g < G; ++g) {
        const float* x = part + g * stride + r * p.Dqk + d0;
        for (int64_t d = 0; d < w; ++d) sum[d] += x[d];
      }
      if (p.dkv_dtype == DType::f32)
        std::copy_n(sum, w, static_cast<float*>(p.dkv) + r * p.Dqk + d0);
      else
        attn::scale_row(sum, static_cast<bf16*>(p.dkv) + r * p.Dqk + d0, w, 1.0f);
    }
  }
}

// ---- head probabilities -------------------------------------------------------------------------

template <class T>
void head_probs(const SparseAttentionParams& p, const float* lse, int64_t t0, int64_t t1,
                float* out) {
  const int64_t tasks = (t1 - t0) * p.B,
                slots = std::max<int64_t>(1, std::min(kAttentionMaxThreads, tasks));
  const int64_t kc = kChunk, H = p.H, width = p.idx ? p.topk : p.Tk;
  Tensor kv_tile = Tensor::empty({slots, kc, p.Dqk}, p.dtype, "attn.kv_tile");  // gathered K
  Tensor s_tile = Tensor::empty({slots, H, kc}, DType::f32, "attn.s_tile");     // S
  Tensor list;  // [slots, topk] the compacted selection of a row
  if (p.idx) list = Tensor::empty({slots, p.topk}, DType::i32, "attn.key_list");
  if (meta_mode()) return;

  const SparseKernel<T> k{p, p.scale * kLog2e};
  parallel_tasks(tasks, slots, [&](int64_t slot, int64_t task) {
    const int64_t t = t1 - 1 - task / p.B, b = task % p.B;
    T* kt = kv_tile.data<T>() + slot * kc * p.Dqk;
    float* s = s_tile.data<float>() + slot * H * kc;
    float* row = out + ((t - t0) * p.B + b) * width;
    std::fill(row, row + width, 0.0f);
    const int32_t* sel = p.idx ? p.idx + (t * p.B + b) * p.topk : nullptr;
    const Candidates cand =
        candidates(p, t, b, p.idx ? list.data<int32_t>() + slot * p.topk : nullptr);
    // out column of candidate i: its idx slot (valid entries in order), or its key row
    int64_t slot_of = 0;
    for (int64_t c0 = 0; c0 < cand.n; c0 += kc) {
      const int64_t n = std::min(kc, cand.n - c0);
      k.gather(cand, c0, n, b, kt, nullptr);
      matmul(product(H, n, p.Dqk, p.dtype, k.q_row(t, b), p.Dqk, 1, kt, 1, p.Dqk, s, n, false));
      for (int64_t i = 0; i < n; ++i) {
        double sum = 0;
        for (int64_t h = 0; h < H; ++h)
          sum +=
              std::exp2(double(k.c) * s[h * n + i] - double(lse[(b * H + h) * p.Tq + t]) * kLog2e);
        int64_t col = c0 + i;
        if (sel) {
          while (sel[slot_of] < 0) ++slot_of;
          col = slot_of++;
        }
        row[col] = float(sum / double(H));
      }
    }
  });
}

}  // namespace

void check_sparse_attention_params(const SparseAttentionParams& p) {
  check_common(p);
  LAGA_CHECK(p.o, "sparse attention forward needs o [Tq, B, H, Dv]");
}

void check_sparse_attention_params(const SparseAttentionBwdParams& p) {
  check_sparse_attention_params(static_cast<const SparseAttentionParams&>(p));
  LAGA_CHECK(p.dout && p.dq && p.dkv,
             "sparse attention backward needs dout [Tq, B, H, Dv], dq [Tq, B, H, Dqk] and dkv [Tk, "
             "B, Dqk]; missing {}{}{}",
             p.dout ? "" : "dout ", p.dq ? "" : "dq ", p.dkv ? "" : "dkv");
  LAGA_CHECK(p.dkv_dtype == DType::f32 || p.dkv_dtype == p.dtype,
             "sparse attention writes dkv in fp32 or the storage dtype {}; got {}",
             dtype_name(p.dtype), dtype_name(p.dkv_dtype));
}

AttentionSaved sparse_attention_forward(const SparseAttentionParams& p) {
  check_sparse_attention_params(p);
  WorkOp work(sparse_work(p, false));
  return dispatch_dtype(
      p.dtype, [&](auto* tag) { return forward<std::remove_pointer_t<decltype(tag)>>(p); });
}

void sparse_attention_backward(const SparseAttentionBwdParams& p, const AttentionSaved& saved) {
  check_sparse_attention_params(p);
  check_shape(saved.lse, {p.B, p.H, p.Tq}, "saved.lse (sparse attention)");
  check_dtype(saved.lse, DType::f32, "saved.lse (sparse attention)");
  WorkOp work(sparse_work(p, true));
  dispatch_dtype(p.dtype,
                 [&](auto* tag) { backward<std::remove_pointer_t<decltype(tag)>>(p, saved); });
}

void attention_head_probs(const SparseAttentionParams& p, const Tensor& lse, int64_t t0, int64_t t1,
                          float* out) {
  check_common(p);
  check_shape(lse, {p.B, p.H, p.Tq}, "lse (attention_head_probs)");
  check_dtype(lse, DType::f32, "lse (attention_head_probs)");
  LAGA_CHECK(0 <= t0 && t0 < t1 && t1 <= p.Tq,
             "attention_head_probs rows [{}, {}) must be a non-empty range inside [0, {})", t0, t1,
             p.Tq);
  LAGA_CHECK(out, "attention_head_probs needs out [t1 − t0, B, {}]", p.idx ? "topk" : "Tk");
  WorkRecord r;
  r.cls = WorkClass::attention_forward, r.op = "attention", r.dtype = p.dtype;
  r.flops = 2.0 * double(p.H) * double(p.Dqk) * selected_pairs(p, t0, t1);
  r.dims[0] = t1 - t0, r.dims[1] = p.H, r.dims[2] = 1, r.dims[3] = p.Dqk, r.dims[4] = p.Dv;
  r.kernel = AttentionKernel::sparse;
  WorkOp work(r);
  dispatch_dtype(p.dtype, [&](auto* tag) {
    head_probs<std::remove_pointer_t<decltype(tag)>>(p, meta_mode() ? nullptr : lse.data<float>(),
                                                     t0, t1, out);
  });
}

double sparse_attention_forward_flops(const SparseAttentionParams& p) {
  return 2.0 * double(p.H) * double(p.Dqk + p.Dv) * selected_pairs(p, 0, p.Tq);
}

}  // namespace laga
