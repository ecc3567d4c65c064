// Communicators: the group and dtype helpers, and every operation of the in-process world
// on 2, 4 and 8 ranks with exact expected values, sub-groups, determinism of sums,
// point-to-point without deadlock, and the failure paths (timeouts, a rank that throws,
// mismatched calls, misuse).
//
// Catch2 assertions are not thread-safe, so rank threads only record what they saw and
// every check runs on the main thread after run_ranks has joined them.
#include <catch2/catch.hpp>

#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/runtime/comm/communicator.hpp>
#include <loom/runtime/comm/in_process.hpp>

namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::Matches;
using Catch::Matchers::StartsWith;
using loom::comm::comm_options;
using loom::comm::communicator;
using loom::comm::dtype;
using loom::comm::group;
using loom::comm::in_process_world;
using loom::comm::run_ranks;
using namespace std::chrono_literals;

// Inputs whose sums are exact in every dtype, so expected values need no tolerance.
template <class T>
T input_value(int rank, std::size_t i) {
    if constexpr (std::is_floating_point_v<T>) {
        return T(rank) * T(1.5) + T(i) * T(0.25);
    } else {
        return T(rank * 1000 + static_cast<int>(i));
    }
}

// Sum of input_value(r, i) over the ranks of g.
template <class T>
T expected_sum(const group& g, std::size_t i) {
    T total = 0;
    for (int r : g.ranks) total += input_value<T>(r, i);
    return total;
}

// Closed form of expected_sum over the world of n ranks.
template <class T>
T expected_world_sum(int n, std::size_t i) {
    const long long pairs = static_cast<long long>(n) * (n - 1) / 2;
    if constexpr (std::is_floating_point_v<T>) {
        return T(1.5) * T(pairs) + T(0.25) * T(i) * T(n);
    } else {
        return T(1000 * pairs + static_cast<long long>(i) * n);
    }
}

// Element i of chunk `to` that rank `from` sends in all_to_all.
template <class T>
T all_to_all_value(int from, int to, std::size_t i) {
    return T(from * 100 + to * 10 + static_cast<int>(i));
}

template <class T>
std::vector<T> inputs_of(int rank, std::size_t count) {
    std::vector<T> values(count);
    for (std::size_t i = 0; i < count; ++i) values[i] = input_value<T>(rank, i);
    return values;
}

// Runs f on n ranks and returns what each rank's f returned, indexed by rank.
template <class R, class F>
std::vector<R> per_rank(int n, F f, comm_options options = {}) {
    std::vector<R> results(static_cast<std::size_t>(n));
    run_ranks(
        n, [&](communicator& c) { results[static_cast<std::size_t>(c.rank())] = f(c); }, options);
    return results;
}

// The message of the Error that f throws; any other exception fails the test case.
template <class Error, class F>
std::string message_of(F f) {
    try {
        f();
    } catch (const Error& error) {
        return error.what();
    }
    FAIL("expected an exception, none was thrown");
    return {};
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Values with many significant bits and mixed magnitudes, so the summation order shows.
float scrambled_value(int rank, std::size_t i) {
    std::uint32_t state = static_cast<std::uint32_t>(rank) * 2654435761u +
                          static_cast<std::uint32_t>(i) * 40503u + 12345u;
    state ^= state >> 13;
    state *= 0x5bd1e995u;
    state ^= state >> 15;
    const float unit = static_cast<float>(state) / 4294967296.0f - 0.5f;
    const float magnitudes[] = {1.0f, 1000.0f, 0.001f};
    return unit * magnitudes[(static_cast<std::size_t>(rank) + i) % 3];
}

}  // namespace

// ---- helpers ----------------------------------------------------------------------------

