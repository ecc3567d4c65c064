// LayerNorm and RMSNorm: one block per row. A row of up to 8192 elements lives in
// registers (16 elements a thread), so each pass after the load is free of memory traffic;
// longer rows are re-read per pass. The two norms share every kernel: `centered` is
// LayerNorm (subtract the mean, add beta), otherwise RMSNorm. Each branch writes the host
// kernel's formula in the host kernel's order, so the two differ only by float rounding.
#include <loom/runtime/cuda/norms.hpp>

#include <algorithm>
#include <initializer_list>
#include <string>

#include <loom/core/error.hpp>

#include "check.cuh"
#include "rowwise.cuh"
#include "types.cuh"

namespace loom::cuda {
namespace {

using detail::block_sum;
using detail::cached_threads;
using detail::ceil_div;
using detail::device_t;
using detail::from_float;
using detail::load_row;
using detail::load_vector;
using detail::max_cached_cols;
using detail::max_row_threads;
using detail::row_elements;
using detail::row_grid;
using detail::store_vector;
using detail::to_float;
using detail::vector_index;
using detail::vectorizable;

constexpr unsigned streamed_threads = 512;

// The column sums of the partials: 32 adjacent columns (one coalesced line a row) times 16
// slices of the blocks, each slice summed in order, then the slices in order.
constexpr unsigned sum_columns = 32;
constexpr unsigned sum_slices = 16;

struct statistics {
    float mean, rstd;
};

// mean (0 for RMSNorm) and rstd = 1 / sqrt(mean((x - mean)^2) + eps) of a cached row, with
// the host's two passes and divisions.
template <bool centered, int V, int K>
__device__ __forceinline__ statistics cached_statistics(const float (&v)[K][V], int vectors, float n, float eps,
                                                        float* scratch) {
    float mean = 0.0f;
    if constexpr (centered) {
        float sum[1] = {0.0f};
#pragma unroll
        for (int k = 0; k < K; ++k)
#pragma unroll
            for (int j = 0; j < V; ++j) sum[0] += v[k][j];
        block_sum(sum, scratch);
        mean = sum[0] / n;
    }
    float squares[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < K; ++k) {
        if (vector_index(k) >= vectors) continue;
#pragma unroll
        for (int j = 0; j < V; ++j) {
            const float d = v[k][j] - mean;
            squares[0] += d * d;
        }
    }
    block_sum(squares, scratch);
    return {mean, 1.0f / sqrtf(squares[0] / n + eps)};
}

// The same statistics, the row read from memory once per pass.
template <bool centered, class D>
__device__ __forceinline__ statistics streamed_statistics(const D* row, std::int64_t cols, float eps, float* scratch) {
    const float n = static_cast<float>(cols);
    float mean = 0.0f;
    if constexpr (centered) {
        float sum[1] = {0.0f};
        for (std::int64_t i = threadIdx.x; i < cols; i += blockDim.x) sum[0] += to_float(row[i]);
        block_sum(sum, scratch);
        mean = sum[0] / n;
    }
    float squares[1] = {0.0f};
    for (std::int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
        const float d = to_float(row[i]) - mean;
        squares[0] += d * d;
    }
    block_sum(squares, scratch);
    return {mean, 1.0f / sqrtf(squares[0] / n + eps)};
}

template <bool centered, int V, class D>
__global__ void __launch_bounds__(max_row_threads)
    norm_forward_cached(const D* __restrict__ x, const D* __restrict__ gamma, const D* __restrict__ beta,
                        D* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                        std::int64_t rows, int cols, float eps) {
    constexpr int K = row_elements / V;
    __shared__ float scratch[32];
    const int vectors = cols / V;
    for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float v[K][V];
        load_row<V>(x + r * cols, vectors, v);
        const statistics st = cached_statistics<centered>(v, vectors, static_cast<float>(cols), eps, scratch);
        if (threadIdx.x == 0) {
            if (mean_out) mean_out[r] = st.mean;
            if (rstd_out) rstd_out[r] = st.rstd;
        }
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const int vi = vector_index(k);
            if (vi >= vectors) continue;
            float g[V], out[V];
            load_vector<V>(gamma + static_cast<std::int64_t>(vi) * V, g);
            if constexpr (centered) {
                float b[V];
                load_vector<V>(beta + static_cast<std::int64_t>(vi) * V, b);
#pragma unroll
                for (int j = 0; j < V; ++j) out[j] = (v[k][j] - st.mean) * st.rstd * g[j] + b[j];
            } else {
#pragma unroll
                for (int j = 0; j < V; ++j) out[j] = v[k][j] * st.rstd * g[j];
            }
            store_vector<V>(y + r * cols + static_cast<std::int64_t>(vi) * V, out);
        }
    }
}

