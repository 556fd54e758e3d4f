// RMSNorm over the last dim: y = x · rstd · w, rstd = 1 / sqrt(mean(x²) + eps). Nothing is saved:
// backward recomputes rstd from x. Rows may be strided (the first Lkv columns of kv).
// Derivation: docs/block.md §rmsnorm.
#pragma once

#include <string>

#include "laga/core/tensor.hpp"

namespace laga {

struct RmsNormParams {
  int64_t M = 0, C = 0;      // rows, normalised width
  DType dtype = DType::f32;  // of x, y, dx, dy and w
  double eps = 1e-6;
  const void* x = nullptr;
  int64_t x_stride = 0;     // [M, C] rows x_stride apart
  const void* w = nullptr;  // [C]
  void* y = nullptr;
  int64_t y_stride = 0;  // [M, C] (=)
};

struct RmsNormBwdParams : RmsNormParams {
  const void* dy = nullptr;
  int64_t dy_stride = 0;  // [M, C]
  void* dx = nullptr;
  int64_t dx_stride = 0;  // [M, C] (=)
  void* dw = nullptr;     // [C] (+=)
  // the gradient's own dtype (fp32 accumulation)
  DType dw_dtype = DType::f32;
};

void rmsnorm_forward(const RmsNormParams& p);
void rmsnorm_backward(const RmsNormBwdParams& p);

// Whole-tensor forms: x [..., C], w [C].
Tensor rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, const std::string& tag);
// dx (=), dw (+=; fp32 or x's dtype).
void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& dy, double eps, Tensor& dx,
                      Tensor& dw);

}  // namespace laga
