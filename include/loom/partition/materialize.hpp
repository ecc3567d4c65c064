#pragma once
// Communication materialization: given the pieces of a logical tensor that devices hold
// and the boxes that consumer pieces need (full values), emit the cheapest correct way to
// get every needed box onto its device.
//
// Tried in order, each on the requests still open:
//   local      the device already holds a full-valued piece containing the box: use it,
//              or cut it out (assemble as chunk);
//   partial    the producer left partial sums of one box S on devices P, one chunk each,
//              and every device of P needs part of S: all_reduce (each needs S),
//              reduce_scatter (their boxes tile S), or all_reduce followed by local chunks,
//              whichever the cost model rates cheapest;
//   tiles      devices D need box R and hold full tiles of R along one axis: all_gather
//              (several, when D holds several copies of one tiling);
//              devices hold tiles of S along one axis and need tiles along another:
//              all_to_all;
//   broadcast  several devices need box R that one device holds;
//   generic    send each needed part of every intersecting piece to the device
//              (send_recv), then concat and sum there (assemble). Always correct: the
//              pieces one node produced cover every element once per value chunk.
// A request served by a collective often leaves other requests local (a chunk of what
// just arrived), so the steps repeat until nothing changes.
#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/builder.hpp>
#include <loom/ops/assemble.hpp>
#include <loom/partition/partitioned_graph.hpp>
#include <loom/partition/region_copy.hpp>

namespace loom::partition {

namespace detail {

// If `parts` tile `whole` along one axis in equal slices (disjoint, covering, every other
// axis whole), that axis.
LOOM_INLINE std::optional<std::size_t> tiling_axis(const std::vector<box>& parts, const box& whole);

LOOM_INLINE box bounding(const std::vector<box>& parts);

}  // namespace detail

class materializer {
public:
    materializer(partitioned_graph& out, transfer_cost_model cost) : out_(out), g_(out.logical->g), cost_(cost) {
        out_.devices.resize(static_cast<std::size_t>(out_.world));
        held_.resize(g_.tensors.size());
        sums_after_every_micro_batch_.assign(g_.nodes.size(), false);
        std::vector<bool> zero3(g_.nodes.size(), false);
        for (auto [param, identity] : out_.logical->zero3_identity) zero3[static_cast<std::size_t>(identity)] = true;
        // A ZeRO-3 identity's pieces are the stored shards themselves (emit_node), unless a
        // device that reads it holds no shard of it (the tied table a later stage reads) or
        // reads several parts of it (Coshard's colocated pieces). Those are served by sends
        // point to point, which have no reader on the sending device and run in the block of
        // what they send: it must be the identity's piece, made in its block, not a leaf.
        shard_serves_as_piece_ = zero3;
        for (std::size_t i = 0; i < g_.nodes.size(); ++i)
            for (std::size_t k = 0; k < g_.nodes[i].inputs.size(); ++k) {
                const node_id identity = g_.tensor(g_.nodes[i].inputs[k]).producer;
                if (identity == no_id || !zero3[static_cast<std::size_t>(identity)]) continue;
                const auto& shards = out_.layouts[static_cast<std::size_t>(identity)].pieces;
                std::map<int, box> read_on;  // device -> the part its pieces read
                for (const auto& piece : out_.layouts[i].pieces) {
                    const box& read = read_on.try_emplace(piece.device, piece.inputs[k]).first->second;
                    const bool holds = std::any_of(shards.begin(), shards.end(),
                                                   [&](const piece_geometry& s) { return s.device == piece.device; });
                    if (!holds || !(read == piece.inputs[k]))
                        shard_serves_as_piece_[static_cast<std::size_t>(identity)] = false;
                }
            }
        for (auto [param, identity] : out_.logical->zero2_identity)
            sums_after_every_micro_batch_[static_cast<std::size_t>(identity)] = true;
        for (std::size_t i = 0; i < g_.nodes.size(); ++i)
            if (g_.nodes[i].forward_of != no_id && zero3[static_cast<std::size_t>(g_.nodes[i].forward_of)])
                sums_after_every_micro_batch_[i] = true;
        gathered_per_use_.assign(g_.tensors.size(), false);
        for (auto [param, identity] : out_.logical->zero3_identity)
            gathered_per_use_[static_cast<std::size_t>(g_.at(identity).outputs[0])] = true;
    }

    // Pipelines: the stage of every logical node (-1: none). No collective spans two
    // stages: stages run their blocks in different orders, so its members could reach it
    // in different orders, while buffered sends cannot wait on each other. A tensor passed
    // between stages moves point to point, or by collectives among one stage's devices
    // pinned to that stage's block (between_stages).
    void set_stages(std::vector<int> stage_of_node) { stage_of_node_ = std::move(stage_of_node); }

    // Parameters and inputs: each device stores the bounding box of what its pieces read.
    void store_leaves() {
        std::vector<std::vector<std::optional<box>>> need(g_.tensors.size());
        for (std::size_t n = 0; n < g_.nodes.size(); ++n) {
            const node& nd = g_.nodes[n];
            for (const auto& piece : out_.layouts[n].pieces)
                for (std::size_t k = 0; k < nd.inputs.size(); ++k) {
                    const tensor_desc& t = g_.tensor(nd.inputs[k]);
                    if (t.role != tensor_role::input && t.role != tensor_role::parameter) continue;
                    auto& slot = need[static_cast<std::size_t>(nd.inputs[k])];
                    slot.resize(static_cast<std::size_t>(out_.world));
                    auto& b = slot[static_cast<std::size_t>(piece.device)];
                    b = b ? detail::bounding({*b, piece.inputs[k]}) : piece.inputs[k];
                }
        }
        auto store = [&](tensor_id t) {
            const tensor_desc& d = g_.tensor(t);
            const auto& slot = need[static_cast<std::size_t>(t)];
            for (std::size_t dev = 0; dev < slot.size(); ++dev) {
                if (!slot[dev]) continue;
                device_part& part = out_.devices[dev];
                tensor local = part.builder->add_leaf(d.name + suffix(*slot[dev], d.dims), slot[dev]->shape_of(d.dims),
                                                      d.kind, d.role);
                if (d.role == tensor_role::parameter) part.builder->mutable_graph().tensor(local.id).init = d.init;
                (d.role == tensor_role::parameter ? part.parameters : part.inputs).push_back({t, local.id, *slot[dev]});
                hold(t, {t, *slot[dev], {}}, static_cast<int>(dev), local.id, true);
            }
        };
        for (tensor_id t : g_.inputs) store(t);
        for (tensor_id t : g_.parameters) store(t);
    }

