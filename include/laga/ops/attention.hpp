// Attention: causal softmax(scale · q kᵀ) v over the whole (gathered) sequence, in two kernels.
//
//   eager  materialises scores and probabilities [B, Hq, T, T] (PyTorch-math style); saves the
//          probabilities (in the storage dtype) for backward.
//   fused  flash-style tiles with online softmax; saves only o and the log-sum-exp [B, Hq, T]
//          (fp32); backward recomputes probabilities per tile. Never allocates anything T×T.
//
// Both: causal (query t sees keys 0..t), Dqk ≠ Dv (192/128, 576/512), Hq query heads sharing
// Hkv = Hq / group key/value heads (group = Hq for the absorbed form's shared latent), batch B ≥ 1,
// fp32 or bf16 storage with fp32 accumulation.
//
// Layout: element (t, b, h, d) of a tensor X is at X + t·x_t_stride + b·x_b_stride + h·x_h_stride +
// d (sequence-first; d contiguous). Strides let V be the first Lkv columns of the latent, or a head
// shard live inside a wider buffer, without copies. Every buffer the kernels allocate comes from
// the current MemoryTracker under a tag starting with "attn.", in the order attention_memory_events
// lists. Both kernels run on the caller's OpenMP threads. Results are bitwise reproducible from run
// to run; the fused kernel's are also independent of the thread count. The math and its backward:
// docs/attention.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "laga/core/dtype.hpp"
#include "laga/core/tensor.hpp"

