// Pieces shared by the block's stages and forms (src/mla/block.cpp, src/mla/forms.cpp): the
// dimensions of one rank, strided copies, and the head-scatter all-to-alls with their packing.
#pragma once

#include <string>

#include "laga/comm/communicator.hpp"
#include "laga/core/config.hpp"
#include "laga/core/tensor.hpp"
#include "laga/mla/block.hpp"
#include "laga/ops/matmul.hpp"

namespace laga::detail {

struct Ctx {
  const MlaConfig& c;
  Communicator& comm;
  int64_t P, r;  // ranks, this rank
  int64_t N, T, B, D, H, Hr, Lq, Lkv, Dn, Dr, Dqk, Dv, Dl;
  int64_t pos0;  // global position of this rank's first token: r·N
  DType dt;
  Ctx(const MlaConfig& c, Communicator& comm);
};

// Copies `cols` elements of each of `rows` rows between strided buffers of one dtype.
void copy_rows(DType t, int64_t rows, int64_t cols, const void* src, int64_t src_stride, void* dst, int64_t dst_stride);
// Pointer to element `offset` of x.
void* at(const Tensor& x, int64_t offset);
// y += x elementwise (fp32 arithmetic), same shapes.
void add_into(Tensor& y, const Tensor& x);

// Head scatter: x [N, B, H, d] (local tokens, every head) -> [T, B, Hr, d] (every token, this
// rank's heads). One all-to-all of `name`.
Tensor heads_to_tokens(const Ctx& x_ctx, const Tensor& x, int64_t d, const std::string& name, const std::string& tag);
// Its inverse: x [T, B, Hr, d] -> [N, B, H, d].
Tensor tokens_to_heads(const Ctx& x_ctx, const Tensor& x, int64_t d, const std::string& name, const std::string& tag);

// The up-projection of E1/G2 for heads [h0, h0 + Hs): from latent [M, B, Dl] and wkv_b,
// k [M, B, Hs, Dqk] = [ckv·W_UKᵀ | kpe broadcast] and v [M, B, Hs, Dv] = ckv·W_UVᵀ.
void up_project_forward(const Ctx& x, const Tensor& latent, const Tensor& wkv_b, int64_t h0, int64_t Hs, Tensor& k,
                        Tensor& v);
// Its backward: dlatent [M, B, Dl] (=) and dwkv_b rows of heads [h0, h0 + Hs) (+=).
void up_project_backward(const Ctx& x, const Tensor& latent, const Tensor& wkv_b, int64_t h0, int64_t Hs,
                         const Tensor& dk, const Tensor& dv, Tensor& dlatent, Tensor& dwkv_b);

// Attention params over dense [T, B, Hq, ·] q/o and [T, B, Hkv, ·] k/v tensors.
AttentionFwdParams dense_attention(const Ctx& x, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                   int64_t Hq, int64_t Hkv, int64_t Dqk, int64_t Dv);

// The form-specific core between the local stage and wo: from q_local [N, B, H, Dqk] and
// s.latent [N, B, Dl] to o [T, B, Hr, Dv] (returned; the caller all-to-alls it back).
Tensor core_forward(const Ctx& x, const LayerWeights& w, Tensor q_local, LayerSaved& s);
// From do [T, B, Hr, Dv] to dq_local [N, B, H, Dqk] and dlatent [N, B, Dl]; wkv_b's gradient (+=).
void core_backward(const Ctx& x, const LayerWeights& w, LayerSaved& s, Tensor dout, LayerWeights& g, Tensor& dq_local,
                   Tensor& dlatent);

}  // namespace laga::detail