    void emit_node(node_id id) {
        const node& n = g_.at(id);
        const node_layout& layout = out_.layouts[static_cast<std::size_t>(id)];
        const bool backward = n.backward || n.forward_of != no_id;
        std::vector<std::vector<tensor_id>> locals(n.inputs.size());
        for (std::size_t k = 0; k < n.inputs.size() && !n.op->shape_only_inputs; ++k) {
            std::vector<request> reqs;
            for (const auto& piece : layout.pieces) reqs.push_back({piece.device, piece.inputs[k], piece.summand});
            locals[k] = gathered_per_use_[static_cast<std::size_t>(n.inputs[k])]
                            ? materialize_for_each_use(n.inputs[k], reqs, id, backward)
                            : materialize(n.inputs[k], reqs, id, backward);
        }
        if (shard_serves_as_piece_[static_cast<std::size_t>(id)]) {
            // ZeRO-3's identity: each piece is the shard of the parameter its device stores,
            // which serves as the piece. A copy would hold a second shard of the whole model
            // in the arena all step (the gathers of every use read it).
            for (std::size_t p = 0; p < layout.pieces.size(); ++p)
                hold(n.outputs[0], layout.pieces[p].outputs[0], layout.pieces[p].device, locals[0][p], true);
            return;
        }
        for (std::size_t p = 0; p < layout.pieces.size(); ++p) {
            const piece_geometry& piece = layout.pieces[p];
            graph_builder& b = *out_.devices[static_cast<std::size_t>(piece.device)].builder;
            std::vector<tensor> ins;
            for (std::size_t k = 0; k < n.inputs.size() && !n.op->shape_only_inputs; ++k) ins.push_back(b.handle(locals[k][p]));
            attributes attrs = n.op->piece_attributes ? n.op->piece_attributes(n, piece.vars) : n.attrs;
            for (const auto& s : layout.partition.splits) {
                if (!s.cuts()) continue;
                const auto* custom = plan::transformation_registry::instance().find(*n.op, s.label);
                if (custom && custom->piece_attributes) {
                    node adjusted = n;
                    adjusted.attrs = attrs;
                    attrs = custom->piece_attributes(adjusted, piece.vars);
                }
            }
            std::vector<tensor> outs;
            try {
                if (n.op->shape_only_inputs) {
                    std::vector<shape> shapes;
                    for (std::size_t o = 0; o < n.outputs.size(); ++o)
                        shapes.push_back(piece.outputs[o].region.shape_of(g_.tensor(n.outputs[o]).dims));
                    outs = b.append_unchecked(*n.op, {}, std::move(shapes), attrs, n.name);
                } else {
                    outs = n.op->apply(b, ins, attrs);
                }
            } catch (const error& e) {
                throw plan_error("plan: piece " + std::to_string(p) + " of " + std::string(n.op->name) + " '" + n.name +
                                 "' (" + layout.partition.describe() + ") cannot be built: " + e.what());
            }
            graph& dg = b.mutable_graph();
            dg.nodes.back().name = n.name + "#" + std::to_string(p);
            dg.nodes.back().backward = backward;
            auto& sources = out_.devices[static_cast<std::size_t>(piece.device)].sources;
            sources.resize(dg.nodes.size());
            sources.back() = {id, static_cast<std::int32_t>(p)};
            for (std::size_t o = 0; o < outs.size(); ++o) {
                const vtensor& v = piece.outputs[o];
                const tensor_desc& logical = g_.tensor(n.outputs[o]);
                if (!same_extents(dg.tensor(outs[o].id).dims, v.region.shape_of(logical.dims)))
                    throw plan_error("plan: piece " + std::to_string(p) + " of " + std::string(n.op->name) + " '" +
                                     n.name + "' produced shape " + dg.tensor(outs[o].id).dims.to_string() +
                                     " where its box " + v.region.to_string() +
                                     " was expected; the op's shape rule does not follow its signature under this split");
                dg.tensor(outs[o].id).name = logical.name + suffix(v.region, logical.dims) + chunk_suffix(v.value);
                hold(n.outputs[o], v, piece.device, outs[o].id, true);
            }
        }
    }

    // Gradients onto the parameters' storage (or the optimizer's shards), the loss everywhere.
    void finish() {
        for (auto [param, grad] : g_.gradients) {
            std::vector<request> reqs;
            std::vector<tensor_id> params;
            if (out_.logical->zero2_identity.count(param)) {
                // ZeRO-2: the gradient identity's pieces are the optimizer's shards, each
                // updated in place in the piece of the parameter its device stores: every
                // shard must lie within one (data-parallel replicas of a whole parameter or of
                // a tensor-parallel piece; colocated pieces, Coshard, break it).
                for (const auto& piece : out_.layouts[static_cast<std::size_t>(g_.tensor(grad).producer)].pieces) {
                    const box& shard = piece.outputs[0].region;
                    const auto& stored = out_.devices[static_cast<std::size_t>(piece.device)].parameters;
                    if (std::none_of(stored.begin(), stored.end(), [&](const stored_piece& s) {
                            return s.logical == param && s.region.contains(shard);
                        }))
                        throw plan_error("plan: ZeRO-2 shards the gradient of '" + g_.tensor(param).name +
                                         "' over data-parallel replicas, but device " + std::to_string(piece.device) +
                                         " does not store the part " + shard.to_string() +
                                         " of the parameter that its shard updates; use ZeRO-3 (which shards "
                                         "parameters too) or place the pieces of the ops that read it on distinct devices");
                    reqs.push_back({piece.device, shard});
                }
            } else {
                for (int d = 0; d < out_.world; ++d)
                    for (const auto& s : out_.devices[static_cast<std::size_t>(d)].parameters)
                        if (s.logical == param) reqs.push_back({d, s.region});
            }
            std::vector<tensor_id> locals = materialize(grad, reqs, no_id, true, /*sum_locally_first=*/true);
            for (std::size_t i = 0; i < reqs.size(); ++i) {
                device_part& part = out_.devices[static_cast<std::size_t>(reqs[i].device)];
                graph& dg = part.builder->mutable_graph();
                tensor_id local = locals[i];
                bool fresh = dg.tensor(local).role == tensor_role::activation &&
                             std::none_of(part.gradients.begin(), part.gradients.end(),
                                          [&](const stored_piece& s) { return s.local == local; });
                if (!fresh) local = assemble(reqs[i].device, grad, reqs[i].region, {{local, reqs[i].region, {}}}, false);
                graph& dg2 = part.builder->mutable_graph();
                tensor_id param_local = no_id;
                for (const auto& s : part.parameters)
                    if (s.logical == param && s.region.contains(reqs[i].region)) param_local = s.local;
                dg2.tensor(local).role = tensor_role::gradient;
                dg2.tensor(local).gradient_of = param_local;
                dg2.tensor(local).name = "grad/" + g_.tensor(param).name + suffix(reqs[i].region, g_.tensor(param).dims);
                if (param_local != no_id) dg2.gradients.emplace_back(param_local, local);
                part.gradients.push_back({param, local, reqs[i].region});
            }
        }
        std::vector<request> reqs;
        for (int d = 0; d < out_.world; ++d) reqs.push_back({d, box{}});
        std::vector<tensor_id> losses(reqs.size(), no_id);
        if (stage_of_node_.empty()) {
            losses = materialize(g_.loss, reqs, no_id, false);
        } else {
            // Pipelines: the loss's own devices sum it among themselves; the other stages get
            // it point to point. A collective reaching into other stages would sit in the
            // loss's forward block on its producers but at the end of the step elsewhere, and
            // wait on the gradients those stages are still to receive.
            std::vector<request> own, others;
            for (const auto& h : held_[static_cast<std::size_t>(g_.loss)]) {
                if (std::none_of(own.begin(), own.end(), [&](const request& r) { return r.device == h.device; }))
                    own.push_back({h.device, box{}});
            }
            for (const auto& r : reqs)
                if (std::none_of(own.begin(), own.end(), [&](const request& o) { return o.device == r.device; }))
                    others.push_back(r);
            const auto mine = materialize(g_.loss, own, no_id, false, /*sum_locally_first=*/true);
            for (std::size_t i = 0; i < own.size(); ++i) losses[static_cast<std::size_t>(own[i].device)] = mine[i];
            point_to_point_only_ = true;
            const auto theirs = materialize(g_.loss, others, no_id, false);
            point_to_point_only_ = false;
            for (std::size_t i = 0; i < others.size(); ++i) losses[static_cast<std::size_t>(others[i].device)] = theirs[i];
        }
        for (int d = 0; d < out_.world; ++d) {
            device_part& part = out_.devices[static_cast<std::size_t>(d)];
            part.loss = losses[static_cast<std::size_t>(d)];
            part.builder->mutable_graph().loss = part.loss;
        }
    }

private:
    struct request {
        int device;
        box region;
        value_chunk value{};  // full values, or one summand of partial sums (a linear op's piece)
    };
    struct held_piece {
        vtensor v;
        int device;
        tensor_id local;
        bool base;     // one of the pieces its producer wrote (or a stored leaf), not yet summed up
        bool written;  // one of the pieces its producer wrote (or a stored leaf)
    };

