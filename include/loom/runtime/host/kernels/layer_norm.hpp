#pragma once
// Host kernels of layer_norm and layer_norm_grad. Rows are independent for y and dx; dgamma
// and dbeta sum over rows per fixed block of rows (rowwise.hpp), then over blocks in order,
// so every result is the same for any thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include <loom/ops/layer_norm.hpp>
#include <loom/runtime/host/cpu_isa.hpp>
#include <loom/runtime/host/kernel_call.hpp>
#include <loom/runtime/host/kernels/elementwise.hpp>
#include <loom/runtime/host/kernels/rowwise.hpp>

namespace loom::host {

namespace detail {

template <class T>
struct row_moments {
    T mean;
    T rstd;
};

// Two-pass mean and biased variance of one row.
template <class T>
[[gnu::always_inline]] inline row_moments<T> layer_norm_moments(const T* __restrict x, std::int64_t h, T eps) {
    const T mean = lane_sum<T>(h, [=](std::int64_t i) { return x[i]; }) / static_cast<T>(h);
    const T var = lane_sum<T>(h, [=](std::int64_t i) {
                      const T d = x[i] - mean;
                      return d * d;
                  }) /
                  static_cast<T>(h);
    return {mean, T(1) / std::sqrt(var + eps)};
}

template <class T>
[[gnu::always_inline]] inline void layer_norm_row(const T* __restrict x, const T* __restrict gamma, const T* __restrict beta, T* __restrict y,
                    std::int64_t h, T eps) {
    const auto [mean, rstd] = layer_norm_moments(x, h, eps);
    for_lanes(h, [=](std::int64_t i) { y[i] = (x[i] - mean) * rstd * gamma[i] + beta[i]; });
}

// With xhat = (x - mean) rstd and g = dy gamma:
//   dx = rstd (g - mean(g) - xhat mean(g xhat)),  dgamma += dy xhat,  dbeta += dy.
template <class T>
[[gnu::always_inline]] inline void layer_norm_grad_row(const T* __restrict dy, const T* __restrict x, const T* __restrict gamma, T* __restrict dx,
                         T* __restrict dgamma, T* __restrict dbeta, std::int64_t h, T eps) {
    const auto [mean, rstd] = layer_norm_moments(x, h, eps);
    const T mean_g = lane_sum<T>(h, [=](std::int64_t i) { return dy[i] * gamma[i]; }) / static_cast<T>(h);
    const T mean_gx = lane_sum<T>(h, [=](std::int64_t i) { return dy[i] * gamma[i] * ((x[i] - mean) * rstd); }) /
                      static_cast<T>(h);
    for_lanes(h, [=](std::int64_t i) {
        const T xhat = (x[i] - mean) * rstd;
        dx[i] = rstd * (dy[i] * gamma[i] - mean_g - xhat * mean_gx);
        dgamma[i] += dy[i] * xhat;
        dbeta[i] += dy[i];
    });
}

// The two rows compiled for wider vectors (the baseline build targets SSE2). Each sum keeps
// its eight lanes and their order, and fp-contract=off keeps g++ from fusing a * b + c into
// an FMA, so the values are bit for bit the baseline's.
template <class T>
[[gnu::target("avx2"), gnu::optimize("fp-contract=off")]] void layer_norm_row_avx2(
    const T* __restrict x, const T* __restrict gamma, const T* __restrict beta, T* __restrict y, std::int64_t h, T eps) {
    layer_norm_row(x, gamma, beta, y, h, eps);
}

template <class T>
[[gnu::target("avx512f"), gnu::optimize("fp-contract=off")]] void layer_norm_row_avx512(
    const T* __restrict x, const T* __restrict gamma, const T* __restrict beta, T* __restrict y, std::int64_t h, T eps) {
    layer_norm_row(x, gamma, beta, y, h, eps);
}

template <class T>
[[gnu::target("avx2"), gnu::optimize("fp-contract=off")]] void layer_norm_grad_row_avx2(
    const T* __restrict dy, const T* __restrict x, const T* __restrict gamma, T* __restrict dx, T* __restrict dgamma,
    T* __restrict dbeta, std::int64_t h, T eps) {
    layer_norm_grad_row(dy, x, gamma, dx, dgamma, dbeta, h, eps);
}

template <class T>
[[gnu::target("avx512f"), gnu::optimize("fp-contract=off")]] void layer_norm_grad_row_avx512(
    const T* __restrict dy, const T* __restrict x, const T* __restrict gamma, T* __restrict dx, T* __restrict dgamma,
    T* __restrict dbeta, std::int64_t h, T eps) {
    layer_norm_grad_row(dy, x, gamma, dx, dgamma, dbeta, h, eps);
}

// Both built for `isa` (one this CPU runs).
template <class T>
void layer_norm_row_on(cpu_isa isa, const T* x, const T* gamma, const T* beta, T* y, std::int64_t h, T eps) {
    switch (isa) {
        case cpu_isa::avx512f: return layer_norm_row_avx512(x, gamma, beta, y, h, eps);
        case cpu_isa::avx2_fma: return layer_norm_row_avx2(x, gamma, beta, y, h, eps);
        case cpu_isa::portable: return layer_norm_row(x, gamma, beta, y, h, eps);
    }
}

template <class T>
void layer_norm_grad_row_on(cpu_isa isa, const T* dy, const T* x, const T* gamma, T* dx, T* dgamma, T* dbeta,
                            std::int64_t h, T eps) {
    switch (isa) {
        case cpu_isa::avx512f: return layer_norm_grad_row_avx512(dy, x, gamma, dx, dgamma, dbeta, h, eps);
        case cpu_isa::avx2_fma: return layer_norm_grad_row_avx2(dy, x, gamma, dx, dgamma, dbeta, h, eps);
        case cpu_isa::portable: return layer_norm_grad_row(dy, x, gamma, dx, dgamma, dbeta, h, eps);
    }
}

}  // namespace detail

template <>
struct host_kernel<ops::LayerNorm> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t h = c.extent("h");
        const std::int64_t rows = c.input_numel(0) / h;
        const T eps = static_cast<T>(c.attrs().template get<double>("eps"));
        const T *x = c.input(0), *gamma = c.input(1), *beta = c.input(2);
        T* y = c.output(0);
        const cpu_isa isa = best_cpu_isa();
        for_each_row(rows, h,
                     [&](std::int64_t r) { detail::layer_norm_row_on(isa, x + r * h, gamma, beta, y + r * h, h, eps); });
    }
};

