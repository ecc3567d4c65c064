#pragma once
// Is a schedule runnable? validate(s, options) throws schedule_error with the first problem,
// naming the blocks and how to fix it; validation_error(s, options) returns the same message
// ("" when the schedule is valid). The checks, in order:
//
//   1. the shape makes a pipeline (check_shape) and there is one order per device;
//   2. every entry is one of the shape's blocks, on a device that runs its stage, at most once;
//   3. every block is on each device of its stage (an SPMD block on all of them);
//   4. no device runs a block before a block it depends on (same device);
//   5. no deadlock: the graph of "v waits for u" edges (consecutive blocks of one device, and
//      every data dependency) has no cycle; a cycle is reported block by block;
//   6. messages do not cross: on each channel (device a -> device b) the receiving blocks run
//      on b in the order their producers run on a (transfers.hpp), else a receive would take
//      another block's message;
//   7. memory: the activations a device holds (in_flight.hpp) stay within
//        max_in_flight_per_stage   micro-batches per stage, and/or
//        memory_cap_bytes          bytes per device, with activation_bytes[s] the bytes one
//                                  micro-batch of stage s keeps on each of its devices.
// Sends are buffered (they never wait) and receives wait, as in loom's communicators, so a
// send/receive pair adds no wait of the sender on the receiver.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/linkage.hpp>
#include <loom/schedule/cycle.hpp>
#include <loom/schedule/in_flight.hpp>
#include <loom/schedule/schedule.hpp>
#include <loom/schedule/transfers.hpp>

namespace loom::schedule {

struct validation_options {
    int max_in_flight_per_stage = 0;          // 0: no cap
    std::int64_t memory_cap_bytes = 0;        // 0: no cap
    std::vector<std::int64_t> activation_bytes;  // per stage, with memory_cap_bytes
};

namespace detail {

inline std::string devices_text(const std::vector<int>& devices) {
    std::string out = devices.size() == 1 ? "device " : "devices {";
    for (std::size_t i = 0; i < devices.size(); ++i) out += (i ? ", " : "") + std::to_string(devices[i]);
    return devices.size() == 1 ? out : out + "}";
}

LOOM_INLINE std::string reads_text(dependency_kind k);

class validator {
public:
    validator(const schedule& s, const validation_options& o)
        : s_(s), o_(o), rounds_(s.shape.rounds),
          where_("validate(" + (s.name.empty() ? std::string("schedule") : "'" + s.name + "'") + ")") {}

    void run() {
        check_shape(s_.shape, where_ + ": shape");
        check_entries();
        check_complete();
        position_ = order_positions(s_);
        check_local_dependencies();
        check_deadlock();
        check_channels();
        check_memory();
    }

private:
    const schedule& s_;
    const validation_options& o_;
    int rounds_;
    std::string where_;
    std::vector<std::vector<int>> position_;

    std::string name(const block& b) const { return to_string(b, rounds_); }
    [[noreturn]] void fail(const std::string& why) const { throw schedule_error(where_ + ": " + why); }
    int pos(int device, const block& b) const {
        return position_[static_cast<std::size_t>(device)][static_cast<std::size_t>(block_index(s_.shape, b))];
    }

    void check_entries() const {
        const auto& p = s_.shape;
        if (s_.device_order.size() != static_cast<std::size_t>(p.devices))
            fail("device_order has " + std::to_string(s_.device_order.size()) + " device orders but the shape has " +
                 std::to_string(p.devices) + " devices; give one order per device");
        for (int d = 0; d < p.devices; ++d) {
            const auto& order = s_.device_order[static_cast<std::size_t>(d)];
            std::vector<int> first_at(static_cast<std::size_t>(block_count(p)), -1);
            for (std::size_t i = 0; i < order.size(); ++i) {
                const block& b = order[i];
                if (auto why = why_not_contained(p, b); !why.empty())
                    fail("device " + std::to_string(d) + " runs " + why + "; remove it or fix the block");
                if (!p.runs_on(b.stage, d))
                    fail("device " + std::to_string(d) + " runs " + name(b) + ", but stage " + std::to_string(b.stage) +
                         " runs on " + devices_text(p.devices_of(b.stage)) + "; move " + name(b) +
                         " into the order of " + devices_text(p.devices_of(b.stage)));
                int& first = first_at[static_cast<std::size_t>(block_index(p, b))];
                if (first >= 0)
                    fail("device " + std::to_string(d) + " runs " + name(b) + " twice (positions " + std::to_string(first) +
                         " and " + std::to_string(i) + "); run each block once on each of its devices");
                first = static_cast<int>(i);
            }
        }
    }

