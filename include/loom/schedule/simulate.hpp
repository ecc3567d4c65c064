#pragma once
// An event-driven run of a schedule under a cost model: each device runs its order in
// sequence; a block starts when all of its devices have finished what comes before it and
// its inputs have arrived (the producer's end, plus the model's latency when the dependency
// crosses devices).
//
//   simulation r = simulate(one_f_one_b(4, 8), cost_model{.forward = 1, .backward = 2});
//   r.makespan, r.bubble_fraction, r.at(backward_block(0, 7)).end, r.peak_in_flight_per_stage
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
#include <vector>

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

// Validates the schedule first (throws schedule_error), then plays it.
inline simulation simulate(const schedule& s, const cost_model& costs = {}) {
    validate(s);
    const auto& p = s.shape;
    simulation r;
    r.source = s;
    r.blocks.resize(static_cast<std::size_t>(block_count(p)));
    std::vector<bool> done(r.blocks.size(), false);
    std::vector<std::size_t> next(static_cast<std::size_t>(p.devices), 0);
    std::vector<double> free(static_cast<std::size_t>(p.devices), 0.0);
    r.busy.assign(static_cast<std::size_t>(p.devices), 0.0);
    auto at_head = [&](const block& b) {
        for (int g : p.devices_of(b.stage)) {
            const auto& order = s.device_order[static_cast<std::size_t>(g)];
            const std::size_t i = next[static_cast<std::size_t>(g)];
            if (i >= order.size() || !(order[i] == b)) return false;
        }
        return true;
    };
    for (std::size_t placed = 0; placed < r.blocks.size();) {
        bool progress = false;
        for (int d = 0; d < p.devices; ++d) {
            const auto& order = s.device_order[static_cast<std::size_t>(d)];
            if (next[static_cast<std::size_t>(d)] >= order.size()) continue;
            const block b = order[next[static_cast<std::size_t>(d)]];
            if (!at_head(b)) continue;
            const auto inputs = inputs_of(p, b);
            bool ready = true;
            for (const dependency& dep : inputs)
                ready = ready && done[static_cast<std::size_t>(block_index(p, dep.producer))];
            if (!ready) continue;
            double start = 0.0;
            for (int g : p.devices_of(b.stage)) {
                start = std::max(start, free[static_cast<std::size_t>(g)]);
                for (const dependency& dep : inputs) {
                    const double latency = p.runs_on(dep.producer.stage, g) ? 0.0 : costs.latency;
                    start = std::max(start, r.blocks[static_cast<std::size_t>(block_index(p, dep.producer))].end + latency);
                }
            }
            const double duration = costs.of(b);
            if (!(duration >= 0.0))
                throw usage_error("simulate: the cost model gives " + to_string(b) + " the time " +
                                  std::to_string(duration) + "; times must be zero or more");
            const auto index = static_cast<std::size_t>(block_index(p, b));
            r.blocks[index] = {b, p.devices_of(b.stage), start, start + duration};
            done[index] = true;
            for (int g : p.devices_of(b.stage)) {
                free[static_cast<std::size_t>(g)] = start + duration;
                r.busy[static_cast<std::size_t>(g)] += duration;
                ++next[static_cast<std::size_t>(g)];
            }
            ++placed;
            progress = true;
        }
        if (!progress)
            throw schedule_error("simulate('" + s.name + "'): no device can run its next block; validate() should have "
                                 "reported a deadlock (this is a bug)");
    }
    for (const timed_block& t : r.blocks) r.makespan = std::max(r.makespan, t.end);
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
