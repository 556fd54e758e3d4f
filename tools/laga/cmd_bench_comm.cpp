// laga bench-comm: laga's own collectives timed in the manner of nccl-tests, over the same
// Communicator the forms use, so the rows measure what the model's traffic meets (threads in one
// process, or MPI processes under mpirun, e.g. across the emulated link of scripts/link.sh).
//
// Per op, dtype and size (the sweep -b, -b·f, ... ≤ -e): the input filled with bench_comm::pattern,
// W warm-up iterations, then N timed ones. Every iteration starts after a barrier and is timed on
// each rank with a steady clock around the blocking call (start + wait); the iteration's time is
// the slowest rank's (nccl-tests reports the slowest rank). Rows give the median over iterations,
// and the minimum and maximum in JSON. Before the last timed iteration the output is poisoned (NaN,
// guards after it); after it every element is checked against the expected result
// (bench_comm_check.cpp) and #wrong is the group's count of wrong elements. Any #wrong > 0 ends
// with exit status 1. Conventions of sizes and bandwidths: bench_comm.hpp and docs/throughput.md.
//
// --host-cost: per op at the largest size, what its bytes take from compute running beside it (the
// model's host_ns_per_byte, docs/model.md §1). A fixed amount of compute (fp32 products, repeated
// to last about 3× the collective's median time) is timed alone and with the collective issued just
// before it (non-blocking) and waited after it, in turns, N times each; host_ns_per_byte = (median
// with − median alone, each iteration the slowest rank's) / the bytes each rank sends. "exposed" is
// the median wait after the compute: near 0 when the collective was hidden, as the reading assumes.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "bench_comm.hpp"
#include "cli.hpp"
#include "commands.hpp"
#include "laga/core/bytes.hpp"
#include "laga/core/error.hpp"
#include "laga/core/machine.hpp"
#include "laga/driver/launch.hpp"
#include "laga/ops/matmul.hpp"

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

CollectiveHandle issue_start(Communicator& comm, const Shape& s, const void* in, void* out) {
  switch (s.op) {
    case CollectiveOp::all_gather:
      return comm.all_gather_start(in, out, s.n, s.dtype, "bench");
    case CollectiveOp::reduce_scatter:
      return comm.reduce_scatter_start(in, out, s.n, s.dtype, "bench");
    case CollectiveOp::all_to_all:
      return comm.all_to_all_start(in, out, s.n, s.dtype, "bench");
    case CollectiveOp::all_reduce:
      return comm.all_reduce_start(out, s.n, s.dtype, "bench");
    case CollectiveOp::send_recv:
      return comm.send_recv_start(in, out, s.n, s.dtype, "bench");
    default:
      LAGA_ASSERT(false, "bench-comm cannot issue {}", collective_name(s.op));
  }
  return {};
}

// The blocking call: start + wait, as the Communicator's own blocking calls are.
void issue(Communicator& comm, const Shape& s, const void* in, void* out) {
  CollectiveHandle h = issue_start(comm, s, in, out);
  comm.wait(h);
}

// Per iteration the slowest rank's time of all[rank][key] (gather_json's per-rank lists of times).
std::vector<double> slowest_per_iteration(const std::vector<nlohmann::json>& all, const char* key,
                                          int64_t iters) {
  std::vector<double> v(size_t(iters), 0.0);
  for (const auto& j : all) {
    const auto t = j.at(key).get<std::vector<double>>();
    for (size_t i = 0; i < t.size(); ++i) v[i] = std::max(v[i], t[i]);
  }
  return v;
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
  Row row{s, slowest_per_iteration(all, "times", iters), 0};
  for (const auto& j : all) row.wrong += j.at("wrong").get<int64_t>();
  comm.ledger().clear();
  return row;
}

struct HostCost {
  Shape shape;
  double wire_bytes = 0;  // what each rank sends: S · bus factor
  // the compute: this many [256, 512] × [512, 512] fp32 products
  int64_t products = 0;
  double alone_s = 0, beside_s = 0, exposed_s = 0;  // medians of the slowest rank's
  double ns_per_byte() const { return (beside_s - alone_s) / wire_bytes * 1e9; }
};

