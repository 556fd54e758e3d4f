// absorbed-expanded (docs/design.md §2.3): the absorbed form as stock attention kernels force it —
// the gathered latent copied to every query head as K [T, B, Hr, Dl] and V [T, B, Hr, Lkv], and
// with the fused kernel V and the output zero-padded to Dl (FlashAttention-2 / TransformerEngine
// need equal head dims). The faithful "inference absorb path ported to training", and the source of
// the memory regression the paper measures.
//   A1  all_gather_tokens latent, issued before the query path runs;  scatter_heads q
//   A2  q_abs = [q_nope·W_UK | q_pe]                           (the all-gather still behind it)
//   A3  k_exp, v_exp = the latent per head;  o_lat = attention(q_abs, k_exp, v_exp)
//   A4  o = o_lat[..., :Lkv]·W_UVᵀ
// Backward: A4's, attention backward, dK and dV summed over heads into dlatent,
// reduce_scatter_tokens dlatent issued, A2's behind it, gather_heads dq and the block's query-path
// backward behind it too. With overlap off each collective is waited where it is issued.
#include "absorbed_common.hpp"
#include "laga/comm/pairs.hpp"

namespace laga::forms {

namespace {

// The output width: V and o padded to Dl with the fused kernel, Lkv with the eager one.
int64_t out_width(const RankCtx& ctx) { return ctx.c.kernel == Kernel::fused ? ctx.Dl : ctx.Lkv; }

class AbsorbedExpanded final : public Form {
 public:
  std::string_view name() const override { return "absorbed-expanded"; }
  std::string_view family() const override { return "absorbed"; }
  std::string_view summary() const override {
    return "all-to-all of q and o, all-gather of the latent; W_UK in the query, the latent copied "
           "per head";
  }

  Tensor forward(const RankCtx& ctx, const LayerWeights& w, Tensor latent, const QueryPath& query,
                 std::unique_ptr<CoreSaved>& out) const override {
    auto s = std::make_unique<AbsorbedSaved>();
    const int64_t Dvo = out_width(ctx);
    // A1: the latent's all-gather in flight behind the query path, q's all-to-all and A2
    InFlight latent_g =
        issue(ctx, all_gather_tokens_start(ctx.comm, std::move(latent), "latent", "act.latent_g"));
    s->q = scatter_heads_start(ctx.comm, query(), "q", "act.q").wait();
    s->q_abs = absorb_query(ctx, w, s->q, ctx.r * ctx.Hr);  // A2
    s->latent_g = latent_g.wait();
    // A3 the per-head copies
    s->k_exp = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dl}, ctx.dt, "act.k_exp");
    s->v_exp = Tensor::zeros({ctx.T, ctx.B, ctx.Hr, Dvo}, ctx.dt, "act.v_exp");
    for (int64_t h = 0; h < ctx.Hr; ++h) {
      copy_rows(ctx.dt, ctx.T * ctx.B, ctx.Dl, s->latent_g.raw(), ctx.Dl, at(s->k_exp, h * ctx.Dl),
                ctx.Hr * ctx.Dl);
      copy_rows(ctx.dt, ctx.T * ctx.B, ctx.Lkv, s->latent_g.raw(), ctx.Dl, at(s->v_exp, h * Dvo),
                ctx.Hr * Dvo);
    }
    s->o_lat = Tensor::empty({ctx.T, ctx.B, ctx.Hr, Dvo}, ctx.dt, "act.o_att");
    s->attn = attention_forward(
        ctx.c.kernel,
        dense_attention(ctx, s->q_abs, s->k_exp, s->v_exp, s->o_lat, ctx.Hr, ctx.Hr, ctx.Dl, Dvo));
    Tensor o = project_out(ctx, w, s->o_lat, Dvo, ctx.r * ctx.Hr);  // A4
    out = std::move(s);
    return o;
  }

  Tensor backward(const RankCtx& ctx, const LayerWeights& w, std::unique_ptr<CoreSaved> saved,
                  Tensor dout, LayerWeights& g,
                  const QueryPathBackward& query_backward) const override {
    auto& s = static_cast<AbsorbedSaved&>(*saved);
    const int64_t Dvo = out_width(ctx);
    Tensor do_lat = project_out_backward(ctx, w, dout, s.o_lat, Dvo, ctx.r * ctx.Hr, g);  // A4
    dout = Tensor();
    // A3: dq_abs, and dK, dV per head, summed into dlatent_g
    Tensor dq_abs = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dl}, ctx.dt, "grad.q_abs");
    Tensor dlatent_g;
    {
      Tensor dk = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dl}, ctx.dt, "grad.k_exp");
      Tensor dv = Tensor::empty({ctx.T, ctx.B, ctx.Hr, Dvo}, ctx.dt, "grad.v_exp");
      const AttentionFwdParams p =
          dense_attention(ctx, s.q_abs, s.k_exp, s.v_exp, s.o_lat, ctx.Hr, ctx.Hr, ctx.Dl, Dvo);
      attention_backward(ctx.c.kernel, dense_attention_backward(p, ctx, do_lat, dq_abs, dk, dv),
                         s.attn);
      s.k_exp = s.v_exp = Tensor();
      const DType sum_dt = ctx.c.dlatent_sum_dtype();
      dlatent_g = Tensor::empty({ctx.T, ctx.B, ctx.Dl}, sum_dt, "grad.latent_g");
      sum_heads(ctx.dt, ctx.T * ctx.B, ctx.Hr, ctx.Dl, dk.raw(), ctx.Hr * ctx.Dl, ctx.Dl, sum_dt,
                dlatent_g.raw(), ctx.Dl, false);
      sum_heads(ctx.dt, ctx.T * ctx.B, ctx.Hr, ctx.Lkv, dv.raw(), ctx.Hr * Dvo, Dvo, sum_dt,
                dlatent_g.raw(), ctx.Dl, true);
    }
    do_lat = Tensor();
    s.attn = {};
    s.o_lat = s.q_abs = s.latent_g = Tensor();
    // A1's adjoints: dlatent's reduce-scatter in flight behind A2's backward, dq's all-to-all and
    // the block's query-path backward
    InFlight dlatent = issue(ctx, reduce_scatter_tokens_start(ctx.comm, std::move(dlatent_g),
                                                              "dlatent", "grad.latent", ctx.dt));
    Tensor dq = absorb_query_backward(ctx, w, s.q, dq_abs, ctx.r * ctx.Hr, g);  // A2
    dq_abs = s.q = Tensor();
    query_backward(gather_heads_start(ctx.comm, std::move(dq), "dq", "grad.q_local").wait());
    return dlatent.wait();
  }
};

}  // namespace

const Form& absorbed_expanded_form() {
  static const AbsorbedExpanded form;
  return form;
}

}  // namespace laga::forms
