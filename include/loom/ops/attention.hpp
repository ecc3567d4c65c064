#pragma once
// Scaled dot-product self-attention, as PyTorch's
// F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale):
//   out[i] = sum_j P_ij v_j,   P_ij = exp(S_ij - lse_i),   S_ij = scale * q_i . k_j,
//   lse_i = log sum_j exp(S_ij), the sums over j <= i when causal and over every key otherwise.
//
//   attention       "b h s^ d^, b h t^ d^, b h t^ e^ -> b h s^ e^, b h s^"
//   attention_grad  "b h s^ e^, b h s^ d^, b h t^ d^, b h t^ e^, b h s^ e^, b h s^
//                      -> b h s^ d^, b h t^ d^, b h t^ e^"
// Batch and heads split cleanly. The sequence and head dims are frozen: a softmax row needs
// every key, and a split of d or e would need the scores (and lse) reduced across parts.
//
// lse is kept for the backward, which recomputes P from q, k and lse (flash-attention
// style), so no s x t matrix outlives a kernel. With D_i = sum_e dout_ie out_ie:
//   dv = P^T dout,   dP = dout v^T,   dS = P * (dP - D),   dq = scale dS k,   dk = scale dS^T q.
// The backward propagates the gradient of `out` only; lse is an output for the backward's
// sake, and a graph that differentiates through it is refused.
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/builder.hpp>
#include <loom/ops/fill.hpp>

namespace loom::ops {

namespace detail {

inline double attention_extent(const node& n, std::string_view var) {
    auto v = n.sig.find(var);
    return v ? static_cast<double>(n.sig.vars[static_cast<std::size_t>(*v)].extent) : 0.0;
}

// Query-key pairs that carry a score: the lower triangle when causal.
inline double attention_scored_pairs(const node& n) {
    const double s = attention_extent(n, "s"), t = attention_extent(n, "t");
    const bool causal = n.attrs.get_or<std::int64_t>("causal", 1) != 0;
    return attention_extent(n, "b") * attention_extent(n, "h") * (causal ? s * (s + 1) / 2 : s * t);
}

}  // namespace detail

struct AttentionGrad {
    static constexpr std::string_view name = "attention_grad";
    static constexpr signature sig = parse_signature(
        "b h s^ e^, b h s^ d^, b h t^ d^, b h t^ e^, b h s^ e^, b h s^ -> b h s^ d^, b h t^ d^, b h t^ e^");
    // The dim each variable always carries, for the plan combinators' compile-time checks.
    static constexpr std::pair<std::string_view, dim_id> variable_dims[] = {
        {"b", Dim::Batch::id}, {"h", Dim::Head::id},    {"s", Dim::Seq::id},
        {"t", Dim::Seq::id},   {"d", Dim::HeadDim::id}, {"e", Dim::HeadDim::id}};
    // Recomputing S, then dv, dP, dq and dk: 2 (3d + 2e) per scored pair.
    static double flops(const graph&, const node& n) {
        const double d = detail::attention_extent(n, "d"), e = detail::attention_extent(n, "e");
        return 2.0 * (3.0 * d + 2.0 * e) * detail::attention_scored_pairs(n);
    }
};

struct Attention {
    static constexpr std::string_view name = "attention";
    static constexpr signature sig = parse_signature("b h s^ d^, b h t^ d^, b h t^ e^ -> b h s^ e^, b h s^");
    // lse stays float in bf16 programs: the backward exponentiates S - lse.
    static constexpr std::uint32_t float_outputs = 0b10;
    // The dim each variable always carries, for the plan combinators' compile-time checks.
    static constexpr std::pair<std::string_view, dim_id> variable_dims[] = {
        {"b", Dim::Batch::id}, {"h", Dim::Head::id},    {"s", Dim::Seq::id},
        {"t", Dim::Seq::id},   {"d", Dim::HeadDim::id}, {"e", Dim::HeadDim::id}};

