// Data-parallel GPT training over NCCL, one GPU per MPI rank, against one GPU: every rank's
// loss and gradient norm follow cuda::trainer's within float tolerance, and every rank
// reports the same values. CI runs it on one rank (the path of N ranks is the same code:
// buckets, the norm's sum over the ranks, ZeRO-1's in-place gathers); on N GPUs run it
// with -np N. With no GPU every rank exits 77 and ctest reports the test skipped.
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <loom/models/gpt.hpp>
#include <loom/partition/apply.hpp>
#include <loom/plan/presets.hpp>
#include <loom/runtime/comm/mpi.hpp>
#include <loom/train/cuda/distributed_trainer.hpp>
#include <loom/runtime/cuda/nccl_communicator.hpp>
#include <loom/train/cuda/trainer.hpp>
#include <loom/runtime/cuda_gate.hpp>

#include "../../support/gpt_batch.hpp"

namespace {

using namespace loom;

int failures = 0;

void expect(bool ok, const std::string& what, int rank) {
    if (!ok) {
        ++failures;
        std::fprintf(stderr, "rank %d: FAILED: %s\n", rank, what.c_str());
    }
}

void check_plan(cuda::nccl_communicator& c, const plan::plan_spec& spec, const models::gpt_config& config) {
    constexpr int steps = 5;
    train::trainer_options options;
    options.schedule.peak = 1e-3;
    options.clip_norm = 1.0;
    options.init_seed = 5;
    std::vector<std::vector<std::int32_t>> keep;
    std::vector<train::input_feed> feeds;
    for (int s = 0; s < steps; ++s) feeds.push_back(testing::gpt_batch(config, s, keep));

    std::vector<train::step_result> reference;
    {
        cuda::trainer one(models::gpt(config).training_graph(), options, precision::f32, c.device());
        for (const auto& f : feeds) reference.push_back(one.step(f));
    }
    const graph training = models::gpt(config).training_graph();
    const auto pg = partition::apply_plan(training, plan::resolve(spec, training));
    cuda::distributed_trainer<float> rank(pg, c, options, {.device = c.device(), .bucket_bytes = std::int64_t{64} << 10});
    for (int s = 0; s < steps; ++s) {
        const auto r = rank.step(feeds[static_cast<std::size_t>(s)]);
        const std::string at = spec.name + " step " + std::to_string(s);
        expect(std::fabs(r.loss - reference[s].loss) <= 1e-4 * reference[s].loss, at + ": loss as on one GPU", c.rank());
        expect(std::fabs(r.grad_norm - reference[s].grad_norm) <= 1e-4 * reference[s].grad_norm,
               at + ": gradient norm as on one GPU", c.rank());
        double values[2] = {r.loss, r.grad_norm}, root[2] = {r.loss, r.grad_norm};
        MPI_Bcast(root, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        expect(values[0] == root[0] && values[1] == root[1], at + ": every rank reports rank 0's values", c.rank());
    }
}

}  // namespace

int main(int argc, char** argv) {
    comm::mpi_environment mpi(argc, argv);
    if (cuda_device_count() == 0) {
        std::puts("no CUDA device on this machine: the NCCL training test is skipped (exit 77)");
        return 77;
    }
    try {
        cuda::nccl_communicator c;
        // The batch divides by 1, 2, 4 and 8 ranks.
        const models::gpt_config config{.layers = 2, .hidden = 128, .heads = 2, .vocab = 96, .seq = 64, .batch = 8};
        check_plan(c, plan::presets::data_parallel(c.size()), config);
        check_plan(c, plan::presets::zero(1, c.size()), config);
        c.synchronize();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", mpi.rank(), e.what());
        return 1;
    }
    if (failures == 0) std::printf("rank %d: NCCL data-parallel training: all checks passed\n", mpi.rank());
    return failures == 0 ? 0 : 1;
}
