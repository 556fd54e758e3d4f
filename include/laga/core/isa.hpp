// The instruction sets laga's kernels use, and the one switch that caps them.
//
// LAGA_MAX_ISA (environment) = avx2 | avx512 caps, together and before any kernel runs, the SIMD
// target of the row operations (Google Highway, src/ops/rows.cpp) and oneDNN's matmul ISA
// (dnnl::set_max_cpu_isa; avx512 includes AVX-512 bf16 and VNNI, not AMX). Unset: the best the CPU
// has. A cap above what the CPU has changes nothing; a value that names no ISA is a usage error.
// Where oneDNN has no bf16 matmul (below AVX-512, or capped there), bf16 products are widened to
// fp32 (ops/matmul.hpp): the same semantics, so everything runs, and is tested, on every ISA.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>

namespace laga {

// Reads LAGA_MAX_ISA and applies it, once per process (later calls return at once). Usage error on
// a value that names no ISA, or on a cap this build cannot honour (a baseline above it,
// -march=native). Also refuses, with a message, an x86 CPU without the build's baseline (AVX2 and
// FMA by default).
void apply_isa_cap();

// The cap as given ("avx2", "avx512"), "" when unset.
std::string isa_cap();
// Whether oneDNN creates a bf16 matmul on this CPU under the cap (false: bf16 products are
// widened).
bool bf16_matmul_native();
// Whether the CPU has AVX-512 BF16 (vcvtneps2bf16), which no Highway target implies: the row
// operations' AVX-512 kernels then store bf16 with it (LAGA_MAX_ISA=avx2 excludes them).
bool cpu_has_avx512_bf16();

// The ISA in use: Highway's target of the row operations (e.g. "AVX2", "AVX3"), oneDNN's effective
// ISA (e.g. "avx512_core_bf16"), how bf16 products run, and the cap.
struct IsaInfo {
  std::string rows;    // Highway target
  std::string matmul;  // oneDNN's effective ISA
  bool bf16_native = false;
  std::string cap;  // LAGA_MAX_ISA, "" when unset
  // "rows AVX3, matmul avx512_core_bf16 (bf16 native), LAGA_MAX_ISA unset"
  std::string line() const;
  nlohmann::json to_json() const;
};
IsaInfo isa_info();

}  // namespace laga
