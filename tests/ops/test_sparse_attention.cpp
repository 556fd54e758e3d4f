// Sparse latent attention (src/ops/sparse_attention.cpp): forward, log-sum-exp and both gradients
// against the fp64 reference (reference/sparse_attention_ref.hpp) in fp32 and bf16, with
// tolerances from a measured baseline — the reference emulating a plain implementation in the
// same dtype (fp32 sums, P and dS rounded to the storage dtype, outputs rounded) on the same
// inputs; the full causal selection against laga's dense fused kernel over the same latent; the
// head probabilities in both modes; bitwise independence of the thread count; the memory of a
// meta run against a real one; the work record.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "laga/core/random.hpp"
#include "laga/core/work.hpp"
#include "laga/ops/sparse_attention.hpp"
#include "reference/sparse_attention_ref.hpp"
#include "testing.hpp"

using namespace laga;
using laga::testing::max_abs;
using laga::testing::max_abs_diff;

namespace {

struct Case {
  std::string name;
  int64_t Tq, Tk, q_pos0, B, H, Dqk, Dv, topk;  // topk 0: no idx (every earlier key)
  uint64_t seed = 11;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      // rows t < topk − q_pos0 − 1 select fewer than topk keys: −1 padded
      {"deepseek_576_512", 24, 40, 16, 2, 16, 576, 512, 24},
      {"odd_dims", 37, 37, 0, 2, 3, 24, 12, 13},
      // 300 candidates a row: three gathered tiles with the online softmax
      {"several_tiles", 12, 400, 388, 1, 8, 40, 24, 300},
      {"no_idx_several_tiles", 9, 300, 291, 2, 4, 24, 12, 0},
      {"no_idx_odd", 21, 21, 0, 1, 5, 17, 9, 0},
  };
  return c;
}

// idx [Tq, B, topk]: per row min(topk, q_pos0 + t + 1) distinct key rows ≤ q_pos0 + t in a random
// order, then −1.
std::vector<int32_t> random_selection(int64_t Tq, int64_t B, int64_t topk, int64_t q_pos0,
                                      uint64_t seed, bool ascending = false) {
  std::vector<int32_t> idx(size_t(Tq * B * topk), -1);
  for (int64_t t = 0; t < Tq; ++t)
    for (int64_t b = 0; b < B; ++b) {
      std::vector<int32_t> keys;
      for (int64_t s = 0; s <= q_pos0 + t; ++s) keys.push_back(int32_t(s));
      for (size_t i = keys.size(); i > 1; --i)  // Fisher–Yates
        std::swap(keys[i - 1],
                  keys[size_t(uniform01(seed, 3, uint64_t((t * B + b) * 100003 + i)) * double(i))]);
      const int64_t n = std::min<int64_t>(topk, int64_t(keys.size()));
      if (ascending) std::sort(keys.begin(), keys.begin() + n);
      for (int64_t j = 0; j < n; ++j) idx[size_t((t * B + b) * topk + j)] = keys[size_t(j)];
    }
  return idx;
}

struct SparseRun {
  Tensor q, kv, dout, o, dq, dkv;
  std::vector<int32_t> idx;
  SparseAttentionBwdParams p;
};

SparseRun setup(const Case& c, DType dt, DType dkv_dtype = DType::f32) {
  SparseRun r;
  r.q = laga::testing::random_tensor({c.Tq, c.B, c.H, c.Dqk}, dt, c.seed, "q");
  r.kv = laga::testing::random_tensor({c.Tk, c.B, c.Dqk}, dt, c.seed, "kv");
  r.dout = laga::testing::random_tensor({c.Tq, c.B, c.H, c.Dv}, dt, c.seed, "dout");
  r.o = Tensor::zeros({c.Tq, c.B, c.H, c.Dv}, dt, "o");
  r.dq = Tensor::zeros({c.Tq, c.B, c.H, c.Dqk}, dt, "dq");
  r.dkv = Tensor::zeros({c.Tk, c.B, c.Dqk}, dkv_dtype, "dkv");
  if (c.topk > 0) r.idx = random_selection(c.Tq, c.B, c.topk, c.q_pos0, c.seed);
  SparseAttentionBwdParams& p = r.p;
  p.B = c.B, p.Tq = c.Tq, p.Tk = c.Tk, p.q_pos0 = c.q_pos0, p.H = c.H, p.Dqk = c.Dqk, p.Dv = c.Dv;
  p.topk = c.topk, p.dtype = dt, p.scale = float(1.5 / std::sqrt(double(c.Dqk)));
  p.q = r.q.raw(), p.kv = r.kv.raw(), p.idx = c.topk > 0 ? r.idx.data() : nullptr, p.o = r.o.raw();
  p.dout = r.dout.raw(), p.dq = r.dq.raw(), p.dkv = r.dkv.raw(), p.dkv_dtype = dkv_dtype;
  return r;
}

