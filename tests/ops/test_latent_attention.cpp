// The latent attention kernel (ops/latent_attention.hpp) against laga's path on the same inputs —
// the up-projection of the whole sequence, the fused attention kernel and the up-projection's
// backward — and both against an fp64 reference: fp32 within 1e-5 of laga, and in every dtype an
// error against fp64 at most twice laga's. Plus: bitwise the same with 1 and 2 OpenMP threads;
// allocates exactly its memory plan and never a whole-sequence K or V; odd sizes (T not a multiple
// of the tiles, B 2, Hr 1, 3).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "laga/core/memory.hpp"
#include "laga/ops/attention.hpp"
#include "laga/ops/elementwise.hpp"
#include "laga/ops/latent_attention.hpp"
#include "laga/ops/matmul.hpp"
#include "testing.hpp"

using namespace laga;
using laga::testing::rel_l2;

namespace {

struct Case {
  std::string name;
  int64_t T, B, H;
  int64_t query_tile = 0, key_tile = 0;  // 0: the kernel's own
  int64_t Lkv = 32, Dr = 8, Dn = 16, Dv = 16;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"one_token", 1, 1, 1, 16, 8},
      {"odd_T_B2_H3_small_tiles", 37, 2, 3, 16, 8},
      {"key_tile_larger_than_query_tile", 45, 1, 2, 8, 16},
      {"default_tiles_two_key_tiles", 300, 1, 1},
      {"odd_T_B2_H1_lkv_blocks", 29, 2, 1, 8, 8, 160, 8, 16, 24},  // Lkv 160: two column blocks
  };
  return c;
}

struct Inputs {
  Case c;
  DType dt;
  float scale;
  Tensor latent, wkv, q, dout;
  int64_t Dqk() const { return c.Dn + c.Dr; }
  int64_t Dl() const { return c.Lkv + c.Dr; }
  int64_t W() const { return c.Dn + c.Dv; }
};

Inputs make(const Case& c, DType dt, uint64_t seed = 7) {
  Inputs in{c, dt, float(1.0 / std::sqrt(double(c.Dn + c.Dr))), {}, {}, {}, {}};
  using laga::testing::random_tensor;
  in.latent = random_tensor({c.T, c.B, c.Lkv + c.Dr}, dt, seed, "latent");
  in.wkv = random_tensor({c.H * (c.Dn + c.Dv), c.Lkv}, dt, seed + 1, "wkv",
                         1.0 / std::sqrt(double(c.Lkv)));
  in.q = random_tensor({c.T, c.B, c.H, c.Dn + c.Dr}, dt, seed + 2, "q");
  in.dout = random_tensor({c.T, c.B, c.H, c.Dv}, dt, seed + 3, "dout");
  return in;
}

struct Outputs {
  Tensor o, lse, dq, dlatent, dwkv;
};

LatentAttentionParams params(const Inputs& in, const Tensor& o) {
  LatentAttentionParams p;
  p.B = in.c.B, p.T = in.c.T, p.H = in.c.H, p.Lkv = in.c.Lkv, p.Dr = in.c.Dr, p.Dn = in.c.Dn,
  p.Dv = in.c.Dv;
  p.dtype = in.dt, p.scale = in.scale, p.query_tile = in.c.query_tile, p.key_tile = in.c.key_tile;
  p.latent = in.latent.raw(), p.wkv = in.wkv.raw(), p.q = in.q.raw(), p.o = o.raw();
  return p;
}