// --host-cost on this rank of the group; the group's medians on every rank.
HostCost measure_host_cost(Communicator& comm, const Shape& s, double collective_s, int64_t iters) {
  const int rank = comm.rank();
  const bool in_place = s.op == CollectiveOp::all_reduce;
  std::vector<uint64_t> in = in_place ? std::vector<uint64_t>() : buffer(s.in_elems, s.dtype);
  std::vector<uint64_t> out = buffer(s.out_elems + kGuard, s.dtype);
  poison_output(s, out.data());  // the guards after the output, checked at the end
  if (!in_place) fill_input(s, rank, in.data());
  constexpr int64_t M = 256, K = 512, N = 512;
  std::vector<float> a(size_t(M * K), 0.5f), w(size_t(K * N), 0.25f), c(size_t(M * N));
  auto products = [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      matmul_2d({a.data(), M, K, K, DType::f32}, {w.data(), K, N, N, DType::f32},
                {c.data(), M, N, N, DType::f32});
  };
  auto now = [] { return std::chrono::steady_clock::now(); };
  auto since = [&](auto t0) { return std::chrono::duration<double>(now() - t0).count(); };
  products(4);  // warm: oneDNN's primitive and the pages
  auto t0 = now();
  products(8);
  const double one = since(t0) / 8;
  int64_t n = std::max<int64_t>(8, int64_t(std::ceil(3 * collective_s / std::max(one, 1e-6))));
  // rank 0's count on every rank: the same work everywhere
  n = gather_json(comm, n)[0].get<int64_t>();
  std::vector<double> alone, with, exposed;
  for (int64_t it = 0; it < iters; ++it)
    for (int k = 0; k < 2; ++k) {
      const bool beside = (k == 0) == (it % 2 == 1);  // in turns, the order alternating
      if (in_place) fill_input(s, rank, out.data());
      comm.barrier();
      t0 = now();
      if (!beside) {
        products(n);
        alone.push_back(since(t0));
        continue;
      }
      CollectiveHandle h = issue_start(comm, s, in.data(), out.data());
      products(n);
      with.push_back(since(t0));
      const auto t1 = now();
      comm.wait(h);
      exposed.push_back(since(t1));
    }
  const int64_t wrong = count_wrong(s, rank, out.data());
  LAGA_CHECK(in_place || wrong == 0, "bench-comm --host-cost: {} gave {} wrong elements on rank {}",
             collective_name(s.op), wrong, rank);
  const auto all = gather_json(comm, {{"alone", alone}, {"with", with}, {"exposed", exposed}});
  auto slowest = [&](const char* key) { return median(slowest_per_iteration(all, key, iters)); };
  comm.ledger().clear();
  return {s,
          double(s.bytes) * busbw_factor(s.op, s.P),
          n,
          slowest("alone"),
          slowest("with"),
          slowest("exposed")};
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

// Usage error when the largest row's buffers, on every rank this process holds (threads: all P), do
// not fit.
void check_buffers_fit(const std::vector<CollectiveOp>& ops, const std::vector<DType>& dtypes,
                       int P, int64_t largest, LaunchKind kind, const std::string& max_bytes) {
  int64_t per_rank = 0;
  for (CollectiveOp op : ops)
    for (DType dtype : dtypes) {
      const Shape s = shape_for(op, dtype, P, largest);
      const int64_t in = op == CollectiveOp::all_reduce ? 0 : s.in_elems;
      per_rank = std::max(per_rank, (in + s.out_elems + kGuard) * dtype_size(dtype));
    }
  const int64_t here = kind == LaunchKind::mpi ? std::min<int64_t>(P, local_ranks()) : P;
  LAGA_CHECK(per_rank * here <= available_memory_bytes(),
             "-e {}: {} rank(s) in this process need {} of buffers, more than the {} available; "
             "give a smaller -e",
             max_bytes, here, human_bytes(per_rank * here), human_bytes(available_memory_bytes()));
}

void print_header(const BenchCommFlags& b, int P, const std::string& backend,
                  const MachineInfo& machine, const std::string& link) {
  fmt::print(
      "laga bench-comm: P {} ({}), {} timed iterations after {} warm-up, each the slowest rank's "
      "time\n",
      P, backend, b.iters, b.warmup);
  fmt::print("# machine: {}\n", machine.line());
  fmt::print("# backend: {}, P {}, dtype {}\n", backend, P, join(b.dtypes));
  fmt::print("# link: {}\n", link);
  fmt::print("# {:<15} {:<5} {:>12} {:>12} {:>10} {:>9} {:>9} {:>7}\n", "op", "dtype", "size",
             "count", "time", "algbw", "busbw", "#wrong");
  fmt::print("# {:<15} {:<5} {:>12} {:>12} {:>10} {:>9} {:>9} {:>7}\n", "", "", "(B)", "(elements)",
             "(us)", "(GB/s)", "(GB/s)", "");
  std::fflush(stdout);
}

void print_host_cost_header(const BenchCommFlags& b) {
  fmt::print(
      "# host cost: fixed compute (fp32 [256, 512] x [512, 512] products) alone and beside the "
      "collective, "
      "median of {} each, the slowest rank's\n",
      b.iters);
  static constexpr char h[] = "# {:<15} {:<5} {:>12} {:>9} {:>10} {:>10} {:>10} {:>12}\n";
  fmt::print(h, "op", "dtype", "size", "products", "alone", "beside", "exposed", "host cost");
  fmt::print(h, "", "", "(B)", "", "(ms)", "(ms)", "(ms)", "(ns/B sent)");
}

nlohmann::json bench_comm_json(const BenchCommFlags& b, int P, const std::string& backend,
                               const MachineInfo& machine, const std::string& link,
                               const std::vector<Row>& rows, const std::vector<HostCost>& costs) {
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
  nlohmann::json j = {{"command", "bench-comm"},
                      {"machine", machine.to_json()},
                      {"backend", backend},
                      {"sp", P},
                      {"link", link},
                      {"iters", b.iters},
                      {"warmup", b.warmup},
                      {"rows", jrows}};
  if (b.host_cost) {
    j["host_cost"] = nlohmann::json::array();
    for (const HostCost& h : costs)
      j["host_cost"].push_back({{"op", collective_name(h.shape.op)},
                                {"dtype", dtype_name(h.shape.dtype)},
                                {"bytes", h.shape.bytes},
                                {"wire_bytes", h.wire_bytes},
                                {"products", h.products},
                                {"alone_s", h.alone_s},
                                {"beside_s", h.beside_s},
                                {"exposed_s", h.exposed_s},
                                {"host_ns_per_byte", h.ns_per_byte()}});
  }
  return j;
}

}  // namespace

