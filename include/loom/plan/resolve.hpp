#pragma once
// plan::resolve(plan, graph): the one lowering of a plan value onto one graph. Every plan
// passes through it, whoever made it (plan::compose(...), a preset, a plan file, the
// searcher), and partition::apply_plan reads only what it returns.
//
//   1. Open parameters take their values from plan.choices; a missing or out-of-range value
//      is a plan_error naming the parameter and its range.
//   2. Without stages, micro-batches or an order, the rules cut and place every op on the
//      plan's devices (op-trans, op-assign), and devices run their programs in plan order.
//   3. Otherwise the plan is a pipeline: the layers of the stage part's repeat are cut into
//      ranges (evenly or at the given boundaries), each range placed on a device group
//      (op-assign), every op cut along the batch into micro-batches (op-trans, outermost)
//      and then by the rules within its group, and the order part's schedule (op-order)
//      orders the blocks of every device, spread over the members of each group.
//
// The structural checks across parts run here with the graph in hand (a stage count that
// does not divide the devices, ranges that overlap or leave layers out, an interleaved order
// whose micro-batches are not a multiple of the stages, 3F1B on a model without three forward
// rounds, ...). When the parts are static, plan::compose runs the same predicates at compile
// time (plan/parts.hpp).
#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/graph.hpp>
#include <loom/plan/op_order.hpp>
#include <loom/plan/op_partition.hpp>
#include <loom/plan/pipeline.hpp>
#include <loom/plan/presets.hpp>
#include <loom/plan/rules.hpp>
#include <loom/plan/stage_ranges.hpp>
#include <loom/schedule/templates.hpp>
#include <loom/schedule/validate.hpp>

