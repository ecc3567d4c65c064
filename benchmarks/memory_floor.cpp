// How tight the search's memory floor is: leaves of a plan space, sampled in enumeration
// order, each bounded as the search bounds it (search::detail::folded_bounds: the weights,
// gradients, optimizer state and activations in flight each device must hold) and priced
// from its programs (search::price_folded), side by side. The floor decides which
// assignments a search sets aside unpriced; a loose one lets it price plans that do not
// fit (the descent on 24 layers over 8 GPUs priced 82 plans, 67 of them over memory), and
// a floor above the price would be a bug (tests/test_folded_price.cpp checks it never is
// on small spaces).
//
// GPT (hidden 8192, 64 heads, sequence 2048, vocabulary 51200, global batch 1024) on DGX
// A100 nodes, bf16 with 12 optimizer bytes per element and 2 GiB of runtime bytes, as
// search_scaling prices it.
//
//   memory_floor                                   24 layers, 8 GPUs, nnScaler's space
//   memory_floor --layers 48 --devices 16 --every 50021 --count 30 --json FILE
//
// Leaves the floor already puts over the memory limit are skipped unpriced, as the search
// skips them: the question is how far below the price the floor of a leaf that passes it
// lies. Run from the repository root.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <loom/models/gpt.hpp>
#include <loom/plan/spaces.hpp>
#include <loom/search/folded_price.hpp>
#include <loom/search/plan_search.hpp>

#include "support/gpt_family.hpp"
#include "support/machine.hpp"
#include "support/record.hpp"

using namespace loom;

namespace {

double median_of(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"The search's memory floor against the folded price, on sampled leaves of a plan space"};
    std::int64_t layers = 24, every = 100003;
    int devices = 8, count = 25;
    std::string space_name = "nnscaler", json_out;
    app.add_option("--layers", layers, "GPT depth")->check(CLI::PositiveNumber);
    app.add_option("--devices", devices, "GPUs (a multiple of 8: DGX A100 nodes)")->check(CLI::PositiveNumber);
    app.add_option("--space", space_name, "megatron, deepspeed, alpa or nnscaler");
    app.add_option("--every", every, "visit every Nth leaf in enumeration order")->check(CLI::PositiveNumber);
    app.add_option("--count", count, "leaves to price at most")->check(CLI::PositiveNumber);
    app.add_option("--json", json_out, "also write a JSON record to this file");
    CLI11_PARSE(app, argc, argv);
    if (devices % 8 != 0) {
        std::fprintf(stderr, "error: --devices %d is not a whole number of 8-GPU DGX A100 nodes; give a multiple of 8\n",
                     devices);
        return 2;
    }

    const models::gpt_config config{.layers = layers, .hidden = 8192, .heads = 64, .vocab = 51200, .seq = 2048,
                                    .batch = 1024};
    const search::model_family family = bench::gpt_family(config);
    const search::cluster hw = search::dgx_a100(devices / 8);
    search::price_options o;
    o.storage = loom::precision::bf16;
    o.optimizer_bytes_per_element = 12;  // AdamW moments and a float master copy
    o.runtime_bytes = 2.0 * search::detail::gib;
    const double limit = hw.device.memory_bytes;
    const plan::plan_spec space = plan::spaces::by_name(space_name, devices);
    const auto params = search::open_parameter_candidates(space, family.batch, family.layers);
    search::detail::folded_bounds bounds(family, hw, o);

    std::printf("%s, %lld layers on %d GPUs: every %lld-th leaf, floor against price (GiB, fullest device)\n",
                space.name.c_str(), static_cast<long long>(layers), devices, static_cast<long long>(every));
    std::printf("%-8s %8s %8s %7s %7s %7s %7s  %s\n", "floor", "price", "ratio", "bound", "arena", "optim", "runtime",
                "plan");
    const auto start = std::chrono::steady_clock::now();
    std::int64_t visited = 0, refused = 0, over_by_floor = 0;
    int priced = 0, priced_over = 0;
    std::map<std::string, std::vector<double>> ratios;  // "coshard" or "no coshard" -> floor / price
    nlohmann::json rows = nlohmann::json::array();
    search::for_each_assignment(space, params, [&](const plan::plan_spec& leaf) {
        if (visited++ % every != 0 || priced >= count) return;
        search::detail::assignment_bounds b;
        search::folded_price f;
        try {
            b = bounds(leaf);
            if (b.memory > limit) {
                ++over_by_floor;
                return;
            }
            f = search::price_folded(family, leaf, hw, o);
        } catch (const plan_error&) {
            ++refused;
            return;
        } catch (const shape_error&) {
            ++refused;
            return;
        }
        ++priced;
        const double price = f.price.peak_memory();
        priced_over += price > limit;
        const auto& m = f.price.devices[static_cast<std::size_t>(f.price.peak_memory_device())].memory;
        const std::string text = search::choices_text(params, leaf.choices);
        const auto cs = leaf.choices.find("coshard");
        ratios[cs != leaf.choices.end() && cs->second > 1 ? "coshard" : "no coshard"].push_back(b.memory / price);
        const double g = search::detail::gib;
        std::printf("%8.1f %8.1f %8.2f %7.1f %7.1f %7.1f %7.1f  %s\n", b.memory / g, price / g, b.memory / price,
                    m.bound / g, m.arena / g, m.optimizer / g, m.runtime / g, text.c_str());
        std::fflush(stdout);
        rows.push_back({{"plan", text}, {"floor_bytes", b.memory}, {"price_bytes", price}, {"bound_bytes", m.bound},
                        {"arena_bytes", m.arena}, {"optimizer_bytes", m.optimizer}, {"runtime_bytes", m.runtime}});
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%lld leaves visited, %lld sampled: %lld refused, %lld over %.0f GiB by their floor, %d priced (%d of "
                "them over it once priced); %.1f s\n",
                static_cast<long long>(visited), static_cast<long long>((visited + every - 1) / every),
                static_cast<long long>(refused), static_cast<long long>(over_by_floor), limit / search::detail::gib,
                priced, priced_over, seconds);
    nlohmann::json summary = nlohmann::json::object();
    for (const auto& [kind, r] : ratios) {
        std::printf("floor / price, %s: %zu leaves, lowest %.2f, median %.2f, highest %.2f\n", kind.c_str(), r.size(),
                    *std::min_element(r.begin(), r.end()), median_of(r), *std::max_element(r.begin(), r.end()));
        summary[kind] = {{"leaves", r.size()},
                         {"lowest", *std::min_element(r.begin(), r.end())},
                         {"median", median_of(r)},
                         {"highest", *std::max_element(r.begin(), r.end())}};
    }
    if (!json_out.empty()) {
        nlohmann::json record{{"benchmark", "memory_floor"}, {"space", space.name},     {"layers", layers},
                              {"devices", devices},          {"every", every},          {"visited", visited},
                              {"refused", refused},          {"over_by_floor", over_by_floor},
                              {"priced", priced},            {"priced_over", priced_over},
                              {"seconds", seconds},          {"floor_over_price", summary},
                              {"leaves", rows}};
        bench::write_record(record, json_out);
    }
    return 0;
}
