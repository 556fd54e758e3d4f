// The ring forms, ring-kv and ring-latent (one file: they share the zigzag chunk pairs, the merge
// and the travelling gradient; ring-latent's own part is at the end).
//
// The ring-kv form: ring attention (context parallelism with a K/V ring, as TransformerEngine's p2p
// context parallelism and Megatron's MLA CP run it) over the zigzag token layout. Every rank keeps
// its own tokens and all H heads; per-head K and V travel around the ring in P − 1 hops.
//   R1  [k_nope | v] = ckv·wkv_bᵀ (every head, this rank's tokens);  k = [k_nope | kpe broadcast]
//   R2  q = the block's query path (this rank's tokens, every head)
//   R3  hop s = 0 .. P−1: this rank holds the K/V of rank (r − s) mod P (its own at s = 0; the next
//       hop's send_recv of k and v in flight behind this hop's compute); for each query chunk × key
//       chunk pair of the zigzag layout (rank r holds chunks r and 2P−1−r of C = T/(2P) tokens):
//       key chunk earlier → non-causal attention; the same chunk → causal; later → skipped. Each
//       partial (o in fp32 and its lse) is merged by log-sum-exp into the query chunk's running
//       (o, lse) in fp32 (attention_merge: each merge in fp64, rounded once), in a fixed order, so
//       the result does not depend on timing.
//   R4  o = round(o_acc) [N, B, H, Dv]: this rank's tokens with all heads (Form::Output::tokens:
//       the block adds no o/do all-to-all).
// Backward (FlashAttention-2 per hop, with the final lse and the final o for delta = rowsum(dO∘O)):
// the same pairs hop by hop, k and v travelling around the ring again (declared as forward again in
// backward); dq accumulated in fp32 on this rank; dk and dv of a travelling block accumulated in
// fp32 by the ranks it visits (r+1, ..., r+P−1 contribute, then it reaches its owner r in a last
// hop, P − 1 hops in all), and the owner adds its own queries' contribution. The fp32 choice: the
// gradients of a block are summed over P ranks without any intermediate rounding (the same single
// rounding as the explicit form's kernel), at twice the bf16 traffic for dk and dv: per hop and
// rank N·B·H·(Dqk + Dv)·4 bytes. Then R1's backward gives dlatent and dwkv_b (partial over this
// rank's tokens, synced with the other gradients). The chunk attentions always run on the fused
// kernel (o_f32, grads_f32), whatever --kernel says: the eager kernel keeps no log-sum-exp, so its
// partial attentions could not be merged.
#include "ring.hpp"

#include "laga/comm/pairs.hpp"

