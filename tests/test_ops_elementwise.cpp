// Forward values of the elementwise ops (gelu, relu, silu, softmax, dropout and their
// gradient ops) against references computed here in long double, for float and double
// executors; their shape and attribute errors; and the laws of dropout's mask.
//
// Tolerances, |out - ref| <= bound: a few ulp of the result, plus the rounding of the one
// intermediate each formula is ill-conditioned in, times the result's sensitivity to it.
//   double  gelu: 1e-15 (|x| + |ref|). PyTorch's formula 0.5 x (1 + tanh u) rounds 1 + tanh u,
//           an error absolute in x, not relative to a small gelu(x < 0); gelu_grad likewise
//           1e-15 |dy| (1 + |x| + |x|^3).
//           silu: 1e-15 |ref|. silu_grad: 1e-15 |dy| (s + |x s (1-s)|), as 1 + x (1 - s) cancels
//           near x = -1.28. softmax: 1e-15 ref + 2.3e-16 |x - max| ref, the rounding of x - max.
//           softmax_grad: 1e-15 (|ref| + max|dy| y).
//   float   gelu: 2e-7 |ref| for x >= 0 (the GPT MLP's hot path, computed as x sigmoid(2u));
//           for x < 0 plus 3e-7 |x s (1-s) z|, the rounding of z = 2u to float (gelu is
//           ill-conditioned there), and 1e-36 absolute: sigmoids below 2^-126 flush to 0.
//           gelu_grad, silu, silu_grad: 3e-7 |ref| + 3e-7 |x f'(x)|.
//           softmax: 1e-6 ref + 1.2e-7 |x - max| ref. softmax_grad: 1e-6 |ref| + 1e-7 max|dy| y.
//   relu, relu_grad and dropout are exact.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/autograd/autograd.hpp>
#include <loom/graph/builder.hpp>
#include <loom/ops/all.hpp>
#include <loom/runtime/compile.hpp>
#include <loom/runtime/host/bound_storage.hpp>
#include <loom/runtime/host/executor.hpp>
#include <loom/runtime/host/kernels/dropout.hpp>
#include <loom/runtime/host/kernels/gelu.hpp>
#include <loom/runtime/host/kernels/vector_math.hpp>

using namespace loom;

