#pragma once
// Folding: which parts of a model are layers, and which layers are the same, so that a
// decision is made once per class of identical layers and applied to every repeat (TAPAS
// §4.3). The folded search (folded_price.hpp) prices small instances of a model family
// instead; this finds the layers of a graph that comes as one graph, and the forward
// rounds that 3F1B pipelines.
//
// Two ways to find the layers of a graph's forward pass:
//   layers_from_scopes(g)     the instances of the graph's largest recorded repeat
//                             ("blocks.0" ... "blocks.95"); everything before the first
//                             instance is the prologue, everything after the epilogue.
//   layers_from_structure(g)  no scopes needed: cut the forward pass where a single
//                             activation is live (the residual stream between blocks),
//                             hash each segment by its ops, shapes and wiring, and find the
//                             longest run of a repeated segment sequence; each repetition
//                             is a layer.
//   find_layers(g)            scopes when the graph recorded a repeat, structure otherwise.
//
// Forward rounds (AlphaFold's recycling, nnScaler's 3F1B): when the largest repeat lies
// inside the instances of an outer repeat, each instance holding the same inner repeat, and
// only the last outer instance is differentiated, the outer instances are rounds over the
// same layers. The layers are then the inner instances, each holding its nodes of every
// round (a round's nodes outside the inner repeat join its first layer), and
// layer_partition::rounds says how many rounds run them.
//
// Either way, layers with equal structural hashes get the same class id, so a prologue that
// happens to equal a block would join its class.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/op.hpp>

namespace loom::search {

enum class layer_role { prologue, repeated, epilogue };

struct layer_span {
    std::string name;                  // "blocks.3", "prologue", "epilogue"
    layer_role role = layer_role::repeated;
    std::vector<node_id> nodes;        // forward nodes, in graph order
    std::uint64_t hash = 0;            // structure: op kinds, shapes, wiring
    int class_id = 0;                  // equal hashes, equal classes
};

struct layer_partition {
    std::vector<layer_span> layers;    // prologue (if any), repeated layers, epilogue (if any)
    int classes = 0;
    std::string found_by;              // "scopes" or "structure"
    int rounds = 1;                    // forward rounds over the repeated layers (only the last differentiated)
    std::vector<int> round_of;         // with rounds > 1: each forward node's round, -1 outside them

    // Indices (into layers) of the repeated layers, in order.
    std::vector<int> repeated() const {
        std::vector<int> out;
        for (std::size_t i = 0; i < layers.size(); ++i)
            if (layers[i].role == layer_role::repeated) out.push_back(static_cast<int>(i));
        return out;
    }
};

namespace detail {

LOOM_INLINE std::uint64_t mix(std::uint64_t h, std::uint64_t v);

inline std::uint64_t hash_text(std::string_view s) { return std::hash<std::string_view>{}(s); }

inline std::size_t forward_count(const graph& g) { return g.forward_nodes ? g.forward_nodes : g.nodes.size(); }

// The hash of a run of forward nodes [first, last): each node's op and output shapes, and
// for each input whether it is a parameter (with its shape), a graph input, an activation
// made inside the run (by its offset back from the consumer) or one from before the run.
LOOM_INLINE std::uint64_t hash_nodes(const graph& g, const std::vector<node_id>& nodes);

LOOM_INLINE void assign_classes(const graph& g, layer_partition& p);

// Splits forward nodes into prologue / repeated layers / epilogue given each node's layer
// index (-1 outside the repeat).
LOOM_INLINE layer_partition partition_by_layer(const graph& g, const std::vector<std::int64_t>& layer_of,
                                               std::string_view layer_prefix);

}  // namespace detail

namespace detail {

// The instance index of repeat `r` that scope `s` lies in, or -1.
inline std::int64_t instance_of(const graph& g, std::int32_t s, std::int32_t r) {
    for (; s != no_id; s = g.scopes.at(static_cast<std::size_t>(s)).parent)
        if (g.scopes.at(static_cast<std::size_t>(s)).repeat == r) return g.scopes.at(static_cast<std::size_t>(s)).index;
    return -1;
}

// Forward rounds: the outer repeat around `inner`, when every outer instance holds a repeat
// named like `inner` with as many instances and only the last round is differentiated.
LOOM_INLINE layer_partition rounds_partition(const graph& g, std::int32_t inner);

}  // namespace detail

// Layers from the graph's largest recorded repeat (most instances; ties: the first).
LOOM_INLINE layer_partition layers_from_scopes(const graph& g);

// Layers from structure alone (scopes ignored).
LOOM_INLINE layer_partition layers_from_structure(const graph& g);

inline layer_partition find_layers(const graph& g) {
    return g.repeats.empty() ? layers_from_structure(g) : layers_from_scopes(g);
}

}  // namespace loom::search

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::search::detail {

LOOM_INLINE std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
    // splitmix64 finaliser over the running hash: order-sensitive and well spread.
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    return h;
}

