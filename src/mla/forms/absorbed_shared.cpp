// absorbed-shared (docs/design.md §2.3): the absorbed form with a native multi-query kernel — every
// query head of this rank attends to the one gathered latent (K = [ckv | kpe], V = ckv, its first Lkv
// columns, read in place), never copied per head.
//   A1  scatter_heads q;  all_gather_tokens latent
//   A2  q_abs = [q_nope·W_UK | q_pe]
//   A3  o_lat = MQA attention(q_abs, K = latent, V = ckv)       [T, B, Hr, Lkv]
//   A4  o = o_lat·W_UVᵀ
// Backward: A4's, then attention backward with dK written straight into dlatent and dV summed onto
// its first Lkv columns, A2's, reduce_scatter_tokens dlatent, gather_heads dq.
#include "absorbed_common.hpp"
#include "laga/comm/pairs.hpp"

namespace laga::forms {

namespace {

// K = the latent, V = its first Lkv columns: one head shared by all Hr query heads.
AttentionFwdParams shared_attention(const RankCtx& x, const AbsorbedSaved& s) {
  AttentionFwdParams p = dense_attention(x, s.q_abs, s.latent_g, s.latent_g, s.o_lat, x.Hr, 1, x.Dl, x.Lkv);
  p.k_stride = p.v_stride = AttentionStrides{x.B * x.Dl, x.Dl, 0};
  return p;
}

class AbsorbedShared final : public Form {
 public:
  std::string_view name() const override { return "absorbed-shared"; }
  std::string_view family() const override { return "absorbed"; }
  std::string_view summary() const override {
    return "all-to-all of q and o, all-gather of the latent; W_UK in the query, MQA over the one latent";
  }

  Tensor forward(const RankCtx& x, const LayerWeights& w, Tensor q_local, Tensor latent,
                 std::unique_ptr<CoreSaved>& out) const override {
    auto s = std::make_unique<AbsorbedSaved>();
    s->q = scatter_heads(x.comm, q_local, "q", "act.q");                          // A1
    q_local = Tensor();
    s->latent_g = all_gather_tokens(x.comm, latent, "latent", "act.latent_g");
    latent = Tensor();
    s->q_abs = absorb_query(x, w, s->q);                                          // A2
    s->o_lat = Tensor::empty({x.T, x.B, x.Hr, x.Lkv}, x.dt, "act.o_att");        // A3
    s->attn = attention_forward(x.c.kernel, shared_attention(x, *s));
    Tensor o = project_out(x, w, s->o_lat, x.Lkv);                                // A4
    out = std::move(s);
    return o;
  }

  void backward(const RankCtx& x, const LayerWeights& w, std::unique_ptr<CoreSaved> saved, Tensor dout,
                LayerWeights& g, Tensor& dq_local, Tensor& dlatent) const override {
    auto& s = static_cast<AbsorbedSaved&>(*saved);
    Tensor do_lat = project_out_backward(x, w, dout, s.o_lat, x.Lkv, g);          // A4
    dout = Tensor();
    // A3: dq_abs; dK is dlatent_g itself, dV (one head) is added onto its first Lkv columns
    Tensor dq_abs = Tensor::empty({x.T, x.B, x.Hr, x.Dl}, x.dt, "grad.q_abs");
    Tensor dlatent_g = Tensor::empty({x.T, x.B, x.Dl}, x.dt, "grad.latent_g");
    {
      Tensor dv = Tensor::empty({x.T, x.B, 1, x.Lkv}, x.dt, "grad.v_lat");
      attention_backward(x.c.kernel, dense_attention_backward(shared_attention(x, s), x, do_lat, dq_abs, dlatent_g, dv),
                         s.attn);
      sum_heads(x.dt, x.T * x.B, 1, x.Lkv, dv.raw(), x.Lkv, 0, dlatent_g.raw(), x.Dl, /*accumulate=*/true);
    }
    do_lat = Tensor();
    s.attn = {};
    s.o_lat = s.q_abs = s.latent_g = Tensor();
    Tensor dq = absorb_query_backward(x, w, s.q, dq_abs, g);                      // A2
    dq_abs = s.q = Tensor();
    dlatent = reduce_scatter_tokens(x.comm, dlatent_g, "dlatent", "grad.latent");  // A1's adjoints
    dlatent_g = Tensor();
    dq_local = gather_heads(x.comm, dq, "dq", "grad.q_local");
  }

  std::vector<DeclaredCollective> collectives() const override {
    using Op = CollectiveOp;
    return {{Op::all_to_all, "q", Op::all_to_all, "dq"}, {Op::all_gather, "latent", Op::reduce_scatter, "dlatent"}};
  }

  // The executed core: scores over Dl, values of Lkv.
  double attention_forward_flops(const MlaConfig& c) const override {
    return laga::attention_forward_flops(c.batch, c.num_attention_heads, c.seq_len, c.latent_dim(), c.kv_lora_rank, true);
  }
};

}  // namespace

const Form& absorbed_shared_form() {
  static const AbsorbedShared form;
  return form;
}

}  // namespace laga::forms
