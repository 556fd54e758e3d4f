// laga bench: the forms timed side by side, each result validated before it is reported
// (docs/benchmarks.md §7 has the tables, the JSON and the validation's argument).
//
//   0. validation, once (unless --no-validate): verify's rule (verify::check_forms, the rule of
//      verify/compare.hpp) on the same model, P, B, L, kernel and dtype at a reduced T_v, where the
//      fp64 reference is affordable; it yields, per tensor, each form's and explicit's allowance in
//      ulps of the tensor's scale.
//   1. per T, untimed: one gathered run of explicit and of every form; y, dx and every weight gradient
//      must be finite, and agree with explicit's: bit for bit for a form exact at one rank at P = 1,
//      else |form − explicit| ≤ (allowance_form + allowance_explicit) × g(T) ulps × max|explicit|
//      (the triangle inequality through the fp64 reference, with both allowances carried from T_v).
//      Where explicit cannot run P (P ∤ H: only the ring forms and laga --ulysses can), the reference
//      is explicit at P 1, as verify holds the forms to explicit's error at P 1 there; a reference
//      whose planned memory does not fit is a usage error, never a skipped check.
//   2. per T, --warmup untimed rounds, then --iters timed rounds; each round runs every form once in
//      turn, so machine noise spreads over the forms alike.
// --ulysses Pu is laga's (as_form): its rows run and are validated as "laga (ulysses Pu)"; the other
// forms run over the whole group. A named form that cannot run a T is refused (named_form_config).
// A row's figures: per iteration the slowest rank's time of each phase, then the median, min and max
// over iterations. #wrong counts the failed checks of the row; any makes the command exit 1, after
// every row is printed and the JSON written. Not here: the collectives alone (laga bench-comm).
#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>

#include "cli.hpp"
#include "commands.hpp"
#include "laga/core/error.hpp"
#include "laga/core/machine.hpp"
#include "laga/core/profile.hpp"
#include "laga/core/bytes.hpp"
#include "laga/core/memory.hpp"
#include "laga/driver/launch.hpp"
#include "laga/driver/plan.hpp"
#include "laga/mla/flops.hpp"
#include "verify/compare.hpp"
#include "verify/forms.hpp"

namespace laga::cli {

namespace {

struct Stats {
  double median = 0, min = 0, max = 0;
};
Stats stats(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v.front(), v.back()};
}

// One collective tensor name's records in one run of one rank (summed over the layers), or, across
// ranks, the largest of each figure.
struct CollStat {
  std::string op;
  int64_t count = 0, tensor_bytes = 0, wire_bytes = 0;
  double seconds = 0, exposed = 0, hidden = 0;  // issued → completed; waited for; seconds − waited
};

// One timed iteration: the slowest rank's figure of each phase (each maximised separately).
struct Sample {
  double fwd = 0, bwd = 0, exposed = 0, collective = 0, hidden = 0;
  // The slowest rank's seconds per op class (core/profile.hpp), and the rest of its fwd + bwd beyond
  // those and its exposed communication ("other": elementwise work, copies, allocation, skew).
  std::map<std::string, double> op_s;
  double other_s = 0;
  // The time ranks waited for each other (peer_wait_skew): the most any rank waited beyond the last
  // arriver's wait, summed over the attention collectives. Every form gives each
  // rank the same work, so this is time the host took from one rank (a busy neighbour on its core, an
  // interrupt) that its peers then waited for; it is part of `exposed`, and the model has no term for
  // it (docs/model.md §4).
  double skew = 0;
  nlohmann::json profile;  // rank 0's whole profile, FLOPs and matmul shapes included
  int threads_min = 1 << 30, threads_max = 0;
  std::map<std::string, CollStat> coll;
};

// The attention collectives of one rank's ledger, by tensor name ("q", "latent", "dq", ...).
nlohmann::json rank_collectives(const std::vector<CollectiveRecord>& recs) {
  std::map<std::string, CollStat> by;
  for (const auto& r : recs) {
    if (is_grad_sync(r)) continue;
    std::string key = r.tensor;
    if (by.count(key) && by[key].op != collective_name(r.op)) key += "@" + std::string(collective_name(r.op));
    CollStat& s = by[key];
    s.op = collective_name(r.op);
    s.count += 1, s.tensor_bytes += r.tensor_bytes, s.wire_bytes += r.wire_bytes;
    s.seconds += r.seconds, s.exposed += r.wait_s, s.hidden += std::max(0.0, r.seconds - r.wait_s);
  }
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, s] : by) j[k] = {s.op, s.count, s.tensor_bytes, s.wire_bytes, s.seconds, s.exposed, s.hidden};
  return j;
}

