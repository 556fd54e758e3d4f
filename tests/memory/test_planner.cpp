// The planner (run_rank on meta tensors) against the tracking allocator and the ledger of real
// runs: every memory figure equal to the byte, every collective equal in operation, tensor, dtype
// and both byte counts, over a sweep of small configurations (T, P, H, L, q_lora_rank, B, both
// dtypes, every registered form and kernel; and the attention alone). And the plan against the
// closed-form formulas of docs/accounting.md, written here from the dataflow, not from the code:
// saved bytes per form, laga's excess over explicit, the attention alone's saving, and the
// communication of each form in both byte conventions, at several points up to DeepSeek-V3.
#include <gtest/gtest.h>

#include "laga/driver/plan.hpp"
#include "laga/driver/run.hpp"
#include "laga/mla/form.hpp"

using namespace laga;

namespace {

struct Case {
  std::string form;
  Kernel kernel;
  DType dt;
  int64_t T, P, H, L, Lq, B;
  DlatentSum dlatent_sum = DlatentSum::storage;
  AttnBackward attn_backward = AttnBackward::two_pass;
};

std::string name(const Case& k) {
  return fmt::format("{} {} {} T{} P{} H{} L{} Lq{} B{} dlatent sum {} attn backward {}", k.form,
                     kernel_name(k.kernel), dtype_name(k.dt), k.T, k.P, k.H, k.L, k.Lq, k.B,
                     dlatent_sum_name(k.dlatent_sum), attn_backward_name(k.attn_backward));
}

MlaConfig config(const Case& k) {
  MlaConfig c = MlaConfig::preset("tiny");
  c.form = k.form, c.kernel = k.kernel, c.dtype = k.dt, c.dlatent_sum = k.dlatent_sum,
  c.attn_backward = k.attn_backward;
  c.seq_len = k.T, c.sp = k.P, c.num_attention_heads = k.H, c.num_layers = k.L,
  c.q_lora_rank = k.Lq, c.batch = k.B;
  return c;
}

std::vector<Case> sweep() {
  std::vector<Case> cases;
  int i = 0;
  for (const Form* form : registered_forms())
    for (Kernel kernel : {Kernel::fused, Kernel::eager})
      for (DType dt : {DType::f32, DType::bf16}) {
        // Vary the shape with the case so the sweep covers T, P, H, L, Lq and B without a full
        // product.
        const int64_t Ts[] = {16, 40, 64, 24}, Ps[] = {1, 2, 4, 8}, Hs[] = {8, 8, 16, 8};
        const int64_t P = Ps[(i / 2) % 4], H = Hs[i % 4];
        // A zigzag form needs T a multiple of 2P (over groups, of 2·Pr, which divides it): the next
        // one up.
        const int64_t T = form->layout(MlaConfig{}) != TokenLayout::contiguous
                              ? (Ts[i % 4] + 2 * P - 1) / (2 * P) * (2 * P)
                              : Ts[i % 4];
        cases.push_back({std::string(form->name()), kernel, dt, T, P, H, 1 + i % 2,
                         // the sparse forms need the query latent (their indexer reads it)
                         (i % 3 == 2 && !form->sparse()) ? 0 : 48, 1 + (i % 5 == 4),
                         i % 3 == 1 ? DlatentSum::storage : DlatentSum::fp32,
                         kernel == Kernel::fused && i % 4 < 2 ? AttnBackward::one_pass
                                                              : AttnBackward::two_pass});
        ++i;
      }
  return cases;
}

}  // namespace

