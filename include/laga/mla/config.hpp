// The configuration of a run, in three parts: ModelDims (the MLA block's dimensions, norms and
// RoPE, Hugging Face names), RunShape (sequence, batch, ranks, layers) and RunChoices (form,
// kernel, dtype). MlaConfig is the three together as the user spells them (presets, JSON, CLI
// flags), freely edited; Config is an MlaConfig that passed validation — the only kind the engine
// (block, forms, drivers, planner) accepts — so validation happens once, where a Config is made,
// and reports every problem in one usage error.
//
// The YaRN frequencies and factors live with RoPE (ops/rope.hpp); the softmax scale is derived here
// from the same rope_scaling (docs/design.md §1.1).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "laga/core/dtype.hpp"
#include "laga/ops/attention.hpp"
#include "laga/ops/rope.hpp"

namespace laga {

class Form;

// The largest model dimension laga accepts (hidden size, heads, ranks, head dims): far beyond any
// MLA model, small enough that sizes derived from dimensions cannot overflow before problems()
// sizes them.
inline constexpr int64_t kMaxModelDim = int64_t(1) << 20;

// The MLA block's dimensions (D, H, Lq, Lkv, Dn, Dr, Dv of docs/design.md §1), norms and RoPE.
struct ModelDims {
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
  // The lightning indexer of DeepSeek Sparse Attention (docs/sparse.md): H_I index heads of D_I
  // dims (RoPE on the first Dr, rotate-half as DeepSeek's reference rotates them), k selected keys
  // per query. All 0: a model without one (DeepSeek-V3); the dense forms ignore it.
  int64_t index_n_heads = 0;   // H_I
  int64_t index_head_dim = 0;  // D_I
  int64_t index_topk = 0;      // k
  // The attention alone (Hugging Face's self_attn): y = MLA(x) per layer, no input RMSNorm (xn is
  // x: no attn_norm weight in the model) and no residual. Off: y = x + MLA(RMSNorm(x)), the
  // attention half of a decoder layer (docs/block.md). Here, beside the dimensions, because it
  // decides which weights the model has (the weight table's shapes read ModelDims).
  bool attention_only = false;

  bool has_indexer() const { return index_n_heads > 0; }
  // The indexer's RoPE: the MLA's frequencies and scaling on its first Dr dims, rotate-half pairs.
  RopeSpec indexer_rope() const {
    return {qk_rope_head_dim, rope_theta, /*interleaved=*/false, rope_scaling};
  }
  // H_I^-1/2 · D_I^-1/2, the scale of the index-head weights
  double indexer_weight_scale() const;
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }  // Dqk
  int64_t latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }       // Dl
  RopeSpec rope() const { return {qk_rope_head_dim, rope_theta, rope_interleaved, rope_scaling}; }
  // Dqk^-0.5 · yarn_mscale(f, mscale_all_dim)², Dqk^-0.5 without scaling
  double softmax_scale() const;
};

// How much work: the stacked layers, the global sequence, the micro-batch, the ranks of the group.
struct RunShape {
  int64_t num_layers = 1;  // L
  int64_t seq_len = 0;     // T, global
  int64_t batch = 1;       // B
  int64_t sp = 1;          // P
  // Pu (--ulysses): ranks per head-scatter group; 0 means none given, Pu = P (one group). Pu < P is
  // laga-ulysses's (P = Pu × Pr): head scatter inside groups of Pu consecutive ranks and a ring
  // over the Pr groups (docs/design.md §2.7); a Config of laga-ulysses holds its Pu, its default
  // where none is given (Form::default_ulysses, resolved).
  int64_t ulysses = 0;

  int64_t head_group() const { return ulysses > 0 ? ulysses : sp; }                // Pu
  int64_t ring_groups() const { return sp / std::max<int64_t>(head_group(), 1); }  // Pr
  bool hybrid() const { return ulysses > 0 && ulysses < sp; }  // head scatter × ring
};

// The dtype in which the forms that all-gather the latent (laga, laga-recompute, both absorbed)
// send their dlatent partial sums through the reduce-scatter, the all-gather's adjoint: `storage`
// rounds each rank's partial (its heads' sum) to the storage dtype before the sum over ranks;
// `fp32` keeps it in fp32 and rounds once, after the sum over ranks — as explicit rounds its
// dlatent once, after its sum over all heads. Identical under fp32 storage; under bf16, fp32
// doubles the reduce-scatter's bytes. Chosen default and its numbers: docs/numerics.md.
enum class DlatentSum { storage, fp32 };
std::string_view dlatent_sum_name(DlatentSum s);
DlatentSum parse_dlatent_sum(std::string_view name);  // usage error naming the valid values

// The fused attention kernel's backward order (docs/attention.md §4): two-pass keeps its workspace
// small (a second pass recomputes S and dP for dq); one-pass runs FlashAttention-2's 5 tile
// products per pair instead of 7 and holds fp32 dq sums of the tasks in flight (and, with fewer
// than 4 K/V heads × batch, fp32 dk, dv partials; docs/attention.md §5). A speed / memory
// trade-off, shown by plan and bench; the default is two-pass, the lean one.
enum class AttnBackward { two_pass, one_pass };
std::string_view attn_backward_name(AttnBackward a);
AttnBackward parse_attn_backward(std::string_view name);  // usage error naming the valid values

