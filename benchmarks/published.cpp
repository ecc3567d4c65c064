// loom's program prices against published measurements: Megatron-LM's own GPT
// configurations on DGX A100 nodes (Narayanan et al., "Efficient Large-Scale Language Model
// Training on GPU Clusters Using Megatron-LM", SC 2021, Table 1: the achieved teraFLOP/s per
// GPU of end-to-end training, fp16, sequence 2048, vocabulary 51200, activation
// recomputation). Each row's plan is Megatron's (tensor parallelism inside a node, data
// parallelism across, pipeline stages where the row has them, every layer recomputed); loom
// applies it to the model, prices the programs it produces on search::dgx_a100, and turns
// the predicted step time into teraFLOP/s per GPU with the paper's own FLOP count:
//   F = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h))   per step (recomputation included).
// The bar: within 25% of the published figure. Writes a JSON record.
//
//   published [--rows 5] [--accumulate 1] [--full] [--out benchmarks/results/published.json]
// Run from the repository root. Prices are folded (search/folded_price.hpp): small instances
// of each row's model and plan, extrapolated over layers and data-parallel replicas. --full
// materializes every device's programs instead: rows 1-4 take seconds each, row 5 (512
// GPUs, with a pipeline) minutes and more than 11 GB.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <loom/models/gpt.hpp>
#include <loom/partition/apply.hpp>
#include <loom/plan/presets.hpp>
#include <loom/search/folded_price.hpp>
#include <loom/search/program_price.hpp>

#include "support/gpt_family.hpp"
#include "support/machine.hpp"
#include "support/record.hpp"

using namespace loom;

namespace {

struct published_row {
    const char* name;
    std::int64_t heads, hidden, layers;
    int tp, pp, gpus;
    std::int64_t batch;
    int micro_batches;       // loom's choice where the paper does not give one (see below)
    double teraflops_per_gpu;  // published
};

// Table 1, the first five rows. The paper does not list micro-batch sizes. Without a
// pipeline loom runs each replica's share in one pass by default (--accumulate K splits it
// into K micro-batches); with one, 1F1B over 12 micro-batches of 4 sequences.
constexpr published_row rows[] = {
    {"1.7B", 24, 2304, 24, 1, 1, 32, 512, 1, 137},
    {"3.6B", 32, 3072, 30, 2, 1, 64, 512, 1, 138},
    {"7.5B", 32, 4096, 36, 4, 1, 128, 512, 1, 142},
    {"18.4B", 48, 6144, 40, 8, 1, 256, 1024, 1, 135},
    {"39.1B", 64, 8192, 48, 8, 2, 512, 1536, 12, 138},
};

double paper_flops(const published_row& r, std::int64_t seq, std::int64_t vocab) {
    const double B = static_cast<double>(r.batch), s = static_cast<double>(seq), l = static_cast<double>(r.layers),
                 h = static_cast<double>(r.hidden), V = static_cast<double>(vocab);
    return 96.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * l * h));
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Price Megatron-LM's published configurations and compare with the published throughput"};
    int row_count = 5;
    int accumulate = 1;
    bool full = false;
    std::string out = "benchmarks/results/published.json";
    app.add_option("--rows", row_count, "how many of the table's rows, from the smallest")->check(CLI::Range(1, 5));
    app.add_option("--accumulate", accumulate, "micro-batches per step in the rows without a pipeline")
        ->check(CLI::PositiveNumber);
    app.add_option("--out", out, "the JSON record");
    app.add_flag("--full", full, "materialize every device's programs instead of folding");
    CLI11_PARSE(app, argc, argv);
    try {
        const std::int64_t seq = 2048, vocab = 51200;
        search::price_options options;
        options.storage = loom::precision::f16;
        options.optimizer_bytes_per_element = 12;  // fp32 master copy and two fp32 moments
        options.runtime_bytes = 2.0 * search::detail::gib;
        nlohmann::json records = nlohmann::json::array();
        std::printf("%-6s %5s %3s %3s %4s %6s | %10s %10s %7s | %9s %8s\n", "model", "GPUs", "TP", "PP", "DP", "batch",
                    "published", "loom", "ratio", "memory", "priced in");
        for (int i = 0; i < row_count; ++i) {
            const published_row& r = rows[i];
            const int dp = r.gpus / (r.tp * r.pp);
            const search::model_family model = bench::gpt_family(
                {.layers = r.layers, .hidden = r.hidden, .heads = r.heads, .vocab = vocab, .seq = seq, .batch = r.batch});
            plan::plan_spec inner = plan::presets::megatron(r.tp, dp);
            inner.then(plan::presets::recompute_layers(plan::recompute_policy::full, 0, r.layers - 1));
            plan::plan_spec p = r.pp > 1 ? plan::presets::pipeline(r.pp, r.micro_batches,
                                                                   {plan::schedule_kind::one_f_one_b}, inner)
                                         : inner;
            const int micro_batches = r.pp > 1 ? r.micro_batches : accumulate;
            if (r.pp == 1 && micro_batches > 1) p.micro_batches = {micro_batches, "", {}};
            const search::cluster hw = search::dgx_a100(r.gpus / 8);
            const auto started = std::chrono::steady_clock::now();
            search::folded_price folded;
            if (full) folded.price = search::price_programs(partition::apply_plan(model.real(), p), hw, options);
            else folded = search::price_folded(model, p, hw, options);
            const search::program_price& price = folded.price;
            const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
            const double predicted = paper_flops(r, seq, vocab) / price.step_seconds / r.gpus / 1e12;
            const double ratio = predicted / r.teraflops_per_gpu;
            std::printf("%-6s %5d %3d %3d %4d %6lld | %10.0f %10.1f %7.2f | %6.1f GiB %7.1f s%s\n", r.name, r.gpus, r.tp,
                        r.pp, dp, static_cast<long long>(r.batch), r.teraflops_per_gpu, predicted, ratio,
                        price.peak_memory() / search::detail::gib, seconds,
                        std::abs(ratio - 1.0) <= 0.25 ? "" : "   (outside 25%)");
            std::fflush(stdout);
            records.push_back({{"model", r.name},
                               {"gpus", r.gpus},
                               {"tp", r.tp},
                               {"pp", r.pp},
                               {"dp", dp},
                               {"batch", r.batch},
                               {"micro_batches", micro_batches},
                               {"published_teraflops_per_gpu", r.teraflops_per_gpu},
                               {"predicted_teraflops_per_gpu", predicted},
                               {"predicted_over_published", ratio},
                               {"predicted_step_seconds", price.step_seconds},
                               {"busiest_compute_seconds", price.max_compute()},
                               {"busiest_communication_seconds", price.max_communication()},
                               {"idle_fraction", price.idle_fraction()},
                               {"peak_memory_gib", price.peak_memory() / search::detail::gib},
                               {"pricing_seconds", seconds},
                               {"priced", full ? "in full" : folded.describe()}});
        }
        const nlohmann::json record{{"benchmark", "published"},
                                    {"source", "Narayanan et al., SC 2021, Table 1 (Megatron-LM on DGX A100 80GB)"},
                                    {"cluster", "search::dgx_a100"},
                                    {"precision", "f16"},
                                    {"cpu", bench::cpu_model()},
                                    {"commit", bench::git_revision()},
                                    {"date", bench::utc_now()},
                                    {"rows", records}};
        bench::write_record(record, out);
        std::printf("wrote %s\n", out.c_str());
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "published: %s\n", e.what());
        return 1;
    }
}
