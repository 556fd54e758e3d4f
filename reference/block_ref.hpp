// fp64 reference of the MLA block stack, y = x + MLA(RMSNorm(x)) per layer, or y = MLA(x) with
// attention_only (docs/design.md §2.1–§2.2, explicit form, one rank), forward and backward, written
// from the equations — the specification every form and rank count is checked against.
//
// `storage` (default: none) picks what is computed. None: the exact fp64 reference (the truth).
// A dtype: the "plain implementation in the same precision" — the same loops, but every sum
// accumulated in fp32, every tensor the fast explicit form stores (activations, activation
// gradients, attention's P and dS) rounded to that dtype where the fast code writes it, and every
// weight gradient rounded to fp32 (laga keeps weight gradients in fp32, Megatron's main-grad
// convention). Its error against the exact reference is the baseline that judges the explicit form
// (verify/compare.hpp). The list of rounded tensors is at the top of block_ref.cpp.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "laga/mla/config.hpp"
#include "laga/mla/weights.hpp"
#include "reference/array.hpp"

namespace laga::ref {

// Keyed "layers.{l}.<name>" as in Weights::for_each.
using RefWeights = std::map<std::string, Array>;

// Which association order the attention core follows. per_head: explicit's (E1–E3: per-head k and v
// up-projected from the latent, attention per head) — the specification. absorbed: the absorbed
// forms' (A2–A4 of docs/design.md §2.3: W_UK folded into the query, one attention over the shared
// latent K = [ckv | kpe], V = ckv, W_UV applied to its output). The same function in exact
// arithmetic (the tests check the two agree to fp64 rounding); with `storage` set, absorbed is the
// plain same-precision implementation of the absorbed forms, rounding q_abs, o_lat, do_lat, dq_abs,
// dK, dV and dlatent (in the dlatent-sum dtype, then storage) where they store them, so the
// absorbed forms are judged against a plain implementation of their own computation
// (verify/compare.hpp). per_head_output_delta: per_head whose attention backward takes each row's
// delta as FlashAttention's does, rowsum(dO ∘ O) over the stored output, instead of Σ P∘dP over the
// row's own P and dP: the plain implementation of the order every fused kernel and ring hop follows
// (a hop sees only some keys of a row, so only the output gives it the row's delta).
enum class Core { per_head, absorbed, per_head_output_delta };
RefWeights from_weights(const Weights& w);

// x [T, B, D] -> y [T, B, D], over c.num_layers layers.
//
// `selection` (per layer [T, B, k], positions, −1: none) makes it the sparse forms' block
// (docs/sparse.md), in the absorbed order: its attention sees, per query row, the selected keys
// (stage sparse) or every earlier key (stage warmup), and backward adds the lightning indexer's
// loss and its gradient, which reaches the indexer's weights alone. The selection is given, not
// recomputed: a near-tie among index scores may fall either way in another precision, and what is
// checked here is the computation given the selection (verify checks the selection itself against
// the exact scores). Without one, a model's indexer weights get a zero gradient (a dense form
// ignores the indexer).
Array block_forward(const MlaConfig& c, const RefWeights& w, const Array& x,
                    std::optional<DType> storage = std::nullopt, Core core = Core::per_head,
                    const std::vector<Array>* selection = nullptr);

struct BlockGrads {
  Array dx;                          // [T, B, D]
  RefWeights dw;                     // same keys as the weights
  std::vector<double> indexer_loss;  // with a selection: L_I per layer (unscaled)
  // With a selection, per layer: how far it is from the top-k of these index scores — the largest,
  // over rows, of (the best score left out − the worst selected) / the row's largest |score|; 0
  // when every row's selection is its exact top-k; inf when a row holds another count than
  // min(k, t + 1) of distinct earlier keys.
  std::vector<double> selection_slack;
};
BlockGrads block_backward(const MlaConfig& c, const RefWeights& w, const Array& x, const Array& dy,
                          std::optional<DType> storage = std::nullopt, Core core = Core::per_head,
                          const std::vector<Array>* selection = nullptr);

}  // namespace laga::ref
