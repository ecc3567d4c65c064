#pragma once
// The shape of a pipeline: how many stages, micro-batches and forward rounds, which devices
// run each stage, and the data dependencies between blocks that follow from it.
//
//   pipeline_shape::linear(4, 8)           stage s on device s (GPipe, 1F1B)
//   pipeline_shape::linear(4, 8, 3)        three forward rounds per micro-batch (3F1B recycling)
//   pipeline_shape::interleaved(4, 2, 8)   8 virtual stages, stage s on device s % 4
//   pipeline_shape::interlaced(4, 8)       6 stages: the embedding (stage 0) on all 4 devices,
//                                          stages 1..4 on devices 0..3, the LM head (stage 5,
//                                          the same embedding table) on all 4 devices again
//
// A stage on several devices is one SPMD block per micro-batch: it appears in the order of
// each of those devices and starts when all of them reach it (its own collectives, e.g. the
// all-reduce of a tensor-parallel embedding, are inside the block; its output is complete on
// each of its devices when it ends).
//
// Data dependencies, for S stages, R rounds, micro-batch m (every other pair is independent):
//   activation        F(r, s-1, m)  -> F(r, s, m)         s > 0
//   recycle           F(r-1, S-1, m) -> F(r, 0, m)        r > 0 (the output of the last stage
//                                                         feeds the next round's first stage)
//   loss              F(R-1, S-1, m) -> B(S-1, m)
//   gradient          B(s+1, m)     -> B(s, m)           s < S-1
//   saved_activation  F(R-1, s, m)  -> B(s, m)           s < S-1 (the activations it differentiates)
// The interlaced pipeline is a plain chain too: its embedding and LM head are stages 0 and S-1
// that happen to run on the same devices. Tying their weights adds no dependency within a
// batch (both gradients accumulate into one buffer, read after the schedule ends).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <loom/core/linkage.hpp>
#include <loom/schedule/block.hpp>

namespace loom::schedule {

struct pipeline_shape {
    int stages = 1;
    int micro_batches = 1;
    int rounds = 1;
    std::vector<std::vector<int>> stage_devices;  // stage s runs on stage_devices[s]
    int devices = 1;

    // Stage s on device s.
    static pipeline_shape linear(int stages, int micro_batches, int rounds = 1) {
        pipeline_shape p{stages, micro_batches, rounds, {}, stages};
        for (int s = 0; s < stages; ++s) p.stage_devices.push_back({s});
        return p;
    }
    // devices * chunks virtual stages; stage s on device s % devices (interleaved 1F1B).
    static pipeline_shape interleaved(int devices, int chunks, int micro_batches) {
        pipeline_shape p{devices * chunks, micro_batches, 1, {}, devices};
        for (int s = 0; s < devices * chunks; ++s) p.stage_devices.push_back({devices > 0 ? s % devices : 0});
        return p;
    }
    // The interlaced pipeline (nnScaler, Figure 6): pipeline_stages stages of devices_per_stage
    // devices each, between an embedding stage and an LM head stage on every device.
    static pipeline_shape interlaced(int pipeline_stages, int micro_batches, int devices_per_stage = 1) {
        const int devices = pipeline_stages * devices_per_stage;
        pipeline_shape p{pipeline_stages + 2, micro_batches, 1, {}, devices};
        std::vector<int> all;
        for (int d = 0; d < devices; ++d) all.push_back(d);
        p.stage_devices.push_back(all);
        for (int s = 0; s < pipeline_stages; ++s) {
            std::vector<int> group;
            for (int k = 0; k < devices_per_stage; ++k) group.push_back(s * devices_per_stage + k);
            p.stage_devices.push_back(group);
        }
        p.stage_devices.push_back(all);
        return p;
    }

