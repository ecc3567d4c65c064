#pragma once
// Single-GPU training: the host trainer's contract (train/trainer.hpp: same options, feed
// and step result, parameters initialised from the same seeded streams, so both start from
// the same weights) on the CUDA backend. One device allocation holds every bound tensor
// (parameters, gradients, inputs, the loss), the executor holds the arena and workspace, and
// a step is: inputs up through pinned memory, the program, the global norm and the fused
// AdamW on the device, the loss and norm back. Nothing is allocated inside a step.
//
// precision::bf16 is mixed precision: the program's tensors (parameters as the kernels read
// them, activations, gradients) are bf16 and its arithmetic float; the optimizer keeps float
// master weights and moments and rewrites the bf16 parameters after each update.
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/runtime/compile.hpp>
#include <loom/runtime/cuda/device.hpp>
#include <loom/runtime/cuda/elementwise.hpp>
#include <loom/runtime/cuda/executor.hpp>
#include <loom/runtime/cuda/gemm.hpp>
#include <loom/runtime/cuda/optimizer.hpp>
#include <loom/train/init.hpp>
#include <loom/train/trainer.hpp>

namespace loom::cuda {

class trainer {
public:
    trainer(graph g, train::trainer_options options, precision storage = precision::f32, int device = 0,
            executor_options execution = {})
        : graph_(std::make_unique<graph>(std::move(g))), options_(options), storage_(storage) {
        if (graph_->loss == no_id) throw usage_error("cuda::trainer: the graph has no loss; call graph_builder::set_loss");
        if (graph_->gradients.empty())
            throw usage_error("cuda::trainer: the graph has no backward pass; call build_backward before training");
        const auto* adamw = std::get_if<train::adamw_options>(&options_.optimizer);
        if (!adamw)
            throw usage_error("cuda::trainer: the GPU trainer runs AdamW only; choose train::adamw_options, or train "
                              "with SGD on the host trainer");
        if (storage != precision::f32 && storage != precision::bf16)
            throw usage_error("cuda::trainer: precision " + std::string(to_string(storage)) +
                              " does not run on the GPU; choose precision::f32 or precision::bf16");
        set_device(device);
        stream_ = std::make_unique<stream>();
        gemm_ = std::make_unique<gemm_engine>();
        program_ = compile_program(*graph_, {.prec = storage});
        if (storage == precision::f32)
            executor_f32_ = std::make_unique<executor<float>>(program_, stream_->get(), *gemm_, execution);
        else
            executor_bf16_ = std::make_unique<executor<bfloat16>>(program_, stream_->get(), *gemm_, execution);

        // Bound tensors, each at a 256-byte boundary of one allocation.
        std::size_t total = 0;
        for (tensor_id t : program_.bound) {
            offsets_[t] = total;
            total += (static_cast<std::size_t>(program_.bytes_of(t)) + 255) / 256 * 256;
        }
        bound_ = device_buffer(std::max<std::size_t>(total, 256));
        fill_zero(bound_.get(), bound_.bytes(), stream_->get());
        for (auto& [t, offset] : offsets_) {
            if (executor_f32_) executor_f32_->bind(t, bound_.as<std::byte>() + offset);
            if (executor_bf16_) executor_bf16_->bind(t, bound_.as<std::byte>() + offset);
        }

        // Inputs come through one pinned staging area.
        std::size_t staging = 0;
        for (tensor_id t : graph_->inputs)
            if (offsets_.count(t)) staging += static_cast<std::size_t>(program_.bytes_of(t));
        // The read-back floats (loss, norm, coefficient) follow the inputs at a 4-byte boundary:
        // bf16 inputs of odd size would leave them misaligned.
        staging = (staging + sizeof(float) - 1) / sizeof(float) * sizeof(float);
        staging_ = pinned_buffer(staging + 3 * sizeof(float));

        // Float master weights: the bound parameters themselves in f32, beside them in bf16.
        const bool mixed = storage == precision::bf16;
        std::int64_t master_elements = 0;
        if (mixed)
            for (auto [param, grad] : graph_->gradients) master_elements += graph_->tensor(param).dims.numel();
        masters_ = device_buffer(static_cast<std::size_t>(std::max<std::int64_t>(master_elements, 1)) * sizeof(float));
        std::vector<adamw_tensor> tensors;
        std::vector<const void*> grads;
        std::vector<std::int64_t> numels;
        std::int64_t master_at = 0;
        for (auto [param, grad] : graph_->gradients) {
            const tensor_desc& d = graph_->tensor(param);
            const std::int64_t n = d.dims.numel();
            std::vector<float> host(static_cast<std::size_t>(n));
            train::initialize(std::span<float>(host), d.init, options_.init_seed, d.name);
            float* master = mixed ? masters_.as<float>() + master_at : static_cast<float*>(device_pointer(param));
            copy_to_device(master, host.data(), host.size() * sizeof(float), stream_->get());
            if (mixed) cast(master, static_cast<bfloat16*>(device_pointer(param)), n, stream_->get());
            stream_->synchronize();  // `host` dies at the end of this iteration
            masters_of_[param] = master;
            tensors.push_back({master, device_pointer(grad),
                               mixed ? static_cast<bfloat16*>(device_pointer(param)) : nullptr, n, d.dims.rank() >= 2});
            grads.push_back(device_pointer(grad));
            numels.push_back(n);
            master_at += mixed ? n : 0;
        }
        const grad_type grads_are = mixed ? grad_type::bf16 : grad_type::f32;
        adamw_hyperparameters hyper{static_cast<float>(options_.schedule.peak), static_cast<float>(adamw->beta1),
                                    static_cast<float>(adamw->beta2), static_cast<float>(adamw->eps),
                                    static_cast<float>(adamw->weight_decay)};
        optimizer_ = std::make_unique<fused_adamw>(std::move(tensors), grads_are, hyper);
        norm_ = std::make_unique<global_norm>(std::move(grads), std::move(numels), grads_are);
        scalars_ = device_buffer(2 * sizeof(float));
    }

