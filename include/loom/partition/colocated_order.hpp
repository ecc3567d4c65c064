#pragma once
// op-order of colocated pieces (Coshard): the pieces of one op that a plan puts on one
// device run one piece's chain at a time.
//
// Materialization emits a logical node's pieces together, so a device that holds pieces 0
// and 1 of every op of a layer would run q0 q1 k0 k1 ... attention0 attention1: both
// pieces' intermediates alive at once, which is what Coshard is there to avoid (nnScaler,
// Figure 5: a recomputed layer cut into pieces that run one after another holds one piece's
// activations at a time). This pass reorders each device's program so that, between two
// barriers, every node of piece 0 runs before any node of piece 1, and so on; data flow
// within the stretch decides the rest. Barriers keep what must not move:
//   * communication nodes (so every device group's collectives stay in one order);
//   * a change of pipeline block (stage, micro-batch, pass), so the schedule's blocks stay
//     as partition::detail::order_by_schedule made them.
// A device node belongs to piece j when it computes the j-th piece (in piece order) of a
// logical node that has several pieces on that device within one block. Other nodes
// between barriers (the assembles the plan inserted, ops cut otherwise) follow the pieces
// they read (a local sum of the pieces' partial outputs runs once they are all made), else
// run with the first piece that reads them (a weight's slice for one piece), else first.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <queue>
#include <tuple>
#include <utility>
#include <vector>

#include <loom/core/linkage.hpp>
#include <loom/partition/partitioned_graph.hpp>
#include <loom/partition/pipeline_order.hpp>
#include <loom/plan/op_partition.hpp>

