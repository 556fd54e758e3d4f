// The verification rule of verify/compare.hpp: per-tensor errors against the fp64 reference and the
// baseline-relative verdict.
#include "verify/compare.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "laga/core/error.hpp"

namespace laga::verify {

std::string grad_key(const std::string& full) {
  // "layers.{l}.name" -> "dname.l"
  constexpr std::string_view prefix = "layers.";
  LAGA_ASSERT(full.rfind(prefix, 0) == 0, "weight name '{}' does not start with 'layers.'", full);
  const size_t dot = full.find('.', prefix.size());
  LAGA_ASSERT(dot != std::string::npos, "weight name '{}' has no layer index", full);
  const std::string_view name = std::string_view(full).substr(dot + 1);
  const std::string_view layer = std::string_view(full).substr(prefix.size(), dot - prefix.size());
  // "indexer.wq_b" -> "indexer_wq_b": the key's one dot parts the name from the layer
  std::string flat(name);
  std::replace(flat.begin(), flat.end(), '.', '_');
  return fmt::format("d{}.{}", flat, layer);
}

Tensors tensors_of(const Tensor& y, const Tensor& dx, const Weights& grads) {
  Tensors t;
  t["y"] = ref::from_tensor(y);
  t["dx"] = ref::from_tensor(dx);
  grads.for_each(
      [&](const std::string& full, const Tensor& g) { t[grad_key(full)] = ref::from_tensor(g); });
  return t;
}

Tensors reference_tensors(const MlaConfig& c, const ref::RefWeights& w, const ref::Array& x,
                          const ref::Array& dy, std::optional<DType> storage, ref::Core core,
                          const std::vector<ref::Array>* selection) {
  Tensors t;
  t["y"] = ref::block_forward(c, w, x, storage, core, selection);
  ref::BlockGrads g = ref::block_backward(c, w, x, dy, storage, core, selection);
  t["dx"] = std::move(g.dx);
  for (auto& [full, arr] : g.dw) t[grad_key(full)] = std::move(arr);
  return t;
}

std::map<std::string, TensorError> plain_errors(const MlaConfig& c, const ref::RefWeights& w,
                                                const ref::Array& x, const ref::Array& dy,
                                                const Tensors& exact) {
  auto plain = errors(reference_tensors(c, w, x, dy, c.dtype, ref::Core::per_head), exact);
  for (ref::Core other : {ref::Core::absorbed, ref::Core::per_head_output_delta}) {
    const auto e_other = errors(reference_tensors(c, w, x, dy, c.dtype, other), exact);
    for (auto& [name, e] : plain) e.max_abs = std::max(e.max_abs, e_other.at(name).max_abs);
  }
  return plain;
}

std::map<std::string, TensorError> errors(const Tensors& got, const Tensors& truth) {
  std::map<std::string, TensorError> out;
  LAGA_ASSERT(got.size() == truth.size(), "{} tensors compared with {}", got.size(), truth.size());
  for (const auto& [name, want] : truth) {
    auto it = got.find(name);
    LAGA_ASSERT(it != got.end(), "no tensor '{}' to compare", name);
    const ref::Array& a = it->second;
    LAGA_ASSERT(a.shape == want.shape, "'{}' has shape {}, its reference {}", name,
                shape_str(a.shape), shape_str(want.shape));
    TensorError e;
    double num = 0, den = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      const double d = a[i] - want[i];
      e.max_abs = std::max(e.max_abs, std::abs(d));
      e.scale = std::max(e.scale, std::abs(want[i]));
      num += d * d;
      den += want[i] * want[i];
    }
    // NaN anywhere makes the error NaN, which no rule passes (std::max would drop it).
    if (std::isnan(num)) e.max_abs = std::numeric_limits<double>::quiet_NaN();
    e.rel_l2 =
        den > 0 ? std::sqrt(num / den) : (num > 0 ? std::numeric_limits<double>::infinity() : 0.0);
    out[name] = e;
  }
  return out;
}

