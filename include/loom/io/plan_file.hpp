#pragma once
// Plan files: the one plan value (plan::plan_spec) as versioned JSON, with its open
// parameters and the choices made for them, and the identity of the model it was made for.
//
//   io::save_plan(plan, "plan.json", model.ir());        // or without a model
//   plan::plan_spec back = io::load_plan("plan.json", model.ir());
//   auto pg = partition::apply_plan(model.ir(), back);   // the same programs as `plan`
//
//   {"format": "loom.plan", "version": 1,
//    "model": {"fingerprint": "9c1e...", "forward_nodes": 231},
//    "devices": 8, "name": "...", "zero": 1,  (or {"open": "zero", "allowed": [0, 1, 3]})
//    "rules": [{"on": {"kinds": ["linear"], "scope": "*.attn.q"}, "trans": [{"label": "n", "degree": 2}],
//               "assign": {"colocate": 2}, "recompute": true, "origin": "megatron"}, ...],
//              ("assign": {"colocate": {"open": "c"}, "coshard": true}: Coshard's open factor)
//              ("recompute": {"open": "r"}: recompute or not as an open choice, 0 or 1)
//    "stages": {"repeat": "blocks", "count": 2, "boundaries": [3], "devices_per_stage": 4},
//              (count and devices_per_stage: a number or {"open": ..., "allowed": [...]})
//              ("boundaries": {"open": "cut", "slack": 1}: the ranges as an open choice)
//    "micro_batches": {"open": "m", "allowed": [2, 4, 8]},
//    "order": {"alternatives": ["1F1B", {"kind": "interleaved 1F1B", "virtual_stages": 2}], "open": "order"},
//    "choices": {"m": 4, "order": 0}}
//
// Reading is strict, since a plan that loads differently trains differently: every field has
// one type, integers must fit their field (no silent narrowing), unknown fields are refused
// (a misspelt one would otherwise be ignored), and a file made for another model (its
// fingerprint differs) is refused. Every mistake is a loom::plan_error naming the file, the
// field and the fix; no JSON library exception escapes. Orders written as constraints alone
// (plan::ordered_by) are not stored: saving one is refused.
#include <cstdint>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <boost/mp11/algorithm.hpp>
#include <nlohmann/json.hpp>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/fingerprint.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/op.hpp>
#include <loom/ops/all.hpp>
#include <loom/plan/op_order.hpp>
#include <loom/plan/rules.hpp>

namespace loom::io {

inline constexpr int plan_format_version = 1;

namespace detail {

inline const char* schedule_name(plan::schedule_kind k) {
    switch (k) {
        case plan::schedule_kind::gpipe: return "GPipe";
        case plan::schedule_kind::one_f_one_b: return "1F1B";
        case plan::schedule_kind::interleaved: return "interleaved 1F1B";
        case plan::schedule_kind::three_f_one_b: return "3F1B";
        case plan::schedule_kind::interlaced: return "interlaced";
        case plan::schedule_kind::from_constraints: return "constraints";
    }
    return "?";
}

inline nlohmann::json number_json(const plan::degree_spec& d) {
    if (d.open.empty()) return d.value;
    return {{"open", d.open}, {"allowed", d.allowed}};
}

inline const op_def* op_kind_named(std::string_view name) {
    const op_def* found = nullptr;
    boost::mp11::mp_for_each<boost::mp11::mp_transform<boost::mp11::mp_identity, ops::all_ops>>([&](auto op) {
        using Op = typename decltype(op)::type;
        if (op_def_of<Op>().name == name) found = &op_def_of<Op>();
    });
    return found;
}

// Strict readers: `where` is "plan.json: rules[2].trans[0].degree".
struct reader {
    std::string file;

