#pragma once
// Runs one device's transfers (partition/transfer.hpp) on the GPU: the device twin of
// runtime/transfer_runner.hpp. Boxes are packed into and unpacked from one device staging
// buffer by region-copy kernels on the compute stream, and the collectives go to a
// device_communicator, which orders them against that stream.
//
// Gradient all-reduces are bucketed (runtime/gradient_buckets.hpp): each is copied into its
// gradient's storage where it is met in the program, and when a bucket's last member has
// been copied, the whole bucket (laid out contiguously by the trainer) starts as one
// all-reduce that overlaps with the rest of the backward. finish() makes the compute stream
// wait for the buckets before anything reads the gradients.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/partition/partitioned_graph.hpp>
#include <loom/runtime/comm/communicator.hpp>
#include <loom/runtime/cuda/device.hpp>
#include <loom/runtime/cuda/device_communicator.hpp>
#include <loom/runtime/cuda/region_copy.hpp>
#include <loom/runtime/gradient_buckets.hpp>
#include <loom/runtime/program.hpp>

namespace loom::cuda {

// Where a bucket lies in device memory: its gradients, back to back (with whatever padding
// the layout put between them, which stays zero).
struct bucket_span {
    void* first = nullptr;
    std::size_t elements = 0;
};

class device_transfer_runner {
public:
    // `spans[b]` is bucket b of `buckets`; the program, plan and communicator outlive the runner.
    device_transfer_runner(const partition::partitioned_graph& plan, const program& p, device_communicator& c,
                           stream_handle compute, gradient_bucket_plan buckets, std::vector<bucket_span> spans)
        : plan_(plan), program_(p), comm_(c), compute_(compute), buckets_(std::move(buckets)), spans_(std::move(spans)) {
        if (spans_.size() != buckets_.buckets.size())
            throw usage_error("cuda::device_transfer_runner: " + std::to_string(buckets_.buckets.size()) +
                              " buckets but " + std::to_string(spans_.size()) + " spans; lay out every bucket");
        // One staging area for the largest transfer: gathers and scatters stage n pieces,
        // all-to-all sends and receives n pieces each, a broadcast root its data.
        std::size_t most = 0;
        for (std::size_t s = 0; s < p.steps.size(); ++s) {
            const partition::transfer* tr = transfer_of_step(p, plan, s);
            if (!tr) continue;
            const std::size_t m = member(*tr, s);
            const auto n = tr->group.size();
            const std::size_t bytes = element_bytes(s);
            std::size_t elements = 0;
            switch (tr->kind) {
                case partition::transfer_kind::all_gather:
                    elements = static_cast<std::size_t>(tr->inputs[m].numel()) * n;
                    break;
                case partition::transfer_kind::reduce_scatter:
                    elements = static_cast<std::size_t>(tr->outputs[m].numel()) * n;
                    break;
                case partition::transfer_kind::all_to_all:
                    elements = 2 * n *
                               static_cast<std::size_t>(partition::intersect(tr->inputs[m], tr->outputs[0]).numel());
                    break;
                case partition::transfer_kind::broadcast:
                    elements = static_cast<std::size_t>(tr->outputs[m].numel());
                    break;
                default: break;
            }
            most = std::max(most, elements * bytes);
        }
        staging_ = device_buffer(std::max<std::size_t>(most, 256));
    }

    // The program step about to run (the executor's before_step hook calls it).
    void at_step(std::size_t s) { step_ = s; }

    // Runs the transfer of the current step (the executor's communication handler).
    void run(const node& n, std::span<void* const> in, std::span<void* const> out) {
        const std::size_t s = step_;
        if (&program_.source->at(program_.steps.at(s).node) != &n)
            throw error("cuda::device_transfer_runner: node '" + n.name + "' runs at step " + std::to_string(s) +
                        " but that step is another node; call at_step before each step");
        const auto id = n.attrs.get<std::int64_t>("transfer");
        const partition::transfer& tr = plan_.transfers.at(static_cast<std::size_t>(id));
        const std::size_t m = member(tr, s);
        const std::size_t bytes = element_bytes(s);
        const comm::dtype type = dtype_of_step(s, bytes);
        const void* input = in.empty() ? nullptr : in[0];
        void* output = out.empty() ? nullptr : out[0];
        const std::int64_t bucket = buckets_.bucket_of_step.at(s);
        if (bucket >= 0) {
            copy_on_device(output, input, static_cast<std::size_t>(tr.outputs[m].numel()) * bytes, compute_);
            if (buckets_.starts_after(s)) {
                const bucket_span& span = spans_[static_cast<std::size_t>(bucket)];
                pending_.push_back(comm_.begin_all_reduce_sum(span.first, span.elements, type,
                                                              comm::group{buckets_.buckets[static_cast<std::size_t>(bucket)].group}));
            }
            return;
        }
        run_one(tr, id, m, input, output, bytes, type);
    }

    // The compute stream waits for every bucket started so far.
    void finish() {
        for (const auto& t : pending_) comm_.wait(t);
        pending_.clear();
    }

