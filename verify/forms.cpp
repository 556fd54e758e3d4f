// check_forms (verify/forms.hpp).
#include "verify/forms.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "laga/core/memory.hpp"
#include "laga/driver/plan.hpp"
#include "laga/driver/run.hpp"
#include "laga/mla/form.hpp"

namespace laga::verify {

namespace {

// "dwkv_b.1" -> "dwkv_b": the per-output maxima of the report.
std::string output_of(const std::string& key) { return key.substr(0, key.find('.')); }

void summarize(FormCase& k, const std::map<std::string, TensorError>& err) {
  for (const auto& [name, e] : err) {
    const std::string out = output_of(name);
    k.max_abs[out] = std::max(k.max_abs[out], e.max_abs);
    k.rel_l2[out] = std::max(k.rel_l2[out], e.rel_l2);
  }
}

// A case of config c (its sp, form and the form's Pu).
FormCase make_case(const MlaConfig& c, std::string_view vs) {
  FormCase k;
  k.sp = c.sp, k.form = c.form, k.label = displayed_form(c), k.vs = std::string(vs);
  k.ulysses = find_form(c.form).takes_ulysses() ? c.ulysses : 0;
  return k;
}

// A case judged against fp64: the verdict, the rule it was judged by, and the per-output errors.
FormCase judged(const MlaConfig& c, const Verdict& v, std::string criterion,
                const std::map<std::string, TensorError>& err) {
  FormCase k = make_case(c, "fp64");
  k.pass = v.pass, k.worst = v.worst, k.worst_ratio = v.worst_ratio,
  k.allowed_ulps = v.allowed_ulps;
  k.criterion = std::move(criterion);
  summarize(k, err);
  return k;
}

FormCase not_run(const MlaConfig& c, const std::string& why) {
  FormCase k = make_case(c, "not run");
  k.pass = true;
  k.criterion = "the form refuses this configuration: " + why;
  return k;
}

struct Run {
  Tensors outputs;          // y, dx, every weight gradient (whole, synced)
  ref::RefWeights weights;  // the weights (whole), for the reference
  ref::Array x, dy;
  std::vector<ref::Array> topk;  // a sparse form's selection per layer [T, B, k] (whole)
};

// The largest slack a sparse form's selection may show against the exact index scores, relative to
// the row's largest score: the scores are computed from index queries and keys stored in the
// run's dtype (a rounding of eps/2 each, and of the projections before them), so near-ties may
// fall either way; a wrong rule (a key out of the top-k by a margin, a missing or later key) does
// not fit in it.
double selection_tolerance(DType dtype) { return 16 * eps(dtype); }

// One check_forms sweep: what every P's cases are judged with (the fp64 reference's tensors, the
// plain implementations' error, explicit's error with the fused kernel per baseline P), and the
// report.
class FormsCheck {
 public:
  FormsCheck(const Config& base, Launcher& launcher, const FormsOptions& opt)
      : base_(base),
        launcher_(launcher),
        opt_(opt),
        root_(launcher.is_root()),
        initial_(allocate_weights(*base, "verify.weights")) {
    // The same seed draws the same whole weights at every P and for every form: drawn once here
    // (per process), each run copies them.
    init_weights(initial_, *base, opt.seed);
    run_opt_.seed = opt.seed;
    run_opt_.gather_tensors = true;
    run_opt_.initial_weights = &initial_;
    for (const Form* f : registered_forms())
      if (f->name() != kBaselineForm &&
          (opt.forms.empty() ||
           std::find(opt.forms.begin(), opt.forms.end(), f->name()) != opt.forms.end()))
        forms_.push_back(f);
    report_.backend = launcher.backend();
    report_.rule = fmt::format(
        "per tensor, max|form − fp64| ≤ {:g} × max(explicit's, plain's) + {:g} ulp × "
        "max|fp64|; explicit's ≤ {:g} × plain's, plain = the largest of three plain {} "
        "implementations (per-head order, its delta from dO·O, absorbed order){}",
        kFormFactor, kFloorUlps, kExplicitFactor, dtype_name(base->dtype),
        base->kernel == Kernel::eager
            ? "; a form with a kernel of its own against explicit with the "
              "fused kernel"
            : "");
  }
  FormsCheck(const FormsCheck&) = delete;
  FormsCheck& operator=(const FormsCheck&) = delete;

