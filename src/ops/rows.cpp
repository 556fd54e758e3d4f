// The row operations of rows.hpp over Google Highway: this file is compiled once per SIMD target
// (hwy/foreach_target.h re-includes it), and kernels() hands out the table of the best target the
// CPU has under LAGA_MAX_ISA. A row's tail (fewer elements than a vector holds) goes through a
// small buffer, so no lane reads or writes past the row.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/ops/rows.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "src/ops/rows.hpp"

HWY_BEFORE_NAMESPACE();
namespace laga::rows::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DH = hn::Half<DF>;
using DD = hn::Rebind<double, DH>;  // the doubles of half a float vector
using VD = hn::Vec<DD>;
constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);

HWY_INLINE VF load(DF d, const float* p) { return hn::LoadU(d, p); }
HWY_INLINE VF load(DF d, const bf16* p) {
  const hn::Rebind<uint16_t, DF> du16;
  const hn::RebindToUnsigned<DF> du32;
  return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(
                            du32, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p)))));
}
HWY_INLINE void store(DF d, VF v, float* p) { hn::StoreU(v, d, p); }
// Round to nearest even, a NaN kept quiet: to_bf16() lane by lane.
HWY_INLINE void store(DF d, VF v, bf16* p) {
  const hn::RebindToUnsigned<DF> du32;
  const hn::RebindToSigned<DF> di32;
  const hn::Rebind<uint16_t, DF> du16;
  const auto u = hn::BitCast(du32, v);
  const auto odd = hn::And(hn::ShiftRight<16>(u), hn::Set(du32, 1u));
  const auto rounded = hn::ShiftRight<16>(u + hn::Set(du32, 0x7fffu) + odd);
  const auto quiet = hn::Or(hn::ShiftRight<16>(u), hn::Set(du32, 0x40u));
  const auto bits = hn::IfThenElse(hn::RebindMask(du32, hn::IsNaN(v)), quiet, rounded);
  hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di32, bits)), du16, reinterpret_cast<uint16_t*>(p));
}
// bf16 stored by the CPU's own conversion (vcvtneps2bf16, AVX-512 BF16; the same bits as to_bf16(),
// which a vector holding a subnormal takes instead, since the instruction flushes them): the AVX3
// table's bf16 entries on CPUs that have it (table(true)).
struct NativeBf16 {
  uint16_t bits;
};
HWY_INLINE VF load(DF d, const NativeBf16* p) { return load(d, reinterpret_cast<const bf16*>(p)); }
HWY_INLINE void store(DF d, VF v, NativeBf16* p) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  const VF a = hn::Abs(v);
  if (HWY_UNLIKELY(!hn::AllFalse(d, hn::And(a<hn::Set(d, 0x1p-126f), a> hn::Zero(d)))))
    return store(d, v, reinterpret_cast<bf16*>(p));
  __m256i out;
  asm("vcvtneps2bf16 %1, %0" : "=v"(out) : "v"(v.raw));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), out);
#else
  store(d, v, reinterpret_cast<bf16*>(p));
#endif
}
// The first n < Lanes elements of p, 0 in the other lanes.
template <class T>
HWY_INLINE VF load_n(DF d, const T* p, int64_t n) {
  HWY_ALIGN T buf[kMaxLanes] = {};
  std::memcpy(static_cast<void*>(buf), p, size_t(n) * sizeof(T));
  return load(d, buf);
}
// The first n ≤ Lanes lanes of v into p.
template <class T>
HWY_INLINE void store_n(DF d, VF v, T* p, int64_t n) {
  if (n <= 0) return;
  if (n >= int64_t(hn::Lanes(d))) return store(d, v, p);
  HWY_ALIGN T buf[kMaxLanes];
  store(d, v, buf);
  std::memcpy(static_cast<void*>(p), buf, size_t(n) * sizeof(T));
}
template <class T>
HWY_INLINE void zero(T* p, int64_t n) {
  if (n > 0) std::memset(static_cast<void*>(p), 0, size_t(n) * sizeof(T));
}

