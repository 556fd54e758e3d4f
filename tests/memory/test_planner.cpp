// The planner against the tracking allocator and the ledger of real runs: every memory figure equal
// to the byte, every collective equal in operation, tensor, dtype and both byte counts, over a sweep
// of small configurations (T, P, H, L, q_lora_rank, both dtypes, every form, kernel and regime).
#include <gtest/gtest.h>

#include "laga/mla/planner.hpp"
#include "laga/mla/run.hpp"

using namespace laga;

namespace {

struct Case {
  Form form;
  AbsorbedKv kv;
  Kernel kernel;
  DType dt;
  int64_t T, P, H, L, Lq, B;
};

std::string name(const Case& k) {
  return fmt::format("{}{} {} {} T{} P{} H{} L{} Lq{} B{}", form_name(k.form),
                     k.form == Form::absorbed ? "-" + std::string(absorbed_kv_name(k.kv)) : "", kernel_name(k.kernel),
                     dtype_name(k.dt), k.T, k.P, k.H, k.L, k.Lq, k.B);
}

MlaConfig config(const Case& k) {
  MlaConfig c = MlaConfig::preset("tiny");
  c.form = k.form, c.absorbed_kv = k.kv, c.kernel = k.kernel, c.dtype = k.dt;
  c.seq_len = k.T, c.sp = k.P, c.num_attention_heads = k.H, c.num_layers = k.L, c.q_lora_rank = k.Lq, c.batch = k.B;
  return c;
}

std::vector<Case> sweep() {
  std::vector<Case> cases;
  const std::pair<Form, AbsorbedKv> forms[] = {{Form::explicit_form, AbsorbedKv::expanded},
                                               {Form::laga, AbsorbedKv::expanded},
                                               {Form::absorbed, AbsorbedKv::expanded},
                                               {Form::absorbed, AbsorbedKv::shared}};
  int i = 0;
  for (auto [form, kv] : forms)
    for (Kernel kernel : {Kernel::fused, Kernel::eager})
      for (DType dt : {DType::f32, DType::bf16}) {
        // Vary the shape with the case so the sweep covers T, P, H, L, Lq and B without a full product.
        const int64_t Ts[] = {16, 40, 64, 24}, Ps[] = {1, 2, 4, 8}, Hs[] = {8, 8, 16, 8};
        const int64_t T = Ts[i % 4], P = Ps[(i / 2) % 4], H = Hs[i % 4];
        cases.push_back({form, kv, kernel, dt, T, P, H, 1 + i % 2, (i % 3 == 2) ? 0 : 48, 1 + (i % 5 == 4)});
        ++i;
      }
  return cases;
}

}  // namespace

TEST(Planner, MatchesMeasuredMemoryAndLedgerToTheByte) {
  for (const Case& k : sweep()) {
    const MlaConfig c = config(k);
    const PlannedMemory plan = plan_memory(c);
    const PlannedComm comm = plan_comm(c);
    const std::vector<RankResult> ranks = run_group(c, RunOptions{});
    for (const RankResult& r : ranks) {
      SCOPED_TRACE(name(k) + " rank " + std::to_string(r.rank));
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

TEST(Planner, LagaMovesHalfOfExplicitsTrafficAtDeepSeekV3Heads) {
  // DESIGN §5: per token, explicit moves q, k, v, o = (192 + 192 + 128 + 128)·H elements, laga
  // q, o and the latent = (192 + 128)·H + 576: 640·128 / (320·128 + 576) = 1.972 at H = 128.
  MlaConfig c = MlaConfig::preset("deepseek-v3");
  c.seq_len = 4096, c.sp = 8;
  c.form = Form::explicit_form;
  const double e = double(plan_comm(c).tensor_bytes());
  c.form = Form::laga;
  const double l = double(plan_comm(c).tensor_bytes());
  EXPECT_NEAR(e / l, 640.0 * 128 / (320.0 * 128 + 576), 1e-9);
  c.form = Form::absorbed;
  EXPECT_EQ(plan_comm(c).tensor_bytes(), int64_t(l));
}
