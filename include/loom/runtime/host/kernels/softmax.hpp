#pragma once
// Host kernels of softmax and softmax_grad over the last dim, one row per task. As PyTorch:
//   y = exp(x - max) * (1 / sum exp(x - max)),   dx = (dy - sum(dy * y)) * y.
// Row sums run in simd_block lanes combined in a fixed order, so a row's result never depends
// on the thread count. double uses std::exp, float the vectorized exp_nonpositive.
#include <cmath>

#include <loom/ops/softmax.hpp>
#include <loom/runtime/host/kernel_call.hpp>
#include <loom/runtime/host/kernels/elementwise.hpp>
#include <loom/runtime/host/kernels/vector_math.hpp>

namespace loom::host {

namespace detail {

inline float softmax_exp_shifted(float x_minus_max) { return exp_nonpositive(x_minus_max); }
inline double softmax_exp_shifted(double x_minus_max) { return std::exp(x_minus_max); }

template <class T>
T softmax_row_max(const T* __restrict x, std::int64_t n) {
    T m = x[0];
    std::int64_t i = 0;
    if (n >= simd_block) {
        T lane[simd_block];
        for (std::int64_t j = 0; j < simd_block; ++j) lane[j] = x[j];
        for (i = simd_block; i + simd_block <= n; i += simd_block)
            for (std::int64_t j = 0; j < simd_block; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
        for (std::int64_t j = 0; j < simd_block; ++j) m = lane[j] > m ? lane[j] : m;
    }
    for (; i < n; ++i) m = x[i] > m ? x[i] : m;
    return m;
}

// y = exp(x - m); returns sum(y).
template <class T>
T softmax_exp_row(const T* __restrict x, T m, T* __restrict y, std::int64_t n) {
    T lane[simd_block] = {};
    std::int64_t i = 0;
    for (; i + simd_block <= n; i += simd_block)
        for (std::int64_t j = 0; j < simd_block; ++j) {
            const T e = softmax_exp_shifted(x[i + j] - m);
            y[i + j] = e;
            lane[j] += e;
        }
    T sum = 0;
    for (std::int64_t j = 0; j < simd_block; ++j) sum += lane[j];
    for (; i < n; ++i) {
        y[i] = softmax_exp_shifted(x[i] - m);
        sum += y[i];
    }
    return sum;
}

template <class T>
T softmax_dot_row(const T* __restrict a, const T* __restrict b, std::int64_t n) {
    T lane[simd_block] = {};
    std::int64_t i = 0;
    for (; i + simd_block <= n; i += simd_block)
        for (std::int64_t j = 0; j < simd_block; ++j) lane[j] += a[i + j] * b[i + j];
    T sum = 0;
    for (std::int64_t j = 0; j < simd_block; ++j) sum += lane[j];
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

template <class T>
void softmax_scale_row(T* __restrict y, T factor, std::int64_t n) {
    std::int64_t i = 0;
    for (; i + simd_block <= n; i += simd_block)
        for (std::int64_t j = 0; j < simd_block; ++j) y[i + j] *= factor;
    for (; i < n; ++i) y[i] *= factor;
}

// dx = (dy - dot) * y
template <class T>
void softmax_grad_row(const T* __restrict dy, const T* __restrict y, T dot, T* __restrict dx, std::int64_t n) {
    std::int64_t i = 0;
    for (; i + simd_block <= n; i += simd_block)
        for (std::int64_t j = 0; j < simd_block; ++j) dx[i + j] = (dy[i + j] - dot) * y[i + j];
    for (; i < n; ++i) dx[i] = (dy[i] - dot) * y[i];
}

}  // namespace detail

template <>
struct host_kernel<ops::Softmax> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t n = c.extent("n");
        const std::int64_t rows = c.leading_numel(0);
        const T* x = c.input(0);
        T* y = c.output(0);
        for_each_row(rows, n, [&](std::int64_t r) {
            const T* xr = x + r * n;
            T* yr = y + r * n;
            const T sum = detail::softmax_exp_row(xr, detail::softmax_row_max(xr, n), yr, n);
            detail::softmax_scale_row(yr, T(1) / sum, n);
        });
    }
};

template <>
struct host_kernel<ops::SoftmaxGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t n = c.extent("n");
        const std::int64_t rows = c.leading_numel(0);
        const T* dy = c.input(0);
        const T* y = c.input(1);
        T* dx = c.output(0);
        for_each_row(rows, n, [&](std::int64_t r) {
            const T* dyr = dy + r * n;
            const T* yr = y + r * n;
            detail::softmax_grad_row(dyr, yr, detail::softmax_dot_row(dyr, yr, n), dx + r * n, n);
        });
    }
};

}  // namespace loom::host
