// What fuzzing (fuzz/, scripts/fuzz.sh) and the review of its oracles found, each kept as a claim
// so it stays fixed: bad input gets a clear usage error, never a crash or a silent wrong number.
// The inputs themselves are replayed from fuzz/regressions/ by the fuzz.replay.* tests.
//
// Not here: the reader's and the CLI's ordinary bad-input cases (tests/io/test_safetensors.cpp,
// tests/cli/cli_bad_input.sh).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "laga/mla/config.hpp"
#include "laga/mla/form.hpp"
#include "laga/core/error.hpp"
#include "laga/core/tensor.hpp"
#include "laga/io/safetensors.hpp"

using namespace laga;

namespace {

// The usage error f throws (fails the test when it throws nothing or something else).
template <class F>
std::string usage_error(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::usage) << e.what();
    return e.message();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

nlohmann::json tiny_json() {
  MlaConfig c = MlaConfig::preset("tiny");
  return c.to_json();
}

}  // namespace

// Found by fuzz_safetensors on a seed: two zero-size tensors under one tag shared a tracker entry
// of 0 bytes, which the first release erased and the second could not find — an assert in a
// destructor, so std::terminate.
TEST(Memory, ZeroByteTensorsUnderOneTagReleaseInAnyOrder) {
  MemoryTracker tracker;
  TrackerScope scope(tracker);
  {
    Tensor a = Tensor::empty({0}, DType::f32, "t");
    Tensor b = Tensor::empty({3, 0}, DType::bf16, "t");
    Tensor c = Tensor::empty({4}, DType::f32, "t");
    Tensor d = Tensor::empty({0, 7}, DType::f32, "t");
    EXPECT_EQ(tracker.live_bytes(), 16);
    EXPECT_EQ(tracker.live_by_tag().at("t"), 16);
    c = Tensor();  // the non-empty one first, then the empty ones
  }
  EXPECT_EQ(tracker.live_bytes(), 0);
  EXPECT_TRUE(tracker.live_by_tag().empty());
  EXPECT_EQ(tracker.peak_bytes(), 16);
}

TEST(SafetensorsBadInput, LoadsZeroSizeTensorsUnderOneTag) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                             R"("b":{"dtype":"BF16","shape":[3,0],"data_offsets":[0,0]}})";
  std::string bytes(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  bytes += header;
  MemoryTracker tracker;
  TrackerScope scope(tracker);
  SafetensorsFile f = SafetensorsFile::from_bytes(bytes, "empty");
  {
    Tensor a = f.load("a", DType::f32, "load"), b = f.load("b", DType::f32, "load");
    EXPECT_EQ(b.shape(), (Shape{3, 0}));
  }
  EXPECT_EQ(tracker.live_bytes(), 0);
}

// Found by fuzz_config: a float where an integer belongs was cast to int64 — truncated (64.5 -> 64)
// or, out of range (2e71), undefined behaviour.
TEST(Config, RejectsAFloatOrAnOutOfRangeNumberWhereAnIntegerBelongs) {
  for (const char* text : {"64.5", "64.0", "2e71", "18446744073709551615", "9223372036854775808"}) {
    nlohmann::json j = tiny_json();
    j["hidden_size"] = nlohmann::json::parse(text);
    const std::string m = usage_error([&] { (void)Config(MlaConfig::from_json(j)); });
    EXPECT_NE(m.find("hidden_size"), std::string::npos) << text << ": " << m;
    EXPECT_NE(m.find("not an integer"), std::string::npos) << text << ": " << m;
  }
  nlohmann::json j = tiny_json();
  j["rope_scaling"]["original_max_position_embeddings"] = 4096.5;
  EXPECT_NE(usage_error([&] {
              (void)Config(MlaConfig::from_json(j));
            }).find("original_max_position_embeddings"),
            std::string::npos);
  j = tiny_json();
  j["num_layers"] = 1e300;
  EXPECT_NE(usage_error([&] { (void)Config(MlaConfig::from_json(j)); }).find("num_layers"),
            std::string::npos);
}

