#pragma once
// Host kernels of the vocabulary-parallel cross-entropy ops (ops/vocab_parallel_cross_entropy.hpp).
// Each chunk's log-sum-exp is taken around the chunk's max, and the loss around the max of
// the chunks' log-sum-exps, so no exp overflows. The loss sums rows with sum_over_rows:
// the same for any thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <loom/ops/vocab_parallel_cross_entropy.hpp>
#include <loom/runtime/host/kernel_call.hpp>
#include <loom/runtime/host/kernels/cross_entropy.hpp>
#include <loom/runtime/host/kernels/elementwise.hpp>
#include <loom/runtime/host/kernels/rowwise.hpp>

namespace loom::host {

namespace detail {

// For pick_target and its gradient: checks the targets (input 1) against the whole
// vocabulary, then maps a position to its target's column among this piece's rows
// [row_offset, row_offset + v), or -1 where the piece does not hold it or it is ignored.
template <class T>
auto target_columns(const kernel_call<T>& c) {
    const std::int64_t v = c.extent("v");
    const auto offset = c.attrs().template get_or<std::int64_t>("row_offset", 0);
    const auto ignore = c.attrs().template get<std::int64_t>("ignore_index");
    check_targets(c, 1, c.attrs().template get<std::int64_t>("vocab"), ignore);
    const std::int32_t* targets = c.index_input(1);
    return [=](std::int64_t r) -> std::int64_t {
        const std::int64_t col = targets[r] == ignore ? -1 : targets[r] - offset;
        return col >= 0 && col < v ? col : -1;
    };
}

}  // namespace detail

template <>
struct host_kernel<ops::ChunkLogsumexp> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t chunks = c.extent("c"), v = c.extent("v");
        const std::int64_t rows = c.output_numel(0) / std::max<std::int64_t>(chunks, 1);
        const T* logits = c.input(0);
        T* lse = c.output(0);
        for_each_row(rows, chunks * v, [&](std::int64_t r) {
            for (std::int64_t k = 0; k < chunks; ++k) lse[r * chunks + k] = detail::log_sum_exp(logits + (r * chunks + k) * v, v);
        });
    }
};

template <>
struct host_kernel<ops::ChunkLogsumexpGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t chunks = c.extent("c"), v = c.extent("v");
        const std::int64_t rows = c.input_numel(0) / std::max<std::int64_t>(chunks, 1);
        const T* dlse = c.input(0);
        const T* logits = c.input(1);
        const T* lse = c.input(2);
        T* dlogits = c.output(0);
        for_each_row(rows, chunks * v, [&](std::int64_t r) {
            for (std::int64_t k = 0; k < chunks; ++k) {
                const std::int64_t at = r * chunks + k;
                const T* x = logits + at * v;
                T* out = dlogits + at * v;
                const T m = lse[at], scale = dlse[at];
                detail::for_lanes(v, [=](std::int64_t i) { out[i] = scale * detail::lane_exp(x[i] - m); });
            }
        });
    }
};

namespace detail {

// The columns [begin, end) of chunk k among the logits' own columns [0, v), which hold
// vocabulary columns [row_offset, row_offset + v); empty where they hold none of it.
struct chunk_columns {
    std::int64_t begin, end;
};
inline chunk_columns held_columns(const std::vector<std::int64_t>& boundaries, std::size_t k, std::int64_t offset,
                                  std::int64_t v) {
    return {std::clamp<std::int64_t>(boundaries[k] - offset, 0, v), std::clamp<std::int64_t>(boundaries[k + 1] - offset, 0, v)};
}

}  // namespace detail

// Chunks whose columns the logits hold get their log-sum-exp, the others 0 (the op is a
// partial sum over pieces of the vocabulary; a piece holds whole chunks, checked when built).
template <>
struct host_kernel<ops::RaggedChunkLogsumexp> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const auto bounds = c.attrs().template get<std::vector<std::int64_t>>("boundaries");
        const auto offset = c.attrs().template get_or<std::int64_t>("row_offset", 0);
        const std::int64_t chunks = c.extent("c"), v = c.extent("v");
        const std::int64_t rows = c.output_numel(0) / std::max<std::int64_t>(chunks, 1);
        const T* logits = c.input(0);
        T* lse = c.output(0);
        for_each_row(rows, v, [&](std::int64_t r) {
            for (std::int64_t k = 0; k < chunks; ++k) {
                const auto cols = detail::held_columns(bounds, static_cast<std::size_t>(k), offset, v);
                lse[r * chunks + k] = cols.end > cols.begin
                                          ? detail::log_sum_exp(logits + r * v + cols.begin, cols.end - cols.begin)
                                          : T(0);
            }
        });
    }
};