HWY_INLINE float sum_lanes(DF d, VF v) { return hn::GetLane(hn::SumOfLanes(d, v)); }
HWY_INLINE double sum_lanes(DD d, VD v) { return hn::GetLane(hn::SumOfLanes(d, v)); }

// 2^x for x ≤ 63: 2^round(x) · poly(x − round(x)), the degree-6 Taylor series of 2^f on [−½, ½]
// (relative error < 2e-7); inputs below −150 give 0. The power of two is applied as 2^(n+64)
// (exact) then 2^−64 (one rounding, into the subnormals where the result lies there).
HWY_INLINE VF exp2(DF d, VF x) {
  const hn::RebindToSigned<DF> di;
  x = hn::Max(x, hn::Set(d, -150.0f));
  const VF n = hn::Round(x);
  const VF f = x - n;
  VF y = hn::Set(d, 1.5403530393381609e-4f);
  y = hn::MulAdd(y, f, hn::Set(d, 1.3333558146428443e-3f));
  y = hn::MulAdd(y, f, hn::Set(d, 9.6181291076284772e-3f));
  y = hn::MulAdd(y, f, hn::Set(d, 5.5504108664821580e-2f));
  y = hn::MulAdd(y, f, hn::Set(d, 2.4022650695910071e-1f));
  y = hn::MulAdd(y, f, hn::Set(d, 6.9314718055994531e-1f));
  y = hn::MulAdd(y, f, hn::Set(d, 1.0f));
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  (void)di;
  return VF{_mm512_scalef_ps(y.raw, n.raw)};  // y · 2^n, one rounding: the same bits
#else
  const VF scale = hn::BitCast(d, hn::ShiftLeft<23>(hn::ConvertTo(di, n) + hn::Set(di, 127 + 64)));
  return y * scale * hn::Set(d, 0x1p-64f);
#endif
}

// lo, hi += the lanes of x·y in fp64 (lower and upper half of the float vector).
HWY_INLINE void fma_f64(VF x, VF y, VD& lo, VD& hi) {
  const DH dh;
  const DD dd;
  lo = hn::MulAdd(hn::PromoteTo(dd, hn::LowerHalf(dh, x)), hn::PromoteTo(dd, hn::LowerHalf(dh, y)),
                  lo);
  hi = hn::MulAdd(hn::PromoteTo(dd, hn::UpperHalf(dh, x)), hn::PromoteTo(dd, hn::UpperHalf(dh, y)),
                  hi);
}
HWY_INLINE void add_f64(VF x, VD& lo, VD& hi) {
  const DH dh;
  const DD dd;
  lo = lo + hn::PromoteTo(dd, hn::LowerHalf(dh, x));
  hi = hi + hn::PromoteTo(dd, hn::UpperHalf(dh, x));
}

float row_max(const float* x, int64_t n) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  VF m = hn::Set(d, -INFINITY);
  int64_t k = 0;
  for (; k + N <= n; k += N) m = hn::Max(m, hn::LoadU(d, x + k));
  if (k < n)
    m = hn::Max(m, hn::IfThenElse(hn::FirstN(d, size_t(n - k)), load_n(d, x + k, n - k),
                                  hn::Set(d, -INFINITY)));
  return hn::GetLane(hn::MaxOfLanes(d, m));
}

template <class P>
float row_exp2(const float* s, P* p, int64_t n, int64_t nk, float c, float m) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  const VF vc = hn::Set(d, c), vm = hn::Set(d, -m);
  VF sum = hn::Zero(d);
  int64_t k = 0;
  for (; k + N <= n; k += N) {
    const VF e = exp2(d, hn::MulAdd(hn::LoadU(d, s + k), vc, vm));
    sum = sum + e;
    store(d, e, p + k);
  }
  if (k < n) {
    const VF e = hn::IfThenElseZero(hn::FirstN(d, size_t(n - k)),
                                    exp2(d, hn::MulAdd(load_n(d, s + k, n - k), vc, vm)));
    sum = sum + e;
    store_n(d, e, p + k, std::min(N, nk - k));
    k += N;
  }
  zero(p + k, nk - k);
  return sum_lanes(d, sum);
}

