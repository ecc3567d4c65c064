#pragma once
// Who owns what in a partitioned plan: which parts of a replicated parameter (or gradient)
// a rank counts as its own, and which rows a rank updates under ZeRO-1/2. Every backend's
// distributed trainer asks the same questions (the gradient norm counts each element once,
// a gathered parameter takes each element from one rank, the optimizer shards replicas),
// so the answers live here, computed from the plan alone: any rank can work out any other
// rank's share.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/partition/partitioned_graph.hpp>

namespace loom::train {

// b minus c, as disjoint boxes appended to out.
LOOM_INLINE void subtract_box(const partition::box& b, const partition::box& c, std::vector<partition::box>& out);

// Parts of `region` (a piece of parameter p, or of its gradient) that `rank` counts as its
// own: the parts no lower rank holds. Pieces are equal or disjoint in every plan loom
// builds; a partial overlap is cut along the boxes.
LOOM_INLINE std::vector<partition::box> owned_regions(const partition::partitioned_graph& plan, int rank, tensor_id p,
                                                      const partition::box& region, bool gradients);

// ZeRO-1 and ZeRO-2 shard a parameter's optimizer over its data-parallel replicas: the
// ranks that store the same piece of it, in rank order (every rank for a data-parallel
// plan, the stage's group in a pipeline, both stages' groups for an embedding tied across
// stages; under tensor parallelism the data-parallel group of each tensor-parallel piece,
// as Megatron-LM's distributed optimizer shards them).
LOOM_INLINE std::vector<int> replica_ranks(const partition::partitioned_graph& plan, tensor_id p,
                                           const partition::box& piece);

// The ranks whose updates together cover `piece` of parameter p once, in rank order, `rank`
// among them: after the update they all-gather their shards into the piece. ZeRO-1: the
// piece's replicas. ZeRO-2: the replicas holding distinct gradient shards of the piece;
// where several sets of the shards exist (a layer norm that every rank of a tensor-parallel
// group reads whole has one set per such rank), the j-th holder of each shard, j being
// `rank`'s place among the holders of its own shard.
LOOM_INLINE std::vector<int> update_group(const partition::partitioned_graph& plan, int rank, tensor_id p,
                                          const partition::box& piece);

// Rows of the first dim that replica `index` of `replicas` updates under ZeRO-1 (the whole
// region when the rows do not divide evenly over the replicas).
LOOM_INLINE partition::box zero1_shard(const partition::box& region, int index, int replicas);

// The part of gradient piece `gradient` (of logical parameter p) that `rank` updates: under
// ZeRO-1 its share of the piece of p it stores among that piece's replicas. Under ZeRO-2 the
// gradient pieces are already the replicas' shards.
LOOM_INLINE partition::box update_region(const partition::partitioned_graph& plan, int rank, tensor_id p,
                                         const partition::box& gradient);

// Offset of the first element of `inner` in a piece with box `outer`, for an `inner` that is
// whole on every axis but the first (so that it is contiguous there).
LOOM_INLINE std::int64_t offset_in(const partition::box& inner, const partition::box& outer);

}  // namespace loom::train

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::train {

LOOM_INLINE void subtract_box(const partition::box& b, const partition::box& c, std::vector<partition::box>& out) {
    const partition::box common = partition::intersect(b, c);
    if (b.rank() == 0) return;  // a scalar held by a lower rank is theirs
    if (common.empty()) {
        out.push_back(b);
        return;
    }
    partition::box rest = b;
    for (std::size_t a = 0; a < b.rank(); ++a) {
        if (rest.ranges[a].begin < common.ranges[a].begin) {
            partition::box below = rest;
            below.ranges[a].end = common.ranges[a].begin;
            out.push_back(below);
        }
        if (common.ranges[a].end < rest.ranges[a].end) {
            partition::box above = rest;
            above.ranges[a].begin = common.ranges[a].end;
            out.push_back(above);
        }
        rest.ranges[a] = common.ranges[a];
    }
}

LOOM_INLINE std::vector<partition::box> owned_regions(const partition::partitioned_graph& plan, int rank, tensor_id p,
                                                      const partition::box& region, bool gradients) {
    std::vector<partition::box> mine{region};
    for (int r = 0; r < rank; ++r) {
        const auto& other = gradients ? plan.devices[static_cast<std::size_t>(r)].gradients
                                      : plan.devices[static_cast<std::size_t>(r)].parameters;
        for (const auto& s : other) {
            if (s.logical != p) continue;
            std::vector<partition::box> next;
            for (const auto& b : mine) subtract_box(b, s.region, next);
            mine = std::move(next);
        }
    }
    return mine;
}

LOOM_INLINE std::vector<int> replica_ranks(const partition::partitioned_graph& plan, tensor_id p,
                                           const partition::box& piece) {
    std::vector<int> ranks;
    for (int r = 0; r < plan.world; ++r) {
        bool stored = false;
        for (const auto& s : plan.devices[static_cast<std::size_t>(r)].parameters)
            stored = stored || (s.logical == p && s.region == piece);
        if (stored) ranks.push_back(r);
    }
    return ranks;
}

LOOM_INLINE std::vector<int> update_group(const partition::partitioned_graph& plan, int rank, tensor_id p,
                                          const partition::box& piece) {
    std::vector<int> replicas = replica_ranks(plan, p, piece);
    if (plan.zero != plan::zero_stage::gradients) return replicas;
    std::map<partition::box, std::vector<int>> holders;  // shard -> its ranks, in rank order
    const partition::box* mine = nullptr;
    for (int r : replicas)
        for (const auto& gp : plan.devices[static_cast<std::size_t>(r)].gradients)
            if (gp.logical == p && piece.contains(gp.region)) {
                auto& ranks = holders[gp.region];
                ranks.push_back(r);
                if (r == rank) mine = &gp.region;
            }
    if (!mine) return {rank};
    const std::vector<int>& own = holders[*mine];
    const auto j = static_cast<std::size_t>(std::find(own.begin(), own.end(), rank) - own.begin());
    std::vector<int> group;
    for (const auto& [shard, ranks] : holders)
        if (j < ranks.size()) group.push_back(ranks[j]);
    std::sort(group.begin(), group.end());
    return group;
}

LOOM_INLINE partition::box zero1_shard(const partition::box& region, int index, int replicas) {
    partition::box b = region;
    if (b.rank() == 0 || b.ranges[0].size() % replicas != 0) return b;
    const std::int64_t rows = b.ranges[0].size() / replicas;
    b.ranges[0].begin += rows * index;
    b.ranges[0].end = b.ranges[0].begin + rows;
    return b;
}

LOOM_INLINE partition::box update_region(const partition::partitioned_graph& plan, int rank, tensor_id p,
                                         const partition::box& gradient) {
    if (plan.zero != plan::zero_stage::optimizer) return gradient;
    const partition::box* piece = nullptr;
    for (const auto& s : plan.devices[static_cast<std::size_t>(rank)].parameters)
        if (s.logical == p && s.region.contains(gradient)) piece = &s.region;
    if (!piece) return gradient;
    const std::vector<int> replicas = replica_ranks(plan, p, *piece);
    const auto at = std::find(replicas.begin(), replicas.end(), rank);
    if (replicas.size() < 2 || at == replicas.end()) return gradient;
    return zero1_shard(gradient, static_cast<int>(at - replicas.begin()), static_cast<int>(replicas.size()));
}

LOOM_INLINE std::int64_t offset_in(const partition::box& inner, const partition::box& outer) {
    if (inner.rank() == 0) return 0;
    for (std::size_t a = 1; a < inner.rank(); ++a)
        if (!(inner.ranges[a] == outer.ranges[a]))
            throw error("distributed training: the updated part " + inner.to_string() + " of piece " +
                        outer.to_string() + " is not contiguous; shard parameters along their first dim");
    std::int64_t row = 1;
    for (std::size_t a = 1; a < outer.rank(); ++a) row *= outer.ranges[a].size();
    return (inner.ranges[0].begin - outer.ranges[0].begin) * row;
}

}  // namespace loom::train
#endif  // LOOM_HEADER_DEFINITIONS
