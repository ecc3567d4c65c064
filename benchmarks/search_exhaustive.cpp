// search::search_plan (best-first by lower bound, stopping when the next bound cannot beat
// the runner-up) against exhaustive enumeration (every assignment of the space resolved,
// applied and priced by its programs), timed side by side on spaces small enough to
// enumerate: GPTs of 2 and 4 layers on one DGX-1 V100 node in the Megatron-LM, Alpa,
// DeepSpeed and narrowed nnScaler spaces (plan/spaces.hpp) on 4 to 8 devices, each under no
// cap and under caps of 80% and 50% of the uncapped optimum's peak memory, and an
// Evoformer with 3 recycling rounds in nnScaler's narrowed space (3F1B among its orders).
// Last, the demo's space (tools/demo.sh: nnScaler's whole space, Coshard included, for a
// GPT of 4 layers on 4 in-process ranks of this machine, calibrated as the demo calibrates
// them, its curves measured at five sizes alone and together).
// The best step times must be equal (tests/test_plan_search.cpp asserts it on the same kind
// of space); the program exits 1 where they differ, and reports the times and counts.
// Each priced assignment's step bound (as search_plan bounds it) is set against its price:
// the median and the largest ratio per space say how tight the bound is, and a ratio above
// 1 (a bound above its price, which would prune wrongly) also exits 1.
//
// One enumeration serves every cap of a space: each assignment is priced once and the caps
// only filter, so the "exhaustive s" of a space's rows is one and the same measurement.
// Both sides price on one thread (--threads 1), so that the times compare the work done.
// The search refuses fewer: an assignment that plan::resolve accepts but partition::apply_plan
// refuses is refused only when priced, so the pruned ones among them count as pruned.
//
//   search_exhaustive [--out benchmarks/results/search_exhaustive.md] [--json FILE] [--threads 1]
// The whole run takes about two minutes on 2 cores.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <loom/calibrate/host.hpp>
#include <loom/models/evoformer.hpp>
#include <loom/models/gpt.hpp>
#include <loom/partition/apply.hpp>
#include <loom/plan/resolve.hpp>
#include <loom/plan/spaces.hpp>
#include <loom/search/plan_search.hpp>

#include "support/machine.hpp"
#include "support/record.hpp"

using namespace loom;

