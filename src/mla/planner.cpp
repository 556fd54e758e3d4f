// The planner's replay of the block's allocations (see planner.hpp). Each function below follows one
// function of src/mla/block.cpp or src/mla/forms.cpp and lists, in order, the tensors it allocates and
// releases; a release only matters for the peak through the allocations that come after it, so
// releases between two allocations are listed in any order.
#include "laga/mla/planner.hpp"

#include "laga/mla/weights.hpp"
#include "laga/ops/attention.hpp"

namespace laga {

namespace {

// Live bytes by tag with the running peak, like MemoryTracker, over named allocations.
class Replay {
 public:
  void alloc(const std::string& id, const std::string& tag, const Shape& shape, DType t) {
    int64_t bytes = shape_numel(shape) * dtype_size(t);
    LAGA_ASSERT(!ids_.count(id), "planner allocates '{}' twice", id);
    ids_[id] = {tag, bytes};
    live_ += bytes;
    by_tag_[tag] += bytes;
    if (live_ > peak_) peak_ = live_, peak_by_tag_ = by_tag_;
  }
  void release(const std::string& id) {
    auto it = ids_.find(id);
    LAGA_ASSERT(it != ids_.end(), "planner releases '{}', which is not live", id);
    live_ -= it->second.second;
    if ((by_tag_[it->second.first] -= it->second.second) == 0) by_tag_.erase(it->second.first);
    ids_.erase(it);
  }
  // A tensor allocated and released at once (a temporary inside one op).
  void temp(const std::string& tag, const Shape& shape, DType t) {
    alloc("tmp." + tag, tag, shape, t);
    release("tmp." + tag);
  }
  void attention(Kernel k, const AttentionFwdParams& p, bool backward, const std::string& saved_id) {
    for (const auto& e : attention_memory_events(k, p, backward)) {
      // The forward's saved tensor (probs or lse) lives on under the layer's id.
      const bool saved = !backward && (e.tag == "attn.probs" || e.tag == "attn.lse");
      const std::string id = saved ? saved_id : "attn." + e.tag;
      if (e.release) release(id);
      else alloc(id, e.tag, e.shape, e.dtype);
    }
  }
  int64_t live() const { return live_; }
  int64_t peak() const { return peak_; }
  void reset_peak() { peak_ = live_, peak_by_tag_ = by_tag_; }
  const std::map<std::string, int64_t>& by_tag() const { return by_tag_; }
  const std::map<std::string, int64_t>& peak_by_tag() const { return peak_by_tag_; }

