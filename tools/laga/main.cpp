// The laga CLI (DESIGN §7): plan, run, verify, bench, train, report. Exit status: 0 success,
// 1 a check failed, 2 bad usage or configuration, 3 an internal error.
//
// Each subcommand builds an MlaConfig from --model and the flags, validates it before any work, and
// opens its output files up front. The subcommands live in cmd_*.cpp.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "cli.hpp"
#include "commands.hpp"
#include "laga/core/error.hpp"
#include "laga/core/fault.hpp"

using namespace laga;
using namespace laga::cli;

int main(int argc, char** argv) {
  CLI::App app{"laga: MLA training under sequence parallelism, in the explicit, absorbed and LAGA forms"};
  app.require_subcommand(1);
  CommonFlags flags;
  std::string dump_dir, weights;
  std::vector<int64_t> sps{1, 2, 4, 8};

  auto* run = app.add_subcommand("run", "one forward + backward of the block stack on P ranks, measured");
  add_common(run, flags, true);
  run->add_option("--sp", flags.sp, "ranks in the sequence-parallel group P")->capture_default_str();
  run->add_option("--form", flags.form, "explicit, absorbed, laga")->capture_default_str();
  run->add_option("--dump", dump_dir, "write config.json and tensors.safetensors (whole tensors, gathered to rank 0)");
  run->add_option("--weights", weights, "load weights from a laga dump or a Hugging Face DeepSeek shard (.safetensors)");
  std::string fault;
  run->add_option("--inject-fault", fault, "testing: RANK:PLACE makes that rank fail in forward or backward");

  auto* verify = app.add_subcommand("verify", "the forms against each other and the fp64 reference");
  add_common(verify, flags, true);
  verify->add_option("--sp", sps, "rank counts to check, e.g. 1,2,4,8")->delimiter(',')->capture_default_str();

  std::vector<int64_t> seqs;
  std::vector<std::string> forms{"explicit", "absorbed", "laga"};
  int64_t iters = 3, steps = 200;
  double lr = 1e-3;
  auto* bench = app.add_subcommand("bench", "the forms timed side by side: medians and ratios from one run");
  add_common(bench, flags, true);
  bench->remove_option(bench->get_option("--seq"));
  bench->add_option("--seq", seqs, "sequence lengths, e.g. 1024,2048")->delimiter(',')->required();
  bench->add_option("--sp", flags.sp, "ranks in the sequence-parallel group P")->capture_default_str();
  bench->add_option("--forms", forms, "forms to time, e.g. explicit,laga")->delimiter(',')->capture_default_str();
  bench->add_option("--iters", iters, "timed repeats per form (after one warm-up)")->capture_default_str();

  auto* train = app.add_subcommand("train", "optimizer steps of each form on a synthetic regression task");
  add_common(train, flags, true);
  train->add_option("--sp", flags.sp, "ranks in the sequence-parallel group P")->capture_default_str();
  train->add_option("--forms", forms, "forms to train, e.g. explicit,absorbed,laga")->delimiter(',')->capture_default_str();
  train->add_option("--steps", steps, "optimizer steps")->capture_default_str();
  train->add_option("--lr", lr, "Adam learning rate")->capture_default_str();

  struct Pending {
    const char* name;
    const char* help;
    const char* issue;
  };
  const Pending pending[] = {{"plan", "memory and communication planned from the configuration", "issue 4"},
                             {"report", "the full report", "a later issue"}};
  for (const auto& p : pending) app.add_subcommand(p.name, p.help)->allow_extras();

  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
      return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
      return app.exit(e);
    } catch (const CLI::ParseError& e) {
      std::fprintf(stderr, "laga: %s\n", e.what());
      return 2;
    }
    if (run->parsed()) {
      if (!fault.empty()) set_injected_fault(fault);
      return cmd_run(flags, dump_dir, weights);
    }
    if (verify->parsed()) return cmd_verify(flags, sps);
    if (bench->parsed()) return cmd_bench(flags, seqs, forms, iters);
    if (train->parsed()) return cmd_train(flags, forms, steps, lr);
    for (const auto& p : pending)
      if (app.got_subcommand(p.name)) LAGA_NOT_IMPLEMENTED("laga {} is not built yet ({})", p.name, p.issue);
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "laga: %s\n", e.what());
    return e.exit_status();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "laga: internal error: %s\n", e.what());
    return 3;
  }
}
