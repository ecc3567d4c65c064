#pragma once
// compose(parts...): a plan from rules and constraints, checked whole, and its lowering to
// the run-time plan_spec (plan/rules.hpp).
//
//   constexpr auto space = plan::compose(
//       plan::devices<8>,
//       plan::on_all(plan::trans<Split<Dim::Batch>, plan::open<Pow2<1, 8>, "dp">>{}),
//       plan::on<ops::Attention>(plan::trans<Split<Dim::Batch>, plan::open<Pow2<1, 8>, "dp">,
//                                            Split<Dim::Head>, 2>{}));
//   static_assert(plan::well_formed<decltype(space)>);
//   plan_spec spec = space.choose("dp", 4).spec();     // open parameters filled
//   resolved_plan plan = space.choose("dp", 4).resolve(graph);
//
// The composed type carries its parts; its checks ran when compose(...) was compiled.
// spec() lowers every rule in order (later rules override what they set, as in plan_spec),
// fills what only the run time knows (runtime degrees, all_devices, chosen open
// parameters) and runs the same checks again on those values, throwing plan_error.
//
// Open parameters are named by the user (open<Range, "tp">; one name, one value) or after
// their trans: the k-th trans of the plan (from 0) names its open degrees "trans#k.degree"
// when it has one split, else "trans#k.degree0", "trans#k.degree1", ... by position. An
// unnamed open colocate<...> or coshard<...> count is "colocate" or "coshard", an unnamed
// open stage count "stages" and devices per stage "devices_per_stage".
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/list.hpp>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/graph.hpp>
#include <loom/plan/assign.hpp>
#include <loom/plan/checks.hpp>
#include <loom/plan/constraints.hpp>
#include <loom/plan/op_partition.hpp>
#include <loom/plan/pipeline_parts.hpp>
#include <loom/plan/resolve.hpp>
#include <loom/plan/rules.hpp>
#include <loom/plan/selectors.hpp>
#include <loom/plan/trans.hpp>

