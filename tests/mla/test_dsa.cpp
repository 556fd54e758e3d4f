// The sparse forms (dsa-gather, dsa-regather; docs/sparse.md) as blocks: judged by verify's rule
// against the fp64 reference of the sparse block on their own selection (both stages, P 1–4, fp32
// and bf16, both layouts, the indexer's gradients included); bit-identical to each other at every
// P; equal to the
// dense absorbed-shared form within the rule when the selection holds every earlier key; their
// indexer loss the reference's; their selection bitwise the same at every P; and the configurations
// they refuse.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "laga/driver/launch.hpp"
#include "laga/driver/run.hpp"
#include "laga/mla/form.hpp"
#include "reference/block_ref.hpp"
#include "verify/compare.hpp"
#include "verify/forms.hpp"

using namespace laga;

namespace {

Config tiny(const std::string& form, DType dt, int64_t T, int64_t sp = 1, int64_t L = 1,
            int64_t B = 1, IndexerStage stage = IndexerStage::sparse) {
  MlaConfig c = MlaConfig::preset("tiny");
  c.form = form, c.dtype = dt, c.seq_len = T, c.sp = sp, c.num_layers = L, c.batch = B;
  c.indexer_stage = stage;
  return c;
}

verify::FormsReport check(const Config& c, const std::vector<int64_t>& sps) {
  verify::FormsReport report;
  launch(LaunchKind::threads, [&](Launcher& l) {
    verify::FormsOptions opt;
    opt.forms = {"dsa-gather", "dsa-regather"};
    report = verify::check_forms(c, sps, l, opt);
  });
  return report;
}

RankResult gathered(const Config& c) {
  RunOptions opt;
  opt.gather_tensors = true;
  return std::move(run_group(c, opt).front());
}

}  // namespace

TEST(Dsa, BothFormsPassTheRuleOnTheirSelectionAtEveryP) {
  for (DType dt : {DType::f32, DType::bf16})
    for (IndexerStage stage : {IndexerStage::sparse, IndexerStage::warmup}) {
      // T 48 > k 16: every row from position 16 on selects 16 of its keys
      // the zigzag layout at P 1, 2, 4 and the contiguous one at P 4
      const Config c = tiny("explicit", dt, 48, 1, 2, 2, stage);
      verify::FormsReport r = check(c, {1, 2, 4});
      const verify::FormsReport contiguous =
          check(c.with([](MlaConfig& m) { m.cp_layout = CpLayout::contiguous; }), {4});
      for (const auto& k : contiguous.cases)
        if (k.form.starts_with("dsa-")) r.cases.push_back(k), r.pass = r.pass && contiguous.pass;
      int sparse_cases = 0;
      for (const auto& k : r.cases) {
        fmt::print("[measured] {} {} P{} {} vs {}: worst {} at {:.3f} of allowed\n", dtype_name(dt),
                   indexer_stage_name(stage), k.sp, k.form, k.vs, k.worst, k.worst_ratio);
        EXPECT_TRUE(k.pass) << k.form << " P" << k.sp << " vs " << k.vs << ": " << k.worst << " at "
                            << k.worst_ratio << "; " << k.criterion;
        sparse_cases += k.form.starts_with("dsa-") && k.vs == "fp64";
        // the indexer's gradients are judged too
        if (k.form.starts_with("dsa-") && k.vs == "fp64") {
          EXPECT_TRUE(k.max_abs.count("dindexer_wq_b")) << k.form;
        }
      }
      EXPECT_EQ(sparse_cases, 8);
      EXPECT_TRUE(r.pass);
    }
}

