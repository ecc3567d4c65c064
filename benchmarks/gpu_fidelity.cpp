// How well the searcher's price predicts loom's measured training steps on a GPU, from what
// the GPU script recorded (it runs on any machine: no GPU needed to read the records):
//
//   results/gpu/gpu_profile.json  calibrate_gpu's profile (GEMM efficiency, copy bandwidth,
//                                 rates per op kind)
//   results/gpu/configs.jsonl     gpu_train --profile on several GPT shapes: each step's
//                                 median time, and one step's GPU time, instructions, FLOPs
//                                 and bytes by op kind
//
// Every configuration is priced as one device's program (the plan a single GPU runs), three
// ways:
// - peaks: the profile's peaks and efficiencies alone (op kinds priced by their FLOPs at the
//   calibrated GEMM rate, or their bytes at the copy rate);
// - profile: the profile as it is, with calibrate_gpu's rates per op kind where it has them
//   (device_profile::rates, measured on 2-layer GPTs), which is what loom_plan prices with;
// - records, leave one out: each op kind's seconds per instruction against its work, fitted
//   on the other configurations' profiles only (price_options::rates), so no configuration
//   predicts itself.
// It prints predicted against measured steps, the Spearman rank correlation of each, and
// predicted peak memory against the trainer's device bytes, and writes a JSON record.
//
//   gpu_fidelity [--records benchmarks/results/gpu] [--json out.json]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <loom/models/gpt.hpp>
#include <loom/partition/apply.hpp>
#include <loom/plan/presets.hpp>
#include <loom/search/hardware.hpp>
#include <loom/search/op_rate.hpp>
#include <loom/search/program_price.hpp>

#include "support/rank_statistics.hpp"
#include "support/record.hpp"

using namespace loom;

namespace {


struct configuration {
    models::gpt_config model;
    std::int64_t parameters = 0;
    double measured_step = 0;  // seconds, the median of the timed steps
    double device_bytes = 0;   // what the trainer holds on the device
    search::step_measurement kinds;
};

// Records written before gpu_train named its layers and heads: the layer count is the one
// that gives the run's parameter count, the heads those of a head size of 64 below hidden
// 1536, else 128 (the shapes the GPU script ran).
void infer_layers_and_heads(configuration& c) {
    if (c.model.heads == 0) c.model.heads = c.model.hidden / (c.model.hidden < 1536 ? 64 : 128);
    for (std::int64_t layers = 1; layers <= 256 && c.model.layers == 0; ++layers) {
        models::gpt_config candidate = c.model;
        candidate.layers = layers;
        if (candidate.parameter_count() == c.parameters) c.model.layers = layers;
    }
    if (c.model.layers == 0)
        throw usage_error("gpu_fidelity: a run of " + std::to_string(c.parameters) + " parameters is no GPT of hidden " +
                          std::to_string(c.model.hidden) + " and vocabulary " + std::to_string(c.model.vocab));
}

// The records of configs.jsonl: a "system" line per gpu_train run (its shape and step), then
// that run's "profile" lines.
std::vector<configuration> read_configurations(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw usage_error("gpu_fidelity: cannot read " + path + "; run scripts/gpu/run_all.sh on a GPU first");
    std::vector<configuration> out;
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line.front() != '{') continue;
        const auto j = nlohmann::json::parse(line);
        if (j.contains("system")) {
            configuration c;
            c.model = {.layers = j.value("layers", std::int64_t{0}),
                       .hidden = j.value("hidden", std::int64_t{0}),
                       .heads = j.value("heads", std::int64_t{0}),
                       .vocab = j.value("vocab", std::int64_t{50304}),
                       .seq = j.at("seq").get<std::int64_t>(),
                       .batch = j.at("batch").get<std::int64_t>()};
            c.parameters = j.at("parameters").get<std::int64_t>();
            c.measured_step = j.at("median_step_seconds").get<double>();
            c.device_bytes = j.at("device_bytes").get<double>();
            out.push_back(c);
        } else if (j.contains("profile")) {
            if (out.empty()) throw usage_error("gpu_fidelity: " + path + ": a profile line before any system line");
            configuration& c = out.back();
            if (c.model.hidden == 0) c.model.hidden = j.at("hidden").get<std::int64_t>();
            std::string kind = j.at("op").get<std::string>();
            // The fused forward GEMM does linear_bias's work (its GELU rides in the epilogue);
            // the last step's interval also holds the optimizer, which is priced apart.
            if (kind == "fused GEMM + bias_gelu") kind = "linear_bias";
            if (kind.ends_with(search::after_program_suffix)) continue;
            search::kind_measurement& k = c.kinds[kind];
            k.instructions += j.at("count").get<int>();
            k.seconds += 1e-3 * j.at("ms").get<double>();
            k.flops += 1e9 * j.at("gflop").get<double>();
            k.bytes += 1e6 * j.at("mb").get<double>();
        }
    }
    for (configuration& c : out) {
        if (c.model.layers == 0 || c.model.heads == 0) infer_layers_and_heads(c);
        if (models::gpt_config(c.model).parameter_count() != c.parameters)
            throw usage_error("gpu_fidelity: " + path + ": a run's parameter count " + std::to_string(c.parameters) +
                              " does not match its shape");
    }
    return out;
}

