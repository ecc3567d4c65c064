// Preset plans on real processes: every rank of an MPI job (ctest runs 4) trains the GPT
// with its part of the plan, talking over MPI, and checks against one-device training
// that it computes itself: losses and gradient norms at every step to 1e-9 (float64), and
// the gathered parameters after 10 steps. Exit code 0 only if every check passed here.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <loom/loom.hpp>
#include <loom/runtime/comm/mpi.hpp>

#include "support/plan_equivalence.hpp"

using namespace loom;
namespace presets = loom::plan::presets;

namespace {

int check_plan(comm::communicator& comm, const plan::plan_spec& spec) {
    const models::gpt_config c{.layers = 2, .hidden = 32, .heads = 8, .vocab = 64, .seq = 16, .batch = 8};
    auto model = models::gpt(c);
    const auto pg = partition::apply_plan(model.ir(), plan::resolve(spec, model.ir()));
    partition::check_deadlock_free(pg);
    train::trainer_options options;
    train::trainer<double> single(std::move(model).training_graph(), options);
    train::distributed_trainer<double> mine(pg, comm, options);
    std::vector<std::vector<std::int32_t>> data;
    int failures = 0;
    double worst_loss = 0, worst_norm = 0, worst_param = 0;
    for (int s = 0; s < 10; ++s) {
        const auto feed = testing::gpt_batch(c, s, data);
        const auto want = single.step(feed);
        const auto got = mine.step(feed);
        worst_loss = std::max(worst_loss, testing::relative(got.loss, want.loss));
        worst_norm = std::max(worst_norm, testing::relative(got.grad_norm, want.grad_norm));
    }
    for (tensor_id p : pg.ir().parameters) {
        const std::string& name = pg.ir().tensor(p).name;
        auto full = mine.gather_parameter(name);
        auto want = single.parameter(name);
        double scale = 1e-2, diff = 0;
        for (std::size_t i = 0; i < want.size(); ++i) {
            scale = std::max(scale, std::abs(want[i]));
            diff = std::max(diff, std::abs(want[i] - full[i]));
        }
        worst_param = std::max(worst_param, diff / scale);
    }
    const bool ok = worst_loss <= 1e-9 && worst_norm <= 1e-9 && worst_param <= 1e-9;
    if (!ok) ++failures;
    std::printf("rank %d: %-40s loss %.2e  grad norm %.2e  parameters %.2e  %s\n", comm.rank(), spec.name.c_str(),
                worst_loss, worst_norm, worst_param, ok ? "ok" : "FAILED");
    return failures;
}

}  // namespace

int main(int argc, char** argv) {
    comm::mpi_environment env(argc, argv);
    comm::mpi_communicator comm;
    const int n = comm.size();
    int failures = 0;
    try {
        failures += check_plan(comm, presets::data_parallel(n));
        failures += check_plan(comm, presets::megatron(n));
        failures += check_plan(comm, presets::sequence_parallel(n));
        for (int stage = 1; stage <= 3; ++stage) failures += check_plan(comm, presets::zero(stage, n));
        failures += check_plan(comm, presets::coshard(n, 2));
        if (n % 2 == 0 && n > 2) {
            failures += check_plan(comm, presets::megatron(2, n / 2));
            // ZeRO over Megatron's tensor-parallel pieces: each piece's update (1), gradient (2)
            // or storage (3) sharded over its data-parallel group.
            for (int stage = 1; stage <= 3; ++stage) {
                auto p = presets::megatron(2, n / 2);
                p.zero = static_cast<plan::zero_stage>(stage);
                p.name += " + ZeRO-" + std::to_string(stage);
                failures += check_plan(comm, p);
            }
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", comm.rank(), e.what());
        return 1;
    }
    return failures == 0 ? 0 : 1;
}
