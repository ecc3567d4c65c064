// Pipeline schedules on real processes: every rank of an MPI job (ctest runs 4) runs its
// stage's blocks in the schedule's order, sending activations and gradients between stages
// over MPI (GPipe, 1F1B, interleaved, 1F1B of Megatron pairs, ZeRO-1 and ZeRO-3 with
// recompute inside data-parallel pairs, the interlaced pipeline of single ranks and of
// data-parallel pairs, and 3F1B on the Evoformer), and checks against one-device training that it computes itself:
// losses and gradient norms at every step to 1e-9 (float64). Exit code 0 only if every
// check passed.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <loom/loom.hpp>
#include <loom/models/evoformer.hpp>
#include <loom/plan/presets.hpp>
#include <loom/runtime/comm/mpi.hpp>

#include "support/evoformer.hpp"
#include "support/plan_equivalence.hpp"

using namespace loom;

namespace {

int report(comm::communicator& comm, const std::string& what, double worst_loss, double worst_norm) {
    const bool ok = worst_loss <= 1e-9 && worst_norm <= 1e-9;
    std::printf("rank %d: %-48s loss %.2e  grad norm %.2e  %s\n", comm.rank(), what.c_str(), worst_loss, worst_norm,
                ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}

int check(comm::communicator& comm, const models::gpt_config& c, const plan::plan_spec& p) {
    auto model = models::gpt(c);
    auto pg = partition::apply_plan(model.ir(), p);
    train::trainer<double> single(std::move(model).training_graph(), {});
    train::distributed_trainer<double> mine(pg, comm, {});
    std::vector<std::vector<std::int32_t>> data;
    double worst_loss = 0, worst_norm = 0;
    for (int step = 0; step < 4; ++step) {
        const auto feed = testing::gpt_batch(c, step, data);
        const auto want = single.step(feed);
        const auto got = mine.step(feed);
        worst_loss = std::max(worst_loss, testing::relative(got.loss, want.loss));
        worst_norm = std::max(worst_norm, testing::relative(got.grad_norm, want.grad_norm));
    }
    return report(comm, p.name, worst_loss, worst_norm);
}

// The interlaced pipeline: embedding and LM head split by vocabulary over every rank, the
// layers one stage per rank between them.
plan::plan_spec interlaced_plan(int ranks, int micro_batches) {
    return plan::presets::pipeline(ranks, micro_batches, {plan::schedule_kind::interlaced});
}

// 3F1B: the Evoformer's three recycling rounds forward, then one backward, per micro-batch.
int check_three_f_one_b(comm::communicator& comm, int stages, int micro_batches) {
    const models::evoformer_config c = testing::pipeline_evoformer(stages);
    const auto data = models::evoformer_synthetic_batch(c, 7);
    const train::input_feed feed = testing::evoformer_feed(data);
    auto model = models::evoformer(c);
    const plan::plan_spec p = plan::presets::pipeline(stages, micro_batches, {plan::schedule_kind::three_f_one_b});
    auto pg = partition::apply_plan(model.ir(), p);
    train::trainer<double> single(std::move(model).training_graph(), {});
    train::distributed_trainer<double> mine(pg, comm, {});
    double worst_loss = 0, worst_norm = 0;
    for (int step = 0; step < 3; ++step) {
        const auto want = single.step(feed);
        const auto got = mine.step(feed);
        worst_loss = std::max(worst_loss, testing::relative(got.loss, want.loss));
        worst_norm = std::max(worst_norm, testing::relative(got.grad_norm, want.grad_norm));
    }
    return report(comm, p.name + " on the Evoformer", worst_loss, worst_norm);
}

}  // namespace

int main(int argc, char** argv) {
    comm::mpi_environment env(argc, argv);
    comm::mpi_communicator comm;
    const int n = comm.size();
    int failures = 0;
    try {
        const models::gpt_config c{.layers = 2 * n, .hidden = 16, .heads = 4, .vocab = 32, .seq = 8, .batch = 8};
        using plan::presets::pipeline;
        failures += check(comm, c, pipeline(n, 8, {plan::schedule_kind::one_f_one_b}));
        failures += check(comm, c, pipeline(n, 4, {plan::schedule_kind::gpipe}));
        failures += check(comm, c, pipeline(n, 4, {plan::schedule_kind::interleaved, 2}));
        if (n % 2 == 0)
            failures += check(comm, c, pipeline(n / 2, 4, {plan::schedule_kind::one_f_one_b}, plan::presets::megatron(2)));
        if (n % 2 == 0) {
            // ZeRO inside the stages, sharded over each stage's pair of ranks (MPI subgroups):
            // ZeRO-1 gathers the updated shards among the pair, ZeRO-3 with recompute of the
            // MLPs gathers weights and reduce-scatters gradients within it.
            failures += check(comm, c, pipeline(n / 2, 4, {plan::schedule_kind::one_f_one_b}, plan::presets::zero(1, 2)));
            plan::selector mlp;
            mlp.scope = "*.mlp*";
            plan::plan_spec zero3 = plan::presets::zero(3, 2);
            zero3.then(plan::presets::recompute(mlp));
            failures += check(comm, c, pipeline(n / 2, 4, {plan::schedule_kind::gpipe}, zero3));
            // The interlaced pipeline with data-parallel pairs as its stages.
            failures += check(comm, c, pipeline(n / 2, 4, {plan::schedule_kind::interlaced}, plan::presets::data_parallel(2)));
        }
        failures += check(comm, c, interlaced_plan(n, 4));
        failures += check_three_f_one_b(comm, n, 4);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", comm.rank(), e.what());
        return 1;
    }
    return failures == 0 ? 0 : 1;
}
