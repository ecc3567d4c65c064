// Pipelines combined with everything else a plan expresses: ZeRO 1/2/3, selective and full
// recompute, Coshard, uneven stages, 3F1B and the interlaced pipeline with tensor or data
// parallelism inside the stages. Each trains the GPT (or the Evoformer, for 3F1B) to the
// same losses, gradient norms and parameters as one device (float64: 1e-9). Data
// parallelism inside a stage sums each device's micro-batch gradients locally first: one
// all-reduce per parameter piece per step, whatever the micro-batch count.
#include <catch2/catch.hpp>

#include <map>
#include <optional>
#include <set>
#include <string>

#include <loom/models/evoformer.hpp>
#include <loom/models/gpt.hpp>
#include <loom/partition/apply.hpp>
#include <loom/plan/presets.hpp>
#include <loom/plan/resolve.hpp>

#include "support/evoformer.hpp"
#include "support/plan_equivalence.hpp"

using namespace loom;

namespace {

models::gpt_config model(std::int64_t layers = 4) {
    return {.layers = layers, .hidden = 16, .heads = 4, .vocab = 32, .seq = 8, .batch = 8};
}

plan::order_policy one_f_one_b() { return {plan::schedule_kind::one_f_one_b}; }
plan::order_policy gpipe() { return {plan::schedule_kind::gpipe}; }
plan::order_policy interleaved() { return {plan::schedule_kind::interleaved, 2}; }
plan::order_policy interlaced() { return {plan::schedule_kind::interlaced}; }
plan::order_policy three_f_one_b() { return {plan::schedule_kind::three_f_one_b}; }

// The plan `p` ordered by `order`.
plan::plan_spec ordered(plan::plan_spec p, plan::order_policy order) {
    p.order.alternatives = {std::move(order)};
    return p;
}

void check_equal(const models::gpt_config& c, const plan::plan_spec& p, plan::order_policy order, const std::string& what,
                 train::trainer_options options = {}) {
    const auto e = testing::compare_with_single_device<double>(c, ordered(p, std::move(order)), 3, options);
    INFO(what << ": loss " << e.loss << ", grad norm " << e.grad_norm << ", parameters " << e.parameters << " ("
              << e.worst_parameter << "), " << e.transfers << " transfers");
    CHECK(e.loss <= 1e-9);
    CHECK(e.grad_norm <= 1e-9);
    CHECK(e.parameters <= 1e-9);
}

struct stage_options {
    int stages = 2;
    int micro_batches = 4;
    int devices_per_stage = 1;
    int virtual_stages = 1;  // > 1: interleaved
    std::optional<plan::plan_spec> inner;
};

// Even stages of devices_per_stage devices, each cut by `inner`, ordered by 1F1B (interleaved
// with virtual stages).
plan::plan_spec pipeline(const models::gpt_config&, const stage_options& o) {
    plan::plan_spec inner = o.inner.value_or(plan::plan_spec{});
    inner.devices = o.devices_per_stage;
    return plan::presets::pipeline(o.stages, o.micro_batches,
                                   o.virtual_stages > 1 ? plan::order_policy{plan::schedule_kind::interleaved, o.virtual_stages}
                                                        : one_f_one_b(),
                                   inner);
}

// Transfers of each kind that move parameter gradients.
std::map<partition::transfer_kind, int> gradient_transfers(const partition::partitioned_graph& pg) {
    std::map<partition::transfer_kind, int> count;
    const graph& g = pg.ir();
    for (const auto& t : pg.transfers) {
        const std::string& name = g.tensor(t.logical).name;
        if (name.rfind("grad/", 0) == 0 || g.tensor(t.logical).role == tensor_role::gradient) ++count[t.kind];
    }
    return count;
}

// Collectives of the backward pass (all but point-to-point transfers), by kind.
std::map<partition::transfer_kind, int> backward_collectives(const partition::partitioned_graph& pg) {
    std::map<partition::transfer_kind, int> count;
    for (const auto& t : pg.transfers)
        if (t.backward && t.kind != partition::transfer_kind::send_recv) ++count[t.kind];
    return count;
}

}  // namespace

