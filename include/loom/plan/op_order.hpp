#pragma once
// op-order as plan data: which schedule orders the (stage, micro-batch, round, pass) blocks
// of a pipelined plan on every device. The typed parts (plan::order<OneFOneB>, ...,
// plan/parts.hpp) lower to this; plan::resolve (plan/resolve.hpp) turns it into the
// schedule the plan's programs run in, for the plan's stages, micro-batches and rounds.
//
//   GPipe            all forwards, then all backwards
//   OneFOneB         1F1B: after a warm-up, one forward and one backward alternate
//   Interleaved<V>   interleaved 1F1B: V model chunks per device group (micro-batches a
//                    multiple of the stages)
//   ThreeFOneB       three forward rounds and one backward per micro-batch (recycling
//                    models: a repeat of 3 rounds around the staged layers)
//   Interlaced       the interlaced pipeline: the ops outside the layers (embeddings, LM
//                    head, loss) run on all devices, their vocabulary split over all of
//                    them whatever the layers' rules, time-shared with a pipeline of the
//                    layers
//   ordered_by<...>  an order written as constraints alone (schedule::before)
//
// Several alternatives make the order an open choice, filled by name like any open number:
// its value is the index of the chosen alternative.
#include <cstdint>
#include <string>
#include <vector>

#include <loom/core/linkage.hpp>
#include <loom/schedule/constraints.hpp>

namespace loom::plan {

enum class schedule_kind : std::uint8_t { gpipe, one_f_one_b, interleaved, three_f_one_b, interlaced, from_constraints };

LOOM_INLINE std::string to_string(schedule_kind k);

struct order_policy {
    schedule_kind kind = schedule_kind::one_f_one_b;
    int virtual_stages = 1;                     // interleaved: model chunks per device group
    std::vector<schedule::before> constraints;  // from_constraints
    int rounds = 1;                             // from_constraints: forward rounds

    // Forward rounds the policy runs per micro-batch.
    int forward_rounds() const {
        return kind == schedule_kind::three_f_one_b ? 3 : kind == schedule_kind::from_constraints ? rounds : 1;
    }

    std::string describe() const {
        switch (kind) {
            case schedule_kind::gpipe: return "GPipe";
            case schedule_kind::one_f_one_b: return "1F1B";
            case schedule_kind::interleaved: return "interleaved 1F1B (" + std::to_string(virtual_stages) + " chunks)";
            case schedule_kind::three_f_one_b: return "3F1B";
            case schedule_kind::interlaced: return "interlaced";
            case schedule_kind::from_constraints:
                return "ordered by " + std::to_string(constraints.size()) + " constraints (" + std::to_string(rounds) +
                       " rounds)";
        }
        return "?";
    }
    friend bool operator==(const order_policy&, const order_policy&) = default;
};

struct order_spec {
    std::vector<order_policy> alternatives;  // none: plan order (one-stage, one micro-batch plans)
    std::string open;                        // several alternatives: the name of the choice
};

}  // namespace loom::plan

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::plan {

LOOM_INLINE std::string to_string(schedule_kind k) {
    switch (k) {
        case schedule_kind::gpipe: return "GPipe";
        case schedule_kind::one_f_one_b: return "1F1B";
        case schedule_kind::interleaved: return "interleaved 1F1B";
        case schedule_kind::three_f_one_b: return "3F1B";
        case schedule_kind::interlaced: return "interlaced";
        case schedule_kind::from_constraints: return "ordered by constraints";
    }
    return "?";
}

}  // namespace loom::plan
#endif  // LOOM_HEADER_DEFINITIONS
