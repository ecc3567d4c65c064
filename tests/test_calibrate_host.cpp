// Calibration of the host as a cluster of ranks: the link measured between ranks, and the
// op rates of ranks alone and together.
#include <catch2/catch.hpp>

#include <cmath>

#include <loom/calibrate/host.hpp>
#include <loom/runtime/comm/in_process.hpp>

using namespace loom;

TEST_CASE("rates together are each kind's cost alone, slowed as the whole step of its batch is") {
    search::host_op_costs alone;
    alone.step_seconds = {1e-3, 2e-3, 4e-3, 8e-3, 16e-3};
    alone.per_flop["linear"] = true;
    alone.kinds["linear"] = {{0, 1e5, 2e-5}, {2, 4e5, 6e-5}, {4, 16e5, 2e-4}};
    // Points of equal work merge into their mean.
    alone.kinds["linear"].push_back({3, 16e5, 4e-4});
    // A kind whose work does not grow with the batch has no slope: a call's cost, flat.
    alone.per_flop["fill_like"] = true;
    alone.kinds["fill_like"] = {{0, 1, 2.5e-7}, {4, 1, 3e-7}};
    alone.steps_together = {3e-3, 6e-3, 12e-3, 24e-3, 32e-3};  // 3x, 3x, 3x, 3x, 2x
    const search::op_rates rates = search::rates_together(alone);
    REQUIRE(rates.at("linear").points.size() == 3);
    CHECK(rates.at("linear").per_flop);
    CHECK(rates.at("linear").points[0].first == 1e5);
    CHECK(rates.at("linear").points[0].second == Approx(6e-5));
    CHECK(rates.at("linear").points[1].second == Approx(1.8e-4));
    CHECK(rates.at("linear").points[2].first == 16e5);
    CHECK(rates.at("linear").points[2].second == Approx((4e-4 + 12e-4) / 2));  // 2e-4 x 2, 4e-4 x 3
    const search::op_rate& fill = rates.at("fill_like");
    REQUIRE(fill.points.size() == 2);
    CHECK(fill.seconds(1) == Approx((2.5e-7 * 3 + 3e-7 * 2) / 2));  // each at its batch's slowdown, their mean
    CHECK(fill.seconds(1e6) == Approx(fill.seconds(1)));
    CHECK(fill.seconds(1e8) == Approx(fill.seconds(1)));
    CHECK(fill.least_per_unit() == 0);
    // Alone: the costs as measured.
    CHECK(alone.rates().at("linear").points[1].second == Approx(6e-5));

    alone.steps_together = {1e-3, 2e-3};
    CHECK_THROWS_WITH(search::rates_together(alone), Catch::Contains("2 steps together for 5 calibration batches"));
    alone.steps_together = {1e-3, 0.0, 1e-3, 1e-3, 1e-3};
    CHECK_THROWS_WITH(search::rates_together(alone), Catch::Contains("calibration step 1 took"));
}

TEST_CASE("the links between in-process ranks are measured per collective, in the profile's convention") {
    // Every rank gets the same links; each one's latency and bandwidth price its collective
    // of a few bytes and of 1 MiB at about what it took (price_programs divides by the ranks).
    // Three ranks: the third has no partner for the sends and waits.
    const int ranks = 3;
    std::vector<search::collective_links> seen(ranks);
    comm::run_ranks(ranks, [&](comm::communicator& c) {
        seen[static_cast<std::size_t>(c.rank())] = search::measure_host_links(c, c.world());
    });
    CHECK(seen[0] == seen[1]);
    CHECK(seen[0] == seen[2]);
    REQUIRE(seen[0].size() == 4);
    for (search::collective kind : {search::collective::all_reduce, search::collective::all_gather,
                                    search::collective::reduce_scatter, search::collective::send_recv}) {
        INFO(search::to_string(kind));
        REQUIRE(seen[0].count(kind) == 1);
        const search::link& l = seen[0].at(kind);
        CHECK(std::isfinite(l.latency));
        CHECK(l.latency > 0);
        CHECK(l.latency < 0.1);  // a message between threads takes far less than 100 ms
        CHECK(std::isfinite(l.bandwidth));
        CHECK(l.bandwidth > 1e6);
    }

    // Given links: the all-reduce's is the intra-node link, the others override it for their
    // collectives, and a collective without one runs at the intra-node link.
    const search::collective_links links{{search::collective::all_reduce, {3e9, 7e-6}},
                                         {search::collective::send_recv, {9e9, 2e-6}}};
    const search::cluster given = search::calibrate_host(2, links);
    CHECK(given.topo.intra_node == search::link{3e9, 7e-6});
    CHECK(given.topo.intra_link(search::collective::send_recv) == search::link{9e9, 2e-6});
    CHECK(given.topo.intra_link(search::collective::all_gather) == search::link{3e9, 7e-6});
    const search::device_group pair{.size = 2};
    CHECK(search::collective_time(given, search::collective::send_recv, 9e9, pair) == Approx(1.0 + 2e-6));
    CHECK(search::collective_time(given, search::collective::all_gather, 3e9, pair) == Approx(0.5 + 7e-6));
    // They survive a profile file.
    CHECK(search::cluster_from_json(search::to_json(given)) == given);
    CHECK_THROWS_WITH(search::calibrate_host(2, search::collective_links{{search::collective::send_recv, {9e9, 2e-6}}}),
                      Catch::Contains("lack the all-reduce"));

    const search::cluster measured = search::calibrate_host(2);
    CHECK(measured.topo.intra_node.latency > 0);
    CHECK(measured.topo.intra_node.bandwidth > 0);
    CHECK(measured.topo.intra_node_by_collective.size() == 3);

    comm::run_ranks(1, [&](comm::communicator& c) {
        CHECK_THROWS_WITH(search::measure_host_links(c, c.world()), Catch::Contains("pass at least 2"));
    });
}

