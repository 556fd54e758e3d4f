// A synthetic training task for the block stack: regress a student stack onto a fixed teacher stack
// of the same shape, y_teacher = teacher(x) for fresh x ~ N(0, 1) each step, with the loss
// ½·mean((student(x) − teacher(x))²) and Adam on fp32 master weights. The teacher always runs the
// explicit form, so every form trains on identical targets from the same seed.
#pragma once

#include <vector>

#include "laga/comm/communicator.hpp"
#include "laga/mla/config.hpp"

namespace laga {

struct TrainOptions {
  int64_t steps = 200;
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  uint64_t seed = 1234;
};

struct TrainResult {
  std::vector<double> losses;  // one per step, before that step's update
  double seconds = 0;
};

// Runs on every rank of comm (config.sp ranks); every rank returns the same losses.
TrainResult train_rank(const Config& c, const TrainOptions& opt, Communicator& comm);
// Every rank as a thread.
TrainResult train_group(const Config& c, const TrainOptions& opt, double timeout_s = 0);

}  // namespace laga
