// Checkpoints (train/checkpoint.hpp, io/checkpoint_manifest.hpp, io/durable_file.hpp):
//  - resume is bit-identical: save at step k, load into a fresh trainer, and steps k+1...
//    give the very losses of the run that never stopped, in float32 and float64 with
//    dropout on, on one device and under tensor-parallel, ZeRO and pipeline plans;
//  - reshard: saved under Megatron TP 4, loaded under 2 pipeline stages x ZeRO-3 x DP 2,
//    then under 2 stages x DP 2, then under ZeRO-3 x DP 2, then one device: training
//    continues with the one-device run's losses (float64, relative 1e-9: only the order of
//    summation differs between plans); the same between one device and Megatron plans
//    that split a prime vocabulary into near-equal pieces;
//  - faults: damaged, truncated, half-written and mismatched checkpoints are refused with
//    a data_error naming the file and leave the trainer unchanged; failed saves throw and
//    leave the previous checkpoint loadable; only the newest keep_last are kept.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <functional>
#include <iterator>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <loom/io/crc32.hpp>
#include <loom/partition/apply.hpp>
#include <loom/plan/presets.hpp>
#include <loom/train/checkpoint.hpp>

#include "support/plan_equivalence.hpp"

using namespace loom;
namespace fs = std::filesystem;

