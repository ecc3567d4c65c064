#pragma once
// Kernels of matmul, matmul_nt and matmul_tn: one GEMM per leading index, row-major.
#include <loom/ops/matmul.hpp>
#include <loom/runtime/host/gemm.hpp>
#include <loom/runtime/host/kernel_call.hpp>

namespace loom::host {

namespace detail {
// C[g] = op(A[g]) op(B[g]) for every leading index g; A is m x k (or k x m when ta), B is
// k x n (or n x k when tb), so the leading dimensions are the stored row lengths.
template <class T>
void batched_product(const kernel_call<T>& c, transpose ta, transpose tb) {
    const std::int64_t m = c.extent("m"), n = c.extent("n"), k = c.extent("k");
    const std::int64_t batch = c.leading_numel(0);
    const std::int64_t lda = ta == transpose::no ? k : m;
    const std::int64_t ldb = tb == transpose::no ? n : k;
    if (batch == 1) {
        host::gemm<T>(ta, tb, m, n, k, T(1), c.input(0), lda, c.input(1), ldb, T(0), c.output(0), n);
        return;
    }
    host::gemm_batched<T>(ta, tb, batch, m, n, k, T(1), c.input(0), lda, m * k, c.input(1), ldb, k * n, T(0),
                          c.output(0), n, m * n);
}
}  // namespace detail

template <>
struct host_kernel<ops::Matmul> {
    template <class T>
    static void run(const kernel_call<T>& c) { detail::batched_product<T>(c, transpose::no, transpose::no); }
};

template <>
struct host_kernel<ops::MatmulNT> {
    template <class T>
    static void run(const kernel_call<T>& c) { detail::batched_product<T>(c, transpose::no, transpose::yes); }
};

template <>
struct host_kernel<ops::MatmulTN> {
    template <class T>
    static void run(const kernel_call<T>& c) { detail::batched_product<T>(c, transpose::yes, transpose::no); }
};

}  // namespace loom::host