TEST_CASE("ZeRO 1, 2 and 3 inside pipeline stages shard over the stage's data-parallel devices", "[pipeline][zero]") {
    const auto c = model();
    const train::trainer_options adam{.optimizer = train::adamw_options{}};
    for (int z : {1, 2, 3})
        for (int stages : {2, 4}) {
            const int micro = stages == 2 ? 4 : 2;
            const auto pp = pipeline(c, {.stages = stages, .micro_batches = micro, .devices_per_stage = 2,
                                         .inner = plan::presets::zero(z, 2)});
            CHECK(static_cast<int>(plan::resolve(pp, models::gpt(c).ir()).zero) == z);
            const std::string what = "x" + std::to_string(stages) + " of ZeRO-" + std::to_string(z);
            check_equal(c, pp, one_f_one_b(), "1F1B " + what, adam);
            if (stages == 2) check_equal(c, pp, gpipe(), "GPipe " + what, adam);

            // A first-block weight lives on stage 0's pair of devices only, sharded between them
            // (ZeRO-3: stored in halves; ZeRO-2: gradients in halves; ZeRO-1: updates in halves).
            auto m = models::gpt(c);
            auto pg = partition::apply_plan(m.ir(), pp);
            const graph& g = pg.ir();
            tensor_id w = no_id;
            for (tensor_id t : g.parameters)
                if (g.tensor(t).name == "blocks.0.mlp.fc.weight") w = t;
            REQUIRE(w != no_id);
            const auto rows = g.tensor(w).dims.extent(0);
            for (int d = 0; d < pg.world; ++d) {
                INFO(what << ", device " << d);
                const auto& part = pg.devices[static_cast<std::size_t>(d)];
                for (const auto& s : part.parameters)
                    if (s.logical == w) {
                        CHECK(d < 2);
                        CHECK(s.region.ranges[0].size() == (z == 3 ? rows / 2 : rows));
                    }
                for (const auto& s : part.gradients)
                    if (s.logical == w) {
                        CHECK(s.region.ranges[0].size() == (z >= 2 ? rows / 2 : rows));
                        CHECK(train::update_region(pg, d, w, s.region).ranges[0].size() == rows / 2);
                    }
            }
        }
}

