// laga_comm_check: drives the Communicator the same way under both backends so that
// tests/cli/comm_mpi.sh can show they agree bitwise, and injects faults to show a failing rank
// brings an MPI job down. Not a benchmark and not part of the laga CLI.
//
//   laga_comm_check --threads P [options]      P ranks as threads of this process
//   mpirun -np P laga_comm_check [options]     one rank per MPI process
// options:
//   --timeout S        collectives fail after waiting S seconds (MPI: non-blocking + polling)
//   --piece-bytes N    MPI moves at most N bytes per call and rank (exercises the split path)
//   --fault F          throw | kill | timeout | config: rank --fault-rank (default 2) throws,
//                      raises SIGKILL, sleeps past the timeout, or passes a different configuration
//                      while the others sit in an all_gather
//   --group P          MPI: run the cases on the world's first P ranks (first_ranks); the other
//                      ranks only take part in the split (P > world size: a usage error, exit 2)
//   --pending 1        with --fault: the others sit in waits on two non-blocking collectives in
//                      flight (an all_gather and an all_reduce, waited in reverse order) instead
// Output (stdout, rank 0 only): one line per case and rank, "<case> rank=<r> <FNV-1a 64 of the
// output bytes>", covering all_gather (also in place), reduce_scatter, all_to_all, all_reduce,
// send_recv and broadcast in fp32 and bf16 for sizes P does and does not divide; the same
// collectives again non-blocking, all in flight at once and waited in an order that depends on the
// rank ("nonblocking
// ..." cases; each must equal the blocking result on the same inputs, else the driver fails); and
// each rank's ledger.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "laga/comm/communicator.hpp"
#include "laga/core/dtype.hpp"
#include "laga/core/error.hpp"
#include "laga/core/random.hpp"

