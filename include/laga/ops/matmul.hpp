// matmul: the one matrix product of laga, on oneDNN, for every op and kernel.
//
//   C[b, m, n] (= or +=) alpha · Σ_k A[b, m, k] · B[b, k, n]
//
// Operands are given by pointer, dtype and element strides, so a transpose is a swap of strides and
// a head slice of a sequence-first tensor is a row stride: nothing is copied. Accumulation in fp32;
// A and B share one dtype (fp32 or bf16), C may be fp32 or bf16. Primitives are cached per thread
// and shape. Called inside an OpenMP parallel region the product runs on the calling thread alone;
// outside one it uses the thread's OpenMP team.
#pragma once

#include <cstdint>

#include "laga/core/dtype.hpp"
#include "laga/core/tensor.hpp"

namespace laga {

struct MatmulParams {
  int64_t batch = 1, M = 0, N = 0, K = 0;
  DType ab_dtype = DType::f32;  // A and B
  DType c_dtype = DType::f32;
  const void* a = nullptr;      // A [batch, M, K]
  int64_t a_batch_stride = 0, a_m_stride = 0, a_k_stride = 1;
  const void* b = nullptr;      // B [batch, K, N]
  int64_t b_batch_stride = 0, b_k_stride = 0, b_n_stride = 1;
  void* c = nullptr;            // C [batch, M, N]  (=), or (+=) when accumulate
  int64_t c_batch_stride = 0, c_m_stride = 0, c_n_stride = 1;
  float alpha = 1.0f;
  bool accumulate = false;
};

void matmul(const MatmulParams& p);

// Dense 2-D helpers over whole tensors: C[M,N] = A[M,K] · op(B), where op(B) is B [K,N]
// (b_transposed = false) or Bᵀ for B [N,K] (true, the Linear layout). a_transposed reads A as [K,M].
void matmul_2d(const Tensor& a, bool a_transposed, const Tensor& b, bool b_transposed, Tensor& c,
               bool accumulate = false, float alpha = 1.0f);

}  // namespace laga
