// The performance model (driver/model.hpp): its communication term is the planner's bytes over the
// hardware file's link, checked by hand against the closed forms of docs/accounting.md §5; the
// latency + bandwidth fit recovers known parameters; hardware files with a missing or mistyped
// field are refused naming the field; the docs/hw files predict every form.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include <cmath>

#include "laga/core/error.hpp"
#include "laga/driver/calibrate.hpp"
#include "laga/driver/model.hpp"
#include "laga/driver/plan.hpp"
#include "laga/driver/run.hpp"
#include "laga/ops/attention.hpp"
#include "laga/mla/form.hpp"

namespace laga {
namespace {

using json = nlohmann::json;

// 1 GB/s for every op, 1 µs latency, 2 ranks per node; 0.25 GB/s per rank and 3 µs across nodes.
json toy_hw() {
  return json::parse(R"({"name": "toy", "source": "test",
    "compute": {"bf16": {"matmul_tflops": 1, "attention_fwd_tflops": 0.5, "attention_bwd_tflops": 0.25, "elementwise_GBps": 10}},
    "link": {"intra_node": {"busbw_GBps": 1, "latency_us": 1}, "inter_node": {"busbw_GBps": 0.25, "latency_us": 3}},
    "ranks_per_node": 2})");
}

void expect_refused(const json& j, const std::string& field);

Config tiny(const std::string& form, int64_t T, int64_t P) {
  MlaConfig c = MlaConfig::preset("tiny");
  c.seq_len = T, c.sp = P, c.form = form, c.dtype = DType::bf16;
  return Config(c);
}

TEST(Model, CommunicationIsThePlannersBytesCheckedByHand) {
  const HardwareSpec hw = HardwareSpec::from_json(toy_hw(), "toy.json");
  // tiny: H 8, Dqk 24, Dv 12, Dl 40; T 16, P 2, B 1, bf16 (s = 2): E = 8 local rows.
  // docs/accounting.md §5: an all-to-all's tensor bytes are its input, E·H·d·s, and it sends
  // (P−1)/P of them; the latent all-gather's tensor bytes are the shard E·Dl·s, and it sends P−1
  // shards.
  const double E = 8, H = 8, Dqk = 24, Dv = 12, Dl = 40, s = 2, P = 2;
  // 3072, 3072, 1536, 1536, 640
  const double q = E * H * Dqk * s, k = q, v = E * H * Dv * s, o = v, latent = E * Dl * s;
  EXPECT_EQ(latent, 640);
  const FormPrediction ex = predict(tiny("explicit", 16, 2), hw);
  const FormPrediction la = predict(tiny("laga", 16, 2), hw);
  // Each collective by the tensor it moves (the issue order is the form's: docs/design.md §2.6):
  // explicit q, k, v, o forward and do, dq, dk, dv backward; laga q, latent, o and do, dlatent, dq.
  const std::map<std::string, double> ex_tensor{{"q", q},  {"k", k},  {"v", v},  {"o", o},
                                                {"do", o}, {"dq", q}, {"dk", k}, {"dv", v}};
  const std::map<std::string, double> la_tensor{{"q", q},  {"latent", latent},  {"o", o},
                                                {"do", o}, {"dlatent", latent}, {"dq", q}};
  const std::set<std::string> backward{"do", "dq", "dk", "dv", "dlatent"};
  ASSERT_EQ(ex.collectives.size(), ex_tensor.size());
  ASSERT_EQ(la.collectives.size(), la_tensor.size());
  double ex_comm = 0, la_comm = 0;
  for (const CollectiveTime& t : ex.collectives) {
    ASSERT_TRUE(ex_tensor.count(t.record.tensor)) << t.record.tensor;
    const double bytes = ex_tensor.at(t.record.tensor);
    EXPECT_EQ(t.record.op, CollectiveOp::all_to_all);
    EXPECT_EQ(double(t.record.tensor_bytes), bytes) << t.record.tensor;
    EXPECT_EQ(t.size_bytes, bytes);  // nccl-tests' S of an all-to-all: the per-rank buffer
    EXPECT_EQ(t.backward, backward.count(t.record.tensor) == 1) << t.record.tensor;
    const double want = 1e-6 + bytes * (P - 1) / P / 1e9;
    EXPECT_NEAR(t.seconds, want, 1e-15) << t.record.tensor;
    ex_comm += want;
  }
  for (const CollectiveTime& t : la.collectives) {
    ASSERT_TRUE(la_tensor.count(t.record.tensor)) << t.record.tensor;
    const double bytes = la_tensor.at(t.record.tensor);
    EXPECT_EQ(double(t.record.tensor_bytes), bytes) << t.record.tensor;
    const bool gather =
        t.record.op == CollectiveOp::all_gather || t.record.op == CollectiveOp::reduce_scatter;
    EXPECT_EQ(gather, t.record.tensor == "latent" || t.record.tensor == "dlatent");
    // S of an all-gather / reduce-scatter is the whole array, P shards; busbw counts (P−1)/P of it.
    EXPECT_EQ(t.size_bytes, gather ? P * bytes : bytes);
    const double want = 1e-6 + (gather ? (P - 1) * bytes : bytes * (P - 1) / P) / 1e9;
    EXPECT_NEAR(t.seconds, want, 1e-15) << t.record.tensor;
    la_comm += want;
  }
  EXPECT_NEAR(ex.comm_s(), ex_comm, 1e-15);
  EXPECT_NEAR(la.comm_s(), la_comm, 1e-15);
  // Without overlap every collective is exposed whole, inside the pass that issues it.
  EXPECT_NEAR(ex.fwd_s() + ex.bwd_s(), ex.total_s(), 1e-15);
  EXPECT_NEAR(ex.fwd_comm_s, 4e-6 + (q + k + v + o) / 2 / 1e9, 1e-15);
}

// The replay (driver/model.hpp) waits where the form's code waits. Without overlap every form
// waits for a collective right after issuing it, so each is exposed whole on forms whose ranks do
// the same work. With --overlap on, a collective alone in flight is exposed for what the compute
// the form runs between its issue and its wait does not cover — summed here from the plan's own
// timeline and work_seconds, independently of the replay's clock. The compute is the same either
// way, and something hides.
TEST(Model, TheReplayWaitsWhereTheFormsCodeWaits) {
  const HardwareSpec hw = HardwareSpec::from_json(toy_hw(), "toy.json");
  const ComputeSpec& rates = hw.compute_for(DType::bf16);
  for (const char* form : {"laga", "explicit", "laga-recompute", "explicit-recompute",
                           "absorbed-shared", "ring-kv", "ring-latent", "laga-fused"})
    for (int64_t L : {1, 2}) {
      SCOPED_TRACE(std::string(form) + " L" + std::to_string(L));
      MlaConfig c = *tiny(form, 16, 2);
      c.num_layers = L;
      const FormPrediction off = predict(c, hw);
      for (const CollectiveTime& t : off.collectives)
        EXPECT_NEAR(t.exposed_s, t.seconds, 1e-15) << t.record.tensor;
      c.overlap = true;
      const FormPrediction on = predict(c, hw);
      ASSERT_EQ(on.collectives.size(), off.collectives.size());
      EXPECT_NEAR(on.fwd_compute_s + on.bwd_compute_s, off.fwd_compute_s + off.bwd_compute_s,
                  1e-15);
      const Plan plan = plan_run(Config(c), int(on.rank));
      // A group: collectives issued together with nothing else on the link, compute, then the
      // group's waits with nothing else between. They share the link, so together they are exposed
      // for what the compute between does not cover.
      const auto& tl = plan.work.timeline;
      using K = TimelineEvent::Kind;
      int alone = 0, in_flight = 0;
      for (size_t a = 0; a < tl.size(); ++a) {
        if (tl[a].kind == K::wait) --in_flight;
        if (tl[a].kind != K::issue) continue;
        const bool link_free = in_flight == 0;
        std::set<int64_t> group;
        size_t b = a;
        for (; b < tl.size() && tl[b].kind == K::issue; ++b) group.insert(tl[b].index);
        in_flight += int(group.size());
        double between = 0;
        for (; b < tl.size() && tl[b].kind == K::compute; ++b)
          between += work_seconds(plan.work.records[size_t(tl[b].index)], c, rates);
        std::set<int64_t> waited;
        for (; b < tl.size() && tl[b].kind == K::wait && group.count(tl[b].index); ++b)
          waited.insert(tl[b].index);
        const size_t last = b;
        for (b = a; b < last && tl[b].kind == K::issue; ++b) a = b;
        if (!link_free || waited != group) continue;
        double seconds = 0, exposed = 0;
        for (int64_t k : group)
          seconds += on.collectives[size_t(k)].seconds,
              exposed += on.collectives[size_t(k)].exposed_s;
        EXPECT_NEAR(exposed, std::max(0.0, seconds - between), 1e-15)
            << on.collectives[size_t(*group.begin())].record.tensor;
        ++alone;
      }
      EXPECT_GT(alone, 0);
      EXPECT_LT(on.comm_s(), off.comm_s());
    }
}

// A link's host cost (host_ns_per_byte): the hidden part of each collective takes its bytes' host
// time from compute; exposed parts and runs without overlap are unchanged; the time of a collective
// is not.
TEST(Model, HiddenBytesCostTheComputeTheLinksHostCost) {
  json j = toy_hw();
  const HardwareSpec plain = HardwareSpec::from_json(j, "toy.json");
  j["link"]["intra_node"]["host_ns_per_byte"] = 2.5;  // every op
  const HardwareSpec costly = HardwareSpec::from_json(j, "toy.json");
  for (const char* form : {"laga", "explicit", "ring-latent", "ring-kv"}) {
    SCOPED_TRACE(form);
    MlaConfig c = *tiny(form, 16, 2);
    c.num_layers = 2;
    EXPECT_NEAR(predict(c, costly).total_s(), predict(c, plain).total_s(), 1e-15)
        << "nothing hidden: nothing charged";
    EXPECT_EQ(predict(c, costly).hidden_host_s, 0);
    c.overlap = true;
    const FormPrediction a = predict(c, plain), b = predict(c, costly);
    ASSERT_EQ(a.collectives.size(), b.collectives.size());
    double fwd = 0, bwd = 0;
    for (size_t i = 0; i < b.collectives.size(); ++i) {
      const CollectiveTime& t = b.collectives[i];
      EXPECT_EQ(t.seconds, a.collectives[i].seconds);
      EXPECT_EQ(a.collectives[i].host_s, 0);
      // the bytes this rank sends (the ledger's wire bytes) at 2.5 ns each
      EXPECT_NEAR(t.host_s, 2.5e-9 * double(t.record.wire_bytes), 1e-18) << t.record.tensor;
      // a collective queued behind others on the link waits longer than it takes: none hidden
      (t.backward ? bwd : fwd) += t.host_s * std::max(0.0, t.seconds - t.exposed_s) / t.seconds;
    }
    EXPECT_GT(fwd + bwd, 0) << "something is hidden with overlap";
    EXPECT_NEAR(b.fwd_compute_s - a.fwd_compute_s, fwd, 1e-15);
    EXPECT_NEAR(b.bwd_compute_s - a.bwd_compute_s, bwd, 1e-15);
    EXPECT_NEAR(b.hidden_host_s, fwd + bwd, 1e-15);
    // the host's time runs ahead of the transfers, so waits can only shrink
    EXPECT_LE(b.comm_s(), a.comm_s() + 1e-15);
  }
  // Per op, round-tripped, and refused when negative or not a number, naming the field.
  j["link"]["intra_node"]["host_ns_per_byte"] = {
      {"all_gather", 1}, {"reduce_scatter", 2}, {"all_to_all", 3}, {"all_reduce", 4}};
  const HardwareSpec per_op = HardwareSpec::from_json(j, "toy.json");
  EXPECT_DOUBLE_EQ(per_op.intra_node.host_cost(CollectiveOp::all_to_all), 3e-9);
  EXPECT_EQ(HardwareSpec::from_json(per_op.to_json(), "again.json").to_json(), per_op.to_json());
  EXPECT_EQ(plain.intra_node.host_cost(CollectiveOp::all_gather), 0);
  j["link"]["intra_node"]["host_ns_per_byte"] = -1;
  expect_refused(j, "link.intra_node.host_ns_per_byte");
  j["link"]["intra_node"]["host_ns_per_byte"] = "fast";
  expect_refused(j, "link.intra_node.host_ns_per_byte");
}

// Compute is each recorded op's work over the rate of its class: the replayed seconds by class are
// the plan's FLOPs and bytes over the file's rates, and the pass's compute their sum.
TEST(Model, ComputeIsEachRecordedOpOverItsClassRate) {
  const HardwareSpec hw = HardwareSpec::from_json(toy_hw(), "toy.json");
  const Config c = tiny("laga", 16, 2);
  const FormPrediction p = predict(c, hw);
  const WorkLedger w = plan_run(c, int(p.rank)).work;
  std::map<WorkClass, double> work[2];
  for (size_t i = 0; i < w.records.size(); ++i)
    work[i >= w.backward_records][w.records[i].cls] += w.records[i].work();
  const std::map<WorkClass, double> rate = {{WorkClass::matmul, 1e12},
                                            {WorkClass::attention_forward, 0.5e12},
                                            {WorkClass::attention_backward, 0.25e12},
                                            {WorkClass::elementwise, 10e9},
                                            {WorkClass::accumulate, 10e9}};
  for (int b : {0, 1}) {
    double sum = 0;
    for (const auto& [k, t] : p.by_class[b]) {
      EXPECT_DOUBLE_EQ(t.work, work[b][k]) << work_class_name(k);
      EXPECT_NEAR(t.seconds, work[b][k] / rate.at(k), 1e-18) << work_class_name(k);
      sum += t.seconds;
    }
    EXPECT_NEAR(b ? p.bwd_compute_s : p.fwd_compute_s, sum, 1e-15);
  }
  EXPECT_GT(p.by_class[0].at(WorkClass::attention_forward).work, 0);
  EXPECT_GT(p.by_class[1].at(WorkClass::elementwise).work, 0);
}

// A sparse form's kernels run at their own rates where the file has them: the sparse attention at
// sparse_attention_* (else mqa_attention_*, else the dense rate), the indexer at
// indexer_attention_* (else the dense rate), each op over its own class's rate as the rest.
TEST(Model, SparseKernelsRunAtTheirOwnRatesOrFallBack) {
  const Config c = tiny("dsa-gather", 32, 2);
  const RankPlans plans = plan_ranks(c);
  // given the file's extra rates and the rate each kernel should run at (TFLOP/s), forward and
  // backward: the predicted attention seconds of the slowest rank against its FLOPs over them
  auto check = [&](const json& extra, const double sparse_rate[2], const double indexer_rate[2]) {
    json j = toy_hw();
    j["compute"]["bf16"].update(extra);
    const FormPrediction p = predict(c, HardwareSpec::from_json(j, "toy.json"), plans);
    const WorkLedger& w = plans[size_t(p.rank)]->work;
    double sparse[2] = {0, 0}, indexer[2] = {0, 0};
    for (size_t i = 0; i < w.records.size(); ++i) {
      const WorkRecord& r = w.records[i];
      const int b = r.cls == WorkClass::attention_backward;
      if (r.cls != WorkClass::attention_forward && !b) continue;
      ASSERT_TRUE(r.kernel == AttentionKernel::sparse || r.kernel == AttentionKernel::indexer);
      (r.kernel == AttentionKernel::sparse ? sparse : indexer)[b] += r.flops;
    }
    // (the indexer's loss, of the backward class, runs in the forward pass: summed over both)
    for (int b : {0, 1}) {
      ASSERT_GT(sparse[b] * indexer[b], 0);
      const double want =
          sparse[b] / (sparse_rate[b] * 1e12) + indexer[b] / (indexer_rate[b] * 1e12);
      const WorkClass k = b ? WorkClass::attention_backward : WorkClass::attention_forward;
      double got = 0;
      for (int pass : {0, 1})
        if (auto it = p.by_class[pass].find(k); it != p.by_class[pass].end())
          got += it->second.seconds;
      EXPECT_NEAR(got, want, 1e-9 * want) << extra.dump() << " " << b;
    }
  };
  const double dense[2] = {0.5, 0.25}, mqa[2] = {0.1, 0.05}, own[2] = {0.01, 0.02},
               index_own[2] = {0.03, 0.04};
  check(json::object(), dense, dense);  // the dense rates alone
  check({{"mqa_attention_fwd_tflops", 0.1}, {"mqa_attention_bwd_tflops", 0.05}}, mqa, dense);
  check({{"mqa_attention_fwd_tflops", 0.1},
         {"mqa_attention_bwd_tflops", 0.05},
         {"sparse_attention_fwd_tflops", 0.01},
         {"sparse_attention_bwd_tflops", 0.02},
         {"indexer_attention_fwd_tflops", 0.03},
         {"indexer_attention_bwd_tflops", 0.04}},
        own, index_own);
}

// The replay plans rank 0 alone for a form whose ranks run alike (Form::ranks_alike): every rank's
// plan records the same work and the same timeline.
TEST(Model, AlikeRanksPlanTheSameWork) {
  int alike = 0;
  for (const Form* f : registered_forms()) {
    const Config c = tiny(std::string(f->name()), 32, 4);
    if (!f->ranks_alike(*c)) continue;
    ++alike;
    const WorkLedger w0 = plan_run(c, 0).work;
    for (int r = 1; r < 4; ++r) {
      const WorkLedger w = plan_run(c, r).work;
      ASSERT_EQ(w.records.size(), w0.records.size()) << f->name() << " rank " << r;
      for (size_t i = 0; i < w.records.size(); ++i) {
        EXPECT_EQ(w.records[i].flops, w0.records[i].flops) << f->name() << " " << i;
        EXPECT_EQ(w.records[i].bytes, w0.records[i].bytes) << f->name() << " " << i;
        for (int d = 0; d < 5; ++d) EXPECT_EQ(w.records[i].dims[d], w0.records[i].dims[d]);
      }
      ASSERT_EQ(w.timeline.size(), w0.timeline.size()) << f->name();
      for (size_t i = 0; i < w.timeline.size(); ++i)
        EXPECT_EQ(w.timeline[i].kind, w0.timeline[i].kind) << f->name() << " " << i;
    }
  }
  EXPECT_GE(alike, 4);  // the head-scatter forms at least
}

TEST(Model, EveryFormPredictsOverSeveralLayersAndAtOneRank) {
  const HardwareSpec hw = HardwareSpec::from_json(toy_hw(), "toy.json");
  for (const Form* f : registered_forms())
    for (int64_t P : {1, 2, 4}) {
      MlaConfig c = MlaConfig::preset("tiny");
      c.seq_len = 32, c.sp = P, c.num_layers = 3, c.batch = 2, c.form = std::string(f->name());
      const FormPrediction p = predict(Config(c), hw);  // crosses nodes at P 4 (2 per node)
      EXPECT_GT(p.total_s(), 0) << f->name();
      if (P == 1) {
        EXPECT_EQ(p.comm_s(), 0) << f->name();
      }
      // over the whole group (laga-ulysses's head-scatter groups of 2 stay in their node)
      for (const auto& t : p.collectives) {
        if (!t.record.group || t.record.group->size() == size_t(P)) {
          EXPECT_EQ(t.crosses_nodes, P > 2) << f->name();
        }
      }
    }
}

TEST(Model, AcrossNodesRingsRunAtTheSlowerLinkAndAllToAllSplitsItsTraffic) {
  const HardwareSpec hw = HardwareSpec::from_json(toy_hw(), "toy.json");
  CollectiveRecord r{CollectiveOp::all_gather, "latent", DType::bf16};
  r.tensor_bytes = 1000;
  // P 4 over 2 nodes: S = 4000, bus bytes 3000, at min(1, 2 ranks × 0.25) GB/s, latency max(1, 3)
  // µs.
  EXPECT_NEAR(collective_time(hw, r, 4).seconds, 3e-6 + 3000 / 0.5e9, 1e-15);
  EXPECT_NEAR(collective_time(hw, r, 2).seconds, 1e-6 + 1000 / 1e9, 1e-15);
  r.op = CollectiveOp::all_to_all, r.tensor_bytes = 4000;  // S = 4000: 1000 to each rank
  // 1 peer in the node (1000 B at 1 GB/s) and 2 across (2000 B at 0.25 GB/s), at once.
  EXPECT_NEAR(collective_time(hw, r, 4).seconds, 3e-6 + std::max(1000 / 1e9, 2000 / 0.25e9), 1e-15);
  r.op = CollectiveOp::all_reduce, r.tensor_bytes = 4000;
  EXPECT_NEAR(collective_time(hw, r, 2).seconds, 1e-6 + 4000 * 2 * 0.5 / 1e9, 1e-15);
  json no_inter = toy_hw();
  no_inter["link"].erase("inter_node");
  try {
    collective_time(HardwareSpec::from_json(no_inter, "one-node.json"), r, 4);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_status(), 2);
    EXPECT_NE(std::string(e.what()).find("link.inter_node"), std::string::npos) << e.what();
  }
}

