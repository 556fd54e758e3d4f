// The MLA attention block stack, y = x + MLA(RMSNorm(x)) per layer (DESIGN §2), forward and
// backward on one rank of a sequence-parallel group, in the three forms:
//   explicit  per-head K/V up-projected locally; all-to-all of q, k, v and o
//   absorbed  W_UK folded into the query, MQA over the all-gathered latent, W_UV after attention
//             (regimes: shared latent K/V, or expanded per head as stock kernels force)
//   laga      all-gather of the latent, per-head K/V of this rank's head shard rebuilt locally
// Forward keeps what backward needs in a StackSaved; backward walks the layers in reverse, frees each
// layer's saved tensors as it goes, and accumulates every weight gradient (+=) into `grads` — partial
// over this rank's tokens (or head shard, for wkv_b in laga/absorbed); the caller's grad sync makes
// them whole. At P = 1 the collectives are identities and laga runs exactly explicit's operations.
// Math: docs/block.md; dataflow and memory: docs/accounting.md.
#pragma once

#include <vector>

#include "laga/comm/communicator.hpp"
#include "laga/core/config.hpp"
#include "laga/core/tensor.hpp"
#include "laga/mla/weights.hpp"
#include "laga/ops/attention.hpp"

namespace laga {

// What one layer's forward keeps for its backward (tags "act.*"). Shapes: N local tokens, T the
// whole sequence, H all heads, Hr this rank's heads.
struct LayerSaved {
  Tensor x;         // [N, B, D]       the layer's input
  Tensor xn;        // [N, B, D]       RMSNorm(x)
  Tensor cq;        // [N, B, Lq]      xn·wq_aᵀ (q_lora_rank > 0)
  Tensor cqn;       // [N, B, Lq]      RMSNorm(cq)
  Tensor kv;        // [N, B, Lkv+Dr]  xn·wkv_aᵀ
  Tensor latent;    // [N, B, Dl]      explicit: [ckv | kpe] of the local tokens
  Tensor latent_g;  // [T, B, Dl]      laga, absorbed: the gathered latent
  Tensor q;         // [T, B, Hr, Dqk] after RoPE and the all-to-all
  Tensor k;         // [T, B, Hr, Dqk] explicit, laga
  Tensor v;         // [T, B, Hr, Dv]  explicit, laga
  Tensor q_abs;     // [T, B, Hr, Dl]  absorbed: [q_nope·W_UK | q_pe]
  Tensor k_exp;     // [T, B, Hr, Dl]  absorbed expanded: the latent copied per head
  Tensor v_exp;     // [T, B, Hr, Lkv] absorbed expanded (fused: [T, B, Hr, Dl], zero-padded)
  Tensor o_att;     // [T, B, Hr, ·]   attention output: Dv, or Lkv (absorbed; Dl when padded)
  Tensor o;         // [N, B, H·Dv]    after the all-to-all back, the input of wo
  AttentionSaved attn;
};

struct StackSaved {
  std::vector<LayerSaved> layers;
};

// x [N, B, D] (this rank's tokens) -> y [N, B, D] (tag "act.y").
Tensor stack_forward(const MlaConfig& c, const Weights& w, const Tensor& x, StackSaved& saved, Communicator& comm);
// dy [N, B, D] -> dx [N, B, D] (tag "grad.x"); grads (+=); saved is consumed.
Tensor stack_backward(const MlaConfig& c, const Weights& w, StackSaved& saved, const Tensor& dy, Weights& grads,
                      Communicator& comm);

}  // namespace laga
