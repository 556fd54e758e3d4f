// The row operations of the attention kernels (src/ops/rows.hpp), on every SIMD target this CPU
// runs (an AVX-512 machine checks the AVX2 kernels too), against their scalar definition in double:
// every row length from 0 to past two vectors (each tail), guard values after every output row (a
// stray write is caught), bf16 rounded exactly as to_bf16(), and every element the same bits on
// every target.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "laga/core/dtype.hpp"
#include "src/ops/rows.hpp"

using namespace laga;

namespace {

constexpr int64_t kMaxN = 40;  // past two AVX-512 vectors and five AVX2 ones
constexpr int kGuard = 8;

std::vector<float> random_row(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(size_t(n + kGuard));
  for (auto& x : v) x = u(g);
  return v;
}

template <class T>
std::vector<T> guarded(int64_t n) {
  std::vector<T> v(size_t(n + kGuard));
  std::memset(static_cast<void*>(v.data()), 0x5a, v.size() * sizeof(T));
  return v;
}
template <class T>
bool guards_intact(const std::vector<T>& v, int64_t n) {
  std::vector<T> g = guarded<T>(0);
  return std::memcmp(v.data() + n, g.data(), kGuard * sizeof(T)) == 0;
}
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
// 2^x as the kernels define it (their argument rounded to fp32 by an FMA), in double.
double exp2_of(float s, float c, float m) { return std::exp2(double(std::fma(s, c, -m))); }

}  // namespace

