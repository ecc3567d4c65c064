#pragma once
// The searcher fills the open parameters of a user's plan: the user constructs the space
// (a plan with open<...> degrees, stage counts, micro-batches, orders, ZeRO stages, and
// its constraints), loom searches it, pricing the programs each candidate really produces.
//
//   plan::plan_spec space = plan::compose(plan::stages<plan::open<"pp">>{},
//                                         plan::micro_batches<plan::open<"mb">>{}, ...);
//   search::plan_search_result r = search::search_plan(model, space, search::dgx_a100(1));
//   r.plan            the same plan, every open parameter chosen (r.plan.choices)
//   r.price           its predicted step time and the memory of every device
//   r.gap             proven optimality gap (0: the best of the space)
//   r.explain()       why this plan, the runner-up, and what separated them
//
// How:
//   1. Candidates: every legal value of every open parameter: its own range when the plan
//      gives one, else the divisors of the devices (degrees, stage counts), of the batch
//      (micro-batches), every alternative (orders), every ZeRO stage, and recompute or
//      keep (recompute choices).
//   2. Every assignment is resolved against the model (plan::resolve); the structural
//      refusals (a stage count that does not divide, layers that do not fill the chunks, a
//      forbidden split, ...) are counted by reason, which is what an empty space reports.
//   3. A lower bound on the step time of each legal assignment, from the resolved plan
//      alone: the busiest device's share of the training work (FLOPs, bytes, instructions)
//      at the device's best rates, and the partial sums its cuts force it to reduce (the
//      weights' gradients over the replicas, tensor-parallel partial activations) at the
//      bandwidth of the tightest placement. It never exceeds the programs' price (tests
//      check it on every leaf of several spaces).
//   4. Best first by that bound, each assignment is applied (partition::apply_plan) and its
//      programs priced (search/program_price.hpp); assignments that do not fit in the
//      device's memory are set aside. The search stops when the next bound is no better
//      than the runner-up's price (both are then exact), or at the time or count budget,
//      when the gap is that of the best price to the lowest bound not yet priced.
// Deterministic: the enumeration is an odometer over the parameters in the order
// plan::open_parameters lists them, pricing follows the bounds (ties in enumeration
// order), and of plans that price the same the first priced is chosen. The runner-up is
// the best strictly slower plan.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <loom/core/dim.hpp>
#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/graph.hpp>
#include <loom/partition/apply.hpp>
#include <loom/partition/logical_graph.hpp>
#include <loom/partition/piece_layout.hpp>
#include <loom/plan/resolve.hpp>
#include <loom/plan/rules.hpp>
#include <loom/plan/stage_ranges.hpp>
#include <loom/plan/transformation.hpp>
#include <loom/search/folded_price.hpp>
#include <loom/search/hardware.hpp>
#include <loom/search/program_price.hpp>

