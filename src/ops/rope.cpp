// RoPE forward (rotate by +θ) and backward (by −θ), in place, tokens in parallel.
#include "laga/ops/rope.hpp"

#include <cmath>

#include "laga/core/error.hpp"
#include "laga/core/tensor.hpp"

namespace laga {

namespace {

template <class T>
void apply(const RopeParams& p, double sign) {
  const int64_t half = p.Dr / 2;
  T* x = static_cast<T*>(p.x);
#pragma omp parallel for schedule(static) if (p.T * p.inner * p.Dr >= kParallelMin)
  for (int64_t t = 0; t < p.T; ++t) {
    float cs[256], sn[256];
    const double pos = double(p.pos0 + t);
    for (int64_t i = 0; i < half; ++i) {
      const double a = pos * p.inv_freq[size_t(i)];
      cs[i] = float(std::cos(a) * p.attention_factor);
      sn[i] = float(sign * std::sin(a) * p.attention_factor);
    }
    for (int64_t j = 0; j < p.inner; ++j) {
      T* v = x + t * p.t_stride + j * p.inner_stride;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = p.interleaved ? 2 * i : i;
        const int64_t b = p.interleaved ? 2 * i + 1 : i + half;
        const float x0 = to_float(v[a]), x1 = to_float(v[b]);
        v[a] = from_float<T>(x0 * cs[i] - x1 * sn[i]);
        v[b] = from_float<T>(x0 * sn[i] + x1 * cs[i]);
      }
    }
  }
}

void run(const RopeParams& p, double sign) {
  LAGA_ASSERT(p.Dr % 2 == 0 && p.Dr <= 512 && int64_t(p.inv_freq.size()) == p.Dr / 2,
              "rope over Dr = {} with {} frequencies", p.Dr, p.inv_freq.size());
  dispatch_dtype(p.dtype, [&](auto* tag) { apply<std::remove_pointer_t<decltype(tag)>>(p, sign); });
}

}  // namespace

RopeParams rope_params(const MlaConfig& c) {
  RopeParams p;
  p.Dr = c.qk_rope_head_dim;
  p.dtype = c.dtype;
  p.interleaved = c.rope_interleaved;
  p.inv_freq = c.rope_inv_freq();
  p.attention_factor = c.rope_attention_factor();
  return p;
}

void rope_forward(const RopeParams& p) { run(p, +1.0); }
void rope_backward(const RopeParams& p) { run(p, -1.0); }

}  // namespace laga
