#pragma once
// An event-driven run of a schedule under a cost model: each device runs its order in
// sequence; a block starts when all of its devices have finished what comes before it and
// its inputs have arrived (the producer's end, plus the model's latency when the dependency
// crosses devices).
//
//   simulation r = simulate(one_f_one_b(4, 8), cost_model{.forward = 1, .backward = 2});
//   r.makespan, r.bubble_fraction, r.at(backward_block(0, 7)).end, r.peak_in_flight_per_stage
//
//   simulate(s, cost_model{.forward_per_stage = f, .backward_per_stage = b, .latency = message},
//            {.validated = true, .makespan_only = true}).makespan
//                    for a caller that times a template's orders many times over (with
//                    per-stage or per-chunk block times and a message time between
//                    devices): neither validated again nor recorded
//
// Quantities, with busy_d the time device d computes and idle_d = makespan - busy_d:
//   bubble_fraction  sum idle_d / (devices * makespan): the share of device time that is
//                    bubble. GPipe and 1F1B with uniform costs: (p - 1) / (m + p - 1).
//   bubble_overhead  sum idle_d / sum busy_d: bubble time per unit of work, Megatron's
//                    "bubble time fraction". 1F1B: (p - 1) / m; interleaved with v chunks
//                    per device (each 1/v of a stage): (p - 1) / (v m).
//   peak in flight   in_flight.hpp, from the orders (the same as from the timeline, since a
//                    device holds activations from a forward's start to its backward's end).
#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/linkage.hpp>
#include <loom/schedule/costs.hpp>
#include <loom/schedule/in_flight.hpp>
#include <loom/schedule/schedule.hpp>
#include <loom/schedule/validate.hpp>

namespace loom::schedule {

struct timed_block {
    block what;
    std::vector<int> devices;
    double start = 0.0;
    double end = 0.0;
};

struct simulation {
    schedule source;
    std::vector<timed_block> blocks;  // in block_index order
    std::vector<double> busy;         // per device
    std::vector<double> idle;         // per device, over [0, makespan]
    double makespan = 0.0;
    double bubble_fraction = 0.0;
    double bubble_overhead = 0.0;
    std::vector<int> peak_in_flight_per_stage;
    std::vector<int> peak_in_flight_per_device;

