// --overlap on|off (docs/design.md §2.6, docs/architecture.md §3): the forms' collectives left in
// flight behind the query path and the rest of the work that does not need them, or each waited
// where it is issued. Claims: the results are bitwise the same either way (y, dx and every synced
// weight gradient, every registered form, P 1, 2, 4, both kernels, both dtypes); with overlap on
// laga's latent all-gather is issued before the query path's all-to-all and completed after it was
// issued, with time hidden, and its dlatent reduce-scatter stays in flight across the dq all-to-all
// and the query path's backward (explicit likewise with k, v and dk, dv); with overlap off no two
// collectives are ever in flight at once. Timings are never compared with each other here: only the
// order of events on one rank's clock.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "laga/driver/run.hpp"
#include "laga/mla/form.hpp"
#include "verify/compare.hpp"
#include "verify/forms.hpp"

using namespace laga;

namespace {

using verify::run_tensors;

MlaConfig tiny(const std::string& form, int64_t P, bool overlap) {
  MlaConfig c = MlaConfig::preset("tiny");
  c.form = form, c.sp = P, c.overlap = overlap;
  c.seq_len = 32, c.num_layers = 2, c.batch = 2;
  return c;
}

// One rank's attention collectives of layer 0 (the first of each name), forward and backward.
struct Layer0 {
  std::vector<CollectiveRecord> all;  // every attention record, issue order
  const CollectiveRecord& operator[](const std::string& tensor) const {
    auto it = std::find_if(all.begin(), all.end(),
                           [&](const CollectiveRecord& r) { return r.tensor == tensor; });
    if (it == all.end()) throw std::runtime_error("no collective '" + tensor + "' in the ledger");
    return *it;
  }
  size_t index(const std::string& tensor) const {
    auto it = std::find_if(all.begin(), all.end(),
                           [&](const CollectiveRecord& r) { return r.tensor == tensor; });
    return size_t(it - all.begin());
  }
};

std::vector<Layer0> ledgers(const MlaConfig& c) {
  std::vector<Layer0> out;
  for (const RankResult& r : run_group(c, RunOptions{})) {
    Layer0 l;
    for (const auto& rec : r.collectives)
      if (!is_grad_sync(rec)) l.all.push_back(rec);
    out.push_back(std::move(l));
  }
  return out;
}

double hidden(const CollectiveRecord& r) { return r.seconds - r.wait_s; }

}  // namespace

TEST(Overlap, ResultsAreBitwiseTheSameWithAndWithoutOverlapForEveryFormAndP) {
  for (const Form* f : registered_forms())
    for (DType dt : {DType::f32, DType::bf16})
      for (Kernel kernel : {Kernel::fused, Kernel::eager})
        for (int64_t P : {1, 2, 4}) {
          MlaConfig c = tiny(std::string(f->name()), P, false);
          c.dtype = dt, c.kernel = kernel;
          const std::string name =
              fmt::format("{} {} {} P{}", f->name(), dtype_name(dt), kernel_name(kernel), P);
          const verify::Tensors off = run_tensors(c);
          c.overlap = true;
          const verify::Tensors on = run_tensors(c);
          std::string where;
          EXPECT_TRUE(verify::bitwise_equal(on, off, &where)) << name << ": " << where;
        }
}

TEST(Overlap, WithoutOverlapNoTwoCollectivesAreEverInFlightAtOnce) {
  for (const Form* f : registered_forms())
    for (const Layer0& l : ledgers(tiny(std::string(f->name()), 4, false)))
      for (size_t i = 0; i + 1 < l.all.size(); ++i) {
        EXPECT_LE(l.all[i].completed_s, l.all[i + 1].issued_s)
            << f->name() << ": '" << l.all[i].tensor << "' still in flight when '"
            << l.all[i + 1].tensor << "' was issued";
        EXPECT_GE(l.all[i].completed_s, l.all[i].issued_s);
      }
}

