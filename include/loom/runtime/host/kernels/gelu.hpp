#pragma once
// Host kernels of gelu and gelu_grad.
//
// double follows PyTorch's formula operation for operation (std::tanh), so float64 models
// match it to a few ulp. float, the hot path of a GPT MLP, uses
//   0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + exp(-2u)),
// one exp and one division per element, vectorized. It is more accurate than evaluating
// 1 + tanh(u) in float, which cancels for x < 0 (at x = -5 the float formula loses every digit):
// within 2e-7 relative for x >= 0, and for x < 0 within the effect of rounding u to float
// (tests/test_ops_elementwise.cpp states the bound).
#include <cmath>

#include <loom/ops/gelu.hpp>
#include <loom/runtime/host/kernel_call.hpp>
#include <loom/runtime/host/kernels/vector_math.hpp>

namespace loom::host {

namespace detail {

inline constexpr double gelu_beta = 0.7978845608028654;  // sqrt(2/pi), PyTorch's M_SQRT2 * M_2_SQRTPI * 0.5
inline constexpr double gelu_kappa = 0.044715;

// x sigmoid(z) = x / (1 + e) for z >= 0 and x e / (1 + e) for z < 0, e = exp(-|z|): one
// rounding fewer than x * sigmoid(z).
inline float gelu_value(float x) {
    const float z = static_cast<float>(2 * gelu_beta) * (x + static_cast<float>(gelu_kappa) * (x * x * x));
    const float e = exp_nonpositive(-std::fabs(z));
    return (x * select_bits(z >= 0.0f, 1.0f, e)) / (1.0f + e);
}

// gelu'(x) = s + x s (1 - s) z'(x),  z = 2u, s = sigmoid(z)
inline float gelu_derivative(float x) {
    const float x2 = x * x;
    const float z = static_cast<float>(2 * gelu_beta) * (x + static_cast<float>(gelu_kappa) * (x2 * x));
    const float dz = static_cast<float>(2 * gelu_beta) * (1.0f + static_cast<float>(3 * gelu_kappa) * x2);
    const sigmoid_parts g = sigmoid_float(z);
    return g.s + x * (g.s * g.one_minus_s) * dz;
}

inline double gelu_value(double x) {
    const double x_cube = x * x * x;
    const double inner = gelu_beta * (x + gelu_kappa * x_cube);
    return 0.5 * x * (1.0 + std::tanh(inner));
}

inline double gelu_derivative(double x) {
    const double x_sq = x * x;
    const double x_cube = x_sq * x;
    const double inner = gelu_beta * (x + gelu_kappa * x_cube);
    const double tanh_inner = std::tanh(inner);
    const double left = 0.5 * x;
    const double right = 1.0 + tanh_inner;
    const double left_derivative = 0.5 * right;
    const double tanh_derivative = 1.0 - tanh_inner * tanh_inner;
    const double inner_derivative = gelu_beta * (1.0 + 3.0 * gelu_kappa * x_sq);
    const double right_derivative = left * tanh_derivative * inner_derivative;
    return left_derivative + right_derivative;
}

}  // namespace detail

template <>
struct host_kernel<ops::Gelu> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        map_blocks(
            c.output_numel(0),
            [](T* __restrict y, const T* __restrict x) {
                for (std::int64_t j = 0; j < simd_block; ++j) y[j] = detail::gelu_value(x[j]);
            },
            c.output(0), c.input(0));
    }
};

template <>
struct host_kernel<ops::GeluGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        map_blocks(
            c.output_numel(0),
            [](T* __restrict dx, const T* __restrict dy, const T* __restrict x) {
                for (std::int64_t j = 0; j < simd_block; ++j) dx[j] = dy[j] * detail::gelu_derivative(x[j]);
            },
            c.output(0), c.input(0), c.input(1));
    }
};

}  // namespace loom::host
