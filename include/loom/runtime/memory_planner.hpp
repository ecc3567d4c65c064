#pragma once
// Liveness-based buffer reuse. Each buffer lives from the step that writes it to the last
// step that reads it; buffers whose lifetimes do not overlap may share bytes. Offsets are
// chosen best-fit from a free list, largest buffers placed first in each step so that the
// peak stays close to the true lower bound max_t(sum of live sizes).
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <vector>

#include <loom/core/linkage.hpp>

namespace loom {

struct buffer_lifetime {
    std::int64_t bytes = 0;
    std::int64_t first = 0;  // step that writes it
    std::int64_t last = 0;   // last step that reads it (>= first)
};

struct memory_plan {
    std::vector<std::int64_t> offsets;  // per request
    std::int64_t peak = 0;              // arena size
    std::int64_t lower_bound = 0;       // max over steps of live bytes: no plan can do better
    std::int64_t unplanned = 0;         // sum of all sizes
};

LOOM_INLINE memory_plan plan_memory(const std::vector<buffer_lifetime>& requests, std::int64_t alignment = 64);

}  // namespace loom

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom {

LOOM_INLINE memory_plan plan_memory(const std::vector<buffer_lifetime>& requests, std::int64_t alignment) {
    memory_plan plan;
    plan.offsets.assign(requests.size(), 0);
    auto align = [&](std::int64_t b) { return (b + alignment - 1) / alignment * alignment; };

    std::int64_t steps = 0;
    for (const auto& r : requests) {
        steps = std::max(steps, r.last + 1);
        plan.unplanned += align(r.bytes);
    }
    std::vector<std::vector<std::size_t>> born(static_cast<std::size_t>(steps)), dying(static_cast<std::size_t>(steps));
    for (std::size_t i = 0; i < requests.size(); ++i) {
        born[static_cast<std::size_t>(requests[i].first)].push_back(i);
        dying[static_cast<std::size_t>(requests[i].last)].push_back(i);
    }

    std::map<std::int64_t, std::int64_t> free_blocks;  // offset -> size, coalesced
    std::int64_t top = 0, live = 0;
    auto release = [&](std::int64_t offset, std::int64_t size) {
        auto [it, _] = free_blocks.emplace(offset, size);
        if (auto next = std::next(it); next != free_blocks.end() && it->first + it->second == next->first) {
            it->second += next->second;
            free_blocks.erase(next);
        }
        if (it != free_blocks.begin()) {
            auto prev = std::prev(it);
            if (prev->first + prev->second == it->first) {
                prev->second += it->second;
                free_blocks.erase(it);
                it = prev;
            }
        }
        if (it->first + it->second == top) {  // give the tail back to the top
            top = it->first;
            free_blocks.erase(it);
        }
    };
    for (std::int64_t s = 0; s < steps; ++s) {
        auto& now = born[static_cast<std::size_t>(s)];
        std::sort(now.begin(), now.end(), [&](auto a, auto b) { return requests[a].bytes > requests[b].bytes; });
        for (std::size_t i : now) {
            std::int64_t size = align(requests[i].bytes);
            live += size;
            auto best = free_blocks.end();
            for (auto it = free_blocks.begin(); it != free_blocks.end(); ++it)
                if (it->second >= size && (best == free_blocks.end() || it->second < best->second)) best = it;
            if (best != free_blocks.end()) {
                plan.offsets[i] = best->first;
                std::int64_t rest = best->second - size, at = best->first + size;
                free_blocks.erase(best);
                if (rest > 0) free_blocks.emplace(at, rest);
            } else {
                plan.offsets[i] = top;
                top += size;
            }
            plan.peak = std::max(plan.peak, top);
        }
        plan.lower_bound = std::max(plan.lower_bound, live);
        // Outputs of a step and its inputs coexist during the step; release after it.
        for (std::size_t i : dying[static_cast<std::size_t>(s)]) {
            live -= align(requests[i].bytes);
            release(plan.offsets[i], align(requests[i].bytes));
        }
    }
    return plan;
}

}  // namespace loom
#endif  // LOOM_HEADER_DEFINITIONS
