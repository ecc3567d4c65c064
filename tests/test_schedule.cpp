// Pipeline schedules (include/loom/schedule/): the templates reproduce the classic orders and
// closed forms exactly, the list scheduler reproduces the templates from their constraints
// (GPipe, 1F1B and interleaved 1F1B are written out directly and must agree with it), the
// typed front end agrees with the run-time one, and the exports are well-formed. The rejected schedules are in test_schedule_checks.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <loom/schedule/all.hpp>

using namespace loom::schedule;

namespace {

using orders = std::vector<std::vector<block>>;

// ---- the classic orders, written directly (Megatron-LM's formulas) --------------------------

// 1F1B on stage s of p: w = min(p - s - 1, m) warm-up forwards, then F(w + i), B(i) pairs,
// then the remaining backwards.
orders classic_one_f_one_b(int p, int m) {
    orders out(static_cast<std::size_t>(p));
    for (int s = 0; s < p; ++s) {
        auto& o = out[static_cast<std::size_t>(s)];
        const int w = std::min(p - s - 1, m);
        for (int i = 0; i < w; ++i) o.push_back(forward_block(s, i));
        for (int i = 0; i + w < m; ++i) {
            o.push_back(forward_block(s, i + w));
            o.push_back(backward_block(s, i));
        }
        for (int i = m - w; i < m; ++i) o.push_back(backward_block(s, i));
    }
    return out;
}

// Interleaved 1F1B on device d of p with v chunks: forward unit k is chunk (k / p) % v of
// micro-batch (k / (p v)) p + k % p; backward units run the chunks in reverse;
// w = min(2 (p - d - 1) + (v - 1) p, v m) (v = 1: plain 1F1B).
orders classic_interleaved(int p, int v, int m) {
    orders out(static_cast<std::size_t>(p));
    const int total = v * m;
    for (int d = 0; d < p; ++d) {
        auto unit = [&](int k, bool fwd) {
            const int chunk = fwd ? (k / p) % v : v - 1 - (k / p) % v;
            const int micro = (k / (p * v)) * p + k % p;
            return fwd ? forward_block(chunk * p + d, micro) : backward_block(chunk * p + d, micro);
        };
        const int w = std::min(v == 1 ? p - d - 1 : 2 * (p - d - 1) + (v - 1) * p, total);
        auto& o = out[static_cast<std::size_t>(d)];
        for (int k = 0; k < w; ++k) o.push_back(unit(k, true));
        for (int k = 0; k + w < total; ++k) {
            o.push_back(unit(k + w, true));
            o.push_back(unit(k, false));
        }
        for (int k = total - w; k < total; ++k) o.push_back(unit(k, false));
    }
    return out;
}

orders classic_gpipe(int p, int m) {
    orders out(static_cast<std::size_t>(p));
    for (int s = 0; s < p; ++s) {
        for (int i = 0; i < m; ++i) out[static_cast<std::size_t>(s)].push_back(forward_block(s, i));
        for (int i = 0; i < m; ++i) out[static_cast<std::size_t>(s)].push_back(backward_block(s, i));
    }
    return out;
}

// Every pair a constraint family orders is in that order on every device that runs both.
void check_satisfies(const schedule& s, const std::vector<before>& constraints) {
    const auto position = order_positions(s);
    for (const before& c : constraints)
        for (const ordered_pair& q : expand(c, s.shape))
            for (int d = 0; d < s.shape.devices; ++d) {
                const int a = position[static_cast<std::size_t>(d)][static_cast<std::size_t>(block_index(s.shape, q.first))];
                const int b = position[static_cast<std::size_t>(d)][static_cast<std::size_t>(block_index(s.shape, q.then))];
                if (a < 0 || b < 0) continue;
                INFO(to_string(c) << ": " << to_string(q.first, s.shape.rounds) << " before "
                                  << to_string(q.then, s.shape.rounds) << " on device " << d);
                CHECK(a < b);
            }
}

const cost_model uniform{};                                  // forward = backward = 1
const cost_model backward_twice{.forward = 1, .backward = 2};  // backward = 2 x forward

}  // namespace

