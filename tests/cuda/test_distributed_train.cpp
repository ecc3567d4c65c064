// Partitioned plans on the GPU equal one GPU: the same GPT, seeds and data trained by
// cuda::distributed_trainer on 2 and 4 ranks (threads of this process sharing the GPU,
// talking through a staged in-process communicator) follow cuda::trainer's losses and
// gradient norms and end with the same parameters. Data parallelism with one bucket per
// gradient and with everything in one bucket, ZeRO-1 to 3, Megatron and sequence
// parallelism (vocabulary-parallel cross-entropy), pipelines, and bf16 mixed precision.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <loom/models/gpt.hpp>
#include <loom/partition/apply.hpp>
#include <loom/plan/presets.hpp>
#include <loom/runtime/comm/in_process.hpp>
#include <loom/train/cuda/distributed_trainer.hpp>
#include <loom/train/cuda/trainer.hpp>

#include "../support/gpt_batch.hpp"
#include "support.hpp"

using namespace loom;
namespace presets = loom::plan::presets;

namespace {

// Head dim 64; the batch divides by 4 ranks.
models::gpt_config small_gpt() { return {.layers = 2, .hidden = 128, .heads = 2, .vocab = 96, .seq = 64, .batch = 4}; }

train::trainer_options options() {
    train::trainer_options o;
    o.schedule.peak = 1e-3;
    o.clip_norm = 1.0;
    o.init_seed = 11;
    return o;
}

struct outcome {
    std::vector<std::vector<train::step_result>> per_rank;
    std::vector<std::vector<float>> parameters;  // gathered, in the logical graph's order
};

template <class T>
outcome run_plan(const partition::partitioned_graph& pg, int steps, std::int64_t bucket_bytes) {
    const auto c = small_gpt();
    std::vector<std::vector<std::int32_t>> keep;
    std::vector<train::input_feed> feeds;
    for (int s = 0; s < steps; ++s) feeds.push_back(testing::gpt_batch(c, s, keep));
    outcome o;
    o.per_rank.resize(static_cast<std::size_t>(pg.world));
    o.parameters.resize(pg.ir().parameters.size());
    comm::run_ranks(pg.world, [&](comm::communicator& host) {
        cuda::staged_communicator c(host);
        cuda::distributed_trainer<T> rank(pg, c, options(), {.device = 0, .bucket_bytes = bucket_bytes});
        for (const auto& f : feeds) o.per_rank[static_cast<std::size_t>(host.rank())].push_back(rank.step(f));
        for (std::size_t i = 0; i < pg.ir().parameters.size(); ++i) {
            auto full = rank.gather_parameter(pg.ir().tensor(pg.ir().parameters[i]).name);
            if (host.rank() == 0) o.parameters[i] = std::move(full);
        }
    });
    return o;
}

// Loss, norm and parameters against one GPU. `tolerance` bounds the relative difference of
// the loss and the norm; parameters may differ by AdamW's rounding amplification (a
// gradient that is zero in exact arithmetic, the key bias's, is rounding noise that AdamW
// turns into steps of up to lr each), so they are held to `steps` x lr plus the tolerance.
template <class T>
void check_against_one_gpu(const partition::partitioned_graph& pg, const std::string& name, std::int64_t bucket_bytes,
                           double tolerance) {
    constexpr int steps = 6;
    const auto c = small_gpt();
    cuda::trainer one(models::gpt(c).training_graph(), options(), std::is_same_v<T, float> ? precision::f32 : precision::bf16);
    std::vector<std::vector<std::int32_t>> keep;
    std::vector<train::step_result> reference;
    for (int s = 0; s < steps; ++s) reference.push_back(one.step(testing::gpt_batch(c, s, keep)));

    const outcome got = run_plan<T>(pg, steps, bucket_bytes);
    INFO(name << ", buckets of " << bucket_bytes << " bytes");
    for (const auto& rank : got.per_rank) {
        REQUIRE(rank.size() == reference.size());
        for (int s = 0; s < steps; ++s) {
            INFO("step " << s << ": loss " << rank[s].loss << " vs " << reference[s].loss << ", norm " << rank[s].grad_norm
                         << " vs " << reference[s].grad_norm);
            CHECK(std::fabs(rank[s].loss - reference[s].loss) <= tolerance * reference[s].loss);
            CHECK(std::fabs(rank[s].grad_norm - reference[s].grad_norm) <= tolerance * reference[s].grad_norm);
            // Every rank reports the same loss and norm, bitwise.
            CHECK(rank[s].loss == got.per_rank[0][s].loss);
            CHECK(rank[s].grad_norm == got.per_rank[0][s].grad_norm);
        }
    }
    const graph& logical = one.ir();
    for (std::size_t i = 0; i < logical.parameters.size(); ++i) {
        const std::string name = logical.tensor(logical.parameters[i]).name;
        const auto want = one.parameter(name);
        const auto& have = got.parameters[i];
        REQUIRE(have.size() == want.size());
        double worst = 0;
        for (std::size_t k = 0; k < want.size(); ++k) worst = std::max(worst, std::fabs(double(have[k]) - double(want[k])));
        INFO("parameter " << name << ": worst difference " << worst);
        CHECK(worst <= steps * options().schedule.peak + tolerance);
    }
}

template <class T>
void check_against_one_gpu(const plan::plan_spec& spec, std::int64_t bucket_bytes, double tolerance) {
    const graph training = models::gpt(small_gpt()).training_graph();
    check_against_one_gpu<T>(partition::apply_plan(training, plan::resolve(spec, training)), spec.name, bucket_bytes,
                             tolerance);
}

}  // namespace

