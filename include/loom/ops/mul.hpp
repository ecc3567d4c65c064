#pragma once
// mul: y = a * b elementwise, same shapes.
#include <loom/core/linkage.hpp>
#include <loom/graph/builder.hpp>

namespace loom::ops {

struct Mul {
    static constexpr std::string_view name = "mul";
    static constexpr signature sig = parse_signature("..., ... -> ...");
    static gradients backward(backward_context& c);
};

inline tensor mul(tensor a, tensor b) { return a.builder->apply1<Mul>({a, b}); }

}  // namespace loom::ops

namespace loom {
// Found by argument-dependent lookup on loom::tensor.
inline tensor operator*(tensor a, tensor b) { return ops::mul(a, b); }
}  // namespace loom

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::ops {

LOOM_INLINE gradients Mul::backward(backward_context& c) {
    const tensor& dy = *c.grad_outputs[0];
    gradients g(2);
    if (c.needs_grad[0]) g[0] = mul(dy, c.inputs[1]);
    if (c.needs_grad[1]) g[1] = mul(dy, c.inputs[0]);
    return g;
}

}  // namespace loom::ops
#endif  // LOOM_HEADER_DEFINITIONS
