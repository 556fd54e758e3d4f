// bench_indexer: the rate of the lightning indexer's scores and top-k (indexer_topk) against the
// rate of a plain oneDNN matmul (laga::matmul, n³, same dtype, all threads) measured in the same
// run, in GFLOP/s by indexer_score_flops (2·H·D per causal (query, key) pair); with --loss also
// the indexer's loss and gradient over the selection (indexer_loss), by its recorded FLOPs (five
// score computations' worth per selected pair). Every timed result is validated in fp64 before it
// is reported: for sampled query rows, the returned scores against fp64 scores of the stored
// inputs, the selection against the fp64 ranking (no unselected key above a selected one by more
// than the tolerance), and the loss's dq rows against fp64 dq.
//
//   bench_indexer [--seq 8192] [--batch 1] [--heads 64] [--dim 128] [--topk 2048] [--loss 0|1]
//                 [--dtype fp32,bf16] [--matmul 2048] [--warmup 1] [--repeats 5] [--json FILE]
#include <cmath>
#include <cstdio>
#include <sstream>

#include "harness.hpp"
#include "laga/core/random.hpp"
#include "laga/ops/indexer.hpp"
#include "matmul_bench.hpp"

using namespace laga;
using namespace laga::bench;

namespace {

struct Config {
  int64_t T = 8192, B = 1, H = 64, D = 128, topk = 2048, matmul_n = 2048;
  bool loss = false;
  std::vector<DType> dtypes = {DType::f32, DType::bf16};
};

Config parse(const std::vector<std::string>& args) {
  Config c;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    LAGA_CHECK(i + 1 < args.size(),
               "unknown or incomplete option '{}'; see the usage at the top of bench_indexer.cpp",
               a);
    const std::string v = args[++i];
    if (a == "--seq")
      c.T = whole_number(a, v);
    else if (a == "--batch")
      c.B = whole_number(a, v);
    else if (a == "--heads")
      c.H = whole_number(a, v);
    else if (a == "--dim")
      c.D = whole_number(a, v);
    else if (a == "--topk")
      c.topk = whole_number(a, v);
    else if (a == "--loss")
      c.loss = whole_number(a, v, 0, 1) == 1;
    else if (a == "--matmul")
      c.matmul_n = whole_number(a, v);
    else if (a == "--dtype") {
      c.dtypes.clear();
      std::stringstream ss(v);
      for (std::string d; std::getline(ss, d, ',');) c.dtypes.push_back(parse_dtype(d));
    } else {
      LAGA_FAIL_USAGE("unknown option '{}'; see the usage at the top of bench_indexer.cpp", a);
    }
  }
  return c;
}

struct Buffers {
  Tensor q, w, k;  // [T, B, H, D], [T, B, H], [T, B, D]
  std::vector<int32_t> idx;
  std::vector<float> scores;  // [T, B, topk] each
  IndexerParams p;
  std::vector<float> target, dq, dw, dk;  // [T, B, topk], [T, B, H, D], [T, B, H], [T, B, D]
};

Buffers make_buffers(const Config& c, DType dt) {
  Buffers x;
  x.q = Tensor::empty({c.T, c.B, c.H, c.D}, dt, "q");
  x.w = Tensor::empty({c.T, c.B, c.H}, dt, "w");
  x.k = Tensor::empty({c.T, c.B, c.D}, dt, "k");
  fill_normal(x.q, 3, "q", 1.0), fill_normal(x.w, 3, "w", 1.0), fill_normal(x.k, 3, "k", 1.0);
  x.idx.resize(size_t(c.T * c.B * c.topk)), x.scores.resize(x.idx.size());
  IndexerParams& p = x.p;
  p.B = c.B, p.Tq = p.Tk = c.T, p.H = c.H, p.D = c.D, p.dtype = dt;
  p.w_scale = float(1 / std::sqrt(double(c.H * c.D)));
  p.q = x.q.raw(), p.w = x.w.raw(), p.k = x.k.raw();
  if (c.loss) {
    x.target.resize(x.idx.size());
    for (size_t i = 0; i < x.target.size(); ++i)
      x.target[i] = float(std::abs(normal(3, stream_id("target"), i)));
    x.dq.resize(size_t(c.T * c.B * c.H * c.D)), x.dw.resize(size_t(c.T * c.B * c.H));
    x.dk.resize(size_t(c.T * c.B * c.D));
  }
  return x;
}

