// The parts of `laga bench-comm` that do not run anything, so the tests can call them: the size
// sweep (-b -e -f), the buffer shape of each collective at a size, the deterministic input pattern,
// the element-by-element check of an output against the expected result computed here
// independently of the Communicator, and the bus-bandwidth factors. The command itself (launch,
// timing, the table) is cmd_bench_comm.cpp; the conventions are in docs/throughput.md.
//
// Conventions (nccl-tests'): a size S is the bytes of the whole buffer — for all_gather the
// gathered output, for reduce_scatter the input, for all_to_all the (input = output) buffer of one
// rank, for all_reduce the buffer, for send_recv what each rank sends. algbw = S / t; busbw = algbw
// · (P−1)/P for all_gather, reduce_scatter and all_to_all, algbw · 2(P−1)/P for all_reduce and
// algbw for send_recv (0 at P = 1), so that busbw is comparable with a link's rate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "laga/comm/communicator.hpp"
#include "laga/core/dtype.hpp"

namespace laga::cli::bench_comm {

// The collectives bench-comm times, in the order it runs them by default.
const std::vector<CollectiveOp>& benchmarked_ops();
// "all_gather" -> CollectiveOp::all_gather; usage error naming the text and the valid names.
CollectiveOp parse_op(const std::string& name);

// A byte count as nccl-tests writes it: digits with an optional K, M or G (powers of 1024), e.g.
// 8, 64K, 4M, 1G; also laga's own spellings (parse_bytes: 1MB, 512MiB). Usage error naming the flag
// and the text; a size must be at least one byte.
int64_t parse_size(const std::string& text, const char* flag);
// min, min·f, min·f², ... up to max (both included when reached). Usage error when min > max or
// f < 2 (naming the values and a valid alternative).
std::vector<int64_t> size_sweep(int64_t min_bytes, int64_t max_bytes, int64_t factor);

// The buffers of one collective of S requested bytes at P ranks. count is rounded down to what the
// op needs (a multiple of P for all_gather, reduce_scatter and all_to_all; whole elements for
// all_reduce), and up to the smallest such count when S is smaller.
struct Shape {
  CollectiveOp op;
  DType dtype;
  int P = 1;
  int64_t count = 0;  // elements of the whole buffer S (bytes = count · element size)
  int64_t bytes = 0;  // S after rounding: what algbw divides
  // the n of the Communicator call (all_gather/reduce_scatter/all_to_all: count / P)
  int64_t n = 0;
  int64_t in_elems = 0;   // this rank's input (all_reduce: the buffer, in place)
  int64_t out_elems = 0;  // this rank's output (all_reduce: the same buffer)
};
Shape shape_for(CollectiveOp op, DType dtype, int P, int64_t requested_bytes);

// busbw / algbw: (P−1)/P, 2(P−1)/P for all_reduce, 1 for send_recv (0 at P = 1).
double busbw_factor(CollectiveOp op, int P);

// The input value of element `index` of rank `rank`: a small integer in −7 .. 7 from a hash of
// (rank, index). Exact in bf16, and every sum over up to 2^20 ranks is an integer below 2^24, exact
// in fp32 and then rounded to bf16 in one step whichever order the ranks are summed in — so the
// expected outputs are exact and an output is right only when it is bitwise what is expected.
float pattern(int rank, int64_t index);

// Guard elements after every output buffer (ggml test-backend-ops' idea): a stray write past the
// end is counted as wrong. Buffers are allocated out_elems + kGuard elements.
constexpr int64_t kGuard = 16;
// The guard's value (exactly representable, never an expected output).
constexpr float kGuardValue = 1024.0f;

// Fills this rank's input (in_elems elements of s.dtype) with the pattern.
void fill_input(const Shape& s, int rank, void* in);
// Sets this rank's output (out_elems) to NaN, which no expected value equals, and its kGuard guard
// elements to kGuardValue: what a collective that writes nothing leaves fails the check.
void poison_output(const Shape& s, void* out);
// Elements of this rank's output (out_elems, then kGuard guards) that differ from what the
// collective must produce on this rank (computed here from pattern(), not through the
// Communicator), plus guards that changed.
int64_t count_wrong(const Shape& s, int rank, const void* out);

}  // namespace laga::cli::bench_comm