template <>
struct host_kernel<ops::LayerNormGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t h = c.extent("h");
        const std::int64_t rows = c.input_numel(1) / h;
        const T eps = static_cast<T>(c.attrs().template get<double>("eps"));
        const T *dy = c.input(0), *x = c.input(1), *gamma = c.input(2);
        T *dx = c.output(0), *dgamma = c.output(1), *dbeta = c.output(2);
        const std::int64_t blocks = detail::row_blocks(rows);
        // Block b's partial dgamma at partial[b * 2h], its partial dbeta right after.
        T* partial = detail::scratch<T>(static_cast<std::size_t>(blocks * 2 * h));
        const std::int64_t grain = std::max<std::int64_t>(1, elementwise_grain / (detail::block_rows * h));
        const cpu_isa isa = best_cpu_isa();
        parallel_for(0, blocks, grain, [&](std::int64_t lo, std::int64_t hi) {
            for (std::int64_t b = lo; b < hi; ++b) {
                T* pg = partial + b * 2 * h;
                T* pb = pg + h;
                std::fill(pg, pg + 2 * h, T(0));
                const std::int64_t end = std::min(rows, (b + 1) * detail::block_rows);
                for (std::int64_t r = b * detail::block_rows; r < end; ++r)
                    detail::layer_norm_grad_row_on(isa, dy + r * h, x + r * h, gamma, dx + r * h, pg, pb, h, eps);
            }
        });
        detail::sum_blocks(partial, blocks, 2 * h, h, dgamma);
        detail::sum_blocks(partial + h, blocks, 2 * h, h, dbeta);
    }
};

}  // namespace loom::host
