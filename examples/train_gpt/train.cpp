// The training half of the train_gpt example: builds the GPT, writes the corpus to a token
// file and reads it back (the way a real run reads its data), searches a plan for the
// in-process ranks on a calibrated profile of this host, trains in float32 and prints the
// plan and progress lines at a readable interval. With --checkpoint it saves sharded checkpoints and
// --resume continues from the newest complete one, under whatever plan this run uses.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include <loom/loom.hpp>

#include "options.hpp"

using namespace loom;

namespace {

// Progress lines and a summary; returns false when the loss is not finite. With
// print_every > 0, a line every that many steps; with 0, one at the first step, then one
// whenever `interval` seconds have passed, and one at the last step. Each line says the time
// so far and an estimate of the time left.
class progress {
public:
    progress(const models::gpt_config& config, std::int64_t steps, std::int64_t print_every, bool exact,
             double interval = 5.0)
        : tokens_per_step_(static_cast<double>(config.batch * config.seq)), steps_(steps), print_every_(print_every),
          exact_(exact), interval_(interval) {}

    bool record(std::int64_t s, const train::step_result& r) {
        total_seconds_ += r.seconds;
        ++recorded_;
        if (recorded_ == 1) first_loss_ = r.loss;
        last_loss_ = r.loss;
        if (!std::isfinite(r.loss)) {
            std::fprintf(stderr, "step %lld: loss is %f; lower the learning rate (--lr)\n", static_cast<long long>(s), r.loss);
            return false;
        }
        const bool due = print_every_ > 0 ? s % print_every_ == 0
                                          : recorded_ == 1 || total_seconds_ - last_printed_ >= interval_;
        if (due || s + 1 == steps_) {
            last_printed_ = total_seconds_;
            const double left = total_seconds_ / static_cast<double>(recorded_) * static_cast<double>(steps_ - s - 1);
            std::printf(exact_ ? "step %5lld | loss %.17g | lr %.2e | grad norm %.3f | %.0f tokens/s | %.1f s, ~%.0f s left\n"
                               : "step %5lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tokens/s | %.1f s, ~%.0f s left\n",
                        static_cast<long long>(s), r.loss, r.lr, r.grad_norm, tokens_per_step_ / r.seconds, total_seconds_,
                        left);
            std::fflush(stdout);
        }
        return true;
    }
    void summary() const {
        if (recorded_ == 0) return;
        std::printf("done: %lld steps in %.1f s (%.0f tokens/s), loss %.3f -> %.3f\n", static_cast<long long>(recorded_),
                    total_seconds_, tokens_per_step_ * static_cast<double>(recorded_) / total_seconds_, first_loss_,
                    last_loss_);
    }

private:
    double tokens_per_step_;
    std::int64_t steps_, print_every_;
    bool exact_;
    double interval_;
    std::int64_t recorded_ = 0;
    double total_seconds_ = 0, first_loss_ = 0, last_loss_ = 0, last_printed_ = 0;
};

train::input_feed feed_of(const train::batch& b, const std::vector<std::int32_t>& positions) {
    train::input_feed feed;
    feed.index["tokens"] = b.inputs;
    feed.index["targets"] = b.targets;
    feed.index["positions"] = positions;
    return feed;
}

// The training tokens, from loom's token file or an llm.c shard, shared by the loaders.
struct token_data {
    std::shared_ptr<const std::vector<std::int32_t>> tokens;
    std::int64_t vocab = 0;
    std::size_t size() const { return tokens->size(); }
};

// What --checkpoint, --save-every, --resume and --stop-after ask for.
struct durability {
    std::string directory;
    std::int64_t save_every = 0;
    bool resume = false;
    std::int64_t stop_after = 0;

