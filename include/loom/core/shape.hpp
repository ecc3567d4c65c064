#pragma once
// A shape is a list of named axes: [Batch=8, Seq=64, Hidden=128]. Rank 0 is a scalar.
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include <loom/core/dim.hpp>
#include <loom/core/linkage.hpp>

namespace loom {

struct axis {
    dim_id dim;
    std::int64_t extent = 0;

    friend bool operator==(const axis&, const axis&) = default;
};

class shape {
public:
    shape() = default;
    shape(std::initializer_list<axis> axes) : axes_(axes) {}
    explicit shape(std::vector<axis> axes) : axes_(std::move(axes)) {}

    std::size_t rank() const { return axes_.size(); }
    const axis& operator[](std::size_t i) const { return axes_[i]; }
    axis& operator[](std::size_t i) { return axes_[i]; }
    std::int64_t extent(std::size_t i) const { return axes_[i].extent; }
    dim_id dim(std::size_t i) const { return axes_[i].dim; }
    const std::vector<axis>& axes() const { return axes_; }
    auto begin() const { return axes_.begin(); }
    auto end() const { return axes_.end(); }

    std::int64_t numel() const {
        std::int64_t n = 1;
        for (const auto& a : axes_) n *= a.extent;
        return n;
    }

    // Position of the first axis named `d`, if any.
    std::optional<std::size_t> find(dim_id d) const {
        for (std::size_t i = 0; i < axes_.size(); ++i)
            if (axes_[i].dim == d) return i;
        return std::nullopt;
    }

    // Product of the extents of axes [first, last).
    std::int64_t span_numel(std::size_t first, std::size_t last) const {
        std::int64_t n = 1;
        for (std::size_t i = first; i < last; ++i) n *= axes_[i].extent;
        return n;
    }

    void push_back(axis a) { axes_.push_back(a); }

    std::string to_string() const {
        std::string s = "[";
        for (std::size_t i = 0; i < axes_.size(); ++i) {
            if (i) s += ", ";
            s += std::string(axes_[i].dim.name()) + "=" + std::to_string(axes_[i].extent);
        }
        return s + "]";
    }

    friend bool operator==(const shape&, const shape&) = default;

private:
    std::vector<axis> axes_;
};

// The same extents, ignoring names.
LOOM_INLINE bool same_extents(const shape& a, const shape& b);

}  // namespace loom

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom {

LOOM_INLINE bool same_extents(const shape& a, const shape& b) {
    if (a.rank() != b.rank()) return false;
    for (std::size_t i = 0; i < a.rank(); ++i)
        if (a.extent(i) != b.extent(i)) return false;
    return true;
}

}  // namespace loom
#endif  // LOOM_HEADER_DEFINITIONS
