#include "laga/core/memory.hpp"

#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <list>
#include <map>
#include <new>
#include <unordered_map>
#include <vector>

#include "laga/core/error.hpp"

namespace laga {

bool env_switch(const char* name) {
  const char* env = std::getenv(name);
  if (!env || std::string(env) == "on") return true;
  if (std::string(env) == "off") return false;
  LAGA_FAIL_USAGE("{}='{}' is not a valid value; valid: on or off (unset means on)", name, env);
}

bool huge_pages_enabled() {
  static const bool on = env_switch("LAGA_HUGE_PAGES");
  return on;
}

void check_allocator_environment() {
  env_switch("LAGA_ALLOC_CACHE");
  env_switch("LAGA_HUGE_PAGES");
}

namespace {
constexpr int64_t kAlignment = 64;
thread_local MemoryTracker* tls_tracker = nullptr;

// The caching allocator. Poolable blocks (≥ kPoolMinBytes) are rounded up to kPoolGranule and a
// cached block is reused for a request of at most its size and at least 7/8 of it (best fit), so a
// block is never much larger than what uses it. What it holds is bounded (pool_bound): before a
// miss takes a new block from the OS, the least recently released cached blocks go back until the
// new block fits within pool_bound: max(cap, 3/2 × the most this process ever had in use at once).
// A training step that allocates the same blocks each time keeps them all, and a stream of ever-new
// sizes gives back the oldest first.
constexpr int64_t kPoolGranule = int64_t(1) << 16;

// A block from the OS. One of kHugePageBytes or more starts on a huge-page boundary and is advised
// MADV_HUGEPAGE, so that every whole 2 MiB of it can be one transparent huge page (the kernel's THP
// mode "madvise", Debian's default, gives huge pages to advised ranges only): one TLB entry and one
// page fault where 4 KiB pages take 512. The attention kernels read a head's K/V rows strided by
// every head's width, over thousands of 4 KiB pages at T in the thousands (docs/architecture.md
// §2); the block's size is what was asked (its last partial 2 MiB stays in small pages), so nothing
// changes in what the allocator counts. LAGA_HUGE_PAGES=off leaves every block in small pages.
// Freed with std::free.
void* os_allocate(size_t bytes) {
  if (!huge_pages_enabled() || int64_t(bytes) < kHugePageBytes)
    return std::aligned_alloc(kAlignment, bytes);
  void* p = nullptr;
  if (posix_memalign(&p, size_t(kHugePageBytes), bytes) != 0) return nullptr;
  // a hint: where THP is off or unsupported the block keeps small pages
  madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

class Pool {
 public:
  // Never destroyed: tensors of static lifetime may be released after every static destructor has
  // run, and the cached blocks stay reachable from here (no leak reported at exit).
  static Pool& get() {
    static Pool* pool = new Pool;
    return *pool;
  }
  // A block of at least `bytes` (already aligned), or nullptr when the OS has none.
  void* allocate(size_t bytes) {
    if (!enabled_ || int64_t(bytes) < kPoolMinBytes) return os_allocate(bytes);
    const size_t size = round(bytes);
    std::vector<void*> out;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = by_size_.lower_bound(size);
      static_assert(kPoolFitNum == 8 && kPoolFitDen == 7,
                    "a request takes a cached block of at most 8/7 its size");
      if (it != by_size_.end() && it->first - it->first / 8 <= size) {
        void* p = it->second->p;
        take(p, it->first);
        cached_bytes_ -= int64_t(it->first);
        lru_.erase(it->second);
        by_size_.erase(it);
        ++hits_;
        return p;
      }
      ++misses_;
      const int64_t bound = pool_bound(cap_, std::max(peak_in_use_, in_use_bytes_ + int64_t(size)));
      while (reserved_ + int64_t(size) > bound && !lru_.empty()) out.push_back(evict_oldest());
    }
    for (void* q : out) std::free(q);
    void* p = os_allocate(size);
    if (!p) {  // the OS refuses: give back what is cached and try once more
      pool_empty_cache();
      p = os_allocate(size);
      if (!p) return nullptr;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    take(p, size);
    reserved_ += int64_t(size);
    peak_reserved_ = std::max(peak_reserved_, reserved_);
    return p;
  }
  void release(void* p, size_t bytes) {
    if (!enabled_ || int64_t(bytes) < kPoolMinBytes) return std::free(p);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = in_use_.find(p);
    LAGA_ASSERT(it != in_use_.end(), "release of a block the caching allocator did not hand out");
    const size_t size = it->second;
    in_use_.erase(it);
    in_use_bytes_ -= int64_t(size);
    by_size_.emplace(size, lru_.insert(lru_.end(), Cached{size, p}));
    cached_bytes_ += int64_t(size);
  }
  void empty() {
    std::vector<void*> out;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (!lru_.empty()) out.push_back(evict_oldest());
    }
    for (void* q : out) std::free(q);
  }
  void set_cap(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    cap_ = bytes;
  }
  void reset_peaks() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_in_use_ = in_use_bytes_, peak_reserved_ = reserved_;
  }
  PoolStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {enabled_, reserved_, cached_bytes_, peak_reserved_, in_use_bytes_, peak_in_use_,
            hits_,    misses_,   cap_};
  }

