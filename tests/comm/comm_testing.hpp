// Helpers for the Communicator tests: typed byte buffers with deterministic contents, the fp32
// ordered sum the reductions must reproduce bitwise, and a watchdog that turns a hang into a test
// failure. Not here: the claims themselves (test_comm_*.cpp).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "laga/comm/communicator.hpp"
#include "laga/core/dtype.hpp"
#include "laga/core/random.hpp"

namespace laga::testing {

// n elements of dtype as raw bytes, the way the collectives see them.
struct Buffer {
  Buffer(DType t, int64_t n) : dtype(t), n(n), bytes(size_t(n * dtype_size(t))) {}
  float get(int64_t i) const {
    if (dtype == DType::f32) {
      float f;
      std::memcpy(&f, bytes.data() + 4 * i, 4);
      return f;
    }
    bf16 b;
    std::memcpy(&b, bytes.data() + 2 * i, 2);
    return to_float(b);
  }
  void set(int64_t i, float v) {
    if (dtype == DType::f32) {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    } else {
      const bf16 b = to_bf16(v);
      std::memcpy(bytes.data() + 2 * i, &b, 2);
    }
  }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  // Elements [i0, i0 + len) as a new buffer.
  Buffer slice(int64_t i0, int64_t len) const {
    Buffer s(dtype, len);
    if (len > 0)
      std::memcpy(s.data(), bytes.data() + i0 * dtype_size(dtype), size_t(len * dtype_size(dtype)));
    return s;
  }
  bool bitwise_equal(const Buffer& o) const {
    return dtype == o.dtype && n == o.n && bytes == o.bytes;
  }

  DType dtype;
  int64_t n;
  std::vector<char> bytes;
};

// Standard normal values, stored in dtype; a pure function of (stream, rank, i).
inline Buffer normal_buffer(DType t, int64_t n, uint64_t stream, int rank) {
  Buffer b(t, n);
  for (int64_t i = 0; i < n; ++i)
    b.set(i, float(normal(1000 + uint64_t(rank), stream, uint64_t(i))));
  return b;
}

// Small integers in [-8, 8]: every sum of up to 8 of them is exact in bf16 and fp32.
inline Buffer integer_buffer(DType t, int64_t n, uint64_t stream, int rank) {
  Buffer b(t, n);
  for (int64_t i = 0; i < n; ++i)
    b.set(i, float(std::floor(uniform01(2000 + uint64_t(rank), stream, uint64_t(i)) * 17.0) - 8.0));
  return b;
}

// What the reductions promise: Σ over ranks 0..P−1 in that order, in fp32, rounded once to dtype.
inline Buffer ordered_sum(const std::vector<Buffer>& parts) {
  Buffer s(parts[0].dtype, parts[0].n);
  for (int64_t i = 0; i < s.n; ++i) {
    float acc = parts[0].get(i);
    for (size_t j = 1; j < parts.size(); ++j) acc += parts[j].get(i);
    s.set(i, acc);
  }
  return s;
}

// Runs body on its own thread and waits at most `seconds`. A hang prints and ends this test
// process with a failure (ctest runs each test in its own process), so CI never waits forever.
template <class F>
void within_seconds(double seconds, F body) {
  auto done = std::make_shared<std::promise<void>>();
  auto finished = done->get_future();
  std::thread([done, body]() mutable {
    try {
      body();
      done->set_value();
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  }).detach();
  if (finished.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) {
    std::fprintf(stderr, "FAILED: %s hung for more than %g s\n",
                 ::testing::UnitTest::GetInstance()->current_test_info()->name(), seconds);
    std::fflush(stderr);
    std::_Exit(1);
  }
  finished.get();
}

inline const std::vector<int>& rank_counts() {
  static const std::vector<int> counts = {1, 2, 3, 4, 8};
  return counts;
}

}  // namespace laga::testing
