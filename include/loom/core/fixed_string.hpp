#pragma once
// A string literal usable as a template argument: `named_dim<"Batch">`, `scope<"block">`.
#include <algorithm>
#include <cstddef>
#include <string_view>

namespace loom {

template <std::size_t N>
struct fixed_string {
    char data[N]{};

    constexpr fixed_string(const char (&text)[N]) { std::copy_n(text, N, data); }

    constexpr std::string_view view() const { return {data, N - 1}; }
    constexpr std::size_t size() const { return N - 1; }
};

}  // namespace loom
