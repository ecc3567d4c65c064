#pragma once
// Text built in constant expressions: the spellings of plan combinators
// ("plan::trans<Split<Batch>, 4>") and the messages of the plan checks.
//
// `text` is a fixed-capacity string with no allocation. It works in every constant
// expression and on every compiler (a constexpr std::string does not: GCC 12 rejects some
// uses of short strings, and Clang 14 with libstdc++ 12 rejects all), and the same
// functions build messages at run time. What must persist is copied into:
//   * static_text: a spelling that views (plan/checks.hpp) point into;
//   * message: an error found at compile time, carried as a template argument of
//     plan::ill_formed_plan, which is how a computed message reaches the compiler's output
//     (static_assert accepts only a literal before C++26). GCC prints
//       In instantiation of 'struct loom::plan::ill_formed_plan<loom::plan::detail::message{"plan::trans<...>: ..."}>'
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace loom::plan::detail {

// A string of at most `capacity` characters; a longer one keeps its start and ends in "...".
class text {
public:
    static constexpr std::size_t capacity = 768;

    constexpr text() = default;
    constexpr text(std::string_view s) { append(s); }
    constexpr text(const char* s) { append(std::string_view(s)); }

    constexpr void push_back(char c) {
        if (size_ < capacity) {
            data_[size_++] = c;
        } else if (data_[capacity - 1] != '.') {
            data_[capacity - 3] = data_[capacity - 2] = data_[capacity - 1] = '.';
        }
    }
    constexpr void append(std::string_view s) {
        for (char c : s) push_back(c);
    }

    constexpr bool empty() const { return size_ == 0; }
    constexpr std::size_t size() const { return size_; }
    constexpr std::string_view view() const { return {data_, size_}; }
    constexpr operator std::string_view() const { return view(); }
    std::string str() const { return std::string(view()); }

private:
    char data_[capacity]{};
    std::size_t size_ = 0;
};

constexpr text decimal(std::int64_t value) {
    char reversed[24]{};
    int n = 0;
    const bool negative = value < 0;
    do {
        const std::int64_t digit = value % 10;
        reversed[n++] = static_cast<char>('0' + (digit < 0 ? -digit : digit));
        value /= 10;
    } while (value != 0);
    text digits;
    if (negative) digits.push_back('-');
    while (n > 0) digits.push_back(reversed[--n]);
    return digits;
}

constexpr void append(text& out, std::string_view s) { out.append(s); }
constexpr void append(text& out, const text& s) { out.append(s.view()); }
constexpr void append(text& out, const char* s) { out.append(std::string_view(s)); }
template <std::integral T>
    requires(!std::same_as<T, char> && !std::same_as<T, bool>)
constexpr void append(text& out, T value) {
    out.append(decimal(static_cast<std::int64_t>(value)).view());
}

// concat("degree ", 4, " of ", name) -> "degree 4 of Batch"
template <class... Parts>
constexpr text concat(const Parts&... parts) {
    text out;
    (append(out, parts), ...);
    return out;
}

// join({1, 2, 4}) -> "1, 2, 4"
constexpr text join(std::span<const std::int64_t> values) {
    text out;
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (i) append(out, ", ");
        append(out, values[i]);
    }
    return out;
}

// divisors_text(12) -> "1, 2, 3, 4, 6, 12"
constexpr text divisors_text(std::int64_t n) {
    text out;
    std::int64_t d = 1;
    for (; d <= n / d; ++d)
        if (n % d == 0) append(out, concat(out.empty() ? "" : ", ", d));
    for (--d; d >= 1; --d)
        if (n % d == 0 && d != n / d) append(out, concat(", ", n / d));
    return out;
}

// A fixed-capacity copy of a text, for spellings that live in static storage.
template <std::size_t Capacity>
struct fixed_text {
    char data[Capacity]{};
    std::size_t size = 0;

    constexpr fixed_text() = default;
    constexpr fixed_text(std::string_view s) {
        size = s.size() < Capacity ? s.size() : Capacity;
        for (std::size_t i = 0; i < size; ++i) data[i] = s[i];
    }
    constexpr fixed_text(const text& t) : fixed_text(t.view()) {}
    constexpr fixed_text(const char* s) : fixed_text(std::string_view(s)) {}

    constexpr std::string_view view() const { return {data, size}; }
    constexpr bool empty() const { return size == 0; }
};

using static_text = fixed_text<256>;

// An error message as a structural value (one array, so GCC prints it as a string).
struct message {
    char chars[text::capacity + 1]{};

    constexpr message() = default;
    constexpr message(std::string_view s) {
        for (std::size_t i = 0; i < s.size() && i < text::capacity; ++i) chars[i] = s[i];
    }
    constexpr message(const text& t) : message(t.view()) {}
    constexpr bool empty() const { return chars[0] == '\0'; }
    constexpr std::string_view view() const { return std::string_view(chars); }
};

}  // namespace loom::plan::detail
