#pragma once
// Applying a plan: one logical training graph becomes one ordered program per device over
// vTensors, with the communication between them materialized and the plan's op-order applied.
//
//   1. The logical graph is built (partition/logical_graph.hpp): rewrites, then autograd.
//   2. Every node gets a partition: forward nodes from the plan, backward nodes mirror the
//      forward op they differentiate (the same splits, matched through the axes of the
//      tensors both touch; a split along a variable the backward op lacks or freezes
//      becomes replication, so piece i of the backward runs where piece i of the forward
//      ran).
//   3. Each piece's variables get index ranges; from them the box every input piece needs
//      and the vTensor every output piece produces (partial where a contracted dim is cut).
//   4. Parameters and inputs are stored per device as the smallest box holding what that
//      device's pieces read, so leaves never move.
//   5. Nodes are emitted in graph order; before a node, each input is materialized on the
//      devices of its pieces (partition/materialize.hpp): local chunk/concat/sum where the
//      device holds the data, else the cheapest collective or send/recv. Every device sees
//      the collectives in the same global order, so the programs cannot deadlock by
//      construction; partition/deadlock.hpp checks any reordering.
//      An op linear in its inputs (the add of two partial gradients) keeps the splits
//      along dims it lacks as summand axes when its inputs are partial sums: piece k adds
//      summand k of each, and the reduction waits for the parameter's gradient.
//   6. Parameter gradients are materialized on the boxes their parameters are stored in
//      (or on the optimizer's shards under ZeRO-2), and the loss on every device.
#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/fingerprint.hpp>
#include <loom/partition/deadlock.hpp>
#include <loom/partition/logical_graph.hpp>
#include <loom/partition/materialize.hpp>
#include <loom/partition/piece_layout.hpp>
#include <loom/partition/pipeline_order.hpp>
#include <loom/plan/op_partition.hpp>
#include <loom/plan/resolve.hpp>
#include <loom/plan/rules.hpp>