    const timed_block& at(const block& b) const {
        if (!contains(source.shape, b))
            throw usage_error("simulation::at: " + why_not_contained(source.shape, b));
        return blocks[static_cast<std::size_t>(block_index(source.shape, b))];
    }
    double total_idle() const {
        double sum = 0.0;
        for (double x : idle) sum += x;
        return sum;
    }
    double total_busy() const {
        double sum = 0.0;
        for (double x : busy) sum += x;
        return sum;
    }
};

// What simulate records and checks.
struct simulate_options {
    // The schedule is known to pass validate(): a template built it, or it was validated once
    // and is timed again and again (the plan searcher times each order under many costs).
    // Skips validation; orders that list a block outside the shape or twice, or that
    // deadlock, still throw.
    bool validated = false;
    // Only the makespan: no per-block times, busy and idle times, bubbles or peaks in flight
    // (the rest of the simulation is left empty).
    bool makespan_only = false;
};

// Validates the schedule first (throws schedule_error) unless options.validated, then plays
// it: a block starts when each of its devices is free and each input has arrived there (the
// producer's end, or the time its output is ready (costs.ready), plus costs.latency on a
// device that did not run the producer).
LOOM_INLINE simulation simulate(const schedule& s, const cost_model& costs = {}, const simulate_options& options = {});

}  // namespace loom::schedule

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::schedule {

LOOM_INLINE simulation simulate(const schedule& s, const cost_model& costs, const simulate_options& options) {
    if (!options.validated) validate(s);
    const auto& p = s.shape;
    const auto where = [&] { return "simulate('" + s.name + "')"; };
    if (s.device_order.size() != static_cast<std::size_t>(p.devices))
        throw schedule_error(where() + ": the schedule orders " + std::to_string(s.device_order.size()) +
                             " devices but its shape has " + std::to_string(p.devices) + "; validate() names the fix");
    const auto count = static_cast<std::size_t>(block_count(p));
    const auto stages = static_cast<std::size_t>(p.stages);
    // Per stage: its device when it has one (-1: several), and its block times unless the
    // cost model times each block itself.
    std::vector<int> stage_device(stages, -1);
    for (std::size_t st = 0; st < stages; ++st)
        if (p.stage_devices[st].size() == 1) stage_device[st] = p.stage_devices[st].front();
    const auto check_time = [](const block& b, double t) {
        if (!(t >= 0.0))
            throw usage_error("simulate: the cost model gives " + to_string(b) + " the time " + std::to_string(t) +
                              "; times must be zero or more");
        return t;
    };
    std::vector<double> forward_time, backward_time;
    if (!costs.duration)
        for (int st = 0; st < p.stages; ++st) {
            forward_time.push_back(check_time(forward_block(st, 0), costs.of(forward_block(st, 0))));
            backward_time.push_back(check_time(backward_block(st, 0), costs.of(backward_block(st, 0))));
        }
    const double never = -1.0;  // the end of a block not yet played (every time is >= 0)
    std::vector<double> end(count, never), ready_at(count, never);
    std::vector<double> start(options.makespan_only ? 0 : count, 0.0);
    std::vector<std::size_t> next(static_cast<std::size_t>(p.devices), 0);
    std::vector<double> free(static_cast<std::size_t>(p.devices), 0.0);
    std::vector<double> busy(static_cast<std::size_t>(p.devices), 0.0);
    double makespan = 0.0;
    std::size_t placed = 0;
    // Each pass plays, device by device, every next block whose stage's devices all have it
    // next and whose inputs have ended. The order of play changes no time.
    while (placed < count) {
        bool progress = false;
        for (std::size_t d = 0; d < s.device_order.size(); ++d) {
            const auto& order = s.device_order[d];
            while (next[d] < order.size()) {
                const block& b = order[next[d]];
                if (!contains(p, b))
                    throw schedule_error(where() + ": " + why_not_contained(p, b) + "; validate() names the fix");
                // `alone`: the stage runs on device d only (the common case, timed without loops).
                const bool alone = stage_device[static_cast<std::size_t>(b.stage)] == static_cast<int>(d);
                const auto& group = p.stage_devices[static_cast<std::size_t>(b.stage)];
                bool at_head = true;
                if (!alone)  // a stage on several devices (or listed on a device that does not run it)
                    for (int g : group) {
                        const auto& other = s.device_order[static_cast<std::size_t>(g)];
                        const std::size_t i = next[static_cast<std::size_t>(g)];
                        at_head = at_head && i < other.size() && other[i] == b;
                    }
                if (!at_head) break;
                const auto index = static_cast<std::size_t>(block_index(p, b));
                if (end[index] != never)
                    throw schedule_error(where() + ": " + to_string(b, p.rounds) +
                                         " is listed twice; validate() names the fix");
                double at = alone ? free[d] : 0.0;
                bool ready = true;
                for_each_input(p, b, [&](const dependency& dep) {
                    const double e = ready_at[static_cast<std::size_t>(block_index(p, dep.producer))];
                    if (e == never) ready = false;
                    const int source = stage_device[static_cast<std::size_t>(dep.producer.stage)];
                    if (alone)
                        at = std::max(at, (source >= 0 ? source == static_cast<int>(d)
                                                       : p.runs_on(dep.producer.stage, static_cast<int>(d)))
                                              ? e
                                              : e + costs.latency);
                    else
                        for (int g : group) at = std::max(at, e + (p.runs_on(dep.producer.stage, g) ? 0.0 : costs.latency));
                });
                if (!ready) break;
                if (!alone)
                    for (int g : group) at = std::max(at, free[static_cast<std::size_t>(g)]);
                const double duration = costs.duration ? check_time(b, costs.duration(b))
                                        : is_forward(b)  ? forward_time[static_cast<std::size_t>(b.stage)]
                                                         : backward_time[static_cast<std::size_t>(b.stage)];
                end[index] = at + duration;
                ready_at[index] = costs.ready ? at + std::min(duration, check_time(b, costs.ready(b))) : end[index];
                if (!options.makespan_only) start[index] = at;
                if (alone) {
                    free[d] = at + duration;
                    busy[d] += duration;
                    ++next[d];
                } else {
                    for (int g : group) {
                        free[static_cast<std::size_t>(g)] = at + duration;
                        busy[static_cast<std::size_t>(g)] += duration;
                        ++next[static_cast<std::size_t>(g)];
                    }
                }
                makespan = std::max(makespan, at + duration);
                ++placed;
                progress = true;
            }
        }
        if (!progress)
            throw schedule_error(where() + ": no device can run its next block" +
                                 (options.validated ? std::string("; the orders deadlock or leave blocks out (validate() "
                                                                  "names the blocks and the fix)")
                                                    : std::string("; validate() should have reported a deadlock (this "
                                                                  "is a bug)")));
    }
    for (std::size_t d = 0; d < s.device_order.size(); ++d)
        if (next[d] != s.device_order[d].size())
            throw schedule_error(where() + ": device " + std::to_string(d) + " lists " +
                                 to_string(s.device_order[d][next[d]], p.rounds) +
                                 " after every block has run (a block twice?); validate() names the fix");

    simulation r;
    r.makespan = makespan;
    if (options.makespan_only) return r;
    r.source = s;
    r.blocks.resize(count);
    for (std::size_t i = 0; i < count; ++i) {
        const block b = block_at(p, static_cast<int>(i));
        r.blocks[i] = {b, p.devices_of(b.stage), start[i], end[i]};
    }
    r.busy = std::move(busy);
    r.idle.resize(r.busy.size());
    for (std::size_t d = 0; d < r.busy.size(); ++d) r.idle[d] = r.makespan - r.busy[d];
    if (r.makespan > 0.0) r.bubble_fraction = r.total_idle() / (p.devices * r.makespan);
    if (r.total_busy() > 0.0) r.bubble_overhead = r.total_idle() / r.total_busy();
    const auto peaks = peak_in_flight(s);
    r.peak_in_flight_per_stage = peaks.per_stage;
    r.peak_in_flight_per_device = peaks.per_device;
    return r;
}

}  // namespace loom::schedule
#endif  // LOOM_HEADER_DEFINITIONS
