#pragma once
// Every host kernel loom ships (one specialisation of host_kernel per op kind).
#include <loom/runtime/host/kernels/basic.hpp>
#include <loom/runtime/host/kernels/linear.hpp>
// kernels-includes: elementwise
// kernels-includes: normalization
// kernels-includes: attention and shapes
// kernels-includes: embedding and loss
