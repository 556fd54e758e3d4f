// Communicator: the collectives of a sequence-parallel group, with two backends that give bitwise
// the same results — ranks as threads of one process (the default) and MPI processes (under
// mpirun, so the same binary runs across machines). Not here: the forward/backward pairs built on
// these collectives (the model code composes them), and any device (GPU) transport.
//
// Every collective is recorded in the rank's Ledger (docs/design.md §4): operation, tensor name,
// dtype, seconds, tensor bytes (the local shard handed to the collective: the paper's convention)
// and wire bytes this rank sends under the ring/pairwise algorithms' accounting:
//   all_to_all      tensor = input bytes,  wire = (P−1)/P · input      (= (P−1) · n · dtype bytes)
//   all_gather      tensor = shard bytes,  wire = (P−1) · shard
//   reduce_scatter  tensor = shard bytes (the output), wire = (P−1) · shard
//   all_reduce      tensor = buffer bytes, wire = ⌊2 (P−1) · buffer / P⌋
//   broadcast       tensor = bytes,        wire = (P−1) · bytes on the root, 0 elsewhere (flat
//                   tree)
//   barrier         tensor = wire = 0
//   send_recv       tensor = n · dtype bytes (what this rank sends), wire = n · dtype bytes (one
//                   hop of a ring: to rank (r+1) mod P, while n arrive from rank (r−1) mod P)
// At P = 1 every wire size is 0. Broadcast and barrier move raw bytes; their records carry dtype
// f32. reduce_scatter and all_reduce are composed from the raw byte movement (below) but are
// recorded as one reduce_scatter / one all_reduce.
//
// Reductions sum in fp32 over ranks 0, 1, ..., P−1 in that order and round once to the dtype, in
// both backends, so results do not depend on the backend or on timing:
//   reduce_scatter = all_to_all of the P chunks, then this rank sums the P chunks it received;
//   all_reduce     = reduce_scatter over chunks of c = ⌈n/P⌉ elements (the input zero-padded to P·c
//                    in scratch when P does not divide n) followed by an all_gather of the sums.
//
// Every collective also has a non-blocking form (*_start, then wait or test), with the semantics of
// MPI-3's non-blocking collectives: every rank issues its collectives in the same order; several
// may be in flight at once; the caller keeps the buffers alive and untouched until wait; handles
// may be waited in any order. The blocking calls are start + wait. The ledger keeps records in
// issue order and times each one: issued_s and completed_s (seconds since the ledger's epoch,
// steady clock), seconds = completed_s − issued_s, and wait_s = the time the caller was blocked for
// it (inside the start call and the wait/test calls on its handle). Exposed communication = wait_s;
// hidden = seconds − wait_s.
//
// A rank that fails calls abort() (the launchers do it for an escaping exception): every other rank
// leaves its current or next collective with an error instead of waiting forever.
//
// split() makes sub-communicators (MPI_Comm_split's groups: the ranks of one color, ordered by
// key), e.g. the head-scatter groups and the ring of laga-ulysses. A sub-communicator
// records into its parent's ledger (so every consumer of the rank's ledger sees its collectives,
// with wire bytes of the sub-group's size), and an abort anywhere (parent or any sub-group) brings
// the whole family down.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "laga/core/dtype.hpp"

namespace laga {

enum class CollectiveOp {
  all_to_all,
  all_gather,
  reduce_scatter,
  all_reduce,
  barrier,
  broadcast,
  send_recv
};
std::string_view collective_name(CollectiveOp op);

struct CollectiveRecord {
  CollectiveOp op;
  std::string tensor;  // what moved, e.g. "q", "latent", "dlatent", "grad_sync"
  DType dtype;
  double seconds = 0;  // completed_s − issued_s
  int64_t tensor_bytes = 0;
  int64_t wire_bytes = 0;
  double issued_s = 0;  // when this rank issued it, seconds since the ledger's epoch
  // when this rank observed its completion (in wait or test); 0 while in flight
  double completed_s = 0;
  // time the caller was blocked for it: exposed; seconds − wait_s was hidden
  double wait_s = 0;
  // The group it ran on, as ranks of the outermost communicator, in the group's rank order; null
  // for the outermost group itself (ranks 0 .. P−1). The performance model reads a sub-group's size
  // and which nodes its ranks sit on from it.
  std::shared_ptr<const std::vector<int>> group = nullptr;
  int64_t group_size(int64_t outer_size) const {
    return group ? int64_t(group->size()) : outer_size;
  }
};

class Ledger {
 public:
  Ledger() : epoch_(std::chrono::steady_clock::now()) {}
  void add(CollectiveRecord r) { records_.push_back(std::move(r)); }
  const std::vector<CollectiveRecord>& records() const { return records_; }
  // Drops the records and restarts the epoch. Collectives in flight are not filled in afterwards.
  void clear();
  // Seconds since the epoch (construction or the last clear()).
  double now() const;
  // Totals over records that pass the filter (all when null).
  int64_t tensor_bytes(const std::function<bool(const CollectiveRecord&)>& filter = nullptr) const;
  int64_t wire_bytes(const std::function<bool(const CollectiveRecord&)>& filter = nullptr) const;
  double seconds(const std::function<bool(const CollectiveRecord&)>& filter = nullptr) const;
  double wait_seconds(const std::function<bool(const CollectiveRecord&)>& filter = nullptr) const;