TEST_CASE("dtype helpers name and size every element type", "[comm]") {
    STATIC_REQUIRE(loom::comm::dtype_of<float>() == dtype::f32);
    STATIC_REQUIRE(loom::comm::dtype_of<double>() == dtype::f64);
    STATIC_REQUIRE(loom::comm::dtype_of<std::int32_t>() == dtype::i32);
    STATIC_REQUIRE(loom::comm::dtype_of<std::int64_t>() == dtype::i64);
    STATIC_REQUIRE(!loom::comm::comm_element<char>);
    CHECK(loom::comm::size_of(dtype::f32) == 4);
    CHECK(loom::comm::size_of(dtype::f64) == 8);
    CHECK(loom::comm::size_of(dtype::i32) == 4);
    CHECK(loom::comm::size_of(dtype::i64) == 8);
    CHECK(loom::comm::to_string(dtype::f32) == "f32");
    CHECK(loom::comm::to_string(dtype::i64) == "i64");
    STATIC_REQUIRE(loom::comm::dtype_of<loom::bfloat16>() == dtype::bf16);
    CHECK(loom::comm::size_of(dtype::bf16) == 2);
    CHECK(loom::comm::to_string(dtype::bf16) == "bf16");
}

TEST_CASE("bf16 sums round after each addition, in rank order, bitwise on every rank", "[comm]") {
    using loom::bfloat16;
    constexpr int ranks = 3;
    constexpr std::size_t count = 3 * 41;
    const auto results = per_rank<std::vector<bfloat16>>(ranks, [](communicator& c) {
        std::vector<bfloat16> data(count);
        for (std::size_t i = 0; i < count; ++i) data[i] = bfloat16(scrambled_value(c.rank(), i));
        c.all_reduce_sum(std::span(data), c.world());
        std::vector<bfloat16> chunk(count / ranks);
        std::vector<bfloat16> again(count);
        for (std::size_t i = 0; i < count; ++i) again[i] = bfloat16(scrambled_value(c.rank(), i));
        c.reduce_scatter_sum(std::span<const bfloat16>(again), std::span(chunk), c.world());
        data.insert(data.end(), chunk.begin(), chunk.end());
        return data;
    });
    for (int r = 0; r < ranks; ++r) {
        const auto& got = results[static_cast<std::size_t>(r)];
        for (std::size_t i = 0; i < count; ++i) {
            bfloat16 expected(scrambled_value(0, i));
            for (int from = 1; from < ranks; ++from)
                expected = bfloat16(static_cast<float>(expected) + static_cast<float>(bfloat16(scrambled_value(from, i))));
            CHECK(got[i].bits == expected.bits);
            if (i / (count / ranks) == static_cast<std::size_t>(r))
                CHECK(got[count + i % (count / ranks)].bits == expected.bits);
        }
    }
}

TEST_CASE("group: world, index_of, to_string, equality", "[comm]") {
    const group all = group::world(4);
    CHECK(all.ranks == std::vector<int>{0, 1, 2, 3});
    CHECK(all.to_string() == "{0,1,2,3}");
    CHECK(all == group{{0, 1, 2, 3}});
    CHECK_FALSE(all == group{{0, 2}});
    const group strided{{1, 3, 5}};
    CHECK(strided.size() == 3);
    CHECK(strided.index_of(5) == 2);
    CHECK(strided.contains(3));
    CHECK_FALSE(strided.contains(2));
    CHECK(group{}.to_string() == "{}");
    CHECK(message_of<loom::usage_error>([&] { (void)strided.index_of(2); }) ==
          "group::index_of: rank 2 is not in group {1,3,5}; pass a rank that is a member of "
          "the group");
    CHECK_THAT(message_of<loom::usage_error>([] { (void)group::world(0); }),
               StartsWith("group::world: n = 0"));
}

TEST_CASE("both communicators satisfy communicator_like", "[comm]") {
    STATIC_REQUIRE(loom::comm::communicator_like<communicator>);
    STATIC_REQUIRE(loom::comm::communicator_like<loom::comm::in_process_communicator>);
    in_process_world world(3);
    CHECK(world.size() == 3);
    CHECK(world.rank(2).rank() == 2);
    CHECK(world.rank(2).size() == 3);
    CHECK(world.rank(1).world() == group::world(3));
}

// ---- collectives on the whole world -----------------------------------------------------