// ---- blocks, shapes, dependencies, messages -------------------------------------------------

TEST_CASE("blocks print as F(s,m), Fr(s,m) and B(s,m)", "[schedule]") {
    CHECK(to_string(forward_block(1, 3)) == "F(s1,m3)");
    CHECK(to_string(forward_block(1, 3, 2)) == "F2(s1,m3)");
    CHECK(to_string(forward_block(1, 3), 3) == "F0(s1,m3)");
    CHECK(to_string(backward_block(1, 3), 3) == "B(s1,m3)");
    CHECK(forward_block(0, 1) < backward_block(0, 0));
}

TEST_CASE("shapes place stages on devices", "[schedule]") {
    const auto linear = pipeline_shape::linear(4, 8);
    CHECK(linear.devices == 4);
    CHECK(linear.stage_devices == std::vector<std::vector<int>>{{0}, {1}, {2}, {3}});

    const auto interleaved = pipeline_shape::interleaved(2, 3, 4);
    CHECK(interleaved.stages == 6);
    CHECK(interleaved.chunks() == 3);
    CHECK(interleaved.stage_devices == std::vector<std::vector<int>>{{0}, {1}, {0}, {1}, {0}, {1}});

    // the embedding (stage 0) and the LM head (stage 5) share all devices
    const auto interlaced = pipeline_shape::interlaced(4, 8);
    CHECK(interlaced.stages == 6);
    CHECK(interlaced.devices == 4);
    CHECK(interlaced.stage_devices.front() == std::vector<int>{0, 1, 2, 3});
    CHECK(interlaced.stage_devices.back() == interlaced.stage_devices.front());
    CHECK(interlaced.stage_devices[2] == std::vector<int>{1});
    const auto wide = pipeline_shape::interlaced(2, 4, 2);  // two stages of two devices
    CHECK(wide.stage_devices == std::vector<std::vector<int>>{{0, 1, 2, 3}, {0, 1}, {2, 3}, {0, 1, 2, 3}});

    for (const auto& p : {linear, interleaved, interlaced, wide}) CHECK_NOTHROW(check_shape(p));
}

TEST_CASE("data dependencies follow the chain, the recycling and the backward", "[schedule]") {
    const auto p = pipeline_shape::linear(3, 2, 2);  // 3 stages, 2 micro-batches, 2 rounds
    CHECK(inputs_of(p, forward_block(0, 1, 0)).empty());
    CHECK(inputs_of(p, forward_block(2, 1, 1)) ==
          std::vector<dependency>{{forward_block(1, 1, 1), forward_block(2, 1, 1), dependency_kind::activation}});
    CHECK(inputs_of(p, forward_block(0, 1, 1)) ==
          std::vector<dependency>{{forward_block(2, 1, 0), forward_block(0, 1, 1), dependency_kind::recycle}});
    CHECK(inputs_of(p, backward_block(2, 0)) ==
          std::vector<dependency>{{forward_block(2, 0, 1), backward_block(2, 0), dependency_kind::loss}});
    CHECK(inputs_of(p, backward_block(1, 0)) ==
          std::vector<dependency>{{backward_block(2, 0), backward_block(1, 0), dependency_kind::gradient},
                                  {forward_block(1, 0, 1), backward_block(1, 0), dependency_kind::saved_activation}});
    // every block has a dense index and back
    for (int i = 0; i < block_count(p); ++i) CHECK(block_index(p, block_at(p, i)) == i);
    CHECK(block_count(p) == 3 * 3 * 2);
}

TEST_CASE("messages go from the producer's device to each consumer device that lacks its output", "[schedule]") {
    const auto p = pipeline_shape::interlaced(4, 2);
    // last pipeline stage (device 3) -> LM head on every device: 3 messages, device 3 is local
    const auto to_head = transfers_of(p, {forward_block(4, 0), forward_block(5, 0), dependency_kind::activation});
    REQUIRE(to_head.size() == 3);
    for (int i = 0; i < 3; ++i) {
        CHECK(to_head[static_cast<std::size_t>(i)].from == 3);
        CHECK(to_head[static_cast<std::size_t>(i)].to == i);
    }
    // embedding on every device -> first stage on device 0: local
    CHECK(transfers_of(p, {forward_block(0, 0), forward_block(1, 0), dependency_kind::activation}).empty());
    // a plain pipeline sends one activation per stage boundary and micro-batch, and one gradient
    CHECK(all_transfers(pipeline_shape::linear(4, 8)).size() == 2 * 3 * 8);
}

