#pragma once
// The classic pipeline schedules, each written as order constraints (nnScaler's op-order with
// offsets) and built by the list scheduler (from_constraints.hpp). With S stages, stage s,
// m micro-batches, p devices, v virtual stages per device, w the warm-up forwards of a stage
// or device:
//
//   gpipe(S, m)        every forward before any backward, both in micro-batch order
//   one_f_one_b(S, m)  Table 4: forwards and backwards in micro-batch order, and
//                        F(s, i + w) before B(s, i), B(s, i) before F(s, i + w + 1), w = S - s - 1
//                      (the paper's ofst = |D| - i with stages counted from 1)
//   interleaved_one_f_one_b(p, v, m)
//                      the same four constraints per device over its blocks in Megatron's
//                      order (p micro-batches through one chunk at a time, chunks ascending for
//                      forwards and descending for backwards), w = 2(p - d - 1) + (v - 1) p
//                      (w = p - d - 1 when v = 1: plain 1F1B); m must be a multiple of p
//   three_f_one_b(S, m)
//                      Table 7 (AlphaFold2's recycling: three forward rounds, one backward):
//                        F0(s, i+2) before F1(s, i+1), F1(s, i+1) before F2(s, i) (for every
//                        i >= 0; the paper writes i > 0 for the second, i = 0 changes nothing),
//                        F2(s, i + w) before B(s, i), w = S - s - 1,
//                      plus each round's forwards and the backwards in micro-batch order and
//                        B(s, i) before F0(s, i + w + 3)
//                      which closes the steady state (F0, F1, F2, B of four micro-batches);
//                      the warm-up and cool-down are left to the scheduler, as in the paper.
//                      The rounds of one micro-batch start 4f + b apart on a stage (one cycle
//                      and a forward), so the steady state has no bubble while the recycling
//                      trip through all stages fits: S f <= 4f + b (S <= 5 when b = f, S <= 6
//                      when b = 2f); deeper pipelines idle in every cycle
//   interlaced(p, m)   Figure 6: the embedding (stage 0) and the LM head (stage p + 1) on
//                      every device, the p stages between as 1F1B (w = p - k for stage k);
//                      the embedding forward of micro-batch i + 1 waits for the first stage's
//                      forward of i, and the rest of the time sharing is the scheduler's
//                      (ties go to the SPMD blocks, so with f = b they run when every device
//                      is free and the steady state has no bubble; with b != f the greedy
//                      leaves some per micro-batch, which a search could remove)
//
// Each has a *_constraints() (the family, independent of sizes), a *_spec(...) (shape and
// constraints: what the executor needs to rebuild it) and a builder returning the schedule:
// from_constraints(spec), except for GPipe, 1F1B and interleaved 1F1B, whose constraints fix
// each device's order and whose builders write that order out in linear time.
// The builders check their arguments with the predicates of checks.hpp; the plan's order part
// (plan/pipeline_parts.hpp) checks stages and micro-batches at compile time.
#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/linkage.hpp>
#include <loom/schedule/checks.hpp>
#include <loom/schedule/constraints.hpp>
#include <loom/schedule/costs.hpp>
#include <loom/schedule/from_constraints.hpp>
#include <loom/schedule/schedule.hpp>

