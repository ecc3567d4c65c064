// Tokens per second of one GPT training step (forward, backward, clipping, AdamW) on the
// host backend, beside PyTorch's on the same machine, the same model and the same thread
// count, run one after the other by this program. Writes a JSON record.
//
//   host_train [--steps 10] [--warmup 3] [--threads 2] [--out benchmarks/results/host_train.json]
//              [--torch-script benchmarks/host_train_torch.py] [--python /usr/bin/python3] [--no-torch]
// Run from the repository root.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <loom/loom.hpp>

using namespace loom;

namespace {

std::string command_output(const std::string& command) {
    std::string out;
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
    if (!pipe) return out;
    char buf[4096];
    while (std::size_t n = std::fread(buf, 1, sizeof buf, pipe.get())) out.append(buf, n);
    return out;
}

std::string cpu_model() {
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);)
        if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
    return "unknown";
}

struct config_case {
    std::string name;
    models::gpt_config gpt;
};

double loom_median_step(const models::gpt_config& c, int warmup, int steps) {
    train::trainer_options o;
    o.optimizer = train::adamw_options{.weight_decay = 0.1};
    o.schedule.peak = 1e-3;
    train::trainer<float> t(models::gpt(c).training_graph(), o);
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(c.batch * c.seq)), targets(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = static_cast<std::int32_t>((i * 37 + 11) % static_cast<std::size_t>(c.vocab));
        targets[i] = static_cast<std::int32_t>((i * 53 + 5) % static_cast<std::size_t>(c.vocab));
    }
    auto positions = models::gpt_positions(c);
    train::input_feed feed;
    feed.index["tokens"] = tokens;
    feed.index["targets"] = targets;
    feed.index["positions"] = positions;
    std::vector<double> times;
    for (int s = 0; s < warmup + steps; ++s) {
        auto r = t.step(feed);
        if (s >= warmup) times.push_back(r.seconds);
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"GPT training-step throughput: loom host backend beside PyTorch"};
    int steps = 10, warmup = 3;
    std::string out = "benchmarks/results/host_train.json", script = "benchmarks/host_train_torch.py",
                python = "/usr/bin/python3";
    bool no_torch = false;
    app.add_option("--steps", steps, "timed steps per model");
    app.add_option("--warmup", warmup, "untimed steps first");
    app.add_option("--out", out, "JSON file to write");
    app.add_option("--torch-script", script, "the PyTorch side");
    app.add_option("--python", python, "interpreter that has torch");
    app.add_flag("--no-torch", no_torch, "measure loom only");
    CLI11_PARSE(app, argc, argv);

    const unsigned threads = host::thread_pool::global().size();
    std::vector<config_case> cases{
        {"gpt-4x128 (demo)", {.layers = 4, .hidden = 128, .heads = 4, .vocab = 256, .seq = 64, .batch = 16}},
        {"gpt-6x256", {.layers = 6, .hidden = 256, .heads = 8, .vocab = 256, .seq = 128, .batch = 8}},
    };
    nlohmann::json record;
    std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
    record["date"] = date;
    record["cpu"] = cpu_model();
    record["threads"] = threads;
    record["gemm"] = host::gemm_uses_cblas() ? "OpenBLAS" : "loom kernels";
    std::string commit = command_output("git rev-parse --short HEAD 2>/dev/null");
    if (!commit.empty() && commit.back() == '\n') commit.pop_back();
    record["commit"] = commit;

    std::printf("%-18s %14s %14s %8s\n", "model", "loom tok/s", "torch tok/s", "ratio");
    for (const auto& c : cases) {
        const double tokens = static_cast<double>(c.gpt.batch * c.gpt.seq);
        const double loom_step = loom_median_step(c.gpt, warmup, steps);
        nlohmann::json row{{"model", c.name},
                           {"layers", c.gpt.layers},
                           {"hidden", c.gpt.hidden},
                           {"seq", c.gpt.seq},
                           {"batch", c.gpt.batch},
                           {"loom_step_seconds", loom_step},
                           {"loom_tokens_per_second", tokens / loom_step},
                           {"gflops_per_second", 3 * c.gpt.forward_flops() / loom_step / 1e9}};
        double torch_tps = 0;
        if (!no_torch) {
            std::string cmd = python + " " + script + " --layers " + std::to_string(c.gpt.layers) + " --hidden " +
                              std::to_string(c.gpt.hidden) + " --heads " + std::to_string(c.gpt.heads) + " --vocab " +
                              std::to_string(c.gpt.vocab) + " --seq " + std::to_string(c.gpt.seq) + " --batch " +
                              std::to_string(c.gpt.batch) + " --steps " + std::to_string(steps) + " --warmup " +
                              std::to_string(warmup) + " --threads " + std::to_string(threads) + " 2>/dev/null";
            std::string text = command_output(cmd);
            auto brace = text.find('{');
            if (brace != std::string::npos) {
                auto torch_json = nlohmann::json::parse(text.substr(brace), nullptr, false);
                if (!torch_json.is_discarded()) {
                    torch_tps = torch_json.value("tokens_per_second", 0.0);
                    row["torch"] = torch_json;
                    row["loom_over_torch"] = (tokens / loom_step) / torch_tps;
                }
            }
            if (torch_tps == 0) std::fprintf(stderr, "PyTorch run failed: %s\n", cmd.c_str());
        }
        std::printf("%-18s %14.0f %14.0f %8.2f\n", c.name.c_str(), tokens / loom_step, torch_tps,
                    torch_tps > 0 ? tokens / loom_step / torch_tps : 0.0);
        record["results"].push_back(row);
    }
    std::filesystem::create_directories(std::filesystem::path(out).parent_path());
    std::ofstream(out) << record.dump(2) << "\n";
    std::printf("wrote %s\n", out.c_str());
}