LOOM_INLINE std::uint64_t hash_nodes(const graph& g, const std::vector<node_id>& nodes) {
    std::map<tensor_id, std::int64_t> made_at;  // tensor -> position in the run
    std::uint64_t h = 0x1234567;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
        const node& n = g.at(nodes[i]);
        h = mix(h, hash_text(n.op->name));
        for (tensor_id t : n.inputs) {
            const tensor_desc& td = g.tensor(t);
            if (td.role == tensor_role::parameter) {
                h = mix(h, 1);
                for (const auto& a : td.dims) h = mix(h, static_cast<std::uint64_t>(a.extent));
            } else if (td.role == tensor_role::input) {
                h = mix(h, 2);
            } else if (auto it = made_at.find(t); it != made_at.end()) {
                h = mix(h, 3 + static_cast<std::uint64_t>(static_cast<std::int64_t>(i) - it->second));
            } else {
                h = mix(h, 0xabcdef);
                for (const auto& a : td.dims) h = mix(h, static_cast<std::uint64_t>(a.extent));
            }
        }
        for (tensor_id t : n.outputs) {
            made_at[t] = static_cast<std::int64_t>(i);
            for (const auto& a : g.tensor(t).dims) h = mix(h, static_cast<std::uint64_t>(a.extent));
        }
    }
    return h;
}

LOOM_INLINE void assign_classes(const graph& g, layer_partition& p) {
    std::map<std::uint64_t, int> class_of;
    for (layer_span& l : p.layers) {
        l.hash = hash_nodes(g, l.nodes);
        auto [it, fresh] = class_of.try_emplace(l.hash, static_cast<int>(class_of.size()));
        l.class_id = it->second;
    }
    p.classes = static_cast<int>(class_of.size());
}

LOOM_INLINE layer_partition partition_by_layer(const graph& g, const std::vector<std::int64_t>& layer_of,
                                               std::string_view layer_prefix) {
    layer_partition p;
    std::int64_t layers = 0;
    for (std::int64_t l : layer_of) layers = std::max(layers, l + 1);
    layer_span prologue{"prologue", layer_role::prologue, {}, 0, 0};
    layer_span epilogue{"epilogue", layer_role::epilogue, {}, 0, 0};
    std::vector<layer_span> repeated(static_cast<std::size_t>(layers));
    for (std::int64_t l = 0; l < layers; ++l)
        repeated[static_cast<std::size_t>(l)].name = std::string(layer_prefix) + "." + std::to_string(l);
    bool seen_layer = false;
    for (std::size_t i = 0; i < layer_of.size(); ++i) {
        const node_id n = static_cast<node_id>(i);
        if (layer_of[i] >= 0) {
            seen_layer = true;
            repeated[static_cast<std::size_t>(layer_of[i])].nodes.push_back(n);
        } else {
            (seen_layer ? epilogue : prologue).nodes.push_back(n);
        }
    }
    if (!prologue.nodes.empty()) p.layers.push_back(std::move(prologue));
    for (auto& l : repeated) p.layers.push_back(std::move(l));
    if (!epilogue.nodes.empty()) p.layers.push_back(std::move(epilogue));
    assign_classes(g, p);
    return p;
}

