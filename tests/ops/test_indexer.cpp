// The lightning indexer (src/ops/indexer.cpp) and LayerNorm (src/ops/layernorm.cpp) against the
// fp64 reference (reference/indexer_ref.cpp): the selection exactly where the reference's scores
// leave a clear gap at the k-th place, and valid everywhere; ties to the lower position; short
// rows; bits independent of the row split and the thread count; the loss and its gradients in both
// candidate modes; meta runs allocating and recording what real runs do. bf16 inputs are widened
// exactly (or multiplied in pairs by the CPU's bf16 dot product, each product exact in fp32), so
// the reference runs on the same bf16 values and fp32's tolerances apply to both. LAGA_MAX_ISA=avx2
// runs the widening path on a CPU with AVX-512 BF16.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "laga/core/memory.hpp"
#include "laga/core/work.hpp"
#include "laga/ops/indexer.hpp"
#include "laga/ops/layernorm.hpp"
#include "reference/indexer_ref.hpp"
#include "testing.hpp"

using namespace laga;
using namespace laga::testing;

namespace {

constexpr double kU = 0x1p-24;  // fp32's unit roundoff

struct Case {
  int64_t Tq, B, H, D, Tk, q_pos0;
};

struct Inputs {
  Case c;
  DType dt;
  Tensor q, w, k;
  float w_scale;
  IndexerParams params() const {
    IndexerParams p;
    p.B = c.B, p.Tq = c.Tq, p.Tk = c.Tk, p.q_pos0 = c.q_pos0, p.H = c.H, p.D = c.D, p.dtype = dt;
    p.w_scale = w_scale, p.q = q.raw(), p.w = w.raw(), p.k = k.raw();
    return p;
  }
  // Query rows [r0, r0 + n) as a call of their own.
  IndexerParams rows(int64_t r0, int64_t n) const {
    IndexerParams p = params();
    const int64_t es = dtype_size(dt);
    p.Tq = n, p.q_pos0 = c.q_pos0 + r0;
    p.q = static_cast<const char*>(q.raw()) + r0 * c.B * c.H * c.D * es;
    p.w = static_cast<const char*>(w.raw()) + r0 * c.B * c.H * es;
    return p;
  }
};

Inputs make(const Case& c, DType dt, uint64_t seed) {
  Inputs in{c,
            dt,
            random_tensor({c.Tq, c.B, c.H, c.D}, dt, seed, "q"),
            random_tensor({c.Tq, c.B, c.H}, dt, seed, "w"),
            random_tensor({c.Tk, c.B, c.D}, dt, seed, "k"),
            float(1 / std::sqrt(double(c.H * c.D)))};
  return in;
}

ref::Array ref_scores(const Inputs& in) {
  return ref::indexer_scores(ref::from_tensor(in.q), ref::from_tensor(in.w), ref::from_tensor(in.k),
                             in.w_scale, in.c.q_pos0);
}

// The largest Σ_j |c_j| Σ_d |q_jd k_sd| of any pair: what a score's fp32 rounding error scales
// with.
double magnitude(const Inputs& in) {
  const ref::Array q = ref::from_tensor(in.q), w = ref::from_tensor(in.w),
                   k = ref::from_tensor(in.k);
  const Case& c = in.c;
  double m = 0;
  for (int64_t r = 0; r < c.Tq * c.B; ++r)
    for (int64_t s = 0; s < c.Tk; ++s) {
      double sum = 0;
      for (int64_t j = 0; j < c.H; ++j) {
        double a = 0;
        for (int64_t d = 0; d < c.D; ++d)
          a += std::abs(q[(r * c.H + j) * c.D + d] * k[(s * c.B + r % c.B) * c.D + d]);
        sum += std::abs(in.w_scale * w[r * c.H + j]) * a;
      }
      m = std::max(m, sum);
    }
  return m;
}

struct Selection {
  std::vector<int32_t> idx;
  std::vector<float> scores;
};
Selection run_topk(const IndexerParams& p, int64_t topk) {
  Selection s{std::vector<int32_t>(size_t(p.Tq * p.B * topk)),
              std::vector<float>(size_t(p.Tq * p.B * topk))};
  indexer_topk(p, topk, s.idx.data(), s.scores.data());
  return s;
}

// The rows' top-k against the reference: every row's selection valid (no unselected score above a
// selected one by more than tol), exactly the reference's where its k-th and (k+1)-th scores are
// more than 2·tol apart, and the scores within tol.
void expect_selection(const Inputs& in, int64_t topk, const std::string& what) {
  const Case& c = in.c;
  const ref::Array I = ref_scores(in);
  const auto want = ref::indexer_topk(I, topk);
  const Selection got = run_topk(in.params(), topk);
  // A score is Σ_j of H terms, each an FMA chain of D products: error ≤ (D + H) u · magnitude.
  const double tol = 2 * double(c.D + c.H) * kU * magnitude(in);
  int64_t exact_rows = 0;
  for (int64_t r = 0; r < c.Tq * c.B; ++r) {
    const int64_t pos = c.q_pos0 + r / c.B;
    std::vector<double> row(I.data.begin() + r * c.Tk, I.data.begin() + r * c.Tk + pos + 1);
    std::vector<char> chosen(size_t(c.Tk), 0);
    double min_chosen = INFINITY;
    for (int64_t i = 0; i < topk; ++i) {
      const int32_t s = got.idx[size_t(r * topk + i)];
      if (i < std::min(topk, pos + 1)) {
        ASSERT_GE(s, 0) << what << " row " << r;
        ASSERT_LE(s, pos) << what << " row " << r;
        if (i > 0) {
          ASSERT_GT(s, got.idx[size_t(r * topk + i - 1)]) << what << ": not ascending";
        }
        chosen[size_t(s)] = 1;
        min_chosen = std::min(min_chosen, row[size_t(s)]);
        EXPECT_NEAR(got.scores[size_t(r * topk + i)], row[size_t(s)], tol) << what;
      } else {
        EXPECT_EQ(s, -1) << what << " row " << r;
        EXPECT_EQ(got.scores[size_t(r * topk + i)], -INFINITY) << what;
      }
    }
    for (int64_t s = 0; s <= pos; ++s)
      if (!chosen[size_t(s)]) {
        EXPECT_LE(row[size_t(s)], min_chosen + tol) << what << " row " << r;
      }
    std::vector<double> sorted = row;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    if (int64_t(sorted.size()) > topk && sorted[size_t(topk - 1)] - sorted[size_t(topk)] <= 2 * tol)
      continue;
    ++exact_rows;
    for (int64_t i = 0; i < topk; ++i)
      EXPECT_EQ(got.idx[size_t(r * topk + i)], want.idx[size_t(r * topk + i)])
          << what << " row " << r;
  }
  // the exact comparison must not be vacuous
  EXPECT_GE(exact_rows, c.Tq * c.B * 3 / 4) << what;
}

class IndexerTest : public ::testing::TestWithParam<DType> {};

}  // namespace

