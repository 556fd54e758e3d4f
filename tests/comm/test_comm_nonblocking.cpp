// Claims about the non-blocking collectives (*_start, wait, test) in the threads backend and the
// communicators without peers: several in flight give bitwise the blocking results, whatever order
// the handles are waited in; failures and timeouts end pending waits instead of hanging; the ledger
// separates exposed from hidden time (orderings and invariants only, never durations); the meta
// communicator records what a real group records without touching memory; first_ranks. The MPI
// backend's non-blocking collectives are checked by tests/cli/comm_mpi.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_testing.hpp"
#include "laga/comm/communicator.hpp"
#include "laga/comm/meta.hpp"
#include "laga/comm/stand_in.hpp"
#include "laga/core/error.hpp"

namespace laga {
namespace {

using testing::Buffer;
using testing::normal_buffer;
using testing::rank_counts;
using testing::within_seconds;

bool matches(const std::string& text, const std::string& pattern) {
  return std::regex_search(text, std::regex(pattern));
}

Error group_error(int P, const std::function<void(Communicator&)>& fn, double timeout_s = 0) {
  try {
    run_threads(P, fn, timeout_s);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "run_threads returned without an error";
  return Error(ErrorKind::internal, __FILE__, __LINE__, "no error");
}

// One rank's inputs and outputs for a mix of collectives: two all_reduces of the same size (so a
// mix-up of their second phases would go unnoticed by the mismatch check and show in the values),
// an all_gather, a reduce_scatter, an all_to_all and a broadcast.
struct Mix {
  Mix(int P, int r, DType t, int64_t n)
      : ag_in(normal_buffer(t, n, 11, r)),
        ag_out(t, P * n),
        rs_in(normal_buffer(t, P * n, 12, r)),
        rs_out(t, n),
        a2a_in(normal_buffer(t, P * n, 13, r)),
        a2a_out(t, P * n),
        ar1(normal_buffer(t, n + 1, 14, r)),
        ar2(normal_buffer(t, n + 1, 15, r)),
        bc(normal_buffer(t, n, 16, r)) {}
  Buffer ag_in, ag_out, rs_in, rs_out, a2a_in, a2a_out, ar1, ar2, bc;
  std::vector<const Buffer*> outputs() const {
    return {&ag_out, &rs_out, &a2a_out, &ar1, &ar2, &bc};
  }
};

void run_blocking(Communicator& c, Mix& m, DType t, int64_t n) {
  c.all_reduce(m.ar1.data(), n + 1, t, "grad_a");
  c.all_gather(m.ag_in.data(), m.ag_out.data(), n, t, "latent");
  c.reduce_scatter(m.rs_in.data(), m.rs_out.data(), n, t, "dlatent");
  c.all_reduce(m.ar2.data(), n + 1, t, "grad_b");
  c.all_to_all(m.a2a_in.data(), m.a2a_out.data(), n, t, "q");
  c.broadcast(m.bc.data(), n * dtype_size(t), c.size() - 1, "config");
}

// The same six collectives, all in flight at once, waited in an order that depends on the rank.
void run_nonblocking(Communicator& c, Mix& m, DType t, int64_t n) {
  std::vector<CollectiveHandle> h;
  h.push_back(c.all_reduce_start(m.ar1.data(), n + 1, t, "grad_a"));
  h.push_back(c.all_gather_start(m.ag_in.data(), m.ag_out.data(), n, t, "latent"));
  h.push_back(c.reduce_scatter_start(m.rs_in.data(), m.rs_out.data(), n, t, "dlatent"));
  h.push_back(c.all_reduce_start(m.ar2.data(), n + 1, t, "grad_b"));
  h.push_back(c.all_to_all_start(m.a2a_in.data(), m.a2a_out.data(), n, t, "q"));
  h.push_back(c.broadcast_start(m.bc.data(), n * dtype_size(t), c.size() - 1, "config"));
  std::vector<size_t> order(h.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = (i + size_t(c.rank()) * 2) % order.size();
  if (c.rank() % 2 == 1) std::reverse(order.begin(), order.end());
  for (size_t i : order) {
    c.wait(h[i]);
    EXPECT_TRUE(h[i].empty());
  }
}

TEST(Comm, SeveralCollectivesInFlightGiveTheBlockingResults) {
  for (int P : rank_counts())
    for (DType t : {DType::f32, DType::bf16})
      for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(300)}) {
        std::vector<std::vector<Buffer>> blocking(static_cast<size_t>(P));
        run_threads(P, [&](Communicator& c) {
          Mix m(P, c.rank(), t, n);
          run_blocking(c, m, t, n);
          for (const Buffer* b : m.outputs()) blocking[size_t(c.rank())].push_back(*b);
        });
        within_seconds(60, [&] {
          run_threads(P, [&](Communicator& c) {
            Mix m(P, c.rank(), t, n);
            run_nonblocking(c, m, t, n);
            const auto out = m.outputs();
            for (size_t k = 0; k < out.size(); ++k)
              EXPECT_TRUE(out[k]->bitwise_equal(blocking[size_t(c.rank())][k]))
                  << "P=" << P << " " << dtype_name(t) << " n=" << n << " rank " << c.rank()
                  << " output " << k;
          });
        });
      }
}

// A ring pass as the ring forms run it: hop h+1 is issued before hop h is waited (double buffering
// needs two in flight), mixed with an all_gather, waited in a rank-dependent order; the same bits
// as the blocking hops.
TEST(Comm, SeveralSendRecvsInFlightGiveTheBlockingResults) {
  for (int P : rank_counts())
    for (DType t : {DType::f32, DType::bf16})
      within_seconds(60, [&] {
        run_threads(P, [&](Communicator& c) {
          const int64_t n = 37;
          const Buffer k = normal_buffer(t, n, 21, c.rank()),
                       v = normal_buffer(t, 2 * n, 22, c.rank());
          Buffer k1(t, n), v1(t, 2 * n), k1b(t, n), v1b(t, 2 * n), ag(t, P * n), agb(t, P * n);
          c.send_recv(k.data(), k1b.data(), n, t, "k");
          c.all_gather(k.data(), agb.data(), n, t, "latent");
          c.send_recv(v.data(), v1b.data(), 2 * n, t, "v");
          std::vector<CollectiveHandle> h;
          h.push_back(c.send_recv_start(k.data(), k1.data(), n, t, "k"));
          h.push_back(c.all_gather_start(k.data(), ag.data(), n, t, "latent"));
          h.push_back(c.send_recv_start(v.data(), v1.data(), 2 * n, t, "v"));
          if (c.rank() % 2) std::reverse(h.begin(), h.end());
          for (auto& x : h) c.wait(x);
          EXPECT_TRUE(k1.bitwise_equal(k1b)) << "P=" << P;
          EXPECT_TRUE(v1.bitwise_equal(v1b)) << "P=" << P;
          EXPECT_TRUE(ag.bitwise_equal(agb)) << "P=" << P;
          EXPECT_TRUE(k1.bitwise_equal(normal_buffer(t, n, 21, (c.rank() + P - 1) % P)));
        });
      });
}

// Rank 2 never issues its hop: ranks 0, 1 and 3 time out naming it (a ring shift still waits for
// every rank of the group, as the other collectives do), and nobody hangs.
TEST(Comm, SendRecvTimeoutNamesTheMissingRank) {
  within_seconds(20, [&] {
    const Error e = group_error(
        4,
        [&](Communicator& c) {
          std::vector<float> a(8), b(8);
          if (c.rank() == 2) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1000));
            return;
          }
          auto h = c.send_recv_start(a.data(), b.data(), 8, DType::f32, "k");
          c.wait(h);
        },
        0.3);
    EXPECT_TRUE(matches(e.message(),
                        "^rank [013]: send_recv of 'k' timed out after 0.3 s waiting for rank 2$"))
        << e.message();
  });
}

