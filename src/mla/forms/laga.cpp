// The laga form (docs/design.md §2.4): the 576-wide latent all-gathered like the absorbed form,
// then per-head K/V rebuilt locally for this rank's head shard and standard attention — explicit's
// arithmetic with about half its communication.
//   G1  all_gather_tokens latent -> [T, B, Dl], issued before the query path runs;  scatter_heads q
//   G2  [k_nope | v] = ckv_gathered·wkv_b(shard)ᵀ;  k = [k_nope | kpe broadcast]   (q's all-to-all
//       behind it)
//   G3  o = attention(q, k, v)
// Backward: attention backward; gather_heads dq issued (behind G2's backward); G2's backward gives
// dlatent over the whole sequence, summed over this rank's heads, and dwkv_b of the shard;
// reduce_scatter_tokens (the all-gather's adjoint) issued, and the block's query-path backward runs
// behind it; then it gives this rank's dlatent. With overlap off each collective is waited where it
// is issued (the same operations in the same order). At P = 1 every collective is an identity and
// this is explicit's arithmetic, operation for operation: bit-identical results.
#include "common.hpp"
#include "laga/comm/pairs.hpp"

namespace laga::forms {

void add_laga_problems(const MlaConfig& c, std::vector<std::string>& p);  // laga_ulysses.cpp

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
    return "all-to-all of q and o, all-gather of the latent; K/V of this rank's heads rebuilt "
           "locally";
  }

  Tensor forward(const RankCtx& ctx, const LayerWeights& w, Tensor latent, const QueryPath& query,
                 std::unique_ptr<CoreSaved>& out) const override {
    auto s = std::make_unique<LagaSaved>();
    // G1: the latent's all-gather in flight behind the query path and q's all-to-all; q's behind G2
    InFlight latent_g =
        issue(ctx, all_gather_tokens_start(ctx.comm, std::move(latent), "latent", "act.latent_g"));
    InFlight q = issue(ctx, scatter_heads_start(ctx.comm, query(), "q", "act.q"));
    // the gathered copy holds this rank's tokens too: the local one is released
    s->latent_g = latent_g.wait();
    // G2 (this rank's heads)
    s->k = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dqk}, ctx.dt, "act.k");
    s->v = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dv}, ctx.dt, "act.v");
    up_project_forward(ctx, s->latent_g, w.wkv_b, ctx.r * ctx.Hr, ctx.Hr, s->k, s->v);
    s->q = q.wait();
    s->o = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dv}, ctx.dt, "act.o_att");  // G3
    s->attn = attention_forward(ctx.c.kernel, dense_attention(ctx, s->q, s->k, s->v, s->o, ctx.Hr,
                                                              ctx.Hr, ctx.Dqk, ctx.Dv));
    Tensor o = s->o;
    out = std::move(s);
    return o;
  }

  Tensor backward(const RankCtx& ctx, const LayerWeights& w, std::unique_ptr<CoreSaved> saved,
                  Tensor dout, LayerWeights& g,
                  const QueryPathBackward& query_backward) const override {
    auto& s = static_cast<LagaSaved&>(*saved);
    // G3 o = attention(q, k, v)
    auto [dq, dk, dv] = dense_attention_grads(ctx, s.q, s.k, s.v, s.o, s.attn, dout);
    dout = Tensor();
    s.attn = {};
    s.q = s.k = s.v = s.o = Tensor();
    // G1 scatter_heads' adjoint, in flight behind G2's backward
    InFlight dq_local =
        issue(ctx, gather_heads_start(ctx.comm, std::move(dq), "dq", "grad.q_local"));
    // G2 backward (this rank's head shard), over the whole sequence
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
  // P | H; where it fails, the message names the --ulysses values that run laga-ulysses.
  void add_problems(const MlaConfig& c, std::vector<std::string>& p) const override {
    add_laga_problems(c, p);
  }
};

}  // namespace

const Form& laga_form() {
  static const Laga form;
  return form;
}

}  // namespace laga::forms