// One timed run of c on every rank of a group; the slowest rank's figures, on the group's rank 0.
Sample timed_run(Launcher& launcher, const Config& c, const RunOptions& opt, double timeout_s) {
  Sample s;
  launcher.run(int(c->sp), [&](Communicator& comm) {
    const RankResult r = run_rank(c, opt, comm);
    double all_s = 0, wait_s = 0;
    std::vector<double> waits;  // per attention collective, in issue order (the same on every rank)
    for (const auto& rec : r.collectives)
      if (!is_grad_sync(rec)) all_s += rec.seconds, wait_s += rec.wait_s, waits.push_back(rec.wait_s);
    const nlohmann::json mine = {{"fwd", r.forward_s}, {"bwd", r.backward_s}, {"wait", wait_s}, {"all", all_s},
                                 {"threads", omp_get_max_threads()}, {"coll", rank_collectives(r.collectives)},
                                 {"profile", r.profile.to_json()},
                                 {"other", r.forward_s + r.backward_s - wait_s - r.profile.seconds()}, {"waits", waits}};
    const std::vector<nlohmann::json> all = gather_json(comm, mine);
    if (comm.rank() != 0) return;
    std::vector<std::vector<double>> waits_by_rank;
    for (const auto& j : all) waits_by_rank.push_back(j["waits"].get<std::vector<double>>());
    s.skew = peer_wait_skew(waits_by_rank);
    for (const auto& j : all) {
      s.fwd = std::max(s.fwd, j["fwd"].get<double>()), s.bwd = std::max(s.bwd, j["bwd"].get<double>());
      s.exposed = std::max(s.exposed, j["wait"].get<double>());
      s.collective = std::max(s.collective, j["all"].get<double>());
      s.hidden = std::max(s.hidden, std::max(0.0, j["all"].get<double>() - j["wait"].get<double>()));
      for (ProfiledOp op : kProfiledOps) {
        double& m = s.op_s[profiled_op_name(op)];
        m = std::max(m, j["profile"][profiled_op_name(op)]["seconds"].get<double>());
      }
      s.other_s = std::max(s.other_s, j["other"].get<double>());
      if (s.profile.is_null()) s.profile = j["profile"];
      s.threads_min = std::min(s.threads_min, j["threads"].get<int>());
      s.threads_max = std::max(s.threads_max, j["threads"].get<int>());
      for (const auto& [name, v] : j["coll"].items()) {
        CollStat& m = s.coll[name];
        m.op = v[0].get<std::string>();
        m.count = std::max(m.count, v[1].get<int64_t>());
        m.tensor_bytes = std::max(m.tensor_bytes, v[2].get<int64_t>());
        m.wire_bytes = std::max(m.wire_bytes, v[3].get<int64_t>());
        m.seconds = std::max(m.seconds, v[4].get<double>());
        m.exposed = std::max(m.exposed, v[5].get<double>());
        m.hidden = std::max(m.hidden, v[6].get<double>());
      }
    }
  }, timeout_s);
  return s;
}

// One untimed run of c with the whole tensors gathered: y, dx and the weight gradients, on the root.
verify::Tensors gathered_run(Launcher& launcher, const Config& c, uint64_t seed, double timeout_s) {
  RunOptions opt;
  opt.seed = seed, opt.grad_sync = true, opt.gather_tensors = true;
  verify::Tensors out;
  launcher.run(int(c->sp), [&](Communicator& comm) {
    RankResult r = run_rank(c, opt, comm);
    if (comm.rank() == 0) out = verify::tensors_of(r.y, r.dx, r.grads);
  }, timeout_s);
  release_free_memory();  // untimed: what this run cached does not sit beside the next (planned_bench_bytes)
  return out;
}