namespace loom::plan {

namespace detail {

LOOM_INLINE std::int64_t layer_count(const graph& g, const std::string& repeat);

// The repeat of forward rounds around the layers of `repeat` (recycling models): the
// innermost other repeat whose instances enclose those layers. {"", 1} when there is none.
struct forward_rounds {
    std::string scope;
    int rounds = 1;
};

LOOM_INLINE forward_rounds find_forward_rounds(const graph& g, const std::string& repeat);

// A schedule for stages of one device each, spread over groups of `group` devices: stage s
// runs on devices [g * group, (g + 1) * group) of its device g, every member in the same block
// order (SPMD within the group).
LOOM_INLINE schedule::schedule spread_over_groups(const schedule::schedule& s, int group);

// The op-order of a pipeline of `stages` device groups of `group` devices, validated.
LOOM_INLINE schedule::schedule pipeline_order(const order_policy& o, int stages, int micro_batches, int group);
// The same, built anew (pipeline_order keeps those it built, by shape).
LOOM_INLINE schedule::schedule built_pipeline_order(const order_policy& o, int stages, int micro_batches, int group);

inline std::string allowed_text(const std::vector<std::int64_t>& allowed) {
    std::string out;
    for (auto v : allowed) out += (out.empty() ? "" : ", ") + std::to_string(v);
    return out;
}

LOOM_INLINE zero_stage chosen_zero(const plan_spec& p);

LOOM_INLINE std::optional<order_policy> chosen_order(const plan_spec& p);

// The first layer of each of `chunks` ranges of `layers` layers: even, at the given
// boundaries (checked: strictly increasing, inside the model), or the cut that the open
// boundaries' choice numbers.
LOOM_INLINE std::vector<std::int64_t> stage_starts(const stage_spec& st, const std::map<std::string, std::int64_t>& choices,
                                                   std::int64_t layers, int chunks);

// The devices of each stage's group: the plan's devices_per_stage, else its devices over
// the `stages` it has; refused when stages x group is not the plan's devices.
LOOM_INLINE std::int64_t stage_group_size(const plan_spec& p, std::int64_t stages);

// The refusals of plan::resolve that depend only on the rules and on one stage group: the
// group's size (stage count, devices per stage), the rules' degrees, colocations and
// recompute choices. The rules cut every op of g over the group, as place_stages does, and
// with stages every piece of an op in the stages' layers must land inside the group. It
// throws what resolve would (a searcher checks it once per such choice and skips every
// assignment that shares them); passing it, a plan may still be refused by resolve.
LOOM_INLINE void check_stage_group(const plan_spec& p, const graph& g);

}  // namespace detail

LOOM_INLINE resolved_plan resolve(const plan_spec& p, const graph& g);

}  // namespace loom::plan

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::plan::detail {

LOOM_INLINE std::int64_t layer_count(const graph& g, const std::string& repeat) {
    std::int64_t layers = 0;
    for (const auto& r : g.repeats)
        if (r.name == repeat) layers = std::max<std::int64_t>(layers, static_cast<std::int64_t>(r.scopes.size()));
    return layers;
}

LOOM_INLINE forward_rounds find_forward_rounds(const graph& g, const std::string& repeat) {
    for (const auto& r : g.repeats) {
        if (r.name != repeat || r.scopes.empty()) continue;
        for (std::int32_t s = g.scopes.at(static_cast<std::size_t>(r.scopes.front())).parent; s != no_id;) {
            const scope_desc& sd = g.scopes.at(static_cast<std::size_t>(s));
            if (sd.repeat != no_id) {
                const auto& outer = g.repeats.at(static_cast<std::size_t>(sd.repeat));
                if (outer.name != repeat) return {outer.name, static_cast<int>(outer.scopes.size())};
            }
            s = sd.parent;
        }
    }
    return {};
}

LOOM_INLINE schedule::schedule spread_over_groups(const schedule::schedule& s, int group) {
    if (group == 1) return s;
    schedule::schedule out = s;
    out.shape.devices = s.shape.devices * group;
    out.device_order.clear();
    for (int d = 0; d < s.shape.devices; ++d)
        for (int k = 0; k < group; ++k) out.device_order.push_back(s.device_order.at(static_cast<std::size_t>(d)));
    for (auto& members : out.shape.stage_devices) {
        std::vector<int> spread;
        for (int d : members)
            for (int k = 0; k < group; ++k) spread.push_back(d * group + k);
        members = std::move(spread);
    }
    return out;
}

LOOM_INLINE schedule::schedule built_pipeline_order(const order_policy& o, int stages, int micro_batches, int group) {
    switch (o.kind) {
        case schedule_kind::gpipe: return spread_over_groups(schedule::gpipe(stages, micro_batches), group);
        case schedule_kind::one_f_one_b: return spread_over_groups(schedule::one_f_one_b(stages, micro_batches), group);
        case schedule_kind::interleaved:
            return spread_over_groups(schedule::interleaved_one_f_one_b(stages, o.virtual_stages, micro_batches), group);
        case schedule_kind::three_f_one_b:
            return spread_over_groups(schedule::three_f_one_b(stages, micro_batches), group);
        case schedule_kind::interlaced:
            // Ordered on one device per stage and spread: the list scheduler's cost grows with
            // the devices, and each group member's order is the same (tests check it).
            return spread_over_groups(schedule::interlaced(stages, micro_batches, 1), group);
        case schedule_kind::from_constraints: {
            schedule::schedule_spec spec{"ordered by constraints",
                                         schedule::pipeline_shape::linear(stages, micro_batches, o.rounds), o.constraints};
            return spread_over_groups(schedule::from_constraints(spec), group);
        }
    }
    throw plan_error("plan::order: unknown schedule kind");
}

LOOM_INLINE schedule::schedule pipeline_order(const order_policy& o, int stages, int micro_batches, int group) {
    if (o.kind == schedule_kind::from_constraints) {
        schedule::schedule s = built_pipeline_order(o, stages, micro_batches, group);
        schedule::validate(s);
        return s;
    }
    // Built and validated once per shape: a search resolves thousands of plans that share a
    // few orders, and validating a schedule of many stages and micro-batches is most of a
    // resolve's time.
    using key = std::tuple<int, int, int, int, int>;
    static std::mutex guard;
    static std::map<key, schedule::schedule> built;
    const key k{static_cast<int>(o.kind), o.virtual_stages, stages, micro_batches, group};
    {
        std::lock_guard lock(guard);
        if (auto it = built.find(k); it != built.end()) return it->second;
    }
    // Validated on one device per stage, then spread: a member of a group runs the group's
    // order and exchanges with the same member of the next group, so the spread order is
    // valid when that one is (validating 512 copies of it costs 512 times as much).
    schedule::schedule s = built_pipeline_order(o, stages, micro_batches, 1);
    schedule::validate(s);
    s = spread_over_groups(s, group);
    std::lock_guard lock(guard);
    if (built.size() > 256) built.clear();  // bounded: searches over many shapes start over
    return built.emplace(k, std::move(s)).first->second;
}

LOOM_INLINE zero_stage chosen_zero(const plan_spec& p) {
    if (p.zero_open.empty()) return p.zero;
    note_choice(p.zero_open);
    auto it = p.choices.find(p.zero_open);
    if (it == p.choices.end())
        throw plan_error("plan::zero: the open ZeRO stage '" + p.zero_open + "' has no value; choose one of {" +
                         allowed_text(p.zero_allowed) + "} (choose(\"" + p.zero_open + "\", n)) or set it in the plan file's \"choices\"");
    if (it->second < 0 || it->second > 3 ||
        (!p.zero_allowed.empty() &&
         std::find(p.zero_allowed.begin(), p.zero_allowed.end(), it->second) == p.zero_allowed.end()))
        throw plan_error("plan::zero: the open ZeRO stage '" + p.zero_open + "' was given " + std::to_string(it->second) +
                         ", outside {" + allowed_text(p.zero_allowed.empty() ? std::vector<std::int64_t>{0, 1, 2, 3} : p.zero_allowed) +
                         "}; choose one of those");
    return static_cast<zero_stage>(it->second);
}

LOOM_INLINE std::optional<order_policy> chosen_order(const plan_spec& p) {
    const auto& alternatives = p.order.alternatives;
    if (alternatives.empty()) return std::nullopt;
    if (alternatives.size() == 1) return alternatives.front();
    std::string names;
    for (std::size_t i = 0; i < alternatives.size(); ++i)
        names += (i ? ", " : "") + std::to_string(i) + ": " + alternatives[i].describe();
    note_choice(p.order.open);
    auto it = p.choices.find(p.order.open);
    if (it == p.choices.end())
        throw plan_error("plan::order: the open order '" + p.order.open + "' has no value; choose the index of one of {" +
                         names + "} (choose(\"" + p.order.open + "\", i)) or set it in the plan file's \"choices\"");
    if (it->second < 0 || it->second >= static_cast<std::int64_t>(alternatives.size()))
        throw plan_error("plan::order: the open order '" + p.order.open + "' was given " + std::to_string(it->second) +
                         "; choose the index of one of {" + names + "}");
    return alternatives[static_cast<std::size_t>(it->second)];
}

LOOM_INLINE std::vector<std::int64_t> stage_starts(const stage_spec& st, const std::map<std::string, std::int64_t>& choices,
                                                   std::int64_t layers, int chunks) {
    const std::string what = "plan::stages on '" + st.repeat + "'";
    if (!st.boundaries_open.empty()) {
        if (!st.boundaries.empty())
            throw plan_error(what + ": the boundaries are both given and open ('" + st.boundaries_open +
                             "'); give them, or leave them open, not both");
        note_choice(st.boundaries_open);
        const auto it = choices.find(st.boundaries_open);
        const std::int64_t count = count_stage_ranges(layers, chunks, st.boundary_slack);
        if (count == 0)
            throw plan_error(what + ", open boundaries '" + st.boundaries_open + "': " + std::to_string(layers) +
                             " layers do not cut into " + std::to_string(chunks) + " ranges" +
                             (st.boundary_slack < 0 ? std::string()
                                                    : " within " + std::to_string(st.boundary_slack) + " layers of even") +
                             "; use fewer stages (times chunks)" + (st.boundary_slack < 0 ? "" : " or a wider slack"));
        if (it == choices.end())
            throw plan_error(what + ": the open boundaries '" + st.boundaries_open + "' have no value; choose a cut 0.." +
                             std::to_string(count - 1) + " of " + std::to_string(layers) + " layers into " +
                             std::to_string(chunks) + " ranges (plan/stage_ranges.hpp), or let search::search_plan choose");
        try {
            return stage_range_starts(layers, chunks, st.boundary_slack, it->second);
        } catch (const plan_error& e) {
            throw plan_error(what + ", open boundaries '" + st.boundaries_open + "': " + e.what());
        }
    }
    std::vector<std::int64_t> starts;
    if (st.boundaries.empty()) {
        if (layers < chunks)
            throw plan_error(what + ": " + std::to_string(layers) + " layers cannot fill " + std::to_string(chunks) +
                             " stages; use at most " + std::to_string(layers) + " stages (times chunks)");
        return even_stage_starts(layers, chunks);
    }
    if (static_cast<int>(st.boundaries.size()) != chunks - 1)
        throw plan_error(what + ": " + std::to_string(st.boundaries.size()) + " boundaries for " + std::to_string(chunks) +
                         " stages; give " + std::to_string(chunks - 1) +
                         " boundaries (the first layer of every stage after the first)");
    starts.push_back(0);
    for (std::size_t k = 0; k < st.boundaries.size(); ++k) {
        const std::int64_t b = st.boundaries[k];
        if (b <= starts.back())
            throw plan_error(what + ": boundary " + std::to_string(b) + " does not come after " +
                             std::to_string(starts.back()) + "; stage ranges would overlap or be empty; give strictly "
                             "increasing first layers");
        if (b >= layers)
            throw plan_error(what + ": boundary " + std::to_string(b) + " runs past the model's " + std::to_string(layers) +
                             " layers (0.." + std::to_string(layers - 1) + "); give first layers below " +
                             std::to_string(layers));
        starts.push_back(b);
    }
    return starts;
}
LOOM_INLINE std::int64_t stage_group_size(const plan_spec& p, std::int64_t stages) {
    const stage_spec st = p.stages.value_or(stage_spec{});
    std::int64_t group = degree_value(st.devices_per_stage, p, "plan::stages (devices per stage)");
    if (group == 0) {
        if (p.devices % stages != 0)
            throw plan_error("plan::stages: " + std::to_string(stages) + " stages do not divide the plan's " +
                             std::to_string(p.devices) + " devices; choose a stage count that divides them, or give "
                             "devices_per_stage");
        group = p.devices / stages;
    }
    if (group < 1 || stages * group != p.devices)
        throw plan_error("plan::stages: " + std::to_string(stages) + " stages of " + std::to_string(group) +
                         " devices make " + std::to_string(stages * group) + " devices, but the plan has " +
                         std::to_string(p.devices) + "; make stages x devices per stage equal the devices");
    return group;
}

LOOM_INLINE void check_stage_group(const plan_spec& p, const graph& g) {
    if (p.devices < 1) throw plan_error("plan: devices = " + std::to_string(p.devices) + "; use at least one device");
    plan_spec inner = p;
    inner.stages.reset();
    inner.order = {};
    inner.micro_batches = {1, "", {}};
    inner.zero = zero_stage::none;
    inner.zero_open.clear();
    if (!p.stages) {
        partition_ops(inner, g, piece_devices::range);
        return;
    }
    const std::int64_t stages = degree_value(p.stages->count, p, "plan::stages");
    if (stages < 1) throw plan_error("plan::stages: " + std::to_string(stages) + " stages; use at least 1");
    const std::int64_t group = stage_group_size(p, stages);
    inner.devices = static_cast<int>(group);
    const resolved_plan within = partition_ops(inner, g, piece_devices::range);
    for (std::size_t i = 0; i < within.forward.size(); ++i) {
        if (!within.forward[i] || layer_index(g, g.nodes[i], p.stages->repeat) < 0) continue;
        const op_partition& op = *within.forward[i];
        // The lowest and highest device of its pieces (colocated pieces: recorded as those two).
        int lowest = 0, highest = static_cast<int>(op.pieces()) - 1;
        if (!op.devices.empty()) {
            lowest = *std::min_element(op.devices.begin(), op.devices.end());
            highest = *std::max_element(op.devices.begin(), op.devices.end());
        }
        if (lowest < 0 || highest >= group)
            throw plan_error("pipeline: the plan of a stage puts a piece of '" + g.nodes[i].name + "' on device " +
                             std::to_string(lowest < 0 ? lowest : highest) + " of a group of " + std::to_string(group));
    }
}

}  // namespace loom::plan::detail

