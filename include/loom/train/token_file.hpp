#pragma once
// A binary token file: a pre-tokenized corpus that training reads without re-tokenizing.
//
// Layout (all integers little-endian), 32-byte header then the tokens:
//   offset  0  8 bytes  magic "LOOMTOKS"
//   offset  8  u32      format version, 1
//   offset 12  u32      bytes per token, 2 (vocab_size <= 65536) or 4
//   offset 16  u32      vocab_size; every token is in [0, vocab_size)
//   offset 20  u32      reserved, 0
//   offset 24  u64      token count N
//   offset 32  N * bytes_per_token bytes of tokens
// So a file of N tokens is exactly 32 + N * bytes_per_token bytes long; anything else is
// truncated or has trailing bytes, and is rejected.
//
// Make one with write_token_file(path, tokens, vocab_size), e.g. from
// byte_tokenizer{}.encode(make_corpus()) with vocab_size 256.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>

namespace loom::train {

inline constexpr std::string_view token_file_magic = "LOOMTOKS";
inline constexpr std::uint32_t token_file_version = 1;
inline constexpr std::size_t token_file_header_bytes = 32;

namespace detail {

inline void token_file_put(std::string& out, std::uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

inline std::uint64_t token_file_get(const unsigned char* in, int bytes) {
    std::uint64_t value = 0;
    for (int i = 0; i < bytes; ++i) value |= static_cast<std::uint64_t>(in[i]) << (8 * i);
    return value;
}

inline std::string token_file_quote(const std::filesystem::path& path) { return "'" + path.string() + "'"; }

// Shows bytes as text where printable: "PK\x03\x04" for a zip file.
inline std::string token_file_printable(std::span<const unsigned char> bytes) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string text = "\"";
    for (unsigned char b : bytes) {
        if (b >= 0x20 && b < 0x7f && b != '"' && b != '\\') {
            text.push_back(static_cast<char>(b));
        } else {
            text += "\\x";
            text.push_back(hex[b >> 4]);
            text.push_back(hex[b & 0xF]);
        }
    }
    return text + "\"";
}

inline constexpr std::string_view token_file_fix =
    "write it with loom::train::write_token_file(path, tokens, vocab_size)";

}  // namespace detail

// Writes `tokens` in the format above: 2 bytes per token when vocab_size <= 65536, else 4.
// Throws loom::usage_error for a vocab_size of 0 or above 2^31 (ids are int32) and for a
// token outside [0, vocab_size); loom::data_error when the file cannot be written.
// The file is written beside `path` and renamed into place, so a reader never sees half of it.
LOOM_INLINE void write_token_file(const std::filesystem::path& path, std::span<const std::int32_t> tokens,
                                  std::uint32_t vocab_size);

// A token file read into memory and validated: every error names the path, what is wrong
// and how to make a good file. The tokens are shared, not copied, with data_loaders built
// from this file, so they stay alive as long as any of them.
class token_file {
public:
    explicit token_file(std::filesystem::path path) : path_(std::move(path)) { load(); }

    const std::filesystem::path& path() const noexcept { return path_; }
    std::size_t size() const noexcept { return tokens_->size(); }
    bool empty() const noexcept { return tokens_->empty(); }
    std::uint32_t vocab_size() const noexcept { return vocab_size_; }
    std::uint32_t bytes_per_token() const noexcept { return bytes_per_token_; }

    std::int32_t operator[](std::size_t i) const noexcept { return (*tokens_)[i]; }
    std::span<const std::int32_t> tokens() const noexcept { return *tokens_; }
    const std::shared_ptr<const std::vector<std::int32_t>>& shared_tokens() const noexcept { return tokens_; }

private:
    [[noreturn]] void fail(const std::string& what) const {
        throw data_error("token_file: " + detail::token_file_quote(path_) + " " + what);
    }

