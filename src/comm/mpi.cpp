// The MPI backend: one rank per process of MPI_COMM_WORLD (or of a sub-group of its first ranks),
// started by mpirun. Raw non-blocking byte movement only (MPI_Iallgather, MPI_Ialltoall,
// MPI_Ibcast, MPI_Ibarrier, and MPI_Irecv + MPI_Isend for a ring's send_recv), completed by
// MPI_Test polling with a yield/sleep back-off (MPI_Waitall when there is neither a timeout nor
// anything else to drive); recording, the wait loop and the ordered reductions are in
// communicator.cpp, which is why this backend and the threads backend give bitwise the same
// results. Not here: MPI's own reductions (MPI_Reduce_scatter, MPI_Allreduce), whose summation
// order is the library's choice.
//
// Lanes: MPI matches non-blocking collectives on a communicator in issue order. The second phases
// of all_reduce are issued later, at times that differ between ranks, so they run on a duplicate
// of the communicator (lane 1), where they are issued in the all_reduces' order on every rank.
//
// MPI counts are int. A transfer of more than INT_MAX bytes per rank is split into pieces of at
// most that size; a piece is one contiguous run of bytes per rank, described by a datatype whose
// extent is the whole per-rank block, so piece k of every rank lands at its place in the output.
//
// Every MPI call is checked (MPI_ERRORS_RETURN on MPI_COMM_WORLD) and a failure names the call,
// the rank and the host. A failing rank prints its error and calls MPI_Abort, which ends every
// process of the job: MPI has no way to make the others' pending collectives fail and continue.
// The C API only: OpenMPI's deprecated C++ bindings stay out.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "laga/comm/communicator.hpp"
#include "laga/core/error.hpp"
#include "laga/core/machine.hpp"
#include "laga/core/progress.hpp"

namespace laga {
namespace {

int64_t g_max_piece_bytes = INT_MAX;
constexpr int kRingTag = 17;  // send_recv's point-to-point messages
// probed for progress (set_mpi_progress_interval); nothing sends it
constexpr int kProgressTag = 4711;
double g_progress_interval_s = 500e-6;
// Raw requests in flight in this process (MpiCommunicator::Request, alive from issue until observed
// complete). Only the rank's own thread touches it (MPI_THREAD_FUNNELED).
int g_raw_in_flight = 0;

std::string host_name() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    char name[MPI_MAX_PROCESSOR_NAME];
    int len = 0;
    if (MPI_Get_processor_name(name, &len) == MPI_SUCCESS) return std::string(name, size_t(len));
  }
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) == 0) return name;
  return "an unknown host";
}

std::string mpi_error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) == MPI_SUCCESS) return std::string(text, size_t(len));
  return fmt::format("MPI error code {}", rc);
}

// Where this process is, for messages.
struct Where {
  int rank = -1;
  std::string host;
};

void check_mpi(int rc, const char* call, const Where& w, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  throw Error(
      ErrorKind::failure, file, line,
      fmt::format("rank {} on {}: {} failed: {}", w.rank, w.host, call, mpi_error_text(rc)));
}
#define LAGA_MPI(where, call) check_mpi((call), #call, (where), __FILE__, __LINE__)