namespace loom::partition::detail {

// Reorders pg.order (graph order where it is empty) as above; leaves it untouched, and
// returns false, when no device holds two pieces of one op in one block.
LOOM_INLINE bool order_colocated_pieces(partitioned_graph& pg, const plan::resolved_plan& pp);

}  // namespace loom::partition::detail

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::partition::detail {

LOOM_INLINE bool order_colocated_pieces(partitioned_graph& pg, const plan::resolved_plan& pp) {
    // A block as a comparable key: (pass, stage, micro, round), or all -1 outside blocks.
    using block_key = std::tuple<int, int, int, int>;
    auto key_of = [](const std::optional<schedule::block>& b) -> block_key {
        if (!b) return {-1, -1, -1, -1};
        return {static_cast<int>(b->pass), b->stage, b->micro, b->round};
    };
    std::vector<std::vector<int>> piece_of(static_cast<std::size_t>(pg.world));  // per device node: j, or -1
    std::vector<std::vector<block_key>> block_of(static_cast<std::size_t>(pg.world));
    bool any = false;
    for (int d = 0; d < pg.world; ++d) {
        const device_part& part = pg.devices[static_cast<std::size_t>(d)];
        const std::size_t count = part.ir().nodes.size();
        auto& piece = piece_of[static_cast<std::size_t>(d)];
        auto& block = block_of[static_cast<std::size_t>(d)];
        piece.assign(count, -1);
        block.assign(count, key_of(std::nullopt));
        // The device's pieces of each logical node within each block, in piece order.
        std::map<std::pair<node_id, block_key>, std::vector<std::size_t>> together;
        for (std::size_t i = 0; i < count; ++i) {
            const piece_source src = part.source_of(static_cast<node_id>(i));
            if (src.logical == no_id) continue;
            block[i] = key_of(pipeline_block(pg, pp, src.logical, src.piece));
            together[{src.logical, block[i]}].push_back(i);
        }
        for (auto& [at, nodes] : together) {
            if (nodes.size() < 2) continue;
            std::stable_sort(nodes.begin(), nodes.end(), [&](std::size_t a, std::size_t b) {
                return part.source_of(static_cast<node_id>(a)).piece < part.source_of(static_cast<node_id>(b)).piece;
            });
            for (std::size_t j = 0; j < nodes.size(); ++j) piece[nodes[j]] = static_cast<int>(j);
            any = true;
        }
    }
    if (!any) return false;

    if (pg.order.empty()) pg.order.resize(static_cast<std::size_t>(pg.world));
    for (int d = 0; d < pg.world; ++d) {
        const device_part& part = pg.devices[static_cast<std::size_t>(d)];
        const graph& dg = part.ir();
        const auto& piece = piece_of[static_cast<std::size_t>(d)];
        const auto& block = block_of[static_cast<std::size_t>(d)];
        std::vector<node_id>& order = pg.order[static_cast<std::size_t>(d)];
        if (order.empty())
            for (std::size_t i = 0; i < dg.nodes.size(); ++i) order.push_back(static_cast<node_id>(i));

        std::vector<node_id> out;
        out.reserve(order.size());
        std::vector<std::size_t> stretch;        // positions in `order` since the last barrier
        std::vector<int> in_stretch(dg.nodes.size(), -1);  // node -> its index in `stretch`
        std::vector<int> rank(dg.nodes.size(), -1);        // node -> its piece, or that of the pieces it follows
        // Piece-major within the stretch: ready nodes by (piece, position in the order).
        auto flush = [&] {
            const std::size_t n = stretch.size();
            std::vector<int> waiting(n, 0);
            std::vector<std::vector<std::size_t>> readers(n);
            for (std::size_t s = 0; s < n; ++s) {
                const node& nd = dg.nodes[static_cast<std::size_t>(order[stretch[s]])];
                for (tensor_id t : nd.inputs) {
                    const node_id p = dg.tensor(t).producer;
                    if (p == no_id || in_stretch[static_cast<std::size_t>(p)] < 0) continue;
                    ++waiting[s];
                    readers[static_cast<std::size_t>(in_stretch[static_cast<std::size_t>(p)])].push_back(s);
                }
            }
            // A node that reads none of the pieces (a weight's slice for one piece) runs
            // with the first piece that reads it, not ahead of every piece.
            for (std::size_t s = n; s-- > 0;) {
                const auto i = static_cast<std::size_t>(order[stretch[s]]);
                if (rank[i] >= 0) continue;  // a piece, or after one
                for (std::size_t r : readers[s]) {
                    const int reader = rank[static_cast<std::size_t>(order[stretch[r]])];
                    if (reader >= 0) rank[i] = rank[i] < 0 ? reader : std::min(rank[i], reader);
                }
            }
            using entry = std::pair<int, std::size_t>;  // (piece, s)
            std::priority_queue<entry, std::vector<entry>, std::greater<>> ready;
            for (std::size_t s = 0; s < n; ++s)
                if (waiting[s] == 0) ready.push({rank[static_cast<std::size_t>(order[stretch[s]])], s});
            while (!ready.empty()) {
                const std::size_t s = ready.top().second;
                ready.pop();
                out.push_back(order[stretch[s]]);
                for (std::size_t r : readers[s])
                    if (--waiting[r] == 0) ready.push({rank[static_cast<std::size_t>(order[stretch[r]])], r});
            }
            for (std::size_t s : stretch) in_stretch[static_cast<std::size_t>(order[s])] = -1;
            stretch.clear();
        };
        // The block of the stretch's pieces, once one has joined it (a flag beside it, not an
        // optional: GCC 12 takes the optional's tuple for maybe uninitialized and warns in
        // every program that includes this).
        block_key stretch_block{};
        bool stretch_has_block = false;
        for (std::size_t k = 0; k < order.size(); ++k) {
            const auto i = static_cast<std::size_t>(order[k]);
            const node& nd = dg.nodes[i];
            const bool inserted = part.source_of(order[k]).logical == no_id;
            const bool new_block = !inserted && stretch_has_block && block[i] != stretch_block;
            if (nd.op->communication || new_block) {
                flush();
                stretch_has_block = false;
                if (nd.op->communication) {
                    out.push_back(order[k]);
                    continue;
                }
            }
            if (!inserted) {
                stretch_block = block[i];
                stretch_has_block = true;
            }
            int r = piece[i];
            if (r < 0) {
                for (tensor_id t : nd.inputs) {
                    const node_id p = dg.tensor(t).producer;
                    if (p != no_id && in_stretch[static_cast<std::size_t>(p)] >= 0) r = std::max(r, rank[static_cast<std::size_t>(p)]);
                }
            }
            rank[i] = r;
            in_stretch[i] = static_cast<int>(stretch.size());
            stretch.push_back(k);
        }
        flush();
        order = std::move(out);
    }
    return true;
}

}  // namespace loom::partition::detail
#endif  // LOOM_HEADER_DEFINITIONS
