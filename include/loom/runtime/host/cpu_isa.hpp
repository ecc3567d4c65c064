#pragma once
// The x86-64 vector instruction sets the host kernels are compiled for, and which of them
// this CPU runs. Every vectorized host kernel (GEMM micro-kernels, attention, element-wise
// maps, norms, cross-entropy, the optimizer, the gradients' norm) has one build per set,
// made with GCC/Clang target attributes beside a baseline build, and picks one at run time:
//
//   switch (best_cpu_isa()) { case cpu_isa::avx512f: ...; case cpu_isa::avx2_fma: ...; ... }
//
// so the library needs no -march flag and one binary runs on any x86-64 CPU. A kernel may
// take the set as an argument too, which is how the tests hold each build to the baseline's
// values on the CPUs that can run it.
#include <vector>

namespace loom::host {

// portable: what the build targets (SSE2 by default); avx2_fma: 256-bit vectors with fused
// multiply-add; avx512f: 512-bit vectors.
enum class cpu_isa { portable, avx2_fma, avx512f };

inline const char* to_string(cpu_isa isa) noexcept {
    switch (isa) {
        case cpu_isa::portable: return "portable";
        case cpu_isa::avx2_fma: return "avx2_fma";
        case cpu_isa::avx512f: return "avx512f";
    }
    return "unknown";
}

// Whether this CPU (and OS) runs code built for `isa`.
inline bool cpu_isa_supported(cpu_isa isa) noexcept {
    // Needed before main (static initializers); cheap and idempotent after.
    __builtin_cpu_init();
    switch (isa) {
        case cpu_isa::portable: return true;
        case cpu_isa::avx2_fma: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        case cpu_isa::avx512f: return __builtin_cpu_supports("avx512f");
    }
    return false;
}

// The widest supported set, decided once per process.
inline cpu_isa best_cpu_isa() noexcept {
    static const cpu_isa best = cpu_isa_supported(cpu_isa::avx512f)    ? cpu_isa::avx512f
                                : cpu_isa_supported(cpu_isa::avx2_fma) ? cpu_isa::avx2_fma
                                                                       : cpu_isa::portable;
    return best;
}

// Every set this CPU runs, narrowest first.
inline std::vector<cpu_isa> supported_cpu_isas() {
    std::vector<cpu_isa> isas;
    for (cpu_isa isa : {cpu_isa::portable, cpu_isa::avx2_fma, cpu_isa::avx512f})
        if (cpu_isa_supported(isa)) isas.push_back(isa);
    return isas;
}

}  // namespace loom::host
