#pragma once
// scale: y = s * x for a constant s (an attribute, not a tensor).
#include <loom/graph/builder.hpp>

namespace loom::ops {

struct Scale {
    static constexpr std::string_view name = "scale";
    static constexpr signature sig = parse_signature("... -> ...");
    static gradients backward(backward_context& c);
};

inline tensor scale(tensor x, double s) { return x.builder->apply1<Scale>({x}, {{"factor", s}}); }

inline gradients Scale::backward(backward_context& c) {
    return {scale(*c.grad_outputs[0], c.attrs().get<double>("factor"))};
}

}  // namespace loom::ops