    static std::string suffix(const box& b, const shape& logical) {
        return b == box::whole(logical) ? std::string{} : b.to_string();
    }
    static std::string chunk_suffix(const value_chunk& c) {
        return c.full() ? std::string{} : "{" + std::to_string(c.index) + "/" + std::to_string(c.count) + "}";
    }

    void hold(tensor_id t, vtensor v, int device, tensor_id local, bool base) {
        v.logical = t;
        auto& held = held_[static_cast<std::size_t>(t)];
        held_on_[held_key(t, device)].push_back(static_cast<std::uint32_t>(held.size()));
        held.push_back({std::move(v), device, local, base, base});
    }

    // Which of held_[t] lie on `device`, in the order they were held. A tensor of a pipeline
    // at scale is held in hundreds of pieces (micro-batches x devices), and the lookups that
    // want one device's would otherwise scan them all, for every request.
    static std::uint64_t held_key(tensor_id t, int device) {
        return static_cast<std::uint64_t>(static_cast<std::uint32_t>(t)) << 32 | static_cast<std::uint32_t>(device);
    }
    const std::vector<std::uint32_t>& held_on(tensor_id t, int device) const {
        static const std::vector<std::uint32_t> none;
        const auto it = held_on_.find(held_key(t, device));
        return it == held_on_.end() ? none : it->second;
    }

    // Plans are built before the precision is chosen; costs count 4-byte elements (float32
    // values and int32 ids alike), which ranks alternatives the same way as any fixed size.
    static std::int64_t bytes_of(std::int64_t elements) { return elements * 4; }

    // A full-valued piece on `device` holding `region`, cut out if needed.
    std::optional<tensor_id> local(tensor_id t, int device, const box& region) {
        const held_piece* best = nullptr;
        const auto& held = held_[static_cast<std::size_t>(t)];
        for (std::uint32_t i : held_on(t, device)) {
            const held_piece& h = held[i];
            if (!h.v.value.full() || !h.v.region.contains(region)) continue;
            if (h.v.region == region) return h.local;
            if (!best || best->v.region.numel() > h.v.region.numel()) best = &h;
        }
        if (!best) return std::nullopt;
        held_piece source = *best;
        tensor_id cut = assemble(device, t, region, {{source.local, source.v.region, {}}}, false);
        hold(t, {t, region, {}}, device, cut, false);
        return cut;
    }

    // Whether programs narrower than float keep logical tensor t in float (its producer's
    // op_def::float_outputs: a loss, attention's log-sum-exp). Copies of its pieces are
    // marked "keeps_float" so that every device stores them as float too
    // (runtime/program.hpp, storage_precision), even where the copy has no input to look at.
    bool kept_in_float(tensor_id t) const {
        const tensor_desc& d = g_.tensor(t);
        if (d.producer == no_id) return false;
        const node& n = g_.at(d.producer);
        for (std::size_t i = 0; i < n.outputs.size() && i < 32; ++i)
            if (n.outputs[i] == t) return (n.op->float_outputs >> i & 1u) != 0;
        return false;
    }

    struct assemble_input {
        tensor_id local;
        box region;
        value_chunk value;
    };

    tensor_id assemble(int device, tensor_id t, const box& region, const std::vector<assemble_input>& inputs, bool accumulate) {
        graph_builder& b = *out_.devices[static_cast<std::size_t>(device)].builder;
        const tensor_desc& logical = g_.tensor(t);
        std::vector<tensor> ins;
        std::vector<std::int64_t> in_boxes;
        std::int64_t covered = 0;
        for (const auto& in : inputs) {
            ins.push_back(b.handle(in.local));
            auto e = encode_box(in.region);
            in_boxes.insert(in_boxes.end(), e.begin(), e.end());
            covered += intersect(in.region, region).numel();
        }
        const bool zero = accumulate || covered < region.numel();
        attributes attrs{{"out_box", encode_box(region)},
                         {"in_boxes", in_boxes},
                         {"accumulate", std::int64_t{accumulate ? 1 : 0}},
                         {"zero", std::int64_t{zero ? 1 : 0}}};
        if (kept_in_float(t)) attrs.set("keeps_float", std::int64_t{1});
        if (runs_with_ == transfer::block_of::as_made) attrs.set("as_made", std::int64_t{1});
        auto outs = b.append_unchecked(op_def_of<ops::Assemble>(), ins, {region.shape_of(logical.dims)}, std::move(attrs),
                                       logical.name + suffix(region, logical.dims) + "/assemble", logical.kind);
        b.mutable_graph().nodes.back().backward = emitting_backward_;
        return outs[0].id;
    }

    // Emits one transfer: a node on every member device. Returns each member's output.
    std::vector<tensor_id> emit(transfer tr, const std::vector<tensor_id>& member_inputs) {
        tr.backward = emitting_backward_;
        tr.consumer = emitting_consumer_;
        tr.runs_with = runs_with_;
        tr.values = g_.tensor(tr.logical).kind;
        const auto id = static_cast<std::int64_t>(out_.transfers.size());
        std::vector<tensor_id> outs(tr.group.size(), no_id);
        const tensor_desc& logical = g_.tensor(tr.logical);
        for (std::size_t m = 0; m < tr.group.size(); ++m) {
            graph_builder& b = *out_.devices[static_cast<std::size_t>(tr.group[m])].builder;
            std::vector<tensor> ins;
            if (tr.has_input[m]) ins.push_back(b.handle(member_inputs.at(m)));
            std::vector<shape> shapes;
            if (tr.has_output[m]) shapes.push_back(tr.outputs[m].shape_of(logical.dims));
            attributes attrs{{"transfer", id}};
            if (kept_in_float(tr.logical)) attrs.set("keeps_float", std::int64_t{1});
            auto o = b.append_unchecked(op_def_of<ops::Transfer>(), ins, std::move(shapes), std::move(attrs),
                                        "transfer/" + std::to_string(id) + "/" + std::string(to_string(tr.kind)) + "/" +
                                            logical.name,
                                        logical.kind);
            b.mutable_graph().nodes.back().backward = emitting_backward_;
            if (tr.has_output[m]) {
                outs[m] = o[0].id;
                hold(tr.logical, {tr.logical, tr.outputs[m], emitting_value_}, tr.group[m], outs[m], false);
            }
        }
        out_.transfers.push_back(std::move(tr));
        return outs;
    }

    double cost_of(const transfer& tr) const {
        std::int64_t worst = 0;
        for (std::size_t m = 0; m < tr.group.size(); ++m) worst = std::max(worst, tr.elements_sent_by(m));
        return cost_.cost(bytes_of(worst), tr.steps());
    }
    double generic_cost(const std::vector<request>& reqs) const {
        std::int64_t elements = 0, steps = 0;
        for (const auto& r : reqs) {
            elements += r.region.numel() * 2;  // a conservative guess: each box arrives in pieces from two holders
            ++steps;
        }
        return cost_.cost(bytes_of(elements), steps);
    }

    // ---- strategies ------------------------------------------------------------------

