// Temporal-order search (include/loom/search/order_search.hpp): the known optima of uniform
// pipelines, agreement with a brute-force enumeration of every valid set of device orders,
// 3F1B against its template, the node cut of the recycling constraints, and the memory cap.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <loom/schedule/all.hpp>
#include <loom/search/order_search.hpp>

using namespace loom;
using schedule::backward_block;
using schedule::block;
using schedule::cost_model;
using schedule::forward_block;
using schedule::pipeline_shape;
using search::activation_memory;
using search::order_search;
using search::order_search_result;

namespace {

using orders = std::vector<std::vector<block>>;

// Does every pair of the constraints run in order on the schedule?
bool respects(const schedule::schedule& s, const std::vector<schedule::before>& constraints) {
    const auto position = schedule::order_positions(s);
    for (const auto& c : constraints)
        for (const auto& q : schedule::expand(c, s.shape)) {
            const int d = s.shape.devices_of(q.first.stage).front();
            const auto& pos = position[static_cast<std::size_t>(d)];
            if (pos[static_cast<std::size_t>(schedule::block_index(s.shape, q.first))] >
                pos[static_cast<std::size_t>(schedule::block_index(s.shape, q.then))])
                return false;
        }
    return true;
}

// What every answer must satisfy: valid under the cap, the constraints kept, and the makespan
// the simulator gives for the orders.
void check_answer(const order_search_result& r, const cost_model& costs, const activation_memory& memory,
                  const std::vector<schedule::before>& constraints = {}) {
    REQUIRE(r.found);
    INFO(schedule::to_string(r.best));
    REQUIRE(schedule::validation_error(r.best, memory.validation()).empty());
    CHECK(respects(r.best, constraints));
    CHECK(r.makespan == schedule::simulate(r.best, costs).makespan);
    CHECK(r.stats.root_lower_bound <= r.makespan * (1 + 1e-12));  // sums in another order: allow rounding
}

cost_model random_costs(const pipeline_shape& p, unsigned seed, bool integral, double latency) {
    std::mt19937 rng(seed);
    std::vector<double> times(static_cast<std::size_t>(schedule::block_count(p)));
    std::uniform_int_distribution<int> small(1, 4);
    std::uniform_real_distribution<double> real(0.5, 3.0);
    for (double& t : times) t = integral ? small(rng) : real(rng);
    cost_model c;
    c.latency = latency;
    c.duration = [p, times](const block& b) { return times[static_cast<std::size_t>(schedule::block_index(p, b))]; };
    return c;
}

// ---- brute force ------------------------------------------------------------------------------

// Every order of device d's blocks (rounds = 1) in which each forward precedes its backward.
std::vector<std::vector<block>> device_orders(const pipeline_shape& p, int d) {
    auto blocks = schedule::blocks_on(p, d);
    std::sort(blocks.begin(), blocks.end());
    std::vector<std::vector<block>> out;
    do {
        bool ok = true;
        for (std::size_t i = 0; i < blocks.size() && ok; ++i)
            if (schedule::is_backward(blocks[i]))
                ok = std::find(blocks.begin(), blocks.begin() + static_cast<std::ptrdiff_t>(i),
                               forward_block(blocks[i].stage, blocks[i].micro)) !=
                     blocks.begin() + static_cast<std::ptrdiff_t>(i);
        if (ok) out.push_back(blocks);
    } while (std::next_permutation(blocks.begin(), blocks.end()));
    return out;
}

struct brute_force_answer {
    double makespan = std::numeric_limits<double>::infinity();
    long valid = 0;  // valid order tuples seen
};

// The least makespan over every tuple of device orders that validates (with the cap) and keeps
// the constraints. With `fifo_filter`, only tuples whose devices run their forwards in one
// micro-batch order and their backwards in one order are tried: messages cannot cross
// (validate's channel check), so a linear pipeline's channels force exactly this; a test
// checks the filter against the unfiltered enumeration.
brute_force_answer brute_force(const pipeline_shape& p, const cost_model& costs, const activation_memory& memory,
                               const std::vector<schedule::before>& constraints, bool fifo_filter) {
    using key = std::pair<std::vector<int>, std::vector<int>>;  // forward micro order, backward micro order
    std::vector<std::map<key, std::vector<std::vector<block>>>> by_key(static_cast<std::size_t>(p.devices));
    for (int d = 0; d < p.devices; ++d)
        for (auto& o : device_orders(p, d)) {
            key k;
            if (fifo_filter)
                for (const block& b : o) (schedule::is_forward(b) ? k.first : k.second).push_back(b.micro);
            by_key[static_cast<std::size_t>(d)][k].push_back(std::move(o));
        }
    brute_force_answer best;
    const auto options = memory.validation();
    for (const auto& [k, first] : by_key[0]) {
        std::vector<const std::vector<std::vector<block>>*> groups;
        bool all = true;
        for (int d = 0; d < p.devices; ++d) {
            auto it = by_key[static_cast<std::size_t>(d)].find(k);
            if (it == by_key[static_cast<std::size_t>(d)].end()) all = false;
            else groups.push_back(&it->second);
        }
        if (!all) continue;
        std::vector<std::size_t> pick(groups.size(), 0);
        while (true) {
            schedule::schedule s{p, {}, "brute force"};
            for (std::size_t d = 0; d < groups.size(); ++d) s.device_order.push_back((*groups[d])[pick[d]]);
            if (schedule::validation_error(s, options).empty() && respects(s, constraints)) {
                ++best.valid;
                best.makespan = std::min(best.makespan, schedule::simulate(s, costs).makespan);
            }
            std::size_t d = 0;
            while (d < pick.size() && ++pick[d] == groups[d]->size()) pick[d++] = 0;
            if (d == pick.size()) break;
        }
    }
    return best;
}

}  // namespace

