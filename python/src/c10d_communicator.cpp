// The c10d backend (c10d_communicator.hpp): laga's raw non-blocking byte movement as gloo
// collectives on uint8 tensors made over the caller's buffers (at::from_blob: gloo rejects
// bfloat16, and bytes are all laga moves), completed by polling Work::isCompleted. Recording, the
// wait loop and the ordered reductions are the base class's (src/comm/communicator.cpp), which is
// why this backend gives the threads and MPI backends' bits. Not here: c10d's own reductions (gloo
// has no reduce_scatter, and its sums are in its own order) and gloo's point-to-point send/recv
// (their Work completes only inside wait(), which cannot be bounded by an abort).
//
//   raw operation   c10d call on the lane's group
//   all_gather      allgather into P views of the output (in place when send = recv + rank · bytes)
//   all_to_all      alltoall_base, equal splits
//   broadcast       broadcast from the root, in place
//   send_recv       alltoall_base with split sizes: bytes to rank+1 only, bytes from rank−1 only
//   barrier         barrier
// Zero-byte operations (every rank agrees on the byte count) and every operation at P = 1 complete
// at issue without a call.
//
// Deadlock freedom is c10d's issue-order matching: every rank issues the same operations in the
// same order per lane (the base class guarantees it), and each lane is its own group, whose worker
// threads run its operations in that order on every rank; the waits only poll.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1  // Debian's libtorch is built with gloo; its CMake config does not say so
#endif

#include "c10d_communicator.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "laga/core/error.hpp"

