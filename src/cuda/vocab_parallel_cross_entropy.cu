// The vocabulary-parallel cross-entropy ops on the GPU. The per-chunk ops take one block per
// chunk of logits (16-byte vectors wherever the chunk's address allows, rowwise.cuh); the
// per-position ops one thread per position, over the few chunks of a position; the loss one
// block that sums the positions in double. Block sizes depend on the shapes only, so each
// sum's order is fixed.
#include <loom/runtime/cuda/vocab_parallel_cross_entropy.hpp>

#include <cmath>
#include <string>

#include <loom/core/error.hpp>

#include "check.cuh"
#include "rowwise.cuh"
#include "types.cuh"

namespace loom::cuda {
namespace {

using detail::device_t;
using detail::from_float;
using detail::to_float;

constexpr unsigned max_chunk_threads = 512;
constexpr unsigned position_threads = 256;
constexpr unsigned total_threads = 1024;

// Threads of the block that reduces or maps one chunk of v elements: whole warps, about four
// 16-byte vectors a thread, at most 512 (a chunk of 25152 bf16, GPT-2's padded vocabulary over
// two devices, takes 512).
template <class D>
unsigned chunk_threads(std::int64_t v) {
    const std::int64_t vectors = detail::ceil_div(v, detail::vector_width<D>);
    const std::int64_t threads = detail::ceil_div(detail::ceil_div(vectors, 4), 32) * 32;
    return static_cast<unsigned>(threads < 32 ? 32 : (threads > max_chunk_threads ? max_chunk_threads : threads));
}

// Where a position's target sits among this piece's columns [row_offset, row_offset + v).
constexpr std::int64_t not_held = -1;  // ignored, or a class another piece holds
constexpr std::int64_t invalid = -2;   // outside [0, vocab) and not ignore_index

__device__ __forceinline__ std::int64_t target_column(std::int32_t target, std::int64_t v, std::int64_t vocab,
                                                      std::int64_t row_offset, std::int64_t ignore_index) {
    if (target == ignore_index) return not_held;
    if (target < 0 || target >= vocab) return invalid;
    const std::int64_t col = target - row_offset;
    return col >= 0 && col < v ? col : not_held;
}

// log-sum-exp of a few float values around their max (two passes, in order).
__device__ __forceinline__ float small_logsumexp(const float* x, std::int64_t n) {
    float m = -INFINITY;
    for (std::int64_t k = 0; k < n; ++k) m = fmaxf(m, x[k]);
    float sum = 0.0f;
    for (std::int64_t k = 0; k < n; ++k) sum += expf(x[k] - m);
    return m + logf(sum);
}

template <class D>
__global__ void __launch_bounds__(max_chunk_threads)
    chunk_logsumexp_kernel(const D* __restrict__ logits, float* __restrict__ lse, std::int64_t segments,
                           std::int64_t v) {
    __shared__ float scratch[64];
    for (std::int64_t k = blockIdx.x; k < segments; k += gridDim.x) {
        detail::max_sum a;
        detail::for_each_in_row(logits + k * v, v, [&](std::int64_t, float x) { detail::absorb(a, x); });
        a = detail::block_combine(a, scratch);
        if (threadIdx.x == 0) lse[k] = a.max + logf(a.sum);
    }
}

// logits may equal dlogits: no restrict on them.
template <class D>
__global__ void __launch_bounds__(max_chunk_threads)
    chunk_logsumexp_grad_kernel(const D* __restrict__ dlse, const D* logits, const float* __restrict__ lse, D* dlogits,
                                std::int64_t segments, std::int64_t v) {
    for (std::int64_t k = blockIdx.x; k < segments; k += gridDim.x) {
        const float scale = to_float(dlse[k]), shift = lse[k];
        detail::map_row(logits + k * v, dlogits + k * v, v,
                        [=](std::int64_t, float x) { return scale * expf(x - shift); });
    }
}

// Ragged chunks: one block per position reduces (or maps) the n columns of one chunk, which
// start at column `first` of rows of v; the chunk's lse (and dlse) sit `stride` apart.
template <class D>
__global__ void __launch_bounds__(max_chunk_threads)
    chunk_columns_logsumexp_kernel(const D* __restrict__ logits, float* __restrict__ lse, std::int64_t rows,
                                   std::int64_t v, std::int64_t first, std::int64_t n, std::int64_t stride) {
    __shared__ float scratch[64];
    for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        detail::max_sum a;
        detail::for_each_in_row(logits + r * v + first, n, [&](std::int64_t, float x) { detail::absorb(a, x); });
        a = detail::block_combine(a, scratch);
        if (threadIdx.x == 0) lse[r * stride] = a.max + logf(a.sum);
    }
}

// lse[p, k] = 0 for the chunks k outside [held_first, held_end).
__global__ void unheld_chunks_kernel(float* __restrict__ lse, std::int64_t rows, std::int64_t chunks,
                                     std::int64_t held_first, std::int64_t held_end) {
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < rows * chunks;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const std::int64_t k = i % chunks;
        if (k < held_first || k >= held_end) lse[i] = 0.0f;
    }
}

