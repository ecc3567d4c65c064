// llm.c token shards (io/llmc_tokens.hpp): a shard written in llm.c's layout reads back to
// the same tokens and feeds the data loader; a bad magic (including llm.c's model-file
// magic), a bad version, a truncated file and trailing bytes are refused naming the file.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <loom/io/llmc_tokens.hpp>
#include <loom/train/data_loader.hpp>

using namespace loom;
namespace fs = std::filesystem;

namespace {

fs::path temp_file(const std::string& name) {
    return fs::temp_directory_path() / ("loom_test_llmc_" + name + "_" + std::to_string(::getpid()) + ".bin");
}

// A shard built byte by byte as llm.c's dev/data/data_common.py write_datafile does:
// np.zeros(256, int32) header with [20240520, 1, n], then np.uint16 tokens.
std::string shard_bytes(std::int32_t magic, std::int32_t version, const std::vector<std::uint16_t>& tokens,
                        std::int32_t count) {
    std::string b(1024 + 2 * tokens.size(), '\0');
    auto put32 = [&](std::size_t at, std::int32_t v) {
        for (int i = 0; i < 4; ++i) b[at + i] = static_cast<char>((static_cast<std::uint32_t>(v) >> (8 * i)) & 0xFF);
    };
    put32(0, magic);
    put32(4, version);
    put32(8, count);
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        b[1024 + 2 * i] = static_cast<char>(tokens[i] & 0xFF);
        b[1024 + 2 * i + 1] = static_cast<char>(tokens[i] >> 8);
    }
    return b;
}

void write(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

}  // namespace

TEST_CASE("an llm.c token shard reads back and feeds the data loader", "[data][llmc]") {
    const std::vector<std::uint16_t> tokens{50256, 15496, 11, 995, 0, 65535, 7, 8, 9, 10};
    const auto path = temp_file("good");
    write(path, shard_bytes(20240520, 1, tokens, static_cast<std::int32_t>(tokens.size())));
    const auto shard = io::read_llmc_tokens(path);
    REQUIRE(shard.tokens.size() == tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) CHECK(shard.tokens[i] == tokens[i]);
    CHECK(shard.vocab_bound == 65536);

    train::data_loader loader(shard.tokens, {.batch = 2, .seq = 3, .seed = 1, .shuffle = false});
    const auto b = loader.next();
    CHECK(b.inputs == std::vector<std::int32_t>{50256, 15496, 11, 15496, 11, 995});
    CHECK(b.targets == std::vector<std::int32_t>{15496, 11, 995, 11, 995, 0});

    // loom's writer produces the same bytes as the layout above.
    const auto again = temp_file("again");
    io::write_llmc_tokens(again, shard.tokens);
    std::ifstream a(path, std::ios::binary), c(again, std::ios::binary);
    CHECK(std::string(std::istreambuf_iterator<char>(a), {}) == std::string(std::istreambuf_iterator<char>(c), {}));
    fs::remove(path);
    fs::remove(again);
}

TEST_CASE("bad llm.c shards are refused naming the file and the fix", "[data][llmc][errors]") {
    const std::vector<std::uint16_t> tokens{1, 2, 3, 4};
    const auto path = temp_file("bad");
    auto refused = [&](const std::string& bytes, const std::string& expected) {
        write(path, bytes);
        CHECK_THROWS_AS(io::read_llmc_tokens(path), data_error);
        CHECK_THROWS_WITH(io::read_llmc_tokens(path), Catch::Contains(path.string()) && Catch::Contains(expected));
    };
    refused(shard_bytes(12345, 1, tokens, 4), "magic 12345");
    refused(shard_bytes(20240326, 1, tokens, 4), "model file");
    refused(shard_bytes(20240520, 2, tokens, 4), "version 2");
    refused(shard_bytes(20240520, 1, tokens, 6), "truncated");
    refused(shard_bytes(20240520, 1, tokens, 3), "after its 3 tokens");
    refused(std::string(100, '\0'), "shorter than the 1024-byte header");
    fs::remove(path);
    CHECK_THROWS_WITH(io::read_llmc_tokens(path), Catch::Contains("does not exist"));
    CHECK_THROWS_AS(io::write_llmc_tokens(path, std::vector<std::int32_t>{70000}), usage_error);
}