    const std::vector<int>& devices_of(int stage) const { return stage_devices.at(static_cast<std::size_t>(stage)); }
    bool runs_on(int stage, int device) const {
        const auto& g = devices_of(stage);
        return std::find(g.begin(), g.end(), device) != g.end();
    }
    // Stages per device when every device runs the same number (interleaved: its chunks).
    int chunks() const { return devices > 0 ? stages / devices : 0; }
};

// Throws schedule_error naming the first field that makes no pipeline.
LOOM_INLINE void check_shape(const pipeline_shape& p, const std::string& where = "pipeline_shape");

// ---- blocks of a shape -----------------------------------------------------------------------

// Is b one of the shape's blocks (stage, micro-batch and round in range; a backward has round 0)?
inline bool contains(const pipeline_shape& p, const block& b) {
    if (b.stage < 0 || b.stage >= p.stages || b.micro < 0 || b.micro >= p.micro_batches) return false;
    return is_forward(b) ? b.round >= 0 && b.round < p.rounds : b.round == 0;
}

// Why b is not one of the shape's blocks, or "" when it is.
LOOM_INLINE std::string why_not_contained(const pipeline_shape& p, const block& b);

// Dense numbering of the shape's blocks: forwards by (round, stage, micro), then backwards.
inline int block_count(const pipeline_shape& p) { return (p.rounds + 1) * p.stages * p.micro_batches; }

inline int block_index(const pipeline_shape& p, const block& b) {
    const int r = is_forward(b) ? b.round : p.rounds;
    return (r * p.stages + b.stage) * p.micro_batches + b.micro;
}

LOOM_INLINE block block_at(const pipeline_shape& p, int index);

// Every block, in block_index order.
LOOM_INLINE std::vector<block> all_blocks(const pipeline_shape& p);

// The blocks device d runs, in block_index order.
LOOM_INLINE std::vector<block> blocks_on(const pipeline_shape& p, int device);

// ---- data dependencies -----------------------------------------------------------------------

enum class dependency_kind : std::uint8_t { activation, recycle, loss, gradient, saved_activation };

LOOM_INLINE std::string to_string(dependency_kind k);

struct dependency {
    block producer;
    block consumer;
    dependency_kind kind = dependency_kind::activation;