namespace loom::plan {

template <class... Parts>
class configured_plan;

namespace detail {

template <class T>
struct is_fact : std::bool_constant<plan_fact<T>> {};

// A plan made at run time (a preset with run-time numbers, a plan file): its rules and parts
// join the composed plan's, and are checked when the plan is lowered and resolved.
template <class T>
struct is_runtime_part : std::is_same<T, plan_spec> {};

template <class T>
struct is_plan_part : std::bool_constant<is_rule<T>::value || plan_fact<T> || is_runtime_part<T>::value> {};

template <class... Rules>
constexpr std::array<rule_view, sizeof...(Rules)> rule_views_of(boost::mp11::mp_list<Rules...>) {
    return {Rules::view...};
}
template <class... Facts>
constexpr std::array<fact_view, sizeof...(Facts)> fact_views_of(boost::mp11::mp_list<Facts...>) {
    return {Facts::fact...};
}

// What the checks see of a plan made of Parts (parts that are neither rules nor
// constraints are left out and reported by first_part_error).
template <class... Parts>
struct plan_description {
    using rules = boost::mp11::mp_copy_if<boost::mp11::mp_list<Parts...>, is_rule>;
    using facts = boost::mp11::mp_copy_if<boost::mp11::mp_list<Parts...>, is_fact>;
    static constexpr auto rule_views = rule_views_of(rules{});
    static constexpr auto fact_views = fact_views_of(facts{});
    static constexpr plan_view view{rule_views, fact_views, 0};
};

template <class... Parts>
constexpr text first_part_error() {
    constexpr bool is_piece[] = {plan_piece<Parts>..., false};
    constexpr bool is_part[] = {is_plan_part<Parts>::value..., true};
    for (std::size_t i = 0; i < sizeof...(Parts); ++i) {
        if (is_part[i]) continue;
        if (is_piece[i])
            return concat("plan::compose: argument ", i + 1,
                          " is a trans, assign, colocate or recompute without a selector; wrap it in one: "
                          "on_all(...), on<Op>(...), on_name<\"glob\">(...)");
        return concat("plan::compose: argument ", i + 1,
                      " is not a plan part; pass rules (on..., on_all), pipeline parts (stages, stage_boundaries, open_stage_boundaries, "
                      "micro_batches, order), constraints (devices, extent, forbid, zero, colocation_requires_recompute) "
                      "or a plan made at run time (a preset's plan_spec)");
    }
    return {};
}

template <class... Parts>
constexpr text first_composed_error() {
    if (text e = first_part_error<Parts...>(); !e.empty()) return e;
    return first_error(plan_description<Parts...>::view);
}

// The plan-level mistakes stop the compilation in compose(...); those of a trans or a rule
// alone already stopped it where they were written.
template <class... Parts>
constexpr void report_plan_errors() {
    constexpr message error{[] {
        if (text e = first_part_error<Parts...>(); !e.empty()) return e;
        const auto& view = plan_description<Parts...>::view;
        for (const auto& r : view.rules)
            if (!first_trans_error(r).empty() || !first_rule_error(r).empty()) return text();
        return first_plan_error(view);
    }()};
    if constexpr (!error.empty()) (void)ill_formed_plan<error>{};
}

template <class... Parts>
constexpr std::int64_t declared_devices_of() {
    return declared_devices(plan_description<Parts...>::view);
}

LOOM_INLINE std::string open_parameter_name(std::size_t trans_index, std::size_t split, std::size_t splits,
                                            std::string_view user_name);

// An open colocation count's name: the user's, or "colocate" / "coshard" (one value for
// every unnamed one of the plan).
inline std::string colocation_parameter_name(std::string_view user_name, bool coshard) {
    if (!user_name.empty()) return std::string(user_name);
    return coshard ? "coshard" : "colocate";
}

// The open parameters of a plan's typed parts, in order of first appearance, each once.
template <class... Parts>
std::vector<std::string> open_parameters_of() {
    std::vector<std::string> names;
    auto add = [&](std::string name) {
        if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(std::move(name));
    };
    std::size_t trans_index = 0;
    for (const rule_view& r : plan_description<Parts...>::view.rules)
        if (!r.recompute_open.empty()) add(std::string(r.recompute_open));
    for (const rule_view& r : plan_description<Parts...>::view.rules) {
        if (r.trans_count == 0) continue;
        for (std::size_t j = 0; j < r.splits.size(); ++j) {
            if (r.splits[j].degree.kind != degree_kind::open) continue;
            add(open_parameter_name(trans_index, j, r.splits.size(), r.splits[j].degree.name));
        }
        ++trans_index;
    }
    for (const rule_view& r : plan_description<Parts...>::view.rules)
        if (r.assign_count > 0 && !r.explicit_devices && r.colocate.kind == degree_kind::open)
            add(colocation_parameter_name(r.colocate.name, r.coshard));
    for (const fact_view& f : plan_description<Parts...>::view.facts) {
        const bool open = f.degree.kind == degree_kind::open;
        if (f.kind == fact_kind::stages && open) add(f.degree.name.empty() ? "stages" : std::string(f.degree.name));
        if (f.kind == fact_kind::stages && f.group.kind == degree_kind::open)
            add(f.group.name.empty() ? "devices_per_stage" : std::string(f.group.name));
        if (f.kind == fact_kind::micro_batches && open)
            add(f.degree.name.empty() ? "micro_batches" : std::string(f.degree.name));
        if (f.kind == fact_kind::order && !f.target.empty()) add(std::string(f.target));
        if (f.kind == fact_kind::zero && open) add(f.degree.name.empty() ? "zero" : std::string(f.degree.name));
        if (f.kind == fact_kind::boundaries && f.value < 0) add(std::string(f.target));
    }
    return names;
}

inline degree_spec lower_degree(const degree_view& d, const std::string& open_name) {
    if (d.kind == degree_kind::open) return {1, open_name, std::vector<std::int64_t>(d.allowed.begin(), d.allowed.end())};
    return {d.value, "", {}};
}

LOOM_INLINE split_spec lower_split(const split_view& s, degree_spec degree);

// Everything spec() builds: the plan_spec and the views of what it knows at run time.
struct lowering {
    plan_spec spec;
    std::int64_t devices = 0;
    std::deque<std::vector<split_view>> splits;  // per trans; a deque keeps the views' spans valid
    std::vector<rule_view> rules;
    std::vector<fact_view> facts;
    std::size_t trans_index = 0;
};

template <class Trans>
void lower_trans(const Trans& t, lowering& out, rule_view& view, rule& r) {
    std::vector<split_view>& splits = out.splits.emplace_back(Trans::splits.begin(), Trans::splits.end());
    std::vector<split_spec> specs;
    std::size_t runtime_slot = 0;
    const std::string where = std::string(Trans::spelling.view()) + " in " + std::string(view.selector);
    for (std::size_t j = 0; j < splits.size(); ++j) {
        degree_view& d = splits[j].degree;
        std::string open_name;
        if (d.kind == degree_kind::runtime) {
            d.value = t.runtime_degrees[runtime_slot++];
            d.known = true;
        } else if (d.kind == degree_kind::all_devices) {
            d.value = out.devices;
            d.known = true;
        } else if (d.kind == degree_kind::open) {
            open_name = open_parameter_name(out.trans_index, j, splits.size(), d.name);
            if (out.spec.choices.count(open_name)) {
                // Outside its range: the same message as plan::resolve gives.
                d.value = degree_value(lower_degree(d, open_name), out.spec, where);
                d.known = true;
            }
        }
        specs.push_back(lower_split(splits[j], lower_degree(d, open_name)));
    }
    view.splits = splits;
    r.trans = std::move(specs);
    r.origin = std::string(Trans::spelling.view());
    ++out.trans_index;
}

template <class Rule>
void lower_rule(const Rule& part, lowering& out) {
    rule_view view = Rule::view;
    rule r;
    r.on = Rule::selector_type::lower();
    std::apply(
        [&](const auto&... pieces) {
            auto lower_piece = [&]<class Piece>(const Piece& piece) {
                if constexpr (Piece::piece == piece_kind::trans) {
                    lower_trans(piece, out, view, r);
                } else if constexpr (Piece::piece == piece_kind::assign) {
                    r.assign = assign_spec{std::vector<int>(Piece::devices.begin(), Piece::devices.end()), {1, "", {}}, 0};
                    if (r.origin.empty()) r.origin = std::string(Piece::spelling.view());
                } else if constexpr (Piece::piece == piece_kind::colocate) {
                    constexpr degree_view d = Piece::pieces_per_device;
                    const std::string open_name = d.kind == degree_kind::open ? colocation_parameter_name(d.name, Piece::coshard) : "";
                    const degree_spec count = lower_degree(d, open_name);
                    if (!open_name.empty() && out.spec.choices.count(open_name)) {
                        // Outside its range: the same message as plan::resolve gives.
                        view.colocate.value = degree_value(count, out.spec, std::string(Piece::spelling.view()) + " in " +
                                                                                std::string(view.selector));
                        view.colocate.known = true;
                    }
                    r.assign = assign_spec{{}, count, 0, Piece::coshard};
                    if (r.origin.empty()) r.origin = std::string(Piece::spelling.view());
                } else if constexpr (requires { Piece::open; }) {
                    r.recompute_open = std::string(Piece::open);
                    if (r.origin.empty()) r.origin = "plan::recompute_choice<\"" + r.recompute_open + "\">";
                } else {
                    r.recompute = true;
                    if (r.origin.empty()) r.origin = "plan::recompute";
                }
            };
            (lower_piece(pieces), ...);
        },
        part.pieces);
    out.rules.push_back(view);
    out.spec.add(std::move(r));
}

template <class... Parts>
plan_spec lower(const std::tuple<Parts...>& parts, const std::map<std::string, std::int64_t>& choices,
                std::int64_t devices) {
    constexpr std::int64_t declared = declared_devices_of<Parts...>();
    if (devices > 0 && declared > 0 && devices != declared)
        throw plan_error("plan::compose(...).spec(" + std::to_string(devices) + "): the plan says devices<" +
                         std::to_string(declared) + ">; pass " + std::to_string(declared) + " or leave the count out");
    if (devices <= 0) devices = declared;
    if (devices <= 0)
        throw plan_error("plan::compose(...).spec(): the device count is unknown; add plan::devices<N> to the plan or "
                         "pass it: spec(n)");
    lowering out;
    out.devices = devices;
    out.spec.devices = static_cast<int>(devices);
    out.spec.choices = choices;
    std::apply(
        [&](const auto&... part) {
            auto lower_part = [&]<class Part>(const Part& p) {
                if constexpr (is_rule<Part>::value) {
                    lower_rule(p, out);
                } else if constexpr (is_runtime_part<Part>::value) {
                    if (out.spec.name.empty()) out.spec.name = p.name;
                    out.spec.then(p);
                    if (p.colocation_requires_recompute) out.spec.colocation_requires_recompute = true;
                } else {
                    out.facts.push_back(Part::fact);
                    Part::lower(out.spec);
                }
            };
            (lower_part(part), ...);
        },
        parts);
    const text error = first_error(plan_view{out.rules, out.facts, devices});
    if (!error.empty()) throw plan_error(error.str());
    return std::move(out.spec);
}

// The extents a plan states (extent<D, E>), against the graph it is resolved on: the
// compile-time checks relied on them.
LOOM_INLINE void check_extents(std::span<const fact_view> facts, const graph& g);

template <class... Parts>
resolved_plan resolve_checked(const plan_spec& spec, const graph& g) {
    check_extents(plan_description<Parts...>::fact_views, g);
    return plan::resolve(spec, g);
}

// ... and those of its parts made at run time.
template <class... Parts>
std::vector<std::string> all_open_parameters(const std::tuple<Parts...>& parts) {
    std::vector<std::string> names = open_parameters_of<Parts...>();
    std::apply(
        [&](const auto&... part) {
            auto add_runtime = [&]<class Part>(const Part& p) {
                if constexpr (is_runtime_part<Part>::value)
                    for (std::string& n : open_parameters(p))
                        if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(std::move(n));
            };
            (add_runtime(part), ...);
        },
        parts);
    return names;
}

LOOM_INLINE void require_open_parameter(const std::vector<std::string>& names, const std::string& name, std::int64_t value);

}  // namespace detail

// A composed plan: its parts, and what can be done with them at run time.
template <class... Parts>
class composed_plan {
public:
    std::tuple<Parts...> parts;

