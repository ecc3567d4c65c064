#pragma once
// Row-major GEMM for the host backend.
//
//   C = alpha * op(A) * op(B) + beta * C,   op(A): m x k,  op(B): k x n,  C: m x n
//
// Every matrix is row-major with a leading dimension (the distance between rows as stored):
// A is stored m x k (lda >= k) for transpose::no and k x m (lda >= m) for transpose::yes,
// likewise B is k x n (ldb >= n) or n x k (ldb >= k), and C is m x n (ldc >= n). As in BLAS,
// beta == 0 overwrites C without reading it (NaN in C does not propagate), and alpha == 0 or
// k == 0 gives C = beta * C without reading A or B.
//
// gemm() calls OpenBLAS when selected (selected_gemm_backend below: by default only where
// the build has it, see cblas_gate.hpp, and the CPU has no AVX2) and gemm_fallback()
// otherwise; inside a parallel_for range it always runs gemm_fallback() on the calling
// thread, so OpenBLAS's threads never pile onto the pool's.
//
// gemm_fallback() is the portable path: op(B) packed once and shared, A packed once per
// depth slice in blocks of rows (shared as well when C is cut into several columns of
// tiles), products too large to pack whole run in parts that fit, cache-blocked (an
// mr x kc panel of A in L1 sweeps a kc x nc block of B in L2), register-tiled micro-kernels, and C cut into tiles that the threads of
// thread_pool::global() take first come first served. The AVX-512F or AVX2+FMA micro-kernels are chosen at run time
// (the header needs no -march flag); a plain C++ micro-kernel runs everywhere else. They
// use GCC/Clang target attributes and <immintrin.h>, so this header is for x86-64.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>

#include <loom/core/error.hpp>
#include <loom/runtime/host/cblas_gate.hpp>
#include <loom/runtime/host/cpu_isa.hpp>
#include <loom/runtime/host/thread_pool.hpp>

namespace loom::host {

enum class transpose : bool { no, yes };

// Which implementation gemm() uses outside parallel regions.
//   LOOM_GEMM=cblas | loom   chooses explicitly (cblas needs a build with OpenBLAS);
//   otherwise                loom's kernels on CPUs with AVX2+FMA or AVX-512, else CBLAS when
//                            built with it, else loom's portable kernel. With AVX-512 loom's
//                            kernels measured faster than OpenBLAS 0.3.21's; with AVX2 (a Zen 3
//                            core) a training step took the same time either way, but OpenBLAS
//                            keeps threads of its own that spin and yield beside loom's pool,
//                            and several ranks in one process calling it at once queued in
//                            sched_yield: a 4-rank pipeline of 16 micro-batches took 2.36 s a
//                            step with it, 0.34 s with loom's kernels (benchmarks/RESULTS.md).
enum class gemm_backend { cblas, loom };

inline gemm_backend selected_gemm_backend() {
    static const gemm_backend chosen = [] {
        if (const char* env = std::getenv("LOOM_GEMM"); env && *env) {
            const std::string_view v(env);
            if (v == "loom") return gemm_backend::loom;
            if (v == "cblas") {
                if (!has_cblas)
                    throw usage_error("LOOM_GEMM=cblas: this build has no CBLAS; install libopenblas-dev and "
                                      "configure with LOOM_USE_CBLAS=ON, or unset LOOM_GEMM");
                return gemm_backend::cblas;
            }
            throw usage_error("LOOM_GEMM=" + std::string(v) + ": expected 'cblas' or 'loom'");
        }
        if (!has_cblas || best_cpu_isa() != cpu_isa::portable) return gemm_backend::loom;
        return gemm_backend::cblas;
    }();
    return chosen;
}

// True when gemm() calls CBLAS (OpenBLAS) rather than gemm_fallback() (outside parallel regions).
inline bool gemm_uses_cblas() { return selected_gemm_backend() == gemm_backend::cblas; }

namespace detail::gemm {

// ---------------------------------------------------------------------------------------
// Micro-kernels. Each computes one MR x NR tile of C from packed panels:
//   C[i][j] = alpha * sum_p a[p*MR + i] * b[p*NR + j] + beta * C[i][j]   (0 <= i < MR, 0 <= j < NR)
// and does not read C when beta == 0.

template <class T, int MR, int NR>
void micro_kernel_portable(std::int64_t kc, const T* __restrict a, const T* __restrict b, T* __restrict c,
                           std::int64_t ldc, T alpha, T beta) {
    T acc[MR][NR] = {};
    for (std::int64_t p = 0; p < kc; ++p) {
        for (int i = 0; i < MR; ++i) {
            const T ai = a[i];
            for (int j = 0; j < NR; ++j) acc[i][j] += ai * b[j];
        }
        a += MR;
        b += NR;
    }
    for (int i = 0; i < MR; ++i) {
        T* row = c + i * ldc;
        if (beta == T(0)) {
            for (int j = 0; j < NR; ++j) row[j] = alpha * acc[i][j];
        } else {
            for (int j = 0; j < NR; ++j) row[j] = alpha * acc[i][j] + beta * row[j];
        }
    }
}

// Thin overloads over the intrinsics so one kernel body serves float and double.
struct avx2_ops {
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline __m256 zero(float) { return _mm256_setzero_ps(); }
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline __m256d zero(double) { return _mm256_setzero_pd(); }
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline __m256 load(const float* p) {
        return _mm256_loadu_ps(p);
    }
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline __m256d load(const double* p) {
        return _mm256_loadu_pd(p);
    }
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline void store(float* p, __m256 v) {
        _mm256_storeu_ps(p, v);
    }
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline void store(double* p, __m256d v) {
        _mm256_storeu_pd(p, v);
    }
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline __m256 broadcast(float x) {
        return _mm256_set1_ps(x);
    }
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline __m256d broadcast(double x) {
        return _mm256_set1_pd(x);
    }
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline __m256 mul(__m256 x, __m256 y) {
        return _mm256_mul_ps(x, y);
    }
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline __m256d mul(__m256d x, __m256d y) {
        return _mm256_mul_pd(x, y);
    }
    // x * y + z with one rounding.
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline __m256 fma(__m256 x, __m256 y, __m256 z) {
        return _mm256_fmadd_ps(x, y, z);
    }
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline __m256d fma(__m256d x, __m256d y, __m256d z) {
        return _mm256_fmadd_pd(x, y, z);
    }
};

struct avx512_ops {
    [[gnu::always_inline, gnu::target("avx512f")]] static inline __m512 zero(float) { return _mm512_setzero_ps(); }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline __m512d zero(double) { return _mm512_setzero_pd(); }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline __m512 load(const float* p) {
        return _mm512_loadu_ps(p);
    }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline __m512d load(const double* p) {
        return _mm512_loadu_pd(p);
    }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline void store(float* p, __m512 v) {
        _mm512_storeu_ps(p, v);
    }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline void store(double* p, __m512d v) {
        _mm512_storeu_pd(p, v);
    }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline __m512 broadcast(float x) { return _mm512_set1_ps(x); }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline __m512d broadcast(double x) {
        return _mm512_set1_pd(x);
    }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline __m512 mul(__m512 x, __m512 y) {
        return _mm512_mul_ps(x, y);
    }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline __m512d mul(__m512d x, __m512d y) {
        return _mm512_mul_pd(x, y);
    }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline __m512 fma(__m512 x, __m512 y, __m512 z) {
        return _mm512_fmadd_ps(x, y, z);
    }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline __m512d fma(__m512d x, __m512d y, __m512d z) {
        return _mm512_fmadd_pd(x, y, z);
    }
};

// The SIMD kernel bodies are identical up to the ops type; the target attribute cannot be a
// template argument, so there is one body per instruction set. NV vectors span NR columns.
template <class T, int MR, int NV>
[[gnu::target("avx2,fma")]] void micro_kernel_avx2(std::int64_t kc, const T* __restrict a, const T* __restrict b,
                                                   T* __restrict c, std::int64_t ldc, T alpha, T beta) {
    using ops = avx2_ops;
    using vec = decltype(ops::zero(T{}));
    constexpr int width = static_cast<int>(sizeof(vec) / sizeof(T));
    vec acc[MR][NV];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[i][v] = ops::zero(T{});
    for (std::int64_t p = 0; p < kc; ++p) {
        vec bv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) bv[v] = ops::load(b + v * width);
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) {
            const vec ai = ops::broadcast(a[i]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) acc[i][v] = ops::fma(ai, bv[v], acc[i][v]);
        }
        a += MR;
        b += NV * width;
    }
    const vec alpha_v = ops::broadcast(alpha);
    const vec beta_v = ops::broadcast(beta);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
        T* row = c + i * ldc;
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            const vec scaled = ops::mul(alpha_v, acc[i][v]);
            ops::store(row + v * width, beta == T(0) ? scaled : ops::fma(beta_v, ops::load(row + v * width), scaled));
        }
    }
}

