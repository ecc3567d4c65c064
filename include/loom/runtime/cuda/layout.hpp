#pragma once
// Data movement of the CUDA backend: attention heads as an axis of their own (the layouts of
// ops::split_heads and ops::merge_heads), column sums over leading dims (ops::sum_leading,
// the bias gradient) and fills (ops::fill_like). T is float or loom::bfloat16.
#include <cstddef>
#include <cstdint>

#include <loom/core/bfloat16.hpp>
#include <loom/runtime/cuda/device.hpp>

namespace loom::cuda {

// x [b, s, heads * d] -> y [b, heads, s, d]
template <class T>
void split_heads(const T* x, T* y, std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t head_dim,
                 stream_handle s);
// x [b, heads, s, d] -> y [b, s, heads * d]
template <class T>
void merge_heads(const T* x, T* y, std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t head_dim,
                 stream_handle s);

// y[c] = scale * sum over r of x[r, c] for x [rows, cols], summed in float in a fixed order
// (per slab of rows, then over slabs): deterministic.
std::size_t sum_rows_workspace_bytes(std::int64_t rows, std::int64_t cols);
template <class T>
void sum_rows(const T* x, T* y, std::int64_t rows, std::int64_t cols, void* workspace, stream_handle s);

// y[i] = value
template <class T>
void fill(T* y, float value, std::int64_t n, stream_handle s);

}  // namespace loom::cuda