// With overlap on and off: overlap changes when buffers held by collectives in flight are released,
// so it can change the peaks (never the saved bytes); the plan follows, being the same code.
TEST(Planner, MatchesMeasuredMemoryAndLedgerToTheByte) {
  for (const Case& k : sweep())
    for (bool overlap : {false, true}) {
      MlaConfig c = config(k);
      c.overlap = overlap;
      const PlannedMemory plan = plan_memory(c);
      const PlannedComm comm = plan_comm(c);
      const std::vector<RankResult> ranks = run_group(c, RunOptions{});
      for (const RankResult& r : ranks) {
        SCOPED_TRACE(name(k) + (overlap ? " overlap on" : " overlap off") + " rank " +
                     std::to_string(r.rank));
        EXPECT_EQ(plan.baseline_bytes, r.memory.baseline_bytes);
        EXPECT_EQ(plan.activation_peak_bytes, r.memory.activation_peak_bytes);
        EXPECT_EQ(plan.saved_bytes, r.memory.saved_bytes);
        EXPECT_EQ(plan.forward_peak_bytes, r.memory.forward_peak_bytes);
        EXPECT_EQ(plan.backward_peak_bytes, r.memory.backward_peak_bytes);
        EXPECT_EQ(plan.peak_breakdown, r.memory.peak_breakdown);
        std::vector<CollectiveRecord> planned = comm.attention;
        planned.insert(planned.end(), comm.grad_sync.begin(), comm.grad_sync.end());
        ASSERT_EQ(planned.size(), r.collectives.size());
        for (size_t i = 0; i < planned.size(); ++i) {
          const auto &p = planned[i], &m = r.collectives[i];
          EXPECT_EQ(p.op, m.op) << i;
          EXPECT_EQ(p.tensor, m.tensor) << i;
          EXPECT_EQ(p.dtype, m.dtype) << i;
          EXPECT_EQ(p.tensor_bytes, m.tensor_bytes) << i << " " << p.tensor;
          EXPECT_EQ(p.wire_bytes, m.wire_bytes) << i << " " << p.tensor;
        }
      }
    }
}

// The plan's work ledger is the real run's: every registered form, P 1–4, both kernels and both
// dtypes, each rank's meta timeline holds the ops a real run profiles, in the same order, with the
// same FLOPs and bytes per class to the FLOP and the byte, and the same issues and waits.
TEST(Planner, MatchesProfiledWorkToTheFlop) {
  for (int64_t P = 1; P <= 4; ++P)
    for (Kernel kernel : {Kernel::fused, Kernel::eager})
      for (DType dt : {DType::f32, DType::bf16}) {
        MlaConfig base = MlaConfig::preset("tiny");
        base.seq_len = 24, base.sp = P, base.kernel = kernel, base.dtype = dt, base.num_layers = 2;
        base.overlap = P % 2 == 0;
        const FormsAt at = judge_forms(base);
        for (const Form* f : at.runnable) {
          const Config c(as_form(base, f->name()));
          const std::vector<RankResult> ranks = run_group(c, RunOptions{});
          for (const RankResult& r : ranks) {
            SCOPED_TRACE(fmt::format("{} P {} {} {} rank {}", f->name(), P, kernel_name(kernel),
                                     dtype_name(dt), r.rank));
            const WorkLedger planned = plan_run(c, r.rank).work;
            const auto want = r.work.totals(), got = planned.totals();
            for (WorkClass k : kWorkClasses) {
              EXPECT_EQ(got.at(k).flops, want.at(k).flops) << work_class_name(k);
              EXPECT_EQ(got.at(k).bytes, want.at(k).bytes) << work_class_name(k);
              EXPECT_EQ(got.at(k).calls, want.at(k).calls) << work_class_name(k);
            }
            EXPECT_GT(want.at(WorkClass::matmul).flops, 0);
            EXPECT_GT(want.at(WorkClass::attention_backward).flops, 0);
            EXPECT_GT(want.at(WorkClass::elementwise).bytes, 0);
            ASSERT_EQ(planned.timeline.size(), r.work.timeline.size());
            for (size_t i = 0; i < planned.timeline.size(); ++i) {
              EXPECT_EQ(planned.timeline[i].kind, r.work.timeline[i].kind) << i;
              EXPECT_EQ(planned.timeline[i].index, r.work.timeline[i].index) << i;
            }
            EXPECT_EQ(planned.backward_begins, r.work.backward_begins);
            for (size_t i = 0; i < planned.records.size(); ++i)
              EXPECT_STREQ(planned.records[i].op, r.work.records[i].op) << i;
          }
        }
      }
}