namespace {

using ld = long double;

shape dims(std::initializer_list<std::int64_t> extents) {
    static const dim_id names[] = {Dim::Batch::id, Dim::Seq::id, Dim::Hidden::id, Dim::FFN::id};
    shape s;
    std::size_t a = 0;
    for (std::int64_t e : extents) s.push_back({names[a++], e});
    return s;
}

// Runs `build` (inputs named in `values`) forward in T; returns the output's values.
template <class T, class Build>
std::vector<T> run_forward(Build&& build, const std::map<std::string, std::vector<double>>& values,
                           std::uint64_t step = 0) {
    graph_builder b;
    tensor y = build(b);
    graph g = std::move(b).take();
    program p = compile_program(
        g, {.prec = std::is_same_v<T, float> ? precision::f32 : precision::f64, .include_backward = false, .outputs = {y.id}});
    host::executor<T> ex(p);
    host::bound_storage<T> st(p);
    st.bind_to(ex);
    for (const auto& [name, v] : values) {
        auto s = st.real(name);
        REQUIRE(s.size() == v.size());
        for (std::size_t i = 0; i < v.size(); ++i) s[i] = static_cast<T>(v[i]);
    }
    ex.run(step);
    auto out = st.real(y.id);
    return {out.begin(), out.end()};
}

// n values spread over [lo, hi] in a scrambled order, plus exact zeros and +-tiny values.
std::vector<double> spread(std::size_t n, double lo, double hi) {
    std::vector<double> v(n);
    for (std::size_t i = 0; i < n; ++i) {
        const std::size_t k = (i * 7919) % n;
        v[i] = lo + (hi - lo) * static_cast<double>(k) / static_cast<double>(n - 1);
    }
    if (n > 4) {
        v[1] = 0.0;
        v[2] = 1e-30;
        v[3] = -1e-30;
    }
    return v;
}

std::vector<double> normal_values(std::size_t n, double scale, std::uint64_t seed) {
    std::vector<double> v(n);
    std::uint64_t s = seed;
    auto uniform = [&] {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return (static_cast<double>(s >> 11) + 0.5) * 0x1.0p-53;
    };
    for (auto& x : v) x = scale * std::sqrt(-2 * std::log(uniform())) * std::cos(6.283185307179586 * uniform());
    return v;
}

// The input as the executor holds it: rounded to T.
template <class T>
ld held(double x) {
    return static_cast<ld>(static_cast<T>(x));
}

// Exact functions (0.5 (1 + tanh u) written as 1 / (1 + exp(-2u)), which does not cancel).
ld gelu_ref(ld x) {
    const ld u = 0.797884560802865355879892119868763737L * (x + 0.044715L * x * x * x);
    return x / (1 + std::exp(-2 * u));
}
// d gelu / dz times z: how much rounding z = 2u moves gelu (x s (1 - s) z).
ld gelu_z_sensitivity(ld x) {
    const ld z = 2 * 0.797884560802865355879892119868763737L * (x + 0.044715L * x * x * x);
    return x * z / ((1 + std::exp(-z)) * (1 + std::exp(z)));
}
ld gelu_derivative_ref(ld x) {
    const ld z = 2 * 0.797884560802865355879892119868763737L * (x + 0.044715L * x * x * x);
    const ld dz = 2 * 0.797884560802865355879892119868763737L * (1 + 3 * 0.044715L * x * x);
    const ld s = 1 / (1 + std::exp(-z));
    const ld one_minus_s = 1 / (1 + std::exp(z));
    return s + x * s * one_minus_s * dz;
}
ld gelu_second_ref(ld x) {
    const ld h = 1e-6L * (1 + std::fabs(x));
    return (gelu_derivative_ref(x + h) - gelu_derivative_ref(x - h)) / (2 * h);
}
ld sigmoid_ref(ld x) { return 1 / (1 + std::exp(-x)); }
ld silu_ref(ld x) { return x * sigmoid_ref(x); }
ld silu_derivative_ref(ld x) {
    const ld s = sigmoid_ref(x);
    return s * (1 + x * (1 / (1 + std::exp(x))));
}
ld silu_second_ref(ld x) {
    const ld h = 1e-6L * (1 + std::fabs(x));
    return (silu_derivative_ref(x + h) - silu_derivative_ref(x - h)) / (2 * h);
}

template <class T>
constexpr bool is_float = std::is_same_v<T, float>;

}  // namespace

TEMPLATE_TEST_CASE("gelu matches the tanh approximation", "[ops][elementwise]", float, double) {
    using T = TestType;
    const auto x = spread(3 * 7 * 101, -12.0, 12.0);
    auto y = run_forward<T>([](graph_builder& b) { return ops::gelu(b.input("x", dims({3, 7, 101}))); }, {{"x", x}});
    for (std::size_t i = 0; i < x.size(); ++i) {
        const ld xi = held<T>(x[i]);
        const ld ref = gelu_ref(xi);
        const ld err = std::fabs(static_cast<ld>(y[i]) - ref);
        ld bound;
        if constexpr (is_float<T>)
            bound = 2e-7L * std::fabs(ref) + (xi < 0 ? 3e-7L * std::fabs(gelu_z_sensitivity(xi)) + 1e-36L : 0.0L);
        else
            bound = 1e-15L * (std::fabs(xi) + std::fabs(ref));
        INFO("x = " << static_cast<double>(xi) << " gelu = " << y[i] << " reference " << static_cast<double>(ref));
        REQUIRE(err <= bound);
    }
}

