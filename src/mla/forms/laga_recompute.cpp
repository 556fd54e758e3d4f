// The laga-recompute form (docs/design.md §6, docs/accounting.md §6): laga whose forward keeps the
// gathered latent and what attention itself needs (q, o, and the log-sum-exp or probabilities) but
// not k and v; backward rebuilds k and v of this rank's head shard from the saved latent, one head
// at a time — one extra up-projection per layer and no extra communication.
//   G1  all_gather_tokens latent -> [T, B, Dl], issued before the query path runs;  scatter_heads q
//   G2  [k_nope | v] = ckv_gathered·wkv_b(shard)ᵀ;  k = [k_nope | kpe broadcast]   (q's all-to-all
//       behind it)
//   G3  o = attention(q, k, v);  k and v released, q, o, lse (probs) and the gathered latent kept
// Backward, per head h of the shard (kHeadsPerChunk at a time): G2 replayed for head h alone (k_h,
// v_h [T, B, 1, ·]), then G3's attention backward for head h through strided params (q, o, do, dq,
// dk, dv are head slices of the whole-shard tensors; lse or probs a view of head h's rows), k_h and
// v_h released. Then as laga: gather_heads dq issued, G2's backward over the whole shard at once
// (dlatent over the whole sequence, summed over this rank's heads, and the shard's dwkv_b rows),
// reduce_scatter_tokens issued with the block's query-path backward behind it.
//
// Bit-identical to laga at every P: the forward is laga's; a head's attention (either kernel)
// depends on that head's rows only; the per-head up-projection gives the all-heads one's values
// (measured: tests/mla/test_recompute.cpp); and G2's backward, which sums over heads, runs on the
// whole shard, as laga's does — accumulating it head by head would change dlatent's summation
// order.
#include "common.hpp"
#include "laga/comm/pairs.hpp"

namespace laga::forms {

namespace {

// Heads rebuilt and differentiated together in backward (must divide Hr; clamped to it).
constexpr int64_t kHeadsPerChunk = 1;

struct LagaRecomputeSaved final : CoreSaved {
  Tensor latent_g;  // [T, B, Dl]      the gathered latent
  Tensor q;         // [T, B, Hr, Dqk]
  Tensor o;         // [T, B, Hr, Dv]
  AttentionSaved attn;
  void for_each(const std::function<void(const char*, const Tensor&)>& f) const override {
    f("latent_g", latent_g), f("q", q), f("o_att", o);
  }
};

class LagaRecompute final : public Form {
 public:
  std::string_view name() const override { return "laga-recompute"; }
  std::string_view family() const override { return "laga-recompute"; }
  std::string_view summary() const override {
    return "laga saving the gathered latent, not k and v; backward rebuilds them head by head, no "
           "extra traffic";
  }

