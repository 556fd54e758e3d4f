// The MLA block stack on one rank of a sequence-parallel group (DESIGN §2): the local stage (L1–L6),
// the form's core (src/mla/forms.cpp), the output projection and residual; forward line by line and
// the backward walking the same lines in reverse, each step quoting the line it differentiates.
#include <cstring>

#include "block_internal.hpp"
#include "laga/core/fault.hpp"
#include "laga/core/finite.hpp"
#include "laga/ops/linear.hpp"
#include "laga/ops/rmsnorm.hpp"
#include "laga/ops/rope.hpp"

namespace laga {

namespace detail {

Ctx::Ctx(const MlaConfig& cfg, Communicator& cm)
    : c(cfg), comm(cm), P(cm.size()), r(cm.rank()), N(cfg.tokens_per_rank()), T(cfg.seq_len), B(cfg.batch),
      D(cfg.hidden_size), H(cfg.num_attention_heads), Hr(cfg.heads_per_rank()), Lq(cfg.q_lora_rank),
      Lkv(cfg.kv_lora_rank), Dn(cfg.qk_nope_head_dim), Dr(cfg.qk_rope_head_dim), Dqk(cfg.qk_head_dim()),
      Dv(cfg.v_head_dim), Dl(cfg.latent_dim()), pos0(cm.rank() * cfg.tokens_per_rank()), dt(cfg.dtype) {
  LAGA_CHECK(cfg.sp == cm.size(), "config says --sp {} but the group has {} ranks; run with --sp {}", cfg.sp, cm.size(),
             cm.size());
}

void copy_rows(DType t, int64_t rows, int64_t cols, const void* src, int64_t src_stride, void* dst, int64_t dst_stride) {
  const int64_t es = dtype_size(t);
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMin)
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(static_cast<char*>(dst) + i * dst_stride * es, static_cast<const char*>(src) + i * src_stride * es,
                size_t(cols * es));
}

void* at(const Tensor& x, int64_t offset) { return static_cast<char*>(x.raw()) + offset * dtype_size(x.dtype()); }

void add_into(Tensor& y, const Tensor& x) {
  LAGA_ASSERT(y.shape() == x.shape() && y.dtype() == x.dtype(), "add_into '{}' {} += '{}' {}", y.tag(),
              shape_str(y.shape()), x.tag(), shape_str(x.shape()));
  dispatch_dtype(y.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* yp = y.data<T>();
    const T* xp = x.data<T>();
#pragma omp parallel for schedule(static) if (y.numel() >= kParallelMin)
    for (int64_t i = 0; i < y.numel(); ++i) yp[i] = from_float<T>(to_float(yp[i]) + to_float(xp[i]));
  });
}

Tensor heads_to_tokens(const Ctx& x, const Tensor& in, int64_t d, const std::string& name, const std::string& tag) {
  check_shape(in, {x.N, x.B, x.H, d}, name.c_str());
  // send [P, N, B, Hr, d]: chunk j holds rank j's heads of every local token.
  Tensor send = Tensor::empty({x.P, x.N, x.B, x.Hr, d}, x.dt, "comm.send");
  for (int64_t j = 0; j < x.P; ++j)
    copy_rows(x.dt, x.N * x.B, x.Hr * d, at(in, j * x.Hr * d), x.H * d, at(send, j * x.N * x.B * x.Hr * d), x.Hr * d);
  Tensor out = Tensor::empty({x.T, x.B, x.Hr, d}, x.dt, tag);  // chunk j = rank j's tokens
  x.comm.all_to_all(send.raw(), out.raw(), x.N * x.B * x.Hr * d, x.dt, name);
  return out;
}

Tensor tokens_to_heads(const Ctx& x, const Tensor& in, int64_t d, const std::string& name, const std::string& tag) {
  check_shape(in, {x.T, x.B, x.Hr, d}, name.c_str());
  // in's chunk j (rank j's tokens) goes to rank j; recv [P, N, B, Hr, d]: chunk j = rank j's heads.
  Tensor recv = Tensor::empty({x.P, x.N, x.B, x.Hr, d}, x.dt, "comm.recv");
  x.comm.all_to_all(in.raw(), recv.raw(), x.N * x.B * x.Hr * d, x.dt, name);
  Tensor out = Tensor::empty({x.N, x.B, x.H, d}, x.dt, tag);
  for (int64_t j = 0; j < x.P; ++j)
    copy_rows(x.dt, x.N * x.B, x.Hr * d, at(recv, j * x.N * x.B * x.Hr * d), x.Hr * d, at(out, j * x.Hr * d), x.H * d);
  return out;
}

}  // namespace detail

