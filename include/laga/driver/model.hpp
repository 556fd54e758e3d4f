// The performance model (docs/model.md): the predicted step time of a form on a user's hardware,
// as a replay of the timeline the planner records by running the form's own code on meta tensors
// (driver/plan.hpp, core/work.hpp) — every op with its FLOPs or bytes, timed at the rate of its
// class, and every collective with the bytes the real code moves, timed as latency + bytes / bus
// bandwidth, issued and waited where the form's code issues and waits it — so the model cannot
// drift from the forms, and overlap follows from where each form waits.
//
// The hardware is a JSON file (HardwareSpec, docs/model.md §2): compute rates per dtype and
// operation class, the bus bandwidth and latency of the link inside a node and across nodes, ranks
// per node. Calibrating it on this machine with laga's own kernels and communicator:
// driver/calibrate.hpp.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "laga/comm/communicator.hpp"
#include "laga/mla/config.hpp"
#include "laga/core/work.hpp"
#include "laga/driver/plan.hpp"

namespace laga {

// The four collectives the forms and the grad sync issue (bench-comm measures the same four).
inline constexpr CollectiveOp kModelledOps[] = {CollectiveOp::all_gather,
                                                CollectiveOp::reduce_scatter,
                                                CollectiveOp::all_to_all, CollectiveOp::all_reduce};

// nccl-tests' conventions (docs/design.md §4). S, the size of a collective: the whole gathered
// array for all_gather and reduce_scatter (P × the shard), the per-rank buffer for all_to_all and
// all_reduce. algbw = S / t; busbw = algbw · bus_factor: (P−1)/P for all_gather, reduce_scatter and
// all_to_all, 2(P−1)/P for all_reduce. So S · bus_factor is the bytes each rank sends (the ledger's
// wire bytes). S from the ledger's tensor bytes
double nccl_size_bytes(CollectiveOp op, int64_t P, double tensor_bytes);
double bus_factor(CollectiveOp op, int64_t P);

// A link. intra_node: the bus bandwidth (nccl-tests' busbw) of each op over ranks of one node.
// inter_node: the bandwidth of one rank's own path to other nodes (its NIC; 1e9 bytes/s), per op.
// host_ns_per_byte (optional): the compute time a collective's bytes take
// from the ranks' cores while it is hidden behind compute, per byte a rank sends: a transport the
// CPU drives (TCP in the kernel, shared-memory copies) slows the compute it overlaps, a NIC's DMA
// does not. Absent: none (what an exposed collective costs the host is inside its measured time
// anyway).
struct LinkSpec {
  std::map<CollectiveOp, double> busbw_GBps;  // per op, GB/s (1e9 bytes per second)
  double latency_s = 0;                       // per collective
  // per op when the file (or a fit) gives one; else latency_s
  std::map<CollectiveOp, double> latency_op_s;
  std::map<CollectiveOp, double> host_ns_per_byte;  // per op, ns per byte sent; empty: none
  double latency(CollectiveOp op) const;
  double host_cost(CollectiveOp op) const;  // seconds per byte sent; 0 when the file gives none
};

// A compute rate that may depend on the sequence length: one number for every T, or rates measured
// at some T (the file's {"2048": x, "8192": y}), read between two of them linearly in log T and
// held at the ends (never extrapolated). A kernel's rate depends on the work per call (here the
// eager fp32 forward runs 9× slower at T 8192 than at 2048), so a rate measured at one T misjudges
// the others (docs/model.md §3).
struct SeqRate {
  std::map<int64_t, double> by_seq;  // T → rate; the key 0 alone: the same rate at every T
  static SeqRate constant(double rate) { return SeqRate{{{0, rate}}}; }
  double at(int64_t T) const;
  nlohmann::json to_json() const;  // a number when constant, else {"T": rate, ...}
};

// The shape of an attention call, which sets its rate: per-head 192/128-like heads (dense),
// per-head 576/512 latent heads (latent: absorbed-expanded), one 576/512 latent head shared by
// every query head (mqa: absorbed-shared), or dense heads whose K and V the kernel up-projects from
// the latent itself, tile by tile (laga_fused: the latent kernel, its rate counting the attention's
// FLOPs and the up-projection's it executes).
// sparse: the sparse forms' latent attention over each query's selection
// (ops/sparse_attention.hpp); indexer: the lightning indexer's scores (ops/indexer.hpp).
enum class AttentionShape { dense, latent, mqa, laga_fused, sparse, indexer };
// "dense", "latent", "mqa", "laga_fused", "sparse", "indexer"
std::string_view attention_shape_name(AttentionShape s);

struct ComputeSpec {
  SeqRate matmul_tflops;     // at the run's T (the projections' rows are T/P)
  SeqRate elementwise_GBps;  // at the run's T
  // Streams at memory speed (copy, add, log-sum-exp merge, zero fill, rounding: the work ledger's
  // accumulate class), GB/s at the run's T. Optional: without it they run at elementwise_GBps,
  // which prices them as norms and rotations (rates_line says which).
  std::optional<SeqRate> accumulate_GBps;
  double accumulate_rate(int64_t T) const {
    return (accumulate_GBps ? *accumulate_GBps : elementwise_GBps).at(T);
  }
  // Attention rates, TFLOP/s in the FlashAttention-3 counting of core/work.hpp, keyed by the file's
  // names: "[eager_][latent_|mqa_|laga_fused_]attention_{fwd,bwd}_tflops", each at the length of
  // one kernel call (its recorded length). attention_fwd_tflops and attention_bwd_tflops
  // (fused, per-head 192/128-like heads) are required; the others are optional.
  // "laga_fused_attention_{fwd,bwd}_tflops" is laga-fused's latent kernel, counting the attention's
  // FLOPs and the up-projection it runs inside (forward U, backward 3U: recomputed, then its
  // dlatent and dwkv products); without it those run at the fused dense attention rate.
  // "sparse_attention_*" is the sparse forms' kernel (without it: the mqa rate, then the dense
  // one), "indexer_attention_*" the lightning indexer's scores, forward its top-k and backward its
  // loss (without it: the dense rate).
  std::map<std::string, SeqRate> attention_tflops;
  // The rate of attention in this regime at call length T; falls back from [eager_][shape_] to
  // [eager_] to the fused dense rate.
  double attention_rate(Kernel kernel, AttentionShape shape, bool backward, int64_t T) const;
};

struct HardwareSpec {
  std::string name, source, path;
  std::map<DType, ComputeSpec> compute;  // at least the dtype being modelled
  LinkSpec intra_node;
  std::optional<LinkSpec> inter_node;  // required when a modelled P exceeds ranks_per_node
  int64_t ranks_per_node = 1;
  nlohmann::json notes;  // free-form, kept as given (sources and assumptions per number)