template <>
struct host_kernel<ops::RaggedChunkLogsumexpGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const auto bounds = c.attrs().template get<std::vector<std::int64_t>>("boundaries");
        const auto offset = c.attrs().template get_or<std::int64_t>("row_offset", 0);
        const std::int64_t chunks = c.extent("c"), v = c.extent("v");
        const std::int64_t rows = c.input_numel(0) / std::max<std::int64_t>(chunks, 1);
        const T* dlse = c.input(0);
        const T* logits = c.input(1);
        const T* lse = c.input(2);
        T* dlogits = c.output(0);
        for_each_row(rows, v, [&](std::int64_t r) {
            for (std::int64_t k = 0; k < chunks; ++k) {
                const auto cols = detail::held_columns(bounds, static_cast<std::size_t>(k), offset, v);
                if (cols.end <= cols.begin) continue;
                const T* x = logits + r * v + cols.begin;
                T* out = dlogits + r * v + cols.begin;
                const T m = lse[r * chunks + k], scale = dlse[r * chunks + k];
                detail::for_lanes(cols.end - cols.begin, [=](std::int64_t i) { out[i] = scale * detail::lane_exp(x[i] - m); });
            }
        });
    }
};

template <>
struct host_kernel<ops::PickTarget> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t v = c.extent("v");
        const auto column = detail::target_columns(c);
        const T* logits = c.input(0);
        T* z = c.output(0);
        for (std::int64_t r = 0, rows = c.input_numel(1); r < rows; ++r) {
            const std::int64_t col = column(r);
            z[r] = col >= 0 ? logits[r * v + col] : T(0);
        }
    }
};

template <>
struct host_kernel<ops::PickTargetGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t v = c.extent("v");
        const auto column = detail::target_columns(c);
        const T* dz = c.input(0);
        T* dlogits = c.output(0);
        for_each_row(c.input_numel(1), v, [&](std::int64_t r) {
            T* out = dlogits + r * v;
            std::fill(out, out + v, T(0));
            if (const std::int64_t col = column(r); col >= 0) out[col] = dz[r];
        });
    }
};

template <>
struct host_kernel<ops::CrossEntropyFromChunks> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t chunks = c.extent("c");
        const std::int64_t rows = c.input_numel(2);
        const auto ignore = c.attrs().template get<std::int64_t>("ignore_index");
        const double normalizer = c.attrs().template get<double>("normalizer");
        const T* lse = c.input(0);
        const T* z = c.input(1);
        const std::int32_t* targets = c.index_input(2);
        const double total = detail::sum_over_rows(rows, chunks, [&](std::int64_t r) {
            if (targets[r] == ignore) return 0.0;
            return static_cast<double>(detail::log_sum_exp(lse + r * chunks, chunks) - z[r]);
        });
        *c.output(0) = static_cast<T>(total / normalizer);
    }
};

template <>
struct host_kernel<ops::CrossEntropyFromChunksGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t chunks = c.extent("c");
        const std::int64_t rows = c.input_numel(2);
        const auto ignore = c.attrs().template get<std::int64_t>("ignore_index");
        const T scale = static_cast<T>(static_cast<double>(*c.input(0)) / c.attrs().template get<double>("normalizer"));
        const T* lse = c.input(1);
        const std::int32_t* targets = c.index_input(2);
        T* dlse = c.output(0);
        T* dz = c.output(1);
        for_each_row(rows, chunks, [&](std::int64_t r) {
            T* out = dlse + r * chunks;
            if (targets[r] == ignore) {
                std::fill(out, out + chunks, T(0));
                dz[r] = T(0);
                return;
            }
            // d/dlse_k of logsumexp_k lse_k is softmax_k(lse).
            const T total = detail::log_sum_exp(lse + r * chunks, chunks);
            for (std::int64_t k = 0; k < chunks; ++k) out[k] = scale * std::exp(lse[r * chunks + k] - total);
            dz[r] = -scale;
        });
    }
};

}  // namespace loom::host
