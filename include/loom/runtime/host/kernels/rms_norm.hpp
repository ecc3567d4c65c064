#pragma once
// Host kernels of rms_norm and rms_norm_grad. Rows are independent for y and dx; dgamma sums
// over rows per fixed block of rows (rowwise.hpp), then over blocks in order, so every
// result is the same for any thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include <loom/ops/rms_norm.hpp>
#include <loom/runtime/host/kernel_call.hpp>
#include <loom/runtime/host/kernels/elementwise.hpp>
#include <loom/runtime/host/kernels/rowwise.hpp>

namespace loom::host {

namespace detail {

// 1 / sqrt(mean(x^2) + eps) of one row.
template <class T>
[[gnu::always_inline]] inline T rms_norm_rstd(const T* __restrict x, std::int64_t h, T eps) {
    const T mean_sq = lane_sum<T>(h, [=](std::int64_t i) { return x[i] * x[i]; }) / static_cast<T>(h);
    return T(1) / std::sqrt(mean_sq + eps);
}

template <class T>
void rms_norm_row(const T* __restrict x, const T* __restrict gamma, T* __restrict y, std::int64_t h, T eps) {
    const T rstd = rms_norm_rstd(x, h, eps);
    for_lanes(h, [=](std::int64_t i) { y[i] = x[i] * rstd * gamma[i]; });
}

// With g = dy gamma:  dx = rstd (g - x rstd^2 mean(g x)),  dgamma += dy x rstd.
template <class T>
void rms_norm_grad_row(const T* __restrict dy, const T* __restrict x, const T* __restrict gamma, T* __restrict dx,
                       T* __restrict dgamma, std::int64_t h, T eps) {
    const T rstd = rms_norm_rstd(x, h, eps);
    const T mean_gx = lane_sum<T>(h, [=](std::int64_t i) { return dy[i] * gamma[i] * x[i]; }) / static_cast<T>(h);
    const T c = rstd * rstd * mean_gx;
    for_lanes(h, [=](std::int64_t i) {
        dx[i] = rstd * (dy[i] * gamma[i] - x[i] * c);
        dgamma[i] += dy[i] * (x[i] * rstd);
    });
}

}  // namespace detail

template <>
struct host_kernel<ops::RmsNorm> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t h = c.extent("h");
        const std::int64_t rows = c.input_numel(0) / h;
        const T eps = static_cast<T>(c.attrs().template get<double>("eps"));
        const T *x = c.input(0), *gamma = c.input(1);
        T* y = c.output(0);
        for_each_row(rows, h, [&](std::int64_t r) { detail::rms_norm_row(x + r * h, gamma, y + r * h, h, eps); });
    }
};

template <>
struct host_kernel<ops::RmsNormGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t h = c.extent("h");
        const std::int64_t rows = c.input_numel(1) / h;
        const T eps = static_cast<T>(c.attrs().template get<double>("eps"));
        const T *dy = c.input(0), *x = c.input(1), *gamma = c.input(2);
        T *dx = c.output(0), *dgamma = c.output(1);
        const std::int64_t blocks = detail::row_blocks(rows);
        // Block b's partial dgamma at partial[b * h].
        T* partial = detail::scratch<T>(static_cast<std::size_t>(blocks * h));
        const std::int64_t grain = std::max<std::int64_t>(1, elementwise_grain / (detail::block_rows * h));
        parallel_for(0, blocks, grain, [&](std::int64_t lo, std::int64_t hi) {
            for (std::int64_t b = lo; b < hi; ++b) {
                T* pg = partial + b * h;
                std::fill(pg, pg + h, T(0));
                const std::int64_t end = std::min(rows, (b + 1) * detail::block_rows);
                for (std::int64_t r = b * detail::block_rows; r < end; ++r)
                    detail::rms_norm_grad_row(dy + r * h, x + r * h, gamma, dx + r * h, pg, h, eps);
            }
        });
        detail::sum_blocks(partial, blocks, h, h, dgamma);
    }
};

}  // namespace loom::host
