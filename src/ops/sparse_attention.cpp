// Sparse latent attention (ops/sparse_attention.hpp): every query row (t, b) attends, with all H
// heads, to its own candidate key rows of one shared latent head: its selection (idx) or, without
// idx, every key row at a position ≤ its own. The math is the fused kernel's (docs/attention.md
// §2–§4) over a gathered key set instead of a causal range; docs/sparse.md states it for DSA.
//
// Forward, task (t, b), one query row: the candidates in chunks of kChunk key rows, gathered into
// dense tiles K [n, Dqk] and V [n, Dv]; S [H, n] = q_t · Kᵀ (the H heads share the keys: they are
// the product's M), an exp2 online softmax per head, acc [H, Dv] += P · V; o = acc / l and
// lse = (m + log2 l) · ln 2.
// Backward, two passes over delta = rowsum(dO∘O) per (row, head), fp32 [B, H, Tq]. Pass B,
// query-major, task (t, b): per chunk Sᵀ [n, H] = K · q_tᵀ, dPᵀ = V · dO_tᵀ, Pᵀ and dSᵀ by
// span_grad, dq_t += dS · K (the task owns the row). Pass A, key-major, task (range of R key
// rows, b): the query rows t = 0 .. Tq − 1 in ascending order, each against the span of its
// candidates inside the range (a binary search in its ascending selection; without idx the range's
// keys ≤ q_pos0 + t), recomputing Sᵀ, dPᵀ, Pᵀ, dSᵀ over the span and adding scale · dSᵀ q_t and
// Pᵀ dO_t into the range's own fp32 rows of dkv, written once in dkv_dtype. Every sum has one order
// fixed by the params, so results are bitwise independent of the thread count; no atomics, and no
// workspace grows with Tk (per-slot tiles, delta, the sorted selection [Tq, B, topk]). Seven tile
// products per pair against the one-pass form's five. Not here: strided q, kv, o (the layout is
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

using attn::parallel_tasks;

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

// Keys per range of the backward's key-major pass: the range's fp32 dkv sums (288 KiB at Dqk 576)
// and its gathered keys stay in a core's L2 cache while the task walks every query row.
constexpr int64_t kRange = 128, kRangeMax = 1024;

// The key rows of a range: enough that a row's selection, spread over up to Tk earlier keys, puts
// about 16 of its topk keys in each range it touches (a span of one or two keys makes four tile
// products of one or two rows each), kRange at least, kRangeMax at most; kRange without idx (a
// row's keys are then a contiguous span). A function of the params alone.
int64_t range_rows(const SparseAttentionParams& p) {
  int64_t R = kRange;
  if (p.idx) {
    const int64_t want = 16 * p.Tk / std::max<int64_t>(p.topk, 1);
    R = std::clamp((want + kRange - 1) / kRange * kRange, kRange, kRangeMax);
  }
  return std::min(R, p.Tk);
}

