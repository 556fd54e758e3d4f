// A communicator that plays one rank of a P-rank group alone, standing in for the other P − 1
// ranks: every collective moves exactly the bytes a real group would through this rank — and is
// recorded in the ledger the same way — and the chunks that would come from the absent ranks are
// filled with data of the right shape (each absent rank j "sends" what this rank sends, so values
// keep realistic magnitudes). For measuring one rank's memory and traffic at scales one machine
// cannot hold whole, e.g. DeepSeek-V3 at P = 8; never for checking numbers. Its collectives
// complete at once (the shared structure is NoPeersCommunicator); MetaCommunicator (meta.hpp) is
// the same without data.
#pragma once

#include "laga/comm/no_peers.hpp"

namespace laga {

class StandInCommunicator final : public NoPeersCommunicator {
 public:
  StandInCommunicator(int rank, int size) : NoPeersCommunicator(rank, size) {}
  std::string backend() const override { return "stand-in"; }

 protected:
  void fill(const RawOp& op) override;
  std::unique_ptr<Communicator> make(int rank, int P) const override;
};

}  // namespace laga