float tile_delta_row(const float* s, const float* dp, int64_t n, float c, float lse2) {
  const DF d;
  const DD dd;
  const int64_t N = hn::Lanes(d);
  const VF vc = hn::Set(d, c), vl = hn::Set(d, lse2);
  VD sum_lo = hn::Zero(dd), sum_hi = sum_lo, mass_lo = sum_lo, mass_hi = sum_lo;
  for (int64_t k = 0; k < n; k += N) {
    const bool full = k + N <= n;
    const VF sv = full ? hn::LoadU(d, s + k) : load_n(d, s + k, n - k);
    const VF dv = full ? hn::LoadU(d, dp + k) : load_n(d, dp + k, n - k);
    const VF pr = hn::IfThenElseZero(hn::FirstN(d, size_t(std::min(N, n - k))),
                                     exp2(d, hn::MulSub(sv, vc, vl)));
    fma_f64(pr, dv, sum_lo, sum_hi);
    add_f64(pr, mass_lo, mass_hi);
  }
  return float(sum_lanes(dd, sum_lo + sum_hi) / sum_lanes(dd, mass_lo + mass_hi));
}

void tile_delta_cols(const float* st, const float* dpt, int64_t ld, int64_t n, int64_t t0, float c,
                     const float* lse2, float* delta) {
  const DF d;
  const DD dd;
  const hn::RebindToSigned<DF> di;
  const int64_t N = hn::Lanes(d);
  const VF vc = hn::Set(d, c);
  for (int64_t r = 0; r < n; r += N) {
    const int64_t cols = std::min(N, n - r);
    const bool full = cols == N;
    const auto in_cols = hn::FirstN(d, size_t(cols));
    const VF vl = full ? hn::LoadU(d, lse2 + r) : load_n(d, lse2 + r, cols);
    const auto token = hn::Iota(di, int32_t(t0 + r));
    VD sum_lo = hn::Zero(dd), sum_hi = sum_lo, mass_lo = sum_lo, mass_hi = sum_lo;
    for (int64_t k = 0; k <= t0 + r + cols - 1; ++k) {  // a lane sees key k iff k ≤ its token
      const auto sees = hn::And(in_cols, hn::RebindMask(d, token > hn::Set(di, int32_t(k - 1))));
      const VF sv = full ? hn::LoadU(d, st + k * ld + r) : load_n(d, st + k * ld + r, cols);
      const VF dv = full ? hn::LoadU(d, dpt + k * ld + r) : load_n(d, dpt + k * ld + r, cols);
      const VF pr = hn::IfThenElseZero(sees, exp2(d, hn::MulSub(sv, vc, vl)));
      fma_f64(pr, hn::IfThenElseZero(sees, dv), sum_lo, sum_hi);
      add_f64(pr, mass_lo, mass_hi);
    }
    const hn::Rebind<float, DD> dfh;
    const VF dl =
        hn::Combine(d, hn::DemoteTo(dfh, sum_hi / mass_hi), hn::DemoteTo(dfh, sum_lo / mass_lo));
    store_n(d, dl, delta + r, cols);
  }
}

template <class D>
void row_grad(const float* s, const float* dp, D* ds, int64_t n, int64_t nk, float c, float lse2,
              float delta) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  const VF vc = hn::Set(d, c), vl = hn::Set(d, -lse2), vd = hn::Set(d, delta);
  int64_t k = 0;
  for (; k + N <= n; k += N) {
    const VF pr = exp2(d, hn::MulAdd(hn::LoadU(d, s + k), vc, vl));
    store(d, pr * (hn::LoadU(d, dp + k) - vd), ds + k);
  }
  if (k < n) {
    const VF pr = exp2(d, hn::MulAdd(load_n(d, s + k, n - k), vc, vl));
    const VF g =
        hn::IfThenElseZero(hn::FirstN(d, size_t(n - k)), pr * (load_n(d, dp + k, n - k) - vd));
    store_n(d, g, ds + k, std::min(N, nk - k));
    k += N;
  }
  zero(ds + k, nk - k);
}

