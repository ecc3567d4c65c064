#pragma once
// The fused attention kernels behind <loom/runtime/cuda/attention.hpp>, flash-attention style:
// scores live in registers one 64 x 64 tile at a time, so no s x t matrix is ever stored.
// Host twin: tests/cuda/twins/flash_attention.hpp (same tiles, same update order, same
// roundings); keep the two in step.
//
// Layout: q, k, v, out, dout, dq, dk, dv are [b h, rows, D] row-major (D = 64 or 128), lse and
// delta [b h, s] float. A block of 4 warps owns a 64-row tile; warp w owns its rows
// 16 w .. 16 w + 15, the row dimension of every m16n8k16 product it runs.
//
//   forward   one block per (query tile, b h); over the visible key tiles in order:
//             S = Q K^T (unscaled), masked to -inf; per row m' = max(m, rowmax S),
//             alpha = 2^(sl2 (m - m')), P = 2^(sl2 S - sl2 m'), l = alpha l + rowsum P,
//             O = alpha O + P V; then out = O / l, lse = scale m + ln l   (sl2 = scale log2 e)
//   delta     D_i = sum_e dout_ie out_ie (one warp per row)
//   dK, dV    one block per (key tile, b h); over the query tiles that see it, in order:
//             P^T = 2^(sl2 K Q^T - log2e lse), dV += P^T dO, dS^T = P^T * (V dO^T - D),
//             dK += dS^T Q; finally dK *= scale
//   dQ        one block per (query tile, b h); over the visible key tiles, in order:
//             P = 2^(sl2 Q K^T - log2e lse), dS = P * (dO V^T - D), dQ += dS K; dQ *= scale
// Every output element is written by one thread, and every sum runs in a fixed order: no
// atomics, results are bit-identical run to run.
//
// bf16 runs the products on tensor cores (mma.sync, float accumulators); P and dS are rounded
// to bf16 as they become the A operand of the next product, and l sums the unrounded P.
// float runs the same tiles with plain FMAs on the same register layout (one dot product per
// element, in column order), single-buffered; it exists for checking and small runs.
//
// Shared memory: 64-row tiles with rows padded by 16 bytes (spreads the rows of each ldmatrix
// over all banks). bf16 double-buffers the streamed tiles with cp.async: the copy of tile
// n + 1 runs during the products of tile n. One __syncthreads() per tile; the barrier that
// publishes tile n also proves every warp finished tile n - 1, whose buffer is refilled next.
//
// This header is device code only and relies on types.cuh and warp_mma.cuh for everything
// that touches the hardware.
#include <cstdint>
#include <type_traits>

#include "types.cuh"
#include "warp_mma.cuh"

namespace loom::cuda::detail::flash {

inline constexpr int query_tile = 64;
inline constexpr int key_tile = 64;
inline constexpr int warps = 4;
inline constexpr int threads = 32 * warps;
// Backward: queries (dK, dV) or keys (dQ) per register pass within a tile, which bounds the
// registers for scores and their gradients to 2 x (chunk / 8) x 4 per thread.
inline constexpr int chunk = 32;
inline constexpr float log2e = 1.4426950408889634f;

template <class E>
struct params {
    const E *q, *k, *v, *out, *dout;
    E *out_w, *dq, *dk, *dv;
    const float *lse, *delta;
    float* lse_w;
    std::int64_t s, t;  // queries and keys per (batch, head)
    bool causal;
    float scale, scale_log2;  // scale, and scale * log2(e)
};

template <class E, int D>
struct layout {
    static_assert(D == 64 || D == 128, "the attention kernels are built for head dims 64 and 128");
    static constexpr bool tensor_cores = std::is_same_v<E, __nv_bfloat16>;
    static constexpr int stride = D + 16 / static_cast<int>(sizeof(E));  // elements between rows
    static constexpr int tile_elems = 64 * stride;
    static constexpr int tile_bytes = tile_elems * static_cast<int>(sizeof(E));
    static constexpr int stages = tensor_cores ? 2 : 1;
    static constexpr int chunks_per_row = D * static_cast<int>(sizeof(E)) / 16;
    // A warp's A operand (16 rows) stays in registers as mma fragments where that fits.
    static constexpr bool cache_forward_a = tensor_cores;
    static constexpr bool cache_backward_a = tensor_cores && D <= 64;

