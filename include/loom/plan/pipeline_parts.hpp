#pragma once
// The parts of a plan that make it a pipeline, written with the three primitives:
//
//   stages<4>                     op-assign: the layers of "blocks" cut evenly into 4 ranges, each
//                                 on its own group of devices / 4 devices
//   stages<open<Pow2<1, 8>, "pp">, 2>   an open stage count, 2 devices per stage
//   stages<4, open<>>             4 stages, the devices per stage an open parameter
//                                 ("devices_per_stage" unless named); stages x devices per
//                                 stage must make the plan's devices
//   stage_boundaries<3, 10, 11>   explicit ranges: the first layer of every stage after the first
//   open_stage_boundaries<"cut", 1>  ranges the searcher chooses, each within 1 layer of even
//   micro_batches<8>              op-trans: every op cut along the batch into 8, outermost
//   order<OneFOneB>               op-order of the (stage, micro-batch, pass) blocks
//   order<one_of<GPipe, OneFOneB, Interleaved<2>>>   an open choice, named "order"
//
// Policies: GPipe, OneFOneB, Interleaved<V> (V chunks per device group), ThreeFOneB (three
// forward rounds per micro-batch, for recycling models), Interlaced (the ops outside the
// layers on all devices, split by vocabulary over all of them, time-shared with the
// pipeline), and ordered_by<Rounds, before...>
// (an order written as constraints alone, schedule/constraints.hpp).
//
// The plan's rules (trans, assign, presets) cut each op within its stage's group: their
// degrees are per group. plan::compose checks these parts against each other and the rules
// at compile time when they are static (stages dividing the devices, interleaving against the
// micro-batches); plan::resolve runs the same checks, and those that need the model, at run
// time.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <loom/core/fixed_string.hpp>
#include <loom/plan/checks.hpp>
#include <loom/plan/degree.hpp>
#include <loom/plan/op_order.hpp>
#include <loom/plan/rules.hpp>
#include <loom/core/static_text.hpp>
#include <loom/schedule/constraints.hpp>

