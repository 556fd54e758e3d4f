// laga bench: the forms timed side by side, each result validated before it is reported
// (docs/benchmarks.md §7 has the tables, the JSON and the validation's argument). cmd_bench
// composes the stages of bench.hpp: setup (bench_setup, bench_reference, check_bench_memory): every
// form's
//   configuration at every T, the reference, and the memory of the whole run, refused above the
//   limit before any work; 0. validation, once (unless --no-validate): verify's rule at a reduced
//   T_v (check_reduced_rule); 1. per T, untimed: one gathered check of every row against the
//   reference (validate_at); 2. per T, the timed rounds (timed_rounds); then the table
//   (bench_context, print_bench_header, bench_rows, print_profile) and the JSON (bench_json).
// --ulysses Pu is laga-ulysses's (as_form; laga in --forms with it names laga-ulysses): its rows
// run, are validated and named as "laga-ulysses (ulysses Pu)"; the other forms run over the whole
// group. A named form that cannot run a T is refused
// (named_form_config). A row's figures: per iteration the slowest rank's time of each phase, then
// the median, min and max over iterations. #wrong counts the failed checks of the row; any makes
// the command exit 1, after every row is printed and the JSON written.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "bench.hpp"
#include "cli.hpp"
#include "commands.hpp"
#include "laga/core/bytes.hpp"
#include "laga/core/error.hpp"
#include "laga/core/machine.hpp"
#include "laga/core/memory.hpp"
#include "laga/core/work.hpp"
#include "laga/driver/calibrate.hpp"
#include "laga/driver/plan.hpp"

