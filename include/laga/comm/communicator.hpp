// Communicator: the collectives of a sequence-parallel group, with two backends that give bitwise
// the same results — ranks as threads of one process (the default) and MPI processes (under
// mpirun, so the same binary runs across machines). Not here: the forward/backward pairs built on
// these collectives (the model code composes them), and any device (GPU) transport.
//
// Every collective is recorded in the rank's Ledger (DESIGN §4): operation, tensor name, dtype,
// seconds, tensor bytes (the local shard handed to the collective: the paper's convention) and
// wire bytes this rank sends under the ring/pairwise algorithms' accounting:
//   all_to_all      tensor = input bytes,  wire = (P−1)/P · input      (= (P−1) · n · dtype bytes)
//   all_gather      tensor = shard bytes,  wire = (P−1) · shard
//   reduce_scatter  tensor = shard bytes (the output), wire = (P−1) · shard
//   all_reduce      tensor = buffer bytes, wire = ⌊2 (P−1) · buffer / P⌋
//   broadcast       tensor = bytes,        wire = (P−1) · bytes on the root, 0 elsewhere (flat tree)
//   barrier         tensor = wire = 0
// At P = 1 every wire size is 0. Broadcast and barrier move raw bytes; their records carry dtype f32.
// reduce_scatter and all_reduce are composed from the raw byte movement (below) but are recorded as
// one reduce_scatter / one all_reduce.
//
// Reductions sum in fp32 over ranks 0, 1, ..., P−1 in that order and round once to the dtype, in
// both backends, so results do not depend on the backend or on timing:
//   reduce_scatter = all_to_all of the P chunks, then this rank sums the P chunks it received;
//   all_reduce     = reduce_scatter over chunks of c = ⌈n/P⌉ elements (the input zero-padded to
//                    P·c in scratch when P does not divide n) followed by an all_gather of the sums.
//
// A rank that fails calls abort() (the launchers do it for an escaping exception): every other rank
// leaves its current or next collective with an error instead of waiting forever.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "laga/core/dtype.hpp"

namespace laga {

enum class CollectiveOp { all_to_all, all_gather, reduce_scatter, all_reduce, barrier, broadcast };
std::string_view collective_name(CollectiveOp op);

struct CollectiveRecord {
  CollectiveOp op;
  std::string tensor;  // what moved, e.g. "q", "latent", "dlatent", "grad_sync"
  DType dtype;
  double seconds = 0;
  int64_t tensor_bytes = 0;
  int64_t wire_bytes = 0;
};

class Ledger {
 public:
  void add(CollectiveRecord r) { records_.push_back(std::move(r)); }
  const std::vector<CollectiveRecord>& records() const { return records_; }
  void clear() { records_.clear(); }
  // Totals over records that pass the filter (all when null).
  int64_t tensor_bytes(const std::function<bool(const CollectiveRecord&)>& filter = nullptr) const;
  int64_t wire_bytes(const std::function<bool(const CollectiveRecord&)>& filter = nullptr) const;
  double seconds(const std::function<bool(const CollectiveRecord&)>& filter = nullptr) const;

 private:
  std::vector<CollectiveRecord> records_;
};

class Communicator;
// Throws laga::Error(usage) on every rank unless all ranks pass the same value (compared by a 64-bit
// hash and the length; only those travel). Not recorded in the ledger: it is not attention traffic.
void check_same_everywhere(Communicator& c, const std::string& what, const std::string& value);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "threads" or "mpi"

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

  // Brings the group down: every rank's pending and future collectives throw (threads), or the job
  // ends (MPI_Abort). Never returns an error.
  virtual void abort(const std::string& reason) = 0;
  // Seconds a collective may wait for the others before it fails naming itself and this rank (0: forever).
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout() const { return timeout_s_; }

  Ledger& ledger() { return ledger_; }

 protected:
  // Backends implement raw byte movement; the public calls above time and record them. Every rank
  // passes the same byte counts (and root). do_all_gather may get in == out + rank · bytes.
  virtual void do_all_gather(const void* in, void* out, int64_t bytes) = 0;
  virtual void do_all_to_all(const void* in, void* out, int64_t bytes_per_peer) = 0;
  virtual void do_broadcast(void* buf, int64_t bytes, int root) = 0;
  virtual void do_barrier() = 0;
  // The user-level collective being run, for error messages: "all_gather of 'latent'".
  const std::string& current_collective() const { return current_; }
  double timeout_s_ = 0;

 private:
  friend void check_same_everywhere(Communicator& c, const std::string& what, const std::string& value);
  class Naming;  // sets current_ for the duration of one collective
  void reduce_scatter_raw(const void* in, void* out, int64_t n, DType dtype);
  void record(CollectiveOp op, const std::string& tensor, DType dtype, double seconds, int64_t tensor_bytes,
              int64_t wire_bytes);

  Ledger ledger_;
  std::string current_;
};

// Runs fn on P ranks as threads of this process, each with its own OpenMP
// thread count max(1, cores / P). If a rank throws, the group is aborted, every rank is joined, and
// the first failing rank's error is rethrown (a laga::Error keeps its kind). timeout_s > 0 bounds
// every wait inside a collective.
void run_threads(int P, const std::function<void(Communicator&)>& fn, double timeout_s = 0);

// True when this process was started by mpirun/mpiexec (OpenMPI's environment: OMPI_COMM_WORLD_SIZE
// or PMIX_RANK is set).
bool under_mpi();
// Runs fn on this MPI process's rank of MPI_COMM_WORLD (MPI_Init_thread/Finalize around it), with
// max(1, cores / ranks on this node) OpenMP threads. An escaping exception prints
// "laga: rank R on HOST: <what>" and calls MPI_Abort with the error's exit status (2 usage,
// 1 failure or any other exception, 3 internal), so no rank hangs. timeout_s > 0 runs collectives
// non-blocking and fails one that waits longer. Returns 0 (after MPI_Finalize) for main() to return.
// Once per process: MPI cannot be initialised twice.
int run_mpi(const std::function<void(Communicator&)>& fn, double timeout_s = 0);

namespace detail {
// Largest byte count one MPI call moves per rank (default INT_MAX, MPI's int counts); larger
// transfers are split into pieces. Lowered by the tests to exercise the split path with small data.
void set_mpi_max_piece_bytes(int64_t bytes);
}  // namespace detail

}  // namespace laga
