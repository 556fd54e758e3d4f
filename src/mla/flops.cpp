#include "laga/mla/flops.hpp"

#include "laga/mla/form.hpp"

namespace laga {

BlockFlops block_flops(const MlaConfig& c) {
  const double tokens = double(c.seq_len * c.batch);
  const double D = double(c.hidden_size), H = double(c.num_attention_heads), Lq = double(c.q_lora_rank);
  const double Lkv = double(c.kv_lora_rank), Dr = double(c.qk_rope_head_dim), Dn = double(c.qk_nope_head_dim);
  const double Dqk = double(c.qk_head_dim()), Dv = double(c.v_head_dim);
  // Multiply-adds per token: q path, kv down-projection, the up-projection (W_UK, W_UV: the same
  // count whether applied to k/v or folded into q and o), output projection.
  double q = Lq > 0 ? D * Lq + Lq * H * Dqk : D * H * Dqk;
  double macs = q + D * (Lkv + Dr) + Lkv * H * (Dn + Dv) + H * Dv * D;
  double projections = 2 * macs * tokens;
  const Form& form = find_form(c.form);
  const double attention = form.attention_forward_flops(c);
  BlockFlops f;
  f.attention_forward = attention * double(c.num_layers);
  f.forward = (projections + attention) * double(c.num_layers);
  // A form's recomputation (Form::recompute_flops) is executed work of its backward.
  f.backward = (2 * projections + 2.5 * attention + form.recompute_flops(c)) * double(c.num_layers);
  return f;
}

}  // namespace laga
