// Tensor: a dense row-major array of fp32 or bf16 whose storage comes from the current
// MemoryTracker under a tag. Copies share storage (like torch.Tensor); views (reshape, rows) share
// it too and allocate nothing. There are no strides: every tensor is contiguous, and ops that need
// strided access (a head slice, V inside the latent) take pointers and strides in their params.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "laga/core/dtype.hpp"
#include "laga/core/error.hpp"
#include "laga/core/memory.hpp"

namespace laga {

using Shape = std::vector<int64_t>;

// Elementwise loops over fewer elements than this run on the calling thread: waking a team costs
// more than the work, and a descheduled second thread would stall it.
inline constexpr int64_t kParallelMin = int64_t(1) << 15;
std::string shape_str(const Shape& s);  // "[4, 1, 16]"
int64_t shape_numel(const Shape& s);

class Storage {
 public:
  Storage(int64_t bytes, std::string tag, MemoryTracker& tracker);
  // Memory owned elsewhere (a torch tensor's): counted by no tracker, kept alive by `owner` while
  // this storage lives.
  Storage(void* data, int64_t bytes, std::string tag, std::shared_ptr<void> owner);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  const std::string& tag() const { return tag_; }
  bool meta() const { return tracker_ && tracker_->meta(); }
  // This storage counted by `to` from now on, and released there (MemoryTracker::hand_over).
  void hand_over(MemoryTracker& to);

 private:
  void* data_;
  int64_t bytes_;
  std::string tag_;
  MemoryTracker* tracker_;      // null for external memory
  std::shared_ptr<void> owner_;  // external memory's owner
};

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised storage from current_tracker(); the tag names the tensor in memory breakdowns.
  static Tensor empty(const Shape& shape, DType dtype, const std::string& tag);
  static Tensor zeros(const Shape& shape, DType dtype, const std::string& tag);
  // A view of external memory (data: shape's elements of dtype, contiguous), which `owner` keeps
  // alive; no tracker counts it. What the Python package wraps a torch tensor in.
  static Tensor external(void* data, const Shape& shape, DType dtype, const std::string& tag,
                         std::shared_ptr<void> owner);
  // Values rounded to dtype; values.size() must equal the shape's element count.
  static Tensor from_floats(const Shape& shape, DType dtype, const std::vector<float>& values,
                            const std::string& tag);

  bool defined() const { return storage_ != nullptr; }
  // Made by a meta tracker: sized and tracked, no storage (see memory.hpp). Data access is an
  // error.
  bool is_meta() const { return storage_ && storage_->meta(); }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const;  // negative counts from the end
  int rank() const { return int(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  int64_t nbytes() const { return numel() * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  const std::string& tag() const;

  void* raw() const;
  template <class T>
  T* data() const {
    LAGA_ASSERT(sizeof(T) == size_t(dtype_size(dtype_)),
                "tensor '{}' is {}, accessed as a {}-byte type", tag(), dtype_name(dtype_),
                sizeof(T));
    return static_cast<T*>(raw());
  }

  Tensor reshape(const Shape& shape) const;       // same storage; element count must match
  Tensor rows(int64_t begin, int64_t end) const;  // view of [begin, end) along dim 0

  float get(int64_t flat_index) const;  // slow element access for tests and tools
  void set(int64_t flat_index, float value);
  std::vector<float> to_floats() const;
  void fill(float value);
  void copy_from(const Tensor& src);  // same shape; converts dtype
  Tensor clone(const std::string& tag) const;
  // The storage (with every view of it) counted by `to` from now on, not copied: a rank's result
  // that outlives the rank's tracker.
  void hand_over(MemoryTracker& to);
  Tensor to(DType dtype, const std::string& tag) const;
  // Keeps this tensor's storage alive while held: how another owner (torch) takes the memory.
  std::shared_ptr<const void> storage_owner() const { return storage_; }

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_bytes_ = 0;
  Shape shape_;
  DType dtype_ = DType::f32;
};

// Boundary check: names the tensor and both shapes.
void check_shape(const Tensor& t, const Shape& expected, const char* name);
void check_dtype(const Tensor& t, DType expected, const char* name);

}  // namespace laga
