// Optimizers, clipping and the schedule against their defining formulas; the trainer on a
// small GPT: gradients against central differences, determinism, loss that falls, and
// clear errors for bad feeds.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include <loom/models/gpt.hpp>
#include <loom/train/trainer.hpp>

#include "support/gradcheck.hpp"
#include "support/model_gradcheck.hpp"

using namespace loom;

TEST_CASE("sgd follows torch.optim.SGD's update", "[optim]") {
    for (bool nesterov : {false, true}) {
        std::vector<double> p{1.0, -2.0}, g{0.5, 0.25};
        train::sgd<double> opt({.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = nesterov});
        opt.add({"p", p, g, true});
        // Reference, written out: d = g + wd p; buf = d (first), mu buf + d; step = nesterov ? d + mu buf : buf
        std::vector<double> rp{1.0, -2.0}, buf{0, 0};
        for (int t = 0; t < 4; ++t) {
            g = {0.5 - 0.1 * t, 0.25 + 0.2 * t};
            opt.step();
            for (int i = 0; i < 2; ++i) {
                double d = g[static_cast<std::size_t>(i)] + 0.01 * rp[static_cast<std::size_t>(i)];
                buf[static_cast<std::size_t>(i)] = t == 0 ? d : 0.9 * buf[static_cast<std::size_t>(i)] + d;
                rp[static_cast<std::size_t>(i)] -= 0.1 * (nesterov ? d + 0.9 * buf[static_cast<std::size_t>(i)] : buf[static_cast<std::size_t>(i)]);
                CHECK(p[static_cast<std::size_t>(i)] == Approx(rp[static_cast<std::size_t>(i)]).epsilon(1e-14));
            }
        }
    }
    CHECK_THROWS_WITH(train::sgd<double>({.momentum = 0, .nesterov = true}), Catch::Contains("nesterov"));
}

TEST_CASE("adamw follows torch.optim.AdamW's update", "[optim]") {
    std::vector<double> p{0.3, -0.7, 1.1}, g(3);
    std::vector<double> bias{0.2}, gb{0.0};
    train::adamw<double> opt({.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1});
    opt.add({"w", p, g, true});
    opt.add({"b", bias, gb, false});
    std::vector<double> rp = p, m(3, 0), v(3, 0);
    for (int t = 1; t <= 5; ++t) {
        for (int i = 0; i < 3; ++i) g[static_cast<std::size_t>(i)] = std::sin(t + i);
        gb[0] = 0.5;
        opt.step();
        for (std::size_t i = 0; i < 3; ++i) {
            rp[i] *= 1 - 0.01 * 0.1;
            m[i] = 0.8 * m[i] + 0.2 * g[i];
            v[i] = 0.95 * v[i] + 0.05 * g[i] * g[i];
            double mhat = m[i] / (1 - std::pow(0.8, t)), vhat = v[i] / (1 - std::pow(0.95, t));
            rp[i] -= 0.01 * mhat / (std::sqrt(vhat) + 1e-6);
            CHECK(p[i] == Approx(rp[i]).epsilon(1e-12));
        }
    }
    // No decay on the bias: a constant gradient moves it by lr per step exactly (|mhat/sqrt(vhat)| = 1).
    CHECK(bias[0] == Approx(0.2 - 5 * 0.01 * 0.5 / (0.5 + 1e-6)).epsilon(1e-9));
    CHECK_THROWS_WITH(train::adamw<double>({.beta1 = 1.0}), Catch::Contains("betas"));
}

