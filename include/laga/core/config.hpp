// MlaConfig: the dimensions of an MLA attention block (DESIGN §1), the run's shape (sequence,
// batch, ranks, layers) and its choices (form, kernel, dtype), with the named presets. A config is
// validated as a whole: validate() reports every problem at once, in one usage error.
//
// RoPE/YaRN frequencies and the softmax scale are derived here, once, by the formulas of DESIGN §1.1.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "laga/core/dtype.hpp"

namespace laga {

enum class Form { explicit_form, absorbed, laga };
enum class Kernel { eager, fused };
enum class AbsorbedKv { shared, expanded };

std::string_view form_name(Form f);          // "explicit", "absorbed", "laga"
std::string_view kernel_name(Kernel k);      // "eager", "fused"
std::string_view absorbed_kv_name(AbsorbedKv a);
Form parse_form(std::string_view s);
Kernel parse_kernel(std::string_view s);
AbsorbedKv parse_absorbed_kv(std::string_view s);

struct RopeScaling {
  bool enabled = true;  // type "yarn"; disabled means plain RoPE with softmax scale Dqk^-0.5
  double factor = 40;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32, beta_slow = 1;
  double mscale = 1, mscale_all_dim = 1;
};

// The largest model dimension laga accepts (hidden size, heads, ranks, head dims): far beyond any MLA
// model, small enough that sizes derived from dimensions cannot overflow before validate() sizes them.
inline constexpr int64_t kMaxModelDim = int64_t(1) << 20;

struct MlaConfig {
  std::string model = "tiny";  // the preset this config started from
  // Model dimensions (Hugging Face names).
  int64_t hidden_size = 0;          // D
  int64_t num_attention_heads = 0;  // H
  int64_t q_lora_rank = 0;          // Lq; 0 = a single wq [H·Dqk, D], no q_norm
  int64_t kv_lora_rank = 0;         // Lkv
  int64_t qk_nope_head_dim = 0;     // Dn
  int64_t qk_rope_head_dim = 0;     // Dr
  int64_t v_head_dim = 0;           // Dv
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000;
  bool rope_interleaved = true;
  RopeScaling rope_scaling;
  // The run.
  int64_t num_layers = 1;  // L
  int64_t seq_len = 0;     // T, global
  int64_t batch = 1;       // B
  int64_t sp = 1;          // P
  Form form = Form::explicit_form;
  Kernel kernel = Kernel::fused;
  AbsorbedKv absorbed_kv = AbsorbedKv::expanded;
  DType dtype = DType::bf16;

  static MlaConfig preset(std::string_view name);  // usage error naming the valid presets
  static std::vector<std::string> preset_names();

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }  // Dqk
  int64_t latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }       // Dl
  int64_t tokens_per_rank() const { return seq_len / sp; }                      // N (per batch entry)
  int64_t heads_per_rank() const { return num_attention_heads / sp; }          // Hr
  double softmax_scale() const;
  double rope_attention_factor() const;           // yarn_mscale(f, m) / yarn_mscale(f, ma)
  std::vector<double> rope_inv_freq() const;      // [Dr/2], YaRN-corrected

  // Empty when valid. Besides ranges and divisibility: every double finite, no model dimension above
  // kMaxModelDim, the largest tensors of a run addressable in int64 bytes, and a finite, positive softmax
  // scale and RoPE attention factor.
  std::vector<std::string> problems() const;
  void validate() const;                      // usage error listing every problem

  nlohmann::json to_json() const;                   // the keys of DESIGN §1.1
  // Inverse of to_json; also reads a Hugging Face DeepSeek config.json (its extra keys are ignored).
  // Usage error on missing or mistyped keys; validates unless told not to (the CLI sets the run's
  // fields first).
  static MlaConfig from_json(const nlohmann::json& j, bool validate = true);
};

// Divisors of n, for "try ..." suggestions: the first 12, smallest first, from those up to 2^20 and n.
std::string divisors_str(int64_t n);

}  // namespace laga
