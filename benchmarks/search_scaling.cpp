// How long the plan search takes as models deepen and clusters grow: search::search_plan
// over a GPT model family (hidden 8192, 64 heads, sequence 2048, vocabulary 51200, global
// batch 1024 sequences) on DGX A100 nodes, every candidate priced folded from small
// instances of the model (search/folded_price.hpp), in nnScaler's whole space
// (plan::spaces::nnscaler: TP, PP, DP, micro-batches, every order, ZeRO 0-3, recompute,
// Coshard, stage boundaries) unless --spaces says otherwise. Each search has a time budget;
// where it runs out the row says so, with the gap the search could prove (where some
// assignments were never even bounded, to the whole training work spread over every GPU,
// any_plan_lower_bound: a true gap, but far from a proof).
//
// Each row is judged against --target seconds and says plainly whether the search met it:
// a plan found and proven best within that time. A search that stops at its budget, or
// that ends without a plan (nothing fits, or a space the cluster cannot hold), does not.
// The question this program exists for (96 layers on 1024 GPUs over nnScaler's space in
// under 1 s) is NOT met today: its row is the last of the default table.
//
//   search_scaling                              the default table, smallest rows first
//   search_scaling --layers 96 --devices 1024   the headline row alone
//   search_scaling --spaces megatron,nnscaler --budget 60 --target 1
//   search_scaling --out benchmarks/results/search_scaling.md --json benchmarks/results/search_scaling.json
// The default run (3 depths x 3 cluster sizes, 30 s budget each) takes about 5 to 10 minutes
// on 2 cores: a folded price at 1024 GPUs builds instances of 64 to 512 devices (2 to 15 s
// each: deep pipelines fold their stages, shallow ones keep them), and a search that has no
// plan yet when its budget runs out finishes the price it is computing (prices it would
// drop once it has a plan are cancelled).
// Run from the repository root.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <loom/models/gpt.hpp>
#include <loom/plan/spaces.hpp>
#include <loom/search/plan_search.hpp>

#include "support/gpt_family.hpp"
#include "support/machine.hpp"
#include "support/record.hpp"

using namespace loom;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The gist of why a search found nothing, short enough for a table cell: its first clause,
// before the advice in parentheses (the JSON record keeps the whole message).
std::string gist(const std::string& text) {
    const std::string line = text.substr(0, text.find('\n'));
    return line.substr(0, line.find(" ("));
}

