// The plan searcher's hardware and communication costs: hardware profiles (presets, JSON
// round trips, errors that name the file and the field) and alpha-beta collective costs
// (ring, hierarchical, automatic, placement over nodes, TAPAS overlap factors).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <loom/search/communication.hpp>
#include <loom/search/hardware.hpp>

using namespace loom::search;
using loom::precision;

namespace {

constexpr double gib = 1024.0 * 1024.0 * 1024.0;

// Matches an exception whose message contains every one of the given fragments.
class message_has : public Catch::MatcherBase<std::exception> {
public:
    message_has(std::initializer_list<std::string> fragments) : fragments_(fragments) {}
    bool match(const std::exception& e) const override {
        const std::string what = e.what();
        for (const std::string& f : fragments_)
            if (what.find(f) == std::string::npos) return false;
        return true;
    }
    std::string describe() const override {
        std::string d = "has a message containing";
        for (const std::string& f : fragments_) d += " \"" + f + "\"";
        return d;
    }

private:
    std::vector<std::string> fragments_;
};

// A file under the temporary directory, removed when the test ends.
struct temporary_file {
    std::filesystem::path path;
    temporary_file(const std::string& name, const std::string& text)
        : path(std::filesystem::temp_directory_path() / name) {
        std::ofstream(path) << text;
    }
    ~temporary_file() { std::filesystem::remove(path); }
};

// Two nodes of 8 devices; the node's one NIC is 10x slower than a device's NVLink.
cluster slow_network() {
    return {.name = "slow network x2",
            .device = {.name = "d",
                       .peak_flops_f32 = 1e12,
                       .peak_flops_f16 = 0,
                       .memory_bytes = 1e9,
                       .memory_bandwidth = 1e12},
            .topo = {.devices_per_node = 8,
                     .nodes = 2,
                     .intra_node = {100e9, 1e-6},
                     .inter_node_per_nic = {10e9, 2e-6},
                     .nics_per_node = 1}};
}

}  // namespace

// ---- communication ---------------------------------------------------------------------

TEST_CASE("ring collectives inside one node follow the closed forms", "[search][communication]") {
    const cluster c = dgx_a100(1);
    const double bytes = 1e9, bw = 300e9, lat = 5e-6;
    const device_group node{.size = 8};
    CHECK(collective_time(c, collective::all_reduce, bytes, node, algorithm::ring) ==
          2.0 * 7 / 8 * bytes / bw + 2 * 7 * lat);
    CHECK(collective_time(c, collective::all_gather, bytes, node, algorithm::ring) == 7.0 / 8 * bytes / bw + 7 * lat);
    CHECK(collective_time(c, collective::reduce_scatter, bytes, node, algorithm::ring) ==
          7.0 / 8 * bytes / bw + 7 * lat);
    CHECK(collective_time(c, collective::all_to_all, bytes, node, algorithm::ring) == 7.0 / 8 * bytes / bw + 7 * lat);
    CHECK(collective_time(c, collective::broadcast, bytes, node, algorithm::ring) == bytes / bw + 7 * lat);
    CHECK(collective_time(c, collective::send_recv, bytes, {.size = 2, .stride = 3}) == bytes / bw + lat);

    const comm_time ar = collective_cost(c, collective::all_reduce, bytes, node, algorithm::ring);
    CHECK(ar.latency == 2 * 7 * lat);
    CHECK(ar.transmission == 2.0 * 7 / 8 * bytes / bw);
    CHECK(ar.total() == ar.latency + ar.transmission);

    // Inside one node there is nothing to be hierarchical about.
    CHECK(collective_time(c, collective::all_reduce, bytes, node, algorithm::hierarchical) ==
          Approx(collective_time(c, collective::all_reduce, bytes, node, algorithm::ring)).epsilon(1e-12));
}

