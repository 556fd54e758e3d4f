// The eager attention kernel, PyTorch-math style: the scores and probabilities of every head are
// materialised as [B, Hq, T, T] tensors, and the probabilities are saved for backward. Products are
// whole-head oneDNN matmuls (one call per head, each on all threads); the masked half of a causal
// product is computed and discarded, as PyTorch does. Each K/V head is first packed into a dense
// [T, Dqk + Dv] tile (attn.kv_head), shared by its group's query heads: oneDNN's summation order
// depends on an operand's row stride, so a form that holds K and V head by head (laga-recompute's
// backward) gets the same bits as one that holds every head (measured: verify, eager fp32 at P 1).
// Row softmax and its backward are vectorised. It holds no tiling and no online softmax
// (attention_fused.cpp does). Forward equations and the derived backward: docs/attention.md §1–§2.
#include "attention_internal.hpp"
#include "laga/ops/matmul.hpp"

namespace laga::attn {

namespace {

// One product per head, C (=, or += when accumulate) = alpha · A B, each on all threads (oneDNN's
// strided single products run faster here than its head-batched ones).
void product(int64_t M, int64_t N, int64_t K, DType ab, DType c_dtype, const void* a, int64_t a_m,
             int64_t a_k, const void* b, int64_t b_k, int64_t b_n, void* c, int64_t c_m,
             float alpha, bool accumulate) {
  MatmulParams mp;
  mp.M = M, mp.N = N, mp.K = K;
  mp.ab_dtype = ab, mp.c_dtype = c_dtype, mp.alpha = alpha, mp.accumulate = accumulate;
  mp.a = a, mp.a_m_stride = a_m, mp.a_k_stride = a_k;
  mp.b = b, mp.b_k_stride = b_k, mp.b_n_stride = b_n;
  mp.c = c, mp.c_m_stride = c_m, mp.c_n_stride = 1;
  matmul(mp);
}

// kv[t, :] = [k[t, b, hk, :] | v[t, b, hk, :]]: head hk's K and V as one dense [T, Dqk + Dv] tile.
template <class T>
void pack_kv_head(const AttentionFwdParams& p, int64_t b, int64_t hk, T* kv) {
  const int64_t W = p.Dqk + p.Dv;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < p.T; ++t) {
    std::memcpy(kv + t * W, at<T>(p.k, p.k_stride, t, b, hk), p.Dqk * sizeof(T));
    std::memcpy(kv + t * W + p.Dqk, at<T>(p.v, p.v_stride, t, b, hk), p.Dv * sizeof(T));
  }
}

// P = softmax(S) row by row, masked entries 0. S [B, Hq, T, T] fp32 (overwritten), P like S in T.
template <class T>
void softmax_rows(const AttentionFwdParams& p, float* s, T* probs) {
  const int64_t rows = p.B * p.Hq * p.T, n_all = p.T;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % p.T, n = p.causal ? t + 1 : n_all;
    float* x = s + r * p.T;
    const float m = row_max(x, n) * kLog2e;
    const float inv = 1.0f / row_exp2(x, x, n, n_all, kLog2e, m);
    scale_row(x, probs + r * p.T, n_all, inv);
  }
}

// dS = P∘(dP − rowsum(P∘dP)), masked entries 0. dP [B, Hq, T, T] fp32; dS like P in T (may alias dP
// when T is float).
template <class T>
void softmax_grad_rows(const AttentionFwdParams& p, const T* probs, const float* dprobs,
                       T* dscores) {
  const int64_t rows = p.B * p.Hq * p.T;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % p.T, n = p.causal ? t + 1 : p.T;
    const T* pr = probs + r * p.T;
    const float* dp = dprobs + r * p.T;
    T* ds = dscores + r * p.T;
    softmax_grad_row(pr, dp, ds, n, dot_row(pr, dp, n));
    zero_row(ds + n, p.T - n);
  }
}