TEST(Model, ASubGroupRunsOverItsOwnRanksAndCrossesNodesOnlyWhereTheyDo) {
  const HardwareSpec hw = HardwareSpec::from_json(toy_hw(), "toy.json");  // 2 ranks per node
  auto group = [](std::vector<int> ranks) {
    return std::make_shared<const std::vector<int>>(std::move(ranks));
  };
  CollectiveRecord r{CollectiveOp::all_gather, "latent", DType::bf16};
  r.tensor_bytes = 1000;
  // In a job of 8: ranks 0 and 1 share a node: S = 2000, bus bytes 1000 at the intra 1 GB/s, 1 µs.
  r.group = group({0, 1});
  EXPECT_FALSE(collective_time(hw, r, 8).crosses_nodes);
  EXPECT_NEAR(collective_time(hw, r, 8).seconds, 1e-6 + 1000 / 1e9, 1e-15);
  // Ranks 0, 2, 4, 6: four nodes, one rank in each: S = 4000, bus bytes 3000 at 1 × 0.25 GB/s, 3
  // µs.
  r.group = group({0, 2, 4, 6});
  EXPECT_TRUE(collective_time(hw, r, 8).crosses_nodes);
  EXPECT_NEAR(collective_time(hw, r, 8).seconds, 3e-6 + 3000 / 0.25e9, 1e-15);
  // Ranks 4 .. 7: two nodes, two ranks in each: as the whole group of 4 over 2 nodes.
  r.group = group({4, 5, 6, 7});
  CollectiveRecord whole = r;
  whole.group = nullptr;
  EXPECT_NEAR(collective_time(hw, r, 8).seconds, collective_time(hw, whole, 4).seconds, 1e-15);
  // A ring hop between ranks 1 and 3 crosses (one rank's own inter-node link); between 2 and 3 it
  // does not.
  r.op = CollectiveOp::send_recv;
  r.group = group({1, 3});
  EXPECT_NEAR(collective_time(hw, r, 8).seconds, 3e-6 + 1000 / 0.25e9, 1e-15);
  r.group = group({2, 3});
  EXPECT_NEAR(collective_time(hw, r, 8).seconds, 1e-6 + 1000 / 1e9, 1e-15);
}

