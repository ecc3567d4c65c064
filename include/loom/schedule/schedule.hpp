#pragma once
// A pipeline schedule: the order in which every device runs its blocks.
//
//   schedule s = one_f_one_b(2, 4);    // templates.hpp, or written by hand:
//   schedule t{pipeline_shape::linear(2, 4),
//              {{F(s0,m0), F(s0,m1), B(s0,m0), ...}, {F(s1,m0), B(s1,m0), ...}}, "mine"};
//   validate(t);                       // validate.hpp: every block once, dependencies, messages,
//                                      // deadlock, memory
//
// device_order[d] lists what device d runs, first to last; a block of a stage on several
// devices appears in the order of each of them (see shape.hpp).
#include <cstddef>
#include <ostream>
#include <string>
#include <vector>

#include <loom/core/linkage.hpp>
#include <loom/schedule/block.hpp>
#include <loom/schedule/shape.hpp>

namespace loom::schedule {

struct schedule {
    pipeline_shape shape;
    std::vector<std::vector<block>> device_order;
    std::string name;
};

// "1F1B: 2 stages, 4 micro-batches, 2 devices
//    device 0: F(s0,m0) F(s0,m1) B(s0,m0) F(s0,m2) B(s0,m1) F(s0,m3) B(s0,m2) B(s0,m3)
//    device 1: ..."
LOOM_INLINE std::string to_string(const schedule& s);

inline std::ostream& operator<<(std::ostream& os, const schedule& s) { return os << to_string(s); }

// position[d][block_index(shape, b)]: where device d runs b, or -1 when it does not. Blocks
// outside the shape are left out (validate reports them).
LOOM_INLINE std::vector<std::vector<int>> order_positions(const schedule& s);

}  // namespace loom::schedule

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::schedule {

LOOM_INLINE std::string to_string(const schedule& s) {
    std::string out = (s.name.empty() ? std::string("schedule") : s.name) + ": " + std::to_string(s.shape.stages) +
                      " stages, " + std::to_string(s.shape.micro_batches) + " micro-batches, ";
    if (s.shape.rounds > 1) out += std::to_string(s.shape.rounds) + " forward rounds, ";
    out += std::to_string(s.shape.devices) + " devices";
    for (std::size_t d = 0; d < s.device_order.size(); ++d) {
        out += "\n  device " + std::to_string(d) + ":";
        for (const block& b : s.device_order[d]) out += " " + to_string(b, s.shape.rounds);
    }
    return out;
}

LOOM_INLINE std::vector<std::vector<int>> order_positions(const schedule& s) {
    std::vector<std::vector<int>> position(s.device_order.size(),
                                           std::vector<int>(static_cast<std::size_t>(block_count(s.shape)), -1));
    for (std::size_t d = 0; d < s.device_order.size(); ++d)
        for (std::size_t i = 0; i < s.device_order[d].size(); ++i) {
            const block& b = s.device_order[d][i];
            if (!contains(s.shape, b)) continue;
            int& slot = position[d][static_cast<std::size_t>(block_index(s.shape, b))];
            if (slot < 0) slot = static_cast<int>(i);
        }
    return position;
}

}  // namespace loom::schedule
#endif  // LOOM_HEADER_DEFINITIONS
