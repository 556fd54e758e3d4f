// fp64 reference of the MLA block stack, y = x + MLA(RMSNorm(x)) per layer (DESIGN §2.1–§2.2,
// explicit form, one rank), forward and backward, written from the equations — the specification
// every form and rank count is checked against.
#pragma once

#include <map>
#include <string>

#include "laga/core/config.hpp"
#include "laga/mla/weights.hpp"
#include "reference/array.hpp"

namespace laga::ref {

// Keyed "layers.{l}.<name>" as in Weights::for_each.
using RefWeights = std::map<std::string, Array>;
RefWeights from_weights(const Weights& w);

// x [T, B, D] -> y [T, B, D], over c.num_layers layers.
Array block_forward(const MlaConfig& c, const RefWeights& w, const Array& x);

struct BlockGrads {
  Array dx;        // [T, B, D]
  RefWeights dw;   // same keys as the weights
};
BlockGrads block_backward(const MlaConfig& c, const RefWeights& w, const Array& x, const Array& dy);

}  // namespace laga::ref