namespace laga {

enum class Kernel { eager, fused };
std::string_view kernel_name(Kernel k);   // "eager", "fused"
Kernel parse_kernel(std::string_view s);  // usage error naming the valid kernels

struct AttentionStrides {
  int64_t t = 0, b = 0, h = 0;  // in elements
};

struct AttentionFwdParams {
  int64_t B = 1, T = 0;     // batch, sequence length (queries = keys = T)
  int64_t Hq = 0, Hkv = 0;  // query heads, key/value heads; Hq % Hkv == 0
  int64_t Dqk = 0, Dv = 0;
  DType dtype = DType::f32;  // storage of q, k, v, o (and do, dq, dk, dv in backward)
  float scale = 1.0f;        // softmax scale, > 0
  bool causal = true;
  const void* q = nullptr;
  AttentionStrides q_stride;  // [T, B, Hq, Dqk]
  const void* k = nullptr;
  AttentionStrides k_stride;  // [T, B, Hkv, Dqk]
  const void* v = nullptr;
  AttentionStrides v_stride;  // [T, B, Hkv, Dv]
  void* o = nullptr;
  AttentionStrides o_stride;  // [T, B, Hq, Dv] (=)
  // o in fp32 instead of the storage dtype (q, k, v stay in dtype): a partial attention that is
  // merged with others by log-sum-exp sees no rounding. In backward o is then read as fp32 too.
  // Fused kernel only; the eager kernel refuses it.
  bool o_f32 = false;
  // The fused kernel's backward order (docs/attention.md §4): false, two passes (pass B recomputes
  // S and dP for dq: 7 tile products per pair, a task per tile); true, one pass (5 products per
  // pair, a task per head group, or per sub-group of its heads when B·Hkv < 4; fp32 dq sums of the
  // tasks in flight, and a split group's fp32 dk, dv partials). Read by backward and by the memory
  // plan; the eager kernel refuses true.
  bool one_pass_backward = false;
  // Causal only: the call's key 0 is the sequence's, so the first query row's softmax is its first
  // key alone (the fused backward gives it dS = 0 exactly) and a row whose keys all lie in the
  // first key tile takes delta from that tile, not from dO·O (docs/attention.md §2). False where a
  // causal call is one chunk pair of a longer sequence and its first row sees earlier keys in other
  // calls (the ring forms' diagonal pairs past the sequence's first chunk).
  bool first_row_alone = true;
};

// What forward keeps for backward. Exactly one of probs (eager) and lse (fused) is defined.
struct AttentionSaved {
  Tensor probs;  // eager: [B, Hq, T, T] in the storage dtype, tag "attn.probs"
  // fused: [B, Hq, T] fp32, tag "attn.lse": log Σ_j exp(scale · q_t·k_j) (natural log)
  Tensor lse;
};

struct AttentionBwdParams : AttentionFwdParams {
  const void* dout = nullptr;
  AttentionStrides dout_stride;  // [T, B, Hq, Dv]
  void* dq = nullptr;
  AttentionStrides dq_stride;  // [T, B, Hq, Dqk] (=)
  void* dk = nullptr;
  AttentionStrides dk_stride;  // [T, B, Hkv, Dqk] (=)
  void* dv = nullptr;
  AttentionStrides dv_stride;  // [T, B, Hkv, Dv] (=)
  // dq, dk, dv in fp32 instead of the storage dtype (dout stays in dtype): partial gradients that
  // are summed over several calls see no rounding. Fused kernel only; the eager kernel refuses it.
  bool grads_f32 = false;
};

// Checks the params (sizes, head grouping, scale, pointers, strides non-negative) and names what is
// wrong; attention_forward/backward call it (the backward's version also checks the gradients).
void check_attention_params(const AttentionFwdParams& p);
void check_attention_params(const AttentionBwdParams& p);

AttentionSaved attention_forward(Kernel kernel, const AttentionFwdParams& p);
// p.o must hold forward's output (fused uses it for rowsum(dO·O)).
void attention_backward(Kernel kernel, const AttentionBwdParams& p, const AttentionSaved& saved);

// Merges a partial attention of the same queries over other keys into a running one (the ring
// forms' log-sum-exp merge; fp32 operands, each merge computed in fp64 and rounded once), with
// o_part [T, B, H, Dv] and lse_part [B, H, T] (fp32, dense):
//   lse' = m + log(e^(lse_acc − m) + e^(lse_part − m)),  m = max(lse_acc, lse_part)
//   o_acc' = e^(lse_acc − lse') · o_acc + e^(lse_part − lse') · o_part
// o_acc [T, B, H, Dv], lse_acc [B, H, T] fp32 (+= in that sense). first: (o_acc, lse_acc) = the
// partial.
void attention_merge(const Tensor& o_part, const Tensor& lse_part, Tensor& o_acc, Tensor& lse_acc,
                     bool first);

// FLOPs by FlashAttention-3's convention: forward 2·B·Hq·T·avg_kv·(Dqk+Dv), causal avg_kv =
// (T+1)/2; backward 2.5× forward.
double attention_forward_flops(int64_t B, int64_t Hq, int64_t T, int64_t Dqk, int64_t Dv,
                               bool causal);

// Memory. Every buffer either kernel allocates, in order, with its exact size: the planner replays
// these events instead of re-deriving the formulas (which docs/attention.md §5 also spells out).
// Sizes depend only on the config (B, Hq, Hkv, T, Dqk, Dv, dtype), never on the thread count: the
// fused kernel's per-thread tiles come in min(kAttentionMaxThreads, tasks) slots and its parallel
// regions use at most that many threads.
constexpr int64_t kAttentionMaxThreads = 16;

struct AttentionMemoryEvent {
  bool release = false;  // false: allocated here; true: the allocation with this tag is released
  std::string tag;
  Shape shape;
  DType dtype = DType::f32;
  int64_t bytes() const { return shape_numel(shape) * dtype_size(dtype); }
};
// Forward's events leave the saved tensor (attn.probs or attn.lse) allocated; backward's never
// release it (the caller owns AttentionSaved). Only the sizes and kernel in p are read.
std::vector<AttentionMemoryEvent> attention_memory_events(Kernel kernel,
                                                          const AttentionFwdParams& p,
                                                          bool backward);

struct AttentionMemory {
  int64_t saved_bytes = 0;          // live after forward: the saved tensor
  int64_t forward_peak_bytes = 0;   // max over forward of bytes allocated since its start
  int64_t backward_peak_bytes = 0;  // max over backward of bytes allocated since its start
};
AttentionMemory attention_memory(Kernel kernel, const AttentionFwdParams& p);

// Strides of a dense sequence-first [T, B, H, D] tensor.
inline AttentionStrides dense_strides(int64_t B, int64_t H, int64_t D) {
  return {B * H * D, H * D, D};
}

}  // namespace laga
