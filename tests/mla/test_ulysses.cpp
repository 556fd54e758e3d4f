// laga-ulysses (--ulysses Pu: head scatter in groups of Pu ranks × a ring over the P/Pu groups): a
// registered form, so every sweep over the registry runs it (at its default Pu, the largest divisor
// of P below P that divides H, where --ulysses is not given); `--form laga --ulysses Pu` with Pu <
// P names it and gives the same bits; its token layout (zigzag over groups, 1 or 2 segments per
// rank) covers the sequence once; it matches explicit in fp32 within 1e-5 relative with more ranks
// than heads, and bf16 by the project's rule (each tensor's error against fp64 ≤ 2 ×
// max(explicit's, the plain implementation's) + floor); laga with --ulysses P is plain laga bit for
// bit; overlap on and off give the same bits; the plan equals the measured run to the byte (memory
// and every ledger record, the sub-groups' collectives included); the ledger holds exactly the
// declared collectives (the ring pair Pr − 1 times); and the refusals name the value and the valid
// ones.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <string>
#include <vector>

#include "laga/driver/launch.hpp"
#include "laga/driver/plan.hpp"
#include "laga/driver/run.hpp"
#include "laga/mla/form.hpp"
#include "reference/array.hpp"
#include "reference/block_ref.hpp"
#include "verify/compare.hpp"
#include "verify/forms.hpp"

namespace laga {
namespace {

// laga-ulysses on tiny (H = 8); with Pu = 3 (H 12) a rank's rows straddle its group's two chunks
// (two segments).
MlaConfig tiny(int64_t T, int64_t P, int64_t Pu, DType dt = DType::f32,
               const std::string& form = "laga-ulysses") {
  MlaConfig c = MlaConfig::preset("tiny");
  c.seq_len = T, c.sp = P, c.ulysses = Pu, c.batch = 2, c.num_layers = 2, c.dtype = dt,
  c.form = form;
  if (Pu == 3) c.num_attention_heads = 12;
  return c;
}

std::string problems_of(const MlaConfig& c) {
  std::string s;
  for (const auto& p : c.problems()) s += p + "; ";
  return s;
}

TEST(Ulysses, SegmentsCoverTheSequenceOnceGroupByGroupInZigzagChunks) {
  for (auto [T, P, Pu] : std::vector<std::array<int64_t, 3>>{
           {32, 4, 2}, {48, 4, 2}, {32, 16, 8}, {32, 16, 4}, {24, 6, 3}}) {
    const MlaConfig c = tiny(T, P, Pu);
    ASSERT_EQ(problems_of(c), "") << T << " " << P << " " << Pu;
    const int64_t Pr = P / Pu, C = T / (2 * Pr), N = T / P;
    std::vector<int> seen(size_t(T), 0);
    for (int64_t r = 0; r < P; ++r) {
      int64_t len = 0;
      for (const auto& s : token_segments(c, r)) {
        len += s.len;
        for (int64_t t = s.pos0; t < s.pos0 + s.len; ++t) {
          ++seen[size_t(t)];
          const int64_t chunk = t / C, g = r / Pu;
          EXPECT_TRUE(chunk == g || chunk == 2 * Pr - 1 - g) << "rank " << r << " token " << t;
        }
      }
      EXPECT_EQ(len, N);
    }
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  }
  EXPECT_EQ(token_segments(tiny(24, 6, 3), 1).size(), 2u);  // rows [4, 8) of chunks of 6
  // laga with --ulysses P is the contiguous layout of plain laga
  const MlaConfig plain = tiny(32, 4, 4, DType::f32, "laga");
  for (int64_t r = 0; r < 4; ++r) {
    const auto s = token_segments(plain, r);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].pos0, r * 8);
  }
}