TEST_CASE("all_gather + reduce_scatter == all_reduce, for both algorithms", "[search][communication]") {
    for (const cluster& c : {dgx_a100(1), dgx_a100(4), dgx1_v100(2), slow_network()}) {
        for (algorithm a : {algorithm::ring, algorithm::hierarchical}) {
            INFO(c.name << ", algorithm " << static_cast<int>(a));
            const device_group all{.size = c.devices()};
            const comm_time ag = collective_cost(c, collective::all_gather, 3e8, all, a);
            const comm_time rs = collective_cost(c, collective::reduce_scatter, 3e8, all, a);
            const comm_time ar = collective_cost(c, collective::all_reduce, 3e8, all, a);
            CHECK(ag.latency + rs.latency == Approx(ar.latency).epsilon(1e-12));
            CHECK(ag.transmission + rs.transmission == Approx(ar.transmission).epsilon(1e-12));
        }
    }
}

TEST_CASE("a group of one costs nothing; bad groups and sizes are refused", "[search][communication]") {
    const cluster c = dgx_h100(2);
    for (collective k : {collective::all_reduce, collective::all_gather, collective::reduce_scatter,
                         collective::all_to_all, collective::broadcast, collective::send_recv}) {
        CHECK(collective_time(c, k, 1e9, {.size = 1}) == 0);
        CHECK(collective_time(c, k, 1e9, {.size = 1, .first = 9}, algorithm::hierarchical) == 0);
        CHECK(collective_time(c, k, 0, {.size = 2}) > 0);  // latency only
    }
    CHECK_THROWS_MATCHES(collective_time(c, collective::all_reduce, 1e9, {.size = 0}), loom::usage_error,
                         message_has({"size 0"}));
    CHECK_THROWS_MATCHES(collective_time(c, collective::all_reduce, -1, {.size = 8}), loom::usage_error,
                         message_has({"-1 bytes"}));
    CHECK_THROWS_MATCHES(collective_time(c, collective::all_reduce, 1e9, {.size = 16, .first = 1}), loom::usage_error,
                         message_has({"reaches rank 16 but the topology has 16 devices"}));
    CHECK_THROWS_MATCHES(collective_time(c, collective::send_recv, 1e9, {.size = 3}), loom::usage_error,
                         message_has({"between 2 devices"}));
}

TEST_CASE("groups over nodes: placement and the inter-node bandwidth", "[search][communication]") {
    const cluster one_nic = dgx1_v100(2);
    const cluster eight_nics = dgx1_v100(2, 8);
    const double bytes = 1e9, nic = 12.5e9, inter_lat = 10e-6;

    CHECK(nodes_spanned(one_nic.topo, {.size = 16}) == 2);
    CHECK(members_per_node(one_nic.topo, {.size = 16}) == 8);
    CHECK(nodes_spanned(one_nic.topo, {.size = 8}) == 1);
    CHECK(nodes_spanned(one_nic.topo, {.size = 8, .first = 4}) == 2);
    CHECK(members_per_node(one_nic.topo, {.size = 8, .first = 4}) == 4);
    const group_placement uneven = placement(one_nic.topo, {.size = 12});
    CHECK(uneven.nodes == 2);
    CHECK(uneven.min_per_node == 4);
    CHECK(uneven.max_per_node == 8);
    CHECK_FALSE(uneven.uniform());

    // One ring over both nodes: each step waits for the node crossing, one NIC per node.
    CHECK(collective_time(one_nic, collective::all_reduce, bytes, {.size = 16}, algorithm::ring) ==
          2.0 * 15 / 16 * bytes / nic + 2 * 15 * inter_lat);
    // Eight NICs give 100e9 per node crossing, still below NVLink's 150e9.
    CHECK(collective_time(eight_nics, collective::all_reduce, bytes, {.size = 16}, algorithm::ring) ==
          2.0 * 15 / 16 * bytes / (8 * nic) + 2 * 15 * inter_lat);
    // The same 8 devices inside node 1 use NVLink.
    CHECK(collective_time(one_nic, collective::all_reduce, bytes, {.size = 8, .first = 8}, algorithm::ring) ==
          2.0 * 7 / 8 * bytes / 150e9 + 2 * 7 * 5e-6);
    // A send across nodes goes through one NIC; within a node over NVLink.
    CHECK(collective_time(eight_nics, collective::send_recv, bytes, {.size = 2, .stride = 8}) ==
          bytes / nic + inter_lat);
    CHECK(collective_time(eight_nics, collective::send_recv, bytes, {.size = 2, .stride = 7}) == bytes / 150e9 + 5e-6);

    // An uneven group has no hierarchical form; automatic falls back to the ring.
    CHECK_THROWS_MATCHES(collective_time(one_nic, collective::all_reduce, bytes, {.size = 12}, algorithm::hierarchical),
                         loom::usage_error, message_has({"4 to 8"}));
    CHECK(collective_time(one_nic, collective::all_reduce, bytes, {.size = 12}) ==
          collective_time(one_nic, collective::all_reduce, bytes, {.size = 12}, algorithm::ring));
}

