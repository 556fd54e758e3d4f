// The shared pieces of the forms (common.hpp).
#include "common.hpp"

namespace laga::forms {

MatView w_uk(const RankCtx& ctx, const Tensor& wkv_b, int64_t g) {
  return MatView{at(wkv_b, g * (ctx.Dn + ctx.Dv) * ctx.Lkv), ctx.Dn, ctx.Lkv, ctx.Lkv,
                 wkv_b.dtype()};
}
MatView w_uv(const RankCtx& ctx, const Tensor& wkv_b, int64_t g) {
  return MatView{at(wkv_b, (g * (ctx.Dn + ctx.Dv) + ctx.Dn) * ctx.Lkv), ctx.Dv, ctx.Lkv, ctx.Lkv,
                 wkv_b.dtype()};
}
void up_project_forward(const RankCtx& ctx, const Tensor& latent, const Tensor& wkv_b, int64_t h0,
                        int64_t Hs, Tensor& k, Tensor& v) {
  const int64_t M = latent.dim(0) * ctx.B, W = ctx.Dn + ctx.Dv;
  // [k_nope | v] per head
  Tensor kvb = Tensor::empty({latent.dim(0), ctx.B, Hs, W}, ctx.dt, "act.kvb");
  // One product per head, whatever Hs: a form that rebuilds a head alone (laga-recompute) then runs
  // the very products of one that builds all heads at once, and the library's choice of kernel (and
  // so the summation order), which follows the product's shape, cannot differ between them.
  const MatView ckv = mat(latent).col_slice(0, ctx.Lkv),
                all = MatView{kvb.raw(), M, Hs * W, Hs * W, ctx.dt};
  for (int64_t h = 0; h < Hs; ++h) {
    const MatView head_rows{at(wkv_b, (h0 + h) * W * ctx.Lkv), W, ctx.Lkv, ctx.Lkv, wkv_b.dtype()};
    matmul_2d(ckv, head_rows.t(), all.col_slice(h * W, (h + 1) * W));
  }
  copy_rows(ctx.dt, M * Hs, ctx.Dn, kvb.raw(), W, k.raw(), ctx.Dqk);  // k_nope
  // kpe broadcast
  for (int64_t h = 0; h < Hs; ++h)
    copy_rows(ctx.dt, M, ctx.Dr, at(latent, ctx.Lkv), ctx.Dl, at(k, h * ctx.Dqk + ctx.Dn),
              Hs * ctx.Dqk);
  copy_rows(ctx.dt, M * Hs, ctx.Dv, at(kvb, ctx.Dn), W, v.raw(), ctx.Dv);  // v
}

void up_project_backward(const RankCtx& ctx, const Tensor& latent, const Tensor& wkv_b, int64_t h0,
                         int64_t Hs, const Tensor& dk, const Tensor& dv, Tensor& dlatent,
                         Tensor& dwkv_b) {
  const int64_t M = latent.dim(0) * ctx.B, W = ctx.Dn + ctx.Dv;
  const MatView rows{at(wkv_b, h0 * W * ctx.Lkv), Hs * W, ctx.Lkv, ctx.Lkv, wkv_b.dtype()};
  const MatView grad_rows{at(dwkv_b, h0 * W * ctx.Lkv), Hs * W, ctx.Lkv, ctx.Lkv, dwkv_b.dtype()};
  // k = [k_nope | kpe broadcast]:  dkvb = [dk_nope | dv],  dkpe = Σ_h dk[..., Dn:]
  Tensor dkvb = Tensor::empty({latent.dim(0), ctx.B, Hs, W}, ctx.dt, "grad.kvb");
  copy_rows(ctx.dt, M * Hs, ctx.Dn, dk.raw(), ctx.Dqk, dkvb.raw(), W);
  copy_rows(ctx.dt, M * Hs, ctx.Dv, dv.raw(), ctx.Dv, at(dkvb, ctx.Dn), W);
  sum_heads(ctx.dt, M, Hs, ctx.Dr, at(dk, ctx.Dn), Hs * ctx.Dqk, ctx.Dqk, dlatent.dtype(),
            at(dlatent, ctx.Lkv), ctx.Dl, false);
  // [k_nope | v] = ckv·W_kv_bᵀ:  dckv = dkvb·W,  dW += dkvbᵀ·ckv
  const MatView dkvb2{dkvb.raw(), M, Hs * W, Hs * W, ctx.dt};
  matmul_2d(dkvb2, rows, mat(dlatent).col_slice(0, ctx.Lkv));
  matmul_2d(dkvb2.t(), mat(latent).col_slice(0, ctx.Lkv), grad_rows, /*accumulate=*/true);
}

AttentionFwdParams dense_attention(const RankCtx& ctx, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const Tensor& o, int64_t Hq, int64_t Hkv,
                                   int64_t Dqk, int64_t Dv) {
  AttentionFwdParams p;
  p.B = ctx.B, p.T = ctx.T, p.Hq = Hq, p.Hkv = Hkv, p.Dqk = Dqk, p.Dv = Dv;
  p.dtype = ctx.dt, p.scale = float(ctx.c.softmax_scale()), p.causal = true;
  p.one_pass_backward = ctx.c.attn_backward == AttnBackward::one_pass;
  p.q = q.raw(), p.q_stride = dense_strides(ctx.B, Hq, Dqk);
  p.k = k.raw(), p.k_stride = dense_strides(ctx.B, Hkv, Dqk);
  p.v = v.raw(), p.v_stride = dense_strides(ctx.B, Hkv, Dv);
  p.o = o.raw(), p.o_stride = dense_strides(ctx.B, Hq, Dv);
  return p;
}

AttentionBwdParams dense_attention_backward(const AttentionFwdParams& fwd, const RankCtx& ctx,
                                            const Tensor& dout, const Tensor& dq, const Tensor& dk,
                                            const Tensor& dv) {
  AttentionBwdParams p;
  static_cast<AttentionFwdParams&>(p) = fwd;
  p.dout = dout.raw(), p.dout_stride = dense_strides(ctx.B, fwd.Hq, fwd.Dv);
  p.dq = dq.raw(), p.dq_stride = dense_strides(ctx.B, fwd.Hq, fwd.Dqk);
  p.dk = dk.raw(), p.dk_stride = dense_strides(ctx.B, fwd.Hkv, fwd.Dqk);
  p.dv = dv.raw(), p.dv_stride = dense_strides(ctx.B, fwd.Hkv, fwd.Dv);
  return p;
}

Tensor explicit_backward_tail(const RankCtx& ctx, const LayerWeights& w, const Tensor& latent,
                              Tensor dq, Tensor dk, Tensor dv, LayerWeights& g,
                              const QueryPathBackward& query_backward) {
  InFlight dq_local = issue(ctx, gather_heads_start(ctx.comm, std::move(dq), "dq", "grad.q_local"));
  InFlight dk_local = issue(ctx, gather_heads_start(ctx.comm, std::move(dk), "dk", "grad.k_local"));
  InFlight dv_local = issue(ctx, gather_heads_start(ctx.comm, std::move(dv), "dv", "grad.v_local"));
  query_backward(dq_local.wait());
  const Tensor dk_l = dk_local.wait(), dv_l = dv_local.wait();
  // E1 backward
  Tensor dlatent = Tensor::empty({ctx.N, ctx.B, ctx.Dl}, ctx.dt, "grad.latent");
  up_project_backward(ctx, latent, w.wkv_b, 0, ctx.H, dk_l, dv_l, dlatent, g.wkv_b);
  return dlatent;
}

HeadGrads dense_attention_grads(const RankCtx& ctx, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& o, const AttentionSaved& saved,
                                const Tensor& dout) {
  HeadGrads g;
  g.dq = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dqk}, ctx.dt, "grad.q");
  g.dk = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dqk}, ctx.dt, "grad.k");
  g.dv = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dv}, ctx.dt, "grad.v");
  const AttentionFwdParams p = dense_attention(ctx, q, k, v, o, ctx.Hr, ctx.Hr, ctx.Dqk, ctx.Dv);
  attention_backward(ctx.c.kernel, dense_attention_backward(p, ctx, dout, g.dq, g.dk, g.dv), saved);
  return g;
}

}  // namespace laga::forms