 private:
  friend class Communicator;
  std::vector<CollectiveRecord> records_;
  std::chrono::steady_clock::time_point epoch_;
  uint64_t generation_ = 0;  // bumped by clear(): a record index from before it is stale
};

class Communicator;
// A rank's place in a split: ranks of the same color form a group, ordered by (key, parent rank).
struct SplitKey {
  int color = 0, key = 0;
};
// Throws laga::Error(usage) on every rank unless all ranks pass the same value (compared by a
// 64-bit hash and the length; only those travel). Not recorded in the ledger: it is not attention
// traffic.
void check_same_everywhere(Communicator& c, const std::string& what, const std::string& value);

namespace detail {
struct PendingCollective;  // communicator.cpp
}

// A collective in flight, returned by the *_start calls. Move-only; default-constructed = empty;
// Communicator::wait empties it (also when the wait fails: the collective is abandoned, and the
// group is down). Destroyed while not empty it waits, and never throws: if the wait fails it aborts
// the group and swallows the error. Destroyed while an error unwinds the stack it does not wait: it
// abandons the collective (threads: aborts the group, so no peer keeps waiting and none still reads
// a buffer about to be freed; MPI: the error goes on to end the job). After an error has escaped
// with collectives in flight, the communicator is not to be used again.
class CollectiveHandle {
 public:
  CollectiveHandle();
  CollectiveHandle(CollectiveHandle&& o) noexcept;
  // settles the current one as the destructor does
  CollectiveHandle& operator=(CollectiveHandle&& o) noexcept;
  CollectiveHandle(const CollectiveHandle&) = delete;
  CollectiveHandle& operator=(const CollectiveHandle&) = delete;
  ~CollectiveHandle();
  bool empty() const { return p_ == nullptr; }

 private:
  friend class Communicator;
  void settle() noexcept;
  std::unique_ptr<detail::PendingCollective> p_;
};

class Communicator {
 public:
  Communicator();
  virtual ~Communicator();
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "threads", "mpi", "stand-in" or "meta"
  // False for a communicator that only plans (MetaCommunicator): the collectives are checked and
  // recorded but read and write no memory, so buffers may be null.
  virtual bool moves_data() const { return true; }

  // out [P · n] = concat over ranks r of in_r [n]  (n elements of dtype; chunk r from rank r).
  // in may be out + rank · n (in place); otherwise in and out must not overlap.
  void all_gather(const void* in, void* out, int64_t n, DType dtype, const std::string& tensor);
  // out [n] = Σ_r in_r[rank · n : (rank+1) · n]  (in [P · n]); the all-gather's adjoint. in and out
  // may overlap (the sum is formed in scratch).
  void reduce_scatter(const void* in, void* out, int64_t n, DType dtype, const std::string& tensor);
  // in [P · n]: chunk j goes to rank j;  out [P · n]: chunk j came from rank j. No overlap.
  void all_to_all(const void* in, void* out, int64_t n, DType dtype, const std::string& tensor);
  // buf [n] = Σ_r buf_r, in place
  void all_reduce(void* buf, int64_t n, DType dtype, const std::string& tensor);
  // buf [bytes] = rank root's buf
  void broadcast(void* buf, int64_t bytes, int root, const std::string& tensor);
  void barrier();
  // One hop of a ring (the name nccl-tests uses): in [n] goes to rank (rank+1) mod P, and out [n]
  // receives rank (rank−1) mod P's in. At P = 1 out = in. No overlap between in and out.
  void send_recv(const void* in, void* out, int64_t n, DType dtype, const std::string& tensor);

