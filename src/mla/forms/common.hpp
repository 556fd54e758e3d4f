// Pieces the forms share (src/mla/forms/): issuing a collective as the overlap choice says, views
// into wkv_b and head-sharded tensors, the per-head K/V up-projection of E1/G2 with its backward,
// and the attention params of dense head-sharded tensors. Internal to the forms; the math is in
// docs/block.md and docs/design.md §2.
#pragma once

#include "laga/comm/pairs.hpp"
#include "laga/mla/form.hpp"
#include "laga/ops/attention.hpp"
#include "laga/ops/elementwise.hpp"
#include "laga/ops/matmul.hpp"

namespace laga::forms {

// A pair started as the run's overlap choice says (mla/form.hpp): left in flight until its wait()
// with overlap on; waited here with overlap off, so nothing runs behind it. Every collective a form
// means to run behind compute goes through here, so the form's code, and so its operations and
// their order, is the same either way (one with nothing to run behind it is just
// <pair>_start(...).wait()).
inline InFlight issue(const RankCtx& ctx, InFlight f) {
  return ctx.c.overlap ? std::move(f) : InFlight::done(f.wait());
}

// Rows of wkv_b (or its gradient) for head g: k-rows W_UK [Dn, Lkv] and v-rows W_UV [Dv, Lkv].
MatView w_uk(const RankCtx& ctx, const Tensor& wkv_b, int64_t g);
MatView w_uv(const RankCtx& ctx, const Tensor& wkv_b, int64_t g);

// The up-projection of E1/G2 for heads [h0, h0 + Hs): from latent [M, B, Dl] and wkv_b,
// k [M, B, Hs, Dqk] = [ckv·W_UKᵀ | kpe broadcast] and v [M, B, Hs, Dv] = ckv·W_UVᵀ (=).
void up_project_forward(const RankCtx& ctx, const Tensor& latent, const Tensor& wkv_b, int64_t h0,
                        int64_t Hs, Tensor& k, Tensor& v);
// Its backward: dlatent [M, B, Dl] (=; the storage dtype or fp32, rounded once from the fp32 sums
// over the heads) and the dwkv_b rows of heads [h0, h0 + Hs) (+=).
void up_project_backward(const RankCtx& ctx, const Tensor& latent, const Tensor& wkv_b, int64_t h0,
                         int64_t Hs, const Tensor& dk, const Tensor& dv, Tensor& dlatent,
                         Tensor& dwkv_b);

// Causal attention params over dense [T, B, Hq, ·] q/o and [T, B, Hkv, ·] k/v, the config's scale.
AttentionFwdParams dense_attention(const RankCtx& ctx, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const Tensor& o, int64_t Hq, int64_t Hkv,
                                   int64_t Dqk, int64_t Dv);
// The backward params: the forward's, with do, dq, dk, dv dense of the same head counts.
AttentionBwdParams dense_attention_backward(const AttentionFwdParams& fwd, const RankCtx& ctx,
                                            const Tensor& dout, const Tensor& dq, const Tensor& dk,
                                            const Tensor& dv);

// The backward of o = attention(q, k, v) over this rank's Hr heads, all dense [T, B, Hr, ·]: dq, dk
// [T, B, Hr, Dqk] and dv [T, B, Hr, Dv] (tags grad.q, grad.k, grad.v, allocated in that order) from
// dout. E3's and G3's backward; the caller releases what it no longer needs.
struct HeadGrads {
  Tensor dq, dk, dv;
};
// The end of explicit's backward (and explicit-recompute's): E2's adjoint brings dq, dk, dv back to
// this rank's tokens, dk's and dv's all-to-alls in flight behind dq's and the block's query-path
// backward (query_backward, run on dq_local); then E1's backward from the local latent [N, B, Dl]:
// returns dlatent (grad.latent) and adds the dwkv_b of every head into g.
Tensor explicit_backward_tail(const RankCtx& ctx, const LayerWeights& w, const Tensor& latent,
                              Tensor dq, Tensor dk, Tensor dv, LayerWeights& g,
                              const QueryPathBackward& query_backward);

HeadGrads dense_attention_grads(const RankCtx& ctx, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& o, const AttentionSaved& saved,
                                const Tensor& dout);

}  // namespace laga::forms
