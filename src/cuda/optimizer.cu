// Multi-tensor kernels: the global gradient norm and AdamW. One launch covers every
// parameter; each block handles one chunk of one tensor (chunk table built on the host).
#include <algorithm>
#include <cmath>
#include <string>

#include <loom/core/error.hpp>
#include <loom/runtime/cuda/optimizer.hpp>

#include "check.cuh"
#include "types.cuh"

namespace loom::cuda {
namespace {

using detail::to_float;

constexpr unsigned threads = 256;

struct device_tensor {
    float* value;
    const void* grad;
    __nv_bfloat16* compute_copy;
    float* m;
    float* v;
    std::int64_t numel;
    int weight_decay;
};

struct chunk {
    int tensor;
    std::int64_t first;
};

template <class G>
__device__ __forceinline__ float grad_at(const void* g, std::int64_t i) {
    return to_float(static_cast<const G*>(g)[i]);
}

struct step_constants {
    float lr, beta1, beta2, eps, weight_decay;
    float step_size;    // lr / (1 - beta1^t)
    float bias2_sqrt;   // sqrt(1 - beta2^t)
};

template <class G>
__global__ void adamw_kernel(const device_tensor* __restrict__ tensors, const chunk* __restrict__ chunks,
                             step_constants c, const float* __restrict__ grad_scale) {
    const chunk work = chunks[blockIdx.x];
    const device_tensor t = tensors[work.tensor];
    const float scale = grad_scale ? *grad_scale : 1.0f;
    const float decay = t.weight_decay ? 1.0f - c.lr * c.weight_decay : 1.0f;
    const std::int64_t end = min(work.first + multi_tensor_chunk, t.numel);
    for (std::int64_t i = work.first + threadIdx.x; i < end; i += blockDim.x) {
        const float g = grad_at<G>(t.grad, i) * scale;
        float p = t.value[i] * decay;
        const float m = c.beta1 * t.m[i] + (1.0f - c.beta1) * g;
        const float v = c.beta2 * t.v[i] + (1.0f - c.beta2) * g * g;
        p -= c.step_size * m / (sqrtf(v) / c.bias2_sqrt + c.eps);
        t.m[i] = m;
        t.v[i] = v;
        t.value[i] = p;
        if (t.compute_copy) t.compute_copy[i] = __float2bfloat16_rn(p);
    }
}

struct norm_tensor {
    const void* grad;
    std::int64_t numel;
};

// Per block: the sum of squares of its chunk, in a fixed tree order.
template <class G>
__global__ void square_sum_kernel(const norm_tensor* __restrict__ tensors, const chunk* __restrict__ chunks,
                                  double* __restrict__ partials) {
    const chunk work = chunks[blockIdx.x];
    const norm_tensor t = tensors[work.tensor];
    const std::int64_t end = min(work.first + multi_tensor_chunk, t.numel);
    double sum = 0;
    for (std::int64_t i = work.first + threadIdx.x; i < end; i += blockDim.x) {
        const double g = grad_at<G>(t.grad, i);
        sum += g * g;
    }
    __shared__ double shared[threads];
    shared[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

// One block sums the partials: each thread a strided subset in order, then a fixed tree.
// With `sum_only`, writes the sum of squares (for a norm over gradients spread across ranks,
// which sums it over the ranks first) instead of the norm and the coefficient.
__global__ void finish_norm_kernel(const double* __restrict__ partials, int count, float max_norm,
                                   float* __restrict__ result, double* __restrict__ sum_only) {
    double sum = 0;
    for (int i = static_cast<int>(threadIdx.x); i < count; i += static_cast<int>(blockDim.x)) sum += partials[i];
    __shared__ double shared[threads];
    shared[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0 && sum_only) {
        *sum_only = shared[0];
    } else if (threadIdx.x == 0) {
        const double norm = sqrt(shared[0]);
        result[0] = static_cast<float>(norm);
        const double coefficient = max_norm > 0 ? max_norm / (norm + 1e-6) : 1.0;
        result[1] = static_cast<float>(coefficient < 1.0 ? coefficient : 1.0);
    }
}

std::vector<chunk> chunk_table(const std::vector<std::int64_t>& numels) {
    std::vector<chunk> chunks;
    for (std::size_t t = 0; t < numels.size(); ++t)
        for (std::int64_t first = 0; first < numels[t]; first += multi_tensor_chunk)
            chunks.push_back({static_cast<int>(t), first});
    if (chunks.size() > 0x7fffffffu)
        throw usage_error("cuda multi-tensor kernels: " + std::to_string(chunks.size()) +
                          " chunks exceed one launch's grid; split the parameters over several optimizers");
    return chunks;
}

template <class T>
device_buffer upload(const std::vector<T>& host) {
    device_buffer buffer(std::max<std::size_t>(host.size(), 1) * sizeof(T));
    copy_to_device(buffer.get(), host.data(), host.size() * sizeof(T));
    synchronize_device();  // the host vector dies when the caller returns
    return buffer;
}

}  // namespace

fused_adamw::fused_adamw(std::vector<adamw_tensor> tensors, grad_type grads, adamw_hyperparameters hyper)
    : tensors_(std::move(tensors)), grads_(grads), hyper_(hyper) {
    if (!(hyper.beta1 >= 0 && hyper.beta1 < 1 && hyper.beta2 >= 0 && hyper.beta2 < 1))
        throw usage_error("cuda::fused_adamw: betas must lie in [0, 1); got beta1=" + std::to_string(hyper.beta1) +
                          ", beta2=" + std::to_string(hyper.beta2));
    if (hyper.lr < 0 || hyper.eps <= 0 || hyper.weight_decay < 0)
        throw usage_error("cuda::fused_adamw: lr and weight_decay must be >= 0 and eps > 0");
    std::vector<std::int64_t> numels;
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
        const auto& t = tensors_[i];
        if (t.numel < 0 || (t.numel > 0 && (!t.value || !t.grad)))
            throw usage_error("cuda::fused_adamw: tensor " + std::to_string(i) +
                              " has a null value or gradient pointer or a negative size; pass device buffers");
        offsets_.push_back(total_);
        total_ += t.numel;
        numels.push_back(t.numel);
    }
    m_ = device_buffer(static_cast<std::size_t>(std::max<std::int64_t>(total_, 1)) * sizeof(float));
    v_ = device_buffer(static_cast<std::size_t>(std::max<std::int64_t>(total_, 1)) * sizeof(float));
    fill_zero(m_.get(), m_.bytes());
    fill_zero(v_.get(), v_.bytes());
    std::vector<device_tensor> table;
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
        const auto& t = tensors_[i];
        table.push_back({t.value, t.grad, reinterpret_cast<__nv_bfloat16*>(t.compute_copy), m_.as<float>() + offsets_[i],
                         v_.as<float>() + offsets_[i], t.numel, t.weight_decay ? 1 : 0});
    }
    const auto chunks = chunk_table(numels);
    blocks_ = static_cast<int>(chunks.size());
    table_ = upload(table);
    chunks_ = upload(chunks);
}

void fused_adamw::step(float lr, const float* grad_scale, stream_handle s) {
    ++steps_;
    const double t = static_cast<double>(steps_);
    step_constants c{lr,
                     hyper_.beta1,
                     hyper_.beta2,
                     hyper_.eps,
                     hyper_.weight_decay,
                     static_cast<float>(lr / (1 - std::pow(static_cast<double>(hyper_.beta1), t))),
                     static_cast<float>(std::sqrt(1 - std::pow(static_cast<double>(hyper_.beta2), t)))};
    if (blocks_ == 0) return;
    if (grads_ == grad_type::f32)
        adamw_kernel<float><<<blocks_, threads, 0, s>>>(table_.as<device_tensor>(), chunks_.as<chunk>(), c, grad_scale);
    else
        adamw_kernel<__nv_bfloat16>
            <<<blocks_, threads, 0, s>>>(table_.as<device_tensor>(), chunks_.as<chunk>(), c, grad_scale);
    LOOM_CUDA_CHECK_LAUNCH("fused_adamw");
}

float* fused_adamw::first_moment(std::size_t i) const { return m_.as<float>() + offsets_.at(i); }
float* fused_adamw::second_moment(std::size_t i) const { return v_.as<float>() + offsets_.at(i); }

global_norm::global_norm(std::vector<const void*> grads, std::vector<std::int64_t> numels, grad_type type) : type_(type) {
    if (grads.size() != numels.size())
        throw usage_error("cuda::global_norm: " + std::to_string(grads.size()) + " gradients but " +
                          std::to_string(numels.size()) + " sizes; pass one size per gradient");
    std::vector<norm_tensor> table;
    for (std::size_t i = 0; i < grads.size(); ++i) table.push_back({grads[i], numels[i]});
    const auto chunks = chunk_table(numels);
    blocks_ = static_cast<int>(chunks.size());
    table_ = upload(table);
    chunks_ = upload(chunks);
    partials_ = device_buffer(static_cast<std::size_t>(std::max(blocks_, 1)) * sizeof(double));
}

void global_norm::compute(float max_norm, float* result, stream_handle s) const {
    square_partials(s);
    finish_norm_kernel<<<1, threads, 0, s>>>(partials_.as<double>(), blocks_, max_norm, result, nullptr);
    LOOM_CUDA_CHECK_LAUNCH("global_norm (finish)");
}

void global_norm::sum_of_squares(double* result, stream_handle s) const {
    square_partials(s);
    finish_norm_kernel<<<1, threads, 0, s>>>(partials_.as<double>(), blocks_, 0.0f, nullptr, result);
    LOOM_CUDA_CHECK_LAUNCH("global_norm (sum of squares)");
}

void global_norm::finish(const double* sum_of_squares, float max_norm, float* result, stream_handle s) {
    finish_norm_kernel<<<1, threads, 0, s>>>(sum_of_squares, 1, max_norm, result, nullptr);
    LOOM_CUDA_CHECK_LAUNCH("global_norm (finish)");
}

void global_norm::square_partials(stream_handle s) const {
    if (blocks_ > 0) {
        if (type_ == grad_type::f32)
            square_sum_kernel<float>
                <<<blocks_, threads, 0, s>>>(table_.as<norm_tensor>(), chunks_.as<chunk>(), partials_.as<double>());
        else
            square_sum_kernel<__nv_bfloat16>
                <<<blocks_, threads, 0, s>>>(table_.as<norm_tensor>(), chunks_.as<chunk>(), partials_.as<double>());
        LOOM_CUDA_CHECK_LAUNCH("global_norm (squares)");
    }
}

}  // namespace loom::cuda