TEMPLATE_TEST_CASE("all_reduce_sum: every rank gets the sum of all inputs", "[comm]", float, double,
                   std::int32_t) {
    const int n = GENERATE(2, 4, 8);
    const std::size_t count = 37;  // a multiple of no world size
    const auto results = per_rank<std::vector<TestType>>(n, [&](communicator& c) {
        std::vector<TestType> data = inputs_of<TestType>(c.rank(), count);
        c.all_reduce_sum(std::span(data), c.world());
        return data;
    });
    std::vector<TestType> expected(count);
    for (std::size_t i = 0; i < count; ++i) expected[i] = expected_world_sum<TestType>(n, i);
    for (int r = 0; r < n; ++r) {
        INFO("n = " << n << ", rank " << r);
        CHECK(results[static_cast<std::size_t>(r)] == expected);
    }
}

TEMPLATE_TEST_CASE("all_gather: every rank gets the inputs in rank order", "[comm]", float, double,
                   std::int32_t) {
    const int n = GENERATE(2, 4, 8);
    const std::size_t count = 3;
    const auto results = per_rank<std::vector<TestType>>(n, [&](communicator& c) {
        const std::vector<TestType> in = inputs_of<TestType>(c.rank(), count);
        std::vector<TestType> out(count * static_cast<std::size_t>(n), TestType(-1));
        c.all_gather(in, std::span(out), c.world());
        return out;
    });
    std::vector<TestType> expected;
    for (int r = 0; r < n; ++r) {
        for (std::size_t i = 0; i < count; ++i) expected.push_back(input_value<TestType>(r, i));
    }
    for (int r = 0; r < n; ++r) {
        INFO("n = " << n << ", rank " << r);
        CHECK(results[static_cast<std::size_t>(r)] == expected);
    }
}

TEMPLATE_TEST_CASE("reduce_scatter_sum: rank m gets chunk m of the sum", "[comm]", float, double,
                   std::int32_t) {
    const int n = GENERATE(2, 4, 8);
    const std::size_t chunk = 5;
    const auto results = per_rank<std::vector<TestType>>(n, [&](communicator& c) {
        const std::vector<TestType> in =
            inputs_of<TestType>(c.rank(), chunk * static_cast<std::size_t>(n));
        std::vector<TestType> out(chunk, TestType(-1));
        c.reduce_scatter_sum(in, std::span(out), c.world());
        return out;
    });
    for (int m = 0; m < n; ++m) {
        std::vector<TestType> expected(chunk);
        for (std::size_t i = 0; i < chunk; ++i) {
            expected[i] = expected_world_sum<TestType>(n, static_cast<std::size_t>(m) * chunk + i);
        }
        INFO("n = " << n << ", rank " << m);
        CHECK(results[static_cast<std::size_t>(m)] == expected);
    }
}

TEMPLATE_TEST_CASE("all_to_all: chunk j of rank i's input becomes chunk i of rank j's output",
                   "[comm]", float, double, std::int32_t) {
    const int n = GENERATE(2, 4, 8);
    const std::size_t chunk = 2;
    const std::size_t total = chunk * static_cast<std::size_t>(n);
    const auto results = per_rank<std::vector<TestType>>(n, [&](communicator& c) {
        std::vector<TestType> in(total);
        for (int to = 0; to < n; ++to) {
            for (std::size_t i = 0; i < chunk; ++i) {
                in[static_cast<std::size_t>(to) * chunk + i] =
                    all_to_all_value<TestType>(c.rank(), to, i);
            }
        }
        std::vector<TestType> out(total, TestType(-1));
        c.all_to_all(in, std::span(out), c.world());
        return out;
    });
    for (int j = 0; j < n; ++j) {
        std::vector<TestType> expected(total);
        for (int from = 0; from < n; ++from) {
            for (std::size_t i = 0; i < chunk; ++i) {
                expected[static_cast<std::size_t>(from) * chunk + i] =
                    all_to_all_value<TestType>(from, j, i);
            }
        }
        INFO("n = " << n << ", rank " << j);
        CHECK(results[static_cast<std::size_t>(j)] == expected);
    }
}

TEMPLATE_TEST_CASE("broadcast: every rank gets the root's data", "[comm]", float, double,
                   std::int32_t) {
    const int n = GENERATE(2, 4, 8);
    const int root = GENERATE_COPY(1, n - 1);  // never rank 0, so the root is really used
    const std::size_t count = 6;
    const auto results = per_rank<std::vector<TestType>>(n, [&](communicator& c) {
        std::vector<TestType> data =
            c.rank() == root ? inputs_of<TestType>(root, count) : std::vector<TestType>(count, -1);
        c.broadcast(std::span(data), root, c.world());
        return data;
    });
    for (int r = 0; r < n; ++r) {
        INFO("n = " << n << ", root " << root << ", rank " << r);
        CHECK(results[static_cast<std::size_t>(r)] == inputs_of<TestType>(root, count));
    }
}

