#pragma once
// Runs a program on one GPU: the same programs the host executor runs (runtime/program.hpp),
// with one device arena for every intermediate (sized by the program's liveness plan), one
// workspace sized once for the kernels that need scratch, caller-bound device storage for
// inputs, parameters, gradients and outputs, and one kernel launch (or a few) per
// instruction on one compute stream. Nothing is allocated while a step runs.
//
// T is the element type of the real tensors: float for programs compiled with precision::f32,
// loom::bfloat16 for precision::bf16 (whose float_outputs stay float; the kernels know
// which). Which op runs which kernel is the table in op_kernels.hpp;
// an op without a CUDA kernel is refused when the executor is built, not midway through a
// step.
//
// By default the MLPs of a program run with fused GEMM epilogues (fusion.hpp): bias + GELU
// in the forward GEMM, GELU gradient + bias gradient in the backward one. The steps a fused
// GEMM absorbs run nothing, and the intermediate it absorbs (the gradient of the GELU's
// output) is never written: nothing reads it, which the plan checks. fusion() tells what was
// fused; executor_options{.fuse = false} runs one kernel per step.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/core/bfloat16.hpp>
#include <loom/core/error.hpp>
#include <loom/runtime/cuda/device.hpp>
#include <loom/runtime/cuda/fusion.hpp>
#include <loom/runtime/cuda/gemm.hpp>
#include <loom/runtime/cuda/op_kernels.hpp>
#include <loom/runtime/program.hpp>

namespace loom::cuda {

// Runs one communication node: the node, its input and output device storage, and the
// compute stream its work must be ordered with.
using communication_handler =
    std::function<void(const node&, std::span<void* const>, std::span<void* const>, stream_handle)>;

struct executor_options {
    bool fuse = true;  // run GELU MLPs with fused GEMM epilogues (fusion.hpp)
    // The backward's dGELU + bias-gradient epilogue too. Off by default: on an H200 (CUDA
    // 13.0) that cuBLASLt epilogue made GPT-2 124M's bf16 step 2 ms slower (40.8 ms) than the
    // GEMM, the GELU gradient and the column sum run apart (38.8 ms).
    bool fuse_backward = false;
};

template <class T>
class executor {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, bfloat16>,
                  "cuda::executor: T must be float (precision::f32) or loom::bfloat16 (precision::bf16)");
    static constexpr precision mine = std::is_same_v<T, float> ? precision::f32 : precision::bf16;

public:
    executor(const program& p, stream_handle compute, gemm_engine& gemm, executor_options options = {})
        : program_(p), compute_(compute), gemm_(gemm) {
        if (p.prec == precision::f16)
            throw usage_error("cuda::executor: the program was compiled for f16, which no loom executor runs (f16 "
                              "is a precision the plan searcher times); compile in bf16 for mixed precision on the "
                              "GPU, or in f32");
        if (p.prec != mine)
            throw usage_error(std::string("cuda::executor: the program was compiled for ") +
                              std::string(to_string(p.prec)) + " but this executor runs " +
                              std::string(to_string(mine)) + "; compile with the matching precision (the GPU runs "
                              "f32 and bf16 programs)");
        const graph& g = *p.source;
        fusion_ = plan_gemm_fusion(p, {.fuse = options.fuse, .fuse_backward = options.fuse_backward});
        // Absorbed steps keep their kernels (and their workspace counts): a fused group runs
        // them one by one when cuBLASLt has no kernel for its epilogue (launch_fused).
        std::size_t workspace = 0;
        kernels_.reserve(p.steps.size());
        std::vector<void*> none;
        for (const auto& step : p.steps) {
            const node& n = g.at(step.node);
            if (n.op->communication) {
                kernels_.push_back(nullptr);
                continue;
            }
            const op_kernel<T>* k = find_op_kernel<T>(n.op->name);
            if (!k)
                throw usage_error("cuda::executor: op '" + std::string(n.op->name) + "' (node '" + n.name +
                                  "') has no CUDA kernel; run this program on the host backend, or add the op to "
                                  "loom/runtime/cuda/op_kernels.hpp");
            kernels_.push_back(k);
            const host::kernel_call<T> call{g, n, none, none, 0};
            if (k->workspace_bytes) workspace = std::max(workspace, k->workspace_bytes(call));
        }
        arena_ = device_buffer(static_cast<std::size_t>(std::max<std::int64_t>(p.arena_bytes, 256)));
        workspace_ = device_buffer(std::max<std::size_t>(workspace, 256));
        pointers_.assign(p.buffers.size(), nullptr);
        for (std::size_t t = 0; t < p.buffers.size(); ++t)
            if (p.buffers[t].where == buffer::place::arena) pointers_[t] = arena_.as<std::byte>() + p.buffers[t].offset;
    }

    executor(const executor&) = delete;
    executor& operator=(const executor&) = delete;

