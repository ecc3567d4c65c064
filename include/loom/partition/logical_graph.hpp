#pragma once
// The logical training graph a plan partitions: the model's forward graph, rewritten as
// the plan asks, then differentiated.
//
//   * ZeRO-3 inserts an identity after every parameter ("zero3/<param>"), so the plan can
//     split that identity over the data-parallel devices: each device then stores a shard
//     of the parameter and the pieces that need all of it gather it (nnScaler decouples
//     a tensor's partitioning from its consumer's this way).
//   * ZeRO-2 inserts an identity on every parameter gradient ("zero2/<param>"), split the
//     same way, so each device keeps only its shard of the gradient (the materializer
//     reduces each micro-batch's gradient onto it as soon as it is made).
//   * Decomposition: a node whose plan cuts a variable that a registered transformation
//     handles by rebuilding the op (plan/transformation.hpp; cross_entropy along its
//     vocabulary) is replaced by the ops the transformation builds, each with its own
//     partition.
//   * Recompute: backward nodes read recomputed copies of the outputs of ops marked for
//     recompute, so the forward copies die early. The copies are appended right before
//     their first backward reader and marked as backward nodes of the op they copy. A copy
//     is replayed from the kept outputs of other layers (instances of a recorded repeat) and
//     other stages: each layer's input is its checkpoint.
//
// Every rewrite rebuilds the graph node by node (nodes stay in a topological order) and
// reports where each original forward node went.
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/autograd/autograd.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/builder.hpp>
#include <loom/ops/identity.hpp>
#include <loom/plan/op_partition.hpp>
#include <loom/plan/transformation.hpp>