    // Partial sums of one box on distinct devices, each of which needs part of it.
    bool try_partial(tensor_id t, std::vector<std::size_t>& open, const std::vector<request>& reqs) {
        // Copies: emitting appends to held_, which may move its elements.
        std::map<box, std::vector<held_piece>> clusters;
        for (const auto& h : held_[static_cast<std::size_t>(t)])
            if (h.base && !h.v.value.full()) clusters[h.v.region].push_back(h);
        bool emitted = false;
        for (auto& [S, pieces] : clusters) {
            const std::int32_t k = pieces[0].v.value.count;
            // Holders of each chunk, by device. Replicated chunks (a replicated op's partial
            // gradient) give several groups: the r-th holders of every chunk reduce together.
            std::vector<std::vector<const held_piece*>> holders(static_cast<std::size_t>(k));
            for (const held_piece& h : pieces)
                if (h.v.value.count == k) holders[static_cast<std::size_t>(h.v.value.index)].push_back(&h);
            std::size_t replicas = holders[0].size();
            bool regular = replicas > 0;
            for (auto& hs : holders) {
                std::sort(hs.begin(), hs.end(), [](auto* x, auto* y) { return x->device < y->device; });
                regular = regular && hs.size() == replicas;
            }
            if (!regular) continue;
            for (std::size_t r = 0; r < replicas; ++r) {
                std::vector<const held_piece*> by_chunk;
                for (auto& hs : holders) by_chunk.push_back(hs[r]);
                emitted = reduce_group(t, S, by_chunk, open, reqs) || emitted;
            }
            if (emitted) return true;
        }
        return false;
    }

    // One reduction over the holders of chunks 0..k-1 of box S (one chunk each).
    bool reduce_group(tensor_id t, const box& S, const std::vector<const held_piece*>& by_chunk,
                      const std::vector<std::size_t>& open, const std::vector<request>& reqs) {
        {
            std::vector<int> devices;
            for (auto* h : by_chunk) devices.push_back(h->device);
            std::vector<int> sorted = devices;
            std::sort(sorted.begin(), sorted.end());
            if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() || !within(sorted)) return false;
            // One open request per member device, inside S.
            std::map<int, std::size_t> mine;
            bool usable = true;
            for (std::size_t i : open) {
                const request& r = reqs[i];
                if (!std::binary_search(sorted.begin(), sorted.end(), r.device) || !S.contains(r.region)) continue;
                auto [it, inserted] = mine.try_emplace(r.device, i);
                if (!inserted && !(reqs[it->second].region == r.region)) usable = false;
            }
            if (!usable || mine.size() != sorted.size()) return false;
            std::vector<box> wanted;
            bool all_whole = true;
            for (int d : sorted) {
                wanted.push_back(reqs[mine[d]].region);
                all_whole = all_whole && wanted.back() == S;
            }
            std::vector<tensor_id> ins;
            for (int d : sorted)
                for (auto* h : by_chunk)
                    if (h->device == d) ins.push_back(h->local);
            transfer reduce;
            reduce.logical = t;
            reduce.group = sorted;
            reduce.has_input.assign(sorted.size(), true);
            reduce.has_output.assign(sorted.size(), true);
            reduce.inputs.assign(sorted.size(), S);
            reduce.kind = transfer_kind::all_reduce;
            reduce.outputs.assign(sorted.size(), S);
            if (!all_whole && detail::tiling_axis(wanted, S)) {
                transfer scatter = reduce;
                scatter.kind = transfer_kind::reduce_scatter;
                scatter.outputs = wanted;
                if (cost_of(scatter) <= cost_of(reduce)) {
                    emit(std::move(scatter), ins);
                    return true;
                }
            }
            if (!all_whole) {
                std::vector<request> sub;
                for (int d : sorted) sub.push_back(reqs[mine[d]]);
                if (generic_cost(sub) < cost_of(reduce)) return false;
            }
            emit(std::move(reduce), ins);
            return true;
        }
        return false;
    }

    // Full-valued tiles: all_gather into one box, or all_to_all between two tilings.
    bool try_tiles(tensor_id t, std::vector<std::size_t>& open, const std::vector<request>& reqs) {
        // All-gather: devices D all need R and each holds one tile of R.
        std::map<box, std::vector<std::size_t>> by_region;
        for (std::size_t i : open) by_region[reqs[i].region].push_back(i);
        for (auto& [R, idx] : by_region) {
            std::vector<int> devices;
            for (std::size_t i : idx) devices.push_back(reqs[i].device);
            std::sort(devices.begin(), devices.end());
            devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
            if (devices.size() < 2) continue;
            std::vector<box> tiles;
            std::vector<tensor_id> ins;
            for (int d : devices) {
                const held_piece* tile = nullptr;
                for (std::uint32_t k : held_on(t, d))
                    if (const held_piece& h = held_[static_cast<std::size_t>(t)][k];
                        h.v.value.full() && R.contains(h.v.region) && !(h.v.region == R) &&
                        (!tile || tile->v.region.numel() < h.v.region.numel()))
                        tile = &h;
                if (!tile) break;
                tiles.push_back(tile->v.region);
                ins.push_back(tile->local);
            }
            if (tiles.size() != devices.size() || !within(devices)) continue;
            auto gather_within = [&](const std::vector<std::size_t>& members) {
                transfer gather;
                gather.kind = transfer_kind::all_gather;
                gather.logical = t;
                std::vector<tensor_id> member_ins;
                for (std::size_t m : members) {
                    gather.group.push_back(devices[m]);
                    gather.inputs.push_back(tiles[m]);
                    member_ins.push_back(ins[m]);
                }
                gather.outputs.assign(members.size(), R);
                gather.has_input.assign(members.size(), true);
                gather.has_output.assign(members.size(), true);
                emit(std::move(gather), member_ins);
            };
            if (detail::tiling_axis(tiles, R)) {
                std::vector<std::size_t> all(devices.size());
                for (std::size_t m = 0; m < all.size(); ++m) all[m] = m;
                gather_within(all);
                return true;
            }
            // Copies of one tiling (ZeRO-3's shards of a parameter that every device of a
            // tensor-parallel group reads whole, one set per data-parallel group): the j-th
            // holders of every tile, in device order, gather together.
            std::map<box, std::vector<std::size_t>> holders_of;
            for (std::size_t m = 0; m < tiles.size(); ++m) holders_of[tiles[m]].push_back(m);
            const std::size_t copies = holders_of.begin()->second.size();
            std::vector<box> distinct;
            for (const auto& [tile, members] : holders_of) {
                if (members.size() != copies) break;
                distinct.push_back(tile);
            }
            if (copies < 2 || distinct.size() != holders_of.size() || !detail::tiling_axis(distinct, R)) continue;
            for (std::size_t j = 0; j < copies; ++j) {
                std::vector<std::size_t> members;
                for (const auto& [tile, holders] : holders_of) members.push_back(holders[j]);
                std::sort(members.begin(), members.end());  // devices ascend with their index
                gather_within(members);
            }
            return true;
        }
        // All-to-all: each device of P needs a different tile of S along one axis and
        // holds a tile of S along another.
        std::map<int, std::size_t> one;
        for (std::size_t i : open) one.try_emplace(reqs[i].device, i);
        if (one.size() < 2 || one.size() != open.size()) return false;
        std::vector<int> devices;
        std::vector<box> wanted, tiles;
        std::vector<tensor_id> ins;
        for (auto [d, i] : one) {
            devices.push_back(d);
            wanted.push_back(reqs[i].region);
            const held_piece* tile = nullptr;
            for (std::uint32_t k : held_on(t, d))
                if (const held_piece& h = held_[static_cast<std::size_t>(t)][k]; h.base && h.v.value.full()) tile = &h;
            if (!tile) return false;
            tiles.push_back(tile->v.region);
            ins.push_back(tile->local);
        }
        const box S = detail::bounding(wanted);
        auto a = detail::tiling_axis(tiles, S), b = detail::tiling_axis(wanted, S);
        if (!a || !b || *a == *b || !within(devices)) return false;
        transfer exchange;
        exchange.kind = transfer_kind::all_to_all;
        exchange.logical = t;
        exchange.group = devices;
        exchange.inputs = tiles;
        exchange.outputs = wanted;
        exchange.has_input.assign(devices.size(), true);
        exchange.has_output.assign(devices.size(), true);
        emit(std::move(exchange), ins);
        return true;
    }

