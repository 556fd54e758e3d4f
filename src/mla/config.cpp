#include "laga/mla/config.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <optional>

#include "laga/core/error.hpp"
#include "laga/mla/form.hpp"

namespace laga {

std::string_view dlatent_sum_name(DlatentSum s) {
  return s == DlatentSum::fp32 ? "fp32" : "storage";
}
DlatentSum parse_dlatent_sum(std::string_view name) {
  if (name == "fp32") return DlatentSum::fp32;
  if (name == "storage") return DlatentSum::storage;
  LAGA_FAIL_USAGE(
      "unknown dlatent sum '{}' (--dlatent-sum, JSON dlatent_sum); valid: fp32, storage", name);
}

std::string_view attn_backward_name(AttnBackward a) {
  return a == AttnBackward::one_pass ? "one-pass" : "two-pass";
}
AttnBackward parse_attn_backward(std::string_view name) {
  if (name == "one-pass") return AttnBackward::one_pass;
  if (name == "two-pass") return AttnBackward::two_pass;
  LAGA_FAIL_USAGE(
      "unknown attention backward '{}' (--attn-backward, JSON attn_backward); valid: two-pass, "
      "one-pass",
      name);
}

std::string_view indexer_stage_name(IndexerStage s) {
  return s == IndexerStage::warmup ? "warmup" : "sparse";
}

IndexerStage parse_indexer_stage(std::string_view name) {
  if (name == "warmup") return IndexerStage::warmup;
  if (name == "sparse") return IndexerStage::sparse;
  LAGA_FAIL_USAGE(
      "unknown indexer stage '{}' (--indexer-stage, JSON indexer_stage); valid: warmup, sparse",
      name);
}

std::string_view cp_layout_name(CpLayout l) {
  return l == CpLayout::zigzag ? "zigzag" : "contiguous";
}

CpLayout parse_cp_layout(std::string_view name) {
  if (name == "zigzag") return CpLayout::zigzag;
  if (name == "contiguous") return CpLayout::contiguous;
  LAGA_FAIL_USAGE("unknown layout '{}' (--cp-layout, JSON cp_layout); valid: zigzag, contiguous",
                  name);
}

std::vector<std::string> MlaConfig::preset_names() {
  return {"deepseek-v3", "deepseek-v3.2", "deepseek-v2-lite", "small", "tiny"};
}

MlaConfig MlaConfig::preset(std::string_view name) {
  MlaConfig c;
  c.model = std::string(name);
  auto dims = [&](int64_t D, int64_t H, int64_t Lq, int64_t Lkv, int64_t Dn, int64_t Dr,
                  int64_t Dv) {
    c.hidden_size = D, c.num_attention_heads = H, c.q_lora_rank = Lq, c.kv_lora_rank = Lkv;
    c.qk_nope_head_dim = Dn, c.qk_rope_head_dim = Dr, c.v_head_dim = Dv;
  };
  auto indexer = [&](int64_t HI, int64_t DI, int64_t k) {
    c.index_n_heads = HI, c.index_head_dim = DI, c.index_topk = k;
  };
  if (name == "deepseek-v3") {
    dims(7168, 128, 1536, 512, 128, 64, 128);
  } else if (name == "deepseek-v3.2") {
    // DeepSeek-V3's MLA with the lightning indexer of DeepSeek Sparse Attention.
    dims(7168, 128, 1536, 512, 128, 64, 128);
    indexer(64, 128, 2048);
  } else if (name == "deepseek-v2-lite") {
    // Hugging Face's DeepSeek-V2-Lite config sets mscale = mscale_all_dim = 0.707.
    dims(2048, 16, 0, 512, 128, 64, 128);
    c.rope_scaling.mscale = c.rope_scaling.mscale_all_dim = 0.707;
  } else if (name == "small") {
    // DeepSeek's head dims (latent 576, 192/128 heads) at a hidden size one machine trains quickly.
    // Its indexer selects 64 keys: sparse from T 128 on.
    dims(1024, 16, 512, 512, 128, 64, 128);
    indexer(8, 64, 64);
  } else if (name == "tiny") {
    // For tests against the fp64 reference: every dimension distinct, H = 8 so P = 1..8 divide it;
    // its indexer selects 16 keys, so the default T 16 is dense and T 32 on sparse.
    dims(64, 8, 48, 32, 16, 8, 12);
    indexer(4, 32, 16);
  } else {
    LAGA_FAIL_USAGE(
        "unknown model preset '{}'; valid: deepseek-v3, deepseek-v3.2, deepseek-v2-lite, small, "
        "tiny",
        name);
  }
  c.seq_len = 16;
  return c;
}

double ModelDims::indexer_weight_scale() const {
  return 1.0 / std::sqrt(double(index_n_heads) * double(index_head_dim));
}

double ModelDims::softmax_scale() const {
  double s = 1.0 / std::sqrt(double(qk_head_dim()));
  if (rope_scaling.enabled) {
    double m = yarn_mscale(rope_scaling.factor, rope_scaling.mscale_all_dim);
    s *= m * m;
  }
  return s;
}

std::vector<std::string> MlaConfig::problems() const {
  const MlaConfig r = resolved(*this);  // as Config takes it
  return r.problems_with(find_form_or_null(r.form), true);
}

std::vector<std::string> MlaConfig::problems_apart_from_form() const {
  return problems_with(nullptr, false);
}

// Every check; the form's own conditions where f is given, and the registry's check of the form's
// name when named is true. Long on purpose: every rule of a configuration in one list, one check
// each, in the order of its messages.
std::vector<std::string> MlaConfig::problems_with(const Form* f, bool named) const {
  std::vector<std::string> p;
  auto positive = [&](const char* name, int64_t v) {
    if (v <= 0) p.push_back(fmt::format("{} = {} must be positive", name, v));
  };
  positive("hidden_size", hidden_size);
  positive("num_attention_heads", num_attention_heads);
  positive("kv_lora_rank", kv_lora_rank);
  positive("qk_nope_head_dim", qk_nope_head_dim);
  positive("qk_rope_head_dim", qk_rope_head_dim);
  positive("v_head_dim", v_head_dim);
  positive("num_layers (--layers)", num_layers);
  positive("seq_len (--seq)", seq_len);
  positive("batch (--batch)", batch);
  positive("sp (--sp)", sp);
  if (q_lora_rank < 0)
    p.push_back(
        fmt::format("q_lora_rank = {} must be 0 (no q compression) or positive", q_lora_rank));
  if (qk_rope_head_dim > 0 && qk_rope_head_dim % 2)
    // The suggestion stays in range: an odd dimension at or past the limit gets the (even) limit.
    p.push_back(fmt::format("qk_rope_head_dim = {} must be even (RoPE rotates pairs); try {}",
                            qk_rope_head_dim,
                            qk_rope_head_dim < kMaxModelDim ? qk_rope_head_dim + 1 : kMaxModelDim));
  if (!(rms_norm_eps > 0))
    p.push_back(fmt::format("rms_norm_eps = {} must be positive", rms_norm_eps));
  if (!(rope_theta > 1))
    p.push_back(fmt::format("rope_theta = {} must be greater than 1", rope_theta));
  if (rope_scaling.enabled) {
    const auto& rs = rope_scaling;
    if (!(rs.factor >= 1))
      p.push_back(fmt::format("rope_scaling.factor = {} must be >= 1", rs.factor));
    if (rs.original_max_position_embeddings <= 0)
      p.push_back(fmt::format("rope_scaling.original_max_position_embeddings = {} must be positive",
                              rs.original_max_position_embeddings));
    if (!(rs.beta_fast > rs.beta_slow && rs.beta_slow > 0))
      p.push_back(fmt::format(
          "rope_scaling needs beta_fast > beta_slow > 0, got beta_fast = {}, beta_slow = {}",
          rs.beta_fast, rs.beta_slow));
  }
  auto finite = [&](const char* name, double v) {
    if (!std::isfinite(v)) p.push_back(fmt::format("{} = {} must be a finite number", name, v));
  };
  finite("rms_norm_eps", rms_norm_eps);
  finite("rope_theta", rope_theta);
  if (rope_scaling.enabled) {
    const auto& rs = rope_scaling;
    finite("rope_scaling.factor", rs.factor);
    finite("rope_scaling.beta_fast", rs.beta_fast);
    finite("rope_scaling.beta_slow", rs.beta_slow);
    finite("rope_scaling.mscale", rs.mscale);
    finite("rope_scaling.mscale_all_dim", rs.mscale_all_dim);
  }
  const int64_t dims[] = {hidden_size,      num_attention_heads, q_lora_rank, kv_lora_rank,
                          qk_nope_head_dim, qk_rope_head_dim,    v_head_dim};
  const char* dim_names[] = {"hidden_size",  "num_attention_heads", "q_lora_rank",
                             "kv_lora_rank", "qk_nope_head_dim",    "qk_rope_head_dim",
                             "v_head_dim"};
  bool dims_ok = true;
  for (size_t i = 0; i < std::size(dims); ++i) {
    dims_ok = dims_ok && dims[i] >= 0 && (dims[i] > 0 || i == 2);
    if (dims[i] > kMaxModelDim) {
      p.push_back(fmt::format("{} = {} exceeds laga's limit of {} per model dimension",
                              dim_names[i], dims[i], kMaxModelDim));
      dims_ok = false;
    }
  }
  if (dims_ok && num_layers > 0 && seq_len > 0 && batch > 0) {
    // The largest tensors a run allocates (weights over all layers; activations; the eager kernel's
    // scores), in fp64 as the reference holds them: each must be countable in int64 bytes, so that
    // no size computation anywhere overflows.
    const int64_t D = hidden_size, H = num_attention_heads, Lq = q_lora_rank, Lkv = kv_lora_rank;
    const int64_t Dqk = qk_head_dim(), Dv = v_head_dim, Dl = latent_dim(), T = seq_len, B = batch;
    const struct {
      const char* what;
      std::vector<int64_t> factors;
    } largest[] = {
        {"the query weight wq_b/wq, over all layers", {num_layers, H, Dqk, std::max(Lq, D)}},
        {"the key/value weight wkv_b, over all layers",
         {num_layers, H, Dqk + Dv, std::max(Lkv, Dl)}},
        {"the output weight wo, over all layers", {num_layers, D, H, Dv}},
        {"the per-head activations [T, B, H, max(Dqk, Dv, Dl)]",
         {T, B, H, std::max({Dqk, Dv, Dl, D})}},
        {"the attention scores [B, H, T, T] (as the eager kernel and the planner size them)",
         {B, H, T, T}},
    };
    for (const auto& t : largest) {
      __int128 bytes = 8;
      for (int64_t f : t.factors) bytes = std::min<__int128>(bytes * f, __int128(1) << 64);
      if (bytes > __int128(INT64_MAX))
        p.push_back(fmt::format(
            "the configuration is too large to address: {} would exceed 2^63 bytes; reduce "
            "--seq, --batch, --layers or the model's dimensions",
            t.what));
    }
    if (p.empty()) {
      // What the dimensions and the RoPE scaling make of the attention: finite and positive, or
      // every output would be a silent inf or NaN.
      const double scale = softmax_scale(), factor = rope_attention_factor(rope());
      if (!(std::isfinite(scale) && scale > 0))
        p.push_back(
            fmt::format("the softmax scale comes out as {} (from qk head dim {} and "
                        "rope_scaling.mscale_all_dim "
                        "= {}); it must be finite and positive",
                        scale, Dqk, rope_scaling.mscale_all_dim));
      if (!(std::isfinite(factor) && factor > 0))
        p.push_back(fmt::format(
            "the RoPE attention factor comes out as {} (from rope_scaling.mscale = {}, "
            "mscale_all_dim = {}); it must be finite and positive; try mscale = mscale_all_dim = 1",
            factor, rope_scaling.mscale, rope_scaling.mscale_all_dim));
    }
  }
  // --ulysses: the forms that take it judge Pu in their own add_problems; every other form runs
  // over the whole group, where Pu = P is the same run as none.
  if (ulysses < 0)
    p.push_back(fmt::format("--ulysses {} must be positive (or 0: none)", ulysses));
  else if (f && !f->takes_ulysses() && ulysses > 0 && ulysses != sp)
    p.push_back(fmt::format(
        "--ulysses {} (head-scatter groups of that many ranks, a ring over them) applies to {} "
        "only, not to form '{}'; try --form {}, or drop --ulysses",
        ulysses, ulysses_form_names(), form, ulysses_form_names()));
  // The lightning indexer: none (all three 0), or every dimension in range.
  if (index_n_heads || index_head_dim || index_topk) {
    if (index_n_heads <= 0 || index_n_heads > kMaxModelDim)
      p.push_back(
          fmt::format("index_n_heads (--index-heads) = {} must be in [1, {}] (or 0 with "
                      "index_head_dim and index_topk: no indexer)",
                      index_n_heads, kMaxModelDim));
    if (index_head_dim < qk_rope_head_dim || index_head_dim > kMaxModelDim)
      p.push_back(fmt::format(
          "index_head_dim (--index-dim) = {} must be at least qk_rope_head_dim {} (RoPE "
          "rotates an index head's first {} dims) and at most {}; try {}",
          index_head_dim, qk_rope_head_dim, qk_rope_head_dim, kMaxModelDim,
          std::clamp<int64_t>(qk_rope_head_dim, 1, kMaxModelDim / 2) * 2));
    if (index_topk < 1 || index_topk > kMaxModelDim)
      p.push_back(fmt::format(
          "index_topk (--index-topk) = {} must be in [1, {}] (keys each query selects); try {}",
          index_topk, kMaxModelDim, std::clamp<int64_t>(seq_len / 4, 1, kMaxModelDim)));
  }
  if (!(std::isfinite(indexer_loss_scale) && indexer_loss_scale >= 0))
    p.push_back(fmt::format(
        "indexer_loss_scale (--indexer-loss-scale) = {} must be finite and non-negative; try 1",
        indexer_loss_scale));
  if (kernel == Kernel::eager && attn_backward == AttnBackward::one_pass)
    p.push_back(
        "--attn-backward one-pass is an order of the fused kernel's backward; use --kernel fused "
        "or "
        "--attn-backward two-pass");
  // The form's own conditions (the head-scatter forms': P | H) come before the sequence's.
  if (f) f->add_problems(*this, p);
  if (sp > 0 && seq_len > 0 && seq_len % sp)
    p.push_back(fmt::format("--sp {} does not divide --seq {}; try {}", sp, seq_len,
                            divisors_str(seq_len)));
  if (named && !f) p.push_back(fmt::format("unknown form '{}'; valid: {}", form, form_names()));
  return p;
}

Config::Config(MlaConfig spec) : spec_(resolved(std::move(spec))) {
  auto p = spec_.problems();
  if (p.empty()) return;
  std::string msg = fmt::format("invalid configuration (model '{}'): ", spec_.model);
  for (size_t i = 0; i < p.size(); ++i) msg += (i ? "; " : "") + p[i];
  LAGA_FAIL_USAGE("{}", msg);
}

Config Config::with(const std::function<void(MlaConfig&)>& edit) const {
  MlaConfig c = spec_;
  edit(c);
  return Config(std::move(c));
}

nlohmann::json MlaConfig::to_json() const {
  nlohmann::json j;
  j["model"] = model;
  j["hidden_size"] = hidden_size;
  j["num_attention_heads"] = num_attention_heads;
  j["q_lora_rank"] = q_lora_rank;
  j["kv_lora_rank"] = kv_lora_rank;
  j["qk_nope_head_dim"] = qk_nope_head_dim;
  j["qk_rope_head_dim"] = qk_rope_head_dim;
  j["v_head_dim"] = v_head_dim;
  j["attention_only"] = attention_only;
  j["num_layers"] = num_layers;
  j["seq_len"] = seq_len;
  j["batch"] = batch;
  j["sp"] = sp;
  if (ulysses > 0) j["ulysses"] = ulysses;  // only when set: configs without it read as before
  j["form"] = form;
  j["kernel"] = kernel_name(kernel);
  j["dtype"] = dtype_name(dtype);
  j["dlatent_sum"] = dlatent_sum_name(dlatent_sum);
  j["attn_backward"] = attn_backward_name(attn_backward);
  j["overlap"] = overlap;
  j["index_n_heads"] = index_n_heads;
  j["index_head_dim"] = index_head_dim;
  j["index_topk"] = index_topk;
  j["indexer_stage"] = indexer_stage_name(indexer_stage);
  j["indexer_loss_scale"] = indexer_loss_scale;
  j["cp_layout"] = cp_layout_name(cp_layout);
  j["softmax_scale"] = softmax_scale();
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["rope_interleaved"] = rope_interleaved;
  if (rope_scaling.enabled) {
    const auto& rs = rope_scaling;
    j["rope_scaling"] = {{"type", "yarn"},
                         {"factor", rs.factor},
                         {"original_max_position_embeddings", rs.original_max_position_embeddings},
                         {"beta_fast", rs.beta_fast},
                         {"beta_slow", rs.beta_slow},
                         {"mscale", rs.mscale},
                         {"mscale_all_dim", rs.mscale_all_dim}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  return j;
}

namespace {

// An integer field of the configuration JSON (fallback when absent, if given): a JSON integer that
// fits in int64. A float (64.0, 1e30) is refused rather than converted, which would truncate it or,
// out of range, be undefined behaviour.
int64_t json_int(const nlohmann::json& j, const char* key,
                 std::optional<int64_t> fallback = std::nullopt) {
  if (fallback && !j.contains(key)) return *fallback;
  const nlohmann::json& v = j.at(key);
  const bool fits =
      v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX));
  LAGA_CHECK(fits, "configuration JSON: {} is {}, not an integer in [{}, {}]", key, v.dump(),
             INT64_MIN, INT64_MAX);
  return v.get<int64_t>();
}

}  // namespace

MlaConfig MlaConfig::from_json(const nlohmann::json& j) {
  LAGA_CHECK(j.is_object(), "configuration JSON must be an object, got {}", j.type_name());
  MlaConfig c;
  try {
    c.model = j.value("model", std::string("custom"));
    c.hidden_size = json_int(j, "hidden_size");
    c.num_attention_heads = json_int(j, "num_attention_heads");
    c.q_lora_rank =
        j.contains("q_lora_rank") && !j["q_lora_rank"].is_null() ? json_int(j, "q_lora_rank") : 0;
    c.kv_lora_rank = json_int(j, "kv_lora_rank");
    c.qk_nope_head_dim = json_int(j, "qk_nope_head_dim");
    c.qk_rope_head_dim = json_int(j, "qk_rope_head_dim");
    c.v_head_dim = json_int(j, "v_head_dim");
    // laga's key; absent (a Hugging Face config.json): the whole block, input norm and residual
    if (j.contains("attention_only")) {
      LAGA_CHECK(j["attention_only"].is_boolean(),
                 "configuration JSON: attention_only is {}, not true or false",
                 j["attention_only"].dump());
      c.attention_only = j["attention_only"].get<bool>();
    }
    // DeepSeek-V3.2's Hugging Face keys; absent: no indexer
    c.index_n_heads = json_int(j, "index_n_heads", 0);
    c.index_head_dim = json_int(j, "index_head_dim", 0);
    c.index_topk = json_int(j, "index_topk", 0);
    if (j.contains("indexer_stage"))
      c.indexer_stage = parse_indexer_stage(j["indexer_stage"].get<std::string>());
    if (j.contains("cp_layout")) c.cp_layout = parse_cp_layout(j["cp_layout"].get<std::string>());
    if (j.contains("indexer_loss_scale")) {
      LAGA_CHECK(j["indexer_loss_scale"].is_number(),
                 "configuration JSON: indexer_loss_scale is {}, not a number",
                 j["indexer_loss_scale"].dump());
      c.indexer_loss_scale = j["indexer_loss_scale"].get<double>();
    }
    c.num_layers = json_int(j, "num_layers", 1);
    c.seq_len = json_int(j, "seq_len", 16);
    c.batch = json_int(j, "batch", 1);
    c.sp = json_int(j, "sp", 1);
    c.ulysses = json_int(j, "ulysses", 0);
    // A family and its regime ("absorbed" + "absorbed_kv": "shared") name one registered variant;
    // laga with a ulysses other than sp names laga-ulysses (resolve_form_label).
    if (j.contains("form"))
      c.form = resolve_form_label(j["form"].get<std::string>(),
                                  j.value("absorbed_kv", std::string("expanded")), c);
    if (j.contains("kernel")) c.kernel = parse_kernel(j["kernel"].get<std::string>());
    if (j.contains("dtype")) c.dtype = parse_dtype(j["dtype"].get<std::string>());
    if (j.contains("dlatent_sum"))
      c.dlatent_sum = parse_dlatent_sum(j["dlatent_sum"].get<std::string>());
    if (j.contains("attn_backward"))
      c.attn_backward = parse_attn_backward(j["attn_backward"].get<std::string>());
    if (j.contains("overlap")) {
      LAGA_CHECK(j["overlap"].is_boolean(), "configuration JSON: overlap is {}, not true or false",
                 j["overlap"].dump());
      c.overlap = j["overlap"].get<bool>();
    }
    c.rms_norm_eps = j.value("rms_norm_eps", 1e-6);
    c.rope_theta = j.value("rope_theta", 10000.0);
    c.rope_interleaved = j.value("rope_interleaved", true);
    if (!j.contains("rope_scaling") || j["rope_scaling"].is_null()) {
      c.rope_scaling.enabled = false;
    } else {
      const auto& rs = j["rope_scaling"];
      std::string type = rs.value("type", rs.value("rope_type", std::string("yarn")));
      LAGA_CHECK(type == "yarn",
                 "rope_scaling.type '{}' is not supported; valid: yarn (or null for none)", type);
      c.rope_scaling.factor = rs.at("factor").get<double>();
      c.rope_scaling.original_max_position_embeddings =
          json_int(rs, "original_max_position_embeddings");
      c.rope_scaling.beta_fast = rs.value("beta_fast", 32.0);
      c.rope_scaling.beta_slow = rs.value("beta_slow", 1.0);
      c.rope_scaling.mscale = rs.value("mscale", 1.0);
      c.rope_scaling.mscale_all_dim = rs.value("mscale_all_dim", 0.0);
    }
  } catch (const nlohmann::json::exception& e) {
    LAGA_FAIL_USAGE("configuration JSON: {}", e.what());
  }
  return c;
}

}  // namespace laga
