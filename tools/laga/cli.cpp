// Shared CLI pieces (see cli.hpp).
#include "cli.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "laga/comm/communicator.hpp"
#include "laga/core/bytes.hpp"
#include "laga/core/error.hpp"

namespace laga::cli {

namespace {

// A seed is a whole number in [0, 2^64): CLI11 alone would read "-1" as 2^64 − 1 and clamp a larger
// number to 2^64 − 1, two seeds nobody asked for.
const CLI::Validator kSeed(
    [](std::string& text) -> std::string {
      uint64_t v = 0;
      const size_t first = text.find_first_not_of(' '), last = text.find_last_not_of(' ');
      text = first == std::string::npos ? std::string() : text.substr(first, last - first + 1);
      const bool hex = text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X');
      const char* b = text.data() + (hex ? 2 : 0);
      const char* e = text.data() + text.size();
      const auto [end, ec] = std::from_chars(b, e, v, hex ? 16 : 10);
      if (b == e || ec != std::errc() || end != e)
        return "'" + text +
               "' is not a seed; give a whole number from 0 to 18446744073709551615, e.g. --seed "
               "1234";
      return {};
    },
    "0..2^64-1", "seed");

}  // namespace

void add_common(CLI::App* app, CommonFlags& f, bool with_comm) {
  app->add_option("--model", f.model,
                  "preset: deepseek-v3, deepseek-v3.2, deepseek-v2-lite, small, tiny")
      ->capture_default_str();
  app->add_option("--config", f.config_path,
                  "model dimensions from a JSON file (Hugging Face config.json keys); "
                  "overrides --model");
  app->add_option("--seq", f.seq, "global sequence length T")->required();
  app->add_option("--batch", f.batch, "micro-batch B")->capture_default_str();
  app->add_option("--layers", f.layers, "stacked blocks L")->capture_default_str();
  app->add_option("--kernel", f.kernel, "attention kernel: eager, fused")->capture_default_str();
  app->add_option("--absorbed-kv", f.absorbed_kv, "absorbed core regime: expanded, shared")
      ->capture_default_str();
  app->add_option("--dtype", f.dtype, "storage dtype: bf16, fp32")->capture_default_str();
  app->add_option("--dlatent-sum", f.dlatent_sum,
                  "dtype of the dlatent reduce-scatter's partial sums (forms that "
                  "gather the latent): fp32 (one rounding, after the sum over ranks), storage")
      ->capture_default_str();
  app->add_option("--attn-backward", f.attn_backward,
                  "the fused kernel's backward order: two-pass (small workspace), "
                  "one-pass (fewer products, fp32 dq sums held)")
      ->capture_default_str();
  app->add_option("--rope-layout", f.rope_layout, "RoPE pairs: interleaved (DeepSeek), rotate-half")
      ->capture_default_str();
  app->add_option("--overlap", f.overlap,
                  "collectives behind compute (the latent all-gather behind the query path, ...): "
                  "on, off")
      ->capture_default_str();
  app->add_flag("--attention-only", f.attention_only,
                "the attention alone, Hugging Face's self_attn: y = MLA(x), no input RMSNorm "
                "(no attn_norm weight) and no residual (also JSON attention_only)");
  app->add_option("--index-heads", f.index_heads,
                  "the lightning indexer's heads H_I (DeepSeek Sparse Attention; default: the "
                  "model's)");
  app->add_option("--index-dim", f.index_dim, "the indexer's head dim D_I (≥ qk_rope_head_dim)");
  app->add_option("--index-topk", f.index_topk, "keys each query selects, k");
  app->add_option("--indexer-stage", f.indexer_stage,
                  "the sparse forms' training stage: sparse (attention over the top-k, the "
                  "indexer's KL over them), warmup (dense attention, KL over every earlier key); "
                  "default sparse");
  app->add_option("--indexer-loss-scale", f.indexer_loss_scale,
                  "the indexer loss's weight in the differentiated loss (sparse forms; default 1)");
  app->add_option("--cp-layout", f.cp_layout,
                  "the sparse forms' tokens per rank: zigzag (chunks r and 2P−1−r of T/(2P): "
                  "balanced causal work), contiguous; default zigzag");
  app->add_option("--json", f.json_path, "write results as JSON to this file");
  app->add_option("--seed", f.seed, "seed of weights and inputs")
      ->check(kSeed)
      ->capture_default_str();
  if (with_comm) {
    app->add_option("--comm", f.comm,
                    "ranks as: auto (mpi under mpirun, else threads), threads, mpi")
        ->capture_default_str();
    app->add_option("--timeout", f.timeout_s,
                    "seconds a collective may wait before failing (0: no limit)")
        ->capture_default_str();
    app->add_option("--mpi-progress", f.mpi_progress_us, kMpiProgressHelp)->capture_default_str();
    app->add_flag("--check-finite", f.check_finite,
                  "stop (exit 1) at the first NaN or Inf in an input, activation or gradient");
  }
}

std::string link_description(LaunchKind kind) {
  const bool mpi = kind == LaunchKind::mpi;
  std::string link = mpi                         ? "MPI, one process per rank"
                     : kind == LaunchKind::host ? "the host process's group (c10d), one process per rank"
                                                : "in-process threads";
  if (const char* l = std::getenv("LAGA_LINK"); l && *l) link = l;
  if (!mpi) return link;
  const double us = mpi_progress_interval() * 1e6;
  return link + (us > 0 ? fmt::format("; MPI progress from compute every {:g} µs", us)
                        : "; MPI progress only inside MPI calls");
}

Config build_config(const CommonFlags& f) { return Config(build_spec(f)); }

MlaConfig spec_for_all_forms(const CommonFlags& f, FormsAt& at) {
  MlaConfig c = build_spec(f);
  at = forms_at(c);
  return c;
}

void check_ulysses_runs(const std::vector<MlaConfig>& specs) {
  if (specs.empty() || specs.front().ulysses <= 0) return;
  std::string why;
  for (const MlaConfig& spec : specs) {
    const FormsAt at = judge_forms(spec);
    for (const Form* f : registered_forms()) {
      if (!f->takes_ulysses()) continue;
      const std::string reason = at.refusal(*f);
      if (reason.empty()) return;  // runs here
      why += fmt::format("{}{}{}", why.empty() ? "" : "; ",
                         specs.size() > 1 ? fmt::format("at --sp {}: ", spec.sp) : "", reason);
    }
  }
  LAGA_FAIL_USAGE("--ulysses {} sets the head-scatter groups of {}, which cannot run it{}: {}",
                  specs.front().ulysses, ulysses_form_names(),
                  specs.size() > 1 ? " at any --sp given" : "", why);
}

Config config_as(const MlaConfig& spec, std::string_view name) {
  return Config(as_form(spec, name));
}

Config named_form_config(const MlaConfig& spec, const std::string& label, const char* flag) {
  const FormsAt at = forms_at(spec);
  if (const std::string why = at.refusal(find_form(label)); !why.empty()) {
    std::string runnable;
    for (const Form* f : at.runnable)
      runnable += (runnable.empty() ? "" : ", ") + displayed_form(as_form(spec, f->name()));
    LAGA_FAIL_USAGE(
        "{} names {}, which cannot run this configuration: {}; drop it from {} (forms that run it: "
        "{})",
        flag, label, why, flag, runnable);
  }
  return config_as(spec, label);
}

std::string ulysses_note(const MlaConfig& c) {
  return c.hybrid() ? fmt::format(" ({}: {} × {}, --ulysses {})", ulysses_form_names(),
                                  c.head_group(), c.ring_groups(), c.ulysses)
                    : "";
}

MlaConfig build_spec(const CommonFlags& f) {
  MlaConfig c = MlaConfig::preset(f.model);
  if (!f.config_path.empty()) {
    std::ifstream in(f.config_path);
    LAGA_CHECK(in.good(), "--config {}: cannot open ({}); give a readable JSON file", f.config_path,
               std::strerror(errno));
    nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    LAGA_CHECK(!j.is_discarded(), "--config {}: not valid JSON", f.config_path);
    c = MlaConfig::from_json(j);
  }
  c.seq_len = f.seq, c.sp = f.sp, c.batch = f.batch, c.num_layers = f.layers, c.ulysses = f.ulysses;
  if (f.attention_only) c.attention_only = true;  // else the --config file's (default false)
  if (f.index_heads) c.index_n_heads = *f.index_heads;
  if (f.index_dim) c.index_head_dim = *f.index_dim;
  if (f.index_topk) c.index_topk = *f.index_topk;
  if (!f.indexer_stage.empty()) c.indexer_stage = parse_indexer_stage(f.indexer_stage);
  if (f.indexer_loss_scale) c.indexer_loss_scale = *f.indexer_loss_scale;
  if (!f.cp_layout.empty()) c.cp_layout = parse_cp_layout(f.cp_layout);
  c.form = form_label(f.form, f);
  // A query has at most T keys: a larger top-k runs as T (MlaConfig::topk), said once here where
  // the run is a sparse form's.
  static bool said = false;  // once a process, however many configs a command builds
  const Form* form = find_form_or_null(c.form);
  if (form && form->sparse() && c.index_topk > c.seq_len && c.seq_len > 0 &&
      !std::exchange(said, true))
    fmt::print(stderr,
               "note: --index-topk {} exceeds --seq {}: the sparse forms select every earlier key "
               "(top-k runs as {})\n",
               c.index_topk, c.seq_len, c.seq_len);
  c.kernel = parse_kernel(f.kernel);
  c.dtype = parse_dtype(f.dtype);
  c.dlatent_sum = parse_dlatent_sum(f.dlatent_sum);
  c.attn_backward = parse_attn_backward(f.attn_backward);
  if (f.rope_layout == "interleaved")
    c.rope_interleaved = true;
  else if (f.rope_layout == "rotate-half")
    c.rope_interleaved = false;
  else
    LAGA_FAIL_USAGE("unknown --rope-layout '{}'; valid: interleaved, rotate-half", f.rope_layout);
  if (f.overlap == "on")
    c.overlap = true;
  else if (f.overlap == "off")
    c.overlap = false;
  else
    LAGA_FAIL_USAGE("unknown --overlap '{}'; valid: on, off", f.overlap);
  LAGA_CHECK(f.timeout_s >= 0 && std::isfinite(f.timeout_s),
             "--timeout {} must be a number of seconds ≥ 0", f.timeout_s);
  return c;
}

std::string attention_only_note(const MlaConfig& c) {
  return c.attention_only ? " (attention only)" : "";
}

std::string form_label(const std::string& form, const CommonFlags& f) {
  // --absorbed-kv names a regime of the family with variants (absorbed), whatever --form is.
  bool known = false;
  std::string regimes;
  for (const Form* v : registered_forms())
    if (const std::string regime(v->regime()); !regime.empty()) {
      known = known || regime == f.absorbed_kv;
      regimes += (regimes.empty() ? "" : ", ") + regime;
    }
  LAGA_CHECK(known, "unknown absorbed-kv regime '{}'; valid: {}", f.absorbed_kv, regimes);
  RunShape shape;
  shape.sp = f.sp, shape.ulysses = f.ulysses;
  return resolve_form_label(form, f.absorbed_kv, shape);
}

InjectWrong parse_inject_wrong(const std::string& spec, const std::vector<std::string>& forms,
                               const CommonFlags& f) {
  const auto colon = spec.rfind(':');
  std::string list;
  for (const auto& f : forms) list += (list.empty() ? "" : ", ") + f;
  LAGA_CHECK(colon != std::string::npos && colon > 0,
             "--inject-wrong '{}' is not FORM:ULPS (e.g. laga:64)", spec);
  InjectWrong w;
  w.form = form_label(spec.substr(0, colon), f);
  LAGA_CHECK(std::find(forms.begin(), forms.end(), w.form) != forms.end(),
             "--inject-wrong names form '{}', which --forms does not time; valid: {}",
             spec.substr(0, colon), list);
  const std::string ulps = spec.substr(colon + 1);
  char* end = nullptr;
  w.ulps = std::strtod(ulps.c_str(), &end);
  LAGA_CHECK(!ulps.empty() && end && *end == '\0' && std::isfinite(w.ulps) && w.ulps > 0,
             "--inject-wrong '{}': ULPS '{}' must be a positive number (e.g. laga:64)", spec, ulps);
  return w;
}

std::unique_ptr<std::ofstream> open_output(const std::string& path, const char* flag) {
  if (path.empty()) return nullptr;
  auto out = std::make_unique<std::ofstream>(path);
  LAGA_CHECK(out->good(),
             "{} {}: cannot open for writing ({}); give a path in a writable directory", flag, path,
             std::strerror(errno));
  return out;
}

std::string human_bytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(b);
  int u = 0;
  while (std::abs(v) >= 1024 && u < 4) v /= 1024, ++u;
  return fmt::format("{:.2f} {}", v, units[u]);
}

