#pragma once
// Applying a plan: one logical training graph becomes one ordered program per device over
// vTensors, with the communication between them materialized and the plan's op-order applied.
//
//   1. The logical graph is built (partition/logical_graph.hpp): rewrites, then autograd.
//   2. Every node gets a partition: forward nodes from the plan, backward nodes mirror the
//      forward op they differentiate (the same splits, matched through the axes of the
//      tensors both touch; a split along a variable the backward op lacks or freezes
//      becomes replication, so piece i of the backward runs where piece i of the forward
//      ran).
//   3. Each piece's variables get index ranges; from them the box every input piece needs
//      and the vTensor every output piece produces (partial where a contracted dim is cut).
//   4. Parameters and inputs are stored per device as the smallest box holding what that
//      device's pieces read, so leaves never move.
//   5. Nodes are emitted in graph order; before a node, each input is materialized on the
//      devices of its pieces (partition/materialize.hpp): local chunk/concat/sum where the
//      device holds the data, else the cheapest collective or send/recv. Every device sees
//      the collectives in the same global order, so the programs cannot deadlock by
//      construction; partition/deadlock.hpp checks any reordering.
//      An op linear in its inputs (the add of two partial gradients) keeps the splits
//      along dims it lacks as summand axes when its inputs are partial sums: piece k adds
//      summand k of each, and the reduction waits for the parameter's gradient.
//   6. Parameter gradients are materialized on the boxes their parameters are stored in
//      (or on the optimizer's shards under ZeRO-2), and the loss on every device.
#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/fingerprint.hpp>
#include <loom/partition/colocated_order.hpp>
#include <loom/partition/deadlock.hpp>
#include <loom/partition/logical_graph.hpp>
#include <loom/partition/materialize.hpp>
#include <loom/partition/piece_layout.hpp>
#include <loom/partition/pipeline_order.hpp>
#include <loom/plan/op_partition.hpp>
#include <loom/plan/resolve.hpp>
#include <loom/plan/rules.hpp>