namespace loom::search {

struct search_error : error {
    using error::error;
};

// One open parameter of a plan and the values the search tries.
struct open_parameter {
    enum class kind : std::uint8_t { recompute, degree, stages, micro_batches, order, zero, boundaries };
    std::string name;
    kind what = kind::degree;
    std::vector<std::int64_t> candidates;  // boundaries: none here, the cuts depend on the stages chosen
    std::vector<std::string> labels;  // orders: each alternative's name
    std::int64_t layers = 0;          // boundaries: the layers of the stages' repeat
    std::int64_t slack = -1;          // boundaries: each range within this many layers of even (-1: any)
    // boundaries: the cut that a whole assignment chooses, as the layers of each range
    // ("5 + 1 layers"); a cut's number alone means nothing without the stages chosen.
    std::function<std::string(const std::map<std::string, std::int64_t>&)> describe;
};

// Open stage boundaries with more cuts than this at one stage count (96 layers in 16
// stages within one layer of even: about 10^7) try the even cut only there, and the
// result says so (plan_search_statistics::even_cut_only): narrow the slack to search them.
inline constexpr std::int64_t max_boundary_cuts = 100000;

LOOM_INLINE std::vector<std::int64_t> divisors_of(std::int64_t n);

// The samples of the model's batch: the extent of Dim::Batch of its first input that has one.
inline std::int64_t batch_of(const graph& model) {
    for (tensor_id t : model.inputs)
        if (auto axis = model.tensor(t).dims.find(dim_id_of<Dim::Batch>)) return model.tensor(t).dims.extent(*axis);
    return 1;
}

// Every open parameter of `space` with its candidate values, for a model of `batch` samples
// and `layers` layers in the stages' repeat (needed when the stage boundaries are open).
LOOM_INLINE std::vector<open_parameter> open_parameter_candidates(const plan::plan_spec& space, std::int64_t batch,
                                                                  std::int64_t layers = 0);

// The ranges that open boundaries cut the layers into, given the stage count and order
// chosen in `candidate` (stages x interleaved chunks); 0 when they do not say (plan::resolve
// then says why).
LOOM_INLINE std::int64_t boundary_ranges(const plan::plan_spec& candidate);

// The candidates of open parameter p once the earlier parameters are chosen in `candidate`:
// its own, or for open boundaries every cut of the layers into the ranges that the chosen
// stage count and order make ({0} when they make none: plan::resolve then says why; the
// even cut alone when they make more than max_boundary_cuts).
LOOM_INLINE std::vector<std::int64_t> candidates_given(const open_parameter& p, const plan::plan_spec& candidate);

// Every assignment of `params` in enumeration order (an odometer, the last parameter turning
// fastest): fn gets `space` with those choices.
LOOM_INLINE void for_each_assignment(const plan::plan_spec& space, const std::vector<open_parameter>& params,
                                     const std::function<void(const plan::plan_spec&)>& fn);

LOOM_INLINE std::string value_text(const open_parameter& p, std::int64_t v);

LOOM_INLINE std::string choices_text(const std::vector<open_parameter>& params, const std::map<std::string, std::int64_t>& choices);

// The work of training every forward node of `model` on one device, its own and that of
// the backward ops that differentiate it, as the least time the pricing could give it: each
// op at the best rate it grants any instruction (the roofline at the device's best
// efficiency, or the op kind's calibrated rate without its per-call cost).
struct node_work {
    double seconds = 0;
    double instructions = 0;
};

LOOM_INLINE std::vector<node_work> training_work(const graph& model, const device_profile& dev, const price_options& o);

// A lower bound on the step time of a resolved plan: the busiest device's share of the
// training work. Each piece of an op does its share of the op's work (splits are even;
// replicas do it all) and runs at least one instruction per training op it holds.
//
// Given the model and the cluster, each device's communication counts too: the step is at
// least its compute and its communication (overlap: the larger of them; one stream: their
// sum). An op cut along a variable that one of its inputs lacks leaves that input's
// gradient a partial sum over the pieces along the cut on distinct devices (the weights'
// gradients over the data-parallel replicas, a column-parallel linear's input gradient over
// the tensor-parallel group); one cut along a contracted variable leaves its output partial
// (a row-parallel linear). Each such tensor is reduced at least once: a reduce-scatter of
// its piece over that group, at the transmission time of the group's tightest placement on
// the cluster's nodes, whatever the program does beyond it (all-reduce, latency, shared
// NICs). A tensor several ops leave partial counts once, at its largest such reduction.
LOOM_INLINE double step_lower_bound(const plan::resolved_plan& rp, const std::vector<node_work>& work, const price_options& o,
                                    const graph* model = nullptr, const cluster* c = nullptr);

namespace detail {

// The least seconds each device spends communicating under plan rp (see step_lower_bound).
LOOM_INLINE std::vector<double> communication_lower_bound(const plan::resolved_plan& rp, const graph& model, const cluster& c,
                                                          const price_options& o);

}  // namespace detail

struct plan_search_options {
    price_options price;
    double memory_limit = 0;         // bytes per device; 0: the cluster's device memory
    double time_budget_seconds = 0;  // 0: search until the best is proven
    std::int64_t max_priced = 0;     // price at most this many assignments; 0: no limit
};

struct plan_search_statistics {
    std::int64_t assignments = 0;  // leaves of the space
    std::int64_t refused = 0;      // by plan::resolve or partition::apply_plan
    std::int64_t priced = 0;
    std::int64_t over_memory = 0;
    std::int64_t pruned = 0;       // never priced: their bound was no better than the runner-up
    std::int64_t unexplored = 0;   // never priced: the budget ran out
    std::int64_t ties = 0;         // priced the same as the best (the first of them is chosen)
    std::int64_t even_cut_only = 0;  // assignments whose open boundaries had too many cuts: the even one was tried
    double seconds = 0;
    std::map<std::string, std::int64_t> refusals;  // reason -> assignments refused for it
};

struct priced_assignment {
    std::map<std::string, std::int64_t> choices;
    double bound = 0;
    program_price price;
};

struct plan_search_result {
    plan::plan_spec plan;  // the space with every open parameter chosen
    std::vector<open_parameter> parameters;
    priced_assignment best;
    std::optional<priced_assignment> runner_up;
    double gap = 0;  // (best price - lowest unpriced bound) / best price; 0: proven best
    double memory_limit = 0;
    plan_search_statistics stats;