// The rates of every configuration's profile except `left_out`'s.
search::op_rates fit_rates(const std::vector<configuration>& configs, std::size_t left_out) {
    std::vector<search::step_measurement> steps;
    for (std::size_t i = 0; i < configs.size(); ++i)
        if (i != left_out) steps.push_back(configs[i].kinds);
    return search::op_rates_from_steps(steps);
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Predicted against measured GPU training steps, from the GPU script's records"};
    std::string records = "benchmarks/results/gpu", json_out;
    app.add_option("--records", records, "the folder with gpu_profile.json and configs.jsonl");
    app.add_option("--json", json_out, "write the record here");
    CLI11_PARSE(app, argc, argv);

    const search::cluster hw = search::load_cluster(records + "/gpu_profile.json");
    const std::vector<configuration> configs = read_configurations(records + "/configs.jsonl");
    if (configs.size() < 3)
        throw usage_error("gpu_fidelity: " + std::to_string(configs.size()) +
                          " configurations; leaving one out needs at least 3");

    search::price_options o;
    o.storage = precision::bf16;
    o.optimizer_bytes_per_element = 12;  // AdamW's moments and a float master copy
    search::cluster peaks_only = hw;
    peaks_only.device.rates.clear();

    std::printf("%s\n%-24s %10s %10s %10s %10s %8s %8s %8s %11s %11s\n", hw.name.c_str(), "GPT (L x hidden, batch)",
                "measured", "peaks", "profile", "records", "peaks/", "profile/", "records/", "memory", "device");
    std::vector<double> measured, by_peaks, by_profile, by_records;
    nlohmann::json rows = nlohmann::json::array();
    for (std::size_t i = 0; i < configs.size(); ++i) {
        const configuration& c = configs[i];
        const auto model = models::gpt(c.model);
        const auto pg = partition::apply_plan(model.ir(), plan::presets::data_parallel(1));
        const search::program_price peaks = search::price_programs(pg, peaks_only, o);
        const search::program_price profile = search::price_programs(pg, hw, o);
        search::price_options fitted = o;
        fitted.rates = fit_rates(configs, i);
        const search::program_price records_price = search::price_programs(pg, hw, fitted);
        const std::string name = std::to_string(c.model.layers) + " x " + std::to_string(c.model.hidden) + ", " +
                                 std::to_string(c.model.batch);
        const double m = c.measured_step;
        std::printf("%-24s %7.2f ms %7.2f ms %7.2f ms %7.2f ms %8.2f %8.2f %8.2f %7.2f GiB %7.2f GiB\n", name.c_str(),
                    m * 1e3, peaks.step_seconds * 1e3, profile.step_seconds * 1e3, records_price.step_seconds * 1e3,
                    peaks.step_seconds / m, profile.step_seconds / m, records_price.step_seconds / m,
                    profile.peak_memory() / (1 << 30), c.device_bytes / (1 << 30));
        measured.push_back(m);
        by_peaks.push_back(peaks.step_seconds);
        by_profile.push_back(profile.step_seconds);
        by_records.push_back(records_price.step_seconds);
        rows.push_back({{"layers", c.model.layers},
                        {"hidden", c.model.hidden},
                        {"heads", c.model.heads},
                        {"batch", c.model.batch},
                        {"measured_step_seconds", m},
                        {"peaks_step_seconds", peaks.step_seconds},
                        {"profile_step_seconds", profile.step_seconds},
                        {"records_leave_one_out_step_seconds", records_price.step_seconds},
                        {"predicted_peak_bytes", profile.peak_memory()},
                        {"trainer_device_bytes", c.device_bytes}});
    }
    const double rho_peaks = bench::spearman(by_peaks, measured), rho_profile = bench::spearman(by_profile, measured),
                 rho_records = bench::spearman(by_records, measured);
    std::printf("Spearman rank correlation with the measured steps: peaks %.3f, profile %.3f, records %.3f\n", rho_peaks,
                rho_profile, rho_records);
    if (!json_out.empty()) {
        nlohmann::json record;
        record["benchmark"] = "gpu_fidelity";
        record["profile"] = hw.name;
        record["rows"] = rows;
        record["profile_has_rates"] = !hw.device.rates.empty();
        record["spearman_peaks"] = rho_peaks;
        record["spearman_profile"] = rho_profile;
        record["spearman_records"] = rho_records;
        bench::write_record(record, json_out);
    }
    return 0;
}
