// Pipelines run: stages (layer ranges on device groups), micro-batches (the outermost batch
// split, all on the stage's devices) and a schedule that orders the blocks on every device.
// Every schedule, with 2 and 4 stages, 4 to 8 micro-batches, alone and with tensor or data
// parallelism inside the stages, trains the GPT to the same losses, gradient norms and
// parameters as one device (float64: 1e-9). The schedule really orders the programs: 1F1B
// keeps fewer micro-batches' activations than GPipe, as its arena shows.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include <loom/models/evoformer.hpp>
#include <loom/partition/pipeline_order.hpp>
#include <loom/plan/pipeline.hpp>
#include <loom/plan/presets.hpp>
#include <loom/schedule/templates.hpp>
#include <loom/search/apply_configuration.hpp>
#include <loom/search/branch_and_bound.hpp>
#include <loom/search/plan_json.hpp>

#include "support/evoformer.hpp"
#include "support/plan_equivalence.hpp"

using namespace loom;

namespace {

models::gpt_config model(std::int64_t layers = 4) {
    return {.layers = layers, .hidden = 16, .heads = 4, .vocab = 32, .seq = 8, .batch = 8};
}

void check_equal(const models::gpt_config& c, const plan::pipeline_plan& pp, const schedule::schedule& s,
                 const std::string& what) {
    const auto e = testing::compare_with_single_device<double>(
        c, pp.plan, 3, {}, [&](partition::partitioned_graph& pg) { partition::order_by_schedule(pg, pp, s); },
        partition::pipeline_apply_options(pp));
    INFO(what << ": loss " << e.loss << ", grad norm " << e.grad_norm << ", parameters " << e.parameters << " ("
              << e.worst_parameter << "), " << e.transfers << " transfers");
    CHECK(e.loss <= 1e-9);
    CHECK(e.grad_norm <= 1e-9);
    CHECK(e.parameters <= 1e-9);
    CHECK(e.transfers > 0);
}

plan::pipeline_plan pipeline(const models::gpt_config& c, plan::even_pipeline_options o) {
    auto m = models::gpt(c);
    return plan::resolve_pipeline(plan::even_pipeline(m.ir(), o), m.ir());
}

}  // namespace

TEST_CASE("GPipe and 1F1B with 2 and 4 stages train like one device", "[pipeline]") {
    const auto c = model();
    for (int stages : {2, 4})
        for (int micro : {4, 8}) {
            const auto pp = pipeline(c, {.stages = stages, .micro_batches = micro});
            check_equal(c, pp, schedule::gpipe(stages, micro), "GPipe x" + std::to_string(stages) + " m" + std::to_string(micro));
            check_equal(c, pp, schedule::one_f_one_b(stages, micro), "1F1B x" + std::to_string(stages) + " m" + std::to_string(micro));
        }
}

TEST_CASE("interleaved 1F1B (virtual stages) trains like one device", "[pipeline]") {
    const auto c = model(8);
    for (int micro : {4, 8}) {
        const auto pp = pipeline(c, {.stages = 2, .micro_batches = micro, .virtual_stages = 2});
        check_equal(c, pp, schedule::interleaved_one_f_one_b(2, 2, micro), "interleaved 2x2 m" + std::to_string(micro));
    }
    const auto pp = pipeline(c, {.stages = 4, .micro_batches = 8, .virtual_stages = 2});
    check_equal(c, pp, schedule::interleaved_one_f_one_b(4, 2, 8), "interleaved 4x2 m8");
}

TEST_CASE("pipelines compose with tensor and data parallelism inside the stages", "[pipeline]") {
    const auto c = model();
    struct inner_plan {
        std::string name;
        plan::plan_spec spec;
    };
    for (const auto& inner : {inner_plan{"megatron x2", plan::presets::megatron(2)},
                              inner_plan{"data parallel x2", plan::presets::data_parallel(2)}})
        for (int stages : {2, 4}) {
            const int micro = 4;
            const auto pp = pipeline(c, {.stages = stages, .micro_batches = micro, .devices_per_stage = 2, .inner = inner.spec});
            CHECK(pp.plan.devices == 2 * stages);
            check_equal(c, pp, partition::spread_over_groups(schedule::one_f_one_b(stages, micro), 2),
                        "1F1B x" + std::to_string(stages) + " of " + inner.name);
            check_equal(c, pp, partition::spread_over_groups(schedule::gpipe(stages, micro), 2),
                        "GPipe x" + std::to_string(stages) + " of " + inner.name);
        }
}