LOOM_INLINE layer_partition rounds_partition(const graph& g, std::int32_t inner) {
    const repeat_desc& in = g.repeats[static_cast<std::size_t>(inner)];
    std::int32_t outer = no_id;
    for (std::int32_t s = in.parent; s != no_id; s = g.scopes.at(static_cast<std::size_t>(s)).parent)
        if (g.scopes.at(static_cast<std::size_t>(s)).repeat != no_id) {
            outer = g.scopes.at(static_cast<std::size_t>(s)).repeat;
            break;
        }
    if (outer == no_id) return {};
    const auto rounds = static_cast<std::int64_t>(g.repeats[static_cast<std::size_t>(outer)].scopes.size());
    if (rounds < 2) return {};
    // One inner repeat per round, alike.
    std::vector<std::int32_t> inner_of_round(static_cast<std::size_t>(rounds), no_id);
    for (std::size_t r = 0; r < g.repeats.size(); ++r) {
        const repeat_desc& d = g.repeats[r];
        if (d.name != in.name || d.scopes.size() != in.scopes.size()) continue;
        const std::int64_t round = instance_of(g, d.parent, outer);
        if (round >= 0) inner_of_round[static_cast<std::size_t>(round)] = static_cast<std::int32_t>(r);
    }
    if (std::find(inner_of_round.begin(), inner_of_round.end(), no_id) != inner_of_round.end()) return {};
    const std::size_t forward = forward_count(g);
    std::vector<std::int64_t> layer_of(forward, -1);
    std::vector<int> round_of(forward, -1);
    for (std::size_t i = 0; i < forward; ++i) {
        const std::int64_t round = instance_of(g, g.nodes[i].scope, outer);
        if (round < 0) continue;
        round_of[i] = static_cast<int>(round);
        const std::int64_t layer = instance_of(g, g.nodes[i].scope, inner_of_round[static_cast<std::size_t>(round)]);
        layer_of[i] = layer >= 0 ? layer : 0;
    }
    // Only the last round may be differentiated: earlier rounds are forward-only.
    for (std::size_t i = forward; i < g.nodes.size(); ++i) {
        const node_id f = g.nodes[i].forward_of;
        if (f != no_id && static_cast<std::size_t>(f) < forward && round_of[static_cast<std::size_t>(f)] >= 0 &&
            round_of[static_cast<std::size_t>(f)] != rounds - 1)
            return {};
    }
    auto p = partition_by_layer(g, layer_of, in.name);
    p.rounds = static_cast<int>(rounds);
    p.round_of = std::move(round_of);
    return p;
}
}  // namespace loom::search::detail