namespace {

models::gpt_config model(double dropout = 0.1) {
    return {.layers = 2, .hidden = 16, .heads = 4, .vocab = 32, .seq = 8, .batch = 8, .dropout = dropout};
}

train::trainer_options options() {
    train::trainer_options o;
    o.optimizer = train::adamw_options{.weight_decay = 0.1};
    o.schedule = {.peak = 3e-3, .min_lr = 3e-4, .warmup_steps = 2, .total_steps = 8};
    return o;
}

fs::path fresh_directory(const std::string& name) {
    const fs::path dir = fs::temp_directory_path() / ("loom_test_checkpoint_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    return dir;
}

// A token stream for the data loader; its batches feed the one-device runs.
std::vector<std::int32_t> token_stream(const models::gpt_config& c) {
    std::vector<std::int32_t> t(2000);
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::int32_t>(finalize_mix(17 + i) % c.vocab);
    return t;
}

train::input_feed feed_of(const train::batch& b, const std::vector<std::int32_t>& positions) {
    train::input_feed f;
    f.index["tokens"] = b.inputs;
    f.index["targets"] = b.targets;
    f.index["positions"] = positions;
    return f;
}

// One device: steps [from, to) with the data loader; loads `resume` first and saves into
// `save_dir` at the end when they are given.
template <class T>
std::vector<double> train_one_device(const models::gpt_config& c, std::int64_t from, std::int64_t to,
                                     const fs::path& resume = {}, const fs::path& save_dir = {}) {
    train::trainer<T> t(models::gpt(c).training_graph(), options());
    const auto tokens = token_stream(c);
    train::data_loader loader(tokens, {.batch = c.batch, .seq = c.seq, .seed = 5});
    if (!resume.empty()) {
        auto info = train::load_checkpoint(t, resume);
        REQUIRE(info.step == from);
        REQUIRE(info.data.has_value());
        loader.restore(*info.data);
    }
    REQUIRE(t.steps() == from);
    const auto positions = models::gpt_positions(c);
    std::vector<double> losses;
    for (std::int64_t s = from; s < to; ++s) losses.push_back(t.step(feed_of(loader.next(), positions)).loss);
    if (!save_dir.empty()) {
        const auto state = loader.state();
        train::save_checkpoint(t, save_dir, &state);
    }
    return losses;
}

struct plan_case {
    std::string name;
    std::function<partition::partitioned_graph(const graph&)> build;
};

partition::partitioned_graph preset(const graph& g, const plan::plan_spec& spec) {
    return partition::apply_plan(g, plan::resolve(spec, g));
}

// Two stages of `inner`'s pairs of devices, 2 micro-batches, 1F1B.
partition::partitioned_graph pipelined(const graph& g, const plan::plan_spec& inner) {
    return partition::apply_plan(g, plan::presets::pipeline(2, 2, {plan::schedule_kind::one_f_one_b}, inner));
}

// ZeRO over Megatron's tensor-parallel pieces: each piece's optimizer state (ZeRO-1 and 2)
// or storage (ZeRO-3) sharded over its data-parallel pair.
plan::plan_spec megatron_zero(int stage) {
    plan::plan_spec p = plan::presets::megatron(2, 2);
    p.zero = static_cast<plan::zero_stage>(stage);
    return p;
}

std::vector<plan_case> plans() {
    return {{"megatron tp 4", [](const graph& g) { return preset(g, plan::presets::megatron(4)); }},
            {"zero-1 dp 2", [](const graph& g) { return preset(g, plan::presets::zero(1, 2)); }},
            {"zero-3 dp 2", [](const graph& g) { return preset(g, plan::presets::zero(3, 2)); }},
            {"2 stages x dp 2", [](const graph& g) { return pipelined(g, plan::presets::data_parallel(2)); }},
            {"2 stages x zero-3 dp 2", [](const graph& g) { return pipelined(g, plan::presets::zero(3, 2)); }},
            {"megatron tp 2 x dp 2, zero-1", [](const graph& g) { return preset(g, megatron_zero(1)); }},
            {"megatron tp 2 x dp 2, zero-2", [](const graph& g) { return preset(g, megatron_zero(2)); }},
            {"megatron tp 2 x dp 2, zero-3", [](const graph& g) { return preset(g, megatron_zero(3)); }}};
}

// A plan: steps [from, to) on the seeded batches of tests/support/gpt_batch.hpp.
template <class T>
std::vector<double> train_plan(const models::gpt_config& c, const plan_case& p, std::int64_t from, std::int64_t to,
                               const fs::path& resume = {}, const fs::path& save_dir = {}) {
    auto m = models::gpt(c);
    const auto pg = p.build(m.ir());
    std::vector<std::vector<std::int32_t>> keep;
    std::vector<train::input_feed> feeds;
    for (std::int64_t s = from; s < to; ++s) feeds.push_back(testing::gpt_batch(c, static_cast<int>(s), keep));
    std::vector<double> losses;
    comm::run_ranks(pg.world, [&](comm::communicator& comm) {
        train::distributed_trainer<T> rank(pg, comm, options());
        if (!resume.empty()) {
            const auto info = train::load_checkpoint(rank, resume);
            if (info.step != from) throw error("resumed at step " + std::to_string(info.step));
        }
        for (const auto& f : feeds) {
            const double loss = rank.step(f).loss;
            if (comm.rank() == 0) losses.push_back(loss);
        }
        if (!save_dir.empty()) train::save_checkpoint(rank, save_dir);
    });
    return losses;
}

template <class T>
std::vector<double> one_device_on_gpt_batches(const models::gpt_config& c, std::int64_t from, std::int64_t to,
                                              const fs::path& resume = {}, const fs::path& save_dir = {}) {
    train::trainer<T> t(models::gpt(c).training_graph(), options());
    if (!resume.empty()) train::load_checkpoint(t, resume);
    std::vector<std::vector<std::int32_t>> keep;
    std::vector<double> losses;
    for (std::int64_t s = from; s < to; ++s) losses.push_back(t.step(testing::gpt_batch(c, static_cast<int>(s), keep)).loss);
    if (!save_dir.empty()) train::save_checkpoint(t, save_dir);
    return losses;
}

// Two steps under each plan of `chain` in turn, each resuming from the checkpoint the plan
// before saved in its directory of `dirs`, then two on one device: every loss equals one
// device's own run (float64: the plans differ from it only in the order of summation,
// relative 1e-9).
void check_reshard_chain(const models::gpt_config& c, const std::vector<const plan_case*>& chain,
                         const std::vector<fs::path>& dirs) {
    const auto steps = static_cast<std::int64_t>(2 * (chain.size() + 1));
    const auto reference = one_device_on_gpt_batches<double>(c, 0, steps);
    std::vector<double> resharded;
    for (std::size_t i = 0; i < chain.size(); ++i) {
        const auto from = static_cast<std::int64_t>(2 * i);
        const fs::path resume = i == 0 ? fs::path{} : *train::latest_checkpoint(dirs[i - 1]);
        for (double l : train_plan<double>(c, *chain[i], from, from + 2, resume, dirs[i])) resharded.push_back(l);
    }
    for (double l : one_device_on_gpt_batches<double>(c, steps - 2, steps, *train::latest_checkpoint(dirs.back())))
        resharded.push_back(l);
    REQUIRE(resharded.size() == reference.size());
    for (std::size_t s = 0; s < reference.size(); ++s) {
        INFO("step " << s << ": " << resharded[s] << " vs one device " << reference[s]);
        CHECK(testing::relative(resharded[s], reference[s]) <= 1e-9);
    }
}

void flip_byte(const fs::path& file, std::uintmax_t at) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char b = 0;
    f.read(&b, 1);
    b = static_cast<char>(b ^ 0x5a);
    f.seekp(static_cast<std::streamoff>(at));
    f.write(&b, 1);
}

}  // namespace