template <class T>
void backward(const SparseAttentionBwdParams& p, const AttentionSaved& saved) {
  const int64_t H = p.H, kc = kChunk, R = range_rows(p);
  const int64_t ranges = (p.Tk + R - 1) / R, rows = p.Tq * p.B;
  const int64_t tiles = std::max(kc, R);  // rows of a gathered key tile, either pass
  const int64_t slots =
      std::max(std::min(kAttentionMaxThreads, rows), std::min(kAttentionMaxThreads, p.B * ranges));
  Tensor delta_all = Tensor::empty({p.B, H, p.Tq}, DType::f32, "attn.delta");
  Tensor list, count;  // [Tq, B, topk], [Tq, B]: each row's valid keys, ascending, and their number
  if (p.idx) {
    list = Tensor::empty({p.Tq, p.B, p.topk}, DType::i32, "attn.key_list");
    count = Tensor::empty({p.Tq, p.B}, DType::i32, "attn.key_count");
  }
  Tensor kv_tile = Tensor::empty({slots, tiles, p.Dqk}, p.dtype, "attn.kv_tile");
  Tensor s_tile = Tensor::empty({slots, tiles, H}, DType::f32, "attn.s_tile");    // Sᵀ, then Pᵀ
  Tensor dp_tile = Tensor::empty({slots, tiles, H}, DType::f32, "attn.dp_tile");  // dPᵀ, then dSᵀ
  Tensor p_tile, ds_tile;  // [slots, tiles, H] Pᵀ and dSᵀ in bf16
  if (SparseKernel<T>::low) {
    p_tile = Tensor::empty({slots, tiles, H}, p.dtype, "attn.p_tile");
    ds_tile = Tensor::empty({slots, tiles, H}, p.dtype, "attn.ds_tile");
  }
  Tensor stats = Tensor::empty({slots, 2, H}, DType::f32, "attn.row_stats");  // lse2, delta
  // per slot: pass B's dq sums [H, Dqk]; pass A's range sums [R, Dqk] and a row's contribution to
  // its keys [tiles, Dqk]
  const int64_t acc_rows = std::max(H, R + tiles);
  Tensor acc = Tensor::empty({slots, acc_rows * p.Dqk}, DType::f32, "attn.grad_acc");
  if (meta_mode()) return;

  const SparseKernel<T> k{p, p.scale * kLog2e};
  const float* lse = saved.lse.data<float>();
  float* delta_of = delta_all.data<float>();  // [B, H, Tq]
  int32_t* keys = p.idx ? list.data<int32_t>() : nullptr;
  int32_t* counts = p.idx ? count.data<int32_t>() : nullptr;
  if (p.idx) {
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const int32_t* sel = p.idx + row * p.topk;
      int32_t* out = keys + row * p.topk;
      int64_t n = 0;
      for (int64_t j = 0; j < p.topk; ++j)
        if (sel[j] >= 0) out[n++] = sel[j];
      std::sort(out, out + n);
      std::fill(out + n, out + p.topk, -1);
      counts[row] = int32_t(n);
    }
  }
  auto candidates_of = [&](int64_t t, int64_t b) -> Candidates {
    if (!p.idx) return {nullptr, std::min(p.q_pos0 + t + 1, p.Tk)};
    return {keys + (t * p.B + b) * p.topk, counts[t * p.B + b]};
  };
  struct Slot {
    T* kt;
    float *st, *dpt;
    T *pt, *dst;
    float *lse2, *delta, *acc;
  };
  auto slot_of = [&](int64_t slot) {
    Slot s;
    s.kt = kv_tile.data<T>() + slot * tiles * p.Dqk;
    s.st = s_tile.data<float>() + slot * tiles * H;
    s.dpt = dp_tile.data<float>() + slot * tiles * H;
    s.pt = SparseKernel<T>::low ? p_tile.data<T>() + slot * tiles * H : reinterpret_cast<T*>(s.st);
    s.dst =
        SparseKernel<T>::low ? ds_tile.data<T>() + slot * tiles * H : reinterpret_cast<T*>(s.dpt);
    s.lse2 = stats.data<float>() + slot * 2 * H, s.delta = s.lse2 + H;
    s.acc = acc.data<float>() + slot * acc_rows * p.Dqk;
    return s;
  };
  // Sᵀ, dPᵀ [n, H] of a query row over the n keys of K [n, Dqk] (row stride ldk; V its first Dv
  // columns); span_grads then makes Pᵀ, dSᵀ from the row's lse2 and delta in the slot.
  auto scores = [&](const Slot& s, const T* kt, int64_t ldk, int64_t n, const T* q, const T* dout) {
    // st [n, H] = K · q_tᵀ;  dpt [n, H] = V · dO_tᵀ
    matmul(product(n, H, p.Dqk, p.dtype, kt, ldk, 1, q, 1, p.Dqk, s.st, H, false));
    matmul(product(n, H, p.Dv, p.dtype, kt, ldk, 1, dout, 1, p.Dv, s.dpt, H, false));
  };
  auto span_grads = [&](const Slot& s, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      attn::span_grad(s.st + i * H, s.dpt + i * H, s.pt + i * H, s.dst + i * H, H, k.c, s.lse2,
                      s.delta);
  };
  const T* q_all = static_cast<const T*>(p.q);
  const T* dout_all = static_cast<const T*>(p.dout);

  // Pass B, query-major, task (t, b): delta, then per chunk of candidates Pᵀ, dSᵀ and dq_t += dS·K.
  parallel_tasks(rows, std::min(kAttentionMaxThreads, rows), [&](int64_t slot, int64_t task) {
    const int64_t t = p.Tq - 1 - task / p.B, b = task % p.B;
    const Slot s = slot_of(slot);
    const Candidates cand = candidates_of(t, b);
    const T* q = k.q_row(t, b);
    const T* dout = dout_all + (t * p.B + b) * H * p.Dv;
    const T* o = static_cast<const T*>(p.o) + (t * p.B + b) * H * p.Dv;
    for (int64_t h = 0; h < H; ++h) {
      s.lse2[h] = lse[(b * H + h) * p.Tq + t] * kLog2e;
      s.delta[h] = attn::dot_row_f64(dout + h * p.Dv, o + h * p.Dv, p.Dv);
    }
    float* dq_acc = s.acc;  // [H, Dqk]
    std::fill(dq_acc, dq_acc + H * p.Dqk, 0.0f);
    for (int64_t c0 = 0; c0 < cand.n; c0 += kc) {
      const int64_t n = std::min(kc, cand.n - c0);
      k.gather(cand, c0, n, b, s.kt, nullptr);
      scores(s, s.kt, p.Dqk, n, q, dout);
      // A row whose every candidate is in this one tile takes delta = ΣP∘dP / ΣP of the tile (the
      // fused kernel's first-tile rows, docs/attention.md §2): dS then cancels dP's rounding, as a
      // plain implementation's does. Pass A reads the same delta.
      if (c0 == 0 && cand.n <= kc) tile_delta(s.st, s.dpt, n, H, s.lse2, s.delta, k.c);
      span_grads(s, n);
      // dq_acc [H, Dqk] += dS [H, n] · K (dS read through the transpose of dSᵀ)
      matmul(product(H, p.Dqk, n, p.dtype, s.dst, 1, H, s.kt, p.Dqk, 1, dq_acc, p.Dqk, true));
    }
    T* dq = static_cast<T*>(p.dq) + (t * p.B + b) * H * p.Dqk;
    for (int64_t h = 0; h < H; ++h) {
      attn::scale_row(dq_acc + h * p.Dqk, dq + h * p.Dqk, p.Dqk, p.scale);
      delta_of[(b * H + h) * p.Tq + t] = s.delta[h];
    }
  });

  // Pass A, key-major, task (range r, b): the query rows in ascending order, each against the span
  // of its candidates inside the range; dK, dV summed in the range's own fp32 rows, written once.
  const int64_t ld = p.B * p.Dqk;  // kv's row stride
  parallel_tasks(
      p.B * ranges, std::min(kAttentionMaxThreads, p.B * ranges), [&](int64_t slot, int64_t task) {
        const int64_t r = task / p.B, b = task % p.B;
        const int64_t r0 = r * R, r1 = std::min(r0 + R, p.Tk), nr = r1 - r0;
        const Slot s = slot_of(slot);
        float* sums = s.acc;                 // [nr, Dqk]: dkv rows r0 .. r1 − 1
        float* contrib = s.acc + R * p.Dqk;  // [n, Dqk]: one row's contribution to its span
        for (int64_t i = 0; i < nr; ++i) {
          float* row = sums + i * p.Dqk;
          if (p.dkv_accumulate)
            std::copy_n(static_cast<const float*>(p.dkv) + ((r0 + i) * p.B + b) * p.Dqk, p.Dqk,
                        row);
          else
            std::fill(row, row + p.Dqk, 0.0f);
        }
        for (int64_t t = p.idx ? 0 : std::max<int64_t>(0, r0 - p.q_pos0); t < p.Tq; ++t) {
          // the span: candidates in [r0, r1), ascending, first key s0
          const int32_t* span = nullptr;
          int64_t n = 0, s0 = r0;
          if (p.idx) {
            const Candidates cand = candidates_of(t, b);
            const int32_t* lo = std::lower_bound(cand.keys, cand.keys + cand.n, int32_t(r0));
            const int32_t* hi = std::lower_bound(lo, cand.keys + cand.n, int32_t(r1));
            n = hi - lo, span = lo;
            if (n == 0) continue;
            s0 = lo[0];
            if (lo[n - 1] - lo[0] == n - 1) span = nullptr;  // contiguous: read in place
          } else {
            n = std::min(r1, p.q_pos0 + t + 1) - r0;
          }
          const T* q = q_all + (t * p.B + b) * H * p.Dqk;
          const T* dout = dout_all + (t * p.B + b) * H * p.Dv;
          for (int64_t h = 0; h < H; ++h) {
            s.lse2[h] = lse[(b * H + h) * p.Tq + t] * kLog2e;
            s.delta[h] = delta_of[(b * H + h) * p.Tq + t];
          }
          const T* kt = k.kv_row(s0, b);
          int64_t ldk = ld;
          if (span) {
            for (int64_t i = 0; i < n; ++i)
              std::memcpy(s.kt + i * p.Dqk, k.kv_row(span[i], b), size_t(p.Dqk) * sizeof(T));
            kt = s.kt, ldk = p.Dqk;
          }
          scores(s, kt, ldk, n, q, dout);
          span_grads(s, n);
          // dK_span [n, Dqk] += scale · dSᵀ q_t;  dV_span [n, :Dv] += Pᵀ dO_t: straight into the
          // range's rows when the span is contiguous, else through contrib
          float* c = span ? contrib : sums + (s0 - r0) * p.Dqk;
          matmul(product(n, p.Dqk, H, p.dtype, s.dst, H, 1, q, p.Dqk, 1, c, p.Dqk, !span, p.scale));
          matmul(product(n, p.Dv, H, p.dtype, s.pt, H, 1, dout, p.Dv, 1, c, p.Dqk, true));
          if (span)
            for (int64_t i = 0; i < n; ++i) {
              float* dst_row = sums + (span[i] - r0) * p.Dqk;
              const float* src = contrib + i * p.Dqk;
              for (int64_t d = 0; d < p.Dqk; ++d) dst_row[d] += src[d];
            }
        }
        for (int64_t i = 0; i < nr; ++i) {
          const float* src = sums + i * p.Dqk;
          const int64_t at = ((r0 + i) * p.B + b) * p.Dqk;
          if (p.dkv_dtype == DType::f32)
            std::copy_n(src, p.Dqk, static_cast<float*>(p.dkv) + at);
          else
            attn::scale_row(src, static_cast<bf16*>(p.dkv) + at, p.Dqk, 1.0f);
        }
      });
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
  LAGA_CHECK(!p.dkv_accumulate || p.dkv_dtype == DType::f32,
             "sparse attention adds onto dkv's sums in fp32 only; got dkv in {}",
             dtype_name(p.dkv_dtype));
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
