// The compiled part of loom, first of three translation units: every large non-template
// function (core/linkage.hpp), compiled once. Linking loom::compiled defines LOOM_COMPILED
// for the program, whose translation units then keep those functions' bodies out and the
// built-in kernels' instantiations extern (runtime/host/kernel_table.hpp): they compile
// neither. The kernels of each precision are compiled beside this file (kernels_float.cpp,
// kernels_double.cpp), so that the three compile at once: under ASan this one alone took
// 232 s on 2 cores, the longest step of a sanitizer build.
#define LOOM_COMPILING_LIBRARY
#include <loom/loom.hpp>
