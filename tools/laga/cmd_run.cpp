// laga run: one measured forward + backward of the block stack on P ranks, in one form.
#include <fmt/format.h>

#include "cli.hpp"
#include "commands.hpp"
#include "laga/core/error.hpp"
#include "laga/comm/stand_in.hpp"
#include "laga/core/bytes.hpp"
#include "laga/io/checkpoint.hpp"
#include "laga/mla/planner.hpp"

namespace laga::cli {

namespace {

void report(const MlaConfig& c, const std::vector<nlohmann::json>& ranks, const RankResult& r0, std::ofstream* json_out,
            const std::string& dump_dir, const std::string& backend) {
  fmt::print("laga run: model {} T {} B {} P {} ({}) L {} form {}{} kernel {} dtype {}\n", c.model, c.seq_len,
             c.batch, c.sp, backend, c.num_layers, form_name(c.form),
             c.form == Form::absorbed ? fmt::format(" ({})", absorbed_kv_name(c.absorbed_kv)) : "",
             kernel_name(c.kernel), dtype_name(c.dtype));
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
    nlohmann::json j = {{"command", "run"}, {"form", form_name(c.form)}, {"sp", c.sp}, {"backend", backend},
                        {"config", c.to_json()}, {"ranks", ranks}};
    *json_out << j.dump(2) << "\n";
  }
}

}  // namespace

int cmd_run(const CommonFlags& f, const std::string& dump_dir, const std::string& weights, const std::string& mem_limit,
            int64_t stand_in) {
  MlaConfig c = build_config(f);
  const bool mpi = use_mpi(f.comm);
  // Refused before anything is allocated: this process holds every rank (threads) or one (MPI).
  const PlannedMemory plan = plan_memory(c);
  const int64_t ranks_here = mpi || stand_in >= 0 ? 1 : c.sp;
  check_mem_limit(plan, ranks_here, mem_limit.empty() ? available_memory_bytes() / (mpi ? local_ranks() : 1)
                                                      : parse_bytes(mem_limit),
                  mem_limit.empty() ? "available memory" : "--mem-limit " + mem_limit);
  RunOptions opt;
  opt.seed = f.seed;
  opt.weights_path = weights;
  opt.gather_tensors = !dump_dir.empty();
  if (stand_in >= 0) {
    auto json_out = open_output(f.json_path, "--json");
    StandInCommunicator comm(int(stand_in), int(c.sp));
    comm.set_timeout(f.timeout_s);
    RankResult r = run_rank(c, opt, comm);
    report(c, {rank_json(r, plan)}, r, json_out.get(), "", fmt::format("stand-in for rank {}", stand_in));
    return 0;
  }
  if (!mpi) {
    auto json_out = open_output(f.json_path, "--json");
    if (!dump_dir.empty()) check_writable_dir(dump_dir);
    std::vector<RankResult> results = run_group(c, opt, f.timeout_s);
    std::vector<nlohmann::json> ranks;
    for (const auto& r : results) ranks.push_back(rank_json(r, plan));
    report(c, ranks, results[0], json_out.get(), dump_dir, "threads");
    return 0;
  }
  return run_mpi(
      [&](Communicator& comm) {
        LAGA_CHECK(comm.size() == c.sp, "--sp {} but mpirun started {} ranks; use mpirun -np {} or --sp {}", c.sp,
                   comm.size(), c.sp, comm.size());
        check_same_everywhere(comm, "configurations", c.to_json().dump() + weights + std::to_string(f.seed));
        std::unique_ptr<std::ofstream> json_out;
        if (comm.rank() == 0) {
          json_out = open_output(f.json_path, "--json");
          if (!dump_dir.empty()) check_writable_dir(dump_dir);
        }
        comm.barrier();
        RankResult r = run_rank(c, opt, comm);
        auto ranks = gather_json(comm, rank_json(r, plan));
        if (comm.rank() == 0) report(c, ranks, r, json_out.get(), dump_dir, "mpi");
      },
      f.timeout_s);
}

}  // namespace laga::cli
