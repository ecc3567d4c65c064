#pragma once
// What a host kernel receives: the node, typed views of its input and output buffers, and
// the step number (dropout masks are a pure function of seed, step and element index).
// Every tensor is dense row-major. Kernels overwrite their outputs completely.
#include <cstdint>
#include <span>

#include <loom/graph/graph.hpp>
#include <loom/graph/op.hpp>

namespace loom::host {

template <class T>
struct kernel_call {
    const graph& g;
    const node& n;
    std::span<void* const> in;
    std::span<void* const> out;
    std::uint64_t step = 0;

    const T* input(std::size_t i) const { return static_cast<const T*>(in[i]); }
    const std::int32_t* index_input(std::size_t i) const { return static_cast<const std::int32_t*>(in[i]); }
    T* output(std::size_t i) const { return static_cast<T*>(out[i]); }
    const shape& input_shape(std::size_t i) const { return g.tensor(n.inputs[i]).dims; }
    const shape& output_shape(std::size_t i) const { return g.tensor(n.outputs[i]).dims; }
    std::int64_t input_numel(std::size_t i) const { return input_shape(i).numel(); }
    std::int64_t output_numel(std::size_t i) const { return output_shape(i).numel(); }
    const attributes& attrs() const { return n.attrs; }
    // Extent of a bound signature variable ("k", "n", "...0").
    std::int64_t extent(std::string_view label) const {
        auto v = n.sig.find(label);
        return v ? n.sig.vars[static_cast<std::size_t>(*v)].extent : 0;
    }
    // Product of the extents of the leading dims that `...` stood for.
    std::int64_t leading_numel(std::size_t input = 0) const {
        const shape& s = input_shape(input);
        std::size_t explicit_rank = n.op->sig.inputs[input].rank;
        return s.span_numel(0, s.rank() - explicit_rank);
    }
};

// Specialised once per op kind in runtime/host/kernels/<op>.hpp:
//   template <> struct host_kernel<ops::Gelu> { template <class T> static void run(const kernel_call<T>&); };
template <class Op>
struct host_kernel;

}  // namespace loom::host
