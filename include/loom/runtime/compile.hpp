#pragma once
// Turns one device's graph into a program: the nodes that the wanted tensors depend on,
// in graph order (or a given op-order), with every intermediate placed in a shared arena by liveness.
#include <algorithm>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/runtime/memory_planner.hpp>
#include <loom/runtime/program.hpp>

namespace loom {

struct compile_options {
    precision prec = precision::f32;
    bool include_backward = true;       // false: the forward pass only (evaluation)
    std::vector<tensor_id> outputs;     // extra tensors the caller wants to read after a run
    // Keep every node even if no wanted tensor depends on it: a device's part of a
    // partitioned graph sends pieces other devices need.
    bool keep_every_node = false;
    // The order to run the nodes in (op-order: a pipeline schedule's); empty: graph order.
    // Must list every node once and run each after the producers of its inputs.
    std::vector<node_id> order;
};

LOOM_INLINE program compile_program(const graph& g, const compile_options& options = {});

}  // namespace loom

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom {

LOOM_INLINE program compile_program(const graph& g, const compile_options& options) {
    program p;
    p.source = &g;
    p.prec = options.prec;
    p.buffers.resize(g.tensors.size());

    // Wanted tensors: the loss, parameter gradients (when training) and explicit outputs.
    // Training binds each parameter a gradient updates too, whether an op here reads it or
    // not (a device may store a part of it whose readers all run on other devices): the
    // optimizer updates it there.
    std::vector<bool> wanted(g.tensors.size(), false);
    auto want = [&](tensor_id t) {
        if (t < 0 || static_cast<std::size_t>(t) >= g.tensors.size())
            throw usage_error("compile_program: output tensor id " + std::to_string(t) + " is not in the graph");
        wanted[static_cast<std::size_t>(t)] = true;
    };
    if (g.loss != no_id) want(g.loss);
    if (options.include_backward)
        for (auto [param, grad] : g.gradients) {
            want(grad);
            want(param);
        }
    for (tensor_id t : options.outputs) want(t);

    // Keep the nodes some wanted tensor depends on (reverse sweep over a topological order).
    std::vector<bool> needed = wanted;
    std::vector<bool> keep(g.nodes.size(), false);
    for (std::size_t i = g.nodes.size(); i-- > 0;) {
        const node& n = g.nodes[i];
        if (n.backward && !options.include_backward) continue;
        bool any = options.keep_every_node || std::any_of(n.outputs.begin(), n.outputs.end(),
                               [&](tensor_id t) { return needed[static_cast<std::size_t>(t)]; });
        if (!any) continue;
        keep[i] = true;
        for (tensor_id t : n.inputs) needed[static_cast<std::size_t>(t)] = true;
    }
    if (options.order.empty()) {
        for (std::size_t i = 0; i < g.nodes.size(); ++i)
            if (keep[i]) p.steps.push_back({instruction::kind::compute, static_cast<node_id>(i)});
    } else {
        if (options.order.size() != g.nodes.size())
            throw usage_error("compile_program: the node order lists " + std::to_string(options.order.size()) +
                              " nodes but the graph has " + std::to_string(g.nodes.size()) + "; list every node once");
        std::vector<bool> done(g.nodes.size(), false);
        for (node_id id : options.order) {
            if (id < 0 || static_cast<std::size_t>(id) >= g.nodes.size() || done[static_cast<std::size_t>(id)])
                throw usage_error("compile_program: the node order lists node " + std::to_string(id) +
                                  (id >= 0 && static_cast<std::size_t>(id) < g.nodes.size() ? " twice" : ", which is not in the graph") +
                                  "; list every node once");
            const node& n = g.at(id);
            for (tensor_id t : n.inputs) {
                node_id producer = g.tensor(t).producer;
                if (producer != no_id && !done[static_cast<std::size_t>(producer)])
                    throw usage_error("compile_program: the node order runs '" + n.name + "' before '" +
                                      g.at(producer).name + "', which produces its input '" + g.tensor(t).name +
                                      "'; order every node after the producers of its inputs");
            }
            done[static_cast<std::size_t>(id)] = true;
            if (keep[static_cast<std::size_t>(id)]) p.steps.push_back({instruction::kind::compute, id});
        }
    }

    // Bound: everything that outlives a step or is fed from outside.
    for (std::size_t t = 0; t < g.tensors.size(); ++t) {
        const tensor_desc& d = g.tensors[t];
        if (!needed[t]) continue;
        bool external = d.role != tensor_role::activation || wanted[t];
        p.buffers[t].bytes = tensor_bytes(g, static_cast<tensor_id>(t), p.prec);
        if (external) {
            p.buffers[t].where = buffer::place::bound;
            p.bound.push_back(static_cast<tensor_id>(t));
        } else if (d.producer == no_id) {
            throw usage_error("compile_program: tensor '" + d.name + "' is read but nothing produces it");
        }
    }

    // Lifetimes of arena tensors in step indices.
    std::vector<std::int64_t> first(g.tensors.size(), -1), last(g.tensors.size(), -1);
    for (std::size_t s = 0; s < p.steps.size(); ++s) {
        const node& n = g.at(p.steps[s].node);
        for (tensor_id t : n.outputs) {
            first[static_cast<std::size_t>(t)] = static_cast<std::int64_t>(s);
            last[static_cast<std::size_t>(t)] = std::max<std::int64_t>(last[static_cast<std::size_t>(t)], static_cast<std::int64_t>(s));
        }
        for (tensor_id t : n.inputs) last[static_cast<std::size_t>(t)] = static_cast<std::int64_t>(s);
    }
    std::vector<buffer_lifetime> requests;
    std::vector<tensor_id> owners;
    for (std::size_t t = 0; t < g.tensors.size(); ++t) {
        if (p.buffers[t].where == buffer::place::bound || first[t] < 0) continue;
        p.buffers[t].where = buffer::place::arena;
        p.buffers[t].bytes = tensor_bytes(g, static_cast<tensor_id>(t), p.prec);
        requests.push_back({p.buffers[t].bytes, first[t], std::max(first[t], last[t])});
        owners.push_back(static_cast<tensor_id>(t));
    }
    memory_plan plan = plan_memory(requests);
    for (std::size_t i = 0; i < owners.size(); ++i) p.buffers[static_cast<std::size_t>(owners[i])].offset = plan.offsets[i];
    p.arena_bytes = plan.peak;
    p.unplanned_bytes = plan.unplanned;
    return p;
}

}  // namespace loom
#endif  // LOOM_HEADER_DEFINITIONS
