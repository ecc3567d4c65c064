#pragma once
// Batched matrix products over shared leading dims, in the three layouts whose gradients
// are again products of these layouts (a closed set under differentiation):
//   matmul     "... m k, ... k n -> ... m n"   C = A B     dA = dC B^T (nt),   dB = A^T dC (tn)
//   matmul_nt  "... m k, ... n k -> ... m n"   C = A B^T   dA = dC B (nn),     dB = dC^T A (tn)
//   matmul_tn  "... k m, ... k n -> ... m n"   C = A^T B   dA = B dC^T (nt),   dB = A dC (nn)
// k is contracted (a split leaves partial sums); m, n and the leading dims are spatial.
#include <loom/core/linkage.hpp>
#include <loom/graph/builder.hpp>
#include <loom/ops/linear.hpp>

namespace loom::ops {

struct Matmul {
    static constexpr std::string_view name = "matmul";
    static constexpr signature sig = parse_signature("... m k, ... k n -> ... m n");
    static double flops(const graph& g, const node& n) { return detail::gemm_flops(g, n, "k"); }
    static gradients backward(backward_context& c);
};

struct MatmulNT {
    static constexpr std::string_view name = "matmul_nt";
    static constexpr signature sig = parse_signature("... m k, ... n k -> ... m n");
    static double flops(const graph& g, const node& n) { return detail::gemm_flops(g, n, "k"); }
    static gradients backward(backward_context& c);
};

struct MatmulTN {
    static constexpr std::string_view name = "matmul_tn";
    static constexpr signature sig = parse_signature("... k m, ... k n -> ... m n");
    static double flops(const graph& g, const node& n) { return detail::gemm_flops(g, n, "k"); }
    static gradients backward(backward_context& c);
};

// C = A B
inline tensor matmul(tensor a, tensor b) { return a.builder->apply1<Matmul>({a, b}); }
// C = A B^T
inline tensor matmul_nt(tensor a, tensor b) { return a.builder->apply1<MatmulNT>({a, b}); }
// C = A^T B
inline tensor matmul_tn(tensor a, tensor b) { return a.builder->apply1<MatmulTN>({a, b}); }

}  // namespace loom::ops

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::ops {

LOOM_INLINE gradients Matmul::backward(backward_context& c) {
    const tensor& dc = *c.grad_outputs[0];
    gradients g(2);
    if (c.needs_grad[0]) g[0] = matmul_nt(dc, c.inputs[1]);
    if (c.needs_grad[1]) g[1] = matmul_tn(c.inputs[0], dc);
    return g;
}

LOOM_INLINE gradients MatmulNT::backward(backward_context& c) {
    const tensor& dc = *c.grad_outputs[0];
    gradients g(2);
    if (c.needs_grad[0]) g[0] = matmul(dc, c.inputs[1]);
    if (c.needs_grad[1]) g[1] = matmul_tn(dc, c.inputs[0]);
    return g;
}

LOOM_INLINE gradients MatmulTN::backward(backward_context& c) {
    const tensor& dc = *c.grad_outputs[0];
    gradients g(2);
    if (c.needs_grad[0]) g[0] = matmul_nt(c.inputs[1], dc);
    if (c.needs_grad[1]) g[1] = matmul(c.inputs[0], dc);
    return g;
}

}  // namespace loom::ops
#endif  // LOOM_HEADER_DEFINITIONS
