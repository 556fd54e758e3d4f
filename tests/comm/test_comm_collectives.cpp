// Claims about what the collectives compute (threads backend; tests/cli/comm_mpi.sh shows the MPI
// backend gives bitwise the same bytes) and what the Ledger records. Every claim is checked for
// P = 1, 2, 3, 4, 8, fp32 and bf16, and sizes that P does not divide. Not here: failure handling
// (test_comm_failures.cpp).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "comm/comm_testing.hpp"
#include "laga/comm/communicator.hpp"

namespace laga {
namespace {

using testing::Buffer;
using testing::integer_buffer;
using testing::normal_buffer;
using testing::ordered_sum;
using testing::rank_counts;

const DType kDtypes[] = {DType::f32, DType::bf16};
const int64_t kSizes[] = {0, 1, 7, 33};

std::string where(int P, DType t, int64_t n) {
  return fmt::format("P={} {} n={}", P, dtype_name(t), n);
}

TEST(Comm, ThreadsAllGatherConcatenatesRankChunks) {
  for (int P : rank_counts())
    for (DType t : kDtypes)
      for (int64_t n : kSizes)
        run_threads(P, [&](Communicator& c) {
          const Buffer in = normal_buffer(t, n, 1, c.rank());
          Buffer out(t, P * n);
          c.all_gather(in.data(), out.data(), n, t, "latent");
          for (int q = 0; q < P; ++q)
            EXPECT_TRUE(out.slice(q * n, n).bitwise_equal(normal_buffer(t, n, 1, q)))
                << where(P, t, n) << " rank " << c.rank() << " chunk " << q;
        });
}

TEST(Comm, AllGatherInPlaceEqualsOutOfPlace) {
  for (int P : rank_counts())
    for (DType t : kDtypes)
      run_threads(P, [&](Communicator& c) {
        const int64_t n = 5;
        const Buffer in = normal_buffer(t, n, 2, c.rank());
        Buffer out(t, P * n), in_place(t, P * n);
        std::memcpy(static_cast<char*>(in_place.data()) + c.rank() * n * dtype_size(t), in.data(),
                    size_t(n * dtype_size(t)));
        c.all_gather(in.data(), out.data(), n, t, "latent");
        c.all_gather(static_cast<char*>(in_place.data()) + c.rank() * n * dtype_size(t),
                     in_place.data(), n, t, "latent");
        EXPECT_TRUE(in_place.bitwise_equal(out)) << where(P, t, n);
      });
}

// ⟨AG(x), y⟩ summed over ranks equals ⟨x, RS(y)⟩ summed over ranks. With small integers every sum
// is exact in both dtypes, so the adjoint identity holds exactly.
TEST(Comm, ReduceScatterIsAllGathersAdjoint) {
  for (int P : rank_counts())
    for (DType t : kDtypes)
      for (int64_t n : kSizes) {
        std::vector<double> lhs(static_cast<size_t>(P)), rhs(static_cast<size_t>(P));
        run_threads(P, [&](Communicator& c) {
          const int r = c.rank();
          const Buffer x = integer_buffer(t, n, 3, r), y = integer_buffer(t, P * n, 4, r);
          Buffer gx(t, P * n), sy(t, n);
          c.all_gather(x.data(), gx.data(), n, t, "latent");
          c.reduce_scatter(y.data(), sy.data(), n, t, "dlatent");
          for (int64_t i = 0; i < P * n; ++i) lhs[size_t(r)] += double(gx.get(i)) * y.get(i);
          for (int64_t i = 0; i < n; ++i) rhs[size_t(r)] += double(x.get(i)) * sy.get(i);
        });
        double a = 0, b = 0;
        for (int r = 0; r < P; ++r) a += lhs[size_t(r)], b += rhs[size_t(r)];
        EXPECT_EQ(a, b) << where(P, t, n);
      }
}

TEST(Comm, ReduceScatterSumsInRankOrderInFp32AndRoundsOnce) {
  for (int P : rank_counts())
    for (DType t : kDtypes)
      for (int64_t n : {int64_t(1), int64_t(7), int64_t(3000)})
        run_threads(P, [&](Communicator& c) {
          std::vector<Buffer> mine;  // what every rank sends to this rank, in rank order
          for (int q = 0; q < P; ++q)
            mine.push_back(normal_buffer(t, P * n, 5, q).slice(c.rank() * n, n));
          const Buffer in = normal_buffer(t, P * n, 5, c.rank());
          Buffer out(t, n);
          c.reduce_scatter(in.data(), out.data(), n, t, "dlatent");
          EXPECT_TRUE(out.bitwise_equal(ordered_sum(mine)))
              << where(P, t, n) << " rank " << c.rank();
        });
}

// 1 + 2⁻⁸ + 2⁻⁸ in bf16: rounded once it is 1 + 2⁻⁷; rounded after each addition (a tie, to even)
// it would stay 1.
TEST(Comm, Bf16ReductionRoundsOnceNotPerAddition) {
  run_threads(3, [&](Communicator& c) {
    Buffer buf(DType::bf16, 1);
    buf.set(0, c.rank() == 0 ? 1.0f : 0.00390625f);
    c.all_reduce(buf.data(), 1, DType::bf16, "grad_sync");
    EXPECT_EQ(buf.get(0), 1.0078125f);
  });
}

TEST(Comm, AllReduceEqualsOrderedSumForSizesNotDividedByP) {
  for (int P : rank_counts())
    for (DType t : kDtypes)
      for (int64_t n :
           {int64_t(0), int64_t(1), int64_t(5), int64_t(13), int64_t(64), int64_t(4099)}) {
        std::vector<Buffer> parts;
        for (int q = 0; q < P; ++q) parts.push_back(normal_buffer(t, n, 6, q));
        const Buffer expected = ordered_sum(parts);
        run_threads(P, [&](Communicator& c) {
          Buffer buf = normal_buffer(t, n, 6, c.rank());
          c.all_reduce(buf.data(), n, t, "grad_sync");
          EXPECT_TRUE(buf.bitwise_equal(expected)) << where(P, t, n) << " rank " << c.rank();
        });
      }
}

// out_r chunk j = in_j chunk r (a block transpose), so applying it twice gives back the input.
TEST(Comm, AllToAllIsItsOwnInverseUpToTranspose) {
  for (int P : rank_counts())
    for (DType t : kDtypes)
      for (int64_t n : kSizes)
        run_threads(P, [&](Communicator& c) {
          const int r = c.rank();
          const Buffer in = normal_buffer(t, P * n, 7, r);
          Buffer once(t, P * n), twice(t, P * n);
          c.all_to_all(in.data(), once.data(), n, t, "q");
          for (int j = 0; j < P; ++j)
            EXPECT_TRUE(
                once.slice(j * n, n).bitwise_equal(normal_buffer(t, P * n, 7, j).slice(r * n, n)))
                << where(P, t, n) << " rank " << r << " chunk " << j;
          c.all_to_all(once.data(), twice.data(), n, t, "o");
          EXPECT_TRUE(twice.bitwise_equal(in)) << where(P, t, n) << " rank " << r;
        });
}

TEST(Comm, BroadcastCopiesTheRootsBytes) {
  for (int P : rank_counts())
    run_threads(P, [&](Communicator& c) {
      for (int root = 0; root < P; ++root) {
        std::vector<unsigned char> buf(13);
        for (size_t i = 0; i < buf.size(); ++i) buf[i] = (unsigned char)(c.rank() * 31 + int(i));
        c.broadcast(buf.data(), int64_t(buf.size()), root, "config");
        for (size_t i = 0; i < buf.size(); ++i)
          EXPECT_EQ(buf[i], (unsigned char)(root * 31 + int(i)));
      }
    });
}

TEST(Comm, SendRecvShiftsEveryRanksBufferOneStepAroundTheRing) {
  for (int P : rank_counts())
    for (DType t : kDtypes)
      for (int64_t n : kSizes)
        run_threads(P, [&](Communicator& c) {
          const Buffer in = normal_buffer(t, n, 3, c.rank());
          Buffer out(t, n);
          c.send_recv(in.data(), out.data(), n, t, "k");
          EXPECT_TRUE(out.bitwise_equal(normal_buffer(t, n, 3, (c.rank() + P - 1) % P)))
              << where(P, t, n) << " rank " << c.rank();
        });
}

// P hops bring every rank's buffer back to it: the ring visits every rank once.
TEST(Comm, PSendRecvHopsBringEveryBufferBackHome) {
  for (int P : rank_counts())
    run_threads(P, [&](Communicator& c) {
      const Buffer mine = normal_buffer(DType::bf16, 33, 4, c.rank());
      Buffer a = mine, b(DType::bf16, 33);
      for (int hop = 0; hop < P; ++hop) {
        c.send_recv(a.data(), b.data(), 33, DType::bf16, "kv");
        std::swap(a, b);
        EXPECT_TRUE(
            a.bitwise_equal(normal_buffer(DType::bf16, 33, 4, (c.rank() + 2 * P - hop - 1) % P)))
            << "P=" << P << " hop " << hop;
      }
      EXPECT_TRUE(a.bitwise_equal(mine));
    });
}

// Hundreds of back-to-back collectives of different kinds: the two barriers keep ranks in step.
TEST(Comm, ManyCollectivesInARowStayInStep) {
  run_threads(8, [&](Communicator& c) {
    const int P = c.size();
    for (int it = 0; it < 300; ++it) {
      const int64_t n = 1 + it % 5;
      std::vector<int32_t> in(size_t(P * n), c.rank() * 1000 + it), out(size_t(P * n));
      if (it % 3 == 0) {
        c.all_gather(in.data(), out.data(), n, DType::f32, "latent");
        for (int q = 0; q < P; ++q) EXPECT_EQ(out[size_t(q * n)], q * 1000 + it);
      } else if (it % 3 == 1) {
        c.all_to_all(in.data(), out.data(), n, DType::f32, "q");
        for (int q = 0; q < P; ++q) EXPECT_EQ(out[size_t(q * n)], q * 1000 + it);
      } else {
        c.barrier();
      }
    }
  });
}

// The numbers follow the header's formulas, worked out here by hand for P = 4, n = 10:
//   all_gather  bf16: shard 10·2 = 20 B; wire (4−1)·20 = 60 B
//   all_to_all  bf16: input 4·10·2 = 80 B; wire (4−1)/4·80 = 60 B
//   reduce_scatter fp32: shard 10·4 = 40 B; wire 3·40 = 120 B
//   all_reduce  fp32, n = 10: 40 B; wire ⌊2·3·40/4⌋ = 60 B
//   broadcast 13 B from root 1: 13 B; wire 3·13 = 39 B on rank 1, 0 elsewhere
//   barrier: 0, 0
//   send_recv bf16, n = 10: 20 B each way; wire 20 B
TEST(Comm, LedgerCountsTensorAndWireBytes) {
  run_threads(4, [&](Communicator& c) {
    std::vector<char> a(160), b(160);
    c.all_gather(a.data(), b.data(), 10, DType::bf16, "latent");
    c.all_to_all(a.data(), b.data(), 10, DType::bf16, "q");
    c.reduce_scatter(a.data(), b.data(), 10, DType::f32, "dlatent");
    c.all_reduce(a.data(), 10, DType::f32, "grad_sync");
    c.broadcast(a.data(), 13, 1, "config");
    c.barrier();
    c.send_recv(a.data(), b.data(), 10, DType::bf16, "k");
    const auto& rec = c.ledger().records();
    ASSERT_EQ(rec.size(), 7u) << "composite collectives are recorded once, not as their parts";
    const CollectiveOp ops[] = {CollectiveOp::all_gather,     CollectiveOp::all_to_all,
                                CollectiveOp::reduce_scatter, CollectiveOp::all_reduce,
                                CollectiveOp::broadcast,      CollectiveOp::barrier,
                                CollectiveOp::send_recv};
    const char* names[] = {"latent", "q", "dlatent", "grad_sync", "config", "barrier", "k"};
    const int64_t tensor[] = {20, 80, 40, 40, 13, 0, 20};
    const int64_t wire[] = {60, 60, 120, 60, c.rank() == 1 ? 39 : 0, 0, 20};
    for (size_t i = 0; i < 7; ++i) {
      EXPECT_EQ(rec[i].op, ops[i]);
      EXPECT_EQ(rec[i].tensor, names[i]);
      EXPECT_EQ(rec[i].tensor_bytes, tensor[i]) << collective_name(ops[i]);
      EXPECT_EQ(rec[i].wire_bytes, wire[i]) << collective_name(ops[i]);
      EXPECT_GE(rec[i].seconds, 0.0);
    }
    EXPECT_EQ(rec[0].dtype, DType::bf16);
    EXPECT_EQ(rec[2].dtype, DType::f32);
    EXPECT_EQ(c.ledger().tensor_bytes(), 20 + 80 + 40 + 40 + 13 + 20);
    EXPECT_EQ(c.ledger().wire_bytes([](const CollectiveRecord& r) {
      return r.tensor == "latent" || r.tensor == "q";
    }),
              120);
  });
}

// P = 3 does not divide 2·(P−1)·bytes evenly: ⌊2·2·40/3⌋ = 53. At P = 1 nothing goes on the wire.
TEST(Comm, LedgerWireBytesAreZeroAtOneRankAndFloorOtherwise) {
  run_threads(3, [&](Communicator& c) {
    std::vector<char> a(40);
    c.all_reduce(a.data(), 10, DType::f32, "grad_sync");
    EXPECT_EQ(c.ledger().records().at(0).wire_bytes, 53);
  });
  run_threads(1, [&](Communicator& c) {
    std::vector<char> a(40), b(40);
    c.all_gather(a.data(), b.data(), 10, DType::f32, "latent");
    c.all_to_all(a.data(), b.data(), 10, DType::f32, "q");
    c.reduce_scatter(a.data(), b.data(), 10, DType::f32, "dlatent");
    c.all_reduce(a.data(), 10, DType::f32, "grad_sync");
    c.broadcast(a.data(), 40, 0, "config");
    c.send_recv(a.data(), b.data(), 10, DType::f32, "k");
    EXPECT_TRUE(a == b) << "send_recv at one rank copies the input";
    EXPECT_EQ(c.ledger().wire_bytes(), 0);
    EXPECT_EQ(c.ledger().tensor_bytes(), 40 * 6);
  });
}

TEST(Comm, CheckSameEverywherePassesEqualValuesAndIsNotRecorded) {
  for (int P : rank_counts())
    run_threads(P, [&](Communicator& c) {
      check_same_everywhere(c, "seq", "8192");
      EXPECT_TRUE(c.ledger().records().empty());
    });
}

TEST(Comm, RanksGetTheirShareOfOpenMpThreads) {
  const int cores = int(std::thread::hardware_concurrency());
  for (int P : rank_counts())
    run_threads(P,
                [&](Communicator&) { EXPECT_EQ(omp_get_max_threads(), std::max(1, cores / P)); });
}

}  // namespace
}  // namespace laga
