#pragma once
// Every host kernel loom ships (one specialisation of host_kernel per op kind).
#include <loom/runtime/host/kernels/assemble.hpp>
#include <loom/runtime/host/kernels/basic.hpp>
#include <loom/runtime/host/kernels/linear.hpp>
#include <loom/runtime/host/kernels/stop_gradient.hpp>
// kernels-includes: elementwise
#include <loom/runtime/host/kernels/dropout.hpp>
#include <loom/runtime/host/kernels/gelu.hpp>
#include <loom/runtime/host/kernels/relu.hpp>
#include <loom/runtime/host/kernels/silu.hpp>
#include <loom/runtime/host/kernels/softmax.hpp>
// kernels-includes: normalization
#include <loom/runtime/host/kernels/layer_norm.hpp>
#include <loom/runtime/host/kernels/rms_norm.hpp>
// kernels-includes: attention and shapes
#include <loom/runtime/host/kernels/attention.hpp>
#include <loom/runtime/host/kernels/heads.hpp>
#include <loom/runtime/host/kernels/matmul.hpp>
#include <loom/runtime/host/kernels/reshape.hpp>
#include <loom/runtime/host/kernels/transpose.hpp>
// kernels-includes: embedding and loss
#include <loom/runtime/host/kernels/cross_entropy.hpp>
#include <loom/runtime/host/kernels/embedding.hpp>
#include <loom/runtime/host/kernels/vocab_parallel_cross_entropy.hpp>