nlohmann::json collectives_json(const std::vector<CollectiveRecord>& records) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& r : records)
    a.push_back({{"op", collective_name(r.op)},
                 {"tensor", r.tensor},
                 {"dtype", dtype_name(r.dtype)},
                 {"seconds", r.seconds},
                 {"wait_s", r.wait_s},                               // exposed
                 {"hidden_s", std::max(0.0, r.seconds - r.wait_s)},  // ran behind compute
                 {"issued_s", r.issued_s},
                 {"completed_s", r.completed_s},
                 {"tensor_bytes", r.tensor_bytes},
                 {"wire_bytes", r.wire_bytes}});
  return a;
}

void check_mem_limit(const PlannedMemory& plan, int64_t ranks, int64_t limit_bytes,
                     const std::string& limit_source) {
  const int64_t per_rank = plan.baseline_bytes + plan.activation_peak_bytes;
  LAGA_CHECK(per_rank * ranks <= limit_bytes,
             "refused: the planned peak is {} ({} bytes: baseline {} + activations {}) per rank × "
             "{} rank(s) here, over "
             "{} of {} ({} bytes); lower --seq or --layers, raise --sp, or set --mem-limit",
             human_bytes(per_rank), per_rank, plan.baseline_bytes, plan.activation_peak_bytes,
             ranks, limit_source, human_bytes(limit_bytes), limit_bytes);
}

