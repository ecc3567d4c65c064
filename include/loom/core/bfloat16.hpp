#pragma once
// bfloat16 on the host: the top 16 bits of an IEEE float (8 exponent bits, 7 mantissa
// bits). Its layout is that of CUDA's __nv_bfloat16, so buffers pass between the host
// twins of the CUDA kernels and the device unchanged. Conversion from float rounds to
// nearest, ties to even, as __float2bfloat16 does; NaN stays NaN.
#include <bit>
#include <cmath>
#include <cstdint>

namespace loom {

struct bfloat16 {
    std::uint16_t bits = 0;

    constexpr bfloat16() = default;
    constexpr explicit bfloat16(float value) : bits(round(value)) {}

    static constexpr bfloat16 from_bits(std::uint16_t raw) {
        bfloat16 b;
        b.bits = raw;
        return b;
    }

    constexpr explicit operator float() const { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

    friend constexpr bool operator==(bfloat16 a, bfloat16 b) { return a.bits == b.bits; }

private:
    static constexpr std::uint16_t round(float value) {
        const std::uint32_t u = std::bit_cast<std::uint32_t>(value);
        if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0)
            return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet NaN, sign kept
        const std::uint32_t lsb = (u >> 16) & 1u;
        return static_cast<std::uint16_t>((u + 0x7fffu + lsb) >> 16);
    }
};

static_assert(sizeof(bfloat16) == 2);
static_assert(static_cast<float>(bfloat16(1.0f)) == 1.0f);
static_assert(bfloat16(1.00390625f).bits == 0x3f80);  // a tie rounds to even (down)
static_assert(bfloat16(1.01171875f).bits == 0x3f82);  // a tie rounds to even (up)

// Rounds a float to the nearest bfloat16 and back: what storing it in bf16 does.
constexpr float round_to_bfloat16(float value) { return static_cast<float>(bfloat16(value)); }

}  // namespace loom
