// The laga-fused form (docs/design.md §2.4.1): on the plan (which equals measurement:
// Planner.MatchesMeasuredMemoryAndLedgerToTheByte covers every registered form), at DeepSeek-V3, T
// 16384, P 8, bf16: laga-recompute's saved bytes and laga's traffic, an activation peak below
// laga-recompute's at 1 and 4 layers, and no whole-sequence K, V, dK or dV live at the peak. Its
// numbers against explicit and fp64 are the form sweep's (tests/mla/test_forms.cpp); the kernel's
// own claims are tests/ops/test_latent_attention.cpp's.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "laga/driver/plan.hpp"
#include "laga/driver/plan.hpp"
#include "laga/mla/form.hpp"

using namespace laga;

namespace {

MlaConfig deepseek_v3(const std::string& form, int64_t layers) {
  MlaConfig c = MlaConfig::preset("deepseek-v3");
  c.seq_len = 16384, c.sp = 8, c.batch = 1, c.num_layers = layers, c.dtype = DType::bf16,
  c.kernel = Kernel::fused;
  c.form = form;
  return c;
}

}  // namespace

TEST(LagaFused, PeaksBelowLagaRecomputeAtDeepSeekV3WithItsSavedBytesAndLagasTraffic) {
  for (int64_t layers : {1, 4}) {
    const Plan f = plan_run(deepseek_v3("laga-fused", layers)),
               r = plan_run(deepseek_v3("laga-recompute", layers));
    const Plan l = plan_run(deepseek_v3("laga", layers)),
               e = plan_run(deepseek_v3("explicit", layers));
    fmt::print(
        "[measured] DeepSeek-V3 T 16384 P 8 bf16 L {}: activation peak explicit {} laga {} "
        "laga-recompute {} "
        "laga-fused {} ({:.3f}x laga-recompute)\n",
        layers, e.memory.activation_peak_bytes, l.memory.activation_peak_bytes,
        r.memory.activation_peak_bytes, f.memory.activation_peak_bytes,
        double(f.memory.activation_peak_bytes) / double(r.memory.activation_peak_bytes));
    EXPECT_LT(f.memory.activation_peak_bytes, r.memory.activation_peak_bytes) << layers;
    EXPECT_EQ(f.memory.saved_bytes, r.memory.saved_bytes) << layers;
    EXPECT_EQ(f.comm.tensor_bytes(), l.comm.tensor_bytes()) << layers;
    EXPECT_EQ(f.comm.wire_bytes(), l.comm.wire_bytes()) << layers;
    // At the peak: no per-head K, V or their gradients of the whole sequence, and no kernel buffer
    // in the storage dtype as large as one of them (its fp32 sums of o and dq are the shard's rows,
    // not K/V).
    const MlaConfig c = deepseek_v3("laga-fused", layers);
    const int64_t kv_bytes =
        c.seq_len * c.batch * c.heads_per_rank() * c.qk_head_dim() * dtype_size(c.dtype);
    for (const auto& [tag, bytes] : f.memory.peak_breakdown) {
      for (const char* no : {"act.k", "act.v", "grad.k", "grad.v", "recompute.k", "recompute.v",
                             "act.kvb", "grad.kvb"})
        EXPECT_NE(tag, no) << layers;
      if (tag.rfind("attn.", 0) == 0 && tag != "attn.o_sum" && tag != "attn.dq_sum" &&
          tag != "attn.lse") {
        EXPECT_LT(bytes, kv_bytes / 8) << layers << " " << tag;
      }
    }
  }
}

// The latent kernel executes laga-recompute's work: the same attention and the same up-projection,
// run again in backward (inside the kernel rather than as products beside it).
TEST(LagaFused, CountsTheUpProjectionItsBackwardRunsAgain) {
  MlaConfig c = deepseek_v3("laga-fused", 1);
  MlaConfig r = c;
  r.form = "laga-recompute";
  const PlannedFlops fused = planned_flops(Config(c)), recompute = planned_flops(Config(r));
  EXPECT_DOUBLE_EQ(fused.forward, recompute.forward);
  EXPECT_DOUBLE_EQ(fused.backward, recompute.backward);
  r.form = "laga";
  const double up = 2.0 * double(c.seq_len * c.batch) * double(c.kv_lora_rank) *
                    double(c.num_attention_heads) * double(c.qk_nope_head_dim + c.v_head_dim);
  EXPECT_DOUBLE_EQ(fused.backward - planned_flops(Config(r)).backward, up);
}
