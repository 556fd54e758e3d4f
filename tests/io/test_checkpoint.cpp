// Checkpoints and dumps: laga's own naming and Hugging Face DeepSeek's (single file, and sharded
// behind an index) load bit-exactly into the config's dtype; missing or mis-shaped tensors are
// refused with the tensor, its shape and the expected one named; a dump holds the config and
// every tensor in fp32 and loads back as weights.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "laga/core/random.hpp"
#include "laga/io/checkpoint.hpp"
#include "laga/io/safetensors.hpp"
#include "support/temp_dir.hpp"

using namespace laga;
namespace fs = std::filesystem;

namespace {

class Checkpoint : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return tmp_.path(name); }

  laga::testing::TempDir tmp_{"ckpt"};
  MemoryTracker tracker_;
  TrackerScope scope_{tracker_};
};

MlaConfig tiny(int64_t layers, DType dtype, int64_t q_lora_rank = 48) {
  MlaConfig c = MlaConfig::preset("tiny");
  c.num_layers = layers;
  c.dtype = dtype;
  c.q_lora_rank = q_lora_rank;
  (void)Config(c);
  return c;
}

Weights random_weights(const MlaConfig& c, uint64_t seed = 3) {
  Weights w = allocate_weights(c);
  init_weights(w, c, seed);
  return w;
}

// Every tensor of a and b: same names, shapes, and bits once b is rounded to a's dtype.
void expect_same_weights(const Weights& a, const Weights& b) {
  std::map<std::string, std::vector<float>> bv;
  b.for_each([&](const std::string& n, const Tensor& t) { bv[n] = t.to_floats(); });
  size_t count = 0;
  a.for_each([&](const std::string& n, const Tensor& t) {
    ASSERT_TRUE(bv.count(n)) << n;
    std::vector<float> want = bv[n];
    for (float& v : want) v = round_to(t.dtype(), v);
    EXPECT_EQ(t.to_floats(), want) << n;
    ++count;
  });
  EXPECT_EQ(count, bv.size());
}

// Weights under Hugging Face names, plus tensors a real shard holds that are not attention's.
std::vector<std::pair<std::string, const Tensor*>> hf_list(const MlaConfig& c, const Weights& w,
                                                           const std::vector<Tensor>& extras) {
  std::vector<std::pair<std::string, const Tensor*>> list;
  list.emplace_back("model.embed_tokens.weight", &extras[0]);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    w.layers[l].for_each([&](const std::string& name, const Tensor& t) {
      list.emplace_back(checkpoint_name(WeightNaming::hugging_face, int64_t(l), name), &t);
    });
  }
  list.emplace_back("model.layers.0.mlp.gate_proj.weight", &extras[1]);
  return list;
}

std::vector<Tensor> hf_extras() {
  return {Tensor::zeros({10, 64}, DType::bf16, "extra"),
          Tensor::zeros({4, 64}, DType::bf16, "extra")};
}

std::string usage_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_status(), 2) << e.message();
    return e.message();
  }
  ADD_FAILURE() << "no error";
  return "";
}

}  // namespace

