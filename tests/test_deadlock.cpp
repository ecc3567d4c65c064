// The deadlock check over device programs: the programs apply_plan emits pass, and
// reorderings that make devices wait on each other in a cycle are rejected with the ops on
// the cycle named.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include <loom/models/gpt.hpp>
#include <loom/partition/apply.hpp>
#include <loom/partition/deadlock.hpp>

using namespace loom;

namespace {

models::gpt_config tiny_gpt(std::int64_t layers) {
    return {.layers = layers, .hidden = 32, .heads = 4, .vocab = 64, .seq = 16, .batch = 8};
}

// Every forward op split along Batch (outermost, degree `batch`), then along Heads or FFN
// where the op has such a dim (degree `tensor`), else replicated `tensor` times.
plan::resolved_plan hybrid_plan(const graph& g, int batch, int tensor) {
    plan::resolved_plan p;
    p.devices = batch * tensor;
    p.name = "batch x" + std::to_string(batch) + ", tensor x" + std::to_string(tensor);
    for (const node& n : g.nodes) {
        plan::op_partition op;
        if (batch > 1) op.splits.push_back({Dim::Batch::id, "", batch});
        bool cut = false;
        if (tensor > 1)
            for (const auto& v : n.sig.vars)
                if (!cut && v.splittable && !v.frozen && (v.dim == Dim::FFN::id || v.dim == Dim::Head::id) &&
                    v.extent % tensor == 0) {
                    op.splits.push_back({v.dim, v.label, tensor});
                    cut = true;
                }
        if (!cut) op.replicas = tensor;
        p.forward.push_back(op);
    }
    return p;
}

// Two stages: everything before blocks.1 on device 0, the rest on device 1, so activations
// and their gradients move by send/recv.
plan::resolved_plan two_stage_plan(const graph& g) {
    plan::resolved_plan p;
    p.devices = 2;
    p.name = "two stages";
    bool second = false;
    for (const node& n : g.nodes) {
        second = second || n.name.rfind("blocks.1", 0) == 0;
        plan::op_partition op;
        op.devices = {second ? 1 : 0};
        p.forward.push_back(op);
    }
    return p;
}

partition::partitioned_graph partitioned(const models::gpt_config& c, plan::resolved_plan (*make)(const graph&)) {
    auto m = models::gpt(c);
    return partition::apply_plan(m.ir(), make(m.ir()));
}

partition::partitioned_graph partitioned(const models::gpt_config& c, int batch, int tensor) {
    auto m = models::gpt(c);
    return partition::apply_plan(m.ir(), hybrid_plan(m.ir(), batch, tensor));
}

std::string deadlock_message(const std::vector<partition::device_program>& programs,
                             const std::vector<std::vector<int>>& groups) {
    try {
        partition::check_deadlock_free(programs, groups);
    } catch (const plan_error& e) {
        return e.what();
    }
    return "(no error)";
}

// Positions of the steps of `program` that take part in transfers of `kind`.
std::vector<std::size_t> transfer_steps(const partition::partitioned_graph& pg, const partition::device_program& program,
                                        partition::transfer_kind kind) {
    std::vector<std::size_t> at;
    for (std::size_t s = 0; s < program.size(); ++s)
        if (program[s].transfer >= 0 && pg.transfers[static_cast<std::size_t>(program[s].transfer)].kind == kind)
            at.push_back(s);
    return at;
}

}  // namespace

TEST_CASE("deadlock: the programs apply_plan emits pass", "[deadlock]") {
    for (std::int64_t layers : {1, 2}) {
        for (int world : {2, 4}) {
            INFO("layers " << layers << ", " << world << " devices");
            auto dp = partitioned(tiny_gpt(layers), world, 1);
            CHECK_FALSE(dp.transfers.empty());
            CHECK_NOTHROW(partition::check_deadlock_free(dp));
            auto tp = partitioned(tiny_gpt(layers), 1, world);
            CHECK_FALSE(tp.transfers.empty());
            CHECK_NOTHROW(partition::check_deadlock_free(tp));
        }
    }
    auto hybrid = partitioned(tiny_gpt(2), 2, 2);
    CHECK_NOTHROW(partition::check_deadlock_free(hybrid));
    auto stages = partitioned(tiny_gpt(2), two_stage_plan);
    CHECK_NOTHROW(partition::check_deadlock_free(stages));
}