// dsa-regather gathers the latent again and rebuilds q_abs block by block on the blocks dsa-gather
// ran in forward: the same operations on the same values at every P, in both layouts. T 1040 at
// P 1 and T 2080 at P 2 (zigzag chunks of 520) cut a rank's rows into several row blocks.
TEST(Dsa, RegatherIsBitIdenticalToGatherAtEveryP) {
  struct Shape {
    int64_t T, P, L, B;
    CpLayout layout;
  };
  const Shape shapes[] = {{40, 1, 2, 2, CpLayout::zigzag},
                          {48, 2, 2, 2, CpLayout::zigzag},
                          {48, 4, 1, 1, CpLayout::contiguous},
                          {1040, 1, 1, 1, CpLayout::zigzag},
                          {2080, 2, 1, 1, CpLayout::zigzag}};
  for (DType dt : {DType::f32, DType::bf16})
    for (const Shape& sh : shapes) {
      auto cfg = [&](const char* form) {
        return tiny(form, dt, sh.T, sh.P, sh.L, sh.B).with([&](MlaConfig& m) {
          m.cp_layout = sh.layout;
        });
      };
      const RankResult a = gathered(cfg("dsa-gather")), b = gathered(cfg("dsa-regather"));
      const std::string what =
          fmt::format("{} T {} P {} {}", dtype_name(dt), sh.T, sh.P, cp_layout_name(sh.layout));
      std::string where;
      EXPECT_TRUE(verify::bitwise_equal(verify::tensors_of(a.y, a.dx, a.grads),
                                        verify::tensors_of(b.y, b.dx, b.grads), &where))
          << what << ": " << where;
      ASSERT_EQ(a.topk.size(), size_t(sh.L));
      for (size_t l = 0; l < a.topk.size(); ++l)
        EXPECT_EQ(a.topk[l].to_floats(), b.topk[l].to_floats()) << what << " layer " << l;
      EXPECT_EQ(a.indexer_loss, b.indexer_loss) << what;
    }
}

// The selection is the indexer's and the indexer runs on the same values at every P and in either
// layout (each row's scores in one fixed order): every P selects the same keys, bit for bit.
TEST(Dsa, TheSelectionIsTheSameAtEveryPInBothLayouts) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const RankResult one = gathered(tiny("dsa-gather", dt, 64, 1, 2));
    for (CpLayout layout : {CpLayout::zigzag, CpLayout::contiguous})
      for (int64_t P : {2, 4, 8}) {
        const RankResult r = gathered(
            tiny("dsa-gather", dt, 64, P, 2).with([&](MlaConfig& m) { m.cp_layout = layout; }));
        ASSERT_EQ(r.topk.size(), one.topk.size());
        for (size_t l = 0; l < r.topk.size(); ++l)
          EXPECT_EQ(r.topk[l].to_floats(), one.topk[l].to_floats())
              << dtype_name(dt) << " " << cp_layout_name(layout) << " P" << P << " layer " << l;
      }
  }
}

// With k ≥ T every row selects all its earlier keys: the sparse block is the dense absorbed one.
// y, dx and every MLA weight's gradient within the rule of the dense absorbed-shared form's own
// errors (and the plain implementations').
TEST(Dsa, WithEveryKeySelectedItIsTheDenseAbsorbedSharedForm) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const Config c = tiny("absorbed-shared", dt, 16, 1, 2, 2);  // k = 16 = T
    ASSERT_GE(c->index_topk, c->seq_len);
    const RankResult dense = gathered(c);
    const RankResult sparse = gathered(c.with([](MlaConfig& m) { m.form = "dsa-gather"; }));
    const ref::RefWeights w = ref::from_weights(dense.weights);
    const ref::Array x = ref::from_tensor(dense.x), dy = ref::from_tensor(dense.dy);
    const verify::Tensors exact = verify::reference_tensors(*c, w, x, dy, std::nullopt);
    const auto plain = verify::plain_errors(*c, w, x, dy, exact);
    auto e_dense = verify::errors(verify::tensors_of(dense.y, dense.dx, dense.grads), exact);
    auto e_sparse = verify::errors(verify::tensors_of(sparse.y, sparse.dx, sparse.grads), exact);
    // the MLA's tensors: the indexer's gradients are the sparse form's alone
    for (auto* m : {&e_dense, &e_sparse})
      std::erase_if(*m, [](const auto& kv) { return kv.first.starts_with("dindexer_"); });
    const verify::Verdict v = verify::form_vs_baseline(e_sparse, e_dense, plain, dt);
    fmt::print("[measured] {} k >= T: dsa-gather vs absorbed-shared: {}\n", dtype_name(dt),
               verify::summary(v));
    EXPECT_TRUE(v.pass) << dtype_name(dt) << ": " << verify::summary(v);
  }
}