TEST_CASE("the schedule orders the programs: 1F1B holds fewer activations than GPipe", "[pipeline]") {
    const auto c = model();
    const int stages = 2, micro = 8;
    const auto pp = pipeline(c, {.stages = stages, .micro_batches = micro});
    auto arena_of_first_stage = [&](const schedule::schedule& s) {
        auto m = models::gpt(c);
        auto pg = partition::apply_plan(m.ir(), pp.plan, partition::pipeline_apply_options(pp));
        partition::order_by_schedule(pg, pp, s);
        const program p = compile_program(pg.devices[0].ir(), {.prec = precision::f64, .keep_every_node = true,
                                                               .order = pg.order[0]});
        return p.arena_bytes;
    };
    const auto gpipe = arena_of_first_stage(schedule::gpipe(stages, micro));
    const auto one_f_one_b = arena_of_first_stage(schedule::one_f_one_b(stages, micro));
    INFO("stage 0 arena: GPipe " << gpipe << " bytes, 1F1B " << one_f_one_b << " bytes");
    // GPipe keeps all 8 micro-batches' activations, 1F1B at most 2 on stage 0 (the arena also
    // holds the gradient sums and the weights' gathered copies, which both keep).
    CHECK(one_f_one_b * 10 < gpipe * 6);
}

TEST_CASE("a schedule that does not fit the plan is rejected naming the blocks", "[pipeline][errors]") {
    const auto c = model();
    const auto pp = pipeline(c, {.stages = 2, .micro_batches = 4});
    auto m = models::gpt(c);
    auto pg = partition::apply_plan(m.ir(), pp.plan);
    CHECK_THROWS_WITH(partition::order_by_schedule(pg, pp, schedule::one_f_one_b(2, 8)),
                      Catch::Contains("8 micro-batches") && Catch::Contains("same pipeline"));
    CHECK_THROWS_WITH(partition::order_by_schedule(pg, pp, schedule::one_f_one_b(4, 4)), Catch::Contains("4 stages"));
    CHECK_THROWS_WITH(plan::resolve_pipeline(plan::even_pipeline(m.ir(), {.stages = 8, .micro_batches = 4}), m.ir()),
                      Catch::Contains("cannot fill 8 stages"));
    auto spec = plan::even_pipeline(m.ir(), {.stages = 2, .micro_batches = 3});
    auto odd = plan::resolve_pipeline(spec, m.ir());
    CHECK_THROWS_WITH(partition::apply_plan(m.ir(), odd.plan), Catch::Contains("degree 3") && Catch::Contains("Batch"));
}

TEST_CASE("3F1B: three forward rounds and one backward per micro-batch train the Evoformer like one device",
          "[pipeline][evoformer]") {
    const models::evoformer_config c = testing::pipeline_evoformer(4);
    const auto data = models::evoformer_synthetic_batch(c, 7);
    const train::input_feed feed = testing::evoformer_feed(data);
    for (int stages : {2, 4}) {
        const int micro = 4;
        auto model = models::evoformer(c);
        const auto pp = plan::resolve_pipeline(
            plan::even_pipeline(model.ir(), {.stages = stages, .micro_batches = micro, .rounds_scope = "recycle", .rounds = 3}),
            model.ir());
        // Round r's inputs run on the first stage, the distogram head on the last.
        for (std::size_t i = 0; i < pp.stage_of.size(); ++i) {
            const std::string scope = model.ir().scope_path(model.ir().nodes[i].scope);
            if (scope.rfind("recycle.", 0) == 0 && scope.find(".input") != std::string::npos) CHECK(pp.stage_of[i] == 0);
            if (scope.rfind("distogram", 0) == 0) CHECK(pp.stage_of[i] == stages - 1);
        }
        auto pg = partition::apply_plan(model.ir(), pp.plan, partition::pipeline_apply_options(pp));
        const auto s = schedule::three_f_one_b(stages, micro);
        partition::order_by_schedule(pg, pp, s);
        train::trainer<double> single(std::move(model).training_graph(), {});
        std::vector<train::step_result> reference;
        for (int step = 0; step < 3; ++step) reference.push_back(single.step(feed));
        std::vector<std::vector<train::step_result>> results(static_cast<std::size_t>(pg.world));
        comm::run_ranks(pg.world, [&](comm::communicator& comm) {
            train::distributed_trainer<double> rank(pg, comm, {});
            for (int step = 0; step < 3; ++step) results[static_cast<std::size_t>(comm.rank())].push_back(rank.step(feed));
        });
        for (const auto& per_rank : results)
            for (std::size_t step = 0; step < reference.size(); ++step) {
                INFO("3F1B x" << stages << " step " << step);
                CHECK(testing::relative(per_rank.at(step).loss, reference[step].loss) <= 1e-9);
                CHECK(testing::relative(per_rank.at(step).grad_norm, reference[step].grad_norm) <= 1e-9);
            }
    }
}

