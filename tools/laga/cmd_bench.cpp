// laga bench: the forms timed side by side. For each T, every repeat runs each form once in turn
// (so machine noise spreads over all forms alike) after one warm-up round; rows report medians over
// repeats of the slowest rank's times, and each form's speed relative to explicit's.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

#include "cli.hpp"
#include "commands.hpp"
#include "laga/core/error.hpp"
#include "laga/core/machine.hpp"
#include "laga/driver/launch.hpp"
#include "laga/mla/flops.hpp"

namespace laga::cli {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Sample {
  double fwd = 0, bwd = 0, comm = 0;
};

// One timed run of c on every rank of a group; the slowest rank's forward, backward and exposed
// attention-communication seconds, on the group's rank 0.
Sample timed_run(Launcher& launcher, const Config& c, const RunOptions& opt, double timeout_s) {
  Sample s;
  launcher.run(int(c->sp), [&](Communicator& comm) {
    const RankResult r = run_rank(c, opt, comm);
    Ledger l;
    for (const auto& rec : r.collectives)
      if (!is_grad_sync(rec)) l.add(rec);
    const nlohmann::json mine = {r.forward_s, r.backward_s, l.wait_seconds()};  // exposed: time spent waiting
    const std::vector<nlohmann::json> all = gather_json(comm, mine);
    if (comm.rank() != 0) return;
    for (const auto& j : all)
      s.fwd = std::max(s.fwd, j[0].get<double>()), s.bwd = std::max(s.bwd, j[1].get<double>()),
      s.comm = std::max(s.comm, j[2].get<double>());
  }, timeout_s);
  return s;
}

}  // namespace

int cmd_bench(const CommonFlags& f, const std::vector<int64_t>& seqs, const std::vector<std::string>& forms,
              int64_t iters) {
  std::vector<Config> configs;
  for (int64_t T : seqs)
    for (const auto& name : forms) {
      CommonFlags g = f;
      g.seq = T, g.form = name;
      configs.push_back(build_config(g));
    }
  const LaunchKind kind = launch_kind(f.comm);
  auto json_out = is_root_process() ? open_output(f.json_path, "--json") : nullptr;
  RunOptions opt;
  opt.seed = f.seed;
  opt.grad_sync = false;
  const size_t nf = forms.size();
  // samples[si][fi]: the timed repeats of seqs[si] × forms[fi], forms alternating within a repeat.
  std::vector<std::vector<std::vector<Sample>>> samples(seqs.size(), std::vector<std::vector<Sample>>(nf));
  std::string backend;
  const bool root = launch(kind, [&](Launcher& launcher) {
    backend = launcher.backend();
    for (size_t si = 0; si < seqs.size(); ++si)
      for (int64_t it = 0; it <= iters; ++it)
        for (size_t fi = 0; fi < nf; ++fi) {
          const Sample s = timed_run(launcher, configs[si * nf + fi], opt, f.timeout_s);
          if (it > 0) samples[si][fi].push_back(s);
        }
  });
  if (!root) return 0;
  const MachineInfo machine = machine_info();
  fmt::print("laga bench: model {} P {} ({}) B {} L {} kernel {} dtype {}, {} repeats after 1 warm-up, medians\n",
             f.model, f.sp, backend, f.batch, f.layers, f.kernel, f.dtype, iters);
  fmt::print("# machine: {}\n", machine.line());
  fmt::print("# {:>6} {:<18} {:>9} {:>9} {:>9} {:>9} {:>12} {:>8} {:>10}\n", "seq", "form", "fwd", "bwd", "total",
             "comm", "tokens/s", "TFLOP/s", "vs expl.");
  fmt::print("# {:>6} {:<18} {:>9} {:>9} {:>9} {:>9} {:>12} {:>8} {:>10}\n", "", "", "s", "s", "s", "s", "", "", "×");
  nlohmann::json rows = nlohmann::json::array();
  for (size_t si = 0; si < seqs.size(); ++si) {
    double explicit_total = 0;
    for (size_t fi = 0; fi < nf; ++fi) {
      const MlaConfig& c = *configs[si * nf + fi];
      std::vector<double> fw, bw, cm, tot;
      for (const auto& s : samples[si][fi])
        fw.push_back(s.fwd), bw.push_back(s.bwd), cm.push_back(s.comm), tot.push_back(s.fwd + s.bwd);
      const double total = median(tot);
      if (c.form == kBaselineForm) explicit_total = total;
      const BlockFlops fl = block_flops(c);
      const double tflops = (fl.forward + fl.backward) / total / 1e12;
      const double tokens_per_s = double(c.seq_len * c.batch) / total;
      const std::string ratio = explicit_total > 0 ? fmt::format("{:.3f}", explicit_total / total) : "-";
      fmt::print("  {:>6} {:<18} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} {:>12.1f} {:>8.4f} {:>10}\n", c.seq_len, c.form,
                 median(fw), median(bw), total, median(cm), tokens_per_s, tflops, ratio);
      rows.push_back({{"form", find_form(c.form).family()}, {"variant", c.form}, {"seq", c.seq_len},
                      {"sp", c.sp}, {"tokens_per_s", tokens_per_s}, {"fwd_s", median(fw)}, {"bwd_s", median(bw)},
                      {"comm_s", median(cm)}, {"total_s", total}, {"tflops", tflops},
                      {"total_s_min", *std::min_element(tot.begin(), tot.end())},
                      {"total_s_max", *std::max_element(tot.begin(), tot.end())},
                      {"speedup_vs_explicit", explicit_total > 0 ? explicit_total / total : 0.0}});
    }
  }
  if (json_out) {
    nlohmann::json j = {{"command", "bench"}, {"machine", machine.to_json()}, {"backend", backend}, {"config", configs[0]->to_json()}, {"iters", iters}, {"rows", rows}};
    *json_out << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace laga::cli