// Several key tiles with a partial last one, heads not a multiple of the register block, an odd D
// (a bf16 pair half empty), rows that hold more candidates than the running buffer (2·topk) and
// rows with fewer than topk.
TEST_P(IndexerTest, TopkMatchesTheReference) {
  const DType dt = GetParam();
  for (const Case& c : {Case{40, 2, 5, 24, 430, 390}, Case{20, 1, 8, 15, 20, 0}}) {
    const Inputs in = make(c, dt, 11);
    for (int64_t topk : {1, 7, 37})
      expect_selection(in, topk,
                       std::string(dtype_name(dt)) + " Tk " + std::to_string(c.Tk) + " topk " +
                           std::to_string(topk));
  }
}

// Rows of fewer than topk candidates list all of them in order, then −1 with a score of −inf.
TEST_P(IndexerTest, ShortRowsKeepEveryKeyAndPad) {
  const Inputs in = make({10, 2, 3, 8, 10, 0}, GetParam(), 3);
  const int64_t topk = 16;
  const Selection got = run_topk(in.params(), topk);
  for (int64_t r = 0; r < 20; ++r)
    for (int64_t i = 0; i < topk; ++i) {
      EXPECT_EQ(got.idx[size_t(r * topk + i)], i <= r / 2 ? i : -1) << "row " << r;
      if (i > r / 2) {
        EXPECT_EQ(got.scores[size_t(r * topk + i)], -INFINITY);
      }
    }
}