TEST(Ulysses, MatchesExplicitInFp32WithMoreRanksThanHeads) {
  const verify::Tensors want = verify::run_tensors(Config(tiny(32, 1, 0, DType::f32, "explicit")));
  for (auto [P, Pu] : std::vector<std::array<int64_t, 2>>{{4, 2}, {16, 8}, {16, 4}, {8, 1}}) {
    const verify::Tensors got = verify::run_tensors(Config(tiny(32, P, Pu)));
    double worst = 0;
    for (const auto& [name, e] : verify::errors(got, want)) {
      EXPECT_LE(e.max_abs, 1e-5 * e.scale) << "P " << P << " Pu " << Pu << " " << name;
      worst = std::max(worst, e.max_abs / e.scale);
    }
    std::printf(
        "laga-ulysses --sp %lld --ulysses %lld vs explicit P 1 (fp32): worst relative "
        "error %.3g\n",
        (long long)P, (long long)Pu, worst);
  }
  // H 12, P 6 = 3 × 2: ranks with two token segments (RoPE and the driver's rows per segment)
  MlaConfig m12 = tiny(24, 1, 3);
  m12.form = "explicit", m12.ulysses = 0;
  const Config e12(m12);
  const verify::Tensors want12 = verify::run_tensors(e12);
  for (const auto& [name, e] : verify::errors(verify::run_tensors(Config(tiny(24, 6, 3))), want12))
    EXPECT_LE(e.max_abs, 1e-5 * e.scale) << "P 6 Pu 3 H 12 " << name;
}

TEST(Ulysses, Bf16WithinTheProjectsRule) {
  const Config e1 = tiny(32, 1, 0, DType::bf16, "explicit");
  RunOptions opt;
  opt.gather_tensors = true;
  const RankResult one = run_group(e1, opt).front();
  const auto w = ref::from_weights(one.weights);
  const auto x = ref::from_tensor(one.x), dy = ref::from_tensor(one.dy);
  const verify::Tensors exact = verify::reference_tensors(*e1, w, x, dy, std::nullopt);
  const auto plain_err = verify::plain_errors(*e1, w, x, dy, exact);
  for (const auto& sizes : std::vector<std::array<int64_t, 2>>{{4, 2}, {16, 8}, {16, 4}}) {
    const int64_t P = sizes[0], Pu = sizes[1];  // captured below: not a structured binding
    // explicit at the same P where it runs (P | H), else at P = 1
    const Config e = e1.with([&](MlaConfig& m) { m.sp = P <= 8 ? P : 1; });
    const auto e_err = verify::errors(verify::run_tensors(e), exact);
    const auto err =
        verify::errors(verify::run_tensors(Config(tiny(32, P, Pu, DType::bf16))), exact);
    const verify::Verdict v = verify::form_vs_baseline(err, e_err, plain_err, DType::bf16);
    EXPECT_TRUE(v.pass) << "P " << P << " Pu " << Pu << ": " << verify::summary(v);
    std::printf("laga-ulysses --sp %lld --ulysses %lld bf16: %s\n", (long long)P, (long long)Pu,
                verify::summary(v).c_str());
  }
}

TEST(Ulysses, LagaWithUlyssesEqualToSpIsPlainLagaBitwise) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const verify::Tensors laga = verify::run_tensors(Config(tiny(32, 4, 0, dt, "laga")));
    const verify::Tensors same = verify::run_tensors(Config(tiny(32, 4, 4, dt, "laga")));
    std::string where;
    EXPECT_TRUE(verify::bitwise_equal(laga, same, &where)) << where;
  }
}

// The one place a spelling becomes a label: laga with a --ulysses other than --sp names
// laga-ulysses (resolve_form_label, which the command line, a configuration's JSON and Config read
// through), and runs it bit for bit; with --ulysses P it stays laga; a form that takes no --ulysses
// keeps its name, and Config refuses it.
TEST(Ulysses, LagaSpelledWithAUlyssesOtherThanSpIsLagaUlyssesBitForBit) {
  RunShape shape;
  shape.sp = 8, shape.ulysses = 2;
  EXPECT_EQ(resolve_form_label("laga", "expanded", shape), "laga-ulysses");
  EXPECT_EQ(resolve_form_label("laga-ulysses", "expanded", shape), "laga-ulysses");
  EXPECT_EQ(resolve_form_label("explicit", "expanded", shape), "explicit");
  EXPECT_EQ(resolve_form_label("laga", "expanded"), "laga");
  shape.ulysses = 8;
  EXPECT_EQ(resolve_form_label("laga", "expanded", shape), "laga");
  shape.sp = 4;  // Pu above P: laga-ulysses, which refuses it
  EXPECT_EQ(resolve_form_label("laga", "expanded", shape), "laga-ulysses");
  for (DType dt : {DType::f32, DType::bf16}) {
    nlohmann::json j = tiny(32, 4, 2, dt).to_json();
    j["form"] = "laga";  // as a dump of laga --ulysses 2 wrote it
    const Config spelled(MlaConfig::from_json(j));
    EXPECT_EQ(spelled->form, "laga-ulysses");
    EXPECT_EQ(spelled->ulysses, 2);
    // and a config spelled so in code
    EXPECT_EQ(Config(tiny(32, 4, 2, dt, "laga"))->form, "laga-ulysses");
    std::string where;
    EXPECT_TRUE(verify::bitwise_equal(verify::run_tensors(spelled),
                                      verify::run_tensors(Config(tiny(32, 4, 2, dt))), &where))
        << dtype_name(dt) << " " << where;
  }
}

