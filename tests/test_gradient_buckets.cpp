// Gradient buckets (runtime/gradient_buckets.hpp): on the device programs of data-parallel,
// tensor x data-parallel and ZeRO plans, every gradient all-reduce lands in exactly one
// bucket, a bucket never spans another transfer or another group, it closes once it holds
// the bucket size, and every member of a group forms the same buckets in the same order
// (the communicator laws need it: a mismatch would hang the job).
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <string>
#include <vector>

#include <loom/models/gpt.hpp>
#include <loom/partition/apply.hpp>
#include <loom/plan/presets.hpp>
#include <loom/runtime/compile.hpp>
#include <loom/runtime/gradient_buckets.hpp>

using namespace loom;
namespace presets = loom::plan::presets;

namespace {

struct rank_programs {
    partition::partitioned_graph plan;
    std::vector<program> programs;
};

rank_programs compile_ranks(const plan::plan_spec& spec, precision prec) {
    const models::gpt_config config{.layers = 2, .hidden = 32, .heads = 4, .vocab = 64, .seq = 16, .batch = 8};
    auto model = models::gpt(config);
    const graph training = std::move(model).training_graph();
    rank_programs out{partition::apply_plan(training, plan::resolve(spec, training)), {}};
    for (int r = 0; r < out.plan.world; ++r) {
        const auto& part = out.plan.devices[static_cast<std::size_t>(r)];
        compile_options options{.prec = prec, .outputs = {part.loss}, .keep_every_node = true};
        out.programs.push_back(compile_program(part.ir(), options));
    }
    return out;
}

bool is_gradient_all_reduce(const partition::transfer& tr) {
    return tr.kind == partition::transfer_kind::all_reduce && tr.backward && tr.consumer == no_id;
}

// The transfer ids of each bucket, per group: what the members must agree on.
using bucket_ids = std::map<std::vector<int>, std::vector<std::vector<std::int64_t>>>;

bucket_ids check_rank(const rank_programs& rp, int rank, std::int64_t bucket_bytes) {
    const program& p = rp.programs[static_cast<std::size_t>(rank)];
    const auto buckets = plan_gradient_buckets(p, rp.plan, bucket_bytes);
    REQUIRE(buckets.bucket_of_step.size() == p.steps.size());
    bucket_ids ids;
    std::set<std::size_t> seen;
    for (std::size_t b = 0; b < buckets.buckets.size(); ++b) {
        const gradient_bucket& bucket = buckets.buckets[b];
        REQUIRE(!bucket.steps.empty());
        REQUIRE(bucket.steps.size() == bucket.gradients.size());
        std::int64_t bytes = 0;
        std::vector<std::int64_t> members;
        for (std::size_t k = 0; k < bucket.steps.size(); ++k) {
            const std::size_t s = bucket.steps[k];
            const partition::transfer* tr = transfer_of_step(p, rp.plan, s);
            REQUIRE(tr);
            CHECK(is_gradient_all_reduce(*tr));
            CHECK(tr->group == bucket.group);
            CHECK(buckets.bucket_of_step[s] == static_cast<std::int64_t>(b));
            CHECK(seen.insert(s).second);
            CHECK(p.buffers[static_cast<std::size_t>(bucket.gradients[k])].where == buffer::place::bound);
            if (k > 0) CHECK(bucket.steps[k - 1] < s);
            bytes += p.bytes_of(bucket.gradients[k]);
            // The bucket closes as soon as it is full: never earlier than its last member.
            if (k + 1 < bucket.steps.size()) CHECK(bytes < bucket_bytes);
            CHECK(buckets.starts_after(s) == (k + 1 == bucket.steps.size()));
            members.push_back(p.source->at(p.steps[s].node).attrs.get<std::int64_t>("transfer"));
        }
        CHECK(bytes == bucket.bytes);
        // No other transfer runs between a bucket's first and last member.
        for (std::size_t s = bucket.steps.front(); s <= bucket.steps.back(); ++s)
            if (transfer_of_step(p, rp.plan, s)) CHECK(buckets.bucket_of_step[s] == static_cast<std::int64_t>(b));
        ids[bucket.group].push_back(members);
    }
    // Every gradient all-reduce this rank takes part in is in a bucket.
    for (std::size_t s = 0; s < p.steps.size(); ++s) {
        const partition::transfer* tr = transfer_of_step(p, rp.plan, s);
        if (tr && is_gradient_all_reduce(*tr)) CHECK(seen.count(s) == 1);
    }
    return ids;
}

void check_plan(const plan::plan_spec& spec, precision prec, std::int64_t bucket_bytes) {
    INFO(spec.name << ", " << to_string(prec) << ", buckets of " << bucket_bytes << " bytes");
    const auto rp = compile_ranks(spec, prec);
    std::vector<bucket_ids> per_rank;
    for (int r = 0; r < rp.plan.world; ++r) per_rank.push_back(check_rank(rp, r, bucket_bytes));
    // Members of a group form the same buckets, in the same order.
    for (int r = 0; r < rp.plan.world; ++r)
        for (const auto& [group, buckets] : per_rank[static_cast<std::size_t>(r)])
            for (int member : group) CHECK(per_rank[static_cast<std::size_t>(member)].at(group) == buckets);
}

}  // namespace

