#pragma once
// How loom's large non-template functions are compiled.
//
// loom is header-only: its functions are `inline`, and every translation unit that calls
// one compiles and optimizes it, which is most of a program's compile time
// (benchmarks/RESULTS.md, "Compile time"). The compiled library loom::compiled
// (src/compiled.cpp) compiles them once instead: it defines LOOM_COMPILED for itself and
// for the programs that link it, and then
//   - the functions marked LOOM_INLINE are ordinary external functions;
//   - each header declares them where they belong and keeps their definitions in a block
//     at its end, under `#if LOOM_HEADER_DEFINITIONS`, which only the library compiles.
// Without the library nothing changes: the definitions are inline and in every header.
//
// Templates, constexpr functions and functions with static local variables stay where
// they are, plain `inline`.
#if defined(LOOM_COMPILED)
#define LOOM_INLINE
#if defined(LOOM_COMPILING_LIBRARY)
#define LOOM_HEADER_DEFINITIONS 1
#else
#define LOOM_HEADER_DEFINITIONS 0
#endif
#else
#define LOOM_INLINE inline
#define LOOM_HEADER_DEFINITIONS 1
#endif