  // Usage error (exit 2) naming the file and the missing or mistyped field.
  static HardwareSpec from_json(const nlohmann::json& j, const std::string& path);
  static HardwareSpec load(const std::string& path);
  nlohmann::json to_json() const;
  // usage error naming the file and "compute.<dtype>"
  const ComputeSpec& compute_for(DType d) const;
};

struct CollectiveTime {
  CollectiveRecord record;  // as the planner recorded it for this rank
  bool backward = false;
  bool crosses_nodes = false;
  double size_bytes = 0;  // nccl-tests' S
  double busbw_GBps = 0;  // the effective bus bandwidth used
  double latency_s = 0;
  double seconds = 0;  // latency + S · bus_factor / busbw
  // what the rank waited for it in the replay: its whole time where the form waits at once, less
  // what ran behind it where the form waits later, more where a peer issued it late
  double exposed_s = 0;
  // the link's host cost of the bytes this rank sends (charged to compute for the hidden part)
  double host_s = 0;
};

// The replayed time of one op class in one pass (seconds, the work it did: FLOPs or bytes).
struct ClassTime {
  double seconds = 0, work = 0;
  int64_t calls = 0;
};

struct FormPrediction {
  std::string form;
  int64_t rank = 0;  // the rank whose step is the longest: the figures below are its
  // by pass (0 forward, 1 backward) and work class (core/work.hpp)
  std::map<WorkClass, ClassTime> by_class[2];
  std::vector<CollectiveTime> collectives;  // attention traffic only (no grad sync), issue order
  double fwd_compute_s = 0, bwd_compute_s = 0, fwd_comm_s = 0, bwd_comm_s = 0;  // comm: exposed
  // of the compute: the host cost of the hidden collectives' bytes (LinkSpec)
  double hidden_host_s = 0;
  // As laga bench reports them: fwd and bwd include their exposed communication; total = fwd + bwd.
  double fwd_s() const { return fwd_compute_s + fwd_comm_s; }
  double bwd_s() const { return bwd_compute_s + bwd_comm_s; }
  double comm_s() const { return fwd_comm_s + bwd_comm_s; }
  double total_s() const { return fwd_s() + bwd_s(); }
  nlohmann::json to_json() const;
};

// The time of one collective on hw in a job of P ranks (docs/model.md §1), over the group it ran on
// (r.group: a sub-group's n ranks, else all P). A group within one node uses the intra-node link;
// one over several nodes runs its ring collectives at min(intra busbw, m × a rank's inter-node
// bandwidth), m = its ranks per node, and splits the all-to-all's traffic between the two links.
CollectiveTime collective_time(const HardwareSpec& hw, const CollectiveRecord& r, int64_t P);

// The rate key of an attention call in config m (the hardware file's
// "[eager_][latent_|mqa_|laga_fused_]attention_{fwd,bwd}_tflops"), from the call itself: the
// latent kernel's is laga_fused; fewer key/value heads than query heads, mqa; heads as wide as the
// latent (Lkv + Dr), latent; any other, dense.
AttentionShape attention_shape(const WorkRecord& r, const MlaConfig& m);
// Seconds of one recorded op on these rates: its FLOPs or bytes over the rate of its class, read at
// the run's T (matmul, elementwise, accumulate) or at the call's own length (attention).
double work_seconds(const WorkRecord& r, const MlaConfig& m, const ComputeSpec& rates);

// One training step (forward + backward, no grad sync) of c's form: every rank's planned timeline
// (driver/plan.hpp) replayed together (docs/model.md §1). A compute event advances the rank's
// clock by work_seconds; an issue starts the collective once every rank of its group has issued it
// and each one's link is free of the collectives before it; a wait moves the clock to the
// collective's end, and what it waited is exposed. The prediction is the slowest rank's.
FormPrediction predict(const Config& c, const HardwareSpec& hw);
// Every rank's plan of c, what predict replays (rank 0's shared where the ranks plan alike,
// Form::ranks_alike): plan once to predict c on several hardware files.
using RankPlans = std::vector<std::shared_ptr<const Plan>>;
RankPlans plan_ranks(const Config& c);
FormPrediction predict(const Config& c, const HardwareSpec& hw, const RankPlans& plans);

// Least-squares fit of time = latency + bus_bytes / busbw over measured points (bus_bytes = S ·
// bus_factor), weighted by 1/time² so that small and large sizes count alike (relative residuals).
// A negative intercept is refitted as 0 (a line through the origin).
struct LatencyBandwidthFit {
  double latency_s = 0, busbw_GBps = 0;
  double max_rel_residual = 0;
  int points = 0;
};
LatencyBandwidthFit fit_latency_bandwidth(const std::vector<double>& bus_bytes,
                                          const std::vector<double>& seconds);

// A link from a `laga bench-comm --json` document: one fit per op present (rows of the given dtype,
// or of every dtype when none is given). Usage error naming the file when it has no usable rows.
LinkSpec link_from_bench_comm(const nlohmann::json& j, const std::string& path,
                              int64_t* sp_out = nullptr);

// Predicted against measured, per row of a `laga bench --json` document (rows[i].{variant, seq, sp,
// fwd_s, bwd_s, comm_s, total_s} and laga's ulysses, the run's dimensions in "config").
struct BenchRowComparison {
  std::string form;     // as the row names it: "laga (ulysses Pu)" for laga with --ulysses Pu < P
  std::string variant;  // the registered label ("laga")
  int64_t seq = 0, sp = 0;
  int64_t ulysses = 0;  // the row's --ulysses (laga's; 0: Pu = P)
  double measured_fwd = 0, measured_bwd = 0, measured_comm = 0, measured_total = 0;
  // Of measured_comm, the time the ranks waited for each other (bench's comm_skew_s: the same work
  // on every rank, so time the host took from one of them); empty for files written before bench
  // had it.
  std::optional<double> measured_skew;
  // The row's time by op class where its file has one (laga bench's "profile"): "matmul",
  // "attention_fwd", "attention_bwd", and "other" (the rest beside exposed comm), measured against
  // the model's phases of the same class (other: its elementwise phases). Empty for older files.
  std::map<std::string, double> measured_by_class;
  std::map<std::string, double> predicted_by_class() const;
  FormPrediction predicted;
  double rel_error_total() const { return (predicted.total_s() - measured_total) / measured_total; }
  // Against the measured total less its skew: the model on a host that took nothing from any rank.
  // Not the target's figure (that is rel_error_total); it says how much of a miss is the host's.
  std::optional<double> rel_error_without_skew() const {
    if (!measured_skew) return std::nullopt;
    const double t = measured_total - *measured_skew;
    return (predicted.total_s() - t) / t;
  }
};
std::vector<BenchRowComparison> compare_with_bench(const nlohmann::json& bench,
                                                   const std::string& path, const HardwareSpec& hw);

}  // namespace laga
