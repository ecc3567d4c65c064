// The loom half of loom_plan: builds and profiles the model, loads or picks the cluster,
// searches (or applies a saved plan file), and writes the plan file, the cluster and the trace.
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

plan::schedule_kind schedule_of(const std::string& s) {
    if (s == "gpipe") return plan::schedule_kind::gpipe;
    if (s == "1f1b") return plan::schedule_kind::one_f_one_b;
    if (s == "interleaved") return plan::schedule_kind::interleaved;
    if (s == "3f1b") return plan::schedule_kind::three_f_one_b;
    throw usage_error("loom_plan: unknown schedule '" + s + "'; give gpipe, 1f1b, interleaved or 3f1b");
}

plan::recompute_policy recompute_of(const std::string& s) {
    using enum plan::recompute_policy;
    for (const plan::recompute_policy r : {none, selective, full})
        if (s == plan::to_string(r)) return r;
    throw usage_error("loom_plan: unknown recompute choice '" + s + "'; give none, selective or full");
}

search::search_space space_of(const loom_plan_options& o) {
    search::search_space s;
    s.tp = o.tp;
    s.pp = o.pp;
    s.micro_batches = o.micro_batches;
    if (!o.zero.empty()) {
        s.zero.clear();
        for (int z : o.zero) {
            if (z < 0 || z > 3) throw usage_error("loom_plan: --zero " + std::to_string(z) + "; ZeRO stages are 0 to 3");
            s.zero.push_back(static_cast<search::zero_stage>(z));
        }
    }
    if (!o.schedules.empty()) {
        s.schedules.clear();
        for (const auto& name : o.schedules) s.schedules.push_back(schedule_of(name));
    }
    if (!o.recompute.empty()) {
        s.recompute_choices.clear();
        for (const auto& name : o.recompute) s.recompute_choices.push_back(recompute_of(name));
    }
    if (o.interlaced) s.interlaced = {false, true};
    s.coshard = o.coshard;
    s.search_stage_boundaries = o.boundaries;
    s.boundary_slack = o.boundary_slack;
    return s;
}

// The predicted timeline of a configuration: its block orders timed with its chunk costs.
std::string trace_of(search::cost_context& ctx, const search::configuration& c, const search::evaluation& e) {
    const auto& orders = ctx.schedule_orders(c.schedule, c.pp, c.chunks, c.micro_batches);
    schedule::cost_model costs;
    costs.forward_per_stage = e.chunk_forward;
    costs.backward_per_stage = e.chunk_backward;
    costs.latency = search::stage_message_time(ctx, c);
    return schedule::chrome_trace_json(schedule::simulate(orders.order, costs), 1e6);  // seconds -> us
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
            else if (key == "pp") o.pp = value.get<std::vector<int>>();
            else if (key == "micro_batches") o.micro_batches = value.get<std::vector<int>>();
            else if (key == "zero") o.zero = value.get<std::vector<int>>();
            else if (key == "schedules") o.schedules = value.get<std::vector<std::string>>();
            else if (key == "recompute") o.recompute = value.get<std::vector<std::string>>();
            else if (key == "boundaries") o.boundaries = value.get<bool>();
            else if (key == "boundary_slack") o.boundary_slack = value.get<int>();
            else if (key == "interlaced") o.interlaced = value.get<bool>();
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

// --space: the space searched by search_plan, every plan priced by its own programs.
int search_space(const loom_plan_options& o, const search::cluster& hw) {
    const graph model = model_of(o);
    std::printf("model: %s, %lld forward ops, %.3fB parameters\n", o.model.c_str(),
                static_cast<long long>(model.forward_node_count()), static_cast<double>(model.parameter_count()) / 1e9);
    std::printf("cluster: %s, %d devices of %.0f GB\n", hw.name.c_str(), hw.devices(), hw.device.memory_bytes / 1e9);
    const bool known = o.space == "megatron" || o.space == "deepspeed" || o.space == "alpa" || o.space == "nnscaler";
    const plan::plan_spec space = known ? plan::spaces::by_name(o.space, hw.devices()) : io::load_plan(o.space, model);
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

}  // namespace

int run_loom_plan(const loom_plan_options& o) {
    try {
        if (!o.space.empty()) return search_space(o, cluster_of(o));
        if (o.model != "gpt")
            throw usage_error("loom_plan: --model " + o.model + " needs --space (megatron, deepspeed, alpa, nnscaler or a "
                              "plan file with open parameters); the built-in grid search covers GPTs only");
        const models::gpt_config config{.layers = o.layers, .hidden = o.hidden, .heads = o.heads, .vocab = o.vocab,
                                        .seq = o.seq, .batch = o.batch};
        const search::cluster hw = cluster_of(o);
        if (!o.save_cluster.empty()) search::save_cluster(hw, o.save_cluster);
        search::search_options options;
        options.memory_per_device = o.memory;
        if (o.precision == to_string(precision::f32)) {
            options.compute = precision::f32;
            options.activation_bytes = 4;
            options.states = search::f32_adam();
        } else if (o.precision == to_string(precision::f16)) {
            options.compute = precision::f16;
        } else if (o.precision != to_string(precision::bf16)) {
            throw usage_error("loom_plan: precision '" + o.precision + "'; give bf16, f16 or f32");
        }
        options.fold = !o.unfolded;
        options.time_budget_seconds = o.budget;
        search::cost_context ctx(search::profile_model(models::gpt(config).training_graph()), hw, options);
        std::printf("model: GPT, %lld layers, hidden %lld, %lld heads, seq %lld, vocab %lld, batch %lld (%.2fB parameters)\n",
                    static_cast<long long>(o.layers), static_cast<long long>(o.hidden), static_cast<long long>(o.heads),
                    static_cast<long long>(o.seq), static_cast<long long>(o.vocab), static_cast<long long>(o.batch),
                    ctx.model().parameters / 1e9);
        std::printf("cluster: %s, %d devices of %.0f GB\n", hw.name.c_str(), hw.devices(), hw.device.memory_bytes / 1e9);

        if (!o.load.empty()) {
            // A saved plan: loaded against this model (a plan for another model is refused) and
            // applied; its programs are what training would run.
            const graph forward = models::gpt(config).ir();
            const plan::plan_spec plan = io::load_plan(o.load, forward);
            if (plan.devices != hw.devices())
                throw usage_error("loom_plan: " + o.load + " is a plan for " + std::to_string(plan.devices) +
                                  " devices but the cluster has " + std::to_string(hw.devices()) +
                                  "; give the cluster it was made for");
            const partition::partitioned_graph programs = partition::apply_plan(forward, plan);
            std::printf("plan: %s\n%s", plan.name.c_str(), partition::explain(programs).c_str());
            return 0;
        }
        const search::search_result result = search::branch_and_bound(ctx, space_of(o));
        std::printf("%s", result.explain().c_str());
        if (!result.found) return 1;
        std::printf("throughput: %.1f sequences/s, %.0f tokens/s\n", static_cast<double>(o.batch) / result.cost.step_time,
                    static_cast<double>(o.batch * o.seq) / result.cost.step_time);
        if (!o.out.empty()) {
            io::save_plan(search::to_plan(result.best), o.out, models::gpt(config).ir());
            std::printf("plan written to %s\n", o.out.c_str());
        }
        if (!o.trace.empty()) {
            std::ofstream(o.trace) << trace_of(ctx, result.best, result.cost);
            std::printf("predicted timeline written to %s (open it in Perfetto)\n", o.trace.c_str());
        }
        return 0;
    } catch (const loom::error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
}