TEST_CASE("float gelu stays accurate over a dense sweep of one million inputs", "[ops][elementwise]") {
    // A million points of [-10, 10], step 2e-5; the x >= 0 half must be within 2e-7 relative.
    const std::size_t n = 1'000'001;
    std::vector<double> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = -10.0 + 20.0 * static_cast<double>(i) / static_cast<double>(n - 1);
    auto y = run_forward<float>([&](graph_builder& b) { return ops::gelu(b.input("x", dims({static_cast<std::int64_t>(n)}))); },
                                {{"x", x}});
    double worst_positive = 0, worst_negative = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const ld xi = held<float>(x[i]);
        const ld ref = gelu_ref(xi);
        const ld err = std::fabs(static_cast<ld>(y[i]) - ref);
        if (xi >= 0) {
            if (ref != 0) worst_positive = std::max(worst_positive, static_cast<double>(err / std::fabs(ref)));
        } else {
            const ld bound = 2e-7L * std::fabs(ref) + 3e-7L * std::fabs(gelu_z_sensitivity(xi));
            worst_negative = std::max(worst_negative, static_cast<double>(err / bound));
        }
    }
    INFO("float gelu: worst relative error for x >= 0: " << worst_positive
                                                         << "; worst error / bound for x < 0: " << worst_negative);
    CHECK(worst_positive <= 2e-7);
    CHECK(worst_negative <= 1.0);
}

TEST_CASE("exp_nonpositive is within 1e-7 relative of exp and handles the edges", "[ops][elementwise]") {
    double worst = 0;
    for (int i = 0; i <= 2'000'000; ++i) {
        const float x = static_cast<float>(-87.33 * i / 2'000'000.0);
        const ld ref = std::exp(static_cast<ld>(x));
        worst = std::max(worst, static_cast<double>(std::fabs(host::exp_nonpositive(x) - ref) / ref));
    }
    INFO("exp_nonpositive: worst relative error " << worst);
    CHECK(worst <= 1e-7);
    CHECK(host::exp_nonpositive(0.0f) == 1.0f);
    CHECK(host::exp_nonpositive(-0.0f) == 1.0f);
    CHECK(host::exp_nonpositive(-90.0f) == 0.0f);
    CHECK(host::exp_nonpositive(-std::numeric_limits<float>::infinity()) == 0.0f);
    CHECK(std::isnan(host::exp_nonpositive(std::numeric_limits<float>::quiet_NaN())));
}

TEMPLATE_TEST_CASE("gelu_grad is dy * gelu'(x)", "[ops][elementwise]", float, double) {
    using T = TestType;
    const auto x = spread(5 * 67, -9.0, 9.0);
    const auto dy = normal_values(x.size(), 1.0, 3);
    auto dx = run_forward<T>(
        [](graph_builder& b) { return ops::gelu_grad(b.input("dy", dims({5, 67})), b.input("x", dims({5, 67}))); },
        {{"dy", dy}, {"x", x}});
    for (std::size_t i = 0; i < x.size(); ++i) {
        const ld xi = held<T>(x[i]), dyi = held<T>(dy[i]);
        const ld ref = dyi * gelu_derivative_ref(xi);
        ld bound;
        if constexpr (is_float<T>)
            bound = 3e-7L * std::fabs(ref) + 3e-7L * std::fabs(dyi * xi * gelu_second_ref(xi)) + 1e-30L;
        else
            bound = 1e-15L * std::fabs(dyi) * (1 + std::fabs(xi) + std::fabs(xi * xi * xi));
        INFO("x = " << static_cast<double>(xi) << " dy = " << static_cast<double>(dyi) << " dx = " << dx[i]
                    << " reference " << static_cast<double>(ref));
        REQUIRE(std::fabs(static_cast<ld>(dx[i]) - ref) <= bound);
    }
}

