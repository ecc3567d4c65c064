// Cross-entropy over the vocabulary: one block per row. The forward takes each row's
// log-sum-exp in one pass (an online max and sum, rowwise.cuh), then one block sums the
// rows' terms in double in a fixed order. The backward recomputes the softmax (or takes the
// forward's log-sum-exp) and writes the gradient over the same elements it reads, so it may
// run in place over the logits.
#include <loom/runtime/cuda/cross_entropy.hpp>

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

constexpr unsigned row_threads = 512;
constexpr unsigned total_threads = 1024;

__device__ __forceinline__ bool is_class(std::int32_t target, std::int64_t vocab) {
    return target >= 0 && target < vocab;
}

// One pass over a row: its log-sum-exp, max + log(sum exp(x - max)), the same in every thread.
template <class D>
__device__ __forceinline__ detail::max_sum row_max_sum(const D* row, std::int64_t vocab, float* scratch) {
    detail::max_sum a;
    detail::for_each_in_row(row, vocab, [&](std::int64_t, float x) { detail::absorb(a, x); });
    return detail::block_combine(a, scratch);
}

template <class D>
__global__ void __launch_bounds__(row_threads)
    cross_entropy_rows(const D* __restrict__ logits, const std::int32_t* __restrict__ targets,
                       float* __restrict__ row_loss, float* __restrict__ logsumexp, std::int64_t rows,
                       std::int64_t vocab, std::int64_t ignore_index, int* __restrict__ invalid_target) {
    __shared__ float scratch[64];
    for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const D* row = logits + r * vocab;
        const detail::max_sum a = row_max_sum(row, vocab, scratch);
        if (threadIdx.x != 0) continue;
        const float lse = a.max + logf(a.sum);
        const std::int32_t t = targets[r];
        float loss = 0.0f;
        if (t != ignore_index) {
            if (is_class(t, vocab)) {
                loss = lse - to_float(row[t]);
            } else {
                loss = detail::quiet_nan();
                if (invalid_target) atomicExch(invalid_target, 1);
            }
        }
        row_loss[r] = loss;
        if (logsumexp) logsumexp[r] = lse;
    }
}

// loss = (sum of row_loss in double) / normalizer: each thread sums a fixed stride of rows,
// then the block combines them in a fixed order.
// The loss stays float whatever T (the op's float_outputs): a bf16 loss would keep 3 digits.
__global__ void __launch_bounds__(total_threads)
    cross_entropy_total(const float* __restrict__ row_loss, std::int64_t rows, double normalizer, float* __restrict__ loss) {
    __shared__ double scratch[32];
    double sum[1] = {0.0};
    for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x) sum[0] += static_cast<double>(row_loss[r]);
    detail::block_sum(sum, scratch);
    if (threadIdx.x == 0) *loss = static_cast<float>(sum[0] / normalizer);
}

// dlogits = e * (scale / sum) - scale at the target, e = exp(x - max) (the host's order), or
// exp(x - lse) * scale from the forward's log-sum-exp. logits may equal dlogits: no restrict.
template <class D>
__global__ void __launch_bounds__(row_threads)
    cross_entropy_grad_rows(const D* __restrict__ dloss, const D* logits, const std::int32_t* __restrict__ targets,
                            const float* __restrict__ logsumexp, D* dlogits, std::int64_t rows, std::int64_t vocab,
                            std::int64_t ignore_index, double normalizer, int* __restrict__ invalid_target) {
    __shared__ float scratch[64];
    const auto scale = static_cast<float>(static_cast<double>(to_float(*dloss)) / normalizer);
    for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const D* row = logits + r * vocab;
        D* out = dlogits + r * vocab;
        const std::int32_t t = targets[r];  // the same for the whole block: every branch below is uniform
        if (t == ignore_index) {
            detail::map_row(row, out, vocab, [](std::int64_t, float) { return 0.0f; });
            continue;
        }
        if (!is_class(t, vocab)) {
            if (invalid_target && threadIdx.x == 0) atomicExch(invalid_target, 1);
            detail::map_row(row, out, vocab, [](std::int64_t, float) { return detail::quiet_nan(); });
            continue;
        }
        float shift, factor;
        if (logsumexp) {
            shift = logsumexp[r];
            factor = scale;
        } else {
            const detail::max_sum a = row_max_sum(row, vocab, scratch);  // all reads of the row end here
            shift = a.max;
            factor = scale / a.sum;
        }
        detail::map_row(row, out, vocab, [=](std::int64_t i, float x) {
            const float g = expf(x - shift) * factor;
            return i == t ? g - scale : g;
        });
    }
}

