#pragma once
// Host kernels of dropout and dropout_grad: y = x * (keep ? 1 / (1 - p) : 0), the scale
// rounded to T as PyTorch's noise.div_(1 - p), and a dropped element multiplied by 0 as
// PyTorch's input * noise (so a NaN stays NaN).
//
// The mask law: element i at step s is kept iff b_i >= t, t = min(ceil(p 2^32), 2^32 - 1), with
//   key = mix64(mix64(seed) ^ mix64(s + golden)),  h_j = mix64(key + (j + 1) golden),
//   b_i = the low 32 bits of h_(i/2) for even i, the high 32 bits for odd i,
// mix64 the splitmix64 finalizer and golden = 2^64 / phi: h_j is the j-th output of the
// splitmix64 stream that starts at `key`, so b_i / 2^32 is uniform on [0, 1) and an element
// is kept with probability 1 - p (to 2^-32). One hash serves two elements. i is the flat index
// in the tensor this kernel sees; a partitioned run must hand each slice its global indices
// (ops/dropout.hpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include <loom/core/random.hpp>
#include <loom/ops/dropout.hpp>
#include <loom/runtime/host/kernel_call.hpp>
#include <loom/runtime/host/kernels/elementwise.hpp>
#include <loom/runtime/host/kernels/vector_math.hpp>
#include <loom/runtime/host/thread_pool.hpp>

namespace loom::host {

// The keep-or-drop decision of every element for one (seed, step, p).
class dropout_mask {
public:
    static constexpr std::uint64_t golden = golden_gamma;
    static constexpr std::uint64_t mix64(std::uint64_t z) { return finalize_mix(z); }

    dropout_mask(std::int64_t seed, std::uint64_t step, double p)
        : key_(mix64(mix64(static_cast<std::uint64_t>(seed)) ^ mix64(step + golden))), threshold_(threshold_of(p)) {}

    // h_pair: the hash shared by elements 2 pair and 2 pair + 1.
    std::uint64_t pair_hash(std::uint64_t pair) const { return mix64(key_ + (pair + 1) * golden); }
    std::uint32_t bits(std::uint64_t index) const {
        return static_cast<std::uint32_t>(pair_hash(index >> 1) >> (32 * (index & 1)));
    }
    bool keeps(std::uint64_t index) const { return bits(index) >= threshold_; }
    std::uint32_t threshold() const { return threshold_; }

private:
    // p 2^32 is exact in a double, so its ceil is exact too.
    static std::uint32_t threshold_of(double p) {
        const double t = std::ceil(p * 0x1.0p32);
        return t >= 0x1.0p32 - 1 ? 0xffffffffu : static_cast<std::uint32_t>(t);
    }

    std::uint64_t key_;
    std::uint32_t threshold_;
};

namespace detail {
template <class T>
void apply_dropout(const kernel_call<T>& c) {
    const double p = c.attrs().template get<double>("p");
    const T* x = c.input(0);
    T* y = c.output(0);
    const std::int64_t n = c.output_numel(0);
    if (p == 0.0) {
        if (x != y) std::memcpy(y, x, static_cast<std::size_t>(n) * sizeof(T));
        return;
    }
    const dropout_mask mask(c.attrs().template get<std::int64_t>("seed"), c.step, p);
    const T scale = T(1) / static_cast<T>(1.0 - p);
    if (c.attrs().has("origin")) {
        // A piece of a partitioned tensor: element i's index in the whole tensor decides.
        const auto& origin = c.attrs().template get<std::vector<std::int64_t>>("origin");
        const auto& whole = c.attrs().template get<std::vector<std::int64_t>>("whole");
        const shape& local = c.output_shape(0);
        const std::size_t rank = local.rank();
        const std::int64_t row = rank ? local.extent(rank - 1) : 1;
        parallel_for(0, n / std::max<std::int64_t>(row, 1), std::max<std::int64_t>(1, elementwise_grain / std::max<std::int64_t>(row, 1)),
                     [&](std::int64_t lo, std::int64_t hi) {
                         for (std::int64_t r = lo; r < hi; ++r) {
                             // Global flat index of the row's first element.
                             std::int64_t rest = r, global = 0, stride = 1;
                             for (std::size_t a = rank; a-- > 0;) {
                                 const std::int64_t at = a + 1 == rank ? 0 : rest % local.extent(a);
                                 if (a + 1 != rank) rest /= local.extent(a);
                                 global += (at + origin[a]) * stride;
                                 stride *= whole[a];
                             }
                             for (std::int64_t j = 0; j < row; ++j) {
                                 const std::int64_t i = r * row + j;
                                 y[i] = x[i] * (mask.keeps(static_cast<std::uint64_t>(global + j)) ? scale : T(0));
                             }
                         }
                     });
        return;
    }
    // Unsigned b >= t as signed (b ^ 2^31) >= (t ^ 2^31): SSE2 compares only signed lanes.
    constexpr std::uint32_t sign = 0x80000000u;
    const auto threshold = static_cast<std::int32_t>(mask.threshold() ^ sign);
    auto one = [&](std::int64_t i) { y[i] = x[i] * (mask.keeps(static_cast<std::uint64_t>(i)) ? scale : T(0)); };
    parallel_for(0, n, elementwise_grain, [&](std::int64_t lo, std::int64_t hi) {
        std::int64_t i = lo;
        for (; i < hi && i % simd_block != 0; ++i) one(i);
        // Whole blocks start at an even index: simd_block / 2 hashes give their bits.
        for (; i + simd_block <= hi; i += simd_block) {
            std::int32_t biased[simd_block];
            const auto first_pair = static_cast<std::uint64_t>(i) / 2;
            for (std::int64_t j = 0; j < simd_block / 2; ++j) {
                const std::uint64_t h = mask.pair_hash(first_pair + static_cast<std::uint64_t>(j));
                biased[2 * j] = static_cast<std::int32_t>(static_cast<std::uint32_t>(h) ^ sign);
                biased[2 * j + 1] = static_cast<std::int32_t>(static_cast<std::uint32_t>(h >> 32) ^ sign);
            }
            const T* __restrict xb = x + i;
            T* __restrict yb = y + i;
            // A branch here would mispredict on a random mask; a select vectorizes.
            for (std::int64_t j = 0; j < simd_block; ++j) yb[j] = xb[j] * select_bits(biased[j] >= threshold, scale, T(0));
        }
        for (; i < hi; ++i) one(i);
    });
}
}  // namespace detail

template <>
struct host_kernel<ops::Dropout> {
    template <class T>
    static void run(const kernel_call<T>& c) { detail::apply_dropout(c); }
};

template <>
struct host_kernel<ops::DropoutGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) { detail::apply_dropout(c); }
};

}  // namespace loom::host