TEMPLATE_TEST_CASE("relu and relu_grad are exact, with gradient 0 at x == 0", "[ops][elementwise]", float, double) {
    using T = TestType;
    auto x = spread(4 * 33, -3.0, 3.0);
    x[5] = -0.0;
    const auto dy = normal_values(x.size(), 1.0, 5);
    auto y = run_forward<T>([](graph_builder& b) { return ops::relu(b.input("x", dims({4, 33}))); }, {{"x", x}});
    auto dx = run_forward<T>(
        [](graph_builder& b) { return ops::relu_grad(b.input("dy", dims({4, 33})), b.input("x", dims({4, 33}))); },
        {{"dy", dy}, {"x", x}});
    for (std::size_t i = 0; i < x.size(); ++i) {
        const T xi = static_cast<T>(x[i]);
        CHECK(y[i] == (xi > 0 ? xi : T(0)));
        CHECK(dx[i] == (xi > 0 ? static_cast<T>(dy[i]) : T(0)));
    }
    CHECK(dx[1] == 0);  // x == 0 exactly
    const T nan = std::numeric_limits<T>::quiet_NaN();
    auto y_nan = run_forward<T>([](graph_builder& b) { return ops::relu(b.input("x", dims({1}))); }, {{"x", {nan}}});
    CHECK(std::isnan(y_nan[0]));
}

TEMPLATE_TEST_CASE("silu and silu_grad match x sigmoid(x) without overflow", "[ops][elementwise]", float, double) {
    using T = TestType;
    auto x = spread(3 * 45, -30.0, 30.0);
    x[7] = -100.0;  // exp(-x) would overflow float
    x[8] = 100.0;
    x[9] = -800.0;  // and double
    const auto dy = normal_values(x.size(), 1.0, 9);
    auto y = run_forward<T>([](graph_builder& b) { return ops::silu(b.input("x", dims({3, 45}))); }, {{"x", x}});
    auto dx = run_forward<T>(
        [](graph_builder& b) { return ops::silu_grad(b.input("dy", dims({3, 45})), b.input("x", dims({3, 45}))); },
        {{"dy", dy}, {"x", x}});
    for (std::size_t i = 0; i < x.size(); ++i) {
        const ld xi = held<T>(x[i]), dyi = held<T>(dy[i]);
        const ld ref = silu_ref(xi), dref = dyi * silu_derivative_ref(xi);
        ld bound, dbound;
        if constexpr (is_float<T>) {
            bound = 3e-7L * std::fabs(ref) + 3e-7L * std::fabs(xi * silu_derivative_ref(xi)) + 1e-38L;
            dbound = 3e-7L * std::fabs(dref) + 3e-7L * std::fabs(dyi * xi * silu_second_ref(xi)) + 1e-38L;
        } else {
            bound = 1e-15L * std::fabs(ref) + 1e-300L;
            const ld si = sigmoid_ref(xi);
            dbound = 1e-15L * std::fabs(dyi) * (si + std::fabs(xi * si * (1 - si))) + 1e-300L;
        }
        INFO("x = " << static_cast<double>(xi) << " silu = " << y[i] << " reference " << static_cast<double>(ref)
                    << "; dx = " << dx[i] << " reference " << static_cast<double>(dref));
        REQUIRE(std::isfinite(y[i]));
        REQUIRE(std::isfinite(dx[i]));
        REQUIRE(std::fabs(static_cast<ld>(y[i]) - ref) <= bound);
        REQUIRE(std::fabs(static_cast<ld>(dx[i]) - dref) <= dbound);
    }
}

