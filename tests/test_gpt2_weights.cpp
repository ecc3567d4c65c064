// GPT-2 interop (io/gpt2_weights.hpp): loom's weights exported in GPT-2's names and layouts
// import back to the same values and the same loss; files that do not fit the model (other
// depth, vocabulary, an untied head, too few positions) are refused naming the file, the
// tensor and the fix. The comparison with PyTorch's GPT-2 forward pass is
// tools/gpt2_crosscheck.py (ctest gpt2_crosscheck_*).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <loom/io/gpt2_weights.hpp>
#include <loom/train/gpt2_weights.hpp>

#include "support/gpt_batch.hpp"

using namespace loom;
namespace fs = std::filesystem;

namespace {
models::gpt_config config() { return {.layers = 2, .hidden = 16, .heads = 4, .vocab = 32, .seq = 8, .batch = 2}; }
fs::path temp_file(const std::string& name) {
    return fs::temp_directory_path() / ("loom_test_gpt2_" + name + "_" + std::to_string(::getpid()) + ".safetensors");
}
}  // namespace

TEST_CASE("GPT-2 export and import round-trip loom's weights and loss", "[io][gpt2]") {
    const auto c = config();
    const auto path = temp_file("roundtrip");
    train::trainer<double> a(models::gpt(c).training_graph(), {.init_seed = 3});
    train::save_gpt2_weights(a, c, path);
    const io::safetensors_file f(path);
    CHECK(f.info("h.0.attn.c_attn.weight").shape == std::vector<std::int64_t>{16, 48});  // Conv1D [in, out]
    CHECK(f.info("h.1.mlp.c_fc.weight").shape == std::vector<std::int64_t>{16, 64});
    CHECK(f.info("wpe.weight").shape == std::vector<std::int64_t>{8, 16});
    CHECK(!f.contains("lm_head.weight"));  // tied, as GPT-2
    // c_attn's columns are q, then k, then v: q's row 0 is column block 0 of c_attn.
    const auto qkv = f.read<double>("h.0.attn.c_attn.weight");
    const auto k = a.parameter("blocks.0.attn.k.weight");
    CHECK(qkv[3 * 48 + 16 + 0] == k[0 * 16 + 3]);  // loom k[out=0][in=3] sits at c_attn[in=3][16 + out]
    CHECK(qkv[5 * 48 + 16 + 2] == k[2 * 16 + 5]);

    train::trainer<double> b(models::gpt(c).training_graph(), {.init_seed = 99});
    train::load_gpt2_weights(b, c, path);
    for (tensor_id p : a.ir().parameters) {
        const auto& name = a.ir().tensor(p).name;
        const auto x = a.parameter(name), y = b.parameter(name);
        CHECK(std::equal(x.begin(), x.end(), y.begin()));
    }
    std::vector<std::vector<std::int32_t>> keep;
    const auto feed = testing::gpt_batch(c, 0, keep);
    CHECK(a.evaluate(feed) == b.evaluate(feed));
    fs::remove(path);
}

TEST_CASE("GPT-2 files that do not fit the model are refused", "[io][gpt2][errors]") {
    const auto c = config();
    const auto path = temp_file("mismatch");
    train::trainer<float> a(models::gpt(c).training_graph(), {});
    train::save_gpt2_weights(a, c, path);
    auto refused = [&](models::gpt_config other, const std::string& expected) {
        train::trainer<float> t(models::gpt(other).training_graph(), {});
        CHECK_THROWS_AS(train::load_gpt2_weights(t, other, path), data_error);
        CHECK_THROWS_WITH(train::load_gpt2_weights(t, other, path), Catch::Contains(path.string()) && Catch::Contains(expected));
    };
    auto deeper = c;
    deeper.layers = 3;
    refused(deeper, "has 2 layers");
    auto wider_vocab = c;
    wider_vocab.vocab = 50;
    refused(wider_vocab, "gpt_config::vocab");
    auto longer = c;
    longer.seq = 16;
    refused(longer, "fewer positions");
    auto untied = c;
    untied.tie_embeddings = false;
    refused(untied, "no lm_head.weight");
    fs::remove(path);
}