TEST_CASE("ZeRO-1 reduces each gradient once; ZeRO-2 and 3 reduce each micro-batch's onto the shards as it is made",
          "[pipeline][zero][data-parallel]") {
    // ZeRO-1 keeps whole gradients: each device sums its micro-batches' and reduces once.
    // ZeRO-2 and 3 keep gradients sharded all step, as DeepSpeed does: each micro-batch's
    // gradient is reduce-scattered in that micro-batch's backward, so a device never holds
    // the whole gradient of its stage, and the reductions grow with the micro-batches.
    const auto c = model();
    std::map<int, std::size_t> arena;  // by ZeRO stage: device 0's, 1F1B over 4 micro-batches
    for (int z : {1, 2, 3}) {
        std::map<int, std::map<partition::transfer_kind, int>> by_micro;
        for (int micro : {1, 2, 4}) {
            const auto pp = pipeline(c, {.stages = 2, .micro_batches = micro, .devices_per_stage = 2,
                                         .inner = plan::presets::zero(z, 2)});
            auto m = models::gpt(c);
            const plan::resolved_plan r = plan::resolve(ordered(pp, one_f_one_b()), m.ir());
            const auto pg = partition::apply_plan(m.ir(), r);
            by_micro[micro] = backward_collectives(pg);
            if (micro != 4) continue;
            arena[z] = compile_program(pg.devices[0].ir(), {.prec = precision::f64, .keep_every_node = true,
                                                            .order = pg.order[0]})
                           .arena_bytes;
            if (z == 1) continue;
            // On device 0, each micro-batch's reduction follows the piece that made its
            // gradient: nothing but other inserted nodes runs between them.
            const graph& dg = pg.devices[0].ir();
            std::vector<std::size_t> position(dg.nodes.size());
            for (std::size_t k = 0; k < pg.order[0].size(); ++k) position[static_cast<std::size_t>(pg.order[0][k])] = k;
            std::set<int> micro_batches;
            int reductions = 0;
            for (std::size_t i = 0; i < dg.nodes.size(); ++i) {
                if (!dg.nodes[i].attrs.has("transfer")) continue;
                const auto& tr = pg.transfers.at(static_cast<std::size_t>(dg.nodes[i].attrs.get<std::int64_t>("transfer")));
                if (tr.kind != partition::transfer_kind::reduce_scatter || !tr.backward) continue;
                const node_id made = dg.tensor(dg.nodes[i].inputs.at(0)).producer;
                const auto from = pg.devices[0].source_of(made);
                const auto b = from.logical == no_id ? std::nullopt : partition::detail::pipeline_block(pg, r, from.logical, from.piece);
                if (!b) continue;  // (a sum made whole first: the tied embedding's)
                ++reductions;
                micro_batches.insert(b->micro);
                INFO("the reduction of '" << dg.tensor(dg.nodes[i].inputs.at(0)).name << "'");
                for (std::size_t k = position[static_cast<std::size_t>(made)] + 1; k < position[i]; ++k)
                    CHECK(pg.devices[0].source_of(pg.order[0][k]).logical == no_id);
            }
            CHECK(reductions > 0);
            CHECK(micro_batches == std::set<int>{0, 1, 2, 3});
        }
        INFO("ZeRO-" << z);
        const auto reduce = z == 1 ? partition::transfer_kind::all_reduce : partition::transfer_kind::reduce_scatter;
        CHECK(by_micro[4][reduce] > 0);
        if (z == 1) {
            CHECK(by_micro[1] == by_micro[2]);
            CHECK(by_micro[2] == by_micro[4]);
        } else {
            // One reduction per sharded gradient and micro-batch (the tied embedding's sum,
            // read by both stages, is made whole first and reduced once).
            CHECK(by_micro[4][reduce] > by_micro[2][reduce]);
            CHECK(by_micro[4][reduce] - by_micro[2][reduce] == 2 * (by_micro[2][reduce] - by_micro[1][reduce]));
        }
    }
    INFO("device 0's arena, 1F1B x2 of ZeRO x2, 4 micro-batches: ZeRO-1 " << arena[1] << " bytes, ZeRO-2 " << arena[2]
                                                                            << ", ZeRO-3 " << arena[3]);
    CHECK(arena[2] < arena[1]);
    CHECK(arena[3] < arena[1]);
    // ZeRO-3 gathers each parameter for one micro-batch's forward or backward and frees it
    // after: its arena holds at most one gathered MLP weight (float64) beyond ZeRO-2's, not
    // every layer's weights from their forward to their backward.
    const auto mlp_weight = static_cast<std::size_t>(c.hidden * 4 * c.hidden * 8);
    CHECK(arena[3] <= arena[2] + mlp_weight);
}

TEST_CASE("selective and full recompute inside pipeline stages", "[pipeline][recompute]") {
    const auto c = model();
    plan::selector mlp;
    mlp.scope = "*.mlp*";
    for (const auto& [name, inner] : {std::pair{std::string("selective"), plan::presets::recompute(mlp)},
                                      std::pair{std::string("full"), plan::presets::recompute({})}}) {
        const auto pp = pipeline(c, {.stages = 2, .micro_batches = 4, .inner = inner});
        check_equal(c, pp, one_f_one_b(), "1F1B x2, " + name + " recompute");
        check_equal(c, pp, gpipe(), "GPipe x2, " + name + " recompute");
        plan::plan_spec dp = plan::presets::data_parallel(2);
        dp.then(inner);
        const auto with_dp = pipeline(c, {.stages = 2, .micro_batches = 4, .devices_per_stage = 2, .inner = dp});
        check_equal(c, with_dp, one_f_one_b(),
                    "1F1B x2 of data parallel x2, " + name + " recompute");
    }
    const auto chunks = pipeline(model(8), {.stages = 2, .micro_batches = 4, .virtual_stages = 2,
                                            .inner = plan::presets::recompute(mlp)});
    check_equal(model(8), chunks, interleaved(), "interleaved 2x2, selective recompute");
}

