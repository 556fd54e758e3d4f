// The verification of the forms, shared by `laga verify`, the tests (tests/mla/test_forms.cpp) and
// the benchmarks' validation: every registered form run at every P on the same weights and inputs,
// each judged by the one rule of verify/compare.hpp against the exact fp64 reference: explicit
// against a plain implementation in the same precision, every other form against the larger of
// explicit's and the plain implementation's errors (form_vs_baseline). Runs through a Launcher, so
// under threads or under mpirun alike; the report is complete on the root process only.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "laga/driver/launch.hpp"
#include "laga/mla/config.hpp"
#include "verify/compare.hpp"

namespace laga::verify {

struct FormCase {
  int64_t sp = 1;
  std::string form;      // registry label
  std::string label;     // how commands print it: displayed_form ("laga-ulysses (ulysses 2)")
  int64_t ulysses = 0;   // the Pu of a form that takes --ulysses (laga-ulysses); 0 otherwise
  std::string vs;        // "fp64" (the rule), "explicit@1" (the bitwise claim), or
                         // "not run" (the form refuses this P; criterion says why).
                         // Where explicit refuses a P, the others are held to its
                         // error at P 1, itself judged once as explicit's fp64
                         // case at P 1 (whether or not P 1 is swept)
  bool bitwise = false;  // vs explicit at P = 1, bit for bit
  bool pass = false;
  std::string criterion;   // the rule applied, in words
  std::string worst;       // the tensor nearest to (or over) its allowance
  double worst_ratio = 0;  // its err / allowed (pass ⇔ ≤ 1 for the rule)
  // per output ("y", "dx", "dwkv_b": max over layers) vs `vs`
  std::map<std::string, double> max_abs;
  std::map<std::string, double> rel_l2;
  // Per tensor ("y", "dx", "dwkv_b.0", ...) the rule's allowance in ulps of the tensor's scale
  // (Verdict::allowed_ulps); empty for the bitwise case.
  std::map<std::string, double> allowed_ulps;
};

struct FormsReport {
  std::string backend, rule;
  std::vector<FormCase> cases;
  bool pass = true;
};

struct FormsOptions {
  std::vector<std::string> forms;  // labels to check besides explicit; empty: every registered form
  uint64_t seed = 1234;
  double timeout_s = 0;
  // --ulysses Pu of the forms that take it (laga-ulysses, as_form) at every P: not run where it
  // does not fit P. 0: each P's default.
  int64_t ulysses = 0;
};

// One run of c on c->sp threads (run_group, the default seed): its whole y, dx and synced weight
// gradients, gathered to rank 0. What the bitwise claims of the tests compare.
Tensors run_tensors(const Config& c);

// The weights of every layer of c, counted in elements.
int64_t weight_count(const MlaConfig& c);
// The elements of a run's outputs: y and dx [T, B, D] and every weight gradient.
int64_t output_count(const MlaConfig& c);

// One run of c in this process, planned: per rank its baseline and activation peak (plan_memory);
// with `gathered` (run_rank's gather_tensors and grad sync, as verify and bench's validation run),
// the fp32 gradient sync's scratch (4 bytes per weight) and the whole x, dy, y and dx that every
// rank then holds; × the ranks in this process (c->sp when ranks_are_threads, else 1). The caching
// allocator's blocks kept after a run are not in it: whoever runs more than one run accounts for
// them.
int64_t planned_run_bytes(const Config& c, bool ranks_are_threads, bool gathered);

// What check_forms(base, sps) holds at its peak in one process, estimated before anything is
// allocated (laga verify refuses a sweep that does not fit, exit 2, rather than be killed for
//   memory): the root's fp64 arrays: kVerifyFp64Copies × 8 bytes per output element (output_count:
//   the first run's outputs, weights and inputs as fp64, the exact reference's outputs and one
//   plain reference's being computed, with its gradients, and the run in progress's), plus the
//   reference's activations, (8 / dtype size) × explicit's planned activation peak at P 1; the
//   weights drawn once (dtype); the largest run, planned_run_bytes(gathered) over the forms that
//   run at each P (as_form with ulysses: FormsOptions::ulysses; check_forms empties the caching
//   allocator and the C heap before each P's runs, so no earlier P's blocks sit beside them);
//   kVerifyProcessBytes for the process itself.
// Measured peak RSS (laga verify prints it beside the estimate; tests/cli/memory_estimate.sh holds
// it under) stays under this estimate: docs/architecture.md §2, "Verification".
inline constexpr int64_t kVerifyFp64Copies = 7;
inline constexpr int64_t kVerifyProcessBytes = int64_t(64) << 20;
int64_t planned_verify_bytes(const Config& base, const std::vector<int64_t>& sps,
                             bool ranks_are_threads, int64_t ulysses = 0);

// base: the configuration (its sp and form are replaced by each case's). sps: the rank counts.
FormsReport check_forms(const Config& base, const std::vector<int64_t>& sps, Launcher& launcher,
                        const FormsOptions& opt);

}  // namespace laga::verify