    const program_price& price() const { return best.price; }
    std::string explain() const;
};

namespace detail {

LOOM_INLINE std::string seconds_text(double s);

LOOM_INLINE std::string gib_text(double bytes);

LOOM_INLINE std::string price_text(const program_price& p);

// What separated two priced plans, a the faster: the component that grew most in b.
LOOM_INLINE std::string separation_text(const program_price& a, const program_price& b);

}  // namespace detail

// Fill the open parameters of `space` for `model` on cluster c.
LOOM_INLINE plan_search_result search_plan(const graph& model, const plan::plan_spec& space, const cluster& c,
                                           const plan_search_options& o = {});

// The same, folded (search/folded_price.hpp): every assignment is bounded and priced from
// small instances of the model, so that models of a hundred layers on a thousand devices
// can be searched. The bound is extrapolated over the layers per stage like the price.
LOOM_INLINE plan_search_result search_plan(const model_family& model, const plan::plan_spec& space, const cluster& c,
                                           const plan_search_options& o = {});

namespace detail {

// Open stage boundaries made explicit in plan p (a filled plan): the boundaries of its chosen
// cut, the open parameter and its choice removed, so that the plan reads as written by hand.
LOOM_INLINE void concrete_boundaries(plan::plan_spec& p, const std::vector<open_parameter>& params);

// The search itself, over the assignments of `params`: `bound` gives an assignment's lower
// bound (throwing plan_error or shape_error to refuse it), `price` its programs' price.
using bound_function = std::function<double(const plan::plan_spec&)>;
using price_function = std::function<program_price(const plan::plan_spec&)>;
LOOM_INLINE plan_search_result search_assignments(const plan::plan_spec& space, std::vector<open_parameter> params,
                                                  const cluster& c, const plan_search_options& o,
                                                  const bound_function& bound, const price_function& price);

}  // namespace detail

}  // namespace loom::search

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::search {

LOOM_INLINE std::vector<std::int64_t> divisors_of(std::int64_t n) {
    std::vector<std::int64_t> out;
    for (std::int64_t k = 1; k <= n; ++k)
        if (n % k == 0) out.push_back(k);
    return out;
}

LOOM_INLINE std::vector<open_parameter> open_parameter_candidates(const plan::plan_spec& space, std::int64_t batch,
                                                                  std::int64_t layers) {
    std::vector<open_parameter> out;
    auto find = [&](const std::string& name) -> open_parameter* {
        for (auto& p : out)
            if (p.name == name) return &p;
        return nullptr;
    };
    auto add_degree = [&](const plan::degree_spec& d, open_parameter::kind k, std::int64_t range_of) {
        if (d.open.empty()) return;
        if (open_parameter* p = find(d.open)) {
            // One name in several places: the values every place allows.
            if (!d.allowed.empty()) {
                std::vector<std::int64_t> keep;
                for (auto v : p->candidates)
                    if (std::find(d.allowed.begin(), d.allowed.end(), v) != d.allowed.end()) keep.push_back(v);
                p->candidates = keep;
            }
            return;
        }
        out.push_back({d.open, k, d.allowed.empty() ? divisors_of(range_of) : d.allowed, {}});
    };
    for (const plan::rule& r : space.rules)
        if (!r.recompute_open.empty() && !find(r.recompute_open))
            out.push_back({r.recompute_open, open_parameter::kind::recompute, {0, 1}, {}});
    for (const plan::rule& r : space.rules)
        if (r.trans)
            for (const plan::split_spec& s : *r.trans) add_degree(s.degree, open_parameter::kind::degree, space.devices);
    if (space.stages) add_degree(space.stages->count, open_parameter::kind::stages, space.devices);
    add_degree(space.micro_batches, open_parameter::kind::micro_batches, batch);
    if (space.order.alternatives.size() > 1 && !find(space.order.open)) {
        open_parameter p{space.order.open, open_parameter::kind::order, {}, {}};
        for (std::size_t i = 0; i < space.order.alternatives.size(); ++i) {
            p.candidates.push_back(static_cast<std::int64_t>(i));
            p.labels.push_back(space.order.alternatives[i].describe());
        }
        out.push_back(std::move(p));
    }
    if (!space.zero_open.empty() && !find(space.zero_open))
        out.push_back({space.zero_open, open_parameter::kind::zero,
                       space.zero_allowed.empty() ? std::vector<std::int64_t>{0, 1, 2, 3} : space.zero_allowed, {}});
    // Last: its cuts depend on the stage count and the order chosen before it.
    if (space.stages && !space.stages->boundaries_open.empty() && !find(space.stages->boundaries_open)) {
        if (layers < 1)
            throw search_error("search_plan: the stage boundaries '" + space.stages->boundaries_open +
                               "' are open, but the model has no layers named '" + space.stages->repeat +
                               "' to cut; name the repeat the model records in plan::stages");
        open_parameter p{space.stages->boundaries_open, open_parameter::kind::boundaries, {}, {}};
        p.layers = layers;
        p.slack = space.stages->boundary_slack;
        p.describe = [space, layers](const std::map<std::string, std::int64_t>& choices) -> std::string {
            plan::plan_spec chosen = space;
            chosen.choices = choices;
            try {
                const auto starts =
                    plan::detail::stage_starts(*chosen.stages, choices, layers, static_cast<int>(boundary_ranges(chosen)));
                std::string text;
                for (std::size_t k = 0; k < starts.size(); ++k)
                    text += (k ? " + " : "") + std::to_string((k + 1 < starts.size() ? starts[k + 1] : layers) - starts[k]);
                return text + " layers";
            } catch (const plan_error&) {
                return "cut " + std::to_string(choices.at(chosen.stages->boundaries_open)) + " (not a cut of these stages)";
            }
        };
        out.push_back(std::move(p));
    }
    for (const auto& p : out)
        if (p.candidates.empty() && p.what != open_parameter::kind::boundaries)
            throw search_error("search_plan: open parameter '" + p.name +
                               "' has no candidate value (its ranges in the plan have no value in common); give it a range "
                               "that holds at least one value");
    return out;
}

LOOM_INLINE std::int64_t boundary_ranges(const plan::plan_spec& candidate) {
    std::int64_t ranges = 0;
    try {
        ranges = candidate.stages ? plan::degree_value(candidate.stages->count, candidate, "plan::stages") : 0;
        if (const auto order = plan::detail::chosen_order(candidate); order && order->kind == plan::schedule_kind::interleaved)
            ranges *= order->virtual_stages;
    } catch (const plan_error&) {
        return 0;
    }
    return std::max<std::int64_t>(ranges, 0);
}

// Whether open boundaries p have too many cuts at the stages chosen in `candidate`, so that
// only the even one is tried.
LOOM_INLINE bool even_cut_only(const open_parameter& p, const plan::plan_spec& candidate) {
    const std::int64_t ranges = boundary_ranges(candidate);
    return p.what == open_parameter::kind::boundaries && ranges >= 1 &&
           plan::count_stage_ranges(p.layers, ranges, p.slack) > max_boundary_cuts;
}

LOOM_INLINE std::vector<std::int64_t> candidates_given(const open_parameter& p, const plan::plan_spec& candidate) {
    if (p.what != open_parameter::kind::boundaries) return p.candidates;
    const std::int64_t ranges = boundary_ranges(candidate);
    if (ranges < 1) return {0};
    const std::int64_t cuts = plan::count_stage_ranges(p.layers, ranges, p.slack);
    if (cuts > max_boundary_cuts)
        return {plan::stage_range_index(p.layers, ranges, p.slack, plan::even_stage_starts(p.layers, ranges))};
    std::vector<std::int64_t> out;
    for (std::int64_t k = 0; k < std::max<std::int64_t>(cuts, 1); ++k) out.push_back(k);
    return out;
}

LOOM_INLINE void for_each_assignment(const plan::plan_spec& space, const std::vector<open_parameter>& params,
                                     const std::function<void(const plan::plan_spec&)>& fn) {
    plan::plan_spec candidate = space;
    // Depth first in parameter order: the odometer, with candidates that may depend on
    // the choices before them.
    std::function<void(std::size_t)> choose = [&](std::size_t i) {
        if (i == params.size()) {
            fn(candidate);
            return;
        }
        for (std::int64_t v : candidates_given(params[i], candidate)) {
            candidate.choices[params[i].name] = v;
            choose(i + 1);
        }
    };
    choose(0);
}

LOOM_INLINE std::string value_text(const open_parameter& p, std::int64_t v) {
    if (p.what == open_parameter::kind::boundaries) return "cut " + std::to_string(v);
    if (p.what == open_parameter::kind::order && v >= 0 && static_cast<std::size_t>(v) < p.labels.size())
        return p.labels[static_cast<std::size_t>(v)];
    if (p.what == open_parameter::kind::zero) return "ZeRO-" + std::to_string(v);
    if (p.what == open_parameter::kind::recompute) return v == 1 ? "recompute" : "keep";
    return std::to_string(v);
}

LOOM_INLINE std::string choices_text(const std::vector<open_parameter>& params, const std::map<std::string, std::int64_t>& choices) {
    std::string out;
    for (const auto& p : params) {
        auto it = choices.find(p.name);
        if (it == choices.end()) continue;
        const bool ranges = p.what == open_parameter::kind::boundaries && p.describe;
        out += (out.empty() ? "" : ", ") + p.name + " = " + (ranges ? p.describe(choices) : value_text(p, it->second));
    }
    return out.empty() ? "(no open parameters)" : out;
}

LOOM_INLINE std::vector<node_work> training_work(const graph& model, const device_profile& dev, const price_options& o) {
    const std::size_t forward = model.forward_node_count();
    partition::logical_graph_options lo;
    lo.recompute.assign(forward, false);
    lo.decompose.resize(forward);
    const partition::logical_graph lg = partition::build_logical_graph(model, lo);
    const double flop_rate = peak_for(dev, o.storage) * std::max(dev.gemm_efficiency, dev.elementwise_efficiency);
    const double byte_rate = dev.memory_bandwidth * dev.elementwise_efficiency;
    std::vector<node_work> work(forward);
    for (std::size_t i = 0; i < lg.g.nodes.size(); ++i) {
        const node& n = lg.g.nodes[i];
        const node_id forward_node = n.forward_of != no_id ? n.forward_of : static_cast<node_id>(i);
        const node_id source = lg.source_of[static_cast<std::size_t>(forward_node)];
        if (source == no_id || static_cast<std::size_t>(source) >= forward) continue;
        const double flops = n.op->flops ? n.op->flops(lg.g, n) : 0.0;
        const double bytes = detail::node_bytes(lg.g, n, o.storage);
        double seconds = std::max(flops / flop_rate, bytes / byte_rate);
        if (auto rate = o.rates.find(n.op->name); rate != o.rates.end())
            seconds = std::min(seconds, rate->second.least_per_unit() * (rate->second.per_flop ? flops : bytes));
        node_work& w = work[static_cast<std::size_t>(source)];
        w.seconds += seconds;
        w.instructions += 1;
    }
    return work;
}

LOOM_INLINE double step_lower_bound(const plan::resolved_plan& rp, const std::vector<node_work>& work, const price_options& o,
                                    const graph* model, const cluster* c) {
    std::vector<double> busy(static_cast<std::size_t>(rp.devices), 0.0);
    for (std::size_t i = 0; i < work.size(); ++i) {
        const node_work& w = work[i];
        const plan::op_partition* p = rp.at(static_cast<node_id>(i));
        const std::int64_t pieces = p ? p->pieces() : 1;
        const double piece = w.seconds / static_cast<double>(pieces) + w.instructions * o.instruction_overhead;
        if (!p) {
            for (double& b : busy) b += piece;
            continue;
        }
        for (std::int64_t k = 0; k < pieces; ++k) {
            const int d = p->device_of(k);
            if (d >= 0 && d < rp.devices) busy[static_cast<std::size_t>(d)] += piece;
        }
    }
    if (model && c && o.compute_shared_by == 1) {
        const std::vector<double> talk = detail::communication_lower_bound(rp, *model, *c, o);
        for (std::size_t d = 0; d < busy.size(); ++d) busy[d] = o.overlap ? std::max(busy[d], talk[d]) : busy[d] + talk[d];
    }
    const double busiest = *std::max_element(busy.begin(), busy.end());
    if (o.compute_shared_by == 1) return busiest;
    // Devices sharing one machine: each runs at the machine's rate, and all of them at most
    // at that rate together.
    double all = 0;
    for (double b : busy) all += b;
    return std::max(busiest, all) / o.compute_shared_by;
}
}  // namespace loom::search

