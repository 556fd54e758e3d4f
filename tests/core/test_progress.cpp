// core/progress.hpp: a thread's hook runs from compute's progress points (every matmul, so every
// tile of an attention kernel), at most once per interval, never inside itself, only on the thread
// that installed it, and nested hooks restore the outer one.
#include <gtest/gtest.h>

#include <stdexcept>
#include <thread>

#include "laga/core/progress.hpp"
#include "laga/core/tensor.hpp"
#include "laga/ops/matmul.hpp"

namespace laga {
namespace {

void one_matmul() {
  Tensor a = Tensor::zeros({8, 16}, DType::f32, "t.a"),
         b = Tensor::zeros({16, 4}, DType::f32, "t.b");
  Tensor c = Tensor::zeros({8, 4}, DType::f32, "t.c");
  matmul_2d(mat(a), mat(b), mat(c), false, 1.0f);
}

constexpr double kEvery = 1e-12;  // shorter than any matmul: the hook runs at every progress point

TEST(Progress, EveryMatmulIsAProgressPoint) {
  one_matmul();  // no hook: nothing to run
  int runs = 0;
  {
    ProgressHook hook([&] { ++runs; }, kEvery);
    for (int i = 0; i < 5; ++i) one_matmul();
  }
  EXPECT_EQ(runs, 5);
  one_matmul();  // the hook is gone
  EXPECT_EQ(runs, 5);
}

TEST(Progress, AtMostOncePerInterval) {
  int runs = 0;
  ProgressHook hook([&] { ++runs; }, 3600.0);  // an hour: not due during this test
  for (int i = 0; i < 20; ++i) progress_point();
  EXPECT_EQ(runs, 0);
}

TEST(Progress, ZeroIntervalInstallsNothingAndNestedHooksRestoreTheOuter) {
  int outer = 0, inner = 0;
  ProgressHook a([&] { ++outer; }, kEvery);
  progress_point();
  {
    ProgressHook off([&] { ++inner; }, 0);  // 0: nothing installed, the outer hook still runs
    progress_point();
  }
  {
    ProgressHook b([&] { ++inner; }, kEvery);
    progress_point();
    progress_point();
  }
  progress_point();
  EXPECT_EQ(outer, 3);
  EXPECT_EQ(inner, 2);
}

TEST(Progress, TheHooksOwnComputeDoesNotReenterIt) {
  int runs = 0;
  ProgressHook hook(
      [&] {
        ++runs;
        one_matmul();  // a progress point inside the hook
      },
      kEvery);
  one_matmul();
  EXPECT_EQ(runs, 1);
}

TEST(Progress, AThrowingHookPropagatesAndRunsAgainLater) {
  int runs = 0;
  ProgressHook hook(
      [&] {
        if (++runs == 1) throw std::runtime_error("group down");
      },
      kEvery);
  EXPECT_THROW(progress_point(), std::runtime_error);
  progress_point();
  EXPECT_EQ(runs, 2);
}

TEST(Progress, OnlyTheInstallingThreadRunsItsHook) {
  int runs = 0;
  ProgressHook hook([&] { ++runs; }, kEvery);
  std::thread other([] {
    progress_point();
    one_matmul();
  });
  other.join();
  EXPECT_EQ(runs, 0);
}

}  // namespace
}  // namespace laga