namespace {

// Where a space is searched: a cluster and the options its prices take.
struct machine {
    search::cluster cluster;
    search::price_options price;
};

struct space_case {
    std::string model;
    std::string space_name;
    std::function<graph()> build;
    plan::plan_spec space;
    std::function<machine()> where;  // empty: one DGX-1 V100 node, default options
};

std::vector<space_case> cases() {
    std::vector<space_case> out;
    for (std::int64_t layers : {2, 4}) {
        const auto gpt = [layers] {
            return graph(models::gpt({.layers = layers, .hidden = 256, .heads = 8, .vocab = 1024, .seq = 128, .batch = 16})
                             .ir());
        };
        const std::string model = "GPT " + std::to_string(layers) + " layers";
        out.push_back({model, "Megatron-LM, 8 GPUs", gpt, plan::spaces::megatron(8)});
        out.push_back({model, "DeepSpeed, 8 GPUs", gpt, plan::spaces::deepspeed(8)});
        out.push_back({model, "Alpa, 4 GPUs, mb 1-8", gpt, plan::spaces::alpa(4).narrow("mb", {1, 2, 4, 8})});
        out.push_back({model, "nnScaler, 4 GPUs, mb 2/4, ZeRO 0/3, Coshard 1/2", gpt,
                       plan::spaces::nnscaler(4).narrow("mb", {2, 4}).narrow("zero", {0, 3}).narrow("coshard", {1, 2})});
    }
    // Three forward rounds, the last differentiated: 3F1B pipelines them, and the space holds it.
    const auto evoformer = [] {
        models::evoformer_config c;
        c.blocks = 4;
        c.batch = 8;
        c.msa_seqs = 16;
        c.residues = 32;
        c.msa_channels = 32;
        c.pair_channels = 16;
        return graph(models::evoformer(c).ir());
    };
    // Narrower than the GPTs' space: each Evoformer program prices ten times slower (its heads are nodes of their own).
    out.push_back({"Evoformer 4 blocks x 3 rounds", "nnScaler, 4 GPUs, mb 4, ZeRO 0, Coshard 1/2", evoformer,
                   plan::spaces::nnscaler(4).narrow("mb", {4}).narrow("zero", {0}).narrow("coshard", {1, 2})});
    const auto demo_gpt = [] {
        return graph(models::gpt({.layers = 4, .hidden = 128, .heads = 4, .vocab = 256, .seq = 64, .batch = 16}).ir());
    };
    out.push_back({"GPT 4 layers (the demo's)", "nnScaler, 4 calibrated host ranks", demo_gpt, plan::spaces::nnscaler(4),
                   [] { return machine{search::calibrate_host(4), search::host_price_options(4)}; }});
    return out;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Every assignment of the space resolved, applied and priced: what the search would do if
// it bounded and pruned nothing.
struct leaf {
    std::map<std::string, std::int64_t> choices;
    double step = 0;
    double peak = 0;
    double bound = 0;  // the step's lower bound, as search_plan computes it
};
struct enumeration {
    std::vector<leaf> priced;
    std::int64_t assignments = 0;
    std::int64_t refused = 0;
    double seconds = 0;

    // Bound against price over every priced leaf: the median and the largest ratio.
    std::pair<double, double> bound_ratios() const {
        std::vector<double> ratios;
        for (const leaf& l : priced)
            if (l.step > 0) ratios.push_back(l.bound / l.step);
        if (ratios.empty()) return {0, 0};
        std::sort(ratios.begin(), ratios.end());
        return {ratios[ratios.size() / 2], ratios.back()};
    }
    // The fastest leaf within `limit` bytes per device (nothing when none fits).
    const leaf* best_within(double limit) const {
        const leaf* best = nullptr;
        for (const leaf& l : priced)
            if (l.peak <= limit && (!best || l.step < best->step)) best = &l;
        return best;
    }
};

enumeration price_everything(const graph& model, const plan::plan_spec& space, const search::cluster& c,
                             const search::price_options& o) {
    const auto start = std::chrono::steady_clock::now();
    const auto params = search::open_parameter_candidates(
        space, search::batch_of(model), space.stages ? plan::detail::layer_count(model, space.stages->repeat) : 0);
    const search::training_work work = search::training_work_of(model, c.device, o);
    double bound_seconds = 0;  // not the enumeration's: taken out of its time
    enumeration out;
    search::for_each_assignment(space, params, [&](const plan::plan_spec& candidate) {
        ++out.assignments;
        try {
            const plan::resolved_plan rp = plan::resolve(candidate, model);
            const auto bounding = std::chrono::steady_clock::now();
            const search::memory_floor least = search::memory_lower_bound(rp, model, o, &work);
            const double bound = search::step_lower_bound(rp, work, o, &model, &c) + search::after_programs_lower_bound(least, c, o);
            bound_seconds += seconds_since(bounding);
            const search::program_price price = search::price_programs(partition::apply_plan(model, candidate), c, o);
            out.priced.push_back({candidate.choices, price.step_seconds, price.peak_memory(), bound});
        } catch (const plan_error&) {
            ++out.refused;
        } catch (const shape_error&) {
            ++out.refused;
        }
    });
    out.seconds = seconds_since(start) - bound_seconds;
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"search_plan against exhaustive enumeration on small spaces"};
    std::string out, json_out;
    int threads = 1;
    app.add_option("--out", out, "also write the table to this Markdown file");
    app.add_option("--json", json_out, "also write a JSON record to this file");
    app.add_option("--threads", threads, "assignments search_plan prices at once (0: one per hardware thread)");
    CLI11_PARSE(app, argc, argv);

    std::ostringstream table;
    table << "| model | space | cap | exhaustive s | assignments | refused | priced (fit) | bound / price (median, max) | "
             "search s | refused | priced | pruned | over memory | gap | same best step | plan |\n"
          << "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:--:|:--|\n";
    std::printf("%s", table.str().c_str());
    nlohmann::json rows = nlohmann::json::array();
    int spaces = 0, equal = 0, bounds_above = 0;
    double total_exhaustive = 0, total_search = 0;
    try {
        for (const space_case& c : cases()) {
            const graph model = c.build();
            const machine at = c.where ? c.where() : machine{search::dgx1_v100(1), {}};
            const search::cluster& hw = at.cluster;
            search::plan_search_options o;
            o.price = at.price;
            o.threads = threads;
            const enumeration all = price_everything(model, c.space, hw, o.price);
            total_exhaustive += all.seconds;
            const auto [median_ratio, largest_ratio] = all.bound_ratios();
            if (largest_ratio > 1 + 1e-12) ++bounds_above;
            const leaf* free_best = all.best_within(hw.device.memory_bytes);
            for (double cap : {0.0, 0.8, 0.5}) {
                // Caps are fractions of the uncapped optimum's peak (0: the device's memory).
                if (cap > 0 && !free_best) continue;
                o.memory_limit = cap > 0 ? cap * free_best->peak : 0.0;
                const double limit = cap > 0 ? o.memory_limit : hw.device.memory_bytes;
                const leaf* expected = all.best_within(limit);
                const auto start = std::chrono::steady_clock::now();
                std::optional<search::plan_search_result> found;
                std::string why_none;
                try {
                    found = search::search_plan(model, c.space, hw, o);
                } catch (const search::search_error& e) {
                    why_none = e.what();
                }
                const double t_search = seconds_since(start);
                total_search += t_search;
                const bool same =
                    found ? expected && std::abs(found->best.price.step_seconds - expected->step) <= 1e-12 * expected->step
                          : !expected;
                ++spaces;
                equal += same;
                const std::string plan =
                    found ? search::choices_text(found->parameters, found->best.choices) : std::string("none fits");
                char cap_text[32];
                if (cap > 0) std::snprintf(cap_text, sizeof cap_text, "%.2f", cap);
                else std::snprintf(cap_text, sizeof cap_text, "none");
                std::string gap = "-";
                if (found) gap = found->gap == 0 ? "0 (proven)" : std::to_string(100 * found->gap) + "%";
                std::int64_t fit = 0;
                for (const leaf& l : all.priced) fit += l.peak <= limit;
                // The search's counts go down with a search that finds nothing.
                const auto count = [&](std::int64_t search::plan_search_statistics::*n) {
                    return found ? std::to_string(found->stats.*n) : std::string("-");
                };
                char row[1024];
                std::snprintf(row, sizeof row,
                              "| %s | %s | %s | %.3f | %lld | %lld | %zu (%lld) | %.3f, %.3f | %.3f | %s | %s | %s | %s | %s | %s | %s |\n",
                              c.model.c_str(), c.space_name.c_str(), cap_text, all.seconds,
                              static_cast<long long>(all.assignments), static_cast<long long>(all.refused), all.priced.size(),
                              static_cast<long long>(fit), median_ratio, largest_ratio, t_search,
                              count(&search::plan_search_statistics::refused).c_str(),
                              count(&search::plan_search_statistics::priced).c_str(),
                              count(&search::plan_search_statistics::pruned).c_str(),
                              count(&search::plan_search_statistics::over_memory).c_str(), gap.c_str(),
                              same ? "yes" : "NO", plan.c_str());
                table << row;
                std::printf("%s", row);
                std::fflush(stdout);
                nlohmann::json r{{"model", c.model},
                                 {"space", c.space_name},
                                 {"cluster", hw.name},
                                 {"cap_fraction", cap},
                                 {"memory_limit_bytes", limit},
                                 {"exhaustive_seconds", all.seconds},
                                 {"assignments", all.assignments},
                                 {"exhaustive_refused", all.refused},
                                 {"exhaustive_priced", all.priced.size()},
                                 {"exhaustive_fit", fit},
                                 {"exhaustive_best_step_s", expected ? expected->step : 0.0},
                                 {"bound_over_price_median", median_ratio},
                                 {"bound_over_price_max", largest_ratio},
                                 {"search_seconds", t_search},
                                 {"same_best_step", same}};
                if (found)
                    r.update({{"search_priced", found->stats.priced},
                              {"search_refused", found->stats.refused},
                              {"search_pruned", found->stats.pruned},
                              {"search_over_memory", found->stats.over_memory},
                              {"search_over_memory_unpriced", found->stats.over_memory_unpriced},
                              {"search_bounding_seconds", found->stats.bounding_seconds},
                              {"gap", found->gap},
                              {"search_best_step_s", found->best.price.step_seconds},
                              {"chosen", plan}});
                else
                    r["search_none"] = why_none.substr(0, why_none.find('\n'));
                rows.push_back(r);
            }
        }
        char summary[512];
        std::snprintf(summary, sizeof summary,
                      "\n%d searches, the same best step as exhaustive pricing in %d; exhaustive %.2f s in all (one "
                      "enumeration per space), search_plan %.2f s in all; spaces with a bound above its price: %d\n",
                      spaces, equal, total_exhaustive, total_search, bounds_above);
        table << summary;
        std::printf("%s", summary);
        if (!out.empty()) {
            std::ofstream file(out);
            file << "# search_exhaustive\n\nsearch_plan against pricing every assignment by its programs, on one DGX-1 "
                    "V100 node (the demo's space: on 4 calibrated ranks of this machine); caps are fractions of the "
                    "uncapped optimum's peak memory. Machine: "
                 << bench::cpu_model() << ", commit " << bench::git_revision() << ", " << bench::utc_now() << ".\n\n"
                 << table.str();
            if (!file) throw loom::error("cannot write the table '" + out + "'; pass a writable --out path");
        }
        if (!json_out.empty()) {
            nlohmann::json record;
            record["benchmark"] = "search_exhaustive";
            record["threads"] = threads;
            record["rows"] = rows;
            record["searches"] = spaces;
            record["same_best_step"] = equal;
            record["exhaustive_seconds"] = total_exhaustive;
            record["search_seconds"] = total_search;
            record["spaces_with_a_bound_above_its_price"] = bounds_above;
            bench::write_record(record, json_out);
        }
    } catch (const loom::error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
    return equal == spaces && bounds_above == 0 ? 0 : 1;
}
