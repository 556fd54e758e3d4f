#include "laga/core/random.hpp"

#include <cmath>

namespace laga {

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t stream_id(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
  return h;
}

double uniform01(uint64_t seed, uint64_t stream, uint64_t index) {
  uint64_t r = splitmix64(splitmix64(seed ^ splitmix64(stream)) + index);
  return (double(r >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

double normal(uint64_t seed, uint64_t stream, uint64_t index) {
  double u1 = uniform01(seed, stream, 2 * index), u2 = uniform01(seed, stream, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

void fill_normal(Tensor& t, uint64_t seed, std::string_view name, double std, double mean,
                 int64_t offset) {
  if (t.is_meta()) return;
  uint64_t s = stream_id(name);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < t.numel(); ++i)
    t.set(i, float(mean + std * normal(seed, s, uint64_t(offset + i))));
}

}  // namespace laga