// logits may equal dlogits: no restrict on them.
template <class D>
__global__ void __launch_bounds__(max_chunk_threads)
    chunk_columns_logsumexp_grad_kernel(const D* __restrict__ dlse, const D* logits, const float* __restrict__ lse,
                                        D* dlogits, std::int64_t rows, std::int64_t v, std::int64_t first,
                                        std::int64_t n, std::int64_t stride) {
    for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float scale = to_float(dlse[r * stride]), shift = lse[r * stride];
        detail::map_row(logits + r * v + first, dlogits + r * v + first, n,
                        [=](std::int64_t, float x) { return scale * expf(x - shift); });
    }
}

template <class D>
__global__ void pick_target_kernel(const D* __restrict__ logits, const std::int32_t* __restrict__ targets,
                                   D* __restrict__ z, std::int64_t rows, std::int64_t v, std::int64_t vocab,
                                   std::int64_t row_offset, std::int64_t ignore_index) {
    for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < rows;
         r += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const std::int64_t col = target_column(targets[r], v, vocab, row_offset, ignore_index);
        if (col >= 0) z[r] = logits[r * v + col];
        else z[r] = from_float<D>(col == invalid ? detail::quiet_nan() : 0.0f);
    }
}

// One block per position writes its row: zeros with dz at the target's column.
template <class D>
__global__ void __launch_bounds__(max_chunk_threads)
    pick_target_grad_kernel(const D* __restrict__ dz, const std::int32_t* __restrict__ targets,
                            D* __restrict__ dlogits, std::int64_t rows, std::int64_t v, std::int64_t vocab,
                            std::int64_t row_offset, std::int64_t ignore_index) {
    constexpr int V = detail::vector_width<D>;
    for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const std::int64_t col = target_column(targets[r], v, vocab, row_offset, ignore_index);
        const float rest = col == invalid ? detail::quiet_nan() : 0.0f;
        const float hit = col >= 0 ? to_float(dz[r]) : rest;  // bf16 -> float -> bf16 is exact
        D* out = dlogits + r * v;
        const detail::row_split<D> split(out, v);
        if (threadIdx.x < split.head) out[threadIdx.x] = from_float<D>(threadIdx.x == col ? hit : rest);
        D* body = out + split.head;
        for (std::int64_t k = threadIdx.x; k < split.vectors; k += blockDim.x) {
            float values[V];
#pragma unroll
            for (int j = 0; j < V; ++j) values[j] = split.head + k * V + j == col ? hit : rest;
            detail::store_vector<V>(body + k * V, values);
        }
        for (std::int64_t i = split.head + split.vectors * V + threadIdx.x; i < v; i += blockDim.x)
            out[i] = from_float<D>(i == col ? hit : rest);
    }
}

// Each thread sums a fixed stride of positions in double, then the block combines them in a
// fixed order. The loss stays float whatever T (the op's float_outputs).
template <class D>
__global__ void __launch_bounds__(total_threads)
    cross_entropy_from_chunks_kernel(const float* __restrict__ lse, const D* __restrict__ z,
                                     const std::int32_t* __restrict__ targets, float* __restrict__ loss,
                                     std::int64_t rows, std::int64_t chunks, std::int64_t ignore_index,
                                     double normalizer) {
    __shared__ double scratch[32];
    double sum[1] = {0.0};
    for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
        if (targets[r] == ignore_index) continue;
        sum[0] += static_cast<double>(small_logsumexp(lse + r * chunks, chunks) - to_float(z[r]));
    }
    detail::block_sum(sum, scratch);
    if (threadIdx.x == 0) *loss = static_cast<float>(sum[0] / normalizer);
}

