#include "laga/core/memory.hpp"

#include <malloc.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <new>
#include <unordered_map>
#include <vector>

#include "laga/core/error.hpp"

namespace laga {

namespace {
constexpr int64_t kAlignment = 64;
thread_local MemoryTracker* tls_tracker = nullptr;

// The caching allocator. Poolable blocks (≥ kPoolMinBytes) are rounded up to kPoolGranule and a cached
// block is reused for a request of at most its size and at least 7/8 of it (best fit), so a block is
// never much larger than what uses it. The cache is bounded: when it would hold more than kCacheCap of
// physical memory (an eighth), the largest cached blocks go back first.
constexpr int64_t kPoolGranule = int64_t(1) << 16;

class Pool {
 public:
  // Never destroyed: tensors of static lifetime may be released after every static destructor has run,
  // and the cached blocks stay reachable from here (no leak reported at exit).
  static Pool& get() {
    static Pool* pool = new Pool;
    return *pool;
  }
  // A block of at least `bytes` (already aligned), or nullptr when the OS has none.
  void* allocate(size_t bytes) {
    if (!enabled_ || int64_t(bytes) < kPoolMinBytes) return std::aligned_alloc(kAlignment, bytes);
    const size_t size = round(bytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = cached_.lower_bound(size);
      static_assert(kPoolFitNum == 8 && kPoolFitDen == 7, "a request takes a cached block of at most 8/7 its size");
      if (it != cached_.end() && it->first - it->first / 8 <= size) {
        void* p = it->second;
        in_use_[p] = it->first;
        cached_bytes_ -= int64_t(it->first);
        cached_.erase(it);
        ++hits_;
        return p;
      }
      ++misses_;
    }
    void* p = std::aligned_alloc(kAlignment, size);
    if (!p) {  // the OS refuses: give back what is cached and try once more
      pool_empty_cache();
      p = std::aligned_alloc(kAlignment, size);
      if (!p) return nullptr;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    in_use_[p] = size;
    reserved_ += int64_t(size);
    peak_reserved_ = std::max(peak_reserved_, reserved_);
    return p;
  }
  void release(void* p, size_t bytes) {
    if (!enabled_ || int64_t(bytes) < kPoolMinBytes) return std::free(p);
    std::vector<void*> out;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = in_use_.find(p);
      LAGA_ASSERT(it != in_use_.end(), "release of a block the caching allocator did not hand out");
      const size_t size = it->second;
      in_use_.erase(it);
      cached_.emplace(size, p);
      cached_bytes_ += int64_t(size);
      while (cached_bytes_ > cap_ && !cached_.empty()) {
        auto big = std::prev(cached_.end());
        cached_bytes_ -= int64_t(big->first);
        reserved_ -= int64_t(big->first);
        out.push_back(big->second);
        cached_.erase(big);
      }
    }
    for (void* q : out) std::free(q);
  }
  void empty() {
    std::vector<void*> out;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& [size, p] : cached_) out.push_back(p), reserved_ -= int64_t(size);
      cached_.clear();
      cached_bytes_ = 0;
    }
    for (void* q : out) std::free(q);
  }
  PoolStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {enabled_, reserved_, cached_bytes_, peak_reserved_, hits_, misses_, cap_};
  }

 private:
  Pool() {
    const char* env = std::getenv("LAGA_ALLOC_CACHE");
    enabled_ = !(env && std::string(env) == "off");
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    cap_ = pages > 0 && page > 0 ? int64_t(pages) * page / 8 : int64_t(2) << 30;
  }
  static size_t round(size_t bytes) { return (bytes + kPoolGranule - 1) / kPoolGranule * kPoolGranule; }
  bool enabled_ = true;
  int64_t cap_ = 0;
  std::mutex mutex_;
  std::multimap<size_t, void*> cached_;
  std::unordered_map<void*, size_t> in_use_;
  int64_t reserved_ = 0, cached_bytes_ = 0, peak_reserved_ = 0, hits_ = 0, misses_ = 0;
};
}  // namespace

void release_free_memory() {
  pool_empty_cache();
  malloc_trim(0);
}

PoolStats pool_stats() { return Pool::get().stats(); }
void* pool_allocate(size_t bytes) {
  return Pool::get().allocate(size_t((bytes + kAlignment - 1) / kAlignment * kAlignment));
}
void pool_release(void* p, size_t bytes) {
  Pool::get().release(p, size_t((bytes + kAlignment - 1) / kAlignment * kAlignment));
}
void pool_empty_cache() { Pool::get().empty(); }

void* MemoryTracker::allocate(int64_t bytes, const std::string& tag) {
  LAGA_ASSERT(bytes >= 0, "negative allocation of {} bytes for '{}'", bytes, tag);
  size_t rounded = size_t((bytes + kAlignment - 1) / kAlignment * kAlignment);
  void* ptr = nullptr;
  if (meta_) {
    std::lock_guard<std::mutex> lock(mutex_);
    ptr = reinterpret_cast<void*>(next_meta_address_);
    next_meta_address_ += int64_t(rounded) + kAlignment;  // distinct, never reused
  } else if (rounded) {
    ptr = Pool::get().allocate(rounded);
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
  if (!meta_ && ptr) Pool::get().release(ptr, size_t((bytes + kAlignment - 1) / kAlignment * kAlignment));
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
