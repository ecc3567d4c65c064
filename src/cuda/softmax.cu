// Softmax forward and backward: one block per row, the row in registers when it fits
// (rowwise.cuh's cached rows), otherwise streamed from memory.
#include <loom/runtime/cuda/softmax.hpp>

#include <initializer_list>
#include <string>
#include <utility>

#include <loom/core/error.hpp>

#include "check.cuh"
#include "rowwise.cuh"
#include "types.cuh"

namespace loom::cuda {
namespace {

using detail::block_max;
using detail::block_sum;
using detail::cached_threads;
using detail::device_t;
using detail::from_float;
using detail::load_row;
using detail::max_cached_cols;
using detail::max_row_threads;
using detail::row_elements;
using detail::row_grid;
using detail::store_vector;
using detail::to_float;
using detail::vector_index;
using detail::vectorizable;

constexpr unsigned streamed_threads = 512;

// The host's two passes: the exact row max, then exp(x - max) and its sum; y = e * (1 / sum).
template <int V, class D>
__global__ void __launch_bounds__(max_row_threads)
    softmax_forward_cached(const D* __restrict__ x, D* __restrict__ y, std::int64_t rows, int cols) {
    constexpr int K = row_elements / V;
    __shared__ float scratch[32];
    const int vectors = cols / V;
    for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float v[K][V];
        load_row<V>(x + r * cols, vectors, v);
        float m = -INFINITY;
#pragma unroll
        for (int k = 0; k < K; ++k) {
            if (vector_index(k) >= vectors) continue;
#pragma unroll
            for (int j = 0; j < V; ++j) m = fmaxf(m, v[k][j]);
        }
        m = block_max(m, scratch);
        float sum[1] = {0.0f};
#pragma unroll
        for (int k = 0; k < K; ++k) {
            if (vector_index(k) >= vectors) continue;
#pragma unroll
            for (int j = 0; j < V; ++j) {
                v[k][j] = expf(v[k][j] - m);
                sum[0] += v[k][j];
            }
        }
        block_sum(sum, scratch);
        const float inv = 1.0f / sum[0];
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const int vi = vector_index(k);
            if (vi >= vectors) continue;
#pragma unroll
            for (int j = 0; j < V; ++j) v[k][j] *= inv;
            store_vector<V>(y + r * cols + static_cast<std::int64_t>(vi) * V, v[k]);
        }
    }
}

// Rows too long for registers: one online max-and-sum pass, then the write pass.
template <class D>
__global__ void __launch_bounds__(streamed_threads)
    softmax_forward_streamed(const D* __restrict__ x, D* __restrict__ y, std::int64_t rows, std::int64_t cols) {
    __shared__ float scratch[64];
    for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const D* xr = x + r * cols;
        detail::max_sum a;
        detail::for_each_in_row(xr, cols, [&](std::int64_t, float v) { detail::absorb(a, v); });
        a = detail::block_combine(a, scratch);
        const float m = a.max, inv = 1.0f / a.sum;
        detail::map_row(xr, y + r * cols, cols, [=](std::int64_t, float v) { return expf(v - m) * inv; });
    }
}

template <int V, class D>
__global__ void __launch_bounds__(max_row_threads)
    softmax_backward_cached(const D* __restrict__ dy, const D* __restrict__ y, D* __restrict__ dx, std::int64_t rows,
                            int cols) {
    constexpr int K = row_elements / V;
    __shared__ float scratch[32];
    const int vectors = cols / V;
    for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float g[K][V], p[K][V];
        load_row<V>(dy + r * cols, vectors, g);
        load_row<V>(y + r * cols, vectors, p);
        float dot[1] = {0.0f};
#pragma unroll
        for (int k = 0; k < K; ++k)
#pragma unroll
            for (int j = 0; j < V; ++j) dot[0] += g[k][j] * p[k][j];  // zeros past the end add nothing
        block_sum(dot, scratch);
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const int vi = vector_index(k);
            if (vi >= vectors) continue;
#pragma unroll
            for (int j = 0; j < V; ++j) g[k][j] = (g[k][j] - dot[0]) * p[k][j];
            store_vector<V>(dx + r * cols + static_cast<std::int64_t>(vi) * V, g[k]);
        }
    }
}