// The attention alone (attention_only: no input norm, no residual) is planned as it runs: every
// registered form at P 1 (fp32, B 2), 2 (bf16, overlap on) and 4 (bf16), each rank's memory
// figures, ledger and work equal to its real run's; and it saves, per layer and rank, exactly the
// whole block's bytes less the input norm's output xn [N, B, D] (its xn is its input, no copy).
TEST(Planner, PlansTheAttentionAloneAsMeasuredWithoutTheInputNormsActivation) {
  for (int64_t P : {1, 2, 4}) {
    const DType dt = P == 1 ? DType::f32 : DType::bf16;
    MlaConfig base = MlaConfig::preset("tiny");
    base.seq_len = 24, base.sp = P, base.dtype = dt, base.num_layers = 2;
    base.batch = P == 1 ? 2 : 1, base.overlap = P == 2;
    const FormsAt at = judge_forms(base);
    EXPECT_EQ(at.runnable.size(), registered_forms().size()) << "every form runs tiny at T 24";
    for (const Form* f : at.runnable) {
      SCOPED_TRACE(fmt::format("{} P {} {}", f->name(), P, dtype_name(dt)));
      const Config whole(as_form(base, f->name()));
      const Config c = whole.with([](MlaConfig& m) { m.attention_only = true; });
      const int64_t xn_bytes =
          c->num_layers * c->tokens_per_rank() * c->batch * c->hidden_size * dtype_size(dt);
      EXPECT_EQ(plan_memory(c).saved_bytes, plan_memory(whole).saved_bytes - xn_bytes);
      for (const RankResult& r : run_group(c, RunOptions{})) {
        SCOPED_TRACE(fmt::format("rank {}", r.rank));
        const Plan plan = plan_run(c, r.rank);
        EXPECT_EQ(plan.memory.baseline_bytes, r.memory.baseline_bytes);
        EXPECT_EQ(plan.memory.activation_peak_bytes, r.memory.activation_peak_bytes);
        EXPECT_EQ(plan.memory.saved_bytes, r.memory.saved_bytes);
        EXPECT_EQ(plan.memory.forward_peak_bytes, r.memory.forward_peak_bytes);
        EXPECT_EQ(plan.memory.backward_peak_bytes, r.memory.backward_peak_bytes);
        EXPECT_EQ(plan.memory.peak_breakdown, r.memory.peak_breakdown);
        EXPECT_EQ(r.memory.saved_breakdown.count("act.xn"), 0u);
        std::vector<CollectiveRecord> planned = plan.comm.attention;
        planned.insert(planned.end(), plan.comm.grad_sync.begin(), plan.comm.grad_sync.end());
        ASSERT_EQ(planned.size(), r.collectives.size());
        for (size_t i = 0; i < planned.size(); ++i) {
          EXPECT_EQ(planned[i].tensor, r.collectives[i].tensor) << i;
          EXPECT_EQ(planned[i].wire_bytes, r.collectives[i].wire_bytes) << i;
        }
        const auto want = r.work.totals(), got = plan.work.totals();
        for (WorkClass k : kWorkClasses) {
          EXPECT_EQ(got.at(k).flops, want.at(k).flops) << work_class_name(k);
          EXPECT_EQ(got.at(k).bytes, want.at(k).bytes) << work_class_name(k);
        }
      }
    }
  }
}

// Closed forms (docs/accounting.md §2 and §5), per rank: s bytes per element, E = N·B local rows,
// G = T·B gathered rows.
struct ClosedForm {
  int64_t saved, tensor, wire;
};

