// The laga-fused form (docs/design.md §2.4.1): laga's dataflow and collectives, with G2 (the
// per-head up-projection of the gathered latent) moved inside the attention kernel, one key tile at
// a time (ops/latent_attention.hpp): K, V of this rank's heads are never materialised for the whole
// sequence, nor are dK, dV in backward.
//   G1  all_gather_tokens latent -> [T, B, Dl], issued before the query path runs;  scatter_heads q
//   G3  o = latent_attention(q, latent_g, wkv_b(shard)): per key tile j, K_j = [ckv_j·W_UKᵀ |
//       kpe_j], V_j = ckv_j·W_UVᵀ, folded into every query tile that sees it;  lse saved
// Saved: the gathered latent, q, o and lse (laga-recompute's set). Backward: the kernel rebuilds
// K_j, V_j once more per key tile and gives dq, dlatent of the whole sequence (summed over this
// rank's heads) and the shard's dwkv_b rows; then, as laga, gather_heads dq issued,
// reduce_scatter_tokens dlatent issued, and the block's query-path backward runs behind them.
//
// The kernel is its own (neither --kernel's eager nor fused): the form runs it whatever --kernel
// says, which its summary and docs/design.md state. Not bit-identical to explicit at P = 1 (the
// up-projection is done per tile and per head, and dq comes from the key-tile loop), so
// exact_at_one_rank() is false.
#include "common.hpp"
#include "laga/comm/pairs.hpp"
#include "laga/ops/latent_attention.hpp"

namespace laga::forms {

namespace {

struct LagaFusedSaved final : CoreSaved {
  Tensor latent_g;      // [T, B, Dl]      the gathered latent
  Tensor q;             // [T, B, Hr, Dqk]
  Tensor o;             // [T, B, Hr, Dv]
  AttentionSaved attn;  // lse [B, Hr, T]
  void for_each(const std::function<void(const char*, const Tensor&)>& f) const override {
    f("latent_g", latent_g), f("q", q), f("o_att", o);
  }
};

LatentAttentionParams latent_params(const RankCtx& ctx, const LayerWeights& w,
                                    const Tensor& latent_g, const Tensor& q, const Tensor& o) {
  LatentAttentionParams p;
  p.B = ctx.B, p.T = ctx.T, p.H = ctx.Hr;
  p.Lkv = ctx.Lkv, p.Dr = ctx.Dr, p.Dn = ctx.Dn, p.Dv = ctx.Dv;
  p.dtype = ctx.dt, p.scale = float(ctx.c.softmax_scale());
  p.latent = latent_g.raw(), p.q = q.raw(), p.o = o.raw();
  p.wkv = at(w.wkv_b, ctx.r * ctx.Hr * (ctx.Dn + ctx.Dv) * ctx.Lkv);  // this rank's head shard
  return p;
}

class LagaFused final : public Form {
 public:
  std::string_view name() const override { return "laga-fused"; }
  std::string_view family() const override { return "laga-fused"; }
  std::string_view summary() const override {
    return "laga with K/V rebuilt per key tile inside its own attention kernel (any --kernel); "
           "saves laga-recompute's "
           "set, never holds whole-sequence K, V, dK, dV";
  }

  Tensor forward(const RankCtx& ctx, const LayerWeights& w, Tensor latent, const QueryPath& query,
                 std::unique_ptr<CoreSaved>& out) const override {
    auto s = std::make_unique<LagaFusedSaved>();
    // G1: the latent's all-gather in flight behind the query path and q's all-to-all
    InFlight latent_g =
        issue(ctx, all_gather_tokens_start(ctx.comm, std::move(latent), "latent", "act.latent_g"));
    InFlight q = issue(ctx, scatter_heads_start(ctx.comm, query(), "q", "act.q"));
    s->latent_g = latent_g.wait();
    s->q = q.wait();
    // G3 (G2 inside, per key tile)
    s->o = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dv}, ctx.dt, "act.o_att");
    s->attn = latent_attention_forward(latent_params(ctx, w, s->latent_g, s->q, s->o));
    Tensor o = s->o;
    out = std::move(s);
    return o;
  }

  Tensor backward(const RankCtx& ctx, const LayerWeights& w, std::unique_ptr<CoreSaved> saved,
                  Tensor dout, LayerWeights& g,
                  const QueryPathBackward& query_backward) const override {
    auto& s = static_cast<LagaFusedSaved&>(*saved);
    Tensor dlatent_g =
        Tensor::empty({ctx.T, ctx.B, ctx.Dl}, ctx.c.dlatent_sum_dtype(), "grad.latent_g");
    LatentAttentionBwdParams p;
    static_cast<LatentAttentionParams&>(p) = latent_params(ctx, w, s.latent_g, s.q, s.o);
    p.dout = dout.raw();
    p.dlatent = dlatent_g.raw(), p.dlatent_dtype = dlatent_g.dtype();
    p.dwkv = at(g.wkv_b, ctx.r * ctx.Hr * (ctx.Dn + ctx.Dv) * ctx.Lkv),
    p.dwkv_dtype = g.wkv_b.dtype();
    // G3 and G2 backward, key tile by key tile
    Tensor dq_sum = latent_attention_backward(p, s.attn);
    // Everything the kernel read is released before dq is allocated beside its fp32 sum.
    dout = Tensor();
    s.attn = {};
    s.q = s.o = s.latent_g = Tensor();
    Tensor dq = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dqk}, ctx.dt, "grad.q");
    latent_attention_dq(p, dq_sum, dq.raw());
    // G1's adjoints: dq's all-to-all, then the all-gather's, in flight behind the block's
    // query-path backward
    InFlight dq_local =
        issue(ctx, gather_heads_start(ctx.comm, std::move(dq), "dq", "grad.q_local"));
    InFlight dlatent = issue(ctx, reduce_scatter_tokens_start(ctx.comm, std::move(dlatent_g),
                                                              "dlatent", "grad.latent", ctx.dt));
    query_backward(dq_local.wait());
    return dlatent.wait();
  }

  std::string_view own_kernel() const override { return "latent"; }
};

}  // namespace

const Form& laga_fused_form() {
  static const LagaFused form;
  return form;
}

}  // namespace laga::forms