namespace loom::search::detail {

LOOM_INLINE std::vector<double> communication_lower_bound(const plan::resolved_plan& rp, const graph& model, const cluster& c,
                                                          const price_options& o) {
    // tensor -> (seconds, the op that forces it) of its largest reduction so far
    std::map<tensor_id, std::pair<double, node_id>> reductions;
    const int per_node = std::max(1, c.topo.devices_per_node);
    auto reduce_seconds = [&](double bytes, int members) {
        group_placement tight;
        tight.nodes = (members + per_node - 1) / per_node;
        tight.max_per_node = std::min(members, per_node);
        tight.min_per_node = members - (tight.nodes - 1) * tight.max_per_node;
        return collective_cost(c, collective::reduce_scatter, bytes, members, tight, o.collectives, 1).transmission;
    };
    // The distinct devices of the pieces that differ from piece 0 only along axis a.
    auto members_along = [](const plan::op_partition& p, std::size_t a) {
        std::vector<int> seen;
        std::int64_t stride = p.replicas;
        for (std::size_t b = p.splits.size(); b-- > a + 1;) stride *= p.splits[b].degree;
        for (std::int64_t k = 0; k < p.splits[a].degree; ++k) {
            const int d = p.device_of(k * stride);
            if (std::find(seen.begin(), seen.end(), d) == seen.end()) seen.push_back(d);
        }
        return static_cast<int>(seen.size());
    };
    const std::size_t forward = std::min(rp.forward.size(), model.forward_node_count());
    for (std::size_t i = 0; i < forward; ++i) {
        const plan::op_partition* p = rp.at(static_cast<node_id>(i));
        if (!p) continue;
        const node& n = model.nodes[i];
        // Partitions as the partitioner binds them: a split the op cannot make is left out.
        std::vector<std::optional<int>> variable(p->splits.size());
        for (std::size_t a = 0; a < p->splits.size(); ++a)
            if (p->splits[a].cuts()) variable[a] = partition::detail::variable_of(n, p->splits[a]);
        bool decomposed = false;
        for (std::size_t a = 0; a < p->splits.size(); ++a)
            if (variable[a]) {
                const auto* t = plan::transformation_registry::instance().find(*n.op, n.sig.vars[static_cast<std::size_t>(*variable[a])].label);
                decomposed = decomposed || (t && t->decompose);
            }
        if (decomposed) continue;  // rebuilt into other ops, which move less than the op as written
        for (std::size_t a = 0; a < p->splits.size(); ++a) {
            if (!variable[a]) continue;
            const split_option effect = n.sig.effect_of_split(*variable[a]);
            // Operands that become partial along this axis: inputs that lack the variable
            // (their gradients), and outputs of a contracted variable.
            std::vector<tensor_id> partial;
            for (std::size_t k = 0; k < n.inputs.size() && k < effect.inputs.size(); ++k) {
                const tensor_desc& t = model.tensor(n.inputs[k]);
                const bool needs_gradient = t.kind != value_kind::index && (t.producer != no_id || t.role == tensor_role::parameter);
                if (needs_gradient && effect.inputs[k].effect == split_effect::replicated) partial.push_back(n.inputs[k]);
            }
            for (std::size_t k = 0; k < n.outputs.size() && k < effect.outputs.size(); ++k)
                if (effect.outputs[k].effect == split_effect::partial) partial.push_back(n.outputs[k]);
            if (partial.empty()) continue;
            // The group: the distinct devices of the pieces that differ from piece 0 only
            // along this axis (every group of an axis is alike); every device holding a
            // piece belongs to one.
            const int members = members_along(*p, a);
            if (members < 2) continue;
            for (tensor_id t : partial) {
                // The piece each device holds: the tensor cut by the op's other cuts that slice it.
                const tensor_desc& td = model.tensor(t);
                double elements = static_cast<double>(td.dims.numel());
                const bool is_input = std::find(n.inputs.begin(), n.inputs.end(), t) != n.inputs.end();
                for (std::size_t b = 0; b < p->splits.size(); ++b) {
                    if (b == a || !variable[b]) continue;
                    const split_option other = n.sig.effect_of_split(*variable[b]);
                    const auto& effects = is_input ? other.inputs : other.outputs;
                    const auto pos = static_cast<std::size_t>(
                        (is_input ? std::find(n.inputs.begin(), n.inputs.end(), t) - n.inputs.begin()
                                  : std::find(n.outputs.begin(), n.outputs.end(), t) - n.outputs.begin()));
                    // Sliced: a piece holds 1/degree of it, and a device as many pieces as
                    // share it along that axis (micro-batches), each reduced in turn.
                    if (pos < effects.size() && effects[pos].effect == split_effect::sliced)
                        elements /= static_cast<double>(members_along(*p, b));
                }
                const double bytes = elements * static_cast<double>(real_bytes(storage_precision(model, t, o.storage)));
                const double time = reduce_seconds(bytes, members);
                auto& best = reductions[t];
                if (time <= best.first) continue;
                best = {time, node_id(i)};
            }
        }
    }
    // Each reduction is paid by every device holding a piece of the op that forces it.
    std::map<node_id, double> per_op;
    for (const auto& [t, r] : reductions) per_op[r.second] += r.first;
    std::vector<double> seconds(static_cast<std::size_t>(rp.devices), 0.0);
    std::vector<char> holds(static_cast<std::size_t>(rp.devices));
    for (const auto& [op, time] : per_op) {
        const plan::op_partition* p = rp.at(op);
        std::fill(holds.begin(), holds.end(), 0);
        for (std::int64_t k = 0; k < p->pieces(); ++k)
            if (const int d = p->device_of(k); d >= 0 && d < rp.devices) holds[static_cast<std::size_t>(d)] = 1;
        for (std::size_t d = 0; d < holds.size(); ++d)
            if (holds[d]) seconds[d] += time;
    }
    return seconds;
}

LOOM_INLINE std::string seconds_text(double s) {
    std::ostringstream os;
    os.precision(3);
    if (s >= 1) os << s << " s";
    else if (s >= 1e-3) os << s * 1e3 << " ms";
    else os << s * 1e6 << " us";
    return os.str();
}

LOOM_INLINE std::string gib_text(double bytes) {
    std::ostringstream os;
    os.precision(3);
    os << bytes / gib << " GiB";
    return os.str();
}

LOOM_INLINE std::string price_text(const program_price& p) {
    std::ostringstream os;
    // Devices that compute at least 1% of what the busiest does.
    int used = 0;
    for (const auto& d : p.devices) used += d.compute >= 0.01 * p.max_compute() ? 1 : 0;
    os << "computes on " << used << " of " << p.devices.size() << " devices; step " << seconds_text(p.step_seconds) << " (busiest compute " << seconds_text(p.max_compute())
       << ", busiest communication " << seconds_text(p.max_communication()) << ", "
       << static_cast<int>(std::lround(p.idle_fraction() * 100)) << "% of device time idle), peak memory "
       << gib_text(p.peak_memory()) << " on device " << p.peak_memory_device();
    return os.str();
}

LOOM_INLINE std::string separation_text(const program_price& a, const program_price& b) {
    if (std::abs(a.step_seconds - b.step_seconds) <= 1e-12 * std::max(a.step_seconds, b.step_seconds))
        return "nothing in their price: they tie, and the first in the enumeration order wins";
    struct part {
        const char* name;
        double a, b;
    };
    const double idle_a = a.makespan * a.idle_fraction(), idle_b = b.makespan * b.idle_fraction();
    auto optimizer = [](const program_price& p) {
        double m = 0;
        for (const auto& d : p.devices) m = std::max(m, d.optimizer);
        return m;
    };
    const part parts[] = {{"busiest device's compute", a.max_compute(), b.max_compute()},
                          {"busiest device's communication", a.max_communication(), b.max_communication()},
                          {"idle time (bubbles and exposed communication) per device", idle_a, idle_b},
                          {"slowest optimizer step", optimizer(a), optimizer(b)}};
    // The component that grew most in the slower plan b (one that shrank cannot be why).
    const part* most = nullptr;
    for (const part& p : parts)
        if (p.b > p.a && (!most || p.b - p.a > most->b - most->a)) most = &p;
    if (!most) return "no single part: the slower plan's parts each take less, but they overlap less";
    return std::string(most->name) + ": " + seconds_text(most->a) + " against " + seconds_text(most->b);
}
}  // namespace loom::search::detail

