// The plan searcher: layers found by scopes and by structure agree, the model profile adds
// up, the searcher times the orders its plans run with the schedule simulator, and
// branch-and-bound finds the optimum of exhaustive enumeration, folded or
// not, on small spaces.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <loom/models/evoformer.hpp>
#include <loom/models/gpt.hpp>
#include <loom/schedule/simulate.hpp>
#include <loom/schedule/templates.hpp>
#include <loom/search/branch_and_bound.hpp>
#include <loom/io/plan_file.hpp>
#include <loom/plan/resolve.hpp>
#include <loom/search/to_plan.hpp>

using namespace loom;

namespace {

graph small_gpt(std::int64_t layers, std::int64_t hidden = 64, std::int64_t batch = 8) {
    return models::gpt({.layers = layers, .hidden = hidden, .heads = 4, .vocab = 128, .seq = 16, .batch = batch})
        .training_graph();
}

}  // namespace

TEST_CASE("layers from scopes and from structure alone are the same", "[search][folding]") {
    for (std::int64_t layers : {2, 3, 6}) {
        graph g = small_gpt(layers);
        const auto by_scopes = search::layers_from_scopes(g);
        // Forget every scope: the structure must still show the blocks.
        for (auto& n : g.nodes) n.scope = no_id;
        g.repeats.clear();
        g.scopes.clear();
        const auto by_structure = search::find_layers(g);
        CHECK(by_structure.found_by == "structure");
        REQUIRE(by_scopes.layers.size() == static_cast<std::size_t>(layers + 2));
        REQUIRE(by_structure.layers.size() == by_scopes.layers.size());
        for (std::size_t i = 0; i < by_scopes.layers.size(); ++i) {
            INFO(layers << " layers, layer " << i << ": " << by_scopes.layers[i].name);
            CHECK(by_structure.layers[i].nodes == by_scopes.layers[i].nodes);
            CHECK(by_structure.layers[i].class_id == by_scopes.layers[i].class_id);
        }
        CHECK(by_scopes.classes == 3);  // prologue, the block, epilogue
        CHECK(by_scopes.repeated().size() == static_cast<std::size_t>(layers));
    }
}

TEST_CASE("the model profile adds up", "[search][profile]") {
    const std::int64_t b = 8, s = 16, h = 64, layers = 3;
    const graph g = small_gpt(layers, h, b);
    const auto m = search::profile_model(g);
    REQUIRE(m.layers.size() == static_cast<std::size_t>(layers + 2));
    double parameters = 0;
    for (tensor_id p : g.parameters) parameters += static_cast<double>(g.tensor(p).dims.numel());
    double owned = 0;
    for (const auto& l : m.layers) owned += l.parameters;
    CHECK(m.parameters == parameters);
    CHECK(owned == parameters);
    CHECK(m.batch == b);
    CHECK(m.residual_elements == static_cast<double>(b * s * h));
    CHECK(m.tp_granularity == 4);  // the heads
    const auto& block = m.layers[1];
    CHECK(block.residual_joins == 2);
    CHECK(block.input_elements == static_cast<double>(b * s * h));
    // A block's GEMMs: 2 FLOPs per multiply-add of every weight with every token, plus the
    // attention's; the backward does about twice the forward.
    const double weights = 12.0 * h * h;
    CHECK(block.forward.gemm_flops >= 2.0 * b * s * weights);
    CHECK(block.forward.gemm_flops <= 2.0 * b * s * weights * 1.2);
    CHECK(block.backward.flops == Approx(2.0 * block.forward.flops).epsilon(0.15));
    CHECK(block.saved_elements > block.saved_elements - block.cheap_saved_elements);
    CHECK(block.cheap_saved_elements > 0);
    // The tied LM head reads the embedding, which the prologue owns.
    CHECK(m.layers.back().shared_from == 0);
    CHECK(m.layers.back().shared_parameters == 128.0 * h);
}

