// laga_verify: the one rule that judges the block's numbers (FlashAttention's convention: a
// tolerance derived from a measured baseline in the same precision, never hand-picked).
//
// Every tensor of a run — y, dx and every weight gradient of every layer — is compared with the
// exact fp64 reference (reference/block_ref.hpp, no storage rounding) by max |a − b|, on the same
// weights and inputs. Per tensor, with eps the machine epsilon of the run's dtype and scale = max
// |fp64|:
//
//   explicit   err(explicit) ≤ kExplicitFactor · err(plain)                     + kFloorUlps · eps
//              · scale
//   a form     err(form)     ≤ kFormFactor · max(err(explicit), err(plain))      + kFloorUlps · eps
//              · scale
//
// where "plain" is the fp64 reference run with every stored tensor rounded to the run's dtype (a
// plain implementation in the same precision: reference_tensors(..., storage = dtype)), per tensor
// the largest of its three association orders (plain_errors), and explicit is the explicit form at
// the same P and dtype. At P = 1 laga must also be bitwise equal to explicit (bitwise_equal).
// Relative L2 errors are reported alongside but judge nothing.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "laga/mla/config.hpp"
#include "laga/mla/weights.hpp"
#include "reference/block_ref.hpp"

namespace laga::verify {

// Whole tensors of one run as fp64 arrays, keyed "y", "dx" and "d<weight>.<layer>" ("dwkv_b.0").
using Tensors = std::map<std::string, ref::Array>;

// "layers.{l}.<name>" (Weights::for_each's names) -> "d<name>.{l}", the name's own dots as
// underscores ("layers.0.indexer.wk" -> "dindexer_wk.0").
std::string grad_key(const std::string& full_weight_name);
// A run's whole y [T, B, D], dx [T, B, D] and (synced, fp32) weight gradients as Tensors.
Tensors tensors_of(const Tensor& y, const Tensor& dx, const Weights& grads);

// The fp64 reference's y, dx and weight gradients for weights w and inputs x, dy [T, B, D]: exact
// when storage is empty, the plain same-precision baseline otherwise (sums in fp32, every stored
// tensor rounded to storage, weight gradients to fp32: reference/block_ref.hpp). core: the
// attention's association order (ref::Core; the same function, other roundings).
// With a selection (per layer [T, B, k]), the sparse forms' block on it (ref::block_forward).
Tensors reference_tensors(const MlaConfig& c, const ref::RefWeights& w, const ref::Array& x,
                          const ref::Array& dy, std::optional<DType> storage,
                          ref::Core core = ref::Core::per_head,
                          const std::vector<ref::Array>* selection = nullptr);

struct TensorError {
  double max_abs = 0;  // max |got − truth|
  double scale = 0;    // max |truth|
  double rel_l2 = 0;   // ‖got − truth‖₂ / ‖truth‖₂ (0 when both are 0)
};
// Per tensor of truth; got must hold the same names and shapes (else an internal error).
std::map<std::string, TensorError> errors(const Tensors& got, const Tensors& truth);

// The plain same-precision implementation's error against exact (reference_tensors with storage
// c.dtype), per tensor the largest max_abs of three association orders (ref::Core): explicit's
// per-head order; the same with the softmax delta taken as rowsum(dO∘O) over the stored output, as
// every fused kernel and ring hop takes it; and the absorbed order. Each order a form computes in
// has its plain counterpart, and one sample's error on a small tensor can be small by luck. The
// baseline of every check by the rule: verify, bench, the tests.
std::map<std::string, TensorError> plain_errors(const MlaConfig& c, const ref::RefWeights& w,
                                                const ref::Array& x, const ref::Array& dy,
                                                const Tensors& exact);

// Same names, shapes and bits (the fp64 copies of the run's values). On the first difference,
// *first_difference (when given) says where: "dx[17]: 0.125 vs 0.1250001", or a missing name.
bool bitwise_equal(const Tensors& a, const Tensors& b, std::string* first_difference = nullptr);

struct Verdict {
  bool pass = true;
  std::string worst;                    // the tensor with the largest err / allowed
  double worst_ratio = 0;               // max over tensors of err / allowed (pass ⇔ ≤ 1)
  std::string rule;                     // the rule, with its constants, for reports
  std::map<std::string, double> ratio;  // err / allowed per tensor
  // The allowance per tensor in ulps of its scale: allowed / (eps(dtype) · max|fp64|) (0 when the
  // scale is 0). What laga bench carries from its reduced-T check to full size (docs/benchmarks.md
  // §7).
  std::map<std::string, double> allowed_ulps;
};

// Machine epsilon (ulp of 1) of the dtype: bf16 2⁻⁷, fp32 2⁻²³.
double eps(DType dtype);

// A form's error against the exact reference is at most twice its baseline's: FlashAttention's
// convention (flash-attn's tests/test_flash_attn.py: (out − out_ref).abs().max() ≤ 2 · (out_pt −
// out_ref).abs().max(), out_pt a plain implementation in the same precision, out_ref an upcast
// reference). Compare.LagaAndAbsorbedWithinTwiceExplicit measures it and prints the largest ratios.
inline constexpr double kFormFactor = 2.0;

// F: explicit may err up to F times what plain does, because plain does not emulate oneDNN's and
// the fused kernel's summation orders (blocked, FMA), the online softmax or the exp2/log2 forms.
// Plain sums in fp32 as explicit does (reference/block_ref.cpp), so the ratio does not grow with
// reduction lengths. F is the largest ratio Compare.ExplicitWithinFOfPlainBaseline measures (it
// prints them), with a margin.
inline constexpr double kExplicitFactor = 3.0;

// The floor, in ulps of the dtype (eps) times the tensor's scale max|fp64|: keeps a tensor whose
// baseline error happens to be tiny (cancelling roundings) from failing on one more rounding. One
// rounding of the largest element costs up to 0.5 eps·scale; a stored sum of two rounded terms
// (y = x + o·woᵀ, dx = dy + RMSNormᵀ(dxn)) and the fp32 sum of weight gradients over ranks add a
// few.
inline constexpr double kFloorUlps = 2.0;

// err ≤ factor · baseline_err + kFloorUlps · eps(dtype) · scale, per tensor of baseline.
Verdict within_baseline(const std::map<std::string, TensorError>& candidate,
                        const std::map<std::string, TensorError>& baseline, DType dtype,
                        double factor);

// A form (laga, absorbed) against explicit at the same P and dtype: factor kFormFactor.
// Both maps are errors against the exact fp64 reference.
Verdict form_vs_explicit(const std::map<std::string, TensorError>& form,
                         const std::map<std::string, TensorError>& explicit_, DType dtype);
// A form against the larger, per tensor, of explicit's error and plain's: factor kFormFactor; what
// laga verify applies. explicit's error alone can be small by luck (a norm gradient whose largest
// error cancels); plain's is what the precision costs.
Verdict form_vs_baseline(const std::map<std::string, TensorError>& form,
                         const std::map<std::string, TensorError>& explicit_,
                         const std::map<std::string, TensorError>& plain, DType dtype);
// explicit against the plain same-precision reference: factor kExplicitFactor.
Verdict explicit_vs_plain(const std::map<std::string, TensorError>& explicit_,
                          const std::map<std::string, TensorError>& plain, DType dtype);

// One line: "pass (worst dx: 0.42 of allowed)" or "FAIL (worst dwkv_b.1: 1.7 of allowed)".
std::string summary(const Verdict& v);

}  // namespace laga::verify
