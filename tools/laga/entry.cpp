// The CLI as a function (entry.hpp). The command line is parsed and checked (the configuration
// built and validated) before any work, by parse.cpp; each subcommand then opens its output files
// up front. The subcommands live in cmd_*.cpp.
#include "entry.hpp"

#include "cli.hpp"
#include "commands.hpp"
#include "laga/comm/communicator.hpp"
#include "laga/core/error.hpp"
#include "laga/core/finite.hpp"
#include "laga/core/isa.hpp"
#include "laga/core/memory.hpp"
#include "parse.hpp"

namespace laga::cli {

int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  Invocation inv;
  if (auto status = parse_args(argc, argv, inv, out, err)) return *status;
  try {
    check_allocator_environment();
    apply_isa_cap();  // LAGA_MAX_ISA checked and applied before any work
    check_invocation(inv);
    const CommonFlags& flags = inv.flags;
    set_check_finite(flags.check_finite);
    set_mpi_progress_interval(flags.mpi_progress_us * 1e-6);
    if (inv.command == "run")
      return cmd_run(flags, inv.dump_dir, inv.weights, inv.mem_limit, inv.stand_in);
    if (inv.command == "plan") return cmd_plan(flags, inv.sweep, inv.mem_limit);
    if (inv.command == "verify") return cmd_verify(flags, inv.sps, inv.mem_limit);
    if (inv.command == "bench")
      return cmd_bench(flags, {inv.seqs, inv.forms, inv.iters, inv.warmup, !inv.no_validate,
                               inv.inject_wrong, inv.profile, inv.mem_limit});
    if (inv.command == "report") return cmd_report(inv.out_dir, inv.quick);
    if (inv.command == "bench-comm") return cmd_bench_comm(flags, inv.bench_comm);
    if (inv.command == "model") return cmd_model(flags, inv.model);
    if (inv.command == "train")
      return cmd_train(
          flags, inv.forms, inv.steps, inv.lr,
          {inv.checkpoint_dir, inv.resume_dir, inv.dump_weights, inv.checkpoint_every});
    return 2;
  } catch (const Error& e) {
    err << "laga: " << e.what() << "\n" << std::flush;
    return e.exit_status();
  } catch (const std::exception& e) {
    err << "laga: internal error: " << e.what() << "\n" << std::flush;
    return 3;
  }
}

}  // namespace laga::cli
