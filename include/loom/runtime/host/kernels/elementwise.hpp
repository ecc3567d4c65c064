#pragma once
// Shared helpers for elementwise host kernels: a parallel loop over elements with a grain
// large enough that the pool pays for itself.
#include <cstdint>
#include <cstring>

#include <loom/runtime/host/thread_pool.hpp>

namespace loom::host {

inline constexpr std::int64_t elementwise_grain = 1 << 14;

// f(i) for every i in [0, n), in parallel chunks.
template <class F>
void for_each_index(std::int64_t n, F&& f) {
    parallel_for(0, n, elementwise_grain, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t i = lo; i < hi; ++i) f(i);
    });
}

// y = x over n elements, in parallel chunks; nothing when they share storage (a copy op whose
// output the planner placed on its input).
template <class T>
void copy_elements(const T* x, T* y, std::int64_t n) {
    if (x == y) return;
    parallel_for(0, n, elementwise_grain, [&](std::int64_t lo, std::int64_t hi) {
        std::memcpy(y + lo, x + lo, static_cast<std::size_t>(hi - lo) * sizeof(T));
    });
}

// f(row) for every row in [0, rows); `row_cost` elements of work per row sets the grain.
template <class F>
void for_each_row(std::int64_t rows, std::int64_t row_cost, F&& f) {
    std::int64_t grain = row_cost >= elementwise_grain ? 1 : elementwise_grain / (row_cost > 0 ? row_cost : 1);
    parallel_for(0, rows, grain, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t r = lo; r < hi; ++r) f(r);
    });
}

}  // namespace loom::host
