// fp64 reference of the MLA block stack: per layer y = x + MLA(RMSNorm(x; attn_norm)), MLA in the
// explicit form on one rank (docs/design.md §2.1–§2.2), forward and backward; with attention_only
// y = MLA(x): N is xn = x and R is y = y_attn. The equations and every backward step are derived in
// docs/block.md; the line labels (N, L1–L6, E1–E4, R) are the same.
//
// One rank, so there are no collectives: E2's and E4's all-to-alls are identities and the positions
// are the token indices t = 0 .. T-1. The backward recomputes each layer's forward from the layer's
// saved input instead of keeping every layer's intermediates: the reference is for clarity, and
// recomputation is exact (same operations, same order). The softmax scale is computed here from the
// config's raw fields, never from MlaConfig::softmax_scale(), so the fast code cannot agree by
// sharing.
//
// Precision emulation (`storage` set; empty leaves every line below exact and bitwise as before). A
// plain implementation in bf16 (or fp32) computes each op in higher precision and rounds the result
// once, where it stores it. So the lines marked `store(...)` round, in the storage dtype, exactly
// the tensors src/mla/block.cpp and src/mla/forms/explicit.cpp write in it:
//   forward   xn (N), cq (L1), cqn (L2), q before RoPE (L3, act.q_local) and q after RoPE, kv (L4),
//             ckv (L5) and kpe (L6) — the latent —, [k_nope | v] (E1, act.kvb), attention's P
//             (inside attention_ref) and o (E3), o·woᵀ (act.y) and y = x + o·woᵀ (R);
//   backward  do (E4), attention's dS (inside attention_ref), dq, dk, dv (E3), dkpe = Σ_h dk_pe and
//             dckv (E1: the two halves of dlatent), dkv (L5, L6), dxn after L4 and again after the
//             q path is added (L1/L3'), dcqn (L3), dq after RoPEᵀ, dcq (L2), RMSNormᵀ(dxn) and dx =
//             dy + RMSNormᵀ(dxn) (N, R). With attention_only, N and R round nothing: xn is x and y
//             is o·woᵀ, as stored; dx is dxn.
// Every sum (products, norms, attention, the sum over heads of dk_pe) accumulates in fp32, each
// partial sum rounded to fp32 in sequential order, as a plain fp32-accumulating loop would
// (Accum::f32): in fp32 runs that accumulation, not storage, is most of the error (measured: with
// storage rounding alone explicit's fp32 error was up to 16× plain's, growing with the reduction
// lengths). Weight gradients are rounded to fp32 (laga accumulates them in fp32 whatever the
// storage dtype). Not emulated: the attention scores and dP (fp32 tiles in the fast kernels),
// summation orders.
#include "reference/block_ref.hpp"

#include <cmath>

#include <fmt/format.h>

#include "reference/attention_ref.hpp"
#include "reference/indexer_ref.hpp"
#include "reference/ops_ref.hpp"

namespace laga::ref {

namespace {

// docs/design.md §1.1: yarn_mscale(f, m) = 0.1 · m · ln(f) + 1, or 1 if f ≤ 1.
double yarn_mscale(double f, double m) { return f <= 1 ? 1.0 : 0.1 * m * std::log(f) + 1.0; }

// softmax_scale = Dqk^-0.5 · yarn_mscale(f, ma)² with rope_scaling, else Dqk^-0.5.
double softmax_scale(const MlaConfig& c) {
  double s = 1.0 / std::sqrt(double(c.qk_nope_head_dim + c.qk_rope_head_dim));
  if (c.rope_scaling.enabled) {
    const double m = yarn_mscale(c.rope_scaling.factor, c.rope_scaling.mscale_all_dim);
    s *= m * m;
  }
  return s;
}

// The same array with another shape of the same element count (a view, in the fast code).
Array reshaped(Array a, Shape s) {
  LAGA_ASSERT(shape_numel(s) == a.numel(), "reshape {} -> {}", shape_str(a.shape), shape_str(s));
  a.shape = std::move(s);
  return a;
}

// a[..., begin:end] as its own array.
Array slice_last(const Array& a, int64_t begin, int64_t end) {
  const int64_t C = a.shape.back(), W = end - begin, rows = a.numel() / C;
  Shape s = a.shape;
  s.back() = W;
  Array out(s);
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t j = 0; j < W; ++j) out[m * W + j] = a[m * C + begin + j];
  return out;
}

// dst[..., begin:begin+W] = src (src is [..., W], with dst's leading dims).
void put_last(Array& dst, const Array& src, int64_t begin) {
  const int64_t C = dst.shape.back(), W = src.shape.back(), rows = dst.numel() / C;
  LAGA_ASSERT(src.numel() == rows * W, "put_last {} into {}", shape_str(src.shape),
              shape_str(dst.shape));
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t j = 0; j < W; ++j) dst[m * C + begin + j] = src[m * W + j];
}

void add_into(Array& acc, const Array& a) {
  LAGA_ASSERT(acc.shape == a.shape, "add {} into {}", shape_str(a.shape), shape_str(acc.shape));
  for (int64_t i = 0; i < a.numel(); ++i) acc[i] += a[i];
}