namespace loom::schedule {

// Per stage: each round's forwards in micro-batch order, and the backwards too (Table 4 (1), (2)).
LOOM_INLINE std::vector<before> micro_order_constraints(int rounds = 1);

LOOM_INLINE std::vector<before> gpipe_constraints();

LOOM_INLINE std::vector<before> one_f_one_b_constraints();

// Per device d over its blocks in by_micro_group order; `chunks` is v.
LOOM_INLINE std::vector<before> interleaved_constraints(int chunks);

// Table 7, for `rounds` forward rounds (3F1B: 3).
LOOM_INLINE std::vector<before> recycling_constraints(int rounds = 3);

// Stages 0 (embedding) and S-1 (LM head) on every device; stages 1..S-2 a 1F1B pipeline.
LOOM_INLINE std::vector<before> interlaced_constraints();

// ---- specs and builders ----------------------------------------------------------------------

namespace detail {

inline void check_policy(policy_kind kind, const std::string& spelling, int stages, int chunks, int micro_batches,
                         int rounds = 1) {
    const policy_view v{kind, spelling, stages, chunks, rounds, true, micro_batches, {}};
    if (text e = first_policy_error(v); !e.empty()) throw schedule_error(e.str());
}

LOOM_INLINE std::string call_text(const char* function, std::initializer_list<int> args);

}  // namespace detail

inline schedule_spec gpipe_spec(int stages, int micro_batches) {
    detail::check_policy(detail::policy_kind::gpipe, detail::call_text("gpipe", {stages, micro_batches}), stages, 1,
                         micro_batches);
    return {"GPipe", pipeline_shape::linear(stages, micro_batches), gpipe_constraints()};
}

inline schedule_spec one_f_one_b_spec(int stages, int micro_batches) {
    detail::check_policy(detail::policy_kind::one_f_one_b, detail::call_text("one_f_one_b", {stages, micro_batches}),
                         stages, 1, micro_batches);
    return {"1F1B", pipeline_shape::linear(stages, micro_batches), one_f_one_b_constraints()};
}

LOOM_INLINE schedule_spec interleaved_spec(int devices, int chunks, int micro_batches);

inline schedule_spec three_f_one_b_spec(int stages, int micro_batches) {
    detail::check_policy(detail::policy_kind::three_f_one_b, detail::call_text("three_f_one_b", {stages, micro_batches}),
                         stages, 1, micro_batches, 3);
    return {"3F1B", pipeline_shape::linear(stages, micro_batches, 3), recycling_constraints(3)};
}

LOOM_INLINE schedule_spec interlaced_spec(int pipeline_stages, int micro_batches, int devices_per_stage = 1);

namespace detail {

// The device orders that the constraints of GPipe, 1F1B and interleaved 1F1B fix, written
// out in linear time. from_constraints(spec) gives the same orders (tests check it on many
// shapes), but its list scheduler grows quickly with stages x micro-batches (interleaved
// 1F1B on 8 devices with 256 micro-batches takes over a second), and the plan searcher builds
// hundreds of such schedules.

LOOM_INLINE std::vector<std::vector<block>> gpipe_device_orders(int stages, int micro_batches);

// Device r of p with v chunks (stages r, r + p, ..., r + (v - 1) p) runs forward k of the
// micro-batch (k / (p v)) p + k % p on chunk (k / p) % v, backward k on the same micro-batch
// of chunk v - 1 - (k / p) % v (Megatron's groups of p micro-batches through one chunk at a
// time); after w + 1 forwards, w = 2 (p - r - 1) + (v - 1) p (v > 1) or p - r - 1 (v = 1, plain
// 1F1B), a backward and a forward alternate until the forwards run out.
LOOM_INLINE std::vector<std::vector<block>> interleaved_device_orders(int p, int v, int m);

}  // namespace detail

// GPipe, 1F1B and interleaved 1F1B: their constraints fix every device's order whatever the
// costs, so the builders write it out directly (the costs are accepted so that every
// template is called alike; from_constraints(*_spec(...)) gives the same schedule).
inline schedule gpipe(int stages, int micro_batches, const cost_model& = {}) {
    schedule_spec spec = gpipe_spec(stages, micro_batches);
    return {std::move(spec.shape), detail::gpipe_device_orders(stages, micro_batches), std::move(spec.name)};
}
inline schedule one_f_one_b(int stages, int micro_batches, const cost_model& = {}) {
    schedule_spec spec = one_f_one_b_spec(stages, micro_batches);
    return {std::move(spec.shape), detail::interleaved_device_orders(stages, 1, micro_batches), std::move(spec.name)};
}
inline schedule interleaved_one_f_one_b(int devices, int chunks, int micro_batches, const cost_model& = {}) {
    schedule_spec spec = interleaved_spec(devices, chunks, micro_batches);
    return {std::move(spec.shape), detail::interleaved_device_orders(devices, chunks, micro_batches), std::move(spec.name)};
}
inline schedule three_f_one_b(int stages, int micro_batches, const cost_model& costs = {}) {
    return from_constraints(three_f_one_b_spec(stages, micro_batches), costs);
}
inline schedule interlaced(int pipeline_stages, int micro_batches, int devices_per_stage = 1,
                           const cost_model& costs = {}) {
    return from_constraints(interlaced_spec(pipeline_stages, micro_batches, devices_per_stage), costs);
}

}  // namespace loom::schedule

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::schedule {

LOOM_INLINE std::vector<before> micro_order_constraints(int rounds) {
    using namespace var;
    std::vector<before> c;
    for (int r = 0; r < rounds; ++r) c.push_back(before{forward(micro, r), forward(micro + 1, r)});
    c.push_back(before{backward(micro), backward(micro + 1)});
    return c;
}

LOOM_INLINE std::vector<before> gpipe_constraints() {
    using namespace var;
    auto c = micro_order_constraints();
    // the last forward before the first backward
    c.push_back(before{forward(micro + micro_batches - 1), backward(micro)});
    return c;
}

LOOM_INLINE std::vector<before> one_f_one_b_constraints() {
    using namespace var;
    auto c = micro_order_constraints();
    c.push_back(before{forward(micro + stages - stage - 1).or_last(), backward(micro)});  // (3), ofst = S - s - 1
    c.push_back(before{backward(micro), forward(micro + stages - stage)});                // (4), ofst + 1
    return c;
}

LOOM_INLINE std::vector<before> interleaved_constraints(int chunks) {
    using namespace var;
    // w = 2(p - d - 1) + (v - 1) p = stages + devices - 2 device - 2 (v > 1); p - d - 1 (v = 1)
    const affine warmup = chunks > 1 ? stages + devices - 2 * device - 2 : devices - device - 1;
    constexpr condition always{};
    constexpr auto grouped = unit_order::by_micro_group;
    return {
        before{forward(position), forward(position + 1), each_device, always, grouped},
        before{backward(position), backward(position + 1), each_device, always, grouped},
        before{forward(position + warmup).or_last(), backward(position), each_device, always, grouped},
        before{backward(position), forward(position + warmup + 1), each_device, always, grouped},
    };
}

LOOM_INLINE std::vector<before> recycling_constraints(int rounds) {
    using namespace var;
    auto c = micro_order_constraints(rounds);
    for (int r = 0; r + 1 < rounds; ++r) c.push_back(before{forward(micro + 1, r), forward(micro, r + 1)});  // (1), (2)
    c.push_back(before{forward(micro + stages - stage - 1, rounds - 1).or_last(), backward(micro)});        // (3)
    c.push_back(before{backward(micro), forward(micro + stages - stage + rounds - 1, 0)});                  // next cycle
    return c;
}

LOOM_INLINE std::vector<before> interlaced_constraints() {
    using namespace var;
    auto c = micro_order_constraints();
    const condition pipeline_stages = within(stage, 1, stages - 2);
    // stage k of the p = S - 2 pipeline stages runs w = p - k forwards ahead
    c.push_back(before{forward(micro + stages - stage - 2).or_last(), backward(micro), each_stage, pipeline_stages});
    c.push_back(before{backward(micro), forward(micro + stages - stage - 1), each_stage, pipeline_stages});
    // the embedding runs one micro-batch ahead of the first pipeline stage
    c.push_back(before{forward(micro).on_stage(1), forward(micro + 1), each_stage, within(stage, 0, 0)});
    return c;
}
}  // namespace loom::schedule

