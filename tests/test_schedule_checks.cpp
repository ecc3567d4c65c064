// Schedules that cannot run are rejected before they run, with messages that name the blocks
// and the fix: validate() (entries, completeness, dependencies, deadlock, crossed messages,
// memory), from_constraints() (constraints that cannot hold), the shape and the templates'
// run-time arguments.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include <loom/schedule/all.hpp>

using namespace loom::schedule;
using Catch::Contains;

namespace {

// 1F1B on 2 stages, 4 micro-batches:
//   device 0: F(s0,m0) F(s0,m1) B(s0,m0) F(s0,m2) B(s0,m1) F(s0,m3) B(s0,m2) B(s0,m3)
//   device 1: F(s1,m0) B(s1,m0) F(s1,m1) B(s1,m1) F(s1,m2) B(s1,m2) F(s1,m3) B(s1,m3)
schedule edited(const std::function<void(schedule&)>& edit) {
    schedule s = one_f_one_b(2, 4);
    edit(s);
    return s;
}

std::vector<block>& device(schedule& s, int d) { return s.device_order[static_cast<std::size_t>(d)]; }

void erase(std::vector<block>& order, const block& b) { order.erase(std::find(order.begin(), order.end(), b)); }

}  // namespace

TEST_CASE("the templates are valid, and validation_error says so", "[schedule]") {
    CHECK(validation_error(one_f_one_b(2, 4)).empty());
    CHECK_NOTHROW(validate(one_f_one_b(2, 4), {.max_in_flight_per_stage = 2}));
}

TEST_CASE("a block missing, twice, on the wrong device or outside the shape", "[schedule]") {
    const schedule missing = edited([](schedule& s) { erase(device(s, 1), backward_block(1, 2)); });
    CHECK_THROWS_WITH(validate(missing),
                      Contains("validate('1F1B'): device 1 never runs B(s1,m2) (stage 1 runs on device 1); add it to "
                               "device 1's order"));

    const schedule twice = edited([](schedule& s) { device(s, 0).push_back(backward_block(0, 1)); });
    CHECK_THROWS_WITH(validate(twice), Contains("device 0 runs B(s0,m1) twice (positions 4 and 8); run each block once"));

    const schedule wrong_device = edited([](schedule& s) {
        erase(device(s, 1), forward_block(1, 0));
        device(s, 0).insert(device(s, 0).begin() + 1, forward_block(1, 0));
    });
    CHECK_THROWS_WITH(validate(wrong_device),
                      Contains("device 0 runs F(s1,m0), but stage 1 runs on device 1; move F(s1,m0) into the order of "
                               "device 1"));

    const schedule outside = edited([](schedule& s) { device(s, 0).push_back(forward_block(5, 0)); });
    CHECK_THROWS_WITH(validate(outside), Contains("device 0 runs F(s5,m0): stage 5 is outside 0..1"));

    // Timing orders known to be valid skips validation, but not these checks.
    const simulate_options unchecked{.validated = true, .makespan_only = true};
    CHECK_THROWS_WITH(simulate(missing, {}, unchecked), Contains("the orders deadlock or leave blocks out"));
    CHECK_THROWS_WITH(simulate(twice, {}, unchecked), Contains("B(s0,m1) is listed twice"));
    CHECK_THROWS_WITH(simulate(outside, {}, unchecked), Contains("F(s5,m0): stage 5 is outside 0..1"));
    CHECK_THROWS_WITH(simulate(one_f_one_b(2, 4), cost_model{.backward = -1}),
                      Contains("the cost model gives B(s0,m0) the time -1"));
    CHECK_THROWS_WITH(simulate(one_f_one_b(2, 4), cost_model{.forward_per_stage = {1}}),
                      Contains("forward_per_stage has 1 entries but F(s1,m0) is on stage 1"));

    const schedule backward_round = edited([](schedule& s) { device(s, 0)[2].round = 1; });
    CHECK_THROWS_WITH(validate(backward_round), Contains("B1(s0,m0): a backward has no round"));

    const schedule one_order = edited([](schedule& s) { s.device_order.pop_back(); });
    CHECK_THROWS_WITH(validate(one_order),
                      Contains("device_order has 1 device orders but the shape has 2 devices; give one order per device"));

    // an SPMD block must be on every device of its stage
    schedule spmd = interlaced(2, 4);
    erase(device(spmd, 1), forward_block(0, 1));
    CHECK_THROWS_WITH(validate(spmd), Contains("device 1 never runs F(s0,m1) (stage 0 runs on devices {0, 1})"));
}

TEST_CASE("a block before what it depends on, on one device", "[schedule]") {
    const schedule s = edited([](schedule& x) { std::swap(device(x, 1)[0], device(x, 1)[1]); });
    CHECK_THROWS_WITH(validate(s), Contains("device 1 runs B(s1,m0) (position 0) before F(s1,m0) (position 1), but "
                                            "B(s1,m0) needs the loss of its forward from F(s1,m0); move F(s1,m0) "
                                            "before B(s1,m0)"));
}

