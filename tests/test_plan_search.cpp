// The searcher over a user's plan: it fills the plan's open parameters with the assignment
// whose programs price lowest, equal to pricing every assignment; its bound never exceeds a
// price; an empty space says why; the prices follow first principles.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <loom/io/plan_file.hpp>
#include <loom/models/evoformer.hpp>
#include <loom/models/gpt.hpp>
#include <loom/models/t5.hpp>
#include <loom/partition/apply.hpp>
#include <loom/plan/compose.hpp>
#include <loom/plan/presets.hpp>
#include <loom/plan/spaces.hpp>
#include <loom/plan/stage_ranges.hpp>
#include <loom/schedule/templates.hpp>
#include <loom/search/plan_search.hpp>
#include <loom/train/ownership.hpp>

#include "support/search_fixtures.hpp"

using namespace loom;
using loom::testing::slow_node;
using loom::testing::small_gpt;

namespace {

// Megatron's rules with the tensor- and data-parallel degrees left open as "tp" and "dp".
plan::plan_spec open_megatron(int devices) {
    plan::plan_spec p = plan::presets::megatron(2, 2);
    p.devices = devices;
    for (auto& r : p.rules)
        if (r.trans)
            for (auto& s : *r.trans) {
                const bool batch = !s.replicate && s.label.empty() && s.dim == dim_id_of<Dim::Batch>;
                s.degree = {1, batch ? "dp" : "tp", {}};
            }
    return p;
}

// A space over everything a pipeline leaves open: stages, micro-batches, order, ZeRO, and
// the degrees inside the stages.
plan::plan_spec open_pipeline(int devices) {
    plan::plan_spec p = open_megatron(devices);
    p.stages = plan::stage_spec{};
    p.stages->count = {1, "pp", {}};
    p.micro_batches = {1, "mb", {1, 2, 4}};
    p.order = {{{plan::schedule_kind::gpipe}, {plan::schedule_kind::one_f_one_b}}, "order"};
    p.zero_open = "zero";
    p.zero_allowed = {0, 1, 3};
    return p;
}

// Alpa's space filled: `stages` even stages of dp x tp devices, 1F1B over `micro_batches`,
// every layer recomputed or none.
plan::plan_spec even_pipeline(int stages, int micro_batches, bool recompute, int dp = 1, int tp = 1) {
    plan::plan_spec p = plan::spaces::alpa(stages * dp * tp);
    p.stages->boundaries_open.clear();
    p.choices = {{"dp", dp}, {"tp", tp}, {"pp", stages}, {"mb", micro_batches}};
    if (recompute) {
        plan::rule r;
        r.on.repeat = "blocks";
        r.recompute = true;
        p.add(std::move(r));
    }
    return p;
}

// A pipeline's memory floor beside its programs' price, on one DGX A100 node without the
// runtime's fixed bytes: `even_pipeline` run in `order`.
struct floor_and_price {
    search::memory_floor least;
    search::program_price price;
};
floor_and_price pipeline_floor(const graph& g, plan::schedule_kind order, int stages, int micro_batches, bool recompute) {
    const search::cluster c = search::dgx_a100(1);
    search::price_options o;
    o.runtime_bytes = 0;
    plan::plan_spec p = even_pipeline(stages, micro_batches, recompute);
    p.order = {{plan::order_policy{order}}, ""};
    const auto work = search::training_work_of(g, c.device, o);
    return {search::memory_lower_bound(plan::resolve(p, g), g, o, &work),
            search::price_programs(partition::apply_plan(g, p), c, o)};
}

// Every assignment of the space priced, the way the searcher would if it pruned nothing.
struct exhaustive {
    std::map<std::string, std::int64_t> best;
    double best_step = 1e300;
    int legal = 0;
    int raised_by_communication = 0;  // leaves whose bound the communication term raised
    int raised_by_model = 0;          // leaves whose bound recomputation or dependencies raised
    int memory_floor_close = 0;       // devices whose memory floor is most of their priced memory
    int activations_counted = 0;      // devices whose memory floor counts saved activations
    int coshard = 0;                  // legal leaves that colocate pieces (Coshard)
};

exhaustive price_everything(const graph& model, const plan::plan_spec& space, const search::cluster& c,
                            const search::plan_search_options& o) {
    const auto params = search::open_parameter_candidates(
        space, search::batch_of(model), space.stages ? plan::detail::layer_count(model, space.stages->repeat) : 0);
    const auto work = search::training_work_of(model, c.device, o.price);
    const double floor = search::any_plan_lower_bound(work, space.devices, o.price);
    const double memory_floor = search::any_plan_memory_floor(model, space.devices, o.price);
    exhaustive out;
    search::for_each_assignment(space, params, [&](const plan::plan_spec& candidate) {
        try {
            const plan::resolved_plan rp = plan::resolve(candidate, model);
            const search::memory_floor least = search::memory_lower_bound(rp, model, o.price, &work);
            const double after = search::after_programs_lower_bound(least, c, o.price);
            const double bound = search::step_lower_bound(rp, work, o.price, &model, &c) + after;
            const double without_communication = search::step_lower_bound(rp, work, o.price, &model);
            if (bound > (without_communication + after) * (1 + 1e-9)) ++out.raised_by_communication;
            if (without_communication > search::step_lower_bound(rp, work, o.price) * (1 + 1e-9)) ++out.raised_by_model;
            const search::program_price price =
                search::price_programs(partition::apply_plan(model, candidate), c, o.price);
            // The bounds are bounds on every leaf: the step, and each device's memory.
            INFO(search::choices_text(params, candidate.choices));
            CHECK(bound <= price.step_seconds * (1 + 1e-12));
            // The floor of any plan (what a budget's unbounded assignments count at) lies
            // below every leaf's bound.
            CHECK(floor > 0);
            CHECK(floor <= bound * (1 + 1e-12));
            // So does the memory floor of any plan, below every leaf's fullest device.
            CHECK(memory_floor <= (least.peak() + o.price.runtime_bytes) * (1 + 1e-12));
            if (rp.zero != plan::zero_stage::parameters) CHECK(after > 0);
            for (std::size_t d = 0; d < price.devices.size(); ++d) {
                INFO("device " << d << ", " << search::choices_text(params, candidate.choices));
                // The optimizer's elements: no more than the device updates.
                search::memory_floor one = least;
                for (std::size_t e = 0; e < one.updated.size(); ++e)
                    if (e != d) one.updated[e] = 0;
                CHECK(search::after_programs_lower_bound(one, c, o.price) <= price.devices[d].optimizer * (1 + 1e-12));
                CHECK(least.total(d) + o.price.runtime_bytes <= price.devices[d].memory.total() * (1 + 1e-12));
                if (least.total(d) > 0.6 * price.devices[d].memory.total()) ++out.memory_floor_close;
                if (least.activations[d] > 0) ++out.activations_counted;
            }
            if (price.peak_memory() <= (o.memory_limit > 0 ? o.memory_limit : c.device.memory_bytes)) {
                ++out.legal;
                if (candidate.choices.count("coshard") && candidate.choices.at("coshard") > 1) ++out.coshard;
                if (price.step_seconds < out.best_step) out.best_step = price.step_seconds, out.best = candidate.choices;
            }
        } catch (const plan_error&) {
        } catch (const shape_error&) {
        }
    });
    return out;
}

}  // namespace

TEST_CASE("the bound counts each device's least communication and still never exceeds a price") {
    // Nodes of 2 devices at a GPU's speed: gradients and tensor-parallel partial sums cross
    // nodes and take as long as the compute of this small model.
    const auto model = small_gpt();
    search::cluster hw = search::dgx_a100(4);
    hw.topo.devices_per_node = 2;
    search::plan_search_options o;
    for (const plan::plan_spec& space : {open_megatron(8), open_pipeline(8)}) {
        const exhaustive all = price_everything(model.ir(), space, hw, o);
        CHECK(all.legal > 5);
        CHECK(all.raised_by_communication > 0);
    }
}

// A GPU's calibration travels in its profile as rates per op kind (device_profile::rates):
// here slower than the roofline, with a launch's cost at every size and the products at a
// hundred-thousandth of the peak (slow_node's memory is slow too, which the roofline charges them).
search::cluster with_measured_rates(search::cluster c) {
    const double peak = c.device.peak_flops(precision::bf16), bandwidth = c.device.memory_bandwidth;
    auto& bf16 = c.device.rates[precision::bf16];
    for (const char* kind : {"linear", "linear_bias", "linear_grad_input", "linear_grad_weight", "attention",
                             "attention_grad"})
        bf16[kind] = search::op_rate_from_samples(
            {{1e9, 1e9 / (1e-5 * peak) + 5e-6}, {1e6, 1e6 / (1e-5 * peak) + 5e-6}}, true);
    bf16["add"] = search::op_rate_from_samples({{1e6, 1e6 / bandwidth + 3e-6}, {1e8, 1e8 / bandwidth + 3e-6}}, false);
    return c;
}

TEST_CASE("a profile's measured rates price like the options' rates, and the search still finds the best") {
    const auto model = small_gpt();
    const search::cluster roofline = slow_node(), measured = with_measured_rates(roofline);
    search::plan_search_options o;
    o.price.storage = precision::bf16;
    const auto one = partition::apply_plan(model.ir(), plan::presets::megatron(2, 2));
    const double by_roofline = search::price_programs(one, roofline, o.price).step_seconds;
    const double by_profile = search::price_programs(one, measured, o.price).step_seconds;
    search::price_options given = o.price;
    given.rates = measured.device.rates.at(precision::bf16);
    CHECK(by_profile > by_roofline);
    CHECK(search::price_programs(one, roofline, given).step_seconds == by_profile);
    // The rates are for bf16 storage: a float program is priced from the peaks.
    search::price_options in_f32 = o.price;
    in_f32.storage = precision::f32;
    CHECK(search::price_programs(one, measured, in_f32).step_seconds ==
          search::price_programs(one, roofline, in_f32).step_seconds);

    // The bounds take the profile's rates too: never above a leaf's price (price_everything
    // checks every one), and the search keeps to the best.
    const plan::plan_spec space = open_pipeline(4);
    const exhaustive all = price_everything(model.ir(), space, measured, o);
    REQUIRE(all.legal > 5);
    const search::plan_search_result r = search::search_plan(model.ir(), space, measured, o);
    CHECK(r.best.price.step_seconds == Approx(all.best_step).epsilon(1e-12));
    CHECK(r.gap == 0);
}

