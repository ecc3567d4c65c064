#pragma once
// The NCCL communicator: one rank per process and GPU, bootstrapped through MPI (rank 0's
// NCCL unique id is broadcast over MPI_COMM_WORLD), with the interface of every loom
// communicator (runtime/comm/communicator.hpp). Buffers are device pointers. Link loom::nccl
// (built when the CUDA toolkit, NCCL and MPI are all found).
//
//   loom::comm::mpi_environment mpi(argc, argv);
//   loom::cuda::nccl_communicator c;               // GPU = local rank, unless given
//   c.set_stream(compute.get());                   // the stream that produces and consumes
//   c.all_reduce_sum(grads, n, comm::dtype::f32, c.world());
//
// Contract, beyond communicator.hpp:
//  - Stream-ordered, not host-blocking: every call is queued on the communication stream
//    after the compute stream's work so far, and the compute stream's later work waits for
//    it. Only barrier() and synchronize() wait on the host, and they time out
//    (comm_options::timeout) with a comm_error, aborting the NCCL communicators, instead of
//    hanging on a rank that died.
//  - begin_all_reduce_sum / begin_reduce_scatter_sum / begin_all_gather return a ticket
//    instead: the compute stream goes on (overlapping the transfer, e.g. a gradient bucket
//    with the rest of the backward) until wait(ticket).
//  - Sums are NCCL's: every member receives bitwise the same result, and the same NCCL
//    version, topology and NCCL_ALGO/NCCL_PROTO give the same bits run to run; the order of
//    additions is NCCL's, not group order as on the host communicators.
//  - Groups get their own NCCL communicator on first use (the lowest member makes the id
//    and sends it to the others over MPI); members use groups in the same order.
//  - send snapshots the data into a staging buffer (in compute-stream order) and returns;
//    each directed pair of ranks has its own NCCL communicator and stream, so sends never
//    wait for traffic in the other direction. The first message on a pair creates its
//    communicator, which blocks until the peer's first matching call: call connect_pairs()
//    first (collective over the world) when messages flow both ways. NCCL has no tags:
//    messages of one pair are matched in the order they were sent, whatever their tags, so
//    both sides must send and receive a pair's messages in the same order (loom's transfer
//    runner does).
//  - Element types f32, f64, i32, i64 (comm::dtype).
#include <memory>
#include <string>

#include <loom/runtime/comm/communicator.hpp>
#include <loom/runtime/cuda/device.hpp>
#include <loom/runtime/cuda/device_communicator.hpp>

namespace loom::cuda {

class nccl_communicator final : public device_communicator {
public:
    // device < 0: the rank within its node (MPI_COMM_TYPE_SHARED), modulo the GPUs visible.
    explicit nccl_communicator(comm::comm_options options = {}, int device = -1);
    ~nccl_communicator() override;
    nccl_communicator(const nccl_communicator&) = delete;
    nccl_communicator& operator=(const nccl_communicator&) = delete;

    using communicator::all_gather;
    using communicator::all_reduce_sum;
    using communicator::all_to_all;
    using communicator::broadcast;
    using communicator::recv;
    using communicator::reduce_scatter_sum;
    using communicator::send;

    int rank() const override;
    int size() const override;
    int device() const;

    // The stream whose work produces the inputs and consumes the outputs (default: the
    // legacy default stream).
    void set_stream(stream_handle compute) override;

    void all_reduce_sum(void* data, std::size_t count, comm::dtype type, const comm::group& g) override;
    void all_gather(const void* in, void* out, std::size_t count_per_rank, comm::dtype type,
                    const comm::group& g) override;
    void reduce_scatter_sum(const void* in, void* out, std::size_t count_per_rank, comm::dtype type,
                            const comm::group& g) override;
    void all_to_all(const void* in, void* out, std::size_t count_per_rank, comm::dtype type,
                    const comm::group& g) override;
    void broadcast(void* data, std::size_t count, comm::dtype type, int root_global_rank,
                   const comm::group& g) override;
    void send(const void* data, std::size_t count, comm::dtype type, int dst_global_rank, int tag) override;
    void recv(void* data, std::size_t count, comm::dtype type, int src_global_rank, int tag) override;
    void barrier(const comm::group& g) override;
    void abort(std::string reason) override;

    // Overlapped collectives: queued now, waited for by the compute stream at wait().
    ticket begin_all_reduce_sum(void* data, std::size_t count, comm::dtype type, const comm::group& g) override;
    ticket begin_reduce_scatter_sum(const void* in, void* out, std::size_t count_per_rank, comm::dtype type,
                                    const comm::group& g) override;
    ticket begin_all_gather(const void* in, void* out, std::size_t count_per_rank, comm::dtype type,
                            const comm::group& g) override;
    void wait(ticket t) override;

    // Creates the communicators of every directed pair among the world's ranks, in one global
    // order (so no two ranks wait for each other); collective over the world.
    void connect_pairs();
    // Waits (up to the timeout) until all queued communication has finished; throws
    // comm_error naming the rank and the pending work if it does not.
    void synchronize() override;

private:
    struct state;
    std::unique_ptr<state> state_;
};

}  // namespace loom::cuda