// ---- the templates: valid, and the classic orders ------------------------------------------

TEST_CASE("GPipe: every forward, then every backward; bubble (p-1)/(m+p-1); m in flight", "[schedule]") {
    for (int p : {2, 4})
        for (int m = 4; m <= 8; ++m) {
            INFO("p = " << p << ", m = " << m);
            const schedule s = gpipe(p, m);
            CHECK(validation_error(s).empty());
            CHECK(s.device_order == classic_gpipe(p, m));
            for (const cost_model& costs : {uniform, backward_twice}) {
                const simulation r = simulate(s, costs);
                const double f = costs.forward, b = costs.backward;
                CHECK(r.makespan == (m + p - 1) * (f + b));
                CHECK(r.bubble_fraction == double(p - 1) / double(m + p - 1));
                for (int d = 0; d < p; ++d) CHECK(r.idle[static_cast<std::size_t>(d)] == (p - 1) * (f + b));
            }
            const auto peaks = peak_in_flight(s);
            for (int st = 0; st < p; ++st) CHECK(peaks.per_stage[static_cast<std::size_t>(st)] == m);
        }
}

TEST_CASE("1F1B (Table 4): the classic order; bubble (p-1)/(m+p-1); p - s in flight", "[schedule]") {
    for (int p : {2, 4})
        for (int m = 4; m <= 8; ++m) {
            INFO("p = " << p << ", m = " << m);
            const schedule s = one_f_one_b(p, m);
            CHECK(validation_error(s).empty());
            CHECK(s.device_order == classic_one_f_one_b(p, m));
            for (const cost_model& costs : {uniform, backward_twice}) {
                const simulation r = simulate(s, costs);
                const double f = costs.forward, b = costs.backward;
                // the same bubble as GPipe, (p - 1)(f + b) per device ...
                CHECK(r.makespan == (m + p - 1) * (f + b));
                CHECK(r.bubble_fraction == double(p - 1) / double(m + p - 1));
                // ... which is (p - 1) / m of the work
                CHECK(r.bubble_overhead == double(p - 1) / double(m));
            }
            // ... with p - s micro-batches in flight on stage s instead of m
            const auto peaks = peak_in_flight(s);
            for (int st = 0; st < p; ++st) CHECK(peaks.per_stage[static_cast<std::size_t>(st)] == std::min(p - st, m));
        }
}

TEST_CASE("interleaved 1F1B: Megatron's order; the bubble shrinks by v", "[schedule]") {
    struct sizes {
        int p, v, m;
    };
    for (const sizes z : {sizes{2, 2, 4}, sizes{2, 2, 6}, sizes{2, 2, 8}, sizes{2, 3, 4}, sizes{2, 3, 8},
                          sizes{4, 2, 4}, sizes{4, 2, 8}, sizes{4, 3, 8}, sizes{4, 1, 8}}) {
        const auto [p, v, m] = z;
        INFO("p = " << p << ", v = " << v << ", m = " << m);
        const schedule s = interleaved_one_f_one_b(p, v, m);
        CHECK(validation_error(s).empty());
        CHECK(s.device_order == classic_interleaved(p, v, m));
        if (v == 1) CHECK(s.device_order == classic_one_f_one_b(p, m));
        for (const cost_model& costs : {uniform, backward_twice}) {
            // Each block is one chunk (1/v of a stage's layers) and costs f or b; a device
            // computes v m (f + b). The bubble is (p - 1)(f + b) per device, 1/v of what 1F1B
            // with whole stages (f and b each v times longer) has, so
            //   bubble_overhead = idle / busy = (p - 1) / (v m)    (1F1B: (p - 1) / m)
            //   bubble_fraction = idle / (p makespan) = (p - 1) / (v m + p - 1).
            const simulation r = simulate(s, costs);
            const double f = costs.forward, b = costs.backward;
            CHECK(r.makespan == (v * m + p - 1) * (f + b));
            CHECK(r.bubble_overhead == double(p - 1) / double(v * m));
            CHECK(r.bubble_fraction == double(p - 1) / double(v * m + p - 1));
            const simulation whole = simulate(one_f_one_b(p, m), cost_model{.forward = v * f, .backward = v * b});
            CHECK(whole.total_idle() == v * r.total_idle());
        }
        // device d holds its warm-up forwards plus one: 2 (p - d - 1) + (v - 1) p + 1 chunks
        const auto peaks = peak_in_flight(s);
        for (int d = 0; d < p; ++d) {
            const int warmup = v == 1 ? p - d - 1 : 2 * (p - d - 1) + (v - 1) * p;
            CHECK(peaks.per_device[static_cast<std::size_t>(d)] == std::min(warmup + 1, v * m));
        }
    }
}

