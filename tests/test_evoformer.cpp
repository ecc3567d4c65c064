// The Evoformer with recycling (models/evoformer.hpp) and the stop_gradient op: parameter
// count and scopes, stop_gradient's forward and (absent) backward, float64 gradients of the
// whole model against central differences, the recycled rounds treated as constants,
// deterministic training whose loss falls, and a data-parallel plan through the model.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <loom/models/evoformer.hpp>
#include <loom/partition/apply.hpp>
#include <loom/plan/presets.hpp>
#include <loom/runtime/comm/in_process.hpp>
#include <loom/train/distributed_trainer.hpp>
#include <loom/train/trainer.hpp>

#include "support/evoformer.hpp"
#include "support/gradcheck.hpp"
#include "support/model_gradcheck.hpp"

using namespace loom;

namespace {

models::evoformer_config tiny() {
    return {.batch = 2,
            .msa_seqs = 3,
            .residues = 4,
            .msa_channels = 8,
            .pair_channels = 4,
            .heads = 2,
            .blocks = 2,
            .recycles = 3,
            .bins = 5,
            .vocab = 6,
            .relpos_clip = 2,
            .outer_groups = 2,
            .outer_channels = 2,
            .transition_factor = 2};
}

std::vector<double> normal_values(std::size_t n, std::uint64_t seed) {
    std::vector<double> v(n);
    for (std::size_t i = 0; i < n; ++i) {
        const double u1 = (static_cast<double>(splitmix64(seed * 7919 + 2 * i) >> 11) + 0.5) * 0x1.0p-53;
        const double u2 = static_cast<double>(splitmix64(seed * 7919 + 2 * i + 1) >> 11) * 0x1.0p-53;
        v[i] = std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }
    return v;
}

bool starts_with(const std::string& s, std::string_view prefix) { return s.rfind(prefix, 0) == 0; }

// Runs `build` forward in T; returns the values of its output.
template <class T, class Build>
std::vector<T> run_forward(Build&& build, const std::vector<double>& input) {
    graph_builder b;
    tensor y = build(b);
    graph g = std::move(b).take();
    program p = compile_program(g, {.prec = std::is_same_v<T, float> ? precision::f32 : precision::f64,
                                    .include_backward = false,
                                    .outputs = {y.id}});
    host::executor<T> ex(p);
    host::bound_storage<T> st(p);
    st.bind_to(ex);
    auto x = st.real("x");
    REQUIRE(x.size() == input.size());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<T>(input[i]);
    ex.run();
    auto out = st.real(y.id);
    return {out.begin(), out.end()};
}

}  // namespace

TEST_CASE("the Evoformer graph has the parameters and scopes its config describes", "[evoformer]") {
    for (bool recycle_inputs : {false, true}) {
        auto c = tiny();
        c.recycle_inputs = recycle_inputs;
        auto m = models::evoformer(c);
        const graph& g = m.ir();
        CHECK(g.parameter_count() == c.parameter_count());
        CHECK((m.prev_msa != no_id) == recycle_inputs);
        // One repeat of rounds, and one repeat of blocks inside each round.
        REQUIRE(g.repeats.size() == static_cast<std::size_t>(1 + c.recycles));
        CHECK(g.repeats[0].name == "recycle");
        CHECK(g.repeats[0].scopes.size() == static_cast<std::size_t>(c.recycles));
        for (std::size_t r = 1; r < g.repeats.size(); ++r) {
            CHECK(g.repeats[r].name == "blocks");
            CHECK(g.scope_path(g.repeats[r].parent) == "recycle." + std::to_string(r - 1));
            CHECK(g.repeats[r].scopes.size() == static_cast<std::size_t>(c.blocks));
        }
        // Parameters are created once, outside the rounds.
        CHECK(g.find_tensor("blocks.1.msa_col.head.1.q.weight").has_value());
        CHECK(g.find_tensor("blocks.0.outer_product.group.1.a.bias").has_value());
        for (tensor_id p : g.parameters) CHECK_FALSE(starts_with(g.tensor(p).name, "recycle."));
        std::map<std::string, int> nodes;
        for (const node& n : g.nodes) ++nodes[n.name];
        CHECK(nodes.count("recycle.2.blocks.1.pair_col.head.1/attention"));
        CHECK(nodes.count("recycle.0.input/stop_gradient"));
        CHECK(m.round_msa.size() == static_cast<std::size_t>(c.recycles));
    }
    auto c = tiny();
    c.heads = 3;
    CHECK_THROWS_WITH(models::evoformer(c), Catch::Contains("msa_channels 8 is not divisible by heads 3"));
    c = tiny();
    c.pair_channels = 6;
    c.heads = 4;
    CHECK_THROWS_WITH(models::evoformer(c), Catch::Contains("pair_channels 6 is not divisible by heads 4"));
    c = tiny();
    c.recycles = 0;
    CHECK_THROWS_WITH(models::evoformer(c), Catch::Contains("recycles is 0"));
    c = tiny();
    c.bins = 1;
    CHECK_THROWS_WITH(models::evoformer(c), Catch::Contains("bins is 1"));
    c = tiny();
    c.layer_norm_eps = -1;
    CHECK_THROWS_WITH(models::evoformer(c), Catch::Contains("layer_norm_eps"));
}