TEST_CASE("gradient buckets: each gradient all-reduce once, full buckets, one group, no transfer inside",
          "[runtime][buckets]") {
    for (precision prec : {precision::f32, precision::bf16})
        for (std::int64_t bytes : {std::int64_t{1}, std::int64_t{4096}, std::int64_t{1} << 30}) {
            check_plan(presets::data_parallel(2), prec, bytes);
            check_plan(presets::data_parallel(4), prec, bytes);
            check_plan(presets::megatron(2, 2), prec, bytes);
            check_plan(presets::zero(1, 4), prec, bytes);
        }
}

TEST_CASE("gradient buckets: data parallelism reduces every gradient, in as few buckets as the size allows",
          "[runtime][buckets]") {
    const auto rp = compile_ranks(presets::data_parallel(2), precision::f32);
    const program& p = rp.programs[0];
    const graph& g = rp.plan.devices[0].ir();
    // Every gradient is all-reduced straight into its storage, the tied embedding's too: its
    // two contributions are added on each device first (partial sums add summand by summand).
    std::int64_t gradient_bytes = 0;
    std::size_t reduced = 0;
    for (const auto& s : rp.plan.devices[0].gradients)
        for (const auto& step : p.steps) {
            const node& n = g.at(step.node);
            if (n.op->communication && n.outputs.size() == 1 && n.outputs[0] == s.local) {
                gradient_bytes += p.bytes_of(s.local);
                ++reduced;
            }
        }
    CHECK(reduced == g.gradients.size());

    const auto one = plan_gradient_buckets(p, rp.plan, std::int64_t{1} << 30);
    // Nothing else is reduced in the backward, so one bucket holds every gradient.
    REQUIRE(one.buckets.size() == 1);
    std::int64_t bytes = 0;
    std::size_t gradients = 0;
    for (const auto& b : one.buckets) {
        bytes += b.bytes;
        gradients += b.gradients.size();
        CHECK(b.group == std::vector<int>{0, 1});
    }
    CHECK(bytes == gradient_bytes);
    CHECK(gradients == reduced);

    const auto each = plan_gradient_buckets(p, rp.plan, 1);
    CHECK(each.buckets.size() == reduced);  // a byte fills a bucket: one per gradient

    const auto some = plan_gradient_buckets(p, rp.plan, gradient_bytes / 4);
    CHECK(some.buckets.size() > 2);
    CHECK(some.buckets.size() < reduced);
    CHECK_THROWS_WITH(plan_gradient_buckets(p, rp.plan, 0), Catch::Contains("positive size"));
}
