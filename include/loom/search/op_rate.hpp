#pragma once
// The measured cost of one op kind on one device: seconds per instruction against its units
// of work (its FLOPs when per_flop, else the bytes it reads and writes), at several sizes.
// calibrate/host.hpp measures these for the host backend (price_options::rates), and
// calibrate/cuda/gpu.hpp for a GPU, where they travel in the device's profile
// (device_profile::rates, hardware.hpp).
//
//   op_rate r = op_rate_from_samples({{1e9, 2e-3}, {4e9, 6e-3}}, true);
//   r.seconds(2e9);         // 3.33e-3: interpolated between the points
//   r.least_per_unit();     // 1.33e-12: no instruction of this kind is priced faster
//   r.least_seconds_from(2e9);  // 3.33e-3: no instruction of 2e9 units or more is priced faster
#include <algorithm>
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::search {

// Between points the cost is interpolated; below the smallest it is proportional to the
// work; beyond the largest it grows with the last segment's slope.
struct op_rate {
    std::vector<std::pair<double, double>> points;  // (units, seconds) per instruction, by increasing units
    bool per_flop = true;

    double seconds(double units) const {
        if (points.empty() || units <= 0) return 0;
        if (units <= points.front().first) return points.front().second * units / points.front().first;
        for (std::size_t i = 1; i < points.size(); ++i)
            if (units <= points[i].first) {
                const auto [u0, s0] = points[i - 1];
                const auto [u1, s1] = points[i];
                return u1 > u0 ? s0 + (s1 - s0) * (units - u0) / (u1 - u0) : s1;
            }
        return points.back().second + last_slope() * (units - points.back().first);
    }
    // The least seconds of an instruction of at least `units`: the least of seconds(u) over
    // u >= units. A measured curve need not rise everywhere (a size that ran faster than a
    // smaller one), so an instruction known only to do at least `units` costs this at least.
    // The curve is linear between its points and rises beyond the last, so the least lies at
    // `units` or at a point beyond it.
    double least_seconds_from(double units) const {
        if (points.empty() || units <= 0) return 0;
        double least = seconds(units);
        for (const auto& [u, t] : points)
            if (u >= units) least = std::min(least, t);
        return least;
    }
    // Seconds per unit that no instruction of this kind runs faster than: seconds(u) >= u *
    // this for every u (the curve's points all lie above that line, and it grows at least as
    // fast beyond them).
    double least_per_unit() const {
        double least = last_slope();
        for (const auto& [u, t] : points) least = std::min(least, t / u);
        return std::max(least, 0.0);
    }

    friend bool operator==(const op_rate&, const op_rate&) = default;

private:
    double last_slope() const {
        if (points.size() < 2) return points.empty() ? 0 : points.back().second / points.back().first;
        const auto [u0, s0] = points[points.size() - 2];
        const auto [u1, s1] = points.back();
        return u1 > u0 ? std::max(0.0, (s1 - s0) / (u1 - u0)) : 0.0;
    }
};

// By op kind (op_def::name).
using op_rates = std::map<std::string, op_rate, std::less<>>;

// Whether a kind measured with these FLOPs and bytes (read and written) per instruction is
// priced per FLOP or per byte: per FLOP where it does at least a FLOP a byte (products,
// attention), else per byte (what bounds element-wise ops, reductions and copies, whatever
// their ops count as FLOPs).
inline bool priced_per_flop(double flops, double bytes) { return flops > 0 && flops >= bytes; }

// A curve from measured (units, seconds) samples of one kind, in any order: samples of
// equal work merge into their mean; samples without work (a fill of nothing) are dropped.
// Samples all of one size measured a call's cost, not a rate: the curve stays flat beyond
// it (a second point a million times the work at the same time), instead of pricing a
// million times the work at a million times the cost.
inline op_rate op_rate_from_samples(std::vector<std::pair<double, double>> samples, bool per_flop) {
    std::erase_if(samples, [](const auto& s) { return !(s.first > 0); });
    std::sort(samples.begin(), samples.end());
    op_rate r;
    r.per_flop = per_flop;
    for (std::size_t i = 0; i < samples.size();) {
        std::size_t j = i;
        double seconds = 0;
        for (; j < samples.size() && samples[j].first == samples[i].first; ++j) seconds += samples[j].second;
        r.points.push_back({samples[i].first, seconds / static_cast<double>(j - i)});
        i = j;
    }
    if (r.points.size() == 1) r.points.push_back({r.points[0].first * 1e6, r.points[0].second});
    return r;
}

// What one op kind took in one profiled step: its instructions, their seconds, and their
// work (FLOPs as the ops count them, bytes read and written).
struct kind_measurement {
    double seconds = 0, flops = 0, bytes = 0;
    int instructions = 0;
};

using step_measurement = std::map<std::string, kind_measurement, std::less<>>;

// The suffix of the kind a step profile (train/cuda/step_profile.hpp) charges with the last
// program step and what follows the program (the gradient norm, clipping, AdamW): a mix that
// is no op kind's rate.
inline constexpr std::string_view after_program_suffix = " + norm, clip, AdamW";

// Rates per op kind from profiled steps (of different shapes): in each step a kind's mean
// seconds per instruction against its mean work per instruction is one sample, priced per
// FLOP or per byte as priced_per_flop says.
inline op_rates op_rates_from_steps(const std::vector<step_measurement>& steps) {
    std::map<std::string, std::vector<std::pair<double, double>>, std::less<>> samples;
    std::map<std::string, bool, std::less<>> per_flop;
    for (const step_measurement& step : steps)
        for (const auto& [kind, k] : step) {
            if (k.instructions == 0) continue;
            const bool flops = priced_per_flop(k.flops, k.bytes);
            per_flop[kind] = flops;
            samples[kind].push_back({(flops ? k.flops : k.bytes) / k.instructions, k.seconds / k.instructions});
        }
    op_rates out;
    for (auto& [kind, points] : samples) {
        op_rate r = op_rate_from_samples(std::move(points), per_flop.at(kind));
        if (!r.points.empty()) out.emplace(kind, std::move(r));
    }
    return out;
}

}  // namespace loom::search
