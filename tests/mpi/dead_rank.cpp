// A rank that dies or throws in the middle of training under mpirun: what the others do.
// ctest runs it through tests/mpi/dead_rank.cmake, which checks what a user sees.
//
//   mpirun -np 4 dead_rank kill    rank 1 raises SIGKILL on itself after step 1
//   mpirun -np 4 dead_rank throw   rank 1 throws after step 1
// Every rank trains a GPT under data parallelism with a 5 s communicator timeout. A rank
// whose call fails prints the comm_error (which names the rank that stopped answering) and
// ends the job through comm.abort (MPI_Abort), as a training program should: MPI_Finalize
// with a dead peer could wait forever.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <loom/loom.hpp>
#include <loom/runtime/comm/mpi.hpp>

#include "support/gpt_batch.hpp"

using namespace loom;

int main(int argc, char** argv) {
    comm::mpi_environment env(argc, argv);
    comm::mpi_communicator comm({.timeout = std::chrono::milliseconds(5000)});
    const std::string mode = argc > 1 ? argv[1] : "kill";
    const models::gpt_config c{.layers = 2, .hidden = 16, .heads = 4, .vocab = 32, .seq = 8, .batch = 8};
    auto model = models::gpt(c);
    const auto pg = partition::apply_plan(model.ir(), plan::resolve(plan::presets::data_parallel(comm.size()), model.ir()));
    try {
        train::distributed_trainer<float> rank(pg, comm, {});
        std::vector<std::vector<std::int32_t>> keep;
        for (int s = 0; s < 4; ++s) {
            if (s == 2 && comm.rank() == 1) {
                if (mode == "kill") std::raise(SIGKILL);
                throw usage_error("rank 1 stops on purpose (dead_rank throw)");
            }
            const auto r = rank.step(testing::gpt_batch(c, s, keep));
            if (comm.rank() == 0) std::printf("step %d loss %.6f\n", s, r.loss);
            std::fflush(stdout);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", comm.rank(), e.what());
        std::fflush(stderr);
        comm.abort(e.what());
    }
    return 0;
}
