// The training half of the train_gpt example: builds the GPT, writes the corpus to a token
// file and reads it back (the way a real run reads its data), searches a plan for the
// in-process ranks on a calibrated profile of this host, trains in float32 and prints the
// plan and one progress line per step.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <vector>

#include <loom/loom.hpp>

#include "options.hpp"

using namespace loom;

namespace {

// One progress line per step, and a summary; returns false when the loss is not finite.
class progress {
public:
    progress(const models::gpt_config& config, std::int64_t steps, std::int64_t print_every)
        : tokens_per_step_(static_cast<double>(config.batch * config.seq)), steps_(steps), print_every_(print_every) {}

    bool record(std::int64_t s, const train::step_result& r) {
        total_seconds_ += r.seconds;
        if (s == 0) first_loss_ = r.loss;
        last_loss_ = r.loss;
        if (!std::isfinite(r.loss)) {
            std::fprintf(stderr, "step %lld: loss is %f; lower the learning rate (--lr)\n", static_cast<long long>(s), r.loss);
            return false;
        }
        if (s % print_every_ == 0 || s + 1 == steps_)
            std::printf("step %5lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tokens/s\n", static_cast<long long>(s),
                        r.loss, r.lr, r.grad_norm, tokens_per_step_ / r.seconds);
        return true;
    }
    void summary() const {
        std::printf("done: %lld steps in %.1f s (%.0f tokens/s), loss %.3f -> %.3f\n", static_cast<long long>(steps_),
                    total_seconds_, tokens_per_step_ * static_cast<double>(steps_) / total_seconds_, first_loss_,
                    last_loss_);
    }

private:
    double tokens_per_step_;
    std::int64_t steps_, print_every_;
    double total_seconds_ = 0, first_loss_ = 0, last_loss_ = 0;
};

train::input_feed feed_of(const train::batch& b, const std::vector<std::int32_t>& positions) {
    train::input_feed feed;
    feed.index["tokens"] = b.inputs;
    feed.index["targets"] = b.targets;
    feed.index["positions"] = positions;
    return feed;
}

void print_model(const models::gpt_config& config, const train::token_file& data) {
    std::printf("model: GPT, %lld layers, hidden %lld, %lld heads, seq %lld, batch %lld, vocab %lld\n",
                static_cast<long long>(config.layers), static_cast<long long>(config.hidden),
                static_cast<long long>(config.heads), static_cast<long long>(config.seq),
                static_cast<long long>(config.batch), static_cast<long long>(config.vocab));
    std::printf("data: %zu tokens, initial loss expected near ln(%lld) = %.3f\n", data.size(),
                static_cast<long long>(config.vocab), std::log(static_cast<double>(config.vocab)));
}

int train_one_device(const models::gpt_config& config, train::trainer_options options, std::int64_t steps,
                     const train::token_file& data, std::uint64_t data_seed, std::int64_t print_every) {
    auto model = models::gpt(config);
    train::trainer<float> trainer(std::move(model).training_graph(), options);
    print_model(config, data);
    std::printf("plan: one device, host backend, %u threads, GEMM: %s\n", host::thread_pool::global().size(),
                host::gemm_uses_cblas() ? "OpenBLAS" : "loom kernels");
    std::printf("%s", explain(trainer.compiled()).c_str());
    train::data_loader loader(data, {.batch = config.batch, .seq = config.seq, .seed = data_seed});
    const auto positions = models::gpt_positions(config);
    progress p(config, steps, print_every);
    for (std::int64_t s = 0; s < steps; ++s)
        if (!p.record(s, trainer.step(feed_of(loader.next(), positions)))) return 1;
    p.summary();
    return 0;
}

// Trains `plan` on its devices as in-process ranks.
int train_plan(const models::gpt_config& config, const graph& forward, const plan::plan_spec& plan,
               train::trainer_options options, std::int64_t steps, const train::token_file& data, std::uint64_t data_seed,
               std::int64_t print_every) {
    const partition::partitioned_graph programs = partition::apply_plan(forward, plan);
    train::data_loader loader(data, {.batch = config.batch, .seq = config.seq, .seed = data_seed});
    const auto positions = models::gpt_positions(config);
    progress p(config, steps, print_every);
    int status = 0;
    // Every rank reads the same batch (each takes its own part of it); rank 0 reports.
    std::vector<train::batch> batches(static_cast<std::size_t>(steps));
    for (auto& b : batches) b = loader.next();
    comm::run_ranks(programs.world, [&](comm::communicator& comm) {
        train::distributed_trainer<float> rank(programs, comm, options);
        for (std::int64_t s = 0; s < steps; ++s) {
            const train::step_result r = rank.step(feed_of(batches[static_cast<std::size_t>(s)], positions));
            if (comm.rank() == 0 && status == 0 && !p.record(s, r)) status = 1;
        }
    });
    if (status == 0) p.summary();
    return status;
}

// Calibrates the host as `devices` in-process ranks, searches the plan (TP, PP, DP,
// micro-batches, schedule, recompute, Coshard) for them, and trains with it.
int train_searched(const models::gpt_config& config, train::trainer_options options, std::int64_t steps,
                   const train::token_file& data, std::uint64_t data_seed, std::int64_t print_every, int devices) {
    auto model = models::gpt(config);
    const graph forward = model.ir();
    const graph training = std::move(model).training_graph();
    print_model(config, data);
    const search::cluster host_profile = search::calibrate_host(devices);
    std::printf("cluster: %s, %.1f GFLOP/s and %.1f GB/s per rank (measured)\n", host_profile.name.c_str(),
                host_profile.device.peak_flops_fp32 / 1e9, host_profile.device.memory_bandwidth / 1e9);
    search::search_options search_options;
    search_options.compute = search::precision::fp32;
    search_options.activation_bytes = 4;
    search_options.states = search::fp32_adam();
    search::cost_context ctx(search::profile_model(training), host_profile, search_options);
    const search::search_result found = search::branch_and_bound(ctx, search::search_space{});
    std::printf("%s", found.explain().c_str());
    if (!found.found) return 1;
    return train_plan(config, forward, search::to_plan(found.best), options, steps, data, data_seed, print_every);
}

// Trains the plan stored in a plan file.
int train_plan_file(const models::gpt_config& config, train::trainer_options options, std::int64_t steps,
                    const train::token_file& data, std::uint64_t data_seed, std::int64_t print_every,
                    const std::string& path) {
    const graph forward = models::gpt(config).ir();
    print_model(config, data);
    const plan::plan_spec plan = io::load_plan(path, forward);
    std::printf("plan: %s, %d devices (from %s)\n", plan.name.c_str(), plan.devices, path.c_str());
    return train_plan(config, forward, plan, options, steps, data, data_seed, print_every);
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
        if (!o.plan.empty()) return train_plan_file(config, options, o.steps, data, o.seed, o.print_every, o.plan);
        if (o.devices <= 1) return train_one_device(config, options, o.steps, data, o.seed, o.print_every);
        return train_searched(config, options, o.steps, data, o.seed, o.print_every, o.devices);
    } catch (const loom::error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
}
