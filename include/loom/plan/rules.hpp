#pragma once
// A plan as data: an ordered list of rules, each a selector (which ops) and what to do to
// them (op-trans: split / replicate; op-assign: devices, colocation; recompute), plus the
// stages (op-assign of layer ranges), the micro-batches (the outermost op-trans), the
// op-order and the ZeRO stage. plan::compose(...) (plan/compose.hpp) and the presets
// (plan/presets.hpp) produce it; plan::resolve (plan/resolve.hpp) applies it to one graph
// and yields a resolved_plan.
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
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/op.hpp>
#include <loom/plan/op_order.hpp>
#include <loom/plan/op_partition.hpp>

namespace loom::plan {

namespace detail {

// The open parameters that reading a plan looked up, in order, while a log is active on
// this thread (choice_log_scope). Every lookup of plan_spec::choices while resolving goes
// through degree_value, recompute_chosen, chosen_zero, chosen_order and stage_starts,
// which note it; a searcher uses the log to know which choices a refusal depended on.
struct choice_log {
    std::vector<std::string> names;
};

inline thread_local choice_log* active_choice_log = nullptr;

inline void note_choice(const std::string& name) {
    if (active_choice_log) active_choice_log->names.push_back(name);
}

// Points this thread's `slot` at `value` for the scope's lifetime, then restores what it
// pointed at before (scopes nest).
template <class T, T*& (&Slot)()>
class thread_slot_scope {
public:
    explicit thread_slot_scope(T& value) : previous_(Slot()) { Slot() = &value; }
    ~thread_slot_scope() { Slot() = previous_; }
    thread_slot_scope(const thread_slot_scope&) = delete;
    thread_slot_scope& operator=(const thread_slot_scope&) = delete;

private:
    T* previous_;
};

inline choice_log*& active_choice_log_slot() { return active_choice_log; }

// Logs the lookups of this thread into `log` for the scope's lifetime.
using choice_log_scope = thread_slot_scope<choice_log, active_choice_log_slot>;

// Shell-style glob: '*' any run of characters, '?' one character.
LOOM_INLINE bool glob_match(std::string_view pattern, std::string_view text);

}  // namespace detail

// The index of the layer of `repeat` that node n is in (its innermost enclosing scope that
// is an instance of that repeat), or -1 outside it.
LOOM_INLINE std::int64_t layer_index(const graph& g, const node& n, std::string_view repeat);

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
    std::vector<int> devices;          // explicit, one per piece (wins when set)
    degree_spec colocate{1, "", {}};   // pieces per device, run one after another
    int first_device = 0;              // pieces i*colocate..(i+1)*colocate-1 on device first_device + i
    // Coshard (nnScaler): the op's last split is cut `colocate` times more than its degree
    // says, and those pieces share each device. The degrees keep counting devices, so the
    // Coshard factor can be chosen (or left open) apart from the tensor-parallel degree:
    // split<Head, tp> with coshard<c> runs tp * c pieces, c on each of tp devices.
    bool coshard = false;
};

struct rule {
    selector on;
    std::optional<std::vector<split_spec>> trans;  // set: replaces the op's splits
    std::optional<assign_spec> assign;
    std::optional<bool> recompute;
    std::string origin;  // the combinator or preset that made the rule, for messages
    // A preset's rule for a part a model may lack (an LM head, a SiLU): matching no op is
    // fine. Every other rule must match an op, or plan::resolve refuses the plan.
    bool optional = false;
    // Whether to recompute as an open choice: the name of a parameter that is 1 (recompute)
    // or 0 (keep). Set, it decides instead of `recompute`.
    std::string recompute_open;
};

// op-assign of layer ranges to device groups: pipeline stages. The layers of `repeat` are
// cut into count * chunks ranges (chunks > 1 under Interleaved<V>: chunk k runs on group
// k % count), evenly or at explicit boundaries; ops before the first layer run with the
// first range, ops after the last with the last one. Each group has devices_per_stage
// devices (0: the plan's devices / count), and the plan's rules cut every op within its
// group: their degrees are per group.
struct stage_spec {
    std::string repeat = "blocks";
    degree_spec count{1, "", {}};            // device groups (an open parameter when named)
    std::vector<std::int64_t> boundaries;    // the first layer of every range after the first; empty: even
    degree_spec devices_per_stage{0, "", {}};  // 0: the plan's devices / count; open when named
    // The ranges as an open parameter of this name: its value numbers one cut of the layers
    // (plan/stage_ranges.hpp), each range within `boundary_slack` layers of the even cut
    // (negative: any size). The searcher tries every cut; the filled plan gives boundaries.
    std::string boundaries_open;
    std::int64_t boundary_slack = -1;
};