  // explicit at P 1, the fp64 reference on its inputs, and the plain implementations' error.
  void reference() {
    // The same seed draws the same whole weights and inputs at every P and for every form.
    one_ = run(at(kBaselineForm, 1), /*keep_inputs=*/true);
    // The plain same-precision implementation's error: the largest of its three association orders
    // (plain_errors).
    if (root_) {
      exact_ = reference_tensors(*base_, one_.weights, one_.x, one_.dy, std::nullopt);
      plain_err_ = plain_errors(*base_, one_.weights, one_.x, one_.dy, exact_);
    }
  }

  // Every case at P; explicit_at_one_judged: whether explicit's case at P 1 is (or will be) in the
  // report.
  void check_at(int64_t P, bool& explicit_at_one_judged);

  FormsReport take() { return std::move(report_); }

 private:
  // A whole run of c; its tensors on the root (rank 0 of the group), empty elsewhere.
  Run run(const Config& c, bool keep_inputs) {
    Run out;
    launcher_.run(
        int(c->sp),
        [&](Communicator& comm) {
          RankResult r = run_rank(c, run_opt_, comm);
          if (comm.rank() != 0) return;
          out.outputs = tensors_of(r.y, r.dx, r.grads);
          for (const Tensor& t : r.topk) out.topk.push_back(ref::from_tensor(t));
          if (keep_inputs) {
            out.weights = ref::from_weights(r.weights);
            out.x = ref::from_tensor(r.x), out.dy = ref::from_tensor(r.dy);
          }
        },
        opt_.timeout_s);
    return out;
  }
  // The form's config at P: as_form, with the sweep's --ulysses for a form that takes it.
  MlaConfig spec_at(std::string_view form, int64_t P) const {
    MlaConfig m = *base_;
    m.sp = P, m.ulysses = opt_.ulysses;
    return as_form(m, form);
  }
  Config at(std::string_view form, int64_t P) const { return spec_at(form, P); }
  // A form that runs a kernel of its own whatever --kernel says (the ring forms and laga-ulysses
  // the fused kernel, laga-fused its latent kernel, tiled as the fused one) is held to explicit run
  // with the fused kernel at the same P: like with like. Under --kernel eager explicit's own error
  // is the eager kernel's, one softmax per row with no online rescaling, and on some tensors
  // smaller than any fused kernel's (tiny T 64 L 2 seed 7: ring-latent's dq_norm at 1.002 of an
  // eager-explicit bound). Run once per baseline P, only where such a form runs; errors on the
  // root, empty elsewhere.
  bool against_fused(const Form& f) const {
    return base_->kernel != Kernel::fused && !f.own_kernel().empty();
  }
  const std::map<std::string, TensorError>& baseline_of(
      const Form& f, int64_t baseline_P, const std::map<std::string, TensorError>& e_err) {
    if (!against_fused(f)) return e_err;
    auto it = fused_explicit_err_.find(baseline_P);
    if (it == fused_explicit_err_.end()) {
      Run r = run(base_.with([&](MlaConfig& m) {
        m.form = kBaselineForm, m.sp = baseline_P, m.kernel = Kernel::fused;
      }),
                  false);
      it = fused_explicit_err_
               .emplace(baseline_P,
                        root_ ? errors(r.outputs, exact_) : std::map<std::string, TensorError>{})
               .first;
    }
    return it->second;
  }
  // A form's run of c (its outputs on the root), held to its baseline's error.
  FormCase form_case(const MlaConfig& c, const Form& f, int64_t baseline_P,
                     const std::map<std::string, TensorError>& baseline, const Run& r) const {
    const auto err = errors(r.outputs, exact_);
    return judged(
        c, form_vs_baseline(err, baseline, plain_err_, base_->dtype),
        fmt::format("≤ {:g} × max(explicit's error at P {}{}, the plain implementations') + floor",
                    kFormFactor, baseline_P,
                    against_fused(f) ? " with the fused kernel (the form's own)" : ""),
        err);
  }
  // explicit's own case at P: its error against the plain implementation's (the rule's baseline).
  FormCase explicit_case(int64_t P, const std::map<std::string, TensorError>& e_err) const {
    return judged(
        spec_at(kBaselineForm, P), explicit_vs_plain(e_err, plain_err_, base_->dtype),
        fmt::format(
            "≤ {:g} × the plain {} implementations' error (three association orders) + floor",
            kExplicitFactor, dtype_name(base_->dtype)),
        e_err);
  }
  // A form exact at one rank, at P 1: bit for bit against explicit's run.
  FormCase bitwise_case(int64_t P, const Form& f, const Run& r) const {
    FormCase b = make_case(spec_at(f.name(), P), "explicit@1");
    std::string where;
    b.bitwise = b.pass = bitwise_equal(r.outputs, one_.outputs, &where);
    b.criterion = "bit-identical to explicit at P = 1" +
                  (b.pass ? std::string() : " (first difference: " + where + ")");
    b.worst = b.pass ? "" : where;
    summarize(b, errors(r.outputs, one_.outputs));
    return b;
  }
  // A sparse form (Form::sparse) against the fp64 reference of the sparse block on the selection
  // it made (ref::block_backward with it), by the rule: per tensor within kFormFactor × the larger
  // of explicit's error (on the dense block) and the plain same-precision sparse block's, plus the
  // floor; the indexer's gradients included. And its selection against the exact index scores
  // (selection_tolerance).
  FormCase sparse_case(const MlaConfig& c, const std::map<std::string, TensorError>& e_err,
                       const Run& r) const {
    auto tensors = [&](std::optional<DType> storage, ref::BlockGrads* keep) {
      Tensors t;
      t["y"] = ref::block_forward(c, one_.weights, one_.x, storage, ref::Core::absorbed, &r.topk);
      ref::BlockGrads g = ref::block_backward(c, one_.weights, one_.x, one_.dy, storage,
                                              ref::Core::absorbed, &r.topk);
      t["dx"] = std::move(g.dx);
      for (auto& [full, arr] : g.dw) t[grad_key(full)] = std::move(arr);
      if (keep) *keep = std::move(g);
      return t;
    };
    // Every sparse form at every P selects the same keys (the indexer's scores do not depend on
    // the split): the reference on a selection is computed once and kept for the next.
    bool same = sparse_ref_.valid && sparse_ref_.topk.size() == r.topk.size();
    for (size_t l = 0; same && l < r.topk.size(); ++l)
      same = sparse_ref_.topk[l].data == r.topk[l].data;
    if (!same) {
      sparse_ref_.topk = r.topk;
      sparse_ref_.exact = tensors(std::nullopt, &sparse_ref_.exact_g);
      sparse_ref_.plain_err = errors(tensors(c.dtype, nullptr), sparse_ref_.exact);
      sparse_ref_.valid = true;
    }
    const Tensors& exact = sparse_ref_.exact;
    const ref::BlockGrads& exact_g = sparse_ref_.exact_g;
    const auto& plain_err = sparse_ref_.plain_err;
    const auto err = errors(r.outputs, exact);
    // The indexer's gradients have no explicit counterpart (explicit's are zero): in explicit's
    // place stands what the rule allows explicit, kExplicitFactor × plain's error. Their error is
    // mostly the main path's, inherited through the layer's inputs, which the plain block on its
    // own inputs does not see.
    std::map<std::string, TensorError> baseline = e_err;
    for (auto& [name, e] : baseline)
      if (name.starts_with("dindexer_")) e.max_abs = kExplicitFactor * plain_err.at(name).max_abs;
    FormCase k = judged(
        c, form_vs_baseline(err, baseline, plain_err, c.dtype),
        fmt::format("on its selection, ≤ {:g} × max(explicit's error (the indexer's: {:g} × "
                    "plain's), the plain sparse block's) + floor; selection within {:g} of the "
                    "exact top-k",
                    kFormFactor, kExplicitFactor, selection_tolerance(c.dtype)),
        err);
    for (size_t l = 0; l < exact_g.selection_slack.size(); ++l) {
      const double slack = exact_g.selection_slack[l];
      const double ratio = slack / selection_tolerance(c.dtype);
      if (ratio > k.worst_ratio || !std::isfinite(slack)) {
        k.worst = fmt::format("topk.{}", l);
        k.worst_ratio = std::isfinite(slack) ? ratio : INFINITY;
      }
      k.pass = k.pass && ratio <= 1;
    }
    return k;
  }
  // A sparse form at P 1 that runs its reference form's operations (dsa-regather: dsa-gather's)
  // bit for bit against that form's run.
  FormCase sparse_bitwise_case(const MlaConfig& c, std::string_view with, const Run& r,
                               const Run& ref_run) const {
    FormCase b = make_case(c, fmt::format("{}@1", with));
    std::string where;
    b.bitwise = b.pass = bitwise_equal(r.outputs, ref_run.outputs, &where);
    for (size_t l = 0; b.pass && l < r.topk.size(); ++l)
      if (r.topk[l].data != ref_run.topk[l].data) b.pass = false, where = fmt::format("topk.{}", l);
    b.criterion = fmt::format("bit-identical to {} at P = 1", with) +
                  (b.pass ? std::string() : " (first difference: " + where + ")");
    b.worst = b.pass ? "" : where;
    summarize(b, errors(r.outputs, ref_run.outputs));
    return b;
  }
  void add(FormCase k) {
    report_.pass = report_.pass && k.pass;
    report_.cases.push_back(std::move(k));
  }

