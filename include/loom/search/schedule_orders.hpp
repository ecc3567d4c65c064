#pragma once
// Block orders of the three schedule families the searcher times, written out directly.
// The templates in schedule/templates.hpp derive the same schedules from order constraints
// with a list scheduler, which is general but grows quickly with stages x micro-batches
// (1F1B with 16 stages and 1024 micro-batches takes tens of seconds); the searcher visits
// hundreds of such shapes, so it generates them in linear time here.
//
//   gpipe_orders(p, m)        device s: F(s,0..m-1), then B(s,0..m-1)
//   one_f_one_b_orders(p, m)  device s: w = min(p - s, m) forwards, then B(i) followed by
//                             F(w + i) while forwards remain, then the last backwards
//                             (equal to schedule::one_f_one_b, which a test checks)
//   interleaved_orders(p, v, m)  Megatron's interleaved 1F1B (m a multiple of p): device
//                             r runs chunks r, r + p, ..., forward k is micro-batch
//                             (k / (p v)) p + k % p of chunk (k / p) % v, backward k the same
//                             micro-batch of chunk v - 1 - (k / p) % v; it warms up with
//                             min((p - r - 1) 2 + (v - 1) p, m v) forwards, then alternates,
//                             then drains. The ordering differs from the constraint
//                             template's greedy one; tests validate it (schedule::validate).
#include <algorithm>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/schedule/schedule.hpp>
#include <loom/schedule/shape.hpp>

namespace loom::search {

inline schedule::schedule gpipe_orders(int p, int m) {
    schedule::schedule s{schedule::pipeline_shape::linear(p, m), {}, "GPipe"};
    s.device_order.resize(static_cast<std::size_t>(p));
    for (int d = 0; d < p; ++d) {
        auto& order = s.device_order[static_cast<std::size_t>(d)];
        for (int i = 0; i < m; ++i) order.push_back(schedule::forward_block(d, i));
        for (int i = 0; i < m; ++i) order.push_back(schedule::backward_block(d, i));
    }
    return s;
}

inline schedule::schedule one_f_one_b_orders(int p, int m) {
    schedule::schedule s{schedule::pipeline_shape::linear(p, m), {}, "1F1B"};
    s.device_order.resize(static_cast<std::size_t>(p));
    for (int d = 0; d < p; ++d) {
        auto& order = s.device_order[static_cast<std::size_t>(d)];
        const int warmup = std::min(p - d, m);
        for (int i = 0; i < warmup; ++i) order.push_back(schedule::forward_block(d, i));
        for (int i = 0; i < m; ++i) {
            order.push_back(schedule::backward_block(d, i));
            if (warmup + i < m) order.push_back(schedule::forward_block(d, warmup + i));
        }
    }
    return s;
}

inline schedule::schedule interleaved_orders(int p, int v, int m) {
    if (p < 1 || v < 1 || m < 1 || m % p != 0)
        throw usage_error("interleaved_orders: " + std::to_string(m) + " micro-batches over " + std::to_string(p) +
                          " devices; the interleaved schedule needs a positive multiple of the device count");
    schedule::schedule s{schedule::pipeline_shape::interleaved(p, v, m), {}, "interleaved 1F1B"};
    s.device_order.resize(static_cast<std::size_t>(p));
    const int total = m * v;
    const auto micro = [&](int k) { return (k / (p * v)) * p + k % p; };
    for (int r = 0; r < p; ++r) {
        auto& order = s.device_order[static_cast<std::size_t>(r)];
        const auto forward = [&](int k) { return schedule::forward_block(((k / p) % v) * p + r, micro(k)); };
        const auto backward = [&](int k) { return schedule::backward_block((v - 1 - (k / p) % v) * p + r, micro(k)); };
        const int warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
        int f = 0, b = 0;
        for (; f < warmup; ++f) order.push_back(forward(f));
        while (f < total) {
            order.push_back(forward(f++));
            order.push_back(backward(b++));
        }
        while (b < total) order.push_back(backward(b++));
    }
    return s;
}

}  // namespace loom::search