namespace loom::plan {

// ---- op-assign of layer ranges ------------------------------------------------------------

template <auto Count, auto DevicesPerStage = 0, fixed_string Repeat = "blocks">
struct stages_t {
    static constexpr detail::degree_view degree = detail::degree_view_of<Count>();
    static constexpr detail::degree_view group = detail::degree_view_of<DevicesPerStage>();
    static constexpr bool group_given = !(group.kind == detail::degree_kind::fixed && group.value == 0);
    static constexpr detail::static_text spelling{
        detail::concat("plan::stages<", detail::degree_spelling<Count>(),
                       group_given ? detail::concat(", ", detail::degree_spelling<DevicesPerStage>()) : detail::text(), ">")};
    // value: the devices per stage when fixed (0: the plan's devices / stages, or open).
    static constexpr detail::fact_view fact{
        detail::fact_kind::stages, group.known ? group.value : 0, {}, {}, {}, spelling.view(), degree, 0, group};
    static_assert(degree.kind == detail::degree_kind::fixed || degree.kind == detail::degree_kind::open,
                  "plan::stages<N>: give a number or open<...>");
    static_assert(group.kind == detail::degree_kind::fixed || group.kind == detail::degree_kind::open,
                  "plan::stages<N, G>: give the devices per stage as a number or open<...>");
    static void lower(plan_spec& p) {
        stage_spec& s = p.stages ? *p.stages : p.stages.emplace();
        s.repeat = std::string(Repeat.view());
        s.count = lowered(degree, "stages");
        s.devices_per_stage = lowered(group, "devices_per_stage");
    }

private:
    static degree_spec lowered(const detail::degree_view& d, const char* default_name) {
        if (d.kind == detail::degree_kind::open)
            return {1, d.name.empty() ? std::string(default_name) : std::string(d.name),
                    std::vector<std::int64_t>(d.allowed.begin(), d.allowed.end())};
        return {d.value, "", {}};
    }
};

template <auto Count, auto DevicesPerStage = 0, fixed_string Repeat = "blocks">
inline constexpr stages_t<Count, DevicesPerStage, Repeat> stages{};

// Explicit stage ranges (with plan::stages): stage k + 1 starts at layer FirstLayers[k].
template <std::int64_t... FirstLayers>
struct stage_boundaries_t {
    static constexpr std::array<std::int64_t, sizeof...(FirstLayers)> first_layers{FirstLayers...};
    static constexpr detail::message error{[] {
        for (std::size_t k = 0; k < first_layers.size(); ++k) {
            const std::int64_t before = k == 0 ? 0 : first_layers[k - 1];
            if (first_layers[k] <= before)
                return detail::concat("plan::stage_boundaries<", detail::join(first_layers), ">: layer ",
                                      first_layers[k], " does not come after ", before,
                                      "; stage ranges would overlap or be empty; give strictly increasing first layers");
        }
        return detail::text();
    }()};
    static_assert(error.empty() || sizeof(ill_formed_plan<error>) > 0);
    static constexpr detail::static_text spelling{
        detail::concat("plan::stage_boundaries<", detail::join(first_layers), ">")};
    static constexpr detail::fact_view fact{
        detail::fact_kind::boundaries, static_cast<std::int64_t>(sizeof...(FirstLayers)), {}, {}, {}, spelling.view()};
    static void lower(plan_spec& p) {
        stage_spec& s = p.stages ? *p.stages : p.stages.emplace();
        s.boundaries.assign(first_layers.begin(), first_layers.end());
    }
};

template <std::int64_t... FirstLayers>
inline constexpr stage_boundaries_t<FirstLayers...> stage_boundaries{};

// Open stage ranges (with plan::stages): the searcher chooses where every stage starts, as
// Alpa does. Each range holds within Slack layers of the even cut (a negative Slack: any
// size from one layer); the open parameter's value numbers one cut (plan/stage_ranges.hpp).
template <fixed_string Name = "boundaries", std::int64_t Slack = -1>
struct open_stage_boundaries_t {
    static_assert(!Name.view().empty(), "plan::open_stage_boundaries: give the open parameter a name");
    static constexpr detail::static_text spelling{
        detail::concat("plan::open_stage_boundaries<\"", Name.view(), "\"",
                       Slack >= 0 ? detail::concat(", ", Slack) : detail::text(), ">")};
    // value -1: the number of boundaries is the search's to choose; target: the open name.
    static constexpr detail::fact_view fact{detail::fact_kind::boundaries, -1, {}, {}, Name.view(), spelling.view()};
    static void lower(plan_spec& p) {
        stage_spec& s = p.stages ? *p.stages : p.stages.emplace();
        s.boundaries.clear();
        s.boundaries_open = std::string(Name.view());
        s.boundary_slack = Slack;
    }
};

template <fixed_string Name = "boundaries", std::int64_t Slack = -1>
inline constexpr open_stage_boundaries_t<Name, Slack> open_stage_boundaries{};

// ---- the outermost batch split -------------------------------------------------------------

template <auto Count>
struct micro_batches_t {
    static constexpr detail::degree_view degree = detail::degree_view_of<Count>();
    static constexpr detail::static_text spelling{
        detail::concat("plan::micro_batches<", detail::degree_spelling<Count>(), ">")};
    static constexpr detail::fact_view fact{detail::fact_kind::micro_batches, 0, {}, {}, {}, spelling.view(), degree};
    static_assert(degree.kind == detail::degree_kind::fixed || degree.kind == detail::degree_kind::open,
                  "plan::micro_batches<N>: give a number or open<...>");
    static void lower(plan_spec& p) {
        if constexpr (degree.kind == detail::degree_kind::open)
            p.micro_batches = {1, degree.name.empty() ? std::string("micro_batches") : std::string(degree.name),
                               std::vector<std::int64_t>(degree.allowed.begin(), degree.allowed.end())};
        else
            p.micro_batches = {degree.value, "", {}};
    }
};

template <auto Count>
inline constexpr micro_batches_t<Count> micro_batches{};

// ---- op-order ----------------------------------------------------------------------------

struct GPipe {
    static constexpr std::string_view spelling = "GPipe";
    static order_policy policy() { return {schedule_kind::gpipe}; }
};
struct OneFOneB {
    static constexpr std::string_view spelling = "OneFOneB";
    static order_policy policy() { return {schedule_kind::one_f_one_b}; }
};
template <int Virtual>
struct Interleaved {
    static_assert(Virtual >= 1, "plan::Interleaved<V>: V is the number of model chunks per device group; use 1 or more");
    static constexpr detail::static_text spelling_text{detail::concat("Interleaved<", Virtual, ">")};
    static constexpr std::string_view spelling = spelling_text.view();
    static constexpr int chunks = Virtual;
    static order_policy policy() { return {schedule_kind::interleaved, Virtual}; }
};
struct ThreeFOneB {
    static constexpr std::string_view spelling = "ThreeFOneB";
    static order_policy policy() { return {schedule_kind::three_f_one_b}; }
};
struct Interlaced {
    static constexpr std::string_view spelling = "Interlaced";
    static order_policy policy() { return {schedule_kind::interlaced}; }
};
// An order written as constraints alone, over Rounds forward rounds.
template <int Rounds, schedule::before... Constraints>
struct ordered_by {
    static_assert(Rounds >= 1, "plan::ordered_by<Rounds, ...>: every micro-batch runs at least one forward round");
    static constexpr std::array<schedule::before, sizeof...(Constraints)> constraints{Constraints...};
    // Each constraint on its own (a round the pipeline lacks, a block ordered before itself):
    // the same check the schedule runs on orders built at run time.
    static constexpr detail::message error{[] {
        for (std::size_t i = 0; i < constraints.size(); ++i) {
            const detail::text where = detail::concat("plan::ordered_by<", Rounds, ", ...>: constraint #", static_cast<int>(i));
            if (detail::text e = schedule::first_constraint_error(constraints[i], Rounds, where.view()); !e.empty())
                return e;
        }
        return detail::text();
    }()};
    static_assert(error.empty() || sizeof(ill_formed_plan<error>) > 0);
    static constexpr std::string_view spelling = "ordered_by<...>";
    static order_policy policy() { return {schedule_kind::from_constraints, 1, {Constraints...}, Rounds}; }
};

// A choice among policies: order<one_of<GPipe, OneFOneB>>.
template <class... Policies>
struct one_of {
    static_assert(sizeof...(Policies) >= 1, "plan::one_of<...>: give at least one alternative");
};

namespace detail {

template <class P>
struct order_alternatives {
    static constexpr std::size_t count = 1;
    static std::vector<order_policy> list() { return {P::policy()}; }
    static constexpr text spelling() { return text(P::spelling); }
    static constexpr std::int64_t chunks() {
        if constexpr (requires { P::chunks; })
            return P::chunks;
        else
            return 0;
    }
};
template <class... Ps>
struct order_alternatives<one_of<Ps...>> {
    static constexpr std::size_t count = sizeof...(Ps);
    static std::vector<order_policy> list() { return {Ps::policy()...}; }
    static constexpr text spelling() {
        text out = "one_of<";
        bool first = true;
        ((append(out, first ? text(Ps::spelling) : concat(", ", Ps::spelling)), first = false), ...);
        append(out, ">");
        return out;
    }
    static constexpr std::int64_t chunks() {
        if constexpr (sizeof...(Ps) == 1)
            return order_alternatives<Ps...>::chunks();
        else
            return 0;
    }
};

}  // namespace detail

template <class Policy, fixed_string Name = "order">
struct order_t {
    static constexpr detail::static_text spelling{
        detail::concat("plan::order<", detail::order_alternatives<Policy>::spelling(), ">")};
    static constexpr detail::fact_view fact{detail::fact_kind::order,
                                            0,
                                            {},
                                            {},
                                            detail::order_alternatives<Policy>::count > 1 ? Name.view() : std::string_view(),
                                            spelling.view(),
                                            {},
                                            detail::order_alternatives<Policy>::chunks()};
    static void lower(plan_spec& p) {
        p.order.alternatives = detail::order_alternatives<Policy>::list();
        p.order.open = p.order.alternatives.size() > 1 ? std::string(Name.view()) : std::string();
    }
};

template <class Policy, fixed_string Name = "order">
inline constexpr order_t<Policy, Name> order{};

}  // namespace loom::plan
