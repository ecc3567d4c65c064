#pragma once
// A searched configuration as JSON, and back: what `loom_plan` writes and what a training
// program loads to run the plan (apply_configuration.hpp). Loading a saved configuration
// gives the identical configuration, hence identical per-device programs.
//
//   {"format": "loom.configuration", "version": 1,
//    "tp": 2, "pp": 4, "dp": 8, "micro_batches": 16, "chunks": 1,
//    "zero": 1, "schedule": "1F1B",
//    "layers_per_chunk": [6, 6, 6, 6], "interlaced": false,
//    "recompute": ["none", "selective", ...]}          one entry per repeated layer
//
// Every field is checked; an error names the file (when loading one), the field and the fix.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <loom/core/error.hpp>
#include <loom/search/plan_space.hpp>

namespace loom::search {

inline constexpr int configuration_format_version = 1;

inline nlohmann::json to_json(const configuration& c) {
    nlohmann::json recompute = nlohmann::json::array();
    for (auto r : c.recompute_of) recompute.push_back(to_string(r));
    return {{"format", "loom.configuration"},
            {"version", configuration_format_version},
            {"tp", c.tp},
            {"pp", c.pp},
            {"dp", c.dp},
            {"micro_batches", c.micro_batches},
            {"chunks", c.chunks},
            {"zero", static_cast<int>(c.zero)},
            {"schedule", to_string(c.schedule)},
            {"layers_per_chunk", c.layers_per_chunk},
            {"interlaced", c.interlaced},
            {"coshard", c.coshard},
            {"recompute", recompute}};
}

namespace detail {

inline int positive_int(const nlohmann::json& j, const char* field, const std::string& where) {
    if (!j.contains(field) || !j.at(field).is_number_integer() || j.at(field).get<long long>() < 1)
        throw usage_error(where + ": \"" + field + "\" must be a positive integer; write it as the searcher does (loom_plan --out)");
    return j.at(field).get<int>();
}

}  // namespace detail

// `where` names the source in errors ("plan.json").
inline configuration configuration_from_json(const nlohmann::json& j, const std::string& where = "configuration_from_json") {
    if (!j.is_object() || j.value("format", "") != "loom.configuration")
        throw usage_error(where + ": not a loom configuration (\"format\" is not \"loom.configuration\"); give a file written "
                                  "by loom_plan --out or search::save_configuration");
    if (j.value("version", 0) != configuration_format_version)
        throw usage_error(where + ": configuration version " + j.value("version", nlohmann::json()).dump() + ", this loom reads " +
                          std::to_string(configuration_format_version) + "; write it again with this loom's loom_plan");
    configuration c;
    c.tp = detail::positive_int(j, "tp", where);
    c.pp = detail::positive_int(j, "pp", where);
    c.dp = detail::positive_int(j, "dp", where);
    c.micro_batches = detail::positive_int(j, "micro_batches", where);
    c.chunks = detail::positive_int(j, "chunks", where);
    if (!j.contains("zero") || !j.at("zero").is_number_integer() || j.at("zero").get<int>() < 0 || j.at("zero").get<int>() > 3)
        throw usage_error(where + ": \"zero\" must be 0, 1, 2 or 3 (the ZeRO stage)");
    c.zero = static_cast<zero_stage>(j.at("zero").get<int>());
    const std::string schedule = j.value("schedule", "");
    if (schedule == to_string(schedule_kind::gpipe)) c.schedule = schedule_kind::gpipe;
    else if (schedule == to_string(schedule_kind::one_f_one_b)) c.schedule = schedule_kind::one_f_one_b;
    else if (schedule == to_string(schedule_kind::interleaved)) c.schedule = schedule_kind::interleaved;
    else if (schedule == to_string(schedule_kind::three_f_one_b)) c.schedule = schedule_kind::three_f_one_b;
    else
        throw usage_error(where + ": \"schedule\" is \"" + schedule + "\"; give \"GPipe\", \"1F1B\", \"interleaved 1F1B\" or \"3F1B\"");
    if (j.contains("interlaced")) {
        if (!j.at("interlaced").is_boolean())
            throw usage_error(where + ": \"interlaced\" must be true or false");
        c.interlaced = j.at("interlaced").get<bool>();
    }
    if (j.contains("coshard")) c.coshard = detail::positive_int(j, "coshard", where);  // absent in files before Coshard: 1
    if (!j.contains("layers_per_chunk") || !j.at("layers_per_chunk").is_array())
        throw usage_error(where + ": \"layers_per_chunk\" must be an array of layer counts, one per pipeline chunk");
    for (const auto& n : j.at("layers_per_chunk")) {
        if (!n.is_number_integer() || n.get<int>() < 0)
            throw usage_error(where + ": \"layers_per_chunk\" holds " + n.dump() + "; give non-negative layer counts");
        c.layers_per_chunk.push_back(n.get<int>());
    }
    if (static_cast<int>(c.layers_per_chunk.size()) != c.pp * c.chunks)
        throw usage_error(where + ": \"layers_per_chunk\" has " + std::to_string(c.layers_per_chunk.size()) +
                          " entries for pp * chunks = " + std::to_string(c.pp * c.chunks) + " chunks; give one per chunk");
    if (!j.contains("recompute") || !j.at("recompute").is_array())
        throw usage_error(where + ": \"recompute\" must be an array with one of \"none\", \"selective\", \"full\" per layer");
    for (const auto& r : j.at("recompute")) {
        const std::string text = r.is_string() ? r.get<std::string>() : r.dump();
        if (text == "none") c.recompute_of.push_back(recompute::none);
        else if (text == "selective") c.recompute_of.push_back(recompute::selective);
        else if (text == "full") c.recompute_of.push_back(recompute::full);
        else throw usage_error(where + ": \"recompute\" holds " + text + "; give \"none\", \"selective\" or \"full\"");
    }
    int layers = 0;
    for (int n : c.layers_per_chunk) layers += n;
    if (layers != static_cast<int>(c.recompute_of.size()))
        throw usage_error(where + ": the chunks hold " + std::to_string(layers) + " layers but \"recompute\" has " +
                          std::to_string(c.recompute_of.size()) + " entries; give one recompute choice per layer");
    return c;
}

inline void save_configuration(const configuration& c, const std::string& path) {
    std::ofstream out(path);
    if (!out) throw usage_error("save_configuration: cannot write " + path + "; check the folder exists and is writable");
    out << to_json(c).dump(2) << "\n";
}

inline configuration load_configuration(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw usage_error("load_configuration: cannot read " + path + "; check the path");
    nlohmann::json j;
    try {
        in >> j;
    } catch (const nlohmann::json::exception& e) {
        throw usage_error("load_configuration: " + path + " is not JSON (" + e.what() + "); give a file written by loom_plan --out");
    }
    return configuration_from_json(j, path);
}

}  // namespace loom::search
