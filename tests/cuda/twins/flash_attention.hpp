#pragma once
// Host twin of the fused attention kernels (src/cuda/flash_attention.cuh): the same tiled
// algorithm, written for clarity, to be compared with the kernels on the GPU
// (tests/cuda/test_attention.cpp) and with loom's host attention on the CPU
// (tests/test_flash_attention_twin.cpp).
//
// What it shares with the kernels, and must keep sharing:
//   - tiles of 64 queries and 64 keys; under the causal mask (s == t) query tile i visits key
//     tiles 0..i, and key tile j is visited by query tiles j..;
//   - the forward's online softmax, per key tile and row: m' = max(m, tile max of the raw
//     scores), shift b = sl2 m' (0 while m' = -inf), alpha = 2^(sl2 m - b),
//     P = 2^(sl2 S - b), l = alpha l + sum P, O = alpha O + P V; out = O / l and
//     lse = scale m + ln l, with sl2 = scale log2(e);
//   - the backward's recomputation P = 2^(sl2 S - log2(e) lse), D = rowsum(dout * out),
//     dS = P (dP - D), dV = P^T dout, dK = scale dS^T Q, dQ = scale dS K, the scale applied
//     once at the end;
//   - the roundings: with bf16 storage, P and dS are rounded to bf16 where they become a
//     product's operand (P V, P^T dO, dS^T Q, dS K), l sums the unrounded P, and results are
//     rounded once when stored; lse and D stay in the compute type.
// What it does not share: the order of float additions inside a dot product and across the
// lanes of a row (tensor cores do not specify theirs), and exp2 (the GPU's exp2f is within
// 2 ulp). The comparisons allow for those.
//
// T is the storage type (float, double or loom::bfloat16) and C the compute type (float, as
// the kernels; double, to check the algorithm itself against a double reference).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include <loom/core/bfloat16.hpp>

