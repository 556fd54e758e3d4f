// laga verify (DESIGN §7): the forms checked against each other and against the fp64 reference.
//   P = 1: laga's y, dx and every weight gradient bit-identical to explicit's.
//   every P: laga agrees with explicit at the same P and at P = 1: per tensor,
//              max|laga − explicit| ≤ max(tol · max|explicit|, max|explicit − fp64|)
//            with tol 1e-5 (fp32) or 1e-3 (bf16): within tol, or within what the dtype itself costs
//            explicit (in fp32 the first term rules; in bf16 laga's per-rank rounding of the partial
//            dlatent before the reduce-scatter reaches every upstream gradient at bf16's noise level);
//            absorbed (shared and expanded) no further from the fp64 reference than 2× explicit at
//            the same P and dtype, in the relative L2 error ‖a − b‖₂/‖b‖₂ maxed over tensors.
// Runs in-process (threads backend).
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <map>

#include "cli.hpp"
#include "commands.hpp"
#include "laga/core/error.hpp"
#include "reference/block_ref.hpp"

namespace laga::cli {

namespace {

// Whole outputs of one run, as named fp64 arrays: "y", "dx", "d<weight>" per layer ("dwkv_b.1").
using Named = std::map<std::string, ref::Array>;

Named outputs_of(const RankResult& r) {
  Named n;
  n["y"] = ref::from_tensor(r.y);
  n["dx"] = ref::from_tensor(r.dx);
  r.grads.for_each([&](const std::string& full, const Tensor& t) {
    // "layers.{l}.name" -> "dname.l"
    auto dot = full.find('.', 7);
    n["d" + full.substr(dot + 1) + "." + full.substr(7, dot - 7)] = ref::from_tensor(t);
  });
  return n;
}

struct Diff {
  std::map<std::string, double> abs, rel, l2;  // per output name ("dwkv_b": max over layers)
  std::map<std::string, double> abs_each, scale_each;  // per tensor ("dwkv_b.1"): max|a − b|, max|b|
  double max_rel = 0, max_l2 = 0;
  bool bitwise = true;
};

Diff diff(const Named& a, const Named& b) {
  Diff d;
  for (const auto& [name, want] : b) {
    const ref::Array& got = a.at(name);
    double m = 0, scale = 0, num = 0, den = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      m = std::max(m, std::abs(got[i] - want[i]));
      scale = std::max(scale, std::abs(want[i]));
      num += (got[i] - want[i]) * (got[i] - want[i]);
      den += want[i] * want[i];
    }
    d.bitwise = d.bitwise && std::memcmp(got.data.data(), want.data.data(), want.data.size() * sizeof(double)) == 0;
    std::string key = name.substr(0, name.find('.'));
    double rel = m / std::max(scale, 1e-30), l2 = std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
    d.abs[key] = std::max(d.abs[key], m);
    d.rel[key] = std::max(d.rel[key], rel);
    d.l2[key] = std::max(d.l2[key], l2);
    d.abs_each[name] = m;
    d.scale_each[name] = scale;
    d.max_rel = std::max(d.max_rel, rel);
    d.max_l2 = std::max(d.max_l2, l2);
  }
  return d;
}

// The agreement rule for laga vs explicit (see the top of this file).
bool agrees(const Diff& d, const Diff& explicit_vs_fp64, double tol) {
  for (const auto& [name, m] : d.abs_each)
    if (m > std::max(tol * d.scale_each.at(name), explicit_vs_fp64.abs_each.at(name))) return false;
  return true;
}

std::string label(Form form, AbsorbedKv kv) {
  return form == Form::absorbed ? fmt::format("absorbed-{}", absorbed_kv_name(kv)) : std::string(form_name(form));
}

}  // namespace

