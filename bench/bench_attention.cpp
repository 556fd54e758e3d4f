// bench_attention: the forward and backward rate of the eager and fused attention kernels, against
// the rate of a plain oneDNN matmul (laga::matmul, n³, same dtype, all threads) measured in the
// same run, in GFLOP/s by FlashAttention-3's convention (attention_forward_flops; backward = 2.5 ×
// forward; causal counts the visible half). Every timed result is validated in fp64 before it is
// reported: sampled rows of o, lse and dq, and the dk, dv rows of the last keys (whose causal
// gradient needs only the last queries), plus sampled matmul entries. Causal attention only.
//
//   bench_attention [--seq 4096] [--batch 1] [--heads 16] [--kv-heads 16] [--dqk 192] [--dv 128]
//                   [--dtype fp32,bf16] [--kernel fused,fused-1p,eager] [--matmul 2048]
//                   [--warmup 1] [--repeats 5] [--json FILE]
// fused-1p is the fused kernel with its one-pass backward (--attn-backward one-pass;
// docs/attention.md §4).
#include <cmath>
#include <cstdio>
#include <sstream>

#include "harness.hpp"
#include "matmul_bench.hpp"
#include "laga/core/random.hpp"
#include "laga/ops/attention.hpp"

using namespace laga;
using namespace laga::bench;

namespace {

// A kernel as timed: the fused kernel with either backward order, or the eager kernel.
struct Variant {
  std::string name;
  Kernel kernel;
  bool one_pass = false;
};
Variant parse_variant(const std::string& name) {
  if (name == "fused-1p") return {name, Kernel::fused, true};
  if (name == "fused" || name == "eager") return {name, parse_kernel(name)};
  LAGA_FAIL_USAGE("unknown --kernel '{}'; valid: fused, fused-1p, eager", name);
}

struct Config {
  int64_t T = 4096, B = 1, Hq = 16, Hkv = 16, Dqk = 192, Dv = 128, matmul_n = 2048;
  std::vector<DType> dtypes = {DType::f32, DType::bf16};
  std::vector<Variant> kernels = {parse_variant("fused"), parse_variant("fused-1p"),
                                  parse_variant("eager")};
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) out.push_back(x);
  return out;
}

Config parse(const std::vector<std::string>& args) {
  Config c;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    LAGA_CHECK(i + 1 < args.size(),
               "unknown or incomplete option '{}'; see the usage at the top of bench_attention.cpp",
               a);
    const std::string v = args[++i];
    if (a == "--seq")
      c.T = whole_number(a, v);
    else if (a == "--batch")
      c.B = whole_number(a, v);
    else if (a == "--heads")
      c.Hq = whole_number(a, v);
    else if (a == "--kv-heads")
      c.Hkv = whole_number(a, v);
    else if (a == "--dqk")
      c.Dqk = whole_number(a, v);
    else if (a == "--dv")
      c.Dv = whole_number(a, v);
    else if (a == "--matmul")
      c.matmul_n = whole_number(a, v);
    else if (a == "--dtype") {
      c.dtypes.clear();
      for (const auto& d : split(v)) c.dtypes.push_back(parse_dtype(d));
    } else if (a == "--kernel") {
      c.kernels.clear();
      for (const auto& k : split(v)) c.kernels.push_back(parse_variant(k));
    } else {
      LAGA_FAIL_USAGE("unknown option '{}'; see the usage at the top of bench_attention.cpp", a);
    }
  }
  return c;
}

// ---- attention --------------------------------------------------------------------------------

struct Buffers {
  Tensor q, k, v, dout, o, dq, dk, dv;  // dense [T, B, H, D]
  AttentionBwdParams p;
};

Buffers make_buffers(const Config& c, DType dt) {
  Buffers x;
  auto input = [&](int64_t H, int64_t D, const char* name) {
    Tensor t = Tensor::empty({c.T, c.B, H, D}, dt, name);
    fill_normal(t, 2, name, 1.0);
    return t;
  };
  x.q = input(c.Hq, c.Dqk, "q"), x.k = input(c.Hkv, c.Dqk, "k"), x.v = input(c.Hkv, c.Dv, "v");
  x.dout = input(c.Hq, c.Dv, "dout");
  x.o = Tensor::empty({c.T, c.B, c.Hq, c.Dv}, dt, "o");
  x.dq = Tensor::empty({c.T, c.B, c.Hq, c.Dqk}, dt, "dq");
  x.dk = Tensor::empty({c.T, c.B, c.Hkv, c.Dqk}, dt, "dk");
  x.dv = Tensor::empty({c.T, c.B, c.Hkv, c.Dv}, dt, "dv");
  AttentionBwdParams& p = x.p;
  p.B = c.B, p.T = c.T, p.Hq = c.Hq, p.Hkv = c.Hkv, p.Dqk = c.Dqk, p.Dv = c.Dv, p.dtype = dt;
  p.scale = float(1.0 / std::sqrt(double(c.Dqk))), p.causal = true;
  p.q = x.q.raw(), p.q_stride = dense_strides(c.B, c.Hq, c.Dqk);
  p.k = x.k.raw(), p.k_stride = dense_strides(c.B, c.Hkv, c.Dqk);
  p.v = x.v.raw(), p.v_stride = dense_strides(c.B, c.Hkv, c.Dv);
  p.o = x.o.raw(), p.o_stride = dense_strides(c.B, c.Hq, c.Dv);
  p.dout = x.dout.raw(), p.dout_stride = dense_strides(c.B, c.Hq, c.Dv);
  p.dq = x.dq.raw(), p.dq_stride = dense_strides(c.B, c.Hq, c.Dqk);
  p.dk = x.dk.raw(), p.dk_stride = dense_strides(c.B, c.Hkv, c.Dqk);
  p.dv = x.dv.raw(), p.dv_stride = dense_strides(c.B, c.Hkv, c.Dv);
  return x;
}