TEST_CASE("recomputed copies run in their micro-batch's backward block, so stages keep fewer activations",
          "[pipeline][recompute]") {
    const auto c = model();
    auto arena_of_first_stage = [&](const plan::plan_spec& inner, std::size_t& copies) {
        auto m = models::gpt(c);
        const plan::resolved_plan r = plan::resolve(ordered(pipeline(c, {.stages = 2, .micro_batches = 8, .inner = inner}), gpipe()), m.ir());
        auto pg = partition::apply_plan(m.ir(), r);
        const graph& dg = pg.devices[0].ir();
        copies = 0;
        for (std::size_t i = 0; i < dg.nodes.size(); ++i) {
            const auto src = pg.devices[0].source_of(static_cast<node_id>(i));
            if (dg.nodes[i].name.find("/recompute") == std::string::npos || src.logical == no_id) continue;
            ++copies;
            const auto b = partition::detail::pipeline_block(pg, r, src.logical, src.piece);
            REQUIRE(b);
            CHECK(b->pass == schedule::pass_kind::backward);
        }
        return compile_program(dg, {.prec = precision::f64, .keep_every_node = true, .order = pg.order[0]}).arena_bytes;
    };
    std::size_t none = 0, full = 0;
    const auto kept = arena_of_first_stage({}, none);
    const auto recomputed = arena_of_first_stage(plan::presets::recompute({}), full);
    INFO("stage 0 arena under GPipe x2, 8 micro-batches: " << kept << " bytes, with full recompute " << recomputed);
    CHECK(none == 0);
    CHECK(full > 0);
    CHECK(recomputed < kept);
}

TEST_CASE("Coshard inside pipeline stages", "[pipeline][coshard]") {
    const auto c = model();
    for (int stages : {2, 4}) {
        const auto pp = pipeline(c, {.stages = stages, .micro_batches = 4, .devices_per_stage = 2,
                                     .inner = plan::presets::coshard(2, 2)});
        check_equal(c, pp, one_f_one_b(),
                    "1F1B x" + std::to_string(stages) + " of coshard 2 per device x2");
    }
}

TEST_CASE("uneven stage boundaries", "[pipeline]") {
    const auto c = model(5);
    plan::plan_spec p = plan::presets::pipeline(3, 4);
    p.stages->boundaries = {1, 4};  // layers 0, 1-3 and 4
    CHECK(plan::resolve(p, models::gpt(c).ir()).stage_of.size() > 0);
    check_equal(c, p, one_f_one_b(), "1F1B 1+3+1 layers");
    check_equal(c, p, gpipe(), "GPipe 1+3+1 layers");
    // Uneven groups of two with tensor parallelism inside, and the layers 3+2.
    plan::plan_spec tp = plan::presets::pipeline(2, 4, one_f_one_b(), plan::presets::megatron(2));
    tp.stages->boundaries = {3};
    check_equal(c, tp, one_f_one_b(), "1F1B 3+2 layers of megatron x2");
}

TEST_CASE("one plan with all three primitives: Megatron x2 in 2 stages, 1F1B, ZeRO-1 and recompute of half the layers",
          "[pipeline][zero][recompute]") {
    const auto c = model();
    plan::selector first_half;
    first_half.repeat = "blocks";
    first_half.first_layer = 0;
    first_half.last_layer = 1;
    plan::plan_spec inner = plan::presets::megatron(2);
    inner.then(plan::presets::recompute(first_half));
    inner.zero = plan::zero_stage::optimizer;
    const auto pp = pipeline(c, {.stages = 2, .micro_batches = 4, .devices_per_stage = 2, .inner = inner});
    check_equal(c, pp, one_f_one_b(), "megatron x2, 2 stages, ZeRO-1, recompute",
                {.optimizer = train::adamw_options{}});
    plan::plan_spec dp_zero3 = plan::presets::zero(3, 2);
    dp_zero3.then(plan::presets::recompute(first_half));
    const auto z3 = pipeline(c, {.stages = 2, .micro_batches = 4, .devices_per_stage = 2, .inner = dp_zero3});
    check_equal(c, z3, one_f_one_b(), "ZeRO-3 x2, 2 stages, recompute");
}