TEST_CASE("a deadlock: devices waiting on each other in a cycle", "[schedule]") {
    // device 0 runs B(s0,m0) before F(s0,m1), device 1 runs F(s1,m1) before B(s1,m0)
    const schedule s = edited([](schedule& x) {
        device(x, 0) = {forward_block(0, 0), backward_block(0, 0), forward_block(0, 1), backward_block(0, 1),
                        forward_block(0, 2), backward_block(0, 2), forward_block(0, 3), backward_block(0, 3)};
        device(x, 1) = {forward_block(1, 0), forward_block(1, 1), backward_block(1, 0), backward_block(1, 1),
                        forward_block(1, 2), backward_block(1, 2), forward_block(1, 3), backward_block(1, 3)};
    });
    const std::string why = validation_error(s);
    CHECK_THAT(why, Contains("deadlock: these blocks wait for each other in a cycle:"));
    CHECK_THAT(why, Contains("F(s1,m1) waits for F(s0,m1) (its input activation)"));
    CHECK_THAT(why, Contains("F(s0,m1) waits for B(s0,m0) (device 0 runs it first)"));
    CHECK_THAT(why, Contains("B(s0,m0) waits for B(s1,m0) (its output gradient)"));
    CHECK_THAT(why, Contains("B(s1,m0) waits for F(s1,m1) (device 1 runs it first)"));
    CHECK_THAT(why, Contains("e.g. run"));
    CHECK_THROWS_AS(simulate(s), schedule_error);
    CHECK_THROWS_WITH(simulate(s, {}, {.validated = true, .makespan_only = true}),
                      Contains("no device can run its next block; the orders deadlock or leave blocks out"));
    CHECK_THROWS_AS(device_programs(s), schedule_error);

    // SPMD blocks ordered differently on two of their devices
    schedule spmd = interlaced(2, 4);
    auto& d1 = device(spmd, 1);
    std::iter_swap(std::find(d1.begin(), d1.end(), forward_block(0, 0)), std::find(d1.begin(), d1.end(), forward_block(0, 1)));
    CHECK_THROWS_WITH(validate(spmd), Contains("deadlock") && Contains("F(s0,m0) waits for F(s0,m1) (device 1 runs it first)"));
}

TEST_CASE("crossed messages: a receive would take another block's message", "[schedule]") {
    // device 0 sends the activations of m0 then m1; device 1 runs m1 first
    const schedule s = edited([](schedule& x) {
        device(x, 1) = {forward_block(1, 1), forward_block(1, 0), backward_block(1, 0), backward_block(1, 1),
                        forward_block(1, 2), backward_block(1, 2), forward_block(1, 3), backward_block(1, 3)};
    });
    CHECK_THROWS_WITH(validate(s),
                      Contains("crossed messages on channel device 0 -> device 1: device 0 sends F(s0,m0) -> F(s1,m0) "
                               "(activation) before F(s0,m1) -> F(s1,m1) (activation), but device 1 runs F(s1,m1) before "
                               "F(s1,m0), so F(s1,m1) would receive the message meant for F(s1,m0); on device 1 run "
                               "F(s1,m0) before F(s1,m1), or on device 0 run F(s0,m1) before F(s0,m0)"));
}

TEST_CASE("memory: activations in flight over the cap", "[schedule]") {
    // GPipe holds every micro-batch; 1F1B holds p - s
    CHECK_THROWS_WITH(validate(gpipe(2, 4), {.max_in_flight_per_stage = 2}),
                      Contains("device 0 holds the activations of 3 micro-batches of stage 0 at F(s0,m2) (m0, m1, m2), "
                               "over the cap of 2 (max_in_flight_per_stage); run B(s0,m0) before F(s0,m2), or raise the "
                               "cap"));
    CHECK_NOTHROW(validate(one_f_one_b(2, 4), {.max_in_flight_per_stage = 2}));

    const validation_options bytes{.memory_cap_bytes = 350, .activation_bytes = {100, 100, 100, 100}};
    CHECK_THROWS_WITH(validate(one_f_one_b(4, 8), bytes),
                      Contains("device 0 holds 400 bytes of activations at F(s0,m3) (stage 0: 4 x 100), over the cap of "
                               "350 bytes (memory_cap_bytes)"));
    CHECK_NOTHROW(validate(one_f_one_b(4, 8), {.memory_cap_bytes = 400, .activation_bytes = {100, 100, 100, 100}}));
    // interleaved: a device's chunks add up (device 0 of 2 holds 2 (2 - 0 - 1) + 2 + 1 = 5 chunks)
    CHECK_THROWS_WITH(validate(interleaved_one_f_one_b(2, 2, 4), {.memory_cap_bytes = 45, .activation_bytes = {10, 1, 10, 1}}),
                      Contains("device 0 holds 50 bytes of activations"));
    CHECK_THROWS_AS(validate(one_f_one_b(4, 8), {.memory_cap_bytes = 10}), loom::usage_error);
}