namespace {

using namespace detail;

RopeParams rope_on(const Ctx& x, void* data, int64_t inner, int64_t t_stride, int64_t inner_stride) {
  RopeParams p = rope_params(x.c);
  p.x = data, p.T = x.N, p.inner = inner, p.t_stride = t_stride, p.inner_stride = inner_stride, p.pos0 = x.pos0;
  return p;
}

Tensor layer_forward(const Ctx& x, const LayerWeights& w, const Tensor& in, LayerSaved& s, int64_t layer) {
  const MlaConfig& c = x.c;
  s.x = in;
  s.xn = rmsnorm_forward(in, w.attn_norm, c.rms_norm_eps, "act.xn");                  // xn = RMSNorm(x)
  Tensor q;
  if (x.Lq > 0) {
    s.cq = linear_forward(s.xn, w.wq_a, "act.cq");                                   // L1 cq = xn·wq_aᵀ
    s.cqn = rmsnorm_forward(s.cq, w.q_norm, c.rms_norm_eps, "act.cqn");              // L2 cqn = RMSNorm(cq)
    q = linear_forward(s.cqn, w.wq_b, "act.q_local");                                // L3 q = cqn·wq_bᵀ
  } else {
    q = linear_forward(s.xn, w.wq, "act.q_local");                                   // L3' q = xn·wqᵀ
  }
  q = q.reshape({x.N, x.B, x.H, x.Dqk});
  rope_forward(rope_on(x, at(q, x.Dn), x.B * x.H, x.B * x.H * x.Dqk, x.Dqk));      //    q_pe ← rope(q_pe)
  s.kv = linear_forward(s.xn, w.wkv_a, "act.kv");                                    // L4 kv = xn·wkv_aᵀ
  s.latent = Tensor::empty({x.N, x.B, x.Dl}, x.dt, "act.latent");
  {
    RmsNormParams p;                                                                 // L5 ckv = RMSNorm(kv[:, :Lkv])
    p.M = x.N * x.B, p.C = x.Lkv, p.dtype = x.dt, p.eps = c.rms_norm_eps;
    p.x = s.kv.raw(), p.x_stride = x.Lkv + x.Dr, p.w = w.kv_norm.raw(), p.y = s.latent.raw(), p.y_stride = x.Dl;
    rmsnorm_forward(p);
  }
  copy_rows(x.dt, x.N * x.B, x.Dr, at(s.kv, x.Lkv), x.Lkv + x.Dr, at(s.latent, x.Lkv), x.Dl);
  rope_forward(rope_on(x, at(s.latent, x.Lkv), x.B, x.B * x.Dl, x.Dl));              // L6 kpe = rope(kv[:, Lkv:])

  if (check_finite_enabled()) {  // this rank's own tensors, before any of them is communicated
    const std::string step = fmt::format("layer {} forward, rank {}", layer, x.r);
    for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"x", &in}, {"xn", &s.xn}, {"cq", &s.cq},
                                  {"cqn", &s.cqn}, {"q", &q}, {"kv", &s.kv}, {"latent", &s.latent}})
      check_finite(*t, name, step);
  }
  Tensor o_g = core_forward(x, w, std::move(q), s);                                 // the form's core
  fault_point("forward", int(x.r));
  s.o = tokens_to_heads(x, o_g, x.Dv, "o", "act.o").reshape({x.N, x.B, x.H * x.Dv}); // a2a o back
  o_g = Tensor();
  Tensor y = linear_forward(s.o, w.wo, "act.y");                                     // y = o·woᵀ
  add_into(y, in);                                                                   // y = x + y
  if (check_finite_enabled()) {
    const std::string step = fmt::format("layer {} forward, rank {}", layer, x.r);
    for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"latent_g", &s.latent_g}, {"q", &s.q},
                                  {"q_abs", &s.q_abs}, {"k", &s.k}, {"v", &s.v}, {"k_exp", &s.k_exp}, {"v_exp", &s.v_exp},
                                  {"o_att", &s.o_att}, {"o", &s.o}, {"y", &y}})
      check_finite(*t, name, step);
  }
  return y;
}