template <class D>
__global__ void cross_entropy_from_chunks_grad_kernel(const D* __restrict__ dloss, const float* __restrict__ lse,
                                                      const std::int32_t* __restrict__ targets, D* __restrict__ dlse,
                                                      D* __restrict__ dz, std::int64_t rows, std::int64_t chunks,
                                                      std::int64_t ignore_index, double normalizer) {
    const auto scale = static_cast<float>(static_cast<double>(to_float(*dloss)) / normalizer);
    for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < rows;
         r += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const float* x = lse + r * chunks;
        D* out = dlse + r * chunks;
        if (targets[r] == ignore_index) {
            for (std::int64_t k = 0; k < chunks; ++k) out[k] = from_float<D>(0.0f);
            dz[r] = from_float<D>(0.0f);
            continue;
        }
        // d/dlse_k of logsumexp_k lse_k is softmax_k(lse).
        const float total = small_logsumexp(x, chunks);
        for (std::int64_t k = 0; k < chunks; ++k) out[k] = from_float<D>(scale * expf(x[k] - total));
        dz[r] = from_float<D>(-scale);
    }
}

void check_sizes(const char* fn, std::int64_t rows, std::int64_t chunks, std::int64_t v) {
    if (rows < 0)
        throw usage_error(std::string(fn) + ": rows = " + std::to_string(rows) +
                          "; pass the number of positions (the product of the leading dims), 0 or more");
    if (chunks < 1)
        throw usage_error(std::string(fn) + ": chunks = " + std::to_string(chunks) +
                          "; pass the number of vocabulary chunks (the lse's last dim), 1 or more");
    if (v < 0)
        throw usage_error(std::string(fn) + ": v = " + std::to_string(v) +
                          "; pass the logits of one chunk (the logits' last dim over chunks), 0 or more");
}

void check_normalizer(const char* fn, double normalizer) {
    if (!(normalizer > 0) || !std::isfinite(normalizer))
        throw usage_error(std::string(fn) + ": normalizer = " + std::to_string(normalizer) +
                          "; pass the op's positive finite normalizer (by default the number of positions)");
}

using detail::check_pointer;

// The chunks the logits hold, [first, end), each as columns [begin, end) of the logits' own v.
struct held_chunks {
    std::int64_t first = 0, end = 0;
};

held_chunks check_ragged(const char* fn, std::int64_t rows, std::int64_t v, const std::int64_t* boundaries,
                         std::int64_t chunks, std::int64_t row_offset) {
    check_sizes(fn, rows, chunks, v);
    if (!boundaries)
        throw usage_error(std::string(fn) + ": boundaries is null; pass the chunks + 1 bounds of the chunks (host memory)");
    held_chunks h{chunks, chunks};
    for (std::int64_t k = 0; k < chunks; ++k) {
        if (boundaries[k + 1] <= boundaries[k])
            throw usage_error(std::string(fn) + ": the chunk bounds must increase strictly; bound " + std::to_string(k + 1) +
                              " is " + std::to_string(boundaries[k + 1]) + " after " + std::to_string(boundaries[k]));
        const bool held = boundaries[k] >= row_offset && boundaries[k + 1] <= row_offset + v;
        if (held && h.first == chunks) h.first = k;
        if (held) h.end = k + 1;
    }
    const std::int64_t from = h.first < chunks ? boundaries[h.first] : row_offset;
    const std::int64_t to = h.first < chunks ? boundaries[h.end] : row_offset;
    if (from != row_offset || to != row_offset + v)
        throw usage_error(std::string(fn) + ": the logits hold columns [" + std::to_string(row_offset) + ", " +
                          std::to_string(row_offset + v) + "), which are not a run of whole chunks; split the logits "
                          "at the chunk bounds");
    return h;
}

}  // namespace

template <class T>
void chunk_logsumexp(const T* logits, float* lse, std::int64_t rows, std::int64_t chunks, std::int64_t v,
                     stream_handle s) {
    constexpr const char* fn = "loom::cuda::chunk_logsumexp";
    check_sizes(fn, rows, chunks, v);
    const std::int64_t segments = rows * chunks;
    if (segments == 0) return;
    if (v > 0) check_pointer(fn, "logits", logits);
    check_pointer(fn, "lse", lse);
    using D = device_t<T>;
    chunk_logsumexp_kernel<<<detail::row_grid(segments), chunk_threads<D>(v), 0, s>>>(detail::device_ptr(logits), lse,
                                                                                     segments, v);
    LOOM_CUDA_CHECK_LAUNCH(fn);
}