TEST(Comm, SendRecvOfOverlappingBuffersIsRefused) {
  run_threads(1, [&](Communicator& c) {
    std::vector<float> a(16);
    EXPECT_THROW(c.send_recv(a.data(), a.data() + 4, 8, DType::f32, "k"), Error);
  });
}

// Rank 0 waits on its first all_reduce while rank 1 waits on the last collective it issued, and the
// others wait in yet other orders, many times over: nothing deadlocks and every result is right.
TEST(Comm, WaitInAnyOrderDoesNotDeadlock) {
  within_seconds(120, [&] {
    run_threads(4, [&](Communicator& c) {
      const int P = c.size(), r = c.rank();
      for (int it = 0; it < 50; ++it) {
        std::vector<std::vector<float>> bufs;
        for (int k = 0; k < 5; ++k) bufs.emplace_back(size_t(3 + k), float(r + 1) * float(k + 1));
        std::vector<float> ag_in(4, float(r)), ag_out(size_t(4 * P));
        std::vector<CollectiveHandle> h;
        for (int k = 0; k < 5; ++k) {
          h.push_back(c.all_reduce_start(bufs[size_t(k)].data(), 3 + k, DType::f32, "grad"));
          if (k == 2)
            h.push_back(c.all_gather_start(ag_in.data(), ag_out.data(), 4, DType::f32, "latent"));
        }
        std::vector<size_t> order(h.size());
        for (size_t i = 0; i < order.size(); ++i)
          order[i] = (i * size_t(2 * r + 1) + size_t(it + r)) % order.size();
        std::vector<bool> seen(order.size());
        for (size_t i : order) {
          if (seen[i]) continue;
          seen[i] = true;
          c.wait(h[i]);
        }
        for (auto& x : h) c.wait(x);  // those the permutation skipped (and no-ops for the others)
        const float ranks_sum = float(P * (P + 1) / 2);
        for (int k = 0; k < 5; ++k)
          for (float v : bufs[size_t(k)])
            EXPECT_EQ(v, ranks_sum * float(k + 1)) << "iteration " << it;
        for (int q = 0; q < P; ++q) EXPECT_EQ(ag_out[size_t(4 * q)], float(q));
      }
    });
  });
}