// a[:, :, h, begin:end] of a [T, B, H, C] as [T, B, end − begin].
Array head_slice(const Array& a, int64_t h, int64_t begin, int64_t end) {
  const int64_t H = a.shape[2], C = a.shape[3], W = end - begin, rows = a.shape[0] * a.shape[1];
  Array out({a.shape[0], a.shape[1], W});
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t j = 0; j < W; ++j) out[m * W + j] = a[(m * H + h) * C + begin + j];
  return out;
}

// dst[:, :, h, begin:begin+W] = src [T, B, W].
void put_head(Array& dst, const Array& src, int64_t h, int64_t begin) {
  const int64_t H = dst.shape[2], C = dst.shape[3], W = src.shape.back(),
                rows = dst.shape[0] * dst.shape[1];
  LAGA_ASSERT(src.numel() == rows * W, "put_head {} into {}", shape_str(src.shape),
              shape_str(dst.shape));
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t j = 0; j < W; ++j) dst[(m * H + h) * C + begin + j] = src[m * W + j];
}

// Rows [r0, r0 + n) of a 2-D array, transposed when `transpose`: [n, C] or [C, n].
Array rows_of(const Array& a, int64_t r0, int64_t n, bool transpose) {
  const int64_t C = a.shape[1];
  Array out(transpose ? Shape{C, n} : Shape{n, C});
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < C; ++j) out[transpose ? j * n + r : r * C + j] = a[(r0 + r) * C + j];
  return out;
}

// a2 [n, C] (or its transpose [C, n]) into rows [r0, r0 + n) of dst [R, C].
void put_rows(Array& dst, const Array& a2, int64_t r0, bool transposed) {
  const int64_t C = dst.shape[1], n = transposed ? a2.shape[1] : a2.shape[0];
  LAGA_ASSERT(a2.numel() == n * C, "put_rows {} into {}", shape_str(a2.shape),
              shape_str(dst.shape));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < C; ++j)
      dst[(r0 + r) * C + j] = transposed ? a2[j * n + r] : a2[r * C + j];
}

const Array& weight(const RefWeights& w, int64_t l, const char* name) {
  const std::string key = fmt::format("layers.{}.{}", l, name);
  auto it = w.find(key);
  LAGA_CHECK(it != w.end(), "reference weights have no '{}'", key);
  return it->second;
}

// Everything one layer's forward computes that its backward reads. Shapes for x [T, B, D].
struct LayerForward {
  Array xn;      // [T, B, D]          N   xn = rmsnorm(x; attn_norm), or x (attention_only)
  Array cq;      // [T, B, Lq]         L1  (q_lora_rank > 0 only)
  Array cqn;     // [T, B, Lq]         L2  (q_lora_rank > 0 only)
  Array q;       // [T, B, H, Dqk]     L3  after RoPE on q_pe
  Array kv;      // [T, B, Lkv+Dr]     L4
  Array ckv;     // [T, B, Lkv]        L5
  Array k;       // [T, B, H, Dqk]     E1  [k_nope | kpe broadcast]          (Core::per_head)
  Array v;       // [T, B, H, Dv]      E1                                    (Core::per_head)
  Array q_abs;   // [T, B, H, Dl]      A2  [q_nope·W_UK | q_pe]              (Core::absorbed)
  Array latent;  // [T, B, 1, Dl]      A3  K = [ckv | kpe], one shared head  (Core::absorbed)
  Array ckv1;    // [T, B, 1, Lkv]     A3  V = ckv                           (Core::absorbed)
  Array o_lat;   // [T, B, H, Lkv]     A3                                    (Core::absorbed)
  Array o;       // [T, B, H·Dv]       E3 (A4)
  Array y;       // [T, B, D]          E4 + R
};

