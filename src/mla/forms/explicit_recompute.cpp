// The explicit-recompute form (docs/design.md §6, docs/accounting.md §6): explicit, saving its
// local latent instead of the head-sharded k and v, as Megatron-Core's
// recompute_modules=["mla_up_proj"] does under this sequence parallelism — the fair baseline for
// laga-recompute.
//   E1  [k_nope | v] = ckv·wkv_bᵀ (every head, local tokens);  k = [k_nope | kpe broadcast]
//   E2  scatter_heads k, v (issued before the query path runs), then q:  [N, B, H, ·] -> [T, B, Hr,
//       ·]
//   E3  o = attention(q, k, v);  k and v released, q, o and the local latent kept
// Backward first replays E1 and E2 for k and v (the same up-projection, the same all-to-alls "k"
// and "v" again: one extra up-projection and two extra all-to-alls per layer; nothing to run behind
// them), then is explicit's backward: attention backward, gather_heads of dq, dk, dv issued
// together, the block's query-path backward behind dk's and dv's, E1's backward with dwkv_b partial
// over this rank's tokens. Every operation is explicit's, on the same operands: bit-identical to
// explicit at every P.
#include "common.hpp"
#include "laga/comm/pairs.hpp"

namespace laga::forms {

namespace {

struct ExplicitRecomputeSaved final : CoreSaved {
  Tensor latent;  // [N, B, Dl]       this rank's [ckv | kpe], for E1 (replayed) and its backward
  Tensor q;       // [T, B, Hr, Dqk]
  Tensor o;       // [T, B, Hr, Dv]   the attention output
  AttentionSaved attn;
  void for_each(const std::function<void(const char*, const Tensor&)>& f) const override {
    f("latent", latent), f("q", q), f("o_att", o);
  }
};

class ExplicitRecompute final : public Form {
 public:
  std::string_view name() const override { return "explicit-recompute"; }
  std::string_view family() const override { return "explicit-recompute"; }
  std::string_view summary() const override {
    return "explicit saving its local latent, not k and v; backward re-up-projects and re-sends k "
           "and v";
  }

  Tensor forward(const RankCtx& ctx, const LayerWeights& w, Tensor latent, const QueryPath& query,
                 std::unique_ptr<CoreSaved>& out) const override {
    auto s = std::make_unique<ExplicitRecomputeSaved>();
    // E1, E2 of k and v
    auto [k_sent, v_sent] = up_project_and_scatter(ctx, w, latent, "act");
    s->latent = std::move(latent);
    // k's and v's ran behind the query path
    s->q = scatter_heads_start(ctx.comm, query(), "q", "act.q").wait();
    const Tensor k = k_sent.wait(), v = v_sent.wait();
    s->o = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dv}, ctx.dt, "act.o_att");  // E3
    s->attn = attention_forward(
        ctx.c.kernel, dense_attention(ctx, s->q, k, v, s->o, ctx.Hr, ctx.Hr, ctx.Dqk, ctx.Dv));
    Tensor o = s->o;
    out = std::move(s);
    return o;  // k and v are released here
  }

  Tensor backward(const RankCtx& ctx, const LayerWeights& w, std::unique_ptr<CoreSaved> saved,
                  Tensor dout, LayerWeights& g,
                  const QueryPathBackward& query_backward) const override {
    auto& s = static_cast<ExplicitRecomputeSaved&>(*saved);
    // E1, E2 replayed: k and v of this rank's heads again
    auto [k_sent, v_sent] = up_project_and_scatter(ctx, w, s.latent, "recompute");
    Tensor k = k_sent.wait(), v = v_sent.wait();
    // E3 o = attention(q, k, v)
    auto [dq, dk, dv] = dense_attention_grads(ctx, s.q, k, v, s.o, s.attn, dout);
    dout = Tensor();
    s.attn = {};
    s.q = s.o = k = v = Tensor();
    // E2 scatter_heads q, k, v:  its adjoint brings dq, dk, dv back to the local tokens; dk's and
    // dv's all-to-alls in flight behind dq's and the block's query-path backward
    return explicit_backward_tail(ctx, w, s.latent, std::move(dq), std::move(dk), std::move(dv), g,
                                  query_backward);
  }

  bool exact_at_one_rank() const override { return true; }

 private:
  // E1 then E2 for k and v, in explicit's order: up-project every head of the local tokens, then
  // issue the all-to-alls of k and v, each local tensor released once packed. Tags "<prefix>.k".
  struct Sent {
    InFlight k, v;
  };
  static Sent up_project_and_scatter(const RankCtx& ctx, const LayerWeights& w,
                                     const Tensor& latent, const std::string& prefix) {
    Tensor k_local = Tensor::empty({ctx.N, ctx.B, ctx.H, ctx.Dqk}, ctx.dt, prefix + ".k_local");
    Tensor v_local = Tensor::empty({ctx.N, ctx.B, ctx.H, ctx.Dv}, ctx.dt, prefix + ".v_local");
    up_project_forward(ctx, latent, w.wkv_b, 0, ctx.H, k_local, v_local);
    Sent s;
    s.k = issue(ctx, scatter_heads_start(ctx.comm, std::move(k_local), "k", prefix + ".k"));
    s.v = issue(ctx, scatter_heads_start(ctx.comm, std::move(v_local), "v", prefix + ".v"));
    return s;
  }
};

}  // namespace

const Form& explicit_recompute_form() {
  static const ExplicitRecompute form;
  return form;
}

}  // namespace laga::forms
