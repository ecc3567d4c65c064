#pragma once
// Pipelines inside plan::resolve: stages and micro-batches written with the primitives
// (nnScaler §4). The plan value states them as parts (plan::stages, plan::micro_batches,
// plan::order; plan/rules.hpp stage_spec); plan::resolve (plan/resolve.hpp) lowers them to
// the stage list below and places it with place_stages.
//
//   * op-trans: every op is cut along the batch into `micro_batches` pieces, outermost;
//     within a stage, the plan's rules (data parallel, Megatron, ...) cut each micro-batch
//     further, over the stage's device group.
//   * op-assign: the pieces of the ops of stage s (a range of the repeated layers; ops
//     before the first layer go to the head stage, ops after the last to the tail stage)
//     are placed on the stage's device group, all micro-batches on the same devices.
//   * op-order: a pipeline schedule (schedule/) orders the (stage, micro-batch, pass)
//     blocks on every device; partition::apply_plan turns it into each device's program
//     order.
//
// Because micro-batches are pieces of one logical op, gradient accumulation is the
// ordinary sum of partial gradients that any batch split produces: a pipelined step equals
// the full-batch step. The loss keeps the full batch's normalizer.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/graph.hpp>
#include <loom/plan/op_partition.hpp>
#include <loom/plan/rules.hpp>