TEST_CASE("the search over a pipeline space finds the assignment that pricing every one finds") {
    const auto model = small_gpt();
    const plan::plan_spec space = open_pipeline(4);
    const search::cluster hw = slow_node();
    search::plan_search_options o;
    const exhaustive all = price_everything(model.ir(), space, hw, o);
    REQUIRE(all.legal > 5);

    const search::plan_search_result r = search::search_plan(model.ir(), space, hw, o);
    CHECK(r.best.price.step_seconds == Approx(all.best_step).epsilon(1e-12));
    CHECK(r.gap == 0);
    CHECK(r.stats.pruned > 0);  // the bound saved work
    CHECK(r.stats.priced + r.stats.pruned + r.stats.refused + r.stats.over_memory_unpriced == r.stats.assignments);
    REQUIRE(r.runner_up);
    CHECK(r.runner_up->price.step_seconds >= r.best.price.step_seconds);
    INFO(r.explain());
    CHECK(r.explain().find("runner-up: ") != std::string::npos);
    CHECK(r.explain().find("what separated them") != std::string::npos);

    // The filled plan is the space with its choices: it applies, and prices the same.
    for (const auto& p : r.parameters) CHECK(r.plan.choices.count(p.name) == 1);
    const auto again = search::price_programs(partition::apply_plan(model.ir(), r.plan), hw, o.price);
    CHECK(again.step_seconds == r.best.price.step_seconds);

    // Deterministic.
    const search::plan_search_result twice = search::search_plan(model.ir(), space, hw, o);
    CHECK(twice.best.choices == r.best.choices);
    CHECK(twice.stats.priced == r.stats.priced);
}

TEST_CASE("stage cuts are counted and numbered: every cut once, in order, within the slack") {
    for (std::int64_t layers = 1; layers <= 9; ++layers)
        for (std::int64_t ranges = 1; ranges <= layers + 1; ++ranges)
            for (std::int64_t slack : {-1, 0, 1, 2}) {
                // Every cut by brute force: each assignment of sizes, in lexicographic order.
                const plan::stage_range_limits l = plan::stage_range_limits::of(layers, ranges, slack);
                std::vector<std::vector<std::int64_t>> all;
                std::vector<std::int64_t> sizes;
                std::function<void(std::int64_t)> grow = [&](std::int64_t left) {
                    if (static_cast<std::int64_t>(sizes.size()) == ranges) {
                        if (left == 0) all.push_back(sizes);
                        return;
                    }
                    for (std::int64_t s = l.lo; s <= l.hi && s <= left; ++s) {
                        sizes.push_back(s);
                        grow(left - s);
                        sizes.pop_back();
                    }
                };
                grow(layers);
                INFO(layers << " layers, " << ranges << " ranges, slack " << slack);
                REQUIRE(plan::count_stage_ranges(layers, ranges, slack) == static_cast<std::int64_t>(all.size()));
                for (std::size_t k = 0; k < all.size(); ++k) {
                    const auto starts = plan::stage_range_starts(layers, ranges, slack, static_cast<std::int64_t>(k));
                    REQUIRE(starts.size() == static_cast<std::size_t>(ranges));
                    CHECK(plan::stage_range_index(layers, ranges, slack, starts) == static_cast<std::int64_t>(k));
                    std::int64_t first = 0;
                    for (std::size_t r = 0; r < starts.size(); ++r) {
                        CHECK(starts[r] == first);
                        first += all[k][r];
                    }
                }
                CHECK_THROWS_AS(plan::stage_range_starts(layers, ranges, slack, static_cast<std::int64_t>(all.size())),
                                plan_error);
            }
    // The even cut is always one of them, and slack 0 leaves only the ways to place the
    // remainder: 10 layers into 4 ranges of 2 or 3 layers, two of each.
    CHECK(plan::count_stage_ranges(10, 4, 0) == 6);
    CHECK(plan::count_stage_ranges(96, 4, -1) == 95 * 94 * 93 / 6);
    CHECK(plan::count_stage_ranges(4096, 64, -1) == plan::count_limit);  // saturates
    CHECK(plan::stage_range_index(8, 3, 1, plan::even_stage_starts(8, 3)) ==
          plan::stage_range_index(8, 3, 1, std::vector<std::int64_t>{0, 3, 6}));
    CHECK_THROWS_AS(plan::stage_range_index(8, 3, 0, std::vector<std::int64_t>{0, 1, 4}), plan_error);  // 1 < 2
}

TEST_CASE("open stage boundaries resolve to the cut chosen, and every mistake says which") {
    const auto model = small_gpt();  // 4 layers
    constexpr auto space = plan::compose(plan::devices<2>, plan::stages<2>, plan::open_stage_boundaries<"cut">,
                                         plan::micro_batches<2>, plan::order<plan::OneFOneB>);
    CHECK(space.open_parameters() == std::vector<std::string>{"cut"});
    // Cut k of 4 layers into 2 ranges puts k + 1 layers on the first stage; the programs are
    // those of the same boundaries written by hand.
    for (std::int64_t k = 0; k < 3; ++k) {
        plan::plan_spec by_hand = space.spec();
        by_hand.stages->boundaries_open.clear();
        by_hand.stages->boundaries = {k + 1};
        const search::program_price a = search::price_programs(partition::apply_plan(model.ir(), space.choose("cut", k).spec()), search::dgx_a100(1));
        const search::program_price b = search::price_programs(partition::apply_plan(model.ir(), by_hand), search::dgx_a100(1));
        CHECK(a.step_seconds == b.step_seconds);
        CHECK(a.devices[0].compute == b.devices[0].compute);
        CHECK(a.devices[1].memory.arena == b.devices[1].memory.arena);
    }
    CHECK_THROWS_WITH(plan::resolve(space.spec(), model.ir()), Catch::Contains("open boundaries 'cut' have no value") &&
                                                                   Catch::Contains("0..2"));
    CHECK_THROWS_WITH(plan::resolve(space.choose("cut", 3).spec(), model.ir()),
                      Catch::Contains("'cut'") && Catch::Contains("does not exist: there are 3"));
    plan::plan_spec both = space.choose("cut", 0).spec();
    both.stages->boundaries = {2};
    CHECK_THROWS_WITH(plan::resolve(both, model.ir()), Catch::Contains("both given and open"));
    plan::plan_spec tight = plan::presets::pipeline(4, 4, {plan::schedule_kind::interleaved, 2});
    tight.stages->boundaries_open = "cut";
    tight.choices["cut"] = 0;
    CHECK_THROWS_WITH(plan::resolve(tight, model.ir()), Catch::Contains("4 layers do not cut into 8 ranges"));
}

TEST_CASE("the search chooses the stage boundaries, as pricing every cut would") {
    // A vocabulary large enough that the head outweighs a layer: the best cut moves layers
    // off the last stage.
    const auto model = models::gpt({.layers = 6, .hidden = 64, .heads = 4, .vocab = 4096, .seq = 32, .batch = 8});
    plan::plan_spec space = plan::presets::pipeline(2, 4, {plan::schedule_kind::one_f_one_b});
    space.stages->boundaries_open = "cut";
    const search::cluster hw = slow_node();
    search::plan_search_options o;
    const exhaustive all = price_everything(model.ir(), space, hw, o);
    CHECK(all.legal == 5);
    const search::plan_search_result r = search::search_plan(model.ir(), space, hw, o);
    INFO(r.explain());
    CHECK(r.best.price.step_seconds == Approx(all.best_step).epsilon(1e-12));
    CHECK(r.best.choices == all.best);
    CHECK(r.gap == 0);
    // The filled plan names its boundaries, as if written by hand, and prices the same.
    REQUIRE(r.plan.stages);
    CHECK(r.plan.stages->boundaries_open.empty());
    CHECK(r.plan.choices.count("cut") == 0);
    REQUIRE(r.plan.stages->boundaries.size() == 1);
    CHECK(r.plan.stages->boundaries[0] > 3);  // more layers before the head's stage than after
    CHECK(search::price_programs(partition::apply_plan(model.ir(), r.plan), hw, o.price).step_seconds ==
          r.best.price.step_seconds);
    const std::int64_t first = r.plan.stages->boundaries[0];
    CHECK(r.explain().find("cut = " + std::to_string(first) + " + " + std::to_string(6 - first) + " layers") !=
          std::string::npos);

    // With the stage count open too, each count has its own cuts; a slack narrows them.
    plan::plan_spec open_count = space;
    open_count.devices = 4;
    open_count.stages->count = {1, "pp", {}};
    open_count.stages->boundary_slack = 0;  // one cut at 1 and 2 stages; at 4, the 6 orders of 2 + 2 + 1 + 1
    const auto params = search::open_parameter_candidates(open_count, 8, 6);
    std::map<std::int64_t, int> cuts_per_stage_count;
    search::for_each_assignment(open_count, params, [&](const plan::plan_spec& c) { ++cuts_per_stage_count[c.choices.at("pp")]; });
    CHECK(cuts_per_stage_count == std::map<std::int64_t, int>{{1, 1}, {2, 1}, {4, 6}});
    CHECK(price_everything(model.ir(), open_count, hw, o).legal > 3);
}

TEST_CASE("open boundaries with too many cuts to try take the even one, and the result says so") {
    // 22 layers in 11 stages: C(21, 10) = 352716 cuts, more than max_boundary_cuts.
    const auto model = models::gpt({.layers = 22, .hidden = 16, .heads = 2, .vocab = 32, .seq = 8, .batch = 2});
    plan::plan_spec space = plan::presets::pipeline(11, 1);
    space.stages->boundaries_open = "cut";
    REQUIRE(plan::count_stage_ranges(22, 11, -1) > search::max_boundary_cuts);
    const search::plan_search_result r = search::search_plan(model.ir(), space, search::dgx_a100(2));
    INFO(r.explain());
    CHECK(r.stats.assignments == 1);
    CHECK(r.stats.even_cut_only == 1);
    const std::vector<std::int64_t> even{2, 4, 6, 8, 10, 12, 14, 16, 18, 20};
    CHECK(r.plan.stages->boundaries == even);
    CHECK(r.explain().find("1 with the even stage cut only") != std::string::npos);
    // Within one layer of even there are fewer, and all of them are tried.
    space.stages->boundary_slack = 1;
    const auto params = search::open_parameter_candidates(space, 2, 22);
    int tried = 0;
    search::for_each_assignment(space, params, [&](const plan::plan_spec&) { ++tried; });
    CHECK(tried == plan::count_stage_ranges(22, 11, 1));
    CHECK(tried > 1000);
}

