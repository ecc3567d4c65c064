// How long search_plan takes to fill the known systems' spaces (plan/spaces.hpp) when every
// candidate is priced by its own programs, and what it chooses: a GPT on one or two DGX A100
// nodes. Writes a JSON record.
//
//   plan_search [--layers 8] [--hidden 512] [--heads 8] [--seq 256] [--batch 32] [--vocab 8192]
//               [--nodes 1] [--spaces megatron,deepspeed,alpa,nnscaler] [--fold] [--budget 0]
//               [--out benchmarks/results/plan_search.json]
// --fold prices every candidate folded (search/folded_price.hpp), from small instances of
// the model, which is what searching a 96-layer GPT on 1024 GPUs needs:
//   plan_search --layers 96 --hidden 8192 --heads 64 --seq 2048 --batch 1024 --vocab 51200
//               --nodes 128 --fold --spaces megatron --out benchmarks/results/plan_search_1024.json
// Run from the repository root.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include <loom/models/gpt.hpp>
#include <loom/plan/spaces.hpp>
#include <loom/search/plan_search.hpp>

#include "support/gpt_family.hpp"
#include "support/machine.hpp"
#include "support/record.hpp"

using namespace loom;

int main(int argc, char** argv) {
    CLI::App app{"Time search_plan over Megatron's, DeepSpeed's, Alpa's and nnScaler's spaces"};
    models::gpt_config config{.layers = 8, .hidden = 512, .heads = 8, .vocab = 8192, .seq = 256, .batch = 32};
    int nodes = 1;
    bool fold = false;
    double budget = 0;
    std::vector<std::string> spaces{"megatron", "deepspeed", "alpa", "nnscaler"};
    std::string out = "benchmarks/results/plan_search.json";
    app.add_option("--layers", config.layers, "GPT blocks")->check(CLI::PositiveNumber);
    app.add_option("--hidden", config.hidden, "hidden size")->check(CLI::PositiveNumber);
    app.add_option("--heads", config.heads, "attention heads")->check(CLI::PositiveNumber);
    app.add_option("--seq", config.seq, "sequence length")->check(CLI::PositiveNumber);
    app.add_option("--batch", config.batch, "global batch, in sequences")->check(CLI::PositiveNumber);
    app.add_option("--vocab", config.vocab, "vocabulary")->check(CLI::PositiveNumber);
    app.add_option("--nodes", nodes, "DGX A100 nodes (8 GPUs each)")->check(CLI::PositiveNumber);
    app.add_option("--spaces", spaces, "the spaces to search")->delimiter(',');
    app.add_flag("--fold", fold, "price every candidate folded, from small instances of the model");
    app.add_option("--budget", budget, "time budget of each search, s (0: until the best is proven)");
    app.add_option("--out", out, "the JSON record");
    CLI11_PARSE(app, argc, argv);
    try {
        const search::model_family family = bench::gpt_family(config);
        const search::cluster hw = search::dgx_a100(nodes);
        search::plan_search_options options;
        options.price.storage = loom::precision::bf16;
        options.price.optimizer_bytes_per_element = 12;  // AdamW moments and a float master copy
        options.price.runtime_bytes = 2.0 * search::detail::gib;
        options.time_budget_seconds = budget;
        nlohmann::json rows = nlohmann::json::array();
        std::printf("GPT %lld layers, hidden %lld, seq %lld, batch %lld on %s (%d GPUs)\n",
                    static_cast<long long>(config.layers), static_cast<long long>(config.hidden),
                    static_cast<long long>(config.seq), static_cast<long long>(config.batch), hw.name.c_str(), hw.devices());
        for (const std::string& name : spaces) {
            const plan::plan_spec space = plan::spaces::by_name(name, hw.devices());
            const search::plan_search_result r = fold ? search::search_plan(family, space, hw, options)
                                                      : search::search_plan(family.real(), space, hw, options);
            std::printf("\n%s\n%s", space.name.c_str(), r.explain().c_str());
            rows.push_back({{"space", name},
                            {"assignments", r.stats.assignments},
                            {"refused", r.stats.refused},
                            {"priced", r.stats.priced},
                            {"pruned", r.stats.pruned},
                            {"over_memory", r.stats.over_memory},
                            {"seconds", r.stats.seconds},
                            {"bounding_seconds", r.stats.bounding_seconds},
                            {"over_memory_unpriced", r.stats.over_memory_unpriced},
                            {"seconds_per_priced", r.stats.priced ? r.stats.seconds / r.stats.priced : 0.0},
                            {"gap", r.gap},
                            {"chosen", search::choices_text(r.parameters, r.best.choices)},
                            {"predicted_step_s", r.best.price.step_seconds},
                            {"peak_memory_bytes", r.best.price.peak_memory()}});
        }
        nlohmann::json record;
        record["benchmark"] = "plan_search";
        record["model"] = {{"layers", config.layers}, {"hidden", config.hidden}, {"heads", config.heads},
                           {"vocab", config.vocab},   {"seq", config.seq},       {"batch", config.batch}};
        record["cluster"] = hw.name;
        record["folded"] = fold;
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