TEST_CASE("data parallelism inside stages all-reduces each gradient once per step", "[pipeline][data-parallel]") {
    // Each device adds up its micro-batches' partial gradients first: as many gradient
    // collectives with 4 micro-batches as with 2, and none point to point.
    const auto c = model();
    std::map<int, std::map<partition::transfer_kind, int>> by_micro;
    for (int micro : {2, 4}) {
        const auto pp = pipeline(c, {.stages = 2, .micro_batches = micro, .devices_per_stage = 2,
                                     .inner = plan::presets::data_parallel(2)});
        auto m = models::gpt(c);
        auto pg = partition::apply_plan(m.ir(), pp);
        by_micro[micro] = gradient_transfers(pg);
        // One all-reduce per parameter over the pair of its stage. The tied embedding, on both
        // stages, is all-reduced on the first stage's pair (after each device added the last
        // stage's LM-head contributions to its own) and broadcast to the last stage.
        CHECK(by_micro[micro][partition::transfer_kind::all_reduce] == static_cast<int>(pg.ir().parameters.size()));
        CHECK(by_micro[micro][partition::transfer_kind::broadcast] == 1);
        CHECK(by_micro[micro][partition::transfer_kind::send_recv] == 0);
        check_equal(c, pp, one_f_one_b(), "1F1B x2 of DP x2, m" + std::to_string(micro));
    }
    CHECK(by_micro[2] == by_micro[4]);
    // One micro-batch: the loss, summed over the last stage's pair, reaches the first stage
    // point to point (a broadcast across stages would wait on gradients still to come).
    const auto one = pipeline(c, {.stages = 2, .micro_batches = 1, .devices_per_stage = 2, .inner = plan::presets::data_parallel(2)});
    check_equal(c, one, one_f_one_b(), "1F1B x2 of DP x2, m1");
}