// The run's indexer loss per layer (summed over ranks) is the fp64 reference's on the run's own
// selection.
TEST(Dsa, TheIndexerLossIsTheReferences) {
  for (int64_t P : {1, 2}) {
    const Config c = tiny("dsa-gather", DType::f32, 48, P, 2, 2);
    RunOptions opt;
    opt.gather_tensors = true;
    const std::vector<RankResult> ranks = run_group(c, opt);
    std::vector<double> loss(2, 0.0);
    for (const RankResult& r : ranks)
      for (size_t l = 0; l < 2; ++l) loss[l] += r.indexer_loss.at(l);
    const RankResult& r0 = ranks.front();
    std::vector<ref::Array> sel;
    for (const Tensor& t : r0.topk) sel.push_back(ref::from_tensor(t));
    const ref::BlockGrads g =
        ref::block_backward(*c, ref::from_weights(r0.weights), ref::from_tensor(r0.x),
                            ref::from_tensor(r0.dy), std::nullopt, ref::Core::absorbed, &sel);
    for (size_t l = 0; l < 2; ++l) {
      fmt::print("[measured] P{} layer {}: L_I {:.9g}, fp64 {:.9g}\n", P, l, loss[l],
                 g.indexer_loss[l]);
      EXPECT_GT(g.indexer_loss[l], 0);
      EXPECT_NEAR(loss[l], g.indexer_loss[l], 1e-4 * g.indexer_loss[l]) << "P" << P << " " << l;
    }
  }
}

TEST(Dsa, DenseFormsIgnoreTheIndexerAndSparseOnesNeedOne) {
  // a dense form on a model with an indexer: its indexer weights get no gradient
  const RankResult r = gathered(tiny("laga", DType::f32, 32));
  EXPECT_TRUE(r.topk.empty());
  EXPECT_TRUE(r.indexer_loss.empty());
  for (const char* name : {"indexer.wq_b", "indexer.wk", "indexer.weights_proj"})
    for (float v : r.grads.layers[0].by_name(name).to_floats()) ASSERT_EQ(v, 0.0f) << name;
  // a sparse form on a model without one, or without a query latent, is refused
  MlaConfig v3 = MlaConfig::preset("deepseek-v3");
  v3.form = "dsa-gather", v3.seq_len = 16;
  std::vector<std::string> p = v3.problems();
  ASSERT_FALSE(p.empty());
  EXPECT_NE(p.front().find("--model deepseek-v3.2"), std::string::npos) << p.front();
  MlaConfig lite = MlaConfig::preset("tiny");
  lite.form = "dsa-regather", lite.q_lora_rank = 0;
  p = lite.problems();
  ASSERT_FALSE(p.empty());
  EXPECT_NE(p.front().find("q_lora_rank"), std::string::npos) << p.front();
}

TEST(Dsa, BadIndexerDimensionsAreRefusedNamingTheValue) {
  auto problems = [](const std::function<void(MlaConfig&)>& edit) {
    MlaConfig c = MlaConfig::preset("tiny");
    c.form = "dsa-gather";
    edit(c);
    std::string all;
    for (const auto& p : c.problems()) all += p + "; ";
    return all;
  };
  EXPECT_NE(problems([](MlaConfig& c) { c.index_topk = 0; }).find("index_topk (--index-topk) = 0"),
            std::string::npos);
  EXPECT_NE(problems([](MlaConfig& c) {
              c.index_head_dim = 4;
            }).find("index_head_dim (--index-dim) = 4 must be at least qk_rope_head_dim 8"),
            std::string::npos);
  EXPECT_NE(problems([](MlaConfig& c) { c.indexer_loss_scale = -1; }).find("indexer_loss_scale"),
            std::string::npos);
  EXPECT_EQ(problems([](MlaConfig&) {}), "");
}

// DeepSeek-V3.2's configuration: the preset, and a Hugging Face config.json's keys.
TEST(Dsa, DeepSeekV32PresetAndHuggingFaceKeys) {
  const MlaConfig c = MlaConfig::preset("deepseek-v3.2");
  EXPECT_EQ(c.index_n_heads, 64);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 2048);
  EXPECT_EQ(c.hidden_size, 7168);
  nlohmann::json j = c.to_json();
  EXPECT_EQ(j["index_n_heads"], 64);
  EXPECT_EQ(j["indexer_stage"], "sparse");
  // a Hugging Face config.json: the MLA keys and DeepSeek-V3.2's three
  const nlohmann::json hf = {
      {"hidden_size", 7168}, {"num_attention_heads", 128},  {"q_lora_rank", 1536},
      {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128},     {"qk_rope_head_dim", 64},
      {"v_head_dim", 128},   {"index_n_heads", 64},         {"index_head_dim", 128},
      {"index_topk", 2048},  {"model_type", "deepseek_v32"}};
  const MlaConfig h = MlaConfig::from_json(hf);
  EXPECT_EQ(h.index_n_heads, 64);
  EXPECT_EQ(h.index_head_dim, 128);
  EXPECT_EQ(h.index_topk, 2048);
  EXPECT_TRUE(h.has_indexer());
}
