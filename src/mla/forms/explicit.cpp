// The explicit form (docs/design.md §2.2): per-head K/V up-projected from this rank's own latent,
// then the Ulysses all-to-alls of q, k and v and standard attention over this rank's heads.
//   E1  [k_nope | v] = ckv·wkv_bᵀ (every head, local tokens);  k = [k_nope | kpe broadcast]
//   E2  scatter_heads k, v (issued before the query path runs), then q:  [N, B, H, ·] -> [T, B, Hr,
//       ·]
//   E3  o = attention(q, k, v)
// Backward walks them in reverse: attention backward, gather_heads of dq, dk, dv (E2's adjoint)
// issued together, the block's query-path backward behind dk's and dv's, E1's backward with dwkv_b
// partial over this rank's tokens. With overlap off each collective is waited where it is issued.
#include "common.hpp"
#include "laga/comm/pairs.hpp"

namespace laga::forms {

namespace {

struct ExplicitSaved final : CoreSaved {
  Tensor latent;  // [N, B, Dl]       this rank's [ckv | kpe], for E1's backward
  Tensor q, k;    // [T, B, Hr, Dqk]
  Tensor v, o;    // [T, B, Hr, Dv]   (o: the attention output)
  AttentionSaved attn;
  void for_each(const std::function<void(const char*, const Tensor&)>& f) const override {
    f("latent", latent), f("q", q), f("k", k), f("v", v), f("o_att", o);
  }
};

class Explicit final : public Form {
 public:
  std::string_view name() const override { return "explicit"; }
  std::string_view family() const override { return "explicit"; }
  std::string_view summary() const override {
    return "all-to-all of per-head q, k, v and o; K/V up-projected from the local latent";
  }

  Tensor forward(const RankCtx& ctx, const LayerWeights& w, Tensor latent, const QueryPath& query,
                 std::unique_ptr<CoreSaved>& out) const override {
    auto s = std::make_unique<ExplicitSaved>();
    // E1 (local tokens, every head)
    Tensor k_local = Tensor::empty({ctx.N, ctx.B, ctx.H, ctx.Dqk}, ctx.dt, "act.k_local");
    Tensor v_local = Tensor::empty({ctx.N, ctx.B, ctx.H, ctx.Dv}, ctx.dt, "act.v_local");
    up_project_forward(ctx, latent, w.wkv_b, 0, ctx.H, k_local, v_local);
    s->latent = std::move(latent);
    // E2: k's and v's all-to-alls in flight behind the query path and q's
    InFlight k = issue(ctx, scatter_heads_start(ctx.comm, std::move(k_local), "k", "act.k"));
    InFlight v = issue(ctx, scatter_heads_start(ctx.comm, std::move(v_local), "v", "act.v"));
    // nothing left to run behind it
    s->q = scatter_heads_start(ctx.comm, query(), "q", "act.q").wait();
    s->k = k.wait();
    s->v = v.wait();
    s->o = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dv}, ctx.dt, "act.o_att");  // E3
    s->attn = attention_forward(ctx.c.kernel, dense_attention(ctx, s->q, s->k, s->v, s->o, ctx.Hr,
                                                              ctx.Hr, ctx.Dqk, ctx.Dv));
    Tensor o = s->o;
    out = std::move(s);
    return o;
  }

  Tensor backward(const RankCtx& ctx, const LayerWeights& w, std::unique_ptr<CoreSaved> saved,
                  Tensor dout, LayerWeights& g,
                  const QueryPathBackward& query_backward) const override {
    auto& s = static_cast<ExplicitSaved&>(*saved);
    // E3 o = attention(q, k, v)
    auto [dq, dk, dv] = dense_attention_grads(ctx, s.q, s.k, s.v, s.o, s.attn, dout);
    dout = Tensor();
    s.attn = {};
    s.q = s.k = s.v = s.o = Tensor();
    // E2 scatter_heads q, k, v:  its adjoint brings dq, dk, dv back to the local tokens; dk's and
    // dv's all-to-alls in flight behind dq's and the block's query-path backward
    return explicit_backward_tail(ctx, w, s.latent, std::move(dq), std::move(dk), std::move(dv), g,
                                  query_backward);
  }
};

}  // namespace

const Form& explicit_form() {
  static const Explicit form;
  return form;
}

}  // namespace laga::forms