    static constexpr int forward_smem = (1 + 2 * stages) * tile_bytes;
    static constexpr int backward_kv_smem = (2 + 2 * stages) * tile_bytes + 2 * stages * 64 * 4;
    static constexpr int backward_q_smem = (2 + 2 * stages) * tile_bytes;
};

// Key tiles the query tile starting at i0 sees: all of them, or up to its last query's.
__device__ __forceinline__ int visible_key_tiles(std::int64_t i0, std::int64_t s, std::int64_t t, bool causal) {
    const std::int64_t all = (t + key_tile - 1) / key_tile;
    if (!causal) return static_cast<int>(all);
    const std::int64_t last_row = (i0 + query_tile - 1 < s - 1) ? i0 + query_tile - 1 : s - 1;
    const std::int64_t seen = last_row / key_tile + 1;
    return static_cast<int>(seen < all ? seen : all);
}

// ---- moving tiles ------------------------------------------------------------------------

// Rows [row0, row0 + 64) of a rows x D matrix into a shared tile, 16 bytes per copy, a row's
// copies on consecutive threads; rows past the end arrive as zeros.
template <class E, int D>
__device__ __forceinline__ void load_tile(E* tile, const E* matrix, std::int64_t row0, std::int64_t rows, int tid) {
    using L = layout<E, D>;
    constexpr int per_row = L::chunks_per_row;
    constexpr int elems = 16 / static_cast<int>(sizeof(E));
    static_assert(64 * per_row % threads == 0);
#pragma unroll
    for (int i = 0; i < 64 * per_row / threads; ++i) {
        const int c = tid + i * threads;
        const int r = c / per_row, col = c % per_row * elems;
        const bool valid = row0 + r < rows;
        const E* src = valid ? matrix + (row0 + r) * D + col : matrix;
        cp_async_16(tile + r * L::stride + col, src, valid);
    }
}

// values[row0, row0 + 64) into 64 floats of shared memory; zeros past the end.
__device__ __forceinline__ void load_row_values(float* dst, const float* values, std::int64_t row0,
                                                std::int64_t rows, int tid) {
    if (tid < 64) {
        const bool valid = row0 + tid < rows;
        cp_async_4(dst + tid, valid ? values + row0 + tid : values, valid);
    }
}

__device__ __forceinline__ void store_pair(float* p, float a, float b) {
    *reinterpret_cast<float2*>(p) = make_float2(a, b);
}
__device__ __forceinline__ void store_pair(__nv_bfloat16* p, float a, float b) {
    *reinterpret_cast<std::uint32_t*>(p) = pack_bf16x2(a, b);
}

// Rows r and r + 8 (this lane's g) of a warp's 16 x D accumulator, times `factor0` and
// `factor1`, into a rows x D matrix; rows at or past `rows` are skipped.
template <class E, int D>
__device__ __forceinline__ void store_rows(E* matrix, const float (&acc)[D / 8][4], std::int64_t row,
                                           std::int64_t rows, float factor0, float factor1, int lane) {
    const int col = 2 * (lane & 3);
    if (row < rows) {
#pragma unroll
        for (int j = 0; j < D / 8; ++j)
            store_pair(matrix + row * D + j * 8 + col, acc[j][0] * factor0, acc[j][1] * factor0);
    }
    if (row + 8 < rows) {
#pragma unroll
        for (int j = 0; j < D / 8; ++j)
            store_pair(matrix + (row + 8) * D + j * 8 + col, acc[j][2] * factor1, acc[j][3] * factor1);
    }
}

// ---- warp products -----------------------------------------------------------------------
// acc[j] is the 16 x 8 tile j of a warp's result in the C layout of warp_mma.cuh.

// acc += A B^T over D columns, float: A is the warp's 16 rows at `a`, B^T the NT * 8 rows at
// `bt` (shared tiles, S elements apart). Each element is one dot product in column order.
template <int D, int NT, int S>
__device__ __forceinline__ void product_nt(float (&acc)[NT][4], const float* a, const float* bt, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const float* a0 = a + g * S;
    const float* a1 = a0 + 8 * S;
#pragma unroll 2
    for (int k = 0; k < D; k += 4) {
        const float4 x0 = *reinterpret_cast<const float4*>(a0 + k);
        const float4 x1 = *reinterpret_cast<const float4*>(a1 + k);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const float4 y0 = *reinterpret_cast<const float4*>(bt + (j * 8 + 2 * t) * S + k);
            const float4 y1 = *reinterpret_cast<const float4*>(bt + (j * 8 + 2 * t + 1) * S + k);
            acc[j][0] = fmaf(x0.w, y0.w, fmaf(x0.z, y0.z, fmaf(x0.y, y0.y, fmaf(x0.x, y0.x, acc[j][0]))));
            acc[j][1] = fmaf(x0.w, y1.w, fmaf(x0.z, y1.z, fmaf(x0.y, y1.y, fmaf(x0.x, y1.x, acc[j][1]))));
            acc[j][2] = fmaf(x1.w, y0.w, fmaf(x1.z, y0.z, fmaf(x1.y, y0.y, fmaf(x1.x, y0.x, acc[j][2]))));
            acc[j][3] = fmaf(x1.w, y1.w, fmaf(x1.z, y1.z, fmaf(x1.y, y1.y, fmaf(x1.x, y1.x, acc[j][3]))));
        }
    }
}

