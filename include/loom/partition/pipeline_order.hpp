#pragma once
// op-order for pipelines: the plan's schedule (plan::resolved_plan::order) orders the
// (stage, micro-batch, pass) blocks of every device; partition::apply_plan calls this to
// turn it into the order each device runs its program in.
//
// Every piece a plan put on a device belongs to one block: its op's stage and round
// (plan/pipeline.hpp), its micro-batch (the piece's coordinate along the outermost,
// micro-batch split) and its pass (a backward op runs in the backward block of the op it
// differentiates). The transfers and assembles the plan inserted between pieces have no
// op of their own; each joins the earliest block on its device that reads what it makes (a
// receive runs where its data is needed, a ZeRO gather before its first reader), else the
// latest block whose output it reads (a send runs right after its data is made, gradient
// sums after the last micro-batch), else the end of the step (the loss gathered to every
// device). A transfer pinned to its producer's or consumer's block (transfer::runs_with: a
// collective among one stage's devices for a tensor passed between stages) joins that op's
// piece's block on each member instead. One that runs as soon as its inputs are made
// (transfer::block_of::as_made: ZeRO's reduction of each micro-batch's gradient, and the
// adds of the shards it leaves) joins the latest block of its inputs' makers, right after
// the last of them. Within a block, nodes keep their plan order otherwise, so the
// collectives of a device group stay in one order on all its members.
//
// The result is checked: every node runs after the producers of its inputs (else the
// schedule contradicts the program's data flow, and the error names both blocks), and the
// programs together cannot deadlock (partition/deadlock.hpp).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/partition/deadlock.hpp>
#include <loom/partition/partitioned_graph.hpp>
#include <loom/plan/op_partition.hpp>
#include <loom/schedule/schedule.hpp>
#include <loom/schedule/validate.hpp>

