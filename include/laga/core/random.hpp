// Counter-based random numbers: value i of stream s under seed k is a pure function of (k, s, i),
// so every rank, every form and the reference draw identical weights and inputs without sharing a
// generator, and a shard of a tensor can be drawn without drawing the rest.
#pragma once

#include <cstdint>
#include <string_view>

#include "laga/core/tensor.hpp"

namespace laga {

uint64_t stream_id(std::string_view name);                         // FNV-1a of the name
double uniform01(uint64_t seed, uint64_t stream, uint64_t index);  // in (0, 1)
double normal(uint64_t seed, uint64_t stream, uint64_t index);     // standard normal (Box-Muller)

// t[i] = mean + std · normal(seed, stream_id(name), offset + i), rounded to t's dtype. With an
// offset, a rank draws its shard of a tensor that every rank sees the same way.
void fill_normal(Tensor& t, uint64_t seed, std::string_view name, double std, double mean = 0.0,
                 int64_t offset = 0);

}  // namespace laga
