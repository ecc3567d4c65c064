#pragma once
// softmax over the last dim, as PyTorch's F.softmax(x, dim=-1):
//   y[..., j] = exp(x[..., j] - m) / sum_k exp(x[..., k] - m),  m = max_k x[..., k]
//   softmax       "... n^ -> ... n^"               n frozen: every output element depends on
//                                                  the whole row, so a slice of n is no softmax
//   softmax_grad  "... n^, ... n^ -> ... n^"       inputs (dy, y): dx = y (dy - sum_k dy[k] y[k])
#include <loom/graph/builder.hpp>

namespace loom::ops {

struct SoftmaxGrad {
    static constexpr std::string_view name = "softmax_grad";
    static constexpr signature sig = parse_signature("... n^, ... n^ -> ... n^");
};

inline tensor softmax_grad(tensor dy, tensor y) { return dy.builder->apply1<SoftmaxGrad>({dy, y}); }

struct Softmax {
    static constexpr std::string_view name = "softmax";
    static constexpr signature sig = parse_signature("... n^ -> ... n^");
    // The gradient reads the output, not the input: y is what the forward keeps alive anyway.
    static gradients backward(backward_context& c) { return {softmax_grad(*c.grad_outputs[0], c.outputs[0])}; }
};

inline tensor softmax(tensor x) { return x.builder->apply1<Softmax>({x}); }

}  // namespace loom::ops
