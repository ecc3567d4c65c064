#pragma once
// What loom_plan is asked to do. The command line (or a JSON request) is read in main.cpp
// and the search runs in plan.cpp, so CLI11 and loom compile in separate translation units.
#include <cstdint>
#include <string>
#include <vector>

struct loom_plan_options {
    // the model: gpt, t5, swin or evoformer, sized by these (each model reads them as its
    // run_loom_plan says)
    std::string model = "gpt";
    std::int64_t layers = 24, hidden = 2048, heads = 16, seq = 2048, vocab = 50304, batch = 512;
    // the cluster: a preset "name:nodes" or a JSON profile
    std::string cluster = "dgx_a100:4";
    std::string cluster_json;
    double memory = 0;  // bytes per device; 0: the device's memory
    std::string precision = "bf16";  // bf16 / f16 (mixed precision, Adam) or f32: to_string(loom::precision)
    // the space: empty lists mean every value that fits
    std::vector<int> tp, pp, micro_batches, zero;
    std::vector<std::string> schedules, recompute;
    bool boundaries = false;  // search stage boundaries
    int boundary_slack = 0;   // ... each within this many layers of the even split (0: any)
    bool interlaced = false;  // also consider the interlaced pipeline
    std::vector<int> coshard{1};  // Coshard factors to consider
    bool unfolded = false;    // decide per layer instead of per class of identical layers; with a space: price in full
    double budget = 0;        // seconds; 0: search to the end
    // outputs
    std::string out, trace, save_cluster;
    std::string load;  // a plan file to apply to the model instead of searching
    // A space to search, priced by the programs each plan produces: a known system's
    // (megatron, deepspeed, alpa, nnscaler) or a plan file with open parameters.
    std::string space;
    double runtime_memory = -1;  // bytes a runtime holds beside the program; < 0: 2 GiB on GPU presets, 0 else
};

// Reads a JSON request ({"layers": 24, "cluster": "dgx2_v100:2", "tp": [1, 2], ...}, the
// option names without dashes, '-' as '_') over the defaults; throws with the key on error.
void apply_request_file(const std::string& path, loom_plan_options& o);

// Searches (or evaluates o.load) and prints; returns the exit code.
int run_loom_plan(const loom_plan_options& o);
