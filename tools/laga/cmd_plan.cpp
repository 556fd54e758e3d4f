// laga plan: per-rank memory and communication of every form from the configuration alone (the
// planner, include/laga/mla/planner.hpp), and with --sweep the tables of DESIGN §5: memory ratios over
// T × P × kernel, communication ratios over H in both byte conventions, and least-squares fits showing
// absorbed's excess over explicit growing linearly in T and in H.
#include <fmt/format.h>

#include <cmath>

#include "cli.hpp"
#include "commands.hpp"
#include "laga/core/bytes.hpp"
#include "laga/core/error.hpp"
#include "laga/mla/planner.hpp"

namespace laga::cli {

namespace {

struct Variant {
  std::string key;  // JSON key and table label
  Form form;
  AbsorbedKv kv;
};
const Variant kVariants[] = {{"explicit", Form::explicit_form, AbsorbedKv::expanded},
                             {"absorbed_expanded", Form::absorbed, AbsorbedKv::expanded},
                             {"absorbed_shared", Form::absorbed, AbsorbedKv::shared},
                             {"laga", Form::laga, AbsorbedKv::expanded}};

MlaConfig with(MlaConfig c, const Variant& v) {
  c.form = v.form, c.absorbed_kv = v.kv;
  return c;
}

nlohmann::json plan_json(const MlaConfig& c) {
  PlannedMemory m = plan_memory(c);
  PlannedComm k = plan_comm(c);
  int64_t sync_tensor = 0, sync_wire = 0;
  for (const auto& r : k.grad_sync) sync_tensor += r.tensor_bytes, sync_wire += r.wire_bytes;
  return {{"activation_peak_bytes", m.activation_peak_bytes},
          {"saved_bytes", m.saved_bytes},
          {"forward_peak_bytes", m.forward_peak_bytes},
          {"backward_peak_bytes", m.backward_peak_bytes},
          {"baseline_bytes", m.baseline_bytes},
          {"peak_breakdown", m.peak_breakdown},
          {"saved_breakdown", m.saved_breakdown},
          {"comm", {{"tensor_bytes", k.tensor_bytes()}, {"wire_bytes", k.wire_bytes()},
                    {"collectives", collectives_json(k.attention)}}},
          {"grad_sync", {{"tensor_bytes", sync_tensor}, {"wire_bytes", sync_wire}}}};
}

// Least squares y = a + b·x; returns {a, b, max |residual| / max |y|}.
std::array<double, 3> fit(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = double(x.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0, ymax = 0;
  for (size_t i = 0; i < x.size(); ++i) sx += x[i], sy += y[i], sxx += x[i] * x[i], sxy += x[i] * y[i];
  const double b = (n * sxy - sx * sy) / (n * sxx - sx * sx), a = (sy - b * sx) / n;
  double r = 0;
  for (size_t i = 0; i < x.size(); ++i) r = std::max(r, std::abs(a + b * x[i] - y[i])), ymax = std::max(ymax, std::abs(y[i]));
  return {a, b, r / ymax};
}

int sweep(const MlaConfig& base, std::ofstream* json_out) {
  nlohmann::json memory = nlohmann::json::array(), comm = nlohmann::json::array(), fits = nlohmann::json::array();
  fmt::print("laga plan --sweep: model {} B {} L {} dtype {} — per rank, bytes\n", base.model, base.batch,
             base.num_layers, dtype_name(base.dtype));
  fmt::print("# {:>6} {:>3} {:<6} {:>16} {:>16} {:>16} {:>16} {:>10} {:>10} {:>10}\n", "T", "P", "kernel",
             "explicit peak", "abs-exp peak", "abs-shared peak", "laga peak", "abs-exp/ex", "abs-sh/ex", "laga/ex");
  for (Kernel kernel : {Kernel::eager, Kernel::fused})
    for (int64_t T : {4096, 8192, 16384})
      for (int64_t P : {4, 8, 16}) {
        MlaConfig c = base;
        c.seq_len = T, c.sp = P, c.kernel = kernel;
        if (!c.problems().empty()) continue;
        std::map<std::string, int64_t> peak;
        for (const auto& v : kVariants) peak[v.key] = plan_memory(with(c, v)).activation_peak_bytes;
        auto ratio = [&](const char* k) { return double(peak[k]) / double(peak["explicit"]); };
        fmt::print("  {:>6} {:>3} {:<6} {:>16} {:>16} {:>16} {:>16} {:>10.4f} {:>10.4f} {:>10.4f}\n", T, P,
                   kernel_name(kernel), peak["explicit"], peak["absorbed_expanded"], peak["absorbed_shared"],
                   peak["laga"], ratio("absorbed_expanded"), ratio("absorbed_shared"), ratio("laga"));
        memory.push_back({{"seq", T}, {"sp", P}, {"kernel", kernel_name(kernel)}, {"activation_peak_bytes", peak},
                          {"absorbed_expanded_over_explicit", ratio("absorbed_expanded")},
                          {"absorbed_shared_over_explicit", ratio("absorbed_shared")},
                          {"laga_over_explicit", ratio("laga")},
                          {"absorbed_expanded_excess_bytes", peak["absorbed_expanded"] - peak["explicit"]},
                          {"laga_excess_bytes", peak["laga"] - peak["explicit"]}});
      }
  fmt::print("# communication per rank per step (forward + backward), T 4096, P 8\n");
  fmt::print("# {:>4} {:>16} {:>16} {:>12} {:>16} {:>16} {:>12}\n", "H", "explicit tensor", "laga tensor", "ratio",
             "explicit wire", "laga wire", "ratio");
  for (int64_t H : {16, 32, 64, 128}) {
    MlaConfig c = base;
    c.seq_len = 4096, c.sp = 8, c.num_attention_heads = H;
    PlannedComm e = plan_comm(with(c, kVariants[0])), l = plan_comm(with(c, kVariants[3]));
    double rt = double(e.tensor_bytes()) / double(l.tensor_bytes()), rw = double(e.wire_bytes()) / double(l.wire_bytes());
    fmt::print("  {:>4} {:>16} {:>16} {:>12.4f} {:>16} {:>16} {:>12.4f}\n", H, e.tensor_bytes(), l.tensor_bytes(), rt,
               e.wire_bytes(), l.wire_bytes(), rw);
    comm.push_back({{"heads", H}, {"explicit_tensor_bytes", e.tensor_bytes()}, {"laga_tensor_bytes", l.tensor_bytes()},
                    {"tensor_ratio", rt}, {"explicit_wire_bytes", e.wire_bytes()}, {"laga_wire_bytes", l.wire_bytes()},
                    {"wire_ratio", rw}});
  }
  fmt::print("# absorbed-expanded's excess activation peak over explicit: least-squares line, max residual / max excess\n");
  for (Kernel kernel : {Kernel::eager, Kernel::fused}) {
    std::vector<double> xs, ys;
    for (int64_t T : {2048, 4096, 8192, 16384}) {
      MlaConfig c = base;
      c.seq_len = T, c.sp = 8, c.kernel = kernel;
      xs.push_back(double(T));
      ys.push_back(double(plan_memory(with(c, kVariants[1])).activation_peak_bytes -
                          plan_memory(with(c, kVariants[0])).activation_peak_bytes));
    }
    auto [a, b, r] = fit(xs, ys);
    fmt::print("  {:<6} in T (P 8, H {}): excess = {:.4g} + {:.6g}·T bytes, max residual {:.2e}\n", kernel_name(kernel),
               base.num_attention_heads, a, b, r);
    fits.push_back({{"kernel", kernel_name(kernel)}, {"variable", "seq"}, {"intercept", a}, {"slope", b},
                    {"max_rel_residual", r}, {"x", xs}, {"excess_bytes", ys}});
    xs.clear(), ys.clear();
    for (int64_t H : {16, 32, 64, 128}) {
      MlaConfig c = base;
      c.seq_len = 4096, c.sp = 8, c.num_attention_heads = H, c.kernel = kernel;
      xs.push_back(double(H));
      ys.push_back(double(plan_memory(with(c, kVariants[1])).activation_peak_bytes -
                          plan_memory(with(c, kVariants[0])).activation_peak_bytes));
    }
    auto [a2, b2, r2] = fit(xs, ys);
    fmt::print("  {:<6} in H (P 8, T 4096): excess = {:.4g} + {:.6g}·H bytes, max residual {:.2e}\n",
               kernel_name(kernel), a2, b2, r2);
    fits.push_back({{"kernel", kernel_name(kernel)}, {"variable", "heads"}, {"intercept", a2}, {"slope", b2},
                    {"max_rel_residual", r2}, {"x", xs}, {"excess_bytes", ys}});
  }
  if (json_out) {
    nlohmann::json j = {{"command", "plan --sweep"}, {"config", base.to_json()}, {"memory", memory},
                        {"communication", comm}, {"fits", fits}};
    *json_out << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

int cmd_plan(const CommonFlags& f, bool do_sweep, const std::string& mem_limit) {
  CommonFlags g = f;
  if (do_sweep && g.seq == 0) g.seq = 4096;
  MlaConfig base = build_config(g);
  auto json_out = open_output(f.json_path, "--json");
  if (do_sweep) return sweep(base, json_out.get());
  fmt::print("laga plan: model {} T {} B {} P {} L {} kernel {} dtype {} — per rank\n", base.model, base.seq_len,
             base.batch, base.sp, base.num_layers, kernel_name(base.kernel), dtype_name(base.dtype));
  fmt::print("# {:<18} {:>16} {:>16} {:>16} {:>16} {:>16} {:>16}\n", "form", "activation peak", "saved", "fwd peak",
             "bwd peak", "comm tensor", "comm wire");
  fmt::print("# {:<18} {:>16} {:>16} {:>16} {:>16} {:>16} {:>16}\n", "", "bytes", "bytes", "bytes", "bytes", "bytes",
             "bytes");
  nlohmann::json forms;
  for (const auto& v : kVariants) {
    MlaConfig c = with(base, v);
    nlohmann::json j = plan_json(c);
    fmt::print("  {:<18} {:>16} {:>16} {:>16} {:>16} {:>16} {:>16}\n", v.key, j["activation_peak_bytes"].get<int64_t>(),
               j["saved_bytes"].get<int64_t>(), j["forward_peak_bytes"].get<int64_t>(),
               j["backward_peak_bytes"].get<int64_t>(), j["comm"]["tensor_bytes"].get<int64_t>(),
               j["comm"]["wire_bytes"].get<int64_t>());
    forms[v.key] = j;
    if (v.form == Form::absorbed && v.kv == base.absorbed_kv) forms["absorbed"] = j;  // the --absorbed-kv regime
  }
  const double e = forms["explicit"]["activation_peak_bytes"].get<double>();
  fmt::print("  activation peak vs explicit: absorbed-expanded {:+.2f} %, absorbed-shared {:+.2f} %, laga {:+.2f} %\n",
             100 * (forms["absorbed_expanded"]["activation_peak_bytes"].get<double>() / e - 1),
             100 * (forms["absorbed_shared"]["activation_peak_bytes"].get<double>() / e - 1),
             100 * (forms["laga"]["activation_peak_bytes"].get<double>() / e - 1));
  fmt::print("  communication explicit / laga: {:.4f} (tensor bytes), {:.4f} (wire bytes)\n",
             forms["explicit"]["comm"]["tensor_bytes"].get<double>() / forms["laga"]["comm"]["tensor_bytes"].get<double>(),
             forms["explicit"]["comm"]["wire_bytes"].get<double>() / forms["laga"]["comm"]["wire_bytes"].get<double>());
  if (json_out) {
    nlohmann::json j = {{"command", "plan"}, {"config", base.to_json()}, {"forms", forms}};
    *json_out << j.dump(2) << "\n";
  }
  if (!mem_limit.empty())
    for (const auto& v : kVariants) check_mem_limit(plan_memory(with(base, v)), 1, parse_bytes(mem_limit), "--mem-limit " + mem_limit);
  return 0;
}

}  // namespace laga::cli