namespace loom::plan::detail {

struct pipeline_stage {
    std::int64_t first_layer = 0, last_layer = -1;  // inclusive range of the repeat's layers (last < 0: none)
    std::vector<int> devices;                       // the stage's device group
    std::optional<plan_spec> inner;                 // how the stage uses its group (default: the spec's)
};

struct pipeline_spec {
    std::string repeat = "blocks";  // the repeated layers that stages divide
    std::vector<pipeline_stage> stages;
    int micro_batches = 1;
    plan_spec inner;      // a plan for one group (devices = group size); none: every op whole on each device
    int head_stage = 0;   // where the ops before the first layer run (embeddings)
    int tail_stage = -1;  // where the ops after the last layer run (-1: the last stage)
    // Forward rounds (3F1B): a node under scope "<rounds_scope>.<r>" belongs to round r;
    // others to the next round after them, else the last. Empty: one round.
    std::string rounds_scope;
    int rounds = 1;
    std::string name;
};

// r for a node under scope "<name>.<r>" (an instance of a repeat called name, or a scope
// named so), or -1.
LOOM_INLINE int round_of(const graph& g, const node& n, const std::string& name);

inline bool has_dim(const node& n, dim_id d) {
    for (const auto& v : n.sig.vars)
        if (v.dim == d) return true;
    return false;
}

// Places the stages: the partitions (with op-assign to the stage groups) plus, per forward
// node, its stage, round, and whether its first split is the micro-batch split. The order
// is left to the caller (plan::resolve).
LOOM_INLINE resolved_plan place_stages(const pipeline_spec& spec, const graph& g);

}  // namespace loom::plan::detail

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::plan::detail {

LOOM_INLINE int round_of(const graph& g, const node& n, const std::string& name) {
    if (name.empty()) return -1;
    for (std::int32_t s = n.scope; s != no_id;) {
        const scope_desc& sd = g.scopes.at(static_cast<std::size_t>(s));
        if (sd.name == name && sd.index >= 0) return static_cast<int>(sd.index);
        const std::string prefix = name + ".";
        if (sd.name.size() > prefix.size() && sd.name.compare(0, prefix.size(), prefix) == 0 &&
            sd.name.find_first_not_of("0123456789", prefix.size()) == std::string::npos)
            return std::stoi(sd.name.substr(prefix.size()));
        s = sd.parent;
    }
    return -1;
}

LOOM_INLINE resolved_plan place_stages(const pipeline_spec& spec, const graph& g) {
    const auto stages = static_cast<int>(spec.stages.size());
    if (stages < 1) throw plan_error("pipeline: no stages; give at least one stage (a layer range and its devices)");
    if (spec.micro_batches < 1)
        throw plan_error("pipeline: micro_batches = " + std::to_string(spec.micro_batches) + "; use at least 1");
    if (spec.rounds < 1) throw plan_error("pipeline: rounds = " + std::to_string(spec.rounds) + "; use at least 1");
    const int tail = spec.tail_stage < 0 ? stages - 1 : spec.tail_stage;
    if (spec.head_stage < 0 || spec.head_stage >= stages || tail >= stages)
        throw plan_error("pipeline: the head stage " + std::to_string(spec.head_stage) + " or tail stage " +
                         std::to_string(tail) + " is not one of the " + std::to_string(stages) + " stages");
    int world = 0;
    for (int s = 0; s < stages; ++s) {
        const auto& st = spec.stages[static_cast<std::size_t>(s)];
        if (st.devices.empty())
            throw plan_error("pipeline: stage " + std::to_string(s) + " has no devices; give it a device group");
        for (int d : st.devices) {
            if (d < 0) throw plan_error("pipeline: stage " + std::to_string(s) + " lists device " + std::to_string(d));
            world = std::max(world, d + 1);
        }
    }

    // Each stage's inner plan, resolved for its group: once per distinct group size for the
    // stages that share the spec's plan (a 32-stage pipeline would otherwise partition the
    // whole graph 32 times over), once per stage for a plan of its own.
    std::vector<resolved_plan> resolved;
    std::vector<std::size_t> inner_of(static_cast<std::size_t>(stages));
    std::map<int, std::size_t> shared_by_group_size;
    zero_stage zero = zero_stage::none;
    for (int s = 0; s < stages; ++s) {
        const auto& st = spec.stages[static_cast<std::size_t>(s)];
        plan_spec p = st.inner ? *st.inner : spec.inner;
        const auto group = static_cast<int>(st.devices.size());
        if (p.devices == 0) p.devices = group;
        if (p.devices != group)
            throw plan_error("pipeline: stage " + std::to_string(s) + " has " + std::to_string(group) +
                             " devices but its plan '" + p.name + "' is for " + std::to_string(p.devices) +
                             "; give the stage a plan for its group size");
        // ZeRO is one rewrite of the whole training graph (an identity per parameter or
        // gradient), sharded over each stage's own group: every stage must ask for the same.
        if (s > 0 && p.zero != zero)
            throw plan_error("pipeline: stage " + std::to_string(s) + "'s plan '" + p.name + "' uses ZeRO stage " +
                             std::to_string(static_cast<int>(p.zero)) + " but stage 0's uses " +
                             std::to_string(static_cast<int>(zero)) + "; give every stage the same ZeRO stage");
        zero = p.zero;
        if (!st.inner) {
            if (auto it = shared_by_group_size.find(group); it != shared_by_group_size.end()) {
                inner_of[static_cast<std::size_t>(s)] = it->second;
                continue;
            }
            shared_by_group_size[group] = resolved.size();
        }
        inner_of[static_cast<std::size_t>(s)] = resolved.size();
        resolved.push_back(partition_ops(p, g));
    }

    resolved_plan out;
    out.stages = stages;
    out.micro_batches = spec.micro_batches;
    out.rounds = spec.rounds;
    out.devices = world;
    out.zero = zero;
    out.name = spec.name.empty() ? "pipeline x" + std::to_string(stages) + ", " +
                                            std::to_string(spec.micro_batches) + " micro-batches"
                                      : spec.name;
    const std::size_t forward = g.forward_node_count();
    out.forward.resize(forward);
    out.stage_of.assign(forward, 0);
    out.round_of.assign(forward, spec.rounds - 1);
    out.micro_split.assign(forward, false);

    // Ops outside the layers run on the head stage when layers follow them (embeddings, and
    // the inputs of each recycling round), else on the tail stage (the head and the loss).
    std::vector<std::int64_t> layer(forward);
    std::vector<bool> layers_after(forward + 1, false);
    for (std::size_t i = 0; i < forward; ++i) layer[i] = layer_index(g, g.nodes[i], spec.repeat);
    for (std::size_t i = forward; i-- > 0;) layers_after[i] = layers_after[i + 1] || layer[i] >= 0;
    // Ops outside the rounds join the next round (embeddings: round 0), else the last.
    std::vector<int> round(forward + 1, spec.rounds - 1);
    for (std::size_t i = forward; i-- > 0;) {
        const int r = round_of(g, g.nodes[i], spec.rounds_scope);
        if (r >= spec.rounds)
            throw plan_error("pipeline: node '" + g.nodes[i].name + "' is in round " + std::to_string(r) +
                             " but the plan has " + std::to_string(spec.rounds) + " rounds");
        round[i] = r >= 0 ? r : round[i + 1];
    }
    for (std::size_t i = 0; i < forward; ++i) {
        const node& n = g.nodes[i];
        int stage = -1;
        if (layer[i] >= 0) {
            for (int s = 0; s < stages && stage < 0; ++s) {
                const auto& st = spec.stages[static_cast<std::size_t>(s)];
                if (layer[i] >= st.first_layer && st.last_layer >= 0 && layer[i] <= st.last_layer) stage = s;
            }
            if (stage < 0)
                throw plan_error("pipeline: layer " + std::to_string(layer[i]) + " of '" + spec.repeat + "' (node '" + n.name +
                                 "') is in no stage's layer range; cover every layer");
        } else {
            stage = layers_after[i + 1] ? spec.head_stage : tail;
        }
        out.round_of[i] = round[i];
        out.stage_of[i] = stage;

        const auto& group = spec.stages[static_cast<std::size_t>(stage)].devices;
        op_partition within;
        within.replicas = static_cast<std::int64_t>(group.size());
        if (const op_partition* p = resolved[inner_of[static_cast<std::size_t>(stage)]].at(static_cast<node_id>(i)))
            within = *p;
        op_partition placed;
        placed.recompute = within.recompute;
        placed.replicas = within.replicas;
        const bool micro = spec.micro_batches > 1 && has_dim(n, Dim::Batch::id);
        if (micro) placed.splits.push_back({Dim::Batch::id, "", spec.micro_batches, false});
        for (const auto& s : within.splits) placed.splits.push_back(s);
        // One micro-batch's pieces: the micro-batch split is the outermost, and every
        // micro-batch runs on the same devices (op_partition::devices repeats the list).
        const std::int64_t per_micro = within.pieces();
        placed.devices.reserve(static_cast<std::size_t>(per_micro));
        for (std::int64_t q = 0; q < per_micro; ++q) {
            const int local = within.device_of(q);
            if (local < 0 || local >= static_cast<int>(group.size()))
                throw plan_error("pipeline: the plan of stage " + std::to_string(stage) + " puts a piece of '" + n.name +
                                 "' on device " + std::to_string(local) + " of a group of " + std::to_string(group.size()));
            placed.devices.push_back(group[static_cast<std::size_t>(local)]);
        }
        out.micro_split[i] = micro;
        out.forward[i] = std::move(placed);
    }
    return out;
}

}  // namespace loom::plan::detail
#endif  // LOOM_HEADER_DEFINITIONS
