// Times loom::host::gemm_fallback against OpenBLAS (cblas_?gemm through the gate header,
// when the build has it) on the same shapes, and writes the table as JSON.
//
//   gemm_benchmark [--out PATH] [--repeats N] [--rounds N] [--isa portable|avx2_fma|avx512f]
//
// Shapes: 1024^3, and the linear layers of a small transformer (tokens T = 4096, d = 128,
// 3d = 384) in forward (Y = X W), backward-data (dX = dY W^T) and backward-weight
// (dW = X^T dY) form, for float and double.
//
// Method: each shape is measured in `rounds` rounds; a round is a pause, a warm-up call and
// `repeats` timed calls of the fallback, then the same for OpenBLAS. The reported time is the
// median over all timed calls. Rounds alternate the two libraries so slow drift of a shared
// host hits both, and the pause lets OpenBLAS's workers stop spinning (they busy-wait for a
// while after each call and would otherwise take a core from the fallback's threads).
// LOOM_NUM_THREADS and OPENBLAS_NUM_THREADS set the thread counts; the JSON records both.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/runtime/host/cblas_gate.hpp"
#include "loom/runtime/host/gemm.hpp"
#include "loom/runtime/host/thread_pool.hpp"
#include "support/machine.hpp"
#include "support/record.hpp"

namespace {

using loom::host::cpu_isa;
using loom::host::transpose;

struct shape {
    const char* name;
    transpose ta;
    transpose tb;
    std::int64_t m, n, k;
};

struct options {
    std::string out = "benchmarks/results/gemm.json";
    int repeats = 7;
    int rounds = 3;
    cpu_isa isa = loom::host::best_cpu_isa();
};

[[noreturn]] void usage_failure(const std::string& why) {
    std::cerr << "gemm benchmark: " << why
              << "\nusage: gemm [--out PATH] [--repeats N] [--rounds N] [--isa portable|avx2_fma|avx512f]\n";
    std::exit(2);
}

options parse_options(int argc, char** argv) {
    options result;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        const auto value = [&]() -> std::string {
            if (i + 1 >= argc) usage_failure(flag + " needs a value");
            return argv[++i];
        };
        const auto positive = [&](const std::string& text) {
            const int parsed = std::atoi(text.c_str());
            if (parsed < 1) usage_failure(flag + " = '" + text + "' is not a positive integer");
            return parsed;
        };
        if (flag == "--out") {
            result.out = value();
        } else if (flag == "--repeats") {
            result.repeats = positive(value());
        } else if (flag == "--rounds") {
            result.rounds = positive(value());
        } else if (flag == "--isa") {
            const std::string name = value();
            bool found = false;
            for (cpu_isa isa : {cpu_isa::portable, cpu_isa::avx2_fma, cpu_isa::avx512f}) {
                if (name == loom::host::to_string(isa)) {
                    result.isa = isa;
                    found = true;
                }
            }
            if (!found) usage_failure("--isa '" + name + "' is not one of portable, avx2_fma, avx512f");
            if (!loom::host::cpu_isa_supported(result.isa)) usage_failure("this CPU cannot run --isa " + name);
        } else if (flag == "--help" || flag == "-h") {
            usage_failure("help requested");
        } else {
            usage_failure("unknown argument '" + flag + "'");
        }
    }
    return result;
}





template <class F>
double seconds_of(F&& call) {
    const auto start = std::chrono::steady_clock::now();
    call();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    const std::size_t middle = values.size() / 2;
    return values.size() % 2 == 1 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

template <class T>
const char* type_name() {
    return sizeof(T) == 4 ? "float" : "double";
}

struct measurement {
    double fallback_seconds = 0;
    std::optional<double> openblas_seconds;
    double max_relative_difference = 0;  // fallback vs OpenBLAS, relative to max |C|
};

template <class T>
measurement measure(const shape& s, const options& opt) {
    const std::int64_t a_rows = s.ta == transpose::no ? s.m : s.k;
    const std::int64_t a_cols = s.ta == transpose::no ? s.k : s.m;
    const std::int64_t b_rows = s.tb == transpose::no ? s.k : s.n;
    const std::int64_t b_cols = s.tb == transpose::no ? s.n : s.k;
    std::vector<T> a(static_cast<std::size_t>(a_rows * a_cols));
    std::vector<T> b(static_cast<std::size_t>(b_rows * b_cols));
    std::vector<T> c_fallback(static_cast<std::size_t>(s.m * s.n));
    std::vector<T> c_openblas(c_fallback.size());
    std::mt19937_64 generator(42);
    std::uniform_real_distribution<double> uniform(-1.0, 1.0);
    for (T& x : a) x = static_cast<T>(uniform(generator));
    for (T& x : b) x = static_cast<T>(uniform(generator));

    const auto run_fallback = [&] {
        loom::host::gemm_fallback<T>(opt.isa, s.ta, s.tb, s.m, s.n, s.k, T(1), a.data(), a_cols, b.data(), b_cols, T(0),
                                     c_fallback.data(), s.n);
    };
    const auto run_openblas = [&] {
        if constexpr (std::is_same_v<T, float>) {
            loom::host::cblas::sgemm(s.ta == transpose::yes, s.tb == transpose::yes, int(s.m), int(s.n), int(s.k), 1.0f,
                                     a.data(), int(a_cols), b.data(), int(b_cols), 0.0f, c_openblas.data(), int(s.n));
        } else {
            loom::host::cblas::dgemm(s.ta == transpose::yes, s.tb == transpose::yes, int(s.m), int(s.n), int(s.k), 1.0,
                                     a.data(), int(a_cols), b.data(), int(b_cols), 0.0, c_openblas.data(), int(s.n));
        }
    };

    std::vector<double> fallback_times;
    std::vector<double> openblas_times;
    for (int round = 0; round < opt.rounds; ++round) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        run_fallback();
        for (int r = 0; r < opt.repeats; ++r) fallback_times.push_back(seconds_of(run_fallback));
        if constexpr (loom::host::has_cblas) {
            run_openblas();
            for (int r = 0; r < opt.repeats; ++r) openblas_times.push_back(seconds_of(run_openblas));
        }
    }

    measurement result;
    result.fallback_seconds = median(fallback_times);
    if (!openblas_times.empty()) {
        result.openblas_seconds = median(openblas_times);
        double largest = 0;
        double difference = 0;
        for (std::size_t i = 0; i < c_fallback.size(); ++i) {
            largest = std::max(largest, std::abs(double(c_openblas[i])));
            difference = std::max(difference, std::abs(double(c_fallback[i]) - double(c_openblas[i])));
        }
        result.max_relative_difference = largest > 0 ? difference / largest : difference;
    }
    return result;
}

