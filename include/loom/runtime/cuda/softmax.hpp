#pragma once
// Softmax over the last dim of a row-major [rows, cols] tensor: the CUDA kernels of
// ops::softmax and ops::softmax_grad, as PyTorch's F.softmax(x, dim=-1). T is float or
// loom::bfloat16; arithmetic and sums in float, bf16 results rounded once. Host twin:
// runtime/host/kernels/softmax.hpp. Every sum runs in a fixed order: bit-identical results
// run to run.
//
// Rows of up to 8192 elements are held in registers (16-byte vector accesses when every
// pointer is 16-byte aligned and cols is a multiple of 16 / sizeof(T)); longer rows take one
// online max-and-sum pass over memory and one write pass. Pointers must not overlap.
#include <cstdint>

#include <loom/core/bfloat16.hpp>
#include <loom/runtime/cuda/device.hpp>

namespace loom::cuda {

// y = exp(x - max) * (1 / sum exp(x - max)) per row.
template <class T>
void softmax_forward(const T* x, T* y, std::int64_t rows, std::int64_t cols, stream_handle s);

// The backward of softmax from its output, as ops::softmax_grad (dy, y):
//   dx = (dy - sum(dy * y)) * y per row.
template <class T>
void softmax_backward(const T* dy, const T* y, T* dx, std::int64_t rows, std::int64_t cols, stream_handle s);

}  // namespace loom::cuda
