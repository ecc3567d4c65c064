// How long the search's lower bound of one assignment takes at scale: the first --count
// assignments of each space that a GPT (96 layers, hidden 8192, 64 heads, sequence 2048,
// vocabulary 51200, batch 1024) on --devices DGX A100 GPUs does not refuse, in the search's
// enumeration order, bounded one after another by one folded_bounds (search/plan_search.hpp),
// as search_plan bounds them: instances and their bounds built for one assignment serve the
// next. At 1024 GPUs the search spends most of its budget here (see search_scaling).
//
// Each row also prints the sum of the bounds, so that a change meant to make bounding faster
// without changing a bound can be checked against the run before it.
//
//   bound_time                                   1024 GPUs, 600 assignments of each space
//   bound_time --spaces megatron --count 300 --json benchmarks/results/bound_time.json
// Run from the repository root.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <loom/plan/spaces.hpp>
#include <loom/search/plan_search.hpp>

#include "support/gpt_family.hpp"
#include "support/record.hpp"

using namespace loom;

namespace {

struct row {
    int bounded = 0;
    double seconds = 0;  // bounding them, refusals excluded
    double sum = 0;      // of the step bounds plus the memory floors in GB
    std::size_t instances = 0;
};

// Stops the enumeration once enough assignments are bounded.
struct enough {};

row time_bounds(const std::string& space_name, int devices, int count) {
    const models::gpt_config config{.layers = 96, .hidden = 8192, .heads = 64, .vocab = 51200, .seq = 2048, .batch = 1024};
    const search::model_family family = bench::gpt_family(config);
    const search::cluster hw = search::dgx_a100(devices / 8);
    // As benchmarks/search_scaling prices them.
    search::price_options o;
    o.storage = precision::bf16;
    o.optimizer_bytes_per_element = 12;
    o.runtime_bytes = 2.0 * search::detail::gib;
    const plan::plan_spec space = plan::spaces::by_name(space_name, devices);
    const auto params = search::open_parameter_candidates(space, family.batch, family.layers);
    search::detail::folded_bounds bounds(family, hw, o);
    row out;
    try {
        search::for_each_assignment(space, params, [&](const plan::plan_spec& candidate) {
            if (out.bounded >= count) throw enough{};
            const auto start = std::chrono::steady_clock::now();
            search::detail::assignment_bounds b;
            try {
                b = bounds(candidate);
            } catch (const plan_error&) {
                return;
            } catch (const shape_error&) {
                return;
            }
            out.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            out.sum += b.step + b.memory * 1e-9;
            ++out.bounded;
        });
    } catch (const enough&) {
    }
    out.instances = bounds.instances_bounded();
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Time of the search's folded lower bound per assignment, GPT 96 x 8192 on DGX A100 GPUs"};
    std::vector<std::string> spaces{"megatron", "deepspeed", "alpa", "nnscaler"};
    int devices = 1024;
    int count = 600;
    std::string json;
    app.add_option("--spaces", spaces, "megatron, deepspeed, alpa, nnscaler");
    app.add_option("--devices", devices, "GPUs (a multiple of 8: DGX A100 nodes)")->check(CLI::PositiveNumber);
    app.add_option("--count", count, "assignments bounded per space")->check(CLI::PositiveNumber);
    app.add_option("--json", json, "also write a JSON record to this file");
    CLI11_PARSE(app, argc, argv);
    if (devices % 8 != 0) {
        std::fprintf(stderr, "bound_time: --devices %d is not a multiple of 8; give whole DGX A100 nodes\n", devices);
        return 2;
    }

    std::printf("| space | GPUs | bounded | ms per bound | instance plans bounded | sum of bounds |\n|---|---:|---:|---:|---:|---:|\n");
    nlohmann::json rows = nlohmann::json::array();
    for (const std::string& name : spaces) {
        const row r = time_bounds(name, devices, count);
        const double ms = r.bounded ? 1e3 * r.seconds / r.bounded : 0.0;
        std::printf("| %s | %d | %d | %.2f | %zu | %.17g |\n", name.c_str(), devices, r.bounded, ms, r.instances, r.sum);
        std::fflush(stdout);
        rows.push_back({{"space", name}, {"devices", devices}, {"bounded", r.bounded}, {"ms_per_bound", ms},
                        {"instance_plans", r.instances}, {"sum_of_bounds", r.sum}});
    }
    if (!json.empty()) bench::write_record({{"benchmark", "bound_time"}, {"rows", rows}}, json);
}
