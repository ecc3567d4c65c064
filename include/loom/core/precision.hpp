#pragma once
// The precision of real numbers: what a program stores its tensors in (runtime/program.hpp)
// and what the plan searcher prices a program's arithmetic and memory in
// (search/program_price.hpp).
//
//   f32    float
//   f64    double (the host executor's exact twin of f32)
//   f16    IEEE half precision with float arithmetic (mixed precision); the searcher plans in
//          it (tensor-core peaks, V100), no executor runs it
//   bf16   bfloat16 tensors with float arithmetic: the GPU's mixed precision, and the
//          outputs ops mark as float_outputs kept in float
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <loom/core/linkage.hpp>

namespace loom {

enum class precision : std::uint8_t { f32, f64, f16, bf16 };

// Bytes of one real number stored in precision p.
LOOM_INLINE std::size_t real_bytes(precision p);

LOOM_INLINE std::string_view to_string(precision p);

}  // namespace loom

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom {

LOOM_INLINE std::size_t real_bytes(precision p) {
    switch (p) {
        case precision::f32: return 4;
        case precision::f64: return 8;
        case precision::f16: return 2;
        case precision::bf16: return 2;
    }
    return 4;
}

LOOM_INLINE std::string_view to_string(precision p) {
    switch (p) {
        case precision::f32: return "f32";
        case precision::f64: return "f64";
        case precision::f16: return "f16";
        case precision::bf16: return "bf16";
    }
    return "unknown precision";
}

}  // namespace loom
#endif  // LOOM_HEADER_DEFINITIONS