TEST_CASE("constraints that cannot hold", "[schedule]") {
    using namespace var;
    const auto shape = pipeline_shape::linear(2, 4);
    // a backward before its own forward
    CHECK_THROWS_WITH(from_constraints(shape, {before{backward(micro), forward(micro)}}, "backwards"),
                      Contains("from_constraints('backwards'): the constraints cannot all hold; with the data "
                               "dependencies they order these blocks in a cycle: B(s1,m0) needs F(s1,m0) (the loss of "
                               "its forward); B(s1,m0) before F(s1,m0) by constraint #0 before{backward(micro), "
                               "forward(micro)}; drop or change one of the constraints named"));
    // two constraints against each other
    CHECK_THROWS_WITH(
        from_constraints(shape, {before{forward(micro), forward(micro + 1)}, before{forward(micro + 2), forward(micro)}}),
        Contains("from_constraints: the constraints cannot all hold") && Contains("by constraint #0") &&
            Contains("by constraint #1"));
    // stage 0 sends m1 first, stage 1 must run m0 first: one channel cannot deliver that
    CHECK_THROWS_WITH(from_constraints(shape, {before{forward(micro + 1), forward(micro), each_stage, within(stage, 0, 0)},
                                               before{forward(micro), forward(micro + 1), each_stage, within(stage, 1, 1)}}),
                      Contains("the constraints force crossed messages") &&
                          Contains("would make F(s1,m3) run before F(s1,m0)"));
    // blocks of two devices
    CHECK_THROWS_WITH(from_constraints(shape, {before{forward(micro), forward(micro).on_stage(stage + 1)}}),
                      Contains("orders F(s0,m0) before F(s1,m0), but they share no device"));
    // a round the pipeline does not have
    CHECK_THROWS_WITH(from_constraints(shape, {before{forward(micro, 1), backward(micro)}}),
                      Contains("constraint #0: before{forward(micro, 1), backward(micro)} names forward round 1, but "
                               "the pipeline has 1 forward round (0)"));
    CHECK_THROWS_WITH(from_constraints(shape, {before{backward(micro), backward(micro)}}),
                      Contains("orders every block before itself"));
}

TEST_CASE("templates check their run-time arguments with the compile-time predicates", "[schedule]") {
    CHECK_THROWS_WITH(one_f_one_b(0, 4), Contains("one_f_one_b(0, 4): 0 pipeline stages; a pipeline needs at least one stage"));
    CHECK_THROWS_WITH(gpipe(2, 0), Contains("gpipe(2, 0): 0 micro-batches"));
    CHECK_THROWS_WITH(interleaved_one_f_one_b(4, 2, 6),
                      Contains("interleaved_one_f_one_b(4, 2, 6): 6 micro-batches is not a multiple of the 4 pipeline "
                               "stages; interleaved 1F1B moves micro-batches through each virtual stage in groups of 4; "
                               "use 4 or 8 micro-batches"));
    CHECK_THROWS_WITH(interleaved_one_f_one_b(4, 2, 3), Contains("use 4 micro-batches"));
    CHECK_THROWS_WITH(interleaved_one_f_one_b(4, 0, 8), Contains("0 virtual stages per device"));
    CHECK_THROWS_WITH(three_f_one_b(-1, 4), Contains("three_f_one_b(-1, 4): -1 pipeline stages"));
    CHECK_THROWS_WITH(interlaced(2, 4, 0), Contains("interlaced(2, 4, 0): 0 devices per stage"));
}

TEST_CASE("shapes that make no pipeline", "[schedule]") {
    auto shape = [](std::vector<std::vector<int>> groups, int devices) {
        return pipeline_shape{static_cast<int>(groups.size()), 4, 1, std::move(groups), devices};
    };
    CHECK_THROWS_WITH(check_shape(shape({{0}, {}}, 1)), Contains("stage 1 runs on no device"));
    CHECK_THROWS_WITH(check_shape(shape({{0}, {2}}, 2)),
                      Contains("stage 1 lists device 2, outside 0..1; use a device below 2 or raise devices"));
    CHECK_THROWS_WITH(check_shape(shape({{0, 0}}, 1)), Contains("stage 0 lists device 0 twice"));
    CHECK_THROWS_WITH(check_shape(shape({{0}, {0}}, 2)), Contains("device 1 runs no stage"));
    CHECK_THROWS_WITH(check_shape(pipeline_shape{3, 4, 1, {{0}, {1}}, 2}),
                      Contains("stage_devices lists 2 stages but stages = 3"));
    CHECK_THROWS_WITH(check_shape(pipeline_shape::linear(2, 4, 0)), Contains("0 forward rounds"));
    schedule s = one_f_one_b(2, 4);
    s.shape.micro_batches = 0;
    CHECK_THROWS_WITH(validate(s), Contains("validate('1F1B'): shape: 0 micro-batches"));
}
