// RMSNorm forward and backward on the CPU: rows in parallel, fp32 arithmetic whatever the storage,
// except the weight gradient's sum over rows, which is in fp64 (each product dy·x·r too) and
// rounded once into dw: summed in fp32 over a rank's T·B/P rows it was the largest error of the
// norm gradients (docs/block.md §4.2, docs/numerics.md §3). The cost is C·M products in fp64,
// nothing beside the attention. Summed over rows in a fixed order (column blocks in parallel), so
// results do not depend on the thread count.
#include "laga/ops/rmsnorm.hpp"
#include "laga/core/work.hpp"

#include <cmath>

namespace laga {

namespace {

template <class T>
void forward_impl(const RmsNormParams& p) {
  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.w);
  T* y = static_cast<T*>(p.y);
#pragma omp parallel for schedule(static) if (p.M * p.C >= kParallelMin)
  for (int64_t m = 0; m < p.M; ++m) {
    const T* xr = x + m * p.x_stride;
    T* yr = y + m * p.y_stride;
    float ss = 0;
    for (int64_t c = 0; c < p.C; ++c) ss += to_float(xr[c]) * to_float(xr[c]);
    float r = float(1.0 / std::sqrt(double(ss) / double(p.C) + p.eps));
    for (int64_t c = 0; c < p.C; ++c) yr[c] = from_float<T>(to_float(xr[c]) * r * to_float(w[c]));
  }
}

template <class T>
void backward_impl(const RmsNormBwdParams& p) {
  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.w);
  const T* dy = static_cast<const T*>(p.dy);
  T* dx = static_cast<T*>(p.dx);
  Tensor rstd = Tensor::empty({p.M}, DType::f32, "norm.rstd");  // [M] fp32, freed on return
  if (rstd.is_meta()) return;
  float* r = rstd.data<float>();
  // y_c = x_c·r·w_c, r = (Σx²/C + eps)^-½
  //   dx_c = r·w_c·dy_c − x_c·r³/C · Σ_j dy_j·w_j·x_j
  //   dw_c += Σ_m dy_c·x_c·r
#pragma omp parallel for schedule(static) if (p.M * p.C >= kParallelMin)
  for (int64_t m = 0; m < p.M; ++m) {
    const T* xr = x + m * p.x_stride;
    const T* dyr = dy + m * p.dy_stride;
    T* dxr = dx + m * p.dx_stride;
    float ss = 0, dot = 0;
    for (int64_t c = 0; c < p.C; ++c) {
      float xv = to_float(xr[c]);
      ss += xv * xv;
      dot += to_float(dyr[c]) * to_float(w[c]) * xv;
    }
    float rm = float(1.0 / std::sqrt(double(ss) / double(p.C) + p.eps));
    r[m] = rm;
    float k = rm * rm * rm * dot / float(p.C);
    for (int64_t c = 0; c < p.C; ++c)
      dxr[c] = from_float<T>(rm * to_float(w[c]) * to_float(dyr[c]) - to_float(xr[c]) * k);
  }
  constexpr int64_t kCols = 64;
#pragma omp parallel for schedule(static) if (p.M * p.C >= kParallelMin)
  for (int64_t c0 = 0; c0 < p.C; c0 += kCols) {
    const int64_t c1 = std::min(p.C, c0 + kCols);
    double acc[kCols] = {};
    for (int64_t m = 0; m < p.M; ++m) {
      const T* xr = x + m * p.x_stride;
      const T* dyr = dy + m * p.dy_stride;
      for (int64_t c = c0; c < c1; ++c)
        acc[c - c0] += double(to_float(dyr[c])) * double(to_float(xr[c])) * double(r[m]);
    }
    dispatch_dtype(p.dw_dtype, [&](auto* tag) {
      using G = std::remove_pointer_t<decltype(tag)>;
      G* dw = static_cast<G*>(p.dw);
      for (int64_t c = c0; c < c1; ++c)
        dw[c] = from_float<G>(float(double(to_float(dw[c])) + acc[c - c0]));
    });
  }
}

}  // namespace

void rmsnorm_forward(const RmsNormParams& p) {
  // x read, y written, w read
  WorkOp work(stream_work(WorkClass::elementwise, "rmsnorm", p.dtype,
                          double((2 * p.M * p.C + p.C) * dtype_size(p.dtype))));
  if (meta_mode()) return;
  dispatch_dtype(p.dtype,
                 [&](auto* tag) { forward_impl<std::remove_pointer_t<decltype(tag)>>(p); });
}

void rmsnorm_backward(const RmsNormBwdParams& p) {
  // x, dy and w read, dx written, dw read and written
  WorkOp work(stream_work(
      WorkClass::elementwise, "rmsnorm", p.dtype,
      double((3 * p.M * p.C + p.C) * dtype_size(p.dtype) + 2 * p.C * dtype_size(p.dw_dtype))));
  dispatch_dtype(p.dtype,
                 [&](auto* tag) { backward_impl<std::remove_pointer_t<decltype(tag)>>(p); });
}

Tensor rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, const std::string& tag) {
  const int64_t C = x.dim(-1);
  check_shape(w, {C}, "rmsnorm weight");
  LAGA_CHECK(w.dtype() == x.dtype(), "rmsnorm '{}': weight is {}, input {}", tag,
             dtype_name(w.dtype()), dtype_name(x.dtype()));
  Tensor y = Tensor::empty(x.shape(), x.dtype(), tag);
  RmsNormParams p;
  p.M = x.numel() / C, p.C = C, p.dtype = x.dtype(), p.eps = eps;
  p.x = x.raw(), p.x_stride = C, p.w = w.raw(), p.y = y.raw(), p.y_stride = C;
  rmsnorm_forward(p);
  return y;
}

void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& dy, double eps, Tensor& dx,
                      Tensor& dw) {
  const int64_t C = x.dim(-1);
  check_shape(dy, x.shape(), "rmsnorm dy");
  check_shape(dx, x.shape(), "rmsnorm dx");
  check_shape(dw, {C}, "rmsnorm dw");
  RmsNormBwdParams p;
  p.M = x.numel() / C, p.C = C, p.dtype = x.dtype(), p.eps = eps;
  p.x = x.raw(), p.x_stride = C, p.w = w.raw();
  p.dy = dy.raw(), p.dy_stride = C, p.dx = dx.raw(), p.dx_stride = C, p.dw = dw.raw(),
  p.dw_dtype = dw.dtype();
  rmsnorm_backward(p);
}

}  // namespace laga
