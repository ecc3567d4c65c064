// Embedding CUDA kernels against their host twin, the host backend's embedding kernels run
// through a graph (twins/embedding.hpp), in float and bf16. Ids repeat heavily (one id at
// 40% of the positions), many table rows are never used, the table may be a vocabulary
// slice (row_offset), rows may be 16-byte vectors or not. The gradient sums in the host's
// order, so results must agree exactly; repeats are bit-identical; ids out of range raise
// the flag.
#include <cstring>
#include <random>
#include <type_traits>

#include <loom/runtime/cuda/embedding.hpp>

#include "support.hpp"
#include "twins/embedding.hpp"

using namespace loom;
using namespace loom::cuda_test;

namespace {

// Ids in [lo, hi) of the vocabulary: 40% one hot id, 20% ten common ones, the rest uniform.
std::vector<std::int32_t> skewed_ids(std::int64_t n, std::int64_t lo, std::int64_t hi, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::uniform_int_distribution<std::int64_t> any(lo, hi - 1), common(0, 9);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
    for (auto& id : ids) {
        const double pick = u(rng);
        id = static_cast<std::int32_t>(pick < 0.4 ? lo + 5 % (hi - lo) : pick < 0.6 ? lo + common(rng) % (hi - lo) : any(rng));
    }
    return ids;
}

struct embedding_case {
    embedding_shape shape;
    std::int64_t id_lo, id_hi;  // ids drawn from this range of the vocabulary
    std::size_t offset;         // elements, applied to the table, dy, out and dtable
};

const embedding_case embedding_cases[] = {
    {{4096, 1000, 768, 1000, 0}, 0, 900, 0},       // vectors; rows 900..999 never used
    {{3000, 400, 100, 1000, 300}, 300, 1000, 0},   // a vocabulary slice [300, 700), ids up to 999;
                                                   // bf16 rows are not vectors
    {{777, 50257, 37, 50257, 0}, 0, 50257, 0},     // single elements, mostly empty rows
    {{2048, 512, 64, 512, 0}, 0, 512, 1},          // misaligned pointers
};

template <class T>
void check_embedding(const embedding_case& c, std::uint64_t seed) {
    const auto& s = c.shape;
    INFO("positions " << s.positions << ", rows " << s.rows << ", cols " << s.cols << ", row_offset " << s.row_offset
                      << ", offset " << c.offset);
    const auto ids = skewed_ids(s.positions, c.id_lo, c.id_hi, seed);
    const auto table = random_vector<T>(static_cast<std::size_t>(s.rows * s.cols), seed + 1);
    const auto dy = random_vector<T>(static_cast<std::size_t>(s.positions * s.cols), seed + 2);
    const device_vector<std::int32_t> dids(ids);
    const placed<T> dtable_in(table, c.offset), ddy(dy, c.offset);
    placed<T> dout(static_cast<std::size_t>(s.positions * s.cols), c.offset),
        dgrad(static_cast<std::size_t>(s.rows * s.cols), c.offset);
    device_vector<unsigned char> workspace(cuda::embedding_backward_workspace_bytes(s.positions, s.rows));
    device_vector<int> invalid(1);

    cuda::embedding_forward(dids.get(), dtable_in.get(), dout.get(), s.positions, s.rows, s.cols, s.vocab,
                            s.row_offset, invalid.get(), nullptr);
    cuda::embedding_backward(ddy.get(), dids.get(), dgrad.get(), s.positions, s.rows, s.cols, s.vocab, s.row_offset,
                             workspace.get(), invalid.get(), nullptr);
    const auto want = host_embedding(s, ids, widen(table), widen(dy));
    // A copy and sums in the same order, rounded once: exact.
    require_close(dout.download(), stored<T>(want.out), 0, 0, "embedding out");
    const auto got = dgrad.download();
    require_close(got, stored<T>(want.dtable), 0, 0, "embedding dtable");
    CHECK(invalid.download()[0] == 0);

    cuda::embedding_backward(ddy.get(), dids.get(), dgrad.get(), s.positions, s.rows, s.cols, s.vocab, s.row_offset,
                             workspace.get(), invalid.get(), nullptr);
    CHECK(std::memcmp(got.data(), dgrad.download().data(), got.size() * sizeof(T)) == 0);
}

}  // namespace

TEMPLATE_TEST_CASE("embedding forward and backward match the host twin", "[cuda][embedding]", float, loom::bfloat16) {
    std::uint64_t seed = 80;
    for (const auto& c : embedding_cases) check_embedding<TestType>(c, seed += 10);
}

TEMPLATE_TEST_CASE("embedding: ids out of range give zero rows, add nothing and raise the flag", "[cuda][embedding]",
                   float, loom::bfloat16) {
    // The table holds rows [0, 10) of a vocabulary of 20.
    const embedding_shape s{8, 10, 16, 20, 0};
    const std::vector<std::int32_t> ids{3, -1, 3, 25, 12, 9, 20, 3};
    // The twin's view: each bad id replaced by 12, inside the vocabulary but outside the table.
    std::vector<std::int32_t> ids_for_twin = ids;
    for (auto& id : ids_for_twin)
        if (id < 0 || id >= s.vocab) id = 12;
    const auto table = random_vector<TestType>(static_cast<std::size_t>(s.rows * s.cols), 90);
    const auto dy = random_vector<TestType>(static_cast<std::size_t>(s.positions * s.cols), 91);
    const device_vector<std::int32_t> dids(ids);
    const device_vector<TestType> dtable_in(table), ddy(dy);
    device_vector<TestType> dout(static_cast<std::size_t>(s.positions * s.cols)),
        dgrad(static_cast<std::size_t>(s.rows * s.cols));
    device_vector<unsigned char> workspace(cuda::embedding_backward_workspace_bytes(s.positions, s.rows));
    device_vector<int> forward_flag(1), backward_flag(1);
    cuda::embedding_forward(dids.get(), dtable_in.get(), dout.get(), s.positions, s.rows, s.cols, s.vocab,
                            s.row_offset, forward_flag.get(), nullptr);
    cuda::embedding_backward(ddy.get(), dids.get(), dgrad.get(), s.positions, s.rows, s.cols, s.vocab, s.row_offset,
                             workspace.get(), backward_flag.get(), nullptr);
    CHECK(forward_flag.download()[0] == 1);
    CHECK(backward_flag.download()[0] == 1);
    const auto want = host_embedding(s, ids_for_twin, widen(table), widen(dy));
    require_close(dout.download(), stored<TestType>(want.out), 0, 0, "out with bad ids");
    require_close(dgrad.download(), stored<TestType>(want.dtable), 0, 0, "dtable with bad ids");

    // Ids inside the vocabulary but outside the table slice are no error.
    const device_vector<std::int32_t> slice_ids(ids_for_twin);
    device_vector<int> quiet_flag(1);
    cuda::embedding_forward(slice_ids.get(), dtable_in.get(), dout.get(), s.positions, s.rows, s.cols, s.vocab,
                            s.row_offset, quiet_flag.get(), nullptr);
    CHECK(quiet_flag.download()[0] == 0);

    CHECK_THROWS_WITH(cuda::embedding_forward(dids.get(), dtable_in.get(), dout.get(), s.positions, s.rows, s.cols, 5,
                                              0, nullptr, nullptr),
                      Catch::Contains("not inside the vocabulary"));
    CHECK_THROWS_WITH(cuda::embedding_backward(ddy.get(), dids.get(), dgrad.get(), s.positions, s.rows, s.cols,
                                               s.vocab, s.row_offset, nullptr, nullptr, nullptr),
                      Catch::Contains("workspace is null"));
}
