// Linear forward and backward as oneDNN matrix products over the flattened leading dims.
#include "laga/ops/linear.hpp"

#include "laga/ops/matmul.hpp"

namespace laga {

Tensor linear_forward(const Tensor& x, const Tensor& w, const std::string& tag) {
  LAGA_CHECK(w.rank() == 2 && x.rank() >= 1 && x.dim(-1) == w.dim(1),
             "linear '{}': x {} does not fit w '{}' {}", tag, shape_str(x.shape()), w.tag(),
             shape_str(w.shape()));
  Shape ys = x.shape();
  ys.back() = w.dim(0);
  Tensor y = Tensor::empty(ys, x.dtype(), tag);
  matmul_2d(mat(x), mat(w).t(), mat(y));  // y[M, O] = x[M, I] · w[O, I]ᵀ
  return y;
}

void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                     bool accumulate_dx, Tensor& dw) {
  LAGA_CHECK(dy.numel() / dy.dim(-1) == x.numel() / x.dim(-1) && dy.dim(-1) == w.dim(0) &&
                 dw.shape() == w.shape(),
             "linear backward: x {}, w {}, dy {}, dw {}", shape_str(x.shape()),
             shape_str(w.shape()), shape_str(dy.shape()), shape_str(dw.shape()));
  // y = x·wᵀ  =>  dw += dyᵀ·x  [O, I],  dx = dy·w  [M, I]
  matmul_2d(mat(dy).t(), mat(x), mat(dw), /*accumulate=*/true);
  if (dx) {
    LAGA_CHECK(dx->shape() == x.shape(), "linear backward: dx {} differs from x {}",
               shape_str(dx->shape()), shape_str(x.shape()));
    linear_backward_dx(w, dy, *dx, accumulate_dx);
  }
}

void linear_backward_dx(const Tensor& w, const Tensor& dy, Tensor& dx, bool accumulate_dx) {
  LAGA_CHECK(w.rank() == 2 && dy.dim(-1) == w.dim(0) && dx.dim(-1) == w.dim(1) &&
                 dy.numel() / dy.dim(-1) == dx.numel() / dx.dim(-1),
             "linear backward: w {}, dy {}, dx {}", shape_str(w.shape()), shape_str(dy.shape()),
             shape_str(dx.shape()));
  matmul_2d(mat(dy), mat(w), mat(dx), accumulate_dx);  // dx = dy·w  [M, I]
}

}  // namespace laga
