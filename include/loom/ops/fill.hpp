#pragma once
// fill_like: a tensor of the shape of `like`, every element `value`. Seeds the backward
// pass (d loss / d loss = 1) and gives unused parameters a zero gradient. `like` is read
// only for its shape, so partitioning slices the output exactly as it slices `like`.
#include <loom/graph/builder.hpp>

namespace loom::ops {

struct FillLike {
    static constexpr std::string_view name = "fill_like";
    static constexpr signature sig = parse_signature("... -> ...");
    // A partitioned fill_like needs no data: the seed of the backward pass does not wait
    // for the loss to be summed (pipelines start backward passes before the last forward).
    static constexpr bool shape_only_inputs = true;
};

inline tensor fill_like(tensor like, double value) {
    return like.builder->apply1<FillLike>({like}, {{"value", value}});
}

}  // namespace loom::ops