TEST_CASE("every round reads the same parameters and only the last round is differentiated", "[evoformer]") {
    auto c = tiny();
    auto model = models::evoformer(c);
    const graph& built = model.ir();
    // A block parameter is read in every round.
    const tensor_id q = *built.find_tensor("blocks.0.msa_row.head.0.q.weight");
    std::vector<int> reads(static_cast<std::size_t>(c.recycles), 0);
    const auto consumers = built.consumers();
    for (node_id n : consumers[static_cast<std::size_t>(q)])
        for (std::int64_t r = 0; r < c.recycles; ++r)
            if (starts_with(built.at(n).name, "recycle." + std::to_string(r) + "."))
                ++reads[static_cast<std::size_t>(r)];
    for (int count : reads) CHECK(count == 1);

    // "Round 2, layers 1..1", as a pipeline plan selects it.
    plan::selector s;
    s.scope = "recycle.2.*";
    s.repeat = "blocks";
    s.first_layer = 1;
    s.last_layer = 1;
    int selected = 0;
    for (const node& n : built.nodes)
        if (s.matches(built, n)) {
            ++selected;
            CHECK(starts_with(n.name, "recycle.2.blocks.1."));
        }
    CHECK(selected > 50);

    graph g = std::move(model).training_graph();
    int last_round = 0;
    for (const node& n : g.nodes) {
        if (!n.backward) continue;
        const std::string path = g.scope_path(n.scope);
        INFO("backward node " << n.name);
        CHECK_FALSE(starts_with(path, "recycle.0"));
        CHECK_FALSE(starts_with(path, "recycle.1"));
        last_round += starts_with(path, "recycle.2") ? 1 : 0;
    }
    CHECK(last_round > 100);
}

TEMPLATE_TEST_CASE("stop_gradient's kernel copies its input", "[ops][stop_gradient]", float, double) {
    const auto x = normal_values(2 * 3 * 5, 11);
    auto y = run_forward<TestType>(
        [](graph_builder& b) {
            return ops::stop_gradient(b.input("x", {{Dim::Batch::id, 2}, {Dim::Seq::id, 3}, {Dim::Hidden::id, 5}}));
        },
        x);
    REQUIRE(y.size() == x.size());
    for (std::size_t i = 0; i < x.size(); ++i) CHECK(y[i] == static_cast<TestType>(x[i]));
}

