#pragma once
// The searcher's answer as the one plan value: a configuration of the searched space
// (plan_space.hpp) written with the plan's parts, so that it is applied, explained, stored
// and trained like any plan a user writes.
//
//   auto found = search::branch_and_bound(ctx, search::search_space{});
//   plan::plan_spec plan = search::to_plan(found.best);
//   auto pg = partition::apply_plan(model.ir(), plan);
//
// Inside a pipeline stage (tp * dp devices) the rules are Megatron's tensor parallelism with
// data parallelism around it (plan::presets::megatron(tp, dp)), or plain data parallelism
// when tp is 1. Pipelines are plan::stages over the layers of "blocks" (explicit boundaries
// when the chunks are uneven), micro-batches and the configuration's order. Each layer's
// recompute policy becomes plan::presets::recompute_layers for that layer: selective
// recomputes the layer's attention core, full the whole layer;
// Coshard splits a recomputed layer's attention and MLP into coshard times more pieces,
// colocated on each device. The interlaced pipeline splits the embedding, the LM head and
// the loss by vocabulary over all devices.
#include <cstdint>
#include <string>
#include <vector>

#include <loom/core/linkage.hpp>
#include <loom/ops/all.hpp>
#include <loom/plan/presets.hpp>
#include <loom/plan/rules.hpp>
#include <loom/search/plan_space.hpp>

namespace loom::search {

namespace detail {

inline plan::selector layer_scope(std::int64_t layer, const std::string& part) {
    plan::selector s;
    s.scope = "blocks." + std::to_string(layer) + part;
    return s;
}

LOOM_INLINE plan::rule split_rule(plan::selector on, int dp, plan::split_spec inner, const std::string& origin);

}  // namespace detail

LOOM_INLINE plan::plan_spec to_plan(const configuration& c);

}  // namespace loom::search

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::search::detail {

LOOM_INLINE plan::rule split_rule(plan::selector on, int dp, plan::split_spec inner, const std::string& origin) {
    std::vector<plan::split_spec> splits;
    if (dp > 1) splits.push_back({Dim::Batch::id, "", {dp, "", {}}, false});
    splits.push_back(std::move(inner));
    return {std::move(on), std::move(splits), std::nullopt, std::nullopt, origin, true};
}
}  // namespace loom::search::detail

namespace loom::search {

LOOM_INLINE plan::plan_spec to_plan(const configuration& c) {
    plan::plan_spec p = c.tp > 1 ? plan::presets::megatron(c.tp, c.dp) : plan::presets::data_parallel(c.dp);
    p.devices = c.devices();
    p.zero = c.zero;
    const bool pipelined = c.pp > 1 || c.micro_batches > 1 || c.interlaced;
    if (pipelined) {
        plan::stage_spec stages;
        stages.count = {c.pp, "", {}};
        stages.devices_per_stage = {static_cast<std::int64_t>(c.tp) * c.dp, "", {}};
        bool even = true;
        for (int n : c.layers_per_chunk) even = even && n == c.layers_per_chunk.front();
        if (!even) {
            std::int64_t next = 0;
            for (std::size_t k = 0; k + 1 < c.layers_per_chunk.size(); ++k)
                stages.boundaries.push_back(next += c.layers_per_chunk[k]);
        }
        p.stages = stages;
        p.micro_batches = {c.micro_batches, "", {}};
        plan::order_policy order{c.schedule};
        if (c.schedule == plan::schedule_kind::interleaved) order.virtual_stages = c.chunks;
        if (c.interlaced) order = {plan::schedule_kind::interlaced};
        p.order.alternatives = {order};
    }
    const plan::presets::transformer_names names;
    for (std::size_t layer = 0; layer < c.recompute_of.size(); ++layer) {
        const plan::recompute_policy r = c.recompute_of[layer];
        if (r == plan::recompute_policy::none) continue;
        const auto i = static_cast<std::int64_t>(layer);
        if (c.coshard > 1) {
            // Coshard: tp * coshard pieces, coshard of them one after another on each device.
            const std::int64_t pieces = static_cast<std::int64_t>(c.tp) * c.coshard;
            const plan::assign_spec together{{}, {c.coshard, "", {}}, 0};
            auto cut = [&](plan::selector on, plan::split_spec s) {
                plan::rule rule = detail::split_rule(std::move(on), c.dp, std::move(s), "coshard");
                rule.assign = together;
                rule.recompute = true;
                p.add(std::move(rule));
            };
            for (const std::string& col : names.column)
                cut(detail::layer_scope(i, col.substr(1)), {{}, "n", {pieces, "", {}}, false});
            for (const std::string& row : names.row)
                cut(detail::layer_scope(i, row.substr(1)), {{}, "k", {pieces, "", {}}, false});
            plan::selector attention = detail::layer_scope(i, names.attention.substr(1));
            attention.kinds = {&op_def_of<ops::SplitHeads>(), &op_def_of<ops::Attention>(), &op_def_of<ops::MergeHeads>()};
            cut(attention, {Dim::Head::id, "", {pieces, "", {}}, false});
            plan::selector mlp = detail::layer_scope(i, names.mlp.substr(1));
            mlp.kinds = {&op_def_of<ops::Gelu>(), &op_def_of<ops::Relu>(), &op_def_of<ops::Silu>(), &op_def_of<ops::Mul>()};
            cut(mlp, {Dim::FFN::id, "", {pieces, "", {}}, false});
            p.colocation_requires_recompute = true;
        }
        p.then(plan::presets::recompute_layers(r, i, i));
    }
    p.name = "TP " + std::to_string(c.tp) + " x PP " + std::to_string(c.pp) + " x DP " + std::to_string(c.dp) + ", " +
             std::to_string(c.micro_batches) + " micro-batches, " +
             (c.interlaced ? std::string("interlaced") : to_string(c.schedule)) +
             (c.schedule == plan::schedule_kind::interleaved ? " x" + std::to_string(c.chunks) : std::string()) + ", ZeRO " +
             std::to_string(static_cast<int>(c.zero)) + (c.coshard > 1 ? ", Coshard " + std::to_string(c.coshard) : std::string());
    return p;
}

}  // namespace loom::search
#endif  // LOOM_HEADER_DEFINITIONS
