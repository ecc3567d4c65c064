#pragma once
// What the searcher knows about a model: per layer (folding.hpp), the work of its forward
// and backward ops, its parameters, the activations its backward keeps, the residual
// stream it reads, and how finely tensor parallelism can cut it. Everything is read off a
// training graph (forward + backward, autograd/autograd.hpp) at the graph's batch; the
// searcher scales it to micro-batches and shards.
//
//   auto g = models::gpt(cfg).training_graph();
//   model_profile m = profile_model(g);          // layers found by find_layers(g)
//   m.layers[1].forward.flops, m.layers[1].saved_elements, m.classes()
//
// Rules (each is a modelling choice, stated once here):
// - A node's work is its op's FLOPs (op_def::flops) and the elements it reads and writes.
//   An op is "GEMM-like" when it does at least 16 FLOPs per element it writes; the others
//   are memory-bound (norms, activations, adds, softmax).
// - Saved activations: forward outputs that a backward node reads. Selective recompute
//   drops those made by memory-bound ops and recomputes them (their forward work again);
//   full recompute keeps only the layer's input and reruns its whole forward.
// - Tensor parallelism (Megatron's rules) costs one all-reduce of the residual stream per
//   residual join (an `add` whose output has the residual stream's shape) in the forward,
//   and one per join in the backward. The degree must divide every parameter extent but
//   the vocabulary's (split into near-equal pieces) and every attention head count of the
//   model (`tp_granularity`).
// - Backward nodes belong to the layer of the forward node they differentiate; the other
//   backward nodes (the loss seed, gradient sums) to the epilogue.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/op.hpp>
#include <loom/search/folding.hpp>

namespace loom::search {

// Work of a set of nodes, split by kind.
struct work {
    double flops = 0;                 // all FLOPs
    double gemm_flops = 0;            // of GEMM-like nodes
    double gemm_elements = 0;         // elements GEMM-like nodes read and write
    double memory_bound_flops = 0;
    double memory_bound_elements = 0;  // elements memory-bound nodes read and write

    work& operator+=(const work& o) {
        flops += o.flops;
        gemm_flops += o.gemm_flops;
        gemm_elements += o.gemm_elements;
        memory_bound_flops += o.memory_bound_flops;
        memory_bound_elements += o.memory_bound_elements;
        return *this;
    }
};

struct layer_profile {
    std::string name;
    layer_role role = layer_role::repeated;
    int class_id = 0;
    work forward;                    // at the graph's batch
    work backward;
    work memory_bound_forward;       // the part of `forward` selective recompute reruns
    double parameters = 0;           // elements of the parameters this layer reads first
    double shared_parameters = 0;    // elements of parameters an earlier layer owns (tied weights)
    int shared_from = -1;            // that layer
    double saved_elements = 0;       // activations the backward reads
    double cheap_saved_elements = 0;  // ... of them made by memory-bound ops
    double input_elements = 0;       // activations entering the layer
    double output_elements = 0;      // activations leaving it for later layers
    int residual_joins = 0;
};

struct model_profile {
    layer_partition partition;
    std::vector<layer_profile> layers;  // parallel to partition.layers
    std::int64_t batch = 1;             // samples in the graph's batch
    double residual_elements = 0;       // one residual-stream tensor at the graph's batch
    std::int64_t tp_granularity = 1;    // a TP degree must divide it
    double parameters = 0;
    // Forward rounds over the repeated layers (recycling, 3F1B); a layer's `forward` is one
    // round's work, and only the last round saves activations and is differentiated.
    int forward_rounds = 1;