TEST_CASE("3F1B (Table 7): three forward rounds, then one backward, in a steady interleave", "[schedule]") {
    for (int p : {2, 4})
        for (int m = 4; m <= 8; ++m) {
            INFO("p = " << p << ", m = " << m);
            const schedule s = three_f_one_b(p, m);
            CHECK(validation_error(s).empty());
            check_satisfies(s, recycling_constraints(3));
            // the steady state of stage st: F0(k+2) F1(k+1) F2(k) B(k-w), w = p - st - 1
            for (int st = 0; st < p; ++st) {
                const auto& o = s.device_order[static_cast<std::size_t>(st)];
                const int w = p - st - 1;
                for (int k = w; k + 2 < m; ++k) {
                    const auto at = std::find(o.begin(), o.end(), forward_block(st, k + 2, 0));
                    REQUIRE(o.end() - at >= 4);
                    CHECK(at[1] == forward_block(st, k + 1, 1));
                    CHECK(at[2] == forward_block(st, k, 2));
                    CHECK(at[3] == backward_block(st, k - w));
                }
            }
            for (const cost_model& costs : {uniform, backward_twice}) {
                const simulation r = simulate(s, costs);
                // every device works 3 m forwards and m backwards ...
                for (double busy : r.busy) CHECK(busy == m * (3 * costs.forward + costs.backward));
                // ... far faster than running micro-batches one after another (Figure 2, left)
                CHECK(r.makespan < m * p * (3 * costs.forward + costs.backward));
                // ... and the steady state adds no bubble: the idle time of m >= p micro-batches
                // is that of p (only the warm-up and the cool-down idle)
                if (m >= p) {
                    const simulation shortest = simulate(three_f_one_b(p, p), costs);
                    CHECK(r.idle == shortest.idle);
                }
            }
            // Table 7 writes constraint (2) for m > 0 only; the m = 0 member changes nothing
            {
                using namespace var;
                auto paper = recycling_constraints(3);
                for (before& c : paper)
                    if (c.first == forward(micro + 1, 1) && c.then == forward(micro, 2))
                        c.when = within(micro, 1, micro_batches);
                CHECK(from_constraints(pipeline_shape::linear(p, m, 3), paper, "Table 7").device_order == s.device_order);
            }
            // only the last round keeps activations: p - s in flight, as 1F1B
            const auto peaks = peak_in_flight(s);
            for (int st = 0; st < p; ++st) CHECK(peaks.per_stage[static_cast<std::size_t>(st)] == std::min(p - st, m));
        }
}

