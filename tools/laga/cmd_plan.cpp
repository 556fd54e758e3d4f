// laga plan: per-rank memory and communication of every form from the configuration alone (the
// planner, include/laga/driver/plan.hpp), and with --sweep the tables of docs/design.md §5: memory
// ratios over T × P × kernel, communication ratios over H in both byte conventions, and
// least-squares fits showing absorbed's excess over explicit growing linearly in T and in H.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <set>

#include "cli.hpp"
#include "commands.hpp"
#include "laga/core/bytes.hpp"
#include "laga/core/error.hpp"
#include "laga/driver/model.hpp"
#include "laga/driver/plan.hpp"

namespace laga::cli {

namespace {

// The config with another registered form (as_form).
Config with(const Config& c, std::string_view form) {
  return c.with([&](MlaConfig& m) { m = as_form(m, form); });
}

// The planned work by pass, class and op (core/work.hpp): FLOPs or bytes and calls, and how many
// events the timeline holds (ops, issues and waits).
nlohmann::json work_json(const WorkLedger& w) {
  nlohmann::json j = nlohmann::json::object();
  for (size_t i = 0; i < w.records.size(); ++i) {
    const WorkRecord& r = w.records[i];
    nlohmann::json& e =
        j[i < w.backward_records ? "forward" : "backward"][work_class_name(r.cls)][r.op];
    const char* unit = by_bytes(r.cls) ? "bytes" : "flops";
    if (e.is_null()) e = {{"calls", 0}, {unit, 0.0}};
    e["calls"] = e["calls"].get<int64_t>() + 1;
    e[unit] = e[unit].get<double>() + r.work();
  }
  j["timeline_events"] = w.timeline.size();
  return j;
}

nlohmann::json plan_json(const Config& c) {
  const Plan plan = plan_run(c);
  const PlannedMemory& m = plan.memory;
  const PlannedComm& k = plan.comm;
  int64_t sync_tensor = 0, sync_wire = 0;
  for (const auto& r : k.grad_sync) sync_tensor += r.tensor_bytes, sync_wire += r.wire_bytes;
  // The kernel the form runs: its own (Form::own_kernel), else the config's.
  const std::string_view own = form_of(*c).own_kernel();
  return {{"ulysses", form_of(*c).takes_ulysses() ? c->ulysses : 0},
          {"attention_kernel", std::string(own.empty() ? kernel_name(c->kernel) : own)},
          {"activation_peak_bytes", m.activation_peak_bytes},
          {"saved_bytes", m.saved_bytes},
          {"forward_peak_bytes", m.forward_peak_bytes},
          {"backward_peak_bytes", m.backward_peak_bytes},
          {"baseline_bytes", m.baseline_bytes},
          {"peak_breakdown", m.peak_breakdown},
          {"saved_breakdown", m.saved_breakdown},
          {"comm",
           {{"tensor_bytes", k.tensor_bytes()},
            {"wire_bytes", k.wire_bytes()},
            {"collectives", collectives_json(k.attention)}}},
          {"grad_sync", {{"tensor_bytes", sync_tensor}, {"wire_bytes", sync_wire}}},
          {"work", work_json(plan.work)}};
}

// Least squares y = a + b·x; returns {a, b, max |residual| / max |y|}.
std::array<double, 3> fit(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = double(x.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0, ymax = 0;
  for (size_t i = 0; i < x.size(); ++i)
    sx += x[i], sy += y[i], sxx += x[i] * x[i], sxy += x[i] * y[i];
  const double b = (n * sxy - sx * sy) / (n * sxx - sx * sx), a = (sy - b * sx) / n;
  double r = 0;
  for (size_t i = 0; i < x.size(); ++i)
    r = std::max(r, std::abs(a + b * x[i] - y[i])), ymax = std::max(ymax, std::abs(y[i]));
  return {a, b, r / ymax};
}

int sweep(const Config& base_cfg, std::ofstream* json_out) {
  const MlaConfig& base = *base_cfg;
  nlohmann::json memory = nlohmann::json::array(), comm = nlohmann::json::array(),
                 fits = nlohmann::json::array();
  fmt::print(
      "laga plan --sweep: model {} B {} L {} dtype {} — per rank, bytes; every form's activation "
      "peak and its "
      "ratio to explicit's\n",
      base.model, base.batch, base.num_layers, dtype_name(base.dtype));
  std::string header = fmt::format("# {:>6} {:>3} {:<6}", "T", "P", "kernel");
  for (const Form* f : registered_forms())
    header += fmt::format(" {:>18} {:>7}", f->name(), "/expl.");
  fmt::print("{}\n", header);
  for (Kernel kernel : {Kernel::eager, Kernel::fused})
    for (int64_t T : {4096, 8192, 16384})
      for (int64_t P : {4, 8, 16}) {
        MlaConfig m = base;
        m.seq_len = T, m.sp = P, m.kernel = kernel;
        // a cell where every form runs
        if (!m.problems().empty() || !judge_forms(m).refused.empty()) continue;
        const Config c(m);
        std::map<std::string, int64_t> peak;
        for (const Form* f : registered_forms())
          peak[std::string(f->name())] = plan_memory(with(c, f->name())).activation_peak_bytes;
        std::string line = fmt::format("  {:>6} {:>3} {:<6}", T, P, kernel_name(kernel));
        nlohmann::json ratios, excess;
        for (const Form* f : registered_forms()) {
          const std::string k(f->name());
          const double ratio = double(peak[k]) / double(peak[std::string(kBaselineForm)]);
          line += fmt::format(" {:>18} {:>7.4f}", peak[k], ratio);
          ratios[k] = ratio;
          excess[k] = peak[k] - peak[std::string(kBaselineForm)];
        }
        fmt::print("{}\n", line);
        memory.push_back({{"seq", T},
                          {"sp", P},
                          {"kernel", kernel_name(kernel)},
                          {"activation_peak_bytes", peak},
                          {"over_explicit", ratios},
                          {"excess_over_explicit_bytes", excess}});
      }
  fmt::print("# communication per rank per step (forward + backward), T 4096, P 8\n");
  fmt::print("# {:>4} {:>16} {:>16} {:>12} {:>16} {:>16} {:>12}\n", "H", "explicit tensor",
             "laga tensor", "ratio", "explicit wire", "laga wire", "ratio");
  for (int64_t H : {16, 32, 64, 128}) {
    const Config c =
        base_cfg.with([&](MlaConfig& m) { m.seq_len = 4096, m.sp = 8, m.num_attention_heads = H; });
    PlannedComm e = plan_comm(with(c, "explicit")), l = plan_comm(with(c, "laga"));
    double rt = double(e.tensor_bytes()) / double(l.tensor_bytes()),
           rw = double(e.wire_bytes()) / double(l.wire_bytes());
    fmt::print("  {:>4} {:>16} {:>16} {:>12.4f} {:>16} {:>16} {:>12.4f}\n", H, e.tensor_bytes(),
               l.tensor_bytes(), rt, e.wire_bytes(), l.wire_bytes(), rw);
    comm.push_back({{"heads", H},
                    {"explicit_tensor_bytes", e.tensor_bytes()},
                    {"laga_tensor_bytes", l.tensor_bytes()},
                    {"tensor_ratio", rt},
                    {"explicit_wire_bytes", e.wire_bytes()},
                    {"laga_wire_bytes", l.wire_bytes()},
                    {"wire_ratio", rw}});
  }
  fmt::print(
      "# absorbed-expanded's excess activation peak over explicit: least-squares line, max "
      "residual / max excess\n");
  for (Kernel kernel : {Kernel::eager, Kernel::fused}) {
    std::vector<double> xs, ys;
    for (int64_t T : {2048, 4096, 8192, 16384}) {
      const Config c =
          base_cfg.with([&](MlaConfig& m) { m.seq_len = T, m.sp = 8, m.kernel = kernel; });
      xs.push_back(double(T));
      ys.push_back(double(plan_memory(with(c, "absorbed-expanded")).activation_peak_bytes -
                          plan_memory(with(c, "explicit")).activation_peak_bytes));
    }
    auto [a, b, r] = fit(xs, ys);
    fmt::print("  {:<6} in T (P 8, H {}): excess = {:.4g} + {:.6g}·T bytes, max residual {:.2e}\n",
               kernel_name(kernel), base.num_attention_heads, a, b, r);
    fits.push_back({{"kernel", kernel_name(kernel)},
                    {"variable", "seq"},
                    {"intercept", a},
                    {"slope", b},
                    {"max_rel_residual", r},
                    {"x", xs},
                    {"excess_bytes", ys}});
    xs.clear(), ys.clear();
    for (int64_t H : {16, 32, 64, 128}) {
      const Config c = base_cfg.with([&](MlaConfig& m) {
        m.seq_len = 4096, m.sp = 8, m.num_attention_heads = H, m.kernel = kernel;
      });
      xs.push_back(double(H));
      ys.push_back(double(plan_memory(with(c, "absorbed-expanded")).activation_peak_bytes -
                          plan_memory(with(c, "explicit")).activation_peak_bytes));
    }
    auto [a2, b2, r2] = fit(xs, ys);
    fmt::print(
        "  {:<6} in H (P 8, T 4096): excess = {:.4g} + {:.6g}·H bytes, max residual {:.2e}\n",
        kernel_name(kernel), a2, b2, r2);
    fits.push_back({{"kernel", kernel_name(kernel)},
                    {"variable", "heads"},
                    {"intercept", a2},
                    {"slope", b2},
                    {"max_rel_residual", r2},
                    {"x", xs},
                    {"excess_bytes", ys}});
  }
  if (json_out) {
    nlohmann::json j = {{"command", "plan --sweep"},
                        {"config", base.to_json()},
                        {"memory", memory},
                        {"communication", comm},
                        {"fits", fits}};
    *json_out << j.dump(2) << "\n";
  }
  return 0;
}

// The per-form table of plan: its two header lines and a form's row of plan_json.
void print_table_header() {
  fmt::print("# {:<18} {:>16} {:>16} {:>16} {:>16} {:>16} {:>16}\n", "form", "activation peak",
             "saved", "fwd peak", "bwd peak", "comm tensor", "comm wire");
  fmt::print("# {:<18} {:>16} {:>16} {:>16} {:>16} {:>16} {:>16}\n", "", "bytes", "bytes", "bytes",
             "bytes", "bytes", "bytes");
}
void print_table_row(std::string_view label, const nlohmann::json& j) {
  fmt::print("  {:<18} {:>16} {:>16} {:>16} {:>16} {:>16} {:>16}\n", label,
             j["activation_peak_bytes"].get<int64_t>(), j["saved_bytes"].get<int64_t>(),
             j["forward_peak_bytes"].get<int64_t>(), j["backward_peak_bytes"].get<int64_t>(),
             j["comm"]["tensor_bytes"].get<int64_t>(), j["comm"]["wire_bytes"].get<int64_t>());
}

// Where a sparse form runs: what each tensor holds, saved for backward and at the activation
// peak, per rank, the sparse forms beside the dense ones that run (docs/sparse.md's memory
// analysis, measured by the planner).
void print_sparse_tensors(const FormsAt& at, const nlohmann::json& forms,
                          const std::function<std::string(std::string_view)>& shown) {
  std::vector<std::string> cols;
  bool any_sparse = false;
  for (const Form* fm : at.runnable) {
    any_sparse = any_sparse || fm->sparse();
    if (fm->sparse() || fm->name() == kBaselineForm || fm->name() == "absorbed-shared" ||
        fm->name() == "laga")
      cols.emplace_back(fm->name());
  }
  if (!any_sparse) return;
  for (const char* what : {"saved_breakdown", "peak_breakdown"}) {
    std::set<std::string> tags;
    for (const auto& c : cols)
      for (const auto& [tag, bytes] : forms[c][what].items()) tags.insert(tag);
    fmt::print("# {} per tensor, bytes per rank ({})\n",
               what == std::string("saved_breakdown") ? "saved for backward"
                                                      : "held at the activation peak",
               "0: not held");
    std::string header = fmt::format("# {:<24}", "tensor");
    for (const auto& c : cols) header += fmt::format(" {:>16}", shown(c).substr(0, 16));
    fmt::print("{}\n", header);
    for (const auto& tag : tags) {
      std::string line = fmt::format("  {:<24}", tag);
      for (const auto& c : cols)
        line += fmt::format(" {:>16}", forms[c][what].value(tag, int64_t(0)));
      fmt::print("{}\n", line);
    }
  }
}

// The sparse forms' work per rank from each rank's plan (the work ledger), in both layouts: the
// indexer's scores (top-k and loss), the sparse attention, and the rest (projections, norms, ...),
// GFLOP of a step. Every rank where P ≤ 8; the extremes beyond. A rank's causal work grows with the
// positions of its queries: contiguous, rank P−1's score every key and rank 0's N of them; zigzag
// pairs chunk r with chunk 2P−1−r, so every rank's add up alike. Returns the JSON of the table.
nlohmann::json print_sparse_balance(const MlaConfig& base, const FormsAt& at) {
  const Form* sparse = nullptr;
  for (const Form* fm : at.runnable)
    if (fm->sparse() && !sparse) sparse = fm;
  if (!sparse || base.sp < 2) return nullptr;
  nlohmann::json out = {{"form", std::string(sparse->name())}};
  fmt::print(
      "# {} work per rank, GFLOP of a step: the indexer's scores (top-k and loss), the sparse "
      "attention, the rest; imbalance = slowest rank / mean\n",
      sparse->name());
  fmt::print("# {:<10} {:>6} {:>12} {:>12} {:>12} {:>12}\n", "layout", "rank", "indexer",
             "attention", "rest", "total");
  for (CpLayout layout : {CpLayout::zigzag, CpLayout::contiguous}) {
    MlaConfig m = as_form(base, sparse->name());
    m.cp_layout = layout;
    const std::string name(cp_layout_name(layout));
    if (const auto problems = m.problems(); !problems.empty()) {
      fmt::print("  {:<10} not run: {}\n", name, problems.front());
      out[name] = {{"not_run", problems.front()}};
      continue;
    }
    // GFLOP per rank: indexer, attention, rest, total
    std::array<std::vector<double>, 4> work;
    for (const auto& plan : plan_ranks(Config(std::move(m)))) {
      double k[3] = {0, 0, 0};
      for (const WorkRecord& w : plan->work.records)
        k[w.kernel == AttentionKernel::indexer  ? 0
          : w.kernel == AttentionKernel::sparse ? 1
                                                : 2] += w.flops;
      for (int i = 0; i < 3; ++i) work[size_t(i)].push_back(k[i] / 1e9);
      work[3].push_back(work[0].back() + work[1].back() + work[2].back());
    }
    const size_t P = work[0].size();
    for (size_t r = 0; r < P; ++r)
      if (P <= 8 || r == 0 || r + 1 == P)
        fmt::print("  {:<10} {:>6} {:>12.3f} {:>12.3f} {:>12.3f} {:>12.3f}\n", name, r, work[0][r],
                   work[1][r], work[2][r], work[3][r]);
    auto imbalance = [&](const std::vector<double>& v) {
      double sum = 0;
      for (double x : v) sum += x;
      return sum > 0 ? *std::max_element(v.begin(), v.end()) * double(P) / sum : 1.0;
    };
    const double im_index = imbalance(work[0]), im_attn = imbalance(work[1]),
                 im_total = imbalance(work[3]);
    fmt::print("  {:<10} imbalance: indexer {:.3f}, attention {:.3f}, total {:.3f}\n", name,
               im_index, im_attn, im_total);
    out[name] = {
        {"indexer_gflop", work[0]},
        {"attention_gflop", work[1]},
        {"rest_gflop", work[2]},
        {"imbalance", {{"indexer", im_index}, {"attention", im_attn}, {"total", im_total}}}};
  }
  return out;
}

}  // namespace

int cmd_plan(const CommonFlags& f, bool do_sweep, const std::string& mem_limit) {
  auto json_out = open_output(f.json_path, "--json");
  if (do_sweep) {
    CommonFlags g = f;
    if (g.seq == 0) g.seq = 4096;
    return sweep(build_config(g), json_out.get());
  }
  FormsAt at;
  const MlaConfig base = spec_for_all_forms(f, at);
  fmt::print(
      "laga plan: model {}{} T {} B {} P {}{} L {} kernel {}{} dtype {} dlatent sum {} — "
      "per rank\n",
      base.model, attention_only_note(base), base.seq_len, base.batch, base.sp, ulysses_note(base),
      base.num_layers, kernel_name(base.kernel),
      base.kernel == Kernel::fused
          ? fmt::format(" ({} backward)", attn_backward_name(base.attn_backward))
          : "",
      dtype_name(base.dtype), dlatent_sum_name(base.dlatent_sum));
  // A form's name in this table: displayed_form, "laga-ulysses (ulysses Pu)" with its Pu; in the
  // JSON, its registered label.
  auto shown = [&](std::string_view name) { return displayed_form(as_form(base, name)); };
  for (const Form* fm : at.runnable)
    if (const std::string_view own = kernel_instead(*fm, base.kernel); !own.empty())
      fmt::print("# {} runs its own {} attention kernel: --kernel {} does not apply to it\n",
                 shown(fm->name()), own, kernel_name(base.kernel));
  print_table_header();
  // Keyed by label; each family with variants also under its own name, for the variant
  // --form/--absorbed-kv select (the "absorbed" key is the --absorbed-kv regime).
  nlohmann::json forms;
  for (const Form* fm : registered_forms()) {
    const std::string label(fm->name());
    if (const std::string why = at.refusal(*fm); !why.empty()) {
      fmt::print("  {:<18} not run: {}\n", label, why);
      forms[label] = {{"not_run", why}};
      continue;
    }
    nlohmann::json j = plan_json(config_as(base, label));
    print_table_row(shown(label), j);
    forms[label] = j;
    if (!fm->regime().empty() && fm->regime() == f.absorbed_kv)
      forms[std::string(fm->family())] = j;
  }
  const auto runs = [&](std::string_view name) { return at.refusal(find_form(name)).empty(); };
  print_sparse_tensors(at, forms, shown);
  const nlohmann::json balance = print_sparse_balance(base, at);
  // A form's config with one more setting changed.
  auto edited = [&](std::string_view name, const std::function<void(MlaConfig&)>& edit) {
    MlaConfig m = as_form(base, name);
    edit(m);
    return Config(std::move(m));
  };
  const nlohmann::json& ex = forms[std::string(kBaselineForm)];
  if (runs(kBaselineForm)) {
    std::string vs;
    for (const Form* fm : at.runnable)
      if (fm->name() != kBaselineForm)
        vs += fmt::format(
            "{}{} {:+.2f} %", vs.empty() ? "" : ", ", shown(fm->name()),
            100 * (forms[std::string(fm->name())]["activation_peak_bytes"].get<double>() /
                       ex["activation_peak_bytes"].get<double>() -
                   1));
    fmt::print("  activation peak vs explicit: {}\n", vs);
  } else {
    fmt::print("  activation peak vs explicit: none (explicit is not run)\n");
  }
  const nlohmann::json& lg = forms["laga"];
  if (runs(kBaselineForm) && runs("laga"))
    fmt::print("  communication explicit / {}: {:.4f} (tensor bytes), {:.4f} (wire bytes)\n",
               "laga",
               ex["comm"]["tensor_bytes"].get<double>() / lg["comm"]["tensor_bytes"].get<double>(),
               ex["comm"]["wire_bytes"].get<double>() / lg["comm"]["wire_bytes"].get<double>());
  // What the other dtype of the dlatent partial sums would cost laga (the forms that gather the
  // latent alike).
  const DlatentSum other =
      base.dlatent_sum == DlatentSum::fp32 ? DlatentSum::storage : DlatentSum::fp32;
  const nlohmann::json alt =
      runs("laga") ? plan_json(edited("laga", [&](MlaConfig& m) { m.dlatent_sum = other; }))
                   : nlohmann::json{{"not_run", at.refusal(find_form("laga"))}};
  if (runs("laga"))
    fmt::print(
        "  dlatent partial sums in {} ({} with --dlatent-sum {}): laga comm {:+} tensor bytes, "
        "{:+} wire bytes, "
        "activation peak {:+} bytes\n",
        dlatent_sum_name(base.dlatent_sum) == "fp32" ? "fp32" : dtype_name(base.dtype),
        dlatent_sum_name(other) == "fp32" ? "fp32" : dtype_name(base.dtype),
        dlatent_sum_name(other),
        alt["comm"]["tensor_bytes"].get<int64_t>() - lg["comm"]["tensor_bytes"].get<int64_t>(),
        alt["comm"]["wire_bytes"].get<int64_t>() - lg["comm"]["wire_bytes"].get<int64_t>(),
        alt["activation_peak_bytes"].get<int64_t>() - lg["activation_peak_bytes"].get<int64_t>());
  // What the fused kernel's other backward order would cost each form's activation peak (the speed
  // side of the trade-off: bench_attention's fused and fused-1p rows, docs/attention.md §4).
  nlohmann::json other_order;
  if (base.kernel == Kernel::fused) {
    const AttnBackward flip = base.attn_backward == AttnBackward::one_pass ? AttnBackward::two_pass
                                                                           : AttnBackward::one_pass;
    std::string line;
    for (const Form* fm : at.runnable) {
      const int64_t peak = plan_memory(edited(fm->name(), [&](MlaConfig& m) {
                             m.attn_backward = flip;
                           })).activation_peak_bytes;
      const std::string label(fm->name());
      const int64_t delta = peak - forms[label]["activation_peak_bytes"].get<int64_t>();
      line += fmt::format("{}{} {:+}", line.empty() ? "" : ", ", shown(label), delta);
      other_order[label] = {{"activation_peak_bytes", peak}, {"delta_bytes", delta}};
    }
    fmt::print("  with --attn-backward {}: activation peak {} bytes\n", attn_backward_name(flip),
               line);
    other_order["attn_backward"] = attn_backward_name(flip);
  }
  if (json_out) {
    nlohmann::json j = {{"command", "plan"},
                        {"config", base.to_json()},
                        {"forms", forms},
                        {"laga_with_dlatent_sum_" + std::string(dlatent_sum_name(other)), alt},
                        {"other_attn_backward", other_order}};
    if (!balance.is_null()) j["sparse_rank_work"] = balance;
    *json_out << j.dump(2) << "\n";
  }
  if (!mem_limit.empty())
    for (const Form* fm : at.runnable)
      check_mem_limit(plan_memory(config_as(base, fm->name())), 1, parse_bytes(mem_limit),
                      "--mem-limit " + mem_limit);
  return 0;
}

}  // namespace laga::cli