    [[noreturn]] void fail(const std::string& where, const std::string& what) const {
        throw plan_error("plan file " + file + ": " + where + " " + what);
    }
    void only(const nlohmann::json& j, const std::string& where, std::initializer_list<const char*> fields) const {
        if (!j.is_object()) fail(where, "must be an object, not " + std::string(j.type_name()));
        for (const auto& [key, value] : j.items()) {
            bool known = false;
            for (const char* f : fields) known = known || key == f;
            if (!known) {
                std::string list;
                for (const char* f : fields) list += (list.empty() ? "" : ", ") + std::string(f);
                fail(where, "has an unknown field \"" + key + "\"; the fields are " + list);
            }
        }
    }
    std::int64_t integer(const nlohmann::json& j, const std::string& where, std::int64_t lo, std::int64_t hi) const {
        if (!j.is_number_integer())
            fail(where, "must be an integer, not " + (j.is_number() ? j.dump() : std::string(j.type_name())));
        if (j.is_number_unsigned() && j.get<std::uint64_t>() > static_cast<std::uint64_t>(hi))
            fail(where, "is " + j.dump() + ", outside " + std::to_string(lo) + ".." + std::to_string(hi));
        const auto v = j.get<std::int64_t>();
        if (v < lo || v > hi) fail(where, "is " + j.dump() + ", outside " + std::to_string(lo) + ".." + std::to_string(hi));
        return v;
    }
    std::string string(const nlohmann::json& j, const std::string& where) const {
        if (!j.is_string()) fail(where, "must be a string, not " + std::string(j.type_name()));
        return j.get<std::string>();
    }
    bool boolean(const nlohmann::json& j, const std::string& where) const {
        if (!j.is_boolean()) fail(where, "must be true or false, not " + j.dump());
        return j.get<bool>();
    }
    std::vector<std::int64_t> integers(const nlohmann::json& j, const std::string& where, std::int64_t lo,
                                       std::int64_t hi) const {
        if (!j.is_array()) fail(where, "must be an array of integers, not " + std::string(j.type_name()));
        std::vector<std::int64_t> out;
        for (std::size_t i = 0; i < j.size(); ++i) out.push_back(integer(j[i], where + "[" + std::to_string(i) + "]", lo, hi));
        return out;
    }
    // A number, or {"open": name, "allowed": [...]}.
    plan::degree_spec number(const nlohmann::json& j, const std::string& where, std::int64_t lo, std::int64_t hi) const {
        if (!j.is_object()) return {integer(j, where, lo, hi), "", {}};
        only(j, where, {"open", "allowed"});
        if (!j.contains("open")) fail(where, "needs \"open\": the open parameter's name");
        plan::degree_spec d{1, string(j.at("open"), where + ".open"), {}};
        if (d.open.empty()) fail(where + ".open", "is empty; name the open parameter");
        if (j.contains("allowed")) d.allowed = integers(j.at("allowed"), where + ".allowed", lo, hi);
        return d;
    }
};

constexpr std::int64_t int_max = std::numeric_limits<int>::max();

LOOM_INLINE plan::order_policy read_policy(const reader& r, const nlohmann::json& j, const std::string& where);

LOOM_INLINE plan::rule read_rule(const reader& r, const nlohmann::json& j, const std::string& where);

}  // namespace detail

LOOM_INLINE nlohmann::json to_json(const plan::plan_spec& p, const graph* model = nullptr);

// `file` names the source in errors. With a model, a plan made for another one is refused.
LOOM_INLINE plan::plan_spec plan_from_json(const nlohmann::json& j, const std::string& file, const graph* model = nullptr);

LOOM_INLINE void save_plan(const plan::plan_spec& p, const std::string& path, const graph* model = nullptr);
inline void save_plan(const plan::plan_spec& p, const std::string& path, const graph& model) { save_plan(p, path, &model); }

LOOM_INLINE plan::plan_spec load_plan(const std::string& path, const graph* model = nullptr);
inline plan::plan_spec load_plan(const std::string& path, const graph& model) { return load_plan(path, &model); }

}  // namespace loom::io

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::io::detail {

LOOM_INLINE plan::order_policy read_policy(const reader& r, const nlohmann::json& j, const std::string& where) {
    plan::order_policy o;
    std::string kind;
    if (j.is_string()) {
        kind = j.get<std::string>();
    } else {
        r.only(j, where, {"kind", "virtual_stages"});
        if (!j.contains("kind")) r.fail(where, "needs \"kind\"");
        kind = r.string(j.at("kind"), where + ".kind");
        if (j.contains("virtual_stages"))
            o.virtual_stages = static_cast<int>(r.integer(j.at("virtual_stages"), where + ".virtual_stages", 1, int_max));
    }
    bool found = false;
    for (auto k : {plan::schedule_kind::gpipe, plan::schedule_kind::one_f_one_b, plan::schedule_kind::interleaved,
                   plan::schedule_kind::three_f_one_b, plan::schedule_kind::interlaced})
        if (kind == schedule_name(k)) o.kind = k, found = true;
    if (!found)
        r.fail(where, "names the order \"" + kind +
                          "\"; give \"GPipe\", \"1F1B\", \"interleaved 1F1B\", \"3F1B\" or \"interlaced\"");
    return o;
}

LOOM_INLINE plan::rule read_rule(const reader& r, const nlohmann::json& j, const std::string& where) {
    r.only(j, where, {"on", "trans", "assign", "recompute", "origin", "optional"});
    plan::rule out;
    if (j.contains("on")) {
        const auto& on = j.at("on");
        const std::string w = where + ".on";
        r.only(on, w, {"kinds", "name", "scope", "repeat", "first_layer", "last_layer"});
        if (on.contains("kinds")) {
            if (!on.at("kinds").is_array()) r.fail(w + ".kinds", "must be an array of op kind names");
            for (std::size_t i = 0; i < on.at("kinds").size(); ++i) {
                const std::string name = r.string(on.at("kinds")[i], w + ".kinds[" + std::to_string(i) + "]");
                const op_def* op = op_kind_named(name);
                if (!op) r.fail(w + ".kinds[" + std::to_string(i) + "]", "names \"" + name + "\", which is not one of loom's op kinds");
                out.on.kinds.push_back(op);
            }
        }
        if (on.contains("name")) out.on.name = r.string(on.at("name"), w + ".name");
        if (on.contains("scope")) out.on.scope = r.string(on.at("scope"), w + ".scope");
        if (on.contains("repeat")) out.on.repeat = r.string(on.at("repeat"), w + ".repeat");
        if (on.contains("first_layer")) out.on.first_layer = r.integer(on.at("first_layer"), w + ".first_layer", 0, int_max);
        if (on.contains("last_layer")) out.on.last_layer = r.integer(on.at("last_layer"), w + ".last_layer", -1, int_max);
    }
    if (j.contains("trans")) {
        const auto& t = j.at("trans");
        if (!t.is_array()) r.fail(where + ".trans", "must be an array of splits");
        std::vector<plan::split_spec> splits;
        for (std::size_t i = 0; i < t.size(); ++i) {
            const std::string w = where + ".trans[" + std::to_string(i) + "]";
            r.only(t[i], w, {"dim", "label", "degree", "replicate"});
            plan::split_spec s;
            if (t[i].contains("dim")) s.dim = dim_id::intern(r.string(t[i].at("dim"), w + ".dim"));
            if (t[i].contains("label")) s.label = r.string(t[i].at("label"), w + ".label");
            if (t[i].contains("replicate")) s.replicate = r.boolean(t[i].at("replicate"), w + ".replicate");
            if (!t[i].contains("degree")) r.fail(w, "needs \"degree\"");
            s.degree = r.number(t[i].at("degree"), w + ".degree", 1, int_max);
            if (s.label.empty() && s.dim == dim_id{} && !s.replicate) r.fail(w, "needs \"dim\", \"label\" or \"replicate\"");
            splits.push_back(std::move(s));
        }
        out.trans = std::move(splits);
    }
    if (j.contains("assign")) {
        const auto& a = j.at("assign");
        const std::string w = where + ".assign";
        r.only(a, w, {"devices", "colocate", "first_device", "coshard"});
        plan::assign_spec s;
        if (a.contains("devices"))
            for (std::int64_t d : r.integers(a.at("devices"), w + ".devices", 0, int_max)) s.devices.push_back(static_cast<int>(d));
        if (a.contains("colocate")) s.colocate = r.number(a.at("colocate"), w + ".colocate", 1, int_max);
        if (a.contains("coshard")) s.coshard = r.boolean(a.at("coshard"), w + ".coshard");
        if (a.contains("first_device"))
            s.first_device = static_cast<int>(r.integer(a.at("first_device"), w + ".first_device", 0, int_max));
        out.assign = std::move(s);
    }
    if (j.contains("recompute")) {
        // true / false, or {"open": "name"}: recompute or not as an open choice (0 or 1).
        const nlohmann::json& rc = j.at("recompute");
        if (rc.is_object()) {
            r.only(rc, where + ".recompute", {"open"});
            if (!rc.contains("open")) r.fail(where + ".recompute", "is an object without \"open\"; give {\"open\": \"name\"} or true or false");
            out.recompute_open = r.string(rc.at("open"), where + ".recompute.open");
        } else {
            out.recompute = r.boolean(rc, where + ".recompute");
        }
    }
    if (j.contains("origin")) out.origin = r.string(j.at("origin"), where + ".origin");
    if (j.contains("optional")) out.optional = r.boolean(j.at("optional"), where + ".optional");
    return out;
}
}  // namespace loom::io::detail