TEST(Comm, TestMakesProgressAndWaitThenReturnsAtOnce) {
  within_seconds(30, [&] {
    run_threads(3, [&](Communicator& c) {
      std::vector<float> buf(10, float(c.rank()));
      auto h = c.all_reduce_start(buf.data(), 10, DType::f32, "grad");
      while (!c.test(h)) std::this_thread::yield();
      EXPECT_FALSE(h.empty()) << "test leaves the handle for wait";
      EXPECT_TRUE(c.test(h));
      c.wait(h);
      EXPECT_TRUE(h.empty());
      EXPECT_TRUE(c.test(h)) << "an empty handle is done";
      c.wait(h);
      for (float v : buf) EXPECT_EQ(v, 3.0f);
    });
  });
}

// A handle dropped without wait is waited by its destructor: the result is there afterwards, and
// the peers are not left waiting.
TEST(Comm, HandleDestroyedWithoutWaitIsWaited) {
  within_seconds(30, [&] {
    run_threads(4, [&](Communicator& c) {
      std::vector<float> in(2, float(c.rank())), out(8);
      { auto h = c.all_gather_start(in.data(), out.data(), 2, DType::f32, "latent"); }
      for (int q = 0; q < 4; ++q) EXPECT_EQ(out[size_t(2 * q)], float(q));
      CollectiveHandle moved = c.barrier_start();
      moved = c.barrier_start();  // settles the first barrier before taking the second
      c.barrier();
    });
  });
}

