// The laga command line parsed and checked without running anything: main() parses (parse_args),
// checks (check_invocation), then runs the command; parse_only() stops after the checks, so the
// argument handling can be fuzzed (fuzz/fuzz_cli.cpp) and tested without doing real work.
//
// Not here: the checks that depend on how the ranks were launched (mpirun) or on output files
// (--json, --dump); each command makes those itself, before its work.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cli.hpp"
#include "commands.hpp"

namespace laga::cli {

// What the command line asked for: the subcommand and every flag of it, parsed but not yet checked.
struct Invocation {
  std::string command;  // "run", "plan", "verify", "bench", "train", "report"
  CommonFlags flags;
  std::string dump_dir, weights, fault;                            // run (fault: bench too)
  std::vector<int64_t> sps{1, 2, 4, 8};                            // verify
  std::vector<int64_t> seqs;                                       // bench
  std::vector<std::string> forms{"explicit", "absorbed", "laga"};  // bench, train
  int64_t iters = 3, steps = 200;                                  // bench, train
  // bench: untimed runs per form before timing
  int64_t warmup = 1;
  // bench: print the time by op class
  bool profile = false;
  // bench: skip the validation (not the default)
  bool no_validate = false;
  std::string inject_wrong;                              // bench, testing: FORM:ULPS
  double lr = 1e-3;                                      // train
  std::string checkpoint_dir, resume_dir, dump_weights;  // train
  // train: 0 = only after the last step
  int64_t checkpoint_every = 0;
  bool sweep = false;     // plan
  int64_t stand_in = -1;  // run: play this rank alone
  // run, plan: "" = available memory (run) / none (plan)
  std::string mem_limit;
  std::string out_dir;        // report
  bool quick = false;         // report
  BenchCommFlags bench_comm;  // bench-comm
  ModelFlags model;           // model
};

// Parses argv into inv. Returns nullopt when a command was parsed; otherwise the exit status to end
// with now: 0 after writing the help to out, 2 after writing a parse error ("laga: ...") to err.
// The CLI11 App is built once per thread and reused (its parse state cleared, inv's defaults
// restored).
std::optional<int> parse_args(int argc, const char* const* argv, Invocation& inv, std::ostream& out,
                              std::ostream& err);
// The same with an App built for this call alone: the behaviour parse_args must keep (fuzz_cli
// checks that both agree, messages included).
std::optional<int> parse_args_fresh(int argc, const char* const* argv, Invocation& inv,
                                    std::ostream& out, std::ostream& err);

// Everything inv's command checks before its work: the configuration built and validated (for every
// --sp of verify, every --seq and form of bench, every form of train), the flags in range, --comm
// known, --inject-fault well formed (and armed, as the CLI does). Throws laga::Error (usage) naming
// the offending value. Opens no output file.
void check_invocation(const Invocation& inv);

// parse_args then check_invocation: the exit status the CLI would end with for bad usage (2), for
// --help (0), or 0 when it would go on to run the command. Writes nothing unless err is given (the
// messages go there; help is never written).
// fresh_app: parse with parse_args_fresh instead.
int parse_only(int argc, const char* const* argv, std::ostream* err = nullptr,
               bool fresh_app = false);

}  // namespace laga::cli