std::string transpose_label(const shape& s) {
    return std::string(s.ta == transpose::no ? "N" : "T") + (s.tb == transpose::no ? "N" : "T");
}

}  // namespace

int main(int argc, char** argv) {
    const options opt = parse_options(argc, argv);
    const shape shapes[] = {
        {"square_1024", transpose::no, transpose::no, 1024, 1024, 1024},
        {"transformer_forward", transpose::no, transpose::no, 4096, 384, 128},
        {"transformer_backward_data", transpose::no, transpose::yes, 4096, 128, 384},
        {"transformer_backward_weight", transpose::yes, transpose::no, 128, 384, 4096},
    };

    const unsigned loom_threads = loom::host::thread_pool::global().size();
    nlohmann::json report;
    report["benchmark"] = "gemm";
    report["date_utc"] = loom::bench::utc_now();
    report["git_revision"] = loom::bench::git_revision();
    report["machine"] = {{"cpu_model", loom::bench::cpu_model()},
                         {"logical_cores", std::thread::hardware_concurrency()},
                         {"load_average_at_start", loom::bench::load_average()}};
    report["fallback"] = {{"isa", loom::host::to_string(opt.isa)}, {"threads", loom_threads}};
    report["openblas"] = {{"available", loom::host::has_cblas},
                          {"description", loom::host::cblas::library_description()},
                          {"threads", loom::host::cblas::library_threads()}};
    report["method"] = {{"repeats_per_round", opt.repeats},
                        {"rounds", opt.rounds},
                        {"statistic", "median seconds over all timed calls; GFLOP/s = 2mnk / median"}};
    report["results"] = nlohmann::json::array();

    std::printf("gemm: fallback isa %s, %u threads; OpenBLAS: %s, %d threads\n", loom::host::to_string(opt.isa),
                loom_threads, loom::host::cblas::library_description().c_str(), loom::host::cblas::library_threads());
    std::printf("%-28s %-6s %-2s %5s %5s %5s  %10s %10s %7s %9s\n", "shape", "type", "op", "m", "n", "k", "fallback",
                "openblas", "ratio", "max_rdiff");

    const auto run_shape = [&](const shape& s, auto zero) {
        using T = decltype(zero);
        const measurement result = measure<T>(s, opt);
        const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k);
        const double fallback_gflops = flops / result.fallback_seconds / 1e9;
        nlohmann::json row = {{"shape", s.name},
                              {"type", type_name<T>()},
                              {"op", transpose_label(s)},
                              {"m", s.m},
                              {"n", s.n},
                              {"k", s.k},
                              {"fallback_median_ms", result.fallback_seconds * 1e3},
                              {"fallback_gflops", fallback_gflops}};
        if (result.openblas_seconds) {
            const double openblas_gflops = flops / *result.openblas_seconds / 1e9;
            row["openblas_median_ms"] = *result.openblas_seconds * 1e3;
            row["openblas_gflops"] = openblas_gflops;
            row["ratio_fallback_over_openblas"] = fallback_gflops / openblas_gflops;
            row["max_relative_difference"] = result.max_relative_difference;
            std::printf("%-28s %-6s %-2s %5lld %5lld %5lld  %10.1f %10.1f %7.2f %9.1e\n", s.name, type_name<T>(),
                        transpose_label(s).c_str(), static_cast<long long>(s.m), static_cast<long long>(s.n),
                        static_cast<long long>(s.k), fallback_gflops, openblas_gflops,
                        fallback_gflops / openblas_gflops, result.max_relative_difference);
        } else {
            std::printf("%-28s %-6s %-2s %5lld %5lld %5lld  %10.1f %10s %7s %9s\n", s.name, type_name<T>(),
                        transpose_label(s).c_str(), static_cast<long long>(s.m), static_cast<long long>(s.n),
                        static_cast<long long>(s.k), fallback_gflops, "-", "-", "-");
        }
        std::fflush(stdout);
        report["results"].push_back(row);
    };
    for (const shape& s : shapes) {
        run_shape(s, 0.0f);
        run_shape(s, 0.0);
    }

    report["machine"]["load_average_at_end"] = loom::bench::load_average();

    try {
        loom::bench::write_record(report, opt.out);
    } catch (const std::exception& e) {
        std::cerr << "gemm benchmark: " << e.what() << "\n";
        return 1;
    }
    std::printf("wrote %s\n", opt.out.c_str());
    return 0;
}
