// FLOPs of the block stack, whole sequence, all ranks together (docs/design.md §4): projections
// counted exactly (2 per multiply-add), attention by FlashAttention-3's convention with causal
// avg_kv = (T+1)/2 and backward = 2.5× forward, for the attention each form executes (Form::
// attention_forward_flops: the absorbed core scores over Dl and sums values of Lkv, the others Dqk
// and Dv). Elementwise work (norms, RoPE, softmax) is not counted in FLOPs.
//
// phase_flops splits the same work phase by phase (each projection, the K/V up-projection or the
// absorbed form's two absorptions, attention, a recompute form's rebuild) and adds each elementwise
// step's bytes (norms, RoPE, residual, the copies that assemble k and v; the ring forms' fp32
// accumulation as a class of its own): what the performance model
// (driver/model.hpp, docs/model.md) divides by the rate of each operation class. Its FLOPs sum to
// block_flops' totals exactly (tests/mla/test_phase_flops.cpp).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "laga/mla/config.hpp"

namespace laga {

struct BlockFlops {
  double forward = 0, backward = 0;
  double attention_forward = 0;  // the core's share of forward
};

BlockFlops block_flops(const MlaConfig& c);

// The class of hardware rate a phase runs at (the compute section of a hardware file,
// docs/model.md). elementwise: the block's normalisations, rotations and assemblies in the storage
// dtype; accumulate: streams over fp32 buffers that only add, merge, zero and round (the ring
// forms' merges and accumulators), which run at memory speed with little arithmetic per byte.
enum class OpClass { matmul, attention_forward, attention_backward, elementwise, accumulate };
// "matmul", "attention_fwd", "attention_bwd", "elementwise", "accumulate"
std::string_view op_class_name(OpClass k);

// The shape of an attention call, which sets its rate: per-head 192/128-like heads (explicit, laga
// and their recompute forms), per-head 576/512 latent heads (absorbed-expanded: the latent copied
// to every head, V padded to Dl with the fused kernel), or one 576/512 latent head shared by every
// query head (absorbed-shared's multi-query kernel), or dense heads whose K and V the kernel
// up-projects from the latent itself, tile by tile (laga-fused's latent kernel: its rate counts the
// attention's FLOPs and the up-projection's it executes, phases marked in_kernel).
enum class AttentionShape { dense, latent, mqa, laga_fused };
std::string_view attention_shape_name(AttentionShape s);   // "dense", "latent", "mqa", "laga_fused"
AttentionShape attention_shape_of(std::string_view form);  // by registered label

struct PhaseFlops {
  std::string name;  // "wq_a", "up-projection", "attention", "rmsnorm attn_norm", ...
  bool backward = false;
  OpClass op = OpClass::matmul;
  AttentionShape shape = AttentionShape::dense;  // attention phases and in_kernel products only
  double flops = 0;                              // matmul and attention phases
  double bytes = 0;  // elementwise and accumulate phases: bytes read + written
  // work in bytes
  bool by_bytes() const { return op == OpClass::elementwise || op == OpClass::accumulate; }
  // A matmul that the form's own attention kernel runs inside itself (laga-fused's up-projection
  // and its backward): counted here as matmul work, timed with the kernel at the kernel's rate.
  bool in_kernel = false;
};

// Every phase of one step (forward, then backward) of c's form over the whole sequence, all ranks,
// all layers: Σ flops of the forward phases = block_flops(c).forward, of the backward ones =
// .backward. Work is balanced over the ranks (each holds N tokens, or Hr heads over all T), so a
// rank's share is 1/P of each phase.
std::vector<PhaseFlops> phase_flops(const MlaConfig& c);

}  // namespace laga
