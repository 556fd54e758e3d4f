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
        c.seq_len = 64, c.sp = 2, c.batch = 2, c.num_layers = 3, c.kernel = kernel,
        c.form = std::string(form->name());
        const Config cfg(c);
        const BlockFlops total = block_flops(*cfg);
        double fwd = 0, bwd = 0, attn_fwd = 0, attn_bwd = 0;
        for (const PhaseFlops& p : phase_flops(*cfg)) {
          (p.backward ? bwd : fwd) += p.flops;
          if (p.op == OpClass::attention_forward) attn_fwd += p.flops;
          if (p.op == OpClass::attention_backward) attn_bwd += p.flops;
          if (p.op == OpClass::elementwise || p.op == OpClass::accumulate) {
            EXPECT_EQ(p.flops, 0) << p.name;
            EXPECT_GT(p.bytes, 0) << p.name;
          }
        }
        SCOPED_TRACE(std::string(model) + " " + std::string(form->name()) + " " +
                     std::string(kernel_name(kernel)));
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
  EXPECT_EQ(attention_shape_of("laga-fused"), AttentionShape::laga_fused);
}

// laga-fused's kernel runs the up-projection inside itself, forward (U) and backward (U recomputed,
// then 2U for dlatent and dwkv), and nothing outside it assembles k, v or dk, dv: those phases are
// marked in_kernel, and no other form has one.
TEST(PhaseFlops, OnlyLagaFusedRunsProductsInsideItsKernel) {
  MlaConfig c = MlaConfig::preset("small");
  c.seq_len = 128, c.sp = 2, c.batch = 2, c.num_layers = 2;
  for (const Form* form : registered_forms()) {
    c.form = std::string(form->name());
    const Config cfg(c);
    const bool fused = form->name() == "laga-fused";
    double fwd = 0, bwd = 0;
    bool assembly = false;
    for (const PhaseFlops& p : phase_flops(*cfg)) {
      if (p.in_kernel) {
        EXPECT_EQ(p.op, OpClass::matmul) << form->name() << " " << p.name;
        EXPECT_EQ(p.shape, AttentionShape::laga_fused) << form->name() << " " << p.name;
        (p.backward ? bwd : fwd) += p.flops;
      }
      if (p.op == OpClass::attention_forward || p.op == OpClass::attention_backward) {
        EXPECT_EQ(p.shape == AttentionShape::laga_fused, fused) << form->name();
      }
      assembly = assembly || p.name == "k, v assembly" || p.name == "dk, dv assembly";
    }
    // U over all ranks and layers, written out: 2 · T·B · Lkv · H · (Dn + Dv) · L
    const double U = 2.0 * 128 * 2 * c.kv_lora_rank * c.num_attention_heads *
                     (c.qk_nope_head_dim + c.v_head_dim) * 2;
    EXPECT_DOUBLE_EQ(fwd, fused ? U : 0) << form->name();
    EXPECT_DOUBLE_EQ(bwd, fused ? 3 * U : 0) << form->name();
    if (form->family() != "absorbed") {
      EXPECT_EQ(assembly, !fused) << form->name();
    }
  }
}

// The ring forms' elementwise traffic beyond the block's phases (Form::extra_elementwise_bytes):
// only the ring forms have it; laga --ulysses 1 runs ring-latent's ring (the latent travelling,
// every head on every rank), so it moves ring-latent's bytes; ring-kv's forward merges are
// ring-latent's (the same pairs, the same o) but its backward has no per-hop latent work; and the
// fp32 merges grow with the hops' pairs: doubling P at a fixed T doubles the chunk pairs per rank
// minus one.
TEST(PhaseFlops, OnlyTheRingsAddElementwiseTrafficAndTheSameRingTheSameBytes) {
  MlaConfig c = MlaConfig::preset("small");
  c.seq_len = 256, c.sp = 2, c.batch = 2, c.num_layers = 2;
  auto extra = [&](const std::string& form, int64_t ulysses, bool bwd) {
    MlaConfig m = c;
    m.form = form, m.ulysses = ulysses;
    const Config cfg(m);
    return form_of(*cfg).extra_elementwise_bytes(*cfg, bwd);
  };
  for (const char* form : {"explicit", "laga", "laga-fused", "laga-recompute", "explicit-recompute",
                           "absorbed-shared"})
    for (bool bwd : {false, true})
      EXPECT_EQ(extra(form, 0, bwd).fp32 + extra(form, 0, bwd).storage, 0) << form;
  for (bool bwd : {false, true}) {
    EXPECT_EQ(extra("laga", 1, bwd).fp32, extra("ring-latent", 0, bwd).fp32) << bwd;
    EXPECT_EQ(extra("laga", 1, bwd).storage, extra("ring-latent", 0, bwd).storage) << bwd;
    EXPECT_GT(extra("ring-kv", 0, bwd).fp32, 0);
  }
  EXPECT_EQ(extra("ring-kv", 0, false).fp32, extra("ring-latent", 0, false).fp32);
  EXPECT_EQ(extra("ring-kv", 0, false).storage, 0);  // ring-kv up-projects its own block only
  EXPECT_GT(extra("ring-latent", 0, true).storage, extra("ring-latent", 0, false).storage);
  // small, T 256, B 2, P 2, bf16: 5 pairs of C 64 rows merged (12 bytes per element of o), o_acc
  // [128, 2, 16, 128] rounded (6 bytes per element), on 2 ranks.
  EXPECT_EQ(extra("ring-kv", 0, false).fp32,
            2.0 * (5 * 12 * 64 * 2 * 16 * 128 + 128 * 2 * 16 * 128 * 6));
  // The phases carry it, per layer, as the accumulate class (and nothing else is in that class).
  MlaConfig m = c;
  m.form = "ring-kv";
  const Config cfg(m);
  double fp32 = 0;
  for (const PhaseFlops& p : phase_flops(*cfg))
    if (p.op == OpClass::accumulate && !p.backward) fp32 += p.bytes;
  EXPECT_EQ(fp32, c.num_layers * extra("ring-kv", 0, false).fp32);
}

}  // namespace
}  // namespace laga
