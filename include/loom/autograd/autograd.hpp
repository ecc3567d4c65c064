#pragma once
// Reverse-mode differentiation as a graph transformation: the backward pass is appended
// to the same graph as ordinary nodes (marked `backward`, pointing at the forward node
// they differentiate), so plans partition it and programs run it like the forward pass.
//
// For every parameter p the graph afterwards holds a tensor "grad/<p>" with role
// `gradient`, listed in graph::gradients. A tensor read by several ops accumulates its
// gradient with `add`; a parameter that does not reach the loss gets a zero gradient.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/builder.hpp>
#include <loom/ops/add.hpp>
#include <loom/ops/fill.hpp>
#include <loom/ops/identity.hpp>

namespace loom {

LOOM_INLINE void build_backward(graph_builder& b);

}  // namespace loom

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom {

LOOM_INLINE void build_backward(graph_builder& b) {
    const graph& g = b.view();
    if (g.loss == no_id) throw usage_error("build_backward: the graph has no loss; call graph_builder::set_loss first");
    if (!g.gradients.empty()) throw usage_error("build_backward: the graph already has a backward pass");

    const std::size_t forward_nodes = g.nodes.size();
    b.mutable_graph().forward_nodes = forward_nodes;
    // Which tensors depend on a parameter (forward sweep) ...
    std::vector<bool> depends(g.tensors.size(), false);
    for (tensor_id p : g.parameters) depends[static_cast<std::size_t>(p)] = true;
    for (std::size_t i = 0; i < forward_nodes; ++i) {
        const node& n = g.nodes[i];
        if (!n.op->differentiable()) continue;
        bool any = false;
        for (tensor_id t : n.inputs) any = any || depends[static_cast<std::size_t>(t)];
        for (tensor_id t : n.outputs) depends[static_cast<std::size_t>(t)] = any;
    }
    // ... and which the loss depends on (backward sweep).
    std::vector<bool> reaches_loss(g.tensors.size(), false);
    reaches_loss[static_cast<std::size_t>(g.loss)] = true;
    for (std::size_t i = forward_nodes; i-- > 0;) {
        const node& n = g.nodes[i];
        bool any = false;
        for (tensor_id t : n.outputs) any = any || reaches_loss[static_cast<std::size_t>(t)];
        if (any)
            for (tensor_id t : n.inputs) reaches_loss[static_cast<std::size_t>(t)] = true;
    }

    std::vector<std::optional<tensor>> grad(g.tensors.size());
    // A gradient has the axes of its tensor; one may serve several tensors of one shape (an
    // add's inputs and output).
    auto twin = [&](tensor_id gradient, tensor_id of) {
        tensor_desc& d = b.mutable_graph().tensor(gradient);
        if (d.role == tensor_role::activation && std::find(d.twin_of.begin(), d.twin_of.end(), of) == d.twin_of.end())
            d.twin_of.push_back(of);
    };
    auto accumulate = [&](tensor_id t, tensor contribution, const node& from) {
        const shape& want = b.view().tensor(t).dims;
        if (!same_extents(contribution.dims(), want))
            throw error("build_backward: the backward rule of " + std::string(from.op->name) + " '" + from.name +
                        "' produced a gradient of shape " + contribution.dims().to_string() + " for '" +
                        b.view().tensor(t).name + "' of shape " + want.to_string() + "; the op's backward is wrong");
        twin(contribution.id, t);
        auto& slot = grad[static_cast<std::size_t>(t)];
        slot = slot ? ops::add(*slot, contribution) : contribution;
        twin(slot->id, t);
    };

    grad[static_cast<std::size_t>(g.loss)] = ops::fill_like(b.handle(g.loss), 1.0);
    twin(grad[static_cast<std::size_t>(g.loss)]->id, g.loss);
    for (std::size_t i = forward_nodes; i-- > 0;) {
        // A copy: the backward rule appends nodes, which may move the node vector.
        const node n = b.view().nodes[i];
        if (!n.op->differentiable()) continue;
        bool any_grad = false;
        for (tensor_id t : n.outputs) any_grad = any_grad || grad[static_cast<std::size_t>(t)].has_value();
        if (!any_grad) continue;
        std::vector<bool> needs;
        bool any_need = false;
        for (tensor_id t : n.inputs) {
            bool need = depends[static_cast<std::size_t>(t)] && reaches_loss[static_cast<std::size_t>(t)];
            needs.push_back(need);
            any_need = any_need || need;
        }
        if (!any_need) continue;

        auto forward = static_cast<node_id>(i);
        graph_builder::backward_guard guard(b, forward);
        backward_context ctx{b, forward, {}, {}, {}, needs};
        for (tensor_id t : n.inputs) ctx.inputs.push_back(b.handle(t));
        for (tensor_id t : n.outputs) {
            ctx.outputs.push_back(b.handle(t));
            const auto& gt = grad[static_cast<std::size_t>(t)];
            // An output no one differentiates still needs a gradient if a sibling has one.
            ctx.grad_outputs.push_back(gt ? gt : std::optional<tensor>(ops::fill_like(b.handle(t), 0.0)));
            twin(ctx.grad_outputs.back()->id, t);
        }
        gradients result = n.op->backward(ctx);
        if (result.size() != n.inputs.size())
            throw error("build_backward: the backward rule of " + std::string(n.op->name) + " returned " +
                        std::to_string(result.size()) + " gradients for " + std::to_string(n.inputs.size()) +
                        " inputs");
        for (std::size_t k = 0; k < n.inputs.size(); ++k)
            if (needs[k] && result[k]) accumulate(n.inputs[k], *result[k], n);
    }

    graph& mg = b.mutable_graph();
    std::vector<bool> claimed(mg.tensors.size(), false);
    std::vector<tensor_id> params = mg.parameters;
    for (tensor_id p : params) {
        tensor gt = grad[static_cast<std::size_t>(p)] ? *grad[static_cast<std::size_t>(p)] : tensor{};
        // A parameter that does not reach the loss has a zero gradient.
        if (!gt.builder) gt = ops::fill_like(b.handle(p), 0.0);
        twin(gt.id, p);
        claimed.resize(b.view().tensors.size(), false);
        const tensor_desc& d = b.view().tensor(gt.id);
        // A gradient tensor must be owned by one parameter only and be an intermediate.
        if (claimed[static_cast<std::size_t>(gt.id)] || d.role != tensor_role::activation) {
            gt = ops::identity(gt);
            twin(gt.id, p);
            claimed.resize(b.view().tensors.size(), false);
        }
        claimed[static_cast<std::size_t>(gt.id)] = true;
        graph& g2 = b.mutable_graph();
        g2.tensor(gt.id).role = tensor_role::gradient;
        g2.tensor(gt.id).gradient_of = p;
        g2.tensor(gt.id).name = "grad/" + g2.tensor(p).name;
        g2.gradients.emplace_back(p, gt.id);
    }
}

}  // namespace loom
#endif  // LOOM_HEADER_DEFINITIONS