Tensor layer_backward(const Ctx& x, const LayerWeights& w, LayerSaved& s, const Tensor& dy, LayerWeights& g,
                      int64_t layer) {
  const std::string step = fmt::format("layer {} backward, rank {}", layer, x.r);
  check_finite(dy, "dy", step);
  const MlaConfig& c = x.c;
  // y = x + o·woᵀ:  do = dy·wo,  dwo += dyᵀ·o;  then the all-to-all of do (the adjoint of o's)
  Tensor dout;
  {
    Tensor do_local = Tensor::empty({x.N, x.B, x.H * x.Dv}, x.dt, "grad.o_local");
    linear_backward(s.o, w.wo, dy, &do_local, false, g.wo);
    s.o = Tensor();
    check_finite(do_local, "do", step);
    dout = heads_to_tokens(x, do_local.reshape({x.N, x.B, x.H, x.Dv}), x.Dv, "do", "grad.o");
  }
  Tensor dq, dlatent;
  core_backward(x, w, s, std::move(dout), g, dq, dlatent);                          // the form's core
  fault_point("backward", int(x.r));
  check_finite(dq, "dq", step);
  check_finite(dlatent, "dlatent", step);
  // L6 kpe = rope(kv[:, Lkv:]):  dkv[:, Lkv:] = ropeᵀ(dkpe)
  Tensor dkv = Tensor::empty({x.N, x.B, x.Lkv + x.Dr}, x.dt, "grad.kv");
  copy_rows(x.dt, x.N * x.B, x.Dr, at(dlatent, x.Lkv), x.Dl, at(dkv, x.Lkv), x.Lkv + x.Dr);
  rope_backward(rope_on(x, at(dkv, x.Lkv), x.B, x.B * (x.Lkv + x.Dr), x.Lkv + x.Dr));
  {
    RmsNormBwdParams p;  // L5 ckv = RMSNorm(kv[:, :Lkv]):  dkv[:, :Lkv],  dkv_norm +=
    p.M = x.N * x.B, p.C = x.Lkv, p.dtype = x.dt, p.eps = c.rms_norm_eps;
    p.x = s.kv.raw(), p.x_stride = x.Lkv + x.Dr, p.w = w.kv_norm.raw();
    p.dy = dlatent.raw(), p.dy_stride = x.Dl, p.dx = dkv.raw(), p.dx_stride = x.Lkv + x.Dr, p.dw = g.kv_norm.raw();
    p.dw_dtype = g.kv_norm.dtype();
    rmsnorm_backward(p);
  }
  dlatent = Tensor();
  s.kv = Tensor();
  // L4 kv = xn·wkv_aᵀ:  dxn = dkv·wkv_a,  dwkv_a += dkvᵀ·xn
  Tensor dxn = Tensor::empty({x.N, x.B, x.D}, x.dt, "grad.xn");
  linear_backward(s.xn, w.wkv_a, dkv, &dxn, false, g.wkv_a);
  dkv = Tensor();
  // L3 q_pe ← rope(q_pe):  dq_pe ← ropeᵀ(dq_pe)
  rope_backward(rope_on(x, at(dq, x.Dn), x.B * x.H, x.B * x.H * x.Dqk, x.Dqk));
  dq = dq.reshape({x.N, x.B, x.H * x.Dqk});
  if (x.Lq > 0) {
    Tensor dcqn = Tensor::empty({x.N, x.B, x.Lq}, x.dt, "grad.cqn");  // L3 q = cqn·wq_bᵀ
    linear_backward(s.cqn, w.wq_b, dq, &dcqn, false, g.wq_b);
    dq = s.cqn = Tensor();
    Tensor dcq = Tensor::empty({x.N, x.B, x.Lq}, x.dt, "grad.cq");    // L2 cqn = RMSNorm(cq)
    rmsnorm_backward(s.cq, w.q_norm, dcqn, c.rms_norm_eps, dcq, g.q_norm);
    dcqn = s.cq = Tensor();
    linear_backward(s.xn, w.wq_a, dcq, &dxn, /*accumulate_dx=*/true, g.wq_a);  // L1 cq = xn·wq_aᵀ
  } else {
    linear_backward(s.xn, w.wq, dq, &dxn, /*accumulate_dx=*/true, g.wq);      // L3' q = xn·wqᵀ
    dq = Tensor();
  }
  s.xn = Tensor();
  // xn = RMSNorm(x), y = x + ...:  dx = dy + RMSNormᵀ(dxn)
  Tensor dx = Tensor::empty({x.N, x.B, x.D}, x.dt, "grad.x");
  rmsnorm_backward(s.x, w.attn_norm, dxn, c.rms_norm_eps, dx, g.attn_norm);
  add_into(dx, dy);
  s.x = Tensor();
  check_finite(dx, "dx", step);
  g.for_each([&](const std::string& name, const Tensor& t) { check_finite(t, "d" + name, step); });
  return dx;
}

}  // namespace

Tensor stack_forward(const MlaConfig& c, const Weights& w, const Tensor& x, StackSaved& saved, Communicator& comm) {
  c.validate();
  Ctx ctx(c, comm);
  check_shape(x, {ctx.N, ctx.B, ctx.D}, "x");
  check_dtype(x, c.dtype, "x");
  LAGA_CHECK(int64_t(w.layers.size()) == c.num_layers, "{} layers of weights for num_layers {}", w.layers.size(),
             c.num_layers);
  saved.layers.assign(size_t(c.num_layers), LayerSaved{});
  Tensor h = x;
  if (check_finite_enabled())
    w.for_each([&](const std::string& name, const Tensor& t) { check_finite(t, name, "the weights, rank " + std::to_string(ctx.r)); });
  for (int64_t l = 0; l < c.num_layers; ++l) h = layer_forward(ctx, w.layers[size_t(l)], h, saved.layers[size_t(l)], l);
  return h;
}

Tensor stack_backward(const MlaConfig& c, const Weights& w, StackSaved& saved, const Tensor& dy, Weights& grads,
                      Communicator& comm) {
  Ctx ctx(c, comm);
  check_shape(dy, {ctx.N, ctx.B, ctx.D}, "dy");
  LAGA_CHECK(saved.layers.size() == size_t(c.num_layers), "backward without a matching forward");
  Tensor g = dy;
  for (int64_t l = c.num_layers - 1; l >= 0; --l)
    g = layer_backward(ctx, w.layers[size_t(l)], saved.layers[size_t(l)], g, grads.layers[size_t(l)], l);
  saved.layers.clear();
  return g;
}

}  // namespace laga
