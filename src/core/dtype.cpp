#include "laga/core/dtype.hpp"

#include "laga/core/error.hpp"

namespace laga {

std::string_view dtype_name(DType t) {
  return t == DType::f32 ? "fp32" : t == DType::bf16 ? "bf16" : "int32";
}

DType parse_dtype(std::string_view name) {
  if (name == "fp32" || name == "f32" || name == "float32") return DType::f32;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  LAGA_FAIL_USAGE("unknown dtype '{}'; valid: fp32, bf16", name);
}

}  // namespace laga