    void check_complete() const {
        const auto& p = s_.shape;
        const auto position = order_positions(s_);
        std::string first;
        int missing = 0;
        for (const block& b : all_blocks(p))
            for (int d : p.devices_of(b.stage))
                if (position[static_cast<std::size_t>(d)][static_cast<std::size_t>(block_index(p, b))] < 0) {
                    if (missing++ == 0)
                        first = "device " + std::to_string(d) + " never runs " + name(b) + " (stage " +
                                std::to_string(b.stage) + " runs on " + devices_text(p.devices_of(b.stage)) +
                                "); add it to device " + std::to_string(d) + "'s order";
                }
        if (missing == 1) fail(first);
        if (missing > 1) fail(first + " (" + std::to_string(missing) + " blocks are missing in all; this is the first)");
    }

    void check_local_dependencies() const {
        const auto& p = s_.shape;
        for (const dependency& dep : dependencies(p))
            for (int d : p.devices_of(dep.consumer.stage)) {
                if (!p.runs_on(dep.producer.stage, d)) continue;
                const int pc = pos(d, dep.consumer), pp = pos(d, dep.producer);
                if (pc < pp)
                    fail("device " + std::to_string(d) + " runs " + name(dep.consumer) + " (position " +
                         std::to_string(pc) + ") before " + name(dep.producer) + " (position " + std::to_string(pp) +
                         "), but " + name(dep.consumer) + " needs " + reads_text(dep.kind) + " from " +
                         name(dep.producer) + "; move " + name(dep.producer) + " before " + name(dep.consumer));
            }
    }

    // Labels of wait edges: >= 0 a dependency kind, < 0 "runs after it on device -label-1".
    void check_deadlock() const {
        const auto& p = s_.shape;
        std::vector<std::vector<labelled_edge>> out(static_cast<std::size_t>(block_count(p)));
        for (int d = 0; d < p.devices; ++d) {
            const auto& order = s_.device_order[static_cast<std::size_t>(d)];
            for (std::size_t i = 1; i < order.size(); ++i)
                out[static_cast<std::size_t>(block_index(p, order[i - 1]))].push_back({block_index(p, order[i]), -d - 1});
        }
        for (const dependency& dep : dependencies(p))
            out[static_cast<std::size_t>(block_index(p, dep.producer))].push_back(
                {block_index(p, dep.consumer), static_cast<int>(dep.kind)});
        const auto cycle = find_cycle(out);
        if (cycle.empty()) return;
        std::string text;
        std::string fix;
        for (const auto& e : cycle) {
            const block u = block_at(p, e.from), v = block_at(p, e.to);
            if (!text.empty()) text += "; ";
            if (e.label < 0) {
                const int d = -e.label - 1;
                text += name(v) + " waits for " + name(u) + " (device " + std::to_string(d) + " runs it first)";
                if (fix.empty())
                    fix = "e.g. run " + name(v) + " before " + name(u) + " on device " + std::to_string(d);
            } else {
                text += name(v) + " waits for " + name(u) + " (" + reads_text(static_cast<dependency_kind>(e.label)) + ")";
            }
        }
        fail("deadlock: these blocks wait for each other in a cycle: " + text +
             "; reorder a device so that no block runs before one it waits for (" + fix + ")");
    }

    void check_channels() const {
        const auto& p = s_.shape;
        std::map<std::pair<int, int>, std::vector<transfer>> channels;
        for (const transfer& t : all_transfers(p)) channels[{t.from, t.to}].push_back(t);
        for (auto& [ends, messages] : channels) {
            const auto [from, to] = ends;
            auto send_key = [&, from = from, to = to](const transfer& t) {
                return std::pair{pos(from, t.producer), pos(to, t.consumer)};
            };
            std::sort(messages.begin(), messages.end(),
                      [&](const transfer& a, const transfer& b) { return send_key(a) < send_key(b); });
            for (std::size_t i = 1; i < messages.size(); ++i) {
                const transfer& a = messages[i - 1];
                const transfer& b = messages[i];
                if (pos(to, a.consumer) <= pos(to, b.consumer)) continue;
                fail("crossed messages on channel device " + std::to_string(from) + " -> device " + std::to_string(to) +
                     ": device " + std::to_string(from) + " sends " + name(a.producer) + " -> " + name(a.consumer) +
                     " (" + to_string(a.kind) + ") before " + name(b.producer) + " -> " + name(b.consumer) + " (" +
                     to_string(b.kind) + "), but device " + std::to_string(to) + " runs " + name(b.consumer) +
                     " before " + name(a.consumer) + ", so " + name(b.consumer) + " would receive the message meant for " +
                     name(a.consumer) + "; on device " + std::to_string(to) + " run " + name(a.consumer) + " before " +
                     name(b.consumer) + ", or on device " + std::to_string(from) + " run " + name(b.producer) +
                     " before " + name(a.producer));
            }
        }
    }

