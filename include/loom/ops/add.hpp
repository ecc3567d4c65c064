#pragma once
// add: y = a + b, same shapes ("..., ... -> ..."). Also what autograd uses to accumulate
// the gradient of a tensor read by several ops.
#include <loom/graph/builder.hpp>

namespace loom::ops {

struct Add {
    static constexpr std::string_view name = "add";
    static constexpr signature sig = parse_signature("..., ... -> ...");
    static constexpr bool linear = true;
    static gradients backward(backward_context& c) {
        gradients g(2);
        if (c.needs_grad[0]) g[0] = *c.grad_outputs[0];
        if (c.needs_grad[1]) g[1] = *c.grad_outputs[0];
        return g;
    }
};

inline tensor add(tensor a, tensor b) { return a.builder->apply1<Add>({a, b}); }

}  // namespace loom::ops

namespace loom {
// Found by argument-dependent lookup on loom::tensor.
inline tensor operator+(tensor a, tensor b) { return ops::add(a, b); }
}  // namespace loom
