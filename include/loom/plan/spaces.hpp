#pragma once
// The search spaces of known systems, written as plans with open parameters: each is a
// plan like any other, which search::search_plan fills, and which a user can narrow (give a
// parameter a range), extend (add parts) or save as a plan file.
//
//   megatron(n)   Megatron-LM: tensor x pipeline x data parallelism, even stages, 1F1B or
//                 interleaved 1F1B (2 chunks), every layer recomputed
//   deepspeed(n)  DeepSpeed: ZeRO-3 with tensor and data parallelism, micro-batches
//                 accumulated (no pipeline), every layer recomputed
//   alpa(n)       Alpa's inter- and intra-operator levels: stages whose boundaries are
//                 searched too, with tensor x data parallelism inside them, ordered 1F1B
//   nnscaler(n)   all of the above, with the ZeRO stage, GPipe, 1F1B, interleaved, 3F1B,
//                 the interlaced pipeline, the recomputation of the layers, Coshard (the
//                 layers' tensor-parallel pieces cut "coshard" times more, one after
//                 another on each device; only with recomputation) and the stages'
//                 boundaries as open choices. The assignments a model cannot run (3F1B
//                 without three forward rounds, interleaving without enough layers,
//                 Coshard without recomputation) are refused by the search, which says why.
//
// Open parameters: "tp", "dp" (degrees inside a stage), "pp" (stages), "mb" (micro-batches),
// "order", "zero", "recompute", "coshard" and "boundaries". Their candidates are every divisor
// (search::open_parameter_candidates); the boundaries' are every cut of the layers whose
// ranges lie within `boundary_slack` layers of the even cut (default 1: enough to move a
// layer off the stage that also holds the embedding or the head; -1: any cut, as Alpa;
// a stage count with more than search::max_boundary_cuts cuts tries the even one only).
// Narrow any of them by giving it a range, as for any plan.
#include <optional>
#include <string>

#include <loom/core/linkage.hpp>
#include <loom/plan/presets.hpp>
#include <loom/plan/rules.hpp>

namespace loom::plan::spaces {

namespace detail {

inline degree_spec open_degree(std::string name) { return {1, std::move(name), {}}; }

inline plan_spec tensor_and_data(int devices) {
    plan_spec p = presets::megatron(open_degree("tp"), open_degree("dp"));
    p.devices = devices;
    return p;
}

// Open stages, micro-batches and order (an open choice among several `orders`); the stage
// boundaries open too when `boundary_slack` is given (negative: any cut).
LOOM_INLINE plan_spec with_pipeline(plan_spec p, std::vector<order_policy> orders,
                                    std::optional<std::int64_t> boundary_slack = std::nullopt);

LOOM_INLINE rule recompute_every_layer();

}  // namespace detail

LOOM_INLINE plan_spec megatron(int devices);

LOOM_INLINE plan_spec deepspeed(int devices);

inline plan_spec alpa(int devices, std::int64_t boundary_slack = 1) {
    plan_spec p = detail::with_pipeline(detail::tensor_and_data(devices), {{schedule_kind::one_f_one_b}}, boundary_slack);
    p.name = "Alpa space: stages with searched boundaries, TP x DP inside";
    return p;
}

LOOM_INLINE plan_spec nnscaler(int devices, std::int64_t boundary_slack = 1);

// A space by name: megatron, deepspeed, alpa or nnscaler.
LOOM_INLINE plan_spec by_name(const std::string& name, int devices);

}  // namespace loom::plan::spaces

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::plan::spaces::detail {

LOOM_INLINE plan_spec with_pipeline(plan_spec p, std::vector<order_policy> orders,
                                    std::optional<std::int64_t> boundary_slack) {
    stage_spec s;
    s.count = open_degree("pp");
    if (boundary_slack) {
        s.boundaries_open = "boundaries";
        s.boundary_slack = *boundary_slack;
    }
    p.stages = s;
    p.micro_batches = open_degree("mb");
    p.order.alternatives = std::move(orders);
    if (p.order.alternatives.size() > 1) p.order.open = "order";
    return p;
}

LOOM_INLINE rule recompute_every_layer() {
    rule r;
    r.on.repeat = "blocks";
    r.recompute = true;
    r.origin = "recompute";
    return r;
}
}  // namespace loom::plan::spaces::detail

namespace loom::plan::spaces {

LOOM_INLINE plan_spec megatron(int devices) {
    plan_spec p = detail::with_pipeline(detail::tensor_and_data(devices),
                                        {{schedule_kind::one_f_one_b}, {schedule_kind::interleaved, 2}});
    p.add(detail::recompute_every_layer());
    p.name = "Megatron-LM space: TP x PP x DP, 1F1B or interleaved, full recompute";
    return p;
}

LOOM_INLINE plan_spec deepspeed(int devices) {
    plan_spec p = detail::tensor_and_data(devices);
    p.zero = zero_stage::parameters;
    p.micro_batches = detail::open_degree("mb");  // gradient accumulation
    p.add(detail::recompute_every_layer());        // activation checkpointing
    p.name = "DeepSpeed space: ZeRO-3 x TP x DP, gradient accumulation, full recompute";
    return p;
}

LOOM_INLINE plan_spec nnscaler(int devices, std::int64_t boundary_slack) {
    plan_spec p = detail::with_pipeline(detail::tensor_and_data(devices),
                                        {{schedule_kind::gpipe},
                                         {schedule_kind::one_f_one_b},
                                         {schedule_kind::interleaved, 2},
                                         {schedule_kind::three_f_one_b},
                                         {schedule_kind::interlaced}},
                                        boundary_slack);
    p.zero_open = "zero";
    p.zero_allowed = {0, 1, 2, 3};
    rule recompute = detail::recompute_every_layer();
    recompute.recompute.reset();
    recompute.recompute_open = "recompute";
    p.add(std::move(recompute));
    p.then(presets::coshard_layers(detail::open_degree("coshard")));
    p.name = "nnScaler space: TP x PP x DP, searched stage boundaries, every order, ZeRO 0-3, recompute or not, Coshard";
    return p;
}

LOOM_INLINE plan_spec by_name(const std::string& name, int devices) {
    if (name == "megatron") return megatron(devices);
    if (name == "deepspeed") return deepspeed(devices);
    if (name == "alpa") return alpa(devices);
    if (name == "nnscaler") return nnscaler(devices);
    throw plan_error("plan::spaces: no space named '" + name +
                     "'; give megatron, deepspeed, alpa or nnscaler, or a plan file with open parameters");
}

}  // namespace loom::plan::spaces
#endif  // LOOM_HEADER_DEFINITIONS
