#pragma once
// From a searched configuration to per-device programs that run: the plan presets and the
// pipeline machinery of plan/ and partition/, ordered by the configuration's schedule.
//
//   auto found = search::branch_and_bound(ctx, search::executable_space());
//   partition::partitioned_graph pg = search::apply_configuration(model.ir(), found.best);
//   comm::run_ranks(pg.world, [&](comm::communicator& c) { train::distributed_trainer<float> t(pg, c, {}); ... });
//
// Inside a pipeline stage (tp * dp devices) the plan is Megatron's tensor parallelism with
// data parallelism around it (plan::presets::megatron(tp, dp)), or plain data parallelism
// when tp is 1. Several micro-batches without pipeline stages are a one-stage pipeline
// (gradient accumulation). An interlaced configuration becomes plan::interlaced_pipeline
// ordered by schedule::interlaced (one device per stage). The executor does not yet run
// ZeRO or recomputation inside a pipeline, so executable_space() leaves them out and
// apply_configuration refuses them.
#include <string>

#include <loom/partition/apply.hpp>
#include <loom/partition/pipeline_order.hpp>
#include <loom/plan/pipeline.hpp>
#include <loom/plan/presets.hpp>
#include <loom/schedule/templates.hpp>
#include <loom/search/plan_space.hpp>
#include <loom/search/schedule_orders.hpp>

namespace loom::search {

// The parameters the executor runs today: TP, PP, DP, micro-batches and the three
// schedules, layers split evenly.
inline search_space executable_space() {
    search_space s;
    s.zero = {zero_stage::none};
    s.recompute_choices = {recompute::none};
    s.search_stage_boundaries = false;
    s.coshard = {1};
    return s;
}

inline partition::partitioned_graph apply_configuration(const graph& forward, const configuration& c) {
    if (c.zero != zero_stage::none)
        throw plan_error("apply_configuration: the configuration uses ZeRO stage " + std::to_string(static_cast<int>(c.zero)) +
                         ", which the executor does not run with this plan yet; search executable_space()");
    for (recompute r : c.recompute_of)
        if (r != recompute::none)
            throw plan_error("apply_configuration: the configuration recomputes layers (" + to_string(r) +
                             "), which the executor does not run with this plan yet; search executable_space()");
    if (c.schedule == schedule_kind::three_f_one_b && c.pp > 1)
        throw plan_error("apply_configuration: the configuration pipelines forward rounds with 3F1B; build the "
                         "recycling model's plan with plan/pipeline.hpp and schedule::three_f_one_b instead "
                         "(apply_configuration builds Megatron-style layer stacks)");
    if (c.coshard > 1)
        throw plan_error("apply_configuration: the configuration uses Coshard " + std::to_string(c.coshard) +
                         ", which needs recomputation the executor does not run with this plan yet; search executable_space()");
    for (int n : c.layers_per_chunk)
        if (n != c.layers_per_chunk.front())
            throw plan_error("apply_configuration: the configuration splits the layers unevenly over the pipeline "
                             "chunks; the executor's pipelines split them evenly, search with search_stage_boundaries off");
    if (c.interlaced) {
        if (c.tp != 1 || c.dp != 1 || c.chunks != 1)
            throw plan_error("apply_configuration: the executor runs the interlaced pipeline with one device per stage "
                             "(TP 1, DP 1, no virtual stages); this configuration has TP " + std::to_string(c.tp) + ", DP " +
                             std::to_string(c.dp) + "; search without interlacing, or with --tp 1 and --pp equal to the devices");
        const auto pp = plan::resolve_pipeline(
            plan::interlaced_pipeline(forward, c.pp, c.micro_batches, plan::presets::megatron(c.pp)), forward);
        auto pg = partition::apply_plan(forward, pp.plan, partition::pipeline_apply_options(pp));
        partition::order_by_schedule(pg, pp, schedule::interlaced(c.pp, c.micro_batches));
        return pg;
    }
    const plan::plan_spec inner = c.tp > 1 ? plan::presets::megatron(c.tp, c.dp) : plan::presets::data_parallel(c.dp);
    if (c.pp == 1 && c.micro_batches == 1) return partition::apply_plan(forward, plan::resolve(inner, forward));

    const int group = c.tp * c.dp;
    plan::even_pipeline_options stages;
    stages.stages = c.pp;
    stages.micro_batches = c.micro_batches;
    stages.devices_per_stage = group;
    stages.virtual_stages = c.chunks;
    stages.inner = inner;
    const auto pp = plan::resolve_pipeline(plan::even_pipeline(forward, stages), forward);
    auto pg = partition::apply_plan(forward, pp.plan, partition::pipeline_apply_options(pp));
    schedule::schedule order = c.schedule == schedule_kind::gpipe         ? gpipe_orders(c.pp, c.micro_batches)
                               : c.schedule == schedule_kind::one_f_one_b ? one_f_one_b_orders(c.pp, c.micro_batches)
                                                                          : interleaved_orders(c.pp, c.chunks, c.micro_batches);
    if (group > 1) order = partition::spread_over_groups(order, group);
    partition::order_by_schedule(pg, pp, order);
    return pg;
}

}  // namespace loom::search
