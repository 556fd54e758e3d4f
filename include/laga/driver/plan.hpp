// The planner: per-rank memory and communication of a run from its configuration alone (docs/design.md
// §4), so DeepSeek-V3 scale can be planned on a laptop. The plan is the run itself — run_rank on meta
// tensors (core/memory.hpp) with a MetaCommunicator (comm/meta.hpp) — so it cannot drift from the code:
// every tensor the block, the form and the kernels allocate is counted with its tag and size, every
// collective recorded with its bytes, and nothing is computed. The closed-form formulas of
// docs/accounting.md are the independent check (tests/memory/test_planner.cpp).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "laga/comm/communicator.hpp"
#include "laga/mla/config.hpp"

namespace laga {

struct PlannedMemory {
  int64_t baseline_bytes = 0;         // weights + fp32 weight grads + x + dy shards
  int64_t activation_peak_bytes = 0;  // max over forward+backward of live − baseline
  int64_t saved_bytes = 0;            // live − baseline at the end of forward
  int64_t forward_peak_bytes = 0;
  int64_t backward_peak_bytes = 0;
  std::map<std::string, int64_t> peak_breakdown;  // live bytes by tag at the peak (baseline tags included)
  std::map<std::string, int64_t> saved_breakdown; // live bytes by tag at the end of forward, baseline excluded
};

struct PlannedComm {
  std::vector<CollectiveRecord> attention;  // in issue order, forward then backward, every layer
  std::vector<CollectiveRecord> grad_sync;  // one all-reduce per weight gradient
  int64_t tensor_bytes() const;             // attention traffic only
  int64_t wire_bytes() const;
};

struct Plan {
  PlannedMemory memory;
  PlannedComm comm;
};

// Rank `rank` of the group (every rank of the registered forms plans alike; rank 0 by default).
Plan plan_run(const Config& c, int rank = 0);
PlannedMemory plan_memory(const Config& c);
PlannedComm plan_comm(const Config& c);

}  // namespace laga
