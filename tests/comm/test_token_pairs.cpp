// The token pair of comm/pairs.hpp over both shardings: all_gather_tokens puts every rank's rows at
// their sequence positions (contiguous: rank r's N rows at r·N; zigzag: its chunks r and 2P−1−r),
// and reduce_scatter_tokens hands each rank the sums of its own positions — with the positions
// written into the values, so a misplaced chunk shows.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "comm/comm_testing.hpp"
#include "laga/comm/pairs.hpp"
#include "laga/core/memory.hpp"

using namespace laga;

namespace {

// The global position of local row i of rank r (N rows a rank).
int64_t position(Shards s, int64_t P, int64_t N, int64_t r, int64_t i) {
  if (s == Shards::contiguous) return r * N + i;
  const int64_t C = N / 2;
  return i < C ? r * C + i : (2 * P - 1 - r) * C + (i - C);
}

}  // namespace

TEST(TokenPairs, GatherPlacesRowsAtTheirPositionsAndReduceScatterSumsThem) {
  const int64_t N = 6, B = 2, d = 3;
  for (Shards s : {Shards::contiguous, Shards::zigzag})
    for (int P : {1, 2, 3, 4})
      for (DType dt : {DType::f32, DType::bf16})
        run_threads(P, [&](Communicator& c) {
          MemoryTracker tracker;  // one a rank, as the launchers give them
          TrackerScope scope(tracker);
          const std::string what =
              fmt::format("{} P {} {} rank {}", s == Shards::zigzag ? "zigzag" : "contiguous", P,
                          dtype_name(dt), c.rank());
          const int64_t T = P * N;
          // gathered row t, batch b, column j holds t·8 + b·4 + j (exact in bf16 up to 256)
          Tensor x = Tensor::empty({N, B, d}, dt, "x");
          for (int64_t i = 0; i < N; ++i)
            for (int64_t k = 0; k < B * d; ++k)
              x.set(i * B * d + k, float(position(s, P, N, c.rank(), i) * 8 + k / d * 4 + k % d));
          const Tensor g = all_gather_tokens(c, x, "latent", "g", s);
          for (int64_t t = 0; t < T; ++t)
            for (int64_t k = 0; k < B * d; ++k)
              ASSERT_EQ(g.get(t * B * d + k), float(t * 8 + k / d * 4 + k % d))
                  << what << " gathered row " << t;
          // every rank sends t + rank for row t: rank r receives Σ_q (t + q) at its positions t
          Tensor y = Tensor::empty({T, B, d}, DType::f32, "y");
          for (int64_t t = 0; t < T; ++t)
            for (int64_t k = 0; k < B * d; ++k) y.set(t * B * d + k, float(t + c.rank()));
          const Tensor r = reduce_scatter_tokens(c, y, "dlatent", "r", dt, s);
          for (int64_t i = 0; i < N; ++i) {
            const int64_t t = position(s, P, N, c.rank(), i);
            ASSERT_EQ(r.get(i * B * d), float(P * t + P * (P - 1) / 2)) << what << " row " << i;
          }
        });
}
