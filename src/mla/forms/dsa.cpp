// dsa-gather and dsa-regather (docs/sparse.md): the block core of DeepSeek Sparse Attention, as the
// open frameworks train it under sequence parallelism. The queries stay on their rank with all H
// heads (Output::tokens) in the layout --cp-layout names (zigzag: chunks r and 2P−1−r of T/(2P),
// the default; or contiguous); the latent and the index key are all-gathered into sequence order;
// the lightning indexer selects each query's top-k keys; the main attention runs in MQA mode over
// the absorbed query, over the selected keys (stage sparse) or over every earlier key (warmup).
//   S1  all_gather_tokens latent [N, B, Dl] -> [T, B, Dl], issued before the query path
//   S3a k^I = rope(LayerNorm(xn·wkᵀ)) [N, B, D_I] (xn alone: before the query path);
//       all_gather_tokens k^I -> [T, B, D_I], issued behind S1
//   S2  q_abs = [q_nope·W_UK | q_pe]                               [N, B, H, Dl]
//   S3b q^I = rope(cqn·wq_b^Iᵀ) [N, B, H_I, D_I], w^I = xn·weights_projᵀ [N, B, H_I] (detached
//       inputs xn, cqn)
//   S4  S_t = top-k of I[t, ·] over s ≤ t                           [N, B, k] int32
//   S5  o_lat = attention(q_abs, K = latent, V = ckv) over S_t (or every s ≤ t)   [N, B, H, Lkv]
//   S6  o = o_lat·W_UVᵀ                                             [N, B, H, Dv]
//   S7  L_I = Σ_t KL(p[t, ·] ‖ softmax I[t, ·]) over S_t (or every s ≤ t), p the head-summed
//       probabilities of S5, and its gradient into q^I, w^I and k^I (reduce-scattered to this
//       rank's keys): computed here, where S5's probabilities are at hand, and taken through the
//       indexer's projections in backward.
// S2, S4, S5 and S7 run over row blocks (row_blocks: each segment of the layout cut into blocks of
// at most kBlockTokens tokens), the same blocks in forward and backward. Backward: S6's, the
// indexer's projections' (S3: its weights alone), then per block S5's (dq_abs, and dlatent over the
// gathered keys, summed block after block in fp32 as one call would sum them) and S2's;
// reduce_scatter_tokens dlatent issued behind the block's query-path backward. dsa-gather keeps the
// gathered latent and q_abs for backward (as Megatron-LM does); dsa-regather keeps neither: it
// gathers the latent again (issued before S6's and S3's backward, which run behind it) and rebuilds
// q_abs block by block, so it never holds all of q_abs in backward. Both run the same operations on
// the same blocks: their results are bit-identical at every P.
#include <cmath>

#include "absorbed_common.hpp"
#include "ring.hpp"
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
// The most tokens of a row block: q_abs of one block at DeepSeek-V3's 128 heads is 512 · 128 · 576
// bf16 values (75 MB) against 604 MB for a rank's 4096 tokens.
constexpr int64_t kBlockTokens = 512;

struct DsaSaved final : CoreSaved {
  Tensor latent;    // [N, B, Dl]     dsa-regather: this rank's latent, gathered again in backward
  Tensor latent_g;  // [T, B, Dl]     dsa-gather: the gathered latent (K, and V its first Lkv)
  Tensor q;         // [N, B, H, Dqk] the query (S2's backward needs q_nope; dsa-regather: q_abs)
  Tensor q_abs;     // [N, B, H, Dl]  dsa-gather
  Tensor o_lat;     // [N, B, H, Lkv]
  std::vector<Tensor> lse;  // per row block [B, H, rows] fp32: S5's log-sum-exp
  Tensor topk;              // [N, B, k] int32: S_t's positions, ascending, −1 padded
  Tensor k_lin;             // [N, B, D_I]      xn·wkᵀ, LayerNorm's input
  Tensor dq_index;          // [N, B, H_I, D_I] L_I's gradient of q^I (after RoPE)
  Tensor dw_index;          // [N, B, H_I]      of w^I
  Tensor dk_index;  // [N, B, D_I]      of k^I (after RoPE), summed over every rank's queries
  double indexer_loss = 0;
  void for_each(const std::function<void(const char*, const Tensor&)>& f) const override {
    f("latent", latent), f("latent_g", latent_g), f("q", q), f("q_abs", q_abs), f("o_att", o_lat),
        f("k_index_lin", k_lin), f("dq_index", dq_index), f("dw_index", dw_index),
        f("dk_index", dk_index);
    for (const Tensor& l : lse) f("lse", l);
  }
};

