#pragma once
// rms_norm: y = x * rsqrt(mean(x^2) + eps) * gamma over the last dim, as PyTorch's
// torch.nn.functional.rms_norm(x, (h,), gamma, eps).
//   rms_norm       "... h^, h^ -> ... h^"
//   rms_norm_grad  "... h^, ... h^, h^ -> ... h^, h^"   (dy, x, gamma) -> (dx, dgamma)
// h is frozen: the statistic needs the whole row. The backward recomputes rstd from x; dgamma
// lacks the leading dims, so a batch split leaves it as partial sums.
//
// eps is always explicit here (default 1e-6). PyTorch's default eps=None means
// torch.finfo(x.dtype).eps (1.19e-7 in float32, 2.22e-16 in float64), which depends on the
// precision; to match a PyTorch model, pass the eps it uses.
#include <array>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/builder.hpp>

namespace loom::ops {

struct RmsNormGrad {
    static constexpr std::string_view name = "rms_norm_grad";
    static constexpr signature sig = parse_signature("... h^, ... h^, h^ -> ... h^, h^");
    // About 8 operations per element of x (statistics, dx, dgamma).
    static double flops(const graph& g, const node& n) {
        return 8.0 * static_cast<double>(g.tensor(n.inputs[1]).dims.numel());
    }
};

struct rms_norm_grads {
    tensor dx, dgamma;
};

// One node computes both gradients; a caller takes the ones it needs.
inline rms_norm_grads rms_norm_grad(tensor dy, tensor x, tensor gamma, double eps) {
    std::array<tensor, 3> ins{dy, x, gamma};
    auto outs = dy.builder->apply<RmsNormGrad>(ins, {{"eps", eps}});
    return {outs[0], outs[1]};
}

struct RmsNorm {
    static constexpr std::string_view name = "rms_norm";
    static constexpr signature sig = parse_signature("... h^, h^ -> ... h^");
    // About 5 operations per element (sum of squares, normalize, scale).
    static double flops(const graph& g, const node& n) {
        return 5.0 * static_cast<double>(g.tensor(n.inputs[0]).dims.numel());
    }

    static gradients backward(backward_context& c) {
        gradients g(2);
        if (!c.needs_grad[0] && !c.needs_grad[1]) return g;
        auto d = rms_norm_grad(*c.grad_outputs[0], c.inputs[0], c.inputs[1], c.attrs().get<double>("eps"));
        if (c.needs_grad[0]) g[0] = d.dx;
        if (c.needs_grad[1]) g[1] = d.dgamma;
        return g;
    }
};

LOOM_INLINE tensor rms_norm(tensor x, tensor gamma, double eps = 1e-6);

}  // namespace loom::ops

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::ops {

LOOM_INLINE tensor rms_norm(tensor x, tensor gamma, double eps) {
    if (!(eps >= 0))
        throw usage_error("rms_norm: eps = " + std::to_string(eps) + " for input '" + x.name() +
                          "'; pass a non-negative epsilon (e.g. 1e-6, or the eps of the model being matched)");
    return x.builder->apply1<RmsNorm>({x, gamma}, {{"eps", eps}});
}

}  // namespace loom::ops
#endif  // LOOM_HEADER_DEFINITIONS
