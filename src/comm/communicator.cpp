// The backend-independent half of the Communicator: argument checks at the boundary, the timing and
// recording of every collective in the Ledger, the non-blocking machinery (handles, the wait loop
// that drives every collective in flight, the ordered second phases of all_reduce), the reductions
// built on raw byte movement (so every backend sums in the same order and gives bitwise the same
// results), and the configuration check. Not here: moving bytes between ranks (threads.cpp,
// mpi.cpp, no_peers.cpp). The accounting formulas are in communicator.hpp and docs/design.md §4.
#include "laga/comm/communicator.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/ranges.h>

#include "laga/core/error.hpp"
#include "laga/core/work.hpp"
#include "laga/core/memory.hpp"

namespace laga {

namespace {

// Communication scratch: bytes from the caching allocator (core/memory.hpp), outside every tracker,
// and never zero-filled: every byte is written by the collective before it is read, so a fill would
// be pure cost, and blocks reused from the allocator's cache take no first-touch page faults on a
// collective's repeated calls (the gradient sync's every step).
class ScratchBytes {
 public:
  ScratchBytes() = default;
  ScratchBytes(const ScratchBytes&) = delete;
  ScratchBytes& operator=(const ScratchBytes&) = delete;
  ~ScratchBytes() { free(); }
  // n bytes of unspecified content; throws when the OS has none.
  void allocate(size_t n) {
    free();
    if (n == 0) return;
    data_ = static_cast<char*>(pool_allocate(n));
    LAGA_CHECK(data_, "communication scratch of {} bytes: out of memory", n);
    size_ = n;
  }
  void free() {
    if (data_) pool_release(data_, size_);
    data_ = nullptr, size_ = 0;
  }
  char* data() const { return data_; }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

std::string_view collective_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::all_to_all:
      return "all_to_all";
    case CollectiveOp::all_gather:
      return "all_gather";
    case CollectiveOp::reduce_scatter:
      return "reduce_scatter";
    case CollectiveOp::all_reduce:
      return "all_reduce";
    case CollectiveOp::barrier:
      return "barrier";
    case CollectiveOp::broadcast:
      return "broadcast";
    case CollectiveOp::send_recv:
      return "send_recv";
  }
  return "unknown";
}

int64_t Ledger::tensor_bytes(const std::function<bool(const CollectiveRecord&)>& filter) const {
  int64_t total = 0;
  for (const auto& r : records_)
    if (!filter || filter(r)) total += r.tensor_bytes;
  return total;
}

int64_t Ledger::wire_bytes(const std::function<bool(const CollectiveRecord&)>& filter) const {
  int64_t total = 0;
  for (const auto& r : records_)
    if (!filter || filter(r)) total += r.wire_bytes;
  return total;
}

double Ledger::seconds(const std::function<bool(const CollectiveRecord&)>& filter) const {
  double total = 0;
  for (const auto& r : records_)
    if (!filter || filter(r)) total += r.seconds;
  return total;
}

double Ledger::wait_seconds(const std::function<bool(const CollectiveRecord&)>& filter) const {
  double total = 0;
  for (const auto& r : records_)
    if (!filter || filter(r)) total += r.wait_s;
  return total;
}

void Ledger::clear() {
  records_.clear();
  epoch_ = std::chrono::steady_clock::now();
  ++generation_;
}

double Ledger::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_).count();
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void check_count(const Communicator& c, std::string_view op, const std::string& tensor, int64_t n,
                 const void* a, const void* b) {
  LAGA_CHECK(n >= 0, "{} of '{}' on rank {}: element count {} is negative", op, tensor, c.rank(),
             n);
  // A communicator that moves no data (meta) plans with buffers that need not exist.
  LAGA_CHECK(n == 0 || !c.moves_data() || (a && b),
             "{} of '{}' on rank {}: null buffer for {} elements", op, tensor, c.rank(), n);
}

bool overlaps(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + uint64_t(b_bytes) && pb < pa + uint64_t(a_bytes);
}

