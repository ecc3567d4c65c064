#pragma once
// op-trans: how a rule cuts the ops it selects.
//
//   trans<Split<Dim::Batch>, 4>                    4 pieces along the batch
//   trans<Split<Var<"n">>, 2>                      along the signature variable n ("... k, n k -> ... n")
//   trans<Replicate, 4>                            4 whole copies
//   trans<Split<Dim::Batch>, 2, Split<Dim::Head>, 2>   nested, outermost first: 4 pieces,
//                                                  piece (i, j) = batch slice i, head slice j
//
// Each degree is a number, open<Range[, "name"]>, runtime (a constructor argument, in the
// order of the runtime slots) or all_devices; see plan/degree.hpp. Up to four pairs.
// Mistakes of the trans alone (a degree below 1, an empty open range, a dim split twice)
// stop the compilation where the trans is written; those that depend on the ops or on the
// plan's constraints are checked by on<...>(...) and compose(...).
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <loom/core/dim.hpp>
#include <loom/core/fixed_string.hpp>
#include <loom/plan/checks.hpp>
#include <loom/plan/degree.hpp>
#include <loom/core/static_text.hpp>

namespace loom::plan {

// A signature variable by its label: Split<Var<"n">>.
template <fixed_string Label>
struct Var {
    static constexpr std::string_view label = Label.view();
};

// What a trans cuts along: a dim tag (Split<Dim::Batch>) or a variable (Split<Var<"n">>).
template <class Target>
struct Split;

template <dim_tag D>
struct Split<D> {
    static constexpr detail::split_kind kind = detail::split_kind::dim;
    static constexpr std::string_view target = D::name;
};

template <fixed_string Label>
struct Split<Var<Label>> {
    static constexpr detail::split_kind kind = detail::split_kind::variable;
    static constexpr std::string_view target = Var<Label>::label;
};

// Whole copies instead of cuts.
struct Replicate {
    static constexpr detail::split_kind kind = detail::split_kind::replicate;
    static constexpr std::string_view target = "";
};

// What a trans pair starts with: Split<Dim::D>, Split<Var<"v">> or Replicate.
template <class T>
concept split_target = requires {
    { T::kind } -> std::convertible_to<detail::split_kind>;
    { T::target } -> std::convertible_to<std::string_view>;
};

namespace detail {

enum class piece_kind : std::uint8_t { trans, assign, colocate, recompute };

// The "nothing here" of trans' optional split pairs.
struct no_split {};

template <class Target, auto Degree>
constexpr split_view split_view_of() {
    return {Target::kind, Target::target, degree_view_of<Degree>()};
}

// Appends ", Split<Head>, 2" (nothing for an absent pair; no degree for a missing one).
template <class Target, auto Degree>
constexpr void append_split_pair(text& out) {
    if constexpr (!std::is_same_v<Target, no_split>) {
        append(out, concat(", ", target_spelling(Target::kind, Target::target)));
        if constexpr (!std::is_same_v<std::remove_cv_t<decltype(Degree)>, no_degree>)
            append(out, concat(", ", degree_spelling<Degree>()));
    }
}

template <std::size_t Given, std::size_t Needed>
concept pass_one_value_per_runtime_degree = Given == Needed;

template <class... Targets>
inline constexpr std::size_t split_count_v =
    (std::size_t{0} + ... + (std::is_same_v<Targets, no_split> ? 0 : 1));

template <class T>
concept split_target_or_none = split_target<T> || std::is_same_v<T, no_split>;

}  // namespace detail

template <split_target T0, auto D0, detail::split_target_or_none T1 = detail::no_split, auto D1 = detail::no_degree{},
          detail::split_target_or_none T2 = detail::no_split, auto D2 = detail::no_degree{},
          detail::split_target_or_none T3 = detail::no_split, auto D3 = detail::no_degree{}>
class trans {
public:
    static constexpr detail::piece_kind piece = detail::piece_kind::trans;

    static constexpr std::size_t split_count = detail::split_count_v<T0, T1, T2, T3>;

    // The splits as the checks see them; runtime degrees are unknown here.
    static constexpr std::array<detail::split_view, split_count> splits = [] {
        std::array<detail::split_view, split_count> out{};
        std::size_t n = 0;
        out[n++] = detail::split_view_of<T0, D0>();
        if constexpr (!std::is_same_v<T1, detail::no_split>) out[n++] = detail::split_view_of<T1, D1>();
        if constexpr (!std::is_same_v<T2, detail::no_split>) out[n++] = detail::split_view_of<T2, D2>();
        if constexpr (!std::is_same_v<T3, detail::no_split>) out[n++] = detail::split_view_of<T3, D3>();
        return out;
    }();

    static constexpr std::size_t runtime_count = [] {
        std::size_t n = 0;
        for (const auto& s : splits) n += s.degree.kind == detail::degree_kind::runtime ? 1 : 0;
        return n;
    }();

    // "plan::trans<Split<Batch>, 2, Split<Head>, open<Pow2<1, 8>>>"
    static constexpr detail::static_text spelling{[] {
        detail::text s;
        detail::append_split_pair<T0, D0>(s);
        detail::append_split_pair<T1, D1>(s);
        detail::append_split_pair<T2, D2>(s);
        detail::append_split_pair<T3, D3>(s);
        return detail::concat("plan::trans<", s.view().substr(2), ">");
    }()};

    // The degrees of the runtime slots, in order.
    std::array<std::int64_t, runtime_count> runtime_degrees{};

    // One value per runtime slot, in order; a count that differs names the constraint
    // pass_one_value_per_runtime_degree<given, needed> in the compiler's message.
    template <std::convertible_to<std::int64_t>... Values>
        requires detail::pass_one_value_per_runtime_degree<sizeof...(Values), runtime_count>
    constexpr trans(Values... values) : runtime_degrees{static_cast<std::int64_t>(values)...} {
        constexpr detail::message error{detail::first_trans_error(alone())};
        if constexpr (!error.empty()) (void)ill_formed_plan<error>{};
    }

    // The trans as a rule of its own, for the checks of the trans alone.
    static constexpr detail::rule_view alone() {
        detail::rule_view r;
        r.selector = "on_all";
        r.trans_count = 1;
        r.trans = spelling.view();
        r.splits = splits;
        return r;
    }
};

}  // namespace loom::plan

namespace loom {
// The split targets read as vocabulary next to the dims: trans<Split<Dim::Batch>, 4>.
using plan::Replicate;
using plan::Split;
using plan::Var;
}  // namespace loom