TEST_CASE("stride 8 on DGX-1 puts every member on its own node", "[search][communication]") {
    const double bytes = 1e9, nic = 12.5e9, inter_lat = 10e-6;
    for (int nics : {1, 8}) {
        const cluster c = dgx1_v100(4, nics);
        const device_group g{.size = 4, .stride = 8, .first = 3};
        CHECK(nodes_spanned(c.topo, g) == 4);
        CHECK(members_per_node(c.topo, g) == 1);
        // One member drives one NIC, however many the node has.
        const double expected = 2.0 * 3 / 4 * bytes / nic + 2 * 3 * inter_lat;
        CHECK(collective_time(c, collective::all_reduce, bytes, g, algorithm::ring) == expected);
        CHECK(collective_time(c, collective::all_reduce, bytes, g, algorithm::hierarchical) ==
              Approx(expected).epsilon(1e-12));
    }
    // all_to_all over 4 nodes: each member sends 3/4 of its buffer off its node, through its NIC.
    const cluster c = dgx1_v100(4, 8);
    CHECK(collective_time(c, collective::all_to_all, bytes, {.size = 4, .stride = 8}) ==
          3.0 / 4 * bytes / nic + 3 * inter_lat);
}

TEST_CASE("hierarchical beats ring when the network is 10x slower than NVLink", "[search][communication]") {
    const cluster c = slow_network();  // 2 nodes of 8, NVLink 100e9, one 10e9 NIC per node
    const double bytes = 1e9;
    const device_group all{.size = 16};
    const double ring = collective_time(c, collective::all_reduce, bytes, all, algorithm::ring);
    const double hierarchical = collective_time(c, collective::all_reduce, bytes, all, algorithm::hierarchical);
    CHECK(ring == Approx(2.0 * 15 / 16 * bytes / 10e9 + 30 * 2e-6).epsilon(1e-12));
    // reduce_scatter in the node, all_reduce of 1/8 over 2 nodes (8 members share one NIC),
    // all_gather in the node.
    const double intra = 7.0 / 8 * bytes / 100e9 + 7 * 1e-6;
    const double inter = 2.0 * 1 / 2 * (bytes / 8) / (10e9 / 8) + 2 * 1 * 2e-6;
    CHECK(hierarchical == Approx(intra + inter + intra).epsilon(1e-12));
    CHECK(hierarchical < ring);
    CHECK(collective_time(c, collective::all_reduce, bytes, all) == hierarchical);

    // Same on DGX-1 with one NIC per node, over 2 and 4 nodes, and for gather and scatter.
    for (int nodes : {2, 4}) {
        const cluster d = dgx1_v100(nodes);
        for (collective k : {collective::all_reduce, collective::all_gather, collective::reduce_scatter}) {
            INFO(d.name << " " << to_string(k));
            const device_group g{.size = d.devices()};
            CHECK(collective_time(d, k, bytes, g, algorithm::hierarchical) <
                  collective_time(d, k, bytes, g, algorithm::ring));
        }
    }
}

