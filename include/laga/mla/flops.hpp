// FLOPs of the block stack, whole sequence, all ranks together (docs/design.md §4): projections counted
// exactly (2 per multiply-add), attention by FlashAttention-3's convention with causal
// avg_kv = (T+1)/2 and backward = 2.5× forward, for the attention each form executes (Form::
// attention_forward_flops: the absorbed core scores over Dl and sums values of Lkv, the others Dqk and
// Dv). Elementwise work (norms, RoPE, softmax) is not counted.
#pragma once

#include "laga/mla/config.hpp"

namespace laga {

struct BlockFlops {
  double forward = 0, backward = 0;
  double attention_forward = 0;  // the core's share of forward
};

BlockFlops block_flops(const MlaConfig& c);

}  // namespace laga