TEST(Model, LagaWithUlyssesGathersInsideANodeAndRingsAcrossNodes) {
  const HardwareSpec hw = HardwareSpec::from_json(toy_hw(), "toy.json");  // 2 ranks per node
  MlaConfig c = MlaConfig::preset("tiny");
  // groups {0, 1} and {2, 3}, rings {0, 2}, {1, 3}
  c.seq_len = 32, c.sp = 4, c.ulysses = 2, c.form = "laga";
  const FormPrediction p = predict(Config(c), hw);
  EXPECT_EQ(p.form, "laga-ulysses (ulysses 2)");
  int hops = 0, gathers = 0;
  for (const CollectiveTime& t : p.collectives) {
    ASSERT_TRUE(t.record.group) << t.record.tensor;
    EXPECT_EQ(t.record.group->size(), 2u) << t.record.tensor;
    EXPECT_EQ(t.crosses_nodes, t.record.op == CollectiveOp::send_recv)
        << collective_name(t.record.op) << " " << t.record.tensor;
    hops += t.record.op == CollectiveOp::send_recv;
    gathers += t.record.op == CollectiveOp::all_gather;
  }
  EXPECT_GT(hops, 0);
  EXPECT_GT(gathers, 0);
}

// The skew is what one rank waited for its peers, never more than a rank's whole wait: two ranks
// that take turns arriving late (as oversubscribed threads do) each wait 10 ms once, a skew of 10
// ms, not the 20 ms a per-collective (longest − shortest) sum gives, which can exceed every rank's
// exposed communication and the step itself.
TEST(Skew, IsTheMostOneRankWaitedForItsPeers) {
  EXPECT_DOUBLE_EQ(peer_wait_skew({{0.010, 0.000}, {0.000, 0.010}}), 0.010);
  // The transfer (what the last arriver waits) is not skew: 2 ms on every collective, 5 ms late
  // once.
  EXPECT_DOUBLE_EQ(
      peer_wait_skew({{0.002, 0.007, 0.002}, {0.002, 0.002, 0.002}, {0.002, 0.002, 0.002}}), 0.005);
  // One rank: nothing to wait for.
  EXPECT_DOUBLE_EQ(peer_wait_skew({{0.003, 0.004}}), 0.0);
  EXPECT_DOUBLE_EQ(peer_wait_skew({}), 0.0);
  // A rank that recorded another count of collectives is a bug, not a figure.
  EXPECT_THROW(peer_wait_skew({{0.001, 0.002}, {0.001}}), Error);
}

