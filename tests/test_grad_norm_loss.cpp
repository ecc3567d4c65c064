// Float64 gradient checks of layer_norm, rms_norm, embedding and cross_entropy, each against
// central differences, on several shapes (odd sizes, no leading dims, more than one row
// block), and chained the way a language model uses them.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <loom/ops/all.hpp>

#include "support/gradcheck.hpp"

using namespace loom;
using loom::testing::check_gradients;
using loom::testing::gradcheck_options;

namespace {

shape make_shape(std::vector<std::int64_t> extents, dim_id last) {
    static const dim_id leading[] = {Dim::Batch::id, Dim::Seq::id, Dim::Head::id};
    std::vector<axis> axes;
    for (std::size_t i = 0; i + 1 < extents.size(); ++i) axes.push_back({leading[i], extents[i]});
    axes.push_back({last, extents.back()});
    return shape(std::move(axes));
}
shape leading_shape(std::vector<std::int64_t> extents) {
    static const dim_id leading[] = {Dim::Batch::id, Dim::Seq::id, Dim::Head::id};
    std::vector<axis> axes;
    for (std::size_t i = 0; i < extents.size(); ++i) axes.push_back({leading[i], extents[i]});
    return shape(std::move(axes));
}

const std::vector<std::vector<std::int64_t>> norm_shapes{{7}, {2, 3, 5}, {3, 13}, {1, 1, 2}, {70, 3}};

// With a few hundred probed outputs the loss is O(10), and the default step of 1e-6 leaves a
// rounding error of about 1e-16 * 10 / 1e-6 = 1e-9 in each difference quotient, above the
// absolute tolerance for small gradients. A step of 1e-5 cuts that tenfold while the
// truncation error (step^2 times the third derivative) stays near 1e-10.
constexpr gradcheck_options options{.step = 1e-5};

}  // namespace

TEST_CASE("gradcheck: layer_norm", "[grad][norm]") {
    for (const auto& ext : norm_shapes) {
        for (double eps : {1e-5, 0.5}) {
            INFO("shape " << make_shape(ext, Dim::Hidden::id).to_string() << " eps " << eps);
            auto report = check_gradients([&](graph_builder& b) {
                const std::int64_t h = ext.back();
                auto x = b.parameter("x", make_shape(ext, Dim::Hidden::id), parameter_init::normal(1.0));
                auto gamma = b.parameter("gamma", {{Dim::Hidden::id, h}}, parameter_init::normal(1.0));
                auto beta = b.parameter("beta", {{Dim::Hidden::id, h}}, parameter_init::normal(1.0));
                return std::vector{ops::layer_norm(x, gamma, beta, eps)};
            }, {}, options);
            CHECK(report.checked > 0);
        }
    }
}

TEST_CASE("gradcheck: layer_norm where only some inputs need a gradient", "[grad][norm]") {
    // x is an input: only gamma and beta get gradients, through the same fused node.
    check_gradients([](graph_builder& b) {
        auto x = b.input("x", make_shape({3, 4, 6}, Dim::Hidden::id));
        auto gamma = b.parameter("gamma", {{Dim::Hidden::id, 6}}, parameter_init::normal(1.0));
        auto beta = b.parameter("beta", {{Dim::Hidden::id, 6}}, parameter_init::normal(1.0));
        return std::vector{ops::layer_norm(x, gamma, beta)};
    });
    // gamma and beta are inputs: only dx is used.
    check_gradients([](graph_builder& b) {
        auto x = b.parameter("x", make_shape({3, 6}, Dim::Hidden::id), parameter_init::normal(1.0));
        auto gamma = b.input("gamma", {{Dim::Hidden::id, 6}});
        auto beta = b.input("beta", {{Dim::Hidden::id, 6}});
        return std::vector{ops::layer_norm(x, gamma, beta)};
    });
}

TEST_CASE("gradcheck: rms_norm", "[grad][norm]") {
    for (const auto& ext : norm_shapes) {
        for (double eps : {1e-6, 0.5}) {
            INFO("shape " << make_shape(ext, Dim::Hidden::id).to_string() << " eps " << eps);
            check_gradients([&](graph_builder& b) {
                const std::int64_t h = ext.back();
                auto x = b.parameter("x", make_shape(ext, Dim::Hidden::id), parameter_init::normal(1.0));
                auto gamma = b.parameter("gamma", {{Dim::Hidden::id, h}}, parameter_init::normal(1.0));
                return std::vector{ops::rms_norm(x, gamma, eps)};
            }, {}, options);
        }
    }
    check_gradients([](graph_builder& b) {
        auto x = b.input("x", make_shape({2, 5, 4}, Dim::Hidden::id));
        auto gamma = b.parameter("gamma", {{Dim::Hidden::id, 4}}, parameter_init::normal(1.0));
        return std::vector{ops::rms_norm(x, gamma)};
    });
}

TEST_CASE("gradcheck: embedding with repeated ids", "[grad][embedding]") {
    struct config {
        std::vector<std::int64_t> lead;
        std::int64_t vocab, h;
    };
    for (const auto& cfg : std::vector<config>{{{2, 6}, 5, 3}, {{9}, 4, 1}, {{3, 2, 5}, 7, 4}, {{}, 3, 2}}) {
        INFO("ids " << leading_shape(cfg.lead).to_string() << " vocab " << cfg.vocab << " h " << cfg.h);
        check_gradients(
            [&](graph_builder& b) {
                auto ids = b.input("ids", leading_shape(cfg.lead), value_kind::index);
                auto table = b.parameter("table", {{Dim::Vocab::id, cfg.vocab}, {Dim::Hidden::id, cfg.h}},
                                         parameter_init::normal(1.0));
                auto y = ops::embedding(ids, table);
                // Squaring makes the gradient depend on the looked-up values too.
                return std::vector{y, ops::mul(y, y)};
            },
            [&](const std::string& name, std::span<std::int32_t> ids) {
                REQUIRE(name == "ids");
                // Ids cycle through the vocabulary except its last row, so ids repeat and one
                // row gets no gradient.
                for (std::size_t p = 0; p < ids.size(); ++p)
                    ids[p] = static_cast<std::int32_t>((p * 3 + 1) % static_cast<std::size_t>(cfg.vocab - 1));
            });
    }
}

