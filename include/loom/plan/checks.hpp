#pragma once
// The checks of a typed plan, written once and run at two moments.
//
// Every combinator describes itself as plain constexpr data (a "view": its splits and
// degrees, the op kinds its selector names, its constraints). The predicates below read
// views and return the first mistake as a message, or "" when there is none:
//
//   first_trans_error(rule)  a trans on its own: degree < 1, an empty open range, a dim split twice
//   first_rule_error(rule)   a rule on its own: selector, pieces, assign/colocate against the
//                            pieces, splits against the signatures of the op kinds it names
//   first_plan_error(plan)   the plan's constraints: devices, extents, forbidden splits,
//                            colocation with recompute, open parameters shared by name
//   first_error(plan)        all of the above, in that order
//
// At compile time the combinators report a non-empty message through ill_formed_plan
// (a static_assert) and plan::well_formed reads the same predicate as a bool. At run time
// (compose(...).spec()) the views are refilled with what only then is known (degrees given
// to constructors, chosen open parameters, the device count of spec(n)) and the same
// predicates throw loom::plan_error. Checks against one graph's extents stay where the graph
// is known: plan::resolve (rules.hpp) and partition::bind_partition (piece_layout.hpp).
//
// Messages start with the combinator and say how to fix the plan:
//   "plan::trans<Split<Seq>, 2> on attention: Seq is frozen in this op ('s', 't'; splitting
//    it would change the result); split Batch or Head instead"
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <loom/core/dim.hpp>
#include <loom/core/signature.hpp>
#include <loom/plan/degree.hpp>
#include <loom/core/static_text.hpp>

