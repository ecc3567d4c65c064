// Folded prices: a plan priced from small instances of its model (fewer layers per stage,
// fewer data-parallel replicas) against the same plan's programs materialized in full.
// Replica folding is exact where only the collectives grow; layer folding extrapolates a
// line and is held to a few percent; the folded search chooses what the full one does.
#include <catch2/catch.hpp>
#include <atomic>

#include <algorithm>
#include <cmath>
#include <string>

#include <loom/models/gpt.hpp>
#include <loom/partition/apply.hpp>
#include <loom/plan/presets.hpp>
#include <loom/plan/spaces.hpp>
#include <loom/plan/stage_ranges.hpp>
#include <loom/search/folded_price.hpp>
#include <loom/search/plan_search.hpp>

using namespace loom;

namespace {

search::model_family gpt_family(std::int64_t layers, std::int64_t batch) {
    return {[](std::int64_t l, std::int64_t b) {
                return graph(models::gpt({.layers = l, .hidden = 256, .heads = 8, .vocab = 2048, .seq = 128, .batch = b}).ir());
            },
            layers, batch};
}

struct plan_shape {
    int tp = 1, pp = 1, dp = 1, micro_batches = 1;
    plan::zero_stage zero = plan::zero_stage::none;
    plan::order_policy order{plan::schedule_kind::one_f_one_b};
};

plan::plan_spec megatron(const plan_shape& s) {
    plan::plan_spec inner = plan::presets::megatron(s.tp, s.dp);
    inner.zero = s.zero;
    if (s.pp == 1) {
        if (s.micro_batches > 1) inner.micro_batches = {s.micro_batches, "", {}};
        return inner;
    }
    return plan::presets::pipeline(s.pp, s.micro_batches, s.order, inner);
}

search::price_options gpu_options() {
    search::price_options o;
    o.storage = loom::precision::bf16;
    o.optimizer_bytes_per_element = 12;
    return o;
}

struct comparison {
    search::folded_price folded;
    search::program_price full;
    double step_ratio() const { return folded.price.step_seconds / full.step_seconds; }
    double worst_memory_error() const {
        double worst = 0;
        for (std::size_t d = 0; d < full.devices.size(); ++d)
            worst = std::max(worst, std::abs(folded.price.devices[d].memory.total() / full.devices[d].memory.total() - 1));
        return worst;
    }
};

comparison compare(const search::model_family& m, const plan::plan_spec& p, const search::cluster& c) {
    comparison out{search::price_folded(m, p, c, gpu_options()), {}};
    out.full = search::price_programs(partition::apply_plan(m.real(), p), c, gpu_options());
    REQUIRE(out.folded.price.devices.size() == out.full.devices.size());
    return out;
}

}  // namespace

TEST_CASE("replica folding prices data parallelism over many nodes like the full programs", "[folded_price]") {
    // 2 layers per stage: no layer folding, only replicas. DP 8 over 4 nodes of 2 GPUs, so
    // that the gradient all-reduces cross nodes and share NICs.
    const search::model_family m = gpt_family(2, 64);
    search::cluster c = search::dgx_a100(4);
    c.topo.devices_per_node = 2;
    for (plan::zero_stage zero : {plan::zero_stage::none, plan::zero_stage::optimizer}) {
        CAPTURE(static_cast<int>(zero));
        const comparison r = compare(m, megatron({.tp = 1, .dp = 8, .zero = zero}), c);
        CHECK(r.folded.instance_replicas == std::vector<std::int64_t>{2});
        CHECK(r.step_ratio() == Approx(1.0).epsilon(1e-9));
        CHECK(r.worst_memory_error() < 1e-9);
        CHECK(r.folded.price.transfers == r.full.transfers);
        CHECK(r.folded.price.transfer_seconds == Approx(r.full.transfer_seconds).epsilon(1e-9));
    }
    SECTION("with tensor parallelism inside each replica") {
        const comparison r = compare(m, megatron({.tp = 2, .dp = 4}), search::dgx_a100(1));
        CHECK(r.step_ratio() == Approx(1.0).epsilon(1e-9));
        CHECK(r.worst_memory_error() < 1e-9);
    }
    SECTION("ZeRO-3 shards parameters over the replicas: memory extrapolated in 1/D from 2 and 4") {
        const comparison r = compare(m, megatron({.tp = 1, .dp = 8, .zero = plan::zero_stage::parameters}), c);
        CHECK(r.folded.instance_replicas == std::vector<std::int64_t>{2, 4});
        CHECK(r.step_ratio() == Approx(1.0).epsilon(0.02));
        // The arena holds each use's gathered copies (whole, whatever D) among the
        // activations (in 1/D); its packing is not exactly affine in 1/D (1.2% over at D = 8).
        CHECK(r.worst_memory_error() < 0.02);
    }
}

