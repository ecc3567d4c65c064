#pragma once
// A simulated schedule as a Chrome trace (chrome://tracing, ui.perfetto.dev): the
// "traceEvents" format, one complete event (ph "X") per block and device, one thread per
// device (pid 0, tid = device, named "device d"), times scaled from model units to
// microseconds.
//
//   std::ofstream("1f1b.json") << chrome_trace_json(simulate(one_f_one_b(4, 8)));
//
//   {"traceEvents": [
//      {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "1F1B"}},
//      {"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "device 0"}}, ...
//      {"name": "F(s0,m0)", "cat": "forward", "ph": "X", "ts": 0, "dur": 1000, "pid": 0, "tid": 0,
//       "args": {"stage": 0, "micro": 0, "round": 0}}, ...],
//    "displayTimeUnit": "ms"}
// Block events are listed by device, then start time.
#include <algorithm>
#include <cstddef>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include <loom/core/linkage.hpp>
#include <loom/schedule/simulate.hpp>

namespace loom::schedule {

LOOM_INLINE std::string chrome_trace_json(const simulation& r, double microseconds_per_unit = 1000.0);

}  // namespace loom::schedule

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::schedule {

LOOM_INLINE std::string chrome_trace_json(const simulation& r, double microseconds_per_unit) {
    using json = nlohmann::ordered_json;
    const auto& p = r.source.shape;
    json events = json::array();
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"tid", 0},
                      {"args", {{"name", r.source.name.empty() ? std::string("schedule") : r.source.name}}}});
    for (int d = 0; d < p.devices; ++d)
        events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", d},
                          {"args", {{"name", "device " + std::to_string(d)}}}});
    for (int d = 0; d < p.devices; ++d) {
        std::vector<const timed_block*> row;
        for (const block& b : r.source.device_order[static_cast<std::size_t>(d)]) row.push_back(&r.at(b));
        std::stable_sort(row.begin(), row.end(),
                         [](const timed_block* a, const timed_block* b) { return a->start < b->start; });
        for (const timed_block* t : row)
            events.push_back({{"name", to_string(t->what, p.rounds)},
                              {"cat", to_string(t->what.pass)},
                              {"ph", "X"},
                              {"ts", t->start * microseconds_per_unit},
                              {"dur", (t->end - t->start) * microseconds_per_unit},
                              {"pid", 0},
                              {"tid", d},
                              {"args", {{"stage", t->what.stage}, {"micro", t->what.micro}, {"round", t->what.round}}}});
    }
    json trace = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
    return trace.dump();
}

}  // namespace loom::schedule
#endif  // LOOM_HEADER_DEFINITIONS