// out [n] = Σ_j chunk_j [n] over j = 0 .. P−1 in that order, in fp32, rounded once to T. Blocks of
// kBlock elements keep the fp32 partial sums in cache; every element's order of additions is fixed.
template <class T>
void sum_chunks(const T* chunks, T* out, int64_t n, int P) {
  constexpr int64_t kBlock = 2048;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n * P > (int64_t(1) << 16))
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t i0 = blk * kBlock, len = std::min(kBlock, n - i0);
    float acc[kBlock];
    for (int64_t i = 0; i < len; ++i) acc[i] = to_float(chunks[i0 + i]);
    for (int j = 1; j < P; ++j) {
      const T* c = chunks + int64_t(j) * n + i0;
      for (int64_t i = 0; i < len; ++i) acc[i] += to_float(c[i]);
    }
    for (int64_t i = 0; i < len; ++i) out[i0 + i] = from_float<T>(acc[i]);
  }
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

}  // namespace

namespace detail {

// One collective in flight on one rank: its raw operation(s), its scratch, and where its ledger
// record is. Owned by the CollectiveHandle, so its address is stable while the handle moves.
struct PendingCollective {
  Communicator* comm = nullptr;
  CollectiveOp op = CollectiveOp::barrier;
  std::string tensor;
  std::string what;  // "all_gather of 'latent'"
  DType dtype = DType::f32;
  std::unique_ptr<Communicator::RawRequest> raw;  // the phase in flight; null when none is
  // 0: one phase (all_gather, all_to_all, broadcast, barrier, reduce_scatter);
  // 1, 2: all_reduce's reduce-scatter, then its all_gather (issued by advance_queue).
  int phase = 0;
  bool done = false;
  // reduce_scatter and all_reduce: the P chunks received, summed at the end of the phase into out
  // (reduce_scatter) or mine (all_reduce). Communication scratch, not tensors: outside the tracking
  // allocator.
  ScratchBytes received;
  void* out = nullptr;
  int64_t n = 0;  // elements per chunk
  // all_reduce: the zero-padded copy of buf when P does not divide it, this rank's sums, where the
  // gathered sums land (buf or scratch), and the caller's buffer.
  ScratchBytes scratch, mine;
  void* whole = nullptr;
  void* buf = nullptr;
  int64_t bytes = 0;
  // The ledger record filled in at completion (when recorded and the ledger was not cleared since).
  bool recorded = false;
  size_t index = 0;
  uint64_t generation = 0;
  std::chrono::steady_clock::time_point call_t0;  // entry of the start/wait/test call now running
  double wait_s = 0;                              // blocked in earlier calls
};

}  // namespace detail

CollectiveHandle::CollectiveHandle() = default;
CollectiveHandle::CollectiveHandle(CollectiveHandle&& o) noexcept = default;
CollectiveHandle& CollectiveHandle::operator=(CollectiveHandle&& o) noexcept {
  if (this != &o) {
    settle();
    p_ = std::move(o.p_);
  }
  return *this;
}
CollectiveHandle::~CollectiveHandle() { settle(); }

// Never throws. During stack unwinding the rank is failing anyway: waiting could block on peers
// that wait for this rank's later collectives, so the collective is abandoned instead.
void CollectiveHandle::settle() noexcept {
  if (!p_) return;
  Communicator* c = p_->comm;
  auto abort_quietly = [&](const std::string& reason) {
    try {
      c->abort(reason);
    } catch (...) {
    }
  };
  if (std::uncaught_exceptions() > 0 && !p_->done) {
    try {
      c->abandon(fmt::format("rank {}: {} was abandoned while an error unwound the stack",
                             c->rank(), p_->what));
    } catch (...) {
    }
    c->forget(p_.get());
    p_.reset();
    return;
  }
  try {
    c->wait(*this);
  } catch (const std::exception& e) {
    abort_quietly(e.what());
  } catch (...) {
    abort_quietly("an exception that is not a std::exception");
  }
  if (p_) {
    c->forget(p_.get());
    p_.reset();
  }
}

Communicator::Communicator() = default;
Communicator::~Communicator() = default;

void Communicator::block_raw(RawRequest& r) {
  for (int polls = 0; !test_raw(r); ++polls) idle(polls, 0);
}

std::unique_ptr<Communicator> Communicator::first_ranks_of(int P) {
  LAGA_FAIL_USAGE(
      "the {} backend has no sub-groups of its {} ranks; start a new group of {} ranks instead "
      "(run_threads({}, ...), or laga's --sp {})",
      backend(), size(), P, P, P);
}

std::unique_ptr<Communicator> Communicator::split_of(int, int, int, int) {
  LAGA_FAIL_USAGE("the {} backend cannot split its group of {} ranks into sub-groups", backend(),
                  size());
}