TEST_CASE("crc32 is zlib's CRC-32", "[checkpoint]") {
    CHECK(io::crc32(std::string_view("123456789")) == 0xCBF43926U);
    CHECK(io::crc32(std::string_view("")) == 0U);
    CHECK(io::crc32(std::string_view("6789"), io::crc32(std::string_view("12345"))) == 0xCBF43926U);
}

TEMPLATE_TEST_CASE("one device resumes bit-identically with dropout on", "[checkpoint]", float, double) {
    const auto c = model(0.1);
    const auto dir = fresh_directory("one_device");
    const auto whole = train_one_device<TestType>(c, 0, 6);
    const auto first = train_one_device<TestType>(c, 0, 3, {}, dir);
    const auto latest = train::latest_checkpoint(dir);
    REQUIRE(latest.has_value());
    CHECK(latest->filename() == "step-00000003");
    const auto rest = train_one_device<TestType>(c, 3, 6, *latest);
    REQUIRE(rest.size() == 3);
    for (std::size_t i = 0; i < 3; ++i) {
        CHECK(first[i] == whole[i]);
        CHECK(rest[i] == whole[i + 3]);  // the same bits, not merely close
    }
    fs::remove_all(dir);
}

TEMPLATE_TEST_CASE("every plan resumes bit-identically under itself", "[checkpoint][plans]", float, double) {
    const auto c = model(0.1);
    for (const auto& p : plans()) {
        INFO(p.name);
        const auto dir = fresh_directory("plan");
        const auto whole = train_plan<TestType>(c, p, 0, 4);
        train_plan<TestType>(c, p, 0, 2, {}, dir);
        const auto rest = train_plan<TestType>(c, p, 2, 4, *train::latest_checkpoint(dir));
        REQUIRE(rest.size() == 2);
        CHECK(rest[0] == whole[2]);
        CHECK(rest[1] == whole[3]);
        fs::remove_all(dir);
    }
}

TEST_CASE("a checkpoint of ZeRO over tensor-parallel pieces reshards: ZeRO-2, then ZeRO-1, then ZeRO-3, then one device",
          "[checkpoint][plans][zero]") {
    // Megatron TP 2 x DP 2. Under ZeRO-2 a layer norm's optimizer state is sharded once per
    // tensor-parallel rank: each element must be saved once and loaded by every rank that
    // updates it, whichever plan comes next.
    const auto c = model(0.1);
    const auto plan_list = plans();
    const auto &zero1 = plan_list[5], &zero2 = plan_list[6], &zero3 = plan_list[7];
    const auto a = fresh_directory("tp_zero_a"), b = fresh_directory("tp_zero_b"), d = fresh_directory("tp_zero_c");
    check_reshard_chain(c, {&zero2, &zero1, &zero3}, {a, b, d});
    for (const auto& dir : {a, b, d}) fs::remove_all(dir);
}