// One causal query row (b, h, t) in fp64 from the stored inputs: probabilities, lse, o, dP, delta.
struct Row {
  std::vector<double> p, dp, o;
  double lse = 0, delta = 0;
};

Row fp64_row(const Buffers& x, int64_t b, int64_t h, int64_t t) {
  const AttentionBwdParams& p = x.p;
  const int64_t hk = h / (p.Hq / p.Hkv), n = t + 1;
  auto qv = [&](int64_t d) { return double(x.q.get(((t * p.B + b) * p.Hq + h) * p.Dqk + d)); };
  Row r;
  r.p.resize(size_t(n)), r.dp.resize(size_t(n)), r.o.assign(size_t(p.Dv), 0.0);
  double mx = -INFINITY, sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    double s = 0;
    for (int64_t d = 0; d < p.Dqk; ++d)
      s += qv(d) * double(x.k.get(((j * p.B + b) * p.Hkv + hk) * p.Dqk + d));
    mx = std::max(mx, r.p[size_t(j)] = double(p.scale) * s);
  }
  for (int64_t j = 0; j < n; ++j) sum += r.p[size_t(j)] = std::exp(r.p[size_t(j)] - mx);
  r.lse = mx + std::log(sum);
  for (int64_t j = 0; j < n; ++j) {
    r.p[size_t(j)] /= sum;
    double dp = 0;
    for (int64_t d = 0; d < p.Dv; ++d) {
      const double vj = x.v.get(((j * p.B + b) * p.Hkv + hk) * p.Dv + d);
      r.o[size_t(d)] += r.p[size_t(j)] * vj;
      dp += double(x.dout.get(((t * p.B + b) * p.Hq + h) * p.Dv + d)) * vj;
    }
    r.dp[size_t(j)] = dp;
    r.delta += r.p[size_t(j)] * dp;
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

Wrong validate(const Buffers& x, const AttentionSaved& saved, Kernel kernel) {
  const AttentionBwdParams& p = x.p;
  const double tol = p.dtype == DType::f32 ? 1e-4 : 3e-2;
  const int64_t b = p.B - 1, g = p.Hq / p.Hkv;
  std::vector<double> got_o, ref_o, got_dq, ref_dq, got_lse, ref_lse;
  for (int64_t h : {int64_t(0), p.Hq - 1})
    for (int64_t t : {int64_t(0), p.T / 3, p.T / 2 + 1, p.T - 1}) {
      const Row r = fp64_row(x, b, h, t);
      const int64_t hk = h / g;
      for (int64_t d = 0; d < p.Dv; ++d) {
        got_o.push_back(x.o.get(((t * p.B + b) * p.Hq + h) * p.Dv + d));
        ref_o.push_back(r.o[size_t(d)]);
      }
      for (int64_t d = 0; d < p.Dqk; ++d) {  // dq = scale · Σ_j p_j (dp_j − delta) k_j
        double s = 0;
        for (int64_t j = 0; j <= t; ++j)
          s += r.p[size_t(j)] * (r.dp[size_t(j)] - r.delta) *
               double(x.k.get(((j * p.B + b) * p.Hkv + hk) * p.Dqk + d));
        got_dq.push_back(x.dq.get(((t * p.B + b) * p.Hq + h) * p.Dqk + d));
        ref_dq.push_back(double(p.scale) * s);
      }
      if (kernel == Kernel::fused) {
        got_lse.push_back(saved.lse.get((b * p.Hq + h) * p.T + t));
        ref_lse.push_back(r.lse);
      }
    }
  // dk, dv of the last keys of kv head Hkv − 1: causal, so only the last queries contribute.
  const int64_t hk = p.Hkv - 1, j0 = std::max<int64_t>(0, p.T - 16);
  std::vector<double> dk(size_t((p.T - j0) * p.Dqk)), dv(size_t((p.T - j0) * p.Dv));
  for (int64_t u = 0; u < g; ++u)
    for (int64_t t = j0; t < p.T; ++t) {
      const int64_t h = hk * g + u;
      const Row r = fp64_row(x, b, h, t);
      for (int64_t j = j0; j <= t; ++j) {
        const double ds = r.p[size_t(j)] * (r.dp[size_t(j)] - r.delta);
        for (int64_t d = 0; d < p.Dqk; ++d)
          dk[size_t((j - j0) * p.Dqk + d)] +=
              double(p.scale) * ds * double(x.q.get(((t * p.B + b) * p.Hq + h) * p.Dqk + d));
        for (int64_t d = 0; d < p.Dv; ++d)
          dv[size_t((j - j0) * p.Dv + d)] +=
              r.p[size_t(j)] * double(x.dout.get(((t * p.B + b) * p.Hq + h) * p.Dv + d));
      }
    }
  std::vector<double> got_dk, got_dv;
  for (int64_t j = j0; j < p.T; ++j) {
    for (int64_t d = 0; d < p.Dqk; ++d)
      got_dk.push_back(x.dk.get(((j * p.B + b) * p.Hkv + hk) * p.Dqk + d));
    for (int64_t d = 0; d < p.Dv; ++d)
      got_dv.push_back(x.dv.get(((j * p.B + b) * p.Hkv + hk) * p.Dv + d));
  }
  return {count_wrong(got_o, ref_o, tol) + count_wrong(got_lse, ref_lse, tol),
          count_wrong(got_dq, ref_dq, tol) + count_wrong(got_dk, dk, tol) +
              count_wrong(got_dv, dv, tol)};
}

// One dtype's measurements. The matmul and every kernel's forward and backward are timed in turns,
// one of each per repeat, so that all of them see the same machine (a shared machine's load
// drifts).
struct Measurements {
  Timing matmul;
  int64_t matmul_wrong = 0;
  std::vector<Timing> fwd, bwd;  // per kernel
  std::vector<Wrong> wrong;
};

Measurements measure(const Config& c, DType dt, const Options& o) {
  const MatmulBench mm(c.matmul_n, dt);
  // shared by the kernels; each is validated right after its last run
  Buffers x = make_buffers(c, dt);
  const size_t nk = c.kernels.size();
  std::vector<double> t_mm;
  std::vector<std::vector<double>> t_fwd(nk), t_bwd(nk);
  Measurements m;
  m.wrong.resize(nk);
  for (int i = 0; i < o.warmup + o.repeats; ++i) {
    const bool timed = i >= o.warmup, last = i + 1 == o.warmup + o.repeats;
    const double t0 = now_s();
    mm.run();
    if (timed) t_mm.push_back(now_s() - t0);
    for (size_t k = 0; k < nk; ++k) {
      const Kernel kernel = c.kernels[k].kernel;
      x.p.one_pass_backward = c.kernels[k].one_pass;
      const double t1 = now_s();
      AttentionSaved saved = attention_forward(kernel, x.p);
      const double t2 = now_s();
      attention_backward(kernel, x.p, saved);
      const double t3 = now_s();
      if (timed) t_fwd[k].push_back(t2 - t1), t_bwd[k].push_back(t3 - t2);
      if (last) m.wrong[k] = validate(x, saved, kernel);
    }
  }
  m.matmul = summarize(t_mm);
  m.matmul_wrong = mm.validate();
  for (size_t k = 0; k < nk; ++k)
    m.fwd.push_back(summarize(t_fwd[k])), m.bwd.push_back(summarize(t_bwd[k]));
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = Options::parse(argc, argv);
    const Config c = parse(o.rest);
    const double fwd_flops = attention_forward_flops(c.B, c.Hq, c.T, c.Dqk, c.Dv, true);
    const Machine m = machine();
    Table table(
        "bench_attention: causal attention vs oneDNN matmul, FlashAttention-3 FLOP convention",
        {fmt::format("shape: B {}, T {}, Hq {}, Hkv {}, Dqk {}, Dv {}; matmul {}^3; causal", c.B,
                     c.T, c.Hq, c.Hkv, c.Dqk, c.Dv, c.matmul_n),
         fmt::format("flops: forward {:.4g}, backward 2.5x forward; matmul 2n^3", fwd_flops),
         fmt::format(
             "{} warm-up + {} timed repeats, matmul and kernels in turns; time = median, spread = "
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
    nlohmann::json extra = {{"T", c.T},     {"B", c.B},     {"Hq", c.Hq},
                            {"Hkv", c.Hkv}, {"Dqk", c.Dqk}, {"Dv", c.Dv}};
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
      for (size_t k = 0; k < c.kernels.size(); ++k) {
        const std::string& kn = c.kernels[k].name;
        row(kn, "forward", r.fwd[k], fwd_flops, r.wrong[k].forward);
        row(kn, "backward", r.bwd[k], 2.5 * fwd_flops, r.wrong[k].backward);
      }
    }
    return table.finish(m, o.json_path, extra);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_attention: %s\n", e.what());
    return e.exit_status();
  }
}
