#pragma once
// Where a host step's time goes: wall-clock seconds, calls and FLOPs (op_def::flops) per op
// kind, gathered by an executor that was handed one (executor::set_profile). Timing every
// kernel costs two clock reads per instruction, so a run without a profile reads none.
//
//   host::op_profile prof;
//   exec.set_profile(&prof);  exec.run();  exec.set_profile(nullptr);
//   for (const auto& e : prof.by_time()) std::cout << e.kind << ' ' << e.seconds << '\n';
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace loom::host {

struct op_profile_entry {
    std::string kind;  // the op's name ("linear", "attention_backward", ...)
    double seconds = 0;
    std::int64_t calls = 0;
    double flops = 0;
};

class op_profile {
public:
    void add(std::string_view kind, double seconds, double flops) {
        auto it = entries_.find(kind);
        if (it == entries_.end()) it = entries_.emplace(std::string(kind), op_profile_entry{std::string(kind)}).first;
        it->second.seconds += seconds;
        it->second.calls += 1;
        it->second.flops += flops;
    }

    // Entries, the most expensive first.
    std::vector<op_profile_entry> by_time() const {
        std::vector<op_profile_entry> out;
        for (const auto& [kind, e] : entries_) out.push_back(e);
        std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.seconds > b.seconds; });
        return out;
    }

    double total_seconds() const {
        double s = 0;
        for (const auto& [kind, e] : entries_) s += e.seconds;
        return s;
    }

    void clear() { entries_.clear(); }

private:
    std::map<std::string, op_profile_entry, std::less<>> entries_;
};

}  // namespace loom::host
