// The compiled part of loom (see compiled.cpp): the built-in host kernels in double, which
// call the large functions that compiled.cpp defines.
#include <loom/runtime/host/kernel_table.hpp>

template class loom::host::kernel_table<double>;
