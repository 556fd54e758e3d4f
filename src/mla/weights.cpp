#include "laga/mla/weights.hpp"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "laga/core/error.hpp"
#include "laga/core/random.hpp"

namespace laga {

const std::vector<WeightSpec>& weight_table() {
  using D = const ModelDims&;
  static const std::vector<WeightSpec> table = {
      {"attn_norm", "input_layernorm.weight", "RMSNorm before attention", "[D]",
       &LayerWeights::attn_norm,
       [](D d) -> Shape { return d.attention_only ? Shape{} : Shape{d.hidden_size}; }},
      {"wq_a", "self_attn.q_a_proj.weight", "W^DQ", "[Lq, D]", &LayerWeights::wq_a,
       [](D d) -> Shape {
         return d.q_lora_rank > 0 ? Shape{d.q_lora_rank, d.hidden_size} : Shape{};
       }},
      {"q_norm", "self_attn.q_a_layernorm.weight", "RMSNorm on c^Q", "[Lq]", &LayerWeights::q_norm,
       [](D d) -> Shape { return d.q_lora_rank > 0 ? Shape{d.q_lora_rank} : Shape{}; }},
      {"wq_b", "self_attn.q_b_proj.weight", "W^UQ, W^QR", "[H·(Dn+Dr), Lq]", &LayerWeights::wq_b,
       [](D d) -> Shape {
         return d.q_lora_rank > 0 ? Shape{d.num_attention_heads * d.qk_head_dim(), d.q_lora_rank}
                                  : Shape{};
       }},
      {"wq", "self_attn.q_proj.weight", "W^Q (q_lora_rank 0)", "[H·(Dn+Dr), D]", &LayerWeights::wq,
       [](D d) -> Shape {
         return d.q_lora_rank == 0 ? Shape{d.num_attention_heads * d.qk_head_dim(), d.hidden_size}
                                   : Shape{};
       }},
      {"wkv_a", "self_attn.kv_a_proj_with_mqa.weight", "W^DKV, W^KR", "[Lkv+Dr, D]",
       &LayerWeights::wkv_a,
       [](D d) -> Shape {
         return {d.kv_lora_rank + d.qk_rope_head_dim, d.hidden_size};
       }},
      {"kv_norm", "self_attn.kv_a_layernorm.weight", "RMSNorm on c^KV", "[Lkv]",
       &LayerWeights::kv_norm, [](D d) -> Shape { return {d.kv_lora_rank}; }},
      {"wkv_b", "self_attn.kv_b_proj.weight", "W^UK, W^UV", "[H·(Dn+Dv), Lkv]",
       &LayerWeights::wkv_b,
       [](D d) -> Shape {
         return {d.num_attention_heads * (d.qk_nope_head_dim + d.v_head_dim), d.kv_lora_rank};
       }},
      {"wo", "self_attn.o_proj.weight", "W^O", "[D, H·Dv]", &LayerWeights::wo,
       [](D d) -> Shape {
         return {d.hidden_size, d.num_attention_heads * d.v_head_dim};
       }},
      // the lightning indexer (DeepSeek-V3.2), when the model has one
      {"indexer.wq_b", "self_attn.indexer.wq_b.weight", "W^{I,Q}: c^Q -> index queries",
       "[H_I·D_I, Lq]", &LayerWeights::indexer_wq_b,
       [](D d) -> Shape {
         return d.has_indexer() ? Shape{d.index_n_heads * d.index_head_dim, d.q_lora_rank}
                                : Shape{};
       }},
      {"indexer.wk", "self_attn.indexer.wk.weight", "W^{I,K}: x -> the index key", "[D_I, D]",
       &LayerWeights::indexer_wk,
       [](D d) -> Shape {
         return d.has_indexer() ? Shape{d.index_head_dim, d.hidden_size} : Shape{};
       }},
      {"indexer.k_norm", "self_attn.indexer.k_norm.weight", "LayerNorm weight on the index key",
       "[D_I]", &LayerWeights::indexer_k_norm,
       [](D d) -> Shape { return d.has_indexer() ? Shape{d.index_head_dim} : Shape{}; }},
      {"indexer.k_norm_bias", "self_attn.indexer.k_norm.bias", "LayerNorm bias on the index key",
       "[D_I]", &LayerWeights::indexer_k_norm_bias,
       [](D d) -> Shape { return d.has_indexer() ? Shape{d.index_head_dim} : Shape{}; }},
      {"indexer.weights_proj", "self_attn.indexer.weights_proj.weight",
       "w^I: x -> the index heads' weights", "[H_I, D]", &LayerWeights::indexer_weights_proj,
       [](D d) -> Shape {
         return d.has_indexer() ? Shape{d.index_n_heads, d.hidden_size} : Shape{};
       }},
  };
  return table;
}

const WeightSpec* find_weight_spec(std::string_view name) {
  for (const auto& w : weight_table())
    if (name == w.name) return &w;
  return nullptr;
}

namespace {
template <class LW, class F>
void visit(LW& w, F&& f) {
  for (const auto& spec : weight_table())
    if ((w.*spec.member).defined()) f(std::string(spec.name), w.*spec.member);
}
}  // namespace

void LayerWeights::for_each(const std::function<void(const std::string&, Tensor&)>& f) {
  visit(*this, f);
}
void LayerWeights::for_each(const std::function<void(const std::string&, const Tensor&)>& f) const {
  visit(*this, f);
}

void Weights::for_each(const std::function<void(const std::string&, Tensor&)>& f) {
  for (size_t l = 0; l < layers.size(); ++l)
    layers[l].for_each(
        [&](const std::string& n, Tensor& t) { f(fmt::format("layers.{}.{}", l, n), t); });
}
void Weights::for_each(const std::function<void(const std::string&, const Tensor&)>& f) const {
  for (size_t l = 0; l < layers.size(); ++l)
    layers[l].for_each(
        [&](const std::string& n, const Tensor& t) { f(fmt::format("layers.{}.{}", l, n), t); });
}

int64_t Weights::bytes() const {
  int64_t b = 0;
  for_each([&](const std::string&, const Tensor& t) { b += t.nbytes(); });
  return b;
}

std::vector<std::pair<std::string, Shape>> layer_weight_shapes(const ModelDims& c) {
  std::vector<std::pair<std::string, Shape>> s;
  for (const auto& spec : weight_table())
    if (Shape shape = spec.shape(c); !shape.empty()) s.emplace_back(spec.name, std::move(shape));
  return s;
}

Tensor& LayerWeights::by_name(const std::string& name) {
  return const_cast<Tensor&>(static_cast<const LayerWeights&>(*this).by_name(name));
}

const Tensor& LayerWeights::by_name(const std::string& name) const {
  const WeightSpec* spec = find_weight_spec(name);
  LAGA_ASSERT(spec, "no weight named '{}'", name);
  return this->*spec->member;
}

static Weights make_weights(const MlaConfig& c, DType dtype, const std::string& tag, bool zero) {
  Weights w;
  w.layers.resize(size_t(c.num_layers));
  for (auto& layer : w.layers)
    for (auto& [name, shape] : layer_weight_shapes(c))
      layer.by_name(name) =
          zero ? Tensor::zeros(shape, dtype, tag) : Tensor::empty(shape, dtype, tag);
  return w;
}

Weights allocate_weights(const MlaConfig& c, const std::string& tag) {
  return make_weights(c, c.dtype, tag, false);
}
Weights zero_grads(const MlaConfig& c, const std::string& tag) {
  return make_weights(c, DType::f32, tag, true);
}

void init_weights(Weights& w, const MlaConfig& c, uint64_t seed) {
  w.for_each([&](const std::string& name, Tensor& t) {
    if (name.ends_with("_bias"))
      fill_normal(t, seed, name, 0.1, 0.0);
    else if (t.rank() == 1)
      fill_normal(t, seed, name, 0.1, 1.0);
    else
      fill_normal(t, seed, name, 1.0 / std::sqrt(double(t.dim(1))));
  });
}

void copy_weights(Weights& dst, const Weights& src) {
  std::vector<std::pair<std::string, const Tensor*>> from;
  src.for_each([&](const std::string& name, const Tensor& t) { from.emplace_back(name, &t); });
  size_t i = 0;
  dst.for_each([&](const std::string& name, Tensor& t) {
    LAGA_CHECK(i < from.size() && from[i].first == name && from[i].second->shape() == t.shape() &&
                   from[i].second->dtype() == t.dtype(),
               "copy_weights: {} is not the source's tensor {} (another model or dtype)", name,
               i < from.size() ? from[i].first : "(none left)");
    t.copy_from(*from[i++].second);
  });
  LAGA_CHECK(i == from.size(), "copy_weights: the source has {} tensors, the destination {}",
             from.size(), i);
}

}  // namespace laga
