// The threads backend: P ranks as std::threads of one process, several collectives in flight.
// Each rank's k-th raw operation on a lane meets the other ranks' k-th in slot k of that lane: a
// rank posts its buffers there when it issues the operation; the slot is ready once all P ranks
// have posted; then each rank copies its own data straight out of its peers' posted send buffers (a
// pull: a rank writes only its own output). A rank's operation is complete when it has read its
// data AND all P ranks have finished reading from the slot, so its send buffer is no longer needed.
// Not here: recording, reductions and the wait loop (communicator.cpp) and the MPI backend
// (mpi.cpp).
//
// Progress in every wait: any test (so any wait) first does this rank's pending reads for every
// slot it issued that is ready, on both lanes, in slot order — not only the awaited one — and the
// wait loop in communicator.cpp issues the second phases of this rank's all_reduces whose first
// phase completed. Why this cannot deadlock: suppose every rank still running is blocked in a wait.
// Take the lowest main-lane slot s that some rank has not completed. Every rank has posted s: a
// rank that had not issued s would be waiting on an operation issued before s (all complete) or on
// the second phase of an all_reduce whose first phase is before s, hence complete everywhere — so
// every rank issues that second phase in its waits, and likewise the lowest incomplete second-lane
// slot is posted by every rank. So the lowest incomplete slot of either lane is fully posted, every
// blocked rank does its reads for it (they are bounded memcpys), and then it is complete on every
// rank — a contradiction. Mismatched slots (ranks disagree on kind, bytes or root) are detected
// when the slot fills; nobody reads them, and every rank that waits on one fails naming both sides.
//
// Failure: abort() marks the group dead and wakes every waiter; every pending and later operation
// throws. Before a rank leaves a wait with an error it waits until no peer is in the middle of a
// copy (copies start only while the group is alive, outside the lock, and are bounded), so a
// buffer the caller frees afterwards is not being read.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <fmt/ranges.h>

#include "laga/comm/communicator.hpp"
#include "laga/core/error.hpp"
#include "laga/core/machine.hpp"

namespace laga {
namespace {

enum class Kind { all_gather, all_to_all, broadcast, barrier, send_recv };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::all_gather:
      return "all_gather";
    case Kind::all_to_all:
      return "all_to_all";
    case Kind::broadcast:
      return "broadcast";
    case Kind::barrier:
      return "barrier";
    case Kind::send_recv:
      return "send_recv";
  }
  return "unknown";
}

// What one rank brings to a raw operation. All ranks must agree on kind, bytes and root.
struct Post {
  const void* send = nullptr;
  void* recv = nullptr;
  Kind kind = Kind::barrier;
  int64_t bytes = 0;
  int root = 0;
  std::string what;  // the user-level collective, for the mismatch message
};

struct Slot {
  explicit Slot(int P) : posts(size_t(P)), has_read(size_t(P), 0) {}
  std::vector<Post> posts;
  int posted = 0;
  std::vector<char> has_read;
  int reads_done = 0;
  int completed = 0;  // ranks that observed completion: at P the slot is dropped
  bool checked = false;
  std::string mismatch;  // set when the full slot's posts disagree
};

constexpr int kLanes = 2;

struct Group;

// What a group and every sub-group split from it (and theirs) share: one lock, one condition
// variable and one abort flag. An abort anywhere — the world or any sub-group — marks the family
// dead and wakes every waiter of every group, so a rank blocked in one ring group leaves when a
// rank of another group (or of the parent) fails, and no rank hangs.
struct Family {
  std::mutex m;
  std::condition_variable cv;
  uint64_t version = 0;  // bumped (and cv notified) at every change in any group
  int reading = 0;       // copies in progress, outside the lock, in any group
  bool aborted = false;
  int failed_rank = -1;  // the failing rank's world rank
  std::string reason;
  // Sub-groups being made by a split: (parent group, its split count, color) -> the group and how
  // many of its ranks still have to take it.
  std::map<std::tuple<const Group*, uint64_t, int>, std::pair<std::shared_ptr<Group>, int>> forming;
};