int cmd_bench_comm(const CommonFlags& f, const BenchCommFlags& b) {
  const std::vector<int64_t> sizes =
      size_sweep(parse_size(b.min_bytes, "-b"), parse_size(b.max_bytes, "-e"), b.factor);
  std::vector<CollectiveOp> ops;
  for (const auto& name : b.ops) ops.push_back(parse_op(name));
  std::vector<DType> dtypes;
  for (const auto& name : b.dtypes) dtypes.push_back(parse_dtype(name));
  const int P = b.sp > 0 ? int(b.sp) : default_sp();
  const LaunchKind kind = launch_kind(f.comm);
  check_buffers_fit(ops, dtypes, P, sizes.back(), kind, b.max_bytes);
  auto json_out = is_root_process() ? open_output(f.json_path, "--json") : nullptr;
  const std::string link = link_description(kind);
  const MachineInfo machine = machine_info();

  std::vector<Row> rows;  // on the root
  std::vector<HostCost> costs;
  std::atomic<int64_t> group_wrong{0};
  std::string backend;
  const bool root = launch(kind, [&](Launcher& launcher) {
    backend = launcher.backend();
    const bool report = launcher.is_root();
    launcher.run(
        P,
        [&](Communicator& comm) {
          const bool prints = report && comm.rank() == 0;
          if (prints) print_header(b, P, backend, machine, link);
          int64_t wrong = 0;
          // per op, the median at the largest size and first dtype (--host-cost)
          std::map<CollectiveOp, double> largest_s;
          for (CollectiveOp op : ops)
            for (DType dtype : dtypes)
              for (int64_t bytes : sizes) {
                const Row row =
                    time_collective(comm, shape_for(op, dtype, P, bytes), b.iters, b.warmup);
                wrong += row.wrong;
                // the group's, on every rank
                if (dtype == dtypes.front() && bytes == sizes.back())
                  largest_s[op] = median(row.times);
                if (!prints) continue;
                const double t = median(row.times);
                const double algbw = double(row.shape.bytes) / t / 1e9;
                fmt::print("  {:<15} {:<5} {:>12} {:>12} {:>10.2f} {:>9.4g} {:>9.4g} {:>7}\n",
                           collective_name(op), dtype_name(dtype), row.shape.bytes, row.shape.count,
                           t * 1e6, algbw, algbw * busbw_factor(op, P), row.wrong);
                std::fflush(stdout);
                rows.push_back(row);
              }
          if (b.host_cost) {
            if (prints) print_host_cost_header(b);
            for (CollectiveOp op : ops) {
              const Shape s = shape_for(op, dtypes.front(), P, sizes.back());
              const HostCost hc = measure_host_cost(comm, s, largest_s.at(op), b.iters);
              if (!prints) continue;
              fmt::print("  {:<15} {:<5} {:>12} {:>9} {:>10.3f} {:>10.3f} {:>10.3f} {:>12.3g}\n",
                         collective_name(op), dtype_name(s.dtype), s.bytes, hc.products,
                         hc.alone_s * 1e3, hc.beside_s * 1e3, hc.exposed_s * 1e3, hc.ns_per_byte());
              std::fflush(stdout);
              costs.push_back(hc);
            }
          }
          group_wrong.store(wrong);  // the same group-wide count on every rank
        },
        f.timeout_s);
  });

  const int64_t wrong = group_wrong.load();
  if (!root) return wrong > 0 ? 1 : 0;
  fmt::print("# #wrong total: {}{}\n", wrong,
             wrong > 0 ? " — FAIL: a collective gave a wrong result" : "");
  if (json_out)
    *json_out << bench_comm_json(b, P, backend, machine, link, rows, costs).dump(2) << "\n";
  return wrong > 0 ? 1 : 0;
}

}  // namespace laga::cli
