// The lightning indexer of DeepSeek Sparse Attention (docs/sparse.md): index scores fused over the
// index heads, the causal top-k selection of each query row, and the indexer's KL loss with its
// gradient. It does not hold the projections (wq_b, wk, k_norm, weights_proj: the sparse forms run
// them as linear layers) nor the main attention (ops/sparse_attention.hpp).
//
//   I[t, s] = Σ_j w_scale · w[t, j] · ReLU(q[t, j] · k[s])      over key rows s ≤ pos(t)
//
// Keys are in position order: key row s holds global position s (the whole sequence, gathered).
// Query row t holds position q_pos0 + t. Every score is computed in one fixed order — each dot
// product over D in a fixed lane order, the heads summed j = 0 .. H−1 — whatever the tiling, the
// thread count or the rows a call holds, so a row's scores, and so its selection, are bitwise the
// same for any split of the queries (ranks, threads, tiles). Nothing [Tq, Tk] is ever allocated.
//
// Every buffer comes from the current MemoryTracker under a tag starting with "indexer.", with
// sizes from the params alone (never the thread count), allocated before any data is read: on a
// meta tracker (meta_mode) the ops allocate and record their work, then return. Both run on the
// caller's OpenMP threads; results are bitwise independent of the thread count.
#pragma once

#include <cstdint>

#include "laga/core/dtype.hpp"
#include "laga/core/tensor.hpp"

namespace laga {

struct IndexerParams {
  int64_t B = 1;
  int64_t Tq = 0;            // query rows
  int64_t Tk = 0;            // key rows: positions 0 .. Tk−1
  int64_t q_pos0 = 0;        // position of query row 0; q_pos0 + Tq ≤ Tk
  int64_t H = 0, D = 0;      // index heads H_I, head dim D_I
  DType dtype = DType::f32;  // storage of q, w, k
  float w_scale = 1.0f;      // H_I^-1/2 · D_I^-1/2 (ModelDims::indexer_weight_scale)
  const void* q = nullptr;   // [Tq, B, H, D] after RoPE, dense
  const void* w = nullptr;   // [Tq, B, H] weights_proj(x̂), dense
  const void* k = nullptr;   // [Tk, B, D] after LayerNorm and RoPE, dense
};

// Names what is wrong (sizes, positions, pointers); the ops call it.
void check_indexer_params(const IndexerParams& p);

// The selection S_t of every query row: idx [Tq, B, topk] int32 (=), the key rows of the topk
// largest scores among s ≤ q_pos0 + t, ties to the lower position, listed in ascending order; a
// row with fewer candidates lists all of them, then −1. scores (may be null) [Tq, B, topk] fp32
// (=): the selected keys' scores I[t, s], in idx's order, −inf at −1. Key tile by key tile with a
// running top-k per row.
void indexer_topk(const IndexerParams& p, int64_t topk, int32_t* idx, float* scores);

// The indexer's loss over query rows [0, Tq) and its gradient. Each row t has its candidates C_t:
// the selection idx [Tq, B, topk] (the sparse stage; −1 entries are none), or, when idx is null,
// every key row s ≤ q_pos0 + t (the warmup stage). target [Tq, B, C] fp32 is the main attention's
// head-summed probabilities p[t, s] over C_t (C = topk with idx, in idx's order; C = Tk without, at
// column s; entries outside C_t are not read), L1-normalised here. Returns
//   L = Σ_{t, b} KL(p[t, ·] ‖ softmax_{s ∈ C_t} I[t, ·])
// and, with dI = loss_scale · (softmax(I) − p) over C_t, adds its gradient into fp32 accumulators:
// dq [Tq, B, H, D], dw [Tq, B, H] (of w as stored, before w_scale) and dk [Tk, B, D] (+=). dk's sum
// over the query rows runs in one fixed order per key (bitwise independent of the thread count).
struct IndexerLossParams : IndexerParams {
  int64_t topk = 0;               // C with idx
  const int32_t* idx = nullptr;   // [Tq, B, topk] or null (every s ≤ position)
  const float* target = nullptr;  // [Tq, B, C] fp32
  float loss_scale = 1.0f;
  float* dq = nullptr;  // [Tq, B, H, D] fp32 (+=)
  float* dw = nullptr;  // [Tq, B, H] fp32 (+=)
  float* dk = nullptr;  // [Tk, B, D] fp32 (+=)
};
double indexer_loss(const IndexerLossParams& p);

// FLOPs of the scores of one call over its causal candidates (2·H·D per (t, s) pair, s ≤ position):
// what indexer_topk computes once and indexer_loss recomputes (and twice more for its gradient).
double indexer_score_flops(const IndexerParams& p);

}  // namespace laga