LayerForward layer_forward(const MlaConfig& c, const RefWeights& w, int64_t l, const Array& x,
                           std::optional<DType> st, Core core, const KeyMask* mask) {
  const int64_t T = x.shape[0], B = x.shape[1], D = c.hidden_size, H = c.num_attention_heads;
  const int64_t Lkv = c.kv_lora_rank, Dn = c.qk_nope_head_dim, Dr = c.qk_rope_head_dim,
                Dv = c.v_head_dim;
  const int64_t Dqk = Dn + Dr;
  auto store = [&](Array& a) { round_in_place(a, st); };
  const Accum acc = st ? Accum::f32 : Accum::exact;
  LayerForward f;
  // N   xn = rmsnorm(x; attn_norm)                                  [T, B, D]
  //     (attention_only: xn = x, no weight)
  if (c.attention_only) {
    f.xn = x;
  } else {
    f.xn = rmsnorm_forward(x, weight(w, l, "attn_norm"), c.rms_norm_eps, acc);
    store(f.xn);
  }

  // L1  cq = xn · wq_aᵀ                                             [T, B, Lq]
  // L2  cqn = rmsnorm(cq; q_norm)                                   [T, B, Lq]
  // L3  q = cqn · wq_bᵀ  (or xn · wqᵀ when q_lora_rank = 0)        [T, B, H, Dqk]
  Array q_raw;
  if (c.q_lora_rank > 0) {
    f.cq = linear_forward(f.xn, weight(w, l, "wq_a"), acc);
    store(f.cq);
    f.cqn = rmsnorm_forward(f.cq, weight(w, l, "q_norm"), c.rms_norm_eps, acc);
    store(f.cqn);
    q_raw = linear_forward(f.cqn, weight(w, l, "wq_b"), acc);
  } else {
    q_raw = linear_forward(f.xn, weight(w, l, "wq"), acc);
  }
  store(q_raw);
  q_raw = reshaped(std::move(q_raw), {T, B, H, Dqk});
  //     q_pe ← rope(q_pe, positions t)                              q_pe [T, B, H, Dr]
  f.q = q_raw;
  put_last(f.q, rope_forward(slice_last(q_raw, Dn, Dqk), c, 0), Dn);
  store(f.q);  // (q_nope is already rounded: rounding again leaves it as is)

  // L4  kv = xn · wkv_aᵀ                                            [T, B, Lkv+Dr]
  f.kv = linear_forward(f.xn, weight(w, l, "wkv_a"), acc);
  store(f.kv);
  // L5  ckv = rmsnorm(kv[..., :Lkv]; kv_norm)                       [T, B, Lkv]
  f.ckv = rmsnorm_forward(slice_last(f.kv, 0, Lkv), weight(w, l, "kv_norm"), c.rms_norm_eps, acc);
  store(f.ckv);
  // L6  kpe = rope(kv[..., Lkv:])                                   [T, B, Dr], one head
  Array kpe = rope_forward(slice_last(f.kv, Lkv, Lkv + Dr), c, 0);
  store(kpe);

  if (core == Core::absorbed) {
    // A2  q_abs[h] = [q_nope[h] · W_UK[h] | q_pe[h]],  W_UK[h] = wkv_b rows h·(Dn+Dv) .. +Dn  [T,
    // B, H, Dl]
    const Array& wkv_b = weight(w, l, "wkv_b");
    f.q_abs = Array({T, B, H, Lkv + Dr});
    for (int64_t h = 0; h < H; ++h) {
      put_head(
          f.q_abs,
          linear_forward(head_slice(f.q, h, 0, Dn), rows_of(wkv_b, h * (Dn + Dv), Dn, true), acc),
          h, 0);
      put_head(f.q_abs, head_slice(f.q, h, Dn, Dqk), h, Lkv);
    }
    store(f.q_abs);
    // A3  o_lat = attention(q_abs, K = [ckv | kpe], V = ckv), one K/V head for all H   [T, B, H,
    // Lkv]
    f.latent = Array({T, B, 1, Lkv + Dr});
    put_last(f.latent, f.ckv, 0);
    put_last(f.latent, kpe, Lkv);
    f.ckv1 = reshaped(f.ckv, {T, B, 1, Lkv});
    f.o_lat =
        attention_forward(f.q_abs, f.latent, f.ckv1, softmax_scale(c), /*causal=*/true, st, mask);
    store(f.o_lat);
    // A4  o[h] = o_lat[h] · W_UV[h]ᵀ,  W_UV[h] = wkv_b rows h·(Dn+Dv)+Dn .. +Dv          [T, B,
    // H·Dv]
    Array o({T, B, H, Dv});
    for (int64_t h = 0; h < H; ++h)
      put_head(o,
               linear_forward(head_slice(f.o_lat, h, 0, Lkv),
                              rows_of(wkv_b, h * (Dn + Dv) + Dn, Dv, false), acc),
               h, 0);
    f.o = reshaped(std::move(o), {T, B, H * Dv});
    store(f.o);
  } else {
    // E1  [k_nope | v] = ckv · wkv_bᵀ                                 [T, B, H, Dn+Dv]
    //     k = [k_nope | kpe broadcast over heads]                     [T, B, H, Dqk]
    Array kvb = reshaped(linear_forward(f.ckv, weight(w, l, "wkv_b"), acc), {T, B, H, Dn + Dv});
    store(kvb);
    f.k = Array({T, B, H, Dqk});
    put_last(f.k, slice_last(kvb, 0, Dn), 0);
    for (int64_t tb = 0; tb < T * B; ++tb)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < Dr; ++j) f.k[(tb * H + h) * Dqk + Dn + j] = kpe[tb * Dr + j];
    f.v = slice_last(kvb, Dn, Dn + Dv);

    // E2  (one rank: the all-to-alls are identities)
    // E3  o = attention(q, k, v), causal, softmax_scale                [T, B, H, Dv]
    f.o = reshaped(attention_forward(f.q, f.k, f.v, softmax_scale(c), /*causal=*/true, st),
                   {T, B, H * Dv});
    store(f.o);
  }
  // E4  y_attn = o · woᵀ                                            [T, B, D]
  // R   y = x + y_attn  (attention_only: y = y_attn)                [T, B, D]
  f.y = linear_forward(f.o, weight(w, l, "wo"), acc);
  LAGA_ASSERT(f.y.shape == Shape({T, B, D}), "block output {}", shape_str(f.y.shape));
  store(f.y);
  if (!c.attention_only) {
    add_into(f.y, x);
    store(f.y);
  }
  return f;
}

