// Definitions of <loom/runtime/cuda/nccl_communicator.hpp>: NCCL collectives on a
// communication stream, ordered against the compute stream with events; bootstrap and
// sub-group ids over MPI.
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <loom/runtime/cuda/nccl_communicator.hpp>

#include "../check.cuh"

namespace loom::cuda {
namespace {

constexpr int id_tag = 7301;  // tag of unique-id messages on the bootstrap communicator

ncclDataType_t nccl_type(comm::dtype type) {
    switch (type) {
        case comm::dtype::f32: return ncclFloat32;
        case comm::dtype::f64: return ncclFloat64;
        case comm::dtype::i32: return ncclInt32;
        case comm::dtype::i64: return ncclInt64;
        case comm::dtype::bf16: return ncclBfloat16;
    }
    return ncclFloat32;
}

}  // namespace

struct nccl_communicator::state {
    comm::comm_options options;
    int rank = 0, size = 1, device = 0;
    MPI_Comm bootstrap = MPI_COMM_NULL;
    stream_handle compute = nullptr;
    // Made once the device is chosen: streams and events belong to the current device.
    std::unique_ptr<stream> comm_stream;
    std::unique_ptr<event> compute_ready, comm_done;
    ncclComm_t world = nullptr;
    std::map<std::vector<int>, ncclComm_t> groups;

    struct staging {
        device_buffer buffer;
        event done;
    };
    struct channel {
        ncclComm_t comm = nullptr;
        stream on;
        std::deque<staging> pool;  // send snapshots, reused once their send has finished
    };
    std::map<std::pair<int, int>, channel> channels;  // (from, to)

    std::vector<std::unique_ptr<event>> tickets;
    std::vector<bool> ticket_busy;
    bool broken = false;

    [[noreturn]] void fail_nccl(ncclResult_t status, const std::string& what) {
        throw comm_error("rank " + std::to_string(rank) + ": " + what + " failed: " + ncclGetErrorString(status) +
                         " (" + std::string(ncclGetLastError(nullptr) ? ncclGetLastError(nullptr) : "") +
                         "); run with NCCL_DEBUG=WARN to see why, and check that every rank made the same call");
    }
    void check(ncclResult_t status, const std::string& what) {
        if (status != ncclSuccess) fail_nccl(status, what);
    }
    void require_usable(const std::string& what) const {
        if (broken)
            throw comm_error("rank " + std::to_string(rank) + ": " + what +
                             ": the NCCL communicator was aborted after an earlier error; end the program");
    }

    // A fresh NCCL communicator among `members` (global ranks, ascending), made by every member.
    ncclComm_t make(const std::vector<int>& members) {
        const int me = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
        ncclUniqueId id{};
        if (me == 0) {
            check(ncclGetUniqueId(&id), "ncclGetUniqueId");
            for (std::size_t i = 1; i < members.size(); ++i)
                MPI_Send(&id, sizeof id, MPI_BYTE, members[i], id_tag, bootstrap);
        } else {
            MPI_Recv(&id, sizeof id, MPI_BYTE, members[0], id_tag, bootstrap, MPI_STATUS_IGNORE);
        }
        ncclComm_t made = nullptr;
        check(ncclCommInitRank(&made, static_cast<int>(members.size()), id, me),
              "ncclCommInitRank for ranks " + comm::group{members}.to_string());
        return made;
    }

    ncclComm_t for_group(const comm::group& g) {
        if (g.size() == size) return world;
        auto found = groups.find(g.ranks);
        if (found != groups.end()) return found->second;
        return groups.emplace(g.ranks, make(g.ranks)).first->second;
    }

    channel& channel_for(int from, int to) {
        auto found = channels.find({from, to});
        if (found != channels.end()) return found->second;
        channel& made = channels[{from, to}];
        // The pair's communicator lists the sender as 0 and the receiver as 1.
        const int me_is_sender = rank == from;
        ncclUniqueId id{};
        if (me_is_sender) {
            check(ncclGetUniqueId(&id), "ncclGetUniqueId");
            MPI_Send(&id, sizeof id, MPI_BYTE, to, id_tag + 1, bootstrap);
        } else {
            MPI_Recv(&id, sizeof id, MPI_BYTE, from, id_tag + 1, bootstrap, MPI_STATUS_IGNORE);
        }
        check(ncclCommInitRank(&made.comm, 2, id, me_is_sender ? 0 : 1),
              "ncclCommInitRank for messages from rank " + std::to_string(from) + " to rank " + std::to_string(to));
        return made;
    }

