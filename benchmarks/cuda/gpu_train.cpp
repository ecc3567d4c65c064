// GPT-2 124M training steps on one GPU: tokens per second and model FLOP utilisation, to
// set beside PyTorch eager and torch.compile (benchmarks/cuda/gpu_train_torch.py, run by the
// same script on the same GPU). Prints one JSON object; with --profile, then one more per op
// kind: the GPU time of one step's instructions, from timing events recorded before each.
//
//   gpu_train --precision bf16 --batch 16 --steps 20 [--profile]
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <loom/models/gpt.hpp>
#include <loom/train/cuda/step_profile.hpp>
#include <loom/train/cuda/trainer.hpp>

using namespace loom;

namespace {

// Dense bf16 tensor-core peak of the GPU, in TFLOP/s (datasheets, SXM parts).
double peak_tflops(const std::string& device_name) {
    if (device_name.find("H100") != std::string::npos || device_name.find("H200") != std::string::npos) return 989.0;
    if (device_name.find("A100") != std::string::npos) return 312.0;
    return 0.0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"GPT-2 training throughput on one GPU"};
    models::gpt_config c{.layers = 12, .hidden = 768, .heads = 12, .vocab = 50304, .seq = 1024, .batch = 16};
    int warmup = 5, steps = 20;
    std::string precision_name = "bf16";
    double peak = 0;
    app.add_option("--layers", c.layers);
    app.add_option("--hidden", c.hidden);
    app.add_option("--heads", c.heads);
    app.add_option("--vocab", c.vocab, "50304: GPT-2's 50257 padded to a multiple of 128, as nanoGPT does");
    app.add_option("--seq", c.seq);
    app.add_option("--batch", c.batch);
    app.add_option("--warmup", warmup);
    app.add_option("--steps", steps);
    app.add_option("--precision", precision_name)->check(CLI::IsMember({"f32", "bf16"}));
    app.add_option("--peak-tflops", peak, "the GPU's dense bf16 peak (default: from its name)");
    bool no_fuse = false, fuse_backward = false, profile = false;
    app.add_flag("--no-fuse", no_fuse, "one kernel per op: no GEMM epilogue fusion (to measure what it gains)");
    app.add_flag("--fuse-backward", fuse_backward,
                 "the backward's dGELU + bias-gradient epilogue too (off by default: slower on an H200)");
    app.add_flag("--profile", profile, "then time one step's instructions by op kind");
    CLI11_PARSE(app, argc, argv);

    const auto info = cuda::describe(0);
    if (peak <= 0) peak = peak_tflops(info.name);
    train::trainer_options options;
    options.schedule.peak = 6e-4;
    options.clip_norm = 1.0;
    const precision p = precision_name == "bf16" ? precision::bf16 : precision::f32;
    cuda::trainer t(models::gpt(c).training_graph(), options, p, 0, {.fuse = !no_fuse, .fuse_backward = fuse_backward});

    std::mt19937 rng(0);
    std::uniform_int_distribution<std::int32_t> token(0, static_cast<std::int32_t>(c.vocab - 1));
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(c.batch * c.seq)), targets(tokens.size());
    for (auto& x : tokens) x = token(rng);
    for (auto& x : targets) x = token(rng);
    const auto positions = models::gpt_positions(c);
    train::input_feed feed;
    feed.index["tokens"] = tokens;
    feed.index["targets"] = targets;
    feed.index["positions"] = positions;

    std::vector<double> seconds;
    double loss = 0;
    for (int s = 0; s < warmup + steps; ++s) {
        const auto r = t.step(feed);  // synchronised: it reads the loss back
        loss = r.loss;
        if (s >= warmup) seconds.push_back(r.seconds);
    }
    std::sort(seconds.begin(), seconds.end());
    const double median = seconds[seconds.size() / 2];
    const double tokens_per_step = static_cast<double>(c.batch * c.seq);
    // 6 N per token for the GEMMs plus causal attention, as the PyTorch side counts.
    const double flops_per_token = 6.0 * static_cast<double>(c.parameter_count()) +
                                   6.0 * static_cast<double>(c.layers * c.seq * c.hidden);
    const double tflops = flops_per_token * tokens_per_step / median / 1e12;
    std::printf(
        "{\"system\": \"loom\", \"device\": \"%s\", \"precision\": \"%s\", \"layers\": %lld, \"hidden\": %lld, "
        "\"heads\": %lld, \"vocab\": %lld, \"batch\": %lld, \"seq\": %lld, "
        "\"parameters\": %lld, \"median_step_seconds\": %.6f, \"tokens_per_second\": %.1f, "
        "\"model_tflops_per_second\": %.2f, \"mfu\": %.4f, \"device_bytes\": %zu, \"final_loss\": %.4f, "
        "\"fusion\": \"%s\"}\n",
        info.name.c_str(), precision_name.c_str(), static_cast<long long>(c.layers), static_cast<long long>(c.hidden),
        static_cast<long long>(c.heads), static_cast<long long>(c.vocab), static_cast<long long>(c.batch),
        static_cast<long long>(c.seq),
        static_cast<long long>(c.parameter_count()), median, tokens_per_step / median, tflops,
        peak > 0 ? tflops / peak : 0.0, t.device_bytes(), loss, t.fusion().description().c_str());
    if (profile) {
        const auto by_kind = cuda::profile_step(t, feed);
        std::vector<std::pair<std::string, search::kind_measurement>> sorted(by_kind.begin(), by_kind.end());
        std::sort(sorted.begin(), sorted.end(),
                  [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
        double total = 0;
        for (const auto& [kind, e] : sorted) total += e.seconds;
        for (const auto& [kind, e] : sorted)
            std::printf(
                "{\"profile\": \"loom %s\", \"hidden\": %lld, \"batch\": %lld, \"op\": \"%s\", \"count\": %d, "
                "\"ms\": %.3f, \"share\": %.3f, \"gflop\": %.3f, \"mb\": %.3f}\n",
                precision_name.c_str(), static_cast<long long>(c.hidden), static_cast<long long>(c.batch), kind.c_str(),
                e.instructions, e.seconds * 1e3, total > 0 ? e.seconds / total : 0.0, e.flops / 1e9, e.bytes / 1e6);
    }
    return 0;
}
