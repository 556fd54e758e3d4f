// Latent attention: causal attention of one rank's head shard whose keys and values are rebuilt
// from the MLA latent inside the kernel, one key tile at a time (the laga-fused form,
// docs/design.md §2.4; the loop order, buffers and determinism in docs/attention.md §7).
//
// Inputs are the gathered latent [T, B, Lkv + Dr] = [ckv | kpe] (kpe after RoPE), this shard's rows
// of wkv_b [H, Dn + Dv, Lkv] (per head Dn k-rows then Dv v-rows) and q [T, B, H, Dn + Dr]. For key
// tile j the kernel forms, per head h,
//   K_j = [ckv_j · W_UK,hᵀ | kpe_j]  [bk, Dn + Dr],   V_j = ckv_j · W_UV,hᵀ  [bk, Dv]
// in the storage dtype (rounded where laga's up-projection rounds k and v), and folds them into
// every query tile that sees them: the key tile is the outer loop, so the up-projection runs once
// per forward and once per backward, never per (query tile, key tile) pair. K and V of the whole
// sequence are never allocated; nor, in backward, are dK and dV: each key tile's gradients are
// rounded as laga's attention rounds dk and dv and taken at once through the up-projection's
// backward into dlatent's rows of that tile and an fp32 dwkv_b accumulator.
//
// Everything is dense and sequence-first like the rest of the block. Every buffer comes from the
// current MemoryTracker under a tag starting with "attn.", in the order
// latent_attention_memory_events lists (sizes from the params only, never the thread count).
// Results are bitwise independent of the thread count: every parallel region's tasks write disjoint
// outputs and the key tiles are visited in a fixed order.
#pragma once

#include <cstdint>
#include <vector>

#include "laga/ops/attention.hpp"

namespace laga {

struct LatentAttentionParams {
  int64_t B = 1, T = 0, H = 0;              // batch, sequence (queries = keys), heads of the shard
  int64_t Lkv = 0, Dr = 0, Dn = 0, Dv = 0;  // latent width Lkv + Dr; Dqk = Dn + Dr
  DType dtype = DType::f32;              // storage of latent, wkv, q, o (and dout, dq in backward)
  float scale = 1.0f;                    // softmax scale, > 0
  int64_t query_tile = 0, key_tile = 0;  // tokens per tile; 0: the kernel's own (256 each)
  const void* latent = nullptr;          // [T, B, Lkv + Dr]
  const void* wkv = nullptr;             // [H, Dn + Dv, Lkv]
  const void* q = nullptr;               // [T, B, H, Dn + Dr]
  void* o = nullptr;                     // [T, B, H, Dv] (=)
  int64_t Dqk() const { return Dn + Dr; }
  int64_t Dl() const { return Lkv + Dr; }
};

struct LatentAttentionBwdParams : LatentAttentionParams {
  const void* dout = nullptr;        // [T, B, H, Dv]
  void* dlatent = nullptr;           // [T, B, Lkv + Dr] (=), summed over the shard's heads
  DType dlatent_dtype = DType::f32;  //   the storage dtype or fp32, rounded once from fp32 sums
  void* dwkv = nullptr;              // [H, Dn + Dv, Lkv] (+=)
  DType dwkv_dtype = DType::f32;
};

// Names what is wrong (sizes, scale, tiles, pointers); forward and backward call it.
void check_latent_attention_params(const LatentAttentionParams& p);
void check_latent_attention_params(const LatentAttentionBwdParams& p);

// o (=) and the saved log-sum-exp (AttentionSaved::lse, [B, H, T] fp32, tag "attn.lse").
AttentionSaved latent_attention_forward(const LatentAttentionParams& p);
// p.o must hold forward's output (for rowsum(dO∘O)); saved is forward's. Writes dlatent and adds
// into dwkv; returns dq's fp32 sum [B, H, T, Dqk] (tag attn.dq_sum, unscaled), still allocated, so
// that the caller can release q, o, dout and the latent before dq itself is allocated: then
// latent_attention_dq.
Tensor latent_attention_backward(const LatentAttentionBwdParams& p, const AttentionSaved& saved);
// dq [T, B, H, Dqk] (=) = scale · dq_sum in the storage dtype (p's sizes, dtype and scale);
// releases dq_sum.
void latent_attention_dq(const LatentAttentionParams& p, Tensor& dq_sum, void* dq);

// The up-projection the kernel executes once in forward (and once more in backward):
// 2·T·B·Lkv·H·(Dn + Dv).
double latent_up_projection_flops(const LatentAttentionParams& p);

// Every buffer forward or backward allocates, in order, with its exact size (forward leaves
// attn.lse allocated, backward attn.dq_sum, which latent_attention_dq releases). For the planner
// and the kernel's own MemoryPlanWalker.
std::vector<AttentionMemoryEvent> latent_attention_memory_events(const LatentAttentionParams& p,
                                                                 bool backward);

}  // namespace laga
