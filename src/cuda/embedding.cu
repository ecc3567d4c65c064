// Embedding gather and its deterministic gradient. The gather copies raw bits (16 bytes at a
// time when aligned). The gradient sorts (row, position) pairs with CUB's stable radix sort,
// so each table row's positions end up together in increasing order, then one block per
// table row finds its run by binary search and sums it in that order: no atomics, and the
// host kernel's order exactly.
#include <loom/runtime/cuda/embedding.hpp>

#include <bit>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include <cub/device/device_radix_sort.cuh>

#include <loom/core/error.hpp>

#include "check.cuh"
#include "rowwise.cuh"
#include "types.cuh"

namespace loom::cuda {
namespace {

using detail::ceil_div;
using detail::device_t;
using detail::load_vector;
using detail::store_vector;

constexpr unsigned gather_threads = 256;
constexpr unsigned max_sum_threads = 256;

// Raw words of a row: 16-byte vectors when aligned, else single elements as integers (a
// copy that keeps every bit, NaN payloads included).
template <class T>
using element_bits = std::conditional_t<sizeof(T) == 4, unsigned, unsigned short>;

__device__ __forceinline__ void flag_if_outside(std::int64_t id, std::int64_t vocab, int* invalid_id) {
    if (invalid_id && (id < 0 || id >= vocab)) atomicExch(invalid_id, 1);
}

// out[p] word c = table[ids[p] - row_offset] word c, or zero; one thread per output word.
template <class W>
__global__ void __launch_bounds__(gather_threads)
    embedding_gather(const std::int32_t* __restrict__ ids, const W* __restrict__ table, W* __restrict__ out,
                     std::int64_t positions, std::int64_t rows, std::int64_t words_per_row, std::int64_t vocab,
                     std::int64_t row_offset, int* __restrict__ invalid_id) {
    const std::int64_t total = positions * words_per_row;
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const std::int64_t p = i / words_per_row, c = i - p * words_per_row;
        const std::int64_t id = ids[p];
        const std::int64_t row = id - row_offset;
        if (row >= 0 && row < rows) {
            out[i] = table[row * words_per_row + c];
        } else {
            out[i] = W{};
            if (c == 0) flag_if_outside(id, vocab, invalid_id);
        }
    }
}

// keys[p] = the table row of ids[p], or `rows` (sorted past every real row, then ignored)
// when the id is not a row of this table; positions[p] = p.
__global__ void embedding_keys(const std::int32_t* __restrict__ ids, std::int64_t positions, std::int64_t rows,
                               std::int64_t vocab, std::int64_t row_offset, unsigned* __restrict__ keys,
                               int* __restrict__ order, int* __restrict__ invalid_id) {
    for (std::int64_t p = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; p < positions;
         p += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const std::int64_t id = ids[p];
        const std::int64_t row = id - row_offset;
        keys[p] = static_cast<unsigned>(row >= 0 && row < rows ? row : rows);
        order[p] = static_cast<int>(p);
        flag_if_outside(id, vocab, invalid_id);
    }
}

// The first index in sorted keys[0, n) whose key is not below `key`.
__device__ __forceinline__ std::int64_t lower_bound(const unsigned* keys, std::int64_t n, unsigned key) {
    std::int64_t lo = 0, hi = n;
    while (lo < hi) {
        const std::int64_t mid = lo + (hi - lo) / 2;
        if (keys[mid] < key) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// dtable[r] = dy[order[first]] + dy[order[first + 1]] + ... over row r's run of the sorted
// keys, in float, left to right (the host's order); zeros for an empty run.
template <int V, class D>
__global__ void __launch_bounds__(max_sum_threads)
    embedding_row_sums(const D* __restrict__ dy, const unsigned* __restrict__ keys, const int* __restrict__ order,
                       std::int64_t positions, D* __restrict__ dtable, std::int64_t rows, std::int64_t cols) {
    const std::int64_t vectors = cols / V;
    for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        // Every thread searches (the same loads, broadcast): no barrier needed.
        const std::int64_t first = lower_bound(keys, positions, static_cast<unsigned>(r));
        const std::int64_t last = lower_bound(keys, positions, static_cast<unsigned>(r + 1));
        for (std::int64_t c = threadIdx.x; c < vectors; c += blockDim.x) {
            float acc[V];
            if (first == last) {
#pragma unroll
                for (int j = 0; j < V; ++j) acc[j] = 0.0f;
            } else {
                load_vector<V>(dy + static_cast<std::int64_t>(order[first]) * cols + c * V, acc);
#pragma unroll 4
                for (std::int64_t k = first + 1; k < last; ++k) {
                    float v[V];
                    load_vector<V>(dy + static_cast<std::int64_t>(order[k]) * cols + c * V, v);
#pragma unroll
                    for (int j = 0; j < V; ++j) acc[j] += v[j];
                }
            }
            store_vector<V>(dtable + r * cols + c * V, acc);
        }
    }
}

// Largest key: `rows`, the mark of ids outside the table. Sorting only its bits is faster.
int key_bits(std::int64_t rows) { return static_cast<int>(std::bit_width(static_cast<std::uint64_t>(rows))); }

constexpr std::size_t workspace_alignment = 256;

std::size_t aligned_size(std::size_t bytes) { return (bytes + workspace_alignment - 1) / workspace_alignment * workspace_alignment; }

// Workspace: keys and positions, each double-buffered for the sort, then CUB's storage.
struct sort_layout {
    std::size_t array_bytes = 0;  // one array of keys or positions, padded
    std::size_t temp_bytes = 0;   // CUB's temporary storage
    std::size_t total() const { return 4 * array_bytes + temp_bytes; }
};

sort_layout layout_for(std::int64_t positions, std::int64_t rows) {
    sort_layout l;
    if (positions <= 0 || rows <= 0) return l;
    l.array_bytes = aligned_size(static_cast<std::size_t>(positions) * sizeof(unsigned));
    cub::DoubleBuffer<unsigned> keys(nullptr, nullptr);
    cub::DoubleBuffer<int> order(nullptr, nullptr);
    LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, l.temp_bytes, keys, order, static_cast<int>(positions), 0,
                                                    key_bits(rows)));
    return l;
}