TEST_CASE("a checkpoint reshards: Megatron TP 4, then 2 stages x ZeRO-3 x DP 2, then 2 stages x DP 2, then ZeRO-3 x DP 2, "
          "then one device",
          "[checkpoint][plans]") {
    const auto c = model(0.1);
    const auto plan_list = plans();
    const auto &megatron = plan_list[0], &zero3 = plan_list[2], &pipeline = plan_list[3], &pipeline_zero3 = plan_list[4];
    const auto a = fresh_directory("reshard_a"), b = fresh_directory("reshard_b"), d = fresh_directory("reshard_c"),
               e = fresh_directory("reshard_d");
    check_reshard_chain(c, {&megatron, &pipeline_zero3, &pipeline, &zero3}, {a, b, d, e});
    // The manifest names every shard's box and file, and each element comes from one rank.
    const auto m = io::checkpoint_manifest::read(*train::latest_checkpoint(a));
    CHECK(m.step == 2);
    CHECK(m.dtype == "F64");
    CHECK(m.plan.at("world") == 4);
    CHECK(m.model.at("op_graph") == model_fingerprint(models::gpt(c).ir()));  // the same under every plan
    CHECK(m.tensors.at("wte").shards.size() == 4);  // vocabulary-parallel: a quarter per rank
    CHECK(m.tensors.at("wte.adam_m").shape == std::vector<std::int64_t>{32, 16});
    fs::remove_all(a);
    fs::remove_all(b);
    fs::remove_all(d);
    fs::remove_all(e);
}

TEST_CASE("a checkpoint moves between one device and plans that split a prime vocabulary unevenly",
          "[checkpoint][plans][vocabulary]") {
    // 31 rows over Megatron TP 2 (16 + 15) and TP 4 (8 + 8 + 8 + 7): the checkpoint holds the
    // model's 31 rows, whichever plan wrote it, and training goes on as on one device.
    auto c = model(0.1);
    c.vocab = 31;
    const plan_case tp2{"megatron tp 2", [](const graph& g) { return preset(g, plan::presets::megatron(2)); }};
    const plan_case tp4{"megatron tp 4", [](const graph& g) { return preset(g, plan::presets::megatron(4)); }};
    const auto a = fresh_directory("vocab_a"), b = fresh_directory("vocab_b"), d = fresh_directory("vocab_c");
    const auto reference = one_device_on_gpt_batches<double>(c, 0, 8);
    std::vector<double> moved = one_device_on_gpt_batches<double>(c, 0, 2, {}, a);
    for (double l : train_plan<double>(c, tp2, 2, 4, *train::latest_checkpoint(a), b)) moved.push_back(l);
    for (double l : train_plan<double>(c, tp4, 4, 6, *train::latest_checkpoint(b), d)) moved.push_back(l);
    for (double l : one_device_on_gpt_batches<double>(c, 6, 8, *train::latest_checkpoint(d))) moved.push_back(l);
    REQUIRE(moved.size() == reference.size());
    for (std::size_t s = 0; s < reference.size(); ++s) {
        INFO("step " << s << ": " << moved[s] << " vs one device " << reference[s]);
        CHECK(testing::relative(moved[s], reference[s]) <= 1e-9);
    }
    for (const auto& [dir, shards] : {std::pair{b, 2}, std::pair{d, 4}}) {
        const auto m = io::checkpoint_manifest::read(*train::latest_checkpoint(dir));
        CHECK(m.tensors.at("wte").shape == std::vector<std::int64_t>{31, 16});
        CHECK(m.tensors.at("wte").shards.size() == static_cast<std::size_t>(shards));
        CHECK(m.tensors.at("wte.adam_v").shape == std::vector<std::int64_t>{31, 16});
    }
    fs::remove_all(a);
    fs::remove_all(b);
    fs::remove_all(d);
}

