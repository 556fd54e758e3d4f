// The score micro-kernels of indexer_kernel.hpp over Google Highway: this file is compiled once per
// SIMD target (hwy/foreach_target.h re-includes it), and kernels() hands out the best target the
// CPU has under LAGA_MAX_ISA, with the bf16 kernels where the CPU has AVX-512 BF16 (as rows.cpp's
// table). The register block is R heads of one query row by V vectors of keys: each step of d
// broadcasts R query values and loads V key vectors for R·V FMAs (or bf16 pair dot products; R 4, V
// 4 with 32 vector registers, 2 with 16), the keys' lanes independent chains as indexer_kernel.hpp
// states.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/ops/indexer_kernel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "src/ops/indexer_kernel.hpp"

HWY_BEFORE_NAMESPACE();
namespace laga::indexer::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int64_t kV = 4;
#else
constexpr int64_t kV = 2;
#endif
constexpr int64_t kR = 4;

// One step of the chain over d: fp32 elements, a = fma(q, k, a).
struct F32Step {
  using E = float;
  static HWY_INLINE VF load(DF df, const float* p) { return hn::LoadU(df, p); }
  static HWY_INLINE VF bcast(DF df, const float* q) { return hn::Set(df, *q); }
  static HWY_INLINE VF step(VF acc, VF q, VF k) { return hn::MulAdd(q, k, acc); }
};

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// One step over a pair of d: bf16 pairs in 32-bit lanes, the CPU's dot product (vdpbf16ps).
struct Bf16Step {
  using E = uint32_t;
  static HWY_INLINE VF load(DF df, const uint32_t* p) {
    const hn::RebindToUnsigned<DF> du;
    return hn::BitCast(df, hn::LoadU(du, p));
  }
  static HWY_INLINE VF bcast(DF df, const uint32_t* q) {
    const hn::RebindToUnsigned<DF> du;
    return hn::BitCast(df, hn::Set(du, *q));
  }
  static HWY_INLINE VF step(VF acc, VF q, VF k) {
    asm("vdpbf16ps %2, %1, %0" : "+v"(acc.raw) : "v"(q.raw), "v"(k.raw));
    return acc;
  }
};
#endif

// acc[r][v] = the chain over the n steps of q row r (rows n apart) and kt's V vectors of keys.
template <class S, int64_t R, int64_t V>
HWY_INLINE void block(DF df, const typename S::E* q, int64_t n, const typename S::E* kt,
                      VF (&acc)[R][V]) {
  const int64_t L = int64_t(hn::Lanes(df));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t v = 0; v < V; ++v) acc[r][v] = hn::Zero(df);
  for (int64_t d = 0; d < n; ++d) {
    VF kv[V];
    for (int64_t v = 0; v < V; ++v) kv[v] = S::load(df, kt + d * kTileKeys + v * L);
    for (int64_t r = 0; r < R; ++r) {
      const VF qv = S::bcast(df, q + r * n + d);
      for (int64_t v = 0; v < V; ++v) acc[r][v] = S::step(acc[r][v], qv, kv[v]);
    }
  }
}

// I over V vectors of keys: the heads in blocks of R, then one at a time, summed j = 0 .. H−1.
template <class S, int64_t V>
HWY_INLINE void scores_at(DF df, const typename S::E* q, const float* c, const typename S::E* kt,
                          int64_t H, int64_t n, float* out) {
  const int64_t L = int64_t(hn::Lanes(df));
  VF s[V];
  for (int64_t v = 0; v < V; ++v) s[v] = hn::Zero(df);
  const VF zero = hn::Zero(df);
  int64_t j = 0;
  for (; j + kR <= H; j += kR) {
    VF acc[kR][V];
    block<S, kR, V>(df, q + j * n, n, kt, acc);
    for (int64_t r = 0; r < kR; ++r) {
      const VF cj = hn::Set(df, c[j + r]);
      for (int64_t v = 0; v < V; ++v) s[v] = hn::MulAdd(cj, hn::Max(acc[r][v], zero), s[v]);
    }
  }
  for (; j < H; ++j) {
    VF acc[1][V];
    block<S, 1, V>(df, q + j * n, n, kt, acc);
    const VF cj = hn::Set(df, c[j]);
    for (int64_t v = 0; v < V; ++v) s[v] = hn::MulAdd(cj, hn::Max(acc[0][v], zero), s[v]);
  }
  for (int64_t v = 0; v < V; ++v) hn::StoreU(s[v], df, out + v * L);
}

