#pragma once
// silu: y = x sigmoid(x), as PyTorch's F.silu.
//   silu       "... -> ..."
//   silu_grad  "..., ... -> ..."   inputs (dy, x): dx = dy s (1 + x (1 - s)), s = sigmoid(x)
#include <loom/graph/builder.hpp>

namespace loom::ops {

struct SiluGrad {
    static constexpr std::string_view name = "silu_grad";
    static constexpr signature sig = parse_signature("..., ... -> ...");
};

inline tensor silu_grad(tensor dy, tensor x) { return dy.builder->apply1<SiluGrad>({dy, x}); }

struct Silu {
    static constexpr std::string_view name = "silu";
    static constexpr signature sig = parse_signature("... -> ...");
    static gradients backward(backward_context& c) { return {silu_grad(*c.grad_outputs[0], c.inputs[0])}; }
};

inline tensor silu(tensor x) { return x.builder->apply1<Silu>({x}); }

}  // namespace loom::ops