TEST_CASE("gradcheck: stop_gradient passes no gradient", "[ops][stop_gradient][grad]") {
    // L = sum(p1 * x * sg(x)) + sum(p2 * sg(y)) + sum(p3 * y): the analytic gradients are those
    // of L with sg(x) and sg(y) held constant, dL/dx = p1 * x and dL/dy = p3.
    const shape s{{Dim::Batch::id, 2}, {Dim::Hidden::id, 3}};
    graph_builder b;
    tensor x = b.parameter("x", s, parameter_init::normal(1.0));
    tensor y = b.parameter("y", s, parameter_init::normal(1.0));
    tensor p1 = b.input("p1", s), p2 = b.input("p2", s), p3 = b.input("p3", s);
    tensor loss = ops::sum(x * ops::stop_gradient(x) * p1) + ops::sum(ops::stop_gradient(y) * p2) + ops::sum(y * p3);
    b.set_loss(loss);
    build_backward(b);
    graph g = std::move(b).take();
    for (const node& n : g.nodes)
        CHECK_FALSE((n.backward && n.forward_of != no_id && is_op<ops::StopGradient>(g.at(n.forward_of))));
    program p = compile_program(g, {.prec = precision::f64});
    host::executor<double> ex(p);
    host::bound_storage<double> st(p);
    st.bind_to(ex);
    train::initialize(st.real(x.id), parameter_init::normal(1.0), 3, "x");
    train::initialize(st.real(y.id), parameter_init::normal(1.0), 3, "y");
    for (const char* name : {"p1", "p2", "p3"}) train::initialize(st.real(name), parameter_init::normal(1.0), 4, name);
    ex.run();
    auto gx = st.real("grad/x"), gy = st.real("grad/y");
    auto xv = st.real(x.id), pv1 = st.real("p1"), pv3 = st.real("p3");
    for (std::size_t i = 0; i < gx.size(); ++i) {
        CHECK(gx[i] == Approx(pv1[i] * xv[i]).epsilon(1e-15));
        CHECK(gy[i] == pv3[i]);
    }
    // And through the gradcheck harness: a stopped operand that no parameter reaches.
    auto report = testing::check_gradients([](graph_builder& gb) {
        tensor w = gb.parameter("w", {{Dim::Batch::id, 2}, {Dim::Hidden::id, 3}}, parameter_init::normal(1.0));
        tensor c = gb.input("c", {{Dim::Batch::id, 2}, {Dim::Hidden::id, 3}});
        return std::vector{w * ops::stop_gradient(c), ops::stop_gradient(c)};
    });
    CHECK(report.checked == 6);
}

TEST_CASE("swap_middle_axes moves [b, x, y, c] to [b, y, x, c], and its gradient back", "[evoformer][grad]") {
    const std::int64_t B = 2, X = 3, Y = 4, C = 5;
    const shape s{{Dim::Batch::id, B}, {Dim::Seq::id, X}, {Dim::Head::id, Y}, {Dim::Hidden::id, C}};
    const auto x = normal_values(static_cast<std::size_t>(B * X * Y * C), 5);
    auto y = run_forward<double>(
        [&](graph_builder& b) { return models::detail::evo::swap_middle_axes(b.input("x", s)); }, x);
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t i = 0; i < X; ++i)
            for (std::int64_t j = 0; j < Y; ++j)
                for (std::int64_t k = 0; k < C; ++k)
                    CHECK(y[static_cast<std::size_t>(((b * Y + j) * X + i) * C + k)] ==
                          x[static_cast<std::size_t>(((b * X + i) * Y + j) * C + k)]);
    testing::check_gradients([&](graph_builder& b) {
        return std::vector{models::detail::evo::swap_middle_axes(b.parameter("x", s, parameter_init::normal(1.0)))};
    });
}


TEST_CASE("gradcheck: a whole Evoformer round in float64", "[evoformer][grad]") {
    // One round, with the recycled values fed as inputs: no stop_gradient reaches a
    // parameter, so central differences of the loss are the gradient.
    auto c = tiny();
    c.recycles = 1;
    c.recycle_inputs = true;
    c.init_std = 0.3;  // larger than usual so every path carries a visible gradient
    auto data = models::evoformer_synthetic_batch(c, 1);
    auto feed = testing::evoformer_feed(data);
    const auto prev_msa =
        normal_values(static_cast<std::size_t>(c.batch * c.msa_seqs * c.residues * c.msa_channels), 21);
    const auto prev_pair =
        normal_values(static_cast<std::size_t>(c.batch * c.residues * c.residues * c.pair_channels), 22);
    feed.real["prev_msa"] = prev_msa;
    feed.real["prev_pair"] = prev_pair;
    train::trainer<double> t(models::evoformer(c).training_graph(), {});
    CHECK(testing::check_model_gradients(t, feed) > 600);
}