namespace loom::plan {

// A plan mistake found at compile time. The reason is this template's argument; compilers
// print it in the instantiation context and in the note on the failed assertion.
template <detail::message Reason>
struct ill_formed_plan {
    static_assert(Reason.empty(),
                  "plan: the plan is ill-formed; the reason is the message{...} of ill_formed_plan printed with this error");
};

namespace detail {

// ---- views ---------------------------------------------------------------------------------

enum class split_kind : std::uint8_t { dim, variable, replicate };

struct split_view {
    split_kind kind = split_kind::dim;
    std::string_view target;  // the dim's name (Split<Dim::Batch>) or the variable's label (Split<Var<"n">>)
    degree_view degree;
};

// What the checks know of an op kind: its signature and, for ops whose dims never change,
// the dim of each variable ("b" -> Batch, ...; a group "(h d)" names its axis' dim).
struct op_view {
    std::string_view name;
    const signature* sig = nullptr;
    std::span<const std::pair<std::string_view, dim_id>> variable_dims;  // empty: not fixed
    std::span<const std::string_view> transformable;  // frozen variables a custom transformation cuts
};

struct rule_view {
    // the selector
    std::string_view selector;  // how it is written: on_scope<"*.attn">(on<attention>(...))
    std::span<const op_view> kinds;
    int kind_filters = 0, name_filters = 0, scope_filters = 0, layer_filters = 0;
    bool empty_pattern = false;
    std::string_view repeat;
    std::int64_t first_layer = 0, last_layer = -1;
    // the pieces
    int trans_count = 0;
    std::string_view trans;  // "plan::trans<Split<Batch>, 4>"
    std::span<const split_view> splits;
    int assign_count = 0;
    std::string_view assign;  // "plan::assign<0, 1>", "plan::colocate<2>"
    bool explicit_devices = false;
    std::span<const std::int64_t> devices;
    degree_view colocate{degree_kind::fixed, 1, true, {}, {}, {}, false};  // pieces per device
    bool coshard = false;  // plan::coshard: the last split cut `colocate` times more, on the same devices
    int recompute_count = 0;
    std::string_view recompute_open;  // recompute_choice<"name">: whether to recompute is open
};

enum class fact_kind : std::uint8_t {
    devices, extent, forbid, colocation_requires_recompute, zero, stages, micro_batches, order, boundaries
};

struct fact_view {
    fact_kind kind = fact_kind::devices;
    std::int64_t value = 0;        // devices<N>, extent<D, E>'s E, zero<S>, stages' devices per stage
    std::string_view dim;          // extent<D, E>'s D
    split_kind target_kind = split_kind::dim;  // forbid<Split<X>>
    std::string_view target;
    std::string_view spelling;     // "plan::extent<Head, 12>"
    degree_view degree{};          // stages<N>, micro_batches<N>, zero<open<...>>: fixed or open
    std::int64_t chunks = 0;       // order<Interleaved<V>>: V (0: another order, or a choice)
    degree_view group{};           // stages<N, G>: G, the devices per stage (fixed or open)
};

struct plan_view {
    std::span<const rule_view> rules;
    std::span<const fact_view> facts;
    std::int64_t devices = 0;  // the device count given at run time (spec(n)); 0: devices<N> or unknown
};

// ---- small helpers -------------------------------------------------------------------------

// Split<Batch>, Split<Var<"n">>, Replicate
constexpr text target_spelling(split_kind kind, std::string_view target) {
    if (kind == split_kind::dim) return concat("Split<", target, ">");
    if (kind == split_kind::variable) return concat("Split<Var<\"", target, "\">>");
    return "Replicate";
}

constexpr text split_spelling(const split_view& s) { return target_spelling(s.kind, s.target); }

// The degree's value if it is known now (all_devices once the device count is).
constexpr std::optional<std::int64_t> known_degree(const degree_view& d, std::int64_t devices) {
    if (d.kind == degree_kind::all_devices) return devices > 0 ? std::optional<std::int64_t>(devices) : std::nullopt;
    if (d.known) return d.value;
    return std::nullopt;
}

// Pieces of a rule's trans, when every degree is known.
constexpr std::optional<std::int64_t> known_pieces(const rule_view& r, std::int64_t devices) {
    std::int64_t pieces = 1;
    for (const auto& s : r.splits) {
        auto d = known_degree(s.degree, devices);
        if (!d || *d < 1) return std::nullopt;
        pieces *= *d;
    }
    return pieces;
}

constexpr bool range_holds_divisor_of(const degree_view& d, std::int64_t n) {
    if (d.any_positive) return true;
    for (std::int64_t v : d.allowed)
        if (v >= 1 && n % v == 0) return true;
    return false;
}

constexpr std::int64_t declared_devices(const plan_view& p) {
    if (p.devices > 0) return p.devices;
    for (const auto& f : p.facts)
        if (f.kind == fact_kind::devices) return f.value;
    return 0;
}

// The devices the rules cut an op over: the plan's devices, or one stage's group when the
// plan has stages (0: not known before run time).
constexpr std::int64_t rule_devices(const plan_view& p) {
    const std::int64_t devices = declared_devices(p);
    for (const auto& f : p.facts) {
        if (f.kind != fact_kind::stages) continue;
        if (f.value > 0) return f.value;
        if (!f.degree.known || f.degree.value < 1 || devices <= 0 || devices % f.degree.value != 0) return 0;
        return devices / f.degree.value;
    }
    return devices;
}

// "k, n" (+ "and the leading dims '...'")
constexpr text variables_text(const signature& sig) {
    text out;
    for (int v = 0; v < sig.var_count; ++v) append(out, concat(v ? ", " : "", sig.vars[v].view()));
    if (sig.ellipsis_in_inputs()) append(out, out.empty() ? "the leading dims '...'" : " and the leading dims '...'");
    if (out.empty()) append(out, "none");
    return out;
}

// What else a plan may split in this op: "'n'" / "'n' or a leading dim ('...')".
constexpr text splittable_variables_text(const op_view& op) {
    const signature& sig = *op.sig;
    text out;
    for (int v = 0; v < sig.var_count; ++v)
        if (sig.splittable(v)) append(out, concat(out.empty() ? "" : ", ", "'", sig.vars[v].view(), "'"));
    if (sig.ellipsis_in_inputs()) append(out, out.empty() ? "a leading dim ('...')" : " or a leading dim ('...')");
    if (out.empty()) append(out, "nothing else: replicate it");
    return out;
}

constexpr bool is_group_label(std::string_view label) { return !label.empty() && label.front() == '('; }

// Dims of an op with fixed dims that a plan can split: "Batch or Head".
constexpr text splittable_dims_text(const op_view& op) {
    std::string_view found[16];
    int count = 0;
    for (const auto& [label, dim] : op.variable_dims) {
        if (is_group_label(label)) continue;
        auto v = op.sig->find(label);
        if (!v || !op.sig->splittable(*v)) continue;
        bool seen = false;
        for (int i = 0; i < count; ++i) seen = seen || found[i] == dim.name();
        if (!seen && count < 16) found[count++] = dim.name();
    }
    text out;
    for (int i = 0; i < count; ++i) append(out, concat(i == 0 ? "" : i + 1 == count ? " or " : ", ", found[i]));
    if (out.empty()) append(out, "nothing (replicate it)");
    return out;
}

// "b: Batch, h: Head, s: Seq (frozen), ..."
constexpr text dims_text(const op_view& op) {
    text out;
    for (const auto& [label, dim] : op.variable_dims) {
        if (is_group_label(label)) continue;
        auto v = op.sig->find(label);
        const bool frozen = v && op.sig->vars[*v].frozen;
        append(out, concat(out.empty() ? "" : ", ", label, ": ", dim.name(), frozen ? " (frozen)" : ""));
    }
    return out;
}

// ---- a split against one op kind -----------------------------------------------------------

constexpr text variable_split_error(const op_view& op, std::string_view label, std::string_view trans) {
    const signature& sig = *op.sig;
    if (label.starts_with("...")) {
        if (sig.ellipsis_in_inputs()) return {};
        return concat(trans, " on ", op.name, ": '", label, "' names a leading dim, but the op has no '...' (its variables: ",
                      variables_text(sig), "); split one of those");
    }
    auto v = sig.find(label);
    if (!v)
        return concat(trans, " on ", op.name, ": the op has no variable '", label, "' (its variables: ",
                      variables_text(sig), "); split one of those");
    bool transformable = false;
    for (auto t : op.transformable) transformable = transformable || t == label;
    if (sig.vars[*v].frozen && !transformable)
        return concat(trans, " on ", op.name, ": '", label,
                      "' is frozen in this op (splitting it would change the result); split ",
                      splittable_variables_text(op), " instead, or register a custom transformation for ", op.name,
                      " (plan/transformation.hpp) and list '", label, "' in plan::transformable_variables");
    if (sig.vars[*v].inner_of_group)
        return concat(trans, " on ", op.name, ": '", label,
                      "' is an inner part of a grouped axis (its slices are not contiguous); split ",
                      splittable_variables_text(op), " instead");
    return {};
}

constexpr text dim_split_error(const op_view& op, std::string_view dim, std::string_view trans) {
    if (op.variable_dims.empty()) return {};  // the op's dims depend on its inputs: checked at run time
    const signature& sig = *op.sig;
    text labels;
    bool matched = false, frozen = false;
    std::string_view group;
    for (const auto& [label, d] : op.variable_dims) {
        if (d.name() != dim) continue;
        if (is_group_label(label)) {
            group = label;
            continue;
        }
        auto v = sig.find(label);
        if (!v) continue;
        if (sig.splittable(*v)) return {};
        matched = true;
        frozen = frozen || sig.vars[*v].frozen;
        append(labels, concat(labels.empty() ? "" : ", ", "'", label, "'"));
    }
    if (!matched && !group.empty()) {
        // "(h d)": the outermost variable is the one that cuts the axis into contiguous slices.
        std::string_view outer = group.substr(1, group.find(' ') - 1);
        std::string_view outer_dim = "?";
        for (const auto& [label, d] : op.variable_dims)
            if (label == outer) outer_dim = d.name();
        return concat(trans, " on ", op.name, ": ", dim, " is the grouped axis ", group,
                      " of this op, not one of its variables; split ", outer_dim, " (its outermost variable '", outer,
                      "') instead");
    }
    if (!matched)
        return concat(trans, " on ", op.name, ": the op has no dim ", dim, " (its dims: ", dims_text(op), "); split ",
                      splittable_dims_text(op), " instead");
    return concat(trans, " on ", op.name, ": ", dim, " is ",
                  frozen ? "frozen in this op (" : "an inner part of a grouped axis in this op (", labels,
                  frozen ? "; splitting it would change the result" : "; its slices are not contiguous", "); split ",
                  splittable_dims_text(op), " instead");
}

// ---- the predicates ------------------------------------------------------------------------

constexpr text first_trans_error(const rule_view& r, std::int64_t devices = 0) {
    for (std::size_t i = 0; i < r.splits.size(); ++i) {
        const split_view& s = r.splits[i];
        const degree_view& d = s.degree;
        if (d.kind == degree_kind::missing)
            return concat(r.trans, ": ", split_spelling(s), " has no degree; write pairs: trans<Split<A>, 2, Split<B>, 4>");
        if (auto value = known_degree(d, devices); value && *value < 1)
            return concat(r.trans, ": the degree of ", split_spelling(s), " is ", *value,
                          "; a degree must be at least 1 (1 leaves the op whole)");
        if (d.kind == degree_kind::open && !d.known) {
            if (!d.any_positive && d.allowed.empty())
                return concat(r.trans, ": the range ", d.range,
                              " of the open degree is empty; give a range with at least one value, e.g. Pow2<1, 8>");
            for (std::int64_t v : d.allowed)
                if (v < 1)
                    return concat(r.trans, ": the range ", d.range, " holds ", v, "; a degree must be at least 1");
        }
        for (std::size_t j = 0; j < i; ++j) {
            const split_view& earlier = r.splits[j];
            if (earlier.kind != s.kind || earlier.target != s.target) continue;
            if (s.kind == split_kind::replicate)
                return concat(r.trans, ": Replicate appears twice; replicate once, by the product of the degrees");
            return concat(r.trans, ": ", split_spelling(s),
                          " appears twice (the same dim split twice); split it once, by the product of the degrees");
        }
    }
    return {};
}

constexpr text first_rule_error(const rule_view& r, std::int64_t devices = 0) {
    const text selector = concat("plan::", r.selector);
    // the selector
    if (r.kind_filters > 0 && r.kinds.empty())
        return concat(selector, ": name at least one op kind, e.g. on<ops::Linear>(...)");
    if (r.kind_filters > 1)
        return concat(selector, ": two on<...> in one rule; list every op kind in one on<...>");
    if (r.name_filters > 1)
        return concat(selector, ": two name patterns in one rule; give one glob ('*' and '?' match any text)");
    if (r.scope_filters > 1)
        return concat(selector, ": two scope patterns in one rule; give one glob ('*' and '?' match any text)");
    if (r.layer_filters > 1) return concat(selector, ": two layer ranges in one rule; give one");
    if (r.empty_pattern)
        return concat(selector, ": an empty pattern matches nothing; use on_all(...) to select every op");
    if (r.layer_filters > 0 && r.repeat.empty())
        return concat(selector, ": name the repeat whose layers to select, e.g. on_layers<\"blocks\", 0, 3>");
    if (r.layer_filters > 0 && r.first_layer < 0)
        return concat(selector, ": layers are numbered from 0; the first layer is ", r.first_layer);
    if (r.layer_filters > 0 && r.last_layer >= 0 && r.first_layer > r.last_layer)
        return concat(selector, ": the first layer ", r.first_layer, " comes after the last ", r.last_layer,
                      "; write on_layers<\"", r.repeat, "\", ", r.last_layer, ", ", r.first_layer, ">");
    // the pieces
    if (r.trans_count + r.assign_count + r.recompute_count == 0)
        return concat(selector,
                      ": the rule does nothing; give it a plan::trans, plan::assign, plan::colocate or plan::recompute");
    if (r.trans_count > 1)
        return concat(selector, ": two plan::trans in one rule; put every split in one: trans<Split<A>, 2, Split<B>, 2>");
    if (r.assign_count > 1)
        return concat(selector, ": two op-assigns (plan::assign, plan::colocate) in one rule; give one");
    if (r.recompute_count > 1) return concat(selector, ": plan::recompute appears twice; once is enough");
    if (r.assign_count == 1) {
        if (r.explicit_devices && r.devices.empty())
            return concat(r.assign, ": list one device per piece, e.g. plan::assign<0, 1>");
        for (std::int64_t d : r.devices)
            if (d < 0) return concat(r.assign, ": device ", d, " is negative; devices are numbered from 0");
        if (!r.explicit_devices && r.colocate.known && r.colocate.value < 1)
            return concat(r.assign,
                          ": at least one piece per device; colocate<1> (or no colocate) runs one piece per device");
        if (r.trans_count == 1) {
            if (auto pieces = known_pieces(r, devices)) {
                if (r.explicit_devices && static_cast<std::int64_t>(r.devices.size()) != *pieces)
                    return concat(r.assign, ": ", r.devices.size(), " devices for the ", *pieces, " pieces of ", r.trans,
                                  "; give one device per piece");
                if (!r.explicit_devices && !r.coshard && r.colocate.known && *pieces % r.colocate.value != 0)
                    return concat(r.assign, ": the ", *pieces, " pieces of ", r.trans, " cannot be grouped ", r.colocate.value,
                                  " per device; choose a colocation that divides ", *pieces, " (",
                                  divisors_text(*pieces), ")");
            }
        }
    }
    // the splits against the op kinds the selector names
    for (const auto& op : r.kinds)
        for (const auto& s : r.splits) {
            text e;
            if (s.kind == split_kind::variable) e = variable_split_error(op, s.target, r.trans);
            if (s.kind == split_kind::dim) e = dim_split_error(op, s.target, r.trans);
            if (!e.empty()) return e;
        }
    return {};
}

constexpr text first_plan_error(const plan_view& p) {
    // the constraints themselves
    // Indices, not pointers: compilers with sanitizers cannot compare pointers to static
    // objects in a constant expression.
    std::optional<std::size_t> devices_fact, zero_fact;
    for (std::size_t i = 0; i < p.facts.size(); ++i) {
        const fact_view& f = p.facts[i];
        switch (f.kind) {
            case fact_kind::devices:
                if (f.value < 1) return concat(f.spelling, ": a plan needs at least one device");
                if (devices_fact && p.facts[*devices_fact].value != f.value)
                    return concat(f.spelling, ": the plan already says ", p.facts[*devices_fact].spelling,
                                  "; give the device count once");
                devices_fact = i;
                break;
            case fact_kind::extent:
                if (f.value < 1) return concat(f.spelling, ": an extent is at least 1");
                for (std::size_t j = 0; j < i; ++j)
                    if (p.facts[j].kind == fact_kind::extent && p.facts[j].dim == f.dim && p.facts[j].value != f.value)
                        return concat(f.spelling, ": the plan already says ", p.facts[j].spelling,
                                      "; give each dim's extent once");
                break;
            case fact_kind::zero:
                if (f.degree.kind == degree_kind::open) {
                    for (std::int64_t v : f.degree.allowed)
                        if (v < 0 || v > 3)
                            return concat(f.spelling, ": ZeRO stage ", v, " is not one of 0, 1, 2 and 3; choose among those");
                    if (f.degree.any_positive)
                        return concat(f.spelling, ": give the stages to choose from, e.g. zero<open<OneOf<0, 1, 3>>>");
                } else if (f.value < 1 || f.value > 3) {
                    return concat(f.spelling, ": ZeRO has stages 1, 2 and 3");
                }
                if (zero_fact && p.facts[*zero_fact].value != f.value)
                    return concat(f.spelling, ": the plan already says ", p.facts[*zero_fact].spelling,
                                  "; choose one stage");
                zero_fact = i;
                break;
            case fact_kind::stages:
            case fact_kind::micro_batches:
            case fact_kind::order:
            case fact_kind::boundaries:
                for (std::size_t j = 0; j < i; ++j)
                    if (p.facts[j].kind == f.kind)
                        return concat(f.spelling, ": the plan already says ", p.facts[j].spelling, "; give it once");
                if ((f.kind == fact_kind::stages || f.kind == fact_kind::micro_batches) && f.degree.known &&
                    f.degree.value < 1)
                    return concat(f.spelling, ": ", f.degree.value, f.kind == fact_kind::stages ? " stages" : " micro-batches",
                                  "; use at least 1");
                if (f.kind == fact_kind::order && f.chunks < 0)
                    return concat(f.spelling, ": ", f.chunks, " chunks per device group; use at least 1");
                break;
            case fact_kind::forbid:
            case fact_kind::colocation_requires_recompute: break;
        }
    }
    // Across the pipeline's parts: stages against devices, interleaving against micro-batches.
    {
        const std::int64_t all = declared_devices(p);
        std::optional<std::size_t> stages_fact, micro_fact, order_fact;
        for (std::size_t i = 0; i < p.facts.size(); ++i) {
            if (p.facts[i].kind == fact_kind::stages) stages_fact = i;
            if (p.facts[i].kind == fact_kind::micro_batches) micro_fact = i;
            if (p.facts[i].kind == fact_kind::order) order_fact = i;
        }
        if (stages_fact && all > 0) {
            const fact_view& f = p.facts[*stages_fact];
            const std::int64_t group = f.value;  // devices per stage, 0: all / stages
            if (f.degree.known && f.degree.value >= 1) {
                if (group == 0 && all % f.degree.value != 0)
                    return concat(f.spelling, ": ", f.degree.value, " stages do not divide devices<", all,
                                  ">; choose a stage count that divides ", all, " (", divisors_text(all), ")");
                if (group > 0 && group * f.degree.value != all)
                    return concat(f.spelling, ": ", f.degree.value, " stages of ", group, " devices make ",
                                  group * f.degree.value, ", but the plan has devices<", all,
                                  ">; make stages x devices per stage equal the devices");
            } else if (f.degree.kind == degree_kind::open && group == 0 && !range_holds_divisor_of(f.degree, all)) {
                return concat(f.spelling, ": no value of ", f.degree.range, " divides devices<", all,
                              ">; give a range that holds a divisor of ", all, " (", divisors_text(all), ")");
            }
        }
        std::optional<std::size_t> boundaries_fact;
        for (std::size_t i = 0; i < p.facts.size(); ++i)
            if (p.facts[i].kind == fact_kind::boundaries) boundaries_fact = i;
        if (boundaries_fact && !stages_fact)
            return concat(p.facts[*boundaries_fact].spelling, ": boundaries without plan::stages<N>; add the stage count");
        if (boundaries_fact && p.facts[*boundaries_fact].value >= 0 && p.facts[*stages_fact].degree.known) {
            const std::int64_t chunks = p.facts[*stages_fact].degree.value *
                                        (order_fact && p.facts[*order_fact].chunks > 0 ? p.facts[*order_fact].chunks : 1);
            if (p.facts[*boundaries_fact].value != chunks - 1)
                return concat(p.facts[*boundaries_fact].spelling, ": ", p.facts[*boundaries_fact].value,
                              " boundaries for ", chunks, " stage ranges (", p.facts[*stages_fact].spelling,
                              "); give ", chunks - 1, ", the first layer of every range after the first");
        }
        if (order_fact && p.facts[*order_fact].chunks > 0 && stages_fact && micro_fact) {
            const degree_view& s = p.facts[*stages_fact].degree;
            const degree_view& m = p.facts[*micro_fact].degree;
            if (s.known && m.known && s.value >= 1 && m.value % s.value != 0) {
                const std::int64_t below = m.value / s.value * s.value, above = below + s.value;
                return concat(p.facts[*order_fact].spelling, ": ", m.value, " micro-batches (",
                              p.facts[*micro_fact].spelling, ") is not a multiple of the ", s.value, " stages (",
                              p.facts[*stages_fact].spelling,
                              "); interleaved 1F1B moves micro-batches through each chunk in groups of ", s.value, "; use ",
                              below > 0 ? concat(below, " or ") : text(), above, " micro-batches");
            }
        }
    }
    if (p.devices > 0 && devices_fact && p.facts[*devices_fact].value != p.devices)
        return concat(p.facts[*devices_fact].spelling, ": the plan is given ", p.devices,
                      " devices at run time; pass the same count, or leave it out");
    const std::int64_t devices = rule_devices(p);
    const text devices_text =
        devices == declared_devices(p) ? concat("devices<", devices, ">") : concat(devices, " devices of a stage");
    bool requires_recompute = false;
    for (const auto& f : p.facts) requires_recompute = requires_recompute || f.kind == fact_kind::colocation_requires_recompute;

    for (std::size_t ri = 0; ri < p.rules.size(); ++ri) {
        const rule_view& r = p.rules[ri];
        const text where = concat(r.trans, " in ", r.selector);
        for (const auto& s : r.splits) {
            // forbidden splits, whichever way the split is spelled: the dim, or an op's own
            // variable of that dim (and the other way round)
            for (const auto& f : p.facts) {
                if (f.kind != fact_kind::forbid) continue;
                bool same = s.kind == f.target_kind && s.target == f.target;
                for (const op_view& op : r.kinds)
                    for (const auto& [label, dim] : op.variable_dims) {
                        if (s.kind == split_kind::variable && f.target_kind == split_kind::dim && label == s.target &&
                            dim.name() == f.target)
                            same = true;
                        if (s.kind == split_kind::dim && f.target_kind == split_kind::variable && label == f.target &&
                            dim.name() == s.target)
                            same = true;
                    }
                if (same)
                    return concat(f.spelling, ": ", where, " splits ", s.target,
                                  s.target == f.target ? text() : concat(" (", f.target, " in ", r.selector, ")"),
                                  ", which the plan forbids; remove that split or the constraint");
            }
            // extents the plan knows (a vocabulary need not divide: it is split into near-equal
            // pieces, plan::splits_unevenly)
            if (s.kind == split_kind::dim && s.target != Dim::Vocab::name)
                for (const auto& f : p.facts) {
                    if (f.kind != fact_kind::extent || f.dim != s.target || f.value < 1) continue;
                    if (auto d = known_degree(s.degree, devices); d && *d >= 1 && f.value % *d != 0)
                        return concat(r.trans, ": ", f.spelling, " is not divisible by the degree ", *d, " of ",
                                      split_spelling(s), "; choose a divisor of ", f.value, " (", divisors_text(f.value), ")");
                    if (s.degree.kind == degree_kind::open && !s.degree.known && !range_holds_divisor_of(s.degree, f.value))
                        return concat(r.trans, ": no value of ", s.degree.range, " divides ", f.spelling,
                                      "; give a range that holds a divisor of ", f.value, " (", divisors_text(f.value), ")");
                }
        }
        if (devices > 0) {
            for (std::int64_t d : r.devices)
                if (d >= devices)
                    return concat(r.assign, " in ", r.selector, ": device ", d, " is outside ", devices_text, " (0..",
                                  devices - 1, "); use a device below ", devices, " or raise the device count");
            if (r.trans_count == 1 && !r.explicit_devices) {
                const auto pieces = known_pieces(r, devices);
                // Coshard's degrees count devices as if nothing were colocated.
                if (r.coshard || (r.colocate.known && r.colocate.value == 1)) {
                    for (const auto& s : r.splits) {
                        if (auto d = known_degree(s.degree, devices); d && *d >= 1 && devices % *d != 0)
                            return concat(r.trans, ": the degree ", *d, " of ", split_spelling(s), " does not divide ",
                                          devices_text, "; choose a divisor of ", devices, " (", divisors_text(devices),
                                          "), or colocate pieces (plan::colocate)");
                        if (s.degree.kind == degree_kind::open && !s.degree.known &&
                            !range_holds_divisor_of(s.degree, devices))
                            return concat(r.trans, ": no value of ", s.degree.range, " divides ", devices_text,
                                          "; give a range that holds a divisor of ", devices, " (", divisors_text(devices),
                                          ")");
                    }
                    if (pieces && *pieces > devices)
                        return concat(r.trans, ": ", *pieces, " pieces but ", devices_text,
                                      "; lower the degrees so that their product is at most ", devices,
                                      ", or colocate pieces (plan::colocate<", (*pieces + devices - 1) / devices, ">)");
                } else if (const std::int64_t c = r.colocate.known ? r.colocate.value : 0;
                           pieces && c >= 1 && *pieces % c == 0 && *pieces / c > devices) {
                    return concat(r.assign, ": the ", *pieces, " pieces of ", r.trans, " make ", *pieces / c,
                                  " groups of ", c, " but the plan has ", devices_text,
                                  "; colocate more pieces per device or lower the degrees");
                }
            }
        }
        // Coshard's rule: colocated pieces recompute (in this rule, or in another with the same selector).
        // Pieces share a device through colocate<C> or through assign<...> naming a device twice.
        // An open count shares devices when its range leaves out 1.
        bool shares_devices = !r.explicit_devices && (r.colocate.known ? r.colocate.value > 1 : !r.colocate.any_positive);
        if (!r.explicit_devices && !r.colocate.known)
            for (std::int64_t v : r.colocate.allowed) shares_devices = shares_devices && v != 1;
        for (std::size_t a = 0; a < r.devices.size(); ++a)
            for (std::size_t b = a + 1; b < r.devices.size(); ++b) shares_devices = shares_devices || r.devices[a] == r.devices[b];
        if (requires_recompute && shares_devices && r.recompute_count == 0) {
            bool recomputed = false;
            for (const auto& q : p.rules) recomputed = recomputed || (q.selector == r.selector && q.recompute_count > 0);
            if (!recomputed)
                return concat(r.assign, " in ", r.selector,
                              ": the plan requires colocated ops to recompute (plan::colocation_requires_recompute); "
                              "add plan::recompute to the same rule");
        }
        // one name, one range
        for (std::size_t si = 0; si < r.splits.size(); ++si) {
            const split_view& s = r.splits[si];
            if (s.degree.kind != degree_kind::open || s.degree.name.empty()) continue;
            for (std::size_t qi = 0; qi <= ri; ++qi)
                for (std::size_t ti = 0; ti < p.rules[qi].splits.size() && (qi < ri || ti < si); ++ti) {
                    const split_view& t = p.rules[qi].splits[ti];
                    if (t.degree.kind == degree_kind::open && t.degree.name == s.degree.name &&
                        t.degree.range != s.degree.range)
                        return concat(r.trans, ": the open parameter '", s.degree.name, "' is already declared with ",
                                      t.degree.range, " in ", p.rules[qi].trans, "; give one range per name");
                }
        }
    }
    return {};
}

constexpr text first_error(const plan_view& p) {
    const std::int64_t devices = rule_devices(p);
    for (const auto& r : p.rules) {
        if (text e = first_trans_error(r, devices); !e.empty()) return e;
        if (text e = first_rule_error(r, devices); !e.empty()) return e;
    }
    return first_plan_error(p);
}

}  // namespace detail

}  // namespace loom::plan
