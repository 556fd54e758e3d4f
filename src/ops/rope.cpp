// RoPE forward (rotate by +θ) and backward (by −θ), in place, tokens in parallel.
#include "laga/ops/rope.hpp"
#include "laga/core/work.hpp"

#include <algorithm>
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
  WorkOp work(stream_work(WorkClass::elementwise, "rope", p.dtype,
                          2.0 * double(p.T * p.inner * p.Dr * dtype_size(p.dtype))));
  if (meta_mode()) return;
  dispatch_dtype(p.dtype, [&](auto* tag) { apply<std::remove_pointer_t<decltype(tag)>>(p, sign); });
}

}  // namespace

double yarn_mscale(double factor, double m) {
  return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}

double rope_attention_factor(const RopeSpec& s) {
  if (!s.scaling.enabled) return 1.0;
  return yarn_mscale(s.scaling.factor, s.scaling.mscale) /
         yarn_mscale(s.scaling.factor, s.scaling.mscale_all_dim);
}

std::vector<double> rope_inv_freq(const RopeSpec& s) {
  const int64_t Dr = s.Dr;
  std::vector<double> inv(size_t(Dr / 2));
  for (int64_t i = 0; i < Dr / 2; ++i)
    inv[size_t(i)] = std::pow(s.theta, -2.0 * double(i) / double(Dr));
  if (!s.scaling.enabled) return inv;
  const auto& rs = s.scaling;
  auto corr = [&](double n) {
    return double(Dr) * std::log(double(rs.original_max_position_embeddings) / (n * 2 * M_PI)) /
           (2 * std::log(s.theta));
  };
  double low = std::max(std::floor(corr(rs.beta_fast)), 0.0);
  double high = std::min(std::ceil(corr(rs.beta_slow)), double(Dr - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < Dr / 2; ++i) {
    double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    double f = inv[size_t(i)];
    inv[size_t(i)] = f / rs.factor * ramp + f * (1 - ramp);
  }
  return inv;
}

RopeParams rope_params(const RopeSpec& s, DType dtype) {
  RopeParams p;
  p.Dr = s.Dr;
  p.dtype = dtype;
  p.interleaved = s.interleaved;
  p.inv_freq = rope_inv_freq(s);
  p.attention_factor = rope_attention_factor(s);
  return p;
}

void rope_forward(const RopeParams& p) { run(p, +1.0); }
void rope_backward(const RopeParams& p) { run(p, -1.0); }

}  // namespace laga