TEST_CASE("with three rounds, the gradient is the last round's with the recycled values held constant",
          "[evoformer][grad]") {
    auto c = tiny();
    c.init_std = 0.3;
    const std::uint64_t seed = 1234;
    auto data = models::evoformer_synthetic_batch(c, 2);
    auto feed = testing::evoformer_feed(data);

    // The three-round model, reading round 1's outputs (what round 2 recycles).
    auto full = models::evoformer(c);
    const tensor_id msa1 = full.round_msa.at(1), pair1 = full.round_pair.at(1);
    const tensor_id inputs[] = {full.msa, full.pair_left, full.pair_right, full.relpos, full.targets};
    const std::vector<std::int32_t>* values[] = {&data.msa, &data.pair_left, &data.pair_right, &data.relpos,
                                                 &data.targets};
    graph g = std::move(full).training_graph();
    program p = compile_program(g, {.prec = precision::f64, .outputs = {msa1, pair1}});
    host::executor<double> ex(p);
    host::bound_storage<double> st(p);
    st.bind_to(ex);
    for (tensor_id t : g.parameters) train::initialize(st.real(t), g.tensor(t).init, seed, g.tensor(t).name);
    for (std::size_t i = 0; i < 5; ++i) std::copy(values[i]->begin(), values[i]->end(), st.index(inputs[i]).begin());
    ex.run();
    const double full_loss = st.real(g.loss)[0];
    std::map<std::string, std::vector<double>> full_grad;
    for (auto [param, grad] : g.gradients)
        full_grad[g.tensor(param).name].assign(st.real(grad).begin(), st.real(grad).end());
    const std::vector<double> recycled_msa(st.real(msa1).begin(), st.real(msa1).end());
    const std::vector<double> recycled_pair(st.real(pair1).begin(), st.real(pair1).end());

    // One round fed round 1's outputs as constants: the same parameters, by name.
    auto one = c;
    one.recycles = 1;
    one.recycle_inputs = true;
    train::trainer_options o;
    o.init_seed = seed;
    train::trainer<double> last(models::evoformer(one).training_graph(), o);
    auto fed = feed;
    fed.real["prev_msa"] = recycled_msa;
    fed.real["prev_pair"] = recycled_pair;
    CHECK(last.evaluate(fed) == Approx(full_loss).epsilon(1e-13));
    REQUIRE(full_grad.size() == last.ir().parameters.size());
    for (const auto& [name, want] : full_grad) {
        auto got = last.gradient(name);
        REQUIRE(got.size() == want.size());
        for (std::size_t j = 0; j < want.size(); ++j) {
            INFO("parameter " << name << " element " << j);
            CHECK(got[j] == Approx(want[j]).epsilon(1e-10).margin(1e-13));
        }
    }
    // ... whose analytic gradient is right (central differences, nothing stopped in it) ...
    CHECK(testing::check_model_gradients(last, fed) > 600);

    // ... and differs from the derivative of the full three-round loss, which also moves
    // the recycled values: the test would not notice a stop_gradient that let gradients by.
    auto x = st.real(*g.find_tensor("blocks.0.msa_row.head.0.q.weight"));
    const auto& analytic = full_grad.at("blocks.0.msa_row.head.0.q.weight");
    double worst = 0;
    for (std::size_t j = 0; j < x.size(); ++j) {
        const double saved = x[j], h = 1e-6;
        x[j] = saved + h;
        ex.run();
        const double up = st.real(g.loss)[0];
        x[j] = saved - h;
        ex.run();
        const double down = st.real(g.loss)[0];
        x[j] = saved;
        const double numeric = (up - down) / (2 * h);
        worst = std::max(worst, std::abs(numeric - analytic[j]) / (1e-6 + std::abs(numeric)));
    }
    CHECK(worst > 1e-3);
}

