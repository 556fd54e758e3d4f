// The fp64 reference block stack (reference/block_ref.cpp) checked against central finite
// differences of L = ⟨g, y⟩ (g random, never sum(y)) for dx and every weight of every layer, over
// q_lora_rank > 0 and = 0, both RoPE layouts, B = 1 and 2, YaRN on, off and with an attention
// factor ≠ 1; and against facts that need no code: wo = 0 makes the block the identity, the block
// is causal, batch entries do not mix, one token attends only to itself, and one layer equals
// docs/design.md's equations written out with explicit index loops (which pins the softmax scale
// and head layouts, things finite differences cannot see). Math: docs/block.md.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <ostream>
#include <tuple>

#include "laga/mla/config.hpp"
#include "laga/core/random.hpp"
#include "laga/mla/weights.hpp"
#include "reference/attention_ref.hpp"
#include "reference/block_ref.hpp"
#include "reference/ops_ref.hpp"

using namespace laga;
using laga::ref::Array;

namespace {

Array random_array(const Shape& s, const std::string& name, uint64_t seed = 11) {
  Array a(s);
  const uint64_t stream = stream_id(name);
  for (int64_t i = 0; i < a.numel(); ++i) a[i] = normal(seed, stream, uint64_t(i));
  return a;
}

double dot(const Array& a, const Array& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a[i] * b[i];
  return s;
}

struct Case {
  std::string name;
  bool q_lora;       // tiny's q_lora_rank 48, or 0 (a single wq)
  bool interleaved;  // RoPE layout
  int64_t B;
  enum Yarn { on, off, factor } yarn = on;  // factor: mscale_all_dim 0.5, attention factor ≠ 1
  bool attention_only = false;              // the attention alone: no input norm, no residual
};

void PrintTo(const Case& k, std::ostream* os) { *os << k.name; }

MlaConfig config_for(const Case& k) {
  MlaConfig c = MlaConfig::preset("tiny");
  c.dtype = DType::f32;
  c.num_layers = 2;
  if (!k.q_lora) c.q_lora_rank = 0;
  c.rope_interleaved = k.interleaved;
  c.rope_scaling.enabled = k.yarn != Case::off;
  if (k.yarn == Case::factor) c.rope_scaling.mscale_all_dim = 0.5;
  c.batch = k.B;
  c.seq_len = k.B == 1 ? 12 : 9;
  c.attention_only = k.attention_only;
  return c;
}

ref::RefWeights ref_weights(const MlaConfig& c, uint64_t seed = 5) {
  Weights w = allocate_weights(c);
  init_weights(w, c, seed);
  return ref::from_weights(w);
}

Array input(const MlaConfig& c) { return random_array({c.seq_len, c.batch, c.hidden_size}, "x"); }

// ---------------------------------------------------------------------------------------------
// Finite differences over the whole stack

// Step and tolerance. ε = 1e-5 in fp64. The central difference's truncation error is
// ε²/6 · |∂³L/∂v³| ≈ 1e-11 · O(1–10); its rounding error is ≈ u · Σ|g·y| / ε with u = 1.1e-16 and
// Σ|g·y| ≈ T·B·D ≈ 10³, i.e. ≈ 1e-8 absolute. Projections of the gradient are O(0.1–10), so the
// relative error should land around 1e-8 to 1e-9; 1e-6 leaves two orders of margin and is still
// five orders below what a real mistake (a dropped term, a sign, a transposed index: relative error
// 1e-2 and up) produces. Error is relative to max(|analytic|, rms of the tensor's gradient): the
// absolute error does not shrink with a small entry, so a near-zero entry must not blow the ratio
// up.
constexpr double kEps = 1e-5;
constexpr double kFdTolerance = 1e-6;

class BlockRefGradients : public testing::TestWithParam<Case> {};

TEST_P(BlockRefGradients, MatchFiniteDifferences) {
  const MlaConfig c = config_for(GetParam());
  ref::RefWeights w = ref_weights(c);
  Array x = input(c);
  const Array g = random_array(x.shape, "g");
  const ref::BlockGrads grads = ref::block_backward(c, w, x, g);

  // Every tensor the loss depends on, with its analytic gradient: x and every weight.
  std::vector<std::pair<std::string, Array*>> params{{"x", &x}};
  for (auto& [name, t] : w) params.push_back({name, &t});
  ASSERT_EQ(grads.dw.size(), w.size()) << "one gradient per weight";

  const uint64_t dir_stream = stream_id("directions");
  uint64_t draw = 0;
  for (const auto& param : params) {
    const std::string& name = param.first;
    Array* const p = param.second;  // a lambda below captures it (not a structured binding)
    double worst = 0;
    SCOPED_TRACE(name);
    const Array& grad = name == "x" ? grads.dx : grads.dw.at(name);
    ASSERT_EQ(grad.shape, p->shape);
    if (name.find(".indexer.") != std::string::npos) {
      // the dense block ignores the indexer: no gradient at all (the sparse block's below)
      for (int64_t i = 0; i < grad.numel(); ++i) ASSERT_EQ(grad[i], 0.0);
      continue;
    }
    double rms = 0;
    for (int64_t i = 0; i < grad.numel(); ++i) rms += grad[i] * grad[i];
    rms = std::sqrt(rms / double(grad.numel()));
    ASSERT_GT(rms, 0.0) << "a weight the loss depends on has a zero gradient";

    // (L(p + εv) - L(p - εv)) / 2ε against ⟨grad, v⟩, for unit directions v.
    auto check = [&](const Array& v, const std::string& what) {
      const Array p0 = *p;
      for (int64_t i = 0; i < v.numel(); ++i) (*p)[i] = p0[i] + kEps * v[i];
      const double up = dot(g, ref::block_forward(c, w, x));
      for (int64_t i = 0; i < v.numel(); ++i) (*p)[i] = p0[i] - kEps * v[i];
      const double down = dot(g, ref::block_forward(c, w, x));
      *p = p0;
      const double fd = (up - down) / (2 * kEps), analytic = dot(grad, v);
      const double err = std::abs(fd - analytic) / std::max(std::abs(analytic), rms);
      EXPECT_LT(err, kFdTolerance)
          << what << ": finite difference " << fd << ", analytic " << analytic;
      worst = std::max(worst, err);
    };
    // Three random directions, normalised.
    for (int d = 0; d < 3; ++d) {
      Array v(p->shape);
      double n2 = 0;
      for (int64_t i = 0; i < v.numel(); ++i) n2 += (v[i] = normal(3, dir_stream, draw++)) * v[i];
      for (int64_t i = 0; i < v.numel(); ++i) v[i] /= std::sqrt(n2);
      check(v, "direction " + std::to_string(d));
    }
    // Four single entries: three drawn at random and the largest gradient.
    std::vector<int64_t> entries;
    for (int e = 0; e < 3; ++e)
      entries.push_back(int64_t(uniform01(3, dir_stream, draw++) * double(p->numel())));
    int64_t largest = 0;
    for (int64_t i = 0; i < grad.numel(); ++i)
      if (std::abs(grad[i]) > std::abs(grad[largest])) largest = i;
    entries.push_back(largest);
    for (int64_t e : entries) {
      Array v(p->shape);
      v[e] = 1.0;
      check(v, "entry " + std::to_string(e));
    }
    // The measured error per tensor, in the test's XML output (--gtest_output=xml).
    RecordProperty("max_relative_error." + name, fmt::format("{:.2e}", worst));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, BlockRefGradients,
    testing::Values(
        Case{"qlora_interleaved_b1", true, true, 1}, Case{"qlora_interleaved_b2", true, true, 2},
        Case{"qlora_halves_b1", true, false, 1}, Case{"qlora_halves_b2", true, false, 2},
        Case{"noqlora_interleaved_b1", false, true, 1},
        Case{"noqlora_interleaved_b2", false, true, 2}, Case{"noqlora_halves_b1", false, false, 1},
        Case{"noqlora_halves_b2", false, false, 2},
        Case{"qlora_halves_b2_plain_rope", true, false, 2, Case::off},
        Case{"noqlora_interleaved_b2_yarn_factor", false, true, 2, Case::factor},
        Case{"qlora_interleaved_b2_attention_only", true, true, 2, Case::on, true},
        Case{"noqlora_halves_b1_attention_only", false, false, 1, Case::on, true}),
    [](const testing::TestParamInfo<Case>& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// Facts that need no code

TEST(BlockRef, FromWeightsKeepsEveryNameAndShape) {
  for (bool q_lora : {true, false}) {
    const MlaConfig c = config_for({"", q_lora, true, 1});
    Weights w = allocate_weights(c);
    init_weights(w, c, 5);
    const ref::RefWeights r = ref::from_weights(w);
    size_t n = 0;
    w.for_each([&](const std::string& name, const Tensor& t) {
      ++n;
      ASSERT_TRUE(r.count(name)) << name;
      EXPECT_EQ(r.at(name).shape, t.shape()) << name;
      for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(r.at(name)[i], double(t.get(i))) << name;
    });
    EXPECT_EQ(r.size(), n);
    EXPECT_EQ(r.count("layers.1.wq"), q_lora ? 0u : 1u);
    EXPECT_EQ(r.count("layers.1.wq_a"), q_lora ? 1u : 0u);
  }
}

TEST(BlockRef, ZeroOutputProjectionMakesTheStackTheIdentity) {
  // y = x + o · woᵀ with wo = 0 gives y = x exactly, whatever the attention computes.
  for (bool q_lora : {true, false}) {
    const MlaConfig c = config_for({"", q_lora, true, 2});
    ref::RefWeights w = ref_weights(c);
    for (int64_t l = 0; l < c.num_layers; ++l)
      for (double& v : w.at("layers." + std::to_string(l) + ".wo").data) v = 0;
    const Array x = input(c);
    const Array y = ref::block_forward(c, w, x);
    ASSERT_EQ(y.shape, x.shape);
    for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(y[i], x[i]);
  }
}

// The attention alone (attention_only) is the block less its input norm and residual, exactly in
// fp64: fed xn = rmsnorm(x; attn_norm) its y is the block's y − x, and its dx is the block's norm
// path before the norm, dxn: the block's dx = dy + rmsnormᵀ(dxn). Every other weight's gradient is
// the block's, and it has no attn_norm; with wo = 0 its output is 0 (no residual to carry x
// through).
TEST(BlockRef, TheAttentionAloneIsTheBlockLessItsNormAndResidual) {
  for (bool q_lora : {true, false}) {
    MlaConfig c = config_for({"", q_lora, true, 2});
    c.num_layers = 1;
    MlaConfig alone = c;
    alone.attention_only = true;
    ref::RefWeights w = ref_weights(c);
    const Array x = input(c), dy = random_array(x.shape, "dy");
    const Array& attn_norm = w.at("layers.0.attn_norm");
    const Array xn = ref::rmsnorm_forward(x, attn_norm, c.rms_norm_eps);
    ref::RefWeights wa = w;
    wa.erase("layers.0.attn_norm");

    const Array y = ref::block_forward(c, w, x), ya = ref::block_forward(alone, wa, xn);
    for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(ya[i] + x[i], y[i]) << i;
    const ref::BlockGrads g = ref::block_backward(c, w, x, dy),
                          ga = ref::block_backward(alone, wa, xn, dy);
    const ref::RmsNormGrads gn = ref::rmsnorm_backward(x, attn_norm, ga.dx, c.rms_norm_eps);
    for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(dy[i] + gn.dx[i], g.dx[i]) << i;
    EXPECT_EQ(gn.dw.data, g.dw.at("layers.0.attn_norm").data);
    EXPECT_EQ(ga.dw.count("layers.0.attn_norm"), 0u);
    EXPECT_EQ(ga.dw.size() + 1, g.dw.size());
    for (const auto& [name, d] : ga.dw) EXPECT_EQ(d.data, g.dw.at(name).data) << name;

    for (double& v : wa.at("layers.0.wo").data) v = 0;
    for (double v : ref::block_forward(alone, wa, x).data) ASSERT_EQ(v, 0.0);
  }
}

TEST(BlockRef, IsCausal) {
  // Changing token t0's input leaves every earlier token's output the same, and changes t0's.
  const MlaConfig c = config_for({"", true, true, 2});
  const ref::RefWeights w = ref_weights(c);
  const Array x = input(c);
  const Array y = ref::block_forward(c, w, x);
  const int64_t t0 = 5, BD = c.batch * c.hidden_size;
  Array x2 = x;
  for (int64_t i = t0 * BD; i < (t0 + 1) * BD; ++i) x2[i] += 0.5;
  const Array y2 = ref::block_forward(c, w, x2);
  for (int64_t i = 0; i < t0 * BD; ++i) ASSERT_NEAR(y2[i], y[i], 1e-14) << "token " << i / BD;
  double change = 0;
  for (int64_t i = t0 * BD; i < (t0 + 1) * BD; ++i)
    change = std::max(change, std::abs(y2[i] - y[i]));
  EXPECT_GT(change, 0.1);
}

TEST(BlockRef, BatchEntriesDoNotMix) {
  // Each batch entry of a B = 2 run equals a B = 1 run on that entry alone.
  MlaConfig c2 = config_for({"", true, false, 2});
  MlaConfig c1 = c2;
  c1.batch = 1;
  const ref::RefWeights w = ref_weights(c2);
  const Array x = input(c2);
  const Array y = ref::block_forward(c2, w, x);
  const int64_t T = c2.seq_len, D = c2.hidden_size;
  for (int64_t b = 0; b < 2; ++b) {
    Array xb({T, 1, D});
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < D; ++d) xb[t * D + d] = x[(t * 2 + b) * D + d];
    const Array yb = ref::block_forward(c1, w, xb);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < D; ++d) EXPECT_NEAR(yb[t * D + d], y[(t * 2 + b) * D + d], 1e-13);
  }
}

TEST(BlockRef, SingleTokenAttendsOnlyToItsOwnValue) {
  // With T = 1 the softmax has one entry, so o = v whatever q, k and the scale are:
  // y = x + wo · [per head h: wkv_b's v-rows of head h · rmsnorm(kv[:Lkv]; kv_norm)], with
  // kv = wkv_a · rmsnorm(x; attn_norm). Checks the head layout of wkv_b (Dn k-rows, then Dv
  // v-rows).
  MlaConfig c = config_for({"", true, true, 1});
  c.num_layers = 1;
  c.seq_len = 1;
  const ref::RefWeights w = ref_weights(c);
  const Array x = input(c);
  const int64_t H = c.num_attention_heads, Dn = c.qk_nope_head_dim, Dv = c.v_head_dim,
                Lkv = c.kv_lora_rank;
  const Array xn = ref::rmsnorm_forward(x, w.at("layers.0.attn_norm"), c.rms_norm_eps);
  const Array kv = ref::linear_forward(xn, w.at("layers.0.wkv_a"));
  Array c_kv({1, 1, Lkv});
  for (int64_t j = 0; j < Lkv; ++j) c_kv[j] = kv[j];
  const Array ckv = ref::rmsnorm_forward(c_kv, w.at("layers.0.kv_norm"), c.rms_norm_eps);
  const Array& wkv_b = w.at("layers.0.wkv_b");
  Array o({1, 1, H * Dv});
  for (int64_t h = 0; h < H; ++h)
    for (int64_t j = 0; j < Dv; ++j)
      for (int64_t i = 0; i < Lkv; ++i)
        o[h * Dv + j] += wkv_b[(h * (Dn + Dv) + Dn + j) * Lkv + i] * ckv[i];
  const Array attn = ref::linear_forward(o, w.at("layers.0.wo"));
  const Array y = ref::block_forward(c, w, x);
  for (int64_t d = 0; d < c.hidden_size; ++d) EXPECT_NEAR(y[d], x[d] + attn[d], 1e-13);
}

TEST(BlockRef, MatchesTheEquationsWrittenOutByHand) {
  // One layer of docs/design.md §2.1–§2.2 restated with explicit index loops, independent of
  // block_ref's helpers: q's per-head layout [nope | pe], kpe broadcast to every head, wkv_b's
  // per-head [Dn k-rows | Dv v-rows], and the softmax scale. tiny: Dqk = 16 + 8 = 24, YaRN factor
  // 40, mscale_all_dim 1: scale = (0.1 · ln 40 + 1)² / √24 = 1.3688879² / 4.8989795 = 0.3824989.
  for (bool yarn : {true, false}) {
    MlaConfig c = config_for({"", true, true, 2});
    c.num_layers = 1;
    c.seq_len = 5;
    c.rope_scaling.enabled = yarn;
    const double mscale = 0.1 * std::log(40.0) + 1;
    // plain: 0.2041241
    const double scale = yarn ? mscale * mscale / std::sqrt(24.0) : 1 / std::sqrt(24.0);
    EXPECT_NEAR(scale, yarn ? 0.3824989 : 0.2041241, 1e-7);
    const ref::RefWeights w = ref_weights(c);
    const Array x = input(c);
    const int64_t T = c.seq_len, B = 2, H = 8, Lkv = 32, Dn = 16, Dr = 8, Dv = 12, Dqk = 24;
    auto W = [&](const char* n) -> const Array& { return w.at(std::string("layers.0.") + n); };
    const Array xn = ref::rmsnorm_forward(x, W("attn_norm"), c.rms_norm_eps);
    const Array cqn =
        ref::rmsnorm_forward(ref::linear_forward(xn, W("wq_a")), W("q_norm"), c.rms_norm_eps);
    const Array q_flat = ref::linear_forward(cqn, W("wq_b"));  // [T, B, H·Dqk]
    const Array kv = ref::linear_forward(xn, W("wkv_a"));      // [T, B, Lkv + Dr]
    Array kv_c({T, B, Lkv}), kv_pe({T, B, Dr}), q_pe({T, B, H, Dr});
    for (int64_t tb = 0; tb < T * B; ++tb) {
      for (int64_t j = 0; j < Lkv; ++j) kv_c[tb * Lkv + j] = kv[tb * (Lkv + Dr) + j];
      for (int64_t j = 0; j < Dr; ++j) kv_pe[tb * Dr + j] = kv[tb * (Lkv + Dr) + Lkv + j];
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < Dr; ++j)
          q_pe[(tb * H + h) * Dr + j] = q_flat[(tb * H + h) * Dqk + Dn + j];
    }
    const Array ckv = ref::rmsnorm_forward(kv_c, W("kv_norm"), c.rms_norm_eps);
    const Array kpe = ref::rope_forward(kv_pe, c, 0), q_pe_rot = ref::rope_forward(q_pe, c, 0);
    const Array kvb = ref::linear_forward(ckv, W("wkv_b"));  // [T, B, H·(Dn + Dv)]
    Array q({T, B, H, Dqk}), k({T, B, H, Dqk}), v({T, B, H, Dv});
    for (int64_t tb = 0; tb < T * B; ++tb)
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t j = 0; j < Dn; ++j) {
          q[(tb * H + h) * Dqk + j] = q_flat[(tb * H + h) * Dqk + j];
          k[(tb * H + h) * Dqk + j] = kvb[(tb * H + h) * (Dn + Dv) + j];
        }
        for (int64_t j = 0; j < Dr; ++j) {
          q[(tb * H + h) * Dqk + Dn + j] = q_pe_rot[(tb * H + h) * Dr + j];
          k[(tb * H + h) * Dqk + Dn + j] = kpe[tb * Dr + j];
        }
        for (int64_t j = 0; j < Dv; ++j)
          v[(tb * H + h) * Dv + j] = kvb[(tb * H + h) * (Dn + Dv) + Dn + j];
      }
    Array o = ref::attention_forward(q, k, v, scale, true);
    o.shape = {T, B, H * Dv};
    const Array attn = ref::linear_forward(o, W("wo"));
    const Array y = ref::block_forward(c, w, x);
    for (int64_t i = 0; i < x.numel(); ++i) EXPECT_NEAR(y[i], x[i] + attn[i], 1e-13);
  }
}

