#pragma once
// Host kernels of silu and silu_grad. The sigmoid and 1 - sigmoid come from e = exp(-|x|) <= 1
// (see sigmoid_float), so no exp overflows and neither tail loses digits. double uses
// std::exp (PyTorch's x / (1 + exp(-x)) to a few ulp); float the vectorized exp_nonpositive.
#include <cmath>

#include <loom/ops/silu.hpp>
#include <loom/runtime/host/kernel_call.hpp>
#include <loom/runtime/host/kernels/vector_math.hpp>

namespace loom::host {

namespace detail {

inline float silu_value(float x) { return x * sigmoid_float(x).s; }

// d/dx x s(x) = s (1 + x (1 - s))
inline float silu_derivative(float x) {
    const sigmoid_parts g = sigmoid_float(x);
    return g.s * (1.0f + x * g.one_minus_s);
}

inline double silu_value(double x) {
    const double e = std::exp(-std::fabs(x));
    return x >= 0.0 ? x / (1.0 + e) : x * e / (1.0 + e);
}

inline double silu_derivative(double x) {
    const double e = std::exp(-std::fabs(x));
    const double d = 1.0 / (1.0 + e);
    const double s = x >= 0.0 ? d : e * d;
    const double one_minus_s = x >= 0.0 ? e * d : d;
    return s * (1.0 + x * one_minus_s);
}

}  // namespace detail

template <>
struct host_kernel<ops::Silu> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        map_blocks(
            c.output_numel(0),
            [](T* __restrict y, const T* __restrict x) {
                for (std::int64_t j = 0; j < simd_block; ++j) y[j] = detail::silu_value(x[j]);
            },
            c.output(0), c.input(0));
    }
};

template <>
struct host_kernel<ops::SiluGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        map_blocks(
            c.output_numel(0),
            [](T* __restrict dx, const T* __restrict dy, const T* __restrict x) {
                for (std::int64_t j = 0; j < simd_block; ++j) dx[j] = dy[j] * detail::silu_derivative(x[j]);
            },
            c.output(0), c.input(0), c.input(1));
    }
};

}  // namespace loom::host