    friend bool operator==(const dependency&, const dependency&) = default;
};

// Calls f(dependency) for each input of b (b must be one of the shape's blocks), without
// allocating: the simulator runs it for every block it plays.
template <class F>
void for_each_input(const pipeline_shape& p, const block& b, F&& f) {
    const int last_stage = p.stages - 1, last_round = p.rounds - 1;
    if (is_forward(b)) {
        if (b.stage > 0)
            f(dependency{forward_block(b.stage - 1, b.micro, b.round), b, dependency_kind::activation});
        else if (b.round > 0)
            f(dependency{forward_block(last_stage, b.micro, b.round - 1), b, dependency_kind::recycle});
    } else if (b.stage == last_stage) {
        f(dependency{forward_block(last_stage, b.micro, last_round), b, dependency_kind::loss});
    } else {
        f(dependency{backward_block(b.stage + 1, b.micro), b, dependency_kind::gradient});
        f(dependency{forward_block(b.stage, b.micro, last_round), b, dependency_kind::saved_activation});
    }
}

// What b reads (b must be one of the shape's blocks).
inline std::vector<dependency> inputs_of(const pipeline_shape& p, const block& b) {
    std::vector<dependency> in;
    for_each_input(p, b, [&](const dependency& d) { in.push_back(d); });
    return in;
}

// Every dependency of the shape, by consumer in block_index order.
LOOM_INLINE std::vector<dependency> dependencies(const pipeline_shape& p);

// Does this block hold activations until its backward (a forward of the last round)?
inline bool holds_activations(const pipeline_shape& p, const block& b) { return is_forward(b) && b.round == p.rounds - 1; }

}  // namespace loom::schedule

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::schedule {

LOOM_INLINE void check_shape(const pipeline_shape& p, const std::string& where) {
    auto fail = [&](const std::string& why) { throw schedule_error(where + ": " + why); };
    if (p.stages < 1) fail(std::to_string(p.stages) + " stages; a pipeline needs at least one stage");
    if (p.micro_batches < 1)
        fail(std::to_string(p.micro_batches) + " micro-batches; a pipeline needs at least one micro-batch");
    if (p.rounds < 1)
        fail(std::to_string(p.rounds) + " forward rounds; every micro-batch runs at least one forward (rounds = 1)");
    if (p.devices < 1) fail(std::to_string(p.devices) + " devices; a pipeline runs on at least one device");
    if (p.stage_devices.size() != static_cast<std::size_t>(p.stages))
        fail("stage_devices lists " + std::to_string(p.stage_devices.size()) + " stages but stages = " +
             std::to_string(p.stages) + "; give one device list per stage");
    std::vector<bool> used(static_cast<std::size_t>(p.devices), false);
    for (int s = 0; s < p.stages; ++s) {
        const auto& g = p.devices_of(s);
        if (g.empty())
            fail("stage " + std::to_string(s) + " runs on no device; list at least one in stage_devices[" +
                 std::to_string(s) + "]");
        for (std::size_t i = 0; i < g.size(); ++i) {
            if (g[i] < 0 || g[i] >= p.devices)
                fail("stage " + std::to_string(s) + " lists device " + std::to_string(g[i]) + ", outside 0.." +
                     std::to_string(p.devices - 1) + "; use a device below " + std::to_string(p.devices) +
                     " or raise devices");
            const auto end = g.begin() + static_cast<std::ptrdiff_t>(i);
            if (std::find(g.begin(), end, g[i]) != end)
                fail("stage " + std::to_string(s) + " lists device " + std::to_string(g[i]) +
                     " twice; list each device of a stage once");
            used[static_cast<std::size_t>(g[i])] = true;
        }
    }
    for (int d = 0; d < p.devices; ++d)
        if (!used[static_cast<std::size_t>(d)])
            fail("device " + std::to_string(d) + " runs no stage; give it a stage or lower devices to " +
                 std::to_string(p.devices - 1));
}

LOOM_INLINE std::string why_not_contained(const pipeline_shape& p, const block& b) {
    const std::string name = to_string(b, p.rounds);
    if (b.stage < 0 || b.stage >= p.stages)
        return name + ": stage " + std::to_string(b.stage) + " is outside 0.." + std::to_string(p.stages - 1);
    if (b.micro < 0 || b.micro >= p.micro_batches)
        return name + ": micro-batch " + std::to_string(b.micro) + " is outside 0.." + std::to_string(p.micro_batches - 1);
    if (is_backward(b) && b.round != 0)
        return name + ": a backward has no round (it follows the last forward round); write round 0";
    if (is_forward(b) && (b.round < 0 || b.round >= p.rounds))
        return name + ": forward round " + std::to_string(b.round) + " is outside 0.." + std::to_string(p.rounds - 1);
    return {};
}

LOOM_INLINE block block_at(const pipeline_shape& p, int index) {
    const int micro = index % p.micro_batches;
    const int stage = (index / p.micro_batches) % p.stages;
    const int r = index / (p.micro_batches * p.stages);
    return r == p.rounds ? backward_block(stage, micro) : forward_block(stage, micro, r);
}

LOOM_INLINE std::vector<block> all_blocks(const pipeline_shape& p) {
    std::vector<block> out;
    out.reserve(static_cast<std::size_t>(block_count(p)));
    for (int i = 0; i < block_count(p); ++i) out.push_back(block_at(p, i));
    return out;
}

LOOM_INLINE std::vector<block> blocks_on(const pipeline_shape& p, int device) {
    std::vector<block> out;
    for (const block& b : all_blocks(p))
        if (p.runs_on(b.stage, device)) out.push_back(b);
    return out;
}

LOOM_INLINE std::string to_string(dependency_kind k) {
    switch (k) {
        case dependency_kind::activation: return "activation";
        case dependency_kind::recycle: return "recycled output";
        case dependency_kind::loss: return "loss";
        case dependency_kind::gradient: return "gradient";
        case dependency_kind::saved_activation: return "saved activations";
    }
    return "?";
}

LOOM_INLINE std::vector<dependency> dependencies(const pipeline_shape& p) {
    std::vector<dependency> out;
    for (const block& b : all_blocks(p))
        for (const dependency& d : inputs_of(p, b)) out.push_back(d);
    return out;
}

}  // namespace loom::schedule
#endif  // LOOM_HEADER_DEFINITIONS