std::unique_ptr<Communicator> Communicator::split(
    const std::function<SplitKey(int rank)>& color_key) {
  const int P = size(), me = rank();
  const SplitKey mine = color_key(me);
  LAGA_CHECK(mine.color >= 0, "split on rank {}: color {} is negative; colors are 0 or more", me,
             mine.color);
  // This rank's place among the ranks of its color, ordered by (key, rank), as MPI_Comm_split
  // orders them.
  int sub_rank = 0, sub_size = 0;
  std::vector<std::pair<int, int>> members;  // (key, rank) of this color's ranks
  for (int q = 0; q < P; ++q) {
    const SplitKey k = color_key(q);
    if (k.color != mine.color) continue;
    ++sub_size;
    members.emplace_back(k.key, q);
    if (k.key < mine.key || (k.key == mine.key && q < me)) ++sub_rank;
  }
  std::sort(members.begin(), members.end());
  auto group = std::make_shared<std::vector<int>>();
  for (const auto& [key, q] : members) group->push_back(group_ ? (*group_)[size_t(q)] : q);
  auto c = split_of(mine.color, mine.key, sub_rank, sub_size);
  LAGA_ASSERT(c && c->size() == sub_size && c->rank() == sub_rank,
              "split on rank {}: the backend made rank {} of {}, "
              "expected rank {} of {}",
              me, c ? c->rank() : -1, c ? c->size() : -1, sub_rank, sub_size);
  c->led_ = led_;
  c->group_ = std::move(group);
  c->set_timeout(timeout_s_);
  return c;
}

void Communicator::forget(Pending* p) {
  auto it = std::find(queue_.begin(), queue_.end(), p);
  if (it != queue_.end()) queue_.erase(it);
}

// Fills in the ledger record: completion observed now, inside the call that began at call_t0.
void Communicator::complete(Pending& p) {
  p.done = true;
  Ledger& led = *led_;
  if (!p.recorded || p.generation != led.generation_) return;
  CollectiveRecord& r = led.records_[p.index];
  r.completed_s = led.now();
  r.seconds = r.completed_s - r.issued_s;
  r.wait_s = std::min(r.seconds, p.wait_s + seconds_since(p.call_t0));
}

// The second phases of all_reduce, issued in the all_reduces' issue order on every rank whatever
// order their handles are waited in: the front's first phase must complete before any later one's
// second phase is issued. Non-blocking.
void Communicator::advance_queue() {
  while (!queue_.empty()) {
    Pending& f = *queue_.front();
    if (f.raw) {
      if (!test_raw(*f.raw)) return;
      f.raw.reset();
    }
    const int P = size();
    const int64_t es = dtype_size(f.dtype);
    if (moves_data())
      dispatch_dtype(f.dtype, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        sum_chunks(reinterpret_cast<const T*>(f.received.data()),
                   reinterpret_cast<T*>(f.mine.data()), f.n, P);
      });
    // If this start throws (the group is aborted), f stays at the front in phase 1 and the next
    // attempt sums again from the unchanged chunks.
    f.raw = start_raw(RawOp{RawKind::all_gather, moves_data() ? f.mine.data() : nullptr, f.whole,
                            f.n * es, 0, 1, f.what});
    f.received.free();
    f.phase = 2;
    queue_.pop_front();
  }
}

// Non-blocking progress on p alone; true (and the record filled in) once it is done.
bool Communicator::step(Pending& p) {
  if (p.done) return true;
  if (p.phase == 1) return false;  // advance_queue moves it on
  if (p.raw) {
    if (!test_raw(*p.raw)) return false;
    p.raw.reset();
  }
  if (moves_data()) {
    if (p.op == CollectiveOp::reduce_scatter) {
      dispatch_dtype(p.dtype, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        sum_chunks(reinterpret_cast<const T*>(p.received.data()), static_cast<T*>(p.out), p.n,
                   size());
      });
      p.received.free();
    } else if (p.op == CollectiveOp::all_reduce && p.whole != p.buf && p.bytes > 0) {
      std::memcpy(p.buf, p.whole, size_t(p.bytes));  // the padding never leaves the scratch
    }
  }
  complete(p);
  return true;
}