TEST(LatencyBandwidthFit, RecoversKnownParameters) {
  std::vector<double> x, y, yn;
  for (double b = 1 << 12; b <= 1 << 26; b *= 4) {
    x.push_back(b);
    y.push_back(7e-6 + b / 23e9);
    yn.push_back((7e-6 + b / 23e9) * (1 + 0.01 * (x.size() % 2 ? 1 : -1)));  // ±1 % alternating
  }
  const LatencyBandwidthFit f = fit_latency_bandwidth(x, y);
  EXPECT_NEAR(f.latency_s, 7e-6, 1e-12);
  EXPECT_NEAR(f.busbw_GBps, 23, 1e-6);
  EXPECT_LT(f.max_rel_residual, 1e-9);
  const LatencyBandwidthFit g = fit_latency_bandwidth(x, yn);
  EXPECT_NEAR(g.latency_s, 7e-6, 0.05 * 7e-6);
  EXPECT_NEAR(g.busbw_GBps, 23, 0.05 * 23);
  // Pure bandwidth (no latency): a negative intercept is never returned.
  std::vector<double> z;
  for (double b : x) z.push_back(b / 10e9 * (b == x.front() ? 0.9 : 1.0));
  const LatencyBandwidthFit h = fit_latency_bandwidth(x, z);
  EXPECT_GE(h.latency_s, 0);
  EXPECT_NEAR(h.busbw_GBps, 10, 0.2);
}