// Equal scores go to the lower position: keys all zero give every score 0 (the first topk keys
// win), and keys in equal pairs give bitwise equal scores (the later of a pair never wins alone).
TEST_P(IndexerTest, TiesGoToTheLowerPosition) {
  const DType dt = GetParam();
  const Case c{30, 1, 5, 12, 400, 370};
  Inputs in = make(c, dt, 5);
  const int64_t topk = 9;
  in.k = Tensor::zeros({c.Tk, c.B, c.D}, dt, "k");
  Selection got = run_topk(in.params(), topk);
  for (int64_t r = 0; r < c.Tq; ++r)
    for (int64_t i = 0; i < topk; ++i) EXPECT_EQ(got.idx[size_t(r * topk + i)], i) << "row " << r;
  ref::Array k = ref::from_tensor(random_tensor({c.Tk, c.B, c.D}, dt, 5, "k"));
  for (int64_t s = 1; s < c.Tk; s += 2)
    for (int64_t d = 0; d < c.D; ++d) k[s * c.D + d] = k[(s - 1) * c.D + d];
  in.k = ref::to_tensor(k, dt, "k");
  got = run_topk(in.params(), topk);
  int64_t split_pairs = 0;
  for (int64_t r = 0; r < c.Tq; ++r) {
    std::vector<char> chosen(size_t(c.Tk), 0);
    for (int64_t i = 0; i < topk; ++i) chosen[size_t(got.idx[size_t(r * topk + i)])] = 1;
    for (int64_t s = 1; s < c.Tk; s += 2) {
      EXPECT_FALSE(chosen[size_t(s)] && !chosen[size_t(s - 1)]) << "row " << r << " key " << s;
      split_pairs += chosen[size_t(s - 1)] && !chosen[size_t(s)];
    }
  }
  EXPECT_GT(split_pairs, 0);  // topk odd: some pair sits across the k-th place
}

// A row's selection and scores are the same bits whether its rows come in one call or two (a
// split in the middle of a row tile), and at one thread or two.
TEST_P(IndexerTest, TopkIsBitwiseIndependentOfTheRowSplitAndThreads) {
  const Case c{37, 2, 6, 20, 500, 463};
  const Inputs in = make(c, GetParam(), 7);
  const int64_t topk = 33, n = c.Tq * c.B * topk;
  const int keep = omp_get_max_threads();
  omp_set_num_threads(1);
  const Selection one = run_topk(in.params(), topk);
  omp_set_num_threads(2);
  const Selection two = run_topk(in.params(), topk);
  const Selection a = run_topk(in.rows(0, 13), topk), b = run_topk(in.rows(13, c.Tq - 13), topk);
  omp_set_num_threads(keep);
  Selection split = a;
  split.idx.insert(split.idx.end(), b.idx.begin(), b.idx.end());
  split.scores.insert(split.scores.end(), b.scores.begin(), b.scores.end());
  for (const Selection* s : {&two, const_cast<const Selection*>(&split)}) {
    EXPECT_EQ(s->idx, one.idx);
    EXPECT_EQ(std::memcmp(s->scores.data(), one.scores.data(), size_t(n) * 4), 0);
  }
}

namespace {

struct LossRun {
  double loss;
  Tensor dq, dw, dk;
};

LossRun run_loss(const Inputs& in, const int32_t* idx, int64_t topk, const Tensor& target,
                 float loss_scale) {
  const Case& c = in.c;
  LossRun r{0, Tensor::zeros({c.Tq, c.B, c.H, c.D}, DType::f32, "dq"),
            Tensor::zeros({c.Tq, c.B, c.H}, DType::f32, "dw"),
            Tensor::zeros({c.Tk, c.B, c.D}, DType::f32, "dk")};
  IndexerLossParams p;
  static_cast<IndexerParams&>(p) = in.params();
  p.topk = topk, p.idx = idx, p.target = target.data<float>(), p.loss_scale = loss_scale;
  p.dq = r.dq.data<float>(), p.dw = r.dw.data<float>(), p.dk = r.dk.data<float>();
  r.loss = indexer_loss(p);
  return r;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), size_t(a.numel()) * 4) == 0;
}

// Positive, unnormalised target weights [Tq, B, C].
Tensor make_target(const Case& c, int64_t C, uint64_t seed) {
  Tensor t = Tensor::empty({c.Tq, c.B, C}, DType::f32, "target");
  fill_normal(t, seed, "target", 0.3, 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, std::abs(t.get(i)));
  return t;
}

}  // namespace

