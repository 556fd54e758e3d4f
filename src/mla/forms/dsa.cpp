// dsa-gather and dsa-regather (docs/sparse.md): the block core of DeepSeek Sparse Attention, as the
// open frameworks train it under sequence parallelism. The queries stay on their rank with all H
// heads (Output::tokens, the contiguous layout); the latent and the index key are all-gathered; the
// lightning indexer selects each query's top-k keys; the main attention runs in MQA mode over the
// absorbed query, over the selected keys (stage sparse) or over every earlier key (stage warmup).
//   S1  all_gather_tokens latent [N, B, Dl] -> [T, B, Dl], issued before the query path
//   S2  q_abs = [q_nope·W_UK | q_pe]                               [N, B, H, Dl]
//   S3  the indexer's local stage (detached inputs xn, cqn):
//         q^I = rope(cqn·wq_b^Iᵀ) [N, B, H_I, D_I], k^I = rope(LayerNorm(xn·wkᵀ)) [N, B, D_I],
//         w^I = xn·weights_projᵀ [N, B, H_I];  all_gather_tokens k^I -> [T, B, D_I]
//   S4  S_t = top-k of I[t, ·] over s ≤ t                           [N, B, k] int32
//   S5  o_lat = attention(q_abs, K = latent, V = ckv) over S_t (or every s ≤ t)   [N, B, H, Lkv]
//   S6  o = o_lat·W_UVᵀ                                             [N, B, H, Dv]
//   S7  L_I = Σ_t KL(p[t, ·] ‖ softmax I[t, ·]) over S_t (or every s ≤ t), p the head-summed
//       probabilities of S5, and its gradient into q^I, w^I and k^I (reduce-scattered to this
//       rank's keys): computed here, where S5's probabilities are at hand, and taken through the
//       indexer's projections in backward.
// Backward: S6's, S5's (dq_abs, and dlatent over the gathered keys), reduce_scatter_tokens dlatent
// issued, S2's behind it, the indexer's projections' (S3: its weights alone) and the block's
// query-path backward. dsa-gather keeps the gathered latent and q_abs for backward (as Megatron-LM
// does); dsa-regather keeps neither: it gathers the latent again and rebuilds q_abs from q. At P 1
// the two run the same operations in the same order (a gather of one rank is a copy): their results
// are bit-identical.
#include <cmath>

#include "absorbed_common.hpp"
#include "laga/comm/pairs.hpp"
#include "laga/core/error.hpp"
#include "laga/ops/indexer.hpp"
#include "laga/ops/layernorm.hpp"
#include "laga/ops/linear.hpp"
#include "laga/ops/rope.hpp"
#include "laga/ops/sparse_attention.hpp"