TEST_CASE("layer folding extrapolates the price over the layers per stage", "[folded_price]") {
    search::cluster c = search::dgx_a100(2);
    SECTION("a pipeline of 4 stages with TP 2 and DP 2, 8 layers per stage") {
        const search::model_family m = gpt_family(32, 16);
        const comparison r = compare(m, megatron({.tp = 2, .pp = 4, .dp = 2, .micro_batches = 4}), c);
        CHECK(r.folded.instance_layers == std::vector<std::int64_t>{4, 6});
        CHECK(r.folded.layers_per_stage == 8);
        CHECK(r.step_ratio() == Approx(1.0).epsilon(0.03));
        CHECK(r.worst_memory_error() < 0.05);
    }
    SECTION("interleaved chunks fold in multiples of the chunks") {
        const search::model_family m = gpt_family(32, 16);
        const comparison r = compare(
            m, megatron({.tp = 1, .pp = 2, .dp = 2, .micro_batches = 4, .order = {plan::schedule_kind::interleaved, 2}}),
            search::dgx_a100(1));
        CHECK(r.folded.instance_layers == std::vector<std::int64_t>{8, 12});
        CHECK(r.step_ratio() == Approx(1.0).epsilon(0.03));
        CHECK(r.worst_memory_error() < 0.05);
    }
    SECTION("both foldings at once: 16 layers over 2 stages of DP 8") {
        const search::model_family m = gpt_family(16, 32);
        const comparison r = compare(m, megatron({.tp = 1, .pp = 2, .dp = 8, .micro_batches = 2}), c);
        CHECK(r.folded.instance_layers == std::vector<std::int64_t>{4, 6});
        CHECK(r.folded.instance_replicas == std::vector<std::int64_t>{2});
        CHECK(r.step_ratio() == Approx(1.0).epsilon(0.03));
        CHECK(r.worst_memory_error() < 0.05);
    }
}