// The one plan value at run time: what plan::compose(...) lowers to, what presets return,
// what plan files store and what the searcher fills (search::search_plan). Open numbers and
// choices are named; their values are in `choices`.
struct plan_spec {
    int devices = 1;
    std::vector<rule> rules;
    zero_stage zero = zero_stage::none;
    std::string name;
    std::map<std::string, std::int64_t> choices;  // values of open parameters
    bool colocation_requires_recompute = false;    // a constraint: Coshard must recompute

    std::vector<split_spec> forbidden;            // splits no rule may make (forbid<Split<...>>)
    std::optional<stage_spec> stages;             // op-assign of layer ranges (pipelines)
    degree_spec micro_batches{1, "", {}};         // the outermost batch split (op-trans)
    order_spec order;                             // op-order of the pipeline's blocks
    // The ZeRO stage as an open choice: its name and the stages it may take (`zero` then
    // holds nothing until the choice is made).
    std::string zero_open;
    std::vector<std::int64_t> zero_allowed;

    plan_spec& add(rule r) {
        rules.push_back(std::move(r));
        return *this;
    }
    plan_spec& then(const plan_spec& more) {
        for (const auto& r : more.rules) rules.push_back(r);
        for (const auto& f : more.forbidden) forbidden.push_back(f);
        if (more.zero != zero_stage::none) zero = more.zero;
        if (!more.zero_open.empty()) zero_open = more.zero_open, zero_allowed = more.zero_allowed;
        if (more.stages) stages = more.stages;
        if (more.micro_batches.value != 1 || !more.micro_batches.open.empty()) micro_batches = more.micro_batches;
        if (!more.order.alternatives.empty()) order = more.order;
        for (const auto& [k, v] : more.choices) choices[k] = v;
        colocation_requires_recompute = colocation_requires_recompute || more.colocation_requires_recompute;
        return *this;
    }
    plan_spec& choose(std::string open, std::int64_t value) {
        choices[std::move(open)] = value;
        return *this;
    }
    // Narrows an open number to `allowed` wherever the plan names it (every rule's degree or
    // colocation, the stages, the devices per stage, the micro-batches, the ZeRO stage):
    //   spaces::nnscaler(8).narrow("tp", {1, 2}).narrow("coshard", {1, 2})
    LOOM_INLINE plan_spec& narrow(const std::string& open, std::vector<std::int64_t> allowed);
};

// The names of a plan's open parameters, each once, in the order the plan states them: the
// recompute choices of its rules, the degrees of its rules, their colocation (Coshard)
// factors, then its stage count, devices per stage, micro-batches, order, ZeRO stage and
// stage boundaries.
LOOM_INLINE std::vector<std::string> open_parameters(const plan_spec& p);

// The value of a degree: its fixed value, or the plan's choice for its open parameter
// (checked against the parameter's range). `where` names the part for messages.
LOOM_INLINE std::int64_t degree_value(const degree_spec& d, const plan_spec& p, const std::string& where);

namespace detail {
// degree_value with the part's name made only for a message: `where()` gives it. The
// searcher resolves every candidate plan, and naming every op's part took a tenth of that.
template <class Where>
std::int64_t degree_value_named_by(const degree_spec& d, const plan_spec& p, const Where& where) {
    if (d.open.empty()) return d.value;
    note_choice(d.open);
    auto it = p.choices.find(d.open);
    if (it == p.choices.end())
        throw plan_error("plan: open parameter '" + d.open + "' of " + where() +
                         " has no value; choose one (plan_spec::choose(\"" + d.open + "\", n)) or set it in the plan file's \"choices\"");
    if (!d.allowed.empty() && std::find(d.allowed.begin(), d.allowed.end(), it->second) == d.allowed.end()) {
        std::string range;
        for (auto v : d.allowed) range += (range.empty() ? "" : ", ") + std::to_string(v);
        throw plan_error("plan: open parameter '" + d.open + "' of " + where() + " was given " +
                         std::to_string(it->second) + ", outside its range {" + range + "}; choose one of those");
    }
    return it->second;
}
}  // namespace detail

