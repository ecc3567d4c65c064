// Checkpoint save and load time for a 48-layer GPT under Megatron TP 4 (4 in-process
// ranks), beside the physical floor: the same number of bytes written with one plain
// write() + fsync into one file, and read back with one read(). Loading is measured under
// the saving plan and resharded into ZeRO-3 over 4 ranks.
//
//   checkpoint_io [--layers 48] [--hidden 384] [--heads 8] [--vocab 8192] [--dir /tmp]
//                 [--repeat 3] [--out benchmarks/results/checkpoint_io.json]
// Writes the numbers to --out (machine, date, commit); benchmarks/RESULTS.md quotes them.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <thread>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <loom/loom.hpp>

#include "support/machine.hpp"
#include "support/record.hpp"

using namespace loom;
namespace fs = std::filesystem;
using seconds_clock = std::chrono::steady_clock;

namespace {



double since(seconds_clock::time_point t) { return std::chrono::duration<double>(seconds_clock::now() - t).count(); }

// The floor: `bytes` written by one write() loop into one file and fsync'd, then read back.
std::pair<double, double> plain_file(const fs::path& path, std::uint64_t bytes) {
    std::vector<char> buffer(bytes, 1);
    auto start = seconds_clock::now();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::uint64_t done = 0;
    while (done < bytes) {
        const ssize_t n = ::write(fd, buffer.data() + done, bytes - done);
        if (n <= 0) throw data_error("checkpoint_io: writing " + path.string() + " failed");
        done += static_cast<std::uint64_t>(n);
    }
    ::fsync(fd);
    ::close(fd);
    const double write_seconds = since(start);
    start = seconds_clock::now();
    const int in = ::open(path.c_str(), O_RDONLY);
    done = 0;
    while (done < bytes) {
        const ssize_t n = ::read(in, buffer.data() + done, bytes - done);
        if (n <= 0) break;
        done += static_cast<std::uint64_t>(n);
    }
    ::close(in);
    const double read_seconds = since(start);
    fs::remove(path);
    return {write_seconds, read_seconds};
}

struct timing {
    double save = 0, load_same = 0, load_resharded = 0;
    std::vector<std::uint64_t> written, read_same, read_resharded;  // bytes per rank
};

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Checkpoint save/load time for a 48-layer GPT under TP 4, beside one plain file write"};
    models::gpt_config c{.layers = 48, .hidden = 384, .heads = 8, .vocab = 8192, .seq = 16, .batch = 4};
    std::string dir = fs::temp_directory_path().string(), out = "benchmarks/results/checkpoint_io.json";
    int repeat = 3;
    app.add_option("--layers", c.layers);
    app.add_option("--hidden", c.hidden);
    app.add_option("--heads", c.heads);
    app.add_option("--vocab", c.vocab);
    app.add_option("--dir", dir, "local directory to write into");
    app.add_option("--repeat", repeat, "runs; the fastest is reported");
    app.add_option("--out", out, "JSON record to write");
    CLI11_PARSE(app, argc, argv);
    const int world = 4;
    const fs::path root = fs::path(dir) / ("loom_checkpoint_io_" + std::to_string(::getpid()));

    auto model = models::gpt(c);
    const auto tp = partition::apply_plan(model.ir(), plan::resolve(plan::presets::megatron(world), model.ir()));
    const auto zero3 = partition::apply_plan(model.ir(), plan::resolve(plan::presets::zero(3, world), model.ir()));
    std::printf("GPT %lld layers, hidden %lld, vocab %lld: %lld parameters; save under %s, load under it and under %s\n",
                static_cast<long long>(c.layers), static_cast<long long>(c.hidden), static_cast<long long>(c.vocab),
                static_cast<long long>(c.parameter_count()), tp.plan_name.c_str(), zero3.plan_name.c_str());

