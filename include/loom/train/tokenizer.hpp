#pragma once
// byte_tokenizer: one token per byte, so any text round-trips and the vocabulary is
// fixed at 256 without a trained merge table.
//   encode("Hi") -> {72, 105};  decode({72, 105}) -> "Hi";  decode(encode(s)) == s
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <loom/core/error.hpp>

namespace loom::train {

class byte_tokenizer {
public:
    static constexpr std::int32_t vocab_size() noexcept { return 256; }

    // Bytes are read as unsigned, so UTF-8 continuation bytes map to 128..255.
    std::vector<std::int32_t> encode(std::string_view text) const {
        std::vector<std::int32_t> ids;
        ids.reserve(text.size());
        for (char c : text) ids.push_back(static_cast<std::int32_t>(static_cast<unsigned char>(c)));
        return ids;
    }

    // Throws loom::usage_error on an id outside [0, 256): such an id comes from a model or
    // token file with a larger vocabulary, not from this tokenizer.
    std::string decode(std::span<const std::int32_t> ids) const {
        std::string text;
        text.reserve(ids.size());
        for (std::size_t i = 0; i < ids.size(); ++i) {
            const std::int32_t id = ids[i];
            if (id < 0 || id >= vocab_size()) {
                throw usage_error("byte_tokenizer::decode: id " + std::to_string(id) + " at position " +
                                  std::to_string(i) + " is outside the byte vocabulary [0, 256); decode only ids "
                                  "produced by byte_tokenizer::encode or a model whose vocab_size is 256");
            }
            text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
        }
        return text;
    }
};

}  // namespace loom::train