TEST_CASE("ranks calibrated together hold the first rank's costs alone and the slowest rank's steps at once") {
    // Three in-process ranks: every rank sees the same steps together, the slowest rank's,
    // and only the first measures the op kinds alone.
    const int ranks = 3;
    std::vector<search::host_op_costs> seen(ranks);
    comm::run_ranks(ranks, [&](comm::communicator& c) {
        seen[static_cast<std::size_t>(c.rank())] = search::calibrate_host_ops_shared(c, c.world());
    });
    const std::size_t batches = std::size(search::host_op_costs::batches);
    REQUIRE(seen[0].step_seconds.size() == batches);
    REQUIRE(seen[0].steps_together.size() == batches);
    CHECK(seen[0].kinds.count("linear_bias") == 1);
    for (int r = 1; r < ranks; ++r) {
        CHECK(seen[static_cast<std::size_t>(r)].steps_together == seen[0].steps_together);
        CHECK(seen[static_cast<std::size_t>(r)].step_seconds.empty());
        CHECK(seen[static_cast<std::size_t>(r)].kinds.empty());
    }
    for (std::size_t b = 0; b < batches; ++b) {
        INFO("batch " << search::host_op_costs::batches[b]);
        CHECK(seen[0].step_seconds[b] > 0);
        // Three ranks sharing the cores take longer than one alone (not timed tightly: a busy
        // machine moves both).
        CHECK(seen[0].steps_together[b] > seen[0].step_seconds[b]);
    }
    // Alone: no steps together, so no rates together.
    const search::host_op_costs one = search::calibrate_host_ops_alone();
    CHECK(one.steps_together.empty());
    CHECK_THROWS_WITH(search::rates_together(one), Catch::Contains("0 steps together"));
}

TEST_CASE("host price options hold each op kind's rate together and alone, at the same work") {
    const search::price_options o = search::host_price_options(2);
    CHECK(o.compute_shared_by == 2);
    CHECK_FALSE(o.overlap);
    REQUIRE(o.rates.count("linear_bias") == 1);
    REQUIRE(o.rates.size() == o.solo_rates.size());
    for (const auto& [kind, together] : o.rates) {
        INFO(kind);
        REQUIRE(o.solo_rates.count(kind) == 1);
        const search::op_rate& alone = o.solo_rates.at(kind);
        CHECK(alone.per_flop == together.per_flop);
        REQUIRE(alone.points.size() == together.points.size());
        for (std::size_t i = 0; i < alone.points.size(); ++i) {
            CHECK(alone.points[i].first == together.points[i].first);
            CHECK(alone.points[i].second > 0);
            CHECK(together.points[i].second > 0);
        }
    }
    // One rank has nothing to share: its rates are its costs alone, and no solo rates.
    const search::price_options one = search::host_price_options(1);
    CHECK(one.solo_rates.empty());
    CHECK(one.rates.count("linear_bias") == 1);
    CHECK_THROWS_WITH(search::host_price_options(0), Catch::Contains("give at least 1"));
}