// The A fragments of the warp's 16 rows at `a`, k-step kk (columns 16 kk .. 16 kk + 15):
// lanes 0-15 address rows 0-15 at column 0, lanes 16-31 the same rows at column 8, so
// registers 0..3 are a0..a3.
template <int S>
__device__ __forceinline__ void load_a_fragment(std::uint32_t (&f)[4], const __nv_bfloat16* a, int kk, int lane) {
    ldmatrix_x4(f, a + (lane & 15) * S + kk * 16 + (lane >> 4) * 8);
}

// B fragments of B^T rows n0 .. n0 + 15 (two n-tiles), k-step kk: matrices (rows n0.., cols
// k), (n0.., k + 8), (n0 + 8.., k), (n0 + 8.., k + 8) give b0, b1 of tile n0 and b0, b1 of
// tile n0 + 8.
template <int S>
__device__ __forceinline__ void load_bt_fragments(std::uint32_t (&f)[4], const __nv_bfloat16* bt, int n0, int kk,
                                                  int lane) {
    ldmatrix_x4(f, bt + (n0 + (lane >> 4) * 8 + (lane & 7)) * S + kk * 16 + ((lane >> 3) & 1) * 8);
}

// acc += A B^T, bf16 on tensor cores, A from shared memory.
template <int D, int NT, int S>
__device__ __forceinline__ void product_nt(float (&acc)[NT][4], const __nv_bfloat16* a, const __nv_bfloat16* bt,
                                           int lane) {
    static_assert(NT % 2 == 0);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        std::uint32_t af[4];
        load_a_fragment<S>(af, a, kk, lane);
#pragma unroll
        for (int j = 0; j < NT; j += 2) {
            std::uint32_t bf[4];
            load_bt_fragments<S>(bf, bt, j * 8, kk, lane);
            mma_bf16_16816(acc[j], af, bf[0], bf[1]);
            mma_bf16_16816(acc[j + 1], af, bf[2], bf[3]);
        }
    }
}

// The same with A's fragments already in registers.
template <int D, int NT, int S>
__device__ __forceinline__ void product_nt(float (&acc)[NT][4], const std::uint32_t (&af)[D / 16][4],
                                           const __nv_bfloat16* bt, int lane) {
    static_assert(NT % 2 == 0);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int j = 0; j < NT; j += 2) {
            std::uint32_t bf[4];
            load_bt_fragments<S>(bf, bt, j * 8, kk, lane);
            mma_bf16_16816(acc[j], af[kk], bf[0], bf[1]);
            mma_bf16_16816(acc[j + 1], af[kk], bf[2], bf[3]);
        }
    }
}

// A warp's 16-row A operand: a pointer into shared memory, or (Cached) its mma fragments,
// loaded once per kernel once the tile is in shared memory.
template <class E, int D, int S, bool Cached>
struct warp_operand {
    const E* rows = nullptr;
    __device__ __forceinline__ void load(const E* r, int) { rows = r; }
    template <int NT>
    __device__ __forceinline__ void times_transpose(float (&acc)[NT][4], const E* bt, int lane) const {
        product_nt<D, NT, S>(acc, rows, bt, lane);
    }
};

