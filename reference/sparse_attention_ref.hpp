// fp64 reference sparse latent attention (ops/sparse_attention.hpp) by the definition: each query
// row (t, b) attends with its H heads to its own candidate key rows of one shared latent head,
//   o[t, h] = Σ_{s ∈ S_t} softmax_s(scale · q[t, h] · kv[s]) · kv[s, :Dv],
// S_t the valid entries of idx[t, b, :] in order (−1: none), or, without idx, every key row
// s ≤ q_pos0 + t. Plus the backward (dq, dkv, V's gradient added onto kv's first Dv columns) and
// the head-averaged probabilities the indexer's loss takes as its target. Plain loops, one query
// row at a time; no tiling, no online softmax.
//
// `storage` (empty: exact fp64) emulates a plain implementation in that dtype, as
// reference/attention_ref.hpp does: sums accumulate in fp32, P is rounded to the storage dtype
// before P·V and Pᵀ·dO, dS before dS·K and dSᵀ·Q. Outputs are left unrounded.
#pragma once

#include <cstdint>
#include <optional>

#include "reference/array.hpp"

namespace laga::ref {

// Which key rows each query row attends to.
struct SparseSelection {
  const int32_t* idx = nullptr;  // [Tq, B, topk], −1 = none; null: every s ≤ q_pos0 + t
  int64_t topk = 0;
  int64_t q_pos0 = 0;
};

struct SparseAttentionOut {
  Array o;    // [Tq, B, H, Dv]
  Array lse;  // [B, H, Tq] natural log; −inf for a row without keys
};
// q [Tq, B, H, Dqk], kv [Tk, B, Dqk]; V = kv's first Dv columns.
SparseAttentionOut sparse_attention_forward(const Array& q, const Array& kv, int64_t Dv,
                                            const SparseSelection& sel, double scale,
                                            std::optional<DType> storage = std::nullopt);

struct SparseAttentionGrads {
  Array dq;   // [Tq, B, H, Dqk]
  Array dkv;  // [Tk, B, Dqk]
};
// dout [Tq, B, H, Dv]. o (optional): the forward's output; given, delta = rowsum(dO ∘ O) as
// FlashAttention's backward takes it, else Σ_s p_s dp_s of the row itself.
SparseAttentionGrads sparse_attention_backward(const Array& q, const Array& kv, int64_t Dv,
                                               const SparseSelection& sel, const Array& dout,
                                               double scale,
                                               std::optional<DType> storage = std::nullopt,
                                               const Array* o = nullptr);

// p[t, b, ·] = Σ_h softmax_s(scale · q[t, h] · kv[s]) / H for rows [t0, t1): with idx [t1 − t0, B,
// topk] in idx's order (0 at −1), without idx [t1 − t0, B, Tk] at column s (0 past the row).
Array sparse_head_probs(const Array& q, const Array& kv, const SparseSelection& sel, double scale,
                        int64_t t0, int64_t t1);

}  // namespace laga::ref
