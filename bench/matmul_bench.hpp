// The rate the benchmarks compare themselves with: a plain oneDNN matmul (laga::matmul), C [n, n]
// fp32 = A B with A and B [n, n] in the dtype under test, on all threads. bench_attention and
// bench_block time it in turns with what they measure, so that both see the same machine, and
// validate 64 sampled entries against an fp64 dot product before reporting it.
#pragma once

#include <cmath>
#include <cstdint>

#include "laga/core/random.hpp"
#include "laga/core/tensor.hpp"
#include "laga/ops/matmul.hpp"

namespace laga::bench {

struct MatmulBench {
  int64_t n;
  Tensor a, b, c;
  MatmulParams p;
  MatmulBench(int64_t n_, DType dt) : n(n_) {
    a = Tensor::empty({n, n}, dt, "a"), b = Tensor::empty({n, n}, dt, "b");  // [n, n] each
    c = Tensor::empty({n, n}, DType::f32, "c");                              // [n, n]
    fill_normal(a, 1, "a", 1.0);
    fill_normal(b, 1, "b", 1.0);
    p.M = p.N = p.K = n, p.ab_dtype = dt, p.c_dtype = DType::f32;
    p.a = a.raw(), p.a_m_stride = n, p.b = b.raw(), p.b_k_stride = n, p.c = c.raw(),
    p.c_m_stride = n;
  }
  static double flops(int64_t n) { return 2.0 * double(n) * double(n) * double(n); }  // 2n³
  void run() const { matmul(p); }
  // the number of 64 sampled entries off their fp64 value by more than 1e-5 of Σ|a b|
  int64_t validate() const {
    int64_t wrong = 0;
    for (int64_t s = 0; s < 64; ++s) {
      const int64_t i = (s * 7919) % n, j = (s * 104729 + 13) % n;
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < n; ++k) {
        ref += double(a.get(i * n + k)) * double(b.get(k * n + j));
        mag += std::abs(double(a.get(i * n + k)) * double(b.get(k * n + j)));
      }
      if (!(std::abs(c.get(i * n + j) - ref) <= 1e-5 * mag)) ++wrong;
    }
    return wrong;
  }
};

}  // namespace laga::bench
