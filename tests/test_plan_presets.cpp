// Every preset plan on 2, 4 and 8 in-process ranks trains the GPT to the same losses,
// gradient norms and parameters as one device: float64 to 1e-9, float32 to 1e-5.
#include <catch2/catch.hpp>

#include <loom/partition/apply.hpp>
#include <loom/plan/presets.hpp>
#include <loom/train/ownership.hpp>

#include "support/plan_equivalence.hpp"

using namespace loom;
namespace presets = loom::plan::presets;

namespace {

models::gpt_config model_for(int ranks) {
    // Heads, FFN, vocabulary, sequence and batch all divide by 8 (heads by 16, for Coshard).
    (void)ranks;
    return {.layers = 2, .hidden = 32, .heads = 16, .vocab = 64, .seq = 16, .batch = 8};
}

template <class T>
void check(const plan::plan_spec& spec, int steps = 10) {
    const double tolerance = std::is_same_v<T, double> ? 1e-9 : 1e-5;
    const auto config = model_for(spec.devices);
    auto model = models::gpt(config);
    const auto resolved = plan::resolve(spec, model.ir());
    // float32 trains with SGD: Adam divides by the root of the squared gradient, which turns
    // the rounding noise of a gradient that is zero in exact arithmetic (the key bias) into
    // updates of full size, so no two summation orders agree on that parameter in float32.
    train::trainer_options options;
    if constexpr (std::is_same_v<T, float>) options.optimizer = train::sgd_options{};
    const auto e = testing::compare_with_single_device<T>(config, resolved, steps, options);
    INFO(spec.name << " (" << (std::is_same_v<T, double> ? "f64" : "f32") << "): loss " << e.loss << ", grad norm "
                   << e.grad_norm << ", parameters " << e.parameters << " (" << e.worst_parameter << "), "
                   << e.transfers << " transfers");
    CHECK(e.loss <= tolerance);
    CHECK(e.grad_norm <= tolerance);
    CHECK(e.parameters <= tolerance);
    if (spec.devices > 1) CHECK(e.transfers > 0);
}

template <class T>
void check_all(int n) {
    check<T>(presets::data_parallel(n));
    check<T>(presets::megatron(n));
    check<T>(presets::sequence_parallel(n));
    for (int stage = 1; stage <= 3; ++stage) check<T>(presets::zero(stage, n));
    {
        plan::selector blocks;
        blocks.repeat = "blocks";
        auto p = presets::data_parallel(n).then(presets::recompute(blocks));
        p.name = "data parallel + recompute";
        check<T>(p);
    }
    check<T>(presets::coshard(n, 2));
    if (n >= 4) {
        check<T>(presets::megatron(2, n / 2));
        check<T>(presets::megatron(n / 2, 2));
        check<T>(presets::sequence_parallel(2, n / 2));
        // Megatron-LM's distributed optimizer (ZeRO-1) and DeepSpeed's ZeRO-2 and ZeRO-3 over
        // Megatron's tensor-parallel pieces: each piece sharded over its data-parallel group.
        for (int zero = 1; zero <= 3; ++zero) {
            auto p = presets::megatron(2, n / 2);
            p.zero = static_cast<plan::zero_stage>(zero);
            p.name += " + ZeRO-" + std::to_string(zero);
            check<T>(p);
        }
    }
}

}  // namespace

TEST_CASE("presets on 2 ranks equal one device", "[plan][presets]") {
    check_all<double>(2);
    check_all<float>(2);
}

TEST_CASE("presets on 4 ranks equal one device", "[plan][presets]") {
    check_all<double>(4);
    check_all<float>(4);
}

TEST_CASE("presets on 8 ranks equal one device", "[plan][presets]") {
    check_all<double>(8);
    check_all<float>(8);
}

TEST_CASE("ZeRO-1 under tensor parallelism shards each piece's update over its data-parallel group", "[plan][zero]") {
    // Megatron TP 2 x DP 4: the tensor-parallel pieces of the MLP weight are stored by four
    // devices each, and each of them updates a quarter of its piece (before, a piece that was
    // not the whole parameter was updated whole everywhere: no optimizer sharding at all).
    auto spec = presets::megatron(2, 4);
    spec.zero = plan::zero_stage::optimizer;
    auto model = models::gpt(model_for(8));
    const auto pg = partition::apply_plan(model.ir(), plan::resolve(spec, model.ir()));
    const graph& g = pg.ir();
    int checked = 0;
    for (tensor_id w : g.parameters) {
        if (g.tensor(w).name != "blocks.0.mlp.fc.weight") continue;
        for (int d = 0; d < pg.world; ++d)
            for (const auto& gp : pg.devices[static_cast<std::size_t>(d)].gradients) {
                if (gp.logical != w) continue;
                INFO("device " << d << ", gradient piece " << gp.region.to_string());
                CHECK(gp.region.numel() * 2 == g.tensor(w).dims.numel());
                CHECK(train::update_region(pg, d, w, gp.region).numel() * 4 == gp.region.numel());
                ++checked;
            }
    }
    CHECK(checked == 8);
}

TEST_CASE("a plan resolves and applies the same to a graph with its backward pass", "[plan]") {
    const auto config = model_for(2);
    auto model = models::gpt(config);
    const auto spec = presets::megatron(2);
    const auto on_forward = plan::resolve(spec, model.ir());
    const auto forward_only = partition::apply_plan(model.ir(), on_forward);
    const graph training = std::move(model).training_graph();
    const auto on_training = plan::resolve(spec, training);
    CHECK(on_training.forward.size() == on_forward.forward.size());
    const auto from_training = partition::apply_plan(training, on_training);
    CHECK(from_training.transfers.size() == forward_only.transfers.size());
    CHECK(from_training.ir().nodes.size() == forward_only.ir().nodes.size());
}

TEST_CASE("megatron's cross-entropy is vocabulary-parallel: no device gathers the logits", "[plan][presets]") {
    const auto config = model_for(4);
    for (auto spec : {presets::megatron(4), presets::megatron(2, 2), presets::sequence_parallel(4)}) {
        INFO(spec.name);
        auto model = models::gpt(config);
        const auto pg = partition::apply_plan(model.ir(), plan::resolve(spec, model.ir()));
        const graph& g = pg.ir();
        // The loss is rebuilt from per-chunk log-sum-exps and target picks.
        int chunk_ops = 0, whole_losses = 0;
        for (const auto& n : g.nodes) {
            chunk_ops += n.op == &op_def_of<ops::ChunkLogsumexp>();
            whole_losses += n.op == &op_def_of<ops::CrossEntropy>();
        }
        CHECK(chunk_ops == 1);
        CHECK(whole_losses == 0);
        // Nothing of [batch, seq, vocab] size crosses devices, forward or backward: what
        // moves is [batch, seq, chunks] log-sum-exps and [batch, seq] partial picks.
        const std::int64_t logits = config.batch * config.seq * config.vocab;
        for (const auto& t : pg.transfers) {
            const tensor_desc& d = g.tensor(t.logical);
            INFO(t.describe() << " of '" << d.name << "' " << d.dims.to_string());
            CHECK(d.dims.numel() < logits);
        }
    }
}
