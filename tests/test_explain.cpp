// The explanation of a partitioned graph: splits and placements per op group, memory and
// traffic per device, transfers beside the forward op they serve.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>
#include <vector>

#include <loom/models/gpt.hpp>
#include <loom/partition/apply.hpp>
#include <loom/runtime/explain_partition.hpp>

using namespace loom;

namespace {

const models::gpt_config tiny{.layers = 2, .hidden = 32, .heads = 4, .vocab = 64, .seq = 16, .batch = 8};

plan::resolved_plan data_parallel(const graph& g, int world) {
    plan::resolved_plan p;
    p.devices = world;
    p.name = "data parallel x" + std::to_string(world);
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
        plan::op_partition op;
        op.splits.push_back({Dim::Batch::id, "", world});
        p.forward.push_back(op);
    }
    return p;
}

// Heads or FFN split where the op has such a dim, else the op runs whole on every device.
plan::resolved_plan tensor_parallel(const graph& g, int world) {
    plan::resolved_plan p;
    p.devices = world;
    p.name = "tensor parallel x" + std::to_string(world);
    for (const node& n : g.nodes) {
        plan::op_partition op;
        for (const auto& v : n.sig.vars)
            if (op.splits.empty() && v.splittable && !v.frozen && (v.dim == Dim::FFN::id || v.dim == Dim::Head::id) &&
                v.extent % world == 0)
                op.splits.push_back({v.dim, v.label, world});
        if (op.splits.empty()) op.replicas = world;
        p.forward.push_back(op);
    }
    return p;
}

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

// The line of the devices table for device d.
std::string device_line(const std::string& text, int d) {
    const std::string head = "  device " + std::to_string(d) + " ";
    for (const auto& line : lines_of(text))
        if (line.rfind(head, 0) == 0) return line;
    return {};
}

// The first line that holds every one of `parts`.
std::string line_with(const std::string& text, const std::vector<std::string>& parts) {
    for (const auto& line : lines_of(text)) {
        bool all = true;
        for (const auto& p : parts) all = all && line.find(p) != std::string::npos;
        if (all) return line;
    }
    return {};
}

}  // namespace

TEST_CASE("explain: data parallel", "[explain]") {
    for (int world : {2, 4}) {
        INFO(world << " devices");
        auto m = models::gpt(tiny);
        auto pg = partition::apply_plan(m.ir(), data_parallel(m.ir(), world));
        const std::string text = partition::explain(pg);
        INFO(text);
        const std::string devices = world == 2 ? "{0,1}" : "{0..3}";
        const std::string ways = "x" + std::to_string(world);

        CHECK_THAT(text, Catch::StartsWith("plan 'data parallel " + ways + "': " + std::to_string(world) + " devices"));
        CHECK_THAT(text, Catch::Contains("split ...0" + ways + " on " + devices));
        CHECK_THAT(text, Catch::Contains("split b" + ways + " on " + devices));
        CHECK_THAT(text, Catch::Contains("all_reduce"));
        // Layers fold into one group of two nodes.
        CHECK_THAT(line_with(text, {"fwd", "blocks.*.attn.q ", "linear_bias"}), Catch::Contains(" 2  split"));
        CHECK_THAT(line_with(text, {"bwd", "blocks.*.mlp.fc ", "linear_grad_weight"}), Catch::Contains(" 2  split"));
        CHECK_THAT(text, !Catch::Contains("blocks.0.attn.q"));
        // Gradients are all-reduced in the backward column; the loss in the forward one.
        CHECK_THAT(line_with(text, {"gradients", "all_reduce x"}), Catch::StartsWith("  gradients "));

        // Every device stores every parameter and its gradient, sends the same bytes.
        const auto footprints = partition::device_footprints(pg);
        REQUIRE(footprints.size() == static_cast<std::size_t>(world));
        const std::int64_t parameter_bytes = tiny.parameter_count() * 4;
        for (const auto& f : footprints) {
            INFO("device " << f.device);
            CHECK(f.parameter_bytes == parameter_bytes);
            CHECK(f.gradient_bytes == parameter_bytes);
            CHECK(f.activation_bytes > 0);
            CHECK(f.bytes_sent > 0);
            CHECK(f.bytes_sent == footprints[0].bytes_sent);
            CHECK(f.transfers == footprints[0].transfers);
        }
        CHECK(partition::device_footprints(pg, precision::f64)[0].parameter_bytes == 2 * parameter_bytes);

        // One memory line per device, alike but for the device number.
        const std::string first = device_line(text, 0);
        REQUIRE_FALSE(first.empty());
        CHECK_THAT(first, Catch::Contains(human_bytes(static_cast<double>(parameter_bytes))));
        CHECK_THAT(first, Catch::Contains(human_bytes(static_cast<double>(footprints[0].bytes_sent))));
        CHECK_THAT(first, Catch::Contains("all_reduce x"));
        for (int d = 1; d < world; ++d) {
            const std::string line = device_line(text, d);
            REQUIRE_FALSE(line.empty());
            CHECK(line.substr(11) == first.substr(11));
        }
    }
}