TEMPLATE_TEST_CASE("softmax normalizes the last dim, stably", "[ops][elementwise]", float, double) {
    using T = TestType;
    // Row lengths around the lane width (32), a length-1 row, and large logits.
    for (auto [rows, n, offset] : std::vector<std::tuple<std::int64_t, std::int64_t, double>>{
             {4, 1, 0.0}, {3, 5, 0.0}, {6, 37, 0.0}, {2, 64, 0.0}, {5, 100, 1000.0}, {3, 33, -2000.0}}) {
        auto x = normal_values(static_cast<std::size_t>(rows * n), 5.0, static_cast<std::uint64_t>(n));
        for (auto& v : x) v += offset;
        auto y = run_forward<T>([&](graph_builder& b) { return ops::softmax(b.input("x", dims({rows, n}))); },
                                {{"x", x}});
        for (std::int64_t r = 0; r < rows; ++r) {
            ld m = -std::numeric_limits<ld>::infinity();
            for (std::int64_t j = 0; j < n; ++j) m = std::max(m, held<T>(x[static_cast<std::size_t>(r * n + j)]));
            ld sum = 0;
            for (std::int64_t j = 0; j < n; ++j) sum += std::exp(held<T>(x[static_cast<std::size_t>(r * n + j)]) - m);
            for (std::int64_t j = 0; j < n; ++j) {
                const auto i = static_cast<std::size_t>(r * n + j);
                const ld shifted = held<T>(x[i]) - m;
                const ld ref = std::exp(shifted) / sum;
                const ld bound = is_float<T> ? (1e-6L + 1.2e-7L * std::fabs(shifted)) * ref + 1e-38L
                                             : (1e-15L + 2.3e-16L * std::fabs(shifted)) * ref + 1e-300L;
                INFO("rows " << rows << " n " << n << " offset " << offset << " element " << i << ": " << y[i]
                             << " reference " << static_cast<double>(ref));
                REQUIRE(std::fabs(static_cast<ld>(y[i]) - ref) <= bound);
            }
        }
    }
    // -inf logits (a mask) get exactly 0.
    const double inf = std::numeric_limits<double>::infinity();
    auto y = run_forward<T>([](graph_builder& b) { return ops::softmax(b.input("x", dims({1, 3}))); },
                            {{"x", {0.0, -inf, 1.0}}});
    CHECK(y[1] == 0);
    CHECK(static_cast<double>(y[0]) == Approx(1 / (1 + std::exp(1.0))).epsilon(1e-6));
    CHECK(static_cast<double>(y[2]) == Approx(std::exp(1.0) / (1 + std::exp(1.0))).epsilon(1e-6));
}

TEMPLATE_TEST_CASE("softmax_grad is y (dy - sum(dy y))", "[ops][elementwise]", float, double) {
    using T = TestType;
    const std::int64_t rows = 7, n = 45;
    auto logits = normal_values(static_cast<std::size_t>(rows * n), 2.0, 11);
    // y: a softmax of each row, so the test data look like what the backward sees.
    std::vector<double> y(logits.size());
    for (std::int64_t r = 0; r < rows; ++r) {
        double sum = 0;
        for (std::int64_t j = 0; j < n; ++j) sum += std::exp(logits[static_cast<std::size_t>(r * n + j)]);
        for (std::int64_t j = 0; j < n; ++j)
            y[static_cast<std::size_t>(r * n + j)] = std::exp(logits[static_cast<std::size_t>(r * n + j)]) / sum;
    }
    const auto dy = normal_values(y.size(), 1.0, 12);
    auto dx = run_forward<T>(
        [&](graph_builder& b) {
            return ops::softmax_grad(b.input("dy", dims({rows, n})), b.input("y", dims({rows, n})));
        },
        {{"dy", dy}, {"y", y}});
    for (std::int64_t r = 0; r < rows; ++r) {
        ld dot = 0, scale = 0;
        for (std::int64_t j = 0; j < n; ++j) {
            const auto i = static_cast<std::size_t>(r * n + j);
            dot += held<T>(dy[i]) * held<T>(y[i]);
            scale = std::max(scale, std::fabs(held<T>(dy[i])));
        }
        for (std::int64_t j = 0; j < n; ++j) {
            const auto i = static_cast<std::size_t>(r * n + j);
            const ld ref = held<T>(y[i]) * (held<T>(dy[i]) - dot);
            const ld bound = is_float<T> ? 1e-6L * std::fabs(ref) + 1e-7L * scale * held<T>(y[i])
                                         : 1e-15L * (std::fabs(ref) + scale * held<T>(y[i])) + 1e-300L;
            INFO("element " << i << ": " << dx[i] << " reference " << static_cast<double>(ref));
            REQUIRE(std::fabs(static_cast<ld>(dx[i]) - ref) <= bound);
        }
    }
}