  const Config& base_;
  Launcher& launcher_;
  const FormsOptions& opt_;
  const bool root_;
  Weights initial_;
  RunOptions run_opt_;
  std::vector<const Form*> forms_;
  FormsReport report_;
  Run one_;        // explicit at P 1
  Tensors exact_;  // the fp64 reference's tensors (root)
  std::map<std::string, TensorError> plain_err_;
  std::map<int64_t, std::map<std::string, TensorError>> fused_explicit_err_;
  std::map<std::string, Run> sparse_at_one_;  // the sparse forms' runs at P 1 (root), by label
  // The sparse block's reference on the last selection seen (root): sparse_case's cache.
  struct SparseReference {
    bool valid = false;
    std::vector<ref::Array> topk;
    Tensors exact;
    ref::BlockGrads exact_g;
    std::map<std::string, TensorError> plain_err;
  };
  mutable SparseReference sparse_ref_;
};

void FormsCheck::check_at(int64_t P, bool& explicit_at_one_judged) {
  // What the runs at the previous P left (the caching allocator's blocks, the C heap's free pages)
  // goes back before this P's runs, whose sizes differ: otherwise it sits beside them, outside
  // planned_verify_bytes. Within one P the runs reuse each other's blocks.
  release_free_memory();
  // One rule for every form, the baseline included (forms_at): a form that refuses this P (a
  // head-scatter form's P ∤ H, a ring form's T not a multiple of 2P) is reported as not run, with
  // its reason. Where explicit itself refuses P, the others are held to explicit's error at P = 1.
  MlaConfig m = *base_;
  m.sp = P, m.ulysses = opt_.ulysses;
  const FormsAt here = forms_at(m);
  const std::string baseline_refusal = here.refusal(find_form(kBaselineForm));
  const int64_t baseline_P = baseline_refusal.empty() ? P : 1;
  Run e = baseline_P == 1 ? one_ : run(at(kBaselineForm, P), false);
  std::map<std::string, TensorError> e_err;
  if (root_ && !baseline_refusal.empty()) {
    e_err = errors(e.outputs, exact_);
    if (!explicit_at_one_judged) add(explicit_case(1, e_err));
    add(not_run(
        spec_at(kBaselineForm, P),
        baseline_refusal + " (the other forms at this P are held to explicit's error at P 1)"));
  } else if (root_) {
    e_err = errors(e.outputs, exact_);
    add(explicit_case(P, e_err));
  }
  explicit_at_one_judged = explicit_at_one_judged || baseline_P == 1;
  for (const Form* f : forms_) {
    const MlaConfig fm = spec_at(f->name(), P);
    if (const std::string why = here.refusal(*f); !why.empty()) {
      if (root_) add(not_run(fm, why));
      continue;
    }
    if (f->sparse()) {
      Run r = run(fm, false);
      if (!root_) continue;
      add(sparse_case(fm, e_err, r));
      if (P == 1 && !f->bitwise_at_one_rank_with().empty()) {
        const std::string with(f->bitwise_at_one_rank_with());
        if (sparse_at_one_.find(with) == sparse_at_one_.end())
          sparse_at_one_[with] = run(spec_at(with, 1), false);
        add(sparse_bitwise_case(fm, with, r, sparse_at_one_.at(with)));
      }
      if (P == 1) sparse_at_one_[std::string(f->name())] = std::move(r);
      continue;
    }
    const auto& baseline = baseline_of(*f, baseline_P, e_err);
    Run r = run(fm, false);
    if (!root_) continue;
    add(form_case(fm, *f, baseline_P, baseline, r));
    if (P == 1 && f->exact_at_one_rank()) add(bitwise_case(P, *f, r));
  }
}

}  // namespace

Tensors run_tensors(const Config& c) {
  RunOptions opt;
  opt.gather_tensors = true;
  const std::vector<RankResult> ranks = run_group(c, opt);
  return tensors_of(ranks.front().y, ranks.front().dx, ranks.front().grads);
}

int64_t weight_count(const MlaConfig& c) {
  int64_t weights = 0;
  for (const auto& [name, shape] : layer_weight_shapes(c)) weights += shape_numel(shape);
  return weights * c.num_layers;
}

int64_t output_count(const MlaConfig& c) {
  return weight_count(c) + 2 * c.seq_len * c.batch * c.hidden_size;
}

int64_t planned_run_bytes(const Config& c, bool ranks_are_threads, bool gathered) {
  const PlannedMemory p = plan_memory(c);
  int64_t per_rank = p.baseline_bytes + p.activation_peak_bytes;
  if (gathered)
    per_rank +=
        4 * weight_count(*c) + 4 * c->seq_len * c->batch * c->hidden_size * dtype_size(c->dtype);
  return (ranks_are_threads ? c->sp : 1) * per_rank;
}

int64_t planned_verify_bytes(const Config& base, const std::vector<int64_t>& sps,
                             bool ranks_are_threads, int64_t ulysses) {
  const MlaConfig& c = *base;
  const int64_t weights = weight_count(c);
  auto at = [&](std::string_view form, int64_t P) {
    return base.with([&](MlaConfig& m) {
      m.sp = P, m.ulysses = ulysses;
      m = as_form(m, form);
    });
  };
  const Config one = at(kBaselineForm, 1);  // the run every sweep starts with
  const int64_t ref_activations = 8 / dtype_size(c.dtype) * plan_memory(one).activation_peak_bytes;
  int64_t largest_run = planned_run_bytes(one, ranks_are_threads, true);
  for (int64_t P : sps) {
    MlaConfig m = c;
    m.sp = P, m.ulysses = ulysses;
    for (const Form* f : judge_forms(m).runnable)
      largest_run =
          std::max(largest_run, planned_run_bytes(at(f->name(), P), ranks_are_threads, true));
  }
  return kVerifyProcessBytes + kVerifyFp64Copies * 8 * output_count(c) + ref_activations +
         dtype_size(c.dtype) * weights + largest_run;
}

FormsReport check_forms(const Config& base, const std::vector<int64_t>& sps, Launcher& launcher,
                        const FormsOptions& opt) {
  FormsCheck check(base, launcher, opt);
  check.reference();
  // Where explicit refuses a P, the other forms are held to its error at P 1: that error is judged
  // too, once, as a case of P 1 (unless P 1 is in sps: judged there).
  bool explicit_at_one_judged = std::find(sps.begin(), sps.end(), int64_t(1)) != sps.end();
  for (int64_t P : sps) check.check_at(P, explicit_at_one_judged);
  return check.take();
}

}  // namespace laga::verify
