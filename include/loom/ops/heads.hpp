#pragma once
// Attention heads as an axis of their own:
//   split_heads  "b s (h d) -> b h s d"   x[b, s, h*D + d] = y[b, h, s, d]; h = attribute heads
//   merge_heads  "b h s d -> b s (h d)"   the inverse; the merged axis is named Hidden
// Heads are the outermost variable of the group, so a split into head slices is contiguous
// in the hidden axis (tensor parallelism by heads); d is inner and cannot be split.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/graph/builder.hpp>

namespace loom::ops {

struct SplitHeads {
    static constexpr std::string_view name = "split_heads";
    static constexpr signature sig = parse_signature("b s (h d) -> b h s d");
    // The dim each variable always carries, for the plan combinators' compile-time checks;
    // the grouped input axis (h d) is Hidden.
    static constexpr std::pair<std::string_view, dim_id> variable_dims[] = {
        {"b", Dim::Batch::id}, {"s", Dim::Seq::id}, {"h", Dim::Head::id}, {"d", Dim::HeadDim::id}, {"(h d)", Dim::Hidden::id}};

    static std::vector<preset_variable> presets(const attributes& a, std::span<const shape> in) {
        const std::int64_t heads = a.get<std::int64_t>("heads");
        if (heads <= 0)
            throw shape_error("split_heads: heads = " + std::to_string(heads) + "; pass a positive head count");
        if (in.size() == 1 && in[0].rank() == 3 && in[0].extent(2) % heads != 0) {
            const std::int64_t hidden = in[0].extent(2);
            throw shape_error("split_heads: the hidden extent " + std::to_string(hidden) + " (dim " +
                              std::string(in[0].dim(2).name()) + ") of input " + in[0].to_string() +
                              " is not divisible by heads = " + std::to_string(heads) +
                              "; choose a head count that divides " + std::to_string(hidden) +
                              " or a hidden size that is a multiple of " + std::to_string(heads));
        }
        // d's extent is deduced from the group; only its name is preset.
        return {{"h", Dim::Head::id, heads}, {"d", Dim::HeadDim::id, 0}};
    }

    // A piece split along heads holds fewer of them.
    static attributes piece_attributes(const node& n, const piece_ranges& r) {
        attributes a = n.attrs;
        auto h = static_cast<std::size_t>(*n.sig.find("h"));
        a.set("heads", r.end[h] - r.begin[h]);
        return a;
    }

    static gradients backward(backward_context& c);
};

struct MergeHeads {
    static constexpr std::string_view name = "merge_heads";
    static constexpr signature sig = parse_signature("b h s d -> b s (h d)");
    // The dim each variable always carries, for the plan combinators' compile-time checks;
    // the grouped output axis (h d) is Hidden.
    static constexpr std::pair<std::string_view, dim_id> variable_dims[] = {
        {"b", Dim::Batch::id}, {"h", Dim::Head::id}, {"s", Dim::Seq::id}, {"d", Dim::HeadDim::id}, {"(h d)", Dim::Hidden::id}};

    static std::vector<shape> infer(const bound_signature& b, const attributes&, std::span<const shape>) {
        return {output_shape(b, 0, Dim::Hidden::id)};
    }

    static gradients backward(backward_context& c);
};

// [b, s, heads * d] -> [b, heads, s, d]
inline tensor split_heads(tensor x, std::int64_t heads) {
    return x.builder->apply1<SplitHeads>({x}, {{"heads", heads}});
}
// [b, h, s, d] -> [b, s, h * d]
inline tensor merge_heads(tensor x) { return x.builder->apply1<MergeHeads>({x}); }

inline gradients SplitHeads::backward(backward_context& c) { return {merge_heads(*c.grad_outputs[0])}; }

inline gradients MergeHeads::backward(backward_context& c) {
    return {split_heads(*c.grad_outputs[0], c.inputs[0].extent(1))};
}

}  // namespace loom::ops
