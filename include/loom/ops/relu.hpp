#pragma once
// relu: y = max(x, 0), as PyTorch's F.relu.
//   relu       "... -> ..."
//   relu_grad  "..., ... -> ..."   inputs (dy, x): dx = dy where x > 0, else 0 (0 at x == 0,
//                                  as PyTorch; a NaN x passes dy, as PyTorch's threshold_backward)
#include <loom/graph/builder.hpp>

namespace loom::ops {

struct ReluGrad {
    static constexpr std::string_view name = "relu_grad";
    static constexpr signature sig = parse_signature("..., ... -> ...");
};

inline tensor relu_grad(tensor dy, tensor x) { return dy.builder->apply1<ReluGrad>({dy, x}); }

struct Relu {
    static constexpr std::string_view name = "relu";
    static constexpr signature sig = parse_signature("... -> ...");
    static gradients backward(backward_context& c) { return {relu_grad(*c.grad_outputs[0], c.inputs[0])}; }
};

inline tensor relu(tensor x) { return x.builder->apply1<Relu>({x}); }

}  // namespace loom::ops
