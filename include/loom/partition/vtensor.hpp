#pragma once
// pTensor and vTensor: a logical tensor of the model graph (the pTensor, named by its
// tensor_id) and one piece of it that a device holds or needs (the vTensor).
//
// A vTensor is a box (a half-open index range per axis of the logical tensor) and a value
// chunk "i of n": the piece holds chunk i of a sum of n parts. A full value is chunk 0 of
// 1; an op split along a contracted dim produces chunks 0..n-1 of n, whose sum is the
// value. Two vTensors of one pTensor depend on each other where their boxes intersect;
// a consumer always needs full values, so partial chunks must be summed on the way.
//
// vtensor_pool interns vTensors so that a plan refers to each distinct piece once and
// compares pieces by id.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/core/shape.hpp>
#include <loom/graph/graph.hpp>

namespace loom::partition {

struct index_range {
    std::int64_t begin = 0;
    std::int64_t end = 0;

    std::int64_t size() const { return end - begin; }
    bool empty() const { return end <= begin; }
    bool contains(const index_range& o) const { return begin <= o.begin && o.end <= end; }
    friend bool operator==(const index_range&, const index_range&) = default;
    friend auto operator<=>(const index_range&, const index_range&) = default;
};

// A box in the index space of one logical tensor (rank 0: the empty box of a scalar).
struct box {
    std::vector<index_range> ranges;

    static box whole(const shape& s) {
        box b;
        for (const auto& a : s) b.ranges.push_back({0, a.extent});
        return b;
    }
    std::size_t rank() const { return ranges.size(); }
    std::int64_t numel() const {
        std::int64_t n = 1;
        for (const auto& r : ranges) n *= std::max<std::int64_t>(r.size(), 0);
        return n;
    }
    bool empty() const {
        return std::any_of(ranges.begin(), ranges.end(), [](const index_range& r) { return r.empty(); });
    }
    bool contains(const box& o) const {
        for (std::size_t a = 0; a < ranges.size(); ++a)
            if (!ranges[a].contains(o.ranges[a])) return false;
        return true;
    }
    // The shape of a piece with this box: the logical shape's dims with the box's extents.
    shape shape_of(const shape& logical) const {
        std::vector<axis> axes;
        for (std::size_t a = 0; a < ranges.size(); ++a) axes.push_back({logical.dim(a), ranges[a].size()});
        return shape(std::move(axes));
    }
    std::string to_string() const {
        std::string s = "[";
        for (std::size_t a = 0; a < ranges.size(); ++a)
            s += (a ? ", " : "") + std::to_string(ranges[a].begin) + ":" + std::to_string(ranges[a].end);
        return s + "]";
    }
    friend bool operator==(const box&, const box&) = default;
    friend auto operator<=>(const box&, const box&) = default;
};

LOOM_INLINE box intersect(const box& a, const box& b);

inline bool overlaps(const box& a, const box& b) { return !intersect(a, b).empty() || a.rank() == 0; }

// Chunk `index` of a value split into `count` summands.
struct value_chunk {
    std::int32_t index = 0;
    std::int32_t count = 1;

    bool full() const { return count == 1; }
    friend bool operator==(const value_chunk&, const value_chunk&) = default;
    friend auto operator<=>(const value_chunk&, const value_chunk&) = default;
};

struct vtensor {
    tensor_id logical = no_id;  // the pTensor
    box region;
    value_chunk value;

    std::string to_string() const {
        std::string s = "t" + std::to_string(logical) + region.to_string();
        if (!value.full()) s += " part " + std::to_string(value.index) + "/" + std::to_string(value.count);
        return s;
    }
    friend bool operator==(const vtensor&, const vtensor&) = default;
    friend auto operator<=>(const vtensor&, const vtensor&) = default;
};

using vtensor_id = std::int32_t;

// Interns vTensors: equal pieces get one id, so plans compare pieces by integer.
class vtensor_pool {
public:
    vtensor_id intern(const vtensor& v) {
        auto [it, inserted] = ids_.try_emplace(v, static_cast<vtensor_id>(items_.size()));
        if (inserted) items_.push_back(v);
        return it->second;
    }
    const vtensor& operator[](vtensor_id id) const { return items_.at(static_cast<std::size_t>(id)); }
    std::size_t size() const { return items_.size(); }

private:
    std::map<vtensor, vtensor_id> ids_;
    std::vector<vtensor> items_;
};

}  // namespace loom::partition

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::partition {

LOOM_INLINE box intersect(const box& a, const box& b) {
    box r;
    for (std::size_t i = 0; i < a.ranges.size(); ++i)
        r.ranges.push_back({std::max(a.ranges[i].begin, b.ranges[i].begin), std::min(a.ranges[i].end, b.ranges[i].end)});
    return r;
}

}  // namespace loom::partition
#endif  // LOOM_HEADER_DEFINITIONS
