// Property test: random legal plans for small random GPTs train exactly like one device.
// Each plan draws, per forward op, up to two nested splits among the op's legal ones and
// those a registered transformation makes (degrees dividing the extents, or any degree along
// an odd vocabulary, which is split into near-equal pieces), sometimes a replication factor, a random device for
// every piece (so pieces collide, scatter over non-contiguous devices, or leave devices
// idle), sometimes recompute; sometimes ZeRO. Two training steps in float64 must match
// one device's losses, gradient norms and parameters to 1e-9. ZeRO-1 and ZeRO-3 are drawn
// too; ZeRO-2 is left to the presets test (it needs data-parallel storage).
#include <catch2/catch.hpp>

#include <cstdio>
#include <random>

#include "support/plan_equivalence.hpp"

using namespace loom;

namespace {

std::vector<std::int64_t> divisors_above_one(std::int64_t n, std::int64_t limit) {
    std::vector<std::int64_t> d;
    for (std::int64_t k = 2; k <= std::min(n, limit); ++k)
        if (n % k == 0) d.push_back(k);
    return d;
}

// `uneven_vocabulary`: a vocabulary dim takes any degree up to its extent (plan::splits_unevenly),
// not only divisors.
plan::resolved_plan random_plan(const graph& g, int world, std::mt19937_64& rng, int& decomposed,
                                bool uneven_vocabulary = false) {
    auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
    plan::resolved_plan p;
    p.devices = world;
    // ZeRO-2 needs every device to store whole parameters, which random plans rarely do.
    p.zero = pick(6) == 0 ? (pick(2) ? plan::zero_stage::optimizer : plan::zero_stage::parameters) : plan::zero_stage::none;
    const std::size_t forward = g.forward_node_count();
    p.forward.resize(forward);
    for (std::size_t i = 0; i < forward; ++i) {
        const node& n = g.nodes[i];
        plan::op_partition op;
        std::vector<std::int64_t> cut(n.sig.vars.size(), 1);
        const std::size_t nested = n.op->opaque_layout ? 0 : pick(3);
        for (std::size_t k = 0; k < nested; ++k) {
            auto options = n.sig.legal_splits();
            // Frozen variables that a registered transformation cuts (row-parallel linear_bias,
            // vocabulary-parallel cross_entropy) are legal too.
            for (std::size_t v = 0; v < n.sig.vars.size(); ++v)
                if (n.sig.vars[v].frozen && plan::transformation_registry::instance().find(*n.op, n.sig.vars[v].label))
                    options.push_back(n.sig.effect_of_split(static_cast<int>(v)));
            if (options.empty()) break;
            const auto& s = options[pick(options.size())];
            const auto v = static_cast<std::size_t>(s.variable);
            auto degrees = divisors_above_one(n.sig.vars[v].extent / cut[v], 4);
            if (uneven_vocabulary && plan::splits_unevenly(n.sig.vars[v].dim)) {
                degrees.clear();
                for (std::int64_t k = 2; k <= std::min<std::int64_t>(n.sig.vars[v].extent / cut[v], 4); ++k) degrees.push_back(k);
            }
            if (degrees.empty()) continue;
            const std::int64_t d = degrees[pick(degrees.size())];
            cut[v] *= d;
            op.splits.push_back({s.dim, s.label, d});
            if (is_op<ops::CrossEntropy>(n) && s.label == "v") ++decomposed;
        }
        if (pick(4) == 0) op.replicas = 2;
        for (std::int64_t piece = 0; piece < op.pieces(); ++piece) op.devices.push_back(static_cast<int>(pick(static_cast<std::size_t>(world))));
        op.recompute = pick(8) == 0;
        p.forward[i] = op;
    }
    return p;
}

}  // namespace

