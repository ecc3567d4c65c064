#pragma once
// Host kernel of assemble (ops/assemble.hpp): copy or add the inputs' intersections with
// the output box. The output is zeroed first when the inputs are summed or do not cover it.
#include <algorithm>
#include <cstdint>

#include <loom/ops/assemble.hpp>
#include <loom/partition/region_copy.hpp>
#include <loom/runtime/host/kernel_call.hpp>

namespace loom::host {

template <>
struct host_kernel<ops::Assemble> {
    // Index tensors (token ids) are assembled too: the element type follows the tensor.
    template <class T>
    static void run(const kernel_call<T>& c) {
        if (c.g.tensor(c.n.outputs[0]).kind == value_kind::index)
            assemble<std::int32_t>(c);
        else
            assemble<T>(c);
    }

    template <class E, class T>
    static void assemble(const kernel_call<T>& c) {
        const auto& out_flat = c.attrs().template get<std::vector<std::int64_t>>("out_box");
        const auto& in_flat = c.attrs().template get<std::vector<std::int64_t>>("in_boxes");
        const bool accumulate = c.attrs().template get<std::int64_t>("accumulate") != 0;
        const bool zero = accumulate || c.attrs().template get<std::int64_t>("zero") != 0;
        const std::size_t rank = out_flat.size() / 2;
        const partition::box out = partition::decode_box(out_flat, 0, rank);
        E* y = static_cast<E*>(c.out[0]);
        if (zero) std::fill(y, y + c.output_numel(0), E(0));
        for (std::size_t i = 0; i < c.in.size(); ++i) {
            const partition::box in = partition::decode_box(in_flat, 2 * rank * i, rank);
            const partition::box region = partition::intersect(in, out);
            if (rank > 0 && region.empty()) continue;
            const E* x = static_cast<const E*>(c.in[i]);
            if (accumulate)
                partition::add_region(x, in, y, out, region);
            else
                partition::copy_region(x, in, y, out, region);
        }
    }
};

}  // namespace loom::host