TEST_CASE("the bound never exceeds the programs' price, on every leaf of several spaces") {
    const search::cluster one_node = search::dgx_a100(1);
    const search::cluster two_nodes = search::dgx_a100(2);
    search::plan_search_options o;
    SECTION("tensor and data parallelism on a GPT, one node and two") {
        const auto model = small_gpt();
        CHECK(price_everything(model.ir(), open_megatron(8), one_node, o).legal > 3);
        CHECK(price_everything(model.ir(), open_megatron(16), two_nodes, o).legal > 3);
    }
    SECTION("a T5-style encoder-decoder") {
        const auto model = models::t5({.encoder_layers = 2, .decoder_layers = 2, .hidden = 64, .heads = 4, .batch = 4});
        plan::plan_spec space = open_megatron(4);
        space.zero_open = "zero";
        CHECK(price_everything(model.ir(), space, one_node, o).legal > 3);
    }
    SECTION("devices sharing one machine, with calibrated rates for some op kinds") {
        o.price.overlap = false;
        o.price.compute_shared_by = 4;
        o.price.rates["linear"] = {{{1e5, 5e-6}, {1e6, 2e-5}, {1e7, 1.5e-4}}, true};
        o.price.rates["linear_grad_weight"] = {{{1e5, 1e-7}, {1e7, 4e-5}}, true};  // faster than the roofline
        o.price.rates["layer_norm"] = {{{1e4, 2e-6}, {1e5, 9e-6}}, false};
        o.price.rates["attention_grad"] = {{{1e6, 1e-6}}, true};
        const auto model = small_gpt();
        CHECK(price_everything(model.ir(), open_pipeline(4), slow_node(), o).legal > 3);
    }
    SECTION("devices sharing one machine that each run faster alone than their share of it (processes of their own)") {
        o.price.overlap = false;
        o.price.compute_shared_by = 4;
        o.price.rates["linear"] = {{{1e5, 5e-6}, {1e6, 2e-5}, {1e7, 1.5e-4}}, true};
        o.price.rates["linear_grad_input"] = {{{1e5, 8e-6}, {1e7, 2e-4}}, true};
        o.price.rates["layer_norm"] = {{{1e4, 2e-6}, {1e5, 9e-6}}, false};
        // Alone: the linear at half its share of the machine's time together, the input
        // gradient at a fifth (the bound must scale by the fastest), the norm slower.
        o.price.solo_rates["linear"] = {{{1e5, 5e-6 / 8}, {1e6, 2e-5 / 8}, {1e7, 1.5e-4 / 8}}, true};
        o.price.solo_rates["linear_grad_input"] = {{{1e5, 8e-6 / 20}, {1e7, 2e-4 / 20}}, true};
        o.price.solo_rates["layer_norm"] = {{{1e4, 1e-6}, {1e5, 9e-6}}, false};
        const auto model = small_gpt();
        CHECK(price_everything(model.ir(), open_pipeline(4), slow_node(), o).legal > 3);
    }
    SECTION("pipelines in bf16 with one stream per device") {
        o.price.storage = loom::precision::bf16;
        o.price.overlap = false;
        o.price.instruction_overhead = 5e-6;
        const auto model = small_gpt();
        CHECK(price_everything(model.ir(), open_pipeline(8), one_node, o).legal > 3);
    }
    SECTION("every order, recomputation and open boundaries (nnScaler's space), where bubbles dominate") {
        // A slow node: compute outweighs latency, so the dependencies raise bounds to
        // nearly the price, the regime where a wrong chain would show.
        plan::plan_spec space = plan::spaces::nnscaler(4).narrow("mb", {2, 4}).narrow("zero", {0, 3}).narrow("coshard", {1, 2});
        const auto model = small_gpt();
        const exhaustive all = price_everything(model.ir(), space, slow_node(), o);
        CHECK(all.coshard > 5);
        CHECK(all.legal > 50);
        CHECK(all.raised_by_model > all.legal / 2);
        CHECK(all.activations_counted > all.legal);  // on most devices of most leaves
        // The search, pruning by these bounds, proves what pricing every leaf finds.
        const search::plan_search_result r = search::search_plan(model.ir(), space, slow_node(), o);
        CHECK(r.best.price.step_seconds == Approx(all.best_step).epsilon(1e-12));
        CHECK(r.gap == 0);
        CHECK(r.stats.pruned > all.legal / 3);
        // Refusals settled by a prefix of the choices (a stage group the degrees do not fill)
        // skip the assignments that share it, which still count, as refused.
        std::int64_t every = 0;
        search::for_each_assignment(space, r.parameters, [&](const plan::plan_spec&) { ++every; });
        CHECK(r.stats.assignments == every);
        CHECK(r.stats.skipped > every / 2);
        CHECK(r.stats.refused + r.stats.priced + r.stats.pruned + r.stats.over_memory_unpriced == every);
    }
}

TEST_CASE("the bound sees a pipeline's bubbles and recomputation's second forward, below the price") {
    // A slow node, where compute sets the step: 1F1B on 4 stages idles (S - 1) / m of the
    // stages' work, and the bound must see it.
    const search::cluster c = slow_node();
    const auto model = models::gpt({.layers = 8, .hidden = 64, .heads = 4, .vocab = 64, .seq = 32, .batch = 16});
    const graph g = model.ir();
    const search::price_options o;
    const auto work = search::training_work_of(g, c.device, o);
    auto pipeline = [](int stages, int micro_batches, bool recompute, int dp = 1, int tp = 1) {
        return even_pipeline(stages, micro_batches, recompute, dp, tp);
    };
    struct bounded {
        double compute, bound, price;
    };
    auto bound_of = [&](const plan::plan_spec& p) {
        const plan::resolved_plan rp = plan::resolve(p, g);
        const auto compute = search::detail::compute_lower_bound(rp, work, o, &g);
        double busiest = 0;
        for (std::size_t d = 0; d < compute.forward.size(); ++d) busiest = std::max(busiest, compute.total(d));
        return bounded{busiest, search::step_lower_bound(rp, work, o, &g, &c),
                       search::price_programs(partition::apply_plan(g, p), c, o).step_seconds};
    };
    const bounded few = bound_of(pipeline(4, 4, false)), many = bound_of(pipeline(4, 16, false));
    for (const bounded& b : {few, many}) CHECK(b.bound <= b.price * (1 + 1e-12));
    CHECK(few.bound > 1.3 * few.compute);  // the busiest stage's work and the bubble before and after it
    CHECK(few.bound / few.compute > many.bound / many.compute);  // more micro-batches, a smaller bubble
    // Recomputing every layer replays its forward: more compute on every stage.
    const bounded replayed = bound_of(pipeline(4, 4, true));
    CHECK(replayed.compute > 1.1 * few.compute);
    CHECK(replayed.bound > few.bound);
    CHECK(replayed.bound <= replayed.price * (1 + 1e-12));
    // Stages on groups of devices (data or tensor parallelism inside them) idle as much: the
    // order is played with each group as one device.
    for (const auto& [dp, tp] : {std::pair{2, 1}, std::pair{1, 2}}) {
        INFO("dp " << dp << ", tp " << tp);
        const bounded grouped = bound_of(pipeline(4, 4, false, dp, tp));
        CHECK(grouped.bound <= grouped.price * (1 + 1e-12));
        CHECK(grouped.bound > 1.3 * grouped.compute);
    }
}

TEST_CASE("a pipeline whose stages run on groups of devices is ordered as one device per group") {
    const schedule::schedule one = schedule::one_f_one_b(4, 8);
    const auto grouped = search::detail::pipeline_groups(plan::detail::spread_over_groups(one, 2));
    REQUIRE(grouped);
    CHECK(grouped->shape.devices == 4);
    CHECK(grouped->device_order == one.device_order);
    CHECK(grouped->shape.stage_devices == one.shape.stage_devices);
    const schedule::schedule interleaved = schedule::interleaved_one_f_one_b(2, 2, 4);
    const auto chunks = search::detail::pipeline_groups(plan::detail::spread_over_groups(interleaved, 4));
    REQUIRE(chunks);
    CHECK(chunks->device_order == interleaved.device_order);
    CHECK(chunks->shape.stage_devices == interleaved.shape.stage_devices);
    // The interlaced pipeline's embedding and head run on every device: no group is one device.
    CHECK_FALSE(search::detail::pipeline_groups(schedule::interlaced(2, 4, 2)));
}

TEST_CASE("every order on groups of devices is its order on one device per stage, spread over the groups") {
    // plan::resolve builds each order for one device per stage and spreads it
    // (plan::detail::pipeline_order): the list scheduler that orders the interlaced pipeline
    // grows with the devices, so building it on 512-device stages took most of a search.
    for (int stages : {2, 3, 4})
        for (int micro : {1, 4, 7})
            for (int group : {2, 3, 8}) {
                INFO(stages << " stages, " << micro << " micro-batches, groups of " << group);
                const schedule::schedule whole = schedule::interlaced(stages, micro, group);
                const schedule::schedule spread = plan::detail::spread_over_groups(schedule::interlaced(stages, micro, 1), group);
                CHECK(spread.shape.stage_devices == whole.shape.stage_devices);
                CHECK(spread.device_order == whole.device_order);
                const plan::order_policy policy{plan::schedule_kind::interlaced};
                const schedule::schedule resolved = plan::detail::pipeline_order(policy, stages, micro, group);
                CHECK(resolved.device_order == whole.device_order);
                CHECK(schedule::validation_error(resolved).empty());
            }
    for (const plan::order_policy& policy : {plan::order_policy{plan::schedule_kind::gpipe},
                                             plan::order_policy{plan::schedule_kind::one_f_one_b},
                                             plan::order_policy{plan::schedule_kind::interleaved, 2}}) {
        const schedule::schedule built = plan::detail::built_pipeline_order(policy, 4, 8, 4);
        CHECK(plan::detail::pipeline_order(policy, 4, 8, 4).device_order == built.device_order);
        CHECK(schedule::validation_error(built).empty());
    }
}

