#pragma once
// Kernel of transpose: y[g, j, i] = x[g, i, j], in square blocks so that both the rows read
// and the rows written stay in cache.
#include <algorithm>

#include <loom/ops/transpose.hpp>
#include <loom/runtime/host/kernel_call.hpp>
#include <loom/runtime/host/kernels/elementwise.hpp>

namespace loom::host {

template <>
struct host_kernel<ops::Transpose> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        constexpr std::int64_t block = 32;
        const std::int64_t rows = c.extent("a"), cols = c.extent("b");
        const std::int64_t batch = c.leading_numel(0);
        const std::int64_t row_blocks = (rows + block - 1) / block;
        const T* x = c.input(0);
        T* y = c.output(0);
        for_each_row(batch * row_blocks, block * cols, [&](std::int64_t item) {
            const std::int64_t g = item / row_blocks;
            const std::int64_t i0 = item % row_blocks * block, i1 = std::min(rows, i0 + block);
            const T* __restrict xg = x + g * rows * cols;
            T* __restrict yg = y + g * rows * cols;
            for (std::int64_t j0 = 0; j0 < cols; j0 += block) {
                const std::int64_t j1 = std::min(cols, j0 + block);
                for (std::int64_t j = j0; j < j1; ++j)
                    for (std::int64_t i = i0; i < i1; ++i) yg[j * rows + i] = xg[i * cols + j];
            }
        });
    }
};

}  // namespace loom::host