TEST_CASE("training an Evoformer is deterministic and the loss falls", "[evoformer][train]") {
    auto c = tiny();
    auto data = models::evoformer_synthetic_batch(c, 3);
    auto feed = testing::evoformer_feed(data);
    auto run = [&](std::uint64_t seed) {
        train::trainer_options o;
        o.schedule.peak = 1e-2;
        o.init_seed = seed;
        train::trainer<float> t(models::evoformer(c).training_graph(), o);
        std::vector<double> losses;
        for (int s = 0; s < 30; ++s) losses.push_back(t.step(feed).loss);
        return losses;
    };
    auto a = run(3), b = run(3), other = run(4);
    CHECK(a == b);  // bit-identical
    CHECK(a != other);
    CHECK(a.front() == Approx(std::log(static_cast<double>(c.bins))).epsilon(0.1));
    CHECK(a.back() < 0.5 * a.front());
}

TEST_CASE("the synthetic batch is deterministic and in range", "[evoformer]") {
    auto c = tiny();
    auto a = models::evoformer_synthetic_batch(c, 9), b = models::evoformer_synthetic_batch(c, 9),
         other = models::evoformer_synthetic_batch(c, 10);
    CHECK(a.msa == b.msa);
    CHECK(a.targets == b.targets);
    CHECK(a.msa != other.msa);
    const auto pairs = static_cast<std::size_t>(c.batch * c.residues * c.residues);
    CHECK(a.msa.size() == static_cast<std::size_t>(c.batch * c.msa_seqs * c.residues));
    CHECK(a.targets.size() == pairs);
    CHECK(a.relpos.size() == pairs);
    for (auto t : a.msa) CHECK((t >= 0 && t < c.vocab));
    for (auto t : a.targets) CHECK((t >= 0 && t < c.bins));
    for (auto t : a.relpos) CHECK((t >= 0 && t < c.relpos_ids()));
    // Residue i's distance to itself is in the first class; relpos(i, i) is the middle id.
    CHECK(a.targets[0] == 0);
    CHECK(a.relpos[0] == c.relpos_clip);
    CHECK(a.pair_left[1] == a.msa[0]);
    CHECK(a.pair_right[1] == a.msa[1]);
    std::vector<std::int32_t> short_msa(3, 0);
    CHECK_THROWS_WITH(models::evoformer_pair_ids(c, short_msa), Catch::Contains("3 tokens"));
}

TEST_CASE("a data-parallel plan splits the batch through every op of the Evoformer", "[evoformer][plan]") {
    auto c = tiny();
    auto model = models::evoformer(c);
    // Every forward op binds a splittable Batch variable.
    for (const node& n : model.ir().nodes) {
        bool batch = false;
        for (const auto& v : n.sig.vars) batch = batch || (v.dim == Dim::Batch::id && v.splittable && !v.frozen);
        INFO("op " << n.op->name << " '" << n.name << "'");
        CHECK((batch && !n.op->opaque_layout));
    }
    const auto pg = partition::apply_plan(model.ir(), plan::resolve(plan::presets::data_parallel(2), model.ir()));
    auto data = models::evoformer_synthetic_batch(c, 4);
    auto feed = testing::evoformer_feed(data);
    train::trainer<double> single(std::move(model).training_graph(), {});
    std::vector<double> reference;
    for (int s = 0; s < 2; ++s) reference.push_back(single.step(feed).loss);
    std::vector<std::vector<double>> losses(2);
    comm::run_ranks(pg.world, [&](comm::communicator& comm) {
        train::distributed_trainer<double> rank(pg, comm, {});
        for (int s = 0; s < 2; ++s) losses[static_cast<std::size_t>(comm.rank())].push_back(rank.step(feed).loss);
    });
    for (const auto& per_rank : losses)
        for (std::size_t s = 0; s < reference.size(); ++s) CHECK(per_rank.at(s) == Approx(reference[s]).epsilon(1e-12));
}