// The loss and dq, dw, dk against the reference on the same (dtype-rounded) inputs, over a
// selection from indexer_topk and over every earlier key. The fast kernel's error is fp32's: a
// score's (D + H)·u relative to its magnitude, carried through the softmax into dI and into the
// gradient sums over up to Tk keys; 64·(D + H)·u (1e-4 here) bounds all of them with margin, where
// a wrong term errs by 1e-2 or more.
TEST_P(IndexerTest, LossAndGradientsMatchTheReference) {
  const DType dt = GetParam();
  const Case c{24, 2, 5, 21, 230, 206};
  const Inputs in = make(c, dt, 13);
  const int64_t topk = 50;
  const Selection sel = run_topk(in.params(), topk);
  const double tol = 64 * double(c.D + c.H) * kU;
  for (bool sparse : {false, true}) {
    const std::string what = std::string(dtype_name(dt)) + (sparse ? " selection" : " causal");
    const int64_t C = sparse ? topk : c.Tk;
    const Tensor target = make_target(c, C, 17);
    const LossRun got = run_loss(in, sparse ? sel.idx.data() : nullptr, topk, target, 0.5f);
    const auto want = ref::indexer_loss(
        ref::from_tensor(in.q), ref::from_tensor(in.w), ref::from_tensor(in.k), in.w_scale,
        c.q_pos0, sparse ? &sel.idx : nullptr, topk, ref::from_tensor(target), 0.5);
    EXPECT_GT(want.loss, 0.1) << what;
    EXPECT_NEAR(got.loss, want.loss, tol * want.loss) << what;
    EXPECT_LT(rel_l2(ref::from_tensor(got.dq), want.dq), tol) << what << " dq";
    EXPECT_LT(rel_l2(ref::from_tensor(got.dw), want.dw), tol) << what << " dw";
    EXPECT_LT(rel_l2(ref::from_tensor(got.dk), want.dk), tol) << what << " dk";
  }
}

// The loss and every gradient are the same bits at one thread and at two (dk's sum over rows runs
// in one order per key), in both candidate modes.
TEST_P(IndexerTest, LossIsBitwiseIndependentOfThreadCount) {
  const Case c{40, 2, 4, 16, 450, 410};
  const Inputs in = make(c, GetParam(), 19);
  const int64_t topk = 64;
  const Selection sel = run_topk(in.params(), topk);
  for (bool sparse : {false, true}) {
    const Tensor target = make_target(c, sparse ? topk : c.Tk, 23);
    const int keep = omp_get_max_threads();
    omp_set_num_threads(1);
    const LossRun one = run_loss(in, sparse ? sel.idx.data() : nullptr, topk, target, 1.0f);
    omp_set_num_threads(2);
    const LossRun two = run_loss(in, sparse ? sel.idx.data() : nullptr, topk, target, 1.0f);
    omp_set_num_threads(keep);
    EXPECT_EQ(one.loss, two.loss);
    EXPECT_TRUE(same_bits(one.dq, two.dq));
    EXPECT_TRUE(same_bits(one.dw, two.dw));
    EXPECT_TRUE(same_bits(one.dk, two.dk));
  }
}