namespace laga::forms {

namespace {

// DeepSeek's LayerNorm default, the indexer's k_norm.
constexpr double kIndexNormEps = 1e-6;

struct DsaSaved final : CoreSaved {
  Tensor latent;    // [N, B, Dl]     dsa-regather: this rank's latent, gathered again in backward
  Tensor latent_g;  // [T, B, Dl]     dsa-gather: the gathered latent (K, and V its first Lkv)
  Tensor q;         // [N, B, H, Dqk] the query (S2's backward needs q_nope; dsa-regather: q_abs)
  Tensor q_abs;     // [N, B, H, Dl]  dsa-gather
  Tensor o_lat;     // [N, B, H, Lkv]
  AttentionSaved attn;
  Tensor topk;      // [N, B, k] int32: S_t's positions, ascending, −1 padded
  Tensor k_lin;     // [N, B, D_I]      xn·wkᵀ, LayerNorm's input
  Tensor dq_index;  // [N, B, H_I, D_I] L_I's gradient of q^I (after RoPE)
  Tensor dw_index;  // [N, B, H_I]      of w^I
  Tensor dk_index;  // [N, B, D_I]      of k^I (after RoPE), summed over every rank's queries
  double indexer_loss = 0;
  void for_each(const std::function<void(const char*, const Tensor&)>& f) const override {
    f("latent", latent), f("latent_g", latent_g), f("q", q), f("q_abs", q_abs), f("o_att", o_lat),
        f("k_index_lin", k_lin), f("dq_index", dq_index), f("dw_index", dw_index),
        f("dk_index", dk_index);
  }
};

// The absorbed query and output of this rank's N tokens with all H heads (A2, A4 of
// absorbed_common.hpp over local rows): one product per head.
MatView local_head(const RankCtx& ctx, const Tensor& t, int64_t h, int64_t width, int64_t col,
                   int64_t cols) {
  return MatView{at(t, h * width + col), ctx.N * ctx.B, cols, ctx.H * width, t.dtype()};
}
MatView uk(const RankCtx& ctx, const Tensor& wkv_b, int64_t h) {
  return MatView{at(wkv_b, h * (ctx.Dn + ctx.Dv) * ctx.Lkv), ctx.Dn, ctx.Lkv, ctx.Lkv,
                 wkv_b.dtype()};
}
MatView uv(const RankCtx& ctx, const Tensor& wkv_b, int64_t h) {
  return MatView{at(wkv_b, (h * (ctx.Dn + ctx.Dv) + ctx.Dn) * ctx.Lkv), ctx.Dv, ctx.Lkv, ctx.Lkv,
                 wkv_b.dtype()};
}

Tensor absorb(const RankCtx& ctx, const LayerWeights& w, const Tensor& q) {
  Tensor q_abs = Tensor::empty({ctx.N, ctx.B, ctx.H, ctx.Dl}, ctx.dt, "act.q_abs");
  for (int64_t h = 0; h < ctx.H; ++h) {
    matmul_2d(local_head(ctx, q, h, ctx.Dqk, 0, ctx.Dn), uk(ctx, w.wkv_b, h),
              local_head(ctx, q_abs, h, ctx.Dl, 0, ctx.Lkv));
    copy_rows(ctx.dt, ctx.N * ctx.B, ctx.Dr, at(q, h * ctx.Dqk + ctx.Dn), ctx.H * ctx.Dqk,
              at(q_abs, h * ctx.Dl + ctx.Lkv), ctx.H * ctx.Dl);
  }
  return q_abs;
}

// q_abs = [q_nope·W_UK | q_pe]:  dq_nope = dq_abs·W_UKᵀ,  dW_UK += q_nopeᵀ·dq_abs,  dq_pe = dq_abs
Tensor absorb_backward(const RankCtx& ctx, const LayerWeights& w, const Tensor& q,
                       const Tensor& dq_abs, LayerWeights& g) {
  Tensor dq = Tensor::empty({ctx.N, ctx.B, ctx.H, ctx.Dqk}, ctx.dt, "grad.q_local");
  for (int64_t h = 0; h < ctx.H; ++h) {
    matmul_2d(local_head(ctx, dq_abs, h, ctx.Dl, 0, ctx.Lkv), uk(ctx, w.wkv_b, h).t(),
              local_head(ctx, dq, h, ctx.Dqk, 0, ctx.Dn));
    matmul_2d(local_head(ctx, q, h, ctx.Dqk, 0, ctx.Dn).t(),
              local_head(ctx, dq_abs, h, ctx.Dl, 0, ctx.Lkv), uk(ctx, g.wkv_b, h), true);
    copy_rows(ctx.dt, ctx.N * ctx.B, ctx.Dr, at(dq_abs, h * ctx.Dl + ctx.Lkv), ctx.H * ctx.Dl,
              at(dq, h * ctx.Dqk + ctx.Dn), ctx.H * ctx.Dqk);
  }
  return dq;
}

Tensor project(const RankCtx& ctx, const LayerWeights& w, const Tensor& o_lat) {
  Tensor o = Tensor::empty({ctx.N, ctx.B, ctx.H, ctx.Dv}, ctx.dt, "act.o_g");
  for (int64_t h = 0; h < ctx.H; ++h)
    matmul_2d(local_head(ctx, o_lat, h, ctx.Lkv, 0, ctx.Lkv), uv(ctx, w.wkv_b, h).t(),
              local_head(ctx, o, h, ctx.Dv, 0, ctx.Dv));
  return o;
}

// o = o_lat·W_UVᵀ:  do_lat = do·W_UV,  dW_UV += doᵀ·o_lat
Tensor project_backward(const RankCtx& ctx, const LayerWeights& w, const Tensor& dout,
                        const Tensor& o_lat, LayerWeights& g) {
  Tensor do_lat = Tensor::empty({ctx.N, ctx.B, ctx.H, ctx.Lkv}, ctx.dt, "grad.o_att");
  for (int64_t h = 0; h < ctx.H; ++h) {
    matmul_2d(local_head(ctx, dout, h, ctx.Dv, 0, ctx.Dv), uv(ctx, w.wkv_b, h),
              local_head(ctx, do_lat, h, ctx.Lkv, 0, ctx.Lkv));
    matmul_2d(local_head(ctx, dout, h, ctx.Dv, 0, ctx.Dv).t(),
              local_head(ctx, o_lat, h, ctx.Lkv, 0, ctx.Lkv), uv(ctx, g.wkv_b, h), true);
  }
  return do_lat;
}

// The indexer's RoPE (rotate-half, ModelDims::indexer_rope) on the first Dr dims of `inner`
// vectors of D_I per token of this rank's N tokens (contiguous layout: positions pos0 + t).
void index_rope(const RankCtx& ctx, Tensor& x, int64_t inner, bool backward) {
  RopeParams p = rope_params(ctx.c.indexer_rope(), ctx.dt);
  const int64_t DI = ctx.c.index_head_dim;
  p.x = x.raw(), p.T = ctx.N, p.inner = inner, p.t_stride = inner * DI, p.inner_stride = DI;
  p.pos0 = ctx.pos0;
  backward ? rope_backward(p) : rope_forward(p);
}

// S3: the index queries, key and head weights of this rank's tokens.
struct IndexLocal {
  Tensor q, k, w;
};
IndexLocal index_forward(const RankCtx& ctx, const LayerWeights& w, const Tensor& xn,
                         const Tensor& cqn, DsaSaved& s) {
  const int64_t HI = ctx.c.index_n_heads, DI = ctx.c.index_head_dim;
  IndexLocal out;
  // q^I = rope(cqn·wq_bᵀ)
  out.q = linear_forward(cqn, w.indexer_wq_b, "act.index_q").reshape({ctx.N, ctx.B, HI, DI});
  index_rope(ctx, out.q, ctx.B * HI, false);
  // k^I = rope(LayerNorm(xn·wkᵀ))
  s.k_lin = linear_forward(xn, w.indexer_wk, "act.index_k_lin");
  out.k = Tensor::empty({ctx.N, ctx.B, DI}, ctx.dt, "act.index_k");
  LayerNormParams ln;
  ln.M = ctx.N * ctx.B, ln.C = DI, ln.dtype = ctx.dt, ln.eps = kIndexNormEps;
  ln.x = s.k_lin.raw(), ln.w = w.indexer_k_norm.raw(), ln.b = w.indexer_k_norm_bias.raw();
  ln.y = out.k.raw();
  layernorm_forward(ln);
  index_rope(ctx, out.k, ctx.B, false);
  // w^I = xn·weights_projᵀ
  out.w = linear_forward(xn, w.indexer_weights_proj, "act.index_w");
  return out;
}

// S3's backward into the indexer's weights alone (its inputs are detached).
void index_backward(const RankCtx& ctx, const LayerWeights& w, LayerWeights& g, DsaSaved& s,
                    const Tensor& xn, const Tensor& cqn) {
  const int64_t HI = ctx.c.index_n_heads, DI = ctx.c.index_head_dim;
  // q^I = rope(cqn·wq_bᵀ):  dq ← ropeᵀ(dq),  dwq_b += dqᵀ·cqn
  index_rope(ctx, s.dq_index, ctx.B * HI, true);
  linear_backward(cqn, w.indexer_wq_b, s.dq_index.reshape({ctx.N, ctx.B, HI * DI}), nullptr, false,
                  g.indexer_wq_b);
  s.dq_index = Tensor();
  // k^I = rope(LayerNorm(k_lin)):  dk ← ropeᵀ(dk);  dk_lin, dk_norm, dk_norm_bias;  dwk +=
  // dk_linᵀ·xn
  index_rope(ctx, s.dk_index, ctx.B, true);
  Tensor dk_lin = Tensor::empty({ctx.N, ctx.B, DI}, ctx.dt, "grad.index_k_lin");
  LayerNormBwdParams ln;
  ln.M = ctx.N * ctx.B, ln.C = DI, ln.dtype = ctx.dt, ln.eps = kIndexNormEps;
  ln.x = s.k_lin.raw(), ln.w = w.indexer_k_norm.raw(), ln.b = w.indexer_k_norm_bias.raw();
  ln.dy = s.dk_index.raw(), ln.dx = dk_lin.raw();
  ln.dw = g.indexer_k_norm.raw(), ln.db = g.indexer_k_norm_bias.raw();
  ln.dw_dtype = g.indexer_k_norm.dtype();
  layernorm_backward(ln);
  s.dk_index = s.k_lin = Tensor();
  linear_backward(xn, w.indexer_wk, dk_lin, nullptr, false, g.indexer_wk);
  dk_lin = Tensor();
  // w^I = xn·weights_projᵀ:  dweights_proj += dwᵀ·xn
  linear_backward(xn, w.indexer_weights_proj, s.dw_index, nullptr, false, g.indexer_weights_proj);
  s.dw_index = Tensor();
}

SparseAttentionParams attention_params(const RankCtx& ctx, const DsaSaved& s) {
  SparseAttentionParams p;
  p.B = ctx.B, p.Tq = ctx.N, p.Tk = ctx.T, p.q_pos0 = ctx.pos0, p.H = ctx.H;
  p.Dqk = ctx.Dl, p.Dv = ctx.Lkv, p.topk = ctx.c.index_topk, p.dtype = ctx.dt;
  p.scale = float(ctx.c.softmax_scale());
  p.q = s.q_abs.raw(), p.kv = s.latent_g.raw(), p.o = s.o_lat.raw();
  // warmup: every earlier key
  p.idx = ctx.c.indexer_stage == IndexerStage::sparse ? s.topk.data<int32_t>() : nullptr;
  return p;
}

// The query rows per call of the indexer's loss: its target [rows, B, C] fp32 stays under 64 MiB
// (C = k, or T in the warmup stage), whatever the sequence.
int64_t loss_rows(const RankCtx& ctx, int64_t C) {
  constexpr int64_t kTargetElems = int64_t(16) << 20;
  return std::clamp<int64_t>(kTargetElems / std::max<int64_t>(ctx.B * C, 1), 1, ctx.N);
}

// S7: L_I over this rank's queries and its gradient into q^I, w^I (this rank's rows) and k^I (every
// key, summed over the ranks by reduce-scatter): saved in the storage dtype for backward.
void index_loss(const RankCtx& ctx, const SparseAttentionParams& ap, const IndexLocal& il,
                const Tensor& k_g, DsaSaved& s) {
  const int64_t HI = ctx.c.index_n_heads, DI = ctx.c.index_head_dim, k = ctx.c.index_topk;
  const bool sparse = ap.idx != nullptr;
  const int64_t C = sparse ? k : ctx.T;
  Tensor dq = Tensor::zeros({ctx.N, ctx.B, HI, DI}, DType::f32, "act.dq_index_sum");
  Tensor dw = Tensor::zeros({ctx.N, ctx.B, HI}, DType::f32, "act.dw_index_sum");
  Tensor dk_g = Tensor::zeros({ctx.T, ctx.B, DI}, DType::f32, "act.dk_index_g");
  const int64_t rows = loss_rows(ctx, C);
  Tensor target = Tensor::empty({rows, ctx.B, C}, DType::f32, "act.index_target");
  IndexerLossParams lp;
  lp.B = ctx.B, lp.Tk = ctx.T, lp.H = HI, lp.D = DI, lp.dtype = ctx.dt;
  lp.w_scale = float(ctx.c.indexer_weight_scale());
  lp.k = k_g.raw(), lp.topk = k, lp.loss_scale = float(ctx.c.indexer_loss_scale);
  lp.target = target.data<float>(), lp.dk = dk_g.data<float>();
  double loss = 0;
  for (int64_t t0 = 0; t0 < ctx.N; t0 += rows) {
    const int64_t t1 = std::min(ctx.N, t0 + rows), n = t1 - t0;
    attention_head_probs(ap, s.attn.lse, t0, t1, target.data<float>());
    lp.Tq = n, lp.q_pos0 = ctx.pos0 + t0;
    lp.q = at(il.q, t0 * ctx.B * HI * DI), lp.w = at(il.w, t0 * ctx.B * HI);
    lp.idx = sparse ? ap.idx + t0 * ctx.B * k : nullptr;
    lp.dq = dq.data<float>() + t0 * ctx.B * HI * DI, lp.dw = dw.data<float>() + t0 * ctx.B * HI;
    loss += indexer_loss(lp);
  }
  target = Tensor();
  s.indexer_loss = loss;
  s.dq_index = dq.to(ctx.dt, "act.dq_index");
  s.dw_index = dw.to(ctx.dt, "act.dw_index");
  dq = dw = Tensor();
  // every rank's queries score every key: the keys' gradient summed over the ranks, rounded once
  s.dk_index = reduce_scatter_tokens(ctx.comm, dk_g, "dk_index", "act.dk_index", ctx.dt);
}

class Dsa final : public Form {
 public:
  explicit Dsa(bool regather) : regather_(regather) {}
  std::string_view name() const override { return regather_ ? "dsa-regather" : "dsa-gather"; }
  std::string_view family() const override { return name(); }
  std::string_view summary() const override {
    return regather_
               ? "DeepSeek Sparse Attention: all-gather of the latent and index key, gathered "
                 "again in backward; queries local, MQA over each query's top-k"
               : "DeepSeek Sparse Attention: all-gather of the latent and index key, kept "
                 "for backward; queries local, MQA over each query's top-k";
  }
  Output output() const override { return Output::tokens; }
  bool sparse() const override { return true; }
  std::string_view bitwise_at_one_rank_with() const override {
    return regather_ ? "dsa-gather" : "";
  }
  std::string_view own_kernel() const override { return "sparse"; }
  Sparse sparse_of(const CoreSaved& saved) const override {
    const auto& s = static_cast<const DsaSaved&>(saved);
    return {s.indexer_loss, s.topk};
  }
  void add_problems(const MlaConfig& c, std::vector<std::string>& problems) const override {
    if (!c.has_indexer())
      problems.push_back(fmt::format(
          "form {} runs DeepSeek Sparse Attention's lightning indexer, and model '{}' has none; "
          "try --model deepseek-v3.2, or give --index-heads, --index-dim and --index-topk",
          name(), c.model));
    if (c.q_lora_rank <= 0)
      problems.push_back(fmt::format(
          "form {} needs q_lora_rank > 0 (the indexer's queries come from the query latent c^Q), "
          "got {}; try --model deepseek-v3.2",
          name(), c.q_lora_rank));
  }