TEST_CASE("barrier: nobody leaves before everyone has arrived", "[comm]") {
    const int n = GENERATE(2, 4, 8);
    std::atomic<int> arrived{0};
    const auto seen = per_rank<int>(n, [&](communicator& c) {
        arrived.fetch_add(1);
        c.barrier(c.world());
        return arrived.load();
    });
    for (int r = 0; r < n; ++r) {
        INFO("n = " << n << ", rank " << r);
        CHECK(seen[static_cast<std::size_t>(r)] == n);
    }
}

TEST_CASE("all_reduce_sum: i64, zero elements, and integer sums that wrap", "[comm]") {
    struct outcome {
        std::vector<std::int64_t> wide;
        std::vector<std::int32_t> wrapped;
        std::vector<float> empty;
    };
    const auto results = per_rank<outcome>(2, [](communicator& c) {
        outcome o;
        o.wide = {std::int64_t{1} << 40, -c.rank()};
        c.all_reduce_sum(std::span(o.wide), c.world());
        o.wrapped = {std::numeric_limits<std::int32_t>::max()};
        if (c.rank() == 1) o.wrapped[0] = 1;
        c.all_reduce_sum(std::span(o.wrapped), c.world());
        c.all_reduce_sum(std::span(o.empty), c.world());
        return o;
    });
    for (const outcome& o : results) {
        CHECK(o.wide == std::vector<std::int64_t>{std::int64_t{1} << 41, -1});
        CHECK(o.wrapped == std::vector<std::int32_t>{std::numeric_limits<std::int32_t>::min()});
        CHECK(o.empty.empty());
    }
}

// ---- sub-groups -------------------------------------------------------------------------

TEST_CASE("sub-groups: halves and strided groups reduce concurrently and independently", "[comm]") {
    const std::size_t count = 9;
    struct outcome {
        std::vector<float> half_sum, strided_sum, world_sum;
        std::vector<float> strided_gather;
        std::vector<float> alone;
    };
    const auto results = per_rank<outcome>(8, [&](communicator& c) {
        const int r = c.rank();
        const group half = r < 4 ? group{{0, 1, 2, 3}} : group{{4, 5, 6, 7}};
        const group strided = r % 2 == 0 ? group{{0, 2, 4, 6}} : group{{1, 3, 5, 7}};
        outcome o;
        // Interleaved on three groups: each group's calls are matched on their own.
        o.half_sum = inputs_of<float>(r, count);
        c.all_reduce_sum(std::span(o.half_sum), half);
        o.strided_sum = inputs_of<float>(r, count);
        c.all_reduce_sum(std::span(o.strided_sum), strided);
        o.world_sum = inputs_of<float>(r, count);
        c.all_reduce_sum(std::span(o.world_sum), c.world());
        o.strided_gather.assign(4, -1.0f);
        const std::vector<float> mine{static_cast<float>(r)};
        c.all_gather(mine, std::span(o.strided_gather), strided);
        o.alone = inputs_of<float>(r, 2);
        c.all_reduce_sum(std::span(o.alone), group{{r}});
        return o;
    });
    for (int r = 0; r < 8; ++r) {
        const group half = r < 4 ? group{{0, 1, 2, 3}} : group{{4, 5, 6, 7}};
        const group strided = r % 2 == 0 ? group{{0, 2, 4, 6}} : group{{1, 3, 5, 7}};
        std::vector<float> half_expected(count), strided_expected(count), world_expected(count);
        for (std::size_t i = 0; i < count; ++i) {
            half_expected[i] = expected_sum<float>(half, i);
            strided_expected[i] = expected_sum<float>(strided, i);
            world_expected[i] = expected_world_sum<float>(8, i);
        }
        const outcome& o = results[static_cast<std::size_t>(r)];
        INFO("rank " << r);
        CHECK(o.half_sum == half_expected);
        CHECK(o.strided_sum == strided_expected);
        CHECK(o.world_sum == world_expected);
        const float first = static_cast<float>(r % 2);
        CHECK(o.strided_gather ==
              std::vector<float>{first, first + 2.0f, first + 4.0f, first + 6.0f});
        CHECK(o.alone == inputs_of<float>(r, 2));
    }
}