Outputs run_latent(const Inputs& in, DType dlatent_dt) {
  const Case& c = in.c;
  Outputs r;
  r.o = Tensor::zeros({c.T, c.B, c.H, c.Dv}, in.dt, "o");
  AttentionSaved saved = latent_attention_forward(params(in, r.o));
  r.lse = saved.lse;
  r.dq = Tensor::zeros({c.T, c.B, c.H, in.Dqk()}, in.dt, "dq");
  r.dlatent = Tensor::zeros({c.T, c.B, in.Dl()}, dlatent_dt, "dlatent");
  r.dwkv = Tensor::zeros({c.H * in.W(), c.Lkv}, in.dt, "dwkv");
  LatentAttentionBwdParams bp;
  static_cast<LatentAttentionParams&>(bp) = params(in, r.o);
  bp.dout = in.dout.raw();
  bp.dlatent = r.dlatent.raw(), bp.dlatent_dtype = dlatent_dt;
  bp.dwkv = r.dwkv.raw(), bp.dwkv_dtype = in.dt;
  Tensor dq_sum = latent_attention_backward(bp, saved);
  latent_attention_dq(bp, dq_sum, r.dq.raw());
  return r;
}

// laga's path: k, v of the whole sequence (as forms/common.cpp's up_project_forward), the fused
// kernel, and the up-projection's backward (up_project_backward's operations).
Outputs run_laga(const Inputs& in, DType dlatent_dt) {
  const Case& c = in.c;
  const DType dt = in.dt;
  const int64_t M = c.T * c.B, W = in.W(), Dqk = in.Dqk(), Dl = in.Dl(), H = c.H;
  Tensor kvb = Tensor::empty({c.T, c.B, H, W}, dt, "kvb");
  const MatView ckv = mat(in.latent).col_slice(0, c.Lkv),
                rows{in.wkv.raw(), H * W, c.Lkv, c.Lkv, dt};
  matmul_2d(ckv, rows.t(), MatView{kvb.raw(), M, H * W, H * W, dt});
  Tensor k = Tensor::empty({c.T, c.B, H, Dqk}, dt, "k"),
         v = Tensor::empty({c.T, c.B, H, c.Dv}, dt, "v");
  copy_rows(dt, M * H, c.Dn, kvb.raw(), W, k.raw(), Dqk);
  for (int64_t h = 0; h < H; ++h)
    copy_rows(dt, M, c.Dr, at(in.latent, c.Lkv), Dl, at(k, h * Dqk + c.Dn), H * Dqk);
  copy_rows(dt, M * H, c.Dv, at(kvb, c.Dn), W, v.raw(), c.Dv);
  Outputs r;
  r.o = Tensor::zeros({c.T, c.B, H, c.Dv}, dt, "o");
  AttentionBwdParams p;
  p.B = c.B, p.T = c.T, p.Hq = H, p.Hkv = H, p.Dqk = Dqk, p.Dv = c.Dv, p.dtype = dt,
  p.scale = in.scale;
  p.q = in.q.raw(), p.q_stride = dense_strides(c.B, H, Dqk);
  p.k = k.raw(), p.k_stride = dense_strides(c.B, H, Dqk);
  p.v = v.raw(), p.v_stride = dense_strides(c.B, H, c.Dv);
  p.o = r.o.raw(), p.o_stride = dense_strides(c.B, H, c.Dv);
  AttentionSaved saved = attention_forward(Kernel::fused, p);
  r.lse = saved.lse;
  r.dq = Tensor::zeros({c.T, c.B, H, Dqk}, dt, "dq");
  Tensor dk = Tensor::zeros({c.T, c.B, H, Dqk}, dt, "dk"),
         dv = Tensor::zeros({c.T, c.B, H, c.Dv}, dt, "dv");
  p.dout = in.dout.raw(), p.dout_stride = dense_strides(c.B, H, c.Dv);
  p.dq = r.dq.raw(), p.dq_stride = dense_strides(c.B, H, Dqk);
  p.dk = dk.raw(), p.dk_stride = dense_strides(c.B, H, Dqk);
  p.dv = dv.raw(), p.dv_stride = dense_strides(c.B, H, c.Dv);
  attention_backward(Kernel::fused, p, saved);
  r.dlatent = Tensor::zeros({c.T, c.B, Dl}, dlatent_dt, "dlatent");
  r.dwkv = Tensor::zeros({H * W, c.Lkv}, dt, "dwkv");
  Tensor dkvb = Tensor::empty({c.T, c.B, H, W}, dt, "dkvb");
  copy_rows(dt, M * H, c.Dn, dk.raw(), Dqk, dkvb.raw(), W);
  copy_rows(dt, M * H, c.Dv, dv.raw(), c.Dv, at(dkvb, c.Dn), W);
  sum_heads(dt, M, H, c.Dr, at(dk, c.Dn), H * Dqk, Dqk, dlatent_dt, at(r.dlatent, c.Lkv), Dl,
            false);
  const MatView dkvb2{dkvb.raw(), M, H * W, H * W, dt};
  matmul_2d(dkvb2, rows, mat(r.dlatent).col_slice(0, c.Lkv));
  matmul_2d(dkvb2.t(), ckv, mat(r.dwkv), /*accumulate=*/true);
  return r;
}