    // The communication stream starts after the compute stream's work so far ...
    void enter(stream_handle on) {
        compute_ready->record(compute);
        LOOM_CUDA_CHECK(cudaStreamWaitEvent(on, compute_ready->get(), 0));
    }
    // ... and the compute stream's later work waits for the communication.
    void leave(stream_handle on) {
        comm_done->record(on);
        LOOM_CUDA_CHECK(cudaStreamWaitEvent(compute, comm_done->get(), 0));
    }

    // Checks a call, queues `body` on the communication stream after the compute stream's
    // work, and returns the ticket whose event marks its end.
    template <class Body>
    ticket queue(comm::detail::collective_call call, const comm::group& g, const void* in, const void* out,
                 Body body) {
        comm::detail::check_collective(rank, size, call, g, in, out);
        require_usable(comm::detail::context(rank, call, g));
        const ncclComm_t c = for_group(g);
        enter(comm_stream->get());
        if (call.count > 0) body(c, comm_stream->get());
        const std::size_t slot = free_ticket();
        tickets[slot]->record(*comm_stream);
        return {slot};
    }

    std::size_t free_ticket() {
        for (std::size_t i = 0; i < ticket_busy.size(); ++i)
            if (!ticket_busy[i]) {
                ticket_busy[i] = true;
                return i;
            }
        tickets.push_back(std::make_unique<event>());
        ticket_busy.push_back(true);
        return tickets.size() - 1;
    }

    void abort_all() {
        broken = true;
        for (auto& [ranks, c] : groups) (void)ncclCommAbort(c);
        for (auto& [pair, ch] : channels) (void)ncclCommAbort(ch.comm);
        if (world) (void)ncclCommAbort(world);
        groups.clear();
        channels.clear();
        world = nullptr;
    }

    // The streams this communicator owns. Not the compute stream: it is the caller's, and may
    // be gone by the time the communicator is destroyed.
    void wait_own_streams(const std::string& what) {
        wait_idle(comm_stream->get(), "rank " + std::to_string(rank) + ": " + what);
        for (auto& [pair, ch] : channels)
            wait_idle(ch.on.get(), "rank " + std::to_string(rank) + ": messages from rank " +
                                       std::to_string(pair.first) + " to rank " + std::to_string(pair.second));
    }

    // Polls a stream until it is idle, an NCCL communicator reports an error, or the timeout.
    void wait_idle(stream_handle on, const std::string& what) {
        const auto deadline = std::chrono::steady_clock::now() + options.timeout;
        auto pause = std::chrono::microseconds(10);
        for (;;) {
            const cudaError_t status = cudaStreamQuery(on);
            if (status == cudaSuccess) return;
            if (status != cudaErrorNotReady) LOOM_CUDA_CHECK(status);
            ncclResult_t async = ncclSuccess;
            if (world) (void)ncclCommGetAsyncError(world, &async);
            for (auto& [ranks, c] : groups)
                if (async == ncclSuccess) (void)ncclCommGetAsyncError(c, &async);
            for (auto& [pair, ch] : channels)
                if (async == ncclSuccess && ch.comm) (void)ncclCommGetAsyncError(ch.comm, &async);
            if (async != ncclSuccess) {
                abort_all();
                fail_nccl(async, what);
            }
            if (std::chrono::steady_clock::now() > deadline) {
                abort_all();
                throw comm_error("rank " + std::to_string(rank) + ": " + what + " did not finish within " +
                                 std::to_string(options.timeout.count()) +
                                 " ms; a rank died or made a different call (the NCCL communicators were aborted)");
            }
            std::this_thread::sleep_for(pause);
            pause = std::min(pause * 2, std::chrono::microseconds(2000));
        }
    }
};

nccl_communicator::nccl_communicator(comm::comm_options options, int device) : state_(std::make_unique<state>()) {
    state& s = *state_;
    s.options = options;
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized)
        throw usage_error("nccl_communicator: MPI is not initialized; create a loom::comm::mpi_environment first "
                          "(NCCL ids are exchanged over MPI)");
    MPI_Comm_dup(MPI_COMM_WORLD, &s.bootstrap);
    MPI_Comm_rank(s.bootstrap, &s.rank);
    MPI_Comm_size(s.bootstrap, &s.size);
    const int visible = device_count();
    if (visible == 0)
        throw usage_error("nccl_communicator: rank " + std::to_string(s.rank) +
                          " sees no GPU; run one rank per GPU on GPU nodes, or use the MPI communicator");
    if (device < 0) {
        MPI_Comm node;
        MPI_Comm_split_type(s.bootstrap, MPI_COMM_TYPE_SHARED, s.rank, MPI_INFO_NULL, &node);
        int local = 0;
        MPI_Comm_rank(node, &local);
        MPI_Comm_free(&node);
        device = local % visible;
    }
    s.device = device;
    set_device(device);
    s.comm_stream = std::make_unique<stream>();
    s.compute_ready = std::make_unique<event>();
    s.comm_done = std::make_unique<event>();
    ncclUniqueId id{};
    if (s.rank == 0) s.check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, s.bootstrap);
    s.check(ncclCommInitRank(&s.world, s.size, id, s.rank), "ncclCommInitRank for the world");
}

