// The tracking allocator: every tensor's storage comes from a MemoryTracker, which counts live
// bytes, the peak of live bytes, and live bytes per tag — the semantics of
// torch.cuda.max_memory_allocated, counted exactly (requested bytes, no rounding), so that the
// planner can match it to the byte.
//
// Each rank has its own tracker. A thread uses the tracker installed by the innermost
// TrackerScope, or the process-wide default one. Trackers must outlive the tensors they allocated.
//
// Storage itself comes from the process's caching allocator (PyTorch's CUDA caching allocator, on
// the host): a released block of kPoolMinBytes or more is kept and handed to a later allocation of
// about its size instead of going back to the OS, so a large buffer allocated again (the eager
// kernel's T×T scores, every layer, every step) does not pay its first-touch page faults again.
// Trackers count logical (requested) bytes and never see the cache; what the process holds is
// reported beside them (pool_stats(): reserved = in use + cached, as torch reports reserved beside
// allocated). LAGA_ALLOC_CACHE=off in the environment turns the cache off (every block goes back at
// release).
//
// A meta tracker (PyTorch's meta device) counts exactly as a real one but allocates no storage:
// each allocation gets a distinct address in an unmapped range, never dereferenced, so that pointer
// arithmetic and overlap checks behave as on real buffers. Every kernel returns after its own
// allocations when the current tracker is meta (meta_mode()), so running the real forward and
// backward under a meta tracker plans their memory without computing anything.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace laga {

class MemoryTracker {
 public:
  explicit MemoryTracker(bool meta = false) : meta_(meta) {}
  bool meta() const { return meta_; }
  void* allocate(int64_t bytes, const std::string& tag);
  void release(void* ptr, int64_t bytes, const std::string& tag);
  // Hands an allocation of this tracker to `to` without copying it: it leaves this tracker's live
  // bytes and enters `to`'s (its peak too), as if `to` had allocated it; `to` releases it. Both
  // real or both meta.
  void hand_over(int64_t bytes, const std::string& tag, MemoryTracker& to);

  int64_t live_bytes() const;
  int64_t peak_bytes() const;
  int64_t allocations() const;  // number of allocate() calls so far
  std::map<std::string, int64_t> live_by_tag() const;
  // the live-by-tag breakdown when the peak was reached
  std::map<std::string, int64_t> peak_by_tag() const;
  void reset_peak();  // peak := live now

 private:
  void count(int64_t bytes, const std::string& tag);    // live += bytes (under the lock)
  void uncount(int64_t bytes, const std::string& tag);  // live −= bytes (under the lock)
  const bool meta_;
  int64_t next_meta_address_ = int64_t(1) << 48;  // the meta range: above any heap, far below 2^63
  mutable std::mutex mutex_;
  int64_t live_ = 0, peak_ = 0, allocations_ = 0;
  std::map<std::string, int64_t> live_by_tag_, peak_by_tag_;
};

// The process's caching allocator, across all trackers and threads.
struct PoolStats {
  bool enabled = true;         // false under LAGA_ALLOC_CACHE=off
  int64_t reserved_bytes = 0;  // held from the OS now: blocks in use (rounded) + cached
  int64_t cached_bytes = 0;    // released blocks kept for reuse
  int64_t peak_reserved_bytes = 0;
  int64_t in_use_bytes = 0;  // blocks handed out and not released (rounded sizes)
  int64_t peak_in_use_bytes = 0;
  int64_t hits = 0,
          misses = 0;     // allocations of a poolable size served from the cache / from the OS
  int64_t cap_bytes = 0;  // the bound's floor (an eighth of physical memory)
};
// A cached block serves a request of at least 7/8 of its size: a block in use holds at most 8/7 of
// what was asked (kPoolFitNum / kPoolFitDen).
inline constexpr int64_t kPoolFitNum = 8, kPoolFitDen = 7;
// smaller blocks go to malloc and back at once
inline constexpr int64_t kPoolMinBytes = int64_t(1) << 20;
// The most the cache holds from the OS (in use + cached) once this process has had `peak_in_use`
// bytes of blocks in use at once: a new block first evicts the least recently released cached
// blocks down to this bound (misses of several threads at one moment may pass it by their own
// blocks: each evicts for itself before it takes its block from the OS). A step whose blocks of
// every size (its no-miss set) fit within it finds them all cached the next time. With nothing
// evicted, a step holds a few per cent above its peak in use (block rounding, the order of
// releases; docs/architecture.md §2); 3/2 leaves room above that. Least recently released first: a
// step that needed more than the bound would miss on every block of a cyclic order, so the slack
// must cover the no-miss set.
inline constexpr int64_t kPoolSlackNum = 3, kPoolSlackDen = 2;
inline int64_t pool_bound(int64_t cap, int64_t peak_in_use) {
  return std::max(cap, peak_in_use * kPoolSlackNum / kPoolSlackDen);
}
PoolStats pool_stats();
// Blocks of kHugePageBytes or more start on a huge-page boundary and are advised MADV_HUGEPAGE
// (memory.cpp's os_allocate) unless LAGA_HUGE_PAGES=off; the kernel's transparent-huge-page mode
// ("always", "madvise", "never"; "unknown" where unreadable) decides whether they get huge pages
// (bytes.hpp's anon_huge_page_bytes(): how much of this process did).
inline constexpr int64_t kHugePageBytes = int64_t(2) << 20;
bool huge_pages_enabled();
// An on/off switch of the environment (LAGA_ALLOC_CACHE, LAGA_HUGE_PAGES): unset or "on" is on,
// "off" is off, anything else a usage error naming the variable, its value and the valid ones. The
// allocator reads its two switches at its first use; check_allocator_environment() reads them up
// front, so a misspelt value ends the CLI with exit 2 before any work instead of being taken for
// "on".
bool env_switch(const char* name);
void check_allocator_environment();
std::string transparent_huge_pages_mode();
// Returns every cached block to the OS (torch.cuda.empty_cache); blocks in use are unaffected.
void pool_empty_cache();
// The bound's floor (by default an eighth of physical memory), for a process that shares its
// machine and for tests; and the peaks (in use, reserved) set to what is held now
// (torch.cuda.reset_peak_memory_stats).
void pool_set_cap(int64_t bytes);
void pool_reset_peaks();
// An untracked block from the caching allocator (64-byte aligned; nullptr when the OS has none) and
// its release: workspace no tensor owns, e.g. oneDNN's scratchpad (ops/matmul.cpp). It counts in
// pool_stats' reserved bytes, never in a tracker's.
void* pool_allocate(size_t bytes);
void pool_release(void* p, size_t bytes);

// Between runs: every cached block back to the OS (pool_empty_cache), and the C heap's free memory
// too (malloc_trim). glibc raises its mmap threshold after a large block is freed (up to 32 MiB),
// so blocks below it then come from the heap, whose freed pages otherwise stay resident: a verify
// sweep held ~170–220 MiB more than it used (deepseek-v2-lite T 16 P 1,2 fp32).
void release_free_memory();

MemoryTracker& default_tracker();
MemoryTracker& current_tracker();
// True when this thread's current tracker is meta: kernels allocate, then skip their compute.
inline bool meta_mode() { return current_tracker().meta(); }

// Installs a tracker for this thread until the scope ends.
class TrackerScope {
 public:
  explicit TrackerScope(MemoryTracker& tracker);
  ~TrackerScope();
  TrackerScope(const TrackerScope&) = delete;
  TrackerScope& operator=(const TrackerScope&) = delete;

 private:
  MemoryTracker* previous_;
};

}  // namespace laga
