#pragma once
// Constraints and facts a plan states beside its rules:
//
//   devices<8>                      the device count
//   extent<Dim::Head, 12>           an extent known of the model: degrees along Head must divide 12
//   forbid<Split<Dim::Seq>>         no rule may split Seq (or forbid<Split<Var<"k">>>: no rule splits k)
//   colocation_requires_recompute   colocated pieces (colocate<C>, C > 1) must recompute
//   zero<2>                         ZeRO stage 1, 2 or 3 over the data-parallel devices
//   zero<open<OneOf<0, 1, 3>>>      ... or a choice, made with choose("zero", s)
//
// Each is a value passed to compose(...). The checks (plan/checks.hpp) hold every rule to
// them; a constraint that contradicts another or a rule stops the compilation in compose.
#include <cstdint>
#include <string>

#include <loom/core/dim.hpp>
#include <loom/plan/checks.hpp>
#include <loom/plan/degree.hpp>
#include <loom/plan/op_partition.hpp>
#include <loom/plan/rules.hpp>
#include <loom/core/static_text.hpp>
#include <loom/plan/trans.hpp>

namespace loom::plan {

template <std::int64_t N>
struct devices_t {
    static constexpr detail::static_text spelling{detail::concat("plan::devices<", N, ">")};
    static constexpr detail::fact_view fact{detail::fact_kind::devices, N, {}, {}, {}, spelling.view()};
    static void lower(plan_spec&) {}  // the device count is set by compose(...).spec()
};

template <std::int64_t N>
inline constexpr devices_t<N> devices{};

template <dim_tag D, std::int64_t Extent>
struct extent_t {
    static constexpr detail::static_text spelling{detail::concat("plan::extent<", D::name, ", ", Extent, ">")};
    static constexpr detail::fact_view fact{detail::fact_kind::extent, Extent, D::name, {}, {}, spelling.view()};
    static void lower(plan_spec&) {}  // compose(...).resolve(graph) checks it against the graph
};

template <dim_tag D, std::int64_t Extent>
inline constexpr extent_t<D, Extent> extent{};

template <split_target Target>
struct forbid_t {
    static constexpr detail::static_text spelling{
        detail::concat("plan::forbid<", detail::target_spelling(Target::kind, Target::target), ">")};
    static constexpr detail::fact_view fact{
        detail::fact_kind::forbid, 0, {}, Target::kind, Target::target, spelling.view()};
    // Every typed rule was checked against it; plan::resolve checks every rule again on the
    // model, whichever way a split is spelled.
    static void lower(plan_spec& p) {
        if constexpr (Target::kind == detail::split_kind::dim)
            p.forbidden.push_back({dim_id(Target::target), "", {1, "", {}}, false});
        else
            p.forbidden.push_back({{}, std::string(Target::target), {1, "", {}}, false});
    }
};

template <split_target Target>
inline constexpr forbid_t<Target> forbid{};

struct colocation_requires_recompute_t {
    static constexpr detail::static_text spelling{"plan::colocation_requires_recompute"};
    static constexpr detail::fact_view fact{
        detail::fact_kind::colocation_requires_recompute, 0, {}, {}, {}, spelling.view()};
    static void lower(plan_spec& p) { p.colocation_requires_recompute = true; }
};

inline constexpr colocation_requires_recompute_t colocation_requires_recompute{};

// zero<2>, or an open choice: zero<open<OneOf<0, 1, 3>>> (named "zero" unless the open
// parameter has a name).
template <auto Stage>
struct zero_t {
    static constexpr detail::degree_view degree = detail::degree_view_of<Stage>();
    static constexpr detail::static_text spelling{detail::concat("plan::zero<", detail::degree_spelling<Stage>(), ">")};
    static constexpr detail::fact_view fact{
        detail::fact_kind::zero, degree.known ? degree.value : 0, {}, {}, {}, spelling.view(), degree};
    static void lower(plan_spec& p) {
        if constexpr (degree.kind == detail::degree_kind::open) {
            p.zero_open = degree.name.empty() ? std::string("zero") : std::string(degree.name);
            p.zero_allowed.assign(degree.allowed.begin(), degree.allowed.end());
        } else {
            p.zero = static_cast<zero_stage>(degree.value);
        }
    }
};

template <auto Stage>
inline constexpr zero_t<Stage> zero{};

namespace detail {

template <class T>
concept plan_fact = requires {
    { T::fact } -> std::convertible_to<fact_view>;
};

}  // namespace detail

}  // namespace loom::plan