template <bool centered, class D>
__global__ void __launch_bounds__(streamed_threads)
    norm_forward_streamed(const D* __restrict__ x, const D* __restrict__ gamma, const D* __restrict__ beta,
                          D* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                          std::int64_t rows, std::int64_t cols, float eps) {
    __shared__ float scratch[32];
    for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const D* xr = x + r * cols;
        D* yr = y + r * cols;
        const statistics st = streamed_statistics<centered>(xr, cols, eps, scratch);
        if (threadIdx.x == 0) {
            if (mean_out) mean_out[r] = st.mean;
            if (rstd_out) rstd_out[r] = st.rstd;
        }
        for (std::int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
            const float xi = to_float(xr[i]), gi = to_float(gamma[i]);
            if constexpr (centered) yr[i] = from_float<D>((xi - st.mean) * st.rstd * gi + to_float(beta[i]));
            else yr[i] = from_float<D>(xi * st.rstd * gi);
        }
    }
}

// Per block of rows_per_block rows: dx of each row, and the block's partial dgamma (and
// dbeta) at partial[(block * params + p) * cols], p = 0 (dgamma), 1 (dbeta).
template <bool centered, int V, class D>
__global__ void __launch_bounds__(max_row_threads)
    norm_backward_cached(const D* __restrict__ dy, const D* __restrict__ x, const D* __restrict__ gamma,
                         const float* __restrict__ mean_in, const float* __restrict__ rstd_in, D* __restrict__ dx,
                         float* __restrict__ partial, std::int64_t rows, int cols, float eps,
                         std::int64_t rows_per_block) {
    constexpr int K = row_elements / V;
    constexpr int params = centered ? 2 : 1;
    __shared__ float scratch[64];
    const int vectors = cols / V;
    const float n = static_cast<float>(cols);
    // gamma is re-read per row (an L1 hit) rather than held: its 16 registers would spill.
    float acc_g[K][V], acc_b[K][V];
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
        for (int j = 0; j < V; ++j) acc_g[k][j] = acc_b[k][j] = 0.0f;

    const std::int64_t first = blockIdx.x * rows_per_block;
    const std::int64_t last = first + rows_per_block < rows ? first + rows_per_block : rows;
    for (std::int64_t r = first; r < last; ++r) {
        float xv[K][V], dyv[K][V];
        load_row<V>(x + r * cols, vectors, xv);
        load_row<V>(dy + r * cols, vectors, dyv);
        // The same branch for the whole block: the reductions inside stay in step.
        const statistics st = rstd_in ? statistics{centered ? mean_in[r] : 0.0f, rstd_in[r]}
                                      : cached_statistics<centered>(xv, vectors, n, eps, scratch);
        D* dxr = dx + r * cols;
        if constexpr (centered) {
            float sums[2] = {0.0f, 0.0f};  // sum of g, sum of g xhat
#pragma unroll
            for (int k = 0; k < K; ++k) {
                const int vi = vector_index(k);
                if (vi >= vectors) continue;
                float gam[V];
                load_vector<V>(gamma + static_cast<std::int64_t>(vi) * V, gam);
#pragma unroll
                for (int j = 0; j < V; ++j) {
                    const float xhat = (xv[k][j] - st.mean) * st.rstd;
                    const float g = dyv[k][j] * gam[j];
                    sums[0] += g;
                    sums[1] += g * xhat;
                }
            }
            block_sum(sums, scratch);
            const float mean_g = sums[0] / n, mean_gx = sums[1] / n;
#pragma unroll
            for (int k = 0; k < K; ++k) {
                const int vi = vector_index(k);
                if (vi >= vectors) continue;
                float gam[V], out[V];
                load_vector<V>(gamma + static_cast<std::int64_t>(vi) * V, gam);
#pragma unroll
                for (int j = 0; j < V; ++j) {
                    const float xhat = (xv[k][j] - st.mean) * st.rstd;
                    out[j] = st.rstd * (dyv[k][j] * gam[j] - mean_g - xhat * mean_gx);
                    acc_g[k][j] += dyv[k][j] * xhat;
                    acc_b[k][j] += dyv[k][j];
                }
                store_vector<V>(dxr + static_cast<std::int64_t>(vi) * V, out);
            }
        } else {
            float sums[1] = {0.0f};  // sum of g x
#pragma unroll
            for (int k = 0; k < K; ++k) {
                const int vi = vector_index(k);
                if (vi >= vectors) continue;
                float gam[V];
                load_vector<V>(gamma + static_cast<std::int64_t>(vi) * V, gam);
#pragma unroll
                for (int j = 0; j < V; ++j) sums[0] += dyv[k][j] * gam[j] * xv[k][j];
            }
            block_sum(sums, scratch);
            const float c = st.rstd * st.rstd * (sums[0] / n);
#pragma unroll
            for (int k = 0; k < K; ++k) {
                const int vi = vector_index(k);
                if (vi >= vectors) continue;
                float gam[V], out[V];
                load_vector<V>(gamma + static_cast<std::int64_t>(vi) * V, gam);
#pragma unroll
                for (int j = 0; j < V; ++j) {
                    out[j] = st.rstd * (dyv[k][j] * gam[j] - xv[k][j] * c);
                    acc_g[k][j] += dyv[k][j] * (xv[k][j] * st.rstd);
                }
                store_vector<V>(dxr + static_cast<std::int64_t>(vi) * V, out);
            }
        }
    }

    float* pg = partial + static_cast<std::int64_t>(blockIdx.x) * params * cols;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        const int vi = vector_index(k);
        if (vi >= vectors) continue;
#pragma unroll
        for (int j = 0; j < V; ++j) {
            pg[vi * V + j] = acc_g[k][j];
            if constexpr (centered) pg[cols + vi * V + j] = acc_b[k][j];
        }
    }
}

