// Tokens per second of one GPT training step (forward, backward, clipping, AdamW) on the
// host backend, beside PyTorch's on the same machine, the same model and the same thread
// count, taking turns in one run; and how far each step is from the machine's limit.
//
//   host_train [--steps 10] [--warmup 3] [--rounds 3] [--out benchmarks/results/host_train.json]
//              [--python auto] [--debian-python /usr/bin/python3] [--no-compile] [--no-torch]
//              [--profile] [--layers L --hidden H --heads A --seq S --batch B [--vocab V]]
// Run from the repository root.
//
// Peers, as users pick them: the newest PyTorch from the package index, eager and under
// torch.compile (--python auto runs benchmarks/torch_peer_env.sh, which creates
// build/torch-venv when it is missing), and Debian's python3-torch as a second column.
// Every peer is one long-lived process (host_train_torch.py --serve): it warms up (and
// compiles) once, then loom and each peer time --steps steps in turn, --rounds times; a
// number is the median over rounds of each round's median step.
//
// The machine's limit: each step's FLOP/s against the measured FMA peak and against loom's
// own GEMM timed alone on the step's GEMM shapes. Model FLOPs per step are 3 x the forward
// FLOPs of gpt_config::forward_flops (GEMMs plus causal attention, 2 FLOPs per
// multiply-add); element-wise work is not counted.
//
// Without the size options it runs the standard set and writes --out (by default
// benchmarks/results/host_train.json, unless --no-torch); with them it runs that one
// configuration and writes a file only when --out is given. --no-torch prints one line
// per configuration, starting with the model's name (and the profile after it with --profile).
// The peers run with OMP_WAIT_POLICY=PASSIVE unless told otherwise: with OpenMP's spinning
// workers PyTorch was 10 to 40x slower here while other programs shared the two cores, which
// says nothing about its kernels.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <loom/loom.hpp>

#include "support/machine.hpp"
#include "support/record.hpp"

using namespace loom;

namespace {




double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

// A PyTorch peer: `sh -c command` with its stdin and stdout on pipes, answering one JSON line
// per request. Its stderr goes where the command sends it.
class peer_process {
public:
    peer_process(std::string label, const std::string& command) : label_(std::move(label)) {
        // Close-on-exec: a later peer must not inherit this one's pipes, or this one's stdin
        // never reaches its end. dup2 below clears the flag on the child's stdin and stdout.
        int to_child[2], from_child[2];
        if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) return;
        pid_ = fork();
        if (pid_ == 0) {
            dup2(to_child[0], STDIN_FILENO);
            dup2(from_child[1], STDOUT_FILENO);
            close(to_child[1]);
            close(from_child[0]);
            execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
            _exit(127);
        }
        close(to_child[0]);
        close(from_child[1]);
        to_ = fdopen(to_child[1], "w");
        from_ = fdopen(from_child[0], "r");
    }
    peer_process(const peer_process&) = delete;
    peer_process& operator=(const peer_process&) = delete;
    ~peer_process() { finish(); }

    // Ends the peer (end of input ends it) and says how it ended.
    std::string finish() {
        if (to_) std::fclose(to_);
        if (from_) std::fclose(from_);
        to_ = from_ = nullptr;
        if (pid_ <= 0) return "not started";
        int status = 0;
        const pid_t waited = waitpid(pid_, &status, 0);
        pid_ = -1;
        if (waited <= 0) return "its exit status is unknown";
        if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
        if (WIFSIGNALED(status)) {
            const int sig = WTERMSIG(status);
            return "killed by signal " + std::to_string(sig) +
                   (sig == SIGKILL ? " (SIGKILL: the kernel's out-of-memory killer, if the machine ran out of "
                                     "memory; every peer holds its model at once, so --debian-python '' or "
                                     "--no-compile runs fewer)"
                                   : "");
        }
        return "ended";
    }