std::string percent(double fraction) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f%%", 100.0 * fraction);
    return text;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Time of search_plan (folded, priced by programs) for GPT on DGX A100 clusters as depth and GPUs grow"};
    std::vector<std::int64_t> layer_counts{24, 48, 96};
    std::vector<int> device_counts{8, 64, 1024};
    std::vector<std::string> spaces{"nnscaler"};
    double budget = 30.0, target = 1.0;
    int threads = 0;
    std::string out, json_out;
    app.add_option("--layers", layer_counts, "GPT depths")->delimiter(',');
    app.add_option("--devices", device_counts, "GPU counts (multiples of 8: DGX A100 nodes)")->delimiter(',');
    app.add_option("--spaces", spaces, "megatron, deepspeed, alpa, nnscaler")->delimiter(',');
    app.add_option("--budget", budget, "time budget of each search, s (0: until the best is proven)");
    app.add_option("--target", target, "the search time each row is judged against, s");
    app.add_option("--threads", threads, "assignments priced at once (0: one per hardware thread)");
    app.add_option("--out", out, "also write the table to this Markdown file");
    app.add_option("--json", json_out, "also write a JSON record to this file");
    CLI11_PARSE(app, argc, argv);
    for (int devices : device_counts)
        if (devices < 8 || devices % 8 != 0) {
            std::fprintf(stderr, "error: --devices %d is not a whole number of 8-GPU DGX A100 nodes; give a multiple of 8\n",
                         devices);
            return 2;
        }
    // Smallest rows first: a long default run shows its cheap rows before the costly ones.
    std::sort(layer_counts.begin(), layer_counts.end());
    std::sort(device_counts.begin(), device_counts.end());

    search::plan_search_options options;
    options.price.storage = loom::precision::bf16;
    options.price.optimizer_bytes_per_element = 12;  // AdamW moments and a float master copy
    options.price.runtime_bytes = 2.0 * search::detail::gib;
    options.time_budget_seconds = budget;
    options.threads = threads;

    std::ostringstream table;
    table << "| space | layers | GPUs | search s | met " << target
          << " s? | assignments | refused | bounded | priced | pruned | unbounded | gap | predicted step s | chosen plan |\n"
          << "|---|---:|---:|---:|:--:|---:|---:|---:|---:|---:|---:|---:|---:|:--|\n";
    std::printf("%s", table.str().c_str());
    nlohmann::json rows = nlohmann::json::array();
    int met = 0, total = 0;
    for (const std::string& name : spaces)
        for (std::int64_t layers : layer_counts)
            for (int devices : device_counts) {
                const models::gpt_config config{.layers = layers, .hidden = 8192, .heads = 64, .vocab = 51200,
                                                .seq = 2048, .batch = 1024};
                const search::model_family family = bench::gpt_family(config);
                const search::cluster hw = search::dgx_a100(devices / 8);
                nlohmann::json row{{"space", name}, {"layers", layers}, {"devices", devices}};
                char line[1024];
                const auto start = std::chrono::steady_clock::now();
                try {
                    const plan::plan_spec space = plan::spaces::by_name(name, devices);
                    const search::plan_search_result r = search::search_plan(family, space, hw, options);
                    const double seconds = seconds_since(start);
                    const auto& s = r.stats;
                    // Bounded: resolved and given a lower bound, neither refused nor left by the budget.
                    const std::int64_t bounded = s.assignments - s.refused - s.unbounded;
                    const bool proven = r.gap == 0;
                    const std::string gap = proven ? "0 (proven)" : percent(r.gap) + " (not proven)";
                    const std::string chosen = search::choices_text(r.parameters, r.best.choices);
                    const bool on_target = proven && seconds <= target;
                    met += on_target;
                    std::snprintf(line, sizeof line, "| %s | %lld | %d | %.2f | %s | %lld | %lld | %lld | %lld | %lld | %lld | %s | %.3f | %s |\n",
                                  name.c_str(), static_cast<long long>(layers), devices, seconds, on_target ? "yes" : "NO",
                                  static_cast<long long>(s.assignments), static_cast<long long>(s.refused),
                                  static_cast<long long>(bounded), static_cast<long long>(s.priced),
                                  static_cast<long long>(s.pruned), static_cast<long long>(s.unbounded), gap.c_str(),
                                  r.best.price.step_seconds, chosen.c_str());
                    row.update({{"seconds", seconds},
                                {"bounding_seconds", s.bounding_seconds},
                                {"met_target", on_target},
                                {"assignments", s.assignments},
                                {"refused", s.refused},
                                {"skipped", s.skipped},
                                {"bounded", bounded},
                                // Bounds computed in all: the enumeration's, and every one the
                                // descent compared (those it moved to are counted in `bounded`).
                                {"descended", s.descended},
                                {"looked_at", s.looked_at},
                                {"bounds_computed", bounded - s.descended + s.looked_at},
                                {"priced", s.priced},
                                {"over_memory", s.over_memory},
                                {"over_memory_unpriced", s.over_memory_unpriced},
                                {"pruned", s.pruned},
                                {"unexplored", s.unexplored},
                                {"unbounded", s.unbounded},
                                {"gap", r.gap},
                                {"proven", proven},
                                {"chosen", chosen},
                                {"predicted_step_s", r.best.price.step_seconds},
                                {"peak_memory_bytes", r.best.price.peak_memory()}});
                } catch (const loom::error& e) {
                    // Nothing found that fits (or a space the cluster cannot hold): the row
                    // keeps its time; the statistics go down with the search.
                    const double seconds = seconds_since(start);
                    std::snprintf(line, sizeof line, "| %s | %lld | %d | %.2f | NO | - | - | - | - | - | - | - | - | none: %s |\n",
                                  name.c_str(), static_cast<long long>(layers), devices, seconds, gist(e.what()).c_str());
                    row.update({{"seconds", seconds}, {"met_target", false}, {"error", e.what()}});
                }
                ++total;
                table << line;
                std::printf("%s", line);
                std::fflush(stdout);
                rows.push_back(row);
            }
    char summary[256];
    std::snprintf(summary, sizeof summary, "\n%d of %d searches met the target of %g s (budget %g s per search).\n", met,
                  total, target, budget);
    table << summary;
    std::printf("%s", summary);
    try {
        if (!out.empty()) {
            std::ofstream file(out);
            file << "# search_scaling\n\nsearch_plan over a GPT model family (hidden 8192, 64 heads, sequence 2048, "
                    "vocabulary 51200, global batch 1024), folded pricing, on DGX A100 nodes (80 GB). Budget per search: "
                 << budget << " s; target " << target << " s. Machine: " << bench::cpu_model() << ", commit "
                 << bench::git_revision() << ", " << bench::utc_now() << ".\n\n"
                 << table.str();
            if (!file) throw loom::error("cannot write the table '" + out + "'; pass a writable --out path");
        }
        if (!json_out.empty()) {
            nlohmann::json record;
            record["benchmark"] = "search_scaling";
            record["model"] = {{"hidden", 8192}, {"heads", 64}, {"vocab", 51200}, {"seq", 2048}, {"batch", 1024}};
            record["folded"] = true;
            record["budget_s"] = budget;
            record["target_s"] = target;
            record["rows"] = rows;
            bench::write_record(record, json_out);
        }
    } catch (const loom::error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
    return 0;
}