// fp64 on the stored inputs: o, lse, dq, dlatent, dwkv.
struct Reference {
  ref::Array o, lse, dq, dlatent, dwkv;
};

Reference run_reference(const Inputs& in) {
  const Case& c = in.c;
  const int64_t T = c.T, B = c.B, H = c.H, Dqk = in.Dqk(), Dl = in.Dl(), W = in.W(), Dn = c.Dn,
                Dv = c.Dv;
  const ref::Array lat = ref::from_tensor(in.latent), wkv = ref::from_tensor(in.wkv),
                   q = ref::from_tensor(in.q), dout = ref::from_tensor(in.dout);
  Reference r{ref::Array({T, B, H, Dv}), ref::Array({B, H, T}), ref::Array({T, B, H, Dqk}),
              ref::Array({T, B, Dl}), ref::Array({H * W, c.Lkv})};
  const double scale = in.scale;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> k(T * Dqk), v(T * Dv), dk(T * Dqk, 0.0), dv(T * Dv, 0.0);
      for (int64_t t = 0; t < T; ++t) {
        const double* x = &lat.data[(t * B + b) * Dl];
        for (int64_t n = 0; n < W; ++n) {
          double s = 0;
          for (int64_t i = 0; i < c.Lkv; ++i) s += x[i] * wkv[(h * W + n) * c.Lkv + i];
          (n < Dn ? k[t * Dqk + n] : v[t * Dv + n - Dn]) = s;
        }
        for (int64_t d = 0; d < c.Dr; ++d) k[t * Dqk + Dn + d] = x[c.Lkv + d];
      }
      for (int64_t t = 0; t < T; ++t) {
        const double* qt = &q.data[((t * B + b) * H + h) * Dqk];
        const double* dot = &dout.data[((t * B + b) * H + h) * Dv];
        std::vector<double> p(t + 1), dp(t + 1);
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= t; ++j) {
          double s = 0;
          for (int64_t d = 0; d < Dqk; ++d) s += qt[d] * k[j * Dqk + d];
          p[j] = s * scale, mx = std::max(mx, p[j]);
        }
        for (int64_t j = 0; j <= t; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (int64_t j = 0; j <= t; ++j) p[j] /= sum;
        r.lse[(b * H + h) * T + t] = mx + std::log(sum);
        double delta = 0;
        for (int64_t d = 0; d < Dv; ++d) {
          double o = 0;
          for (int64_t j = 0; j <= t; ++j) o += p[j] * v[j * Dv + d];
          r.o[((t * B + b) * H + h) * Dv + d] = o;
          delta += o * dot[d];
        }
        for (int64_t j = 0; j <= t; ++j) {
          double g = 0;
          for (int64_t d = 0; d < Dv; ++d)
            g += dot[d] * v[j * Dv + d], dv[j * Dv + d] += p[j] * dot[d];
          const double ds = p[j] * (g - delta) * scale;
          for (int64_t d = 0; d < Dqk; ++d)
            r.dq[((t * B + b) * H + h) * Dqk + d] += ds * k[j * Dqk + d],
                dk[j * Dqk + d] += ds * qt[d];
        }
      }
      for (int64_t t = 0; t < T; ++t) {  // through the up-projection
        const double* x = &lat.data[(t * B + b) * Dl];
        double* dx = &r.dlatent.data[(t * B + b) * Dl];
        for (int64_t n = 0; n < W; ++n) {
          const double g = n < Dn ? dk[t * Dqk + n] : dv[t * Dv + n - Dn];
          for (int64_t i = 0; i < c.Lkv; ++i)
            dx[i] += g * wkv[(h * W + n) * c.Lkv + i], r.dwkv[(h * W + n) * c.Lkv + i] += g * x[i];
        }
        for (int64_t d = 0; d < c.Dr; ++d) dx[c.Lkv + d] += dk[t * Dqk + Dn + d];
      }
    }
  return r;
}

