// laga bench's validation (bench.hpp; the argument: docs/benchmarks.md §7): 0. once (unless
//   --no-validate): verify's rule (verify::check_forms, the rule of verify/compare.hpp) on the same
//   model, P, B, L, kernel and dtype at a reduced T_v, where the fp64 reference is affordable; it
//   yields, per tensor, each form's and explicit's allowance in ulps of the tensor's scale. 1. per
//   T, untimed: one gathered run of explicit and of every form; y, dx and every weight gradient
//   must be finite, and agree with explicit's (a sparse form, another function, only finite): bit
//   for bit for a form exact at one rank at P = 1,
//   else |form − explicit| ≤ (allowance_form + allowance_explicit) × g(T) ulps × max|explicit| (the
//   triangle inequality through the fp64 reference, with both allowances carried from T_v). Where
//   explicit cannot run P (P ∤ H: only the ring forms and laga-ulysses can), the reference is
//   explicit at P 1, as verify holds the forms to explicit's error at P 1 there; a reference whose
//   planned memory does not fit is a usage error, never a skipped check.
// Also here: the memory bench plans for all of it and its timed rounds (planned_bench_bytes).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "bench.hpp"
#include "laga/core/error.hpp"
#include "laga/core/memory.hpp"
#include "laga/driver/plan.hpp"
#include "verify/compare.hpp"

namespace laga::cli {

namespace {

// One untimed run of c with the whole tensors gathered: y, dx and the weight gradients, on the
// root.
verify::Tensors gathered_run(Launcher& launcher, const Config& c, uint64_t seed, double timeout_s) {
  RunOptions opt;
  opt.seed = seed, opt.grad_sync = true, opt.gather_tensors = true;
  verify::Tensors out;
  launcher.run(
      int(c->sp),
      [&](Communicator& comm) {
        RankResult r = run_rank(c, opt, comm);
        if (comm.rank() == 0) out = verify::tensors_of(r.y, r.dx, r.grads);
      },
      timeout_s);
  // untimed: what this run cached does not sit beside the next (planned_bench_bytes)
  release_free_memory();
  return out;
}

// Non-finite values per tensor: one failed check per tensor that holds any.
void check_finite_tensors(const verify::Tensors& t, const std::string& who, Validation& v) {
  for (const auto& [name, a] : t) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < a.numel(); ++i)
      if (!std::isfinite(a[i])) bad += 1, first = first < 0 ? i : first;
    if (bad)
      v.failures.push_back(fmt::format("{}: {} non-finite value(s) in {} (first {}[{}] = {})", who,
                                       bad, name, name, first, a[first]));
  }
}

// The growth, from T_v to T, of the fp32-accumulated part of an allowance given in ulps of the
// dtype: the probabilistic rounding-error bound of a sum of n terms grows as √n (Higham & Mary
// 2019), and the reductions that lengthen with T (attention over ≤ T keys, weight gradients over
// T·B rows) are n ∝ T; storage rounding (one rounding per stored value) does not grow. In fp32 the
// whole allowance grows by √(T/T_v); in bf16 only its fp32 share, 2⁻¹⁶ of it.
double growth(DType dtype, int64_t T, int64_t Tv) {
  const double r = std::sqrt(double(T) / double(Tv));
  return 1.0 + (r - 1.0) * verify::eps(DType::f32) / verify::eps(dtype);
}

// --inject-wrong: FORM's y gets one element shifted by ULPS × eps(dtype) × max|y|.
void inject_wrong(const InjectWrong& wrong, DType dtype, verify::Tensors& t) {
  ref::Array& y = t.at("y");
  double scale = 0;
  for (double v : y.data) scale = std::max(scale, std::abs(v));
  y[y.numel() / 2] += wrong.ulps * verify::eps(dtype) * scale;
}

// The reduced-T rule's verdicts that concern the rows of form `label` (its failure is every row's
// of the form). A case missing (the form or the reference not run at T_v) is a failure naming why,
// never a pass.
void reduced_rule_failures(const BenchSetup& s, const std::string& label, bool is_explicit,
                           const ReducedRule& rule, Validation& v) {
  auto missing = [&](const std::string& who, int64_t at_P) {
    std::string why = "no case in its report";
    for (const auto& k : rule.report.cases)
      if (k.sp == at_P && k.form == who && k.vs == "not run") why = k.criterion;
    return fmt::format(
        "verify's rule at T {} has no verdict for {} at P {} ({}): no bound to validate "
        "against",
        s.Tv, who, at_P, why);
  };
  const auto rk = rule.rule_case.find(label);
  if (rk == rule.rule_case.end())
    v.failures.push_back(missing(label, s.P));
  else if (!rk->second->pass)
    v.failures.push_back(fmt::format("verify's rule at T {}: FAIL ({} at {:.3g} of allowed; {})",
                                     s.Tv, rk->second->worst, rk->second->worst_ratio,
                                     rk->second->criterion));
  if (const auto bk = rule.bitwise_case.find(label);
      bk != rule.bitwise_case.end() && !bk->second->pass)
    v.failures.push_back(fmt::format("verify at T {}: not bit-identical to explicit at P 1 ({})",
                                     s.Tv, bk->second->worst));
  // explicit is every bound's baseline: when it is not a row of its own, its failure is every
  // row's.
  const verify::FormCase* ref_case = rule.ref_case;
  if (!ref_case && !is_explicit)
    v.failures.push_back(missing(std::string(kBaselineForm), s.ref_P));
  else if (!is_explicit && !ref_case->pass &&
           std::find(s.labels.begin(), s.labels.end(), kBaselineForm) == s.labels.end())
    v.failures.push_back(
        fmt::format("explicit, the baseline, fails verify's rule at T {} (P {}: {} at {:.3g} of "
                    "allowed)",
                    s.Tv, s.ref_P, ref_case->worst, ref_case->worst_ratio));
}

