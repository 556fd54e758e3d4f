// attention_merge (ops/attention.hpp): the log-sum-exp merge of partial attentions over disjoint
// key sets, fp32 in and out, each merge computed in fp64 and rounded once, elementwise. Used by the
// ring forms (src/mla/forms/ring.cpp, docs/design.md §6); the math is the online softmax's
// rescaling, applied across calls.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "laga/core/error.hpp"
#include "laga/ops/attention.hpp"
#include "laga/core/work.hpp"

namespace laga {

void attention_merge(const Tensor& o_part, const Tensor& lse_part, Tensor& o_acc, Tensor& lse_acc,
                     bool first) {
  LAGA_ASSERT(o_part.rank() == 4 && lse_part.rank() == 3,
              "attention_merge: o {} and lse {} are not [T, B, H, Dv] "
              "and [B, H, T]",
              shape_str(o_part.shape()), shape_str(lse_part.shape()));
  const int64_t T = o_part.dim(0), B = o_part.dim(1), H = o_part.dim(2), Dv = o_part.dim(3);
  check_shape(o_acc, o_part.shape(), "o_acc (attention_merge)");
  check_shape(lse_part, {B, H, T}, "lse_part (attention_merge)");
  check_shape(lse_acc, {B, H, T}, "lse_acc (attention_merge)");
  for (const Tensor* t :
       {&o_part, &lse_part, const_cast<const Tensor*>(&o_acc), const_cast<const Tensor*>(&lse_acc)})
    check_dtype(*t, DType::f32, "attention_merge operand");
  WorkOp work(stream_work(WorkClass::accumulate, "merge", DType::f32,
                          (first ? 2.0 : 3.0) * double(o_part.nbytes() + lse_part.nbytes())));
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
  // Each merge is computed in fp64 and its lse and outputs rounded to fp32 once, so a merge adds at
  // most half an fp32 ulp to what it stores. In fp32, log and exp of the lse add a few ulps per
  // merge; a row merged over 2P−1 chunk pairs (ring forms at P 8: 15 merges) accumulated that into
  // P = e^(s − lse) of the backward and failed verify's rule on a random configuration (T 48,
  // 3-token chunks).
#pragma omp parallel for schedule(static) if (T * B * H * Dv >= (int64_t(1) << 15))
  for (int64_t row = 0; row < T * B * H; ++row) {
    const int64_t t = row / (B * H), b = (row / H) % B, h = row % H;
    const int64_t l = (b * H + h) * T + t;
    const double A = la[l], Pp = lp[l];
    const double m = std::max(A, Pp);
    const double lse = m + std::log(std::exp(A - m) + std::exp(Pp - m));
    const double wa = std::exp(A - lse), wp = std::exp(Pp - lse);
    float* a = oa + row * Dv;
    const float* x = op + row * Dv;
    for (int64_t d = 0; d < Dv; ++d) a[d] = float(wa * a[d] + wp * x[d]);
    la[l] = float(lse);
  }
}

}  // namespace laga