TEST_CASE("elementwise ops report shape and attribute errors when the graph is built", "[ops][elementwise]") {
    graph_builder b;
    auto dy = b.input("dy", dims({3, 4}));
    auto x_rows = b.input("x_rows", dims({2, 4}));
    auto x_rank = b.input("x_rank", dims({3, 4, 1}));
    CHECK_THROWS_AS(ops::gelu_grad(dy, x_rows), shape_error);
    CHECK_THROWS_WITH(ops::gelu_grad(dy, x_rows), Catch::Contains("gelu_grad 'gelu_grad'") &&
                                                      Catch::Contains("'x_rows'") && Catch::Contains("is 2") &&
                                                      Catch::Contains("input 0 has 3"));
    CHECK_THROWS_WITH(ops::relu_grad(dy, x_rank), Catch::Contains("relu_grad") && Catch::Contains("'x_rank'") &&
                                                      Catch::Contains("leading (batch-like) axes must match"));
    CHECK_THROWS_WITH(ops::silu_grad(dy, x_rows), Catch::Contains("silu_grad") && Catch::Contains("'x_rows'"));
    auto tokens = b.input("tokens", dims({3, 4}), value_kind::index);
    CHECK_THROWS_WITH(ops::gelu(tokens), Catch::Contains("gelu 'gelu'") && Catch::Contains("'tokens'") &&
                                             Catch::Contains("index tensor"));

    auto scalar = b.input("scalar", shape{});
    CHECK_THROWS_AS(ops::softmax(scalar), shape_error);
    CHECK_THROWS_WITH(ops::softmax(scalar), Catch::Contains("softmax 'softmax'") && Catch::Contains("'scalar'") &&
                                                Catch::Contains("at least 1 axes"));
    auto y_wide = b.input("y_wide", dims({3, 5}));
    CHECK_THROWS_WITH(ops::softmax_grad(dy, y_wide), Catch::Contains("softmax_grad") && Catch::Contains("'y_wide'") &&
                                                         Catch::Contains("Seq=5") && Catch::Contains("'n' = 4"));

    for (double p : {1.0, 1.5, -0.1, std::numeric_limits<double>::quiet_NaN()}) {
        INFO("p = " << p);
        CHECK_THROWS_AS(ops::dropout(dy, p, 1), usage_error);
        CHECK_THROWS_WITH(ops::dropout(dy, p, 1), Catch::Contains("dropout 'dropout'") && Catch::Contains("p = ") &&
                                                      Catch::Contains("pass 0 <= p < 1"));
        CHECK_THROWS_WITH(ops::dropout_grad(dy, p, 1), Catch::Contains("dropout_grad"));
    }
    CHECK_THROWS_WITH(ops::dropout(dy, 1.0, 1), Catch::Contains("p = 1 is not a drop probability"));
    CHECK(b.view().nodes.empty());  // nothing was added by the failed calls
}

TEMPLATE_TEST_CASE("dropout keeps 1 - p of the elements, scaled by 1 / (1 - p)", "[ops][elementwise][dropout]", float,
                   double) {
    using T = TestType;
    const std::int64_t n = 1'000'000;
    const std::vector<double> ones(static_cast<std::size_t>(n), 1.0);
    for (double p : {0.1, 0.5, 0.9}) {
        auto y = run_forward<T>([&](graph_builder& b) { return ops::dropout(b.input("x", dims({1000, 1000})), p, 1234); },
                                {{"x", ones}}, 17);
        const T scale = T(1) / static_cast<T>(1.0 - p);
        std::int64_t kept = 0;
        bool values_exact = true;
        for (T v : y) {
            kept += v != 0;
            values_exact = values_exact && (v == 0 || v == scale);
        }
        const double sigma = std::sqrt(p * (1 - p) / static_cast<double>(n));
        const double fraction = static_cast<double>(kept) / static_cast<double>(n);
        INFO("p = " << p << ": kept fraction " << fraction << ", expected " << 1 - p << " +- " << 4 * sigma);
        CHECK(std::fabs(fraction - (1 - p)) <= 4 * sigma);
        CHECK(values_exact);
    }
}

