// Weights in and out of .safetensors files: loading a checkpoint in laga's own naming or a
// Hugging Face DeepSeek-V2/V3 one, writing weights, and the --dump of a run (docs/cli.md §4) that
// independent implementations check (tests/torch/mla_block_torch.py).
//
// Names (docs/design.md §1): laga's are "layers.{l}.<name>" with the names of LayerWeights; Hugging
// Face's are "model.layers.{l}.input_layernorm.weight" for attn_norm and
// "model.layers.{l}.self_attn.<key>.weight" for the rest (q_a_proj, q_a_layernorm, q_b_proj,
// q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj). Both store [out, in] like a
// PyTorch Linear, so nothing is transposed. FP8 checkpoints (DeepSeek-V3's release) must be
// dequantised first: F8 tensors are refused by name.
//
// Not here: the format itself (io/safetensors.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "laga/mla/config.hpp"
#include "laga/core/tensor.hpp"
#include "laga/mla/weights.hpp"

namespace laga {

enum class WeightNaming { laga, hugging_face };
std::string_view weight_naming_name(WeightNaming n);  // "laga", "hugging-face"

// The name in a file of layer l's weight `name` (a LayerWeights name: "wq_a", "wkv_b", ...).
std::string checkpoint_name(WeightNaming naming, int64_t layer, const std::string& name);

// Layers 0..c.num_layers-1 of the checkpoint at path, converted to c.dtype, tagged "weights".
// path is a .safetensors file, a Hugging Face index (model.safetensors.index.json, whose
// weight_map names the shard of each tensor), or a directory holding either
// model.safetensors.index.json or model.safetensors. The naming is detected from layer 0 (laga's
// wins when a file has both); other tensors in the file are ignored. Usage error naming the file,
// the tensor, its shape and the expected one when a tensor is missing or mis-shaped.
Weights load_weights(const std::string& path, const Config& c);

// Writes w (each tensor in its own dtype) under the given naming.
void write_weights(const std::string& path, const MlaConfig& c, const Weights& w,
                   WeightNaming naming = WeightNaming::laga);

// Creates dir if missing and checks that a file can be written there (a probe file, removed
// again); usage error naming dir otherwise. For the CLI to fail before a run, not after.
void check_writable_dir(const std::string& dir);

// The --dump of a run: dir/config.json (c.to_json(), pretty-printed) and dir/tensors.safetensors
// holding x, dy, y, dx [T, B, D], then "layers.{l}.<name>" for every weight and
// "layers.{l}.<name>.grad" for every gradient, all converted to F32 whatever c.dtype is
// (metadata: format "pt", producer "laga", dtype = c.dtype's name), and for a sparse form
// "layers.{l}.topk" (I32 [T, B, k]: the selection's positions, ascending, −1 padded). The file
// loads back with load_weights. Creates dir if missing.
void write_dump(const std::string& dir, const MlaConfig& c, const Tensor& x, const Tensor& dy,
                const Tensor& y, const Tensor& dx, const Weights& w, const Weights& grads,
                const std::vector<Tensor>& topk = {});

}  // namespace laga
