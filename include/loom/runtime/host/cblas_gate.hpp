#pragma once
// The one place that looks at LOOM_HAS_CBLAS. The build defines it (to 1) when it links
// OpenBLAS and puts OpenBLAS's cblas.h on the include path; everything else in loom asks
// `has_cblas` and branches with `if constexpr`, so both configurations compile the same code
// and the wrappers in loom::host::cblas exist (and throw) even without CBLAS.
#include <string>

#include <loom/core/error.hpp>

#if defined(LOOM_HAS_CBLAS) && LOOM_HAS_CBLAS
#include <cblas.h>
#endif

namespace loom::host {

#if defined(LOOM_HAS_CBLAS) && LOOM_HAS_CBLAS
inline constexpr bool has_cblas = true;
#else
inline constexpr bool has_cblas = false;
#endif

namespace cblas {

// Row-major GEMM through CBLAS: C = alpha * op(A) * op(B) + beta * C. Sizes are the CBLAS
// `int`; callers check that their 64-bit sizes fit before calling.
#if defined(LOOM_HAS_CBLAS) && LOOM_HAS_CBLAS

inline void sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                  int ldb, float beta, float* c, int ldc) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha,
                a, lda, b, ldb, beta, c, ldc);
}

inline void dgemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a, int lda,
                  const double* b, int ldb, double beta, double* c, int ldc) {
    cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha,
                a, lda, b, ldb, beta, c, ldc);
}

// OpenBLAS keeps its own worker threads; these let callers see and bound them.
inline int library_threads() { return openblas_get_num_threads(); }
inline void set_library_threads(int threads) { openblas_set_num_threads(threads); }

// e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH ... Haswell MAX_THREADS=64" plus the core it picked.
inline std::string library_description() {
    return std::string(openblas_get_config()) + " core=" + openblas_get_corename();
}

#else

[[noreturn]] inline void missing(const char* what) {
    throw usage_error(std::string("cblas::") + what +
                      ": loom was built without CBLAS; build with LOOM_HAS_CBLAS=1 and OpenBLAS's cblas.h, "
                      "or check loom::host::has_cblas first");
}

inline void sgemm(bool, bool, int, int, int, float, const float*, int, const float*, int, float, float*, int) {
    missing("sgemm");
}
inline void dgemm(bool, bool, int, int, int, double, const double*, int, const double*, int, double, double*, int) {
    missing("dgemm");
}
inline int library_threads() { return 0; }
inline void set_library_threads(int) {}
inline std::string library_description() { return "none"; }

#endif

}  // namespace cblas
}  // namespace loom::host
