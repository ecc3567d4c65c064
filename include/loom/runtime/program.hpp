#pragma once
// A per-device instruction program: the form every plan compiles to, and the only thing
// an executor reads. On one device it is the graph's nodes in order; plans (partition/)
// add communication instructions between them.
#include <cstdint>
#include <string>
#include <vector>

#include <loom/core/linkage.hpp>
#include <loom/core/precision.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/op.hpp>

namespace loom {

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
    // How the program stores its real tensors (core/precision.hpp). bf16 is the GPU's mixed
    // precision: tensors in bfloat16, arithmetic in float, and the outputs ops mark as
    // float_outputs kept in float. No executor runs f16.
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

// The precision tensor `t` is stored in by a program of precision `p`: float for the outputs
// its producer keeps in float (op_def::float_outputs) when p is narrower than float, and for
// the partitioner's copies of such tensors (transfers and assembles marked "keeps_float").
LOOM_INLINE precision storage_precision(const graph& g, tensor_id t, precision p);

inline std::int64_t tensor_bytes(const graph& g, tensor_id t, precision p) {
    return tensor_bytes(g.tensor(t), storage_precision(g, t, p));
}

}  // namespace loom

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom {

LOOM_INLINE precision storage_precision(const graph& g, tensor_id t, precision p) {
    if (real_bytes(p) >= real_bytes(precision::f32)) return p;
    const tensor_desc& d = g.tensor(t);
    if (d.producer == no_id) return p;
    const node& n = g.at(d.producer);
    if (n.attrs.get_or<std::int64_t>("keeps_float", 0) != 0) return precision::f32;
    for (std::size_t i = 0; i < n.outputs.size() && i < 32; ++i)
        if (n.outputs[i] == t && (n.op->float_outputs >> i & 1u)) return precision::f32;
    return p;
}

}  // namespace loom
#endif  // LOOM_HEADER_DEFINITIONS
