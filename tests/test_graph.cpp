// The expression graph: builder, scopes and repeats, shape errors at build time, autograd's
// structure, the memory planner and the executor.
#include <catch2/catch.hpp>

#include <loom/autograd/autograd.hpp>
#include <loom/graph/builder.hpp>
#include <loom/ops/all.hpp>
#include <loom/runtime/compile.hpp>
#include <loom/runtime/host/bound_storage.hpp>
#include <loom/runtime/memory_planner.hpp>

using namespace loom;

TEST_CASE("scopes name parameters and nodes; repeats are recorded", "[graph]") {
    graph_builder b;
    auto x = b.input("x", {{Dim::Batch::id, 2}, {Dim::Hidden::id, 4}});
    tensor h = x;
    b.repeat("blocks", 3, [&](std::int64_t i) {
        auto mlp = b.scope("mlp");
        auto w = b.parameter("w", {{Dim::Hidden::id, 4}, {Dim::Hidden::id, 4}}, parameter_init::normal(0.1));
        h = ops::linear(h, w);
        CHECK(w.name() == "blocks." + std::to_string(i) + ".mlp.w");
    });
    const graph& g = b.view();
    REQUIRE(g.repeats.size() == 1);
    CHECK(g.repeats[0].name == "blocks");
    CHECK(g.repeats[0].scopes.size() == 3);
    CHECK(g.nodes[1].name == "blocks.1.mlp/linear");
    CHECK(g.scopes[static_cast<std::size_t>(g.nodes[2].scope)].path == "blocks.2.mlp");
    CHECK(g.parameter_count() == 48);

    CHECK_THROWS_WITH(b.parameter("blocks.0.mlp.w", {{Dim::Hidden::id, 4}}, parameter_init::zeros()),
                      Catch::Contains("already exists"));
    CHECK_THROWS_WITH(b.input("bad", {{Dim::Batch::id, 0}}), Catch::Contains("must be positive"));
}

TEST_CASE("shape errors are caught when the graph is built", "[graph]") {
    graph_builder b;
    auto x = b.input("x", {{Dim::Batch::id, 2}, {Dim::Hidden::id, 4}});
    auto w = b.parameter("w", {{Dim::FFN::id, 8}, {Dim::Hidden::id, 5}}, parameter_init::normal(0.1));
    CHECK_THROWS_AS(ops::linear(x, w), shape_error);
    CHECK_THROWS_WITH(ops::linear(x, w), Catch::Contains("linear 'linear'") && Catch::Contains("'w'") &&
                                             Catch::Contains("Hidden=5") && Catch::Contains("'k' = 4"));
    auto y = b.input("y", {{Dim::Batch::id, 3}, {Dim::Hidden::id, 4}});
    CHECK_THROWS_WITH(ops::add(x, y), Catch::Contains("add") && Catch::Contains("'y'"));
    graph_builder other;
    auto z = other.input("z", {{Dim::Batch::id, 2}, {Dim::Hidden::id, 4}});
    CHECK_THROWS_WITH(ops::add(x, z), Catch::Contains("another graph_builder"));
    CHECK_THROWS_WITH(b.set_loss(x), Catch::Contains("reduce it to a scalar"));
}

TEST_CASE("autograd appends a backward pass with one gradient per parameter", "[autograd]") {
    graph_builder b;
    auto x = b.input("x", {{Dim::Batch::id, 2}, {Dim::Hidden::id, 4}});
    auto w = b.parameter("w", {{Dim::Hidden::id, 4}, {Dim::Hidden::id, 4}}, parameter_init::normal(0.1));
    auto unused = b.parameter("unused", {{Dim::Hidden::id, 4}}, parameter_init::normal(0.1));
    // w is read twice: its gradient must be the sum of two contributions.
    auto y = ops::linear(ops::linear(x, w), w);
    b.set_loss(ops::sum(y));
    build_backward(b);
    const graph& g = b.view();
    REQUIRE(g.gradients.size() == 2);
    const tensor_desc& gw = g.tensor(g.gradients[0].second);
    CHECK(gw.name == "grad/w");
    CHECK(gw.role == tensor_role::gradient);
    CHECK(g.at(gw.producer).op == &op_def_of<ops::Add>());
    CHECK(g.at(gw.producer).backward);
    const tensor_desc& gu = g.tensor(g.gradients[1].second);
    CHECK(g.at(gu.producer).op == &op_def_of<ops::FillLike>());
    // No gradient flows into the input x: no linear_grad_input for the first linear.
    int grad_inputs = 0;
    for (const auto& n : g.nodes) grad_inputs += n.op == &op_def_of<ops::LinearGradInput>();
    CHECK(grad_inputs == 1);
    CHECK_THROWS_WITH(build_backward(b), Catch::Contains("already has a backward pass"));
    (void)unused;
}