ClosedForm closed_form(const MlaConfig& c) {
  const int64_t s = dtype_size(c.dtype), P = c.sp, N = c.seq_len / P, E = N * c.batch,
                G = c.seq_len * c.batch;
  const int64_t D = c.hidden_size, H = c.num_attention_heads, Hr = H / P, Lq = c.q_lora_rank,
                Lkv = c.kv_lora_rank;
  const int64_t Dr = c.qk_rope_head_dim, Dqk = c.qk_head_dim(), Dv = c.v_head_dim, Dl = Lkv + Dr,
                T = c.seq_len;
  // Every form: xn, cq and cqn, kv, o (wo's input), y; and the attention kernel's own saved tensor.
  int64_t saved = (2 * E * D + 2 * E * Lq + E * (Lkv + Dr) + E * H * Dv) * s;
  if (c.form == "ring-kv") {
    // The local latent, q, k, v, and o (the block's o: the same storage) and each local chunk's
    // fp32 lse (the fused kernel's whatever --kernel says); per layer and rank, P − 1 hops of k and
    // v forward, again in backward, and of fp32 dk and dv: tensor = wire bytes.
    ClosedForm f;
    f.saved = c.num_layers * (saved + (E * Dl + E * H * (2 * Dqk + Dv)) * s + c.batch * H * N * 4);
    f.tensor = f.wire = c.num_layers * (P - 1) * E * H * (Dqk + Dv) * (2 * s + 4);
    return f;
  }
  if (c.form == "laga-ulysses") {
    // Eg = Pu·E rows of the group: its gathered latent, q and o on this rank's Hr heads (E·H
    // elements each per head dim) and the fp32 lse of the fused kernel (whatever --kernel says);
    // per layer and rank, in the group, the latent's all-gather and its reduce-scatter (partials in
    // the dlatent-sum dtype) and the all-to-alls of q, o and their adjoints, and around the ring of
    // Pr groups, Pr − 1 hops of the group's latent forward, again in backward, and of its fp32
    // dlatent.
    const int64_t Pu = c.ulysses, Pr = P / Pu, Eg = Pu * E;
    const int64_t a2a = E * H * (Dqk + Dv) * s, gathered = E * Dl * s,
                  reduced = E * Dl * dtype_size(c.dlatent_sum_dtype()),
                  ring = (Pr - 1) * Eg * Dl * (2 * s + 4);
    ClosedForm f;
    f.saved = c.num_layers * (saved + (Eg * Dl + E * H * (Dqk + Dv)) * s + c.batch * H * N * 4);
    f.tensor = c.num_layers * (2 * a2a + gathered + reduced + ring);
    f.wire = c.num_layers * (2 * (a2a / Pu * (Pu - 1)) + (gathered + reduced) * (Pu - 1) + ring);
    return f;
  }
  if (c.form == "dsa-gather" || c.form == "dsa-regather") {
    // The queries' own tensors on this rank: q, o_lat and the fp32 lse of the sparse kernel; the
    // indexer's saved gradients of q^I and w^I, its key's LayerNorm input and gradient, and the
    // selection (int32). dsa-gather keeps the gathered latent and q_abs, dsa-regather its local
    // latent alone. Per layer and rank: the latent's and the index key's all-gathers, the index
    // key's fp32 gradient reduce-scattered, the dlatent's (dlatent-sum dtype), and dsa-regather's
    // second all-gather of the latent in backward.
    const bool regather = c.form == "dsa-regather";
    const int64_t HI = c.index_n_heads, DI = c.index_head_dim, k = c.topk();
    ClosedForm f;
    f.saved = c.num_layers *
              (saved + (E * H * (Dqk + Lkv) + E * (HI * DI + HI + 2 * DI)) * s +
               (regather ? E * Dl : G * Dl + E * H * Dl) * s + c.batch * H * N * 4 + E * k * 4);
    const int64_t per_layer = E * Dl * s * (regather ? 2 : 1) + E * DI * s + E * DI * 4 +
                              E * Dl * dtype_size(c.dlatent_sum_dtype());
    f.tensor = c.num_layers * per_layer;
    f.wire = c.num_layers * per_layer * (P - 1);
    return f;
  }
  if (c.form == "ring-latent") {
    // The local latent, q, o (shared with the block's) and the fp32 lse; P − 1 hops of the latent
    // forward, again in backward, and of the fp32 dlatent.
    ClosedForm f;
    f.saved = c.num_layers * (saved + (E * Dl + E * H * Dqk) * s + c.batch * H * N * 4);
    f.tensor = f.wire = c.num_layers * (P - 1) * E * Dl * (2 * s + 4);
    return f;
  }
  // (laga-fused runs its own latent kernel whatever the kernel: its lse.)
  const bool probs = c.kernel == Kernel::eager && c.form != "laga-fused";
  saved += probs ? c.batch * Hr * T * T * s : c.batch * Hr * T * 4;
  // per layer and direction: all-to-all'd head widths; all-gathered latent rows
  int64_t a2a_width = 0, shard = 0;
  // per layer: head widths all-to-all'd once more in backward (recomputed)
  int64_t again_width = 0;
  if (c.form == "explicit") {
    saved += (E * Dl + E * H * (2 * Dqk + 2 * Dv)) * s;
    a2a_width = 2 * Dqk + 2 * Dv;
    // the local latent, q and o_att; k and v rebuilt and re-sent
  } else if (c.form == "explicit-recompute") {
    saved += (E * Dl + E * H * (Dqk + Dv)) * s;
    a2a_width = 2 * Dqk + 2 * Dv, again_width = Dqk + Dv;
  } else if (c.form == "laga") {
    saved += (G * Dl + E * H * (2 * Dqk + 2 * Dv)) * s;
    a2a_width = Dqk + Dv, shard = E * Dl;
    // the gathered latent, q and o_att; k and v rebuilt locally
  } else if (c.form == "laga-recompute") {
    saved += (G * Dl + E * H * (Dqk + Dv)) * s;
    a2a_width = Dqk + Dv, shard = E * Dl;
  } else if (c.form == "laga-fused") {  // laga-recompute's set: the gathered latent, q and o_att
    saved += (G * Dl + E * H * (Dqk + Dv)) * s;
    a2a_width = Dqk + Dv, shard = E * Dl;
  } else if (c.form == "absorbed-shared") {
    saved += (G * Dl + E * H * (Dqk + Dl + Lkv)) * s;
    a2a_width = Dqk + Dv, shard = E * Dl;
  } else if (c.form == "absorbed-expanded") {
    // V and o padded to Dl for the fused kernel
    const int64_t Lkv_out = c.kernel == Kernel::fused ? Dl : Lkv;
    saved += (G * Dl + E * H * (Dqk + 2 * Dl + 2 * Lkv_out)) * s;
    a2a_width = Dqk + Dv, shard = E * Dl;
  } else {
    ADD_FAILURE() << "no closed form for " << c.form << ": write it in docs/accounting.md and here";
  }
  // one direction, one layer
  const int64_t a2a = E * H * a2a_width * s, again = E * H * again_width * s;
  // The latent all-gathered in the storage dtype; its adjoint's partial sums in
  // c.dlatent_sum_dtype().
  const int64_t gathered = shard * s, reduced = shard * dtype_size(c.dlatent_sum_dtype());
  ClosedForm f;
  f.saved = c.num_layers * saved;
  f.tensor = c.num_layers * (2 * a2a + gathered + reduced + again);
  f.wire = c.num_layers *
           (2 * (a2a / P * (P - 1)) + (gathered + reduced) * (P - 1) + again / P * (P - 1));
  return f;
}