namespace loom::search {

LOOM_INLINE std::string plan_search_result::explain() const {
    std::ostringstream os;
    os << "chosen: " << choices_text(parameters, best.choices) << "\n  " << detail::price_text(best.price) << "\n";
    if (stats.ties) os << "  (" << stats.ties << " other assignments price the same)\n";
    if (runner_up) {
        const double slower = runner_up->price.step_seconds / best.price.step_seconds - 1.0;
        os << "runner-up: " << choices_text(parameters, runner_up->choices) << "\n  "
           << detail::price_text(runner_up->price) << " (" << static_cast<int>(std::lround(slower * 1000)) / 10.0
           << "% slower)\n  what separated them: " << detail::separation_text(best.price, runner_up->price) << "\n";
    } else {
        os << "runner-up: none (no slower assignment is legal and fits)\n";
    }
    os << "searched " << stats.assignments << " assignments: " << stats.refused << " refused, " << stats.priced
       << " priced from their programs, " << stats.over_memory << " over " << detail::gib_text(memory_limit)
       << " per device, " << stats.pruned << " pruned by the bound";
    if (stats.unexplored) os << ", " << stats.unexplored << " left by the budget";
    if (stats.even_cut_only)
        os << ", " << stats.even_cut_only << " with the even stage cut only (more than " << max_boundary_cuts
           << " cuts at their stage count: narrow the boundaries' slack to search them)";
    os << "; gap " << static_cast<int>(std::lround(gap * 1000)) / 10.0 << "%";
    if (gap == 0) os << " (proven best)";
    os << "; " << detail::seconds_text(stats.seconds) << "\n";
    return os.str();
}

LOOM_INLINE plan_search_result search_plan(const graph& model, const plan::plan_spec& space, const cluster& c,
                                           const plan_search_options& o) {
    const std::vector<node_work> work = training_work(model, c.device, o.price);
    return detail::search_assignments(
        space, open_parameter_candidates(space, batch_of(model), space.stages ? plan::detail::layer_count(model, space.stages->repeat) : 0), c, o,
        [&](const plan::plan_spec& candidate) {
            return step_lower_bound(plan::resolve(candidate, model), work, o.price, &model, &c);
        },
        [&](const plan::plan_spec& candidate) { return price_programs(partition::apply_plan(model, candidate), c, o.price); });
}

LOOM_INLINE plan_search_result search_plan(const model_family& model, const plan::plan_spec& space, const cluster& c,
                                           const plan_search_options& o) {
    // Instances' graphs and their training work, by (layers, batch): assignments share them.
    struct instance {
        graph g;
        std::vector<node_work> work;
    };
    std::map<std::pair<std::int64_t, std::int64_t>, instance> instances;
    auto instance_of = [&](std::int64_t layers, std::int64_t batch) -> const instance& {
        auto it = instances.find({layers, batch});
        if (it == instances.end()) {
            graph g = model.forward(layers, batch);
            std::vector<node_work> work = training_work(g, c.device, o.price);
            it = instances.emplace(std::pair{layers, batch}, instance{std::move(g), std::move(work)}).first;
        }
        return it->second;
    };
    auto bound = [&](const plan::plan_spec& candidate) {
        // The bound of each instance's plan (its devices compute what the real ones do),
        // extrapolated over the layers per stage and the micro-batches as the price is.
        const fold_shape s = shape_of(candidate, model);
        const std::vector<std::int64_t> layers = instance_layers(model, s), micro_batches = instance_micro_batches(s);
        const std::int64_t replicas = fold_replicas(s, model, candidate) ? 2 : s.replicas;
        const std::int64_t samples = micro_batch_samples(model, s);
        auto along = [](const std::vector<double>& v, const std::vector<std::int64_t>& at, std::int64_t real) {
            return v.size() == 1 ? v.front() : v[0] + (v[1] - v[0]) * line_position(at, real);
        };
        std::vector<double> by_micro_batches;
        for (std::int64_t mb : micro_batches) {
            std::vector<double> by_layers;
            for (std::int64_t k : layers) {
                const plan::plan_spec p = instance_plan(candidate, s, replicas, mb, k);
                const instance& i = instance_of(instance_depth(s, k), samples * replicas * mb);
                by_layers.push_back(step_lower_bound(plan::resolve(p, i.g), i.work, o.price, &i.g, &c));
            }
            by_micro_batches.push_back(along(by_layers, layers, fold_layers_per_stage(s)));
        }
        return along(by_micro_batches, micro_batches, s.micro_batches);
    };
    return detail::search_assignments(space, open_parameter_candidates(space, model.batch, model.layers), c, o, bound,
                                      [&](const plan::plan_spec& candidate) { return price_folded(model, candidate, c, o.price).price; });
}

}  // namespace loom::search