TEST_CASE("dropout's mask is a pure function of seed, step and element index", "[ops][elementwise][dropout]") {
    const std::int64_t n = 200'003;  // odd: thread ranges end mid-block
    const double p = 0.3;
    const auto x = normal_values(static_cast<std::size_t>(n), 1.0, 21);
    auto run = [&](std::int64_t seed, std::uint64_t step) {
        return run_forward<double>([&](graph_builder& b) { return ops::dropout(b.input("x", dims({n})), p, seed); },
                                   {{"x", x}}, step);
    };
    auto kept = [](const std::vector<double>& y) {
        std::vector<bool> k(y.size());
        for (std::size_t i = 0; i < y.size(); ++i) k[i] = y[i] != 0;
        return k;
    };
    const auto a = run(5, 3);
    CHECK(run(5, 3) == a);  // same seed and step: same values, bit for bit

    // The kernel's mask is exactly host::dropout_mask, element by element.
    const host::dropout_mask mask(5, 3, p);
    const double scale = 1.0 / (1.0 - p);
    bool matches = true;
    for (std::int64_t i = 0; i < n; ++i) {
        const auto k = static_cast<std::size_t>(i);
        matches = matches && a[k] == (mask.keeps(static_cast<std::uint64_t>(i)) ? x[k] * scale : 0.0);
    }
    CHECK(matches);

    // Another step or another seed: a different, independent mask. Two independent masks agree
    // on a fraction p^2 + (1-p)^2 of the elements.
    const auto ka = kept(a);
    for (auto [seed, step] : {std::pair<std::int64_t, std::uint64_t>{5, 4}, {6, 3}, {-5, 3}}) {
        const auto kb = kept(run(seed, step));
        std::int64_t agree = 0;
        for (std::size_t i = 0; i < ka.size(); ++i) agree += ka[i] == kb[i];
        const double q = p * p + (1 - p) * (1 - p);
        const double sigma = std::sqrt(q * (1 - q) / static_cast<double>(n));
        INFO("seed " << seed << " step " << step << ": agreement " << static_cast<double>(agree) / static_cast<double>(n));
        CHECK(kb != ka);
        CHECK(std::fabs(static_cast<double>(agree) / static_cast<double>(n) - q) <= 4 * sigma);
    }

    // float draws the same mask as double.
    const auto f = run_forward<float>([&](graph_builder& b) { return ops::dropout(b.input("x", dims({n})), p, 5); },
                                      {{"x", x}}, 3);
    std::vector<bool> kf(f.size());
    for (std::size_t i = 0; i < f.size(); ++i) kf[i] = f[i] != 0 || x[i] == 0;
    CHECK(kf == ka);
}

TEMPLATE_TEST_CASE("dropout with p = 0 is an exact identity; dropout_grad reuses the forward mask",
                   "[ops][elementwise][dropout]", float, double) {
    using T = TestType;
    const auto x = normal_values(3 * 1001, 1.0, 31);
    auto y = run_forward<T>([](graph_builder& b) { return ops::dropout(b.input("x", dims({3, 1001})), 0.0, 9); },
                            {{"x", x}}, 5);
    for (std::size_t i = 0; i < x.size(); ++i) REQUIRE(y[i] == static_cast<T>(x[i]));

    // The backward of dropout is dropout_grad with the same p and seed, and at the same step it
    // keeps exactly the elements the forward kept.
    graph_builder b;
    auto w = b.parameter("w", dims({3, 1001}), parameter_init::normal(1.0));
    b.set_loss(ops::sum(ops::dropout(w, 0.25, 77)));
    build_backward(b);
    const graph& g = b.view();
    const node* grad = nullptr;
    for (const auto& nd : g.nodes)
        if (is_op<ops::DropoutGrad>(nd)) grad = &nd;
    REQUIRE(grad);
    CHECK(grad->attrs.get<double>("p") == 0.25);
    CHECK(grad->attrs.get<std::int64_t>("seed") == 77);

    auto forward = run_forward<T>([](graph_builder& bb) { return ops::dropout(bb.input("x", dims({3, 1001})), 0.25, 77); },
                                  {{"x", x}}, 8);
    auto backward = run_forward<T>(
        [](graph_builder& bb) { return ops::dropout_grad(bb.input("x", dims({3, 1001})), 0.25, 77); }, {{"x", x}}, 8);
    CHECK(forward == backward);
}

