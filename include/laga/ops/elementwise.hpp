// Small memory-bound loops the block and the forms share: strided row copies, in-place sums, and
// sums over heads. fp32 arithmetic, one rounding to the storage dtype. Every loop returns at once
// on a meta tracker (core/memory.hpp). Not here: anything with a matrix product (ops/matmul.hpp).
#pragma once

#include <cstdint>

#include "laga/core/dtype.hpp"
#include "laga/core/tensor.hpp"

namespace laga {

// Pointer to element `offset` of x.
void* at(const Tensor& x, int64_t offset);

// Copies `cols` elements of each of `rows` rows between strided buffers of one dtype.
void copy_rows(DType t, int64_t rows, int64_t cols, const void* src, int64_t src_stride, void* dst,
               int64_t dst_stride);

// y += x elementwise (fp32 arithmetic), same shapes and dtypes.
void add_into(Tensor& y, const Tensor& x);

// dst[m, i] (= or +=) Σ_{h < Hs} src[m, h, i] over `rows` rows of `cols` elements, in fp32, rounded
// once to dst's dtype (src's, or fp32). Strides in elements: src rows src_row apart and heads
// src_head apart; dst rows dst_row apart.
void sum_heads(DType src_t, int64_t rows, int64_t Hs, int64_t cols, const void* src,
               int64_t src_row, int64_t src_head, DType dst_t, void* dst, int64_t dst_row,
               bool accumulate);

}  // namespace laga