TEST_CASE("automatic picks the cheaper algorithm", "[search][communication]") {
    // DGX A100: NICs give 200e9 per node against 300e9 NVLink, so for large buffers the ring
    // (fewer bytes inside the node) wins, and for small ones the hierarchical form (fewer
    // inter-node latencies) wins.
    const cluster c = dgx_a100(2);
    const device_group all{.size = 16};
    for (double bytes : {1e3, 1e6, 1e9}) {
        INFO("bytes = " << bytes);
        for (collective k : {collective::all_reduce, collective::all_gather, collective::reduce_scatter,
                             collective::broadcast, collective::all_to_all}) {
            const double ring = collective_time(c, k, bytes, all, algorithm::ring);
            const double hierarchical = collective_time(c, k, bytes, all, algorithm::hierarchical);
            CHECK(collective_time(c, k, bytes, all) == std::min(ring, hierarchical));
        }
    }
    const auto ar = [&](double bytes, algorithm a) {
        return collective_time(c, collective::all_reduce, bytes, all, a);
    };
    CHECK(ar(1e9, algorithm::ring) < ar(1e9, algorithm::hierarchical));
    CHECK(ar(1e6, algorithm::hierarchical) < ar(1e6, algorithm::ring));
    CHECK(ar(1e9, algorithm::ring) == 2.0 * 15 / 16 * 1e9 / 200e9 + 30 * 10e-6);
}

TEST_CASE("overlap factors discount transmission, never latency", "[search][communication]") {
    const cluster c = dgx1_v100(2);
    const comm_time fwd = collective_cost(c, collective::all_reduce, 1e8, {.size = 16});
    const comm_time bwd = collective_cost(c, collective::all_reduce, 4e8, {.size = 16});
    REQUIRE(fwd.latency > 0);
    REQUIRE(bwd.transmission > 0);

    const overlap_factors none{};
    CHECK(exposed_time(fwd, bwd, collective::all_reduce, none) == Approx(fwd.total() + bwd.total()).epsilon(1e-12));

    const overlap_factors half{.gamma = 0.5};
    CHECK(exposed_time(fwd, bwd, collective::all_reduce, half) ==
          Approx(fwd.latency + bwd.latency + fwd.transmission + 0.5 * bwd.transmission).epsilon(1e-12));
    CHECK(exposed_time(fwd.transmission, bwd.transmission, collective::all_reduce, half) ==
          fwd.transmission + 0.5 * bwd.transmission);
    // Fully hidden transmission still pays every latency.
    CHECK(exposed_time(fwd, bwd, collective::all_reduce, {.gamma = 0, .epsilon = {1e-9, 1, 1, 1, 1, 1}}) ==
          Approx(fwd.latency + bwd.latency).epsilon(1e-6));

    overlap_factors eps{.gamma = 0.5};
    eps.epsilon[static_cast<std::size_t>(collective::all_reduce)] = 0.8;
    CHECK(eps.epsilon_of(collective::all_reduce) == 0.8);
    CHECK(eps.epsilon_of(collective::all_gather) == 1);
    CHECK(exposed_time(2.0, 4.0, collective::all_reduce, eps) == Approx((2.0 + 0.5 * 4.0) * 0.8));
    CHECK(exposed_time(2.0, 4.0, collective::all_gather, eps) == 2.0 + 0.5 * 4.0);
    CHECK(exposed_time(comm_time{1e-3, 2.0}, comm_time{2e-3, 4.0}, collective::all_reduce, eps) ==
          Approx(3e-3 + (2.0 + 0.5 * 4.0) * 0.8));

    CHECK_THROWS_MATCHES(exposed_time(1.0, 1.0, collective::all_reduce, {.gamma = 1.5}), loom::usage_error,
                         message_has({"gamma is 1.5"}));
    CHECK_THROWS_MATCHES(exposed_time(1.0, 1.0, collective::broadcast, {.epsilon = {1, 1, 1, 1, 0, 1}}),
                         loom::usage_error, message_has({"epsilon of broadcast is 0"}));
}

