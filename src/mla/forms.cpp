// The three forms' cores (DESIGN §2.2–§2.4): what happens between the local stage (q, latent) and
// the all-to-all of o back to the local tokens, forward and backward.
//   explicit  E1 up-project locally, E2 a2a q, k, v, E3 attention;   backward: a2a dq, dk, dv back
//   laga      G1 a2a q, all-gather latent, G2 up-project this rank's head shard, G3 attention;
//             backward: dlatent summed over the shard's heads, reduce-scattered; a2a dq back
//   absorbed  A1 a2a q, all-gather latent, A2 q_abs = [q_nope·W_UK | q_pe], A3 MQA attention over
//             the latent (shared) or its per-head copies (expanded), A4 o = o_lat·W_UVᵀ
// Every buffer is a tracked tensor; the order of allocations and frees is the order the planner
// follows (docs/accounting.md).
#include "block_internal.hpp"

namespace laga::detail {

namespace {

// dst[m, :] (= or +=) Σ_{h < Hs} src[m, h, :] over `rows` rows of `cols` elements, in fp32,
// rounded once.
void sum_heads(DType t, int64_t rows, int64_t Hs, int64_t cols, const void* src, int64_t src_row, int64_t src_head,
               void* dst, int64_t dst_row, bool accumulate) {
  dispatch_dtype(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* s = static_cast<const T*>(src);
    T* d = static_cast<T*>(dst);
#pragma omp parallel for schedule(static) if (rows * Hs * cols >= kParallelMin)
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t i = 0; i < cols; ++i) {
        float acc = accumulate ? to_float(d[m * dst_row + i]) : 0.0f;
        for (int64_t h = 0; h < Hs; ++h) acc += to_float(s[m * src_row + h * src_head + i]);
        d[m * dst_row + i] = from_float<T>(acc);
      }
  });
}

// Rows of wkv_b (or its gradient) for head g: k-rows (W_UK, [Dn, Lkv]) and v-rows (W_UV, [Dv, Lkv]).
MatView w_uk(const Ctx& x, const Tensor& wkv_b, int64_t g) {
  return MatView{at(wkv_b, g * (x.Dn + x.Dv) * x.Lkv), x.Dn, x.Lkv, x.Lkv, wkv_b.dtype()};
}
MatView w_uv(const Ctx& x, const Tensor& wkv_b, int64_t g) {
  return MatView{at(wkv_b, (g * (x.Dn + x.Dv) + x.Dn) * x.Lkv), x.Dv, x.Lkv, x.Lkv, wkv_b.dtype()};
}
// Head h's [T·B, cols] slice of a [T, B, Hr, width] tensor, starting at column `col`.
MatView head(const Ctx& x, const Tensor& t, int64_t h, int64_t width, int64_t col, int64_t cols) {
  return MatView{at(t, h * width + col), x.T * x.B, cols, x.Hr * width, t.dtype()};
}

Tensor gather_latent(const Ctx& x, LayerSaved& s) {
  Tensor g = Tensor::empty({x.T, x.B, x.Dl}, x.dt, "act.latent_g");
  x.comm.all_gather(s.latent.raw(), g.raw(), x.N * x.B * x.Dl, x.dt, "latent");
  s.latent = Tensor();  // the gathered copy holds this rank's tokens too
  return g;
}

Tensor scatter_dlatent(const Ctx& x, const Tensor& dlatent_g) {
  Tensor d = Tensor::empty({x.N, x.B, x.Dl}, x.dt, "grad.latent");
  x.comm.reduce_scatter(dlatent_g.raw(), d.raw(), x.N * x.B * x.Dl, x.dt, "dlatent");
  return d;
}

bool padded(const Ctx& x) { return x.c.absorbed_kv == AbsorbedKv::expanded && x.c.kernel == Kernel::fused; }
int64_t o_lat_width(const Ctx& x) { return padded(x) ? x.Dl : x.Lkv; }

AttentionFwdParams absorbed_attention(const Ctx& x, const LayerSaved& s) {
  AttentionFwdParams p;
  if (x.c.absorbed_kv == AbsorbedKv::shared) {
    // K = the latent, V = its first Lkv columns: one head shared by all Hr query heads.
    p = dense_attention(x, s.q_abs, s.latent_g, s.latent_g, s.o_att, x.Hr, 1, x.Dl, x.Lkv);
    p.k_stride = p.v_stride = AttentionStrides{x.B * x.Dl, x.Dl, 0};
  } else {
    p = dense_attention(x, s.q_abs, s.k_exp, s.v_exp, s.o_att, x.Hr, x.Hr, x.Dl, o_lat_width(x));
  }
  return p;
}

