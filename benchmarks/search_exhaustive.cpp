// Branch-and-bound against exhaustive enumeration, timed side by side on spaces small enough
// to enumerate: GPTs of 2 and 4 layers on one DGX-1 (every layer's recompute choice on its
// own in the enumeration), under four memory caps and three kinds of space, and an Evoformer
// with 3 recycling rounds (3F1B in the space). tests/test_search.cpp asserts the equality on
// the same kinds of space; this program reports the times.
//
//   search_exhaustive [--out benchmarks/results/search_exhaustive.md]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <loom/models/evoformer.hpp>
#include <loom/models/gpt.hpp>
#include <loom/search/branch_and_bound.hpp>

using namespace loom;

namespace {

struct space_case {
    std::string name;
    std::function<graph()> build;
    double memory_fraction;  // of the unconstrained optimum's peak memory; 0: no cap
    search::search_space space;
};

std::vector<space_case> cases() {
    std::vector<space_case> out;
    for (std::int64_t layers : {2, 4})
        for (double cap : {0.0, 0.8, 0.5, 0.02})
            for (int variant = 0; variant < 3; ++variant) {
                search::search_space s;
                s.micro_batches = {1, 2, 4, 8};
                std::string kind;
                if (variant == 0) {
                    s.zero = {search::zero_stage::none, search::zero_stage::optimizer, search::zero_stage::parameters};
                    s.interlaced = {false, true};
                    kind = "ZeRO 0/1/3, interlaced";
                } else if (variant == 1) {
                    s.search_stage_boundaries = true;
                    s.zero = {search::zero_stage::none, search::zero_stage::gradients};
                    s.schedules = {plan::schedule_kind::gpipe, plan::schedule_kind::one_f_one_b};
                    s.coshard = {1, 4};
                    kind = "boundaries, Coshard 1/4";
                } else {
                    s.tp = {1, 2};
                    s.recompute_choices = {plan::recompute_policy::none, plan::recompute_policy::full};
                    s.coshard = {1, 2, 8};
                    kind = "TP 1/2, full or no recompute, Coshard 1/2/8";
                }
                char name[160];
                std::snprintf(name, sizeof name, "GPT %lld layers, cap %.2f, %s", static_cast<long long>(layers), cap,
                              kind.c_str());
                out.push_back({name,
                               [layers] {
                                   return models::gpt({.layers = layers, .hidden = 512, .heads = 8, .vocab = 1024,
                                                       .seq = 256, .batch = 16})
                                       .training_graph();
                               },
                               cap, s});
            }
    for (double cap : {0.0, 0.6, 0.3, 0.15}) {
        search::search_space s;
        s.micro_batches = {1, 2, 4, 8};
        s.zero = {search::zero_stage::none, search::zero_stage::optimizer};
        s.coshard = {1, 2};
        char name[160];
        std::snprintf(name, sizeof name, "Evoformer 4 blocks x 3 rounds, cap %.2f, 3F1B", cap);
        out.push_back({name,
                       [] {
                           models::evoformer_config c;
                           c.blocks = 4;
                           c.batch = 8;
                           c.msa_seqs = 32;
                           c.residues = 64;
                           c.msa_channels = 64;
                           c.pair_channels = 32;
                           return models::evoformer(c).training_graph();
                       },
                       cap, s});
    }
    return out;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Branch-and-bound against exhaustive enumeration on small spaces"};
    std::string out;
    app.add_option("--out", out, "also write the table to this Markdown file");
    CLI11_PARSE(app, argc, argv);

    std::ostringstream table;
    table << "| space | exhaustive s | configurations | branch-and-bound s | timed | unfolded s | same optimum | plan |\n"
          << "|---|---:|---:|---:|---:|---:|:--:|:--|\n";
    int spaces = 0, equal = 0;
    double total_exhaustive = 0, total_bb = 0;
    for (const auto& c : cases()) {
        const auto profile = search::profile_model(c.build());
        search::cost_context free_ctx(profile, search::dgx1_v100(1), {});
        const double free_peak = search::branch_and_bound(free_ctx, c.space).cost.peak_memory();
        search::search_options o;
        o.memory_per_device = c.memory_fraction * free_peak;
        search::search_options unfolded = o;
        unfolded.fold = false;
        search::cost_context all_ctx(profile, search::dgx1_v100(1), o), ctx(profile, search::dgx1_v100(1), o),
            unfolded_ctx(profile, search::dgx1_v100(1), unfolded);
        auto start = std::chrono::steady_clock::now();
        const auto all = search::enumerate_all(all_ctx, c.space);
        const double t_all = seconds_since(start);
        start = std::chrono::steady_clock::now();
        const auto bb = search::branch_and_bound(ctx, c.space);
        const double t_bb = seconds_since(start);
        start = std::chrono::steady_clock::now();
        const auto bb_unfolded = search::branch_and_bound(unfolded_ctx, c.space);
        const double t_unfolded = seconds_since(start);
        const bool same = all.found == bb.found && all.found == bb_unfolded.found &&
                          (!all.found || (std::abs(all.cost.step_time - bb.cost.step_time) <= 1e-12 * all.cost.step_time &&
                                          std::abs(all.cost.step_time - bb_unfolded.cost.step_time) <=
                                              1e-12 * all.cost.step_time));
        ++spaces;
        equal += same;
        total_exhaustive += t_all;
        total_bb += t_bb;
        std::string plan = "none fits";
        if (bb.found) {
            const auto& b = bb.best;
            plan = "TP" + std::to_string(b.tp) + " PP" + std::to_string(b.pp) + " DP" + std::to_string(b.dp) + " m" +
                   std::to_string(b.micro_batches) + (b.pp > 1 ? " " + plan::to_string(b.schedule) : std::string()) +
                   (b.coshard > 1 ? " coshard" + std::to_string(b.coshard) : std::string());
        }
        char row[512];
        std::snprintf(row, sizeof row, "| %s | %.3f | %ld | %.4f | %ld | %.4f | %s | %s |\n", c.name.c_str(), t_all,
                      all.stats.leaves, t_bb, bb.stats.leaves, t_unfolded, same ? "yes" : "NO", plan.c_str());
        table << row;
        std::cout << row << std::flush;
    }
    char summary[256];
    std::snprintf(summary, sizeof summary,
                  "\n%d spaces, the same optimum in %d; exhaustive %.2f s in all, branch-and-bound %.3f s (%.0fx)\n", spaces,
                  equal, total_exhaustive, total_bb, total_exhaustive / total_bb);
    table << summary;
    std::cout << summary;
    if (!out.empty()) {
        std::ofstream file(out);
        file << "# search_exhaustive\n\nBranch-and-bound (folded and unfolded) against exhaustive enumeration on one "
                "DGX-1 V100 profile; caps are fractions of the uncapped optimum's peak memory.\n\n"
             << table.str();
    }
    return equal == spaces ? 0 : 1;
}
