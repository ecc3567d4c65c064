#pragma once
// Host kernels of cross_entropy and cross_entropy_grad. Rows are independent; each row's
// log-sum-exp is taken around the row max, so no exp overflows (and lane_exp, whose float
// version vectorises, only sees x - max <= 0). The loss sums rows per fixed block of rows
// (rowwise.hpp), in double, then the blocks in order: the same for any thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include <loom/core/error.hpp>
#include <loom/ops/cross_entropy.hpp>
#include <loom/runtime/host/cpu_isa.hpp>
#include <loom/runtime/host/kernel_call.hpp>
#include <loom/runtime/host/kernels/elementwise.hpp>
#include <loom/runtime/host/kernels/rowwise.hpp>

namespace loom::host {

namespace detail {

// Throws usage_error for the first target outside [0, v) that is not ignore_index.
template <class T>
void check_targets(const kernel_call<T>& c, std::size_t which, std::int64_t v, std::int64_t ignore_index) {
    const std::int32_t* targets = c.index_input(which);
    const std::int64_t n = c.input_numel(which);
    for (std::int64_t p = 0; p < n; ++p) {
        if ((targets[p] >= 0 && targets[p] < v) || targets[p] == ignore_index) continue;
        throw usage_error(std::string(c.n.op->name) + " '" + c.n.name + "': target " + std::to_string(targets[p]) +
                          " at " + describe_position(p, c.input_shape(which), c.g.tensor(c.n.inputs[which]).name) +
                          " is outside [0, " + std::to_string(v) + ") (v = " + std::to_string(v) +
                          " classes) and is not ignore_index " + std::to_string(ignore_index) +
                          "; every target must be a class of the logits or ignore_index");
    }
}

// max + log(sum(exp(x - max))) of one row of v >= 1 logits.
template <class T>
[[gnu::always_inline]] inline T log_sum_exp(const T* __restrict x, std::int64_t v) {
    const T m = lane_max(x, v);
    const T s = lane_sum<T>(v, [=](std::int64_t i) { return lane_exp(x[i] - m); });
    return m + std::log(s);
}

// dlogits = scale * (softmax(x) - onehot(target)) for one row.
template <class T>
[[gnu::always_inline]] inline void cross_entropy_grad_row(const T* __restrict x, T* __restrict out, std::int64_t v,
                                                          std::int32_t target, T scale) {
    const T m = lane_max(x, v);
    const T sum = lane_sum<T>(v, [=](std::int64_t i) { return out[i] = lane_exp(x[i] - m); });
    const T k = scale / sum;
    for_lanes(v, [=](std::int64_t i) { out[i] *= k; });
    out[target] -= scale;
}

// The same two, compiled for wider vectors (the baseline build targets SSE2, whose 4-float
// vectors cover half of a row block): GPT-2's 50304-wide rows are 3% of its step. The
// blocks, their order and every operation stay the same (fp-contract=off keeps g++ from
// fusing a * b + c into an FMA), so the values are bit for bit the baseline's.
template <class T>
[[gnu::target("avx2"), gnu::optimize("fp-contract=off")]] T log_sum_exp_avx2(const T* __restrict x, std::int64_t v) {
    return log_sum_exp(x, v);
}

template <class T>
[[gnu::target("avx2"), gnu::optimize("fp-contract=off")]] void cross_entropy_grad_row_avx2(
    const T* __restrict x, T* __restrict out, std::int64_t v, std::int32_t target, T scale) {
    cross_entropy_grad_row(x, out, v, target, scale);
}

template <class T>
[[gnu::target("avx512f"), gnu::optimize("fp-contract=off")]] T log_sum_exp_avx512(const T* __restrict x, std::int64_t v) {
    return log_sum_exp(x, v);
}

template <class T>
[[gnu::target("avx512f"), gnu::optimize("fp-contract=off")]] void cross_entropy_grad_row_avx512(
    const T* __restrict x, T* __restrict out, std::int64_t v, std::int32_t target, T scale) {
    cross_entropy_grad_row(x, out, v, target, scale);
}

// Both built for `isa` (one this CPU runs).
template <class T>
T log_sum_exp_on(cpu_isa isa, const T* x, std::int64_t v) {
    switch (isa) {
        case cpu_isa::avx512f: return log_sum_exp_avx512(x, v);
        case cpu_isa::avx2_fma: return log_sum_exp_avx2(x, v);
        case cpu_isa::portable: break;
    }
    return log_sum_exp(x, v);
}

template <class T>
void cross_entropy_grad_row_on(cpu_isa isa, const T* x, T* out, std::int64_t v, std::int32_t target, T scale) {
    switch (isa) {
        case cpu_isa::avx512f: return cross_entropy_grad_row_avx512(x, out, v, target, scale);
        case cpu_isa::avx2_fma: return cross_entropy_grad_row_avx2(x, out, v, target, scale);
        case cpu_isa::portable: return cross_entropy_grad_row(x, out, v, target, scale);
    }
}

}  // namespace detail

template <>
struct host_kernel<ops::CrossEntropy> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t v = c.extent("v");
        const std::int64_t rows = c.input_numel(1);
        const auto ignore = c.attrs().template get<std::int64_t>("ignore_index");
        const double normalizer = c.attrs().template get<double>("normalizer");
        detail::check_targets(c, 1, v, ignore);
        const T* logits = c.input(0);
        const std::int32_t* targets = c.index_input(1);
        const cpu_isa isa = best_cpu_isa();
        const double total = detail::sum_over_rows(rows, v, [&](std::int64_t r) {
            if (targets[r] == ignore) return 0.0;
            const T* x = logits + r * v;
            const T lse = detail::log_sum_exp_on(isa, x, v);
            return static_cast<double>(lse - x[targets[r]]);
        });
        *c.output(0) = static_cast<T>(total / normalizer);
    }
};

template <>
struct host_kernel<ops::CrossEntropyGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t v = c.extent("v");
        const std::int64_t rows = c.input_numel(2);
        const auto ignore = c.attrs().template get<std::int64_t>("ignore_index");
        const T scale = static_cast<T>(static_cast<double>(*c.input(0)) / c.attrs().template get<double>("normalizer"));
        detail::check_targets(c, 2, v, ignore);
        const T* logits = c.input(1);
        const std::int32_t* targets = c.index_input(2);
        T* dlogits = c.output(0);
        const cpu_isa isa = best_cpu_isa();
        for_each_row(rows, v, [&](std::int64_t r) {
            T* out = dlogits + r * v;
            if (targets[r] == ignore)
                std::fill(out, out + v, T(0));
            else
                detail::cross_entropy_grad_row_on(isa, logits + r * v, out, v, targets[r], scale);
        });
    }
};

}  // namespace loom::host