Tensor absorbed_forward(const Ctx& x, const LayerWeights& w, LayerSaved& s) {
  s.latent_g = gather_latent(x, s);                                               // A1
  s.q_abs = Tensor::empty({x.T, x.B, x.Hr, x.Dl}, x.dt, "act.q_abs");            // A2
  for (int64_t h = 0; h < x.Hr; ++h) {
    matmul_2d(head(x, s.q, h, x.Dqk, 0, x.Dn), w_uk(x, w.wkv_b, x.r * x.Hr + h), head(x, s.q_abs, h, x.Dl, 0, x.Lkv));
    copy_rows(x.dt, x.T * x.B, x.Dr, at(s.q, h * x.Dqk + x.Dn), x.Hr * x.Dqk, at(s.q_abs, h * x.Dl + x.Lkv), x.Hr * x.Dl);
  }
  const int64_t Dvo = o_lat_width(x);
  if (x.c.absorbed_kv == AbsorbedKv::expanded) {
    // What stock kernels force: the latent copied to every head (V zero-padded to Dl for fused).
    s.k_exp = Tensor::empty({x.T, x.B, x.Hr, x.Dl}, x.dt, "act.k_exp");
    s.v_exp = Tensor::zeros({x.T, x.B, x.Hr, Dvo}, x.dt, "act.v_exp");
    for (int64_t h = 0; h < x.Hr; ++h) {
      copy_rows(x.dt, x.T * x.B, x.Dl, s.latent_g.raw(), x.Dl, at(s.k_exp, h * x.Dl), x.Hr * x.Dl);
      copy_rows(x.dt, x.T * x.B, x.Lkv, s.latent_g.raw(), x.Dl, at(s.v_exp, h * Dvo), x.Hr * Dvo);
    }
  }
  s.o_att = Tensor::empty({x.T, x.B, x.Hr, Dvo}, x.dt, "act.o_att");              // A3
  s.attn = attention_forward(x.c.kernel, absorbed_attention(x, s));
  Tensor o = Tensor::empty({x.T, x.B, x.Hr, x.Dv}, x.dt, "act.o_g");              // A4 o = o_lat·W_UVᵀ
  for (int64_t h = 0; h < x.Hr; ++h)
    matmul_2d(head(x, s.o_att, h, Dvo, 0, x.Lkv), w_uv(x, w.wkv_b, x.r * x.Hr + h).t(), head(x, o, h, x.Dv, 0, x.Dv));
  return o;
}

