// GPT training on the GPU against the host backend: the same graph, seeds and data give the
// float64 host trainer's loss curve (float on the GPU: within float tolerance), runs are
// bit-identical, and a program with an op the GPU lacks is refused when built.
#include <cmath>
#include <vector>

#include <loom/autograd/autograd.hpp>
#include <loom/models/gpt.hpp>
#include <loom/ops/reduce.hpp>
#include <loom/ops/relu.hpp>
#include <loom/train/cuda/trainer.hpp>
#include <loom/train/trainer.hpp>

#include "support.hpp"

using namespace loom;

namespace {

// Head dim 64, as GPT-2's; a vocabulary and sequence that are multiples of nothing useful.
models::gpt_config small_gpt() {
    return {.layers = 2, .hidden = 128, .heads = 2, .vocab = 97, .seq = 67, .batch = 3};
}

struct batch {
    std::vector<std::int32_t> tokens, targets, positions;
    train::input_feed feed() const {
        train::input_feed f;
        f.index["tokens"] = tokens;
        f.index["targets"] = targets;
        f.index["positions"] = positions;
        return f;
    }
};

batch make_batch(const models::gpt_config& c, int step) {
    batch b;
    const auto n = static_cast<std::size_t>(c.batch * c.seq);
    for (std::size_t i = 0; i < n; ++i) {
        b.tokens.push_back(static_cast<std::int32_t>((i * 7 + 3 + static_cast<std::size_t>(step) * 5) % 97));
        b.targets.push_back(static_cast<std::int32_t>((i * 7 + 10 + static_cast<std::size_t>(step) * 5) % 97));
    }
    b.positions = models::gpt_positions(c);
    return b;
}

train::trainer_options options() {
    train::trainer_options o;
    o.schedule.peak = 3e-3;
    o.clip_norm = 1.0;
    o.init_seed = 7;
    return o;
}

}  // namespace

TEST_CASE("GPT on the GPU follows the host float64 loss curve", "[cuda][train]") {
    const auto c = small_gpt();
    cuda::trainer gpu(models::gpt(c).training_graph(), options());
    train::trainer<double> host(models::gpt(c).training_graph(), options());
    for (int step = 0; step < 25; ++step) {
        const auto b = make_batch(c, step % 4);
        const auto g = gpu.step(b.feed());
        const auto h = host.step(b.feed());
        INFO("step " << step << ": GPU loss " << g.loss << ", host float64 loss " << h.loss);
        // float against float64 through 25 AdamW steps: the relative error stays near 1e-5 per
        // step and grows slowly; 1e-3 leaves room without hiding a wrong kernel (a wrong
        // gradient changes the loss in the second decimal within a few steps).
        CHECK(std::fabs(g.loss - h.loss) <= 1e-3 * h.loss);
        CHECK(std::fabs(g.grad_norm - h.grad_norm) <= 2e-3 * h.grad_norm);
    }
}

TEST_CASE("GPT in bf16 mixed precision follows the host float64 loss curve", "[cuda][train][bf16]") {
    const auto c = small_gpt();
    cuda::trainer gpu(models::gpt(c).training_graph(), options(), precision::bf16);
    train::trainer<double> host(models::gpt(c).training_graph(), options());
    double first = 0, last_gpu = 0, last_host = 0;
    for (int step = 0; step < 40; ++step) {
        const auto b = make_batch(c, step % 4);
        const auto g = gpu.step(b.feed());
        const auto h = host.step(b.feed());
        if (step == 0) first = h.loss;
        last_gpu = g.loss;
        last_host = h.loss;
        INFO("step " << step << ": GPU bf16 loss " << g.loss << ", host float64 loss " << h.loss);
        // bf16 keeps 8 significant bits: activations and gradients carry about 0.4% relative
        // error each, which the loss averages; float master weights keep the runs together.
        CHECK(std::fabs(g.loss - h.loss) <= 0.02 * h.loss + 0.01);
    }
    CHECK(last_host < 0.5 * first);  // the curve being followed does fall
    CHECK(last_gpu < 0.5 * first);
}

TEST_CASE("GPU training is bit-identical run to run", "[cuda][train]") {
    const auto c = small_gpt();
    auto run = [&](precision p) {
        cuda::trainer t(models::gpt(c).training_graph(), options(), p);
        std::vector<double> losses;
        for (int step = 0; step < 6; ++step) losses.push_back(t.step(make_batch(c, step).feed()).loss);
        return std::make_pair(losses, t.parameter("blocks.1.mlp.fc.weight"));
    };
    for (precision p : {precision::f32, precision::bf16}) {
        INFO("precision " << to_string(p));
        const auto a = run(p), b = run(p);
        CHECK(a.first == b.first);
        CHECK(a.second == b.second);
    }
}

TEST_CASE("the GPU trainer refuses what it cannot run, naming it", "[cuda][train]") {
    graph_builder b;
    auto x = b.input("x", {{Dim::Batch::id, 4}, {Dim::Hidden::id, 8}});
    auto w = b.parameter("w", {{Dim::Batch::id, 4}, {Dim::Hidden::id, 8}}, parameter_init::normal(0.1));
    b.set_loss(ops::sum(ops::relu(x + w)));
    build_backward(b);
    CHECK_THROWS_WITH(cuda::trainer(std::move(b).take(), options()), Catch::Contains("has no CUDA kernel"));

    auto sgd = options();
    sgd.optimizer = train::sgd_options{};
    CHECK_THROWS_WITH(cuda::trainer(models::gpt(small_gpt()).training_graph(), sgd), Catch::Contains("AdamW only"));
}