    void check_memory() const {
        const auto& p = s_.shape;
        const bool bytes = o_.memory_cap_bytes > 0;
        if (bytes && o_.activation_bytes.size() != static_cast<std::size_t>(p.stages))
            throw usage_error(where_ + ": memory_cap_bytes needs activation_bytes for each of the " +
                              std::to_string(p.stages) + " stages; it has " + std::to_string(o_.activation_bytes.size()));
        if (o_.max_in_flight_per_stage <= 0 && !bytes) return;
        // What a device holds at a block, for messages: "stage 1: m0, m1, m2".
        auto held_list = [&](int d, std::size_t upto, int stage) {
            std::vector<int> held;
            const auto& order = s_.device_order[static_cast<std::size_t>(d)];
            for (std::size_t i = 0; i <= upto; ++i) {
                const block& b = order[i];
                if (b.stage != stage) continue;
                if (holds_activations(p, b)) held.push_back(b.micro);
                if (is_backward(b) && i < upto) std::erase(held, b.micro);
            }
            return held;
        };
        auto earliest_backward = [&](int d, std::size_t at, int stage) {
            const auto held = held_list(d, at, stage);
            return held.empty() ? std::string("a backward") : name(backward_block(stage, held.front()));
        };
        detail::walk_in_flight(s_, [&](int d, std::size_t i, const block& b, const std::vector<int>& held) {
            if (!holds_activations(p, b)) return;
            const int count = held[static_cast<std::size_t>(b.stage)];
            if (o_.max_in_flight_per_stage > 0 && count > o_.max_in_flight_per_stage) {
                std::string micros;
                for (int m : held_list(d, i, b.stage)) micros += (micros.empty() ? "m" : ", m") + std::to_string(m);
                fail("device " + std::to_string(d) + " holds the activations of " + std::to_string(count) +
                     " micro-batches of stage " + std::to_string(b.stage) + " at " + name(b) + " (" + micros +
                     "), over the cap of " + std::to_string(o_.max_in_flight_per_stage) +
                     " (max_in_flight_per_stage); run " + earliest_backward(d, i, b.stage) + " before " + name(b) +
                     ", or raise the cap");
            }
            if (!bytes) return;
            std::int64_t total = 0;
            std::string parts;
            for (int s = 0; s < p.stages; ++s) {
                const int h = held[static_cast<std::size_t>(s)];
                if (h == 0) continue;
                total += h * o_.activation_bytes[static_cast<std::size_t>(s)];
                parts += (parts.empty() ? "" : ", ") + std::string("stage ") + std::to_string(s) + ": " +
                         std::to_string(h) + " x " + std::to_string(o_.activation_bytes[static_cast<std::size_t>(s)]);
            }
            if (total > o_.memory_cap_bytes)
                fail("device " + std::to_string(d) + " holds " + std::to_string(total) + " bytes of activations at " +
                     name(b) + " (" + parts + "), over the cap of " + std::to_string(o_.memory_cap_bytes) +
                     " bytes (memory_cap_bytes); run " + earliest_backward(d, i, b.stage) + " before " + name(b) +
                     ", or raise the cap");
        });
    }
};

}  // namespace detail

inline void validate(const schedule& s, const validation_options& options = {}) {
    detail::validator(s, options).run();
}

// validate's message, or "" when the schedule is valid.
LOOM_INLINE std::string validation_error(const schedule& s, const validation_options& options = {});

}  // namespace loom::schedule

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::schedule::detail {

LOOM_INLINE std::string reads_text(dependency_kind k) {
    switch (k) {
        case dependency_kind::activation: return "its input activation";
        case dependency_kind::recycle: return "the previous round's output (recycling)";
        case dependency_kind::loss: return "the loss of its forward";
        case dependency_kind::gradient: return "its output gradient";
        case dependency_kind::saved_activation: return "its saved activations";
    }
    return "?";
}
}  // namespace loom::schedule::detail

namespace loom::schedule {

LOOM_INLINE std::string validation_error(const schedule& s, const validation_options& options) {
    try {
        validate(s, options);
    } catch (const schedule_error& e) {
        return e.what();
    }
    return {};
}

}  // namespace loom::schedule
#endif  // LOOM_HEADER_DEFINITIONS
