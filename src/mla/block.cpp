// The MLA block stack on one rank of a sequence-parallel group (docs/design.md §2): the input norm,
// the local stage (L1–L6), the form's core (mla/form.hpp, src/mla/forms/), the output projection
// and residual — or, with attention_only, the attention alone (no input norm: xn is x itself, no
// residual); forward line by line and the backward walking the same lines in reverse, each step
// quoting the line it differentiates.
#include "laga/mla/block.hpp"

#include "laga/comm/pairs.hpp"
#include "laga/core/fault.hpp"
#include "laga/core/finite.hpp"
#include "laga/ops/elementwise.hpp"
#include "laga/ops/linear.hpp"
#include "laga/ops/rmsnorm.hpp"
#include "laga/ops/rope.hpp"

namespace laga {

namespace {

// RoPE over this rank's N tokens, one call per segment of its layout (token_segments): each run of
// local rows at its own global positions.
template <class Op>
void rope_on(const RankCtx& ctx, Op op, void* data, int64_t inner, int64_t t_stride,
             int64_t inner_stride) {
  int64_t row = 0;
  for (const TokenSegment& seg : ctx.segments) {
    RopeParams p = rope_params(ctx.c.rope(), ctx.dt);
    p.x = static_cast<char*>(data) + row * t_stride * dtype_size(ctx.dt), p.T = seg.len,
    p.inner = inner;
    p.t_stride = t_stride, p.inner_stride = inner_stride, p.pos0 = seg.pos0;
    op(p);
    row += seg.len;
  }
}
void rope_forward_on(const RankCtx& ctx, void* data, int64_t inner, int64_t t_stride,
                     int64_t inner_stride) {
  rope_on(
      ctx, [](const RopeParams& p) { rope_forward(p); }, data, inner, t_stride, inner_stride);
}
void rope_backward_on(const RankCtx& ctx, void* data, int64_t inner, int64_t t_stride,
                      int64_t inner_stride) {
  rope_on(
      ctx, [](const RopeParams& p) { rope_backward(p); }, data, inner, t_stride, inner_stride);
}

// The local stage runs its latent path (L4–L6) first and hands the query path (L1–L3, q's RoPE) to
// the form as a callable, which the form runs once it has issued what needs the latent alone
// (mla/form.hpp): the two paths are independent, so this order changes no arithmetic, and with
// overlap on the form's collectives run behind the query path.
Tensor layer_forward(const RankCtx& ctx, const Form& form, const LayerWeights& w, const Tensor& in,
                     LayerSaved& s, int64_t layer) {
  const MlaConfig& c = ctx.c;
  const std::string step = fmt::format("layer {} forward, rank {}", layer, ctx.r);
  if (c.attention_only) {
    // xn = x: the same tensor, no copy; and x is not kept apart (no norm to differentiate)
    s.xn = in;
  } else {
    // xn = RMSNorm(x)
    s.x = in;
    s.xn = rmsnorm_forward(in, w.attn_norm, c.rms_norm_eps, "act.xn");
  }
  // L4 kv = xn·wkv_aᵀ
  s.kv = linear_forward(s.xn, w.wkv_a, "act.kv");
  // ℓ = [ckv | kpe]
  Tensor latent = Tensor::empty({ctx.N, ctx.B, ctx.Dl}, ctx.dt, "act.latent");
  {
    // L5 ckv = RMSNorm(kv[:, :Lkv])
    RmsNormParams p;
    p.M = ctx.N * ctx.B, p.C = ctx.Lkv, p.dtype = ctx.dt, p.eps = c.rms_norm_eps;
    p.x = s.kv.raw(), p.x_stride = ctx.Lkv + ctx.Dr, p.w = w.kv_norm.raw(), p.y = latent.raw(),
    p.y_stride = ctx.Dl;
    rmsnorm_forward(p);
  }
  copy_rows(ctx.dt, ctx.N * ctx.B, ctx.Dr, at(s.kv, ctx.Lkv), ctx.Lkv + ctx.Dr, at(latent, ctx.Lkv),
            ctx.Dl);
  // L6 kpe = rope(kv[:, Lkv:])
  rope_forward_on(ctx, at(latent, ctx.Lkv), ctx.B, ctx.B * ctx.Dl, ctx.Dl);
  if (check_finite_enabled())  // this rank's own tensors, before any of them is communicated
    for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"x", &in},
                                  {"xn", &s.xn},
                                  {"kv", &s.kv},
                                  {"latent", &latent}})
      check_finite(*t, name, step);

  int query_runs = 0;
  QueryPath query;
  query.xn = &s.xn, query.cqn = &s.cqn;
  query.run = [&] {
    ++query_runs;
    Tensor q;
    if (ctx.Lq > 0) {
      // L1 cq = xn·wq_aᵀ
      s.cq = linear_forward(s.xn, w.wq_a, "act.cq");
      // L2 cqn = RMSNorm(cq)
      s.cqn = rmsnorm_forward(s.cq, w.q_norm, c.rms_norm_eps, "act.cqn");
      // L3 q = cqn·wq_bᵀ
      q = linear_forward(s.cqn, w.wq_b, "act.q_local");
    } else {
      // L3' q = xn·wqᵀ
      q = linear_forward(s.xn, w.wq, "act.q_local");
    }
    q = q.reshape({ctx.N, ctx.B, ctx.H, ctx.Dqk});
    //    q_pe ← rope(q_pe)
    rope_forward_on(ctx, at(q, ctx.Dn), ctx.B * ctx.H, ctx.B * ctx.H * ctx.Dqk, ctx.Dqk);
    if (check_finite_enabled())
      for (const auto& [name, t] :
           {std::pair<const char*, const Tensor*>{"cq", &s.cq}, {"cqn", &s.cqn}, {"q", &q}})
        check_finite(*t, name, step);
    return q;
  };
  // the form's core
  Tensor o_g = form.forward(ctx, w, std::move(latent), query, s.core);
  LAGA_ASSERT(query_runs == 1, "form {} ran the query path {} times; once is the contract",
              form.name(), query_runs);
  fault_point("forward", int(ctx.r));
  if (form.output() == Form::Output::heads)
    // o back to the tokens
    s.o = gather_heads(ctx.heads_comm(), o_g, "o", "act.o").reshape({ctx.N, ctx.B, ctx.H * ctx.Dv});
  else
    // already on them
    s.o = o_g.reshape({ctx.N, ctx.B, ctx.H * ctx.Dv});
  o_g = Tensor();
  Tensor y = linear_forward(s.o, w.wo, "act.y");  // y = o·woᵀ
  if (!c.attention_only) add_into(y, in);         // y = x + y
  if (check_finite_enabled()) {
    s.core->for_each([&](const char* name, const Tensor& t) { check_finite(t, name, step); });
    for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"o", &s.o}, {"y", &y}})
      check_finite(*t, name, step);
  }
  return y;
}