    int classes() const { return partition.classes; }
    bool allows_tp(std::int64_t degree) const { return degree >= 1 && tp_granularity % degree == 0; }
};

namespace detail {

inline double numel(const graph& g, tensor_id t) { return static_cast<double>(g.tensor(t).dims.numel()); }

inline bool gemm_like(double flops, double written) { return written > 0 && flops >= 16.0 * written; }

LOOM_INLINE void add_node_work(const graph& g, const node& n, work& w, work* memory_bound_part = nullptr);

}  // namespace detail

LOOM_INLINE model_profile profile_model(const graph& g, layer_partition partition);

inline model_profile profile_model(const graph& g) { return profile_model(g, find_layers(g)); }

}  // namespace loom::search

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::search::detail {

LOOM_INLINE void add_node_work(const graph& g, const node& n, work& w, work* memory_bound_part) {
    const double flops = n.op->flops ? n.op->flops(g, n) : 0.0;
    double written = 0, read = 0;
    for (tensor_id t : n.outputs) written += numel(g, t);
    for (tensor_id t : n.inputs) read += numel(g, t);
    w.flops += flops;
    if (gemm_like(flops, written)) {
        w.gemm_flops += flops;
        w.gemm_elements += read + written;
    } else {
        w.memory_bound_flops += flops;
        w.memory_bound_elements += read + written;
        if (memory_bound_part) {
            memory_bound_part->flops += flops;
            memory_bound_part->memory_bound_flops += flops;
            memory_bound_part->memory_bound_elements += read + written;
        }
    }
}
}  // namespace loom::search::detail

