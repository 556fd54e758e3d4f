// Attention kernels (eager and fused): forward and every gradient against the fp64 reference, with
// tolerances from a measured baseline — a plain float implementation on the same dtype-rounded
// inputs, rounding what a plain bf16 implementation stores (P, dS and the outputs) — plus the
// memory claims (fused never allocates T×T; both allocate exactly their published plan, and each
// plan matches closed forms written out here), determinism, and the boundary checks. Guard values
// (NaN) fill every stride pad of every buffer: a kernel that reads a pad poisons its result, one
// that writes a pad is caught.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "laga/ops/attention.hpp"
#include "reference/attention_ref.hpp"
#include "testing.hpp"

using namespace laga;
using laga::testing::max_abs;
using laga::testing::max_abs_diff;

namespace {

struct Case {
  std::string name;
  int64_t T, B, Hq, Hkv, Dqk, Dv;
  bool causal = true;
  int64_t pad = 0;  // extra elements after every head row of every tensor (guard values)
  // v = the first Dv columns of k's rows (the absorbed form's V inside the latent)
  bool latent_v = false;
  bool one_pass = false;  // the fused kernel's one-pass backward (one_pass_backward)
  uint64_t seed = 11;     // of the random inputs
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"one_token", 1, 1, 1, 1, 24, 12},
      {"odd_T_batch2", 37, 2, 2, 2, 24, 12},
      {"grouped_multi_tile", 300, 1, 4, 2, 24, 12},
      {"mqa_16_heads", 150, 2, 16, 1, 24, 12},
      {"long_one_head", 520, 1, 1, 1, 24, 12},
      {"deepseek_192_128", 130, 1, 2, 2, 192, 128},
      {"absorbed_576_512_latent_v", 40, 2, 4, 1, 576, 512, true, 0, true},
      {"non_causal", 70, 1, 2, 1, 24, 12, false},
      {"padded_strides", 65, 2, 4, 2, 24, 12, true, 3},
      // the one-pass backward (the cases above take two passes)
      {"one_pass_grouped_multi_tile", 300, 2, 4, 2, 24, 12, true, 0, false, true},
      {"one_pass_padded_non_causal", 70, 1, 4, 4, 24, 12, false, 2, false, true},
      {"one_pass_mqa_576_512_latent_v", 300, 1, 8, 1, 576, 512, true, 0, true, true},
      // B·Hkv = 2 tasks: the one pass splits each group of 6 heads in 2 sub-groups of 3
      {"one_pass_split_padded_non_causal", 77, 2, 6, 1, 24, 12, false, 2, false, true},
  };
  return c;
}

// A [T, B, H, D] tensor living inside a [T, B, H, D + pad] buffer; pads hold NaN.
struct Strided {
  Tensor buf;
  int64_t T = 0, B = 0, H = 0, D = 0, pad = 0;
  AttentionStrides strides() const { return {B * H * (D + pad), H * (D + pad), D + pad}; }
  int64_t index(int64_t t, int64_t b, int64_t h, int64_t d) const {
    return ((t * B + b) * H + h) * (D + pad) + d;
  }
  ref::Array values() const {  // [T, B, H, D] as stored
    ref::Array a({T, B, H, D});
    for (int64_t i = 0; i < a.numel(); ++i) a[i] = buf.get(i / D * (D + pad) + i % D);
    return a;
  }
  bool pads_hold_nan() const {
    for (int64_t row = 0; row < T * B * H; ++row)
      for (int64_t d = D; d < D + pad; ++d)
        if (!std::isnan(buf.get(row * (D + pad) + d))) return false;
    return true;
  }
};

Strided make(int64_t T, int64_t B, int64_t H, int64_t D, int64_t pad, DType dt, const char* name,
             bool random, uint64_t seed = 11) {
  Strided s{Tensor::empty({T, B, H, D + pad}, dt, name), T, B, H, D, pad};
  for (int64_t i = 0; i < s.buf.numel(); ++i)
    s.buf.set(
        i, random && i % (D + pad) < D ? float(normal(seed, stream_id(name), uint64_t(i))) : NAN);
  return s;
}

struct AttnRun {
  Strided q, k, v, dout, o, dq, dk, dv;
  AttentionBwdParams p;
};

AttnRun setup(const Case& c, DType dt) {
  AttnRun r;
  r.q = make(c.T, c.B, c.Hq, c.Dqk, c.pad, dt, "q", true, c.seed);
  r.k = make(c.T, c.B, c.Hkv, c.Dqk, c.pad, dt, "k", true, c.seed);
  r.v = c.latent_v ? r.k : make(c.T, c.B, c.Hkv, c.Dv, c.pad, dt, "v", true, c.seed);
  if (c.latent_v) r.v.D = c.Dv, r.v.pad = c.Dqk + c.pad - c.Dv;
  r.dout = make(c.T, c.B, c.Hq, c.Dv, c.pad, dt, "dout", true, c.seed);
  r.o = make(c.T, c.B, c.Hq, c.Dv, c.pad, dt, "o", false);
  r.dq = make(c.T, c.B, c.Hq, c.Dqk, c.pad, dt, "dq", false);
  r.dk = make(c.T, c.B, c.Hkv, c.Dqk, c.pad, dt, "dk", false);
  r.dv = make(c.T, c.B, c.Hkv, c.Dv, c.pad, dt, "dv", false);
  AttentionBwdParams& p = r.p;
  p.B = c.B, p.T = c.T, p.Hq = c.Hq, p.Hkv = c.Hkv, p.Dqk = c.Dqk, p.Dv = c.Dv, p.dtype = dt;
  p.scale = float(1.5 / std::sqrt(double(c.Dqk))), p.causal = c.causal,
  p.one_pass_backward = c.one_pass;
  p.q = r.q.buf.raw(), p.q_stride = r.q.strides();
  p.k = r.k.buf.raw(), p.k_stride = r.k.strides();
  p.v = r.v.buf.raw(), p.v_stride = r.v.strides();
  p.o = r.o.buf.raw(), p.o_stride = r.o.strides();
  p.dout = r.dout.buf.raw(), p.dout_stride = r.dout.strides();
  p.dq = r.dq.buf.raw(), p.dq_stride = r.dq.strides();
  p.dk = r.dk.buf.raw(), p.dk_stride = r.dk.strides();
  p.dv = r.dv.buf.raw(), p.dv_stride = r.dv.strides();
  return r;
}

