// The shared pieces of the forms (common.hpp).
#include "common.hpp"

namespace laga::forms {

MatView w_uk(const RankCtx& x, const Tensor& wkv_b, int64_t g) {
  return MatView{at(wkv_b, g * (x.Dn + x.Dv) * x.Lkv), x.Dn, x.Lkv, x.Lkv, wkv_b.dtype()};
}
MatView w_uv(const RankCtx& x, const Tensor& wkv_b, int64_t g) {
  return MatView{at(wkv_b, (g * (x.Dn + x.Dv) + x.Dn) * x.Lkv), x.Dv, x.Lkv, x.Lkv, wkv_b.dtype()};
}
MatView head(const RankCtx& x, const Tensor& t, int64_t h, int64_t width, int64_t col, int64_t cols) {
  return MatView{at(t, h * width + col), x.T * x.B, cols, x.Hr * width, t.dtype()};
}

void up_project_forward(const RankCtx& x, const Tensor& latent, const Tensor& wkv_b, int64_t h0, int64_t Hs, Tensor& k,
                        Tensor& v) {
  const int64_t M = latent.dim(0) * x.B, W = x.Dn + x.Dv;
  const MatView rows{at(wkv_b, h0 * W * x.Lkv), Hs * W, x.Lkv, x.Lkv, wkv_b.dtype()};  // heads [h0, h0+Hs)
  Tensor kvb = Tensor::empty({latent.dim(0), x.B, Hs, W}, x.dt, "act.kvb");          // [k_nope | v] per head
  matmul_2d(mat(latent).col_slice(0, x.Lkv), rows.t(), MatView{kvb.raw(), M, Hs * W, Hs * W, x.dt});
  copy_rows(x.dt, M * Hs, x.Dn, kvb.raw(), W, k.raw(), x.Dqk);                       // k_nope
  for (int64_t h = 0; h < Hs; ++h)                                                   // kpe broadcast
    copy_rows(x.dt, M, x.Dr, at(latent, x.Lkv), x.Dl, at(k, h * x.Dqk + x.Dn), Hs * x.Dqk);
  copy_rows(x.dt, M * Hs, x.Dv, at(kvb, x.Dn), W, v.raw(), x.Dv);                    // v
}

void up_project_backward(const RankCtx& x, const Tensor& latent, const Tensor& wkv_b, int64_t h0, int64_t Hs,
                         const Tensor& dk, const Tensor& dv, Tensor& dlatent, Tensor& dwkv_b) {
  const int64_t M = latent.dim(0) * x.B, W = x.Dn + x.Dv;
  const MatView rows{at(wkv_b, h0 * W * x.Lkv), Hs * W, x.Lkv, x.Lkv, wkv_b.dtype()};
  const MatView grad_rows{at(dwkv_b, h0 * W * x.Lkv), Hs * W, x.Lkv, x.Lkv, dwkv_b.dtype()};
  // k = [k_nope | kpe broadcast]:  dkvb = [dk_nope | dv],  dkpe = Σ_h dk[..., Dn:]
  Tensor dkvb = Tensor::empty({latent.dim(0), x.B, Hs, W}, x.dt, "grad.kvb");
  copy_rows(x.dt, M * Hs, x.Dn, dk.raw(), x.Dqk, dkvb.raw(), W);
  copy_rows(x.dt, M * Hs, x.Dv, dv.raw(), x.Dv, at(dkvb, x.Dn), W);
  sum_heads(x.dt, M, Hs, x.Dr, at(dk, x.Dn), Hs * x.Dqk, x.Dqk, at(dlatent, x.Lkv), x.Dl, false);
  // [k_nope | v] = ckv·W_kv_bᵀ:  dckv = dkvb·W,  dW += dkvbᵀ·ckv
  const MatView dkvb2{dkvb.raw(), M, Hs * W, Hs * W, x.dt};
  matmul_2d(dkvb2, rows, mat(dlatent).col_slice(0, x.Lkv));
  matmul_2d(dkvb2.t(), mat(latent).col_slice(0, x.Lkv), grad_rows, /*accumulate=*/true);
}

AttentionFwdParams dense_attention(const RankCtx& x, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                   int64_t Hq, int64_t Hkv, int64_t Dqk, int64_t Dv) {
  AttentionFwdParams p;
  p.B = x.B, p.T = x.T, p.Hq = Hq, p.Hkv = Hkv, p.Dqk = Dqk, p.Dv = Dv;
  p.dtype = x.dt, p.scale = float(x.c.softmax_scale()), p.causal = true;
  p.q = q.raw(), p.q_stride = dense_strides(x.B, Hq, Dqk);
  p.k = k.raw(), p.k_stride = dense_strides(x.B, Hkv, Dqk);
  p.v = v.raw(), p.v_stride = dense_strides(x.B, Hkv, Dv);
  p.o = o.raw(), p.o_stride = dense_strides(x.B, Hq, Dv);
  return p;
}

AttentionBwdParams dense_attention_backward(const AttentionFwdParams& fwd, const RankCtx& x, const Tensor& dout,
                                            const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  AttentionBwdParams p;
  static_cast<AttentionFwdParams&>(p) = fwd;
  p.dout = dout.raw(), p.dout_stride = dense_strides(x.B, fwd.Hq, fwd.Dv);
  p.dq = dq.raw(), p.dq_stride = dense_strides(x.B, fwd.Hq, fwd.Dqk);
  p.dk = dk.raw(), p.dk_stride = dense_strides(x.B, fwd.Hkv, fwd.Dqk);
  p.dv = dv.raw(), p.dv_stride = dense_strides(x.B, fwd.Hkv, fwd.Dv);
  return p;
}

}  // namespace laga::forms