namespace laga {
namespace {

using Clock = std::chrono::steady_clock;
// How often a waiting rank reads the abort key: a TCPStore read is a round trip to its host.
constexpr auto kAbortPollInterval = std::chrono::milliseconds(10);

// The message of an exception from c10d or gloo, without c10's backtrace.
std::string error_text(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error& x) {
    return x.what_without_backtrace();
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

std::string error_text(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

// What a communicator and every group made from it (its splits, their splits, its first_ranks
// group) share on this rank: the abort key, and how new groups are made.
struct Family {
  c10::intrusive_ptr<c10d::Store> store;
  std::string abort_key;
  int world_rank = 0;  // this rank in the outermost group: names it in its abort
  std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
  std::chrono::milliseconds gloo_timeout{::kProcessGroupDefaultTimeout};
  int gloo_threads = 2;

  std::mutex m;
  bool aborted = false;
  int failed_rank = -1;  // -1: unknown (the store itself failed)
  std::string reason;
  Clock::time_point last_poll{};  // the epoch: the first check reads the key
  bool store_gone = false;        // a read failed: the store's host has left

  // Takes the key's value "<rank>\n<reason>" as the failure. Caller holds m.
  void adopt(const std::vector<uint8_t>& value) {
    const std::string s(value.begin(), value.end());
    const size_t nl = s.find('\n');
    aborted = true;
    failed_rank = nl == std::string::npos ? -1 : std::atoi(s.substr(0, nl).c_str());
    reason = nl == std::string::npos ? s : s.substr(nl + 1);
  }

  // True once the family is aborted: by this rank, or (read from the store when forced or at most
  // every kAbortPollInterval) by another.
  bool poll(bool force) {
    std::lock_guard lk(m);
    if (aborted) return true;
    const auto now = Clock::now();
    if (!force && now - last_poll < kAbortPollInterval) return false;
    last_poll = now;
    if (store_gone) return false;
    try {
      if (store->check({abort_key})) adopt(store->get(abort_key));
    } catch (const std::exception&) {
      // The store's host (rank 0 of a TCPStore) has left: it may simply have finished while this
      // rank's last collectives complete. Stop reading it; the collectives' own completion or
      // gloo's error (a peer's connection closed) decides, so no wait is left unbounded.
      store_gone = true;
    }
    return aborted;
  }

  // Marks the family aborted and writes the key; the first abort in the store names the failure.
  // Never throws.
  void abort(const std::string& why) noexcept {
    std::lock_guard lk(m);
    if (aborted) return;
    aborted = true;
    failed_rank = world_rank;
    reason = why;
    const std::string s = fmt::format("{}\n{}", world_rank, why);
    const std::vector<uint8_t> mine(s.begin(), s.end());
    try {
      std::vector<uint8_t> held;
      try {
        held = store->compareSet(abort_key, {}, mine);
      } catch (const c10::Error&) {  // a store without compareSet: the last abort wins
        store->set(abort_key, mine);
        held = mine;
      }
      if (held.empty()) store->set(abort_key, held = mine);
      if (held != mine) adopt(held);  // another rank aborted first
    } catch (...) {
      // The store cannot be written: this rank's own operations still fail, and the others' fail
      // when the connections of this rank's groups close.
    }
  }

  [[noreturn]] void throw_aborted(const std::string& what) {
    std::lock_guard lk(m);
    throw Error(ErrorKind::failure, __FILE__, __LINE__,
                failed_rank >= 0
                    ? fmt::format("rank {}: {} aborted: rank {} failed: {}", world_rank, what,
                                  failed_rank, reason)
                    : fmt::format("rank {}: {} aborted: {}", world_rank, what, reason));
  }
};

// n bytes at p as a uint8 tensor, without a copy. gloo only reads a send buffer.
at::Tensor bytes_tensor(const void* p, int64_t n) {
  return at::from_blob(const_cast<void*>(p), {n}, at::TensorOptions().dtype(at::kByte));
}

class C10dCommunicator final : public Communicator {
 public:
  // lane0: the caller's group, or null for a group this backend makes (split, first_ranks); the
  // groups are made by connect().
  C10dCommunicator(std::shared_ptr<Family> family, std::string prefix, int rank, int size,
                   c10::intrusive_ptr<c10d::ProcessGroup> lane0)
      : f_(std::move(family)), prefix_(std::move(prefix)), rank_(rank), size_(size) {
    lanes_[0] = std::move(lane0);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "c10d"; }
  void abort(const std::string& reason) override { f_->abort(reason); }

  // Makes the groups this communicator needs (none at P = 1): collective over its ranks, which
  // must all have arrived (sync) so that gloo's rendezvous does not wait unbounded.
  void connect() {
    if (size_ == 1) return;
    if (!lanes_[0]) lanes_[0] = make_group("lane0");
    lanes_[1] = make_group("lane1");
  }

  // An unrecorded barrier on lane 0, bounded by the timeout and ended by an abort.
  void sync(const std::string& what) {
    auto r = start_raw(RawOp{RawKind::barrier, nullptr, nullptr, 0, 0, 0, what});
    if (!r) return;
    const auto t0 = Clock::now();
    for (int polls = 0; !test_raw(*r); ++polls) {
      const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
      if (timeout_s_ > 0 && waited > timeout_s_) timed_out(*r);
      idle(polls, timeout_s_ > 0 ? timeout_s_ - waited : 0);
    }
  }

 protected:
  struct Request : RawRequest {
    c10::intrusive_ptr<c10d::Work> work;  // holds the tensors over the caller's buffers
    const char* call = "";
    int lane = 0;
  };

  std::unique_ptr<RawRequest> start_raw(const RawOp& op) override {
    if (f_->poll(false)) f_->throw_aborted(op.what);
    const int P = size_;
    if (P == 1) {
      local(op);
      return nullptr;
    }
    if (op.kind != RawKind::barrier && op.bytes == 0) return nullptr;
    auto r = std::make_unique<Request>();
    r->what = op.what;
    r->lane = op.lane;
    c10d::ProcessGroup& g = *lanes_[op.lane];
    const int64_t b = op.bytes;
    try {
      switch (op.kind) {
        case RawKind::all_gather: {
          r->call = "allgather";
          std::vector<at::Tensor> in{bytes_tensor(op.send, b)};
          std::vector<std::vector<at::Tensor>> out(1);
          for (int q = 0; q < P; ++q)
            out[0].push_back(bytes_tensor(static_cast<char*>(op.recv) + int64_t(q) * b, b));
          r->work = g.allgather(out, in);
          break;
        }
        case RawKind::all_to_all: {
          r->call = "alltoall_base";
          at::Tensor in = bytes_tensor(op.send, P * b), out = bytes_tensor(op.recv, P * b);
          std::vector<int64_t> out_splits, in_splits;  // empty: equal splits
          r->work = g.alltoall_base(out, in, out_splits, in_splits);
          break;
        }
        case RawKind::broadcast: {
          r->call = "broadcast";
          std::vector<at::Tensor> buf{bytes_tensor(op.recv, b)};
          c10d::BroadcastOptions o;
          o.rootRank = op.root;
          r->work = g.broadcast(buf, o);
          break;
        }
        case RawKind::send_recv: {
          // One ring hop as a collective (it stays non-blocking and is matched by issue order):
          // b bytes to rank+1, b bytes from rank−1, nothing to or from the others.
          r->call = "alltoall_base (ring hop)";
          std::vector<int64_t> out_splits(size_t(P), 0), in_splits(size_t(P), 0);
          in_splits[size_t((rank_ + 1) % P)] = b;
          out_splits[size_t((rank_ + P - 1) % P)] = b;
          at::Tensor in = bytes_tensor(op.send, b), out = bytes_tensor(op.recv, b);
          r->work = g.alltoall_base(out, in, out_splits, in_splits);
          break;
        }
        case RawKind::barrier:
          r->call = "barrier";
          r->work = g.barrier();
          break;
      }
    } catch (const std::exception& e) {
      throw Error(ErrorKind::failure, __FILE__, __LINE__,
                  fmt::format("rank {}: {}: c10d {} on lane {} failed to start: {}", rank_, op.what,
                              r->call, op.lane, error_text(e)));
    }
    return r;
  }

  // A complete operation stays complete when the group is aborted afterwards.
  bool test_raw(RawRequest& raw) override {
    auto& r = static_cast<Request&>(raw);
    if (!r.work) return true;
    if (r.work->isCompleted()) {
      const std::exception_ptr e = r.work->exception();
      r.work.reset();
      if (!e) return true;
      // A peer that aborted may also have broken gloo's connections: its reason is the news.
      if (f_->poll(true)) f_->throw_aborted(r.what);
      throw Error(ErrorKind::failure, __FILE__, __LINE__,
                  fmt::format("rank {}: {} failed in c10d {} on lane {}: {}", rank_, r.what, r.call,
                              r.lane, error_text(e)));
    }
    if (f_->poll(false)) f_->throw_aborted(r.what);
    return false;
  }

  // gloo's worker threads move the data: yield, then sleep briefly, leaving them the cores.
  void idle(int polls, double max_s) override {
    f_->poll(false);
    if (polls < 32) {
      std::this_thread::yield();
      return;
    }
    const double s = max_s > 0 ? std::min(100e-6, max_s) : 100e-6;
    std::this_thread::sleep_for(std::chrono::duration<double>(s));
  }

  // Aborts the family too, so the peers leave their waits instead of reaching their own timeouts.
  [[noreturn]] void timed_out(RawRequest& raw) override {
    auto& r = static_cast<Request&>(raw);
    const std::string message = fmt::format(
        "rank {}: {} timed out after {:g} s waiting for the other ranks (c10d {} on "
        "lane {}; c10d cannot tell which ranks are missing)",
        rank_, r.what, timeout_s_, r.call, r.lane);
    f_->abort(message);
    throw Error(ErrorKind::failure, __FILE__, __LINE__, message);
  }

  // No peer waits for the dropped operation: the abort ends theirs. gloo's worker may still hold
  // this rank's buffers until gloo ends the operation (c10d_communicator.hpp, Limits).
  void abandon(const std::string& reason) override { f_->abort(reason); }

  std::unique_ptr<Communicator> split_of(int color, int, int sub_rank, int sub_size) override {
    sync("split");
    auto c = std::make_unique<C10dCommunicator>(
        f_, fmt::format("{}/split{}/color{}", prefix_, groups_made_++, color), sub_rank, sub_size,
        c10::intrusive_ptr<c10d::ProcessGroup>());
    c->connect();
    return c;
  }

  std::unique_ptr<Communicator> first_ranks_of(int P) override {
    sync("first_ranks");
    const std::string prefix = fmt::format("{}/first{}", prefix_, groups_made_++);
    if (rank_ >= P) return nullptr;
    auto c = std::make_unique<C10dCommunicator>(f_, prefix, rank_, P,
                                                c10::intrusive_ptr<c10d::ProcessGroup>());
    c->set_timeout(timeout_s_);
    c->connect();
    return c;
  }

 private:
  // The operation at P = 1: this rank's own bytes.
  static void local(const RawOp& op) {
    if (op.bytes == 0 || op.kind == RawKind::broadcast || op.kind == RawKind::barrier) return;
    if (op.send != op.recv) std::memcpy(op.recv, op.send, size_t(op.bytes));
  }

  c10::intrusive_ptr<c10d::ProcessGroup> make_group(const std::string& lane) {
    auto options = c10d::ProcessGroupGloo::Options::create(f_->gloo_timeout);
    options->devices = f_->devices;
    options->threads = f_->gloo_threads;
    const std::string prefix = prefix_ + "/" + lane;
    try {
      return c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>(prefix, f_->store), rank_, size_, options);
    } catch (const std::exception& e) {
      throw Error(ErrorKind::failure, __FILE__, __LINE__,
                  fmt::format("rank {}: making the gloo group '{}' of {} ranks failed: {}", rank_,
                              prefix, size_, error_text(e)));
    }
  }

  std::shared_ptr<Family> f_;
  std::string prefix_;  // where this communicator's groups (and its splits') meet in the store
  int rank_, size_;
  c10::intrusive_ptr<c10d::ProcessGroup> lanes_[2];
  uint64_t groups_made_ = 0;  // splits and first_ranks so far: every rank makes them in one order
};

}  // namespace

std::unique_ptr<Communicator> make_c10d_communicator(c10::intrusive_ptr<c10d::ProcessGroup> pg,
                                                     c10::intrusive_ptr<c10d::Store> store,
                                                     const std::string& prefix, double timeout_s) {
  LAGA_CHECK(pg, "make_c10d_communicator: the process group is null; pass the group laga runs on");
  LAGA_CHECK(store, "make_c10d_communicator: the store is null; pass the group's store");
  LAGA_CHECK(timeout_s >= 0 && std::isfinite(timeout_s),
             "make_c10d_communicator: timeout {} s; try 0 (wait forever) or a positive count",
             timeout_s);
  const int P = pg->getSize(), me = pg->getRank();
  auto f = std::make_shared<Family>();
  f->store = store;
  f->abort_key = prefix + "/abort";
  f->world_rank = me;
  if (P > 1) {
    if (auto* gloo = dynamic_cast<c10d::ProcessGroupGloo*>(pg.get())) {
      const auto options = gloo->getOptions();
      f->devices = options->devices;
      f->gloo_timeout = options->timeout;
      f->gloo_threads = options->threads;
    } else {
      f->devices = {c10d::ProcessGroupGloo::createDefaultDevice()};
    }
  }
  // Keys of an earlier communicator would mislead gloo's rendezvous (stale addresses) and the abort
  // poll (a stale abort): every communicator gets its own prefix.
  const int64_t joined = store->add(prefix + "/members", 1);
  LAGA_CHECK(joined <= P,
             "make_c10d_communicator on rank {}: the store already holds a communicator under "
             "prefix '{}' ({} ranks joined a group of {}); pass a new prefix for each communicator",
             me, prefix, joined, P);
  auto c = std::make_unique<C10dCommunicator>(f, prefix, me, P, std::move(pg));
  c->set_timeout(timeout_s);
  c->sync("make_c10d_communicator");
  c->connect();
  return c;
}

}  // namespace laga
