#pragma once
// The CUDA backend's view of a GPU: devices, streams, events and device memory, as plain
// C++ declarations. The definitions live in loom::cuda (src/cuda/), compiled where the CUDA
// toolkit is found, so code that includes this header needs no CUDA headers of its own.
// Reach it through <loom/runtime/cuda_gate.hpp> in code that must also build without CUDA.
//
//   loom::cuda::stream compute;                        // a non-blocking stream
//   loom::cuda::device_buffer x(bytes);                // cudaMalloc'd, freed on scope exit
//   loom::cuda::copy_to_device(x.get(), host.data(), bytes, compute);
//   compute.synchronize();
//
// Every failing CUDA call throws loom::cuda_error naming the call, the device, the CUDA
// error and what to check.
#include <cstddef>
#include <cstdint>
#include <string>

#include <loom/core/error.hpp>

struct CUstream_st;  // = cudaStream_t's pointee
struct CUevent_st;   // = cudaEvent_t's pointee

namespace loom {

// A CUDA runtime, cuBLAS or NCCL call that failed.
struct cuda_error : error {
    using error::error;
};

namespace cuda {

using stream_handle = CUstream_st*;
using event_handle = CUevent_st*;

struct device_info {
    int ordinal = 0;
    std::string name;
    int compute_major = 0, compute_minor = 0;
    int multiprocessors = 0;
    std::int64_t memory_bytes = 0;
    std::int64_t shared_memory_per_block_optin = 0;
};

// GPUs this process can use; 0 (not an error) when there is no GPU or no driver.
int device_count();
device_info describe(int ordinal);
// Makes `ordinal` the calling thread's current device (checks it exists).
void set_device(int ordinal);
int current_device();
// Waits for all work on the current device; throws the first asynchronous error.
void synchronize_device();
// Waits for the work queued on one stream (a null handle: the legacy default stream).
void synchronize_stream(stream_handle on);

class stream {
public:
    stream();  // non-blocking with respect to the legacy default stream
    ~stream();
    stream(const stream&) = delete;
    stream& operator=(const stream&) = delete;
    stream(stream&& other) noexcept : handle_(other.handle_) { other.handle_ = nullptr; }

    stream_handle get() const { return handle_; }
    void synchronize() const;

private:
    stream_handle handle_ = nullptr;
};

// Marks a point in one stream's work so that another stream (or the host) can wait for it.
class event {
public:
    explicit event(bool timing = false);
    ~event();
    event(const event&) = delete;
    event& operator=(const event&) = delete;

    event_handle get() const { return handle_; }
    void record(const stream& on) const;
    void record(stream_handle on) const;
    // Work queued on `waiter` after this call starts only once the recorded work is done.
    void wait_in(const stream& waiter) const;
    void wait_in(stream_handle waiter) const;
    void synchronize() const;
    // Milliseconds between two recorded timing events.
    static float elapsed_ms(const event& start, const event& stop);

private:
    event_handle handle_ = nullptr;
};

// One cudaMalloc'd allocation; the backend makes few of them (one arena per program).
class device_buffer {
public:
    device_buffer() = default;
    explicit device_buffer(std::size_t bytes);
    ~device_buffer();
    device_buffer(const device_buffer&) = delete;
    device_buffer& operator=(const device_buffer&) = delete;
    device_buffer(device_buffer&& other) noexcept : data_(other.data_), bytes_(other.bytes_) {
        other.data_ = nullptr;
        other.bytes_ = 0;
    }
    device_buffer& operator=(device_buffer&& other) noexcept;

    void* get() const { return data_; }
    template <class T>
    T* as() const {
        return static_cast<T*>(data_);
    }
    std::size_t bytes() const { return bytes_; }

private:
    void* data_ = nullptr;
    std::size_t bytes_ = 0;
};

// Page-locked host memory: copies from and to it are truly asynchronous, so feeding a
// step's inputs and reading its loss do not stall the stream.
class pinned_buffer {
public:
    pinned_buffer() = default;
    explicit pinned_buffer(std::size_t bytes);
    ~pinned_buffer();
    pinned_buffer(const pinned_buffer&) = delete;
    pinned_buffer& operator=(const pinned_buffer&) = delete;
    pinned_buffer(pinned_buffer&& other) noexcept : data_(other.data_), bytes_(other.bytes_) {
        other.data_ = nullptr;
        other.bytes_ = 0;
    }
    pinned_buffer& operator=(pinned_buffer&& other) noexcept;

    void* get() const { return data_; }
    template <class T>
    T* as() const {
        return static_cast<T*>(data_);
    }
    std::size_t bytes() const { return bytes_; }

private:
    void* data_ = nullptr;
    std::size_t bytes_ = 0;
};

// Asynchronous on `on` (a null handle means the legacy default stream); host memory that is
// not pinned makes them synchronous, as in CUDA.
void copy_to_device(void* device, const void* host, std::size_t bytes, stream_handle on = nullptr);
void copy_to_host(void* host, const void* device, std::size_t bytes, stream_handle on = nullptr);
void copy_on_device(void* to, const void* from, std::size_t bytes, stream_handle on = nullptr);
void fill_zero(void* device, std::size_t bytes, stream_handle on = nullptr);

// Throws cuda_error if an earlier kernel launch on this thread failed (bad configuration,
// too much shared memory); launch wrappers call it right after each launch.
void check_last_launch(const char* kernel);

}  // namespace cuda
}  // namespace loom
