#pragma once
// SGD with momentum, with PyTorch's torch.optim.SGD semantics, on the gradient g times a
// scale (global-norm clipping's coefficient, grad_clip.hpp; 1: none):
//   g <- g * scale + wd * p
//   buf <- g                                 on the first step
//   buf <- momentum * buf + (1 - dampening) * g   afterwards
//   p <- p - lr * (nesterov ? g + momentum * buf : buf)
#include <cstdint>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/train/parameter_slot.hpp>

namespace loom::train {

struct sgd_options {
    double lr = 0.1;
    double momentum = 0.9;
    double dampening = 0.0;
    double weight_decay = 0.0;
    bool nesterov = false;
};

template <class T>
class sgd {
public:
    explicit sgd(sgd_options options) : options_(options) {
        if (options.momentum < 0 || options.lr < 0 || options.weight_decay < 0)
            throw usage_error("sgd: lr, momentum and weight_decay must be >= 0");
        if (options.nesterov && (options.momentum <= 0 || options.dampening != 0))
            throw usage_error("sgd: nesterov momentum needs momentum > 0 and dampening == 0");
    }

    void add(parameter_slot<T> slot) {
        momentum_.emplace_back(slot.value.size(), T(0));
        slots_.push_back(std::move(slot));
    }

    // One update of every parameter; `lr` overrides the configured rate (for schedules), and
    // each gradient is multiplied by `grad_scale` as it is read (grad_clip.hpp's clip_scale).
    void step(double lr, double grad_scale = 1.0) {
        const T scale = static_cast<T>(grad_scale);
        const T mu = static_cast<T>(options_.momentum), damp = static_cast<T>(1 - options_.dampening);
        for (std::size_t s = 0; s < slots_.size(); ++s) {
            auto& slot = slots_[s];
            auto& buf = momentum_[s];
            const T wd = slot.weight_decay ? static_cast<T>(options_.weight_decay) : T(0);
            for (std::size_t i = 0; i < slot.value.size(); ++i) {
                T g = slot.grad[i] * scale + wd * slot.value[i];
                T update = g;
                if (options_.momentum != 0) {
                    buf[i] = steps_ == 0 ? g : mu * buf[i] + damp * g;
                    update = options_.nesterov ? g + mu * buf[i] : buf[i];
                }
                slot.value[i] -= static_cast<T>(lr) * update;
            }
        }
        ++steps_;
    }
    void step() { step(options_.lr); }

    std::int64_t steps() const { return steps_; }
    const sgd_options& options() const { return options_; }
    // Checkpointing: the momentum buffer of slot s.
    std::vector<T>& momentum(std::size_t s) { return momentum_.at(s); }
    const std::vector<parameter_slot<T>>& slots() const { return slots_; }
    void set_steps(std::int64_t steps) { steps_ = steps; }

private:
    sgd_options options_;
    std::vector<parameter_slot<T>> slots_;
    std::vector<std::vector<T>> momentum_;
    std::int64_t steps_ = 0;
};

}  // namespace loom::train
