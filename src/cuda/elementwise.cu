// Element-wise kernels: grid-stride loops, float arithmetic (the add 16 bytes a thread where aligned).
#include <cstdint>

#include <loom/runtime/cuda/elementwise.hpp>

#include "check.cuh"
#include "types.cuh"

namespace loom::cuda {
namespace {

using detail::from_float;
using detail::to_float;

constexpr unsigned threads = 256;

// The tanh form 0.5 x (1 + tanh(u)) cancels for x < 0; 0.5 (1 + tanh(u)) = sigmoid(2u) does
// not, and is what the host float kernel computes (runtime/host/kernels/gelu.hpp).
constexpr float gelu_two_beta = 2.0f * 0.7978845608028654f;  // 2 sqrt(2/pi)
constexpr float gelu_kappa = 0.044715f;

struct sigmoid_parts {
    float s, one_minus_s;
};

__device__ __forceinline__ sigmoid_parts sigmoid(float z) {
    const float e = expf(-fabsf(z));
    const float inv = 1.0f / (1.0f + e);
    return z >= 0.0f ? sigmoid_parts{inv, e * inv} : sigmoid_parts{e * inv, inv};
}

__device__ __forceinline__ float gelu_value(float x) {
    const float z = gelu_two_beta * (x + gelu_kappa * (x * x * x));
    return x * sigmoid(z).s;
}

__device__ __forceinline__ float gelu_derivative(float x) {
    const float x2 = x * x;
    const float z = gelu_two_beta * (x + gelu_kappa * (x2 * x));
    const float dz = gelu_two_beta * (1.0f + 3.0f * gelu_kappa * x2);
    const sigmoid_parts g = sigmoid(z);
    return g.s + x * (g.s * g.one_minus_s) * dz;
}

template <class D>
__global__ void gelu_forward_kernel(const D* __restrict__ x, D* __restrict__ y, std::int64_t n) {
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
        y[i] = from_float<D>(gelu_value(to_float(x[i])));
}

template <class D>
__global__ void gelu_backward_kernel(const D* __restrict__ x, const D* __restrict__ dy, D* __restrict__ dx,
                                     std::int64_t n) {
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
        dx[i] = from_float<D>(to_float(dy[i]) * gelu_derivative(to_float(x[i])));
}

template <class D>
__global__ void add_kernel(const D* a, const D* b, D* out, std::int64_t n) {
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
        out[i] = from_float<D>(to_float(a[i]) + to_float(b[i]));
}

// The same sum 16 bytes a thread (8 bf16 or 4 floats), where all three pointers are aligned
// to them: one load per operand per thread instead of per element, which the residual adds'
// share of a step needs (an element a thread ran at half the memory bandwidth on an H200).
template <class D>
__global__ void add_wide_kernel(const uint4* a, const uint4* b, uint4* out, std::int64_t units) {
    constexpr int per = sizeof(uint4) / sizeof(D);
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < units;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const uint4 va = a[i], vb = b[i];
        uint4 sum;
        const D* ea = reinterpret_cast<const D*>(&va);
        const D* eb = reinterpret_cast<const D*>(&vb);
        D* es = reinterpret_cast<D*>(&sum);
#pragma unroll
        for (int k = 0; k < per; ++k) es[k] = from_float<D>(to_float(ea[k]) + to_float(eb[k]));
        out[i] = sum;
    }
}

template <class D>
__global__ void scale_kernel(const D* x, float alpha, D* out, std::int64_t n) {
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
        out[i] = from_float<D>(alpha * to_float(x[i]));
}

template <class From, class To>
__global__ void cast_kernel(const From* __restrict__ x, To* __restrict__ y, std::int64_t n) {
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
        y[i] = from_float<To>(to_float(x[i]));
}

}  // namespace

template <class T>
void gelu_forward(const T* x, T* y, std::int64_t n, stream_handle s) {
    if (n <= 0) return;
    gelu_forward_kernel<<<detail::blocks_for(n, threads), threads, 0, s>>>(detail::device_ptr(x), detail::device_ptr(y), n);
    LOOM_CUDA_CHECK_LAUNCH("gelu_forward");
}

template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, std::int64_t n, stream_handle s) {
    if (n <= 0) return;
    gelu_backward_kernel<<<detail::blocks_for(n, threads), threads, 0, s>>>(
        detail::device_ptr(x), detail::device_ptr(dy), detail::device_ptr(dx), n);
    LOOM_CUDA_CHECK_LAUNCH("gelu_backward");
}

template <class T>
void add(const T* a, const T* b, T* out, std::int64_t n, stream_handle s) {
    if (n <= 0) return;
    const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % sizeof(uint4) == 0; };
    std::int64_t done = 0;
    if (aligned(a) && aligned(b) && aligned(out)) {
        constexpr std::int64_t per = sizeof(uint4) / sizeof(T);
        const std::int64_t units = n / per;
        if (units > 0) {
            add_wide_kernel<detail::device_t<T>><<<detail::blocks_for(units, threads), threads, 0, s>>>(
                reinterpret_cast<const uint4*>(a), reinterpret_cast<const uint4*>(b), reinterpret_cast<uint4*>(out),
                units);
            LOOM_CUDA_CHECK_LAUNCH("add");
        }
        done = units * per;
    }
    if (done == n) return;
    add_kernel<<<detail::blocks_for(n - done, threads), threads, 0, s>>>(
        detail::device_ptr(a + done), detail::device_ptr(b + done), detail::device_ptr(out + done), n - done);
    LOOM_CUDA_CHECK_LAUNCH("add");
}

template <class T>
void scale(const T* x, float alpha, T* out, std::int64_t n, stream_handle s) {
    if (n <= 0) return;
    scale_kernel<<<detail::blocks_for(n, threads), threads, 0, s>>>(detail::device_ptr(x), alpha,
                                                                     detail::device_ptr(out), n);
    LOOM_CUDA_CHECK_LAUNCH("scale");
}

void cast(const float* x, bfloat16* y, std::int64_t n, stream_handle s) {
    if (n <= 0) return;
    cast_kernel<<<detail::blocks_for(n, threads), threads, 0, s>>>(x, detail::device_ptr(y), n);
    LOOM_CUDA_CHECK_LAUNCH("cast f32->bf16");
}

void cast(const bfloat16* x, float* y, std::int64_t n, stream_handle s) {
    if (n <= 0) return;
    cast_kernel<<<detail::blocks_for(n, threads), threads, 0, s>>>(detail::device_ptr(x), y, n);
    LOOM_CUDA_CHECK_LAUNCH("cast bf16->f32");
}

#define LOOM_INSTANTIATE(T)                                                            \
    template void gelu_forward<T>(const T*, T*, std::int64_t, stream_handle);          \
    template void gelu_backward<T>(const T*, const T*, T*, std::int64_t, stream_handle); \
    template void add<T>(const T*, const T*, T*, std::int64_t, stream_handle);         \
    template void scale<T>(const T*, float, T*, std::int64_t, stream_handle);
LOOM_INSTANTIATE(float)
LOOM_INSTANTIATE(bfloat16)
#undef LOOM_INSTANTIATE

}  // namespace loom::cuda