int cmd_verify(const CommonFlags& f, const std::vector<int64_t>& sps) {
  MlaConfig base = build_config(f);
  auto json_out = open_output(f.json_path, "--json");
  LAGA_CHECK(!use_mpi(f.comm), "laga verify runs its ranks in-process; run it without mpirun (use laga run under mpirun)");
  RunOptions opt;
  opt.seed = f.seed;
  opt.gather_tensors = true;
  const double tol = base.dtype == DType::f32 ? 1e-5 : 1e-3;

  auto run = [&](Form form, int64_t P, AbsorbedKv kv = AbsorbedKv::expanded) {
    MlaConfig c = base;
    c.form = form, c.sp = P, c.absorbed_kv = kv;
    return outputs_of(run_group(c, opt, f.timeout_s)[0]);
  };

  // The fp64 reference on the same weights and inputs.
  MlaConfig one = base;
  one.sp = 1, one.form = Form::explicit_form;
  RankResult r1 = run_group(one, opt, f.timeout_s)[0];
  Named explicit_1 = outputs_of(r1);
  Named reference;
  {
    ref::RefWeights w = ref::from_weights(r1.weights);
    ref::Array x = ref::from_tensor(r1.x), dy = ref::from_tensor(r1.dy);
    reference["y"] = ref::block_forward(one, w, x);
    auto g = ref::block_backward(one, w, x, dy);
    reference["dx"] = g.dx;
    for (auto& [full, arr] : g.dw) {
      auto dot = full.find('.', 7);
      reference["d" + full.substr(dot + 1) + "." + full.substr(7, dot - 7)] = arr;
    }
  }

  nlohmann::json cases = nlohmann::json::array();
  bool all_pass = true;
  fmt::print("laga verify: model {} T {} B {} L {} kernel {} dtype {} (tolerance {:g} relative)\n", base.model,
             base.seq_len, base.batch, base.num_layers, kernel_name(base.kernel), dtype_name(base.dtype), tol);
  fmt::print("# {:>3} {:<18} {:<14} {:>11} {:>11} {:>11} {:>11} {:>11} {:>8} {:>6}\n", "sp", "form", "vs", "y",
             "dx", "dwkv_b", "max rel", "max rel L2", "bitwise", "pass");
  fmt::print("# {:>3} {:<18} {:<14} {:>11} {:>11} {:>11} {:>11} {:>11} {:>8} {:>6}\n", "", "", "", "max abs", "max abs",
             "max abs", "", "", "", "");
  auto add = [&](int64_t P, const std::string& form, const std::string& vs, const Diff& d, bool pass,
                 const std::string& criterion) {
    all_pass = all_pass && pass;
    fmt::print("  {:>3} {:<18} {:<14} {:>11.3e} {:>11.3e} {:>11.3e} {:>11.3e} {:>11.3e} {:>8} {:>6}\n", P, form, vs,
               d.abs.at("y"), d.abs.at("dx"), d.abs.at("dwkv_b"), d.max_rel, d.max_l2, d.bitwise ? "yes" : "no",
               pass ? "ok" : "FAIL");
    nlohmann::json j = {{"sp", P},          {"form", form},           {"vs", vs},
                        {"bitwise", d.bitwise}, {"max_abs_diff", d.abs}, {"max_rel_diff", d.rel},
                        {"rel_l2_diff", d.l2},  {"pass", pass},          {"criterion", criterion}};
    cases.push_back(j);
  };

  for (int64_t P : sps) {
    Named e = P == 1 ? explicit_1 : run(Form::explicit_form, P);
    Diff e_ref = diff(e, reference);
    add(P, "explicit", "fp64", e_ref, true, "recorded: the yardstick for absorbed");
    Named l = run(Form::laga, P);
    if (P == 1) {
      Diff d = diff(l, explicit_1);
      add(P, "laga", "explicit@1", d, d.bitwise, "bit-identical");
    } else {
      const std::string rule = fmt::format("per tensor max|Δ| ≤ max({:g}·max|explicit|, max|explicit − fp64|)", tol);
      add(P, "laga", fmt::format("explicit@{}", P), diff(l, e), agrees(diff(l, e), e_ref, tol), rule);
      Diff e1_ref = diff(explicit_1, reference);
      add(P, "laga", "explicit@1", diff(l, explicit_1), agrees(diff(l, explicit_1), e1_ref, tol), rule);
    }
    for (AbsorbedKv kv : {AbsorbedKv::shared, AbsorbedKv::expanded}) {
      Diff d = diff(run(Form::absorbed, P, kv), reference);
      add(P, label(Form::absorbed, kv), "fp64", d, d.max_l2 <= 2 * e_ref.max_l2,
          fmt::format("max rel L2 ≤ 2 × explicit's {:.3e}", e_ref.max_l2));
    }
  }
  fmt::print("verify: {}\n", all_pass ? "pass" : "FAIL");
  if (json_out) {
    nlohmann::json j = {{"command", "verify"}, {"config", base.to_json()}, {"cases", cases}, {"pass", all_pass}};
    *json_out << j.dump(2) << "\n";
  }
  return all_pass ? 0 : 1;
}

}  // namespace laga::cli
