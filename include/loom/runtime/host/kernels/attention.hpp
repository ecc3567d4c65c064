#pragma once
// Kernels of attention and attention_grad, flash-attention style: queries are taken in tiles
// of 32, the scores of a tile live only in a per-thread scratch of keys x 32, and under the
// causal mask no key after a tile's last query is computed.
//
// The scratch is key-major: row j holds the scores of key j against the tile's queries, so
// the softmax of each query (a column) is elementwise work over rows, with no reduction
// across vector lanes. Per (batch, head) and tile of queries [i0, i1), keys j < kn
// (kn = i1 when causal, t otherwise):
//   forward   S^T = scale K Q^T,  P^T = exp(S^T - max) column by column (causal: j <= i),
//             O = P V / sum,  lse = max + log(sum)
//   backward  P^T = exp(scale K Q^T - lse),  D = rowsum(dO * O),
//             dV += P^T dO,  dP^T = V dO^T,  dS^T = P^T * (dP^T - D),
//             dQ = scale dS K,  dK += scale dS^T Q
// Only the tile's Q (and dO) are transposed, into d x 32 (e x 32) scratch.
//
// Determinism: forward tiles are independent, a (batch, head)'s backward runs on one thread
// with its tiles in order, and every sum has a fixed order: results do not depend on the
// thread count.
//
// Vector code is written with GCC vector extensions (also understood by Clang), compiled for
// AVX-512, AVX2 and baseline x86-64 and chosen at run time as gemm chooses its micro-kernel.
// exp is a Cephes polynomial: within 1 ulp (float) and 2 ulp (double) of the correctly
// rounded value; inputs below about -88 (float) or -709 (double) flush to 0.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/ops/attention.hpp>
#include <loom/runtime/host/gemm.hpp>
#include <loom/runtime/host/kernel_call.hpp>
#include <loom/runtime/host/thread_pool.hpp>

