// Linear: y[..., O] = x[..., I] · w[O, I]ᵀ (no bias; DeepSeek's projections have none), on oneDNN.
// Derivation: docs/block.md §linear.
#pragma once

#include <string>

#include "laga/core/tensor.hpp"

namespace laga {

// x [..., I], w [O, I] -> y [..., O] (new tensor, x's dtype, tagged `tag`).
Tensor linear_forward(const Tensor& x, const Tensor& w, const std::string& tag);

// dy [..., O]; dx [..., I] (=, or += when accumulate_dx; skipped when null); dw [O, I] (+=).
void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                     bool accumulate_dx, Tensor& dw);
// Its dx half alone, the same product: dx [..., I] = dy·w (=, or += when accumulate_dx). For a
// caller that took dw earlier (linear_backward with dx null) and adds dx into a sum later, in a
// fixed order.
void linear_backward_dx(const Tensor& w, const Tensor& dy, Tensor& dx, bool accumulate_dx);

}  // namespace laga