namespace loom::partition {

struct apply_options {
    transfer_cost_model cost{};
    // Set (not owned): apply_plan stops at its next op once this reads true, throwing
    // apply_cancelled. A search past its time budget sets it for the prices it will drop;
    // one instance of a 1024-GPU plan takes seconds to materialize, which the search would
    // otherwise wait out.
    const std::atomic<bool>* cancel = nullptr;
};

// Thrown by apply_plan whose apply_options::cancel was set: no programs, and nothing wrong
// with the plan.
struct apply_cancelled : error {
    apply_cancelled() : error("apply_plan cancelled: its caller stopped it (apply_options::cancel)") {}
};

// The ordered per-device programs of a plan resolved against `model` (plan::resolve).
LOOM_INLINE partitioned_graph apply_plan(const graph& model, const plan::resolved_plan& plan, const apply_options& options = {});

// The ordered per-device programs of any plan: plan::resolve, then the above.
//   auto pg = partition::apply_plan(model.ir(), plan::compose(...).choose("m", 4));
inline partitioned_graph apply_plan(const graph& model, const plan::plan_spec& plan, const apply_options& options = {}) {
    return apply_plan(model, plan::resolve(plan, model), options);
}

template <class Plan>
    requires requires(const Plan& p) {
        { p.spec() } -> std::convertible_to<plan::plan_spec>;
    }
partitioned_graph apply_plan(const graph& model, const Plan& plan, const apply_options& options = {}) {
    return apply_plan(model, plan.resolve(model), options);
}

}  // namespace loom::partition

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::partition::detail {

// The devices that read each region of a parameter, per copy of the readers' pieces: the
// pieces of one reader that read the same region and differ only in their cuts (the
// data-parallel replicas of a tensor-parallel piece) form one group; pieces that are copies
// of each other as far as the parameter goes, and the pieces of each other reader, form
// groups of their own. Copies are the partition's copy and summand axes and its cuts along
// a variable no output carries (a row-parallel linear's contracted dim, which its bias
// lacks: the pieces along it read and differentiate the same bias, like copies). Cuts along
// an output's variable (the batch) give the pieces partial sums of the parameter's gradient.
struct parameter_reader {
    const node* op;
    const plan::op_partition* partition;
};
using region_key = std::vector<std::pair<std::int64_t, std::int64_t>>;
using readers_by_region = std::map<region_key, std::map<std::vector<std::int64_t>, std::vector<int>>>;

LOOM_INLINE bool collect_readers(const graph& g, tensor_id read, const parameter_reader& reader, std::int64_t which,
                                 readers_by_region& out) {
    const node& op = *reader.op;
    const auto input = static_cast<std::size_t>(std::find(op.inputs.begin(), op.inputs.end(), read) - op.inputs.begin());
    if (input >= op.inputs.size()) return false;
    const node_layout layout = layout_pieces(g, op, *reader.partition);
    std::vector<bool> copies_parameter;
    for (const plan::split_axis& axis : layout.partition.splits) {
        bool in_output = false;
        if (axis.cuts())
            if (auto v = op.sig.find(axis.label))
                for (const auto& output : op.sig.output_axes)
                    for (const auto& members : output)
                        in_output = in_output || std::find(members.begin(), members.end(), *v) != members.end();
        copies_parameter.push_back(!in_output);
    }
    for (std::size_t i = 0; i < layout.pieces.size(); ++i) {
        const piece_geometry& piece = layout.pieces[i];
        region_key region;
        for (const auto& r : piece.inputs[input].ranges) region.emplace_back(r.begin, r.end);
        const std::vector<std::int64_t> c = layout.partition.coordinates(static_cast<std::int64_t>(i));
        std::vector<std::int64_t> copy_of{which, c.back()};
        for (std::size_t s = 0; s < layout.partition.splits.size(); ++s)
            if (copies_parameter[s]) copy_of.push_back(c[s]);
        auto& devices = out[region][copy_of];
        if (std::find(devices.begin(), devices.end(), piece.device) == devices.end()) devices.push_back(piece.device);
    }
    return true;
}

// ZeRO's shards of a parameter (ZeRO-3) or of its gradient (ZeRO-2, `rows_only`: the
// optimizer updates its shard in place in the stored piece, so shards are whole rows of it),
// laid out after the pieces of the parameter's `readers` (collect_readers): each group of
// devices holds one set of shards of its region. So a parameter that tensor parallelism cuts
// is sharded piece by piece over each piece's data-parallel group, as DeepSpeed shards
// Megatron's pieces, and gathering a piece is an all-gather within that group, its gradient
// a reduce-scatter within it; shards cut from the whole tensor over every device would leave
// each piece's rows on devices of other pieces, to be sent point to point. The shards split
// the region along the first dim whose extent the group divides (ZeRO-2: dim 0 only), else,
// or without `shard` (a ZeRO-2 gradient that several pipeline stages read), the region
// stays whole on each device of the group. Nothing when the groups do not form an even grid
// of regions on disjoint devices (colocated pieces, Coshard): the caller then shards the
// parameter along its first dim over all its readers.
LOOM_INLINE std::optional<plan::op_partition> shards_within_reader_pieces(const graph& g, const node& identity,
                                                                           tensor_id read,
                                                                           const std::vector<parameter_reader>& readers,
                                                                           bool rows_only, bool shard) {
    const shape& dims = g.tensor(read).dims;
    const std::size_t rank = dims.rank();
    if (rank == 0) return std::nullopt;
    readers_by_region readers_of;
    for (std::size_t which = 0; which < readers.size(); ++which)
        if (!collect_readers(g, read, readers[which], static_cast<std::int64_t>(which), readers_of)) return std::nullopt;
    // An even grid of regions: along each dim, their ranges are the pieces of one split.
    std::vector<std::int64_t> degree(rank, 1);
    std::int64_t cells = 1;
    for (std::size_t a = 0; a < rank; ++a) {
        std::set<std::pair<std::int64_t, std::int64_t>> ranges;
        for (const auto& entry : readers_of) ranges.insert(entry.first[a]);
        degree[a] = static_cast<std::int64_t>(ranges.size());
        std::int64_t k = 0;
        for (const auto& r : ranges) {
            if (r.first != plan::piece_begin(dims.extent(a), degree[a], k) ||
                r.second != plan::piece_begin(dims.extent(a), degree[a], k + 1))
                return std::nullopt;
            ++k;
        }
        cells *= degree[a];
    }
    if (cells != static_cast<std::int64_t>(readers_of.size())) return std::nullopt;
    // Every region read by the same number of copies, each copy by a group of the same size,
    // and no device in two groups.
    const std::size_t copies = readers_of.begin()->second.size();
    const std::size_t group = readers_of.begin()->second.begin()->second.size();
    std::set<int> seen;
    for (auto& [region, by_copy] : readers_of) {
        if (by_copy.size() != copies) return std::nullopt;
        for (auto& [c, devices] : by_copy) {
            if (devices.size() != group) return std::nullopt;
            std::sort(devices.begin(), devices.end());
            for (int d : devices)
                if (!seen.insert(d).second) return std::nullopt;
        }
    }
    // The identity's variable on each dim of the parameter.
    auto label_of = [&](std::size_t a) -> std::optional<std::string> {
        if (identity.sig.input_axes.empty() || identity.sig.input_axes[0].size() != rank ||
            identity.sig.input_axes[0][a].size() != 1)
            return std::nullopt;
        return identity.sig.vars[static_cast<std::size_t>(identity.sig.input_axes[0][a][0])].label;
    };
    plan::op_partition p;
    for (std::size_t a = 0; a < rank; ++a) {
        if (degree[a] == 1) continue;
        auto label = label_of(a);
        if (!label) return std::nullopt;
        p.splits.push_back({dims.dim(a), *label, degree[a]});
    }
    std::optional<std::size_t> shard_dim;
    for (std::size_t a = 0; a < (rows_only ? 1 : rank) && !shard_dim && shard && group > 1; ++a) {
        const std::int64_t extent = dims.extent(a);
        if (extent % degree[a] == 0 && (extent / degree[a]) % static_cast<std::int64_t>(group) == 0 && label_of(a))
            shard_dim = a;
    }
    std::int64_t shards = 1;
    if (shard_dim) {
        shards = static_cast<std::int64_t>(group);
        p.splits.push_back({dims.dim(*shard_dim), *label_of(*shard_dim), shards});
    }
    // Unsharded regions stay whole on every device of their groups.
    p.replicas = static_cast<std::int64_t>(copies) * (static_cast<std::int64_t>(group) / shards);
    // Pieces row-major over (the regions' grid, shard, copy): std::map orders the regions by
    // their ranges, dim 0 first, which is that grid's order.
    for (const auto& [region, by_copy] : readers_of)
        for (std::int64_t s = 0; s < shards; ++s)
            for (std::int64_t r = 0; r < p.replicas / static_cast<std::int64_t>(copies); ++r)
                for (const auto& [c, devices] : by_copy)
                    p.devices.push_back(devices[static_cast<std::size_t>(s + r)]);
    return p;
}

}  // namespace loom::partition::detail

