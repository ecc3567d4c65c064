// Element-wise kernels: grid-stride loops, float arithmetic, 16 bytes a thread where aligned.
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

// out = f(x) or f(x, y) element by element, in float. Where every pointer is 16-byte aligned,
// a thread takes 16 bytes of each operand (8 bf16 or 4 floats) in one load: one element a
// thread ran at half the memory bandwidth on an H200. The remainder, and unaligned tensors,
// go element by element. The output may be one of the inputs (a buffer the memory plan
// reuses where an input dies): each element is read before it is written, by one thread,
// and no pointer is declared __restrict__.
struct gelu_op {
    __device__ float operator()(float x) const { return gelu_value(x); }
};
struct gelu_grad_op {  // (x, dy) -> dy gelu'(x)
    __device__ float operator()(float x, float dy) const { return dy * gelu_derivative(x); }
};
struct add_op {
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct scale_op {
    float alpha;
    __device__ float operator()(float x) const { return alpha * x; }
};

template <class D, class F, class... In>
__device__ __forceinline__ D apply(const F& f, In... in) {
    return from_float<D>(f(to_float(in)...));
}

template <class D, class F, class... V>
__global__ void map_wide_kernel(F f, uint4* out, std::int64_t units, const V*... in) {
    constexpr int per = sizeof(uint4) / sizeof(D);
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < units;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        uint4 result;
        D* r = reinterpret_cast<D*>(&result);
        [&](auto... loaded) {
#pragma unroll
            for (int k = 0; k < per; ++k) r[k] = apply<D>(f, reinterpret_cast<const D*>(&loaded)[k]...);
        }(in[i]...);
        out[i] = result;
    }
}

template <class D, class F, class... Ptr>
__global__ void map_kernel(F f, D* out, std::int64_t n, const Ptr*... in) {
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
        out[i] = apply<D>(f, in[i]...);
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % sizeof(uint4) == 0; }

template <class T, class F, class... In>
void map(F f, T* out, std::int64_t n, stream_handle s, const char* what, const In*... in) {
    if (n <= 0) return;
    using D = detail::device_t<T>;
    std::int64_t done = 0;
    if (aligned16(out) && (aligned16(in) && ...)) {
        constexpr std::int64_t per = sizeof(uint4) / sizeof(T);
        const std::int64_t units = n / per;
        if (units > 0) {
            map_wide_kernel<D><<<detail::blocks_for(units, threads), threads, 0, s>>>(
                f, reinterpret_cast<uint4*>(out), units, reinterpret_cast<const uint4*>(in)...);
            LOOM_CUDA_CHECK_LAUNCH(what);
        }
        done = units * per;
    }
    if (done == n) return;
    map_kernel<D><<<detail::blocks_for(n - done, threads), threads, 0, s>>>(f, detail::device_ptr(out + done), n - done,
                                                                          detail::device_ptr(in + done)...);
    LOOM_CUDA_CHECK_LAUNCH(what);
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
    map(gelu_op{}, y, n, s, "gelu_forward", x);
}

template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, std::int64_t n, stream_handle s) {
    map(gelu_grad_op{}, dx, n, s, "gelu_backward", x, dy);
}

template <class T>
void add(const T* a, const T* b, T* out, std::int64_t n, stream_handle s) {
    map(add_op{}, out, n, s, "add", a, b);
}

template <class T>
void scale(const T* x, float alpha, T* out, std::int64_t n, stream_handle s) {
    map(scale_op{alpha}, out, n, s, "scale", x);
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