TEST_CASE("explain: tensor parallel", "[explain]") {
    for (int world : {2, 4}) {
        INFO(world << " devices");
        auto m = models::gpt(tiny);
        auto pg = partition::apply_plan(m.ir(), tensor_parallel(m.ir(), world));
        const std::string text = partition::explain(pg);
        INFO(text);
        const std::string devices = world == 2 ? "{0,1}" : "{0..3}";
        const std::string ways = "x" + std::to_string(world);

        CHECK_THAT(text, Catch::StartsWith("plan 'tensor parallel " + ways + "': " + std::to_string(world) + " devices"));
        CHECK_THAT(line_with(text, {"fwd", "blocks.*.attn ", "attention"}), Catch::Contains("split h" + ways + " on " + devices));
        CHECK_THAT(line_with(text, {"fwd", "blocks.*.mlp.fc ", "linear_bias"}), Catch::Contains("split n" + ways + " on " + devices));
        CHECK_THAT(line_with(text, {"fwd", "ln_f ", "layer_norm"}), Catch::Contains("replicate " + ways + " on " + devices));
        // The row of an op: forward transfers, then the backward twins beside them.
        CHECK_THAT(line_with(text, {"blocks.*.attn.proj linear_bias"}), Catch::Contains("all_gather x2"));
        CHECK_THAT(line_with(text, {"blocks.*.ln_2 layer_norm"}), Catch::Contains("-  ") && Catch::Contains("all_reduce x2"));

        const auto footprints = partition::device_footprints(pg);
        const std::int64_t all_parameters = tiny.parameter_count() * 4;
        for (const auto& f : footprints) {
            INFO("device " << f.device);
            CHECK(f.parameter_bytes < all_parameters);  // the FFN and per-head weights are split
            CHECK(f.bytes_sent > 0);
            CHECK(f.transfers.count(partition::transfer_kind::all_gather) == 1);
            CHECK_FALSE(device_line(text, f.device).empty());
            CHECK_THAT(device_line(text, f.device), Catch::Contains(human_bytes(static_cast<double>(f.activation_bytes))));
        }
    }
}

TEST_CASE("explain: ZeRO-3 pairs the parameter gathers with the gradient reductions", "[explain]") {
    auto m = models::gpt(tiny);
    auto p = data_parallel(m.ir(), 2);
    p.zero = plan::zero_stage::parameters;
    auto pg = partition::apply_plan(m.ir(), p);
    const std::string text = partition::explain(pg);
    INFO(text);
    CHECK_THAT(text, Catch::Contains("ZeRO-3"));
    // The tied embedding: gathered for the lookup; its two gradient contributions are added
    // on each device and then reduce-scattered onto the shards once, like every other weight.
    CHECK_THAT(line_with(text, {"(top) embedding "}), Catch::Contains("all_gather"));
    CHECK_THAT(line_with(text, {"(top) identity "}), Catch::Contains("reduce_scatter"));
    CHECK_THAT(line_with(text, {"blocks.*.mlp.fc identity"}), Catch::Contains("reduce_scatter x4"));
    const auto footprints = partition::device_footprints(pg);
    CHECK(footprints[0].parameter_bytes * 2 == tiny.parameter_count() * 4);  // every parameter in two shards
}

TEST_CASE("explain: device lists fold into ranges", "[explain]") {
    using partition::detail::fold_device_lists;
    CHECK(fold_device_lists("split bx4 on {0,1,2,3}") == "split bx4 on {0..3}");
    CHECK(fold_device_lists("on {0,1}") == "on {0,1}");
    CHECK(fold_device_lists("on {4,5,6,8,10,11,12}, recompute") == "on {4..6,8,10..12}, recompute");
    CHECK(fold_device_lists("{} {a,b}") == "{} {a,b}");
}