TEST_CASE("the searcher times the orders the plan runs, with the schedule simulator", "[search][schedule]") {
    const models::gpt_config config{.layers = 4, .hidden = 64, .heads = 4, .vocab = 128, .seq = 16, .batch = 8};
    const auto model = models::gpt(config);
    search::cost_context ctx(search::profile_model(models::gpt(config).training_graph()), search::dgx1_v100(1), {});
    for (const auto kind : {plan::schedule_kind::gpipe, plan::schedule_kind::one_f_one_b,
                            plan::schedule_kind::interleaved}) {
        search::configuration c;
        c.pp = 2;
        c.micro_batches = 4;
        c.schedule = kind;
        c.chunks = kind == plan::schedule_kind::interleaved ? 2 : 1;
        c.layers_per_chunk.assign(static_cast<std::size_t>(c.pp * c.chunks), 4 / (c.pp * c.chunks));
        c.recompute_of.assign(4, plan::recompute_policy::none);
        INFO(plan::to_string(kind));
        const auto& timed = ctx.schedule_orders(c.schedule, c.pp, c.chunks, c.micro_batches).order;
        const plan::resolved_plan resolved = plan::resolve(search::to_plan(c), model.ir());
        REQUIRE(resolved.order);
        CHECK(timed.device_order == resolved.order->device_order);
        const auto e = search::evaluate(ctx, c);
        const schedule::cost_model costs{.forward_per_stage = e.chunk_forward,
                                         .backward_per_stage = e.chunk_backward,
                                         .latency = search::stage_message_time(ctx, c)};
        CHECK(e.pipeline_time == schedule::simulate(*resolved.order, costs).makespan);
    }
}

namespace {

struct small_space {
    std::string name;
    std::int64_t layers;
    double memory_fraction;  // of the unconstrained optimum's peak memory; 0: no cap
    search::search_space space;
};

// Small spaces where exhaustive enumeration (every layer's recompute choice on its own)
// stays cheap: 2 or 4 layers, 8 GPUs of one DGX-1, a GPT large enough for compute to matter.
std::vector<small_space> small_spaces() {
    std::vector<small_space> out;
    const std::vector<double> caps = {0.0, 0.8, 0.5, 0.02};
    for (std::int64_t layers : {2, 4})
        for (double cap : caps)
            for (int variant = 0; variant < 3; ++variant) {
                search::search_space s;
                s.micro_batches = {1, 2, 4, 8};
                if (variant == 0) {  // everything, stage boundaries fixed, interlaced or not
                    s.zero = {search::zero_stage::none, search::zero_stage::optimizer, search::zero_stage::parameters};
                    s.interlaced = {false, true};
                } else if (variant == 1) {  // stage boundaries searched, no ZeRO-3, Coshard
                    s.search_stage_boundaries = true;
                    s.coshard = {1, 4};
                    s.zero = {search::zero_stage::none, search::zero_stage::gradients};
                    s.schedules = {plan::schedule_kind::gpipe, plan::schedule_kind::one_f_one_b};
                } else {  // recompute only full or nothing, TP 1 or 2, Coshard
                    s.tp = {1, 2};
                    s.coshard = {1, 2, 8};
                    s.recompute_choices = {plan::recompute_policy::none, plan::recompute_policy::full};
                }
                out.push_back({std::to_string(layers) + " layers, memory cap " + std::to_string(cap) + " of the free optimum's, variant " +
                                   std::to_string(variant),
                               layers, cap, s});
            }
    return out;
}

}  // namespace

