// bench-comm's sizes, shapes, input pattern and output check (bench_comm.hpp). The expected outputs
// are written from the definitions of the collectives in comm/communicator.hpp, element by element,
// with no call into the Communicator.
#include "bench_comm.hpp"

#include <cctype>
#include <cmath>
#include <limits>

#include "laga/core/bytes.hpp"
#include "laga/core/error.hpp"

namespace laga::cli::bench_comm {

namespace {

// splitmix64's finaliser: neighbouring (rank, index) pairs give unrelated values, so a chunk sent
// to or taken from the wrong place differs from the right one in about 14 of 15 elements.
uint64_t mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <class T>
float load(const void* p, int64_t i) {
  return to_float(static_cast<const T*>(p)[i]);
}

template <class T>
void store(void* p, int64_t i, float v) {
  static_cast<T*>(p)[i] = from_float<T>(v);
}

// Expected value of output element j on rank q.
float expected(const Shape& s, int q, int64_t j) {
  const int P = s.P;
  switch (s.op) {
    case CollectiveOp::all_gather:  // out [P · n]: chunk r is rank r's input
      return pattern(int(j / s.n), j % s.n);
    case CollectiveOp::all_to_all:  // out chunk r = rank r's input chunk q
      return pattern(int(j / s.n), int64_t(q) * s.n + j % s.n);
    case CollectiveOp::reduce_scatter: {  // out [n] = Σ_r in_r[q · n + j]
      double sum = 0;
      for (int r = 0; r < P; ++r) sum += pattern(r, int64_t(q) * s.n + j);
      return float(sum);
    }
    case CollectiveOp::send_recv:  // out [n] = rank (q−1) mod P's input
      return pattern((q + P - 1) % P, j);
    case CollectiveOp::all_reduce: {  // buf [n] = Σ_r buf_r
      double sum = 0;
      for (int r = 0; r < P; ++r) sum += pattern(r, j);
      return float(sum);
    }
    default:
      LAGA_ASSERT(false, "bench-comm has no expected result for {}", collective_name(s.op));
  }
  return 0;
}

}  // namespace

const std::vector<CollectiveOp>& benchmarked_ops() {
  static const std::vector<CollectiveOp> ops{CollectiveOp::all_gather, CollectiveOp::reduce_scatter,
                                             CollectiveOp::all_to_all, CollectiveOp::all_reduce,
                                             CollectiveOp::send_recv};
  return ops;
}

CollectiveOp parse_op(const std::string& name) {
  for (CollectiveOp op : benchmarked_ops())
    if (collective_name(op) == name) return op;
  LAGA_FAIL_USAGE(
      "unknown collective '{}' for --ops; valid: all_gather, reduce_scatter, all_to_all, "
      "all_reduce, send_recv",
      name);
}

int64_t parse_size(const std::string& text, const char* flag) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  int64_t bytes = -1;
  const std::string suffix = text.substr(digits);
  const int shift = suffix == ""                     ? 0
                    : suffix == "K" || suffix == "k" ? 10
                    : suffix == "M" || suffix == "m" ? 20
                    : suffix == "G" || suffix == "g" ? 30
                                                     : -1;
  if (digits > 0 && digits <= 9 && shift >= 0) {
    bytes = std::stoll(text.substr(0, digits)) << shift;  // below 10^9 · 2^30 < 2^63
  } else {
    try {
      bytes = parse_bytes(text);
    } catch (const Error&) {
      LAGA_FAIL_USAGE("{} '{}' is not a size in bytes; write e.g. 8, 64K, 4M or 1G (K = 1024)",
                      flag, text);
    }
  }
  LAGA_CHECK(bytes >= 1, "{} {} must be at least one byte, e.g. {} 8", flag, text, flag);
  return bytes;
}

std::vector<int64_t> size_sweep(int64_t min_bytes, int64_t max_bytes, int64_t factor) {
  LAGA_CHECK(min_bytes <= max_bytes, "-b {} is larger than -e {}; give -b ≤ -e, e.g. -b {} -e {}",
             min_bytes, max_bytes, max_bytes, min_bytes);
  LAGA_CHECK(factor >= 2, "-f {} must be an integer ≥ 2 (the step between sizes), e.g. -f 2",
             factor);
  std::vector<int64_t> sizes;
  for (int64_t s = min_bytes; s <= max_bytes; s *= factor) {
    sizes.push_back(s);
    if (s > max_bytes / factor) break;
  }
  return sizes;
}

Shape shape_for(CollectiveOp op, DType dtype, int P, int64_t requested_bytes) {
  LAGA_CHECK(P >= 1, "bench-comm needs P ≥ 1 ranks, not {}", P);
  Shape s;
  s.op = op, s.dtype = dtype, s.P = P;
  const int64_t elem = dtype_size(dtype);
  const int64_t multiple = op == CollectiveOp::all_reduce || op == CollectiveOp::send_recv ? 1 : P;
  s.count = std::max(multiple, requested_bytes / elem / multiple * multiple);
  s.bytes = s.count * elem;
  switch (op) {
    case CollectiveOp::all_gather:
      s.n = s.count / P, s.in_elems = s.n, s.out_elems = s.count;
      break;
    case CollectiveOp::reduce_scatter:
      s.n = s.count / P, s.in_elems = s.count, s.out_elems = s.n;
      break;
    case CollectiveOp::all_to_all:
      s.n = s.count / P, s.in_elems = s.count, s.out_elems = s.count;
      break;
    case CollectiveOp::all_reduce:
    case CollectiveOp::send_recv:
      s.n = s.count, s.in_elems = s.count, s.out_elems = s.count;
      break;
    default:
      LAGA_FAIL_USAGE(
          "bench-comm does not time {}; valid: all_gather, reduce_scatter, all_to_all, all_reduce, "
          "send_recv",
          collective_name(op));
  }
  return s;
}

double busbw_factor(CollectiveOp op, int P) {
  const double f = double(P - 1) / double(P);
  if (op == CollectiveOp::send_recv) return P > 1 ? 1.0 : 0.0;  // every rank's S crosses one link
  return op == CollectiveOp::all_reduce ? 2 * f : f;
}

float pattern(int rank, int64_t index) {
  const uint64_t h = mix(uint64_t(rank) * 0x9e3779b97f4a7c15ull ^ mix(uint64_t(index)));
  return float(int(h % 15) - 7);
}

void fill_input(const Shape& s, int rank, void* in) {
  dispatch_dtype(s.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    for (int64_t i = 0; i < s.in_elems; ++i) store<T>(in, i, pattern(rank, i));
  });
}

void poison_output(const Shape& s, void* out) {
  dispatch_dtype(s.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    for (int64_t i = 0; i < s.out_elems; ++i)
      store<T>(out, i, std::numeric_limits<float>::quiet_NaN());
    for (int64_t i = 0; i < kGuard; ++i) store<T>(out, s.out_elems + i, kGuardValue);
  });
}

int64_t count_wrong(const Shape& s, int rank, const void* out) {
  return dispatch_dtype(s.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    int64_t wrong = 0;
    for (int64_t j = 0; j < s.out_elems; ++j)
      if (!(load<T>(out, j) == round_to(s.dtype, expected(s, rank, j)))) ++wrong;
    for (int64_t i = 0; i < kGuard; ++i)
      if (!(load<T>(out, s.out_elems + i) == kGuardValue)) ++wrong;
    return wrong;
  });
}

}  // namespace laga::cli::bench_comm