    // The next JSON line the peer prints (other lines are skipped); nothing at its end.
    std::optional<nlohmann::json> read_reply() {
        if (!from_) return std::nullopt;
        std::string line;
        for (int c; (c = std::fgetc(from_)) != EOF;) {
            if (c != '\n') {
                line.push_back(static_cast<char>(c));
                continue;
            }
            if (!line.empty() && line.front() == '{') {
                auto j = nlohmann::json::parse(line, nullptr, false);
                if (!j.is_discarded()) return j;
            }
            line.clear();
        }
        return std::nullopt;
    }

    std::optional<nlohmann::json> request(const char* what) {
        if (!to_) return std::nullopt;
        std::fprintf(to_, "%s\n", what);
        std::fflush(to_);
        return read_reply();
    }

    const std::string& label() const { return label_; }

private:
    std::string label_;
    pid_t pid_ = -1;
    FILE* to_ = nullptr;
    FILE* from_ = nullptr;
};

struct config_case {
    std::string name;
    models::gpt_config gpt;
    int most_steps = 1 << 30;  // a cap on --steps and --warmup for models whose steps take seconds
};

std::string case_name(const models::gpt_config& c) {
    return "gpt-" + std::to_string(c.layers) + "x" + std::to_string(c.hidden) + "-s" + std::to_string(c.seq) + "-b" +
           std::to_string(c.batch);
}

// One loom trainer, kept alive across rounds like the peers' models.
class loom_run {
public:
    explicit loom_run(const models::gpt_config& c) : trainer_(models::gpt(c).training_graph(), options()) {
        tokens_.resize(static_cast<std::size_t>(c.batch * c.seq));
        targets_.resize(tokens_.size());
        for (std::size_t i = 0; i < tokens_.size(); ++i) {
            tokens_[i] = static_cast<std::int32_t>((i * 37 + 11) % static_cast<std::size_t>(c.vocab));
            targets_[i] = static_cast<std::int32_t>((i * 53 + 5) % static_cast<std::size_t>(c.vocab));
        }
        positions_ = models::gpt_positions(c);
        feed_.index["tokens"] = tokens_;
        feed_.index["targets"] = targets_;
        feed_.index["positions"] = positions_;
    }

    // Median step seconds over `steps` steps.
    double timed(int steps) {
        std::vector<double> times;
        for (int s = 0; s < steps; ++s) {
            const train::step_result r = trainer_.step(feed_);
            times.push_back(r.seconds);
            if (!stepped_) first_loss_ = r.loss;
            stepped_ = true;
            final_loss_ = r.loss;
        }
        return median(times);
    }

    double first_loss() const { return first_loss_; }
    double final_loss() const { return final_loss_; }

    host::op_profile profile_one_step() {
        host::op_profile p;
        trainer_.step(feed_, &p);
        return p;
    }

private:
    static train::trainer_options options() {
        train::trainer_options o;
        o.optimizer = train::adamw_options{.weight_decay = 0.1};
        o.schedule.peak = 1e-3;
        return o;
    }
    train::trainer<float> trainer_;
    bool stepped_ = false;
    double first_loss_ = 0, final_loss_ = 0;
    std::vector<std::int32_t> tokens_, targets_, positions_;
    train::input_feed feed_;
};