namespace {

using namespace laga;

struct Options {
  int threads = 0;
  double timeout_s = 0;
  int64_t piece_bytes = 0;
  std::string fault;
  int fault_rank = 2;
  bool pending = false;
  int group = 0;
};

uint64_t digest(const void* p, int64_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = static_cast<const unsigned char*>(p);
  for (int64_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// n values of dtype t for this (stream, rank), scaled by the rank so sums mix magnitudes.
std::vector<char> values(DType t, int64_t n, uint64_t stream, int rank) {
  std::vector<char> out(size_t(n * dtype_size(t)));
  for (int64_t i = 0; i < n; ++i) {
    const float v = float(normal(77 + uint64_t(rank), stream, uint64_t(i)) * (1.0 + rank));
    if (t == DType::f32) {
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      const bf16 b = to_bf16(v);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}

// The collectives of run_cases again, all in flight at once and waited in a rank-dependent order;
// each output must be bitwise the blocking one on the same inputs (checked here), and is added as
// "nonblocking <case>" so the script compares it across backends too.
template <class Add>
void run_nonblocking_cases(Communicator& c, Add& add, uint64_t& stream) {
  const int P = c.size(), r = c.rank();
  for (DType t : {DType::f32, DType::bf16}) {
    const int64_t es = dtype_size(t);
    for (int64_t n : {0, 1, 7, 1000, 4099}) {
      const std::string tag = fmt::format("{} n={}", dtype_name(t), n);
      const auto ag_in = values(t, n, ++stream, r), rs_in = values(t, P * n, ++stream, r),
                 a2a_in = values(t, P * n, ++stream, r), ar1_in = values(t, n, ++stream, r),
                 ar2_in = values(t, n, ++stream, r), bc_in = values(t, n, ++stream, r),
                 sr_in = values(t, n, ++stream, r);
      struct Outputs {
        std::vector<char> ag, ag_in_place, rs, a2a, ar1, ar2, bc, sr1, sr2;
      };
      auto fresh = [&] {
        Outputs o{std::vector<char>(size_t(P * n * es)),
                  std::vector<char>(size_t(P * n * es)),
                  std::vector<char>(size_t(n * es)),
                  std::vector<char>(size_t(P * n * es)),
                  ar1_in,
                  ar2_in,
                  bc_in,
                  std::vector<char>(size_t(n * es)),
                  std::vector<char>(size_t(n * es))};
        if (n > 0) std::memcpy(o.ag_in_place.data() + r * n * es, ag_in.data(), size_t(n * es));
        return o;
      };
      Outputs blocking = fresh(), nb = fresh();
      c.all_reduce(blocking.ar1.data(), n, t, "grad_a");
      c.all_gather(ag_in.data(), blocking.ag.data(), n, t, "latent");
      c.reduce_scatter(rs_in.data(), blocking.rs.data(), n, t, "dlatent");
      c.all_gather(blocking.ag_in_place.data() + r * n * es, blocking.ag_in_place.data(), n, t,
                   "latent");
      c.all_reduce(blocking.ar2.data(), n, t, "grad_b");
      c.all_to_all(a2a_in.data(), blocking.a2a.data(), n, t, "q");
      c.broadcast(blocking.bc.data(), n * es, P - 1, "config");
      c.send_recv(sr_in.data(), blocking.sr1.data(), n, t, "k");
      c.send_recv(blocking.sr1.data(), blocking.sr2.data(), n, t, "v");
      std::vector<CollectiveHandle> h;
      h.push_back(c.all_reduce_start(nb.ar1.data(), n, t, "grad_a"));
      h.push_back(c.all_gather_start(ag_in.data(), nb.ag.data(), n, t, "latent"));
      h.push_back(c.reduce_scatter_start(rs_in.data(), nb.rs.data(), n, t, "dlatent"));
      h.push_back(c.all_gather_start(nb.ag_in_place.data() + r * n * es, nb.ag_in_place.data(), n,
                                     t, "latent"));
      h.push_back(c.all_reduce_start(nb.ar2.data(), n, t, "grad_b"));
      h.push_back(c.all_to_all_start(a2a_in.data(), nb.a2a.data(), n, t, "q"));
      h.push_back(c.broadcast_start(nb.bc.data(), n * es, P - 1, "config"));
      h.push_back(c.send_recv_start(sr_in.data(), nb.sr1.data(), n, t, "k"));
      // a second hop in flight
      h.push_back(c.send_recv_start(blocking.sr1.data(), nb.sr2.data(), n, t, "v"));
      const size_t k = h.size();
      for (size_t i = 0; i < k; ++i) {
        const size_t j = r % 2 == 0 ? (i + size_t(r)) % k : (k - 1 - i + size_t(r)) % k;
        if (i == 0) c.test(h[j]);  // a test first: progress without blocking
        c.wait(h[j]);
      }
      const std::pair<const char*, std::vector<char> Outputs::*> cases[] = {
          {"all_gather", &Outputs::ag},       {"all_gather_in_place", &Outputs::ag_in_place},
          {"reduce_scatter", &Outputs::rs},   {"all_to_all", &Outputs::a2a},
          {"all_reduce", &Outputs::ar1},      {"all_reduce_second", &Outputs::ar2},
          {"broadcast", &Outputs::bc},        {"send_recv", &Outputs::sr1},
          {"send_recv_second", &Outputs::sr2}};
      for (const auto& [name, member] : cases) {
        LAGA_ASSERT(nb.*member == blocking.*member,
                    "rank {}: non-blocking {} {} differs from blocking", r, name, tag);
        add(fmt::format("nonblocking {} {}", name, tag), nb.*member);
      }
    }
  }
}

// Runs every case on this rank; returns the case names and this rank's digests, in the same order
// on every rank and backend.
void run_cases(Communicator& c, std::vector<std::string>& names, std::vector<uint64_t>& digests) {
  const int P = c.size(), r = c.rank();
  auto add = [&](std::string name, const std::vector<char>& bytes) {
    names.push_back(std::move(name));
    digests.push_back(digest(bytes.data(), int64_t(bytes.size())));
  };
  uint64_t stream = 1;
  for (DType t : {DType::f32, DType::bf16}) {
    const int64_t es = dtype_size(t);
    for (int64_t n : {0, 1, 3, 7, 64, 1000, 4099}) {
      const std::string tag = fmt::format("{} n={}", dtype_name(t), n);
      {
        const auto in = values(t, n, ++stream, r);
        std::vector<char> out(size_t(P * n * es));
        c.all_gather(in.data(), out.data(), n, t, "latent");
        add("all_gather " + tag, out);
        std::vector<char> in_place(out.size());
        if (n > 0) std::memcpy(in_place.data() + r * n * es, in.data(), size_t(n * es));
        c.all_gather(in_place.data() + r * n * es, in_place.data(), n, t, "latent");
        add("all_gather_in_place " + tag, in_place);
      }
      {
        const auto in = values(t, P * n, ++stream, r);
        std::vector<char> out(size_t(n * es));
        c.reduce_scatter(in.data(), out.data(), n, t, "dlatent");
        add("reduce_scatter " + tag, out);
      }
      {
        const auto in = values(t, P * n, ++stream, r);
        std::vector<char> out(in.size());
        c.all_to_all(in.data(), out.data(), n, t, "q");
        add("all_to_all " + tag, out);
      }
      {
        auto buf = values(t, n, ++stream, r);
        c.all_reduce(buf.data(), n, t, "grad_sync");
        add("all_reduce " + tag, buf);
      }
      {
        const auto in = values(t, n, ++stream, r);
        std::vector<char> out(in.size());
        c.send_recv(in.data(), out.data(), n, t, "k");
        add("send_recv " + tag, out);
      }
    }
  }
  for (auto [bytes, root] : {std::pair<int64_t, int>{13, P - 1}, {5000, 0}}) {
    auto buf = values(DType::bf16, bytes / 2 + 1, ++stream, r);
    buf.resize(size_t(bytes));
    c.broadcast(buf.data(), bytes, root, "config");
    add(fmt::format("broadcast bytes={} root={}", bytes, root), buf);
  }
  run_nonblocking_cases(c, add, stream);
  c.barrier();
  check_same_everywhere(c, "driver configuration", "same everywhere");
  std::string ledger;
  for (const auto& rec : c.ledger().records())
    ledger += fmt::format("{} {} {} {} {};", collective_name(rec.op), rec.tensor,
                          dtype_name(rec.dtype), rec.tensor_bytes, rec.wire_bytes);
  add("ledger", std::vector<char>(ledger.begin(), ledger.end()));
}

void inject_fault(Communicator& c, const Options& o) {
  std::vector<float> a(64, float(c.rank())), b(size_t(64 * c.size()));
  c.all_gather(a.data(), b.data(), 64, DType::f32, "warmup");
  if (o.fault == "config") {
    check_same_everywhere(c, "seq", c.rank() == o.fault_rank ? "4096" : "8192");
    return;
  }
  if (c.rank() == o.fault_rank) {
    // the others are in the all_gather by now
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (o.fault == "throw") throw Error(ErrorKind::failure, __FILE__, __LINE__, "injected fault");
    if (o.fault == "kill") std::raise(SIGKILL);
    if (o.fault == "timeout") std::this_thread::sleep_for(std::chrono::seconds(120));
  }
  if (o.pending) {
    auto ag = c.all_gather_start(a.data(), b.data(), 64, DType::f32, "latent");
    auto ar = c.all_reduce_start(a.data(), 64, DType::f32, "grad_sync");
    c.wait(ar);
    c.wait(ag);
    return;
  }
  c.all_gather(a.data(), b.data(), 64, DType::f32, "latent");
}

void print(int P, const std::vector<std::string>& names, const std::vector<uint64_t>& all) {
  std::printf("# laga_comm_check P=%d\n", P);
  const size_t cases = names.size();
  for (size_t k = 0; k < cases; ++k)
    for (int q = 0; q < P; ++q)
      std::printf("%s rank=%d %016llx\n", names[k].c_str(), q,
                  (unsigned long long)all[size_t(q) * cases + k]);
  std::fflush(stdout);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    LAGA_CHECK(i + 1 < argc, "{} needs a value", a);
    const std::string v = argv[++i];
    if (a == "--threads")
      o.threads = std::stoi(v);
    else if (a == "--timeout")
      o.timeout_s = std::stod(v);
    else if (a == "--piece-bytes")
      o.piece_bytes = std::stoll(v);
    else if (a == "--fault")
      o.fault = v;
    else if (a == "--fault-rank")
      o.fault_rank = std::stoi(v);
    else if (a == "--pending")
      o.pending = v == "1";
    else if (a == "--group")
      o.group = std::stoi(v);
    else
      LAGA_FAIL_USAGE(
          "unknown option {}; try --threads, --timeout, --piece-bytes, --fault, --fault-rank, "
          "--pending, --group",
          a);
  }
  LAGA_CHECK(o.fault.empty() || o.fault == "throw" || o.fault == "kill" || o.fault == "timeout" ||
                 o.fault == "config",
             "--fault {}: try throw, kill, timeout or config", o.fault);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    if (o.piece_bytes > 0) detail::set_mpi_max_piece_bytes(o.piece_bytes);
    if (o.threads > 0) {
      std::mutex m;
      std::vector<std::string> names;
      std::vector<std::vector<uint64_t>> per_rank(size_t(o.threads));
      run_threads(
          o.threads,
          [&](Communicator& c) {
            if (!o.fault.empty()) return inject_fault(c, o);
            std::vector<std::string> mine;
            std::vector<uint64_t> d;
            run_cases(c, mine, d);
            std::lock_guard lk(m);
            per_rank[size_t(c.rank())] = d;
            if (c.rank() == 0) names = mine;
          },
          o.timeout_s);
      std::vector<uint64_t> all;
      for (const auto& d : per_rank) all.insert(all.end(), d.begin(), d.end());
      print(o.threads, names, all);
      return 0;
    }
    LAGA_CHECK(under_mpi(),
               "not started by mpirun; run 'mpirun -np P laga_comm_check' or 'laga_comm_check "
               "--threads P'");
    return run_mpi(
        [&](Communicator& world) {
          std::unique_ptr<Communicator> sub;
          if (o.group > 0) {
            sub = first_ranks(world, o.group);
            if (!sub) return;  // not one of the first ranks
          }
          Communicator& c = sub ? *sub : world;
          if (!o.fault.empty()) return inject_fault(c, o);
          std::vector<std::string> names;
          std::vector<uint64_t> mine;
          run_cases(c, names, mine);
          std::vector<uint64_t> all(mine.size() * size_t(c.size()));
          c.all_gather(mine.data(), all.data(), int64_t(mine.size()) * 2, DType::f32, "digests");
          if (c.rank() == 0) print(c.size(), names, all);
        },
        o.timeout_s);
  } catch (const Error& e) {
    std::fprintf(stderr, "laga_comm_check: %s\n", e.what());
    return e.exit_status();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "laga_comm_check: %s\n", e.what());
    return 1;
  }
}
