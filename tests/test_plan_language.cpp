// Property test over the whole plan language: random plans, each one value built from the
// parts a user writes (rules cutting ops within a stage's group, stages with random or even
// boundaries, micro-batches, every order, ZeRO, recompute of random layer ranges, Coshard,
// tensor and data parallelism inside the stages, the interlaced pipeline with its
// vocabulary-parallel embedding and head), on GPT, T5-style and Evoformer models. Each trains
// two float64 steps exactly like one device (1e-9 on losses, gradient norms and parameters).
// The mix drawn is printed, so CI's log shows what ran.
#include <catch2/catch.hpp>

#include <cstdio>
#include <map>
#include <random>
#include <string>

#include <loom/models/evoformer.hpp>
#include <loom/models/t5.hpp>
#include <loom/plan/presets.hpp>

#include "support/evoformer.hpp"
#include "support/plan_equivalence.hpp"
#include "support/t5_feed.hpp"

using namespace loom;

namespace {

using rng_t = std::mt19937_64;

std::size_t pick(rng_t& rng, std::size_t n) { return static_cast<std::size_t>(rng() % n); }

struct drawn {
    plan::plan_spec plan;
    std::string model;
};

// Stages of `layers` layers: random first layers (strictly increasing) or even.
void draw_stages(plan::plan_spec& p, std::int64_t layers, int stages, int group, rng_t& rng, bool even) {
    plan::stage_spec s;
    s.count = {stages, "", {}};
    s.devices_per_stage = {group, "", {}};
    if (!even && stages > 1) {
        std::vector<std::int64_t> cuts;
        for (std::int64_t l = 1; l < layers; ++l) cuts.push_back(l);
        std::shuffle(cuts.begin(), cuts.end(), rng);
        cuts.resize(static_cast<std::size_t>(stages - 1));
        std::sort(cuts.begin(), cuts.end());
        s.boundaries = cuts;
    }
    p.stages = s;
}

// Recompute a random range of the layers (or none).
void draw_recompute(plan::plan_spec& p, std::int64_t layers, rng_t& rng) {
    if (pick(rng, 3) != 0) return;
    plan::selector on;
    on.repeat = "blocks";
    on.first_layer = static_cast<std::int64_t>(pick(rng, static_cast<std::size_t>(layers)));
    on.last_layer = on.first_layer + static_cast<std::int64_t>(pick(rng, static_cast<std::size_t>(layers - on.first_layer)));
    if (pick(rng, 2) == 0) on.kinds = {&op_def_of<ops::Attention>()};  // selective: the attention core
    p.add({on, std::nullopt, std::nullopt, true, "recompute"});
}

// ZeRO-2 updates each gradient shard in the piece of the parameter its device stores, so it
// is refused where no stored piece holds the shard, Coshard's colocated pieces and the
// interlaced pipeline's vocabulary-parallel ends (apply_plan says to use ZeRO-3): not drawn
// there.
void draw_zero(plan::plan_spec& p, int group, rng_t& rng, bool colocated = false) {
    if (group < 2 || pick(rng, 3) != 0) return;
    const std::vector<int> stages = colocated ? std::vector<int>{1, 3} : std::vector<int>{1, 2, 3};
    p.zero = static_cast<plan::zero_stage>(stages[pick(rng, stages.size())]);
}

plan::order_policy linear_order(rng_t& rng) {
    return {pick(rng, 2) == 0 ? plan::schedule_kind::gpipe : plan::schedule_kind::one_f_one_b};
}

// GPT: Megatron, data parallelism or Coshard inside stages, any order, the interlaced pipeline.
drawn draw_gpt(const models::gpt_config& c, rng_t& rng) {
    const int stages = 1 + static_cast<int>(pick(rng, 2));  // 1 or 2
    const int group = 1 + static_cast<int>(pick(rng, 2));   // 1 or 2
    plan::plan_spec inner;
    const std::size_t within = pick(rng, 4);
    switch (within) {
        case 0: inner = plan::presets::data_parallel(group); break;
        case 1: inner = plan::presets::megatron(group); break;
        case 2: inner = plan::presets::coshard(group, 2); break;
        default: inner.devices = group; break;  // whole ops on every device of the group
    }
    const int micro = std::vector<int>{1, 2, 4}[pick(rng, 3)];
    plan::order_policy order = linear_order(rng);
    const bool interleave = stages > 1 && micro % stages == 0 && c.layers >= 2 * stages && pick(rng, 2) == 0;
    const bool interlace = !interleave && stages > 1 && group == 1 && pick(rng, 4) == 0;
    if (interleave) order = {plan::schedule_kind::interleaved, 2};
    if (interlace) order = {plan::schedule_kind::interlaced};
    plan::plan_spec p = plan::presets::pipeline(stages, micro, order, inner);
    draw_stages(p, c.layers, stages, group, rng, interleave || interlace || pick(rng, 2) == 0);
    draw_recompute(p, c.layers, rng);
    draw_zero(p, group, rng, within == 2 || interlace);
    return {p, "gpt"};
}

// T5: both stacks are one repeat "blocks"; data parallelism inside the stages.
drawn draw_t5(const models::t5_config& c, rng_t& rng) {
    const int stages = 1 + static_cast<int>(pick(rng, 2));
    const int group = 1 + static_cast<int>(pick(rng, 2));
    const int micro = std::vector<int>{1, 2}[pick(rng, 2)];
    plan::plan_spec p = plan::presets::pipeline(stages, micro, linear_order(rng), plan::presets::data_parallel(group));
    const std::int64_t layers = c.encoder_layers + c.decoder_layers;
    draw_stages(p, layers, stages, group, rng, pick(rng, 2) == 0);
    draw_recompute(p, layers, rng);
    draw_zero(p, group, rng);
    return {p, "t5"};
}

// Evoformer: three forward rounds, so a pipeline is ordered by 3F1B; data parallelism inside.
drawn draw_evoformer(rng_t& rng) {
    const int stages = 1 + static_cast<int>(pick(rng, 2));
    const int group = 1 + static_cast<int>(pick(rng, 2));
    const int micro = std::vector<int>{1, 2}[pick(rng, 2)];
    plan::plan_spec p = plan::presets::pipeline(stages, micro, {plan::schedule_kind::three_f_one_b},
                                                plan::presets::data_parallel(group));
    draw_stages(p, 2, stages, group, rng, true);
    draw_zero(p, group, rng);
    return {p, "evoformer"};
}

std::string describe(const plan::plan_spec& p) {
    std::string out = p.name + ", zero " + std::to_string(static_cast<int>(p.zero));
    if (p.stages && !p.stages->boundaries.empty()) {
        out += ", boundaries";
        for (auto b : p.stages->boundaries) out += " " + std::to_string(b);
    }
    for (const auto& r : p.rules)
        if (r.recompute) out += ", " + r.on.describe() + " recomputed";
    return out;
}

}  // namespace

