// LayerNorm and RMSNorm CUDA kernels against their host twins, the host backend's row
// functions (runtime/host/kernels/{layer_norm,rms_norm}.hpp) run on the same float or
// bf16-rounded inputs, in float and bf16. The shapes reach every path: rows in registers with
// 16-byte vectors, with single elements (odd cols, misaligned pointers), rows too long for
// registers, several rows per block of the parameter gradients; statistics recomputed and
// saved; bit-identical repeats.
#include <cstring>
#include <type_traits>

#include <loom/runtime/cuda/norms.hpp>
#include <loom/runtime/host/kernels/layer_norm.hpp>
#include <loom/runtime/host/kernels/rms_norm.hpp>

#include "support.hpp"

using namespace loom;
using namespace loom::cuda_test;

namespace {

// Kernel and twin differ only in the order of float sums over a row (8 host lanes against
// up to 512 threads and a tree) and in FMA contraction: a few float ulps of O(1) values,
// well under 1e-5; bf16 results can round to the neighbouring bf16 value on top of that.
template <class T>
double row_tolerance() {
    return std::is_same_v<T, bfloat16> ? bf16_ulp : 1e-5;
}
constexpr double row_abs_tolerance = 2e-5;
// dgamma and dbeta sum O(1) terms over all rows in different orders: the rounding of a
// float running sum grows like rows * 2^-24 per term; 1e-6 per row is a wide margin that a
// row missed or counted twice (an O(1) error) still breaks.
double parameter_abs_tolerance(std::int64_t rows) { return 1e-6 * static_cast<double>(rows); }

struct norm_case {
    std::int64_t rows, cols;
    std::size_t offset;  // elements, applied to every row tensor
};

// 768: vectors; 8192: the longest cached row; 771: single elements; offset 1: misaligned;
// 1500 x 4096: three rows per gradient block; 12288 and 20001: streamed rows.
const norm_case norm_cases[] = {{333, 768, 0}, {64, 8192, 0}, {50, 771, 0}, {96, 1024, 1},
                                {1500, 4096, 0}, {400, 12288, 0}, {4, 20001, 0}};

template <class T>
void check_layer_norm(const norm_case& c, std::uint64_t seed) {
    const auto rows = c.rows, cols = c.cols;
    const auto n = static_cast<std::size_t>(rows * cols), h = static_cast<std::size_t>(cols);
    const float eps = 1e-5f;
    INFO("rows " << rows << ", cols " << cols << ", offset " << c.offset);
    const auto x = random_vector<T>(n, seed, -2.0f, 3.0f);  // a mean away from 0
    const auto dy = random_vector<T>(n, seed + 1);
    const auto gamma = random_vector<T>(h, seed + 2, 0.5f, 1.5f);
    const auto beta = random_vector<T>(h, seed + 3);
    const placed<T> dx_in(x, c.offset), ddy(dy, c.offset);
    const device_vector<T> dgamma_in(gamma), dbeta_in(beta);
    placed<T> dout(n, c.offset), dgrad(n, c.offset);
    device_vector<float> dmean(static_cast<std::size_t>(rows)), drstd(static_cast<std::size_t>(rows));
    device_vector<T> ddgamma(h), ddbeta(h);
    device_vector<unsigned char> workspace(cuda::layer_norm_backward_workspace_bytes(rows, cols));

    cuda::layer_norm_forward(dx_in.get(), dgamma_in.get(), dbeta_in.get(), dout.get(), dmean.get(), drstd.get(), rows,
                             cols, eps, nullptr);
    cuda::layer_norm_backward(ddy.get(), dx_in.get(), dgamma_in.get(), nullptr, nullptr, dgrad.get(), ddgamma.get(),
                              ddbeta.get(), rows, cols, eps, workspace.get(), nullptr);

    const auto xf = widen(x), dyf = widen(dy), gf = widen(gamma), bf = widen(beta);
    std::vector<float> y(n), mean(static_cast<std::size_t>(rows)), rstd(mean.size()), dx(n), dgamma(h, 0.0f),
        dbeta(h, 0.0f);
    for (std::int64_t r = 0; r < rows; ++r) {
        const auto at = static_cast<std::size_t>(r) * h;
        host::detail::layer_norm_row(xf.data() + at, gf.data(), bf.data(), y.data() + at, cols, eps);
        const auto m = host::detail::layer_norm_moments(xf.data() + at, cols, eps);
        mean[static_cast<std::size_t>(r)] = m.mean;
        rstd[static_cast<std::size_t>(r)] = m.rstd;
        host::detail::layer_norm_grad_row(dyf.data() + at, xf.data() + at, gf.data(), dx.data() + at, dgamma.data(),
                                          dbeta.data(), cols, eps);
    }
    require_close(dout.download(), stored<T>(y), row_tolerance<T>(), row_abs_tolerance, "layer_norm y");
    require_close(dmean.download(), mean, 1e-5, 1e-6, "layer_norm mean");
    require_close(drstd.download(), rstd, 1e-5, 0, "layer_norm rstd");
    const auto got_dx = dgrad.download();
    const auto got_dgamma = ddgamma.download(), got_dbeta = ddbeta.download();
    require_close(got_dx, stored<T>(dx), row_tolerance<T>(), row_abs_tolerance, "layer_norm dx");
    require_close(got_dgamma, stored<T>(dgamma), row_tolerance<T>(), parameter_abs_tolerance(rows),
                  "layer_norm dgamma");
    require_close(got_dbeta, stored<T>(dbeta), row_tolerance<T>(), parameter_abs_tolerance(rows), "layer_norm dbeta");

    // Again with the forward's statistics; then the same call twice gives the same bits.
    cuda::layer_norm_backward(ddy.get(), dx_in.get(), dgamma_in.get(), dmean.get(), drstd.get(), dgrad.get(),
                              ddgamma.get(), ddbeta.get(), rows, cols, eps, workspace.get(), nullptr);
    const auto saved_dx = dgrad.download();
    const auto saved_dgamma = ddgamma.download(), saved_dbeta = ddbeta.download();
    require_close(saved_dx, stored<T>(dx), row_tolerance<T>(), row_abs_tolerance, "layer_norm dx (saved statistics)");
    require_close(saved_dgamma, stored<T>(dgamma), row_tolerance<T>(), parameter_abs_tolerance(rows),
                  "layer_norm dgamma (saved statistics)");
    require_close(saved_dbeta, stored<T>(dbeta), row_tolerance<T>(), parameter_abs_tolerance(rows),
                  "layer_norm dbeta (saved statistics)");
    cuda::layer_norm_backward(ddy.get(), dx_in.get(), dgamma_in.get(), dmean.get(), drstd.get(), dgrad.get(),
                              ddgamma.get(), ddbeta.get(), rows, cols, eps, workspace.get(), nullptr);
    CHECK(std::memcmp(saved_dx.data(), dgrad.download().data(), n * sizeof(T)) == 0);
    CHECK(std::memcmp(saved_dgamma.data(), ddgamma.download().data(), h * sizeof(T)) == 0);
    CHECK(std::memcmp(saved_dbeta.data(), ddbeta.download().data(), h * sizeof(T)) == 0);
}

template <class T>
void check_rms_norm(const norm_case& c, std::uint64_t seed) {
    const auto rows = c.rows, cols = c.cols;
    const auto n = static_cast<std::size_t>(rows * cols), h = static_cast<std::size_t>(cols);
    const float eps = 1e-6f;
    INFO("rows " << rows << ", cols " << cols << ", offset " << c.offset);
    const auto x = random_vector<T>(n, seed, -2.0f, 3.0f);
    const auto dy = random_vector<T>(n, seed + 1);
    const auto gamma = random_vector<T>(h, seed + 2, 0.5f, 1.5f);
    const placed<T> dx_in(x, c.offset), ddy(dy, c.offset);
    const device_vector<T> dgamma_in(gamma);
    placed<T> dout(n, c.offset), dgrad(n, c.offset);
    device_vector<float> drstd(static_cast<std::size_t>(rows));
    device_vector<T> ddgamma(h);
    device_vector<unsigned char> workspace(cuda::rms_norm_backward_workspace_bytes(rows, cols));

    cuda::rms_norm_forward(dx_in.get(), dgamma_in.get(), dout.get(), drstd.get(), rows, cols, eps, nullptr);
    cuda::rms_norm_backward(ddy.get(), dx_in.get(), dgamma_in.get(), nullptr, dgrad.get(), ddgamma.get(), rows, cols,
                            eps, workspace.get(), nullptr);

    const auto xf = widen(x), dyf = widen(dy), gf = widen(gamma);
    std::vector<float> y(n), rstd(static_cast<std::size_t>(rows)), dx(n), dgamma(h, 0.0f);
    for (std::int64_t r = 0; r < rows; ++r) {
        const auto at = static_cast<std::size_t>(r) * h;
        host::detail::rms_norm_row(xf.data() + at, gf.data(), y.data() + at, cols, eps);
        rstd[static_cast<std::size_t>(r)] = host::detail::rms_norm_rstd(xf.data() + at, cols, eps);
        host::detail::rms_norm_grad_row(dyf.data() + at, xf.data() + at, gf.data(), dx.data() + at, dgamma.data(), cols,
                                        eps);
    }
    require_close(dout.download(), stored<T>(y), row_tolerance<T>(), row_abs_tolerance, "rms_norm y");
    require_close(drstd.download(), rstd, 1e-5, 0, "rms_norm rstd");
    const auto got_dx = dgrad.download();
    const auto got_dgamma = ddgamma.download();
    require_close(got_dx, stored<T>(dx), row_tolerance<T>(), row_abs_tolerance, "rms_norm dx");
    require_close(got_dgamma, stored<T>(dgamma), row_tolerance<T>(), parameter_abs_tolerance(rows), "rms_norm dgamma");

    cuda::rms_norm_backward(ddy.get(), dx_in.get(), dgamma_in.get(), drstd.get(), dgrad.get(), ddgamma.get(), rows,
                            cols, eps, workspace.get(), nullptr);
    const auto saved_dx = dgrad.download();
    const auto saved_dgamma = ddgamma.download();
    require_close(saved_dx, stored<T>(dx), row_tolerance<T>(), row_abs_tolerance, "rms_norm dx (saved rstd)");
    require_close(saved_dgamma, stored<T>(dgamma), row_tolerance<T>(), parameter_abs_tolerance(rows),
                  "rms_norm dgamma (saved rstd)");
    cuda::rms_norm_backward(ddy.get(), dx_in.get(), dgamma_in.get(), drstd.get(), dgrad.get(), ddgamma.get(), rows,
                            cols, eps, workspace.get(), nullptr);
    CHECK(std::memcmp(saved_dx.data(), dgrad.download().data(), n * sizeof(T)) == 0);
    CHECK(std::memcmp(saved_dgamma.data(), ddgamma.download().data(), h * sizeof(T)) == 0);
}

}  // namespace

