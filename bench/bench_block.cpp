// bench_block: the MLA block stack's forward + backward on one rank (form explicit, sp 1), timed
// with the shared harness (bench/harness.hpp): warm-up, repeats, median and spread of forward,
// backward and their sum, tokens/s and achieved GFLOP/s, each beside the rate of a plain oneDNN
// matmul (n³, same dtype, bench/matmul_bench.hpp) timed in turns with the block in the same run
// (vs_matmul); JSON beside the table.
//
// It validates before it reports: at startup the same dtype and kernel run a tiny configuration
// that is compared with the fp64 reference (reference/block_ref.hpp) — y, dx and every weight
// gradient — and a wrong result exits 1 before any timing; every timed iteration's y, dx and weight
// gradients must be finite (the #wrong column counts the values that are not).
//
// Not here: other forms or rank counts (laga bench does those), the PyTorch side of the comparison
// (bench/block_vs_torch.py runs both), and elementwise FLOPs (RMSNorm, RoPE, softmax are not
// counted). The FLOP formula and how to read the numbers: docs/benchmarks.md.
#include <omp.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "matmul_bench.hpp"
#include "laga/comm/communicator.hpp"
#include "laga/mla/config.hpp"
#include "laga/core/work.hpp"
#include "laga/core/random.hpp"
#include "laga/core/tensor.hpp"
#include "laga/mla/block.hpp"
#include "laga/driver/plan.hpp"
#include "laga/mla/weights.hpp"
#include "reference/array.hpp"
#include "reference/block_ref.hpp"
#include "verify/compare.hpp"