TEST(LatencyBandwidthFit, ReadsABenchCommFile) {
  // Rows as laga bench-comm writes them (bytes = nccl-tests' S), P 4: t = lat + S·factor / busbw.
  const int64_t P = 4;
  const std::map<std::string, std::pair<double, double>> truth{{"all_gather", {5e-6, 12}},
                                                               {"reduce_scatter", {6e-6, 11}},
                                                               {"all_to_all", {8e-6, 9}},
                                                               {"all_reduce", {9e-6, 10}}};
  json rows = json::array();
  for (const auto& [op, lb] : truth)
    for (double S = 1 << 16; S <= 1 << 24; S *= 2) {
      const double factor = op == "all_reduce" ? 2.0 * (P - 1) / P : double(P - 1) / P;
      const double t = lb.first + S * factor / (lb.second * 1e9);
      rows.push_back({{"op", op},
                      {"dtype", "bf16"},
                      {"bytes", S},
                      {"count", 0},
                      {"time_s", t},
                      {"algbw_GBps", S / t / 1e9},
                      {"busbw_GBps", S * factor / t / 1e9},
                      {"wrong", 0}});
    }
  // a wrong result: ignored
  rows.push_back({{"op", "all_gather"}, {"bytes", 1 << 20}, {"time_s", 1.0}, {"wrong", 3}});
  const LinkSpec l =
      link_from_bench_comm({{"command", "bench-comm"}, {"sp", P}, {"rows", rows}}, "bc.json");
  for (const auto& [op, lb] : truth) {
    CollectiveOp o = CollectiveOp::barrier;
    for (CollectiveOp c : kModelledOps)
      if (collective_name(c) == op) o = c;
    EXPECT_NEAR(l.latency(o), lb.first, 1e-12) << op;
    EXPECT_NEAR(l.busbw_GBps.at(o), lb.second, 1e-6) << op;
  }
}