TEST(Overlap, LagaIssuesTheLatentAllGatherBeforeTheQueryPathAndWaitsForItAfter) {
  for (const std::string form : {"laga", "laga-recompute", "absorbed-shared", "absorbed-expanded"})
    for (const Layer0& l : ledgers(tiny(form, 2, true))) {
      SCOPED_TRACE(form);
      const CollectiveRecord &latent = l["latent"], &q = l["q"];
      EXPECT_EQ(latent.op, CollectiveOp::all_gather);
      EXPECT_LT(l.index("latent"), l.index("q")) << "the all-gather is issued first";
      EXPECT_LT(latent.issued_s, q.issued_s) << "the query path ran between the two issues";
      EXPECT_GT(latent.completed_s, q.issued_s)
          << "the all-gather was still in flight when q's all-to-all was issued";
      EXPECT_GT(hidden(latent), 0) << "the query path ran while the all-gather was in flight";
    }
}

TEST(Overlap, LagaKeepsTheDlatentReduceScatterInFlightAcrossTheQueryPathsBackward) {
  for (const std::string form : {"laga", "laga-recompute", "absorbed-shared", "absorbed-expanded"})
    for (const Layer0& l : ledgers(tiny(form, 2, true))) {
      SCOPED_TRACE(form);
      const CollectiveRecord &dlatent = l["dlatent"], &dq = l["dq"];
      EXPECT_EQ(dlatent.op, CollectiveOp::reduce_scatter);
      // laga issues dq's all-to-all first (behind G2's backward), absorbed the reduce-scatter first
      // (behind A2's backward); either way the reduce-scatter completes after dq's all-to-all, and
      // the query path's backward ran while it was in flight.
      EXPECT_GT(dlatent.completed_s, dq.completed_s);
      EXPECT_GT(hidden(dlatent), 0);
      if (form.rfind("laga", 0) == 0)
        EXPECT_LT(l.index("dq"), l.index("dlatent"));
      else
        EXPECT_LT(l.index("dlatent"), l.index("dq"));
    }
}

TEST(Overlap, ExplicitSendsKAndVBehindTheQueryPathAndDkDvBehindItsBackward) {
  for (const std::string form : {"explicit", "explicit-recompute"})
    for (const Layer0& l : ledgers(tiny(form, 2, true))) {
      SCOPED_TRACE(form);
      const CollectiveRecord &k = l["k"], &v = l["v"], &q = l["q"];
      EXPECT_LT(l.index("k"), l.index("q"));
      EXPECT_LT(l.index("v"), l.index("q"));
      EXPECT_GT(k.completed_s, q.issued_s);
      EXPECT_GT(v.completed_s, q.issued_s);
      EXPECT_GT(hidden(k), 0);
      const CollectiveRecord &dq = l["dq"], &dk = l["dk"], &dv = l["dv"];
      EXPECT_GT(dk.completed_s, dq.completed_s)
          << "dk's all-to-all was in flight across the query path's backward";
      EXPECT_GT(dv.completed_s, dq.completed_s);
      EXPECT_GT(hidden(dk), 0);
    }
}

// The sparse forms with overlap on: the latent's and the index key's all-gathers are both issued
// before the query path and complete with time hidden behind it; dsa-regather's second gather of
// the latent, in backward, is issued before dlatent's reduce-scatter and runs behind S6's and the
// indexer's projections' backward.
TEST(Overlap, SparseFormsGatherBehindTheQueryPathAndRegatherBehindTheirBackward) {
  for (const std::string form : {"dsa-gather", "dsa-regather"})
    for (const Layer0& l : ledgers(tiny(form, 2, true))) {
      SCOPED_TRACE(form);
      ASSERT_GE(l.all.size(), 4u);
      const CollectiveRecord &latent = l.all[0], &key = l.all[1];
      EXPECT_EQ(latent.tensor, "latent");
      EXPECT_EQ(key.tensor, "index_key");
      EXPECT_LT(latent.issued_s, key.issued_s);
      EXPECT_GT(latent.completed_s, key.issued_s) << "both in flight at once";
      EXPECT_GT(hidden(latent), 0);
      EXPECT_GT(hidden(key), 0) << "the query path ran while the index key's gather was in flight";
      if (form != "dsa-regather") continue;
      // layer 0's second "latent" record: the one gathered again in backward
      std::vector<const CollectiveRecord*> latents;
      for (const auto& r : l.all)
        if (r.tensor == "latent") latents.push_back(&r);
      ASSERT_EQ(latents.size(), 4u) << "two layers, each gathered twice";
      const CollectiveRecord* again = latents[2];  // backward runs the last layer first
      EXPECT_GT(hidden(*again), 0) << "S6's and S3's backward ran behind the second gather";
    }
}