TEST_F(Checkpoint, HuggingFaceNamesFollowDeepSeek) {
  EXPECT_EQ(checkpoint_name(WeightNaming::hugging_face, 3, "attn_norm"),
            "model.layers.3.input_layernorm.weight");
  EXPECT_EQ(checkpoint_name(WeightNaming::hugging_face, 0, "wq_a"),
            "model.layers.0.self_attn.q_a_proj.weight");
  EXPECT_EQ(checkpoint_name(WeightNaming::hugging_face, 0, "q_norm"),
            "model.layers.0.self_attn.q_a_layernorm.weight");
  EXPECT_EQ(checkpoint_name(WeightNaming::hugging_face, 0, "wq_b"),
            "model.layers.0.self_attn.q_b_proj.weight");
  EXPECT_EQ(checkpoint_name(WeightNaming::hugging_face, 0, "wq"),
            "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(checkpoint_name(WeightNaming::hugging_face, 0, "wkv_a"),
            "model.layers.0.self_attn.kv_a_proj_with_mqa.weight");
  EXPECT_EQ(checkpoint_name(WeightNaming::hugging_face, 0, "kv_norm"),
            "model.layers.0.self_attn.kv_a_layernorm.weight");
  EXPECT_EQ(checkpoint_name(WeightNaming::hugging_face, 0, "wkv_b"),
            "model.layers.0.self_attn.kv_b_proj.weight");
  EXPECT_EQ(checkpoint_name(WeightNaming::hugging_face, 1, "wo"),
            "model.layers.1.self_attn.o_proj.weight");
  EXPECT_EQ(checkpoint_name(WeightNaming::laga, 1, "wkv_b"), "layers.1.wkv_b");
  // DeepSeek-V3.2's lightning indexer
  EXPECT_EQ(checkpoint_name(WeightNaming::hugging_face, 2, "indexer.wq_b"),
            "model.layers.2.self_attn.indexer.wq_b.weight");
  EXPECT_EQ(checkpoint_name(WeightNaming::hugging_face, 0, "indexer.wk"),
            "model.layers.0.self_attn.indexer.wk.weight");
  EXPECT_EQ(checkpoint_name(WeightNaming::hugging_face, 0, "indexer.k_norm"),
            "model.layers.0.self_attn.indexer.k_norm.weight");
  EXPECT_EQ(checkpoint_name(WeightNaming::hugging_face, 0, "indexer.k_norm_bias"),
            "model.layers.0.self_attn.indexer.k_norm.bias");
  EXPECT_EQ(checkpoint_name(WeightNaming::hugging_face, 0, "indexer.weights_proj"),
            "model.layers.0.self_attn.indexer.weights_proj.weight");
  EXPECT_EQ(checkpoint_name(WeightNaming::laga, 1, "indexer.k_norm_bias"),
            "layers.1.indexer.k_norm_bias");
}

// A DeepSeek-V3.2 shard: the MLA's and the indexer's tensors under Hugging Face names, beside
// others, loads for a model with an indexer; one without the indexer's tensors is refused naming
// the first missing one.
TEST_F(Checkpoint, LoadsADeepSeekV32ShardWithItsIndexer) {
  const MlaConfig c = tiny(2, DType::bf16);
  ASSERT_TRUE(c.has_indexer());
  Weights w = random_weights(c);
  const std::vector<Tensor> extras = hf_extras();
  write_safetensors(path("v32.safetensors"), hf_list(c, w, extras));
  expect_same_weights(load_weights(path("v32.safetensors"), c), w);
  std::vector<std::pair<std::string, const Tensor*>> without;
  for (const auto& e : hf_list(c, w, extras))
    if (e.first.find(".indexer.") == std::string::npos) without.push_back(e);
  write_safetensors(path("v3.safetensors"), without);
  const std::string m = usage_error_of([&] { (void)load_weights(path("v3.safetensors"), c); });
  EXPECT_NE(m.find("no tensor model.layers.0.self_attn.indexer.wq_b.weight"), std::string::npos)
      << m;
}

TEST_F(Checkpoint, LoadsItsOwnNamingBitExactly) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    const MlaConfig c = tiny(2, dtype);
    Weights w = random_weights(c);
    write_weights(path("w.safetensors"), c, w);
    Weights back = load_weights(path("w.safetensors"), c);
    expect_same_weights(back, w);
    back.for_each([&](const std::string& n, const Tensor& t) {
      EXPECT_EQ(t.dtype(), dtype) << n;
      EXPECT_EQ(t.tag(), "weights") << n;
    });
  }
}