// The keys the sparse forms' attention sees (docs/sparse.md): stage sparse, the selection sel
// [T, B, k] (positions, −1: none) as a [B, T, T] mask; stage warmup, every earlier key (empty).
KeyMask key_mask(const MlaConfig& c, const Array& sel) {
  if (c.indexer_stage == IndexerStage::warmup) return {};
  const int64_t T = sel.shape[0], B = sel.shape[1], k = sel.shape[2];
  KeyMask m(size_t(B * T * T), 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < k; ++i) {
        const double s = sel[(t * B + b) * k + i];
        if (s < 0) continue;
        LAGA_CHECK(s <= double(t), "selection of row {} holds position {}, past its own", t, s);
        m[size_t((b * T + t) * T + int64_t(s))] = 1;
      }
  return m;
}

// DeepSeek's LayerNorm ε, the indexer's k_norm.
constexpr double kIndexNormEps = 1e-6;

// The indexer's RoPE: rotate-half pairs on the first Dr dims of every D_I-vector of x [T, ...,
// D_I].
Array index_rope(const Array& x, const MlaConfig& c, bool backward) {
  MlaConfig half = c;
  half.rope_interleaved = false;
  const Array part = slice_last(x, 0, c.qk_rope_head_dim);
  Array out = x;
  put_last(out, backward ? rope_backward(part, half, 0) : rope_forward(part, half, 0), 0);
  return out;
}

