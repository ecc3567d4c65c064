#pragma once
// A validated schedule lowered to what each device does, messages included:
//
//   auto programs = device_programs(one_f_one_b(2, 4));
//   programs[0]: compute F(s0,m0), send F(s0,m0) -> F(s1,m0) to 1, compute F(s0,m1), ...,
//                receive B(s1,m0) -> B(s0,m0) from 1, compute B(s0,m0), ...
//
// Sends follow their producer, receives precede their consumer (transfers.hpp gives the
// order among several); an executor runs each program front to back with buffered sends and
// one FIFO channel per (from, to) pair, and validate() has shown that this cannot deadlock or
// hand a message to the wrong receive.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <loom/core/linkage.hpp>
#include <loom/schedule/schedule.hpp>
#include <loom/schedule/transfers.hpp>
#include <loom/schedule/validate.hpp>

namespace loom::schedule {

enum class step_kind : std::uint8_t { compute, send, receive };

struct step {
    step_kind kind = step_kind::compute;
    block target;        // compute: the block; send: the producer; receive: the consumer
    transfer message{};  // send / receive: the message (unused for compute)

    friend bool operator==(const step&, const step&) = default;
};

// "compute F(s0,m0)", "send F(s0,m0) -> F(s1,m0) to device 1", "receive ... from device 1"
LOOM_INLINE std::string to_string(const step& s, int rounds = 1);

// One program per device; validates the schedule first (throws schedule_error).
LOOM_INLINE std::vector<std::vector<step>> device_programs(const schedule& s);

}  // namespace loom::schedule

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::schedule {

LOOM_INLINE std::string to_string(const step& s, int rounds) {
    switch (s.kind) {
        case step_kind::compute: return "compute " + to_string(s.target, rounds);
        case step_kind::send:
            return "send " + to_string(s.message.producer, rounds) + " -> " + to_string(s.message.consumer, rounds) +
                   " to device " + std::to_string(s.message.to);
        case step_kind::receive:
            return "receive " + to_string(s.message.producer, rounds) + " -> " + to_string(s.message.consumer, rounds) +
                   " from device " + std::to_string(s.message.from);
    }
    return "?";
}

LOOM_INLINE std::vector<std::vector<step>> device_programs(const schedule& s) {
    validate(s);
    const auto& p = s.shape;
    const auto position = order_positions(s);
    auto pos = [&](int d, const block& b) {
        return position[static_cast<std::size_t>(d)][static_cast<std::size_t>(block_index(p, b))];
    };
    std::vector<std::vector<transfer>> into(static_cast<std::size_t>(block_count(p)));
    std::vector<std::vector<transfer>> out_of(static_cast<std::size_t>(block_count(p)));
    for (const transfer& t : all_transfers(p)) {
        into[static_cast<std::size_t>(block_index(p, t.consumer))].push_back(t);
        out_of[static_cast<std::size_t>(block_index(p, t.producer))].push_back(t);
    }
    std::vector<std::vector<step>> programs(static_cast<std::size_t>(p.devices));
    for (int d = 0; d < p.devices; ++d) {
        auto& program = programs[static_cast<std::size_t>(d)];
        for (const block& b : s.device_order[static_cast<std::size_t>(d)]) {
            std::vector<transfer> receives, sends;
            for (const transfer& t : into[static_cast<std::size_t>(block_index(p, b))])
                if (t.to == d) receives.push_back(t);
            for (const transfer& t : out_of[static_cast<std::size_t>(block_index(p, b))])
                if (t.from == d) sends.push_back(t);
            std::sort(receives.begin(), receives.end(), [&](const transfer& x, const transfer& y) {
                return std::tuple{x.from, pos(x.from, x.producer)} < std::tuple{y.from, pos(y.from, y.producer)};
            });
            std::sort(sends.begin(), sends.end(), [&](const transfer& x, const transfer& y) {
                return std::tuple{x.to, pos(x.to, x.consumer)} < std::tuple{y.to, pos(y.to, y.consumer)};
            });
            for (const transfer& t : receives) program.push_back({step_kind::receive, b, t});
            program.push_back({step_kind::compute, b, {}});
            for (const transfer& t : sends) program.push_back({step_kind::send, b, t});
        }
    }
    return programs;
}

}  // namespace loom::schedule
#endif  // LOOM_HEADER_DEFINITIONS