// |form − explicit| ≤ (form's + explicit's allowance) × g(T) ulps × max|explicit|, per tensor.
void check_bounds(const BenchSetup& s, int64_t T, const std::string& key, const verify::Tensors& t,
                  const verify::Tensors& e, const std::map<std::string, double>& fk,
                  const std::map<std::string, double>& ek, Validation& v) {
  const double g = growth(s.dtype, T, s.Tv);
  for (const auto& [name, a] : t) {
    const ref::Array& x = e.at(name);
    LAGA_ASSERT(x.shape == a.shape && fk.count(name) && ek.count(name), "tensor {} does not match",
                name);
    double d = 0, scale = 0;
    bool finite = true;
    for (int64_t i = 0; i < a.numel(); ++i) {
      finite = finite && std::isfinite(a[i]) && std::isfinite(x[i]);
      d = std::max(d, std::abs(a[i] - x[i])), scale = std::max(scale, std::abs(x[i]));
    }
    if (!finite) continue;  // counted by the finiteness checks (this form's or explicit's row)
    const double ulps = (fk.at(name) + ek.at(name)) * g;
    const double bound = ulps * verify::eps(s.dtype) * scale;
    const double ratio = bound > 0 ? d / bound : (d > 0 ? INFINITY : 0.0);
    v.bound[name] = bound;
    if (v.worst.empty() || ratio > v.worst_ratio) v.worst = name, v.worst_ratio = ratio;
    if (ratio > 1)
      v.failures.push_back(fmt::format(
          "{} vs explicit{}: max|Δ {}| = {:.3e} > bound {:.3e} ({:.1f} ulp × max|{}| "
          "{:.3e}; {:.2f} of it)",
          key, s.ref_P == s.P ? "" : " at P 1", name, d, bound, ulps, name, scale, ratio));
  }
}

// One row's checks: the reduced rule's verdicts, finiteness, and agreement with the reference e.
Validation validate_row(const BenchSetup& s, size_t si, size_t fi, const verify::Tensors& t,
                        const verify::Tensors& e, const ReducedRule& rule) {
  const std::string& key = s.keys[fi];
  const bool is_explicit = s.labels[fi] == kBaselineForm;
  Validation v;
  v.done = true;
  reduced_rule_failures(s, s.labels[fi], is_explicit, rule, v);
  check_finite_tensors(t, key, v);
  if (is_explicit) {
    v.vs = "reference";
    return v;
  }
  if (form_of(*s.config(si, fi)).sparse()) {
    // Another function than explicit's (its attention sees the selected keys alone): held to
    // verify's rule on its own selection at T_v (above), and finite here.
    v.vs = "verified at T_v";
    return v;
  }
  if (s.P == 1 && form_of(*s.config(si, fi)).exact_at_one_rank()) {
    v.vs = "bitwise";
    std::string where;
    if (!verify::bitwise_equal(t, e, &where))
      v.failures.push_back(
          fmt::format("not bit-identical to explicit at P 1 (first difference: {})", where));
    return v;
  }
  v.vs = "bound";
  const auto rk = rule.rule_case.find(s.labels[fi]);
  if (rk == rule.rule_case.end() || !rule.ref_case) return v;  // no allowances: failed above
  check_bounds(s, s.seqs[si], key, t, e, rk->second->allowed_ulps, rule.ref_case->allowed_ulps, v);
  return v;
}

}  // namespace

