// Measures this machine's GPU with loom's own kernels (see calibrate/cuda/gpu.hpp) and
// writes the profile the searcher reads:
//
//   calibrate_gpu --nodes 4 --out h100.json
//   loom_plan --cluster-json h100.json ...
//
// Exits 77 on a machine without a GPU.
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include <loom/calibrate/cuda/gpu.hpp>
#include <loom/runtime/cuda_gate.hpp>

int main(int argc, char** argv) {
    CLI::App app{"Measure the GPU and write a cluster profile for loom's searcher"};
    loom::cuda::calibration_options options;
    std::string out = "gpu.json";
    app.add_option("--nodes", options.nodes, "nodes the profile describes")->check(CLI::PositiveNumber);
    app.add_option("--gemm-size", options.gemm_size, "m = n = k of the timed GEMMs");
    bool no_rates = false;
    app.add_flag("--no-op-rates", no_rates, "skip the rates per op kind (GPT training steps, about half a minute)");
    app.add_option("--out", out, "where to write the profile (JSON)");
    CLI11_PARSE(app, argc, argv);
    options.op_rates = !no_rates;
    if (loom::cuda_device_count() == 0) {
        std::puts("calibrate_gpu: no GPU on this machine (exit 77); use calibrate_host here");
        return 77;
    }
    try {
        const loom::search::cluster hw = loom::cuda::calibrate_gpu(options);
        loom::search::save_cluster(hw, out);
        std::printf("%s\n  bf16 GEMM efficiency %.2f of %.0f TFLOP/s, copy %.0f GB/s, elementwise efficiency %.2f; "
                    "written to %s\n",
                    hw.name.c_str(), hw.device.gemm_efficiency, hw.device.peak_flops_f16 / 1e12,
                    hw.device.memory_bandwidth / 1e9, hw.device.elementwise_efficiency, out.c_str());
        if (const auto rates = hw.device.rates.find(loom::precision::bf16); rates != hw.device.rates.end())
            for (const auto& [kind, r] : rates->second)
                std::printf("  %-22s %zu points, %s, %.3g s per instruction at the largest (%.3g %s)\n", kind.c_str(),
                            r.points.size(), r.per_flop ? "per FLOP" : "per byte", r.points.back().second,
                            r.points.back().first, r.per_flop ? "FLOPs" : "bytes");
        if (!(loom::search::load_cluster(out) == hw)) {
            std::fprintf(stderr, "calibrate_gpu: %s does not load back equal; report this\n", out.c_str());
            return 1;
        }
    } catch (const loom::error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
    return 0;
}
