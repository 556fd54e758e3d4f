#include "laga/mla/flops.hpp"

#include "laga/core/dtype.hpp"
#include "laga/core/error.hpp"
#include "laga/mla/form.hpp"

namespace laga {

BlockFlops block_flops(const MlaConfig& c) {
  const double tokens = double(c.seq_len * c.batch);
  const double D = double(c.hidden_size), H = double(c.num_attention_heads),
               Lq = double(c.q_lora_rank);
  const double Lkv = double(c.kv_lora_rank), Dr = double(c.qk_rope_head_dim),
               Dn = double(c.qk_nope_head_dim);
  const double Dqk = double(c.qk_head_dim()), Dv = double(c.v_head_dim);
  // Multiply-adds per token: q path, kv down-projection, the up-projection (W_UK, W_UV: the same
  // count whether applied to k/v or folded into q and o), output projection.
  double q = Lq > 0 ? D * Lq + Lq * H * Dqk : D * H * Dqk;
  double macs = q + D * (Lkv + Dr) + Lkv * H * (Dn + Dv) + H * Dv * D;
  double projections = 2 * macs * tokens;
  const Form& form = form_of(c);
  const double attention = form.attention_forward_flops(c);
  BlockFlops f;
  f.attention_forward = attention * double(c.num_layers);
  f.forward = (projections + attention + form.extra_forward_flops(c)) * double(c.num_layers);
  // A form's recomputation (Form::recompute_flops) is executed work of its backward, and so is its
  // extra work (Form::extra_backward_flops).
  f.backward =
      (2 * projections + 2.5 * attention + form.recompute_flops(c) + form.extra_backward_flops(c)) *
      double(c.num_layers);
  return f;
}

std::string_view op_class_name(OpClass k) {
  switch (k) {
    case OpClass::matmul:
      return "matmul";
    case OpClass::attention_forward:
      return "attention_fwd";
    case OpClass::attention_backward:
      return "attention_bwd";
    case OpClass::elementwise:
      return "elementwise";
    case OpClass::accumulate:
      return "accumulate";
  }
  return "?";
}

std::string_view attention_shape_name(AttentionShape s) {
  switch (s) {
    case AttentionShape::dense:
      return "dense";
    case AttentionShape::latent:
      return "latent";
    case AttentionShape::mqa:
      return "mqa";
    case AttentionShape::laga_fused:
      return "laga_fused";
  }
  return "?";
}

AttentionShape attention_shape_of(std::string_view form) {
  const Form& f = find_form(form);
  if (f.name() == "absorbed-shared") return AttentionShape::mqa;
  if (f.family() == "absorbed") return AttentionShape::latent;
  if (f.own_kernel() == "latent") return AttentionShape::laga_fused;
  return AttentionShape::dense;
}

std::vector<PhaseFlops> phase_flops(const MlaConfig& c) {
  const Form& form = form_of(c);
  const double tok = double(c.seq_len * c.batch), L = double(c.num_layers),
               s = double(dtype_size(c.dtype));
  const double D = double(c.hidden_size), H = double(c.num_attention_heads),
               Lq = double(c.q_lora_rank);
  const double Lkv = double(c.kv_lora_rank), Dr = double(c.qk_rope_head_dim),
               Dn = double(c.qk_nope_head_dim);
  const double Dqk = double(c.qk_head_dim()), Dv = double(c.v_head_dim),
               Dl = double(c.latent_dim());
  const AttentionShape shape = attention_shape_of(c.form);
  const bool absorbed = shape == AttentionShape::latent || shape == AttentionShape::mqa;
  // laga-fused's kernel up-projects K/V inside itself, forward and backward: those products are its
  // (in_kernel), and nothing assembles k, v or dk, dv outside it.
  const bool in_kernel = shape == AttentionShape::laga_fused;
  // absorbed-expanded's V and output width: padded to Dl for the fused kernel (design.md §2.3).
  const double Dvo = shape == AttentionShape::latent && c.kernel == Kernel::fused ? Dl : Lkv;
  std::vector<PhaseFlops> out;
  // A product the form's kernel runs inside itself (inside) carries the kernel's shape, whose rate
  // times it.
  auto in_kernel_product = [&](PhaseFlops ph, bool inside) {
    if (inside) ph.in_kernel = true, ph.shape = shape;
    out.push_back(std::move(ph));
  };
  auto mm = [&](const char* name, bool bwd, double macs_per_token, bool inside = false) {
    // A linear's backward is two products of its forward's size (dx and dw).
    in_kernel_product({name, bwd, OpClass::matmul, AttentionShape::dense,
                       (bwd ? 4 : 2) * macs_per_token * tok * L, 0},
                      inside);
  };
  auto ew = [&](const char* name, bool bwd, double elements_per_token) {
    out.push_back({name, bwd, OpClass::elementwise, AttentionShape::dense, 0,
                   elements_per_token * tok * L * s});
  };
  const double attention = form.attention_forward_flops(c) * L;
  // Forward (docs/design.md §2.1, then the core, then wo).
  ew("rmsnorm attn_norm", false, 2 * D);  // read x, write xn
  if (Lq > 0) {
    mm("wq_a", false, D * Lq);
    ew("rmsnorm q_norm", false, 2 * Lq);
    mm("wq_b", false, Lq * H * Dqk);
  } else {
    mm("wq", false, D * H * Dqk);
  }
  ew("rope q_pe", false, 2 * H * Dr);
  mm("wkv_a", false, D * (Lkv + Dr));
  ew("rmsnorm kv_norm, rope k_pe", false, 2 * Lkv + 4 * Dr);
  if (!absorbed) {
    mm("up-projection wkv_b", false, Lkv * H * (Dn + Dv), in_kernel);
    // read [k_nope | v], write k and v
    if (!in_kernel) ew("k, v assembly", false, H * (Dn + Dv) + H * (Dqk + Dv));
    if (form.extra_forward_flops(c) > 0)
      out.push_back({"every rank's up-projection", false, OpClass::matmul, AttentionShape::dense,
                     form.extra_forward_flops(c) * L, 0});
  } else {
    mm("absorb W_UK into q", false, H * Dn * Lkv);
    ew("q_abs assembly", false, 2 * H * Dr);
    if (shape == AttentionShape::latent) ew("latent copies per head", false, H * (Dl + Dvo));
  }
  out.push_back({"attention", false, OpClass::attention_forward, shape, attention, 0});
  // A form's elementwise traffic beyond these phases (the ring forms' merges and accumulators).
  auto extra = [&](bool bwd) {
    const Form::ExtraBytes e = form.extra_elementwise_bytes(c, bwd);
    if (e.fp32 > 0)
      out.push_back(
          {"ring merges and fp32 accumulators", bwd, OpClass::accumulate, shape, 0, e.fp32 * L});
    if (e.storage > 0)
      out.push_back({"k, v assembly of the other blocks", bwd, OpClass::elementwise, shape, 0,
                     e.storage * L});
  };
  extra(false);
  if (absorbed) mm("absorb W_UV into o", false, H * Lkv * Dv);
  mm("wo", false, H * Dv * D);
  ew("residual", false, 3 * D);
  // Backward, in the block's order (block.cpp): wo, the core, then the local stage in reverse.
  mm("wo", true, H * Dv * D);
  if (absorbed) mm("absorb W_UV into o", true, H * Lkv * Dv);
  if (form.recompute_flops(c) > 0)
    in_kernel_product({"recompute up-projection", true, OpClass::matmul, AttentionShape::dense,
                       form.recompute_flops(c) * L, 0},
                      in_kernel);
  out.push_back({"attention", true, OpClass::attention_backward, shape, 2.5 * attention, 0});
  extra(true);
  if (!absorbed) {
    if (!in_kernel) ew("dk, dv assembly", true, H * (Dqk + Dv) + H * (Dn + Dv) + H * Dr);
    mm("up-projection wkv_b", true, Lkv * H * (Dn + Dv), in_kernel);
    if (form.extra_backward_flops(c) > 0)
      out.push_back({"every rank's up-projection", true, OpClass::matmul, AttentionShape::dense,
                     form.extra_backward_flops(c) * L, 0});
  } else {
    if (shape == AttentionShape::latent) ew("dk, dv sum over heads", true, H * (Dl + Dvo));
    mm("absorb W_UK into q", true, H * Dn * Lkv);
  }
  ew("rope k_pe, rmsnorm kv_norm", true, 3 * Lkv + 4 * Dr);
  mm("wkv_a", true, D * (Lkv + Dr));
  ew("rope q_pe", true, 2 * H * Dr);
  if (Lq > 0) {
    mm("wq_b", true, Lq * H * Dqk);
    ew("rmsnorm q_norm", true, 3 * Lq);
    mm("wq_a", true, D * Lq);
  } else {
    mm("wq", true, D * H * Dqk);
  }
  ew("rmsnorm attn_norm, residual", true, 3 * D + 3 * D);
  return out;
}

}  // namespace laga