struct Group {
  Group(int P, std::shared_ptr<Family> family) : P(P), f(std::move(family)) {
    for (auto& v : issued) v.assign(size_t(P), 0);
  }
  const int P;
  const std::shared_ptr<Family> f;
  std::map<uint64_t, Slot> slots[kLanes];  // node-based: a Slot does not move while in use
  std::vector<uint64_t> issued[kLanes];    // operations each rank has posted on each lane
};

class ThreadsCommunicator final : public Communicator {
 public:
  ThreadsCommunicator(std::shared_ptr<Group> group, int rank, int world_rank)
      : g_(std::move(group)), f_(*g_->f), rank_(rank), world_rank_(world_rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->P; }
  std::string backend() const override { return "threads"; }

  void abort(const std::string& reason) override {
    std::lock_guard lk(f_.m);
    mark_aborted(reason);
  }

 protected:
  // The sub-group's Group is made by the first of its ranks to arrive and taken by the others; no
  // rank waits here (the sub-group's collectives meet in its own slots).
  std::unique_ptr<Communicator> split_of(int color, int, int sub_rank, int sub_size) override {
    std::lock_guard lk(f_.m);
    if (f_.aborted) throw_aborted("split");
    const auto id = std::make_tuple(static_cast<const Group*>(g_.get()), splits_++, color);
    auto it = f_.forming.find(id);
    if (it == f_.forming.end())
      it =
          f_.forming.emplace(id, std::make_pair(std::make_shared<Group>(sub_size, g_->f), sub_size))
              .first;
    std::shared_ptr<Group> sub = it->second.first;
    LAGA_ASSERT(sub->P == sub_size,
                "rank {}: split of color {} into {} ranks, but another rank made it {}",
                world_rank_, color, sub_size, sub->P);
    if (--it->second.second == 0) f_.forming.erase(it);
    return std::make_unique<ThreadsCommunicator>(std::move(sub), sub_rank, world_rank_);
  }

  // Aborts, then waits out the copies in progress: afterwards nobody reads this rank's buffers.
  void abandon(const std::string& reason) override {
    std::unique_lock lk(f_.m);
    mark_aborted(reason);
    f_.cv.wait(lk, [&] { return f_.reading == 0; });
  }

  struct Request : RawRequest {
    int lane = 0;
    uint64_t slot = 0;
    bool done = false;  // tested complete (and counted in the slot's `completed`)
  };

  std::unique_ptr<RawRequest> start_raw(const RawOp& op) override {
    static constexpr Kind kinds[] = {Kind::all_gather, Kind::all_to_all, Kind::broadcast,
                                     Kind::barrier, Kind::send_recv};
    auto r = std::make_unique<Request>();
    r->what = op.what;
    r->lane = op.lane;
    std::lock_guard lk(f_.m);
    if (f_.aborted) throw_aborted(op.what);
    r->slot = g_->issued[op.lane][size_t(rank_)]++;
    Slot& s = g_->slots[op.lane].try_emplace(r->slot, g_->P).first->second;
    s.posts[size_t(rank_)] =
        Post{op.send, op.recv, kinds[int(op.kind)], op.bytes, op.root, op.what};
    ++s.posted;
    changed();
    return r;
  }

  bool test_raw(RawRequest& raw) override {
    auto& r = static_cast<Request&>(raw);
    if (r.done) return true;
    std::unique_lock lk(f_.m);
    do_reads(lk);
    Slot& s = g_->slots[r.lane].at(r.slot);
    if (s.posted == g_->P && !s.mismatch.empty()) {
      lk.unlock();
      LAGA_ASSERT(false, "rank {}: {}", rank_, s.mismatch);
    }
    seen_ = f_.version;
    // A complete operation stays complete when the group is aborted afterwards.
    if (!s.has_read[size_t(rank_)] || s.reads_done < g_->P) {
      if (f_.aborted) leave_aborted(lk, r.what);
      return false;
    }
    r.done = true;
    if (++s.completed == g_->P) g_->slots[r.lane].erase(r.slot);
    return true;
  }