TEST_CASE("uneven stage ranges fold: each range keeps its extra layers beyond the smallest", "[folded_price]") {
    // 32 layers cut 9 + 8 + 8 + 7: instances of 4 + 2, 4 + 1, 4 + 1, 4 and of 6 + 2, ...
    // layers, extrapolated to 7 + 2, 7 + 1, 7 + 1, 7.
    const search::model_family m = gpt_family(32, 16);
    SECTION("boundaries given") {
        plan::plan_spec p = megatron({.tp = 2, .pp = 4, .dp = 2, .micro_batches = 4});
        p.stages->boundaries = {9, 17, 25};
        const comparison r = compare(m, p, search::dgx_a100(2));
        CHECK(r.folded.instance_layers == std::vector<std::int64_t>{4, 6});
        CHECK(r.folded.layers_per_stage == 7);
        CHECK(r.step_ratio() == Approx(1.0).epsilon(0.03));
        CHECK(r.worst_memory_error() < 0.05);
    }
    SECTION("open boundaries, the cut chosen; and an even cut of layers the stages do not divide") {
        plan::plan_spec p = megatron({.tp = 1, .pp = 3, .dp = 2, .micro_batches = 4});
        p.stages->boundaries_open = "cut";
        p.stages->boundary_slack = 1;
        p.choices["cut"] = plan::stage_range_index(32, 3, 1, {0, 10, 20});  // 10 + 10 + 12
        REQUIRE(plan::detail::stage_starts(*p.stages, p.choices, 32, 3) == std::vector<std::int64_t>{0, 10, 20});
        const comparison chosen = compare(m, p, search::dgx_a100(1));
        CHECK(chosen.folded.instance_layers == std::vector<std::int64_t>{4, 6});
        CHECK(chosen.folded.layers_per_stage == 10);
        CHECK(chosen.step_ratio() == Approx(1.0).epsilon(0.03));
        CHECK(chosen.worst_memory_error() < 0.05);
        const comparison even = compare(m, megatron({.tp = 1, .pp = 3, .dp = 2, .micro_batches = 4}), search::dgx_a100(1));
        CHECK(even.folded.layers_per_stage == 10);  // 11 + 11 + 10
        CHECK(even.step_ratio() == Approx(1.0).epsilon(0.03));
        CHECK(even.worst_memory_error() < 0.05);
    }
}

TEST_CASE("micro-batch folding extrapolates the step over the micro-batches", "[folded_price]") {
    // Instances of 2 and 4 micro-batches stand for 12 (the interlaced pipeline's 4 and 8: it
    // fills the embedding's and the head's stages too). The step is held to 4%. Memory is
    // the larger instance's under 1F1B and a line under GPipe; the arena's liveness peak is
    // not exactly linear in layers, so memory is held to 15%.
    const search::model_family m = gpt_family(8, 48);
    for (plan::schedule_kind kind :
         {plan::schedule_kind::one_f_one_b, plan::schedule_kind::gpipe, plan::schedule_kind::interlaced}) {
        CAPTURE(static_cast<int>(kind));
        const comparison r = compare(m, megatron({.tp = 1, .pp = 2, .dp = 2, .micro_batches = 12, .order = {kind}}),
                                     search::dgx_a100(1));
        CHECK(r.folded.instance_micro_batches.at(0) ==
              (kind == plan::schedule_kind::interlaced ? std::vector<std::int64_t>{4, 8} : std::vector<std::int64_t>{2, 4}));
        CHECK(r.step_ratio() == Approx(1.0).epsilon(0.04));
        CHECK(r.worst_memory_error() < 0.15);
    }
    SECTION("the interlaced pipeline over 4 stages: 6 and 12 micro-batches for 24") {
        const comparison r =
            compare(gpt_family(8, 48),
                    megatron({.tp = 2, .pp = 4, .micro_batches = 24, .order = {plan::schedule_kind::interlaced}}),
                    search::dgx_a100(1));
        CHECK(r.folded.instance_micro_batches.at(0) == std::vector<std::int64_t>{6, 12});
        CHECK(r.step_ratio() == Approx(1.0).epsilon(0.04));
        CHECK(r.worst_memory_error() < 0.15);
    }
    SECTION("gradient accumulation without a pipeline: 2 and 4 micro-batches for 8") {
        const comparison r = compare(gpt_family(4, 32), megatron({.tp = 2, .dp = 2, .micro_batches = 8}), search::dgx_a100(1));
        CHECK(r.folded.instance_micro_batches.at(0) == std::vector<std::int64_t>{2, 4});
        CHECK(r.step_ratio() == Approx(1.0).epsilon(0.04));
        CHECK(r.worst_memory_error() < 0.15);
    }
}

