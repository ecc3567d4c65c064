#pragma once
// identity: y = x. Does nothing to values; exists so that a plan can transform a point in
// the graph on its own (ZeRO partitions parameters by splitting an identity placed after
// them) and so that one tensor can be given two roles (a gradient shared by two parameters).
#include <loom/graph/builder.hpp>

namespace loom::ops {

struct Identity {
    static constexpr std::string_view name = "identity";
    static constexpr signature sig = parse_signature("... -> ...");
    static gradients backward(backward_context& c);
};

inline tensor identity(tensor x) { return x.builder->apply1<Identity>({x}); }

inline gradients Identity::backward(backward_context& c) { return {identity(*c.grad_outputs[0])}; }

}  // namespace loom::ops
