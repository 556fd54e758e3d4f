// The lightning indexer's score micro-kernels (indexer.cpp): one implementation over Google Highway
// (indexer_kernel.cpp), compiled for every SIMD target the build allows and chosen once at run time
// under LAGA_MAX_ISA, like rows.hpp. Not an API: src/ops/indexer.cpp only.
//
// Every (head j, key s) product a_js = q_j · k_s is one FMA chain over d = 0 .. D−1 from 0, in one
// vector lane per key, and a score I_s = Σ_j c_j · ReLU(a_js) is one FMA chain over j = 0 .. H−1
// from 0. Lanes never mix, so a key's result does not depend on its lane, its tile, the register
// blocking or the vector width: every target gives the same bits as the scalar loop
//   a = 0; for d: a = fma(q[j, d], k[s, d], a)     I = 0; for j: I = fma(c[j], max(a_j, 0), I).
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
};

const Kernels& kernels();

}  // namespace laga::indexer