namespace loom::partition::detail {

// The block of a piece of logical node `n`, or none for nodes no forward op accounts for.
LOOM_INLINE std::optional<schedule::block> pipeline_block(const partitioned_graph& pg, const plan::resolved_plan& pp,
                                                          node_id n, std::int32_t piece);

// Orders every device's program by the schedule (pg.order). The schedule must be for the
// plan's stages, micro-batches and rounds, on the plan's devices.
LOOM_INLINE void order_by_schedule(partitioned_graph& pg, const plan::resolved_plan& pp, const schedule::schedule& s);

}  // namespace loom::partition::detail

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::partition::detail {

LOOM_INLINE std::optional<schedule::block> pipeline_block(const partitioned_graph& pg, const plan::resolved_plan& pp,
                                                          node_id n, std::int32_t piece) {
    const logical_graph& lg = *pg.logical;
    const node& nd = lg.g.at(n);
    const bool backward = nd.backward || nd.forward_of != no_id;
    const node_id forward = nd.forward_of != no_id ? nd.forward_of : n;
    const node_id source = lg.source_of.at(static_cast<std::size_t>(forward));
    if (source == no_id || static_cast<std::size_t>(source) >= pp.stage_of.size()) return std::nullopt;
    const auto src = static_cast<std::size_t>(source);
    schedule::block b;
    b.pass = backward ? schedule::pass_kind::backward : schedule::pass_kind::forward;
    b.stage = pp.stage_of[src];
    b.round = backward ? 0 : pp.round_of[src];
    if (pp.micro_split[src]) {
        // The micro-batch is the outermost coordinate, unless the op lacks the batch (a
        // weight's gradient sum): then its copies per micro-batch were merged into one
        // piece, which runs where its data flow puts it.
        const auto& mine = pg.layouts.at(static_cast<std::size_t>(n)).partition;
        const auto& of_forward = pg.layouts.at(static_cast<std::size_t>(forward)).partition;
        if (mine.pieces() != of_forward.pieces()) return std::nullopt;
        b.micro = static_cast<int>(mine.coordinates(piece).at(0));
    }
    return b;
}

LOOM_INLINE void order_by_schedule(partitioned_graph& pg, const plan::resolved_plan& pp, const schedule::schedule& s) {
    const std::string what = "pipeline order (" + (s.name.empty() ? std::string("schedule") : s.name) + ")";
    if (s.shape.stages != pp.stages || s.shape.micro_batches != pp.micro_batches || s.shape.rounds != pp.rounds)
        throw schedule::schedule_error(what + ": the schedule has " + std::to_string(s.shape.stages) + " stages, " +
                                       std::to_string(s.shape.micro_batches) + " micro-batches and " +
                                       std::to_string(s.shape.rounds) + " rounds, the plan " + std::to_string(pp.stages) +
                                       ", " + std::to_string(pp.micro_batches) + " and " + std::to_string(pp.rounds) +
                                       "; build both for the same pipeline");
    if (static_cast<int>(s.device_order.size()) != pg.world)
        throw schedule::schedule_error(what + ": the schedule orders " + std::to_string(s.device_order.size()) +
                                       " devices but the plan has " + std::to_string(pg.world) +
                                       "; give the schedule's stages the plan's device groups");
    schedule::validate(s);

    constexpr long unset = std::numeric_limits<long>::min();
    pg.order.assign(static_cast<std::size_t>(pg.world), {});
    for (int d = 0; d < pg.world; ++d) {
        const device_part& part = pg.devices[static_cast<std::size_t>(d)];
        const graph& dg = part.ir();
        const std::size_t count = dg.nodes.size();
        std::map<schedule::block, long> position;
        const auto& blocks = s.device_order[static_cast<std::size_t>(d)];
        for (std::size_t k = 0; k < blocks.size(); ++k) position[blocks[k]] = static_cast<long>(k);
        const long end = static_cast<long>(blocks.size());

        std::vector<long> pos(count, unset);
        std::vector<std::optional<schedule::block>> tag(count);
        // A transfer that runs with its producer's or consumer's block: that op's piece on
        // this device whose output (producer) or input (consumer) overlaps the box this
        // member moves, which tells the micro-batches apart (partition/transfer.hpp,
        // transfer::runs_with).
        auto piece_here = [&](const transfer& tr) -> std::optional<schedule::block> {
            const bool with_consumer = tr.runs_with == transfer::block_of::consumer;
            const node_id logical = with_consumer ? tr.consumer : pg.logical->g.tensor(tr.logical).producer;
            if (logical == no_id) return std::nullopt;
            const std::size_t m = tr.member(d);
            if (m >= tr.group.size()) return std::nullopt;
            const box& moved = tr.has_input[m] ? tr.inputs[m] : tr.outputs[m];
            const auto& pieces = pg.layouts.at(static_cast<std::size_t>(logical)).pieces;
            const node& op = pg.logical->g.at(logical);
            for (std::size_t k = 0; k < pieces.size(); ++k) {
                if (pieces[k].device != d) continue;
                bool overlaps = false;
                if (with_consumer) {
                    for (std::size_t j = 0; j < op.inputs.size() && j < pieces[k].inputs.size(); ++j)
                        overlaps = overlaps || (op.inputs[j] == tr.logical && !intersect(pieces[k].inputs[j], moved).empty());
                } else {
                    for (std::size_t o = 0; o < op.outputs.size() && o < pieces[k].outputs.size(); ++o)
                        overlaps = overlaps || (op.outputs[o] == tr.logical && !intersect(pieces[k].outputs[o].region, moved).empty());
                }
                if (overlaps) return pipeline_block(pg, pp, logical, static_cast<std::int32_t>(k));
            }
            return std::nullopt;
        };
        // Within a block, nodes keep their plan order, except those that run as soon as their
        // inputs are made (transfer::block_of::as_made): they follow the last of their inputs'
        // makers, in their block.
        std::vector<std::size_t> after(count);
        for (std::size_t i = 0; i < count; ++i) after[i] = i;
        auto as_made = [&](std::size_t i) {
            const node& n = dg.nodes[i];
            if (n.attrs.has("as_made")) return true;
            return n.attrs.has("transfer") &&
                   pg.transfers.at(static_cast<std::size_t>(n.attrs.get<std::int64_t>("transfer"))).runs_with ==
                       transfer::block_of::as_made;
        };
        for (std::size_t i = 0; i < count; ++i) {
            const piece_source src = part.source_of(static_cast<node_id>(i));
            if (src.logical == no_id && as_made(i)) {
                long latest = unset;
                std::size_t last = 0;
                bool known = !dg.nodes[i].inputs.empty();
                for (tensor_id t : dg.nodes[i].inputs) {
                    const node_id p = dg.tensor(t).producer;
                    if (p == no_id || pos[static_cast<std::size_t>(p)] == unset) {
                        known = false;
                        break;
                    }
                    latest = std::max(latest, pos[static_cast<std::size_t>(p)]);
                    last = std::max(last, after[static_cast<std::size_t>(p)]);
                }
                if (known) {
                    pos[i] = latest;
                    after[i] = last;
                }
                continue;
            }
            if (src.logical == no_id) {
                if (!dg.nodes[i].attrs.has("transfer")) continue;
                const transfer& tr = pg.transfers.at(static_cast<std::size_t>(dg.nodes[i].attrs.get<std::int64_t>("transfer")));
                if (tr.runs_with == transfer::block_of::data_flow || !(tag[i] = piece_here(tr))) continue;
            } else {
                tag[i] = pipeline_block(pg, pp, src.logical, src.piece);
            }
            if (!tag[i]) continue;
            auto it = position.find(*tag[i]);
            if (it == position.end())
                throw schedule::schedule_error(
                    what + ": the plan puts '" + dg.nodes[i].name + "' (block " + schedule::to_string(*tag[i], pp.rounds) +
                    ") on device " + std::to_string(d) + ", but the schedule does not run that block there; place the stage on the "
                    "devices the schedule gives it");
            pos[i] = it->second;
        }
        // Inserted nodes: the earliest block that reads them, ...
        std::vector<std::vector<std::size_t>> consumers(count);
        for (std::size_t i = 0; i < count; ++i)
            for (tensor_id t : dg.nodes[i].inputs)
                if (node_id p = dg.tensor(t).producer; p != no_id) consumers[static_cast<std::size_t>(p)].push_back(i);
        std::vector<long> by_consumer(pos);
        for (std::size_t i = count; i-- > 0;) {
            if (by_consumer[i] != unset) continue;
            for (std::size_t c : consumers[i])
                if (by_consumer[c] != unset) by_consumer[i] = by_consumer[i] == unset ? by_consumer[c] : std::min(by_consumer[i], by_consumer[c]);
        }
        // ... else the latest block they read from, else the end of the step.
        std::vector<long> placed(count, unset);
        for (std::size_t i = 0; i < count; ++i) {
            if (by_consumer[i] != unset) {
                placed[i] = by_consumer[i];
                continue;
            }
            for (tensor_id t : dg.nodes[i].inputs)
                if (node_id p = dg.tensor(t).producer; p != no_id)
                    placed[i] = std::max(placed[i], placed[static_cast<std::size_t>(p)]);
            if (placed[i] == unset) placed[i] = end;
        }
        // Data flow within the device must agree with the block order.
        auto block_text = [&](std::size_t i) {
            if (tag[i]) return schedule::to_string(*tag[i], pp.rounds);
            return placed[i] == end ? std::string("the end of the step")
                                   : "block " + schedule::to_string(blocks[static_cast<std::size_t>(placed[i])], pp.rounds);
        };
        for (std::size_t i = 0; i < count; ++i)
            for (tensor_id t : dg.nodes[i].inputs) {
                const node_id p = dg.tensor(t).producer;
                if (p == no_id || placed[static_cast<std::size_t>(p)] <= placed[i]) continue;
                throw schedule::schedule_error(what + ": on device " + std::to_string(d) + ", '" + dg.nodes[i].name + "' in " +
                                               block_text(i) + " reads '" + dg.tensor(t).name + "', made by '" +
                                               dg.nodes[static_cast<std::size_t>(p)].name + "' in " +
                                               block_text(static_cast<std::size_t>(p)) +
                                               ", which the schedule runs later; order the blocks so that data flows forward");
            }
        std::vector<node_id> order(count);
        for (std::size_t i = 0; i < count; ++i) order[i] = static_cast<node_id>(i);
        std::stable_sort(order.begin(), order.end(), [&](node_id a, node_id b) {
            const auto x = static_cast<std::size_t>(a), y = static_cast<std::size_t>(b);
            return placed[x] != placed[y] ? placed[x] < placed[y] : after[x] < after[y];
        });
        pg.order[static_cast<std::size_t>(d)] = std::move(order);
    }
    check_deadlock_free(pg);
}

}  // namespace loom::partition::detail
#endif  // LOOM_HEADER_DEFINITIONS