namespace laga::cli {

namespace {

// The smallest T ≥ 32·P (at least 64, at most 256) no larger than the shortest bench T for which
// every form's configuration is valid: where verify's rule runs at bench's P, affordably.
int64_t reduced_seq(const std::vector<Config>& configs, int64_t Tmin) {
  const int64_t P = configs[0]->sp;
  const int64_t target = std::clamp<int64_t>(32 * P, 64, 256);
  if (Tmin <= target) return Tmin;
  for (int64_t T = target; T < Tmin; ++T) {
    bool ok = true;
    for (const auto& c : configs) {
      try {
        c.with([&](MlaConfig& m) { m.seq_len = T; });
      } catch (const Error&) {
        ok = false;
        break;
      }
    }
    if (ok) return T;
  }
  return Tmin;
}

struct Stats {
  double median = 0, min = 0, max = 0;
};
Stats stats(const std::vector<double>& v) {
  if (v.empty()) return {};
  return {median(v), *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end())};
}

// What the header and the JSON say of the run beside its rows.
struct BenchContext {
  MachineInfo machine;
  int threads_min = 1 << 30, threads_max = 0;
  std::string threads, link, validation, backend;
  int64_t need = 0, rss = 0, huge = 0;
  PoolStats pool;
};

BenchContext bench_context(const BenchSetup& s, const BenchFlags& b, const std::string& backend,
                           int64_t need, const verify::FormsReport& reduced,
                           const std::vector<std::vector<std::vector<Sample>>>& samples) {
  BenchContext x;
  x.machine = machine_info();
  for (const auto& per_t : samples)
    for (const auto& per_f : per_t)
      for (const auto& y : per_f)
        x.threads_min = std::min(x.threads_min, y.threads_min),
        x.threads_max = std::max(x.threads_max, y.threads_max);
  x.threads = x.threads_min == x.threads_max ? fmt::format("{}", x.threads_max)
                                             : fmt::format("{}–{}", x.threads_min, x.threads_max);
  x.backend = backend;
  x.link = link_description(backend == "mpi" ? LaunchKind::mpi
                            : backend == "threads" ? LaunchKind::threads
                                                   : LaunchKind::host);
  const std::string reference =
      s.ref_P == s.P ? std::string()
                     : fmt::format(" (explicit at P 1 the reference: it cannot run P {}: {})", s.P,
                                   s.explicit_refusal);
  x.validation =
      b.validate
          ? fmt::format(
                "verify's rule at T {} (same model, P, B, L, kernel, dtype): {}; at every T each "
                "form's y, dx and weight gradients finite and, against explicit's, {}{} "
                "(docs/benchmarks.md §7)",
                s.Tv, reduced.pass ? "pass" : "FAIL",
                s.P == 1
                    ? "bit-identical for forms exact at one rank, else within the rule's two "
                      "allowances"
                    : "within the rule's two allowances (form's + explicit's, carried from T_v)",
                reference)
          : "off (--no-validate): rows are not validated";
  x.need = need;
  x.rss = peak_rss_bytes();
  x.pool = pool_stats();  // this process: every rank under threads, rank 0 under MPI
  x.huge = anon_huge_page_bytes();
  return x;
}

void print_bench_header(const BenchSetup& s, const BenchFlags& b, const BenchContext& x) {
  const MlaConfig& c0 = *s.configs[0];
  fmt::print(
      "laga bench: model {}{} P {}{} ({}) B {} L {} kernel {} dtype {}, {} timed iterations "
      "after {} warm-up; per iteration the slowest rank's time of each phase, median and [min, "
      "max] over iterations\n",
      c0.model, attention_only_note(c0), s.P, ulysses_note(s.specs[0]), x.backend, c0.batch,
      c0.num_layers, kernel_name(c0.kernel), dtype_name(s.dtype), b.iters, b.warmup);
  fmt::print("# machine: {}\n", x.machine.line());
  fmt::print(
      "# cpu: {}; threads per rank: {} (OpenMP, as each rank's kernels see it); link: {}; dtype "
      "{}; kernel {}; "
      "commit {}\n",
      x.machine.cpu_model, x.threads, x.link, dtype_name(s.dtype), kernel_name(c0.kernel),
      x.machine.commit);
  fmt::print("# validation: {}\n", x.validation);
  fmt::print(
      "# memory of this process: estimated peak {} ({} bytes), measured peak RSS {} ({} bytes)\n",
      human_bytes(x.need), x.need, human_bytes(x.rss), x.rss);
  if (x.pool.enabled)
    fmt::print(
        "# caching allocator (this process): peak in use {}, peak reserved {}, {} of {} large "
        "allocations "
        "reused\n",
        human_bytes(x.pool.peak_in_use_bytes), human_bytes(x.pool.peak_reserved_bytes), x.pool.hits,
        x.pool.hits + x.pool.misses);
  else
    fmt::print("# caching allocator: off (LAGA_ALLOC_CACHE=off)\n");
  fmt::print("# huge pages: {} (transparent huge pages: {}); this process in huge pages now: {}\n",
             huge_pages_enabled() ? "blocks of 2 MiB or more advised" : "off (LAGA_HUGE_PAGES=off)",
             transparent_huge_pages_mode(), x.huge < 0 ? "unknown" : human_bytes(x.huge));
  fmt::print(
      "# comm: exposed (time a rank waited in attention collectives); TFLOP/s: the group's, of the "
      "FLOPs each "
      "form executes (FlashAttention-3 convention)\n");
  fmt::print(
      "# skew: of comm, the time ranks waited for each other (the most any rank waited beyond the "
      "last "
      "arriver, summed over the collectives): where every rank has the same work, time the host "
      "took from one rank; a sparse form's ranks differ in causal work (laga plan prints each "
      "rank's, by --cp-layout)\n");
  const char* hfmt =
      "# {:>6} {:<18} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>12} {:>8} {:>9} {:>6}\n";
  fmt::print(fmt::runtime(hfmt), "seq", "form", "fwd", "bwd", "comm", "skew", "total", "min", "max",
             "tokens/s", "TFLOP/s", "vs expl.", "#wrong");
  fmt::print(fmt::runtime(hfmt), "", "", "s", "s", "s", "s", "s", "s", "s", "", "", "×", "");
}

// The median of get over a row's iterations.
template <class Get>
Stats phase(const std::vector<Sample>& samples, Get get) {
  std::vector<double> v;
  for (const auto& s : samples) v.push_back(get(s));
  return stats(v);
}
double total_of(const Sample& s) { return s.fwd + s.bwd; }

// A row's attention collectives: their shape, and the median of each time over the iterations.
nlohmann::json collectives_of(const std::vector<Sample>& samples) {
  nlohmann::json coll = nlohmann::json::object();
  std::map<std::string, std::vector<double>> cs, ce, ch;
  std::map<std::string, CollStat> shape;
  for (const auto& s : samples)
    for (const auto& [name, m] : s.coll) {
      cs[name].push_back(m.seconds), ce[name].push_back(m.exposed), ch[name].push_back(m.hidden);
      shape[name] = m;
    }
  for (const auto& [name, m] : shape)
    coll[name] = {{"op", m.op},
                  {"count", m.count},
                  {"tensor_bytes", m.tensor_bytes},
                  {"wire_bytes", m.wire_bytes},
                  {"seconds", stats(cs[name]).median},
                  {"exposed_s", stats(ce[name]).median},
                  {"hidden_s", stats(ch[name]).median}};
  return coll;
}

// Time by op class: the slowest rank's seconds per iteration, median; FLOPs per rank (rank 0's).
// The JSON, and the row's line of the --profile table in *line.
nlohmann::json profile_of(const std::vector<Sample>& samples, double exposed, double total,
                          std::string* line) {
  nlohmann::json prof = nlohmann::json::object();
  for (WorkClass op : kWorkClasses) {
    const char* name = work_class_name(op);
    const double sec = phase(samples, [&](const Sample& x) {
                         return x.op_s.count(name) ? x.op_s.at(name) : 0.0;
                       }).median;
    const nlohmann::json& r0 = samples.back().profile[name];
    const double flops = r0["flops"].get<double>(), bytes = r0["bytes"].get<double>();
    // GFLOP/s, or GB/s for the classes whose work is bytes
    const double rate = sec > 0 ? (by_bytes(op) ? bytes : flops) / sec / 1e9 : 0.0;
    prof[name] = {{"seconds", sec},
                  {"flops", flops},
                  {"bytes", bytes},
                  {"calls", r0["calls"]},
                  {"gflops", by_bytes(op) ? 0.0 : rate},
                  {"GBps", by_bytes(op) ? rate : 0.0}};
    *line += fmt::format(" {:>9.4f} {:>8.1f}", sec, rate);
  }
  const double other = phase(samples, [](const Sample& x) { return x.other_s; }).median;
  prof["other_s"] = other;
  prof["rank0_last_iteration"] = samples.back().profile;
  *line += fmt::format(" {:>9.4f} {:>9.4f} {:>6.1f}", exposed, other, 100 * other / total);
  return prof;
}

nlohmann::json validation_json(const Validation& v) {
  nlohmann::json val = {
      {"validated", v.done}, {"wrong", int64_t(v.failures.size())}, {"failures", v.failures}};
  if (v.done) {
    val["vs_explicit"] = v.vs;
    if (v.vs == "bound")
      val["worst_tensor"] = v.worst, val["worst_ratio"] = v.worst_ratio, val["bounds"] = v.bound;
  }
  return val;
}

// The table's rows (printed as they are made), their JSON, the failure messages and the --profile
// lines.
struct BenchRows {
  nlohmann::json rows = nlohmann::json::array();
  int64_t total_wrong = 0;
  std::vector<std::string> messages, profile_lines;
};

// One row: form fi at seqs[si], printed and added to out; explicit_total: explicit's median total
// at this T (0 when it is not a row).
void bench_row(const BenchSetup& s, const BenchFlags& b, const MlaConfig& c, const std::string& key,
               const std::vector<Sample>& samples, const Validation& v, double explicit_total,
               BenchRows& out) {
  const Stats fw = phase(samples, [](const Sample& x) { return x.fwd; });
  const Stats bw = phase(samples, [](const Sample& x) { return x.bwd; });
  const Stats ex = phase(samples, [](const Sample& x) { return x.exposed; });
  const Stats al = phase(samples, [](const Sample& x) { return x.collective; });
  const Stats hd = phase(samples, [](const Sample& x) { return x.hidden; });
  const Stats tot = phase(samples, total_of);
  const Stats skew = phase(samples, [](const Sample& x) { return x.skew; });
  const PlannedFlops fl = planned_flops(Config(c));
  const double tflops = (fl.forward + fl.backward) / tot.median / 1e12;
  const double tokens_per_s = double(c.seq_len * c.batch) / tot.median;
  const double speedup = explicit_total > 0 ? explicit_total / tot.median : 0.0;
  const int64_t nwrong = int64_t(v.failures.size());
  out.total_wrong += nwrong;
  for (const auto& m : v.failures)
    out.messages.push_back(fmt::format("T {} {}: {}", c.seq_len, key, m));
  fmt::print(
      "  {:>6} {:<18} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} {:>12.1f} "
      "{:>8.4f} {:>9} {:>6}\n",
      c.seq_len, key, fw.median, bw.median, ex.median, skew.median, tot.median, tot.min, tot.max,
      tokens_per_s, tflops, explicit_total > 0 ? fmt::format("{:.3f}", speedup) : "-",
      b.validate ? fmt::format("{}", nwrong) : "-");
  std::string prof_line = fmt::format("  {:>6} {:<18}", c.seq_len, key);
  const nlohmann::json prof = profile_of(samples, ex.median, tot.median, &prof_line);
  out.profile_lines.push_back(prof_line);
  // The kernel the row ran: the form's own (Form::own_kernel), else the config's.
  const std::string_view own = form_of(c).own_kernel();
  const std::string ran(own.empty() ? kernel_name(c.kernel) : own);
  out.rows.push_back({{"form", find_form(c.form).family()},
                      {"variant", c.form},
                      {"label", key},
                      {"ulysses", form_of(c).takes_ulysses() ? c.ulysses : 0},
                      {"seq", c.seq_len},
                      {"sp", c.sp},
                      {"batch", c.batch},
                      {"layers", c.num_layers},
                      {"kernel", kernel_name(c.kernel)},
                      {"attention_kernel", ran},
                      {"dtype", dtype_name(c.dtype)},
                      {"iters", b.iters},
                      {"tokens_per_s", tokens_per_s},
                      {"fwd_s", fw.median},
                      {"fwd_s_min", fw.min},
                      {"fwd_s_max", fw.max},
                      {"bwd_s", bw.median},
                      {"bwd_s_min", bw.min},
                      {"bwd_s_max", bw.max},
                      {"comm_s", ex.median},
                      {"comm_s_min", ex.min},
                      {"comm_s_max", ex.max},
                      {"comm_all_s", al.median},
                      {"comm_hidden_s", hd.median},
                      {"comm_skew_s", skew.median},
                      {"total_s", tot.median},
                      {"total_s_min", tot.min},
                      {"total_s_max", tot.max},
                      {"flops_fwd", fl.forward},
                      {"flops_bwd", fl.backward},
                      {"tflops", tflops},
                      {"speedup_vs_explicit", speedup},
                      {"wrong", nwrong},
                      {"validation", validation_json(v)},
                      {"collectives", collectives_of(samples)},
                      {"profile", prof}});
}

BenchRows bench_rows(const BenchSetup& s, const BenchFlags& b,
                     const std::vector<std::vector<std::vector<Sample>>>& samples,
                     const std::vector<std::vector<Validation>>& checks) {
  BenchRows out;
  for (size_t si = 0; si < s.seqs.size(); ++si) {
    double explicit_total = 0;
    for (size_t fi = 0; fi < s.nf; ++fi)
      if (s.labels[fi] == kBaselineForm) explicit_total = phase(samples[si][fi], total_of).median;
    for (size_t fi = 0; fi < s.nf; ++fi)
      bench_row(s, b, *s.config(si, fi), s.keys[fi], samples[si][fi], checks[si][fi],
                explicit_total, out);
  }
  return out;
}

void print_profile(const std::vector<std::string>& lines) {
  fmt::print(
      "# time by op class (core/work.hpp): per iteration the slowest rank's seconds in each "
      "class, median; GFLOP/s or GB/s: one rank's FLOPs or bytes over those seconds; other: fwd + "
      "bwd − the classes − exposed comm (allocation, the collectives' calls); % of total\n");
  const char* pfmt =
      "# {:>6} {:<18} {:>9} {:>8} {:>9} {:>8} {:>9} {:>8} {:>9} {:>8} {:>9} {:>8} {:>9} {:>9} "
      "{:>6}\n";
  fmt::print(fmt::runtime(pfmt), "seq", "form", "matmul", "GFLOP/s", "attn fwd", "GFLOP/s",
             "attn bwd", "GFLOP/s", "elemwise", "GB/s", "accum", "GB/s", "comm", "other", "%");
  for (const auto& l : lines) fmt::print("{}\n", l);
}

nlohmann::json bench_json(const BenchSetup& s, const BenchFlags& b, const BenchContext& x,
                          const verify::FormsReport& reduced, const BenchRows& r) {
  nlohmann::json reduced_json = nlohmann::json::array();
  for (const auto& k : reduced.cases)
    reduced_json.push_back({{"sp", k.sp},
                            {"form", k.form},
                            {"ulysses", k.ulysses},
                            {"vs", k.vs},
                            {"pass", k.pass},
                            {"worst_tensor", k.worst},
                            {"worst_ratio", k.worst_ratio},
                            {"allowed_ulps", k.allowed_ulps}});
  const MlaConfig& c0 = *s.configs[0];
  return {{"command", "bench"},
          {"machine", x.machine.to_json()},
          {"backend", x.backend},
          {"link", x.link},
          {"threads_per_rank", x.threads_max},
          {"threads_per_rank_min", x.threads_min},
          {"cpu_model", x.machine.cpu_model},
          {"commit", x.machine.commit},
          {"dtype", dtype_name(s.dtype)},
          {"kernel", kernel_name(c0.kernel)},
          {"config", s.configs[0]->to_json()},
          {"iters", b.iters},
          {"warmup", b.warmup},
          {"memory", {{"estimated_peak_bytes", x.need}, {"peak_rss_bytes", x.rss}}},
          {"allocator",
           {{"cache", x.pool.enabled},
            {"peak_in_use_bytes", x.pool.peak_in_use_bytes},
            {"peak_reserved_bytes", x.pool.peak_reserved_bytes},
            {"hits", x.pool.hits},
            {"misses", x.pool.misses},
            {"huge_pages", huge_pages_enabled()},
            {"transparent_huge_pages", transparent_huge_pages_mode()},
            {"anon_huge_page_bytes", x.huge}}},
          {"validation",
           {{"enabled", b.validate},
            {"summary", x.validation},
            {"reduced_seq", b.validate ? s.Tv : 0},
            {"rule", reduced.rule},
            {"reduced_pass", reduced.pass},
            {"reduced_cases", reduced_json}}},
          {"wrong", r.total_wrong},
          {"pass", r.total_wrong == 0},
          {"rows", r.rows}};
}

// Usage error when the memory bench plans (planned_bench_bytes) is over the limit; the planned
// bytes.
int64_t check_bench_memory(const BenchSetup& s, const BenchFlags& b, bool ranks_are_threads) {
  const int64_t need = planned_bench_bytes(s, b.validate, ranks_are_threads);
  const MemLimit limit = mem_limit_of(b.mem_limit, !ranks_are_threads);
  LAGA_CHECK(need <= limit.bytes,
             "refused: this bench is estimated to hold {} ({} bytes: {}the largest run's ranks{} "
             "beside the caching "
             "allocator's blocks) in this process, over {} of {} ({} bytes); lower the largest "
             "--seq, --layers or --sp, "
             "or set --mem-limit",
             human_bytes(need), need, b.validate ? "the validation's fp64 tensors, " : "",
             ranks_are_threads ? ", all threads here" : "", limit.source, human_bytes(limit.bytes),
             limit.bytes);
  return need;
}

}  // namespace

