// The stages of laga bench (cmd_bench.cpp composes them; docs/benchmarks.md §7): the setup (every
// form's configuration at every T, the reference and the planned memory), the validation
// (bench_validate.cpp: verify's rule at a reduced T, then one gathered check per row), the timed
// rounds (bench_rounds.cpp) and the table and JSON (cmd_bench.cpp). Not here: the collectives alone
// (laga bench-comm).
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cli.hpp"
#include "commands.hpp"
#include "laga/driver/launch.hpp"
#include "verify/forms.hpp"

namespace laga::cli {

// What every stage reads: the forms, their configurations at every T and the reference they are
// validated against, fixed before any work.
struct BenchSetup {
  std::vector<int64_t> seqs;
  std::vector<std::string> labels;  // registered labels, [fi]
  // how the rows name them: displayed_form, "laga-ulysses (ulysses Pu)" with its Pu
  std::vector<std::string> keys;
  std::vector<Config> configs;  // [si * nf + fi]
  // [si]: the flags' configuration (--ulysses as given), every form's source
  std::vector<MlaConfig> specs;
  std::optional<InjectWrong> wrong;
  size_t nf = 0;
  int64_t P = 1;
  DType dtype = DType::bf16;
  // The reference: explicit at P, or at P 1 where it cannot run P (explicit_refusal says why;
  // verify's rule there).
  std::string explicit_refusal;
  int64_t ref_P = 1;
  std::optional<Config> base;  // explicit at ref_P, at the first T
  int64_t Tv = 0;              // the reduced T of the validation (reduced_seq)
  const Config& config(size_t si, size_t fi) const { return configs[si * nf + fi]; }
};

// The flags' forms at every T (and --inject-wrong's); then, once the launch and the output files
// are checked, the reference (bench_reference): one at P 1 that does not fit this machine is
// refused (usage error) when validating.
BenchSetup bench_setup(const CommonFlags& f, const BenchFlags& b);
void bench_reference(BenchSetup& s, bool validate);

// What bench holds at its peak in this process, planned before anything is allocated
// (bench_validate.cpp).
int64_t planned_bench_bytes(const BenchSetup& s, bool validate, bool threads);

// The line on stderr rewritten in place with the run in progress; only on a terminal.
class Progress {
 public:
  explicit Progress(bool root);
  void show(int64_t T, const std::string& form, const std::string& what) const;
  void done() const;

 private:
  bool on_;
  std::chrono::steady_clock::time_point t0_;
};

// ---- validation (bench_validate.cpp) ----

// The failed checks of one row, and what its agreement check measured.
struct Validation {
  bool done = false;
  std::string vs;                       // "bitwise" | "bound" | "reference" (explicit itself)
  std::vector<std::string> failures;    // one message per failed check
  std::string worst;                    // the tensor nearest its bound (vs "bound")
  double worst_ratio = 0;               // its max|form − explicit| / bound
  std::map<std::string, double> bound;  // per tensor, the absolute bound (vs "bound")
};

// verify's rule at the reduced T_v, and its cases by the rows' labels: at P (the rule's and the
// bitwise ones) and explicit's at the reference's P. The pointers point into report.cases: filled
// in place.
struct ReducedRule {
  verify::FormsReport report;
  std::map<std::string, const verify::FormCase*> rule_case, bitwise_case;
  const verify::FormCase* ref_case = nullptr;
  ReducedRule() = default;
  ReducedRule(const ReducedRule&) = delete;
  ReducedRule& operator=(const ReducedRule&) = delete;
};

// Stage 0: verify's rule on the same model, P, B, L, kernel and dtype at T_v, once.
void check_reduced_rule(const BenchSetup& s, const CommonFlags& f, Launcher& launcher,
                        const Progress& progress, ReducedRule& rule);
// Stage 1 at seqs[si], untimed: one gathered run of the reference and of every form; on the root,
// each row's checks against the reference (checks[fi]).
void validate_at(const BenchSetup& s, size_t si, const CommonFlags& f, const ReducedRule& rule,
                 Launcher& launcher, const Progress& progress, std::vector<Validation>& checks);

// ---- timed rounds (bench_rounds.cpp) ----

// One collective tensor name's records in one run of one rank (summed over the layers), or, across
// ranks, the largest of each figure.
struct CollStat {
  std::string op;
  int64_t count = 0, tensor_bytes = 0, wire_bytes = 0;
  double seconds = 0, exposed = 0, hidden = 0;  // issued → completed; waited for; seconds − waited
};

// One timed iteration: the slowest rank's figure of each phase (each maximised separately).
struct Sample {
  double fwd = 0, bwd = 0, exposed = 0, collective = 0, hidden = 0;
  // The slowest rank's seconds per op class (core/work.hpp), and the rest of its fwd + bwd
  // beyond those and its exposed communication ("other": elementwise work, copies, allocation,
  // skew).
  std::map<std::string, double> op_s;
  double other_s = 0;
  // The time ranks waited for each other (peer_wait_skew): the most any rank waited beyond the last
  // arriver's wait, summed over the attention collectives. Every form gives each
  // rank the same work, so this is time the host took from one rank (a busy neighbour on its core,
  // an interrupt) that its peers then waited for; it is part of `exposed`, and the model has no
  // term for it (docs/model.md §4).
  double skew = 0;
  nlohmann::json profile;  // rank 0's whole profile, FLOPs and matmul shapes included
  int threads_min = 1 << 30, threads_max = 0;
  std::map<std::string, CollStat> coll;
};

// Stage 2 at seqs[si]: --warmup untimed rounds, then --iters timed rounds; each round runs every
// form once in turn, so machine noise spreads over the forms alike. samples[fi]: the timed
// iterations.
void timed_rounds(const BenchSetup& s, size_t si, const BenchFlags& b, const CommonFlags& f,
                  Launcher& launcher, const Progress& progress,
                  std::vector<std::vector<Sample>>& samples);

}  // namespace laga::cli
