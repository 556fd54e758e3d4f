// laga with --ulysses Pu < P (docs/design.md §2.7): head scatter inside groups of Pu consecutive
// ranks and a ring over the Pr = P/Pu groups (USP / LoongTrain's hybrid), for P > H. Rank (g, u) =
// g·Pu + u; group g holds zigzag chunks g and 2Pr−1−g of C = T/(2Pr) (token_segments'
// zigzag_groups).
//   U1  all_gather_tokens latent in the group -> latent_g [Tg = T/Pr, B, Dl] (issued before the
//       query path);  scatter_heads q in the group -> q [Tg, B, Hr = H/Pu, Dqk]
//   U2  ring-latent's core over the ring of groups (ring.hpp): hop s = 0 .. Pr−1, the group latent
//       of group (g − s) mod Pr held (send_recv "latent_g" on the ring sub-communicator, the next
//       hop in flight behind this hop's compute), up-projected for this rank's Hr heads only, the
//       zigzag chunk pairs on the fused kernel with the fp32 log-sum-exp merge
//   U3  o [Tg, B, Hr, Dv]: the block's o all-to-all, inside the group, brings it to [N, B, H, Dv]
// Backward: ring-latent's backward on the ring (latent_g again, K/V recomputed per hop, the
// travelling block's fp32 dlatent "dlatent_g" back around the ring to its group), then in the
// group: dq's all-to-all (gather_heads) and the reduce-scatter of the group's dlatent (the U1
// all-gather's adjoint, partial sums in --dlatent-sum's dtype), the block's query-path backward
// behind both. Every group collective is waited before the ring's first send_recv and issued after
// its last: under the threads backend a rank progresses only the communicator it waits on, so a
// group collective left in flight across a ring wait could block a group peer (no ordering across
// communicators is needed under MPI, but the same code runs on both). Per layer and rank: the
// group's all-gather and reduce-scatter (Pu − 1)·N·B·Dl each, q's, o's and their adjoints'
// all-to-alls (Pu − 1)/Pu of N·B·H·(Dqk or Dv), and 2(Pr − 1) latent hops of Tg·B·Dl plus (Pr − 1)
// dlatent hops of Tg·B·Dl·4 bytes. With Pu = P (Pr = 1) the config is plain laga (form_of picks
// laga.cpp): same layout, collectives, bits.
#include "ring.hpp"

#include "laga/comm/pairs.hpp"

namespace laga::forms {

void add_laga_problems(const MlaConfig& c, std::vector<std::string>& p);

namespace {

struct LagaRingSaved final : CoreSaved {
  RingLatentState st;  // latent_g [Tg, B, Dl], q [Tg, B, Hr, Dqk], o [Tg, B, Hr, Dv], lse
  void for_each(const std::function<void(const char*, const Tensor&)>& f) const override {
    st.for_each(f);
  }
};

RingView groups_ring(const RankCtx& ctx) {
  return {*ctx.ring, ctx.Pr, ctx.g, ctx.T / (2 * ctx.Pr), ctx.u * ctx.Hr, ctx.Hr};
}

class LagaRing final : public Form {
 public:
  std::string_view name() const override { return "laga"; }
  std::string_view family() const override { return "laga"; }
  std::string_view summary() const override {
    return "laga with --ulysses Pu: all-gather of the latent and all-to-all of q and o inside "
           "groups of Pu ranks, "
           "the group's latent around a ring of the P/Pu groups (fp32 dlatent back), zigzag over "
           "groups";
  }
  std::string_view own_kernel() const override { return "fused"; }
  TokenLayout layout() const override { return TokenLayout::zigzag_groups; }