namespace loom::schedule::detail {

LOOM_INLINE std::string call_text(const char* function, std::initializer_list<int> args) {
    std::string out = std::string(function) + "(";
    bool first = true;
    for (int a : args) out += (first ? "" : ", ") + std::to_string(a), first = false;
    return out + ")";
}
}  // namespace loom::schedule::detail

namespace loom::schedule {

LOOM_INLINE schedule_spec interleaved_spec(int devices, int chunks, int micro_batches) {
    detail::check_policy(detail::policy_kind::interleaved,
                         detail::call_text("interleaved_one_f_one_b", {devices, chunks, micro_batches}), devices, chunks,
                         micro_batches);
    return {"interleaved 1F1B (" + std::to_string(chunks) + " virtual stages per device)",
            pipeline_shape::interleaved(devices, chunks, micro_batches), interleaved_constraints(chunks)};
}

LOOM_INLINE schedule_spec interlaced_spec(int pipeline_stages, int micro_batches, int devices_per_stage) {
    const std::string call = detail::call_text("interlaced", {pipeline_stages, micro_batches, devices_per_stage});
    detail::check_policy(detail::policy_kind::interlaced, call, pipeline_stages, 1, micro_batches);
    if (devices_per_stage < 1)
        throw schedule_error(call + ": " + std::to_string(devices_per_stage) +
                             " devices per stage; each pipeline stage needs at least one device");
    return {"interlaced", pipeline_shape::interlaced(pipeline_stages, micro_batches, devices_per_stage),
            interlaced_constraints()};
}
}  // namespace loom::schedule

namespace loom::schedule::detail {

LOOM_INLINE std::vector<std::vector<block>> gpipe_device_orders(int stages, int micro_batches) {
    std::vector<std::vector<block>> orders(static_cast<std::size_t>(stages));
    for (int d = 0; d < stages; ++d) {
        auto& order = orders[static_cast<std::size_t>(d)];
        order.reserve(2 * static_cast<std::size_t>(micro_batches));
        for (int i = 0; i < micro_batches; ++i) order.push_back(forward_block(d, i));
        for (int i = 0; i < micro_batches; ++i) order.push_back(backward_block(d, i));
    }
    return orders;
}

LOOM_INLINE std::vector<std::vector<block>> interleaved_device_orders(int p, int v, int m) {
    std::vector<std::vector<block>> orders(static_cast<std::size_t>(p));
    const int total = m * v;
    const auto micro = [&](int k) { return (k / (p * v)) * p + k % p; };
    for (int r = 0; r < p; ++r) {
        auto& order = orders[static_cast<std::size_t>(r)];
        order.reserve(2 * static_cast<std::size_t>(total));
        const auto forward = [&](int k) { return forward_block(((k / p) % v) * p + r, micro(k)); };
        const auto backward = [&](int k) { return backward_block((v - 1 - (k / p) % v) * p + r, micro(k)); };
        const int w = v > 1 ? 2 * (p - r - 1) + (v - 1) * p : p - r - 1;
        int f = 0, b = 0;
        for (; f < std::min(w + 1, total); ++f) order.push_back(forward(f));
        while (b < total) {
            order.push_back(backward(b++));
            if (f < total) order.push_back(forward(f++));
        }
    }
    return orders;
}

}  // namespace loom::schedule::detail
#endif  // LOOM_HEADER_DEFINITIONS
