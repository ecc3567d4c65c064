#pragma once
// Runs a program on the host: one arena for intermediates, caller-bound storage for
// inputs, parameters, gradients and outputs, and one kernel call per instruction.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/runtime/host/instruction_trace.hpp>
#include <loom/runtime/host/kernel_table.hpp>
#include <loom/runtime/host/op_profile.hpp>
#include <loom/runtime/program.hpp>

namespace loom::host {

// Runs one communication node (ops::Transfer): the node and its input and output storage.
using communication_handler = std::function<void(const node&, std::span<void* const>, std::span<void* const>)>;

template <class T>
class executor {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "executor: T must be float or double");

public:
    explicit executor(const program& p) : program_(p) {
        constexpr precision mine = std::is_same_v<T, float> ? precision::f32 : precision::f64;
        if (p.prec == precision::f16)
            throw usage_error("executor: the program was compiled for f16, which no loom executor runs (f16 is a "
                              "precision the plan searcher times); compile in f32 or f64 for the host, or in bf16 "
                              "for the GPU's mixed precision");
        if (p.prec != mine)
            throw usage_error(std::string("executor: the program was compiled for ") + std::string(to_string(p.prec)) +
                              " but this executor computes in " + std::string(to_string(mine)) +
                              "; compile with the matching precision");
        arena_.reset(static_cast<std::byte*>(::operator new[](static_cast<std::size_t>(std::max<std::int64_t>(p.arena_bytes, 64)), std::align_val_t{64})));
        pointers_.assign(p.buffers.size(), nullptr);
        for (std::size_t t = 0; t < p.buffers.size(); ++t)
            if (p.buffers[t].where == buffer::place::arena) pointers_[t] = arena_.get() + p.buffers[t].offset;
        kernels_.reserve(p.steps.size());
        for (const auto& step : p.steps) {
            const op_def& op = *p.source->at(step.node).op;
            kernels_.push_back(op.communication ? nullptr : kernel_for<T>(op));
        }
    }

    // Binds caller storage (at least the tensor's bytes) to a bound tensor.
    void bind(tensor_id t, void* data) {
        const auto& b = program_.buffers.at(static_cast<std::size_t>(t));
        if (b.where != buffer::place::bound)
            throw usage_error("executor::bind: tensor '" + program_.source->tensor(t).name +
                              "' is not bound by this program (it is an intermediate or unused)");
        pointers_[static_cast<std::size_t>(t)] = data;
    }

    // Who runs communication nodes; a program that has some cannot run without one.
    void set_communication(communication_handler handler) { communicate_ = std::move(handler); }

    // Times every instruction of the following runs into `profile` (nullptr: stop timing).
    void set_profile(op_profile* profile) { profile_ = profile; }
    // Records when every instruction of the following runs starts and ends (nullptr: stop).
    void set_trace(instruction_trace* trace) { trace_ = trace; }

    void run(std::uint64_t step_number = 0) {
        for (tensor_id t : program_.bound)
            if (!pointers_[static_cast<std::size_t>(t)])
                throw usage_error("executor::run: tensor '" + program_.source->tensor(t).name +
                                  "' has no storage; bind it first");
        const graph& g = *program_.source;
        std::vector<void*> ins, outs;
        for (std::size_t s = 0; s < program_.steps.size(); ++s) {
            const node& n = g.at(program_.steps[s].node);
            const auto started = trace_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
            run_instruction(s, n, step_number, ins, outs);
            if (trace_)
                trace_->entries.push_back({program_.steps[s].node, trace_->since_origin(started),
                                           trace_->since_origin(std::chrono::steady_clock::now())});
        }
    }

    // Storage of any tensor (valid for intermediates only while the tensor is live).
    void* data(tensor_id t) const { return pointers_.at(static_cast<std::size_t>(t)); }
    const program& source() const { return program_; }

private:
    void run_instruction(std::size_t s, const node& n, std::uint64_t step_number, std::vector<void*>& ins,
                         std::vector<void*>& outs) {
        ins.clear();
        outs.clear();
        for (tensor_id t : n.inputs) ins.push_back(pointers_[static_cast<std::size_t>(t)]);
        for (tensor_id t : n.outputs) outs.push_back(pointers_[static_cast<std::size_t>(t)]);
        if (!kernels_[s]) {
            if (!communicate_)
                throw usage_error("executor::run: node '" + n.name +
                                  "' is a transfer between devices; set a communication handler "
                                  "(a distributed runner does) before running a partitioned program");
            communicate_(n, ins, outs);
            return;
        }
        const graph& g = *program_.source;
        kernel_call<T> call{g, n, ins, outs, step_number};
        if (!profile_) {
            kernels_[s](call);
            return;
        }
        const auto start = std::chrono::steady_clock::now();
        kernels_[s](call);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        profile_->add(n.op->name, seconds, n.op->flops ? n.op->flops(g, n) : 0.0);
    }

    struct aligned_delete {
        void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{64}); }
    };
    const program& program_;
    std::unique_ptr<std::byte[], aligned_delete> arena_;
    std::vector<void*> pointers_;
    std::vector<kernel_fn<T>> kernels_;
    communication_handler communicate_;
    op_profile* profile_ = nullptr;
    instruction_trace* trace_ = nullptr;
};

}  // namespace loom::host