template <int D, int S>
struct warp_operand<__nv_bfloat16, D, S, true> {
    std::uint32_t frag[D / 16][4];
    __device__ __forceinline__ void load(const __nv_bfloat16* r, int lane) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) load_a_fragment<S>(frag[kk], r, kk, lane);
    }
    template <int NT>
    __device__ __forceinline__ void times_transpose(float (&acc)[NT][4], const __nv_bfloat16* bt, int lane) const {
        product_nt<D, NT, S>(acc, frag, bt, lane);
    }
};

// acc (16 x N) += P B, float: P is 16 x 8 KN in C layout (this warp's registers), B the 8 KN
// rows at `b`. Each lane gathers its two rows of P from its quad, 16 columns at a time, and
// sums over the rows of B in order.
template <int KN, int N, int S>
__device__ __forceinline__ void product_nn(float (&acc)[N / 8][4], const float (&p)[KN][4], const float* b, int lane) {
    const int t = lane & 3, quad = lane & ~3;
#pragma unroll
    for (int j = 0; j < KN / 2; ++j) {
        float r0[16], r1[16];
#pragma unroll
        for (int src = 0; src < 4; ++src) {
            r0[2 * src] = warp_read(p[2 * j][0], quad + src);
            r0[2 * src + 1] = warp_read(p[2 * j][1], quad + src);
            r0[8 + 2 * src] = warp_read(p[2 * j + 1][0], quad + src);
            r0[9 + 2 * src] = warp_read(p[2 * j + 1][1], quad + src);
            r1[2 * src] = warp_read(p[2 * j][2], quad + src);
            r1[2 * src + 1] = warp_read(p[2 * j][3], quad + src);
            r1[8 + 2 * src] = warp_read(p[2 * j + 1][2], quad + src);
            r1[9 + 2 * src] = warp_read(p[2 * j + 1][3], quad + src);
        }
#pragma unroll
        for (int n = 0; n < N / 8; ++n) {
#pragma unroll
            for (int c = 0; c < 16; ++c) {
                const float2 y = *reinterpret_cast<const float2*>(b + (j * 16 + c) * S + n * 8 + 2 * t);
                acc[n][0] = fmaf(r0[c], y.x, acc[n][0]);
                acc[n][1] = fmaf(r0[c], y.y, acc[n][1]);
                acc[n][2] = fmaf(r1[c], y.x, acc[n][2]);
                acc[n][3] = fmaf(r1[c], y.y, acc[n][3]);
            }
        }
    }
}

// acc (16 x N) += P B on tensor cores: tiles 2j and 2j + 1 of P, rounded to bf16, are the A
// fragment of k-step j; B (stored k x N row-major) comes through ldmatrix.trans, matrices
// (rows 16 j.., cols n0), (16 j + 8.., n0), (16 j.., n0 + 8), (16 j + 8.., n0 + 8) giving b0,
// b1 of n-tile n0 and of n0 + 8.
template <int KN, int N, int S>
__device__ __forceinline__ void product_nn(float (&acc)[N / 8][4], const float (&p)[KN][4], const __nv_bfloat16* b,
                                           int lane) {
#pragma unroll
    for (int j = 0; j < KN / 2; ++j) {
        const std::uint32_t af[4] = {pack_bf16x2(p[2 * j][0], p[2 * j][1]), pack_bf16x2(p[2 * j][2], p[2 * j][3]),
                                     pack_bf16x2(p[2 * j + 1][0], p[2 * j + 1][1]),
                                     pack_bf16x2(p[2 * j + 1][2], p[2 * j + 1][3])};
        const __nv_bfloat16* rows = b + (j * 16 + (lane & 15)) * S + (lane >> 4) * 8;
#pragma unroll
        for (int n = 0; n < N / 8; n += 2) {
            std::uint32_t bf[4];
            ldmatrix_x4_trans(bf, rows + n * 8);
            mma_bf16_16816(acc[n], af, bf[0], bf[1]);
            mma_bf16_16816(acc[n + 1], af, bf[2], bf[3]);
        }
    }
}

// ---- forward -------------------------------------------------------------------------------

