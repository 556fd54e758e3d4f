// ref::Array: the fp64 array of the reference implementation — a shape and a flat row-major
// std::vector<double>, nothing else. The reference is the specification: plain loops, readable,
// no speed. Conversions to and from laga::Tensor live here so tests can feed both the same values.
#pragma once

#include <cstdint>
#include <vector>

#include "laga/core/tensor.hpp"

namespace laga::ref {

struct Array {
  Shape shape;
  std::vector<double> data;

  Array() = default;
  explicit Array(Shape s) : shape(std::move(s)), data(size_t(shape_numel(shape)), 0.0) {}
  int64_t numel() const { return int64_t(data.size()); }
  double& operator[](int64_t i) { return data[size_t(i)]; }
  double operator[](int64_t i) const { return data[size_t(i)]; }
};

inline Array from_tensor(const Tensor& t) {
  Array a(t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) a[i] = t.get(i);
  return a;
}

inline Tensor to_tensor(const Array& a, DType dtype, const std::string& tag) {
  Tensor t = Tensor::empty(a.shape, dtype, tag);
  for (int64_t i = 0; i < a.numel(); ++i) t.set(i, float(a[i]));
  return t;
}

}  // namespace laga::ref