namespace loom::search::detail {

LOOM_INLINE void concrete_boundaries(plan::plan_spec& p, const std::vector<open_parameter>& params) {
    for (const open_parameter& param : params) {
        if (param.what != open_parameter::kind::boundaries || !p.stages) continue;
        const std::vector<std::int64_t> starts =
            plan::detail::stage_starts(*p.stages, p.choices, param.layers, static_cast<int>(boundary_ranges(p)));
        p.stages->boundaries.assign(starts.begin() + 1, starts.end());
        p.stages->boundaries_open.clear();
        p.stages->boundary_slack = -1;
        p.choices.erase(param.name);
    }
}

LOOM_INLINE plan_search_result search_assignments(const plan::plan_spec& space, std::vector<open_parameter> parameters,
                                                  const cluster& c, const plan_search_options& o,
                                                  const bound_function& bound_of, const price_function& price_of) {
    const auto started = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(); };
    if (space.devices > c.devices())
        throw search_error("search_plan: the plan is for " + std::to_string(space.devices) + " devices but cluster '" +
                           c.name + "' has " + std::to_string(c.devices()) +
                           "; give a plan for at most that many devices or a larger cluster");
    plan_search_result result;
    result.parameters = std::move(parameters);
    result.memory_limit = o.memory_limit > 0 ? o.memory_limit : c.device.memory_bytes;
    const auto& params = result.parameters;
    plan_search_statistics& stats = result.stats;

