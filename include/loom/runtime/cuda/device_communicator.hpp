#pragma once
// Communicators whose buffers are device memory, and what the GPU trainers need of them
// beyond communicator.hpp: the stream that produces and consumes the data, and collectives
// that start now and are waited for later (a gradient bucket reduced while the backward
// goes on, a ZeRO shard gathered while the forward runs).
//
// Two implementations:
//  - nccl_communicator (nccl_communicator.hpp, link loom::nccl): one process per GPU, NCCL
//    on a communication stream beside the compute stream; begin_* overlaps with compute.
//  - staged_communicator (below): any host communicator (the in-process world, MPI) behind
//    device buffers, staged through pinned host memory. begin_* completes before it
//    returns. It lets several ranks share one GPU as threads of one process, which is how
//    the distributed GPU path is tested on a single GPU; it is not a fast path.
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/runtime/comm/communicator.hpp>
#include <loom/runtime/cuda/device.hpp>

namespace loom::cuda {

class device_communicator : public comm::communicator {
public:
    // A collective under way; wait() makes the compute stream wait for it, exactly once.
    struct ticket {
        std::size_t slot = 0;
    };

    // The stream whose work produces the inputs and consumes the outputs of every call.
    virtual void set_stream(stream_handle compute) = 0;

    virtual ticket begin_all_reduce_sum(void* data, std::size_t count, comm::dtype type, const comm::group& g) = 0;
    virtual ticket begin_reduce_scatter_sum(const void* in, void* out, std::size_t count_per_rank, comm::dtype type,
                                            const comm::group& g) = 0;
    // In place when `in` is member m's chunk of `out` (out + m * count_per_rank elements).
    virtual ticket begin_all_gather(const void* in, void* out, std::size_t count_per_rank, comm::dtype type,
                                    const comm::group& g) = 0;
    virtual void wait(ticket t) = 0;

    // Waits on the host, up to the timeout, until everything queued has finished.
    virtual void synchronize() = 0;
};

// A host communicator behind device buffers. Every call waits for the compute stream, copies
// the device data to pinned host memory, runs the host collective, and copies the result
// back before it returns, so the data's bits and the summation order are the host
// communicator's (deterministic, group order).
class staged_communicator final : public device_communicator {
public:
    explicit staged_communicator(comm::communicator& host) : host_(host) {}

    using communicator::all_gather;
    using communicator::all_reduce_sum;
    using communicator::all_to_all;
    using communicator::broadcast;
    using communicator::recv;
    using communicator::reduce_scatter_sum;
    using communicator::send;

    int rank() const override { return host_.rank(); }
    int size() const override { return host_.size(); }
    void set_stream(stream_handle compute) override { compute_ = compute; }

    void all_reduce_sum(void* data, std::size_t count, comm::dtype type, const comm::group& g) override {
        const std::size_t bytes = count * comm::size_of(type);
        staged(data, bytes, data, bytes, [&](std::byte* h, std::byte*) { host_.all_reduce_sum(h, count, type, g); });
    }
    void all_gather(const void* in, void* out, std::size_t count_per_rank, comm::dtype type,
                    const comm::group& g) override {
        // `in` may lie inside `out` (in place): it comes down before anything goes back.
        const std::size_t bytes = count_per_rank * comm::size_of(type);
        staged(in, bytes, out, bytes * static_cast<std::size_t>(g.size()),
               [&](std::byte* h_in, std::byte* h_out) { host_.all_gather(h_in, h_out, count_per_rank, type, g); });
    }
    void reduce_scatter_sum(const void* in, void* out, std::size_t count_per_rank, comm::dtype type,
                            const comm::group& g) override {
        const std::size_t bytes = count_per_rank * comm::size_of(type);
        staged(in, bytes * static_cast<std::size_t>(g.size()), out, bytes, [&](std::byte* h_in, std::byte* h_out) {
            host_.reduce_scatter_sum(h_in, h_out, count_per_rank, type, g);
        });
    }
    void all_to_all(const void* in, void* out, std::size_t count_per_rank, comm::dtype type,
                    const comm::group& g) override {
        const std::size_t all = count_per_rank * comm::size_of(type) * static_cast<std::size_t>(g.size());
        staged(in, all, out, all,
               [&](std::byte* h_in, std::byte* h_out) { host_.all_to_all(h_in, h_out, count_per_rank, type, g); });
    }
    void broadcast(void* data, std::size_t count, comm::dtype type, int root_global_rank,
                   const comm::group& g) override {
        const std::size_t bytes = count * comm::size_of(type);
        staged(data, bytes, data, bytes,
               [&](std::byte* h, std::byte*) { host_.broadcast(h, count, type, root_global_rank, g); });
    }
    void send(const void* data, std::size_t count, comm::dtype type, int dst_global_rank, int tag) override {
        // The host send copies the data before it returns.
        staged(data, count * comm::size_of(type), nullptr, 0,
               [&](std::byte* h, std::byte*) { host_.send(h, count, type, dst_global_rank, tag); });
    }
    void recv(void* data, std::size_t count, comm::dtype type, int src_global_rank, int tag) override {
        staged(nullptr, 0, data, count * comm::size_of(type),
               [&](std::byte*, std::byte* h) { host_.recv(h, count, type, src_global_rank, tag); });
    }
    void barrier(const comm::group& g) override { host_.barrier(g); }
    void abort(std::string reason) override { host_.abort(std::move(reason)); }

    ticket begin_all_reduce_sum(void* data, std::size_t count, comm::dtype type, const comm::group& g) override {
        all_reduce_sum(data, count, type, g);
        return {};
    }
    ticket begin_reduce_scatter_sum(const void* in, void* out, std::size_t count_per_rank, comm::dtype type,
                                    const comm::group& g) override {
        reduce_scatter_sum(in, out, count_per_rank, type, g);
        return {};
    }
    ticket begin_all_gather(const void* in, void* out, std::size_t count_per_rank, comm::dtype type,
                            const comm::group& g) override {
        all_gather(in, out, count_per_rank, type, g);
        return {};
    }
    void wait(ticket) override {}  // every call has finished when it returns
    void synchronize() override { wait_for_compute(); }

private:
    void wait_for_compute() {
        if (compute_) cuda::synchronize_stream(compute_);
        else synchronize_device();
    }

    // Runs `call(host_in, host_out)` on pinned copies: `in_bytes` of `in` come down after the
    // compute stream's work so far, and `out_bytes` go back to `out` before the call returns
    // (so the staging is free for the next call). An in-place call gets one buffer for both.
    // Every call reserves once, for input and output together, so no pointer into the staging
    // outlives a reallocation.
    template <class F>
    void staged(const void* in, std::size_t in_bytes, void* out, std::size_t out_bytes, F&& call) {
        const bool in_place = in == out && in_bytes == out_bytes;
        const std::size_t bytes = in_place ? in_bytes : in_bytes + out_bytes;
        if (bytes > staging_.bytes()) staging_ = pinned_buffer(std::max<std::size_t>(2 * staging_.bytes(), bytes));
        std::byte* h_in = staging_.as<std::byte>();
        std::byte* h_out = in_place ? h_in : h_in + in_bytes;
        if (in_bytes > 0) copy_to_host(h_in, in, in_bytes, compute_);
        wait_for_compute();
        call(h_in, h_out);
        if (out_bytes > 0) copy_to_device(out, h_out, out_bytes, compute_);
        wait_for_compute();
    }

    comm::communicator& host_;
    stream_handle compute_ = nullptr;
    pinned_buffer staging_;
};

}  // namespace loom::cuda