 private:
  struct Cached {
    size_t size;
    void* p;
  };
  Pool() {
    enabled_ = env_switch("LAGA_ALLOC_CACHE");
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    cap_ = pages > 0 && page > 0 ? int64_t(pages) * page / 8 : int64_t(2) << 30;
  }
  static size_t round(size_t bytes) {
    return (bytes + kPoolGranule - 1) / kPoolGranule * kPoolGranule;
  }
  void take(void* p, size_t size) {  // under mutex_
    in_use_[p] = size;
    in_use_bytes_ += int64_t(size);
    peak_in_use_ = std::max(peak_in_use_, in_use_bytes_);
  }
  void* evict_oldest() {  // under mutex_; the caller frees the block outside the lock
    const Cached c = lru_.front();
    auto range = by_size_.equal_range(c.size);
    for (auto it = range.first; it != range.second; ++it)
      if (it->second == lru_.begin()) {
        by_size_.erase(it);
        break;
      }
    lru_.pop_front();
    cached_bytes_ -= int64_t(c.size);
    reserved_ -= int64_t(c.size);
    return c.p;
  }
  bool enabled_ = true;
  int64_t cap_ = 0;
  std::mutex mutex_;
  // cached blocks, least recently released first
  std::list<Cached> lru_;
  // the same blocks by size (best fit)
  std::multimap<size_t, std::list<Cached>::iterator> by_size_;
  std::unordered_map<void*, size_t> in_use_;
  int64_t reserved_ = 0, cached_bytes_ = 0, peak_reserved_ = 0, in_use_bytes_ = 0, peak_in_use_ = 0;
  int64_t hits_ = 0, misses_ = 0;
};
}  // namespace

void release_free_memory() {
  pool_empty_cache();
  malloc_trim(0);
}

PoolStats pool_stats() { return Pool::get().stats(); }

std::string transparent_huge_pages_mode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");  // "always [madvise] never"
  std::string line;
  if (!std::getline(f, line)) return "unknown";
  const size_t a = line.find('['), b = line.find(']');
  return a != std::string::npos && b != std::string::npos && b > a ? line.substr(a + 1, b - a - 1)
                                                                   : "unknown";
}

void* pool_allocate(size_t bytes) {
  return Pool::get().allocate(size_t((bytes + kAlignment - 1) / kAlignment * kAlignment));
}
void pool_release(void* p, size_t bytes) {
  Pool::get().release(p, size_t((bytes + kAlignment - 1) / kAlignment * kAlignment));
}
void pool_empty_cache() { Pool::get().empty(); }
void pool_set_cap(int64_t bytes) {
  LAGA_ASSERT(bytes >= 0, "the caching allocator's cap must be ≥ 0 bytes, not {}", bytes);
  Pool::get().set_cap(bytes);
}
void pool_reset_peaks() { Pool::get().reset_peaks(); }

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
                fmt::format("out of memory allocating {} bytes for '{}' ({} bytes already live)",
                            bytes, tag, live_bytes()));
  count(bytes, tag);
  std::lock_guard<std::mutex> lock(mutex_);
  ++allocations_;
  return ptr;
}

void MemoryTracker::count(int64_t bytes, const std::string& tag) {
  std::lock_guard<std::mutex> lock(mutex_);
  live_ += bytes;
  // A zero-byte tensor holds nothing, so it leaves no entry: two of them under one tag would
  // otherwise share an entry of 0 that the first release erases and the second cannot find.
  if (bytes > 0) live_by_tag_[tag] += bytes;
  if (live_ > peak_) {
    peak_ = live_;
    peak_by_tag_ = live_by_tag_;
  }
}

void MemoryTracker::uncount(int64_t bytes, const std::string& tag) {
  if (bytes == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  live_ -= bytes;
  auto it = live_by_tag_.find(tag);
  LAGA_ASSERT(it != live_by_tag_.end() && it->second >= bytes, "release of untracked tag '{}'",
              tag);
  if ((it->second -= bytes) == 0) live_by_tag_.erase(it);
}

void MemoryTracker::hand_over(int64_t bytes, const std::string& tag, MemoryTracker& to) {
  LAGA_ASSERT(meta_ == to.meta_, "tensor '{}' handed between a meta and a real tracker", tag);
  if (&to == this) return;
  uncount(bytes, tag);
  to.count(bytes, tag);
}

void MemoryTracker::release(void* ptr, int64_t bytes, const std::string& tag) {
  if (!meta_ && ptr)
    Pool::get().release(ptr, size_t((bytes + kAlignment - 1) / kAlignment * kAlignment));
  uncount(bytes, tag);
}

int64_t MemoryTracker::live_bytes() const {
  std::lock_guard<std::mutex> l(mutex_);
  return live_;
}
int64_t MemoryTracker::peak_bytes() const {
  std::lock_guard<std::mutex> l(mutex_);
  return peak_;
}
int64_t MemoryTracker::allocations() const {
  std::lock_guard<std::mutex> l(mutex_);
  return allocations_;
}
std::map<std::string, int64_t> MemoryTracker::live_by_tag() const {
  std::lock_guard<std::mutex> l(mutex_);
  return live_by_tag_;
}
std::map<std::string, int64_t> MemoryTracker::peak_by_tag() const {
  std::lock_guard<std::mutex> l(mutex_);
  return peak_by_tag_;
}

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

TrackerScope::TrackerScope(MemoryTracker& tracker) : previous_(tls_tracker) {
  tls_tracker = &tracker;
}
TrackerScope::~TrackerScope() { tls_tracker = previous_; }

}  // namespace laga