  Tensor forward(const RankCtx& ctx, const LayerWeights& w, Tensor latent, const QueryPath& query,
                 std::unique_ptr<CoreSaved>& out) const override {
    auto s = std::make_unique<DsaSaved>();
    // S1: the latent's all-gather in flight behind the query path and the indexer's local stage
    if (regather_) s->latent = latent;
    InFlight latent_g =
        issue(ctx, all_gather_tokens_start(ctx.comm, std::move(latent), "latent", "act.latent_g"));
    s->q = query();
    s->q_abs = absorb(ctx, w, s->q);  // S2
    // S3
    const IndexLocal il = index_forward(ctx, w, *query.xn, *query.cqn, *s);
    Tensor k_g = all_gather_tokens(ctx.comm, il.k, "index_key", "act.index_key_g");
    // S4
    const int64_t k = ctx.c.index_topk;
    s->topk = Tensor::empty({ctx.N, ctx.B, k}, DType::i32, "act.topk");
    {
      IndexerParams ip;
      ip.B = ctx.B, ip.Tq = ctx.N, ip.Tk = ctx.T, ip.q_pos0 = ctx.pos0;
      ip.H = ctx.c.index_n_heads, ip.D = ctx.c.index_head_dim, ip.dtype = ctx.dt;
      ip.w_scale = float(ctx.c.indexer_weight_scale());
      ip.q = il.q.raw(), ip.w = il.w.raw(), ip.k = k_g.raw();
      indexer_topk(ip, k, s->topk.data<int32_t>(), nullptr);
    }
    // S5
    s->latent_g = latent_g.wait();
    s->o_lat = Tensor::empty({ctx.N, ctx.B, ctx.H, ctx.Lkv}, ctx.dt, "act.o_att");
    const SparseAttentionParams ap = attention_params(ctx, *s);
    s->attn = sparse_attention_forward(ap);
    Tensor o = project(ctx, w, s->o_lat);  // S6
    index_loss(ctx, ap, il, k_g, *s);      // S7
    if (regather_) s->latent_g = s->q_abs = Tensor();
    out = std::move(s);
    return o;
  }

