// fp64 reference of the lightning indexer (ops/indexer.hpp) and of LayerNorm (ops/layernorm.hpp):
// plain loops by the definitions of docs/sparse.md, the specification the fast kernels are tested
// against. Nothing is tiled or fused; the scores are a whole [Tq, B, Tk] array.
#pragma once

#include <cstdint>
#include <vector>

#include "reference/array.hpp"

namespace laga::ref {

// I [Tq, B, Tk]: I[t, b, s] = Σ_j w_scale · w[t, b, j] · ReLU(q[t, b, j] · k[s, b]) for s ≤
// q_pos0 + t, −inf beyond. q [Tq, B, H, D], w [Tq, B, H], k [Tk, B, D].
Array indexer_scores(const Array& q, const Array& w, const Array& k, double w_scale,
                     int64_t q_pos0);

// The top-k of each row of I by the definition: its candidates sorted by score (larger first,
// ties to the lower position), the first topk kept and listed by ascending position, −1 after a
// row's candidates run out. idx [Tq, B, topk]; scores [Tq, B, topk] their scores (−inf at −1).
struct IndexerSelection {
  std::vector<int32_t> idx;
  Array scores;
};
IndexerSelection indexer_topk(const Array& I, int64_t topk);

// L = Σ_{t, b} KL(p ‖ softmax_{C_t} I) with p the target L1-normalised over C_t, and the gradients
// of loss_scale · L. C_t is idx's row (−1 entries none; target [Tq, B, topk] in idx's order) or,
// when idx is null, every s ≤ q_pos0 + t (target [Tq, B, Tk] at column s). A row without target
// mass contributes nothing.
struct IndexerLoss {
  double loss = 0;
  Array dq, dw, dk;
};
IndexerLoss indexer_loss(const Array& q, const Array& w, const Array& k, double w_scale,
                         int64_t q_pos0, const std::vector<int32_t>* idx, int64_t topk,
                         const Array& target, double loss_scale);

// y = (x − mean) / sqrt(var + eps) · w + b over the last dim C (biased variance); x [..., C].
Array layernorm_forward(const Array& x, const Array& w, const Array& b, double eps);
struct LayerNormGrads {
  Array dx, dw, db;
};
LayerNormGrads layernorm_backward(const Array& x, const Array& w, const Array& dy, double eps);

}  // namespace laga::ref