  Tensor forward(const RankCtx& ctx, const LayerWeights& w, Tensor latent, const QueryPath& query,
                 std::unique_ptr<CoreSaved>& out) const override {
    LAGA_ASSERT(ctx.heads_group && ctx.ring,
                "laga with --ulysses {} needs the group's sub-communicators", ctx.Pu);
    auto s = std::make_unique<LagaRingSaved>();
    Communicator& group = *ctx.heads_group;
    // U1: the latent's all-gather in flight behind the query path; q's behind nothing but its wait
    InFlight latent_g =
        issue(ctx, all_gather_tokens_start(group, std::move(latent), "latent", "act.latent_g"));
    InFlight q_if = issue(ctx, scatter_heads_start(group, query(), "q", "act.q"));
    Tensor lg = latent_g.wait();
    Tensor q = q_if.wait();  // both group collectives done before the ring starts (see the top)
    // U2 on the ring of groups
    Tensor o = ring_latent_forward(
        ctx, groups_ring(ctx), w, std::move(lg), [&] { return std::move(q); }, s->st, "latent_g");
    out = std::move(s);
    return o;  // U3: the block's o all-to-all in the group (RankCtx::heads_comm)
  }

  Tensor backward(const RankCtx& ctx, const LayerWeights& w, std::unique_ptr<CoreSaved> saved,
                  Tensor dout, LayerWeights& g,
                  const QueryPathBackward& query_backward) const override {
    auto& s = static_cast<LagaRingSaved&>(*saved);
    Communicator& group = *ctx.heads_group;
    RingLatentGrads d = ring_latent_backward(ctx, groups_ring(ctx), w, s.st, std::move(dout), g,
                                             "latent_g", "dlatent_g");
    // U1's adjoints in the group: dq back to this rank's tokens, the group's dlatent summed over
    // the group's head shards (partials in --dlatent-sum's dtype, rounded to the storage dtype
    // once)
    InFlight dq_local =
        issue(ctx, gather_heads_start(group, d.dq.to(ctx.dt, "grad.q"), "dq", "grad.q_local"));
    d.dq = Tensor();
    const DType sum_dt = ctx.c.dlatent_sum_dtype();
    Tensor part =
        sum_dt == DType::f32 ? std::move(d.dlatent) : d.dlatent.to(sum_dt, "grad.latent_g");
    d.dlatent = Tensor();
    InFlight dlatent = issue(
        ctx, reduce_scatter_tokens_start(group, std::move(part), "dlatent", "grad.latent", ctx.dt));
    query_backward(dq_local.wait());
    return dlatent.wait();
  }

  void add_problems(const MlaConfig& c, std::vector<std::string>& p) const override {
    add_laga_problems(c, p);
  }
};

}  // namespace

// laga's conditions (laga.cpp and here): Pu = --ulysses (or P) divides H; below P, 2·Pr divides T.
// A P that does not divide H is refused with the --ulysses values that would run it.
void add_laga_problems(const MlaConfig& c, std::vector<std::string>& p) {
  const int64_t P = c.sp, H = c.num_attention_heads, T = c.seq_len;
  // named by problems()
  if (P <= 0 || H <= 0 || c.ulysses < 0 || (c.ulysses > 0 && P % c.ulysses)) return;
  const int64_t Pu = c.head_group();
  auto valid_ulysses = [&] {
    std::string s;
    for (int64_t d = 1; d < P && d <= H; ++d)
      if (P % d == 0 && H % d == 0 && (T <= 0 || zigzag_fits(T, P / d)))
        s += (s.empty() ? "" : ", ") + std::to_string(d);
    return s;
  };
  if (H % Pu) {
    const std::string v = valid_ulysses();
    const std::string alt = v.empty()
                                ? ""
                                : fmt::format(
                                      ", or --ulysses {} (laga's head scatter in groups of that "
                                      "many ranks, a ring over the groups)",
                                      v);
    if (Pu == P)
      p.push_back(fmt::format("--sp {} does not divide num_attention_heads {}; try {}{}", P, H,
                              divisors_str(H), alt));
    else
      p.push_back(fmt::format("--ulysses {} does not divide num_attention_heads {}; try {}{}", Pu,
                              H,
                              v.empty() ? "a divisor of both --sp and the heads" : "--ulysses " + v,
                              v.empty() ? "" : " (each divides --sp and the heads)"));
    return;
  }
  if (Pu < P) {
    const std::string s = zigzag_seq_problem(
        T, P / Pu, fmt::format("(--sp {} / --ulysses {})", P, Pu),
        "laga's ring over the groups gives every group two zigzag chunks of T/(2·Pr) tokens");
    if (!s.empty()) p.push_back(s);
  }
}

const Form& laga_ring_form() {
  static const LagaRing form;
  return form;
}

}  // namespace laga::forms