namespace loom::partition {

LOOM_INLINE partitioned_graph apply_plan(const graph& model, const plan::resolved_plan& plan, const apply_options& options) {
    if (plan.devices < 1) throw plan_error("plan: the device count is " + std::to_string(plan.devices) + "; it must be at least 1");
    const std::size_t forward = model.forward_node_count();
    if (plan.forward.size() > forward)
        throw plan_error("plan: it covers " + std::to_string(plan.forward.size()) + " forward nodes but the graph has " +
                         std::to_string(forward) + "; resolve the plan against this graph");

    logical_graph_options lo;
    lo.zero3_identities = plan.zero == plan::zero_stage::parameters;
    lo.zero2_identities = plan.zero == plan::zero_stage::gradients;
    lo.recompute.assign(forward, false);
    lo.decompose.resize(forward);
    lo.stage_of_forward = plan.stage_of;
    std::vector<std::string> notes;
    for (std::size_t i = 0; i < forward; ++i) {
        const auto* p = plan.at(static_cast<node_id>(i));
        if (!p) continue;
        lo.recompute[i] = p->recompute;
        // A cut that a registered transformation makes by rebuilding the op (cross_entropy
        // along its vocabulary): checked against the op as written, then rebuilt.
        const node& n = model.nodes[i];
        plan::op_partition bound = bind_partition(n, *p, plan.devices, true, notes);
        if (decomposition_for(n, bound)) lo.decompose[i] = std::move(bound);
    }

    partitioned_graph out;
    out.world = plan.devices;
    out.zero = plan.zero;
    out.plan_name = plan.name;
    out.logical = std::make_unique<logical_graph>(build_logical_graph(model, lo));
    out.notes = std::move(notes);
    const graph& g = out.logical->g;

    // 2. Partitions of every node.
    plan::op_partition everywhere;
    everywhere.replicas = plan.devices;
    std::vector<plan::op_partition> parts(g.nodes.size());
    std::vector<bool> assigned(g.nodes.size(), false);
    for (const auto& [n, p] : out.logical->decomposed) {
        parts[static_cast<std::size_t>(n)] = bind_partition(g.at(n), p, plan.devices, true, out.notes);
        assigned[static_cast<std::size_t>(n)] = true;
    }
    for (std::size_t i = 0; i < forward; ++i) {
        node_id n = out.logical->forward_node[i];
        if (assigned[static_cast<std::size_t>(n)]) continue;
        const plan::op_partition* p = plan.at(static_cast<node_id>(i));
        parts[static_cast<std::size_t>(n)] = bind_partition(g.at(n), p ? *p : everywhere, plan.devices, true, out.notes);
        assigned[static_cast<std::size_t>(n)] = true;
    }
    // Pipelines: the stage of a node of g, from its forward op (-1: none, or no pipeline).
    const bool staged = !plan.stage_of.empty();
    auto stage_of_node = [&](node_id i) {
        const node& n = g.at(i);
        const node_id forward = n.forward_of != no_id ? n.forward_of : i;
        const node_id source = out.logical->source_of[static_cast<std::size_t>(forward)];
        if (source == no_id || static_cast<std::size_t>(source) >= plan.stage_of.size()) return -1;
        return plan.stage_of[static_cast<std::size_t>(source)];
    };
    // ZeRO identities. ZeRO-3 shards each parameter, ZeRO-2 its gradient, after the first
    // reader's pieces: each region they read over the devices that read it
    // (detail::shards_within_reader_pieces; under tensor parallelism, each piece over its
    // data-parallel group). A parameter several pipeline stages read (the tied embedding) is
    // sharded under ZeRO-3 over the first reader's stage, the others receiving it point to
    // point; ZeRO-2 keeps its gradient whole on all of them, where each copy's optimizer
    // needs all of it. Where the readers' pieces do not allow it (colocated pieces), the
    // first dim is split over the data-parallel devices: without a pipeline all devices, in a
    // pipeline the group of the stage that reads it. The stage of each identity, for the
    // materializer.
    std::map<node_id, int> identity_stage;
    std::map<tensor_id, std::vector<node_id>> forward_readers;  // of parameters and ZeRO-3 copies, in graph order
    if (plan.zero != plan::zero_stage::none) {
        std::set<tensor_id> wanted;
        for (auto [param, n] : out.logical->zero3_identity) wanted.insert(g.at(n).outputs[0]);
        for (auto [param, n] : out.logical->zero2_identity) wanted.insert(param);
        for (std::size_t r = 0; r < g.nodes.size(); ++r) {
            const node& reader = g.nodes[r];
            if (reader.backward || reader.forward_of != no_id) continue;
            for (tensor_id t : reader.inputs)
                if (wanted.count(t)) {
                    auto& list = forward_readers[t];
                    if (list.empty() || list.back() != static_cast<node_id>(r)) list.push_back(static_cast<node_id>(r));
                }
        }
    }
    auto shard = [&](tensor_id param, node_id n, bool parameters) {
        const node& nd = g.at(n);
        const tensor_desc& t = g.tensor(nd.inputs[0]);
        std::vector<int> group;
        bool across_stages = false;
        if (staged) {
            // The readers of the parameter (through the identity under ZeRO-3), in graph order.
            const tensor_id read = parameters ? nd.outputs[0] : param;
            int first_stage = -1;
            std::vector<int> all;
            for (node_id r : forward_readers[read]) {
                const int st = stage_of_node(r);
                const plan::op_partition& rp = parts[static_cast<std::size_t>(r)];
                std::vector<int> devices;
                for (std::int64_t q = 0; q < rp.pieces(); ++q) devices.push_back(rp.device_of(q));
                if (group.empty()) {
                    first_stage = st;
                    group = devices;
                }
                across_stages = across_stages || st != first_stage;
                all.insert(all.end(), devices.begin(), devices.end());
            }
            if (across_stages && !parameters) group = all;
            std::sort(group.begin(), group.end());
            group.erase(std::unique(group.begin(), group.end()), group.end());
            // A ZeRO-2 identity kept whole on several stages belongs to none of them.
            identity_stage[n] = across_stages && !parameters ? -1 : first_stage;
        }
        const int shards = group.empty() ? plan.devices : static_cast<int>(group.size());
        plan::op_partition p;
        const tensor_id read = parameters ? nd.outputs[0] : param;
        std::vector<detail::parameter_reader> readers;
        for (node_id r : forward_readers[read]) {
            readers.push_back({&g.at(r), &parts[static_cast<std::size_t>(r)]});
            if (parameters || !across_stages) break;  // the first reader's pieces
        }
        std::optional<plan::op_partition> aligned;
        if (!readers.empty())
            aligned = detail::shards_within_reader_pieces(g, nd, read, readers, !parameters, parameters || !across_stages);
        if (aligned) {
            p = std::move(*aligned);
        } else if (staged && across_stages && !parameters) {
            p.replicas = shards;
            p.devices = group;
            out.notes.push_back("ZeRO-2: the gradient of '" + t.name + "' is read by several pipeline stages; each keeps all of it");
        } else if (t.dims.rank() == 0 || t.dims.extent(0) % shards != 0) {
            p.replicas = shards;
            p.devices = group;
            out.notes.push_back("ZeRO: '" + t.name + "' (" + t.dims.to_string() + ") is not divisible into " +
                                std::to_string(shards) + " shards along its first dim; it stays replicated");
        } else {
            p.splits.push_back({t.dims.dim(0), "...0", shards});
            p.devices = group;
        }
        parts[static_cast<std::size_t>(n)] = bind_partition(nd, p, plan.devices, true, out.notes);
        assigned[static_cast<std::size_t>(n)] = true;
    };
    for (auto [param, n] : out.logical->zero3_identity) shard(param, n, true);
    for (auto [param, n] : out.logical->zero2_identity) shard(param, n, false);
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
        if (assigned[i]) continue;
        const node& n = g.nodes[i];
        // Mirror the forward op (backward nodes), or the producer of the first input (the
        // seed of the backward pass, zero gradients of unused parameters).
        node_id like = n.forward_of;
        if (like == no_id && !n.inputs.empty()) like = g.tensor(n.inputs[0]).producer;
        const plan::op_partition& source = like != no_id ? parts[static_cast<std::size_t>(like)] : everywhere;
        mirrored_partition mirrored = mirror_partition(g, source, like == no_id ? nullptr : &g.at(like), n);
        if (n.op->linear) {
            // Summands of partial sums add summand by summand (the tied embedding's gradient).
            std::vector<std::int64_t> summands;
            for (tensor_id in : n.inputs) {
                const node_id producer = g.tensor(in).producer;
                if (producer == no_id || !assigned[static_cast<std::size_t>(producer)]) {
                    summands.clear();
                    break;
                }
                const node& pn = g.at(producer);
                const auto o = static_cast<std::size_t>(std::find(pn.outputs.begin(), pn.outputs.end(), in) - pn.outputs.begin());
                summands.push_back(summands_of(pn, parts[static_cast<std::size_t>(producer)], o));
            }
            sum_partial_inputs(n, mirrored, summands);
        }
        parts[i] = bind_partition(n, std::move(mirrored.partition), plan.devices, false, out.notes, mirrored.absent);
        assigned[i] = true;
    }