struct Results {
  ref::Array o, dq, dk, dv;
};

Results run_kernel(Kernel kernel, AttnRun& r) {
  if (kernel == Kernel::eager) r.p.one_pass_backward = false;  // the fused kernel's order only
  AttentionSaved saved = attention_forward(kernel, r.p);
  attention_backward(kernel, r.p, saved);
  return {r.o.values(), r.dq.values(), r.dk.values(), r.dv.values()};
}

// The baseline: attention written plainly in float on the stored inputs, rounding to dt what a
// plain implementation in dt stores (P before P·V, P and dS before the backward products, the
// outputs).
Results plain_float(const AttnRun& r, DType dt) {
  const AttentionBwdParams& p = r.p;
  const ref::Array q = r.q.values(), k = r.k.values(), v = r.v.values(), dout = r.dout.values();
  Results out{ref::Array({p.T, p.B, p.Hq, p.Dv}), ref::Array(q.shape), ref::Array(k.shape),
              ref::Array(v.shape)};
  std::vector<float> dq(size_t(q.numel())), dk(size_t(k.numel())), dv(size_t(v.numel())),
      pr(size_t(p.T));
  const int64_t g = p.Hq / p.Hkv;
  auto qi = [&](int64_t t, int64_t b, int64_t h) { return ((t * p.B + b) * p.Hq + h); };
  auto ki = [&](int64_t t, int64_t b, int64_t h) { return ((t * p.B + b) * p.Hkv + h); };
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.Hq; ++h)
      for (int64_t t = 0; t < p.T; ++t) {
        const int64_t n = p.causal ? t + 1 : p.T, hk = h / g;
        float mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          float s = 0;
          for (int64_t d = 0; d < p.Dqk; ++d)
            s += float(q[qi(t, b, h) * p.Dqk + d]) * float(k[ki(j, b, hk) * p.Dqk + d]);
          mx = std::max(mx, pr[size_t(j)] = p.scale * s);
        }
        for (int64_t j = 0; j < n; ++j) sum += pr[size_t(j)] = std::exp(pr[size_t(j)] - mx);
        for (int64_t j = 0; j < n; ++j) pr[size_t(j)] /= sum;
        float delta = 0;
        std::vector<float> dp(static_cast<size_t>(n));
        for (int64_t d = 0; d < p.Dv; ++d) {
          float o = 0;
          for (int64_t j = 0; j < n; ++j)
            o += round_to(dt, pr[size_t(j)]) * float(v[ki(j, b, hk) * p.Dv + d]);
          out.o[qi(t, b, h) * p.Dv + d] = round_to(dt, o);
        }
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t d = 0; d < p.Dv; ++d)
            dp[size_t(j)] +=
                float(dout[qi(t, b, h) * p.Dv + d]) * float(v[ki(j, b, hk) * p.Dv + d]);
          delta += pr[size_t(j)] * dp[size_t(j)];
        }
        for (int64_t j = 0; j < n; ++j) {
          const float ds = round_to(dt, pr[size_t(j)] * (dp[size_t(j)] - delta)),
                      pj = round_to(dt, pr[size_t(j)]);
          for (int64_t d = 0; d < p.Dqk; ++d) {
            dq[size_t(qi(t, b, h) * p.Dqk + d)] +=
                p.scale * ds * float(k[ki(j, b, hk) * p.Dqk + d]);
            dk[size_t(ki(j, b, hk) * p.Dqk + d)] +=
                p.scale * ds * float(q[qi(t, b, h) * p.Dqk + d]);
          }
          for (int64_t d = 0; d < p.Dv; ++d)
            dv[size_t(ki(j, b, hk) * p.Dv + d)] += pj * float(dout[qi(t, b, h) * p.Dv + d]);
        }
      }
  for (int64_t i = 0; i < q.numel(); ++i) out.dq[i] = round_to(dt, dq[size_t(i)]);
  for (int64_t i = 0; i < k.numel(); ++i) out.dk[i] = round_to(dt, dk[size_t(i)]);
  for (int64_t i = 0; i < v.numel(); ++i) out.dv[i] = round_to(dt, dv[size_t(i)]);
  return out;
}

