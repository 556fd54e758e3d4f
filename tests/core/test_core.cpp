// Core: errors, dtype rounding, the tracking allocator, tensors, configs and presets, counter-based
// random numbers.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "laga/mla/config.hpp"
#include "laga/core/random.hpp"
#include "laga/core/tensor.hpp"

using namespace laga;

TEST(Dtype, Bf16RoundsToNearestEven) {
  EXPECT_EQ(to_bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(to_float(to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(to_float(to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::nanf("")))));
}

TEST(Memory, TracksLivePeakAndTags) {
  MemoryTracker tracker;
  TrackerScope scope(tracker);
  {
    Tensor a = Tensor::empty({10, 4}, DType::f32, "a");
    Tensor b = Tensor::empty({3}, DType::bf16, "b");
    EXPECT_EQ(tracker.live_bytes(), 160 + 6);
    Tensor view = a.rows(2, 5);
    EXPECT_EQ(tracker.live_bytes(), 166);  // views allocate nothing
  }
  Tensor c = Tensor::empty({5}, DType::f32, "c");
  EXPECT_EQ(tracker.live_bytes(), 20);
  EXPECT_EQ(tracker.peak_bytes(), 166);
  auto at_peak = tracker.peak_by_tag();
  EXPECT_EQ(at_peak["a"], 160);
  EXPECT_EQ(at_peak["b"], 6);
  EXPECT_EQ(at_peak.count("c"), 0u);
}

// A tensor handed to another tracker moves its bytes there (live and peak, by tag), keeps its
// values and its views, and is released by the new tracker when the last view goes; a meta tensor
// cannot be handed to a real tracker.
TEST(Memory, HandOverMovesTheCountNotTheBytes) {
  MemoryTracker rank, outer;
  Tensor a, view;
  {
    TrackerScope scope(rank);
    a = Tensor::empty({10, 4}, DType::f32, "w");
    a.fill(3.0f);
    Tensor b = Tensor::empty({2}, DType::f32, "w");
    view = a.rows(1, 2);
    const void* data = a.raw();
    a.hand_over(outer);
    EXPECT_EQ(a.raw(), data);  // not copied
    EXPECT_EQ(rank.live_bytes(), 8);
    EXPECT_EQ(rank.live_by_tag().at("w"), 8);
    EXPECT_EQ(rank.peak_bytes(), 168);
    EXPECT_EQ(outer.live_bytes(), 160);
    EXPECT_EQ(outer.peak_by_tag().at("w"), 160);
    EXPECT_EQ(outer.allocations(), 0);  // handed over, not allocated
  }
  EXPECT_EQ(rank.live_bytes(), 0);
  EXPECT_EQ(view.get(0), 3.0f);
  a = Tensor();
  EXPECT_EQ(outer.live_bytes(), 160);  // the view still holds the storage
  view = Tensor();
  EXPECT_EQ(outer.live_bytes(), 0);
  EXPECT_TRUE(outer.live_by_tag().empty());
  MemoryTracker meta(true);
  TrackerScope scope(meta);
  Tensor m = Tensor::empty({4}, DType::f32, "m");
  EXPECT_THROW(m.hand_over(outer), Error);
}

// The caching allocator keeps a released large block and hands it to the next allocation of about
// its size (across trackers), while every tracker still counts the bytes requested; a small block
// and one much smaller than any cached block come from the OS.
TEST(Memory, CachingAllocatorReusesLargeBlocksAndTrackersCountRequestedBytes) {
  if (!pool_stats().enabled) GTEST_SKIP() << "LAGA_ALLOC_CACHE=off";
  pool_empty_cache();
  const int64_t n = 3 * kPoolMinBytes / 4 + 5;  // f32 elements: 3 MiB + 20 bytes
  void* first = nullptr;
  {
    MemoryTracker tracker;
    TrackerScope scope(tracker);
    Tensor a = Tensor::empty({n}, DType::f32, "a");
    first = a.raw();
    EXPECT_EQ(tracker.live_bytes(), n * 4);
  }
  const PoolStats released = pool_stats();
  EXPECT_GE(released.cached_bytes, n * 4);
  EXPECT_GE(released.reserved_bytes, released.cached_bytes);
  {
    MemoryTracker tracker;  // another tracker: the cache is the process's
    TrackerScope scope(tracker);
    Tensor b = Tensor::empty({n - 1000}, DType::f32, "b");  // a little smaller: the same block
    EXPECT_EQ(b.raw(), first);
    EXPECT_EQ(tracker.live_bytes(), (n - 1000) * 4);
    EXPECT_EQ(pool_stats().hits, released.hits + 1);
    EXPECT_EQ(pool_stats().cached_bytes, released.cached_bytes - (n * 4 + (int64_t(1) << 16) - 1) /
                                                                     (int64_t(1) << 16) *
                                                                     (int64_t(1) << 16));
    Tensor c = Tensor::empty({n / 2}, DType::f32, "c");  // half the size: not the cached block's
    EXPECT_NE(c.raw(), first);
    EXPECT_EQ(pool_stats().misses, released.misses + 1);
    // below kPoolMinBytes: malloc, not counted
    Tensor small = Tensor::empty({100}, DType::f32, "small");
    EXPECT_EQ(pool_stats().hits + pool_stats().misses, released.hits + released.misses + 2);
  }
  pool_empty_cache();
  EXPECT_EQ(pool_stats().cached_bytes, 0);
}

// The cache's bound: a step that allocates what an earlier one did is served from the cache in
// full, and a block the bound has no room for evicts the least recently released blocks first (not
// the largest, which a step would fault in again). Sizes in MiB; the bound is 3/2 × the peak in
// use.
TEST(Memory, CachingAllocatorKeepsAStepsBlocksAndEvictsTheLeastRecentlyReleased) {
  if (!pool_stats().enabled) GTEST_SKIP() << "LAGA_ALLOC_CACHE=off";
  static_assert(kPoolSlackNum == 3 && kPoolSlackDen == 2,
                "the sizes below assume a bound of 3/2 × the peak in use");
  const int64_t MiB = int64_t(1) << 20, cap = pool_stats().cap_bytes;
  pool_empty_cache();
  ASSERT_EQ(pool_stats().in_use_bytes, 0) << "a block from an earlier test is still in use";
  pool_set_cap(MiB);
  pool_reset_peaks();
  auto within_bound = [&] {
    const PoolStats s = pool_stats();
    EXPECT_LE(s.reserved_bytes, pool_bound(MiB, s.peak_in_use_bytes));
  };
  auto step = [&] {  // three blocks in use at once, released in the order they were taken
    const int64_t sizes[] = {2, 3, 5};
    void* p[3];
    for (int i = 0; i < 3; ++i) p[i] = pool_allocate(size_t(sizes[i] * MiB)), within_bound();
    for (int i = 0; i < 3; ++i) pool_release(p[i], size_t(sizes[i] * MiB));
  };
  const PoolStats s0 = pool_stats();
  step();
  EXPECT_EQ(pool_stats().misses, s0.misses + 3);
  EXPECT_EQ(pool_stats().peak_in_use_bytes, 10 * MiB);
  step();  // the same blocks again: all from the cache
  EXPECT_EQ(pool_stats().hits, s0.hits + 3);
  EXPECT_EQ(pool_stats().misses, s0.misses + 3);
  EXPECT_EQ(pool_stats().reserved_bytes, 10 * MiB);

  // 6 MiB fits no cached block; 10 + 6 > 15 = 3/2 × 10, so the 2 MiB block (released first) goes
  // back.
  void* six = pool_allocate(size_t(6 * MiB));
  within_bound();
  EXPECT_EQ(pool_stats().misses, s0.misses + 4);
  EXPECT_EQ(pool_stats().reserved_bytes, 14 * MiB);
  pool_release(six, size_t(6 * MiB));
  // 2 MiB again: its block is gone (a miss), and room for it evicts the 3 MiB block, now the
  // oldest.
  void* two = pool_allocate(size_t(2 * MiB));
  within_bound();
  EXPECT_EQ(pool_stats().misses, s0.misses + 5);
  EXPECT_EQ(pool_stats().reserved_bytes, 13 * MiB);  // 14 − 3 + 2
  // The largest blocks, 5 and 6 MiB, were kept.
  void* five = pool_allocate(size_t(5 * MiB));
  void* six_again = pool_allocate(size_t(6 * MiB));
  EXPECT_EQ(six_again, six);
  EXPECT_EQ(pool_stats().hits, s0.hits + 5);
  EXPECT_EQ(pool_stats().cached_bytes, 0);
  for (auto [p, m] : {std::pair{two, 2}, std::pair{five, 5}, std::pair{six_again, 6}})
    pool_release(p, size_t(m * MiB));
  pool_empty_cache();
  pool_set_cap(cap);
  EXPECT_EQ(pool_stats().reserved_bytes, 0);
}

// The VmFlags of the mapping of this process that holds address p (/proc/self/smaps), or "" when no
// mapping does or the file cannot be read.
static std::string vm_flags_at(const void* p) {
  std::ifstream f("/proc/self/smaps");
  const auto a = uintptr_t(p);
  bool inside = false;
  for (std::string line; std::getline(f, line);) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' '))
      inside = lo <= a && a < hi;
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

