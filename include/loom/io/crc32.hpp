#pragma once
// CRC-32 (the IEEE 802.3 / zlib polynomial, reflected, 0xEDB88320): the checksum that
// checkpoints record for every shard, so that a flipped or truncated byte is refused
// before it is trained on. crc32("123456789") == 0xCBF43926, as zlib.crc32 computes.
// Incremental: crc32(b, crc32(a)) == crc32(a + b).
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include <loom/core/linkage.hpp>

namespace loom::io {

namespace detail {
// Slicing-by-8: table k maps a byte to its CRC contribution k bytes further on, so eight
// bytes are folded per step with eight lookups instead of eight dependent ones.
constexpr std::array<std::array<std::uint32_t, 256>, 8> make_crc32_tables() noexcept {
    std::array<std::array<std::uint32_t, 256>, 8> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
        std::uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1U) ? 0xEDB88320U ^ (c >> 1) : c >> 1;
        t[0][i] = c;
    }
    for (std::size_t k = 1; k < 8; ++k)
        for (std::size_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFFU];
    return t;
}
inline constexpr std::array<std::array<std::uint32_t, 256>, 8> crc32_tables = make_crc32_tables();

inline std::uint32_t load_le32(const std::byte* p) noexcept {
    return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
           static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}
}  // namespace detail

// `previous` is the checksum of the bytes before these (0 for the start of a stream).
LOOM_INLINE std::uint32_t crc32(std::span<const std::byte> bytes, std::uint32_t previous = 0) noexcept;

inline std::uint32_t crc32(std::string_view text, std::uint32_t previous = 0) noexcept {
    return crc32(std::as_bytes(std::span(text.data(), text.size())), previous);
}

}  // namespace loom::io

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::io {

LOOM_INLINE std::uint32_t crc32(std::span<const std::byte> bytes, std::uint32_t previous) noexcept {
    const auto& t = detail::crc32_tables;
    std::uint32_t c = ~previous;
    const std::byte* p = bytes.data();
    std::size_t n = bytes.size();
    for (; n >= 8; n -= 8, p += 8) {
        const std::uint32_t one = detail::load_le32(p) ^ c, two = detail::load_le32(p + 4);
        c = t[7][one & 0xFFU] ^ t[6][(one >> 8) & 0xFFU] ^ t[5][(one >> 16) & 0xFFU] ^ t[4][one >> 24] ^
            t[3][two & 0xFFU] ^ t[2][(two >> 8) & 0xFFU] ^ t[1][(two >> 16) & 0xFFU] ^ t[0][two >> 24];
    }
    for (; n > 0; --n, ++p) c = t[0][(c ^ static_cast<std::uint32_t>(*p)) & 0xFFU] ^ (c >> 8);
    return ~c;
}

}  // namespace loom::io
#endif  // LOOM_HEADER_DEFINITIONS
