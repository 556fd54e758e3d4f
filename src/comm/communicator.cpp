// The backend-independent half of the Communicator: argument checks at the boundary, the timing and
// recording of every collective in the Ledger, the reductions built on raw byte movement (so both
// backends sum in the same order and give bitwise the same results), and the configuration check.
// Not here: moving bytes between ranks (threads.cpp, mpi.cpp). The accounting formulas are in
// communicator.hpp and DESIGN §4.
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

namespace laga {

std::string_view collective_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::all_to_all: return "all_to_all";
    case CollectiveOp::all_gather: return "all_gather";
    case CollectiveOp::reduce_scatter: return "reduce_scatter";
    case CollectiveOp::all_reduce: return "all_reduce";
    case CollectiveOp::barrier: return "barrier";
    case CollectiveOp::broadcast: return "broadcast";
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

class Communicator::Naming {
 public:
  Naming(Communicator& c, std::string_view op, const std::string& tensor) : c_(c) {
    c_.current_ = fmt::format("{} of '{}'", op, tensor);
  }
  ~Naming() { c_.current_.clear(); }

 private:
  Communicator& c_;
};

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void check_count(const Communicator& c, std::string_view op, const std::string& tensor, int64_t n, const void* a,
                 const void* b) {
  LAGA_CHECK(n >= 0, "{} of '{}' on rank {}: element count {} is negative", op, tensor, c.rank(), n);
  LAGA_CHECK(n == 0 || (a && b), "{} of '{}' on rank {}: null buffer for {} elements", op, tensor, c.rank(), n);
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

void Communicator::record(CollectiveOp op, const std::string& tensor, DType dtype, double seconds,
                          int64_t tensor_bytes, int64_t wire_bytes) {
  ledger_.add(CollectiveRecord{op, tensor, dtype, seconds, tensor_bytes, size() == 1 ? 0 : wire_bytes});
}

void Communicator::all_gather(const void* in, void* out, int64_t n, DType dtype, const std::string& tensor) {
  check_count(*this, "all_gather", tensor, n, in, out);
  const int P = size();
  const int64_t shard = n * dtype_size(dtype);
  const bool in_place = in == static_cast<const char*>(out) + int64_t(rank()) * shard;
  LAGA_CHECK(in_place || !overlaps(in, shard, out, P * shard),
             "all_gather of '{}' on rank {}: input overlaps the output without being its chunk {} (in place)",
             tensor, rank(), rank());
  Naming naming(*this, "all_gather", tensor);
  const auto t0 = Clock::now();
  do_all_gather(in, out, shard);
  record(CollectiveOp::all_gather, tensor, dtype, seconds_since(t0), shard, int64_t(P - 1) * shard);
}

void Communicator::all_to_all(const void* in, void* out, int64_t n, DType dtype, const std::string& tensor) {
  check_count(*this, "all_to_all", tensor, n, in, out);
  const int P = size();
  const int64_t chunk = n * dtype_size(dtype);
  LAGA_CHECK(!overlaps(in, P * chunk, out, P * chunk), "all_to_all of '{}' on rank {}: input and output overlap",
             tensor, rank());
  Naming naming(*this, "all_to_all", tensor);
  const auto t0 = Clock::now();
  do_all_to_all(in, out, chunk);
  record(CollectiveOp::all_to_all, tensor, dtype, seconds_since(t0), P * chunk, int64_t(P - 1) * chunk);
}

// out [n] = Σ_j (chunk this rank received from rank j); the all_to_all's output is scratch.
void Communicator::reduce_scatter_raw(const void* in, void* out, int64_t n, DType dtype) {
  const int P = size();
  const int64_t chunk = n * dtype_size(dtype);
  // Communication scratch, not a tensor: plain std::vector, outside the tracking allocator.
  std::vector<char> received(size_t(P * chunk));
  do_all_to_all(in, received.data(), chunk);
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    sum_chunks(reinterpret_cast<const T*>(received.data()), static_cast<T*>(out), n, P);
  });
}

