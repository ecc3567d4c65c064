// Float64 gradient checks of matmul (three layouts), transpose, reshape, split/merge heads
// and attention (causal and not; through attention_grad), each against central differences.
#include <catch2/catch.hpp>

#include <loom/autograd/autograd.hpp>
#include <loom/ops/all.hpp>

#include "support/gradcheck.hpp"

using namespace loom;
using loom::testing::check_gradients;

namespace {

shape bhsd(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) {
    return {{Dim::Batch::id, b}, {Dim::Head::id, h}, {Dim::Seq::id, s}, {Dim::HeadDim::id, d}};
}
shape lead_matrix(std::int64_t lead, std::int64_t rows, std::int64_t cols) {
    if (lead == 0) return {{Dim::Seq::id, rows}, {Dim::Hidden::id, cols}};
    return {{Dim::Batch::id, lead}, {Dim::Seq::id, rows}, {Dim::Hidden::id, cols}};
}

}  // namespace

TEST_CASE("gradcheck: matmul, matmul_nt, matmul_tn", "[grad][matmul]") {
    for (std::int64_t lead : {0, 1, 3}) {
        auto report = check_gradients([lead](graph_builder& b) {
            auto a = b.parameter("a", lead_matrix(lead, 4, 3), parameter_init::normal(1.0));
            auto bn = b.parameter("b_nn", lead_matrix(lead, 3, 5), parameter_init::normal(1.0));
            auto bt = b.parameter("b_nt", lead_matrix(lead, 5, 3), parameter_init::normal(1.0));
            auto at = b.parameter("a_tn", lead_matrix(lead, 3, 4), parameter_init::normal(1.0));
            return std::vector{ops::matmul(a, bn), ops::matmul_nt(a, bt), ops::matmul_tn(at, bn)};
        });
        CHECK(report.checked == 54 * std::max<std::int64_t>(lead, 1));
    }
    // Both operands the same tensor: the two gradient contributions add up.
    check_gradients([](graph_builder& b) {
        auto a = b.parameter("a", lead_matrix(2, 5, 5), parameter_init::normal(1.0));
        return std::vector{ops::matmul(a, a), ops::matmul_nt(a, a), ops::matmul_tn(a, a)};
    });
}

TEST_CASE("gradcheck: transpose and reshape", "[grad][shapes]") {
    check_gradients([](graph_builder& b) {
        auto x = b.parameter("x", lead_matrix(2, 3, 5), parameter_init::normal(1.0));
        auto r = ops::reshape(x, {{Dim::Seq::id, 6}, {Dim::Hidden::id, 5}});
        auto w = b.parameter("w", {{Dim::Hidden::id, 5}, {Dim::Seq::id, 6}}, parameter_init::normal(1.0));
        // The products make every gradient element depend on the layout of x.
        return std::vector{ops::transpose(x), ops::matmul(r, w),
                           ops::reshape(ops::transpose(r), {{Dim::Hidden::id, 30}})};
    });
}

TEST_CASE("gradcheck: split_heads and merge_heads", "[grad][heads]") {
    check_gradients([](graph_builder& b) {
        auto x = b.parameter("x", {{Dim::Batch::id, 2}, {Dim::Seq::id, 3}, {Dim::Hidden::id, 6}},
                             parameter_init::normal(1.0));
        auto y = b.parameter("y", bhsd(2, 3, 3, 2), parameter_init::normal(1.0));
        auto heads = ops::split_heads(x, 3);
        return std::vector{heads, ops::merge_heads(y), ops::merge_heads(ops::mul(heads, y))};
    });
}

namespace {

struct attention_case {
    std::int64_t b, h, s, t, d, e;
    bool causal;
};

}  // namespace