bool bitwise(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), size_t(a.nbytes())) == 0;
}

struct Errors {
  double o, lse, dq, dlatent, dwkv;
};
// ‖x − r‖₂ / ‖r‖₂, or ‖x − r‖₂ where r is all zero (dq of a one-token sequence).
double error(const Tensor& x, const ref::Array& r) {
  const ref::Array a = ref::from_tensor(x);
  double num = 0, den = 0;
  for (int64_t i = 0; i < r.numel(); ++i) num += (a[i] - r[i]) * (a[i] - r[i]), den += r[i] * r[i];
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}
Errors errors(const Outputs& x, const Reference& r) {
  return {error(x.o, r.o), error(x.lse, r.lse), error(x.dq, r.dq), error(x.dlatent, r.dlatent),
          error(x.dwkv, r.dwkv)};
}

}  // namespace

TEST(LatentAttention, MatchesLagasPathAndTheFp64ReferenceWithinTwiceLagasError) {
  for (DType dt : {DType::f32, DType::bf16})
    for (const Case& c : cases()) {
      const std::string what = c.name + " " + std::string(dtype_name(dt));
      const Inputs in = make(c, dt);
      const Outputs lat = run_latent(in, DType::f32), laga = run_laga(in, DType::f32);
      const Reference ref = run_reference(in);
      const Errors el = errors(lat, ref), eg = errors(laga, ref);
      fmt::print(
          "[measured] {}: vs fp64 latent/laga  o {:.2e}/{:.2e}  lse {:.2e}/{:.2e}  dq "
          "{:.2e}/{:.2e}  dlatent "
          "{:.2e}/{:.2e}  dwkv {:.2e}/{:.2e}\n",
          what, el.o, eg.o, el.lse, eg.lse, el.dq, eg.dq, el.dlatent, eg.dlatent, el.dwkv, eg.dwkv);
      const double floor = dt == DType::f32 ? 1e-6 : 1e-3;
      EXPECT_LE(el.o, 2 * eg.o + floor) << what;
      EXPECT_LE(el.lse, 2 * eg.lse + floor) << what;
      EXPECT_LE(el.dq, 2 * eg.dq + floor) << what;
      EXPECT_LE(el.dlatent, 2 * eg.dlatent + floor) << what;
      EXPECT_LE(el.dwkv, 2 * eg.dwkv + floor) << what;
      if (dt == DType::f32) {
        using ref::from_tensor;
        EXPECT_LE(rel_l2(from_tensor(lat.o), from_tensor(laga.o)), 1e-5) << what;
        EXPECT_LE(rel_l2(from_tensor(lat.lse), from_tensor(laga.lse)), 1e-5) << what;
        EXPECT_LE(rel_l2(from_tensor(lat.dq), from_tensor(laga.dq)), 1e-5) << what;
        EXPECT_LE(rel_l2(from_tensor(lat.dlatent), from_tensor(laga.dlatent)), 1e-5) << what;
        EXPECT_LE(rel_l2(from_tensor(lat.dwkv), from_tensor(laga.dwkv)), 1e-5) << what;
      }
    }
}