  Tensor backward(const RankCtx& ctx, const LayerWeights& w, std::unique_ptr<CoreSaved> saved,
                  Tensor dout, LayerWeights& g,
                  const QueryPathBackward& query_backward) const override {
    auto& s = static_cast<DsaSaved&>(*saved);
    Tensor do_lat = project_backward(ctx, w, dout, s.o_lat, g);  // S6
    dout = Tensor();
    if (regather_) {  // S1 and S2 again
      s.latent_g = all_gather_tokens(ctx.comm, s.latent, "latent", "act.latent_g");
      s.latent = Tensor();
      s.q_abs = absorb(ctx, w, s.q);
    }
    // S5: dq_abs, and dK of the gathered keys with dV added onto its first Lkv columns
    Tensor dq_abs = Tensor::empty({ctx.N, ctx.B, ctx.H, ctx.Dl}, ctx.dt, "grad.q_abs");
    const DType sum_dt = ctx.c.dlatent_sum_dtype();
    Tensor dlatent_g = Tensor::empty({ctx.T, ctx.B, ctx.Dl}, sum_dt, "grad.latent_g");
    {
      SparseAttentionBwdParams bp;
      static_cast<SparseAttentionParams&>(bp) = attention_params(ctx, s);
      bp.dout = do_lat.raw(), bp.dq = dq_abs.raw(), bp.dkv = dlatent_g.raw(), bp.dkv_dtype = sum_dt;
      sparse_attention_backward(bp, s.attn);
    }
    do_lat = Tensor();
    s.attn = {};
    s.o_lat = s.q_abs = s.latent_g = s.topk = Tensor();
    // S1's adjoint: dlatent's reduce-scatter in flight behind S2's backward, the indexer's and the
    // block's query-path backward
    InFlight dlatent = issue(ctx, reduce_scatter_tokens_start(ctx.comm, std::move(dlatent_g),
                                                              "dlatent", "grad.latent", ctx.dt));
    Tensor dq = absorb_backward(ctx, w, s.q, dq_abs, g);  // S2
    dq_abs = s.q = Tensor();
    index_backward(ctx, w, g, s, *query_backward.xn, *query_backward.cqn);  // S3
    query_backward(std::move(dq));
    return dlatent.wait();
  }

 private:
  bool regather_;
};

}  // namespace

const Form& dsa_gather_form() {
  static const Dsa form(false);
  return form;
}
const Form& dsa_regather_form() {
  static const Dsa form(true);
  return form;
}

}  // namespace laga::forms