TEST_CASE("the memory floor counts the activations each device keeps in flight, as the order holds them") {
    // Many tokens and small weights: the saved activations fill the memory. GPipe holds every
    // micro-batch on every stage before the first backward; 1F1B holds S - s on stage s.
    const auto model = models::gpt({.layers = 8, .hidden = 64, .heads = 4, .vocab = 64, .seq = 64, .batch = 16});
    const graph g = model.ir();
    const search::price_options o;
    const floor_and_price gpipe = pipeline_floor(g, plan::schedule_kind::gpipe, 4, 8, false);
    const floor_and_price one_f_one_b = pipeline_floor(g, plan::schedule_kind::one_f_one_b, 4, 8, false);
    const floor_and_price recomputed = pipeline_floor(g, plan::schedule_kind::gpipe, 4, 8, true);
    // One micro-batch: no op carries a micro-batch split, and what each keeps it keeps for
    // the whole batch (a floor that skipped them counted no activations at all, 2% of the
    // price of such 24-layer plans on 8 GPUs).
    const floor_and_price whole_batch = pipeline_floor(g, plan::schedule_kind::one_f_one_b, 4, 1, false);
    for (const floor_and_price* f : {&gpipe, &one_f_one_b, &recomputed, &whole_batch})
        for (std::size_t d = 0; d < 4; ++d) {
            CHECK(f->least.total(d) <= f->price.devices[d].memory.total() * (1 + 1e-12));
            CHECK(f->least.activations[d] > 0);
        }
    // The middle stages keep the same per micro-batch: 8 in flight under GPipe, 4 - s under
    // 1F1B. From its first backward block on, 1F1B's stage also holds the partial sums of its
    // weights' gradients over the micro-batches (each micro-batch's stays until the next one's
    // is added), beside 4 - s in flight again after each backward's next forward: the
    // parameters' bytes, a quarter of what it keeps for them (f32 parameters and gradients,
    // 8 bytes of optimizer state). GPipe's eight in flight outweigh seven and those sums.
    for (std::size_t d = 1; d < 3; ++d) {
        const double per_micro_batch = gpipe.least.activations[d] / 8.0;
        const double partial_sums = one_f_one_b.least.whole[d] * 4.0 / (8.0 + o.optimizer_bytes_per_element);
        CHECK(partial_sums < per_micro_batch);
        CHECK(one_f_one_b.least.activations[d] == Approx(per_micro_batch * static_cast<double>(4 - d)));
        CHECK(one_f_one_b.least.in_flight(d) == Approx(per_micro_batch * static_cast<double>(4 - d) + partial_sums));
        CHECK(gpipe.least.in_flight(d) == Approx(gpipe.least.activations[d]));
    }
    // Without recomputation the activations are most of what the programs hold.
    CHECK(gpipe.least.peak() > 0.5 * gpipe.price.peak_memory());
    // Recomputed layers keep only what their replay starts from.
    CHECK(recomputed.least.activations[1] < 0.5 * gpipe.least.activations[1]);
    // GPipe's 8 micro-batches in flight keep what the one whole batch keeps.
    for (std::size_t d = 1; d < 3; ++d) CHECK(whole_batch.least.activations[d] == Approx(gpipe.least.activations[d]));
}

TEST_CASE("the memory floor counts the partial sums of the weights' gradients over micro-batches") {
    // Few tokens and large weights, one stage of 8 micro-batches: what one micro-batch keeps
    // for its backward is small beside the partial sums of the weights' gradients, which the
    // device holds from the first micro-batch's backward to the last (the program adds each
    // micro-batch's to the sum of those before it). On 8 GPUs a 24-layer GPT of ZeRO-3 over 8
    // replicas with 128 micro-batches priced at 121 GiB a device where its floor said 51: the
    // descent of a budgeted search took such plans for fitting and priced nothing else.
    const auto model = models::gpt({.layers = 2, .hidden = 256, .heads = 4, .vocab = 64, .seq = 4, .batch = 16});
    const graph g = model.ir();
    const search::price_options o;
    for (const plan::schedule_kind order : {plan::schedule_kind::one_f_one_b, plan::schedule_kind::gpipe})
        for (const int stages : {1, 2}) {
            const auto [least, price] = pipeline_floor(g, order, stages, 8, false);
            for (std::size_t d = 0; d < least.whole.size(); ++d) {
                INFO((order == plan::schedule_kind::gpipe ? "GPipe" : "1F1B") << ", stages " << stages << ", device " << d);
                // The parameters' bytes: f32 parameters and gradients, 8 bytes of optimizer state.
                const double parameters = least.whole[d] * 4.0 / (8.0 + o.optimizer_bytes_per_element);
                CHECK(least.activations[d] < parameters);  // 8 micro-batches in flight keep a third of that
                CHECK(least.in_flight(d) >= parameters);
                CHECK(least.total(d) <= price.devices[d].memory.total() * (1 + 1e-12));
                CHECK(price.devices[d].memory.arena >= parameters);
            }
        }
}

TEST_CASE("the memory floor counts the parameters, gradients and optimizer state each device keeps, as ZeRO shards them") {
    // Few tokens: the weights, not the activations, fill the memory.
    const auto model = models::gpt({.layers = 2, .hidden = 256, .heads = 4, .vocab = 4096, .seq = 8, .batch = 4});
    const graph g = model.ir();
    const search::cluster c = search::dgx_a100(1);
    search::price_options o;
    o.runtime_bytes = 1e6;
    std::vector<double> floors;
    for (int zero = 0; zero <= 3; ++zero) {
        INFO("ZeRO-" << zero);
        plan::plan_spec p = open_megatron(4);
        p.choices = {{"tp", 1}, {"dp", 4}};
        p.zero = static_cast<plan::zero_stage>(zero);
        const search::memory_floor least = search::memory_lower_bound(plan::resolve(p, g), g, o);
        const search::program_price price = search::price_programs(partition::apply_plan(g, p), c, o);
        for (std::size_t d = 0; d < 4; ++d) CHECK(least.whole[d] + least.sharded[d] + o.runtime_bytes <= price.devices[d].memory.total());
        // Without ZeRO that is most of it; with ZeRO the full gradients and gathered
        // parameters that pass through the arena come on top.
        if (zero == 0) CHECK(least.peak() + o.runtime_bytes > 0.6 * price.peak_memory());
        floors.push_back(least.peak());
    }
    // Each stage shards one more of the three over the 4 replicas: AdamW's 8 bytes per
    // element, then the 4-byte gradients, then the 4-byte parameters.
    const double elements = floors[0] / 16;
    CHECK(floors[1] == Approx(elements * (4 + 4 + 8.0 / 4)));
    CHECK(floors[2] == Approx(elements * (4 + 4.0 / 4 + 8.0 / 4)));
    CHECK(floors[3] == Approx(elements * (4.0 + 4 + 8) / 4));
}

TEST_CASE("the memory floor counts every region that colocated pieces hold (Coshard)") {
    // Few tokens: the weights fill the memory. TP 2, each piece of the recomputed layers run
    // as `cs` colocated pieces on its device: whatever the factor, a device keeps its whole
    // half of those weights, their gradients and AdamW state. A floor that counted one piece
    // per device saw 1/cs of them, and let the search price plans of several times the
    // memory (24-layer GPTs on 8 GPUs: floors of 4% to 40% of the price).
    const auto model = models::gpt({.layers = 2, .hidden = 256, .heads = 8, .vocab = 4096, .seq = 8, .batch = 4});
    const graph g = model.ir();
    const search::cluster c = search::dgx_a100(1);
    search::price_options o;
    o.runtime_bytes = 0;
    const plan::plan_spec space = plan::presets::coshard(plan::degree_spec{2, "", {}}, plan::degree_spec{1, "cs", {}});
    std::vector<double> kept;
    for (int cs : {1, 2, 4}) {
        INFO("Coshard " << cs);
        const plan::plan_spec p = plan::plan_spec(space).choose("cs", cs);
        const search::memory_floor least = search::memory_lower_bound(plan::resolve(p, g), g, o);
        const search::program_price price = search::price_programs(partition::apply_plan(g, p), c, o);
        for (std::size_t d = 0; d < 2; ++d) {
            CHECK(least.whole[d] + least.sharded[d] <= price.devices[d].memory.total() * (1 + 1e-12));
            CHECK(least.whole[d] + least.sharded[d] > 0.9 * (price.devices[d].memory.bound + price.devices[d].memory.optimizer));
        }
        kept.push_back(least.whole[0] + least.sharded[0]);
    }
    CHECK(kept[1] == Approx(kept[0]));
    CHECK(kept[2] == Approx(kept[0]));
}

TEST_CASE("the compute bound of colocated pieces is the work they do, whatever the factor (Coshard)") {
    // TP 2, each layer's attention and MLP pieces cut cs times more, all cs on one device:
    // a device does the same GEMMs whatever cs, in more, narrower pieces. Each piece of a
    // column-parallel linear still contracts the whole hidden size (it writes cs times fewer
    // columns), so it prices as a GEMM. A bound that took every cut to fall on the contracted
    // dimension priced the pieces of cs 8 at the element-wise roofline: at 1024 GPUs a
    // Coshard plan bounded at a third of its compute, below the devices' peak FLOP/s, and the
    // folded bound's line through its instances bent down.
    const auto model = models::gpt({.layers = 2, .hidden = 64, .heads = 16, .vocab = 512, .seq = 16, .batch = 4});
    const graph g = model.ir();
    const search::cluster c = search::dgx_a100(1);
    search::price_options o;
    o.instruction_overhead = 0;  // cs times as many instructions: the work alone
    const auto work = search::training_work_of(g, c.device, o);
    const plan::plan_spec space = plan::presets::coshard(plan::degree_spec{2, "", {}}, plan::degree_spec{1, "cs", {}});
    std::vector<double> busiest;
    for (int cs : {1, 2, 4, 8}) {
        INFO("Coshard " << cs);
        const plan::plan_spec p = plan::plan_spec(space).choose("cs", cs);
        const plan::resolved_plan rp = plan::resolve(p, g);
        const auto compute = search::detail::compute_lower_bound(rp, work, o, &g);
        double most = 0;
        for (std::size_t d = 0; d < compute.forward.size(); ++d) most = std::max(most, compute.total(d));
        const search::program_price price = search::price_programs(partition::apply_plan(g, p), c, o);
        CHECK(search::step_lower_bound(rp, work, o, &g, &c) <= price.step_seconds * (1 + 1e-12));
        busiest.push_back(most);
    }
    for (std::size_t k = 1; k < busiest.size(); ++k) CHECK(busiest[k] >= 0.97 * busiest[0]);
}

TEST_CASE("a calibrated op rate interpolates its points and bounds them from below") {
    const search::op_rate r{{{100, 1.0}, {200, 1.5}, {400, 3.5}}, true};
    CHECK(r.seconds(50) == Approx(0.5));     // proportional below the first point
    CHECK(r.seconds(150) == Approx(1.25));   // interpolated
    CHECK(r.seconds(600) == Approx(5.5));    // the last slope beyond
    for (double u : {1.0, 50.0, 100.0, 150.0, 200.0, 300.0, 400.0, 1e4}) CHECK(r.seconds(u) >= u * r.least_per_unit() - 1e-12);
    CHECK(r.least_per_unit() == Approx(0.0075));
    // The least an instruction of at least u units costs: the curve at u, or a point beyond
    // it that was measured faster (a dip at 400 units after 300).
    const search::op_rate dip{{{100, 1.0}, {300, 4.0}, {400, 3.0}, {800, 7.0}}, true};
    CHECK(dip.least_seconds_from(50) == Approx(0.5));
    CHECK(dip.least_seconds_from(200) == Approx(2.5));
    CHECK(dip.least_seconds_from(350) == Approx(3.0));  // 400 units take 3.0, less than 350 (3.5)
    CHECK(dip.least_seconds_from(600) == Approx(5.0));
    CHECK(dip.least_seconds_from(0) == 0);
    for (double u : {1.0, 50.0, 150.0, 300.0, 350.0, 500.0, 1e4}) {
        CHECK(dip.least_seconds_from(u) >= u * dip.least_per_unit() - 1e-12);
        for (double beyond : {u, 1.1 * u, 2 * u, 10 * u}) CHECK(dip.least_seconds_from(u) <= dip.seconds(beyond) + 1e-12);
    }
}