TEST_F(Checkpoint, ConvertsToTheConfigDtype) {
  const MlaConfig c32 = tiny(1, DType::f32), c16 = tiny(1, DType::bf16);
  Weights w = random_weights(c32);
  write_weights(path("w.safetensors"), c32, w);
  Weights back = load_weights(path("w.safetensors"), c16);
  back.for_each(
      [&](const std::string& n, const Tensor& t) { EXPECT_EQ(t.dtype(), DType::bf16) << n; });
  expect_same_weights(back, w);
}

TEST_F(Checkpoint, LoadsHuggingFaceDeepSeekNamingIgnoringOtherTensors) {
  const MlaConfig c = tiny(2, DType::bf16);
  Weights w = random_weights(c);
  auto extras = hf_extras();
  write_safetensors(path("hf.safetensors"), hf_list(c, w, extras), {{"format", "pt"}});
  expect_same_weights(load_weights(path("hf.safetensors"), c), w);
}

TEST_F(Checkpoint, LoadsHuggingFaceQProjWhenQLoraRankIsZero) {
  const MlaConfig c = tiny(1, DType::f32, 0);
  Weights w = random_weights(c);
  ASSERT_TRUE(w.layers[0].wq.defined());
  ASSERT_FALSE(w.layers[0].wq_a.defined());
  auto extras = hf_extras();
  write_safetensors(path("hf.safetensors"), hf_list(c, w, extras));
  expect_same_weights(load_weights(path("hf.safetensors"), c), w);
}

TEST_F(Checkpoint, LoadsAShardedHuggingFaceCheckpointThroughItsIndex) {
  const MlaConfig c = tiny(2, DType::f32);
  Weights w = random_weights(c);
  nlohmann::json index = {{"metadata", {{"total_size", 0}}},
                          {"weight_map", nlohmann::json::object()}};
  for (size_t l = 0; l < 2; ++l) {
    const std::string shard = fmt::format("model-0000{}-of-00002.safetensors", l + 1);
    std::vector<std::pair<std::string, const Tensor*>> list;
    w.layers[l].for_each([&](const std::string& name, const Tensor& t) {
      list.emplace_back(checkpoint_name(WeightNaming::hugging_face, int64_t(l), name), &t);
      index["weight_map"][list.back().first] = shard;
    });
    write_safetensors(path(shard), list);
  }
  std::ofstream(path("model.safetensors.index.json")) << index.dump(2);
  expect_same_weights(load_weights(path("model.safetensors.index.json"), c), w);
  expect_same_weights(load_weights(tmp_.dir().string(), c), w);
}

