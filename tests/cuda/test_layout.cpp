// Head permutations, column sums and fills against host twins.
#include <algorithm>

#include <loom/runtime/cuda/layout.hpp>

#include "support.hpp"

using namespace loom;
using namespace loom::cuda_test;

// Head rows of whole 16-byte units (copied 16 bytes a thread), of odd length, and at an
// address that is not 16-byte aligned (both copied element by element).
TEMPLATE_TEST_CASE("split_heads and merge_heads permute like ops::split_heads", "[cuda][layout]", float, bfloat16) {
    struct shape_case {
        std::int64_t d, offset;  // head dim; elements before the tensors in their buffers
    };
    for (const shape_case c : {shape_case{24, 0}, shape_case{5, 0}, shape_case{24, 1}}) {
        INFO("head dim " << c.d << ", offset " << c.offset);
        const std::int64_t b = 3, s = 37, h = 5, d = c.d;
        const auto n = static_cast<std::size_t>(b * s * h * d), at = static_cast<std::size_t>(c.offset);
        auto x = random_vector<TestType>(n + at, 11);
        device_vector<TestType> dx(x), dy(n + at), back(n + at);
        cuda::split_heads(dx.get() + at, dy.get() + at, b, s, h, d, nullptr);
        cuda::merge_heads(dy.get() + at, back.get() + at, b, s, h, d, nullptr);
        const auto y = dy.download();
        // The twin: x[b, s, h*D + d] = y[b, h, s, d] (ops/heads.hpp).
        for (std::int64_t ib = 0; ib < b; ++ib)
            for (std::int64_t is = 0; is < s; ++is)
                for (std::int64_t ih = 0; ih < h; ++ih)
                    for (std::int64_t id = 0; id < d; ++id)
                        REQUIRE(y[at + static_cast<std::size_t>(((ib * h + ih) * s + is) * d + id)] ==
                                x[at + static_cast<std::size_t>((ib * s + is) * h * d + ih * d + id)]);
        const auto round_trip = back.download();
        REQUIRE(std::equal(round_trip.begin() + c.offset, round_trip.end(), x.begin() + c.offset));
    }
}

TEMPLATE_TEST_CASE("sum_rows sums columns deterministically", "[cuda][layout]", float, bfloat16) {
    const std::int64_t rows = 1000, cols = 769;  // several slabs, cols not a multiple of the block
    const auto x = random_vector<TestType>(static_cast<std::size_t>(rows * cols), 12);
    device_vector<TestType> dx(x), dy(static_cast<std::size_t>(cols));
    device_vector<std::byte> workspace(cuda::sum_rows_workspace_bytes(rows, cols));
    cuda::sum_rows(dx.get(), dy.get(), rows, cols, workspace.get(), nullptr);
    std::vector<float> want(static_cast<std::size_t>(cols));
    for (std::int64_t c = 0; c < cols; ++c) {
        double sum = 0;
        for (std::int64_t r = 0; r < rows; ++r) sum += static_cast<float>(x[static_cast<std::size_t>(r * cols + c)]);
        want[static_cast<std::size_t>(c)] = static_cast<float>(sum);
    }
    // A float sum of 1000 terms of magnitude <= 1 against the double sum: within 1000 * 2^-24
    // of the magnitude sum (about 500), so 5e-5 absolute; bf16 adds the output's rounding.
    const double rel = std::is_same_v<TestType, bfloat16> ? bf16_ulp : 0.0;
    require_close(dy.download(), want, rel, 5e-5, "sum_rows");
    const auto first = dy.download();
    cuda::sum_rows(dx.get(), dy.get(), rows, cols, workspace.get(), nullptr);
    REQUIRE(dy.download() == first);
}

TEMPLATE_TEST_CASE("fill writes every element", "[cuda][layout]", float, bfloat16) {
    device_vector<TestType> y(1001);
    cuda::fill(y.get(), 1.0f, 1001, nullptr);
    for (const auto& v : y.download()) REQUIRE(static_cast<float>(v) == 1.0f);
}
