#pragma once
// A resolved plan for one op (op-trans + op-assign) and for a whole graph: what plan
// combinators and presets resolve to, what the searcher's answers resolve to, and what partitioning
// (partition/apply.hpp) reads. Nothing here is a template: plans of any shape meet here.
//
// An op is cut into pieces by nested splits (outermost first) and then copied `replicas`
// times. Pieces are numbered row-major over (split_0, ..., split_k, replica), and piece i
// runs on devices[i]. Several pieces may share a device: they run one after another
// (colocation, Coshard).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <loom/core/dim.hpp>
#include <loom/core/error.hpp>
#include <loom/graph/graph.hpp>
#include <loom/schedule/schedule.hpp>

namespace loom::plan {

// Where piece k of `degree` contiguous pieces of an extent begins (piece k is [begin(k),
// begin(k + 1))): equal pieces when the degree divides the extent, else near-equal ones, the
// first extent % degree of them one longer (97 rows over 2: [0, 49) and [49, 97)).
inline std::int64_t piece_begin(std::int64_t extent, std::int64_t degree, std::int64_t k) {
    return k * (extent / degree) + std::min(k, extent % degree);
}

// Whether a split along `d` may use a degree that does not divide the extent. Only the
// vocabulary: Megatron pads it to a multiple of the tensor-parallel degree, and loom splits it
// into near-equal pieces instead (no device holds more rows than under the padding, and no
// padding rows exist to keep out of the softmax). Any other dim must divide: heads, hidden and
// FFN sizes are the model's own choice, and a degree that does not divide them is more likely
// a mistake in the plan.
inline bool splits_unevenly(dim_id d) { return d == Dim::Vocab::id; }

struct split_axis {
    dim_id dim;         // the dim to split (matched against the node's bound variables)
    std::string label;  // or a signature variable by name ("n", "...0"); wins when set
    std::int64_t degree = 1;
    // Copies instead of cuts: the op runs whole `degree` times along this axis of the piece
    // grid (the backward of an op split along a dim that its gradient op lacks).
    bool replicate = false;
    // Summands instead of cuts: piece k along this axis reads summand k of every input's
    // partial sums and writes summand k of its outputs, so an op linear in its inputs (the
    // add of two partial weight gradients) adds them without reducing them first. Set by
    // partitioning only (partition/apply.hpp), never by a plan.
    bool sums = false;

    // Whether the axis cuts one of the op's dims (neither copies nor summands).
    bool cuts() const { return !replicate && !sums; }

    std::string describe() const {
        if (replicate) return "replicate x" + std::to_string(degree);
        if (sums) return "sum x" + std::to_string(degree);
        return (label.empty() ? std::string(dim.name()) : label) + "x" + std::to_string(degree);
    }
    friend bool operator==(const split_axis&, const split_axis&) = default;
};

struct op_partition {
    std::vector<split_axis> splits;
    std::int64_t replicas = 1;
    // Where the pieces run: one device per piece, or the devices of the first pieces that
    // the rest repeat (piece k on devices[k % size], a size that divides the pieces: a
    // pipeline's micro-batches of an op all run on its stage's devices, so at 1024 devices the
    // list stays the size of a stage's pieces, not hundreds of micro-batches times that);
    // empty: pieces 0..n-1 on devices 0..n-1.
    std::vector<int> devices;
    bool recompute = false;    // recompute the op's outputs in the backward pass

    std::int64_t pieces() const {
        std::int64_t n = replicas;
        for (const auto& s : splits) n *= s.degree;
        return n;
    }
    int device_of(std::int64_t piece) const {
        if (devices.empty()) return static_cast<int>(piece);
        const auto k = static_cast<std::size_t>(piece);
        return devices[k < devices.size() ? k : k % devices.size()];
    }
    // The same partition with one device listed per piece (a repeating list written out).
    void list_every_piece() {
        const std::int64_t n = pieces();
        if (devices.empty() || static_cast<std::int64_t>(devices.size()) >= n) return;
        std::vector<int> all(static_cast<std::size_t>(n));
        for (std::int64_t k = 0; k < n; ++k) all[static_cast<std::size_t>(k)] = device_of(k);
        devices = std::move(all);
    }
    // Coordinates of piece i: one per split, then the replica index.
    std::vector<std::int64_t> coordinates(std::int64_t piece) const {
        std::vector<std::int64_t> c(splits.size() + 1);
        c.back() = piece % replicas;
        piece /= replicas;
        for (std::size_t s = splits.size(); s-- > 0;) {
            c[s] = piece % splits[s].degree;
            piece /= splits[s].degree;
        }
        return c;
    }
    std::string describe() const {
        std::string s;
        for (const auto& a : splits) s += (s.empty() ? "split " : ", ") + a.describe();
        if (replicas > 1) s += (s.empty() ? "" : ", ") + std::string("replicate x") + std::to_string(replicas);
        if (s.empty()) s = "whole";
        s += " on {";
        for (std::int64_t p = 0; p < pieces(); ++p) s += (p ? "," : "") + std::to_string(device_of(p));
        s += "}";
        if (recompute) s += ", recompute";
        return s;
    }
    friend bool operator==(const op_partition&, const op_partition&) = default;
};

// How optimizer state, gradients and parameters are sharded over data-parallel replicas.
enum class zero_stage : std::uint8_t { none = 0, optimizer = 1, gradients = 2, parameters = 3 };

// A plan resolved against one graph: a partition for every forward node (by node id of the
// forward graph), plus the settings that are not per op, plus the op-order.
//
// Pipelines (stages > 1 or micro_batches > 1): every forward node belongs to a stage (the
// op-assign of its layer range) and a forward round, and its first split is the micro-batch
// split when micro_split says so; `order` then orders the (stage, micro-batch, round, pass)
// blocks on every device. Without a pipeline, `order` is empty and every device runs its
// program in plan order.
struct resolved_plan {
    int devices = 1;
    std::vector<std::optional<op_partition>> forward;  // empty entry: the op runs whole on every device
    zero_stage zero = zero_stage::none;
    std::string name;  // for explanations: "data parallel x4", ...

    int stages = 1, micro_batches = 1, rounds = 1;
    std::vector<int> stage_of;       // per forward node (empty without a pipeline)
    std::vector<int> round_of;       // per forward node
    std::vector<bool> micro_split;   // per forward node: its first split is the micro-batch split
    std::optional<schedule::schedule> order;

    const op_partition* at(node_id n) const {
        auto i = static_cast<std::size_t>(n);
        return i < forward.size() && forward[i] ? &*forward[i] : nullptr;
    }
    bool pipelined() const { return !stage_of.empty(); }
};

}  // namespace loom::plan
