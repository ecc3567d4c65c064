#pragma once
// The result of applying a plan: the logical training graph with the layout of every node,
// one graph per device (pieces, local assemble ops and transfer nodes), and the transfers.
// Executors and trainers read it; explanations and the searcher's validation print it.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <loom/graph/builder.hpp>
#include <loom/partition/logical_graph.hpp>
#include <loom/partition/piece_layout.hpp>
#include <loom/partition/transfer.hpp>
#include <loom/plan/op_partition.hpp>

namespace loom::partition {

// A piece of a logical tensor that lives in a device graph for the whole step.
struct stored_piece {
    tensor_id logical = no_id;  // in the logical graph
    tensor_id local = no_id;    // in the device graph
    box region;
};

// Which piece of which logical node a device node computes (no_id for the transfers and
// assembles that plans insert).
struct piece_source {
    node_id logical = no_id;
    std::int32_t piece = -1;
};

struct device_part {
    std::unique_ptr<graph_builder> builder = std::make_unique<graph_builder>();
    std::vector<stored_piece> parameters;  // the boxes of each parameter this device stores
    std::vector<stored_piece> inputs;      // the boxes of each input it is fed
    std::vector<stored_piece> gradients;   // per parameter piece: its gradient (same order)
    tensor_id loss = no_id;                // the full loss, on every device
    std::vector<piece_source> sources;     // per node of the device graph (shorter: the rest inserted)

    piece_source source_of(node_id n) const {
        auto i = static_cast<std::size_t>(n);
        return i < sources.size() ? sources[i] : piece_source{};
    }

    const graph& ir() const { return builder->view(); }
};

struct partitioned_graph {
    int world = 1;
    plan::zero_stage zero = plan::zero_stage::none;
    std::string plan_name;
    std::unique_ptr<logical_graph> logical;
    std::vector<node_layout> layouts;  // per node of the logical graph
    std::vector<device_part> devices;
    std::vector<transfer> transfers;
    std::vector<std::string> notes;    // where a mirrored split fell back to replication, ...
    // op-order: the node ids of each device's graph in the order it runs them (empty: graph
    // order, which apply_plan makes deadlock-free by construction). Pipeline schedules set it.
    std::vector<std::vector<node_id>> order;
    // The fingerprint of `order` when it was last checked (partition::check_programs); the
    // trainers check again before the first step when the order was edited since.
    std::uint64_t checked_order = 0;
    std::string model_fingerprint;  // of the model the plan was applied to (graph/fingerprint.hpp)

    const graph& ir() const { return logical->g; }
};

}  // namespace loom::partition