  void idle(int, double max_s) override {
    std::unique_lock lk(f_.m);
    auto changed = [&] { return f_.version != seen_ || f_.aborted; };
    if (max_s > 0)
      f_.cv.wait_for(lk,
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(max_s)),
                     changed);
    else
      f_.cv.wait(lk, changed);
  }

  [[noreturn]] void timed_out(RawRequest& raw) override {
    auto& r = static_cast<Request&>(raw);
    std::unique_lock lk(f_.m);
    std::vector<int> missing;
    std::string doing;
    const Slot& s = g_->slots[r.lane].at(r.slot);
    if (s.posted < g_->P) {
      for (int q = 0; q < g_->P; ++q)
        if (g_->issued[r.lane][size_t(q)] <= r.slot) missing.push_back(q);
    } else {
      for (int q = 0; q < g_->P; ++q)
        if (!s.has_read[size_t(q)]) missing.push_back(q);
      doing = " to take its data";
    }
    const std::string message =
        fmt::format("rank {}: {} timed out after {:g} s waiting for rank{} {}{}", rank_, r.what,
                    timeout_s_, missing.size() > 1 ? "s" : "", fmt::join(missing, ", "), doing);
    // Abort under the same lock: no late rank may start reading our buffers after we have left.
    mark_aborted(message);
    f_.cv.wait(lk, [&] { return f_.reading == 0; });
    throw Error(ErrorKind::failure, __FILE__, __LINE__, message);
  }

 private:
  // Caller holds the lock.
  void changed() {
    ++f_.version;
    f_.cv.notify_all();
  }

  // Caller holds the lock. The first rank to abort names the failure; later calls change nothing.
  void mark_aborted(const std::string& reason) {
    if (!f_.aborted) {
      f_.aborted = true;
      f_.failed_rank = world_rank_;
      f_.reason = reason;
    }
    // No rank takes a forming sub-group after an abort (split_of throws), and each one holds the
    // family that holds it: drop them, or that cycle outlives the run (LeakSanitizer saw it).
    f_.forming.clear();
    changed();
  }

  [[noreturn]] void throw_aborted(const std::string& what) const {
    throw Error(ErrorKind::failure, __FILE__, __LINE__,
                fmt::format("rank {}: {} aborted: rank {} failed: {}", world_rank_, what,
                            f_.failed_rank, f_.reason));
  }

  // The group is aborted: wait out the copies in progress (bounded), then throw.
  [[noreturn]] void leave_aborted(std::unique_lock<std::mutex>& lk, const std::string& what) {
    f_.cv.wait(lk, [&] { return f_.reading == 0; });
    throw_aborted(what);
  }

  // Every rank reaches the same verdict on a full slot: it compares the same posts.
  static void check(Slot& s, int P) {
    if (s.checked) return;
    s.checked = true;
    const Post& p0 = s.posts[0];
    for (int q = 1; q < P && s.mismatch.empty(); ++q) {
      const Post& p = s.posts[size_t(q)];
      if (p.kind != p0.kind || p.bytes != p0.bytes || p.root != p0.root)
        s.mismatch = fmt::format(
            "ranks disagree on the collective: rank 0 runs {} ({}, {} bytes, root {}), rank {} "
            "runs {} ({}, {} bytes, "
            "root {})",
            p0.what, kind_name(p0.kind), p0.bytes, p0.root, q, p.what, kind_name(p.kind), p.bytes,
            p.root);
    }
  }

  // This rank's reads for every ready slot it issued, per lane in slot order (readiness is
  // monotone: all ranks post in order, so if slot k+1 is full, so is k). Copies run outside the
  // lock; lk is held again on return.
  void do_reads(std::unique_lock<std::mutex>& lk) {
    for (int lane = 0; lane < kLanes; ++lane) {
      for (;;) {
        const uint64_t k = read_upto_[lane];
        if (f_.aborted || k >= g_->issued[lane][size_t(rank_)]) break;
        Slot& s = g_->slots[lane].at(k);
        if (s.posted < g_->P) break;
        check(s, g_->P);
        ++read_upto_[lane];
        if (!s.mismatch.empty()) continue;  // nobody reads it; its waiters fail
        ++f_.reading;
        lk.unlock();
        copy(s);
        lk.lock();
        --f_.reading;
        s.has_read[size_t(rank_)] = 1;
        ++s.reads_done;
        changed();
      }
    }
  }

  // This rank's data out of the full slot s. The posts are immutable once the slot is full.
  void copy(const Slot& s) const {
    const Post& me = s.posts[size_t(rank_)];
    const int64_t b = me.bytes;
    if (b == 0) return;
    switch (me.kind) {
      case Kind::all_gather:
        for (int q = 0; q < g_->P; ++q) {
          char* dst = static_cast<char*>(me.recv) + int64_t(q) * b;
          if (s.posts[size_t(q)].send != dst) std::memcpy(dst, s.posts[size_t(q)].send, size_t(b));
        }
        break;
      case Kind::all_to_all:
        for (int q = 0; q < g_->P; ++q)
          std::memcpy(static_cast<char*>(me.recv) + int64_t(q) * b,
                      static_cast<const char*>(s.posts[size_t(q)].send) + int64_t(rank_) * b,
                      size_t(b));
        break;
      case Kind::broadcast:
        if (rank_ != me.root) std::memcpy(me.recv, s.posts[size_t(me.root)].send, size_t(b));
        break;
      case Kind::send_recv:  // from the rank before this one on the ring (itself at P = 1)
        std::memcpy(me.recv, s.posts[size_t((rank_ + g_->P - 1) % g_->P)].send, size_t(b));
        break;
      case Kind::barrier:
        break;
    }
  }

  std::shared_ptr<Group> g_;
  Family& f_;  // g_->f's: kept alive by g_
  int rank_;
  int world_rank_;  // this rank in the run_threads group (names the failing rank)
  // splits of this communicator so far: every rank of it splits in the same order
  uint64_t splits_ = 0;
  uint64_t read_upto_[kLanes] = {0, 0};  // this rank's next slot to read, per lane
  uint64_t seen_ = 0;                    // f_.version at this rank's last test
};

}  // namespace

