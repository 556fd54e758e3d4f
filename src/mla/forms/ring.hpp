// The ring machinery the ring forms (ring.cpp) and laga-ulysses (laga_ulysses.cpp) share: the
// zigzag chunk pairs of a hop, the per-hop attention with its log-sum-exp merge and its backward,
// and ring-latent's whole core (the latent travelling, up-projected per hop, dlatent travelling
// back in fp32), over a RingView: which ring, where this rank sits on it, the chunk length and the
// heads this rank computes. ring-latent runs it over the whole group with every head; laga-ulysses
// over the ring of groups, on the group's gathered latent, with the rank's head shard.
// Internal to the forms; the dataflow is in docs/design.md §6 (the ring forms) and §2.7.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common.hpp"

namespace laga::forms {

struct RingView {
  Communicator& comm;  // the ring: send_recv to the next position, from the previous one
  int64_t P, r;        // positions on the ring, this rank's
  int64_t C;           // chunk length: position r holds chunks r and 2P−1−r, 2C local rows
  // the heads computed here: wkv_b's heads [h0, h0 + Hs); q and o hold Hs heads
  int64_t h0, Hs;
};

// The zigzag layout's condition on the sequence: 2·R divides T, R the positions on the ring (ranks,
// or groups of ranks under laga-ulysses). No product overflows for any int64 R (fuzz_config sets
// --sp near 2^63). zigzag_seq_problem: empty when it holds (or T, R are not positive: named
// elsewhere), else why not with the nearest valid T's, e.g. "--seq 100 is not a multiple of 2 ×
// (--sp 8 /
// --ulysses 2) = 8 (...); try --seq 96 or 104".
bool zigzag_fits(int64_t T, int64_t R);
std::string zigzag_seq_problem(int64_t T, int64_t R, std::string_view ring, std::string_view why);

// A query chunk × key chunk pair of one hop: local chunk indices (0: chunk r, 1: chunk 2P−1−r) and
// whether it is the diagonal (causal) block.
struct ChunkPair {
  int qu, ku;
  bool causal;
};
std::vector<ChunkPair> hop_pairs(int64_t r, int64_t src);

// One hop's attention of the local query chunks q [2C, B, Hs, Dqk] over the held block's k, v (of
// position src), each pair's fp32 partial merged into o_acc [2C, B, Hs, Dv] and lse[qu] [B, Hs, C]
// (first[qu]: none yet), in a fixed order, on the fused kernel.
void hop_forward(const RankCtx& ctx, const RingView& rv, int64_t src, const Tensor& q,
                 const Tensor& k, const Tensor& v, Tensor& o_acc, Tensor* lse, bool* first);
// Its backward, FlashAttention-2 style with the final o and lse: dq (+= into dq_acc fp32) and the
// held block's dk, dv (+= into dk_acc, dv_acc fp32).
void hop_backward(const RankCtx& ctx, const RingView& rv, int64_t src, const Tensor& q,
                  const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& dout,
                  const Tensor* const* lse, Tensor& dq_acc, Tensor& dk_acc, Tensor& dv_acc);

// What ring-latent's core keeps for its backward.
struct RingLatentState {
  Tensor latent;      // [2C, B, Dl]      this position's latent: travels again in backward
  Tensor q;           // [2C, B, Hs, Dqk]
  Tensor o;           // [2C, B, Hs, Dv]  the final output, storage dtype
  Tensor lse0, lse1;  // [B, Hs, C] fp32
  void for_each(const std::function<void(const char*, const Tensor&)>& f) const {
    f("latent", latent), f("q", q), f("o_att", o), f("lse0", lse0), f("lse1", lse1);
  }
};
// The latent [2C, B, Dl] travels the ring (send_recv named `name`; the first hop issued before
// `query` runs, which returns q [2C, B, Hs, Dqk]); each hop's block is up-projected for heads
// [h0, h0 + Hs) and attended with the merge. Returns o [2C, B, Hs, Dv] (also kept in s).
Tensor ring_latent_forward(const RankCtx& ctx, const RingView& rv, const LayerWeights& w,
                           Tensor latent, const std::function<Tensor()>& query, RingLatentState& s,
                           const std::string& name);
// Its backward: the latent travels again (`name`), K/V recomputed per hop, the travelling block's
// fp32 dlatent goes on around the ring (`grad_name`) back to its owner; dwkv_b rows of the heads
// +=. Consumes s. Returns dq [2C, B, Hs, Dqk] and dlatent [2C, B, Dl], both fp32, not yet rounded.
struct RingLatentGrads {
  Tensor dq, dlatent;
};
RingLatentGrads ring_latent_backward(const RankCtx& ctx, const RingView& rv, const LayerWeights& w,
                                     RingLatentState& s, Tensor dout, LayerWeights& g,
                                     const std::string& name, const std::string& grad_name);

}  // namespace laga::forms
