#pragma once
// One movement of data between devices, as partitioning materializes it: which collective
// (or point-to-point pair), over which devices, moving which boxes of which logical
// tensor. Each member device's program holds one `transfer` node pointing here.
//
// Member m of `group` contributes the piece `inputs[m]` (when has_input[m]) and receives
// `outputs[m]` (when has_output[m]); both are boxes of the logical tensor. The collectives
// keep their usual meaning over those pieces:
//   all_reduce      every member: a partial value of one box -> its full value
//   all_gather      members' tiles of a box -> the whole box on every member
//   reduce_scatter  partial values of one box -> member m gets the full value of tile m
//   all_to_all      tiles along one axis -> tiles along another axis
//   broadcast       the root's box -> every member
//   send_recv       group {source, destination}: one box from one device to another
#include <cstdint>
#include <string>
#include <vector>

#include <loom/core/linkage.hpp>
#include <loom/graph/graph.hpp>
#include <loom/partition/vtensor.hpp>

namespace loom::partition {

enum class transfer_kind : std::uint8_t { all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send_recv };

LOOM_INLINE std::string_view to_string(transfer_kind k);

struct transfer {
    transfer_kind kind = transfer_kind::send_recv;
    std::vector<int> group;  // global ranks, ascending (send_recv: {source, destination} in that order)
    tensor_id logical = no_id;
    value_kind values = value_kind::real;
    std::vector<box> inputs, outputs;
    std::vector<bool> has_input, has_output;
    int root = -1;  // broadcast: the global rank that holds the data
    bool backward = false;
    node_id consumer = no_id;  // the logical node whose input this feeds; no_id: gradient or loss
    // Pipelines: the block each member runs it in. By data flow (the earliest block on the
    // member that reads what it makes, else the latest whose output it reads), or with the
    // block of the producer's or the consumer's piece on that member: a collective between
    // two stages that share devices (the interlaced pipeline's ends run on every device)
    // stays within one of them, in that stage's block on every member, so that all its
    // members reach it in the same order. Or as soon as its input is made (as_made): in the
    // block of the piece that made it, right after that piece (ZeRO's reduction of each
    // micro-batch's gradient onto the shards, which must not wait for the step's end).
    enum class block_of : std::uint8_t { data_flow, producer, consumer, as_made };
    block_of runs_with = block_of::data_flow;

    std::size_t member(int rank) const {
        for (std::size_t m = 0; m < group.size(); ++m)
            if (group[m] == rank) return m;
        return group.size();
    }

    // Elements each member sends, by the usual ring (and tree) algorithms.
    std::int64_t elements_sent_by(std::size_t m) const {
        const auto n = static_cast<std::int64_t>(group.size());
        switch (kind) {
            case transfer_kind::all_reduce: return 2 * (n - 1) * outputs[m].numel() / n;
            case transfer_kind::all_gather: return (n - 1) * inputs[m].numel();
            case transfer_kind::reduce_scatter: return (n - 1) * inputs[m].numel() / n;
            case transfer_kind::all_to_all: return (n - 1) * inputs[m].numel() / n;
            case transfer_kind::broadcast: return group[m] == root ? outputs[m].numel() : 0;
            case transfer_kind::send_recv: return m == 0 ? inputs[0].numel() : 0;
        }
        return 0;
    }
    // Sequential communication steps (latency terms) of the same algorithms.
    std::int64_t steps() const {
        const auto n = static_cast<std::int64_t>(group.size());
        switch (kind) {
            case transfer_kind::all_reduce: return 2 * (n - 1);
            case transfer_kind::all_gather:
            case transfer_kind::reduce_scatter:
            case transfer_kind::all_to_all: return n - 1;
            case transfer_kind::broadcast: {
                std::int64_t s = 0;
                for (std::int64_t k = 1; k < n; k *= 2) ++s;
                return s;
            }
            case transfer_kind::send_recv: return 1;
        }
        return 1;
    }

    std::string describe() const {
        std::string s = std::string(to_string(kind)) + " t" + std::to_string(logical) + " on {";
        for (std::size_t m = 0; m < group.size(); ++m) s += (m ? "," : "") + std::to_string(group[m]);
        s += "}";
        if (kind == transfer_kind::broadcast) s += " from " + std::to_string(root);
        return s;
    }
};

// What a byte and a step cost, to choose between ways of moving the same data. Defaults
// are a generic interconnect (5 us per step, 10 GB/s); the searcher's cost model is richer.
struct transfer_cost_model {
    double seconds_per_step = 5e-6;
    double bytes_per_second = 10e9;

    double cost(std::int64_t bytes, std::int64_t steps) const {
        return static_cast<double>(steps) * seconds_per_step + static_cast<double>(bytes) / bytes_per_second;
    }
};

}  // namespace loom::partition

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::partition {

LOOM_INLINE std::string_view to_string(transfer_kind k) {
    switch (k) {
        case transfer_kind::all_reduce: return "all_reduce";
        case transfer_kind::all_gather: return "all_gather";
        case transfer_kind::reduce_scatter: return "reduce_scatter";
        case transfer_kind::all_to_all: return "all_to_all";
        case transfer_kind::broadcast: return "broadcast";
        case transfer_kind::send_recv: return "send_recv";
    }
    return "?";
}

}  // namespace loom::partition
#endif  // LOOM_HEADER_DEFINITIONS
