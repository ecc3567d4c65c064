// Element-wise CUDA kernels against their host twins (the host backend's float kernels),
// in float and bf16.
#include <cmath>

#include <loom/runtime/cuda/elementwise.hpp>
#include <loom/runtime/host/kernels/gelu.hpp>

#include "support.hpp"

using namespace loom;
using namespace loom::cuda_test;

namespace {

template <class T>
double tolerance() {
    return std::is_same_v<T, bfloat16> ? bf16_ulp : 2e-6;
}

}  // namespace

TEMPLATE_TEST_CASE("gelu forward and backward match the host twin", "[cuda][elementwise]", float, bfloat16) {
    const std::size_t n = 1 << 20 | 37;  // not a multiple of any block size
    const auto x = random_vector<TestType>(n, 1, -6.0f, 6.0f);
    const auto dy = random_vector<TestType>(n, 2);
    device_vector<TestType> dx_in(x), ddy(dy), dout(n), dgrad(n);
    cuda::gelu_forward(dx_in.get(), dout.get(), static_cast<std::int64_t>(n), nullptr);
    cuda::gelu_backward(dx_in.get(), ddy.get(), dgrad.get(), static_cast<std::int64_t>(n), nullptr);
    std::vector<float> want_y(n), want_dx(n);
    for (std::size_t i = 0; i < n; ++i) {
        const float xi = static_cast<float>(x[i]);
        want_y[i] = stored<TestType>(host::detail::gelu_value(xi));
        want_dx[i] = stored<TestType>(static_cast<float>(dy[i]) * host::detail::gelu_derivative(xi));
    }
    require_close(dout.download(), want_y, tolerance<TestType>(), 1e-7, "gelu");
    require_close(dgrad.download(), want_dx, tolerance<TestType>(), 1e-7, "gelu_backward");
    // Off 16-byte alignment (element by element then): the same values.
    device_vector<TestType> shifted(n);
    cuda::gelu_backward(dx_in.get() + 1, ddy.get() + 1, shifted.get() + 1, static_cast<std::int64_t>(n - 1), nullptr);
    auto got = shifted.download();
    got.erase(got.begin());
    require_close(got, std::vector<float>(want_dx.begin() + 1, want_dx.end()), tolerance<TestType>(), 1e-7,
                  "gelu_backward, unaligned");
}

TEMPLATE_TEST_CASE("add, scale and casts match the host twin", "[cuda][elementwise]", float, bfloat16) {
    const std::size_t n = 100003;
    const auto a = random_vector<TestType>(n, 3), b = random_vector<TestType>(n, 4);
    device_vector<TestType> da(a), db(b), dsum(n), dscaled(n);
    cuda::add(da.get(), db.get(), dsum.get(), static_cast<std::int64_t>(n), nullptr);
    cuda::scale(da.get(), 0.37f, dscaled.get(), static_cast<std::int64_t>(n), nullptr);
    std::vector<float> want_sum(n), want_scaled(n);
    for (std::size_t i = 0; i < n; ++i) {
        want_sum[i] = stored<TestType>(static_cast<float>(a[i]) + static_cast<float>(b[i]));
        want_scaled[i] = stored<TestType>(0.37f * static_cast<float>(a[i]));
    }
    // One float operation rounded once: exact.
    require_close(dsum.download(), want_sum, 0, 0, "add");
    require_close(dscaled.download(), want_scaled, 0, 0, "scale");
    // Off 16-byte alignment (the sum then runs element by element): the same sums.
    device_vector<TestType> shifted(n);
    cuda::add(da.get() + 1, db.get() + 1, shifted.get() + 1, static_cast<std::int64_t>(n - 1), nullptr);
    auto got = shifted.download();
    got.erase(got.begin());
    require_close(got, std::vector<float>(want_sum.begin() + 1, want_sum.end()), 0, 0, "add, unaligned");
}

TEST_CASE("casts between float and bf16 round to nearest even", "[cuda][elementwise]") {
    const std::size_t n = 4099;
    const auto x = random_vector<float>(n, 5, -100.0f, 100.0f);
    device_vector<float> dx(x), back(n);
    device_vector<bfloat16> narrow(n);
    cuda::cast(dx.get(), narrow.get(), static_cast<std::int64_t>(n), nullptr);
    cuda::cast(narrow.get(), back.get(), static_cast<std::int64_t>(n), nullptr);
    const auto got = narrow.download();
    for (std::size_t i = 0; i < n; ++i) REQUIRE(got[i] == bfloat16(x[i]));
    std::vector<float> want(n);
    for (std::size_t i = 0; i < n; ++i) want[i] = round_to_bfloat16(x[i]);
    require_close(back.download(), want, 0, 0, "cast back");
}
