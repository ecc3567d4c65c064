#pragma once
// A plan as data: an ordered list of rules, each a selector (which ops) and what to do to
// them (op-trans: split / replicate; op-assign: devices, colocation; recompute). The
// typed combinators (plan/combinators.hpp) and the presets (plan/presets.hpp) produce
// this; `resolve` applies it to one graph and yields a resolved_plan.
//
// Rules apply in order and a later rule overrides only what it sets, so a preset can be
// refined: data_parallel(8) followed by a rule that recomputes the MLPs.
//
// Open parameters (`open<...>` in the combinators) are named; resolve() takes their values
// from plan_spec::choices, the searcher's or the user's, and fails naming the parameter
// when one is missing or outside its range.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/op.hpp>
#include <loom/plan/op_partition.hpp>

namespace loom::plan {

namespace detail {

// Shell-style glob: '*' any run of characters, '?' one character.
inline bool glob_match(std::string_view pattern, std::string_view text) {
    std::size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
    while (t < text.size()) {
        if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
            ++p;
            ++t;
        } else if (p < pattern.size() && pattern[p] == '*') {
            star = p++;
            mark = t;
        } else if (star != std::string_view::npos) {
            p = star + 1;
            t = ++mark;
        } else {
            return false;
        }
    }
    while (p < pattern.size() && pattern[p] == '*') ++p;
    return p == pattern.size();
}

}  // namespace detail

// The index of the layer of `repeat` that node n is in (its innermost enclosing scope that
// is an instance of that repeat), or -1 outside it.
inline std::int64_t layer_index(const graph& g, const node& n, std::string_view repeat) {
    for (std::int32_t s = n.scope; s != no_id;) {
        const scope_desc& sd = g.scopes.at(static_cast<std::size_t>(s));
        if (sd.repeat != no_id && g.repeats.at(static_cast<std::size_t>(sd.repeat)).name == repeat) return sd.index;
        s = sd.parent;
    }
    return -1;
}

// Which ops a rule applies to. Every condition that is set must hold.
struct selector {
    std::vector<const op_def*> kinds;  // op kinds (empty: any)
    std::string name;                  // glob over the node name, "blocks.*.mlp.fc/*" (empty: any)
    std::string scope;                 // glob over the layer scope path, "blocks.*.attn*" (empty: any)
    std::string repeat;                // a repeat's name ("blocks") and a layer range in it
    std::int64_t first_layer = 0, last_layer = -1;  // inclusive; last < 0: to the end

    bool matches(const graph& g, const node& n) const {
        if (!kinds.empty() && std::find(kinds.begin(), kinds.end(), n.op) == kinds.end()) return false;
        if (!name.empty() && !detail::glob_match(name, n.name)) return false;
        if (!scope.empty() && !detail::glob_match(scope, g.scope_path(n.scope))) return false;
        if (!repeat.empty()) {
            const std::int64_t layer = layer_index(g, n, repeat);
            if (layer < 0 || layer < first_layer || (last_layer >= 0 && layer > last_layer)) return false;
        }
        return true;
    }

    std::string describe() const {
        std::string s;
        for (const op_def* k : kinds) s += (s.empty() ? "" : "|") + std::string(k->name);
        if (!name.empty()) s += (s.empty() ? "" : " ") + std::string("name ") + name;
        if (!scope.empty()) s += (s.empty() ? "" : " ") + std::string("scope ") + scope;
        if (!repeat.empty())
            s += (s.empty() ? "" : " ") + repeat + "[" + std::to_string(first_layer) + ".." +
                 (last_layer < 0 ? std::string("end") : std::to_string(last_layer)) + "]";
        return s.empty() ? "all ops" : s;
    }
};

// A split degree: fixed, or an open parameter filled from plan_spec::choices.
struct degree_spec {
    std::int64_t value = 1;
    std::string open;  // name of the open parameter; empty: fixed
    std::vector<std::int64_t> allowed;  // the open parameter's range (empty: any positive)
};

struct split_spec {
    dim_id dim;
    std::string label;  // a signature variable instead of a dim
    degree_spec degree;
    bool replicate = false;
};

// op-assign: where a rule's pieces run.
struct assign_spec {
    std::vector<int> devices;  // explicit, one per piece (wins when set)
    std::int64_t colocate = 1; // pieces per device, run one after another (Coshard)
    int first_device = 0;      // pieces i*colocate..(i+1)*colocate-1 on device first_device + i
};