// A block of 2 MiB or more, taken from the OS by the cache, starts on a huge-page boundary and its
// mapping is advised MADV_HUGEPAGE (VmFlags "hg"); the path with the cache off
// (LAGA_ALLOC_CACHE=off) calls the same os_allocate. Whether the kernel then backs it with huge
// pages is its THP mode's business.
TEST(Memory, LargeBlocksStartOnAHugePageAndAreAdvisedForHugePages) {
  if (!huge_pages_enabled()) GTEST_SKIP() << "LAGA_HUGE_PAGES=off";
  pool_empty_cache();
  const size_t sizes[] = {size_t(kHugePageBytes), size_t(3 * kHugePageBytes + 4096 + 64)};
  for (size_t bytes : sizes) {
    void* p = pool_allocate(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(uintptr_t(p) % uintptr_t(kHugePageBytes), 0u) << bytes << " bytes at " << p;
    static_cast<char*>(p)[bytes - 1] = 1;  // touched, as a tensor's storage is
    if (transparent_huge_pages_mode() != "unknown") {
      const std::string flags = vm_flags_at(p);
      ASSERT_FALSE(flags.empty()) << "no mapping in /proc/self/smaps holds " << p;
      EXPECT_NE((flags + " ").find(" hg "), std::string::npos) << bytes << " bytes: " << flags;
    }
    pool_release(p, bytes);
  }
  pool_empty_cache();
}

TEST(Tensor, RowsViewSharesStorage) {
  MemoryTracker tracker;
  TrackerScope scope(tracker);
  Tensor a = Tensor::from_floats({3, 2}, DType::f32, {0, 1, 2, 3, 4, 5}, "a");
  Tensor r = a.rows(1, 3);
  EXPECT_EQ(r.shape(), (Shape{2, 2}));
  EXPECT_EQ(r.get(0), 2.0f);
  r.set(3, 9.0f);
  EXPECT_EQ(a.get(5), 9.0f);
}

// copy_from between dtypes converts each element as to_bf16 / to_float do (round to nearest even,
// NaN kept quiet), on the parallel path (≥ kParallelMin elements) and the serial one, views
// included.
TEST(Tensor, CopyFromConvertsEachElementAsTheScalarConversions) {
  for (int64_t n : {int64_t(37), 3 * kParallelMin + 5}) {
    std::vector<float> values(static_cast<size_t>(n), 0.0f);
    for (int64_t i = 0; i < n; ++i)
      values[size_t(i)] =
          std::ldexp(1.0f + float(i % 977) / 977.0f, int(i % 41) - 20) * (i % 2 ? -1 : 1);
    values[3] = std::nanf(""), values[5] = std::numeric_limits<float>::infinity(),
    values[7] = 0x1.00ffp0f;
    Tensor f = Tensor::from_floats({n}, DType::f32, values, "f");
    Tensor b = f.to(DType::bf16, "b");
    Tensor back = b.to(DType::f32, "back");
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t want = to_bf16(values[size_t(i)]).bits;
      ASSERT_EQ(static_cast<const bf16*>(b.raw())[i].bits, want) << "element " << i << " of " << n;
      const float got = back.get(i), expect = to_float(bf16{want});
      ASSERT_TRUE(got == expect || (std::isnan(got) && std::isnan(expect)))
          << "element " << i << " of " << n;
    }
  }
  Tensor a = Tensor::from_floats({3, 2}, DType::f32, {0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f}, "a");
  Tensor into = Tensor::zeros({2, 2}, DType::bf16, "into");
  into.copy_from(a.rows(1, 3));
  EXPECT_EQ(into.get(0), 2.5f);
  EXPECT_EQ(into.get(3), 5.5f);
}

