// The built-in host kernels of both precisions, compiled once. Linking loom::host_kernels
// defines LOOM_HOST_KERNELS_COMPILED for the program, whose translation units then declare
// these instantiations extern (runtime/host/kernel_table.hpp) and skip compiling them.
#include <loom/runtime/host/kernel_table.hpp>

template class loom::host::kernel_table<float>;
template class loom::host::kernel_table<double>;
