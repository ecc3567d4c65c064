// Measures this machine as a cluster of in-process ranks (GEMM and copy speed, and the
// links between ranks, per collective; see calibrate/host.hpp) and writes the profile the
// searcher reads:
//
//   calibrate_host --ranks 4 --out host.json
//   loom_plan --cluster-json host.json ...
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include <loom/calibrate/host.hpp>

int main(int argc, char** argv) {
    CLI::App app{"Measure the host backend and write a cluster profile for loom's searcher"};
    int ranks = 4;
    std::string out = "host.json";
    app.add_option("--ranks", ranks, "in-process ranks the profile describes")->check(CLI::PositiveNumber);
    app.add_option("--out", out, "where to write the profile (JSON)");
    CLI11_PARSE(app, argc, argv);
    try {
        const loom::search::cluster hw = loom::search::calibrate_host(ranks);
        loom::search::save_cluster(hw, out);
        std::printf("%s: %.1f GFLOP/s (f32 GEMM) and %.1f GB/s per rank; written to %s\n", hw.name.c_str(),
                    hw.device.peak_flops_f32 / 1e9, hw.device.memory_bandwidth / 1e9, out.c_str());
        // The profile must load back as written.
        if (!(loom::search::load_cluster(out) == hw)) {
            std::fprintf(stderr, "calibrate_host: %s does not load back equal; report this\n", out.c_str());
            return 1;
        }
    } catch (const loom::error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
    return 0;
}
