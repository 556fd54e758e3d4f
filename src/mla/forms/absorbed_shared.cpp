// absorbed-shared (docs/design.md §2.3): the absorbed form with a native multi-query kernel — every
// query head of this rank attends to the one gathered latent (K = [ckv | kpe], V = ckv, its first
// Lkv columns, read in place), never copied per head.
//   A1  all_gather_tokens latent, issued before the query path runs;  scatter_heads q
//   A2  q_abs = [q_nope·W_UK | q_pe]                           (the all-gather still behind it)
//   A3  o_lat = MQA attention(q_abs, K = latent, V = ckv)       [T, B, Hr, Lkv]
//   A4  o = o_lat·W_UVᵀ
// Backward: A4's, then attention backward with dK written straight into dlatent and dV summed onto
// its first Lkv columns, reduce_scatter_tokens dlatent issued, A2's behind it, gather_heads dq and
// the block's query-path backward behind it too. With overlap off each collective is waited where
// issued.
#include "absorbed_common.hpp"
#include "laga/comm/pairs.hpp"

namespace laga::forms {

namespace {

// K = the latent, V = its first Lkv columns: one head shared by all Hr query heads.
AttentionFwdParams shared_attention(const RankCtx& ctx, const AbsorbedSaved& s) {
  AttentionFwdParams p =
      dense_attention(ctx, s.q_abs, s.latent_g, s.latent_g, s.o_lat, ctx.Hr, 1, ctx.Dl, ctx.Lkv);
  p.k_stride = p.v_stride = AttentionStrides{ctx.B * ctx.Dl, ctx.Dl, 0};
  return p;
}

class AbsorbedShared final : public Form {
 public:
  std::string_view name() const override { return "absorbed-shared"; }
  std::string_view family() const override { return "absorbed"; }
  std::string_view summary() const override {
    return "all-to-all of q and o, all-gather of the latent; W_UK in the query, MQA over the one "
           "latent";
  }

  Tensor forward(const RankCtx& ctx, const LayerWeights& w, Tensor latent, const QueryPath& query,
                 std::unique_ptr<CoreSaved>& out) const override {
    auto s = std::make_unique<AbsorbedSaved>();
    // A1: the latent's all-gather in flight behind the query path, q's all-to-all and A2
    InFlight latent_g =
        issue(ctx, all_gather_tokens_start(ctx.comm, std::move(latent), "latent", "act.latent_g"));
    s->q = scatter_heads_start(ctx.comm, query(), "q", "act.q").wait();
    s->q_abs = absorb_query(ctx, w, s->q, ctx.r * ctx.Hr);  // A2
    s->latent_g = latent_g.wait();
    s->o_lat = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Lkv}, ctx.dt, "act.o_att");  // A3
    s->attn = attention_forward(ctx.c.kernel, shared_attention(ctx, *s));
    Tensor o = project_out(ctx, w, s->o_lat, ctx.Lkv, ctx.r * ctx.Hr);  // A4
    out = std::move(s);
    return o;
  }

  Tensor backward(const RankCtx& ctx, const LayerWeights& w, std::unique_ptr<CoreSaved> saved,
                  Tensor dout, LayerWeights& g,
                  const QueryPathBackward& query_backward) const override {
    auto& s = static_cast<AbsorbedSaved&>(*saved);
    Tensor do_lat = project_out_backward(ctx, w, dout, s.o_lat, ctx.Lkv, ctx.r * ctx.Hr, g);  // A4
    dout = Tensor();
    // A3: dq_abs; dK is dlatent_g itself (when the partial sums keep the storage dtype; in fp32
    // they are dK of the kernel, in the storage dtype, widened), dV (one head) is added onto its
    // first Lkv columns
    Tensor dq_abs = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dl}, ctx.dt, "grad.q_abs");
    const DType sum_dt = ctx.c.dlatent_sum_dtype();
    Tensor dlatent_g = Tensor::empty({ctx.T, ctx.B, ctx.Dl}, sum_dt, "grad.latent_g");
    {
      Tensor dk = sum_dt == ctx.dt ? dlatent_g
                                   : Tensor::empty({ctx.T, ctx.B, 1, ctx.Dl}, ctx.dt, "grad.k_lat");
      Tensor dv = Tensor::empty({ctx.T, ctx.B, 1, ctx.Lkv}, ctx.dt, "grad.v_lat");
      attention_backward(
          ctx.c.kernel,
          dense_attention_backward(shared_attention(ctx, s), ctx, do_lat, dq_abs, dk, dv), s.attn);
      if (sum_dt != ctx.dt)
        sum_heads(ctx.dt, ctx.T * ctx.B, 1, ctx.Dl, dk.raw(), ctx.Dl, 0, sum_dt, dlatent_g.raw(),
                  ctx.Dl, false);
      sum_heads(ctx.dt, ctx.T * ctx.B, 1, ctx.Lkv, dv.raw(), ctx.Lkv, 0, sum_dt, dlatent_g.raw(),
                ctx.Dl, /*accumulate=*/true);
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

const Form& absorbed_shared_form() {
  static const AbsorbedShared form;
  return form;
}

}  // namespace laga::forms