// S3 and S7 of layer l (docs/sparse.md), by the definition, from the layer's forward f: the index
// queries, key and head weights from xn and cqn; the scores I[t, s] over each row's candidates C_t
// (the selection, or every s ≤ t); the target p = the main attention's probabilities summed over
// heads, L1-normalised; L = Σ KL(p ‖ softmax_C I); and the gradient of loss_scale · L into the
// indexer's weights alone (xn and cqn detached). Returns L.
double indexer_layer(const MlaConfig& c, const RefWeights& w, int64_t l, const LayerForward& f,
                     const Array& sel, RefWeights& dw, std::optional<DType> st, double& slack) {
  const int64_t T = f.xn.shape[0], B = f.xn.shape[1], H = c.num_attention_heads;
  const int64_t HI = c.index_n_heads, DI = c.index_head_dim, k = c.topk();
  const int64_t Dl = c.kv_lora_rank + c.qk_rope_head_dim;
  const double wscale = 1 / std::sqrt(double(HI) * double(DI)), scale = softmax_scale(c);
  auto store = [&](Array& a) { round_in_place(a, st); };
  const Accum acc = st ? Accum::f32 : Accum::exact;
  // every sum in fp32 in the plain implementation (st set), as the fast kernels sum
  auto add = [&](double& sum, double v) { sum = st ? F32Sum::add(sum, v) : sum + v; };
  const std::optional<DType> grad_dtype = st ? std::optional<DType>(DType::f32) : std::nullopt;
  auto set_grad = [&](const char* name, Array&& g) {
    round_in_place(g, grad_dtype);
    dw[fmt::format("layers.{}.{}", l, name)] = std::move(g);
  };
  // S3  q^I = rope(cqn·wq_bᵀ) [T, B, HI, DI];  k^I = rope(LayerNorm(xn·wkᵀ)) [T, B, DI];
  //     w^I = xn·weights_projᵀ [T, B, HI]
  Array qraw = reshaped(linear_forward(f.cqn, weight(w, l, "indexer.wq_b"), acc), {T, B, HI, DI});
  store(qraw);
  Array qI = index_rope(qraw, c, false);
  store(qI);
  Array klin = linear_forward(f.xn, weight(w, l, "indexer.wk"), acc);
  store(klin);
  Array kn = layernorm_forward(klin, weight(w, l, "indexer.k_norm"),
                               weight(w, l, "indexer.k_norm_bias"), kIndexNormEps);
  store(kn);
  Array kI = index_rope(kn, c, false);
  store(kI);
  Array wI = linear_forward(f.xn, weight(w, l, "indexer.weights_proj"), acc);
  store(wI);

  auto score = [&](int64_t t, int64_t b, int64_t s) {
    double sum = 0;
    for (int64_t j = 0; j < HI; ++j) {
      double d = 0;
      for (int64_t e = 0; e < DI; ++e)
        add(d, qI[((t * B + b) * HI + j) * DI + e] * kI[(s * B + b) * DI + e]);
      add(sum, wscale * wI[(t * B + b) * HI + j] * std::max(d, 0.0));
    }
    return sum;
  };
  // S4's check: the selection of each row holds min(k, t + 1) distinct earlier keys, and no key
  // left out scores above a key selected — by how much, relative to the row's largest score, is
  // the slack (0 for a selection exact in these scores)
  slack = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b) {
      std::vector<uint8_t> chosen(size_t(t + 1), 0);
      int64_t count = 0;
      for (int64_t i = 0; i < k; ++i)
        if (const double s = sel[(t * B + b) * k + i]; s >= 0 && s <= double(t)) {
          count += chosen[size_t(s)] == 0;
          chosen[size_t(s)] = 1;
        }
      if (count != std::min(k, t + 1)) slack = INFINITY;
      double lo = INFINITY, hi = -INFINITY, mag = 0;
      for (int64_t s = 0; s <= t; ++s) {
        const double v = score(t, b, s);
        mag = std::max(mag, std::abs(v));
        if (chosen[size_t(s)])
          lo = std::min(lo, v);
        else
          hi = std::max(hi, v);
      }
      if (hi > lo) slack = std::max(slack, (hi - lo) / std::max(mag, 1e-300));
    }

  // S7 per row (t, b): candidates, scores, target, KL and dI = loss_scale · (softmax I − p)
  const bool sparse = c.indexer_stage == IndexerStage::sparse;
  Array dq(qI.shape), dwI(wI.shape), dk(kI.shape);
  double loss = 0;
  std::vector<int64_t> cand;
  std::vector<double> I, p, lg;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b) {
      cand.clear();
      if (sparse) {
        for (int64_t i = 0; i < k; ++i)
          if (const double s = sel[(t * B + b) * k + i]; s >= 0) cand.push_back(int64_t(s));
      } else {
        for (int64_t s = 0; s <= t; ++s) cand.push_back(s);
      }
      const size_t n = cand.size();
      I.assign(n, 0), p.assign(n, 0), lg.assign(n, 0);
      // the main attention's P[t, h, s] over the keys it sees (the same candidates), summed over h
      for (int64_t h = 0; h < H; ++h) {
        double mx = -INFINITY;
        for (size_t i = 0; i < n; ++i) {
          double sc = 0;
          for (int64_t j = 0; j < Dl; ++j)
            add(sc, f.q_abs[((t * B + b) * H + h) * Dl + j] * f.latent[(cand[i] * B + b) * Dl + j]);
          lg[i] = scale * sc;
          mx = std::max(mx, lg[i]);
        }
        double z = 0;
        for (size_t i = 0; i < n; ++i) z += std::exp(lg[i] - mx);
        for (size_t i = 0; i < n; ++i) p[i] += std::exp(lg[i] - mx) / z / double(H);
      }
      double psum = 0;
      for (size_t i = 0; i < n; ++i) psum += p[i];
      for (size_t i = 0; i < n; ++i) p[i] /= psum;
      // I[t, s] = Σ_j wscale·w[t, j]·ReLU(q[t, j]·k[s])
      double mx = -INFINITY;
      for (size_t i = 0; i < n; ++i) mx = std::max(mx, I[i] = score(t, b, cand[i]));
      double z = 0;
      for (size_t i = 0; i < n; ++i) z += std::exp(I[i] - mx);
      const double lse = mx + std::log(z);
      for (size_t i = 0; i < n; ++i) {
        if (p[i] > 0) loss += p[i] * (std::log(p[i]) - (I[i] - lse));
        const double dI = c.indexer_loss_scale * (std::exp(I[i] - lse) - p[i]);
        // through I = Σ_j wscale·w_j·ReLU(q_j·k_s)
        for (int64_t j = 0; j < HI; ++j) {
          const int64_t qo = ((t * B + b) * HI + j) * DI, ko = (cand[i] * B + b) * DI;
          double d = 0;
          for (int64_t e = 0; e < DI; ++e) add(d, qI[qo + e] * kI[ko + e]);
          if (d <= 0) continue;
          const double wj = wscale * wI[(t * B + b) * HI + j];
          add(dwI[(t * B + b) * HI + j], dI * wscale * d);
          for (int64_t e = 0; e < DI; ++e) {
            add(dq[qo + e], dI * wj * kI[ko + e]);
            add(dk[ko + e], dI * wj * qI[qo + e]);
          }
        }
      }
    }
  store(dq), store(dwI), store(dk);
  // S3's backward, the indexer's weights alone
  Array dqraw = index_rope(dq, c, true);
  store(dqraw);
  LinearGrads gq = linear_backward(f.cqn, weight(w, l, "indexer.wq_b"),
                                   reshaped(std::move(dqraw), {T, B, HI * DI}), acc);
  set_grad("indexer.wq_b", std::move(gq.dw));
  Array dkn = index_rope(dk, c, true);
  store(dkn);
  LayerNormGrads gln = layernorm_backward(klin, weight(w, l, "indexer.k_norm"), dkn, kIndexNormEps);
  store(gln.dx);
  set_grad("indexer.k_norm", std::move(gln.dw));
  set_grad("indexer.k_norm_bias", std::move(gln.db));
  LinearGrads gk = linear_backward(f.xn, weight(w, l, "indexer.wk"), gln.dx, acc);
  set_grad("indexer.wk", std::move(gk.dw));
  LinearGrads gw = linear_backward(f.xn, weight(w, l, "indexer.weights_proj"), dwI, acc);
  set_grad("indexer.weights_proj", std::move(gw.dw));
  return loss;
}