TEST_CASE("adamw in float: the vectorized update is bit for bit the scalar formula", "[optim]") {
    // 40009 elements: several parallel ranges, and a tail that is not a multiple of 16.
    const std::size_t n = 40009;
    std::vector<float> p(n), g(n);
    for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
    std::vector<float> rp = p, m(n, 0.0f), v(n, 0.0f);
    const train::adamw_options o{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
    train::adamw<float> opt(o);
    opt.add({"w", p, g, true});
    for (int t = 1; t <= 4; ++t) {
        for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>(std::cos(0.11 * static_cast<double>(i * t)) * 1e-2);
        opt.step();
        const auto b1 = static_cast<float>(o.beta1), b2 = static_cast<float>(o.beta2), eps = static_cast<float>(o.eps);
        const auto step_size = static_cast<float>(o.lr / (1 - std::pow(o.beta1, t)));
        const auto bias2_sqrt = static_cast<float>(std::sqrt(1 - std::pow(o.beta2, t)));
        const auto decay = static_cast<float>(1 - o.lr * o.weight_decay);
        std::size_t differing = 0;
        for (std::size_t i = 0; i < n; ++i) {
            rp[i] *= decay;
            m[i] = b1 * m[i] + (1 - b1) * g[i];
            v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
            rp[i] -= step_size * m[i] / (std::sqrt(v[i]) / bias2_sqrt + eps);
            differing += p[i] != rp[i] || opt.first_moment(0)[i] != m[i] || opt.second_moment(0)[i] != v[i];
        }
        CHECK(differing == 0);
    }
}

TEST_CASE("global-norm clipping scales every gradient by max_norm / norm as the optimizer reads it", "[optim]") {
    std::vector<float> a{3, 0}, b{0, 4};
    std::vector<std::span<float>> grads{a, b};
    CHECK(train::global_norm(grads) == Approx(5.0));
    CHECK(train::clip_scale(5.0, 1.0) == Approx(1.0 / (5.0 + 1e-6)));
    CHECK(train::clip_scale(5.0, 10.0) == 1.0);  // under the limit: untouched
    CHECK(train::clip_scale(5.0, 0.0) == 1.0);   // no clipping
    // An optimizer step with a scale is the step on the scaled gradient, bit for bit, in the
    // vectorized body (40009 elements) and the scalar tail alike; the gradient is left as it was.
    const std::size_t n = 40009;
    std::vector<float> g(n), scaled(n), p(n), q(n);
    for (std::size_t i = 0; i < n; ++i) {
        g[i] = static_cast<float>(std::cos(0.23 * static_cast<double>(i)));
        p[i] = q[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
    }
    const double scale = train::clip_scale(train::global_norm(std::vector<std::span<float>>{g}), 1.0);
    REQUIRE(scale < 0.01);
    for (std::size_t i = 0; i < n; ++i) scaled[i] = g[i] * static_cast<float>(scale);
    const std::vector<float> original = g;
    train::adamw<float> fused({.lr = 1e-2}), separate({.lr = 1e-2});
    fused.add({"w", p, g, true});
    separate.add({"w", q, scaled, true});
    train::sgd<float> fused_sgd({.lr = 0.1, .weight_decay = 0.01}), separate_sgd({.lr = 0.1, .weight_decay = 0.01});
    std::vector<float> ps = p, qs = q;
    fused_sgd.add({"w", ps, g, true});
    separate_sgd.add({"w", qs, scaled, true});
    for (int t = 0; t < 3; ++t) {
        fused.step(1e-2, scale);
        separate.step(1e-2);
        fused_sgd.step(0.1, scale);
        separate_sgd.step(0.1);
    }
    CHECK(p == q);
    CHECK(fused.first_moment(0) == separate.first_moment(0));
    CHECK(fused.second_moment(0) == separate.second_moment(0));
    CHECK(ps == qs);
    CHECK(g == original);
}

TEST_CASE("the gradients' sum of squares is the same in every vector build as in the baseline, bit for bit",
          "[optim]") {
    std::vector<float> x(100003);
    for (std::size_t i = 0; i < x.size(); ++i)
        x[i] = static_cast<float>(std::sin(0.7 * static_cast<double>(i)) * std::pow(10.0, static_cast<double>(i % 9) - 4));
    for (host::cpu_isa isa : host::supported_cpu_isas()) {
        for (std::int64_t n : {0, 1, 7, 8, 9, 4097, 40009, 100003}) {
            INFO("n = " << n << ", instruction set " << host::to_string(isa));
            CHECK(train::detail::sum_of_squares_on(isa, x.data(), n) ==
                  train::detail::sum_of_squares_baseline(x.data(), n));
        }
    }
}

TEST_CASE("every vector build of the AdamW update is bit for bit the scalar loop", "[optim]") {
    // 40009 elements: a tail that is not a multiple of 8 or 16; gradients of mixed scale and a
    // clipping scale, so every operation of the update rounds.
    const std::int64_t n = 40009;
    const auto count = static_cast<std::size_t>(n);
    std::vector<float> p0(count), m0(count), v0(count), g(count);
    for (std::size_t i = 0; i < count; ++i) {
        p0[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
        m0[i] = static_cast<float>(std::cos(0.19 * static_cast<double>(i)) * 1e-3);
        v0[i] = static_cast<float>(1e-6 * (1.0 + std::sin(0.05 * static_cast<double>(i))));
        g[i] = static_cast<float>(std::cos(0.11 * static_cast<double>(i)) * std::pow(10.0, double(i % 5) - 3));
    }
    const train::detail::adamw_update<float> update{0.9997f, 0.9f, 0.999f, 3.1e-3f, 0.0447f, 1e-8f, 0.37f};
    std::vector<float> p = p0, m = m0, v = v0;
    update.scalar(p.data(), m.data(), v.data(), g.data(), 0, n);
    for (host::cpu_isa isa : host::supported_cpu_isas()) {
        INFO("instruction set " << host::to_string(isa));
        std::vector<float> p2 = p0, m2 = m0, v2 = v0;
        update.on(isa, p2.data(), m2.data(), v2.data(), g.data(), 0, n);
        CHECK(p2 == p);
        CHECK(m2 == m);
        CHECK(v2 == v);
    }
}

TEST_CASE("the learning-rate schedule warms up linearly and decays by a cosine", "[optim]") {
    train::lr_schedule s{.peak = 1.0, .min_lr = 0.1, .warmup_steps = 10, .total_steps = 110};
    CHECK(s.at(0) == Approx(0.1));
    CHECK(s.at(9) == Approx(1.0));
    CHECK(s.at(10) == Approx(1.0));
    CHECK(s.at(60) == Approx(0.55));
    CHECK(s.at(110) == Approx(0.1));
    CHECK(s.at(1000) == Approx(0.1));
}

namespace {
models::gpt_config tiny() {
    return {.layers = 2, .hidden = 16, .heads = 2, .vocab = 11, .seq = 6, .batch = 2};
}

train::input_feed feed_for(const models::gpt_config& c, std::vector<std::int32_t>& tokens,
                           std::vector<std::int32_t>& targets, std::vector<std::int32_t>& positions) {
    tokens.resize(static_cast<std::size_t>(c.batch * c.seq));
    targets.resize(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = static_cast<std::int32_t>((i * 7 + 3) % static_cast<std::size_t>(c.vocab));
        targets[i] = static_cast<std::int32_t>((i * 7 + 10) % static_cast<std::size_t>(c.vocab));  // next token
    }
    positions = models::gpt_positions(c);
    train::input_feed f;
    f.index["tokens"] = tokens;
    f.index["targets"] = targets;
    f.index["positions"] = positions;
    return f;
}
}  // namespace

TEST_CASE("the GPT graph has the parameters its config describes", "[gpt]") {
    for (bool tie : {true, false}) {
        auto c = tiny();
        c.tie_embeddings = tie;
        auto m = models::gpt(c);
        CHECK(m.ir().parameter_count() == c.parameter_count());
        REQUIRE(m.ir().repeats.size() == 1);
        CHECK(m.ir().repeats[0].scopes.size() == 2);
        CHECK(m.ir().find_tensor("blocks.1.mlp.fc.weight").has_value());
    }
    CHECK_THROWS_WITH(models::gpt({.hidden = 30, .heads = 4}), Catch::Contains("not divisible by heads"));
}

TEST_CASE("gradcheck: a whole GPT in float64", "[gpt][grad]") {
    for (bool tie : {true, false}) {
        auto c = tiny();
        c.tie_embeddings = tie;
        c.init_std = 0.3;  // larger than GPT-2's so every path carries a visible gradient
        std::vector<std::int32_t> tokens, targets, positions;
        auto feed = feed_for(c, tokens, targets, positions);
        train::trainer<double> t(models::gpt(c).training_graph(), {});
        INFO((tie ? "tied" : "untied"));
        const int checked = testing::check_model_gradients(t, feed, 12);
        CHECK(checked > 150);
    }
}

TEST_CASE("training a GPT is deterministic and the loss falls", "[gpt][train]") {
    auto c = tiny();
    std::vector<std::int32_t> tokens, targets, positions;
    auto feed = feed_for(c, tokens, targets, positions);
    auto run = [&](std::uint64_t seed) {
        train::trainer_options o;
        o.schedule.peak = 1e-2;
        o.init_seed = seed;
        train::trainer<float> t(models::gpt(c).training_graph(), o);
        std::vector<double> losses;
        for (int s = 0; s < 40; ++s) losses.push_back(t.step(feed).loss);
        return losses;
    };
    auto a = run(3), b = run(3), other = run(4);
    CHECK(a == b);  // bit-identical
    CHECK(a != other);
    CHECK(a.front() == Approx(std::log(11.0)).epsilon(0.1));
    // A fixed batch whose targets are a function of the tokens: it must be learned.
    CHECK(a.back() < 0.2 * a.front());
}

TEST_CASE("the trainer rejects bad feeds with the tensor named", "[train]") {
    auto c = tiny();
    train::trainer<float> t(models::gpt(c).training_graph(), {});
    std::vector<std::int32_t> tokens, targets, positions;
    auto feed = feed_for(c, tokens, targets, positions);
    auto missing = feed;
    missing.index.erase("targets");
    CHECK_THROWS_WITH(t.step(missing), Catch::Contains("no data fed for input 'targets'"));
    std::vector<std::int32_t> short_tokens(3, 0);
    auto wrong = feed;
    wrong.index["tokens"] = short_tokens;
    CHECK_THROWS_WITH(t.step(wrong), Catch::Contains("'tokens'") && Catch::Contains("12 elements") &&
                                         Catch::Contains("3 were fed"));
    std::vector<std::int32_t> bad_ids = tokens;
    bad_ids[5] = 99;
    auto out_of_range = feed;
    out_of_range.index["tokens"] = bad_ids;
    CHECK_THROWS_WITH(t.step(out_of_range), Catch::Contains("99"));
    graph_builder b;
    auto x = b.parameter("x", {{Dim::Hidden::id, 3}}, parameter_init::ones());
    b.set_loss(ops::sum(x));
    CHECK_THROWS_WITH(train::trainer<float>(std::move(b).take(), {}), Catch::Contains("build_backward"));
}

TEST_CASE("a profiled step times every instruction once and computes the same step", "[train][profile]") {
    auto c = tiny();
    std::vector<std::int32_t> tokens, targets, positions;
    auto feed = feed_for(c, tokens, targets, positions);
    train::trainer<float> plain(models::gpt(c).training_graph(), {}), profiled(models::gpt(c).training_graph(), {});
    host::op_profile profile;
    for (int s = 0; s < 2; ++s) {
        const auto a = plain.step(feed);
        const auto b = profiled.step(feed, s == 1 ? &profile : nullptr);
        CHECK(a.loss == b.loss);  // timing changes nothing
        CHECK(a.grad_norm == b.grad_norm);
    }
    const auto weights_plain = plain.parameter("blocks.0.mlp.fc.weight");
    const auto weights_profiled = profiled.parameter("blocks.0.mlp.fc.weight");
    CHECK(std::equal(weights_plain.begin(), weights_plain.end(), weights_profiled.begin()));

    std::int64_t calls = 0;
    double linear_flops = 0;
    std::map<std::string, std::int64_t> calls_by_kind;
    for (const auto& e : profile.by_time()) {
        calls += e.calls;
        calls_by_kind[e.kind] = e.calls;
        CHECK(e.seconds >= 0);
        if (e.kind == "linear" || e.kind == "linear_bias") linear_flops += e.flops;
    }
    // One entry per instruction of the program, plus the gradients' norm and the optimizer.
    CHECK(calls == static_cast<std::int64_t>(profiled.compiled().steps.size()) + 2);
    CHECK(calls_by_kind["optimizer"] == 1);
    CHECK(calls_by_kind["gradient_norm"] == 1);
    CHECK(calls_by_kind["attention"] == c.layers);
    // The forward linear layers are the model's FLOPs less attention's.
    const double t = static_cast<double>(c.batch * c.seq), h = static_cast<double>(c.hidden),
                 f = static_cast<double>(c.ffn_size());
    CHECK(linear_flops == Approx(c.forward_flops() - static_cast<double>(c.layers) * 2 * t * static_cast<double>(c.seq) * h));
    CHECK(linear_flops == Approx(static_cast<double>(c.layers) * 2 * t * (4 * h * h + 2 * h * f) +
                                 2 * t * h * static_cast<double>(c.vocab)));
    // A second profiled step adds to the same entries.
    profiled.step(feed, &profile);
    CHECK(profile.by_time().front().calls % 2 == 0);
}