// ---- determinism ------------------------------------------------------------------------

TEST_CASE(
    "all_reduce_sum is bitwise identical on every rank, in every run, summed in group "
    "order",
    "[comm]") {
    const std::size_t count = 1000;
    const group odd{{1, 3, 5, 7}};
    const auto run_once = [&] {
        return per_rank<std::vector<float>>(8, [&](communicator& c) {
            std::vector<float> data(count);
            for (std::size_t i = 0; i < count; ++i) data[i] = scrambled_value(c.rank(), i);
            if (c.rank() % 2 == 1) c.all_reduce_sum(std::span(data), odd);
            return data;
        });
    };
    // Member 0 of the group (rank 1) first, then the others in group order.
    std::vector<float> in_order(count), reversed(count);
    for (std::size_t i = 0; i < count; ++i) {
        in_order[i] = scrambled_value(1, i);
        for (std::size_t m = 1; m < odd.ranks.size(); ++m)
            in_order[i] += scrambled_value(odd.ranks[m], i);
        reversed[i] = scrambled_value(7, i);
        for (int m = 2; m >= 0; --m)
            reversed[i] += scrambled_value(odd.ranks[static_cast<std::size_t>(m)], i);
    }
    // Otherwise the order would not be visible and the test would prove nothing.
    REQUIRE(std::memcmp(in_order.data(), reversed.data(), count * sizeof(float)) != 0);

    const auto first = run_once();
    const auto second = run_once();
    for (int r : odd.ranks) {
        INFO("rank " << r);
        const auto& mine = first[static_cast<std::size_t>(r)];
        CHECK(std::memcmp(mine.data(), in_order.data(), count * sizeof(float)) == 0);
        CHECK(std::memcmp(second[static_cast<std::size_t>(r)].data(), mine.data(),
                          count * sizeof(float)) == 0);
    }
}

// ---- point to point ---------------------------------------------------------------------

TEST_CASE("send/recv: every rank sends to both neighbours first, then receives", "[comm]") {
    const int n = GENERATE(2, 4, 8);
    struct outcome {
        std::vector<double> from_previous_tag_0, from_previous_tag_1, from_next;
        std::vector<std::int32_t> in_order;
    };
    const auto results = per_rank<outcome>(n, [&](communicator& c) {
        const int r = c.rank();
        const int next = (r + 1) % n;
        const int previous = (r + n - 1) % n;
        std::vector<double> buffer{double(r), 0.5};
        c.send(std::span<const double>(buffer), next, 0);
        buffer = {double(r) + 100.0, 1.5, 2.5};  // reusing the buffer at once is allowed
        c.send(std::span(buffer), next, 1);
        const std::vector<double> backwards{double(-r)};
        c.send(std::span(backwards), previous, 2);
        for (std::int32_t k = 0; k < 3; ++k) {
            const std::vector<std::int32_t> numbered{k, r};
            c.send(std::span(numbered), next, 3);
        }

        outcome o;
        // Tag 1 was sent after tag 0 but is received first: tags are separate queues.
        o.from_previous_tag_1.resize(3);
        c.recv(std::span(o.from_previous_tag_1), previous, 1);
        o.from_previous_tag_0.resize(2);
        c.recv(std::span(o.from_previous_tag_0), previous, 0);
        o.from_next.resize(1);
        c.recv(std::span(o.from_next), next, 2);
        for (int k = 0; k < 3; ++k) {
            std::vector<std::int32_t> numbered(2);
            c.recv(std::span(numbered), previous, 3);
            o.in_order.insert(o.in_order.end(), numbered.begin(), numbered.end());
        }
        return o;
    });
    for (int r = 0; r < n; ++r) {
        const int next = (r + 1) % n;
        const int previous = (r + n - 1) % n;
        const outcome& o = results[static_cast<std::size_t>(r)];
        INFO("n = " << n << ", rank " << r);
        CHECK(o.from_previous_tag_0 == std::vector<double>{double(previous), 0.5});
        CHECK(o.from_previous_tag_1 == std::vector<double>{double(previous) + 100.0, 1.5, 2.5});
        CHECK(o.from_next == std::vector<double>{double(-next)});
        CHECK(o.in_order == std::vector<std::int32_t>{0, previous, 1, previous, 2, previous});
    }
}