// FLOP/s of loom's GEMM alone on the GEMM shapes of one training step (each linear layer's
// forward, input-gradient and weight-gradient products, with their multiplicities), best of
// three per shape. Attention's batched products are not included. Measured once per round,
// right after loom's steps, and the median of the rounds kept: one measurement after all
// rounds moved by up to 2.3x between runs on a noisy VM.
double loom_gemm_rate(const models::gpt_config& c) {
    const std::int64_t t = c.batch * c.seq, h = c.hidden, f = c.ffn_size();
    struct shape {
        std::int64_t k, n, count;
    };
    const std::vector<shape> shapes{{h, h, 4 * c.layers}, {h, f, c.layers}, {f, h, c.layers}, {h, c.vocab, 1}};
    double flops = 0, seconds = 0;
    for (const auto& s : shapes) {
        std::vector<float> x(static_cast<std::size_t>(t * s.k), 0.5f), w(static_cast<std::size_t>(s.n * s.k), 0.25f),
            y(static_cast<std::size_t>(t * s.n), 0.0f), dx(x.size()), dw(w.size());
        using host::transpose;
        const auto best = [](auto&& f) {
            f();
            double b = 1e300;
            for (int r = 0; r < 3; ++r) {
                const auto start = std::chrono::steady_clock::now();
                f();
                b = std::min(b, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
            }
            return b;
        };
        const double per = best([&] {
                               host::gemm<float>(transpose::no, transpose::yes, t, s.n, s.k, 1.0f, x.data(), s.k, w.data(),
                                                 s.k, 0.0f, y.data(), s.n);
                           }) +
                           best([&] {
                               host::gemm<float>(transpose::no, transpose::no, t, s.k, s.n, 1.0f, y.data(), s.n, w.data(),
                                                 s.k, 0.0f, dx.data(), s.k);
                           }) +
                           best([&] {
                               host::gemm<float>(transpose::yes, transpose::no, s.n, s.k, t, 1.0f, y.data(), s.n, x.data(),
                                                 s.k, 0.0f, dw.data(), s.k);
                           });
        seconds += per * static_cast<double>(s.count);
        flops += 3 * 2.0 * static_cast<double>(t * s.k * s.n * s.count);
    }
    return flops / seconds;
}

// How many of `peers` PyTorch processes training model c fit in memory at once, beside
// this one (whose model is already built). Each is estimated from above: parameters,
// gradients and AdamW's two moments in float32 (16 bytes a parameter), every layer's saved
// activations (about 17 T h + 2.5 A S T floats for T tokens: the 34sbh + 5as^2b bytes of
// half-precision activation counts), three copies of the logits, and 1.5 GiB for the
// interpreter and libraries; a tenth of the available memory stays free. (A 24 x 1024 GPT's
// compiled peer held 6.5 GB; this says 8.0.) All of them when the memory is unknown.
std::size_t peers_at_once(const models::gpt_config& c, std::size_t peers) {
    const double available = search::detail::available_memory_bytes();  // 0 when unknown
    if (peers == 0 || available <= 0) return std::max<std::size_t>(peers, 1);
    const double tokens = static_cast<double>(c.batch * c.seq);
    const double activations = static_cast<double>(c.layers) *
                               (17.0 * tokens * static_cast<double>(c.hidden) +
                                2.5 * static_cast<double>(c.heads * c.seq) * tokens) * 4;
    const double logits = 3.0 * tokens * static_cast<double>(c.vocab) * 4;
    const double one = 16.0 * static_cast<double>(c.parameter_count()) + activations + logits + 1.5 * (1 << 30);
    const auto fit = static_cast<std::size_t>(0.9 * available / one);
    return std::clamp<std::size_t>(fit, 1, peers);
}

std::string peer_command(const std::string& python, const std::string& script, const models::gpt_config& c, int steps,
                         int warmup, unsigned threads, bool compile, const std::string& log,
                         const std::string& omp_wait_policy) {
    return (omp_wait_policy.empty() ? std::string() : "OMP_WAIT_POLICY=" + omp_wait_policy + " ") + python + " " + script + " --serve --layers " + std::to_string(c.layers) + " --hidden " +
           std::to_string(c.hidden) + " --heads " + std::to_string(c.heads) + " --vocab " + std::to_string(c.vocab) +
           " --seq " + std::to_string(c.seq) + " --batch " + std::to_string(c.batch) + " --steps " +
           std::to_string(steps) + " --warmup " + std::to_string(warmup) + " --threads " + std::to_string(threads) +
           (compile ? " --compile" : "") + " 2>>" + log;
}

}  // namespace

