// The subcommands of the laga CLI, each in its own cmd_*.cpp. Each is called after check_invocation
// (parse.hpp) has checked its flags and configurations; what depends on the launch (mpirun) or on
// output files it checks itself, before its work.
#pragma once

#include <string>
#include <vector>

#include "cli.hpp"

namespace laga::cli {

int cmd_run(const CommonFlags& f, const std::string& dump_dir, const std::string& weights,
            const std::string& mem_limit, int64_t stand_in = -1);
int cmd_verify(const CommonFlags& f, const std::vector<int64_t>& sps, const std::string& mem_limit);
// bench: --seq list, --forms, --iters, --warmup, validation (off with --no-validate),
// --inject-wrong, --profile,
// --mem-limit.
struct BenchFlags {
  std::vector<int64_t> seqs;
  std::vector<std::string> forms;
  int64_t iters = 3, warmup = 1;
  bool validate = true;
  std::string inject_wrong;  // testing: FORM:ULPS (cli.hpp, parse_inject_wrong)
  bool profile = false;      // --profile: print the time by op class under the table
  // --mem-limit: refuse above this estimated peak (default: available memory)
  std::string mem_limit;
};
int cmd_bench(const CommonFlags& f, const BenchFlags& b);
int cmd_plan(const CommonFlags& f, bool sweep, const std::string& mem_limit);
// Checkpoints of train: --checkpoint DIR, --checkpoint-every N, --resume DIR, --dump-weights FILE.
struct TrainFlags {
  std::string checkpoint_dir, resume_dir, dump_weights;
  int64_t checkpoint_every = 0;
};
// laga report --out DIR [--quick] (cmd_report.cpp).
int cmd_report(const std::string& out_dir, bool quick);
int cmd_train(const CommonFlags& f, const std::vector<std::string>& forms, int64_t steps, double lr,
              const TrainFlags& t = {});
// bench-comm (nccl-tests' flags): -b MIN -e MAX -f FACTOR, --ops, --dtype (a list), --sp (0: the
// mpirun job's size, or 2 under threads), --iters, --warmup; --comm, --timeout and --json are f's.
struct BenchCommFlags {
  std::string min_bytes = "1K", max_bytes = "1M";
  int64_t factor = 4, sp = 0, iters = 20, warmup = 2;
  std::vector<std::string> ops{"all_gather", "reduce_scatter", "all_to_all", "all_reduce"},
      dtypes{"bf16"};
  bool host_cost = false;  // also measure each op's host cost beside compute at the largest size
};
int cmd_bench_comm(const CommonFlags& f, const BenchCommFlags& b);

// laga model: --hw FILE, --forms (empty: every registered form), --bench-json FILE; --calibrate OUT
// [--comm-json FILE] writes a hardware file of this machine instead.
// --link-scale F multiplies every link bandwidth of the hardware file (latencies as they are);
// --grid predicts every form over a grid of models, T, P and link scales and prints the winner of
// each cell.
struct ModelFlags {
  std::string hw, calibrate_out, comm_json, bench_json;
  std::vector<std::string> forms;
  std::vector<double> link_scale;
  // --calibrate-seq: T at which --calibrate measures every rate (none: 2048)
  std::vector<int64_t> calibrate_seqs;
  // --calibrate-reps: timed repeats per measurement (0: the default, 3)
  int calibrate_reps = 0;
  bool grid = false;
  std::string published;  // --published FILE: the model beside published measurements
};
int cmd_model(const CommonFlags& f, const ModelFlags& m);
// laga model --published FILE [--json OUT] (cmd_model_published.cpp).
int cmd_model_published(const std::string& file, const std::string& json_path);

}  // namespace laga::cli
