// Pipelines run: stages (layer ranges on device groups), micro-batches (the outermost batch
// split, all on the stage's devices) and an order that schedules the blocks on every device,
// all parts of the one plan value that partition::apply_plan applies. Every schedule, with 2
// and 4 stages, 4 to 8 micro-batches, alone and with tensor or data parallelism inside the
// stages, trains the GPT to the same losses, gradient norms and parameters as one device
// (float64: 1e-9). The order really orders the programs: 1F1B keeps fewer micro-batches'
// activations than GPipe, as its arena shows.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <loom/io/plan_file.hpp>
#include <loom/models/evoformer.hpp>
#include <loom/partition/apply.hpp>
#include <loom/plan/compose.hpp>
#include <loom/plan/presets.hpp>
#include <loom/plan/spaces.hpp>
#include <loom/search/plan_search.hpp>

#include "support/evoformer.hpp"
#include "support/plan_equivalence.hpp"
#include "support/search_fixtures.hpp"

using namespace loom;

namespace {

models::gpt_config model(std::int64_t layers = 4) {
    return {.layers = layers, .hidden = 16, .heads = 4, .vocab = 32, .seq = 8, .batch = 8};
}

template <class Plan>
void check_equal(const models::gpt_config& c, const Plan& plan, const std::string& what) {
    const auto e = testing::compare_with_single_device<double>(c, plan, 3);
    INFO(what << ": loss " << e.loss << ", grad norm " << e.grad_norm << ", parameters " << e.parameters << " ("
              << e.worst_parameter << "), " << e.transfers << " transfers");
    CHECK(e.loss <= 1e-9);
    CHECK(e.grad_norm <= 1e-9);
    CHECK(e.parameters <= 1e-9);
    CHECK(e.transfers > 0);
}

plan::order_policy gpipe() { return {plan::schedule_kind::gpipe}; }
plan::order_policy one_f_one_b() { return {plan::schedule_kind::one_f_one_b}; }

}  // namespace

// The pipeline parts' checks at compile time (tests/compile_fail/pipeline_*.cpp pin the
// messages): plan::well_formed answers without a hard error.
template <class... Parts>
constexpr bool well_formed_parts = plan::well_formed<Parts...>;
static_assert(well_formed_parts<decltype(plan::devices<4>), decltype(plan::stages<4>), decltype(plan::micro_batches<8>),
                                decltype(plan::order<plan::Interleaved<2>>)>);
static_assert(!well_formed_parts<decltype(plan::devices<4>), decltype(plan::stages<4>), decltype(plan::micro_batches<6>),
                                 decltype(plan::order<plan::Interleaved<2>>)>);
static_assert(!well_formed_parts<decltype(plan::devices<6>), decltype(plan::stages<4>)>);
static_assert(well_formed_parts<decltype(plan::devices<6>), decltype(plan::stages<plan::open<OneOf<2, 4>>>)>);
static_assert(!well_formed_parts<decltype(plan::devices<6>), decltype(plan::stages<plan::open<OneOf<4, 5>>>)>);
static_assert(!well_formed_parts<decltype(plan::devices<2>), decltype(plan::stages<0>)>);
static_assert(!well_formed_parts<decltype(plan::devices<2>), decltype(plan::stages<2>), decltype(plan::micro_batches<0>)>);
static_assert(!well_formed_parts<decltype(plan::devices<2>), decltype(plan::stages<2>), decltype(plan::stage_boundaries<1, 2>)>);
static_assert(!well_formed_parts<decltype(plan::devices<2>), decltype(plan::stage_boundaries<1>)>);
static_assert(!well_formed_parts<decltype(plan::devices<4>), decltype(plan::stages<2>),
                                 decltype(plan::on_all(plan::trans<Split<Dim::Batch>, 4>{}))>);
static_assert(well_formed_parts<decltype(plan::devices<4>), decltype(plan::stages<2>),
                                decltype(plan::on_all(plan::trans<Split<Dim::Batch>, 2>{}))>);
static_assert(!well_formed_parts<decltype(plan::devices<2>), decltype(plan::order<plan::GPipe>),
                                 decltype(plan::order<plan::OneFOneB>)>);