// On a meta tracker both ops allocate exactly what a real run allocates and record the same work:
// one attention record each, of the indexer kernel, the top-k's FLOPs those of the scores.
TEST_P(IndexerTest, MetaRunsAllocateAndRecordWhatRealRunsDo) {
  const Case c{33, 2, 4, 16, 300, 267};
  const Inputs in = make(c, GetParam(), 29);
  const int64_t topk = 20;
  const Selection sel = run_topk(in.params(), topk);
  const Tensor target = make_target(c, topk, 31);
  int64_t peak[2][2];
  std::vector<WorkRecord> records[2];
  for (int meta = 0; meta < 2; ++meta) {
    std::vector<int32_t> idx(sel.idx.size());
    Tensor dq = Tensor::zeros({c.Tq, c.B, c.H, c.D}, DType::f32, "dq"),
           dw = Tensor::zeros({c.Tq, c.B, c.H}, DType::f32, "dw"),
           dk = Tensor::zeros({c.Tk, c.B, c.D}, DType::f32, "dk");
    IndexerLossParams p;
    static_cast<IndexerParams&>(p) = in.params();
    p.topk = topk, p.idx = sel.idx.data(), p.target = target.data<float>();
    p.dq = dq.data<float>(), p.dw = dw.data<float>(), p.dk = dk.data<float>();
    WorkLedger ledger;
    WorkScope ws(ledger);
    {
      MemoryTracker tracker(meta == 1);
      TrackerScope scope(tracker);
      indexer_topk(in.params(), topk, idx.data(), nullptr);
      peak[meta][0] = tracker.peak_bytes();
    }
    {
      MemoryTracker tracker(meta == 1);
      TrackerScope scope(tracker);
      indexer_loss(p);
      peak[meta][1] = tracker.peak_bytes();
    }
    records[meta] = ledger.records;
  }
  EXPECT_EQ(peak[1][0], peak[0][0]);
  EXPECT_EQ(peak[1][1], peak[0][1]);
  EXPECT_GT(peak[0][0], 0);
  for (int meta = 0; meta < 2; ++meta) {
    ASSERT_EQ(records[meta].size(), 2u);
    EXPECT_EQ(records[meta][0].cls, WorkClass::attention_forward);
    EXPECT_EQ(records[meta][1].cls, WorkClass::attention_backward);
    for (const WorkRecord& r : records[meta]) {
      EXPECT_EQ(std::string(r.op), "indexer");
      EXPECT_EQ(r.kernel, AttentionKernel::indexer);
      EXPECT_EQ(r.dims[0], c.Tq);
      EXPECT_EQ(r.dims[1], c.H);
      EXPECT_EQ(r.dims[3], c.D);
    }
    // 2·H·D per causal pair: Σ_t (q_pos0 + t + 1) pairs per batch row
    EXPECT_DOUBLE_EQ(records[meta][0].flops,
                     2.0 * c.H * c.D * c.B * (c.Tq * (c.q_pos0 + 1) + c.Tq * (c.Tq - 1) / 2));
    EXPECT_EQ(records[meta][1].flops, records[0][1].flops);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, IndexerTest, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// ---- LayerNorm ----------------------------------------------------------------------------------

namespace {

struct LnRun {
  Tensor y, dx, dw, db;
};
LnRun run_layernorm(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& dy,
                    double eps) {
  const int64_t C = x.dim(-1), M = x.numel() / C;
  LnRun r{Tensor::empty(x.shape(), x.dtype(), "y"), Tensor::empty(x.shape(), x.dtype(), "dx"),
          Tensor::zeros({C}, DType::f32, "dw"), Tensor::zeros({C}, DType::f32, "db")};
  LayerNormBwdParams p;
  p.M = M, p.C = C, p.dtype = x.dtype(), p.eps = eps;
  p.x = x.raw(), p.w = w.raw(), p.b = b.raw(), p.y = r.y.raw();
  layernorm_forward(p);
  p.dy = dy.raw(), p.dx = r.dx.raw(), p.dw = r.dw.raw(), p.db = r.db.raw();
  layernorm_backward(p);
  return r;
}

class LayerNormTest : public ::testing::TestWithParam<DType> {};

}  // namespace

// y, dx, dw and db against the reference on the same stored inputs. Errors: fp32 statistics over C
// (C·u relative), then one rounding to the storage dtype for y and dx (u of bf16 or fp32); dw, db
// are fp64 sums rounded once to fp32.
TEST_P(LayerNormTest, MatchesTheReference) {
  const DType dt = GetParam();
  const int64_t M = 300, C = 72;
  const double eps = 1e-6;
  const Tensor x = random_tensor({M, C}, dt, 1, "x", 2.0), w = random_tensor({C}, dt, 2, "w"),
               b = random_tensor({C}, dt, 3, "b"), dy = random_tensor({M, C}, dt, 4, "dy");
  const LnRun got = run_layernorm(x, w, b, dy, eps);
  const ref::Array xr = ref::from_tensor(x), wr = ref::from_tensor(w), dyr = ref::from_tensor(dy);
  const ref::Array y = ref::layernorm_forward(xr, wr, ref::from_tensor(b), eps);
  const auto g = ref::layernorm_backward(xr, wr, dyr, eps);
  const double store = dt == DType::bf16 ? 0x1p-8 : 0.0;
  const double tol = 8 * double(C) * kU + store;
  EXPECT_LT(max_abs_diff(got.y, y), tol * max_abs(y));
  EXPECT_LT(max_abs_diff(got.dx, g.dx), tol * max_abs(g.dx));
  EXPECT_LT(rel_l2(ref::from_tensor(got.dw), g.dw), 8 * double(C) * kU);
  EXPECT_LT(rel_l2(ref::from_tensor(got.db), g.db), 8 * kU);
}

TEST_P(LayerNormTest, IsBitwiseIndependentOfThreadCount) {
  const DType dt = GetParam();
  const Tensor x = random_tensor({2000, 40}, dt, 1, "x"), w = random_tensor({40}, dt, 2, "w"),
               b = random_tensor({40}, dt, 3, "b"), dy = random_tensor({2000, 40}, dt, 4, "dy");
  const int keep = omp_get_max_threads();
  omp_set_num_threads(1);
  const LnRun one = run_layernorm(x, w, b, dy, 1e-6);
  omp_set_num_threads(2);
  const LnRun two = run_layernorm(x, w, b, dy, 1e-6);
  omp_set_num_threads(keep);
  auto same = [](const Tensor& a, const Tensor& b) {
    return std::memcmp(a.raw(), b.raw(), size_t(a.numel() * dtype_size(a.dtype()))) == 0;
  };
  EXPECT_TRUE(same(one.y, two.y) && same(one.dx, two.dx) && same(one.dw, two.dw) &&
              same(one.db, two.db));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LayerNormTest, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });
