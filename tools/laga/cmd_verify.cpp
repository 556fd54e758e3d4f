// laga verify (docs/numerics.md §1, "equivalence"): every registered form checked at every --sp, by
// the one rule of verify/compare.hpp (FlashAttention's convention):
//   explicit   its error against the exact fp64 reference at most kExplicitFactor × the error of a
//              plain implementation in the same precision (the reference with stored tensors
//              rounded);
//   the others their error against the exact reference at most kFormFactor × the larger of
//              explicit's (same P and dtype) and the plain implementation's, per tensor, plus a
//              floor of a few ulps of the dtype;
//   exact forms (Form::exact_at_one_rank, e.g. laga): bit-identical to explicit at P = 1.
// Runs its ranks as threads, or as the MPI processes of the job under mpirun (each P on the first P
// ranks of the world; the report from world rank 0).
#include <fmt/format.h>

#include "cli.hpp"
#include "commands.hpp"
#include "laga/core/bytes.hpp"
#include "laga/core/error.hpp"
#include "laga/driver/launch.hpp"
#include "verify/forms.hpp"

namespace laga::cli {

int cmd_verify(const CommonFlags& f, const std::vector<int64_t>& sps,
               const std::string& mem_limit) {
  CommonFlags g = f;
  g.ulysses = 0;  // the forms' base; laga-ulysses takes --ulysses at each P (FormsOptions::ulysses)
  const Config base = build_config(g);
  // Refused before anything is allocated: the fp64 references and the largest run's ranks in this
  // process.
  const LaunchKind kind = launch_kind(f.comm);
  const bool threads = kind == LaunchKind::threads;
  const int64_t need = verify::planned_verify_bytes(base, sps, threads, f.ulysses);
  const MemLimit limit = mem_limit_of(mem_limit, !threads);
  LAGA_CHECK(need <= limit.bytes,
             "refused: this sweep is estimated to hold {} ({} bytes: the fp64 references and the "
             "largest run's "
             "ranks{}) in this process, over {} of {} ({} bytes); lower --seq or --layers, drop "
             "the largest --sp, "
             "or set --mem-limit",
             human_bytes(need), need, threads ? ", all threads here" : "", limit.source,
             human_bytes(limit.bytes), limit.bytes);
  auto json_out = open_output(f.json_path, "--json");
  verify::FormsReport report;
  const bool root = launch(kind, [&](Launcher& launcher) {
    verify::FormsOptions opt;
    opt.seed = f.seed, opt.timeout_s = f.timeout_s, opt.ulysses = f.ulysses;
    report = verify::check_forms(base, sps, launcher, opt);
  });
  if (!root) return 0;
  const MlaConfig& c = *base;
  fmt::print("laga verify: model {}{} T {} B {} L {} kernel {} dtype {} ({}; rule: {})\n", c.model,
             attention_only_note(c), c.seq_len, c.batch, c.num_layers, kernel_name(c.kernel),
             dtype_name(c.dtype), report.backend, report.rule);
  for (const Form* f : registered_forms())
    if (const std::string_view own = kernel_instead(*f, c.kernel); !own.empty())
      fmt::print("# {} runs its own {} attention kernel: --kernel {} does not apply to it\n",
                 f->name(), own, kernel_name(c.kernel));
  fmt::print("# {:>3} {:<18} {:<14} {:>11} {:>11} {:>11} {:>11} {:<14} {:>8} {:>6}\n", "sp", "form",
             "vs", "y", "dx", "dwkv_b", "worst", "worst tensor", "bitwise", "pass");
  fmt::print("# {:>3} {:<18} {:<14} {:>11} {:>11} {:>11} {:>11} {:<14} {:>8} {:>6}\n", "", "", "",
             "max abs err", "max abs err", "max abs err", "of allowed", "", "", "");
  nlohmann::json cases = nlohmann::json::array();
  for (const auto& k : report.cases) {
    if (k.vs == "not run")
      fmt::print("  {:>3} {:<18} not run: {}\n", k.sp, k.label, k.criterion);
    else
      fmt::print(
          "  {:>3} {:<18} {:<14} {:>11.3e} {:>11.3e} {:>11.3e} {:>11.3f} {:<14} {:>8} {:>6}\n",
          k.sp, k.label, k.vs, k.max_abs.at("y"), k.max_abs.at("dx"), k.max_abs.at("dwkv_b"),
          k.worst_ratio, k.worst, k.bitwise ? "yes" : "no", k.pass ? "ok" : "FAIL");
    cases.push_back({{"sp", k.sp},
                     {"form", k.form},
                     {"label", k.label},
                     {"ulysses", k.ulysses},
                     {"vs", k.vs},
                     {"bitwise", k.bitwise},
                     {"max_abs_diff", k.max_abs},
                     {"rel_l2_diff", k.rel_l2},
                     {"worst_tensor", k.worst},
                     {"worst_ratio", k.worst_ratio},
                     {"pass", k.pass},
                     {"criterion", k.criterion}});
  }
  // The estimate that admitted the sweep beside what this process held at its peak (the root's: it
  // holds the fp64 references, and under threads every rank).
  const int64_t rss = peak_rss_bytes();
  fmt::print(
      "# memory of this process: estimated peak {} ({} bytes), measured peak RSS {} ({} bytes)\n",
      human_bytes(need), need, human_bytes(rss), rss);
  fmt::print("verify: {}\n", report.pass ? "pass" : "FAIL");
  if (json_out) {
    nlohmann::json j = {{"command", "verify"},
                        {"config", c.to_json()},
                        {"backend", report.backend},
                        {"rule", report.rule},
                        {"cases", cases},
                        {"pass", report.pass},
                        {"memory", {{"estimated_peak_bytes", need}, {"peak_rss_bytes", rss}}}};
    *json_out << j.dump(2) << "\n";
  }
  return report.pass ? 0 : 1;
}

}  // namespace laga::cli