// The sparse forms' training stage (DeepSeek-V3.2): warmup, dense main attention and the indexer's
// KL over every earlier key; sparse, the main attention over the selected keys alone and the KL
// over them. In both the indexer's inputs are detached: it learns from its loss alone, the main
// path from dy alone.
enum class IndexerStage { warmup, sparse };
std::string_view indexer_stage_name(IndexerStage s);
IndexerStage parse_indexer_stage(std::string_view name);  // usage error naming the valid stages

// How the sparse forms lay the sequence over the ranks (docs/sparse.md §5): zigzag, rank r holds
// chunks r and 2P−1−r of T/(2P) tokens (the causal work of its queries is then nearly equal on
// every rank); contiguous, rank r holds tokens r·N .. (r+1)·N − 1 (rank P−1's queries score every
// key, rank 0's N of them). The dense forms have their own layouts and do not take it.
enum class CpLayout { zigzag, contiguous };
std::string_view cp_layout_name(CpLayout l);
CpLayout parse_cp_layout(std::string_view name);  // usage error naming the valid layouts

// How it is done: the form (a registered variant label, mla/form.hpp), the attention kernel, the
// storage dtype, the dtype of the dlatent reduce-scatter's partial sums, and whether the forms'
// collectives overlap compute (left in flight while the query path and what else does not need them
// runs; off: each waited where it is issued). The results are bitwise the same either way
// (docs/design.md §2.6).
struct RunChoices {
  std::string form = "explicit";
  Kernel kernel = Kernel::fused;
  DType dtype = DType::bf16;
  DlatentSum dlatent_sum = DlatentSum::storage;
  AttnBackward attn_backward = AttnBackward::two_pass;
  // The dtype the dlatent partial sums travel in (fp32, or the storage dtype).
  DType dlatent_sum_dtype() const { return dlatent_sum == DlatentSum::fp32 ? DType::f32 : dtype; }
  bool overlap = false;
  IndexerStage indexer_stage = IndexerStage::sparse;  // the sparse forms' alone
  double indexer_loss_scale = 1;  // the indexer loss's weight in the loss backward differentiates
  CpLayout cp_layout = CpLayout::zigzag;  // the sparse forms' alone
};

struct MlaConfig : ModelDims, RunShape, RunChoices {
  std::string model = "tiny";  // the preset this config started from

  static MlaConfig preset(std::string_view name);  // usage error naming the valid presets
  static std::vector<std::string> preset_names();

  int64_t tokens_per_rank() const { return seq_len / sp; }  // N (per batch entry)
  int64_t heads_per_rank() const { return num_attention_heads / head_group(); }  // Hr = H/Pu
  // The keys each query selects as the sparse forms run it: index_topk, clamped to T (a query has
  // at most T keys; the CLI says so when it clamps). The model keeps index_topk as given.
  int64_t topk() const { return std::min(index_topk, seq_len); }

  // Empty when valid, judged as Config takes it (resolved). Besides ranges and divisibility: a
  // registered form, every double finite, no model dimension above kMaxModelDim, the largest
  // tensors of a run addressable in int64 bytes, and a finite, positive softmax scale and RoPE
  // attention factor.
  std::vector<std::string> problems() const;
  // The same checks without any form's own conditions (P | H for the head-scatter forms, the
  // zigzag's 2P | T for the ring forms) and without checking that the form is registered: what must
  // hold for every command, whichever forms it runs. Commands that run every form (plan, verify)
  // refuse a config with these problems and report a form whose own conditions fail as "not run"
  // (forms_at, form.hpp).
  std::vector<std::string> problems_apart_from_form() const;

  nlohmann::json to_json() const;  // the keys of docs/design.md §1.1
  // Inverse of to_json; also reads a Hugging Face DeepSeek config.json (its extra keys are
  // ignored). Usage error on missing or mistyped keys. Not validated: make a Config of it.
  static MlaConfig from_json(const nlohmann::json& j);

 private:
  std::vector<std::string> problems_with(const Form* f, bool named) const;
};

// A validated MlaConfig. Making one (implicitly, from an MlaConfig) resolves its form's spelling
// and fills the form's defaults (resolved, mla/form.hpp: laga with a --ulysses other than --sp is
// laga-ulysses, with its Pu) and validates it: a usage error listing every problem. Read it through
// -> or *; edit a copy with with().
class Config {
 public:
  // implicit on purpose: every MlaConfig entering the engine is checked here
  Config(MlaConfig spec);
  const MlaConfig& operator*() const { return spec_; }
  const MlaConfig* operator->() const { return &spec_; }
  // A copy with edit applied, validated again.
  Config with(const std::function<void(MlaConfig&)>& edit) const;

 private:
  MlaConfig spec_;
};

}  // namespace laga
