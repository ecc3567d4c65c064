#pragma once
// Kernels of the structural ops: fill_like, identity, add, mul, scale and the reductions.
#include <algorithm>
#include <cstring>
#include <vector>

#include <loom/ops/add.hpp>
#include <loom/ops/fill.hpp>
#include <loom/ops/identity.hpp>
#include <loom/ops/mul.hpp>
#include <loom/ops/reduce.hpp>
#include <loom/ops/scale.hpp>
#include <loom/runtime/host/cpu_isa.hpp>
#include <loom/runtime/host/kernel_call.hpp>
#include <loom/runtime/host/kernels/elementwise.hpp>
#include <loom/runtime/host/kernels/vector_math.hpp>

namespace loom::host {

template <>
struct host_kernel<ops::FillLike> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const T value = static_cast<T>(c.attrs().template get<double>("value"));
        T* y = c.output(0);
        for_each_index(c.output_numel(0), [&](std::int64_t i) { y[i] = value; });
    }
};

template <>
struct host_kernel<ops::Identity> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const T* x = c.input(0);
        T* y = c.output(0);
        if (x != y) std::memcpy(y, x, static_cast<std::size_t>(c.output_numel(0)) * sizeof(T));
    }
};

template <>
struct host_kernel<ops::Add> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const T *a = c.input(0), *b = c.input(1);
        T* y = c.output(0);
        for_each_index(c.output_numel(0), [&](std::int64_t i) { y[i] = a[i] + b[i]; });
    }
};

template <>
struct host_kernel<ops::Mul> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const T *a = c.input(0), *b = c.input(1);
        T* y = c.output(0);
        for_each_index(c.output_numel(0), [&](std::int64_t i) { y[i] = a[i] * b[i]; });
    }
};

template <>
struct host_kernel<ops::Scale> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const T s = static_cast<T>(c.attrs().template get<double>("factor"));
        const T* x = c.input(0);
        T* y = c.output(0);
        for_each_index(c.output_numel(0), [&](std::int64_t i) { y[i] = s * x[i]; });
    }
};

namespace detail {
// A deterministic parallel sum: fixed-size chunks summed in order, then the partials in
// order, so the result does not depend on how many threads ran.
template <class T>
T deterministic_sum(const T* x, std::int64_t n) {
    constexpr std::int64_t chunk = 1 << 12;
    const std::int64_t chunks = (n + chunk - 1) / chunk;
    std::vector<T> partial(static_cast<std::size_t>(std::max<std::int64_t>(chunks, 1)), T(0));
    parallel_for(0, chunks, 4, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t b = lo; b < hi; ++b) {
            T s = 0;
            const std::int64_t end = std::min(n, (b + 1) * chunk);
            for (std::int64_t i = b * chunk; i < end; ++i) s += x[i];
            partial[static_cast<std::size_t>(b)] = s;
        }
    });
    T total = 0;
    for (T p : partial) total += p;
    return total;
}
}  // namespace detail

template <>
struct host_kernel<ops::Sum> {
    template <class T>
    static void run(const kernel_call<T>& c) { *c.output(0) = detail::deterministic_sum(c.input(0), c.input_numel(0)); }
};

template <>
struct host_kernel<ops::Mean> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const double count = c.attrs().template get<double>("count");
        *c.output(0) = static_cast<T>(detail::deterministic_sum(c.input(0), c.input_numel(0)) / count);
    }
};

template <>
struct host_kernel<ops::BroadcastScalar> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const T value = *c.input(1) * static_cast<T>(c.attrs().template get<double>("scale"));
        T* y = c.output(0);
        for_each_index(c.output_numel(0), [&](std::int64_t i) { y[i] = value; });
    }
};

namespace detail {

// y[j0 + j] = sum_r x[r * n + j0 + j] for j < width <= sum_columns_block, summed row by row
// in order into a local accumulator: the compiler cannot know that y does not alias x, and
// summing into y directly loaded and stored it for every row (a bias gradient ran at
// 10 GB/s). A full block has a constant trip count, so its row loop vectorizes whole.
inline constexpr std::int64_t sum_columns_block = 256;
template <class T>
[[gnu::always_inline]] inline void sum_columns_body(const T* __restrict x, std::int64_t n, std::int64_t rows,
                                                    std::int64_t j0, std::int64_t width, T* __restrict y) {
    constexpr std::int64_t block = sum_columns_block;
    T sums[block] = {};
    if (width == block) {
        for (std::int64_t r = 0; r < rows; ++r) {
            const T* row = x + r * n + j0;
            for (std::int64_t j = 0; j < block; ++j) sums[j] += row[j];
        }
    } else {
        for (std::int64_t r = 0; r < rows; ++r) {
            const T* row = x + r * n + j0;
            for (std::int64_t j = 0; j < width; ++j) sums[j] += row[j];
        }
    }
    for (std::int64_t j = 0; j < width; ++j) y[j0 + j] = sums[j];
}

template <class T>
void sum_columns(const T* x, std::int64_t n, std::int64_t rows, std::int64_t j0, std::int64_t width, T* y) {
    sum_columns_body(x, n, rows, j0, width, y);
}

// The same, compiled for wider vectors (the baseline build targets SSE2): each column is
// still one sum in row order, so the result is bit for bit the baseline's.
template <class T>
[[gnu::target("avx2")]] void sum_columns_avx2(const T* x, std::int64_t n, std::int64_t rows, std::int64_t j0,
                                              std::int64_t width, T* y) {
    sum_columns_body(x, n, rows, j0, width, y);
}

template <class T>
[[gnu::target("avx512f")]] void sum_columns_avx512(const T* x, std::int64_t n, std::int64_t rows, std::int64_t j0,
                                                   std::int64_t width, T* y) {
    sum_columns_body(x, n, rows, j0, width, y);
}

// sum_columns built for `isa` (one this CPU runs).
template <class T>
void sum_columns_on(cpu_isa isa, const T* x, std::int64_t n, std::int64_t rows, std::int64_t j0, std::int64_t width,
                    T* y) {
    switch (isa) {
        case cpu_isa::avx512f: return sum_columns_avx512(x, n, rows, j0, width, y);
        case cpu_isa::avx2_fma: return sum_columns_avx2(x, n, rows, j0, width, y);
        case cpu_isa::portable: return sum_columns(x, n, rows, j0, width, y);
    }
}

}  // namespace detail

// db[j] = sum_r dy[r, j]; columns split across threads, rows summed in order, so the result
// does not depend on the threads.
template <>
struct host_kernel<ops::SumLeading> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t n = c.extent("n");
        const std::int64_t rows = c.input_numel(0) / n;
        const T* x = c.input(0);
        T* y = c.output(0);
        const cpu_isa isa = best_cpu_isa();
        parallel_for(0, n, 16, [&](std::int64_t lo, std::int64_t hi) {
            for (std::int64_t j0 = lo; j0 < hi; j0 += detail::sum_columns_block)
                detail::sum_columns_on(isa, x, n, rows, j0, std::min(detail::sum_columns_block, hi - j0), y);
        });
    }
};

}  // namespace loom::host