// Without --ulysses, Config and as_form give laga-ulysses the largest divisor of P below P that
// divides H: the fewest groups on the ring; at P 1, one group of one rank (a ring of one, which
// sends nothing).
TEST(Ulysses, DefaultPuIsTheLargestDivisorOfPBelowPThatDividesTheHeads) {
  auto default_at = [](int64_t P, int64_t H) {
    MlaConfig c = tiny(48 * P, P, 0);
    c.num_attention_heads = H;
    return as_form(c, "laga-ulysses").ulysses;
  };
  EXPECT_EQ(default_at(8, 8), 4);
  EXPECT_EQ(default_at(16, 8), 8);
  EXPECT_EQ(default_at(12, 8), 4);
  EXPECT_EQ(default_at(6, 12), 3);
  EXPECT_EQ(default_at(6, 5), 1);
  EXPECT_EQ(default_at(2, 8), 1);
  EXPECT_EQ(default_at(1, 8), 1);
  const Config c(tiny(32, 8, 0));
  EXPECT_EQ(c->ulysses, 4);
  EXPECT_EQ(displayed_form(*c), "laga-ulysses (ulysses 4)");
  // every other form runs over the whole group
  EXPECT_EQ(as_form(*c, "laga").ulysses, 0);
  EXPECT_EQ(as_form(*c, "ring-latent").ulysses, 0);
  // a given --ulysses is kept
  EXPECT_EQ(as_form(tiny(32, 8, 2, DType::f32, "explicit"), "laga-ulysses").ulysses, 2);
  // at P 1, a ring of one group: runs, within fp32 noise of explicit
  const verify::Tensors one = verify::run_tensors(Config(tiny(32, 1, 0)));
  const verify::Tensors e =
      verify::run_tensors(Config(tiny(32, 1, 0, DType::f32, std::string(kBaselineForm))));
  for (const auto& [name, err] : verify::errors(one, e))
    EXPECT_LE(err.max_abs, 1e-5 * err.scale) << name;
}

// Registered as every form is: every command and test sweep over the registry runs it, at its
// default Pu, and judges it by the one rule of the commands that run every form (forms_at).
TEST(Ulysses, LagaUlyssesIsARegisteredFormThatEverySweepRuns) {
  const auto& all = registered_forms();
  const auto it = std::find_if(all.begin(), all.end(),
                               [](const Form* f) { return f->name() == "laga-ulysses"; });
  ASSERT_NE(it, all.end());
  EXPECT_EQ(&find_form("laga-ulysses"), *it);
  EXPECT_TRUE((*it)->takes_ulysses());
  EXPECT_EQ(ulysses_form_names(), "laga-ulysses");
  for (const Form* f : all) {
    if (f != *it) {
      EXPECT_FALSE(f->takes_ulysses()) << f->name();
    }
  }
  // tiny (H 8) at P 16: no head-scatter form runs, laga-ulysses does (Pu 8, a ring of 2 groups)
  MlaConfig c = tiny(32, 16, 0, DType::f32, std::string(kBaselineForm));
  const FormsAt at = forms_at(c);
  EXPECT_TRUE(std::find(at.runnable.begin(), at.runnable.end(), *it) != at.runnable.end());
  EXPECT_NE(at.refusal(find_form("laga")), "");
  // a --ulysses it cannot run: not run, with the reason naming the value and the valid ones
  c.ulysses = 3;
  EXPECT_EQ(forms_at(c).refusal(**it),
            "--ulysses 3 does not divide --sp 16; try --ulysses 1, 2, 4, 8");
  // verify's sweep: a case at every P, the Pu in it
  verify::FormsReport report;
  launch(LaunchKind::threads, [&](Launcher& l) {
    verify::FormsOptions opt;
    opt.forms = {"laga-ulysses"};
    MlaConfig e = tiny(16, 1, 0, DType::f32, "explicit");
    e.num_layers = 1, e.batch = 1;
    report = verify::check_forms(e, {1, 4}, l, opt);
  });
  std::vector<std::string> cases;
  for (const auto& k : report.cases)
    if (k.form == "laga-ulysses") cases.push_back(fmt::format("{} {} {}", k.sp, k.label, k.vs));
  EXPECT_EQ(cases, (std::vector<std::string>{"1 laga-ulysses (ulysses 1) fp64",
                                             "4 laga-ulysses (ulysses 2) fp64"}));
  EXPECT_TRUE(report.pass);
}

