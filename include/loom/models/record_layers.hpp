#pragma once
// Records scopes that were built one after another as the instances of one repeat, so that
// the searcher's folding (search/folding.hpp, which folds a graph's largest repeat) sees
// every block of a model as a layer, even blocks built under different scope names:
//
//   record_layers(b, "blocks", {"encoder.0", "encoder.1", "decoder.0", "decoder.1"});
//   // scope "decoder.0" is now instance 2 of repeat "blocks"
//
// Models whose blocks are not one `graph_builder` repeat (T5's encoder and decoder, Swin's
// stages) call it once, after building.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/builder.hpp>

namespace loom::models {

LOOM_INLINE void record_layers(graph_builder& b, const std::string& name, const std::vector<std::string>& paths);

}  // namespace loom::models

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::models {

LOOM_INLINE void record_layers(graph_builder& b, const std::string& name, const std::vector<std::string>& paths) {
    graph& g = b.mutable_graph();
    const auto r = static_cast<std::int32_t>(g.repeats.size());
    repeat_desc rd{name, no_id, {}};
    for (std::size_t k = 0; k < paths.size(); ++k) {
        std::int32_t s = no_id;
        for (std::size_t i = 0; i < g.scopes.size() && s == no_id; ++i)
            if (g.scopes[i].path == paths[k]) s = static_cast<std::int32_t>(i);
        if (s == no_id)
            throw usage_error("record_layers: no scope '" + paths[k] + "' was built; record the scopes after building them");
        g.scopes[static_cast<std::size_t>(s)].repeat = r;
        g.scopes[static_cast<std::size_t>(s)].index = static_cast<std::int64_t>(k);
        rd.scopes.push_back(s);
    }
    g.repeats.push_back(std::move(rd));
}

}  // namespace loom::models
#endif  // LOOM_HEADER_DEFINITIONS