ref::SparseSelection selection(const SparseRun& r) { return {r.p.idx, r.p.topk, r.p.q_pos0}; }

ref::Array lse_of(const AttentionSaved& s) { return ref::from_tensor(s.lse); }

// err(kernel) ≤ 4 · err(plain) + 1e-6 · max(1, max |ref|).
void expect_within(const ref::Array& got, const ref::Array& exact, const ref::Array& plain,
                   const std::string& what) {
  const double err = max_abs_diff(got, exact), base = max_abs_diff(plain, exact);
  EXPECT_TRUE(laga::testing::within_baseline(err, base, std::max(1.0, max_abs(exact)), 4.0, 1e-6))
      << what << ": error " << err << " vs plain-implementation error " << base;
}

void check_against_reference(DType dt, DType dkv_dtype) {
  for (const Case& c : cases()) {
    const std::string what =
        std::string(dtype_name(dt)) + " dkv " + std::string(dtype_name(dkv_dtype)) + " " + c.name;
    SparseRun r = setup(c, dt, dkv_dtype);
    const AttentionSaved saved = sparse_attention_forward(r.p);
    sparse_attention_backward(r.p, saved);
    const ref::Array q = ref::from_tensor(r.q), kv = ref::from_tensor(r.kv),
                     dout = ref::from_tensor(r.dout);
    const double scale = r.p.scale;
    const ref::SparseAttentionOut exact =
        ref::sparse_attention_forward(q, kv, c.Dv, selection(r), scale);
    const ref::SparseAttentionOut plain =
        ref::sparse_attention_forward(q, kv, c.Dv, selection(r), scale, dt);
    const ref::SparseAttentionGrads gexact =
        ref::sparse_attention_backward(q, kv, c.Dv, selection(r), dout, scale);
    const ref::SparseAttentionGrads gplain =
        ref::sparse_attention_backward(q, kv, c.Dv, selection(r), dout, scale, dt);
    expect_within(ref::from_tensor(r.o), exact.o, laga::testing::rounded(plain.o, dt), what + " o");
    // a row without keys: lse −inf in both; compared where finite
    ref::Array lse = lse_of(saved), lse_exact = exact.lse, lse_plain = plain.lse;
    for (int64_t i = 0; i < lse.numel(); ++i)
      if (std::isinf(lse_exact[i])) {
        EXPECT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << what << " lse " << i;
        lse[i] = lse_exact[i] = lse_plain[i] = 0;
      }
    expect_within(lse, lse_exact, laga::testing::rounded(lse_plain, DType::f32), what + " lse");
    expect_within(ref::from_tensor(r.dq), gexact.dq, laga::testing::rounded(gplain.dq, dt),
                  what + " dq");
    expect_within(ref::from_tensor(r.dkv), gexact.dkv,
                  laga::testing::rounded(gplain.dkv, dkv_dtype), what + " dkv");
  }
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), size_t(a.nbytes())) == 0;
}

// o, lse, dq, dkv and the head probabilities of every row, of one run.
std::vector<Tensor> outputs(const Case& c, DType dt) {
  SparseRun r = setup(c, dt);
  AttentionSaved saved = sparse_attention_forward(r.p);
  sparse_attention_backward(r.p, saved);
  Tensor probs = Tensor::zeros({c.Tq, c.B, c.topk > 0 ? c.topk : c.Tk}, DType::f32, "probs");
  attention_head_probs(r.p, saved.lse, 0, c.Tq, probs.data<float>());
  return {r.o, saved.lse, r.dq, r.dkv, probs};
}

}  // namespace

