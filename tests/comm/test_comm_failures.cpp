// Claims about failure in the threads backend: a rank that throws, times out, disagrees on a
// collective or on its configuration brings the whole group down with an error that names the
// collective and the ranks — never a hang. Each claim runs under a watchdog, so a hang fails the
// test instead of stalling CI. The MPI backend's faults are checked by tests/cli/comm_mpi.sh.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_testing.hpp"
#include "laga/comm/communicator.hpp"
#include "laga/core/error.hpp"

namespace laga {
namespace {

using testing::within_seconds;
using Clock = std::chrono::steady_clock;

// Runs the group and returns the error run_threads rethrows; fails the test if there is none.
Error group_error(int P, const std::function<void(Communicator&)>& fn, double timeout_s = 0) {
  try {
    run_threads(P, fn, timeout_s);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "run_threads returned without an error";
  return Error(ErrorKind::internal, __FILE__, __LINE__, "no error");
}

bool matches(const std::string& text, const std::string& pattern) {
  return std::regex_search(text, std::regex(pattern));
}

// Rank 2 of 4 throws while ranks 0, 1 and 3 sit in an all_gather (and another run: in an
// all_reduce, which is two exchanges deep). run_threads returns promptly, rethrowing rank 2's own
// error; the others leave their collective with an error naming it and rank 2.
TEST(Comm, ExceptionOnOneRankBringsGroupDownWithoutHang) {
  for (const char* op : {"all_gather", "all_reduce"}) {
    within_seconds(10, [&] {
      std::mutex m;
      std::vector<std::string> others;
      const auto t0 = Clock::now();
      const Error e = group_error(4, [&](Communicator& c) {
        std::vector<float> a(16, 1.0f), b(64);
        c.all_gather(a.data(), b.data(), 16, DType::f32, "warmup");
        if (c.rank() == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          throw Error(ErrorKind::failure, __FILE__, __LINE__, "injected fault");
        }
        try {
          if (std::string(op) == "all_gather")
            c.all_gather(a.data(), b.data(), 16, DType::f32, "latent");
          else
            c.all_reduce(a.data(), 16, DType::f32, "grad_sync");
        } catch (const Error& err) {
          std::lock_guard lk(m);
          others.push_back(err.message());
          throw;
        }
      });
      EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0);
      EXPECT_EQ(e.message(), "injected fault");
      EXPECT_EQ(e.kind(), ErrorKind::failure);
      ASSERT_EQ(others.size(), 3u);
      const std::string tensor = std::string(op) == "all_gather" ? "latent" : "grad_sync";
      for (const auto& msg : others)
        EXPECT_TRUE(matches(msg, "^rank [013]: " + std::string(op) + " of '" + tensor +
                                     "' aborted: rank 2 failed: injected fault"))
            << msg;
    });
  }
}

TEST(Comm, TimeoutNamesCollectiveAndRank) {
  within_seconds(20, [&] {
    std::atomic<int> aborted_late{0};
    const auto t0 = Clock::now();
    const Error e = group_error(
        4,
        [&](Communicator& c) {
          std::vector<float> a(8), b(32);
          if (c.rank() == 3) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1000));
            try {
              c.all_gather(a.data(), b.data(), 8, DType::f32, "latent");
            } catch (const Error& err) {
              if (matches(err.message(),
                          "^rank 3: all_gather of 'latent' aborted: rank [012] failed: "))
                ++aborted_late;
              throw;
            }
            return;
          }
          c.all_gather(a.data(), b.data(), 8, DType::f32, "latent");
        },
        0.3);
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_EQ(e.kind(), ErrorKind::failure);
    EXPECT_TRUE(
        matches(e.message(),
                "^rank [012]: all_gather of 'latent' timed out after 0.3 s waiting for rank 3$"))
        << e.message();
    EXPECT_EQ(aborted_late.load(), 1)
        << "the late rank must find the group aborted, not complete the all_gather";
    EXPECT_LT(took, 5.0);
  });
}

TEST(Comm, TimeoutListsEveryMissingRank) {
  within_seconds(20, [&] {
    const Error e = group_error(
        4,
        [&](Communicator& c) {
          if (c.rank() == 0) {
            c.barrier();
          } else if (c.rank() != 2) {
            std::this_thread::sleep_for(std::chrono::milliseconds(500));
          }
        },
        0.2);
    EXPECT_TRUE(
        matches(e.message(),
                "^rank 0: barrier of 'barrier' timed out after 0.2 s waiting for ranks 1, 2, 3$"))
        << e.message();
  });
}

TEST(Comm, UsageErrorOnOneRankKeepsItsKind) {
  within_seconds(10, [&] {
    const Error e = group_error(3, [&](Communicator& c) {
      LAGA_CHECK(c.rank() != 1, "--seq 100 does not divide by --sp 3; try 99 or 102");
      c.barrier();
    });
    EXPECT_EQ(e.kind(), ErrorKind::usage);
    EXPECT_EQ(e.exit_status(), 2);
    EXPECT_EQ(e.message(), "--seq 100 does not divide by --sp 3; try 99 or 102");
  });
}

