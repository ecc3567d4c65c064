#pragma once
// Host kernels of relu and relu_grad.
#include <loom/ops/relu.hpp>
#include <loom/runtime/host/kernel_call.hpp>
#include <loom/runtime/host/kernels/vector_math.hpp>

namespace loom::host {

template <>
struct host_kernel<ops::Relu> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        map_blocks(
            c.output_numel(0),
            [](T* __restrict y, const T* __restrict x) {
                // NaN stays NaN, as in PyTorch.
                for (std::int64_t j = 0; j < simd_block; ++j) y[j] = x[j] < T(0) ? T(0) : x[j];
            },
            c.output(0), c.input(0));
    }
};

template <>
struct host_kernel<ops::ReluGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        map_blocks(
            c.output_numel(0),
            [](T* __restrict dx, const T* __restrict dy, const T* __restrict x) {
                for (std::int64_t j = 0; j < simd_block; ++j) {
                    const T g = dy[j];  // read on every lane: g++ does not if-convert a conditional load
                    dx[j] = x[j] <= T(0) ? T(0) : g;
                }
            },
            c.output(0), c.input(0), c.input(1));
    }
};

}  // namespace loom::host