template <class T, int MR, int NV>
[[gnu::target("avx512f")]] void micro_kernel_avx512(std::int64_t kc, const T* __restrict a, const T* __restrict b,
                                                    T* __restrict c, std::int64_t ldc, T alpha, T beta) {
    using ops = avx512_ops;
    using vec = decltype(ops::zero(T{}));
    constexpr int width = static_cast<int>(sizeof(vec) / sizeof(T));
    vec acc[MR][NV];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[i][v] = ops::zero(T{});
    for (std::int64_t p = 0; p < kc; ++p) {
        vec bv[NV];
        // The packed B panel streams from L2 (the A panel stays in L1): fetch it 16 depth
        // steps ahead. Measured on a Sapphire Rapids core, the kernel sweeping a 1 MiB block
        // of B went from 203 to 226 GFLOP/s (82% to 92% of the core's FMA peak); the
        // hardware prefetcher alone does not keep two FMA ports fed. Past the panel's end
        // the address is only a hint (prefetches never fault).
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v)
            _mm_prefetch(reinterpret_cast<const char*>(b + (16 * NV + v) * width), _MM_HINT_T0);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) bv[v] = ops::load(b + v * width);
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) {
            const vec ai = ops::broadcast(a[i]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) acc[i][v] = ops::fma(ai, bv[v], acc[i][v]);
        }
        a += MR;
        b += NV * width;
    }
    const vec alpha_v = ops::broadcast(alpha);
    const vec beta_v = ops::broadcast(beta);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
        T* row = c + i * ldc;
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            const vec scaled = ops::mul(alpha_v, acc[i][v]);
            ops::store(row + v * width, beta == T(0) ? scaled : ops::fma(beta_v, ops::load(row + v * width), scaled));
        }
    }
}

// Copies `panels` runs of NV vectors from src (contiguous) to dst + q * panel_stride: one row
// of B dealt out to its packed panels. Written with the ISA's vectors because a plain copy
// loop becomes a memmove call per run.
template <class T, int NV>
[[gnu::target("avx2,fma")]] void deal_row_avx2(const T* __restrict src, T* __restrict dst, std::int64_t panels,
                                               std::int64_t panel_stride) {
    using ops = avx2_ops;
    constexpr int width = static_cast<int>(sizeof(decltype(ops::zero(T{}))) / sizeof(T));
    for (std::int64_t q = 0; q < panels; ++q) {
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v)
            ops::store(dst + q * panel_stride + v * width, ops::load(src + (q * NV + v) * width));
    }
}

template <class T, int NV>
[[gnu::target("avx512f")]] void deal_row_avx512(const T* __restrict src, T* __restrict dst, std::int64_t panels,
                                                std::int64_t panel_stride) {
    using ops = avx512_ops;
    constexpr int width = static_cast<int>(sizeof(decltype(ops::zero(T{}))) / sizeof(T));
    for (std::int64_t q = 0; q < panels; ++q) {
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v)
            ops::store(dst + q * panel_stride + v * width, ops::load(src + (q * NV + v) * width));
    }
}

template <class T, int NR>
void deal_row_portable(const T* __restrict src, T* __restrict dst, std::int64_t panels, std::int64_t panel_stride) {
    for (std::int64_t q = 0; q < panels; ++q) {
        for (int j = 0; j < NR; ++j) dst[q * panel_stride + j] = src[q * NR + j];
    }
}

// Packs rows [i0, i0 + rows) x columns [p0, p0 + depth) of a row-major A into an MR-wide
// panel (out[p*MR + i], zero past `rows`): a transpose. The rows are read a cache line at a
// time in step, so their misses overlap, and lines ahead are prefetched: A is often read
// from memory exactly once (when n <= nc).
template <int MR, class T>
void pack_a_rows_scalar(const T* a, std::int64_t lda, std::int64_t i0, std::int64_t rows, std::int64_t p0,
                        std::int64_t depth, T* __restrict out) {
    constexpr std::int64_t line = 64 / sizeof(T);
    for (std::int64_t pl = 0; pl < depth; pl += line) {
        const std::int64_t pe = std::min(depth, pl + line);
        for (std::int64_t i = 0; i < rows; ++i) {
            const T* src = a + (i0 + i) * lda + p0;
            __builtin_prefetch(src + pl + 4 * line);
            for (std::int64_t p = pl; p < pe; ++p) out[p * MR + i] = src[p];
        }
        for (std::int64_t i = rows; i < MR; ++i) {
            for (std::int64_t p = pl; p < pe; ++p) out[p * MR + i] = T(0);
        }
    }
}