// The fp64 reference and the baseline of one case, computed once per dtype and shared by the tests.
struct Expected {
  Results ref, plain;
};
const Expected& expected(const Case& c, DType dt) {
  static std::map<std::pair<std::string, int>, Expected> cache;
  auto key = std::make_pair(c.name, int(dt));
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  AttnRun r = setup(c, dt);
  const ref::Array q = r.q.values(), k = r.k.values(), v = r.v.values(), dout = r.dout.values();
  Expected e;
  e.ref.o = ref::attention_forward(q, k, v, r.p.scale, c.causal);
  ref::AttentionGrads g = ref::attention_backward(q, k, v, dout, r.p.scale, c.causal);
  e.ref.dq = g.dq, e.ref.dk = g.dk, e.ref.dv = g.dv;
  e.plain = plain_float(r, dt);
  return cache.emplace(key, std::move(e)).first->second;
}

// err(kernel) ≤ 4 · err(plain) + 1e-6 · max(1, max |ref|), tensor by tensor.
void expect_within_baseline(const Results& got, const Expected& e, const std::string& what) {
  auto one = [&](const ref::Array& x, const ref::Array& ref, const ref::Array& plain,
                 const char* name) {
    const double err = max_abs_diff(x, ref), base = max_abs_diff(plain, ref);
    EXPECT_TRUE(laga::testing::within_baseline(err, base, std::max(1.0, max_abs(ref)), 4.0, 1e-6))
        << what << " " << name << ": error " << err << " vs plain-implementation error " << base;
  };
  one(got.o, e.ref.o, e.plain.o, "o");
  one(got.dq, e.ref.dq, e.plain.dq, "dq");
  one(got.dk, e.ref.dk, e.plain.dk, "dk");
  one(got.dv, e.ref.dv, e.plain.dv, "dv");
}

void check_against_reference(Kernel kernel, DType dt) {
  MemoryTracker tracker;
  TrackerScope scope(tracker);
  for (const Case& c : cases()) {
    const std::string what =
        std::string(kernel_name(kernel)) + " " + std::string(dtype_name(dt)) + " " + c.name;
    AttnRun r = setup(c, dt);
    const Results got = run_kernel(kernel, r);
    expect_within_baseline(got, expected(c, dt), what);
    for (const Strided* s : {&r.o, &r.dq, &r.dk, &r.dv})
      EXPECT_TRUE(s->pads_hold_nan()) << what << ": wrote a pad";
  }
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), size_t(a.nbytes())) == 0;
}

// Outputs of one forward+backward: o, dq, dk, dv buffers and the saved tensor.
std::vector<Tensor> outputs(Kernel kernel, const Case& c, DType dt) {
  AttnRun r = setup(c, dt);
  r.p.one_pass_backward = c.one_pass && kernel == Kernel::fused;
  AttentionSaved saved = attention_forward(kernel, r.p);
  attention_backward(kernel, r.p, saved);
  return {r.o.buf, r.dq.buf, r.dk.buf, r.dv.buf, kernel == Kernel::eager ? saved.probs : saved.lse};
}

void expect_bitwise(const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                    const std::string& what) {
  // NaN guards compare equal bitwise too, so whole buffers are compared.
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(bitwise_equal(a[i], b[i])) << what << " output " << i;
}

}  // namespace

TEST(Attention, FusedMatchesReferenceFp32) { check_against_reference(Kernel::fused, DType::f32); }
TEST(Attention, FusedMatchesReferenceBf16) { check_against_reference(Kernel::fused, DType::bf16); }
TEST(Attention, EagerMatchesReferenceFp32) { check_against_reference(Kernel::eager, DType::f32); }
TEST(Attention, EagerMatchesReferenceBf16) { check_against_reference(Kernel::eager, DType::bf16); }

TEST(Attention, EagerAndFusedAgree) {
  for (DType dt : {DType::f32, DType::bf16})
    for (const Case& c : cases()) {
      AttnRun re = setup(c, dt), rf = setup(c, dt);
      const Results e = run_kernel(Kernel::eager, re), f = run_kernel(Kernel::fused, rf);
      const Expected& x = expected(c, dt);
      auto one = [&](const ref::Array& a, const ref::Array& b, const ref::Array& ref,
                     const ref::Array& plain, const char* name) {
        // Each is within 4× the baseline of the reference, so they are within 8× of each other.
        const double diff = max_abs_diff(a, b), base = max_abs_diff(plain, ref);
        EXPECT_TRUE(
            laga::testing::within_baseline(diff, base, std::max(1.0, max_abs(ref)), 8.0, 2e-6))
            << dtype_name(dt) << " " << c.name << " " << name << ": eager and fused differ by "
            << diff;
      };
      one(e.o, f.o, x.ref.o, x.plain.o, "o");
      one(e.dq, f.dq, x.ref.dq, x.plain.dq, "dq");
      one(e.dk, f.dk, x.ref.dk, x.plain.dk, "dk");
      one(e.dv, f.dv, x.ref.dv, x.plain.dv, "dv");
    }
}

TEST(Attention, FusedIsBitwiseDeterministic) {
  for (DType dt : {DType::f32, DType::bf16})
    for (const Case& c : {cases()[2], cases()[3], cases()[9]})
      expect_bitwise(outputs(Kernel::fused, c, dt), outputs(Kernel::fused, c, dt), c.name);
}

