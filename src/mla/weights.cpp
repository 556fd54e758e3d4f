#include "laga/mla/weights.hpp"

#include <array>
#include <cmath>

#include "laga/core/random.hpp"

namespace laga {

namespace {
template <class LW, class F>
void visit(LW& w, F&& f) {
  const char* names[] = {"attn_norm", "wq_a", "q_norm", "wq_b", "wq", "wkv_a", "kv_norm", "wkv_b", "wo"};
  auto tensors = std::array{&w.attn_norm, &w.wq_a, &w.q_norm, &w.wq_b, &w.wq, &w.wkv_a, &w.kv_norm, &w.wkv_b, &w.wo};
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i]->defined()) f(std::string(names[i]), *tensors[i]);
}
}  // namespace

void LayerWeights::for_each(const std::function<void(const std::string&, Tensor&)>& f) { visit(*this, f); }
void LayerWeights::for_each(const std::function<void(const std::string&, const Tensor&)>& f) const { visit(*this, f); }

void Weights::for_each(const std::function<void(const std::string&, Tensor&)>& f) {
  for (size_t l = 0; l < layers.size(); ++l)
    layers[l].for_each([&](const std::string& n, Tensor& t) { f(fmt::format("layers.{}.{}", l, n), t); });
}
void Weights::for_each(const std::function<void(const std::string&, const Tensor&)>& f) const {
  for (size_t l = 0; l < layers.size(); ++l)
    layers[l].for_each([&](const std::string& n, const Tensor& t) { f(fmt::format("layers.{}.{}", l, n), t); });
}

int64_t Weights::bytes() const {
  int64_t b = 0;
  for_each([&](const std::string&, const Tensor& t) { b += t.nbytes(); });
  return b;
}

std::vector<std::pair<std::string, Shape>> layer_weight_shapes(const MlaConfig& c) {
  const int64_t D = c.hidden_size, H = c.num_attention_heads, Lq = c.q_lora_rank, Lkv = c.kv_lora_rank;
  const int64_t Dqk = c.qk_head_dim(), Dr = c.qk_rope_head_dim, Dn = c.qk_nope_head_dim, Dv = c.v_head_dim;
  std::vector<std::pair<std::string, Shape>> s{{"attn_norm", {D}}};
  if (Lq > 0) {
    s.push_back({"wq_a", {Lq, D}});
    s.push_back({"q_norm", {Lq}});
    s.push_back({"wq_b", {H * Dqk, Lq}});
  } else {
    s.push_back({"wq", {H * Dqk, D}});
  }
  s.push_back({"wkv_a", {Lkv + Dr, D}});
  s.push_back({"kv_norm", {Lkv}});
  s.push_back({"wkv_b", {H * (Dn + Dv), Lkv}});
  s.push_back({"wo", {D, H * Dv}});
  return s;
}

Tensor& LayerWeights::by_name(const std::string& name) {
  return const_cast<Tensor&>(static_cast<const LayerWeights&>(*this).by_name(name));
}

const Tensor& LayerWeights::by_name(const std::string& name) const {
  if (name == "attn_norm") return attn_norm;
  if (name == "wq_a") return wq_a;
  if (name == "q_norm") return q_norm;
  if (name == "wq_b") return wq_b;
  if (name == "wq") return wq;
  if (name == "wkv_a") return wkv_a;
  if (name == "kv_norm") return kv_norm;
  if (name == "wkv_b") return wkv_b;
  if (name == "wo") return wo;
  LAGA_ASSERT(false, "no weight named '{}'", name);
}

static Weights make_weights(const MlaConfig& c, DType dtype, const std::string& tag, bool zero) {
  Weights w;
  w.layers.resize(size_t(c.num_layers));
  for (auto& layer : w.layers)
    for (auto& [name, shape] : layer_weight_shapes(c))
      layer.by_name(name) = zero ? Tensor::zeros(shape, dtype, tag) : Tensor::empty(shape, dtype, tag);
  return w;
}

Weights allocate_weights(const MlaConfig& c, const std::string& tag) { return make_weights(c, c.dtype, tag, false); }
Weights zero_grads(const MlaConfig& c, const std::string& tag) { return make_weights(c, DType::f32, tag, true); }

void init_weights(Weights& w, const MlaConfig& c, uint64_t seed) {
  w.for_each([&](const std::string& name, Tensor& t) {
    if (t.rank() == 1) fill_normal(t, seed, name, 0.1, 1.0);
    else fill_normal(t, seed, name, 1.0 / std::sqrt(double(t.dim(1))));
  });
}

}  // namespace laga
