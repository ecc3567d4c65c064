#pragma once
#include <loom/ops/linear.hpp>
#include <loom/runtime/host/gemm.hpp>
#include <loom/runtime/host/kernel_call.hpp>

namespace loom::host {

namespace detail {
// x [m, k] · w[n, k]^T -> y [m, n]
template <class T>
void linear_forward(const kernel_call<T>& c, const T* bias) {
    const std::int64_t k = c.extent("k"), n = c.extent("n");
    const std::int64_t m = c.input_numel(0) / k;
    T* y = c.output(0);
    if (bias) {
        host::gemm_bias<T>(transpose::no, transpose::yes, m, n, k, T(1), c.input(0), k, c.input(1), k, bias, y, n);
    } else {
        host::gemm<T>(transpose::no, transpose::yes, m, n, k, T(1), c.input(0), k, c.input(1), k, T(0), y, n);
    }
}
}  // namespace detail

template <>
struct host_kernel<ops::Linear> {
    template <class T>
    static void run(const kernel_call<T>& c) { detail::linear_forward<T>(c, nullptr); }
};

template <>
struct host_kernel<ops::LinearBias> {
    template <class T>
    // Attribute bias = 0: a piece of a row-parallel split that leaves the bias to piece 0.
    static void run(const kernel_call<T>& c) {
        detail::linear_forward<T>(c, c.attrs().template get_or<std::int64_t>("bias", 1) != 0 ? c.input(2) : nullptr);
    }
};

// dx [m, k] = dy [m, n] · w [n, k]
template <>
struct host_kernel<ops::LinearGradInput> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t k = c.extent("k"), n = c.extent("n");
        const std::int64_t m = c.input_numel(0) / n;
        gemm<T>(transpose::no, transpose::no, m, k, n, T(1), c.input(0), n, c.input(1), k, T(0), c.output(0), k);
    }
};

// dW [n, k] = dy [m, n]^T · x [m, k]
template <>
struct host_kernel<ops::LinearGradWeight> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t k = c.extent("k"), n = c.extent("n");
        const std::int64_t m = c.input_numel(0) / n;
        gemm<T>(transpose::yes, transpose::no, n, k, m, T(1), c.input(0), n, c.input(1), k, T(0), c.output(0), k);
    }
};

}  // namespace loom::host