    // The plan_spec of this plan. Needs plan::devices<N> in the plan.
    plan_spec spec() const {
        static_assert(detail::declared_devices_of<Parts...>() > 0,
                      "plan::compose(...).spec(): the plan has no plan::devices<N>; add one, or pass the device count: "
                      "spec(n)");
        return detail::lower(parts, {}, 0);
    }
    // ... with the device count known only at run time (or the same as devices<N>).
    plan_spec spec(std::int64_t devices) const { return detail::lower(parts, {}, devices); }

    // The resolved plan on `g`; also checks the plan's extent<D, E> facts against g.
    resolved_plan resolve(const graph& g) const { return detail::resolve_checked<Parts...>(spec(), g); }
    resolved_plan resolve(const graph& g, std::int64_t devices) const {
        return detail::resolve_checked<Parts...>(spec(devices), g);
    }

    // Names of the open parameters, in order of first appearance.
    std::vector<std::string> open_parameters() const { return detail::all_open_parameters(parts); }

    // This plan with an open parameter filled; throws plan_error for a name the plan lacks.
    configured_plan<Parts...> choose(const std::string& name, std::int64_t value) const;
};

// A composed plan with values for some of its open parameters.
template <class... Parts>
class configured_plan {
public:
    composed_plan<Parts...> composed;
    std::map<std::string, std::int64_t> choices;

