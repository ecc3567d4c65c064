#pragma once
// Runs one device's part of a transfer (partition/transfer.hpp) on a communicator: packs
// the boxes a collective moves into contiguous buffers, calls the collective, and unpacks
// what arrived into the output piece. Backend-neutral: it only copies host memory, so the
// host executor uses it as is; a device backend packs with kernels of its own.
#include <cstdint>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/partition/region_copy.hpp>
#include <loom/partition/transfer.hpp>
#include <loom/runtime/comm/communicator.hpp>

namespace loom {

namespace detail {

template <class E>
void run_transfer_typed(const partition::transfer& tr, std::int64_t id, int rank, comm::communicator& c,
                        const void* in_raw, void* out_raw, std::vector<E>& staging) {
    using partition::box;
    const std::size_t m = tr.member(rank);
    if (m == tr.group.size())
        throw usage_error("transfer " + std::to_string(id) + " (" + tr.describe() + "): rank " + std::to_string(rank) +
                          " is not a member; the device programs do not match the plan");
    const comm::group g{tr.group};
    const auto n = tr.group.size();
    const E* in = static_cast<const E*>(in_raw);
    E* out = static_cast<E*>(out_raw);
    constexpr comm::dtype type = comm::dtype_of<E>();
    switch (tr.kind) {
        case partition::transfer_kind::all_reduce: {
            const auto count = static_cast<std::size_t>(tr.outputs[m].numel());
            std::copy(in, in + count, out);
            c.all_reduce_sum(out, count, type, g);
            return;
        }
        case partition::transfer_kind::all_gather: {
            const auto count = static_cast<std::size_t>(tr.inputs[m].numel());
            staging.resize(count * n);
            c.all_gather(in, staging.data(), count, type, g);
            for (std::size_t j = 0; j < n; ++j)
                partition::copy_region(staging.data() + j * count, tr.inputs[j], out, tr.outputs[m], tr.inputs[j]);
            return;
        }
        case partition::transfer_kind::reduce_scatter: {
            const auto count = static_cast<std::size_t>(tr.outputs[m].numel());
            staging.resize(count * n);
            for (std::size_t j = 0; j < n; ++j)
                partition::copy_region(in, tr.inputs[m], staging.data() + j * count, tr.outputs[j], tr.outputs[j]);
            c.reduce_scatter_sum(staging.data(), out, count, type, g);
            return;
        }
        case partition::transfer_kind::all_to_all: {
            const auto count = static_cast<std::size_t>(partition::intersect(tr.inputs[m], tr.outputs[0]).numel());
            staging.resize(2 * count * n);
            E* send = staging.data();
            E* recv = staging.data() + count * n;
            for (std::size_t j = 0; j < n; ++j) {
                const box part = partition::intersect(tr.inputs[m], tr.outputs[j]);
                partition::copy_region(in, tr.inputs[m], send + j * count, part, part);
            }
            c.all_to_all(send, recv, count, type, g);
            for (std::size_t i = 0; i < n; ++i) {
                const box part = partition::intersect(tr.inputs[i], tr.outputs[m]);
                partition::copy_region(recv + i * count, part, out, tr.outputs[m], part);
            }
            return;
        }
        case partition::transfer_kind::broadcast: {
            const auto count = static_cast<std::size_t>(tr.outputs[m].numel());
            if (tr.group[m] == tr.root) {
                staging.assign(in, in + count);
                c.broadcast(staging.data(), count, type, tr.root, g);
            } else {
                c.broadcast(out, count, type, tr.root, g);
            }
            return;
        }
        case partition::transfer_kind::send_recv: {
            // Transfers between one pair run in the same order on both sides, so a tag that
            // repeats every 30000 transfers cannot pair the wrong messages.
            const int tag = static_cast<int>(id % 30000);
            if (m == 0)
                c.send(in, static_cast<std::size_t>(tr.inputs[0].numel()), type, tr.group[1], tag);
            else
                c.recv(out, static_cast<std::size_t>(tr.outputs[1].numel()), type, tr.group[0], tag);
            return;
        }
    }
}

}  // namespace detail

// Scratch buffers reused across transfers of one executor.
template <class T>
struct transfer_scratch {
    std::vector<T> real;
    std::vector<std::int32_t> index;
};

// Runs this rank's part of transfer `id`. `in` / `out`: the node's input and output storage
// (absent where the member sends or receives nothing).
template <class T>
void run_transfer(const partition::transfer& tr, std::int64_t id, comm::communicator& c, const void* in, void* out,
                  transfer_scratch<T>& scratch) {
    if (tr.values == value_kind::index)
        detail::run_transfer_typed<std::int32_t>(tr, id, c.rank(), c, in, out, scratch.index);
    else
        detail::run_transfer_typed<T>(tr, id, c.rank(), c, in, out, scratch.real);
}

}  // namespace loom
