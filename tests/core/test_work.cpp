// core/work.hpp: what a rank's work ledger records — the outermost op only (the eager kernel's
// products are attention, not matmul), nothing without a scope — the same records on meta tensors
// as on real ones, and the communicator's issue and wait in the one timeline.
#include <gtest/gtest.h>

#include "laga/comm/meta.hpp"
#include "laga/core/memory.hpp"
#include "laga/core/tensor.hpp"
#include "laga/core/work.hpp"
#include "laga/ops/attention.hpp"
#include "laga/ops/matmul.hpp"

namespace laga {
namespace {

void one_matmul(int64_t M, int64_t N, int64_t K) {
  Tensor a = Tensor::empty({M, K}, DType::f32, "t.a"), b = Tensor::empty({K, N}, DType::f32, "t.b");
  Tensor c = Tensor::empty({M, N}, DType::f32, "t.c");
  a.fill(0.5f), b.fill(0.25f);
  matmul_2d(mat(a), mat(b), mat(c), false, 1.0f);
}

TEST(Work, CountsTheOutermostOpOnceAndOnlyUnderAScope) {
  one_matmul(8, 4, 16);  // no scope: nothing to count into, and no error
  WorkLedger p;
  {
    WorkScope scope(p);
    one_matmul(8, 4, 16);
    one_matmul(8, 4, 16);
    one_matmul(2, 3, 5);
  }
  one_matmul(8, 4, 16);  // after the scope: not counted
  const auto t = p.totals();
  EXPECT_EQ(t.at(WorkClass::matmul).calls, 3);
  EXPECT_EQ(t.at(WorkClass::matmul).flops, 2.0 * (2 * 8 * 4 * 16 + 2 * 3 * 5));
  // each matmul's two fills: fp32 streams of their tensors' bytes
  EXPECT_EQ(t.at(WorkClass::accumulate).calls, 6);
  EXPECT_EQ(t.at(WorkClass::accumulate).bytes, 4.0 * 2 * (8 * 16 + 16 * 4) + 4.0 * (2 * 5 + 5 * 3));
  EXPECT_EQ(p.matmul_shapes().size(), 2u);
  EXPECT_EQ(p.matmul_shapes()["8×4×16 fp32"].calls, 2);
  EXPECT_EQ(p.timeline.size(), p.records.size());

  // The eager kernel issues one product per head, inside the attention call: only attention counts.
  const int64_t B = 1, H = 2, T = 12, Dqk = 8, Dv = 4;
  Tensor q = Tensor::zeros({T, B, H, Dqk}, DType::f32, "t.q"),
         k = Tensor::zeros({T, B, H, Dqk}, DType::f32, "t.k");
  Tensor v = Tensor::zeros({T, B, H, Dv}, DType::f32, "t.v"),
         o = Tensor::zeros({T, B, H, Dv}, DType::f32, "t.o");
  AttentionFwdParams a;
  a.B = B, a.T = T, a.Hq = H, a.Hkv = H, a.Dqk = Dqk, a.Dv = Dv, a.dtype = DType::f32,
  a.scale = 0.5f, a.causal = true;
  a.q = q.raw(), a.k = k.raw(), a.v = v.raw(), a.o = o.raw();
  a.q_stride = a.k_stride = dense_strides(B, H, Dqk),
  a.v_stride = a.o_stride = dense_strides(B, H, Dv);
  for (Kernel kernel : {Kernel::eager, Kernel::fused}) {
    WorkLedger e;
    {
      WorkScope scope(e);
      (void)attention_forward(kernel, a);
    }
    ASSERT_EQ(e.records.size(), 1u) << kernel_name(kernel);
    EXPECT_EQ(e.records[0].cls, WorkClass::attention_forward);
    EXPECT_EQ(e.records[0].flops, attention_forward_flops(B, H, T, Dqk, Dv, true));
    EXPECT_EQ(e.records[0].dims[0], T);
    EXPECT_EQ(e.records[0].kernel,
              kernel == Kernel::eager ? AttentionKernel::eager : AttentionKernel::fused);
  }
}

TEST(Work, MetaTensorsRecordWhatRealOnesDo) {
  auto run = [](bool meta) {
    MemoryTracker tracker(meta);
    TrackerScope ts(tracker);
    WorkLedger l;
    {
      WorkScope scope(l);
      one_matmul(6, 10, 3);
      Tensor x = Tensor::zeros({5, 7}, DType::bf16, "t.x");
      Tensor y = Tensor::empty({5, 7}, DType::f32, "t.y");
      y.copy_from(x);
    }
    return l;
  };
  const WorkLedger real = run(false), meta = run(true);
  ASSERT_EQ(real.records.size(), meta.records.size());
  for (size_t i = 0; i < real.records.size(); ++i) {
    EXPECT_EQ(std::string(real.records[i].op), meta.records[i].op) << i;
    EXPECT_EQ(real.records[i].cls, meta.records[i].cls) << i;
    EXPECT_EQ(real.records[i].flops, meta.records[i].flops) << i;
    EXPECT_EQ(real.records[i].bytes, meta.records[i].bytes) << i;
    EXPECT_EQ(meta.records[i].seconds, 0.0) << i;
  }
  EXPECT_EQ(std::string(real.records.back().op), "convert");
  EXPECT_EQ(real.records.back().bytes, 5 * 7 * (2 + 4));
}

TEST(Work, TheTimelineHoldsIssuesAndWaitsWhereTheCodeMadeThem) {
  MemoryTracker tracker(true);
  TrackerScope ts(tracker);
  MetaCommunicator comm(0, 2);
  WorkLedger l;
  {
    WorkScope scope(l);
    CollectiveHandle h = comm.all_gather_start(nullptr, nullptr, 16, DType::bf16, "latent");
    one_matmul(4, 4, 4);
    comm.wait(h);
    comm.all_to_all(nullptr, nullptr, 8, DType::bf16, "q");
  }
  using K = TimelineEvent::Kind;
  std::vector<std::pair<K, int64_t>> seen;
  for (const TimelineEvent& e : l.timeline) seen.emplace_back(e.kind, e.index);
  const std::vector<std::pair<K, int64_t>> expected = {
      {K::issue, 0}, {K::compute, 0}, {K::compute, 1}, {K::compute, 2},
      {K::wait, 0},  {K::issue, 1},   {K::wait, 1}};
  EXPECT_EQ(seen, expected);
  ASSERT_EQ(comm.ledger().records().size(), 2u);
  EXPECT_EQ(comm.ledger().records()[1].tensor, "q");
}

}  // namespace
}  // namespace laga