TEST_CASE("the bound prices small pieces at a calibrated curve's rate for their size") {
    // Host-like curves: an instruction of a thousandth of the largest size measured costs a
    // hundredth of it, so micro-batches cost more per FLOP or byte the smaller they are
    // (sixteen of one sample price 1.7 times one of sixteen samples here). The
    // bound of one device's step grows with the micro-batches as its price does, and stays
    // below it; so does the bound of devices sharing one machine, from their solo rates.
    const models::gpt_config config{.layers = 2, .hidden = 64, .heads = 4, .vocab = 64, .seq = 32, .batch = 16};
    const graph g = models::gpt(config).ir();
    const search::cluster c = slow_node();
    auto host_like = [](double largest, double seconds, bool per_flop) {
        return search::op_rate_from_samples(
            {{largest / 1000, seconds / 100}, {largest / 30, seconds / 15}, {largest, seconds}}, per_flop);
    };
    search::price_options o;
    const graph training = models::gpt(config).training_graph();
    for (const node& n : training.nodes) {
        const double flops = n.op->flops ? n.op->flops(training, n) : 0.0;
        const double bytes = search::detail::node_bytes(training, n, o.storage);
        const bool per_flop = search::priced_per_flop(flops, bytes);
        const double units = per_flop ? flops : bytes;
        const auto known = o.rates.find(n.op->name);
        if (units > 0 && (known == o.rates.end() || known->second.points.back().first < units))
            o.rates[std::string(n.op->name)] = host_like(units, 1e-3, per_flop);
    }
    REQUIRE(o.rates.size() > 5);
    const auto work = search::training_work_of(g, c.device, o);
    auto bounded = [&](int micro_batches, const search::price_options& with) {
        plan::plan_spec p = plan::presets::megatron(1, 1);
        p.devices = with.compute_shared_by > 1 ? with.compute_shared_by : 1;
        if (micro_batches > 1) p.micro_batches = {micro_batches, "", {}};
        const plan::resolved_plan rp = plan::resolve(p, g);
        const double bound = search::step_lower_bound(rp, work, with, &g, &c);
        const double price = search::price_programs(partition::apply_plan(g, p), c, with).step_seconds;
        CHECK(bound <= price * (1 + 1e-12));
        return std::pair{bound, price};
    };
    const auto [one, one_price] = bounded(1, o);
    const auto [sixteen, sixteen_price] = bounded(16, o);
    CHECK(sixteen_price > 1.5 * one_price);
    CHECK(sixteen > 1.15 * one);  // at the rate's best per unit, both bounds would be the same
    // Four devices sharing the machine, one of them computing: its ops alone at a third of
    // their time together.
    search::price_options shared = o;
    shared.compute_shared_by = 4;
    for (const auto& [kind, rate] : o.rates) {
        search::op_rate faster = rate;
        for (auto& point : faster.points) point.second /= 3;
        shared.solo_rates[kind] = faster;
    }
    const auto [shared_one, shared_one_price] = bounded(1, shared);
    const auto [shared_sixteen, shared_sixteen_price] = bounded(16, shared);
    CHECK(shared_sixteen_price > 1.5 * shared_one_price);
    CHECK(shared_sixteen > 1.15 * shared_one);
}

TEST_CASE("candidates are every divisor, not powers of two only") {
    auto model = models::gpt({.layers = 6, .hidden = 48, .heads = 6, .vocab = 96, .seq = 16, .batch = 12});
    plan::plan_spec space = open_megatron(6);
    space.stages = plan::stage_spec{};
    space.stages->count = {1, "pp", {}};
    space.micro_batches = {1, "mb", {}};
    const auto params = search::open_parameter_candidates(space, search::batch_of(model.ir()));
    std::map<std::string, std::vector<std::int64_t>> by_name;
    for (const auto& p : params) by_name[p.name] = p.candidates;
    CHECK(by_name["tp"] == std::vector<std::int64_t>{1, 2, 3, 6});
    CHECK(by_name["pp"] == std::vector<std::int64_t>{1, 2, 3, 6});
    CHECK(by_name["mb"] == std::vector<std::int64_t>{1, 2, 3, 4, 6, 12});

    // And the search may choose a degree of 3.
    const search::plan_search_result r = search::search_plan(model.ir(), space, search::dgx_a100(1));
    CHECK(r.gap == 0);
    CHECK(r.stats.priced > 10);
}

TEST_CASE("an empty space says which constraint empties it") {
    const auto model = small_gpt();
    SECTION("a structural refusal") {
        plan::plan_spec space = plan::presets::data_parallel(4);
        space.stages = plan::stage_spec{};
        space.stages->count = {1, "pp", {3}};  // 3 stages do not divide 4 devices
        try {
            search::search_plan(model.ir(), space, search::dgx_a100(1));
            FAIL("an empty space was searched");
        } catch (const search::search_error& e) {
            const std::string what = e.what();
            INFO(what);
            CHECK(what.find("every one of its 1 assignments is refused") != std::string::npos);
            CHECK(what.find("pp = 3") != std::string::npos);
        }
    }
    SECTION("memory") {
        // Above the memory of any plan's model state, spread over the 4 devices: each
        // assignment's floor is over it (activations, and norms no split of this space
        // shards), and the search says which needs least.
        search::plan_search_options o;
        o.memory_limit = search::any_plan_memory_floor(model.ir(), 4, o.price) * (1 + 1e-9);
        try {
            search::search_plan(model.ir(), open_megatron(4), search::dgx_a100(1), o);
            FAIL("a space that cannot fit was searched");
        } catch (const search::search_error& e) {
            const std::string what = e.what();
            INFO(what);
            CHECK(what.find("exceed") != std::string::npos);
            CHECK(what.find("the smallest") != std::string::npos);
            // Every assignment is set aside by its floor, unpriced.
            CHECK(what.find("needs at least") != std::string::npos);
            CHECK(what.find("for its weights, gradients, optimizer state and activations in flight") != std::string::npos);
        }
    }
    SECTION("memory that no plan has") {
        // Below the model state of any plan, spread over every device: the search says so
        // before bounding an assignment, with or without a budget, folded or not.
        search::plan_search_options o;
        const double least = search::any_plan_memory_floor(model.ir(), 4, o.price);
        // Every weight's element, its gradient (both fp32 here) and optimizer state, over 4
        // devices: the parameters as the architecture counts them.
        const auto elements = static_cast<double>(model.config.parameter_count());
        CHECK(least == Approx(elements * (4 + 4 + o.price.optimizer_bytes_per_element) / 4 + o.price.runtime_bytes));
        o.memory_limit = least * (1 - 1e-9);
        o.time_budget_seconds = 60;
        try {
            search::search_plan(model.ir(), plan::spaces::nnscaler(4), search::dgx_a100(1), o);
            FAIL("a space that cannot fit was searched");
        } catch (const search::search_error& e) {
            const std::string what = e.what();
            INFO(what);
            CHECK(what.find("no plan in the space fits: the model's weights, gradients and optimizer state alone, each "
                            "element held once over all 4 devices") != std::string::npos);
            CHECK(what.find("add devices") != std::string::npos);
        }
    }
    SECTION("ranges with nothing in common") {
        plan::plan_spec space = open_megatron(4);
        int narrowed = 0;
        for (auto& r : space.rules)
            for (auto& s : *r.trans)
                if (s.degree.open == "tp" && narrowed < 2) s.degree.allowed = {narrowed++ == 0 ? 3 : 2};
        CHECK_THROWS_WITH(search::open_parameter_candidates(space, search::batch_of(model.ir())),
                          Catch::Contains("has no candidate value"));
    }
}

TEST_CASE("a budget returns the best so far and its gap") {
    const auto model = small_gpt();
    search::plan_search_options o;
    o.max_priced = 2;
    const search::plan_search_result r = search::search_plan(model.ir(), open_pipeline(4), search::dgx_a100(1), o);
    CHECK(r.stats.priced <= 2 + r.stats.over_memory);
    CHECK(r.stats.unexplored > 0);
    CHECK(r.gap >= 0);
    CHECK(r.explain().find("left by the budget") != std::string::npos);
    const search::plan_search_result full = search::search_plan(model.ir(), open_pipeline(4), search::dgx_a100(1));
    CHECK(full.best.price.step_seconds <= r.best.price.step_seconds);
    // The gap bounds how far the budget's answer can be from the best.
    CHECK(r.best.price.step_seconds * (1 - r.gap) <= full.best.price.step_seconds * (1 + 1e-12));

    // A budget spent while bounding: the rest of the space is counted, not bounded, and the
    // answer is the best of what was bounded, unproven. The unbounded assignments count at
    // the floor of any plan (the whole training work over every device), so the gap is
    // still a true one, and less than 100%.
    search::plan_search_options hurried;
    hurried.time_budget_seconds = 1e-9;
    const search::plan_search_result h = search::search_plan(model.ir(), open_pipeline(4), search::dgx_a100(1), hurried);
    INFO(h.explain());
    CHECK(h.stats.assignments == full.stats.assignments);
    CHECK(h.stats.unbounded > 0);
    CHECK(h.stats.unbounded + h.stats.refused + h.stats.priced + h.stats.unexplored + h.stats.over_memory_unpriced ==
          h.stats.assignments);
    const double floor = search::any_plan_lower_bound(search::training_work_of(model.ir(), search::dgx_a100(1).device, {}),
                                                      open_pipeline(4).devices, {});
    CHECK(h.gap == Approx(1 - floor / h.best.price.step_seconds).epsilon(1e-12));
    CHECK(h.gap < 1.0);
    CHECK(h.best.price.step_seconds * (1 - h.gap) <= full.best.price.step_seconds * (1 + 1e-12));
    CHECK(h.explain().find("not even bounded within the budget") != std::string::npos);
    CHECK(h.explain().find("at most: to the whole training work spread over every device") != std::string::npos);
    CHECK(full.best.price.step_seconds <= h.best.price.step_seconds);
}