void Communicator::reduce_scatter(const void* in, void* out, int64_t n, DType dtype, const std::string& tensor) {
  check_count(*this, "reduce_scatter", tensor, n, in, out);
  const int P = size();
  const int64_t shard = n * dtype_size(dtype);
  Naming naming(*this, "reduce_scatter", tensor);
  const auto t0 = Clock::now();
  reduce_scatter_raw(in, out, n, dtype);
  record(CollectiveOp::reduce_scatter, tensor, dtype, seconds_since(t0), shard, int64_t(P - 1) * shard);
}

void Communicator::all_reduce(void* buf, int64_t n, DType dtype, const std::string& tensor) {
  check_count(*this, "all_reduce", tensor, n, buf, buf);
  const int P = size();
  const int64_t es = dtype_size(dtype), bytes = n * es;
  Naming naming(*this, "all_reduce", tensor);
  const auto t0 = Clock::now();
  // Chunks of c = ⌈n/P⌉ elements; when P does not divide n the buffer is zero-padded to P·c in
  // scratch (communication scratch: plain std::vector), and the padding never leaves it.
  const int64_t c = (n + P - 1) / P;
  const bool padded = c * P != n;
  std::vector<char> scratch(padded ? size_t(P * c * es) : 0);
  if (padded && bytes > 0) std::memcpy(scratch.data(), buf, size_t(bytes));
  std::vector<char> mine(size_t(c * es));
  void* whole = padded ? static_cast<void*>(scratch.data()) : buf;
  reduce_scatter_raw(whole, mine.data(), c, dtype);
  do_all_gather(mine.data(), whole, c * es);
  if (padded && bytes > 0) std::memcpy(buf, scratch.data(), size_t(bytes));
  record(CollectiveOp::all_reduce, tensor, dtype, seconds_since(t0), bytes, 2 * int64_t(P - 1) * bytes / P);
}

void Communicator::broadcast(void* buf, int64_t bytes, int root, const std::string& tensor) {
  check_count(*this, "broadcast", tensor, bytes, buf, buf);
  const int P = size();
  LAGA_CHECK(root >= 0 && root < P, "broadcast of '{}': root {} is not a rank of this group of {}; try 0 .. {}",
             tensor, root, P, P - 1);
  Naming naming(*this, "broadcast", tensor);
  const auto t0 = Clock::now();
  do_broadcast(buf, bytes, root);
  record(CollectiveOp::broadcast, tensor, DType::f32, seconds_since(t0), bytes,
         rank() == root ? int64_t(P - 1) * bytes : 0);
}

void Communicator::barrier() {
  Naming naming(*this, "barrier", "barrier");
  const auto t0 = Clock::now();
  do_barrier();
  record(CollectiveOp::barrier, "barrier", DType::f32, seconds_since(t0), 0, 0);
}

void check_same_everywhere(Communicator& c, const std::string& what, const std::string& value) {
  const int P = c.size();
  const uint64_t mine[2] = {fnv1a(value), uint64_t(value.size())};
  std::vector<uint64_t> all(static_cast<size_t>(2 * P));
  {
    Communicator::Naming naming(c, "all_gather", "config_check");
    c.do_all_gather(mine, all.data(), sizeof mine);
  }
  std::vector<int> differ;
  for (int r = 1; r < P; ++r)
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) differ.push_back(r);
  if (differ.empty()) return;
  const std::string shown = value.size() > 200 ? value.substr(0, 200) + "..." : value;
  const bool i_differ = std::find(differ.begin(), differ.end(), c.rank()) != differ.end();
  LAGA_FAIL_USAGE("ranks started with different {}: rank{} {} {} from rank 0; rank {} has '{}'{}; start every rank "
                  "with the same {}",
                  what, differ.size() > 1 ? "s" : "", fmt::join(differ, ", "), differ.size() > 1 ? "differ" : "differs",
                  c.rank(), shown, c.rank() == 0 ? "" : (i_differ ? " (differs)" : " (as rank 0)"), what);
}

}  // namespace laga