    // Binds device storage (at least the tensor's bytes) to a bound tensor.
    void bind(tensor_id t, void* device_data) {
        const auto& b = program_.buffers.at(static_cast<std::size_t>(t));
        if (b.where != buffer::place::bound)
            throw usage_error("cuda::executor::bind: tensor '" + program_.source->tensor(t).name +
                              "' is not bound by this program (it is an intermediate or unused)");
        pointers_[static_cast<std::size_t>(t)] = device_data;
    }

    void set_communication(communication_handler handler) { communicate_ = std::move(handler); }

    // Called with the step's index just before each step is queued: where a caller makes the
    // compute stream wait for transfers it overlapped (a parameter gathered while earlier
    // steps ran), as late as the program allows.
    //
    // Once per step index, in increasing order. A fused group queues the work of all its steps
    // at its launch step, so there the hook is called for every index up to the group's last
    // step first (indices between included: calling them in order, early, only makes the
    // stream wait earlier); the plan keeps transfers out of that range, so a transfer's
    // handler still runs right after its own hook. The work of an absorbed step before the
    // launch is queued later than its hook, which the contract allows.
    void set_before_step(std::function<void(std::size_t)> hook) { before_step_ = std::move(hook); }

    // Queues every instruction on the compute stream; returns without waiting for the GPU.
    void run(std::uint64_t step_number = 0) {
        for (tensor_id t : program_.bound)
            if (!pointers_[static_cast<std::size_t>(t)])
                throw usage_error("cuda::executor::run: tensor '" + program_.source->tensor(t).name +
                                  "' has no device storage; bind it first");
        const launch_context context{compute_, &gemm_, workspace_.get(), workspace_.bytes()};
        unfused_groups_ = 0;
        std::size_t hooked = 0;  // steps whose hook has been called
        auto hook_through = [&](std::size_t last) {
            for (; hooked <= last; ++hooked)
                if (before_step_) before_step_(hooked);
        };
        for (std::size_t s = 0; s < program_.steps.size(); ++s) {
            hook_through(s);
            const step_fusion& f = fusion_.steps[s];
            if (f.role == step_role::absorbed) continue;
            if (f.role == step_role::launch) {
                const fused_gemm& group = fusion_.groups[static_cast<std::size_t>(f.group)];
                hook_through(group.steps.back());
                launch_fused(group, context, step_number);
                continue;
            }
            launch_step(s, context, step_number);
        }
    }

    // An intermediate a fused GEMM absorbs (fusion().groups[i].absorbed) is never written.
    void* data(tensor_id t) const { return pointers_.at(static_cast<std::size_t>(t)); }
    const program& source() const { return program_; }
    std::size_t device_bytes() const { return arena_.bytes() + workspace_.bytes(); }
    const fusion_plan& fusion() const { return fusion_; }
    // Fused groups the last run queued as separate kernels, because cuBLASLt had no kernel
    // for the fused epilogue at those pointers' alignments (see launch_fused).
    std::size_t unfused_groups() const { return unfused_groups_; }

private:
    void launch_step(std::size_t s, const launch_context& context, std::uint64_t step_number) {
        const graph& g = *program_.source;
        const node& n = g.at(program_.steps[s].node);
        ins_.clear();
        outs_.clear();
        for (tensor_id t : n.inputs) ins_.push_back(pointers_[static_cast<std::size_t>(t)]);
        for (tensor_id t : n.outputs) outs_.push_back(pointers_[static_cast<std::size_t>(t)]);
        if (!kernels_[s]) {
            if (!communicate_)
                throw usage_error("cuda::executor::run: node '" + n.name +
                                  "' is a transfer between devices; set a communication handler first");
            communicate_(n, ins_, outs_, compute_);
            return;
        }
        kernels_[s]->launch(host::kernel_call<T>{g, n, ins_, outs_, step_number}, context);
    }

    // cuBLASLt picks its epilogue kernels by pointer alignment, known only now (bound tensors
    // are the caller's). Where it has none, the group's steps run one by one here, in program
    // order; the plan placed the launch where their intermediates' bytes are still theirs.
    void launch_fused(const fused_gemm& group, const launch_context& context, std::uint64_t step_number) {
        const gemm_args<T> args = fused_gemm_args<T>(group, pointers_);
        if (gemm_.supported(args)) {
            gemm_.run(args, compute_);
            return;
        }
        ++unfused_groups_;
        for (std::size_t s : group.steps) launch_step(s, context, step_number);
    }

    const program& program_;
    stream_handle compute_;
    gemm_engine& gemm_;
    device_buffer arena_, workspace_;
    std::vector<void*> pointers_;
    std::vector<const op_kernel<T>*> kernels_;
    std::vector<void*> ins_, outs_;
    communication_handler communicate_;
    std::function<void(std::size_t)> before_step_;
    fusion_plan fusion_;
    std::size_t unfused_groups_ = 0;
};

}  // namespace loom::cuda