TEST_CASE("a budget that cuts the enumeration short descends from the best it bounded") {
    // nnScaler's space enumerates recompute, then the degrees and stage counts, first: its
    // first assignments keep every activation on one or two of the devices. A count budget
    // stops the enumeration there, deterministically, as a time budget does on large spaces.
    const auto model = small_gpt();
    const search::cluster hw = slow_node();
    const plan::plan_spec space =
        plan::spaces::nnscaler(4).narrow("coshard", {1, 2}).narrow("mb", {1, 2, 4}).narrow("zero", {0, 3});
    const search::plan_search_result full = search::search_plan(model.ir(), space, hw);
    REQUIRE(full.gap == 0);

    search::plan_search_options few;
    few.max_bounded = 8;
    const search::plan_search_result r = search::search_plan(model.ir(), space, hw, few);
    INFO(r.explain());
    CHECK(r.stats.assignments == full.stats.assignments);
    CHECK(r.stats.descended > 0);
    CHECK(r.stats.looked_at > r.stats.descended);  // it compares neighbours before each move
    CHECK(r.stats.unbounded > 0);
    CHECK(r.gap < 1.0);  // to the floor of any plan
    CHECK(r.best.price.step_seconds * (1 - r.gap) <= full.best.price.step_seconds * (1 + 1e-12));
    CHECK(r.explain().find("reached by a descent from the best bounded") != std::string::npos);
    // Every assignment is counted once: the descent's are no longer unbounded.
    CHECK(r.stats.unbounded + r.stats.refused + r.stats.priced + r.stats.unexplored + r.stats.pruned +
              r.stats.over_memory_unpriced ==
          r.stats.assignments);
    // The descent leaves the corner: the answer computes on every device, within a quarter
    // of the best of the whole space.
    for (const auto& d : r.best.price.devices) CHECK(d.compute >= 0.01 * r.best.price.max_compute());
    CHECK(r.best.price.step_seconds >= full.best.price.step_seconds * (1 - 1e-12));
    CHECK(r.best.price.step_seconds <= 1.25 * full.best.price.step_seconds);
    // Its plan is what it says: applied and priced again, the same step.
    CHECK(search::price_programs(partition::apply_plan(model.ir(), r.plan), hw).step_seconds == r.best.price.step_seconds);
}

TEST_CASE("prices follow first principles") {
    const auto model = small_gpt();
    const search::cluster hw = search::dgx_a100(2);
    SECTION("the makespan is at least every device's compute and communication") {
        const auto pg = partition::apply_plan(model.ir(), plan::presets::pipeline(2, 4, {plan::schedule_kind::one_f_one_b},
                                                                                   plan::presets::megatron(2)));
        const search::program_price p = search::price_programs(pg, hw);
        for (const auto& d : p.devices) {
            CHECK(d.compute <= p.makespan * (1 + 1e-12));
            CHECK(d.communication <= p.makespan * (1 + 1e-12));
            CHECK(d.finish <= p.makespan);
        }
        CHECK(p.idle_fraction() > 0);  // a pipeline has a bubble
    }
    SECTION("more micro-batches shrink the pipeline's bubble, toward (p - 1) / (m + p - 1)") {
        double last = 1.0;
        for (int m : {1, 2, 4, 8}) {
            const auto pg = partition::apply_plan(model.ir(), plan::presets::pipeline(4, m, {plan::schedule_kind::one_f_one_b}));
            const double idle = search::price_programs(pg, slow_node()).idle_fraction();
            CHECK(idle < last);
            // Stages are not even (the embedding and the head sit on the first and last),
            // so the bubble is at least the uniform pipeline's.
            CHECK(idle >= 3.0 / (m + 3) - 0.02);
            last = idle;
        }
    }
    SECTION("devices that share a machine take at least all their work at its rate") {
        const auto pg = partition::apply_plan(model.ir(), plan::presets::data_parallel(4));
        search::price_options alone, shared;
        shared.compute_shared_by = 4;
        const auto a = search::price_programs(pg, slow_node(), alone);
        const auto s = search::price_programs(pg, slow_node(), shared);
        double work = 0;
        for (const auto& d : s.devices) work += d.compute;
        CHECK(s.step_seconds >= work);
        // Data parallelism keeps all four busy at once: sharing one machine among four is
        // nearly as slow as each having a quarter of it (its copies run at the machine's
        // rate, so a little faster).
        CHECK(s.step_seconds <= a.step_seconds);
        CHECK(s.step_seconds >= 0.7 * a.step_seconds);
        // A pipeline of one micro-batch runs one stage at a time: sharing costs it nothing.
        const auto pipe = partition::apply_plan(model.ir(), plan::presets::pipeline(4, 1));
        CHECK(search::price_programs(pipe, slow_node(), shared).step_seconds <
              0.5 * search::price_programs(pipe, slow_node(), alone).step_seconds);
    }
    SECTION("devices sharing a machine run alone at their solo rates, and together at their rates together") {
        search::price_options together;
        together.compute_shared_by = 4;
        together.overlap = false;
        for (const char* kind : {"linear", "linear_bias", "linear_grad_input", "linear_grad_weight"})
            together.rates[kind] = {{{1e5, 4e-5}, {1e8, 4e-2}}, true};
        // Processes that interleave on shared cores: four together do more than one alone,
        // which takes half its rate together (twice the machine's share, 4e-5 / 4 per 1e5
        // FLOPs). And processes that thrash together: one alone runs faster than its share.
        search::price_options slow_alone = together, fast_alone = together;
        for (const auto& [kind, rate] : together.rates) {
            slow_alone.solo_rates[kind] = {{{1e5, 2e-5}, {1e8, 2e-2}}, true};
            fast_alone.solo_rates[kind] = {{{1e5, 5e-6}, {1e8, 5e-3}}, true};
        }
        // A pipeline of one micro-batch runs one stage at a time, each at its solo rate.
        const auto pipe = partition::apply_plan(model.ir(), plan::presets::pipeline(4, 1));
        const double p_machine = search::price_programs(pipe, slow_node(), together).step_seconds;
        const double p_slow = search::price_programs(pipe, slow_node(), slow_alone).step_seconds;
        const double p_fast = search::price_programs(pipe, slow_node(), fast_alone).step_seconds;
        CHECK(p_slow > 1.2 * p_machine);
        CHECK(p_slow <= 2 * p_machine);
        // Alone faster: the machine does each instruction no slower than alone, so the
        // step shrinks too, by at most half (the linear layers' share).
        CHECK(p_fast < 0.9 * p_machine);
        CHECK(p_fast >= 0.5 * p_machine);
        // Data parallelism keeps all four busy: the step is all their work at the rates
        // together, spread over the machine, however slowly one would run alone (the
        // machine does each instruction no slower than alone, here faster).
        const auto dp = partition::apply_plan(model.ir(), plan::presets::data_parallel(4));
        const auto d_machine = search::price_programs(dp, slow_node(), together);
        const auto d_slow = search::price_programs(dp, slow_node(), slow_alone);
        CHECK(d_slow.step_seconds == Approx(d_machine.step_seconds).epsilon(1e-9));
        double machine_compute = 0, alone_compute = 0;
        for (const auto& d : d_machine.devices) machine_compute += d.compute;
        for (const auto& d : d_slow.devices) alone_compute += d.compute;
        CHECK(alone_compute > 1.2 * machine_compute);  // each device's own timeline ran at the solo rates
        // All four compute at once all the time, so each instruction of theirs takes its time
        // together (here twice its time alone), as when solo and together rates are one.
        search::price_options same = together;
        same.solo_rates = together.rates;
        const auto d_same = search::price_programs(dp, slow_node(), same);
        for (std::size_t d = 0; d < d_slow.devices.size(); ++d)
            CHECK(d_slow.devices[d].compute == Approx(d_same.devices[d].compute).epsilon(1e-9));
        // A pipeline of many micro-batches keeps its stages busy at once part of the time:
        // its instructions stretch by more than alone and less than together.
        const auto pipe8 = partition::apply_plan(model.ir(), plan::presets::pipeline(4, 8));
        search::price_options only_alone = together;
        only_alone.rates = slow_alone.solo_rates;
        only_alone.solo_rates = slow_alone.solo_rates;
        const auto compute_of = [&](const search::price_options& po) {
            double sum = 0;
            for (const auto& d : search::price_programs(pipe8, slow_node(), po).devices) sum += d.compute;
            return sum;
        };
        const double c_alone = compute_of(only_alone), c_stretched = compute_of(slow_alone), c_together = compute_of(same);
        CHECK(c_stretched > 1.1 * c_alone);
        CHECK(c_stretched < 0.95 * c_together);
        CHECK(c_together < 2 * c_alone);  // the linear kinds take twice as long together, the others the same
        // Solo rates need rates together, and a shared machine.
        search::price_options orphan = slow_alone;
        orphan.rates.erase("linear");
        CHECK_THROWS_WITH(search::price_programs(dp, slow_node(), orphan),
                          Catch::Contains("'linear' has a solo rate but no rate together"));
        search::price_options unshared = slow_alone;
        unshared.compute_shared_by = 1;
        CHECK_THROWS_WITH(search::price_programs(dp, slow_node(), unshared), Catch::Contains("compute_shared_by = 1"));
    }
    SECTION("ZeRO-1 shards the optimizer state over the replicas, ZeRO-3 the parameters too") {
        const auto dp = search::price_programs(partition::apply_plan(model.ir(), plan::presets::data_parallel(4)), hw);
        const auto z1 = search::price_programs(partition::apply_plan(model.ir(), plan::presets::zero(1, 4)), hw);
        const auto z3 = search::price_programs(partition::apply_plan(model.ir(), plan::presets::zero(3, 4)), hw);
        CHECK(z1.devices[0].memory.optimizer == Approx(dp.devices[0].memory.optimizer / 4).epsilon(0.01));
        CHECK(z1.devices[0].memory.bound == dp.devices[0].memory.bound);
        CHECK(z3.devices[0].memory.bound < dp.devices[0].memory.bound);
        const double parameters = static_cast<double>(model.ir().parameter_count());
        CHECK(dp.devices[0].memory.optimizer == Approx(8 * parameters));
    }
    SECTION("ZeRO's closed forms (Rajbhandari et al., section 5) hold on the priced programs") {
        // Psi parameters in bf16 (2 bytes) with bf16 gradients, K = 12 optimizer bytes per
        // parameter, N = 4 replicas: ZeRO-1 keeps 2 Psi + 2 Psi + K Psi / N, ZeRO-2
        // 2 Psi + (2 + K) Psi / N, ZeRO-3 (2 + 2 + K) Psi / N. The inputs and the loss,
        // which each device binds too, cancel in the differences.
        search::price_options o;
        o.storage = precision::bf16;
        o.optimizer_bytes_per_element = 12;
        const double psi = static_cast<double>(model.ir().parameter_count()), n = 4;
        std::vector<search::device_memory> m;
        for (int zero : {0, 1, 2, 3}) {
            const plan::plan_spec p = zero == 0 ? plan::presets::data_parallel(4) : plan::presets::zero(zero, 4);
            m.push_back(search::price_programs(partition::apply_plan(model.ir(), p), hw, o).devices[0].memory);
        }
        CHECK(m[0].optimizer == Approx(12 * psi));
        for (int zero : {1, 2, 3}) CHECK(m[static_cast<std::size_t>(zero)].optimizer == Approx(12 * psi / n).epsilon(0.01));
        CHECK(m[1].bound == m[0].bound);
        CHECK(m[0].bound - m[2].bound == Approx(2 * psi * (1 - 1 / n)).epsilon(0.01));
        CHECK(m[0].bound - m[3].bound == Approx(4 * psi * (1 - 1 / n)).epsilon(0.01));
    }
    SECTION("the step after the programs: the norm, the clipped update and ZeRO's shard gathers") {
        // What the trainers do after the programs, in bytes over the device's memory
        // bandwidth: AdamW reads parameter, gradient and two moments and writes three (it
        // clips as it reads the gradient: no pass of its own); the norm reads each gradient
        // element once over the replicas. Then one all-reduce of the norm, and under ZeRO-1 an all-gather of
        // every parameter over its replicas.
        const double psi = static_cast<double>(model.ir().parameter_count()), replicas = 4;
        const double bandwidth = hw.device.memory_bandwidth * hw.device.elementwise_efficiency;
        const auto dp_pg = partition::apply_plan(model.ir(), plan::presets::data_parallel(4));
        const auto z1_pg = partition::apply_plan(model.ir(), plan::presets::zero(1, 4));
        const auto dp = search::price_programs(dp_pg, hw);
        const auto z1 = search::price_programs(z1_pg, hw);
        const double norm_reduce =
            search::collective_time(hw, search::collective::all_reduce, 8, search::device_group{.size = 4});
        CHECK(dp.devices[0].optimizer == Approx(psi * (28 + 4 / replicas) / bandwidth));
        CHECK(z1.devices[0].optimizer == Approx(psi * (28 / replicas + 4 / replicas) / bandwidth).epsilon(0.01));
        CHECK(dp.devices[0].gathers == Approx(norm_reduce));
        double gathers = norm_reduce;
        for (const auto& piece : z1_pg.devices[0].parameters)
            gathers += search::collective_time(hw, search::collective::all_gather, 4.0 * static_cast<double>(piece.region.numel()),
                                               search::device_group{.size = 4});
        CHECK(z1.devices[0].gathers == Approx(gathers));
        CHECK(z1.devices[0].gathers > dp.devices[0].gathers);
        // Two prices that differ only in the gathers: the explanation names the step after
        // the programs as what separates them.
        search::program_price gathered = dp;
        for (auto& d : gathered.devices) d.gathers += 1.0;
        gathered.step_seconds += 1.0;
        CHECK_THAT(search::detail::separation_text(dp, gathered),
                   Catch::StartsWith("slowest step after the programs (norm, clipping, optimizer, shard gathers)"));
        for (const auto* price : {&dp, &z1}) {
            double after = 0;
            for (const auto& d : price->devices) after = std::max(after, d.optimizer + d.gathers);
            CHECK(price->step_seconds == Approx(price->makespan + after));
        }
    }
    SECTION("the optimizer state priced is what the trainer updates, under tensor parallelism too") {
        // ZeRO-1 shards each piece's update over the ranks storing that piece, ZeRO-2 updates
        // the gradient shards: train::update_region says which part each rank updates.
        search::price_options o;
        o.optimizer_bytes_per_element = 12;
        for (int zero : {0, 1, 2}) {
            auto spec = plan::presets::megatron(2, 4);
            spec.zero = static_cast<plan::zero_stage>(zero);
            const auto pg = partition::apply_plan(model.ir(), spec);
            const auto price = search::price_programs(pg, hw, o);
            for (int d = 0; d < pg.world; ++d) {
                double updated = 0;
                for (const auto& gp : pg.devices[static_cast<std::size_t>(d)].gradients)
                    updated += static_cast<double>(train::update_region(pg, d, gp.logical, gp.region).numel());
                INFO("ZeRO-" << zero << ", device " << d);
                CHECK(price.devices[static_cast<std::size_t>(d)].memory.optimizer == Approx(12 * updated));
            }
        }
    }
    SECTION("data-parallel groups crossing the same nodes share the NICs") {
        // 16 devices over 2 nodes: TP 8 inside a node, DP 2 across; the 8 DP groups share
        // each node's NICs. Alone, one group gets a whole NIC; DGX A100 has 8 NICs per node,
        // one for each of the 8 groups, so sharing costs nothing there.
        const search::group_placement across = search::placement(hw.topo, std::vector<int>{0, 8});
        const double alone = search::collective_cost(hw, search::collective::all_reduce, 1e8, 2, across).total();
        const double shared =
            search::collective_cost(hw, search::collective::all_reduce, 1e8, 2, across, search::algorithm::automatic, 8)
                .total();
        CHECK(shared == Approx(alone));
        // DGX-1 with one NIC per node: the 8 groups take turns on it.
        const search::cluster one_nic = search::dgx1_v100(2, 1);
        const search::group_placement v100_across = search::placement(one_nic.topo, std::vector<int>{0, 8});
        const double one_alone =
            search::collective_cost(one_nic, search::collective::all_reduce, 1e8, 2, v100_across).total();
        const double one_shared = search::collective_cost(one_nic, search::collective::all_reduce, 1e8, 2, v100_across,
                                                          search::algorithm::automatic, 8)
                                      .total();
        CHECK(one_shared == Approx(8 * one_alone).epsilon(0.01));
    }
}