// Wrong values among sampled rows: returned scores off their fp64 value by more than tol, and
// unselected keys scoring above the lowest selected one by more than tol (tol: 1e-4 of the row's
// largest Σ|term|).
int64_t validate(const Buffers& x, const Config& c) {
  const IndexerParams& p = x.p;
  int64_t wrong = 0;
  const int64_t b = c.B - 1;
  for (int64_t t : {int64_t(0), c.T / 3, c.T / 2 + 1, c.T - 1}) {
    std::vector<double> I(size_t(t + 1)), mag(size_t(t + 1));
    for (int64_t s = 0; s <= t; ++s)
      for (int64_t j = 0; j < c.H; ++j) {
        double a = 0, m = 0;
        for (int64_t d = 0; d < c.D; ++d) {
          const double v = double(x.q.get(((t * c.B + b) * c.H + j) * c.D + d)) *
                           double(x.k.get((s * c.B + b) * c.D + d));
          a += v, m += std::abs(v);
        }
        const double cj = double(p.w_scale) * double(x.w.get((t * c.B + b) * c.H + j));
        I[size_t(s)] += cj * std::max(a, 0.0), mag[size_t(s)] += std::abs(cj) * m;
      }
    const double tol = 1e-4 * *std::max_element(mag.begin(), mag.end());
    std::vector<char> chosen(size_t(t + 1), 0);
    double lowest = INFINITY;
    for (int64_t i = 0; i < c.topk; ++i) {
      const int32_t s = x.idx[size_t((t * c.B + b) * c.topk + i)];
      if (i > t) {
        wrong += s != -1;
        continue;
      }
      if (s < 0 || s > t || chosen[size_t(s)]) {
        ++wrong;
        continue;
      }
      chosen[size_t(s)] = 1, lowest = std::min(lowest, I[size_t(s)]);
      wrong += !(std::abs(x.scores[size_t((t * c.B + b) * c.topk + i)] - I[size_t(s)]) <= tol);
    }
    for (int64_t s = 0; s <= t; ++s) wrong += !chosen[size_t(s)] && I[size_t(s)] > lowest + tol;
  }
  return wrong;
}

// dq of sampled rows of one loss call against fp64 (the selection idx, target normalised over it),
// off by more than 1e-3 of the row's largest |dq|: the wrong values.
int64_t validate_loss(const Buffers& x, const Config& c) {
  const IndexerParams& p = x.p;
  int64_t wrong = 0;
  const int64_t b = c.B - 1;
  for (int64_t t : {c.T / 3, c.T - 1}) {
    const int64_t r = t * c.B + b;
    std::vector<int64_t> keys, cols;
    for (int64_t i = 0; i < c.topk; ++i)
      if (x.idx[size_t(r * c.topk + i)] >= 0)
        keys.push_back(x.idx[size_t(r * c.topk + i)]), cols.push_back(i);
    const size_t n = keys.size();
    std::vector<double> a(n * size_t(c.H)), I(n, 0.0);
    double z = 0;
    for (size_t i = 0; i < n; ++i) {
      z += x.target[size_t(r * c.topk + cols[i])];
      for (int64_t j = 0; j < c.H; ++j) {
        double v = 0;
        for (int64_t d = 0; d < c.D; ++d)
          v += double(x.q.get((r * c.H + j) * c.D + d)) *
               double(x.k.get((keys[i] * c.B + b) * c.D + d));
        a[i * size_t(c.H) + size_t(j)] = v;
        I[i] += double(p.w_scale) * double(x.w.get(r * c.H + j)) * std::max(v, 0.0);
      }
    }
    const double m = *std::max_element(I.begin(), I.end());
    double se = 0;
    for (double v : I) se += std::exp(v - m);
    std::vector<double> dq(size_t(c.H * c.D), 0.0);
    for (size_t i = 0; i < n; ++i) {
      const double dI = std::exp(I[i] - m) / se - x.target[size_t(r * c.topk + cols[i])] / z;
      for (int64_t j = 0; j < c.H; ++j) {
        if (!(a[i * size_t(c.H) + size_t(j)] > 0)) continue;
        const double g = dI * double(p.w_scale) * double(x.w.get(r * c.H + j));
        for (int64_t d = 0; d < c.D; ++d)
          dq[size_t(j * c.D + d)] += g * double(x.k.get((keys[i] * c.B + b) * c.D + d));
      }
    }
    double mag = 0;
    for (double v : dq) mag = std::max(mag, std::abs(v));
    for (int64_t e = 0; e < c.H * c.D; ++e)
      wrong += !(std::abs(double(x.dq[size_t(r * c.H * c.D + e)]) - dq[size_t(e)]) <= 1e-3 * mag);
  }
  return wrong;
}

