// The collectives of sequence parallelism as forward/backward pairs over sequence-first tensors. Each
// forward's adjoint is fixed, so a form names the pair and the backward cannot pick the wrong one:
//
//   scatter_heads        [N, B, H, d] -> [T, B, Hr, d]   all-to-all (Ulysses: sequence-gather, head-scatter)
//   gather_heads         [T, B, Hr, d] -> [N, B, H, d]   the inverse all-to-all; each is the other's adjoint
//   all_gather_tokens    [N, B, d]     -> [T, B, d]      all-gather (the latent, §2.3/§2.4)
//   reduce_scatter_tokens [T, B, d]    -> [N, B, d]      reduce-scatter: the all-gather's adjoint
//
// reduce_scatter_tokens may return another dtype than it reduces: fp32 partial sums (x) summed over
// ranks in fp32 into an fp32 buffer (tag + "_sum") and rounded once to `out`, so the sum over ranks
// sees no rounding of the partials (RunChoices::dlatent_sum).
//
// N = T/P tokens of this rank (rank r holds rows r·N .. (r+1)·N of the sequence), Hr = H/P heads
// (rank r holds heads r·Hr ..). Every buffer is a tracked tensor (the all-to-alls' packing buffers are
// tagged "comm.send" / "comm.recv"); `name` is the tensor's name in the ledger. Math and accounting:
// docs/design.md §2 and §4.
#pragma once

#include <string>

#include "laga/comm/communicator.hpp"
#include "laga/core/tensor.hpp"

namespace laga {

Tensor scatter_heads(Communicator& comm, const Tensor& x, const std::string& name, const std::string& tag);
Tensor gather_heads(Communicator& comm, const Tensor& x, const std::string& name, const std::string& tag);
Tensor all_gather_tokens(Communicator& comm, const Tensor& x, const std::string& name, const std::string& tag);
Tensor reduce_scatter_tokens(Communicator& comm, const Tensor& x, const std::string& name, const std::string& tag);
Tensor reduce_scatter_tokens(Communicator& comm, const Tensor& x, const std::string& name, const std::string& tag,
                             DType out);

}  // namespace laga
