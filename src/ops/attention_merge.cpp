// attention_merge (ops/attention.hpp): the log-sum-exp merge of partial attentions over disjoint key
// sets, in fp32, elementwise. Used by the ring forms (src/mla/forms/ring_kv.cpp); the math is that of
// the online softmax across calls (docs/attention.md §3).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "laga/core/error.hpp"
#include "laga/ops/attention.hpp"

namespace laga {

void attention_merge(const Tensor& o_part, const Tensor& lse_part, Tensor& o_acc, Tensor& lse_acc, bool first) {
  LAGA_ASSERT(o_part.rank() == 4 && lse_part.rank() == 3, "attention_merge: o {} and lse {} are not [T, B, H, Dv] "
              "and [B, H, T]", shape_str(o_part.shape()), shape_str(lse_part.shape()));
  const int64_t T = o_part.dim(0), B = o_part.dim(1), H = o_part.dim(2), Dv = o_part.dim(3);
  check_shape(o_acc, o_part.shape(), "o_acc (attention_merge)");
  check_shape(lse_part, {B, H, T}, "lse_part (attention_merge)");
  check_shape(lse_acc, {B, H, T}, "lse_acc (attention_merge)");
  for (const Tensor* t : {&o_part, &lse_part, const_cast<const Tensor*>(&o_acc), const_cast<const Tensor*>(&lse_acc)})
    check_dtype(*t, DType::f32, "attention_merge operand");
  if (o_acc.is_meta()) return;
  const float* op = o_part.data<float>();
  const float* lp = lse_part.data<float>();
  float* oa = o_acc.data<float>();
  float* la = lse_acc.data<float>();
  if (first) {
    std::memcpy(oa, op, size_t(o_part.numel()) * sizeof(float));
    std::memcpy(la, lp, size_t(lse_part.numel()) * sizeof(float));
    return;
  }
  // One task per (t, b, h) row: its lse and its Dv outputs; no two tasks write the same element.
#pragma omp parallel for schedule(static) if (T * B * H * Dv >= (int64_t(1) << 15))
  for (int64_t row = 0; row < T * B * H; ++row) {
    const int64_t t = row / (B * H), b = (row / H) % B, h = row % H;
    const int64_t l = (b * H + h) * T + t;
    const float m = std::max(la[l], lp[l]);
    const float lse = m + std::log(std::exp(la[l] - m) + std::exp(lp[l] - m));
    const float wa = std::exp(la[l] - lse), wp = std::exp(lp[l] - lse);
    float* a = oa + row * Dv;
    const float* x = op + row * Dv;
    for (int64_t d = 0; d < Dv; ++d) a[d] = wa * a[d] + wp * x[d];
    la[l] = lse;
  }
}

}  // namespace laga
