// Shared test helpers: random tensors, error measures, and the tolerance rule of CONVENTIONS.md —
// an implementation's error against the fp64 reference may be at most a small multiple of the error
// a plain implementation in the same precision makes (measured in the same test), plus a floor.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

#include "laga/core/random.hpp"
#include "laga/core/tensor.hpp"
#include "reference/array.hpp"

namespace laga::testing {

inline Tensor random_tensor(const Shape& s, DType t, uint64_t seed, const std::string& name,
                            double std = 1.0) {
  Tensor x = Tensor::empty(s, t, name);
  fill_normal(x, seed, name, std);
  return x;
}

inline double max_abs(const ref::Array& a) {
  double m = 0;
  for (double v : a.data) m = std::max(m, std::abs(v));
  return m;
}

// max |a − b| over all elements; shapes must match in element count.
inline double max_abs_diff(const ref::Array& a, const ref::Array& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return a.numel() == b.numel() ? m : INFINITY;
}
inline double max_abs_diff(const Tensor& a, const ref::Array& b) {
  return max_abs_diff(ref::from_tensor(a), b);
}

// ‖a − b‖₂ / ‖b‖₂: the relative error of a whole tensor.
inline double rel_l2(const ref::Array& a, const ref::Array& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < b.numel(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return a.numel() == b.numel() ? std::sqrt(num) / std::max(std::sqrt(den), 1e-300) : INFINITY;
}

// The values a tensor of dtype t would hold: each element rounded through t.
inline ref::Array rounded(const ref::Array& a, DType t) {
  ref::Array r = a;
  for (double& v : r.data) v = round_to(t, float(v));
  return r;
}

// The tolerance rule: err ≤ factor · baseline_err + floor · scale.
inline bool within_baseline(double err, double baseline_err, double scale, double factor = 4.0,
                            double floor = 1e-6) {
  return err <= factor * baseline_err + floor * std::max(scale, 1e-30);
}

}  // namespace laga::testing