// out[t, b, hk, :] = mul · acc[b, hk, t, :] for an fp32 accumulator [B, Hkv, T, D].
template <class T>
void store_acc(const AttentionFwdParams& p, const float* acc, void* out, const AttentionStrides& s,
               int64_t D, float mul) {
  const int64_t rows = p.B * p.Hkv * p.T;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % p.T, bh = r / p.T, b = bh / p.Hkv, hk = bh % p.Hkv;
    scale_row(acc + r * D, at<T>(out, s, t, b, hk), D, mul);
  }
}

template <class T>
AttentionSaved forward(const AttentionFwdParams& p) {
  MemoryPlanWalker plan(attention_memory_events(Kernel::eager, p, false));
  const int64_t g = p.Hq / p.Hkv, T_ = p.T, TT = p.T * p.T;
  const DType dt = p.dtype, f32 = DType::f32;
  const int64_t W = p.Dqk + p.Dv;
  Tensor kv = plan.allocate("attn.kv_head");  // [T, Dqk + Dv] one K/V head, dense
  T* const k_h = kv.data<T>();
  T* const v_h = k_h + p.Dqk;
  Tensor scores = plan.allocate("attn.scores");  // [B, Hq, T, T] fp32, scale · q kᵀ
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t hk = 0; hk < p.Hkv; ++hk) {
      pack_kv_head<T>(p, b, hk, k_h);
      for (int64_t h = hk * g; h < (hk + 1) * g; ++h)  // S = scale · Q Kᵀ
        product(T_, T_, p.Dqk, dt, f32, at<T>(p.q, p.q_stride, 0, b, h), p.q_stride.t, 1, k_h, 1, W,
                scores.data<float>() + (b * p.Hq + h) * TT, T_, p.scale, false);
    }
  AttentionSaved saved;
  saved.probs = plan.allocate("attn.probs");  // [B, Hq, T, T] storage dtype
  softmax_rows<T>(p, scores.data<float>(), saved.probs.data<T>());
  plan.release("attn.scores", scores);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t hk = 0; hk < p.Hkv; ++hk) {
      pack_kv_head<T>(p, b, hk, k_h);
      for (int64_t h = hk * g; h < (hk + 1) * g; ++h)  // O = P V
        product(T_, p.Dv, T_, dt, dt, saved.probs.data<T>() + (b * p.Hq + h) * TT, T_, 1, v_h, W, 1,
                at<T>(p.o, p.o_stride, 0, b, h), p.o_stride.t, 1.0f, false);
    }
  plan.release("attn.kv_head", kv);
  plan.finish();
  return saved;
}