TEST_CASE("interlaced (Figure 6): embedding and head time-share every device with no bubble of their own",
          "[schedule]") {
    for (int p : {2, 4})
        for (int m = 4; m <= 8; ++m) {
            INFO("p = " << p << ", m = " << m);
            const schedule s = interlaced(p, m);
            CHECK(validation_error(s).empty());
            check_satisfies(s, interlaced_constraints());
            // every device runs the embedding twice per micro-batch: forward at stage 0, and
            // again as the LM head at stage p + 1
            for (const auto& o : s.device_order) {
                CHECK(std::count_if(o.begin(), o.end(), [](const block& b) { return b.stage == 0; }) == 2 * m);
                CHECK(std::count_if(o.begin(), o.end(), [&](const block& b) { return b.stage == p + 1; }) == 2 * m);
            }
            // With uniform costs the SPMD blocks run when every device is free, so the only
            // bubble left is the 1F1B warm-up and cool-down of the p pipeline stages,
            // (p - 1)(f + b) per device: the steady state has none (the paper's "stable phase
            // with zero bubbles"). Each device works 3 m (f + b): embedding, its stage, head.
            const simulation r = simulate(s);
            for (double busy : r.busy) CHECK(busy == 3 * m * 2);
            for (double idle : r.idle) CHECK(idle == (p - 1) * 2);
            CHECK(r.makespan == (3 * m + p - 1) * 2);
            // with backward = 2 x forward the list scheduler leaves a unit of bubble per
            // micro-batch (a search could remove it); the schedule stays valid
            const simulation slow = simulate(interlaced(p, m, 1, backward_twice), backward_twice);
            for (double idle : slow.idle) CHECK(idle >= (p - 1) * 3);
        }
}

TEST_CASE("from_constraints reproduces every template from the template's constraints", "[schedule]") {
    const std::vector<schedule_spec> specs = {gpipe_spec(4, 8),          one_f_one_b_spec(4, 6),
                                              interleaved_spec(4, 2, 8), interleaved_spec(2, 3, 6),
                                              three_f_one_b_spec(4, 8), interlaced_spec(4, 8),
                                              interlaced_spec(2, 4, 2)};
    for (const schedule_spec& spec : specs) {
        INFO(spec.name);
        const schedule built = from_constraints(spec.shape, spec.constraints, spec.name);
        CHECK(built.device_order == from_constraints(spec).device_order);
        check_satisfies(built, spec.constraints);
    }
    // constraints that fix the whole order give the same order under any costs
    CHECK(from_constraints(gpipe_spec(4, 8), backward_twice).device_order == classic_gpipe(4, 8));
    CHECK(from_constraints(one_f_one_b_spec(4, 8), backward_twice).device_order == classic_one_f_one_b(4, 8));
    CHECK(from_constraints(interleaved_spec(4, 2, 8), cost_model{.forward = 1, .backward = 3, .latency = 0.5})
              .device_order == classic_interleaved(4, 2, 8));
    // the paper's Table 4 written out by hand is the same 1F1B
    using namespace var;
    const schedule by_hand = from_constraints(pipeline_shape::linear(4, 8),
                                              {before{forward(micro), forward(micro + 1)},
                                               before{backward(micro), backward(micro + 1)},
                                               before{forward(micro + stages - stage - 1).or_last(), backward(micro)},
                                               before{backward(micro), forward(micro + stages - stage)}},
                                              "Table 4");
    CHECK(by_hand.device_order == classic_one_f_one_b(4, 8));
}

TEST_CASE("GPipe, 1F1B and interleaved 1F1B, written out directly, are what their constraints give", "[schedule]") {
    const cost_model slow_messages{.forward = 1, .backward = 3, .latency = 0.5};
    for (int p = 1; p <= 5; ++p)
        for (int m = 1; m <= 10; ++m) {
            INFO("p = " << p << ", m = " << m);
            const schedule g = gpipe(p, m), o = one_f_one_b(p, m);
            CHECK(validation_error(g).empty());
            CHECK(validation_error(o).empty());
            CHECK(g.device_order == from_constraints(gpipe_spec(p, m), slow_messages).device_order);
            CHECK(o.device_order == from_constraints(one_f_one_b_spec(p, m), slow_messages).device_order);
            if (m % p != 0) continue;
            for (int v = 1; v <= 3; ++v) {
                INFO("v = " << v);
                const schedule i = interleaved_one_f_one_b(p, v, m);
                const schedule built = from_constraints(interleaved_spec(p, v, m));
                CHECK(validation_error(i).empty());
                CHECK(i.device_order == built.device_order);
                CHECK(i.name == built.name);
                CHECK(i.device_order == from_constraints(interleaved_spec(p, v, m), slow_messages).device_order);
            }
        }
}

