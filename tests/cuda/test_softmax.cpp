// Softmax CUDA kernels against their host twins, the host backend's row functions
// (runtime/host/kernels/softmax.hpp) run on the same float or bf16-rounded inputs, in float
// and bf16: rows in registers (16-byte vectors, single elements, misaligned pointers) and
// rows streamed from memory (an online max and sum), and bit-identical repeats.
#include <cmath>
#include <cstring>
#include <type_traits>

#include <loom/runtime/cuda/softmax.hpp>
#include <loom/runtime/host/kernels/softmax.hpp>

#include "support.hpp"

using namespace loom;
using namespace loom::cuda_test;

namespace {

// y: the kernel's exp (expf, within 2 ulps) against the host's polynomial (1e-7), and sums of
// up to 50257 terms in different orders: a few 1e-7 relative. bf16 adds one rounding step.
template <class T>
double tolerance() {
    return std::is_same_v<T, bfloat16> ? bf16_ulp : 1e-5;
}

// |got - want| <= rel |want| + slack[i] for every element (a per-element absolute slack).
template <class T>
void require_close_each(const std::vector<T>& got, const std::vector<float>& want, double rel,
                        const std::vector<float>& slack, const std::string& what) {
    REQUIRE(got.size() == want.size());
    std::size_t bad = 0, first_bad = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        const double g = static_cast<float>(got[i]), w = want[i];
        if (!(std::fabs(g - w) <= rel * std::fabs(w) + slack[i])) {
            if (bad++ == 0) first_bad = i;
        }
    }
    INFO(what << ": " << bad << " elements off; the first, " << first_bad << ", got "
              << (got.empty() ? 0.0f : static_cast<float>(got[first_bad])) << " want "
              << (want.empty() ? 0.0f : want[first_bad]));
    CHECK(bad == 0);
}

struct softmax_case {
    std::int64_t rows, cols;
    std::size_t offset;
};

// 1000: vectors; 8192: the longest cached row; 1001: single elements; offset 1: misaligned;
// 30000 and 50257: streamed rows.
const softmax_case softmax_cases[] = {{200, 1000, 0}, {64, 8192, 0}, {33, 1001, 0}, {50, 512, 1},
                                      {16, 30000, 0}, {5, 50257, 0}, {3, 50257, 1}};

template <class T>
void check_softmax(const softmax_case& c, std::uint64_t seed) {
    const auto rows = c.rows, cols = c.cols;
    const auto n = static_cast<std::size_t>(rows * cols), h = static_cast<std::size_t>(cols);
    INFO("rows " << rows << ", cols " << cols << ", offset " << c.offset);
    const auto x = random_vector<T>(n, seed, -8.0f, 8.0f);
    const auto dy = random_vector<T>(n, seed + 1);
    const placed<T> dx_in(x, c.offset), ddy(dy, c.offset);
    placed<T> dout(n, c.offset), dgrad(n, c.offset);
    cuda::softmax_forward(dx_in.get(), dout.get(), rows, cols, nullptr);

    const auto xf = widen(x), dyf = widen(dy);
    std::vector<float> y(n), y_stored(n);
    for (std::int64_t r = 0; r < rows; ++r) {
        const float* xr = xf.data() + static_cast<std::size_t>(r) * h;
        float* yr = y.data() + static_cast<std::size_t>(r) * h;
        const float sum = host::detail::softmax_exp_row(xr, host::detail::softmax_row_max(xr, cols), yr, cols);
        host::detail::softmax_scale_row(yr, 1.0f / sum, cols);
    }
    for (std::size_t i = 0; i < n; ++i) y_stored[i] = stored<T>(y[i]);
    const auto got_y = dout.download();
    require_close(got_y, y_stored, tolerance<T>(), 1e-12, "softmax y");

    // The backward reads the twin's y (rounded to T): both sides see the same inputs.
    std::vector<T> y_in(n);
    for (std::size_t i = 0; i < n; ++i) y_in[i] = T(y_stored[i]);
    const placed<T> dy_in(y_in, c.offset);
    cuda::softmax_backward(ddy.get(), dy_in.get(), dgrad.get(), rows, cols, nullptr);
    std::vector<float> dx(n), slack(n);
    for (std::int64_t r = 0; r < rows; ++r) {
        const auto at = static_cast<std::size_t>(r) * h;
        const float dot = host::detail::softmax_dot_row(dyf.data() + at, y_stored.data() + at, cols);
        host::detail::softmax_grad_row(dyf.data() + at, y_stored.data() + at, dot, dx.data() + at, cols);
    }
    // dx = (dy - dot) y: where dy and dot nearly cancel, the error of the dot (a sum of at
    // most 1 in magnitude, |error| well under 1e-5) times y is what remains.
    for (std::size_t i = 0; i < n; ++i) {
        slack[i] = 1e-5f * y_stored[i] + 1e-12f;
        dx[i] = stored<T>(dx[i]);
    }
    const auto got_dx = dgrad.download();
    require_close_each(got_dx, dx, tolerance<T>(), slack, "softmax dx");

    cuda::softmax_forward(dx_in.get(), dout.get(), rows, cols, nullptr);
    cuda::softmax_backward(ddy.get(), dy_in.get(), dgrad.get(), rows, cols, nullptr);
    CHECK(std::memcmp(got_y.data(), dout.download().data(), n * sizeof(T)) == 0);
    CHECK(std::memcmp(got_dx.data(), dgrad.download().data(), n * sizeof(T)) == 0);
}

}  // namespace

TEMPLATE_TEST_CASE("softmax forward and backward match the host twin", "[cuda][softmax]", float, bfloat16) {
    std::uint64_t seed = 40;
    for (const auto& c : softmax_cases) check_softmax<TestType>(c, seed += 10);
}

TEST_CASE("softmax: bad arguments throw", "[cuda][softmax]") {
    device_vector<float> x(8), y(8);
    CHECK_THROWS_WITH(cuda::softmax_forward<float>(x.get(), y.get(), 2, 0, nullptr), Catch::Contains("cols = 0"));
    CHECK_THROWS_WITH(cuda::softmax_backward<float>(x.get(), nullptr, y.get(), 2, 4, nullptr),
                      Catch::Contains("y is null"));
}