// As norm_backward_cached for rows too long for registers: the block's partial sums
// accumulate in place in the workspace, each column always by the same thread.
template <bool centered, class D>
__global__ void __launch_bounds__(streamed_threads)
    norm_backward_streamed(const D* __restrict__ dy, const D* __restrict__ x, const D* __restrict__ gamma,
                           const float* __restrict__ mean_in, const float* __restrict__ rstd_in, D* __restrict__ dx,
                           float* __restrict__ partial, std::int64_t rows, std::int64_t cols, float eps,
                           std::int64_t rows_per_block) {
    constexpr int params = centered ? 2 : 1;
    __shared__ float scratch[64];
    const float n = static_cast<float>(cols);
    float* pg = partial + static_cast<std::int64_t>(blockIdx.x) * params * cols;
    float* pb = pg + cols;
    for (std::int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
        pg[i] = 0.0f;
        if constexpr (centered) pb[i] = 0.0f;
    }
    const std::int64_t first = blockIdx.x * rows_per_block;
    const std::int64_t last = first + rows_per_block < rows ? first + rows_per_block : rows;
    for (std::int64_t r = first; r < last; ++r) {
        const D* xr = x + r * cols;
        const D* dyr = dy + r * cols;
        D* dxr = dx + r * cols;
        const statistics st = rstd_in ? statistics{centered ? mean_in[r] : 0.0f, rstd_in[r]}
                                      : streamed_statistics<centered>(xr, cols, eps, scratch);
        if constexpr (centered) {
            float sums[2] = {0.0f, 0.0f};
            for (std::int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
                const float xhat = (to_float(xr[i]) - st.mean) * st.rstd;
                const float g = to_float(dyr[i]) * to_float(gamma[i]);
                sums[0] += g;
                sums[1] += g * xhat;
            }
            block_sum(sums, scratch);
            const float mean_g = sums[0] / n, mean_gx = sums[1] / n;
            for (std::int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
                const float xhat = (to_float(xr[i]) - st.mean) * st.rstd;
                const float dyi = to_float(dyr[i]);
                dxr[i] = from_float<D>(st.rstd * (dyi * to_float(gamma[i]) - mean_g - xhat * mean_gx));
                pg[i] += dyi * xhat;
                pb[i] += dyi;
            }
        } else {
            float sums[1] = {0.0f};
            for (std::int64_t i = threadIdx.x; i < cols; i += blockDim.x)
                sums[0] += to_float(dyr[i]) * to_float(gamma[i]) * to_float(xr[i]);
            block_sum(sums, scratch);
            const float c = st.rstd * st.rstd * (sums[0] / n);
            for (std::int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
                const float xi = to_float(xr[i]), dyi = to_float(dyr[i]);
                dxr[i] = from_float<D>(st.rstd * (dyi * to_float(gamma[i]) - xi * c));
                pg[i] += dyi * (xi * st.rstd);
            }
        }
    }
}