TEST_CASE("stage folding extrapolates a deep pipeline from 4 and 8 stages", "[folded_price]") {
    // 16 stages of one device, 2 layers each, 32 micro-batches, on one node of 16 devices:
    // instances of 4 and 8 stages (each at 32 micro-batches, folded from 4 and 8, and from
    // 8 and 16) stand for 16. The first and last stages are lines in the stage count, the
    // middle ones bilinear in their index and the count: held to the same few percent as
    // the other foldings.
    const search::model_family m = gpt_family(32, 64);
    search::cluster node = search::dgx_a100(1);
    node.topo.devices_per_node = 16;
    for (plan::order_policy order : {plan::order_policy{plan::schedule_kind::one_f_one_b},
                                     plan::order_policy{plan::schedule_kind::gpipe},
                                     plan::order_policy{plan::schedule_kind::interleaved, 2}}) {
        CAPTURE(static_cast<int>(order.kind));
        const comparison r = compare(m, megatron({.tp = 1, .pp = 16, .dp = 1, .micro_batches = 32, .order = order}), node);
        INFO(r.folded.describe());
        CHECK(r.folded.instance_stages == std::vector<std::int64_t>{4, 8});
        CHECK(r.folded.stages == 16);
        CHECK(r.folded.price.devices.size() == 16);
        CHECK(r.step_ratio() == Approx(1.0).epsilon(0.04));
        CHECK(r.worst_memory_error() < 0.15);  // the arena's packing, a little off the line in the middle stages
        CHECK(r.folded.price.peak_memory() == Approx(r.full.peak_memory()).epsilon(0.05));
    }
    SECTION("each stage on a node of its own: TP 2 x DP 2 on 16 nodes of 4 devices") {
        search::cluster c = search::dgx_a100(16);
        c.topo.devices_per_node = 4;
        const comparison r = compare(m, megatron({.tp = 2, .pp = 16, .dp = 2, .micro_batches = 16}), c);
        INFO(r.folded.describe());
        CHECK(r.folded.instance_stages == std::vector<std::int64_t>{4, 8});
        CHECK(r.step_ratio() == Approx(1.0).epsilon(0.04));
        CHECK(r.worst_memory_error() < 0.15);
        CHECK(r.folded.price.peak_memory() == Approx(r.full.peak_memory()).epsilon(0.05));
    }
    SECTION("the interlaced pipeline: 32 stages from 4, 8 and 16, its ends' share of each device in 1/S") {
        search::cluster c = search::dgx_a100(1);
        c.topo.devices_per_node = 32;
        const comparison r = compare(gpt_family(64, 64),
                                     megatron({.tp = 1, .pp = 32, .dp = 1, .micro_batches = 64,
                                               .order = {plan::schedule_kind::interlaced}}),
                                     c);
        INFO(r.folded.describe());
        CHECK(r.folded.instance_stages == std::vector<std::int64_t>{4, 8, 16});
        CHECK(r.step_ratio() == Approx(1.0).epsilon(0.04));
        CHECK(r.worst_memory_error() < 0.15);
        CHECK(r.folded.price.peak_memory() == Approx(r.full.peak_memory()).epsilon(0.05));
    }
    SECTION("stages that share nodes across node boundaries, fewer micro-batches than stages, or an uneven cut, keep "
            "every stage") {
        // On 2 nodes of 8, the 8th boundary and the tied embedding's all-reduce cross nodes
        // in the real plan and in no instance of 4 or 8 stages (the step came out at half).
        const plan::plan_spec deep = megatron({.tp = 1, .pp = 16, .dp = 1, .micro_batches = 32});
        CHECK(search::price_folded(m, deep, search::dgx_a100(2), gpu_options()).instance_stages ==
              std::vector<std::int64_t>{16});
        const search::folded_price few =
            search::price_folded(m, megatron({.tp = 1, .pp = 16, .dp = 1, .micro_batches = 8}), node, gpu_options());
        CHECK(few.instance_stages == std::vector<std::int64_t>{16});
        plan::plan_spec uneven = deep;
        uneven.stages->boundaries = {3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};  // 3 + 2 x 14 + 1
        CHECK(search::price_folded(m, uneven, node, gpu_options()).instance_stages == std::vector<std::int64_t>{16});
    }
}

