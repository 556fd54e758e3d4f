// laga bench-comm: laga's own collectives timed in the manner of nccl-tests, over the same
// Communicator the forms use, so the rows measure what the model's traffic meets (threads in one
// process, or MPI processes under mpirun, e.g. across the emulated link of scripts/link.sh).
//
// Per op, dtype and size (the sweep -b, -b·f, ... ≤ -e): the input filled with bench_comm::pattern,
// W warm-up iterations, then N timed ones. Every iteration starts after a barrier and is timed on
// each rank with a steady clock around the blocking call (start + wait); the iteration's time is the
// slowest rank's (nccl-tests reports the slowest rank). Rows give the median over iterations, and the
// minimum and maximum in JSON. Before the last timed iteration the output is poisoned (NaN, guards
// after it); after it every element is checked against the expected result (bench_comm_check.cpp)
// and #wrong is the group's count of wrong elements. Any #wrong > 0 ends with exit status 1.
// Conventions of sizes and bandwidths: bench_comm.hpp and docs/throughput.md.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "bench_comm.hpp"
#include "cli.hpp"
#include "commands.hpp"
#include "laga/core/bytes.hpp"
#include "laga/core/error.hpp"
#include "laga/core/machine.hpp"
#include "laga/driver/launch.hpp"

namespace laga::cli {

namespace {

using namespace bench_comm;

struct Row {
  Shape shape;
  std::vector<double> times;  // per iteration, the slowest rank's seconds
  int64_t wrong = 0;          // over the group
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Buffers of whole 8-byte words, so that fp32 and bf16 elements are aligned.
std::vector<uint64_t> buffer(int64_t elems, DType dtype) {
  return std::vector<uint64_t>(size_t((elems * dtype_size(dtype) + 7) / 8));
}

void issue(Communicator& comm, const Shape& s, const void* in, void* out) {
  switch (s.op) {
    case CollectiveOp::all_gather: comm.all_gather(in, out, s.n, s.dtype, "bench"); break;
    case CollectiveOp::reduce_scatter: comm.reduce_scatter(in, out, s.n, s.dtype, "bench"); break;
    case CollectiveOp::all_to_all: comm.all_to_all(in, out, s.n, s.dtype, "bench"); break;
    case CollectiveOp::all_reduce: comm.all_reduce(out, s.n, s.dtype, "bench"); break;
    case CollectiveOp::send_recv: comm.send_recv(in, out, s.n, s.dtype, "bench"); break;
    default: LAGA_ASSERT(false, "bench-comm cannot issue {}", collective_name(s.op));
  }
}

// One row on this rank of the group; the times and #wrong of the whole group on every rank.
Row time_collective(Communicator& comm, const Shape& s, int64_t iters, int64_t warmup) {
  const int rank = comm.rank();
  const bool in_place = s.op == CollectiveOp::all_reduce;
  std::vector<uint64_t> in = in_place ? std::vector<uint64_t>() : buffer(s.in_elems, s.dtype);
  std::vector<uint64_t> out = buffer(s.out_elems + kGuard, s.dtype);
  // all_reduce sums in place: the buffer is refilled before every iteration (outside the timing).
  auto prepare = [&](bool poison) {
    if (in_place) {
      poison_output(s, out.data());
      fill_input(s, rank, out.data());
    } else if (poison) {
      poison_output(s, out.data());
    }
  };
  if (!in_place) fill_input(s, rank, in.data());
  for (int64_t w = 0; w < warmup; ++w) {
    prepare(false);
    comm.barrier();
    issue(comm, s, in.data(), out.data());
  }
  std::vector<double> mine;
  for (int64_t it = 0; it < iters; ++it) {
    prepare(it == iters - 1);
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    issue(comm, s, in.data(), out.data());
    mine.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const int64_t wrong = count_wrong(s, rank, out.data());
  const std::vector<nlohmann::json> all = gather_json(comm, {{"times", mine}, {"wrong", wrong}});
  Row row{s, std::vector<double>(size_t(iters), 0.0), 0};
  for (const auto& j : all) {
    const auto t = j.at("times").get<std::vector<double>>();
    for (size_t i = 0; i < t.size(); ++i) row.times[i] = std::max(row.times[i], t[i]);
    row.wrong += j.at("wrong").get<int64_t>();
  }
  comm.ledger().clear();
  return row;
}

// The group size when --sp is not given: the job's under mpirun, else 2.
int default_sp() {
  if (!under_mpi()) return 2;
  const char* world = std::getenv("OMPI_COMM_WORLD_SIZE");
  return world ? std::max(1, std::atoi(world)) : 2;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

}  // namespace

int cmd_bench_comm(const CommonFlags& f, const BenchCommFlags& b) {
  const std::vector<int64_t> sizes = size_sweep(parse_size(b.min_bytes, "-b"), parse_size(b.max_bytes, "-e"), b.factor);
  std::vector<CollectiveOp> ops;
  for (const auto& name : b.ops) ops.push_back(parse_op(name));
  std::vector<DType> dtypes;
  for (const auto& name : b.dtypes) dtypes.push_back(parse_dtype(name));
  const int P = b.sp > 0 ? int(b.sp) : default_sp();
  const LaunchKind kind = launch_kind(f.comm);
  // The largest row's buffers, on every rank this process holds (threads: all P), must fit.
  int64_t per_rank = 0;
  for (CollectiveOp op : ops)
    for (DType dtype : dtypes) {
      const Shape s = shape_for(op, dtype, P, sizes.back());
      const int64_t in = op == CollectiveOp::all_reduce ? 0 : s.in_elems;
      per_rank = std::max(per_rank, (in + s.out_elems + kGuard) * dtype_size(dtype));
    }
  const int64_t here = kind == LaunchKind::mpi ? std::min<int64_t>(P, local_ranks()) : P;
  LAGA_CHECK(per_rank * here <= available_memory_bytes(),
             "-e {}: {} rank(s) in this process need {} of buffers, more than the {} available; give a smaller -e",
             b.max_bytes, here, human_bytes(per_rank * here), human_bytes(available_memory_bytes()));
  auto json_out = is_root_process() ? open_output(f.json_path, "--json") : nullptr;
  const std::string link = link_description(kind == LaunchKind::mpi);
  const MachineInfo machine = machine_info();

  std::vector<Row> rows;  // on the root
  std::atomic<int64_t> group_wrong{0};
  std::string backend;
  const bool root = launch(kind, [&](Launcher& launcher) {
    backend = launcher.backend();
    const bool report = launcher.is_root();
    launcher.run(P, [&](Communicator& comm) {
      const bool prints = report && comm.rank() == 0;
      if (prints) {
        fmt::print("laga bench-comm: P {} ({}), {} timed iterations after {} warm-up, each the slowest rank's time\n",
                   P, backend, b.iters, b.warmup);
        fmt::print("# machine: {}\n", machine.line());
        fmt::print("# backend: {}, P {}, dtype {}\n", backend, P, join(b.dtypes));
        fmt::print("# link: {}\n", link);
        fmt::print("# {:<15} {:<5} {:>12} {:>12} {:>10} {:>9} {:>9} {:>7}\n", "op", "dtype", "size", "count", "time",
                   "algbw", "busbw", "#wrong");
        fmt::print("# {:<15} {:<5} {:>12} {:>12} {:>10} {:>9} {:>9} {:>7}\n", "", "", "(B)", "(elements)", "(us)",
                   "(GB/s)", "(GB/s)", "");
        std::fflush(stdout);
      }
      int64_t wrong = 0;
      for (CollectiveOp op : ops)
        for (DType dtype : dtypes)
          for (int64_t bytes : sizes) {
            const Row row = time_collective(comm, shape_for(op, dtype, P, bytes), b.iters, b.warmup);
            wrong += row.wrong;
            if (!prints) continue;
            const double t = median(row.times);
            const double algbw = double(row.shape.bytes) / t / 1e9;
            fmt::print("  {:<15} {:<5} {:>12} {:>12} {:>10.2f} {:>9.4g} {:>9.4g} {:>7}\n", collective_name(op),
                       dtype_name(dtype), row.shape.bytes, row.shape.count, t * 1e6, algbw,
                       algbw * busbw_factor(op, P), row.wrong);
            std::fflush(stdout);
            rows.push_back(row);
          }
      group_wrong.store(wrong);  // the same group-wide count on every rank
    }, f.timeout_s);
  });

  const int64_t wrong = group_wrong.load();
  if (!root) return wrong > 0 ? 1 : 0;
  fmt::print("# #wrong total: {}{}\n", wrong, wrong > 0 ? " — FAIL: a collective gave a wrong result" : "");
  if (json_out) {
    nlohmann::json jrows = nlohmann::json::array();
    for (const Row& r : rows) {
      const double t = median(r.times);
      const double algbw = double(r.shape.bytes) / t / 1e9;
      jrows.push_back({{"op", collective_name(r.shape.op)},
                       {"dtype", dtype_name(r.shape.dtype)},
                       {"bytes", r.shape.bytes},
                       {"count", r.shape.count},
                       {"time_s", t},
                       {"time_s_min", *std::min_element(r.times.begin(), r.times.end())},
                       {"time_s_max", *std::max_element(r.times.begin(), r.times.end())},
                       {"algbw_GBps", algbw},
                       {"busbw_GBps", algbw * busbw_factor(r.shape.op, P)},
                       {"wrong", r.wrong}});
    }
    const nlohmann::json j = {{"command", "bench-comm"}, {"machine", machine.to_json()}, {"backend", backend},
                              {"sp", P},          {"link", link},  {"iters", b.iters},
                              {"warmup", b.warmup}, {"rows", jrows}};
    *json_out << j.dump(2) << "\n";
  }
  return wrong > 0 ? 1 : 0;
}

}  // namespace laga::cli
