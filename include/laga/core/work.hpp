// The work ledger: every op a rank executes — matmuls, attention kernels, norms, RoPE, copies,
// merges, fills and dtype conversions — records its class, dtype, FLOPs or bytes and the
// dimensions that set its rate, in the order the rank's code ran it; the communicator adds where
// each collective was issued and where the rank waited for it. Work and communication so share one
// sequence, the rank's timeline, beside the memory tracker (core/memory.hpp) and the
// communication ledger (comm/communicator.hpp).
//
// An op records at its entry, before it looks at data, so a run on meta tensors (the plan,
// driver/plan.hpp) records exactly what a real run does; a real run also times each op. The
// performance model replays the plan's timeline (driver/model.hpp); `laga bench` reports the real
// run's totals by class (--profile).
//
// Collection is per thread: a WorkScope makes a ledger current on its thread (a rank is one
// thread, or one process under MPI). Only the outermost op counts (the eager kernel's products are
// attention, not matmul; a kernel's own scratch fills are the kernel's), and threads without a
// current ledger (OpenMP workers) record nothing, so every second and every FLOP is counted once.
// Without a scope an op's record costs one thread-local read.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "laga/core/dtype.hpp"

namespace laga {

// The class of hardware rate an op runs at (a hardware file's compute section, docs/model.md §2).
// elementwise: normalisations, rotations and head sums, arithmetic per element; accumulate: streams
// that only copy, add, merge, fill or round (K/V assembly, the all-to-alls' packing, the ring
// forms' log-sum-exp merges and fp32 accumulators, zero fills, conversions), which run at memory
// speed with little arithmetic.
enum class WorkClass { matmul, attention_forward, attention_backward, elementwise, accumulate };
inline constexpr WorkClass kWorkClasses[] = {WorkClass::matmul, WorkClass::attention_forward,
                                             WorkClass::attention_backward, WorkClass::elementwise,
                                             WorkClass::accumulate};
// "matmul", "attention_fwd", "attention_bwd", "elementwise", "accumulate"
const char* work_class_name(WorkClass k);
// Work in bytes (elementwise, accumulate) rather than FLOPs.
inline bool by_bytes(WorkClass k) {
  return k == WorkClass::elementwise || k == WorkClass::accumulate;
}

// Which attention kernel ran a call (its rate is the kernel's): eager, fused, the latent kernel
// that up-projects K and V from the latent inside itself, the sparse latent attention over each
// query's selected keys, or the lightning indexer's scores (ops/sparse_attention.hpp,
// ops/indexer.hpp).
enum class AttentionKernel : uint8_t { none, eager, fused, latent, sparse, indexer };

struct WorkRecord {
  WorkClass cls = WorkClass::matmul;
  const char* op = "";  // "matmul", "attention", "rmsnorm", "rope", "copy", "merge", "fill", ...
  DType dtype = DType::f32;
  // matmul: 2·batch·M·N·K; attention: FlashAttention-3's convention (forward 2·B·Hq·T·avg_kv·(Dqk
  // + Dv), causal avg_kv = (T+1)/2, backward 2.5×), and for the latent kernel the up-projection's
  // products it runs inside (forward once, backward three times: recomputed, dlatent and dwkv).
  double flops = 0;
  double bytes = 0;  // elementwise and accumulate: bytes read + written
  // matmul: batch, M, N, K; attention: T (queries = keys of the call), Hq, Hkv, Dqk, Dv
  int64_t dims[5] = {0, 0, 0, 0, 0};
  AttentionKernel kernel = AttentionKernel::none;
  double seconds = 0;  // a real run's wall time of the op; 0 on meta tensors
  double work() const { return by_bytes(cls) ? bytes : flops; }
};

// The record of an elementwise or accumulate op of `bytes` read + written.
inline WorkRecord stream_work(WorkClass k, const char* op, DType dtype, double bytes) {
  WorkRecord r;
  r.cls = k, r.op = op, r.dtype = dtype, r.bytes = bytes;
  return r;
}

// One step of a rank's timeline: an op ran (index into the ledger's records), or a collective was
// issued or waited for (index into the communication ledger's records: its issue order).
struct TimelineEvent {
  enum class Kind : uint8_t { compute, issue, wait };
  Kind kind;
  int64_t index;
};

struct ClassTotals {
  double seconds = 0, flops = 0, bytes = 0;
  int64_t calls = 0;
};

class WorkLedger {
 public:
  std::vector<WorkRecord> records;      // in the order the ops ran
  std::vector<TimelineEvent> timeline;  // compute, issue and wait events, in the rank's order
  // Where backward begins: the first timeline event and the first record of the backward pass (a
  // run sets them between its passes; both stay 0 where nothing marks a pass).
  size_t backward_begins = 0, backward_records = 0;
  void mark_backward() { backward_begins = timeline.size(), backward_records = records.size(); }
  void clear() { records.clear(), timeline.clear(), backward_begins = backward_records = 0; }
  // FLOPs of one pass (records before backward_records: forward), every class.
  double flops(bool backward) const;
  std::map<WorkClass, ClassTotals> totals() const;  // every class, zero where none ran
  double seconds() const;                           // over every class
  // matmul by shape, "M×N×K dtype" (batch products "b×M×N×K"): where a slow matmul class comes
  // from.
  std::map<std::string, ClassTotals> matmul_shapes() const;
  // {"matmul": {"seconds", "flops", "bytes", "calls"}, ..., "matmul_shapes": {...}}
  nlohmann::json to_json() const;
};

// Makes l this thread's current ledger until destroyed (the previous one then again). Nestable.
class WorkScope {
 public:
  explicit WorkScope(WorkLedger& l);
  ~WorkScope();
  WorkScope(const WorkScope&) = delete;
  WorkScope& operator=(const WorkScope&) = delete;

 private:
  WorkLedger* prev_;
};

// Records the enclosing op into the thread's current ledger, if any and if no recorded op encloses
// it, and times it (unless it runs on meta tensors). Constructed at the op's entry, before any
// early return for meta tensors, and alive until the op is done.
class WorkOp {
 public:
  explicit WorkOp(const WorkRecord& r);
  ~WorkOp();
  WorkOp(const WorkOp&) = delete;
  WorkOp& operator=(const WorkOp&) = delete;

 private:
  WorkLedger* target_ = nullptr;  // null: not recording (no ledger, or nested)
  bool counted_ = false;          // opened with a ledger current: counted in the thread's depth
  size_t index_ = 0;
  std::chrono::steady_clock::time_point t0_;
};

// The communicator's part of the timeline: collective `index` (its ledger position) was issued, or
// waited for, on this thread. Nothing without a current ledger.
void note_collective_issue(int64_t index);
void note_collective_wait(int64_t index);

}  // namespace laga