TEST_CASE("random legal plans equal one-device training", "[plan][property]") {
    std::mt19937_64 rng(20261122);
    const int trials = 220;
    int tried = 0, transfers = 0, vocab_parallel = 0;
    for (int t = 0; t < trials; ++t) {
        auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
        models::gpt_config c;
        c.layers = 1 + static_cast<std::int64_t>(pick(2));
        c.hidden = std::vector<std::int64_t>{8, 16, 24}[pick(3)];
        c.heads = std::vector<std::int64_t>{2, 4}[pick(2)];
        c.vocab = std::vector<std::int64_t>{12, 16, 24}[pick(3)];
        c.seq = std::vector<std::int64_t>{4, 6, 8}[pick(3)];
        c.batch = std::vector<std::int64_t>{2, 3, 4}[pick(3)];
        c.dropout = pick(3) == 0 ? 0.2 : 0.0;
        c.tie_embeddings = pick(2) == 0;
        const int world = 1 + static_cast<int>(pick(4));
        auto model = models::gpt(c);
        const auto plan = random_plan(model.ir(), world, rng, vocab_parallel);
        testing::equivalence e;
        try {
            e = testing::compare_with_single_device<double>(c, plan, 2);
        } catch (const std::exception& ex) {
            FAIL("trial " << t << " (world " << world << "): " << ex.what());
        }
        INFO("trial " << t << ": world " << world << ", layers " << c.layers << ", hidden " << c.hidden << ", heads "
                      << c.heads << ", dropout " << c.dropout << ", zero " << static_cast<int>(plan.zero) << ": loss "
                      << e.loss << ", grad norm " << e.grad_norm << ", parameters " << e.parameters << " ("
                      << e.worst_parameter << ")");
        REQUIRE(e.loss <= 1e-9);
        REQUIRE(e.grad_norm <= 1e-9);
        REQUIRE(e.parameters <= 1e-9);
        ++tried;
        transfers += static_cast<int>(e.transfers);
    }
    std::printf("random plans: %d tried and equal to one device (%d transfers materialized, %d vocabulary cuts of the loss)\n",
                tried, transfers, vocab_parallel);
    CHECK(tried >= 200);
    CHECK(vocab_parallel >= 10);
}

TEST_CASE("random legal plans that split an odd vocabulary into near-equal pieces equal one-device training",
          "[plan][property][vocabulary]") {
    std::mt19937_64 rng(20260317);
    const int trials = 80;
    int tried = 0, uneven_losses = 0;
    for (int t = 0; t < trials; ++t) {
        auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
        models::gpt_config c;
        c.layers = 1;
        c.hidden = std::vector<std::int64_t>{8, 16}[pick(2)];
        c.heads = 2;
        c.vocab = std::vector<std::int64_t>{7, 11, 13, 23}[pick(4)];
        c.seq = std::vector<std::int64_t>{4, 6}[pick(2)];
        c.batch = std::vector<std::int64_t>{2, 4}[pick(2)];
        c.tie_embeddings = pick(2) == 0;
        const int world = 2 + static_cast<int>(pick(3));
        auto model = models::gpt(c);
        int loss_cuts = 0;
        const auto plan = random_plan(model.ir(), world, rng, loss_cuts, true);
        uneven_losses += loss_cuts;
        testing::equivalence e;
        try {
            e = testing::compare_with_single_device<double>(c, plan, 2);
        } catch (const std::exception& ex) {
            FAIL("trial " << t << " (world " << world << ", vocabulary " << c.vocab << "): " << ex.what());
        }
        INFO("trial " << t << ": world " << world << ", vocabulary " << c.vocab << ", zero " << static_cast<int>(plan.zero)
                      << ": loss " << e.loss << ", grad norm " << e.grad_norm << ", parameters " << e.parameters << " ("
                      << e.worst_parameter << ")");
        REQUIRE(e.loss <= 1e-9);
        REQUIRE(e.grad_norm <= 1e-9);
        REQUIRE(e.parameters <= 1e-9);
        ++tried;
    }
    std::printf("random plans over odd vocabularies: %d tried and equal to one device (%d vocabulary cuts of the loss)\n",
                tried, uneven_losses);
    CHECK(tried == trials);
    CHECK(uneven_losses >= 10);
}