TEST(Config, PresetsAreValid) {
  for (const auto& name : MlaConfig::preset_names())
    EXPECT_NO_THROW((void)Config(MlaConfig::preset(name))) << name;
}

TEST(Config, UnknownPresetNamesTheValidOnes) {
  try {
    MlaConfig::preset("deepseek-v4");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_status(), 2);
    EXPECT_NE(e.message().find("deepseek-v4"), std::string::npos);
    EXPECT_NE(e.message().find("deepseek-v3"), std::string::npos);
  }
}

TEST(Error, UsageErrorsReadAsTheMessageAloneOthersNameTheirSource) {
  // What a user reads on bad input is about the input; the raising file:line is for laga's
  // developers.
  const Error usage(ErrorKind::usage, "/x/src/mla/config.cpp", 12,
                    "--sp 3 does not divide 8; try 1, 2, 4, 8");
  EXPECT_STREQ(usage.what(), "--sp 3 does not divide 8; try 1, 2, 4, 8");
  const Error failure(ErrorKind::failure, "/x/src/comm/threads.cpp", 34, "rank 1 timed out");
  EXPECT_STREQ(failure.what(), "rank 1 timed out (src/comm/threads.cpp:34)");
  const Error internal(ErrorKind::internal, "/x/src/ops/matmul.cpp", 56, "broken");
  EXPECT_STREQ(internal.what(), "broken (src/ops/matmul.cpp:56)");
  EXPECT_STREQ(usage.file(), "src/mla/config.cpp");
  EXPECT_EQ(usage.line(), 12);
}