TEST_CASE("damaged, half-written and mismatched checkpoints are refused and change nothing", "[checkpoint][errors]") {
    const auto c = model(0.0);
    const auto dir = fresh_directory("damaged");
    train_one_device<float>(c, 0, 2, {}, dir);
    const fs::path good = *train::latest_checkpoint(dir);

    auto refused = [&](const fs::path& checkpoint, const std::string& expected, const models::gpt_config& cc) {
        train::trainer<float> t(models::gpt(cc).training_graph(), options());
        const std::vector<float> before(t.parameter("wte").begin(), t.parameter("wte").end());
        CHECK_THROWS_AS(train::load_checkpoint(t, checkpoint), data_error);
        CHECK_THROWS_WITH(train::load_checkpoint(t, checkpoint), Catch::Contains(expected));
        CHECK(std::equal(before.begin(), before.end(), t.parameter("wte").begin()));
        CHECK(t.steps() == 0);
    };

    SECTION("a flipped byte fails the checksum, naming the file") {
        const fs::path copy = dir / "step-00000099";
        fs::copy(good, copy);
        const auto file = copy / "rank-00000.safetensors";
        flip_byte(file, fs::file_size(file) - 3);
        refused(copy, "CRC-32", c);
        refused(copy, file.string(), c);
    }
    SECTION("a truncated shard file") {
        const fs::path copy = dir / "step-00000099";
        fs::copy(good, copy);
        const auto file = copy / "rank-00000.safetensors";
        fs::resize_file(file, fs::file_size(file) - 100);
        refused(copy, "rank-00000.safetensors", c);
    }
    SECTION("a save that never wrote its manifest") {
        const fs::path copy = dir / "step-00000099";
        fs::copy(good, copy);
        fs::remove(copy / "manifest.json");
        refused(copy, "incomplete", c);
        CHECK(*train::latest_checkpoint(dir) == good);  // never chosen for --resume
    }
    SECTION("a corrupt manifest") {
        const fs::path copy = dir / "step-00000099";
        fs::copy(good, copy);
        std::ofstream(copy / "manifest.json") << "{\"format\": \"loom-checkpoint\", \"version\": 1, \"model\": ";
        refused(copy, "manifest.json", c);
    }
    SECTION("a manifest whose blocks of rows do not fit the shard") {
        const fs::path copy = dir / "step-00000099";
        fs::copy(good, copy);
        std::ifstream in(copy / "manifest.json");
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        in.close();
        const auto at = text.find("\"rows_per_block\"");
        REQUIRE(at != std::string::npos);
        const auto colon = text.find(':', at);
        const auto end = text.find_first_of(",}\n", colon);
        text.replace(colon + 1, end - colon - 1, " 0");
        std::ofstream(copy / "manifest.json", std::ios::trunc) << text;
        refused(copy, "blocks of 0 of its", c);
    }
    SECTION("another vocabulary") {
        auto other = c;
        other.vocab = 64;
        refused(good, "parameter 'wte' is [64,16] here but [32,16]", other);
    }
    SECTION("another model depth") {
        auto other = c;
        other.layers = 3;
        refused(good, "another model", other);
    }
    SECTION("the same parameters in another op graph") {
        auto other = c;
        other.dropout = 0.1;  // dropout ops after the embeddings, attention and MLP: no new parameter
        refused(good, "other ops", other);
    }
    SECTION("another precision") {
        train::trainer<double> t(models::gpt(c).training_graph(), options());
        CHECK_THROWS_WITH(train::load_checkpoint(t, good), Catch::Contains("F32") && Catch::Contains("F64"));
    }
    fs::remove_all(dir);
}

TEST_CASE("a failed save throws and leaves the previous checkpoint intact", "[checkpoint][errors]") {
    const auto c = model(0.0);
    const auto dir = fresh_directory("failed_save");
    train::trainer<float> t(models::gpt(c).training_graph(), options());
    std::vector<std::vector<std::int32_t>> keep;
    t.step(testing::gpt_batch(c, 0, keep));
    train::save_checkpoint(t, dir);
    const fs::path first = *train::latest_checkpoint(dir);
    t.step(testing::gpt_batch(c, 1, keep));

    SECTION("a directory that cannot exist (its parent is a regular file), as root too") {
        const fs::path blocker = dir / "not_a_directory";
        std::ofstream(blocker) << "x";
        CHECK_THROWS_WITH(train::save_checkpoint(t, blocker / "ckpt"), Catch::Contains("not_a_directory"));
    }
    SECTION("a write that fails half-way (an injected full disk)") {
        io::write_faults faults;
        faults.before_rename = [](const fs::path& p) {
            if (p.filename() == "manifest.json") throw data_error("No space left on device (injected)");
        };
        CHECK_THROWS_WITH(train::save_checkpoint(t, dir, nullptr, {.faults = &faults}),
                          Catch::Contains("No space left") && Catch::Contains("previous checkpoints are intact"));
        CHECK(*train::latest_checkpoint(dir) == first);
    }
    SECTION("a process killed in the middle of a save") {
        const pid_t child = ::fork();
        REQUIRE(child >= 0);
        if (child == 0) {
            io::write_faults faults;
            faults.before_rename = [](const fs::path& p) {
                if (p.filename() == "rank-00000.safetensors") ::raise(SIGKILL);
            };
            try {
                train::save_checkpoint(t, dir, nullptr, {.faults = &faults});
            } catch (...) {
            }
            ::_exit(0);
        }
        int status = 0;
        ::waitpid(child, &status, 0);
        REQUIRE(WIFSIGNALED(status));
        CHECK(fs::exists(dir / "step-00000002.tmp"));  // what the crash left behind
    }
    // Whatever went wrong, the first checkpoint still loads, and the next save succeeds.
    CHECK(*train::latest_checkpoint(dir) == first);
    train::trainer<float> back(models::gpt(c).training_graph(), options());
    CHECK(train::load_checkpoint(back, first).step == 1);
    train::save_checkpoint(t, dir);
    CHECK(train::latest_checkpoint(dir)->filename() == "step-00000002");
    CHECK(!fs::exists(dir / "step-00000002.tmp"));
    fs::remove_all(dir);
}