    plan_spec spec() const {
        static_assert(detail::declared_devices_of<Parts...>() > 0,
                      "plan::compose(...).spec(): the plan has no plan::devices<N>; add one, or pass the device count: "
                      "spec(n)");
        return detail::lower(composed.parts, choices, 0);
    }
    plan_spec spec(std::int64_t devices) const { return detail::lower(composed.parts, choices, devices); }

    // The resolved plan on `g`; also checks the plan's extent<D, E> facts against g.
    resolved_plan resolve(const graph& g) const { return detail::resolve_checked<Parts...>(spec(), g); }
    resolved_plan resolve(const graph& g, std::int64_t devices) const {
        return detail::resolve_checked<Parts...>(spec(devices), g);
    }

    std::vector<std::string> open_parameters() const { return composed.open_parameters(); }

    configured_plan choose(const std::string& name, std::int64_t value) const {
        detail::require_open_parameter(open_parameters(), name, value);
        configured_plan more = *this;
        more.choices[name] = value;
        return more;
    }
};

template <class... Parts>
configured_plan<Parts...> composed_plan<Parts...>::choose(const std::string& name, std::int64_t value) const {
    return configured_plan<Parts...>{*this, {}}.choose(name, value);
}

template <class... Parts>
constexpr composed_plan<Parts...> compose(Parts... parts) {
    detail::report_plan_errors<Parts...>();
    return composed_plan<Parts...>{std::tuple<Parts...>(parts...)};
}

namespace detail {

// well_formed's view of its arguments: a composed plan stands for its parts, a bare piece
// for on_all(piece).
template <class T>
struct as_parts {
    using type = boost::mp11::mp_list<T>;
};
template <class... Parts>
struct as_parts<composed_plan<Parts...>> {
    using type = boost::mp11::mp_list<Parts...>;
};
template <class T>
    requires plan_piece<T>
struct as_parts<T> {
    using type = boost::mp11::mp_list<rule_t<selector_t<all_filter>, std::tuple<T>>>;
};

template <class List>
struct well_formed_list;
template <class... Parts>
struct well_formed_list<boost::mp11::mp_list<Parts...>> {
    static constexpr message error{first_composed_error<Parts...>()};
    static constexpr bool value = error.empty();
};

}  // namespace detail

// True when a plan made of these parts (or this composed plan, or this rule or trans alone)
// passes every check that compose(...) would make. Never a hard error:
//   static_assert(!plan::well_formed<decltype(plan::on<ops::LayerNorm>(plan::trans<Split<Var<"h">>, 2>{}))>);
template <class... Parts>
inline constexpr bool well_formed = detail::well_formed_list<
    boost::mp11::mp_append<boost::mp11::mp_list<>, typename detail::as_parts<std::remove_cvref_t<Parts>>::type...>>::value;

// The first mistake such a plan has, as the checks word it ("" when well-formed), for tests
// and tools: plan::error_message<...>.view().
template <class... Parts>
inline constexpr detail::message error_message = detail::well_formed_list<
    boost::mp11::mp_append<boost::mp11::mp_list<>, typename detail::as_parts<std::remove_cvref_t<Parts>>::type...>>::error;

}  // namespace loom::plan

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::plan::detail {

LOOM_INLINE std::string open_parameter_name(std::size_t trans_index, std::size_t split, std::size_t splits,
                                            std::string_view user_name) {
    if (!user_name.empty()) return std::string(user_name);
    std::string name = "trans#" + std::to_string(trans_index) + ".degree";
    return splits == 1 ? name : name + std::to_string(split);
}

LOOM_INLINE split_spec lower_split(const split_view& s, degree_spec degree) {
    switch (s.kind) {
        case split_kind::dim: return {dim_id(s.target), "", std::move(degree), false};
        case split_kind::variable: return {{}, std::string(s.target), std::move(degree), false};
        case split_kind::replicate: return {{}, "", std::move(degree), true};
    }
    return {};
}

LOOM_INLINE void check_extents(std::span<const fact_view> facts, const graph& g) {
    for (const fact_view& f : facts) {
        if (f.kind != fact_kind::extent) continue;
        for (const node& n : g.nodes)
            for (const bound_variable& v : n.sig.vars)
                if (v.dim.name() == f.dim && v.extent != f.value)
                    throw plan_error(concat(f.spelling, ": the graph's ", f.dim, " is ", v.extent, " in ", n.op->name,
                                            " '", n.name, "'; state the model's extent, or leave the fact out")
                                         .str());
    }
}

LOOM_INLINE void require_open_parameter(const std::vector<std::string>& names, const std::string& name, std::int64_t value) {
    if (std::find(names.begin(), names.end(), name) != names.end()) return;
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
    throw plan_error("plan::compose(...).choose(\"" + name + "\", " + std::to_string(value) +
                     "): the plan has no open parameter '" + name + "'; " +
                     (known.empty() ? std::string("it has none") : "its open parameters: " + known));
}

}  // namespace loom::plan::detail
#endif  // LOOM_HEADER_DEFINITIONS