TEST_CASE("branch-and-bound finds exhaustive enumeration's optimum, folded and unfolded", "[search][bnb]") {
    int spaces = 0, binding = 0, infeasible = 0;
    for (const auto& sp : small_spaces()) {
        INFO(sp.name);
        const graph g = models::gpt({.layers = sp.layers, .hidden = 512, .heads = 8, .vocab = 1024, .seq = 256, .batch = 16})
                            .training_graph();
        const auto profile = search::profile_model(g);
        search::cost_context free_ctx(profile, search::dgx1_v100(1), {});
        const double free_peak = search::branch_and_bound(free_ctx, sp.space).cost.peak_memory();
        search::search_options folded;
        folded.memory_per_device = sp.memory_fraction * free_peak;
        search::search_options unfolded = folded;
        unfolded.fold = false;
        search::cost_context all_ctx(profile, search::dgx1_v100(1), folded), folded_ctx(profile, search::dgx1_v100(1), folded),
            unfolded_ctx(profile, search::dgx1_v100(1), unfolded);
        const auto all = search::enumerate_all(all_ctx, sp.space);
        const auto bb = search::branch_and_bound(folded_ctx, sp.space);
        const auto bb_unfolded = search::branch_and_bound(unfolded_ctx, sp.space);
        ++spaces;
        REQUIRE(bb.found == all.found);
        REQUIRE(bb_unfolded.found == all.found);
        if (!all.found) {
            ++infeasible;
            CHECK(bb.explain().find("no configuration") != std::string::npos);
            continue;
        }
        INFO("exhaustive:\n" << all.explain() << "branch-and-bound:\n" << bb.explain());
        CHECK(bb.cost.step_time == Approx(all.cost.step_time).epsilon(1e-12));
        CHECK(bb_unfolded.cost.step_time == Approx(all.cost.step_time).epsilon(1e-12));
        // The answer is a real point of the space: evaluating it again gives its cost.
        CHECK(search::evaluate(folded_ctx, bb.best).step_time == bb.cost.step_time);
        CHECK(bb.stats.leaves < all.stats.leaves);
        CHECK(bb.stats.complete);
        bool recomputes = false;
        for (auto r : all.best.recompute_of) recomputes |= r != plan::recompute_policy::none;
        binding += recomputes;
    }
    CHECK(spaces >= 20);
    // The memory caps must matter: some optima recompute, and some spaces fit nothing.
    CHECK(binding >= 4);
    CHECK(infeasible >= 1);
    CHECK(infeasible < spaces / 2);
}

TEST_CASE("a time budget returns the best plan so far with a proven gap", "[search][bnb]") {
    const graph g = models::gpt({.layers = 8, .hidden = 1024, .heads = 16, .vocab = 1024, .seq = 512, .batch = 64})
                        .training_graph();
    const auto profile = search::profile_model(g);
    search::search_options unbounded, rushed;
    rushed.fold = false;
    rushed.time_budget_seconds = 1e-4;
    search::cost_context full_ctx(profile, search::dgx2_v100(2), unbounded), rushed_ctx(profile, search::dgx2_v100(2), rushed);
    const auto full = search::branch_and_bound(full_ctx, search::search_space{});
    const auto quick = search::branch_and_bound(rushed_ctx, search::search_space{});
    REQUIRE(full.found);
    CHECK(full.stats.complete);
    CHECK(full.stats.gap == 0);
    CHECK_FALSE(quick.stats.complete);
    if (quick.found) {
        CHECK(quick.cost.step_time >= full.cost.step_time * (1 - 1e-12));
        // The proven gap bounds the distance to the true optimum.
        CHECK(quick.stats.gap >= 0);
        CHECK((quick.cost.step_time - full.cost.step_time) / quick.cost.step_time <= quick.stats.gap + 1e-12);
        CHECK(quick.explain().find("time budget") != std::string::npos);
    }
}

TEST_CASE("the search is deterministic and explains its answer", "[search][bnb]") {
    const graph g = models::gpt({.layers = 8, .hidden = 1024, .heads = 16, .vocab = 1024, .seq = 512, .batch = 64})
                        .training_graph();
    const auto profile = search::profile_model(g);
    search::cost_context a(profile, search::dgx_a100(2), {}), b(profile, search::dgx_a100(2), {});
    const auto first = search::branch_and_bound(a, {}), second = search::branch_and_bound(b, {});
    REQUIRE(first.found);
    CHECK(first.best.tp == second.best.tp);
    CHECK(first.best.pp == second.best.pp);
    CHECK(first.best.micro_batches == second.best.micro_batches);
    CHECK(first.best.recompute_of == second.best.recompute_of);
    CHECK(first.cost.step_time == second.cost.step_time);
    CHECK(first.stats.nodes == second.stats.nodes);
    const std::string text = first.explain();
    CHECK(text.find("TP ") != std::string::npos);
    CHECK(text.find("predicted step") != std::string::npos);
    CHECK(text.find("cut by bound") != std::string::npos);
    CHECK(first.stats.pruned_by_bound > 0);
}

