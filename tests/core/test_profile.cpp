// core/profile.hpp: what a rank's profile counts — the outermost timed op only (the eager kernel's
// products are attention, not matmul), nothing without a scope, nothing from OpenMP's workers — and
// the FLOPs each class is given.
#include <gtest/gtest.h>

#include "laga/core/profile.hpp"
#include "laga/core/tensor.hpp"
#include "laga/ops/attention.hpp"
#include "laga/ops/matmul.hpp"

namespace laga {
namespace {

void one_matmul(int64_t M, int64_t N, int64_t K) {
  Tensor a = Tensor::zeros({M, K}, DType::f32, "t.a"), b = Tensor::zeros({K, N}, DType::f32, "t.b");
  Tensor c = Tensor::zeros({M, N}, DType::f32, "t.c");
  matmul_2d(mat(a), mat(b), mat(c), false, 1.0f);
}

TEST(Profile, CountsTheOutermostOpOnceAndOnlyUnderAScope) {
  one_matmul(8, 4, 16);  // no scope: nothing to count into, and no error
  OpProfile p;
  {
    ProfileScope scope(p);
    one_matmul(8, 4, 16);
    one_matmul(8, 4, 16);
    one_matmul(2, 3, 5);
  }
  one_matmul(8, 4, 16);  // after the scope: not counted
  ASSERT_EQ(p.by_op.count(ProfiledOp::matmul), 1u);
  EXPECT_EQ(p.by_op[ProfiledOp::matmul].calls, 3);
  EXPECT_EQ(p.by_op[ProfiledOp::matmul].flops, 2.0 * (2 * 8 * 4 * 16 + 2 * 3 * 5));
  EXPECT_EQ(p.matmul_shapes.size(), 2u);
  EXPECT_EQ(p.matmul_shapes["8×4×16 fp32"].calls, 2);
  EXPECT_GE(p.by_op[ProfiledOp::matmul].seconds, 0.0);
  EXPECT_DOUBLE_EQ(p.seconds(), p.by_op[ProfiledOp::matmul].seconds);

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
    OpProfile e;
    {
      ProfileScope scope(e);
      (void)attention_forward(kernel, a);
    }
    EXPECT_EQ(e.by_op.count(ProfiledOp::matmul), 0u) << kernel_name(kernel);
    EXPECT_EQ(e.by_op[ProfiledOp::attention_forward].calls, 1) << kernel_name(kernel);
    EXPECT_EQ(e.by_op[ProfiledOp::attention_forward].flops,
              attention_forward_flops(B, H, T, Dqk, Dv, true));
  }
}

TEST(Profile, RoundTripsThroughJsonAndAdds) {
  OpProfile p;
  p.by_op[ProfiledOp::attention_backward] = {0.5, 1e9, 3};
  p.matmul_shapes["4×4×4 bf16"] = {0.25, 128, 1};
  OpProfile q = OpProfile::from_json(p.to_json());
  q.add(p);
  EXPECT_EQ(q.by_op[ProfiledOp::attention_backward].calls, 6);
  EXPECT_DOUBLE_EQ(q.by_op[ProfiledOp::attention_backward].seconds, 1.0);
  EXPECT_EQ(q.matmul_shapes["4×4×4 bf16"].flops, 256);
  EXPECT_EQ(q.by_op[ProfiledOp::matmul].calls, 0);
  EXPECT_THROW(OpProfile::from_json(nlohmann::json{{"matmul", {{"seconds", 1}}}}), Error);
}

}  // namespace
}  // namespace laga
