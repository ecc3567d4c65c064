#pragma once
// The error types loom throws. Every message names the thing that is wrong, the value
// that was seen and how to fix it, e.g.
//   "linear: input 'x' has inner extent 64 (dim Hidden) but weight 'w' expects 128; ..."
#include <stdexcept>
#include <string>

namespace loom {

// Base of every loom error, so callers can catch one type.
struct error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A graph that cannot be built: extents that disagree, a dim an op does not have.
struct shape_error : error {
    using error::error;
};

// A plan or schedule that cannot be resolved against a graph.
struct plan_error : error {
    using error::error;
};

// A data or checkpoint file that is missing, truncated or of the wrong format.
struct data_error : error {
    using error::error;
};

// Misuse of a run-time object (executor, optimizer, communicator) by the caller.
struct usage_error : error {
    using error::error;
};

// A collective or point-to-point transfer that failed or timed out.
struct comm_error : error {
    using error::error;
};

}  // namespace loom