TEST(Rows, EveryTargetMatchesTheScalarDefinitionAtEveryLength) {
  const auto targets = rows::every_target();
  ASSERT_FALSE(targets.empty());
  std::string names;
  for (const rows::Kernels& k : targets) names += std::string(names.empty() ? "" : ", ") + k.target;
  std::printf("[targets] %s\n", names.c_str());
  for (const rows::Kernels& k : targets) {
    SCOPED_TRACE(k.target);
    for (int64_t n = 0; n <= kMaxN; ++n) {
      SCOPED_TRACE(n);
      const int64_t nk = n + 3;  // zeros written in [n, nk)
      const auto s = random_row(nk, 1 + uint32_t(n), -8, 2);
      const auto dp = random_row(nk, 100 + uint32_t(n), -1, 1);
      const float c = 1.3f, m = 2.5f, delta = 0.125f;
      if (n > 0) {
        float want = -INFINITY;
        for (int64_t i = 0; i < n; ++i) want = std::max(want, s[i]);
        EXPECT_EQ(k.row_max(s.data(), n), want);
      }
      // row_exp2, fp32 and bf16: the bf16 row is the fp32 row rounded by to_bf16
      auto p = guarded<float>(nk);
      auto pb = guarded<bf16>(nk);
      const float sum = k.row_exp2_f32(s.data(), p.data(), n, nk, c, m);
      const float sum_b = k.row_exp2_bf16(s.data(), pb.data(), n, nk, c, m);
      double want_sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double e = exp2_of(s[i], c, m);
        want_sum += e;
        EXPECT_NEAR(p[i], e, 3e-7 * e) << "row_exp2 element " << i;
        EXPECT_EQ(pb[i].bits, to_bf16(p[i]).bits) << "row_exp2 bf16 element " << i;
      }
      for (int64_t i = n; i < nk; ++i)
        EXPECT_TRUE(p[i] == 0 && pb[i].bits == 0) << "row_exp2 pad " << i;
      EXPECT_NEAR(sum, want_sum, 1e-6 * want_sum + 1e-30);
      EXPECT_EQ(bits(sum), bits(sum_b));
      EXPECT_TRUE(guards_intact(p, nk) && guards_intact(pb, nk));
      // row_grad: p·(dp − delta) with p = 2^(c·s − lse2)
      auto ds = guarded<float>(nk);
      auto dsb = guarded<bf16>(nk);
      k.row_grad_f32(s.data(), dp.data(), ds.data(), n, nk, c, m, delta);
      k.row_grad_bf16(s.data(), dp.data(), dsb.data(), n, nk, c, m, delta);
      for (int64_t i = 0; i < n; ++i) {
        const double want = exp2_of(s[i], c, m) * (double(dp[i]) - delta);
        EXPECT_NEAR(ds[i], want, 5e-7 * std::abs(want) + 1e-30) << "row_grad " << i;
        EXPECT_EQ(dsb[i].bits, to_bf16(ds[i]).bits);
      }
      for (int64_t i = n; i < nk; ++i) EXPECT_TRUE(ds[i] == 0 && dsb[i].bits == 0);
      EXPECT_TRUE(guards_intact(ds, nk) && guards_intact(dsb, nk));
      // span_grad: per-query lse2 and delta
      const auto lse = random_row(n, 7 + uint32_t(n), 1, 3);
      const auto dl = random_row(n, 9 + uint32_t(n), -0.5f, 0.5f);
      auto sp = guarded<float>(n), sd = guarded<float>(n);
      auto spb = guarded<bf16>(n), sdb = guarded<bf16>(n);
      k.span_grad_f32(s.data(), dp.data(), sp.data(), sd.data(), n, c, lse.data(), dl.data());
      k.span_grad_bf16(s.data(), dp.data(), spb.data(), sdb.data(), n, c, lse.data(), dl.data());
      for (int64_t i = 0; i < n; ++i) {
        const double e = exp2_of(s[i], c, lse[i]);
        EXPECT_NEAR(sp[i], e, 3e-7 * e);
        EXPECT_NEAR(sd[i], e * (double(dp[i]) - dl[i]),
                    5e-7 * std::abs(e * (dp[i] - dl[i])) + 1e-30);
        EXPECT_EQ(spb[i].bits, to_bf16(sp[i]).bits);
        EXPECT_EQ(sdb[i].bits, to_bf16(sd[i]).bits);
      }
      EXPECT_TRUE(guards_intact(sp, n) && guards_intact(sd, n) && guards_intact(spb, n) &&
                  guards_intact(sdb, n));
      // dots, in fp32 and in fp64
      std::vector<bf16> sb(static_cast<size_t>(nk));
      for (int64_t i = 0; i < nk; ++i) sb[i] = to_bf16(s[i]);
      double dot = 0, dot_b = 0, dot_bb = 0, l1 = 0;
      for (int64_t i = 0; i < n; ++i) {
        dot += double(s[i]) * dp[i], dot_b += double(to_float(sb[i])) * dp[i];
        dot_bb += double(to_float(sb[i])) * to_float(sb[i]), l1 += std::abs(double(s[i]) * dp[i]);
      }
      EXPECT_NEAR(k.dot_f32_f32(s.data(), dp.data(), n), dot, 1e-6 * l1 + 1e-30);
      EXPECT_NEAR(k.dot_bf16_f32(sb.data(), dp.data(), n), dot_b, 1e-6 * l1 + 1e-30);
      // fp64 sums of exact products, rounded once: within one fp32 ulp of the exact sum
      auto ulp = [](double v) {
        return std::nextafter(std::abs(float(v)), INFINITY) - std::abs(float(v));
      };
      EXPECT_NEAR(k.dot_f64_f32_f32(s.data(), dp.data(), n), dot, ulp(dot));
      EXPECT_NEAR(k.dot_f64_bf16_f32(sb.data(), dp.data(), n), dot_b, ulp(dot_b));
      EXPECT_NEAR(k.dot_f64_bf16_bf16(sb.data(), sb.data(), n), dot_bb, ulp(dot_bb));
      // scale and softmax_grad, each element rounded once
      auto y = guarded<float>(n);
      auto yb = guarded<bf16>(n);
      k.scale_f32(s.data(), y.data(), n, 0.75f);
      k.scale_bf16(s.data(), yb.data(), n, 0.75f);
      auto g = guarded<float>(n);
      auto gb = guarded<bf16>(n);
      k.softmax_grad_f32(s.data(), dp.data(), g.data(), n, delta);
      k.softmax_grad_bf16(sb.data(), dp.data(), gb.data(), n, delta);
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(y[i], s[i] * 0.75f);
        EXPECT_EQ(yb[i].bits, to_bf16(s[i] * 0.75f).bits);
        EXPECT_EQ(g[i], s[i] * (dp[i] - delta));
        EXPECT_EQ(gb[i].bits, to_bf16(to_float(sb[i]) * (dp[i] - delta)).bits);
      }
      EXPECT_TRUE(guards_intact(y, n) && guards_intact(yb, n) && guards_intact(g, n) &&
                  guards_intact(gb, n));
    }
  }
}

