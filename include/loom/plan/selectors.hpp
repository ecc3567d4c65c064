#pragma once
// Selectors: which ops a rule applies to, and the rule they make with their pieces.
//
//   on<ops::Linear, ops::LinearBias>(pieces...)   op kinds
//   on_name<"blocks.*.mlp*">(pieces...)           a glob over node names ('*' any text, '?' one character)
//   on_scope<"*.attn">(pieces...)                 a glob over layer scope paths
//   on_layers<"blocks", 0, 3>(pieces...)          layers 0..3 (inclusive) of the repeat "blocks";
//                                                 on_layers<"blocks", 4>: from layer 4 to the end
//   on_all(pieces...)                             every op
//
// Pieces are a trans, an assign or colocate, and recompute (at most one of each). A
// selector may wrap one rule to narrow it: on_scope<"*.attn">(on<ops::Attention>(...))
// selects attention ops inside attention scopes.
//
// on<...> names op kinds, so its rule's splits are checked against their signatures here:
// a variable the op lacks or freezes, and, for ops that bind their variables to fixed dims
// (a static `variable_dims` table, e.g. ops::Attention), a dim the op lacks or freezes.
// A frozen variable that a custom transformation cuts (plan/transformation.hpp) is allowed
// when it is listed in plan::transformable_variables<Op>.
#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/list.hpp>

#include <loom/core/fixed_string.hpp>
#include <loom/graph/op.hpp>
#include <loom/plan/assign.hpp>
#include <loom/plan/checks.hpp>
#include <loom/plan/rules.hpp>
#include <loom/core/static_text.hpp>
#include <loom/plan/trans.hpp>

namespace loom::ops {
struct LinearBias;
struct CrossEntropy;
}

namespace loom::plan {

// Labels for plan::transformable_variables: variable_labels<"k">::values.
template <fixed_string... Labels>
struct variable_labels {
    static constexpr std::array<std::string_view, sizeof...(Labels)> values{Labels.view()...};
};

// The frozen variables of Op that a registered custom transformation cuts, so that the
// compile-time checks let a plan split them. Specialize next to the registration:
//   template <> inline constexpr std::span<const std::string_view>
//       plan::transformable_variables<MyOp> = plan::variable_labels<"k">::values;
template <class Op>
inline constexpr std::span<const std::string_view> transformable_variables{};

// Built in (plan/transformation.hpp): Megatron's row-parallel linear with bias.
template <>
inline constexpr std::span<const std::string_view> transformable_variables<ops::LinearBias> =
    variable_labels<"k">::values;
// And vocabulary-parallel cross-entropy.
template <>
inline constexpr std::span<const std::string_view> transformable_variables<ops::CrossEntropy> =
    variable_labels<"v">::values;

namespace detail {

template <op_kind Op>
constexpr op_view op_view_of() {
    std::span<const std::pair<std::string_view, dim_id>> dims;
    if constexpr (requires { Op::variable_dims; }) dims = Op::variable_dims;
    return {Op::name, &Op::sig, dims, transformable_variables<Op>};
}

// ---- filters: the conditions a selector ANDs ------------------------------------------------

struct all_filter {
    static constexpr static_text spelling{"on_all"};
    static constexpr void describe(rule_view&) {}
    static void lower(selector&) {}
};

template <op_kind... Ops>
struct kinds_filter {
    static constexpr std::array<op_view, sizeof...(Ops)> ops{op_view_of<Ops>()...};
    static constexpr static_text spelling{[] {
        text s = "on<";
        for (std::size_t i = 0; i < ops.size(); ++i) append(s, concat(i ? ", " : "", ops[i].name));
        append(s, ">");
        return s;
    }()};
    static constexpr void describe(rule_view& r) {
        ++r.kind_filters;
        r.kinds = ops;
    }
    static void lower(selector& s) { s.kinds = {&op_def_of<Ops>()...}; }
};

template <fixed_string Pattern>
struct name_filter {
    static constexpr static_text spelling{concat("on_name<\"", Pattern.view(), "\">")};
    static constexpr void describe(rule_view& r) {
        ++r.name_filters;
        r.empty_pattern = r.empty_pattern || Pattern.size() == 0;
    }
    static void lower(selector& s) { s.name = std::string(Pattern.view()); }
};

template <fixed_string Pattern>
struct scope_filter {
    static constexpr static_text spelling{concat("on_scope<\"", Pattern.view(), "\">")};
    static constexpr void describe(rule_view& r) {
        ++r.scope_filters;
        r.empty_pattern = r.empty_pattern || Pattern.size() == 0;
    }
    static void lower(selector& s) { s.scope = std::string(Pattern.view()); }
};

template <fixed_string Repeat, std::int64_t First, std::int64_t Last>
struct layer_filter {
    static constexpr static_text spelling{[] {
        text s = concat("on_layers<\"", Repeat.view(), "\", ", First);
        if (Last >= 0) append(s, concat(", ", Last));
        append(s, ">");
        return s;
    }()};
    static constexpr void describe(rule_view& r) {
        ++r.layer_filters;
        r.repeat = Repeat.view();
        r.first_layer = First;
        r.last_layer = Last;
    }
    static void lower(selector& s) {
        s.repeat = std::string(Repeat.view());
        s.first_layer = First;
        s.last_layer = Last;
    }
};

// The filters of a rule, outermost first.
template <class... Filters>
struct selector_t {
    // on_scope<"*.attn">(on<attention>(...))
    static constexpr static_text spelling{[] {
        text s;
        std::size_t depth = 0;
        (append(s, concat(depth++ ? "(" : "", Filters::spelling.view())), ...);
        if (depth > 1) append(s, "(...)");
        for (std::size_t i = 1; i < depth; ++i) append(s, ")");
        return s;
    }()};
    static constexpr void describe(rule_view& r) {
        r.selector = spelling.view();
        (Filters::describe(r), ...);
    }
    static selector lower() {
        selector s;
        (Filters::lower(s), ...);
        return s;
    }
};

template <class T>
concept plan_piece = requires {
    { T::piece } -> std::convertible_to<piece_kind>;
};

template <class Piece>
constexpr void describe_piece(rule_view& r) {
    if constexpr (Piece::piece == piece_kind::trans) {
        if (r.trans_count++ == 0) {
            r.trans = Piece::spelling.view();
            r.splits = Piece::splits;
        }
    } else if constexpr (Piece::piece == piece_kind::assign) {
        if (r.assign_count++ == 0) {
            r.assign = Piece::spelling.view();
            r.explicit_devices = true;
            r.devices = Piece::devices;
        }
    } else if constexpr (Piece::piece == piece_kind::colocate) {
        if (r.assign_count++ == 0) {
            r.assign = Piece::spelling.view();
            r.colocate = Piece::pieces_per_device;
            r.coshard = Piece::coshard;
        }
    } else {
        ++r.recompute_count;
        if constexpr (requires { Piece::open; }) r.recompute_open = Piece::open;
    }
}

}  // namespace detail

// A rule: a selector and its pieces (a trans, an op-assign, recompute). Made by on(...) and
// the other selectors; `view` is what the checks read.
template <class Selector, class Pieces>
struct rule_t;

template <class Selector, class... Pieces>
struct rule_t<Selector, std::tuple<Pieces...>> {
    using selector_type = Selector;
    std::tuple<Pieces...> pieces;