nccl_communicator::~nccl_communicator() {
    state& s = *state_;
    if (!s.broken) {
        try {
            s.wait_own_streams("nccl_communicator's destructor");
        } catch (const std::exception& e) {
            std::cerr << e.what() << '\n';
        }
    }
    if (!s.broken) {
        for (auto& [ranks, c] : s.groups) (void)ncclCommDestroy(c);
        for (auto& [pair, ch] : s.channels) (void)ncclCommDestroy(ch.comm);
        if (s.world) (void)ncclCommDestroy(s.world);
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && s.bootstrap != MPI_COMM_NULL) MPI_Comm_free(&s.bootstrap);
}

int nccl_communicator::rank() const { return state_->rank; }
int nccl_communicator::size() const { return state_->size; }
int nccl_communicator::device() const { return state_->device; }
void nccl_communicator::set_stream(stream_handle compute) { state_->compute = compute; }

void nccl_communicator::all_reduce_sum(void* data, std::size_t count, comm::dtype type, const comm::group& g) {
    wait(begin_all_reduce_sum(data, count, type, g));
}

void nccl_communicator::all_gather(const void* in, void* out, std::size_t count_per_rank, comm::dtype type,
                                   const comm::group& g) {
    wait(begin_all_gather(in, out, count_per_rank, type, g));
}

void nccl_communicator::reduce_scatter_sum(const void* in, void* out, std::size_t count_per_rank, comm::dtype type,
                                           const comm::group& g) {
    wait(begin_reduce_scatter_sum(in, out, count_per_rank, type, g));
}


nccl_communicator::ticket nccl_communicator::begin_all_reduce_sum(void* data, std::size_t count, comm::dtype type,
                                                                  const comm::group& g) {
    state& s = *state_;
    const comm::detail::collective_call call{comm::detail::collective::all_reduce_sum, type, count, -1};
    return s.queue(call, g, data, data, [&](ncclComm_t c, stream_handle on) {
        s.check(ncclAllReduce(data, data, count, nccl_type(type), ncclSum, c, on),
                comm::detail::context(s.rank, call, g));
    });
}

nccl_communicator::ticket nccl_communicator::begin_all_gather(const void* in, void* out, std::size_t count_per_rank,
                                                              comm::dtype type, const comm::group& g) {
    state& s = *state_;
    const comm::detail::collective_call call{comm::detail::collective::all_gather, type, count_per_rank, -1};
    return s.queue(call, g, in, out, [&](ncclComm_t c, stream_handle on) {
        s.check(ncclAllGather(in, out, count_per_rank, nccl_type(type), c, on), comm::detail::context(s.rank, call, g));
    });
}

nccl_communicator::ticket nccl_communicator::begin_reduce_scatter_sum(const void* in, void* out,
                                                                      std::size_t count_per_rank, comm::dtype type,
                                                                      const comm::group& g) {
    state& s = *state_;
    const comm::detail::collective_call call{comm::detail::collective::reduce_scatter_sum, type, count_per_rank, -1};
    return s.queue(call, g, in, out, [&](ncclComm_t c, stream_handle on) {
        s.check(ncclReduceScatter(in, out, count_per_rank, nccl_type(type), ncclSum, c, on),
                comm::detail::context(s.rank, call, g));
    });
}

void nccl_communicator::wait(ticket t) {
    state& s = *state_;
    if (t.slot >= s.tickets.size() || !s.ticket_busy[t.slot])
        throw usage_error("nccl_communicator::wait: ticket " + std::to_string(t.slot) +
                          " is not pending; wait for each ticket exactly once");
    s.tickets[t.slot]->wait_in(s.compute);
    s.ticket_busy[t.slot] = false;
}

void nccl_communicator::all_to_all(const void* in, void* out, std::size_t count_per_rank, comm::dtype type,
                                   const comm::group& g) {
    state& s = *state_;
    const comm::detail::collective_call call{comm::detail::collective::all_to_all, type, count_per_rank, -1};
    const std::size_t bytes = count_per_rank * comm::size_of(type);
    wait(s.queue(call, g, in, out, [&](ncclComm_t c, stream_handle on) {
        s.check(ncclGroupStart(), "ncclGroupStart");
        for (int j = 0; j < g.size(); ++j) {
            s.check(ncclSend(static_cast<const std::byte*>(in) + j * bytes, count_per_rank, nccl_type(type), j, c, on),
                    comm::detail::context(s.rank, call, g));
            s.check(ncclRecv(static_cast<std::byte*>(out) + j * bytes, count_per_rank, nccl_type(type), j, c, on),
                    comm::detail::context(s.rank, call, g));
        }
        s.check(ncclGroupEnd(), comm::detail::context(s.rank, call, g));
    }));
}