BenchSetup bench_setup(const CommonFlags& f, const BenchFlags& b) {
  BenchSetup s;
  s.seqs = b.seqs;
  for (const auto& name : b.forms) s.labels.push_back(form_label(name, f));
  for (int64_t T : s.seqs) {
    CommonFlags g = f;
    g.seq = T;
    s.specs.push_back(build_spec(g));
    for (const auto& label : s.labels)
      s.configs.push_back(named_form_config(s.specs.back(), label, "--forms"));
  }
  s.nf = s.labels.size();
  for (size_t fi = 0; fi < s.nf; ++fi) s.keys.push_back(displayed_form(*s.configs[fi]));
  if (!b.inject_wrong.empty()) s.wrong = parse_inject_wrong(b.inject_wrong, s.labels, f);
  return s;
}

void bench_reference(BenchSetup& s, bool validate) {
  s.P = s.configs[0]->sp;
  s.dtype = s.configs[0]->dtype;
  const MlaConfig spec0 = as_form(s.specs[0], kBaselineForm);
  s.explicit_refusal = forms_at(spec0).refusal(find_form(kBaselineForm));
  s.ref_P = s.explicit_refusal.empty() ? s.P : 1;
  MlaConfig m = spec0;
  m.sp = s.ref_P;
  s.base.emplace(std::move(m));
  s.Tv = reduced_seq(s.configs, *std::min_element(s.seqs.begin(), s.seqs.end()));
  if (validate && s.ref_P != s.P) {
    // The reference runs whole on one rank: refused up front if its plan does not fit this machine.
    const int64_t Tmax = *std::max_element(s.seqs.begin(), s.seqs.end());
    const PlannedMemory pm = plan_memory(s.base->with([&](MlaConfig& c) { c.seq_len = Tmax; }));
    const int64_t need = pm.baseline_bytes + pm.activation_peak_bytes,
                  have = available_memory_bytes();
    LAGA_CHECK(
        need <= have,
        "bench's validation needs explicit as the reference, and explicit cannot run --sp {} ({}), "
        "so the reference runs at P 1: at --seq {} it plans {} on one rank, more than the {} "
        "available; validate "
        "at a smaller --seq, or pass --no-validate",
        s.P, s.explicit_refusal, Tmax, human_bytes(need), human_bytes(have));
  }
}