TEST_CASE("a plan that does not fold is priced in full, and bad shapes are refused", "[folded_price]") {
    const search::model_family m = gpt_family(6, 16);
    SECTION("a layer range that covers part of the model") {
        plan::plan_spec p = megatron({.tp = 1, .pp = 1, .dp = 2});
        p.then(plan::presets::recompute_layers(plan::recompute_policy::full, 0, 2));
        const search::folded_price f = search::price_folded(m, p, search::dgx_a100(1), gpu_options());
        CHECK(f.exact());
        CHECK(f.describe() == "priced in full");
    }
    SECTION("stages that do not divide the layers: 2 + 2 + 1 + 1, too few to fold") {
        const plan::plan_spec p = megatron({.tp = 1, .pp = 4, .dp = 1, .micro_batches = 4});
        const comparison r = compare(m, p, search::dgx_a100(1));
        CHECK(r.folded.exact());
        CHECK(r.step_ratio() == Approx(1.0).epsilon(1e-12));
    }
    SECTION("more stages than layers") {
        const plan::plan_spec p = megatron({.tp = 1, .pp = 8, .dp = 1, .micro_batches = 8});
        CHECK_THROWS_WITH(search::price_folded(m, p, search::dgx_a100(1), gpu_options()),
                          Catch::Contains("6 layers cannot fill 8 stages"));
    }
    SECTION("more pieces than devices: ZeRO-3 with 8 replicas of 4 tensor-parallel pieces on 16 devices") {
        // Replica folding matched each instance piece to a device without checking that the
        // piece's device exists in the instance (it read past the end of its tables).
        plan::plan_spec p = plan::spaces::deepspeed(16);
        p.choices = {{"dp", 8}, {"tp", 4}, {"mb", 1}};
        const graph g = m.forward(6, 16);
        std::string full;
        try {
            (void)partition::apply_plan(g, p);
        } catch (const error& e) {
            full = e.what();
        }
        INFO("the full model: " << (full.empty() ? "applied" : full));
        std::string folded;
        try {
            (void)search::price_folded(m, p, search::dgx_a100(2), gpu_options());
        } catch (const error& e) {
            folded = e.what();
        }
        CHECK(folded == full);
    }
    SECTION("a cancelled price stops before its first instance, and says so") {
        const std::atomic<bool> cancel{true};
        search::price_options o = gpu_options();
        o.cancel = &cancel;
        CHECK_THROWS_AS(search::price_folded(m, megatron({.tp = 1, .pp = 1, .dp = 2}), search::dgx_a100(1), o),
                        search::price_cancelled);
    }
    SECTION("a cancelled materialization stops at its next op; an unset flag changes nothing") {
        // A price past the search's budget is cancelled within the instance it materializes
        // (seconds at 1024 GPUs), not after it.
        const graph g = m.real();
        const plan::resolved_plan rp = plan::resolve(megatron({.tp = 2, .pp = 1, .dp = 2}), g);
        std::atomic<bool> cancel{true};
        partition::apply_options ao;
        ao.cancel = &cancel;
        CHECK_THROWS_AS(partition::apply_plan(g, rp, ao), partition::apply_cancelled);
        cancel = false;
        const partition::partitioned_graph with_flag = partition::apply_plan(g, rp, ao);
        const partition::partitioned_graph without = partition::apply_plan(g, rp);
        CHECK(search::price_programs(with_flag, search::dgx_a100(1), gpu_options()).step_seconds ==
              search::price_programs(without, search::dgx_a100(1), gpu_options()).step_seconds);
        CHECK(with_flag.transfers.size() == without.transfers.size());
    }
    SECTION("a family without a builder") {
        CHECK_THROWS_WITH(search::price_folded(search::model_family{}, megatron({}), search::dgx_a100(1)),
                          Catch::Contains("needs a forward(layers, batch) builder"));
    }
}

