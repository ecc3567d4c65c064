#pragma once
// The typed front end: a pipeline template as a type, checked when it is compiled.
//
//   schedule a = order<OneFOneB<4>>::make(8);            // micro-batches known at run time
//   schedule b = order<Interleaved<4, 2>>::make<8>();    // ... or at compile time
//   schedule c = order<ThreeFOneB<4>>::make(8);
//   schedule d = order<Interlaced<4>>::make(8);           // 4 pipeline stages + embedding and head
//   schedule e = order<GPipe<2>>::make(4, cost_model{.forward = 1, .backward = 2});
//
//   using namespace loom::schedule::var;
//   constexpr before f0_first{forward(micro + 1, 0), forward(micro, 1)};
//   schedule g = order<FromConstraints<4, 2, f0_first>>::make(8);   // 4 stages, 2 rounds
//
// Every mistake decidable at compile time is a static_assert whose message names the
// template and the fix (schedule/checks.hpp, e.g. "order<OneFOneB<0>>: 0 pipeline stages; a pipeline
// needs at least one stage; use 1 or more"); make(m) runs the same predicate on m and throws
// schedule_error. schedule::well_formed<Policy[, MicroBatches]> answers the same question as a
// bool, without a hard error (MicroBatches = 0: the count is not given).
#include <array>
#include <optional>
#include <string>
#include <span>
#include <string_view>

#include <loom/core/static_text.hpp>
#include <loom/schedule/checks.hpp>
#include <loom/schedule/constraints.hpp>
#include <loom/schedule/costs.hpp>
#include <loom/schedule/from_constraints.hpp>
#include <loom/schedule/schedule.hpp>
#include <loom/schedule/templates.hpp>

namespace loom::schedule {

namespace detail {

using plan::detail::static_text;

// What every policy type provides: kind, stages, chunks, rounds, its spelling, its
// constraints (user ones; templates keep theirs in templates.hpp) and spec(micro_batches).
template <class Policy>
constexpr policy_view policy_view_of(std::string_view spelling, std::optional<int> micro_batches = std::nullopt) {
    return {Policy::kind,
            spelling,
            Policy::stages,
            Policy::chunks,
            Policy::rounds,
            micro_batches.has_value(),
            micro_batches.value_or(0),
            std::span<const before>(Policy::constraints)};
}

inline constexpr std::array<before, 0> no_constraints{};

}  // namespace detail

template <int Stages>
struct GPipe {
    static constexpr detail::policy_kind kind = detail::policy_kind::gpipe;
    static constexpr int stages = Stages, chunks = 1, rounds = 1;
    static constexpr detail::static_text spelling{detail::concat("GPipe<", Stages, ">")};
    static constexpr const auto& constraints = detail::no_constraints;
    static schedule_spec spec(int micro_batches) { return gpipe_spec(Stages, micro_batches); }
};

template <int Stages>
struct OneFOneB {
    static constexpr detail::policy_kind kind = detail::policy_kind::one_f_one_b;
    static constexpr int stages = Stages, chunks = 1, rounds = 1;
    static constexpr detail::static_text spelling{detail::concat("OneFOneB<", Stages, ">")};
    static constexpr const auto& constraints = detail::no_constraints;
    static schedule_spec spec(int micro_batches) { return one_f_one_b_spec(Stages, micro_batches); }
};

// Stages pipeline stages (devices), Virtual chunks per device.
template <int Stages, int Virtual>
struct Interleaved {
    static constexpr detail::policy_kind kind = detail::policy_kind::interleaved;
    static constexpr int stages = Stages, chunks = Virtual, rounds = 1;
    static constexpr detail::static_text spelling{detail::concat("Interleaved<", Stages, ", ", Virtual, ">")};
    static constexpr const auto& constraints = detail::no_constraints;
    static schedule_spec spec(int micro_batches) { return interleaved_spec(Stages, Virtual, micro_batches); }
};

template <int Stages>
struct ThreeFOneB {
    static constexpr detail::policy_kind kind = detail::policy_kind::three_f_one_b;
    static constexpr int stages = Stages, chunks = 1, rounds = 3;
    static constexpr detail::static_text spelling{detail::concat("ThreeFOneB<", Stages, ">")};
    static constexpr const auto& constraints = detail::no_constraints;
    static schedule_spec spec(int micro_batches) { return three_f_one_b_spec(Stages, micro_batches); }
};

// Stages pipeline stages, one device each, between an embedding and an LM head on all devices.
template <int Stages>
struct Interlaced {
    static constexpr detail::policy_kind kind = detail::policy_kind::interlaced;
    static constexpr int stages = Stages, chunks = 1, rounds = 1;
    static constexpr detail::static_text spelling{detail::concat("Interlaced<", Stages, ">")};
    static constexpr const auto& constraints = detail::no_constraints;
    static schedule_spec spec(int micro_batches) { return interlaced_spec(Stages, micro_batches); }
};

// Stages stages on one device each, Rounds forward rounds, ordered by Constraints alone.
template <int Stages, int Rounds, before... Constraints>
struct FromConstraints {
    static constexpr detail::policy_kind kind = detail::policy_kind::from_constraints;
    static constexpr int stages = Stages, chunks = 1, rounds = Rounds;
    static constexpr detail::static_text spelling{
        detail::concat("FromConstraints<", Stages, ", ", Rounds, sizeof...(Constraints) ? ", ...>" : ">")};
    static constexpr std::array<before, sizeof...(Constraints)> constraints{Constraints...};
    static schedule_spec spec(int micro_batches) {
        return {"FromConstraints", pipeline_shape::linear(Stages, micro_batches, Rounds),
                std::vector<before>(constraints.begin(), constraints.end())};
    }
};

namespace detail {

template <class Policy>
inline constexpr static_text order_spelling{concat("order<", Policy::spelling.view(), ">")};

template <class Policy>
inline constexpr plan::detail::message policy_error{
    first_policy_error(policy_view_of<Policy>(order_spelling<Policy>.view()))};

// A base of order<Policy>: instantiating order<Policy> checks Policy.
template <class Policy>
struct checked_policy : ill_formed_schedule<policy_error<Policy>> {};

}  // namespace detail

template <class Policy>
struct order : detail::checked_policy<Policy> {
    static constexpr std::string_view name() { return detail::order_spelling<Policy>.view(); }