template <class D>
__global__ void __launch_bounds__(streamed_threads)
    softmax_backward_streamed(const D* __restrict__ dy, const D* __restrict__ y, D* __restrict__ dx,
                              std::int64_t rows, std::int64_t cols) {
    __shared__ float scratch[32];
    for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const D* dyr = dy + r * cols;
        const D* yr = y + r * cols;
        float dot[1] = {0.0f};
        for (std::int64_t i = threadIdx.x; i < cols; i += blockDim.x) dot[0] += to_float(dyr[i]) * to_float(yr[i]);
        block_sum(dot, scratch);
        for (std::int64_t i = threadIdx.x; i < cols; i += blockDim.x)
            dx[r * cols + i] = from_float<D>((to_float(dyr[i]) - dot[0]) * to_float(yr[i]));
    }
}

void check_args(const char* fn, std::int64_t rows, std::int64_t cols,
                std::initializer_list<std::pair<const char*, const void*>> pointers) {
    if (rows < 0)
        throw usage_error(std::string(fn) + ": rows = " + std::to_string(rows) +
                          "; pass the number of rows (the product of the leading dims), 0 or more");
    if (cols < 1)
        throw usage_error(std::string(fn) + ": cols = " + std::to_string(cols) +
                          "; pass the length of the softmax's last dim, 1 or more");
    if (rows == 0) return;
    for (const auto& [name, p] : pointers)
        if (!p) throw usage_error(std::string(fn) + ": " + name + " is null; pass device memory for it");
}

}  // namespace

template <class T>
void softmax_forward(const T* x, T* y, std::int64_t rows, std::int64_t cols, stream_handle s) {
    constexpr const char* fn = "loom::cuda::softmax_forward";
    check_args(fn, rows, cols, {{"x", x}, {"y", y}});
    if (rows == 0) return;
    using D = device_t<T>;
    const D* dx_ = detail::device_ptr(x);
    D* dy_ = detail::device_ptr(y);
    const unsigned grid = row_grid(rows);
    if (cols <= max_cached_cols) {
        constexpr int V = detail::vector_width<D>;
        const int c = static_cast<int>(cols);
        if (vectorizable<D>(cols, {x, y}))
            softmax_forward_cached<V><<<grid, cached_threads(cols, V), 0, s>>>(dx_, dy_, rows, c);
        else
            softmax_forward_cached<1><<<grid, cached_threads(cols, 1), 0, s>>>(dx_, dy_, rows, c);
    } else {
        softmax_forward_streamed<<<grid, streamed_threads, 0, s>>>(dx_, dy_, rows, cols);
    }
    LOOM_CUDA_CHECK_LAUNCH(fn);
}

template <class T>
void softmax_backward(const T* dy, const T* y, T* dx, std::int64_t rows, std::int64_t cols, stream_handle s) {
    constexpr const char* fn = "loom::cuda::softmax_backward";
    check_args(fn, rows, cols, {{"dy", dy}, {"y", y}, {"dx", dx}});
    if (rows == 0) return;
    using D = device_t<T>;
    const D *ddy = detail::device_ptr(dy), *dyv = detail::device_ptr(y);
    D* ddx = detail::device_ptr(dx);
    const unsigned grid = row_grid(rows);
    if (cols <= max_cached_cols) {
        constexpr int V = detail::vector_width<D>;
        const int c = static_cast<int>(cols);
        if (vectorizable<D>(cols, {dy, y, dx}))
            softmax_backward_cached<V><<<grid, cached_threads(cols, V), 0, s>>>(ddy, dyv, ddx, rows, c);
        else
            softmax_backward_cached<1><<<grid, cached_threads(cols, 1), 0, s>>>(ddy, dyv, ddx, rows, c);
    } else {
        softmax_backward_streamed<<<grid, streamed_threads, 0, s>>>(ddy, dyv, ddx, rows, cols);
    }
    LOOM_CUDA_CHECK_LAUNCH(fn);
}

#define LOOM_INSTANTIATE(T)                                                                    \
    template void softmax_forward<T>(const T*, T*, std::int64_t, std::int64_t, stream_handle); \
    template void softmax_backward<T>(const T*, const T*, T*, std::int64_t, std::int64_t, stream_handle);
LOOM_INSTANTIATE(float)
LOOM_INSTANTIATE(bfloat16)
#undef LOOM_INSTANTIATE

}  // namespace loom::cuda