TEST_CASE("gradcheck: cross_entropy with ignored positions", "[grad][loss]") {
    struct config {
        std::vector<std::int64_t> lead;
        std::int64_t v;
        std::int64_t ignore;
    };
    for (const auto& cfg : std::vector<config>{{{2, 5}, 7, -100}, {{3}, 2, -100}, {{4, 3}, 6, 1}, {{70}, 3, -100}}) {
        INFO("targets " << leading_shape(cfg.lead).to_string() << " v " << cfg.v << " ignore " << cfg.ignore);
        check_gradients(
            [&](graph_builder& b) {
                std::vector<std::int64_t> ext = cfg.lead;
                ext.push_back(cfg.v);
                auto logits = b.parameter("logits", make_shape(ext, Dim::Vocab::id), parameter_init::normal(2.0));
                auto targets = b.input("targets", leading_shape(cfg.lead), value_kind::index);
                return std::vector{ops::cross_entropy(logits, targets, cfg.ignore),
                                   ops::cross_entropy(logits, targets, cfg.ignore, 3.0)};
            },
            [&](const std::string& name, std::span<std::int32_t> targets) {
                REQUIRE(name == "targets");
                for (std::size_t p = 0; p < targets.size(); ++p)
                    targets[p] = p % 4 == 2 ? static_cast<std::int32_t>(cfg.ignore)
                                            : static_cast<std::int32_t>((p * 5 + 2) % static_cast<std::size_t>(cfg.v));
            },
            options);
    }
}

TEST_CASE("gradcheck: embedding, norms and cross_entropy chained as in a language model", "[grad]") {
    const std::int64_t vocab = 6, h = 5;
    check_gradients(
        [&](graph_builder& b) {
            auto tokens = b.input("tokens", leading_shape({2, 4}), value_kind::index);
            auto targets = b.input("targets", leading_shape({2, 4}), value_kind::index);
            auto wte = b.parameter("wte", {{Dim::Vocab::id, vocab}, {Dim::Hidden::id, h}}, parameter_init::normal(1.0));
            auto g1 = b.parameter("ln.gamma", {{Dim::Hidden::id, h}}, parameter_init::normal(1.0));
            auto b1 = b.parameter("ln.beta", {{Dim::Hidden::id, h}}, parameter_init::normal(1.0));
            auto g2 = b.parameter("rms.gamma", {{Dim::Hidden::id, h}}, parameter_init::normal(1.0));
            auto x = ops::embedding(tokens, wte);
            x = ops::add(x, ops::layer_norm(x, g1, b1));
            x = ops::rms_norm(x, g2);
            auto logits = ops::linear(x, wte);  // tied head: wte is read twice
            return std::vector{ops::cross_entropy(logits, targets)};
        },
        [&](const std::string& name, std::span<std::int32_t> ids) {
            const std::size_t shift = name == "tokens" ? 0 : 1;
            for (std::size_t p = 0; p < ids.size(); ++p)
                ids[p] = static_cast<std::int32_t>((p + shift) * 5 % static_cast<std::size_t>(vocab));
            if (name == "targets") ids[3] = -100;
        });
}

TEST_CASE("gradcheck: vocab_parallel_cross_entropy and its parts", "[grad][loss][vocab_parallel]") {
    struct config {
        std::vector<std::int64_t> lead;
        std::int64_t v, chunks, ignore;
    };
    for (const auto& cfg : std::vector<config>{{{2, 5}, 6, 3, -100}, {{3}, 4, 4, -100}, {{4, 3}, 6, 2, 1}, {{7}, 5, 1, -100}}) {
        INFO("targets " << leading_shape(cfg.lead).to_string() << " v " << cfg.v << " chunks " << cfg.chunks);
        check_gradients(
            [&](graph_builder& b) {
                std::vector<std::int64_t> ext = cfg.lead;
                ext.push_back(cfg.v);
                auto logits = b.parameter("logits", make_shape(ext, Dim::Vocab::id), parameter_init::normal(2.0));
                auto targets = b.input("targets", leading_shape(cfg.lead), value_kind::index);
                auto lse = ops::chunk_logsumexp(logits, cfg.chunks);
                auto z = ops::pick_target(logits, targets, cfg.ignore);
                // Two ragged chunks, the first longer (as a plan splits an odd vocabulary).
                auto ragged = ops::ragged_chunk_logsumexp(logits, {0, cfg.v / 2 + 1, cfg.v});
                return std::vector{ops::vocab_parallel_cross_entropy(logits, targets, cfg.chunks, cfg.ignore),
                                   ops::vocab_parallel_cross_entropy(logits, targets, cfg.chunks, cfg.ignore, 3.0),
                                   ops::mul(lse, lse), ops::mul(z, z), ops::mul(ragged, ragged)};
            },
            [&](const std::string& name, std::span<std::int32_t> targets) {
                REQUIRE(name == "targets");
                for (std::size_t p = 0; p < targets.size(); ++p)
                    targets[p] = p % 4 == 2 ? static_cast<std::int32_t>(cfg.ignore)
                                            : static_cast<std::int32_t>((p * 5 + 2) % static_cast<std::size_t>(cfg.v));
            },
            options);
    }
}
