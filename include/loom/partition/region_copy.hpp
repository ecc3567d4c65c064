#pragma once
// Copying a box-shaped region between dense row-major pieces of one logical tensor: the
// one primitive behind local chunk, concat and sum, and behind packing and unpacking the
// buffers of collectives.
//
// A piece holds the elements of its box `piece` of the logical tensor, row-major; the
// region must lie inside both pieces. The innermost axis is contiguous in both, so the copy
// runs as rows of `region.ranges.back().size()` elements.
#include <cstdint>
#include <vector>

#include <loom/core/linkage.hpp>
#include <loom/partition/vtensor.hpp>

namespace loom::partition {

namespace detail {

// Row-major strides of a piece with box `b`.
inline std::vector<std::int64_t> strides_of(const box& b) {
    std::vector<std::int64_t> s(b.rank(), 1);
    for (std::size_t a = b.rank(); a-- > 1;) s[a - 1] = s[a] * b.ranges[a].size();
    return s;
}

}  // namespace detail

// Calls row(src_offset, dst_offset, length) for every innermost row of `region`, with
// offsets in elements into the src piece (box `src`) and dst piece (box `dst`).
template <class F>
void for_each_region_row(const box& region, const box& src, const box& dst, F&& row) {
    const std::size_t rank = region.rank();
    if (rank == 0) {
        row(std::int64_t{0}, std::int64_t{0}, std::int64_t{1});
        return;
    }
    if (region.empty()) return;
    const auto ss = detail::strides_of(src), ds = detail::strides_of(dst);
    const std::int64_t length = region.ranges[rank - 1].size();
    std::vector<std::int64_t> at(rank);
    for (std::size_t a = 0; a < rank; ++a) at[a] = region.ranges[a].begin;
    while (true) {
        std::int64_t so = 0, dof = 0;
        for (std::size_t a = 0; a < rank; ++a) {
            so += (at[a] - src.ranges[a].begin) * ss[a];
            dof += (at[a] - dst.ranges[a].begin) * ds[a];
        }
        row(so, dof, length);
        // Advance the odometer over every axis but the innermost.
        std::size_t a = rank - 1;
        while (a-- > 0) {
            if (++at[a] < region.ranges[a].end) break;
            at[a] = region.ranges[a].begin;
        }
        if (a == static_cast<std::size_t>(-1)) return;
    }
}

template <class T>
void copy_region(const T* src, const box& src_box, T* dst, const box& dst_box, const box& region) {
    for_each_region_row(region, src_box, dst_box, [&](std::int64_t s, std::int64_t d, std::int64_t n) {
        for (std::int64_t i = 0; i < n; ++i) dst[d + i] = src[s + i];
    });
}

template <class T>
void add_region(const T* src, const box& src_box, T* dst, const box& dst_box, const box& region) {
    for_each_region_row(region, src_box, dst_box, [&](std::int64_t s, std::int64_t d, std::int64_t n) {
        for (std::int64_t i = 0; i < n; ++i) dst[d + i] += src[s + i];
    });
}

// Boxes travel in node attributes as flat lists: begin0, end0, begin1, end1, ...
LOOM_INLINE std::vector<std::int64_t> encode_box(const box& b);

inline box decode_box(const std::vector<std::int64_t>& v, std::size_t first, std::size_t rank) {
    box b;
    for (std::size_t a = 0; a < rank; ++a) b.ranges.push_back({v.at(first + 2 * a), v.at(first + 2 * a + 1)});
    return b;
}

}  // namespace loom::partition

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::partition {

LOOM_INLINE std::vector<std::int64_t> encode_box(const box& b) {
    std::vector<std::int64_t> v;
    for (const auto& r : b.ranges) {
        v.push_back(r.begin);
        v.push_back(r.end);
    }
    return v;
}

}  // namespace loom::partition
#endif  // LOOM_HEADER_DEFINITIONS
