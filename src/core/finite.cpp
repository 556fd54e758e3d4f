#include "laga/core/finite.hpp"

#include <atomic>
#include <cmath>

namespace laga {

namespace {
std::atomic<bool> g_on{false};
}

void set_check_finite(bool on) { g_on = on; }
bool check_finite_enabled() { return g_on.load(std::memory_order_relaxed); }

void check_finite(const Tensor& t, const std::string& name, const std::string& step) {
  if (!check_finite_enabled() || !t.defined() || t.is_meta()) return;
  int64_t first = -1;
  dispatch_dtype(t.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel() && first < 0; ++i)
      if (!std::isfinite(to_float(p[i]))) first = i;
  });
  if (first < 0) return;
  throw Error(ErrorKind::failure, __FILE__, __LINE__,
              fmt::format("non-finite value in {} at {}: element {} of {} {} is {}", name, step,
                          first, shape_str(t.shape()), t.tag(), t.get(first)));
}

}  // namespace laga
