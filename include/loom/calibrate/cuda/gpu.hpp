#pragma once
// Calibration of a GPU as a cluster the searcher can plan for (search/hardware.hpp): the
// CUDA counterpart of search::calibrate_host. It times loom's own GPU kernels, so the
// profile says what loom reaches, not what the datasheet promises.
//
//   search::cluster hw = cuda::calibrate_gpu(cuda::calibration_options{.nodes = 4});
//   search::save_cluster(hw, "h100.json");
//
// Measured on the current device (each the best of several timed runs, CUDA events):
// - GEMM: bf16 and float (exact fp32) products of `gemm_size`^3 through the gemm_engine.
//   Where the device is a known part (H100, H200, A100), the datasheet peaks are kept and
//   gemm_efficiency is measured bf16 / peak bf16; elsewhere the measured rates are the
//   peaks and gemm_efficiency is 1.
// - Memory: a device-to-device copy of `copy_bytes` (read + write) gives memory_bandwidth;
//   loom's residual-add kernel over the same bytes, divided by the copy's rate, gives
//   elementwise_efficiency.
// - Memory size: the device's total memory.
// - Rates per op kind (device_profile::rates, bf16): GPT training steps of 2 layers,
//   sequence 1024, vocabulary 50304, at hidden 768 and 1536 (head dims 64 and 128) and
//   batches 1, 2, 4 and 8, each profiled by op kind (train/cuda/step_profile.hpp) with every
//   op its own kernel (no GEMM-epilogue fusion, so that each kind is timed apart). A kind's
//   sample per shape: its mean seconds per instruction against its mean work per instruction
//   (FLOPs for products and attention, else bytes: search::priced_per_flop).
// - Between GPUs of a node: with two or more visible GPUs, a peer copy between GPUs 0 and 1
//   gives the intra-node bandwidth; with one, the known part's link (NVLink) is assumed, and
//   the profile's name says so. Latencies and inter-node links keep the preset's values.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/bfloat16.hpp>
#include <loom/core/error.hpp>
#include <loom/models/gpt.hpp>
#include <loom/runtime/cuda/device.hpp>
#include <loom/runtime/cuda/elementwise.hpp>
#include <loom/runtime/cuda/gemm.hpp>
#include <loom/runtime/cuda/layout.hpp>
#include <loom/search/hardware.hpp>
#include <loom/search/op_rate.hpp>
#include <loom/train/cuda/step_profile.hpp>
#include <loom/train/cuda/trainer.hpp>