    // Several devices need one box that a single device holds whole.
    bool try_broadcast(tensor_id t, std::vector<std::size_t>& open, const std::vector<request>& reqs) {
        std::map<box, std::vector<int>> by_region;
        for (std::size_t i : open) by_region[reqs[i].region].push_back(reqs[i].device);
        for (auto& [R, devices] : by_region) {
            std::sort(devices.begin(), devices.end());
            devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
            if (devices.size() < 2) continue;
            const held_piece* source = nullptr;
            for (const auto& h : held_[static_cast<std::size_t>(t)])
                if (h.v.value.full() && h.v.region.contains(R) &&
                    (!source || std::pair{!within({h.device}), h.device} < std::pair{!within({source->device}), source->device}))
                    source = &h;  // the lowest holder, among the allowed members first
            if (!source) continue;
            const int root = source->device;
            tensor_id data = *local(t, root, R);
            transfer cast;
            cast.kind = transfer_kind::broadcast;
            cast.logical = t;
            cast.root = root;
            cast.group = devices;
            cast.group.push_back(root);
            std::sort(cast.group.begin(), cast.group.end());
            if (!within(cast.group)) continue;
            std::vector<tensor_id> ins(cast.group.size(), no_id);
            for (std::size_t m = 0; m < cast.group.size(); ++m) {
                const bool is_root = cast.group[m] == root;
                cast.has_input.push_back(is_root);
                cast.has_output.push_back(!is_root);
                cast.inputs.push_back(is_root ? R : box{});
                cast.outputs.push_back(R);
                if (is_root) ins[m] = data;
            }
            emit(std::move(cast), ins);
            return true;
        }
        return false;
    }

    // Point to point from every intersecting piece, then concat and sum on the device.
    tensor_id generic(tensor_id t, const request& r) {
        // Copies: emitting below appends to held_, which may move its elements.
        std::map<vtensor, std::vector<held_piece>> distinct;
        for (const auto& h : held_[static_cast<std::size_t>(t)])
            if (h.base && (r.region.rank() == 0 || !intersect(h.v.region, r.region).empty()))
                distinct[h.v].push_back(h);
        if (distinct.empty())
            throw error("partition: no device holds any part of '" + g_.tensor(t).name + "' " + r.region.to_string() +
                        " needed on device " + std::to_string(r.device));
        std::vector<assemble_input> parts;
        bool accumulate = false;
        for (auto& [v, holders] : distinct) {
            const held_piece* h = &holders[0];
            for (const auto& c : holders)
                if (c.device == r.device) h = &c;
            const box region = r.region.rank() == 0 ? box{} : intersect(v.region, r.region);
            accumulate = accumulate || !v.value.full();
            if (h->device == r.device) {
                parts.push_back({h->local, v.region, v.value});
                continue;
            }
            parts.push_back({send(t, *h, region, r.device, v.value), region, v.value});
        }
        if (parts.size() == 1 && parts[0].region == r.region && parts[0].value.full()) return parts[0].local;
        const bool one_box = std::all_of(parts.begin(), parts.end(), [&](const assemble_input& p) { return p.region == r.region; });
        tensor_id whole = no_id;
        if (accumulate && one_box && parts.size() > 2) {
            // Partial sums of one box (a weight's gradient over a pipeline's micro-batches).
            whole = add_in_order(r.device, t, r.region, parts);
        } else {
            whole = assemble(r.device, t, r.region, parts, accumulate);
        }
        hold(t, {t, r.region, {}}, r.device, whole, false);
        return whole;
    }

    // One summand of partial sums (for a piece of an op linear in its inputs): the device's
    // own piece of that summand, cut out if needed, else the holders' pieces of it point to
    // point, concatenated. Never reduced: the sum is the consumer's to finish.
    tensor_id summand(tensor_id t, const request& r) {
        std::vector<held_piece> holders;  // copies: emitting appends to held_
        for (const auto& h : held_[static_cast<std::size_t>(t)])
            if (h.v.value == r.value && (r.region.rank() == 0 || !intersect(h.v.region, r.region).empty())) holders.push_back(h);
        for (const auto& h : holders)
            if (h.device == r.device && h.v.region == r.region) return h.local;
        for (const auto& h : holders)
            if (h.device == r.device && h.v.region.contains(r.region)) {
                tensor_id cut = assemble(r.device, t, r.region, {{h.local, h.v.region, {}}}, false);
                hold(t, {t, r.region, r.value}, r.device, cut, false);
                return cut;
            }
        // The pieces its producer wrote (they tile the tensor once per summand and copy), one
        // holder per distinct region, the requesting device's where it has one.
        std::map<box, held_piece> by_region;
        if (std::none_of(holders.begin(), holders.end(), [](const held_piece& h) { return h.written; }))
            return coarse_summand(t, r);
        for (const auto& h : holders) {
            if (!h.written) continue;
            auto [at, inserted] = by_region.try_emplace(h.v.region, h);
            if (!inserted && h.device == r.device) at->second = h;
        }
        std::vector<assemble_input> parts;
        std::int64_t covered = 0;
        for (const auto& [held_region, h] : by_region) {
            const box region = r.region.rank() == 0 ? box{} : intersect(held_region, r.region);
            covered += region.numel();
            if (h.device == r.device) {
                parts.push_back({h.local, held_region, {}});
                continue;
            }
            parts.push_back({send(t, h, region, r.device, r.value), region, {}});
        }
        if (parts.empty() || (r.region.rank() > 0 && covered != r.region.numel())) {
            throw error("partition: summand " + std::to_string(r.value.index) + " of " + std::to_string(r.value.count) +
                        " of '" + g_.tensor(t).name + "' " + r.region.to_string() + ", needed on device " +
                        std::to_string(r.device) + ", is not held whole by the devices; its producer's pieces do not "
                        "cover it once");
        }
        if (parts.size() == 1 && parts[0].region == r.region) return parts[0].local;
        tensor_id whole = assemble(r.device, t, r.region, parts, false);
        hold(t, {t, r.region, r.value}, r.device, whole, false);
        return whole;
    }

    // Coarse summand j of J (r.value) where the producer wrote finer summands f of F (J
    // divides F): the sum of those with f % J == j, per region the producer wrote. Each
    // region's sum is made on a device that holds all of its summands (the requesting device
    // if it does: a data-parallel rank's micro-batches) and sent from there once (the LM
    // head's contributions to the tied embedding's gradient, a pipeline stage away).
    tensor_id coarse_summand(tensor_id t, const request& r) {
        const value_chunk want = r.value;
        std::map<box, std::map<int, std::map<std::int32_t, held_piece>>> fine;  // region -> device -> summand -> piece
        std::map<box, std::set<std::int32_t>> needed;                            // region -> summands
        for (const auto& h : held_[static_cast<std::size_t>(t)]) {
            const value_chunk& v = h.v.value;
            if (!h.written || v.count <= want.count || v.count % want.count != 0 || v.index % want.count != want.index) continue;
            if (r.region.rank() > 0 && intersect(h.v.region, r.region).empty()) continue;
            fine[h.v.region][h.device].emplace(v.index, h);
            needed[h.v.region].insert(v.index);
        }
        std::vector<assemble_input> parts;
        std::int64_t covered = 0;
        for (auto& [R, by_device] : fine) {
            const std::set<std::int32_t>& all = needed.at(R);
            auto holds_all = [&](int d) { return by_device.count(d) && by_device.at(d).size() == all.size(); };
            int at = r.device;
            if (!holds_all(at))
                for (const auto& [d, pieces] : by_device)
                    if (holds_all(d)) {
                        at = d;
                        break;
                    }
            // One piece of every summand on `at`, received from a holder where it has none.
            std::vector<assemble_input> summands;
            for (std::int32_t f : all) {
                if (by_device.count(at) && by_device.at(at).count(f)) {
                    const held_piece& h = by_device.at(at).at(f);
                    summands.push_back({h.local, R, h.v.value});
                    continue;
                }
                const held_piece* from = nullptr;
                for (const auto& [d, pieces] : by_device)
                    if (!from && pieces.count(f)) from = &pieces.at(f);
                summands.push_back({send(t, *from, R, at, from->v.value), R, from->v.value});
            }
            const tensor_id sum = add_in_order(at, t, R, summands);
            hold(t, {t, R, want}, at, sum, false);
            const box region = r.region.rank() == 0 ? box{} : intersect(R, r.region);
            covered += region.numel();
            if (at == r.device) {
                parts.push_back({sum, R, {}});
                continue;
            }
            held_piece made{{t, R, want}, at, sum, false, false};
            parts.push_back({send(t, made, region, r.device, want), region, {}});
        }
        if (parts.empty() || (r.region.rank() > 0 && covered != r.region.numel()))
            throw error("partition: summand " + std::to_string(want.index) + " of " + std::to_string(want.count) + " of '" +
                        g_.tensor(t).name + "' " + r.region.to_string() + ", needed on device " + std::to_string(r.device) +
                        ", cannot be made from its producer's pieces; they do not cover it once");
        if (parts.size() == 1 && parts[0].region == r.region) return parts[0].local;
        tensor_id whole = assemble(r.device, t, r.region, parts, false);
        hold(t, {t, r.region, want}, r.device, whole, false);
        return whole;
    }