TEST(Attention, FusedIsIndependentOfThreadCount) {
  const int keep = omp_get_max_threads();
  for (DType dt : {DType::f32, DType::bf16})
    for (const Case& c : {cases()[0], cases()[2], cases()[3], cases()[4], cases()[6], cases()[9],
                          cases()[10], cases()[11], cases()[12]}) {
      omp_set_num_threads(1);
      const auto one = outputs(Kernel::fused, c, dt);
      omp_set_num_threads(3);
      const auto three = outputs(Kernel::fused, c, dt);
      omp_set_num_threads(keep);
      expect_bitwise(one, three, c.name + " 1 vs 3 threads");
    }
}

TEST(Attention, EagerIsBitwiseDeterministic) {
  for (DType dt : {DType::f32, DType::bf16})
    expect_bitwise(outputs(Kernel::eager, cases()[2], dt), outputs(Kernel::eager, cases()[2], dt),
                   "eager");
}

// The kernels allocate their buffers through a walker of attention_memory_events, so the plan's
// sizes are the buffers' by construction; what the tracker can still catch is any allocation beside
// the plan (a tracked Tensor the kernel makes on its own), a tag outside attn., or a buffer left
// live. The sizes themselves are checked against closed forms by EagerPlanMatchesItsClosedForms and
// FusedPlanMatchesItsClosedForms.
TEST(Attention, AllocatesExactlyItsMemoryPlan) {
  for (Kernel kernel : {Kernel::eager, Kernel::fused})
    for (DType dt : {DType::f32, DType::bf16})
      for (const Case& c :
           {cases()[2], cases()[3], cases()[5], cases()[9], cases()[11], cases()[12]}) {
        const std::string what =
            std::string(kernel_name(kernel)) + " " + std::string(dtype_name(dt)) + " " + c.name;
        AttnRun r = setup(c, dt);
        r.p.one_pass_backward = c.one_pass && kernel == Kernel::fused;
        const AttentionMemory plan = attention_memory(kernel, r.p);
        MemoryTracker tracker;  // the kernel's allocations only
        TrackerScope scope(tracker);
        AttentionSaved saved = attention_forward(kernel, r.p);
        EXPECT_EQ(tracker.peak_bytes(), plan.forward_peak_bytes) << what;
        EXPECT_EQ(tracker.live_bytes(), plan.saved_bytes) << what;
        for (const auto& [tag, bytes] : tracker.peak_by_tag())
          EXPECT_EQ(tag.rfind("attn.", 0), 0u) << what << " " << tag;
        tracker.reset_peak();
        attention_backward(kernel, r.p, saved);
        EXPECT_EQ(tracker.peak_bytes() - plan.saved_bytes, plan.backward_peak_bytes) << what;
        // the one-pass backward holds its fp32 dq sums; the two passes and the eager kernel do not
        const bool one_pass = c.one_pass && kernel == Kernel::fused;
        EXPECT_EQ(tracker.peak_by_tag().count("attn.dq_sum"), one_pass ? 1u : 0u) << what;
        // ... and, with fewer than 4 (b, K/V head) tasks, its sub-groups' fp32 dk, dv partials
        EXPECT_EQ(tracker.peak_by_tag().count("attn.dkv_partial"),
                  one_pass && c.B * c.Hkv < 4 ? 1u : 0u)
            << what;
        EXPECT_EQ(tracker.live_bytes(), plan.saved_bytes) << what;
        for (const auto& [tag, bytes] : tracker.peak_by_tag())
          EXPECT_EQ(tag.rfind("attn.", 0), 0u) << what << " " << tag;
      }
}

// The eager kernel's plan against the closed forms of docs/attention.md §5, written out here: both
// dtypes, g = 1 and g > 1, where each backward term can be the larger one.
TEST(Attention, EagerPlanMatchesItsClosedForms) {
  for (DType dt : {DType::f32, DType::bf16})
    for (auto [B, Hq, Hkv, T, Dqk, Dv] : {std::array<int64_t, 6>{2, 4, 4, 16, 24, 12},
                                          {1, 8, 2, 8, 64, 32},
                                          {1, 1, 1, 4, 96, 64},
                                          {3, 6, 3, 40, 8, 8}}) {
      AttentionFwdParams p;
      p.B = B, p.Hq = Hq, p.Hkv = Hkv, p.T = T, p.Dqk = Dqk, p.Dv = Dv, p.dtype = dt;
      const int64_t s = dtype_size(dt), sq = B * Hq * T * T, kv = s * T * (Dqk + Dv);
      const int64_t acc = Hq != Hkv ? 4 * B * Hkv * T * (Dqk + Dv) : 0;
      const AttentionMemory m = attention_memory(Kernel::eager, p);
      const std::string what = fmt::format("{} B {} Hq {} Hkv {} T {} Dqk {} Dv {}", dtype_name(dt),
                                           B, Hq, Hkv, T, Dqk, Dv);
      EXPECT_EQ(m.saved_bytes, s * sq) << what;
      EXPECT_EQ(m.forward_peak_bytes, (4 + s) * sq + kv) << what;
      EXPECT_EQ(m.backward_peak_bytes,
                dt == DType::f32 ? 4 * sq + std::max(kv, acc) : std::max(6 * sq + kv, 2 * sq + acc))
          << what;
    }
}