// The backward of the local stage in the forward's order reversed per path: the form runs the query
// path's backward (q's RoPE, L3, L2 and L1's weight gradient) when it has dq, with what it issued
// before (the dlatent reduce-scatter, dk's and dv's all-to-alls) in flight; then the latent path's
// (L6–L4) from dlatent. dxn is summed in one fixed order, L4's product then L1's (or L3''s) added
// into it, so it is the same bits whichever path runs first and with overlap on or off.
Tensor layer_backward(const RankCtx& ctx, const Form& form, const LayerWeights& w, LayerSaved& s,
                      const Tensor& dy, LayerWeights& g, int64_t layer) {
  const std::string step = fmt::format("layer {} backward, rank {}", layer, ctx.r);
  check_finite(dy, "dy", step);
  const MlaConfig& c = ctx.c;
  // y = x + o·woᵀ (y = o·woᵀ):  do = dy·wo,  dwo += dyᵀ·o;  then the all-to-all of do (the adjoint
  // of o's) for a form whose output is on its heads
  Tensor dout;
  {
    Tensor do_local = Tensor::empty({ctx.N, ctx.B, ctx.H * ctx.Dv}, ctx.dt, "grad.o_local");
    linear_backward(s.o, w.wo, dy, &do_local, false, g.wo);
    s.o = Tensor();
    check_finite(do_local, "do", step);
    if (form.output() == Form::Output::heads)
      dout = scatter_heads(ctx.heads_comm(), do_local.reshape({ctx.N, ctx.B, ctx.H, ctx.Dv}), "do",
                           "grad.o");
    else
      dout = do_local.reshape({ctx.N, ctx.B, ctx.H, ctx.Dv});
  }
  // The query path's gradient into xn, added after L4's: dcq [N, B, Lq] for L1 (dq [N, B, H·Dqk]
  // for L3').
  Tensor dq_path;
  int query_runs = 0;
  QueryPathBackward query_backward;
  query_backward.xn = &s.xn, query_backward.cqn = &s.cqn;
  query_backward.run = [&](Tensor dq) {
    ++query_runs;
    check_finite(dq, "dq", step);
    // L3 q_pe ← rope(q_pe):  dq_pe ← ropeᵀ(dq_pe)
    rope_backward_on(ctx, at(dq, ctx.Dn), ctx.B * ctx.H, ctx.B * ctx.H * ctx.Dqk, ctx.Dqk);
    dq = dq.reshape({ctx.N, ctx.B, ctx.H * ctx.Dqk});
    if (ctx.Lq > 0) {
      Tensor dcqn = Tensor::empty({ctx.N, ctx.B, ctx.Lq}, ctx.dt, "grad.cqn");  // L3 q = cqn·wq_bᵀ
      linear_backward(s.cqn, w.wq_b, dq, &dcqn, false, g.wq_b);
      dq = s.cqn = Tensor();
      // L2 cqn = RMSNorm(cq)
      dq_path = Tensor::empty({ctx.N, ctx.B, ctx.Lq}, ctx.dt, "grad.cq");
      rmsnorm_backward(s.cq, w.q_norm, dcqn, c.rms_norm_eps, dq_path, g.q_norm);
      dcqn = s.cq = Tensor();
      // L1 cq = xn·wq_aᵀ: dwq_a += (dx below)
      linear_backward(s.xn, w.wq_a, dq_path, nullptr, false, g.wq_a);
    } else {
      // L3' q = xn·wqᵀ: dwq += (dx below)
      linear_backward(s.xn, w.wq, dq, nullptr, false, g.wq);
      dq_path = std::move(dq);
    }
  };
  // the form's core
  Tensor dlatent = form.backward(ctx, w, std::move(s.core), std::move(dout), g, query_backward);
  LAGA_ASSERT(query_runs == 1,
              "form {} ran the query path's backward {} times; once is the contract", form.name(),
              query_runs);
  fault_point("backward", int(ctx.r));
  check_finite(dlatent, "dlatent", step);
  // L6 kpe = rope(kv[:, Lkv:]):  dkv[:, Lkv:] = ropeᵀ(dkpe)
  Tensor dkv = Tensor::empty({ctx.N, ctx.B, ctx.Lkv + ctx.Dr}, ctx.dt, "grad.kv");
  copy_rows(ctx.dt, ctx.N * ctx.B, ctx.Dr, at(dlatent, ctx.Lkv), ctx.Dl, at(dkv, ctx.Lkv),
            ctx.Lkv + ctx.Dr);
  rope_backward_on(ctx, at(dkv, ctx.Lkv), ctx.B, ctx.B * (ctx.Lkv + ctx.Dr), ctx.Lkv + ctx.Dr);
  {
    RmsNormBwdParams p;  // L5 ckv = RMSNorm(kv[:, :Lkv]):  dkv[:, :Lkv],  dkv_norm +=
    p.M = ctx.N * ctx.B, p.C = ctx.Lkv, p.dtype = ctx.dt, p.eps = c.rms_norm_eps;
    p.x = s.kv.raw(), p.x_stride = ctx.Lkv + ctx.Dr, p.w = w.kv_norm.raw();
    p.dy = dlatent.raw(), p.dy_stride = ctx.Dl, p.dx = dkv.raw(), p.dx_stride = ctx.Lkv + ctx.Dr,
    p.dw = g.kv_norm.raw();
    p.dw_dtype = g.kv_norm.dtype();
    rmsnorm_backward(p);
  }
  dlatent = Tensor();
  s.kv = Tensor();
  // L4 kv = xn·wkv_aᵀ:  dxn = dkv·wkv_a,  dwkv_a += dkvᵀ·xn  (with attention_only xn is x: dxn is
  // the layer's dx, allocated as it)
  Tensor dxn =
      Tensor::empty({ctx.N, ctx.B, ctx.D}, ctx.dt, c.attention_only ? "grad.x" : "grad.xn");
  linear_backward(s.xn, w.wkv_a, dkv, &dxn, false, g.wkv_a);
  dkv = Tensor();
  // L1 cq = xn·wq_aᵀ (L3' q = xn·wqᵀ):  dxn += dcq·wq_a (dq·wq)
  linear_backward_dx(ctx.Lq > 0 ? w.wq_a : w.wq, dq_path, dxn, /*accumulate_dx=*/true);
  dq_path = Tensor();
  s.xn = Tensor();
  Tensor dx;
  if (c.attention_only) {
    // xn = x, y = o·woᵀ (no residual):  dx = dxn
    dx = std::move(dxn);
  } else {
    // xn = RMSNorm(x), y = x + ...:  dx = dy + RMSNormᵀ(dxn)
    dx = Tensor::empty({ctx.N, ctx.B, ctx.D}, ctx.dt, "grad.x");
    rmsnorm_backward(s.x, w.attn_norm, dxn, c.rms_norm_eps, dx, g.attn_norm);
    add_into(dx, dy);
    s.x = Tensor();
  }
  check_finite(dx, "dx", step);
  g.for_each([&](const std::string& name, const Tensor& t) { check_finite(t, "d" + name, step); });
  return dx;
}

}  // namespace