TEST_CASE("the folded search chooses what the full search chooses", "[folded_price]") {
    const search::model_family m = gpt_family(8, 16);
    const plan::plan_spec space = plan::spaces::megatron(4);
    search::plan_search_options o;
    o.price = gpu_options();
    const search::cluster c = search::dgx_a100(1);
    const search::plan_search_result folded = search::search_plan(m, space, c, o);
    const search::plan_search_result full = search::search_plan(m.real(), space, c, o);
    CHECK(folded.best.choices == full.best.choices);
    CHECK(folded.best.price.step_seconds == Approx(full.best.price.step_seconds).epsilon(0.03));
    CHECK(folded.gap == 0);
    CHECK(folded.stats.assignments == full.stats.assignments);
}

namespace {

// Bounds and folded prices of every leaf of `space` that both accept (refused as the search
// refuses: by the bounds' resolve or by the folded price), each bound checked below its
// price; `each` sees every accepted leaf's price.
template <class Each>
int check_bounds_below_prices(const search::model_family& m, const plan::plan_spec& space, const search::cluster& c,
                              Each each) {
    const search::price_options o = gpu_options();
    search::detail::folded_bounds bounds(m, c, o);
    const auto params = search::open_parameter_candidates(space, m.batch, m.layers);
    int legal = 0;
    search::for_each_assignment(space, params, [&](const plan::plan_spec& candidate) {
        search::detail::assignment_bounds b;
        search::folded_price f;
        try {
            b = bounds(candidate);
            f = search::price_folded(m, candidate, c, o);
        } catch (const plan_error&) {
            return;
        } catch (const shape_error&) {
            return;
        }
        INFO(search::choices_text(params, candidate.choices) << ": " << f.describe());
        ++legal;
        each(f);
        CHECK(b.step <= f.price.step_seconds * (1 + 1e-12));
        // The memory floor is a floor of the programs' memory, which the folded price gives
        // within a few percent: where it lies above the folded price, it is held against the
        // full programs (dp 4 with 8 micro-batches on 32 layers: floor 532.6 MB, folded
        // price 531.0, programs 542.0; the gradients' partial sums over micro-batches).
        if (b.memory > f.price.peak_memory() * (1 + 1e-12)) {
            const search::program_price full = search::price_programs(partition::apply_plan(m.real(), candidate), c, o);
            CHECK(b.memory <= full.peak_memory() * (1 + 1e-12));
            CHECK(f.price.peak_memory() == Approx(full.peak_memory()).epsilon(0.05));
        }
    });
    return legal;
}

}  // namespace

TEST_CASE("the folded bounds never exceed the folded price, on every leaf of a space that folds", "[folded_price]") {
    // 16 layers and 16 micro-batches: instances of fewer layers per stage and of fewer
    // micro-batches stand for most of the plans, and the bounds extrapolate from them.
    plan::plan_spec space = plan::spaces::megatron(8);
    space.micro_batches.allowed = {4, 16};
    space.order.alternatives.push_back({plan::schedule_kind::interlaced});
    int folded = 0;
    const int legal = check_bounds_below_prices(gpt_family(16, 64), space, search::dgx_a100(1),
                                                [&](const search::folded_price& f) { folded += f.exact() ? 0 : 1; });
    CHECK(legal > 20);
    CHECK(folded > legal / 2);
}

TEST_CASE("the folded bounds of deep pipelines, folded over their stages, never exceed the folded price", "[folded_price]") {
    // 16 stages on one node of 32 devices: the bounds, like the prices, come from instances
    // of 4 and 8 stages, and their line in the stage count stays below the price's. (On
    // these 12 leaves the step bounds came out within 1.5% of the same bounds from instances
    // of all 16 stages; this small model's bounds are a third to two thirds of its prices
    // either way.)
    search::cluster node = search::dgx_a100(1);
    node.topo.devices_per_node = 32;
    plan::plan_spec space = plan::spaces::megatron(32);
    space.narrow("pp", {16}).narrow("mb", {16, 32});
    const int legal = check_bounds_below_prices(gpt_family(32, 64), space, node, [](const search::folded_price& f) {
        CHECK(f.instance_stages == std::vector<std::int64_t>{4, 8});
    });
    CHECK(legal >= 6);
}