  // The same collectives, non-blocking: the results (bitwise) and the records are those of the
  // blocking calls. in/out/buf must stay alive and untouched until wait() on the handle returns
  // (or test() returned true). reduce_scatter's sum is formed when this rank observes completion;
  // all_reduce's second phase (the all_gather of the sums) is issued by whichever wait or test on
  // this communicator first finds its first phase complete, in the all_reduces' issue order.
  CollectiveHandle all_gather_start(const void* in, void* out, int64_t n, DType dtype,
                                    const std::string& tensor);
  CollectiveHandle reduce_scatter_start(const void* in, void* out, int64_t n, DType dtype,
                                        const std::string& tensor);
  CollectiveHandle all_to_all_start(const void* in, void* out, int64_t n, DType dtype,
                                    const std::string& tensor);
  CollectiveHandle all_reduce_start(void* buf, int64_t n, DType dtype, const std::string& tensor);
  CollectiveHandle broadcast_start(void* buf, int64_t bytes, int root, const std::string& tensor);
  CollectiveHandle barrier_start();
  CollectiveHandle send_recv_start(const void* in, void* out, int64_t n, DType dtype,
                                   const std::string& tensor);
  // Blocks until h's collective is done (bounded by the timeout); then its buffers may be reused
  // and h is empty. Every wait also makes progress on this rank's other collectives in flight, so
  // ranks waiting on different handles do not deadlock. An empty h returns at once.
  void wait(CollectiveHandle& h);
  // Non-blocking progress; true when h's collective is done (then wait(h) returns at once). True
  // for an empty h.
  bool test(CollectiveHandle& h);

  // Brings the group down: every rank's pending and future collectives throw (threads), or the job
  // ends (MPI_Abort). Never returns an error.
  virtual void abort(const std::string& reason) = 0;
  // Seconds a collective may wait for the others before it fails naming itself and this rank (0:
  // forever).
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout() const { return timeout_s_; }

  // The ledger this communicator records into: its own, or for a sub-communicator its parent's.
  Ledger& ledger() { return *led_; }

  // The sub-communicator of this rank's color (MPI_Comm_split): collective over this group, with no
  // collective of it in flight; every rank passes the same function, which gives every rank's
  // (color, key) — a function rather than this rank's pair because the backends without peers
  // (stand-in, meta) must know the sub-group's size and their rank in it without asking anyone.
  // The result records into this communicator's ledger, starts with its timeout, and must not
  // outlive it; aborting either aborts both (and every other sub-group of the family).
  std::unique_ptr<Communicator> split(const std::function<SplitKey(int rank)>& color_key);

 protected:
  // Backends implement raw, non-blocking byte movement; the public calls above check, time, record
  // and reduce. Every rank issues the same raw operations in the same order per lane, with the same
  // kind, byte count and root. Lane 1 carries only the second phase of all_reduce (issued later
  // than its first phase, at a time that differs between ranks, so it needs its own ordering).
  // send_recv: send to rank (rank+1) mod P, recv from rank (rank−1) mod P, bytes each way.
  enum class RawKind { all_gather, all_to_all, broadcast, barrier, send_recv };
  struct RawOp {
    RawKind kind;
    const void* send;  // all_gather: may be recv + rank · bytes (in place); broadcast: the buffer
    void* recv;
    int64_t bytes;  // all_gather, broadcast: per rank; all_to_all: per peer; send_recv: each way
    int root;
    int lane;
    const std::string& what;  // the user-level collective, for messages: "all_gather of 'latent'"
  };
  struct RawRequest {
    virtual ~RawRequest() = default;
    std::string what;
  };
  // Issues op; nullptr when it is already complete. Throws if the group is aborted.
  virtual std::unique_ptr<RawRequest> start_raw(const RawOp& op) = 0;
  // Non-blocking: does this rank's share of the work that is possible now (for any raw operation in
  // flight); true when r is complete on this rank, i.e. its output is written and its input is no
  // longer read by anyone. Throws when the group is aborted or the ranks disagree on r.
  virtual bool test_raw(RawRequest& r) = 0;
  // Blocks until r is complete (only used with no timeout, on the operation that gates this rank's
  // further progress: see drive in communicator.cpp). By default test_raw and idle in turn.
  virtual void block_raw(RawRequest& r);
  // Waits a little for something to change (polls: calls so far in this wait; at most max_s seconds
  // when max_s > 0).
  virtual void idle(int polls, double max_s) = 0;
  // r waited longer than the timeout: fail naming it, this rank and what is known of the others.
  [[noreturn]] virtual void timed_out(RawRequest& r) = 0;
  // A collective of this rank is dropped while an error unwinds the stack (its handle's
  // destructor): make sure no peer waits for it forever and no peer is still reading its buffers on
  // return. Threads: abort the group and wait out the copies in progress. By default nothing: under
  // MPI the error reaches run_mpi, which ends the job (MPI_Abort) with the error's own message
  // before any further MPI call could progress the dropped request.
  virtual void abandon(const std::string& reason) {}
  // The communicator of this group's first P ranks (see first_ranks); called with 1 ≤ P ≤ size().
  virtual std::unique_ptr<Communicator> first_ranks_of(int P);
  // The backend's split: this rank's color and key, and (computed from every rank's pair) its rank
  // in the sub-group of sub_size ranks. By default a usage error.
  virtual std::unique_ptr<Communicator> split_of(int color, int key, int sub_rank, int sub_size);
  double timeout_s_ = 0;

