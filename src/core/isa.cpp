// LAGA_MAX_ISA and the ISA in use (core/isa.hpp). The cap is applied once, before oneDNN creates a
// primitive and before the row operations choose their Highway target (both call apply_isa_cap()
// first), so no kernel ever runs above it.
#include "laga/core/isa.hpp"

#include <hwy/highway.h>
#include <hwy/targets.h>

#include <cstdlib>
#include <dnnl.hpp>
#include <mutex>
#include <nlohmann/json.hpp>

#include "laga/core/error.hpp"

namespace laga {

namespace {

std::string read_cap() {
  const char* env = std::getenv("LAGA_MAX_ISA");
  if (!env || !*env) return "";
  const std::string v = env;
  LAGA_CHECK(v == "avx2" || v == "avx512",
             "LAGA_MAX_ISA='{}' names no ISA; valid: avx2 or avx512 (unset: the best "
             "the CPU has)",
             v);
  return v;
}

// Highway targets above the cap (a lower bit is a better target).
int64_t targets_above(const std::string& cap) {
#if HWY_ARCH_X86
  if (cap == "avx2") return HWY_AVX3 | HWY_AVX3_DL;
#endif
  (void)cap;
  return 0;
}

void check_cpu_has_baseline() {
#if HWY_ARCH_X86 && defined(__AVX2__) && defined(__FMA__)
  __builtin_cpu_init();
  LAGA_CHECK(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"),
             "this laga was built for x86-64-v3 (AVX2 and FMA) and this CPU lacks them; build with "
             "-DLAGA_ARCH=x86-64 (slower, but runs on any x86-64)");
#endif
}

std::once_flag applied;

}  // namespace

std::string isa_cap() {
  static const std::string cap = read_cap();
  return cap;
}

void apply_isa_cap() {
  std::call_once(applied, [] {
    check_cpu_has_baseline();
    const std::string cap = isa_cap();
    if (cap.empty()) return;
    const int64_t above = targets_above(cap);
    LAGA_CHECK(
        (HWY_STATIC_TARGET & above) == 0,
        "LAGA_MAX_ISA={} is below this build's baseline ({}, from -march); build with the default "
        "-DLAGA_ARCH=x86-64-v3 to run capped",
        cap, hwy::TargetName(HWY_STATIC_TARGET));
    if (above) hwy::DisableTargets(above);
#if HWY_ARCH_X86
    const dnnl::cpu_isa isa = cap == "avx2" ? dnnl::cpu_isa::avx2 : dnnl::cpu_isa::avx512_core_bf16;
    try {
      dnnl::set_max_cpu_isa(isa);
    } catch (const dnnl::error& e) {
      LAGA_ASSERT(false, "oneDNN refused LAGA_MAX_ISA={} (it must be set before any primitive): {}",
                  cap, e.what());
    }
#endif
  });
}

bool cpu_has_avx512_bf16() {
#if HWY_ARCH_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

bool bf16_matmul_native() {
  static const bool native = [] {
    apply_isa_cap();
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    const dnnl::memory::dims a{1, 64, 64};
    try {
      const dnnl::memory::desc bf(a, dt::bf16, tag::abc);
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(bf, bf, bf), engine);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return native;
}

namespace {

const char* dnnl_isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "other";
  }
}

}  // namespace

IsaInfo isa_info() {
  apply_isa_cap();
  IsaInfo info;
  const int64_t usable = hwy::SupportedTargets() & HWY_TARGETS;
  info.rows = usable ? hwy::TargetName(usable & -usable) : "none";
  if ((usable & -usable) == HWY_AVX3 && cpu_has_avx512_bf16()) info.rows += "+BF16";
  info.matmul = dnnl_isa_name(dnnl::get_effective_cpu_isa());
  info.bf16_native = bf16_matmul_native();
  info.cap = isa_cap();
  return info;
}

std::string IsaInfo::line() const {
  return fmt::format("rows {}, matmul {} (bf16 {}), LAGA_MAX_ISA {}", rows, matmul,
                     bf16_native ? "native" : "widened to fp32", cap.empty() ? "unset" : cap);
}

nlohmann::json IsaInfo::to_json() const {
  return {{"rows", rows},
          {"matmul", matmul},
          {"bf16_matmul", bf16_native ? "native" : "widened"},
          {"max_isa", cap.empty() ? nlohmann::json(nullptr) : nlohmann::json(cap)}};
}

}  // namespace laga
