#pragma once
// Calibration of the host backend as a cluster the searcher can plan for: n in-process
// ranks on this machine. It runs kernels (loom's host GEMM and a streaming copy, timed) and
// writes what it measured into a search profile, so it comes after both runtime and search.
//
//   search::cluster hw = search::calibrate_host(4);   // about 0.3 s
//   search::save_cluster(hw, "host.json");            // or plan with it directly
//
// What is measured and what is assumed:
// - peak_flops_f32: float GEMMs of 512^3 on the whole thread pool, best of three, divided
//   by the ranks (in-process ranks share the cores); gemm_efficiency 1 since this is what
//   loom's kernels reach. No f16 peak: plan in precision::f32.
// - memory_bandwidth: a 64 MiB copy (read + write), best of three, divided by the ranks;
//   elementwise_efficiency 1.
// - memory_bytes: the machine's available memory divided by the ranks.
// - the "intra-node link" is the copy bandwidth of one rank (in-process messages are
//   memory copies) with a 20 us latency per message (a thread hand-off: assumed, not
//   measured). One node, no NICs used.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/models/gpt.hpp>
#include <loom/runtime/compile.hpp>
#include <loom/runtime/host/bound_storage.hpp>
#include <loom/runtime/host/executor.hpp>
#include <loom/runtime/host/gemm.hpp>
#include <loom/runtime/host/op_profile.hpp>
#include <loom/search/hardware.hpp>
#include <loom/search/program_price.hpp>

namespace loom::search {

namespace detail {

template <class F>
double best_seconds(int repeats, F&& f) {
    double best = 1e300;
    for (int r = 0; r < repeats; ++r) {
        const auto start = std::chrono::steady_clock::now();
        f();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return best;
}

// MemAvailable from /proc/meminfo, in bytes (0 when unknown).
inline double available_memory_bytes() {
    std::ifstream in("/proc/meminfo");
    std::string key;
    double kib = 0;
    std::string unit;
    while (in >> key >> kib >> unit)
        if (key == "MemAvailable:") return kib * 1024.0;
    return 0;
}

}  // namespace detail

inline cluster calibrate_host(int ranks) {
    if (ranks < 1)
        throw usage_error("calibrate_host: " + std::to_string(ranks) + " ranks; give the number of in-process ranks, at least 1");
    const std::int64_t n = 512;
    std::vector<float> a(static_cast<std::size_t>(n * n), 1.0f), b(a.size(), 0.5f), c(a.size(), 0.0f);
    const auto run_gemm = [&] {
        host::gemm<float>(host::transpose::no, host::transpose::no, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    };
    run_gemm();  // warm up: pack buffers, thread pool
    const double gemm_seconds = detail::best_seconds(3, run_gemm);
    const double flops = 2.0 * static_cast<double>(n) * n * n / gemm_seconds;

    const std::size_t bytes = 64u << 20;
    std::vector<char> from(bytes, 1), to(bytes, 0);
    const double copy_seconds = detail::best_seconds(3, [&] { std::memcpy(to.data(), from.data(), bytes); });
    const double bandwidth = 2.0 * static_cast<double>(bytes) / copy_seconds;

    cluster hw;
    hw.name = "host x" + std::to_string(ranks) + " (calibrated)";
    hw.device.name = "host rank";
    hw.device.peak_flops_f32 = flops / ranks;
    hw.device.peak_flops_f16 = 0;
    hw.device.memory_bandwidth = bandwidth / ranks;
    const double memory = detail::available_memory_bytes();
    hw.device.memory_bytes = (memory > 0 ? memory : 8.0 * (1ull << 30)) / ranks;
    hw.device.gemm_efficiency = 1.0;
    hw.device.elementwise_efficiency = 1.0;
    hw.topo.devices_per_node = ranks;
    hw.topo.nodes = 1;
    hw.topo.intra_node = {bandwidth / 2.0 / ranks, 20e-6};
    hw.topo.inter_node_per_nic = {bandwidth / 2.0 / ranks, 20e-6};
    hw.topo.nics_per_node = 1;
    return hw;
}

// Rates per op kind of the host backend in float, for `ranks` in-process ranks that share
// this machine (search::price_options::rates). One training step of a small GPT runs at
// batches 1, 2, 4, 8 and 16 with every kernel timed (host::op_profile); for each op kind and
// batch, the mean seconds and units of work (FLOPs for kinds that count them, else bytes read
// and written) of one instruction make a point of its curve. Seconds are per rank: the
// machine's times `ranks`, as in calibrate_host. About two seconds.
inline std::map<std::string, op_rate, std::less<>> calibrate_host_ops(int ranks) {
    if (ranks < 1)
        throw usage_error("calibrate_host_ops: " + std::to_string(ranks) + " ranks; give at least 1");
    std::map<std::string, op_rate, std::less<>> rates;
    for (std::int64_t batch : {1, 2, 4, 8, 16}) {
        const graph g = models::gpt({.layers = 2, .hidden = 128, .heads = 8, .vocab = 256, .seq = 64, .batch = batch})
                            .training_graph();
        const program prog = compile_program(g, {.prec = loom::precision::f32});
        host::executor<float> exec(prog);
        host::bound_storage<float> storage(prog);
        storage.bind_to(exec);
        for (tensor_id t : g.parameters)
            for (float& x : storage.real(t)) x = 0.01f;
        exec.run();  // warm up
        const int runs = 3;
        host::op_profile profile;
        exec.set_profile(&profile);
        for (int r = 0; r < runs; ++r) exec.run();
        exec.set_profile(nullptr);
        std::map<std::string, double, std::less<>> bytes;
        for (const instruction& step : prog.steps) {
            const node& n = g.at(step.node);
            bytes[std::string(n.op->name)] += detail::node_bytes(g, n, loom::precision::f32);
        }
        for (const auto& e : profile.by_time()) {
            if (e.calls == 0) continue;
            op_rate& r = rates[e.kind];
            r.per_flop = e.flops > 0;
            const double calls = static_cast<double>(e.calls);
            const double units = (r.per_flop ? e.flops : bytes[e.kind] * runs) / calls;
            if (units <= 0) continue;
            r.points.push_back({units, e.seconds / calls * ranks});
        }
    }
    // Points by increasing work.
    for (auto& [kind, r] : rates) {
        std::sort(r.points.begin(), r.points.end());
        // Kinds whose work does not grow with the batch (a parameter's gradient sum) give
        // points of equal work: one point, their mean.
        std::vector<std::pair<double, double>> merged;
        int same = 0;
        for (const auto& [u, t] : r.points) {
            if (!merged.empty() && u <= merged.back().first * (1 + 1e-9)) {
                merged.back().second = (merged.back().second * same + t) / (same + 1);
                ++same;
            } else {
                merged.push_back({u, t});
                same = 1;
            }
        }
        r.points = std::move(merged);
    }
    for (auto it = rates.begin(); it != rates.end();) it = it->second.points.empty() ? rates.erase(it) : std::next(it);
    return rates;
}

// How to price plans for `ranks` in-process ranks of this host, in float: one instruction
// at a time per rank, the ranks sharing the machine's cores, every op kind at its measured
// cost (calibrate_host_ops). Pair it with calibrate_host(ranks).
inline price_options host_price_options(int ranks) {
    price_options o;
    o.storage = loom::precision::f32;
    o.overlap = false;
    o.compute_shared_by = ranks;
    o.rates = calibrate_host_ops(ranks);
    return o;
}

}  // namespace loom::search