// out_p[c] = sum over blocks b in order of partial[(b * params + p) * cols + c], p = blockIdx.y.
template <class D>
__global__ void __launch_bounds__(sum_columns* sum_slices)
    sum_partials(const float* __restrict__ partial, std::int64_t blocks, std::int64_t cols, int params,
                 D* __restrict__ out0, D* __restrict__ out1) {
    __shared__ float slice_sums[sum_slices][sum_columns + 1];
    const int p = static_cast<int>(blockIdx.y);
    const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * sum_columns + threadIdx.x;
    const std::int64_t per_slice = (blocks + sum_slices - 1) / sum_slices;
    const std::int64_t b0 = threadIdx.y * per_slice;
    const std::int64_t b1 = b0 + per_slice < blocks ? b0 + per_slice : blocks;
    float s = 0.0f;
    if (c < cols) {
#pragma unroll 4
        for (std::int64_t b = b0; b < b1; ++b) s += partial[(b * params + p) * cols + c];
    }
    slice_sums[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float total = slice_sums[0][threadIdx.x];
        for (unsigned y = 1; y < sum_slices; ++y) total += slice_sums[y][threadIdx.x];
        (p == 0 ? out0 : out1)[c] = from_float<D>(total);
    }
}

// How the backward splits rows into blocks, each with its own partial sums: enough blocks to
// fill a GPU (about 2^21 elements a pass), at least 128. A function of the shape alone, so
// the order of the sums, and the workspace, are the same on every device.
struct partial_plan {
    std::int64_t blocks, rows_per_block;
};

partial_plan plan_partials(std::int64_t rows, std::int64_t cols) {
    const std::int64_t wanted = std::max<std::int64_t>(128, (std::int64_t{1} << 21) / std::max<std::int64_t>(cols, 1));
    const std::int64_t rows_per_block = ceil_div(std::max<std::int64_t>(rows, 1), wanted);
    return {ceil_div(std::max<std::int64_t>(rows, 1), rows_per_block), rows_per_block};
}

std::size_t workspace_bytes(std::int64_t rows, std::int64_t cols, int params) {
    if (rows <= 0 || cols <= 0) return 0;
    return static_cast<std::size_t>(plan_partials(rows, cols).blocks * params * cols) * sizeof(float);
}

void check_shape(const char* fn, std::int64_t rows, std::int64_t cols, float eps) {
    if (rows < 0)
        throw usage_error(std::string(fn) + ": rows = " + std::to_string(rows) +
                          "; pass the number of rows (the product of the leading dims), 0 or more");
    if (cols < 1)
        throw usage_error(std::string(fn) + ": cols = " + std::to_string(cols) +
                          "; pass the length of the normalised last dim, 1 or more");
    if (!(eps >= 0.0f))
        throw usage_error(std::string(fn) + ": eps = " + std::to_string(eps) +
                          "; pass a non-negative epsilon (layer_norm's default is 1e-5, rms_norm's 1e-6)");
}

