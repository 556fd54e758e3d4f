// The ring forms' own claims: the zigzag layout (token segments cover the sequence once, balanced);
// ring-kv and ring-latent run with more ranks than heads and match explicit in fp32 within 1e-5
// relative; their tokens stay home (no all-to-all) and every hop sends exactly its tensor bytes;
// ring-latent moves Dl per token instead of H·(Dqk + Dv), at the price of every rank's
// up-projections. The sweeps over every registered form (test_forms.cpp, test_overlap.cpp, the
// planner) cover the rest.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "laga/driver/plan.hpp"
#include "laga/mla/form.hpp"
#include "verify/compare.hpp"
#include "verify/forms.hpp"

namespace laga {
namespace {

MlaConfig tiny(const char* form, int64_t T, int64_t P) {
  MlaConfig c = MlaConfig::preset("tiny");
  c.seq_len = T, c.sp = P, c.batch = 2, c.num_layers = 2, c.dtype = DType::f32, c.form = form;
  return c;
}

TEST(Ring, ZigzagSegmentsCoverTheSequenceOnceWithEqualCausalWork) {
  for (int64_t P : {1, 2, 3, 4, 8}) {
    const MlaConfig c = tiny("ring-kv", 16 * P, P);
    std::vector<int> seen(size_t(c.seq_len), 0);
    std::vector<int64_t> work;
    for (int64_t r = 0; r < P; ++r) {
      const auto segs = token_segments(c, r);
      ASSERT_EQ(segs.size(), 2u);
      EXPECT_EQ(segs[0].pos0, r * 8);
      EXPECT_EQ(segs[1].pos0, (2 * P - 1 - r) * 8);
      int64_t w = 0;
      for (const auto& s : segs)
        // keys a causal query sees
        for (int64_t t = s.pos0; t < s.pos0 + s.len; ++t) ++seen[size_t(t)], w += t + 1;
      work.push_back(w);
    }
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; })) << "P " << P;
    EXPECT_TRUE(std::all_of(work.begin(), work.end(), [&](int64_t w) { return w == work[0]; }))
        << "P " << P;
    const auto contiguous = token_segments(tiny("explicit", 16 * P, P), P - 1);
    ASSERT_EQ(contiguous.size(), 1u);
    EXPECT_EQ(contiguous[0].pos0, (P - 1) * 16);
  }
}

TEST(Ring, RingKvMatchesExplicitInFp32WithMoreRanksThanHeads) {
  const verify::Tensors want = verify::run_tensors(Config(tiny("explicit", 32, 1)));
  for (int64_t P : {2, 16}) {  // tiny has 8 heads: P 16 > H
    const verify::Tensors got = verify::run_tensors(Config(tiny("ring-kv", 32, P)));
    for (const auto& [name, e] : verify::errors(got, want))
      EXPECT_LE(e.max_abs, 1e-5 * e.scale) << "P " << P << " " << name;
  }
}

TEST(Ring, RingLatentMatchesExplicitInFp32WithMoreRanksThanHeads) {
  const verify::Tensors want = verify::run_tensors(Config(tiny("explicit", 32, 1)));
  for (int64_t P : {2, 16}) {
    const verify::Tensors got = verify::run_tensors(Config(tiny("ring-latent", 32, P)));
    for (const auto& [name, e] : verify::errors(got, want))
      EXPECT_LE(e.max_abs, 1e-5 * e.scale) << "P " << P << " " << name;
  }
}

// The latent's hops move Dl per token where ring-kv's move H·(Dqk + Dv): 576 vs 320·H at DeepSeek's
// dimensions. The price is FLOPs: every rank up-projects every block, forward and backward.
TEST(Ring, RingLatentTradesTrafficForUpProjections) {
  MlaConfig c = MlaConfig::preset("deepseek-v3");
  c.seq_len = 4096, c.sp = 8, c.batch = 1, c.num_layers = 1, c.dtype = DType::bf16;
  c.form = "ring-kv";
  const PlannedComm kv = plan_comm(Config(c));
  const PlannedFlops kv_flops = planned_flops(Config(c));
  c.form = "ring-latent";
  const PlannedComm lat = plan_comm(Config(c));
  const PlannedFlops lat_flops = planned_flops(Config(c));
  EXPECT_EQ(kv.tensor_bytes() * c.latent_dim(),
            lat.tensor_bytes() * c.num_attention_heads * (c.qk_head_dim() + c.v_head_dim));
  const double up =
      2.0 * double(c.seq_len) *
      double(c.kv_lora_rank * c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim));
  EXPECT_DOUBLE_EQ(lat_flops.forward - kv_flops.forward, 7 * up);
  EXPECT_DOUBLE_EQ(lat_flops.backward - kv_flops.backward, 8 * up + 14 * up);
}

TEST(Ring, RingKvSendsOnlyItsHopsAndAcceptsMoreRanksThanHeads) {
  const Config c = tiny("ring-kv", 64, 16);
  const PlannedComm plan = plan_comm(c);
  const int64_t E = 4 * 2, H = 8, per_hop_kv = E * H * (c->qk_head_dim() + c->v_head_dim);
  int64_t hops = 0;
  for (const auto& r : plan.attention) {
    EXPECT_EQ(r.op, CollectiveOp::send_recv) << r.tensor;
    const int64_t width = r.tensor == "k" || r.tensor == "dk" ? c->qk_head_dim() : c->v_head_dim;
    // an fp32 run: k, v and the fp32 dk, dv alike
    EXPECT_EQ(r.tensor_bytes, E * H * width * 4) << r.tensor;
    EXPECT_EQ(r.wire_bytes, r.tensor_bytes);
    ++hops;
  }
  EXPECT_EQ(hops, 2 * 6 * 15);  // 2 layers × (k, v forward, again in backward, dk, dv) × 15 hops
  EXPECT_EQ(plan.tensor_bytes(), 2 * 3 * 15 * per_hop_kv * 4);
}

}  // namespace
}  // namespace laga
