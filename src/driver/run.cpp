// A measured forward + backward of the block stack on one rank (docs/design.md §4's memory
// semantics). On a communicator that moves no data (MetaCommunicator) the same code runs on meta
// tensors: that is the planner (driver/plan.hpp).
#include "laga/driver/run.hpp"

#include <chrono>
#include <mutex>
#include <optional>

#include <cmath>

#include "laga/core/fault.hpp"
#include "laga/core/random.hpp"
#include "laga/io/checkpoint.hpp"
#include "laga/mla/block.hpp"
#include "laga/mla/form.hpp"
#include "laga/ops/elementwise.hpp"

namespace laga {

namespace {
using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Whole [T, B, D] from every rank's [N, B, D] shard: gathered in rank order, then each rank's
// segments (token_segments) put at their global positions (for the contiguous layout that is the
// identity: shards concatenate).
Tensor gather_rows(const MlaConfig& c, Communicator& comm, const Tensor& shard,
                   const std::string& tag) {
  Shape s = shard.shape();
  s[0] *= comm.size();
  Tensor whole = Tensor::empty(s, shard.dtype(), tag);
  if (form_of(c).layout(c) == TokenLayout::contiguous) {
    comm.all_gather(shard.raw(), whole.raw(), shard.numel(), shard.dtype(), "gather." + tag);
    return whole;
  }
  Tensor by_rank = Tensor::empty(s, shard.dtype(), tag + ".by_rank");
  comm.all_gather(shard.raw(), by_rank.raw(), shard.numel(), shard.dtype(), "gather." + tag);
  const int64_t N = shard.dim(0), row = shard.numel() / std::max<int64_t>(N, 1);
  for (int64_t q = 0; q < comm.size(); ++q) {
    int64_t local = 0;
    for (const TokenSegment& seg : token_segments(c, q)) {
      copy_rows(shard.dtype(), seg.len, row, at(by_rank, (q * N + local) * row), row,
                at(whole, seg.pos0 * row), row);
      local += seg.len;
    }
  }
  return whole;
}
}  // namespace

bool is_grad_sync(const CollectiveRecord& r) { return r.tensor == "grad_sync"; }

double peer_wait_skew(const std::vector<std::vector<double>>& waits) {
  if (waits.empty()) return 0;
  const size_t n = waits.front().size();
  std::vector<double> lo(n, INFINITY);
  for (const auto& w : waits) {
    LAGA_ASSERT(w.size() == n, "ranks recorded {} and {} attention collectives", n, w.size());
    for (size_t i = 0; i < n; ++i) lo[i] = std::min(lo[i], w[i]);
  }
  double most = 0;
  for (const auto& w : waits) {
    double mine = 0;
    for (size_t i = 0; i < n; ++i) mine += w[i] - lo[i];
    most = std::max(most, mine);
  }
  return most;
}

Tensor make_input_shard(const MlaConfig& c, int64_t rank, uint64_t seed, const std::string& name,
                        const std::string& tag) {
  // Each local row holds the values of its global position, so every layout sees the same sequence.
  const int64_t N = c.tokens_per_rank(), row = c.batch * c.hidden_size;
  Tensor t = Tensor::empty({N, c.batch, c.hidden_size}, c.dtype, tag);
  int64_t local = 0;
  for (const TokenSegment& seg : token_segments(c, rank)) {
    Tensor part = t.rows(local, local + seg.len);
    fill_normal(part, seed, name, 1.0, 0.0, seg.pos0 * row);
    local += seg.len;
  }
  return t;
}

RankResult run_rank(const Config& cfg, const RunOptions& opt, Communicator& comm) {
  const MlaConfig& c = *cfg;
  LAGA_CHECK(c.sp == comm.size(), "config says --sp {} but the group has {} ranks", c.sp,
             comm.size());
  const bool meta = !comm.moves_data();  // planning: meta tensors, nothing computed
  LAGA_CHECK(!meta || !opt.gather_tensors, "a planning run (meta tensors) has no values to gather");
  MemoryTracker tracker(meta);
  RankResult r;
  r.rank = comm.rank();
  Tensor y_shard, dx_shard, x_shard, dy_shard;
  std::vector<Tensor> topk_shards;  // per layer, [N, B, k] (the sparse forms, gather_tensors)
  Weights w, g;
  {
    TrackerScope scope(tracker);
    if (opt.initial_weights && !meta) {
      LAGA_CHECK(opt.weights_path.empty(),
                 "run_rank: initial_weights and weights_path {} are two sources of "
                 "weights; give one",
                 opt.weights_path);
      w = allocate_weights(c, "weights");
      copy_weights(w, *opt.initial_weights);
    } else if (opt.weights_path.empty() || meta) {
      w = allocate_weights(c, "weights");
      init_weights(w, c, opt.seed);
    } else {
      w = load_weights(opt.weights_path, c);
    }
    g = zero_grads(c, "grads");
    x_shard = make_input_shard(c, comm.rank(), opt.seed, "x", "input.x");
    dy_shard = make_input_shard(c, comm.rank(), opt.seed, "dy", "input.dy");
    if (!meta) {
      if (poison_point("nan-x", comm.rank())) x_shard.set(x_shard.numel() / 2, NAN);
      if (poison_point("nan-dy", comm.rank())) dy_shard.set(dy_shard.numel() / 2, NAN);
      if (poison_point("inf-wkv_b", comm.rank())) w.layers.back().wkv_b.set(0, INFINITY);
    }
    const int64_t baseline = tracker.live_bytes();
    const std::map<std::string, int64_t> baseline_tags = tracker.live_by_tag();
    r.memory.baseline_bytes = baseline;
    comm.barrier();
    comm.ledger().clear();
    tracker.reset_peak();

    StackSaved saved;
    std::optional<WorkScope> recording(std::in_place, r.work);
    auto t0 = clock_type::now();
    y_shard = stack_forward(cfg, w, x_shard, saved, comm);
    r.forward_s = since(t0);
    if (form_of(c).sparse()) {
      // What the indexer found, read between the passes: the loss, and a copy of the selection
      // outside this rank's tracker and ledger (the run's memory and work are the block's alone).
      TrackerScope out(default_tracker());
      WorkLedger aside;
      WorkScope not_recorded(aside);
      for (const LayerSaved& l : saved.layers) {
        Form::Sparse sp = form_of(c).sparse_of(*l.core);
        r.indexer_loss.push_back(sp.indexer_loss);
        if (opt.gather_tensors) topk_shards.push_back(sp.topk.clone("topk"));
      }
    }
    r.work.mark_backward();
    r.memory.saved_bytes = tracker.live_bytes() - baseline;
    for (const auto& [tag, bytes] : tracker.live_by_tag()) {
      const auto it = baseline_tags.find(tag);
      if (const int64_t extra = bytes - (it == baseline_tags.end() ? 0 : it->second))
        r.memory.saved_breakdown[tag] = extra;
    }
    r.memory.forward_peak_bytes = tracker.peak_bytes() - baseline;
    auto forward_breakdown = tracker.peak_by_tag();
    tracker.reset_peak();
    auto t1 = clock_type::now();
    dx_shard = stack_backward(cfg, w, saved, dy_shard, g, comm);
    r.backward_s = since(t1);
    recording.reset();
    r.memory.backward_peak_bytes = tracker.peak_bytes() - baseline;
    r.memory.activation_peak_bytes =
        std::max(r.memory.forward_peak_bytes, r.memory.backward_peak_bytes);
    r.memory.peak_breakdown = r.memory.forward_peak_bytes >= r.memory.backward_peak_bytes
                                  ? forward_breakdown
                                  : tracker.peak_by_tag();
    if (opt.grad_sync) {
      auto t2 = clock_type::now();
      g.for_each([&](const std::string&, Tensor& t) {
        comm.all_reduce(t.raw(), t.numel(), t.dtype(), "grad_sync");
      });
      r.grad_sync_s = since(t2);
    }
    r.collectives = comm.ledger().records();
  }
  if (opt.gather_tensors) {
    // Whole tensors outlive this rank's tracker: they are made on the default one.
    TrackerScope out(default_tracker());
    r.x = gather_rows(c, comm, x_shard, "x");
    r.dy = gather_rows(c, comm, dy_shard, "dy");
    r.y = gather_rows(c, comm, y_shard, "y");
    r.dx = gather_rows(c, comm, dx_shard, "dx");
    for (const Tensor& t : topk_shards) r.topk.push_back(gather_rows(c, comm, t, "topk"));
    // The weights and the synced gradients as they are, handed to the default tracker (not copied).
    auto hand_over = [](const std::string&, Tensor& t) { t.hand_over(default_tracker()); };
    r.weights = std::move(w);
    r.grads = std::move(g);
    r.weights.for_each(hand_over);
    r.grads.for_each(hand_over);
  }
  return r;
}

std::vector<RankResult> run_group(const Config& c, const RunOptions& opt, double timeout_s) {
  std::vector<RankResult> results(size_t(c->sp));
  run_threads(
      int(c->sp),
      [&](Communicator& comm) { results[size_t(comm.rank())] = run_rank(c, opt, comm); },
      timeout_s);
  return results;
}

}  // namespace laga