TEST_CASE("deep pipelines that share instances are bounded once, as a fresh bound would", "[folded_price]") {
    // 224 layers in 16 or 32 stages of DP 2, 32 micro-batches of one sample: both are
    // bounded from the same instances (4 and 8 stages of 2 replicas, 4 and 6 layers per
    // stage, as many and twice as many micro-batches as stages), so the second
    // plan reuses the first one's instance bounds, and they are the ones a bound that
    // never saw the first plan computes.
    const search::model_family m = gpt_family(224, 64);
    search::cluster node = search::dgx_a100(1);
    node.topo.devices_per_node = 64;
    const plan::plan_spec sixteen = megatron({.pp = 16, .dp = 2, .micro_batches = 32});
    const plan::plan_spec thirty_two = megatron({.pp = 32, .dp = 2, .micro_batches = 32});
    search::detail::folded_bounds shared(m, node, gpu_options());
    const search::detail::assignment_bounds first = shared(sixteen);
    const std::size_t bounded = shared.instances_bounded();
    CHECK(bounded == 8);  // 2 stage counts x 2 micro-batch counts x 2 layer counts
    const search::detail::assignment_bounds second = shared(thirty_two);
    CHECK(shared.instances_bounded() == bounded);
    search::detail::folded_bounds fresh(m, node, gpu_options());
    const search::detail::assignment_bounds alone = fresh(thirty_two);
    CHECK(second.step == alone.step);
    CHECK(second.memory == alone.memory);
    // The same instances, extrapolated to another depth: the real plans' bounds differ.
    CHECK(second.step != first.step);
    CHECK(second.memory != first.memory);
}

TEST_CASE("a folded price refuses a plan whose instances hold too many pieces, before materializing any", "[folded_price]") {
    // Coshard's pieces at scale take tens of GiB to materialize; the limit refuses them by
    // their count, and a plan within it prices as without a limit.
    const search::model_family m = gpt_family(24, 64);
    const search::cluster c = search::dgx_a100(1);
    const plan::plan_spec p = megatron({.tp = 2, .pp = 2, .dp = 2, .micro_batches = 8});
    search::price_options unlimited = gpu_options();
    unlimited.max_instance_pieces = 0;
    const search::folded_price free = search::price_folded(m, p, c, unlimited);
    const search::folded_price limited = search::price_folded(m, p, c, gpu_options());
    CHECK(limited.price.step_seconds == free.price.step_seconds);
    search::price_options tight = gpu_options();
    tight.max_instance_pieces = 1000;
    try {
        (void)search::price_folded(m, p, c, tight);
        FAIL("a plan over the limit was priced");
    } catch (const plan_error& e) {
        const std::string what = e.what();
        CHECK(what.find("op pieces, more than price_options::max_instance_pieces (1000") != std::string::npos);
        CHECK(what.find("a smaller Coshard factor") != std::string::npos);
    }
    // The search's bound refuses it too, with the price's reason, so that a descent under a
    // budget never moves to a plan its price refuses (at 1024 GPUs a 10 s budget's descent
    // ended among such plans, and the search priced a 232 s plan after 26 s instead).
    search::detail::folded_bounds tight_bounds(m, c, tight);
    try {
        (void)tight_bounds(p);
        FAIL("a plan over the limit was bounded");
    } catch (const plan_error& e) {
        CHECK(std::string(e.what()).find("op pieces, more than price_options::max_instance_pieces (1000") != std::string::npos);
    }
    search::detail::folded_bounds limited_bounds(m, c, gpu_options());
    CHECK(limited_bounds(p).step > 0);
    // The search counts such plans refused, for that reason, and says so.
    search::plan_search_options o;
    o.price = tight;
    plan::plan_spec space = plan::spaces::megatron(8);
    space.narrow("tp", {2}).narrow("pp", {2}).narrow("mb", {8});
    try {
        (void)search::search_plan(m, space, c, o);
        FAIL("every assignment is over the limit, yet the search found one");
    } catch (const search::search_error& e) {
        CHECK(std::string(e.what()).find("max_instance_pieces") != std::string::npos);
    }
}

