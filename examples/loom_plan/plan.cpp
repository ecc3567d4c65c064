// The loom half of loom_plan: builds the model, loads or picks the cluster, searches a space
// (or applies a saved plan file), and writes the plan file, the cluster and the trace.
#include <algorithm>
#include <cstdio>
#include <cmath>
#include <fstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include <loom/loom.hpp>

#include "options.hpp"

using namespace loom;

namespace {

search::cluster cluster_of(const loom_plan_options& o) {
    if (!o.cluster_json.empty()) return search::load_cluster(o.cluster_json);
    const auto colon = o.cluster.find(':');
    const std::string name = o.cluster.substr(0, colon);
    const int nodes = colon == std::string::npos ? 1 : std::stoi(o.cluster.substr(colon + 1));
    if (name == "dgx1_v100") return search::dgx1_v100(nodes, 1);
    if (name == "dgx1_v100_8nic") return search::dgx1_v100(nodes, 8);
    if (name == "dgx2_v100") return search::dgx2_v100(nodes);
    if (name == "dgx_a100") return search::dgx_a100(nodes);
    if (name == "dgx_h100") return search::dgx_h100(nodes);
    throw usage_error("loom_plan: unknown cluster preset '" + name +
                      "'; give dgx1_v100, dgx1_v100_8nic, dgx2_v100, dgx_a100 or dgx_h100, as name:nodes");
}

// The command line's name of a schedule kind.
std::string schedule_name(plan::schedule_kind k) {
    switch (k) {
        case plan::schedule_kind::gpipe: return "gpipe";
        case plan::schedule_kind::one_f_one_b: return "1f1b";
        case plan::schedule_kind::interleaved: return "interleaved";
        case plan::schedule_kind::three_f_one_b: return "3f1b";
        case plan::schedule_kind::interlaced: return "interlaced";
        case plan::schedule_kind::from_constraints: return "constraints";
    }
    return "?";
}

// The space to search: a known system's by name, or a plan file with open parameters,
// narrowed by the command line's lists.
plan::plan_spec space_of(const loom_plan_options& o, const graph& model, int devices) {
    plan::plan_spec space;
    if (o.space == "megatron" || o.space == "deepspeed") space = plan::spaces::by_name(o.space, devices);
    else if (o.space == "alpa") space = plan::spaces::alpa(devices, o.boundary_slack);
    else if (o.space == "nnscaler") space = plan::spaces::nnscaler(devices, o.boundary_slack);
    else space = io::load_plan(o.space, model);
    auto narrow = [&](const char* name, const std::vector<int>& values) {
        if (values.empty()) return;
        space.narrow(name, std::vector<std::int64_t>(values.begin(), values.end()));
    };
    narrow("tp", o.tp);
    narrow("dp", o.dp);
    narrow("pp", o.pp);
    narrow("mb", o.micro_batches);
    narrow("coshard", o.coshard);
    if (!o.zero.empty()) {
        for (int z : o.zero)
            if (z < 0 || z > 3) throw usage_error("loom_plan: --zero " + std::to_string(z) + "; ZeRO stages are 0 to 3");
        if (space.zero_open.empty()) {
            if (std::find(o.zero.begin(), o.zero.end(), static_cast<int>(space.zero)) == o.zero.end())
                throw usage_error("loom_plan: --zero: the space fixes ZeRO-" + std::to_string(static_cast<int>(space.zero)) +
                                  "; give that stage, or a space whose ZeRO stage is open (nnscaler)");
        } else {
            space.narrow(space.zero_open, std::vector<std::int64_t>(o.zero.begin(), o.zero.end()));
        }
    }
    if (!o.schedules.empty()) {
        // Keep the space's orders of the kinds named, in the space's order.
        std::vector<plan::order_policy> kept;
        std::string offered;
        for (const plan::order_policy& a : space.order.alternatives) {
            offered += (offered.empty() ? "" : ", ") + schedule_name(a.kind);
            if (std::find(o.schedules.begin(), o.schedules.end(), schedule_name(a.kind)) != o.schedules.end())
                kept.push_back(a);
        }
        if (kept.empty())
            throw usage_error("loom_plan: --schedules: the space's orders are " +
                              (offered.empty() ? std::string("none (it has no pipeline)") : offered) +
                              "; give some of them");
        space.order.alternatives = kept;
        if (kept.size() == 1) space.order.open.clear();
    }
    if (!o.recompute.empty()) {
        // none / full narrows the layers' open recompute choice; a fixed one must be among them.
        bool keep = false, recompute = false;
        for (const std::string& r : o.recompute) {
            if (r == "none") keep = true;
            else if (r == "full") recompute = true;
            else
                throw usage_error("loom_plan: --recompute " + r +
                                  ": give none or full (selective recomputation is a plan part, "
                                  "plan::presets::recompute_layers, written in a plan file)");
        }
        bool any = false;
        for (plan::rule& r : space.rules) {
            if (!r.recompute_open.empty() && keep != recompute) {
                space.choices.erase(r.recompute_open);
                r.recompute = recompute;
                r.recompute_open.clear();
                any = true;
            } else if (r.recompute_open.empty() && r.recompute && !(*r.recompute ? recompute : keep)) {
                throw usage_error("loom_plan: --recompute: the space " + (*r.recompute ? std::string("recomputes") : std::string("keeps")) +
                                  " the layers of " + r.on.describe() + " always; give a space whose recompute choice is open (nnscaler)");
            } else {
                any = any || !r.recompute_open.empty() || r.recompute.has_value();
            }
        }
        if (!any && recompute)
            throw usage_error("loom_plan: --recompute full: the space recomputes nothing; give a space whose recompute choice is open (nnscaler)");
    }
    return space;
}

}  // namespace