TEST_CASE("gradcheck: attention, causal and not", "[grad][attention]") {
    const std::vector<attention_case> cases{
        {1, 2, 5, 5, 4, 3, true},
        {2, 1, 37, 37, 3, 2, true},  // crosses a query tile
        {1, 1, 1, 1, 2, 2, true},
        {1, 2, 6, 9, 4, 3, false},
        {1, 1, 35, 7, 2, 3, false},
    };
    for (const auto& c : cases) {
        INFO("b=" << c.b << " h=" << c.h << " s=" << c.s << " t=" << c.t << " d=" << c.d << " e=" << c.e
                  << " causal=" << c.causal);
        // Only `out` is probed: the backward does not propagate a gradient of lse.
        auto report = check_gradients([&c](graph_builder& b) {
            auto q = b.parameter("q", bhsd(c.b, c.h, c.s, c.d), parameter_init::normal(1.0));
            auto k = b.parameter("k", bhsd(c.b, c.h, c.t, c.d), parameter_init::normal(1.0));
            auto v = b.parameter("v", bhsd(c.b, c.h, c.t, c.e), parameter_init::normal(1.0));
            return std::vector{c.causal ? ops::causal_attention(q, k, v) : ops::attention(q, k, v, 0.7)};
        });
        CHECK(report.checked > 0);
    }
}

TEST_CASE("gradcheck: attention inside a head split of a projection", "[grad][attention]") {
    check_gradients([](graph_builder& b) {
        auto x = b.parameter("x", {{Dim::Batch::id, 2}, {Dim::Seq::id, 7}, {Dim::Hidden::id, 4}},
                             parameter_init::normal(1.0));
        auto wq = b.parameter("wq", {{Dim::Hidden::id, 4}, {Dim::Hidden::id, 4}}, parameter_init::normal(0.5));
        auto q = ops::split_heads(ops::linear(x, wq), 2);
        auto kv = ops::split_heads(x, 2);
        // q, k and v share parameters: attention's three gradients add up in x.
        return std::vector{ops::merge_heads(ops::causal_attention(q, kv, kv))};
    });
}

TEST_CASE("attention's backward is one attention_grad node and refuses a gradient of lse", "[grad][attention]") {
    {
        graph_builder b;
        auto q = b.parameter("q", bhsd(1, 1, 4, 2), parameter_init::normal(1.0));
        auto y = ops::causal_attention(q, q, q);
        b.set_loss(ops::sum(y));
        build_backward(b);
        int grads = 0;
        for (const auto& n : b.view().nodes) grads += is_op<ops::AttentionGrad>(n);
        CHECK(grads == 1);
    }
    {
        graph_builder b;
        auto q = b.parameter("q", bhsd(1, 1, 4, 2), parameter_init::normal(1.0));
        std::vector<tensor> ins{q, q, q};
        auto outs = b.apply<ops::Attention>(ins, {{"causal", std::int64_t{1}}, {"scale", 0.5}});
        b.set_loss(ops::add(ops::sum(outs[0]), ops::sum(outs[1])));
        CHECK_THROWS_AS(build_backward(b), usage_error);
    }
    {
        graph_builder b;
        auto q = b.parameter("q", bhsd(1, 1, 4, 2), parameter_init::normal(1.0));
        std::vector<tensor> ins{q, q, q};
        auto outs = b.apply<ops::Attention>(ins, {{"causal", std::int64_t{1}}, {"scale", 0.5}});
        b.set_loss(ops::sum(outs[1]));
        CHECK_THROWS_WITH(build_backward(b), Catch::Contains("log-sum-exp") && Catch::Contains("attention:1"));
    }
}

TEST_CASE("attention's forward and backward are deterministic in float", "[grad][attention]") {
    graph_builder b;
    auto q = b.parameter("q", bhsd(2, 3, 70, 16), parameter_init::normal(1.0));
    auto k = b.parameter("k", bhsd(2, 3, 70, 16), parameter_init::normal(1.0));
    auto v = b.parameter("v", bhsd(2, 3, 70, 16), parameter_init::normal(1.0));
    b.set_loss(ops::sum(ops::mul(ops::causal_attention(q, k, v), v)));
    build_backward(b);
    const graph& g = b.view();
    program p = compile_program(g, {.prec = precision::f32});
    auto run_once = [&] {
        host::executor<float> ex(p);
        host::bound_storage<float> st(p);
        st.bind_to(ex);
        for (tensor_id t : g.parameters) train::initialize(st.real(t), g.tensor(t).init, 3, g.tensor(t).name);
        ex.run();
        std::vector<std::vector<float>> grads;
        for (auto [param, grad] : g.gradients) grads.emplace_back(st.real(grad).begin(), st.real(grad).end());
        return grads;
    };
    auto first = run_once();
    for (int i = 0; i < 3; ++i) CHECK(run_once() == first);
}