TEST_CASE("3F1B with two and four stages and data or tensor parallelism inside them trains the Evoformer like one device",
          "[pipeline][evoformer]") {
    models::evoformer_config c = testing::pipeline_evoformer(4);
    c.batch = 8;  // 4 micro-batches of 2 samples, one per data-parallel device
    const auto data = models::evoformer_synthetic_batch(c, 7);
    const train::input_feed feed = testing::evoformer_feed(data);
    // Tensor parallelism in the Evoformer: the transitions' MLPs split Megatron's way along
    // FFN (fc by its outputs, the ReLU, proj by its inputs), every other op whole on both devices.
    using namespace plan::presets::detail;
    plan::plan_spec transitions;
    transitions.devices = 2;
    transitions.name = "transitions tensor parallel x2";
    transitions.add(trans({}, 1, {replicate(2)}, "test"));
    transitions.add(trans(kinds({&op_def_of<ops::LinearBias>(), &op_def_of<ops::Relu>()}, "*_transition"), 1,
                          {split_dim(Dim::FFN::id, 2)}, "test"));
    struct inner_plan {
        std::string name;
        plan::plan_spec spec;
    };
    for (const auto& inner : {inner_plan{"data parallel x2", plan::presets::data_parallel(2)},
                              inner_plan{"tensor parallel x2", transitions}})
        for (int stages : {2, 4}) {
            const int micro = 4;
            if (stages == 4 && inner.name[0] == 't') continue;  // one 4-stage case keeps the test short
            auto model = models::evoformer(c);
            auto pg = partition::apply_plan(model.ir(), plan::presets::pipeline(stages, micro, three_f_one_b(), inner.spec));
            if (inner.spec.name == transitions.name) {
                // The split is real: stage 0's devices store half of a transition's weight each.
                const graph& lg = pg.ir();
                for (const auto& sp : pg.devices[0].parameters)
                    if (lg.tensor(sp.logical).name == "blocks.0.pair_transition.fc.weight")
                        CHECK(sp.region.numel() * 2 == lg.tensor(sp.logical).dims.numel());
            }
            train::trainer<double> single(std::move(model).training_graph(), {});
            std::vector<train::step_result> reference;
            for (int step = 0; step < 3; ++step) reference.push_back(single.step(feed));
            std::vector<std::vector<train::step_result>> results(static_cast<std::size_t>(pg.world));
            std::vector<double> weight;
            comm::run_ranks(pg.world, [&](comm::communicator& comm) {
                train::distributed_trainer<double> rank(pg, comm, {});
                for (int step = 0; step < 3; ++step) results[static_cast<std::size_t>(comm.rank())].push_back(rank.step(feed));
                auto w = rank.gather_parameter("blocks.0.pair_transition.fc.weight");
                if (comm.rank() == 0) weight = std::move(w);
            });
            INFO("3F1B x" << stages << " of " << inner.name);
            for (const auto& per_rank : results)
                for (std::size_t step = 0; step < reference.size(); ++step) {
                    CHECK(testing::relative(per_rank.at(step).loss, reference[step].loss) <= 1e-9);
                    CHECK(testing::relative(per_rank.at(step).grad_norm, reference[step].grad_norm) <= 1e-9);
                }
            const auto want = single.parameter("blocks.0.pair_transition.fc.weight");
            REQUIRE(weight.size() == want.size());
            for (std::size_t k = 0; k < want.size(); ++k) CHECK(std::abs(weight[k] - want[k]) <= 1e-9);
        }
}

TEST_CASE("the interlaced pipeline with tensor and data parallelism inside the stages", "[pipeline][interlaced]") {
    const auto c = model();
    for (const auto& [name, inner] : {std::pair{std::string("megatron x2"), plan::presets::megatron(2)},
                                      std::pair{std::string("data parallel x2"), plan::presets::data_parallel(2)}}) {
        const int stages = 2, micro = 4;
        const plan::plan_spec spec = plan::presets::pipeline(stages, micro, interlaced(), inner);
        CHECK(spec.devices == 4);
        // The ends are split by vocabulary over all 4 devices, not by the stages' rules
        // over 2 (which would leave the other group idle or doing the same work again).
        const graph forward = models::gpt(c).ir();
        const plan::resolved_plan rp = plan::resolve(spec, forward);
        int ends = 0;
        for (std::size_t n = 0; n < forward.forward_node_count(); ++n) {
            const node& op = forward.nodes[n];
            if (op.op->name != std::string_view("embedding") && op.op->name != std::string_view("cross_entropy")) continue;
            const plan::op_partition* p = rp.at(static_cast<node_id>(n));
            REQUIRE(p);
            INFO(name << ": " << op.name << " " << p->describe());
            std::set<int> devices;
            for (std::int64_t k = 0; k < p->pieces(); ++k) devices.insert(p->device_of(k));
            CHECK(p->pieces() == 4 * micro);  // a quarter of the vocabulary per micro-batch
            CHECK(p->replicas == 1);
            CHECK(devices.size() == 4);
            ++ends;
        }
        CHECK(ends == 3);  // the token and position embeddings, and the loss
        check_equal(c, spec, interlaced(), "interlaced x2 of " + name);
    }
}

