// Attention's boundary: parameter checks, dispatch to the eager and fused kernels, the FLOP count,
// and the memory plan of each kernel (every buffer it allocates, in order). The kernels themselves
// are in attention_eager.cpp and attention_fused.cpp; the math in docs/attention.md, whose §5
// spells out the sizes listed here.
#include "laga/ops/attention.hpp"

#include <map>

#include "attention_internal.hpp"
#include "laga/core/work.hpp"

namespace laga {

namespace {

void check_strides(const AttentionStrides& s, const char* name) {
  LAGA_CHECK(s.t >= 0 && s.b >= 0 && s.h >= 0,
             "attention {} has a negative stride (t {}, b {}, h {}); strides are "
             "element counts ≥ 0, e.g. dense_strides(B, H, D)",
             name, s.t, s.b, s.h);
}

}  // namespace

void check_attention_params(const AttentionFwdParams& p) {
  LAGA_CHECK(p.B >= 1 && p.T >= 1, "attention needs B ≥ 1 and T ≥ 1; got B {}, T {}", p.B, p.T);
  LAGA_CHECK(p.Hq >= 1 && p.Hkv >= 1 && p.Hq % p.Hkv == 0,
             "attention Hkv {} must divide Hq {} (query heads share key/value heads in groups); "
             "try Hkv in {}",
             p.Hkv, p.Hq, divisors_str(std::max<int64_t>(p.Hq, 1)));
  LAGA_CHECK(p.Dqk >= 1 && p.Dv >= 1, "attention needs Dqk ≥ 1 and Dv ≥ 1; got Dqk {}, Dv {}",
             p.Dqk, p.Dv);
  LAGA_CHECK(std::isfinite(p.scale) && p.scale > 0,
             "attention scale {} must be finite and > 0 (e.g. 1/sqrt(Dqk))", p.scale);
  LAGA_CHECK(p.q && p.k && p.v && p.o, "attention forward needs q, k, v and o; missing {}{}{}{}",
             p.q ? "" : "q ", p.k ? "" : "k ", p.v ? "" : "v ", p.o ? "" : "o");
  check_strides(p.q_stride, "q [T, B, Hq, Dqk]");
  check_strides(p.k_stride, "k [T, B, Hkv, Dqk]");
  check_strides(p.v_stride, "v [T, B, Hkv, Dv]");
  check_strides(p.o_stride, "o [T, B, Hq, Dv]");
}

void check_attention_params(const AttentionBwdParams& p) {
  check_attention_params(static_cast<const AttentionFwdParams&>(p));
  LAGA_CHECK(p.dout && p.dq && p.dk && p.dv,
             "attention backward needs dout, dq, dk and dv; missing {}{}{}{}",
             p.dout ? "" : "dout ", p.dq ? "" : "dq ", p.dk ? "" : "dk ", p.dv ? "" : "dv");
  check_strides(p.dout_stride, "dout [T, B, Hq, Dv]");
  check_strides(p.dq_stride, "dq [T, B, Hq, Dqk]");
  check_strides(p.dk_stride, "dk [T, B, Hkv, Dqk]");
  check_strides(p.dv_stride, "dv [T, B, Hkv, Dv]");
}

namespace {
// Under a meta tracker: the kernel's allocations, from its own event list, and nothing computed.
AttentionSaved meta_walk(Kernel kernel, const AttentionFwdParams& p, bool backward) {
  std::map<std::string, Tensor> live;
  for (const auto& e : attention_memory_events(kernel, p, backward)) {
    if (e.release)
      live.erase(e.tag);
    else
      live[e.tag] = Tensor::empty(e.shape, e.dtype, e.tag);
  }
  AttentionSaved saved;
  if (!backward)
    (kernel == Kernel::eager ? saved.probs : saved.lse) =
        live.at(kernel == Kernel::eager ? "attn.probs" : "attn.lse");
  return saved;
}
}  // namespace

std::string_view kernel_name(Kernel k) { return k == Kernel::eager ? "eager" : "fused"; }
Kernel parse_kernel(std::string_view s) {
  if (s == "eager") return Kernel::eager;
  if (s == "fused") return Kernel::fused;
  LAGA_FAIL_USAGE("unknown kernel '{}'; valid: eager, fused", s);
}

namespace {
// The work ledger's record of one call (core/work.hpp): FlashAttention-3's FLOPs, its shape.
WorkRecord attention_work(Kernel kernel, const AttentionFwdParams& p, bool backward) {
  WorkRecord r;
  r.cls = backward ? WorkClass::attention_backward : WorkClass::attention_forward;
  r.op = "attention", r.dtype = p.dtype;
  r.flops = (backward ? 2.5 : 1.0) * attention_forward_flops(p.B, p.Hq, p.T, p.Dqk, p.Dv, p.causal);
  r.dims[0] = p.T, r.dims[1] = p.Hq, r.dims[2] = p.Hkv, r.dims[3] = p.Dqk, r.dims[4] = p.Dv;
  r.kernel = kernel == Kernel::eager ? AttentionKernel::eager : AttentionKernel::fused;
  return r;
}
}  // namespace

AttentionSaved attention_forward(Kernel kernel, const AttentionFwdParams& p) {
  check_attention_params(p);
  LAGA_CHECK(kernel == Kernel::fused || !p.o_f32,
             "the eager attention kernel writes o only in the storage dtype ({}), not fp32; use "
             "--kernel fused",
             dtype_name(p.dtype));
  WorkOp work(attention_work(kernel, p, false));
  if (meta_mode()) return meta_walk(kernel, p, false);
  return kernel == Kernel::eager ? attn::eager_forward(p) : attn::fused_forward(p);
}

void attention_backward(Kernel kernel, const AttentionBwdParams& p, const AttentionSaved& saved) {
  check_attention_params(p);
  LAGA_CHECK(kernel == Kernel::fused || (!p.o_f32 && !p.grads_f32),
             "the eager attention kernel reads o and writes dq, dk, dv only in the storage dtype "
             "({}), not fp32; use "
             "--kernel fused",
             dtype_name(p.dtype));
  LAGA_CHECK(kernel == Kernel::fused || !p.one_pass_backward,
             "the eager attention kernel has one backward order; --attn-backward one-pass needs "
             "--kernel fused");
  if (kernel == Kernel::eager) {
    check_shape(saved.probs, {p.B, p.Hq, p.T, p.T}, "saved.probs (eager attention)");
    check_dtype(saved.probs, p.dtype, "saved.probs (eager attention)");
    WorkOp work(attention_work(kernel, p, true));
    if (meta_mode()) return (void)meta_walk(kernel, p, true);
    attn::eager_backward(p, saved);
  } else {
    check_shape(saved.lse, {p.B, p.Hq, p.T}, "saved.lse (fused attention)");
    check_dtype(saved.lse, DType::f32, "saved.lse (fused attention)");
    WorkOp work(attention_work(kernel, p, true));
    if (meta_mode()) return (void)meta_walk(kernel, p, true);
    attn::fused_backward(p, saved);
  }
}

double attention_forward_flops(int64_t B, int64_t Hq, int64_t T, int64_t Dqk, int64_t Dv,
                               bool causal) {
  const double avg_kv = causal ? (double(T) + 1) / 2 : double(T);
  return 2.0 * double(B) * double(Hq) * double(T) * avg_kv * double(Dqk + Dv);
}

std::vector<AttentionMemoryEvent> attention_memory_events(Kernel kernel,
                                                          const AttentionFwdParams& p,
                                                          bool backward) {
  const DType f32 = DType::f32, dt = p.dtype;
  // bf16: P and dS need tiles of their own (fp32 rewrites in place)
  const bool low = dt != DType::f32;
  std::vector<AttentionMemoryEvent> ev;
  auto alloc = [&](const char* tag, Shape s, DType t) {
    ev.push_back({false, tag, std::move(s), t});
  };
  auto release = [&](const char* tag) {
    for (const auto& e : ev)
      if (!e.release && e.tag == tag) {
        ev.push_back({true, tag, e.shape, e.dtype});
        return;
      }
    LAGA_ASSERT(false, "attention memory plan releases '{}' before allocating it", tag);
  };
  const int64_t B = p.B, Hq = p.Hq, Hkv = p.Hkv, T = p.T;
  if (kernel == Kernel::eager) {
    // one K/V head packed dense, for the Q/dS products
    alloc("attn.kv_head", {T, p.Dqk + p.Dv}, dt);
    if (!backward) {
      alloc("attn.scores", {B, Hq, T, T}, f32);
      alloc("attn.probs", {B, Hq, T, T}, dt);
      release("attn.scores");
      release("attn.kv_head");
    } else {
      alloc("attn.dprobs", {B, Hq, T, T}, f32);  // fp32: rewritten in place into dS
      if (low) {
        alloc("attn.dscores", {B, Hq, T, T}, dt);
        release("attn.dprobs");
      }
      release("attn.kv_head");
      if (Hq != Hkv) {  // dk, dv summed over the group in fp32 before rounding
        alloc("attn.dk_acc", {B, Hkv, T, p.Dqk}, f32);
        alloc("attn.dv_acc", {B, Hkv, T, p.Dv}, f32);
        release("attn.dv_acc");
        release("attn.dk_acc");
      }
      release(low ? "attn.dscores" : "attn.dprobs");
    }
    return ev;
  }
  const attn::FusedTiles tl = attn::fused_tiles(p, backward);
  const int64_t S = tl.slots, R = tl.rows, K = tl.bk;
  if (!backward)
    alloc("attn.lse", {B, Hq, T}, f32);
  else
    alloc("attn.delta", {B, Hq, T}, f32);
  // the forward's query tiles per task, each with its q, statistics and o sums
  const int64_t U = tl.bundle;
  alloc("attn.q_tile", {S, U * R, p.Dqk}, dt);
  if (backward) alloc("attn.do_tile", {S, R, p.Dv}, dt);
  alloc("attn.kv_tile", {S, K, p.Dqk + p.Dv}, dt);
  alloc("attn.s_tile", {S, R, K}, f32);
  if (backward) alloc("attn.dp_tile", {S, R, K}, f32);
  if (low) alloc("attn.p_tile", {S, R, K}, dt);
  if (low && backward) alloc("attn.ds_tile", {S, R, K}, dt);
  alloc("attn.row_stats", {S, U * 2, R}, f32);
  if (!backward)
    alloc("attn.o_acc", {S, U * R, p.Dv}, f32);
  else if (tl.one_pass)
    alloc("attn.grad_acc", {S, K * (p.Dqk + p.Dv)}, f32);
  else
    alloc("attn.grad_acc", {S, std::max(K * (p.Dqk + p.Dv), R * p.Dqk)}, f32);
  // a head group's dq rows
  if (backward && tl.one_pass) alloc("attn.dq_sum", {S, tl.nqb * R, p.Dqk}, f32);
  if (backward && tl.split > 1)
    alloc("attn.dkv_partial", {B * Hkv, tl.split, T, p.Dqk + p.Dv}, f32);
  // Released in reverse order; forward keeps attn.lse (saved), backward releases attn.delta last.
  for (size_t i = ev.size(); i-- > 1;) ev.push_back({true, ev[i].tag, ev[i].shape, ev[i].dtype});
  if (backward) release("attn.delta");
  return ev;
}

AttentionMemory attention_memory(Kernel kernel, const AttentionFwdParams& p) {
  auto replay = [](const std::vector<AttentionMemoryEvent>& ev, int64_t& peak) {
    int64_t live = 0;
    peak = 0;
    for (const auto& e : ev) peak = std::max(peak, live += e.release ? -e.bytes() : e.bytes());
    return live;
  };
  AttentionMemory m;
  m.saved_bytes = replay(attention_memory_events(kernel, p, false), m.forward_peak_bytes);
  const int64_t left = replay(attention_memory_events(kernel, p, true), m.backward_peak_bytes);
  LAGA_ASSERT(left == 0, "attention backward's memory plan leaves {} bytes live", left);
  return m;
}

}  // namespace laga
