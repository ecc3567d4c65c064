// Catch2's main for the CUDA tests: exits 77 (ctest: skipped) when this machine has no GPU,
// so a run without one never reports the GPU kernels as passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include <loom/runtime/cuda_gate.hpp>

int main(int argc, char* argv[]) {
    if (loom::cuda_device_count() == 0) {
        std::puts("no CUDA device on this machine: the GPU tests are skipped (exit 77)");
        return 77;
    }
    const auto info = loom::cuda::describe(0);
    std::printf("GPU 0: %s (sm_%d%d, %d SMs, %.1f GiB)\n", info.name.c_str(), info.compute_major, info.compute_minor,
                info.multiprocessors, static_cast<double>(info.memory_bytes) / (1 << 30));
    return Catch::Session().run(argc, argv);
}