TEST_CASE("the memory planner reuses dead buffers and never overlaps live ones", "[memory]") {
    // A chain a -> b -> c -> d: at most two buffers live at once.
    std::vector<buffer_lifetime> chain{{1000, 0, 1}, {1000, 1, 2}, {1000, 2, 3}, {1000, 3, 3}};
    auto plan = plan_memory(chain);
    CHECK(plan.peak == 2 * 1024);
    CHECK(plan.lower_bound == 2 * 1024);
    CHECK(plan.unplanned == 4 * 1024);

    // Random lifetimes: no two live-overlapping buffers may overlap in bytes.
    std::uint64_t state = 42;
    auto next = [&] { return (state = state * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
    std::vector<buffer_lifetime> reqs;
    for (int i = 0; i < 300; ++i) {
        std::int64_t first = static_cast<std::int64_t>(next() % 100);
        reqs.push_back({static_cast<std::int64_t>(1 + next() % 5000), first, first + static_cast<std::int64_t>(next() % 20)});
    }
    auto p = plan_memory(reqs);
    for (std::size_t i = 0; i < reqs.size(); ++i)
        for (std::size_t j = i + 1; j < reqs.size(); ++j) {
            bool live_overlap = reqs[i].first <= reqs[j].last && reqs[j].first <= reqs[i].last;
            bool byte_overlap = p.offsets[i] < p.offsets[j] + reqs[j].bytes && p.offsets[j] < p.offsets[i] + reqs[i].bytes;
            INFO("buffers " << i << " and " << j);
            REQUIRE(!(live_overlap && byte_overlap));
        }
    CHECK(p.peak >= p.lower_bound);
    CHECK(p.peak < p.unplanned);
}

TEST_CASE("a program runs and its arena is smaller than one buffer per tensor", "[executor]") {
    graph_builder b;
    auto x = b.input("x", {{Dim::Batch::id, 3}, {Dim::Hidden::id, 4}});
    auto w = b.parameter("w", {{Dim::Hidden::id, 4}, {Dim::Hidden::id, 4}}, parameter_init::normal(0.1));
    tensor h = x;
    for (int i = 0; i < 6; ++i) h = ops::scale(h, 2.0);
    h = ops::linear(h, w);
    b.set_loss(ops::sum(h));
    build_backward(b);
    graph g = std::move(b).take();
    program p = compile_program(g, {.prec = precision::f64});
    CHECK(p.arena_bytes < p.unplanned_bytes);

    host::executor<double> ex(p);
    CHECK_THROWS_WITH(ex.run(), Catch::Contains("bind it first"));
    host::bound_storage<double> st(p);
    st.bind_to(ex);
    auto xs = st.real("x");
    auto ws = st.real("w");
    for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<double>(i);
    for (std::size_t i = 0; i < ws.size(); ++i) ws[i] = (i % 5 == 0) ? 1.0 : 0.0;  // w[i][j] = 1 where (4i+j)%5==0
    ex.run();
    // loss = sum_b sum_n sum_k 64 x[b,k] w[n,k] = 64 * sum_k (sum_b x[b,k]) (sum_n w[n,k])
    double expected = 0;
    for (int k = 0; k < 4; ++k) {
        double xsum = 0, wsum = 0;
        for (int r = 0; r < 3; ++r) xsum += xs[static_cast<std::size_t>(r * 4 + k)];
        for (int n = 0; n < 4; ++n) wsum += ws[static_cast<std::size_t>(n * 4 + k)];
        expected += 64 * xsum * wsum;
    }
    CHECK(st.real(g.loss)[0] == Approx(expected).epsilon(1e-12));
    // d loss / d w[n,k] = 64 * sum_b x[b,k]
    auto gw = st.real(g.gradients[0].second);
    for (int n = 0; n < 4; ++n)
        for (int k = 0; k < 4; ++k) {
            double xsum = 0;
            for (int r = 0; r < 3; ++r) xsum += xs[static_cast<std::size_t>(r * 4 + k)];
            CHECK(gw[static_cast<std::size_t>(n * 4 + k)] == Approx(64 * xsum).epsilon(1e-12));
        }

    CHECK_THROWS_WITH(host::executor<float>(p), Catch::Contains("compiled for f64"));
    // f16 is a precision the searcher plans in; its programs are sized (2 bytes per real) but
    // not run.
    const program half = compile_program(g, {.prec = precision::f16});
    CHECK(half.arena_bytes < p.arena_bytes);
    CHECK_THROWS_WITH(host::executor<float>(half), Catch::Contains("compile in f32 or f64 for the host"));
}
