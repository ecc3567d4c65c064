// Float64 gradient checks of the core ops (linear family, add, mul, scale, sum, mean,
// identity), each against central differences.
#include <catch2/catch.hpp>

#include <loom/ops/all.hpp>

#include "support/gradcheck.hpp"

using namespace loom;
using loom::testing::check_gradients;

namespace {
shape bsh(std::int64_t b, std::int64_t s, std::int64_t h) { return {{Dim::Batch::id, b}, {Dim::Seq::id, s}, {Dim::Hidden::id, h}}; }
}  // namespace

TEST_CASE("gradcheck: linear and linear_bias", "[grad]") {
    auto report = check_gradients([](graph_builder& b) {
        auto x = b.parameter("x", bsh(2, 3, 5), parameter_init::normal(1.0));
        auto w = b.parameter("w", {{Dim::FFN::id, 7}, {Dim::Hidden::id, 5}}, parameter_init::normal(1.0));
        auto bias = b.parameter("b", {{Dim::FFN::id, 7}}, parameter_init::normal(1.0));
        return std::vector{ops::linear(x, w), ops::linear(x, w, bias)};
    });
    CHECK(report.checked == 30 + 35 + 7);
}

TEST_CASE("gradcheck: add, mul, scale, identity", "[grad]") {
    check_gradients([](graph_builder& b) {
        auto x = b.parameter("x", bsh(2, 3, 4), parameter_init::normal(1.0));
        auto y = b.parameter("y", bsh(2, 3, 4), parameter_init::normal(1.0));
        return std::vector{ops::add(x, y), ops::mul(x, y), ops::scale(x, -1.5), ops::identity(y), x * x};
    });
}

TEST_CASE("gradcheck: sum and mean", "[grad]") {
    check_gradients([](graph_builder& b) {
        auto x = b.parameter("x", bsh(2, 3, 4), parameter_init::normal(1.0));
        return std::vector{ops::sum(x), ops::mean(ops::mul(x, x))};
    });
}
