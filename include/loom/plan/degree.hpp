#pragma once
// The degree slot of plan::trans: one `auto` template parameter that holds a number fixed
// by the plan, an open parameter filled from a range through choose() (or a plan file's
// choices), a value known only at run time, or the plan's device count:
//
//   trans<Split<Dim::Batch>, 4>                          fixed
//   trans<Split<Dim::Batch>, open<Pow2<1, 16>>>          open, named "trans#0.degree" by default
//   trans<Split<Dim::Batch>, open<Pow2<1, 16>, "dp">>    open, named "dp"; every slot that says
//                                                        "dp" takes the same value
//   trans<Split<Dim::Batch>, runtime>{world_size}        given to the constructor
//   trans<Split<Dim::Batch>, all_devices>                the plan's device count
//
// Ranges of open parameters:
//   Pow2<1, 16>      -> 1, 2, 4, 8, 16 (the powers of two in [1, 16])
//   OneOf<1, 2, 3, 6> -> 1, 2, 3, 6
//   DivisorsOf<12>   -> 1, 2, 3, 4, 6, 12
//   AnyPositive      -> any degree >= 1 (the default: open<>)
// The same degree_view describes all of them to the checks (plan/checks.hpp), so one
// predicate judges a fixed degree at compile time and a run-time one when it is known.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

#include <loom/core/fixed_string.hpp>
#include <loom/core/static_text.hpp>

namespace loom::plan {

namespace detail {

enum class degree_kind : std::uint8_t { fixed, open, runtime, all_devices, missing };

struct degree_view {
    degree_kind kind = degree_kind::fixed;
    std::int64_t value = 0;
    bool known = false;             // value holds the degree (fixed; runtime and open once given)
    std::string_view name;          // open: the user's name; empty: derived from the rule
    std::string_view range;         // open: the range as written, "Pow2<1, 16>"
    std::span<const std::int64_t> allowed;  // open: the range's values
    bool any_positive = false;      // open<> / open<AnyPositive>: no range
};

constexpr std::size_t count_powers_of_two(std::int64_t lo, std::int64_t hi) {
    std::size_t n = 0;
    for (std::int64_t v = 1; v <= hi; v *= 2) {
        if (v >= lo) ++n;
        if (v > hi / 2) break;
    }
    return n;
}

template <std::int64_t Lo, std::int64_t Hi>
constexpr auto powers_of_two() {
    std::array<std::int64_t, count_powers_of_two(Lo, Hi)> values{};
    std::size_t n = 0;
    for (std::int64_t v = 1; v <= Hi; v *= 2) {
        if (v >= Lo) values[n++] = v;
        if (v > Hi / 2) break;
    }
    return values;
}

constexpr std::size_t count_divisors(std::int64_t n) {
    std::size_t count = 0;
    for (std::int64_t d = 1; d <= n; ++d)
        if (n % d == 0) ++count;
    return count;
}

template <std::int64_t N>
constexpr auto divisors() {
    std::array<std::int64_t, count_divisors(N)> values{};
    std::size_t n = 0;
    for (std::int64_t d = 1; d <= N; ++d)
        if (N % d == 0) values[n++] = d;
    return values;
}

}  // namespace detail

// ---- ranges ------------------------------------------------------------------------------

struct AnyPositive {
    static constexpr bool any_positive = true;
    static constexpr std::array<std::int64_t, 0> values{};
    static constexpr detail::static_text spelling{"AnyPositive"};
};

template <std::int64_t Lo, std::int64_t Hi>
struct Pow2 {
    static constexpr bool any_positive = false;
    static constexpr auto values = detail::powers_of_two<Lo, Hi>();
    static constexpr detail::static_text spelling{detail::concat("Pow2<", Lo, ", ", Hi, ">")};
};

template <std::int64_t... Values>
struct OneOf {
    static constexpr bool any_positive = false;
    static constexpr std::array<std::int64_t, sizeof...(Values)> values{Values...};
    static constexpr detail::static_text spelling{
        detail::concat("OneOf<", detail::join(std::array<std::int64_t, sizeof...(Values)>{Values...}), ">")};
};

// Divisors by trial up to N: meant for extents and device counts, not for huge numbers.
template <std::int64_t N>
struct DivisorsOf {
    static constexpr bool any_positive = false;
    static constexpr auto values = detail::divisors<N>();
    static constexpr detail::static_text spelling{detail::concat("DivisorsOf<", N, ">")};
};

// ---- the degree values ---------------------------------------------------------------------

template <class Range, fixed_string Name>
struct open_degree {
    using range = Range;
    static constexpr std::string_view name = Name.view();
};

// An open parameter: choose() fills it from Range.
template <class Range = AnyPositive, fixed_string Name = "">
inline constexpr open_degree<Range, Name> open{};

// A degree known at run time, passed to the constructor: trans<Split<Dim::Batch>, runtime>{n}.
struct runtime_degree {};
inline constexpr runtime_degree runtime{};

// The plan's device count (devices<N>, or spec(n)).
struct all_devices_degree {};
inline constexpr all_devices_degree all_devices{};

namespace detail {

// The "nothing here" of trans' optional split pairs.
struct no_degree {};

template <class T>
struct is_open_degree : std::false_type {};
template <class Range, fixed_string Name>
struct is_open_degree<open_degree<Range, Name>> : std::true_type {};

// What a degree slot holds, as seen by the checks, and how it is written.
template <auto Degree>
constexpr degree_view degree_view_of() {
    using D = std::remove_cv_t<decltype(Degree)>;
    if constexpr (std::is_integral_v<D> && !std::is_same_v<D, bool>) {
        return {degree_kind::fixed, static_cast<std::int64_t>(Degree), true, {}, {}, {}, false};
    } else if constexpr (is_open_degree<D>::value) {
        using R = typename D::range;
        return {degree_kind::open, 0, false, D::name, R::spelling.view(), R::values, R::any_positive};
    } else if constexpr (std::is_same_v<D, runtime_degree>) {
        return {degree_kind::runtime, 0, false, {}, {}, {}, false};
    } else if constexpr (std::is_same_v<D, all_devices_degree>) {
        return {degree_kind::all_devices, 0, false, {}, {}, {}, false};
    } else {
        return {degree_kind::missing, 0, false, {}, {}, {}, false};
    }
}

template <auto Degree>
constexpr text degree_spelling() {
    using D = std::remove_cv_t<decltype(Degree)>;
    if constexpr (std::is_integral_v<D> && !std::is_same_v<D, bool>) {
        return decimal(static_cast<std::int64_t>(Degree));
    } else if constexpr (is_open_degree<D>::value) {
        using R = typename D::range;
        text s = "open<";
        if (!std::is_same_v<R, AnyPositive> || !D::name.empty()) append(s, R::spelling.view());
        if (!D::name.empty()) append(s, concat(", \"", D::name, "\""));
        append(s, ">");
        return s;
    } else if constexpr (std::is_same_v<D, runtime_degree>) {
        return "runtime";
    } else if constexpr (std::is_same_v<D, all_devices_degree>) {
        return "all_devices";
    } else {
        return "?";
    }
}

}  // namespace detail

}  // namespace loom::plan

namespace loom {
// The ranges read as vocabulary next to the dims: open<Pow2<1, 16>>.
using plan::AnyPositive;
using plan::DivisorsOf;
using plan::OneOf;
using plan::Pow2;
}  // namespace loom