template <class P>
void span_grad(const float* s, const float* dp, P* p, P* ds, int64_t n, float c, const float* lse2,
               const float* delta) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  const VF vc = hn::Set(d, c);
  for (int64_t r = 0; r < n; r += N) {
    const int64_t m = std::min(N, n - r);
    const bool full = m == N;
    const VF sv = full ? hn::LoadU(d, s + r) : load_n(d, s + r, m);
    const VF lv = full ? hn::LoadU(d, lse2 + r) : load_n(d, lse2 + r, m);
    const VF dv = full ? hn::LoadU(d, dp + r) : load_n(d, dp + r, m);
    const VF ev = full ? hn::LoadU(d, delta + r) : load_n(d, delta + r, m);
    const VF pr = exp2(d, hn::MulSub(sv, vc, lv));
    store_n(d, pr, p + r, m);
    store_n(d, pr * (dv - ev), ds + r, m);
  }
}

template <class A, class B>
float dot_row(const A* a, const B* b, int64_t n) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  VF acc = hn::Zero(d);
  int64_t k = 0;
  for (; k + N <= n; k += N) acc = hn::MulAdd(load(d, a + k), load(d, b + k), acc);
  if (k < n) acc = hn::MulAdd(load_n(d, a + k, n - k), load_n(d, b + k, n - k), acc);
  return sum_lanes(d, acc);
}

template <class A, class B>
float dot_row_f64(const A* a, const B* b, int64_t n) {
  const DF d;
  const DD dd;
  const int64_t N = hn::Lanes(d);
  VD lo = hn::Zero(dd), hi = lo;
  int64_t k = 0;
  for (; k + N <= n; k += N) fma_f64(load(d, a + k), load(d, b + k), lo, hi);
  if (k < n) fma_f64(load_n(d, a + k, n - k), load_n(d, b + k, n - k), lo, hi);
  return float(sum_lanes(dd, lo + hi));
}

template <class T>
void scale_row(const float* x, T* y, int64_t n, float mul) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  const VF vm = hn::Set(d, mul);
  int64_t k = 0;
  for (; k + N <= n; k += N) store(d, hn::LoadU(d, x + k) * vm, y + k);
  if (k < n) store_n(d, load_n(d, x + k, n - k) * vm, y + k, n - k);
}

template <class P>
void softmax_grad_row(const P* p, const float* dp, P* ds, int64_t n, float delta) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  const VF vd = hn::Set(d, delta);
  int64_t k = 0;
  for (; k + N <= n; k += N) store(d, load(d, p + k) * (hn::LoadU(d, dp + k) - vd), ds + k);
  if (k < n) store_n(d, load_n(d, p + k, n - k) * (load_n(d, dp + k, n - k) - vd), ds + k, n - k);
}

void widen(const bf16* x, float* y, int64_t n) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  int64_t k = 0;
  for (; k + N <= n; k += N) store(d, load(d, x + k), y + k);
  if (k < n) store_n(d, load_n(d, x + k, n - k), y + k, n - k);
}

template <class B>
void narrow(const float* x, bf16* y, int64_t n) {
  scale_row(x, reinterpret_cast<B*>(y), n, 1.0f);
}