    // 3. Pieces.
    out.layouts.resize(g.nodes.size());
    for (std::size_t i = 0; i < g.nodes.size(); ++i)
        out.layouts[i] = layout_pieces(g, g.nodes[i], std::move(parts[i]));

    // 4-6. Devices, leaves, materialization.
    materializer m(out, options.cost);
    // Pipelines: no collective spans two stages (materializer::set_stages).
    if (staged) {
        std::vector<int> stage(g.nodes.size(), -1);
        for (std::size_t i = 0; i < g.nodes.size(); ++i) {
            const node& n = g.nodes[i];
            const node_id forward = n.forward_of != no_id ? n.forward_of : static_cast<node_id>(i);
            auto it = identity_stage.find(forward);
            stage[i] = it != identity_stage.end() ? it->second : stage_of_node(static_cast<node_id>(i));
        }
        m.set_stages(std::move(stage));
    }
    m.store_leaves();
    const auto stop_if_cancelled = [&options] {
        if (options.cancel && options.cancel->load(std::memory_order_relaxed)) throw apply_cancelled();
    };
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
        stop_if_cancelled();
        m.emit_node(static_cast<node_id>(i));
    }
    stop_if_cancelled();
    m.finish();
    stop_if_cancelled();
    // 7. op-order: the plan's schedule orders every device's program (checked: data flow,
    //    deadlock); without one, devices run in plan order.
    if (plan.order) detail::order_by_schedule(out, plan, *plan.order);  // checks the order too
    //    Colocated pieces (Coshard) run one piece's chain at a time.
    if (detail::order_colocated_pieces(out, plan)) check_deadlock_free(out);
    out.checked_order = order_fingerprint(out);
    out.model_fingerprint = model_fingerprint(model);
    return out;
}

}  // namespace loom::partition
#endif  // LOOM_HEADER_DEFINITIONS