void check_args(const char* fn, std::int64_t rows, std::int64_t vocab, double normalizer) {
    if (rows < 0)
        throw usage_error(std::string(fn) + ": rows = " + std::to_string(rows) +
                          "; pass the number of positions (the product of the targets' dims), 0 or more");
    if (vocab < 1)
        throw usage_error(std::string(fn) + ": vocab = " + std::to_string(vocab) +
                          "; pass the number of classes (the logits' last dim), 1 or more");
    if (!(normalizer > 0) || !std::isfinite(normalizer))
        throw usage_error(std::string(fn) + ": normalizer = " + std::to_string(normalizer) +
                          "; pass the op's positive finite normalizer (by default the number of positions)");
}

using detail::check_pointer;

}  // namespace

template <class T>
void cross_entropy_forward(const T* logits, const std::int32_t* targets, float* loss, float* row_loss, float* logsumexp,
                           std::int64_t rows, std::int64_t vocab, std::int64_t ignore_index, double normalizer,
                           int* invalid_target, stream_handle s) {
    constexpr const char* fn = "loom::cuda::cross_entropy_forward";
    check_args(fn, rows, vocab, normalizer);
    check_pointer(fn, "loss", loss);
    using D = device_t<T>;
    if (rows > 0) {
        check_pointer(fn, "logits", logits);
        check_pointer(fn, "targets", targets);
        check_pointer(fn, "row_loss", row_loss);
        cross_entropy_rows<<<detail::row_grid(rows), row_threads, 0, s>>>(
            detail::device_ptr(logits), targets, row_loss, logsumexp, rows, vocab, ignore_index, invalid_target);
        LOOM_CUDA_CHECK_LAUNCH(fn);
    }
    cross_entropy_total<<<1, total_threads, 0, s>>>(row_loss, rows, normalizer, loss);
    LOOM_CUDA_CHECK_LAUNCH(fn);
}

template <class T>
void cross_entropy_backward(const T* dloss, const T* logits, const std::int32_t* targets, const float* logsumexp,
                            T* dlogits, std::int64_t rows, std::int64_t vocab, std::int64_t ignore_index,
                            double normalizer, int* invalid_target, stream_handle s) {
    constexpr const char* fn = "loom::cuda::cross_entropy_backward";
    check_args(fn, rows, vocab, normalizer);
    if (rows == 0) return;
    check_pointer(fn, "dloss", dloss);
    check_pointer(fn, "logits", logits);
    check_pointer(fn, "targets", targets);
    check_pointer(fn, "dlogits", dlogits);
    cross_entropy_grad_rows<<<detail::row_grid(rows), row_threads, 0, s>>>(
        detail::device_ptr(dloss), detail::device_ptr(logits), targets, logsumexp, detail::device_ptr(dlogits), rows,
        vocab, ignore_index, normalizer, invalid_target);
    LOOM_CUDA_CHECK_LAUNCH(fn);
}

#define LOOM_INSTANTIATE(T)                                                                                     \
    template void cross_entropy_forward<T>(const T*, const std::int32_t*, float*, float*, float*, std::int64_t,    \
                                           std::int64_t, std::int64_t, double, int*, stream_handle);           \
    template void cross_entropy_backward<T>(const T*, const T*, const std::int32_t*, const float*, T*,         \
                                            std::int64_t, std::int64_t, std::int64_t, double, int*, stream_handle);
LOOM_INSTANTIATE(float)
LOOM_INSTANTIATE(bfloat16)
#undef LOOM_INSTANTIATE

}  // namespace loom::cuda
