// fp64 reference attention: causal softmax(scale · q kᵀ) v, and its backward, by the definition.
// Query head h uses key/value head h / (Hq / Hkv).
//
// `storage` (empty: exact fp64) emulates a plain implementation in that dtype: every sum
// accumulates in fp32 (each partial sum rounded to fp32), and the probabilities P are rounded to
// the storage dtype before P·V and Pᵀ·dO, and dS before dS·K and dSᵀ·Q (both laga kernels store P
// and dS tiles in the storage dtype; an eager PyTorch bf16 implementation stores them too). The
// outputs themselves are left unrounded: the caller rounds them.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "reference/array.hpp"

namespace laga::ref {

// The keys each query row may see besides the causal rule: [B, T, T] row-major (b, t, j), 1 =
// seen (the sparse forms' selections, docs/sparse.md). Null: every key the causal rule allows.
using KeyMask = std::vector<uint8_t>;

// q [T, B, Hq, Dqk], k [T, B, Hkv, Dqk], v [T, B, Hkv, Dv] -> o [T, B, Hq, Dv]
Array attention_forward(const Array& q, const Array& k, const Array& v, double scale, bool causal,
                        std::optional<DType> storage = std::nullopt, const KeyMask* mask = nullptr);

struct AttentionGrads {
  Array dq, dk, dv;  // shapes of q, k, v
};
// o (optional, [T, B, Hq, Dv]): the forward's stored output. Given, each row's delta = Σ_i p_i dp_i
// is taken as FlashAttention's backward takes it, rowsum(dO ∘ O) over the output (equal in exact
// arithmetic, rounded otherwise: docs/attention.md §2); absent, from p and dp of the row itself.
AttentionGrads attention_backward(const Array& q, const Array& k, const Array& v, const Array& dout,
                                  double scale, bool causal,
                                  std::optional<DType> storage = std::nullopt,
                                  const Array* o = nullptr, const KeyMask* mask = nullptr);

}  // namespace laga::ref
