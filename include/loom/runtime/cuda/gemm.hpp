#pragma once
// Matrix products on the GPU through cuBLASLt, row-major like loom::host::gemm:
//
//   C = op(A) op(B) (+ C when accumulate),   op(A): m x k,  op(B): k x n,  C: m x n
//
// A is stored m x k (rows lda apart, lda >= k), or k x m (lda >= m) when transposed; B is
// k x n (ldb >= n) or n x k (ldb >= k); C is m x n (ldc >= n). A leading dimension of 0 means
// the packed one. T is float or loom::bfloat16; the products accumulate in float (float:
// exact fp32 by default, TF32 tensor cores on request). Optional epilogues, fused into the
// same kernel:
//
//   bias         C = op(A) op(B) (+ C) + bias[n]           bias broadcast over the m rows
//   bias_gelu    aux = op(A) op(B) + bias[n],  C = gelu(aux)
//                (tanh approximation; aux keeps the pre-activation for the backward)
//   dgelu_bgrad  C = (op(A) op(B)) * gelu'(aux),  bias_grad[n] = sum over the rows of C
//   bgrad_a      C = op(A) op(B),  bias_grad[m] = sum over k of op(A)
//   bgrad_b      C = op(A) op(B),  bias_grad[n] = sum over k of op(B)
//
// In a linear layer y = x W^T + b (x: tokens x in, W: out x in): the forward is
// {A = x, B = W, transpose_b, bias} (bias_gelu before a GELU); the weight gradient
// dW = dy^T x is {A = dy, transpose_a, B = x, bgrad_a}, whose bias_grad is db; and the input
// gradient through a GELU, dpre = (dy W2) * gelu'(pre), is {A = dy, B = W2, dgelu_bgrad,
// aux = pre}, which also gives the first layer's db. aux (m x n, rows ldaux apart) is in T;
// cuBLASLt needs ldaux to be a multiple of 8, so pad it when n is not. bias and bias_grad
// are in T too.
//
// A gemm_engine owns a cuBLASLt handle and one workspace, made once. Each distinct problem
// (types, transposes, sizes, leading dimensions, epilogue, pointer alignments) is planned on
// first use: descriptors made and an algorithm chosen by cuBLASLt's heuristic, then cached,
// so later calls only set the epilogue pointers and launch. One plan per problem, a fixed
// workspace and no atomics in cuBLASLt's split-k reductions make results bit-identical run to
// run on one GPU (see gemm.cu). An engine belongs to one device and runs one product at a
// time: calls on two streams must not overlap, as they would share the workspace; give each
// stream its own engine.
#include <cstddef>
#include <cstdint>
#include <memory>

#include <loom/core/bfloat16.hpp>
#include <loom/runtime/cuda/device.hpp>

namespace loom::cuda {

enum class gemm_epilogue { none, bias, bias_gelu, dgelu_bgrad, bgrad_a, bgrad_b };

const char* to_string(gemm_epilogue e) noexcept;

template <class T>
struct gemm_args {
    bool transpose_a = false, transpose_b = false;
    std::int64_t m = 0, n = 0, k = 0;
    const T* a = nullptr;
    std::int64_t lda = 0;  // 0: packed
    const T* b = nullptr;
    std::int64_t ldb = 0;
    T* c = nullptr;
    std::int64_t ldc = 0;
    bool accumulate = false;  // C += op(A) op(B) instead of C = ...; not with the GELU epilogues
    gemm_epilogue epilogue = gemm_epilogue::none;
    const T* bias = nullptr;  // bias, bias_gelu: n values
    T* bias_grad = nullptr;   // dgelu_bgrad, bgrad_b: n values; bgrad_a: m values
    T* aux = nullptr;         // bias_gelu writes it, dgelu_bgrad reads it: m x n
    std::int64_t ldaux = 0;   // 0: n; must be a multiple of 8
    bool allow_tf32 = false;  // float only: TF32 tensor cores (10-bit mantissa products)
};

class gemm_engine {
public:
    static constexpr std::size_t default_workspace_bytes = std::size_t{32} << 20;

    // On the current device.
    explicit gemm_engine(std::size_t workspace_bytes = default_workspace_bytes);
    ~gemm_engine();
    gemm_engine(const gemm_engine&) = delete;
    gemm_engine& operator=(const gemm_engine&) = delete;

    // Queues the product on stream s. Throws usage_error for bad arguments (naming them) and
    // cuda_error when cuBLASLt has no algorithm or fails.
    template <class T>
    void run(const gemm_args<T>& args, stream_handle s);

    // Whether cuBLASLt has an algorithm for this problem (plans and caches it when it has).
    template <class T>
    bool supported(const gemm_args<T>& args);

    std::size_t cached_plans() const;
    std::size_t workspace_bytes() const;

private:
    struct state;
    std::unique_ptr<state> state_;
};

}  // namespace loom::cuda