// Blocks until p is done, bounded by the timeout, driving every collective in flight meanwhile.
void Communicator::drive(Pending& p) {
  const auto t0 = Clock::now();
  for (int polls = 0;; ++polls) {
    advance_queue();
    if (step(p)) return;
    // Without a timeout the backend may block in its own way (MPI_Waitall) on the gate: the queue's
    // front when there is one (every later second phase waits for it; the MPI library progresses
    // everything else meanwhile), else p itself.
    if (timeout_s_ <= 0) {
      RawRequest* gate = !queue_.empty() ? queue_.front()->raw.get() : p.raw.get();
      if (gate) {
        block_raw(*gate);
        continue;
      }
    }
    const double waited = seconds_since(t0);
    if (timeout_s_ > 0 && waited > timeout_s_) {
      // p waits for the queue's front (its own first phase or an earlier all_reduce's) or itself.
      RawRequest* stuck =
          p.phase == 1 && queue_.front()->raw ? queue_.front()->raw.get() : p.raw.get();
      LAGA_ASSERT(stuck, "rank {}: {} timed out with nothing in flight", rank(), p.what);
      timed_out(*stuck);
    }
    idle(polls, timeout_s_ > 0 ? timeout_s_ - waited : 0);
  }
}

void Communicator::wait(CollectiveHandle& h) {
  if (!h.p_) return;
  Pending& p = *h.p_;
  LAGA_CHECK(
      p.comm == this,
      "rank {}: wait on the handle of {}, which another communicator started; wait on that one",
      rank(), p.what);
  p.call_t0 = Clock::now();
  // A failed wait abandons the collective (the group is down: aborted, or the job is ending), so
  // the handle is emptied either way and its destructor does not wait again.
  try {
    drive(p);
  } catch (...) {
    forget(&p);
    h.p_.reset();
    throw;
  }
  if (p.recorded && p.generation == led_->generation_) note_collective_wait(int64_t(p.index));
  h.p_.reset();
}

bool Communicator::test(CollectiveHandle& h) {
  if (!h.p_) return true;
  Pending& p = *h.p_;
  LAGA_CHECK(
      p.comm == this,
      "rank {}: test on the handle of {}, which another communicator started; test on that one",
      rank(), p.what);
  p.call_t0 = Clock::now();
  bool done = false;
  try {
    advance_queue();
    done = step(p);
  } catch (...) {
    forget(&p);
    h.p_.reset();
    throw;
  }
  if (!done) p.wait_s += seconds_since(p.call_t0);
  return done;
}

// Starts p's first raw operation, appends its record, and completes it at once if it already is.
CollectiveHandle Communicator::issue(std::unique_ptr<Pending> p, const RawOp& op,
                                     int64_t tensor_bytes, int64_t wire_bytes) {
  p->comm = this;
  Ledger& led = *led_;
  const double issued = led.now();
  p->raw = start_raw(op);
  if (p->recorded) {
    p->index = led.records_.size();
    p->generation = led.generation_;
    CollectiveRecord r{p->op, p->tensor, p->dtype, 0, tensor_bytes, size() == 1 ? 0 : wire_bytes};
    r.issued_s = issued;
    r.group = group_;
    led.records_.push_back(std::move(r));
    note_collective_issue(int64_t(p->index));
  }
  if (p->phase == 1) queue_.push_back(p.get());
  if (!moves_data()) advance_queue();  // completes at once
  if (!p->raw && p->phase != 1) step(*p);
  if (!p->done) p->wait_s = seconds_since(p->call_t0);
  CollectiveHandle h;
  h.p_ = std::move(p);
  return h;
}

namespace {

std::unique_ptr<detail::PendingCollective> pending(CollectiveOp op, const std::string& tensor,
                                                   DType dtype) {
  auto p = std::make_unique<detail::PendingCollective>();
  p->op = op;
  p->tensor = tensor;
  p->what = fmt::format("{} of '{}'", collective_name(op), tensor);
  p->dtype = dtype;
  p->recorded = true;
  p->call_t0 = Clock::now();
  return p;
}

}  // namespace

