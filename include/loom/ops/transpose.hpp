#pragma once
// transpose: swaps the last two axes, "... a b -> ... b a"; y[..., j, i] = x[..., i, j].
// Every variable is spatial: a slice of a or b (or a leading dim) of x is the same slice of y.
#include <loom/graph/builder.hpp>

namespace loom::ops {

struct Transpose {
    static constexpr std::string_view name = "transpose";
    static constexpr signature sig = parse_signature("... a b -> ... b a");
    static gradients backward(backward_context& c);
};

inline tensor transpose(tensor x) { return x.builder->apply1<Transpose>({x}); }

inline gradients Transpose::backward(backward_context& c) { return {transpose(*c.grad_outputs[0])}; }

}  // namespace loom::ops
