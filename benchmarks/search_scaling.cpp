// How long the plan search takes as models deepen and clusters grow: GPT with 24 to 192
// layers on 8 to 1024 GPUs of DGX A100 nodes, over the full space (TP, PP, DP,
// micro-batches, recompute per layer, ZeRO stage, schedule), folded (one decision per
// class of identical layers) and unfolded (per layer). Writes a Markdown table.
//
//   search_scaling                          the full table (unfolded runs capped at --budget s)
//   search_scaling --layers 96 --devices 1024
//   search_scaling --out benchmarks/results/search_scaling.md
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <loom/models/gpt.hpp>
#include <loom/search/branch_and_bound.hpp>

using namespace loom;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Search time of loom's branch-and-bound planner for GPT on DGX A100 clusters"};
    std::vector<int> layer_counts{24, 48, 96, 192}, device_counts{8, 64, 256, 1024};
    double budget = 10.0;
    std::string out;
    app.add_option("--layers", layer_counts, "GPT depths");
    app.add_option("--devices", device_counts, "GPU counts (multiples of 8)");
    app.add_option("--budget", budget, "Time budget of each search, seconds (then the proven gap is reported)");
    app.add_option("--out", out, "Also write the table to this Markdown file");
    CLI11_PARSE(app, argc, argv);

    std::ostringstream table;
    table << "| layers | GPUs | graph + profile s | folded search s | nodes | cut | timed | unfolded search s | "
             "unfolded complete | same plan | predicted step s | plan |\n"
          << "|---:|---:|---:|---:|---:|---:|---:|---:|:--:|:--:|---:|:--|\n";
    for (int layers : layer_counts) {
        const auto build_start = std::chrono::steady_clock::now();
        // GPT-3-like widths; the batch is the global batch in sequences.
        const models::gpt_config cfg{.layers = layers, .hidden = 8192, .heads = 64, .vocab = 51200, .seq = 2048,
                                     .batch = 1024};
        const graph g = models::gpt(cfg).training_graph();
        const search::model_profile profile = search::profile_model(g);
        const double build = seconds_since(build_start);
        for (int devices : device_counts) {
            const search::cluster hw = search::dgx_a100(devices / 8);
            search::search_options folded_options;
            folded_options.time_budget_seconds = budget;
            search::search_options unfolded_options = folded_options;
            unfolded_options.fold = false;
            search::cost_context folded_ctx(profile, hw, folded_options), unfolded_ctx(profile, hw, unfolded_options);
            const search::search_space space;
            const auto folded = search::branch_and_bound(folded_ctx, space);
            const auto unfolded = search::branch_and_bound(unfolded_ctx, space);
            const bool same = folded.found == unfolded.found &&
                              (!folded.found || folded.cost.step_time == unfolded.cost.step_time);
            std::ostringstream plan;
            if (folded.found)
                plan << "TP" << folded.best.tp << " PP" << folded.best.pp << " DP" << folded.best.dp << " m"
                     << folded.best.micro_batches << " " << plan::to_string(folded.best.schedule) << " ZeRO"
                     << static_cast<int>(folded.best.zero);
            char row[512];
            std::snprintf(row, sizeof row, "| %d | %d | %.2f | %.3f | %ld | %ld | %ld | %.3f | %s | %s | %.3f | %s |\n",
                          layers, devices, build, folded.stats.seconds, folded.stats.nodes, folded.stats.pruned_by_bound,
                          folded.stats.leaves, unfolded.stats.seconds,
                          unfolded.stats.complete ? "yes" : ("no, gap " + std::to_string(unfolded.stats.gap)).c_str(),
                          unfolded.stats.complete ? (same ? "yes" : "NO") : "-",
                          folded.found ? folded.cost.step_time : 0.0, folded.found ? plan.str().c_str() : "none fits");
            table << row;
            std::cout << row << std::flush;
        }
    }
    if (!out.empty()) {
        std::ofstream file(out);
        file << "# search_scaling\n\nGPT (hidden 8192, 64 heads, sequence 2048, vocabulary 51200, global batch 1024) on DGX "
                "A100 nodes (80 GB). Full space: TP, PP, DP, micro-batches, per-layer recompute, ZeRO 0-3, GPipe / "
                "1F1B / interleaved 1F1B. Budget per search: "
             << budget << " s.\n\n"
             << table.str();
    }
    return 0;
}