    void load() {
        std::error_code ec;
        const auto status = std::filesystem::status(path_, ec);
        if (!std::filesystem::exists(status)) fail("does not exist; " + std::string(detail::token_file_fix));
        if (!std::filesystem::is_regular_file(status)) fail("is not a regular file; pass the path of a token file");
        const std::uintmax_t file_bytes = std::filesystem::file_size(path_, ec);
        if (ec) fail("cannot be sized: " + ec.message());
        if (file_bytes == 0) fail("is empty (0 bytes), not a loom token file; " + std::string(detail::token_file_fix));

        std::ifstream in(path_, std::ios::binary);
        if (!in) fail("cannot be opened for reading; check its permissions");
        std::array<unsigned char, token_file_header_bytes> header{};
        const std::size_t header_read = static_cast<std::size_t>(std::min<std::uintmax_t>(file_bytes, header.size()));
        in.read(reinterpret_cast<char*>(header.data()), static_cast<std::streamsize>(header_read));
        if (static_cast<std::size_t>(in.gcount()) != header_read) fail("could not be read; check the disk");

        const std::size_t magic_read = std::min(header_read, token_file_magic.size());
        if (!std::equal(header.begin(), header.begin() + static_cast<std::ptrdiff_t>(magic_read), token_file_magic.begin())) {
            fail("starts with " + detail::token_file_printable({header.data(), magic_read}) + " instead of the magic \"" +
                 std::string(token_file_magic) + "\", so it is not a loom token file; " +
                 std::string(detail::token_file_fix));
        }
        if (header_read < token_file_header_bytes) {
            fail("is truncated: " + std::to_string(file_bytes) + " bytes, shorter than the " +
                 std::to_string(token_file_header_bytes) + "-byte header; " + std::string(detail::token_file_fix));
        }

        const auto version = static_cast<std::uint32_t>(detail::token_file_get(&header[8], 4));
        const auto width = static_cast<std::uint32_t>(detail::token_file_get(&header[12], 4));
        vocab_size_ = static_cast<std::uint32_t>(detail::token_file_get(&header[16], 4));
        const auto reserved = static_cast<std::uint32_t>(detail::token_file_get(&header[20], 4));
        const std::uint64_t count = detail::token_file_get(&header[24], 8);

        if (version != token_file_version) {
            fail("has format version " + std::to_string(version) + ", but this build reads only version " +
                 std::to_string(token_file_version) + "; rewrite it with this build's loom::train::write_token_file");
        }
        if (width != 2 && width != 4) {
            fail("declares " + std::to_string(width) + " bytes per token, but only 2 and 4 are valid; the header is "
                 "corrupt, " + std::string(detail::token_file_fix));
        }
        if (reserved != 0) {
            fail("has reserved header field " + std::to_string(reserved) + " instead of 0; the header is corrupt, " +
                 std::string(detail::token_file_fix));
        }
        if (vocab_size_ == 0 || vocab_size_ > (std::uint32_t{1} << 31)) {
            fail("declares vocab_size " + std::to_string(vocab_size_) + ", outside [1, 2^31]; the header is corrupt, " +
                 std::string(detail::token_file_fix));
        }
        bytes_per_token_ = width;

        const std::uintmax_t payload = file_bytes - token_file_header_bytes;
        const bool fits = count <= payload / width;  // count * width <= payload, without overflow
        if (!fits || payload != count * width) {
            const bool overflows = count > (std::numeric_limits<std::uint64_t>::max() - token_file_header_bytes) / width;
            const std::string expected =
                overflows ? std::string("more bytes than any file can hold")
                          : std::to_string(token_file_header_bytes + count * width) + " bytes";
            fail(std::string(fits ? "has trailing bytes" : "is truncated") + ": the header says " + std::to_string(count) +
                 " tokens of " + std::to_string(width) + " bytes, so expected " + expected + ", found " +
                 std::to_string(file_bytes) + " bytes; the file was " + (fits ? "appended to" : "cut short") + ", " +
                 std::string(detail::token_file_fix));
        }

        std::vector<unsigned char> raw(static_cast<std::size_t>(payload));
        in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size()));
        if (static_cast<std::size_t>(in.gcount()) != raw.size()) {
            fail("could not be read past byte " + std::to_string(token_file_header_bytes + in.gcount()) +
                 " of " + std::to_string(file_bytes) + "; check the disk");
        }
        auto tokens = std::make_shared<std::vector<std::int32_t>>(static_cast<std::size_t>(count));
        const int w = static_cast<int>(width);
        for (std::size_t i = 0; i < tokens->size(); ++i) {
            const std::uint64_t id = detail::token_file_get(&raw[i * width], w);
            if (id >= vocab_size_) {
                fail("has token " + std::to_string(id) + " at position " + std::to_string(i) + ", not below its vocab_size " +
                     std::to_string(vocab_size_) + "; the tokens are corrupt or the vocab_size is wrong, " +
                     std::string(detail::token_file_fix));
            }
            (*tokens)[i] = static_cast<std::int32_t>(id);
        }
        tokens_ = std::move(tokens);
    }

    std::filesystem::path path_;
    std::shared_ptr<const std::vector<std::int32_t>> tokens_ = std::make_shared<const std::vector<std::int32_t>>();
    std::uint32_t vocab_size_ = 0;
    std::uint32_t bytes_per_token_ = 0;
};

}  // namespace loom::train

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::train {

LOOM_INLINE void write_token_file(const std::filesystem::path& path, std::span<const std::int32_t> tokens,
                                  std::uint32_t vocab_size) {
    if (vocab_size == 0 || vocab_size > (std::uint32_t{1} << 31)) {
        throw usage_error("write_token_file: vocab_size " + std::to_string(vocab_size) + " for " +
                          detail::token_file_quote(path) + " is outside [1, 2^31]; pass the tokenizer's vocab_size "
                          "(256 for byte_tokenizer)");
    }
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] < 0 || static_cast<std::uint32_t>(tokens[i]) >= vocab_size) {
            throw usage_error("write_token_file: token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                              " is outside [0, " + std::to_string(vocab_size) + ") for " +
                              detail::token_file_quote(path) + "; pass the vocab_size of the tokenizer that produced "
                              "the tokens");
        }
    }
    const int width = vocab_size <= 65536 ? 2 : 4;

    std::string bytes;
    bytes.reserve(token_file_header_bytes + tokens.size() * static_cast<std::size_t>(width));
    bytes += token_file_magic;
    detail::token_file_put(bytes, token_file_version, 4);
    detail::token_file_put(bytes, static_cast<std::uint64_t>(width), 4);
    detail::token_file_put(bytes, vocab_size, 4);
    detail::token_file_put(bytes, 0, 4);
    detail::token_file_put(bytes, tokens.size(), 8);
    for (std::int32_t t : tokens) detail::token_file_put(bytes, static_cast<std::uint32_t>(t), width);

    std::filesystem::path partial = path;
    partial += ".partial";
    {
        std::ofstream out(partial, std::ios::binary | std::ios::trunc);
        if (!out) {
            throw data_error("write_token_file: cannot create " + detail::token_file_quote(partial) +
                             "; check that the directory exists and is writable");
        }
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        out.close();
        if (!out) {
            throw data_error("write_token_file: writing " + std::to_string(bytes.size()) + " bytes to " +
                             detail::token_file_quote(partial) + " failed; check free disk space");
        }
    }
    std::error_code ec;
    std::filesystem::rename(partial, path, ec);
    if (ec) {
        throw data_error("write_token_file: cannot rename " + detail::token_file_quote(partial) + " to " +
                         detail::token_file_quote(path) + ": " + ec.message() + "; check that the target is writable");
    }
}

}  // namespace loom::train
#endif  // LOOM_HEADER_DEFINITIONS
