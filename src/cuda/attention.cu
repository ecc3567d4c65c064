// Launches of the fused attention kernels (flash_attention.cuh): argument checks, the tile
// grids, and the opt-in to more than 48 KiB of shared memory per block.
#include <loom/runtime/cuda/attention.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include <loom/core/error.hpp>

#include "check.cuh"
#include "flash_attention.cuh"
#include "types.cuh"

namespace loom::cuda {
namespace {

namespace flash = detail::flash;

struct checked_dims {
    std::int64_t pairs;      // batch x heads
    float scale, scale_log2;  // scale and scale * log2(e), both rounded once from double
};

checked_dims check_dims(const char* fn, const attention_dims& d) {
    const std::string where = std::string("cuda::") + fn + ": ";
    if (d.head_dim != 64 && d.head_dim != 128)
        throw usage_error(where + "head_dim = " + std::to_string(d.head_dim) +
                          " is not supported; the fused kernels are built for head dims 64 and 128 (pad the heads "
                          "to one of them, or run attention on the host backend)");
    if (d.batch < 1 || d.heads < 1)
        throw usage_error(where + "batch = " + std::to_string(d.batch) + ", heads = " + std::to_string(d.heads) +
                          "; pass at least one of each");
    if (d.queries < 0 || d.keys < 1)
        throw usage_error(where + "queries = " + std::to_string(d.queries) + ", keys = " + std::to_string(d.keys) +
                          "; attention needs queries >= 0 and at least one key");
    if (d.causal && d.keys != d.queries)
        throw usage_error(where + "causal attention needs as many keys as queries, but queries = " +
                          std::to_string(d.queries) + " and keys = " + std::to_string(d.keys) +
                          "; pass k and v with as many positions as q, or set causal = false");
    if (!(d.scale >= 0.0) || !std::isfinite(d.scale))
        throw usage_error(where + "scale = " + std::to_string(d.scale) +
                          "; pass a positive scale, or 0 for the default 1/sqrt(head_dim)");
    const std::int64_t pairs = d.batch * d.heads;
    if (pairs > 65535)
        throw usage_error(where + "batch x heads = " + std::to_string(pairs) +
                          " exceeds the 65535 blocks of a grid's second dimension; split the batch into calls of "
                          "at most 65535 (batch x heads)");
    if ((std::max(d.queries, d.keys) + flash::query_tile - 1) / flash::query_tile > 0x7fffffff)
        throw usage_error(where + "sequence of " + std::to_string(std::max(d.queries, d.keys)) +
                          " positions has more tiles than a grid holds; split it");
    const double scale = d.scale > 0.0 ? d.scale : 1.0 / std::sqrt(static_cast<double>(d.head_dim));
    return {pairs, static_cast<float>(scale), static_cast<float>(scale * 1.4426950408889634)};
}

void check_pointer(const char* fn, const char* name, const void* p, std::size_t alignment) {
    if (p == nullptr)
        throw usage_error(std::string("cuda::") + fn + ": " + name + " is null; pass a device pointer");
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    if (address % alignment != 0)
        throw usage_error(std::string("cuda::") + fn + ": " + name + " = " + std::to_string(address) +
                          " is not " + std::to_string(alignment) +
                          "-byte aligned; the kernels copy rows in 16-byte pieces, so offset tensors from a "
                          "cudaMalloc'd base by multiples of " +
                          std::to_string(alignment) + " bytes");
}

// Lets `kernel` use `bytes` of dynamic shared memory (past the default 48 KiB), or says why
// this GPU cannot.
template <class Kernel>
void allow_shared_memory(Kernel* kernel, int bytes, const char* fn, const attention_dims& d) {
    int device = 0, optin = 0;
    LOOM_CUDA_CHECK(cudaGetDevice(&device));
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (bytes > optin)
        throw usage_error(std::string("cuda::") + fn + ": head_dim " + std::to_string(d.head_dim) + " needs " +
                          std::to_string(bytes) + " bytes of shared memory per block and device " +
                          std::to_string(device) + " allows " + std::to_string(optin) +
                          "; use bf16 (smaller tiles) or head_dim 64 on this GPU");
    LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <class E>
flash::params<E> make_params(const attention_dims& d, const checked_dims& c) {
    flash::params<E> p{};
    p.s = d.queries;
    p.t = d.keys;
    p.causal = d.causal;
    p.scale = c.scale;
    p.scale_log2 = c.scale_log2;
    return p;
}

unsigned tiles(std::int64_t rows) { return static_cast<unsigned>((rows + flash::query_tile - 1) / flash::query_tile); }

template <class E, int D>
void forward_with(const flash::params<E>& p, const attention_dims& d, const checked_dims& c, stream_handle s) {
    using L = flash::layout<E, D>;
    auto* kernel = &flash::forward_kernel<E, D>;
    allow_shared_memory(kernel, L::forward_smem, "attention_forward", d);
    kernel<<<dim3(tiles(d.queries), static_cast<unsigned>(c.pairs)), flash::threads, L::forward_smem, s>>>(p);
    LOOM_CUDA_CHECK_LAUNCH("attention_forward");
}

template <class E, int D>
void backward_with(const flash::params<E>& p, float* delta, const attention_dims& d, const checked_dims& c,
                   stream_handle s) {
    using L = flash::layout<E, D>;
    const std::int64_t rows = c.pairs * d.queries;
    if (rows > 0) {
        constexpr unsigned delta_threads = 256;
        flash::delta_kernel<E, D><<<detail::blocks_for(rows, delta_threads / 32), delta_threads, 0, s>>>(
            p.out, p.dout, delta, rows);
        LOOM_CUDA_CHECK_LAUNCH("attention_backward (row dots)");
    }
    // With no queries the key gradients are zeros, which this kernel still writes.
    auto* kv = &flash::backward_kv_kernel<E, D>;
    allow_shared_memory(kv, L::backward_kv_smem, "attention_backward", d);
    kv<<<dim3(tiles(d.keys), static_cast<unsigned>(c.pairs)), flash::threads, L::backward_kv_smem, s>>>(p);
    LOOM_CUDA_CHECK_LAUNCH("attention_backward (dk, dv)");
    if (d.queries > 0) {
        auto* q = &flash::backward_q_kernel<E, D>;
        allow_shared_memory(q, L::backward_q_smem, "attention_backward", d);
        q<<<dim3(tiles(d.queries), static_cast<unsigned>(c.pairs)), flash::threads, L::backward_q_smem, s>>>(p);
        LOOM_CUDA_CHECK_LAUNCH("attention_backward (dq)");
    }
}

}  // namespace

std::size_t attention_backward_workspace_bytes(const attention_dims& dims) {
    const std::int64_t rows = dims.batch * dims.heads * dims.queries;
    return rows > 0 ? static_cast<std::size_t>(rows) * sizeof(float) : 0;
}

template <class T>
void attention_forward(const T* q, const T* k, const T* v, T* out, float* lse, const attention_dims& dims,
                       stream_handle s) {
    const checked_dims c = check_dims("attention_forward", dims);
    if (dims.queries == 0) return;
    check_pointer("attention_forward", "q", q, 16);
    check_pointer("attention_forward", "k", k, 16);
    check_pointer("attention_forward", "v", v, 16);
    check_pointer("attention_forward", "out", out, 16);
    check_pointer("attention_forward", "lse", lse, 4);
    using E = detail::device_t<T>;
    flash::params<E> p = make_params<E>(dims, c);
    p.q = detail::device_ptr(q);
    p.k = detail::device_ptr(k);
    p.v = detail::device_ptr(v);
    p.out_w = detail::device_ptr(out);
    p.lse_w = lse;
    if (dims.head_dim == 64) forward_with<E, 64>(p, dims, c, s);
    else forward_with<E, 128>(p, dims, c, s);
}

template <class T>
void attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* out, const float* lse, T* dq,
                        T* dk, T* dv, void* workspace, const attention_dims& dims, stream_handle s) {
    const checked_dims c = check_dims("attention_backward", dims);
    check_pointer("attention_backward", "k", k, 16);
    check_pointer("attention_backward", "v", v, 16);
    check_pointer("attention_backward", "dk", dk, 16);
    check_pointer("attention_backward", "dv", dv, 16);
    using E = detail::device_t<T>;
    flash::params<E> p = make_params<E>(dims, c);
    p.k = detail::device_ptr(k);
    p.v = detail::device_ptr(v);
    p.dk = detail::device_ptr(dk);
    p.dv = detail::device_ptr(dv);
    float* delta = static_cast<float*>(workspace);
    if (dims.queries > 0) {
        check_pointer("attention_backward", "dout", dout, 16);
        check_pointer("attention_backward", "q", q, 16);
        check_pointer("attention_backward", "out", out, 16);
        check_pointer("attention_backward", "lse", lse, 4);
        check_pointer("attention_backward", "dq", dq, 16);
        check_pointer("attention_backward", "workspace", workspace, 16);
        p.dout = detail::device_ptr(dout);
        p.q = detail::device_ptr(q);
        p.out = detail::device_ptr(out);
        p.lse = lse;
        p.dq = detail::device_ptr(dq);
        p.delta = delta;
    }
    if (dims.head_dim == 64) backward_with<E, 64>(p, delta, dims, c, s);
    else backward_with<E, 128>(p, delta, dims, c, s);
}

#define LOOM_INSTANTIATE(T)                                                                                     \
    template void attention_forward<T>(const T*, const T*, const T*, T*, float*, const attention_dims&,         \
                                       stream_handle);                                                          \
    template void attention_backward<T>(const T*, const T*, const T*, const T*, const T*, const float*, T*, T*, \
                                        T*, void*, const attention_dims&, stream_handle);
LOOM_INSTANTIATE(float)
LOOM_INSTANTIATE(bfloat16)
#undef LOOM_INSTANTIATE

}  // namespace loom::cuda