TEST_CASE("random plans from the whole plan language train like one device", "[plan][property][pipeline]") {
    rng_t rng(20261124);
    const int trials = 200;
    std::map<std::string, int> mix;
    for (int t = 0; t < trials; ++t) {
        const std::size_t kind = pick(rng, 8);
        drawn d;
        testing::equivalence e;
        try {
            if (kind < 5) {
                models::gpt_config c{.layers = std::vector<std::int64_t>{2, 3, 4, 4}[pick(rng, 4)], .hidden = 16, .heads = 4,
                                     .vocab = 24, .seq = 4, .batch = 8};
                c.dropout = pick(rng, 3) == 0 ? 0.2 : 0.0;
                d = draw_gpt(c, rng);
                e = testing::compare_with_single_device<double>(c, d.plan, 2);
            } else if (kind < 7) {
                const models::t5_config c{.encoder_layers = 1 + static_cast<std::int64_t>(pick(rng, 2)),
                                          .decoder_layers = 1 + static_cast<std::int64_t>(pick(rng, 2)),
                                          .hidden = 16, .heads = 2, .vocab = 24, .source_seq = 4, .target_seq = 4,
                                          .batch = 4};
                d = draw_t5(c, rng);
                auto model = models::t5(c);
                const graph forward = model.ir();
                std::vector<models::t5_batch> batches{models::t5_synthetic_batch(c, 1), models::t5_synthetic_batch(c, 2)};
                std::vector<train::input_feed> feeds;
                for (const auto& b : batches) feeds.push_back(testing::t5_feed(b));
                e = testing::compare_on_model<double>(forward, std::move(model).training_graph(), feeds, d.plan);
            } else {
                const models::evoformer_config c = testing::pipeline_evoformer(2);
                d = draw_evoformer(rng);
                auto model = models::evoformer(c);
                const graph forward = model.ir();
                const auto data = models::evoformer_synthetic_batch(c, 7);
                const std::vector<train::input_feed> feeds{testing::evoformer_feed(data), testing::evoformer_feed(data)};
                e = testing::compare_on_model<double>(forward, std::move(model).training_graph(), feeds, d.plan);
            }
        } catch (const std::exception& ex) {
            FAIL("trial " << t << " (" << d.model << ", " << describe(d.plan) << "): " << ex.what());
        }
        INFO("trial " << t << ": " << d.model << ", " << describe(d.plan) << ": loss " << e.loss << ", grad norm "
                      << e.grad_norm << ", parameters " << e.parameters << " (" << e.worst_parameter << ")");
        REQUIRE(e.loss <= 1e-9);
        REQUIRE(e.grad_norm <= 1e-9);
        REQUIRE(e.parameters <= 1e-9);
        ++mix[d.model];
        const auto& order = d.plan.order.alternatives.front();
        ++mix["order " + order.describe()];
        if (d.plan.zero != plan::zero_stage::none) ++mix["ZeRO"];
        if (d.plan.stages && !d.plan.stages->boundaries.empty()) ++mix["explicit boundaries"];
        for (const auto& r : d.plan.rules)
            if (r.recompute && r.on.repeat == "blocks") {
                ++mix["recompute"];
                break;
            }
        for (const auto& r : d.plan.rules)
            if (r.assign && (r.assign->colocate.value > 1 || r.assign->coshard)) {
                ++mix["Coshard"];
                break;
            }
    }
    std::printf("plan language: %d random plans equal to one device:", trials);
    for (const auto& [what, count] : mix) std::printf(" %s %d;", what.c_str(), count);
    std::printf("\n");
    CHECK(mix["gpt"] > 0);
    CHECK(mix["t5"] > 0);
    CHECK(mix["evoformer"] > 0);
    for (const char* order : {"order GPipe", "order 1F1B", "order interleaved 1F1B (2 chunks)", "order 3F1B", "order interlaced"})
        CHECK(mix[order] > 0);
    for (const char* part : {"ZeRO", "recompute", "Coshard", "explicit boundaries"}) CHECK(mix[part] > 0);
}