// Found reviewing fuzz_config's oracle (finite, positive derived quantities): a RoPE scaling that
// validated but made the softmax scale inf, or the attention factor negative — silent infs and
// NaNs.
TEST(Config, RejectsRopeScalingThatMakesTheSoftmaxScaleOrAttentionFactorUnusable) {
  nlohmann::json j = tiny_json();
  j["rope_scaling"]["mscale_all_dim"] = 1e300;
  EXPECT_NE(usage_error([&] { (void)Config(MlaConfig::from_json(j)); }).find("softmax scale"),
            std::string::npos);
  j = tiny_json();
  j["rope_scaling"]["mscale"] = -1e300;
  EXPECT_NE(
      usage_error([&] { (void)Config(MlaConfig::from_json(j)); }).find("RoPE attention factor"),
      std::string::npos);
  MlaConfig c = MlaConfig::preset("tiny");
  c.rope_theta = std::numeric_limits<double>::infinity();
  EXPECT_NE(usage_error([&] { (void)Config(c); }).find("rope_theta = inf must be a finite number"),
            std::string::npos);
  c = MlaConfig::preset("tiny");
  c.rope_scaling.beta_fast = std::nan("");
  EXPECT_NE(usage_error([&] { (void)Config(c); }).find("beta_fast"), std::string::npos);
}

// Found reviewing fuzz_config's oracle: a dimension of 2^62 validated, then rope_inv_freq asked for
// a vector of 2^61 doubles (std::length_error: exit 3), and element counts overflowed int64.
TEST(Config, RejectsSizesThatCannotBeAddressed) {
  MlaConfig c = MlaConfig::preset("tiny");
  c.qk_rope_head_dim = int64_t(1) << 62;
  EXPECT_NE(
      usage_error([&] { (void)Config(c); }).find("qk_rope_head_dim = 4611686018427387904 exceeds"),
      std::string::npos);
  c = MlaConfig::preset("tiny");
  c.seq_len = int64_t(1) << 40;
  EXPECT_NE(usage_error([&] { (void)Config(c); }).find("too large to address"), std::string::npos);
  c = MlaConfig::preset("deepseek-v3");
  c.num_layers = int64_t(1) << 40;
  EXPECT_NE(usage_error([&] { (void)Config(c); }).find("over all layers"), std::string::npos);
}

// Found by fuzz_config
// (fuzz/regressions/config/odd_rope_dim_at_int64_max_overflows_the_suggestion.json): an odd
// qk_rope_head_dim of INT64_MAX made the "try" suggestion overflow (dim + 1).
TEST(Config, OddRopeDimAtTheInt64LimitSuggestsAnEvenDimensionInRange) {
  MlaConfig c = MlaConfig::preset("tiny");
  c.qk_rope_head_dim = INT64_MAX;
  const std::string m = usage_error([&] { (void)Config(c); });
  EXPECT_NE(
      m.find(
          "qk_rope_head_dim = 9223372036854775807 must be even (RoPE rotates pairs); try 1048576"),
      std::string::npos)
      << m;
  c.qk_rope_head_dim = 63;
  EXPECT_NE(usage_error([&] { (void)Config(c); }).find("try 64"), std::string::npos);
}

// The new limits leave every real configuration alone: each preset at long sequences, every P that
// divides its heads, and many layers.
TEST(Config, PresetsStillValidateAtLongSequencesAndManyLayers) {
  for (const auto& name : MlaConfig::preset_names()) {
    MlaConfig c = MlaConfig::preset(name);
    c.seq_len = int64_t(1) << 20, c.batch = 4, c.num_layers = 61;
    for (int64_t P = 1; P <= c.num_attention_heads; P *= 2) {
      c.sp = P;
      EXPECT_TRUE(c.problems().empty()) << name << " P " << P << ": " << c.problems().front();
    }
  }
}

// Found by fuzz_cli (a timeout): `laga run --seq 13333333333333333 --sp 4` searched every number up
// to the sequence length for divisors to suggest — a hang of years. The suggestion now comes at
// once.
TEST(Config, SuggestsDivisorsOfAHugeSequenceWithoutSearchingToIt) {
  MlaConfig c = MlaConfig::preset("tiny");
  c.seq_len = 13333333333333333, c.sp = 4;
  const std::string m = usage_error([&] { (void)Config(c); });
  EXPECT_NE(
      m.find(
          "--sp 4 does not divide --seq 13333333333333333; try 1, 89, 1447, 1553, 128783, 138217, "
          "13333333333333333"),
      std::string::npos)
      << m;
  EXPECT_EQ(divisors_str(18), "1, 2, 3, 6, 9, 18");
  EXPECT_EQ(divisors_str(int64_t(1) << 62), "1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048");
}