TEST(SparseAttention, MatchesReferenceFp32) { check_against_reference(DType::f32, DType::f32); }
TEST(SparseAttention, MatchesReferenceBf16) { check_against_reference(DType::bf16, DType::f32); }
TEST(SparseAttention, MatchesReferenceBf16WithBf16Dkv) {
  check_against_reference(DType::bf16, DType::bf16);
}

// With topk ≥ T and every key s ≤ t selected, sparse attention is the dense fused kernel's causal
// MQA attention over the latent (Hkv 1, K = kv, V = its first Dv columns read in place, the
// absorbed form's strides): the same o, lse and gradients, to within rounding.
TEST(SparseAttention, FullCausalSelectionMatchesDenseFusedAttention) {
  const int64_t T = 150, B = 2, H = 8, Dqk = 72, Dv = 64;
  for (DType dt : {DType::f32, DType::bf16})
    for (bool with_idx : {true, false}) {
      const std::string what = std::string(dtype_name(dt)) + (with_idx ? " idx" : " no idx");
      SparseRun r = setup({"full", T, T, 0, B, H, Dqk, Dv, with_idx ? T + 5 : 0}, dt);
      if (with_idx) {
        std::fill(r.idx.begin(), r.idx.end(), -1);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t b = 0; b < B; ++b)
            for (int64_t s = 0; s <= t; ++s) r.idx[size_t((t * B + b) * (T + 5) + s)] = int32_t(s);
      }
      const AttentionSaved saved = sparse_attention_forward(r.p);
      sparse_attention_backward(r.p, saved);

      Tensor o = Tensor::zeros({T, B, H, Dv}, dt, "o"),
             dq = Tensor::zeros({T, B, H, Dqk}, DType::f32, "dq");
      Tensor dk = Tensor::zeros({T, B, 1, Dqk}, DType::f32, "dk"),
             dv = Tensor::zeros({T, B, 1, Dv}, DType::f32, "dv");
      AttentionBwdParams p;
      p.B = B, p.T = T, p.Hq = H, p.Hkv = 1, p.Dqk = Dqk, p.Dv = Dv, p.dtype = dt;
      p.scale = r.p.scale;
      p.q = r.q.raw(), p.q_stride = dense_strides(B, H, Dqk);
      p.k = p.v = r.kv.raw(), p.k_stride = p.v_stride = AttentionStrides{B * Dqk, Dqk, 0};
      p.o = o.raw(), p.o_stride = dense_strides(B, H, Dv);
      p.dout = r.dout.raw(), p.dout_stride = dense_strides(B, H, Dv);
      p.dq = dq.raw(), p.dq_stride = dense_strides(B, H, Dqk);
      p.grads_f32 = true;  // dq, dk, dv in fp32 (the sparse kernel's dkv here is fp32)
      p.dk = dk.raw(), p.dk_stride = dense_strides(B, 1, Dqk);
      p.dv = dv.raw(), p.dv_stride = dense_strides(B, 1, Dv);
      const AttentionSaved dense = attention_forward(Kernel::fused, p);
      attention_backward(Kernel::fused, p, dense);

      ref::Array dkv = ref::from_tensor(dk);
      const ref::Array dvr = ref::from_tensor(dv);
      for (int64_t row = 0; row < T * B; ++row)
        for (int64_t e = 0; e < Dv; ++e) dkv[row * Dqk + e] += dvr[row * Dv + e];
      // fp32: summation orders; bf16: a rounding of the outputs, P and dS apart
      const double tol = dt == DType::f32 ? 2e-5 : 2e-2;
      auto near = [&](const ref::Array& a, const ref::Array& b, const char* name) {
        EXPECT_LE(max_abs_diff(a, b), tol * std::max(1.0, max_abs(b))) << what << " " << name;
      };
      near(ref::from_tensor(r.o), ref::from_tensor(o), "o");
      near(ref::from_tensor(saved.lse), ref::from_tensor(dense.lse), "lse");
      near(ref::from_tensor(r.dq), ref::from_tensor(dq), "dq");
      near(ref::from_tensor(r.dkv), dkv, "dkv");
    }
}

