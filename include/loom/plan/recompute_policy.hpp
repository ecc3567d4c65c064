#pragma once
// How much of a transformer layer the backward pass recomputes instead of keeping
// (Korthikanti et al., 2022, "Reducing Activation Recomputation in Large Transformer Models"):
//
//   none       keep everything the forward saves
//   selective  recompute the attention core (the scores, their softmax and dropout: the ops
//              of kind ops::Attention), keep the rest
//   full       keep only the layer's input and rerun the whole layer
//
// A plan states it per range of layers with presets::recompute_layers, which lowers it to
// recompute rules (rule::recompute) over the layers' ops; the searcher prices what those
// rules make the programs replay and keep.
#include <cstdint>
#include <string>

#include <loom/core/linkage.hpp>

namespace loom::plan {

enum class recompute_policy : std::uint8_t { none, selective, full };

LOOM_INLINE std::string to_string(recompute_policy r);

}  // namespace loom::plan

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::plan {

LOOM_INLINE std::string to_string(recompute_policy r) {
    switch (r) {
        case recompute_policy::none: return "none";
        case recompute_policy::selective: return "selective";
        case recompute_policy::full: return "full";
    }
    return "?";
}

}  // namespace loom::plan
#endif  // LOOM_HEADER_DEFINITIONS