TEST(Comm, NonLagaExceptionIsRethrownAsIs) {
  within_seconds(10, [&] {
    try {
      run_threads(2, [&](Communicator& c) {
        if (c.rank() == 0) throw std::out_of_range("index 9 past 8");
        c.barrier();
      });
      ADD_FAILURE() << "no exception";
    } catch (const std::out_of_range& e) {
      EXPECT_STREQ(e.what(), "index 9 past 8");
    }
  });
}

TEST(Comm, MismatchedCollectivesFailOnEveryRank) {
  within_seconds(10, [&] {
    std::atomic<int> failed{0};
    const Error e = group_error(3, [&](Communicator& c) {
      std::vector<float> a(8), b(24);
      try {
        c.all_gather(a.data(), b.data(), c.rank() == 1 ? 5 : 4, DType::f32, "latent");
      } catch (const Error&) {
        ++failed;
        throw;
      }
    });
    EXPECT_EQ(failed.load(), 3);
    EXPECT_EQ(e.kind(), ErrorKind::internal);
    EXPECT_TRUE(matches(e.message(),
                        "ranks disagree on the collective: rank 0 runs all_gather of 'latent' "
                        "\\(all_gather, 16 bytes, root 0\\), rank 1 runs all_gather of 'latent' "
                        "\\(all_gather, 20 bytes"))
        << e.message();
  });
}

TEST(Comm, CheckSameEverywhereNamesTheDifferingRanks) {
  within_seconds(10, [&] {
    std::mutex m;
    std::vector<std::string> messages(4);
    const Error e = group_error(4, [&](Communicator& c) {
      try {
        check_same_everywhere(c, "seq", c.rank() == 3 ? "4096" : "8192");
      } catch (const Error& err) {
        std::lock_guard lk(m);
        messages[size_t(c.rank())] = err.message();
        throw;
      }
    });
    EXPECT_EQ(e.kind(), ErrorKind::usage);
    for (int r = 0; r < 4; ++r)
      EXPECT_TRUE(matches(messages[size_t(r)],
                          "^ranks started with different seq: rank 3 differs from rank 0; rank " +
                              std::to_string(r) + " has '" + (r == 3 ? "4096" : "8192") + "'"))
          << messages[size_t(r)];
  });
}

TEST(Comm, CheckSameEverywhereComparesLengthsToo) {
  within_seconds(10, [&] {
    const Error e = group_error(2, [&](Communicator& c) {
      check_same_everywhere(c, "model",
                            c.rank() == 0 ? std::string("tiny") : std::string("tiny\0", 5));
    });
    EXPECT_TRUE(matches(e.message(), "^ranks started with different model: rank 1 differs"))
        << e.message();
  });
}

// A rank that calls abort() itself and returns: the others' pending and later collectives throw.
TEST(Comm, AbortedGroupFailsEveryLaterCollective) {
  within_seconds(10, [&] {
    std::atomic<int> threw{0};
    const Error e = group_error(3, [&](Communicator& c) {
      if (c.rank() == 0) {
        c.abort("operator stop");
        return;
      }
      for (int i = 0; i < 2; ++i) {
        try {
          c.barrier();
        } catch (const Error& err) {
          if (matches(err.message(), "barrier of 'barrier' aborted: rank 0 failed: operator stop"))
            ++threw;
        }
      }
      c.barrier();
    });
    EXPECT_EQ(threw.load(), 4);
    EXPECT_EQ(e.kind(), ErrorKind::failure);
  });
}

TEST(Comm, RunThreadsRejectsZeroRanks) {
  try {
    run_threads(0, [](Communicator&) {});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::usage);
  }
}

TEST(Comm, BadArgumentsAreUsageErrorsThatStillBringTheGroupDown) {
  within_seconds(10, [&] {
    const Error e = group_error(2, [&](Communicator& c) {
      std::vector<float> a(4), b(8);
      c.all_gather(a.data(), b.data(), c.rank() == 0 ? -1 : 4, DType::f32, "latent");
    });
    EXPECT_EQ(e.kind(), ErrorKind::usage);
    EXPECT_TRUE(
        matches(e.message(), "all_gather of 'latent' on rank 0: element count -1 is negative"))
        << e.message();
  });
}

TEST(Comm, UnderMpiFollowsOpenMpisEnvironment) {
  const char* keys[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK"};
  std::vector<std::string> saved;
  std::vector<bool> had;
  for (const char* k : keys) {
    const char* v = std::getenv(k);
    had.push_back(v != nullptr);
    saved.push_back(v ? v : "");
    unsetenv(k);
  }
  EXPECT_FALSE(under_mpi());
  setenv("PMIX_RANK", "0", 1);
  EXPECT_TRUE(under_mpi());
  unsetenv("PMIX_RANK");
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  EXPECT_TRUE(under_mpi());
  unsetenv("OMPI_COMM_WORLD_SIZE");
  for (size_t i = 0; i < 2; ++i)
    if (had[i]) setenv(keys[i], saved[i].c_str(), 1);
}

}  // namespace
}  // namespace laga