TEST_CASE("ZeRO inside interleaved, Megatron, Coshard, interlaced and 3F1B pipelines", "[pipeline][zero]") {
    // ZeRO-2 keeps only a shard of each gradient, which each device updates in the piece of
    // the parameter it stores: Megatron's tensor-parallel pieces are sharded over their
    // data-parallel groups (the tied embedding, read by both stages, keeps its gradient
    // pieces whole), but colocated pieces (Coshard) and the interlaced pipeline's
    // vocabulary-parallel ends store no piece that holds the shard: refused when the plan
    // is applied, as without a pipeline, naming ZeRO-3 as the fix.
    const auto c = model();
    const train::trainer_options adam{.optimizer = train::adamw_options{}};
    for (int z : {1, 2, 3}) {
        SECTION("interleaved zero " + std::to_string(z)) {
            const auto pp = pipeline(model(8), {.stages = 2, .micro_batches = 4, .devices_per_stage = 2, .virtual_stages = 2,
                                                .inner = plan::presets::zero(z, 2)});
            check_equal(model(8), pp, interleaved(),
                        "interleaved 2x2 of ZeRO-" + std::to_string(z), adam);
        }
        SECTION("megatron zero " + std::to_string(z)) {
            plan::plan_spec inner = plan::presets::megatron(2);
            inner.zero = static_cast<plan::zero_stage>(z);
            const auto pp = pipeline(c, {.stages = 2, .micro_batches = 4, .devices_per_stage = 2, .inner = inner});
            check_equal(c, pp, one_f_one_b(), "1F1B x2 of megatron x2, ZeRO-" + std::to_string(z), adam);
        }
        SECTION("coshard zero " + std::to_string(z)) {
            plan::plan_spec inner = plan::presets::coshard(2, 2);
            inner.zero = static_cast<plan::zero_stage>(z);
            const auto pp = pipeline(c, {.stages = 2, .micro_batches = 4, .devices_per_stage = 2, .inner = inner});
            const auto s = one_f_one_b();
            if (z == 2)
                CHECK_THROWS_WITH(check_equal(c, pp, s, "coshard zero", adam), Catch::Contains("ZeRO-2") && Catch::Contains("use ZeRO-3"));
            else
                check_equal(c, pp, s, "1F1B x2 of coshard, ZeRO-" + std::to_string(z), adam);
        }
        SECTION("interlaced zero " + std::to_string(z)) {
            const plan::plan_spec pp = plan::presets::pipeline(2, 4, interlaced(), plan::presets::zero(z, 2));
            if (z == 2)
                CHECK_THROWS_WITH(check_equal(c, pp, interlaced(), "interlaced zero", adam), Catch::Contains("ZeRO-2") && Catch::Contains("use ZeRO-3"));
            else
                check_equal(c, pp, interlaced(), "interlaced of DP x2, ZeRO-" + std::to_string(z), adam);
        }
        SECTION("3f1b zero " + std::to_string(z)) {
            models::evoformer_config e = testing::pipeline_evoformer(4);
            e.batch = 8;
            const auto data = models::evoformer_synthetic_batch(e, 7);
            const train::input_feed feed = testing::evoformer_feed(data);
            auto model = models::evoformer(e);
            auto pg = partition::apply_plan(model.ir(), plan::presets::pipeline(2, 4, three_f_one_b(), plan::presets::zero(z, 2)));
            train::trainer<double> single(std::move(model).training_graph(), {});
            std::vector<train::step_result> reference;
            for (int step = 0; step < 3; ++step) reference.push_back(single.step(feed));
            std::vector<std::vector<train::step_result>> results(static_cast<std::size_t>(pg.world));
            comm::run_ranks(pg.world, [&](comm::communicator& comm) {
                train::distributed_trainer<double> rank(pg, comm, {});
                for (int step = 0; step < 3; ++step) results[static_cast<std::size_t>(comm.rank())].push_back(rank.step(feed));
            });
            INFO("3F1B x2 of ZeRO-" << z);
            for (const auto& per_rank : results)
                for (std::size_t step = 0; step < reference.size(); ++step) {
                    CHECK(testing::relative(per_rank.at(step).loss, reference[step].loss) <= 1e-9);
                    CHECK(testing::relative(per_rank.at(step).grad_norm, reference[step].grad_norm) <= 1e-9);
                }
        }
    }
}