    // The checkpoint to resume from, if --resume and one exists.
    std::optional<std::filesystem::path> resume_from() const {
        if (!resume) return std::nullopt;
        auto latest = train::latest_checkpoint(directory);
        if (!latest) std::printf("resume: no complete checkpoint in %s; starting from step 0\n", directory.c_str());
        return latest;
    }
    bool save_after(std::int64_t steps_done) const { return save_every > 0 && steps_done % save_every == 0; }
    std::int64_t last_step(std::int64_t steps) const { return stop_after > 0 ? std::min(steps, stop_after) : steps; }
};

void print_resumed(const train::checkpoint_info& info) {
    std::printf("resumed from %s: step %lld, %llu bytes read by rank 0%s\n", info.path.string().c_str(),
                static_cast<long long>(info.step), static_cast<unsigned long long>(info.bytes),
                info.data ? ", data loader position restored" : "");
}
void print_saved(const train::checkpoint_info& info) {
    std::printf("saved %s: step %lld, %llu bytes written by rank 0\n", info.path.string().c_str(),
                static_cast<long long>(info.step), static_cast<unsigned long long>(info.bytes));
}

void print_model(const models::gpt_config& config, const token_data& data) {
    std::printf("model: GPT, %lld layers, hidden %lld, %lld heads, seq %lld, batch %lld, vocab %lld\n",
                static_cast<long long>(config.layers), static_cast<long long>(config.hidden),
                static_cast<long long>(config.heads), static_cast<long long>(config.seq),
                static_cast<long long>(config.batch), static_cast<long long>(config.vocab));
    std::printf("data: %zu tokens, initial loss expected near ln(%lld) = %.3f\n", data.size(),
                static_cast<long long>(config.vocab), std::log(static_cast<double>(config.vocab)));
}

int train_one_device(const models::gpt_config& config, train::trainer_options options, std::int64_t steps,
                     const token_data& data, std::uint64_t data_seed, std::int64_t print_every, const durability& d,
                     bool exact) {
    auto model = models::gpt(config);
    train::trainer<float> trainer(std::move(model).training_graph(), options);
    print_model(config, data);
    std::printf("plan: one device, host backend, %u threads, GEMM: %s\n", host::thread_pool::global().size(),
                host::gemm_uses_cblas() ? "OpenBLAS" : "loom kernels");
    std::printf("%s", explain(trainer.compiled()).c_str());
    // README.md ("Checkpoints") quotes the lines from here to the end of the loop verbatim.
    train::data_loader loader(data.tokens, {.batch = config.batch, .seq = config.seq, .seed = data_seed});
    if (const auto from = d.resume_from()) {
        const auto info = train::load_checkpoint(trainer, *from);
        if (info.data) loader.restore(*info.data);
        print_resumed(info);
    }
    const auto positions = models::gpt_positions(config);
    progress p(config, steps, print_every, exact);
    for (std::int64_t s = trainer.steps(); s < d.last_step(steps); ++s) {
        if (!p.record(s, trainer.step(feed_of(loader.next(), positions)))) return 1;
        if (d.save_after(s + 1)) {
            const auto state = loader.state();
            print_saved(train::save_checkpoint(trainer, d.directory, &state));
        }
    }
    p.summary();
    return 0;
}

// Trains `plan` on its devices as in-process ranks, saving and resuming checkpoints as `d` says.
int train_plan(const models::gpt_config& config, const graph& forward, const plan::plan_spec& chosen,
               train::trainer_options options, std::int64_t steps, const token_data& data, std::uint64_t data_seed,
               std::int64_t print_every, const durability& d, bool exact) {
    const partition::partitioned_graph plan = partition::apply_plan(forward, chosen);
    // The checkpoint says where the data stream stood; every rank loads its own pieces of
    // the state, whatever plan saved them.
    train::data_loader loader(data.tokens, {.batch = config.batch, .seq = config.seq, .seed = data_seed});
    const auto from = d.resume_from();
    std::int64_t first = 0;
    if (from) {
        const auto manifest = io::checkpoint_manifest::read(*from);
        first = manifest.step;
        if (!manifest.data_loader.empty())
            loader.restore({manifest.data_loader.at("seed"), manifest.data_loader.at("epoch"),
                            manifest.data_loader.at("cursor"), manifest.data_loader.at("window_count"),
                            manifest.data_loader.at("shuffle")});
    }
    const auto positions = models::gpt_positions(config);
    progress p(config, steps, print_every, exact);
    int status = 0;
    // Every rank reads the same batch (each takes its own part of it); rank 0 reports.
    const std::int64_t last = std::max(first, d.last_step(steps));
    std::vector<train::batch> batches(static_cast<std::size_t>(last - first));
    std::vector<train::data_loader_state> after(batches.size());
    for (std::size_t i = 0; i < batches.size(); ++i) {
        batches[i] = loader.next();
        after[i] = loader.state();
    }
    comm::run_ranks(plan.world, [&](comm::communicator& comm) {
        train::distributed_trainer<float> rank(plan, comm, options);
        if (from) {
            const auto info = train::load_checkpoint(rank, *from);
            if (comm.rank() == 0) print_resumed(info);
        }
        for (std::int64_t s = first; s < last; ++s) {
            const auto i = static_cast<std::size_t>(s - first);
            const train::step_result r = rank.step(feed_of(batches[i], positions));
            if (comm.rank() == 0 && status == 0 && !p.record(s, r)) status = 1;
            if (d.save_after(s + 1)) {
                const auto info = train::save_checkpoint(rank, d.directory, &after[i]);
                if (comm.rank() == 0) print_saved(info);
            }
        }
    });
    if (status == 0) p.summary();
    return status;
}

// Calibrates the host as `devices` in-process ranks (its GEMM and copy speed, the link
// between ranks, and the rate of every op kind on all ranks at once and on one alone), searches nnScaler's space for them (TP, stages, DP, micro-batches,
// every order, ZeRO), pricing each plan's own programs, and trains with the best.
int train_searched(const models::gpt_config& config, train::trainer_options options, std::int64_t steps,
                   const token_data& data, std::uint64_t data_seed, std::int64_t print_every, int devices,
                   const durability& d, bool exact) {
    const graph forward = models::gpt(config).ir();
    print_model(config, data);
    const search::cluster host_profile = search::calibrate_host(devices);
    search::plan_search_options search_options;
    search_options.price = search::host_price_options(devices);
    std::printf("cluster: %s, %.1f GFLOP/s and %.1f GB/s per rank, %.0f us per message, %zu op kinds timed%s\n",
                host_profile.name.c_str(), host_profile.device.peak_flops_f32 / 1e9,
                host_profile.device.memory_bandwidth / 1e9, host_profile.topo.intra_node.latency * 1e6,
                search_options.price.rates.size(), devices > 1 ? " on all ranks at once and on one alone" : "");
    const plan::plan_spec space = plan::spaces::nnscaler(devices);
    std::printf("space: %s\n", space.name.c_str());
    const search::plan_search_result found = search::search_plan(forward, space, host_profile, search_options);
    std::printf("%s", found.explain().c_str());
    return train_plan(config, forward, found.plan, options, steps, data, data_seed, print_every, d, exact);
}

// Trains the plan stored in a plan file.
int train_plan_file(const models::gpt_config& config, train::trainer_options options, std::int64_t steps,
                    const token_data& data, std::uint64_t data_seed, std::int64_t print_every, const std::string& path,
                    const durability& d, bool exact) {
    const graph forward = models::gpt(config).ir();
    print_model(config, data);
    const plan::plan_spec plan = io::load_plan(path, forward);
    std::printf("plan: %s, %d devices (from %s)\n", plan.name.c_str(), plan.devices, path.c_str());
    return train_plan(config, forward, plan, options, steps, data, data_seed, print_every, d, exact);
}

}  // namespace