TEST(LatentAttention, DlatentInTheStorageDtypeMatchesLagas) {
  const Inputs in = make(cases()[1], DType::bf16);
  const Outputs lat = run_latent(in, DType::bf16), laga = run_laga(in, DType::bf16);
  const Reference ref = run_reference(in);
  EXPECT_LE(errors(lat, ref).dlatent, 2 * errors(laga, ref).dlatent + 1e-3);
}

TEST(LatentAttention, AddsIntoDwkvAndOverwritesDlatentAndDq) {
  const Inputs in = make(cases()[1], DType::f32);
  const Case& c = in.c;
  const Outputs zero = run_latent(in, DType::f32);
  // Again with garbage in dq and dlatent (overwritten) and a nonzero dwkv (added into).
  Tensor o = Tensor::zeros({c.T, c.B, c.H, c.Dv}, in.dt, "o");
  AttentionSaved saved = latent_attention_forward(params(in, o));
  Tensor dq = laga::testing::random_tensor({c.T, c.B, c.H, in.Dqk()}, in.dt, 11, "dq");
  Tensor dl = laga::testing::random_tensor({c.T, c.B, in.Dl()}, DType::f32, 12, "dl");
  Tensor dw0 = laga::testing::random_tensor({c.H * in.W(), c.Lkv}, in.dt, 13, "dw");
  Tensor dw = Tensor::empty(dw0.shape(), in.dt, "dw");
  std::memcpy(dw.raw(), dw0.raw(), size_t(dw0.nbytes()));
  LatentAttentionBwdParams bp;
  static_cast<LatentAttentionParams&>(bp) = params(in, o);
  bp.dout = in.dout.raw(), bp.dlatent = dl.raw(), bp.dlatent_dtype = DType::f32, bp.dwkv = dw.raw(),
  bp.dwkv_dtype = in.dt;
  Tensor dq_sum = latent_attention_backward(bp, saved);
  latent_attention_dq(bp, dq_sum, dq.raw());
  EXPECT_TRUE(bitwise(dq, zero.dq));
  EXPECT_TRUE(bitwise(dl, zero.dlatent));
  for (int64_t i = 0; i < dw.numel(); ++i)
    // fp32: one rounding of the same sum
    ASSERT_EQ(dw.get(i), float(dw0.get(i) + zero.dwkv.get(i))) << i;
}

TEST(LatentAttention, BitwiseTheSameForOneAndTwoThreads) {
  const int before = omp_get_max_threads();
  for (DType dt : {DType::f32, DType::bf16})
    for (const Case& c : {cases()[1], cases()[3]}) {
      const Inputs in = make(c, dt);
      omp_set_num_threads(1);
      const Outputs a = run_latent(in, DType::f32);
      omp_set_num_threads(2);
      const Outputs b = run_latent(in, DType::f32);
      omp_set_num_threads(before);
      const std::string what = c.name + " " + std::string(dtype_name(dt));
      EXPECT_TRUE(bitwise(a.o, b.o)) << what;
      EXPECT_TRUE(bitwise(a.lse, b.lse)) << what;
      EXPECT_TRUE(bitwise(a.dq, b.dq)) << what;
      EXPECT_TRUE(bitwise(a.dlatent, b.dlatent)) << what;
      EXPECT_TRUE(bitwise(a.dwkv, b.dwkv)) << what;
    }
}

