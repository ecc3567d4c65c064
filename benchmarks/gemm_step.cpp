// Times loom::host::gemm on the GEMMs of one GPT training step, in the three forms the step
// uses (the linear layers' forward Y = X W^T, input gradient dX = dY W, weight gradient
// dW = dY^T X), against the measured FMA peak of the pool's threads. The same shapes in
// PyTorch: benchmarks/gemm_step_torch.py; the previous kernel side by side:
// benchmarks/gemm_step_compare.sh, which builds this file against an older gemm.hpp.
//
//   gemm_step [--tokens T] [--hidden H] [--vocab V] [--rounds N] [--repeats N] [--label L]
//             [--out PATH]
//
// Defaults: GPT-2 small at 4 sequences of 256 tokens (T = 1024, H = 768, V = 50304). Shapes
// (out x in): H x H (q, k, v, attention projection), 4H x H (MLP up), H x 4H (MLP down),
// V x H (logits). Each shape and form: `rounds` rounds of a warm-up call and `repeats`
// timed calls; the median of all timed calls counts. LOOM_NUM_THREADS sets the threads.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "loom/runtime/host/fma_peak.hpp"
#include "loom/runtime/host/gemm.hpp"
#include "loom/runtime/host/thread_pool.hpp"
#include "support/machine.hpp"
#include "support/record.hpp"

namespace {

using loom::host::transpose;

struct options {
    std::int64_t tokens = 1024, hidden = 768, vocab = 50304;
    int rounds = 3, repeats = 5;
    std::string label = "loom";
    std::string out = "benchmarks/results/gemm_step.json";
};

double median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    const std::size_t middle = values.size() / 2;
    return values.size() % 2 == 1 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

}  // namespace

int main(int argc, char** argv) {
    options opt;
    CLI::App app{"Time loom's GEMM on one GPT training step's shapes against the FMA peak"};
    app.add_option("--tokens", opt.tokens, "tokens per step (the GEMMs' M)")->check(CLI::PositiveNumber);
    app.add_option("--hidden", opt.hidden, "hidden size")->check(CLI::PositiveNumber);
    app.add_option("--vocab", opt.vocab, "vocabulary (the logits' width)")->check(CLI::PositiveNumber);
    app.add_option("--rounds", opt.rounds, "rounds of a warm-up call and the timed calls")->check(CLI::PositiveNumber);
    app.add_option("--repeats", opt.repeats, "timed calls per round")->check(CLI::PositiveNumber);
    app.add_option("--label", opt.label, "name of this build in the record");
    app.add_option("--out", opt.out, "the JSON record");
    CLI11_PARSE(app, argc, argv);
    const std::int64_t t = opt.tokens, h = opt.hidden;
    struct layer {
        const char* name;
        std::int64_t out, in;
    };
    const layer layers[] = {{"attention (H x H)", h, h},
                            {"mlp up (4H x H)", 4 * h, h},
                            {"mlp down (H x 4H)", h, 4 * h},
                            {"logits (V x H)", opt.vocab, h}};
    std::int64_t widest = 0;
    for (const layer& l : layers) widest = std::max({widest, l.out, l.in});
    std::vector<float> x(static_cast<std::size_t>(t * widest)), dy(x.size()), y(x.size());
    std::vector<float> w(static_cast<std::size_t>(std::max(opt.vocab, 4 * h) * h));
    std::vector<float> dw(w.size());
    std::mt19937 generator(7);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (float& v : x) v = uniform(generator);
    for (float& v : dy) v = uniform(generator);
    for (float& v : w) v = uniform(generator);

    const double peak = loom::host::measure_fma_peak_flops();
    nlohmann::json report;
    report["benchmark"] = "gemm_step";
    report["label"] = opt.label;
    report["date_utc"] = loom::bench::utc_now();
    report["git_revision"] = loom::bench::git_revision();
    report["machine"] = {{"cpu_model", loom::bench::cpu_model()},
                         {"logical_cores", std::thread::hardware_concurrency()},
                         {"load_average_at_start", loom::bench::load_average()}};
    report["threads"] = loom::host::thread_pool::global().size();
    report["gemm"] = loom::host::gemm_uses_cblas() ? "OpenBLAS" : "loom kernels";
    report["fma_peak_gflops"] = peak / 1e9;
    report["method"] = {{"rounds", opt.rounds},
                        {"repeats_per_round", opt.repeats},
                        {"statistic", "median seconds over all timed calls; GFLOP/s = 2mnk / median"}};
    report["results"] = nlohmann::json::array();
    std::printf("gemm_step (%s): %u threads, FMA peak %.1f GFLOP/s, tokens %lld\n", opt.label.c_str(),
                loom::host::thread_pool::global().size(), peak / 1e9, static_cast<long long>(t));

    double all_flops = 0, all_seconds = 0;
    for (const layer& l : layers) {
        for (const char* form : {"forward", "grad_input", "grad_weight"}) {
            const std::string kind = form;
            std::int64_t m = 0, n = 0, k = 0;
            const auto call = [&] {
                if (kind == "forward") {  // y [t, out] = x [t, in] w [out, in]^T
                    m = t, n = l.out, k = l.in;
                    loom::host::gemm<float>(transpose::no, transpose::yes, m, n, k, 1.0f, x.data(), k, w.data(), k, 0.0f,
                                            y.data(), n);
                } else if (kind == "grad_input") {  // dx [t, in] = dy [t, out] w [out, in]
                    m = t, n = l.in, k = l.out;
                    loom::host::gemm<float>(transpose::no, transpose::no, m, n, k, 1.0f, dy.data(), k, w.data(), n, 0.0f,
                                            y.data(), n);
                } else {  // dw [out, in] = dy [t, out]^T x [t, in]
                    m = l.out, n = l.in, k = t;
                    loom::host::gemm<float>(transpose::yes, transpose::no, m, n, k, 1.0f, dy.data(), m, x.data(), n, 0.0f,
                                            dw.data(), n);
                }
            };
            std::vector<double> times;
            for (int round = 0; round < opt.rounds; ++round) {
                call();
                for (int r = 0; r < opt.repeats; ++r) {
                    const auto start = std::chrono::steady_clock::now();
                    call();
                    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
                }
            }
            const double seconds = median(times);
            const double flops = 2.0 * double(m) * double(n) * double(k);
            all_flops += flops;
            all_seconds += seconds;
            std::printf("%-20s %-12s m %6lld n %6lld k %6lld  %7.1f GFLOP/s  %5.1f%% of peak\n", l.name, form,
                        static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                        flops / seconds / 1e9, 100 * flops / seconds / peak);
            std::fflush(stdout);
            report["results"].push_back({{"layer", l.name},
                                         {"form", form},
                                         {"m", m},
                                         {"n", n},
                                         {"k", k},
                                         {"median_ms", seconds * 1e3},
                                         {"gflops", flops / seconds / 1e9},
                                         {"fraction_of_peak", flops / seconds / peak}});
        }
    }
    // Each shape once: not weighted by how often a step runs it.
    report["all_shapes_gflops"] = all_flops / all_seconds / 1e9;
    report["machine"]["load_average_at_end"] = loom::bench::load_average();
    std::printf("all shapes once: %.1f GFLOP/s, %.1f%% of peak\n", all_flops / all_seconds / 1e9,
                100 * all_flops / all_seconds / peak);

    try {
        loom::bench::write_record(report, opt.out);
    } catch (const std::exception& e) {
        std::cerr << "gemm_step: " << e.what() << "\n";
        return 1;
    }
    std::printf("wrote %s\n", opt.out.c_str());
    return 0;
}
