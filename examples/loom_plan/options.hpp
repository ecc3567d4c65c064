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
    // The space: a known system's (megatron, deepspeed, alpa, nnscaler) or a plan file with
    // open parameters, searched by pricing the programs each plan produces. The lists narrow
    // its open parameters (empty: every value the space allows).
    std::string space = "nnscaler";
    std::vector<int> tp, dp, pp, micro_batches, zero, coshard;
    std::vector<std::string> schedules, recompute;
    int boundary_slack = 1;  // alpa and nnscaler: each stage within this many layers of even (-1: any cut)
    bool unfolded = false;   // price every device's programs instead of small instances of the model
    double budget = 60;      // seconds, then the best so far and its gap; 0: search until the best is proven
    // outputs
    std::string out, trace, save_cluster;
    std::string load;  // a plan file to apply to the model instead of searching
    double runtime_memory = -1;  // bytes a runtime holds beside the program; < 0: 2 GiB on GPU presets, 0 else
};

// Reads a JSON request ({"layers": 24, "cluster": "dgx2_v100:2", "tp": [1, 2], ...}, the
// option names without dashes, '-' as '_') over the defaults; throws with the key on error.
void apply_request_file(const std::string& path, loom_plan_options& o);

// Searches (or evaluates o.load) and prints; returns the exit code.
int run_loom_plan(const loom_plan_options& o);
