// Claims about the c10d backend (python/src/c10d_communicator.hpp), with P ranks as threads of this
// process, each with its own ProcessGroupGloo on the loopback over one shared HashStore: every
// collective, blocking and in flight, in both dtypes, at P 1 to 4 (zero elements included), gives
// the threads backend's bits and records the same ledger entries; split and first_ranks groups
// likewise; an abort or a timeout on one rank ends every other rank's waits (no hang), naming the
// failing rank and its reason. Not here: the Python layer over it (python/tests/*.py).
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1  // Debian's libtorch is built with gloo; its CMake config does not say so
#endif

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "c10d_communicator.hpp"
#include "comm/comm_testing.hpp"
#include "laga/core/error.hpp"

namespace laga {
namespace {

using testing::Buffer;
using testing::normal_buffer;
using testing::within_seconds;
using Clock = std::chrono::steady_clock;

// A rank's process group as torch.distributed makes it for gloo: its own device on the loopback.
c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                      int rank, int P,
                                                      std::chrono::milliseconds gloo_timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(gloo_timeout);
  options->devices = {c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")};
  return c10::make_intrusive<c10d::ProcessGroupGloo>(
      c10::make_intrusive<c10d::PrefixStore>("world", store), rank, P, options);
}

// run_threads for the c10d backend: fn on P ranks as threads, each with a c10d communicator (prefix
// "laga") over its own ProcessGroupGloo; a rank that throws aborts the group, and the first failing
// rank's error (the one the abort key names) is rethrown after every rank is joined.
void run_c10d(int P, const std::function<void(Communicator&)>& fn, double timeout_s = 0,
              std::chrono::milliseconds gloo_timeout = std::chrono::seconds(30)) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::exception_ptr> errors(static_cast<size_t>(P));
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r)
    threads.emplace_back([&, r] {
      try {
        auto pg = gloo_group(store, r, P, gloo_timeout);
        auto comm = make_c10d_communicator(pg, store, "laga", timeout_s);
        try {
          fn(*comm);
        } catch (const std::exception& e) {
          errors[size_t(r)] = std::current_exception();
          comm->abort(e.what());
        }
      } catch (...) {
        if (!errors[size_t(r)]) errors[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (store->check({"laga/abort"})) {
    const auto v = store->get("laga/abort");
    const int failed = std::atoi(std::string(v.begin(), v.end()).c_str());
    if (failed >= 0 && failed < P && errors[size_t(failed)])
      std::rethrow_exception(errors[size_t(failed)]);
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// A record as every backend must write it (the timings aside).
struct Entry {
  CollectiveOp op;
  std::string tensor;
  DType dtype;
  int64_t tensor_bytes, wire_bytes;
  std::vector<int> group;
  bool operator==(const Entry&) const = default;
};

std::vector<Entry> entries(Communicator& c) {
  std::vector<Entry> out;
  for (const auto& r : c.ledger().records())
    out.push_back({r.op, r.tensor, r.dtype, r.tensor_bytes, r.wire_bytes,
                   r.group ? *r.group : std::vector<int>{}});
  return out;
}

// What one rank ends with: its outputs in call order, and its ledger.
struct Outcome {
  std::vector<Buffer> outputs;
  std::vector<Entry> ledger;
};

// Runs body on P ranks under both backends; every rank's outputs and records must agree bitwise.
void expect_same_as_threads(int P, const std::function<std::vector<Buffer>(Communicator&)>& body,
                            const std::string& claim) {
  std::vector<Outcome> threads(static_cast<size_t>(P)), c10d(static_cast<size_t>(P));
  run_threads(P, [&](Communicator& c) { threads[size_t(c.rank())] = {body(c), entries(c)}; });
  within_seconds(60, [&] {
    run_c10d(P, [&](Communicator& c) {
      EXPECT_EQ(c.backend(), "c10d");
      c10d[size_t(c.rank())] = {body(c), entries(c)};
    });
  });
  for (int r = 0; r < P; ++r) {
    const Outcome &a = threads[size_t(r)], &b = c10d[size_t(r)];
    ASSERT_EQ(a.outputs.size(), b.outputs.size()) << claim << " P=" << P << " rank " << r;
    for (size_t k = 0; k < a.outputs.size(); ++k)
      EXPECT_TRUE(a.outputs[k].bitwise_equal(b.outputs[k]))
          << claim << " P=" << P << " rank " << r << " output " << k << " ("
          << dtype_name(a.outputs[k].dtype) << ", " << a.outputs[k].n << " elements)";
    EXPECT_TRUE(a.ledger == b.ledger)
        << claim << " P=" << P << " rank " << r << ": " << a.ledger.size()
        << " records under threads, " << b.ledger.size() << " under c10d";
  }
}

constexpr DType kDtypes[] = {DType::f32, DType::bf16};

// Every collective once, blocking, per dtype and count (0 included); all_reduce over n + 1
// elements, so P = 2 and 4 pad it too.
std::vector<Buffer> every_collective(Communicator& c) {
  const int P = c.size(), r = c.rank();
  std::vector<Buffer> out;
  uint64_t s = 0;
  for (DType t : kDtypes)
    for (int64_t n : {0, 1, 7, 300}) {
      const int64_t es = dtype_size(t);
      s += 10;
      const Buffer ag_in = normal_buffer(t, n, s + 1, r);
      Buffer ag_out(t, P * n);
      c.all_gather(ag_in.data(), ag_out.data(), n, t, "latent");
      // In place: this rank's chunk is the input; the others start as junk.
      Buffer in_place(t, P * n);
      std::memset(in_place.data(), 0x7f, in_place.bytes.size());
      if (n > 0) std::memcpy(in_place.bytes.data() + r * n * es, ag_in.data(), size_t(n * es));
      c.all_gather(in_place.bytes.data() + r * n * es, in_place.data(), n, t, "latent_in_place");
      const Buffer rs_in = normal_buffer(t, P * n, s + 2, r);
      Buffer rs_out(t, n);
      c.reduce_scatter(rs_in.data(), rs_out.data(), n, t, "dlatent");
      const Buffer a2a_in = normal_buffer(t, P * n, s + 3, r);
      Buffer a2a_out(t, P * n);
      c.all_to_all(a2a_in.data(), a2a_out.data(), n, t, "q");
      Buffer ar = normal_buffer(t, n + 1, s + 4, r);
      c.all_reduce(ar.data(), n + 1, t, "grad");
      Buffer bc = normal_buffer(t, n, s + 5, r);
      c.broadcast(bc.data(), n * es, P - 1, "config");
      const Buffer sr_in = normal_buffer(t, n, s + 6, r);
      Buffer sr_out(t, n);
      c.send_recv(sr_in.data(), sr_out.data(), n, t, "kv");
      c.barrier();
      for (Buffer* b : {&ag_out, &in_place, &rs_out, &a2a_out, &ar, &bc, &sr_out})
        out.push_back(std::move(*b));
    }
  return out;
}

TEST(C10d, EveryCollectiveGivesTheThreadsBackendsBitsAndRecordsAtEveryP) {
  for (int P : {1, 2, 3, 4})
    expect_same_as_threads(P, every_collective, "every collective, blocking");
}

// Nine collectives in flight at once (two all_reduces of one size, so a mix-up of their second
// phases would show in the values; two ring hops, as double buffering has), the all_reduces'
// second phases issued by whichever test or wait finds their first phase done; some handles tested
// until done, the rest waited in a rank-dependent order. `blocking`: the same calls one by one.
std::vector<Buffer> in_flight(Communicator& c, bool blocking) {
  const int P = c.size(), r = c.rank();
  std::vector<Buffer> out;
  uint64_t s = 100;
  for (DType t : kDtypes)
    for (int64_t n : {7, 300}) {
      s += 10;
      const int64_t es = dtype_size(t);
      Buffer ar1 = normal_buffer(t, n + 1, s + 1, r), ar2 = normal_buffer(t, n + 1, s + 2, r);
      const Buffer ag_in = normal_buffer(t, n, s + 3, r), rs_in = normal_buffer(t, P * n, s + 4, r),
                   a2a_in = normal_buffer(t, P * n, s + 5, r),
                   sr1_in = normal_buffer(t, n, s + 6, r), sr2_in = normal_buffer(t, n, s + 7, r);
      Buffer ag_out(t, P * n), rs_out(t, n), a2a_out(t, P * n), sr1_out(t, n), sr2_out(t, n);
      Buffer bc = normal_buffer(t, n, s + 8, r);
      if (blocking) {
        c.all_reduce(ar1.data(), n + 1, t, "grad_a");
        c.all_gather(ag_in.data(), ag_out.data(), n, t, "latent");
        c.reduce_scatter(rs_in.data(), rs_out.data(), n, t, "dlatent");
        c.all_reduce(ar2.data(), n + 1, t, "grad_b");
        c.all_to_all(a2a_in.data(), a2a_out.data(), n, t, "q");
        c.broadcast(bc.data(), n * es, 0, "config");
        c.send_recv(sr1_in.data(), sr1_out.data(), n, t, "kv_hop1");
        c.send_recv(sr2_in.data(), sr2_out.data(), n, t, "kv_hop2");
        c.barrier();
      } else {
        std::vector<CollectiveHandle> h;
        h.push_back(c.all_reduce_start(ar1.data(), n + 1, t, "grad_a"));
        h.push_back(c.all_gather_start(ag_in.data(), ag_out.data(), n, t, "latent"));
        h.push_back(c.reduce_scatter_start(rs_in.data(), rs_out.data(), n, t, "dlatent"));
        h.push_back(c.all_reduce_start(ar2.data(), n + 1, t, "grad_b"));
        h.push_back(c.all_to_all_start(a2a_in.data(), a2a_out.data(), n, t, "q"));
        h.push_back(c.broadcast_start(bc.data(), n * es, 0, "config"));
        h.push_back(c.send_recv_start(sr1_in.data(), sr1_out.data(), n, t, "kv_hop1"));
        h.push_back(c.send_recv_start(sr2_in.data(), sr2_out.data(), n, t, "kv_hop2"));
        h.push_back(c.barrier_start());
        // The second all_reduce by test alone, then the rest in a rank-dependent order.
        while (!c.test(h[3])) std::this_thread::yield();
        EXPECT_TRUE(h[3].empty() || c.test(h[3]));
        std::vector<size_t> order(h.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = (i + size_t(r) * 2) % order.size();
        if (r % 2 == 1) std::reverse(order.begin(), order.end());
        for (size_t i : order) {
          c.wait(h[i]);
          EXPECT_TRUE(h[i].empty());
        }
      }
      for (Buffer* b : {&ar1, &ag_out, &rs_out, &ar2, &a2a_out, &bc, &sr1_out, &sr2_out})
        out.push_back(std::move(*b));
    }
  return out;
}

TEST(C10d, CollectivesInFlightGiveTheThreadsBackendsBlockingBitsAndRecords) {
  for (int P : {1, 2, 3, 4}) {
    std::vector<std::vector<Buffer>> blocking(static_cast<size_t>(P));
    std::vector<std::vector<Entry>> blocking_ledger(static_cast<size_t>(P));
    run_threads(P, [&](Communicator& c) {
      blocking[size_t(c.rank())] = in_flight(c, true);
      blocking_ledger[size_t(c.rank())] = entries(c);
    });
    within_seconds(60, [&] {
      run_c10d(P, [&](Communicator& c) {
        const auto got = in_flight(c, false);
        const auto& want = blocking[size_t(c.rank())];
        ASSERT_EQ(got.size(), want.size());
        for (size_t k = 0; k < got.size(); ++k)
          EXPECT_TRUE(got[k].bitwise_equal(want[k]))
              << "P=" << P << " rank " << c.rank() << " output " << k;
        EXPECT_TRUE(entries(c) == blocking_ledger[size_t(c.rank())])
            << "P=" << P << " rank " << c.rank();
      });
    });
  }
}

// The world split into its first three ranks (keys reversed) and the rest, the three split again
// into the first two and the third, collectives on all three levels interleaved: groups of 1, 2 and
// 3 ranks (3: a ring whose direction shows).
std::vector<Buffer> in_groups(Communicator& c) {
  const int r = c.rank();
  auto first3 = c.split([](int q) { return SplitKey{q < 3 ? 0 : 1, -q}; });
  auto half = first3->split([](int q) { return SplitKey{q / 2, q}; });
  std::vector<Buffer> out;
  for (DType t : kDtypes) {
    const int64_t n = 5;
    const int G = first3->size();
    Buffer ar = normal_buffer(t, n, 201, r), world = normal_buffer(t, 2 * n + 1, 202, r);
    const Buffer ag_in = normal_buffer(t, n, 203, r), sr_in = normal_buffer(t, n, 204, r),
                 a2a_in = normal_buffer(t, G * n, 205, r), h_in = normal_buffer(t, n, 206, r);
    Buffer ag_out(t, G * n), sr_out(t, n), a2a_out(t, G * n), h_out(t, half->size() * n);
    auto hw = c.all_reduce_start(world.data(), 2 * n + 1, t, "world_grad");
    first3->all_reduce(ar.data(), n, t, "group_grad");
    first3->all_gather(ag_in.data(), ag_out.data(), n, t, "group_latent");
    half->all_gather(h_in.data(), h_out.data(), n, t, "half_latent");
    first3->send_recv(sr_in.data(), sr_out.data(), n, t, "group_ring");
    first3->all_to_all(a2a_in.data(), a2a_out.data(), n, t, "group_q");
    c.wait(hw);
    for (Buffer* b : {&ar, &world, &ag_out, &sr_out, &a2a_out, &h_out})
      out.push_back(std::move(*b));
  }
  return out;
}

TEST(C10d, SplitGroupsGiveTheThreadsBackendsBitsAndRecordInTheParentsLedger) {
  for (int P : {1, 3, 4}) expect_same_as_threads(P, in_groups, "split");
}

TEST(C10d, FirstRanksIsAGroupOfTheFirstRanksWithTheWorldsTimeout) {
  within_seconds(30, [] {
    run_c10d(
        3,
        [](Communicator& c) {
          auto first = first_ranks(c, 2);
          if (c.rank() >= 2) {
            EXPECT_TRUE(first == nullptr);
            return;
          }
          ASSERT_TRUE(first != nullptr);
          EXPECT_EQ(first->size(), 2);
          EXPECT_EQ(first->rank(), c.rank());
          EXPECT_EQ(first->timeout(), 20.0);
          float v[3] = {float(c.rank() + 1), 0.5f, -2.0f};
          first->all_reduce(v, 3, DType::f32, "x");
          EXPECT_EQ(v[0], 3.0f);
          EXPECT_EQ(v[1], 1.0f);
          EXPECT_EQ(v[2], -4.0f);
          EXPECT_TRUE(first->ledger().records().size() == 1 && c.ledger().records().empty())
              << "the group of the first ranks keeps its own ledger";
        },
        20.0);
  });
}

// The ranks' buffers of the collectives left in flight: gloo's workers may still hold them until
// the groups are destroyed, so they outlive run_c10d.
struct Stranded {
  explicit Stranded(int P) : in(P, std::vector<float>(64, 1.0f)), out(P, std::vector<float>(256)) {}
  std::vector<std::vector<float>> in, out;
};

TEST(C10d, AnAbortOnOneRankEndsEveryOtherRanksPendingCollectivesWithinABound) {
  constexpr int P = 3;
  Stranded bufs(P);
  std::vector<float> bc(P * 64), ring(P * 64);
  std::atomic<int> issued{0}, left{0};
  std::atomic<int64_t> abort_ns{0};
  std::vector<double> latency(P, -1);
  std::vector<std::string> messages(P);
  auto since_abort = [&] {
    return std::chrono::duration<double>(Clock::now().time_since_epoch()).count() -
           double(abort_ns.load()) * 1e-9;
  };
  auto await = [](const std::atomic<int>& n, int want) {
    const auto t0 = Clock::now();
    while (n.load() < want && Clock::now() - t0 < std::chrono::seconds(10))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  within_seconds(40, [&] {
    run_c10d(
        P,
        [&](Communicator& c) {
          const int r = c.rank();
          if (r == 0) {  // fails before its collectives, while the others wait in theirs
            await(issued, P - 1);
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            abort_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           Clock::now().time_since_epoch())
                           .count();
            c.abort("injected failure");
            await(left, P - 1);  // its groups stay up: only the abort key can end the others' waits
            return;
          }
          auto ag = c.all_gather_start(bufs.in[size_t(r)].data(), bufs.out[size_t(r)].data(), 64,
                                       DType::f32, "latent");
          auto b = c.broadcast_start(bc.data() + r * 64, 64 * 4, 0, "config");
          auto s = c.send_recv_start(bufs.in[size_t(r)].data(), ring.data() + r * 64, 64,
                                     DType::f32, "kv");
          ++issued;
          try {
            c.wait(s);
            c.wait(b);
            c.wait(ag);
            ADD_FAILURE() << "rank " << r << " finished collectives that rank 0 never joined";
          } catch (const Error& e) {
            latency[size_t(r)] = since_abort();
            messages[size_t(r)] = e.what();
          }
          ++left;
        },
        0, std::chrono::seconds(5));
  });
  for (int r = 1; r < P; ++r) {
    EXPECT_NE(messages[size_t(r)].find("aborted: rank 0 failed: injected failure"),
              std::string::npos)
        << messages[size_t(r)];
    EXPECT_GE(latency[size_t(r)], 0.0) << "rank " << r << " left before the abort";
    EXPECT_LT(latency[size_t(r)], 2.0) << "rank " << r << " noticed the abort late";
  }
}

TEST(C10d, ATimeoutNamesTheCollectiveAndTheRankAndEndsThePeersWaits) {
  Stranded bufs(2);
  std::atomic<int> threw{0};
  std::string timed_out, peer;
  within_seconds(40, [&] {
    run_c10d(
        2,
        [&](Communicator& c) {
          if (c.rank() == 0) {  // rank 1 never joins: the all_to_all times out and aborts
            try {
              c.all_to_all(bufs.in[0].data(), bufs.out[0].data(), 4, DType::f32, "q");
              ADD_FAILURE() << "an all_to_all that rank 1 never joined finished";
            } catch (const Error& e) {
              timed_out = e.what();
            }
            ++threw;
            return;
          }
          const auto t0 = Clock::now();
          while (threw.load() == 0 && Clock::now() - t0 < std::chrono::seconds(10))
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          try {
            c.barrier();
            ADD_FAILURE() << "rank 1's barrier passed after rank 0 timed out";
          } catch (const Error& e) {
            peer = e.what();
          }
        },
        0.3, std::chrono::seconds(5));
  });
  EXPECT_NE(timed_out.find("rank 0: all_to_all of 'q' timed out after 0.3 s"), std::string::npos)
      << timed_out;
  EXPECT_NE(peer.find("rank 1: barrier of 'barrier' aborted: rank 0 failed: rank 0: all_to_all "
                      "of 'q' timed out"),
            std::string::npos)
      << peer;
}

TEST(C10d, EachCommunicatorNeedsAPrefixOfItsOwnInTheStore) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto pg = gloo_group(store, 0, 1, std::chrono::seconds(30));
  auto first = make_c10d_communicator(pg, store, "laga", 0);
  try {
    make_c10d_communicator(pg, store, "laga", 0);
    ADD_FAILURE() << "a second communicator under the same prefix was made";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::usage);
    EXPECT_NE(std::string(e.what()).find("pass a new prefix"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(make_c10d_communicator(pg, store, "laga2", 0));
}

}  // namespace
}  // namespace laga
