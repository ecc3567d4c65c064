// Pipeline schedules on real processes: every rank of an MPI job (ctest runs 4) runs its
// stage's blocks in the schedule's order, sending activations and gradients between stages
// over MPI, and checks against one-device training that it computes itself: losses and
// gradient norms at every step to 1e-9 (float64). Exit code 0 only if every check passed.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <loom/loom.hpp>
#include <loom/partition/pipeline_order.hpp>
#include <loom/plan/pipeline.hpp>
#include <loom/runtime/comm/mpi.hpp>
#include <loom/schedule/templates.hpp>

#include "support/plan_equivalence.hpp"

using namespace loom;

namespace {

int check(comm::communicator& comm, const models::gpt_config& c, const plan::even_pipeline_options& o,
          const schedule::schedule& s) {
    auto model = models::gpt(c);
    const auto pp = plan::resolve_pipeline(plan::even_pipeline(model.ir(), o), model.ir());
    auto pg = partition::apply_plan(model.ir(), pp.plan, partition::pipeline_apply_options(pp));
    partition::order_by_schedule(pg, pp, s);
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
    const bool ok = worst_loss <= 1e-9 && worst_norm <= 1e-9;
    std::printf("rank %d: %-48s loss %.2e  grad norm %.2e  %s\n", comm.rank(), (s.name + ", " + pp.plan.name).c_str(),
                worst_loss, worst_norm, ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    comm::mpi_environment env(argc, argv);
    comm::mpi_communicator comm;
    const int n = comm.size();
    int failures = 0;
    try {
        const models::gpt_config c{.layers = 2 * n, .hidden = 16, .heads = 4, .vocab = 32, .seq = 8, .batch = 8};
        failures += check(comm, c, {.stages = n, .micro_batches = 8}, schedule::one_f_one_b(n, 8));
        failures += check(comm, c, {.stages = n, .micro_batches = 4}, schedule::gpipe(n, 4));
        failures += check(comm, c, {.stages = n, .micro_batches = 4, .virtual_stages = 2},
                          schedule::interleaved_one_f_one_b(n, 2, 4));
        if (n % 2 == 0)
            failures += check(comm, c,
                              {.stages = n / 2, .micro_batches = 4, .devices_per_stage = 2, .inner = plan::presets::megatron(2)},
                              partition::spread_over_groups(schedule::one_f_one_b(n / 2, 4), 2));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", comm.rank(), e.what());
        return 1;
    }
    return failures == 0 ? 0 : 1;
}
