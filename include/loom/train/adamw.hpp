#pragma once
// AdamW with PyTorch's torch.optim.AdamW semantics (decoupled weight decay):
//   p <- p * (1 - lr * wd)
//   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   p <- p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
#include <cmath>
#include <cstdint>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/runtime/host/thread_pool.hpp>
#include <loom/train/parameter_slot.hpp>

namespace loom::train {

struct adamw_options {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.01;
};

template <class T>
class adamw {
public:
    explicit adamw(adamw_options options) : options_(options) {
        if (!(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1))
            throw usage_error("adamw: betas must lie in [0, 1); got beta1=" + std::to_string(options.beta1) +
                              ", beta2=" + std::to_string(options.beta2));
        if (options.lr < 0 || options.eps <= 0 || options.weight_decay < 0)
            throw usage_error("adamw: lr and weight_decay must be >= 0 and eps > 0");
    }

    void add(parameter_slot<T> slot) {
        m_.emplace_back(slot.value.size(), T(0));
        v_.emplace_back(slot.value.size(), T(0));
        slots_.push_back(std::move(slot));
    }

    void step(double lr) {
        ++steps_;
        const double t = static_cast<double>(steps_);
        const T b1 = static_cast<T>(options_.beta1), b2 = static_cast<T>(options_.beta2);
        const T step_size = static_cast<T>(lr / (1 - std::pow(options_.beta1, t)));
        const T bias2_sqrt = static_cast<T>(std::sqrt(1 - std::pow(options_.beta2, t)));
        const T eps = static_cast<T>(options_.eps);
        for (std::size_t s = 0; s < slots_.size(); ++s) {
            auto& slot = slots_[s];
            T* __restrict m = m_[s].data();
            T* __restrict v = v_[s].data();
            T* __restrict p = slot.value.data();
            const T* __restrict g = slot.grad.data();
            const T decay = slot.weight_decay ? static_cast<T>(1 - lr * options_.weight_decay) : T(1);
            host::parallel_for(0, static_cast<std::int64_t>(slot.value.size()), 1 << 14,
                               [&](std::int64_t lo, std::int64_t hi) {
                                   for (std::int64_t i = lo; i < hi; ++i) {
                                       p[i] *= decay;
                                       m[i] = b1 * m[i] + (1 - b1) * g[i];
                                       v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
                                       p[i] -= step_size * m[i] / (std::sqrt(v[i]) / bias2_sqrt + eps);
                                   }
                               });
        }
    }
    void step() { step(options_.lr); }

    std::int64_t steps() const { return steps_; }
    void set_steps(std::int64_t steps) { steps_ = steps; }
    const adamw_options& options() const { return options_; }
    std::vector<T>& first_moment(std::size_t s) { return m_.at(s); }
    std::vector<T>& second_moment(std::size_t s) { return v_.at(s); }
    const std::vector<parameter_slot<T>>& slots() const { return slots_; }

private:
    adamw_options options_;
    std::vector<parameter_slot<T>> slots_;
    std::vector<std::vector<T>> m_, v_;
    std::int64_t steps_ = 0;
};

}  // namespace loom::train
