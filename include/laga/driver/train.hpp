// A synthetic training task for the block stack: regress a student stack onto a fixed teacher stack
// of the same shape, y_teacher = teacher(x) for fresh x ~ N(0, 1) each step, with the loss
// ½·mean((student(x) − teacher(x))²) and Adam on fp32 master weights. The teacher (teacher_config)
// runs in the student's token layout: explicit for the forms that hold contiguous tokens, so they
// train on identical targets from the same seed; the student's own form for those that hold other
// tokens (the ring forms' zigzag, laga-ulysses' zigzag over groups), which explicit has no layout
// for, so their targets are the same function of the same sequence, equal to explicit's up to
// rounding.
//
// Step s's inputs come from the data seed seed + 1000003·(s + 1) (train_data_seed), so the data
// stream's whole state is the step index. A run can be checkpointed and resumed losslessly
// (io/train_checkpoint.hpp): the resumed run's losses and weights are bitwise those of a run never
// interrupted.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "laga/comm/communicator.hpp"
#include "laga/io/train_checkpoint.hpp"
#include "laga/mla/config.hpp"

namespace laga {

struct TrainOptions {
  int64_t steps = 200;
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  uint64_t seed = 1234;
  // Checkpoints (rank 0 writes): into checkpoint_dir (the form's directory, train_checkpoint_dir)
  // after every checkpoint_every steps (0: only after the last step) and after the last step; none
  // when empty.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  // Start from this state (read_train_checkpoint) instead of step 0; not owned.
  const TrainState* resume = nullptr;
  // Rank 0 writes the final weights here (write_weights, laga names, the run's dtype); none when
  // empty.
  std::string dump_weights;
};

struct TrainResult {
  // one per step, before that step's update (resumed: the checkpoint's first)
  std::vector<double> losses;
  int64_t resumed_from = 0;  // the step the run started at
  double seconds = 0;
};

// The inputs' seed of step `step` (0-based).
uint64_t train_data_seed(uint64_t seed, int64_t step);
// The teacher's config for student config c (see the top).
Config teacher_config(const Config& c);
// What a checkpoint must match to be resumed by this run: the resolved config JSON, P, Pu
// (--ulysses: ranks per head-scatter group, P unless laga-ulysses runs head scatter × ring), form,
// dtype, kernel, lr, betas, eps, seed, and the task.
nlohmann::json train_identity(const Config& c, const TrainOptions& opt);
// The weights' names and element counts, in for_each order (what a checkpoint's state holds).
void train_state_shape(const Config& c, std::vector<std::string>& names,
                       std::vector<int64_t>& sizes);

// Runs on every rank of comm (config.sp ranks); every rank returns the same losses.
TrainResult train_rank(const Config& c, const TrainOptions& opt, Communicator& comm);
// Every rank as a thread.
TrainResult train_group(const Config& c, const TrainOptions& opt, double timeout_s = 0);

}  // namespace laga
