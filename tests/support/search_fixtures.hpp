#pragma once
// A small model and a slow node for the plan-search tests: searches over them finish in
// seconds, and compute rather than latency sets their steps.
#include <loom/models/gpt.hpp>
#include <loom/search/hardware.hpp>

namespace loom::testing {

// One node of devices slow enough (a CPU's rates) that compute, not latency, dominates the
// step of a small model: the regime where bounds prune and bubbles show.
inline search::cluster slow_node() {
    search::cluster c = search::dgx_a100(1);
    c.name = "slow node";
    c.device.peak_flops_f32 = 5e10;
    c.device.memory_bandwidth = 1e10;
    return c;
}

inline models::gpt_model small_gpt() {
    return models::gpt({.layers = 4, .hidden = 64, .heads = 4, .vocab = 256, .seq = 32, .batch = 8});
}

}  // namespace loom::testing