// What bench holds at its peak in this process, planned before anything is allocated (refused above
// the memory limit, exit 2, rather than killed):
//   validation (b.validate): verify's estimate at T_v over {P} (planned_verify_bytes); then per T,
//     the root's fp64 whole outputs of the reference and of one form (8 bytes × (weights + 2·T·B·D)
//     each) beside one gathered run of either (planned_run_bytes); gathered_run releases the cache
//     and the C heap after each of those runs;
//   the timed rounds: one run at a time, its blocks at most kPoolFitNum / kPoolFitDen of what it asked
//     (a cached block serves a request of 7/8 of its size), beside the caching allocator's cached
//     blocks: in all at most pool_bound(cap, its peak in use) (memory.hpp), and at most what it could
//     have cached since it was last emptied (the timed runs since the last gathered run);
//   the process itself (verify::kVerifyProcessBytes).
int64_t planned_bench_bytes(const std::vector<Config>& configs, const std::vector<int64_t>& seqs, const Config& base,
                            int64_t Tv, bool validate, bool threads) {
  const size_t nf = configs.size() / seqs.size();
  const int64_t P = configs[0]->sp;
  int64_t ulysses = 0;  // laga's --ulysses row, as check_forms runs it (FormsOptions::ulysses)
  for (size_t fi = 0; fi < nf; ++fi)
    if (configs[fi]->hybrid()) ulysses = configs[fi]->ulysses;
  auto fit = [](int64_t bytes) { return bytes * kPoolFitNum / kPoolFitDen; };  // what a planned run holds in blocks
  int64_t need = 0, peak_in_use = 0, cacheable = 0;
  if (validate)
    need = verify::planned_verify_bytes(base.with([&](MlaConfig& m) { m.seq_len = Tv; }), {P}, threads, ulysses) -
           verify::kVerifyProcessBytes;
  for (size_t si = 0; si < seqs.size(); ++si) {
    if (validate) {
      const Config ref = base.with([&](MlaConfig& m) { m.seq_len = seqs[si]; });
      int64_t gathered = verify::planned_run_bytes(ref, threads, true);
      for (size_t fi = 0; fi < nf; ++fi)
        gathered = std::max(gathered, verify::planned_run_bytes(configs[si * nf + fi], threads, true));
      need = std::max(need, 2 * 8 * verify::output_count(*ref) + gathered);
      peak_in_use = std::max(peak_in_use, fit(gathered));
      cacheable = 0;  // gathered_run empties the cache
    }
    int64_t largest = 0;
    for (size_t fi = 0; fi < nf; ++fi) {
      const int64_t r = fit(verify::planned_run_bytes(configs[si * nf + fi], threads, false));
      largest = std::max(largest, r), cacheable += r;
    }
    peak_in_use = std::max(peak_in_use, largest);
    need = std::max(need, std::min(pool_bound(pool_stats().cap_bytes, peak_in_use), largest + cacheable));
  }
  return verify::kVerifyProcessBytes + need;
}

// The failed checks of one row, and what its agreement check measured.
struct Validation {
  bool done = false;
  std::string vs;                       // "bitwise" | "bound" | "reference" (explicit itself)
  std::vector<std::string> failures;   // one message per failed check
  std::string worst;                    // the tensor nearest its bound (vs "bound")
  double worst_ratio = 0;               // its max|form − explicit| / bound
  std::map<std::string, double> bound;  // per tensor, the absolute bound (vs "bound")
};

// Non-finite values per tensor: one failed check per tensor that holds any.
void check_finite_tensors(const verify::Tensors& t, const std::string& who, Validation& v) {
  for (const auto& [name, a] : t) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < a.numel(); ++i)
      if (!std::isfinite(a[i])) bad += 1, first = first < 0 ? i : first;
    if (bad) v.failures.push_back(fmt::format("{}: {} non-finite value(s) in {} (first {}[{}] = {})", who, bad, name, name,
                                              first, a[first]));
  }
}

// The growth, from T_v to T, of the fp32-accumulated part of an allowance given in ulps of the dtype:
// the probabilistic rounding-error bound of a sum of n terms grows as √n (Higham & Mary 2019), and
// the reductions that lengthen with T (attention over ≤ T keys, weight gradients over T·B rows) are
// n ∝ T; storage rounding (one rounding per stored value) does not grow. In fp32 the whole allowance
// grows by √(T/T_v); in bf16 only its fp32 share, 2⁻¹⁶ of it.
double growth(DType dtype, int64_t T, int64_t Tv) {
  const double r = std::sqrt(double(T) / double(Tv));
  return 1.0 + (r - 1.0) * verify::eps(DType::f32) / verify::eps(dtype);
}

// The smallest T ≥ 32·P (at least 64, at most 256) no larger than the shortest bench T for which every
// form's configuration is valid: where verify's rule runs at bench's P, affordably.
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

// The line on stderr rewritten in place with the run in progress; only on a terminal.
class Progress {
 public:
  explicit Progress(bool root) : on_(root && isatty(STDERR_FILENO)), t0_(std::chrono::steady_clock::now()) {}
  void show(int64_t T, const std::string& form, const std::string& what) const {
    if (!on_) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    std::fprintf(stderr, "\r\033[Kbench: T %lld %s %s, %.1f s elapsed", (long long)T, form.c_str(), what.c_str(), s);
    std::fflush(stderr);
  }
  void done() const {
    if (on_) std::fprintf(stderr, "\r\033[K"), std::fflush(stderr);
  }

