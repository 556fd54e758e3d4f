// laga model: the predicted step time of every form on a hardware file (driver/model.hpp,
// docs/model.md), its prediction beside a `laga bench --json` measurement, and --calibrate, which
// writes a hardware file of this machine (driver/calibrate.hpp).
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <map>

#include "cli.hpp"
#include "commands.hpp"
#include "laga/core/error.hpp"
#include "laga/driver/calibrate.hpp"
#include "laga/driver/model.hpp"

namespace laga::cli {

namespace {

nlohmann::json read_json(const std::string& path, const char* what) {
  std::ifstream in(path);
  LAGA_CHECK(in.good(), "{} {}: cannot open ({}); give a readable JSON file", what, path,
             std::strerror(errno));
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  LAGA_CHECK(!j.is_discarded(), "{} {}: not valid JSON", what, path);
  return j;
}

// The link fitted to a `laga bench-comm --json` file (--comm-json), and in *P the ranks it ran on.
LinkSpec comm_json_link(const std::string& path, int64_t* P) {
  return link_from_bench_comm(read_json(path, "--comm-json"), path, P);
}

// A rate as the file gives it: one number, or "x at T 2048, y at T 8192".
std::string rate_text(const SeqRate& r) {
  std::string s;
  for (const auto& [T, x] : r.by_seq)
    s += T == 0 ? fmt::format("{:.4g}", x)
                : fmt::format("{}{:.4g} at T {}", s.empty() ? "" : ", ", x, T);
  return r.by_seq.size() > 1 ? "(" + s + ")" : s;
}

std::string rates_line(const HardwareSpec& hw, DType dt) {
  const ComputeSpec& c = hw.compute_for(dt);
  std::string s = fmt::format(
      "matmul {} TFLOP/s, attention fwd {} / bwd {} TFLOP/s, elementwise {} GB/s",
      rate_text(c.matmul_tflops), rate_text(c.attention_tflops.at("attention_fwd_tflops")),
      rate_text(c.attention_tflops.at("attention_bwd_tflops")), rate_text(c.elementwise_GBps));
  s +=
      c.accumulate_GBps
          ? fmt::format(", accumulate {} GB/s", rate_text(*c.accumulate_GBps))
          : std::string(", accumulate at the elementwise rate (the file gives no accumulate_GBps)");
  auto link = [](const LinkSpec& l) {
    std::string b;
    for (const auto& [op, v] : l.busbw_GBps)
      b += fmt::format("{}{} {:.4g}", b.empty() ? "" : ", ", collective_name(op), v);
    std::string h;
    for (const auto& [op, v] : l.host_ns_per_byte)
      h += fmt::format("{}{} {:.3g}", h.empty() ? "" : ", ", collective_name(op), v);
    return fmt::format(
        "busbw GB/s {}; latency {:.3g} us; {}", b, l.latency_s * 1e6,
        h.empty() ? std::string("no host cost of hidden bytes (the link gives no host_ns_per_byte)")
                  : "host cost of hidden bytes, ns per byte sent: " + h);
  };
  s +=
      fmt::format("\n# intra-node ({} ranks per node): {}", hw.ranks_per_node, link(hw.intra_node));
  if (hw.inter_node) s += fmt::format("\n# inter-node: {}", link(*hw.inter_node));
  return s;
}

int calibrate(const CommonFlags& f, const ModelFlags& m) {
  auto out = open_output(m.calibrate_out, "--calibrate");
  auto json_out = open_output(f.json_path, "--json");
  CalibrationOptions opt;
  opt.sp = f.sp;
  if (!m.calibrate_seqs.empty()) opt.seqs = m.calibrate_seqs;
  if (m.calibrate_reps > 0) opt.reps = m.calibrate_reps;
  opt.link = m.comm_json.empty();
  LAGA_CHECK(!opt.link || f.sp >= 2,
             "--calibrate measures the threads link between --sp ranks: give --sp 2 or more, "
             "or --comm-json FILE from laga bench-comm --json");
  LinkSpec from_file;
  if (!opt.link) {
    int64_t P = 0;
    from_file = comm_json_link(m.comm_json, &P);
    LAGA_CHECK(P == f.sp || f.sp == 1,
               "--comm-json {} was measured at sp {}, but --sp is {}; give --sp {}", m.comm_json, P,
               f.sp, P);
    opt.sp = P;
  }
  opt.progress = [&](const std::string& s) { fmt::print("  {}\n", s), std::fflush(stdout); };
  fmt::print("laga model --calibrate: P {} ranks as threads, laga's kernels, both dtypes\n",
             opt.sp);
  HardwareSpec hw = calibrate_machine(opt);
  if (!opt.link) {
    hw.intra_node = from_file;
    hw.notes["link"] = {{"how", "latency + bytes / busbw least squares per op on time_s vs bytes"},
                        {"bench_comm", m.comm_json},
                        {"busbw_GBps", hw.to_json()["link"]["intra_node"]["busbw_GBps"]}};
    hw.source += fmt::format("; link fitted to {}", m.comm_json);
  }
  *out << hw.to_json().dump(2) << "\n";
  fmt::print("wrote {}\n# {}\n", m.calibrate_out, rates_line(hw, DType::bf16));
  if (json_out)
    *json_out << nlohmann::json{{"command", "model --calibrate"}, {"hardware", hw.to_json()}}.dump(
                     2)
              << "\n";
  return 0;
}

// The predicted times of every form; the table of totals, then the per-phase table.
nlohmann::json predict_all(const CommonFlags& f, const ModelFlags& m, const HardwareSpec& hw) {
  // Every form by default, by the rule of the commands that run every form (forms_at): one that
  // refuses the config is listed as not run. Forms named with --forms must all run it.
  FormsAt at;
  const MlaConfig b = spec_for_all_forms(f, at);
  // Every runnable form as as_form gives it; a named one as given (--ulysses included: Config
  // refuses it for a form that takes none).
  std::vector<FormPrediction> preds;
  if (m.forms.empty())
    for (const Form* fm : at.runnable) preds.push_back(predict(config_as(b, fm->name()), hw));
  else
    for (const auto& name : m.forms) {
      MlaConfig named = b;
      named.form = form_label(name, f);
      preds.push_back(predict(Config(std::move(named)), hw));
    }
  fmt::print(
      "laga model: model {}{} T {} B {} P {}{} L {} kernel {} dtype {} on '{}' ({}) — per rank, "
      "one step (forward + backward, no grad sync), overlap {}\n",
      b.model, attention_only_note(b), b.seq_len, b.batch, b.sp, ulysses_note(b), b.num_layers,
      kernel_name(b.kernel), dtype_name(b.dtype), hw.name, hw.path, b.overlap ? "on" : "off");
  fmt::print("# {}\n", rates_line(hw, b.dtype));
  if (b.sp > hw.ranks_per_node)
    fmt::print(
        "# P {} > ranks_per_node {}: the job spans {} nodes; a collective crosses them where its "
        "group does\n",
        b.sp, hw.ranks_per_node, (b.sp + hw.ranks_per_node - 1) / hw.ranks_per_node);
  fmt::print("# {:<18} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>9}\n", "form", "fwd", "bwd",
             "comm", "total", "compute", "comm share", "vs expl.");
  fmt::print("# {:<18} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>9}\n", "", "s", "s", "s (exp.)",
             "s", "s", "%", "×");
  double explicit_total = 0;
  for (const auto& p : preds)
    if (p.form == kBaselineForm) explicit_total = p.total_s();
  size_t best = 0;
  nlohmann::json forms;
  for (size_t i = 0; i < preds.size(); ++i) {
    const FormPrediction& p = preds[i];
    if (p.total_s() < preds[best].total_s()) best = i;
    const std::string ratio =
        explicit_total > 0 ? fmt::format("{:.3f}", explicit_total / p.total_s()) : "-";
    fmt::print("  {:<18} {:>11.5g} {:>11.5g} {:>11.5g} {:>11.5g} {:>11.5g} {:>11.1f} {:>9}\n",
               p.form, p.fwd_s(), p.bwd_s(), p.comm_s(), p.total_s(),
               p.fwd_compute_s + p.bwd_compute_s, 100 * p.comm_s() / p.total_s(), ratio);
    forms[p.form] = p.to_json();
    if (explicit_total > 0) forms[p.form]["speedup_vs_explicit"] = explicit_total / p.total_s();
  }
  for (const auto& r : at.refused) {
    fmt::print("  {:<18} not run: {}\n", r.form->name(), r.reason);
    forms[std::string(r.form->name())] = {{"not_run", r.reason}};
  }
  fmt::print("winner: {} ({:.5g} s{})\n", preds[best].form, preds[best].total_s(),
             explicit_total > 0
                 ? fmt::format(", {:.3f}× explicit", explicit_total / preds[best].total_s())
                 : "");
  // Per pass, op class and collective: rows, a column per form, the slowest rank's seconds. A row
  // one form alone has goes after that form's previous row, so every form's rows keep their order.
  std::vector<std::string> rows;
  std::map<std::string, std::map<std::string, double>> cell;
  for (const auto& p : preds) {
    std::vector<std::pair<std::string, double>> mine;
    for (int b : {0, 1}) {
      const char* pass = b ? "bwd" : "fwd";
      for (const auto& [k, t] : p.by_class[b])
        mine.emplace_back(fmt::format("{} {}", pass, work_class_name(k)), t.seconds);
      for (const auto& c : p.collectives)
        if (c.backward == bool(b))
          mine.emplace_back(
              fmt::format("{} {} {}", pass, collective_name(c.record.op), c.record.tensor),
              c.exposed_s);
    }
    size_t at = 0;
    for (const auto& [row, sec] : mine) {
      auto it = std::find(rows.begin(), rows.end(), row);
      if (it == rows.end())
        it = rows.insert(rows.begin() + std::ptrdiff_t(std::min(at, rows.size())), row);
      at = size_t(it - rows.begin()) + 1;
      cell[row][p.form] += sec;
    }
  }
  fmt::print(
      "# per op class and collective, the slowest rank's seconds (all layers; collectives: "
      "exposed time)\n# {:<36}",
      "class or collective");
  for (const auto& p : preds) fmt::print(" {:>18}", p.form);
  fmt::print("\n");
  for (const auto& r : rows) {
    fmt::print("  {:<36}", r);
    for (const auto& p : preds) {
      auto it = cell[r].find(p.form);
      if (it == cell[r].end())
        fmt::print(" {:>18}", "-");
      else
        fmt::print(" {:>18.4g}", it->second);
    }
    fmt::print("\n");
  }
  return {{"config", b.to_json()}, {"forms", forms}, {"winner", preds[best].form}};
}

nlohmann::json compare(const CommonFlags& f, const ModelFlags& m, const HardwareSpec& hw) {
  const nlohmann::json bench = read_json(m.bench_json, "--bench-json");
  const auto rows = compare_with_bench(bench, m.bench_json, hw);
  // Each row is predicted as bench ran it (its own --ulysses); a --ulysses given here must be the
  // one the rows of laga-ulysses ran with, or the comparison would not be of the configuration
  // asked for.
  if (f.ulysses > 0) {
    bool any = false;
    for (const auto& r : rows) {
      const Form* form = find_form_or_null(r.variant);
      if (!form || !form->takes_ulysses()) continue;
      any = true;
      LAGA_CHECK(r.ulysses == f.ulysses,
                 "--ulysses {}, but bench file {} ran {} at T {} P {} with --ulysses {}; give "
                 "--ulysses {} (or leave it out: each row is predicted as it ran)",
                 f.ulysses, m.bench_json, r.variant, r.seq, r.sp, r.ulysses, r.ulysses);
    }
    LAGA_CHECK(any, "--ulysses {} is {}'s, but bench file {} has no row of it; leave --ulysses out",
               f.ulysses, ulysses_form_names(), m.bench_json);
  }
  fmt::print("laga model --bench-json {}: predicted against measured on '{}' ({})\n", m.bench_json,
             hw.name, hw.path);
  // The ranks' skew (bench's comm_skew_s), where the file has it: of the measured comm, the time
  // ranks waited for each other; "w/o skew" is the model's error against the total less it (not the
  // figure the model is judged by: it says how much of a miss is time the host took from one rank).
  bool any_skew = false;
  for (const auto& r : rows) any_skew = any_skew || r.measured_skew.has_value();
  fmt::print("# {:>6} {:>3} {:<18} {:>9} {:>9} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}{}\n",
             "seq", "P", "form", "total", "model", "error", "fwd", "model", "bwd", "model", "comm",
             "model", any_skew ? fmt::format(" {:>9} {:>8}", "skew", "w/o skew") : "");
  fmt::print("# {:>6} {:>3} {:<18} {:>9} {:>9} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}{}\n", "",
             "", "", "s", "s", "%", "s", "s", "s", "s", "s", "s",
             any_skew ? fmt::format(" {:>9} {:>8}", "s", "%") : "");
  nlohmann::json out = nlohmann::json::array();
  double max_err = 0, sum_err = 0, max_err_ns = 0, sum_err_ns = 0;
  int64_t n_ns = 0;
  for (const auto& r : rows) {
    const FormPrediction& p = r.predicted;
    const double e = r.rel_error_total();
    const std::optional<double> ens = r.rel_error_without_skew();
    max_err = std::max(max_err, std::abs(e)), sum_err += std::abs(e);
    if (ens)
      max_err_ns = std::max(max_err_ns, std::abs(*ens)), sum_err_ns += std::abs(*ens), ++n_ns;
    fmt::print(
        "  {:>6} {:>3} {:<18} {:>9.4f} {:>9.4f} {:>+7.1f} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} "
        "{:>9.4f} {:>9.4f}{}\n",
        r.seq, r.sp, r.form, r.measured_total, p.total_s(), 100 * e, r.measured_fwd, p.fwd_s(),
        r.measured_bwd, p.bwd_s(), r.measured_comm, p.comm_s(),
        !any_skew ? std::string()
        : ens     ? fmt::format(" {:>9.4f} {:>+8.1f}", *r.measured_skew, 100 * *ens)
                  : fmt::format(" {:>9} {:>8}", "-", "-"));
    nlohmann::json measured = {{"fwd_s", r.measured_fwd},
                               {"bwd_s", r.measured_bwd},
                               {"comm_s", r.measured_comm},
                               {"total_s", r.measured_total}};
    if (r.measured_skew) measured["comm_skew_s"] = *r.measured_skew;
    out.push_back({{"form", r.form},
                   {"variant", r.variant},
                   {"ulysses", r.ulysses},
                   {"seq", r.seq},
                   {"sp", r.sp},
                   {"measured", measured},
                   {"predicted",
                    {{"fwd_s", p.fwd_s()},
                     {"bwd_s", p.bwd_s()},
                     {"comm_s", p.comm_s()},
                     {"total_s", p.total_s()}}},
                   {"rel_error_total", e}});
    if (ens) out.back()["rel_error_without_skew"] = *ens;
  }
  const double mean_err = rows.empty() ? 0 : sum_err / double(rows.size());
  fmt::print("error of the total: max {:.1f} %, mean {:.1f} % over {} rows\n", 100 * max_err,
             100 * mean_err, rows.size());
  if (n_ns > 0)
    fmt::print(
        "error against the total less the ranks' skew (time the host took from one rank; not the "
        "judged "
        "figure): max {:.1f} %, mean {:.1f} % over {} rows\n",
        100 * max_err_ns, 100 * sum_err_ns / double(n_ns), n_ns);
  // By op class, where the bench file has the rows' profiles: which class the error comes from.
  const char* classes[] = {"matmul", "attention_fwd", "attention_bwd", "other"};
  bool any_profile = false;
  for (const auto& r : rows) any_profile = any_profile || !r.measured_by_class.empty();
  if (any_profile) {
    fmt::print(
        "# by op class (bench --profile: the slowest rank's seconds per class; other = the rest "
        "beside exposed "
        "comm, against the model's elementwise and accumulate streams): measured / model, error "
        "%\n");
    fmt::print("# {:>6} {:>3} {:<18}", "seq", "P", "form");
    for (const char* k : classes) fmt::print(" {:>25}", k);
    fmt::print("\n");
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      if (r.measured_by_class.empty()) continue;
      const auto model = r.predicted_by_class();
      fmt::print("  {:>6} {:>3} {:<18}", r.seq, r.sp, r.form);
      nlohmann::json cls = nlohmann::json::object();
      for (const char* k : classes) {
        const double got = r.measured_by_class.at(k), want = model.at(k);
        fmt::print(" {:>8.4f} / {:>7.4f} {:>+6.0f}", got, want,
                   got > 0 ? 100 * (want - got) / got : 0.0);
        cls[k] = {{"measured_s", got}, {"predicted_s", want}};
      }
      fmt::print("\n");
      out[i]["by_class"] = cls;
    }
  }
  nlohmann::json result = {{"bench_json", m.bench_json},
                           {"rows", out},
                           {"max_abs_rel_error", max_err},
                           {"mean_abs_rel_error", mean_err}};
  if (n_ns > 0)
    result["without_skew"] = {{"rows", n_ns},
                              {"max_abs_rel_error", max_err_ns},
                              {"mean_abs_rel_error", sum_err_ns / double(n_ns)}};
  return result;
}

}  // namespace