// ---- hardware --------------------------------------------------------------------------

TEST_CASE("the presets carry the datasheet figures", "[search][hardware]") {
    const cluster v1 = dgx1_v100(2);
    CHECK(v1.name == "DGX-1 V100 x2, 1 NIC per node");
    CHECK(v1.devices() == 16);
    CHECK(v1.device.memory_bytes == 32 * gib);
    CHECK(v1.device.peak_flops(precision::f32) == 15.7e12);
    CHECK(v1.device.peak_flops(precision::f16) == 125e12);
    CHECK(v1.device.memory_bandwidth == 900e9);
    CHECK(v1.topo.intra_node.bandwidth == 150e9);
    CHECK(v1.topo.inter_node_bandwidth_per_device() == 12.5e9 / 8);

    const cluster v1_8 = dgx1_v100(2, 8);
    CHECK(v1_8.name == "DGX-1 V100 x2, 8 NICs per node");
    CHECK(v1_8.topo.inter_node_bandwidth_per_device() == 12.5e9);

    const cluster v2 = dgx2_v100(2);
    CHECK(v2.name == "DGX-2 V100 x2");
    CHECK(v2.devices() == 32);
    CHECK(v2.device.memory_bytes == 32 * gib);
    CHECK(v2.device.peak_flops(precision::f16) == 125e12);
    CHECK(v2.topo.intra_node.bandwidth == 150e9);
    CHECK(v2.topo.inter_node_bandwidth_per_device() == 8 * 12.5e9 / 16);

    const cluster a = dgx_a100(4);
    CHECK(a.name == "DGX A100 x4");
    CHECK(a.devices() == 32);
    CHECK(a.device.memory_bytes == 80 * gib);
    CHECK(a.device.peak_flops(precision::f32) == 19.5e12);
    CHECK(a.device.peak_flops(precision::bf16) == 312e12);
    CHECK(a.device.memory_bandwidth == 2039e9);
    CHECK(a.topo.intra_node.bandwidth == 300e9);
    CHECK(a.topo.inter_node_bandwidth_per_device() == 25e9);

    const cluster h = dgx_h100(1);
    CHECK(h.name == "DGX H100 x1");
    CHECK(h.devices() == 8);
    CHECK(h.device.memory_bytes == 80 * gib);
    CHECK(h.device.peak_flops(precision::f32) == 67e12);
    CHECK(h.device.peak_flops(precision::bf16) == 989e12);
    CHECK(h.device.memory_bandwidth == 3.35e12);
    CHECK(h.topo.intra_node.bandwidth == 450e9);
    CHECK(h.topo.inter_node_bandwidth_per_device() == 50e9);

    for (const cluster& c : {v1, v1_8, v2, a, h}) {
        CHECK(c.device.gemm_efficiency == 0.6);
        CHECK(c.device.elementwise_efficiency == 0.7);
        CHECK(c.topo.intra_node.latency == 5e-6);
        CHECK(c.topo.inter_node_per_nic.latency == 10e-6);
    }

    CHECK_THROWS_MATCHES(dgx_h100(0), profile_error, message_has({"nodes is 0"}));
    CHECK_THROWS_MATCHES(dgx1_v100(1, 0), profile_error, message_has({"nics_per_node is 0"}));
    CHECK_THROWS_MATCHES(slow_network().device.peak_flops(precision::bf16), profile_error,
                         message_has({"device 'd' has no bf16 peak (peak_flops_f16 = 0)"}));
}