// The layout the form runs (--cp-layout) as the token collectives take it.
Shards shards(const RankCtx& ctx) {
  return ctx.c.cp_layout == CpLayout::zigzag ? Shards::zigzag : Shards::contiguous;
}

// Local rows [row0, row0 + rows) at global positions pos0 .. pos0 + rows − 1.
struct RowBlock {
  int64_t row0, rows, pos0;
};
std::vector<RowBlock> row_blocks(const RankCtx& ctx) {
  std::vector<RowBlock> out;
  int64_t row = 0;
  for (const TokenSegment& seg : ctx.segments) {
    for (int64_t i = 0; i < seg.len; i += kBlockTokens)
      out.push_back({row + i, std::min(kBlockTokens, seg.len - i), seg.pos0 + i});
    row += seg.len;
  }
  return out;
}

// The indexer's RoPE (rotate-half, ModelDims::indexer_rope) on the first Dr dims of `inner`
// vectors of D_I per token of this rank's rows, each segment at its positions.
void index_rope(const RankCtx& ctx, Tensor& x, int64_t inner, bool backward) {
  const int64_t DI = ctx.c.index_head_dim;
  int64_t row = 0;
  for (const TokenSegment& seg : ctx.segments) {
    RopeParams p = rope_params(ctx.c.indexer_rope(), ctx.dt);
    p.x = at(x, row * inner * DI), p.T = seg.len, p.inner = inner, p.t_stride = inner * DI;
    p.inner_stride = DI, p.pos0 = seg.pos0;
    backward ? rope_backward(p) : rope_forward(p);
    row += seg.len;
  }
}

// S3a: the index key of this rank's tokens, k^I = rope(LayerNorm(xn·wkᵀ)).
Tensor index_key(const RankCtx& ctx, const LayerWeights& w, const Tensor& xn, DsaSaved& s) {
  const int64_t DI = ctx.c.index_head_dim;
  s.k_lin = linear_forward(xn, w.indexer_wk, "act.index_k_lin");
  Tensor k = Tensor::empty({ctx.N, ctx.B, DI}, ctx.dt, "act.index_k");
  LayerNormParams ln;
  ln.M = ctx.N * ctx.B, ln.C = DI, ln.dtype = ctx.dt, ln.eps = kIndexNormEps;
  ln.x = s.k_lin.raw(), ln.w = w.indexer_k_norm.raw(), ln.b = w.indexer_k_norm_bias.raw();
  ln.y = k.raw();
  layernorm_forward(ln);
  index_rope(ctx, k, ctx.B, false);
  return k;
}

