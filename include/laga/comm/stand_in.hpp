// A communicator that plays one rank of a P-rank group alone, standing in for the other P − 1 ranks:
// every collective moves exactly the bytes a real group would through this rank — and is recorded
// in the ledger the same way — and the chunks that would come from the absent ranks are filled with
// data of the right shape (each absent rank j "sends" what this rank sends, so values keep realistic
// magnitudes). For measuring one rank's memory and traffic at scales one machine cannot hold whole,
// e.g. DeepSeek-V3 at P = 8; never for checking numbers.
#pragma once

#include "laga/comm/communicator.hpp"

namespace laga {

class StandInCommunicator final : public Communicator {
 public:
  StandInCommunicator(int rank, int size);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "stand-in"; }
  void abort(const std::string& reason) override;

 protected:
  void do_all_gather(const void* in, void* out, int64_t bytes) override;
  void do_all_to_all(const void* in, void* out, int64_t bytes_per_peer) override;
  void do_broadcast(void* buf, int64_t bytes, int root) override {}
  void do_barrier() override {}

 private:
  int rank_, size_;
};

}  // namespace laga