// Long on purpose: the specification walks layer_forward's steps in reverse, each beside the one it
// differentiates (llm.c's layout), so it reads as one derivation.
// Walks layer_forward in reverse. Returns dx; writes the layer's weight gradients (=) into dw.
Array layer_backward(const MlaConfig& c, const RefWeights& w, int64_t l, const Array& x,
                     const Array& dy, RefWeights& dw, std::optional<DType> st, Core core,
                     const Array* selection, double* indexer_loss, double* slack) {
  const int64_t T = x.shape[0], B = x.shape[1], H = c.num_attention_heads;
  const int64_t Lkv = c.kv_lora_rank, Dn = c.qk_nope_head_dim, Dr = c.qk_rope_head_dim,
                Dv = c.v_head_dim;
  const int64_t Dqk = Dn + Dr;
  const KeyMask mask = selection ? key_mask(c, *selection) : KeyMask();
  const KeyMask* m = mask.empty() ? nullptr : &mask;
  const LayerForward f = layer_forward(c, w, l, x, st, core, m);
  auto store = [&](Array& a) { round_in_place(a, st); };
  const Accum acc = st ? Accum::f32 : Accum::exact;
  // Weight gradients: fp32 whatever the storage dtype (exact when st is empty).
  const std::optional<DType> grad_dtype = st ? std::optional<DType>(DType::f32) : std::nullopt;
  auto set_grad = [&](const char* name, Array&& g) {
    round_in_place(g, grad_dtype);
    dw[fmt::format("layers.{}.{}", l, name)] = std::move(g);
  };

  // R   y = x + y_attn:  dx = dy (the residual), dy_attn = dy       [T, B, D]
  //     (attention_only, y = y_attn: dy_attn = dy, and dx comes from N alone)
  // E4  y_attn = o · woᵀ:  do = dy_attn · wo,  dwo = dy_attnᵀ · o    do [T, B, H·Dv]
  LinearGrads go = linear_backward(f.o, weight(w, l, "wo"), dy, acc);
  store(go.dx);
  set_grad("wo", std::move(go.dw));
  // E3 .. E1 (or A4 .. A2): dq [T, B, H, Dqk] (before RoPEᵀ), dckv [T, B, Lkv], dkpe [T, B, Dr],
  // dwkv_b
  Array dq_heads, dckv, dkpe;
  if (core == Core::absorbed) {
    const Array& wkv_b = weight(w, l, "wkv_b");
    Array dwkv_b(wkv_b.shape);
    // A4  o[h] = o_lat[h] · W_UV[h]ᵀ:  do_lat[h] = do[h] · W_UV[h],  dW_UV[h] = do[h]ᵀ · o_lat[h]
    const Array do4 = reshaped(std::move(go.dx), {T, B, H, Dv});
    Array do_lat({T, B, H, Lkv});
    for (int64_t h = 0; h < H; ++h) {
      LinearGrads g4 = linear_backward(head_slice(f.o_lat, h, 0, Lkv),
                                       rows_of(wkv_b, h * (Dn + Dv) + Dn, Dv, false),
                                       head_slice(do4, h, 0, Dv), acc);
      put_head(do_lat, g4.dx, h, 0);
      put_rows(dwkv_b, g4.dw, h * (Dn + Dv) + Dn, false);
    }
    store(do_lat);
    // A3  attention over the one latent head: dq_abs, dK [T, B, 1, Dl], dV [T, B, 1, Lkv]
    AttentionGrads ga = attention_backward(f.q_abs, f.latent, f.ckv1, do_lat, softmax_scale(c),
                                           /*causal=*/true, st, nullptr, m);
    store(ga.dq), store(ga.dk), store(ga.dv);
    // dlatent = dK + [dV | 0], summed in the dtype of the dlatent partial sums, stored after the
    // (here one-rank) reduce-scatter
    Array dlat = reshaped(std::move(ga.dk), {T, B, Lkv + Dr});
    for (int64_t tb = 0; tb < T * B; ++tb)
      for (int64_t j = 0; j < Lkv; ++j) dlat[tb * (Lkv + Dr) + j] += ga.dv[tb * Lkv + j];
    round_in_place(dlat, st ? std::optional<DType>(c.dlatent_sum_dtype()) : std::nullopt);
    store(dlat);
    dckv = slice_last(dlat, 0, Lkv);
    dkpe = slice_last(dlat, Lkv, Lkv + Dr);
    // A2  q_abs[h] = [q_nope[h] · W_UK[h] | q_pe[h]]:  dq_nope[h] = dq_abs[h] · W_UK[h]ᵀ,
    //     dW_UK[h] = q_nope[h]ᵀ · dq_abs[h],  dq_pe[h] = dq_abs[h][Lkv:]
    dq_heads = Array({T, B, H, Dqk});
    for (int64_t h = 0; h < H; ++h) {
      LinearGrads g2 =
          linear_backward(head_slice(f.q, h, 0, Dn), rows_of(wkv_b, h * (Dn + Dv), Dn, true),
                          head_slice(ga.dq, h, 0, Lkv), acc);
      put_head(dq_heads, g2.dx, h, 0);
      put_head(dq_heads, head_slice(ga.dq, h, Lkv, Lkv + Dr), h, Dn);
      put_rows(dwkv_b, g2.dw, h * (Dn + Dv), true);
    }
    store(dq_heads);
    set_grad("wkv_b", std::move(dwkv_b));
  } else {
    // E3  o = attention(q, k, v): dq, dk, dv by docs/attention.md    [T, B, H, Dqk|Dqk|Dv]
    const bool output_delta = core == Core::per_head_output_delta;
    const Array o_heads = output_delta ? reshaped(f.o, {T, B, H, Dv}) : Array();
    AttentionGrads ga = attention_backward(f.q, f.k, f.v, reshaped(std::move(go.dx), {T, B, H, Dv}),
                                           softmax_scale(c),
                                           /*causal=*/true, st, output_delta ? &o_heads : nullptr);
    store(ga.dq), store(ga.dk), store(ga.dv);

    // E1  k = [k_nope | kpe broadcast]: dk_nope = dk[..., :Dn];  dkpe = Σ_h dk[..., h, Dn:]  [T, B,
    //     Dr] [k_nope | v] = ckv · wkv_bᵀ: dkvb = [dk_nope | dv] per head  [T, B, H, Dn+Dv]
    Array dkvb({T, B, H, Dn + Dv});
    put_last(dkvb, slice_last(ga.dk, 0, Dn), 0);
    put_last(dkvb, ga.dv, Dn);
    dkpe = Array({T, B, Dr});
    for (int64_t tb = 0; tb < T * B; ++tb)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < Dr; ++j) {
          double& d = dkpe[tb * Dr + j];
          d = st ? F32Sum::add(d, ga.dk[(tb * H + h) * Dqk + Dn + j])
                 : d + ga.dk[(tb * H + h) * Dqk + Dn + j];
        }
    store(dkpe);
    LinearGrads gkvb = linear_backward(f.ckv, weight(w, l, "wkv_b"),
                                       reshaped(std::move(dkvb), {T, B, H * (Dn + Dv)}), acc);
    store(gkvb.dx);
    set_grad("wkv_b", std::move(gkvb.dw));  // dckv = gkvb.dx  [T, B, Lkv]
    dq_heads = std::move(ga.dq);
    dckv = std::move(gkvb.dx);
  }

  // S3, S7  the lightning indexer (the sparse forms): its loss and its weights' gradients, its
  // inputs xn and cqn detached
  if (selection) {
    *indexer_loss = indexer_layer(c, w, l, f, *selection, dw, st, *slack);
  } else if (c.has_indexer()) {  // a dense form ignores the indexer: its gradient is zero
    for (const char* name : {"indexer.wq_b", "indexer.wk", "indexer.k_norm", "indexer.k_norm_bias",
                             "indexer.weights_proj"})
      set_grad(name, Array(weight(w, l, name).shape));
  }

  // L6  kpe = rope(kv[..., Lkv:]):  dkv[..., Lkv:] = ropeᵀ(dkpe)
  // L5  ckv = rmsnorm(kv[..., :Lkv]; kv_norm):  dkv[..., :Lkv], dkv_norm
  Array dkv({T, B, Lkv + Dr});
  put_last(dkv, rope_backward(dkpe, c, 0), Lkv);
  RmsNormGrads gkvn = rmsnorm_backward(slice_last(f.kv, 0, Lkv), weight(w, l, "kv_norm"), dckv,
                                       c.rms_norm_eps, acc);
  put_last(dkv, gkvn.dx, 0);
  store(dkv);
  set_grad("kv_norm", std::move(gkvn.dw));
  // L4  kv = xn · wkv_aᵀ:  dxn = dkv · wkv_a,  dwkv_a = dkvᵀ · xn    dxn [T, B, D]
  LinearGrads gkva = linear_backward(f.xn, weight(w, l, "wkv_a"), dkv, acc);
  set_grad("wkv_a", std::move(gkva.dw));
  Array dxn = std::move(gkva.dx);
  store(dxn);

  // L3  q_pe ← rope(q_pe):  dq_pe(before rope) = ropeᵀ(dq[..., Dn:]); dq_nope passes through
  Array dq = dq_heads;  // [T, B, H, Dqk]
  put_last(dq, rope_backward(slice_last(dq_heads, Dn, Dqk), c, 0), Dn);
  store(dq);
  dq = reshaped(std::move(dq), {T, B, H * Dqk});
  if (c.q_lora_rank > 0) {
    // L3  q = cqn · wq_bᵀ:  dcqn = dq · wq_b,  dwq_b = dqᵀ · cqn     dcqn [T, B, Lq]
    LinearGrads gqb = linear_backward(f.cqn, weight(w, l, "wq_b"), dq, acc);
    store(gqb.dx);
    set_grad("wq_b", std::move(gqb.dw));
    // L2  cqn = rmsnorm(cq; q_norm):  dcq, dq_norm                  dcq [T, B, Lq]
    RmsNormGrads gqn = rmsnorm_backward(f.cq, weight(w, l, "q_norm"), gqb.dx, c.rms_norm_eps, acc);
    store(gqn.dx);
    set_grad("q_norm", std::move(gqn.dw));
    // L1  cq = xn · wq_aᵀ:  dxn += dcq · wq_a,  dwq_a = dcqᵀ · xn
    LinearGrads gqa = linear_backward(f.xn, weight(w, l, "wq_a"), gqn.dx, acc);
    set_grad("wq_a", std::move(gqa.dw));
    add_into(dxn, gqa.dx);
    store(dxn);
  } else {
    // L3' q = xn · wqᵀ:  dxn += dq · wq,  dwq = dqᵀ · xn
    LinearGrads gq = linear_backward(f.xn, weight(w, l, "wq"), dq, acc);
    set_grad("wq", std::move(gq.dw));
    add_into(dxn, gq.dx);
    store(dxn);
  }

  // N   attention_only, xn = x:  dx = dxn
  if (c.attention_only) return dxn;
  // N   xn = rmsnorm(x; attn_norm):  dx = dy + rmsnormᵀ(dxn), dattn_norm
  RmsNormGrads gn = rmsnorm_backward(x, weight(w, l, "attn_norm"), dxn, c.rms_norm_eps, acc);
  store(gn.dx);
  set_grad("attn_norm", std::move(gn.dw));
  Array dx = dy;
  add_into(dx, gn.dx);
  store(dx);
  return dx;
}