// fuzz_config found problems() searching every d < --sp for the --ulysses values to suggest: a hang
// at
// --sp 10^15. A valid value divides the heads, so the search stops there; and the zigzag's 2·R may
// exceed int64 (R = --sp 2^62) without overflowing anything.
TEST(Config, SuggestsUlyssesValuesAndZigzagLengthsForAHugeSp) {
  MlaConfig c = MlaConfig::preset("tiny");  // 8 heads
  c.form = "laga", c.sp = 1000000000000000, c.seq_len = 2 * c.sp;
  std::string m = usage_error([&] { (void)Config(c); });
  EXPECT_NE(m.find("--sp 1000000000000000 does not divide num_attention_heads 8; try 1, 2, 4, 8, "
                   "or --ulysses 1, 2, 4, 8"),
            std::string::npos)
      << m;
  c.form = "ring-kv", c.sp = c.seq_len = int64_t(1) << 62;
  m = usage_error([&] { (void)Config(c); });
  EXPECT_NE(m.find("--seq 4611686018427387904 is not a multiple of 2 × --sp 4611686018427387904 = "
                   "9223372036854775808 "
                   "(ring-kv's zigzag layout gives every rank two chunks of T/(2P) tokens); try "
                   "--seq 9223372036854775808"),
            std::string::npos)
      << m;
}

// The rule of the commands that run every form (forms_at): a form's own condition makes it "not
// run"; a problem apart from any form, or a config no form can run, is a usage error.
TEST(Config, FormsAtReportsEachRefusingFormAndRefusesWhatNoFormCanRun) {
  MlaConfig c = MlaConfig::preset("tiny");  // H 8
  c.seq_len = 64, c.sp = 16;
  const FormsAt at = forms_at(c);
  std::vector<std::string> runnable;
  for (const Form* f : at.runnable) runnable.emplace_back(f->name());
  // laga-ulysses at its default Pu, 8: a ring of 2 groups; the sparse forms keep their queries
  EXPECT_EQ(runnable, (std::vector<std::string>{"ring-kv", "ring-latent", "laga-ulysses",
                                                "dsa-gather", "dsa-regather"}));
  EXPECT_EQ(at.refused.size(), registered_forms().size() - 5);
  EXPECT_NE(at.refusal(find_form("laga"))
                .find("--sp 16 does not divide num_attention_heads 8; try 1, 2, 4, 8"),
            std::string::npos);
  EXPECT_EQ(at.refusal(find_form("ring-kv")), "");
  c.seq_len = 36, c.sp = 4;  // every head-scatter form runs; the zigzag needs 8 | T
  const FormsAt at4 = forms_at(c);
  EXPECT_NE(at4.refusal(find_form("ring-latent")).find("--seq 36 is not a multiple of 2 × --sp 4"),
            std::string::npos);
  EXPECT_EQ(at4.refusal(find_form("explicit")), "");
  c.seq_len = 36, c.sp = 8;  // apart from any form: P ∤ T
  EXPECT_NE(usage_error([&] { (void)forms_at(c); }).find("--sp 8 does not divide --seq 36"),
            std::string::npos);
  // P ∤ H for the head-scatter forms, 2P ∤ T for the rings and for laga-ulysses (Pu 1 at odd P),
  // and a model without an indexer for the sparse forms
  c.seq_len = 9, c.sp = 3;
  c.index_n_heads = c.index_head_dim = c.index_topk = 0;
  const std::string m = usage_error([&] { (void)forms_at(c); });
  EXPECT_NE(m.find("no form can run it"), std::string::npos) << m;
  EXPECT_NE(
      m.find("dsa-gather: form dsa-gather runs DeepSeek Sparse Attention's lightning indexer"),
      std::string::npos)
      << m;
  EXPECT_NE(m.find("ring-kv: --seq 9 is not a multiple of 2 × --sp 3"), std::string::npos) << m;
  EXPECT_NE(m.find("laga-ulysses: --seq 9 is not a multiple of 2 × (--sp 3 / --ulysses 1) = 6"),
            std::string::npos)
      << m;
}
