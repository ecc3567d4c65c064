#pragma once
// Signatures built from dim tag types instead of text: each dim variable is named after its
// tag, so the result is exactly what parsing the spelled-out text gives.
//
//   using loom::Dim::Batch, loom::Dim::Hidden, loom::Dim::FFN;
//   constexpr signature s = signature_from<inputs<dims<Batch, Hidden>, dims<FFN, Hidden>>,
//                                          outputs<dims<Batch, FFN>>>();
//   // == parse_signature("Batch Hidden, FFN Hidden -> Batch FFN"): Hidden is contracted.
//
// `frozen<D>` marks a dim that must not be split: dims<Batch, frozen<Hidden>>.
#include <array>
#include <cstddef>
#include <string_view>

#include <loom/core/dim.hpp>
#include <loom/core/signature.hpp>

namespace loom {

template <dim_tag D>
struct frozen {};

template <class... Dims>
struct dims {};

template <class... Operands>
struct inputs {};

template <class... Operands>
struct outputs {};

namespace detail {

struct signature_text {
    std::array<char, 512> chars{};
    std::size_t size = 0;

    constexpr void append(std::string_view s) {
        for (char c : s) chars[size++] = c;
    }
    constexpr std::string_view view() const { return {chars.data(), size}; }
};

template <class D>
struct dim_spelling {
    static constexpr void write(signature_text& t) { t.append(D::name); }
};
template <class D>
struct dim_spelling<frozen<D>> {
    static constexpr void write(signature_text& t) {
        t.append(D::name);
        t.append("^");
    }
};

template <class Operand>
struct operand_spelling;
template <class... Ds>
struct operand_spelling<dims<Ds...>> {
    static constexpr void write(signature_text& t) {
        bool first = true;
        ((t.append(first ? "" : " "), dim_spelling<Ds>::write(t), first = false), ...);
    }
};

template <class... Operands>
constexpr void write_operands(signature_text& t) {
    bool first = true;
    ((t.append(first ? "" : ", "), operand_spelling<Operands>::write(t), first = false), ...);
}

template <class In, class Out>
struct signature_spelling;
template <class... Ins, class... Outs>
struct signature_spelling<inputs<Ins...>, outputs<Outs...>> {
    static constexpr signature_text text() {
        signature_text t;
        write_operands<Ins...>(t);
        t.append(" -> ");
        write_operands<Outs...>(t);
        return t;
    }
};

}  // namespace detail

template <class Inputs, class Outputs>
constexpr signature signature_from() {
    constexpr detail::signature_text text = detail::signature_spelling<Inputs, Outputs>::text();
    return parse_signature(text.view());
}

}  // namespace loom