template <class E, int D>
__global__ void __launch_bounds__(threads) forward_kernel(const params<E> p) {
    using L = layout<E, D>;
    constexpr int S = L::stride;
    E* const qs = reinterpret_cast<E*>(dynamic_shared_memory());
    E* const ks = qs + L::tile_elems;              // L::stages tiles
    E* const vs = ks + L::stages * L::tile_elems;  // L::stages tiles
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int t4 = lane & 3;
    // The longest rows (under the causal mask, the last tiles) start first.
    const std::int64_t i0 = static_cast<std::int64_t>(gridDim.x - 1 - blockIdx.x) * query_tile;
    const std::int64_t bh = blockIdx.y;
    const E* const q = p.q + bh * p.s * D;
    const E* const k = p.k + bh * p.t * D;
    const E* const v = p.v + bh * p.t * D;
    const int key_tiles = visible_key_tiles(i0, p.s, p.t, p.causal);

    load_tile<E, D>(qs, q, i0, p.s, tid);
    load_tile<E, D>(ks, k, 0, p.t, tid);
    load_tile<E, D>(vs, v, 0, p.t, tid);
    cp_async_commit();

    const std::int64_t row0 = i0 + warp * 16 + (lane >> 2);  // this lane's rows: row0, row0 + 8
    const float sl2 = p.scale_log2;
    float m0 = -INFINITY, m1 = -INFINITY;  // running max of the raw scores
    float l0 = 0.0f, l1 = 0.0f;            // this lane's part of the running sums
    float o[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    warp_operand<E, D, S, L::cache_forward_a> qa;

    for (int kt = 0; kt < key_tiles; ++kt) {
        const std::int64_t k0 = static_cast<std::int64_t>(kt) * key_tile;
        if constexpr (L::stages == 1) {
            if (kt > 0) {
                __syncthreads();  // every warp is done with tile kt - 1
                load_tile<E, D>(ks, k, k0, p.t, tid);
                load_tile<E, D>(vs, v, k0, p.t, tid);
                cp_async_commit();
            }
        }
        cp_async_wait_all();
        __syncthreads();
        if constexpr (L::stages == 2) {
            if (kt + 1 < key_tiles) {
                const int next = (kt + 1) & 1;
                load_tile<E, D>(ks + next * L::tile_elems, k, k0 + key_tile, p.t, tid);
                load_tile<E, D>(vs + next * L::tile_elems, v, k0 + key_tile, p.t, tid);
                cp_async_commit();
            }
        }
        if (kt == 0) qa.load(qs + warp * 16 * S, lane);
        const int stage = L::stages == 2 ? (kt & 1) : 0;
        const E* const kt_s = ks + stage * L::tile_elems;
        const E* const vt_s = vs + stage * L::tile_elems;

        float sc[key_tile / 8][4];
#pragma unroll
        for (int j = 0; j < key_tile / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
        qa.template times_transpose<key_tile / 8>(sc, kt_s, lane);

        // Keys past the end, and under the causal mask keys after the row, score -inf. Only
        // the last tile and the diagonal tile have any.
        if (k0 + key_tile > p.t || (p.causal && k0 + key_tile - 1 > i0)) {
#pragma unroll
            for (int j = 0; j < key_tile / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const std::int64_t key = k0 + j * 8 + 2 * t4 + (e & 1);
                    const std::int64_t row = e < 2 ? row0 : row0 + 8;
                    if (key >= p.t || (p.causal && key > row)) sc[j][e] = -INFINITY;
                }
        }

        float top0 = -INFINITY, top1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < key_tile / 8; ++j) {
            top0 = fmaxf(top0, fmaxf(sc[j][0], sc[j][1]));
            top1 = fmaxf(top1, fmaxf(sc[j][2], sc[j][3]));
        }
        top0 = fmaxf(top0, warp_xor(top0, 1));  // a row's 64 scores live in one quad
        top0 = fmaxf(top0, warp_xor(top0, 2));
        top1 = fmaxf(top1, warp_xor(top1, 1));
        top1 = fmaxf(top1, warp_xor(top1, 2));
        const float new0 = fmaxf(m0, top0), new1 = fmaxf(m1, top1);
        // A row with no visible key yet keeps m = -inf; shifting by 0 then keeps every
        // exponent -inf (P = 0, alpha = 0) instead of -inf - -inf = NaN.
        const float base0 = new0 == -INFINITY ? 0.0f : new0 * sl2;
        const float base1 = new1 == -INFINITY ? 0.0f : new1 * sl2;
        const float alpha0 = exp2f(m0 * sl2 - base0), alpha1 = exp2f(m1 * sl2 - base1);
        m0 = new0;
        m1 = new1;
        float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
        for (int j = 0; j < key_tile / 8; ++j) {
            sc[j][0] = exp2f(fmaf(sc[j][0], sl2, -base0));
            sc[j][1] = exp2f(fmaf(sc[j][1], sl2, -base0));
            sc[j][2] = exp2f(fmaf(sc[j][2], sl2, -base1));
            sc[j][3] = exp2f(fmaf(sc[j][3], sl2, -base1));
            sum0 += sc[j][0] + sc[j][1];
            sum1 += sc[j][2] + sc[j][3];
        }
        l0 = l0 * alpha0 + sum0;
        l1 = l1 * alpha1 + sum1;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            o[j][0] *= alpha0;
            o[j][1] *= alpha0;
            o[j][2] *= alpha1;
            o[j][3] *= alpha1;
        }
        product_nn<key_tile / 8, D, S>(o, sc, vt_s, lane);
    }

    l0 += warp_xor(l0, 1);
    l0 += warp_xor(l0, 2);
    l1 += warp_xor(l1, 1);
    l1 += warp_xor(l1, 2);
    store_rows<E, D>(p.out_w + bh * p.s * D, o, row0, p.s, 1.0f / l0, 1.0f / l1, lane);
    if (t4 == 0) {
        float* const lse = p.lse_w + bh * p.s;
        if (row0 < p.s) lse[row0] = m0 * p.scale + logf(l0);
        if (row0 + 8 < p.s) lse[row0 + 8] = m1 * p.scale + logf(l1);
    }
}

