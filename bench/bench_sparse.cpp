// bench_sparse: the forward and backward rate of the sparse latent attention kernel
// (ops/sparse_attention.hpp) over random valid selections (each query row's min(topk, t + 1) keys
// drawn without repeats from the rows ≤ t, ascending), against the rate of a plain oneDNN matmul
// (laga::matmul, n³, same dtype, all threads) measured in the same run, in GFLOP/s by
// sparse_attention_forward_flops (backward = 2.5 × forward). Every timed result is validated in
// fp64 before it is reported: o, lse and dq of sampled query rows, and dkv of the last key rows
// (which only the last query rows can select), plus sampled matmul entries.
//
//   bench_sparse [--seq 8192] [--topk 2048] [--batch 1] [--heads 64] [--dqk 576] [--dv 512]
//                [--dtype fp32,bf16] [--matmul 2048] [--warmup 1] [--repeats 5] [--json FILE]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "harness.hpp"
#include "laga/core/random.hpp"
#include "laga/ops/sparse_attention.hpp"
#include "matmul_bench.hpp"

using namespace laga;
using namespace laga::bench;

namespace {

struct Config {
  int64_t T = 8192, topk = 2048, B = 1, H = 64, Dqk = 576, Dv = 512, matmul_n = 2048;
  std::vector<DType> dtypes = {DType::f32, DType::bf16};
};

Config parse(const std::vector<std::string>& args) {
  Config c;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    LAGA_CHECK(i + 1 < args.size(),
               "unknown or incomplete option '{}'; see the usage at the top of bench_sparse.cpp",
               a);
    const std::string v = args[++i];
    if (a == "--seq")
      c.T = whole_number(a, v);
    else if (a == "--topk")
      c.topk = whole_number(a, v);
    else if (a == "--batch")
      c.B = whole_number(a, v);
    else if (a == "--heads")
      c.H = whole_number(a, v);
    else if (a == "--dqk")
      c.Dqk = whole_number(a, v);
    else if (a == "--dv")
      c.Dv = whole_number(a, v);
    else if (a == "--matmul")
      c.matmul_n = whole_number(a, v);
    else if (a == "--dtype") {
      c.dtypes.clear();
      std::stringstream ss(v);
      for (std::string d; std::getline(ss, d, ',');) c.dtypes.push_back(parse_dtype(d));
    } else {
      LAGA_FAIL_USAGE("unknown option '{}'; see the usage at the top of bench_sparse.cpp", a);
    }
  }
  LAGA_CHECK(c.Dv <= c.Dqk, "--dv {} must be ≤ --dqk {}", c.Dv, c.Dqk);
  return c;
}

struct Buffers {
  Tensor q, kv, dout, o, dq, dkv;
  std::vector<int32_t> idx;  // [T, B, topk]
  SparseAttentionBwdParams p;
};

Buffers make_buffers(const Config& c, DType dt) {
  Buffers x;
  auto input = [&](const Shape& s, const char* name) {
    Tensor t = Tensor::empty(s, dt, name);
    fill_normal(t, 2, name, 1.0);
    return t;
  };
  x.q = input({c.T, c.B, c.H, c.Dqk}, "q"), x.kv = input({c.T, c.B, c.Dqk}, "kv");
  x.dout = input({c.T, c.B, c.H, c.Dv}, "dout");
  x.o = Tensor::empty({c.T, c.B, c.H, c.Dv}, dt, "o");
  x.dq = Tensor::empty({c.T, c.B, c.H, c.Dqk}, dt, "dq");
  x.dkv = Tensor::empty({c.T, c.B, c.Dqk}, DType::f32, "dkv");
  // Row t keeps each key s ≤ t with probability topk / (t + 1) until topk are kept (a uniform
  // sample in the large; exact counts below): min(topk, t + 1) distinct keys, ascending.
  x.idx.assign(size_t(c.T * c.B * c.topk), -1);
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t b = 0; b < c.B; ++b) {
      int32_t* row = x.idx.data() + (t * c.B + b) * c.topk;
      int64_t need = std::min(c.topk, t + 1), n = 0;
      for (int64_t s = 0; s <= t && need > 0; ++s)  // selection sampling (Knuth's algorithm S)
        if (uniform01(5, uint64_t(t * c.B + b), uint64_t(s)) * double(t + 1 - s) < double(need))
          row[n++] = int32_t(s), --need;
    }
  SparseAttentionBwdParams& p = x.p;
  p.B = c.B, p.Tq = c.T, p.Tk = c.T, p.q_pos0 = 0, p.H = c.H, p.Dqk = c.Dqk, p.Dv = c.Dv;
  p.topk = c.topk, p.dtype = dt, p.scale = float(1.0 / std::sqrt(double(c.Dqk)));
  p.q = x.q.raw(), p.kv = x.kv.raw(), p.idx = x.idx.data(), p.o = x.o.raw();
  p.dout = x.dout.raw(), p.dq = x.dq.raw(), p.dkv = x.dkv.raw(), p.dkv_dtype = DType::f32;
  return x;
}