void apply_request_file(const std::string& path, loom_plan_options& o) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("loom_plan: cannot read the request " + path);
    nlohmann::json j;
    try {
        in >> j;
    } catch (const nlohmann::json::exception& e) {
        throw std::runtime_error("loom_plan: the request " + path + " is not JSON: " + e.what());
    }
    if (!j.is_object()) throw std::runtime_error("loom_plan: the request " + path + " must be a JSON object of options");
    for (const auto& [key, value] : j.items()) {
        try {
            if (key == "layers") o.layers = value.get<std::int64_t>();
            else if (key == "hidden") o.hidden = value.get<std::int64_t>();
            else if (key == "heads") o.heads = value.get<std::int64_t>();
            else if (key == "seq") o.seq = value.get<std::int64_t>();
            else if (key == "vocab") o.vocab = value.get<std::int64_t>();
            else if (key == "batch") o.batch = value.get<std::int64_t>();
            else if (key == "cluster") o.cluster = value.get<std::string>();
            else if (key == "cluster_json") o.cluster_json = value.get<std::string>();
            else if (key == "memory") o.memory = value.get<double>();
            else if (key == "precision") o.precision = value.get<std::string>();
            else if (key == "tp") o.tp = value.get<std::vector<int>>();
            else if (key == "dp") o.dp = value.get<std::vector<int>>();
            else if (key == "pp") o.pp = value.get<std::vector<int>>();
            else if (key == "micro_batches") o.micro_batches = value.get<std::vector<int>>();
            else if (key == "zero") o.zero = value.get<std::vector<int>>();
            else if (key == "schedules") o.schedules = value.get<std::vector<std::string>>();
            else if (key == "recompute") o.recompute = value.get<std::vector<std::string>>();
            else if (key == "boundary_slack") o.boundary_slack = value.get<int>();
            else if (key == "coshard") o.coshard = value.get<std::vector<int>>();
            else if (key == "unfolded") o.unfolded = value.get<bool>();
            else if (key == "budget") o.budget = value.get<double>();
            else if (key == "out") o.out = value.get<std::string>();
            else if (key == "trace") o.trace = value.get<std::string>();
            else if (key == "save_cluster") o.save_cluster = value.get<std::string>();
            else if (key == "load") o.load = value.get<std::string>();
            else if (key == "model") o.model = value.get<std::string>();
            else if (key == "space") o.space = value.get<std::string>();
            else if (key == "runtime_memory") o.runtime_memory = value.get<double>();
            else throw std::runtime_error("unknown option; see loom_plan --help (names without dashes, '_' for '-')");
        } catch (const std::exception& e) {
            throw std::runtime_error("loom_plan: the request " + path + ", key \"" + key + "\": " + e.what());
        }
    }
}