TEST(Planner, MatchesTheClosedFormsOfTheAccounting) {
  struct Point {
    const char* model;
    int64_t T, P, B, L;
    DType dt;
    Kernel kernel;
    DlatentSum dlatent_sum = DlatentSum::storage;
  };
  const Point points[] = {
      {"tiny", 64, 4, 2, 2, DType::bf16, Kernel::fused},
      {"tiny", 48, 8, 1, 1, DType::f32, Kernel::eager},
      {"small", 4096, 2, 1, 3, DType::bf16, Kernel::eager},
      {"deepseek-v2-lite", 8192, 4, 2, 1, DType::f32, Kernel::fused},
      {"deepseek-v3", 16384, 8, 1, 4, DType::bf16, Kernel::fused},
      {"deepseek-v3", 4096, 16, 1, 1, DType::bf16, Kernel::eager},
      {"deepseek-v3", 16384, 8, 1, 2, DType::bf16, Kernel::fused, DlatentSum::fp32},
      {"small", 2048, 4, 2, 1, DType::bf16, Kernel::eager, DlatentSum::fp32}};
  // Overlap on and off alike: it moves when buffers of collectives in flight are released, not what
  // is saved or sent; and at these points every form's peak sits in its attention's forward or
  // backward, where no collective is in flight, so the peak does not move either (measured, not
  // assumed) — with partial sums in the storage dtype. With fp32 partials, laga-recompute's
  // backward peak comes while the query path's backward runs behind the dlatent reduce-scatter,
  // whose fp32 input is still held (DeepSeek-V3 T 16384 P 8 L 2: +3.0 MB): a real cost of
  // overlapping, planned as measured.
  for (const Point& pt : points)
    for (const Form* form : registered_forms())
      for (bool overlap : {false, true}) {
        MlaConfig c = MlaConfig::preset(pt.model);
        c.seq_len = pt.T, c.sp = pt.P, c.batch = pt.B, c.num_layers = pt.L, c.dtype = pt.dt,
        c.kernel = pt.kernel;
        c.overlap = overlap, c.dlatent_sum = pt.dlatent_sum;
        c = as_form(c, form->name());
        if (!judge_forms(c).refusal(*form).empty()) continue;  // a sparse form without an indexer
        SCOPED_TRACE(fmt::format("{} {} T{} P{} B{} L{} {} {} overlap {} dlatent sum {}", pt.model,
                                 c.form, pt.T, pt.P, pt.B, pt.L, dtype_name(pt.dt),
                                 kernel_name(pt.kernel), overlap ? "on" : "off",
                                 dlatent_sum_name(pt.dlatent_sum)));
        const Plan plan = plan_run(c);
        if (overlap) {
          const int64_t off = plan_run(Config(c).with([](MlaConfig& m) {
                                m.overlap = false;
                              })).memory.activation_peak_bytes;
          if (c.dlatent_sum == DlatentSum::storage || c.dtype == DType::f32)
            EXPECT_EQ(plan.memory.activation_peak_bytes, off);
          else
            EXPECT_GE(plan.memory.activation_peak_bytes, off);
        }
        const ClosedForm f = closed_form(c);
        EXPECT_EQ(plan.memory.saved_bytes, f.saved);
        EXPECT_EQ(plan.comm.tensor_bytes(), f.tensor);
        EXPECT_EQ(plan.comm.wire_bytes(), f.wire);
        if (c.form == "laga" || c.form == "laga-recompute") {
          // laga's whole excess over explicit is the gathered latent replacing the local one, peak
          // included; laga-recompute's saved excess over explicit-recompute is the same (their
          // peaks differ: §6).
          const bool recompute = c.form == "laga-recompute";
          const Plan e = plan_run(Config(c).with(
              [&](MlaConfig& m) { m.form = recompute ? "explicit-recompute" : "explicit"; }));
          const int64_t latent_excess = c.num_layers * (c.sp - 1) * c.tokens_per_rank() * c.batch *
                                        c.latent_dim() * dtype_size(c.dtype);
          EXPECT_EQ(plan.memory.saved_bytes - e.memory.saved_bytes, latent_excess);
          if (!recompute) {
            EXPECT_EQ(plan.memory.activation_peak_bytes - e.memory.activation_peak_bytes,
                      latent_excess)
                << "the peak sits in the last layer's backward, with every layer's saved latent "
                   "live";
          }
        }
      }
}

