#pragma once
// reshape: the same elements in row-major order under another shape (named dims included).
//
// A reshape moves elements between axes, so no dim of it can be split without changing which
// elements a slice holds: it declares no splittable dims. Its signature "... -> " only lets
// it bind to any rank; the target shape comes from `infer`, and `opaque_layout` tells plans
// to refuse every split of a reshape node (the signature's laws do not describe it).
//
// The target is kept in the attributes, so plan files and traces can print it:
//   "extents" = {8, 64, 4, 32}, "dims" = "Batch,Seq,Head,HeadDim"
#include <cstdint>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/builder.hpp>

namespace loom::ops {

namespace detail {

LOOM_INLINE attributes reshape_attributes(const shape& target);

LOOM_INLINE shape reshape_target(const attributes& a);

}  // namespace detail

struct Reshape {
    static constexpr std::string_view name = "reshape";
    static constexpr signature sig = parse_signature("... -> ");
    // Plans read this and split no dim of a reshape (see the header comment).
    static constexpr bool opaque_layout = true;

    static std::vector<shape> infer(const bound_signature&, const attributes& a, std::span<const shape>) {
        return {detail::reshape_target(a)};
    }

    static void check(const bound_signature&, const attributes& a, std::span<const shape> in,
                      const std::string& node_name) {
        const shape target = detail::reshape_target(a);
        if (target.numel() != in[0].numel())
            throw shape_error("reshape '" + node_name + "': the input has shape " + in[0].to_string() + " (" +
                              std::to_string(in[0].numel()) + " elements) but the target shape " +
                              target.to_string() + " has " + std::to_string(target.numel()) +
                              " elements; choose a target with " + std::to_string(in[0].numel()) + " elements");
    }

    static gradients backward(backward_context& c);
};

// The elements of x, in row-major order, under shape `target` (same element count).
inline tensor reshape(tensor x, const shape& target) {
    return x.builder->apply1<Reshape>({x}, detail::reshape_attributes(target));
}

inline gradients Reshape::backward(backward_context& c) { return {reshape(*c.grad_outputs[0], c.inputs[0].dims())}; }

}  // namespace loom::ops

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::ops::detail {

LOOM_INLINE attributes reshape_attributes(const shape& target) {
    std::vector<std::int64_t> extents;
    std::string dims;
    for (std::size_t i = 0; i < target.rank(); ++i) {
        const std::string_view name = target.dim(i).name();
        if (name.find(',') != std::string_view::npos)
            throw usage_error("reshape: dim name '" + std::string(name) + "' of the target " + target.to_string() +
                              " contains ','; name dims without commas");
        if (i) dims += ',';
        dims += name;
        extents.push_back(target.extent(i));
    }
    return {{"extents", std::move(extents)}, {"dims", std::move(dims)}};
}

LOOM_INLINE shape reshape_target(const attributes& a) {
    const auto extents = a.get<std::vector<std::int64_t>>("extents");
    const auto dims = a.get<std::string>("dims");
    shape s;
    std::size_t start = 0;
    for (std::size_t i = 0; i < extents.size(); ++i) {
        std::size_t end = dims.find(',', start);
        if (end == std::string::npos) end = dims.size();
        s.push_back({dim_id::intern(std::string_view(dims).substr(start, end - start)), extents[i]});
        start = end + 1;
    }
    return s;
}

}  // namespace loom::ops::detail
#endif  // LOOM_HEADER_DEFINITIONS
