// The verification of the forms, shared by `laga verify`, the tests (tests/mla/test_forms.cpp) and the
// benchmarks' validation: every registered form run at every P on the same weights and inputs, each
// judged by the one rule of verify/compare.hpp against the exact fp64 reference: explicit against a
// plain implementation in the same precision, every other form against the larger of explicit's and
// the plain implementation's errors (form_vs_baseline). Runs through a Launcher, so under threads or
// under mpirun alike; the report is complete on the root process only.
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
  std::string form;                       // registry label
  std::string vs;                         // "fp64" (the rule), "explicit@1" (the bitwise claim), or
                                          // "not run" (the form refuses this P; criterion says why).
                                          // Where explicit refuses a P, the others are held to its
                                          // error at P 1, itself judged once as explicit's fp64
                                          // case at P 1 (whether or not P 1 is swept)
  bool bitwise = false;                   // vs explicit at P = 1, bit for bit
  bool pass = false;
  std::string criterion;                  // the rule applied, in words
  std::string worst;                      // the tensor nearest to (or over) its allowance
  double worst_ratio = 0;                 // its err / allowed (pass ⇔ ≤ 1 for the rule)
  std::map<std::string, double> max_abs;  // per output ("y", "dx", "dwkv_b": max over layers) vs `vs`
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
  // laga --ulysses Pu: at every P of the sweep that Pu divides with Pu < P, one more row, laga with
  // head scatter in groups of Pu × a ring over the P/Pu groups ("laga (ulysses Pu)"), by the rule of
  // the other forms against explicit at that P. 0: none.
  int64_t ulysses = 0;
};
// Whether the sweep has a laga --ulysses Pu row at P: Pu divides P and Pu < P.
inline bool ulysses_row_at(int64_t Pu, int64_t P) { return Pu > 0 && Pu < P && P % Pu == 0; }

// One run of c on c->sp threads (run_group, the default seed): its whole y, dx and synced weight
// gradients, gathered to rank 0. What the bitwise claims of the tests compare.
Tensors run_tensors(const Config& c);

// What check_forms(base, sps) holds at its peak in one process, estimated before anything is
// allocated (laga verify refuses a sweep that does not fit, exit 2, rather than be killed for memory):
//   the root's fp64 arrays: kVerifyFp64Copies × 8 bytes per weight (the run's inputs, outputs and
//     weights as fp64, the exact reference and one plain reference being computed, with its gradients),
//     plus the reference's activations, (8 / dtype size) × explicit's planned activation peak at P 1;
//   the weights drawn once (dtype);
//   the largest run: its ranks in this process (P when ranks_are_threads, else 1) × the largest planned
//     per-rank peak over the forms that run at each P (baseline + activations) plus the fp32 gradient
//     sync's scratch (4 bytes per weight);
//   kVerifyProcessBytes for the process itself.
// Measured peak RSS (deepseek-v2-lite fp32, T 16–256, L 1–2, P 1–8; deepseek-v3 bf16 T 16, P 1,8;
// docs/design.md, "Verification's memory") stays 4–20 % under this estimate.
inline constexpr int64_t kVerifyFp64Copies = 7;
inline constexpr int64_t kVerifyProcessBytes = int64_t(64) << 20;
int64_t planned_verify_bytes(const Config& base, const std::vector<int64_t>& sps, bool ranks_are_threads);

// base: the configuration (its sp and form are replaced by each case's). sps: the rank counts.
FormsReport check_forms(const Config& base, const std::vector<int64_t>& sps, Launcher& launcher,
                        const FormsOptions& opt);

}  // namespace laga::verify
