// Float64 gradient checks of the elementwise ops (gelu, relu, silu, softmax, dropout), each
// against central differences, on several shapes including odd sizes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include <loom/ops/all.hpp>
#include <loom/train/init.hpp>

#include "support/gradcheck.hpp"

using namespace loom;
using loom::testing::check_gradients;

namespace {
// Inputs spread wide (to reach the tails) make sum |out * probe| ~ 100, whose rounding noise
// eps |L| / step is ~1e-8 at the default step 1e-6: check them with a 10x step (truncation
// error step^2 f''' / 6 stays ~1e-11) and atol 1e-8. tests/test_ops_elementwise.cpp checks
// gelu_grad and silu_grad in the tails tightly.
constexpr testing::gradcheck_options wide_inputs{.step = 1e-5, .atol = 1e-8};

shape bsh(std::int64_t b, std::int64_t s, std::int64_t h) { return {{Dim::Batch::id, b}, {Dim::Seq::id, s}, {Dim::Hidden::id, h}}; }
shape rows(std::int64_t r, std::int64_t n) { return {{Dim::Batch::id, r}, {Dim::Hidden::id, n}}; }
shape flat(std::int64_t n) { return {{Dim::Hidden::id, n}}; }
}  // namespace

TEST_CASE("gradcheck: gelu", "[grad][elementwise]") {
    check_gradients([](graph_builder& b) {
        auto x = b.parameter("x", bsh(2, 3, 5), parameter_init::normal(1.0));
        auto one = b.parameter("one", flat(1), parameter_init::normal(1.0));
        return std::vector{ops::gelu(x), ops::gelu(one)};
    });
    check_gradients(
        [](graph_builder& b) {
            auto wide = b.parameter("wide", flat(37), parameter_init::normal(3.0));
            return std::vector{ops::gelu(wide)};
        },
        {}, wide_inputs);
}

TEST_CASE("gradcheck: relu, away from its kink", "[grad][elementwise]") {
    // relu is not differentiable at 0. The check initialises parameter "x" from normal(0, 1)
    // with seed 7 (gradcheck_options::seed); the values are recomputed here to make sure none lies
    // within 1e-3 of the kink, far beyond the difference step 1e-6.
    const shape s = bsh(3, 4, 7);
    std::vector<double> values(static_cast<std::size_t>(s.numel()));
    train::initialize(std::span<double>(values), parameter_init::normal(1.0), testing::gradcheck_options{}.seed, "x");
    const double nearest = std::ranges::min(values, {}, [](double v) { return std::fabs(v); });
    REQUIRE(std::fabs(nearest) > 1e-3);
    check_gradients([&](graph_builder& b) {
        auto x = b.parameter("x", s, parameter_init::normal(1.0));
        return std::vector{ops::relu(x)};
    });
}

TEST_CASE("gradcheck: silu", "[grad][elementwise]") {
    check_gradients([](graph_builder& b) {
        auto x = b.parameter("x", bsh(2, 3, 5), parameter_init::normal(1.0));
        return std::vector{ops::silu(x)};
    });
    check_gradients(
        [](graph_builder& b) {
            auto wide = b.parameter("wide", flat(41), parameter_init::normal(8.0));
            return std::vector{ops::silu(wide)};
        },
        {}, wide_inputs);
}

TEST_CASE("gradcheck: softmax", "[grad][elementwise]") {
    check_gradients([](graph_builder& b) {
        auto x = b.parameter("x", bsh(2, 3, 5), parameter_init::normal(1.0));
        auto long_rows = b.parameter("long_rows", rows(3, 37), parameter_init::normal(1.0));
        auto single = b.parameter("single", rows(4, 1), parameter_init::normal(1.0));  // y == 1: zero gradient
        auto peaked = b.parameter("peaked", rows(2, 9), parameter_init::normal(1.0));
        return std::vector{ops::softmax(x), ops::softmax(long_rows), ops::softmax(single),
                           ops::softmax(ops::scale(peaked, 10.0))};
    });
}

TEST_CASE("gradcheck: dropout at a fixed step", "[grad][elementwise]") {
    // gradcheck runs every pass at step 0, so forward and backward see one mask.
    check_gradients([](graph_builder& b) {
        auto x = b.parameter("x", bsh(2, 3, 5), parameter_init::normal(1.0));
        auto big = b.parameter("big", flat(999), parameter_init::normal(1.0));
        auto y = b.parameter("y", rows(3, 7), parameter_init::normal(1.0));
        return std::vector{ops::dropout(x, 0.3, 11), ops::dropout(big, 0.5, -4), ops::dropout(y, 0.0, 2),
                           ops::dropout(ops::gelu(y), 0.1, 3)};
    });
}

TEST_CASE("gradcheck: a chain of elementwise ops", "[grad][elementwise]") {
    check_gradients([](graph_builder& b) {
        auto x = b.parameter("x", bsh(2, 5, 33), parameter_init::normal(1.0));
        return std::vector{ops::softmax(ops::silu(ops::dropout(ops::gelu(x), 0.2, 5)))};
    });
}