// Each rank computes (sleeps) between start and wait: the ledger keeps issue order, and every
// record satisfies issued ≤ completed, seconds = completed − issued, 0 ≤ wait_s ≤ seconds. Exposed
// time is wait_s, hidden time seconds − wait_s ≥ 0; the totals agree with the records.
TEST(Comm, LedgerSeparatesExposedFromHiddenTime) {
  within_seconds(60, [&] {
    run_threads(3, [&](Communicator& c) {
      std::vector<float> a(30, 1.0f), b(90), d(30, 2.0f), e(10);
      auto h1 = c.all_gather_start(a.data(), b.data(), 30, DType::f32, "latent");
      auto h2 = c.all_reduce_start(d.data(), 30, DType::f32, "grad_sync");
      auto h3 = c.reduce_scatter_start(b.data(), e.data(), 10, DType::f32, "dlatent");
      std::this_thread::sleep_for(std::chrono::milliseconds(20 * (c.rank() + 1)));
      c.wait(h2);
      c.wait(h3);
      c.wait(h1);
      c.barrier();
      const auto& rec = c.ledger().records();
      ASSERT_EQ(rec.size(), 4u);
      EXPECT_EQ(rec[0].op, CollectiveOp::all_gather);
      EXPECT_EQ(rec[1].op, CollectiveOp::all_reduce);
      EXPECT_EQ(rec[2].op, CollectiveOp::reduce_scatter);
      EXPECT_EQ(rec[3].op, CollectiveOp::barrier);
      const double eps = 1e-9;
      double wait_total = 0, hidden_total = 0;
      for (size_t i = 0; i < rec.size(); ++i) {
        const auto& r = rec[i];
        EXPECT_GE(r.issued_s, 0.0);
        if (i > 0) {
          EXPECT_GE(r.issued_s, rec[i - 1].issued_s) << "issue order";
        }
        EXPECT_LE(r.issued_s, r.completed_s) << i;
        EXPECT_NEAR(r.seconds, r.completed_s - r.issued_s, eps) << i;
        EXPECT_GE(r.wait_s, 0.0) << i;
        EXPECT_LE(r.wait_s, r.seconds + eps) << i;
        EXPECT_GE(r.seconds - r.wait_s, -eps) << "hidden time " << i;
        wait_total += r.wait_s;
        hidden_total += r.seconds - r.wait_s;
      }
      EXPECT_NEAR(c.ledger().wait_seconds(), wait_total, eps);
      EXPECT_NEAR(c.ledger().seconds() - c.ledger().wait_seconds(), hidden_total, 1e-6);
      EXPECT_NEAR(
          c.ledger().wait_seconds([](const CollectiveRecord& r) { return r.tensor == "latent"; }),
          rec[0].wait_s, eps);
      // The blocking barrier was blocked for all of its time.
      EXPECT_NEAR(rec[3].wait_s, rec[3].seconds, 1e-3 + 0.5 * rec[3].seconds);
    });
  });
}

TEST(Comm, ClearedLedgerIsNotFilledInByCollectivesInFlight) {
  run_threads(2, [&](Communicator& c) {
    std::vector<float> a(4), b(8);
    auto h = c.all_gather_start(a.data(), b.data(), 4, DType::f32, "latent");
    c.ledger().clear();
    EXPECT_GE(c.ledger().now(), 0.0);
    c.wait(h);
    EXPECT_TRUE(c.ledger().records().empty());
    c.all_gather(a.data(), b.data(), 4, DType::f32, "latent");
    ASSERT_EQ(c.ledger().records().size(), 1u);
    EXPECT_GT(c.ledger().records()[0].completed_s, 0.0);
  });
}

// Rank 2 of 4 fails while the others have two collectives in flight and wait on them (in different
// orders); rank 2 itself has one in flight, dropped while its error unwinds. Every pending wait
// throws naming rank 2; nothing hangs; run_threads rethrows rank 2's own error.
TEST(Comm, FailingRankEndsPendingWaits) {
  within_seconds(20, [&] {
    std::mutex m;
    std::vector<std::string> others;
    const Error e = group_error(4, [&](Communicator& c) {
      std::vector<float> a(16, 1.0f), b(64), d(16, 1.0f);
      auto h1 = c.all_gather_start(a.data(), b.data(), 16, DType::f32, "latent");
      if (c.rank() == 2) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        throw Error(ErrorKind::failure, __FILE__, __LINE__, "injected fault");
      }
      auto h2 = c.all_reduce_start(d.data(), 16, DType::f32, "grad_sync");
      try {
        if (c.rank() == 1) {
          c.wait(h1);
          c.wait(h2);
        } else {
          c.wait(h2);
          c.wait(h1);
        }
      } catch (const Error& err) {
        std::lock_guard lk(m);
        others.push_back(err.message());
        throw;
      }
    });
    EXPECT_EQ(e.message(), "injected fault");
    ASSERT_EQ(others.size(), 3u);
    for (const auto& msg : others)
      EXPECT_TRUE(matches(msg,
                          "^rank [013]: (all_gather of 'latent'|all_reduce of 'grad_sync') "
                          "aborted: rank 2 failed: "))
          << msg;
  });
}

