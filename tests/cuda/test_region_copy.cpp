// cuda::copy_region against its host twin, partition::copy_region: random pieces of random
// tensors of rank 0 to 5, every element size, regions that are whole, partial, one element
// or empty; and the errors of regions outside their pieces.
#include <cstdint>
#include <random>
#include <vector>

#include <loom/partition/region_copy.hpp>
#include <loom/runtime/cuda/region_copy.hpp>

#include "support.hpp"

using namespace loom;
using partition::box;
using namespace loom::cuda_test;

namespace {

// A random sub-range of [0, extent): possibly empty when `allow_empty`.
partition::index_range random_range(std::int64_t begin, std::int64_t end, std::mt19937& rng, bool allow_empty) {
    std::uniform_int_distribution<std::int64_t> pick(begin, end);
    std::int64_t a = pick(rng), b = pick(rng);
    if (a > b) std::swap(a, b);
    if (a == b && !allow_empty) b = std::min(end, a + 1), a = b - 1;
    return {a, b};
}

template <class E>
void check_random_copies(std::uint64_t seed) {
    std::mt19937 rng(static_cast<std::uint32_t>(seed));
    for (int trial = 0; trial < 60; ++trial) {
        const std::size_t rank = static_cast<std::size_t>(trial % 6);
        box whole, src, dst, region;
        for (std::size_t a = 0; a < rank; ++a) {
            const std::int64_t extent = std::uniform_int_distribution<std::int64_t>(1, rank > 3 ? 6 : 40)(rng);
            whole.ranges.push_back({0, extent});
            src.ranges.push_back(random_range(0, extent, rng, false));
            dst.ranges.push_back(random_range(0, extent, rng, false));
        }
        // A region inside both pieces (empty where they do not meet).
        const box common = partition::intersect(src, dst);
        for (std::size_t a = 0; a < rank; ++a)
            region.ranges.push_back(common.ranges[a].size() > 0
                                        ? random_range(common.ranges[a].begin, common.ranges[a].end, rng, trial % 7 == 3)
                                        : common.ranges[a]);
        std::vector<E> from(static_cast<std::size_t>(src.numel())), to(static_cast<std::size_t>(dst.numel()));
        for (std::size_t i = 0; i < from.size(); ++i) from[i] = static_cast<E>(rng());
        for (std::size_t i = 0; i < to.size(); ++i) to[i] = static_cast<E>(rng());
        std::vector<E> want = to;
        partition::copy_region(from.data(), src, want.data(), dst, region);

        device_vector<E> d_from(from), d_to(to);
        // The legacy default stream, which orders the copy after device_vector's uploads.
        cuda::copy_region(d_from.get(), src, d_to.get(), dst, region, sizeof(E), nullptr);
        INFO("element size " << sizeof(E) << ", source " << src.to_string() << ", destination " << dst.to_string()
                             << ", region " << region.to_string());
        REQUIRE(d_to.download() == want);
    }
}

}  // namespace

TEST_CASE("copy_region on the GPU equals the host's, for every rank and element size", "[cuda][region]") {
    check_random_copies<std::uint16_t>(1);
    check_random_copies<std::uint32_t>(2);
    check_random_copies<std::uint64_t>(3);
    check_random_copies<std::uint8_t>(4);
}

TEST_CASE("copy_region refuses regions outside their pieces and boxes of another rank", "[cuda][region]") {
    device_vector<float> a(std::vector<float>(16, 1.0f)), b(std::vector<float>(16, 2.0f));
    const box piece{{{0, 4}, {0, 4}}};
    CHECK_THROWS_WITH(cuda::copy_region(a.get(), piece, b.get(), piece, box{{{2, 6}, {0, 4}}}, 4, nullptr),
                      Catch::Contains("copy only the intersection"));
    CHECK_THROWS_WITH(cuda::copy_region(a.get(), piece, b.get(), box{{{0, 16}}}, piece, 4, nullptr),
                      Catch::Contains("differ in rank"));
    CHECK_THROWS_WITH(cuda::copy_region(a.get(), piece, b.get(), piece, piece, 3, nullptr),
                      Catch::Contains("pass 1, 2, 4 or 8"));
}