TEST(Rows, TileDeltasAreTheNormalisedSumsOfTheirRows) {
  for (const rows::Kernels& k : rows::every_target()) {
    SCOPED_TRACE(k.target);
    for (int64_t n = 1; n <= kMaxN; ++n) {
      SCOPED_TRACE(n);
      const float c = 0.9f, lse2 = 1.5f;
      const auto s = random_row(n, 3 + uint32_t(n), -4, 2);
      const auto dp = random_row(n, 5 + uint32_t(n), -1, 1);
      double sum = 0, mass = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double pk = exp2_of(s[i], c, lse2);
        sum += pk * dp[i], mass += pk;
      }
      EXPECT_NEAR(k.tile_delta_row(s.data(), dp.data(), n, c, lse2), sum / mass,
                  1e-6 * std::abs(sum / mass) + 1e-7);
      // columns: token t0 + r sees keys 0 .. t0 + r of a [keys, ld] transposed tile
      const int64_t t0 = n % 5, ld = n + 3, keys = t0 + n;
      const auto st = random_row(keys * ld, 11 + uint32_t(n), -4, 2);
      const auto dpt = random_row(keys * ld, 13 + uint32_t(n), -1, 1);
      const auto l2 = random_row(n, 17 + uint32_t(n), 1, 2);
      auto delta = guarded<float>(n);
      k.tile_delta_cols(st.data(), dpt.data(), ld, n, t0, c, l2.data(), delta.data());
      for (int64_t r = 0; r < n; ++r) {
        double cs = 0, cm = 0;
        for (int64_t key = 0; key <= t0 + r; ++key) {
          const double pk = exp2_of(st[key * ld + r], c, l2[r]);
          cs += pk * dpt[key * ld + r], cm += pk;
        }
        EXPECT_NEAR(delta[r], cs / cm, 1e-6 * std::abs(cs / cm) + 1e-7) << "column " << r;
      }
      EXPECT_TRUE(guards_intact(delta, n));
    }
  }
}

TEST(Rows, Bf16ConversionsAreToBf16AndExactWidening) {
  std::vector<float> x = {0.0f,
                          -0.0f,
                          1.0f,
                          1.00390625f,
                          1.01171875f,
                          1.0f + 1.0f / 256 + 1.0f / 65536,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::denorm_min(),
                          1e-40f,
                          -3.4e38f,
                          3.3961776e38f,
                          65504.0f};
  for (float v : random_row(40, 21, -1e6f, 1e6f)) x.push_back(v);
  const int64_t n = int64_t(x.size());
  for (const rows::Kernels& k : rows::every_target()) {
    SCOPED_TRACE(k.target);
    auto b = guarded<bf16>(n);
    k.narrow(x.data(), b.data(), n);
    for (int64_t i = 0; i < n; ++i)
      EXPECT_EQ(b[i].bits, to_bf16(x[i]).bits) << "element " << i << " = " << x[i];
    EXPECT_TRUE(guards_intact(b, n));
    auto w = guarded<float>(n);
    k.widen(b.data(), w.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(bits(w[i]), bits(to_float(b[i])));
    EXPECT_TRUE(guards_intact(w, n));
  }
}

TEST(Rows, EveryTargetGivesEachElementTheSameBits) {
  const auto targets = rows::every_target();
  const int64_t n = 37, nk = 40;
  const auto s = random_row(nk, 31, -20, 1);
  const auto dp = random_row(nk, 32, -1, 1);
  std::vector<std::vector<float>> exps, grads;
  for (const rows::Kernels& k : targets) {
    std::vector<float> p(nk), g(nk);
    k.row_exp2_f32(s.data(), p.data(), n, nk, 1.7f, 0.5f);
    k.row_grad_f32(s.data(), dp.data(), g.data(), n, nk, 1.7f, 0.5f, 0.01f);
    exps.push_back(p), grads.push_back(g);
  }
  for (size_t t = 1; t < targets.size(); ++t) {
    EXPECT_EQ(std::memcmp(exps[t].data(), exps[0].data(), nk * 4), 0)
        << targets[t].target << " vs " << targets[0].target;
    EXPECT_EQ(std::memcmp(grads[t].data(), grads[0].data(), nk * 4), 0) << targets[t].target;
  }
}
