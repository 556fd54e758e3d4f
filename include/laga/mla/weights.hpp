// The weights of an L-layer MLA stack, by DeepSeek-V3's reference names (docs/design.md §1),
// row-major [out, in] like a PyTorch Linear, and their gradients. Replicated on every rank.
//
// Layer l's tensors are named "layers.{l}.<name>" in files; gradients "layers.{l}.<name>.grad".
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "laga/mla/config.hpp"
#include "laga/core/tensor.hpp"

namespace laga {

struct LayerWeights {
  Tensor attn_norm;  // [D]            RMSNorm before attention; none with attention_only
  Tensor wq_a;       // [Lq, D]        when q_lora_rank > 0
  Tensor q_norm;     // [Lq]           when q_lora_rank > 0
  Tensor wq_b;       // [H·Dqk, Lq]    when q_lora_rank > 0
  Tensor wq;         // [H·Dqk, D]     when q_lora_rank == 0
  Tensor wkv_a;      // [Lkv+Dr, D]
  Tensor kv_norm;    // [Lkv]
  Tensor wkv_b;      // [H·(Dn+Dv), Lkv]  per head: Dn k-rows then Dv v-rows
  Tensor wo;         // [D, H·Dv]
  // The lightning indexer (ModelDims::has_indexer), named "indexer.<name>" in files.
  Tensor indexer_wq_b;          // [H_I·D_I, Lq]  index queries from c^Q (after q_norm)
  Tensor indexer_wk;            // [D_I, D]       the index key from x̂
  Tensor indexer_k_norm;        // [D_I]          LayerNorm weight on the index key
  Tensor indexer_k_norm_bias;   // [D_I]          and its bias
  Tensor indexer_weights_proj;  // [H_I, D]       the index heads' weights from x̂

  // The tensor of a weight name ("wq_a", ...); internal error for any other name.
  Tensor& by_name(const std::string& name);
  const Tensor& by_name(const std::string& name) const;

  // The defined tensors in a fixed order, with their names.
  void for_each(const std::function<void(const std::string&, Tensor&)>& f);
  void for_each(const std::function<void(const std::string&, const Tensor&)>& f) const;
};

struct Weights {
  std::vector<LayerWeights> layers;
  void for_each(const std::function<void(const std::string& full_name, Tensor&)>& f);
  void for_each(const std::function<void(const std::string& full_name, const Tensor&)>& f) const;
  int64_t bytes() const;
};

// The one table of a layer's weights: every place that names, shapes or maps a weight (allocation,
// for_each, by_name, checkpoint loading, dumps, the Hugging Face mapping, error messages) reads it.
struct WeightSpec {
  const char* name;       // ours: DeepSeek-V3's reference names
  const char* hf_key;     // Hugging Face: model.layers.{l}.<hf_key> ("....weight", "....bias")
  const char* paper;      // the DeepSeek-V2/V3 papers' symbols
  const char* shape_doc;  // "[Lq, D]": the shape in the dimension letters of docs/design.md §1
  Tensor LayerWeights::*member;
  // The shape for these dimensions; empty when the weight does not exist (wq_a without
  // q_lora_rank, attn_norm with attention_only).
  Shape (*shape)(const ModelDims& d);
};
const std::vector<WeightSpec>& weight_table();
const WeightSpec* find_weight_spec(std::string_view name);  // null for an unknown name

// The names and shapes of one layer's weights for this config, in for_each's order.
std::vector<std::pair<std::string, Shape>> layer_weight_shapes(const ModelDims& c);

// Uninitialised weights of the config's dtype, tagged "weights".
Weights allocate_weights(const MlaConfig& c, const std::string& tag = "weights");
// Zeroed weight gradients, always fp32 whatever the storage dtype: gradients are accumulated and
// reduced in fp32 (Megatron's main-grad convention), so a bf16 run's weight gradient is rounded
// once per product, never once per rank or per partial sum.
Weights zero_grads(const MlaConfig& c, const std::string& tag = "grads");
// Deterministic initialisation from a seed: norms = 1 + small noise, biases small noise,
// projections ~ N(0, 1/fan_in).
void init_weights(Weights& w, const MlaConfig& c, uint64_t seed);
// dst's tensors = src's, by name, shape and dtype (both allocated for the same model and dtype).
void copy_weights(Weights& dst, const Weights& src);

}  // namespace laga