// bench-comm --host-cost's rows set each op's host cost (a negative reading is none); a file that
// has them for some ops only is refused.
TEST(LatencyBandwidthFit, ReadsTheHostCostOfABenchCommFile) {
  json rows = json::array();
  for (const char* op : {"all_gather", "reduce_scatter", "all_to_all", "all_reduce"})
    for (double S : {1e5, 1e6})
      rows.push_back({{"op", op}, {"bytes", S}, {"time_s", 1e-5 + S / 1e9}, {"wrong", 0}});
  json j = {{"command", "bench-comm"}, {"sp", 2}, {"rows", rows}};
  EXPECT_TRUE(link_from_bench_comm(j, "bc.json").host_ns_per_byte.empty());
  j["host_cost"] = json::array({{{"op", "all_gather"}, {"host_ns_per_byte", 12.5}},
                                {{"op", "reduce_scatter"}, {"host_ns_per_byte", -0.4}},
                                {{"op", "all_to_all"}, {"host_ns_per_byte", 20}},
                                {{"op", "all_reduce"}, {"host_ns_per_byte", 8}}});
  const LinkSpec l = link_from_bench_comm(j, "bc.json");
  EXPECT_DOUBLE_EQ(l.host_cost(CollectiveOp::all_gather), 12.5e-9);
  EXPECT_EQ(l.host_cost(CollectiveOp::reduce_scatter), 0);
  EXPECT_DOUBLE_EQ(l.host_cost(CollectiveOp::all_to_all), 20e-9);
  j["host_cost"].erase(3);
  try {
    link_from_bench_comm(j, "bc.json");
    ADD_FAILURE() << "accepted a host cost without all_reduce";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_status(), 2);
    EXPECT_NE(std::string(e.what()).find("all_reduce"), std::string::npos) << e.what();
  }
}

