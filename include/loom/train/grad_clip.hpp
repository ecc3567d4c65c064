#pragma once
// Global-norm gradient clipping with torch.nn.utils.clip_grad_norm_ semantics:
//   total = sqrt(sum over every gradient element of g^2)
//   if max_norm / (total + 1e-6) < 1, every gradient is scaled by that factor.
// The norm is accumulated in double in a fixed order, so it is the same whatever the
// thread count.
#include <cmath>
#include <span>
#include <vector>

namespace loom::train {

template <class T>
double global_norm(const std::vector<std::span<T>>& grads) {
    double sum = 0;
    for (const auto& g : grads) {
        double part = 0;
        for (T x : g) part += static_cast<double>(x) * static_cast<double>(x);
        sum += part;
    }
    return std::sqrt(sum);
}

// Returns the norm before clipping.
template <class T>
double clip_global_norm(const std::vector<std::span<T>>& grads, double max_norm) {
    const double total = global_norm(grads);
    const double coefficient = max_norm / (total + 1e-6);
    if (coefficient < 1)
        for (const auto& g : grads)
            for (T& x : g) x = static_cast<T>(x * coefficient);
    return total;
}

}  // namespace loom::train