void check_table(const char* fn, std::int64_t positions, std::int64_t rows, std::int64_t cols, std::int64_t vocab,
                 std::int64_t row_offset) {
    const std::string f(fn);
    if (positions < 0 || positions > INT_MAX)
        throw usage_error(f + ": positions = " + std::to_string(positions) +
                          "; pass the number of ids, from 0 to 2^31 - 1 (split a larger batch)");
    if (rows < 0 || rows >= static_cast<std::int64_t>(UINT_MAX))
        throw usage_error(f + ": rows = " + std::to_string(rows) +
                          "; pass the table's row count, from 0 to 2^32 - 2");
    if (cols < 1) throw usage_error(f + ": cols = " + std::to_string(cols) + "; pass the row length, 1 or more");
    if (row_offset < 0 || row_offset + rows > vocab)
        throw usage_error(f + ": the table rows [" + std::to_string(row_offset) + ", " +
                          std::to_string(row_offset + rows) + ") are not inside the vocabulary [0, " +
                          std::to_string(vocab) + "); set row_offset and vocab so the table is a slice of it");
}

using detail::check_pointer;

template <class W>
void launch_gather(const std::int32_t* ids, const void* table, void* out, std::int64_t positions, std::int64_t rows,
                   std::int64_t words_per_row, std::int64_t vocab, std::int64_t row_offset, int* invalid_id,
                   stream_handle s) {
    const std::int64_t total = positions * words_per_row;
    embedding_gather<<<detail::blocks_for(total, gather_threads), gather_threads, 0, s>>>(
        ids, static_cast<const W*>(table), static_cast<W*>(out), positions, rows, words_per_row, vocab, row_offset,
        invalid_id);
}

unsigned row_sum_threads(std::int64_t vectors) {
    const std::int64_t threads = ceil_div(vectors, 32) * 32;
    return static_cast<unsigned>(threads > max_sum_threads ? max_sum_threads : threads);
}

}  // namespace