    const gradient_bucket_plan& buckets() const { return buckets_; }

private:
    std::size_t member(const partition::transfer& tr, std::size_t s) const {
        const std::size_t m = tr.member(comm_.rank());
        if (m == tr.group.size())
            throw usage_error("cuda::device_transfer_runner: rank " + std::to_string(comm_.rank()) +
                              " is not a member of the transfer at step " + std::to_string(s) + " (" + tr.describe() +
                              "); the device programs do not match the plan");
        return m;
    }

    // Bytes per element of the step's data: index tensors are int32, real ones follow the
    // program's storage (float or bf16, float where the partitioner kept a copy in float).
    std::size_t element_bytes(std::size_t s) const {
        const graph& g = *program_.source;
        const node& n = g.at(program_.steps[s].node);
        const tensor_id t = !n.outputs.empty() ? n.outputs[0] : n.inputs.at(0);
        if (g.tensor(t).kind == value_kind::index) return sizeof(std::int32_t);
        return real_bytes(storage_precision(g, t, program_.prec));
    }

    comm::dtype dtype_of_step(std::size_t s, std::size_t bytes) const {
        const graph& g = *program_.source;
        const node& n = g.at(program_.steps[s].node);
        const tensor_id t = !n.outputs.empty() ? n.outputs[0] : n.inputs.at(0);
        if (g.tensor(t).kind == value_kind::index) return comm::dtype::i32;
        return bytes == 2 ? comm::dtype::bf16 : comm::dtype::f32;
    }

    std::byte* staged(std::size_t offset_elements, std::size_t bytes) const {
        return staging_.as<std::byte>() + offset_elements * bytes;
    }

    void run_one(const partition::transfer& tr, std::int64_t id, std::size_t m, const void* in, void* out,
                 std::size_t bytes, comm::dtype type) {
        using partition::box;
        const comm::group g{tr.group};
        const auto n = tr.group.size();
        switch (tr.kind) {
            case partition::transfer_kind::all_reduce: {
                const auto count = static_cast<std::size_t>(tr.outputs[m].numel());
                copy_on_device(out, in, count * bytes, compute_);
                comm_.all_reduce_sum(out, count, type, g);
                return;
            }
            case partition::transfer_kind::all_gather: {
                const auto count = static_cast<std::size_t>(tr.inputs[m].numel());
                comm_.all_gather(in, staged(0, bytes), count, type, g);
                for (std::size_t j = 0; j < n; ++j)
                    copy_region(staged(j * count, bytes), tr.inputs[j], out, tr.outputs[m], tr.inputs[j], bytes, compute_);
                return;
            }
            case partition::transfer_kind::reduce_scatter: {
                const auto count = static_cast<std::size_t>(tr.outputs[m].numel());
                for (std::size_t j = 0; j < n; ++j)
                    copy_region(in, tr.inputs[m], staged(j * count, bytes), tr.outputs[j], tr.outputs[j], bytes, compute_);
                comm_.reduce_scatter_sum(staged(0, bytes), out, count, type, g);
                return;
            }
            case partition::transfer_kind::all_to_all: {
                const auto count = static_cast<std::size_t>(partition::intersect(tr.inputs[m], tr.outputs[0]).numel());
                std::byte* send = staged(0, bytes);
                std::byte* recv = staged(count * n, bytes);
                for (std::size_t j = 0; j < n; ++j) {
                    const box part = partition::intersect(tr.inputs[m], tr.outputs[j]);
                    copy_region(in, tr.inputs[m], send + j * count * bytes, part, part, bytes, compute_);
                }
                comm_.all_to_all(send, recv, count, type, g);
                for (std::size_t i = 0; i < n; ++i) {
                    const box part = partition::intersect(tr.inputs[i], tr.outputs[m]);
                    copy_region(recv + i * count * bytes, part, out, tr.outputs[m], part, bytes, compute_);
                }
                return;
            }
            case partition::transfer_kind::broadcast: {
                const auto count = static_cast<std::size_t>(tr.outputs[m].numel());
                if (tr.group[m] == tr.root) {
                    // The root's input stays as it is; its output (if it has one) gets the same data.
                    void* data = out ? out : staged(0, bytes);
                    copy_on_device(data, in, count * bytes, compute_);
                    comm_.broadcast(data, count, type, tr.root, g);
                } else {
                    comm_.broadcast(out, count, type, tr.root, g);
                }
                return;
            }
            case partition::transfer_kind::send_recv: {
                // As on the host: transfers between one pair run in the same order on both sides.
                const int tag = static_cast<int>(id % 30000);
                if (m == 0)
                    comm_.send(in, static_cast<std::size_t>(tr.inputs[0].numel()), type, tr.group[1], tag);
                else
                    comm_.recv(out, static_cast<std::size_t>(tr.outputs[1].numel()), type, tr.group[0], tag);
                return;
            }
        }
    }

    const partition::partitioned_graph& plan_;
    const program& program_;
    device_communicator& comm_;
    stream_handle compute_;
    gradient_bucket_plan buckets_;
    std::vector<bucket_span> spans_;
    device_buffer staging_;
    std::vector<device_communicator::ticket> pending_;
    std::size_t step_ = 0;
};

}  // namespace loom::cuda