namespace loom::partition {

struct logical_graph_options {
    bool zero3_identities = false;
    bool zero2_identities = false;
    std::vector<bool> recompute;  // per forward node of the input graph
    // Per forward node of the input graph: the partition (splits bound to labels) of a
    // node to rebuild by the decomposition registered for one of its split variables.
    std::vector<std::optional<plan::op_partition>> decompose;
    // Pipelines: the stage of each forward node of the input graph (empty: no pipeline). A
    // recomputed copy is made from the outputs of its own stage only: a backward op reads the
    // kept forward output of an op in another stage, and recomputation stops there, so each
    // stage recomputes in its own backward blocks without waiting on another stage's.
    std::vector<int> stage_of_forward;
};

struct logical_graph {
    graph g;
    std::vector<node_id> forward_node;         // input forward node -> node of g
    std::vector<node_id> source_of;            // node of g -> input forward node (or no_id)
    std::map<tensor_id, node_id> zero3_identity;  // parameter of g -> its inserted identity
    std::map<tensor_id, node_id> zero2_identity;  // parameter of g -> identity on its gradient
    std::map<node_id, plan::op_partition> decomposed;  // node of g built by a decomposition -> its partition
    std::map<node_id, node_id> decomposed_from;         // node of g built by a decomposition -> input forward node
};

// The decomposition a partition asks for on node `n`: that of the first cut variable whose
// registered transformation rebuilds the op. `p`'s splits must be bound to labels.
inline const plan::transformation* decomposition_for(const node& n, const plan::op_partition& p) {
    for (const auto& s : p.splits) {
        if (!s.cuts()) continue;
        const auto* t = plan::transformation_registry::instance().find(*n.op, s.label);
        if (t && t->decompose) return t;
    }
    return nullptr;
}

namespace detail {

// Adds `from`'s inputs and parameters to `b` (same names, scopes, initialisers) and
// records where each went in `map`.
LOOM_INLINE void copy_leaves(graph_builder& b, const graph& from, std::vector<tensor_id>& map);

LOOM_INLINE node_id replay(graph_builder& b, const node& n, std::span<const tensor> ins, std::vector<tensor_id>& tmap,
                           bool map_outputs = true);

// The layer recomputation replays node n of g within: its innermost enclosing instance of a
// recorded repeat (no_id: none). A layer's input is its checkpoint: recomputing a layer
// replays its own ops from the kept output of the layer before, as Megatron-LM's full
// recomputation does, never the layers before it (which would hold every layer's
// activations at once).
LOOM_INLINE std::int32_t recompute_layer_of(const graph& g, node_id n);

}  // namespace detail

// Builds the logical training graph from a model graph (with or without a backward pass:
// an existing backward pass is dropped and rebuilt after the rewrites).
LOOM_INLINE logical_graph build_logical_graph(const graph& model, const logical_graph_options& options);

}  // namespace loom::partition

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::partition::detail {

LOOM_INLINE std::int32_t recompute_layer_of(const graph& g, node_id n) {
    for (std::int32_t sc = g.at(n).scope; sc != no_id;) {
        const scope_desc& sd = g.scopes.at(static_cast<std::size_t>(sc));
        if (sd.repeat != no_id) return sc;
        sc = sd.parent;
    }
    return static_cast<std::int32_t>(no_id);
}

LOOM_INLINE void copy_leaves(graph_builder& b, const graph& from, std::vector<tensor_id>& map) {
    for (tensor_id t : from.inputs) {
        const tensor_desc& d = from.tensor(t);
        auto scope = b.enter_scope(d.scope);
        map[static_cast<std::size_t>(t)] = b.add_leaf(d.name, d.dims, d.kind, tensor_role::input).id;
    }
    for (tensor_id t : from.parameters) {
        const tensor_desc& d = from.tensor(t);
        auto scope = b.enter_scope(d.scope);
        tensor p = b.add_leaf(d.name, d.dims, d.kind, tensor_role::parameter);
        b.mutable_graph().tensor(p.id).init = d.init;
        map[static_cast<std::size_t>(t)] = p.id;
    }
}

LOOM_INLINE node_id replay(graph_builder& b, const node& n, std::span<const tensor> ins, std::vector<tensor_id>& tmap,
                           bool map_outputs) {
    auto scope = b.enter_scope(n.scope);
    std::vector<tensor> outs = n.op->apply(b, ins, n.attrs);
    graph& g = b.mutable_graph();
    auto id = static_cast<node_id>(g.nodes.size() - 1);
    g.nodes.back().name = n.name;
    if (map_outputs)
        for (std::size_t o = 0; o < outs.size(); ++o) {
            tmap.at(static_cast<std::size_t>(n.outputs[o])) = outs[o].id;
            g.tensor(outs[o].id).name = n.name + (outs.size() == 1 ? "" : ":" + std::to_string(o));
        }
    return id;
}
}  // namespace loom::partition::detail

