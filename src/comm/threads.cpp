// The threads backend: P ranks as std::threads of one process. Each collective is two barriers
// over a shared group state: at the first every rank publishes its buffer and what it is doing;
// between them each rank copies what it needs straight out of its peers' buffers; the second keeps
// those buffers alive until every peer has finished reading. Not here: recording and reductions
// (communicator.cpp) and the MPI backend (mpi.cpp).
//
// Failure: abort() marks the group dead and wakes every waiter; a rank waiting in, or entering, the
// first barrier throws. The second barrier is deliberately uninterruptible: a rank only reaches it
// after the first barrier saw all P ranks, and the work between them is bounded (memcpy), so it
// cannot hang — and leaving it early could free a buffer a peer is still reading.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/ranges.h>

#include "laga/comm/communicator.hpp"
#include "laga/core/error.hpp"

namespace laga {
namespace {

enum class Kind { all_gather, all_to_all, broadcast, barrier };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::all_gather: return "all_gather";
    case Kind::all_to_all: return "all_to_all";
    case Kind::broadcast: return "broadcast";
    case Kind::barrier: return "barrier";
  }
  return "unknown";
}

// What one rank brings to a collective. All ranks must agree on kind, bytes and root.
struct Post {
  const void* send = nullptr;
  Kind kind = Kind::barrier;
  int64_t bytes = 0;
  int root = 0;
  std::string what;  // the user-level collective, for the mismatch message
};

struct Group {
  explicit Group(int P) : P(P), posts(size_t(P)), entered(size_t(P), 0) {}
  const int P;
  std::mutex m;
  std::condition_variable cv;
  std::vector<Post> posts;
  std::vector<uint64_t> entered;  // collectives each rank has entered: who is missing after a timeout
  int arrived = 0;                // at the first barrier of the current generation
  uint64_t generation = 0;
  int finished = 0;  // at the second barrier
  uint64_t release = 0;
  bool aborted = false;
  int failed_rank = -1;
  std::string reason;
};