namespace {

// The forward graph of the model the options describe.
graph model_of(const loom_plan_options& o) {
    const std::int64_t half = std::max<std::int64_t>(1, o.layers / 2);
    if (o.model == "gpt")
        return models::gpt({.layers = o.layers, .hidden = o.hidden, .heads = o.heads, .vocab = o.vocab, .seq = o.seq,
                            .batch = o.batch})
            .ir();
    if (o.model == "t5")
        return models::t5({.encoder_layers = half, .decoder_layers = half, .hidden = o.hidden, .heads = o.heads,
                           .vocab = o.vocab, .source_seq = o.seq, .target_seq = o.seq, .batch = o.batch})
            .ir();
    if (o.model == "swin") {
        const auto side = static_cast<std::int64_t>(std::lround(std::sqrt(static_cast<double>(o.seq))));
        if (side * side != o.seq)
            throw usage_error("loom_plan: --model swin takes --seq as patches of a square image; " + std::to_string(o.seq) +
                              " is not a square (give e.g. " + std::to_string(side * side) + ")");
        return models::swin({.side = side, .embed = o.hidden, .depths = {half, half}, .heads = {o.heads, 2 * o.heads},
                             .batch = o.batch})
            .ir();
    }
    if (o.model == "evoformer")
        return models::evoformer({.batch = o.batch, .residues = o.seq, .msa_channels = o.hidden, .heads = o.heads,
                                  .blocks = o.layers})
            .ir();
    throw usage_error("loom_plan: unknown model '" + o.model + "'; give gpt, t5, swin or evoformer");
}

// The search: the space's open parameters filled by search_plan, every plan priced by its
// own programs.
int search_space(const loom_plan_options& o, const search::cluster& hw) {
    const graph model = model_of(o);
    std::printf("model: %s, %lld forward ops, %.3fB parameters\n", o.model.c_str(),
                static_cast<long long>(model.forward_node_count()), static_cast<double>(model.parameter_count()) / 1e9);
    std::printf("cluster: %s, %d devices of %.0f GB\n", hw.name.c_str(), hw.devices(), hw.device.memory_bytes / 1e9);
    const plan::plan_spec space = space_of(o, model, hw.devices());
    std::printf("space: %s\n", space.name.empty() ? o.space.c_str() : space.name.c_str());
    search::plan_search_options options;
    options.memory_limit = o.memory;
    options.time_budget_seconds = o.budget;
    options.price.storage = o.precision == "f32"   ? loom::precision::f32
                            : o.precision == "f16" ? loom::precision::f16
                                                   : loom::precision::bf16;
    options.price.optimizer_bytes_per_element = o.precision == "f32" ? 8 : 12;  // moments, plus a float master copy
    options.price.runtime_bytes = o.runtime_memory >= 0 ? o.runtime_memory : o.cluster_json.empty() ? 2.0 * 1024.0 * 1024.0 * 1024.0 : 0.0;
    // GPTs are searched folded (search/folded_price.hpp): each plan priced from small
    // instances of the model, which is what a hundred layers on a thousand devices needs.
    const bool fold = o.model == "gpt" && !o.unfolded;
    const search::model_family family{[&](std::int64_t layers, std::int64_t batch) {
                                          loom_plan_options instance = o;
                                          instance.layers = layers;
                                          instance.batch = batch;
                                          return model_of(instance);
                                      },
                                      o.layers, o.batch};
    std::printf("pricing: %s\n", fold ? "folded (small instances of the model; --unfolded prices every device's programs)"
                                      : "every device's programs");
    const search::plan_search_result r =
        fold ? search::search_plan(family, space, hw, options) : search::search_plan(model, space, hw, options);
    std::printf("%s", r.explain().c_str());
    const double step = r.price().step_seconds;
    std::printf("throughput: %.1f samples/s, %.0f tokens/s\n", static_cast<double>(o.batch) / step,
                static_cast<double>(o.batch * o.seq) / step);
    if (!o.out.empty()) {
        io::save_plan(r.plan, o.out, model);
        std::printf("plan written to %s\n", o.out.c_str());
    }
    if (!o.trace.empty()) {
        search::price_options timed = options.price;
        timed.record_timeline = true;
        const partition::partitioned_graph programs = partition::apply_plan(model, r.plan);
        const search::program_price price = search::price_programs(programs, hw, timed);
        nlohmann::json events = nlohmann::json::array();
        for (const auto& e : price.timeline)
            events.push_back({{"ph", "X"},
                              {"name", programs.devices[static_cast<std::size_t>(e.device)].ir().at(e.node).name},
                              {"pid", e.device},
                              {"tid", e.communication ? 1 : 0},
                              {"ts", e.start * 1e6},
                              {"dur", (e.end - e.start) * 1e6}});
        std::ofstream(o.trace) << nlohmann::json{{"traceEvents", events}}.dump() << "\n";
        std::printf("predicted timeline written to %s (open it in Perfetto)\n", o.trace.c_str());
    }
    return 0;
}

// A saved plan: loaded against this model (a plan for another model is refused) and
// applied; its programs are what training would run.
int explain_saved(const loom_plan_options& o, const search::cluster& hw) {
    const graph model = model_of(o);
    const plan::plan_spec plan = io::load_plan(o.load, model);
    if (plan.devices != hw.devices())
        throw usage_error("loom_plan: " + o.load + " is a plan for " + std::to_string(plan.devices) +
                          " devices but the cluster has " + std::to_string(hw.devices()) +
                          "; give the cluster it was made for");
    const partition::partitioned_graph programs = partition::apply_plan(model, plan);
    std::printf("plan: %s\n%s", plan.name.c_str(), partition::explain(programs).c_str());
    return 0;
}

}  // namespace

int run_loom_plan(const loom_plan_options& o) {
    try {
        const search::cluster hw = cluster_of(o);
        if (!o.save_cluster.empty()) search::save_cluster(hw, o.save_cluster);
        if (o.precision != "bf16" && o.precision != "f16" && o.precision != "f32")
            throw usage_error("loom_plan: precision '" + o.precision + "'; give bf16, f16 or f32");
        return o.load.empty() ? search_space(o, hw) : explain_saved(o, hw);
    } catch (const loom::error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
}
