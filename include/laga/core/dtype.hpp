// Storage types: fp32 and bf16. All arithmetic accumulates in fp32 (or fp64 in reference/);
// bf16 is a storage format converted with round-to-nearest-even. i32 holds indices only (the
// sparse forms' selected key rows): no op computes on it and no run stores activations in it.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace laga {

enum class DType { f32, bf16, i32 };

struct bf16 {
  uint16_t bits;
};

inline float to_float(bf16 v) {
  uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  // quiet NaN
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))
    return bf16{uint16_t((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return bf16{uint16_t(u >> 16)};
}

inline float to_float(float v) { return v; }
template <class T>
inline T from_float(float f);
template <>
inline float from_float<float>(float f) {
  return f;
}
template <>
inline bf16 from_float<bf16>(float f) {
  return to_bf16(f);
}

// Rounds through the storage type: what a value becomes once stored as T.
inline float round_to(DType t, float f) { return t == DType::bf16 ? to_float(to_bf16(f)) : f; }

inline int64_t dtype_size(DType t) { return t == DType::bf16 ? 2 : 4; }
std::string_view dtype_name(DType t);  // "fp32", "bf16", "int32"
// A storage dtype: "fp32"|"f32"|"float32", "bf16"|"bfloat16"; else usage error
DType parse_dtype(std::string_view name);

// Calls f with a null pointer of the storage type: dispatch(t, [&](auto* tag) { using T = ...; }).
// A storage dtype only (fp32, bf16): indices are never dispatched.
template <class F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  if (t == DType::f32) return f(static_cast<float*>(nullptr));
  return f(static_cast<bf16*>(nullptr));
}

}  // namespace laga