// Transposes up to 16 rows of a row-major float matrix into a panel:
//   out[p * out_stride + i] = src[i * ld + p]   (0 <= i < lanes, 0 <= p < depth),
// zero for rows >= `rows` (rows <= lanes <= 16). Sixteen rows by sixteen columns at a time,
// in registers (16 loads, 64 shuffles, 16 stores), about five times the rate of the gathers
// it replaces: packing op(A) for A untransposed and op(B) for B transposed (the forward
// X W^T) cost 6% of a GEMM with gathers or scalar loops.
[[gnu::target("avx512f")]] inline void transpose_rows_avx512(const float* src, std::int64_t ld, int rows,
                                                             std::int64_t depth, float* __restrict out,
                                                             std::int64_t out_stride, int lanes) {
    const __mmask16 store_mask = static_cast<__mmask16>((1u << lanes) - 1);
    for (std::int64_t p0 = 0; p0 < depth; p0 += 16) {
        const int cols = static_cast<int>(std::min<std::int64_t>(16, depth - p0));
        const __mmask16 load_mask = static_cast<__mmask16>((1u << cols) - 1);
        __m512 r[16];
        for (int i = 0; i < 16; ++i) {
            if (i < rows) {
                const float* row = src + i * ld + p0;
                __builtin_prefetch(row + 64);
                r[i] = _mm512_maskz_loadu_ps(load_mask, row);
            } else {
                r[i] = _mm512_setzero_ps();
            }
        }
        __m512 t[16];
        // Pairs of rows interleaved, then quads, then 4-lane blocks twice: the standard
        // in-register 16 x 16 transpose. The zero-masking forms with every lane selected are
        // the same instructions; the plain ones pass _mm512_undefined_ps(), which GCC 12
        // reports as used uninitialized in every translation unit.
        constexpr __mmask16 all = 0xffff;
        for (int i = 0; i < 16; i += 2) {
            t[i] = _mm512_maskz_unpacklo_ps(all, r[i], r[i + 1]);
            t[i + 1] = _mm512_maskz_unpackhi_ps(all, r[i], r[i + 1]);
        }
        for (int i = 0; i < 16; i += 4) {
            r[i] = _mm512_maskz_shuffle_ps(all, t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
            r[i + 1] = _mm512_maskz_shuffle_ps(all, t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
            r[i + 2] = _mm512_maskz_shuffle_ps(all, t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
            r[i + 3] = _mm512_maskz_shuffle_ps(all, t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
        }
        for (int h = 0; h < 16; h += 8) {
            for (int i = 0; i < 4; ++i) {
                t[h + i] = _mm512_maskz_shuffle_f32x4(all, r[h + i], r[h + i + 4], 0x88);
                t[h + i + 4] = _mm512_maskz_shuffle_f32x4(all, r[h + i], r[h + i + 4], 0xdd);
            }
        }
        for (int i = 0; i < 8; ++i) {
            r[i] = _mm512_maskz_shuffle_f32x4(all, t[i], t[i + 8], 0x88);
            r[i + 8] = _mm512_maskz_shuffle_f32x4(all, t[i], t[i + 8], 0xdd);
        }
        // r[c] now holds column p0 + c of the 16 rows.
        for (int c = 0; c < cols; ++c) _mm512_mask_storeu_ps(out + (p0 + c) * out_stride, store_mask, r[c]);
    }
}

// The same with one AVX-512 gather per column of the panel (two for double): about twice
// the scalar rate, which stores one element per instruction.
template <int MR, class T>
[[gnu::target("avx512f")]] void pack_a_rows_avx512(const T* a, std::int64_t lda, std::int64_t i0, std::int64_t rows,
                                                   std::int64_t p0, std::int64_t depth, T* __restrict out) {
    static_assert(MR <= 16, "pack_a_rows_avx512: one 16-lane index vector covers at most 16 rows");
    // Gather offsets are 32-bit.
    if ((MR - 1) * lda > INT32_MAX) {
        pack_a_rows_scalar<MR>(a, lda, i0, rows, p0, depth, out);
        return;
    }
    alignas(64) std::int32_t offsets[16] = {};
    for (int i = 0; i < MR; ++i) offsets[i] = static_cast<std::int32_t>(i * lda);
    const T* base = a + i0 * lda + p0;
    if constexpr (std::is_same_v<T, float>) {
        const __m512i index = _mm512_load_si512(offsets);
        const __mmask16 present = static_cast<__mmask16>((1u << rows) - 1);
        const __mmask16 panel = static_cast<__mmask16>((1u << MR) - 1);
        for (std::int64_t p = 0; p < depth; ++p) {
            const __m512 column = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), present, index, base + p, 4);
            _mm512_mask_storeu_ps(out + p * MR, panel, column);
        }
    } else {
        const __m256i index_low = _mm256_load_si256(reinterpret_cast<const __m256i*>(offsets));
        const __m256i index_high = _mm256_load_si256(reinterpret_cast<const __m256i*>(offsets + 8));
        const unsigned present = (1u << rows) - 1;
        const __mmask8 present_low = static_cast<__mmask8>(present & 0xff);
        const __mmask8 present_high = static_cast<__mmask8>(present >> 8);
        const __mmask8 panel_low = static_cast<__mmask8>(((1u << MR) - 1) & 0xff);
        const __mmask8 panel_high = static_cast<__mmask8>(((1u << MR) - 1) >> 8);
        for (std::int64_t p = 0; p < depth; ++p) {
            const __m512d low = _mm512_mask_i32gather_pd(_mm512_setzero_pd(), present_low, index_low, base + p, 8);
            _mm512_mask_storeu_pd(out + p * MR, panel_low, low);
            if constexpr (MR > 8) {
                const __m512d high =
                    _mm512_mask_i32gather_pd(_mm512_setzero_pd(), present_high, index_high, base + p, 8);
                _mm512_mask_storeu_pd(out + p * MR + 8, panel_high, high);
            }
        }
    }
}

// Packs one NR-wide panel of a transposed B: panel[p * NR + j] = src[j * ldb + p] for
// j < width, zero for width <= j < NR. A cache line of depth at a time keeps the writes
// within a few lines.
template <int NR, class T>
void transpose_panel_scalar(const T* src, std::int64_t ldb, std::int64_t width, std::int64_t depth,
                            T* __restrict panel) {
    constexpr std::int64_t step = 64 / sizeof(T);
    for (std::int64_t pl = 0; pl < depth; pl += step) {
        const std::int64_t pe = std::min(depth, pl + step);
        for (std::int64_t j = 0; j < width; ++j) {
            const T* column = src + j * ldb;
            for (std::int64_t p = pl; p < pe; ++p) panel[p * NR + j] = column[p];
        }
        for (std::int64_t j = width; j < NR; ++j) {
            for (std::int64_t p = pl; p < pe; ++p) panel[p * NR + j] = T(0);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Kernel descriptions: tile shape, cache blocking and the kernel itself.
//   mr x nr: the register tile. kc: depth of one packed block, so an mr x kc panel of A
//   stays in L1 while it sweeps the packed kc x nc block of B (from L2, or L3 when larger).
//   mc: rows of A packed at once (a block of mr-row panels), so A is packed once per depth
//   slice whatever the width of C.

template <class T, cpu_isa Isa>
struct kernel_config;

template <class T>
struct kernel_config<T, cpu_isa::portable> {
    static constexpr int mr = 4;
    static constexpr int nr = 32 / static_cast<int>(sizeof(T));
    static constexpr std::int64_t kc = 256;
    static constexpr std::int64_t nc = 1024;
    static constexpr std::int64_t mc = 24 * mr;
    static void run(std::int64_t k, const T* a, const T* b, T* c, std::int64_t ldc, T alpha, T beta) {
        micro_kernel_portable<T, mr, nr>(k, a, b, c, ldc, alpha, beta);
    }
    static void deal_row(const T* src, T* dst, std::int64_t panels, std::int64_t panel_stride) {
        deal_row_portable<T, nr>(src, dst, panels, panel_stride);
    }
    static void pack_a_rows(const T* a, std::int64_t lda, std::int64_t i0, std::int64_t rows, std::int64_t p0,
                            std::int64_t depth, T* out) {
        pack_a_rows_scalar<mr>(a, lda, i0, rows, p0, depth, out);
    }
    static void transpose_panel(const T* src, std::int64_t ldb, std::int64_t width, std::int64_t depth, T* panel) {
        transpose_panel_scalar<nr>(src, ldb, width, depth, panel);
    }
};

template <class T>
struct kernel_config<T, cpu_isa::avx2_fma> {
    // 6 x 2 vectors: 12 accumulators + 2 B vectors + 1 broadcast of the 16 ymm registers.
    static constexpr int mr = 6;
    static constexpr int nr = 2 * 32 / static_cast<int>(sizeof(T));
    static constexpr std::int64_t kc = 256;
    static constexpr std::int64_t nc = 1024;
    static constexpr std::int64_t mc = 24 * mr;
    static void run(std::int64_t k, const T* a, const T* b, T* c, std::int64_t ldc, T alpha, T beta) {
        micro_kernel_avx2<T, mr, 2>(k, a, b, c, ldc, alpha, beta);
    }
    static void deal_row(const T* src, T* dst, std::int64_t panels, std::int64_t panel_stride) {
        deal_row_avx2<T, 2>(src, dst, panels, panel_stride);
    }
    static void pack_a_rows(const T* a, std::int64_t lda, std::int64_t i0, std::int64_t rows, std::int64_t p0,
                            std::int64_t depth, T* out) {
        pack_a_rows_scalar<mr>(a, lda, i0, rows, p0, depth, out);
    }
    static void transpose_panel(const T* src, std::int64_t ldb, std::int64_t width, std::int64_t depth, T* panel) {
        transpose_panel_scalar<nr>(src, ldb, width, depth, panel);
    }
};

template <class T>
struct kernel_config<T, cpu_isa::avx512f> {
    // 12 x 2 vectors: 24 accumulators + 2 B vectors + 1 broadcast of the 32 zmm registers.
    static constexpr int mr = 12;
    static constexpr int nr = 2 * 64 / static_cast<int>(sizeof(T));
    // kc: an A panel of 12 x 384 floats (18 KiB) stays in a 32 KiB L1 beside the B stream,
    // and GPT-2's 768-deep products take two passes over C instead of three; measured
    // 5-10% faster than 256 on Zen 4 (benchmarks/RESULTS.md). Doubles keep 256 (24 KiB).
    static constexpr std::int64_t kc = sizeof(T) == 4 ? 384 : 256;
    static constexpr std::int64_t nc = 1024;
    static constexpr std::int64_t mc = 24 * mr;
    static void run(std::int64_t k, const T* a, const T* b, T* c, std::int64_t ldc, T alpha, T beta) {
        micro_kernel_avx512<T, mr, 2>(k, a, b, c, ldc, alpha, beta);
    }
    static void deal_row(const T* src, T* dst, std::int64_t panels, std::int64_t panel_stride) {
        deal_row_avx512<T, 2>(src, dst, panels, panel_stride);
    }
    static void pack_a_rows(const T* a, std::int64_t lda, std::int64_t i0, std::int64_t rows, std::int64_t p0,
                            std::int64_t depth, T* out) {
        if constexpr (std::is_same_v<T, float>) {
            transpose_rows_avx512(a + i0 * lda + p0, lda, static_cast<int>(rows), depth, out, mr, mr);
        } else {
            pack_a_rows_avx512<mr>(a, lda, i0, rows, p0, depth, out);
        }
    }
    static void transpose_panel(const T* src, std::int64_t ldb, std::int64_t width, std::int64_t depth, T* panel) {
        if constexpr (std::is_same_v<T, float>) {
            // Two 16-lane halves of the 32-wide panel.
            for (int half = 0; half < nr; half += 16) {
                const int rows = static_cast<int>(std::clamp<std::int64_t>(width - half, 0, 16));
                transpose_rows_avx512(rows > 0 ? src + half * ldb : src, ldb, rows, depth, panel + half, nr, 16);
            }
        } else {
            transpose_panel_scalar<nr>(src, ldb, width, depth, panel);
        }
    }
};

// ---------------------------------------------------------------------------------------
// Packing. A packed A panel holds op(A)[i0 + i][p0 + p] at a[p*MR + i]. A packed slice of B
// (depth rows of op(B) starting at p0) is a row of NR-wide panels, panel q holding
// op(B)[p0 + p][q*NR + j] at q*NR*depth + p*NR + j. Rows and columns past the matrix edge
// are zero, so edge tiles run the full kernel. Full-width runs use fixed trip counts so the
// compiler vectorizes them at any -march.

template <class Config, class T>
void pack_a(transpose ta, const T* a, std::int64_t lda, std::int64_t i0, std::int64_t rows, std::int64_t p0,
            std::int64_t depth, T* __restrict out) {
    constexpr int MR = Config::mr;
    if (ta == transpose::no) {
        Config::pack_a_rows(a, lda, i0, rows, p0, depth, out);
    } else {
        // op(A)[i][p] = a[p*lda + i]: each column of the panel is contiguous in A.
        for (std::int64_t p = 0; p < depth; ++p) {
            const T* src = a + (p0 + p) * lda + i0;
            T* dst = out + p * MR;
            if (rows == MR) {
                // A constant-size memcpy is expanded inline; the equivalent loop would
                // become a memmove call.
                std::memcpy(dst, src, MR * sizeof(T));
            } else {
                for (std::int64_t i = 0; i < MR; ++i) dst[i] = i < rows ? src[i] : T(0);
            }
        }
    }
}

// Packs the panels of columns [j0, j0 + cols) of a slice; j0 is a multiple of NR.
template <class Config, class T>
void pack_b(transpose tb, const T* b, std::int64_t ldb, std::int64_t p0, std::int64_t depth, std::int64_t j0,
            std::int64_t cols, T* __restrict out) {
    constexpr int NR = Config::nr;
    const std::int64_t full_panels = cols / NR;
    const std::int64_t tail = cols - full_panels * NR;
    if (tb == transpose::no) {
        // op(B)[p][j] = b[p*ldb + j]: read B row by row (sequential, so prefetched) and deal
        // each row out to the panels.
        for (std::int64_t p = 0; p < depth; ++p) {
            const T* src = b + (p0 + p) * ldb + j0;
            T* dst = out + p * NR;
            Config::deal_row(src, dst, full_panels, NR * depth);
            if (tail > 0) {
                T* last = dst + full_panels * NR * depth;
                for (std::int64_t j = 0; j < NR; ++j) last[j] = j < tail ? src[full_panels * NR + j] : T(0);
            }
        }
        return;
    }
    // op(B)[p][j] = b[j*ldb + p]: columns of a panel are contiguous in B.
    for (std::int64_t q = 0; q * NR < cols; ++q) {
        const std::int64_t width = q < full_panels ? NR : tail;
        Config::transpose_panel(b + (j0 + q * NR) * ldb + p0, ldb, width, depth, out + q * NR * depth);
    }
}

// Packing storage kept between calls, so steady-state GEMMs neither allocate nor fault in
// fresh pages. Grows to the largest request seen; 64-byte aligned.
class pack_storage {
   public:
    pack_storage() = default;
    pack_storage(const pack_storage&) = delete;
    pack_storage& operator=(const pack_storage&) = delete;
    ~pack_storage() { release(); }

    void* get(std::size_t bytes) {
        if (bytes > capacity_) {
            release();
            data_ = ::operator new (bytes, std::align_val_t{64});
            capacity_ = bytes;
        }
        return data_;
    }

   private:
    void release() noexcept {
        if (data_ != nullptr) ::operator delete (data_, std::align_val_t{64});
        data_ = nullptr;
        capacity_ = 0;
    }
    void* data_ = nullptr;
    std::size_t capacity_ = 0;
};

// One block of A panels per thread.
inline pack_storage& a_panel_storage() {
    thread_local pack_storage storage;
    return storage;
}
// One kc x nc block of B per thread, for single-tile products.
inline pack_storage& b_block_storage() {
    thread_local pack_storage storage;
    return storage;
}
// All of op(B), packed by the calling thread's team and shared by its tiles. Kept only up
// to shared_b_keep_bytes; a larger packed B (an LM head's vocabulary projection) is
// allocated for the one call, so the cache never pins that much memory.
inline constexpr std::size_t shared_b_keep_bytes = std::size_t{32} << 20;
inline pack_storage& b_shared_storage() {
    thread_local pack_storage storage;
    return storage;
}
// All of op(A), when it is shared (see multiply); kept up to the same size.
inline pack_storage& a_shared_storage() {
    thread_local pack_storage storage;
    return storage;
}

struct problem {
    transpose ta, tb;
    std::int64_t m, n, k;
    std::int64_t lda, ldb, ldc;
    // n values (of the GEMM's element type) added to every row of C in place of beta * C
    // (beta is then 0), or none: a linear layer's bias, added as each tile of C is first
    // stored rather than written to C beforehand and read back (12% of a 1024 x 1024 x 256
    // product's time).
    const void* bias_row = nullptr;
};

// Where a tile finds packed B: either all of op(B) packed before the tiles run (slice pc at
// shared + pc * padded_n, so column j's panel sits at shared + pc * padded_n + j * depth),
// or nothing, and the tile packs each kc x nc block it needs into its own buffer. Likewise
// packed A: all of op(A) packed before the tiles run (row i's panel of slice pc at
// shared_a + pc * padded_m + i * depth), or nothing, and the tile packs its own rows.
template <class T>
struct packed_b_source {
    const T* shared = nullptr;
    std::int64_t padded_n = 0;
    const T* shared_a = nullptr;
    std::int64_t padded_m = 0;
};

// The register tiles of C[ib..ie, jc..jc + cols) for one depth slice: A's packed rows
// (panel of row ic at a_block + (ic - ib) * depth) against B's packed columns (panel of
// column jc + jr at b_block + jr * depth).
// `bias` (the first depth slice only): s.bias_row, added in place of beta * C.
template <class T, cpu_isa Isa>
void sweep_block(const problem& s, T alpha, T beta, T* c, std::int64_t ib, std::int64_t ie, std::int64_t jc,
                 std::int64_t cols, std::int64_t depth, const T* a_block, const T* b_block, const T* bias) {
    using config = kernel_config<T, Isa>;
    constexpr int mr = config::mr;
    constexpr int nr = config::nr;
    alignas(64) T edge[mr * nr];
    for (std::int64_t ic = ib; ic < ie; ic += mr) {
        const std::int64_t rows = std::min<std::int64_t>(mr, ie - ic);
        const T* a_panel = a_block + (ic - ib) * depth;
        for (std::int64_t jr = 0; jr < cols; jr += nr) {
            const std::int64_t width = std::min<std::int64_t>(nr, cols - jr);
            T* c_tile = c + ic * s.ldc + jc + jr;
            const T* b_panel = b_block + jr * depth;
            if (rows == mr && width == nr) {
                if (bias == nullptr) {
                    config::run(depth, a_panel, b_panel, c_tile, s.ldc, alpha, beta);
                    continue;
                }
                // The tile's rows start as the bias (in L1, where the kernel's stores go).
                for (int i = 0; i < mr; ++i) std::memcpy(c_tile + i * s.ldc, bias + jc + jr, nr * sizeof(T));
                config::run(depth, a_panel, b_panel, c_tile, s.ldc, alpha, T(1));
                continue;
            }
            config::run(depth, a_panel, b_panel, edge, nr, T(1), T(0));
            for (std::int64_t i = 0; i < rows; ++i) {
                T* row = c_tile + i * s.ldc;
                const T* sum = edge + i * nr;
                if (bias != nullptr) {
                    for (std::int64_t j = 0; j < width; ++j) row[j] = alpha * sum[j] + bias[jc + jr + j];
                } else if (beta == T(0)) {
                    for (std::int64_t j = 0; j < width; ++j) row[j] = alpha * sum[j];
                } else {
                    for (std::int64_t j = 0; j < width; ++j) row[j] = alpha * sum[j] + beta * row[j];
                }
            }
        }
    }
}

// Packs rows [ib, ie) x depth [pc, pc + depth) of op(A) as consecutive mr-row panels.
template <class T, cpu_isa Isa>
void pack_a_block(const problem& s, const T* a, std::int64_t ib, std::int64_t ie, std::int64_t pc,
                  std::int64_t depth, T* out) {
    using config = kernel_config<T, Isa>;
    constexpr int mr = config::mr;
    if (s.ta == transpose::yes) {
        // op(A)[i][p] = a[p*lda + i]: one row of A holds column p of every panel of the
        // block. Reading it once, contiguously, and dealing it out to the panels touches each
        // line and page of A once per block instead of once per panel.
        const std::int64_t full = (ie - ib) / mr;
        const std::int64_t tail = (ie - ib) - full * mr;
        for (std::int64_t p = 0; p < depth; ++p) {
            const T* src = a + (pc + p) * s.lda + ib;
            T* dst = out + p * mr;
            for (std::int64_t q = 0; q < full; ++q) std::memcpy(dst + q * mr * depth, src + q * mr, mr * sizeof(T));
            if (tail > 0) {
                T* last = dst + full * mr * depth;
                for (std::int64_t i = 0; i < mr; ++i) last[i] = i < tail ? src[full * mr + i] : T(0);
            }
        }
        return;
    }
    for (std::int64_t ic = ib; ic < ie; ic += mr)
        pack_a<config>(s.ta, a, s.lda, ic, std::min<std::int64_t>(mr, ie - ic), pc, depth, out + (ic - ib) * depth);
}

// The depth of every slice but the last: k cut into as few slices of at most kc as
// possible, of nearly equal depth, so no slice is a short remainder that pays a whole
// pass over C for little work (1024 = 342 + 342 + 340 rather than 384 + 384 + 256).
inline std::int64_t slice_depth(std::int64_t k, std::int64_t kc) {
    const std::int64_t slices = (k + kc - 1) / kc;
    return (k + slices - 1) / slices;
}

// C[i0..i1, j0..j1] on the calling thread; i0 and j0 are multiples of the register tile.
// Needs alpha != 0 and k > 0. Depth slices (kc) are outermost; later slices accumulate onto
// what the first one wrote.
//
// With B packed up front (several tiles), blocks of mc rows of A are packed once per slice
// (or found packed up front, when A is shared) and swept over every nc-wide block of B's
// slice: each element of A is packed once per tile however wide the tile is (an LM head's
// 50304 columns used to repack A once per 1024 columns).
// A tile that packs its own B packs each kc x nc block just before it sweeps it (hot in L2)
// and packs A once per block. Either way an mr x kc panel of A stays in L1 while it sweeps
// the kc x nc block of B in L2.
template <class T, cpu_isa Isa>
void multiply_tile(const problem& s, T alpha, const T* a, const T* b, T beta, T* c, std::int64_t i0, std::int64_t i1,
                   std::int64_t j0, std::int64_t j1, packed_b_source<T> source) {
    using config = kernel_config<T, Isa>;
    constexpr int mr = config::mr;
    constexpr int nr = config::nr;
    const std::int64_t step = slice_depth(s.k, config::kc);
    const std::int64_t block_depth = step;
    const std::int64_t block_rows = std::min<std::int64_t>(config::mc, (i1 - i0 + mr - 1) / mr * mr);
    T* packed_a = source.shared_a != nullptr ? nullptr
                                              : static_cast<T*>(a_panel_storage().get(
                                                    sizeof(T) * static_cast<std::size_t>(block_rows * block_depth)));
    T* local_b = nullptr;
    if (source.shared == nullptr) {
        const std::int64_t block_cols = std::min<std::int64_t>(config::nc, (j1 - j0 + nr - 1) / nr * nr);
        local_b =
            static_cast<T*>(b_block_storage().get(sizeof(T) * static_cast<std::size_t>(block_cols * block_depth)));
    }
    for (std::int64_t pc = 0; pc < s.k; pc += step) {
        const std::int64_t depth = std::min<std::int64_t>(step, s.k - pc);
        const T beta_block = pc == 0 ? beta : T(1);
        const T* bias = pc == 0 ? static_cast<const T*>(s.bias_row) : nullptr;
        if (source.shared != nullptr) {
            const T* slice = source.shared + pc * source.padded_n;
            for (std::int64_t ib = i0; ib < i1; ib += config::mc) {
                const std::int64_t ie = std::min<std::int64_t>(i1, ib + config::mc);
                const T* a_block = packed_a;
                if (source.shared_a != nullptr) {
                    a_block = source.shared_a + pc * source.padded_m + ib * depth;
                } else {
                    pack_a_block<T, Isa>(s, a, ib, ie, pc, depth, packed_a);
                }
                for (std::int64_t jc = j0; jc < j1; jc += config::nc) {
                    const std::int64_t cols = std::min<std::int64_t>(config::nc, j1 - jc);
                    sweep_block<T, Isa>(s, alpha, beta_block, c, ib, ie, jc, cols, depth, a_block,
                                        slice + jc * depth, bias);
                }
            }
            continue;
        }
        for (std::int64_t jc = j0; jc < j1; jc += config::nc) {
            const std::int64_t cols = std::min<std::int64_t>(config::nc, j1 - jc);
            pack_b<config>(s.tb, b, s.ldb, pc, depth, jc, cols, local_b);
            for (std::int64_t ib = i0; ib < i1; ib += config::mc) {
                const std::int64_t ie = std::min<std::int64_t>(i1, ib + config::mc);
                pack_a_block<T, Isa>(s, a, ib, ie, pc, depth, packed_a);
                sweep_block<T, Isa>(s, alpha, beta_block, c, ib, ie, jc, cols, depth, packed_a, local_b, bias);
            }
        }
    }
}

// Every row of C (m x n) set to `row`.
template <class T>
void fill_rows(std::int64_t m, std::int64_t n, const T* row, T* c, std::int64_t ldc) {
    for (std::int64_t i = 0; i < m; ++i) std::copy(row, row + n, c + i * ldc);
}

// C = beta * C over m x n, not reading C when beta == 0.
template <class T>
void scale_c(std::int64_t m, std::int64_t n, T beta, T* c, std::int64_t ldc) {
    if (beta == T(1)) return;
    for (std::int64_t i = 0; i < m; ++i) {
        T* row = c + i * ldc;
        if (beta == T(0)) {
            std::fill(row, row + n, T(0));
        } else {
            for (std::int64_t j = 0; j < n; ++j) row[j] *= beta;
        }
    }
}

// How C is cut into tiles: row_parts x col_parts tiles of whole register tiles, handed out
// one at a time to the threads that are free, so a slow or busy core takes fewer of them.
struct tile_plan {
    std::int64_t row_parts = 1;
    std::int64_t col_parts = 1;
    std::int64_t tiles() const { return row_parts * col_parts; }
};

// Picks the plan with the least estimated time, counted in flops of kernel work:
//   one tile:   the tile, packing its own B
//   many tiles: packing op(B) once, shared by the threads, + the work of all tiles / threads
//               + the largest tile * (threads - 1) / threads (the expected tail of the join)
// where a tile costs its (padded) multiply-adds, packing its A panels, reading its packed B,
// and a fixed start-up.
inline tile_plan plan_tiles(std::int64_t m, std::int64_t n, std::int64_t k, int mr, int nr, unsigned threads) {
    constexpr double pack_cost = 30;        // flops per packed element
    constexpr double stream_cost = 12;      // flops per element of packed B read back from L3
    constexpr double tile_cost = 2e4;       // flops to start a tile
    constexpr double fork_join_cost = 4e5;  // flops per fork-join of the pool
    const std::int64_t row_units = (m + mr - 1) / mr;
    const std::int64_t col_units = (n + nr - 1) / nr;
    const double depth = static_cast<double>(k);
    const auto cost_of_tile = [&](std::int64_t rows, std::int64_t cols, bool packs_b) {
        return 2.0 * rows * cols * depth + pack_cost * depth * rows +
               (packs_b ? pack_cost : stream_cost) * depth * cols + tile_cost;
    };
    tile_plan best;
    double best_cost = cost_of_tile(row_units * mr, col_units * nr, true);
    if (threads <= 1) return best;
    const double team = threads;
    const double shared_pack = pack_cost * depth * col_units * nr / team + fork_join_cost;
    const std::int64_t most = 8 * static_cast<std::int64_t>(threads);
    for (std::int64_t row_parts = 1; row_parts <= std::min(row_units, most); ++row_parts) {
        for (std::int64_t col_parts = 1; col_parts <= std::min(col_units, most); ++col_parts) {
            if (row_parts * col_parts == 1) continue;
            const std::int64_t rows = (row_units + row_parts - 1) / row_parts * mr;
            const std::int64_t cols = (col_units + col_parts - 1) / col_parts * nr;
            const double one = cost_of_tile(rows, cols, false);
            const double cost = shared_pack + row_parts * col_parts * one / team + one * (team - 1) / team;
            if (cost < best_cost) {
                best = {row_parts, col_parts};
                best_cost = cost;
            }
        }
    }
    return best;
}

template <class T, cpu_isa Isa>
void multiply_whole(thread_pool& pool, unsigned threads, const problem& s, T alpha, const T* a, const T* b, T beta,
                    T* c);

// Products whose packed B would exceed shared_b_keep_bytes (an LM head: 50304 columns wide
// in the forward, 50304 deep in the input gradient) run as a sequence of products that each
// fit: columns of C in blocks of whole nc, and depth in blocks of whole kc accumulating onto
// C in order (deterministic). Packing all of B at once allocated and faulted in 154 MiB per
// call (3.5% of the input gradient's time), and its A, too large to share, was packed once
// per column of tiles (6%); in parts, both packed operands live in storage kept between
// calls.
template <class T, cpu_isa Isa>
void multiply(thread_pool& pool, const problem& s, T alpha, const T* a, const T* b, T beta, T* c) {
    using config = kernel_config<T, Isa>;
    constexpr int mr = config::mr;
    constexpr int nr = config::nr;
    // A gemm inside a parallel region runs on its own thread (parallel_for would be serial).
    const unsigned threads = host::detail::inside_parallel_region() ? 1u : pool.size();
    const auto padded = [](std::int64_t x, std::int64_t unit) { return (x + unit - 1) / unit * unit; };
    const std::int64_t limit = static_cast<std::int64_t>(shared_b_keep_bytes / sizeof(T));
    std::int64_t cols = s.n, depth = s.k;
    if (threads > 1 && padded(s.n, nr) * s.k > limit) {
        if (s.n >= s.k) cols = std::max<std::int64_t>(config::nc, limit / s.k / config::nc * config::nc);
        if (padded(cols, nr) * s.k > limit) {
            const std::int64_t widest = std::max(padded(cols, nr), padded(s.m, mr));
            depth = std::max<std::int64_t>(config::kc, limit / widest / config::kc * config::kc);
        }
    }
    if (cols >= s.n && depth >= s.k) {
        multiply_whole<T, Isa>(pool, threads, s, alpha, a, b, beta, c);
        return;
    }
    for (std::int64_t j0 = 0; j0 < s.n; j0 += cols) {
        for (std::int64_t p0 = 0; p0 < s.k; p0 += depth) {
            problem part = s;
            part.n = std::min(cols, s.n - j0);
            part.k = std::min(depth, s.k - p0);
            const T* a_part = s.ta == transpose::no ? a + p0 : a + p0 * s.lda;
            const T* b_part = s.tb == transpose::no ? b + p0 * s.ldb + j0 : b + j0 * s.ldb + p0;
            part.bias_row = s.bias_row != nullptr && p0 == 0 ? static_cast<const T*>(s.bias_row) + j0 : nullptr;
            multiply_whole<T, Isa>(pool, threads, part, alpha, a_part, b_part, p0 == 0 ? beta : T(1), c + j0);
        }
    }
}

template <class T, cpu_isa Isa>
void multiply_whole(thread_pool& pool, unsigned threads, const problem& s, T alpha, const T* a, const T* b, T beta,
                    T* c) {
    using config = kernel_config<T, Isa>;
    constexpr int mr = config::mr;
    constexpr int nr = config::nr;
    const tile_plan plan = plan_tiles(s.m, s.n, s.k, mr, nr, threads);

    if (plan.tiles() == 1) {
        multiply_tile<T, Isa>(s, alpha, a, b, beta, c, 0, s.m, 0, s.n, {});
        return;
    }

    // One fork-join for both phases: each thread packs (slice, nc-wide column block) jobs of
    // op(B), and (slice, mc-row block) jobs of op(A) when A is shared, while any are left,
    // waits until every job taken has been packed, then takes tiles of C, first come first
    // served. A thread that starts late finds the packing done and goes straight to the
    // tiles; one that never starts is not waited for. (Two fork-joins, one per phase, cost
    // 5-10% of the small GEMMs of a 128-wide model.)
    const std::int64_t col_units = (s.n + nr - 1) / nr;
    const std::int64_t padded_n = col_units * nr;
    const std::size_t shared_bytes = sizeof(T) * static_cast<std::size_t>(padded_n * s.k);
    pack_storage one_call;
    pack_storage& storage = shared_bytes <= shared_b_keep_bytes ? b_shared_storage() : one_call;
    T* shared = static_cast<T*>(storage.get(shared_bytes));
    const std::int64_t step = slice_depth(s.k, config::kc);
    const std::int64_t slices = (s.k + step - 1) / step;
    const std::int64_t column_blocks = (s.n + config::nc - 1) / config::nc;
    const std::int64_t b_jobs = slices * column_blocks;
    const std::int64_t row_units = (s.m + mr - 1) / mr;
    // When C is cut into several columns of tiles, each tile packing its own rows of A would
    // pack every element of A once per column of tiles (three times for GPT-2's 768-wide
    // weight gradients, where packing the transposed A then took 10% of the time): A is
    // packed once, beside B, in blocks of mc rows per slice. Not for an A larger than
    // shared_b_keep_bytes (the input gradient through an LM head's vocabulary), which would
    // be allocated and faulted in on every call.
    const std::int64_t padded_m = row_units * mr;
    const std::size_t shared_a_bytes = sizeof(T) * static_cast<std::size_t>(padded_m * s.k);
    const bool share_a = plan.col_parts > 1 && shared_a_bytes <= shared_b_keep_bytes;
    T* shared_a = share_a ? static_cast<T*>(a_shared_storage().get(shared_a_bytes)) : nullptr;
    const std::int64_t row_blocks = (s.m + config::mc - 1) / config::mc;
    const std::int64_t pack_jobs = b_jobs + (share_a ? slices * row_blocks : 0);
    const packed_b_source<T> source{shared, padded_n, shared_a, padded_m};
    const std::int64_t tiles = plan.tiles();
    std::atomic<std::int64_t> next_pack{0}, packed{0}, next_tile{0};
    pool.parallel_for(0, std::min<std::int64_t>(threads, tiles), 1, [&](std::int64_t, std::int64_t) {
        for (std::int64_t job = next_pack.fetch_add(1); job < pack_jobs; job = next_pack.fetch_add(1)) {
            if (job >= b_jobs) {
                const std::int64_t pc = (job - b_jobs) / row_blocks * step;
                const std::int64_t ib = (job - b_jobs) % row_blocks * config::mc;
                const std::int64_t depth = std::min<std::int64_t>(step, s.k - pc);
                const std::int64_t ie = std::min<std::int64_t>(s.m, ib + config::mc);
                pack_a_block<T, Isa>(s, a, ib, ie, pc, depth, shared_a + pc * padded_m + ib * depth);
                packed.fetch_add(1, std::memory_order_release);
                continue;
            }
            const std::int64_t pc = job / column_blocks * step;
            const std::int64_t jc = job % column_blocks * config::nc;
            const std::int64_t depth = std::min<std::int64_t>(step, s.k - pc);
            const std::int64_t cols = std::min<std::int64_t>(config::nc, s.n - jc);
            pack_b<config>(s.tb, b, s.ldb, pc, depth, jc, cols, shared + pc * padded_n + jc * depth);
            packed.fetch_add(1, std::memory_order_release);
        }
        // The release/acquire pair makes the other threads' packed A and B visible here.
        while (packed.load(std::memory_order_acquire) < pack_jobs) std::this_thread::yield();
        for (std::int64_t tile = next_tile.fetch_add(1); tile < tiles; tile = next_tile.fetch_add(1)) {
            const std::int64_t q = tile / plan.row_parts;
            const std::int64_t r = tile % plan.row_parts;
            const std::int64_t i0 = row_units * r / plan.row_parts * mr;
            const std::int64_t i1 = std::min(s.m, row_units * (r + 1) / plan.row_parts * mr);
            const std::int64_t j0 = col_units * q / plan.col_parts * nr;
            const std::int64_t j1 = std::min(s.n, col_units * (q + 1) / plan.col_parts * nr);
            if (i0 < i1 && j0 < j1) multiply_tile<T, Isa>(s, alpha, a, b, beta, c, i0, i1, j0, j1, source);
        }
    });
}

// Throws usage_error naming the first argument that BLAS would reject.
inline void check_arguments(const char* op, transpose ta, transpose tb, std::int64_t m, std::int64_t n, std::int64_t k,
                            const void* a, std::int64_t lda, const void* b, std::int64_t ldb, const void* c,
                            std::int64_t ldc) {
    const auto fail = [op](const std::string& what) { throw usage_error(std::string(op) + ": " + what); };
    const auto check_size = [&](const char* name, std::int64_t value) {
        if (value < 0) fail(std::string(name) + " = " + std::to_string(value) + " is negative; pass " + name + " >= 0");
    };
    check_size("m", m);
    check_size("n", n);
    check_size("k", k);
    const auto check_leading = [&](const char* name, std::int64_t value, std::int64_t row_length,
                                   const std::string& layout) {
        const std::int64_t least = std::max<std::int64_t>(1, row_length);
        if (value < least) {
            fail(std::string(name) + " = " + std::to_string(value) + " is smaller than the row length " +
                 std::to_string(row_length) + " of " + layout + "; pass " + name + " >= " + std::to_string(least));
        }
    };
    const std::string ms = std::to_string(m), ns = std::to_string(n), ks = std::to_string(k);
    if (ta == transpose::no) {
        check_leading("lda", lda, k, "A stored m x k = " + ms + " x " + ks + " (transpose::no)");
    } else {
        check_leading("lda", lda, m, "A stored k x m = " + ks + " x " + ms + " (transpose::yes)");
    }
    if (tb == transpose::no) {
        check_leading("ldb", ldb, n, "B stored k x n = " + ks + " x " + ns + " (transpose::no)");
    } else {
        check_leading("ldb", ldb, k, "B stored n x k = " + ns + " x " + ks + " (transpose::yes)");
    }
    check_leading("ldc", ldc, n, "C (m x n = " + ms + " x " + ns + ")");
    const auto check_pointer = [&](const char* name, const void* pointer, std::int64_t rows, std::int64_t cols,
                                   const char* matrix) {
        if (pointer == nullptr && rows > 0 && cols > 0) {
            fail(std::string(name) + " is null but " + matrix + " is " + std::to_string(rows) + " x " +
                 std::to_string(cols) + "; pass its data");
        }
    };
    check_pointer("a", a, m, k, "op(A)");
    check_pointer("b", b, k, n, "op(B)");
    check_pointer("c", c, m, n, "C");
}

template <class T>
inline constexpr bool is_gemm_element_v = std::is_same_v<T, float> || std::is_same_v<T, double>;

// The fallback after validation, on `pool` (tests pass pools of other sizes).
// `bias` (n values, or none): added to every row of C in place of beta * C.
template <class T>
void fallback_unchecked(cpu_isa isa, thread_pool& pool, transpose ta, transpose tb, std::int64_t m, std::int64_t n,
                        std::int64_t k, T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta,
                        T* c, std::int64_t ldc, const T* bias = nullptr) {
    if (m == 0 || n == 0) return;
    if (k == 0 || alpha == T(0)) {
        if (bias != nullptr) {
            fill_rows(m, n, bias, c, ldc);
        } else {
            scale_c(m, n, beta, c, ldc);
        }
        return;
    }
    const problem s{ta, tb, m, n, k, lda, ldb, ldc, bias};
    switch (isa) {
        case cpu_isa::avx512f: multiply<T, cpu_isa::avx512f>(pool, s, alpha, a, b, beta, c); return;
        case cpu_isa::avx2_fma: multiply<T, cpu_isa::avx2_fma>(pool, s, alpha, a, b, beta, c); return;
        case cpu_isa::portable: multiply<T, cpu_isa::portable>(pool, s, alpha, a, b, beta, c); return;
    }
}

inline bool fits_in_int(std::int64_t value) { return value <= INT_MAX; }

// `bias` (n values, or none): added to every row of C in place of beta * C.
template <class T>
void gemm_unchecked(transpose ta, transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
                    std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc,
                    const T* bias = nullptr) {
    if constexpr (has_cblas) {
        // CBLAS takes int sizes; larger problems take the fallback rather than overflow.
        // Inside a parallel region every core is already busy with this job, and OpenBLAS
        // would add its own threads on top: the fallback runs on this thread instead.
        if (gemm_uses_cblas() && !host::detail::inside_parallel_region() && fits_in_int(m) && fits_in_int(n) && fits_in_int(k) &&
            fits_in_int(lda) && fits_in_int(ldb) && fits_in_int(ldc)) {
            if (m == 0 || n == 0) return;
            if (bias != nullptr) {  // BLAS has no such epilogue: C starts as the bias
                fill_rows(m, n, bias, c, ldc);
                beta = T(1);
            }
            const bool trans_a = ta == transpose::yes;
            const bool trans_b = tb == transpose::yes;
            if constexpr (std::is_same_v<T, float>) {
                cblas::sgemm(trans_a, trans_b, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c,
                             int(ldc));
            } else {
                cblas::dgemm(trans_a, trans_b, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c,
                             int(ldc));
            }
            return;
        }
    }
    fallback_unchecked(best_cpu_isa(), thread_pool::global(), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                       bias);
}

}  // namespace detail::gemm

// C = alpha * op(A) * op(B) + beta * C, through OpenBLAS when selected (gemm_uses_cblas()),
// otherwise (and inside a parallel_for range) through gemm_fallback. T is float or double.
template <class T>
void gemm(transpose ta, transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
          std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
    static_assert(detail::gemm::is_gemm_element_v<T>, "loom::host::gemm: T must be float or double");
    detail::gemm::check_arguments("gemm", ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
    detail::gemm::gemm_unchecked(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// C = alpha * op(A) * op(B) + bias, the n values of `bias` added to every row: a linear
// layer's forward. loom's kernels add the bias as they first store each tile of C, so C is
// neither written beforehand nor read back; through OpenBLAS, C starts as the bias.
template <class T>
void gemm_bias(transpose ta, transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
               std::int64_t lda, const T* b, std::int64_t ldb, const T* bias, T* c, std::int64_t ldc) {
    static_assert(detail::gemm::is_gemm_element_v<T>, "loom::host::gemm_bias: T must be float or double");
    detail::gemm::check_arguments("gemm_bias", ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
    if (bias == nullptr && m > 0 && n > 0)
        throw usage_error("gemm_bias: bias is null; pass n values, or call gemm with beta = 0");
    detail::gemm::gemm_unchecked(ta, tb, m, n, k, alpha, a, lda, b, ldb, T(0), c, ldc, bias);
}

// The portable path with an explicit micro-kernel (tests and benchmarks pin one this way).
// Throws usage_error when this CPU cannot run `isa`.
template <class T>
void gemm_fallback(cpu_isa isa, transpose ta, transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
                   const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
    static_assert(detail::gemm::is_gemm_element_v<T>, "loom::host::gemm_fallback: T must be float or double");
    detail::gemm::check_arguments("gemm_fallback", ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
    if (!cpu_isa_supported(isa)) {
        throw usage_error(std::string("gemm_fallback: this CPU cannot run the ") + to_string(isa) +
                          " micro-kernel; pass best_cpu_isa() or check cpu_isa_supported() first");
    }
    detail::gemm::fallback_unchecked(isa, thread_pool::global(), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// The portable path with the best micro-kernel for this CPU; always available.
template <class T>
void gemm_fallback(transpose ta, transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
                   std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
    gemm_fallback(best_cpu_isa(), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// For every g in [0, batch): gemm on a + g*stride_a, b + g*stride_b, c + g*stride_c.
// A stride of 0 for A or B reuses one matrix for the whole batch; the C matrices must not
// overlap (stride_c >= (m - 1) * ldc + n when batch > 1).
template <class T>
void gemm_batched(transpose ta, transpose tb, std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k,
                  T alpha, const T* a, std::int64_t lda, std::int64_t stride_a, const T* b, std::int64_t ldb,
                  std::int64_t stride_b, T beta, T* c, std::int64_t ldc, std::int64_t stride_c) {
    static_assert(detail::gemm::is_gemm_element_v<T>, "loom::host::gemm_batched: T must be float or double");
    const auto fail = [](const std::string& what) { throw usage_error("gemm_batched: " + what); };
    if (batch < 0) fail("batch = " + std::to_string(batch) + " is negative; pass batch >= 0");
    detail::gemm::check_arguments("gemm_batched", ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
    if (stride_a < 0 || stride_b < 0 || stride_c < 0) {
        fail("strides (" + std::to_string(stride_a) + ", " + std::to_string(stride_b) + ", " +
             std::to_string(stride_c) + ") must not be negative; pass the distance between consecutive matrices");
    }
    if (batch > 1 && m > 0 && n > 0 && stride_c < (m - 1) * ldc + n) {
        fail("stride_c = " + std::to_string(stride_c) + " makes the " + std::to_string(m) + " x " + std::to_string(n) +
             " outputs (ldc = " + std::to_string(ldc) +
             ") overlap; pass stride_c >= " + std::to_string((m - 1) * ldc + n));
    }
    if (batch == 0 || m == 0 || n == 0) return;
    const auto one = [&](std::int64_t g) {
        // A and B may be null when k == 0; no offset is applied to a null pointer.
        const T* a_g = a == nullptr ? a : a + g * stride_a;
        const T* b_g = b == nullptr ? b : b + g * stride_b;
        detail::gemm::gemm_unchecked(ta, tb, m, n, k, alpha, a_g, lda, b_g, ldb, beta, c + g * stride_c, ldc);
    };
    // Small matrices (attention heads) go one per thread, each multiplied serially by the
    // fallback (a gemm nested in parallel_for runs on its own thread); large ones use every
    // thread (or OpenBLAS) each.
    const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    const thread_pool& pool = thread_pool::global();
    if (batch >= pool.size() && flops <= 2.0 * 192 * 192 * 192) {
        parallel_for(0, batch, 1, [&](std::int64_t lo, std::int64_t hi) {
            for (std::int64_t g = lo; g < hi; ++g) one(g);
        });
        return;
    }
    for (std::int64_t g = 0; g < batch; ++g) one(g);
}

}  // namespace loom::host