using detail::check_pointer;

template <bool centered, class T>
void norm_forward(const char* fn, const T* x, const T* gamma, const T* beta, T* y, float* mean, float* rstd,
                  std::int64_t rows, std::int64_t cols, float eps, stream_handle s) {
    check_shape(fn, rows, cols, eps);
    if (rows == 0) return;
    check_pointer(fn, "x", x);
    check_pointer(fn, "gamma", gamma);
    if (centered) check_pointer(fn, "beta", beta);
    check_pointer(fn, "y", y);
    using D = device_t<T>;
    const D *dx_ = detail::device_ptr(x), *dg = detail::device_ptr(gamma), *db = detail::device_ptr(beta);
    D* dy_ = detail::device_ptr(y);
    const unsigned grid = row_grid(rows);
    if (cols <= max_cached_cols) {
        constexpr int V = detail::vector_width<D>;
        const int c = static_cast<int>(cols);
        if (vectorizable<D>(cols, {x, gamma, beta, y}))
            norm_forward_cached<centered, V><<<grid, cached_threads(cols, V), 0, s>>>(dx_, dg, db, dy_, mean, rstd,
                                                                                      rows, c, eps);
        else
            norm_forward_cached<centered, 1><<<grid, cached_threads(cols, 1), 0, s>>>(dx_, dg, db, dy_, mean, rstd,
                                                                                      rows, c, eps);
    } else {
        norm_forward_streamed<centered><<<grid, streamed_threads, 0, s>>>(dx_, dg, db, dy_, mean, rstd, rows, cols,
                                                                          eps);
    }
    LOOM_CUDA_CHECK_LAUNCH(fn);
}

template <bool centered, class T>
void norm_backward(const char* fn, const T* dy, const T* x, const T* gamma, const float* mean, const float* rstd,
                   T* dx, T* dgamma, T* dbeta, std::int64_t rows, std::int64_t cols, float eps, void* workspace,
                   stream_handle s) {
    constexpr int params = centered ? 2 : 1;
    check_shape(fn, rows, cols, eps);
    check_pointer(fn, "dgamma", dgamma);
    if (centered) check_pointer(fn, "dbeta", dbeta);
    if (centered && (mean == nullptr) != (rstd == nullptr))
        throw usage_error(std::string(fn) + ": mean is " + (mean ? "given" : "null") + " but rstd is " +
                          (rstd ? "given" : "null") +
                          "; pass both statistics of the forward, or neither to recompute them from x");
    if (rows == 0) {  // no rows: the parameter gradients are sums of nothing
        fill_zero(dgamma, static_cast<std::size_t>(cols) * sizeof(T), s);
        if (centered) fill_zero(dbeta, static_cast<std::size_t>(cols) * sizeof(T), s);
        return;
    }
    check_pointer(fn, "dy", dy);
    check_pointer(fn, "x", x);
    check_pointer(fn, "gamma", gamma);
    check_pointer(fn, "dx", dx);
    if (!workspace || !detail::aligned_16(workspace))
        throw usage_error(std::string(fn) + ": workspace is " + (workspace ? "not 16-byte aligned" : "null") +
                          "; pass " + std::to_string(workspace_bytes(rows, cols, params)) +
                          " bytes (the *_backward_workspace_bytes(rows, cols) of this norm) of 16-byte-aligned "
                          "device memory");
    using D = device_t<T>;
    const D *ddy = detail::device_ptr(dy), *dxin = detail::device_ptr(x), *dg = detail::device_ptr(gamma);
    D* ddx = detail::device_ptr(dx);
    auto* partial = static_cast<float*>(workspace);
    const partial_plan plan = plan_partials(rows, cols);
    const auto grid = static_cast<unsigned>(plan.blocks);
    if (cols <= max_cached_cols) {
        constexpr int V = detail::vector_width<D>;
        const int c = static_cast<int>(cols);
        if (vectorizable<D>(cols, {dy, x, gamma, dx}))
            norm_backward_cached<centered, V><<<grid, cached_threads(cols, V), 0, s>>>(
                ddy, dxin, dg, mean, rstd, ddx, partial, rows, c, eps, plan.rows_per_block);
        else
            norm_backward_cached<centered, 1><<<grid, cached_threads(cols, 1), 0, s>>>(
                ddy, dxin, dg, mean, rstd, ddx, partial, rows, c, eps, plan.rows_per_block);
    } else {
        norm_backward_streamed<centered><<<grid, streamed_threads, 0, s>>>(ddy, dxin, dg, mean, rstd, ddx, partial,
                                                                           rows, cols, eps, plan.rows_per_block);
    }
    LOOM_CUDA_CHECK_LAUNCH(fn);
    const dim3 sum_grid(static_cast<unsigned>(ceil_div(cols, sum_columns)), params);
    sum_partials<<<sum_grid, dim3(sum_columns, sum_slices), 0, s>>>(partial, plan.blocks, cols, params,
                                                                     detail::device_ptr(dgamma),
                                                                     detail::device_ptr(dbeta));
    LOOM_CUDA_CHECK_LAUNCH(fn);
}

}  // namespace