TEST_CASE("the pipeline parts' first mistake, as the checks word it", "[pipeline][errors]") {
    CHECK(std::string(plan::error_message<decltype(plan::devices<4>), decltype(plan::stages<4>),
                                          decltype(plan::micro_batches<6>), decltype(plan::order<plan::Interleaved<2>>)>
                          .view())
              .find("use 4 or 8 micro-batches") != std::string::npos);
    CHECK(std::string(plan::error_message<decltype(plan::devices<6>), decltype(plan::stages<4>)>.view()) ==
          "plan::stages<4>: 4 stages do not divide devices<6>; choose a stage count that divides 6 (1, 2, 3, 6)");
    // The open parameters of the pipeline parts are named like any other.
    constexpr auto space = plan::compose(plan::devices<4>, plan::stages<plan::open<OneOf<1, 2, 4>, "pp">>,
                                         plan::micro_batches<plan::open<Pow2<1, 8>>>,
                                         plan::order<plan::one_of<plan::GPipe, plan::OneFOneB>, "schedule">,
                                         plan::zero<plan::open<OneOf<0, 1>>>);
    CHECK(space.open_parameters() == std::vector<std::string>{"pp", "micro_batches", "schedule", "zero"});
    CHECK_THROWS_WITH(space.choose("stages", 2), Catch::Contains("no open parameter 'stages'") && Catch::Contains("pp"));
    const plan::plan_spec p = space.choose("pp", 2).choose("micro_batches", 4).choose("schedule", 1).choose("zero", 1).spec();
    const auto c = model();
    const plan::resolved_plan r = plan::resolve(p, models::gpt(c).ir());
    CHECK(r.stages == 2);
    CHECK(r.micro_batches == 4);
    CHECK(r.zero == plan::zero_stage::optimizer);
    REQUIRE(r.order);
    CHECK(r.order->name == "1F1B");
}

TEST_CASE("GPipe and 1F1B with 2 and 4 stages train like one device", "[pipeline]") {
    const auto c = model();
    for (int stages : {2, 4})
        for (int micro : {4, 8}) {
            check_equal(c, plan::presets::pipeline(stages, micro, gpipe()),
                        "GPipe x" + std::to_string(stages) + " m" + std::to_string(micro));
            check_equal(c, plan::presets::pipeline(stages, micro, one_f_one_b()),
                        "1F1B x" + std::to_string(stages) + " m" + std::to_string(micro));
        }
    // The same, written as one composed value.
    constexpr auto composed = plan::compose(plan::devices<2>, plan::stages<2>, plan::micro_batches<4>, plan::order<plan::OneFOneB>);
    static_assert(plan::well_formed<decltype(composed)>);
    check_equal(c, composed, "compose(stages<2>, micro_batches<4>, order<OneFOneB>)");
}

TEST_CASE("interleaved 1F1B (virtual stages) trains like one device", "[pipeline]") {
    const auto c = model(8);
    for (int micro : {4, 8})
        check_equal(c, plan::presets::pipeline(2, micro, {plan::schedule_kind::interleaved, 2}),
                    "interleaved 2x2 m" + std::to_string(micro));
    check_equal(c, plan::compose(plan::devices<4>, plan::stages<4>, plan::micro_batches<8>, plan::order<plan::Interleaved<2>>),
                "interleaved 4x2 m8");
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
            const plan::plan_spec p = plan::presets::pipeline(stages, micro, one_f_one_b(), inner.spec);
            CHECK(p.devices == 2 * stages);
            check_equal(c, p, "1F1B x" + std::to_string(stages) + " of " + inner.name);
            check_equal(c, plan::presets::pipeline(stages, micro, gpipe(), inner.spec),
                        "GPipe x" + std::to_string(stages) + " of " + inner.name);
        }
    // Megatron TP 2 inside 2 stages, composed from a preset (a part made at run time) and typed parts.
    check_equal(c,
                plan::compose(plan::devices<4>, plan::presets::megatron(2), plan::stages<2>, plan::micro_batches<4>,
                              plan::order<plan::GPipe>),
                "compose(megatron(2), stages<2>, micro_batches<4>, order<GPipe>)");
}