void nccl_communicator::broadcast(void* data, std::size_t count, comm::dtype type, int root_global_rank,
                                  const comm::group& g) {
    state& s = *state_;
    const comm::detail::collective_call call{comm::detail::collective::broadcast, type, count, root_global_rank};
    wait(s.queue(call, g, data, data, [&](ncclComm_t c, stream_handle on) {
        s.check(ncclBroadcast(data, data, count, nccl_type(type), g.index_of(root_global_rank), c, on),
                comm::detail::context(s.rank, call, g));
    }));
}

void nccl_communicator::send(const void* data, std::size_t count, comm::dtype type, int dst_global_rank, int tag) {
    state& s = *state_;
    comm::detail::check_point_to_point(s.rank, s.size, "send", type, count, dst_global_rank, tag, data);
    const std::string what = comm::detail::context(s.rank, "send", type, count, dst_global_rank, tag);
    s.require_usable(what);
    if (dst_global_rank == s.rank)
        throw usage_error(what + ": a rank cannot send to itself; copy the data locally instead");
    if (count == 0) return;
    auto& ch = s.channel_for(s.rank, dst_global_rank);
    const std::size_t bytes = count * comm::size_of(type);
    // A staging buffer whose previous send has finished, else a new one (first steps only).
    state::staging* slot = nullptr;
    for (auto& candidate : ch.pool)
        if (candidate.buffer.bytes() >= bytes && cudaEventQuery(candidate.done.get()) == cudaSuccess) {
            slot = &candidate;
            break;
        }
    if (!slot) {
        ch.pool.emplace_back();
        slot = &ch.pool.back();
        slot->buffer = device_buffer(bytes);
    }
    copy_on_device(slot->buffer.get(), data, bytes, s.compute);  // the snapshot, in compute order
    s.enter(ch.on.get());
    s.check(ncclSend(slot->buffer.get(), count, nccl_type(type), 1, ch.comm, ch.on.get()), what);
    slot->done.record(ch.on);
}

void nccl_communicator::recv(void* data, std::size_t count, comm::dtype type, int src_global_rank, int tag) {
    state& s = *state_;
    comm::detail::check_point_to_point(s.rank, s.size, "recv", type, count, src_global_rank, tag, data);
    const std::string what = comm::detail::context(s.rank, "recv", type, count, src_global_rank, tag);
    s.require_usable(what);
    if (src_global_rank == s.rank)
        throw usage_error(what + ": a rank cannot receive from itself; copy the data locally instead");
    if (count == 0) return;
    auto& ch = s.channel_for(src_global_rank, s.rank);
    s.enter(ch.on.get());
    s.check(ncclRecv(data, count, nccl_type(type), 0, ch.comm, ch.on.get()), what);
    s.leave(ch.on.get());
}

void nccl_communicator::barrier(const comm::group& g) {
    state& s = *state_;
    const comm::detail::collective_call call{comm::detail::collective::barrier, comm::dtype::i32, 1, -1};
    device_buffer token(sizeof(int));
    fill_zero(token.get(), sizeof(int), s.compute);
    wait(s.queue(call, g, token.get(), token.get(), [&](ncclComm_t c, stream_handle on) {
        s.check(ncclAllReduce(token.get(), token.get(), 1, ncclInt32, ncclSum, c, on), comm::detail::context(s.rank, call, g));
    }));
    s.wait_idle(s.comm_stream->get(), comm::detail::context(s.rank, call, g));
}

void nccl_communicator::abort(std::string reason) {
    state& s = *state_;
    std::cerr << "rank " << s.rank << " aborts the job: " << reason << '\n';
    s.abort_all();
    MPI_Abort(MPI_COMM_WORLD, 1);
}

void nccl_communicator::connect_pairs() {
    state& s = *state_;
    for (int from = 0; from < s.size; ++from)
        for (int to = 0; to < s.size; ++to)
            if (from != to && (s.rank == from || s.rank == to)) s.channel_for(from, to);
}

void nccl_communicator::synchronize() {
    state& s = *state_;
    s.wait_own_streams("nccl_communicator::synchronize");
    if (s.compute) s.wait_idle(s.compute, "rank " + std::to_string(s.rank) + ": the compute stream");
}

}  // namespace loom::cuda