// The fused kernel's plan against closed forms written out here from its tiling (docs/attention.md
// §4, §5), both dtypes, both backward orders: a query tile holds R = h·bq rows, the h query heads
// of one K/V head it serves (all g = Hq/Hkv of them, or a sub-group of the one pass) times bq =
// min(T, max(1, 256/h)) tokens; a key tile holds bk = min(T, 256) keys; each of S ≤ 16 per-thread
// slots holds one task's tiles. The forward saves only the fp32 log-sum-exp of every query row; the
// backward holds its fp32 delta = rowsum(dO∘O) the same way. The cases cover g = 1 and g > 1, T
// below and above a tile, S below and at 16, an odd number of query tiles, and one-pass sub-groups
// (split > 1).
TEST(Attention, FusedPlanMatchesItsClosedForms) {
  constexpr int64_t kRows = 256, kKeys = 256, kSlots = 16, kBundle = 2, kOnePassTasks = 4;
  auto cdiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  for (DType dt : {DType::f32, DType::bf16})
    for (bool one_pass : {false, true})
      for (auto [B, Hq, Hkv, T, Dqk, Dv] : {std::array<int64_t, 6>{2, 4, 4, 16, 24, 12},
                                            {1, 1, 1, 520, 24, 12},
                                            {1, 2, 2, 300, 192, 128},
                                            {3, 8, 2, 1000, 64, 32},
                                            {1, 6, 1, 77, 24, 12},
                                            {1, 16, 1, 600, 576, 512}}) {
        AttentionFwdParams p;
        p.B = B, p.Hq = Hq, p.Hkv = Hkv, p.T = T, p.Dqk = Dqk, p.Dv = Dv, p.dtype = dt;
        p.one_pass_backward = one_pass;
        const AttentionMemory m = attention_memory(Kernel::fused, p);
        const std::string what =
            fmt::format("{} {} B {} Hq {} Hkv {} T {} Dqk {} Dv {}", dtype_name(dt),
                        one_pass ? "one pass" : "two passes", B, Hq, Hkv, T, Dqk, Dv);
        const int64_t s = dtype_size(dt), low = dt == DType::bf16 ? 1 : 0, g = Hq / Hkv;
        const int64_t lse = 4 * B * Hq * T, bk = std::min(T, kKeys);

        // Forward: a task is U query tiles of one K/V head, each with its q tile, fp32 scores
        // (bf16: and its P in bf16), row max and sum, and fp32 o sums; the key tile is shared by
        // the U.
        const int64_t bq = std::min(T, std::max<int64_t>(1, kRows / g)), R = g * bq;
        const int64_t nqb = cdiv(T, bq);
        const int64_t U = std::min(kBundle, nqb), S = std::min(kSlots, B * Hkv * cdiv(nqb, U));
        const int64_t fwd_slot = U * (s * R * Dqk + 4 * 2 * R + 4 * R * Dv) + s * bk * (Dqk + Dv) +
                                 4 * R * bk + low * 2 * R * bk;
        EXPECT_EQ(m.saved_bytes, lse) << what;
        EXPECT_EQ(m.forward_peak_bytes, lse + S * fwd_slot) << what;

        // Backward: the one pass splits a K/V head's g query heads into the fewest sub-groups (a
        // divisor of g) that give B·Hkv·split ≥ 4 tasks (else g), with split > 1 an fp32 partial of
        // dk, dv per sub-group; the two passes take one tile per task, over query tiles then key
        // tiles.
        int64_t split = one_pass ? g : 1;
        for (int64_t d = 1; one_pass && d < g; ++d)
          if (g % d == 0 && B * Hkv * d >= kOnePassTasks) {
            split = d;
            break;
          }
        const int64_t h = g / split, bqb = std::min(T, std::max<int64_t>(1, kRows / h));
        const int64_t Rb = h * bqb;
        const int64_t nqbb = cdiv(T, bqb), nkb = cdiv(T, bk);
        const int64_t Sb = std::min(kSlots, B * Hkv * (one_pass ? split : std::max(nqbb, nkb)));
        // fp32 sums of a key tile's dk, dv (the two passes also reuse them for a query tile's dq)
        const int64_t grad_acc =
            one_pass ? 4 * bk * (Dqk + Dv) : 4 * std::max(bk * (Dqk + Dv), Rb * Dqk);
        // a sub-group's dq rows, all of T
        const int64_t dq_sums = one_pass ? 4 * nqbb * Rb * Dqk : 0;
        // q and dO tiles, the key tile, fp32 S and dP (bf16: P and dS in bf16 too), row statistics
        const int64_t bwd_slot = s * Rb * (Dqk + Dv) + s * bk * (Dqk + Dv) + 2 * 4 * Rb * bk +
                                 low * 2 * 2 * Rb * bk + 4 * 2 * Rb + grad_acc + dq_sums;
        const int64_t partials = split > 1 ? 4 * B * Hkv * split * T * (Dqk + Dv) : 0;
        EXPECT_EQ(m.backward_peak_bytes, lse + Sb * bwd_slot + partials) << what;
      }
}