TEST_CASE("uniform costs: the optimum is 1F1B's (m + p - 1)(f + b), also under a cap of p micro-batches",
          "[search][order]") {
    for (double b : {1.0, 2.0})
        for (int p : {2, 3})
            for (int m : {p + 1, p + 3}) {
                INFO("p " << p << ", m " << m << ", f 1, b " << b);
                const cost_model costs{.forward = 1, .backward = b};
                const auto shape = pipeline_shape::linear(p, m);
                const double optimum = (m + p - 1) * (1 + b);

                const auto free = order_search(shape, costs);
                check_answer(free, costs, {});
                CHECK(free.stats.complete);
                CHECK(free.makespan == optimum);

                // p micro-batches of stage 0 fit; GPipe holds all m > p there.
                const activation_memory cap{std::vector<std::int64_t>(static_cast<std::size_t>(p), 10), 10 * p};
                REQUIRE_FALSE(schedule::validation_error(schedule::gpipe(p, m), cap.validation()).empty());
                REQUIRE(schedule::validation_error(schedule::one_f_one_b(p, m), cap.validation()).empty());
                const auto capped = order_search(shape, costs, cap);
                check_answer(capped, costs, cap);
                CHECK(capped.makespan == optimum);
                CHECK(schedule::peak_in_flight(capped.best).per_stage[0] <= p);
                CHECK(capped.best.device_order != schedule::gpipe(p, m).device_order);

                // One micro-batch fewer on stage 0 rules out every optimal order.
                const activation_memory tight{std::vector<std::int64_t>(static_cast<std::size_t>(p), 10), 10 * (p - 1)};
                const auto slower = order_search(shape, costs, tight);
                check_answer(slower, costs, tight);
                CHECK(slower.makespan > optimum);
                CHECK(slower.stats.pruned_by_memory > 0);
            }
}