void check_input(const MlaConfig& c, const Array& x, const char* name) {
  LAGA_CHECK(x.shape.size() == 3 && x.shape[2] == c.hidden_size, "{} {} must be [T, B, D = {}]",
             name, shape_str(x.shape), c.hidden_size);
}

void check_selection(const MlaConfig& c, const Array& x, Core core,
                     const std::vector<Array>* selection) {
  if (!selection) return;
  LAGA_CHECK(core == Core::absorbed && c.has_indexer(),
             "the sparse block runs the absorbed order with an indexer");
  LAGA_CHECK(int64_t(selection->size()) == c.num_layers, "{} layers of selections for {} layers",
             selection->size(), c.num_layers);
  for (const Array& s : *selection)
    LAGA_CHECK(s.shape == Shape({x.shape[0], x.shape[1], c.topk()}),
               "selection {} must be [T, B, k] = [{}, {}, {}]", shape_str(s.shape), x.shape[0],
               x.shape[1], c.topk());
}

const Array* layer_selection(const std::vector<Array>* selection, int64_t l) {
  return selection ? &(*selection)[size_t(l)] : nullptr;
}

}  // namespace

RefWeights from_weights(const Weights& w) {
  RefWeights r;
  w.for_each([&](const std::string& name, const Tensor& t) { r[name] = from_tensor(t); });
  return r;
}