    // 1-3: every assignment, resolved and bounded.
    struct leaf {
        std::map<std::string, std::int64_t> choices;
        double bound = 0;
        std::int64_t index = 0;
    };
    std::vector<leaf> leaves;
    std::map<std::string, std::string> refusal_example;  // reason -> an assignment refused for it
    auto refuse = [&](const std::string& why, const std::map<std::string, std::int64_t>& choices) {
        ++stats.refused;
        if (++stats.refusals[why] == 1) refusal_example[why] = choices_text(params, choices);
    };
    for_each_assignment(space, params, [&](const plan::plan_spec& candidate) {
        for (const open_parameter& p : params)
            if (even_cut_only(p, candidate)) ++stats.even_cut_only;
        try {
            leaves.push_back({candidate.choices, bound_of(candidate), stats.assignments});
        } catch (const plan_error& e) {
            refuse(e.what(), candidate.choices);
        } catch (const shape_error& e) {
            refuse(e.what(), candidate.choices);
        }
        ++stats.assignments;
    });
    std::stable_sort(leaves.begin(), leaves.end(), [](const leaf& a, const leaf& b) { return a.bound < b.bound; });

    // 4: best first.
    std::optional<priced_assignment> best, second;
    std::optional<priced_assignment> smallest_over;  // the least memory among those over the limit
    std::size_t next = 0;
    for (; next < leaves.size(); ++next) {
        const leaf& l = leaves[next];
        if (second && l.bound >= second->price.step_seconds) break;
        if ((o.time_budget_seconds > 0 && elapsed() > o.time_budget_seconds && best) ||
            (o.max_priced > 0 && stats.priced >= o.max_priced && best))
            break;
        plan::plan_spec candidate = space;
        candidate.choices = l.choices;
        program_price price;
        try {
            price = price_of(candidate);
        } catch (const plan_error& e) {
            refuse(e.what(), l.choices);
            continue;
        } catch (const shape_error& e) {
            refuse(e.what(), l.choices);
            continue;
        }
        ++stats.priced;
        priced_assignment pa{l.choices, l.bound, std::move(price)};
        if (pa.price.peak_memory() > result.memory_limit) {
            ++stats.over_memory;
            if (!smallest_over || pa.price.peak_memory() < smallest_over->price.peak_memory()) smallest_over = pa;
            continue;
        }
        // The runner-up is the best of the strictly slower plans: a plan that prices the
        // same as the best (ZeRO over one replica, an order of one stage) explains nothing.
        const auto same = [](double a, double b) { return std::abs(a - b) <= 1e-12 * std::max(a, b); };
        if (best && same(pa.price.step_seconds, best->price.step_seconds)) {
            ++stats.ties;
        } else if (!best || pa.price.step_seconds < best->price.step_seconds) {
            second = std::move(best);
            best = std::move(pa);
            stats.ties = 0;
        } else if (!second || pa.price.step_seconds < second->price.step_seconds) {
            second = std::move(pa);
        }
    }
    // Leaves after `next` were not priced: pruned when the bound stopped the search, else
    // left by the budget.
    const bool proven = next == leaves.size() || (second && leaves[next].bound >= second->price.step_seconds);
    for (std::size_t k = next; k < leaves.size(); ++k) ++(proven ? stats.pruned : stats.unexplored);
    stats.seconds = elapsed();