TEST(LatentAttention, AllocatesExactlyItsPlanAndNoWholeSequenceKOrV) {
  for (DType dt : {DType::f32, DType::bf16})
    for (const Case& c : {cases()[1], cases()[3]}) {
      const std::string what = c.name + " " + std::string(dtype_name(dt));
      const Inputs in = make(c, dt);
      Tensor o = Tensor::zeros({c.T, c.B, c.H, c.Dv}, dt, "o");
      const LatentAttentionParams p = params(in, o);
      auto replay = [](const std::vector<AttentionMemoryEvent>& ev, int64_t& peak) {
        int64_t live = 0;
        peak = 0;
        for (const auto& e : ev) peak = std::max(peak, live += e.release ? -e.bytes() : e.bytes());
        return live;
      };
      int64_t fwd_peak = 0, bwd_peak = 0;
      const int64_t saved_bytes = replay(latent_attention_memory_events(p, false), fwd_peak);
      EXPECT_EQ(replay(latent_attention_memory_events(p, true), bwd_peak),
                c.B * c.H * c.T * in.Dqk() * 4)
          << what;
      EXPECT_EQ(saved_bytes, c.B * c.H * c.T * 4) << what;  // lse only
      // No whole-sequence K, V, dK or dV: the kernel's storage-dtype buffers of key rows hold one
      // key tile (fewer than T key rows), and nothing in the storage dtype is sequence-long.
      for (bool backward : {false, true})
        for (const auto& e : latent_attention_memory_events(p, backward)) {
          if (e.dtype != dt || e.tag == "attn.lse") continue;
          const std::string& t = e.tag;
          const int64_t width = t == "attn.k_tile"      ? in.Dqk()
                                : t == "attn.v_tile"    ? c.Dv
                                : t == "attn.dkv_tile"  ? in.W()
                                : t == "attn.dkpe_tile" ? c.Dr
                                                        : 0;
          if (width > 0) {
            EXPECT_LT(shape_numel(e.shape), c.T * c.B * c.H * width) << what << " " << t;
          }
          // (fp32 accumulators of the shard's rows are sequence-long; none is in bf16)
          if (dt != DType::f32) {
            for (int64_t d : e.shape)
              EXPECT_NE(d, c.T) << what << " " << t << ": a sequence-long storage buffer";
          }
        }
      Tensor dq = Tensor::zeros({c.T, c.B, c.H, in.Dqk()}, dt, "dq"),
             dl = Tensor::zeros({c.T, c.B, in.Dl()}, DType::f32, "dl");
      Tensor dw = Tensor::zeros({c.H * in.W(), c.Lkv}, dt, "dw");
      for (bool meta : {false, true}) {
        MemoryTracker tracker(meta);
        TrackerScope scope(tracker);
        AttentionSaved saved = latent_attention_forward(p);
        EXPECT_EQ(tracker.peak_bytes(), fwd_peak) << what << " meta " << meta;
        EXPECT_EQ(tracker.live_bytes(), saved_bytes) << what;
        for (const auto& [tag, bytes] : tracker.peak_by_tag())
          EXPECT_EQ(tag.rfind("attn.", 0), 0u) << what << " " << tag;
        tracker.reset_peak();
        LatentAttentionBwdParams bp;
        static_cast<LatentAttentionParams&>(bp) = p;
        bp.dout = in.dout.raw(), bp.dlatent = dl.raw(), bp.dlatent_dtype = DType::f32;
        bp.dwkv = dw.raw(), bp.dwkv_dtype = dt;
        Tensor dq_sum = latent_attention_backward(bp, saved);
        EXPECT_EQ(tracker.peak_bytes() - saved_bytes, bwd_peak) << what << " meta " << meta;
        EXPECT_EQ(tracker.live_bytes(), saved_bytes + c.B * c.H * c.T * in.Dqk() * 4)
            << what << ": dq_sum left";
        latent_attention_dq(bp, dq_sum, dq.raw());
        EXPECT_EQ(tracker.live_bytes(), saved_bytes) << what;
        for (const auto& [tag, bytes] : tracker.peak_by_tag())
          EXPECT_EQ(tag.rfind("attn.", 0), 0u) << what << " " << tag;
      }
    }
}

TEST(LatentAttention, BadParamsNameTheValue) {
  const Inputs in = make(cases()[1], DType::f32);
  Tensor o = Tensor::zeros({in.c.T, in.c.B, in.c.H, in.c.Dv}, DType::f32, "o");
  LatentAttentionParams p = params(in, o);
  p.scale = -1;
  try {
    latent_attention_forward(p);
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("scale -1"), std::string::npos) << e.what();
  }
  p = params(in, o);
  p.key_tile = -2;
  EXPECT_THROW(latent_attention_forward(p), std::exception);
}
