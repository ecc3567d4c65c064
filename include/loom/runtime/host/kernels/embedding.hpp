#pragma once
// Host kernels of embedding and embedding_grad. The gradient is deterministic without
// atomics: positions are bucketed by id (a stable counting sort), then each table row is
// owned by one thread and sums its positions in increasing order.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include <loom/core/error.hpp>
#include <loom/ops/embedding.hpp>
#include <loom/runtime/host/kernel_call.hpp>
#include <loom/runtime/host/kernels/elementwise.hpp>
#include <loom/runtime/host/kernels/rowwise.hpp>

namespace loom::host {

namespace detail {

// Throws usage_error for the first id outside [0, vocab), input `which` of the node.
template <class T>
void check_ids(const kernel_call<T>& c, std::size_t which, std::int64_t vocab) {
    const std::int32_t* ids = c.index_input(which);
    const std::int64_t n = c.input_numel(which);
    for (std::int64_t p = 0; p < n; ++p) {
        if (ids[p] >= 0 && ids[p] < vocab) continue;
        throw usage_error(std::string(c.n.op->name) + " '" + c.n.name + "': id " + std::to_string(ids[p]) + " at " +
                          describe_position(p, c.input_shape(which), c.g.tensor(c.n.inputs[which]).name) +
                          " is outside the vocabulary [0, " + std::to_string(vocab) +
                          "); every id must be a row of the embedding table (check the data's vocabulary size "
                          "against the table's rows)");
    }
}

}  // namespace detail

template <>
struct host_kernel<ops::Embedding> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t h = c.extent("h"), rows = c.extent("v");
        const auto vocab = c.attrs().template get<std::int64_t>("vocab");
        const auto offset = c.attrs().template get_or<std::int64_t>("row_offset", 0);
        detail::check_ids(c, 0, vocab);
        const std::int32_t* ids = c.index_input(0);
        const T* table = c.input(1);
        T* out = c.output(0);
        for_each_row(c.input_numel(0), h, [&](std::int64_t p) {
            const std::int64_t row = ids[p] - offset;
            if (row >= 0 && row < rows)
                std::memcpy(out + p * h, table + row * h, static_cast<std::size_t>(h) * sizeof(T));
            else
                std::fill(out + p * h, out + (p + 1) * h, T(0));
        });
    }
};

template <>
struct host_kernel<ops::EmbeddingGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t h = c.extent("h"), rows = c.extent("v");
        const auto vocab = c.attrs().template get<std::int64_t>("vocab");
        const auto offset = c.attrs().template get_or<std::int64_t>("row_offset", 0);
        detail::check_ids(c, 1, vocab);
        const T* dy = c.input(0);
        const std::int32_t* ids = c.index_input(1);
        const std::int64_t n = c.input_numel(1);
        T* dtable = c.output(0);

        // Stable counting sort of the positions whose id is a row of this table. Afterwards
        // row r's positions are order[bucket_end[r - 1] .. bucket_end[r]) (from 0 for r = 0).
        std::int64_t* bucket_end = detail::scratch<std::int64_t, 0>(static_cast<std::size_t>(rows + 1));
        std::int64_t* order = detail::scratch<std::int64_t, 1>(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)));
        std::fill(bucket_end, bucket_end + rows + 1, std::int64_t{0});
        for (std::int64_t p = 0; p < n; ++p) {
            const std::int64_t row = ids[p] - offset;
            if (row >= 0 && row < rows) ++bucket_end[row + 1];
        }
        for (std::int64_t r = 1; r <= rows; ++r) bucket_end[r] += bucket_end[r - 1];
        for (std::int64_t p = 0; p < n; ++p) {
            const std::int64_t row = ids[p] - offset;
            if (row >= 0 && row < rows) order[bucket_end[row]++] = p;
        }

        for_each_row(rows, h, [&](std::int64_t r) {
            T* out = dtable + r * h;
            const std::int64_t first = r == 0 ? 0 : bucket_end[r - 1], last = bucket_end[r];
            if (first == last) {
                std::fill(out, out + h, T(0));
                return;
            }
            std::memcpy(out, dy + order[first] * h, static_cast<std::size_t>(h) * sizeof(T));
            for (std::int64_t k = first + 1; k < last; ++k) detail::add_row(out, dy + order[k] * h, h);
        });
    }
};

}  // namespace loom::host
