// fp64 reference ops: linear, RMSNorm, RoPE with YaRN. Plain loops, by the definitions of
// docs/design.md §1–§2. `acc` (default exact) picks how sums are accumulated (Accum,
// reference/array.hpp).
#pragma once

#include "laga/mla/config.hpp"
#include "reference/array.hpp"

namespace laga::ref {

// y[M, O] = x[M, I] · w[O, I]ᵀ. x may have any leading dims [..., I]; y is [..., O].
Array linear_forward(const Array& x, const Array& w, Accum acc = Accum::exact);
struct LinearGrads {
  Array dx, dw;
};
LinearGrads linear_backward(const Array& x, const Array& w, const Array& dy,
                            Accum acc = Accum::exact);

// y = x / sqrt(mean(x²) + eps) · w over the last dim C; x [..., C], w [C].
Array rmsnorm_forward(const Array& x, const Array& w, double eps, Accum acc = Accum::exact);
struct RmsNormGrads {
  Array dx, dw;
};
RmsNormGrads rmsnorm_backward(const Array& x, const Array& w, const Array& dy, double eps,
                              Accum acc = Accum::exact);

// RoPE with YaRN (docs/design.md §1.1, recomputed here from the config's raw fields) over the last
// dim Dr of x [T, ...middle..., Dr]; token t sits at global position pos0 + t. Layout per
// c.rope_interleaved.
Array rope_forward(const Array& x, const MlaConfig& c, int64_t pos0);
Array rope_backward(const Array& dy, const MlaConfig& c, int64_t pos0);

}  // namespace laga::ref