// Head probabilities against the reference's: with idx, from the sparse forward's lse; without,
// from the dense fused kernel's lse over the same q and kv (the warmup stage's pairing), and from
// the sparse kernel's own lse at q_pos0 > 0.
TEST(SparseAttention, HeadProbsMatchReferenceInBothModes) {
  for (DType dt : {DType::f32, DType::bf16})
    for (const Case& c : cases()) {
      const std::string what = std::string(dtype_name(dt)) + " " + c.name;
      SparseRun r = setup(c, dt);
      const AttentionSaved saved = sparse_attention_forward(r.p);
      const int64_t width = c.topk > 0 ? c.topk : c.Tk, t0 = c.Tq / 3, t1 = c.Tq;
      Tensor probs = Tensor::zeros({t1 - t0, c.B, width}, DType::f32, "probs");
      attention_head_probs(r.p, saved.lse, t0, t1, probs.data<float>());
      const ref::Array want = ref::sparse_head_probs(ref::from_tensor(r.q), ref::from_tensor(r.kv),
                                                     selection(r), r.p.scale, t0, t1);
      EXPECT_LE(max_abs_diff(ref::from_tensor(probs), want), 1e-5) << what;
    }
  for (DType dt : {DType::f32, DType::bf16}) {
    const int64_t T = 70, B = 2, H = 4, Dqk = 40, Dv = 32;
    SparseRun r = setup({"dense", T, T, 0, B, H, Dqk, Dv, 0}, dt);
    Tensor o = Tensor::zeros({T, B, H, Dv}, dt, "o");
    AttentionFwdParams p;
    p.B = B, p.T = T, p.Hq = H, p.Hkv = 1, p.Dqk = Dqk, p.Dv = Dv, p.dtype = dt,
    p.scale = r.p.scale;
    p.q = r.q.raw(), p.q_stride = dense_strides(B, H, Dqk);
    p.k = p.v = r.kv.raw(), p.k_stride = p.v_stride = AttentionStrides{B * Dqk, Dqk, 0};
    p.o = o.raw(), p.o_stride = dense_strides(B, H, Dv);
    const AttentionSaved dense = attention_forward(Kernel::fused, p);
    Tensor probs = Tensor::zeros({T - 5, B, T}, DType::f32, "probs");
    attention_head_probs(r.p, dense.lse, 5, T, probs.data<float>());
    const ref::Array want = ref::sparse_head_probs(ref::from_tensor(r.q), ref::from_tensor(r.kv),
                                                   selection(r), r.p.scale, 5, T);
    EXPECT_LE(max_abs_diff(ref::from_tensor(probs), want), 1e-5) << dtype_name(dt) << " dense";
  }
}

TEST(SparseAttention, IsBitwiseIndependentOfThreadCount) {
  const int keep = omp_get_max_threads();
  for (DType dt : {DType::f32, DType::bf16})
    for (const Case& c : cases()) {
      omp_set_num_threads(1);
      const auto one = outputs(c, dt);
      omp_set_num_threads(2);
      const auto two = outputs(c, dt);
      omp_set_num_threads(3);
      const auto three = outputs(c, dt);
      omp_set_num_threads(keep);
      for (size_t i = 0; i < one.size(); ++i) {
        EXPECT_TRUE(bitwise_equal(one[i], two[i]))
            << dtype_name(dt) << " " << c.name << " output " << i << ": 1 vs 2 threads";
        EXPECT_TRUE(bitwise_equal(one[i], three[i]))
            << dtype_name(dt) << " " << c.name << " output " << i << ": 1 vs 3 threads";
      }
    }
}