 private:
  bool on_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

int cmd_bench(const CommonFlags& f, const BenchFlags& b) {
  const std::vector<int64_t>& seqs = b.seqs;
  std::vector<std::string> labels;  // registered labels
  for (const auto& name : b.forms) labels.push_back(form_label(name, f.absorbed_kv));
  std::vector<Config> configs;  // [si * nf + fi]
  std::vector<MlaConfig> specs;  // [si]: the flags' configuration (--ulysses as given), every form's source
  for (int64_t T : seqs) {
    CommonFlags g = f;
    g.seq = T;
    specs.push_back(build_spec(g));
    for (const auto& label : labels) configs.push_back(named_form_config(specs.back(), label, "--forms"));
  }
  // How the rows name their forms: "laga (ulysses Pu)" for laga with --ulysses Pu < P.
  std::vector<std::string> keys;
  for (size_t fi = 0; fi < labels.size(); ++fi) keys.push_back(displayed_form(*configs[fi]));
  std::optional<InjectWrong> wrong;
  if (!b.inject_wrong.empty()) wrong = parse_inject_wrong(b.inject_wrong, labels, f.absorbed_kv);
  const LaunchKind kind = launch_kind(f.comm);
  auto json_out = is_root_process() ? open_output(f.json_path, "--json") : nullptr;
  const size_t nf = labels.size();
  const int64_t P = configs[0]->sp;
  const DType dtype = configs[0]->dtype;
  // The reference: explicit at P, or at P 1 where it cannot run P (verify's rule there).
  const MlaConfig spec0 = as_form(specs[0], kBaselineForm);
  const std::string explicit_refusal = forms_at(spec0).refusal(find_form(kBaselineForm));
  const int64_t ref_P = explicit_refusal.empty() ? P : 1;
  const Config base = [&] {
    MlaConfig m = spec0;
    m.sp = ref_P;
    return Config(std::move(m));
  }();
  const int64_t Tv = reduced_seq(configs, *std::min_element(seqs.begin(), seqs.end()));
  if (b.validate && ref_P != P) {
    // The reference runs whole on one rank: refused up front if its plan does not fit this machine.
    const int64_t Tmax = *std::max_element(seqs.begin(), seqs.end());
    const PlannedMemory m = plan_memory(base.with([&](MlaConfig& c) { c.seq_len = Tmax; }));
    const int64_t need = m.baseline_bytes + m.activation_peak_bytes, have = available_memory_bytes();
    LAGA_CHECK(need <= have, "bench's validation needs explicit as the reference, and explicit cannot run --sp {} ({}), "
               "so the reference runs at P 1: at --seq {} it plans {} on one rank, more than the {} available; validate "
               "at a smaller --seq, or pass --no-validate", P, explicit_refusal, Tmax, human_bytes(need), human_bytes(have));
  }

  const bool ranks_are_threads = kind == LaunchKind::threads;
  const int64_t need = planned_bench_bytes(configs, seqs, base, Tv, b.validate, ranks_are_threads);
  const MemLimit limit = mem_limit_of(b.mem_limit, !ranks_are_threads);
  LAGA_CHECK(need <= limit.bytes,
             "refused: this bench is estimated to hold {} ({} bytes: {}the largest run's ranks{} beside the caching "
             "allocator's blocks) in this process, over {} of {} ({} bytes); lower the largest --seq, --layers or --sp, "
             "or set --mem-limit",
             human_bytes(need), need, b.validate ? "the validation's fp64 tensors, " : "", ranks_are_threads ? ", all threads here" : "",
             limit.source, human_bytes(limit.bytes), limit.bytes);

  RunOptions opt;
  opt.seed = f.seed;
  opt.grad_sync = false;
  // samples[si][fi]: the timed iterations of seqs[si] × labels[fi].
  std::vector<std::vector<std::vector<Sample>>> samples(seqs.size(), std::vector<std::vector<Sample>>(nf));
  std::vector<std::vector<Validation>> checks(seqs.size(), std::vector<Validation>(nf));
  verify::FormsReport reduced;
  std::string backend;
  const bool root = launch(kind, [&](Launcher& launcher) {
    backend = launcher.backend();
    const Progress progress(launcher.is_root());
    // The reduced-T cases at P, by the rows' names (verify names laga --ulysses' row as the rows do),
    // and explicit's at the reference's P.
    std::map<std::string, const verify::FormCase*> rule_case, bitwise_case;
    const verify::FormCase* ref_case = nullptr;
    if (b.validate) {
      progress.show(Tv, "every form", "verify's rule (fp64 reference)");
      verify::FormsOptions vo;
      vo.seed = f.seed, vo.timeout_s = f.timeout_s;
      for (size_t fi = 0; fi < labels.size(); ++fi) {
        if (configs[fi]->hybrid()) vo.ulysses = configs[fi]->ulysses;  // laga's row: FormsOptions::ulysses
        else if (labels[fi] != kBaselineForm) vo.forms.push_back(labels[fi]);
      }
      if (vo.forms.empty()) vo.forms.push_back(std::string(kBaselineForm));  // explicit alone: check no other
      reduced = verify::check_forms(base.with([&](MlaConfig& m) { m.seq_len = Tv; }), {P}, launcher, vo);
      for (const auto& k : reduced.cases) {
        if (k.sp == P && k.vs != "not run") (k.vs == "fp64" ? rule_case : bitwise_case)[k.form] = &k;
        if (k.sp == ref_P && k.form == kBaselineForm && k.vs == "fp64") ref_case = &k;
      }
    }
    for (size_t si = 0; si < seqs.size(); ++si) {
      const int64_t T = seqs[si];
      if (b.validate) {
        progress.show(T, ref_P == P ? std::string(kBaselineForm) : "explicit at P 1", "validation run");
        const Config ec = base.with([&](MlaConfig& m) { m.seq_len = T; });
        verify::Tensors e = gathered_run(launcher, ec, f.seed, f.timeout_s);
        for (size_t fi = 0; fi < nf; ++fi) {
          const Config& c = configs[si * nf + fi];
          const std::string& label = labels[fi];
          const std::string& key = keys[fi];
          const bool is_explicit = label == kBaselineForm;
          verify::Tensors mine;
          if (!is_explicit) {
            progress.show(T, key, "validation run");
            mine = gathered_run(launcher, c, f.seed, f.timeout_s);
          }
          if (!launcher.is_root()) continue;
          verify::Tensors& t = is_explicit ? e : mine;
          if (wrong && wrong->form == label) {
            ref::Array& y = t.at("y");
            double scale = 0;
            for (double v : y.data) scale = std::max(scale, std::abs(v));
            y[y.numel() / 2] += wrong->ulps * verify::eps(dtype) * scale;
          }
          Validation& v = checks[si][fi];
          v.done = true;
          // The reduced-T rule, for this form (its failure is every row's of the form). A case missing
          // (the form or the reference not run at T_v) is a failure naming why, never a pass.
          auto missing = [&](const std::string& who, int64_t at_P) {
            std::string why = "no case in its report";
            for (const auto& k : reduced.cases)
              if (k.sp == at_P && k.form == who && k.vs == "not run") why = k.criterion;
            return fmt::format("verify's rule at T {} has no verdict for {} at P {} ({}): no bound to validate "
                               "against", Tv, who, at_P, why);
          };
          const auto rk = rule_case.find(key);
          if (rk == rule_case.end()) v.failures.push_back(missing(key, P));
          else if (!rk->second->pass)
            v.failures.push_back(fmt::format("verify's rule at T {}: FAIL ({} at {:.3g} of allowed; {})", Tv,
                                             rk->second->worst, rk->second->worst_ratio, rk->second->criterion));
          if (const auto bk = bitwise_case.find(key); bk != bitwise_case.end() && !bk->second->pass)
            v.failures.push_back(fmt::format("verify at T {}: not bit-identical to explicit at P 1 ({})", Tv,
                                             bk->second->worst));
          // explicit is every bound's baseline: when it is not a row of its own, its failure is every row's.
          if (!ref_case && !is_explicit)
            v.failures.push_back(missing(std::string(kBaselineForm), ref_P));
          else if (!is_explicit && !ref_case->pass &&
                   std::find(labels.begin(), labels.end(), kBaselineForm) == labels.end())
            v.failures.push_back(fmt::format("explicit, the baseline, fails verify's rule at T {} (P {}: {} at {:.3g} of "
                                             "allowed)", Tv, ref_P, ref_case->worst, ref_case->worst_ratio));
          check_finite_tensors(t, key, v);
          if (is_explicit) {
            v.vs = "reference";
            continue;
          }
          if (P == 1 && form_of(*c).exact_at_one_rank()) {
            v.vs = "bitwise";
            std::string where;
            if (!verify::bitwise_equal(t, e, &where))
              v.failures.push_back(fmt::format("not bit-identical to explicit at P 1 (first difference: {})", where));
            continue;
          }
          v.vs = "bound";
          if (rk == rule_case.end() || !ref_case) continue;  // no allowances: failed above
          const auto& ek = ref_case->allowed_ulps;
          const auto& fk = rk->second->allowed_ulps;
          const double g = growth(dtype, T, Tv);
          for (const auto& [name, a] : t) {
            const ref::Array& x = e.at(name);
            LAGA_ASSERT(x.shape == a.shape && fk.count(name) && ek.count(name), "tensor {} does not match", name);
            double d = 0, scale = 0;
            bool finite = true;
            for (int64_t i = 0; i < a.numel(); ++i) {
              finite = finite && std::isfinite(a[i]) && std::isfinite(x[i]);
              d = std::max(d, std::abs(a[i] - x[i])), scale = std::max(scale, std::abs(x[i]));
            }
            if (!finite) continue;  // counted by the finiteness checks (this form's or explicit's row)
            const double ulps = (fk.at(name) + ek.at(name)) * g;
            const double bound = ulps * verify::eps(dtype) * scale;
            const double ratio = bound > 0 ? d / bound : (d > 0 ? INFINITY : 0.0);
            v.bound[name] = bound;
            if (v.worst.empty() || ratio > v.worst_ratio) v.worst = name, v.worst_ratio = ratio;
            if (ratio > 1)
              v.failures.push_back(fmt::format("{} vs explicit{}: max|Δ {}| = {:.3e} > bound {:.3e} ({:.1f} ulp × max|{}| "
                                               "{:.3e}; {:.2f} of it)", key, ref_P == P ? "" : " at P 1", name, d, bound,
                                               ulps, name, scale, ratio));
          }
        }
      }
      for (int64_t it = 0; it < b.warmup + b.iters; ++it)
        for (size_t fi = 0; fi < nf; ++fi) {
          progress.show(T, keys[fi], it < b.warmup ? fmt::format("warm-up {}/{}", it + 1, b.warmup)
                                                     : fmt::format("iteration {}/{}", it - b.warmup + 1, b.iters));
          const Sample s = timed_run(launcher, configs[si * nf + fi], opt, f.timeout_s);
          if (it >= b.warmup) samples[si][fi].push_back(s);
        }
    }
    progress.done();
  });
  if (!root) return 0;

  const MachineInfo machine = machine_info();
  int threads_min = 1 << 30, threads_max = 0;
  for (const auto& per_t : samples)
    for (const auto& per_f : per_t)
      for (const auto& s : per_f) threads_min = std::min(threads_min, s.threads_min), threads_max = std::max(threads_max, s.threads_max);
  const std::string threads =
      threads_min == threads_max ? fmt::format("{}", threads_max) : fmt::format("{}–{}", threads_min, threads_max);
  const std::string link = link_description(backend == "mpi");
  const std::string reference =
      ref_P == P ? std::string() : fmt::format(" (explicit at P 1 the reference: it cannot run P {}: {})", P, explicit_refusal);
  const std::string validation =
      b.validate ? fmt::format("verify's rule at T {} (same model, P, B, L, kernel, dtype): {}; at every T each "
                               "form's y, dx and weight gradients finite and, against explicit's, {}{} "
                               "(docs/benchmarks.md §7)",
                               Tv, reduced.pass ? "pass" : "FAIL",
                               P == 1 ? "bit-identical for forms exact at one rank, else within the rule's two allowances"
                                      : "within the rule's two allowances (form's + explicit's, carried from T_v)",
                               reference)
                 : "off (--no-validate): rows are not validated";
  const MlaConfig& c0 = *configs[0];
  fmt::print("laga bench: model {} P {}{} ({}) B {} L {} kernel {} dtype {}, {} timed iterations after {} warm-up; per "
             "iteration the slowest rank's time of each phase, median and [min, max] over iterations\n",
             c0.model, P, ulysses_note(specs[0]), backend, c0.batch, c0.num_layers, kernel_name(c0.kernel),
             dtype_name(dtype), b.iters, b.warmup);
  fmt::print("# machine: {}\n", machine.line());
  fmt::print("# cpu: {}; threads per rank: {} (OpenMP, as each rank's kernels see it); link: {}; dtype {}; kernel {}; "
             "commit {}\n", machine.cpu_model, threads, link, dtype_name(dtype), kernel_name(c0.kernel), machine.commit);
  fmt::print("# validation: {}\n", validation);
  const int64_t rss = peak_rss_bytes();
  fmt::print("# memory of this process: estimated peak {} ({} bytes), measured peak RSS {} ({} bytes)\n",
             human_bytes(need), need, human_bytes(rss), rss);
  const PoolStats pool = pool_stats();  // this process: every rank under threads, rank 0 under MPI
  if (pool.enabled)
    fmt::print("# caching allocator (this process): peak in use {}, peak reserved {}, {} of {} large allocations "
               "reused\n", human_bytes(pool.peak_in_use_bytes), human_bytes(pool.peak_reserved_bytes), pool.hits,
               pool.hits + pool.misses);
  else
    fmt::print("# caching allocator: off (LAGA_ALLOC_CACHE=off)\n");
  const int64_t huge = anon_huge_page_bytes();
  fmt::print("# huge pages: {} (transparent huge pages: {}); this process in huge pages now: {}\n",
             huge_pages_enabled() ? "blocks of 2 MiB or more advised" : "off (LAGA_HUGE_PAGES=off)",
             transparent_huge_pages_mode(), huge < 0 ? "unknown" : human_bytes(huge));
  fmt::print("# comm: exposed (time a rank waited in attention collectives); TFLOP/s: the group's, of the FLOPs each "
             "form executes (FlashAttention-3 convention)\n");
  fmt::print("# skew: of comm, the time ranks waited for each other (the most any rank waited beyond the last "
             "arriver, summed over the collectives): every rank has the same work, so it is time the host took from one rank\n");
  const char* hfmt = "# {:>6} {:<18} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>12} {:>8} {:>9} {:>6}\n";
  fmt::print(fmt::runtime(hfmt), "seq", "form", "fwd", "bwd", "comm", "skew", "total", "min", "max", "tokens/s",
             "TFLOP/s", "vs expl.", "#wrong");
  fmt::print(fmt::runtime(hfmt), "", "", "s", "s", "s", "s", "s", "s", "s", "", "", "×", "");
  nlohmann::json rows = nlohmann::json::array();
  int64_t total_wrong = 0;
  std::vector<std::string> messages, profile_lines;
  for (size_t si = 0; si < seqs.size(); ++si) {
    auto phase = [&](size_t fi, auto get) {
      std::vector<double> v;
      for (const auto& s : samples[si][fi]) v.push_back(get(s));
      return stats(v);
    };
    auto total_of = [](const Sample& s) { return s.fwd + s.bwd; };
    double explicit_total = 0;
    for (size_t fi = 0; fi < nf; ++fi)
      if (labels[fi] == kBaselineForm) explicit_total = phase(fi, total_of).median;
    for (size_t fi = 0; fi < nf; ++fi) {
      const MlaConfig& c = *configs[si * nf + fi];
      const Stats fw = phase(fi, [](const Sample& s) { return s.fwd; });
      const Stats bw = phase(fi, [](const Sample& s) { return s.bwd; });
      const Stats ex = phase(fi, [](const Sample& s) { return s.exposed; });
      const Stats al = phase(fi, [](const Sample& s) { return s.collective; });
      const Stats hd = phase(fi, [](const Sample& s) { return s.hidden; });
      const Stats tot = phase(fi, total_of);
      const Stats skew = phase(fi, [](const Sample& s) { return s.skew; });
      const BlockFlops fl = block_flops(c);
      const double tflops = (fl.forward + fl.backward) / tot.median / 1e12;
      const double tokens_per_s = double(c.seq_len * c.batch) / tot.median;
      const double speedup = explicit_total > 0 ? explicit_total / tot.median : 0.0;
      const Validation& v = checks[si][fi];
      const int64_t nwrong = int64_t(v.failures.size());
      total_wrong += nwrong;
      for (const auto& m : v.failures) messages.push_back(fmt::format("T {} {}: {}", c.seq_len, keys[fi], m));
      fmt::print("  {:>6} {:<18} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} {:>12.1f} {:>8.4f} {:>9} {:>6}\n",
                 c.seq_len, keys[fi], fw.median, bw.median, ex.median, skew.median, tot.median, tot.min, tot.max,
                 tokens_per_s, tflops,
                 explicit_total > 0 ? fmt::format("{:.3f}", speedup) : "-", b.validate ? fmt::format("{}", nwrong) : "-");
      nlohmann::json coll = nlohmann::json::object();
      std::map<std::string, std::vector<double>> cs, ce, ch;
      std::map<std::string, CollStat> shape;
      for (const auto& s : samples[si][fi])
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
      // Time by op class: the slowest rank's seconds per iteration, median; FLOPs per rank (rank 0's).
      nlohmann::json prof = nlohmann::json::object();
      std::string prof_line = fmt::format("  {:>6} {:<18}", c.seq_len, keys[fi]);
      for (ProfiledOp op : kProfiledOps) {
        const char* name = profiled_op_name(op);
        const double sec = phase(fi, [&](const Sample& x) { return x.op_s.count(name) ? x.op_s.at(name) : 0.0; }).median;
        const nlohmann::json& r0 = samples[si][fi].back().profile[name];
        const double flops = r0["flops"].get<double>(), rate = sec > 0 ? flops / sec / 1e9 : 0.0;
        prof[name] = {{"seconds", sec}, {"flops", flops}, {"calls", r0["calls"]}, {"gflops", rate}};
        prof_line += fmt::format(" {:>9.4f} {:>8.1f}", sec, rate);
      }
      const double other = phase(fi, [](const Sample& x) { return x.other_s; }).median;
      prof["other_s"] = other;
      prof["rank0_last_iteration"] = samples[si][fi].back().profile;
      prof_line += fmt::format(" {:>9.4f} {:>9.4f} {:>6.1f}", ex.median, other, 100 * other / tot.median);
      profile_lines.push_back(prof_line);
      nlohmann::json val = {{"validated", v.done}, {"wrong", nwrong}, {"failures", v.failures}};
      if (v.done) {
        val["vs_explicit"] = v.vs;
        if (v.vs == "bound")
          val["worst_tensor"] = v.worst, val["worst_ratio"] = v.worst_ratio, val["bounds"] = v.bound;
      }
      rows.push_back({{"form", find_form(c.form).family()},
                      {"variant", c.form},
                      {"label", keys[fi]},
                      {"ulysses", c.hybrid() ? c.ulysses : 0},
                      {"seq", c.seq_len},
                      {"sp", c.sp},
                      {"batch", c.batch},
                      {"layers", c.num_layers},
                      {"kernel", kernel_name(c.kernel)},
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
                      {"validation", val},
                      {"collectives", coll},
                      {"profile", prof}});
    }
  }
  if (b.profile) {
    fmt::print("# time by op class: per iteration the slowest rank's seconds in each class, median; GFLOP/s: one rank's "
               "FLOPs over those seconds; other: fwd + bwd − the classes − exposed comm (elementwise work, copies, "
               "allocation); % of total\n");
    const char* pfmt = "# {:>6} {:<18} {:>9} {:>8} {:>9} {:>8} {:>9} {:>8} {:>9} {:>9} {:>6}\n";
    fmt::print(fmt::runtime(pfmt), "seq", "form", "matmul", "GFLOP/s", "attn fwd", "GFLOP/s", "attn bwd", "GFLOP/s",
               "comm", "other", "%");
    for (const auto& l : profile_lines) fmt::print("{}\n", l);
  }
  for (const auto& m : messages) fmt::print("# FAIL {}\n", m);
  if (b.validate) fmt::print("bench: {}\n", total_wrong ? fmt::format("{} check(s) failed", total_wrong) : "pass");
  if (json_out) {
    nlohmann::json reduced_json = nlohmann::json::array();
    for (const auto& k : reduced.cases)
      reduced_json.push_back({{"sp", k.sp}, {"form", k.form}, {"vs", k.vs}, {"pass", k.pass}, {"worst_tensor", k.worst},
                              {"worst_ratio", k.worst_ratio}, {"allowed_ulps", k.allowed_ulps}});
    nlohmann::json j = {
        {"command", "bench"},
        {"machine", machine.to_json()},
        {"backend", backend},
        {"link", link},
        {"threads_per_rank", threads_max},
        {"threads_per_rank_min", threads_min},
        {"cpu_model", machine.cpu_model},
        {"commit", machine.commit},
        {"dtype", dtype_name(dtype)},
        {"kernel", kernel_name(c0.kernel)},
        {"config", configs[0]->to_json()},
        {"iters", b.iters},
        {"warmup", b.warmup},
        {"memory", {{"estimated_peak_bytes", need}, {"peak_rss_bytes", rss}}},
        {"allocator", {{"cache", pool.enabled}, {"peak_in_use_bytes", pool.peak_in_use_bytes},
                       {"peak_reserved_bytes", pool.peak_reserved_bytes}, {"hits", pool.hits},
                       {"misses", pool.misses}, {"huge_pages", huge_pages_enabled()},
                       {"transparent_huge_pages", transparent_huge_pages_mode()}, {"anon_huge_page_bytes", huge}}},
        {"validation",
         {{"enabled", b.validate},
          {"summary", validation},
          {"reduced_seq", b.validate ? Tv : 0},
          {"rule", reduced.rule},
          {"reduced_pass", reduced.pass},
          {"reduced_cases", reduced_json}}},
        {"wrong", total_wrong},
        {"pass", total_wrong == 0},
        {"rows", rows}};
    *json_out << j.dump(2) << "\n";
  }
  if (total_wrong)
    throw Error(ErrorKind::failure, __FILE__, __LINE__,
                fmt::format("bench: {} validation check(s) failed (the #wrong column; messages above)", total_wrong));
  return 0;
}

}  // namespace laga::cli
