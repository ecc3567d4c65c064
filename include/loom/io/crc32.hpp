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

namespace loom::io {

namespace detail {
constexpr std::array<std::uint32_t, 256> make_crc32_table() noexcept {
    std::array<std::uint32_t, 256> table{};
    for (std::uint32_t i = 0; i < 256; ++i) {
        std::uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1U) ? 0xEDB88320U ^ (c >> 1) : c >> 1;
        table[i] = c;
    }
    return table;
}
inline constexpr std::array<std::uint32_t, 256> crc32_table = make_crc32_table();
}  // namespace detail

// `previous` is the checksum of the bytes before these (0 for the start of a stream).
inline std::uint32_t crc32(std::span<const std::byte> bytes, std::uint32_t previous = 0) noexcept {
    std::uint32_t c = ~previous;
    for (std::byte b : bytes) c = detail::crc32_table[(c ^ static_cast<std::uint32_t>(b)) & 0xFFU] ^ (c >> 8);
    return ~c;
}

inline std::uint32_t crc32(std::string_view text, std::uint32_t previous = 0) noexcept {
    return crc32(std::as_bytes(std::span(text.data(), text.size())), previous);
}

}  // namespace loom::io