// S3b: the index queries and head weights of this rank's tokens.
struct IndexQuery {
  Tensor q, w;
};
IndexQuery index_query(const RankCtx& ctx, const LayerWeights& w, const Tensor& xn,
                       const Tensor& cqn) {
  const int64_t HI = ctx.c.index_n_heads, DI = ctx.c.index_head_dim;
  IndexQuery out;
  // q^I = rope(cqn·wq_bᵀ)
  out.q = linear_forward(cqn, w.indexer_wq_b, "act.index_q").reshape({ctx.N, ctx.B, HI, DI});
  index_rope(ctx, out.q, ctx.B * HI, false);
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

// S5's params for one row block: its absorbed queries q_abs [rows, B, H, Dl] against the gathered
// latent, its selection rows (stage sparse) and its rows of o_lat.
SparseAttentionParams attention_params(const RankCtx& ctx, const RowBlock& blk, const Tensor& q_abs,
                                       const DsaSaved& s) {
  SparseAttentionParams p;
  p.B = ctx.B, p.Tq = blk.rows, p.Tk = ctx.T, p.q_pos0 = blk.pos0, p.H = ctx.H;
  p.Dqk = ctx.Dl, p.Dv = ctx.Lkv, p.topk = ctx.c.topk(), p.dtype = ctx.dt;
  p.scale = float(ctx.c.softmax_scale());
  p.q = q_abs.raw(), p.kv = s.latent_g.raw(), p.o = at(s.o_lat, blk.row0 * ctx.B * ctx.H * ctx.Lkv);
  // warmup: every earlier key
  p.idx = ctx.c.indexer_stage == IndexerStage::sparse
              ? s.topk.data<int32_t>() + blk.row0 * ctx.B * p.topk
              : nullptr;
  return p;
}

// S7's sums over this rank's queries: fp32 dq^I, dw^I (its rows) and dk^I (every key).
struct IndexGrads {
  Tensor dq, dw, dk_g;
  double loss = 0;
};

// S7 over one row block: L_I and its gradients, added onto g. The target [rows, B, C] fp32 is made
// in pieces of at most 64 MiB (C = k, or T in the warmup stage), whatever the sequence.
void index_loss(const RankCtx& ctx, const RowBlock& blk, const SparseAttentionParams& ap,
                const Tensor& lse, const IndexQuery& iq, const Tensor& k_g, IndexGrads& g) {
  const int64_t HI = ctx.c.index_n_heads, DI = ctx.c.index_head_dim, k = ctx.c.topk();
  const bool sparse = ap.idx != nullptr;
  const int64_t C = sparse ? k : ctx.T;
  constexpr int64_t kTargetElems = int64_t(16) << 20;
  const int64_t rows =
      std::clamp<int64_t>(kTargetElems / std::max<int64_t>(ctx.B * C, 1), 1, blk.rows);
  Tensor target = Tensor::empty({rows, ctx.B, C}, DType::f32, "act.index_target");
  IndexerLossParams lp;
  lp.B = ctx.B, lp.Tk = ctx.T, lp.H = HI, lp.D = DI, lp.dtype = ctx.dt;
  lp.w_scale = float(ctx.c.indexer_weight_scale());
  lp.k = k_g.raw(), lp.topk = k, lp.loss_scale = float(ctx.c.indexer_loss_scale);
  lp.target = target.data<float>(), lp.dk = g.dk_g.data<float>();
  for (int64_t t0 = 0; t0 < blk.rows; t0 += rows) {
    const int64_t t1 = std::min(blk.rows, t0 + rows), n = t1 - t0, row = blk.row0 + t0;
    attention_head_probs(ap, lse, t0, t1, target.data<float>());
    lp.Tq = n, lp.q_pos0 = blk.pos0 + t0;
    lp.q = at(iq.q, row * ctx.B * HI * DI), lp.w = at(iq.w, row * ctx.B * HI);
    lp.idx = sparse ? ap.idx + t0 * ctx.B * k : nullptr;
    lp.dq = g.dq.data<float>() + row * ctx.B * HI * DI,
    lp.dw = g.dw.data<float>() + row * ctx.B * HI;
    g.loss += indexer_loss(lp);
  }
}

class Dsa final : public Form {
 public:
  explicit Dsa(bool regather) : regather_(regather) {}
  std::string_view name() const override { return regather_ ? "dsa-regather" : "dsa-gather"; }
  std::string_view family() const override { return name(); }
  std::string_view summary() const override {
    return regather_
               ? "DeepSeek Sparse Attention: all-gather of the latent and index key, gathered "
                 "again in backward; queries local (zigzag), MQA over each query's top-k"
               : "DeepSeek Sparse Attention: all-gather of the latent and index key, kept "
                 "for backward; queries local (zigzag), MQA over each query's top-k";
  }
  Output output() const override { return Output::tokens; }
  TokenLayout layout(const MlaConfig& c) const override {
    return c.cp_layout == CpLayout::zigzag ? TokenLayout::zigzag : TokenLayout::contiguous;
  }
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
    if (c.cp_layout == CpLayout::zigzag)
      if (const std::string s = zigzag_seq_problem(
              c.seq_len, c.sp, fmt::format("--sp {}", c.sp),
              fmt::format("{}'s zigzag layout gives every rank two chunks of T/(2P) tokens",
                          name()));
          !s.empty())
        problems.push_back(s + ", or --cp-layout contiguous");
  }

  Tensor forward(const RankCtx& ctx, const LayerWeights& w, Tensor latent, const QueryPath& query,
                 std::unique_ptr<CoreSaved>& out) const override {
    auto s = std::make_unique<DsaSaved>();
    const Shards sh = shards(ctx);
    // S1 and S3a: both all-gathers in flight behind the query path
    if (regather_) s->latent = latent;
    InFlight latent_g = issue(
        ctx, all_gather_tokens_start(ctx.comm, std::move(latent), "latent", "act.latent_g", sh));
    InFlight k_g_flight =
        issue(ctx, all_gather_tokens_start(ctx.comm, index_key(ctx, w, *query.xn, *s), "index_key",
                                           "act.index_key_g", sh));
    s->q = query();
    const IndexQuery iq = index_query(ctx, w, *query.xn, *query.cqn);  // S3b
    const Tensor k_g = k_g_flight.wait();
    const std::vector<RowBlock> blocks = row_blocks(ctx);
    // S4, over the rows of each block at their positions
    const int64_t k = ctx.c.topk(), HI = ctx.c.index_n_heads, DI = ctx.c.index_head_dim;
    s->topk = Tensor::empty({ctx.N, ctx.B, k}, DType::i32, "act.topk");
    for (const RowBlock& blk : blocks) {
      IndexerParams ip;
      ip.B = ctx.B, ip.Tq = blk.rows, ip.Tk = ctx.T, ip.q_pos0 = blk.pos0;
      ip.H = HI, ip.D = DI, ip.dtype = ctx.dt;
      ip.w_scale = float(ctx.c.indexer_weight_scale());
      ip.q = at(iq.q, blk.row0 * ctx.B * HI * DI), ip.w = at(iq.w, blk.row0 * ctx.B * HI);
      ip.k = k_g.raw();
      indexer_topk(ip, k, s->topk.data<int32_t>() + blk.row0 * ctx.B * k, nullptr);
    }
    // S2, S5 and S7 block by block: dsa-regather holds one block's q_abs at a time
    s->latent_g = latent_g.wait();
    s->o_lat = Tensor::empty({ctx.N, ctx.B, ctx.H, ctx.Lkv}, ctx.dt, "act.o_att");
    if (!regather_) s->q_abs = Tensor::empty({ctx.N, ctx.B, ctx.H, ctx.Dl}, ctx.dt, "act.q_abs");
    IndexGrads ig;
    ig.dq = Tensor::zeros({ctx.N, ctx.B, HI, DI}, DType::f32, "act.dq_index_sum");
    ig.dw = Tensor::zeros({ctx.N, ctx.B, HI}, DType::f32, "act.dw_index_sum");
    ig.dk_g = Tensor::zeros({ctx.T, ctx.B, DI}, DType::f32, "act.dk_index_g");
    for (const RowBlock& blk : blocks) {
      const Tensor q_abs = block_q_abs(ctx, w, *s, blk, true);
      const SparseAttentionParams ap = attention_params(ctx, blk, q_abs, *s);
      s->lse.push_back(sparse_attention_forward(ap).lse);
      index_loss(ctx, blk, ap, s->lse.back(), iq, k_g, ig);
    }
    Tensor o = project_out(ctx, w, s->o_lat, ctx.Lkv, 0);  // S6
    // S7's results: q^I's and w^I's gradients rounded once; k^I's summed over the ranks (every
    // rank's queries score every key) in fp32 and rounded once
    s->indexer_loss = ig.loss;
    s->dq_index = ig.dq.to(ctx.dt, "act.dq_index");
    s->dw_index = ig.dw.to(ctx.dt, "act.dw_index");
    ig.dq = ig.dw = Tensor();
    s->dk_index = reduce_scatter_tokens_start(ctx.comm, std::move(ig.dk_g), "dk_index",
                                              "act.dk_index", ctx.dt, sh)
                      .wait();
    if (regather_) s->latent_g = Tensor();
    out = std::move(s);
    return o;
  }

  Tensor backward(const RankCtx& ctx, const LayerWeights& w, std::unique_ptr<CoreSaved> saved,
                  Tensor dout, LayerWeights& g,
                  const QueryPathBackward& query_backward) const override {
    auto& s = static_cast<DsaSaved&>(*saved);
    const Shards sh = shards(ctx);
    // dsa-regather: S1 again, in flight behind S6's backward
    InFlight latent_g;
    if (regather_)
      latent_g = issue(ctx, all_gather_tokens_start(ctx.comm, std::move(s.latent), "latent",
                                                    "act.latent_g", sh));
    Tensor do_lat = project_out_backward(ctx, w, dout, s.o_lat, ctx.Lkv, 0, g);  // S6
    dout = Tensor();
    // S3: the indexer's projections (its weights alone; they need neither the latent nor S5)
    index_backward(ctx, w, g, s, *query_backward.xn, *query_backward.cqn);
    if (regather_) s.latent_g = latent_g.wait();
    // S5 and S2 block by block: dq_abs of the block, dlatent of every key summed over the blocks
    // in fp32 (as one call over all rows sums them; one block writes the sum dtype directly)
    const std::vector<RowBlock> blocks = row_blocks(ctx);
    const DType sum_dt = ctx.c.dlatent_sum_dtype();
    const DType acc_dt = blocks.size() > 1 ? DType::f32 : sum_dt;
    Tensor dlatent_g = Tensor::empty({ctx.T, ctx.B, ctx.Dl}, acc_dt,
                                     acc_dt == sum_dt ? "grad.latent_g" : "grad.latent_g_sum");
    Tensor dq = Tensor::empty({ctx.N, ctx.B, ctx.H, ctx.Dqk}, ctx.dt, "grad.q_local");
    for (size_t i = 0; i < blocks.size(); ++i) {
      const RowBlock& blk = blocks[i];
      const Tensor q_abs = block_q_abs(ctx, w, s, blk, false);
      Tensor dq_abs = Tensor::empty({blk.rows, ctx.B, ctx.H, ctx.Dl}, ctx.dt, "grad.q_abs");
      SparseAttentionBwdParams bp;
      static_cast<SparseAttentionParams&>(bp) = attention_params(ctx, blk, q_abs, s);
      bp.dout = at(do_lat, blk.row0 * ctx.B * ctx.H * ctx.Lkv), bp.dq = dq_abs.raw();
      bp.dkv = dlatent_g.raw(), bp.dkv_dtype = acc_dt, bp.dkv_accumulate = i > 0;
      AttentionSaved attn;
      attn.lse = s.lse[i];
      sparse_attention_backward(bp, attn);
      const Tensor rows_q = s.q.rows(blk.row0, blk.row0 + blk.rows);
      absorb_query_backward(ctx, w, rows_q, dq_abs, 0, dq.rows(blk.row0, blk.row0 + blk.rows), g);
    }
    do_lat = Tensor();
    s.lse.clear();
    s.o_lat = s.q_abs = s.latent_g = s.topk = s.q = Tensor();
    if (acc_dt != sum_dt) dlatent_g = dlatent_g.to(sum_dt, "grad.latent_g");
    // S1's adjoint: dlatent's reduce-scatter in flight behind the block's query-path backward
    InFlight dlatent =
        issue(ctx, reduce_scatter_tokens_start(ctx.comm, std::move(dlatent_g), "dlatent",
                                               "grad.latent", ctx.dt, sh));
    query_backward(std::move(dq));
    return dlatent.wait();
  }

 private:
  // S2 for one row block: dsa-gather's q_abs rows (filled in forward, read in backward); dsa-
  // regather's made anew from q each time (the same product on the same rows: the same bits).
  Tensor block_q_abs(const RankCtx& ctx, const LayerWeights& w, const DsaSaved& s,
                     const RowBlock& blk, bool forward) const {
    const Tensor q = s.q.rows(blk.row0, blk.row0 + blk.rows);
    if (regather_) return absorb_query(ctx, w, q, 0);
    const Tensor q_abs = s.q_abs.rows(blk.row0, blk.row0 + blk.rows);
    if (forward) absorb_query(ctx, w, q, 0, q_abs);
    return q_abs;
  }
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
