// What the two absorbed variants share (docs/design.md §2.3): the saved state, and the steps on
// either side of their attention — A2, W_UK folded into the query, and A4, W_UV applied after
// attention — with their backwards. The variants differ only in how the latent is handed to the
// attention kernel (absorbed_shared.cpp, absorbed_expanded.cpp).
#pragma once

#include "common.hpp"

namespace laga::forms {

struct AbsorbedSaved final : CoreSaved {
  Tensor latent_g;      // [T, B, Dl]      the gathered latent: K, and V = its first Lkv columns
  Tensor q;             // [T, B, Hr, Dqk] after the all-to-all (A2's backward needs q_nope)
  Tensor q_abs;         // [T, B, Hr, Dl]  [q_nope·W_UK | q_pe]
  Tensor k_exp, v_exp;  // expanded only: [T, B, Hr, Dl], [T, B, Hr, Lkv or Dl]
  Tensor o_lat;         // [T, B, Hr, Dvo] attention output in the latent (Dvo = Lkv, or Dl padded)
  AttentionSaved attn;
  void for_each(const std::function<void(const char*, const Tensor&)>& f) const override {
    f("latent_g", latent_g), f("q", q), f("q_abs", q_abs), f("k_exp", k_exp), f("v_exp", v_exp),
        f("o_att", o_lat);
  }
};

// A2 q_abs = [q_nope·W_UK(h) | q_pe] for heads [h0, h0 + Hs) of q [M, B, Hs, Dqk] -> q_abs
// [M, B, Hs, Dl] (=, or a new tensor tagged "act.q_abs"). The head-scatter forms pass their rank's
// heads over the whole sequence, the sparse forms every head over a block of their rows.
void absorb_query(const RankCtx& ctx, const LayerWeights& w, const Tensor& q, int64_t h0,
                  const Tensor& q_abs);
Tensor absorb_query(const RankCtx& ctx, const LayerWeights& w, const Tensor& q, int64_t h0);
// Its backward: dq [M, B, Hs, Dqk] (=, or a new tensor tagged "grad.q") from dq_abs; dW_UK (+=)
// into g.wkv_b.
void absorb_query_backward(const RankCtx& ctx, const LayerWeights& w, const Tensor& q,
                           const Tensor& dq_abs, int64_t h0, const Tensor& dq, LayerWeights& g);
Tensor absorb_query_backward(const RankCtx& ctx, const LayerWeights& w, const Tensor& q,
                             const Tensor& dq_abs, int64_t h0, LayerWeights& g);
// A4 o = o_lat[..., :Lkv]·W_UV(h)ᵀ: o_lat [M, B, Hs, Dvo] -> o [M, B, Hs, Dv] (tag "act.o_g").
Tensor project_out(const RankCtx& ctx, const LayerWeights& w, const Tensor& o_lat, int64_t Dvo,
                   int64_t h0);
// Its backward: do_lat [M, B, Hs, Dvo] (padding columns zero) from dout; dW_UV (+=) into g.wkv_b.
Tensor project_out_backward(const RankCtx& ctx, const LayerWeights& w, const Tensor& dout,
                            const Tensor& o_lat, int64_t Dvo, int64_t h0, LayerWeights& g);

}  // namespace laga::forms