namespace loom::search {

LOOM_INLINE model_profile profile_model(const graph& g, layer_partition partition) {
    if (g.forward_nodes == 0)
        throw usage_error("profile_model: the graph has no backward pass; pass the training graph "
                          "(model.training_graph()), whose backward the profile measures");
    model_profile m;
    m.partition = std::move(partition);
    const std::size_t forward = g.forward_nodes;
    std::vector<int> layer_of_node(g.nodes.size(), -1);
    for (std::size_t l = 0; l < m.partition.layers.size(); ++l)
        for (node_id n : m.partition.layers[l].nodes) layer_of_node[static_cast<std::size_t>(n)] = static_cast<int>(l);
    const int last = static_cast<int>(m.partition.layers.size()) - 1;
    m.forward_rounds = m.partition.rounds;
    // With rounds, the earlier rounds repeat the last one's forward work without keeping
    // anything: the profile measures the last round, and the cost model multiplies.
    const auto earlier_round = [&](std::size_t i) {
        return m.partition.rounds > 1 && i < m.partition.round_of.size() && m.partition.round_of[i] >= 0 &&
               m.partition.round_of[i] < m.partition.rounds - 1;
    };
    for (std::size_t i = forward; i < g.nodes.size(); ++i) {
        const node_id f = g.nodes[i].forward_of;
        layer_of_node[i] = f != no_id && layer_of_node[static_cast<std::size_t>(f)] >= 0
                               ? layer_of_node[static_cast<std::size_t>(f)]
                               : last;
    }

    m.layers.resize(m.partition.layers.size());
    for (std::size_t l = 0; l < m.layers.size(); ++l) {
        m.layers[l].name = m.partition.layers[l].name;
        m.layers[l].role = m.partition.layers[l].role;
        m.layers[l].class_id = m.partition.layers[l].class_id;
    }
    // Which tensors the backward reads, and which later layers read.
    std::vector<bool> read_by_backward(g.tensors.size(), false);
    std::vector<int> last_reader_layer(g.tensors.size(), -1);
    for (std::size_t i = 0; i < g.nodes.size(); ++i)
        for (tensor_id t : g.nodes[i].inputs) {
            if (i >= forward) read_by_backward[static_cast<std::size_t>(t)] = true;
            else last_reader_layer[static_cast<std::size_t>(t)] =
                std::max(last_reader_layer[static_cast<std::size_t>(t)], layer_of_node[i]);
        }

    std::int64_t granularity = 0;
    std::vector<bool> entered(g.tensors.size(), false);
    int entered_layer = -1;
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
        const node& n = g.nodes[i];
        const int l = layer_of_node[i];
        if (l < 0 || earlier_round(i)) continue;
        layer_profile& lp = m.layers[static_cast<std::size_t>(l)];
        if (i >= forward) {
            detail::add_node_work(g, n, lp.backward);
            continue;
        }
        if (l != entered_layer) {
            std::fill(entered.begin(), entered.end(), false);
            entered_layer = l;
        }
        detail::add_node_work(g, n, lp.forward, &lp.memory_bound_forward);
        double written = 0;
        for (tensor_id t : n.outputs) written += detail::numel(g, t);
        const bool cheap = !detail::gemm_like(n.op->flops ? n.op->flops(g, n) : 0.0, written);
        for (tensor_id t : n.outputs) {
            if (read_by_backward[static_cast<std::size_t>(t)]) {
                lp.saved_elements += detail::numel(g, t);
                if (cheap) lp.cheap_saved_elements += detail::numel(g, t);
            }
            if (last_reader_layer[static_cast<std::size_t>(t)] > l) lp.output_elements += detail::numel(g, t);
        }
        for (tensor_id t : n.inputs) {
            const tensor_desc& td = g.tensor(t);
            if (td.role == tensor_role::activation && td.producer != no_id &&
                layer_of_node[static_cast<std::size_t>(td.producer)] != l && !entered[static_cast<std::size_t>(t)]) {
                entered[static_cast<std::size_t>(t)] = true;  // counted once per layer: layers read it in order
                lp.input_elements += detail::numel(g, t);
            }
        }
        if (n.op->name == "attention")
            if (auto h = n.sig.find("h")) granularity = std::gcd(granularity, n.sig.vars[static_cast<std::size_t>(*h)].extent);
    }
    for (tensor_id p : g.parameters) {
        m.parameters += detail::numel(g, p);
        for (const auto& a : g.tensor(p).dims)  // a vocabulary need not divide (plan::splits_unevenly)
            if (a.dim != Dim::Vocab::id) granularity = std::gcd(granularity, a.extent);
    }
    // A parameter belongs to the first layer that reads it; a later layer that reads it too
    // (the LM head of a tied embedding) holds a copy when it sits on another stage.
    std::vector<int> owner(g.tensors.size(), -1), counted_in(g.tensors.size(), -1);
    for (std::size_t i = 0; i < forward; ++i) {
        const int l = layer_of_node[i];
        if (l < 0) continue;
        for (tensor_id t : g.nodes[i].inputs) {
            if (g.tensor(t).role != tensor_role::parameter) continue;
            if (counted_in[static_cast<std::size_t>(t)] == l) continue;
            counted_in[static_cast<std::size_t>(t)] = l;
            int& o = owner[static_cast<std::size_t>(t)];
            layer_profile& lp = m.layers[static_cast<std::size_t>(l)];
            if (o < 0) {
                o = l;
                lp.parameters += detail::numel(g, t);
            } else {
                lp.shared_from = o;
                lp.shared_parameters += detail::numel(g, t);
            }
        }
    }
    m.tp_granularity = granularity > 0 ? granularity : 1;

    // The residual stream: the activation entering the first repeated layer.
    const auto repeated = m.partition.repeated();
    if (!repeated.empty()) {
        const layer_profile& first = m.layers[static_cast<std::size_t>(repeated.front())];
        m.residual_elements = first.input_elements;
    }
    // Residual joins: adds whose output is as large as the residual stream.
    for (std::size_t i = 0; i < forward; ++i) {
        const node& n = g.nodes[i];
        if (layer_of_node[i] < 0 || earlier_round(i) || n.op->name != "add" || m.residual_elements <= 0) continue;
        if (detail::numel(g, n.outputs[0]) == m.residual_elements) ++m.layers[static_cast<std::size_t>(layer_of_node[i])].residual_joins;
    }
    // The batch: the leading extent of the first graph input (tokens [batch, seq]).
    if (!g.inputs.empty() && g.tensor(g.inputs.front()).dims.rank() > 0)
        m.batch = g.tensor(g.inputs.front()).dims.extent(0);
    return m;
}

}  // namespace loom::search
#endif  // LOOM_HEADER_DEFINITIONS
