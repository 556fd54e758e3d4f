// --check-finite: when on, the block checks its inputs, every activation it keeps, and every
// gradient, in dataflow order, and the first tensor holding a NaN or an Inf stops the run with a
// failure (exit 1) naming the tensor, the step (layer, forward/backward, rank) and the element.
// Off by default: then each check is one relaxed load.
#pragma once

#include <string>

#include "laga/core/tensor.hpp"

namespace laga {

void set_check_finite(bool on);
bool check_finite_enabled();
// Throws laga::Error (failure) if t holds a NaN or Inf: "non-finite value in <name> at <step>:
// ...".
void check_finite(const Tensor& t, const std::string& name, const std::string& step);

}  // namespace laga
