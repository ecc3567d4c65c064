#pragma once
// Activations in flight: a forward of the last round keeps its activations from its start
// until its backward ends, so walking a device's order counts what it holds at each block.
// Earlier forward rounds (3F1B recycling) keep nothing past their end.
//
//   GPipe      every stage holds all m micro-batches before its first backward
//   1F1B       stage s holds p - s (at most m)
//   interleaved device d holds 2(p - d - 1) + (v - 1)p + 1 chunks' activations (at most v m)
#include <algorithm>
#include <cstddef>
#include <functional>
#include <vector>

#include <loom/core/linkage.hpp>
#include <loom/schedule/schedule.hpp>

namespace loom::schedule {

struct in_flight_peaks {
    std::vector<int> per_stage;   // most micro-batches whose activations one device of stage s holds at once
    std::vector<int> per_device;  // most (stage, micro-batch) activations device d holds at once
};

namespace detail {

// Calls visit(device, position, block, held_per_stage) after each block of each device's
// order, with held_per_stage[s] the micro-batches of stage s that device holds just then
// (a forward counts from its start, so this is the high-water mark of the block).
LOOM_INLINE void walk_in_flight(const schedule& s,
                                const std::function<void(int, std::size_t, const block&, const std::vector<int>&)>& visit);

}  // namespace detail

LOOM_INLINE in_flight_peaks peak_in_flight(const schedule& s);

}  // namespace loom::schedule

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::schedule::detail {

LOOM_INLINE void walk_in_flight(const schedule& s,
                                const std::function<void(int, std::size_t, const block&, const std::vector<int>&)>& visit) {
    for (std::size_t d = 0; d < s.device_order.size(); ++d) {
        std::vector<int> held(static_cast<std::size_t>(std::max(s.shape.stages, 0)), 0);
        for (std::size_t i = 0; i < s.device_order[d].size(); ++i) {
            const block& b = s.device_order[d][i];
            if (b.stage < 0 || b.stage >= s.shape.stages) continue;
            auto& h = held[static_cast<std::size_t>(b.stage)];
            if (holds_activations(s.shape, b)) ++h;
            visit(static_cast<int>(d), i, b, held);
            if (is_backward(b)) h = std::max(h - 1, 0);
        }
    }
}
}  // namespace loom::schedule::detail

namespace loom::schedule {

LOOM_INLINE in_flight_peaks peak_in_flight(const schedule& s) {
    in_flight_peaks peaks{std::vector<int>(static_cast<std::size_t>(std::max(s.shape.stages, 0)), 0),
                          std::vector<int>(s.device_order.size(), 0)};
    detail::walk_in_flight(s, [&](int d, std::size_t, const block& b, const std::vector<int>& held) {
        auto& stage_peak = peaks.per_stage[static_cast<std::size_t>(b.stage)];
        stage_peak = std::max(stage_peak, held[static_cast<std::size_t>(b.stage)]);
        int total = 0;
        for (int h : held) total += h;
        auto& device_peak = peaks.per_device[static_cast<std::size_t>(d)];
        device_peak = std::max(device_peak, total);
    });
    return peaks;
}

}  // namespace loom::schedule
#endif  // LOOM_HEADER_DEFINITIONS
