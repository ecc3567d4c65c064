// The training half of the train_gpt example: builds the GPT, writes the corpus to a token
// file and reads it back (the way a real run reads its data), trains in float32 and prints
// the plan and one progress line per step.
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <loom/loom.hpp>

#include "options.hpp"

using namespace loom;

namespace {

int train_model(const models::gpt_config& config, train::trainer_options options, std::int64_t steps,
          const train::token_file& data, std::uint64_t data_seed, std::int64_t print_every) {
    auto model = models::gpt(config);
    train::trainer<float> trainer(std::move(model).training_graph(), options);
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

}  // namespace

int run_training(const train_gpt_options& o) {
    try {
        std::string data_path = o.data;
        if (data_path.empty()) {
            auto path = std::filesystem::temp_directory_path() / "loom_corpus.tok";
            auto tokens = train::byte_tokenizer{}.encode(train::make_corpus());
            train::write_token_file(path, tokens, 256);
            data_path = path.string();
        }
        train::token_file data(data_path);
        models::gpt_config config{.layers = o.layers, .hidden = o.hidden, .heads = o.heads,
                                  .vocab = static_cast<std::int64_t>(data.vocab_size()), .seq = o.seq, .batch = o.batch};
        train::trainer_options options;
        options.optimizer = train::adamw_options{.weight_decay = 0.1};
        options.schedule = {.peak = o.lr, .min_lr = o.lr / 10, .warmup_steps = std::min<std::int64_t>(20, o.steps / 10 + 1),
                            .total_steps = o.steps};
        options.clip_norm = o.clip;
        options.init_seed = o.seed;
        return train_model(config, options, o.steps, data, o.seed, o.print_every);
    } catch (const loom::error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
}
