// Claims about Communicator::split (sub-communicators, MPI_Comm_split's groups): every rank of a
// color gets the group of that color ordered by key, whose collectives move only among its ranks;
// its records land in the parent's ledger with wire bytes of the sub-group's size; the stand-in and
// meta backends give a communicator of the sub-group's size and rank; and a rank that throws in one
// sub-group brings every rank of the parent down (no hang), including ranks blocked in another
// sub-group.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_testing.hpp"
#include "laga/comm/meta.hpp"
#include "laga/comm/stand_in.hpp"
#include "laga/core/error.hpp"

namespace laga {
namespace {

using testing::within_seconds;

// Groups of 2 consecutive ranks (color r / 2), and the strided "rings" across them (color r % 2).
SplitKey blocks_of_two(int r) { return {r / 2, r % 2}; }
SplitKey across(int r) { return {r % 2, r / 2}; }

TEST(CommSplit, GroupsHoldTheRanksOfTheirColorInKeyOrderAndMoveDataOnlyAmongThem) {
  within_seconds(30, [] {
    run_threads(6, [](Communicator& c) {
      auto g = c.split(blocks_of_two);
      auto ring = c.split(across);
      ASSERT_EQ(g->size(), 2);
      EXPECT_EQ(g->rank(), c.rank() % 2);
      ASSERT_EQ(ring->size(), 3);
      EXPECT_EQ(ring->rank(), c.rank() / 2);
      // all_gather in the group: the two ranks of the block, in order
      const float mine = float(c.rank());
      float both[2];
      g->all_gather(&mine, both, 1, DType::f32, "g");
      EXPECT_EQ(both[0], float(c.rank() / 2 * 2));
      EXPECT_EQ(both[1], float(c.rank() / 2 * 2 + 1));
      // send_recv on the ring: from the same position of the previous block
      float got = -1;
      ring->send_recv(&mine, &got, 1, DType::f32, "ring");
      EXPECT_EQ(got, float((c.rank() + 6 - 2) % 6));
      // reversed keys reverse the order
      auto rev = c.split([](int r) { return SplitKey{0, -r}; });
      EXPECT_EQ(rev->rank(), 5 - c.rank());
    });
  });
}

TEST(CommSplit, SubGroupRecordsLandInTheParentLedgerWithTheSubGroupsWireBytes) {
  run_threads(4, [](Communicator& c) {
    auto g = c.split(blocks_of_two);
    std::vector<float> in(8, 1.0f), out(16);
    c.all_gather(in.data(), out.data(), 2, DType::f32, "world");
    g->all_gather(in.data(), out.data(), 8, DType::f32, "group");
    g->send_recv(in.data(), out.data(), 8, DType::f32, "hop");
    const auto& rec = c.ledger().records();
    ASSERT_EQ(rec.size(), 3u);
    EXPECT_EQ(&g->ledger(), &c.ledger());
    EXPECT_EQ(rec[0].tensor, "world");
    EXPECT_EQ(rec[0].wire_bytes, 3 * 2 * 4);  // (P − 1) · shard, P = 4
    EXPECT_EQ(rec[1].tensor, "group");
    EXPECT_EQ(rec[1].wire_bytes, 1 * 8 * 4);  // (Pu − 1) · shard, Pu = 2
    EXPECT_EQ(rec[2].wire_bytes, 8 * 4);
    EXPECT_GT(rec[1].completed_s, 0);
  });
}

TEST(CommSplit, StandInAndMetaGiveTheSubGroupsSizeAndRank) {
  for (int r : {0, 3, 5}) {
    StandInCommunicator s(r, 6);
    MetaCommunicator m(r, 6);
    for (Communicator* c : {static_cast<Communicator*>(&s), static_cast<Communicator*>(&m)}) {
      auto g = c->split(blocks_of_two);
      auto ring = c->split(across);
      EXPECT_EQ(g->size(), 2);
      EXPECT_EQ(g->rank(), r % 2);
      EXPECT_EQ(ring->size(), 3);
      EXPECT_EQ(ring->rank(), r / 2);
      EXPECT_EQ(g->backend(), c->backend());
      float in[4] = {1, 2, 3, 4}, out[8];
      g->all_gather(c->moves_data() ? in : nullptr, c->moves_data() ? out : nullptr, 4, DType::f32,
                    "latent");
      ASSERT_EQ(c->ledger().records().size(), 1u);
      EXPECT_EQ(c->ledger().records()[0].wire_bytes, 16);
    }
  }
}

// Rank 5 throws while rank 0..4 sit in collectives of their own sub-groups (rank 4 in the same
// block, ranks 0..3 in other blocks or on a ring): everyone leaves with an error and run_threads
// rethrows rank 5's.
TEST(CommSplit, AThrowInOneSubGroupEndsEveryRankWithoutHang) {
  within_seconds(20, [] {
    try {
      run_threads(6, [](Communicator& c) {
        auto g = c.split(blocks_of_two);
        auto ring = c.split(across);
        float a[4] = {}, b[12] = {};
        if (c.rank() == 5) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          throw Error(ErrorKind::failure, __FILE__, __LINE__, "injected fault in a sub-group");
        }
        // waits for rank 5
        if (c.rank() % 2 == 1) ring->all_gather(a, b, 4, DType::f32, "latent_g");
        // ranks 0, 2 complete; rank 4 waits for 5
        else
          g->all_gather(a, b, 4, DType::f32, "latent");
        c.barrier();  // then the world waits for rank 5
      });
      ADD_FAILURE() << "run_threads returned without an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("injected fault in a sub-group"), std::string::npos)
          << e.what();
    }
  });
}

TEST(CommSplit, AbortOnASubGroupWakesTheParent) {
  within_seconds(20, [] {
    EXPECT_THROW(run_threads(4,
                             [](Communicator& c) {
                               auto g = c.split(blocks_of_two);
                               if (c.rank() == 3) g->abort("sub-group abort");
                               c.barrier();
                             }),
                 Error);
  });
}

}  // namespace
}  // namespace laga