namespace loom::io {

LOOM_INLINE nlohmann::json to_json(const plan::plan_spec& p, const graph* model) {
    nlohmann::json j{{"format", "loom.plan"}, {"version", plan_format_version}, {"devices", p.devices}};
    if (model)
        j["model"] = {{"fingerprint", model_fingerprint(*model)}, {"forward_nodes", model->forward_node_count()}};
    if (!p.name.empty()) j["name"] = p.name;
    if (!p.zero_open.empty())
        j["zero"] = {{"open", p.zero_open}, {"allowed", p.zero_allowed}};
    else
        j["zero"] = static_cast<int>(p.zero);
    if (p.colocation_requires_recompute) j["colocation_requires_recompute"] = true;
    if (!p.forbidden.empty()) {
        j["forbid"] = nlohmann::json::array();
        for (const plan::split_spec& f : p.forbidden)
            j["forbid"].push_back(f.label.empty() ? nlohmann::json{{"dim", std::string(f.dim.name())}}
                                                  : nlohmann::json{{"label", f.label}});
    }
    nlohmann::json rules = nlohmann::json::array();
    for (const plan::rule& r : p.rules) {
        nlohmann::json on = nlohmann::json::object();
        if (!r.on.kinds.empty()) {
            on["kinds"] = nlohmann::json::array();
            for (const op_def* k : r.on.kinds) on["kinds"].push_back(std::string(k->name));
        }
        if (!r.on.name.empty()) on["name"] = r.on.name;
        if (!r.on.scope.empty()) on["scope"] = r.on.scope;
        if (!r.on.repeat.empty()) {
            on["repeat"] = r.on.repeat;
            on["first_layer"] = r.on.first_layer;
            on["last_layer"] = r.on.last_layer;
        }
        nlohmann::json rule{{"on", on}};
        if (r.trans) {
            rule["trans"] = nlohmann::json::array();
            for (const plan::split_spec& s : *r.trans) {
                nlohmann::json split{{"degree", detail::number_json(s.degree)}};
                if (!s.label.empty()) split["label"] = s.label;
                else if (!s.replicate) split["dim"] = std::string(s.dim.name());
                if (s.replicate) split["replicate"] = true;
                rule["trans"].push_back(split);
            }
        }
        if (r.assign) {
            nlohmann::json a = nlohmann::json::object();
            if (!r.assign->devices.empty()) a["devices"] = r.assign->devices;
            if (r.assign->colocate.value != 1 || !r.assign->colocate.open.empty())
                a["colocate"] = detail::number_json(r.assign->colocate);
            if (r.assign->coshard) a["coshard"] = true;
            if (r.assign->first_device != 0) a["first_device"] = r.assign->first_device;
            rule["assign"] = a;
        }
        if (r.recompute) rule["recompute"] = *r.recompute;
        if (!r.recompute_open.empty()) rule["recompute"] = {{"open", r.recompute_open}};
        if (!r.origin.empty()) rule["origin"] = r.origin;
        if (r.optional) rule["optional"] = true;
        rules.push_back(rule);
    }
    j["rules"] = rules;
    if (p.stages) {
        nlohmann::json s{{"repeat", p.stages->repeat}, {"count", detail::number_json(p.stages->count)}};
        if (!p.stages->boundaries.empty()) s["boundaries"] = p.stages->boundaries;
        if (!p.stages->boundaries_open.empty()) {
            nlohmann::json open{{"open", p.stages->boundaries_open}};
            if (p.stages->boundary_slack >= 0) open["slack"] = p.stages->boundary_slack;
            s["boundaries"] = open;
        }
        if (p.stages->devices_per_stage.value != 0 || !p.stages->devices_per_stage.open.empty())
            s["devices_per_stage"] = detail::number_json(p.stages->devices_per_stage);
        j["stages"] = s;
    }
    j["micro_batches"] = detail::number_json(p.micro_batches);
    if (!p.order.alternatives.empty()) {
        nlohmann::json alternatives = nlohmann::json::array();
        for (const plan::order_policy& o : p.order.alternatives) {
            if (o.kind == plan::schedule_kind::from_constraints)
                throw plan_error("save_plan: the plan's order is written as constraints (plan::ordered_by), which plan "
                                 "files do not store; save a plan ordered by a template (GPipe, OneFOneB, ...)");
            if (o.kind == plan::schedule_kind::interleaved)
                alternatives.push_back({{"kind", detail::schedule_name(o.kind)}, {"virtual_stages", o.virtual_stages}});
            else
                alternatives.push_back(detail::schedule_name(o.kind));
        }
        j["order"] = {{"alternatives", alternatives}};
        if (!p.order.open.empty()) j["order"]["open"] = p.order.open;
    }
    j["choices"] = p.choices;
    return j;
}

LOOM_INLINE plan::plan_spec plan_from_json(const nlohmann::json& j, const std::string& file, const graph* model) {
    const detail::reader r{file};
    if (!j.is_object() || !j.contains("format") || j.at("format") != "loom.plan")
        r.fail("the top level", "is not a loom plan (\"format\" is not \"loom.plan\"); give a file written by "
                                "io::save_plan or loom_plan --out");
    r.only(j, "the top level",
           {"format", "version", "model", "devices", "name", "zero", "colocation_requires_recompute", "forbid", "rules",
            "stages", "micro_batches", "order", "choices"});
    if (!j.contains("version") || !j.at("version").is_number_integer() || j.at("version") != plan_format_version)
        r.fail("\"version\"", (j.contains("version") ? "is " + j.at("version").dump() : std::string("is missing")) +
                                  "; this loom reads version " + std::to_string(plan_format_version) +
                                  "; write the plan again with this loom");
    if (j.contains("model") && model) {
        r.only(j.at("model"), "\"model\"", {"fingerprint", "forward_nodes"});
        const std::string want = model_fingerprint(*model);
        const std::string have = j.at("model").contains("fingerprint")
                                     ? r.string(j.at("model").at("fingerprint"), "\"model\".fingerprint")
                                     : std::string();
        if (have != want)
            r.fail("\"model\"", "was made for another model (fingerprint " + have + ", this model's is " + want +
                                    "); search or write a plan for this model");
    }
    plan::plan_spec p;
    if (!j.contains("devices")) r.fail("the top level", "needs \"devices\"");
    p.devices = static_cast<int>(r.integer(j.at("devices"), "\"devices\"", 1, detail::int_max));
    if (j.contains("name")) p.name = r.string(j.at("name"), "\"name\"");
    if (j.contains("zero")) {
        const plan::degree_spec z = r.number(j.at("zero"), "\"zero\"", 0, 3);
        if (z.open.empty())
            p.zero = static_cast<plan::zero_stage>(z.value);
        else
            p.zero_open = z.open, p.zero_allowed = z.allowed;
    }
    if (j.contains("colocation_requires_recompute"))
        p.colocation_requires_recompute = r.boolean(j.at("colocation_requires_recompute"), "\"colocation_requires_recompute\"");
    if (j.contains("forbid")) {
        if (!j.at("forbid").is_array()) r.fail("\"forbid\"", "must be an array of {\"dim\": ...} or {\"label\": ...}");
        for (std::size_t i = 0; i < j.at("forbid").size(); ++i) {
            const std::string w = "forbid[" + std::to_string(i) + "]";
            const auto& f = j.at("forbid")[i];
            r.only(f, w, {"dim", "label"});
            plan::split_spec s;
            if (f.contains("dim")) s.dim = dim_id::intern(r.string(f.at("dim"), w + ".dim"));
            else if (f.contains("label")) s.label = r.string(f.at("label"), w + ".label");
            else r.fail(w, "needs \"dim\" or \"label\"");
            p.forbidden.push_back(std::move(s));
        }
    }
    if (j.contains("rules")) {
        if (!j.at("rules").is_array()) r.fail("\"rules\"", "must be an array");
        for (std::size_t i = 0; i < j.at("rules").size(); ++i)
            p.rules.push_back(detail::read_rule(r, j.at("rules")[i], "rules[" + std::to_string(i) + "]"));
    }
    if (j.contains("stages")) {
        const auto& s = j.at("stages");
        r.only(s, "\"stages\"", {"repeat", "count", "boundaries", "devices_per_stage"});
        plan::stage_spec st;
        if (s.contains("repeat")) st.repeat = r.string(s.at("repeat"), "stages.repeat");
        if (!s.contains("count")) r.fail("\"stages\"", "needs \"count\"");
        st.count = r.number(s.at("count"), "stages.count", 1, detail::int_max);
        if (s.contains("boundaries") && s.at("boundaries").is_object()) {
            const auto& b = s.at("boundaries");
            r.only(b, "\"stages.boundaries\"", {"open", "slack"});
            if (!b.contains("open")) r.fail("\"stages.boundaries\"", "as an object needs \"open\": the open parameter's name");
            st.boundaries_open = r.string(b.at("open"), "stages.boundaries.open");
            if (st.boundaries_open.empty()) r.fail("\"stages.boundaries.open\"", "must name the open parameter");
            if (b.contains("slack")) st.boundary_slack = r.integer(b.at("slack"), "stages.boundaries.slack", 0, detail::int_max);
        } else if (s.contains("boundaries")) {
            st.boundaries = r.integers(s.at("boundaries"), "stages.boundaries", 1, detail::int_max);
        }
        if (s.contains("devices_per_stage"))
            st.devices_per_stage = r.number(s.at("devices_per_stage"), "stages.devices_per_stage", 0, detail::int_max);
        p.stages = std::move(st);
    }
    if (j.contains("micro_batches")) p.micro_batches = r.number(j.at("micro_batches"), "\"micro_batches\"", 1, detail::int_max);
    if (j.contains("order")) {
        const auto& o = j.at("order");
        r.only(o, "\"order\"", {"alternatives", "open"});
        if (!o.contains("alternatives") || !o.at("alternatives").is_array() || o.at("alternatives").empty())
            r.fail("\"order\"", "needs \"alternatives\": a non-empty array of orders");
        for (std::size_t i = 0; i < o.at("alternatives").size(); ++i)
            p.order.alternatives.push_back(
                detail::read_policy(r, o.at("alternatives")[i], "order.alternatives[" + std::to_string(i) + "]"));
        if (o.contains("open")) p.order.open = r.string(o.at("open"), "order.open");
        if (p.order.alternatives.size() > 1 && p.order.open.empty())
            r.fail("\"order\"", "has several alternatives but no \"open\" name; name the choice");
    }
    if (j.contains("choices")) {
        const auto& c = j.at("choices");
        if (!c.is_object()) r.fail("\"choices\"", "must be an object of open parameter names and values");
        const std::vector<std::string> open = plan::open_parameters(p);
        for (const auto& [name, value] : c.items()) {
            if (std::find(open.begin(), open.end(), name) == open.end())
                r.fail("choices.\"" + name + "\"", "is not an open parameter of the plan; remove it or open the parameter");
            p.choices[name] = r.integer(value, "choices.\"" + name + "\"", 0, detail::int_max);
        }
    }
    return p;
}

LOOM_INLINE void save_plan(const plan::plan_spec& p, const std::string& path, const graph* model) {
    const std::string text = to_json(p, model).dump(2) + "\n";
    std::ofstream out(path);
    if (!out) throw plan_error("save_plan: cannot write " + path + "; check that its folder exists and is writable");
    out << text;
    if (!out.flush()) throw plan_error("save_plan: writing " + path + " failed; check the disk");
}

LOOM_INLINE plan::plan_spec load_plan(const std::string& path, const graph* model) {
    std::ifstream in(path);
    if (!in) throw plan_error("load_plan: cannot read " + path + "; check the path");
    nlohmann::json j;
    try {
        in >> j;
    } catch (const nlohmann::json::exception& e) {
        throw plan_error("plan file " + path + ": not JSON (" + e.what() + "); give a file written by io::save_plan");
    }
    return plan_from_json(j, path, model);
}

}  // namespace loom::io
#endif  // LOOM_HEADER_DEFINITIONS