TEST_CASE("send/recv: a rank can send to itself", "[comm]") {
    in_process_world world(1);
    auto& c = world.rank(0);
    const std::vector<float> sent{1.0f, 2.0f};
    c.send(std::span(sent), 0, 7);
    std::vector<float> received(2);
    c.recv(std::span(received), 0, 7);
    CHECK(received == sent);
}

// ---- failures ---------------------------------------------------------------------------

TEST_CASE("a collective that one rank never joins times out, naming the missing rank", "[comm]") {
    const auto start = std::chrono::steady_clock::now();
    const std::string message = message_of<loom::comm_error>([] {
        run_ranks(
            4,
            [](communicator& c) {
                if (c.rank() == 3) return;  // stops early
                std::vector<float> data(4, 1.0f);
                c.all_reduce_sum(std::span(data), c.world());
            },
            comm_options{200ms});
    });
    const double elapsed = seconds_since(start);
    CHECK_THAT(message,
               Matches("rank [012]: all_reduce_sum \\(f32, 4 elements\\) on group \\{0,1,2,3\\} "
                       "timed out after 200 ms waiting for ranks \\{3\\}; a rank stopped or the "
                       "ranks called collectives in different orders \\(raise "
                       "comm_options::timeout if they are only slow\\)"));
    CHECK(elapsed >= 0.19);
    CHECK(elapsed < 3.0);
}

TEST_CASE("a recv whose message never comes times out", "[comm]") {
    const std::string message = message_of<loom::comm_error>([] {
        run_ranks(
            2,
            [](communicator& c) {
                if (c.rank() == 1) return;
                std::vector<double> data(2);
                c.recv(std::span(data), 1, 5);
            },
            comm_options{200ms});
    });
    CHECK_THAT(message, StartsWith("rank 0: recv (f64, 2 elements) from rank 1 with tag 5 timed "
                                   "out after 200 ms; no matching send arrived."));
    CHECK_THAT(message, Contains("raise comm_options::timeout"));
}

TEST_CASE("a rank that throws releases the others and run_ranks rethrows its error", "[comm]") {
    // The default timeout is a minute: only the failure can release the waiting ranks.
    in_process_world world(4);
    std::vector<std::string> seen_by_others(4);
    const auto start = std::chrono::steady_clock::now();
    const std::string message = message_of<loom::usage_error>([&] {
        run_ranks(world, [&](communicator& c) {
            std::vector<float> data(3, 1.0f);
            c.all_reduce_sum(std::span(data), c.world());
            if (c.rank() == 2) throw loom::usage_error("bad input");
            try {
                if (c.rank() == 1) {
                    c.recv(std::span(data), 2, 0);  // waits in recv, not in a collective
                } else {
                    c.all_reduce_sum(std::span(data), c.world());
                }
            } catch (const loom::comm_error& error) {
                seen_by_others[static_cast<std::size_t>(c.rank())] = error.what();
                throw;
            }
        });
    });
    CHECK(seconds_since(start) < 5.0);
    CHECK(message == "rank 2: bad input");
    CHECK(world.failed_rank() == std::optional<int>(2));
    // A rank that reaches its call after the failure is told so at once; the text starts the
    // same either way.
    CHECK_THAT(seen_by_others[0], StartsWith("rank 0: all_reduce_sum (f32, 3 elements) on group "
                                             "{0,1,2,3}: rank 2 failed: bad input"));
    CHECK_THAT(seen_by_others[1], StartsWith("rank 1: recv (f32, 3 elements) from rank 2 with "
                                             "tag 0: rank 2 failed: bad input"));
    CHECK_THAT(seen_by_others[3], StartsWith("rank 3: all_reduce_sum (f32, 3 elements) on group "
                                             "{0,1,2,3}: rank 2 failed: bad input"));

    // A failed world stays failed.
    std::vector<float> data(1);
    CHECK_THAT(message_of<loom::comm_error>(
                   [&] { world.rank(0).all_reduce_sum(std::span(data), world.rank(0).world()); }),
               Contains("rank 2 failed: bad input (the world has failed"));
}