TEST_CASE("the interlaced pipeline: a vocabulary-parallel embedding and head on every device around a 1F1B pipeline",
          "[pipeline]") {
    // Stage 0 (embeddings) and the last stage (ln_f, the tied LM head, the loss) run on all
    // devices, split by vocabulary (Megatron's rules); the layers form a pipeline of one
    // device per stage between them, time-shared on the same devices.
    const auto c = model();
    for (int p : {2, 4}) {
        const int micro = 4;
        auto m = models::gpt(c);
        const auto spec = plan::interlaced_pipeline(m.ir(), p, micro, plan::presets::megatron(p));
        const auto pp = plan::resolve_pipeline(spec, m.ir());
        check_equal(c, pp, schedule::interlaced(p, micro), spec.name);
    }
}

TEST_CASE("searched configurations run and train like one device", "[pipeline][search]") {
    const auto c = model();
    auto m = models::gpt(c);
    const graph forward = m.ir();
    const graph training = std::move(m).training_graph();
    // A 4-device node: what the searcher picks for it must run, and so must the other shapes.
    search::cluster node = search::dgx1_v100(1);
    node.topo.devices_per_node = 4;
    search::cost_context ctx(search::profile_model(training), node, {});
    const auto found = search::branch_and_bound(ctx, search::executable_space());
    REQUIRE(found.found);
    std::vector<search::configuration> configurations{found.best};
    const auto make = [](int tp, int pp, int dp, int micro, search::schedule_kind kind, int chunks) {
        search::configuration k;
        k.tp = tp, k.pp = pp, k.dp = dp, k.micro_batches = micro, k.schedule = kind, k.chunks = chunks;
        k.layers_per_chunk.assign(static_cast<std::size_t>(pp * chunks), 4 / (pp * chunks));
        return k;
    };
    configurations.push_back(make(2, 2, 1, 4, search::schedule_kind::one_f_one_b, 1));
    configurations.push_back(make(1, 2, 2, 2, search::schedule_kind::gpipe, 1));
    configurations.push_back(make(2, 1, 2, 1, search::schedule_kind::one_f_one_b, 1));
    configurations.push_back(make(1, 2, 1, 4, search::schedule_kind::interleaved, 2));
    configurations.push_back(make(1, 1, 1, 4, search::schedule_kind::one_f_one_b, 1));
    configurations.push_back(make(1, 4, 1, 4, search::schedule_kind::one_f_one_b, 1));
    configurations.back().interlaced = true;
    train::trainer<double> single(training, {});
    std::vector<std::vector<std::int32_t>> data;
    std::vector<train::input_feed> feeds;
    std::vector<train::step_result> reference;
    for (int step = 0; step < 2; ++step) {
        feeds.push_back(testing::gpt_batch(c, step, data));
        reference.push_back(single.step(feeds.back()));
    }
    for (const auto& k : configurations) {
        INFO("TP " << k.tp << " PP " << k.pp << " DP " << k.dp << " m " << k.micro_batches << " " << search::to_string(k.schedule)
                   << (k.interlaced ? ", interlaced" : ""));
        const auto pg = search::apply_configuration(forward, k);
        REQUIRE(pg.world == k.devices());
        std::vector<std::vector<train::step_result>> results(static_cast<std::size_t>(pg.world));
        comm::run_ranks(pg.world, [&](comm::communicator& comm) {
            train::distributed_trainer<double> rank(pg, comm, {});
            for (const auto& feed : feeds) results[static_cast<std::size_t>(comm.rank())].push_back(rank.step(feed));
        });
        for (const auto& per_rank : results)
            for (std::size_t step = 0; step < reference.size(); ++step) {
                CHECK(testing::relative(per_rank.at(step).loss, reference[step].loss) <= 1e-9);
                CHECK(testing::relative(per_rank.at(step).grad_norm, reference[step].grad_norm) <= 1e-9);
            }
    }
    // Saved and loaded back, the plan gives the same programs: nodes, in the same order.
    const std::string path = (std::filesystem::temp_directory_path() / "loom_test_searched_plan.json").string();
    search::save_configuration(found.best, path);
    const auto original = search::apply_configuration(forward, found.best);
    const auto loaded = search::apply_configuration(forward, search::load_configuration(path));
    std::filesystem::remove(path);
    REQUIRE(loaded.world == original.world);
    CHECK(loaded.order == original.order);
    for (int d = 0; d < original.world; ++d) {
        const graph& a = original.devices[static_cast<std::size_t>(d)].ir();
        const graph& b = loaded.devices[static_cast<std::size_t>(d)].ir();
        REQUIRE(a.nodes.size() == b.nodes.size());
        for (std::size_t i = 0; i < a.nodes.size(); ++i) {
            CHECK(a.nodes[i].name == b.nodes[i].name);
            CHECK(a.nodes[i].op == b.nodes[i].op);
        }
    }
    search::configuration zero = found.best;
    zero.zero = search::zero_stage::optimizer;
    CHECK_THROWS_WITH(search::apply_configuration(forward, zero), Catch::Contains("executable_space"));
}