void absorbed_backward(const Ctx& x, const LayerWeights& w, LayerSaved& s, Tensor dout, LayerWeights& g,
                       Tensor& dq_local, Tensor& dlatent) {
  const int64_t Dvo = o_lat_width(x);
  // A4 o = o_lat·W_UVᵀ:  do_lat = do·W_UV,  dW_UV += doᵀ·o_lat
  Tensor do_lat = Tensor::zeros({x.T, x.B, x.Hr, Dvo}, x.dt, "grad.o_att");
  for (int64_t h = 0; h < x.Hr; ++h) {
    const int64_t gh = x.r * x.Hr + h;
    matmul_2d(head(x, dout, h, x.Dv, 0, x.Dv), w_uv(x, w.wkv_b, gh), head(x, do_lat, h, Dvo, 0, x.Lkv));
    matmul_2d(head(x, dout, h, x.Dv, 0, x.Dv).t(), head(x, s.o_att, h, Dvo, 0, x.Lkv), w_uv(x, g.wkv_b, gh), true);
  }
  dout = Tensor();
  // A3 attention:  dq_abs, and dK, dV summed into dlatent_g
  Tensor dq_abs = Tensor::empty({x.T, x.B, x.Hr, x.Dl}, x.dt, "grad.q_abs");
  Tensor dlatent_g;
  {
    AttentionBwdParams p;
    static_cast<AttentionFwdParams&>(p) = absorbed_attention(x, s);
    p.dout = do_lat.raw(), p.dout_stride = dense_strides(x.B, x.Hr, Dvo);
    p.dq = dq_abs.raw(), p.dq_stride = dense_strides(x.B, x.Hr, x.Dl);
    if (x.c.absorbed_kv == AbsorbedKv::shared) {
      dlatent_g = Tensor::empty({x.T, x.B, x.Dl}, x.dt, "grad.latent_g");
      Tensor dv = Tensor::empty({x.T, x.B, 1, x.Lkv}, x.dt, "grad.v_lat");
      p.dk = dlatent_g.raw(), p.dk_stride = dense_strides(x.B, 1, x.Dl);
      p.dv = dv.raw(), p.dv_stride = dense_strides(x.B, 1, x.Lkv);
      attention_backward(x.c.kernel, p, s.attn);
      sum_heads(x.dt, x.T * x.B, 1, x.Lkv, dv.raw(), x.Lkv, 0, dlatent_g.raw(), x.Dl, /*accumulate=*/true);
    } else {
      Tensor dk = Tensor::empty({x.T, x.B, x.Hr, x.Dl}, x.dt, "grad.k_exp");
      Tensor dv = Tensor::empty({x.T, x.B, x.Hr, Dvo}, x.dt, "grad.v_exp");
      p.dk = dk.raw(), p.dk_stride = dense_strides(x.B, x.Hr, x.Dl);
      p.dv = dv.raw(), p.dv_stride = dense_strides(x.B, x.Hr, Dvo);
      attention_backward(x.c.kernel, p, s.attn);
      s.k_exp = s.v_exp = Tensor();
      dlatent_g = Tensor::empty({x.T, x.B, x.Dl}, x.dt, "grad.latent_g");
      sum_heads(x.dt, x.T * x.B, x.Hr, x.Dl, dk.raw(), x.Hr * x.Dl, x.Dl, dlatent_g.raw(), x.Dl, false);
      sum_heads(x.dt, x.T * x.B, x.Hr, x.Lkv, dv.raw(), x.Hr * Dvo, Dvo, dlatent_g.raw(), x.Dl, true);
    }
  }
  do_lat = Tensor();
  s.attn = {};
  s.o_att = s.q_abs = s.latent_g = Tensor();
  // A2 q_abs = [q_nope·W_UK | q_pe]:  dq_nope = dq_abs·W_UKᵀ,  dW_UK += q_nopeᵀ·dq_abs,  dq_pe = dq_abs[Lkv:]
  Tensor dq = Tensor::empty({x.T, x.B, x.Hr, x.Dqk}, x.dt, "grad.q");
  for (int64_t h = 0; h < x.Hr; ++h) {
    const int64_t gh = x.r * x.Hr + h;
    matmul_2d(head(x, dq_abs, h, x.Dl, 0, x.Lkv), w_uk(x, w.wkv_b, gh).t(), head(x, dq, h, x.Dqk, 0, x.Dn));
    matmul_2d(head(x, s.q, h, x.Dqk, 0, x.Dn).t(), head(x, dq_abs, h, x.Dl, 0, x.Lkv), w_uk(x, g.wkv_b, gh), true);
    copy_rows(x.dt, x.T * x.B, x.Dr, at(dq_abs, h * x.Dl + x.Lkv), x.Hr * x.Dl, at(dq, h * x.Dqk + x.Dn), x.Hr * x.Dqk);
  }
  dq_abs = s.q = Tensor();
  dlatent = scatter_dlatent(x, dlatent_g);                                          // A1 all-gather's adjoint
  dlatent_g = Tensor();
  dq_local = tokens_to_heads(x, dq, x.Dqk, "dq", "grad.q_local");                  // A1 a2a q's adjoint
}

}  // namespace