template <class S>
void scores(const typename S::E* q, const float* c, const typename S::E* kt, int64_t H, int64_t n,
            int64_t keys, float* out) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  int64_t s0 = 0;
  for (; s0 + kV * L <= keys; s0 += kV * L) scores_at<S, kV>(df, q, c, kt + s0, H, n, out + s0);
  for (; s0 < keys; s0 += L) scores_at<S, 1>(df, q, c, kt + s0, H, n, out + s0);
}

template <class S, int64_t V>
HWY_INLINE void products_at(DF df, const typename S::E* q, const typename S::E* kt, int64_t H,
                            int64_t n, float* a) {
  const int64_t L = int64_t(hn::Lanes(df));
  int64_t j = 0;
  for (; j + kR <= H; j += kR) {
    VF acc[kR][V];
    block<S, kR, V>(df, q + j * n, n, kt, acc);
    for (int64_t r = 0; r < kR; ++r)
      for (int64_t v = 0; v < V; ++v) hn::StoreU(acc[r][v], df, a + (j + r) * kTileKeys + v * L);
  }
  for (; j < H; ++j) {
    VF acc[1][V];
    block<S, 1, V>(df, q + j * n, n, kt, acc);
    for (int64_t v = 0; v < V; ++v) hn::StoreU(acc[0][v], df, a + j * kTileKeys + v * L);
  }
}

template <class S>
void products(const typename S::E* q, const typename S::E* kt, int64_t H, int64_t n, int64_t keys,
              float* a) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  int64_t s0 = 0;
  for (; s0 + kV * L <= keys; s0 += kV * L) products_at<S, kV>(df, q, kt + s0, H, n, a + s0);
  for (; s0 < keys; s0 += L) products_at<S, 1>(df, q, kt + s0, H, n, a + s0);
}

void scores_f32(const float* q, const float* c, const float* kt, int64_t H, int64_t D, int64_t n,
                float* out) {
  scores<F32Step>(q, c, kt, H, D, n, out);
}
void products_f32(const float* q, const float* kt, int64_t H, int64_t D, int64_t n, float* a) {
  products<F32Step>(q, kt, H, D, n, a);
}

Kernels table(bool bf16) {
  Kernels k{hwy::TargetName(HWY_TARGET), &scores_f32, &products_f32, nullptr, nullptr};
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if (bf16) {
    k.target = "AVX3+BF16";
    k.scores_bf16 = [](const uint32_t* q2, const float* c, const uint32_t* kt2, int64_t H,
                       int64_t D2, int64_t n,
                       float* out) { scores<Bf16Step>(q2, c, kt2, H, D2, n, out); };
    k.products_bf16 = [](const uint32_t* q2, const uint32_t* kt2, int64_t H, int64_t D2, int64_t n,
                         float* a) { products<Bf16Step>(q2, kt2, H, D2, n, a); };
  }
#endif
  return k;
}

}  // namespace laga::indexer::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "laga/core/isa.hpp"

namespace laga::indexer {

HWY_EXPORT(table);

const Kernels& kernels() {
  static const Kernels k = [] {
    apply_isa_cap();
    return HWY_DYNAMIC_DISPATCH(table)(cpu_has_avx512_bf16());
  }();
  return k;
}

}  // namespace laga::indexer
#endif