// The sparse forms run their rows in blocks: forward block by block gives the one call's o and lse
// rows, and backward block by block, each adding onto the fp32 dkv of the blocks before it
// (dkv_accumulate), gives the one call's dq and dkv, bit for bit.
TEST(SparseAttention, RowBlocksGiveTheOneCallsBits) {
  for (DType dt : {DType::f32, DType::bf16})
    for (const Case& c : cases()) {
      const std::string what = std::string(dtype_name(dt)) + " " + c.name;
      const std::vector<Tensor> whole = outputs(c, dt);  // o, lse, dq, dkv of one call
      const Tensor& lse = whole[1];
      SparseRun r = setup(c, dt);  // the same inputs, outputs zeroed
      const int64_t B = c.B, H = c.H, esz = dtype_size(dt);
      const int64_t cuts[] = {0, c.Tq / 3, c.Tq / 3 + 1, c.Tq};  // one block of a single row
      for (int i = 0; i < 3; ++i) {
        const int64_t t0 = cuts[i], n = cuts[i + 1] - t0;
        if (n == 0) continue;
        SparseAttentionBwdParams p = r.p;
        p.Tq = n, p.q_pos0 = c.q_pos0 + t0;
        auto shift = [&](const void* base, int64_t per_row) {
          return static_cast<const char*>(base) + t0 * B * per_row * esz;
        };
        p.q = shift(r.p.q, H * c.Dqk), p.o = const_cast<char*>(shift(r.p.o, H * c.Dv));
        p.dout = shift(r.p.dout, H * c.Dv), p.dq = const_cast<char*>(shift(r.p.dq, H * c.Dqk));
        if (p.idx) p.idx = r.p.idx + t0 * B * c.topk;
        p.dkv_accumulate = i > 0;
        const AttentionSaved block = sparse_attention_forward(p);
        for (int64_t b = 0; b < B; ++b)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t t = 0; t < n; ++t)
              ASSERT_EQ(block.lse.get((b * H + h) * n + t), lse.get((b * H + h) * c.Tq + t0 + t))
                  << what << " lse row " << t0 + t;
        sparse_attention_backward(p, block);
      }
      EXPECT_TRUE(bitwise_equal(r.o, whole[0])) << what << " o";
      EXPECT_TRUE(bitwise_equal(r.dq, whole[2])) << what << " dq";
      EXPECT_TRUE(bitwise_equal(r.dkv, whole[3])) << what << " dkv";
    }
}

// A run on a meta tracker allocates, tag by tag, what a real run does, and records the same work;
// every buffer is tagged attn.* and only the saved lse stays live.
TEST(SparseAttention, MetaRunAllocatesAndRecordsWhatARealRunDoes) {
  for (DType dt : {DType::f32, DType::bf16})
    for (const Case& c : cases()) {
      const std::string what = std::string(dtype_name(dt)) + " " + c.name;
      SparseRun r = setup(c, dt);
      std::map<std::string, int64_t> peak_by_tag[2];
      int64_t fwd_peak[2], bwd_peak[2], probs_peak[2];
      std::vector<WorkRecord> records[2];
      Tensor probs = Tensor::zeros({c.Tq, c.B, c.topk > 0 ? c.topk : c.Tk}, DType::f32, "probs");
      for (bool meta : {false, true}) {
        WorkLedger ledger;
        WorkScope work(ledger);
        MemoryTracker tracker(meta);
        TrackerScope scope(tracker);
        AttentionSaved saved = sparse_attention_forward(r.p);
        fwd_peak[meta] = tracker.peak_bytes();
        EXPECT_EQ(tracker.live_bytes(), 4 * c.B * c.H * c.Tq) << what << " meta " << meta;
        tracker.reset_peak();
        sparse_attention_backward(r.p, saved);
        bwd_peak[meta] = tracker.peak_bytes();
        peak_by_tag[meta] = tracker.peak_by_tag();
        tracker.reset_peak();
        attention_head_probs(r.p, saved.lse, 0, c.Tq, probs.data<float>());
        probs_peak[meta] = tracker.peak_bytes();
        EXPECT_EQ(tracker.live_bytes(), 4 * c.B * c.H * c.Tq) << what << " meta " << meta;
        for (const auto& [tag, bytes] : tracker.peak_by_tag())
          EXPECT_EQ(tag.rfind("attn.", 0), 0u) << what << " " << tag;
        records[meta] = ledger.records;
      }
      EXPECT_EQ(fwd_peak[0], fwd_peak[1]) << what;
      EXPECT_EQ(bwd_peak[0], bwd_peak[1]) << what;
      EXPECT_EQ(probs_peak[0], probs_peak[1]) << what;
      EXPECT_EQ(peak_by_tag[0], peak_by_tag[1]) << what;
      ASSERT_EQ(records[0].size(), 3u) << what;
      ASSERT_EQ(records[1].size(), 3u) << what;
      const double fwd = 2.0 * double(c.B * c.H * (c.Dqk + c.Dv)) * [&] {
        double pairs = 0;  // Σ_t |S_t|
        for (int64_t t = 0; t < c.Tq; ++t)
          pairs += double(c.topk > 0 ? std::min(c.topk, c.q_pos0 + t + 1) : c.q_pos0 + t + 1);
        return pairs;
      }();
      for (const auto& rec : records) {
        EXPECT_EQ(rec[0].cls, WorkClass::attention_forward) << what;
        EXPECT_EQ(rec[1].cls, WorkClass::attention_backward) << what;
        EXPECT_EQ(rec[2].cls, WorkClass::attention_forward) << what;
        for (const WorkRecord& w : rec) EXPECT_EQ(w.kernel, AttentionKernel::sparse) << what;
        EXPECT_DOUBLE_EQ(rec[0].flops, fwd) << what;
        EXPECT_DOUBLE_EQ(rec[1].flops, 2.5 * fwd) << what;
        EXPECT_DOUBLE_EQ(rec[2].flops, fwd * double(c.Dqk) / double(c.Dqk + c.Dv)) << what;
        EXPECT_EQ(rec[0].dims[0], c.Tq) << what;
        EXPECT_EQ(rec[0].dims[1], c.H) << what;
        EXPECT_EQ(rec[0].dims[2], 1) << what;
      }
      EXPECT_DOUBLE_EQ(sparse_attention_forward_flops(r.p), fwd) << what;
    }
}