namespace laga {
namespace {

constexpr uint64_t kSeed = 1234;

int64_t count_non_finite(const Tensor& t) {
  int64_t bad = 0;
  const int64_t n = t.numel();
  if (t.dtype() == DType::f32) {
    const float* p = t.data<float>();
#pragma omp parallel for reduction(+ : bad)
    for (int64_t i = 0; i < n; ++i) bad += !std::isfinite(p[i]);
  } else {
    const bf16* p = t.data<bf16>();
#pragma omp parallel for reduction(+ : bad)
    // exponent all ones: inf or NaN
    for (int64_t i = 0; i < n; ++i) bad += (p[i].bits & 0x7f80u) == 0x7f80u;
  }
  return bad;
}

struct CheckResult {
  verify::Verdict verdict;
  bool pass() const { return verdict.pass; }
};

// The benchmark's code path (same dtype, kernel, form) on a tiny stack against the fp64 reference,
// by the one verification rule (verify/compare.hpp): explicit's error within kExplicitFactor of the
// plain implementations' in the same precision (plain_errors), per tensor.
CheckResult check_against_reference(const MlaConfig& bench_config, Communicator& comm) {
  MlaConfig m = MlaConfig::preset("tiny");
  m.seq_len = 16, m.batch = 2, m.num_layers = 2, m.sp = 1;
  m.form = "explicit", m.kernel = bench_config.kernel, m.dtype = bench_config.dtype;
  m.attn_backward = bench_config.attn_backward;
  m.rope_interleaved = bench_config.rope_interleaved;
  const Config c(m);

  Weights w = allocate_weights(m, "weights");
  init_weights(w, m, kSeed);
  Weights g = zero_grads(m, "grads");
  Tensor x = Tensor::empty({m.seq_len, m.batch, m.hidden_size}, m.dtype, "input.x");
  Tensor dy = Tensor::empty(x.shape(), m.dtype, "input.dy");
  fill_normal(x, kSeed, "x", 1.0);
  fill_normal(dy, kSeed, "dy", 1.0);

  StackSaved saved;
  Tensor y = stack_forward(c, w, x, saved, comm);
  Tensor dx = stack_backward(c, w, saved, dy, g, comm);

  const ref::RefWeights rw = ref::from_weights(w);
  const ref::Array rx = ref::from_tensor(x), rdy = ref::from_tensor(dy);
  const verify::Tensors exact = verify::reference_tensors(m, rw, rx, rdy, std::nullopt);
  CheckResult r;
  r.verdict = verify::explicit_vs_plain(verify::errors(verify::tensors_of(y, dx, g), exact),
                                        verify::plain_errors(m, rw, rx, rdy, exact), m.dtype);
  return r;
}

struct Args {
  std::string model = "small";
  int64_t seq = 2048, batch = 1, layers = 1;
  std::string dtype = "fp32", kernel = "fused", attn_backward = "two-pass";
  int iters = 5, warmup = 1, threads = 0;
  int64_t matmul_n = 2048;
  std::string json;
};

// The block's configuration from the flags, checked.
MlaConfig config_of(const Args& a) {
  MlaConfig c = MlaConfig::preset(a.model);
  c.seq_len = a.seq, c.batch = a.batch, c.num_layers = a.layers, c.sp = 1;
  c.form = "explicit";
  c.kernel = parse_kernel(a.kernel);
  c.dtype = parse_dtype(a.dtype);
  c.attn_backward = parse_attn_backward(a.attn_backward);
  (void)Config(c);
  LAGA_CHECK(a.iters >= 1, "--iters {} must be at least 1", a.iters);
  LAGA_CHECK(a.warmup >= 0, "--warmup {} must be non-negative; try 0 or 1", a.warmup);
  LAGA_CHECK(a.matmul_n >= 64, "--matmul {} must be at least 64; try 2048", a.matmul_n);
  return c;
}

// What the timed iterations measured, per iteration.
struct Timings {
  std::vector<double> fwd_s, bwd_s, tot_s, mm_s;
  // Per timed iteration: the block's time by op class (core/work.hpp) and the rest ("other").
  std::map<std::string, std::vector<double>> class_s;
  std::map<std::string, double> class_flops;
  int64_t mm_wrong = 0;
  std::vector<int64_t> wrong_fwd, wrong_bwd;
  CheckResult check;
  int omp_threads = 0;
};

// The tiny check against the fp64 reference, then (where it passes) the timed iterations, each
// after one matmul, on one rank with `threads` OpenMP threads.
Timings time_block(const MlaConfig& c, const Args& a, int threads) {
  Timings r;
  run_threads(1, [&](Communicator& comm) {
    omp_set_num_threads(threads);
    r.omp_threads = omp_get_max_threads();
    r.check = check_against_reference(c, comm);
    if (!r.check.pass()) return;

    Weights w = allocate_weights(c, "weights");
    init_weights(w, c, kSeed);
    Weights g = zero_grads(c, "grads");
    Tensor x = Tensor::empty({c.seq_len, c.batch, c.hidden_size}, c.dtype, "input.x");
    Tensor dy = Tensor::empty(x.shape(), c.dtype, "input.dy");
    fill_normal(x, kSeed, "x", 1.0);
    fill_normal(dy, kSeed, "dy", 1.0);

    const bench::MatmulBench mm(a.matmul_n, c.dtype);
    for (int it = 0; it < a.warmup + a.iters; ++it) {
      const double tm = bench::now_s();
      mm.run();
      const double tm_s = bench::now_s() - tm;
      g.for_each([](const std::string&, Tensor& t) { t.fill(0.0f); });
      StackSaved saved;
      WorkLedger prof;
      std::optional<WorkScope> scope(std::in_place, prof);
      const double t0 = bench::now_s();
      Tensor y = stack_forward(c, w, x, saved, comm);
      const double t1 = bench::now_s();
      Tensor dx = stack_backward(c, w, saved, dy, g, comm);
      const double t2 = bench::now_s();
      scope.reset();
      if (it < a.warmup) continue;
      const auto totals = prof.totals();
      for (WorkClass op : kWorkClasses) {
        const ClassTotals& t = totals.at(op);
        r.class_s[work_class_name(op)].push_back(t.seconds);
        r.class_flops[work_class_name(op)] = t.flops;
      }
      r.class_s["other"].push_back(t2 - t0 - prof.seconds());
      r.mm_s.push_back(tm_s);
      r.fwd_s.push_back(t1 - t0);
      r.bwd_s.push_back(t2 - t1);
      r.tot_s.push_back(t2 - t0);
      r.wrong_fwd.push_back(count_non_finite(y));
      int64_t bad = count_non_finite(dx);
      g.for_each([&](const std::string&, const Tensor& t) { bad += count_non_finite(t); });
      r.wrong_bwd.push_back(bad);
    }
    r.mm_wrong = mm.validate();
  });
  return r;
}

// The stack's FLOPs as its planned work ledger records them (driver/plan.hpp): projections exact,
// attention by FlashAttention-3's convention.
struct BlockFlops {
  double forward = 0, backward = 0, attention_forward = 0;
};
BlockFlops block_flops(const MlaConfig& c) {
  const WorkLedger w = plan_run(Config(c)).work;
  BlockFlops f;
  f.forward = w.flops(false), f.backward = w.flops(true);
  for (size_t i = 0; i < w.backward_records; ++i)
    if (w.records[i].cls == WorkClass::attention_forward) f.attention_forward += w.records[i].flops;
  return f;
}

std::vector<std::string> header_lines(const MlaConfig& c, const Args& a, const BlockFlops& flops,
                                      double proj_fwd, const CheckResult& check) {
  return {
      fmt::format("model {} (D {}, H {}, Lq {}, Lkv {}, Dn {}, Dr {}, Dv {}), T {}, B {}, layers "
                  "{}, dtype {}, "
                  "kernel {}{}, form explicit, sp 1",
                  c.model, c.hidden_size, c.num_attention_heads, c.q_lora_rank, c.kv_lora_rank,
                  c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.seq_len, c.batch,
                  c.num_layers, dtype_name(c.dtype), kernel_name(c.kernel),
                  c.kernel == Kernel::fused
                      ? fmt::format(" ({} backward)", attn_backward_name(c.attn_backward))
                      : ""),
      fmt::format("{} timed iterations after {} warm-up, each after one {}^3 {} matmul (timed in "
                  "turns); median "
                  "[min, max]; vs_matmul = GFLOP/s over the matmul's median GFLOP/s",
                  a.iters, a.warmup, a.matmul_n, dtype_name(c.dtype)),
      fmt::format(
          "GFLOP: projections exact ({:.2f} fwd), attention FA3 convention ({:.2f} fwd, bwd 2.5x); "
          "elementwise not counted",
          proj_fwd / 1e9, flops.attention_forward / 1e9),
      fmt::format("validated: tiny {} {} stack vs the fp64 reference, {} ({})", dtype_name(c.dtype),
                  kernel_name(c.kernel), verify::summary(check.verdict), check.verdict.rule)};
}

int run(const Args& a) {
  const MlaConfig c = config_of(a);
  int threads = a.threads;
  if (threads <= 0) {
    const char* env = std::getenv("OMP_NUM_THREADS");
    threads = env && std::atoi(env) > 0 ? std::atoi(env)
                                        : int(std::max(1u, std::thread::hardware_concurrency()));
  }

  const BlockFlops flops = block_flops(c);  // projections exact, attention by FA3's convention
  const double proj_fwd = flops.forward - flops.attention_forward,
               total_flops = flops.forward + flops.backward;
  const double tokens = double(c.seq_len) * double(c.batch);
  Timings r = time_block(c, a, threads);
  const CheckResult& check = r.check;

  if (!check.pass()) {
    std::fprintf(stderr,
                 "bench_block: the %s %s block disagrees with the fp64 reference on the tiny "
                 "check: %s (%s); not "
                 "benchmarking\n",
                 std::string(dtype_name(c.dtype)).c_str(),
                 std::string(kernel_name(c.kernel)).c_str(), verify::summary(check.verdict).c_str(),
                 check.verdict.rule.c_str());
    return 1;
  }

  bench::Machine m = bench::machine();
  m.threads = r.omp_threads;
  bench::Table table("bench_block: MLA block stack forward + backward, one rank",
                     header_lines(c, a, flops, proj_fwd, check),
                     {{"phase", "", 14},
                      {"median", "s", 10, 4},
                      {"min", "s", 10, 4},
                      {"max", "s", 10, 4},
                      {"tokens/s", "1/s", 11, 0},
                      {"GFLOP", "1e9", 9, 2},
                      {"GFLOP/s", "1e9/s", 9, 1},
                      {"vs_matmul", "%", 10, 1},
                      {"#wrong", "", 7}});
  table.print_header(m);
  auto sum = [](const std::vector<int64_t>& v) {
    int64_t s = 0;
    for (int64_t x : v) s += x;
    return s;
  };
  const double mm_flops = bench::MatmulBench::flops(a.matmul_n);
  const double mm_rate = mm_flops / bench::summarize(r.mm_s).median_s;
  auto row = [&](const char* phase, const std::vector<double>& s, double f, int64_t wrong) {
    const bench::Timing t = bench::summarize(s);
    const std::string ph(phase);
    const bool block = ph == "fwd" || ph == "bwd" || ph == "total";  // tokens/s is the block's only
    table.row({std::string(phase), t.median_s, t.min_s, t.max_s,
               block ? bench::Cell(tokens / t.median_s) : bench::Cell(std::string("-")), f / 1e9,
               f / 1e9 / t.median_s, 100.0 * f / t.median_s / mm_rate},
              wrong);
  };
  row("matmul", r.mm_s, mm_flops, r.mm_wrong);
  row("fwd", r.fwd_s, flops.forward, sum(r.wrong_fwd));
  row("bwd", r.bwd_s, flops.backward, sum(r.wrong_bwd));
  row("total", r.tot_s, total_flops, 0);
  // The total by op class: where the block's time goes beside the matmul rate (other: elementwise,
  // copies, allocation; no FLOPs counted).
  for (WorkClass op : kWorkClasses)
    row((std::string(" ") + work_class_name(op)).c_str(), r.class_s[work_class_name(op)],
        r.class_flops[work_class_name(op)], 0);
  row(" other", r.class_s["other"], 0, 0);

  nlohmann::json extra = c.to_json();
  extra["threads"] = r.omp_threads;
  extra["warmup"] = a.warmup;
  extra["iters"] = a.iters;
  extra["fwd_s"] = r.fwd_s;
  extra["bwd_s"] = r.bwd_s;
  extra["total_s"] = r.tot_s;
  extra["matmul_n"] = a.matmul_n;
  extra["matmul_s"] = r.mm_s;
  extra["by_class_s"] = r.class_s;
  extra["by_class_flops"] = r.class_flops;
  extra["flops"] = {{"proj_fwd", proj_fwd},
                    {"attn_fwd", flops.attention_forward},
                    {"fwd", flops.forward},
                    {"bwd", flops.backward},
                    {"total", total_flops}};
  extra["check"] = {{"pass", check.verdict.pass},
                    {"worst_tensor", check.verdict.worst},
                    {"worst_ratio", check.verdict.worst_ratio},
                    {"rule", check.verdict.rule}};
  return table.finish(m, a.json, extra);
}

}  // namespace
}  // namespace laga

