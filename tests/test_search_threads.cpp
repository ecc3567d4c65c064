// The searcher prices candidates on several threads: the answer and the statistics are those
// of pricing one at a time, and a failure on a pricing thread reaches the caller in its turn.
// Small enough to run under ThreadSanitizer (tools/test.sh).
#include <catch2/catch.hpp>
#include <atomic>
#include <chrono>

#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <loom/plan/spaces.hpp>
#include <loom/search/plan_search.hpp>

#include "support/search_fixtures.hpp"

using namespace loom;
using loom::testing::slow_node;
using loom::testing::small_gpt;

namespace {

// Every assignment is counted once: unbounded, refused, priced, left, pruned or set aside
// over memory.
void check_every_assignment_counted(const search::plan_search_result& r) {
    CHECK(r.stats.unbounded + r.stats.refused + r.stats.priced + r.stats.unexplored + r.stats.pruned +
              r.stats.over_memory_unpriced ==
          r.stats.assignments);
}

// A space of x in 1..4 and y in 1..2 on one device, searched on one thread with a count
// budget of one bounded assignment and `max_priced` prices. Bounds that add 100 at y = 2
// keep the descent at y = 1, so the space stays unbounded (the answer unproven).
struct unbounded_xy_space {
    plan::plan_spec space;
    std::vector<search::open_parameter> params{{"x", search::open_parameter::kind::degree, {1, 2, 3, 4}, {}},
                                               {"y", search::open_parameter::kind::degree, {1, 2}, {}}};
    search::plan_search_options o;
    explicit unbounded_xy_space(std::int64_t max_priced) {
        space.devices = 1;
        o.threads = 1;
        o.max_bounded = 1;
        o.max_priced = max_priced;
    }
};

// Two orders, A and B, and x in 1..4 on one device, searched on one thread with a count
// budget of one bounded assignment (A, x = 1) and two prices.
struct two_order_space {
    plan::plan_spec space;
    std::vector<search::open_parameter> params{{"order", search::open_parameter::kind::order, {0, 1}, {"A", "B"}},
                                               {"x", search::open_parameter::kind::degree, {1, 2, 3, 4}, {}}};
    search::plan_search_options o;
    two_order_space() {
        space.devices = 1;
        o.threads = 1;
        o.max_bounded = 1;
        o.max_priced = 2;
    }
};

}  // namespace

TEST_CASE("pricing on several threads gives the answer and the statistics of pricing one at a time") {
    const auto model = small_gpt();
    const plan::plan_spec space = plan::spaces::nnscaler(4).narrow("mb", {2}).narrow("zero", {1}).narrow("coshard", {1});
    search::plan_search_options serial, parallel;
    serial.threads = 1;
    parallel.threads = 3;
    const search::plan_search_result one = search::search_plan(model.ir(), space, slow_node(), serial);
    const search::plan_search_result three = search::search_plan(model.ir(), space, slow_node(), parallel);
    CHECK(one.stats.priced > 10);
    CHECK(one.stats.pruned > 0);
    CHECK(three.best.choices == one.best.choices);
    CHECK(three.best.price.step_seconds == one.best.price.step_seconds);
    REQUIRE(three.runner_up.has_value() == one.runner_up.has_value());
    if (one.runner_up) CHECK(three.runner_up->choices == one.runner_up->choices);
    CHECK(three.stats.priced == one.stats.priced);
    CHECK(three.stats.pruned == one.stats.pruned);
    CHECK(three.stats.refused == one.stats.refused);
    CHECK(three.stats.over_memory == one.stats.over_memory);
    CHECK(three.stats.ties == one.stats.ties);
    CHECK(three.gap == one.gap);
    // With a count budget, the same leaves are priced.
    serial.max_priced = parallel.max_priced = 5;
    const search::plan_search_result five = search::search_plan(model.ir(), space, slow_node(), serial);
    const search::plan_search_result five_parallel = search::search_plan(model.ir(), space, slow_node(), parallel);
    CHECK(five.stats.priced == 5);
    CHECK(five_parallel.stats.priced == 5);
    CHECK(five_parallel.best.choices == five.best.choices);
    CHECK(five_parallel.gap == five.gap);
}