    if (!best) {
        std::string why = "search_plan: no plan in the space fits: ";
        if (stats.assignments == stats.refused) {
            why += "every one of its " + std::to_string(stats.assignments) + " assignments is refused:";
        } else {
            why += std::to_string(stats.refused) + " of " + std::to_string(stats.assignments) + " assignments are refused";
            if (smallest_over)
                why += " and the other " + std::to_string(stats.over_memory) + " exceed " +
                       detail::gib_text(result.memory_limit) + " per device (the smallest, " +
                       choices_text(params, smallest_over->choices) + ", needs " +
                       detail::gib_text(smallest_over->price.peak_memory()) + " on device " +
                       std::to_string(smallest_over->price.peak_memory_device()) +
                       "; add devices, recompute, ZeRO or micro-batches to the space, or raise the memory limit)";
            if (stats.refused) why += "; refusals:";
        }
        std::vector<std::pair<std::int64_t, std::string>> reasons;
        for (const auto& [r, n] : stats.refusals) reasons.push_back({n, r});
        std::stable_sort(reasons.begin(), reasons.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
        for (std::size_t k = 0; k < reasons.size() && k < 4; ++k)
            why += "\n  " + std::to_string(reasons[k].first) + " x " + reasons[k].second + " (for example " +
                   refusal_example[reasons[k].second] + ")";
        throw search_error(why);
    }
    result.best = std::move(*best);
    result.runner_up = std::move(second);
    result.plan = space;
    result.plan.choices = result.best.choices;
    concrete_boundaries(result.plan, params);
    if (!proven && next < leaves.size())
        result.gap = std::max(0.0, (result.best.price.step_seconds - leaves[next].bound) / result.best.price.step_seconds);
    return result;
}

}  // namespace loom::search::detail
#endif  // LOOM_HEADER_DEFINITIONS
