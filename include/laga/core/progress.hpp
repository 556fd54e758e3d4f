// Progress on communication in flight from inside long computations.
//
// Some transports move a non-blocking transfer only while the rank is inside one of their calls:
// OpenMPI has no progress thread, so over TCP a message moves during compute only as far as the
// kernel's socket buffer took it at the last MPI call, and a rendezvous or a collective's next
// round waits for the next call. A collective meant to hide behind compute then waits for the
// rank's own wait. The communicator of such a transport installs a ProgressHook on its rank's
// thread; compute calls progress_point() at its natural breaks (every matmul, which includes every
// tile of the attention kernels), and the hook runs at most once per interval there. Threads
// without a hook (OpenMP workers, the threads backend's ranks, whose copies are the rank's own CPU
// work) pay one thread-local read.
#pragma once

#include <functional>

namespace laga {
namespace detail {
struct ProgressState;  // progress.cpp
}

// Runs this thread's hook if one is installed and its interval has passed since it last ran.
void progress_point();

// Makes fn this thread's hook, run at most once every interval_s seconds, until destroyed (the
// previous hook then again). interval_s 0 installs nothing: progress only inside the transport's
// calls.
class ProgressHook {
 public:
  ProgressHook(std::function<void()> fn, double interval_s);
  ~ProgressHook();
  ProgressHook(const ProgressHook&) = delete;
  ProgressHook& operator=(const ProgressHook&) = delete;

 private:
  detail::ProgressState* prev_;
  bool installed_ = false;
};

}  // namespace laga
