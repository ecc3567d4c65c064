#pragma once
// Which CUDA kernels run each of loom's ops: the GPU's counterpart of the host kernel table
// (runtime/host/kernel_table.hpp). Each entry reads the node's shapes and attributes exactly
// as the op's host kernel does and launches on the executor's stream. An op missing here is
// refused by the executor when it is built.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <unordered_map>

#include <cmath>
#include <string>

#include <loom/core/error.hpp>
#include <loom/runtime/cuda/attention.hpp>
#include <loom/runtime/cuda/cross_entropy.hpp>
#include <loom/runtime/cuda/device.hpp>
#include <loom/runtime/cuda/elementwise.hpp>
#include <loom/runtime/cuda/embedding.hpp>
#include <loom/runtime/cuda/gemm.hpp>
#include <loom/runtime/cuda/layout.hpp>
#include <loom/runtime/cuda/norms.hpp>
#include <loom/runtime/cuda/op_kernels_partition.hpp>
#include <loom/runtime/host/kernel_call.hpp>

namespace loom::cuda {

// What a launch may use besides the node's own tensors.
struct launch_context {
    stream_handle stream = nullptr;
    gemm_engine* gemm = nullptr;
    void* workspace = nullptr;  // at least the largest workspace_bytes of the program's kernels
    std::size_t workspace_bytes = 0;
};

template <class T>
struct op_kernel {
    void (*launch)(const host::kernel_call<T>&, const launch_context&) = nullptr;
    // Scratch the launch needs (null: none); asked once per node when the executor is built.
    std::size_t (*workspace_bytes)(const host::kernel_call<T>&) = nullptr;
};

namespace op_kernels {

template <class T>
void add(const host::kernel_call<T>& c, const launch_context& x) {
    cuda::add(c.input(0), c.input(1), c.output(0), c.output_numel(0), x.stream);
}

template <class T>
void gelu(const host::kernel_call<T>& c, const launch_context& x) {
    cuda::gelu_forward(c.input(0), c.output(0), c.output_numel(0), x.stream);
}

// (dy, x) -> dx
template <class T>
void gelu_grad(const host::kernel_call<T>& c, const launch_context& x) {
    cuda::gelu_backward(c.input(1), c.input(0), c.output(0), c.output_numel(0), x.stream);
}

template <class T>
void split_heads(const host::kernel_call<T>& c, const launch_context& x) {
    cuda::split_heads(c.input(0), c.output(0), c.extent("b"), c.extent("s"), c.extent("h"), c.extent("d"), x.stream);
}

template <class T>
void merge_heads(const host::kernel_call<T>& c, const launch_context& x) {
    cuda::merge_heads(c.input(0), c.output(0), c.extent("b"), c.extent("s"), c.extent("h"), c.extent("d"), x.stream);
}

// db[j] = sum over leading rows of dy[r, j]
template <class T>
void sum_leading(const host::kernel_call<T>& c, const launch_context& x) {
    const std::int64_t n = c.extent("n");
    cuda::sum_rows(c.input(0), c.output(0), c.input_numel(0) / n, n, x.workspace, x.stream);
}
template <class T>
std::size_t sum_leading_workspace(const host::kernel_call<T>& c) {
    const std::int64_t n = c.extent("n");
    return sum_rows_workspace_bytes(c.input_numel(0) / n, n);
}

template <class T>
void fill_like(const host::kernel_call<T>& c, const launch_context& x) {
    cuda::fill(c.output(0), static_cast<float>(c.attrs().template get<double>("value")), c.output_numel(0), x.stream);
}

// Rows of a row-wise op: the leading elements of input `i` over its last extent `cols`.
template <class T>
std::int64_t rows_of(const host::kernel_call<T>& c, std::size_t i, std::int64_t cols) {
    return cols > 0 ? c.input_numel(i) / cols : 0;
}

// (x, gamma, beta) -> y
template <class T>
void layer_norm(const host::kernel_call<T>& c, const launch_context& x) {
    const std::int64_t h = c.extent("h");
    cuda::layer_norm_forward(c.input(0), c.input(1), c.input(2), c.output(0), nullptr, nullptr, rows_of(c, 0, h), h,
                             static_cast<float>(c.attrs().template get<double>("eps")), x.stream);
}

// (dy, x, gamma) -> (dx, dgamma, dbeta); the statistics are recomputed from x, as the op says.
template <class T>
void layer_norm_grad(const host::kernel_call<T>& c, const launch_context& x) {
    const std::int64_t h = c.extent("h");
    cuda::layer_norm_backward(c.input(0), c.input(1), c.input(2), nullptr, nullptr, c.output(0), c.output(1),
                              c.output(2), rows_of(c, 1, h), h, static_cast<float>(c.attrs().template get<double>("eps")),
                              x.workspace, x.stream);
}
template <class T>
std::size_t layer_norm_grad_workspace(const host::kernel_call<T>& c) {
    const std::int64_t h = c.extent("h");
    return layer_norm_backward_workspace_bytes(rows_of(c, 1, h), h);
}

// (logits, targets) -> loss, a float scalar in every precision (ops::CrossEntropy's
// float_outputs). A target outside the vocabulary makes the loss NaN (the kernel cannot throw).
template <class T>
void cross_entropy(const host::kernel_call<T>& c, const launch_context& x) {
    const std::int64_t rows = c.input_numel(1);
    cuda::cross_entropy_forward(c.input(0), c.index_input(1), static_cast<float*>(c.out[0]),
                                static_cast<float*>(x.workspace), nullptr, rows, c.extent("v"),
                                c.attrs().template get<std::int64_t>("ignore_index"),
                                c.attrs().template get<double>("normalizer"), nullptr, x.stream);
}
template <class T>
std::size_t cross_entropy_workspace(const host::kernel_call<T>& c) {
    return static_cast<std::size_t>(c.input_numel(1)) * sizeof(float);
}

// (dloss, logits, targets) -> dlogits
template <class T>
void cross_entropy_grad(const host::kernel_call<T>& c, const launch_context& x) {
    cuda::cross_entropy_backward(c.input(0), c.input(1), c.index_input(2), nullptr, c.output(0), c.input_numel(2),
                                 c.extent("v"), c.attrs().template get<std::int64_t>("ignore_index"),
                                 c.attrs().template get<double>("normalizer"), nullptr, x.stream);
}

// (ids, table) -> rows of the table; ids outside the table's slice of the vocabulary give zeros.
template <class T>
void embedding(const host::kernel_call<T>& c, const launch_context& x) {
    cuda::embedding_forward(c.index_input(0), c.input(1), c.output(0), c.input_numel(0), c.extent("v"), c.extent("h"),
                            c.attrs().template get<std::int64_t>("vocab"),
                            c.attrs().template get_or<std::int64_t>("row_offset", 0), nullptr, x.stream);
}

// (dy, ids) -> dtable, deterministic (sorted by row, summed in position order)
template <class T>
void embedding_grad(const host::kernel_call<T>& c, const launch_context& x) {
    cuda::embedding_backward(c.input(0), c.index_input(1), c.output(0), c.input_numel(1), c.extent("v"), c.extent("h"),
                             c.attrs().template get<std::int64_t>("vocab"),
                             c.attrs().template get_or<std::int64_t>("row_offset", 0), x.workspace, nullptr, x.stream);
}
template <class T>
std::size_t embedding_grad_workspace(const host::kernel_call<T>& c) {
    return embedding_backward_workspace_bytes(c.input_numel(1), c.extent("v"));
}

// x [m, k] W[n, k]^T (+ b) -> y [m, n]. A row-parallel piece (attribute bias = 0) leaves the
// bias to piece 0, as on the host.
template <class T>
void linear_forward(const host::kernel_call<T>& c, const launch_context& x, const T* bias) {
    const std::int64_t k = c.extent("k"), n = c.extent("n");
    gemm_args<T> g;
    g.transpose_b = true;
    g.m = rows_of(c, 0, k);
    g.n = n;
    g.k = k;
    g.a = c.input(0);
    g.b = c.input(1);
    g.c = c.output(0);
    if (bias) {
        g.epilogue = gemm_epilogue::bias;
        g.bias = bias;
    }
    x.gemm->run(g, x.stream);
}
template <class T>
void linear(const host::kernel_call<T>& c, const launch_context& x) {
    linear_forward(c, x, static_cast<const T*>(nullptr));
}
template <class T>
void linear_bias(const host::kernel_call<T>& c, const launch_context& x) {
    linear_forward(c, x, c.attrs().template get_or<std::int64_t>("bias", 1) != 0 ? c.input(2) : nullptr);
}

// dx [m, k] = dy [m, n] W [n, k]
template <class T>
void linear_grad_input(const host::kernel_call<T>& c, const launch_context& x) {
    const std::int64_t k = c.extent("k"), n = c.extent("n");
    gemm_args<T> g;
    g.m = rows_of(c, 0, n);
    g.n = k;
    g.k = n;
    g.a = c.input(0);
    g.b = c.input(1);
    g.c = c.output(0);
    x.gemm->run(g, x.stream);
}

// dW [n, k] = dy [m, n]^T x [m, k]
template <class T>
void linear_grad_weight(const host::kernel_call<T>& c, const launch_context& x) {
    const std::int64_t k = c.extent("k"), n = c.extent("n");
    gemm_args<T> g;
    g.transpose_a = true;
    g.m = n;
    g.n = k;
    g.k = rows_of(c, 0, n);
    g.a = c.input(0);
    g.b = c.input(1);
    g.c = c.output(0);
    x.gemm->run(g, x.stream);
}

template <class T>
attention_dims attention_dims_of(const host::kernel_call<T>& c) {
    const std::int64_t d = c.extent("d"), e = c.extent("e");
    if (d != e)
        throw usage_error("cuda attention (node '" + c.n.name + "'): query/key head dim " + std::to_string(d) +
                          " differs from the value head dim " + std::to_string(e) +
                          "; the GPU kernel needs them equal (run this op on the host backend)");
    attention_dims dims;
    dims.batch = c.extent("b");
    dims.heads = c.extent("h");
    dims.queries = c.extent("s");
    dims.keys = c.extent("t");
    dims.head_dim = d;
    dims.causal = c.attrs().template get_or<std::int64_t>("causal", 1) != 0;
    dims.scale = c.attrs().template get_or<double>("scale", 1.0 / std::sqrt(static_cast<double>(d)));
    return dims;
}

// (q, k, v) -> (out, lse); lse is float in every precision (ops::Attention's float_outputs).
template <class T>
void attention(const host::kernel_call<T>& c, const launch_context& x) {
    cuda::attention_forward(c.input(0), c.input(1), c.input(2), c.output(0), static_cast<float*>(c.out[1]),
                            attention_dims_of(c), x.stream);
}
template <class T>
std::size_t attention_check(const host::kernel_call<T>& c) {
    (void)attention_dims_of(c);  // refuses an unsupported shape when the executor is built
    return 0;
}

// (dout, q, k, v, out, lse) -> (dq, dk, dv)
template <class T>
void attention_grad(const host::kernel_call<T>& c, const launch_context& x) {
    cuda::attention_backward(c.input(0), c.input(1), c.input(2), c.input(3), c.input(4),
                             static_cast<const float*>(c.in[5]), c.output(0), c.output(1), c.output(2), x.workspace,
                             attention_dims_of(c), x.stream);
}
template <class T>
std::size_t attention_grad_workspace(const host::kernel_call<T>& c) {
    return attention_backward_workspace_bytes(attention_dims_of(c));
}

}  // namespace op_kernels

// The entry for an op name, or null when the CUDA backend has no kernel for it.
template <class T>
const op_kernel<T>* find_op_kernel(std::string_view op_name) {
    static const std::unordered_map<std::string_view, op_kernel<T>> table = {
        {"add", {&op_kernels::add<T>}},
        {"gelu", {&op_kernels::gelu<T>}},
        {"gelu_grad", {&op_kernels::gelu_grad<T>}},
        {"split_heads", {&op_kernels::split_heads<T>}},
        {"merge_heads", {&op_kernels::merge_heads<T>}},
        {"sum_leading", {&op_kernels::sum_leading<T>, &op_kernels::sum_leading_workspace<T>}},
        {"fill_like", {&op_kernels::fill_like<T>}},
        {"layer_norm", {&op_kernels::layer_norm<T>}},
        {"layer_norm_grad", {&op_kernels::layer_norm_grad<T>, &op_kernels::layer_norm_grad_workspace<T>}},
        {"cross_entropy", {&op_kernels::cross_entropy<T>, &op_kernels::cross_entropy_workspace<T>}},
        {"cross_entropy_grad", {&op_kernels::cross_entropy_grad<T>}},
        {"embedding", {&op_kernels::embedding<T>}},
        {"embedding_grad", {&op_kernels::embedding_grad<T>, &op_kernels::embedding_grad_workspace<T>}},
        {"linear", {&op_kernels::linear<T>}},
        {"linear_bias", {&op_kernels::linear_bias<T>}},
        {"linear_grad_input", {&op_kernels::linear_grad_input<T>}},
        {"linear_grad_weight", {&op_kernels::linear_grad_weight<T>}},
        {"attention", {&op_kernels::attention<T>, &op_kernels::attention_check<T>}},
        {"attention_grad", {&op_kernels::attention_grad<T>, &op_kernels::attention_grad_workspace<T>}},
        // The ops of partitioned plans' device programs (op_kernels_partition.hpp); their
        // checks refuse, when the executor is built, a tensor stored otherwise than read.
        {"assemble", {&op_kernels::assemble<T>, &op_kernels::assemble_workspace<T>}},
        {"identity", {&op_kernels::identity<T>, &op_kernels::identity_check<T>}},
        {"chunk_logsumexp", {&op_kernels::chunk_logsumexp<T>, &op_kernels::chunk_logsumexp_check<T>}},
        {"chunk_logsumexp_grad", {&op_kernels::chunk_logsumexp_grad<T>, &op_kernels::chunk_logsumexp_grad_check<T>}},
        {"ragged_chunk_logsumexp",
         {&op_kernels::ragged_chunk_logsumexp<T>, &op_kernels::ragged_chunk_logsumexp_check<T>}},
        {"ragged_chunk_logsumexp_grad",
         {&op_kernels::ragged_chunk_logsumexp_grad<T>, &op_kernels::ragged_chunk_logsumexp_grad_check<T>}},
        {"pick_target", {&op_kernels::pick_target<T>, &op_kernels::pick_target_check<T>}},
        {"pick_target_grad", {&op_kernels::pick_target_grad<T>, &op_kernels::pick_target_grad_check<T>}},
        {"cross_entropy_from_chunks",
         {&op_kernels::cross_entropy_from_chunks<T>, &op_kernels::cross_entropy_from_chunks_check<T>}},
        {"cross_entropy_from_chunks_grad",
         {&op_kernels::cross_entropy_from_chunks_grad<T>, &op_kernels::cross_entropy_from_chunks_grad_check<T>}},
    };
    auto found = table.find(op_name);
    return found == table.end() ? nullptr : &found->second;
}

}  // namespace loom::cuda
