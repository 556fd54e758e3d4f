// LayerNorm forward and backward on the CPU (ops/layernorm.hpp): rows in parallel, fp32 arithmetic
// and statistics whatever the storage, except the weight and bias gradients' sums over rows, which
// are in fp64 and rounded once into dw and db, as rmsnorm.cpp does for its dw. Summed over rows in
// a fixed order (column blocks in parallel), so results do not depend on the thread count. Nothing
// is saved by the forward. Derivation: docs/sparse.md.
#include "laga/ops/layernorm.hpp"

#include <algorithm>
#include <cmath>

#include "laga/core/memory.hpp"
#include "laga/core/tensor.hpp"
#include "laga/core/work.hpp"

namespace laga {

namespace {

// mean and rstd of row xr [C]: two passes in fp32 (the variance from the centred values).
template <class T>
void row_stats(const T* xr, int64_t C, double eps, float& mean, float& rstd) {
  float s = 0;
  for (int64_t c = 0; c < C; ++c) s += to_float(xr[c]);
  mean = s / float(C);
  float v = 0;
  for (int64_t c = 0; c < C; ++c) {
    const float d = to_float(xr[c]) - mean;
    v += d * d;
  }
  rstd = float(1.0 / std::sqrt(double(v) / double(C) + eps));
}

template <class T>
void forward_impl(const LayerNormParams& p) {
  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.w);
  const T* bias = static_cast<const T*>(p.b);
  T* y = static_cast<T*>(p.y);
#pragma omp parallel for schedule(static) if (p.M * p.C >= kParallelMin)
  for (int64_t m = 0; m < p.M; ++m) {
    const T* xr = x + m * p.C;
    T* yr = y + m * p.C;
    float mean, rstd;
    row_stats(xr, p.C, p.eps, mean, rstd);
    for (int64_t c = 0; c < p.C; ++c)
      yr[c] = from_float<T>((to_float(xr[c]) - mean) * rstd * to_float(w[c]) + to_float(bias[c]));
  }
}

template <class T>
void backward_impl(const LayerNormBwdParams& p) {
  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.w);
  const T* dy = static_cast<const T*>(p.dy);
  T* dx = static_cast<T*>(p.dx);
  Tensor stats = Tensor::empty({p.M, 2}, DType::f32, "norm.stats");  // [M, 2] mean, rstd
  if (stats.is_meta()) return;
  float* st = stats.data<float>();
  // y_c = x̂_c w_c + b_c, x̂ = (x − μ) r, r = (var + eps)^-½, g_c = dy_c w_c:
  //   dx_c = r (g_c − mean(g) − x̂_c mean(g x̂)),  dw_c += Σ_m dy_c x̂_c,  db_c += Σ_m dy_c
#pragma omp parallel for schedule(static) if (p.M * p.C >= kParallelMin)
  for (int64_t m = 0; m < p.M; ++m) {
    const T* xr = x + m * p.C;
    const T* dyr = dy + m * p.C;
    T* dxr = dx + m * p.C;
    float mean, rstd;
    row_stats(xr, p.C, p.eps, mean, rstd);
    st[2 * m] = mean, st[2 * m + 1] = rstd;
    float sg = 0, sgx = 0;
    for (int64_t c = 0; c < p.C; ++c) {
      const float g = to_float(dyr[c]) * to_float(w[c]);
      sg += g;
      sgx += g * (to_float(xr[c]) - mean) * rstd;
    }
    const float mg = sg / float(p.C), mgx = sgx / float(p.C);
    for (int64_t c = 0; c < p.C; ++c) {
      const float xh = (to_float(xr[c]) - mean) * rstd;
      dxr[c] = from_float<T>(rstd * (to_float(dyr[c]) * to_float(w[c]) - mg - xh * mgx));
    }
  }
  constexpr int64_t kCols = 64;
#pragma omp parallel for schedule(static) if (p.M * p.C >= kParallelMin)
  for (int64_t c0 = 0; c0 < p.C; c0 += kCols) {
    const int64_t c1 = std::min(p.C, c0 + kCols);
    double aw[kCols] = {}, ab[kCols] = {};
    for (int64_t m = 0; m < p.M; ++m) {
      const T* xr = x + m * p.C;
      const T* dyr = dy + m * p.C;
      for (int64_t c = c0; c < c1; ++c) {
        const double g = to_float(dyr[c]);
        aw[c - c0] += g * (double(to_float(xr[c])) - st[2 * m]) * double(st[2 * m + 1]);
        ab[c - c0] += g;
      }
    }
    dispatch_dtype(p.dw_dtype, [&](auto* tag) {
      using G = std::remove_pointer_t<decltype(tag)>;
      G* dw = static_cast<G*>(p.dw);
      G* db = static_cast<G*>(p.db);
      for (int64_t c = c0; c < c1; ++c) {
        dw[c] = from_float<G>(float(double(to_float(dw[c])) + aw[c - c0]));
        db[c] = from_float<G>(float(double(to_float(db[c])) + ab[c - c0]));
      }
    });
  }
}

}  // namespace

void layernorm_forward(const LayerNormParams& p) {
  // x read, y written, w and b read
  WorkOp work(stream_work(WorkClass::elementwise, "layernorm", p.dtype,
                          double((2 * p.M * p.C + 2 * p.C) * dtype_size(p.dtype))));
  if (meta_mode()) return;
  dispatch_dtype(p.dtype,
                 [&](auto* tag) { forward_impl<std::remove_pointer_t<decltype(tag)>>(p); });
}

void layernorm_backward(const LayerNormBwdParams& p) {
  // x, dy and w read, dx written, dw and db read and written
  WorkOp work(stream_work(
      WorkClass::elementwise, "layernorm", p.dtype,
      double((3 * p.M * p.C + p.C) * dtype_size(p.dtype) + 4 * p.C * dtype_size(p.dw_dtype))));
  dispatch_dtype(p.dtype,
                 [&](auto* tag) { backward_impl<std::remove_pointer_t<decltype(tag)>>(p); });
}

}  // namespace laga
