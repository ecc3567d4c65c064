// The compiled part of loom: the built-in host kernels of both precisions, and every large
// non-template function (core/linkage.hpp), compiled once. Linking loom::compiled defines
// LOOM_COMPILED for the program, whose translation units then declare these kernel
// instantiations extern (runtime/host/kernel_table.hpp) and keep the functions' bodies for
// inlining only, so they compile neither.
#define LOOM_COMPILING_LIBRARY
#include <loom/loom.hpp>

template class loom::host::kernel_table<float>;
template class loom::host::kernel_table<double>;