TEST_F(Checkpoint, RejectsAWrongShapeNamingTheTensorItsShapeAndTheExpectedOne) {
  const MlaConfig c = tiny(1, DType::f32);
  MlaConfig twice = c;
  twice.num_attention_heads *= 2;
  Weights w = random_weights(c);
  Weights big = random_weights(twice);
  w.layers[0].wkv_b = big.layers[0].wkv_b;  // [2·H·(Dn+Dv), Lkv]
  auto extras = hf_extras();
  write_safetensors(path("weights.safetensors"), hf_list(c, w, extras));
  const std::string msg = usage_error_of([&] { load_weights(path("weights.safetensors"), c); });
  EXPECT_NE(msg.find("weights.safetensors: model.layers.0.self_attn.kv_b_proj.weight has shape "
                     "[448, 32]; expected "
                     "[224, 32]"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("num_attention_heads 8"), std::string::npos) << msg;
}

TEST_F(Checkpoint, RejectsAMissingTensorNamingIt) {
  const MlaConfig c = tiny(2, DType::f32);
  Weights w = random_weights(c);
  auto extras = hf_extras();
  auto list = hf_list(c, w, extras);
  std::erase_if(list,
                [](const auto& p) { return p.first == "model.layers.1.self_attn.o_proj.weight"; });
  write_safetensors(path("hf.safetensors"), list);
  const std::string msg = usage_error_of([&] { load_weights(path("hf.safetensors"), c); });
  EXPECT_NE(msg.find("no tensor model.layers.1.self_attn.o_proj.weight"), std::string::npos) << msg;
}

TEST_F(Checkpoint, SuggestsFewerLayersWhenTheFileHasFewer) {
  const MlaConfig c1 = tiny(1, DType::f32), c3 = tiny(3, DType::f32);
  write_weights(path("w.safetensors"), c1, random_weights(c1));
  const std::string msg = usage_error_of([&] { load_weights(path("w.safetensors"), c3); });
  EXPECT_NE(msg.find("no tensor layers.1.attn_norm"), std::string::npos) << msg;
  EXPECT_NE(msg.find("try --layers 1"), std::string::npos) << msg;
}

// The attention alone (attention_only) has no input norm: its weights hold no attn_norm and load
// back bit-exactly; a whole block's checkpoint, laga's or Hugging Face's with input_layernorm,
// loads as the attention alone, the norm ignored; and a file without the norm, read as the whole
// block, is refused naming --attention-only.
TEST_F(Checkpoint, LoadsTheAttentionAloneWithoutAnInputNorm) {
  MlaConfig c = tiny(2, DType::f32);
  c.attention_only = true;
  const Weights w = random_weights(c);
  EXPECT_FALSE(w.layers[0].attn_norm.defined());
  write_weights(path("alone.safetensors"), c, w);
  expect_same_weights(load_weights(path("alone.safetensors"), c), w);

  const MlaConfig whole = tiny(2, DType::f32);
  const Weights wb = random_weights(whole);
  Weights want = allocate_weights(c);
  for (size_t l = 0; l < want.layers.size(); ++l)
    want.layers[l].for_each(
        [&](const std::string& name, Tensor& t) { t.copy_from(wb.layers[l].by_name(name)); });
  write_weights(path("laga.safetensors"), whole, wb);
  auto extras = hf_extras();
  write_safetensors(path("hf.safetensors"), hf_list(whole, wb, extras));
  for (const char* file : {"laga.safetensors", "hf.safetensors"}) {
    SCOPED_TRACE(file);
    expect_same_weights(load_weights(path(file), c), want);
  }

  const std::string msg = usage_error_of([&] { load_weights(path("alone.safetensors"), whole); });
  EXPECT_NE(msg.find("no tensor layers.0.attn_norm"), std::string::npos) << msg;
  EXPECT_NE(msg.find("add --attention-only"), std::string::npos) << msg;
}

TEST_F(Checkpoint, NamesAQLoraRankMismatch) {
  const MlaConfig lite = tiny(1, DType::f32, 0), lora = tiny(1, DType::f32);
  write_weights(path("lite.safetensors"), lite, random_weights(lite), WeightNaming::hugging_face);
  std::string msg = usage_error_of([&] { load_weights(path("lite.safetensors"), lora); });
  EXPECT_NE(msg.find("model.layers.0.self_attn.q_a_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("q_lora_rank = 0"), std::string::npos) << msg;
  write_weights(path("lora.safetensors"), lora, random_weights(lora));
  msg = usage_error_of([&] { load_weights(path("lora.safetensors"), lite); });
  EXPECT_NE(msg.find("no tensor layers.0.wq "), std::string::npos) << msg;
  EXPECT_NE(msg.find("q_lora_rank > 0"), std::string::npos) << msg;
}

TEST_F(Checkpoint, RejectsAFileWithNeitherNaming) {
  Tensor t = Tensor::zeros({2}, DType::f32, "t");
  write_safetensors(path("other.safetensors"), {{"encoder.weight", &t}});
  const std::string msg =
      usage_error_of([&] { load_weights(path("other.safetensors"), tiny(1, DType::f32)); });
  EXPECT_NE(msg.find("neither laga weights"), std::string::npos) << msg;
  EXPECT_NE(msg.find("encoder.weight"), std::string::npos) << msg;
}

// The attention alone's dump (attention_only) the same, without attn_norm or its gradient.
TEST_F(Checkpoint, DumpHoldsTheConfigAndEveryTensorInFp32) {
  for (bool alone : {false, true}) {
    SCOPED_TRACE(alone ? "attention only" : "whole block");
    MlaConfig c = tiny(2, DType::bf16);
    c.batch = 2, c.attention_only = alone;
    Weights w = random_weights(c, 5), g = random_weights(c, 6);
    const Shape act{c.seq_len, c.batch, c.hidden_size};
    std::map<std::string, Tensor> acts;
    for (const char* n : {"x", "dy", "y", "dx"}) {
      acts[n] = Tensor::empty(act, DType::bf16, n);
      fill_normal(acts[n], 9, n, 1.0);
    }
    const std::string dir = path(alone ? "dump/alone" : "dump/nested");
    write_dump(dir, c, acts["x"], acts["dy"], acts["y"], acts["dx"], w, g);

    std::ifstream config(dir + "/config.json");
    const auto j = nlohmann::json::parse(config);
    EXPECT_EQ(j, c.to_json());
    EXPECT_EQ(MlaConfig::from_json(j).to_json(), c.to_json());

    auto f = SafetensorsFile::open(dir + "/tensors.safetensors");
    EXPECT_EQ(f.metadata().at("dtype"), "bf16");
    for (const auto& n : f.names()) EXPECT_EQ(f.entry(n).dtype, "F32") << n;
    for (const auto& [n, t] : acts)
      EXPECT_EQ(f.load(n, DType::f32, "t").to_floats(), t.to_floats()) << n;
    size_t count = 4;
    w.for_each([&](const std::string& n, const Tensor& t) {
      EXPECT_EQ(f.load(n, DType::f32, "t").to_floats(), t.to_floats()) << n;
      ++count;
    });
    g.for_each([&](const std::string& n, const Tensor& t) {
      EXPECT_EQ(f.load(n + ".grad", DType::f32, "t").to_floats(), t.to_floats()) << n;
      ++count;
    });
    EXPECT_EQ(f.names().size(), count);
    const auto& names = f.names();
    EXPECT_EQ(std::count(names.begin(), names.end(), "layers.1.attn_norm"), alone ? 0 : 1);
    // And it loads back as the run's weights.
    expect_same_weights(load_weights(dir + "/tensors.safetensors", c), w);
  }
}

TEST_F(Checkpoint, DumpRejectsActivationsOfTheWrongShape) {
  const MlaConfig c = tiny(1, DType::f32);
  Weights w = random_weights(c);
  Tensor good = Tensor::zeros({c.seq_len, c.batch, c.hidden_size}, DType::f32, "a");
  Tensor flat = Tensor::zeros({c.seq_len * c.batch, c.hidden_size}, DType::f32, "a");
  const std::string msg =
      usage_error_of([&] { write_dump(path("d"), c, good, good, flat, good, w, w); });
  EXPECT_NE(msg.find("tensor y has shape [16, 64]; expected [16, 1, 64]"), std::string::npos)
      << msg;
}

TEST_F(Checkpoint, UnwritableDumpDirectoryIsAUsageErrorNamingIt) {
  std::ofstream(path("file")) << "x";
  const std::string beneath = path("file") + "/dump";
  std::string msg = usage_error_of([&] { check_writable_dir(beneath); });
  EXPECT_NE(msg.find(beneath), std::string::npos) << msg;
  msg = usage_error_of([&] { check_writable_dir(path("file")); });
  EXPECT_NE(msg.find("not a directory"), std::string::npos) << msg;
}

TEST_F(Checkpoint, CheckWritableDirCreatesItAndLeavesNoProbe) {
  const std::string dir = path("a/b/c");
  check_writable_dir(dir);
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_TRUE(fs::is_empty(dir));
  check_writable_dir(dir);  // existing is fine
}
