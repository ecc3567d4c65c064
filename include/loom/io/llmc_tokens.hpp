#pragma once
// llm.c's token shards (the .bin files its data scripts write, e.g. fineweb_val_000000.bin):
//   256 little-endian int32: [0] magic 20240520, [1] version 1, [2] token count N, rest 0
//   N little-endian uint16 tokens (GPT-2's 50257-token vocabulary fits)
// A file is exactly 1024 + 2 N bytes; anything else is truncated or has trailing bytes.
//
//   auto tokens = loom::io::read_llmc_tokens("fineweb_val_000000.bin");
//   loom::train::data_loader loader(std::move(tokens.tokens), {.batch = 8, .seq = 1024});
//
// Every error is a loom::data_error naming the file, what is wrong and how to get a good
// shard. (llm.c's model files, magic 20240326, are weights, not tokens: the error says so.)
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>

namespace loom::io {

inline constexpr std::int32_t llmc_tokens_magic = 20240520;
inline constexpr std::int32_t llmc_tokens_version = 1;
inline constexpr std::size_t llmc_header_ints = 256;
inline constexpr std::size_t llmc_header_bytes = llmc_header_ints * 4;

struct llmc_tokens {
    std::vector<std::int32_t> tokens;
    std::int32_t vocab_bound = 0;  // the largest token + 1 (a lower bound of the vocabulary)
};

namespace detail {
inline std::uint32_t llmc_get32(const unsigned char* p) {
    return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 | static_cast<std::uint32_t>(p[2]) << 16 |
           static_cast<std::uint32_t>(p[3]) << 24;
}
inline constexpr const char* llmc_fix =
    "regenerate the shard with llm.c's data scripts (dev/data/*.py) or loom::io::write_llmc_tokens";
}  // namespace detail

LOOM_INLINE llmc_tokens read_llmc_tokens(const std::filesystem::path& path);

// Writes tokens (each in [0, 65536)) as an llm.c token shard; throws loom::usage_error for
// a token that does not fit in uint16 and loom::data_error when the file cannot be written.
LOOM_INLINE void write_llmc_tokens(const std::filesystem::path& path, std::span<const std::int32_t> tokens);

}  // namespace loom::io

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::io {

LOOM_INLINE llmc_tokens read_llmc_tokens(const std::filesystem::path& path) {
    auto fail = [&](const std::string& what) -> void {
        throw data_error("llm.c token shard '" + path.string() + "' " + what);
    };
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) fail("does not exist or is not a file; check the path");
    const std::uintmax_t size = std::filesystem::file_size(path, ec);
    if (size < llmc_header_bytes)
        fail("is " + std::to_string(size) + " bytes, shorter than the 1024-byte header; it is truncated or not a token "
             "shard; " + detail::llmc_fix);
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot be opened; check its permissions");
    unsigned char header[llmc_header_bytes];
    in.read(reinterpret_cast<char*>(header), llmc_header_bytes);
    const auto magic = static_cast<std::int32_t>(detail::llmc_get32(header));
    const auto version = static_cast<std::int32_t>(detail::llmc_get32(header + 4));
    const std::uint64_t count = detail::llmc_get32(header + 8);
    if (magic != llmc_tokens_magic)
        fail("has magic " + std::to_string(magic) + ", not 20240520" +
             (magic == 20240326 ? std::string(" (20240326 is an llm.c model file, not tokens)") : std::string()) +
             "; pass a token shard (.bin from llm.c's data scripts)");
    if (version != llmc_tokens_version)
        fail("has version " + std::to_string(version) + "; loom reads version 1 (uint16 tokens); " + detail::llmc_fix);
    const std::uint64_t expected = llmc_header_bytes + 2 * count;
    if (size < expected)
        fail("is truncated: its header promises " + std::to_string(count) + " tokens (" + std::to_string(expected) +
             " bytes) but it has " + std::to_string(size) + " bytes; " + detail::llmc_fix);
    if (size > expected)
        fail("has " + std::to_string(size - expected) + " bytes after its " + std::to_string(count) +
             " tokens; the header's count is wrong or the file was appended to; " + detail::llmc_fix);
    std::vector<unsigned char> raw(static_cast<std::size_t>(2 * count));
    in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size()));
    if (static_cast<std::size_t>(in.gcount()) != raw.size()) fail("could not be read to its end; check the disk");
    llmc_tokens out;
    out.tokens.resize(static_cast<std::size_t>(count));
    for (std::size_t i = 0; i < out.tokens.size(); ++i) {
        out.tokens[i] = static_cast<std::int32_t>(raw[2 * i]) | static_cast<std::int32_t>(raw[2 * i + 1]) << 8;
        if (out.tokens[i] >= out.vocab_bound) out.vocab_bound = out.tokens[i] + 1;
    }
    return out;
}

LOOM_INLINE void write_llmc_tokens(const std::filesystem::path& path, std::span<const std::int32_t> tokens) {
    std::string bytes(llmc_header_bytes + 2 * tokens.size(), '\0');
    auto put32 = [&](std::size_t at, std::uint32_t v) {
        for (int i = 0; i < 4; ++i) bytes[at + static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xFF);
    };
    if (tokens.size() > 0x7fffffffU)
        throw usage_error("write_llmc_tokens: " + std::to_string(tokens.size()) +
                          " tokens do not fit one shard (int32 count); split them into several shards");
    put32(0, static_cast<std::uint32_t>(llmc_tokens_magic));
    put32(4, static_cast<std::uint32_t>(llmc_tokens_version));
    put32(8, static_cast<std::uint32_t>(tokens.size()));
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] < 0 || tokens[i] > 0xFFFF)
            throw usage_error("write_llmc_tokens: token " + std::to_string(tokens[i]) + " at " + std::to_string(i) +
                              " does not fit in uint16; llm.c shards hold tokens in [0, 65536)");
        bytes[llmc_header_bytes + 2 * i] = static_cast<char>(tokens[i] & 0xFF);
        bytes[llmc_header_bytes + 2 * i + 1] = static_cast<char>((tokens[i] >> 8) & 0xFF);
    }
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) throw data_error("write_llmc_tokens: cannot write '" + path.string() + "'; check the directory and free space");
}

}  // namespace loom::io
#endif  // LOOM_HEADER_DEFINITIONS