TEST(Attention, FusedNeverAllocatesTxT) {
  // Two passes and the one pass (with its fp32 dq sums, linear in T).
  for (const Case& c : {Case{"long", 8192, 1, 1, 1, 24, 12},
                        Case{"long_one_pass", 8192, 1, 4, 4, 24, 12, true, 0, false, true}})
    for (DType dt : {DType::f32, DType::bf16}) {
      const int64_t txt = c.T * c.T * 4;  // one fp32 T×T matrix
      AttnRun r = setup(c, dt);
      MemoryTracker tracker;
      TrackerScope scope(tracker);
      AttentionSaved saved = attention_forward(Kernel::fused, r.p);
      attention_backward(Kernel::fused, r.p, saved);
      EXPECT_LT(tracker.peak_bytes(), txt / 16) << dtype_name(dt);
      // Its plan (which it allocates exactly, see AllocatesExactlyItsMemoryPlan) grows linearly in
      // T: doubling T from 8192 to 131072 never even doubles the peak, where a T×T buffer would
      // quadruple it.
      for (int64_t T = c.T; T < 131072; T *= 2) {
        AttentionFwdParams small = r.p, big = r.p;
        small.T = T, big.T = 2 * T;
        const AttentionMemory a = attention_memory(Kernel::fused, small),
                              b = attention_memory(Kernel::fused, big);
        EXPECT_LE(b.forward_peak_bytes, 2 * a.forward_peak_bytes) << "T " << T;
        EXPECT_LE(b.backward_peak_bytes, 2 * a.backward_peak_bytes) << "T " << T;
      }
      // The eager kernel at the same size does hold T×T probabilities: the check can fail.
      EXPECT_GE(attention_memory(Kernel::eager, r.p).saved_bytes, c.T * c.T * dtype_size(dt));
    }
}

TEST(Attention, FusedWorkspaceDoesNotDependOnThreadCount) {
  const Case c = cases()[3];
  const int keep = omp_get_max_threads();
  std::vector<int64_t> peaks;
  for (int threads : {1, 2, 5}) {
    omp_set_num_threads(threads);
    AttnRun r = setup(c, DType::bf16);
    MemoryTracker tracker;
    TrackerScope scope(tracker);
    AttentionSaved saved = attention_forward(Kernel::fused, r.p);
    attention_backward(Kernel::fused, r.p, saved);
    peaks.push_back(tracker.peak_bytes());
  }
  omp_set_num_threads(keep);
  EXPECT_EQ(peaks[0], peaks[1]);
  EXPECT_EQ(peaks[0], peaks[2]);
}

TEST(Attention, ChecksNameTheOffendingParameter) {
  AttnRun r = setup(cases()[1], DType::f32);
  auto message_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_status(), 2);
      return e.message();
    }
    return "no error";
  };
  AttentionBwdParams p = r.p;
  p.Hq = 3;
  EXPECT_NE(message_of([&] { attention_forward(Kernel::fused, p); }).find("Hkv 2 must divide Hq 3"),
            std::string::npos);
  p = r.p;
  p.dq = nullptr;
  AttentionSaved saved = attention_forward(Kernel::fused, r.p);
  EXPECT_NE(message_of([&] { attention_backward(Kernel::fused, p, saved); }).find("missing dq"),
            std::string::npos);
  EXPECT_NE(message_of([&] { attention_backward(Kernel::eager, r.p, saved); }).find("saved.probs"),
            std::string::npos);
  p = r.p;
  p.k_stride.t = -1;
  EXPECT_NE(message_of([&] { attention_forward(Kernel::eager, p); }).find("attention k"),
            std::string::npos);
}

TEST(Attention, FlopsFollowFlashAttention3Convention) {
  EXPECT_DOUBLE_EQ(attention_forward_flops(1, 16, 4096, 192, 128, true),
                   2.0 * 16 * 4096 * (4097 / 2.0) * 320);
  EXPECT_DOUBLE_EQ(attention_forward_flops(2, 4, 100, 24, 12, false), 2.0 * 2 * 4 * 100 * 100 * 36);
}