TEST_CASE("the README's search snippet finds a plan and returns it as a plan value", "[search]") {
    const models::gpt_config cfg{.layers = 24, .hidden = 2048, .heads = 16, .vocab = 50304, .seq = 2048, .batch = 512};
    auto profile = search::profile_model(models::gpt(cfg).training_graph());  // layers folded by class
    search::cost_context ctx(profile, search::dgx_a100(/*nodes=*/16), {.memory_per_device = 80e9});
    search::search_result found = search::branch_and_bound(ctx, search::search_space{});
    std::printf("%s", found.explain().c_str());  // plan, predicted step time, memory per stage, nodes cut
    const plan::plan_spec plan = search::to_plan(found.best);                 // the one plan value
    REQUIRE(found.found);
    CHECK(plan.devices == 128);
    CHECK(plan.devices == found.best.devices());
}

TEST_CASE("a searched plan is the one plan value: saved as a plan file, it loads back identical", "[search][json]") {
    const models::gpt_config config{.layers = 8, .hidden = 1024, .heads = 16, .vocab = 1024, .seq = 512, .batch = 64};
    const graph g = models::gpt(config).training_graph();
    search::search_options o;
    o.memory_per_device = 2e9;
    search::cost_context ctx(search::profile_model(g), search::dgx2_v100(1), o);
    const auto found = search::branch_and_bound(ctx, {});
    REQUIRE(found.found);
    const plan::plan_spec p = search::to_plan(found.best);
    CHECK(p.devices == found.best.devices());
    const graph forward = models::gpt(config).ir();
    const auto back = io::plan_from_json(io::to_json(p, &forward), "plan.json", &forward);
    CHECK(io::to_json(back) == io::to_json(p));
}

TEST_CASE("recomputation's transient is in the memory, and Coshard divides it", "[search][coshard]") {
    const graph g = models::gpt({.layers = 4, .hidden = 512, .heads = 8, .vocab = 1024, .seq = 256, .batch = 16})
                        .training_graph();
    const auto profile = search::profile_model(g);
    search::cost_context ctx(profile, search::dgx1_v100(1), {});
    search::configuration c;
    c.tp = 2;
    c.pp = 2;
    c.dp = 2;
    c.micro_batches = 4;
    c.layers_per_chunk = {2, 2};
    c.recompute_of = {plan::recompute_policy::none, plan::recompute_policy::full, plan::recompute_policy::selective,
                      plan::recompute_policy::none};
    const int layer_full = ctx.repeated()[1], layer_selective = ctx.repeated()[2];
    const double share = 1.0 / (c.dp * c.micro_batches), bytes = ctx.options().activation_bytes;
    for (int coshard : {1, 4}) {
        c.coshard = coshard;
        const auto e = search::evaluate(ctx, c);
        INFO("coshard " << coshard);
        // Device 0 recomputes layer 1 fully: what it saved minus its input comes back.
        const double full = (profile.layers[static_cast<std::size_t>(layer_full)].saved_elements -
                             profile.layers[static_cast<std::size_t>(layer_full)].input_elements) *
                            share * bytes / (c.tp * coshard);
        CHECK(e.devices[0].transient == Approx(full).epsilon(1e-12));
        // Device 1 recomputes layer 2 selectively: its cheap saved activations come back.
        const double selective = profile.layers[static_cast<std::size_t>(layer_selective)].cheap_saved_elements * share *
                                 bytes / (c.tp * coshard);
        CHECK(e.devices[1].transient == Approx(selective).epsilon(1e-12));
        CHECK(e.devices[0].memory.buffers >= e.devices[0].transient);
    }
    c.recompute_of.assign(4, plan::recompute_policy::none);
    CHECK(search::evaluate(ctx, c).devices[0].transient == 0.0);
}