TEST_CASE("deadlock: two all-reduces in opposite orders on two devices", "[deadlock]") {
    auto pg = partitioned(tiny_gpt(2), 2, 1);
    auto programs = partition::device_programs(pg);
    const auto groups = partition::transfer_groups(pg);
    REQUIRE_NOTHROW(partition::check_deadlock_free(programs, groups));

    // The last two all-reduces of device 0 (gradients, after every compute step): swapping
    // them keeps device 0's own data order valid but reverses its order against device 1.
    auto reduces = transfer_steps(pg, programs[0], partition::transfer_kind::all_reduce);
    REQUIRE(reduces.size() >= 2);
    const std::size_t a = reduces[reduces.size() - 2], b = reduces.back();
    const std::string first = programs[0][a].name, second = programs[0][b].name;
    std::swap(programs[0][a], programs[0][b]);

    const std::string message = deadlock_message(programs, groups);
    CHECK_THAT(message, Catch::StartsWith("deadlock:"));
    CHECK_THAT(message, Catch::Contains("device 0: '" + first + "' waits for '" + second + "'"));
    CHECK_THAT(message, Catch::Contains("device 1: '" + second + "' waits for '" + first + "'"));
    CHECK_THAT(message, Catch::Contains("reorder"));
    CHECK_THAT(message, Catch::Contains("placement"));
}

TEST_CASE("deadlock: a reordering given as node ids", "[deadlock]") {
    auto pg = partitioned(tiny_gpt(1), 4, 1);
    std::vector<std::vector<node_id>> order(pg.devices.size());
    for (std::size_t d = 0; d < order.size(); ++d)
        for (std::size_t n = 0; n < pg.devices[d].ir().nodes.size(); ++n) order[d].push_back(static_cast<node_id>(n));
    REQUIRE_NOTHROW(partition::check_deadlock_free(pg, order));

    // Two independent gradient all-reduces of device 3 change places.
    const graph& g3 = pg.devices[3].ir();
    std::vector<std::size_t> reduces;
    for (std::size_t n = 0; n < g3.nodes.size(); ++n)
        if (g3.nodes[n].name.find("/all_reduce/") != std::string::npos) reduces.push_back(n);
    REQUIRE(reduces.size() >= 2);
    const std::size_t a = reduces[reduces.size() - 2], b = reduces.back();
    std::swap(order[3][a], order[3][b]);
    try {
        partition::check_deadlock_free(pg, order);
        FAIL("the swapped all-reduces were not reported");
    } catch (const plan_error& e) {
        CHECK_THAT(e.what(), Catch::StartsWith("deadlock:"));
        CHECK_THAT(e.what(), Catch::Contains(g3.nodes[a].name));
        CHECK_THAT(e.what(), Catch::Contains(g3.nodes[b].name));
    }

    // An order that is not a permutation of the device's nodes is a usage error.
    order[3].pop_back();
    CHECK_THROWS_WITH(partition::check_deadlock_free(pg, order), Catch::Contains("device 3") && Catch::Contains("once"));
}

TEST_CASE("deadlock: a receiver that waits for its recv before a transfer the sender needs first", "[deadlock]") {
    auto pg = partitioned(tiny_gpt(2), two_stage_plan);
    auto programs = partition::device_programs(pg);
    const auto groups = partition::transfer_groups(pg);
    REQUIRE_NOTHROW(partition::check_deadlock_free(programs, groups));

    // Forward: device 0 sends an activation to device 1. Backward: device 1 sends its
    // gradient back, which it can compute only after receiving the activation.
    auto find_send = [&](int from, int to, bool backward) -> std::int64_t {
        for (std::size_t t = 0; t < pg.transfers.size(); ++t) {
            const auto& tr = pg.transfers[t];
            if (tr.kind == partition::transfer_kind::send_recv && tr.group == std::vector<int>{from, to} &&
                tr.backward == backward && tr.consumer != no_id)
                return static_cast<std::int64_t>(t);
        }
        return -1;
    };
    const std::int64_t activation = find_send(0, 1, false), gradient = find_send(1, 0, true);
    REQUIRE(activation >= 0);
    REQUIRE(gradient >= 0);

    // Device 0 posts the recv of the gradient before sending the activation.
    auto& receiver = programs[0];
    auto position = [&](std::int64_t t) {
        return std::find_if(receiver.begin(), receiver.end(), [&](const auto& s) { return s.transfer == t; });
    };
    partition::program_step recv = *position(gradient);
    const std::string recv_name = recv.name, send_name = position(activation)->name;
    CHECK_THAT(recv_name, Catch::Contains("send_recv"));
    receiver.erase(position(gradient));
    receiver.insert(position(activation), recv);

    const std::string message = deadlock_message(programs, groups);
    CHECK_THAT(message, Catch::StartsWith("deadlock:"));
    CHECK_THAT(message, Catch::Contains("device 0: '" + send_name + "' waits for '" + recv_name + "'"));
    CHECK_THAT(message, Catch::Contains("device 1: '" + recv_name + "' waits for '" + send_name + "'"));
}