    timing best;
    best.save = best.load_same = best.load_resharded = 1e300;
    train::trainer_options options;
    for (int r = 0; r < repeat; ++r) {
        fs::remove_all(root);
        timing t;
        t.written.assign(world, 0);
        t.read_same.assign(world, 0);
        t.read_resharded.assign(world, 0);
        fs::path saved;
        comm::run_ranks(world, [&](comm::communicator& comm) {
            train::distributed_trainer<float> rank(tp, comm, options);
            comm.barrier(comm::group::world(world));
            const auto start = seconds_clock::now();
            const auto info = train::save_checkpoint(rank, root);
            comm.barrier(comm::group::world(world));
            if (comm.rank() == 0) {
                t.save = since(start);
                saved = info.path;
            }
            t.written[static_cast<std::size_t>(comm.rank())] = info.bytes;
            comm.barrier(comm::group::world(world));
            const auto load_start = seconds_clock::now();
            const auto back = train::load_checkpoint(rank, info.path);
            comm.barrier(comm::group::world(world));
            if (comm.rank() == 0) t.load_same = since(load_start);
            t.read_same[static_cast<std::size_t>(comm.rank())] = back.bytes;
        });
        comm::run_ranks(world, [&](comm::communicator& comm) {
            train::distributed_trainer<float> rank(zero3, comm, options);
            comm.barrier(comm::group::world(world));
            const auto start = seconds_clock::now();
            const auto back = train::load_checkpoint(rank, saved);
            comm.barrier(comm::group::world(world));
            if (comm.rank() == 0) t.load_resharded = since(start);
            t.read_resharded[static_cast<std::size_t>(comm.rank())] = back.bytes;
        });
        std::printf("run %d: save %.3f s, load %.3f s, load into ZeRO-3 %.3f s\n", r, t.save, t.load_same, t.load_resharded);
        if (t.save < best.save) {
            best.save = t.save;
            best.written = t.written;
        }
        if (t.load_same < best.load_same) {
            best.load_same = t.load_same;
            best.read_same = t.read_same;
        }
        if (t.load_resharded < best.load_resharded) {
            best.load_resharded = t.load_resharded;
            best.read_resharded = t.read_resharded;
        }
    }
    std::uint64_t total = 0;
    for (auto b : best.written) total += b;
    double floor_write = 1e300, floor_read = 1e300;
    for (int r = 0; r < repeat; ++r) {
        const auto [w, rd] = plain_file(root / "plain.bin", total);
        floor_write = std::min(floor_write, w);
        floor_read = std::min(floor_read, rd);
    }
    fs::remove_all(root);

    std::printf("tensor bytes: %.1f MB in all; per rank written", static_cast<double>(total) / 1e6);
    for (auto b : best.written) std::printf(" %.1f", static_cast<double>(b) / 1e6);
    std::printf(" MB; read (same plan)");
    for (auto b : best.read_same) std::printf(" %.1f", static_cast<double>(b) / 1e6);
    std::printf(" MB; read (ZeRO-3)");
    for (auto b : best.read_resharded) std::printf(" %.1f", static_cast<double>(b) / 1e6);
    std::printf(" MB\n");
    std::printf("save %.3f s (%.0f MB/s) vs one plain write + fsync %.3f s (%.0f MB/s): %.2fx the floor\n", best.save,
                static_cast<double>(total) / 1e6 / best.save, floor_write, static_cast<double>(total) / 1e6 / floor_write,
                best.save / floor_write);
    std::printf("load %.3f s, resharded %.3f s vs one plain read %.3f s (page cache): %.2fx and %.2fx\n", best.load_same,
                best.load_resharded, floor_read, best.load_same / floor_read, best.load_resharded / floor_read);

    nlohmann::json record;
    std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
    record["date"] = date;
    record["cpu"] = bench::cpu_model();
    record["cores"] = std::thread::hardware_concurrency();
    record["commit"] = bench::git_revision();
    record["directory"] = dir;
    record["model"] = {{"layers", c.layers}, {"hidden", c.hidden}, {"heads", c.heads}, {"vocab", c.vocab},
                       {"parameters", c.parameter_count()}};
    record["ranks"] = world;
    record["save_plan"] = tp.plan_name;
    record["reshard_plan"] = zero3.plan_name;
    record["repeat"] = repeat;
    record["tensor_bytes_total"] = total;
    record["bytes_written_per_rank"] = best.written;
    record["bytes_read_per_rank_same_plan"] = best.read_same;
    record["bytes_read_per_rank_resharded"] = best.read_resharded;
    record["save_seconds"] = best.save;
    record["load_seconds_same_plan"] = best.load_same;
    record["load_seconds_resharded"] = best.load_resharded;
    record["plain_write_fsync_seconds"] = floor_write;
    record["plain_read_seconds"] = floor_read;
    try {
        bench::write_record(record, out);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "checkpoint_io: %s\n", e.what());
        return 1;
    }
    std::printf("wrote %s\n", out.c_str());
    return 0;
}