template <class T>
void chunk_logsumexp_backward(const T* dlse, const T* logits, const float* lse, T* dlogits, std::int64_t rows,
                              std::int64_t chunks, std::int64_t v, stream_handle s) {
    constexpr const char* fn = "loom::cuda::chunk_logsumexp_backward";
    check_sizes(fn, rows, chunks, v);
    const std::int64_t segments = rows * chunks;
    if (segments == 0 || v == 0) return;
    check_pointer(fn, "dlse", dlse);
    check_pointer(fn, "logits", logits);
    check_pointer(fn, "lse", lse);
    check_pointer(fn, "dlogits", dlogits);
    using D = device_t<T>;
    chunk_logsumexp_grad_kernel<<<detail::row_grid(segments), chunk_threads<D>(v), 0, s>>>(
        detail::device_ptr(dlse), detail::device_ptr(logits), lse, detail::device_ptr(dlogits), segments, v);
    LOOM_CUDA_CHECK_LAUNCH(fn);
}

template <class T>
void ragged_chunk_logsumexp(const T* logits, float* lse, std::int64_t rows, std::int64_t v,
                            const std::int64_t* boundaries, std::int64_t chunks, std::int64_t row_offset,
                            stream_handle s) {
    constexpr const char* fn = "loom::cuda::ragged_chunk_logsumexp";
    const held_chunks h = check_ragged(fn, rows, v, boundaries, chunks, row_offset);
    if (rows == 0) return;
    if (v > 0) check_pointer(fn, "logits", logits);
    check_pointer(fn, "lse", lse);
    using D = device_t<T>;
    if (h.end - h.first < chunks) {
        unheld_chunks_kernel<<<detail::blocks_for(rows * chunks, position_threads), position_threads, 0, s>>>(
            lse, rows, chunks, h.first, h.end);
        LOOM_CUDA_CHECK_LAUNCH(fn);
    }
    for (std::int64_t k = h.first; k < h.end; ++k) {
        const std::int64_t first = boundaries[k] - row_offset, n = boundaries[k + 1] - boundaries[k];
        chunk_columns_logsumexp_kernel<<<detail::row_grid(rows), chunk_threads<D>(n), 0, s>>>(
            detail::device_ptr(logits), lse + k, rows, v, first, n, chunks);
        LOOM_CUDA_CHECK_LAUNCH(fn);
    }
}

template <class T>
void ragged_chunk_logsumexp_backward(const T* dlse, const T* logits, const float* lse, T* dlogits, std::int64_t rows,
                                     std::int64_t v, const std::int64_t* boundaries, std::int64_t chunks,
                                     std::int64_t row_offset, stream_handle s) {
    constexpr const char* fn = "loom::cuda::ragged_chunk_logsumexp_backward";
    const held_chunks h = check_ragged(fn, rows, v, boundaries, chunks, row_offset);
    if (rows == 0 || v == 0) return;
    check_pointer(fn, "dlse", dlse);
    check_pointer(fn, "logits", logits);
    check_pointer(fn, "lse", lse);
    check_pointer(fn, "dlogits", dlogits);
    using D = device_t<T>;
    for (std::int64_t k = h.first; k < h.end; ++k) {
        const std::int64_t first = boundaries[k] - row_offset, n = boundaries[k + 1] - boundaries[k];
        chunk_columns_logsumexp_grad_kernel<<<detail::row_grid(rows), chunk_threads<D>(n), 0, s>>>(
            detail::device_ptr(dlse) + k, detail::device_ptr(logits), lse + k, detail::device_ptr(dlogits), rows, v,
            first, n, chunks);
        LOOM_CUDA_CHECK_LAUNCH(fn);
    }
}

template <class T>
void pick_target(const T* logits, const std::int32_t* targets, T* z, std::int64_t rows, std::int64_t v,
                 std::int64_t vocab, std::int64_t row_offset, std::int64_t ignore_index, stream_handle s) {
    constexpr const char* fn = "loom::cuda::pick_target";
    check_sizes(fn, rows, 1, v);
    if (rows == 0) return;
    if (v > 0) check_pointer(fn, "logits", logits);
    check_pointer(fn, "targets", targets);
    check_pointer(fn, "z", z);
    using D = device_t<T>;
    pick_target_kernel<<<detail::blocks_for(rows, position_threads), position_threads, 0, s>>>(
        detail::device_ptr(logits), targets, detail::device_ptr(z), rows, v, vocab, row_offset, ignore_index);
    LOOM_CUDA_CHECK_LAUNCH(fn);
}

