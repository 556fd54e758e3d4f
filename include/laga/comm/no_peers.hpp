// NoPeersCommunicator: the shared structure of communicators that play one rank of a P-rank group
// alone (StandInCommunicator, MetaCommunicator): there are no peers to wait for, so every raw
// operation completes inside its start call (a handle is done at once; waits return at once), no
// timeout can pass, and abort() just throws on this rank. What a subclass decides is what the
// absent ranks' chunks hold (fill). Not here: real groups (run_threads, run_mpi).
#pragma once

#include <memory>
#include <string>

#include "laga/comm/communicator.hpp"

namespace laga {

class NoPeersCommunicator : public Communicator {
 public:
  NoPeersCommunicator(int rank, int size);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Throws laga::Error(failure) naming this rank: there is no group to bring down.
  void abort(const std::string& reason) override;

 protected:
  // What the raw operation leaves in op.recv on this rank (never called with op.bytes == 0).
  virtual void fill(const RawOp& op) = 0;
  // A communicator of the same kind for this rank in a group of P (first_ranks).
  virtual std::unique_ptr<Communicator> make(int rank, int P) const = 0;

  std::unique_ptr<RawRequest> start_raw(const RawOp& op) final;
  bool test_raw(RawRequest&) final { return true; }
  void idle(int, double) final {}
  [[noreturn]] void timed_out(RawRequest& r) final;
  std::unique_ptr<Communicator> first_ranks_of(int P) final;
  std::unique_ptr<Communicator> split_of(int color, int key, int sub_rank, int sub_size) final;

 private:
  int rank_, size_;
};

}  // namespace laga
