#pragma once
// Kernel of stop_gradient: in the forward pass it is the identity, a copy.
#include <cstring>

#include <loom/ops/stop_gradient.hpp>
#include <loom/runtime/host/kernel_call.hpp>
#include <loom/runtime/host/kernels/elementwise.hpp>

namespace loom::host {

template <>
struct host_kernel<ops::StopGradient> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const T* x = c.input(0);
        T* y = c.output(0);
        if (x == y) return;
        const std::int64_t n = c.output_numel(0);
        parallel_for(0, n, elementwise_grain, [&](std::int64_t lo, std::int64_t hi) {
            std::memcpy(y + lo, x + lo, static_cast<std::size_t>(hi - lo) * sizeof(T));
        });
    }
};

}  // namespace loom::host