TEST_CASE("a space is narrowed by the names of its open numbers") {
    plan::plan_spec space = plan::spaces::nnscaler(8).narrow("tp", {1, 2}).narrow("coshard", {1, 2}).narrow("pp", {2});
    const auto params = search::open_parameter_candidates(space, 8, 4);
    std::map<std::string, std::vector<std::int64_t>> candidates;
    for (const auto& p : params) candidates[p.name] = p.candidates;
    CHECK(candidates.at("tp") == std::vector<std::int64_t>{1, 2});
    CHECK(candidates.at("coshard") == std::vector<std::int64_t>{1, 2});
    CHECK(candidates.at("pp") == std::vector<std::int64_t>{2});
    CHECK(candidates.at("dp") == std::vector<std::int64_t>{1, 2, 4, 8});
    CHECK_THROWS_WITH(space.narrow("order", {0}), Catch::Contains("'order' is not an open number of the plan"));
}

TEST_CASE("Coshard's factor and the devices per stage are searched like any open parameter") {
    // A long sequence and a small vocabulary: recomputing the MLP, which Coshard does a
    // piece at a time, is the peak of the step, not the loss.
    const auto model = models::gpt({.layers = 2, .hidden = 64, .heads = 4, .vocab = 32, .seq = 256, .batch = 8});
    const search::cluster hw = slow_node();
    // TP 2 with the factor open: 1 keeps one piece per device, 2 runs two after another.
    plan::plan_spec space = plan::presets::coshard(plan::degree_spec{2, "", {}}, plan::degree_spec{1, "cs", {}});
    const auto params = search::open_parameter_candidates(space, search::batch_of(model.ir()));
    REQUIRE(params.size() == 1);
    CHECK(params[0].candidates == std::vector<std::int64_t>{1, 2});  // every divisor of the devices
    auto programs = [&](int cs) { return partition::apply_plan(model.ir(), plan::plan_spec(space).choose("cs", cs)); };
    const search::program_price one = search::price_programs(programs(1), hw);
    const search::program_price two = search::price_programs(programs(2), hw);
    // The colocated pieces run one piece's chain at a time (partition/colocated_order.hpp):
    // in the order they were materialized, both pieces' intermediates would be alive at once.
    partition::partitioned_graph interleaved = programs(2);
    interleaved.order.clear();
    const search::program_price unordered = search::price_programs(interleaved, hw);
    INFO("peak: one piece " << one.peak_memory() << ", two " << two.peak_memory() << ", two interleaved "
                            << unordered.peak_memory());
    CHECK(two.peak_memory() < unordered.peak_memory());
    // So Coshard holds less at the peak, and costs time: the search takes it when, and only
    // when, memory is short.
    REQUIRE(two.peak_memory() < one.peak_memory());
    REQUIRE(two.step_seconds > one.step_seconds);
    CHECK(search::search_plan(model.ir(), space, hw).plan.choices.at("cs") == 1);
    search::plan_search_options tight;
    tight.memory_limit = (one.peak_memory() + two.peak_memory()) / 2;
    const search::plan_search_result r = search::search_plan(model.ir(), space, hw, tight);
    CHECK(r.plan.choices.at("cs") == 2);
    CHECK(r.gap == 0);

    // Devices per stage open beside an open stage count: only the pairs that make the plan's
    // devices are legal, and the others are refused saying so.
    plan::plan_spec pipeline = plan::presets::pipeline(2, 2, {plan::schedule_kind::one_f_one_b}, plan::presets::data_parallel(2));
    pipeline.stages->count = {1, "pp", {}};
    pipeline.stages->devices_per_stage = {1, "group", {}};
    pipeline.rules.front().trans->front().degree = {1, "group", {}};
    const search::plan_search_result p = search::search_plan(model.ir(), pipeline, hw);
    CHECK(p.plan.choices.at("pp") * p.plan.choices.at("group") == 4);
    CHECK(p.stats.refused > 0);
    bool said = false;
    for (const auto& [why, count] : p.stats.refusals) said = said || why.find("make stages x devices per stage equal") != std::string::npos;
    CHECK(said);
    CHECK(search::price_programs(partition::apply_plan(model.ir(), p.plan), hw).step_seconds == p.best.price.step_seconds);
}

TEST_CASE("the known systems' spaces are plans with open parameters, and each is searched") {
    const auto model = small_gpt();
    const search::cluster hw = slow_node();
    std::map<std::string, double> best;
    for (const std::string name : {"megatron", "deepspeed", "alpa", "nnscaler"}) {
        const plan::plan_spec space = plan::spaces::by_name(name, 4);
        const search::plan_search_result r = search::search_plan(model.ir(), space, hw);
        INFO(name << "\n" << r.explain());
        CHECK(r.gap == 0);
        best[name] = r.best.price.step_seconds;
        // The answer trains: its programs are checked and priced again to the same step.
        CHECK(search::price_programs(partition::apply_plan(model.ir(), r.plan), hw).step_seconds ==
              r.best.price.step_seconds);
    }
    // nnScaler's space holds each of the others' (without Megatron's forced recompute), so
    // its best is at least as fast as theirs.
    CHECK(best["nnscaler"] <= best["deepspeed"] * (1 + 1e-12));
    CHECK(best["nnscaler"] <= best["alpa"] * (1 + 1e-12));
    CHECK_THROWS_WITH(plan::spaces::by_name("zero-bubble", 4), Catch::Contains("no space named 'zero-bubble'"));
}

TEST_CASE("the README's search of a plan's open parameters") {
    // [readme]
    auto model = models::gpt({.layers = 4, .hidden = 64, .heads = 4, .vocab = 256, .seq = 32, .batch = 8});
    plan::plan_spec space = plan::spaces::nnscaler(4);       // or a plan of your own with open<...> parts
    space.micro_batches.allowed = {1, 2, 4};                 // narrow a parameter to a range
    search::plan_search_result r = search::search_plan(model.ir(), space, search::dgx_a100(1));
    std::printf("%s", r.explain().c_str());                  // chosen, runner-up and what separated them
    partition::partitioned_graph programs = partition::apply_plan(model.ir(), r.plan);  // the filled plan
    // [readme]
    CHECK(programs.world == 4);
    CHECK(r.plan.choices.at("mb") <= 4);
}