// The absorbed association order (W_UK folded into the query, one attention over the latent, W_UV
// after) and the per-head order with FlashAttention's delta (rowsum(dO∘O) over the stored output)
// are the same function: in exact arithmetic y, dx and every weight gradient agree with the
// per-head order to fp64 rounding, over both q paths, both RoPE layouts and B 1–2. Their plain fp32
// versions (sums in fp32) differ from the exact values by fp32 rounding, not more, and not by zero.
TEST(BlockRef, OtherAssociationOrdersAreTheSameFunction) {
  for (const Case& k :
       {Case{"qlora_interleaved_b2", true, true, 2}, Case{"wq_halves_b1", false, false, 1}}) {
    SCOPED_TRACE(k.name);
    const MlaConfig c = config_for(k);
    const ref::RefWeights w = ref_weights(c);
    const Array x = input(c);
    const Array g = random_array(x.shape, "g");
    auto check = [&](const Array& got, const Array& want, const std::string& name, double lo,
                     double hi) {
      double worst = 0, scale = 0;
      for (int64_t i = 0; i < want.numel(); ++i) {
        worst = std::max(worst, std::abs(got[i] - want[i]));
        scale = std::max(scale, std::abs(want[i]));
      }
      EXPECT_LE(worst, hi * scale) << name;
      EXPECT_GE(worst, lo * scale) << name;
    };
    const Array y = ref::block_forward(c, w, x);
    const ref::BlockGrads d = ref::block_backward(c, w, x, g);
    for (ref::Core core : {ref::Core::absorbed, ref::Core::per_head_output_delta})
      for (const auto& [st, lo, hi] :
           {std::tuple<std::optional<DType>, double, double>{std::nullopt, 0.0, 1e-12},
            {DType::f32, 1e-9, 1e-4}}) {
        SCOPED_TRACE(core == ref::Core::absorbed ? "absorbed" : "per-head, delta from the output");
        check(ref::block_forward(c, w, x, st, core), y, "y", lo, hi);
        const ref::BlockGrads a = ref::block_backward(c, w, x, g, st, core);
        check(a.dx, d.dx, "dx", lo, hi);
        ASSERT_EQ(a.dw.size(), d.dw.size());
        for (const auto& [name, t] : d.dw) check(a.dw.at(name), t, name, lo, hi);
      }
  }
}

}  // namespace

