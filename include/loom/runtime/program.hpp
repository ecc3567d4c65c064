#pragma once
// A per-device instruction program: the form every plan compiles to, and the only thing
// an executor reads. On one device it is the graph's nodes in order; plans (partition/)
// add communication instructions between them.
#include <cstdint>
#include <string>
#include <vector>

#include <loom/graph/graph.hpp>

namespace loom {

enum class precision : std::uint8_t { f32, f64 };

inline std::size_t real_bytes(precision p) { return p == precision::f32 ? 4 : 8; }
inline std::string_view to_string(precision p) { return p == precision::f32 ? "f32" : "f64"; }

// Where a tensor's bytes live while the program runs.
struct buffer {
    enum class place : std::uint8_t {
        none,   // never materialised by this program
        arena,  // inside the program's arena, at `offset`, reused once dead
        bound,  // caller-owned storage bound before running (inputs, parameters, gradients, outputs)
    };
    place where = place::none;
    std::int64_t offset = 0;
    std::int64_t bytes = 0;
};

struct instruction {
    enum class kind : std::uint8_t { compute };
    kind what = kind::compute;
    node_id node = no_id;
};

struct program {
    const graph* source = nullptr;
    precision prec = precision::f32;
    std::vector<instruction> steps;
    std::vector<buffer> buffers;       // indexed by tensor_id
    std::vector<tensor_id> bound;      // tensors the caller must bind
    std::int64_t arena_bytes = 0;      // peak of the liveness plan
    std::int64_t unplanned_bytes = 0;  // what one buffer per tensor would take

    std::int64_t bytes_of(tensor_id t) const { return buffers.at(static_cast<std::size_t>(t)).bytes; }
};

inline std::int64_t tensor_bytes(const tensor_desc& t, precision p) {
    return t.dims.numel() * static_cast<std::int64_t>(t.kind == value_kind::index ? 4 : real_bytes(p));
}

}  // namespace loom