int cmd_bench(const CommonFlags& f, const BenchFlags& b) {
  BenchSetup s = bench_setup(f, b);
  const LaunchKind kind = launch_kind(f.comm);
  auto json_out = is_root_process() ? open_output(f.json_path, "--json") : nullptr;
  bench_reference(s, b.validate);
  const int64_t need = check_bench_memory(s, b, kind == LaunchKind::threads);

  // samples[si][fi]: the timed iterations of seqs[si] × labels[fi]; checks[si][fi]: their
  // validation.
  std::vector<std::vector<std::vector<Sample>>> samples(s.seqs.size(),
                                                        std::vector<std::vector<Sample>>(s.nf));
  std::vector<std::vector<Validation>> checks(s.seqs.size(), std::vector<Validation>(s.nf));
  ReducedRule rule;
  std::string backend;
  const bool root = launch(kind, [&](Launcher& launcher) {
    backend = launcher.backend();
    const Progress progress(launcher.is_root());
    if (b.validate) check_reduced_rule(s, f, launcher, progress, rule);
    for (size_t si = 0; si < s.seqs.size(); ++si) {
      if (b.validate) validate_at(s, si, f, rule, launcher, progress, checks[si]);
      timed_rounds(s, si, b, f, launcher, progress, samples[si]);
    }
    progress.done();
  });
  if (!root) return 0;

  const BenchContext x = bench_context(s, b, backend, need, rule.report, samples);
  print_bench_header(s, b, x);
  const BenchRows r = bench_rows(s, b, samples, checks);
  if (b.profile) print_profile(r.profile_lines);
  for (const auto& m : r.messages) fmt::print("# FAIL {}\n", m);
  if (b.validate)
    fmt::print("bench: {}\n",
               r.total_wrong ? fmt::format("{} check(s) failed", r.total_wrong) : "pass");
  if (json_out) *json_out << bench_json(s, b, x, rule.report, r).dump(2) << "\n";
  if (r.total_wrong)
    throw Error(
        ErrorKind::failure, __FILE__, __LINE__,
        fmt::format("bench: {} validation check(s) failed (the #wrong column; messages above)",
                    r.total_wrong));
  return 0;
}

}  // namespace laga::cli
