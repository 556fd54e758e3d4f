// laga run: one measured forward + backward of the block stack on P ranks, in one form.
#include <fmt/format.h>

#include <algorithm>

#include "cli.hpp"
#include "commands.hpp"
#include "laga/core/error.hpp"
#include "laga/comm/stand_in.hpp"
#include "laga/io/checkpoint.hpp"
#include "laga/driver/launch.hpp"
#include "laga/driver/plan.hpp"

namespace laga::cli {

namespace {

// One rank's attention collectives summed per (operation, tensor) over layers, in first-issue
// order: seconds from issue to completion, exposed (the caller waited) and hidden (the rest:
// compute ran).
void print_collectives(const nlohmann::json& rank, bool overlap) {
  struct Sum {
    std::string name;
    int count = 0;
    double seconds = 0, exposed = 0, hidden = 0;
  };
  std::vector<Sum> sums;
  for (const auto& r : rank["comm"]["collectives"]) {
    const std::string name = r["op"].get<std::string>() + " " + r["tensor"].get<std::string>();
    auto it = std::find_if(sums.begin(), sums.end(), [&](const Sum& s) { return s.name == name; });
    if (it == sums.end()) it = sums.insert(sums.end(), Sum{name});
    it->count += 1;
    it->seconds += r["seconds"].get<double>();
    it->exposed += r["wait_s"].get<double>();
    it->hidden += r["hidden_s"].get<double>();
  }
  fmt::print(
      "  rank {} collectives, all layers (overlap {}): exposed = waited for, hidden = ran behind "
      "compute\n",
      rank["rank"].get<int>(), overlap ? "on" : "off");
  fmt::print("# {:<24} {:>5} {:>10} {:>10} {:>10} {:>7}\n", "collective", "count", "seconds",
             "exposed", "hidden", "hidden");
  fmt::print("# {:<24} {:>5} {:>10} {:>10} {:>10} {:>7}\n", "", "", "s", "s", "s", "%");
  for (const Sum& s : sums)
    fmt::print("  {:<24} {:>5} {:>10.6f} {:>10.6f} {:>10.6f} {:>7.1f}\n", s.name, s.count,
               s.seconds, s.exposed, s.hidden, s.seconds > 0 ? 100 * s.hidden / s.seconds : 0.0);
}

void report(const MlaConfig& c, const std::vector<nlohmann::json>& ranks, const RankResult& r0,
            std::ofstream* json_out, const std::string& dump_dir, const std::string& backend) {
  const std::string_view own = kernel_instead(form_of(c), c.kernel);
  const std::string kernel = own.empty()
                                 ? std::string(kernel_name(c.kernel))
                                 : fmt::format("{} (the form's own; --kernel {} does not apply)",
                                               own, kernel_name(c.kernel));
  fmt::print(
      "laga run: model {}{} T {} B {} P {} ({}) L {} form {} kernel {} dtype {} overlap {}\n",
      c.model, attention_only_note(c), c.seq_len, c.batch, c.sp, backend, c.num_layers,
      displayed_form(c), kernel, dtype_name(c.dtype), c.overlap ? "on" : "off");
  fmt::print("# {:>4} {:>9} {:>9} {:>14} {:>14} {:>16} {:>16}\n", "rank", "fwd", "bwd",
             "comm tensor", "comm wire", "activation peak", "saved");
  fmt::print("# {:>4} {:>9} {:>9} {:>14} {:>14} {:>16} {:>16}\n", "", "s", "s", "bytes", "bytes",
             "bytes", "bytes");
  for (const auto& r : ranks)
    fmt::print("  {:>4} {:>9.4f} {:>9.4f} {:>14} {:>14} {:>16} {:>16}\n", r["rank"].get<int>(),
               r["fwd_s"].get<double>(), r["bwd_s"].get<double>(),
               r["comm"]["tensor_bytes"].get<int64_t>(), r["comm"]["wire_bytes"].get<int64_t>(),
               r["activation_peak_bytes"].get<int64_t>(), r["saved_bytes"].get<int64_t>());
  fmt::print("  rank {}: activation peak {}, saved {}, baseline {}\n", r0.rank,
             human_bytes(r0.memory.activation_peak_bytes), human_bytes(r0.memory.saved_bytes),
             human_bytes(r0.memory.baseline_bytes));
  const PoolStats pool = pool_stats();  // this process: every rank under threads, rank 0 under MPI
  if (pool.enabled)
    fmt::print(
        "  caching allocator (this process, beside the tracked bytes above): reserved peak {}, "
        "cached now {}, "
        "{} of {} large allocations reused\n",
        human_bytes(pool.peak_reserved_bytes), human_bytes(pool.cached_bytes), pool.hits,
        pool.hits + pool.misses);
  else
    fmt::print("  caching allocator: off (LAGA_ALLOC_CACHE=off)\n");
  if (!ranks.empty()) print_collectives(ranks.front(), c.overlap);
  // The sparse forms: the indexer's loss per layer, summed over the ranks' queries
  nlohmann::json indexer_loss;
  if (!ranks.empty() && ranks.front().contains("indexer_loss")) {
    indexer_loss = nlohmann::json::array();
    for (size_t l = 0; l < ranks.front()["indexer_loss"].size(); ++l) {
      double sum = 0;
      for (const auto& r : ranks) sum += r["indexer_loss"][l].get<double>();
      indexer_loss.push_back(sum);
    }
    std::string list;
    for (const auto& v : indexer_loss) list += fmt::format(" {:.6g}", v.get<double>());
    fmt::print("  indexer loss L_I per layer (stage {}, scale {:g}):{}\n",
               indexer_stage_name(c.indexer_stage), c.indexer_loss_scale, list);
  }
  if (!dump_dir.empty()) {
    write_dump(dump_dir, c, r0.x, r0.dy, r0.y, r0.dx, r0.weights, r0.grads, r0.topk);
    fmt::print("  dumped whole tensors to {}\n", dump_dir);
  }
  if (json_out) {
    nlohmann::json j = {{"command", "run"},
                        {"form", find_form(c.form).family()},
                        {"variant", c.form},
                        {"sp", c.sp},
                        {"backend", backend},
                        {"config", c.to_json()},
                        {"ranks", ranks},
                        {"indexer_loss", indexer_loss},
                        {"allocator",
                         {{"cache", pool.enabled},
                          {"process", backend == "mpi" ? "rank 0's" : "all ranks'"},
                          {"peak_reserved_bytes", pool.peak_reserved_bytes},
                          {"cached_bytes", pool.cached_bytes},
                          {"reused", pool.hits},
                          {"large_allocations", pool.hits + pool.misses}}}};
    *json_out << j.dump(2) << "\n";
  }
}

}  // namespace

int cmd_run(const CommonFlags& f, const std::string& dump_dir, const std::string& weights,
            const std::string& mem_limit, int64_t stand_in) {
  const Config cfg = build_config(f);
  const MlaConfig& c = *cfg;
  // The indexer's stage and loss are the sparse forms' alone: refused rather than ignored.
  if (!form_of(c).sparse() &&
      (!f.indexer_stage.empty() || f.indexer_loss_scale || !f.cp_layout.empty())) {
    std::string sparse;
    for (const Form* s : registered_forms())
      if (s->sparse()) sparse += (sparse.empty() ? "" : ", ") + std::string(s->name());
    const char* flag = !f.indexer_stage.empty() ? "indexer-stage"
                       : f.indexer_loss_scale   ? "indexer-loss-scale"
                                                : "cp-layout";
    LAGA_FAIL_USAGE(
        "--{} applies to the sparse forms ({}), not to form '{}', which ignores the indexer "
        "and has its own layout; try --form {}, or drop --{}",
        flag, sparse, c.form, sparse.substr(0, sparse.find(',')), flag);
  }
  const LaunchKind kind = stand_in >= 0 ? LaunchKind::stand_in : launch_kind(f.comm);
  // Refused before anything is allocated: this process holds every rank (threads) or one.
  const PlannedMemory plan = plan_memory(cfg);
  const bool mpi = kind == LaunchKind::mpi;
  const MemLimit limit = mem_limit_of(mem_limit, mpi);
  check_mem_limit(plan, kind == LaunchKind::threads ? c.sp : 1, limit.bytes, limit.source);
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
        launcher.run(
            int(c.sp),
            [&](Communicator& comm) {
              if (mpi)
                check_same_everywhere(comm, "configurations",
                                      c.to_json().dump() + weights + std::to_string(f.seed));
              const bool reporter = kind == LaunchKind::stand_in || comm.rank() == 0;
              if (reporter) {  // outputs fail before the run, not after it
                json_out = open_output(f.json_path, "--json");
                if (!dump_dir.empty()) check_writable_dir(dump_dir);
              }
              comm.barrier();
              RankResult r = run_rank(cfg, opt, comm);
              // A stand-in plays one rank: there are no others to gather from.
              std::vector<nlohmann::json> all =
                  kind == LaunchKind::stand_in ? std::vector<nlohmann::json>{rank_json(r, plan)}
                                               : gather_json(comm, rank_json(r, plan));
              if (reporter) ranks = std::move(all), r0 = std::move(r);
            },
            f.timeout_s);
        if (launcher.is_root()) report(c, ranks, r0, json_out.get(), dump_dir, launcher.backend());
      },
      int(std::max<int64_t>(stand_in, 0)));
  return 0;
}

}  // namespace laga::cli