 private:
  friend void check_same_everywhere(Communicator& c, const std::string& what,
                                    const std::string& value);
  friend std::unique_ptr<Communicator> first_ranks(Communicator& world, int P);
  friend class CollectiveHandle;
  friend struct detail::PendingCollective;
  using Pending = detail::PendingCollective;
  CollectiveHandle issue(std::unique_ptr<Pending> p, const RawOp& op, int64_t tensor_bytes,
                         int64_t wire_bytes);
  void advance_queue();
  bool step(Pending& p);
  void drive(Pending& p);
  void complete(Pending& p);
  void forget(Pending* p);

  Ledger ledger_;
  Ledger* led_ = &ledger_;  // where records go: ledger_, or the parent's (split)
  // this group as outermost ranks (split); null: outermost
  std::shared_ptr<const std::vector<int>> group_;
  // all_reduces whose first phase is in flight, in issue order: their second phases are issued in
  // this order on every rank.
  std::deque<Pending*> queue_;
};

// The communicator of world ranks 0 .. P−1, for running a P-rank group inside a larger world (e.g.
// `laga verify --sp 1,2,4,8` under `mpirun -np 8`). Collective over the world: every world rank
// calls it, with no collective of the world in flight. Returns the group on ranks 0 .. P−1 (rank r
// of the world is rank r of the group; it starts with the world's timeout and an empty ledger) and
// nullptr on the others. Usage error (exit 2) when P is not in 1 .. world size. MPI:
// MPI_Comm_split; stand-in and meta: a communicator of P ranks; threads: a usage error (ranks are
// threads of one process: start a new group with run_threads(P, ...) instead).
std::unique_ptr<Communicator> first_ranks(Communicator& world, int P);

// Runs fn on P ranks as threads of this process, each with its own OpenMP
// thread count max(1, cores / P). If a rank throws, the group is aborted, every rank is joined, and
// the first failing rank's error is rethrown (a laga::Error keeps its kind). timeout_s > 0 bounds
// every wait inside a collective.
void run_threads(int P, const std::function<void(Communicator&)>& fn, double timeout_s = 0);

// The group of this thread alone (the threads backend at P = 1): for a caller with no group, such as
// the Python package's modules without a torch.distributed group.
std::unique_ptr<Communicator> one_rank_communicator();

// True when this process was started by mpirun/mpiexec (OpenMPI's environment: OMPI_COMM_WORLD_SIZE
// or PMIX_RANK is set).
bool under_mpi();
// OpenMPI moves a non-blocking transfer only inside MPI calls (it has no progress thread): over
// TCP, a collective issued before compute would otherwise wait for the rank's own wait. So
// run_mpi's rank makes a progress call (MPI_Iprobe on a tag nothing sends) from compute's progress
// points (core/progress.hpp: every matmul) whenever a collective is in flight, at most once every
// `seconds`. 0: progress only inside MPI calls. Default 500 µs. Set before run_mpi; a usage error
// unless finite and ≥ 0.
void set_mpi_progress_interval(double seconds);
double mpi_progress_interval();
// Runs fn on this MPI process's rank of MPI_COMM_WORLD (MPI_Init_thread/Finalize around it), with
// max(1, cores / ranks on this node) OpenMP threads. An escaping exception prints
// "laga: rank R on HOST: <what>" and calls MPI_Abort with the error's exit status (2 usage,
// 1 failure or any other exception, 3 internal), so no rank hangs. timeout_s > 0 fails a collective
// that waits longer. Returns 0 (after MPI_Finalize) for main() to return.
// Once per process: MPI cannot be initialised twice.
int run_mpi(const std::function<void(Communicator&)>& fn, double timeout_s = 0);

namespace detail {
// Largest byte count one MPI call moves per rank (default INT_MAX, MPI's int counts); larger
// transfers are split into pieces. Lowered by the tests to exercise the split path with small data.
void set_mpi_max_piece_bytes(int64_t bytes);
}  // namespace detail

}  // namespace laga