// One query row (t, b, h) in fp64 from the stored inputs over its selection.
struct Row {
  std::vector<int64_t> keys;
  std::vector<double> p, dp, o;
  double lse = 0, delta = 0;
};

Row fp64_row(const Buffers& x, int64_t t, int64_t b, int64_t h) {
  const SparseAttentionBwdParams& p = x.p;
  Row r;
  for (int64_t j = 0; j < p.topk; ++j)
    if (x.idx[size_t((t * p.B + b) * p.topk + j)] >= 0)
      r.keys.push_back(x.idx[size_t((t * p.B + b) * p.topk + j)]);
  const size_t n = r.keys.size();
  r.p.resize(n), r.dp.resize(n), r.o.assign(size_t(p.Dv), 0.0);
  const int64_t qo = ((t * p.B + b) * p.H + h) * p.Dqk, oo = ((t * p.B + b) * p.H + h) * p.Dv;
  double mx = -INFINITY, sum = 0;
  for (size_t i = 0; i < n; ++i) {
    double s = 0;
    for (int64_t d = 0; d < p.Dqk; ++d)
      s += double(x.q.get(qo + d)) * double(x.kv.get((r.keys[i] * p.B + b) * p.Dqk + d));
    mx = std::max(mx, r.p[i] = double(p.scale) * s);
  }
  for (size_t i = 0; i < n; ++i) sum += r.p[i] = std::exp(r.p[i] - mx);
  r.lse = mx + std::log(sum);
  for (size_t i = 0; i < n; ++i) {
    r.p[i] /= sum;
    double dp = 0;
    for (int64_t d = 0; d < p.Dv; ++d) {
      const double v = x.kv.get((r.keys[i] * p.B + b) * p.Dqk + d);
      r.o[size_t(d)] += r.p[i] * v;
      dp += double(x.dout.get(oo + d)) * v;
    }
    r.dp[i] = dp;
    r.delta += r.p[i] * dp;
  }
  return r;
}

// Values off the fp64 values by more than tol · max(1, max |fp64|) of their tensor.
int64_t count_wrong(const std::vector<double>& got, const std::vector<double>& ref, double tol) {
  double mag = 1;
  for (double r : ref) mag = std::max(mag, std::abs(r));
  int64_t wrong = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - ref[i]) <= tol * mag)) ++wrong;
  return wrong;
}

struct Wrong {
  int64_t forward = 0, backward = 0;
};

Wrong validate(const Buffers& x, const AttentionSaved& saved) {
  const SparseAttentionBwdParams& p = x.p;
  const double tol = p.dtype == DType::f32 ? 1e-4 : 3e-2;
  const int64_t b = p.B - 1;
  std::vector<double> got_o, ref_o, got_dq, ref_dq, got_lse, ref_lse;
  for (int64_t h : {int64_t(0), p.H - 1})
    for (int64_t t : {int64_t(0), p.Tq / 3, p.Tq - 1}) {
      const Row r = fp64_row(x, t, b, h);
      for (int64_t d = 0; d < p.Dv; ++d) {
        got_o.push_back(x.o.get(((t * p.B + b) * p.H + h) * p.Dv + d));
        ref_o.push_back(r.o[size_t(d)]);
      }
      for (int64_t d = 0; d < p.Dqk; ++d) {  // dq = scale · Σ_i p_i (dp_i − delta) kv_i
        double s = 0;
        for (size_t i = 0; i < r.keys.size(); ++i)
          s += r.p[i] * (r.dp[i] - r.delta) * double(x.kv.get((r.keys[i] * p.B + b) * p.Dqk + d));
        got_dq.push_back(x.dq.get(((t * p.B + b) * p.H + h) * p.Dqk + d));
        ref_dq.push_back(double(p.scale) * s);
      }
      got_lse.push_back(saved.lse.get((b * p.H + h) * p.Tq + t));
      ref_lse.push_back(r.lse);
    }
  // dkv of the last 4 key rows: only query rows ≥ s select key s.
  const int64_t s0 = std::max<int64_t>(0, p.Tk - 4);
  std::vector<double> dkv(size_t((p.Tk - s0) * p.Dqk)), got_dkv;
  for (int64_t t = s0; t < p.Tq; ++t)
    for (int64_t h = 0; h < p.H; ++h) {
      const Row r = fp64_row(x, t, b, h);
      const int64_t qo = ((t * p.B + b) * p.H + h) * p.Dqk, oo = ((t * p.B + b) * p.H + h) * p.Dv;
      for (size_t i = 0; i < r.keys.size(); ++i) {
        if (r.keys[i] < s0) continue;
        const double ds = r.p[i] * (r.dp[i] - r.delta);
        double* row = dkv.data() + (r.keys[i] - s0) * p.Dqk;
        for (int64_t d = 0; d < p.Dqk; ++d)
          row[d] += double(p.scale) * ds * double(x.q.get(qo + d));
        for (int64_t d = 0; d < p.Dv; ++d) row[d] += r.p[i] * double(x.dout.get(oo + d));
      }
    }
  for (int64_t s = s0; s < p.Tk; ++s)
    for (int64_t d = 0; d < p.Dqk; ++d) got_dkv.push_back(x.dkv.get((s * p.B + b) * p.Dqk + d));
  return {count_wrong(got_o, ref_o, tol) + count_wrong(got_lse, ref_lse, tol),
          count_wrong(got_dq, ref_dq, tol) + count_wrong(got_dkv, dkv, tol)};
}

