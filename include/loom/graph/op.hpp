#pragma once
// What every op kind is at run time: a name, a dimension signature and a backward rule.
// An op kind is written once as a struct (see ops/linear.hpp for the pattern):
//
//   struct Gelu {
//       static constexpr std::string_view name = "gelu";
//       static constexpr signature sig = parse_signature("... -> ...");
//       static gradients backward(backward_context&);   // optional: absent = not differentiable
//   };
//
// and `op_def_of<Gelu>()` is its one run-time description, which nodes point to. Kernels
// are not part of an op: each backend maps the op kind to its own (runtime/host/kernels/).
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include <loom/core/signature.hpp>
#include <loom/graph/graph.hpp>

namespace loom {

struct backward_context;
struct tensor;
class graph_builder;
class attributes;
using gradients = std::vector<std::optional<tensor>>;

// Where one piece of a partitioned node sits inside the node it was cut from: for every
// variable of the node's bound signature, the half-open range [begin, end) of its extent.
struct piece_ranges {
    std::vector<std::int64_t> begin;
    std::vector<std::int64_t> end;
};

// Appends a node of kind Op to a builder: defined in graph/builder.hpp (needs the builder).
template <class Op>
std::vector<tensor> apply_op_erased(graph_builder& b, std::span<const tensor> inputs, attributes attrs);

struct op_def {
    std::string_view name;
    signature sig;
    gradients (*backward)(backward_context&) = nullptr;
    // Floating-point operations of one node, for the cost model.
    double (*flops)(const graph&, const node&) = nullptr;
    // Appends a node of this kind with new inputs (partitioning rebuilds nodes on pieces).
    std::vector<tensor> (*apply)(graph_builder&, std::span<const tensor>, attributes) = nullptr;
    // The attributes of one piece of a node cut by a plan, for ops whose attributes depend
    // on the extents they see (a head count, a vocabulary offset). Absent: unchanged.
    attributes (*piece_attributes)(const node&, const piece_ranges&) = nullptr;
    // Executed by a communicator, not by a kernel (runtime/host/distributed_runner.hpp).
    bool communication = false;
    // The op reinterprets its input's layout (reshape): no split of it is meaningful.
    bool opaque_layout = false;
    // The outputs are linear in all inputs together (f(a + a', b + b') = f(a, b) + f(a', b')):
    // a piece may add summand k of each input's partial sums into summand k of its outputs
    // (partition/apply.hpp), so partial gradients meet without being reduced first.
    bool linear = false;
    // The op reads its inputs only for their shapes (fill_like): partitioning gives each
    // piece its output shape and moves no data to it.
    bool shape_only_inputs = false;
    // Outputs (bit i: output i) kept in float when a program stores its tensors in a
    // narrower type (precision::bf16): statistics that later kernels exponentiate or
    // subtract (attention's logsumexp) and losses, which a bf16 would round to 3 digits.
    std::uint32_t float_outputs = 0;

    bool differentiable() const { return backward != nullptr; }
};

template <class Op>
concept op_kind = requires {
    { Op::name } -> std::convertible_to<std::string_view>;
    { Op::sig } -> std::convertible_to<signature>;
};

namespace detail {

template <class Op>
double default_flops(const graph& g, const node& n) {
    // One operation per output element: right for elementwise ops; GEMM-like ops override.
    double total = 0;
    for (tensor_id t : n.outputs) total += static_cast<double>(g.tensor(t).dims.numel());
    return total;
}

template <op_kind Op>
op_def make_op_def() {
    op_def d{Op::name, Op::sig};
    d.apply = &apply_op_erased<Op>;
    if constexpr (requires { Op::communication; }) d.communication = Op::communication;
    if constexpr (requires { Op::opaque_layout; }) d.opaque_layout = Op::opaque_layout;
    if constexpr (requires { Op::shape_only_inputs; }) d.shape_only_inputs = Op::shape_only_inputs;
    if constexpr (requires { Op::linear; }) d.linear = Op::linear;
    if constexpr (requires { Op::float_outputs; }) d.float_outputs = Op::float_outputs;
    if constexpr (requires(const node& n, const piece_ranges& r) { Op::piece_attributes(n, r); })
        d.piece_attributes = &Op::piece_attributes;
    if constexpr (requires(backward_context & c) { Op::backward(c); }) d.backward = &Op::backward;
    if constexpr (requires(const graph& g, const node& n) { Op::flops(g, n); })
        d.flops = &Op::flops;
    else
        d.flops = &default_flops<Op>;
    return d;
}

}  // namespace detail

// The single run-time description of op kind `Op`; nodes compare op kinds by this address.
template <op_kind Op>
const op_def& op_def_of() {
    static const op_def def = detail::make_op_def<Op>();
    return def;
}

template <op_kind Op>
bool is_op(const node& n) {
    return n.op == &op_def_of<Op>();
}

}  // namespace loom
