// The paper's workloads (nnScaler Table 9 sizes) under four systems' plan spaces
// (plan/spaces.hpp: Megatron-LM, DeepSpeed, Alpa and nnScaler), each searched by
// search::search_plan with every candidate priced by its own programs, on V100 clusters
// (DGX-2 profile; --clusters dgx2,dgx1 adds the DGX-1 with one NIC), 4 to 32 GPUs. For each
// (model, GPUs, system): the predicted throughput (model TFLOP/s: the training graph's FLOPs,
// every forward round of a recycled model included, over the predicted step, summed over the
// GPUs as the paper reports it), whether anything fits, the chosen plan and the search's gap;
// and per row which system wins and by how much over the next.
//
// What it covers, and how:
// - GPT (GPT-3's 1.3B / 2.7B / 6.7B / 13B shapes, for reference), T5 (Table 9: 3.9B to 47B)
//   and AlphaFold2 (loom's Evoformer at Table 9's depths and widths, 3 recycling rounds)
//   are priced folded (search/folded_price.hpp) from model families: small instances of 4
//   and 6 layers per stage stand for the real depth. Their layers are identical within the
//   repeat the stages cut, which folding needs: T5's one repeat holds the encoder layers
//   then the decoder layers, and its instances keep the half-and-half split; checked
//   against the full programs on 16-layer models (step within 0.3%, peak memory within 3%).
// - Swin is NOT folded: its blocks differ in width stage by stage (and a family of 4 or 6
//   layers cannot keep Swin's {2, 2, n - 6, 2} depths), so the smallest Table 9 size (1.8B,
//   4 GPUs) alone is searched, unfolded, every candidate priced from all its programs.
// - Each search has a time budget (--budget, default 20 s). nnScaler's space holds millions
//   of assignments from 8 GPUs on; where the budget ends the search first, the gap it
//   proves is printed (where assignments were left unbounded, the gap to the whole training
//   work spread over every GPU, which no plan beats) and a "?" marks a system for
//   which nothing fitting was found within the budget, which is not a proof that nothing fits.
// What it does not cover: the larger Swin sizes; measured step times (every number is a
// prediction of loom's program pricing); the paper's exact batches (it does not give them:
// GPT 64 sequences of 2048, T5 8 sequences of 1024 per GPU, Swin and AlphaFold2 one sample
// per GPU); triangle multiplications (loom's Evoformer lacks them, so it has 20-30% fewer
// parameters than the sizes that name its rows).
//
//   workloads [--models gpt,t5,af2,swin] [--budget 20] [--clusters dgx2] [--systems megatron,deepspeed,alpa,nnscaler]
//             [--out benchmarks/results/workloads.md] [--json benchmarks/results/workloads.json]
// The default run takes about 16 minutes on 2 cores (52 searches, most of them stopped by
// the budget; an AlphaFold2 search passes it by up to 3x, the budget being read between
// folded bounds and prices that take seconds each). Run from the repository root.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <loom/models/evoformer.hpp>
#include <loom/models/gpt.hpp>
#include <loom/models/swin.hpp>
#include <loom/models/t5.hpp>
#include <loom/plan/spaces.hpp>
#include <loom/search/plan_search.hpp>

#include "support/gpt_family.hpp"
#include "support/machine.hpp"
#include "support/record.hpp"

using namespace loom;

