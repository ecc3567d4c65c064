#pragma once
// Single-device training on the host backend: one compiled program (forward + backward),
// parameters initialised from their seeded streams, an optimizer, optional global-norm
// clipping and a learning-rate schedule. Inputs are fed by tensor name every step.
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/runtime/compile.hpp>
#include <loom/runtime/host/bound_storage.hpp>
#include <loom/runtime/host/executor.hpp>
#include <loom/train/adamw.hpp>
#include <loom/train/grad_clip.hpp>
#include <loom/train/init.hpp>
#include <loom/train/lr_schedule.hpp>
#include <loom/train/sgd.hpp>

namespace loom::train {

struct trainer_options {
    std::variant<adamw_options, sgd_options> optimizer = adamw_options{};
    lr_schedule schedule{};         // schedule.peak is the learning rate
    double clip_norm = 1.0;         // <= 0: no clipping
    std::uint64_t init_seed = 1234;
};

// Inputs for one step, by tensor name.
struct input_feed {
    std::map<std::string, std::span<const std::int32_t>> index;
    std::map<std::string, std::span<const double>> real;
};

struct step_result {
    double loss = 0;
    double grad_norm = 0;  // before clipping
    double lr = 0;
    double seconds = 0;
};

template <class T>
class trainer {
public:
    static constexpr precision prec = std::is_same_v<T, float> ? precision::f32 : precision::f64;

    trainer(graph g, trainer_options options) : graph_(std::make_unique<graph>(std::move(g))), options_(options) {
        if (graph_->loss == no_id) throw usage_error("trainer: the graph has no loss; call graph_builder::set_loss");
        if (graph_->gradients.empty())
            throw usage_error("trainer: the graph has no backward pass; call build_backward before training");
        program_ = compile_program(*graph_, {.prec = prec});
        executor_ = std::make_unique<host::executor<T>>(program_);
        storage_ = std::make_unique<host::bound_storage<T>>(program_);
        storage_->bind_to(*executor_);
        for (tensor_id p : graph_->parameters) {
            const tensor_desc& d = graph_->tensor(p);
            initialize(storage_->real(p), d.init, options_.init_seed, d.name);
        }
        std::visit([&](const auto& o) { make_optimizer(o); }, options_.optimizer);
        for (auto [param, grad] : graph_->gradients) grads_.push_back(storage_->real(grad));
    }

    // The executor keeps references into this object.
    trainer(const trainer&) = delete;
    trainer& operator=(const trainer&) = delete;

    // With a profile, also times each kernel of the program and, as the kinds
    // "gradient_norm" and "optimizer" (which clips as it reads the gradients), the two host
    // loops after it.
    step_result step(const input_feed& feed, host::op_profile* profile = nullptr) {
        auto start = std::chrono::steady_clock::now();
        set_inputs(feed);
        executor_->set_profile(profile);
        executor_->run(static_cast<std::uint64_t>(steps_));
        executor_->set_profile(nullptr);
        step_result r;
        r.loss = static_cast<double>(storage_->real(graph_->loss)[0]);
        auto phase = std::chrono::steady_clock::now();
        const auto close_phase = [&](std::string_view kind) {
            const auto now = std::chrono::steady_clock::now();
            if (profile) profile->add(kind, std::chrono::duration<double>(now - phase).count(), 0.0);
            phase = now;
        };
        r.grad_norm = global_norm(grads_);
        close_phase("gradient_norm");
        r.lr = options_.schedule.at(steps_);
        const double scale = clip_scale(r.grad_norm, options_.clip_norm);
        std::visit([&](auto& opt) { opt.step(r.lr, scale); }, *optimizer_);
        close_phase("optimizer");
        ++steps_;
        r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return r;
    }

    // The loss of a forward + backward pass without updating anything.
    double evaluate(const input_feed& feed) {
        set_inputs(feed);
        executor_->run(static_cast<std::uint64_t>(steps_));
        return static_cast<double>(storage_->real(graph_->loss)[0]);
    }

    std::span<T> parameter(std::string_view name) { return storage_->real(find(name, tensor_role::parameter)); }
    // The gradient of the last pass, before clipping: the optimizer applies the clipping
    // coefficient as it reads the gradients.
    std::span<T> gradient(std::string_view name) {
        tensor_id p = find(name, tensor_role::parameter);
        for (auto [param, grad] : graph_->gradients)
            if (param == p) return storage_->real(grad);
        throw usage_error("trainer: parameter '" + std::string(name) + "' has no gradient");
    }

    const graph& ir() const { return *graph_; }
    const program& compiled() const { return program_; }
    std::int64_t steps() const { return steps_; }
    void set_steps(std::int64_t s) { steps_ = s; }
    auto& optimizer() { return *optimizer_; }
    const trainer_options& options() const { return options_; }

private:
    template <class Options>
    void make_optimizer(const Options& o) {
        using opt_t = std::conditional_t<std::is_same_v<Options, adamw_options>, adamw<T>, sgd<T>>;
        Options with_lr = o;
        with_lr.lr = options_.schedule.peak;
        optimizer_ = std::make_unique<std::variant<adamw<T>, sgd<T>>>(std::in_place_type<opt_t>, with_lr);
        for (auto [param, grad] : graph_->gradients) {
            const tensor_desc& d = graph_->tensor(param);
            std::visit(
                [&](auto& opt) {
                    opt.add({d.name, storage_->real(param), storage_->real(grad), d.dims.rank() >= 2});
                },
                *optimizer_);
        }
    }

    void set_inputs(const input_feed& feed) {
        for (tensor_id t : graph_->inputs) {
            const tensor_desc& d = graph_->tensor(t);
            if (!storage_->has(t)) continue;  // an input the loss does not depend on
            if (d.kind == value_kind::index) {
                auto it = feed.index.find(d.name);
                if (it == feed.index.end())
                    throw usage_error("trainer: no data fed for input '" + d.name + "'; add it to input_feed::index");
                copy_checked(d, it->second, storage_->index(t));
            } else {
                auto it = feed.real.find(d.name);
                if (it == feed.real.end())
                    throw usage_error("trainer: no data fed for input '" + d.name + "'; add it to input_feed::real");
                auto dst = storage_->real(t);
                if (it->second.size() != dst.size()) throw size_mismatch(d, it->second.size());
                for (std::size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<T>(it->second[i]);
            }
        }
    }
    static usage_error size_mismatch(const tensor_desc& d, std::size_t got) {
        return usage_error("trainer: input '" + d.name + "' has shape " + d.dims.to_string() + " (" +
                           std::to_string(d.dims.numel()) + " elements) but " + std::to_string(got) +
                           " were fed; feed one value per element");
    }
    static void copy_checked(const tensor_desc& d, std::span<const std::int32_t> src, std::span<std::int32_t> dst) {
        if (src.size() != dst.size()) throw size_mismatch(d, src.size());
        std::copy(src.begin(), src.end(), dst.begin());
    }
    tensor_id find(std::string_view name, tensor_role role) const {
        for (tensor_id t : graph_->parameters)
            if (graph_->tensor(t).name == name && graph_->tensor(t).role == role) return t;
        throw usage_error("trainer: no parameter named '" + std::string(name) + "'");
    }

    std::unique_ptr<graph> graph_;
    trainer_options options_;
    program program_;
    std::unique_ptr<host::executor<T>> executor_;
    std::unique_ptr<host::bound_storage<T>> storage_;
    std::unique_ptr<std::variant<adamw<T>, sgd<T>>> optimizer_;
    std::vector<std::span<T>> grads_;
    std::int64_t steps_ = 0;
};

}  // namespace loom::train