    trainer(const trainer&) = delete;
    trainer& operator=(const trainer&) = delete;

    train::step_result step(const train::input_feed& feed) {
        const auto start = std::chrono::steady_clock::now();
        set_inputs(feed);
        run_program();
        train::step_result r;
        r.lr = options_.schedule.at(steps_);
        norm_->compute(static_cast<float>(options_.clip_norm), scalars_.as<float>(), stream_->get());
        optimizer_->step(static_cast<float>(r.lr), options_.clip_norm > 0 ? scalars_.as<float>() + 1 : nullptr,
                         stream_->get());
        const auto [loss, norm] = read_loss_and_norm();
        r.loss = loss;
        r.grad_norm = norm;
        ++steps_;
        r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return r;
    }

    // The loss of a forward + backward pass without updating anything.
    double evaluate(const train::input_feed& feed) {
        set_inputs(feed);
        run_program();
        return read_loss_and_norm().first;
    }

    // Float master weights (what the optimizer updates).
    std::vector<float> parameter(std::string_view name) {
        const tensor_id p = find_parameter(name);
        auto found = masters_of_.find(p);
        if (found == masters_of_.end()) return download(p);
        return download_floats(found->second, graph_->tensor(p).dims.numel());
    }
    // The gradient of the last step, widened to float, before clipping: the GPU applies the
    // clip coefficient as the optimizer reads the gradient, where the host trainer scales its
    // gradients in place. The parameters come out the same.
    std::vector<float> gradient(std::string_view name) {
        const tensor_id p = find_parameter(name);
        for (auto [param, grad] : graph_->gradients)
            if (param == p) return download(grad);
        throw usage_error("cuda::trainer: parameter '" + std::string(name) + "' has no gradient");
    }

    const graph& ir() const { return *graph_; }
    const program& compiled() const { return program_; }
    std::int64_t steps() const { return steps_; }
    // Device memory this trainer holds: bound tensors, arena and workspace, optimizer state.
    std::size_t device_bytes() const {
        return bound_.bytes() + masters_.bytes() +
               (executor_f32_ ? executor_f32_->device_bytes() : executor_bf16_->device_bytes()) +
               2 * sizeof(float) * static_cast<std::size_t>(optimizer_->parameter_count());
    }
    stream_handle compute_stream() const { return stream_->get(); }
    // Called before each program step is queued, as executor::set_before_step says (e.g. to
    // record timing events on compute_stream()); nullptr stops it.
    void set_before_step(std::function<void(std::size_t)> hook) {
        if (executor_f32_) executor_f32_->set_before_step(std::move(hook));
        else executor_bf16_->set_before_step(std::move(hook));
    }
    // What the executor fused (cuda/fusion.hpp), e.g. for a benchmark's record.
    const fusion_plan& fusion() const { return executor_f32_ ? executor_f32_->fusion() : executor_bf16_->fusion(); }

private:
    void run_program() {
        if (executor_f32_) executor_f32_->run(static_cast<std::uint64_t>(steps_));
        else executor_bf16_->run(static_cast<std::uint64_t>(steps_));
    }

