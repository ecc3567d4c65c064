// Trains a small GPT on loom's own text corpus on one device (host backend) and prints a
// progress line per step. The corpus is written to a token file first and read back, the
// way a real run reads its data.
//
//   train_gpt [--steps 300] [--layers 4] [--hidden 128] [--heads 4] [--seq 64] [--batch 16]
//             [--lr 3e-3] [--f64] [--data corpus.tok]
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include <loom/loom.hpp>

using namespace loom;

template <class T>
int run(const models::gpt_config& config, train::trainer_options options, std::int64_t steps,
        const train::token_file& data, std::uint64_t data_seed, std::int64_t print_every) {
    auto model = models::gpt(config);
    train::trainer<T> trainer(std::move(model).training_graph(), options);
    std::printf("model: GPT, %lld layers, hidden %lld, %lld heads, seq %lld, batch %lld, vocab %lld\n",
                static_cast<long long>(config.layers), static_cast<long long>(config.hidden),
                static_cast<long long>(config.heads), static_cast<long long>(config.seq),
                static_cast<long long>(config.batch), static_cast<long long>(config.vocab));
    std::printf("plan: one device, host backend, %u threads, GEMM: %s\n", host::thread_pool::global().size(),
                host::gemm_uses_cblas() ? "OpenBLAS" : "loom kernels");
    std::printf("%s", explain(trainer.compiled()).c_str());
    std::printf("data: %zu tokens, initial loss expected near ln(%lld) = %.3f\n", data.size(),
                static_cast<long long>(config.vocab), std::log(static_cast<double>(config.vocab)));

    train::data_loader loader(data, {.batch = config.batch, .seq = config.seq, .seed = data_seed});
    const auto positions = models::gpt_positions(config);
    const double tokens_per_step = static_cast<double>(config.batch * config.seq);
    double total_seconds = 0, first_loss = 0, last_loss = 0;
    for (std::int64_t s = 0; s < steps; ++s) {
        train::batch b = loader.next();
        train::input_feed feed;
        feed.index["tokens"] = b.inputs;
        feed.index["targets"] = b.targets;
        feed.index["positions"] = positions;
        auto r = trainer.step(feed);
        total_seconds += r.seconds;
        if (s == 0) first_loss = r.loss;
        last_loss = r.loss;
        if (!std::isfinite(r.loss)) {
            std::fprintf(stderr, "step %lld: loss is %f; lower the learning rate (--lr)\n", static_cast<long long>(s), r.loss);
            return 1;
        }
        if (s % print_every == 0 || s + 1 == steps)
            std::printf("step %5lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tokens/s\n",
                        static_cast<long long>(s), r.loss, r.lr, r.grad_norm, tokens_per_step / r.seconds);
    }
    std::printf("done: %lld steps in %.1f s (%.0f tokens/s), loss %.3f -> %.3f\n", static_cast<long long>(steps),
                total_seconds, tokens_per_step * static_cast<double>(steps) / total_seconds, first_loss, last_loss);
    return 0;
}

int main(int argc, char** argv) {
    CLI::App app{"Train a small GPT on loom's corpus on the host backend"};
    models::gpt_config config{.layers = 4, .hidden = 128, .heads = 4, .vocab = 256, .seq = 64, .batch = 16};
    std::int64_t steps = 300, print_every = 1;
    double lr = 3e-3, clip = 1.0;
    bool f64 = false;
    std::uint64_t seed = 1234;
    std::string data_path;
    app.add_option("--steps", steps, "training steps")->check(CLI::PositiveNumber);
    app.add_option("--layers", config.layers, "transformer blocks")->check(CLI::PositiveNumber);
    app.add_option("--hidden", config.hidden, "hidden size")->check(CLI::PositiveNumber);
    app.add_option("--heads", config.heads, "attention heads")->check(CLI::PositiveNumber);
    app.add_option("--seq", config.seq, "sequence length")->check(CLI::PositiveNumber);
    app.add_option("--batch", config.batch, "sequences per step")->check(CLI::PositiveNumber);
    app.add_option("--lr", lr, "peak learning rate (AdamW, warm-up then cosine decay)");
    app.add_option("--clip", clip, "global gradient-norm clip (0: off)");
    app.add_option("--seed", seed, "initialisation and data seed");
    app.add_option("--print-every", print_every, "print one progress line every N steps")->check(CLI::PositiveNumber);
    app.add_flag("--f64", f64, "compute in float64 instead of float32");
    app.add_option("--data", data_path, "token file to train on (default: loom's corpus, written to a temp file)");
    CLI11_PARSE(app, argc, argv);

    try {
        if (data_path.empty()) {
            auto path = std::filesystem::temp_directory_path() / "loom_corpus.tok";
            auto tokens = train::byte_tokenizer{}.encode(train::make_corpus());
            train::write_token_file(path, tokens, 256);
            data_path = path.string();
        }
        train::token_file data(data_path);
        config.vocab = data.vocab_size();
        train::trainer_options options;
        options.optimizer = train::adamw_options{.weight_decay = 0.1};
        options.schedule = {.peak = lr, .min_lr = lr / 10, .warmup_steps = std::min<std::int64_t>(20, steps / 10 + 1),
                            .total_steps = steps};
        options.clip_norm = clip;
        options.init_seed = seed;
        return f64 ? run<double>(config, options, steps, data, seed, print_every)
                   : run<float>(config, options, steps, data, seed, print_every);
    } catch (const loom::error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
}