namespace loom::search {

LOOM_INLINE layer_partition layers_from_scopes(const graph& g) {
    std::int32_t best = no_id;
    for (std::size_t r = 0; r < g.repeats.size(); ++r)
        if (best == no_id || g.repeats[r].scopes.size() > g.repeats[static_cast<std::size_t>(best)].scopes.size())
            best = static_cast<std::int32_t>(r);
    if (best == no_id)
        throw usage_error("layers_from_scopes: the graph recorded no repeated scope; build the layers inside "
                          "graph_builder::repeat (or use layers_from_structure)");
    // A repeat of rounds around it (or it is the rounds, around a smaller repeat of layers).
    for (std::size_t r = 0; r < g.repeats.size(); ++r) {
        const bool inside_best = detail::instance_of(g, g.repeats[r].parent, best) >= 0;
        if (static_cast<std::int32_t>(r) != best && !inside_best) continue;
        layer_partition rounds = detail::rounds_partition(g, static_cast<std::int32_t>(r));
        if (rounds.rounds > 1) {
            rounds.found_by = "scopes";
            return rounds;
        }
    }
    const std::size_t forward = detail::forward_count(g);
    std::vector<std::int64_t> layer_of(forward, -1);
    for (std::size_t i = 0; i < forward; ++i) {
        for (std::int32_t s = g.nodes[i].scope; s != no_id;) {
            const scope_desc& sd = g.scopes.at(static_cast<std::size_t>(s));
            if (sd.repeat == best) {
                layer_of[i] = sd.index;
                break;
            }
            s = sd.parent;
        }
    }
    auto p = detail::partition_by_layer(g, layer_of, g.repeats[static_cast<std::size_t>(best)].name);
    p.found_by = "scopes";
    return p;
}

LOOM_INLINE layer_partition layers_from_structure(const graph& g) {
    const std::size_t forward = detail::forward_count(g);
    // live[i]: activations made before node i and read at or after it (forward reads only).
    std::vector<int> delta(forward + 1, 0);
    std::vector<std::int64_t> last_read(g.tensors.size(), -1);
    for (std::size_t i = 0; i < forward; ++i)
        for (tensor_id t : g.nodes[i].inputs) last_read[static_cast<std::size_t>(t)] = static_cast<std::int64_t>(i);
    for (std::size_t t = 0; t < g.tensors.size(); ++t) {
        const tensor_desc& td = g.tensors[t];
        if (td.role != tensor_role::activation || td.producer == no_id) continue;
        const auto made = static_cast<std::int64_t>(td.producer);
        if (made >= static_cast<std::int64_t>(forward) || last_read[t] <= made) continue;
        ++delta[static_cast<std::size_t>(made + 1)];
        --delta[static_cast<std::size_t>(last_read[t] + 1)];
    }
    // Segments start at 0 and at every node before which exactly one activation is live.
    std::vector<std::size_t> starts{0};
    int live = 0;
    for (std::size_t i = 1; i < forward; ++i) {
        live += delta[i];
        if (live == 1) starts.push_back(i);
    }
    starts.push_back(forward);
    std::vector<std::vector<node_id>> segments;
    std::vector<std::uint64_t> segment_hash;
    for (std::size_t s = 0; s + 1 < starts.size(); ++s) {
        std::vector<node_id> nodes;
        for (std::size_t i = starts[s]; i < starts[s + 1]; ++i) nodes.push_back(static_cast<node_id>(i));
        segment_hash.push_back(detail::hash_nodes(g, nodes));
        segments.push_back(std::move(nodes));
    }
    // The longest run of a repeated unit of `period` segments (ties: the shortest period,
    // then the earliest start).
    const std::size_t k = segments.size();
    std::size_t best_start = 0, best_period = 0, best_count = 0;
    for (std::size_t period = 1; period * 2 <= k; ++period) {
        for (std::size_t start = 0; start + 2 * period <= k; ++start) {
            std::size_t count = 1;
            while (start + (count + 1) * period <= k) {
                bool same = true;
                for (std::size_t j = 0; j < period && same; ++j)
                    same = segment_hash[start + j] == segment_hash[start + count * period + j];
                if (!same) break;
                ++count;
            }
            if (count >= 2 && count * period > best_count * best_period) {
                best_start = start;
                best_period = period;
                best_count = count;
            }
        }
    }
    std::vector<std::int64_t> layer_of(forward, -1);
    for (std::size_t c = 0; c < best_count; ++c)
        for (std::size_t j = 0; j < best_period; ++j)
            for (node_id n : segments[best_start + c * best_period + j])
                layer_of[static_cast<std::size_t>(n)] = static_cast<std::int64_t>(c);
    auto p = detail::partition_by_layer(g, layer_of, "layer");
    p.found_by = "structure";
    return p;
}

}  // namespace loom::search
#endif  // LOOM_HEADER_DEFINITIONS