// hw with every link bandwidth multiplied by s (latencies unchanged).
HardwareSpec scale_links(HardwareSpec hw, double s) {
  if (s == 1) return hw;
  for (auto& [op, bw] : hw.intra_node.busbw_GBps) bw *= s;
  if (hw.inter_node)
    for (auto& [op, bw] : hw.inter_node->busbw_GBps) bw *= s;
  hw.source += fmt::format("; link bandwidths × {:g} (--link-scale)", s);
  return hw;
}

// --grid: every runnable form (forms_at), a form that takes --ulysses (laga-ulysses) with every Pu
// that runs, predicted per cell; the winner, and its margin over the runner-up and over explicit
// where explicit runs.
nlohmann::json grid(const CommonFlags& f, const ModelFlags& m, const HardwareSpec& base_hw) {
  const std::vector<double> scales =
      m.link_scale.empty() ? std::vector<double>{0.25, 1, 4} : m.link_scale;
  LAGA_CHECK(base_hw.inter_node || base_hw.ranks_per_node >= 64,
             "--grid reaches P 64, beyond the {} ranks per node of hardware file {}, which has no "
             "link.inter_node; "
             "give a file with one (docs/hw/h100-class.json, docs/model.md §2)",
             base_hw.ranks_per_node, base_hw.path);
  fmt::print(
      "laga model --grid on '{}' ({}): B {} L {} kernel {} dtype {} — per rank, one step, no "
      "overlap\n",
      base_hw.name, base_hw.path, f.batch, f.layers, f.kernel, f.dtype);
  fmt::print("# {:>6} {:<17} {:>4} {:>6} {:>3}  {:<18} {:>11} {:>9}  {:<18} {:>9}\n", "link×",
             "model", "H", "T", "P", "winner", "step s", "×expl.", "runner-up", "margin");
  // Each cell planned once (its forms' plans of every rank) and predicted at every link scale;
  // printed and listed scale by scale.
  std::vector<std::string> lines(scales.size());
  std::vector<nlohmann::json> by_scale(scales.size(), nlohmann::json::array());
  // DeepSeek-V3.2's cells race the sparse forms alone: they train another function (the
  // attention over each query's top-k) than the dense forms.
  for (const char* model : {"deepseek-v2-lite", "deepseek-v3", "deepseek-v3.2"})
    for (int64_t T : {4096, 16384, 65536})
      for (int64_t P : {8, 16, 32, 64}) {
        CommonFlags g = f;
        g.model = model, g.seq = T, g.sp = P, g.form = std::string(kBaselineForm);
        const bool sparse_model = std::string_view(model) == "deepseek-v3.2";
        FormsAt at;
        const MlaConfig base = spec_for_all_forms(g, at);
        std::vector<MlaConfig> candidates;
        for (const Form* fm : at.runnable) {
          if (fm->sparse() != sparse_model) continue;
          if (!fm->takes_ulysses()) {
            candidates.push_back(as_form(base, fm->name()));
            continue;
          }
          // head-scatter groups of every Pu < P that runs (a ring over the P/Pu groups)
          for (int64_t Pu = 1; Pu < P; ++Pu) {
            MlaConfig h = as_form(base, fm->name());
            h.ulysses = Pu;
            if (h.problems().empty()) candidates.push_back(h);
          }
        }
        std::vector<Config> configs;
        std::vector<RankPlans> plans;
        nlohmann::json peaks, refused = nlohmann::json::object();
        for (const MlaConfig& c : candidates) {
          const Config& cfg = configs.emplace_back(c);
          plans.push_back(plan_ranks(cfg));
          if (sparse_model) peaks[displayed_form(c)] = plan_memory(cfg).activation_peak_bytes;
        }
        for (const auto& r : at.refused) refused[std::string(r.form->name())] = r.reason;
        for (size_t i = 0; i < scales.size(); ++i) {
          const HardwareSpec hw = scale_links(base_hw, scales[i]);
          std::vector<std::pair<double, std::string>> t;
          nlohmann::json times;
          for (size_t k = 0; k < configs.size(); ++k) {
            const FormPrediction p = predict(configs[k], hw, plans[k]);
            t.emplace_back(p.total_s(), p.form);
            times[p.form] = p.total_s();
          }
          std::sort(t.begin(), t.end());
          const double ex =
              times.contains(kBaselineForm) ? times[std::string(kBaselineForm)].get<double>() : 0;
          const std::string vs = ex > 0 ? fmt::format("{:.3f}", ex / t[0].first) : "-";
          const std::string second = t.size() > 1 ? t[1].second : "-";
          const std::string margin =
              t.size() > 1 ? fmt::format("{:.3f}×", t[1].first / t[0].first) : "-";
          lines[i] += fmt::format(
              "  {:>6g} {:<17} {:>4} {:>6} {:>3}  {:<18} {:>11.5g} {:>9}  {:<18} {:>9}\n",
              scales[i], model, base.num_attention_heads, T, P, t[0].second, t[0].first, vs, second,
              margin);
          nlohmann::json row = {{"link_scale", scales[i]},
                                {"model", model},
                                {"heads", base.num_attention_heads},
                                {"seq", T},
                                {"sp", P},
                                {"winner", t[0].second},
                                {"winner_s", t[0].first},
                                {"times_s", times},
                                {"not_run", refused}};
          if (sparse_model) row["activation_peak_bytes"] = peaks;
          by_scale[i].push_back(std::move(row));
        }
      }
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < scales.size(); ++i) {
    fmt::print("{}", lines[i]);
    for (auto& row : by_scale[i]) rows.push_back(std::move(row));
  }
  fmt::print(
      "# link×: the hardware file's link bandwidths multiplied by this; margin: runner-up's step "
      "time over the "
      "winner's; ×expl.: explicit's over the winner's (- where explicit cannot run: P ∤ H); "
      "deepseek-v3.2: the sparse forms alone\n");
  return {{"grid", rows}};
}

