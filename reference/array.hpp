// ref::Array: the fp64 array of the reference implementation — a shape and a flat row-major vector
// of doubles, nothing else. The reference is the specification: plain loops, readable, no speed.
// Conversions to and from laga::Tensor live here so tests can feed both the same values.
#pragma once

#include <cstdint>
#include <new>
#include <optional>
#include <vector>

#include "laga/core/memory.hpp"
#include "laga/core/tensor.hpp"

namespace laga::ref {

// The arrays' storage comes from laga's caching allocator (core/memory.hpp): they are large (a
// layer's weights in fp64) and short-lived (verify converts every run's outputs), and a freed block
// served from the cache is already paged in. Through malloc each one went back to the OS and
// faulted in again: verify small T 160 L 2 B 2 at P 1–8 spent a fifth of its time in those page
// faults.
template <class T>
struct PoolAllocator {
  using value_type = T;
  PoolAllocator() = default;
  template <class U>
  PoolAllocator(const PoolAllocator<U>&) {}
  T* allocate(size_t n) {
    void* p = pool_allocate(n * sizeof(T));
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) { pool_release(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const PoolAllocator<U>&) const {
    return true;
  }
};

struct Array {
  Shape shape;
  std::vector<double, PoolAllocator<double>> data;

  Array() = default;
  explicit Array(Shape s) : shape(std::move(s)), data(size_t(shape_numel(shape)), 0.0) {}
  int64_t numel() const { return int64_t(data.size()); }
  double& operator[](int64_t i) { return data[size_t(i)]; }
  double operator[](int64_t i) const { return data[size_t(i)]; }
};

inline Array from_tensor(const Tensor& t) {
  Array a(t.shape());
  // One dtype dispatch per tensor, not per element (Tensor::get checks and dispatches each call):
  // verify converts every run's gradients, a model's weights' worth each time.
  // a meta tensor has no values: refused here, as get refuses it
  if (t.numel() > 0) (void)t.get(0);
  if (t.dtype() == DType::f32) {
    const float* v = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) a[i] = v[i];
  } else if (t.dtype() == DType::i32) {
    const int32_t* v = t.data<int32_t>();
    for (int64_t i = 0; i < t.numel(); ++i) a[i] = v[i];
  } else {
    const bf16* v = t.data<bf16>();
    for (int64_t i = 0; i < t.numel(); ++i) a[i] = to_float(v[i]);
  }
  return a;
}

// How the reference ops sum: exactly in fp64 (the specification), or as a plain fp32-accumulating
// implementation does, every partial sum rounded to fp32 (a sequential fp32 sum; the precision-
// emulating reference of block_ref.hpp).
enum class Accum { exact, f32 };

// Sum policies for the reference loops: s = add(s, term).
struct ExactSum {
  static double add(double s, double t) { return s + t; }
};
struct F32Sum {
  static double add(double s, double t) { return double(float(s + t)); }
};

// v as a tensor of storage dtype t would hold it: rounded to fp32 (round to nearest), then for bf16
// to bf16 (round to nearest even) — the fast code's own conversion (laga::round_to) after its fp32
// arithmetic. Used by the precision-emulating reference (reference/block_ref.hpp).
inline double rounded(DType t, double v) { return double(round_to(t, float(v))); }
// Every element of a rounded to t in place; nothing when storage is empty (the exact reference).
inline void round_in_place(Array& a, std::optional<DType> storage) {
  if (!storage) return;
  for (double& v : a.data) v = rounded(*storage, v);
}

inline Tensor to_tensor(const Array& a, DType dtype, const std::string& tag) {
  Tensor t = Tensor::empty(a.shape, dtype, tag);
  for (int64_t i = 0; i < a.numel(); ++i) t.set(i, float(a[i]));
  return t;
}

}  // namespace laga::ref