TEST_CASE("run_ranks prefixes the rank to exceptions that are not loom errors", "[comm]") {
    const std::string message = message_of<loom::error>([] {
        run_ranks(3, [](communicator& c) {
            if (c.rank() == 1) throw std::runtime_error("out of memory");
            c.barrier(c.world());
        });
    });
    CHECK(message == "rank 1: out of memory");
}

TEST_CASE("abort wakes a rank that waits for the aborting one", "[comm]") {
    const std::string message = message_of<loom::comm_error>([] {
        run_ranks(2, [](communicator& c) {
            if (c.rank() == 0) {
                c.abort("disk full");
                return;
            }
            std::vector<std::int64_t> data(4);
            c.recv(std::span(data), 0, 9);
        });
    });
    CHECK_THAT(message, StartsWith("rank 1: recv (i64, 4 elements) from rank 0 with tag 9: rank 0 "
                                   "failed: disk full"));
}

TEST_CASE("mismatched collectives are reported with both sides", "[comm]") {
    // Each case: what rank 0 calls and what rank 1 calls as their first call on {0,1}.
    struct mismatch {
        const char* name;
        void (*rank_0)(communicator&);
        void (*rank_1)(communicator&);
        const char* side_0;
        const char* side_1;
    };
    const mismatch cases[] = {
        {"different operations",
         [](communicator& c) {
             std::vector<float> d(4);
             c.all_reduce_sum(std::span(d), c.world());
         },
         [](communicator& c) {
             std::vector<float> in(4), out(8);
             c.all_gather(in, std::span(out), c.world());
         },
         "all_reduce_sum (f32, 4 elements)", "all_gather (f32, 4 elements per rank)"},
        {"different counts",
         [](communicator& c) {
             std::vector<float> d(4);
             c.all_reduce_sum(std::span(d), c.world());
         },
         [](communicator& c) {
             std::vector<float> d(8);
             c.all_reduce_sum(std::span(d), c.world());
         },
         "all_reduce_sum (f32, 4 elements)", "all_reduce_sum (f32, 8 elements)"},
        {"different dtypes",
         [](communicator& c) {
             std::vector<float> d(4);
             c.all_reduce_sum(std::span(d), c.world());
         },
         [](communicator& c) {
             std::vector<double> d(4);
             c.all_reduce_sum(std::span(d), c.world());
         },
         "all_reduce_sum (f32, 4 elements)", "all_reduce_sum (f64, 4 elements)"},
        {"different roots",
         [](communicator& c) {
             std::vector<std::int32_t> d(2);
             c.broadcast(std::span(d), 0, c.world());
         },
         [](communicator& c) {
             std::vector<std::int32_t> d(2);
             c.broadcast(std::span(d), 1, c.world());
         },
         "broadcast (i32, 2 elements from rank 0)", "broadcast (i32, 2 elements from rank 1)"},
        {"different order",
         [](communicator& c) {
             std::vector<float> d(1);
             c.all_reduce_sum(std::span(d), c.world());
             c.barrier(c.world());
         },
         [](communicator& c) {
             std::vector<float> d(1);
             c.barrier(c.world());
             c.all_reduce_sum(std::span(d), c.world());
         },
         "all_reduce_sum (f32, 1 element)", "barrier"},
    };
    for (const mismatch& m : cases) {
        INFO(m.name);
        const std::string message = message_of<loom::comm_error>([&] {
            run_ranks(2, [&](communicator& c) { (c.rank() == 0 ? m.rank_0 : m.rank_1)(c); });
        });
        // Whichever rank arrived second reports it.
        const std::string expected_0 = std::string("rank 0: ") + m.side_0 +
                                       " on group {0,1} does not match " + m.side_1 +
                                       " called by rank 1; both are call #0 on this group.";
        const std::string expected_1 = std::string("rank 1: ") + m.side_1 +
                                       " on group {0,1} does not match " + m.side_0 +
                                       " called by rank 0; both are call #0 on this group.";
        CHECK((message.starts_with(expected_0) || message.starts_with(expected_1)));
        CHECK_THAT(message, Contains("in the same order"));
    }
}

