// Definitions of <loom/runtime/cuda/device.hpp>.
#include <cuda_runtime.h>

#include <string>

#include <loom/runtime/cuda/device.hpp>
#include "check.cuh"

namespace loom::cuda {

int device_count() {
    int count = 0;
    // No driver or no device is an answer here, not an error: the caller falls back or skips.
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return count;
}

device_info describe(int ordinal) {
    cudaDeviceProp prop{};
    LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
    device_info info;
    info.ordinal = ordinal;
    info.name = prop.name;
    info.compute_major = prop.major;
    info.compute_minor = prop.minor;
    info.multiprocessors = prop.multiProcessorCount;
    info.memory_bytes = static_cast<std::int64_t>(prop.totalGlobalMem);
    info.shared_memory_per_block_optin = static_cast<std::int64_t>(prop.sharedMemPerBlockOptin);
    return info;
}

void set_device(int ordinal) {
    const int count = device_count();
    if (ordinal < 0 || ordinal >= count)
        throw cuda_error("cuda::set_device: device " + std::to_string(ordinal) + " does not exist; this process sees " +
                         std::to_string(count) + " GPU(s) (check CUDA_VISIBLE_DEVICES and the rank-to-GPU mapping)");
    LOOM_CUDA_CHECK(cudaSetDevice(ordinal));
}

int current_device() {
    int ordinal = 0;
    LOOM_CUDA_CHECK(cudaGetDevice(&ordinal));
    return ordinal;
}

void synchronize_device() { LOOM_CUDA_CHECK(cudaDeviceSynchronize()); }

stream::stream() { LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&handle_, cudaStreamNonBlocking)); }
stream::~stream() {
    if (handle_) (void)cudaStreamDestroy(handle_);
}
void stream::synchronize() const { LOOM_CUDA_CHECK(cudaStreamSynchronize(handle_)); }

void synchronize_stream(stream_handle on) { LOOM_CUDA_CHECK(cudaStreamSynchronize(on)); }

event::event(bool timing) {
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&handle_, timing ? cudaEventDefault : cudaEventDisableTiming));
}
event::~event() {
    if (handle_) (void)cudaEventDestroy(handle_);
}
void event::record(const stream& on) const { record(on.get()); }
void event::record(stream_handle on) const { LOOM_CUDA_CHECK(cudaEventRecord(handle_, on)); }
void event::wait_in(const stream& waiter) const { wait_in(waiter.get()); }
void event::wait_in(stream_handle waiter) const { LOOM_CUDA_CHECK(cudaStreamWaitEvent(waiter, handle_, 0)); }
void event::synchronize() const { LOOM_CUDA_CHECK(cudaEventSynchronize(handle_)); }
float event::elapsed_ms(const event& start, const event& stop) {
    float ms = 0;
    LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, start.handle_, stop.handle_));
    return ms;
}

device_buffer::device_buffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    const cudaError_t status = cudaMalloc(&data_, bytes);
    if (status != cudaSuccess) {
        (void)cudaGetLastError();
        std::size_t free_bytes = 0, total_bytes = 0;
        (void)cudaMemGetInfo(&free_bytes, &total_bytes);
        throw cuda_error("cuda::device_buffer: cudaMalloc of " + std::to_string(bytes) + " bytes failed (" +
                         cudaGetErrorString(status) + "); the device has " + std::to_string(free_bytes) + " of " +
                         std::to_string(total_bytes) +
                         " bytes free: use fewer micro-batch tokens, recompute, or a plan that shards more");
    }
}
device_buffer::~device_buffer() {
    if (data_) (void)cudaFree(data_);
}
device_buffer& device_buffer::operator=(device_buffer&& other) noexcept {
    if (this != &other) {
        if (data_) (void)cudaFree(data_);
        data_ = other.data_;
        bytes_ = other.bytes_;
        other.data_ = nullptr;
        other.bytes_ = 0;
    }
    return *this;
}

pinned_buffer::pinned_buffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes) LOOM_CUDA_CHECK(cudaMallocHost(&data_, bytes));
}
pinned_buffer::~pinned_buffer() {
    if (data_) (void)cudaFreeHost(data_);
}
pinned_buffer& pinned_buffer::operator=(pinned_buffer&& other) noexcept {
    if (this != &other) {
        if (data_) (void)cudaFreeHost(data_);
        data_ = other.data_;
        bytes_ = other.bytes_;
        other.data_ = nullptr;
        other.bytes_ = 0;
    }
    return *this;
}

void copy_to_device(void* device, const void* host, std::size_t bytes, stream_handle on) {
    if (bytes) LOOM_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, on));
}
void copy_to_host(void* host, const void* device, std::size_t bytes, stream_handle on) {
    if (bytes) LOOM_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, on));
}
void copy_on_device(void* to, const void* from, std::size_t bytes, stream_handle on) {
    if (bytes) LOOM_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, on));
}
void fill_zero(void* device, std::size_t bytes, stream_handle on) {
    if (bytes) LOOM_CUDA_CHECK(cudaMemsetAsync(device, 0, bytes, on));
}

void check_last_launch(const char* kernel) {
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess)
        throw cuda_error(std::string("cuda: launching ") + kernel + " failed: " + cudaGetErrorString(status) +
                         " (a grid or block size, or shared memory, beyond the device's limits)");
}

}  // namespace loom::cuda