template <class T>
void embedding_forward(const std::int32_t* ids, const T* table, T* out, std::int64_t positions, std::int64_t rows,
                       std::int64_t cols, std::int64_t vocab, std::int64_t row_offset, int* invalid_id,
                       stream_handle s) {
    constexpr const char* fn = "loom::cuda::embedding_forward";
    check_table(fn, positions, rows, cols, vocab, row_offset);
    if (positions == 0) return;
    check_pointer(fn, "ids", ids);
    check_pointer(fn, "out", out);
    if (rows > 0) check_pointer(fn, "table", table);
    constexpr int V = detail::vector_width<T>;
    if (detail::vectorizable<T>(cols, {table, out}))
        launch_gather<uint4>(ids, table, out, positions, rows, cols / V, vocab, row_offset, invalid_id, s);
    else
        launch_gather<element_bits<T>>(ids, table, out, positions, rows, cols, vocab, row_offset, invalid_id, s);
    LOOM_CUDA_CHECK_LAUNCH(fn);
}

std::size_t embedding_backward_workspace_bytes(std::int64_t positions, std::int64_t rows) {
    return layout_for(positions, rows).total();
}

template <class T>
void embedding_backward(const T* dy, const std::int32_t* ids, T* dtable, std::int64_t positions, std::int64_t rows,
                        std::int64_t cols, std::int64_t vocab, std::int64_t row_offset, void* workspace,
                        int* invalid_id, stream_handle s) {
    constexpr const char* fn = "loom::cuda::embedding_backward";
    check_table(fn, positions, rows, cols, vocab, row_offset);
    if (rows == 0) return;
    check_pointer(fn, "dtable", dtable);
    if (positions == 0) {  // no ids: every row's sum is empty
        fill_zero(dtable, static_cast<std::size_t>(rows * cols) * sizeof(T), s);
        return;
    }
    check_pointer(fn, "dy", dy);
    check_pointer(fn, "ids", ids);
    const sort_layout l = layout_for(positions, rows);
    if (!workspace || reinterpret_cast<std::uintptr_t>(workspace) % workspace_alignment != 0)
        throw usage_error(std::string(fn) + ": workspace is " + (workspace ? "not 256-byte aligned" : "null") +
                          "; pass embedding_backward_workspace_bytes(positions, rows) = " + std::to_string(l.total()) +
                          " bytes of 256-byte-aligned device memory");
    auto* base = static_cast<unsigned char*>(workspace);
    auto* keys_a = reinterpret_cast<unsigned*>(base);
    auto* keys_b = reinterpret_cast<unsigned*>(base + l.array_bytes);
    auto* order_a = reinterpret_cast<int*>(base + 2 * l.array_bytes);
    auto* order_b = reinterpret_cast<int*>(base + 3 * l.array_bytes);
    void* temp = base + 4 * l.array_bytes;

    embedding_keys<<<detail::blocks_for(positions, gather_threads), gather_threads, 0, s>>>(
        ids, positions, rows, vocab, row_offset, keys_a, order_a, invalid_id);
    LOOM_CUDA_CHECK_LAUNCH(fn);
    cub::DoubleBuffer<unsigned> keys(keys_a, keys_b);
    cub::DoubleBuffer<int> order(order_a, order_b);
    std::size_t temp_bytes = l.temp_bytes;
    LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, order, static_cast<int>(positions), 0,
                                                    key_bits(rows), s));

    using D = device_t<T>;
    const D* ddy = detail::device_ptr(dy);
    D* dd = detail::device_ptr(dtable);
    constexpr int V = detail::vector_width<D>;
    const unsigned grid = detail::row_grid(rows);
    if (detail::vectorizable<D>(cols, {dy, dtable}))
        embedding_row_sums<V><<<grid, row_sum_threads(cols / V), 0, s>>>(ddy, keys.Current(), order.Current(),
                                                                         positions, dd, rows, cols);
    else
        embedding_row_sums<1><<<grid, row_sum_threads(cols), 0, s>>>(ddy, keys.Current(), order.Current(), positions,
                                                                     dd, rows, cols);
    LOOM_CUDA_CHECK_LAUNCH(fn);
}

#define LOOM_INSTANTIATE(T)                                                                                    \
    template void embedding_forward<T>(const std::int32_t*, const T*, T*, std::int64_t, std::int64_t,        \
                                       std::int64_t, std::int64_t, std::int64_t, int*, stream_handle);       \
    template void embedding_backward<T>(const T*, const std::int32_t*, T*, std::int64_t, std::int64_t,       \
                                        std::int64_t, std::int64_t, std::int64_t, void*, int*, stream_handle);
LOOM_INSTANTIATE(float)
LOOM_INSTANTIATE(bfloat16)
#undef LOOM_INSTANTIATE

}  // namespace loom::cuda