TEST_CASE("the brute force's message-order filter drops no valid tuple", "[search][order]") {
    for (auto [p, m] : {std::pair{2, 2}, std::pair{2, 3}, std::pair{3, 2}}) {
        INFO("p " << p << ", m " << m);
        const auto shape = pipeline_shape::linear(p, m);
        const auto costs = random_costs(shape, 7, false, 0.0);
        const auto all = brute_force(shape, costs, {}, {}, false);
        const auto filtered = brute_force(shape, costs, {}, {}, true);
        CHECK(all.valid == filtered.valid);
        CHECK(all.makespan == filtered.makespan);
        CHECK(all.valid > 1);
    }
}

TEST_CASE("the search finds the brute-force optimum on small pipelines with random costs", "[search][order]") {
    struct shape_case {
        int p, m;
    };
    for (auto [p, m] : {shape_case{2, 2}, shape_case{2, 3}, shape_case{2, 4}, shape_case{3, 2}, shape_case{3, 3}})
        for (unsigned seed : {1u, 2u, 3u}) {
            const auto shape = pipeline_shape::linear(p, m);
            const bool integral = seed == 2;          // ties in start times
            const double latency = seed == 3 ? 0.25 : 0.0;
            const auto costs = random_costs(shape, seed * 101 + static_cast<unsigned>(p * 10 + m), integral, latency);
            INFO("p " << p << ", m " << m << ", seed " << seed);

            const auto expected = brute_force(shape, costs, {}, {}, true);
            const auto found = order_search(shape, costs);
            check_answer(found, costs, {});
            CHECK(found.stats.complete);
            CHECK(found.makespan == Approx(expected.makespan).epsilon(1e-12));

            // A cap of two micro-batches per device (stage bytes 3, 5, 4; cap 2 x the stage's).
            activation_memory cap;
            for (int s = 0; s < p; ++s) cap.activation_bytes.push_back(3 + 2 * (s % 2) - (s / 2));
            cap.memory_cap_bytes = 2 * *std::max_element(cap.activation_bytes.begin(), cap.activation_bytes.end());
            if (m > 2) {
                const auto expected_capped = brute_force(shape, costs, cap, {}, true);
                const auto capped = order_search(shape, costs, cap);
                check_answer(capped, costs, cap);
                CHECK(capped.makespan == Approx(expected_capped.makespan).epsilon(1e-12));
                CHECK(capped.makespan >= found.makespan);
            }

            // Forwards and backwards in micro-batch order: the interleaving is still free.
            const auto micro_order = schedule::micro_order_constraints();
            const auto expected_ordered = brute_force(shape, costs, {}, micro_order, true);
            const auto ordered = order_search(shape, costs, {}, micro_order);
            check_answer(ordered, costs, {}, micro_order);
            CHECK(ordered.makespan == Approx(expected_ordered.makespan).epsilon(1e-12));
            CHECK(ordered.makespan >= found.makespan);
        }
}

TEST_CASE("3F1B: the search under the recycling constraints is no worse than the template", "[search][order]") {
    const auto constraints = schedule::recycling_constraints(3);
    for (int p : {2, 3, 4})
        for (int m : {2, 4}) {
            const auto shape = pipeline_shape::linear(p, m, 3);
            for (const cost_model& costs :
                 {cost_model{.forward = 1, .backward = 2}, random_costs(shape, static_cast<unsigned>(p * m), false, 0.0)}) {
                INFO("p " << p << ", m " << m);
                const auto found = order_search(shape, costs, {}, constraints);
                check_answer(found, costs, {}, constraints);
                CHECK(found.stats.complete);
                const auto from_template = schedule::three_f_one_b(p, m, costs);
                REQUIRE(respects(from_template, constraints));
                CHECK(found.makespan <= schedule::simulate(from_template, costs).makespan);
            }
        }
}