TEST_CASE("simulate's makespan alone, without validation, is the full simulation's", "[schedule]") {
    std::mt19937 rng(3);
    std::uniform_real_distribution<double> time(0.5, 2.0);
    std::vector<schedule> schedules;
    for (int p = 1; p <= 4; ++p)
        for (int m : {1, 4, 6, 8}) {
            schedules.push_back(gpipe(p, m));
            schedules.push_back(one_f_one_b(p, m));
            if (m % p == 0) schedules.push_back(interleaved_one_f_one_b(p, 3, m));
            schedules.push_back(three_f_one_b(p, m));
            schedules.push_back(interlaced(p, m, 2));  // stages on several devices
        }
    for (const schedule& s : schedules) {
        INFO(to_string(s));
        cost_model costs{.latency = time(rng)};
        for (int st = 0; st < s.shape.stages; ++st) {
            costs.forward_per_stage.push_back(time(rng));
            costs.backward_per_stage.push_back(time(rng));
        }
        const simulation full = simulate(s, costs);
        const simulation fast = simulate(s, costs, {.validated = true, .makespan_only = true});
        CHECK(fast.makespan == full.makespan);
        CHECK(fast.blocks.empty());
        CHECK(simulate(s, costs, {.validated = true}).blocks.size() == full.blocks.size());
    }
}

TEST_CASE("a block's output may be ready before it ends: its readers start then, its device stays busy", "[schedule]") {
    // GPipe over 2 stages, 1 micro-batch: F(s0) F(s1) B(s1) B(s0). Each backward hands its
    // input's gradient on after half of its time (the weights' gradients come after).
    cost_model costs{.forward = 1, .backward = 2};
    costs.ready = [](const block& b) { return is_backward(b) ? 1.0 : 5.0; };  // at most the duration
    const simulation r = simulate(gpipe(2, 1), costs);
    CHECK(r.at(forward_block(1, 0)).start == 1.0);   // F(s0)'s output ready at its end (5 > 1)
    CHECK(r.at(backward_block(1, 0)).start == 2.0);
    CHECK(r.at(backward_block(0, 0)).start == 3.0);  // B(s1) ready one unit after its start
    CHECK(r.makespan == 5.0);
    CHECK(r.busy[1] == 3.0);                         // stage 1 still computes all of B(s1)
    CHECK(simulate(gpipe(2, 1), costs, {.validated = true, .makespan_only = true}).makespan == r.makespan);
    CHECK(simulate(gpipe(2, 1), cost_model{.forward = 1, .backward = 2}).makespan == 6.0);
}

TEST_CASE("from_constraints with no constraints is a greedy, valid schedule", "[schedule]") {
    for (const auto& shape : {pipeline_shape::linear(4, 8), pipeline_shape::linear(3, 5, 2),
                              pipeline_shape::interleaved(2, 2, 4), pipeline_shape::interlaced(3, 5)}) {
        const schedule s = from_constraints(shape, {}, "free");
        CHECK(validation_error(s).empty());
        CHECK_NOTHROW(simulate(s));
    }
    // with latency, the greedy still finishes; every block waits for its messages
    const schedule s = from_constraints(pipeline_shape::linear(2, 4), {}, "free", cost_model{.latency = 0.5});
    const simulation r = simulate(s, cost_model{.latency = 0.5});
    CHECK(r.at(forward_block(1, 0)).start == 1.5);
    CHECK(r.at(forward_block(1, 0)).end == 2.5);
}

