// The loops of ops/elementwise.hpp.
#include "laga/ops/elementwise.hpp"
#include "laga/core/work.hpp"

#include <cstring>
#include <type_traits>

namespace laga {

void* at(const Tensor& x, int64_t offset) {
  return static_cast<char*>(x.raw()) + offset * dtype_size(x.dtype());
}

void copy_rows(DType t, int64_t rows, int64_t cols, const void* src, int64_t src_stride, void* dst,
               int64_t dst_stride) {
  const int64_t es = dtype_size(t);
  WorkOp work(stream_work(WorkClass::accumulate, "copy", t, 2.0 * double(rows * cols * es)));
  if (meta_mode()) return;
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMin)
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(static_cast<char*>(dst) + i * dst_stride * es,
                static_cast<const char*>(src) + i * src_stride * es, size_t(cols * es));
}

void add_into(Tensor& y, const Tensor& x) {
  LAGA_ASSERT(y.shape() == x.shape() && y.dtype() == x.dtype(), "add_into '{}' {} += '{}' {}",
              y.tag(), shape_str(y.shape()), x.tag(), shape_str(x.shape()));
  WorkOp work(stream_work(WorkClass::accumulate, "add", y.dtype(), 3.0 * double(y.nbytes())));
  if (y.is_meta()) return;
  dispatch_dtype(y.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* yp = y.data<T>();
    const T* xp = x.data<T>();
#pragma omp parallel for schedule(static) if (y.numel() >= kParallelMin)
    for (int64_t i = 0; i < y.numel(); ++i)
      yp[i] = from_float<T>(to_float(yp[i]) + to_float(xp[i]));
  });
}

void sum_heads(DType src_t, int64_t rows, int64_t Hs, int64_t cols, const void* src,
               int64_t src_row, int64_t src_head, DType dst_t, void* dst, int64_t dst_row,
               bool accumulate) {
  WorkOp work(stream_work(WorkClass::elementwise, "sum heads", src_t,
                          double(rows * Hs * cols * dtype_size(src_t)) +
                              (accumulate ? 2.0 : 1.0) * double(rows * cols * dtype_size(dst_t))));
  if (meta_mode()) return;
  LAGA_ASSERT(dst_t == src_t || dst_t == DType::f32,
              "sum_heads from {} into {}: the destination is the source's "
              "dtype or fp32",
              dtype_name(src_t), dtype_name(dst_t));
  dispatch_dtype(src_t, [&](auto* stag) {
    using S = std::remove_pointer_t<decltype(stag)>;
    dispatch_dtype(dst_t, [&](auto* dtag) {
      using D = std::remove_pointer_t<decltype(dtag)>;
      const S* s = static_cast<const S*>(src);
      D* d = static_cast<D*>(dst);
#pragma omp parallel for schedule(static) if (rows * Hs * cols >= kParallelMin)
      for (int64_t m = 0; m < rows; ++m)
        for (int64_t i = 0; i < cols; ++i) {
          float acc = accumulate ? to_float(d[m * dst_row + i]) : 0.0f;
          for (int64_t h = 0; h < Hs; ++h) acc += to_float(s[m * src_row + h * src_head + i]);
          d[m * dst_row + i] = from_float<D>(acc);
        }
    });
  });
}

}  // namespace laga