TEST_CASE("deadlock: a device that reads before the producer ran, or never joins its transfer", "[deadlock]") {
    auto pg = partitioned(tiny_gpt(1), 2, 1);
    const auto groups = partition::transfer_groups(pg);

    auto programs = partition::device_programs(pg);
    // The first op of device 0 that reads another op's output moves to the front.
    auto reader = std::find_if(programs[0].begin(), programs[0].end(), [](const auto& s) { return !s.reads.empty(); });
    REQUIRE(reader != programs[0].end());
    const std::string name = reader->name;
    std::rotate(programs[0].begin(), reader, reader + 1);
    std::string message = deadlock_message(programs, groups);
    CHECK_THAT(message, Catch::StartsWith("deadlock:"));
    CHECK_THAT(message, Catch::Contains("device 0: '" + name + "' reads the output of"));
    CHECK_THAT(message, Catch::Contains("producers run before their readers"));

    programs = partition::device_programs(pg);
    auto joined = std::find_if(programs[1].begin(), programs[1].end(), [](const auto& s) { return s.transfer >= 0; });
    REQUIRE(joined != programs[1].end());
    const std::string transfer_name = joined->name;
    programs[1].erase(joined);
    message = deadlock_message(programs, groups);
    CHECK_THAT(message, Catch::Contains("deadlock: '" + transfer_name + "' waits for device 1"));
    CHECK_THAT(message, Catch::Contains("never reaches it"));
}

TEST_CASE("deadlock: the quick check passes the programs the full one passes, and leaves every fault to it", "[deadlock]") {
    // check_deadlock_free first runs partition::detail::surely_deadlock_free over flat arrays
    // and names nothing; only where it is unsure does the full check build the named graph.
    std::vector<partition::partitioned_graph> sound;
    sound.push_back(partitioned(tiny_gpt(2), 2, 1));
    sound.push_back(partitioned(tiny_gpt(2), 1, 4));
    sound.push_back(partitioned(tiny_gpt(2), 2, 2));
    sound.push_back(partitioned(tiny_gpt(2), two_stage_plan));
    for (const auto& pg : sound) CHECK(partition::detail::surely_deadlock_free(pg, pg.order));

    auto pg = partitioned(tiny_gpt(1), 4, 1);
    std::vector<std::vector<node_id>> order(pg.devices.size());
    for (std::size_t d = 0; d < order.size(); ++d)
        for (std::size_t n = 0; n < pg.devices[d].ir().nodes.size(); ++n) order[d].push_back(static_cast<node_id>(n));
    REQUIRE(partition::detail::surely_deadlock_free(pg, order));
    const graph& g3 = pg.devices[3].ir();
    std::vector<std::size_t> reduces;
    for (std::size_t n = 0; n < g3.nodes.size(); ++n)
        if (g3.nodes[n].name.find("/all_reduce/") != std::string::npos) reduces.push_back(n);
    REQUIRE(reduces.size() >= 2);
    SECTION("a cycle of waits") {
        std::swap(order[3][reduces[reduces.size() - 2]], order[3][reduces.back()]);
        CHECK_FALSE(partition::detail::surely_deadlock_free(pg, order));
    }
    SECTION("a node run twice, another never") {
        order[3][reduces.back()] = order[3][reduces.front()];
        CHECK_FALSE(partition::detail::surely_deadlock_free(pg, order));
        CHECK_THROWS_AS(partition::check_deadlock_free(pg, order), usage_error);
    }
    SECTION("a device outside the transfer's group") {
        const auto t = g3.nodes[reduces.back()].attrs.get<std::int64_t>("transfer");
        auto& group = pg.transfers[static_cast<std::size_t>(t)].group;
        group.erase(std::find(group.begin(), group.end(), 3));
        CHECK_FALSE(partition::detail::surely_deadlock_free(pg, order));
        CHECK_THROWS_WITH(partition::check_deadlock_free(pg, order), Catch::Contains("whose group does not include it"));
    }
}