    // Partial sums of box S on `device`, added one at a time in order, so that each dies as
    // soon as it is added instead of living until the last one is made (1F1B keeps few
    // micro-batches' partials alive). One part is returned as it is.
    tensor_id add_in_order(int device, tensor_id t, const box& S, const std::vector<assemble_input>& parts) {
        tensor_id sum = parts.at(0).local;
        if (parts.size() == 1) return sum;
        sum = assemble(device, t, S, {parts[0], parts[1]}, true);
        for (std::size_t q = 2; q < parts.size(); ++q) sum = assemble(device, t, S, {{sum, S, {}}, parts[q]}, true);
        return sum;
    }

    // Box `region` of held piece `h` (a summand `value` of t), sent point to point to `device`.
    tensor_id send(tensor_id t, const held_piece& h, const box& region, int device, const value_chunk& value) {
        tensor_id source = h.local;
        if (!(region == h.v.region)) source = assemble(h.device, t, region, {{h.local, h.v.region, {}}}, false);
        transfer p2p;
        p2p.kind = transfer_kind::send_recv;
        p2p.logical = t;
        p2p.group = {h.device, device};
        p2p.inputs = {region, box{}};
        p2p.outputs = {box{}, region};
        p2p.has_input = {true, false};
        p2p.has_output = {false, true};
        auto outs = emit(std::move(p2p), {source, no_id});
        held_[static_cast<std::size_t>(t)].back().v.value = value;  // what arrived is still a summand
        return outs[1];
    }

    // The pieces of partial sums of t not yet summed up, by box, then by device: their
    // places in held_[t], in summand order. A box whose pieces are summands of different
    // splits (their counts differ) is left out: neither sum below applies to it.
    std::map<box, std::map<int, std::vector<std::size_t>>> partial_pieces(tensor_id t) const {
        const auto& held = held_[static_cast<std::size_t>(t)];
        std::map<box, std::map<int, std::vector<std::size_t>>> out;
        std::map<box, std::int32_t> count;
        std::set<box> mixed;
        for (std::size_t i = 0; i < held.size(); ++i) {
            const held_piece& h = held[i];
            if (!h.base || h.v.value.full()) continue;
            const auto [at, first] = count.try_emplace(h.v.region, h.v.value.count);
            if (!first && at->second != h.v.value.count) mixed.insert(h.v.region);
            out[h.v.region][h.device].push_back(i);
        }
        for (const box& S : mixed) out.erase(S);
        for (auto& [S, by_device] : out)
            for (auto& [device, idx] : by_device)
                std::sort(idx.begin(), idx.end(),
                          [&](std::size_t a, std::size_t b) { return held[a].v.value.index < held[b].v.value.index; });
        return out;
    }

    // ZeRO-2 and ZeRO-3 keep a weight's gradient sharded all step, as DeepSpeed does: each
    // micro-batch's gradient is reduced onto the shards as soon as it is made, and each
    // device adds up its shard of every micro-batch there. Summing the micro-batches' whole
    // gradients first would hold a whole gradient on every device until the last one, which
    // ZeRO exists to avoid (with the shared table's sends, 80 GiB a device for T5 11B under
    // DeepSpeed's DP 8 x 2 micro-batches; 60 GiB without either).
    // Applies where every device of box S's holders holds M >= 2 of its summands, each
    // summand on one device: round m reduces the m-th summand of every holder (one per
    // micro-batch, in order), and leaves summand m of M of each request, added up in order.
    // The reductions and the adds run as their inputs are made (transfer::block_of::as_made):
    // in that micro-batch's backward, right after the piece that made the gradient.
    void reduce_each_micro_batch(tensor_id t, std::vector<std::size_t>& open, const std::vector<request>& reqs) {
        if (!collectives_allowed(t, emitting_consumer_) || open.empty()) return;
        for (const auto& [S, by_device] : partial_pieces(t)) {
            const std::int32_t k = held_[static_cast<std::size_t>(t)][by_device.begin()->second.front()].v.value.count;
            const std::size_t rounds = by_device.begin()->second.size();
            bool regular = rounds >= 2 && by_device.size() >= 2 && rounds * by_device.size() == static_cast<std::size_t>(k);
            std::vector<int> seen(static_cast<std::size_t>(k), 0);
            for (const auto& [device, idx] : by_device) {
                regular = regular && idx.size() == rounds;
                for (std::size_t i : idx)
                    regular = regular && ++seen[static_cast<std::size_t>(held_[static_cast<std::size_t>(t)][i].v.value.index)] == 1;
            }
            if (!regular) continue;
            runs_with_ = transfer::block_of::as_made;
            std::map<int, std::vector<assemble_input>> shards;  // per device: its summand of each round
            bool reduced = true;
            for (std::size_t m = 0; m < rounds && reduced; ++m) {
                std::vector<held_piece> round;  // copies: emitting appends to held_
                for (const auto& [device, idx] : by_device) round.push_back(held_[static_cast<std::size_t>(t)][idx[m]]);
                std::vector<const held_piece*> by_chunk;
                for (const held_piece& h : round) by_chunk.push_back(&h);
                emitting_value_ = {static_cast<std::int32_t>(m), static_cast<std::int32_t>(rounds)};
                const std::size_t before = held_[static_cast<std::size_t>(t)].size();
                reduced = reduce_group(t, S, by_chunk, open, reqs);
                emitting_value_ = {};
                if (!reduced) break;  // (only the first round can refuse: the rounds are alike)
                for (std::size_t i = before; i < held_[static_cast<std::size_t>(t)].size(); ++i) {
                    const held_piece& h = held_[static_cast<std::size_t>(t)][i];
                    shards[h.device].push_back({h.local, h.v.region, h.v.value});
                }
                for (const auto& [device, idx] : by_device) held_[static_cast<std::size_t>(t)][idx[m]].base = false;
            }
            if (reduced)
                for (const auto& [device, parts] : shards)
                    hold(t, {t, parts.front().region, {}}, device, add_in_order(device, t, parts.front().region, parts), false);
            runs_with_ = transfer::block_of::data_flow;
            if (reduced) return;
        }
    }

