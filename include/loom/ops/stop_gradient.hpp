#pragma once
// stop_gradient: y = x in the forward pass, and no gradient flows back through it, as
// jax.lax.stop_gradient or torch's x.detach(). AlphaFold's recycling feeds each round's
// outputs into the next round through it, so only the last round is differentiated.
//
// The op has no backward rule on purpose: autograd treats it as not differentiable, so its
// output depends on no parameter and nothing upstream of it is differentiated through it
// (not even to compute a gradient that would then be dropped).
#include <loom/graph/builder.hpp>

namespace loom::ops {

struct StopGradient {
    static constexpr std::string_view name = "stop_gradient";
    static constexpr signature sig = parse_signature("... -> ...");
};

inline tensor stop_gradient(tensor x) { return x.builder->apply1<StopGradient>({x}); }

}  // namespace loom::ops
