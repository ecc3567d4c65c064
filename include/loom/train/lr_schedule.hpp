#pragma once
// Learning-rate schedule: linear warm-up, then cosine decay to `min_lr` at `total_steps`
// (constant after). With total_steps == 0 the rate is constant after warm-up.
#include <cmath>
#include <cstdint>
#include <numbers>

namespace loom::train {

struct lr_schedule {
    double peak = 1e-3;
    double min_lr = 0.0;
    std::int64_t warmup_steps = 0;
    std::int64_t total_steps = 0;

    // Rate for step `step`, counted from 0.
    double at(std::int64_t step) const {
        if (step < warmup_steps) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
        if (total_steps <= warmup_steps) return peak;
        if (step >= total_steps) return min_lr;
        const double progress =
            static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
        return min_lr + 0.5 * (peak - min_lr) * (1 + std::cos(std::numbers::pi * progress));
    }
};

}  // namespace loom::train