namespace laga::forms {

std::vector<ChunkPair> hop_pairs(int64_t r, int64_t src) {
  // The pairs of hop s on ring position r (the block of src = (r − s) mod P), in the order they are
  // merged. At s = 0: (0,0) and (1,1) causal, (1,0) full. Else (1,0) is always full (chunk src ≤
  // P−1 < 2P−1−r), (0,1) is always later, and exactly one of (0,0) (src < r) and (1,1) (src > r) is
  // earlier: every position does two full C × C blocks per hop.
  if (src == r) return {{0, 0, true}, {1, 0, false}, {1, 1, true}};
  if (src < r) return {{0, 0, false}, {1, 0, false}};
  return {{1, 0, false}, {1, 1, false}};
}

namespace {

// Rows [u·C, (u+1)·C) of a [2C, B, Hs, d] tensor: local chunk u.
Tensor chunk(const RingView& rv, const Tensor& t, int u) {
  return t.rows(u * rv.C, (u + 1) * rv.C);
}

AttentionFwdParams chunk_attention(const RankCtx& ctx, const RingView& rv, const Tensor& q,
                                   const Tensor& k, const Tensor& v, const Tensor& o,
                                   const ChunkPair& pr) {
  AttentionFwdParams p;
  p.B = ctx.B, p.T = rv.C, p.Hq = rv.Hs, p.Hkv = rv.Hs, p.Dqk = ctx.Dqk, p.Dv = ctx.Dv;
  p.dtype = ctx.dt, p.scale = float(ctx.c.softmax_scale()), p.causal = pr.causal;
  // only the sequence's first chunk starts with its first token
  p.first_row_alone = rv.r == 0 && pr.qu == 0;
  p.one_pass_backward = ctx.c.attn_backward == AttnBackward::one_pass;
  p.q = chunk(rv, q, pr.qu).raw(), p.q_stride = dense_strides(ctx.B, rv.Hs, ctx.Dqk);
  p.k = chunk(rv, k, pr.ku).raw(), p.k_stride = dense_strides(ctx.B, rv.Hs, ctx.Dqk);
  p.v = chunk(rv, v, pr.ku).raw(), p.v_stride = dense_strides(ctx.B, rv.Hs, ctx.Dv);
  p.o = o.raw(), p.o_stride = dense_strides(ctx.B, rv.Hs, ctx.Dv);
  return p;
}

}  // namespace

void hop_forward(const RankCtx& ctx, const RingView& rv, int64_t src, const Tensor& q,
                 const Tensor& k, const Tensor& v, Tensor& o_acc, Tensor* lse, bool* first) {
  for (const ChunkPair& pr : hop_pairs(rv.r, src)) {
    Tensor o_part = Tensor::empty({rv.C, ctx.B, rv.Hs, ctx.Dv}, DType::f32, "act.o_part");
    AttentionFwdParams p = chunk_attention(ctx, rv, q, k, v, o_part, pr);
    p.o_f32 = true;
    AttentionSaved part = attention_forward(Kernel::fused, p);
    Tensor acc = chunk(rv, o_acc, pr.qu);
    attention_merge(o_part, part.lse, acc, lse[pr.qu], first[pr.qu]);
    first[pr.qu] = false;
  }
}

void hop_backward(const RankCtx& ctx, const RingView& rv, int64_t src, const Tensor& q,
                  const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& dout,
                  const Tensor* const* lse, Tensor& dq_acc, Tensor& dk_acc, Tensor& dv_acc) {
  const int64_t C = rv.C;
  for (const ChunkPair& pr : hop_pairs(rv.r, src)) {
    Tensor dq = Tensor::empty({C, ctx.B, rv.Hs, ctx.Dqk}, DType::f32, "grad.q_part");
    Tensor dk = Tensor::empty({C, ctx.B, rv.Hs, ctx.Dqk}, DType::f32, "grad.k_part");
    Tensor dv = Tensor::empty({C, ctx.B, rv.Hs, ctx.Dv}, DType::f32, "grad.v_part");
    const AttentionFwdParams fwd = chunk_attention(ctx, rv, q, k, v, chunk(rv, o, pr.qu), pr);
    AttentionBwdParams p;
    static_cast<AttentionFwdParams&>(p) = fwd;
    p.dout = chunk(rv, dout, pr.qu).raw(), p.dout_stride = dense_strides(ctx.B, rv.Hs, ctx.Dv);
    p.dq = dq.raw(), p.dq_stride = dense_strides(ctx.B, rv.Hs, ctx.Dqk);
    p.dk = dk.raw(), p.dk_stride = dense_strides(ctx.B, rv.Hs, ctx.Dqk);
    p.dv = dv.raw(), p.dv_stride = dense_strides(ctx.B, rv.Hs, ctx.Dv);
    p.grads_f32 = true;
    AttentionSaved final_lse;
    final_lse.lse = *lse[pr.qu];
    attention_backward(Kernel::fused, p, final_lse);
    Tensor dq_c = chunk(rv, dq_acc, pr.qu), dk_c = chunk(rv, dk_acc, pr.ku),
           dv_c = chunk(rv, dv_acc, pr.ku);
    add_into(dq_c, dq), add_into(dk_c, dk), add_into(dv_c, dv);
  }
}

Tensor ring_latent_forward(const RankCtx& ctx, const RingView& rv, const LayerWeights& w,
                           Tensor latent, const std::function<Tensor()>& query, RingLatentState& s,
                           const std::string& name) {
  const int64_t C = rv.C, M = 2 * C, P = rv.P;
  s.latent = std::move(latent);
  Tensor lat = s.latent;
  InFlight lat_next;
  if (P > 1) lat_next = issue(ctx, ring_shift_start(rv.comm, lat, name, "act.latent_ring"));
  s.q = query();  // L1
  Tensor o_acc = Tensor::empty({M, ctx.B, rv.Hs, ctx.Dv}, DType::f32, "act.o_acc");
  Tensor lse[2] = {Tensor::empty({ctx.B, rv.Hs, C}, DType::f32, "act.lse"),
                   Tensor::empty({ctx.B, rv.Hs, C}, DType::f32, "act.lse")};
  bool first[2] = {true, true};
  for (int64_t hop = 0; hop < P; ++hop) {  // L2
    if (hop > 0) {
      lat = lat_next.wait();
      if (hop + 1 < P)
        lat_next = issue(ctx, ring_shift_start(rv.comm, lat, name, "act.latent_ring"));
    }
    Tensor k = Tensor::empty({M, ctx.B, rv.Hs, ctx.Dqk}, ctx.dt, "act.k_hop");
    Tensor v = Tensor::empty({M, ctx.B, rv.Hs, ctx.Dv}, ctx.dt, "act.v_hop");
    up_project_forward(ctx, lat, w.wkv_b, rv.h0, rv.Hs, k, v);
    hop_forward(ctx, rv, (rv.r - hop + P) % P, s.q, k, v, o_acc, lse, first);
  }
  lat = Tensor();
  s.o = o_acc.to(ctx.dt, "act.o_att");  // L3
  o_acc = Tensor();
  s.lse0 = std::move(lse[0]), s.lse1 = std::move(lse[1]);
  return s.o;
}

RingLatentGrads ring_latent_backward(const RankCtx& ctx, const RingView& rv, const LayerWeights& w,
                                     RingLatentState& s, Tensor dout, LayerWeights& g,
                                     const std::string& name, const std::string& grad_name) {
  const int64_t M = 2 * rv.C, P = rv.P;
  Tensor dq_acc = Tensor::zeros({M, ctx.B, rv.Hs, ctx.Dqk}, DType::f32, "grad.q_acc");
  Tensor dlat_own = Tensor::zeros({M, ctx.B, ctx.Dl}, DType::f32, "grad.latent_acc");
  Tensor dlat_tr;  // the travelling block's fp32 dlatent (hops ≥ 1)
  Tensor lat = s.latent;
  const Tensor* lse[2] = {&s.lse0, &s.lse1};
  for (int64_t hop = 0; hop < P; ++hop) {
    InFlight lat_next;
    if (hop + 1 < P)  // L2 again: the next hop's latent in flight behind this hop's backward
      lat_next = issue(ctx, ring_shift_start(rv.comm, lat, name, "act.latent_ring"));
    if (hop == 1) dlat_tr = Tensor::zeros({M, ctx.B, ctx.Dl}, DType::f32, "grad.latent_ring");
    {
      Tensor k = Tensor::empty({M, ctx.B, rv.Hs, ctx.Dqk}, ctx.dt, "act.k_hop");  // recomputed
      Tensor v = Tensor::empty({M, ctx.B, rv.Hs, ctx.Dv}, ctx.dt, "act.v_hop");
      up_project_forward(ctx, lat, w.wkv_b, rv.h0, rv.Hs, k, v);
      Tensor dk = Tensor::zeros({M, ctx.B, rv.Hs, ctx.Dqk}, DType::f32, "grad.k_acc");
      Tensor dv = Tensor::zeros({M, ctx.B, rv.Hs, ctx.Dv}, DType::f32, "grad.v_acc");
      hop_backward(ctx, rv, (rv.r - hop + P) % P, s.q, k, v, s.o, dout, lse, dq_acc, dk, dv);
      k = v = Tensor();
      const Tensor dk_l = dk.to(ctx.dt, "grad.k_hop"), dv_l = dv.to(ctx.dt, "grad.v_hop");
      dk = dv = Tensor();
      // R1 backward
      Tensor dlat = Tensor::empty({M, ctx.B, ctx.Dl}, DType::f32, "grad.latent_hop");
      up_project_backward(ctx, lat, w.wkv_b, rv.h0, rv.Hs, dk_l, dv_l, dlat, g.wkv_b);
      add_into(hop == 0 ? dlat_own : dlat_tr, dlat);
    }
    if (hop + 1 < P) lat = lat_next.wait();
    // the travelling block's dlatent on to the next rank (after the last hop: its owner)
    if (hop >= 1) {
      InFlight next =
          issue(ctx, ring_shift_start(rv.comm, std::move(dlat_tr), grad_name, "grad.latent_ring"));
      dlat_tr = next.wait();
    }
  }
  lat = Tensor();
  dout = Tensor();
  s.q = s.o = s.lse0 = s.lse1 = s.latent = Tensor();
  if (P > 1) {
    add_into(dlat_own, dlat_tr);
    dlat_tr = Tensor();
  }
  return {std::move(dq_acc), std::move(dlat_own)};
}

bool zigzag_fits(int64_t T, int64_t R) { return R <= T / 2 && T % (2 * R) == 0; }

std::string zigzag_seq_problem(int64_t T, int64_t R, std::string_view ring, std::string_view why) {
  if (T <= 0 || R <= 0 || zigzag_fits(T, R)) return {};
  const __int128 m = __int128(2) * R, below = T / m * m, above = below + m;
  return fmt::format("--seq {} is not a multiple of 2 × {} = {} ({}); try --seq {}{}", T, ring, m,
                     why, below > 0 ? fmt::format("{} or ", below) : "", above);
}

namespace {

struct RingKvSaved final : CoreSaved {
  Tensor latent;      // [N, B, Dl]      this rank's [ckv | kpe], for R1's backward
  Tensor q, k;        // [N, B, H, Dqk]  this rank's tokens, every head
  Tensor v, o;        // [N, B, H, Dv]   (o: the final output, storage dtype)
  Tensor lse0, lse1;  // [B, H, C] fp32  each local chunk's final log-sum-exp
  void for_each(const std::function<void(const char*, const Tensor&)>& f) const override {
    f("latent", latent), f("q", q), f("k", k), f("v", v), f("o_att", o), f("lse0", lse0),
        f("lse1", lse1);
  }
};

RingView ring_view(const RankCtx& ctx) {
  return {ctx.comm, ctx.P, ctx.r, ctx.T / (2 * ctx.P), 0, ctx.H};
}

void add_ring_problems(const MlaConfig& c, std::vector<std::string>& p, std::string_view form);

// What the two ring forms share: their output on the rank's own tokens (no all-to-all), the zigzag
// layout, the fused kernel (its log-sum-exp merges chunk partials), causal attention over all H
// heads, and the ring's conditions on the config.
class RingForm : public Form {
 public:
  std::string_view family() const override { return name(); }
  std::string_view own_kernel() const override { return "fused"; }
  Output output() const override { return Output::tokens; }
  TokenLayout layout(const MlaConfig&) const override { return TokenLayout::zigzag; }
  void add_problems(const MlaConfig& c, std::vector<std::string>& p) const override {
    add_ring_problems(c, p, name());
  }
};

class RingKv final : public RingForm {
 public:
  std::string_view name() const override { return "ring-kv"; }
  std::string_view summary() const override {
    return "ring attention: per-head k and v travel around the ring (P − 1 send_recv hops), zigzag "
           "tokens, "
           "log-sum-exp merge in fp32; no all-to-all";
  }

