#pragma once
// Global-norm gradient clipping with torch.nn.utils.clip_grad_norm_ semantics:
//   total = sqrt(sum over every gradient element of g^2)
//   if max_norm / (total + 1e-6) < 1, every gradient is scaled by that factor.
// The scale is applied by the optimizer as it reads each gradient (adamw::step and
// sgd::step take it), not by a pass of its own: a separate pass read and wrote every
// gradient once more, 1.5% of a GPT-2 small step on the host. The GPU optimizer does the same.
// The norm is accumulated in double in a fixed order, so it is the same whatever the
// thread count: every gradient is cut into chunks of a fixed size, each chunk summed with
// eight running sums (one sum waited on the add's latency at every element: 2% of a GPT-2
// small step), the chunks spread over the host pool's threads, and their sums added in order.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include <immintrin.h>

#include <loom/runtime/host/cpu_isa.hpp>
#include <loom/runtime/host/thread_pool.hpp>

namespace loom::train {

namespace detail {

// Elements per chunk, the unit of the fixed summation order and of the work handed to threads.
inline constexpr std::int64_t norm_chunk = std::int64_t{1} << 15;

struct grad_chunk {
    std::size_t grad;
    std::int64_t offset, length;
};

template <class T>
std::vector<grad_chunk> chunks_of(const std::vector<std::span<T>>& grads) {
    std::vector<grad_chunk> chunks;
    for (std::size_t g = 0; g < grads.size(); ++g) {
        const auto size = static_cast<std::int64_t>(grads[g].size());
        for (std::int64_t offset = 0; offset < size; offset += norm_chunk)
            chunks.push_back({g, offset, std::min(norm_chunk, size - offset)});
    }
    return chunks;
}

template <class T>
double sum_of_squares_baseline(const T* x, std::int64_t n) {
    double lanes[8] = {};
    std::int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int l = 0; l < 8; ++l) lanes[l] += static_cast<double>(x[i + l]) * static_cast<double>(x[i + l]);
    }
    double tail = 0;
    for (; i < n; ++i) tail += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7])) + tail;
}

// The same sums on wider vectors: the eight lanes are one AVX-512 register of doubles, or
// two AVX2 registers (lanes 0-3 and 4-7), each element widened, squared and added as above
// (no fused multiply-add), so the result is bit for bit the baseline's. The baseline build
// kept its lanes in memory, a load and a store per add (6 GB/s; GPT-2 small's norm took 39
// ms a step), and one sequential stream per thread waits on memory: lines 2 KiB ahead are
// prefetched. Measured on 472 MB of gradients over two threads: 34 to 44 ms against 72 to
// 88 ms.
[[gnu::target("avx2")]] inline double sum_of_squares_avx2(const float* x, std::int64_t n) {
    __m256d low = _mm256_setzero_pd(), high = _mm256_setzero_pd();
    std::int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __builtin_prefetch(x + i + 512);
        const __m256d a = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), b = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
        low = _mm256_add_pd(low, _mm256_mul_pd(a, a));
        high = _mm256_add_pd(high, _mm256_mul_pd(b, b));
    }
    alignas(32) double lanes[8];
    _mm256_store_pd(lanes, low);
    _mm256_store_pd(lanes + 4, high);
    double tail = 0;
    for (; i < n; ++i) tail += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7])) + tail;
}

[[gnu::target("avx512f")]] inline double sum_of_squares_avx512(const float* x, std::int64_t n) {
    __m512d sums = _mm512_setzero_pd();
    std::int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __builtin_prefetch(x + i + 512);
        const __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
        sums = _mm512_add_pd(sums, _mm512_mul_pd(v, v));
    }
    alignas(64) double lanes[8];
    _mm512_store_pd(lanes, sums);
    double tail = 0;
    for (; i < n; ++i) tail += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7])) + tail;
}

// The sum built for `isa` (one this CPU runs); doubles take the baseline loop.
template <class T>
double sum_of_squares_on(host::cpu_isa isa, const T* x, std::int64_t n) {
    if constexpr (std::is_same_v<T, float>) {
        switch (isa) {
            case host::cpu_isa::avx512f: return sum_of_squares_avx512(x, n);
            case host::cpu_isa::avx2_fma: return sum_of_squares_avx2(x, n);
            case host::cpu_isa::portable: break;
        }
    }
    return sum_of_squares_baseline(x, n);
}

}  // namespace detail

// The sum over every gradient element of g^2, in double, in the fixed order above.
template <class T>
double sum_of_squares(const std::vector<std::span<T>>& grads) {
    const std::vector<detail::grad_chunk> chunks = detail::chunks_of(grads);
    std::vector<double> partial(chunks.size());
    const host::cpu_isa isa = host::best_cpu_isa();
    host::parallel_for(0, static_cast<std::int64_t>(chunks.size()), 1, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t c = lo; c < hi; ++c) {
            const detail::grad_chunk& chunk = chunks[static_cast<std::size_t>(c)];
            partial[static_cast<std::size_t>(c)] =
                detail::sum_of_squares_on(isa, grads[chunk.grad].data() + chunk.offset, chunk.length);
        }
    });
    double sum = 0;
    for (double p : partial) sum += p;
    return sum;
}

template <class T>
double global_norm(const std::vector<std::span<T>>& grads) {
    return std::sqrt(sum_of_squares(grads));
}

// What the optimizer multiplies every gradient by: the coefficient max_norm / (norm + 1e-6)
// where it is below 1, else 1 (also when max_norm <= 0: no clipping).
inline double clip_scale(double norm, double max_norm) {
    return max_norm > 0 ? std::min(1.0, max_norm / (norm + 1e-6)) : 1.0;
}

}  // namespace loom::train
