// The collectives of sequence parallelism as forward/backward pairs over sequence-first tensors.
// Each forward's adjoint is fixed, so a form names the pair and the backward cannot pick the wrong
// one:
//
//   scatter_heads        [N, B, H, d] -> [T, B, Hr, d]   all-to-all (Ulysses: sequence-gather,
//                        head-scatter)
//   gather_heads         [T, B, Hr, d] -> [N, B, H, d]   the inverse all-to-all; each is the
//                        other's adjoint
//   all_gather_tokens    [N, B, d]     -> [T, B, d]      all-gather (the latent, §2.3/§2.4)
//   reduce_scatter_tokens [T, B, d]    -> [N, B, d]      reduce-scatter: the all-gather's adjoint
//   ring_shift           [N, ...]      -> [N, ...]       send_recv: rank r's block to rank r+1 (the
//                                                         ring forms' hop; a gradient travels back
//                                                         the same way)
//
// reduce_scatter_tokens may return another dtype than it reduces: fp32 partial sums (x) summed over
// ranks in fp32 into an fp32 buffer (tag + "_sum") and rounded once to `out`, so the sum over ranks
// sees no rounding of the partials (RunChoices::dlatent_sum).
//
// N = T/P tokens of this rank (rank r holds rows r·N .. (r+1)·N of the sequence; the token pair
// also takes Shards::zigzag: rank r holds chunks r and 2P−1−r of C = N/2 rows, its N local rows
// the two chunks in that order — the same collective, the gathered tensor put in sequence order at
// the wait and the reduce-scatter's input put in rank order before the issue, block by block in
// place), Hr = H/P heads
// (rank r holds heads r·Hr ..). Every buffer is a tracked tensor (the all-to-alls' packing buffers
// are tagged "comm.send" / "comm.recv"); `name` is the tensor's name in the ledger. Math and
// accounting: docs/design.md §2 and §4.
//
// Each pair also comes non-blocking (`*_start`, the communicator's non-blocking collectives
// underneath): it allocates what the blocking call allocates, in the same order, issues the
// collective and returns an InFlight; InFlight::wait() completes it and returns the output. The
// blocking call is start + wait, so both give the same bits, the same ledger record and the same
// allocations. A start that takes its input by value releases it as soon as it is no longer read
// (scatter_heads: once packed), so a caller that moves its tensor in frees it there.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "laga/comm/communicator.hpp"
#include "laga/core/tensor.hpp"

namespace laga {

// How the ranks of all_gather_tokens / reduce_scatter_tokens hold the sequence (above).
enum class Shards { contiguous, zigzag };

// A pair's collective in flight: it keeps alive every buffer the collective reads or writes until
// wait(), which completes it (unpacking where the pair needs to) and returns the output tensor.
// Move-only; empty when default-constructed or after wait(). Destroyed unwaited, its handle waits
// (CollectiveHandle's rules), then the buffers are released.
class InFlight {
 public:
  InFlight() = default;
  InFlight(InFlight&&) noexcept = default;
  // settles the current one first, as the destructor does
  InFlight& operator=(InFlight&& o) noexcept;
  // An InFlight that holds an output already complete: wait() returns it.
  static InFlight done(Tensor out);
  bool empty() const { return !finish_; }
  Tensor wait();

 private:
  friend InFlight scatter_heads_start(Communicator&, Tensor, const std::string&,
                                      const std::string&);
  friend InFlight gather_heads_start(Communicator&, Tensor, const std::string&, const std::string&);
  friend InFlight all_gather_tokens_start(Communicator&, Tensor, const std::string&,
                                          const std::string&, Shards);
  friend InFlight reduce_scatter_tokens_start(Communicator&, Tensor, const std::string&,
                                              const std::string&, DType, Shards);
  friend InFlight ring_shift_start(Communicator&, Tensor, const std::string&, const std::string&);
  Communicator* comm_ = nullptr;
  // what the collective still reads or writes, released after finish_
  std::vector<Tensor> keep_;
  std::function<Tensor()> finish_;  // after the wait: the output (gather_heads unpacks it first)
  CollectiveHandle handle_;         // declared last: destroyed (so settled) before the buffers go
};

Tensor scatter_heads(Communicator& comm, const Tensor& x, const std::string& name,
                     const std::string& tag);
Tensor gather_heads(Communicator& comm, const Tensor& x, const std::string& name,
                    const std::string& tag);
Tensor all_gather_tokens(Communicator& comm, const Tensor& x, const std::string& name,
                         const std::string& tag, Shards shards = Shards::contiguous);
Tensor reduce_scatter_tokens(Communicator& comm, const Tensor& x, const std::string& name,
                             const std::string& tag);
Tensor reduce_scatter_tokens(Communicator& comm, const Tensor& x, const std::string& name,
                             const std::string& tag, DType out, Shards shards = Shards::contiguous);

InFlight scatter_heads_start(Communicator& comm, Tensor x, const std::string& name,
                             const std::string& tag);
// One hop of a ring: returns (at wait) rank r−1's x, of x's shape and dtype, in a tensor tagged
// `tag`; x goes to rank r+1. x is kept (and may be read by the caller) until the wait.
InFlight ring_shift_start(Communicator& comm, Tensor x, const std::string& name,
                          const std::string& tag);
InFlight gather_heads_start(Communicator& comm, Tensor x, const std::string& name,
                            const std::string& tag);
InFlight all_gather_tokens_start(Communicator& comm, Tensor x, const std::string& name,
                                 const std::string& tag, Shards shards = Shards::contiguous);
InFlight reduce_scatter_tokens_start(Communicator& comm, Tensor x, const std::string& name,
                                     const std::string& tag);
// Zigzag: x is reordered in place (the caller moves its tensor in).
InFlight reduce_scatter_tokens_start(Communicator& comm, Tensor x, const std::string& name,
                                     const std::string& tag, DType out,
                                     Shards shards = Shards::contiguous);

}  // namespace laga