namespace loom::host {

namespace detail::attention {

// Queries per tile: the row length of the key-major scratch.
inline constexpr std::int64_t query_tile = 32;
// Elements per block of the column passes.
inline constexpr std::int64_t lanes = 16;
inline constexpr std::int64_t blocks_per_row = query_tile / lanes;

template <class T>
struct simd;
template <>
struct simd<float> {
    using real = float __attribute__((vector_size(64)));
    using integer = std::int32_t __attribute__((vector_size(64)));
};
template <>
struct simd<double> {
    using real = double __attribute__((vector_size(128)));
    using integer = std::int64_t __attribute__((vector_size(128)));
    using narrow = std::int32_t __attribute__((vector_size(64)));
};
template <class T>
using block = typename simd<T>::real;

// Blocks pass by reference: a vector passed by value would change the ABI between the
// instruction sets this code is compiled for.
template <class T>
[[gnu::always_inline]] inline void load(block<T>& v, const T* p) {
    std::memcpy(&v, p, sizeof v);
}
template <class T>
[[gnu::always_inline]] inline void store(T* p, const block<T>& v) {
    std::memcpy(p, &v, sizeof v);
}

// x = exp(x) lane by lane: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by a polynomial, 2^n
// built in the exponent bits. Inputs below the range flush to +0 (n reaches the zero
// exponent); NaN stays NaN.
[[gnu::always_inline]] inline void exp_block(simd<float>::real& x) {
    using V = simd<float>::real;
    using I = simd<float>::integer;
    const V zero = {};
    x = x > 88.0f ? zero + 88.0f : x;
    x = x < -88.0f ? zero - 88.0f : x;
    // n = floor(x log2(e) + 1/2): the offset keeps the truncated value non-negative.
    const I n = __builtin_convertvector(x * 1.44269504088896341f + 127.5f, I) - 127;
    const V fn = __builtin_convertvector(n, V);
    V r = x - fn * 0.693359375f;
    r = r - fn * -2.12194440e-4f;
    V p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    x = p * __builtin_bit_cast(V, (n + 127) << 23);
}

[[gnu::always_inline]] inline void exp_block(simd<double>::real& x) {
    using V = simd<double>::real;
    using I = simd<double>::integer;
    using N = simd<double>::narrow;
    const V zero = {};
    x = x > 709.0 ? zero + 709.0 : x;
    x = x < -709.0 ? zero - 709.0 : x;
    const N n = __builtin_convertvector(x * 1.4426950408889634074 + 1023.5, N) - 1023;
    const V fn = __builtin_convertvector(n, V);
    V r = x - fn * 6.93145751953125e-1;
    r = r - fn * 1.42860682030941723212e-6;
    // exp(r) = 1 + 2 r P(r^2) / (Q(r^2) - r P(r^2))
    const V rr = r * r;
    const V pr = r * ((rr * 1.26177193074810590878e-4 + 3.02994407707441961300e-2) * rr + 9.99999999999999999910e-1);
    const V q = ((rr * 3.00198505138664455042e-6 + 2.52448340349684104192e-3) * rr + 2.27265548208155028766e-1) * rr +
                2.00000000000000000009e0;
    const V e = pr / (q - pr) * 2.0 + 1.0;
    const I bits = (__builtin_convertvector(n, I) + 1023) << 52;
    x = e * __builtin_bit_cast(V, bits);
}

template <class T>
[[gnu::always_inline]] inline void fill(block<T>& v, T value) {
    v = block<T>{} + value;
}

// The lane numbers of the blocks of a scratch row: 0, 1, ..., query_tile - 1.
template <class T>
struct lane_numbers {
    block<T> of[blocks_per_row];
    lane_numbers() {
        for (std::int64_t b = 0; b < blocks_per_row; ++b)
            for (std::int64_t l = 0; l < lanes; ++l) of[b][l] = static_cast<T>(b * lanes + l);
    }
};

// Under the causal mask, query i0 + i sees key j only when j <= i0 + i: in key row j, the
// lanes i < j - i0 are masked (set to `masked`). Keys j <= i0 mask nothing.
template <class T>
[[gnu::always_inline]] inline void mask_future(block<T>& x, const block<T>& lane, std::int64_t first_seen, T masked) {
    x = lane < static_cast<T>(first_seen) ? block<T>{} + masked : x;
}

// Forward: st (kn rows of query_tile) becomes exp(S^T - max) column by column; top and sum
// receive each column's max and sum of exponentials.
template <class T>
[[gnu::always_inline]] inline void softmax_columns(T* __restrict st, std::int64_t kn, std::int64_t i0, bool causal,
                                                   T* __restrict top, T* __restrict sum) {
    const T minus_inf = -std::numeric_limits<T>::infinity();
    const std::int64_t unmasked = causal ? std::min(kn, i0 + 1) : kn;
    const lane_numbers<T> lane;
    block<T> m[blocks_per_row], x;
    for (auto& v : m) fill<T>(v, minus_inf);
    for (std::int64_t j = 0; j < unmasked; ++j)
        for (std::int64_t b = 0; b < blocks_per_row; ++b) {
            load(x, st + j * query_tile + b * lanes);
            m[b] = x > m[b] ? x : m[b];
        }
    for (std::int64_t j = unmasked; j < kn; ++j)
        for (std::int64_t b = 0; b < blocks_per_row; ++b) {
            T* at = st + j * query_tile + b * lanes;
            load(x, at);
            mask_future<T>(x, lane.of[b], j - i0, minus_inf);
            store(at, x);
            m[b] = x > m[b] ? x : m[b];
        }
    block<T> total[blocks_per_row];
    for (auto& v : total) v = block<T>{};
    for (std::int64_t j = 0; j < kn; ++j)
        for (std::int64_t b = 0; b < blocks_per_row; ++b) {
            T* at = st + j * query_tile + b * lanes;
            load(x, at);
            x -= m[b];
            exp_block(x);
            total[b] += x;
            store(at, x);
        }
    for (std::int64_t b = 0; b < blocks_per_row; ++b) {
        store(top + b * lanes, m[b]);
        store(sum + b * lanes, total[b]);
    }
}

// Backward: st = exp(S^T - lse) column by column, 0 where masked.
template <class T>
[[gnu::always_inline]] inline void probabilities_columns(T* __restrict st, std::int64_t kn, std::int64_t i0,
                                                         bool causal, const T* __restrict lse) {
    const std::int64_t unmasked = causal ? std::min(kn, i0 + 1) : kn;
    const lane_numbers<T> lane;
    block<T> shift[blocks_per_row], x;
    for (std::int64_t b = 0; b < blocks_per_row; ++b) load(shift[b], lse + b * lanes);
    for (std::int64_t j = 0; j < kn; ++j)
        for (std::int64_t b = 0; b < blocks_per_row; ++b) {
            T* at = st + j * query_tile + b * lanes;
            load(x, at);
            x -= shift[b];
            exp_block(x);
            if (j >= unmasked) mask_future<T>(x, lane.of[b], j - i0, T(0));
            store(at, x);
        }
}

// Backward: dst = pt * (dst - D) column by column; masked entries of pt are 0, so dS is too.
template <class T>
[[gnu::always_inline]] inline void score_grad_columns(const T* __restrict pt, T* __restrict dst, std::int64_t kn,
                                                      const T* __restrict delta) {
    block<T> d[blocks_per_row], x, y;
    for (std::int64_t b = 0; b < blocks_per_row; ++b) load(d[b], delta + b * lanes);
    for (std::int64_t j = 0; j < kn; ++j)
        for (std::int64_t b = 0; b < blocks_per_row; ++b) {
            const std::int64_t at = j * query_tile + b * lanes;
            load(x, pt + at);
            load(y, dst + at);
            y = x * (y - d[b]);
            store(dst + at, y);
        }
}

// sum_c x[c] y[c]: blocks of lanes, then the lanes pairwise, then the remainder in order.
template <class T>
[[gnu::always_inline]] inline T dot(const T* __restrict x, const T* __restrict y, std::int64_t n) {
    block<T> acc = {}, a, b;
    std::int64_t c = 0;
    for (; c + lanes <= n; c += lanes) {
        load(a, x + c);
        load(b, y + c);
        acc += a * b;
    }
    T partial[lanes];
    std::memcpy(partial, &acc, sizeof acc);
    for (std::int64_t width = lanes / 2; width > 0; width /= 2)
        for (std::int64_t l = 0; l < width; ++l) partial[l] += partial[l + width];
    T sum = partial[0];
    for (; c < n; ++c) sum += x[c] * y[c];
    return sum;
}

// ---- products of a tile ----------------------------------------------------------------
// The operands are small (a tile of 32 queries, head dims of 32..128), so the products run
// on them in place, without gemm's packing: B's rows are contiguous and A is read one
// element at a time through two strides, which also reads S^T as S.

template <class T, int W>
struct native {
    typedef T type __attribute__((vector_size(W * sizeof(T))));
};

// A(i, p) = data[i * row + p * col]
template <class T>
struct strided {
    const T* data;
    std::int64_t row, col;
};

// C[0, R) x [0, CV W) = alpha A B (+ C when accumulate), B's rows ldb apart. With
// row_scale, row r is scaled by alpha row_scale[r] instead.
template <class T, int W, int R, int CV>
[[gnu::always_inline]] inline void product_block(std::int64_t k, const T* __restrict a, std::int64_t a_row,
                                                 std::int64_t a_col, const T* __restrict b, std::int64_t ldb,
                                                 T* __restrict c, std::int64_t ldc, T alpha, const T* row_scale,
                                                 bool accumulate) {
    using V = typename native<T, W>::type;
    V acc[R][CV];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int v = 0; v < CV; ++v) acc[r][v] = V{};
    for (std::int64_t p = 0; p < k; ++p) {
        V bv[CV];
#pragma GCC unroll 4
        for (int v = 0; v < CV; ++v) std::memcpy(&bv[v], b + p * ldb + v * W, sizeof(V));
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            const T av = a[r * a_row + p * a_col];
#pragma GCC unroll 4
            for (int v = 0; v < CV; ++v) acc[r][v] += av * bv[v];
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        const T factor = row_scale ? alpha * row_scale[r] : alpha;
#pragma GCC unroll 4
        for (int v = 0; v < CV; ++v) {
            V result = acc[r][v] * factor;
            T* out = c + r * ldc + v * W;
            if (accumulate) {
                V old;
                std::memcpy(&old, out, sizeof(V));
                result += old;
            }
            std::memcpy(out, &result, sizeof(V));
        }
    }
}

// Columns [j, j + CV W) of product(): R rows at a time, then the remaining rows one by one.
// (A helper function rather than a lambda: a lambda would not take its caller's target.)
template <class T, int W, int R, int CV>
[[gnu::always_inline]] inline void product_columns(std::int64_t j, std::int64_t m, std::int64_t k, strided<T> a,
                                                   const T* b, std::int64_t ldb, T* c, std::int64_t ldc, T alpha,
                                                   bool accumulate, const T* row_scale) {
    std::int64_t i = 0;
    for (; i + R <= m; i += R)
        product_block<T, W, R, CV>(k, a.data + i * a.row, a.row, a.col, b + j, ldb, c + i * ldc + j, ldc, alpha,
                                   row_scale ? row_scale + i : nullptr, accumulate);
    for (; i < m; ++i)
        product_block<T, W, 1, CV>(k, a.data + i * a.row, a.row, a.col, b + j, ldb, c + i * ldc + j, ldc, alpha,
                                   row_scale ? row_scale + i : nullptr, accumulate);
}

// C (m x n, rows ldc apart) = alpha A B (+ C when accumulate); A is m x k, B is k x n.
// With row_scale, row i of the product is scaled by alpha row_scale[i]. Register tiles of
// R rows by 2 W columns, then W columns, then the last n mod W columns one by one; every
// element sums over p in order.
template <class T, int W, int R>
[[gnu::always_inline]] inline void product(std::int64_t m, std::int64_t n, std::int64_t k, strided<T> a,
                                           const T* b, std::int64_t ldb, T* c, std::int64_t ldc, T alpha,
                                           bool accumulate, const T* row_scale = nullptr) {
    std::int64_t j = 0;
    for (; j + 2 * W <= n; j += 2 * W)
        product_columns<T, W, R, 2>(j, m, k, a, b, ldb, c, ldc, alpha, accumulate, row_scale);
    for (; j + W <= n; j += W) product_columns<T, W, R, 1>(j, m, k, a, b, ldb, c, ldc, alpha, accumulate, row_scale);
    for (std::int64_t i = 0; i < m && j < n; ++i) {
        const T factor = row_scale ? alpha * row_scale[i] : alpha;
        for (std::int64_t jj = j; jj < n; ++jj) {
            T sum = 0;
            for (std::int64_t p = 0; p < k; ++p) sum += a.data[i * a.row + p * a.col] * b[p * ldb + jj];
            c[i * ldc + jj] = accumulate ? c[i * ldc + jj] + factor * sum : factor * sum;
        }
    }
}

// ---- the kernels ---------------------------------------------------------------------------

// The extents of one node: `pairs` (batch, head) pairs of s queries and t keys.
struct problem {
    std::int64_t pairs, s, t, d, e;
    bool causal;
    double scale;

