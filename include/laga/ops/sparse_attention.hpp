// Sparse latent attention (DeepSeek Sparse Attention's main attention in MQA mode, docs/sparse.md):
// every query row attends to its own selected key rows of one shared latent head,
//   o[t, h] = Σ_{s ∈ S_t} softmax_s(scale · q[t, h] · kv[s]) · kv[s, :Dv]
// with q the absorbed query [q_nope·W_UK | q_pe] (Dqk = Lkv + Dr = 576 at DeepSeek's dims) and kv
// the latent [c^KV | k_pe] (V = its first Dv = Lkv columns, read in place). Forward saves o and the
// log-sum-exp; backward recomputes the probabilities over S_t. And the head-summed probabilities
// the indexer's loss takes as its target.
//
// Layout: sequence-first and dense; key row s holds global position s. S_t comes as idx
// [Tq, B, topk] int32 key rows (−1: none; ops/indexer.hpp's indexer_topk writes it). Every buffer
// comes from the current MemoryTracker under a tag starting with "attn.", sizes from the params
// alone (never the thread count), allocated before any data is read: on a meta tracker (meta_mode)
// the ops allocate and record their work, then return. Results are bitwise reproducible and
// independent of the thread count: each query row's arithmetic runs in one fixed order, and the
// backward's dkv sums over query rows in one fixed order per key row (no atomics).
#pragma once

#include <cstdint>

#include "laga/ops/attention.hpp"

namespace laga {

struct SparseAttentionParams {
  int64_t B = 1;
  int64_t Tq = 0, Tk = 0;    // query rows, key rows
  int64_t q_pos0 = 0;        // position of query row 0: row t selects at most
                             //   min(topk, q_pos0 + t + 1) keys, all at positions ≤ its own
  int64_t H = 0;             // query heads sharing the one latent head
  int64_t Dqk = 0, Dv = 0;   // Lkv + Dr and Lkv (Dv ≤ Dqk)
  int64_t topk = 0;          // idx's row width
  DType dtype = DType::f32;  // storage of q, kv, o (and dout, dq in backward)
  float scale = 1.0f;        // softmax scale, > 0
  const void* q = nullptr;   // [Tq, B, H, Dqk]
  const void* kv = nullptr;  // [Tk, B, Dqk]; V = its first Dv columns
  // [Tq, B, topk]: key rows in [0, Tk), −1 = none; or null: every key row s ≤ q_pos0 + t (a dense
  // causal attention of these query rows over all earlier keys: the warmup stage, and any P)
  const int32_t* idx = nullptr;
  void* o = nullptr;  // [Tq, B, H, Dv] (=)
};

struct SparseAttentionBwdParams : SparseAttentionParams {
  const void* dout = nullptr;    // [Tq, B, H, Dv]
  void* dq = nullptr;            // [Tq, B, H, Dqk] (=)
  void* dkv = nullptr;           // [Tk, B, Dqk] (=): dK, with dV added onto its first Dv columns
  DType dkv_dtype = DType::f32;  // the storage dtype or fp32, rounded once from fp32 sums
  // dkv (fp32) holds the sums of earlier query rows (a call over the rows before these, in the
  // same order): this call's rows are added onto them (+=), one row after another as a single
  // call over all the rows adds them, so calls over consecutive row blocks give that call's bits.
  bool dkv_accumulate = false;
};

// Names what is wrong (sizes, scale, pointers); the ops call it.
void check_sparse_attention_params(const SparseAttentionParams& p);
void check_sparse_attention_params(const SparseAttentionBwdParams& p);

// o (=) and the saved log-sum-exp (AttentionSaved::lse, [B, H, Tq] fp32, tag "attn.lse"). A row
// with no key (only −1) gets o = 0 and lse = −inf.
AttentionSaved sparse_attention_forward(const SparseAttentionParams& p);
// p.o must hold forward's output (for rowsum(dO∘O)); saved is forward's.
void sparse_attention_backward(const SparseAttentionBwdParams& p, const AttentionSaved& saved);

// The indexer's target: for query rows [t0, t1) and each of their candidates, p[t, s] =
// Σ_h P[t, h, s] / H, P the probabilities of an attention whose log-sum-exp is lse [B, H, Tq]
// (fp32, over all Tq rows of p.q). With p.idx: the candidates are the selection, out [t1−t0, B,
// topk] in idx's order (0 at −1). Without (p.idx null): every key row s ≤ p.q_pos0 + t (a causal
// dense attention over the same q and kv: the warmup stage), out [t1−t0, B, Tk] at column s (0 past
// the row's position). fp32 (=). Parallel over the rows.
void attention_head_probs(const SparseAttentionParams& p, const Tensor& lse, int64_t t0, int64_t t1,
                          float* out);

// FLOPs by FlashAttention-3's convention over the selected keys: forward 2·B·H·Σ_t |S_t|·(Dqk +
// Dv) with |S_t| = min(topk, q_pos0 + t + 1) (q_pos0 + t + 1 without idx); backward 2.5× forward.
double sparse_attention_forward_flops(const SparseAttentionParams& p);

}  // namespace laga