// ---- backward ------------------------------------------------------------------------------

// delta[r] = sum_e dout[r][e] out[r][e], one warp per row (a grid-stride loop over rows), a
// fixed shuffle tree.
template <class E, int D>
__global__ void __launch_bounds__(256) delta_kernel(const E* out, const E* dout, float* delta, std::int64_t rows) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const std::int64_t warps_in_grid = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32);
    // The loop bound is the same for the 32 lanes of a warp, so whole warps run the shuffles.
    for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; row < rows;
         row += warps_in_grid) {
        float sum = 0.0f;
#pragma unroll
        for (int e = lane; e < D; e += 32) sum = fmaf(to_float(dout[row * D + e]), to_float(out[row * D + e]), sum);
#pragma unroll
        for (int m = 16; m >= 1; m >>= 1) sum += warp_xor(sum, m);
        if (lane == 0) delta[row] = sum;
    }
}

// dK and dV of one key tile: S^T, P^T and dS^T have keys as rows (the warp's 16) and the
// tile's queries as columns, `chunk` queries per register pass.
template <class E, int D>
__global__ void __launch_bounds__(threads) backward_kv_kernel(const params<E> p) {
    using L = layout<E, D>;
    constexpr int S = L::stride;
    E* const ks = reinterpret_cast<E*>(dynamic_shared_memory());
    E* const vs = ks + L::tile_elems;
    E* const qs = vs + L::tile_elems;               // L::stages tiles
    E* const dos = qs + L::stages * L::tile_elems;  // L::stages tiles
    float* const lse_s = reinterpret_cast<float*>(dos + L::stages * L::tile_elems);  // L::stages x 64
    float* const delta_s = lse_s + L::stages * 64;                                  // L::stages x 64
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int t4 = lane & 3;
    const std::int64_t j0 = static_cast<std::int64_t>(blockIdx.x) * key_tile;
    const std::int64_t bh = blockIdx.y;
    const E* const q = p.q + bh * p.s * D;
    const E* const dout = p.dout + bh * p.s * D;
    const float* const lse = p.lse + bh * p.s;
    const float* const delta = p.delta + bh * p.s;
    const int query_tiles = static_cast<int>((p.s + query_tile - 1) / query_tile);
    // Under the causal mask (s == t) queries before the tile's first key see none of it.
    const int first = p.causal ? static_cast<int>(j0 / query_tile) : 0;

    const std::int64_t key0 = j0 + warp * 16 + (lane >> 2);  // this lane's keys: key0, key0 + 8
    const float sl2 = p.scale_log2;
    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
        dk[j][0] = dk[j][1] = dk[j][2] = dk[j][3] = 0.0f;
        dv[j][0] = dv[j][1] = dv[j][2] = dv[j][3] = 0.0f;
    }
    warp_operand<E, D, S, L::cache_backward_a> ka, va;

    auto load_queries = [&](int tile, int stage) {
        const std::int64_t i0 = static_cast<std::int64_t>(tile) * query_tile;
        load_tile<E, D>(qs + stage * L::tile_elems, q, i0, p.s, tid);
        load_tile<E, D>(dos + stage * L::tile_elems, dout, i0, p.s, tid);
        load_row_values(lse_s + stage * 64, lse, i0, p.s, tid);
        load_row_values(delta_s + stage * 64, delta, i0, p.s, tid);
    };
    if (first < query_tiles) {
        load_tile<E, D>(ks, p.k + bh * p.t * D, j0, p.t, tid);
        load_tile<E, D>(vs, p.v + bh * p.t * D, j0, p.t, tid);
        load_queries(first, 0);
        cp_async_commit();
    }

    for (int it = first; it < query_tiles; ++it) {
        const int n = it - first;
        if constexpr (L::stages == 1) {
            if (n > 0) {
                __syncthreads();  // every warp is done with tile it - 1
                load_queries(it, 0);
                cp_async_commit();
            }
        }
        cp_async_wait_all();
        __syncthreads();
        if constexpr (L::stages == 2) {
            if (it + 1 < query_tiles) {
                load_queries(it + 1, (n + 1) & 1);
                cp_async_commit();
            }
        }
        if (n == 0) {
            ka.load(ks + warp * 16 * S, lane);
            va.load(vs + warp * 16 * S, lane);
        }
        const int stage = L::stages == 2 ? (n & 1) : 0;
        const E* const qt_s = qs + stage * L::tile_elems;
        const E* const dot_s = dos + stage * L::tile_elems;
        const float* const lse_t = lse_s + stage * 64;
        const float* const delta_t = delta_s + stage * 64;
        const std::int64_t i0 = static_cast<std::int64_t>(it) * query_tile;
        // Queries past the end, and under the causal mask queries before the key, see nothing.
        const bool masked_tile = i0 + query_tile > p.s || (p.causal && i0 < j0 + key_tile - 1);

#pragma unroll 1
        for (int c = 0; c < query_tile / chunk; ++c) {
            float st[chunk / 8][4], dst[chunk / 8][4];
#pragma unroll
            for (int j = 0; j < chunk / 8; ++j) {
                st[j][0] = st[j][1] = st[j][2] = st[j][3] = 0.0f;
                dst[j][0] = dst[j][1] = dst[j][2] = dst[j][3] = 0.0f;
            }
            ka.template times_transpose<chunk / 8>(st, qt_s + c * chunk * S, lane);    // K Q^T
            va.template times_transpose<chunk / 8>(dst, dot_s + c * chunk * S, lane);  // V dO^T
#pragma unroll
            for (int j = 0; j < chunk / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int col = c * chunk + j * 8 + 2 * t4 + (e & 1);
                    float pt = exp2f(fmaf(st[j][e], sl2, -lse_t[col] * log2e));
                    if (masked_tile) {
                        const std::int64_t query = i0 + col, key = e < 2 ? key0 : key0 + 8;
                        if (query >= p.s || (p.causal && query < key)) pt = 0.0f;
                    }
                    st[j][e] = pt;
                    dst[j][e] = pt * (dst[j][e] - delta_t[col]);
                }
            product_nn<chunk / 8, D, S>(dv, st, dot_s + c * chunk * S, lane);   // dV += P^T dO
            product_nn<chunk / 8, D, S>(dk, dst, qt_s + c * chunk * S, lane);  // dK += dS^T Q
        }
    }

    store_rows<E, D>(p.dk + bh * p.t * D, dk, key0, p.t, p.scale, p.scale, lane);
    store_rows<E, D>(p.dv + bh * p.t * D, dv, key0, p.t, 1.0f, 1.0f, lane);
}