TEMPLATE_TEST_CASE("layer_norm forward and backward match the host twin", "[cuda][norms]", float, bfloat16) {
    std::uint64_t seed = 10;
    for (const auto& c : norm_cases) check_layer_norm<TestType>(c, seed += 10);
}

TEMPLATE_TEST_CASE("rms_norm forward and backward match the host twin", "[cuda][norms]", float, bfloat16) {
    std::uint64_t seed = 20;
    for (const auto& c : norm_cases) check_rms_norm<TestType>(c, seed += 10);
}

TEST_CASE("norms: no rows zero the parameter gradients; bad arguments throw", "[cuda][norms]") {
    device_vector<float> dgamma(std::vector<float>(5, 7.0f)), dbeta(std::vector<float>(5, 7.0f));
    cuda::layer_norm_backward<float>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, dgamma.get(), dbeta.get(), 0,
                                     5, 1e-5f, nullptr, nullptr);
    require_close(dgamma.download(), std::vector<float>(5, 0.0f), 0, 0, "dgamma of no rows");
    require_close(dbeta.download(), std::vector<float>(5, 0.0f), 0, 0, "dbeta of no rows");

    device_vector<float> x(std::vector<float>(12, 1.0f)), y(12), stat(3);
    CHECK_THROWS_WITH(cuda::layer_norm_forward<float>(x.get(), x.get(), x.get(), y.get(), nullptr, nullptr, 3, 0, 1e-5f,
                                                      nullptr),
                      Catch::Contains("cols = 0"));
    CHECK_THROWS_WITH(cuda::rms_norm_forward<float>(x.get(), x.get(), y.get(), nullptr, 3, 4, -1.0f, nullptr),
                      Catch::Contains("eps = -1"));
    CHECK_THROWS_WITH(cuda::layer_norm_backward<float>(x.get(), x.get(), x.get(), stat.get(), nullptr, y.get(),
                                                       dgamma.get(), dbeta.get(), 3, 4, 1e-5f, nullptr, nullptr),
                      Catch::Contains("mean is given but rstd is null"));
    CHECK_THROWS_WITH(cuda::rms_norm_backward<float>(x.get(), x.get(), x.get(), nullptr, y.get(), dgamma.get(), 3, 4,
                                                     1e-6f, nullptr, nullptr),
                      Catch::Contains("workspace is null") && Catch::Contains("bytes"));
}