    static constexpr detail::rule_view view = [] {
        detail::rule_view r;
        Selector::describe(r);
        (detail::describe_piece<Pieces>(r), ...);
        return r;
    }();
};

namespace detail {

template <class T>
struct is_rule : std::false_type {};
template <class S, class P>
struct is_rule<rule_t<S, P>> : std::true_type {};

template <class T>
concept rule_argument = plan_piece<T> || is_rule<T>::value;

template <class T>
struct selector_of {
    using type = selector_t<>;
};
template <class S, class P>
struct selector_of<rule_t<S, P>> {
    using type = S;
};

template <class T>
struct pieces_of {
    using type = std::tuple<T>;
};
template <class S, class P>
struct pieces_of<rule_t<S, P>> {
    using type = P;
};

template <class Filter, class... Args>
using rule_from_t = rule_t<boost::mp11::mp_append<selector_t<Filter>, typename selector_of<Args>::type...>,
                           boost::mp11::mp_append<std::tuple<>, typename pieces_of<Args>::type...>>;

template <class... Args>
inline constexpr std::size_t nested_rules_v = (std::size_t{0} + ... + (is_rule<Args>::value ? 1 : 0));

template <class T>
constexpr auto as_pieces(const T& piece) {
    if constexpr (is_rule<T>::value)
        return piece.pieces;
    else
        return std::tuple<T>(piece);
}

// The rule's own mistakes stop the compilation here (a bad trans already stopped it where
// it was written, so its rules are not reported again).
template <class Rule>
constexpr void report_rule_errors() {
    constexpr message error{[] {
        text e;
        if (first_trans_error(Rule::view).empty()) e = first_rule_error(Rule::view);
        return e;
    }()};
    if constexpr (!error.empty()) (void)ill_formed_plan<error>{};
}

template <class Filter, class... Args>
constexpr rule_from_t<Filter, Args...> make_rule(const Args&... args) {
    using rule_type = rule_from_t<Filter, Args...>;
    report_rule_errors<rule_type>();
    return rule_type{std::tuple_cat(as_pieces(args)...)};
}

}  // namespace detail

template <op_kind... Ops, detail::rule_argument... Args>
    requires(detail::nested_rules_v<Args...> <= 1)
constexpr detail::rule_from_t<detail::kinds_filter<Ops...>, Args...> on(Args... args) {
    return detail::make_rule<detail::kinds_filter<Ops...>>(args...);
}

template <fixed_string Pattern, detail::rule_argument... Args>
    requires(detail::nested_rules_v<Args...> <= 1)
constexpr detail::rule_from_t<detail::name_filter<Pattern>, Args...> on_name(Args... args) {
    return detail::make_rule<detail::name_filter<Pattern>>(args...);
}

template <fixed_string Pattern, detail::rule_argument... Args>
    requires(detail::nested_rules_v<Args...> <= 1)
constexpr detail::rule_from_t<detail::scope_filter<Pattern>, Args...> on_scope(Args... args) {
    return detail::make_rule<detail::scope_filter<Pattern>>(args...);
}

template <fixed_string Repeat, std::int64_t First, std::int64_t Last = -1, detail::rule_argument... Args>
    requires(detail::nested_rules_v<Args...> <= 1)
constexpr detail::rule_from_t<detail::layer_filter<Repeat, First, Last>, Args...> on_layers(Args... args) {
    return detail::make_rule<detail::layer_filter<Repeat, First, Last>>(args...);
}

template <detail::rule_argument... Args>
    requires(detail::nested_rules_v<Args...> <= 1)
constexpr detail::rule_from_t<detail::all_filter, Args...> on_all(Args... args) {
    return detail::make_rule<detail::all_filter>(args...);
}

}  // namespace loom::plan
