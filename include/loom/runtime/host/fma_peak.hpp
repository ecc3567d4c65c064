#pragma once
// The machine's limit for float32 arithmetic on the host thread pool: fused multiply-adds
// on independent registers, no memory traffic, on every pool thread at once. What a GEMM
// or a training step reaches is reported as a fraction of this number.
//
//   const double peak = host::measure_fma_peak_flops();   // FLOP/s, about 0.2 s
//
// Twelve independent accumulators per thread cover the FMA latency (4 cycles) times the
// FMA units (2) of current x86 cores. The widest vector ISA the CPU has (AVX-512, AVX2+FMA)
// is used; one FMA counts 2 FLOPs per lane.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

#include <immintrin.h>

#include <loom/runtime/host/gemm.hpp>
#include <loom/runtime/host/thread_pool.hpp>

namespace loom::host {

namespace detail {

constexpr int fma_peak_chains = 12;

[[gnu::target("avx512f")]] inline float fma_chains_avx512(std::int64_t iterations) {
    __m512 acc[fma_peak_chains];
    for (int i = 0; i < fma_peak_chains; ++i) acc[i] = _mm512_set1_ps(0.001f * static_cast<float>(i));
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    // Unrolled so the chains live in registers at any optimization level: at -O2 GCC kept
    // them in memory, and store-to-load forwarding halved the measured peak.
    for (std::int64_t it = 0; it < iterations; ++it)
#pragma GCC unroll 12
        for (int i = 0; i < fma_peak_chains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    __m512 sum = acc[0];
    for (int i = 1; i < fma_peak_chains; ++i) sum = _mm512_add_ps(sum, acc[i]);
    // Summed through memory: _mm512_reduce_add_ps draws a false "used uninitialized"
    // warning from GCC 12 in every translation unit that includes this header.
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, sum);
    float s = 0;
    for (float x : lanes) s += x;
    return s;
}

[[gnu::target("avx2,fma")]] inline float fma_chains_avx2(std::int64_t iterations) {
    __m256 acc[fma_peak_chains];
    for (int i = 0; i < fma_peak_chains; ++i) acc[i] = _mm256_set1_ps(0.001f * static_cast<float>(i));
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    // Unrolled so the chains live in registers at any optimization level: at -O2 GCC kept
    // them in memory, and store-to-load forwarding halved the measured peak.
    for (std::int64_t it = 0; it < iterations; ++it)
#pragma GCC unroll 12
        for (int i = 0; i < fma_peak_chains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    __m256 sum = acc[0];
    for (int i = 1; i < fma_peak_chains; ++i) sum = _mm256_add_ps(sum, acc[i]);
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, sum);
    float s = 0;
    for (float x : lanes) s += x;
    return s;
}

}  // namespace detail

// FLOP/s of float32 FMAs on all threads of `pool`, best of `repeats` runs of about 50 ms.
// 0 when the CPU has neither AVX-512 nor AVX2+FMA (no vector FMA to measure).
inline double measure_fma_peak_flops(thread_pool& pool = thread_pool::global(), int repeats = 4) {
    const bool avx512 = cpu_isa_supported(cpu_isa::avx512f);
    if (!avx512 && !cpu_isa_supported(cpu_isa::avx2_fma)) return 0;
    const int lanes = avx512 ? 16 : 8;
    const std::int64_t iterations = 2'000'000;
    const auto threads = static_cast<std::int64_t>(pool.size());
    std::atomic<float> sink{0};
    double best = 0;
    for (int r = 0; r < repeats; ++r) {
        const auto start = std::chrono::steady_clock::now();
        // One share per thread; a thread that starts late leaves its share to another one,
        // which makes that run slow, and the best of the runs is the one that counts.
        pool.parallel_for(0, threads, 1, [&](std::int64_t lo, std::int64_t hi) {
            for (std::int64_t share = lo; share < hi; ++share) {
                const float s = avx512 ? detail::fma_chains_avx512(iterations) : detail::fma_chains_avx2(iterations);
                sink.store(s, std::memory_order_relaxed);  // keeps the chains from being optimised away
            }
        });
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double flops = 2.0 * lanes * detail::fma_peak_chains * static_cast<double>(iterations) * threads;
        best = std::max(best, flops / seconds);
    }
    return best;
}

}  // namespace loom::host
