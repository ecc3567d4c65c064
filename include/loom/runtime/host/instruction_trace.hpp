#pragma once
// When each instruction of a host program ran: the measured timeline that a predicted one
// (search::price_programs with a timeline) is held against. An executor that was handed a
// trace (executor::set_trace) appends one entry per instruction, communication included,
// in seconds since the trace's origin; ranks that share the origin share the time axis.
//
//   host::instruction_trace trace;           // origin: now
//   exec.set_trace(&trace);  exec.run();  exec.set_trace(nullptr);
#include <chrono>
#include <vector>

#include <loom/graph/graph.hpp>

namespace loom::host {

struct traced_instruction {
    node_id node = no_id;
    double start = 0;  // s since the origin
    double end = 0;
};

struct instruction_trace {
    std::chrono::steady_clock::time_point origin = std::chrono::steady_clock::now();
    std::vector<traced_instruction> entries;

    double since_origin(std::chrono::steady_clock::time_point t) const {
        return std::chrono::duration<double>(t - origin).count();
    }
};

}  // namespace loom::host