// Whether rule r recomputes, from its open choice.
LOOM_INLINE bool recompute_chosen(const rule& r, const plan_spec& p);

namespace detail {

// A split the plan forbids, whichever way it is spelled: forbid<Split<Dim::Seq>> also stops a
// split of an op's own variable whose dim is Seq, and forbid<Split<Var<"s">>> a split of the
// dim that an op's "s" has.
LOOM_INLINE void check_not_forbidden(const plan_spec& p, const node& n, const split_spec& s, const std::string& where);

// What partition_ops records of colocated pieces' devices (an assign that groups them per
// device): every piece's, for resolving a plan; or, for a check of the devices' range alone
// (check_stage_group), only the lowest and the highest, since at a thousand devices a
// resolution of every layer's pieces lists tens of millions of them.
enum class piece_devices { every, range };

// op-trans and op-assign of every forward node of `g` by the plan's rules, on the plan's
// devices (nodes no rule selects run whole on every device). plan::resolve (plan/resolve.hpp)
// adds the stages, micro-batches and order around it. The refusals are the same whatever
// `record` is.
LOOM_INLINE resolved_plan partition_ops(const plan_spec& p, const graph& g, piece_devices record = piece_devices::every);

// Which forward nodes of a graph each selector matches, remembered for graphs that stay
// alive and unchanged while many plans are resolved against them: the searcher resolves
// every candidate of a space against the same model (or the same folded instances), and
// matching the rules' name globs node by node took a fifth of its bounding. partition_ops
// asks the memo in effect on its thread (selector_memo_scope) about the graphs given to it
// with remember(), and matches every other graph itself. The memo must not outlive them.
class selector_memo {
public:
    void remember(const graph& g) { graphs_.insert(&g); }
    // Per forward node of g, whether s matches it; nullptr when g was not remembered.
    const std::vector<char>* matches(const selector& s, const graph& g) {
        if (!graphs_.count(&g)) return nullptr;
        auto key = std::make_tuple(&g, s.kinds, s.name, s.scope, s.repeat, s.first_layer, s.last_layer);
        auto it = matches_.find(key);
        if (it == matches_.end()) {
            std::vector<char> m(g.forward_node_count());
            for (std::size_t i = 0; i < m.size(); ++i) m[i] = s.matches(g, g.nodes[i]) ? 1 : 0;
            it = matches_.emplace(std::move(key), std::move(m)).first;
        }
        return &it->second;
    }

private:
    using key = std::tuple<const graph*, std::vector<const op_def*>, std::string, std::string, std::string, std::int64_t,
                           std::int64_t>;
    std::set<const graph*> graphs_;
    std::map<key, std::vector<char>> matches_;
};

inline thread_local selector_memo* active_selector_memo = nullptr;
inline selector_memo*& active_selector_memo_slot() { return active_selector_memo; }

// Puts `memo` in effect on this thread for the scope's lifetime.
using selector_memo_scope = thread_slot_scope<selector_memo, active_selector_memo_slot>;

}  // namespace detail

}  // namespace loom::plan

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::plan::detail {

LOOM_INLINE bool glob_match(std::string_view pattern, std::string_view text) {
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
}  // namespace loom::plan::detail

namespace loom::plan {

LOOM_INLINE std::int64_t layer_index(const graph& g, const node& n, std::string_view repeat) {
    for (std::int32_t s = n.scope; s != no_id;) {
        const scope_desc& sd = g.scopes.at(static_cast<std::size_t>(s));
        if (sd.repeat != no_id && g.repeats.at(static_cast<std::size_t>(sd.repeat)).name == repeat) return sd.index;
        s = sd.parent;
    }
    return -1;
}

LOOM_INLINE std::vector<std::string> open_parameters(const plan_spec& p) {
    std::vector<std::string> names;
    auto add = [&](const std::string& name) {
        if (!name.empty() && std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    };
    for (const rule& r : p.rules) add(r.recompute_open);
    for (const rule& r : p.rules)
        if (r.trans)
            for (const split_spec& s : *r.trans) add(s.degree.open);
    for (const rule& r : p.rules)
        if (r.assign) add(r.assign->colocate.open);
    if (p.stages) add(p.stages->count.open), add(p.stages->devices_per_stage.open);
    add(p.micro_batches.open);
    if (p.order.alternatives.size() > 1) add(p.order.open);
    add(p.zero_open);
    if (p.stages) add(p.stages->boundaries_open);
    return names;
}

LOOM_INLINE plan_spec& plan_spec::narrow(const std::string& open, std::vector<std::int64_t> allowed) {
    bool found = false;
    auto set = [&](degree_spec& d) {
        if (d.open != open) return;
        d.allowed = allowed;
        found = true;
    };
    for (rule& r : rules) {
        if (r.trans)
            for (split_spec& s : *r.trans) set(s.degree);
        if (r.assign) set(r.assign->colocate);
    }
    if (stages) set(stages->count), set(stages->devices_per_stage);
    set(micro_batches);
    if (zero_open == open) zero_allowed = allowed, found = true;
    if (!found)
        throw plan_error("plan_spec::narrow: '" + open +
                         "' is not an open number of the plan (a degree, colocation, stage count, devices per stage, "
                         "micro-batch count or ZeRO stage); give one of the names plan::open_parameters lists");
    return *this;
}

LOOM_INLINE std::int64_t degree_value(const degree_spec& d, const plan_spec& p, const std::string& where) {
    return detail::degree_value_named_by(d, p, [&] { return where; });
}

LOOM_INLINE bool recompute_chosen(const rule& r, const plan_spec& p) {
    detail::note_choice(r.recompute_open);
    auto it = p.choices.find(r.recompute_open);
    if (it != p.choices.end() && (it->second == 0 || it->second == 1)) return it->second == 1;
    const std::string where = (r.origin.empty() ? std::string("a rule") : r.origin) + " on " + r.on.describe();
    if (it == p.choices.end())
        throw plan_error("plan: open recompute choice '" + r.recompute_open + "' of " + where +
                         " has no value; choose 0 (keep) or 1 (recompute) (plan_spec::choose(\"" + r.recompute_open +
                         "\", 1)) or set it in the plan file's \"choices\"");
    if (it->second != 0 && it->second != 1)
        throw plan_error("plan: open recompute choice '" + r.recompute_open + "' of " + where + " was given " +
                         std::to_string(it->second) + "; choose 0 (keep) or 1 (recompute)");
    return it->second == 1;
}
}  // namespace loom::plan

namespace loom::plan::detail {

LOOM_INLINE void check_not_forbidden(const plan_spec& p, const node& n, const split_spec& s, const std::string& where) {
    for (const bound_variable& v : n.sig.vars) {
        const bool this_one = s.label.empty() ? v.dim == s.dim : v.label == s.label;
        if (!this_one) continue;
        for (const split_spec& f : p.forbidden) {
            const bool forbidden = f.label.empty() ? v.dim == f.dim : v.label == f.label;
            if (forbidden)
                throw plan_error("plan::forbid<Split<" +
                                 (f.label.empty() ? std::string(f.dim.name()) : "Var<\"" + f.label + "\">") + ">>: " +
                                 where + " splits " + v.label + " (dim " + std::string(v.dim.name()) +
                                 "), which the plan forbids; remove that split or the constraint");
        }
    }
}

LOOM_INLINE resolved_plan partition_ops(const plan_spec& p, const graph& g, piece_devices record) {
    if (p.devices < 1) throw plan_error("plan: devices = " + std::to_string(p.devices) + "; use at least one device");
    const std::size_t forward = g.forward_node_count();
    resolved_plan out;
    out.devices = p.devices;
    out.zero = p.zero;
    out.name = p.name;
    out.forward.resize(forward);
    std::vector<bool> matched(p.rules.size(), false);
    std::vector<const std::vector<char>*> remembered(p.rules.size(), nullptr);
    if (active_selector_memo)
        for (std::size_t k = 0; k < p.rules.size(); ++k) remembered[k] = active_selector_memo->matches(p.rules[k].on, g);
    for (std::size_t i = 0; i < forward; ++i) {
        const node& n = g.nodes[i];
        std::optional<std::vector<split_spec>> splits;
        std::optional<assign_spec> assign;
        bool recompute = false;
        std::string origin;
        for (std::size_t k = 0; k < p.rules.size(); ++k) {
            const rule& r = p.rules[k];
            if (remembered[k] ? !(*remembered[k])[i] : !r.on.matches(g, n)) continue;
            matched[k] = true;
            if (r.trans) splits = r.trans, origin = r.origin;
            if (r.assign) assign = r.assign;
            if (r.recompute) recompute = *r.recompute;
            if (!r.recompute_open.empty()) recompute = recompute_chosen(r, p);
        }
        if (!splits && !assign && !recompute) continue;
        op_partition op;
        // Named only for a message (most resolutions raise none).
        const auto where = [&] {
            return (origin.empty() ? std::string("a rule") : origin) + " on " + std::string(n.op->name) + " '" + n.name + "'";
        };
        if (splits)
            for (const auto& s : *splits) {
                const std::int64_t degree = degree_value_named_by(s.degree, p, where);
                op.splits.push_back({s.dim, s.label, degree, s.replicate});
                if (!s.replicate && degree > 1 && !p.forbidden.empty()) check_not_forbidden(p, n, s, where());
            }
        op.recompute = recompute;
        if (assign && assign->devices.empty()) {
            const std::int64_t per_device =
                degree_value_named_by(assign->colocate, p, [&] { return "the colocation of " + where(); });
            const std::string spelling =
                std::string(assign->coshard ? "coshard<" : "colocate<") + std::to_string(per_device) + ">";
            if (per_device < 1)
                throw plan_error("plan: " + spelling + " on " + where() + ": use at least one piece per device");
            if (assign->coshard) {
                if (op.splits.empty())
                    throw plan_error("plan: " + spelling + " on " + where() +
                                     ": the op has no split to cut further; give the rule a trans (or put the "
                                     "Coshard part after one with the same selector)");
                op.splits.back().degree *= per_device;
            }
            const std::int64_t pieces = op.pieces();
            if (pieces % per_device != 0)
                throw plan_error("plan: " + spelling + " on " + where() + ": " + std::to_string(pieces) +
                                 " pieces cannot be grouped " + std::to_string(per_device) +
                                 " per device; choose a colocation that divides " + std::to_string(pieces));
            if (record == piece_devices::range) {
                op.devices = {assign->first_device, assign->first_device + static_cast<int>((pieces - 1) / per_device)};
            } else {
                op.devices.reserve(static_cast<std::size_t>(pieces));
                for (std::int64_t k = 0; k < pieces; ++k) op.devices.push_back(assign->first_device + static_cast<int>(k / per_device));
            }
            if (per_device > 1 && p.colocation_requires_recompute && !recompute)
                throw plan_error("plan: " + spelling + " on " + where() +
                                 " without recompute, but the plan requires colocated ops to recompute; add recompute "
                                 "to the same selector");
        } else if (assign) {
            op.devices = assign->devices;
            // Pieces share a device through devices named twice.
            std::vector<int> placed = op.devices;
            std::sort(placed.begin(), placed.end());
            const bool shared = std::adjacent_find(placed.begin(), placed.end()) != placed.end();
            if (shared && p.colocation_requires_recompute && !recompute)
                throw plan_error("plan: an assign that puts several pieces on one device on " + where() +
                                 " without recompute, but the plan requires colocated ops to recompute; add recompute "
                                 "to the same selector");
        }
        out.forward[i] = std::move(op);
    }
    for (std::size_t k = 0; k < p.rules.size(); ++k)
        if (!matched[k] && !p.rules[k].optional)
            throw plan_error("plan: the rule " + (p.rules[k].origin.empty() ? std::string() : "'" + p.rules[k].origin + "' ") +
                             "on " + p.rules[k].on.describe() +
                             " matches no op of the model; fix its selector (op kinds, name or scope glob, layer "
                             "range) or remove the rule");
    return out;
}

}  // namespace loom::plan::detail
#endif  // LOOM_HEADER_DEFINITIONS