    std::int64_t tiles() const { return (s + query_tile - 1) / query_tile; }
    // Keys seen by the tile whose queries end at i1.
    std::int64_t keys(std::int64_t i1) const { return causal ? i1 : t; }
};

template <class T>
problem problem_of(const kernel_call<T>& c) {
    problem p;
    p.pairs = c.extent("b") * c.extent("h");
    p.s = c.extent("s");
    p.t = c.extent("t");
    p.d = c.extent("d");
    p.e = c.extent("e");
    p.causal = c.attrs().template get_or<std::int64_t>("causal", 1) != 0;
    p.scale = c.attrs().template get_or<double>("scale", 1.0 / std::sqrt(static_cast<double>(p.d)));
    return p;
}

// Per-thread scratch. Lanes of a partial tile past its last query hold zeros (or finite
// leftovers) and are never read back.
template <class T>
struct workspace {
    std::vector<T> scores, score_grads, queries_t, grads_t, lanes_a, lanes_b;
    workspace(const problem& p, bool backward)
        : scores(static_cast<std::size_t>(p.t * query_tile)),
          score_grads(backward ? scores.size() : 0),
          queries_t(static_cast<std::size_t>(p.d * query_tile)),
          grads_t(backward ? static_cast<std::size_t>(p.e * query_tile) : 0),
          lanes_a(static_cast<std::size_t>(query_tile)),
          lanes_b(static_cast<std::size_t>(query_tile)) {}
};

// xt[p, i] = x[i, p] for the `rows` rows of x (cols wide); rows of xt are query_tile long,
// and lanes past `rows` are zero.
template <class T>
[[gnu::always_inline]] inline void transpose_tile(const T* __restrict x, std::int64_t rows, std::int64_t cols,
                                                  T* __restrict xt) {
    for (std::int64_t p = 0; p < cols; ++p) {
        T* __restrict row = xt + p * query_tile;
        for (std::int64_t i = 0; i < rows; ++i) row[i] = x[i * cols + p];
        for (std::int64_t i = rows; i < query_tile; ++i) row[i] = T(0);
    }
}

template <class T>
struct tensors {
    const T *q, *k, *v, *out, *lse, *dout;
    T *out_w, *lse_w, *dq, *dk, *dv;
};

// Forward tiles [lo, hi), numbered pair * tiles + tile. W: lanes of a vector register,
// R: rows of a register tile.
template <class T, int W, int R>
[[gnu::always_inline]] inline void forward_tiles(const problem& p, const tensors<T>& x, std::int64_t lo,
                                                 std::int64_t hi, workspace<T>& ws) {
    const std::int64_t tiles = p.tiles();
    const T scale = static_cast<T>(p.scale);
    T* st = ws.scores.data();
    T* top = ws.lanes_a.data();
    T* sum = ws.lanes_b.data();
    for (std::int64_t item = lo; item < hi; ++item) {
        const std::int64_t pair = item / tiles;
        const std::int64_t i0 = item % tiles * query_tile;
        const std::int64_t rows = std::min(query_tile, p.s - i0);
        const std::int64_t kn = p.keys(i0 + rows);
        transpose_tile(x.q + (pair * p.s + i0) * p.d, rows, p.d, ws.queries_t.data());
        product<T, W, R>(kn, query_tile, p.d, {x.k + pair * p.t * p.d, p.d, 1}, ws.queries_t.data(), query_tile, st,
                         query_tile, scale, false);
        softmax_columns(st, kn, i0, p.causal, top, sum);
        T* lse = x.lse_w + pair * p.s + i0;
        for (std::int64_t i = 0; i < rows; ++i) {
            lse[i] = top[i] + std::log(sum[i]);
            sum[i] = T(1) / sum[i];
        }
        // O = P V / sum
        product<T, W, R>(rows, p.e, kn, {st, 1, query_tile}, x.v + pair * p.t * p.e, p.e,
                         x.out_w + (pair * p.s + i0) * p.e, p.e, T(1), false, sum);
    }
}

// The backward of pairs [lo, hi), the tiles of a pair in order.
template <class T, int W, int R>
[[gnu::always_inline]] inline void backward_pairs(const problem& p, const tensors<T>& x, std::int64_t lo,
                                                  std::int64_t hi, workspace<T>& ws) {
    const std::int64_t tiles = p.tiles();
    const T scale = static_cast<T>(p.scale);
    T* st = ws.scores.data();
    T* dst = ws.score_grads.data();
    T* lse = ws.lanes_a.data();
    T* delta = ws.lanes_b.data();
    for (std::int64_t pair = lo; pair < hi; ++pair) {
        const T* k = x.k + pair * p.t * p.d;
        const T* v = x.v + pair * p.t * p.e;
        T* dk = x.dk + pair * p.t * p.d;
        T* dv = x.dv + pair * p.t * p.e;
        std::fill(dk, dk + p.t * p.d, T(0));
        std::fill(dv, dv + p.t * p.e, T(0));
        for (std::int64_t tile = 0; tile < tiles; ++tile) {
            const std::int64_t i0 = tile * query_tile;
            const std::int64_t rows = std::min(query_tile, p.s - i0);
            const std::int64_t kn = p.keys(i0 + rows);
            const T* q = x.q + (pair * p.s + i0) * p.d;
            const T* dout = x.dout + (pair * p.s + i0) * p.e;
            const T* out = x.out + (pair * p.s + i0) * p.e;
            for (std::int64_t i = 0; i < query_tile; ++i) {
                delta[i] = i < rows ? dot(dout + i * p.e, out + i * p.e, p.e) : T(0);
                lse[i] = i < rows ? x.lse[pair * p.s + i0 + i] : T(0);
            }
            transpose_tile(q, rows, p.d, ws.queries_t.data());
            transpose_tile(dout, rows, p.e, ws.grads_t.data());
            // P^T = exp(scale K Q^T - lse)
            product<T, W, R>(kn, query_tile, p.d, {k, p.d, 1}, ws.queries_t.data(), query_tile, st, query_tile, scale,
                             false);
            probabilities_columns(st, kn, i0, p.causal, lse);
            // dV += P^T dO
            product<T, W, R>(kn, p.e, rows, {st, query_tile, 1}, dout, p.e, dv, p.e, T(1), true);
            // dS^T = P^T * (V dO^T - D)
            product<T, W, R>(kn, query_tile, p.e, {v, p.e, 1}, ws.grads_t.data(), query_tile, dst, query_tile, T(1),
                             false);
            score_grad_columns(st, dst, kn, delta);
            // dQ = scale dS K,  dK += scale dS^T Q
            product<T, W, R>(rows, p.d, kn, {dst, 1, query_tile}, k, p.d, x.dq + (pair * p.s + i0) * p.d, p.d, scale,
                             false);
            product<T, W, R>(kn, p.d, rows, {dst, query_tile, 1}, q, p.d, dk, p.d, scale, true);
        }
    }
}

// One entry per instruction set, chosen at run time as gemm chooses its micro-kernel:
// W fills one vector register, R rows keep the 2 R accumulators in registers.
// optimize("O2"): at -O0, g++ 12 cannot lower these wide generic vectors ("unrecognizable
// insn", an internal compiler error), so a user's debug build would not compile.
template <class T>
[[gnu::target("avx512f"), gnu::optimize("O2")]] void forward_avx512(const problem& p, const tensors<T>& x, std::int64_t lo,
                                               std::int64_t hi, workspace<T>& ws) {
    forward_tiles<T, 64 / sizeof(T), 8>(p, x, lo, hi, ws);
}
template <class T>
[[gnu::target("avx2,fma"), gnu::optimize("O2")]] void forward_avx2(const problem& p, const tensors<T>& x, std::int64_t lo,
                                              std::int64_t hi, workspace<T>& ws) {
    forward_tiles<T, 32 / sizeof(T), 4>(p, x, lo, hi, ws);
}
template <class T>
void forward_portable(const problem& p, const tensors<T>& x, std::int64_t lo, std::int64_t hi, workspace<T>& ws) {
    forward_tiles<T, 16 / sizeof(T), 4>(p, x, lo, hi, ws);
}
template <class T>
[[gnu::target("avx512f"), gnu::optimize("O2")]] void backward_avx512(const problem& p, const tensors<T>& x, std::int64_t lo,
                                                std::int64_t hi, workspace<T>& ws) {
    backward_pairs<T, 64 / sizeof(T), 8>(p, x, lo, hi, ws);
}
template <class T>
[[gnu::target("avx2,fma"), gnu::optimize("O2")]] void backward_avx2(const problem& p, const tensors<T>& x, std::int64_t lo,
                                               std::int64_t hi, workspace<T>& ws) {
    backward_pairs<T, 32 / sizeof(T), 4>(p, x, lo, hi, ws);
}
template <class T>
void backward_portable(const problem& p, const tensors<T>& x, std::int64_t lo, std::int64_t hi, workspace<T>& ws) {
    backward_pairs<T, 16 / sizeof(T), 4>(p, x, lo, hi, ws);
}

// The kernels; `isa` must be supported by this CPU (tests pin each one this way).
inline void require_supported(cpu_isa isa) {
    if (!cpu_isa_supported(isa))
        throw usage_error(std::string("attention kernels: this CPU cannot run the ") + to_string(isa) +
                          " variant; pass best_cpu_isa() or check cpu_isa_supported() first");
}

template <class T>
void forward(const kernel_call<T>& c, cpu_isa isa = best_cpu_isa()) {
    require_supported(isa);
    const problem p = problem_of(c);
    tensors<T> x{};
    x.q = c.input(0);
    x.k = c.input(1);
    x.v = c.input(2);
    x.out_w = c.output(0);
    x.lse_w = c.output(1);
    parallel_for(0, p.pairs * p.tiles(), 1, [&](std::int64_t lo, std::int64_t hi) {
        workspace<T> ws(p, false);
        switch (isa) {
            case cpu_isa::avx512f: forward_avx512<T>(p, x, lo, hi, ws); return;
            case cpu_isa::avx2_fma: forward_avx2<T>(p, x, lo, hi, ws); return;
            case cpu_isa::portable: forward_portable<T>(p, x, lo, hi, ws); return;
        }
    });
}

template <class T>
void backward(const kernel_call<T>& c, cpu_isa isa = best_cpu_isa()) {
    require_supported(isa);
    const problem p = problem_of(c);
    tensors<T> x{};
    x.dout = c.input(0);
    x.q = c.input(1);
    x.k = c.input(2);
    x.v = c.input(3);
    x.out = c.input(4);
    x.lse = c.input(5);
    x.dq = c.output(0);
    x.dk = c.output(1);
    x.dv = c.output(2);
    parallel_for(0, p.pairs, 1, [&](std::int64_t lo, std::int64_t hi) {
        workspace<T> ws(p, true);
        switch (isa) {
            case cpu_isa::avx512f: backward_avx512<T>(p, x, lo, hi, ws); return;
            case cpu_isa::avx2_fma: backward_avx2<T>(p, x, lo, hi, ws); return;
            case cpu_isa::portable: backward_portable<T>(p, x, lo, hi, ws); return;
        }
    });
}

}  // namespace detail::attention

template <>
struct host_kernel<ops::Attention> {
    template <class T>
    static void run(const kernel_call<T>& c) { detail::attention::forward<T>(c); }
};

template <>
struct host_kernel<ops::AttentionGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) { detail::attention::backward<T>(c); }
};

}  // namespace loom::host