TEST_CASE("a pipeline lists one micro-batch's devices per op, and every piece of every micro-batch finds its device",
          "[pipeline]") {
    // At 1024 devices an op has hundreds of micro-batches x its stage's pieces; the resolved
    // plan keeps one micro-batch's devices, which the others repeat (op_partition::devices).
    const auto c = model();
    const graph g = models::gpt(c).ir();
    const int micro = 8;
    const plan::resolved_plan r = plan::resolve(plan::presets::pipeline(2, micro, one_f_one_b(), plan::presets::megatron(2)), g);
    int split = 0;
    for (std::size_t i = 0; i < r.forward.size(); ++i) {
        REQUIRE(r.forward[i]);
        const plan::op_partition& p = *r.forward[i];
        if (!r.micro_split[i]) continue;
        ++split;
        const std::int64_t per_micro = p.pieces() / micro;
        CHECK(static_cast<std::int64_t>(p.devices.size()) == per_micro);
        plan::op_partition listed = p;
        listed.list_every_piece();
        REQUIRE(static_cast<std::int64_t>(listed.devices.size()) == p.pieces());
        const int stage = r.stage_of[i];
        for (std::int64_t k = 0; k < p.pieces(); ++k) {
            CHECK(p.device_of(k) == p.device_of(k % per_micro));
            CHECK(listed.devices[static_cast<std::size_t>(k)] == p.device_of(k));
            CHECK(p.device_of(k) / 2 == stage);  // stage s on devices 2s and 2s + 1
        }
        // The search reads one micro-batch's pieces for what does not depend on the micro-batch
        // (the devices an op runs on, the regions of a weight they read), all of them otherwise.
        CHECK(search::detail::repeating_period(p) <= per_micro);
        CHECK(search::detail::repeating_period(p, {0}) == p.pieces());
    }
    CHECK(split > 0);
    // The plan applies and trains as before (the materializer lists every piece's device).
    check_equal(c, plan::presets::pipeline(2, micro, one_f_one_b(), plan::presets::megatron(2)), "1F1B x2, 8 micro-batches, TP 2");
}

TEST_CASE("the schedule orders the programs: 1F1B holds fewer activations than GPipe", "[pipeline]") {
    const auto c = model();
    const int stages = 2, micro = 8;
    auto arena_of_first_stage = [&](plan::order_policy order) {
        auto m = models::gpt(c);
        auto pg = partition::apply_plan(m.ir(), plan::presets::pipeline(stages, micro, order));
        const program p = compile_program(pg.devices[0].ir(), {.prec = precision::f64, .keep_every_node = true,
                                                               .order = pg.order[0]});
        return p.arena_bytes;
    };
    const auto gpipe_arena = arena_of_first_stage(gpipe());
    const auto one_f_one_b_arena = arena_of_first_stage(one_f_one_b());
    INFO("stage 0 arena: GPipe " << gpipe_arena << " bytes, 1F1B " << one_f_one_b_arena << " bytes");
    // GPipe keeps all 8 micro-batches' activations, 1F1B at most 2 on stage 0 (the arena also
    // holds the gradient sums and the weights' gathered copies, which both keep).
    CHECK(one_f_one_b_arena * 10 < gpipe_arena * 6);
}

