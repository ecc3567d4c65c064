#pragma once
// Error checking inside loom::cuda's sources: every CUDA runtime call goes through
// LOOM_CUDA_CHECK, which throws loom::cuda_error with the call's text, the error name and
// where it was made.
#include <cuda_runtime.h>

#include <string>

#include <loom/runtime/cuda/device.hpp>

namespace loom::cuda::detail {

[[noreturn]] inline void throw_cuda(cudaError_t status, const char* call, const char* file, int line) {
    (void)cudaGetLastError();  // clear a sticky launch error so the next check is about the next call
    int device = -1;
    (void)cudaGetDevice(&device);
    throw cuda_error(std::string(call) + " failed on device " + std::to_string(device) + ": " +
                     cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ") at " + file + ":" +
                     std::to_string(line) +
                     "; run under compute-sanitizer to find the faulting kernel, and check the driver with nvidia-smi");
}

// Launch wrappers refuse a null device pointer before queuing anything, naming the argument.
inline void check_pointer(const char* fn, const char* what, const void* p) {
    if (!p) throw usage_error(std::string(fn) + ": " + what + " is null; pass device memory for it");
}

}  // namespace loom::cuda::detail

#define LOOM_CUDA_CHECK(call)                                                                            \
    do {                                                                                                 \
        const cudaError_t loom_cuda_status_ = (call);                                                    \
        if (loom_cuda_status_ != cudaSuccess) ::loom::cuda::detail::throw_cuda(loom_cuda_status_, #call, \
                                                                               __FILE__, __LINE__);      \
    } while (0)

// After a <<<...>>> launch.
#define LOOM_CUDA_CHECK_LAUNCH(kernel_name) ::loom::cuda::check_last_launch(kernel_name)