void expect_refused(const json& j, const std::string& field) {
  try {
    HardwareSpec::from_json(j, "bad.json");
    ADD_FAILURE() << "accepted, wanted an error naming " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_status(), 2) << e.what();
    EXPECT_NE(std::string(e.what()).find("'" + field + "'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
  }
}

TEST(HardwareSpec, RefusesAMissingOrMistypedFieldNamingIt) {
  json j = toy_hw();
  j.erase("ranks_per_node");
  expect_refused(j, "ranks_per_node");
  j = toy_hw(), j["compute"]["bf16"].erase("matmul_tflops");
  expect_refused(j, "compute.bf16.matmul_tflops");
  j = toy_hw(), j["compute"]["bf16"]["attention_bwd_tflops"] = "fast";
  expect_refused(j, "compute.bf16.attention_bwd_tflops");
  j = toy_hw(), j["compute"]["bf16"]["elementwise_GBps"] = -3;
  expect_refused(j, "compute.bf16.elementwise_GBps");
  j = toy_hw(),
  j["link"]["intra_node"]["busbw_GBps"] = {{"all_gather", 1}, {"all_to_all", 1}, {"all_reduce", 1}};
  expect_refused(j, "link.intra_node.busbw_GBps.reduce_scatter");
  j = toy_hw(), j["link"].erase("intra_node");
  expect_refused(j, "link.intra_node");
  j = toy_hw(), j["compute"]["fp16"] = j["compute"]["bf16"];
  expect_refused(j, "compute.fp16");
  j = toy_hw(), j["compute"]["bf16"]["matmul_tflop"] = 3;
  expect_refused(j, "compute.bf16.matmul_tflop");
  j = toy_hw(), j["ranks_per_node"] = 2.5;
  expect_refused(j, "ranks_per_node");
  // A file without the modelled dtype is refused when that dtype is modelled.
  MlaConfig c = MlaConfig::preset("tiny");
  c.seq_len = 16, c.dtype = DType::f32;
  try {
    predict(Config(c), HardwareSpec::from_json(toy_hw(), "bf16-only.json"));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'compute.fp32'"), std::string::npos) << e.what();
  }
}

// Every value of `given` is in `written` at the same path (written may add defaults, and spells a
// value given for every collective as one per collective).
static void expect_holds(const json& written, const json& given, const std::string& path) {
  if (!given.is_object()) {
    if (written.is_object() && given.is_number())
      for (const auto& [op, v] : written.items()) EXPECT_EQ(v, given) << path << "." << op;
    else
      EXPECT_EQ(written, given) << path;
    return;
  }
  ASSERT_TRUE(written.is_object()) << path;
  for (const auto& [k, v] : given.items()) {
    ASSERT_TRUE(written.contains(k)) << "to_json drops " << path << "." << k;
    expect_holds(written.at(k), v, path + "." + k);
  }
}

TEST(HardwareSpec, RoundTripsThroughJson) {
  const HardwareSpec a = HardwareSpec::from_json(toy_hw(), "toy.json");
  expect_holds(a.to_json(), toy_hw(), "hw");  // nothing read is dropped on the way out
  const HardwareSpec b = HardwareSpec::from_json(a.to_json(), "again.json");
  EXPECT_EQ(b.to_json(), a.to_json());
}

TEST(SeqRate, ReadsBetweenMeasuredLengthsInLogTAndHoldsTheEnds) {
  const SeqRate r{{{1024, 10.0}, {4096, 30.0}}};
  EXPECT_DOUBLE_EQ(r.at(1024), 10.0);
  EXPECT_DOUBLE_EQ(r.at(4096), 30.0);
  EXPECT_DOUBLE_EQ(r.at(2048), 20.0);  // halfway in log2: 10 + (1/2)·20
  EXPECT_NEAR(r.at(1448), 10.0 + 20.0 * std::log2(1448.0 / 1024.0) / 2.0, 1e-12);
  EXPECT_DOUBLE_EQ(r.at(64), 10.0);     // below the shortest: held, not extrapolated
  EXPECT_DOUBLE_EQ(r.at(65536), 30.0);  // beyond the longest: held
  EXPECT_DOUBLE_EQ(SeqRate::constant(7.0).at(123), 7.0);
  EXPECT_EQ(SeqRate::constant(7.0).to_json(), json(7.0));
  EXPECT_EQ(r.to_json(), json::parse(R"({"1024": 10.0, "4096": 30.0})"));
}

TEST(Model, ReadsEachRateAtTheLengthOfItsRunOrKernelCall) {
  // Rates given by T: matmul and the streams at the run's T, attention at its call's own length
  // (T for laga; a chunk pair's for ring-latent). Each op's time must be its work over the rate
  // read there.
  json j = toy_hw();
  j["compute"]["bf16"]["matmul_tflops"] = {{"16", 1.0}, {"64", 4.0}};
  j["compute"]["bf16"]["attention_fwd_tflops"] = {{"8", 0.1}, {"32", 0.4}};
  j["compute"]["bf16"]["elementwise_GBps"] = {{"32", 20.0}};
  j["compute"]["bf16"]["accumulate_GBps"] = {{"16", 30.0}, {"64", 90.0}};
  const HardwareSpec hw = HardwareSpec::from_json(j, "by-seq.json");
  const ComputeSpec& cs = hw.compute_for(DType::bf16);
  for (const char* form : {"laga", "ring-latent"}) {
    const int64_t T = 32, P = 2;
    const Config c = tiny(form, T, P);
    const WorkLedger w = plan_run(c).work;
    std::set<int64_t> calls;
    for (const WorkRecord& r : w.records) {
      double want = 0;
      switch (r.cls) {
        case WorkClass::matmul:
          want = 2.5e12;  // 1 at 16, 4 at 64: halfway in log2 at 32
          break;
        case WorkClass::elementwise:
          want = 20e9;
          break;
        case WorkClass::accumulate:
          want = 60e9;  // halfway in log2 between 16 and 64
          break;
        case WorkClass::attention_forward:
          calls.insert(r.dims[0]);
          want = cs.attention_tflops.at("attention_fwd_tflops").at(r.dims[0]) * 1e12;
          break;
        case WorkClass::attention_backward:
          want = 0.25e12;  // a plain number
          break;
      }
      EXPECT_DOUBLE_EQ(work_seconds(r, *c, cs), r.work() / want) << form << " " << r.op;
    }
    // laga's calls span the sequence; ring-latent's are chunk pairs, shorter
    EXPECT_EQ(std::string(form) == "laga", calls == std::set<int64_t>{T}) << form;
    EXPECT_LT(*calls.begin(), std::string(form) == "laga" ? T + 1 : T) << form;
  }
  EXPECT_DOUBLE_EQ(cs.attention_tflops.at("attention_fwd_tflops").at(16), 0.25);
  EXPECT_DOUBLE_EQ(cs.matmul_tflops.at(32), 2.5);
}

// The accumulate class (merges, fp32 accumulators, fills, conversions) is timed at the file's
// accumulate rate; a file without one times it at its elementwise rate.
TEST(Model, TimesTheAccumulateClassAtItsOwnRate) {
  for (bool given : {false, true}) {
    json j = toy_hw();
    if (given) j["compute"]["bf16"]["accumulate_GBps"] = 40;
    const HardwareSpec hw = HardwareSpec::from_json(j, "toy.json");
    EXPECT_EQ(hw.to_json()["compute"]["bf16"].contains("accumulate_GBps"), given);
    for (const char* form : {"ring-kv", "ring-latent", "laga", "explicit"}) {
      const FormPrediction p = predict(tiny(form, 32, 2), hw);
      for (int b : {0, 1}) {
        const ClassTime& t = p.by_class[b].at(WorkClass::accumulate);
        EXPECT_NEAR(t.seconds, t.work / ((given ? 40 : 10) * 1e9), 1e-18) << form;
      }
      EXPECT_GT(p.by_class[1].at(WorkClass::accumulate).work, 0) << form;
    }
  }
  json j = toy_hw();
  j["compute"]["bf16"]["accumulate_GBps"] = 0;
  expect_refused(j, "compute.bf16.accumulate_GBps");
}

// laga-fused's up-projection runs inside its kernel: its record counts the attention and those
// products together, timed at the file's laga_fused rate when it has one, else at the fused dense
// attention rate, never at the matmul rate; bench's op-class timer sees it as attention, and so
// does the comparison.
TEST(Model, LagaFusedTimesItsUpProjectionWithItsKernel) {
  const Config c = tiny("laga-fused", 32, 2);
  const WorkLedger w = plan_run(c).work;
  const MlaConfig& m = *c;
  const double up = 2.0 * double(m.seq_len * m.batch) * double(m.kv_lora_rank) *
                    double(m.num_attention_heads / m.sp) *
                    double(m.qk_nope_head_dim + m.v_head_dim);
  const double fa = attention_forward_flops(m.batch, m.num_attention_heads / m.sp, m.seq_len,
                                            m.qk_head_dim(), m.v_head_dim, true);
  for (bool given : {false, true}) {
    json j = toy_hw();
    if (given) {
      j["compute"]["bf16"]["laga_fused_attention_fwd_tflops"] = 0.2;
      j["compute"]["bf16"]["laga_fused_attention_bwd_tflops"] = 0.1;
    }
    const HardwareSpec hw = HardwareSpec::from_json(j, "toy.json");
    const double fwd_rate = (given ? 0.2 : 0.5) * 1e12, bwd_rate = (given ? 0.1 : 0.25) * 1e12;
    int kernels = 0;
    for (const WorkRecord& r : w.records)
      if (r.kernel == AttentionKernel::latent) {
        const bool bwd = r.cls == WorkClass::attention_backward;
        EXPECT_DOUBLE_EQ(r.flops, bwd ? 2.5 * fa + 3 * up : fa + up);
        EXPECT_DOUBLE_EQ(work_seconds(r, m, hw.compute_for(DType::bf16)),
                         r.flops / (bwd ? bwd_rate : fwd_rate));
        ++kernels;
      }
    EXPECT_EQ(kernels, 2);
    BenchRowComparison row;
    row.predicted = predict(c, hw);
    const auto by = row.predicted_by_class();
    EXPECT_DOUBLE_EQ(by.at("attention_fwd"),
                     row.predicted.by_class[0].at(WorkClass::attention_forward).seconds);
    EXPECT_DOUBLE_EQ(by.at("attention_bwd"),
                     row.predicted.by_class[1].at(WorkClass::attention_backward).seconds);
  }
}

// A calibration measurement is the median of its timed repeats, the warm-up (first) left out, as
// bench's rows are medians: one slow repeat of three moves it not at all, the fastest is not taken.
TEST(Calibration, AMeasurementIsTheMedianOfItsTimedRepeats) {
  EXPECT_DOUBLE_EQ(median_after_warmup({100, 3, 1, 2}), 2);  // warm-up 100 left out
  // one slow repeat: the median holds
  EXPECT_DOUBLE_EQ(median_after_warmup({0.1, 9, 1, 1.2}), 1.2);
  EXPECT_DOUBLE_EQ(median_after_warmup({100, 4, 2}), 3);  // two repeats: their mean
  EXPECT_DOUBLE_EQ(median_after_warmup({100, 5}), 5);
  // The calibration's rounds keep the median of an entry's readings: two agreeing, their mean; a
  // third read where two disagree outvotes the slow one.
  EXPECT_DOUBLE_EQ(median({2.0, 2.2}), 2.1);
  EXPECT_DOUBLE_EQ(median({2.0, 3.5, 2.1}), 2.1);
  EXPECT_DOUBLE_EQ(median({7.0}), 7.0);
}

TEST(HardwareSpec, RefusesARateByTWithABadLengthOrValueNamingIt) {
  json j = toy_hw();
  j["compute"]["bf16"]["attention_fwd_tflops"] = {{"2k", 0.5}};
  expect_refused(j, "compute.bf16.attention_fwd_tflops.2k");
  j = toy_hw(), j["compute"]["bf16"]["matmul_tflops"] = {{"0", 1.0}};
  expect_refused(j, "compute.bf16.matmul_tflops.0");
  j = toy_hw(), j["compute"]["bf16"]["matmul_tflops"] = {{"2048", -1.0}};
  expect_refused(j, "compute.bf16.matmul_tflops.2048");
  j = toy_hw(), j["compute"]["bf16"]["elementwise_GBps"] = json::object();
  expect_refused(j, "compute.bf16.elementwise_GBps");
  j = toy_hw(), j["compute"]["bf16"]["matmul_tflops"] = {{"2048", 1.0}, {"8192", 2.0}};
  const HardwareSpec a = HardwareSpec::from_json(j, "ok.json");
  EXPECT_EQ(HardwareSpec::from_json(a.to_json(), "again.json").to_json(), a.to_json());
}

TEST(Model, TheDocsHardwareFilesPredictEveryForm) {
  for (const char* file : {"ascend-910b.json", "h100-class.json"}) {
    const HardwareSpec hw = HardwareSpec::load(std::string(LAGA_SOURCE_DIR) + "/docs/hw/" + file);
    for (int64_t P : {8, 16})
      for (const Form* f : registered_forms()) {
        // the sparse forms on the model that has their indexer
        MlaConfig c = MlaConfig::preset(f->sparse() ? "deepseek-v3.2" : "deepseek-v3");
        c.seq_len = 4096, c.sp = P, c.form = std::string(f->name());
        const FormPrediction p = predict(Config(c), hw);
        EXPECT_GT(p.total_s(), 0);
        EXPECT_GT(p.comm_s(), 0);
      }
  }
}

TEST(Model, ComparesWithABenchFileRowByRow) {
  const HardwareSpec hw = HardwareSpec::from_json(toy_hw(), "toy.json");
  MlaConfig c = MlaConfig::preset("tiny");
  c.seq_len = 16, c.sp = 2;
  json rows = json::array();
  for (const char* form : {"explicit", "laga"}) {
    c.form = form;
    const FormPrediction p = predict(Config(c), hw);
    rows.push_back({{"variant", form},
                    {"seq", 32},
                    {"sp", 2},
                    {"fwd_s", 1.0},
                    {"bwd_s", 2.0},
                    {"comm_s", 0.5},
                    {"total_s", 3.0}});
  }
  const auto cmp = compare_with_bench(
      {{"command", "bench"}, {"config", c.to_json()}, {"rows", rows}}, "b.json", hw);
  ASSERT_EQ(cmp.size(), 2u);
  c.seq_len = 32, c.form = "laga";
  EXPECT_DOUBLE_EQ(cmp[1].predicted.total_s(), predict(Config(c), hw).total_s());
  EXPECT_DOUBLE_EQ(cmp[1].rel_error_total(), (cmp[1].predicted.total_s() - 3.0) / 3.0);
  EXPECT_FALSE(cmp[1].measured_skew.has_value());  // a file written before bench measured the skew
  EXPECT_FALSE(cmp[1].rel_error_without_skew().has_value());
  // The ranks' skew: the second error is against the total less it; the judged error is unchanged.
  rows[1]["comm_skew_s"] = 0.4;
  const auto skewed = compare_with_bench(
      {{"command", "bench"}, {"config", c.to_json()}, {"rows", rows}}, "b.json", hw);
  ASSERT_TRUE(skewed[1].measured_skew.has_value());
  EXPECT_DOUBLE_EQ(*skewed[1].measured_skew, 0.4);
  EXPECT_DOUBLE_EQ(skewed[1].rel_error_total(), cmp[1].rel_error_total());
  EXPECT_DOUBLE_EQ(*skewed[1].rel_error_without_skew(),
                   (skewed[1].predicted.total_s() - 2.6) / 2.6);
  for (const json& bad : {json(-0.1), json(3.0), json("0.4")}) {
    rows[1]["comm_skew_s"] = bad;
    try {
      compare_with_bench({{"config", c.to_json()}, {"rows", rows}}, "b.json", hw);
      ADD_FAILURE() << "comm_skew_s " << bad.dump() << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rows[1].comm_skew_s"), std::string::npos) << e.what();
    }
  }
  rows[1].erase("comm_skew_s");
  rows[0].erase("total_s");
  EXPECT_THROW(compare_with_bench({{"config", c.to_json()}, {"rows", rows}}, "b.json", hw), Error);
}

}  // namespace
}  // namespace laga