namespace {

// FLOPs of every node of a training graph: the forward (each of its rounds) and the backward.
double graph_flops(const graph& g) {
    double flops = 0;
    for (const node& n : g.nodes) flops += n.op->flops ? n.op->flops(g, n) : 0.0;
    return flops;
}

struct workload {
    std::string model;
    std::string size;  // "1.8B", as in Table 9
    int gpus;          // Table 9's GPU count for this size
    search::model_family family;  // forward(layers, batch) at the real layers and batch
    bool fold = true;
    // The training graph's FLOPs at `layers` (the batch is the real one).
    std::function<double(std::int64_t layers)> training_flops;
    // Training FLOPs of the real model. Layers of one repeat are identical, so the FLOPs grow
    // linearly in them: two small instances give the real count without building its graph
    // (2 and 4 layers: T5's instances keep half encoder, half decoder).
    double real_flops() const {
        if (!fold) return training_flops(family.layers);
        const double two = training_flops(2), four = training_flops(4);
        return two + (four - two) / 2.0 * static_cast<double>(family.layers - 2);
    }
};

std::vector<workload> workloads(const std::vector<std::string>& models) {
    std::vector<workload> out;
    const auto wanted = [&](const std::string& m) { return std::find(models.begin(), models.end(), m) != models.end(); };
    const int gpus[4] = {4, 8, 16, 32};
    if (wanted("gpt")) {
        const std::int64_t layers[4] = {24, 32, 32, 40}, hidden[4] = {2048, 2560, 4096, 5120}, heads[4] = {16, 32, 32, 40};
        const char* sizes[4] = {"1.3B", "2.7B", "6.7B", "13B"};
        for (int i = 0; i < 4; ++i) {
            const auto config = [=](std::int64_t l) {
                return models::gpt_config{.layers = l, .hidden = hidden[i], .heads = heads[i], .vocab = 51200, .seq = 2048,
                                          .batch = 64};
            };
            workload w{"GPT", sizes[i], gpus[i], {}, true, {}};
            w.family = bench::gpt_family(config(layers[i]));
            w.training_flops = [=](std::int64_t l) { return graph_flops(models::gpt(config(l)).training_graph()); };
            out.push_back(std::move(w));
        }
    }
    if (wanted("t5"))
        for (int i = 0; i < 4; ++i) {
            const std::int64_t batch = 8 * gpus[i];
            // One repeat, encoder layers then decoder layers: an instance keeps half of each.
            const auto config = [=](std::int64_t l, std::int64_t b) {
                models::t5_config c = models::t5_table9(i);
                c.encoder_layers = (l + 1) / 2;
                c.decoder_layers = l / 2;
                c.batch = b;
                return c;
            };
            workload w{"T5", models::t5_table9_name(i), gpus[i], {}, true, {}};
            w.family = {[=](std::int64_t l, std::int64_t b) { return graph(models::t5(config(l, b)).ir()); },
                        models::t5_table9(i).layers(), batch};
            w.training_flops = [=](std::int64_t l) { return graph_flops(models::t5(config(l, batch)).training_graph()); };
            out.push_back(std::move(w));
        }
    if (wanted("af2")) {
        // Evoformer blocks of MSA width `hidden`, pair width 128, 128 MSA sequences of 256
        // residues (AlphaFold's training crop), 3 recycling rounds, one sample per GPU.
        const std::int64_t layers[4] = {48, 64, 96, 128}, hidden[4] = {256, 512, 1024, 1024}, heads[4] = {8, 16, 32, 32};
        const char* sizes[4] = {"0.087B", "0.93B", "2.4B", "3.2B"};
        for (int i = 0; i < 4; ++i) {
            const auto config = [=](std::int64_t l, std::int64_t b) {
                models::evoformer_config c;
                c.blocks = l;
                c.msa_channels = hidden[i];
                c.heads = heads[i];
                c.pair_channels = 128;
                c.msa_seqs = 128;
                c.residues = 256;
                c.batch = b;
                return c;
            };
            workload w{"AlphaFold2", sizes[i], gpus[i], {}, true, {}};
            w.family = {[=](std::int64_t l, std::int64_t b) { return graph(models::evoformer(config(l, b)).ir()); },
                        layers[i], gpus[i]};
            w.training_flops = [=](std::int64_t l) {
                return graph_flops(models::evoformer(config(l, gpus[i])).training_graph());
            };
            out.push_back(std::move(w));
        }
    }
    if (wanted("swin")) {
        // The smallest size only, unfolded (see the header comment): one 1536 x 1536 image per GPU.
        const auto config = [](std::int64_t b) {
            models::swin_config c = models::swin_table9(0);
            c.batch = b;
            return c;
        };
        workload w{"Swin", models::swin_table9_name(0), gpus[0], {}, false, {}};
        w.family = {[=](std::int64_t, std::int64_t b) { return graph(models::swin(config(b)).ir()); },
                    models::swin_table9(0).blocks(), gpus[0]};
        w.training_flops = [=](std::int64_t) { return graph_flops(models::swin(config(gpus[0])).training_graph()); };
        out.push_back(std::move(w));
    }
    return out;
}

// One DGX node per 16 (DGX-2) or 8 (DGX-1) GPUs; fewer GPUs than a node: part of one.
search::cluster cluster_for(bool dgx2, int gpus) {
    const int per_node = dgx2 ? 16 : 8;
    const int nodes = std::max(1, gpus / per_node);
    search::cluster hw = dgx2 ? search::dgx2_v100(nodes) : search::dgx1_v100(nodes, 1);
    if (gpus < per_node) {
        hw.topo.devices_per_node = gpus;
        hw.name += " (" + std::to_string(gpus) + " of its GPUs)";
    }
    return hw;
}

// The gist of why a search found nothing: its first clause, before the advice.
std::string gist(const std::string& text) {
    const std::string line = text.substr(0, text.find('\n'));
    return line.substr(0, line.find(" ("));
}

// Searches one system's space for workload w (its real graph given when unfolded).
search::plan_search_result search_system(const workload& w, const std::optional<graph>& real, const std::string& system,
                                         const search::cluster& hw, const search::plan_search_options& options) {
    const plan::plan_spec space = plan::spaces::by_name(system, hw.devices());
    return w.fold ? search::search_plan(w.family, space, hw, options) : search::search_plan(*real, space, hw, options);
}

struct outcome {
    bool found = false;
    bool budget_hit = false;  // nothing found, and the budget left assignments unbounded
    double tflops = 0;
    double step = 0;
    double gap = 0;
    double seconds = 0;
    std::string plan;  // the chosen assignment, or why there is none
};

std::string cell(const outcome& r) {
    if (!r.found) return r.budget_hit ? "?" : "x";
    char text[64];
    std::snprintf(text, sizeof text, "%.0f", r.tflops);
    std::string out = text;
    if (r.gap > 0) {
        std::snprintf(text, sizeof text, " (gap %.0f%%)", 100 * r.gap);
        out += text;
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Predicted throughput of the paper's workloads under four systems' plan spaces, searched by search_plan"};
    std::string out, json_out;
    std::vector<std::string> models{"gpt", "t5", "af2", "swin"}, clusters{"dgx2"};
    std::vector<std::string> systems{"megatron", "deepspeed", "alpa", "nnscaler"};
    double budget = 20;
    int threads = 0;
    app.add_option("--models", models, "gpt, t5, af2, swin")->delimiter(',');
    app.add_option("--budget", budget, "time budget of each search, s (0: until the best is proven)");
    app.add_option("--clusters", clusters, "dgx2, dgx1 (DGX-1 with one NIC per node)")->delimiter(',');
    app.add_option("--systems", systems, "megatron, deepspeed, alpa, nnscaler")->delimiter(',');
    app.add_option("--threads", threads, "assignments priced at once (0: one per hardware thread)");
    app.add_option("--out", out, "also write the table to this Markdown file");
    app.add_option("--json", json_out, "also write a JSON record to this file");
    CLI11_PARSE(app, argc, argv);

    search::plan_search_options options;
    options.price.storage = loom::precision::f16;    // V100s: f16 tensor cores, no bf16
    options.price.optimizer_bytes_per_element = 12;  // Adam moments and a float master copy
    options.price.runtime_bytes = 2.0 * search::detail::gib;
    options.time_budget_seconds = budget;
    options.threads = threads;

    std::ostringstream table, plans;
    table << "| model | size | cluster | GPUs |";
    for (const auto& s : systems) table << " " << s << " TFLOP/s |";
    table << " winner | by |\n|---|---|---|---:|";
    for (std::size_t i = 0; i < systems.size(); ++i) table << "---:|";
    table << ":--|---:|\n";
    std::printf("%s", table.str().c_str());
    nlohmann::json rows = nlohmann::json::array();
    try {
        for (const workload& w : workloads(models)) {
            const double flops = w.real_flops();
            for (const std::string& cluster_name : clusters) {
                if (cluster_name != "dgx2" && cluster_name != "dgx1")
                    throw usage_error("workloads: no cluster '" + cluster_name + "'; give dgx2 or dgx1");
                const bool dgx2 = cluster_name == "dgx2";
                const search::cluster hw = cluster_for(dgx2, w.gpus);
                std::optional<graph> real;  // unfolded pricing searches the real graph, built once
                if (!w.fold) real = w.family.real();
                std::vector<outcome> results;
                nlohmann::json row{{"model", w.model},   {"size", w.size},         {"cluster", hw.name},
                                   {"gpus", w.gpus},     {"folded", w.fold},       {"training_flops", flops},
                                   {"layers", w.family.layers}, {"batch", w.family.batch}};
                for (const std::string& system : systems) {
                    outcome r;
                    const auto start = std::chrono::steady_clock::now();
                    try {
                        const search::plan_search_result found = search_system(w, real, system, hw, options);
                        r.found = true;
                        r.step = found.best.price.step_seconds;
                        r.tflops = flops / r.step / 1e12;
                        r.gap = found.gap;
                        r.plan = search::choices_text(found.parameters, found.best.choices);
                        row["systems"][system] = {{"tflops", r.tflops},
                                                  {"step_s", r.step},
                                                  {"gap", r.gap},
                                                  {"chosen", r.plan},
                                                  {"peak_memory_bytes", found.best.price.peak_memory()},
                                                  {"assignments", found.stats.assignments},
                                                  {"refused", found.stats.refused},
                                                  {"priced", found.stats.priced},
                                                  {"pruned", found.stats.pruned},
                                                  {"unbounded", found.stats.unbounded}};
                    } catch (const search::search_error& e) {
                        r.budget_hit = std::string(e.what()).find("not bounded within the budget") != std::string::npos;
                        r.plan = gist(e.what());
                        row["systems"][system] = {{"found", false}, {"budget_hit", r.budget_hit}, {"why", e.what()}};
                    }
                    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                    row["systems"][system]["search_seconds"] = r.seconds;
                    char gap_text[64] = "";
                    if (r.found && r.gap == 0) std::snprintf(gap_text, sizeof gap_text, ", proven best");
                    else if (r.found) std::snprintf(gap_text, sizeof gap_text, ", gap %.1f%%", 100 * r.gap);
                    char detail[2048];
                    std::snprintf(detail, sizeof detail, "- %s %s, %s, %s: %s (%.1f s search%s)\n", w.model.c_str(),
                                  w.size.c_str(), hw.name.c_str(), system.c_str(), r.plan.c_str(), r.seconds,
                                  gap_text);
                    plans << detail;
                    std::fprintf(stderr, "%s", detail);
                    results.push_back(std::move(r));
                }
                // The winner, and by how much over the next system that found a plan.
                std::size_t first = systems.size(), second = systems.size();
                for (std::size_t s = 0; s < results.size(); ++s) {
                    if (!results[s].found) continue;
                    if (first == systems.size() || results[s].tflops > results[first].tflops) {
                        second = first;
                        first = s;
                    } else if (second == systems.size() || results[s].tflops > results[second].tflops) {
                        second = s;
                    }
                }
                std::ostringstream line;
                line << "| " << w.model << " | " << w.size << " | " << (dgx2 ? "DGX-2" : "DGX-1, 1 NIC") << " | " << w.gpus
                     << " |";
                for (const outcome& r : results) line << " " << cell(r) << " |";
                if (first == systems.size()) {
                    line << " none | - |\n";
                } else {
                    char by[32] = "-";
                    if (second != systems.size())
                        std::snprintf(by, sizeof by, "%.2fx", results[first].tflops / results[second].tflops);
                    line << " " << systems[first] << " | " << by << " |\n";
                    row["winner"] = systems[first];
                    if (second != systems.size()) row["winner_over_next"] = results[first].tflops / results[second].tflops;
                }
                table << line.str();
                std::printf("%s", line.str().c_str());
                std::fflush(stdout);
                rows.push_back(row);
            }
        }
        const std::string legend =
            "\nTFLOP/s: the training graph's FLOPs over the predicted step, all GPUs together. (gap N%): the budget "
            "stopped the search N% from proven (where assignments were left unbounded: from the whole training work spread "
            "over every GPU). ?: nothing fitting found within the "
            "budget (not a proof that nothing fits). x: nothing in the space fits or is legal.\n";
        table << legend;
        std::printf("%s\nChosen plans:\n%s", legend.c_str(), plans.str().c_str());
        if (!out.empty()) {
            std::ofstream file(out);
            file << "# workloads\n\nnnScaler's Table 9 workloads under the Megatron-LM, DeepSpeed, Alpa and nnScaler plan "
                    "spaces (plan/spaces.hpp), searched by search_plan with a budget of "
                 << budget << " s per search, priced by programs (folded for GPT, T5 and AlphaFold2; Swin unfolded, "
                    "1.8B only). Predictions, not measurements. Machine: "
                 << bench::cpu_model() << ", commit " << bench::git_revision() << ", " << bench::utc_now() << ".\n\n"
                 << table.str() << "\n## Chosen plans\n\n"
                 << plans.str();
            if (!file) throw loom::error("cannot write the table '" + out + "'; pass a writable --out path");
        }
        if (!json_out.empty()) {
            nlohmann::json record;
            record["benchmark"] = "workloads";
            record["budget_s"] = budget;
            record["rows"] = rows;
            bench::write_record(record, json_out);
        }
    } catch (const loom::error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
    return 0;
}
