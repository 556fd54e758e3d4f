// laga bench: the forms timed side by side. For each T, every repeat runs each form once in turn
// (so machine noise spreads over all forms alike) after one warm-up round; rows report medians over
// repeats of the slowest rank's times, and each form's speed relative to explicit's.
#include <fmt/format.h>

#include <algorithm>

#include "cli.hpp"
#include "commands.hpp"
#include "laga/core/error.hpp"
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

// The slowest rank's forward, backward and attention-communication seconds.
Sample slowest(const std::vector<RankResult>& ranks) {
  Sample s;
  for (const auto& r : ranks) {
    Ledger l;
    for (const auto& rec : r.collectives)
      if (!is_grad_sync(rec)) l.add(rec);
    s.fwd = std::max(s.fwd, r.forward_s);
    s.bwd = std::max(s.bwd, r.backward_s);
    s.comm = std::max(s.comm, l.seconds());
  }
  return s;
}

}  // namespace

int cmd_bench(const CommonFlags& f, const std::vector<int64_t>& seqs, const std::vector<std::string>& forms,
              int64_t iters) {
  std::vector<MlaConfig> configs;
  for (int64_t T : seqs)
    for (const auto& name : forms) {
      CommonFlags g = f;
      g.seq = T, g.form = name;
      configs.push_back(build_config(g));
    }
  auto json_out = open_output(f.json_path, "--json");
  LAGA_CHECK(!use_mpi(f.comm), "laga bench runs its ranks in-process; run it without mpirun");
  RunOptions opt;
  opt.seed = f.seed;
  opt.grad_sync = false;
  fmt::print("laga bench: model {} P {} B {} L {} kernel {} dtype {}, {} repeats after 1 warm-up, medians\n", f.model,
             f.sp, f.batch, f.layers, f.kernel, f.dtype, iters);
  fmt::print("# {:>6} {:<18} {:>9} {:>9} {:>9} {:>9} {:>12} {:>8} {:>10}\n", "seq", "form", "fwd", "bwd", "total",
             "comm", "tokens/s", "TFLOP/s", "vs expl.");
  fmt::print("# {:>6} {:<18} {:>9} {:>9} {:>9} {:>9} {:>12} {:>8} {:>10}\n", "", "", "s", "s", "s", "s", "", "", "×");
  nlohmann::json rows = nlohmann::json::array();
  const size_t nf = forms.size();
  for (size_t si = 0; si < seqs.size(); ++si) {
    std::vector<std::vector<Sample>> samples(nf);
    for (int64_t it = 0; it <= iters; ++it)
      for (size_t fi = 0; fi < nf; ++fi) {
        Sample s = slowest(run_group(configs[si * nf + fi], opt, f.timeout_s));
        if (it > 0) samples[fi].push_back(s);
      }
    double explicit_total = 0;
    for (size_t fi = 0; fi < nf; ++fi) {
      const MlaConfig& c = configs[si * nf + fi];
      std::vector<double> fw, bw, cm, tot;
      for (const auto& s : samples[fi]) fw.push_back(s.fwd), bw.push_back(s.bwd), cm.push_back(s.comm), tot.push_back(s.fwd + s.bwd);
      double total = median(tot);
      if (c.form == Form::explicit_form) explicit_total = total;
      BlockFlops fl = block_flops(c);
      double tflops = (fl.forward + fl.backward) / total / 1e12;
      double tokens_per_s = double(c.seq_len * c.batch) / total;
      std::string label = std::string(form_name(c.form)) +
                          (c.form == Form::absorbed ? "-" + std::string(absorbed_kv_name(c.absorbed_kv)) : "");
      std::string ratio = explicit_total > 0 ? fmt::format("{:.3f}", explicit_total / total) : "-";
      fmt::print("  {:>6} {:<18} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} {:>12.1f} {:>8.4f} {:>10}\n", c.seq_len, label,
                 median(fw), median(bw), total, median(cm), tokens_per_s, tflops, ratio);
      rows.push_back({{"form", form_name(c.form)}, {"absorbed_kv", absorbed_kv_name(c.absorbed_kv)}, {"seq", c.seq_len},
                      {"sp", c.sp}, {"tokens_per_s", tokens_per_s}, {"fwd_s", median(fw)}, {"bwd_s", median(bw)},
                      {"comm_s", median(cm)}, {"total_s", total}, {"tflops", tflops},
                      {"total_s_min", *std::min_element(tot.begin(), tot.end())},
                      {"total_s_max", *std::max_element(tot.begin(), tot.end())},
                      {"speedup_vs_explicit", explicit_total > 0 ? explicit_total / total : 0.0}});
    }
  }
  if (json_out) {
    nlohmann::json j = {{"command", "bench"}, {"config", configs[0].to_json()}, {"iters", iters}, {"rows", rows}};
    *json_out << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace laga::cli