TEST_CASE("3F1B with 4 stages: the recycling constraints cut the search's nodes", "[search][order]") {
    const int p = 4, m = 4;
    const auto shape = pipeline_shape::linear(p, m, 3);
    const cost_model costs{.forward = 1, .backward = 2};
    const auto constraints = schedule::recycling_constraints(3);
    const auto with = order_search(shape, costs, {}, constraints);
    const auto without = order_search(shape, costs);
    check_answer(with, costs, {}, constraints);
    check_answer(without, costs, {});
    REQUIRE(with.stats.complete);
    REQUIRE(without.stats.complete);
    CHECK(with.makespan >= without.makespan);  // the constraints only remove orders
    CHECK(with.stats.pruned_by_constraint > 0);
    const double factor = static_cast<double>(without.stats.nodes) / static_cast<double>(with.stats.nodes);
    WARN("3F1B, 4 stages, 4 micro-batches, f = 1, b = 2: " << without.stats.nodes << " nodes without constraints, "
         << with.stats.nodes << " with (" << factor << "x fewer); makespan " << without.makespan << " vs "
         << with.makespan << "\n  without: " << without.explain() << "\n  with:    " << with.explain());
    CHECK(factor >= 10.0);
}

TEST_CASE("a memory cap no order can meet is an error naming the stage", "[search][order]") {
    const auto shape = pipeline_shape::linear(3, 4);
    // Stage 1 alone needs 8 bytes for one micro-batch.
    const activation_memory too_small{{4, 8, 4}, 6};
    REQUIRE_THROWS_WITH(order_search(shape, {}, too_small),
                        Catch::Contains("stage 1 cannot fit") && Catch::Contains("at least 8"));

    // Every stage fits one micro-batch, but 1F1B's constraints keep 3 in flight on stage 0.
    const activation_memory two{{4, 4, 4}, 8};
    REQUIRE(order_search(shape, {}, two).found);  // without constraints some order fits
    REQUIRE_THROWS_WITH(order_search(shape, {}, two, schedule::one_f_one_b_constraints()),
                        Catch::Contains("no order") && Catch::Contains("device 0, stage 0"));
}

TEST_CASE("a node or time budget stops the search with the best order so far", "[search][order]") {
    const auto shape = pipeline_shape::linear(4, 4, 3);
    const cost_model costs{.forward = 1, .backward = 2};
    const auto full = order_search(shape, costs);
    const auto cut = order_search(shape, costs, {}, {}, {.nodes = 200});
    CHECK_FALSE(cut.stats.complete);
    CHECK(cut.stats.nodes == 200);
    CHECK(cut.explain().find("budget ran out") != std::string::npos);
    if (cut.found) {
        check_answer(cut, costs, {});
        CHECK(cut.makespan >= full.makespan);
    }
    const auto none = order_search(shape, costs, {}, {}, {.nodes = 5});
    CHECK_FALSE(none.found);
    CHECK_FALSE(none.stats.complete);
    const auto no_time = order_search(shape, costs, {}, {}, {.seconds = 1e-9});
    CHECK_FALSE(no_time.stats.complete);
    CHECK(no_time.stats.nodes < full.stats.nodes);
}

TEST_CASE("the search rejects what it cannot handle, saying why", "[search][order]") {
    REQUIRE_THROWS_WITH(order_search(pipeline_shape::interlaced(2, 2)), Catch::Contains("one device per stage"));
    REQUIRE_THROWS_WITH(order_search(pipeline_shape::linear(2, 2), {.forward = 0}), Catch::Contains("positive times"));
    REQUIRE_THROWS_WITH(order_search(pipeline_shape::linear(2, 2), {}, {{1, 2, 3}, 0}),
                        Catch::Contains("one byte count per stage"));
    using namespace schedule::var;
    const std::vector<schedule::before> cycle{schedule::before{schedule::backward(micro), schedule::forward(micro)}};
    REQUIRE_THROWS_WITH(order_search(pipeline_shape::linear(2, 2), {}, {}, cycle), Catch::Contains("cycle"));
}
