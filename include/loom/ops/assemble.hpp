#pragma once
// The two op kinds a plan adds between the pieces of partitioned ops:
//
//   assemble  builds one piece (box `out_box`) of a logical tensor on one device from local
//             pieces (boxes `in_boxes`): a chunk (one input that contains the box), a
//             concat (inputs that tile it) or a sum (partial values of one box). It copies
//             or adds each input's intersection with the output box.
//   transfer  one device's part in a collective or point-to-point transfer; the executor
//             hands it to a communicator (attribute `transfer` indexes the plan's list).
//
// Neither is written by users or differentiated: plans create them after autograd, and
// their backward twins are created the same way from the gradients' pieces. Both are
// appended without a signature (the number of inputs varies).
#include <cstdint>
#include <string_view>
#include <vector>

#include <loom/graph/builder.hpp>

namespace loom::ops {

struct Assemble {
    static constexpr std::string_view name = "assemble";
    static constexpr signature sig = parse_signature("... -> ...");
};

struct Transfer {
    static constexpr std::string_view name = "transfer";
    static constexpr signature sig = parse_signature("... -> ...");
    static constexpr bool communication = true;
};

}  // namespace loom::ops