template <class T>
void backward(const AttentionBwdParams& p, const AttentionSaved& saved) {
  MemoryPlanWalker plan(attention_memory_events(Kernel::eager, p, true));
  const int64_t g = p.Hq / p.Hkv, T_ = p.T, TT = p.T * p.T;
  const DType dt = p.dtype, f32 = DType::f32;
  const T* probs = saved.probs.data<T>();  // [B, Hq, T, T]
  const int64_t W = p.Dqk + p.Dv;
  Tensor kv = plan.allocate("attn.kv_head");  // [T, Dqk + Dv] one K/V head, dense
  T* const k_h = kv.data<T>();
  T* const v_h = k_h + p.Dqk;
  Tensor dprobs = plan.allocate("attn.dprobs");  // [B, Hq, T, T] fp32
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t hk = 0; hk < p.Hkv; ++hk) {
      pack_kv_head<T>(p, b, hk, k_h);
      for (int64_t h = hk * g; h < (hk + 1) * g; ++h)  // O = P V  ⇒  dP = dO Vᵀ
        product(T_, T_, p.Dv, dt, f32, at<T>(p.dout, p.dout_stride, 0, b, h), p.dout_stride.t, 1,
                v_h, 1, W, dprobs.data<float>() + (b * p.Hq + h) * TT, T_, 1.0f, false);
    }
  // P = softmax(S)  ⇒  dS = P∘(dP − rowsum(P∘dP)); in place over dP in fp32.
  constexpr bool low = !std::is_same_v<T, float>;
  Tensor dscores = low ? plan.allocate("attn.dscores") : dprobs;  // [B, Hq, T, T] storage dtype
  softmax_grad_rows<T>(p, probs, dprobs.data<float>(), dscores.data<T>());
  if (low) plan.release("attn.dprobs", dprobs);
  const T* ds = dscores.data<T>();
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t hk = 0; hk < p.Hkv; ++hk) {
      pack_kv_head<T>(p, b, hk, k_h);
      for (int64_t h = hk * g; h < (hk + 1) * g; ++h)  // S = scale · Q Kᵀ  ⇒  dQ = scale · dS K
        product(T_, p.Dqk, T_, dt, dt, ds + (b * p.Hq + h) * TT, T_, 1, k_h, W, 1,
                at<T>(p.dq, p.dq_stride, 0, b, h), p.dq_stride.t, p.scale, false);
    }
  plan.release("attn.kv_head", kv);
  // dK = scale · Σ_u dS_uᵀ Q_u and dV = Σ_u P_uᵀ dO_u over the group's heads h = hk·g + u: straight
  // into dk, dv when g = 1, else summed in fp32 accumulators [B, Hkv, T, D].
  Tensor dk_acc, dv_acc;
  if (g > 1) {
    dk_acc = plan.allocate("attn.dk_acc");  // [B, Hkv, T, Dqk] fp32
    dv_acc = plan.allocate("attn.dv_acc");  // [B, Hkv, T, Dv] fp32
  }
  auto key_side = [&](const T* tt, const void* x, const AttentionStrides& xs, int64_t D, void* out,
                      const AttentionStrides& os, Tensor& acc, float alpha) {
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t hk = 0; hk < p.Hkv; ++hk)
        for (int64_t u = 0; u < g; ++u) {  // [T_k, T_q] (the square read transposed) · [T_q, D]
          const int64_t h = hk * g + u;
          const T* a = tt + (b * p.Hq + h) * TT;
          const T* xb = at<T>(x, xs, 0, b, h);
          if (g == 1)
            product(T_, D, T_, dt, dt, a, 1, T_, xb, xs.t, 1, at<T>(out, os, 0, b, hk), os.t, alpha,
                    false);
          else
            product(T_, D, T_, dt, f32, a, 1, T_, xb, xs.t, 1,
                    acc.data<float>() + (b * p.Hkv + hk) * T_ * D, D, alpha, u > 0);
        }
  };
  key_side(ds, p.q, p.q_stride, p.Dqk, p.dk, p.dk_stride, dk_acc, p.scale);
  key_side(probs, p.dout, p.dout_stride, p.Dv, p.dv, p.dv_stride, dv_acc, 1.0f);
  if (g > 1) {
    store_acc<T>(p, dk_acc.data<float>(), p.dk, p.dk_stride, p.Dqk, 1.0f);
    store_acc<T>(p, dv_acc.data<float>(), p.dv, p.dv_stride, p.Dv, 1.0f);
    plan.release("attn.dv_acc", dv_acc);
    plan.release("attn.dk_acc", dk_acc);
  }
  if (low) {
    plan.release("attn.dscores", dscores);
  } else {
    dscores = Tensor();  // the same storage as dprobs
    plan.release("attn.dprobs", dprobs);
  }
  plan.finish();
}

}  // namespace

AttentionSaved eager_forward(const AttentionFwdParams& p) {
  return dispatch_dtype(
      p.dtype, [&](auto* tag) { return forward<std::remove_pointer_t<decltype(tag)>>(p); });
}

void eager_backward(const AttentionBwdParams& p, const AttentionSaved& saved) {
  dispatch_dtype(p.dtype,
                 [&](auto* tag) { backward<std::remove_pointer_t<decltype(tag)>>(p, saved); });
}

}  // namespace laga::attn
