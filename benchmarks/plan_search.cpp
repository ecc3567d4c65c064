// How long search_plan takes to fill the known systems' spaces (plan/spaces.hpp) when every
// candidate is priced by its own programs, and what it chooses: a GPT on one or two DGX A100
// nodes. Writes a JSON record.
//
//   plan_search [--layers 8] [--hidden 512] [--heads 8] [--seq 256] [--batch 32] [--nodes 1]
//               [--out benchmarks/results/plan_search.json]
// Run from the repository root.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>

#include <loom/models/gpt.hpp>
#include <loom/plan/spaces.hpp>
#include <loom/search/plan_search.hpp>

#include "support/machine.hpp"
#include "support/record.hpp"

using namespace loom;

int main(int argc, char** argv) {
    CLI::App app{"Time search_plan over Megatron's, DeepSpeed's, Alpa's and nnScaler's spaces"};
    models::gpt_config config{.layers = 8, .hidden = 512, .heads = 8, .vocab = 8192, .seq = 256, .batch = 32};
    int nodes = 1;
    std::string out = "benchmarks/results/plan_search.json";
    app.add_option("--layers", config.layers, "GPT blocks")->check(CLI::PositiveNumber);
    app.add_option("--hidden", config.hidden, "hidden size")->check(CLI::PositiveNumber);
    app.add_option("--heads", config.heads, "attention heads")->check(CLI::PositiveNumber);
    app.add_option("--seq", config.seq, "sequence length")->check(CLI::PositiveNumber);
    app.add_option("--batch", config.batch, "global batch, in sequences")->check(CLI::PositiveNumber);
    app.add_option("--nodes", nodes, "DGX A100 nodes (8 GPUs each)")->check(CLI::PositiveNumber);
    app.add_option("--out", out, "the JSON record");
    CLI11_PARSE(app, argc, argv);
    try {
        const auto model = models::gpt(config);
        const search::cluster hw = search::dgx_a100(nodes);
        search::plan_search_options options;
        options.price.storage = loom::precision::bf16;
        options.price.optimizer_bytes_per_element = 12;  // AdamW moments and a float master copy
        options.price.runtime_bytes = 2.0 * search::detail::gib;
        nlohmann::json rows = nlohmann::json::array();
        std::printf("GPT %lld layers, hidden %lld, seq %lld, batch %lld on %s (%d GPUs)\n",
                    static_cast<long long>(config.layers), static_cast<long long>(config.hidden),
                    static_cast<long long>(config.seq), static_cast<long long>(config.batch), hw.name.c_str(), hw.devices());
        for (const std::string name : {"megatron", "deepspeed", "alpa", "nnscaler"}) {
            const plan::plan_spec space = plan::spaces::by_name(name, hw.devices());
            const search::plan_search_result r = search::search_plan(model.ir(), space, hw, options);
            std::printf("\n%s\n%s", space.name.c_str(), r.explain().c_str());
            rows.push_back({{"space", name},
                            {"assignments", r.stats.assignments},
                            {"refused", r.stats.refused},
                            {"priced", r.stats.priced},
                            {"pruned", r.stats.pruned},
                            {"over_memory", r.stats.over_memory},
                            {"seconds", r.stats.seconds},
                            {"seconds_per_priced", r.stats.priced ? r.stats.seconds / r.stats.priced : 0.0},
                            {"chosen", search::choices_text(r.parameters, r.best.choices)},
                            {"predicted_step_s", r.best.price.step_seconds},
                            {"peak_memory_bytes", r.best.price.peak_memory()}});
        }
        nlohmann::json record;
        record["benchmark"] = "plan_search";
        record["model"] = {{"layers", config.layers}, {"hidden", config.hidden}, {"heads", config.heads},
                           {"vocab", config.vocab},   {"seq", config.seq},       {"batch", config.batch}};
        record["cluster"] = hw.name;
        record["spaces"] = rows;
        record["cpu"] = bench::cpu_model();
        record["load_average"] = bench::load_average();
        record["commit"] = bench::git_revision();
        record["date_utc"] = bench::utc_now();
        bench::write_record(record, out);
        std::printf("\nrecord written to %s\n", out.c_str());
    } catch (const loom::error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
    return 0;
}
