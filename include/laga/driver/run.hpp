// One forward + backward of the block stack as a measured run on one rank of a group: weights and
// this rank's shard of x and dy drawn from a seed (or weights loaded from a file), the baseline
// allocated first, then forward, backward and the grad sync, with memory measured per
// docs/design.md §4, the communication ledger, and times per phase. run_group runs every rank as a
// thread. On a communicator that moves no data (comm/meta.hpp) the run is on meta tensors: the
// plan.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "laga/comm/communicator.hpp"
#include "laga/mla/config.hpp"
#include "laga/core/memory.hpp"
#include "laga/core/work.hpp"
#include "laga/mla/weights.hpp"

namespace laga {

struct RunOptions {
  uint64_t seed = 1234;
  std::string weights_path;  // empty: init_weights(seed)
  // Set: the weights are copied from here instead of drawn: the values init_weights(seed) gives
  // this config's model and dtype, drawn once by a caller that runs many forms and P on them
  // (verify). The copy is allocated and tracked as a drawn one is. Not with weights_path.
  const Weights* initial_weights = nullptr;
  // gather whole x, dy, y, dx, weights and synced grads (for dumps, checks)
  bool gather_tensors = false;
  bool grad_sync = true;  // all-reduce the weight gradients over the group after backward
};

struct MemoryReport {
  int64_t baseline_bytes = 0;         // weights + weight grads + x + dy
  int64_t activation_peak_bytes = 0;  // max over forward+backward of (live − baseline)
  int64_t saved_bytes = 0;            // live − baseline at the end of forward
  int64_t forward_peak_bytes = 0;     // max over forward of (live − baseline)
  int64_t backward_peak_bytes = 0;    // max over backward of (live − baseline)
  // live bytes by tag at the peak (baseline tags included)
  std::map<std::string, int64_t> peak_breakdown;
  std::map<std::string, int64_t>
      saved_breakdown;  // live bytes by tag at the end of forward, baseline excluded
};

struct RankResult {
  int rank = 0;
  MemoryReport memory;
  double forward_s = 0, backward_s = 0, grad_sync_s = 0;
  std::vector<CollectiveRecord> collectives;  // this rank's ledger, attention and grad sync
  // forward + backward: every op with its work (and time, when real), and the timeline of ops and
  // this rank's attention collectives (core/work.hpp); its issue/wait indices are into collectives
  WorkLedger work;
  // With gather_tensors: whole tensors [T, B, D] and the synced gradients, on every rank.
  Tensor x, dy, y, dx;
  Weights weights, grads;
  // The sparse forms (Form::sparse), per layer: the indexer's loss L_I over this rank's queries
  // (the run's is the sum over ranks), and with gather_tensors the whole selection [T, B, k] (int32
  // key positions, ascending, −1 padded), on every rank. Empty for a dense form.
  std::vector<double> indexer_loss;
  std::vector<Tensor> topk;
};

// This rank's shard of input `name` ("x" or "dy"): the rows of its token segments (token_segments:
// [r·N, (r+1)·N) for the contiguous layout) of a [T, B, D] tensor drawn as N(0, 1) from the seed —
// the same whole tensor whatever P and the layout are.
Tensor make_input_shard(const MlaConfig& c, int64_t rank, uint64_t seed, const std::string& name,
                        const std::string& tag);

RankResult run_rank(const Config& c, const RunOptions& opt, Communicator& comm);
// Every rank as a thread; results in rank order.
std::vector<RankResult> run_group(const Config& c, const RunOptions& opt, double timeout_s = 0);

// Attention traffic (everything but the grad sync) and the grad sync, from a ledger.
bool is_grad_sync(const CollectiveRecord& r);

// The ranks' skew from each rank's waits, per attention collective in issue order (the same count
// on every rank): the most any one rank waited for its peers, Σ_i (w[r][i] − min_r' w[r'][i])
// maximised over r. The rank that arrives last at collective i waits only for the transfer, so what
// another rank waits beyond that is waiting for a peer. Never more than the largest rank's total
// wait (the exposed communication), and exactly 0 with one rank. Throws when the ranks' counts
// differ.
double peer_wait_skew(const std::vector<std::vector<double>>& waits);

}  // namespace laga