namespace {

// The bf16 fused run of case c with o (and, in backward, dq, dk, dv) written in fp32: each fp32
// output rounded to bf16 is bitwise the bf16 kernel's output (the same fp32 accumulator times the
// same factor, rounded once), so the option changes nothing but where the rounding happens.
TEST(Attention, FusedFp32OutputsRoundToTheStorageDtypeOutputs) {
  for (const Case& c : cases()) {
    if (c.latent_v) continue;  // o_f32 is for dense k, v (the ring forms' chunks)
    AttnRun low = setup(c, DType::bf16);
    const Results want = run_kernel(Kernel::fused, low);
    AttnRun wide = setup(c, DType::bf16);
    auto f32 = [&](Strided& s, const char* name) {
      s = make(s.T, s.B, s.H, s.D, s.pad, DType::f32, name, false);
      return s.buf.raw();
    };
    AttentionBwdParams& p = wide.p;
    p.o = f32(wide.o, "o32"), p.dq = f32(wide.dq, "dq32"), p.dk = f32(wide.dk, "dk32"),
    p.dv = f32(wide.dv, "dv32");
    p.o_f32 = true, p.grads_f32 = true;
    // backward reads o as fp32: it sees the unrounded forward output, so delta (and so the
    // gradients) may differ in the last bit from the bf16 run; check the forward bitwise and the
    // gradients within a bf16 step of it.
    AttentionSaved saved = attention_forward(Kernel::fused, p);
    const ref::Array o = wide.o.values();
    for (int64_t i = 0; i < o.numel(); ++i)
      ASSERT_EQ(round_to(DType::bf16, float(o[i])), float(want.o[i]))
          << c.name << " o element " << i;
    EXPECT_TRUE(wide.o.pads_hold_nan()) << c.name;
    attention_backward(Kernel::fused, p, saved);
    for (auto [got, ref_out, name] : {std::tuple{wide.dq.values(), want.dq, "dq"},
                                      {wide.dk.values(), want.dk, "dk"},
                                      {wide.dv.values(), want.dv, "dv"}}) {
      const double scale = std::max(1e-3, max_abs(ref_out));
      EXPECT_LE(max_abs_diff(got, ref_out) / scale, 2e-2) << c.name << " " << name;
    }
    EXPECT_TRUE(wide.dq.pads_hold_nan() && wide.dk.pads_hold_nan() && wide.dv.pads_hold_nan())
        << c.name;
  }
}

// The two backward orders run the same key-tile step: o, dk and dv are bit-identical; dq sums the
// same products in the same key-tile order but reads dS through its transpose, so it may differ in
// the last bits only (both meet the fp64 reference: FusedMatchesReference*). dq is summed in
// another order; so are dk and dv where the one pass splits a group's heads into sub-groups (fewer
// than 4 (b, K/V head) tasks and g > 1; one_pass_grouped_multi_tile, with 4 tasks, keeps whole
// groups and stays bitwise).
TEST(Attention, OnePassAndTwoPassBackwardsAgree) {
  for (DType dt : {DType::f32, DType::bf16})
    for (Case c : {cases()[2], cases()[3], cases()[6], cases()[7], cases()[9], cases()[12]}) {
      const bool split = c.B * c.Hkv < 4 && c.Hq > c.Hkv;
      c.one_pass = false;
      const auto two = outputs(Kernel::fused, c, dt);
      c.one_pass = true;
      const auto one = outputs(Kernel::fused, c, dt);
      const std::string what = c.name + " " + std::string(dtype_name(dt));
      ASSERT_EQ(one.size(), two.size());
      for (size_t i = 0; i < one.size(); ++i) {
        if (i == 1 || (split && (i == 2 || i == 3))) {  // dq; dk, dv of a split group
          double worst = 0, scale = 0;
          for (int64_t e = 0; e < one[i].numel(); ++e) {
            const double a = one[i].get(e), b = two[i].get(e);
            if (std::isnan(a) && std::isnan(b)) continue;  // pads
            worst = std::max(worst, std::abs(a - b)), scale = std::max(scale, std::abs(b));
          }
          EXPECT_LE(worst, (dt == DType::bf16 ? 1.6e-2 : 1e-5) * scale) << what << " output " << i;
        } else {
          EXPECT_TRUE(std::memcmp(one[i].raw(), two[i].raw(), size_t(one[i].nbytes())) == 0)
              << what << " output " << i;
        }
      }
    }
}

// The first token of a causal row sees one key: its softmax is the constant 1, so dS and with it
// the token's dq are exactly 0. The fused kernels take delta = dO·O, which sums dP's value in
// another order than the product that gives dP; they must still give the exact 0 (the plain
// implementations, which take rowsum(P∘dP), cancel to the bit), or every short sequence carries the
// residue into the weights. (A p == 1 test does not find the row: the backward's p missed 1 by more
// than 4 ulps of lse2 here.)
TEST(Attention, TheFirstTokensQueryGradientIsExactlyZero) {
  for (Kernel kernel : {Kernel::fused, Kernel::eager})
    for (DType dt : {DType::f32, DType::bf16})
      for (Case c : cases()) {
        if (!c.causal) continue;
        AttnRun r = setup(c, dt);
        const Results got = run_kernel(kernel, r);
        const std::string what = c.name + " " + std::string(dtype_name(dt)) +
                                 (kernel == Kernel::fused ? " fused" : " eager");
        for (int64_t b = 0; b < c.B; ++b)
          for (int64_t h = 0; h < c.Hq; ++h)
            for (int64_t d = 0; d < c.Dqk; ++d)
              ASSERT_EQ(got.dq[((0 * c.B + b) * c.Hq + h) * c.Dqk + d], 0.0)
                  << what << " b " << b << " h " << h;
      }
}

// A row of two keys: dS = P∘(dP − delta) is P₀P₁(dP₀ − dP₁), a difference of rounded numbers. The
// plain implementation takes delta = rowsum(P∘dP) from the same dP and a normalised P, so dP's
// rounding cancels. With delta = dO·O, rounded on its own (latent-wide in the absorbed shape), the
// fused kernel's dq and dk at T 2 are many times the plain error; rows whose keys all lie in the
// first key tile therefore take delta from the tile, divided by the rebuilt P's sum
// (docs/attention.md §2). 4× is the factor of the kernel tests above; one row's error against
// another's has a tail that no factor of 2 bounds.
TEST(Attention, RowsOfFewKeysCancelAsThePlainImplementationDoes) {
  for (bool one_pass : {false, true})
    for (uint64_t seed = 1; seed <= 24; ++seed) {
      // The name keys expected()'s cache: one reference and baseline per seed, for both orders.
      const Case c{"two_tokens_576_512_latent_v_seed" + std::to_string(seed),
                   2,
                   1,
                   4,
                   1,
                   576,
                   512,
                   true,
                   0,
                   true,
                   one_pass,
                   seed};
      AttnRun r = setup(c, DType::f32);
      const Results got = run_kernel(Kernel::fused, r);
      const Expected& e = expected(c, DType::f32);
      for (auto [x, ref, base, name] : {std::tuple{&got.dq, &e.ref.dq, &e.plain.dq, "dq"},
                                        std::tuple{&got.dk, &e.ref.dk, &e.plain.dk, "dk"}}) {
        const double err = max_abs_diff(*x, *ref), plain_err = max_abs_diff(*base, *ref);
        EXPECT_TRUE(laga::testing::within_baseline(err, plain_err, max_abs(*ref), 4.0, 2 * 0x1p-23))
            << "seed " << seed << (one_pass ? " one pass " : " two passes ") << name << ": error "
            << err << " vs plain " << plain_err;
      }
    }
}

TEST(Attention, EagerRefusesTheOnePassBackward) {
  AttnRun r = setup(cases()[1], DType::bf16);
  AttentionSaved saved = attention_forward(Kernel::eager, r.p);
  r.p.one_pass_backward = true;
  try {
    attention_backward(Kernel::eager, r.p, saved);
    ADD_FAILURE() << "eager accepted the one-pass backward";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs --kernel fused"), std::string::npos) << e.what();
  }
}

TEST(Attention, EagerRefusesFp32Outputs) {
  AttnRun r = setup(cases()[1], DType::bf16);
  r.p.o_f32 = true;
  EXPECT_THROW(attention_forward(Kernel::eager, r.p), Error);
  r.p.o_f32 = false, r.p.grads_f32 = true;
  AttentionSaved saved = attention_forward(Kernel::eager, r.p);
  try {
    attention_backward(Kernel::eager, r.p, saved);
    ADD_FAILURE() << "eager accepted fp32 gradients";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("use --kernel fused"), std::string::npos) << e.what();
  }
}

}  // namespace