TEST_CASE("a recv of another size than the send is reported", "[comm]") {
    const std::string message = message_of<loom::comm_error>([] {
        run_ranks(2, [](communicator& c) {
            std::vector<float> data(c.rank() == 0 ? 4 : 8);
            if (c.rank() == 0) {
                c.send(std::span(data), 1, 0);
            } else {
                c.recv(std::span(data), 0, 0);
            }
        });
    });
    CHECK_THAT(message, StartsWith("rank 1: recv (f32, 8 elements) from rank 0 with tag 0 "
                                   "received a message of f32, 4 elements; send and recv must "
                                   "agree on dtype and count"));
}

TEST_CASE("misuse throws usage_error on the calling rank, before any communication", "[comm]") {
    in_process_world world(4, comm_options{200ms});
    auto& c = world.rank(0);
    std::vector<float> four(4), eight(8), six(6);

    CHECK(message_of<loom::usage_error>([&] {
              c.all_reduce_sum(std::span(four), group{{1, 2}});
          }) ==
          "rank 0: all_reduce_sum (f32, 4 elements) on group {1,2}: rank 0 is not a member; "
          "call a collective only on groups that contain the calling rank");
    CHECK_THAT(message_of<loom::usage_error>([&] {
                   c.all_reduce_sum(std::span(four), group{{2, 0, 1}});
               }),
               Contains("on group {2,0,1}: ranks must be sorted ascending without repeats"));
    CHECK_THAT(message_of<loom::usage_error>([&] {
                   c.barrier(group{{0, 9}});
               }),
               Contains("rank 0: barrier on group {0,9}: rank 9 is outside the world of 4 ranks; "
                        "use global ranks in [0, 4)"));
    CHECK_THAT(message_of<loom::usage_error>([&] { c.barrier(group{}); }),
               Contains("the group is empty"));
    CHECK(message_of<loom::usage_error>([&] {
              c.all_gather(four, std::span(six), group{{0, 1}});
          }) ==
          "rank 0: all_gather (f32, 4 elements per rank) on group {0,1}: the output holds 6 "
          "elements but needs 8; size the output to in.size() * g.size()");
    CHECK_THAT(message_of<loom::usage_error>([&] {
                   c.reduce_scatter_sum(six, std::span(four), group{{0, 1}});
               }),
               Contains("the input holds 6 elements but needs 8"));
    CHECK_THAT(message_of<loom::usage_error>([&] {
                   c.all_to_all(six, std::span(six), group{{0, 1, 2, 3}});
               }),
               Contains("the input holds 6 elements but needs 4; size the input to a multiple of "
                        "g.size()"));
    CHECK_THAT(message_of<loom::usage_error>([&] {
                   c.all_to_all(eight, std::span(four), group{{0, 1}});
               }),
               Contains("the output holds 4 elements but needs 8"));
    CHECK_THAT(message_of<loom::usage_error>([&] {
                   c.broadcast(std::span(four), 3, group{{0, 1}});
               }),
               Contains("root rank 3 is not a member"));
    CHECK(message_of<loom::usage_error>([&] { c.send(std::span(four), 4, 0); }) ==
          "rank 0: send (f32, 4 elements) to rank 4 with tag 0: rank 4 is outside the world of 4 "
          "ranks; use a global rank in [0, 4)");
    CHECK_THAT(message_of<loom::usage_error>([&] { c.recv(std::span(four), 1, -1); }),
               Contains("tags must be non-negative"));
    CHECK_THAT(
        message_of<loom::usage_error>([&] { c.all_reduce_sum(nullptr, 4, dtype::f32, c.world()); }),
        Contains("a buffer is null"));
    CHECK_THAT(message_of<loom::usage_error>([&] { (void)world.rank(4); }),
               Contains("rank 4 is outside the world of 4 ranks"));
    CHECK_THAT(message_of<loom::usage_error>([] { in_process_world none(0); }),
               StartsWith("in_process_world: n = 0"));
    // Misuse does not fail the world.
    CHECK_FALSE(world.failed_rank().has_value());
}