TEST_CASE("a vocabulary the degree does not divide leaves every tensor-parallel degree to the search") {
    // 257 is prime: the Megatron presets split it into near-equal pieces, so it limits neither
    // the degrees a space may take nor the searcher's tensor-parallel granularity (the heads).
    const search::cluster hw = search::dgx_a100(1);
    search::plan_search_options o;
    const auto even = small_gpt();
    const auto odd = models::gpt({.layers = 4, .hidden = 64, .heads = 4, .vocab = 257, .seq = 32, .batch = 8});
    const int legal = price_everything(even.ir(), open_megatron(4), hw, o).legal;
    CHECK(legal > 3);
    CHECK(price_everything(odd.ir(), open_megatron(4), hw, o).legal == legal);
    const search::plan_search_result r = search::search_plan(odd.ir(), plan::spaces::megatron(4), hw);
    CHECK(r.gap == 0);
    CHECK(search::price_programs(partition::apply_plan(odd.ir(), r.plan), hw).step_seconds == r.best.price.step_seconds);
}

TEST_CASE("a recycling model's forward rounds are pipelined by 3F1B, as pricing every assignment finds") {
    // An Evoformer with 3 recycling rounds over its blocks: a pipeline of it runs three
    // forward blocks per micro-batch and stage, as 3F1B orders them.
    models::evoformer_config c;
    c.blocks = 4;
    c.batch = 4;
    c.msa_seqs = 8;
    c.residues = 16;
    c.msa_channels = 16;
    c.pair_channels = 8;
    const graph model = models::evoformer(c).ir();
    const search::cluster hw = slow_node();
    search::plan_search_options o;
    plan::plan_spec space = plan::spaces::nnscaler(4).narrow("tp", {1}).narrow("coshard", {1}).narrow("zero", {0});
    space.narrow("mb", {1, 2});
    const exhaustive all = price_everything(model, space, hw, o);
    REQUIRE(all.legal > 0);
    const search::plan_search_result r = search::search_plan(model, space, hw, o);
    INFO(r.explain());
    CHECK(r.gap == 0);
    CHECK(r.best.price.step_seconds == Approx(all.best_step).epsilon(1e-12));
    // On this node a pipeline wins, ordered by 3F1B (three forward blocks per micro-batch and
    // stage, each round's output feeding the next round's first stage).
    REQUIRE(r.plan.stages);
    CHECK(plan::degree_value(r.plan.stages->count, r.plan, "stages") > 1);
    const std::int64_t order = r.plan.choices.count("order") ? r.plan.choices.at("order") : 0;
    CHECK(r.plan.order.alternatives.at(static_cast<std::size_t>(order)).kind == plan::schedule_kind::three_f_one_b);
}

TEST_CASE("whether to recompute may be an open choice: composed, in a plan file, and searched") {
    const auto model = small_gpt();
    const auto space = plan::compose(plan::devices<4>, plan::on_all(plan::trans<Split<Dim::Batch>, 4>{}),
                                     plan::on_layers<"blocks", 0, 3>(plan::recompute_choice<"rc">));
    static_assert(plan::well_formed<decltype(space)>);
    const plan::plan_spec spec = space.spec();
    CHECK(plan::open_parameters(spec) == std::vector<std::string>{"rc"});

    // 1 recomputes the layers (their forward ops again in the backward), 0 keeps them.
    const auto keep = partition::apply_plan(model.ir(), space.choose("rc", 0));
    const auto recompute = partition::apply_plan(model.ir(), space.choose("rc", 1));
    CHECK(recompute.ir().nodes.size() > keep.ir().nodes.size());
    CHECK_THROWS_WITH(partition::apply_plan(model.ir(), space.choose("rc", 2)),
                      Catch::Contains("choose 0 (keep) or 1 (recompute)"));
    CHECK_THROWS_WITH(plan::resolve(spec, model.ir()), Catch::Contains("open recompute choice 'rc'"));

    // A plan file keeps the choice open.
    const plan::plan_spec back = io::plan_from_json(io::to_json(spec), "memory");
    CHECK(plan::open_parameters(back) == std::vector<std::string>{"rc"});

    // The search recomputes when, and only when, keeping does not fit.
    const search::cluster hw = slow_node();
    const double kept = search::price_programs(keep, hw).peak_memory();
    const double recomputed = search::price_programs(recompute, hw).peak_memory();
    REQUIRE(recomputed < kept);
    CHECK(search::search_plan(model.ir(), spec, hw).plan.choices.at("rc") == 0);
    search::plan_search_options tight;
    tight.memory_limit = (kept + recomputed) / 2;
    const search::plan_search_result r = search::search_plan(model.ir(), spec, hw, tight);
    CHECK(r.plan.choices.at("rc") == 1);
    CHECK(r.explain().find("rc = recompute") != std::string::npos);
}

TEST_CASE("rules matched once per graph resolve every assignment as matching them anew does") {
    // The searcher keeps which nodes each selector matches (plan::detail::selector_memo) for
    // the graphs it resolves every candidate against; the partitions must not change.
    const auto model = small_gpt();
    const graph& g = model.ir();
    const plan::plan_spec space = plan::spaces::nnscaler(4).narrow("mb", {2}).narrow("zero", {0}).narrow("coshard", {1, 2});
    const auto params = search::open_parameter_candidates(space, search::batch_of(g), plan::detail::layer_count(g, "blocks"));
    plan::detail::selector_memo memo;
    memo.remember(g);
    int compared = 0, refused = 0;
    search::for_each_assignment(space, params, [&](const plan::plan_spec& candidate) {
        std::optional<plan::resolved_plan> fresh, remembered;
        std::string fresh_error, remembered_error;
        try {
            fresh = plan::resolve(candidate, g);
        } catch (const plan_error& e) {
            fresh_error = e.what();
        }
        try {
            const plan::detail::selector_memo_scope scope(memo);
            remembered = plan::resolve(candidate, g);
        } catch (const plan_error& e) {
            remembered_error = e.what();
        }
        REQUIRE(fresh_error == remembered_error);  // the same refusals, word for word
        if (!fresh) {
            ++refused;
            return;
        }
        REQUIRE(fresh->forward.size() == remembered->forward.size());
        for (std::size_t i = 0; i < fresh->forward.size(); ++i) {
            const auto& a = fresh->forward[i];
            const auto& b = remembered->forward[i];
            REQUIRE(a.has_value() == b.has_value());
            if (!a) continue;
            CHECK(a->pieces() == b->pieces());
            CHECK(a->devices == b->devices);
            CHECK(a->recompute == b->recompute);
            REQUIRE(a->splits.size() == b->splits.size());
            for (std::size_t s = 0; s < a->splits.size(); ++s) {
                CHECK(a->splits[s].degree == b->splits[s].degree);
                CHECK(a->splits[s].label == b->splits[s].label);
            }
        }
        CHECK(fresh->stage_of == remembered->stage_of);
        ++compared;
    });
    CHECK(compared > 20);
    CHECK(refused > 0);
    // A graph the memo was not given is matched anew, never from another graph's matches.
    const auto other = models::gpt({.layers = 3, .hidden = 32, .heads = 2, .vocab = 16, .seq = 8, .batch = 4});
    CHECK(memo.matches(space.rules.front().on, other.ir()) == nullptr);
    CHECK(memo.matches(space.rules.front().on, g) != nullptr);
}

TEST_CASE("the registry knows which ops a split may rebuild into others") {
    // search::detail::decomposed skips the ops that no transformation rebuilds: the built-in
    // vocabulary-parallel loss must be among those that may be, the row-parallel linear
    // (which only adjusts its pieces) not.
    const auto& registry = plan::transformation_registry::instance();
    CHECK(registry.may_decompose(op_def_of<ops::CrossEntropy>()));
    CHECK_FALSE(registry.may_decompose(op_def_of<ops::LinearBias>()));
    CHECK_FALSE(registry.may_decompose(op_def_of<ops::Gelu>()));
}

TEST_CASE("the regions a device holds are counted as pairs of device and region would count them") {
    // Brute force: each device's distinct coordinates along the slicing splits.
    auto brute = [](const plan::op_partition& p, const std::vector<std::size_t>& slicing, std::size_t devices) {
        std::vector<std::set<std::vector<std::int64_t>>> held(devices);
        for (std::int64_t piece = 0; piece < p.pieces(); ++piece) {
            const int d = p.device_of(piece);
            if (d < 0 || static_cast<std::size_t>(d) >= devices) continue;
            const std::vector<std::int64_t> at = p.coordinates(piece);
            std::vector<std::int64_t> region;
            for (std::size_t b : slicing) region.push_back(at[b]);
            held[static_cast<std::size_t>(d)].insert(region);
        }
        std::vector<std::int64_t> count;
        for (const auto& h : held) count.push_back(static_cast<std::int64_t>(h.size()));
        return count;
    };
    // Micro-batches (not slicing) x a slicing split of 4 x Coshard 2 on it x 2 replicas, the
    // pieces dealt round-robin (colocated pieces of several regions) over `devices`; the last
    // case has holders x regions beyond the bitmap, so the counts come from sorted keys. One
    // count serves every call: each zeroes the entries of the holders it returned.
    for (const auto& [degree, devices] : std::vector<std::pair<std::int64_t, std::size_t>>{{8, 4}, {8, 16}, {8192, 4097}}) {
        plan::op_partition p;
        p.splits.push_back({Dim::Batch::id, "", 3, false});
        p.splits.push_back({Dim::Hidden::id, "", degree, false});
        p.replicas = 2;
        for (std::int64_t piece = 0; piece < p.pieces(); ++piece)
            p.devices.push_back(static_cast<int>((piece * 7 + piece / 5) % static_cast<std::int64_t>(devices - 1)));
        for (const std::vector<std::size_t>& slicing : {std::vector<std::size_t>{1}, std::vector<std::size_t>{0, 1},
                                                        std::vector<std::size_t>{}}) {
            std::vector<std::int64_t> count(devices, 0);
            std::vector<std::size_t> holders;
            for (int again = 0; again < 2; ++again) {
                search::detail::regions_per_device(p, slicing, devices, count, holders);
                CHECK(count == brute(p, slicing, devices));
                std::set<std::size_t> holding;
                for (std::size_t d = 0; d < devices; ++d)
                    if (count[d] > 0) holding.insert(d);
                CHECK(std::set<std::size_t>(holders.begin(), holders.end()) == holding);
                CHECK(holders.size() == holding.size());
                for (std::size_t d : holders) count[d] = 0;
            }
        }
    }
}