namespace {

// The distance of x from the exact value e, in fp32 ulps of e.
double ulps_from(float x, long double e) {
  const float ef = float(e);
  const double ulp = double(std::nextafter(std::fabs(ef), INFINITY) - std::fabs(ef));
  return double(std::fabs((long double)x - e)) / ulp;
}

// One merge stores the correctly rounded result: its lse and every output within half an fp32 ulp
// (plus the fp64 computation's own 1e-6 ulp) of the exact value, computed here in long double
// straight from lse = log(e^a + e^p). The ring forms merge a row up to 2P−1 times; an fp32 merge
// (log and exp in fp32) missed by a few ulps per merge and failed verify on a random configuration
// at P 8.
TEST(AttentionMerge, OneMergeIsCorrectlyRounded) {
  const int64_t T = 37, B = 2, H = 3, Dv = 20;
  Tensor o_acc = Tensor::empty({T, B, H, Dv}, DType::f32, "o_acc");
  Tensor o_part = Tensor::empty({T, B, H, Dv}, DType::f32, "o_part");
  Tensor lse_acc = Tensor::empty({B, H, T}, DType::f32, "lse_acc");
  Tensor lse_part = Tensor::empty({B, H, T}, DType::f32, "lse_part");
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto uniform = [&] {  // splitmix64 → [0, 1)
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull, z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return double((z ^ (z >> 31)) >> 11) * 0x1p-53;
  };
  for (Tensor* t : {&lse_acc, &lse_part})
    for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = float(1.0 + 12.0 * uniform());
  for (Tensor* t : {&o_acc, &o_part})  // positive, as a weighted mean of positive values would be
    for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = float(0.1 + uniform());
  const std::vector<float> a0(o_acc.data<float>(), o_acc.data<float>() + o_acc.numel());
  const std::vector<float> l0(lse_acc.data<float>(), lse_acc.data<float>() + lse_acc.numel());
  attention_merge(o_part, lse_part, o_acc, lse_acc, false);
  double worst_lse = 0, worst_o = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t l = (b * H + h) * T + t, row = (t * B + b) * H + h;
        const long double ea = std::exp((long double)l0[l]),
                          ep = std::exp((long double)lse_part.data<float>()[l]);
        const long double lse = std::log(ea + ep);
        worst_lse = std::max(worst_lse, ulps_from(lse_acc.data<float>()[l], lse));
        for (int64_t d = 0; d < Dv; ++d) {
          const long double o =
              (ea * a0[row * Dv + d] + ep * o_part.data<float>()[row * Dv + d]) / (ea + ep);
          worst_o = std::max(worst_o, ulps_from(o_acc.data<float>()[row * Dv + d], o));
        }
      }
  EXPECT_LE(worst_lse, 0.500001);
  EXPECT_LE(worst_o, 0.500001);
}

TEST(AttentionMerge, FirstCopiesThePartial) {
  Tensor o_acc = Tensor::zeros({3, 1, 2, 4}, DType::f32, "o_acc");
  Tensor o_part = Tensor::zeros({3, 1, 2, 4}, DType::f32, "o_part");
  Tensor lse_acc = Tensor::zeros({1, 2, 3}, DType::f32, "lse_acc");
  Tensor lse_part = Tensor::zeros({1, 2, 3}, DType::f32, "lse_part");
  for (int64_t i = 0; i < o_part.numel(); ++i) o_part.data<float>()[i] = float(i) - 7.5f;
  for (int64_t i = 0; i < lse_part.numel(); ++i) lse_part.data<float>()[i] = float(i) * 0.25f;
  attention_merge(o_part, lse_part, o_acc, lse_acc, true);
  for (int64_t i = 0; i < o_part.numel(); ++i)
    EXPECT_EQ(o_acc.data<float>()[i], o_part.data<float>()[i]);
  for (int64_t i = 0; i < lse_part.numel(); ++i)
    EXPECT_EQ(lse_acc.data<float>()[i], lse_part.data<float>()[i]);
}

}  // namespace