int64_t local_ranks() {
  const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  int64_t n = s ? std::atoll(s) : 1;
  return n > 0 ? n : 1;
}

MemLimit mem_limit_of(const std::string& mem_limit, bool ranks_are_processes) {
  if (!mem_limit.empty()) return {parse_bytes(mem_limit), "--mem-limit " + mem_limit};
  return {available_memory_bytes() / (ranks_are_processes ? local_ranks() : 1), "available memory"};
}

nlohmann::json rank_json(const RankResult& r, const PlannedMemory& plan) {
  Ledger attention, sync;
  for (const auto& rec : r.collectives) (is_grad_sync(rec) ? sync : attention).add(rec);
  const auto& m = r.memory;
  nlohmann::json j = {{"rank", r.rank},
                      {"activation_peak_bytes", m.activation_peak_bytes},
                      {"planned_activation_peak_bytes", plan.activation_peak_bytes},
                      {"saved_bytes", m.saved_bytes},
                      {"planned_saved_bytes", plan.saved_bytes},
                      {"forward_peak_bytes", m.forward_peak_bytes},
                      {"backward_peak_bytes", m.backward_peak_bytes},
                      {"baseline_bytes", m.baseline_bytes},
                      {"peak_breakdown", m.peak_breakdown},
                      {"comm",
                       {{"tensor_bytes", attention.tensor_bytes()},
                        {"wire_bytes", attention.wire_bytes()},
                        {"seconds", attention.seconds()},
                        {"wait_s", attention.wait_seconds()},
                        {"hidden_s", std::max(0.0, attention.seconds() - attention.wait_seconds())},
                        {"collectives", collectives_json(attention.records())}}},
                      {"grad_sync",
                       {{"tensor_bytes", sync.tensor_bytes()},
                        {"wire_bytes", sync.wire_bytes()},
                        {"seconds", r.grad_sync_s}}},
                      {"fwd_s", r.forward_s},
                      {"bwd_s", r.backward_s},
                      {"time_s", r.forward_s + r.backward_s}};
  // the sparse forms: the indexer's loss per layer over this rank's queries
  if (!r.indexer_loss.empty()) j["indexer_loss"] = r.indexer_loss;
  return j;
}

std::vector<nlohmann::json> gather_json(Communicator& comm, const nlohmann::json& mine) {
  // Byte strings travel as 4-byte words (all_gather moves bytes, it does no arithmetic).
  std::string s = mine.dump();
  int64_t len = int64_t(s.size());
  std::vector<int64_t> lens(size_t(comm.size()));
  comm.all_gather(&len, lens.data(), 2, DType::f32, "gather.json_length");
  int64_t words = 1;
  for (int64_t l : lens) words = std::max(words, (l + 3) / 4);
  std::vector<char> buf(size_t(words * 4), 0), all(size_t(words * 4 * comm.size()));
  std::memcpy(buf.data(), s.data(), s.size());
  comm.all_gather(buf.data(), all.data(), words, DType::f32, "gather.json");
  std::vector<nlohmann::json> out;
  for (int r = 0; r < comm.size(); ++r)
    out.push_back(
        nlohmann::json::parse(std::string(all.data() + r * words * 4, size_t(lens[size_t(r)]))));
  return out;
}

}  // namespace laga::cli