namespace loom::partition {

struct apply_options {
    transfer_cost_model cost{};
};

// The ordered per-device programs of a plan resolved against `model` (plan::resolve).
LOOM_INLINE partitioned_graph apply_plan(const graph& model, const plan::resolved_plan& plan, const apply_options& options = {});

// The ordered per-device programs of any plan: plan::resolve, then the above.
//   auto pg = partition::apply_plan(model.ir(), plan::compose(...).choose("m", 4));
inline partitioned_graph apply_plan(const graph& model, const plan::plan_spec& plan, const apply_options& options = {}) {
    return apply_plan(model, plan::resolve(plan, model), options);
}

template <class Plan>
    requires requires(const Plan& p) {
        { p.spec() } -> std::convertible_to<plan::plan_spec>;
    }
partitioned_graph apply_plan(const graph& model, const Plan& plan, const apply_options& options = {}) {
    return apply_plan(model, plan.resolve(model), options);
}

}  // namespace loom::partition

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::partition {

LOOM_INLINE partitioned_graph apply_plan(const graph& model, const plan::resolved_plan& plan, const apply_options& options) {
    if (plan.devices < 1) throw plan_error("plan: the device count is " + std::to_string(plan.devices) + "; it must be at least 1");
    const std::size_t forward = model.forward_node_count();
    if (plan.forward.size() > forward)
        throw plan_error("plan: it covers " + std::to_string(plan.forward.size()) + " forward nodes but the graph has " +
                         std::to_string(forward) + "; resolve the plan against this graph");

    logical_graph_options lo;
    lo.zero3_identities = plan.zero == plan::zero_stage::parameters;
    lo.zero2_identities = plan.zero == plan::zero_stage::gradients;
    lo.recompute.assign(forward, false);
    lo.decompose.resize(forward);
    lo.stage_of_forward = plan.stage_of;
    std::vector<std::string> notes;
    for (std::size_t i = 0; i < forward; ++i) {
        const auto* p = plan.at(static_cast<node_id>(i));
        if (!p) continue;
        lo.recompute[i] = p->recompute;
        // A cut that a registered transformation makes by rebuilding the op (cross_entropy
        // along its vocabulary): checked against the op as written, then rebuilt.
        const node& n = model.nodes[i];
        plan::op_partition bound = bind_partition(n, *p, plan.devices, true, notes);
        if (decomposition_for(n, bound)) lo.decompose[i] = std::move(bound);
    }

    partitioned_graph out;
    out.world = plan.devices;
    out.zero = plan.zero;
    out.plan_name = plan.name;
    out.logical = std::make_unique<logical_graph>(build_logical_graph(model, lo));
    out.notes = std::move(notes);
    const graph& g = out.logical->g;

    // 2. Partitions of every node.
    plan::op_partition everywhere;
    everywhere.replicas = plan.devices;
    std::vector<plan::op_partition> parts(g.nodes.size());
    std::vector<bool> assigned(g.nodes.size(), false);
    for (const auto& [n, p] : out.logical->decomposed) {
        parts[static_cast<std::size_t>(n)] = bind_partition(g.at(n), p, plan.devices, true, out.notes);
        assigned[static_cast<std::size_t>(n)] = true;
    }
    for (std::size_t i = 0; i < forward; ++i) {
        node_id n = out.logical->forward_node[i];
        if (assigned[static_cast<std::size_t>(n)]) continue;
        const plan::op_partition* p = plan.at(static_cast<node_id>(i));
        parts[static_cast<std::size_t>(n)] = bind_partition(g.at(n), p ? *p : everywhere, plan.devices, true, out.notes);
        assigned[static_cast<std::size_t>(n)] = true;
    }
    // Pipelines: the stage of a node of g, from its forward op (-1: none, or no pipeline).
    const bool staged = !plan.stage_of.empty();
    auto stage_of_node = [&](node_id i) {
        const node& n = g.at(i);
        const node_id forward = n.forward_of != no_id ? n.forward_of : i;
        const node_id source = out.logical->source_of[static_cast<std::size_t>(forward)];
        if (source == no_id || static_cast<std::size_t>(source) >= plan.stage_of.size()) return -1;
        return plan.stage_of[static_cast<std::size_t>(source)];
    };
    // ZeRO identities: split the parameter's first dim over its data-parallel devices. Without
    // a pipeline those are all devices. In a pipeline they are the group of the stage that
    // reads the parameter (ZeRO-3 shards a parameter that several stages read, the tied
    // embedding, over the first reader's stage; the others receive it point to point).
    // ZeRO-2 shards the gradient of a parameter that one stage reads over that stage's group,
    // and keeps that of a parameter several stages read whole on all of them, where each
    // copy's optimizer needs all of it. The stage of each identity, for the materializer.
    std::map<node_id, int> identity_stage;
    std::map<tensor_id, std::vector<node_id>> forward_readers;  // of parameters and ZeRO-3 copies, in graph order
    if (staged && plan.zero != plan::zero_stage::none) {
        std::set<tensor_id> wanted;
        for (auto [param, n] : out.logical->zero3_identity) wanted.insert(g.at(n).outputs[0]);
        for (auto [param, n] : out.logical->zero2_identity) wanted.insert(param);
        for (std::size_t r = 0; r < g.nodes.size(); ++r) {
            const node& reader = g.nodes[r];
            if (reader.backward || reader.forward_of != no_id) continue;
            for (tensor_id t : reader.inputs)
                if (wanted.count(t)) {
                    auto& list = forward_readers[t];
                    if (list.empty() || list.back() != static_cast<node_id>(r)) list.push_back(static_cast<node_id>(r));
                }
        }
    }
    auto shard = [&](tensor_id param, node_id n, bool parameters) {
        const node& nd = g.at(n);
        const tensor_desc& t = g.tensor(nd.inputs[0]);
        std::vector<int> group;
        bool across_stages = false;
        if (staged) {
            // The readers of the parameter (through the identity under ZeRO-3), in graph order.
            const tensor_id read = parameters ? nd.outputs[0] : param;
            int first_stage = -1;
            std::vector<int> all;
            for (node_id r : forward_readers[read]) {
                const int st = stage_of_node(r);
                const plan::op_partition& rp = parts[static_cast<std::size_t>(r)];
                std::vector<int> devices;
                for (std::int64_t q = 0; q < rp.pieces(); ++q) devices.push_back(rp.device_of(q));
                if (group.empty()) {
                    first_stage = st;
                    group = devices;
                }
                across_stages = across_stages || st != first_stage;
                all.insert(all.end(), devices.begin(), devices.end());
            }
            if (across_stages && !parameters) group = all;
            std::sort(group.begin(), group.end());
            group.erase(std::unique(group.begin(), group.end()), group.end());
            // A ZeRO-2 identity kept whole on several stages belongs to none of them.
            identity_stage[n] = across_stages && !parameters ? -1 : first_stage;
        }
        const int shards = group.empty() ? plan.devices : static_cast<int>(group.size());
        plan::op_partition p;
        if (staged && across_stages && !parameters) {
            p.replicas = shards;
            p.devices = group;
            out.notes.push_back("ZeRO-2: the gradient of '" + t.name + "' is read by several pipeline stages; each keeps all of it");
        } else if (t.dims.rank() == 0 || t.dims.extent(0) % shards != 0) {
            p.replicas = shards;
            p.devices = group;
            out.notes.push_back("ZeRO: '" + t.name + "' (" + t.dims.to_string() + ") is not divisible into " +
                                std::to_string(shards) + " shards along its first dim; it stays replicated");
        } else {
            p.splits.push_back({t.dims.dim(0), "...0", shards});
            p.devices = group;
        }
        parts[static_cast<std::size_t>(n)] = bind_partition(nd, p, plan.devices, true, out.notes);
        assigned[static_cast<std::size_t>(n)] = true;
    };
    for (auto [param, n] : out.logical->zero3_identity) shard(param, n, true);
    for (auto [param, n] : out.logical->zero2_identity) shard(param, n, false);
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
        if (assigned[i]) continue;
        const node& n = g.nodes[i];
        // Mirror the forward op (backward nodes), or the producer of the first input (the
        // seed of the backward pass, zero gradients of unused parameters).
        node_id like = n.forward_of;
        if (like == no_id && !n.inputs.empty()) like = g.tensor(n.inputs[0]).producer;
        const plan::op_partition& source = like != no_id ? parts[static_cast<std::size_t>(like)] : everywhere;
        mirrored_partition mirrored = mirror_partition(g, source, like == no_id ? nullptr : &g.at(like), n);
        if (n.op->linear) {
            // Summands of partial sums add summand by summand (the tied embedding's gradient).
            std::vector<std::int64_t> summands;
            for (tensor_id in : n.inputs) {
                const node_id producer = g.tensor(in).producer;
                if (producer == no_id || !assigned[static_cast<std::size_t>(producer)]) {
                    summands.clear();
                    break;
                }
                const node& pn = g.at(producer);
                const auto o = static_cast<std::size_t>(std::find(pn.outputs.begin(), pn.outputs.end(), in) - pn.outputs.begin());
                summands.push_back(summands_of(pn, parts[static_cast<std::size_t>(producer)], o));
            }
            sum_partial_inputs(n, mirrored, summands);
        }
        parts[i] = bind_partition(n, std::move(mirrored.partition), plan.devices, false, out.notes, mirrored.absent);
        assigned[i] = true;
    }

    // 3. Pieces.
    out.layouts.resize(g.nodes.size());
    for (std::size_t i = 0; i < g.nodes.size(); ++i)
        out.layouts[i] = layout_pieces(g, g.nodes[i], std::move(parts[i]));

    // 4-6. Devices, leaves, materialization.
    materializer m(out, options.cost);
    // Pipelines: tensors that cross stages move point to point only (materializer::set_stages).
    if (staged) {
        std::vector<int> stage(g.nodes.size(), -1);
        for (std::size_t i = 0; i < g.nodes.size(); ++i) {
            const node& n = g.nodes[i];
            const node_id forward = n.forward_of != no_id ? n.forward_of : static_cast<node_id>(i);
            auto it = identity_stage.find(forward);
            stage[i] = it != identity_stage.end() ? it->second : stage_of_node(static_cast<node_id>(i));
        }
        m.set_stages(std::move(stage));
    }
    m.store_leaves();
    for (std::size_t i = 0; i < g.nodes.size(); ++i) m.emit_node(static_cast<node_id>(i));
    m.finish();
    // 7. op-order: the plan's schedule orders every device's program (checked: data flow,
    //    deadlock); without one, devices run in plan order.
    if (plan.order) detail::order_by_schedule(out, plan, *plan.order);  // checks the order too
    out.checked_order = order_fingerprint(out);
    out.model_fingerprint = model_fingerprint(model);
    return out;
}

}  // namespace loom::partition
#endif  // LOOM_HEADER_DEFINITIONS