// dQ of one query tile, over its visible key tiles, `chunk` keys per register pass.
template <class E, int D>
__global__ void __launch_bounds__(threads) backward_q_kernel(const params<E> p) {
    using L = layout<E, D>;
    constexpr int S = L::stride;
    E* const qs = reinterpret_cast<E*>(dynamic_shared_memory());
    E* const dos = qs + L::tile_elems;
    E* const ks = dos + L::tile_elems;             // L::stages tiles
    E* const vs = ks + L::stages * L::tile_elems;  // L::stages tiles
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int t4 = lane & 3;
    const std::int64_t i0 = static_cast<std::int64_t>(gridDim.x - 1 - blockIdx.x) * query_tile;
    const std::int64_t bh = blockIdx.y;
    const E* const k = p.k + bh * p.t * D;
    const E* const v = p.v + bh * p.t * D;
    const int key_tiles = visible_key_tiles(i0, p.s, p.t, p.causal);

    load_tile<E, D>(qs, p.q + bh * p.s * D, i0, p.s, tid);
    load_tile<E, D>(dos, p.dout + bh * p.s * D, i0, p.s, tid);
    load_tile<E, D>(ks, k, 0, p.t, tid);
    load_tile<E, D>(vs, v, 0, p.t, tid);
    cp_async_commit();

    const std::int64_t row0 = i0 + warp * 16 + (lane >> 2);
    const float sl2 = p.scale_log2;
    // Rows past the end get lse = delta = 0: finite, and never stored.
    const float* const lse = p.lse + bh * p.s;
    const float* const delta = p.delta + bh * p.s;
    const float shift0 = row0 < p.s ? lse[row0] * log2e : 0.0f;
    const float shift1 = row0 + 8 < p.s ? lse[row0 + 8] * log2e : 0.0f;
    const float delta0 = row0 < p.s ? delta[row0] : 0.0f;
    const float delta1 = row0 + 8 < p.s ? delta[row0 + 8] : 0.0f;
    float dq[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.0f;
    warp_operand<E, D, S, L::cache_backward_a> qa, da;

    for (int kt = 0; kt < key_tiles; ++kt) {
        const std::int64_t k0 = static_cast<std::int64_t>(kt) * key_tile;
        if constexpr (L::stages == 1) {
            if (kt > 0) {
                __syncthreads();
                load_tile<E, D>(ks, k, k0, p.t, tid);
                load_tile<E, D>(vs, v, k0, p.t, tid);
                cp_async_commit();
            }
        }
        cp_async_wait_all();
        __syncthreads();
        if constexpr (L::stages == 2) {
            if (kt + 1 < key_tiles) {
                const int next = (kt + 1) & 1;
                load_tile<E, D>(ks + next * L::tile_elems, k, k0 + key_tile, p.t, tid);
                load_tile<E, D>(vs + next * L::tile_elems, v, k0 + key_tile, p.t, tid);
                cp_async_commit();
            }
        }
        if (kt == 0) {
            qa.load(qs + warp * 16 * S, lane);
            da.load(dos + warp * 16 * S, lane);
        }
        const int stage = L::stages == 2 ? (kt & 1) : 0;
        const E* const kt_s = ks + stage * L::tile_elems;
        const E* const vt_s = vs + stage * L::tile_elems;
        const bool masked_tile = k0 + key_tile > p.t || (p.causal && k0 + key_tile - 1 > i0);

#pragma unroll 1
        for (int c = 0; c < key_tile / chunk; ++c) {
            float sc[chunk / 8][4], ds[chunk / 8][4];
#pragma unroll
            for (int j = 0; j < chunk / 8; ++j) {
                sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
                ds[j][0] = ds[j][1] = ds[j][2] = ds[j][3] = 0.0f;
            }
            qa.template times_transpose<chunk / 8>(sc, kt_s + c * chunk * S, lane);  // Q K^T
            da.template times_transpose<chunk / 8>(ds, vt_s + c * chunk * S, lane);  // dO V^T
#pragma unroll
            for (int j = 0; j < chunk / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float pv = exp2f(fmaf(sc[j][e], sl2, -(e < 2 ? shift0 : shift1)));
                    if (masked_tile) {
                        const std::int64_t key = k0 + c * chunk + j * 8 + 2 * t4 + (e & 1);
                        const std::int64_t row = e < 2 ? row0 : row0 + 8;
                        if (key >= p.t || (p.causal && key > row)) pv = 0.0f;
                    }
                    ds[j][e] = pv * (ds[j][e] - (e < 2 ? delta0 : delta1));
                }
            product_nn<chunk / 8, D, S>(dq, ds, kt_s + c * chunk * S, lane);  // dQ += dS K
        }
    }

    store_rows<E, D>(p.dq + bh * p.s * D, dq, row0, p.s, p.scale, p.scale, lane);
}

}  // namespace loom::cuda::detail::flash
