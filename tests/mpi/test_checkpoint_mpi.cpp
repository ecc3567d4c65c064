// Checkpoints under mpiexec (ctest runs 4 processes): every rank writes its own shard file
// of one shared checkpoint directory and reads back only the shards its pieces meet.
//  (no arguments)     in one job: Megatron TP over all ranks saves at step 2; new trainers
//                     resume it bit-identically in float32 and float64 with dropout on; the
//                     same checkpoint loads under ZeRO-3 over all ranks and trains on like
//                     one device (float64, relative 1e-9: summation order differs).
//  --save DIR         saves at step 2 under Megatron TP, float64 with dropout, and ends;
//  --resume DIR       a new job resumes from DIR and checks steps 2-3 bit for bit against
//                     an uninterrupted run under the same plan (tests/mpi/checkpoint_new_job.cmake).
// Exit code 0 only if every check on this rank passed.
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include <loom/loom.hpp>
#include <loom/runtime/comm/mpi.hpp>

#include "support/plan_equivalence.hpp"

using namespace loom;
namespace fs = std::filesystem;

namespace {

models::gpt_config model() {
    return {.layers = 2, .hidden = 16, .heads = 4, .vocab = 32, .seq = 8, .batch = 8, .dropout = 0.1};
}

train::trainer_options options() {
    train::trainer_options o;
    o.optimizer = train::adamw_options{.weight_decay = 0.1};
    o.schedule = {.peak = 3e-3, .min_lr = 3e-4, .warmup_steps = 2, .total_steps = 8};
    return o;
}

// Steps [from, to) under `spec` on this rank; loads `resume` first, saves to `save` after.
template <class T>
std::vector<double> train_steps(comm::communicator& comm, const plan::plan_spec& spec, int from, int to,
                          const fs::path& resume = {}, const fs::path& save = {}) {
    const auto c = model();
    auto m = models::gpt(c);
    const auto pg = partition::apply_plan(m.ir(), plan::resolve(spec, m.ir()));
    train::distributed_trainer<T> rank(pg, comm, options());
    if (!resume.empty()) train::load_checkpoint(rank, resume);
    if (rank.steps() != from) throw error("resumed at step " + std::to_string(rank.steps()));
    std::vector<std::vector<std::int32_t>> keep;
    std::vector<double> losses;
    for (int s = from; s < to; ++s) losses.push_back(rank.step(testing::gpt_batch(c, s, keep)).loss);
    if (!save.empty()) train::save_checkpoint(rank, save);
    return losses;
}

// One directory name for the whole job: rank 0's choice, broadcast.
fs::path shared_directory(comm::communicator& comm, const std::string& name) {
    double id = static_cast<double>(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000007);
    comm.broadcast(&id, 1, comm::dtype::f64, 0, comm::group::world(comm.size()));
    return fs::temp_directory_path() / (name + "_" + std::to_string(static_cast<long long>(id)));
}

int report(comm::communicator& comm, bool ok, const std::string& what) {
    std::printf("rank %d: %-60s %s\n", comm.rank(), what.c_str(), ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}

template <class T>
int resume_in_one_job(comm::communicator& comm) {
    const auto tp = plan::presets::megatron(comm.size());
    const auto dir = shared_directory(comm, "loom_mpi_checkpoint");
    const auto whole = train_steps<T>(comm, tp, 0, 4);
    train_steps<T>(comm, tp, 0, 2, {}, dir);
    const auto latest = train::latest_checkpoint(dir);
    int failures = report(comm, latest.has_value(), "a complete checkpoint exists");
    if (!latest) return failures;
    const auto rest = train_steps<T>(comm, tp, 2, 4, *latest);
    failures += report(comm, rest[0] == whole[2] && rest[1] == whole[3],
                       std::string(sizeof(T) == 4 ? "float32" : "float64") + ": resume under TP is bit-identical");
    if constexpr (sizeof(T) == 8) {
        // Reshard: the TP checkpoint under ZeRO-3, against one device computed here.
        train::trainer<T> single(models::gpt(model()).training_graph(), options());
        std::vector<std::vector<std::int32_t>> keep;
        std::vector<double> reference;
        for (int s = 0; s < 4; ++s) reference.push_back(single.step(testing::gpt_batch(model(), s, keep)).loss);
        const auto zero3 = train_steps<T>(comm, plan::presets::zero(3, comm.size()), 2, 4, *latest);
        failures += report(comm,
                           testing::relative(zero3[0], reference[2]) <= 1e-9 &&
                               testing::relative(zero3[1], reference[3]) <= 1e-9,
                           "TP checkpoint resharded to ZeRO-3 trains like one device");
    }
    comm.barrier(comm::group::world(comm.size()));
    if (comm.rank() == 0) fs::remove_all(dir);
    return failures;
}

}  // namespace

int main(int argc, char** argv) {
    comm::mpi_environment env(argc, argv);
    comm::mpi_communicator comm;
    const std::string mode = argc > 2 ? argv[1] : "";
    int failures = 0;
    try {
        const auto tp = plan::presets::megatron(comm.size());
        if (mode == "--save") {
            train_steps<double>(comm, tp, 0, 2, {}, argv[2]);
            std::printf("rank %d: saved step 2 under %s\n", comm.rank(), tp.name.c_str());
        } else if (mode == "--resume") {
            const auto latest = train::latest_checkpoint(argv[2]);
            if (!latest) throw data_error(std::string("no checkpoint in ") + argv[2]);
            const auto whole = train_steps<double>(comm, tp, 0, 4);
            const auto rest = train_steps<double>(comm, tp, 2, 4, *latest);
            failures += report(comm, rest[0] == whole[2] && rest[1] == whole[3],
                               "a new job resumes the saved one bit-identically");
        } else {
            failures += resume_in_one_job<float>(comm);
            failures += resume_in_one_job<double>(comm);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", comm.rank(), e.what());
        return 1;
    }
    return failures == 0 ? 0 : 1;
}
