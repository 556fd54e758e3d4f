// The planner: per-rank memory, communication and work of a run from its configuration alone
// (docs/design.md §4), so DeepSeek-V3 scale can be planned on a laptop. The plan is the run itself
// — run_rank on meta tensors (core/memory.hpp) with a MetaCommunicator (comm/meta.hpp) — so it
// cannot drift from the code: every tensor the block, the form and the kernels allocate is counted
// with its tag and size, every collective recorded with its bytes, and nothing is computed. The
// closed-form formulas of docs/accounting.md are the independent check
// (tests/memory/test_planner.cpp).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "laga/comm/communicator.hpp"
#include "laga/driver/run.hpp"
#include "laga/mla/config.hpp"

namespace laga {

// A plan's memory is the meta run's measurement: the same report, the same fields.
using PlannedMemory = MemoryReport;

struct PlannedComm {
  std::vector<CollectiveRecord> attention;  // in issue order, forward then backward, every layer
  std::vector<CollectiveRecord> grad_sync;  // one all-reduce per weight gradient
  int64_t tensor_bytes() const;             // attention traffic only
  int64_t wire_bytes() const;
};

struct Plan {
  PlannedMemory memory;
  PlannedComm comm;
  // Every op of forward and backward with its work, and the rank's timeline: ops, and the issue and
  // wait of each attention collective (indices into comm.attention, which precede the grad sync's
  // in the ledger), in the order the form's code ran them (core/work.hpp).
  WorkLedger work;
};

// Rank `rank` of the group (every rank of the registered forms plans alike; rank 0 by default).
Plan plan_run(const Config& c, int rank = 0);
PlannedMemory plan_memory(const Config& c);
// FLOPs of one step (forward + backward) summed over every rank's plan: the work the group
// executes, attention by FlashAttention-3's convention (core/work.hpp).
struct PlannedFlops {
  double forward = 0, backward = 0;
};
PlannedFlops planned_flops(const Config& c);
PlannedComm plan_comm(const Config& c);

}  // namespace laga
