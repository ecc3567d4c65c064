#pragma once
// Float math for host kernels, written so that g++ -O2 vectorizes the loops that call it,
// for whatever instruction set the build targets (SSE2 by default, AVX2/AVX-512 under -march):
//  * inner loops have a compile-time trip count: -O2's "very cheap" cost model vectorizes
//    only loops that need no scalar epilogue;
//  * no branches and no conditionally executed floating-point operation: under the default
//    -ftrapping-math g++ refuses to if-convert `c ? a * b : d`, so choices are bit selects
//    between values computed on every lane;
//  * no calls, tables or float-to-int conversions of unbounded values.
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <loom/runtime/host/cpu_isa.hpp>
#include <loom/runtime/host/kernels/elementwise.hpp>
#include <loom/runtime/host/thread_pool.hpp>

namespace loom::host {

// Elements per fixed-trip-count block of map_blocks (and lanes of the row reductions).
inline constexpr std::int64_t simd_block = 32;

// c ? a : b on the bits of both values, both always computed.
inline float select_bits(bool c, float a, float b) {
    const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
    return std::bit_cast<float>((std::bit_cast<std::uint32_t>(a) & m) | (std::bit_cast<std::uint32_t>(b) & ~m));
}
inline double select_bits(bool c, double a, double b) {
    const std::uint64_t m = 0u - static_cast<std::uint64_t>(c);
    return std::bit_cast<double>((std::bit_cast<std::uint64_t>(a) & m) | (std::bit_cast<std::uint64_t>(b) & ~m));
}

// exp(x) for x <= 0 (and NaN), to relative error 1e-7 (measured 8.3e-8); 0 below
// ln(2^-126) ~ -87.34, where the true value is subnormal (< 1.2e-38).
// Law: exp(x) = 2^n exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2] (ln 2 split
// in two so that n * ln2_hi is exact), exp(r) by the degree-7 polynomial of Cephes' expf.
inline float exp_nonpositive(float x) {
    constexpr float lowest = -87.33654f;
    const float xc = select_bits(x >= lowest, x, lowest);  // NaN -> lowest: the conversion below stays defined
    const auto n = static_cast<std::int32_t>(xc * 1.44269504088896341f - 0.5f);  // round(xc / ln 2), xc <= 0
    const auto nf = static_cast<float>(n);
    float r = xc - nf * 0.693359375f;
    r = r - nf * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const float two_to_n = std::bit_cast<float>(static_cast<std::uint32_t>(n + 127) << 23);  // n in [-126, 0]
    return select_bits(x >= lowest, p * two_to_n, select_bits(x < lowest, 0.0f, x));
}

// sigmoid(z) and 1 - sigmoid(z) from e = exp(-|z|) <= 1, so nothing overflows or cancels:
//   z >= 0: s = 1 / (1 + e), 1 - s = e / (1 + e);   z < 0: the two swap.
struct sigmoid_parts {
    float s;
    float one_minus_s;
};
inline sigmoid_parts sigmoid_float(float z) {
    const float e = exp_nonpositive(-std::fabs(z));
    const float d = 1.0f / (1.0f + e);
    const float ed = e * d;
    const bool positive = z >= 0.0f;
    return {select_bits(positive, d, ed), select_bits(positive, ed, d)};
}

namespace detail {
template <class T, class Block, std::size_t... I>
void map_tail(const Block& block, T* out, std::int64_t count, const std::array<const T*, sizeof...(I)>& in,
              std::index_sequence<I...>) {
    // Padded copies: the tail runs the very code of a full block, so an element's value never
    // depends on where a thread's range ends.
    T pad_in[sizeof...(I) > 0 ? sizeof...(I) : 1][simd_block] = {};
    T pad_out[simd_block];
    for (std::size_t k = 0; k < sizeof...(I); ++k)
        for (std::int64_t j = 0; j < count; ++j) pad_in[k][j] = in[k][j];
    block(pad_out, static_cast<const T*>(pad_in[I])...);
    for (std::int64_t j = 0; j < count; ++j) out[j] = pad_out[j];
}

// Inlined into each build below, with the block it calls, so the block is compiled for that
// build's instruction set.
template <class T, class Block, class... In>
[[gnu::always_inline]] inline void map_range(const Block& block, std::int64_t lo, std::int64_t hi, T* out,
                                             const In*... in) {
    std::int64_t i = lo;
    for (; i + simd_block <= hi; i += simd_block) block(out + i, (in + i)...);
    if (i < hi)
        map_tail<T>(block, out + i, hi - i, std::array<const T*, sizeof...(In)>{(in + i)...},
                    std::index_sequence_for<In...>{});
}

// The same loop compiled for wider vectors: the inlined block vectorizes to 8 (AVX2) or 16
// (AVX-512) floats where the baseline build has SSE2's 4, 2.5x faster for gelu on a Zen 3
// core. fp-contract=off keeps g++ from fusing a * b + c into one FMA (which SSE2 does not
// have), so every operation is the same correctly rounded one in the same order and the
// values are bit for bit the baseline's; the elementwise tests hold each build to it.
template <class T, class Block, class... In>
[[gnu::target("avx2"), gnu::optimize("fp-contract=off")]] void map_range_avx2(const Block& block, std::int64_t lo,
                                                                             std::int64_t hi, T* out, const In*... in) {
    map_range(block, lo, hi, out, in...);
}

template <class T, class Block, class... In>
[[gnu::target("avx512f"), gnu::optimize("fp-contract=off")]] void map_range_avx512(const Block& block, std::int64_t lo,
                                                                                  std::int64_t hi, T* out,
                                                                                  const In*... in) {
    map_range(block, lo, hi, out, in...);
}

// map_range built for `isa` (one this CPU runs). Only float has wider builds: the double
// path calls the C library's tanh and exp, which no target attribute vectorizes.
template <class T, class Block, class... In>
void map_range_on(cpu_isa isa, const Block& block, std::int64_t lo, std::int64_t hi, T* out, const In*... in) {
    if constexpr (std::is_same_v<T, float>) {
        switch (isa) {
            case cpu_isa::avx512f: return map_range_avx512(block, lo, hi, out, in...);
            case cpu_isa::avx2_fma: return map_range_avx2(block, lo, hi, out, in...);
            case cpu_isa::portable: break;
        }
    }
    map_range(block, lo, hi, out, in...);
}
}  // namespace detail

// out[i] = f(in0[i], in1[i], ...) for i in [0, n), in parallel. `block(out, in...)` maps exactly
// simd_block elements (declare its pointers __restrict and loop j < simd_block); ranges are
// cut into such blocks, the last one padded with zeros.
template <class T, class Block, class... In>
void map_blocks(std::int64_t n, const Block& block, T* out, const In*... in) {
    static_assert((std::is_same_v<T, In> && ...), "map_blocks: every input must have the output's element type");
    const cpu_isa isa = best_cpu_isa();
    parallel_for(0, n, elementwise_grain,
                 [&](std::int64_t lo, std::int64_t hi) { detail::map_range_on(isa, block, lo, hi, out, in...); });
}

}  // namespace loom::host
