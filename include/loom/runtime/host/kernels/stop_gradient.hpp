#pragma once
// Kernel of stop_gradient: in the forward pass it is the identity, a copy.
#include <loom/ops/stop_gradient.hpp>
#include <loom/runtime/host/kernel_call.hpp>
#include <loom/runtime/host/kernels/elementwise.hpp>

namespace loom::host {

template <>
struct host_kernel<ops::StopGradient> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        copy_elements(c.input(0), c.output(0), c.output_numel(0));
    }
};

}  // namespace loom::host
