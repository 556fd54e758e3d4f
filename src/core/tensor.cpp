#include "laga/core/tensor.hpp"
#include "laga/core/work.hpp"

#include <cstring>
#include <type_traits>

namespace laga {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Storage::Storage(int64_t bytes, std::string tag, MemoryTracker& tracker)
    : data_(tracker.allocate(bytes, tag)),
      bytes_(bytes),
      tag_(std::move(tag)),
      tracker_(&tracker) {}

Storage::Storage(void* data, int64_t bytes, std::string tag, std::shared_ptr<void> owner)
    : data_(data), bytes_(bytes), tag_(std::move(tag)), tracker_(nullptr), owner_(std::move(owner)) {}

Storage::~Storage() {
  if (tracker_) tracker_->release(data_, bytes_, tag_);
}

void Storage::hand_over(MemoryTracker& to) {
  LAGA_CHECK(tracker_, "tensor '{}' is external memory: no tracker to hand it over from", tag_);
  tracker_->hand_over(bytes_, tag_, to);
  tracker_ = &to;
}

void Tensor::hand_over(MemoryTracker& to) {
  LAGA_CHECK(defined(), "hand_over of an undefined tensor");
  storage_->hand_over(to);
}

Tensor Tensor::external(void* data, const Shape& shape, DType dtype, const std::string& tag,
                        std::shared_ptr<void> owner) {
  for (int64_t d : shape)
    LAGA_CHECK(d >= 0, "tensor '{}' has a negative dimension in {}", tag, shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(data, shape_numel(shape) * dtype_size(dtype), tag,
                                         std::move(owner));
  return t;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, const std::string& tag) {
  for (int64_t d : shape)
    LAGA_CHECK(d >= 0, "tensor '{}' has a negative dimension in {}", tag, shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ =
      std::make_shared<Storage>(shape_numel(shape) * dtype_size(dtype), tag, current_tracker());
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, const std::string& tag) {
  Tensor t = empty(shape, dtype, tag);
  WorkOp work(stream_work(WorkClass::accumulate, "fill", dtype, double(t.nbytes())));
  if (t.nbytes() && !meta_mode()) std::memset(t.raw(), 0, size_t(t.nbytes()));
  return t;
}

Tensor Tensor::from_floats(const Shape& shape, DType dtype, const std::vector<float>& values,
                           const std::string& tag) {
  LAGA_CHECK(int64_t(values.size()) == shape_numel(shape), "tensor '{}': {} values for shape {}",
             tag, values.size(), shape_str(shape));
  Tensor t = empty(shape, dtype, tag);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, values[size_t(i)]);
  return t;
}

int64_t Tensor::dim(int i) const {
  int r = rank();
  int j = i < 0 ? r + i : i;
  LAGA_ASSERT(j >= 0 && j < r, "dim {} of tensor '{}' with shape {}", i, tag(), shape_str(shape_));
  return shape_[size_t(j)];
}

const std::string& Tensor::tag() const {
  static const std::string undefined = "<undefined>";
  return storage_ ? storage_->tag() : undefined;
}

void* Tensor::raw() const {
  LAGA_ASSERT(storage_, "access to an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_bytes_;
}

Tensor Tensor::reshape(const Shape& shape) const {
  LAGA_ASSERT(shape_numel(shape) == numel(), "reshape of '{}' from {} to {}", tag(),
              shape_str(shape_), shape_str(shape));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  LAGA_ASSERT(rank() >= 1 && 0 <= begin && begin <= end && end <= shape_[0],
              "rows [{}, {}) of '{}' with shape {}", begin, end, tag(), shape_str(shape_));
  Tensor t = *this;
  int64_t row = numel() / (shape_[0] ? shape_[0] : 1);
  t.offset_bytes_ += begin * row * dtype_size(dtype_);
  t.shape_[0] = end - begin;
  return t;
}

float Tensor::get(int64_t i) const {
  LAGA_ASSERT(!is_meta(), "element access to meta tensor '{}' (it has no storage)", tag());
  if (dtype_ == DType::i32) return float(static_cast<const int32_t*>(raw())[i]);
  return dtype_ == DType::f32 ? static_cast<const float*>(raw())[i]
                              : to_float(static_cast<const bf16*>(raw())[i]);
}

void Tensor::set(int64_t i, float v) {
  LAGA_ASSERT(!is_meta(), "element access to meta tensor '{}' (it has no storage)", tag());
  if (dtype_ == DType::f32)
    static_cast<float*>(raw())[i] = v;
  else if (dtype_ == DType::i32)
    static_cast<int32_t*>(raw())[i] = int32_t(v);
  else
    static_cast<bf16*>(raw())[i] = to_bf16(v);
}

std::vector<float> Tensor::to_floats() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) out[size_t(i)] = get(i);
  return out;
}

void Tensor::fill(float v) {
  WorkOp work(stream_work(WorkClass::accumulate, "fill", dtype_, double(nbytes())));
  if (is_meta()) return;
  for (int64_t i = 0; i < numel(); ++i) set(i, v);
}

void Tensor::copy_from(const Tensor& src) {
  LAGA_ASSERT(src.shape_ == shape_, "copy into '{}' {} from '{}' {}", tag(), shape_str(shape_),
              src.tag(), shape_str(src.shape_));
  WorkOp work(
      src.dtype_ == dtype_
          ? stream_work(WorkClass::accumulate, "copy", dtype_, 2.0 * double(nbytes()))
          : stream_work(WorkClass::accumulate, "convert", dtype_, double(src.nbytes() + nbytes())));
  if (is_meta()) return;
  if (src.dtype_ == dtype_) {
    if (nbytes()) std::memmove(raw(), src.raw(), size_t(nbytes()));
    return;
  }
  LAGA_ASSERT(dtype_ != DType::i32 && src.dtype_ != DType::i32,
              "no conversion between indices and values ('{}' into '{}')", src.tag(), tag());
  // Element for element as get and set convert (through float), in one typed loop.
  const int64_t n = numel();
  dispatch_dtype(dtype_, [&](auto* into_tag) {
    using D = std::remove_pointer_t<decltype(into_tag)>;
    dispatch_dtype(src.dtype_, [&](auto* from_tag) {
      using S = std::remove_pointer_t<decltype(from_tag)>;
      const S* from = static_cast<const S*>(src.raw());
      D* into = static_cast<D*>(raw());
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
      for (int64_t i = 0; i < n; ++i) into[i] = from_float<D>(to_float(from[i]));
    });
  });
}

Tensor Tensor::clone(const std::string& tag) const { return to(dtype_, tag); }

Tensor Tensor::to(DType dtype, const std::string& tag) const {
  Tensor t = empty(shape_, dtype, tag);
  t.copy_from(*this);
  return t;
}

void check_shape(const Tensor& t, const Shape& expected, const char* name) {
  LAGA_CHECK(t.defined(), "tensor {} is undefined; expected shape {}", name, shape_str(expected));
  LAGA_CHECK(t.shape() == expected, "tensor {} has shape {}; expected {}", name,
             shape_str(t.shape()), shape_str(expected));
}

void check_dtype(const Tensor& t, DType expected, const char* name) {
  LAGA_CHECK(t.dtype() == expected, "tensor {} is {}; expected {}", name, dtype_name(t.dtype()),
             dtype_name(expected));
}

}  // namespace laga