bool bitwise_equal(const Tensors& a, const Tensors& b, std::string* first_difference) {
  auto differ = [&](std::string why) {
    if (first_difference) *first_difference = std::move(why);
    return false;
  };
  for (const auto& [name, x] : a)
    if (!b.count(name)) return differ(fmt::format("'{}' only in the first", name));
  for (const auto& [name, y] : b) {
    auto it = a.find(name);
    if (it == a.end()) return differ(fmt::format("'{}' only in the second", name));
    const ref::Array& x = it->second;
    if (x.shape != y.shape)
      return differ(
          fmt::format("'{}': shape {} vs {}", name, shape_str(x.shape), shape_str(y.shape)));
    for (int64_t i = 0; i < x.numel(); ++i)
      if (std::memcmp(&x.data[size_t(i)], &y.data[size_t(i)], sizeof(double)) != 0)
        return differ(fmt::format("{}[{}]: {:.9g} vs {:.9g}", name, i, x[i], y[i]));
  }
  return true;
}

double eps(DType dtype) {
  return dtype == DType::bf16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -23);
}

Verdict within_baseline(const std::map<std::string, TensorError>& candidate,
                        const std::map<std::string, TensorError>& baseline, DType dtype,
                        double factor) {
  Verdict v;
  v.rule = fmt::format("per tensor max|Δ fp64| ≤ {:g} × baseline's + {:g} ulp({}) × max|fp64|",
                       factor, kFloorUlps, dtype_name(dtype));
  for (const auto& [name, base] : baseline) {
    auto it = candidate.find(name);
    LAGA_ASSERT(it != candidate.end(), "no error for '{}' to judge", name);
    const double err = it->second.max_abs;
    const double allowed = factor * base.max_abs + kFloorUlps * eps(dtype) * base.scale;
    double r;
    if (std::isnan(err) || std::isnan(allowed))
      r = std::numeric_limits<double>::infinity();
    else if (allowed > 0)
      r = err / allowed;
    else
      r = err > 0 ? std::numeric_limits<double>::infinity() : 0.0;
    v.ratio[name] = r;
    v.allowed_ulps[name] = base.scale > 0 ? allowed / (eps(dtype) * base.scale) : 0.0;
    if (v.worst.empty() || r > v.worst_ratio) v.worst = name, v.worst_ratio = r;
  }
  v.pass = v.worst_ratio <= 1.0;
  return v;
}

Verdict form_vs_explicit(const std::map<std::string, TensorError>& form,
                         const std::map<std::string, TensorError>& explicit_, DType dtype) {
  Verdict v = within_baseline(form, explicit_, dtype, kFormFactor);
  v.rule = "vs explicit: " + v.rule;
  return v;
}

Verdict form_vs_baseline(const std::map<std::string, TensorError>& form,
                         const std::map<std::string, TensorError>& explicit_,
                         const std::map<std::string, TensorError>& plain, DType dtype) {
  std::map<std::string, TensorError> base = explicit_;
  for (auto& [name, e] : base) {
    const auto it = plain.find(name);
    LAGA_ASSERT(it != plain.end(), "no plain error for '{}'", name);
    e.max_abs = std::max(e.max_abs, it->second.max_abs);
  }
  Verdict v = within_baseline(form, base, dtype, kFormFactor);
  v.rule = "vs max(explicit, plain " + std::string(dtype_name(dtype)) + "): " + v.rule;
  return v;
}

Verdict explicit_vs_plain(const std::map<std::string, TensorError>& explicit_,
                          const std::map<std::string, TensorError>& plain, DType dtype) {
  Verdict v = within_baseline(explicit_, plain, dtype, kExplicitFactor);
  v.rule = "vs plain " + std::string(dtype_name(dtype)) + ": " + v.rule;
  return v;
}

std::string summary(const Verdict& v) {
  return fmt::format("{} (worst {}: {:.3g} of allowed)", v.pass ? "pass" : "FAIL", v.worst,
                     v.worst_ratio);
}

}  // namespace laga::verify