TEST(Planner, LagaMovesHalfOfExplicitsTrafficAtDeepSeekV3Heads) {
  // docs/design.md §4: per token, explicit moves q, k, v, o = (192 + 192 + 128 + 128)·H elements,
  // laga q, o and the latent = (192 + 128)·H + 576: 640·128 / (320·128 + 576) = 1.972 at H = 128.
  // The paper sends dlatent's partial sums in bf16 (dlatent_sum storage, the default); in fp32
  // laga's backward moves 576 more bytes per token: 640·128 / (320·128 + 576·3/2) = 1.959.
  MlaConfig c = MlaConfig::preset("deepseek-v3");
  c.seq_len = 4096, c.sp = 8;
  c.dlatent_sum = DlatentSum::storage;
  c.form = "explicit";
  const double e = double(plan_comm(c).tensor_bytes());
  c.form = "laga";
  const double l = double(plan_comm(c).tensor_bytes());
  EXPECT_NEAR(e / l, 640.0 * 128 / (320.0 * 128 + 576), 1e-9);
  for (const char* absorbed : {"absorbed-shared", "absorbed-expanded"}) {
    c.form = absorbed;
    EXPECT_EQ(plan_comm(c).tensor_bytes(), int64_t(l));
  }
  c.form = "laga", c.dlatent_sum = DlatentSum::fp32;
  EXPECT_NEAR(e / double(plan_comm(c).tensor_bytes()), 640.0 * 128 / (320.0 * 128 + 576 * 1.5),
              1e-9);
}
