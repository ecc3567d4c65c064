#pragma once
// What the kernels of loom::cuda share: the element types (the public headers speak of
// float and loom::bfloat16; the kernels of float and __nv_bfloat16, the same bits), loads
// and stores that widen to float, and launch sizes.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include <loom/core/bfloat16.hpp>

namespace loom::cuda::detail {

template <class T>
struct device_type {
    using type = T;
};
template <>
struct device_type<loom::bfloat16> {
    using type = __nv_bfloat16;
};
template <class T>
using device_t = typename device_type<T>::type;

static_assert(sizeof(__nv_bfloat16) == sizeof(loom::bfloat16));

template <class T>
device_t<T>* device_ptr(T* p) {
    return reinterpret_cast<device_t<T>*>(p);
}
template <class T>
const device_t<T>* device_ptr(const T* p) {
    return reinterpret_cast<const device_t<T>*>(p);
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class D>
__device__ __forceinline__ D from_float(float x) {
    if constexpr (std::is_same_v<D, float>) return x;
    else return __float2bfloat16_rn(x);
}

// Blocks for a grid-stride loop over n elements: enough to fill the GPU, never more than n needs.
inline unsigned blocks_for(std::int64_t n, unsigned threads, unsigned cap = 65535u * 8u) {
    const std::int64_t needed = (n + threads - 1) / threads;
    return static_cast<unsigned>(needed < 1 ? 1 : (needed > cap ? cap : needed));
}

}  // namespace loom::cuda::detail