TEST_CASE("pipeline parts that do not fit the model or each other are refused naming the part", "[pipeline][errors]") {
    const auto c = model();
    auto m = models::gpt(c);
    const graph& g = m.ir();
    CHECK_THROWS_WITH(partition::apply_plan(g, plan::presets::pipeline(8, 4)), Catch::Contains("cannot fill 8 stages"));
    CHECK_THROWS_WITH(partition::apply_plan(g, plan::presets::pipeline(2, 3)),
                      Catch::Contains("degree 3") && Catch::Contains("Batch"));
    plan::plan_spec interleaved = plan::presets::pipeline(2, 3, {plan::schedule_kind::interleaved, 2});
    CHECK_THROWS_WITH(plan::resolve(interleaved, g), Catch::Contains("Interleaved<2>") && Catch::Contains("multiple"));
    // Explicit boundaries: overlapping, out of the model, the wrong count.
    plan::plan_spec uneven = plan::presets::pipeline(2, 4);
    uneven.stages->boundaries = {0};
    CHECK_THROWS_WITH(plan::resolve(uneven, g), Catch::Contains("overlap"));
    uneven.stages->boundaries = {4};
    CHECK_THROWS_WITH(plan::resolve(uneven, g), Catch::Contains("runs past the model's 4 layers"));
    uneven.stages->boundaries = {1, 2};
    CHECK_THROWS_WITH(plan::resolve(uneven, g), Catch::Contains("2 boundaries for 2 stages"));
    uneven.stages->repeat = "layers";
    uneven.stages->boundaries.clear();
    CHECK_THROWS_WITH(plan::resolve(uneven, g), Catch::Contains("no repeated layers named 'layers'"));
    // Stages that do not divide the devices; 3F1B on a model without forward rounds.
    plan::plan_spec three = plan::presets::pipeline(2, 4, {plan::schedule_kind::three_f_one_b});
    CHECK_THROWS_WITH(plan::resolve(three, g), Catch::Contains("3 forward rounds") && Catch::Contains("model has 1"));
    plan::plan_spec odd = plan::presets::data_parallel(3);
    odd.stages = plan::stage_spec{};
    odd.stages->count = {2, "", {}};
    CHECK_THROWS_WITH(plan::resolve(odd, g), Catch::Contains("2 stages do not divide the plan's 3 devices"));
    // Open parts without values.
    plan::plan_spec open = plan::presets::pipeline(2, 4);
    open.micro_batches = {1, "m", {2, 4}};
    CHECK_THROWS_WITH(plan::resolve(open, g), Catch::Contains("'m'") && Catch::Contains("no value"));
    open.choose("m", 3);
    CHECK_THROWS_WITH(plan::resolve(open, g), Catch::Contains("outside its range {2, 4}"));
}

TEST_CASE("per-device orders edited by hand are checked before the first step", "[pipeline][errors]") {
    const auto c = model();
    auto m = models::gpt(c);
    auto refused = [&](const partition::partitioned_graph& pg) {
        std::vector<std::string> errors(static_cast<std::size_t>(pg.world));
        comm::run_ranks(pg.world, [&](comm::communicator& comm) {
            try {
                train::distributed_trainer<double> rank(pg, comm, {});
            } catch (const plan_error& e) {
                errors[static_cast<std::size_t>(comm.rank())] = e.what();
            }
        });
        return errors;
    };
    auto pg = partition::apply_plan(m.ir(), plan::presets::pipeline(2, 4));
    std::reverse(pg.order[0].begin(), pg.order[0].end());  // every node before its producers
    for (const std::string& e : refused(pg)) CHECK_THAT(e, Catch::Contains("deadlock"));
    auto dropped = partition::apply_plan(m.ir(), plan::presets::pipeline(2, 4));
    dropped.order[1].pop_back();
    for (const std::string& e : refused(dropped)) CHECK_THAT(e, Catch::Contains("device 1's order runs"));
    // An order that apply_plan made is not checked again, and runs.
    auto untouched = partition::apply_plan(m.ir(), plan::presets::pipeline(2, 4));
    for (const std::string& e : refused(untouched)) CHECK(e.empty());
}

TEST_CASE("uneven stage boundaries train like one device", "[pipeline]") {
    const auto c = model(6);
    plan::plan_spec p = plan::presets::pipeline(2, 4);
    p.stages->boundaries = {1};  // one layer on stage 0, five on stage 1
    const plan::resolved_plan r = plan::resolve(p, models::gpt(c).ir());
    int on_first = 0;
    for (std::size_t i = 0; i < r.stage_of.size(); ++i) on_first += r.stage_of[i] == 0;
    CHECK(on_first > 0);
    check_equal(c, p, "boundaries {1} of 6 layers, 1F1B");
    check_equal(c,
                plan::compose(plan::devices<3>, plan::stages<3>, plan::stage_boundaries<2, 3>, plan::micro_batches<2>,
                              plan::order<plan::GPipe>),
                "stage_boundaries<2, 3>, GPipe");
}