TEST_CASE("a price that fails on a pricing thread fails the search in its turn, a refusal is counted") {
    // search_assignments with stand-in bounds and prices: leaf k is bounded at k and priced
    // at 100 - k, so the search prices every leaf; two refuse, and with `fail` one throws.
    plan::plan_spec space;
    space.devices = 1;
    search::open_parameter p{"x", search::open_parameter::kind::degree, {0, 1, 2, 3, 4, 5, 6, 7}, {}};
    const auto model = small_gpt();
    for (bool fail : {false, true}) {
        INFO("fail: " << fail);
        search::plan_search_options o;
        o.threads = 4;
        const auto bound = [](const plan::plan_spec& c) {
            return search::detail::assignment_bounds{static_cast<double>(c.choices.at("x")), 0.0};
        };
        const auto price = [fail](const plan::plan_spec& c, const std::atomic<bool>&) {
            const std::int64_t x = c.choices.at("x");
            if (x == 2 || x == 5) throw plan_error("leaf " + std::to_string(x) + " refused");
            if (fail && x == 6) throw std::runtime_error("leaf 6 failed");
            search::program_price out;
            out.step_seconds = 100.0 - static_cast<double>(x);
            out.devices.resize(1);
            return out;
        };
        if (fail) {
            CHECK_THROWS_WITH(search::detail::search_assignments(space, {p}, search::dgx_a100(1), o, model.ir(), bound, price),
                              "leaf 6 failed");
            continue;
        }
        const search::plan_search_result r =
            search::detail::search_assignments(space, {p}, search::dgx_a100(1), o, model.ir(), bound, price);
        CHECK(r.best.choices.at("x") == 7);
        CHECK(r.stats.priced == 6);
        CHECK(r.stats.refused == 2);
        CHECK(r.stats.refusals.at("leaf 2 refused") == 1);
    }
}