// The entries that store bf16, through B's store (bf16: to_bf16's rounding; NativeBf16: the CPU's).
template <class B>
void bf16_entries(Kernels& k) {
  k.row_exp2_bf16 = [](const float* s, bf16* p, int64_t n, int64_t nk, float c, float m) {
    return row_exp2(s, reinterpret_cast<B*>(p), n, nk, c, m);
  };
  k.row_grad_bf16 = [](const float* s, const float* dp, bf16* ds, int64_t n, int64_t nk, float c,
                       float lse2, float delta) {
    row_grad(s, dp, reinterpret_cast<B*>(ds), n, nk, c, lse2, delta);
  };
  k.span_grad_bf16 = [](const float* s, const float* dp, bf16* p, bf16* ds, int64_t n, float c,
                        const float* lse2, const float* delta) {
    span_grad(s, dp, reinterpret_cast<B*>(p), reinterpret_cast<B*>(ds), n, c, lse2, delta);
  };
  k.scale_bf16 = [](const float* x, bf16* y, int64_t n, float mul) {
    scale_row(x, reinterpret_cast<B*>(y), n, mul);
  };
  k.softmax_grad_bf16 = [](const bf16* p, const float* dp, bf16* ds, int64_t n, float delta) {
    softmax_grad_row(reinterpret_cast<const B*>(p), dp, reinterpret_cast<B*>(ds), n, delta);
  };
  k.narrow = &narrow<B>;
}

// This target's kernels; native_bf16: its bf16 stores by the CPU's conversion (AVX3, where the CPU
// has AVX-512 BF16).
Kernels table(bool native_bf16) {
  Kernels k;
  k.target = hwy::TargetName(HWY_TARGET);
  k.row_max = &row_max;
  k.row_exp2_f32 = &row_exp2<float>;
  k.tile_delta_row = &tile_delta_row;
  k.tile_delta_cols = &tile_delta_cols;
  k.row_grad_f32 = &row_grad<float>;
  k.span_grad_f32 = &span_grad<float>;
  k.dot_f32_f32 = &dot_row<float, float>;
  k.dot_bf16_f32 = &dot_row<bf16, float>;
  k.dot_f64_f32_f32 = &dot_row_f64<float, float>;
  k.dot_f64_bf16_f32 = &dot_row_f64<bf16, float>;
  k.dot_f64_bf16_bf16 = &dot_row_f64<bf16, bf16>;
  k.scale_f32 = &scale_row<float>;
  k.softmax_grad_f32 = &softmax_grad_row<float>;
  k.widen = &widen;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if (native_bf16) {
    bf16_entries<NativeBf16>(k);
    k.target = "AVX3+BF16";
    return k;
  }
#endif
  (void)native_bf16;
  bf16_entries<bf16>(k);
  return k;
}

}  // namespace laga::rows::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "laga/core/isa.hpp"

namespace laga::rows {

HWY_EXPORT(table);

const Kernels& kernels() {
  static const Kernels k = [] {
    apply_isa_cap();
    return HWY_DYNAMIC_DISPATCH(table)(cpu_has_avx512_bf16());
  }();
  return k;
}

std::vector<Kernels> every_target() {
  apply_isa_cap();
  std::vector<Kernels> out;
  const int64_t cpu = hwy::SupportedTargets();
  const bool bf16 = cpu_has_avx512_bf16();
#define LAGA_ROWS_TARGET(TARGET, NS)                                  \
  if (cpu & (TARGET)) {                                               \
    if (bf16 && (TARGET) != HWY_AVX2) out.push_back(NS::table(true)); \
    out.push_back(NS::table(false));                                  \
  }
#if HWY_TARGETS & HWY_AVX3_DL
  LAGA_ROWS_TARGET(HWY_AVX3_DL, N_AVX3_DL)
#endif
#if HWY_TARGETS & HWY_AVX3
  LAGA_ROWS_TARGET(HWY_AVX3, N_AVX3)
#endif
#if HWY_TARGETS & HWY_AVX2
  LAGA_ROWS_TARGET(HWY_AVX2, N_AVX2)
#endif
#undef LAGA_ROWS_TARGET
  if (out.empty()) out.push_back(kernels());  // a build without x86 targets: the dispatched one
  return out;
}

}  // namespace laga::rows
#endif