void up_project_forward(const Ctx& x, const Tensor& latent, const Tensor& wkv_b, int64_t h0, int64_t Hs, Tensor& k,
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

void up_project_backward(const Ctx& x, const Tensor& latent, const Tensor& wkv_b, int64_t h0, int64_t Hs,
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

AttentionFwdParams dense_attention(const Ctx& x, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
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

Tensor core_forward(const Ctx& x, const LayerWeights& w, Tensor q_local, LayerSaved& s) {
  const Form form = x.c.form;
  Tensor k_local, v_local;
  if (form == Form::explicit_form) {                                               // E1 (local tokens, every head)
    k_local = Tensor::empty({x.N, x.B, x.H, x.Dqk}, x.dt, "act.k_local");
    v_local = Tensor::empty({x.N, x.B, x.H, x.Dv}, x.dt, "act.v_local");
    up_project_forward(x, s.latent, w.wkv_b, 0, x.H, k_local, v_local);
  }
  s.q = heads_to_tokens(x, q_local, x.Dqk, "q", "act.q");                          // E2 / G1 / A1 a2a q
  q_local = Tensor();
  if (form == Form::absorbed) return absorbed_forward(x, w, s);
  if (form == Form::explicit_form) {                                               // E2 a2a k, v
    s.k = heads_to_tokens(x, k_local, x.Dqk, "k", "act.k");
    k_local = Tensor();
    s.v = heads_to_tokens(x, v_local, x.Dv, "v", "act.v");
    v_local = Tensor();
  } else {                                                                         // G1 all-gather, G2 up-project the shard
    s.latent_g = gather_latent(x, s);
    s.k = Tensor::empty({x.T, x.B, x.Hr, x.Dqk}, x.dt, "act.k");
    s.v = Tensor::empty({x.T, x.B, x.Hr, x.Dv}, x.dt, "act.v");
    up_project_forward(x, s.latent_g, w.wkv_b, x.r * x.Hr, x.Hr, s.k, s.v);
  }
  s.o_att = Tensor::empty({x.T, x.B, x.Hr, x.Dv}, x.dt, "act.o_att");             // E3 / G3 attention
  s.attn = attention_forward(x.c.kernel, dense_attention(x, s.q, s.k, s.v, s.o_att, x.Hr, x.Hr, x.Dqk, x.Dv));
  return s.o_att;
}

void core_backward(const Ctx& x, const LayerWeights& w, LayerSaved& s, Tensor dout, LayerWeights& g, Tensor& dq_local,
                   Tensor& dlatent) {
  if (x.c.form == Form::absorbed) return absorbed_backward(x, w, s, std::move(dout), g, dq_local, dlatent);
  // E3 / G3 o = attention(q, k, v)
  Tensor dq = Tensor::empty({x.T, x.B, x.Hr, x.Dqk}, x.dt, "grad.q");
  Tensor dk = Tensor::empty({x.T, x.B, x.Hr, x.Dqk}, x.dt, "grad.k");
  Tensor dv = Tensor::empty({x.T, x.B, x.Hr, x.Dv}, x.dt, "grad.v");
  {
    AttentionBwdParams p;
    static_cast<AttentionFwdParams&>(p) = dense_attention(x, s.q, s.k, s.v, s.o_att, x.Hr, x.Hr, x.Dqk, x.Dv);
    p.dout = dout.raw(), p.dout_stride = dense_strides(x.B, x.Hr, x.Dv);
    p.dq = dq.raw(), p.dq_stride = dense_strides(x.B, x.Hr, x.Dqk);
    p.dk = dk.raw(), p.dk_stride = dense_strides(x.B, x.Hr, x.Dqk);
    p.dv = dv.raw(), p.dv_stride = dense_strides(x.B, x.Hr, x.Dv);
    attention_backward(x.c.kernel, p, s.attn);
  }
  dout = Tensor();
  s.attn = {};
  s.q = s.k = s.v = s.o_att = Tensor();
  if (x.c.form == Form::explicit_form) {
    // E2 a2a q, k, v:  their adjoints bring dq, dk, dv back to the local tokens
    dq_local = tokens_to_heads(x, dq, x.Dqk, "dq", "grad.q_local");
    dq = Tensor();
    Tensor dk_local = tokens_to_heads(x, dk, x.Dqk, "dk", "grad.k_local");
    dk = Tensor();
    Tensor dv_local = tokens_to_heads(x, dv, x.Dv, "dv", "grad.v_local");
    dv = Tensor();
    dlatent = Tensor::empty({x.N, x.B, x.Dl}, x.dt, "grad.latent");               // E1 backward
    up_project_backward(x, s.latent, w.wkv_b, 0, x.H, dk_local, dv_local, dlatent, g.wkv_b);
    s.latent = Tensor();
  } else {
    Tensor dlatent_g = Tensor::empty({x.T, x.B, x.Dl}, x.dt, "grad.latent_g");     // G2 backward (the shard)
    up_project_backward(x, s.latent_g, w.wkv_b, x.r * x.Hr, x.Hr, dk, dv, dlatent_g, g.wkv_b);
    dk = dv = s.latent_g = Tensor();
    dlatent = scatter_dlatent(x, dlatent_g);                                        // G1 all-gather's adjoint
    dlatent_g = Tensor();
    dq_local = tokens_to_heads(x, dq, x.Dqk, "dq", "grad.q_local");                // G1 a2a q's adjoint
  }
}

}  // namespace laga::detail