struct Measurements {
  Timing matmul, topk, loss;
  int64_t matmul_wrong = 0, topk_wrong = 0, loss_wrong = 0;
};

// The matmul and the top-k timed in turns, one of each per repeat, so that both see the same
// machine.
Measurements measure(const Config& c, DType dt, const Options& o) {
  const MatmulBench mm(c.matmul_n, dt);
  Buffers x = make_buffers(c, dt);
  std::vector<double> t_mm, t_topk, t_loss;
  for (int i = 0; i < o.warmup + o.repeats; ++i) {
    const bool timed = i >= o.warmup;
    const double t0 = now_s();
    mm.run();
    const double t1 = now_s();
    indexer_topk(x.p, c.topk, x.idx.data(), x.scores.data());
    const double t2 = now_s();
    if (timed) t_mm.push_back(t1 - t0), t_topk.push_back(t2 - t1);
    if (!c.loss) continue;
    std::fill(x.dq.begin(), x.dq.end(), 0.f), std::fill(x.dw.begin(), x.dw.end(), 0.f);
    std::fill(x.dk.begin(), x.dk.end(), 0.f);
    IndexerLossParams lp;
    static_cast<IndexerParams&>(lp) = x.p;
    lp.topk = c.topk, lp.idx = x.idx.data(), lp.target = x.target.data();
    lp.dq = x.dq.data(), lp.dw = x.dw.data(), lp.dk = x.dk.data();
    const double t3 = now_s();
    indexer_loss(lp);
    if (timed) t_loss.push_back(now_s() - t3);
  }
  Measurements m;
  m.matmul = summarize(t_mm), m.topk = summarize(t_topk);
  m.matmul_wrong = mm.validate(), m.topk_wrong = validate(x, c);
  if (c.loss) m.loss = summarize(t_loss), m.loss_wrong = validate_loss(x, c);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = Options::parse(argc, argv);
    const Config c = parse(o.rest);
    IndexerParams shape;
    shape.B = c.B, shape.Tq = shape.Tk = c.T, shape.H = c.H, shape.D = c.D;
    const double flops = indexer_score_flops(shape);
    const Machine m = machine();
    Table table("bench_indexer: lightning indexer top-k vs oneDNN matmul",
                {fmt::format("shape: B {}, T {}, H_I {}, D_I {}, topk {}; matmul {}^3; causal", c.B,
                             c.T, c.H, c.D, c.topk, c.matmul_n),
                 fmt::format("flops: scores 2·H·D per causal pair, {:.4g}; matmul 2n^3", flops),
                 fmt::format("{} warm-up + {} timed repeats, matmul and top-k in turns; time = "
                             "median, spread = min, max and IQR",
                             o.warmup, o.repeats)},
                {{"dtype", "", 6},
                 {"op", "", 9},
                 {"time", "ms", 10, 2},
                 {"min", "ms", 10, 2},
                 {"max", "ms", 10, 2},
                 {"iqr", "ms", 8, 2},
                 {"rate", "GFLOP/s", 9, 1},
                 {"vs_matmul", "%", 10, 1},
                 {"#wrong", "", 7}});
    table.print_header(m);
    nlohmann::json extra = {{"T", c.T}, {"B", c.B}, {"H", c.H}, {"D", c.D}, {"topk", c.topk}};
    for (DType dt : c.dtypes) {
      const std::string dn(dtype_name(dt));
      const Measurements r = measure(c, dt, o);
      const double mm_flops = MatmulBench::flops(c.matmul_n),
                   mm_rate = mm_flops / r.matmul.median_s / 1e9;
      auto row = [&](const std::string& op, const Timing& t, double f, int64_t wrong) {
        const double rate = f / t.median_s / 1e9;
        table.row({dn, op, t.median_s * 1e3, t.min_s * 1e3, t.max_s * 1e3, (t.q3_s - t.q1_s) * 1e3,
                   rate, 100.0 * rate / mm_rate},
                  wrong);
      };
      row(fmt::format("mm {}^3", c.matmul_n), r.matmul, mm_flops, r.matmul_wrong);
      row("topk", r.topk, flops, r.topk_wrong);
      if (c.loss) {
        double pairs = 0;  // selected pairs: min(t + 1, topk) per query row
        for (int64_t t = 0; t < c.T; ++t) pairs += double(std::min(t + 1, c.topk));
        row("loss", r.loss, 5 * 2.0 * double(c.H * c.D * c.B) * pairs, r.loss_wrong);
      }
    }
    return table.finish(m, o.json_path, extra);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_indexer: %s\n", e.what());
    return e.exit_status();
  }
}
