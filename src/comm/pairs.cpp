// The collective pairs of comm/pairs.hpp: packing for the head all-to-alls, and the token-sharded
// all-gather / reduce-scatter, each started non-blocking (InFlight) and completed by wait(); the
// blocking pairs are start + wait.
#include "laga/comm/pairs.hpp"

#include <cstring>

#include "laga/ops/elementwise.hpp"

namespace laga {

InFlight& InFlight::operator=(InFlight&& o) noexcept {
  if (this != &o) {
    handle_ = std::move(o.handle_);  // settles ours before its buffers are released below
    comm_ = o.comm_;
    keep_ = std::move(o.keep_);
    finish_ = std::move(o.finish_);
    o.keep_.clear();
    o.finish_ = nullptr;
  }
  return *this;
}

InFlight InFlight::done(Tensor out) {
  InFlight f;
  f.finish_ = [out = std::move(out)] { return out; };
  return f;
}

Tensor InFlight::wait() {
  LAGA_ASSERT(finish_, "wait on an empty InFlight (never started, or already waited)");
  if (comm_) comm_->wait(handle_);
  Tensor out = finish_();
  finish_ = nullptr;  // what it captured (gather_heads' recv) goes first, then the kept buffers
  keep_.clear();
  return out;
}

InFlight scatter_heads_start(Communicator& comm, Tensor x, const std::string& name,
                             const std::string& tag) {
  LAGA_CHECK(x.rank() == 4 && x.dim(2) % comm.size() == 0,
             "scatter_heads of '{}': {} is not [N, B, H, d] with P = {} "
             "dividing H",
             name, shape_str(x.shape()), comm.size());
  const int64_t P = comm.size(), N = x.dim(0), B = x.dim(1), H = x.dim(2), d = x.dim(3), Hr = H / P;
  const DType dt = x.dtype();
  // send [P, N, B, Hr, d]: chunk j holds rank j's heads of every local token.
  Tensor send = Tensor::empty({P, N, B, Hr, d}, dt, "comm.send");
  for (int64_t j = 0; j < P; ++j)
    copy_rows(dt, N * B, Hr * d, at(x, j * Hr * d), H * d, at(send, j * N * B * Hr * d), Hr * d);
  x = Tensor();                                            // packed: no longer read
  Tensor out = Tensor::empty({P * N, B, Hr, d}, dt, tag);  // chunk j = rank j's tokens
  InFlight f;
  f.comm_ = &comm;
  f.handle_ = comm.all_to_all_start(send.raw(), out.raw(), N * B * Hr * d, dt, name);
  f.keep_ = {std::move(send)};
  f.finish_ = [out = std::move(out)] { return out; };
  return f;
}

InFlight gather_heads_start(Communicator& comm, Tensor x, const std::string& name,
                            const std::string& tag) {
  LAGA_CHECK(x.rank() == 4 && x.dim(0) % comm.size() == 0,
             "gather_heads of '{}': {} is not [T, B, Hr, d] with P = {} "
             "dividing T",
             name, shape_str(x.shape()), comm.size());
  const int64_t P = comm.size(), N = x.dim(0) / P, B = x.dim(1), Hr = x.dim(2), d = x.dim(3),
                H = Hr * P;
  const DType dt = x.dtype();
  // x's chunk j (rank j's tokens) goes to rank j; recv [P, N, B, Hr, d]: chunk j = rank j's heads.
  Tensor recv = Tensor::empty({P, N, B, Hr, d}, dt, "comm.recv");
  InFlight f;
  f.comm_ = &comm;
  f.handle_ = comm.all_to_all_start(x.raw(), recv.raw(), N * B * Hr * d, dt, name);
  f.keep_ = {std::move(x)};
  f.finish_ = [recv = std::move(recv), N, B, Hr, d, H, P, dt, tag] {
    Tensor out = Tensor::empty({N, B, H, d}, dt, tag);
    for (int64_t j = 0; j < P; ++j)
      copy_rows(dt, N * B, Hr * d, at(recv, j * N * B * Hr * d), Hr * d, at(out, j * Hr * d),
                H * d);
    return out;
  };
  return f;
}

namespace {

// The zigzag layout's block order (pairs.hpp): the 2P chunks of C rows in rank order are rank r's
// chunks r and 2P−1−r at places 2r and 2r + 1; in sequence order chunk j is at place j.
// zigzag_place: the place of chunk j in rank order; zigzag_chunk: the chunk at place i.
int64_t zigzag_place(int64_t chunk, int64_t P) {
  return chunk < P ? 2 * chunk : 2 * (2 * P - 1 - chunk) + 1;
}
int64_t zigzag_chunk(int64_t place, int64_t P) {
  return place % 2 == 0 ? place / 2 : 2 * P - 1 - place / 2;
}

// Reorders t's 2P blocks in place: afterwards block i holds what block source(i) held. Cycle by
// cycle through a scratch of one block; nothing moves on a meta tensor.
template <class Source>
void permute_blocks(const Tensor& t, int64_t P, Source source) {
  const int64_t n = 2 * P, block = t.numel() / n;
  Tensor scratch = Tensor::empty({block}, t.dtype(), "comm.block");
  if (t.is_meta()) return;
  const size_t bytes = size_t(block) * size_t(dtype_size(t.dtype()));
  auto* base = static_cast<char*>(t.raw());
  std::vector<bool> moved(size_t(n), false);
  for (int64_t start = 0; start < n; ++start) {
    if (moved[size_t(start)] || source(start) == start) continue;
    std::memcpy(scratch.raw(), base + start * bytes, bytes);
    int64_t i = start;
    for (int64_t from = source(i); from != start; i = from, from = source(i)) {
      std::memcpy(base + i * bytes, base + from * bytes, bytes);
      moved[size_t(i)] = true;
    }
    std::memcpy(base + i * bytes, scratch.raw(), bytes);
    moved[size_t(i)] = true;
  }
}

void check_zigzag(int64_t rows, const char* what, const std::string& name) {
  LAGA_CHECK(rows % 2 == 0, "{} of '{}' over zigzag shards: {} local rows are not two chunks", what,
             name, rows);
}

}  // namespace

InFlight all_gather_tokens_start(Communicator& comm, Tensor x, const std::string& name,
                                 const std::string& tag, Shards shards) {
  LAGA_CHECK(x.rank() == 3, "all_gather_tokens of '{}': {} is not [N, B, d]", name,
             shape_str(x.shape()));
  if (shards == Shards::zigzag) check_zigzag(x.dim(0), "all_gather_tokens", name);
  const int64_t P = comm.size();
  Tensor out = Tensor::empty({P * x.dim(0), x.dim(1), x.dim(2)}, x.dtype(), tag);
  InFlight f;
  f.comm_ = &comm;
  f.handle_ = comm.all_gather_start(x.raw(), out.raw(), x.numel(), x.dtype(), name);
  f.keep_ = {std::move(x)};
  if (shards == Shards::contiguous)
    f.finish_ = [out = std::move(out)] { return out; };
  else  // rank order to sequence order
    f.finish_ = [out = std::move(out), P] {
      permute_blocks(out, P, [P](int64_t j) { return zigzag_place(j, P); });
      return out;
    };
  return f;
}

InFlight reduce_scatter_tokens_start(Communicator& comm, Tensor x, const std::string& name,
                                     const std::string& tag) {
  const DType dt = x.dtype();
  return reduce_scatter_tokens_start(comm, std::move(x), name, tag, dt);
}

InFlight reduce_scatter_tokens_start(Communicator& comm, Tensor x, const std::string& name,
                                     const std::string& tag, DType out_dtype, Shards shards) {
  LAGA_CHECK(x.rank() == 3 && x.dim(0) % comm.size() == 0,
             "reduce_scatter_tokens of '{}': {} is not [T, B, d] with "
             "P = {} dividing T",
             name, shape_str(x.shape()), comm.size());
  const bool round_after = out_dtype != x.dtype();
  LAGA_CHECK(!round_after || x.dtype() == DType::f32,
             "reduce_scatter_tokens of '{}' from {} to {}: rounding after "
             "the sum needs fp32 partials",
             name, dtype_name(x.dtype()), dtype_name(out_dtype));
  // Rounding after the sum: the fp32 sums land in tag + "_sum" and are rounded once to out_dtype at
  // wait().
  Tensor out = Tensor::empty({x.dim(0) / comm.size(), x.dim(1), x.dim(2)}, x.dtype(),
                             round_after ? tag + "_sum" : tag);
  InFlight f;
  f.comm_ = &comm;
  if (shards == Shards::zigzag) {  // sequence order to rank order: rank r's chunks side by side
    check_zigzag(out.dim(0), "reduce_scatter_tokens", name);
    const int64_t P = comm.size();
    permute_blocks(x, P, [P](int64_t i) { return zigzag_chunk(i, P); });
  }
  f.handle_ = comm.reduce_scatter_start(x.raw(), out.raw(), out.numel(), x.dtype(), name);
  f.keep_ = {std::move(x)};
  if (round_after)
    f.finish_ = [sum = std::move(out), out_dtype, tag] { return sum.to(out_dtype, tag); };
  else
    f.finish_ = [out = std::move(out)] { return out; };
  return f;
}

InFlight ring_shift_start(Communicator& comm, Tensor x, const std::string& name,
                          const std::string& tag) {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), tag);
  InFlight f;
  f.comm_ = &comm;
  f.handle_ = comm.send_recv_start(x.raw(), out.raw(), x.numel(), x.dtype(), name);
  f.keep_ = {std::move(x)};
  f.finish_ = [out = std::move(out)] { return out; };
  return f;
}

Tensor scatter_heads(Communicator& comm, const Tensor& x, const std::string& name,
                     const std::string& tag) {
  return scatter_heads_start(comm, x, name, tag).wait();
}
Tensor gather_heads(Communicator& comm, const Tensor& x, const std::string& name,
                    const std::string& tag) {
  return gather_heads_start(comm, x, name, tag).wait();
}
Tensor all_gather_tokens(Communicator& comm, const Tensor& x, const std::string& name,
                         const std::string& tag, Shards shards) {
  return all_gather_tokens_start(comm, x, name, tag, shards).wait();
}
Tensor reduce_scatter_tokens(Communicator& comm, const Tensor& x, const std::string& name,
                             const std::string& tag) {
  return reduce_scatter_tokens_start(comm, x, name, tag).wait();
}

Tensor reduce_scatter_tokens(Communicator& comm, const Tensor& x, const std::string& name,
                             const std::string& tag, DType out, Shards shards) {
  return reduce_scatter_tokens_start(comm, x, name, tag, out, shards).wait();
}

}  // namespace laga