// What bench holds at its peak in this process, planned before anything is allocated (refused above
// the memory limit, exit 2, rather than killed): validation (b.validate): verify's estimate at T_v
//   over {P} (planned_verify_bytes); then per T, the root's fp64 whole outputs of the reference and
//   of one form (8 bytes × (weights + 2·T·B·D) each) beside one gathered run of either
//   (planned_run_bytes); gathered_run releases the cache and the C heap after each of those runs;
//   the timed rounds: one run at a time, its blocks at most kPoolFitNum / kPoolFitDen of what it
//   asked (a cached block serves a request of 7/8 of its size), beside the caching allocator's
//   cached blocks: in all at most pool_bound(cap, its peak in use) (memory.hpp), and at most what
//   it could have cached since it was last emptied (the timed runs since the last gathered run);
//   the process itself (verify::kVerifyProcessBytes).
int64_t planned_bench_bytes(const BenchSetup& s, bool validate, bool threads) {
  const size_t nf = s.nf;
  int64_t ulysses = 0;  // the Pu of laga-ulysses's rows, as check_forms runs it
  for (size_t fi = 0; fi < nf; ++fi)
    if (form_of(*s.configs[fi]).takes_ulysses()) ulysses = s.configs[fi]->ulysses;
  // what a planned run holds in blocks
  auto fit = [](int64_t bytes) { return bytes * kPoolFitNum / kPoolFitDen; };
  const Config& base = *s.base;
  int64_t need = 0, peak_in_use = 0, cacheable = 0;
  if (validate)
    need = verify::planned_verify_bytes(base.with([&](MlaConfig& m) { m.seq_len = s.Tv; }), {s.P},
                                        threads, ulysses) -
           verify::kVerifyProcessBytes;
  for (size_t si = 0; si < s.seqs.size(); ++si) {
    if (validate) {
      const Config ref = base.with([&](MlaConfig& m) { m.seq_len = s.seqs[si]; });
      int64_t gathered = verify::planned_run_bytes(ref, threads, true);
      for (size_t fi = 0; fi < nf; ++fi)
        gathered = std::max(gathered, verify::planned_run_bytes(s.config(si, fi), threads, true));
      need = std::max(need, 2 * 8 * verify::output_count(*ref) + gathered);
      peak_in_use = std::max(peak_in_use, fit(gathered));
      cacheable = 0;  // gathered_run empties the cache
    }
    int64_t largest = 0;
    for (size_t fi = 0; fi < nf; ++fi) {
      const int64_t r = fit(verify::planned_run_bytes(s.config(si, fi), threads, false));
      largest = std::max(largest, r), cacheable += r;
    }
    peak_in_use = std::max(peak_in_use, largest);
    need = std::max(need,
                    std::min(pool_bound(pool_stats().cap_bytes, peak_in_use), largest + cacheable));
  }
  return verify::kVerifyProcessBytes + need;
}

void check_reduced_rule(const BenchSetup& s, const CommonFlags& f, Launcher& launcher,
                        const Progress& progress, ReducedRule& rule) {
  progress.show(s.Tv, "every form", "verify's rule (fp64 reference)");
  verify::FormsOptions vo;
  vo.seed = f.seed, vo.timeout_s = f.timeout_s;
  for (size_t fi = 0; fi < s.nf; ++fi) {
    // laga-ulysses's rows at their Pu (FormsOptions::ulysses)
    if (form_of(*s.configs[fi]).takes_ulysses()) vo.ulysses = s.configs[fi]->ulysses;
    if (s.labels[fi] != kBaselineForm) vo.forms.push_back(s.labels[fi]);
  }
  // explicit alone: check no other
  if (vo.forms.empty()) vo.forms.push_back(std::string(kBaselineForm));
  rule.report = verify::check_forms(s.base->with([&](MlaConfig& m) { m.seq_len = s.Tv; }), {s.P},
                                    launcher, vo);
  // The reduced-T cases at P, by the rows' labels, and explicit's at the reference's P.
  for (const auto& k : rule.report.cases) {
    if (k.sp == s.P && k.vs != "not run")
      (k.vs == "fp64" ? rule.rule_case : rule.bitwise_case)[k.form] = &k;
    if (k.sp == s.ref_P && k.form == kBaselineForm && k.vs == "fp64") rule.ref_case = &k;
  }
}

void validate_at(const BenchSetup& s, size_t si, const CommonFlags& f, const ReducedRule& rule,
                 Launcher& launcher, const Progress& progress, std::vector<Validation>& checks) {
  const int64_t T = s.seqs[si];
  progress.show(T, s.ref_P == s.P ? std::string(kBaselineForm) : "explicit at P 1",
                "validation run");
  const Config ec = s.base->with([&](MlaConfig& m) { m.seq_len = T; });
  verify::Tensors e = gathered_run(launcher, ec, f.seed, f.timeout_s);
  for (size_t fi = 0; fi < s.nf; ++fi) {
    const bool is_explicit = s.labels[fi] == kBaselineForm;
    verify::Tensors mine;
    if (!is_explicit) {
      progress.show(T, s.keys[fi], "validation run");
      mine = gathered_run(launcher, s.config(si, fi), f.seed, f.timeout_s);
    }
    if (!launcher.is_root()) continue;
    verify::Tensors& t = is_explicit ? e : mine;
    if (s.wrong && s.wrong->form == s.labels[fi]) inject_wrong(*s.wrong, s.dtype, t);
    checks[fi] = validate_row(s, si, fi, t, e, rule);
  }
}

}  // namespace laga::cli