namespace loom::plan {

LOOM_INLINE resolved_plan resolve(const plan_spec& p, const graph& g) {
    if (p.devices < 1) throw plan_error("plan: devices = " + std::to_string(p.devices) + "; use at least one device");
    // The ZeRO stage is read last: nothing before needs it, so a refusal of the rest does not
    // depend on it (the searcher skips by the choices a refusal read, plan::detail::choice_log).
    const std::int64_t micro = degree_value(p.micro_batches, p, "plan::micro_batches");
    if (micro < 1)
        throw plan_error("plan::micro_batches: " + std::to_string(micro) + " micro-batches; use at least 1");
    std::optional<order_policy> order = detail::chosen_order(p);
    if (!p.stages && micro == 1 && !order) {
        plan_spec flat = p;
        flat.zero = zero_stage::none;
        flat.zero_open.clear();
        resolved_plan out = detail::partition_ops(flat, g);
        out.zero = detail::chosen_zero(p);
        return out;
    }

    const stage_spec st = p.stages.value_or(stage_spec{});
    const std::int64_t stages = degree_value(st.count, p, "plan::stages");
    if (stages < 1) throw plan_error("plan::stages: " + std::to_string(stages) + " stages; use at least 1");
    if (!order) order = order_policy{schedule_kind::one_f_one_b};
    const bool interlaced = order->kind == schedule_kind::interlaced;
    const int chunks_per_group = order->kind == schedule_kind::interleaved ? order->virtual_stages : 1;
    if (chunks_per_group < 1)
        throw plan_error("plan::order<Interleaved<" + std::to_string(chunks_per_group) +
                         ">>: use at least one chunk per device group");
    const std::int64_t group = detail::stage_group_size(p, stages);
    if (order->kind == schedule_kind::interleaved && micro % stages != 0)
        throw plan_error("plan::order<Interleaved<" + std::to_string(chunks_per_group) + ">>: " + std::to_string(micro) +
                         " micro-batches over " + std::to_string(stages) +
                         " stages; the interleaved schedule needs a multiple of the stage count");

    const std::int64_t layers = detail::layer_count(g, st.repeat);
    if (layers == 0)
        throw plan_error("plan::stages: the model has no repeated layers named '" + st.repeat +
                         "'; name the repeat the model records (graph_builder::repeat), e.g. stages on \"blocks\"");
    const int chunks = static_cast<int>(stages) * chunks_per_group;
    const std::vector<std::int64_t> starts = detail::stage_starts(st, p.choices, layers, chunks);

    detail::pipeline_spec ps;
    ps.repeat = st.repeat;
    ps.micro_batches = static_cast<int>(micro);
    ps.inner = p;
    ps.inner.devices = static_cast<int>(group);
    ps.inner.stages.reset();
    ps.inner.order = {};
    ps.inner.micro_batches = {1, "", {}};
    ps.inner.zero = zero_stage::none;  // the plan's, chosen below
    ps.inner.zero_open.clear();
    const int rounds = order->forward_rounds();
    if (rounds > 1) {
        const detail::forward_rounds found = detail::find_forward_rounds(g, st.repeat);
        if (found.rounds != rounds)
            throw plan_error("plan::order<" + order->describe() + ">: it runs " + std::to_string(rounds) +
                             " forward rounds per micro-batch, but the model has " + std::to_string(found.rounds) +
                             (found.scope.empty() ? std::string(" (no repeat of rounds around '") + st.repeat + "')"
                                                  : " (repeat '" + found.scope + "')") +
                             "; use it on a recycling model with " + std::to_string(rounds) +
                             " rounds, or order with OneFOneB");
        ps.rounds_scope = found.scope;
        ps.rounds = rounds;
    }
    std::vector<int> all(static_cast<std::size_t>(p.devices));
    for (int d = 0; d < p.devices; ++d) all[static_cast<std::size_t>(d)] = d;
    // The interlaced pipeline's ends (the embeddings before the layers; the LM head and the
    // loss after them) run on every device, their vocabulary split over all of them: the
    // layers' own rules there would cut them per group and leave the other groups idle.
    plan_spec ends = ps.inner;
    if (interlaced) {
        ends.devices = p.devices;
        for (rule r : presets::vocabulary_parallel(p.devices).rules) {
            r.optional = true;  // a model without an embedding, an LM head or the loss
            r.origin = "the interlaced pipeline's ends";
            ends.add(std::move(r));
        }
        ps.stages.push_back({0, -1, all, ends});
    }
    for (int k = 0; k < chunks; ++k) {
        detail::pipeline_stage stage;
        stage.first_layer = starts[static_cast<std::size_t>(k)];
        stage.last_layer = (k + 1 < chunks ? starts[static_cast<std::size_t>(k) + 1] : layers) - 1;
        const auto owner = static_cast<int>(k % stages);
        for (std::int64_t d = 0; d < group; ++d) stage.devices.push_back(static_cast<int>(owner * group + d));
        ps.stages.push_back(std::move(stage));
    }
    if (interlaced) {
        ps.stages.push_back({0, -1, all, ends});
        ps.head_stage = 0;
        ps.tail_stage = static_cast<int>(ps.stages.size()) - 1;
    }

    resolved_plan out = detail::place_stages(ps, g);
    out.zero = detail::chosen_zero(p);
    out.name = !p.name.empty() ? p.name
                               : "pipeline x" + std::to_string(stages) +
                                     (group > 1 ? " of " + std::to_string(group) + " devices" : std::string()) + ", " +
                                     std::to_string(micro) + " micro-batches, " + order->describe();
    out.order = detail::pipeline_order(*order, static_cast<int>(stages), static_cast<int>(micro), static_cast<int>(group));
    return out;
}

}  // namespace loom::plan
#endif  // LOOM_HEADER_DEFINITIONS
