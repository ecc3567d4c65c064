#pragma once
// How long blocks take, for the simulator and the list scheduler.
//
//   cost_model{}                                  every block 1, no latency
//   cost_model{.forward = 1, .backward = 2}       a backward costs two forwards
//   cost_model{.forward_per_stage = {1, 1, 2}}    per-stage times (the stage count must match)
//   cost_model{.latency = 0.5}                    every message adds 0.5 between its blocks
//   cost_model{.duration = [](const block& b) { ... }}   anything else
//   cost_model{.ready = [](const block& b) { ... }}      outputs ready before a block ends
// Times are in arbitrary units (the Chrome trace scales them; chrome_trace.hpp).
#include <functional>
#include <string>
#include <vector>

#include <loom/schedule/block.hpp>

namespace loom::schedule {

struct cost_model {
    double forward = 1.0;
    double backward = 1.0;
    std::vector<double> forward_per_stage;   // when not empty: the forward time of each stage
    std::vector<double> backward_per_stage;  // when not empty: the backward time of each stage
    double latency = 0.0;                    // added to every dependency that crosses devices
    std::function<double(const block&)> duration;  // when set: the time of every block
    // When set: how long after its start a block's output is ready for the blocks that read
    // it (at most its duration; a backward pass hands on its input's gradient before it
    // computes its weights' gradients). Unset: at its end.
    std::function<double(const block&)> ready;

    double of(const block& b) const {
        if (duration) return duration(b);
        const auto& per_stage = is_forward(b) ? forward_per_stage : backward_per_stage;
        if (!per_stage.empty()) {
            if (b.stage < 0 || static_cast<std::size_t>(b.stage) >= per_stage.size())
                throw schedule_error("cost_model: " + std::string(is_forward(b) ? "forward" : "backward") +
                                     "_per_stage has " + std::to_string(per_stage.size()) + " entries but " +
                                     to_string(b) + " is on stage " + std::to_string(b.stage) +
                                     "; give one time per stage");
            return per_stage[static_cast<std::size_t>(b.stage)];
        }
        return is_forward(b) ? forward : backward;
    }
};

}  // namespace loom::schedule