    void* device_pointer(tensor_id t) const {
        auto found = offsets_.find(t);
        if (found == offsets_.end())
            throw usage_error("cuda::trainer: tensor '" + graph_->tensor(t).name + "' is not bound by the program");
        return bound_.as<std::byte>() + found->second;
    }

    void set_inputs(const train::input_feed& feed) {
        // A step that threw (a missing feed, a refused kernel) may have left copies from the
        // staging area queued; wait for them before overwriting it (a no-op otherwise).
        stream_->synchronize();
        std::size_t at = 0;
        for (tensor_id t : graph_->inputs) {
            if (!offsets_.count(t)) continue;  // an input the loss does not depend on
            const tensor_desc& d = graph_->tensor(t);
            const auto bytes = static_cast<std::size_t>(program_.bytes_of(t));
            std::byte* staged = staging_.as<std::byte>() + at;
            if (d.kind == value_kind::index) {
                auto it = feed.index.find(d.name);
                if (it == feed.index.end())
                    throw usage_error("cuda::trainer: no data fed for input '" + d.name + "'; add it to input_feed::index");
                if (it->second.size() * sizeof(std::int32_t) != bytes) throw size_mismatch(d, it->second.size());
                std::memcpy(staged, it->second.data(), bytes);
            } else {
                auto it = feed.real.find(d.name);
                if (it == feed.real.end())
                    throw usage_error("cuda::trainer: no data fed for input '" + d.name + "'; add it to input_feed::real");
                if (it->second.size() * real_bytes(storage_) != bytes) throw size_mismatch(d, it->second.size());
                for (std::size_t i = 0; i < it->second.size(); ++i) {
                    if (storage_ == precision::bf16)
                        reinterpret_cast<bfloat16*>(staged)[i] = bfloat16(static_cast<float>(it->second[i]));
                    else
                        reinterpret_cast<float*>(staged)[i] = static_cast<float>(it->second[i]);
                }
            }
            copy_to_device(device_pointer(t), staged, bytes, stream_->get());
            at += bytes;
        }
    }

    // Waits for the step; the only host synchronisation of a step.
    std::pair<double, double> read_loss_and_norm() {
        float* host = reinterpret_cast<float*>(staging_.as<std::byte>() + staging_.bytes() - 3 * sizeof(float));
        copy_to_host(host, device_pointer(graph_->loss), sizeof(float), stream_->get());
        copy_to_host(host + 1, scalars_.get(), 2 * sizeof(float), stream_->get());
        stream_->synchronize();
        return {host[0], host[1]};
    }

    std::vector<float> download(tensor_id t) {
        const auto n = static_cast<std::size_t>(graph_->tensor(t).dims.numel());
        if (storage_precision(*graph_, t, storage_) == precision::f32) return download_floats(device_pointer(t), static_cast<std::int64_t>(n));
        std::vector<bfloat16> narrow(n);
        copy_to_host(narrow.data(), device_pointer(t), n * sizeof(bfloat16), stream_->get());
        stream_->synchronize();
        std::vector<float> host(n);
        for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(narrow[i]);
        return host;
    }

    std::vector<float> download_floats(const void* device, std::int64_t n) {
        std::vector<float> host(static_cast<std::size_t>(n));
        copy_to_host(host.data(), device, host.size() * sizeof(float), stream_->get());
        stream_->synchronize();
        return host;
    }

    static usage_error size_mismatch(const tensor_desc& d, std::size_t got) {
        return usage_error("cuda::trainer: input '" + d.name + "' has shape " + d.dims.to_string() + " (" +
                           std::to_string(d.dims.numel()) + " elements) but " + std::to_string(got) +
                           " were fed; feed one value per element");
    }

    tensor_id find_parameter(std::string_view name) const {
        for (tensor_id t : graph_->parameters)
            if (graph_->tensor(t).name == name) return t;
        throw usage_error("cuda::trainer: no parameter named '" + std::string(name) + "'");
    }

    std::unique_ptr<graph> graph_;
    train::trainer_options options_;
    precision storage_;
    std::unique_ptr<stream> stream_;
    std::unique_ptr<gemm_engine> gemm_;
    program program_;
    std::unique_ptr<executor<float>> executor_f32_;
    std::unique_ptr<executor<bfloat16>> executor_bf16_;
    std::map<tensor_id, std::size_t> offsets_;
    std::map<tensor_id, float*> masters_of_;
    device_buffer bound_, scalars_, masters_;
    pinned_buffer staging_;
    std::unique_ptr<fused_adamw> optimizer_;
    std::unique_ptr<global_norm> norm_;
    std::int64_t steps_ = 0;
};

}  // namespace loom::cuda
