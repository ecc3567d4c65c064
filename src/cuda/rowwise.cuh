#pragma once
// What the row-wise kernels share (norms, softmax, cross-entropy, embedding): 16-byte
// vector loads and stores that widen to float, block reductions in a fixed order, the
// online max and sum of a softmax, and a walk over a row that uses vectors wherever the
// row's address allows. Blocks are one-dimensional, a whole number of warps, at most 1024
// threads.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "types.cuh"

namespace loom::cuda::detail {

// Elements in one 16-byte access.
template <class D>
inline constexpr int vector_width = static_cast<int>(16 / sizeof(D));

inline bool aligned_16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// V consecutive elements at p, widened to float. For V > 1, p is 16-byte aligned.
template <int V, class D>
__device__ __forceinline__ void load_vector(const D* p, float (&out)[V]) {
    if constexpr (V == 1) {
        out[0] = to_float(p[0]);
    } else if constexpr (std::is_same_v<D, float>) {
        static_assert(V == 4, "a 16-byte vector holds 4 floats");
        const float4 v = *reinterpret_cast<const float4*>(p);
        out[0] = v.x;
        out[1] = v.y;
        out[2] = v.z;
        out[3] = v.w;
    } else {
        static_assert(V == 8, "a 16-byte vector holds 8 bf16");
        const uint4 raw = *reinterpret_cast<const uint4*>(p);
        const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
        // bf16 is the top half of a float: widening is a shift. Little-endian: element 2k is
        // the low half of word k.
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            out[2 * k] = __uint_as_float(words[k] << 16);
            out[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
        }
    }
}

__device__ __forceinline__ unsigned bf16_bits(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }

// Stores V floats at p as D (each rounded once). For V > 1, p is 16-byte aligned.
template <int V, class D>
__device__ __forceinline__ void store_vector(D* p, const float (&in)[V]) {
    if constexpr (V == 1) {
        p[0] = from_float<D>(in[0]);
    } else if constexpr (std::is_same_v<D, float>) {
        static_assert(V == 4, "a 16-byte vector holds 4 floats");
        *reinterpret_cast<float4*>(p) = make_float4(in[0], in[1], in[2], in[3]);
    } else {
        static_assert(V == 8, "a 16-byte vector holds 8 bf16");
        unsigned words[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) words[k] = bf16_bits(in[2 * k]) | (bf16_bits(in[2 * k + 1]) << 16);
        *reinterpret_cast<uint4*>(p) = make_uint4(words[0], words[1], words[2], words[3]);
    }
}

struct add_op {
    template <class S>
    __device__ __forceinline__ S operator()(S a, S b) const {
        return a + b;
    }
};
struct max_op {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Reduces v[0..N) over the block: a butterfly within each warp, then every thread combines
// the warps' results in warp order, so every thread returns the same bits and the order
// never changes. `scratch` holds 32 * N values; the call begins and ends with the block in
// step, so it can be called again at once with the same scratch.
template <int N, class S, class Op>
__device__ __forceinline__ void block_reduce(S (&v)[N], S* scratch, Op op) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) v[i] = op(v[i], __shfl_xor_sync(0xffffffffu, v[i], offset));
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0)
#pragma unroll
        for (int i = 0; i < N; ++i) scratch[warp * N + i] = v[i];
    __syncthreads();
    const unsigned warps = blockDim.x / 32;
#pragma unroll
    for (int i = 0; i < N; ++i) {
        S total = scratch[i];
        for (unsigned w = 1; w < warps; ++w) total = op(total, scratch[w * N + i]);
        v[i] = total;
    }
    __syncthreads();
}

template <int N, class S>
__device__ __forceinline__ void block_sum(S (&v)[N], S* scratch) {
    block_reduce(v, scratch, add_op{});
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    float a[1] = {v};
    block_reduce(a, scratch, max_op{});
    return a[0];
}

__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fc00000); }

// The running max of some values and the sum of exp(value - max): one pass over a row
// gives its log-sum-exp, max + log(sum). -inf values add nothing; a NaN makes the sum NaN.
struct max_sum {
    float max = -INFINITY;
    float sum = 0.0f;
};

__device__ __forceinline__ void absorb(max_sum& a, float x) {
    if (x > a.max) {
        a.sum = a.sum * expf(a.max - x) + 1.0f;  // exp(-inf) = 0 for the first value
        a.max = x;
    } else if (x != -INFINITY) {
        a.sum += expf(x - a.max);
    }
}

__device__ __forceinline__ max_sum combine(max_sum a, max_sum b) {
    const float m = fmaxf(a.max, b.max);
    if (m == -INFINITY) return {m, a.sum + b.sum};  // both empty (0, or NaN carried on)
    return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// The block's combined max_sum, the same bits in every thread; scratch holds 64 floats.
__device__ __forceinline__ max_sum block_combine(max_sum a, float* scratch) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        max_sum other;
        other.max = __shfl_xor_sync(0xffffffffu, a.max, offset);
        other.sum = __shfl_xor_sync(0xffffffffu, a.sum, offset);
        a = combine(a, other);
    }
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        scratch[2 * warp] = a.max;
        scratch[2 * warp + 1] = a.sum;
    }
    __syncthreads();
    max_sum total{scratch[0], scratch[1]};
    for (unsigned w = 1; w < blockDim.x / 32; ++w) total = combine(total, max_sum{scratch[2 * w], scratch[2 * w + 1]});
    __syncthreads();
    return total;
}

