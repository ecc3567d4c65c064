// The MPI communicator on every rank of an MPI job (ctest runs it on 4 processes; any size
// works, the expectations follow the world size). Each rank checks its own results and
// prints what failed; the exit code is 0 only if every check on this rank passed, so
// mpirun fails when any rank does.
//
//   mpirun -np 4 --oversubscribe ./mpi_test_comm_mpi
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <iostream>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/runtime/comm/mpi.hpp>

namespace {

using loom::comm::comm_options;
using loom::comm::group;
using loom::comm::mpi_communicator;
using namespace std::chrono_literals;

class checker {
   public:
    explicit checker(int rank) : rank_(rank) {}

    void expect(bool passed, const std::string& what) {
        ++checks_;
        if (passed) return;
        ++failures_;
        std::cerr << "rank " << rank_ << ": FAILED: " << what << std::endl;
    }

    template <class T>
    void expect_equal(const std::vector<T>& actual, const std::vector<T>& expected,
                      const std::string& what) {
        std::ostringstream text;
        text << what << ": got";
        for (const T& value : actual) text << ' ' << value;
        text << ", expected";
        for (const T& value : expected) text << ' ' << value;
        expect(actual == expected, text.str());
    }

    int checks() const { return checks_; }
    int failures() const { return failures_; }

