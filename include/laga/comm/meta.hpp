// MetaCommunicator: one rank of a P-rank group for memory and traffic planning, the way PyTorch's
// meta device runs real code on tensors without data. Every collective is checked (counts, roots)
// and recorded in the ledger with exactly the byte counts a real group of P would record, but it
// reads and writes no memory — buffers may be null even for n > 0 — allocates no scratch (the
// reductions skip their scratch and sums), and completes at once. check_same_everywhere passes.
// Not here: made-up data for code that needs values (StandInCommunicator, stand_in.hpp).
#pragma once

#include "laga/comm/no_peers.hpp"

namespace laga {

class MetaCommunicator final : public NoPeersCommunicator {
 public:
  MetaCommunicator(int rank, int size) : NoPeersCommunicator(rank, size) {}
  std::string backend() const override { return "meta"; }
  bool moves_data() const override { return false; }

 protected:
  void fill(const RawOp&) override {}
  std::unique_ptr<Communicator> make(int rank, int P) const override;
};

}  // namespace laga