  Tensor forward(const RankCtx& ctx, const LayerWeights& w, Tensor latent, const QueryPath& query,
                 std::unique_ptr<CoreSaved>& out) const override {
    auto s = std::make_unique<RingKvSaved>();
    const RingView rv = ring_view(ctx);
    const int64_t C = rv.C;
    s->k = Tensor::empty({ctx.N, ctx.B, ctx.H, ctx.Dqk}, ctx.dt, "act.k_local");  // R1
    s->v = Tensor::empty({ctx.N, ctx.B, ctx.H, ctx.Dv}, ctx.dt, "act.v_local");
    up_project_forward(ctx, latent, w.wkv_b, 0, ctx.H, s->k, s->v);
    s->latent = std::move(latent);
    // R3: the first hop's k and v in flight behind the query path
    Tensor k = s->k, v = s->v;
    InFlight k_next, v_next;
    if (ctx.P > 1) {
      k_next = issue(ctx, ring_shift_start(ctx.comm, k, "k", "act.k_ring"));
      v_next = issue(ctx, ring_shift_start(ctx.comm, v, "v", "act.v_ring"));
    }
    s->q = query();  // R2
    Tensor o_acc = Tensor::empty({ctx.N, ctx.B, ctx.H, ctx.Dv}, DType::f32, "act.o_acc");
    Tensor lse[2] = {Tensor::empty({ctx.B, ctx.H, C}, DType::f32, "act.lse"),
                     Tensor::empty({ctx.B, ctx.H, C}, DType::f32, "act.lse")};
    bool first[2] = {true, true};
    for (int64_t hop = 0; hop < ctx.P; ++hop) {
      if (hop > 0) {
        k = k_next.wait(), v = v_next.wait();
        if (hop + 1 < ctx.P) {  // the next hop's k and v in flight behind this hop's attention
          k_next = issue(ctx, ring_shift_start(ctx.comm, k, "k", "act.k_ring"));
          v_next = issue(ctx, ring_shift_start(ctx.comm, v, "v", "act.v_ring"));
        }
      }
      hop_forward(ctx, rv, (ctx.r - hop + ctx.P) % ctx.P, s->q, k, v, o_acc, lse, first);
    }
    k = v = Tensor();
    s->o = o_acc.to(ctx.dt, "act.o_att");  // R4
    o_acc = Tensor();
    s->lse0 = std::move(lse[0]), s->lse1 = std::move(lse[1]);
    Tensor o = s->o;
    out = std::move(s);
    return o;
  }