    // A device holding several partial sums of one box (a weight's gradient over the
    // micro-batches its data-parallel piece ran) adds them up locally first, so that one
    // reduction per box follows instead of one transfer per micro-batch. Devices that hold
    // the same summands (copies of an op replicated over a tensor-parallel group) form one
    // class; each class's sum becomes summand j of a coarser split, one per class in order
    // of their summands, held by every device of the class. Only when the classes hold
    // disjoint summands that cover the box once.
    void sum_partials_per_device(tensor_id t) {
        for (const auto& [S, by_device] : partial_pieces(t)) {
            const std::int32_t k = held_[static_cast<std::size_t>(t)][by_device.begin()->second.front()].v.value.count;
            std::map<std::vector<std::int32_t>, std::vector<int>> classes;  // summands -> devices
            bool several = false, exact = true;
            for (const auto& [device, idx] : by_device) {
                std::vector<std::int32_t> summands;
                for (std::size_t i : idx) summands.push_back(held_[static_cast<std::size_t>(t)][i].v.value.index);
                several = several || summands.size() > 1;
                classes[summands].push_back(device);
            }
            std::vector<int> seen(static_cast<std::size_t>(k), 0);
            for (const auto& [summands, devices] : classes)
                for (std::int32_t i : summands) exact = exact && ++seen[static_cast<std::size_t>(i)] == 1;
            exact = exact && std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; });
            if (!exact || !several) continue;
            const auto groups = static_cast<std::int32_t>(classes.size());
            std::int32_t j = 0;
            for (const auto& [summands, devices] : classes) {
                for (int device : devices) {
                    std::vector<assemble_input> parts;
                    for (std::size_t i : by_device.at(device)) {
                        held_piece& h = held_[static_cast<std::size_t>(t)][i];
                        h.base = false;
                        parts.push_back({h.local, h.v.region, h.v.value});
                    }
                    hold(t, {t, S, {j, groups}}, device, add_in_order(device, t, S, parts), true);
                }
                ++j;
            }
        }
    }

    // ZeRO-3's parameters, gathered anew for every use: a use is the forward or the
    // backward of one round of a consumer's pieces on each device (the k-th piece a device
    // runs: its k-th micro-batch). Serving a backward read from the forward's gathered copy,
    // or every micro-batch from one gather, keeps the whole unsharded model alive from its
    // forward to its backward (0.32 GiB a layer for T5 11B over 8 devices: 20 GiB of its 60),
    // which is what ZeRO-3 shards parameters to avoid; DeepSpeed too frees a gathered
    // parameter after its forward and gathers it again for its backward, every micro-step.
    // Consumers of one use share its copies: each use's copies are put away while another
    // use is served, so that no lookup finds them, and brought back when it is served again.
    std::vector<tensor_id> materialize_for_each_use(tensor_id t, const std::vector<request>& reqs, node_id consumer,
                                                    bool backward) {
        std::vector<int> round(reqs.size());
        std::map<int, int> pieces_on;  // device -> requests of it seen so far
        int rounds = 0;
        for (std::size_t i = 0; i < reqs.size(); ++i) {
            round[i] = pieces_on[reqs[i].device]++;
            rounds = std::max(rounds, round[i] + 1);
        }
        std::vector<tensor_id> result(reqs.size(), no_id);
        for (int r = 0; r < rounds; ++r) {
            std::vector<request> these;
            std::vector<std::size_t> at;
            for (std::size_t i = 0; i < reqs.size(); ++i)
                if (round[i] == r) {
                    these.push_back(reqs[i]);
                    at.push_back(i);
                }
            serve_use(t, {backward, r});
            const std::vector<tensor_id> got = materialize(t, these, consumer, backward);
            for (std::size_t j = 0; j < at.size(); ++j) result[at[j]] = got[j];
        }
        return result;
    }

    // Makes held_[t] the pieces its producer wrote plus the copies made for `use`; the
    // copies of the use served before are put away.
    using use_key = std::pair<bool, int>;  // (backward, round)
    void serve_use(tensor_id t, use_key use) {
        auto [current, inserted] = use_served_.try_emplace(t, use);
        if (inserted || current->second == use) return;
        auto& held = held_[static_cast<std::size_t>(t)];
        for (const held_piece& h : held) held_on_.erase(held_key(t, h.device));
        std::vector<held_piece> kept, away;
        for (held_piece& h : held) (h.written ? kept : away).push_back(std::move(h));
        put_away_[{t, current->second}] = std::move(away);
        if (auto back = put_away_.find({t, use}); back != put_away_.end()) {
            for (held_piece& h : back->second) kept.push_back(std::move(h));
            put_away_.erase(back);
        }
        held.clear();
        for (held_piece& h : kept) {
            held_on_[held_key(t, h.device)].push_back(static_cast<std::uint32_t>(held.size()));
            held.push_back(std::move(h));
        }
        current->second = use;
    }

    // Only for the parameter gradients at the end of the step: a consumer inside the step
    // (the tied embedding's gradient sum) may run in an earlier micro-batch's block than the
    // last partial, and must receive each partial as it is made.
    std::vector<tensor_id> materialize(tensor_id t, const std::vector<request>& reqs, node_id consumer, bool backward,
                                       bool sum_locally_first = false) {
        emitting_backward_ = backward;
        emitting_consumer_ = consumer;
        std::vector<tensor_id> result(reqs.size(), no_id);
        std::vector<std::size_t> open;
        auto take_local_pieces = [&] {
            std::vector<std::size_t> still;
            for (std::size_t i : open) {
                if (auto l = local(t, reqs[i].device, reqs[i].region))
                    result[i] = *l;
                else
                    still.push_back(i);
            }
            open = std::move(still);
        };
        for (std::size_t i = 0; i < reqs.size(); ++i) {
            if (reqs[i].value.full())
                open.push_back(i);
            else
                result[i] = summand(t, reqs[i]);
        }
        if (open.empty()) return result;
        if (sums_after_every_micro_batch(consumer)) reduce_each_micro_batch(t, open, reqs);
        if (sum_locally_first || sums_after_every_micro_batch(consumer)) sum_partials_per_device(t);
        take_local_pieces();
        while (!open.empty() && collectives_allowed(t, consumer)) {
            bool progressed = try_partial(t, open, reqs) || try_tiles(t, open, reqs) || try_broadcast(t, open, reqs);
            if (!progressed) break;
            take_local_pieces();
        }
        if (!open.empty() && !stage_of_node_.empty() && !point_to_point_only_) {
            between_stages(t, open, reqs, consumer);
            take_local_pieces();
        }
        for (std::size_t i : open) {
            if (auto l = local(t, reqs[i].device, reqs[i].region)) {
                result[i] = *l;
                continue;
            }
            result[i] = generic(t, reqs[i]);
        }
        return result;
    }

    // A tensor passed between two stages. Collectives that stay within one stage's devices
    // run in that stage's block on each member (transfer::runs_with), so they cannot be
    // reached in different orders; this matters where stages share devices, as the
    // interlaced pipeline's ends (on every device) share them with each stage of layers.
    // Without them, partial sums left on every device would reach each consumer as one
    // send per device, and a value every device needs would leave its one holder once per
    // device: at 1024 devices, thousands of sends of a whole activation per micro-batch.
    //   1. Among the consumer's devices: what they hold reduces, gathers or broadcasts among
    //      themselves (a holder that is also a consumer broadcasts).
    //   2. Among the producer's devices: their partial sums reduce there, and tiles of a
    //      box more consumers need whole gather there; consumers that are producers then
    //      hold the value, and broadcast it among the consumers.
    //   3. Otherwise one consumer receives it point to point from a full copy and
    //      broadcasts it among the others (a pipeline's stage of tensor parallelism gets
    //      one send per tile, not one per device).
    // What none of these serves is left to the caller's sends. The requests stay open in the
    // caller, which finds them local afterwards.
    void between_stages(tensor_id t, std::vector<std::size_t> open, const std::vector<request>& reqs, node_id consumer) {
        const node_id producer = g_.tensor(t).producer;
        if (producer == no_id || consumer == no_id) return;
        auto devices_of = [&](node_id n) {
            std::vector<int> out;
            for (const auto& piece : out_.layouts[static_cast<std::size_t>(n)].pieces) out.push_back(piece.device);
            std::sort(out.begin(), out.end());
            out.erase(std::unique(out.begin(), out.end()), out.end());
            return out;
        };
        const std::vector<int> consumers = devices_of(consumer), producers = devices_of(producer);
        auto take_local = [&](const std::vector<request>& of) {
            std::vector<std::size_t> still;
            for (std::size_t i : open)
                if (!local(t, of[i].device, of[i].region)) still.push_back(i);
            open = std::move(still);
        };
        auto among = [&](const std::vector<int>& members, transfer::block_of where, const std::vector<request>& of,
                         auto&& step) {
            members_within_ = &members;
            runs_with_ = where;
            while (!open.empty() && step()) take_local(of);
            members_within_ = nullptr;
            runs_with_ = transfer::block_of::data_flow;
        };
        auto consumer_side = [&] {
            among(consumers, transfer::block_of::consumer, reqs,
                  [&] { return try_partial(t, open, reqs) || try_tiles(t, open, reqs) || try_broadcast(t, open, reqs); });
        };
        consumer_side();
        if (open.empty()) return;
        // The producers' partial sums, each box reduced over its holders as if every holder
        // needed it whole: when they are held on more devices than need them.
        std::vector<request> sums;
        std::set<int> holders;
        for (const auto& h : held_[static_cast<std::size_t>(t)])
            if (h.base && !h.v.value.full()) {
                holders.insert(h.device);
                if (std::none_of(sums.begin(), sums.end(),
                                 [&](const request& r) { return r.device == h.device && r.region == h.v.region; }))
                    sums.push_back({h.device, h.v.region});
            }
        std::set<int> requesters;
        for (std::size_t i : open) requesters.insert(reqs[i].device);
        // A step among the producers over requests of their own (`wanted`, every one open),
        // after which the consumers' requests are open again, less what became local.
        auto among_producers = [&](const std::vector<request>& wanted, auto&& step) {
            std::vector<std::size_t> kept = std::move(open);
            open.clear();
            for (std::size_t i = 0; i < wanted.size(); ++i) open.push_back(i);
            among(producers, transfer::block_of::producer, wanted, step);
            open = std::move(kept);
            take_local(reqs);
        };
        if (holders.size() > 2 && holders.size() > requesters.size()) {
            among_producers(sums, [&] { return try_partial(t, open, sums); });
            consumer_side();  // a consumer that holds the sum now may broadcast it
        }
        if (open.empty()) return;
        // Full-valued tiles of a box the consumers need whole: gathered among their holders,
        // then broadcast among the consumers (one holder, or a consumer that holds it, sends).
        std::map<box, std::set<int>> wanted;  // box -> the devices that need it
        for (std::size_t i : open) wanted[reqs[i].region].insert(reqs[i].device);
        for (const auto& [R, needing] : wanted) {
            std::vector<request> gathers;
            std::set<int> tile_holders;
            for (const auto& h : held_[static_cast<std::size_t>(t)])
                if (h.base && h.v.value.full() && R.contains(h.v.region) && !(h.v.region == R) && tile_holders.insert(h.device).second)
                    gathers.push_back({h.device, R});
            if (tile_holders.size() < 2 || tile_holders.size() >= needing.size()) continue;
            among_producers(gathers, [&] { return try_tiles(t, open, gathers); });
        }
        consumer_side();
        // One send from a full copy, then a broadcast among the consumers from the one that
        // received it, until every request is served or no full copy is left to send from.
        while (!open.empty()) {
            const std::size_t i = open.front();
            const held_piece* copy = nullptr;
            for (const auto& h : held_[static_cast<std::size_t>(t)])
                if (h.v.value.full() && h.v.region.contains(reqs[i].region) && (!copy || h.device < copy->device)) copy = &h;
            if (!copy) return;
            (void)send(t, *copy, reqs[i].region, reqs[i].device, {});
            take_local(reqs);
            consumer_side();
        }
    }

    bool within(const std::vector<int>& group) const {
        if (!members_within_) return true;
        return std::all_of(group.begin(), group.end(),
                           [&](int d) { return std::binary_search(members_within_->begin(), members_within_->end(), d); });
    }

    // The ZeRO identities on gradients (ZeRO-2's, and ZeRO-3's backward) read a parameter's
    // whole gradient: they run after its last micro-batch, like the end of the step.
    bool sums_after_every_micro_batch(node_id consumer) const {
        return consumer != no_id && sums_after_every_micro_batch_[static_cast<std::size_t>(consumer)];
    }

    bool collectives_allowed(tensor_id t, node_id consumer) const {
        if (point_to_point_only_) return false;
        if (stage_of_node_.empty() || consumer == no_id) return true;
        const node_id producer = g_.tensor(t).producer;
        if (producer == no_id) return true;
        const int from = stage_of_node_.at(static_cast<std::size_t>(producer));
        const int to = stage_of_node_.at(static_cast<std::size_t>(consumer));
        return from < 0 || to < 0 || from == to;
    }

    partitioned_graph& out_;
    const graph& g_;
    transfer_cost_model cost_;
    std::vector<int> stage_of_node_;
    std::vector<std::vector<held_piece>> held_;
    std::unordered_map<std::uint64_t, std::vector<std::uint32_t>> held_on_;  // held_key(t, device) -> places in held_[t]
    std::vector<bool> shard_serves_as_piece_;                     // per node of g_: an identity not copied
    std::vector<bool> gathered_per_use_;                         // per tensor of g_: ZeRO-3's gathered parameters
    std::map<tensor_id, use_key> use_served_;                    // the use whose copies held_[t] has
    std::map<std::pair<tensor_id, use_key>, std::vector<held_piece>> put_away_;  // other uses' copies
    bool emitting_backward_ = false;
    bool point_to_point_only_ = false;
    std::vector<bool> sums_after_every_micro_batch_;  // per node of g_
    node_id emitting_consumer_ = no_id;
    const std::vector<int>* members_within_ = nullptr;  // between stages: collectives only among these devices
    transfer::block_of runs_with_ = transfer::block_of::data_flow;
    value_chunk emitting_value_{};  // what a reduction leaves: full values, or one summand of coarser partial sums
};

}  // namespace loom::partition

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::partition::detail {

LOOM_INLINE std::optional<std::size_t> tiling_axis(const std::vector<box>& parts, const box& whole) {
    if (parts.size() < 2 || whole.rank() == 0) return std::nullopt;
    for (std::size_t a = 0; a < whole.rank(); ++a) {
        bool others_whole = true;
        for (const auto& p : parts)
            for (std::size_t b = 0; b < whole.rank(); ++b)
                if (b != a && !(p.ranges[b] == whole.ranges[b])) others_whole = false;
        if (!others_whole) continue;
        std::vector<index_range> r;
        for (const auto& p : parts) r.push_back(p.ranges[a]);
        std::sort(r.begin(), r.end());
        bool ok = r.front().begin == whole.ranges[a].begin && r.back().end == whole.ranges[a].end;
        for (std::size_t i = 0; ok && i < r.size(); ++i) {
            ok = r[i].size() == r[0].size() && r[i].size() > 0;
            if (i > 0) ok = ok && r[i].begin == r[i - 1].end;
        }
        if (ok) return a;
    }
    return std::nullopt;
}

LOOM_INLINE box bounding(const std::vector<box>& parts) {
    box b = parts.at(0);
    for (const auto& p : parts)
        for (std::size_t a = 0; a < b.rank(); ++a) {
            b.ranges[a].begin = std::min(b.ranges[a].begin, p.ranges[a].begin);
            b.ranges[a].end = std::max(b.ranges[a].end, p.ranges[a].end);
        }
    return b;
}

}  // namespace loom::partition::detail
#endif  // LOOM_HEADER_DEFINITIONS
