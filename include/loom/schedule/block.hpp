#pragma once
// One unit of pipeline work: a stage's forward or backward pass on one micro-batch, and the
// error every schedule check throws.
//
//   block{pass_kind::forward, 1, 3}      F(s1,m3)    stage 1, micro-batch 3
//   block{pass_kind::forward, 1, 3, 2}   F2(s1,m3)   the third forward round (3F1B recycling)
//   block{pass_kind::backward, 1, 3}     B(s1,m3)    a backward has no round: it follows the last
//
// Blocks compare member-wise and order by (pass, stage, micro, round), so they can key maps.
// In a pipeline with several forward rounds, to_string(b, rounds) spells round 0 as F0 too.
#include <compare>
#include <cstdint>
#include <ostream>
#include <string>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>

namespace loom::schedule {

// A pipeline schedule that cannot be built, validated or run as written. A plan_error, so
// callers that catch plan mistakes catch these too.
struct schedule_error : plan_error {
    using plan_error::plan_error;
};

enum class pass_kind : std::uint8_t { forward, backward };

struct block {
    pass_kind pass = pass_kind::forward;
    int stage = 0;
    int micro = 0;
    int round = 0;  // forward: 0 .. rounds-1; backward: 0 (it needs the activations of the last round)

    friend constexpr bool operator==(const block&, const block&) = default;
    friend constexpr auto operator<=>(const block&, const block&) = default;
};

constexpr block forward_block(int stage, int micro, int round = 0) { return {pass_kind::forward, stage, micro, round}; }
constexpr block backward_block(int stage, int micro) { return {pass_kind::backward, stage, micro, 0}; }

constexpr bool is_forward(const block& b) { return b.pass == pass_kind::forward; }
constexpr bool is_backward(const block& b) { return b.pass == pass_kind::backward; }

// "F(s1,m3)", "F2(s1,m3)", "B(s1,m3)". With rounds > 1 every forward names its round ("F0(s1,m3)").
LOOM_INLINE std::string to_string(const block& b, int rounds = 1);

inline std::ostream& operator<<(std::ostream& os, const block& b) { return os << to_string(b); }

inline std::string to_string(pass_kind p) { return p == pass_kind::forward ? "forward" : "backward"; }

}  // namespace loom::schedule

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::schedule {

LOOM_INLINE std::string to_string(const block& b, int rounds) {
    std::string out = is_forward(b) ? "F" : "B";
    if (b.round != 0 || (is_forward(b) && rounds > 1)) out += std::to_string(b.round);
    out += "(s" + std::to_string(b.stage) + ",m" + std::to_string(b.micro) + ")";
    return out;
}

}  // namespace loom::schedule
#endif  // LOOM_HEADER_DEFINITIONS
