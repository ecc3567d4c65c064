#pragma once
// linear: y = x W^T (+ b), W stored [out, in] as in most frameworks.
//   linear       "... k, n k -> ... n"        k contracted: a split leaves partial sums
//   linear_bias  "... k, n k, n -> ... n"     k frozen: the bias would be added n times
// and the two GEMMs of its backward, whose signatures say how gradients partition:
//   linear_grad_input   "... n, n k -> ... k"   dx = dy W
//   linear_grad_weight  "... n, ... k -> n k"   dW = dy^T x, a sum over the leading dims,
//                                               so a batch split leaves partial sums (DP's all-reduce)
#include <loom/graph/builder.hpp>
#include <loom/ops/reduce.hpp>

namespace loom::ops {

namespace detail {
// 2 * (elements of the output) * (extent of the contracted variable)
inline double gemm_flops(const graph& g, const node& n, std::string_view contracted) {
    double out = static_cast<double>(g.tensor(n.outputs[0]).dims.numel());
    auto k = n.sig.find(contracted);
    return 2.0 * out * static_cast<double>(k ? n.sig.vars[static_cast<std::size_t>(*k)].extent : 1);
}
}  // namespace detail

struct LinearGradInput {
    static constexpr std::string_view name = "linear_grad_input";
    static constexpr signature sig = parse_signature("... n, n k -> ... k");
    static double flops(const graph& g, const node& n) { return detail::gemm_flops(g, n, "n"); }
};

struct LinearGradWeight {
    static constexpr std::string_view name = "linear_grad_weight";
    static constexpr signature sig = parse_signature("... n, ... k -> n k");
    static double flops(const graph& g, const node& n) {
        double lead = static_cast<double>(g.tensor(n.inputs[0]).dims.numel()) /
                      static_cast<double>(n.sig.vars[static_cast<std::size_t>(*n.sig.find("n"))].extent);
        return 2.0 * static_cast<double>(g.tensor(n.outputs[0]).dims.numel()) * lead;
    }
};

inline tensor linear_grad_input(tensor dy, tensor w) { return dy.builder->apply1<LinearGradInput>({dy, w}); }
inline tensor linear_grad_weight(tensor dy, tensor x) { return dy.builder->apply1<LinearGradWeight>({dy, x}); }

struct Linear {
    static constexpr std::string_view name = "linear";
    static constexpr signature sig = parse_signature("... k, n k -> ... n");
    static double flops(const graph& g, const node& n) { return detail::gemm_flops(g, n, "k"); }

    static gradients backward(backward_context& c) {
        const tensor& dy = *c.grad_outputs[0];
        gradients g(2);
        if (c.needs_grad[0]) g[0] = linear_grad_input(dy, c.inputs[1]);
        if (c.needs_grad[1]) g[1] = linear_grad_weight(dy, c.inputs[0]);
        return g;
    }
};

struct LinearBias {
    static constexpr std::string_view name = "linear_bias";
    static constexpr signature sig = parse_signature("... k^, n k^, n -> ... n");
    static double flops(const graph& g, const node& n) { return detail::gemm_flops(g, n, "k"); }

    static gradients backward(backward_context& c) {
        const tensor& dy = *c.grad_outputs[0];
        gradients g(3);
        if (c.needs_grad[0]) g[0] = linear_grad_input(dy, c.inputs[1]);
        if (c.needs_grad[1]) g[1] = linear_grad_weight(dy, c.inputs[0]);
        if (c.needs_grad[2]) g[2] = sum_leading(dy);
        return g;
    }
};

// y = x W^T
inline tensor linear(tensor x, tensor w) { return x.builder->apply1<Linear>({x, w}); }
// y = x W^T + b
inline tensor linear(tensor x, tensor w, tensor b) { return x.builder->apply1<LinearBias>({x, w, b}); }

}  // namespace loom::ops
