// Head permutations, deterministic column sums and fills.
#include <algorithm>
#include <cstdint>

#include <loom/runtime/cuda/layout.hpp>

#include "check.cuh"
#include "types.cuh"

namespace loom::cuda {
namespace {

using detail::from_float;
using detail::to_float;

constexpr unsigned threads = 256;
// 64 rows a slab: GPT-2's [16384, 768] bias gradients make 768 blocks of partials rather than
// 192, and each thread's loads are unrolled so that they overlap (one load in flight at a time
// left the column sums latency-bound on an H200).
constexpr std::int64_t rows_per_slab = 64;

// y = x with the seq and heads axes swapped: split_heads reads [b, s, h, d] and writes
// [b, h, s, d], merge_heads the reverse. One thread per unit of y (16 bytes where a head's
// row is a multiple of them and both pointers are aligned, else one element), consecutive
// threads on consecutive units: reads and writes both coalesced along d. The index is 32-bit
// where the units fit (64-bit divisions are emulated, and cost more than the copy: the
// element-wise 64-bit form ran at a tenth of the memory bandwidth on an H200).
template <bool Split, class V, class Index>
__global__ void permute_heads_kernel(const V* __restrict__ x, V* __restrict__ y, Index n, Index units, Index seq,
                                     Index heads) {
    for (Index i = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<Index>(gridDim.x) * blockDim.x) {
        const Index unit = i % units, row = i / units;  // y's row of one head
        Index from;                                     // x's row of the same head
        if constexpr (Split) {                          // row = (b * heads + h) * seq + s
            const Index s = row % seq, bh = row / seq, h = bh % heads, b = bh / heads;
            from = (b * seq + s) * heads + h;
        } else {  // row = (b * seq + s) * heads + h
            const Index h = row % heads, bs = row / heads, s = bs % seq, b = bs / seq;
            from = (b * heads + h) * seq + s;
        }
        y[i] = x[static_cast<std::size_t>(from) * units + unit];
    }
}

template <bool Split, class T>
void permute_heads(const T* x, T* y, std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t head_dim,
                   stream_handle s, const char* what) {
    const std::int64_t elements = batch * seq * heads * head_dim;
    if (elements <= 0) return;
    const std::size_t row_bytes = static_cast<std::size_t>(head_dim) * sizeof(T);
    const bool wide = row_bytes % sizeof(uint4) == 0 && reinterpret_cast<std::uintptr_t>(x) % sizeof(uint4) == 0 &&
                      reinterpret_cast<std::uintptr_t>(y) % sizeof(uint4) == 0;
    const std::int64_t units = wide ? static_cast<std::int64_t>(row_bytes / sizeof(uint4)) : head_dim;
    const std::int64_t n = elements / head_dim * units;
    auto launch = [&](auto unit, auto index) {
        using V = decltype(unit);
        using Index = decltype(index);
        permute_heads_kernel<Split><<<detail::blocks_for(n, threads), threads, 0, s>>>(
            reinterpret_cast<const V*>(x), reinterpret_cast<V*>(y), static_cast<Index>(n), static_cast<Index>(units),
            static_cast<Index>(seq), static_cast<Index>(heads));
    };
    const bool narrow_index = n <= std::int64_t{0xFFFFFFFF};
    if (wide) narrow_index ? launch(uint4{}, std::uint32_t{}) : launch(uint4{}, std::uint64_t{});
    else if constexpr (sizeof(T) == 4) narrow_index ? launch(std::uint32_t{}, std::uint32_t{}) : launch(std::uint32_t{}, std::uint64_t{});
    else narrow_index ? launch(std::uint16_t{}, std::uint32_t{}) : launch(std::uint16_t{}, std::uint64_t{});
    LOOM_CUDA_CHECK_LAUNCH(what);
}

// Pass 1: partial[slab, c] = sum of x[r, c] over the slab's rows, in row order.
template <class D>
__global__ void column_partials_kernel(const D* __restrict__ x, float* __restrict__ partial, std::int64_t rows,
                                       std::int64_t cols) {
    const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
    const std::int64_t slab = blockIdx.y;
    if (c >= cols) return;
    const std::int64_t first = slab * rows_per_slab, last = min(first + rows_per_slab, rows);
    float sum = 0;
#pragma unroll 8
    for (std::int64_t r = first; r < last; ++r) sum += to_float(x[r * cols + c]);
    partial[slab * cols + c] = sum;
}

// Pass 2: y[c] = sum of the partials in slab order.
template <class D>
__global__ void column_finish_kernel(const float* __restrict__ partial, D* __restrict__ y, std::int64_t slabs,
                                     std::int64_t cols) {
    const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
    if (c >= cols) return;
    float sum = 0;
#pragma unroll 8
    for (std::int64_t k = 0; k < slabs; ++k) sum += partial[k * cols + c];
    y[c] = from_float<D>(sum);
}

template <class D>
__global__ void fill_kernel(D* y, float value, std::int64_t n) {
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
        y[i] = from_float<D>(value);
}

std::int64_t slabs_of(std::int64_t rows) { return std::max<std::int64_t>(1, (rows + rows_per_slab - 1) / rows_per_slab); }

}  // namespace

template <class T>
void split_heads(const T* x, T* y, std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t head_dim,
                 stream_handle s) {
    permute_heads<true>(x, y, batch, seq, heads, head_dim, s, "split_heads");
}

template <class T>
void merge_heads(const T* x, T* y, std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t head_dim,
                 stream_handle s) {
    permute_heads<false>(x, y, batch, seq, heads, head_dim, s, "merge_heads");
}

std::size_t sum_rows_workspace_bytes(std::int64_t rows, std::int64_t cols) {
    return static_cast<std::size_t>(slabs_of(rows) * std::max<std::int64_t>(cols, 1)) * sizeof(float);
}

template <class T>
void sum_rows(const T* x, T* y, std::int64_t rows, std::int64_t cols, void* workspace, stream_handle s) {
    if (cols <= 0) return;
    const std::int64_t slabs = slabs_of(rows);
    if (slabs > 65535)
        throw usage_error("cuda::sum_rows: " + std::to_string(rows) + " rows need " + std::to_string(slabs) +
                          " slabs, more than a grid's y extent (65535); sum in several calls");
    auto* partial = static_cast<float*>(workspace);
    const dim3 grid(static_cast<unsigned>((cols + threads - 1) / threads), static_cast<unsigned>(slabs));
    column_partials_kernel<<<grid, threads, 0, s>>>(detail::device_ptr(x), partial, rows, cols);
    LOOM_CUDA_CHECK_LAUNCH("sum_rows (partials)");
    column_finish_kernel<<<static_cast<unsigned>((cols + threads - 1) / threads), threads, 0, s>>>(
        partial, detail::device_ptr(y), slabs, cols);
    LOOM_CUDA_CHECK_LAUNCH("sum_rows (finish)");
}

template <class T>
void fill(T* y, float value, std::int64_t n, stream_handle s) {
    if (n <= 0) return;
    fill_kernel<<<detail::blocks_for(n, threads), threads, 0, s>>>(detail::device_ptr(y), value, n);
    LOOM_CUDA_CHECK_LAUNCH("fill");
}

#define LOOM_INSTANTIATE(T)                                                                                       \
    template void split_heads<T>(const T*, T*, std::int64_t, std::int64_t, std::int64_t, std::int64_t, stream_handle); \
    template void merge_heads<T>(const T*, T*, std::int64_t, std::int64_t, std::int64_t, std::int64_t, stream_handle); \
    template void sum_rows<T>(const T*, T*, std::int64_t, std::int64_t, void*, stream_handle);                    \
    template void fill<T>(T*, float, std::int64_t, stream_handle);
LOOM_INSTANTIATE(float)
LOOM_INSTANTIATE(bfloat16)
#undef LOOM_INSTANTIATE

}  // namespace loom::cuda