// len bytes per rank inside a per-rank block of extent bytes: plain MPI_BYTEs when the piece is the
// whole block, else one element of a contiguous type resized to the block's extent.
class Piece {
 public:
  Piece(int64_t len, int64_t extent, const Where& w) {
    if (len == extent) {
      count_ = int(len);
      return;
    }
    MPI_Datatype contiguous;
    LAGA_MPI(w, MPI_Type_contiguous(int(len), MPI_BYTE, &contiguous));
    LAGA_MPI(w, MPI_Type_create_resized(contiguous, 0, MPI_Aint(extent), &type_));
    LAGA_MPI(w, MPI_Type_free(&contiguous));
    LAGA_MPI(w, MPI_Type_commit(&type_));
    owned_ = true;
  }
  ~Piece() {
    if (owned_) MPI_Type_free(&type_);  // MPI lets a pending operation finish with a freed type
  }
  Piece(const Piece&) = delete;
  Piece& operator=(const Piece&) = delete;
  int count() const { return count_; }
  MPI_Datatype type() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_BYTE;
  int count_ = 1;
  bool owned_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  // owned: comm came from MPI_Comm_split and is freed with this communicator.
  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    where_.host = host_name();
    LAGA_MPI(where_, MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    LAGA_MPI(where_, MPI_Comm_rank(comm_, &where_.rank));
    LAGA_MPI(where_, MPI_Comm_size(comm_, &size_));
    LAGA_MPI(where_, MPI_Comm_dup(comm_, &second_));
    LAGA_MPI(where_, MPI_Comm_set_errhandler(second_, MPI_ERRORS_RETURN));
  }
  ~MpiCommunicator() override {
    MPI_Comm_free(&second_);
    if (owned_) MPI_Comm_free(&comm_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  int rank() const override { return where_.rank; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  const std::string& host() const { return where_.host; }

  void abort(const std::string& reason) override {
    std::fprintf(stderr, "laga: rank %d on %s: %s\n", where_.rank, where_.host.c_str(),
                 reason.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }

 protected:
  struct Request : RawRequest {
    Request() { ++g_raw_in_flight; }
    ~Request() override { --g_raw_in_flight; }
    Request(const Request&) = delete;
    Request& operator=(const Request&) = delete;
    std::vector<MPI_Request> reqs;  // one per piece
    const char* call = "";
  };

  std::unique_ptr<RawRequest> start_raw(const RawOp& op) override {
    auto r = std::make_unique<Request>();
    r->what = op.what;
    MPI_Comm comm = op.lane == 0 ? comm_ : second_;
    switch (op.kind) {
      case RawKind::all_gather: {
        r->call = "MPI_Iallgather";
        const bool in_place =
            op.send == static_cast<const char*>(op.recv) + int64_t(where_.rank) * op.bytes;
        for (int64_t off = 0; off < op.bytes; off += g_max_piece_bytes) {
          const Piece t(std::min(g_max_piece_bytes, op.bytes - off), op.bytes, where_);
          const void* send = in_place ? MPI_IN_PLACE : static_cast<const char*>(op.send) + off;
          char* recv = static_cast<char*>(op.recv) + off;
          LAGA_MPI(where_, MPI_Iallgather(send, t.count(), t.type(), recv, t.count(), t.type(),
                                          comm, &r->reqs.emplace_back()));
        }
        break;
      }
      case RawKind::all_to_all:
        r->call = "MPI_Ialltoall";
        for (int64_t off = 0; off < op.bytes; off += g_max_piece_bytes) {
          const Piece t(std::min(g_max_piece_bytes, op.bytes - off), op.bytes, where_);
          const char* send = static_cast<const char*>(op.send) + off;
          char* recv = static_cast<char*>(op.recv) + off;
          LAGA_MPI(where_, MPI_Ialltoall(send, t.count(), t.type(), recv, t.count(), t.type(), comm,
                                         &r->reqs.emplace_back()));
        }
        break;
      case RawKind::broadcast:
        r->call = "MPI_Ibcast";
        for (int64_t off = 0; off < op.bytes; off += g_max_piece_bytes) {
          const int len = int(std::min(g_max_piece_bytes, op.bytes - off));
          char* p = static_cast<char*>(op.recv) + off;
          LAGA_MPI(where_, MPI_Ibcast(p, len, MPI_BYTE, op.root, comm, &r->reqs.emplace_back()));
        }
        break;
      case RawKind::send_recv: {
        // Point-to-point messages between two ranks on one communicator and tag arrive in the order
        // they were sent, so the k-th send_recv's pieces match the k-th on the neighbours. At P = 1
        // the rank sends to itself (the receive is posted first).
        r->call = "MPI_Irecv/MPI_Isend";
        const int P = size_, next = (where_.rank + 1) % P, prev = (where_.rank + P - 1) % P;
        for (int64_t off = 0; off < op.bytes; off += g_max_piece_bytes) {
          const int len = int(std::min(g_max_piece_bytes, op.bytes - off));
          LAGA_MPI(where_, MPI_Irecv(static_cast<char*>(op.recv) + off, len, MPI_BYTE, prev,
                                     kRingTag, comm, &r->reqs.emplace_back()));
          LAGA_MPI(where_, MPI_Isend(static_cast<const char*>(op.send) + off, len, MPI_BYTE, next,
                                     kRingTag, comm, &r->reqs.emplace_back()));
        }
        break;
      }
      case RawKind::barrier:
        r->call = "MPI_Ibarrier";
        LAGA_MPI(where_, MPI_Ibarrier(comm, &r->reqs.emplace_back()));
        break;
    }
    return r;
  }

  bool test_raw(RawRequest& raw) override {
    auto& r = static_cast<Request&>(raw);
    if (r.reqs.empty()) return true;
    int done = 0;
    LAGA_MPI(where_, MPI_Testall(int(r.reqs.size()), r.reqs.data(), &done, MPI_STATUSES_IGNORE));
    return done != 0;
  }

  void block_raw(RawRequest& raw) override {
    auto& r = static_cast<Request&>(raw);
    if (!r.reqs.empty())
      LAGA_MPI(where_, MPI_Waitall(int(r.reqs.size()), r.reqs.data(), MPI_STATUSES_IGNORE));
  }

  // Polling yields, then sleeps briefly, so oversubscribed ranks leave the cores to the ones still
  // computing.
  void idle(int polls, double) override {
    if (polls < 100)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

  [[noreturn]] void timed_out(RawRequest& raw) override {
    auto& r = static_cast<Request&>(raw);
    throw Error(
        ErrorKind::failure, __FILE__, __LINE__,
        fmt::format("rank {}: {} timed out after {:g} s waiting for the other ranks ({} on {}; MPI "
                    "cannot tell which ranks are missing)",
                    where_.rank, r.what, timeout_s_, r.call, where_.host));
  }

  std::unique_ptr<Communicator> split_of(int color, int key, int, int) override {
    MPI_Comm sub = MPI_COMM_NULL;
    LAGA_MPI(where_, MPI_Comm_split(comm_, color, key, &sub));
    return std::make_unique<MpiCommunicator>(sub, true);
  }

  std::unique_ptr<Communicator> first_ranks_of(int P) override {
    MPI_Comm sub = MPI_COMM_NULL;
    LAGA_MPI(where_, MPI_Comm_split(comm_, where_.rank < P ? 0 : MPI_UNDEFINED, where_.rank, &sub));
    if (sub == MPI_COMM_NULL) return nullptr;
    auto c = std::make_unique<MpiCommunicator>(sub, true);
    c->set_timeout(timeout_s_);
    return c;
  }

 private:
  MPI_Comm comm_;
  MPI_Comm second_ = MPI_COMM_NULL;  // lane 1: all_reduce's second phases
  bool owned_;
  Where where_;
  int size_ = 0;
};

// Ranks of this job on this node: OpenMPI says so in the environment; otherwise ask MPI.
int local_size(MPI_Comm comm, const Where& w) {
  if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) {
    const int n = std::atoi(s);
    if (n > 0) return n;
  }
  MPI_Comm node;
  LAGA_MPI(w, MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int n = 1;
  LAGA_MPI(w, MPI_Comm_size(node, &n));
  LAGA_MPI(w, MPI_Comm_free(&node));
  return n;
}

}  // namespace

namespace detail {
void set_mpi_max_piece_bytes(int64_t bytes) {
  LAGA_CHECK(bytes >= 1 && bytes <= INT_MAX, "MPI piece size {} bytes is outside 1 .. {}", bytes,
             INT_MAX);
  g_max_piece_bytes = bytes;
}
}  // namespace detail

void set_mpi_progress_interval(double seconds) {
  LAGA_CHECK(
      seconds >= 0 && std::isfinite(seconds),
      "MPI progress interval {} s must be finite and ≥ 0 (0: progress only inside MPI calls)",
      seconds);
  g_progress_interval_s = seconds;
}
double mpi_progress_interval() { return g_progress_interval_s; }

bool under_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

int run_mpi(const std::function<void(Communicator&)>& fn, double timeout_s) {
  LAGA_CHECK(timeout_s >= 0,
             "run_mpi: timeout {} s is negative; try 0 (wait forever) or a positive count",
             timeout_s);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  LAGA_CHECK(!initialized && !finalized,
             "run_mpi: MPI was already initialised in this process; it runs once");
  Where where{-1, host_name()};
  int provided = 0;
  LAGA_MPI(where, MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
  where.host = host_name();
  MPI_Comm_rank(MPI_COMM_WORLD, &where.rank);

  int status = 0;
  std::string message;
  try {
    LAGA_MPI(where, MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    LAGA_CHECK(provided >= MPI_THREAD_FUNNELED,
               "this MPI library gives thread level {}; laga needs MPI_THREAD_FUNNELED", provided);
    // Threads per rank: the cores this rank may run on, but no more than its share of the node's
    // (the ranks MPI places on this node; an unbound rank's mask is the whole machine). A rank
    // bound to one core (mpirun's default binding at 2 ranks, scripts/link.sh's taskset per
    // namespace, where each namespace is a "node" of one rank) runs one thread.
    const int online = std::max(1, int(sysconf(_SC_NPROCESSORS_ONLN)));
    omp_set_num_threads(
        std::max(1, std::min(usable_cores(), online / local_size(MPI_COMM_WORLD, where))));
    MpiCommunicator comm(MPI_COMM_WORLD, false);
    comm.set_timeout(timeout_s);
    // Any MPI call runs OpenMPI's progress engine for every request in flight, on every
    // communicator; a probe of a tag nothing sends never matches, so it always does.
    ProgressHook progress(
        [&where] {
          if (g_raw_in_flight == 0) return;
          int flag = 0;
          LAGA_MPI(where, MPI_Iprobe(MPI_ANY_SOURCE, kProgressTag, MPI_COMM_WORLD, &flag,
                                     MPI_STATUS_IGNORE));
        },
        g_progress_interval_s);
    fn(comm);
  } catch (const Error& e) {
    status = e.exit_status();
    message = e.what();
  } catch (const std::exception& e) {
    status = 1;
    message = e.what();
  } catch (...) {
    status = 1;
    message = "an exception that is not a std::exception";
  }
  if (status != 0) {
    std::fprintf(stderr, "laga: rank %d on %s: %s\n", where.rank, where.host.c_str(),
                 message.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status);
    std::_Exit(status);
  }
  LAGA_MPI(where, MPI_Finalize());
  return 0;
}

}  // namespace laga
