// matmul: the one matrix product of laga, on oneDNN, for every op and kernel.
//
//   C[b, m, n] (= or +=) alpha · Σ_k A[b, m, k] · B[b, k, n]
//
// Operands are given by pointer, dtype and element strides, so a transpose is a swap of strides and
// a head slice of a sequence-first tensor is a row stride: nothing is copied. Accumulation in fp32;
// A and B share one dtype (fp32 or bf16), C may be fp32 or bf16. Where oneDNN has no bf16 matmul
// (core/isa.hpp: below AVX-512, or LAGA_MAX_ISA=avx2), bf16 operands are widened to dense fp32
// copies, multiplied in fp32 and a bf16 C rounded once: oneDNN's bf16 semantics; the copies are
// scratch, as oneDNN's scratchpad is (reserved bytes, never tracked ones). C is computed in tiles
// of a fixed size, each a single-threaded oneDNN product over the whole K, so the result's bits
// depend on the shape, strides and dtypes alone, never on the thread count. Primitives are cached
// per thread and shape. Called inside an OpenMP parallel region the product runs on the calling
// thread alone; outside one its tiles are shared among the thread's OpenMP team.
#pragma once

#include <cstdint>

#include "laga/core/dtype.hpp"
#include "laga/core/tensor.hpp"

namespace laga {

struct MatmulParams {
  int64_t batch = 1, M = 0, N = 0, K = 0;
  DType ab_dtype = DType::f32;  // A and B
  DType c_dtype = DType::f32;
  const void* a = nullptr;  // A [batch, M, K]
  int64_t a_batch_stride = 0, a_m_stride = 0, a_k_stride = 1;
  const void* b = nullptr;  // B [batch, K, N]
  int64_t b_batch_stride = 0, b_k_stride = 0, b_n_stride = 1;
  void* c = nullptr;  // C [batch, M, N]  (=), or (+=) when accumulate
  int64_t c_batch_stride = 0, c_m_stride = 0, c_n_stride = 1;
  float alpha = 1.0f;
  bool accumulate = false;
};

void matmul(const MatmulParams& p);

// A 2-D matrix inside a buffer: rows × cols, rows `ld` elements apart (a column slice of a wider
// tensor is a MatView with ld > cols).
struct MatView {
  void* data = nullptr;
  int64_t rows = 0, cols = 0, ld = 0;
  DType dtype = DType::f32;
  MatView t() const;  // marks the view transposed (read as cols × rows)
  MatView col_slice(int64_t begin, int64_t end) const;
  bool transposed = false;
};
// A tensor flattened to [numel / last, last].
MatView mat(const Tensor& t);

// C = op(A) · op(B) (=, or += when accumulate), op = transpose where the view says so.
void matmul_2d(const MatView& a, const MatView& b, const MatView& c, bool accumulate = false,
               float alpha = 1.0f);

}  // namespace laga
