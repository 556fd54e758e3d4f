// The MLA attention block stack, y = x + MLA(RMSNorm(x)) per layer (docs/design.md §2) — or, with
// attention_only, y = MLA(x) (Hugging Face's self_attn) — forward and backward on one rank of a
// sequence-parallel group: the local stage (L1–L6) and the output projection here, the attention
// core in between by the configured form (mla/form.hpp).
// Forward keeps what backward needs in a StackSaved; backward walks the layers in reverse, frees
// each layer's saved tensors as it goes, and accumulates every weight gradient (+=) into `grads` —
// partial over this rank's tokens (or head shard, for wkv_b in the latent-gathering forms); the
// caller's grad sync makes them whole. Math: docs/block.md; dataflow and memory:
// docs/accounting.md.
#pragma once

#include <memory>
#include <vector>

#include "laga/comm/communicator.hpp"
#include "laga/core/tensor.hpp"
#include "laga/mla/form.hpp"
#include "laga/mla/weights.hpp"

namespace laga {

// What one layer's forward keeps for its backward (tags "act.*"): the local stage's tensors here,
// the form's in `core`. Shapes: N local tokens.
struct LayerSaved {
  Tensor x;    // [N, B, D]       the layer's input (none with attention_only: xn is it)
  Tensor xn;   // [N, B, D]       RMSNorm(x); with attention_only x itself, the same storage
  Tensor cq;   // [N, B, Lq]      xn·wq_aᵀ (q_lora_rank > 0)
  Tensor cqn;  // [N, B, Lq]      RMSNorm(cq)
  Tensor kv;   // [N, B, Lkv+Dr]  xn·wkv_aᵀ
  Tensor o;    // [N, B, H·Dv]    the attention output back on this rank's tokens, the input of wo
  std::unique_ptr<CoreSaved> core;
};

struct StackSaved {
  std::vector<LayerSaved> layers;
};

// x [N, B, D] (this rank's tokens) -> y [N, B, D] (tag "act.y").
Tensor stack_forward(const Config& c, const Weights& w, const Tensor& x, StackSaved& saved,
                     Communicator& comm);
// dy [N, B, D] -> dx [N, B, D] (tag "grad.x"); grads (+=); saved is consumed.
Tensor stack_backward(const Config& c, const Weights& w, StackSaved& saved, const Tensor& dy,
                      Weights& grads, Communicator& comm);

}  // namespace laga
