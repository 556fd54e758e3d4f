// RoPE with YaRN (DESIGN §1.1), applied in place to Dr-wide vectors inside a sequence-first
// buffer: T tokens × `inner` vectors per token (batch × heads), token t at global position pos0 + t.
// Forward rotates by +θ and scales by YaRN's attention factor m; backward is the transpose,
// a rotation by −θ scaled by m. Angles are computed per call in double: no table is stored.
// Derivation: docs/block.md §rope.
#pragma once

#include <cstdint>
#include <vector>

#include "laga/core/config.hpp"
#include "laga/core/dtype.hpp"

namespace laga {

struct RopeParams {
  int64_t T = 0, inner = 0, Dr = 0;
  DType dtype = DType::f32;
  void* x = nullptr;  // [T, inner, Dr] at x + t·t_stride + i·inner_stride (+=/= in place)
  int64_t t_stride = 0, inner_stride = 0;
  int64_t pos0 = 0;
  bool interleaved = true;   // pairs (2i, 2i+1); false: (i, i + Dr/2)
  std::vector<double> inv_freq;  // [Dr/2]
  double attention_factor = 1.0;
};

// Params for this config (frequencies, layout, factor); the caller sets the buffer fields.
RopeParams rope_params(const MlaConfig& c);

void rope_forward(const RopeParams& p);
void rope_backward(const RopeParams& p);

}  // namespace laga