TEST_CASE("constraints spell themselves as written", "[schedule]") {
    using namespace var;
    CHECK(to_string(before{forward(micro + stages - stage - 1), backward(micro)}) ==
          "before{forward(micro + stages - stage - 1), backward(micro)}");
    CHECK(to_string(before{forward(micro + 2, 1), forward(micro, 2).on_stage(stage + 1).or_last()}) ==
          "before{forward(micro + 2, 1), forward(micro, 2).on_stage(stage + 1).or_last()}");
    CHECK(to_string(interleaved_constraints(2)[2]) ==
          "before{forward(position + stages + devices - 2*device - 2).or_last(), backward(position), each_device, {}, "
          "by_micro_group}");
    CHECK(to_string(before{backward(micro), forward(micro + 1), each_stage, within(stage, 1, stages - 2)}) ==
          "before{backward(micro), forward(micro + 1), each_stage, within(stage, 1, stages - 2)}");
    // a family expands to the pairs whose blocks exist
    const auto pairs = expand(before{forward(micro + stages - stage - 1), backward(micro)}, pipeline_shape::linear(2, 3));
    // stage 0: F(1) < B(0), F(2) < B(1); stage 1: F(0) < B(0), F(1) < B(1), F(2) < B(2)
    CHECK(pairs.size() == 5);
    CHECK(pairs.front().first == forward_block(0, 1));
    CHECK(pairs.front().then == backward_block(0, 0));
}

// ---- device programs ----------------------------------------------------------------------------

TEST_CASE("device programs put each send after its producer and each receive before its consumer", "[schedule]") {
    for (const schedule& s : {one_f_one_b(2, 4), interleaved_one_f_one_b(2, 2, 4), three_f_one_b(2, 4), interlaced(2, 4)}) {
        INFO(s.name);
        const auto programs = device_programs(s);
        REQUIRE(programs.size() == static_cast<std::size_t>(s.shape.devices));
        std::map<std::pair<int, int>, std::vector<transfer>> sent, received;
        for (int d = 0; d < s.shape.devices; ++d) {
            const auto& program = programs[static_cast<std::size_t>(d)];
            std::vector<block> computed;
            for (std::size_t i = 0; i < program.size(); ++i) {
                const step& st = program[i];
                if (st.kind == step_kind::compute) {
                    computed.push_back(st.target);
                } else if (st.kind == step_kind::send) {
                    CHECK(st.message.from == d);
                    CHECK(std::find(computed.begin(), computed.end(), st.message.producer) != computed.end());
                    sent[{st.message.from, st.message.to}].push_back(st.message);
                } else {
                    CHECK(st.message.to == d);
                    CHECK(std::find(computed.begin(), computed.end(), st.message.consumer) == computed.end());
                    received[{st.message.from, st.message.to}].push_back(st.message);
                }
            }
            CHECK(computed == s.device_order[static_cast<std::size_t>(d)]);
        }
        // every channel delivers in the order it is read: FIFO channels suffice
        CHECK(sent == received);
        std::size_t messages = 0;
        for (const auto& [channel, list] : sent) messages += list.size();
        CHECK(messages == all_transfers(s.shape).size());
    }
    const auto one = device_programs(one_f_one_b(2, 4));
    CHECK(to_string(one[0][0]) == "compute F(s0,m0)");
    CHECK(to_string(one[0][1]) == "send F(s0,m0) -> F(s1,m0) to device 1");
    CHECK(to_string(one[1][0]) == "receive F(s0,m0) -> F(s1,m0) from device 0");
}

// ---- exports -------------------------------------------------------------------------------------

namespace {

// The tags of an XML document: balanced, properly nested. Returns the start tags in order.
std::vector<std::string> xml_start_tags(const std::string& xml) {
    std::vector<std::string> open, starts;
    std::size_t i = 0;
    while ((i = xml.find('<', i)) != std::string::npos) {
        const std::size_t end = xml.find('>', i);
        REQUIRE(end != std::string::npos);
        const std::string tag = xml.substr(i + 1, end - i - 1);
        i = end + 1;
        REQUIRE(!tag.empty());
        if (tag.front() == '/') {
            REQUIRE(!open.empty());
            CHECK(open.back() == tag.substr(1));
            open.pop_back();
            continue;
        }
        const std::string name = tag.substr(0, tag.find_first_of(" /"));
        starts.push_back(tag);
        if (tag.back() != '/') open.push_back(name);
    }
    CHECK(open.empty());
    return starts;
}

std::string attribute(const std::string& tag, const std::string& name) {
    const std::string key = " " + name + "=\"";
    const std::size_t at = tag.find(key);
    if (at == std::string::npos) return {};
    const std::size_t from = at + key.size();
    return tag.substr(from, tag.find('"', from) - from);
}

}  // namespace

