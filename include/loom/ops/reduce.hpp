#pragma once
// Reductions to a scalar and over leading dims.
//   sum          "... -> "        every dim contracted: a split leaves partial sums
//   mean         "... -> "        the same, divided by the full element count (an attribute,
//                                 so a piece of a split still divides by the whole count)
//   sum_leading  "... n -> n"     the bias gradient: sum over every leading dim
//   broadcast_scalar "..., -> ..." d(sum)/dx: the scalar gradient copied to x's shape
#include <loom/graph/builder.hpp>

namespace loom::ops {

struct SumLeading {
    static constexpr std::string_view name = "sum_leading";
    static constexpr signature sig = parse_signature("... n -> n");
};

struct BroadcastScalar {
    static constexpr std::string_view name = "broadcast_scalar";
    // Input 0 is read only for its shape; input 1 is the scalar; out = scale * scalar.
    static constexpr signature sig = parse_signature("..., -> ...");
};

inline tensor sum_leading(tensor x) { return x.builder->apply1<SumLeading>({x}); }
inline tensor broadcast_scalar(tensor like, tensor scalar, double scale) {
    return like.builder->apply1<BroadcastScalar>({like, scalar}, {{"scale", scale}});
}

struct Sum {
    static constexpr std::string_view name = "sum";
    static constexpr signature sig = parse_signature("... -> ");
    static gradients backward(backward_context& c) {
        return {broadcast_scalar(c.inputs[0], *c.grad_outputs[0], 1.0)};
    }
};

struct Mean {
    static constexpr std::string_view name = "mean";
    static constexpr signature sig = parse_signature("... -> ");
    static gradients backward(backward_context& c) {
        double count = c.attrs().get<double>("count");
        return {broadcast_scalar(c.inputs[0], *c.grad_outputs[0], 1.0 / count)};
    }
};

inline tensor sum(tensor x) { return x.builder->apply1<Sum>({x}); }
inline tensor mean(tensor x) {
    return x.builder->apply1<Mean>({x}, {{"count", static_cast<double>(x.dims().numel())}});
}

}  // namespace loom::ops