TEST_CASE("every vector build of the elementwise loop gives the baseline loop's values bit for bit",
          "[ops][elementwise]") {
    // A dense sweep through both signs, the tails and the exp cut-off, with a ragged end.
    const std::int64_t n = 200003;
    std::vector<float> x(static_cast<std::size_t>(n)), dy(x.size());
    for (std::int64_t i = 0; i < n; ++i) {
        x[static_cast<std::size_t>(i)] = -60.0f + 120.0f * static_cast<float>(i) / static_cast<float>(n);
        dy[static_cast<std::size_t>(i)] = std::sin(static_cast<float>(i));
    }
    const auto gelu = [](float* __restrict y, const float* __restrict a) {
        for (std::int64_t j = 0; j < host::simd_block; ++j) y[j] = host::detail::gelu_value(a[j]);
    };
    const auto gelu_grad = [](float* __restrict dx, const float* __restrict g, const float* __restrict a) {
        for (std::int64_t j = 0; j < host::simd_block; ++j) dx[j] = g[j] * host::detail::gelu_derivative(a[j]);
    };
    std::vector<float> base(x.size()), base_grad(x.size()), wide(x.size());
    host::detail::map_range(gelu, 0, n, base.data(), x.data());
    host::detail::map_range(gelu_grad, 0, n, base_grad.data(), dy.data(), x.data());
    for (host::cpu_isa isa : host::supported_cpu_isas()) {
        INFO("instruction set " << host::to_string(isa));
        host::detail::map_range_on(isa, gelu, 0, n, wide.data(), x.data());
        CHECK(base == wide);
        host::detail::map_range_on(isa, gelu_grad, 0, n, wide.data(), dy.data(), x.data());
        CHECK(base_grad == wide);
    }
}

TEMPLATE_TEST_CASE("sum_leading sums every column row by row, on ranges wider than its accumulator", "[ops][reduce]",
                   float, double) {
    // 3 x 37 rows and 1000 columns: the pool's column ranges exceed the kernel's 256-column
    // accumulator, and 1000 is not a multiple of 16. Each column is summed in row order, so
    // the kernel equals the same loop written out, bit for bit.
    using T = TestType;
    const std::int64_t rows = 3 * 37, columns = 1000;
    const auto x = normal_values(static_cast<std::size_t>(rows * columns), 1.0, 11);
    auto sums = run_forward<T>(
        [](graph_builder& b) { return ops::sum_leading(b.input("x", dims({3, 37, 1000}))); }, {{"x", x}});
    REQUIRE(static_cast<std::int64_t>(sums.size()) == columns);
    for (std::int64_t j = 0; j < columns; ++j) {
        T expected = 0;
        for (std::int64_t r = 0; r < rows; ++r) expected += static_cast<T>(x[static_cast<std::size_t>(r * columns + j)]);
        INFO("column " << j);
        REQUIRE(sums[static_cast<std::size_t>(j)] == expected);
    }
    // Every vector build of the column sums equals the baseline's bit for bit, a full block
    // of columns and a partial one alike (the kernel above runs only one of them).
    std::vector<T> values(x.begin(), x.end()), base(static_cast<std::size_t>(columns)), wide(base.size());
    for (host::cpu_isa isa : host::supported_cpu_isas()) {
        INFO("instruction set " << host::to_string(isa));
        for (std::int64_t j0 : {std::int64_t{0}, std::int64_t{256}, std::int64_t{768}}) {
            const std::int64_t width = std::min(host::detail::sum_columns_block, columns - j0);
            host::detail::sum_columns(values.data(), columns, rows, j0, width, base.data());
            host::detail::sum_columns_on(isa, values.data(), columns, rows, j0, width, wide.data());
        }
        CHECK(base == wide);
    }
}
