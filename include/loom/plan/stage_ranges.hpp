#pragma once
// The ways to cut a model's layers into a pipeline's ranges, counted and numbered, so that
// stage boundaries can be an open parameter like any number of a plan: its value is the
// number of one cut, and the searcher tries them all.
//
//   stage_range_limits l = stage_range_limits::of(8, 3, 1);  // 8 layers, 3 ranges, slack 1
//   l.lo, l.hi                        each range holds 1 to 4 layers (2 or 3 is even, +-1)
//   count_stage_ranges(8, 3, 1)       how many cuts: 15
//   stage_range_starts(8, 3, 1, k)    cut number k: the first layer of every range
//   stage_range_index(8, 3, 1, starts) the number of that cut
//
// Numbering is lexicographic in the ranges' sizes, smallest first sizes first: cut 0 of
// 8 layers into 3 ranges at slack 1 is 1 + 3 + 4 layers (starts 0, 1, 4). Counts saturate
// at count_limit, far past anything a search could try.
#include <cstdint>
#include <string>
#include <vector>

#include <loom/core/error.hpp>

namespace loom::plan {

// What each range may hold: the even cut's sizes (layers / ranges, rounded down and up)
// widened by `slack` layers each way; a negative slack allows any size from 1.
struct stage_range_limits {
    std::int64_t lo = 1;
    std::int64_t hi = 1;

    static stage_range_limits of(std::int64_t layers, std::int64_t ranges, std::int64_t slack) {
        if (slack < 0) return {1, layers};
        const std::int64_t floor = layers / ranges, ceil = (layers + ranges - 1) / ranges;
        return {floor - slack < 1 ? 1 : floor - slack, ceil + slack};
    }
};

inline constexpr std::int64_t count_limit = std::int64_t{1} << 62;

namespace detail {

// ways[k][n]: the cuts of n layers into k ranges of lo..hi layers each, saturating.
inline std::vector<std::vector<std::int64_t>> range_cut_table(std::int64_t layers, std::int64_t ranges,
                                                              stage_range_limits l) {
    std::vector<std::vector<std::int64_t>> ways(static_cast<std::size_t>(ranges) + 1,
                                                std::vector<std::int64_t>(static_cast<std::size_t>(layers) + 1, 0));
    ways[0][0] = 1;
    for (std::int64_t k = 1; k <= ranges; ++k)
        for (std::int64_t n = 0; n <= layers; ++n) {
            std::int64_t sum = 0;
            for (std::int64_t s = l.lo; s <= l.hi && s <= n; ++s) {
                sum += ways[static_cast<std::size_t>(k - 1)][static_cast<std::size_t>(n - s)];
                if (sum >= count_limit) {
                    sum = count_limit;
                    break;
                }
            }
            ways[static_cast<std::size_t>(k)][static_cast<std::size_t>(n)] = sum;
        }
    return ways;
}

inline void check_range_arguments(std::int64_t layers, std::int64_t ranges) {
    if (layers < 1 || ranges < 1)
        throw plan_error("plan: cutting " + std::to_string(layers) + " layers into " + std::to_string(ranges) +
                         " stage ranges; both must be at least 1");
}

}  // namespace detail

// How many ways there are to cut `layers` layers into `ranges` ranges within the slack
// (0 when none: more ranges than layers, or a slack too tight to sum to the layers).
inline std::int64_t count_stage_ranges(std::int64_t layers, std::int64_t ranges, std::int64_t slack) {
    detail::check_range_arguments(layers, ranges);
    return detail::range_cut_table(layers, ranges, stage_range_limits::of(layers, ranges, slack))
        [static_cast<std::size_t>(ranges)][static_cast<std::size_t>(layers)];
}

// Cut number `index` (0 <= index < count_stage_ranges(...)): the first layer of every range.
inline std::vector<std::int64_t> stage_range_starts(std::int64_t layers, std::int64_t ranges, std::int64_t slack,
                                                    std::int64_t index) {
    detail::check_range_arguments(layers, ranges);
    const stage_range_limits l = stage_range_limits::of(layers, ranges, slack);
    const auto ways = detail::range_cut_table(layers, ranges, l);
    const std::int64_t count = ways[static_cast<std::size_t>(ranges)][static_cast<std::size_t>(layers)];
    if (index < 0 || index >= count)
        throw plan_error("plan: stage cut number " + std::to_string(index) + " of " + std::to_string(layers) +
                         " layers into " + std::to_string(ranges) + " ranges" +
                         (slack < 0 ? std::string() : " within " + std::to_string(slack) + " layers of even") +
                         " does not exist: there are " + std::to_string(count) + (count ? " (0.." + std::to_string(count - 1) + ")" : "") +
                         "; choose one of them" + (count ? "" : ", fewer ranges or a wider slack"));
    std::vector<std::int64_t> starts;
    std::int64_t first = 0, left = layers;
    for (std::int64_t k = ranges; k >= 1; --k) {
        starts.push_back(first);
        for (std::int64_t s = l.lo; s <= l.hi && s <= left; ++s) {
            const std::int64_t after = ways[static_cast<std::size_t>(k - 1)][static_cast<std::size_t>(left - s)];
            if (index < after) {
                first += s;
                left -= s;
                break;
            }
            index -= after;
        }
    }
    return starts;
}

// The number of the cut whose ranges start at `starts` (the inverse of stage_range_starts).
// Throws plan_error when it is not a cut within the slack.
inline std::int64_t stage_range_index(std::int64_t layers, std::int64_t ranges, std::int64_t slack,
                                      const std::vector<std::int64_t>& starts) {
    detail::check_range_arguments(layers, ranges);
    const stage_range_limits l = stage_range_limits::of(layers, ranges, slack);
    const auto ways = detail::range_cut_table(layers, ranges, l);
    auto refuse = [&] {
        return plan_error("plan: the stage ranges starting at the given layers are not a cut of " + std::to_string(layers) +
                          " layers into " + std::to_string(ranges) + " ranges of " + std::to_string(l.lo) + " to " +
                          std::to_string(l.hi) + " layers");
    };
    if (static_cast<std::int64_t>(starts.size()) != ranges || starts.front() != 0) throw refuse();
    std::int64_t index = 0, left = layers;
    for (std::int64_t k = ranges; k >= 1; --k) {
        const std::size_t r = static_cast<std::size_t>(ranges - k);
        const std::int64_t size = (r + 1 < starts.size() ? starts[r + 1] : layers) - starts[r];
        if (size < l.lo || size > l.hi || size > left) throw refuse();
        for (std::int64_t s = l.lo; s < size; ++s)
            if (s <= left) index += ways[static_cast<std::size_t>(k - 1)][static_cast<std::size_t>(left - s)];
        left -= size;
    }
    if (left != 0) throw refuse();
    return index;
}

// The even cut (what plan::stages makes without boundaries): the first layers % ranges
// ranges hold one layer more.
inline std::vector<std::int64_t> even_stage_starts(std::int64_t layers, std::int64_t ranges) {
    std::vector<std::int64_t> starts;
    for (std::int64_t k = 0, next = 0; k < ranges; ++k) {
        starts.push_back(next);
        next += layers / ranges + (k < layers % ranges ? 1 : 0);
    }
    return starts;
}

}  // namespace loom::plan
