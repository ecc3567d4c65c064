// Exports one GPT training step for an independent implementation to repeat: the initial
// weights, one batch, and loom's loss and every parameter gradient, as a safetensors file
// (tools/torch_crosscheck.py reads it and compares with PyTorch).
//
//   gpt_export --out step.safetensors [--f32] [--layers 2] [--hidden 32] [--heads 4]
//              [--vocab 64] [--seq 16] [--batch 3] [--untied] [--seed 5]
#include <CLI/CLI.hpp>

#include <cstdio>

#include <loom/io/safetensors.hpp>
#include <loom/models/gpt.hpp>
#include <loom/train/trainer.hpp>

using namespace loom;

namespace {

template <class T>
void export_step(const models::gpt_config& config, std::uint64_t seed, const std::string& out) {
    auto model = models::gpt(config);
    train::trainer<T> trainer(std::move(model).training_graph(), {.init_seed = seed});
    const graph& g = trainer.ir();

    // A batch drawn from the same counter-based generator as the weights.
    const auto n = static_cast<std::size_t>(config.batch * config.seq);
    std::vector<std::int32_t> tokens(n), targets(n);
    for (std::size_t i = 0; i < n; ++i) {
        tokens[i] = static_cast<std::int32_t>(splitmix64(seed * 7 + i) % static_cast<std::uint64_t>(config.vocab));
        targets[i] = static_cast<std::int32_t>(splitmix64(seed * 13 + i) % static_cast<std::uint64_t>(config.vocab));
    }
    const auto positions = models::gpt_positions(config);
    train::input_feed feed;
    feed.index["tokens"] = tokens;
    feed.index["targets"] = targets;
    feed.index["positions"] = positions;
    const double loss = trainer.evaluate(feed);

    const io::dtype real = std::is_same_v<T, float> ? io::dtype::f32 : io::dtype::f64;
    io::safetensors_writer w;
    auto dims = [](const shape& s) {
        std::vector<std::int64_t> d;
        for (const auto& a : s) d.push_back(a.extent);
        return d;
    };
    for (tensor_id p : g.parameters) {
        const auto& d = g.tensor(p);
        auto values = trainer.parameter(d.name);
        auto grads = trainer.gradient(d.name);
        w.add("param/" + d.name, real, dims(d.dims), std::vector<T>(values.begin(), values.end()));
        w.add("grad/" + d.name, real, dims(d.dims), std::vector<T>(grads.begin(), grads.end()));
    }
    const std::vector<std::int64_t> bs{config.batch, config.seq};
    w.add("input/tokens", io::dtype::i32, bs, tokens);
    w.add("input/targets", io::dtype::i32, bs, targets);
    w.add("input/positions", io::dtype::i32, bs, positions);
    w.add("loss", real, {1}, std::vector<T>{static_cast<T>(loss)});
    w.metadata("layers", std::to_string(config.layers));
    w.metadata("hidden", std::to_string(config.hidden));
    w.metadata("heads", std::to_string(config.heads));
    w.metadata("vocab", std::to_string(config.vocab));
    w.metadata("seq", std::to_string(config.seq));
    w.metadata("batch", std::to_string(config.batch));
    w.metadata("tie_embeddings", config.tie_embeddings ? "1" : "0");
    w.metadata("layer_norm_eps", std::to_string(config.layer_norm_eps));
    w.metadata("precision", std::is_same_v<T, float> ? "f32" : "f64");
    w.write(out);
    std::printf("wrote %s: %zu parameters, loss %.17g\n", out.c_str(), g.parameters.size(), loss);
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Export one GPT step (weights, batch, loss, gradients) for cross-checking"};
    models::gpt_config config{.layers = 2, .hidden = 32, .heads = 4, .vocab = 64, .seq = 16, .batch = 3};
    std::string out;
    bool f32 = false, untied = false;
    std::uint64_t seed = 5;
    app.add_option("--out", out, "safetensors file to write")->required();
    app.add_flag("--f32", f32, "compute in float32 (default float64)");
    app.add_option("--layers", config.layers);
    app.add_option("--hidden", config.hidden);
    app.add_option("--heads", config.heads);
    app.add_option("--vocab", config.vocab);
    app.add_option("--seq", config.seq);
    app.add_option("--batch", config.batch);
    app.add_flag("--untied", untied, "separate output head instead of tied embeddings");
    app.add_option("--seed", seed);
    CLI11_PARSE(app, argc, argv);
    config.tie_embeddings = !untied;
    config.init_std = 0.2;  // larger than GPT-2's so that every path carries a visible gradient
    try {
        if (f32)
            export_step<float>(config, seed, out);
        else
            export_step<double>(config, seed, out);
    } catch (const loom::error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
    return 0;
}