namespace loom::cuda {

struct calibration_options {
    int nodes = 1;                 // the profile's node count
    int devices_per_node = 0;      // 0: the GPUs this process sees
    std::int64_t gemm_size = 8192;
    std::size_t copy_bytes = std::size_t{1} << 30;
    int repeats = 5;
    bool op_rates = true;  // measure rates per op kind (about half a minute on an H200)
};

// Milliseconds of the fastest of `repeats` runs of `work` on stream `s`, after one warm-up.
template <class Work>
float best_milliseconds(const stream& s, int repeats, Work&& work) {
    event start(true), stop(true);
    work();
    float best = 1e30f;
    for (int r = 0; r < repeats; ++r) {
        start.record(s);
        work();
        stop.record(s);
        stop.synchronize();
        best = std::min(best, event::elapsed_ms(start, stop));
    }
    return best;
}

// The datasheet part this device is, or a profile with no peaks when it is none we know.
inline search::cluster known_part(const std::string& device_name, int nodes) {
    if (device_name.find("H100") != std::string::npos || device_name.find("H200") != std::string::npos) {
        auto hw = search::dgx_h100(nodes);
        if (device_name.find("H200") != std::string::npos) {
            // H200 SXM: H100's compute with 141 GB of HBM3e at 4.8 TB/s.
            hw.device.name = "H200-SXM-141GB";
            hw.device.memory_bandwidth = 4.8e12;
        }
        return hw;
    }
    if (device_name.find("A100") != std::string::npos) return search::dgx_a100(nodes);
    search::cluster hw = search::dgx_h100(nodes);  // topology only; every device figure is measured
    hw.device = {};
    return hw;
}

// Rates per op kind of loom's bf16 training kernels on the current GPU (see the list above).
inline search::op_rates measure_op_rates(int warmup_steps = 2) {
    struct shape {
        std::int64_t hidden, heads;
    };
    std::vector<search::step_measurement> steps;
    for (const shape sh : {shape{768, 12}, shape{1536, 12}})
        for (const std::int64_t batch : {1, 2, 4, 8}) {
            const models::gpt_config c{
                .layers = 2, .hidden = sh.hidden, .heads = sh.heads, .vocab = 50304, .seq = 1024, .batch = batch};
            trainer t(models::gpt(c).training_graph(), {}, precision::bf16, 0, {.fuse = false});
            std::vector<std::int32_t> tokens(static_cast<std::size_t>(c.batch * c.seq));
            for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>((i * 7919) % 50304);
            train::input_feed feed;
            feed.index["tokens"] = tokens;
            feed.index["targets"] = tokens;
            feed.index["positions"] = models::gpt_positions(c);
            for (int w = 0; w < warmup_steps; ++w) t.step(feed);
            search::step_measurement step = profile_step(t, feed);
            std::erase_if(step, [](const auto& k) { return k.first.ends_with(search::after_program_suffix); });
            steps.push_back(std::move(step));
        }
    return search::op_rates_from_steps(steps);
}

inline search::cluster calibrate_gpu(const calibration_options& options = {}) {
    if (options.nodes < 1 || options.gemm_size < 256 || options.copy_bytes < (std::size_t{1} << 20) ||
        options.repeats < 1)
        throw usage_error("cuda::calibrate_gpu: nodes >= 1, gemm_size >= 256, copy_bytes >= 1 MiB and repeats >= 1 "
                          "are needed; got nodes " + std::to_string(options.nodes) + ", gemm_size " +
                          std::to_string(options.gemm_size) + ", copy_bytes " + std::to_string(options.copy_bytes));
    const int visible = device_count();
    if (visible == 0) throw usage_error("cuda::calibrate_gpu: this machine has no GPU; calibrate the host instead");
    const device_info info = describe(current_device());
    search::cluster hw = known_part(info.name, options.nodes);
    const bool known = hw.device.peak_flops_f16 > 0;

    stream s;
    gemm_engine gemm;
    const std::int64_t n = options.gemm_size;
    const auto elements = static_cast<std::size_t>(n * n);
    device_buffer a(elements * sizeof(float)), b(elements * sizeof(float)), c(elements * sizeof(float));
    fill(a.as<float>(), 0.5f, static_cast<std::int64_t>(elements), s.get());
    fill(b.as<float>(), 0.25f, static_cast<std::int64_t>(elements), s.get());
    const double gemm_flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
    auto product = [&](auto type_tag) {
        using T = decltype(type_tag);
        gemm_args<T> g;
        g.m = g.n = g.k = n;
        g.a = a.as<T>();
        g.b = b.as<T>();
        g.c = c.as<T>();
        gemm.run(g, s.get());
    };
    fill(a.as<bfloat16>(), 0.5f, static_cast<std::int64_t>(elements), s.get());
    fill(b.as<bfloat16>(), 0.25f, static_cast<std::int64_t>(elements), s.get());
    const double bf16_rate = gemm_flops / (1e-3 * best_milliseconds(s, options.repeats, [&] { product(bfloat16{}); }));
    fill(a.as<float>(), 0.5f, static_cast<std::int64_t>(elements), s.get());
    fill(b.as<float>(), 0.25f, static_cast<std::int64_t>(elements), s.get());
    const double f32_rate = gemm_flops / (1e-3 * best_milliseconds(s, options.repeats, [&] { product(float{}); }));

    const std::size_t bytes = options.copy_bytes;
    device_buffer from(bytes), to(bytes);
    fill_zero(from.get(), bytes, s.get());
    const double copy_rate =
        2.0 * static_cast<double>(bytes) /
        (1e-3 * best_milliseconds(s, options.repeats, [&] { copy_on_device(to.get(), from.get(), bytes, s.get()); }));
    // add reads two operands and writes one: 3 x (bytes / 2) for two halves of the buffer.
    const auto half = static_cast<std::int64_t>(bytes / 2 / sizeof(float));
    const double add_rate = 3.0 * static_cast<double>(half) * sizeof(float) /
                            (1e-3 * best_milliseconds(s, options.repeats, [&] {
                                 add(from.as<float>(), from.as<float>() + half, to.as<float>(), half, s.get());
                             }));

    if (known) {
        hw.device.gemm_efficiency = std::min(1.0, bf16_rate / hw.device.peak_flops_f16);
    } else {
        hw.device.name = info.name;
        hw.device.peak_flops_f16 = bf16_rate;
        hw.device.peak_flops_f32 = f32_rate;
        hw.device.gemm_efficiency = 1.0;
    }
    hw.device.memory_bandwidth = copy_rate;
    hw.device.elementwise_efficiency = std::min(1.0, add_rate / copy_rate);
    hw.device.memory_bytes = static_cast<double>(info.memory_bytes);
    hw.topo.devices_per_node = options.devices_per_node > 0 ? options.devices_per_node : visible;
    hw.topo.nodes = options.nodes;

    std::string link = "link assumed from the datasheet";
    if (visible >= 2) {
        device_buffer peer_from(bytes);
        set_device(1);
        device_buffer peer_to(bytes);
        set_device(info.ordinal);
        const double peer_rate = static_cast<double>(bytes) /
                                 (1e-3 * best_milliseconds(s, options.repeats, [&] {
                                      copy_on_device(peer_to.get(), peer_from.get(), bytes, s.get());
                                  }));
        hw.topo.intra_node.bandwidth = peer_rate;
        link = "link measured between GPUs 0 and 1";
    }
    if (options.op_rates) hw.device.rates[precision::bf16] = measure_op_rates();
    hw.name = info.name + " x" + std::to_string(hw.topo.devices_per_node) + " x" + std::to_string(options.nodes) +
              " nodes (calibrated; " + link + (options.op_rates ? "; rates per op kind in bf16" : "") + ")";
    return hw;
}

}  // namespace loom::cuda