  Tensor backward(const RankCtx& ctx, const LayerWeights& w, std::unique_ptr<CoreSaved> saved,
                  Tensor dout, LayerWeights& g,
                  const QueryPathBackward& query_backward) const override {
    auto& s = static_cast<RingKvSaved&>(*saved);
    const RingView rv = ring_view(ctx);
    Tensor dq_acc = Tensor::zeros({ctx.N, ctx.B, ctx.H, ctx.Dqk}, DType::f32, "grad.q_acc");
    Tensor dk_own = Tensor::zeros({ctx.N, ctx.B, ctx.H, ctx.Dqk}, DType::f32, "grad.k_acc");
    Tensor dv_own = Tensor::zeros({ctx.N, ctx.B, ctx.H, ctx.Dv}, DType::f32, "grad.v_acc");
    Tensor dk_tr, dv_tr;  // the travelling block's fp32 dk, dv (hops ≥ 1)
    Tensor k = s.k, v = s.v;
    const Tensor* lse[2] = {&s.lse0, &s.lse1};
    for (int64_t hop = 0; hop < ctx.P; ++hop) {
      InFlight k_next, v_next;
      // R3 again: the next hop's k and v in flight behind this hop's backward
      if (hop + 1 < ctx.P) {
        k_next = issue(ctx, ring_shift_start(ctx.comm, k, "k", "act.k_ring"));
        v_next = issue(ctx, ring_shift_start(ctx.comm, v, "v", "act.v_ring"));
      }
      if (hop == 1) {
        dk_tr = Tensor::zeros({ctx.N, ctx.B, ctx.H, ctx.Dqk}, DType::f32, "grad.k_ring");
        dv_tr = Tensor::zeros({ctx.N, ctx.B, ctx.H, ctx.Dv}, DType::f32, "grad.v_ring");
      }
      Tensor& dk_into = hop == 0 ? dk_own : dk_tr;
      Tensor& dv_into = hop == 0 ? dv_own : dv_tr;
      hop_backward(ctx, rv, (ctx.r - hop + ctx.P) % ctx.P, s.q, k, v, s.o, dout, lse, dq_acc,
                   dk_into, dv_into);
      if (hop + 1 < ctx.P) k = k_next.wait(), v = v_next.wait();
      // the travelling block's dk, dv on to the next rank (after the last hop: its owner)
      if (hop >= 1) {
        InFlight dk_next =
            issue(ctx, ring_shift_start(ctx.comm, std::move(dk_tr), "dk", "grad.k_ring"));
        InFlight dv_next =
            issue(ctx, ring_shift_start(ctx.comm, std::move(dv_tr), "dv", "grad.v_ring"));
        dk_tr = dk_next.wait(), dv_tr = dv_next.wait();
      }
    }
    k = v = Tensor();
    dout = Tensor();
    s.q = s.k = s.v = s.o = s.lse0 = s.lse1 = Tensor();
    if (ctx.P > 1) {  // this rank's block, back from its trip: the others' contributions
      add_into(dk_own, dk_tr), add_into(dv_own, dv_tr);
      dk_tr = dv_tr = Tensor();
    }
    query_backward(dq_acc.to(ctx.dt, "grad.q_local"));
    dq_acc = Tensor();
    const Tensor dk_l = dk_own.to(ctx.dt, "grad.k_local"), dv_l = dv_own.to(ctx.dt, "grad.v_local");
    dk_own = dv_own = Tensor();
    // R1 backward
    Tensor dlatent = Tensor::empty({ctx.N, ctx.B, ctx.Dl}, ctx.dt, "grad.latent");
    up_project_backward(ctx, s.latent, w.wkv_b, 0, ctx.H, dk_l, dv_l, dlatent, g.wkv_b);
    return dlatent;
  }