// How a row of n elements at `row` splits into a scalar head up to the first 16-byte
// boundary, whole 16-byte vectors, and a scalar tail. Elements of D are D-aligned.
template <class D>
struct row_split {
    std::int64_t head;     // elements before the first vector
    std::int64_t vectors;  // whole vectors after them
    __device__ __forceinline__ row_split(const D* row, std::int64_t n) {
        constexpr int V = vector_width<D>;
        const auto misaligned = static_cast<std::int64_t>((reinterpret_cast<std::uintptr_t>(row) % 16) / sizeof(D));
        const std::int64_t to_boundary = misaligned == 0 ? 0 : V - misaligned;
        head = to_boundary < n ? to_boundary : n;
        vectors = (n - head) / V;
    }
};

// f(i, row[i]) for every i in [0, n), spread over the block's threads; which thread sees
// which element depends only on n, the block size and the row's address modulo 16.
template <class D, class F>
__device__ __forceinline__ void for_each_in_row(const D* row, std::int64_t n, F&& f) {
    constexpr int V = vector_width<D>;
    const row_split<D> split(row, n);
    if (threadIdx.x < split.head) f(static_cast<std::int64_t>(threadIdx.x), to_float(row[threadIdx.x]));
    const D* body = row + split.head;
    for (std::int64_t k = threadIdx.x; k < split.vectors; k += blockDim.x) {
        float v[V];
        load_vector<V>(body + k * V, v);
#pragma unroll
        for (int j = 0; j < V; ++j) f(split.head + k * V + j, v[j]);
    }
    for (std::int64_t i = split.head + split.vectors * V + threadIdx.x; i < n; i += blockDim.x) f(i, to_float(row[i]));
}

// out[i] = f(i, in[i]) for every i in [0, n), spread over the block's threads. `out` may be
// `in`: each element is read and written by the same thread, the read first. Vectors are
// used when both rows sit at the same offset from a 16-byte boundary.
template <class D, class F>
__device__ __forceinline__ void map_row(const D* in, D* out, std::int64_t n, F&& f) {
    constexpr int V = vector_width<D>;
    if (reinterpret_cast<std::uintptr_t>(in) % 16 != reinterpret_cast<std::uintptr_t>(out) % 16) {
        for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = from_float<D>(f(i, to_float(in[i])));
        return;
    }
    const row_split<D> split(in, n);
    if (threadIdx.x < split.head) out[threadIdx.x] = from_float<D>(f(static_cast<std::int64_t>(threadIdx.x), to_float(in[threadIdx.x])));
    const D* body_in = in + split.head;
    D* body_out = out + split.head;
    for (std::int64_t k = threadIdx.x; k < split.vectors; k += blockDim.x) {
        float v[V];
        load_vector<V>(body_in + k * V, v);
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] = f(split.head + k * V + j, v[j]);
        store_vector<V>(body_out + k * V, v);
    }
    for (std::int64_t i = split.head + split.vectors * V + threadIdx.x; i < n; i += blockDim.x)
        out[i] = from_float<D>(f(i, to_float(in[i])));
}

// ---- Cached rows: a row of up to max_cached_cols elements held in registers, row_elements
// a thread, as K = row_elements / V vectors of V; a thread's k-th vector is vector
// threadIdx.x + k * blockDim.x of the row. At 512 threads a row of 8192 fits, and the
// norms' backward (x, dy and two gradient sums in registers) stays within the 128
// registers that __launch_bounds__(512) leaves a thread.
inline constexpr int row_elements = 16;
inline constexpr int max_row_threads = 512;
inline constexpr std::int64_t max_cached_cols = std::int64_t{row_elements} * max_row_threads;

__device__ __forceinline__ int vector_index(int k) { return static_cast<int>(threadIdx.x + k * blockDim.x); }

// A thread's vectors of a cached row, zeros past the row's end.
template <int V, int K, class D>
__device__ __forceinline__ void load_row(const D* row, int vectors, float (&v)[K][V]) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
        if (vector_index(k) < vectors) {
            load_vector<V>(row + static_cast<std::int64_t>(vector_index(k)) * V, v[k]);
        } else {
#pragma unroll
            for (int j = 0; j < V; ++j) v[k][j] = 0.0f;
        }
    }
}

// Threads for a cached row of cols elements read V at a time: whole warps, each thread at
// most row_elements.
inline unsigned cached_threads(std::int64_t cols, int V) {
    const std::int64_t per_thread = row_elements / V;
    const std::int64_t threads = ceil_div(ceil_div(cols / V, per_thread), 32) * 32;
    return static_cast<unsigned>(threads < 32 ? 32 : threads);
}

// Rows can be 16-byte vectors: cols a multiple of the width and every row pointer aligned
// (null pointers, the absent ones, count as aligned).
template <class D>
bool vectorizable(std::int64_t cols, std::initializer_list<const void*> pointers) {
    if (cols % vector_width<D> != 0) return false;
    for (const void* p : pointers)
        if (!aligned_16(p)) return false;
    return true;
}

// Blocks for a grid-stride loop over rows, one row a block at a time.
inline unsigned row_grid(std::int64_t rows) {
    constexpr std::int64_t cap = 65535 * 8;
    return static_cast<unsigned>(rows < cap ? rows : cap);
}

}  // namespace loom::cuda::detail