TEST(Ulysses, OverlapOnAndOffGiveTheSameBits) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const Config off(tiny(32, 8, 2, dt));
    const verify::Tensors a = verify::run_tensors(off);
    const verify::Tensors b = verify::run_tensors(off.with([](MlaConfig& m) { m.overlap = true; }));
    std::string where;
    EXPECT_TRUE(verify::bitwise_equal(a, b, &where)) << dtype_name(dt) << " " << where;
  }
}

TEST(Ulysses, PlanMatchesMeasuredMemoryAndLedgerToTheByte) {
  for (auto [T, P, Pu] : std::vector<std::array<int64_t, 3>>{{32, 4, 2}, {24, 6, 3}, {32, 16, 8}})
    for (DType dt : {DType::f32, DType::bf16})
      for (bool overlap : {false, true}) {
        MlaConfig c = tiny(T, P, Pu, dt);
        c.overlap = overlap, c.q_lora_rank = overlap ? 0 : 48;
        c.dlatent_sum = dt == DType::bf16 && overlap ? DlatentSum::fp32 : DlatentSum::storage;
        const PlannedMemory plan = plan_memory(c);
        const PlannedComm comm = plan_comm(c);
        for (const RankResult& r : run_group(c, RunOptions{})) {
          SCOPED_TRACE(fmt::format("T {} P {} Pu {} {} overlap {} rank {}", T, P, Pu,
                                   dtype_name(dt), overlap, r.rank));
          EXPECT_EQ(plan.activation_peak_bytes, r.memory.activation_peak_bytes);
          EXPECT_EQ(plan.saved_bytes, r.memory.saved_bytes);
          EXPECT_EQ(plan.forward_peak_bytes, r.memory.forward_peak_bytes);
          EXPECT_EQ(plan.backward_peak_bytes, r.memory.backward_peak_bytes);
          EXPECT_EQ(plan.peak_breakdown, r.memory.peak_breakdown);
          std::vector<CollectiveRecord> planned = comm.attention;
          planned.insert(planned.end(), comm.grad_sync.begin(), comm.grad_sync.end());
          ASSERT_EQ(planned.size(), r.collectives.size());
          for (size_t i = 0; i < planned.size(); ++i) {
            EXPECT_EQ(planned[i].op, r.collectives[i].op) << i;
            EXPECT_EQ(planned[i].tensor, r.collectives[i].tensor) << i;
            EXPECT_EQ(planned[i].tensor_bytes, r.collectives[i].tensor_bytes) << i;
            EXPECT_EQ(planned[i].wire_bytes, r.collectives[i].wire_bytes) << i;
            // The group each ran on, as the job's ranks (the model's sub-group times read it): the
            // plan is rank 0's.
            ASSERT_EQ(bool(planned[i].group), bool(r.collectives[i].group)) << i;
            if (planned[i].group && r.rank == 0) {
              EXPECT_EQ(*planned[i].group, *r.collectives[i].group) << i;
            }
          }
        }
      }
}