TEST(Config, ReportsEveryProblemAtOnce) {
  MlaConfig c = MlaConfig::preset("tiny");
  c.qk_rope_head_dim = 7;
  c.seq_len = 0;
  c.sp = 3;
  auto p = c.problems();
  EXPECT_EQ(p.size(), 3u);  // odd rope dim, T = 0, sp 3 does not divide H 8
  try {
    (void)Config(c);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("qk_rope_head_dim = 7"), std::string::npos);
    EXPECT_NE(e.message().find("seq_len"), std::string::npos);
    EXPECT_NE(e.message().find("--sp 3 does not divide num_attention_heads 8; try 1, 2, 4, 8"),
              std::string::npos);
  }
}

TEST(Config, SoftmaxScaleOfDeepSeekV3MatchesDesign) {
  // docs/design.md §1: mscale² / sqrt(192) with mscale = 0.1 ln 40 + 1.
  EXPECT_NEAR(MlaConfig::preset("deepseek-v3").softmax_scale(), 0.135234, 1e-6);
}

TEST(Config, JsonRoundTrips) {
  MlaConfig c = MlaConfig::preset("deepseek-v2-lite");
  c.seq_len = 128;
  c.sp = 4;
  MlaConfig d = MlaConfig::from_json(c.to_json());
  EXPECT_EQ(d.to_json(), c.to_json());
  EXPECT_EQ(d.q_lora_rank, 0);
}