TEST_CASE("a space narrowed to the real plan's values folds on instances outside that range", "[folded_price]") {
    // The instances run 2 and 4 micro-batches and 2 replicas where the plan says 12 and 4:
    // the narrowed ranges bind the real plan, not its instances.
    const search::model_family m = gpt_family(8, 48);
    plan::plan_spec space = plan::spaces::megatron(8);
    space.narrow("tp", {2}).narrow("dp", {4}).narrow("pp", {1}).narrow("mb", {12});
    const search::cluster c = search::dgx_a100(1);
    search::plan_search_options o;
    o.price = gpu_options();
    const search::plan_search_result r = search::search_plan(m, space, c, o);
    CHECK(r.stats.refused == 0);
    CHECK(r.best.choices.at("mb") == 12);
    CHECK(r.best.choices.at("dp") == 4);
    const search::folded_price f = search::price_folded(m, r.plan, c, o.price);
    CHECK_FALSE(f.exact());  // it was folded, not priced in full
    CHECK(f.instance_micro_batches.at(0) == std::vector<std::int64_t>{2, 4});
    CHECK(r.best.price.step_seconds == Approx(f.price.step_seconds).epsilon(1e-12));
}

TEST_CASE("the folded bound of uneven stages plays the real plan's order with its stages' work", "[folded_price]") {
    // 72 layers in 8 stages cut 10 + 9 + ... + 9 + 8, 32 micro-batches: the instances keep
    // each stage's layers beyond the fewest (4 + 2, 4 + 1, ..., 4 and 6 + 2, ..., 6), so the
    // extra layers weigh more in them than in the real plan, and the line through the
    // instances' makespans (over their layers, then their 8 and 16 micro-batches) fell to
    // 0.976 of the unfolded bound. Each stage's blocks are linear in its layers and
    // extrapolate exactly; the real order played with them is what the unfolded bound plays.
    const search::model_family m = gpt_family(72, 64);
    const search::cluster c = search::dgx_a100(1);
    const search::price_options o = gpu_options();
    plan::plan_spec p = megatron({.pp = 8, .micro_batches = 32});
    p.stages->boundaries = {10, 19, 28, 37, 46, 55, 64};
    search::detail::folded_bounds bounds(m, c, o);
    const double folded = bounds(p).step;
    const graph g = m.real();
    const search::training_work work = search::training_work_of(g, c.device, o);
    const double unfolded = search::step_lower_bound(plan::resolve(p, g), work, o, &g, &c);
    const search::folded_price price = search::price_folded(m, p, c, o);
    INFO("folded bound " << folded << " s, unfolded bound " << unfolded << " s, price " << price.price.step_seconds
                         << " s (" << price.describe() << ")");
    CHECK(!price.exact());
    CHECK(folded >= 0.99 * unfolded);
    CHECK(folded <= price.price.step_seconds);
}

TEST_CASE("the folded bounds of open stage boundaries never exceed the folded price", "[folded_price]") {
    // Alpa's space on 4 devices: stages with searched boundaries (within a layer of even),
    // tensor and data parallelism inside. 32 layers: the uneven cuts fold over their layers
    // from instances that keep each stage's extra layers.
    plan::plan_spec space = plan::spaces::alpa(4);
    space.narrow("mb", {4, 8});
    int folded = 0;
    const int legal = check_bounds_below_prices(gpt_family(32, 64), space, search::dgx_a100(1), [&](const search::folded_price& f) {
        folded += f.exact() ? 0 : 1;
    });
    CHECK(legal > 20);
    CHECK(folded > legal / 2);
}
