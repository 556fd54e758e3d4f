// fp64 reference attention: causal softmax(scale · q kᵀ) v, and its backward, by the definition.
// Query head h uses key/value head h / (Hq / Hkv).
#pragma once

#include "reference/array.hpp"

namespace laga::ref {

// q [T, B, Hq, Dqk], k [T, B, Hkv, Dqk], v [T, B, Hkv, Dv] -> o [T, B, Hq, Dv]
Array attention_forward(const Array& q, const Array& k, const Array& v, double scale, bool causal);

struct AttentionGrads {
  Array dq, dk, dv;  // shapes of q, k, v
};
AttentionGrads attention_backward(const Array& q, const Array& k, const Array& v, const Array& dout, double scale,
                                  bool causal);

}  // namespace laga::ref
