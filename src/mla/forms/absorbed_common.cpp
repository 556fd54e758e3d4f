// A2 and A4 of the absorbed form and their backwards (absorbed_common.hpp).
#include "absorbed_common.hpp"

namespace laga::forms {

namespace {

// Head h's [M·B, cols] slice of a [M, B, Hs, width] tensor, from column `col`.
MatView head_of(const Tensor& t, int64_t h, int64_t width, int64_t col, int64_t cols) {
  return MatView{at(t, h * width + col), t.dim(0) * t.dim(1), cols, t.dim(2) * width, t.dtype()};
}

}  // namespace

void absorb_query(const RankCtx& ctx, const LayerWeights& w, const Tensor& q, int64_t h0,
                  const Tensor& q_abs) {
  const int64_t Hs = q.dim(2), rows = q.dim(0) * q.dim(1);
  for (int64_t h = 0; h < Hs; ++h) {
    matmul_2d(head_of(q, h, ctx.Dqk, 0, ctx.Dn), w_uk(ctx, w.wkv_b, h0 + h),
              head_of(q_abs, h, ctx.Dl, 0, ctx.Lkv));
    copy_rows(ctx.dt, rows, ctx.Dr, at(q, h * ctx.Dqk + ctx.Dn), Hs * ctx.Dqk,
              at(q_abs, h * ctx.Dl + ctx.Lkv), Hs * ctx.Dl);
  }
}

Tensor absorb_query(const RankCtx& ctx, const LayerWeights& w, const Tensor& q, int64_t h0) {
  Tensor q_abs = Tensor::empty({q.dim(0), q.dim(1), q.dim(2), ctx.Dl}, ctx.dt, "act.q_abs");
  absorb_query(ctx, w, q, h0, q_abs);
  return q_abs;
}

void absorb_query_backward(const RankCtx& ctx, const LayerWeights& w, const Tensor& q,
                           const Tensor& dq_abs, int64_t h0, const Tensor& dq, LayerWeights& g) {
  // q_abs = [q_nope·W_UK | q_pe]:  dq_nope = dq_abs·W_UKᵀ,  dW_UK += q_nopeᵀ·dq_abs,  dq_pe =
  // dq_abs[Lkv:]
  const int64_t Hs = q.dim(2), rows = q.dim(0) * q.dim(1);
  for (int64_t h = 0; h < Hs; ++h) {
    matmul_2d(head_of(dq_abs, h, ctx.Dl, 0, ctx.Lkv), w_uk(ctx, w.wkv_b, h0 + h).t(),
              head_of(dq, h, ctx.Dqk, 0, ctx.Dn));
    matmul_2d(head_of(q, h, ctx.Dqk, 0, ctx.Dn).t(), head_of(dq_abs, h, ctx.Dl, 0, ctx.Lkv),
              w_uk(ctx, g.wkv_b, h0 + h), true);
    copy_rows(ctx.dt, rows, ctx.Dr, at(dq_abs, h * ctx.Dl + ctx.Lkv), Hs * ctx.Dl,
              at(dq, h * ctx.Dqk + ctx.Dn), Hs * ctx.Dqk);
  }
}

Tensor absorb_query_backward(const RankCtx& ctx, const LayerWeights& w, const Tensor& q,
                             const Tensor& dq_abs, int64_t h0, LayerWeights& g) {
  Tensor dq = Tensor::empty(q.shape(), ctx.dt, "grad.q");
  absorb_query_backward(ctx, w, q, dq_abs, h0, dq, g);
  return dq;
}

Tensor project_out(const RankCtx& ctx, const LayerWeights& w, const Tensor& o_lat, int64_t Dvo,
                   int64_t h0) {
  const int64_t Hs = o_lat.dim(2);
  Tensor o = Tensor::empty({o_lat.dim(0), o_lat.dim(1), Hs, ctx.Dv}, ctx.dt, "act.o_g");
  for (int64_t h = 0; h < Hs; ++h)
    matmul_2d(head_of(o_lat, h, Dvo, 0, ctx.Lkv), w_uv(ctx, w.wkv_b, h0 + h).t(),
              head_of(o, h, ctx.Dv, 0, ctx.Dv));
  return o;
}

Tensor project_out_backward(const RankCtx& ctx, const LayerWeights& w, const Tensor& dout,
                            const Tensor& o_lat, int64_t Dvo, int64_t h0, LayerWeights& g) {
  // o = o_lat·W_UVᵀ:  do_lat = do·W_UV,  dW_UV += doᵀ·o_lat (padding columns of do_lat zero)
  const int64_t Hs = o_lat.dim(2);
  const Shape shape = {o_lat.dim(0), o_lat.dim(1), Hs, Dvo};
  Tensor do_lat = Dvo > ctx.Lkv ? Tensor::zeros(shape, ctx.dt, "grad.o_att")
                                : Tensor::empty(shape, ctx.dt, "grad.o_att");
  for (int64_t h = 0; h < Hs; ++h) {
    matmul_2d(head_of(dout, h, ctx.Dv, 0, ctx.Dv), w_uv(ctx, w.wkv_b, h0 + h),
              head_of(do_lat, h, Dvo, 0, ctx.Lkv));
    matmul_2d(head_of(dout, h, ctx.Dv, 0, ctx.Dv).t(), head_of(o_lat, h, Dvo, 0, ctx.Lkv),
              w_uv(ctx, g.wkv_b, h0 + h), true);
  }
  return do_lat;
}

}  // namespace laga::forms