TEST_CASE("data parallelism on 2 and 4 GPU ranks equals one GPU, whatever the bucket size", "[cuda][distributed]") {
    for (int ranks : {2, 4})
        for (std::int64_t bucket : {std::int64_t{1}, std::int64_t{64} << 10, std::int64_t{1} << 30})
            check_against_one_gpu<float>(presets::data_parallel(ranks), bucket, 1e-4);
}

TEST_CASE("ZeRO-1 on 2 and 4 GPU ranks equals one GPU", "[cuda][distributed][zero]") {
    for (int ranks : {2, 4}) check_against_one_gpu<float>(presets::zero(1, ranks), std::int64_t{64} << 10, 1e-4);
}

TEST_CASE("tensor and sequence parallelism, alone and with data parallelism, equal one GPU",
          "[cuda][distributed][tensor]") {
    check_against_one_gpu<float>(presets::megatron(2), std::int64_t{64} << 10, 1e-4);
    check_against_one_gpu<float>(presets::sequence_parallel(2), std::int64_t{64} << 10, 1e-4);
    check_against_one_gpu<float>(presets::megatron(2, 2), std::int64_t{64} << 10, 1e-4);
}

TEST_CASE("pipelines (1F1B, GPipe, with tensor and data parallelism) equal one GPU", "[cuda][distributed][pipeline]") {
    // Pipelines alone and around data and tensor parallelism, applied as the pipeline tests on
    // the host apply them: device programs ordered by the schedule, activations sent between
    // stages.
    const graph forward = models::gpt(small_gpt()).ir();
    for (const plan::plan_spec& p : {presets::pipeline(2, 4, {plan::schedule_kind::one_f_one_b}),
                                     presets::pipeline(2, 2, {plan::schedule_kind::gpipe}, presets::data_parallel(2)),
                                     presets::pipeline(2, 2, {plan::schedule_kind::one_f_one_b}, presets::megatron(2))})
        check_against_one_gpu<float>(partition::apply_plan(forward, p), p.name, std::int64_t{64} << 10, 1e-4);
}

TEST_CASE("ZeRO-2 and ZeRO-3 on 2 GPU ranks equal one GPU", "[cuda][distributed][zero]") {
    check_against_one_gpu<float>(presets::zero(2, 2), std::int64_t{64} << 10, 1e-4);
    check_against_one_gpu<float>(presets::zero(3, 2), std::int64_t{64} << 10, 1e-4);
}

TEST_CASE("bf16 data parallelism and ZeRO-1 follow one bf16 GPU", "[cuda][distributed][bf16]") {
    // bf16 gradients summed across ranks round differently from one device's: within 2%.
    check_against_one_gpu<loom::bfloat16>(presets::data_parallel(2), std::int64_t{64} << 10, 2e-2);
    check_against_one_gpu<loom::bfloat16>(presets::zero(1, 2), std::int64_t{64} << 10, 2e-2);
}

TEST_CASE("the GPU ranks keep every gradient all-reduce in a bucket and refuse a mismatched world",
          "[cuda][distributed]") {
    const auto c = small_gpt();
    const graph training = models::gpt(c).training_graph();
    const auto pg = partition::apply_plan(training, plan::resolve(presets::data_parallel(2), training));
    // Catch's assertions are not thread-safe: the ranks record, the test thread checks.
    std::vector<std::size_t> bucketed(2, 0);
    comm::run_ranks(2, [&](comm::communicator& host) {
        cuda::staged_communicator staged(host);
        cuda::distributed_trainer<float> rank(pg, staged, options(), {.bucket_bytes = std::int64_t{1} << 30});
        for (const auto& b : rank.buckets().buckets) bucketed[static_cast<std::size_t>(host.rank())] += b.gradients.size();
    });
    // Every gradient, the tied embedding's too: its two contributions add on each rank first
    // (as the host's gradient buckets, test_gradient_buckets.cpp).
    for (std::size_t n : bucketed) CHECK(n == training.gradients.size());
    std::string refused;
    comm::run_ranks(1, [&](comm::communicator& host) {
        cuda::staged_communicator staged(host);
        try {
            cuda::distributed_trainer<float> rank(pg, staged, options());
        } catch (const usage_error& e) {
            refused = e.what();
        }
    });
    CHECK_THAT(refused, Catch::Contains("launch as many ranks as the plan has devices"));
}