Array block_forward(const MlaConfig& c, const RefWeights& w, const Array& x,
                    std::optional<DType> storage, Core core, const std::vector<Array>* selection) {
  check_input(c, x, "x");
  check_selection(c, x, core, selection);
  Array h = x;  // [T, B, D], the residual stream (attention_only: each layer's output alone)
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const Array* sel = layer_selection(selection, l);
    const KeyMask mask = sel ? key_mask(c, *sel) : KeyMask();
    h = layer_forward(c, w, l, h, storage, core, mask.empty() ? nullptr : &mask).y;
  }
  return h;
}

BlockGrads block_backward(const MlaConfig& c, const RefWeights& w, const Array& x, const Array& dy,
                          std::optional<DType> storage, Core core,
                          const std::vector<Array>* selection) {
  check_input(c, x, "x");
  check_selection(c, x, core, selection);
  LAGA_CHECK(dy.shape == x.shape, "dy {} must match x {}", shape_str(dy.shape), shape_str(x.shape));
  // Each layer's input, to recompute its forward in backward: inputs[l] [T, B, D].
  std::vector<Array> inputs{x};
  for (int64_t l = 0; l + 1 < c.num_layers; ++l) {
    const Array* sel = layer_selection(selection, l);
    const KeyMask mask = sel ? key_mask(c, *sel) : KeyMask();
    inputs.push_back(
        layer_forward(c, w, l, inputs.back(), storage, core, mask.empty() ? nullptr : &mask).y);
  }
  BlockGrads g;
  if (selection) {
    g.indexer_loss.assign(size_t(c.num_layers), 0.0);
    g.selection_slack.assign(size_t(c.num_layers), 0.0);
  }
  Array d = dy;  // [T, B, D], the gradient of the residual stream
  for (int64_t l = c.num_layers - 1; l >= 0; --l)
    d = layer_backward(c, w, l, inputs[size_t(l)], d, g.dw, storage, core,
                       layer_selection(selection, l),
                       selection ? &g.indexer_loss[size_t(l)] : nullptr,
                       selection ? &g.selection_slack[size_t(l)] : nullptr);
  g.dx = std::move(d);
  return g;
}

}  // namespace laga::ref