TEST_CASE("Coshard lets full recomputation fit where one piece at a time does not", "[search][coshard]") {
    // Long sequences: a layer's saved activations dwarf its input, so recomputing it brings
    // back far more than it keeps.
    const graph g = models::gpt({.layers = 4, .hidden = 256, .heads = 4, .vocab = 512, .seq = 2048, .batch = 8})
                        .training_graph();
    const auto profile = search::profile_model(g);
    search::search_space only_full;
    only_full.tp = {1};
    only_full.pp = {1};
    only_full.micro_batches = {1};
    only_full.zero = {search::zero_stage::none};
    only_full.recompute_choices = {plan::recompute_policy::full};
    // A cap between "keep inputs + the whole transient" and "keep inputs + 1/8 of it".
    search::cost_context probe(profile, search::dgx1_v100(1), {});
    search::configuration c{1, 1, 8, 1, 1, search::zero_stage::none, plan::schedule_kind::one_f_one_b, {4},
                            std::vector<plan::recompute_policy>(4, plan::recompute_policy::full), false, 1};
    const auto one = search::evaluate(probe, c);
    c.coshard = 8;
    const auto eight = search::evaluate(probe, c);
    REQUIRE(one.devices[0].transient > 4 * eight.devices[0].transient);
    const double cap = (one.peak_memory() + eight.peak_memory()) / 2;

    search::search_options capped;
    capped.memory_per_device = cap;
    search::cost_context ctx(profile, search::dgx1_v100(1), capped);
    const auto without = search::branch_and_bound(ctx, only_full);
    CHECK_FALSE(without.found);
    only_full.coshard = {1, 2, 8};
    const auto with = search::branch_and_bound(ctx, only_full);
    REQUIRE(with.found);
    CHECK(with.best.coshard >= 2);
    CHECK(with.cost.peak_memory() <= cap);
    CHECK(with.explain().find("Coshard") != std::string::npos);
    const auto all = search::enumerate_all(ctx, only_full);
    CHECK(all.cost.step_time == Approx(with.cost.step_time).epsilon(1e-12));
    // As a plan, its recomputed layers' pieces are colocated coshard to a device.
    const plan::plan_spec p = search::to_plan(with.best);
    bool colocated = false;
    for (const plan::rule& r : p.rules) colocated = colocated || (r.assign && r.assign->colocate.value == with.best.coshard);
    CHECK(colocated);
    CHECK(p.colocation_requires_recompute);
}

namespace {

// An Evoformer big enough for compute to matter, with 3 recycling rounds over its blocks.
graph evoformer_graph(std::int64_t blocks, std::int64_t batch) {
    models::evoformer_config c;
    c.blocks = blocks;
    c.batch = batch;
    c.msa_seqs = 32;
    c.residues = 64;
    c.msa_channels = 64;
    c.pair_channels = 32;
    return models::evoformer(c).training_graph();
}

}  // namespace

TEST_CASE("forward rounds are found from the scopes: the layers are one round's blocks", "[search][rounds]") {
    for (std::int64_t blocks : {2, 5}) {  // fewer and more blocks than rounds
        INFO(blocks << " blocks");
        const graph g = evoformer_graph(blocks, 2);
        const auto p = search::profile_model(g);
        CHECK(p.forward_rounds == 3);
        CHECK(p.partition.rounds == 3);
        CHECK(p.partition.repeated().size() == static_cast<std::size_t>(blocks));
        for (int l : p.partition.repeated()) {
            const auto& layer = p.layers[static_cast<std::size_t>(l)];
            CHECK(layer.name.rfind("blocks.", 0) == 0);
            CHECK(layer.backward.gemm_flops > 0);  // every layer is differentiated (in the last round)
            CHECK(layer.saved_elements > 0);
        }
        // The blocks after the first are alike (the first also normalises the recycled inputs).
        CHECK(p.layers[static_cast<std::size_t>(p.partition.repeated().back())].class_id ==
              p.layers[static_cast<std::size_t>(p.partition.repeated()[1])].class_id);
    }
    const graph gpt = models::gpt({.layers = 2, .hidden = 64, .heads = 2, .vocab = 64, .seq = 16, .batch = 2}).training_graph();
    CHECK(search::profile_model(gpt).forward_rounds == 1);
}