CollectiveHandle Communicator::all_gather_start(const void* in, void* out, int64_t n, DType dtype,
                                                const std::string& tensor) {
  check_count(*this, "all_gather", tensor, n, in, out);
  const int P = size();
  const int64_t shard = n * dtype_size(dtype);
  // Compared as addresses: a meta communicator's buffers are null, and null + offset is undefined.
  const bool in_place = reinterpret_cast<uintptr_t>(in) ==
                        reinterpret_cast<uintptr_t>(out) + uint64_t(rank() * shard);
  LAGA_CHECK(!moves_data() || in_place || !overlaps(in, shard, out, P * shard),
             "all_gather of '{}' on rank {}: input overlaps the output without being its chunk {} "
             "(in place)",
             tensor, rank(), rank());
  auto p = pending(CollectiveOp::all_gather, tensor, dtype);
  const RawOp op{RawKind::all_gather, in, out, shard, 0, 0, p->what};
  return issue(std::move(p), op, shard, int64_t(P - 1) * shard);
}

CollectiveHandle Communicator::all_to_all_start(const void* in, void* out, int64_t n, DType dtype,
                                                const std::string& tensor) {
  check_count(*this, "all_to_all", tensor, n, in, out);
  const int P = size();
  const int64_t chunk = n * dtype_size(dtype);
  LAGA_CHECK(!moves_data() || !overlaps(in, P * chunk, out, P * chunk),
             "all_to_all of '{}' on rank {}: input and output overlap", tensor, rank());
  auto p = pending(CollectiveOp::all_to_all, tensor, dtype);
  const RawOp op{RawKind::all_to_all, in, out, chunk, 0, 0, p->what};
  return issue(std::move(p), op, P * chunk, int64_t(P - 1) * chunk);
}

// out [n] = Σ_j (chunk this rank received from rank j): an all_to_all into scratch, summed when
// this rank observes its completion.
CollectiveHandle Communicator::reduce_scatter_start(const void* in, void* out, int64_t n,
                                                    DType dtype, const std::string& tensor) {
  check_count(*this, "reduce_scatter", tensor, n, in, out);
  const int P = size();
  const int64_t shard = n * dtype_size(dtype);
  auto p = pending(CollectiveOp::reduce_scatter, tensor, dtype);
  p->out = out;
  p->n = n;
  if (moves_data()) p->received.allocate(size_t(P * shard));
  const RawOp op{
      RawKind::all_to_all, in, moves_data() ? p->received.data() : nullptr, shard, 0, 0, p->what};
  return issue(std::move(p), op, shard, int64_t(P - 1) * shard);
}

CollectiveHandle Communicator::all_reduce_start(void* buf, int64_t n, DType dtype,
                                                const std::string& tensor) {
  check_count(*this, "all_reduce", tensor, n, buf, buf);
  const int P = size();
  const int64_t es = dtype_size(dtype), bytes = n * es;
  auto p = pending(CollectiveOp::all_reduce, tensor, dtype);
  // Chunks of c = ⌈n/P⌉ elements; when P does not divide n the buffer is zero-padded to P·c in
  // scratch, and the padding never leaves it.
  const int64_t c = (n + P - 1) / P;
  const bool padded = c * P != n;
  p->phase = 1;
  p->n = c;
  p->buf = buf;
  p->bytes = bytes;
  p->whole = buf;
  if (moves_data()) {
    if (padded) {
      p->scratch.allocate(size_t(P * c * es));
      if (bytes > 0) std::memcpy(p->scratch.data(), buf, size_t(bytes));
      std::memset(p->scratch.data() + bytes, 0, size_t(P * c * es - bytes));  // the zero padding
      p->whole = p->scratch.data();
    }
    p->mine.allocate(size_t(c * es));
    p->received.allocate(size_t(P * c * es));
  }
  const RawOp op{RawKind::all_to_all,
                 p->whole,
                 moves_data() ? p->received.data() : nullptr,
                 c * es,
                 0,
                 0,
                 p->what};
  return issue(std::move(p), op, bytes, 2 * int64_t(P - 1) * bytes / P);
}

CollectiveHandle Communicator::broadcast_start(void* buf, int64_t bytes, int root,
                                               const std::string& tensor) {
  check_count(*this, "broadcast", tensor, bytes, buf, buf);
  const int P = size();
  LAGA_CHECK(root >= 0 && root < P,
             "broadcast of '{}': root {} is not a rank of this group of {}; try 0 .. {}", tensor,
             root, P, P - 1);
  auto p = pending(CollectiveOp::broadcast, tensor, DType::f32);
  const RawOp op{RawKind::broadcast, buf, buf, bytes, root, 0, p->what};
  return issue(std::move(p), op, bytes, rank() == root ? int64_t(P - 1) * bytes : 0);
}