struct rule {
    selector on;
    std::optional<std::vector<split_spec>> trans;  // set: replaces the op's splits
    std::optional<assign_spec> assign;
    std::optional<bool> recompute;
    std::string origin;  // the combinator or preset that made the rule, for messages
};

struct plan_spec {
    int devices = 1;
    std::vector<rule> rules;
    zero_stage zero = zero_stage::none;
    std::string name;
    std::map<std::string, std::int64_t> choices;  // values of open parameters
    bool colocation_requires_recompute = false;    // a constraint: Coshard must recompute

    plan_spec& add(rule r) {
        rules.push_back(std::move(r));
        return *this;
    }
    plan_spec& then(const plan_spec& more) {
        for (const auto& r : more.rules) rules.push_back(r);
        if (more.zero != zero_stage::none) zero = more.zero;
        for (const auto& [k, v] : more.choices) choices[k] = v;
        colocation_requires_recompute = colocation_requires_recompute || more.colocation_requires_recompute;
        return *this;
    }
    plan_spec& choose(std::string open, std::int64_t value) {
        choices[std::move(open)] = value;
        return *this;
    }
};

inline std::int64_t resolve_degree(const degree_spec& d, const plan_spec& p, const std::string& where) {
    if (d.open.empty()) return d.value;
    auto it = p.choices.find(d.open);
    if (it == p.choices.end())
        throw plan_error("plan: open parameter '" + d.open + "' of " + where +
                         " has no value; choose one (plan_spec::choose(\"" + d.open + "\", n)) or run the searcher");
    if (!d.allowed.empty() && std::find(d.allowed.begin(), d.allowed.end(), it->second) == d.allowed.end()) {
        std::string range;
        for (auto v : d.allowed) range += (range.empty() ? "" : ", ") + std::to_string(v);
        throw plan_error("plan: open parameter '" + d.open + "' of " + where + " was given " +
                         std::to_string(it->second) + ", outside its range {" + range + "}; choose one of those");
    }
    return it->second;
}

// The plan for every forward node of `g` (nodes no rule selects run whole on every device).
inline resolved_plan resolve(const plan_spec& p, const graph& g) {
    if (p.devices < 1) throw plan_error("plan: devices = " + std::to_string(p.devices) + "; use at least one device");
    const std::size_t forward = g.forward_node_count();
    resolved_plan out;
    out.devices = p.devices;
    out.zero = p.zero;
    out.name = p.name;
    out.forward.resize(forward);
    for (std::size_t i = 0; i < forward; ++i) {
        const node& n = g.nodes[i];
        std::optional<std::vector<split_spec>> splits;
        std::optional<assign_spec> assign;
        bool recompute = false;
        std::string origin;
        for (const rule& r : p.rules) {
            if (!r.on.matches(g, n)) continue;
            if (r.trans) splits = r.trans, origin = r.origin;
            if (r.assign) assign = r.assign;
            if (r.recompute) recompute = *r.recompute;
        }
        if (!splits && !assign && !recompute) continue;
        op_partition op;
        const std::string where = (origin.empty() ? std::string("a rule") : origin) + " on " + std::string(n.op->name) +
                                  " '" + n.name + "'";
        if (splits)
            for (const auto& s : *splits) {
                const std::int64_t degree = resolve_degree(s.degree, p, where);
                op.splits.push_back({s.dim, s.label, degree, s.replicate});
            }
        op.recompute = recompute;
        const std::int64_t pieces = op.pieces();
        if (assign) {
            if (!assign->devices.empty()) {
                op.devices = assign->devices;
            } else {
                if (assign->colocate < 1 || pieces % assign->colocate != 0)
                    throw plan_error("plan: colocate<" + std::to_string(assign->colocate) + "> on " + where + ": " +
                                     std::to_string(pieces) + " pieces cannot be grouped " +
                                     std::to_string(assign->colocate) + " per device; choose a colocation that divides " +
                                     std::to_string(pieces));
                for (std::int64_t k = 0; k < pieces; ++k)
                    op.devices.push_back(assign->first_device + static_cast<int>(k / assign->colocate));
            }
            if (assign->colocate > 1 && p.colocation_requires_recompute && !recompute)
                throw plan_error("plan: colocate<" + std::to_string(assign->colocate) + "> on " + where +
                                 " without recompute, but the plan requires colocated ops to recompute; add recompute "
                                 "to the same selector");
        }
        out.forward[i] = std::move(op);
    }
    return out;
}

}  // namespace loom::plan
