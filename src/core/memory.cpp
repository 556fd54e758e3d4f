#include "laga/core/memory.hpp"

#include <cstdlib>
#include <new>

#include "laga/core/error.hpp"

namespace laga {

namespace {
constexpr int64_t kAlignment = 64;
thread_local MemoryTracker* tls_tracker = nullptr;
}  // namespace

void* MemoryTracker::allocate(int64_t bytes, const std::string& tag) {
  LAGA_ASSERT(bytes >= 0, "negative allocation of {} bytes for '{}'", bytes, tag);
  size_t rounded = size_t((bytes + kAlignment - 1) / kAlignment * kAlignment);
  void* ptr = nullptr;
  if (meta_) {
    std::lock_guard<std::mutex> lock(mutex_);
    ptr = reinterpret_cast<void*>(next_meta_address_);
    next_meta_address_ += int64_t(rounded) + kAlignment;  // distinct, never reused
  } else if (rounded) {
    ptr = std::aligned_alloc(kAlignment, rounded);
  }
  if (rounded && !ptr && !meta_)
    throw Error(ErrorKind::usage, __FILE__, __LINE__,
                fmt::format("out of memory allocating {} bytes for '{}' ({} bytes already live)", bytes, tag,
                            live_bytes()));
  std::lock_guard<std::mutex> lock(mutex_);
  live_ += bytes;
  ++allocations_;
  // A zero-byte tensor holds nothing, so it leaves no entry: two of them under one tag would otherwise
  // share an entry of 0 that the first release erases and the second cannot find.
  if (bytes > 0) live_by_tag_[tag] += bytes;
  if (live_ > peak_) {
    peak_ = live_;
    peak_by_tag_ = live_by_tag_;
  }
  return ptr;
}

void MemoryTracker::release(void* ptr, int64_t bytes, const std::string& tag) {
  if (!meta_) std::free(ptr);
  if (bytes == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  live_ -= bytes;
  auto it = live_by_tag_.find(tag);
  LAGA_ASSERT(it != live_by_tag_.end() && it->second >= bytes, "release of untracked tag '{}'", tag);
  if ((it->second -= bytes) == 0) live_by_tag_.erase(it);
}

int64_t MemoryTracker::live_bytes() const { std::lock_guard<std::mutex> l(mutex_); return live_; }
int64_t MemoryTracker::peak_bytes() const { std::lock_guard<std::mutex> l(mutex_); return peak_; }
int64_t MemoryTracker::allocations() const { std::lock_guard<std::mutex> l(mutex_); return allocations_; }
std::map<std::string, int64_t> MemoryTracker::live_by_tag() const { std::lock_guard<std::mutex> l(mutex_); return live_by_tag_; }
std::map<std::string, int64_t> MemoryTracker::peak_by_tag() const { std::lock_guard<std::mutex> l(mutex_); return peak_by_tag_; }

void MemoryTracker::reset_peak() {
  std::lock_guard<std::mutex> l(mutex_);
  peak_ = live_;
  peak_by_tag_ = live_by_tag_;
}

MemoryTracker& default_tracker() {
  static MemoryTracker tracker;
  return tracker;
}

MemoryTracker& current_tracker() { return tls_tracker ? *tls_tracker : default_tracker(); }

TrackerScope::TrackerScope(MemoryTracker& tracker) : previous_(tls_tracker) { tls_tracker = &tracker; }
TrackerScope::~TrackerScope() { tls_tracker = previous_; }

}  // namespace laga