int main(int argc, char** argv) {
    // A peer that dies (out of memory, say) closes its pipe: writing to it must fail and be
    // reported, not end this program with SIGPIPE before it has written anything down.
    std::signal(SIGPIPE, SIG_IGN);
    CLI::App app{"GPT training-step throughput: loom host backend beside PyTorch, and against the machine's peak"};
    int steps = 10, warmup = 3, rounds = 3;
    std::string out, script = "benchmarks/host_train_torch.py", python = "auto", debian_python = "/usr/bin/python3",
                log = "build/host_train_torch.log", omp_wait_policy = "PASSIVE";
    bool no_torch = false, no_compile = false, profile = false;
    std::size_t peers_at_once_option = 0;
    models::gpt_config custom{.layers = 0, .hidden = 0, .heads = 0, .vocab = 256, .seq = 0, .batch = 0};
    app.add_option("--steps", steps, "timed steps per round")->check(CLI::PositiveNumber);
    app.add_option("--warmup", warmup, "untimed steps first (PyTorch compiles in them)")->check(CLI::NonNegativeNumber);
    app.add_option("--rounds", rounds, "turns of loom and each peer")->check(CLI::PositiveNumber);
    app.add_option("--out", out, "JSON file to write (default for the standard set: benchmarks/results/host_train.json)");
    app.add_option("--torch-script", script, "the PyTorch side");
    app.add_option("--python", python,
                   "interpreter with the newest PyTorch; 'auto': benchmarks/torch_peer_env.sh (creates build/torch-venv)");
    app.add_option("--debian-python", debian_python, "second peer (Debian's python3-torch); '' for none");
    app.add_option("--torch-log", log, "where the peers' stderr goes");
    app.add_option("--peer-omp-wait-policy", omp_wait_policy,
                   "OMP_WAIT_POLICY of the peers; '' for OpenMP's default (spinning workers: many times slower "
                   "when other programs share the cores)");
    app.add_flag("--no-torch", no_torch, "measure loom only: one line per configuration");
    app.add_flag("--no-compile", no_compile, "skip the torch.compile peer");
    app.add_flag("--profile", profile, "print the per-op profile of one loom step");
    app.add_option("--peers-at-once", peers_at_once_option,
                   "peers alive at once, each holding its model (default: as many as the available memory holds)")
        ->check(CLI::PositiveNumber);
    app.add_option("--layers", custom.layers, "one configuration: transformer blocks")->check(CLI::PositiveNumber);
    app.add_option("--hidden", custom.hidden, "one configuration: hidden size")->check(CLI::PositiveNumber);
    app.add_option("--heads", custom.heads, "one configuration: attention heads")->check(CLI::PositiveNumber);
    app.add_option("--seq", custom.seq, "one configuration: sequence length")->check(CLI::PositiveNumber);
    app.add_option("--batch", custom.batch, "one configuration: batch size")->check(CLI::PositiveNumber);
    app.add_option("--vocab", custom.vocab, "one configuration: vocabulary size (default 256)")->check(CLI::PositiveNumber);
    CLI11_PARSE(app, argc, argv);

    std::vector<config_case> cases;
    const bool one = custom.layers || custom.hidden || custom.heads || custom.seq || custom.batch;
    if (one) {
        if (!(custom.layers && custom.hidden && custom.heads && custom.seq && custom.batch)) {
            std::fprintf(stderr, "host_train: one configuration needs all of --layers --hidden --heads --seq --batch\n");
            return 2;
        }
        try {
            custom.validate();
        } catch (const std::exception& e) {
            std::fprintf(stderr, "host_train: %s\n", e.what());
            return 2;
        }
        cases.push_back({case_name(custom), custom});
    } else {
        cases = {
            {"gpt-4x128 (demo)", {.layers = 4, .hidden = 128, .heads = 4, .vocab = 256, .seq = 64, .batch = 16}},
            {"gpt-6x256", {.layers = 6, .hidden = 256, .heads = 8, .vocab = 256, .seq = 128, .batch = 8}},
            // GPT-2 small with the vocabulary padded to a multiple of 64 (50257 -> 50304), in both peers.
            {"gpt-12x768 (GPT-2 small)",
             {.layers = 12, .hidden = 768, .heads = 12, .vocab = 50304, .seq = 256, .batch = 4},
             3},
        };
        // A loom-only run must not replace the side-by-side record.
        if (out.empty() && !no_torch) out = "benchmarks/results/host_train.json";
    }

    struct peer_spec {
        std::string label, python;
        bool compile;
    };
    std::vector<peer_spec> peers;
    if (!no_torch) {
        if (python == "auto") {
            std::fprintf(stderr, "host_train: preparing the newest PyTorch (benchmarks/torch_peer_env.sh)...\n");
            python = bench::command_output("benchmarks/torch_peer_env.sh");
            if (python.empty() || python.find('\n') != std::string::npos) {
                std::fprintf(stderr,
                             "host_train: benchmarks/torch_peer_env.sh did not make a PyTorch environment; see its "
                             "messages above, or pass --python /path/to/python with torch installed\n");
                return 1;
            }
        }
        peers.push_back({"torch eager", python, false});
        if (!no_compile) peers.push_back({"torch compile", python, true});
        if (!debian_python.empty()) peers.push_back({"debian torch", debian_python, false});
        std::filesystem::create_directories(std::filesystem::path(log).parent_path());
    }

    const unsigned threads = host::thread_pool::global().size();
    // The peak is measured again before every round of every model and the highest value
    // kept: on a shared machine other work can only lower a measurement, never raise it.
    double peak = host::measure_fma_peak_flops();
    nlohmann::json record;
    std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
    record["date"] = date;
    record["cpu"] = bench::cpu_model();
    record["threads"] = threads;
    record["gemm"] = host::gemm_uses_cblas() ? "OpenBLAS" : "loom kernels";
    record["flops_formula"] = "3 x gpt_config::forward_flops: 2*T*(4h^2 + 2hf) + 2*T*S*h per layer, + 2*T*h*V logits";
    record["commit"] = bench::git_revision();
    record["peer_omp_wait_policy"] = omp_wait_policy.empty() ? "OpenMP default" : omp_wait_policy;
    record["timing"] = std::to_string(rounds) + " rounds taking turns, median over rounds of each round's median of " +
                       std::to_string(steps) +
                       " steps; where a model's peers do not fit in memory at once (peers_at_once), each group of "
                       "them takes its rounds beside rounds of loom's, and loom's median is over all of those";

    if (!no_torch) {
        std::printf("%-26s %11s %13s %13s %13s %8s %7s %7s\n", "model", "loom tok/s", "eager x", "compile x",
                    "debian x", "GFLOP/s", "%peak*", "%gemm");
        std::printf("(x: loom's speed-up over that peer; *: against the peak measured so far, final below)\n");
    }
    for (const auto& c : cases) {
        const double tokens = static_cast<double>(c.gpt.batch * c.gpt.seq);
        const double step_flops = 3 * c.gpt.forward_flops();
        const int case_steps = std::min(steps, c.most_steps), case_warmup = std::min(warmup, c.most_steps);
        loom_run loom(c.gpt);
        loom.timed(case_warmup);

        // The peers run at once, each keeping its model between rounds, unless together they
        // would not fit in the memory available (a 24 x 1024 GPT's three peers ran a 24 GiB
        // machine out of memory): then one after another, each with rounds of its own beside
        // loom's, so that a change in the machine's load still hits both sides of a ratio.
        const std::size_t at_once = peers_at_once_option > 0 ? std::min(peers_at_once_option, std::max<std::size_t>(peers.size(), 1))
                                                             : peers_at_once(c.gpt, peers.size());
        nlohmann::json peer_rows = nlohmann::json::array();
        for (const auto& p : peers) peer_rows.push_back({{"peer", p.label}});
        std::vector<double> loom_rounds, gemm_rounds;
        std::vector<std::vector<double>> peer_rounds(peers.size());
        const std::size_t groups = peers.empty() ? 1 : (peers.size() + at_once - 1) / at_once;
        for (std::size_t group = 0; group < groups; ++group) {
            const std::size_t first = group * at_once, last = std::min(peers.size(), first + at_once);
            std::vector<std::unique_ptr<peer_process>> running(peers.size());
            for (std::size_t i = first; i < last; ++i) {
                const auto& p = peers[i];
                auto proc = std::make_unique<peer_process>(
                    p.label, peer_command(p.python, script, c.gpt, case_steps, case_warmup, threads, p.compile, log,
                                          omp_wait_policy));
                auto ready = proc->read_reply();
                if (!ready || !ready->value("ready", false)) {
                    const std::string why = ready ? ready->dump() : "no answer: " + proc->finish();
                    std::fprintf(stderr, "host_train: peer '%s' did not start (%s); see %s\n", p.label.c_str(),
                                 why.c_str(), log.c_str());
                    peer_rows[i]["error"] = why;
                    continue;
                }
                peer_rows[i]["python"] = p.python;
                peer_rows[i]["ready"] = *ready;
                running[i] = std::move(proc);
            }
            for (int r = 0; r < rounds; ++r) {
                peak = std::max(peak, host::measure_fma_peak_flops());
                loom_rounds.push_back(loom.timed(case_steps));
                if (!no_torch) gemm_rounds.push_back(loom_gemm_rate(c.gpt));
                for (std::size_t i = first; i < last; ++i) {
                    if (!running[i]) continue;
                    auto reply = running[i]->request("run");
                    if (!reply) {
                        // A peer that died (SIGPIPE is ignored, so writing to it fails here
                        // instead of ending this program) loses its column, and says why.
                        const std::string why = running[i]->finish();
                        std::fprintf(stderr, "host_train: peer '%s' stopped answering in round %d: %s; see %s\n",
                                     running[i]->label().c_str(), r + 1, why.c_str(), log.c_str());
                        peer_rows[i]["error"] = "stopped answering in round " + std::to_string(r + 1) + ": " + why;
                        running[i].reset();
                        continue;
                    }
                    if (reply->contains("median_step_seconds")) {
                        peer_rounds[i].push_back((*reply)["median_step_seconds"].get<double>());
                        peer_rows[i]["torch_version"] = reply->value("torch_version", "");
                        peer_rows[i]["first_loss"] = reply->value("first_loss", 0.0);
                        peer_rows[i]["final_loss"] = reply->value("final_loss", 0.0);
                    }
                }
            }
            running.clear();  // these peers exit before the next ones, or the next model, start
        }

        const double loom_step = median(loom_rounds);
        const double achieved = step_flops / loom_step;
        nlohmann::json row{{"model", c.name},
                           {"peers_at_once", at_once},
                           {"layers", c.gpt.layers},
                           {"hidden", c.gpt.hidden},
                           {"heads", c.gpt.heads},
                           {"vocab", c.gpt.vocab},
                           {"seq", c.gpt.seq},
                           {"batch", c.gpt.batch},
                           {"model_gflop_per_step", step_flops / 1e9},
                           {"loom_step_seconds", loom_step},
                           {"loom_step_seconds_per_round", loom_rounds},
                           {"loom_tokens_per_second", tokens / loom_step},
                           {"loom_first_loss", loom.first_loss()},
                           {"loom_final_loss", loom.final_loss()},
                           {"gflops_per_second", achieved / 1e9},
                           {"fraction_of_fma_peak", 0.0}};  // set at the end, against the highest peak
        std::vector<double> ratios(peers.size(), 0.0);
        for (std::size_t i = 0; i < peers.size(); ++i) {
            if (peer_rounds[i].empty()) continue;
            const double s = median(peer_rounds[i]);
            peer_rows[i]["median_step_seconds"] = s;
            peer_rows[i]["step_seconds_per_round"] = peer_rounds[i];
            peer_rows[i]["tokens_per_second"] = tokens / s;
            peer_rows[i]["loom_speedup"] = s / loom_step;
            ratios[i] = s / loom_step;
            // The same model, initialized alike, starts at the same loss (near ln V) on the
            // same tokens. A peer that starts elsewhere trains something else and its time
            // says nothing about its kernels: PyTorch's default initialization once started
            // the peer near 100, its softmax in denormals and its steps 5x slower.
            const double peer_loss = peer_rows[i].value("first_loss", 0.0), loom_loss = loom.first_loss();
            const bool same = peer_loss > 0 && loom_loss > 0 && std::abs(peer_loss - loom_loss) <= 0.05 * loom_loss;
            peer_rows[i]["same_model"] = same;
            if (!same)
                std::fprintf(stderr,
                             "host_train: %s started %s at loss %.3f against loom's %.3f: not the same model; make "
                             "benchmarks/host_train_torch.py build and initialize the model as models/gpt.hpp does\n",
                             peers[i].label.c_str(), c.name.c_str(), peer_loss, loom_loss);
        }
        if (!peers.empty()) row["peers"] = peer_rows;

        if (no_torch) {
            std::printf("%s  loom %.0f tok/s  step %.4f s  %.1f GFLOP/s  %.0f%% of FMA peak (%.1f GFLOP/s, %u threads)\n",
                        c.name.c_str(), tokens / loom_step, loom_step, achieved / 1e9,
                        peak > 0 ? 100 * achieved / peak : 0.0, peak / 1e9, threads);
        } else {
            const double gemm_rate = median(gemm_rounds);
            row["loom_gemm_gflops_same_shapes"] = gemm_rate / 1e9;
            nlohmann::json per_round = nlohmann::json::array();
            for (double rate : gemm_rounds) per_round.push_back(rate / 1e9);
            row["loom_gemm_gflops_same_shapes_per_round"] = per_round;
            row["fraction_of_loom_gemm"] = achieved / gemm_rate;
            const auto ratio_text = [&](const std::string& label) {
                for (std::size_t i = 0; i < peers.size(); ++i)
                    if (peers[i].label == label) {
                        char buf[32];
                        std::snprintf(buf, sizeof buf, "%.2f", ratios[i]);
                        return ratios[i] > 0 ? std::string(buf) : std::string("failed");
                    }
                return std::string("-");
            };
            std::printf("%-26s %11.0f %13s %13s %13s %8.1f %6.0f%% %6.0f%%\n", c.name.c_str(), tokens / loom_step,
                        ratio_text("torch eager").c_str(), ratio_text("torch compile").c_str(),
                        ratio_text("debian torch").c_str(), achieved / 1e9, peak > 0 ? 100 * achieved / peak : 0.0,
                        100 * achieved / gemm_rate);
        }
        if (profile) {
            const host::op_profile p = loom.profile_one_step();
            const double total = p.total_seconds();
            std::printf("  per-op profile of one step of %s (%.4f s in kernels, clipping and AdamW)\n", c.name.c_str(),
                        total);
            std::printf("  %-28s %6s %10s %7s %10s\n", "op", "calls", "seconds", "share", "GFLOP/s");
            nlohmann::json prof = nlohmann::json::array();
            for (const auto& e : p.by_time()) {
                std::printf("  %-28s %6lld %10.5f %6.1f%% %10.1f\n", e.kind.c_str(), static_cast<long long>(e.calls),
                            e.seconds, 100 * e.seconds / total, e.flops > 0 ? e.flops / e.seconds / 1e9 : 0.0);
                prof.push_back({{"op", e.kind}, {"calls", e.calls}, {"seconds", e.seconds}, {"gflop", e.flops / 1e9}});
            }
            row["profile"] = prof;
        }
        std::fflush(stdout);
        record["results"].push_back(row);
    }
    record["fma_peak_gflops"] = peak / 1e9;
    for (auto& row : record["results"])
        row["fraction_of_fma_peak"] = peak > 0 ? row["gflops_per_second"].get<double>() * 1e9 / peak : 0.0;
    if (!no_torch) {
        std::printf("fp32 FMA peak of %u threads (highest of all measurements): %.1f GFLOP/s; against it:\n", threads,
                    peak / 1e9);
        for (const auto& row : record["results"])
            std::printf("  %-26s %5.1f%% of peak\n", row["model"].get<std::string>().c_str(),
                        100 * row["fraction_of_fma_peak"].get<double>());
    }
    if (!out.empty()) {
        bench::write_record(record, out);
        std::fprintf(stderr, "wrote %s\n", out.c_str());
    }
}