TEST_CASE("profiles survive a JSON round trip, in memory and through a file", "[search][hardware]") {
    cluster calibrated = dgx_a100(3);
    calibrated.device.gemm_efficiency = 0.734512345678901;
    calibrated.topo.inter_node_per_nic.latency = 7.3e-6;
    // Samples of equal work merge into their mean, samples without work are dropped.
    const op_rate merged = op_rate_from_samples({{4, 1}, {0, 5}, {4, 3}, {1, 1}}, true);
    CHECK(merged.points == std::vector<std::pair<double, double>>{{1, 1}, {4, 2}});
    // Samples of one size measured a call's cost: flat beyond it, proportional below.
    const op_rate call = op_rate_from_samples({{10, 2e-6}, {10, 4e-6}}, false);
    CHECK(call.seconds(1e6) == Approx(3e-6));
    CHECK(call.seconds(5) == Approx(1.5e-6));
    CHECK(priced_per_flop(1e9, 1e6));
    CHECK(!priced_per_flop(1e6, 4e6));
    CHECK(!priced_per_flop(0, 0));
    // Profiled steps: a kind's mean per instruction in each step is one sample.
    const op_rates from_steps = op_rates_from_steps(
        {{{"linear", {.seconds = 4e-3, .flops = 4e12, .bytes = 4e9, .instructions = 4}},
          {"add", {.seconds = 2e-5, .flops = 1e6, .bytes = 1.2e7, .instructions = 2}},
          {"unused", {}}},
         {{"linear", {.seconds = 1e-3, .flops = 2e11, .bytes = 1e8, .instructions = 1}}}});
    REQUIRE(from_steps.size() == 2);
    CHECK(from_steps.at("linear").per_flop);
    CHECK(from_steps.at("linear").points == std::vector<std::pair<double, double>>{{2e11, 1e-3}, {1e12, 1e-3}});
    CHECK_FALSE(from_steps.at("add").per_flop);
    CHECK(from_steps.at("add").seconds(6e6) == Approx(1e-5));
    // A GPU's calibration: rates per op kind, by storage precision.
    calibrated.device.rates[precision::bf16]["linear"] = op_rate_from_samples({{1e9, 2.1e-6}, {8e9, 1.23456789e-5}}, true);
    calibrated.device.rates[precision::bf16]["add"] = op_rate_from_samples({{1e6, 3e-6}}, false);
    calibrated.device.rates[precision::f32]["linear"] = op_rate_from_samples({{1e9, 4e-5}}, true);
    for (const cluster& c :
         {dgx1_v100(2), dgx1_v100(2, 8), dgx2_v100(2), dgx_a100(4), dgx_h100(1), calibrated, slow_network()}) {
        INFO(c.name);
        CHECK(cluster_from_json(to_json(c)) == c);
        const temporary_file file("loom_test_search_cost_roundtrip.json", "");
        save_cluster(c, file.path.string());
        CHECK(load_cluster(file.path.string()) == c);
    }
    const nlohmann::json j = to_json(dgx_a100(1));
    CHECK(j["topology"]["inter_node_per_nic"]["bandwidth_bytes_per_s"] == 25e9);
    CHECK(j["device"]["memory_bytes"] == 80 * gib);

    // The efficiencies may be left out: they take the struct's defaults.
    nlohmann::json brief = j;
    brief["device"].erase("gemm_efficiency");
    brief["device"].erase("elementwise_efficiency");
    CHECK(cluster_from_json(brief) == dgx_a100(1));
}

