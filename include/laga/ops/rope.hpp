// RoPE with YaRN (docs/design.md §1.1), applied in place to Dr-wide vectors inside a sequence-first
// buffer: T tokens × `inner` vectors per token (batch × heads), token t at global position pos0 +
// t. Forward rotates by +θ and scales by YaRN's attention factor m; backward is the transpose, a
// rotation by −θ scaled by m. Angles are computed per call in double: no table is stored.
// Derivation: docs/block.md §rope.
#pragma once

#include <cstdint>
#include <vector>

#include "laga/core/dtype.hpp"

namespace laga {

// Hugging Face's rope_scaling of type "yarn" (DeepSeek-V2/V3), always applied when enabled.
struct RopeScaling {
  bool enabled = true;  // false: plain RoPE, and a softmax scale of Dqk^-0.5
  double factor = 40;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32, beta_slow = 1;
  double mscale = 1, mscale_all_dim = 1;
};

// Everything RoPE needs from a model: the rotated width, theta, the pair layout and the scaling.
struct RopeSpec {
  int64_t Dr = 0;
  double theta = 10000;
  bool interleaved = true;
  RopeScaling scaling;
};

// 0.1 · m · ln(factor) + 1, or 1 if factor ≤ 1
double yarn_mscale(double factor, double m);
// [Dr/2], YaRN-corrected (docs/design.md §1.1)
std::vector<double> rope_inv_freq(const RopeSpec& s);
double rope_attention_factor(const RopeSpec& s);  // yarn_mscale(f, m) / yarn_mscale(f, ma)

struct RopeParams {
  int64_t T = 0, inner = 0, Dr = 0;
  DType dtype = DType::f32;
  void* x = nullptr;  // [T, inner, Dr] at x + t·t_stride + i·inner_stride (+=/= in place)
  int64_t t_stride = 0, inner_stride = 0;
  int64_t pos0 = 0;
  bool interleaved = true;       // pairs (2i, 2i+1); false: (i, i + Dr/2)
  std::vector<double> inv_freq;  // [Dr/2]
  double attention_factor = 1.0;
};

// Params for this spec (frequencies, layout, factor) and dtype; the caller sets the buffer fields.
RopeParams rope_params(const RopeSpec& s, DType dtype);

void rope_forward(const RopeParams& p);
void rope_backward(const RopeParams& p);

}  // namespace laga
