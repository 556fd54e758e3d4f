// The vectorised row operations of the attention kernels and the bf16 conversions of the matmul's
// widening path: one implementation over Google Highway (rows.cpp), compiled for every SIMD target
// the build allows (x86: AVX2 and AVX-512; aarch64: NEON, SVE) and chosen once at run time under
// LAGA_MAX_ISA (core/isa.hpp). Not an API: src/ops only. The math of the softmax rows is derived in
// docs/attention.md; attention_internal.hpp documents each operation where the kernels call it.
//
// Every target computes each element the same way (exp2 by the same polynomial and FMA, bf16 by
// round-to-nearest-even as to_bf16()); sums over a row run in vector lanes, so their order, and the
// last bits of a sum, follow the target's vector width.
#pragma once

#include <cstdint>
#include <vector>

#include "laga/core/dtype.hpp"

namespace laga::rows {

struct Kernels {
  // Highway's name of the target, e.g. "AVX2", "AVX3"; "AVX3+BF16" where bf16 is
  const char* target;
  // stored by the CPU's own conversion (AVX-512 BF16), to the same bits
  float (*row_max)(const float* x, int64_t n);
  float (*row_exp2_f32)(const float* s, float* p, int64_t n, int64_t nk, float c, float m);
  float (*row_exp2_bf16)(const float* s, bf16* p, int64_t n, int64_t nk, float c, float m);
  float (*tile_delta_row)(const float* s, const float* dp, int64_t n, float c, float lse2);
  void (*tile_delta_cols)(const float* st, const float* dpt, int64_t ld, int64_t n, int64_t t0,
                          float c, const float* lse2, float* delta);
  void (*row_grad_f32)(const float* s, const float* dp, float* ds, int64_t n, int64_t nk, float c,
                       float lse2, float delta);
  void (*row_grad_bf16)(const float* s, const float* dp, bf16* ds, int64_t n, int64_t nk, float c,
                        float lse2, float delta);
  void (*span_grad_f32)(const float* s, const float* dp, float* p, float* ds, int64_t n, float c,
                        const float* lse2, const float* delta);
  void (*span_grad_bf16)(const float* s, const float* dp, bf16* p, bf16* ds, int64_t n, float c,
                         const float* lse2, const float* delta);
  float (*dot_f32_f32)(const float* a, const float* b, int64_t n);
  float (*dot_bf16_f32)(const bf16* a, const float* b, int64_t n);
  float (*dot_f64_f32_f32)(const float* a, const float* b, int64_t n);
  float (*dot_f64_bf16_f32)(const bf16* a, const float* b, int64_t n);
  float (*dot_f64_bf16_bf16)(const bf16* a, const bf16* b, int64_t n);
  void (*scale_f32)(const float* x, float* y, int64_t n, float mul);
  void (*scale_bf16)(const float* x, bf16* y, int64_t n, float mul);
  void (*softmax_grad_f32)(const float* p, const float* dp, float* ds, int64_t n, float delta);
  void (*softmax_grad_bf16)(const bf16* p, const float* dp, bf16* ds, int64_t n, float delta);
  void (*widen)(const bf16* x, float* y, int64_t n);   // y = x
  void (*narrow)(const float* x, bf16* y, int64_t n);  // y = to_bf16(x)
};

// The kernels of the best target the CPU has under LAGA_MAX_ISA, chosen on first use.
const Kernels& kernels();
// The kernels of every x86 target compiled in that this CPU runs under LAGA_MAX_ISA, best first
// (for tests: an AVX-512 machine checks its AVX2 kernels too); elsewhere the dispatched one.
std::vector<Kernels> every_target();

}  // namespace laga::rows