TEST_CASE("bad profile files name the file, the field and the fix", "[search][hardware]") {
    const nlohmann::json good = to_json(dgx1_v100(2));

    nlohmann::json missing = good;
    missing["topology"]["inter_node_per_nic"].erase("bandwidth_bytes_per_s");
    const temporary_file missing_file("loom_test_search_cost_missing.json", missing.dump(2));
    CHECK_THROWS_MATCHES(
        load_cluster(missing_file.path.string()), profile_error,
        message_has({missing_file.path.string(), "topology.inter_node_per_nic.bandwidth_bytes_per_s is missing"}));

    nlohmann::json negative = good;
    negative["topology"]["intra_node"]["bandwidth_bytes_per_s"] = -150e9;
    const temporary_file negative_file("loom_test_search_cost_negative.json", negative.dump(2));
    CHECK_THROWS_MATCHES(
        load_cluster(negative_file.path.string()), profile_error,
        message_has({negative_file.path.string(), "topology.intra_node.bandwidth_bytes_per_s is -1.5e+11",
                     "give a positive number of bytes per second"}));

    const temporary_file not_json("loom_test_search_cost_not_json.json", "devices_per_node = 8\n");
    CHECK_THROWS_MATCHES(load_cluster(not_json.path.string()), profile_error,
                         message_has({not_json.path.string(), "is not valid JSON"}));

    CHECK_THROWS_MATCHES(load_cluster("/nonexistent/loom_cluster.json"), profile_error,
                         message_has({"cannot open '/nonexistent/loom_cluster.json'"}));

    // Without a file, the message names the function instead.
    nlohmann::json ill_typed = good;
    ill_typed["topology"]["nodes"] = "two";
    CHECK_THROWS_MATCHES(cluster_from_json(ill_typed), profile_error,
                         message_has({"cluster_from_json: topology.nodes is \"two\"", "whole number"}));
    nlohmann::json zero_nodes = good;
    zero_nodes["topology"]["nodes"] = 0;
    CHECK_THROWS_MATCHES(cluster_from_json(zero_nodes), profile_error, message_has({"topology.nodes is 0"}));
    nlohmann::json zero_memory = good;
    zero_memory["device"]["memory_bytes"] = 0;
    CHECK_THROWS_MATCHES(cluster_from_json(zero_memory), profile_error, message_has({"device.memory_bytes is 0"}));
    nlohmann::json misspelt = good;
    misspelt["device"]["gemm_eficiency"] = 0.5;
    CHECK_THROWS_MATCHES(cluster_from_json(misspelt), profile_error,
                         message_has({"device.gemm_eficiency is not a known field", "gemm_efficiency"}));
    CHECK_THROWS_MATCHES(cluster_from_json(nlohmann::json::array()), profile_error,
                         message_has({"is not a JSON object"}));
    nlohmann::json odd_precision = good;
    odd_precision["device"]["op_rates"]["fp8"] = nlohmann::json::object();
    CHECK_THROWS_MATCHES(cluster_from_json(odd_precision), profile_error,
                         message_has({"device.op_rates.fp8 is not a precision", "f32, f16 or bf16"}));
    nlohmann::json backwards = good;
    backwards["device"]["op_rates"]["bf16"]["linear"] = {{"per_flop", true}, {"points", {{8e9, 1e-5}, {1e9, 2e-6}}}};
    CHECK_THROWS_MATCHES(cluster_from_json(backwards), profile_error,
                         message_has({"device.op_rates.bf16.linear.points has the point [1000000000.0,2e-06]",
                                      "units > 0 and increasing"}));
    nlohmann::json no_points = good;
    no_points["device"]["op_rates"]["bf16"]["linear"] = {{"per_flop", true}};
    CHECK_THROWS_MATCHES(cluster_from_json(no_points), profile_error,
                         message_has({"device.op_rates.bf16.linear is", "\"points\": [[units, seconds], ...]"}));

    // Peaks may be 0 (no tensor cores); the error comes when the precision is asked for.
    nlohmann::json no_tensor_cores = good;
    no_tensor_cores["device"]["peak_flops_fp16_per_s"] = 0;
    const cluster c = cluster_from_json(no_tensor_cores);
    CHECK_THROWS_MATCHES(c.device.peak_flops(precision::f16), profile_error,
                         message_has({"'V100-SXM2-32GB' has no f16 peak (peak_flops_f16 = 0)",
                                      "peak_flops_fp16_per_s in its JSON"}));
    CHECK_THROWS_MATCHES(c.device.peak_flops(precision::f64), profile_error,
                         message_has({"profiles hold no f64 peak; plan in f32, f16 or bf16"}));
}
