// LayerNorm over the last dim with weight and bias: y = (x − mean) · rstd · w + b, rstd =
// 1 / sqrt(var + eps), var the biased variance (PyTorch's F.layer_norm). The lightning indexer's
// k_norm. Nothing is saved: backward recomputes mean and rstd from x. Statistics in fp32.
// Derivation: docs/sparse.md.
#pragma once

#include <cstdint>

#include "laga/core/dtype.hpp"

namespace laga {

struct LayerNormParams {
  int64_t M = 0, C = 0;      // rows, normalised width
  DType dtype = DType::f32;  // of x, y, dx, dy, w and b
  double eps = 1e-6;
  const void* x = nullptr;  // [M, C] dense
  const void* w = nullptr;  // [C]
  const void* b = nullptr;  // [C]
  void* y = nullptr;        // [M, C] (=)
};

struct LayerNormBwdParams : LayerNormParams {
  const void* dy = nullptr;     // [M, C]
  void* dx = nullptr;           // [M, C] (=)
  void* dw = nullptr;           // [C] (+=)
  void* db = nullptr;           // [C] (+=)
  DType dw_dtype = DType::f32;  // of dw and db (fp32 accumulation)
};

void layernorm_forward(const LayerNormParams& p);
// Sums over the rows in one fixed order (bitwise independent of the thread count).
void layernorm_backward(const LayerNormBwdParams& p);

}  // namespace laga