TEST(SparseAttention, ChecksNameTheOffendingParameter) {
  SparseRun r = setup(cases()[1], DType::f32);
  SparseAttentionBwdParams p = r.p;
  p.Dv = p.Dqk + 1;
  EXPECT_THROW(sparse_attention_forward(p), Error);
  p = r.p, p.kv = nullptr;
  EXPECT_THROW(sparse_attention_forward(p), Error);
  p = r.p, p.idx = nullptr, p.q_pos0 = 1;  // rows need keys past Tk
  EXPECT_THROW(sparse_attention_forward(p), Error);
  p = r.p, p.dkv = nullptr;
  const AttentionSaved saved = sparse_attention_forward(r.p);
  EXPECT_THROW(sparse_attention_backward(p, saved), Error);
  SparseRun low = setup(cases()[1], DType::bf16, DType::bf16);  // sums kept in bf16 cannot grow
  p = low.p, p.dkv_accumulate = true;
  EXPECT_THROW(sparse_attention_backward(p, sparse_attention_forward(low.p)), Error);
}

// The backward's workspace is per-thread tiles (at most 16 slots, key ranges of at most 1024 rows:
// 16 · Tk / topk rounded up to 128), delta [B, H, Tq] and the sorted selection [Tq, B, topk]: the
// same at Tk 131072 and 1048576 (both past the cap), and far below one fp32 copy of dkv per row
// group (16 · Tk · Dqk · 4 bytes: 4.8 GB at Tk 131072). Planned on a meta tracker, which sizes what
// a real run allocates (the test above).
TEST(SparseAttention, BackwardWorkspaceDoesNotGrowWithKeyRows) {
  const int64_t Tq = 64, B = 1, H = 64, Dqk = 576, Dv = 512, topk = 2048, slots = 16, tile = 1024;
  int32_t never_read = 0;
  for (DType dt : {DType::f32, DType::bf16}) {
    int64_t peak[2];
    const int64_t Tks[2] = {131072, 1048576};
    for (int i = 0; i < 2; ++i) {
      MemoryTracker tracker(true);
      TrackerScope scope(tracker);
      SparseAttentionBwdParams p;
      p.B = B, p.Tq = Tq, p.Tk = Tks[i], p.q_pos0 = Tks[i] - Tq, p.H = H, p.Dqk = Dqk, p.Dv = Dv;
      p.topk = topk, p.dtype = dt, p.scale = 0.05f;
      p.q = p.kv = p.dout = &never_read;
      p.o = p.dq = p.dkv = &never_read;
      p.idx = &never_read;
      AttentionSaved saved;
      saved.lse = Tensor::empty({B, H, Tq}, DType::f32, "attn.lse");
      tracker.reset_peak();
      sparse_attention_backward(p, saved);
      peak[i] = tracker.peak_bytes();
    }
    EXPECT_EQ(peak[0], peak[1]) << dtype_name(dt);
    const int64_t per_slot = (3 * tile * Dqk + 4 * tile * H + 2 * H) * 4;
    const int64_t bound = slots * per_slot + 2 * B * H * Tq * 4 + Tq * B * (topk + 1) * 4;
    EXPECT_LE(peak[0], bound) << dtype_name(dt);
    EXPECT_LT(bound, slots * Tks[0] * Dqk * 4 / 8) << dtype_name(dt);
  }
}
