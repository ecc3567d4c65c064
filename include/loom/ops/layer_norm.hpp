#pragma once
// layer_norm: y = (x - mean) / sqrt(var + eps) * gamma + beta over the last dim, with the
// biased variance, exactly as PyTorch's F.layer_norm(x, (h,), gamma, beta, eps).
//   layer_norm       "... h^, h^, h^ -> ... h^"
//   layer_norm_grad  "... h^, ... h^, h^ -> ... h^, h^, h^"   (dy, x, gamma) -> (dx, dgamma, dbeta)
// h is frozen: mean and variance need the whole row. The backward is one fused op that
// recomputes mean and rstd from x (nothing is stashed); dgamma and dbeta lack the leading
// dims, so a batch split leaves them as partial sums, which is what data parallelism sums.
#include <array>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/builder.hpp>

namespace loom::ops {

struct LayerNormGrad {
    static constexpr std::string_view name = "layer_norm_grad";
    static constexpr signature sig = parse_signature("... h^, ... h^, h^ -> ... h^, h^, h^");
    // About 11 operations per element of x (statistics, dx, dgamma, dbeta).
    static double flops(const graph& g, const node& n) {
        return 11.0 * static_cast<double>(g.tensor(n.inputs[1]).dims.numel());
    }
};

struct layer_norm_grads {
    tensor dx, dgamma, dbeta;
};

// One node computes all three gradients; a caller takes the ones it needs.
inline layer_norm_grads layer_norm_grad(tensor dy, tensor x, tensor gamma, double eps) {
    std::array<tensor, 3> ins{dy, x, gamma};
    auto outs = dy.builder->apply<LayerNormGrad>(ins, {{"eps", eps}});
    return {outs[0], outs[1], outs[2]};
}

struct LayerNorm {
    static constexpr std::string_view name = "layer_norm";
    static constexpr signature sig = parse_signature("... h^, h^, h^ -> ... h^");
    // About 8 operations per element (two statistics passes, normalize, scale, shift).
    static double flops(const graph& g, const node& n) {
        return 8.0 * static_cast<double>(g.tensor(n.inputs[0]).dims.numel());
    }

    static gradients backward(backward_context& c) {
        gradients g(3);
        if (!c.needs_grad[0] && !c.needs_grad[1] && !c.needs_grad[2]) return g;
        auto d = layer_norm_grad(*c.grad_outputs[0], c.inputs[0], c.inputs[1], c.attrs().get<double>("eps"));
        if (c.needs_grad[0]) g[0] = d.dx;
        if (c.needs_grad[1]) g[1] = d.dgamma;
        if (c.needs_grad[2]) g[2] = d.dbeta;
        return g;
    }
};

// PyTorch's default eps is 1e-5 as here.
LOOM_INLINE tensor layer_norm(tensor x, tensor gamma, tensor beta, double eps = 1e-5);

}  // namespace loom::ops

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::ops {

LOOM_INLINE tensor layer_norm(tensor x, tensor gamma, tensor beta, double eps) {
    if (!(eps >= 0))
        throw usage_error("layer_norm: eps = " + std::to_string(eps) + " for input '" + x.name() +
                          "'; pass a non-negative epsilon (PyTorch's default is 1e-5)");
    return x.builder->apply1<LayerNorm>({x, gamma, beta}, {{"eps", eps}});
}

}  // namespace loom::ops
#endif  // LOOM_HEADER_DEFINITIONS
