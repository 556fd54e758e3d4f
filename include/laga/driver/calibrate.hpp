// Calibrating the performance model (driver/model.hpp) on this machine: the rate of each operation
// class measured with laga's own kernels (ops/linear, ops/attention, ops/rmsnorm, ops/rope) at the
// shapes a `small`-preset bench runs, in both dtypes, on P ranks as threads with the threads per
// rank bench uses (max(1, cores / P)), all ranks working at once as they do in a run, every rate
// read in two rounds (a third where they disagree, CalibrationOptions::agree); and the in-process
// link measured with laga's Communicator over a few sizes, fitted as latency + bytes / busbw.
// docs/model.md §3 lists the shapes and what each rate means.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "laga/driver/model.hpp"

namespace laga {

struct CalibrationOptions {
  int64_t sp = 2;       // ranks working at once
  int reps = 3;         // timed repeats per measurement after one warm-up; their median is kept
  double agree = 0.10;  // two rounds' readings of a rate further apart than this: a third is read
  // T at which every compute rate is measured (a rate by T, model.hpp)
  std::vector<int64_t> seqs = {2048};
  // measure the threads link (else the caller supplies one, e.g. from bench-comm)
  bool link = true;
  std::function<void(const std::string&)> progress;  // one line per measurement, when set
};

// A hardware file for this machine: compute for bf16 and fp32, intra_node link of the threads
// backend (when opt.link), ranks_per_node = sp, and notes naming the shapes and threads.
HardwareSpec calibrate_machine(const CalibrationOptions& opt);

// The threads backend's link at P ranks: each collective over sizes S = 64 KiB .. 16 MiB (bf16),
// the slowest rank's mean time per call, fitted per op (fits: the fit of each op, for the report).
LinkSpec calibrate_threads_link(int64_t P, int reps,
                                std::map<CollectiveOp, LatencyBandwidthFit>* fits = nullptr);

// What one measurement reports: the median of its timed repeats, times[0] (the warm-up) left out;
// bench reports the median of its iterations, so its rows and these rates are read alike.
double median_after_warmup(std::vector<double> times);

// The median of xs (of an even count, the mean of the middle two).
double median(std::vector<double> xs);

}  // namespace laga
