// The lightning indexer's score micro-kernels (indexer.cpp): one implementation over Google Highway
// (indexer_kernel.cpp), compiled for every SIMD target the build allows and chosen once at run time
// under LAGA_MAX_ISA, like rows.hpp. Not an API: src/ops/indexer.cpp only.
//
// Every (head j, key s) product a_js = q_j · k_s is one chain over d from 0, in one vector lane per
// key, and a score I_s = Σ_j c_j · ReLU(a_js) is one FMA chain over j = 0 .. H−1 from 0. Lanes
// never mix, so a key's result does not depend on its lane, its tile, the register blocking or the
// vector width. The fp32 kernels give on every target the bits of the scalar loop
//   a = 0; for d: a = fma(q[j, d], k[s, d], a)     I = 0; for j: I = fma(c[j], max(a_j, 0), I);
// the bf16 kernels (AVX-512 BF16 only) step d in pairs by the CPU's bf16 dot product (vdpbf16ps:
// both products of a pair exact in fp32, added to the lane in the instruction's fixed order,
// subnormals flushed), a fixed order too, but not the fp32 kernels' bits.
#pragma once

#include <cstdint>

namespace laga::indexer {

// Keys per tile: a multiple of every target's block of keys (AVX-512: 4 vectors of 16, AVX2: 2 of
// 8, up to 2048-bit vectors), so a tile holds whole blocks.
inline constexpr int64_t kTileKeys = 192;

struct Kernels {
  const char* target;  // Highway's name of the target
  // I[s] for s < n (lanes up to n rounded up to a vector are computed too): q [H, D] fp32 of one
  // query row, c [H] its head weights, kt [D, kTileKeys] the transposed key tile (zero beyond n).
  void (*scores)(const float* q, const float* c, const float* kt, int64_t H, int64_t D, int64_t n,
                 float* out);
  // a[j, s] = q_j · k_s into a [H, kTileKeys], for s < n (rounded up to a vector).
  void (*products)(const float* q, const float* kt, int64_t H, int64_t D, int64_t n, float* a);
  // The same from bf16 pairs (null where the CPU has no bf16 dot product): q2 [H, D2] and kt2 [D2,
  // kTileKeys] hold (x[2e] | x[2e + 1] << 16) as uint32, D2 = ⌈D / 2⌉ (an odd D's last pair
  // 0-padded).
  void (*scores_bf16)(const uint32_t* q2, const float* c, const uint32_t* kt2, int64_t H,
                      int64_t D2, int64_t n, float* out);
  void (*products_bf16)(const uint32_t* q2, const uint32_t* kt2, int64_t H, int64_t D2, int64_t n,
                        float* a);
};

const Kernels& kernels();

}  // namespace laga::indexer
