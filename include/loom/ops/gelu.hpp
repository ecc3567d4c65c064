#pragma once
// gelu: GELU, tanh approximation, as PyTorch's F.gelu(x, approximate='tanh'):
//   y = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   gelu       "... -> ..."
//   gelu_grad  "..., ... -> ..."   inputs (dy, x): dx = dy * gelu'(x); elementwise in both, so
//                                  a split slices dy and x alike
#include <loom/graph/builder.hpp>

namespace loom::ops {

struct GeluGrad {
    static constexpr std::string_view name = "gelu_grad";
    static constexpr signature sig = parse_signature("..., ... -> ...");
};

inline tensor gelu_grad(tensor dy, tensor x) { return dy.builder->apply1<GeluGrad>({dy, x}); }

struct Gelu {
    static constexpr std::string_view name = "gelu";
    static constexpr signature sig = parse_signature("... -> ...");
    static gradients backward(backward_context& c) { return {gelu_grad(*c.grad_outputs[0], c.inputs[0])}; }
};

inline tensor gelu(tensor x) { return x.builder->apply1<Gelu>({x}); }

}  // namespace loom::ops
