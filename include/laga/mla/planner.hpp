// The analytical planner: per-rank memory and communication of a run, from the configuration alone
// (DESIGN §4–§5), so DeepSeek-V3 scale can be planned on a laptop.
//
// Memory is planned by replaying, tensor by tensor, the allocations and releases the block performs
// (src/mla/block.cpp, src/mla/forms.cpp) with their exact sizes — written here independently of that
// code and checked against the tracking allocator byte for byte by the tests — plus the attention
// kernels' own event lists (attention_memory_events). Communication is the list of collectives each
// form issues with the ledger's byte conventions. Derivations: docs/accounting.md.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "laga/comm/communicator.hpp"
#include "laga/core/config.hpp"

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

PlannedMemory plan_memory(const MlaConfig& c);
PlannedComm plan_comm(const MlaConfig& c);

}  // namespace laga
