#pragma once
// The result of applying a plan: the logical training graph with the layout of every node,
// one graph per device (pieces, local assemble ops and transfer nodes), and the transfers.
// Executors and trainers read it; explanations and the searcher's validation print it.
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

struct device_part {
    std::unique_ptr<graph_builder> builder = std::make_unique<graph_builder>();
    std::vector<stored_piece> parameters;  // the boxes of each parameter this device stores
    std::vector<stored_piece> inputs;      // the boxes of each input it is fed
    std::vector<stored_piece> gradients;   // per parameter piece: its gradient (same order)
    tensor_id loss = no_id;                // the full loss, on every device

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

    const graph& ir() const { return logical->g; }
};

}  // namespace loom::partition
