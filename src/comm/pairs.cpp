// The collective pairs of comm/pairs.hpp: packing for the head all-to-alls, and the token-sharded
// all-gather / reduce-scatter.
#include "laga/comm/pairs.hpp"

#include "laga/ops/elementwise.hpp"

namespace laga {

Tensor scatter_heads(Communicator& comm, const Tensor& x, const std::string& name, const std::string& tag) {
  LAGA_CHECK(x.rank() == 4 && x.dim(2) % comm.size() == 0, "scatter_heads of '{}': {} is not [N, B, H, d] with P = {} "
             "dividing H", name, shape_str(x.shape()), comm.size());
  const int64_t P = comm.size(), N = x.dim(0), B = x.dim(1), H = x.dim(2), d = x.dim(3), Hr = H / P;
  const DType dt = x.dtype();
  // send [P, N, B, Hr, d]: chunk j holds rank j's heads of every local token.
  Tensor send = Tensor::empty({P, N, B, Hr, d}, dt, "comm.send");
  for (int64_t j = 0; j < P; ++j) copy_rows(dt, N * B, Hr * d, at(x, j * Hr * d), H * d, at(send, j * N * B * Hr * d), Hr * d);
  Tensor out = Tensor::empty({P * N, B, Hr, d}, dt, tag);  // chunk j = rank j's tokens
  comm.all_to_all(send.raw(), out.raw(), N * B * Hr * d, dt, name);
  return out;
}

Tensor gather_heads(Communicator& comm, const Tensor& x, const std::string& name, const std::string& tag) {
  LAGA_CHECK(x.rank() == 4 && x.dim(0) % comm.size() == 0, "gather_heads of '{}': {} is not [T, B, Hr, d] with P = {} "
             "dividing T", name, shape_str(x.shape()), comm.size());
  const int64_t P = comm.size(), N = x.dim(0) / P, B = x.dim(1), Hr = x.dim(2), d = x.dim(3), H = Hr * P;
  const DType dt = x.dtype();
  // x's chunk j (rank j's tokens) goes to rank j; recv [P, N, B, Hr, d]: chunk j = rank j's heads.
  Tensor recv = Tensor::empty({P, N, B, Hr, d}, dt, "comm.recv");
  comm.all_to_all(x.raw(), recv.raw(), N * B * Hr * d, dt, name);
  Tensor out = Tensor::empty({N, B, H, d}, dt, tag);
  for (int64_t j = 0; j < P; ++j) copy_rows(dt, N * B, Hr * d, at(recv, j * N * B * Hr * d), Hr * d, at(out, j * Hr * d), H * d);
  return out;
}

Tensor all_gather_tokens(Communicator& comm, const Tensor& x, const std::string& name, const std::string& tag) {
  LAGA_CHECK(x.rank() == 3, "all_gather_tokens of '{}': {} is not [N, B, d]", name, shape_str(x.shape()));
  Tensor out = Tensor::empty({comm.size() * x.dim(0), x.dim(1), x.dim(2)}, x.dtype(), tag);
  comm.all_gather(x.raw(), out.raw(), x.numel(), x.dtype(), name);
  return out;
}

Tensor reduce_scatter_tokens(Communicator& comm, const Tensor& x, const std::string& name, const std::string& tag) {
  LAGA_CHECK(x.rank() == 3 && x.dim(0) % comm.size() == 0, "reduce_scatter_tokens of '{}': {} is not [T, B, d] with "
             "P = {} dividing T", name, shape_str(x.shape()), comm.size());
  Tensor out = Tensor::empty({x.dim(0) / comm.size(), x.dim(1), x.dim(2)}, x.dtype(), tag);
  comm.reduce_scatter(x.raw(), out.raw(), out.numel(), x.dtype(), name);
  return out;
}

Tensor reduce_scatter_tokens(Communicator& comm, const Tensor& x, const std::string& name, const std::string& tag,
                             DType out) {
  if (out == x.dtype()) return reduce_scatter_tokens(comm, x, name, tag);
  LAGA_CHECK(x.dtype() == DType::f32, "reduce_scatter_tokens of '{}' from {} to {}: rounding after the sum needs "
             "fp32 partials", name, dtype_name(x.dtype()), dtype_name(out));
  const Tensor sum = reduce_scatter_tokens(comm, x, name, tag + "_sum");
  return sum.to(out, tag);
}

}  // namespace laga