class ThreadsCommunicator final : public Communicator {
 public:
  ThreadsCommunicator(std::shared_ptr<Group> group, int rank) : g_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->P; }
  std::string backend() const override { return "threads"; }

  void abort(const std::string& reason) override {
    std::lock_guard lk(g_->m);
    mark_aborted(reason);
  }

 protected:
  void do_all_gather(const void* in, void* out, int64_t bytes) override {
    exchange(Post{in, Kind::all_gather, bytes, 0, current_collective()}, [&](const Group& g) {
      for (int q = 0; q < g.P; ++q) {
        char* dst = static_cast<char*>(out) + int64_t(q) * bytes;
        if (bytes > 0 && g.posts[q].send != dst) std::memcpy(dst, g.posts[q].send, size_t(bytes));
      }
    });
  }

  void do_all_to_all(const void* in, void* out, int64_t bytes_per_peer) override {
    exchange(Post{in, Kind::all_to_all, bytes_per_peer, 0, current_collective()}, [&](const Group& g) {
      if (bytes_per_peer == 0) return;
      for (int q = 0; q < g.P; ++q)
        std::memcpy(static_cast<char*>(out) + int64_t(q) * bytes_per_peer,
                    static_cast<const char*>(g.posts[q].send) + int64_t(rank_) * bytes_per_peer,
                    size_t(bytes_per_peer));
    });
  }

  void do_broadcast(void* buf, int64_t bytes, int root) override {
    exchange(Post{buf, Kind::broadcast, bytes, root, current_collective()}, [&](const Group& g) {
      if (rank_ != root && bytes > 0) std::memcpy(buf, g.posts[root].send, size_t(bytes));
    });
  }

  void do_barrier() override {
    exchange(Post{nullptr, Kind::barrier, 0, 0, current_collective()}, [](const Group&) {});
  }

 private:
  // Caller holds the lock. The first rank to abort names the failure; later calls change nothing.
  void mark_aborted(const std::string& reason) {
    if (!g_->aborted) {
      g_->aborted = true;
      g_->failed_rank = rank_;
      g_->reason = reason;
    }
    g_->cv.notify_all();
  }

  [[noreturn]] void throw_aborted() const {
    throw Error(ErrorKind::failure, __FILE__, __LINE__,
                fmt::format("rank {}: {} aborted: rank {} failed: {}", rank_, current_collective(), g_->failed_rank,
                            g_->reason));
  }

  template <class Copy>
  void exchange(Post post, Copy copy) {
    enter(std::move(post));
    // Every rank read the same posts, so every rank reaches the same verdict.
    std::string mismatch;
    const Post& p0 = g_->posts[0];
    for (int q = 1; q < g_->P && mismatch.empty(); ++q) {
      const Post& p = g_->posts[q];
      if (p.kind != p0.kind || p.bytes != p0.bytes || p.root != p0.root)
        mismatch = fmt::format("ranks disagree on the collective: rank 0 runs {} ({}, {} bytes, root {}), rank {} runs "
                               "{} ({}, {} bytes, root {})",
                               p0.what, kind_name(p0.kind), p0.bytes, p0.root, q, p.what, kind_name(p.kind), p.bytes,
                               p.root);
    }
    if (mismatch.empty()) copy(*g_);
    leave();
    LAGA_ASSERT(mismatch.empty(), "rank {}: {}", rank_, mismatch);
  }

  // The first barrier: publish, then wait for all P ranks, an abort, or the timeout.
  void enter(Post post) {
    std::unique_lock lk(g_->m);
    if (g_->aborted) throw_aborted();
    g_->posts[rank_] = std::move(post);
    ++g_->entered[rank_];
    const uint64_t gen = g_->generation;
    if (++g_->arrived == g_->P) {
      g_->arrived = 0;
      ++g_->generation;
      g_->cv.notify_all();
      return;
    }
    auto done = [&] { return g_->generation != gen || g_->aborted; };
    if (timeout_s_ > 0) {
      const auto limit = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(timeout_s_));
      if (!g_->cv.wait_for(lk, limit, done)) {
        std::vector<int> missing;
        for (int q = 0; q < g_->P; ++q)
          if (g_->entered[q] < g_->entered[rank_]) missing.push_back(q);
        const std::string message = fmt::format("rank {}: {} timed out after {:g} s waiting for rank{} {}", rank_,
                                                current_collective(), timeout_s_, missing.size() > 1 ? "s" : "",
                                                fmt::join(missing, ", "));
        // Abort under the same lock: no late rank may complete this barrier and read our buffer
        // after we have left it.
        mark_aborted(message);
        throw Error(ErrorKind::failure, __FILE__, __LINE__, message);
      }
    } else {
      g_->cv.wait(lk, done);
    }
    if (g_->generation == gen) throw_aborted();
  }

  // The second barrier: uninterruptible (see the top of the file).
  void leave() {
    std::unique_lock lk(g_->m);
    const uint64_t rel = g_->release;
    if (++g_->finished == g_->P) {
      g_->finished = 0;
      ++g_->release;
      g_->cv.notify_all();
      return;
    }
    g_->cv.wait(lk, [&] { return g_->release != rel; });
  }

  std::shared_ptr<Group> g_;
  int rank_;
};

}  // namespace

void run_threads(int P, const std::function<void(Communicator&)>& fn, double timeout_s) {
  LAGA_CHECK(P >= 1, "run_threads: {} ranks; try 1, 2, 4, 8", P);
  LAGA_CHECK(timeout_s >= 0, "run_threads: timeout {} s is negative; try 0 (wait forever) or a positive count",
             timeout_s);
  auto group = std::make_shared<Group>(P);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(P));
  const int omp_threads = std::max(1, int(std::thread::hardware_concurrency()) / P);
  std::vector<std::thread> threads;
  threads.reserve(size_t(P));
  for (int r = 0; r < P; ++r) {
    threads.emplace_back([&, r] {
      omp_set_num_threads(omp_threads);
      ThreadsCommunicator comm(group, r);
      comm.set_timeout(timeout_s);
      try {
        fn(comm);
      } catch (const std::exception& e) {
        errors[r] = std::current_exception();
        comm.abort(e.what());
      } catch (...) {
        errors[r] = std::current_exception();
        comm.abort("an exception that is not a std::exception");
      }
    });
  }
  for (auto& t : threads) t.join();
  // The first rank to fail caused the others' "aborted" errors: rethrow its own.
  if (group->failed_rank >= 0 && errors[group->failed_rank]) std::rethrow_exception(errors[group->failed_rank]);
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  if (group->aborted)
    throw Error(ErrorKind::failure, __FILE__, __LINE__,
                fmt::format("run_threads: rank {} aborted the group: {}", group->failed_rank, group->reason));
}

}  // namespace laga
