#include "laga/core/progress.hpp"

#include <chrono>
#include <utility>

namespace laga {

namespace detail {
struct ProgressState {
  std::function<void()> fn;
  std::chrono::steady_clock::duration interval;
  std::chrono::steady_clock::time_point last;
  bool running = false;  // the hook's own work reaches no progress point again
};
}  // namespace detail

namespace {
thread_local detail::ProgressState* g_hook = nullptr;
}

void progress_point() {
  detail::ProgressState* h = g_hook;
  if (!h || h->running) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - h->last < h->interval) return;
  h->running = true;
  try {
    h->fn();
  } catch (...) {
    h->running = false;
    throw;
  }
  h->running = false;
  h->last = std::chrono::steady_clock::now();
}

ProgressHook::ProgressHook(std::function<void()> fn, double interval_s) : prev_(g_hook) {
  if (interval_s <= 0) return;
  g_hook =
      new detail::ProgressState{std::move(fn),
                                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(interval_s)),
                                std::chrono::steady_clock::now()};
  installed_ = true;
}

ProgressHook::~ProgressHook() {
  if (!installed_) return;
  delete g_hook;
  g_hook = prev_;
}

}  // namespace laga