int run_training(const train_gpt_options& o) {
    try {
        token_data data;
        if (o.data_format == "llmc") {
            if (o.data.empty()) throw usage_error("--data-format llmc needs --data FILE.bin (an llm.c token shard)");
            auto shard = io::read_llmc_tokens(o.data);
            data.vocab = shard.vocab_bound;
            data.tokens = std::make_shared<const std::vector<std::int32_t>>(std::move(shard.tokens));
        } else {
            std::string data_path = o.data;
            if (data_path.empty()) {
                auto path = std::filesystem::temp_directory_path() / "loom_corpus.tok";
                auto tokens = train::byte_tokenizer{}.encode(train::make_corpus());
                train::write_token_file(path, tokens, 256);
                data_path = path.string();
            }
            train::token_file file(data_path);
            data.vocab = static_cast<std::int64_t>(file.vocab_size());
            data.tokens = file.shared_tokens();
        }
        models::gpt_config config{.layers = o.layers, .hidden = o.hidden, .heads = o.heads, .vocab = data.vocab,
                                  .seq = o.seq, .batch = o.batch, .dropout = o.dropout};
        train::trainer_options options;
        options.optimizer = train::adamw_options{.weight_decay = 0.1};
        options.schedule = {.peak = o.lr, .min_lr = o.lr / 10, .warmup_steps = std::min<std::int64_t>(20, o.steps / 10 + 1),
                            .total_steps = o.steps};
        options.clip_norm = o.clip;
        options.init_seed = o.seed;
        const durability d{o.checkpoint, o.save_every, o.resume, o.stop_after};
        if (!o.plan.empty()) return train_plan_file(config, options, o.steps, data, o.seed, o.print_every, o.plan, d, o.exact);
        if (o.devices <= 1) return train_one_device(config, options, o.steps, data, o.seed, o.print_every, d, o.exact);
        return train_searched(config, options, o.steps, data, o.seed, o.print_every, o.devices, d, o.exact);
    } catch (const loom::error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
}