// The sparse forms' block (a selection given; docs/sparse.md) by finite differences, in both
// stages: x and the MLA's weights through L = ⟨g, y⟩, the indexer's weights through
// indexer_loss_scale · Σ_l L_I,l — the indexer's inputs are detached and its target carries no
// gradient, so each weight's gradient is that of its own loss alone.
TEST(BlockRefGradients, TheSparseBlockMatchesFiniteDifferences) {
  for (IndexerStage stage : {IndexerStage::sparse, IndexerStage::warmup}) {
    MlaConfig c = MlaConfig::preset("tiny");
    c.dtype = DType::f32, c.num_layers = 2, c.batch = 2, c.seq_len = 24;
    c.indexer_stage = stage, c.indexer_loss_scale = 0.7;
    SCOPED_TRACE(indexer_stage_name(stage));
    ref::RefWeights w = ref_weights(c);
    Array x = input(c);
    const Array g = random_array(x.shape, "g");
    // a selection of min(k, t + 1) distinct earlier positions per row, ascending, −1 padded
    std::vector<Array> sel;
    const int64_t T = c.seq_len, B = c.batch, k = c.topk();
    for (int64_t l = 0; l < c.num_layers; ++l) {
      Array s({T, B, k});
      for (int64_t t = 0; t < T; ++t)
        for (int64_t b = 0; b < B; ++b) {
          std::vector<std::pair<double, int64_t>> order;
          for (int64_t p = 0; p <= t; ++p)
            order.push_back(
                {normal(7, stream_id("sel"), uint64_t(((l * T + t) * B + b) * T + p)), p});
          std::sort(order.begin(), order.end());
          std::vector<int64_t> keep;
          for (int64_t i = 0; i < std::min<int64_t>(k, t + 1); ++i)
            keep.push_back(order[size_t(i)].second);
          std::sort(keep.begin(), keep.end());
          for (int64_t i = 0; i < k; ++i)
            s[(t * B + b) * k + i] = i < int64_t(keep.size()) ? double(keep[size_t(i)]) : -1.0;
        }
      sel.push_back(std::move(s));
    }
    const ref::BlockGrads grads =
        ref::block_backward(c, w, x, g, std::nullopt, ref::Core::absorbed, &sel);
    auto main_loss = [&] {
      return dot(g, ref::block_forward(c, w, x, std::nullopt, ref::Core::absorbed, &sel));
    };
    auto index_loss = [&] {
      const ref::BlockGrads b =
          ref::block_backward(c, w, x, g, std::nullopt, ref::Core::absorbed, &sel);
      double sum = 0;
      for (double v : b.indexer_loss) sum += v;
      return c.indexer_loss_scale * sum;
    };
    std::vector<std::pair<std::string, Array*>> params{{"x", &x}};
    for (auto& [name, t] : w) params.push_back({name, &t});
    for (const auto& [name, p] : params) {
      SCOPED_TRACE(name);
      const bool indexer = name.find(".indexer.") != std::string::npos;
      const Array& grad = name == "x" ? grads.dx : grads.dw.at(name);
      double rms = 0;
      for (int64_t i = 0; i < grad.numel(); ++i) rms += grad[i] * grad[i];
      rms = std::sqrt(rms / double(grad.numel()));
      ASSERT_GT(rms, 0.0);
      Array v = random_array(p->shape, "dir." + name, 3);
      const double norm = std::sqrt(dot(v, v));
      for (int64_t i = 0; i < v.numel(); ++i) v[i] /= norm;
      const Array p0 = *p;
      for (int64_t i = 0; i < v.numel(); ++i) (*p)[i] = p0[i] + kEps * v[i];
      const double up = indexer ? index_loss() : main_loss();
      for (int64_t i = 0; i < v.numel(); ++i) (*p)[i] = p0[i] - kEps * v[i];
      const double down = indexer ? index_loss() : main_loss();
      *p = p0;
      const double fd = (up - down) / (2 * kEps), analytic = dot(grad, v);
      EXPECT_LT(std::abs(fd - analytic) / std::max(std::abs(analytic), rms), kFdTolerance)
          << "finite difference " << fd << ", analytic " << analytic;
    }
  }
}