   private:
    int rank_;
    int checks_ = 0;
    int failures_ = 0;
};

// Inputs whose sums are exact in every dtype.
template <class T>
T input_value(int rank, std::size_t i) {
    if constexpr (std::is_floating_point_v<T>) {
        return T(rank) * T(1.5) + T(i) * T(0.25);
    } else {
        return T(rank * 1000 + static_cast<int>(i));
    }
}

template <class T>
std::vector<T> inputs_of(int rank, std::size_t count) {
    std::vector<T> values(count);
    for (std::size_t i = 0; i < count; ++i) values[i] = input_value<T>(rank, i);
    return values;
}

template <class T>
T expected_sum(const group& g, std::size_t i) {
    T total = 0;
    for (int r : g.ranks) total += input_value<T>(r, i);
    return total;
}

template <class T>
void check_collectives(mpi_communicator& c, checker& check, const char* type_name) {
    const int n = c.size();
    const int me = c.rank();
    const group all = c.world();
    const std::string suffix = std::string(" (") + type_name + ")";

    {  // all_reduce_sum, a count that is a multiple of no world size above 1
        const std::size_t count = 37;
        std::vector<T> data = inputs_of<T>(me, count);
        c.all_reduce_sum(std::span(data), all);
        std::vector<T> expected(count);
        for (std::size_t i = 0; i < count; ++i) expected[i] = expected_sum<T>(all, i);
        check.expect_equal(data, expected, "all_reduce_sum" + suffix);
    }
    {  // all_gather
        const std::size_t count = 3;
        const std::vector<T> in = inputs_of<T>(me, count);
        std::vector<T> out(count * static_cast<std::size_t>(n), T(-1));
        c.all_gather(in, std::span(out), all);
        std::vector<T> expected;
        for (int r = 0; r < n; ++r) {
            for (std::size_t i = 0; i < count; ++i) expected.push_back(input_value<T>(r, i));
        }
        check.expect_equal(out, expected, "all_gather" + suffix);
    }
    {  // reduce_scatter_sum
        const std::size_t chunk = 5;
        const std::vector<T> in = inputs_of<T>(me, chunk * static_cast<std::size_t>(n));
        std::vector<T> out(chunk, T(-1));
        c.reduce_scatter_sum(in, std::span(out), all);
        std::vector<T> expected(chunk);
        for (std::size_t i = 0; i < chunk; ++i) {
            expected[i] = expected_sum<T>(all, static_cast<std::size_t>(me) * chunk + i);
        }
        check.expect_equal(out, expected, "reduce_scatter_sum" + suffix);
    }
    {  // all_to_all: chunk j of rank i's input becomes chunk i of rank j's output
        const std::size_t chunk = 2;
        const auto value = [](int from, int to, std::size_t i) {
            return T(from * 100 + to * 10 + static_cast<int>(i));
        };
        std::vector<T> in(chunk * static_cast<std::size_t>(n));
        std::vector<T> expected(in.size());
        for (int peer = 0; peer < n; ++peer) {
            for (std::size_t i = 0; i < chunk; ++i) {
                in[static_cast<std::size_t>(peer) * chunk + i] = value(me, peer, i);
                expected[static_cast<std::size_t>(peer) * chunk + i] = value(peer, me, i);
            }
        }
        std::vector<T> out(in.size(), T(-1));
        c.all_to_all(in, std::span(out), all);
        check.expect_equal(out, expected, "all_to_all" + suffix);
    }
    {  // broadcast from the last rank (not rank 0 unless the world has one rank)
        const int root = n - 1;
        std::vector<T> data = me == root ? inputs_of<T>(root, 6) : std::vector<T>(6, T(-1));
        c.broadcast(std::span(data), root, all);
        check.expect_equal(data, inputs_of<T>(root, 6), "broadcast" + suffix);
    }
}

void check_point_to_point(mpi_communicator& c, checker& check) {
    const int n = c.size();
    const int me = c.rank();
    const int next = (me + 1) % n;
    const int previous = (me + n - 1) % n;
    // Everything is sent before anything is received: sends must not wait for receivers.
    std::vector<double> buffer{double(me), 0.5};
    c.send(std::span<const double>(buffer), next, 0);
    buffer = {double(me) + 100.0, 1.5, 2.5};  // reusing the buffer at once is allowed
    c.send(std::span<const double>(buffer), next, 1);
    const std::vector<double> backwards{double(-me)};
    c.send(std::span(backwards), previous, 2);
    for (std::int32_t k = 0; k < 3; ++k) {
        const std::vector<std::int32_t> numbered{k, me};
        c.send(std::span(numbered), next, 3);
    }
    // A message larger than the eager limit of the usual transports.
    std::vector<float> large(1 << 20);
    for (std::size_t i = 0; i < large.size(); ++i) large[i] = float(i % 1000) + float(me);
    c.send(std::span<const float>(large), next, 4);

    std::vector<double> tag_1(3), tag_0(2), from_next(1);
    c.recv(std::span(tag_1), previous, 1);  // sent second, received first
    c.recv(std::span(tag_0), previous, 0);
    c.recv(std::span(from_next), next, 2);
    check.expect_equal(tag_0, {double(previous), 0.5}, "recv tag 0 from the previous rank");
    check.expect_equal(tag_1, {double(previous) + 100.0, 1.5, 2.5},
                       "recv tag 1 from the previous rank");
    check.expect_equal(from_next, {double(-next)}, "recv tag 2 from the next rank");
    std::vector<std::int32_t> in_order;
    for (int k = 0; k < 3; ++k) {
        std::vector<std::int32_t> numbered(2);
        c.recv(std::span(numbered), previous, 3);
        in_order.insert(in_order.end(), numbered.begin(), numbered.end());
    }
    check.expect_equal(in_order, {0, previous, 1, previous, 2, previous},
                       "messages with one tag arrive in order");
    std::vector<float> large_received(large.size());
    c.recv(std::span(large_received), previous, 4);
    bool large_ok = true;
    for (std::size_t i = 0; i < large.size(); ++i) {
        large_ok = large_ok && large_received[i] == float(i % 1000) + float(previous);
    }
    check.expect(large_ok, "a 4 MiB message arrives intact");
}

void check_sub_groups(mpi_communicator& c, checker& check) {
    const int n = c.size();
    const int me = c.rank();
    if (n < 2) return;
    group half, strided;
    for (int r = 0; r < n; ++r) {
        if ((r < n / 2) == (me < n / 2)) half.ranks.push_back(r);
        if (r % 2 == me % 2) strided.ranks.push_back(r);
    }
    // Interleaved on three groups; each group's calls are matched on their own.
    for (const group* g : {&half, &strided, &half}) {
        const std::size_t count = 9;
        std::vector<float> data = inputs_of<float>(me, count);
        c.all_reduce_sum(std::span(data), *g);
        std::vector<float> expected(count);
        for (std::size_t i = 0; i < count; ++i) expected[i] = expected_sum<float>(*g, i);
        check.expect_equal(data, expected, "all_reduce_sum on group " + g->to_string());
    }
    std::vector<std::int32_t> gathered(strided.ranks.size(), -1);
    const std::vector<std::int32_t> mine{me};
    c.all_gather(mine, std::span(gathered), strided);
    check.expect_equal(gathered,
                       std::vector<std::int32_t>(strided.ranks.begin(), strided.ranks.end()),
                       "all_gather on group " + strided.to_string());
    std::vector<double> alone{double(me)};
    c.all_reduce_sum(std::span(alone), group{{me}});
    check.expect_equal(alone, {double(me)}, "all_reduce_sum on a group of one");
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

void check_determinism(mpi_communicator& c, checker& check) {
    const std::size_t count = 1001;
    std::vector<float> data(count);
    for (std::size_t i = 0; i < count; ++i) data[i] = scrambled_value(c.rank(), i);
    c.all_reduce_sum(std::span(data), c.world());
    // The same additions in the same order as the law says: rank 0 first.
    std::vector<float> in_order(count);
    for (std::size_t i = 0; i < count; ++i) {
        in_order[i] = scrambled_value(0, i);
        for (int r = 1; r < c.size(); ++r) in_order[i] += scrambled_value(r, i);
    }
    check.expect(std::memcmp(data.data(), in_order.data(), count * sizeof(float)) == 0,
                 "all_reduce_sum is bitwise the sum in rank order");
}

// bf16 moves as bits and is summed by loom, rounding to bf16 after each addition in rank
// order, so the sum is bitwise that of one loop over the ranks; a reduce-scatter gives each
// rank its chunk of the same sum.
void check_bf16(mpi_communicator& c, checker& check) {
    using loom::bfloat16;
    const std::size_t per_rank = 37, count = per_rank * static_cast<std::size_t>(c.size());
    std::vector<bfloat16> data(count), in_order(count);
    for (std::size_t i = 0; i < count; ++i) {
        data[i] = bfloat16(scrambled_value(c.rank(), i));
        in_order[i] = bfloat16(scrambled_value(0, i));
        for (int r = 1; r < c.size(); ++r)
            in_order[i] = bfloat16(static_cast<float>(in_order[i]) + static_cast<float>(bfloat16(scrambled_value(r, i))));
    }
    std::vector<bfloat16> mine(per_rank);
    c.reduce_scatter_sum(std::span<const bfloat16>(data), std::span(mine), c.world());
    c.all_reduce_sum(std::span(data), c.world());
    check.expect(std::memcmp(data.data(), in_order.data(), count * sizeof(bfloat16)) == 0,
                 "bf16 all_reduce_sum is bitwise the bf16 sum in rank order");
    check.expect(std::memcmp(mine.data(), in_order.data() + per_rank * static_cast<std::size_t>(c.rank()),
                             per_rank * sizeof(bfloat16)) == 0,
                 "bf16 reduce_scatter_sum gives each rank its chunk of the same sum");
}

void check_errors(checker& check, mpi_communicator& c) {
    const int n = c.size();
    const int me = c.rank();
    try {
        std::vector<float> data(4);
        c.all_reduce_sum(std::span(data), group{{(me + 1) % n}});
        check.expect(n == 1, "a group without the caller throws");
    } catch (const loom::usage_error& error) {
        check.expect(std::string(error.what()).find("is not a member") != std::string::npos,
                     std::string("usage_error names the problem: ") + error.what());
    }
    if (n < 2) return;

    // Rank 0 waits in a barrier that the others join only after it has timed out. A
    // communicator of its own keeps the timed-out call away from the main one, and outlives
    // the barriers below, which keep rank 0 making progress until the others are through.
    mpi_communicator late(comm_options{me == 0 ? 300ms : 20000ms});
    if (me == 0) {
        const auto start = std::chrono::steady_clock::now();
        try {
            late.barrier(late.world());
            check.expect(false, "a barrier that the other ranks have not joined times out");
        } catch (const loom::comm_error& error) {
            const std::string text = error.what();
            const double seconds =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            check.expect(text.starts_with("rank 0: barrier on group " + c.world().to_string() +
                                          " timed out after 300 ms"),
                         "timeout message: " + text);
            check.expect(seconds >= 0.29 && seconds < 5.0,
                         "timed out after " + std::to_string(seconds) + " s");
        }
        try {
            late.barrier(late.world());
            check.expect(false, "a communicator that timed out refuses further calls");
        } catch (const loom::comm_error& error) {
            check.expect(std::string(error.what()).find("an earlier call of this rank failed") !=
                             std::string::npos,
                         std::string("refusal message: ") + error.what());
        }
    }
    c.barrier(c.world());
    if (me != 0) late.barrier(late.world());  // completes the barrier rank 0 started
    c.barrier(c.world());
}

}  // namespace

int main(int argc, char** argv) {
    loom::comm::mpi_environment mpi(argc, argv);
    checker check(mpi.rank());
    try {
        mpi_communicator c(comm_options{20s});
        check.expect(c.rank() == mpi.rank() && c.size() == mpi.size(), "rank and size");
        check_collectives<float>(c, check, "f32");
        check_collectives<double>(c, check, "f64");
        check_collectives<std::int32_t>(c, check, "i32");
        check_collectives<std::int64_t>(c, check, "i64");
        check_point_to_point(c, check);
        check_sub_groups(c, check);
        check_determinism(c, check);
        check_bf16(c, check);
        c.barrier(c.world());
        check_errors(check, c);
        c.barrier(c.world());
    } catch (const std::exception& error) {
        std::cerr << "rank " << mpi.rank() << ": FAILED with an exception: " << error.what()
                  << std::endl;
        return 2;
    }
    std::cout << "rank " << mpi.rank() << " of " << mpi.size() << ": " << check.checks()
              << " checks, " << check.failures() << " failed" << std::endl;
    return check.failures() == 0 ? 0 : 1;
}
