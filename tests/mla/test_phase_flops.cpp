// The per-phase FLOP breakdown (mla/flops.hpp phase_flops) accounts exactly the work block_flops
// counts, for every registered form, both kernels, with and without q_lora, over several layers.
#include <gtest/gtest.h>

#include "laga/mla/flops.hpp"
#include "laga/mla/form.hpp"

namespace laga {
namespace {

TEST(PhaseFlops, SumToBlockFlopsForEveryForm) {
  for (const char* model : {"tiny", "deepseek-v2-lite", "deepseek-v3"})
    for (Kernel kernel : {Kernel::eager, Kernel::fused})
      for (const Form* form : registered_forms()) {
        MlaConfig c = MlaConfig::preset(model);
        c.seq_len = 64, c.sp = 2, c.batch = 2, c.num_layers = 3, c.kernel = kernel, c.form = std::string(form->name());
        const Config cfg(c);
        const BlockFlops total = block_flops(*cfg);
        double fwd = 0, bwd = 0, attn_fwd = 0, attn_bwd = 0;
        for (const PhaseFlops& p : phase_flops(*cfg)) {
          (p.backward ? bwd : fwd) += p.flops;
          if (p.op == OpClass::attention_forward) attn_fwd += p.flops;
          if (p.op == OpClass::attention_backward) attn_bwd += p.flops;
          if (p.op == OpClass::elementwise) {
            EXPECT_EQ(p.flops, 0) << p.name;
            EXPECT_GT(p.bytes, 0) << p.name;
          }
        }
        SCOPED_TRACE(std::string(model) + " " + std::string(form->name()) + " " + std::string(kernel_name(kernel)));
        EXPECT_DOUBLE_EQ(fwd, total.forward);
        EXPECT_DOUBLE_EQ(bwd, total.backward);
        EXPECT_DOUBLE_EQ(attn_fwd, total.attention_forward);
        EXPECT_DOUBLE_EQ(attn_bwd, 2.5 * total.attention_forward);
      }
}

TEST(PhaseFlops, EachFormNamesItsOwnUpProjectionAndAttentionShape) {
  MlaConfig c = MlaConfig::preset("tiny");
  c.seq_len = 32, c.sp = 2;
  auto has = [](const std::vector<PhaseFlops>& ps, const std::string& name) {
    for (const auto& p : ps)
      if (p.name == name) return true;
    return false;
  };
  for (const Form* form : registered_forms()) {
    c.form = std::string(form->name());
    const auto ps = phase_flops(*Config(c));
    const bool absorbed = form->family() == "absorbed";
    EXPECT_EQ(has(ps, "up-projection wkv_b"), !absorbed) << form->name();
    EXPECT_EQ(has(ps, "absorb W_UK into q"), absorbed) << form->name();
    EXPECT_EQ(has(ps, "recompute up-projection"), form->recompute_flops(c) > 0) << form->name();
  }
  EXPECT_EQ(attention_shape_of("absorbed-shared"), AttentionShape::mqa);
  EXPECT_EQ(attention_shape_of("absorbed-expanded"), AttentionShape::latent);
  EXPECT_EQ(attention_shape_of("laga"), AttentionShape::dense);
}

}  // namespace
}  // namespace laga