TEST_CASE("the SVG timeline: one rectangle per block and device, at its time", "[schedule]") {
    const simulation r = simulate(gpipe(2, 4), backward_twice);  // F = 1, B = 2: makespan 15
    const std::string svg = svg_timeline(r);
    const auto tags = xml_start_tags(svg);
    REQUIRE(!tags.empty());
    CHECK(tags.front().rfind("svg ", 0) == 0);
    std::map<std::string, std::string> rects;  // "F(s1,m0)@1" -> tag
    for (const std::string& t : tags)
        if (t.rfind("rect ", 0) == 0 && attribute(t, "class") == "block")
            rects[attribute(t, "data-block") + "@" + attribute(t, "data-device")] = t;
    CHECK(rects.size() == 16);
    // x = left (80) + start * 40 px, width = duration * 40 px, y = top (30) + device * (28 + 6)
    const std::string f = rects["F(s1,m0)@1"];
    CHECK(attribute(f, "x") == "120");
    CHECK(attribute(f, "width") == "40");
    CHECK(attribute(f, "y") == "64");
    // B(s0,m3) runs [13, 15) on device 0
    const std::string b = rects["B(s0,m3)@0"];
    CHECK(attribute(b, "x") == "600");
    CHECK(attribute(b, "width") == "80");
    CHECK(attribute(b, "y") == "30");
    CHECK(attribute(b, "fill") != attribute(f, "fill"));
    // an axis with ticks 0 .. 15
    CHECK(std::count_if(tags.begin(), tags.end(), [](const std::string& t) { return attribute(t, "class") == "tick"; }) == 16);
    CHECK(attribute(tags.front(), "width") == "700");  // 80 + 15 * 40 + 20

    // SPMD blocks get one rectangle on each of their devices
    const std::string wide = svg_timeline(simulate(interlaced(2, 4)));
    std::size_t blocks = 0;
    for (const std::string& t : xml_start_tags(wide)) blocks += attribute(t, "class") == "block";
    CHECK(blocks == interlaced(2, 4).device_order[0].size() * 2);
}

TEST_CASE("the Chrome trace: one complete event per block and device", "[schedule]") {
    const schedule s = interlaced(2, 4);
    const simulation r = simulate(s, backward_twice);
    const auto trace = nlohmann::json::parse(chrome_trace_json(r));
    REQUIRE(trace.contains("traceEvents"));
    const auto& events = trace["traceEvents"];
    std::size_t complete = 0, metadata = 0;
    std::set<int> threads;
    for (const auto& e : events) {
        REQUIRE(e.contains("ph"));
        if (e["ph"] == "M") {
            ++metadata;
            continue;
        }
        CHECK(e["ph"] == "X");
        for (const char* field : {"name", "cat", "ts", "dur", "pid", "tid", "args"}) CHECK(e.contains(field));
        threads.insert(e["tid"].get<int>());
        ++complete;
        const block b{e["cat"] == "forward" ? pass_kind::forward : pass_kind::backward, e["args"]["stage"].get<int>(),
                      e["args"]["micro"].get<int>(), e["args"]["round"].get<int>()};
        CHECK(e["name"] == to_string(b));
        CHECK(e["ts"].get<double>() == r.at(b).start * 1000);
        CHECK(e["dur"].get<double>() == (is_forward(b) ? 1000 : 2000));
    }
    std::size_t expected = 0;
    for (const auto& o : s.device_order) expected += o.size();
    CHECK(complete == expected);
    CHECK(metadata == 1 + 2);  // the process and one thread per device
    CHECK(threads == std::set<int>{0, 1});
}