TEST_CASE("3F1B: three forward rounds and one backward per micro-batch train the Evoformer like one device",
          "[pipeline][evoformer]") {
    const models::evoformer_config c = testing::pipeline_evoformer(4);
    const auto data = models::evoformer_synthetic_batch(c, 7);
    const train::input_feed feed = testing::evoformer_feed(data);
    for (int stages : {2, 4}) {
        const int micro = 4;
        auto model = models::evoformer(c);
        const plan::plan_spec p = plan::presets::pipeline(stages, micro, {plan::schedule_kind::three_f_one_b});
        const plan::resolved_plan pp = plan::resolve(p, model.ir());
        CHECK(pp.rounds == 3);
        // Round r's inputs run on the first stage, the distogram head on the last.
        for (std::size_t i = 0; i < pp.stage_of.size(); ++i) {
            const std::string scope = model.ir().scope_path(model.ir().nodes[i].scope);
            if (scope.rfind("recycle.", 0) == 0 && scope.find(".input") != std::string::npos) CHECK(pp.stage_of[i] == 0);
            if (scope.rfind("distogram", 0) == 0) CHECK(pp.stage_of[i] == stages - 1);
        }
        auto pg = partition::apply_plan(model.ir(), pp);
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
    // devices, split by vocabulary (the interlaced pipeline's own rules for its ends); the
    // layers form a pipeline of one device per stage between them, time-shared on the same
    // devices.
    const auto c = model();
    for (int p : {2, 4}) {
        const int micro = 4;
        const plan::plan_spec spec = plan::presets::pipeline(p, micro, {plan::schedule_kind::interlaced});
        check_equal(c, spec, "interlaced x" + std::to_string(p));
    }
}

TEST_CASE("the interlaced pipeline around stages of TP x DP: its ends reduce and share by collectives, not sends",
          "[pipeline]") {
    // The ends run on all 8 devices, the two stages of layers on 4 each. The embeddings leave
    // partial sums on every device and the head needs the last stage's output on every
    // device: point to point, each stage-0 device would receive one partial sum per device
    // per micro-batch, and the last stage would send its output to every device (496 sends
    // here, thousands of whole activations per micro-batch at 1024 devices). Reduced among
    // the ends' devices and broadcast within them, the interlaced pipeline sends about what
    // 1F1B sends between the same stages.
    const auto c = model();
    const graph forward(models::gpt(c).ir());
    namespace presets = plan::presets;
    const plan::plan_spec interlaced = presets::pipeline(2, 4, {plan::schedule_kind::interlaced}, presets::megatron(2, 2));
    const plan::plan_spec plain = presets::pipeline(2, 4, one_f_one_b(), presets::megatron(2, 2));
    auto sends = [&](const plan::plan_spec& p) {
        const partition::partitioned_graph pg = partition::apply_plan(forward, p);
        return std::count_if(pg.transfers.begin(), pg.transfers.end(),
                             [](const partition::transfer& t) { return t.kind == partition::transfer_kind::send_recv; });
    };
    const auto interlaced_sends = sends(interlaced), plain_sends = sends(plain);
    INFO("sends: interlaced " << interlaced_sends << ", 1F1B " << plain_sends);
    CHECK(interlaced_sends <= 2 * plain_sends);
    check_equal(c, interlaced, "interlaced x2 of TP 2 x DP 2");
}

TEST_CASE("searched plans run and train like one device, and load back from plan files", "[pipeline][search]") {
    const auto c = model();
    auto m = models::gpt(c);
    const graph forward = m.ir();
    const graph training = std::move(m).training_graph();
    // A 4-device node slow enough that compute, not latency, sets the step, so that the search
    // has a reason to spread the model over the devices: what it picks must run.
    // nnScaler's space, narrowed to 4 micro-batches, even stage cuts, no Coshard and ZeRO 0
    // or 1, still leaves the degrees, stages, order, ZeRO stage and recompute to the search,
    // which takes about a second.
    search::cluster node = testing::slow_node();
    node.topo.devices_per_node = 4;
    const plan::plan_spec space = plan::spaces::nnscaler(4, 0).narrow("mb", {4}).narrow("coshard", {1}).narrow("zero", {0, 1});
    search::plan_search_result searched = search::search_plan(forward, space, node);
    searched.plan.name = "searched: " + search::choices_text(searched.parameters, searched.best.choices);
    // The other shapes, as plans written by hand.
    namespace presets = plan::presets;
    const auto named = [](plan::plan_spec p, std::string name) {
        p.name = std::move(name);
        return p;
    };
    const std::vector<plan::plan_spec> plans{
        searched.plan,
        named(plan::compose(plan::devices<4>, presets::megatron(2), plan::stages<2>, plan::micro_batches<4>,
                            plan::order<plan::OneFOneB>)
                  .spec(),
              "TP 2 x PP 2, 1F1B, 4 micro-batches"),
        named(plan::compose(plan::devices<4>, presets::data_parallel(2), plan::stages<2>, plan::micro_batches<2>,
                            plan::order<plan::GPipe>)
                  .spec(),
              "PP 2 x DP 2, GPipe, 2 micro-batches"),
        named(presets::megatron(2, 2), "TP 2 x DP 2"),
        named(plan::compose(plan::devices<2>, plan::stages<2>, plan::micro_batches<4>, plan::order<plan::Interleaved<2>>).spec(),
              "PP 2, interleaved 1F1B of 2 chunks, 4 micro-batches"),
        named(plan::compose(plan::devices<1>, plan::stages<1>, plan::micro_batches<4>, plan::order<plan::OneFOneB>).spec(),
              "1 device, 1F1B, 4 micro-batches"),
        // Data parallelism of degree 1 inside the stages is not a no-op here: its rule over every
        // op reaches the interlaced pipeline's ends too, which then run the layer norm and the
        // embeddings' sum on one device and broadcast them (the interlaced test above runs them
        // on every device).
        named(presets::pipeline(4, 4, {plan::schedule_kind::interlaced}, presets::data_parallel(1)),
              "PP 4, interlaced, 4 micro-batches, the ends' replicated ops on one device"),
        named(plan::compose(plan::devices<2>, plan::stages<2>, plan::stage_boundaries<1>, plan::micro_batches<2>,
                            plan::order<plan::OneFOneB>)
                  .spec(),
              "PP 2 of layers {1, 3}, 1F1B, 2 micro-batches"),
        named(plan::compose(plan::devices<4>, presets::megatron(2, 2),
                            presets::recompute_layers(plan::recompute_policy::full, 0, 0),
                            presets::recompute_layers(plan::recompute_policy::selective, 1, 1),
                            presets::recompute_layers(plan::recompute_policy::full, 3, 3))
                  .spec(),
              "TP 2 x DP 2, recompute layers full, selective, none, full"),
        named(presets::zero(3, 4), "DP 4, ZeRO-3"),
    };
    train::trainer<double> single(training, {});
    std::vector<std::vector<std::int32_t>> data;
    std::vector<train::input_feed> feeds;
    std::vector<train::step_result> reference;
    for (int step = 0; step < 2; ++step) {
        feeds.push_back(testing::gpt_batch(c, step, data));
        reference.push_back(single.step(feeds.back()));
    }
    for (const plan::plan_spec& p : plans) {
        INFO(p.name);
        const auto pg = partition::apply_plan(forward, p);
        REQUIRE(pg.world == p.devices);
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
    // Saved and loaded back, each plan gives the same programs: nodes, in the same order.
    const std::string path = (std::filesystem::temp_directory_path() / "loom_test_searched_plan.json").string();
    for (const plan::plan_spec& p : plans) {
        INFO(p.name);
        io::save_plan(p, path, forward);
        const auto original = partition::apply_plan(forward, p);
        const auto loaded = partition::apply_plan(forward, io::load_plan(path, forward));
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
    }
    std::filesystem::remove(path);
}
