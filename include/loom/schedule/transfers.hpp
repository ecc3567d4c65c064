#pragma once
// The messages a pipeline sends: one per dependency and consumer device that does not run the
// producer.
//
// Devices talk over FIFO channels, one per ordered pair (from -> to); a send is buffered and
// never waits (as loom's communicators do), a receive waits for its message. Where a message
// goes in the device programs (program.hpp):
//   send     on `from`, right after the producer (several: by destination, then by the
//            position of the consumer on it);
//   receive  on `to`, right before the consumer (several: by source, then by the position of
//            the producer on it).
// So a channel delivers the messages of its producers in their order on `from`, and `to` must
// run their consumers in that same order; validate() rejects a schedule whose channel would
// deliver a message to the wrong receive ("crossed messages").
//
// Which device sends: the consumer device c receives from the producer's device at c's
// position in the consumer's device list, modulo the producer's list length. A consumer device
// that also runs the producer reads the output locally (an SPMD block's output is complete on
// each of its devices).
//   F(s0,m) on {0} -> F(s1,m) on {1}          one message 0 -> 1
//   F(s4,m) on {3} -> F(s5,m) on {0,1,2,3}    messages 3 -> 0, 3 -> 1, 3 -> 2; device 3 is local
//   F(s0,m) on {0,1,2,3} -> F(s1,m) on {0}    local
#include <cstddef>
#include <string>
#include <vector>

#include <loom/core/linkage.hpp>
#include <loom/schedule/block.hpp>
#include <loom/schedule/shape.hpp>

namespace loom::schedule {

struct transfer {
    block producer;
    block consumer;
    int from = 0;
    int to = 0;
    dependency_kind kind = dependency_kind::activation;

    friend bool operator==(const transfer&, const transfer&) = default;
};

// "F(s0,m2) -> F(s1,m2) (activation, device 0 -> device 1)"
inline std::string to_string(const transfer& t, int rounds = 1) {
    return to_string(t.producer, rounds) + " -> " + to_string(t.consumer, rounds) + " (" + to_string(t.kind) +
           ", device " + std::to_string(t.from) + " -> device " + std::to_string(t.to) + ")";
}

// The messages one dependency needs (none when every consumer device runs the producer).
LOOM_INLINE std::vector<transfer> transfers_of(const pipeline_shape& p, const dependency& dep);

// Every message of the shape, by consumer in block_index order.
LOOM_INLINE std::vector<transfer> all_transfers(const pipeline_shape& p);

}  // namespace loom::schedule

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::schedule {

LOOM_INLINE std::vector<transfer> transfers_of(const pipeline_shape& p, const dependency& dep) {
    std::vector<transfer> out;
    const auto& from = p.devices_of(dep.producer.stage);
    const auto& to = p.devices_of(dep.consumer.stage);
    for (std::size_t i = 0; i < to.size(); ++i) {
        if (p.runs_on(dep.producer.stage, to[i])) continue;
        out.push_back({dep.producer, dep.consumer, from[i % from.size()], to[i], dep.kind});
    }
    return out;
}

LOOM_INLINE std::vector<transfer> all_transfers(const pipeline_shape& p) {
    std::vector<transfer> out;
    for (const dependency& d : dependencies(p))
        for (const transfer& t : transfers_of(p, d)) out.push_back(t);
    return out;
}

}  // namespace loom::schedule
#endif  // LOOM_HEADER_DEFINITIONS