CollectiveHandle Communicator::send_recv_start(const void* in, void* out, int64_t n, DType dtype,
                                               const std::string& tensor) {
  check_count(*this, "send_recv", tensor, n, in, out);
  const int64_t bytes = n * dtype_size(dtype);
  LAGA_CHECK(!moves_data() || !overlaps(in, bytes, out, bytes),
             "send_recv of '{}' on rank {}: input and output overlap", tensor, rank());
  auto p = pending(CollectiveOp::send_recv, tensor, dtype);
  const RawOp op{RawKind::send_recv, in, out, bytes, 0, 0, p->what};
  return issue(std::move(p), op, bytes, bytes);
}

CollectiveHandle Communicator::barrier_start() {
  auto p = pending(CollectiveOp::barrier, "barrier", DType::f32);
  const RawOp op{RawKind::barrier, nullptr, nullptr, 0, 0, 0, p->what};
  return issue(std::move(p), op, 0, 0);
}

void Communicator::all_gather(const void* in, void* out, int64_t n, DType dtype,
                              const std::string& tensor) {
  auto h = all_gather_start(in, out, n, dtype, tensor);
  wait(h);
}

void Communicator::all_to_all(const void* in, void* out, int64_t n, DType dtype,
                              const std::string& tensor) {
  auto h = all_to_all_start(in, out, n, dtype, tensor);
  wait(h);
}

void Communicator::reduce_scatter(const void* in, void* out, int64_t n, DType dtype,
                                  const std::string& tensor) {
  auto h = reduce_scatter_start(in, out, n, dtype, tensor);
  wait(h);
}

void Communicator::all_reduce(void* buf, int64_t n, DType dtype, const std::string& tensor) {
  auto h = all_reduce_start(buf, n, dtype, tensor);
  wait(h);
}

void Communicator::broadcast(void* buf, int64_t bytes, int root, const std::string& tensor) {
  auto h = broadcast_start(buf, bytes, root, tensor);
  wait(h);
}

void Communicator::send_recv(const void* in, void* out, int64_t n, DType dtype,
                             const std::string& tensor) {
  auto h = send_recv_start(in, out, n, dtype, tensor);
  wait(h);
}

void Communicator::barrier() {
  auto h = barrier_start();
  wait(h);
}

void check_same_everywhere(Communicator& c, const std::string& what, const std::string& value) {
  const int P = c.size();
  const uint64_t mine[2] = {fnv1a(value), uint64_t(value.size())};
  std::vector<uint64_t> all(static_cast<size_t>(2 * P));
  {
    // A raw all_gather, not recorded: configuration is not attention traffic.
    auto p = pending(CollectiveOp::all_gather, "config_check", DType::f32);
    p->recorded = false;
    const Communicator::RawOp op{
        Communicator::RawKind::all_gather, mine, all.data(), int64_t(sizeof mine), 0, 0, p->what};
    auto h = c.issue(std::move(p), op, 0, 0);
    c.wait(h);
  }
  if (!c.moves_data()) return;
  std::vector<int> differ;
  for (int r = 1; r < P; ++r)
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) differ.push_back(r);
  if (differ.empty()) return;
  const std::string shown = value.size() > 200 ? value.substr(0, 200) + "..." : value;
  const bool i_differ = std::find(differ.begin(), differ.end(), c.rank()) != differ.end();
  LAGA_FAIL_USAGE(
      "ranks started with different {}: rank{} {} {} from rank 0; rank {} has '{}'{}; start every "
      "rank "
      "with the same {}",
      what, differ.size() > 1 ? "s" : "", fmt::join(differ, ", "),
      differ.size() > 1 ? "differ" : "differs", c.rank(), shown,
      c.rank() == 0 ? "" : (i_differ ? " (differs)" : " (as rank 0)"), what);
}

std::unique_ptr<Communicator> first_ranks(Communicator& world, int P) {
  const int W = world.size();
  LAGA_CHECK(P >= 1, "a group of {} ranks: try 1 .. {} (the world's size)", P, W);
  LAGA_CHECK(
      P <= W,
      "a group of {} ranks needs {} ranks, but the world has {}; start the job with mpirun -np {}",
      P, P, W, P);
  return world.first_ranks_of(P);
}

}  // namespace laga
