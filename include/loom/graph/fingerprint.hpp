#pragma once
// What identifies a model: its forward ops in order (kind, name, output shapes), hashed.
// Two graphs with the same fingerprint are the same model, so the same plans, plan files and
// checkpoints fit both. A training graph has the fingerprint of its model (the backward pass
// is appended after the forward nodes), and partition::apply_plan records the model's in the
// partitioned graph, whatever the plan rewrites.
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>

#include <loom/core/linkage.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/op.hpp>

namespace loom {

LOOM_INLINE std::string model_fingerprint(const graph& g);

}  // namespace loom

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom {

LOOM_INLINE std::string model_fingerprint(const graph& g) {
    std::uint64_t h = 1469598103934665603ull;  // FNV-1a
    auto mix = [&](std::string_view s) {
        for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
        h = (h ^ 0xffu) * 1099511628211ull;
    };
    for (std::size_t i = 0; i < g.forward_node_count(); ++i) {
        const node& n = g.nodes[i];
        mix(n.op->name);
        mix(n.name);
        for (tensor_id t : n.outputs) mix(g.tensor(t).dims.to_string());
    }
    std::ostringstream out;
    out << std::hex << h;
    return out.str();
}

}  // namespace loom
#endif  // LOOM_HEADER_DEFINITIONS
