// laga bench-comm's validation (tools/laga/bench_comm.hpp): the checker agrees with the
// Communicator on every collective it times (0 wrong after a real collective, threads backend), and
// counts exactly the elements a broken collective got wrong — corrupted values, swapped chunks, an
// output never written, a stray write past the end. Plus the sweep, the size spellings and the
// rounding of counts. The command itself runs in tests/cli/bench_comm.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>

#include "bench_comm.hpp"
#include "laga/comm/communicator.hpp"
#include "laga/core/error.hpp"

namespace laga::cli::bench_comm {
namespace {

std::vector<uint64_t> words(int64_t elems, DType t) {
  return std::vector<uint64_t>(size_t((elems * dtype_size(t) + 7) / 8));
}

// Adds 1 to element i of a buffer of dtype t (a wrong value, still a small integer).
void bump(void* p, DType t, int64_t i) {
  if (t == DType::f32) {
    static_cast<float*>(p)[i] += 1;
  } else {
    auto* b = static_cast<bf16*>(p);
    b[i] = to_bf16(to_float(b[i]) + 1);
  }
}

void set(void* p, DType t, int64_t i, float v) {
  if (t == DType::f32)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<bf16*>(p)[i] = to_bf16(v);
}

// Runs the real collective of s on P threads and hands each rank's output to inspect(rank, out).
void run_collective(const Shape& s,
                    const std::function<void(int, std::vector<uint64_t>&)>& inspect) {
  std::mutex m;
  run_threads(s.P, [&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<uint64_t> in = words(s.in_elems, s.dtype),
                          out = words(s.out_elems + kGuard, s.dtype);
    poison_output(s, out.data());
    switch (s.op) {
      case CollectiveOp::all_gather:
        fill_input(s, r, in.data());
        comm.all_gather(in.data(), out.data(), s.n, s.dtype, "t");
        break;
      case CollectiveOp::reduce_scatter:
        fill_input(s, r, in.data());
        comm.reduce_scatter(in.data(), out.data(), s.n, s.dtype, "t");
        break;
      case CollectiveOp::all_to_all:
        fill_input(s, r, in.data());
        comm.all_to_all(in.data(), out.data(), s.n, s.dtype, "t");
        break;
      case CollectiveOp::send_recv:
        fill_input(s, r, in.data());
        comm.send_recv(in.data(), out.data(), s.n, s.dtype, "t");
        break;
      default:
        fill_input(s, r, out.data());
        comm.all_reduce(out.data(), s.n, s.dtype, "t");
    }
    std::lock_guard<std::mutex> lock(m);
    inspect(r, out);
  });
}

TEST(BenchComm, CheckerFindsNoErrorInARealCollectiveAndExactlyTheCorruptedElements) {
  for (CollectiveOp op : benchmarked_ops())
    for (DType t : {DType::bf16, DType::f32})
      for (int P : {1, 2, 3, 4}) {
        const Shape s = shape_for(op, t, P, 3000);
        SCOPED_TRACE(std::string(collective_name(op)) + " " + std::string(dtype_name(t)) + " P " +
                     std::to_string(P));
        run_collective(s, [&](int r, std::vector<uint64_t>& out) {
          EXPECT_EQ(count_wrong(s, r, out.data()), 0);
          // Three wrong values and one guard overwritten: four wrong.
          for (int64_t i : {int64_t(0), s.out_elems / 2, s.out_elems - 1}) bump(out.data(), t, i);
          set(out.data(), t, s.out_elems + kGuard - 1, 0.0f);
          EXPECT_EQ(count_wrong(s, r, out.data()), 4);
        });
      }
}

TEST(BenchComm, CheckerCatchesSwappedChunksAndAnOutputNeverWritten) {
  const DType t = DType::bf16;
  const Shape s = shape_for(CollectiveOp::all_gather, t, 4, 4096);  // 512 elements per chunk
  run_collective(s, [&](int r, std::vector<uint64_t>& out) {
    auto* e = reinterpret_cast<bf16*>(out.data());
    std::swap_ranges(e, e + s.n, e + s.n);  // chunks 0 and 1 exchanged: a misrouted all_gather
    const int64_t wrong = count_wrong(s, r, out.data());
    EXPECT_GT(wrong, 2 * s.n * 4 / 5);  // about 14 in 15 of the swapped elements differ
    EXPECT_LE(wrong, 2 * s.n);
  });
  const Shape a = shape_for(CollectiveOp::all_to_all, t, 2, 1024);
  std::vector<uint64_t> out = words(a.out_elems + kGuard, t);
  poison_output(a, out.data());  // what a collective that writes nothing leaves
  EXPECT_EQ(count_wrong(a, 0, out.data()), a.out_elems);
}

TEST(BenchComm, SumsAreExactSmallIntegers) {
  for (int r = 0; r < 64; ++r)
    for (int64_t i = 0; i < 1000; ++i) {
      const float v = pattern(r, i);
      ASSERT_EQ(v, std::round(v));
      ASSERT_LE(std::abs(v), 7.0f);
      ASSERT_EQ(round_to(DType::bf16, v), v);
    }
  // The values spread over all of −7 .. 7, so a misplaced element is caught 14 times in 15.
  std::vector<int> seen(15, 0);
  for (int64_t i = 0; i < 15000; ++i) ++seen[size_t(pattern(3, i) + 7)];
  for (int c : seen) EXPECT_GT(c, 800);
}

TEST(BenchComm, CountsRoundToWhatTheCollectiveNeeds) {
  Shape s = shape_for(CollectiveOp::all_gather, DType::bf16, 4, 1000);
  EXPECT_EQ(s.count, 500);
  EXPECT_EQ(s.bytes, 1000);
  EXPECT_EQ(s.n, 125);
  EXPECT_EQ(s.in_elems, 125);
  EXPECT_EQ(s.out_elems, 500);
  s = shape_for(CollectiveOp::reduce_scatter, DType::f32, 3, 1000);  // 250 elements -> 249
  EXPECT_EQ(s.count, 249);
  EXPECT_EQ(s.bytes, 996);
  EXPECT_EQ(s.in_elems, 249);
  EXPECT_EQ(s.out_elems, 83);
  // smaller than one element per rank: P elements
  s = shape_for(CollectiveOp::all_to_all, DType::f32, 4, 8);
  EXPECT_EQ(s.count, 4);
  EXPECT_EQ(s.bytes, 16);
  EXPECT_EQ(s.n, 1);
  s = shape_for(CollectiveOp::all_reduce, DType::bf16, 3, 1001);
  EXPECT_EQ(s.count, 500);
  EXPECT_EQ(s.n, 500);
  EXPECT_EQ(s.bytes, 1000);
  EXPECT_DOUBLE_EQ(busbw_factor(CollectiveOp::all_gather, 4), 0.75);
  EXPECT_DOUBLE_EQ(busbw_factor(CollectiveOp::all_to_all, 2), 0.5);
  EXPECT_DOUBLE_EQ(busbw_factor(CollectiveOp::all_reduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(busbw_factor(CollectiveOp::reduce_scatter, 1), 0.0);
}

TEST(BenchComm, SizesAreWrittenAsNcclTestsWritesThem) {
  EXPECT_EQ(parse_size("8", "-b"), 8);
  EXPECT_EQ(parse_size("64K", "-b"), 65536);
  EXPECT_EQ(parse_size("4M", "-b"), 4 << 20);
  EXPECT_EQ(parse_size("1G", "-b"), int64_t(1) << 30);
  EXPECT_EQ(parse_size("1MB", "-b"), 1000000);
  EXPECT_EQ(parse_size("2MiB", "-b"), 2 << 20);
  EXPECT_EQ(size_sweep(1024, 1 << 20, 4),
            (std::vector<int64_t>{1024, 4096, 16384, 65536, 262144, 1048576}));
  EXPECT_EQ(size_sweep(1000, 5000, 2), (std::vector<int64_t>{1000, 2000, 4000}));
  EXPECT_EQ(size_sweep(64, 64, 2), (std::vector<int64_t>{64}));
  auto usage = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.kind() == ErrorKind::usage;
    }
    return false;
  };
  EXPECT_TRUE(usage([] { parse_size("0", "-b"); }));
  EXPECT_TRUE(usage([] { parse_size("12 parsecs", "-e"); }));
  EXPECT_TRUE(usage([] { size_sweep(2048, 1024, 2); }));
  EXPECT_TRUE(usage([] { size_sweep(1024, 2048, 1); }));
  EXPECT_TRUE(usage([] { parse_op("broadcast"); }));
}

}  // namespace
}  // namespace laga::cli::bench_comm