template <class T>
void layer_norm_forward(const T* x, const T* gamma, const T* beta, T* y, float* mean, float* rstd, std::int64_t rows,
                        std::int64_t cols, float eps, stream_handle s) {
    norm_forward<true>("loom::cuda::layer_norm_forward", x, gamma, beta, y, mean, rstd, rows, cols, eps, s);
}

std::size_t layer_norm_backward_workspace_bytes(std::int64_t rows, std::int64_t cols) {
    return workspace_bytes(rows, cols, 2);
}

template <class T>
void layer_norm_backward(const T* dy, const T* x, const T* gamma, const float* mean, const float* rstd, T* dx,
                         T* dgamma, T* dbeta, std::int64_t rows, std::int64_t cols, float eps, void* workspace,
                         stream_handle s) {
    norm_backward<true>("loom::cuda::layer_norm_backward", dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, cols,
                        eps, workspace, s);
}

template <class T>
void rms_norm_forward(const T* x, const T* gamma, T* y, float* rstd, std::int64_t rows, std::int64_t cols, float eps,
                      stream_handle s) {
    norm_forward<false>("loom::cuda::rms_norm_forward", x, gamma, static_cast<const T*>(nullptr), y, nullptr, rstd,
                        rows, cols, eps, s);
}

std::size_t rms_norm_backward_workspace_bytes(std::int64_t rows, std::int64_t cols) {
    return workspace_bytes(rows, cols, 1);
}

template <class T>
void rms_norm_backward(const T* dy, const T* x, const T* gamma, const float* rstd, T* dx, T* dgamma,
                       std::int64_t rows, std::int64_t cols, float eps, void* workspace, stream_handle s) {
    norm_backward<false>("loom::cuda::rms_norm_backward", dy, x, gamma, nullptr, rstd, dx, dgamma,
                         static_cast<T*>(nullptr), rows, cols, eps, workspace, s);
}

#define LOOM_INSTANTIATE(T)                                                                                       \
    template void layer_norm_forward<T>(const T*, const T*, const T*, T*, float*, float*, std::int64_t,          \
                                        std::int64_t, float, stream_handle);                                     \
    template void layer_norm_backward<T>(const T*, const T*, const T*, const float*, const float*, T*, T*, T*,   \
                                         std::int64_t, std::int64_t, float, void*, stream_handle);               \
    template void rms_norm_forward<T>(const T*, const T*, T*, float*, std::int64_t, std::int64_t, float,         \
                                      stream_handle);                                                            \
    template void rms_norm_backward<T>(const T*, const T*, const T*, const float*, T*, T*, std::int64_t,         \
                                       std::int64_t, float, void*, stream_handle);
LOOM_INSTANTIATE(float)
LOOM_INSTANTIATE(bfloat16)
#undef LOOM_INSTANTIATE

}  // namespace loom::cuda
