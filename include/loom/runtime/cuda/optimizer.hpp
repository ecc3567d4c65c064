#pragma once
// The optimizer step on the GPU: the global gradient norm and AdamW over every parameter,
// each in one launch however many tensors the model has (a tensor list is uploaded once,
// when the optimizer is built, and split into fixed chunks, one thread block each).
//
// Mixed precision: master weights and both moments are float; a gradient may be float or
// bf16, and a parameter may carry a bf16 compute copy that the step refreshes. Semantics
// are PyTorch's (torch.optim.AdamW, torch.nn.utils.clip_grad_norm_), as loom::train::adamw
// with loom::train::global_norm and clip_scale on the host, which are the twins in the tests.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <loom/core/bfloat16.hpp>
#include <loom/runtime/cuda/device.hpp>

namespace loom::cuda {

enum class grad_type : std::uint8_t { f32, bf16 };

// One parameter tensor.
struct adamw_tensor {
    float* value = nullptr;                // master weights
    const void* grad = nullptr;            // float or bfloat16, by the optimizer's grad_type
    bfloat16* compute_copy = nullptr;      // optional bf16 copy written after the update
    std::int64_t numel = 0;
    bool weight_decay = true;              // false for biases and norms, as the host trainer decides
};

struct adamw_hyperparameters {
    float lr = 1e-3f;
    float beta1 = 0.9f;
    float beta2 = 0.999f;
    float eps = 1e-8f;
    float weight_decay = 0.01f;
};

// Elements one thread block of the multi-tensor kernels handles.
inline constexpr std::int64_t multi_tensor_chunk = 1 << 16;

class fused_adamw {
public:
    // Allocates the moments (zeroed) and uploads the tensor table. Tensors must not overlap.
    fused_adamw(std::vector<adamw_tensor> tensors, grad_type grads, adamw_hyperparameters hyper);

    // One step, t = steps() + 1. `grad_scale`, when not null, is a device float that multiplies
    // every gradient (the clipping coefficient global_norm wrote: its result + 1), read on the
    // device so that clipping needs no host round trip.
    void step(float lr, const float* grad_scale, stream_handle s);
    void step(const float* grad_scale, stream_handle s) { step(hyper_.lr, grad_scale, s); }

    std::int64_t steps() const { return steps_; }
    void set_steps(std::int64_t steps) { steps_ = steps; }
    const adamw_hyperparameters& hyperparameters() const { return hyper_; }
    std::int64_t parameter_count() const { return total_; }
    // The moments of tensor i (device pointers, numel elements each), for checkpoints.
    float* first_moment(std::size_t i) const;
    float* second_moment(std::size_t i) const;

private:
    std::vector<adamw_tensor> tensors_;
    grad_type grads_;
    adamw_hyperparameters hyper_;
    std::int64_t steps_ = 0;
    std::int64_t total_ = 0;
    std::vector<std::int64_t> offsets_;  // of each tensor's moments in m_ and v_
    device_buffer m_, v_;
    device_buffer table_;   // device copy of the tensor descriptors
    device_buffer chunks_;  // per block: tensor index and first element
    int blocks_ = 0;
};

// The global L2 norm of many gradients, and the clipping coefficient
// min(1, max_norm / (norm + 1e-6)), both written to device memory: result[0] = norm,
// result[1] = coefficient (1 when max_norm <= 0, i.e. no clipping). Sums squares in double,
// per block and then over blocks in block order: deterministic.
class global_norm {
public:
    global_norm(std::vector<const void*> grads, std::vector<std::int64_t> numels, grad_type type);
    // result: two device floats.
    void compute(float max_norm, float* result, stream_handle s) const;
    // The sum of squares alone (one device double), for a norm over gradients spread across
    // ranks: sum it over the ranks, then finish() it into the norm and the coefficient.
    void sum_of_squares(double* result, stream_handle s) const;
    static void finish(const double* sum_of_squares, float max_norm, float* result, stream_handle s);

private:
    void square_partials(stream_handle s) const;

    grad_type type_;
    device_buffer table_, chunks_, partials_;
    int blocks_ = 0;
};

}  // namespace loom::cuda