TEST_CASE("saves keep the newest keep_last checkpoints", "[checkpoint]") {
    const auto c = model(0.0);
    const auto dir = fresh_directory("keep_last");
    train::trainer<float> t(models::gpt(c).training_graph(), options());
    std::vector<std::vector<std::int32_t>> keep;
    for (int s = 0; s < 4; ++s) {
        t.step(testing::gpt_batch(c, s, keep));
        train::save_checkpoint(t, dir, nullptr, {.keep_last = 2});
    }
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    CHECK(names == std::vector<std::string>{"step-00000003", "step-00000004"});
    fs::remove_all(dir);
}

TEST_CASE("crc32 agrees with the bitwise definition on every length and alignment", "[checkpoint]") {
    std::vector<std::byte> bytes(300);
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(finalize_mix(i) & 0xFF);
    auto bitwise = [](std::span<const std::byte> b) {
        std::uint32_t c = 0xFFFFFFFFU;
        for (std::byte x : b) {
            c ^= static_cast<std::uint32_t>(x);
            for (int k = 0; k < 8; ++k) c = (c & 1U) ? 0xEDB88320U ^ (c >> 1) : c >> 1;
        }
        return ~c;
    };
    for (std::size_t start : {0, 1, 3, 7})
        for (std::size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 64, 255}) {
            const std::span<const std::byte> s(bytes.data() + start, n);
            CHECK(io::crc32(s) == bitwise(s));
        }
}

TEST_CASE("resharding reads only the checksummed blocks of rows each rank needs", "[checkpoint][plans]") {
    // Saved under TP 4 (row-parallel weights cut along their second dim), loaded under
    // ZeRO-3 x 4 (every weight cut along its first dim): a rank needs a quarter of the rows
    // of each TP shard. Reading whole shards would read about twice the checkpoint in all.
    const models::gpt_config c{.layers = 1, .hidden = 256, .heads = 4, .vocab = 512, .seq = 8, .batch = 4};
    auto m = models::gpt(c);
    const auto tp = preset(m.ir(), plan::presets::megatron(4));
    const auto zero3 = preset(m.ir(), plan::presets::zero(3, 4));
    const auto dir = fresh_directory("blocks");
    std::vector<std::uint64_t> written(4), read(4);
    fs::path saved;
    comm::run_ranks(4, [&](comm::communicator& comm) {
        train::distributed_trainer<float> rank(tp, comm, options());
        const auto info = train::save_checkpoint(rank, dir);
        written[static_cast<std::size_t>(comm.rank())] = info.bytes;
        if (comm.rank() == 0) saved = info.path;
    });
    comm::run_ranks(4, [&](comm::communicator& comm) {
        train::distributed_trainer<float> rank(zero3, comm, options());
        read[static_cast<std::size_t>(comm.rank())] = train::load_checkpoint(rank, saved).bytes;
    });
    const double total_written = static_cast<double>(written[0] + written[1] + written[2] + written[3]);
    const double total_read = static_cast<double>(read[0] + read[1] + read[2] + read[3]);
    INFO("written " << total_written << " bytes, read " << total_read);
    CHECK(total_read >= total_written);  // every element is read at least once
    CHECK(total_read <= 1.15 * total_written);
    fs::remove_all(dir);
}
