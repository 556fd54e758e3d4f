// The score micro-kernels of indexer_kernel.hpp over Google Highway: this file is compiled once per
// SIMD target (hwy/foreach_target.h re-includes it), and kernels() hands out the best target the
// CPU has under LAGA_MAX_ISA. The register block is R heads of one query row by V vectors of keys:
// each d broadcasts R query values and loads V key vectors for R·V FMAs (R 4; V 4 with 32 vector
// registers, 2 with 16), the keys' lanes independent chains as indexer_kernel.hpp states.
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

// acc[r][v] = Σ_d q[r, d] · kt[d, s0 + v·L ..] for R heads r (rows of q ld apart), V vectors.
template <int64_t R, int64_t V>
HWY_INLINE void block(DF df, const float* q, int64_t D, const float* kt, VF (&acc)[R][V]) {
  const int64_t L = int64_t(hn::Lanes(df));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t v = 0; v < V; ++v) acc[r][v] = hn::Zero(df);
  for (int64_t d = 0; d < D; ++d) {
    VF kv[V];
    for (int64_t v = 0; v < V; ++v) kv[v] = hn::LoadU(df, kt + d * kTileKeys + v * L);
    for (int64_t r = 0; r < R; ++r) {
      const VF qv = hn::Set(df, q[r * D + d]);
      for (int64_t v = 0; v < V; ++v) acc[r][v] = hn::MulAdd(qv, kv[v], acc[r][v]);
    }
  }
}

// I over V vectors of keys from s0: the heads in blocks of R, then one at a time.
template <int64_t V>
HWY_INLINE void scores_at(DF df, const float* q, const float* c, const float* kt, int64_t H,
                          int64_t D, float* out) {
  const int64_t L = int64_t(hn::Lanes(df));
  VF s[V];
  for (int64_t v = 0; v < V; ++v) s[v] = hn::Zero(df);
  const VF zero = hn::Zero(df);
  int64_t j = 0;
  for (; j + kR <= H; j += kR) {
    VF acc[kR][V];
    block<kR, V>(df, q + j * D, D, kt, acc);
    for (int64_t r = 0; r < kR; ++r) {
      const VF cj = hn::Set(df, c[j + r]);
      for (int64_t v = 0; v < V; ++v) s[v] = hn::MulAdd(cj, hn::Max(acc[r][v], zero), s[v]);
    }
  }
  for (; j < H; ++j) {
    VF acc[1][V];
    block<1, V>(df, q + j * D, D, kt, acc);
    const VF cj = hn::Set(df, c[j]);
    for (int64_t v = 0; v < V; ++v) s[v] = hn::MulAdd(cj, hn::Max(acc[0][v], zero), s[v]);
  }
  for (int64_t v = 0; v < V; ++v) hn::StoreU(s[v], df, out + v * L);
}

void scores(const float* q, const float* c, const float* kt, int64_t H, int64_t D, int64_t n,
            float* out) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  int64_t s0 = 0;
  for (; s0 + kV * L <= n; s0 += kV * L) scores_at<kV>(df, q, c, kt + s0, H, D, out + s0);
  for (; s0 < n; s0 += L) scores_at<1>(df, q, c, kt + s0, H, D, out + s0);
}

template <int64_t V>
HWY_INLINE void products_at(DF df, const float* q, const float* kt, int64_t H, int64_t D,
                            float* a) {
  const int64_t L = int64_t(hn::Lanes(df));
  int64_t j = 0;
  for (; j + kR <= H; j += kR) {
    VF acc[kR][V];
    block<kR, V>(df, q + j * D, D, kt, acc);
    for (int64_t r = 0; r < kR; ++r)
      for (int64_t v = 0; v < V; ++v) hn::StoreU(acc[r][v], df, a + (j + r) * kTileKeys + v * L);
  }
  for (; j < H; ++j) {
    VF acc[1][V];
    block<1, V>(df, q + j * D, D, kt, acc);
    for (int64_t v = 0; v < V; ++v) hn::StoreU(acc[0][v], df, a + j * kTileKeys + v * L);
  }
}

void products(const float* q, const float* kt, int64_t H, int64_t D, int64_t n, float* a) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  int64_t s0 = 0;
  for (; s0 + kV * L <= n; s0 += kV * L) products_at<kV>(df, q, kt + s0, H, D, a + s0);
  for (; s0 < n; s0 += L) products_at<1>(df, q, kt + s0, H, D, a + s0);
}

Kernels table() { return Kernels{hwy::TargetName(HWY_TARGET), &scores, &products}; }

}  // namespace laga::indexer::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "laga/core/isa.hpp"

namespace laga::indexer {

HWY_EXPORT(table);

const Kernels& kernels() {
  static const Kernels k = [] {
    apply_isa_cap();
    return HWY_DYNAMIC_DISPATCH(table)();
  }();
  return k;
}

}  // namespace laga::indexer
#endif