// Ranks 0 and 1 wait on a non-blocking all_gather that rank 2 issues only after the timeout.
TEST(Comm, TimeoutNamesTheMissingRank) {
  within_seconds(20, [&] {
    std::atomic<int> late_aborted{0};
    const Error e = group_error(
        3,
        [&](Communicator& c) {
          std::vector<float> a(8), b(24);
          if (c.rank() == 2) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1000));
            try {
              auto h = c.all_gather_start(a.data(), b.data(), 8, DType::f32, "latent");
              c.wait(h);
            } catch (const Error& err) {
              if (matches(err.message(),
                          "^rank 2: all_gather of 'latent' aborted: rank [01] failed: "))
                ++late_aborted;
              throw;
            }
            return;
          }
          auto h = c.all_gather_start(a.data(), b.data(), 8, DType::f32, "latent");
          c.wait(h);
        },
        0.3);
    EXPECT_TRUE(
        matches(e.message(),
                "^rank [01]: all_gather of 'latent' timed out after 0.3 s waiting for rank 2$"))
        << e.message();
    EXPECT_EQ(late_aborted.load(), 1);
  });
}

// Rank 2 issues the all_gather but then computes past the timeout without waiting: the others have
// their data from its posted buffer but must not free theirs before rank 2 has read — the error
// names rank 2 as the one that has not taken its data.
TEST(Comm, TimeoutNamesARankThatIssuedButDoesNotProgress) {
  within_seconds(20, [&] {
    const Error e = group_error(
        3,
        [&](Communicator& c) {
          std::vector<float> a(8), b(24);
          auto h = c.all_gather_start(a.data(), b.data(), 8, DType::f32, "latent");
          if (c.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
          c.wait(h);
        },
        0.3);
    EXPECT_TRUE(matches(e.message(),
                        "^rank [01]: all_gather of 'latent' timed out after 0.3 s waiting for rank "
                        "2 to take its data$"))
        << e.message();
  });
}

TEST(Comm, MismatchedNonBlockingCollectivesFailOnEveryRank) {
  within_seconds(10, [&] {
    std::atomic<int> failed{0};
    const Error e = group_error(3, [&](Communicator& c) {
      std::vector<float> a(8), b(24), d(8);
      auto h1 = c.all_gather_start(a.data(), b.data(), 4, DType::f32, "latent");
      auto h2 = c.rank() == 1 ? c.all_gather_start(a.data(), b.data(), 4, DType::f32, "kv")
                              : c.all_to_all_start(b.data(), d.data(), 2, DType::f32, "q");
      c.wait(h1);
      try {
        c.wait(h2);
      } catch (const Error&) {
        ++failed;
        throw;
      }
    });
    EXPECT_EQ(failed.load(), 3);
    EXPECT_EQ(e.kind(), ErrorKind::internal);
    EXPECT_TRUE(
        matches(e.message(),
                "ranks disagree on the collective: rank 0 runs all_to_all of 'q' \\(all_to_all, 8 "
                "bytes, root 0\\), rank 1 runs all_gather of 'kv' \\(all_gather, 16 bytes"))
        << e.message();
  });
}

// The collectives a planner would run, once on a real group of 4 threads and once on 4 meta ranks
// with null buffers: the same records, byte for byte.
void planned_collectives(Communicator& c, bool null_buffers) {
  const int P = c.size();
  std::vector<char> a(size_t(P) * 4000), b(size_t(P) * 4000);
  void* x = null_buffers ? nullptr : a.data();
  void* y = null_buffers ? nullptr : b.data();
  for (DType t : {DType::f32, DType::bf16}) {
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(13), int64_t(1000)}) {
      c.all_gather(x, y, n, t, "latent");
      c.reduce_scatter(x, y, n, t, "dlatent");
      c.all_to_all(x, y, n, t, "q");
      c.all_reduce(x, n, t, "grad_sync");
      c.send_recv(x, y, n, t, "k");
      auto h1 = c.all_gather_start(x, y, n, t, "kv");
      auto h2 = c.all_reduce_start(x, n, t, "grad_b");
      c.wait(h2);
      c.wait(h1);
    }
  }
  c.broadcast(x, 999, 1, "config");
  c.barrier();
  check_same_everywhere(c, "seq", "4096");
}