namespace loom::partition {

LOOM_INLINE logical_graph build_logical_graph(const graph& model, const logical_graph_options& options) {
    if (model.loss == no_id) throw usage_error("partition: the graph has no loss; call graph_builder::set_loss");
    const std::size_t forward = model.forward_node_count();
    if (!options.recompute.empty() && options.recompute.size() != forward)
        throw usage_error("partition: the recompute flags cover " + std::to_string(options.recompute.size()) +
                          " nodes but the graph has " + std::to_string(forward) + " forward nodes");

    logical_graph out;
    graph_builder b;
    b.adopt_scopes(model);
    std::vector<tensor_id> tmap(model.tensors.size(), no_id);
    detail::copy_leaves(b, model, tmap);
    // ZeRO-3: one identity per parameter, placed before the parameter's first reader.
    std::vector<tensor_id> staged(model.tensors.size(), no_id);
    auto stage = [&](tensor_id param) {
        if (staged[static_cast<std::size_t>(param)] != no_id) return;
        const tensor_desc& d = model.tensor(param);
        auto scope = b.enter_scope(d.scope);
        tensor y = ops::identity(b.handle(tmap[static_cast<std::size_t>(param)]));
        graph& g = b.mutable_graph();
        g.nodes.back().name = "zero3/" + d.name;
        g.tensor(y.id).name = "zero3/" + d.name;
        out.zero3_identity[tmap[static_cast<std::size_t>(param)]] = static_cast<node_id>(g.nodes.size() - 1);
        staged[static_cast<std::size_t>(param)] = y.id;
    };

    out.forward_node.assign(forward, no_id);
    for (std::size_t i = 0; i < forward; ++i) {
        const node& n = model.nodes[i];
        std::vector<tensor> ins;
        for (tensor_id t : n.inputs) {
            if (options.zero3_identities && model.tensor(t).role == tensor_role::parameter) {
                stage(t);
                ins.push_back(b.handle(staged[static_cast<std::size_t>(t)]));
            } else {
                tensor_id m = tmap[static_cast<std::size_t>(t)];
                if (m == no_id) throw error("partition: node '" + n.name + "' reads a tensor produced after it");
                ins.push_back(b.handle(m));
            }
        }
        if (i < options.decompose.size() && options.decompose[i]) {
            const plan::op_partition& p = *options.decompose[i];
            const plan::transformation* t = decomposition_for(n, p);
            if (!t) throw error("partition: node '" + n.name + "' has no decomposition for " + p.describe());
            auto scope = b.enter_scope(n.scope);
            const std::size_t first = b.view().nodes.size();
            std::vector<plan::op_partition> parts;
            std::vector<tensor> outs = t->decompose(b, n, ins, p, parts);
            graph& g = b.mutable_graph();
            const std::size_t built = g.nodes.size() - first;
            if (outs.size() != n.outputs.size() || parts.size() != built || built == 0)
                throw error("partition: the decomposition of " + std::string(n.op->name) + " '" + n.name + "' (" +
                            t->description + ") built " + std::to_string(built) + " nodes with " +
                            std::to_string(parts.size()) + " partitions and " + std::to_string(outs.size()) +
                            " outputs; it must give one partition per node it appends and one output per output of the op");
            for (std::size_t k = 0; k < built; ++k) {
                g.nodes[first + k].name = n.name + "/" + std::string(g.nodes[first + k].op->name);
                out.decomposed[static_cast<node_id>(first + k)] = std::move(parts[k]);
                out.decomposed_from[static_cast<node_id>(first + k)] = static_cast<node_id>(i);
            }
            for (std::size_t o = 0; o < outs.size(); ++o) {
                tmap.at(static_cast<std::size_t>(n.outputs[o])) = outs[o].id;
                g.tensor(outs[o].id).name = n.name + (outs.size() == 1 ? "" : ":" + std::to_string(o));
            }
            out.forward_node[i] = g.tensor(outs[0].id).producer;
            continue;
        }
        out.forward_node[i] = detail::replay(b, n, ins, tmap);
    }
    b.set_loss(b.handle(tmap.at(static_cast<std::size_t>(model.loss))));
    build_backward(b);

    // ZeRO-2: the gradient each optimizer shard reads goes through an identity the plan splits.
    if (options.zero2_identities) {
        graph& g0 = b.mutable_graph();
        auto grads = g0.gradients;
        for (auto& [param, grad] : grads) {
            const std::string pname = g0.tensor(param).name;
            graph_builder::backward_guard guard(b, g0.tensor(grad).producer == no_id ? 0 : g0.tensor(grad).producer);
            auto scope = b.enter_scope(g0.tensor(param).scope);
            tensor y = ops::identity(b.handle(grad));
            graph& g = b.mutable_graph();
            g.nodes.back().name = "zero2/" + pname;
            g.nodes.back().forward_of = no_id;
            g.tensor(grad).role = tensor_role::activation;
            g.tensor(grad).gradient_of = no_id;
            g.tensor(grad).name = "grad/" + pname + ".sum";
            g.tensor(y.id).role = tensor_role::gradient;
            g.tensor(y.id).gradient_of = param;
            g.tensor(y.id).twin_of = {param};
            g.tensor(y.id).name = "grad/" + pname;
            out.zero2_identity[param] = static_cast<node_id>(g.nodes.size() - 1);
        }
        for (auto& [param, grad] : b.mutable_graph().gradients) {
            node_id id = out.zero2_identity.at(param);
            grad = b.view().at(id).outputs[0];
        }
    }

    graph g = std::move(b).take();
    bool any_recompute = false;
    for (bool r : options.recompute) any_recompute = any_recompute || r;
    for (const auto& [n, p] : out.decomposed) any_recompute = any_recompute || p.recompute;
    if (!any_recompute) {
        out.g = std::move(g);
    } else {
        // Rebuild once more, giving backward readers of recomputed outputs fresh copies.
        std::vector<bool> recompute(g.nodes.size(), false);
        for (std::size_t i = 0; i < options.recompute.size(); ++i)
            if (options.recompute[i]) recompute[static_cast<std::size_t>(out.forward_node[i])] = true;
        for (const auto& [n, p] : out.decomposed)
            if (p.recompute) recompute[static_cast<std::size_t>(n)] = true;
        // The stage of each node of g (-1: none), and whether two nodes may share copies.
        std::vector<int> stage(g.nodes.size(), -1);
        if (!options.stage_of_forward.empty()) {
            for (std::size_t i = 0; i < forward && i < options.stage_of_forward.size(); ++i)
                stage[static_cast<std::size_t>(out.forward_node[i])] = options.stage_of_forward[i];
            for (auto [n, i] : out.decomposed_from)
                if (static_cast<std::size_t>(i) < options.stage_of_forward.size())
                    stage[static_cast<std::size_t>(n)] = options.stage_of_forward[static_cast<std::size_t>(i)];
            for (std::size_t i = 0; i < g.nodes.size(); ++i)
                if (g.nodes[i].forward_of != no_id) stage[i] = stage[static_cast<std::size_t>(g.nodes[i].forward_of)];
        }
        auto same_stage = [&](node_id a, std::size_t b) {
            const int sa = stage[static_cast<std::size_t>(a)], sb = stage[b];
            return sa < 0 || sb < 0 || sa == sb;
        };
        auto layer_of = [&](node_id n) { return detail::recompute_layer_of(g, n); };
        graph_builder r;
        r.adopt_scopes(g);
        std::vector<tensor_id> map(g.tensors.size(), no_id), copy(g.tensors.size(), no_id);
        detail::copy_leaves(r, g, map);
        std::vector<node_id> new_id(g.nodes.size(), no_id);
        // A recomputed copy of tensor t (t produced by a recompute node), made on demand.
        std::function<tensor_id(tensor_id)> recomputed = [&](tensor_id t) -> tensor_id {
            auto ti = static_cast<std::size_t>(t);
            if (copy[ti] != no_id) return copy[ti];
            const node& n = g.at(g.tensor(t).producer);
            std::vector<tensor> ins;
            for (tensor_id in : n.inputs) {
                node_id p = g.tensor(in).producer;
                const node_id consumer = g.tensor(t).producer;
                bool again = p != no_id && recompute[static_cast<std::size_t>(p)] &&
                             same_stage(p, static_cast<std::size_t>(consumer)) && layer_of(p) == layer_of(consumer);
                ins.push_back(r.handle(again ? recomputed(in) : map[static_cast<std::size_t>(in)]));
            }
            auto forward_of = new_id[static_cast<std::size_t>(g.tensor(t).producer)];
            graph_builder::backward_guard guard(r, forward_of);
            std::vector<tensor_id> scratch(g.tensors.size(), no_id);
            detail::replay(r, n, ins, scratch);
            graph& rg = r.mutable_graph();
            rg.nodes.back().name = n.name + "/recompute";
            for (std::size_t o = 0; o < n.outputs.size(); ++o) {
                copy[static_cast<std::size_t>(n.outputs[o])] = rg.nodes.back().outputs[o];
                rg.tensor(rg.nodes.back().outputs[o]).name = g.tensor(n.outputs[o]).name + "/recompute";
                rg.tensor(rg.nodes.back().outputs[o]).twin_of = {map[static_cast<std::size_t>(n.outputs[o])]};
            }
            return copy[ti];
        };
        for (std::size_t i = 0; i < g.nodes.size(); ++i) {
            const node& n = g.nodes[i];
            std::vector<tensor> ins;
            for (tensor_id in : n.inputs) {
                node_id p = g.tensor(in).producer;
                bool use_copy = n.backward && p != no_id && recompute[static_cast<std::size_t>(p)] &&
                                !recompute[i] && same_stage(p, i);
                ins.push_back(r.handle(use_copy ? recomputed(in) : map[static_cast<std::size_t>(in)]));
            }
            node_id forward_of = n.forward_of == no_id ? no_id : new_id[static_cast<std::size_t>(n.forward_of)];
            std::optional<graph_builder::backward_guard> guard;
            if (n.backward && forward_of != no_id) guard.emplace(r, forward_of);
            new_id[i] = detail::replay(r, n, ins, map);
            graph& rg = r.mutable_graph();
            rg.nodes.back().backward = n.backward;
            rg.nodes.back().forward_of = forward_of;
            for (tensor_id o : n.outputs) {
                const tensor_desc& d = g.tensor(o);
                tensor_desc& nd = rg.tensor(map[static_cast<std::size_t>(o)]);
                nd.name = d.name;
                nd.role = d.role;
                nd.gradient_of = d.gradient_of == no_id ? no_id : map[static_cast<std::size_t>(d.gradient_of)];
                nd.twin_of.clear();
                for (tensor_id twin : d.twin_of) nd.twin_of.push_back(map[static_cast<std::size_t>(twin)]);
            }
        }
        graph& rg = r.mutable_graph();
        rg.loss = map[static_cast<std::size_t>(g.loss)];
        rg.forward_nodes = g.forward_nodes;  // the replay keeps the node order
        for (auto [param, grad] : g.gradients)
            rg.gradients.emplace_back(map[static_cast<std::size_t>(param)], map[static_cast<std::size_t>(grad)]);
        std::map<tensor_id, node_id> z3, z2;
        for (auto [p, n] : out.zero3_identity) z3[map[static_cast<std::size_t>(p)]] = new_id[static_cast<std::size_t>(n)];
        for (auto [p, n] : out.zero2_identity) z2[map[static_cast<std::size_t>(p)]] = new_id[static_cast<std::size_t>(n)];
        std::map<node_id, plan::op_partition> decomposed;
        for (auto& [n, p] : out.decomposed) decomposed[new_id[static_cast<std::size_t>(n)]] = std::move(p);
        out.decomposed = std::move(decomposed);
        std::map<node_id, node_id> decomposed_from;
        for (auto [n, i] : out.decomposed_from) decomposed_from[new_id[static_cast<std::size_t>(n)]] = i;
        out.decomposed_from = std::move(decomposed_from);
        out.zero3_identity = std::move(z3);
        out.zero2_identity = std::move(z2);
        for (auto& f : out.forward_node) f = new_id[static_cast<std::size_t>(f)];
        out.g = std::move(r).take();
    }
    out.source_of.assign(out.g.nodes.size(), no_id);
    for (std::size_t i = 0; i < out.forward_node.size(); ++i)
        out.source_of[static_cast<std::size_t>(out.forward_node[i])] = static_cast<node_id>(i);
    for (auto [n, i] : out.decomposed_from) out.source_of[static_cast<std::size_t>(n)] = i;
    return out;
}

}  // namespace loom::partition
#endif  // LOOM_HEADER_DEFINITIONS