  Tensor forward(const RankCtx& ctx, const LayerWeights& w, Tensor latent, const QueryPath& query,
                 std::unique_ptr<CoreSaved>& out) const override {
    auto s = std::make_unique<LagaRecomputeSaved>();
    // G1: the latent's all-gather in flight behind the query path and q's all-to-all; q's behind G2
    InFlight latent_g =
        issue(ctx, all_gather_tokens_start(ctx.comm, std::move(latent), "latent", "act.latent_g"));
    InFlight q = issue(ctx, scatter_heads_start(ctx.comm, query(), "q", "act.q"));
    s->latent_g = latent_g.wait();
    // G2 (this rank's heads)
    Tensor k = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dqk}, ctx.dt, "act.k");
    Tensor v = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dv}, ctx.dt, "act.v");
    up_project_forward(ctx, s->latent_g, w.wkv_b, ctx.r * ctx.Hr, ctx.Hr, k, v);
    s->q = q.wait();
    s->o = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dv}, ctx.dt, "act.o_att");  // G3
    s->attn = attention_forward(
        ctx.c.kernel, dense_attention(ctx, s->q, k, v, s->o, ctx.Hr, ctx.Hr, ctx.Dqk, ctx.Dv));
    Tensor o = s->o;
    out = std::move(s);
    return o;  // k and v are released here
  }

  Tensor backward(const RankCtx& ctx, const LayerWeights& w, std::unique_ptr<CoreSaved> saved,
                  Tensor dout, LayerWeights& g,
                  const QueryPathBackward& query_backward) const override {
    auto& s = static_cast<LagaRecomputeSaved&>(*saved);
    Tensor dq = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dqk}, ctx.dt, "grad.q");
    Tensor dk = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dqk}, ctx.dt, "grad.k");
    Tensor dv = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dv}, ctx.dt, "grad.v");
    const int64_t Hc = std::min(kHeadsPerChunk, ctx.Hr);
    LAGA_ASSERT(ctx.Hr % Hc == 0, "laga-recompute: {} heads per chunk do not divide Hr {}", Hc,
                ctx.Hr);
    for (int64_t h0 = 0; h0 < ctx.Hr; h0 += Hc) {
      // G2 replayed for heads [h0, h0 + Hc) of the shard
      Tensor k = Tensor::empty({ctx.T, ctx.B, Hc, ctx.Dqk}, ctx.dt, "recompute.k");
      Tensor v = Tensor::empty({ctx.T, ctx.B, Hc, ctx.Dv}, ctx.dt, "recompute.v");
      up_project_forward(ctx, s.latent_g, w.wkv_b, ctx.r * ctx.Hr + h0, Hc, k, v);
      // G3 o = attention(q, k, v), these heads, one batch row at a time (so lse / probs are views)
      for (int64_t b = 0; b < ctx.B; ++b)
        attention_backward_heads(ctx, s, k, v, dout, dq, dk, dv, b, h0, Hc);
    }
    dout = Tensor();
    s.attn = {};
    s.q = s.o = Tensor();
    // G1 scatter_heads' adjoint, in flight behind G2's backward
    InFlight dq_local =
        issue(ctx, gather_heads_start(ctx.comm, std::move(dq), "dq", "grad.q_local"));
    // G2 backward (this rank's head shard at once), over the whole sequence
    Tensor dlatent_g =
        Tensor::empty({ctx.T, ctx.B, ctx.Dl}, ctx.c.dlatent_sum_dtype(), "grad.latent_g");
    up_project_backward(ctx, s.latent_g, w.wkv_b, ctx.r * ctx.Hr, ctx.Hr, dk, dv, dlatent_g,
                        g.wkv_b);
    dk = dv = s.latent_g = Tensor();
    // G1 all-gather's adjoint, in flight behind the block's query-path backward
    InFlight dlatent = issue(ctx, reduce_scatter_tokens_start(ctx.comm, std::move(dlatent_g),
                                                              "dlatent", "grad.latent", ctx.dt));
    query_backward(dq_local.wait());
    return dlatent.wait();
  }

  bool exact_at_one_rank() const override { return true; }

 private:
  // Attention backward of batch row b, heads [h0, h0 + Hc) of the shard: q, o, do, dq, dk, dv as
  // head slices of the [T, B, Hr, ·] tensors, k and v the rebuilt [T, B, Hc, ·], the saved lse /
  // probs as a view of rows (b, h0 .. h0 + Hc) of [B, Hr, ...].
  static void attention_backward_heads(const RankCtx& ctx, const LagaRecomputeSaved& s,
                                       const Tensor& k, const Tensor& v, const Tensor& dout,
                                       const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                       int64_t b, int64_t h0, int64_t Hc) {
    const int64_t Dqk = ctx.Dqk, Dv = ctx.Dv, Hr = ctx.Hr, row = b * Hr + h0;
    AttentionBwdParams p;
    p.B = 1, p.T = ctx.T, p.Hq = Hc, p.Hkv = Hc, p.Dqk = Dqk, p.Dv = Dv;
    p.dtype = ctx.dt, p.scale = float(ctx.c.softmax_scale()), p.causal = true;
    p.one_pass_backward = ctx.c.attn_backward == AttnBackward::one_pass;
    const AttentionStrides qk = dense_strides(ctx.B, Hr, Dqk), vo = dense_strides(ctx.B, Hr, Dv);
    p.q = at(s.q, row * Dqk), p.q_stride = qk;
    p.k = at(k, b * Hc * Dqk), p.k_stride = dense_strides(ctx.B, Hc, Dqk);
    p.v = at(v, b * Hc * Dv), p.v_stride = dense_strides(ctx.B, Hc, Dv);
    p.o = at(s.o, row * Dv), p.o_stride = vo;
    p.dout = at(dout, row * Dv), p.dout_stride = vo;
    p.dq = at(dq, row * Dqk), p.dq_stride = qk;
    p.dk = at(dk, row * Dqk), p.dk_stride = qk;
    p.dv = at(dv, row * Dv), p.dv_stride = vo;
    AttentionSaved a;
    const int64_t T = ctx.T, BH = ctx.B * Hr;
    if (s.attn.probs.defined())
      a.probs = s.attn.probs.reshape({BH, T, T}).rows(row, row + Hc).reshape({1, Hc, T, T});
    if (s.attn.lse.defined())
      a.lse = s.attn.lse.reshape({BH, T}).rows(row, row + Hc).reshape({1, Hc, T});
    attention_backward(ctx.c.kernel, p, a);
  }
};

}  // namespace

const Form& laga_recompute_form() {
  static const LagaRecompute form;
  return form;
}

}  // namespace laga::forms
