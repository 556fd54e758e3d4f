// A2 and A4 of the absorbed form and their backwards (absorbed_common.hpp).
#include "absorbed_common.hpp"

namespace laga::forms {

Tensor absorb_query(const RankCtx& ctx, const LayerWeights& w, const Tensor& q) {
  Tensor q_abs = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dl}, ctx.dt, "act.q_abs");
  for (int64_t h = 0; h < ctx.Hr; ++h) {
    matmul_2d(head(ctx, q, h, ctx.Dqk, 0, ctx.Dn), w_uk(ctx, w.wkv_b, ctx.r * ctx.Hr + h),
              head(ctx, q_abs, h, ctx.Dl, 0, ctx.Lkv));
    copy_rows(ctx.dt, ctx.T * ctx.B, ctx.Dr, at(q, h * ctx.Dqk + ctx.Dn), ctx.Hr * ctx.Dqk,
              at(q_abs, h * ctx.Dl + ctx.Lkv), ctx.Hr * ctx.Dl);
  }
  return q_abs;
}

Tensor absorb_query_backward(const RankCtx& ctx, const LayerWeights& w, const Tensor& q,
                             const Tensor& dq_abs, LayerWeights& g) {
  // q_abs = [q_nope·W_UK | q_pe]:  dq_nope = dq_abs·W_UKᵀ,  dW_UK += q_nopeᵀ·dq_abs,  dq_pe =
  // dq_abs[Lkv:]
  Tensor dq = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dqk}, ctx.dt, "grad.q");
  for (int64_t h = 0; h < ctx.Hr; ++h) {
    const int64_t gh = ctx.r * ctx.Hr + h;
    matmul_2d(head(ctx, dq_abs, h, ctx.Dl, 0, ctx.Lkv), w_uk(ctx, w.wkv_b, gh).t(),
              head(ctx, dq, h, ctx.Dqk, 0, ctx.Dn));
    matmul_2d(head(ctx, q, h, ctx.Dqk, 0, ctx.Dn).t(), head(ctx, dq_abs, h, ctx.Dl, 0, ctx.Lkv),
              w_uk(ctx, g.wkv_b, gh), true);
    copy_rows(ctx.dt, ctx.T * ctx.B, ctx.Dr, at(dq_abs, h * ctx.Dl + ctx.Lkv), ctx.Hr * ctx.Dl,
              at(dq, h * ctx.Dqk + ctx.Dn), ctx.Hr * ctx.Dqk);
  }
  return dq;
}

Tensor project_out(const RankCtx& ctx, const LayerWeights& w, const Tensor& o_lat, int64_t Dvo) {
  Tensor o = Tensor::empty({ctx.T, ctx.B, ctx.Hr, ctx.Dv}, ctx.dt, "act.o_g");
  for (int64_t h = 0; h < ctx.Hr; ++h)
    matmul_2d(head(ctx, o_lat, h, Dvo, 0, ctx.Lkv), w_uv(ctx, w.wkv_b, ctx.r * ctx.Hr + h).t(),
              head(ctx, o, h, ctx.Dv, 0, ctx.Dv));
  return o;
}

Tensor project_out_backward(const RankCtx& ctx, const LayerWeights& w, const Tensor& dout,
                            const Tensor& o_lat, int64_t Dvo, LayerWeights& g) {
  // o = o_lat·W_UVᵀ:  do_lat = do·W_UV,  dW_UV += doᵀ·o_lat
  Tensor do_lat = Tensor::zeros({ctx.T, ctx.B, ctx.Hr, Dvo}, ctx.dt, "grad.o_att");
  for (int64_t h = 0; h < ctx.Hr; ++h) {
    const int64_t gh = ctx.r * ctx.Hr + h;
    matmul_2d(head(ctx, dout, h, ctx.Dv, 0, ctx.Dv), w_uv(ctx, w.wkv_b, gh),
              head(ctx, do_lat, h, Dvo, 0, ctx.Lkv));
    matmul_2d(head(ctx, dout, h, ctx.Dv, 0, ctx.Dv).t(), head(ctx, o_lat, h, Dvo, 0, ctx.Lkv),
              w_uv(ctx, g.wkv_b, gh), true);
  }
  return do_lat;
}

}  // namespace laga::forms