template <class T>
void pick_target_backward(const T* dz, const std::int32_t* targets, T* dlogits, std::int64_t rows, std::int64_t v,
                          std::int64_t vocab, std::int64_t row_offset, std::int64_t ignore_index, stream_handle s) {
    constexpr const char* fn = "loom::cuda::pick_target_backward";
    check_sizes(fn, rows, 1, v);
    if (rows == 0 || v == 0) return;
    check_pointer(fn, "dz", dz);
    check_pointer(fn, "targets", targets);
    check_pointer(fn, "dlogits", dlogits);
    using D = device_t<T>;
    pick_target_grad_kernel<<<detail::row_grid(rows), chunk_threads<D>(v), 0, s>>>(
        detail::device_ptr(dz), targets, detail::device_ptr(dlogits), rows, v, vocab, row_offset, ignore_index);
    LOOM_CUDA_CHECK_LAUNCH(fn);
}

template <class T>
void cross_entropy_from_chunks(const float* lse, const T* z, const std::int32_t* targets, float* loss,
                               std::int64_t rows, std::int64_t chunks, std::int64_t ignore_index, double normalizer,
                               stream_handle s) {
    constexpr const char* fn = "loom::cuda::cross_entropy_from_chunks";
    check_sizes(fn, rows, chunks, 0);
    check_normalizer(fn, normalizer);
    check_pointer(fn, "loss", loss);
    if (rows > 0) {
        check_pointer(fn, "lse", lse);
        check_pointer(fn, "z", z);
        check_pointer(fn, "targets", targets);
    }
    cross_entropy_from_chunks_kernel<<<1, total_threads, 0, s>>>(lse, detail::device_ptr(z), targets, loss, rows,
                                                                 chunks, ignore_index, normalizer);
    LOOM_CUDA_CHECK_LAUNCH(fn);
}

template <class T>
void cross_entropy_from_chunks_backward(const T* dloss, const float* lse, const std::int32_t* targets, T* dlse, T* dz,
                                        std::int64_t rows, std::int64_t chunks, std::int64_t ignore_index,
                                        double normalizer, stream_handle s) {
    constexpr const char* fn = "loom::cuda::cross_entropy_from_chunks_backward";
    check_sizes(fn, rows, chunks, 0);
    check_normalizer(fn, normalizer);
    if (rows == 0) return;
    check_pointer(fn, "dloss", dloss);
    check_pointer(fn, "lse", lse);
    check_pointer(fn, "targets", targets);
    check_pointer(fn, "dlse", dlse);
    check_pointer(fn, "dz", dz);
    cross_entropy_from_chunks_grad_kernel<<<detail::blocks_for(rows, position_threads), position_threads, 0, s>>>(
        detail::device_ptr(dloss), lse, targets, detail::device_ptr(dlse), detail::device_ptr(dz), rows, chunks,
        ignore_index, normalizer);
    LOOM_CUDA_CHECK_LAUNCH(fn);
}

#define LOOM_INSTANTIATE(T)                                                                                            \
    template void chunk_logsumexp<T>(const T*, float*, std::int64_t, std::int64_t, std::int64_t, stream_handle);      \
    template void chunk_logsumexp_backward<T>(const T*, const T*, const float*, T*, std::int64_t, std::int64_t,      \
                                              std::int64_t, stream_handle);                                         \
    template void ragged_chunk_logsumexp<T>(const T*, float*, std::int64_t, std::int64_t, const std::int64_t*,        \
                                            std::int64_t, std::int64_t, stream_handle);                             \
    template void ragged_chunk_logsumexp_backward<T>(const T*, const T*, const float*, T*, std::int64_t, std::int64_t, \
                                                     const std::int64_t*, std::int64_t, std::int64_t, stream_handle); \
    template void pick_target<T>(const T*, const std::int32_t*, T*, std::int64_t, std::int64_t, std::int64_t,         \
                                 std::int64_t, std::int64_t, stream_handle);                                        \
    template void pick_target_backward<T>(const T*, const std::int32_t*, T*, std::int64_t, std::int64_t,              \
                                          std::int64_t, std::int64_t, std::int64_t, stream_handle);                 \
    template void cross_entropy_from_chunks<T>(const float*, const T*, const std::int32_t*, float*, std::int64_t,    \
                                               std::int64_t, std::int64_t, double, stream_handle);                  \
    template void cross_entropy_from_chunks_backward<T>(const T*, const float*, const std::int32_t*, T*, T*,          \
                                                        std::int64_t, std::int64_t, std::int64_t, double, stream_handle);
LOOM_INSTANTIATE(float)
LOOM_INSTANTIATE(bfloat16)
#undef LOOM_INSTANTIATE

}  // namespace loom::cuda