namespace loom::cuda_twin {

inline constexpr std::int64_t flash_query_tile = 64;
inline constexpr std::int64_t flash_key_tile = 64;

struct flash_dims {
    std::int64_t batch_heads = 1;
    std::int64_t queries = 0;  // s
    std::int64_t keys = 0;     // t (== s when causal)
    std::int64_t head_dim = 0;
    bool causal = true;
    double scale = 0.0;  // > 0
};

namespace detail {

template <class C, class T>
C widen(T x) {
    if constexpr (std::is_same_v<T, bfloat16>) return static_cast<C>(static_cast<float>(x));
    else return static_cast<C>(x);
}

template <class T, class C>
T narrow(C x) {
    if constexpr (std::is_same_v<T, bfloat16>) return bfloat16(static_cast<float>(x));
    else return static_cast<T>(x);
}

// A value as the kernels feed it to a product: rounded to bf16 when the storage is bf16.
template <class T, class C>
C operand(C x) {
    if constexpr (std::is_same_v<T, bfloat16>) return static_cast<C>(round_to_bfloat16(static_cast<float>(x)));
    else return x;
}

template <class C, class T>
C dot(const T* a, const T* b, std::int64_t n) {
    C sum = 0;
    for (std::int64_t i = 0; i < n; ++i) sum = std::fma(widen<C>(a[i]), widen<C>(b[i]), sum);
    return sum;
}

// The scale as the kernels hold it: rounded once to C, and scale * log2(e) likewise.
template <class C>
struct scales {
    C scale, scale_log2, log2e;
    explicit scales(double s)
        : scale(static_cast<C>(s)), scale_log2(static_cast<C>(s * 1.4426950408889634)),
          log2e(static_cast<C>(1.4426950408889634)) {}
};

// Key tiles visible to the query tile starting at i0.
inline std::int64_t visible_key_tiles(const flash_dims& d, std::int64_t i0) {
    const std::int64_t all = (d.keys + flash_key_tile - 1) / flash_key_tile;
    if (!d.causal) return all;
    const std::int64_t last_row = std::min(i0 + flash_query_tile - 1, d.queries - 1);
    return std::min(all, last_row / flash_key_tile + 1);
}

inline bool visible(const flash_dims& d, std::int64_t query, std::int64_t key) {
    return query < d.queries && key < d.keys && !(d.causal && key > query);
}

}  // namespace detail

// out [bh, s, d] and lse [bh, s] from q [bh, s, d], k and v [bh, t, d].
template <class T, class C = float>
void flash_forward(const flash_dims& d, const T* q, const T* k, const T* v, T* out, C* lse) {
    using namespace detail;
    const scales<C> sc(d.scale);
    const std::int64_t D = d.head_dim;
    const C minus_inf = -std::numeric_limits<C>::infinity();
    std::vector<C> s(flash_key_tile), o(static_cast<std::size_t>(D));
    for (std::int64_t bh = 0; bh < d.batch_heads; ++bh) {
        const T* qb = q + bh * d.queries * D;
        const T* kb = k + bh * d.keys * D;
        const T* vb = v + bh * d.keys * D;
        for (std::int64_t i0 = 0; i0 < d.queries; i0 += flash_query_tile) {
            const std::int64_t key_tiles = visible_key_tiles(d, i0);
            // Rows are independent in the kernels too; each row carries (m, l, O) across tiles.
            for (std::int64_t i = i0; i < std::min(i0 + flash_query_tile, d.queries); ++i) {
                C m = minus_inf, l = 0;
                std::fill(o.begin(), o.end(), C(0));
                for (std::int64_t kt = 0; kt < key_tiles; ++kt) {
                    const std::int64_t k0 = kt * flash_key_tile;
                    C top = minus_inf;
                    for (std::int64_t c = 0; c < flash_key_tile; ++c) {
                        const std::int64_t j = k0 + c;
                        s[c] = visible(d, i, j) ? dot<C>(qb + i * D, kb + j * D, D) : minus_inf;
                        top = std::max(top, s[c]);
                    }
                    const C next = std::max(m, top);
                    const C shift = next == minus_inf ? C(0) : next * sc.scale_log2;
                    const C alpha = std::exp2(m * sc.scale_log2 - shift);
                    m = next;
                    C sum = 0;
                    for (std::int64_t c = 0; c < flash_key_tile; ++c) {
                        s[c] = std::exp2(std::fma(s[c], sc.scale_log2, -shift));
                        sum += s[c];
                    }
                    l = l * alpha + sum;
                    for (std::int64_t e = 0; e < D; ++e) o[e] *= alpha;
                    for (std::int64_t c = 0; c < flash_key_tile; ++c) {
                        const std::int64_t j = k0 + c;
                        if (j >= d.keys) break;  // zero rows of V in the kernels
                        const C p = operand<T>(s[c]);
                        for (std::int64_t e = 0; e < D; ++e) o[e] = std::fma(p, widen<C>(vb[j * D + e]), o[e]);
                    }
                }
                const C inv = C(1) / l;
                for (std::int64_t e = 0; e < D; ++e) out[(bh * d.queries + i) * D + e] = narrow<T>(o[e] * inv);
                lse[bh * d.queries + i] = m * sc.scale + std::log(l);
            }
        }
    }
}

// dq, dk, dv from dout and the forward's q, k, v, out and lse, in the kernels' two passes.
template <class T, class C = float>
void flash_backward(const flash_dims& d, const T* dout, const T* q, const T* k, const T* v, const T* out,
                    const C* lse, T* dq, T* dk, T* dv) {
    using namespace detail;
    const scales<C> sc(d.scale);
    const std::int64_t D = d.head_dim;
    std::vector<C> delta(static_cast<std::size_t>(d.queries)), acc_a(static_cast<std::size_t>(D)),
        acc_b(static_cast<std::size_t>(D));
    for (std::int64_t bh = 0; bh < d.batch_heads; ++bh) {
        const T* qb = q + bh * d.queries * D;
        const T* kb = k + bh * d.keys * D;
        const T* vb = v + bh * d.keys * D;
        const T* dob = dout + bh * d.queries * D;
        const C* lb = lse + bh * d.queries;
        for (std::int64_t i = 0; i < d.queries; ++i) delta[i] = dot<C>(dob + i * D, out + (bh * d.queries + i) * D, D);
        // P and dS of one (query, key) pair, as both passes recompute them.
        auto probability = [&](std::int64_t i, std::int64_t j) {
            if (!visible(d, i, j)) return C(0);
            return std::exp2(std::fma(dot<C>(kb + j * D, qb + i * D, D), sc.scale_log2, -(lb[i] * sc.log2e)));
        };
        auto score_grad = [&](std::int64_t i, std::int64_t j, C p) {
            return p * (dot<C>(vb + j * D, dob + i * D, D) - delta[i]);
        };

        // dK, dV: per key tile, over the query tiles that see it, queries in order.
        for (std::int64_t j0 = 0; j0 < d.keys; j0 += flash_key_tile) {
            const std::int64_t first = d.causal ? j0 / flash_query_tile * flash_query_tile : 0;
            for (std::int64_t j = j0; j < std::min(j0 + flash_key_tile, d.keys); ++j) {
                std::fill(acc_a.begin(), acc_a.end(), C(0));  // dK
                std::fill(acc_b.begin(), acc_b.end(), C(0));  // dV
                for (std::int64_t i = first; i < d.queries; ++i) {
                    const C p = probability(i, j);
                    const C ds = operand<T>(score_grad(i, j, p));
                    const C pr = operand<T>(p);
                    for (std::int64_t e = 0; e < D; ++e) {
                        acc_b[e] = std::fma(pr, widen<C>(dob[i * D + e]), acc_b[e]);
                        acc_a[e] = std::fma(ds, widen<C>(qb[i * D + e]), acc_a[e]);
                    }
                }
                for (std::int64_t e = 0; e < D; ++e) {
                    dk[(bh * d.keys + j) * D + e] = narrow<T>(acc_a[e] * sc.scale);
                    dv[(bh * d.keys + j) * D + e] = narrow<T>(acc_b[e]);
                }
            }
        }

        // dQ: per query tile, over its visible key tiles, keys in order.
        for (std::int64_t i0 = 0; i0 < d.queries; i0 += flash_query_tile) {
            const std::int64_t key_end = std::min(visible_key_tiles(d, i0) * flash_key_tile, d.keys);
            for (std::int64_t i = i0; i < std::min(i0 + flash_query_tile, d.queries); ++i) {
                std::fill(acc_a.begin(), acc_a.end(), C(0));
                for (std::int64_t j = 0; j < key_end; ++j) {
                    const C ds = operand<T>(score_grad(i, j, probability(i, j)));
                    for (std::int64_t e = 0; e < D; ++e) acc_a[e] = std::fma(ds, widen<C>(kb[j * D + e]), acc_a[e]);
                }
                for (std::int64_t e = 0; e < D; ++e) dq[(bh * d.queries + i) * D + e] = narrow<T>(acc_a[e] * sc.scale);
            }
        }
    }
}

}  // namespace loom::cuda_twin