TEST(Comm, MetaRecordsTheSameBytesAsThreads) {
  const int P = 4;
  std::vector<std::vector<CollectiveRecord>> threads(P);
  run_threads(P, [&](Communicator& c) {
    planned_collectives(c, false);
    threads[size_t(c.rank())] = c.ledger().records();
  });
  for (int r = 0; r < P; ++r) {
    MetaCommunicator meta(r, P);
    EXPECT_EQ(meta.backend(), "meta");
    EXPECT_FALSE(meta.moves_data());
    planned_collectives(meta, true);
    const auto& m = meta.ledger().records();
    ASSERT_EQ(m.size(), threads[size_t(r)].size());
    for (size_t i = 0; i < m.size(); ++i) {
      const auto& t = threads[size_t(r)][i];
      EXPECT_EQ(m[i].op, t.op) << i;
      EXPECT_EQ(m[i].tensor, t.tensor) << i;
      EXPECT_EQ(m[i].dtype, t.dtype) << i;
      EXPECT_EQ(m[i].tensor_bytes, t.tensor_bytes) << i << " " << t.tensor;
      EXPECT_EQ(m[i].wire_bytes, t.wire_bytes) << i << " " << t.tensor;
      EXPECT_LE(m[i].issued_s, m[i].completed_s);
    }
  }
}

TEST(Comm, MetaCollectivesCompleteAtOnceAndStillCheckTheirArguments) {
  MetaCommunicator meta(1, 8);
  // 2 GiB that do not exist
  auto h = meta.all_reduce_start(nullptr, 1 << 30, DType::bf16, "grad_sync");
  EXPECT_TRUE(meta.test(h));
  meta.wait(h);
  EXPECT_EQ(meta.ledger().records().at(0).tensor_bytes, int64_t(2) << 30);
  EXPECT_THROW(meta.all_gather(nullptr, nullptr, -1, DType::f32, "latent"), Error);
  EXPECT_THROW(meta.broadcast(nullptr, 10, 8, "config"), Error);
}

TEST(Comm, StandInCollectivesCompleteAtOnce) {
  StandInCommunicator s(1, 4);
  std::vector<float> in(3, 7.0f), out(12);
  auto h = s.all_gather_start(in.data(), out.data(), 3, DType::f32, "latent");
  EXPECT_TRUE(s.test(h));
  s.wait(h);
  for (float v : out) EXPECT_EQ(v, 7.0f);
  std::vector<float> buf(5, 1.0f);
  auto h2 = s.all_reduce_start(buf.data(), 5, DType::f32, "grad_sync");
  EXPECT_TRUE(s.test(h2));
  s.wait(h2);
  ASSERT_EQ(s.ledger().records().size(), 2u);
  EXPECT_EQ(s.ledger().records()[1].wire_bytes, 2 * 3 * 20 / 4);
  EXPECT_EQ(s.backend(), "stand-in");
}

TEST(Comm, FirstRanksGivesAGroupOfTheFirstRanks) {
  MetaCommunicator world3(3, 8), world1(1, 8);
  world1.set_timeout(5);
  EXPECT_EQ(first_ranks(world3, 2), nullptr);
  auto sub = first_ranks(world1, 2);
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->rank(), 1);
  EXPECT_EQ(sub->size(), 2);
  EXPECT_EQ(sub->backend(), "meta");
  EXPECT_EQ(sub->timeout(), 5.0);
  EXPECT_TRUE(sub->ledger().records().empty());
  StandInCommunicator s(0, 4);
  EXPECT_EQ(first_ranks(s, 4)->size(), 4);
}

TEST(Comm, FirstRanksBeyondTheWorldIsAUsageErrorSuggestingMpirun) {
  MetaCommunicator world(0, 4);
  try {
    first_ranks(world, 8);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::usage);
    EXPECT_EQ(e.exit_status(), 2);
    EXPECT_TRUE(matches(e.message(), "8 ranks.*the world has 4.*mpirun -np 8")) << e.message();
  }
  EXPECT_THROW(first_ranks(world, 0), Error);
  const Error e = group_error(2, [](Communicator& c) { first_ranks(c, 1); });
  EXPECT_EQ(e.kind(), ErrorKind::usage);
  EXPECT_TRUE(matches(e.message(), "threads backend has no sub-groups.*run_threads\\(1"))
      << e.message();
}

}  // namespace
}  // namespace laga