    // The shape and constraints for this many micro-batches (throws schedule_error when m
    // does not fit the template, with the same message as a compile-time count).
    static schedule_spec spec(int micro_batches) {
        const std::string spelling = std::string(name()) + "::make(" + std::to_string(micro_batches) + ")";
        const auto view = detail::policy_view_of<Policy>(spelling, micro_batches);
        if (auto e = detail::first_policy_error(view); !e.empty()) throw schedule_error(e.str());
        return Policy::spec(micro_batches);
    }

    static schedule make(int micro_batches, const cost_model& costs = {}) {
        return from_constraints(spec(micro_batches), costs);
    }

    template <int MicroBatches>
    static schedule make(const cost_model& costs = {}) {
        static constexpr detail::static_text spelling{detail::concat(name(), "::make<", MicroBatches, ">")};
        constexpr plan::detail::message error{
            detail::first_policy_error(detail::policy_view_of<Policy>(spelling.view(), MicroBatches))};
        if constexpr (!error.empty()) (void)ill_formed_schedule<error>{};
        return make(MicroBatches, costs);
    }
};

namespace detail {
template <class Policy, int MicroBatches>
constexpr text well_formed_error() {
    return first_policy_error(policy_view_of<Policy>(
        order_spelling<Policy>.view(), MicroBatches == 0 ? std::nullopt : std::optional<int>(MicroBatches)));
}
}  // namespace detail

// Does order<Policy> (and make<MicroBatches>, when given) pass every compile-time check?
// MicroBatches = 0: the count is not given.
template <class Policy, int MicroBatches = 0>
inline constexpr bool well_formed = detail::well_formed_error<Policy, MicroBatches>().empty();

// The first mistake, as the checks word it ("" when well-formed): error_message<...>.view().
template <class Policy, int MicroBatches = 0>
inline constexpr plan::detail::message error_message{detail::well_formed_error<Policy, MicroBatches>()};

}  // namespace loom::schedule
