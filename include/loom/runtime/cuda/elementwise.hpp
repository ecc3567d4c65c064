#pragma once
// Element-wise kernels of the CUDA backend. T is float or loom::bfloat16; arithmetic is in
// float, and bf16 results are rounded once, on the store. Host twins: tests/cuda/twins/.
#include <cstdint>

#include <loom/core/bfloat16.hpp>
#include <loom/runtime/cuda/device.hpp>

namespace loom::cuda {

// y = gelu(x), the tanh approximation (GPT-2's).
template <class T>
void gelu_forward(const T* x, T* y, std::int64_t n, stream_handle s);
// dx = dy * gelu'(x).
template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, std::int64_t n, stream_handle s);
// out = a + b (a residual join); out may alias a or b.
template <class T>
void add(const T* a, const T* b, T* out, std::int64_t n, stream_handle s);
// out = alpha * x.
template <class T>
void scale(const T* x, float alpha, T* out, std::int64_t n, stream_handle s);
// Precision casts for mixed-precision training (bf16 compute copies of float master weights).
void cast(const float* x, bfloat16* y, std::int64_t n, stream_handle s);
void cast(const bfloat16* x, float* y, std::int64_t n, stream_handle s);

}  // namespace loom::cuda