 private:
  std::map<std::string, std::pair<std::string, int64_t>> ids_;
  std::map<std::string, int64_t> by_tag_, peak_by_tag_;
  int64_t live_ = 0, peak_ = 0;
};

struct Dims {
  int64_t P, N, T, B, D, H, Hr, Lq, Lkv, Dn, Dr, Dqk, Dv, Dl;
  DType dt;
  explicit Dims(const MlaConfig& c)
      : P(c.sp), N(c.tokens_per_rank()), T(c.seq_len), B(c.batch), D(c.hidden_size), H(c.num_attention_heads),
        Hr(c.heads_per_rank()), Lq(c.q_lora_rank), Lkv(c.kv_lora_rank), Dn(c.qk_nope_head_dim),
        Dr(c.qk_rope_head_dim), Dqk(c.qk_head_dim()), Dv(c.v_head_dim), Dl(c.latent_dim()), dt(c.dtype) {}
};

AttentionFwdParams attention_shape(const MlaConfig& c, const Dims& d, int64_t Hkv, int64_t Dqk, int64_t Dv) {
  AttentionFwdParams p;
  p.B = d.B, p.T = d.T, p.Hq = d.Hr, p.Hkv = Hkv, p.Dqk = Dqk, p.Dv = Dv, p.dtype = d.dt;
  return p;
}

bool padded(const MlaConfig& c) { return c.absorbed_kv == AbsorbedKv::expanded && c.kernel == Kernel::fused; }

// heads_to_tokens: send buffer, output, send released.
void heads_to_tokens(Replay& m, const Dims& d, int64_t width, const std::string& id, const std::string& tag) {
  m.alloc("send", "comm.send", {d.P, d.N, d.B, d.Hr, width}, d.dt);
  m.alloc(id, tag, {d.T, d.B, d.Hr, width}, d.dt);
  m.release("send");
}
// tokens_to_heads: receive buffer, output, receive released.
void tokens_to_heads(Replay& m, const Dims& d, int64_t width, const std::string& id, const std::string& tag) {
  m.alloc("recv", "comm.recv", {d.P, d.N, d.B, d.Hr, width}, d.dt);
  m.alloc(id, tag, {d.N, d.B, d.H, width}, d.dt);
  m.release("recv");
}

// layer_forward of block.cpp, with core_forward / absorbed_forward of forms.cpp; `l` prefixes the ids
// of what the layer keeps.
void layer_forward(Replay& m, const MlaConfig& c, const Dims& d, const std::string& l) {
  m.alloc(l + "xn", "act.xn", {d.N, d.B, d.D}, d.dt);
  if (d.Lq > 0) {
    m.alloc(l + "cq", "act.cq", {d.N, d.B, d.Lq}, d.dt);
    m.alloc(l + "cqn", "act.cqn", {d.N, d.B, d.Lq}, d.dt);
  }
  m.alloc("q_local", "act.q_local", {d.N, d.B, d.H * d.Dqk}, d.dt);
  m.alloc(l + "kv", "act.kv", {d.N, d.B, d.Lkv + d.Dr}, d.dt);
  m.alloc(l + "latent", "act.latent", {d.N, d.B, d.Dl}, d.dt);
  // core_forward
  if (c.form == Form::explicit_form) {
    m.alloc("k_local", "act.k_local", {d.N, d.B, d.H, d.Dqk}, d.dt);
    m.alloc("v_local", "act.v_local", {d.N, d.B, d.H, d.Dv}, d.dt);
    m.temp("act.kvb", {d.N, d.B, d.H, d.Dn + d.Dv}, d.dt);  // up_project_forward
  }
  heads_to_tokens(m, d, d.Dqk, l + "q", "act.q");
  m.release("q_local");
  if (c.form == Form::absorbed) {
    m.alloc(l + "latent_g", "act.latent_g", {d.T, d.B, d.Dl}, d.dt);
    m.release(l + "latent");
    m.alloc(l + "q_abs", "act.q_abs", {d.T, d.B, d.Hr, d.Dl}, d.dt);
    const int64_t Dvo = padded(c) ? d.Dl : d.Lkv;
    const bool expanded = c.absorbed_kv == AbsorbedKv::expanded;
    if (expanded) {
      m.alloc(l + "k_exp", "act.k_exp", {d.T, d.B, d.Hr, d.Dl}, d.dt);
      m.alloc(l + "v_exp", "act.v_exp", {d.T, d.B, d.Hr, Dvo}, d.dt);
    }
    m.alloc(l + "o_att", "act.o_att", {d.T, d.B, d.Hr, Dvo}, d.dt);
    m.attention(c.kernel, attention_shape(c, d, expanded ? d.Hr : 1, d.Dl, Dvo), false, l + "attn");
    m.alloc("o_g", "act.o_g", {d.T, d.B, d.Hr, d.Dv}, d.dt);
  } else {
    if (c.form == Form::explicit_form) {
      heads_to_tokens(m, d, d.Dqk, l + "k", "act.k");
      m.release("k_local");
      heads_to_tokens(m, d, d.Dv, l + "v", "act.v");
      m.release("v_local");
    } else {
      m.alloc(l + "latent_g", "act.latent_g", {d.T, d.B, d.Dl}, d.dt);
      m.release(l + "latent");
      m.alloc(l + "k", "act.k", {d.T, d.B, d.Hr, d.Dqk}, d.dt);
      m.alloc(l + "v", "act.v", {d.T, d.B, d.Hr, d.Dv}, d.dt);
      m.temp("act.kvb", {d.T, d.B, d.Hr, d.Dn + d.Dv}, d.dt);  // up_project_forward
    }
    m.alloc(l + "o_att", "act.o_att", {d.T, d.B, d.Hr, d.Dv}, d.dt);
    m.attention(c.kernel, attention_shape(c, d, d.Hr, d.Dqk, d.Dv), false, l + "attn");
  }
  // back in layer_forward: o all-to-all'd back, the output projection
  tokens_to_heads(m, d, d.Dv, l + "o", "act.o");
  if (c.form == Form::absorbed) m.release("o_g");
  m.alloc(l + "y", "act.y", {d.N, d.B, d.D}, d.dt);
}

// layer_backward of block.cpp with core_backward / absorbed_backward of forms.cpp. `dy_id` is the
// incoming gradient (released by the caller after the layer returns), `prev_y` the layer input
// released at the end (empty for layer 0, whose input is the run's x).
void layer_backward(Replay& m, const MlaConfig& c, const Dims& d, const std::string& l, const std::string& prev_y) {
  m.alloc("do_local", "grad.o_local", {d.N, d.B, d.H * d.Dv}, d.dt);
  m.release(l + "o");
  heads_to_tokens(m, d, d.Dv, "do", "grad.o");
  m.release("do_local");
  if (c.form == Form::absorbed) {
    const int64_t Dvo = padded(c) ? d.Dl : d.Lkv;
    const bool expanded = c.absorbed_kv == AbsorbedKv::expanded;
    m.alloc("do_lat", "grad.o_att", {d.T, d.B, d.Hr, Dvo}, d.dt);
    m.release("do");
    m.alloc("dq_abs", "grad.q_abs", {d.T, d.B, d.Hr, d.Dl}, d.dt);
    const AttentionFwdParams p = attention_shape(c, d, expanded ? d.Hr : 1, d.Dl, Dvo);
    if (!expanded) {
      m.alloc("dlatent_g", "grad.latent_g", {d.T, d.B, d.Dl}, d.dt);
      m.alloc("dv_lat", "grad.v_lat", {d.T, d.B, 1, d.Lkv}, d.dt);
      m.attention(c.kernel, p, true, "");
      m.release("dv_lat");
    } else {
      m.alloc("dk_exp", "grad.k_exp", {d.T, d.B, d.Hr, d.Dl}, d.dt);
      m.alloc("dv_exp", "grad.v_exp", {d.T, d.B, d.Hr, Dvo}, d.dt);
      m.attention(c.kernel, p, true, "");
      m.release(l + "k_exp");
      m.release(l + "v_exp");
      m.alloc("dlatent_g", "grad.latent_g", {d.T, d.B, d.Dl}, d.dt);
      m.release("dk_exp");
      m.release("dv_exp");
    }
    for (const char* id : {"do_lat"}) m.release(id);
    for (const char* s : {"attn", "o_att", "q_abs", "latent_g"}) m.release(l + s);
    m.alloc("dq", "grad.q", {d.T, d.B, d.Hr, d.Dqk}, d.dt);
    m.release("dq_abs");
    m.release(l + "q");
    m.alloc("dlatent", "grad.latent", {d.N, d.B, d.Dl}, d.dt);
    m.release("dlatent_g");
    tokens_to_heads(m, d, d.Dqk, "dq_local", "grad.q_local");
    m.release("dq");
  } else {
    m.alloc("dq", "grad.q", {d.T, d.B, d.Hr, d.Dqk}, d.dt);
    m.alloc("dk", "grad.k", {d.T, d.B, d.Hr, d.Dqk}, d.dt);
    m.alloc("dv", "grad.v", {d.T, d.B, d.Hr, d.Dv}, d.dt);
    m.attention(c.kernel, attention_shape(c, d, d.Hr, d.Dqk, d.Dv), true, "");
    m.release("do");
    for (const char* s : {"attn", "q", "k", "v", "o_att"}) m.release(l + s);
    if (c.form == Form::explicit_form) {
      tokens_to_heads(m, d, d.Dqk, "dq_local", "grad.q_local");
      m.release("dq");
      tokens_to_heads(m, d, d.Dqk, "dk_local", "grad.k_local");
      m.release("dk");
      tokens_to_heads(m, d, d.Dv, "dv_local", "grad.v_local");
      m.release("dv");
      m.alloc("dlatent", "grad.latent", {d.N, d.B, d.Dl}, d.dt);
      m.temp("grad.kvb", {d.N, d.B, d.H, d.Dn + d.Dv}, d.dt);  // up_project_backward
      m.release(l + "latent");
      m.release("dk_local");
      m.release("dv_local");
    } else {
      m.alloc("dlatent_g", "grad.latent_g", {d.T, d.B, d.Dl}, d.dt);
      m.temp("grad.kvb", {d.T, d.B, d.Hr, d.Dn + d.Dv}, d.dt);  // up_project_backward
      m.release("dk");
      m.release("dv");
      m.release(l + "latent_g");
      m.alloc("dlatent", "grad.latent", {d.N, d.B, d.Dl}, d.dt);
      m.release("dlatent_g");
      tokens_to_heads(m, d, d.Dqk, "dq_local", "grad.q_local");
      m.release("dq");
    }
  }
  // back in layer_backward: the local stage in reverse
  m.alloc("dkv", "grad.kv", {d.N, d.B, d.Lkv + d.Dr}, d.dt);
  m.temp("norm.rstd", {d.N * d.B}, DType::f32);  // kv_norm backward
  m.release("dlatent");
  m.release(l + "kv");
  m.alloc("dxn", "grad.xn", {d.N, d.B, d.D}, d.dt);
  m.release("dkv");
  if (d.Lq > 0) {
    m.alloc("dcqn", "grad.cqn", {d.N, d.B, d.Lq}, d.dt);
    m.release("dq_local");
    m.release(l + "cqn");
    m.alloc("dcq", "grad.cq", {d.N, d.B, d.Lq}, d.dt);
    m.temp("norm.rstd", {d.N * d.B}, DType::f32);  // q_norm backward
    m.release("dcqn");
    m.release(l + "cq");
    m.release("dcq");
  } else {
    m.release("dq_local");
  }
  m.release(l + "xn");
  m.alloc(l + "dx", "grad.x", {d.N, d.B, d.D}, d.dt);
  m.temp("norm.rstd", {d.N * d.B}, DType::f32);  // attn_norm backward
  if (!prev_y.empty()) m.release(prev_y);
  m.release("dxn");
}

CollectiveRecord record(CollectiveOp op, const std::string& tensor, DType dt, int64_t tensor_bytes, int64_t wire) {
  return CollectiveRecord{op, tensor, dt, 0.0, tensor_bytes, wire};
}

}  // namespace

PlannedMemory plan_memory(const MlaConfig& c) {
  c.validate();
  const Dims d(c);
  Replay m;
  // Baseline: weights (storage dtype), fp32 weight grads, this rank's x and dy.
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (const auto& [name, shape] : layer_weight_shapes(c)) {
      std::string id = fmt::format("{}.{}", l, name);
      m.alloc("w." + id, "weights", shape, d.dt);
      m.alloc("g." + id, "grads", shape, DType::f32);
    }
  m.alloc("x", "input.x", {d.N, d.B, d.D}, d.dt);
  m.alloc("dy", "input.dy", {d.N, d.B, d.D}, d.dt);
  PlannedMemory out;
  out.baseline_bytes = m.live();
  const std::map<std::string, int64_t> baseline_tags = m.by_tag();
  m.reset_peak();
  auto lid = [](int64_t l) { return fmt::format("L{}.", l); };
  for (int64_t l = 0; l < c.num_layers; ++l) layer_forward(m, c, d, lid(l));
  out.saved_bytes = m.live() - out.baseline_bytes;
  out.forward_peak_bytes = m.peak() - out.baseline_bytes;
  auto forward_breakdown = m.peak_by_tag();
  for (const auto& [tag, bytes] : m.by_tag()) {
    int64_t extra = bytes - (baseline_tags.count(tag) ? baseline_tags.at(tag) : 0);
    if (extra) out.saved_breakdown[tag] = extra;
  }
  m.reset_peak();
  for (int64_t l = c.num_layers - 1; l >= 0; --l) {
    layer_backward(m, c, d, lid(l), l > 0 ? lid(l - 1) + "y" : "");
    if (l < c.num_layers - 1) m.release(lid(l + 1) + "dx");  // the incoming gradient
  }
  out.backward_peak_bytes = m.peak() - out.baseline_bytes;
  out.activation_peak_bytes = std::max(out.forward_peak_bytes, out.backward_peak_bytes);
  out.peak_breakdown = out.forward_peak_bytes >= out.backward_peak_bytes ? forward_breakdown : m.peak_by_tag();
  return out;
}

int64_t PlannedComm::tensor_bytes() const {
  int64_t s = 0;
  for (const auto& r : attention) s += r.tensor_bytes;
  return s;
}
int64_t PlannedComm::wire_bytes() const {
  int64_t s = 0;
  for (const auto& r : attention) s += r.wire_bytes;
  return s;
}

PlannedComm plan_comm(const MlaConfig& c) {
  c.validate();
  const Dims d(c);
  const int64_t es = dtype_size(d.dt);
  PlannedComm out;
  // An all-to-all of [N, B, H, width] (or its inverse over [T, B, Hr, width]): the same element count.
  auto a2a = [&](const char* name, int64_t width) {
    const int64_t bytes = d.N * d.B * d.H * width * es;
    out.attention.push_back(record(CollectiveOp::all_to_all, name, d.dt, bytes, bytes / d.P * (d.P - 1)));
  };
  auto shard = [&](CollectiveOp op, const char* name) {
    const int64_t bytes = d.N * d.B * d.Dl * es;
    out.attention.push_back(record(op, name, d.dt, bytes, bytes * (d.P - 1)));
  };
  for (int64_t l = 0; l < c.num_layers; ++l) {
    a2a("q", d.Dqk);
    if (c.form == Form::explicit_form) {
      a2a("k", d.Dqk);
      a2a("v", d.Dv);
    } else {
      shard(CollectiveOp::all_gather, "latent");
    }
    a2a("o", d.Dv);
  }
  for (int64_t l = c.num_layers - 1; l >= 0; --l) {
    a2a("do", d.Dv);
    if (c.form == Form::explicit_form) {
      a2a("dq", d.Dqk);
      a2a("dk", d.Dqk);
      a2a("dv", d.Dv);
    } else {
      shard(CollectiveOp::reduce_scatter, "dlatent");
      a2a("dq", d.Dqk);
    }
  }
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (const auto& [name, shape] : layer_weight_shapes(c)) {
      const int64_t bytes = shape_numel(shape) * 4;  // fp32 gradients
      out.grad_sync.push_back(record(CollectiveOp::all_reduce, "grad_sync", DType::f32, bytes, 2 * (d.P - 1) * bytes / d.P));
    }
  return out;
}

}  // namespace laga
