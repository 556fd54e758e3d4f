// A2 and A4 of the absorbed form and their backwards (absorbed_common.hpp).
#include "absorbed_common.hpp"

namespace laga::forms {

Tensor absorb_query(const RankCtx& x, const LayerWeights& w, const Tensor& q) {
  Tensor q_abs = Tensor::empty({x.T, x.B, x.Hr, x.Dl}, x.dt, "act.q_abs");
  for (int64_t h = 0; h < x.Hr; ++h) {
    matmul_2d(head(x, q, h, x.Dqk, 0, x.Dn), w_uk(x, w.wkv_b, x.r * x.Hr + h), head(x, q_abs, h, x.Dl, 0, x.Lkv));
    copy_rows(x.dt, x.T * x.B, x.Dr, at(q, h * x.Dqk + x.Dn), x.Hr * x.Dqk, at(q_abs, h * x.Dl + x.Lkv), x.Hr * x.Dl);
  }
  return q_abs;
}

Tensor absorb_query_backward(const RankCtx& x, const LayerWeights& w, const Tensor& q, const Tensor& dq_abs,
                             LayerWeights& g) {
  // q_abs = [q_nope·W_UK | q_pe]:  dq_nope = dq_abs·W_UKᵀ,  dW_UK += q_nopeᵀ·dq_abs,  dq_pe = dq_abs[Lkv:]
  Tensor dq = Tensor::empty({x.T, x.B, x.Hr, x.Dqk}, x.dt, "grad.q");
  for (int64_t h = 0; h < x.Hr; ++h) {
    const int64_t gh = x.r * x.Hr + h;
    matmul_2d(head(x, dq_abs, h, x.Dl, 0, x.Lkv), w_uk(x, w.wkv_b, gh).t(), head(x, dq, h, x.Dqk, 0, x.Dn));
    matmul_2d(head(x, q, h, x.Dqk, 0, x.Dn).t(), head(x, dq_abs, h, x.Dl, 0, x.Lkv), w_uk(x, g.wkv_b, gh), true);
    copy_rows(x.dt, x.T * x.B, x.Dr, at(dq_abs, h * x.Dl + x.Lkv), x.Hr * x.Dl, at(dq, h * x.Dqk + x.Dn), x.Hr * x.Dqk);
  }
  return dq;
}

Tensor project_out(const RankCtx& x, const LayerWeights& w, const Tensor& o_lat, int64_t Dvo) {
  Tensor o = Tensor::empty({x.T, x.B, x.Hr, x.Dv}, x.dt, "act.o_g");
  for (int64_t h = 0; h < x.Hr; ++h)
    matmul_2d(head(x, o_lat, h, Dvo, 0, x.Lkv), w_uv(x, w.wkv_b, x.r * x.Hr + h).t(), head(x, o, h, x.Dv, 0, x.Dv));
  return o;
}

Tensor project_out_backward(const RankCtx& x, const LayerWeights& w, const Tensor& dout, const Tensor& o_lat,
                            int64_t Dvo, LayerWeights& g) {
  // o = o_lat·W_UVᵀ:  do_lat = do·W_UV,  dW_UV += doᵀ·o_lat
  Tensor do_lat = Tensor::zeros({x.T, x.B, x.Hr, Dvo}, x.dt, "grad.o_att");
  for (int64_t h = 0; h < x.Hr; ++h) {
    const int64_t gh = x.r * x.Hr + h;
    matmul_2d(head(x, dout, h, x.Dv, 0, x.Dv), w_uv(x, w.wkv_b, gh), head(x, do_lat, h, Dvo, 0, x.Lkv));
    matmul_2d(head(x, dout, h, x.Dv, 0, x.Dv).t(), head(x, o_lat, h, Dvo, 0, x.Lkv), w_uv(x, g.wkv_b, gh), true);
  }
  return do_lat;
}

}  // namespace laga::forms