Tensor stack_forward(const Config& cfg, const Weights& w, const Tensor& x, StackSaved& saved,
                     Communicator& comm) {
  const MlaConfig& c = *cfg;
  const RankCtx ctx(cfg, comm);
  const Form& form = form_of(c);
  check_shape(x, {ctx.N, ctx.B, ctx.D}, "x");
  check_dtype(x, c.dtype, "x");
  LAGA_CHECK(int64_t(w.layers.size()) == c.num_layers, "{} layers of weights for num_layers {}",
             w.layers.size(), c.num_layers);
  saved.layers.clear();
  saved.layers.resize(size_t(c.num_layers));
  Tensor h = x;
  if (check_finite_enabled())
    w.for_each([&](const std::string& name, const Tensor& t) {
      check_finite(t, name, "the weights, rank " + std::to_string(ctx.r));
    });
  for (int64_t l = 0; l < c.num_layers; ++l)
    h = layer_forward(ctx, form, w.layers[size_t(l)], h, saved.layers[size_t(l)], l);
  return h;
}

Tensor stack_backward(const Config& cfg, const Weights& w, StackSaved& saved, const Tensor& dy,
                      Weights& grads, Communicator& comm) {
  const MlaConfig& c = *cfg;
  const RankCtx ctx(cfg, comm);
  const Form& form = form_of(c);
  check_shape(dy, {ctx.N, ctx.B, ctx.D}, "dy");
  LAGA_CHECK(saved.layers.size() == size_t(c.num_layers), "backward without a matching forward");
  Tensor g = dy;
  for (int64_t l = c.num_layers - 1; l >= 0; --l)
    g = layer_backward(ctx, form, w.layers[size_t(l)], saved.layers[size_t(l)], g,
                       grads.layers[size_t(l)], l);
  saved.layers.clear();
  return g;
}

}  // namespace laga