// One dtype's measurements: matmul, forward and backward timed in turns, one of each per repeat.
struct Measurements {
  Timing matmul, fwd, bwd;
  int64_t matmul_wrong = 0;
  Wrong wrong;
};

Measurements measure(const Config& c, DType dt, const Options& o) {
  const MatmulBench mm(c.matmul_n, dt);
  Buffers x = make_buffers(c, dt);
  std::vector<double> t_mm, t_fwd, t_bwd;
  Measurements m;
  for (int i = 0; i < o.warmup + o.repeats; ++i) {
    const bool timed = i >= o.warmup, last = i + 1 == o.warmup + o.repeats;
    const double t0 = now_s();
    mm.run();
    if (timed) t_mm.push_back(now_s() - t0);
    const double t1 = now_s();
    AttentionSaved saved = sparse_attention_forward(x.p);
    const double t2 = now_s();
    sparse_attention_backward(x.p, saved);
    const double t3 = now_s();
    if (timed) t_fwd.push_back(t2 - t1), t_bwd.push_back(t3 - t2);
    if (last) m.wrong = validate(x, saved);
  }
  m.matmul = summarize(t_mm), m.fwd = summarize(t_fwd), m.bwd = summarize(t_bwd);
  m.matmul_wrong = mm.validate();
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = Options::parse(argc, argv);
    const Config c = parse(o.rest);
    SparseAttentionParams shape;
    shape.B = c.B, shape.Tq = shape.Tk = c.T, shape.H = c.H, shape.Dqk = c.Dqk, shape.Dv = c.Dv;
    const int32_t counted = 0;  // the count reads whether idx is given, never what it holds
    shape.topk = c.topk, shape.idx = &counted;
    const double fwd_flops = sparse_attention_forward_flops(shape);
    const Machine m = machine();
    Table table(
        "bench_sparse: sparse latent attention vs oneDNN matmul, FLOPs over the selected keys",
        {fmt::format("shape: B {}, T {}, topk {}, H {}, Dqk {}, Dv {}; matmul {}^3; random "
                     "ascending causal selections",
                     c.B, c.T, c.topk, c.H, c.Dqk, c.Dv, c.matmul_n),
         fmt::format("flops: forward {:.4g}, backward 2.5x forward; matmul 2n^3", fwd_flops),
         fmt::format(
             "{} warm-up + {} timed repeats, matmul and kernel in turns; time = median, spread = "
             "min, max and IQR",
             o.warmup, o.repeats)},
        {{"dtype", "", 6},
         {"kernel", "", 9},
         {"phase", "", 9},
         {"time", "ms", 10, 2},
         {"min", "ms", 10, 2},
         {"max", "ms", 10, 2},
         {"iqr", "ms", 8, 2},
         {"rate", "GFLOP/s", 9, 1},
         {"vs_matmul", "%", 10, 1},
         {"#wrong", "", 7}});
    table.print_header(m);
    nlohmann::json extra = {{"T", c.T}, {"topk", c.topk}, {"B", c.B},
                            {"H", c.H}, {"Dqk", c.Dqk},   {"Dv", c.Dv}};
    for (DType dt : c.dtypes) {
      const std::string dn(dtype_name(dt));
      const Measurements r = measure(c, dt, o);
      const double mm_flops = MatmulBench::flops(c.matmul_n),
                   mm_rate = mm_flops / r.matmul.median_s / 1e9;
      auto row = [&](const std::string& kernel, const std::string& phase, const Timing& t,
                     double flops, int64_t wrong) {
        const double rate = flops / t.median_s / 1e9;
        table.row({dn, kernel, phase, t.median_s * 1e3, t.min_s * 1e3, t.max_s * 1e3,
                   (t.q3_s - t.q1_s) * 1e3, rate, 100.0 * rate / mm_rate},
                  wrong);
      };
      row("matmul", fmt::format("{}^3", c.matmul_n), r.matmul, mm_flops, r.matmul_wrong);
      row("sparse", "forward", r.fwd, fwd_flops, r.wrong.forward);
      row("sparse", "backward", r.bwd, 2.5 * fwd_flops, r.wrong.backward);
    }
    return table.finish(m, o.json_path, extra);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_sparse: %s\n", e.what());
    return e.exit_status();
  }
}