std::unique_ptr<Communicator> one_rank_communicator() {
  return std::make_unique<ThreadsCommunicator>(std::make_shared<Group>(1, std::make_shared<Family>()),
                                               0, 0);
}

void run_threads(int P, const std::function<void(Communicator&)>& fn, double timeout_s) {
  LAGA_CHECK(P >= 1, "run_threads: {} ranks; try 1, 2, 4, 8", P);
  LAGA_CHECK(timeout_s >= 0,
             "run_threads: timeout {} s is negative; try 0 (wait forever) or a positive count",
             timeout_s);
  auto group = std::make_shared<Group>(P, std::make_shared<Family>());
  Family& family = *group->f;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(P));
  const int omp_threads = std::max(1, usable_cores() / P);  // the ranks share this process's cores
  std::vector<std::thread> threads;
  threads.reserve(size_t(P));
  for (int r = 0; r < P; ++r) {
    threads.emplace_back([&, r] {
      omp_set_num_threads(omp_threads);
      ThreadsCommunicator comm(group, r, r);
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
  if (family.failed_rank >= 0 && errors[family.failed_rank])
    std::rethrow_exception(errors[family.failed_rank]);
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  if (family.aborted)
    throw Error(ErrorKind::failure, __FILE__, __LINE__,
                fmt::format("run_threads: rank {} aborted the group: {}", family.failed_rank,
                            family.reason));
}

}  // namespace laga