TEST_CASE("past its time budget with a plan in hand, the search cancels the prices it would drop") {
    // Leaf 0 prices at once; every other price runs until the search cancels it. Without
    // the cancellation the search would wait for them: here each gives up after a minute
    // and fails the search instead of hanging it.
    plan::plan_spec space;
    space.devices = 1;
    search::open_parameter p{"x", search::open_parameter::kind::degree, {0, 1, 2, 3, 4, 5}, {}};
    const auto model = small_gpt();
    search::plan_search_options o;
    o.threads = 3;
    o.time_budget_seconds = 0.2;
    const auto bound = [](const plan::plan_spec& c) {
        return search::detail::assignment_bounds{static_cast<double>(c.choices.at("x")), 0.0};
    };
    std::atomic<int> cancelled{0};
    const auto price = [&cancelled](const plan::plan_spec& c, const std::atomic<bool>& cancel) {
        const std::int64_t x = c.choices.at("x");
        if (x > 0) {
            const auto given_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
            while (!cancel.load()) {
                if (std::chrono::steady_clock::now() > given_up) throw std::runtime_error("leaf " + std::to_string(x) + " never cancelled");
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
            ++cancelled;
            throw search::price_cancelled();
        }
        search::program_price out;
        out.step_seconds = 100.0;
        out.devices.resize(1);
        return out;
    };
    const search::plan_search_result r =
        search::detail::search_assignments(space, {p}, search::dgx_a100(1), o, model.ir(), bound, price);
    CHECK(r.best.choices.at("x") == 0);
    CHECK(r.stats.priced == 1);
    CHECK(r.stats.refused == 0);
    CHECK(r.stats.unexplored == 5);  // the cancelled ones among them, none counted refused
    CHECK(cancelled >= 1);           // at least the one whose turn came; the others were in flight or never started
    CHECK(r.gap > 0);
}

TEST_CASE("a budget that leaves the space unbounded prices the best-bounded of each order first") {
    // Order A's bounds are loose (5 - x, priced at 100 + x), order B's tight (10 + x, priced
    // at 20 + x): by bound alone the two prices allowed would both go to A. The enumeration
    // stops after one assignment (A, x = 1); the descent starts from it (and moves A to
    // x = 4) and from it moved to B, keeping each order, and the first prices are the best
    // of each order.
    const two_order_space ab;
    const auto model = small_gpt();
    const auto bound = [](const plan::plan_spec& c) {
        const auto x = static_cast<double>(c.choices.at("x"));
        return search::detail::assignment_bounds{c.choices.at("order") == 0 ? 5 - x : 10 + x, 0.0};
    };
    const auto price = [](const plan::plan_spec& c, const std::atomic<bool>&) {
        const auto x = static_cast<double>(c.choices.at("x"));
        search::program_price out;
        out.step_seconds = c.choices.at("order") == 0 ? 100 + x : 20 + x;
        out.devices.resize(1);
        return out;
    };
    const search::plan_search_result r =
        search::detail::search_assignments(ab.space, ab.params, search::dgx_a100(1), ab.o, model.ir(), bound, price);
    INFO(r.explain());
    CHECK(r.stats.priced == 2);
    CHECK(r.stats.descended == 4);  // A at x = 2, 3, 4 and B at x = 1
    CHECK(r.best.choices.at("order") == 1);
    CHECK(r.best.choices.at("x") == 1);
    CHECK(r.best.price.step_seconds == 21.0);
    CHECK(r.gap == 1.0);
    // Every assignment counted once.
    check_every_assignment_counted(r);
}

TEST_CASE("the other orders' descents start where the first order's descent ended") {
    // Both orders bound lower as x grows (A at 5 - x, B at 10 - x). The enumeration stops
    // after one assignment (A, x = 1); A's descent moves to x = 2, 3, 4. B starts at A's end
    // moved to B (x = 4, bound 6, ahead of its own start's 9) instead of retracing the path
    // from x = 1: B at x = 1 (its start, moved from the corner) and at x = 4 are all it moves
    // to (it looks at x = 2 and 3 from there, and stays).
    const two_order_space ab;
    const auto model = small_gpt();
    const auto bound = [](const plan::plan_spec& c) {
        const auto x = static_cast<double>(c.choices.at("x"));
        return search::detail::assignment_bounds{c.choices.at("order") == 0 ? 5 - x : 10 - x, 0.0};
    };
    const auto price = [](const plan::plan_spec& c, const std::atomic<bool>&) {
        const auto x = static_cast<double>(c.choices.at("x"));
        search::program_price out;
        out.step_seconds = c.choices.at("order") == 0 ? 100 - x : 20 - x;
        out.devices.resize(1);
        return out;
    };
    const search::plan_search_result r =
        search::detail::search_assignments(ab.space, ab.params, search::dgx_a100(1), ab.o, model.ir(), bound, price);
    INFO(r.explain());
    CHECK(r.stats.descended == 5);  // A at x = 2, 3, 4 and B at x = 1 and 4 (7 retracing A's path)
    CHECK(r.best.choices.at("order") == 1);
    CHECK(r.best.choices.at("x") == 4);
    CHECK(r.best.price.step_seconds == 16.0);
    check_every_assignment_counted(r);
}

TEST_CASE("the descent's exchange of degrees takes fewer micro-batches where the batch needs it") {
    // 4 devices, dp x pp = 4, a batch of 4 samples split over dp replicas of mb micro-batches
    // (dp x mb <= 4, else refused). The enumeration stops after one assignment (dp 1, pp 4,
    // mb 1); the descent moves to mb 4, from where every exchange of dp and pp is refused at
    // 4 micro-batches. With the micro-batches the batch allows it reaches dp 4, pp 1, mb 1.
    plan::plan_spec space;
    space.devices = 1;
    const std::vector<search::open_parameter> params{
        {"dp", search::open_parameter::kind::degree, {1, 2, 4}, {}},
        {"pp", search::open_parameter::kind::degree, {1, 2, 4}, {}},
        {"mb", search::open_parameter::kind::micro_batches, {1, 2, 4}, {}},
    };
    const auto model = small_gpt();
    search::plan_search_options o;
    o.threads = 1;
    o.max_bounded = 1;
    const auto step = [](const plan::plan_spec& c) {
        // Noted as the resolver notes what it reads: a refusal skips only the assignments
        // that agree on these.
        for (const char* name : {"dp", "pp", "mb"}) plan::detail::note_choice(name);
        const std::int64_t dp = c.choices.at("dp"), pp = c.choices.at("pp"), mb = c.choices.at("mb");
        if (dp * pp != 4) throw plan_error("the degrees do not fill the 4 devices");
        if (dp * mb > 4) throw plan_error("the batch of 4 does not split into dp x mb");
        return static_cast<double>(20 - mb - 3 * dp);
    };
    const auto bound = [&](const plan::plan_spec& c) { return search::detail::assignment_bounds{step(c), 0.0}; };
    const auto price = [&](const plan::plan_spec& c, const std::atomic<bool>&) {
        search::program_price out;
        out.step_seconds = step(c);
        out.devices.resize(1);
        return out;
    };
    const search::plan_search_result r =
        search::detail::search_assignments(space, params, search::dgx_a100(1), o, model.ir(), bound, price);
    INFO(r.explain());
    CHECK(r.best.choices.at("dp") == 4);
    CHECK(r.best.choices.at("pp") == 1);
    CHECK(r.best.choices.at("mb") == 1);
    CHECK(r.best.price.step_seconds == 7.0);
}

TEST_CASE("a budget that leaves the space unbounded passes over leaves whose floors priced plans show to be over memory") {
    // Bounds 10 - x (y = 2 adds 100: the descent looks at it and stays at y = 1, so the space
    // stays unbounded), so x = 4, 3, 2, 1 in turn. Priced memory is 1.5 times the floor:
    // x = 4 (floor 60 GB) prices at 90 GB, over the 80 GiB of the device. Then x = 3 (floor
    // 70 GB, 105 GB at that ratio) is passed over, unpriced, and x = 2 (floor 40 GB) is the
    // answer, two prices in all instead of three.
    const unbounded_xy_space xy(2);
    const auto model = small_gpt();
    const auto floor_of = [](const plan::plan_spec& c) {
        switch (c.choices.at("x")) {
            case 4: return 60e9;
            case 3: return 70e9;
            case 2: return 40e9;
            default: return 30e9;
        }
    };
    const auto bound = [&](const plan::plan_spec& c) {
        return search::detail::assignment_bounds{
            10.0 - static_cast<double>(c.choices.at("x")) + 100.0 * static_cast<double>(c.choices.at("y") - 1), floor_of(c)};
    };
    const auto price = [&](const plan::plan_spec& c, const std::atomic<bool>&) {
        search::program_price out;
        out.step_seconds = 20.0 - static_cast<double>(c.choices.at("x")) + 100.0 * static_cast<double>(c.choices.at("y") - 1);
        out.devices.resize(1);
        out.devices[0].memory.arena = 1.5 * floor_of(c);
        return out;
    };
    const search::plan_search_result r =
        search::detail::search_assignments(xy.space, xy.params, search::dgx_a100(1), xy.o, model.ir(), bound, price);
    INFO(r.explain());
    CHECK(r.stats.priced == 2);
    CHECK(r.stats.over_memory == 1);
    CHECK(r.best.choices.at("x") == 2);
    CHECK(r.gap == 1.0);
    check_every_assignment_counted(r);
}

TEST_CASE("a budget that leaves the space unbounded prices first the cheapest of the leaves whose bounds lie within 10%") {
    // Bounds 9.6 to 9.9 (x = 4 down to 1), within 10% of one another; y = 2 adds 100 and
    // keeps the space unbounded (the descent stays at y = 1). What each price costs: x = 3
    // the least, then x = 1, x = 2, x = 4. One price allowed: it goes to x = 3, where bound
    // order alone would price x = 4. Without a cost, x = 4.
    const unbounded_xy_space xy(1);
    const auto model = small_gpt();
    const auto bound = [&](const plan::plan_spec& c) {
        return search::detail::assignment_bounds{
            10.0 - 0.1 * static_cast<double>(c.choices.at("x")) + 100.0 * static_cast<double>(c.choices.at("y") - 1), 1e9};
    };
    std::vector<std::int64_t> priced;
    const auto price = [&](const plan::plan_spec& c, const std::atomic<bool>&) {
        priced.push_back(c.choices.at("x"));
        search::program_price out;
        out.step_seconds = 20.0 - static_cast<double>(c.choices.at("x")) + 100.0 * static_cast<double>(c.choices.at("y") - 1);
        out.devices.resize(1);
        out.devices[0].memory.arena = 1e9;
        return out;
    };
    const auto cost = [](const plan::plan_spec& c) {
        switch (c.choices.at("x")) {
            case 3: return 1.0;
            case 1: return 10.0;
            case 2: return 50.0;
            default: return 100.0;
        }
    };
    const search::plan_search_result r =
        search::detail::search_assignments(xy.space, xy.params, search::dgx_a100(1), xy.o, model.ir(), bound, price, cost);
    INFO(r.explain());
    // (A price launched ahead of its turn may run and be dropped: only the first counts.)
    REQUIRE_FALSE(priced.empty());
    CHECK(priced.front() == 3);
    CHECK(r.stats.priced == 1);
    CHECK(r.best.choices.at("x") == 3);
    CHECK(r.gap == 1.0);
    check_every_assignment_counted(r);

    priced.clear();
    const search::plan_search_result by_bound =
        search::detail::search_assignments(xy.space, xy.params, search::dgx_a100(1), xy.o, model.ir(), bound, price);
    REQUIRE_FALSE(priced.empty());
    CHECK(priced.front() == 4);
    CHECK(by_bound.best.choices.at("x") == 4);
}

TEST_CASE("a descent that ends with time to spare resumes the enumeration where it paused, and proves its answer") {
    // x in 1..10, bounded at 11 - x up to 3 and at 20 + x beyond, priced at 9 more. The first
    // bound takes a second, so at that pace the enumeration would take 10 s of a 4 s budget:
    // it pauses after one assignment. The descent from x = 1 moves to 2 and 3, looks at the
    // rest (at once) and stays, long before its deadline (2.4 s); the enumeration then
    // resumes, takes their bounds without bounding them again, and ends: every assignment
    // bounded, the answer proven. Without it, 4 to 10 stay unbounded, the gap 100%.
    plan::plan_spec space;
    space.devices = 1;
    const search::open_parameter p{"x", search::open_parameter::kind::micro_batches, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {}};
    const auto model = small_gpt();
    search::plan_search_options o;
    o.threads = 1;
    o.time_budget_seconds = 4;
    std::atomic<int> bounded{0};
    const auto bound = [&bounded](const plan::plan_spec& c) {
        if (bounded++ == 0) std::this_thread::sleep_for(std::chrono::seconds(1));
        const auto x = static_cast<double>(c.choices.at("x"));
        return search::detail::assignment_bounds{x <= 3 ? 11.0 - x : 20.0 + x, 0.0};
    };
    const auto price = [](const plan::plan_spec& c, const std::atomic<bool>&) {
        const auto x = static_cast<double>(c.choices.at("x"));
        search::program_price out;
        out.step_seconds = 9.0 + (x <= 3 ? 11.0 - x : 20.0 + x);
        out.devices.resize(1);
        return out;
    };
    const search::plan_search_result r =
        search::detail::search_assignments(space, {p}, search::dgx_a100(1), o, model.ir(), bound, price);
    INFO(r.explain());
    CHECK(r.stats.descended == 2);  // the enumeration did pause, and the descent moved to 2 and 3
    CHECK(bounded == 10);           // each assignment bounded once, by the enumeration or the descent
    CHECK(r.stats.assignments == 10);
    CHECK(r.stats.unbounded == 0);
    CHECK(r.gap == 0);
    CHECK(r.best.choices.at("x") == 3);
    CHECK(r.best.price.step_seconds == 17.0);
    CHECK(r.stats.pruned == 7);  // 4 to 10, by their bounds, once they have them
    check_every_assignment_counted(r);
}
