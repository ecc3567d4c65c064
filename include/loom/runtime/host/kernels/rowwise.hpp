#pragma once
// Building blocks of row-wise host kernels (normalizations, embedding, cross-entropy):
// loops over a row that g++ -O2 vectorises, reductions in a fixed order, exp in either
// precision, sums over rows that do not depend on the thread count, reusable scratch, and
// positions for error messages.
//
// Why fixed 8-wide blocks: at -O2, g++'s very-cheap cost model vectorises only loops with
// no scalar epilogue, so `for (i < n)` stays scalar, while the fully unrolled 8-iteration
// body of `for_lanes` is vectorised. Call them from functions whose pointer parameters are
// `__restrict`, with lambdas that capture by value ([=]): restrict on a local variable, or a
// by-reference capture, does not reach the vectoriser, which then assumes aliasing.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <loom/core/shape.hpp>
#include <loom/runtime/host/kernels/elementwise.hpp>
#include <loom/runtime/host/kernels/vector_math.hpp>
#include <loom/runtime/host/thread_pool.hpp>

namespace loom::host::detail {

inline constexpr int row_lanes = 8;

// f(i) for i in [0, n).
template <class F>
[[gnu::always_inline]] inline void for_lanes(std::int64_t n, F f) {
    std::int64_t i = 0;
    for (; i + row_lanes <= n; i += row_lanes)
        for (int j = 0; j < row_lanes; ++j) f(i + j);
    for (; i < n; ++i) f(i);
}

// sum of f(i) over [0, n): element i goes to accumulator i % 8 (in order), then the eight
// are combined as ((a0+a4)+(a1+a5))+((a2+a6)+(a3+a7)). A fixed order: deterministic.
template <class T, class F>
[[gnu::always_inline]] inline T lane_sum(std::int64_t n, F f) {
    T acc[row_lanes] = {};
    std::int64_t i = 0;
    for (; i + row_lanes <= n; i += row_lanes)
        for (int j = 0; j < row_lanes; ++j) acc[j] += f(i + j);
    for (int j = 0; i < n; ++i, ++j) acc[j] += f(i);
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// max of x[0, n), n >= 1 (a NaN in x may or may not propagate).
template <class T>
[[gnu::always_inline]] inline T lane_max(const T* __restrict x, std::int64_t n) {
    T acc[row_lanes];
    for (int j = 0; j < row_lanes; ++j) acc[j] = x[0];
    std::int64_t i = 0;
    for (; i + row_lanes <= n; i += row_lanes)
        for (int j = 0; j < row_lanes; ++j) acc[j] = acc[j] > x[i + j] ? acc[j] : x[i + j];
    for (int j = 0; i < n; ++i, ++j) acc[j] = acc[j] > x[i] ? acc[j] : x[i];
    T m = acc[0];
    for (int j = 1; j < row_lanes; ++j) m = m > acc[j] ? m : acc[j];
    return m;
}

// exp(x) for x <= 0 (x - row max) in the kernel's precision: float takes the vectorisable
// exp_nonpositive (vector_math.hpp; 0 below -87.3, NaN stays NaN, -inf gives 0), double
// keeps the library's exp, since the double path is what is cross-checked against PyTorch.
[[gnu::always_inline]] inline float lane_exp(float x) { return exp_nonpositive(x); }
[[gnu::always_inline]] inline double lane_exp(double x) { return std::exp(x); }

// Sums over rows are taken per block of this many rows, then block by block in order: the
// result depends on the row count only, never on how many threads ran the blocks.
inline constexpr std::int64_t block_rows = 64;

inline std::int64_t row_blocks(std::int64_t rows) { return (rows + block_rows - 1) / block_rows; }

// A per-thread buffer of at least n elements, reused across calls so kernels in a training
// loop stop allocating after the first step. `slot` separates buffers used at once. The
// contents are unspecified; the pointer is valid until the next call with the same slot on
// this thread.
template <class T, int slot = 0>
T* scratch(std::size_t n) {
    thread_local std::vector<T> buffer;
    if (buffer.size() < n) buffer.resize(n);
    return buffer.data();
}

// The sum of row_value(r) over rows [0, rows), in double, per block of block_rows rows and
// then block by block in order (the same for any thread count); `row_cost` elements of work
// per row sets the grain.
template <class F>
double sum_over_rows(std::int64_t rows, std::int64_t row_cost, F&& row_value) {
    const std::int64_t blocks = row_blocks(rows);
    double* partial = scratch<double>(static_cast<std::size_t>(std::max<std::int64_t>(blocks, 1)));
    const std::int64_t grain = std::max<std::int64_t>(1, elementwise_grain / (block_rows * std::max<std::int64_t>(row_cost, 1)));
    parallel_for(0, blocks, grain, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t b = lo; b < hi; ++b) {
            double s = 0;
            const std::int64_t end = std::min(rows, (b + 1) * block_rows);
            for (std::int64_t r = b * block_rows; r < end; ++r) s += row_value(r);
            partial[b] = s;
        }
    });
    double total = 0;
    for (std::int64_t b = 0; b < blocks; ++b) total += partial[b];
    return total;
}

// out[i] += in[i] for i in [0, n). A function, not a lambda, so the __restrict on its
// parameters reaches the vectoriser.
template <class T>
void add_row(T* __restrict out, const T* __restrict in, std::int64_t n) {
    for_lanes(n, [=](std::int64_t i) { out[i] += in[i]; });
}

// out[j] = sum over b in [0, blocks) of partial[b * stride + j], for j in [0, width), with b
// ascending. Columns are split across threads; each column's order is fixed.
template <class T>
void sum_blocks(const T* partial, std::int64_t blocks, std::int64_t stride, std::int64_t width, T* out) {
    const std::int64_t grain = std::max<std::int64_t>(row_lanes, (std::int64_t{1} << 14) / std::max<std::int64_t>(blocks, 1));
    parallel_for(0, width, grain, [=](std::int64_t lo, std::int64_t hi) {
        std::copy(partial + lo, partial + hi, out + lo);
        for (std::int64_t b = 1; b < blocks; ++b) add_row(out + lo, partial + b * stride + lo, hi - lo);
    });
}

// "position 13 (Batch 1, Seq 5) of 'tokens' [Batch=2, Seq=8]": a flat row-major position
// with its index along each axis.
inline std::string describe_position(std::int64_t flat, const shape& s, const std::string& tensor_name) {
    std::string index;
    std::int64_t rest = flat;
    for (std::size_t a = s.rank(); a-- > 0;) {
        const std::int64_t e = s.extent(a);
        std::string part = std::string(s.dim(a).name()) + " " + std::to_string(e > 0 ? rest % e : 0);
        index = index.empty() ? part : part + ", " + index;
        rest = e > 0 ? rest / e : 0;
    }
    std::string out = "position " + std::to_string(flat);
    if (!index.empty()) out += " (" + index + ")";
    return out + " of '" + tensor_name + "' " + s.to_string();
}

}  // namespace loom::host::detail
