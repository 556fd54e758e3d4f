// The planner (plan.hpp): run_rank on meta tensors with a MetaCommunicator.
#include "laga/driver/plan.hpp"

#include "laga/comm/meta.hpp"
#include "laga/driver/run.hpp"

namespace laga {

Plan plan_run(const Config& c, int rank) {
  MetaCommunicator comm(rank, int(c->sp));
  RunOptions opt;  // meta: no values, so no seed, weights file or gathering matters
  RankResult r = run_rank(c, opt, comm);
  Plan p;
  p.memory = std::move(r.memory);
  p.work = std::move(r.work);
  for (const auto& rec : r.collectives)
    (is_grad_sync(rec) ? p.comm.grad_sync : p.comm.attention).push_back(rec);
  return p;
}

PlannedMemory plan_memory(const Config& c) { return plan_run(c).memory; }
PlannedComm plan_comm(const Config& c) { return plan_run(c).comm; }

PlannedFlops planned_flops(const Config& c) {
  PlannedFlops f;
  for (int r = 0; r < int(c->sp); ++r) {
    const WorkLedger w = plan_run(c, r).work;
    f.forward += w.flops(false), f.backward += w.flops(true);
  }
  return f;
}

int64_t PlannedComm::tensor_bytes() const {
  int64_t s = 0;
  for (const auto& r : attention) s += r.tensor_bytes;
  return s;
}

int64_t PlannedComm::wire_bytes() const {
  int64_t s = 0;
  for (const auto& r : attention) s += r.wire_bytes;
  return s;
}

}  // namespace laga
