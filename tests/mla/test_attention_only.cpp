// The attention alone (MlaConfig::attention_only, Hugging Face's self_attn): the block stack less
// its input RMSNorm and residual, y = MLA(x) per layer. Claimed here of the fast code, bit for bit:
// fed xn = RMSNorm(x; attn_norm), its output is the whole block's minus x and its dx is the
// gradient the block's norm takes in, for every registered form at P 1 and 2 in both dtypes. Its
// agreement with the fp64 reference is verify's (tests/mla/test_forms.cpp), its plan's with
// measurement the planner's (tests/memory/test_planner.cpp), the reference's own with finite
// differences in tests/reference/test_block_ref.cpp.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "laga/comm/communicator.hpp"
#include "laga/driver/run.hpp"
#include "laga/mla/block.hpp"
#include "laga/mla/form.hpp"
#include "laga/ops/elementwise.hpp"
#include "laga/ops/rmsnorm.hpp"

using namespace laga;

namespace {

void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  EXPECT_EQ(got.to_floats(), want.to_floats()) << what;
}

}  // namespace

// One layer on each rank's tokens: the whole block on x and the attention alone on RMSNorm(x),
// with the same weights (the alone's have no attn_norm) and the same dy. Then, per rank,
//   y  = y_alone + x                                       (the residual, as the block adds it)
//   dx = dy + RMSNormᵀ(dx_alone),  dattn_norm likewise    (the block's norm backward on its dxn)
// and every other weight gradient equal, bit for bit: the switch removes two ops and changes none.
TEST(AttentionOnly, IsTheBlockLessItsNormAndResidualBitForBitForEveryFormAndP) {
  for (DType dt : {DType::f32, DType::bf16})
    for (int64_t P : {1, 2}) {
      MlaConfig base = MlaConfig::preset("tiny");
      base.dtype = dt, base.seq_len = 32, base.sp = P, base.num_layers = 1;
      const FormsAt at = judge_forms(base);
      EXPECT_EQ(at.runnable.size(), registered_forms().size()) << "every form runs tiny at T 32";
      for (const Form* f : at.runnable) {
        const Config whole(as_form(base, f->name()));
        const Config alone = whole.with([](MlaConfig& m) { m.attention_only = true; });
        run_threads(int(P), [&](Communicator& comm) {
          SCOPED_TRACE(
              fmt::format("{} {} P {} rank {}", f->name(), dtype_name(dt), P, comm.rank()));
          Weights w = allocate_weights(*whole), wa = allocate_weights(*alone);
          init_weights(w, *whole, 7);
          wa.layers[0].for_each(
              [&](const std::string& name, Tensor& t) { t.copy_from(w.layers[0].by_name(name)); });
          ASSERT_FALSE(wa.layers[0].attn_norm.defined());
          const Tensor x = make_input_shard(*whole, comm.rank(), 7, "x", "x"),
                       dy = make_input_shard(*whole, comm.rank(), 7, "dy", "dy");
          const Tensor& attn_norm = w.layers[0].attn_norm;
          const Tensor xn = rmsnorm_forward(x, attn_norm, whole->rms_norm_eps, "xn");

          Weights g = zero_grads(*whole), ga = zero_grads(*alone);
          StackSaved s, sa;
          const Tensor y = stack_forward(whole, w, x, s, comm);
          const Tensor dx = stack_backward(whole, w, s, dy, g, comm);
          Tensor ya = stack_forward(alone, wa, xn, sa, comm);
          const Tensor dxa = stack_backward(alone, wa, sa, dy, ga, comm);

          add_into(ya, x);
          expect_same_bits(ya, y, "y");
          Tensor dx_norm = Tensor::empty(x.shape(), dt, "dx_norm");
          Tensor dattn_norm = Tensor::zeros(attn_norm.shape(), DType::f32, "dattn_norm");
          rmsnorm_backward(x, attn_norm, dxa, whole->rms_norm_eps, dx_norm, dattn_norm);
          add_into(dx_norm, dy);
          expect_same_bits(dx_norm, dx, "dx");
          expect_same_bits(dattn_norm, g.layers[0].attn_norm, "dattn_norm");
          ga.layers[0].for_each([&](const std::string& name, const Tensor& t) {
            expect_same_bits(t, g.layers[0].by_name(name), "d" + name);
          });
        });
      }
    }
}