int main(int argc, char** argv) {
  laga::Args a;
  CLI::App app{
      "bench_block: the MLA block stack's forward + backward on one rank, timed and validated"};
  app.add_option("--model", a.model, "preset: deepseek-v3, deepseek-v2-lite, small, tiny")
      ->capture_default_str();
  app.add_option("--seq", a.seq, "sequence length T")->capture_default_str();
  app.add_option("--batch", a.batch, "micro-batch B")->capture_default_str();
  app.add_option("--layers", a.layers, "stacked blocks L")->capture_default_str();
  app.add_option("--dtype", a.dtype, "fp32 or bf16")->capture_default_str();
  app.add_option("--kernel", a.kernel, "attention kernel: fused or eager")->capture_default_str();
  app.add_option("--attn-backward", a.attn_backward,
                 "the fused kernel's backward order: two-pass, one-pass")
      ->capture_default_str();
  app.add_option("--iters,--repeats", a.iters, "timed iterations")->capture_default_str();
  app.add_option("--matmul", a.matmul_n, "n of the n^3 matmul timed in turns with the block")
      ->capture_default_str();
  app.add_option("--warmup", a.warmup, "untimed iterations first")->capture_default_str();
  app.add_option("--threads", a.threads,
                 "OpenMP threads (default: OMP_NUM_THREADS, else every core)");
  app.add_option("--json", a.json, "write the rows and the per-iteration times here");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    return laga::run(a);
  } catch (const laga::Error& e) {
    std::fprintf(stderr, "bench_block: %s (%s:%d)\n", e.message().c_str(), e.file(), e.line());
    return e.exit_status();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_block: %s\n", e.what());
    return 3;
  }
}