    static void check(const bound_signature& b, const attributes& a, std::span<const shape> in,
                      const std::string& node_name) {
        const bool causal = a.get_or<std::int64_t>("causal", 1) != 0;
        const std::int64_t s = b.vars[static_cast<std::size_t>(*b.find("s"))].extent;
        const std::int64_t t = b.vars[static_cast<std::size_t>(*b.find("t"))].extent;
        if (causal && s != t)
            throw shape_error("attention '" + node_name +
                              "': causal self-attention needs as many keys as queries, but q " + in[0].to_string() +
                              " has " + std::to_string(s) + " positions and k " + in[1].to_string() + " has " +
                              std::to_string(t) + "; pass k and v with " + std::to_string(s) +
                              " positions, or use ops::attention (not causal)");
        if (a.has("scale") && !(a.get<double>("scale") > 0.0))
            throw shape_error("attention '" + node_name + "': scale = " + std::to_string(a.get<double>("scale")) +
                              "; pass a positive scale (the default is 1/sqrt(" +
                              std::to_string(in[0].extent(3)) + "))");
    }

    // Both matrix products: 2 (d + e) per scored pair.
    static double flops(const graph&, const node& n) {
        const double d = detail::attention_extent(n, "d"), e = detail::attention_extent(n, "e");
        return 2.0 * (d + e) * detail::attention_scored_pairs(n);
    }

    static gradients backward(backward_context& c);
};

namespace detail {

inline tensor attention_out(tensor q, tensor k, tensor v, bool causal, std::optional<double> scale) {
    const double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.rank() == 4 ? q.extent(3) : 1));
    std::array<tensor, 3> ins{q, k, v};
    return q.builder->apply<Attention>(ins, {{"causal", std::int64_t{causal ? 1 : 0}}, {"scale", s}}).at(0);
}

// The backward differentiates `out` only: any gradient reaching lse other than the zeros
// autograd fills in for an unused output would be dropped.
LOOM_INLINE void require_no_lse_gradient(const backward_context& c);

}  // namespace detail

// Causal self-attention, as F.scaled_dot_product_attention(q, k, v, is_causal=True):
// q [b, h, s, d], k [b, h, s, d], v [b, h, s, e] -> [b, h, s, e]. scale defaults to 1/sqrt(d).
inline tensor causal_attention(tensor q, tensor k, tensor v, std::optional<double> scale = std::nullopt) {
    return detail::attention_out(q, k, v, true, scale);
}

// Attention over every key: q [b, h, s, d], k [b, h, t, d], v [b, h, t, e] -> [b, h, s, e].
inline tensor attention(tensor q, tensor k, tensor v, std::optional<double> scale = std::nullopt) {
    return detail::attention_out(q, k, v, false, scale);
}

}  // namespace loom::ops

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::ops::detail {

LOOM_INLINE void require_no_lse_gradient(const backward_context& c) {
    const graph& g = c.builder.view();
    const tensor_desc& dlse = g.tensor(c.grad_outputs[1]->id);
    if (dlse.producer != no_id) {
        const node& p = g.at(dlse.producer);
        if (is_op<FillLike>(p) && p.attrs.get<double>("value") == 0.0) return;
    }
    const node& fwd = c.forward_node();
    throw usage_error("attention '" + fwd.name + "': its log-sum-exp output '" + c.outputs[1].name() +
                      "' reaches the loss, but attention's backward propagates the gradient of '" +
                      c.outputs[0].name() + "' only; use the lse output outside differentiated computations");
}
}  // namespace loom::ops::detail

namespace loom::ops {

LOOM_INLINE gradients Attention::backward(backward_context& c) {
    detail::require_no_lse_gradient(c);
    std::array<tensor, 6> ins{*c.grad_outputs[0], c.inputs[0], c.inputs[1], c.inputs[2], c.outputs[0], c.outputs[1]};
    std::vector<tensor> d = c.builder.apply<AttentionGrad>(ins, c.attrs());
    gradients g(3);
    for (std::size_t i = 0; i < 3; ++i)
        if (c.needs_grad[i]) g[i] = d[i];
    return g;
}

}  // namespace loom::ops
#endif  // LOOM_HEADER_DEFINITIONS