// attention_only is laga's key: written by to_json, read back, false where a file lacks it (a
// Hugging Face config.json) and refused unless a JSON boolean.
TEST(Config, AttentionOnlyRoundTripsInJsonAndIsOffWithoutTheKey) {
  MlaConfig c = MlaConfig::preset("tiny");
  c.attention_only = true;
  const nlohmann::json j = c.to_json();
  EXPECT_EQ(j.at("attention_only"), true);
  EXPECT_TRUE(MlaConfig::from_json(j).attention_only);
  nlohmann::json hf = j;
  hf.erase("attention_only");
  EXPECT_FALSE(MlaConfig::from_json(hf).attention_only);
  hf["attention_only"] = 1;
  try {
    (void)MlaConfig::from_json(hf);
    FAIL() << "attention_only 1 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_status(), 2);
    EXPECT_NE(e.message().find("attention_only is 1, not true or false"), std::string::npos)
        << e.message();
  }
}

// A rank draws its shard of an input with fill_normal's offset; the shard must be bitwise the rows
// of the whole tensor drawn at once, whatever rank count and thread count drew it.
TEST(Random, AShardDrawnAtItsOffsetIsTheWholeTensorsRows) {
  const int64_t rows = 12, cols = 5, first = 4, count = 5;
  Tensor whole = Tensor::empty({rows, cols}, DType::f32, "whole");
  Tensor shard = Tensor::empty({count, cols}, DType::f32, "shard");
  fill_normal(whole, 9, "x", 1.0);
  fill_normal(shard, 9, "x", 1.0, 0.0, first * cols);
  for (int64_t i = 0; i < count * cols; ++i)
    EXPECT_EQ(shard.get(i), whole.get(first * cols + i)) << "element " << i;
}

// normal(seed, stream, index) is a standard normal variable, and changing any one of seed, stream
// or index gives an uncorrelated one: the weights, x and dy of a run are independent draws. Over n
// draws the sample mean, the variance, the share within one σ and every correlation must lie within
// 5 standard errors of N(0, 1)'s and of 0 (a false alarm has odds of about 1 in 10⁶ per statistic).
TEST(Random, NormalIsStandardAndUncorrelatedAcrossSeedStreamAndIndex) {
  const int n = 200000;
  const uint64_t stream = stream_id("x");
  std::vector<double> v(n), other_stream(n), other_seed(n), next_index(n);
  for (int i = 0; i < n; ++i) {
    v[size_t(i)] = normal(7, stream, uint64_t(i));
    other_stream[size_t(i)] = normal(7, stream_id("dy"), uint64_t(i));
    other_seed[size_t(i)] = normal(8, stream, uint64_t(i));
    next_index[size_t(i)] = normal(7, stream, uint64_t(i) + 1);
  }
  double mean = 0, var = 0, within = 0;
  for (double x : v) mean += x / n, within += std::abs(x) < 1 ? 1.0 / n : 0.0;
  for (double x : v) var += (x - mean) * (x - mean) / (n - 1);
  const double se = 1 / std::sqrt(double(n)), p1 = 0.682689492137086;  // P(|z| < 1)
  fmt::print(
      "[measured] normal over {} draws: mean {:.4f}, variance {:.4f}, within 1 sigma {:.4f} "
      "(standard error {:.4f})\n",
      n, mean, var, within, se);
  EXPECT_LT(std::abs(mean), 5 * se);
  EXPECT_LT(std::abs(var - 1), 5 * std::sqrt(2.0) * se);
  EXPECT_LT(std::abs(within - p1), 5 * std::sqrt(p1 * (1 - p1)) * se);
  auto correlation = [&](const std::vector<double>& w) {
    double sum = 0;
    for (size_t i = 0; i < v.size(); ++i) sum += v[i] * w[i];
    return sum / n;
  };
  for (const auto& [what, w] : {std::pair{"another stream", &other_stream},
                                {"another seed", &other_seed},
                                {"the next index", &next_index}}) {
    const double r = correlation(*w);
    fmt::print("[measured] correlation with {}: {:.4f}\n", what, r);
    EXPECT_LT(std::abs(r), 5 * se) << what;
  }
  // A pure function of its arguments: drawn again, in reverse order, the same bits.
  for (int i = n; i-- > 0;)
    ASSERT_EQ(normal(7, stream, uint64_t(i)), v[size_t(i)]) << "index " << i;
}
