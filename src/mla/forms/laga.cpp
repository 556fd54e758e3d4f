// The laga form (docs/design.md §2.4): the 576-wide latent all-gathered like the absorbed form, then
// per-head K/V rebuilt locally for this rank's head shard and standard attention — explicit's
// arithmetic with about half its communication.
//   G1  scatter_heads q;  all_gather_tokens latent -> [T, B, Dl]
//   G2  [k_nope | v] = ckv_gathered·wkv_b(shard)ᵀ;  k = [k_nope | kpe broadcast]
//   G3  o = attention(q, k, v)
// Backward: attention backward; G2's backward gives dlatent over the whole sequence, summed over this
// rank's heads, and dwkv_b of the shard; reduce_scatter_tokens (the all-gather's adjoint) gives this
// rank's dlatent; gather_heads dq. At P = 1 every collective is an identity and this is explicit's
// arithmetic, operation for operation: bit-identical results.
#include "common.hpp"
#include "laga/comm/pairs.hpp"

namespace laga::forms {

namespace {

struct LagaSaved final : CoreSaved {
  Tensor latent_g;  // [T, B, Dl]      the gathered latent
  Tensor q, k;      // [T, B, Hr, Dqk]
  Tensor v, o;      // [T, B, Hr, Dv]
  AttentionSaved attn;
  void for_each(const std::function<void(const char*, const Tensor&)>& f) const override {
    f("latent_g", latent_g), f("q", q), f("k", k), f("v", v), f("o_att", o);
  }
};

class Laga final : public Form {
 public:
  std::string_view name() const override { return "laga"; }
  std::string_view family() const override { return "laga"; }
  std::string_view summary() const override {
    return "all-to-all of q and o, all-gather of the latent; K/V of this rank's heads rebuilt locally";
  }

  Tensor forward(const RankCtx& ctx, const LayerWeights& w, Tensor q_local, Tensor latent,
                 std::unique_ptr<CoreSaved>& out) const override {
    auto s = std::make_unique<LagaSaved>();
    s->q = scatter_heads(ctx.comm, q_local, "q", "act.q");                          // G1
    q_local = Tensor();
    s->latent_g = all_gather_tokens(ctx.comm, latent, "latent", "act.latent_g");
    latent = Tensor();  // the gathered copy holds this rank's tokens too
    s->k = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dqk}, ctx.dt, "act.k");                  // G2 (this rank's heads)
    s->v = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dv}, ctx.dt, "act.v");
    up_project_forward(ctx, s->latent_g, w.wkv_b, ctx.r * ctx.Hr, ctx.Hr, s->k, s->v);
    s->o = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dv}, ctx.dt, "act.o_att");              // G3
    s->attn = attention_forward(ctx.c.kernel, dense_attention(ctx, s->q, s->k, s->v, s->o, ctx.Hr, ctx.Hr, ctx.Dqk, ctx.Dv));
    Tensor o = s->o;
    out = std::move(s);
    return o;
  }

  void backward(const RankCtx& ctx, const LayerWeights& w, std::unique_ptr<CoreSaved> saved, Tensor dout,
                LayerWeights& g, Tensor& dq_local, Tensor& dlatent) const override {
    auto& s = static_cast<LagaSaved&>(*saved);
    // G3 o = attention(q, k, v)
    auto [dq, dk, dv] = dense_attention_grads(ctx, s.q, s.k, s.v, s.o, s.attn, dout);
    dout = Tensor();
    s.attn = {};
    s.q = s.k = s.v = s.o = Tensor();
    // G2 backward (this rank's head shard), over the whole sequence
    Tensor dlatent_g = Tensor::empty({ctx.T, ctx.B, ctx.Dl}, ctx.c.dlatent_sum_dtype(), "grad.latent_g");
    up_project_backward(ctx, s.latent_g, w.wkv_b, ctx.r * ctx.Hr, ctx.Hr, dk, dv, dlatent_g, g.wkv_b);
    dk = dv = s.latent_g = Tensor();
    dlatent = reduce_scatter_tokens(ctx.comm, dlatent_g, "dlatent", "grad.latent", ctx.dt);  // G1 all-gather's adjoint
    dlatent_g = Tensor();
    dq_local = gather_heads(ctx.comm, dq, "dq", "grad.q_local");                     // G1 scatter_heads' adjoint
  }

  bool exact_at_one_rank() const override { return true; }

  std::vector<DeclaredCollective> collectives() const override {
    using Op = CollectiveOp;
    return {{Op::all_to_all, "q", Op::all_to_all, "dq"}, {Op::all_gather, "latent", Op::reduce_scatter, "dlatent"}};
  }

  double attention_forward_flops(const MlaConfig& c) const override {
    return laga::attention_forward_flops(c.batch, c.num_attention_heads, c.seq_len, c.qk_head_dim(), c.v_head_dim, true);
  }
};

}  // namespace

const Form& laga_form() {
  static const Laga form;
  return form;
}

}  // namespace laga::forms