  // The chunk pairs cover the causal triangle exactly (2P(2P+1)/2 blocks of C × C, the diagonal
  // ones causal), so the executed FLOPs are the whole sequence's causal attention.
};

// Configurations a ring form refuses: T not a multiple of 2P (the zigzag chunks). P ∤ H is fine.
void add_ring_problems(const MlaConfig& c, std::vector<std::string>& p, std::string_view form) {
  const std::string s = zigzag_seq_problem(
      c.seq_len, c.sp, fmt::format("--sp {}", c.sp),
      fmt::format("{}'s zigzag layout gives every rank two chunks of T/(2P) tokens", form));
  if (!s.empty()) p.push_back(s);
}

// The ring-latent form: as ring-kv, but the 576-wide latent [N, B, Dl] of a rank's tokens travels
// the ring instead of its per-head k and v (Megatron's MLA with latent context parallelism):
//   L1  q = the block's query path (this rank's tokens, every head)
//   L2  hop s = 0 .. P−1: this rank holds the latent of rank (r − s) mod P (the next hop's
//       send_recv in flight behind this hop's compute), up-projects it for all H heads (R1 on a
//       received block: the extra FLOPs, (P − 1) up-projections of the sequence over all ranks) and
//       runs ring-kv's chunk pairs and merge on it; the block's k and v are released at the end of
//       the hop
//   L3  o = round(o_acc) [N, B, H, Dv] on this rank's tokens
// Saves only the local latent, q, o and the lse (no k, v). Backward: the latent travels again
// (declared forward again in backward), each hop's K/V is recomputed from it (P up-projections of
// the sequence), the hop's attention backward gives the block's dk, dv in fp32
// and, rounded to the storage dtype, the up-projection's backward gives the block's dlatent (fp32,
// rounded once from its fp32 sums over heads) and adds the block's dwkv_b rows (partial: synced
// with the other gradients). The block's dlatent travels back around the ring in fp32 like
// ring-kv's dk, dv (P − 1 hops, owner's own contribution added last), at (P − 1)·E·Dl·4 bytes per
// layer and rank.
struct RingLatentSaved final : CoreSaved {
  RingLatentState st;
  void for_each(const std::function<void(const char*, const Tensor&)>& f) const override {
    st.for_each(f);
  }
};

class RingLatent final : public RingForm {
 public:
  std::string_view name() const override { return "ring-latent"; }
  std::string_view summary() const override {
    return "ring attention with the latent travelling (P − 1 send_recv hops), each hop "
           "up-projected for all "
           "heads, zigzag tokens; k, v recomputed in backward; no all-to-all";
  }

  Tensor forward(const RankCtx& ctx, const LayerWeights& w, Tensor latent, const QueryPath& query,
                 std::unique_ptr<CoreSaved>& out) const override {
    auto s = std::make_unique<RingLatentSaved>();
    Tensor o =
        ring_latent_forward(ctx, ring_view(ctx), w, std::move(latent), query, s->st, "latent");
    out = std::move(s);
    return o;
  }

  Tensor backward(const RankCtx& ctx, const LayerWeights& w, std::unique_ptr<CoreSaved> saved,
                  Tensor dout, LayerWeights& g,
                  const QueryPathBackward& query_backward) const override {
    auto& s = static_cast<RingLatentSaved&>(*saved);
    RingLatentGrads d =
        ring_latent_backward(ctx, ring_view(ctx), w, s.st, std::move(dout), g, "latent", "dlatent");
    query_backward(d.dq.to(ctx.dt, "grad.q_local"));
    d.dq = Tensor();
    return d.dlatent.to(ctx.dt, "grad.latent");
  }
};

}  // namespace

const Form& ring_kv_form() {
  static const RingKv form;
  return form;
}

const Form& ring_latent_form() {
  static const RingLatent form;
  return form;
}

}  // namespace laga::forms