int cmd_model(const CommonFlags& f, const ModelFlags& m) {
  if (!m.published.empty()) return cmd_model_published(m.published, f.json_path);
  if (!m.calibrate_out.empty()) return calibrate(f, m);
  HardwareSpec file_hw = HardwareSpec::load(m.hw);
  // this file's compute with a link measured apart (e.g. across link.sh's namespaces)
  if (!m.comm_json.empty()) {
    int64_t P = 0;
    file_hw.intra_node = comm_json_link(m.comm_json, &P);
    LAGA_CHECK(P <= file_hw.ranks_per_node,
               "--comm-json {} was measured at sp {}, more than the {} ranks per node of --hw {}",
               m.comm_json, P, file_hw.ranks_per_node, m.hw);
    file_hw.source += fmt::format("; intra-node link fitted to {}", m.comm_json);
  }
  auto json_out = open_output(f.json_path, "--json");
  if (m.grid) {
    nlohmann::json j = {
        {"command", "model --grid"}, {"hardware", file_hw.to_json()}, {"hw_file", m.hw}};
    j.update(grid(f, m, file_hw));
    if (json_out) *json_out << j.dump(2) << "\n";
    return 0;
  }
  const HardwareSpec hw = scale_links(file_hw, m.link_scale.empty() ? 1.0 : m.link_scale.front());
  nlohmann::json j = {{"command", "model"}, {"hardware", hw.to_json()}, {"hw_file", m.hw}};
  if (f.seq > 0) j.update(predict_all(f, m, hw));
  if (!m.bench_json.empty()) j["comparison"] = compare(f, m, hw);
  if (json_out) *json_out << j.dump(2) << "\n";
  return 0;
}

}  // namespace laga::cli
