#pragma once
// The checks of a pipeline template, run by the functions of templates.hpp
// (one_f_one_b(0, 4) throws schedule_error). The plan's order part (plan::order<...>,
// plan/pipeline_parts.hpp) checks the same things at compile time when stages and
// micro-batches are static, and a constraint on its own with first_constraint_error.
//
//   first_policy_error(view) -> the first mistake, or "" when there is none:
//     a stage count below 1; Virtual < 1 (interleaved); micro-batches below 1, or, for
//     interleaved 1F1B, not a multiple of the pipeline stages (when the count is known);
//     rounds below 1; a constraint that names a round the pipeline does not have, or is
//     ill-formed on its own (constraints.hpp).
//
// Messages start with the call as written and say how to fix it:
//   "interleaved_one_f_one_b(4, 2, 6): 6 micro-batches is not a multiple of the 4 pipeline
//    stages; interleaved 1F1B moves micro-batches through each virtual stage in groups of 4;
//    use 4 or 8 micro-batches"
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include <loom/core/static_text.hpp>
#include <loom/schedule/constraints.hpp>

namespace loom::schedule {

namespace detail {

enum class policy_kind : std::uint8_t { gpipe, one_f_one_b, interleaved, three_f_one_b, interlaced, from_constraints };

struct policy_view {
    policy_kind kind = policy_kind::one_f_one_b;
    std::string_view spelling;  // how the user wrote it: "one_f_one_b(4, 8)"
    int stages = 1;             // pipeline stages (interleaved: devices; interlaced: without embedding and head)
    int chunks = 1;             // interleaved: virtual stages per device
    int rounds = 1;
    bool micro_batches_known = false;
    int micro_batches = 0;
    std::span<const before> constraints{};
};

constexpr text first_policy_error(const policy_view& v) {
    if (v.stages < 1)
        return concat(v.spelling, ": ", v.stages, " pipeline stages; a pipeline needs at least one stage; use 1 or more");
    if (v.kind == policy_kind::interleaved && v.chunks < 1)
        return concat(v.spelling, ": ", v.chunks,
                      " virtual stages per device; each device needs at least one; use 1 or more (1 is plain 1F1B)");
    if (v.rounds < 1)
        return concat(v.spelling, ": ", v.rounds, " forward rounds; every micro-batch runs at least one forward; use 1 or more");
    if (v.micro_batches_known && v.micro_batches < 1)
        return concat(v.spelling, ": ", v.micro_batches, " micro-batches; a pipeline needs at least one micro-batch");
    if (v.kind == policy_kind::interleaved && v.micro_batches_known && v.micro_batches % v.stages != 0) {
        const int below = v.micro_batches / v.stages * v.stages, above = below + v.stages;
        return concat(v.spelling, ": ", v.micro_batches, " micro-batches is not a multiple of the ", v.stages,
                      " pipeline stages; interleaved 1F1B moves micro-batches through each virtual stage in groups of ",
                      v.stages, "; use ", below > 0 ? concat(below, " or ") : text(), above, " micro-batches");
    }
    for (std::size_t i = 0; i < v.constraints.size(); ++i) {
        const text where = concat(v.spelling, ": constraint #", static_cast<int>(i));
        if (text e = first_constraint_error(v.constraints[i], v.rounds, where.view()); !e.empty()) return e;
    }
    return {};
}

}  // namespace detail

}  // namespace loom::schedule