// Per layer and rank, closed form: the group's all-gather and reduce-scatter (Pu − 1)·E·Dl·s wire
// each, 2(Pr − 1) hops of the group's latent Tg·B·Dl·s and (Pr − 1) of its fp32 dlatent, q's/dq's
// and o's/do's all-to-alls (Pu − 1)/Pu of E·H·(Dqk | Dv)·s; and the forward's issue order: latent,
// q, the ring hop by hop, o.
TEST(Ulysses, LedgerHoldsExactlyTheDeclaredCollectivesWithTheClosedFormBytes) {
  const int64_t T = 32, P = 8, Pu = 2, Pr = 4;
  const Config c(tiny(T, P, Pu, DType::bf16));
  EXPECT_EQ(displayed_form(*c), "laga-ulysses (ulysses 2)");
  const PlannedComm plan = plan_comm(c);
  std::vector<std::string> fwd;
  for (const auto& r : plan.attention) fwd.push_back(r.tensor);
  fwd.resize(2 + (Pr - 1) + 1);
  std::vector<std::string> want{"latent", "q", "latent_g", "latent_g", "latent_g", "o"};
  EXPECT_EQ(fwd, want);
  const int64_t s = 2, E = T / P * c->batch, Eg = E * Pu, Dl = c->latent_dim(), H = 8;
  const int64_t per_layer_wire = 2 * (Pu - 1) * E * Dl * s + 2 * (Pr - 1) * Eg * Dl * s +
                                 (Pr - 1) * Eg * Dl * 4 +
                                 2 * (Pu - 1) * E * H * (c->qk_head_dim() + c->v_head_dim) * s / Pu;
  EXPECT_EQ(plan.wire_bytes(), c->num_layers * per_layer_wire);
  EXPECT_EQ(int64_t(plan.attention.size()), c->num_layers * (6 + 3 * (Pr - 1)));
}

TEST(Ulysses, UpProjectionFlopsCountEveryHopsHeadShard) {
  const MlaConfig c = tiny(32, 16, 4);
  MlaConfig laga = c;
  laga.sp = 8, laga.ulysses = 0, laga.form = "laga";  // P | H: one up-projection of the sequence
  const double up =
      2.0 * 32 * 2 * double(c.kv_lora_rank) * 8 * double(c.qk_nope_head_dim + c.v_head_dim);
  const PlannedFlops a = planned_flops(Config(c)), b = planned_flops(Config(laga));
  EXPECT_DOUBLE_EQ(a.forward - b.forward, 3 * up * 2);              // Pr − 1 = 3 more, 2 layers
  EXPECT_DOUBLE_EQ(a.backward - b.backward, (4 + 2 * 3) * up * 2);  // Pr recomputed + 2(Pr − 1)
}

TEST(Ulysses, RefusalsNameTheValueAndTheValidOnes) {
  auto has = [](const MlaConfig& c, const std::string& text) {
    const std::string p = problems_of(c);
    EXPECT_NE(p.find(text), std::string::npos) << "want '" << text << "' in: " << p;
  };
  has(tiny(32, 8, 3), "--ulysses 3 does not divide --sp 8; try --ulysses 1, 2, 4");
  has(tiny(32, 8, 2, DType::f32, "explicit"),
      "--ulysses 2 (head-scatter groups of that many ranks, a ring over them) applies to "
      "laga-ulysses only, not to form 'explicit'; try --form laga-ulysses, or drop --ulysses");
  // laga with --ulysses above --sp names laga-ulysses, which refuses it
  has(tiny(32, 4, 8, DType::f32, "laga"), "--ulysses 8 does not divide --sp 4; try --ulysses 1, 2");
  // H 8
  has(tiny(48, 12, 6), "--ulysses 6 does not divide num_attention_heads 8; try --ulysses 1, 2, 4");
  has(tiny(16, 16, 0, DType::f32, "laga"),
      "--sp 16 does not divide num_attention_heads 8; try 1, 2, 4, 8, or --ulysses 2, 4, 8 "
      "(laga-ulysses: laga's head scatter in groups of that many ranks, a ring over the groups)");
  has(tiny(12, 4, 1), "--seq 12 is not a multiple of 2 × (--sp 4 / --ulysses 1) = 8");
  has(tiny(32, 8, -1), "--ulysses -1 must be positive (or 0: none)");
  EXPECT_EQ(problems_of(tiny(32, 8, 8)), "");  // a ring of one group
  EXPECT_EQ(problems_of(tiny(32, 8, 8, DType::f32, "laga")), "");
  EXPECT_EQ(problems_of(tiny(32, 8, 0)), "");
  EXPECT_EQ(problems_of(tiny(32, 8, 0, DType::f32, "laga")), "");
}

}  // namespace
}  // namespace laga
