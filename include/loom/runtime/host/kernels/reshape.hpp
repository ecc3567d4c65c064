#pragma once
// Kernel of reshape: a row-major reshape keeps every element where it is, so it is a copy.
#include <loom/ops/reshape.hpp>
#include <loom/runtime/host/kernel_call.hpp>
#include <loom/runtime/host/kernels/elementwise.hpp>

namespace loom::host {

template <>
struct host_kernel<ops::Reshape> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        copy_elements(c.input(0), c.output(0), c.output_numel(0));
    }
};

}  // namespace loom::host