TEST_CASE("branch-and-bound finds the optimum of a recycling model, 3F1B included", "[search][rounds][bnb]") {
    const graph g = evoformer_graph(4, 8);
    const auto profile = search::profile_model(g);
    search::search_space space;
    space.micro_batches = {1, 2, 4, 8};
    space.zero = {search::zero_stage::none, search::zero_stage::optimizer};
    space.coshard = {1, 2};
    search::search_space piped_space = space;  // pipelines only: 3F1B must be chosen
    piped_space.pp = {2, 4};
    int pipelined = 0, recomputing = 0;
    for (const auto* sp : {&space, &piped_space})
    for (double fraction : {0.0, 0.6, 0.3, 0.15}) {
        search::cost_context free_ctx(profile, search::dgx1_v100(1), {});
        const double free_peak = search::branch_and_bound(free_ctx, *sp).cost.peak_memory();
        const search::search_space& current = *sp;
        INFO((sp == &space ? "every PP" : "PP 2 or 4") << ", memory cap " << fraction << " of the free optimum's");
        search::search_options o;
        o.memory_per_device = fraction * free_peak;
        search::search_options unfolded = o;
        unfolded.fold = false;
        search::cost_context all_ctx(profile, search::dgx1_v100(1), o), ctx(profile, search::dgx1_v100(1), o),
            unfolded_ctx(profile, search::dgx1_v100(1), unfolded);
        const auto all = search::enumerate_all(all_ctx, current);
        const auto bb = search::branch_and_bound(ctx, current);
        const auto bb_unfolded = search::branch_and_bound(unfolded_ctx, current);
        REQUIRE(bb.found == all.found);
        REQUIRE(bb_unfolded.found == all.found);
        if (!all.found) continue;
        INFO("exhaustive:\n" << all.explain() << "branch-and-bound:\n" << bb.explain());
        CHECK(bb.cost.step_time == Approx(all.cost.step_time).epsilon(1e-12));
        CHECK(bb_unfolded.cost.step_time == Approx(all.cost.step_time).epsilon(1e-12));
        CHECK(search::evaluate(ctx, bb.best).step_time == bb.cost.step_time);
        if (bb.best.pp > 1) CHECK(bb.best.schedule == plan::schedule_kind::three_f_one_b);
        if (sp == &piped_space) ++pipelined;
        for (auto r : bb.best.recompute_of) recomputing += r != plan::recompute_policy::none;
    }
    CHECK(pipelined >= 2);  // 3F1B optima found and checked
    CHECK(recomputing >= 1);

    // 3F1B's rounds: three forward blocks per micro-batch and stage, the work of the
    // one-stage plan in total.
    search::cost_context ctx(profile, search::dgx1_v100(1), {});
    search::configuration one{1, 1, 8, 2, 1, search::zero_stage::none, plan::schedule_kind::one_f_one_b, {4},
                              std::vector<plan::recompute_policy>(4, plan::recompute_policy::none), false, 1};
    search::configuration piped = one;
    piped.pp = 2;
    piped.dp = 4;
    piped.schedule = plan::schedule_kind::three_f_one_b;
    piped.layers_per_chunk = {2, 2};
    const auto a = search::evaluate(ctx, one), b = search::evaluate(ctx, piped);
    CHECK(a.forward_blocks == 1);
    CHECK(b.forward_blocks == 3);
    CHECK(3 * (b.chunk_forward[0] + b.chunk_forward[1]) == Approx(a.chunk_forward[0] * 2.0).epsilon(1e-9));
    // As a plan (and a plan file), it is ordered by 3F1B.
    const plan::plan_spec p = io::plan_from_json(io::to_json(search::to_plan(piped)), "plan.json");
    REQUIRE(p.order.alternatives.size() == 1);
    CHECK(p.order.alternatives.front().kind == plan::schedule_kind::three_f_one_b);
}
