// laga run: one measured forward + backward of the block stack on P ranks, in one form.
#include <fmt/format.h>

#include "cli.hpp"
#include "commands.hpp"
#include "laga/core/error.hpp"
#include "laga/comm/stand_in.hpp"
#include "laga/core/bytes.hpp"
#include "laga/io/checkpoint.hpp"
#include "laga/driver/launch.hpp"
#include "laga/driver/plan.hpp"

namespace laga::cli {

namespace {

void report(const MlaConfig& c, const std::vector<nlohmann::json>& ranks, const RankResult& r0, std::ofstream* json_out,
            const std::string& dump_dir, const std::string& backend) {
  fmt::print("laga run: model {} T {} B {} P {} ({}) L {} form {} kernel {} dtype {}\n", c.model, c.seq_len,
             c.batch, c.sp, backend, c.num_layers, c.form, kernel_name(c.kernel), dtype_name(c.dtype));
  fmt::print("# {:>4} {:>9} {:>9} {:>14} {:>14} {:>16} {:>16}\n", "rank", "fwd", "bwd", "comm tensor", "comm wire",
             "activation peak", "saved");
  fmt::print("# {:>4} {:>9} {:>9} {:>14} {:>14} {:>16} {:>16}\n", "", "s", "s", "bytes", "bytes", "bytes", "bytes");
  for (const auto& r : ranks)
    fmt::print("  {:>4} {:>9.4f} {:>9.4f} {:>14} {:>14} {:>16} {:>16}\n", r["rank"].get<int>(), r["fwd_s"].get<double>(),
               r["bwd_s"].get<double>(), r["comm"]["tensor_bytes"].get<int64_t>(),
               r["comm"]["wire_bytes"].get<int64_t>(), r["activation_peak_bytes"].get<int64_t>(),
               r["saved_bytes"].get<int64_t>());
  fmt::print("  rank {}: activation peak {}, saved {}, baseline {}\n", r0.rank,
             human_bytes(r0.memory.activation_peak_bytes), human_bytes(r0.memory.saved_bytes),
             human_bytes(r0.memory.baseline_bytes));
  if (!dump_dir.empty()) {
    write_dump(dump_dir, c, r0.x, r0.dy, r0.y, r0.dx, r0.weights, r0.grads);
    fmt::print("  dumped whole tensors to {}\n", dump_dir);
  }
  if (json_out) {
    nlohmann::json j = {{"command", "run"}, {"form", find_form(c.form).family()}, {"variant", c.form}, {"sp", c.sp},
                        {"backend", backend},
                        {"config", c.to_json()}, {"ranks", ranks}};
    *json_out << j.dump(2) << "\n";
  }
}

}  // namespace

int cmd_run(const CommonFlags& f, const std::string& dump_dir, const std::string& weights, const std::string& mem_limit,
            int64_t stand_in) {
  const Config cfg = build_config(f);
  const MlaConfig& c = *cfg;
  const LaunchKind kind = stand_in >= 0 ? LaunchKind::stand_in : launch_kind(f.comm);
  // Refused before anything is allocated: this process holds every rank (threads) or one.
  const PlannedMemory plan = plan_memory(cfg);
  const bool mpi = kind == LaunchKind::mpi;
  check_mem_limit(plan, kind == LaunchKind::threads ? c.sp : 1,
                  mem_limit.empty() ? available_memory_bytes() / (mpi ? local_ranks() : 1) : parse_bytes(mem_limit),
                  mem_limit.empty() ? "available memory" : "--mem-limit " + mem_limit);
  RunOptions opt;
  opt.seed = f.seed;
  opt.weights_path = weights;
  opt.gather_tensors = !dump_dir.empty();
  launch(
      kind,
      [&](Launcher& launcher) {
        std::unique_ptr<std::ofstream> json_out;
        std::vector<nlohmann::json> ranks;
        RankResult r0;
        launcher.run(int(c.sp), [&](Communicator& comm) {
          if (mpi) check_same_everywhere(comm, "configurations", c.to_json().dump() + weights + std::to_string(f.seed));
          const bool reporter = kind == LaunchKind::stand_in || comm.rank() == 0;
          if (reporter) {  // outputs fail before the run, not after it
            json_out = open_output(f.json_path, "--json");
            if (!dump_dir.empty()) check_writable_dir(dump_dir);
          }
          comm.barrier();
          RankResult r = run_rank(cfg, opt, comm);
          // A stand-in plays one rank: there are no others to gather from.
          std::vector<nlohmann::json> all =
              kind == LaunchKind::stand_in ? std::vector<nlohmann::json>{rank_json(r, plan)} : gather_json(comm, rank_json(r, plan));
          if (reporter) ranks = std::move(all), r0 = std::move(r);
        }, f.timeout_s);
        if (launcher.is_root()) report(c, ranks, r0, json_out.get(), dump_dir, launcher.backend());
      },
      int(std::max<int64_t>(stand_in, 0)));
  return 0;
}

}  // namespace laga::cli
