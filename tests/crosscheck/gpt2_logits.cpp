// The loom half of the GPT-2 interop check (tests/crosscheck/gpt2_interop.py): imports a
// GPT-2-layout safetensors file written by PyTorch into loom's GPT, computes the logits of
// the given tokens with loom's forward pass, and exports the imported weights back to the
// GPT-2 layout, for the script to compare with its own forward pass and its own file.
//
//   gpt2_logits --weights gpt2.safetensors --tokens tokens.safetensors --out logits.safetensors
//               --export roundtrip.safetensors [--f32] --layers 2 --hidden 32 --heads 4
//               --vocab 64 --seq 16
#include <CLI/CLI.hpp>

#include <cstdio>

#include <loom/io/gpt2_weights.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/models/gpt.hpp>
#include <loom/runtime/compile.hpp>
#include <loom/runtime/host/bound_storage.hpp>
#include <loom/runtime/host/executor.hpp>

using namespace loom;

namespace {

template <class T>
void run(models::gpt_config config, const std::string& weights, const std::string& tokens_file, const std::string& out,
         const std::string& exported) {
    const io::safetensors_file tokens_in(tokens_file);
    const auto tokens = tokens_in.read<std::int32_t>("tokens");
    const auto shape = tokens_in.info("tokens").shape;
    config.batch = shape.at(0);
    config.seq = shape.at(1);

    // The forward graph, compiled to keep the logits.
    const auto model = models::gpt(config);
    const graph& g = model.ir();
    const precision prec = std::is_same_v<T, float> ? precision::f32 : precision::f64;
    const program p = compile_program(g, {.prec = prec, .include_backward = false, .outputs = {model.logits}});
    host::executor<T> exec(p);
    host::bound_storage<T> storage(p);
    storage.bind_to(exec);
    const auto loom_weights = io::read_gpt2_weights(weights, config);
    for (tensor_id t : g.parameters) {
        const auto& d = g.tensor(t);
        if (!storage.has(t)) continue;
        auto dst = storage.real(t);
        const auto& src = loom_weights.at(d.name);
        for (std::size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<T>(src[i]);
    }
    const auto positions = models::gpt_positions(config);
    std::copy(tokens.begin(), tokens.end(), storage.index(model.tokens).begin());
    std::copy(positions.begin(), positions.end(), storage.index(model.positions).begin());
    auto targets = storage.index(model.targets);
    std::fill(targets.begin(), targets.end(), 0);
    exec.run(0);
    const auto logits = storage.real(model.logits);

    io::safetensors_writer w;
    w.add("logits", std::is_same_v<T, float> ? io::dtype::f32 : io::dtype::f64, {config.batch, config.seq, config.vocab},
          std::vector<T>(logits.begin(), logits.end()));
    w.write(out);
    // Weights back out in GPT-2's layout (positions: loom's seq rows).
    io::write_gpt2_weights(exported, config,
                           [&](const std::string& name) { return loom_weights.at(name); },
                           std::is_same_v<T, float> ? io::dtype::f32 : io::dtype::f64);
    std::printf("wrote %s (%zu logits) and %s\n", out.c_str(), logits.size(), exported.c_str());
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Import GPT-2 weights into loom's GPT, write its logits, export the weights back"};
    models::gpt_config config{.layers = 2, .hidden = 32, .heads = 4, .vocab = 64, .seq = 16, .batch = 1};
    std::string weights, tokens, out, exported;
    bool f32 = false;
    app.add_option("--weights", weights)->required();
    app.add_option("--tokens", tokens)->required();
    app.add_option("--out", out)->required();
    app.add_option("--export", exported)->required();
    app.add_flag("--f32", f32);
    app.add_option("--layers", config.layers);
    app.add_option("--hidden", config.hidden);
    app.add_option("--heads", config.heads);
    app.add_option("--vocab", config.vocab);
    CLI11_PARSE(app, argc, argv);
    try {
        if (f32)
            run<float>(config, weights, tokens, out, exported);
        else
            run<double>(config, weights, tokens, out, exported);
    } catch (const loom::error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
    return 0;
}
