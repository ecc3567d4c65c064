#pragma once
// The MPI communicator: one rank per MPI process, over (a duplicate of) MPI_COMM_WORLD.
// Gate header of the MPI backend: the only loom header that includes <mpi.h>. It is not
// part of <loom/loom.hpp>; link the CMake target loom::mpi to use it.
//
//   int main(int argc, char** argv) {
//       loom::comm::mpi_environment mpi(argc, argv);   // MPI_Init_thread ... MPI_Finalize
//       loom::comm::mpi_communicator c;                // on every rank, before any call
//       c.all_reduce_sum(std::span(gradients), c.world());
//   }
//
// Contract, beyond communicator.hpp:
//  - Construct an mpi_communicator on every rank (its constructor duplicates
//    MPI_COMM_WORLD, a collective call) and destroy it before the mpi_environment.
//  - Sub-groups get their own MPI communicator, made on first use by MPI_Comm_create_group
//    (collective over the group's members only) and cached per rank list. Members use
//    groups in the same order, so that first use is the same call on every member.
//  - Sums do not use MPI_SUM, whose order of additions is the library's choice: the data is
//    exchanged with all-to-all and every member adds its chunk in group order, then
//    all_reduce_sum gathers the chunks. Results are therefore the same bits as the
//    in-process communicator's, on every rank and in every run.
//  - Every wait is an MPI_Test loop with a deadline (comm_options::timeout), so a missing
//    rank gives a comm_error instead of a hang; the loop backs off to short sleeps so
//    oversubscribed ranks leave the cores to the ranks that work. Creating a sub-group
//    communicator is the one blocking call without a deadline.
//  - A wait that times out names the ranks that stopped: the rank asks every other member
//    of the operation, on a communicator of its own, whether it is alive, and waits up to
//    comm_options::timeout / 4 (at most 5 s) for the answers; live ranks answer from inside
//    their own waits. The comm_error then says "rank 1 did not answer a liveness check:
//    it died or hangs outside loom's communicator". (Open MPI's mpiexec itself ends the
//    job when a process dies, naming it, unless it runs with --enable-recovery; then
//    these errors are what the other ranks report.)
//  - After a comm_error the communicator refuses further calls: the timed-out operation may
//    still be in flight inside MPI, and may still write to the buffers it was given. End
//    the program; mpirun then stops the other ranks.
//  - Calls that do not match across ranks are not detected (the in-process communicator
//    does detect them; run distributed code there first).
//  - send copies the data into a buffer of its own and returns; the transfer completes in
//    the background and finished sends are reaped by later calls and barrier. The
//    destructor waits (up to the timeout) for sends that have not been received yet.
//  - abort() calls MPI_Abort, which ends every rank of the job.
//  - Thread level: a communicator is used by one thread at a time, any thread, which needs
//    MPI_THREAD_SERIALIZED (mpi_environment asks for it by default).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iostream>
#include <list>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/runtime/comm/communicator.hpp>

namespace loom::comm {

namespace detail {

inline MPI_Datatype mpi_datatype(dtype type) {
    switch (type) {
        case dtype::f32: return MPI_FLOAT;
        case dtype::f64: return MPI_DOUBLE;
        case dtype::i32: return MPI_INT32_T;
        case dtype::i64: return MPI_INT64_T;
        case dtype::bf16: return MPI_UINT16_T;  // moved as bits; loom sums them itself (add_into)
    }
    return MPI_DATATYPE_NULL;
}

inline std::string mpi_error_text(int code) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
        return "MPI error code " + std::to_string(code);
    }
    return std::string(text, static_cast<std::size_t>(length));
}

// Throws comm_error "<where>: <MPI call> failed: <MPI's text>" unless code is MPI_SUCCESS.
inline void mpi_check(int code, const std::string& where, std::string_view call) {
    if (code == MPI_SUCCESS) return;
    throw comm_error(where + ": " + std::string(call) + " failed: " + mpi_error_text(code) +
                     "; check that every rank makes the same calls (see the messages of the "
                     "other ranks)");
}

}  // namespace detail

// ---- MPI_Init_thread / MPI_Finalize -----------------------------------------------------

class mpi_environment {
   public:
    mpi_environment(int& argc, char**& argv, int required_thread_level = MPI_THREAD_SERIALIZED)
        : mpi_environment(&argc, &argv, required_thread_level) {}

    explicit mpi_environment(int required_thread_level = MPI_THREAD_SERIALIZED)
        : mpi_environment(nullptr, nullptr, required_thread_level) {}

    ~mpi_environment() {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (owns_ && !finalized) MPI_Finalize();
    }

    mpi_environment(const mpi_environment&) = delete;
    mpi_environment& operator=(const mpi_environment&) = delete;

    int rank() const noexcept { return rank_; }
    int size() const noexcept { return size_; }
    // The thread level MPI provides (MPI_THREAD_SINGLE ... MPI_THREAD_MULTIPLE).
    int thread_level() const noexcept { return thread_level_; }

   private:
    mpi_environment(int* argc, char*** argv, int required_thread_level) {
        int initialized = 0;
        MPI_Initialized(&initialized);
        if (initialized) {
            // Someone else started MPI and will finalize it.
            MPI_Query_thread(&thread_level_);
        } else {
            detail::mpi_check(MPI_Init_thread(argc, argv, required_thread_level, &thread_level_),
                              "mpi_environment", "MPI_Init_thread");
            owns_ = true;
        }
        MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
        MPI_Comm_size(MPI_COMM_WORLD, &size_);
        if (thread_level_ < required_thread_level) {
            const int provided = thread_level_;
            if (owns_) MPI_Finalize();
            throw comm_error("mpi_environment: MPI provides thread level " +
                             std::to_string(provided) + " but " +
                             std::to_string(required_thread_level) +
                             " is required; use an MPI library built with thread support or "
                             "call MPI only from the main thread and ask for less");
        }
    }

    bool owns_ = false;
    int thread_level_ = MPI_THREAD_SINGLE;
    int rank_ = 0;
    int size_ = 1;
};

// ---- the communicator -------------------------------------------------------------------

class mpi_communicator final : public communicator {
   public:
    explicit mpi_communicator(comm_options options = {}) : options_(options) {
        const std::string where = "mpi_communicator";
        int initialized = 0;
        MPI_Initialized(&initialized);
        if (!initialized) {
            throw usage_error(where + ": MPI is not initialized; create an mpi_environment "
                                      "before the communicator");
        }
        // A duplicate keeps loom's messages apart from the application's own MPI traffic,
        // and errors come back as codes (turned into comm_error) instead of aborting.
        detail::mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &world_), where, "MPI_Comm_dup");
        MPI_Comm_set_errhandler(world_, MPI_ERRORS_RETURN);
        detail::mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &liveness_), where, "MPI_Comm_dup");
        MPI_Comm_set_errhandler(liveness_, MPI_ERRORS_RETURN);
        MPI_Comm_rank(world_, &rank_);
        MPI_Comm_size(world_, &size_);
        int found = 0;
        void* tag_upper_bound = nullptr;
        MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_upper_bound, &found);
        if (found && tag_upper_bound != nullptr) max_tag_ = *static_cast<int*>(tag_upper_bound);
    }

    ~mpi_communicator() override {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (finalized) return;  // too late: MPI has released everything already
        if (!broken_) {
            try {
                finish_sends(std::chrono::steady_clock::now() + options_.timeout);
            } catch (const std::exception& error) {
                std::cerr << error.what() << '\n';
            }
        }
        // Sends that never finished: MPI may still read their buffers, so those are leaked
        // on purpose rather than freed under it.
        for (pending_send& send : sends_) {
            MPI_Request_free(&send.request);
            static_cast<void>(new std::vector<std::byte>(std::move(send.buffer)));
        }
        // An operation that timed out may still run on its communicator; freeing that under
        // it crashes the next MPI call, so then the communicators are leaked instead.
        bool all_finished = true;
        for (MPI_Request& request : abandoned_) {
            int done = 0;
            if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) {
                all_finished = false;
            }
        }
        if (!all_finished) return;
        for (auto& [ranks, comm] : groups_) MPI_Comm_free(&comm);
        MPI_Comm_free(&world_);
        if (!answers_.empty()) return;  // answers to liveness checks may still be in flight
        MPI_Comm_free(&liveness_);
    }

    mpi_communicator(const mpi_communicator&) = delete;
    mpi_communicator& operator=(const mpi_communicator&) = delete;

    using communicator::all_gather;
    using communicator::all_reduce_sum;
    using communicator::all_to_all;
    using communicator::broadcast;
    using communicator::recv;
    using communicator::reduce_scatter_sum;
    using communicator::send;

    int rank() const override { return rank_; }
    int size() const override { return size_; }

    void all_reduce_sum(void* data, std::size_t count, dtype type, const group& g) override {
        const detail::collective_call call{detail::collective::all_reduce_sum, type, count, -1};
        const operation op = begin(call, g, data, data);
        const std::size_t members = g.ranks.size();
        const std::size_t element = size_of(type);
        // Chunks of equal size: the tail of the last one is zero padding.
        const std::size_t chunk = (count + members - 1) / members;
        const int mpi_chunk = mpi_chunk_count(chunk, members, op);
        std::vector<std::byte> padded(chunk * members * element);
        detail::copy_bytes(padded.data(), data, count * element);
        std::vector<std::byte> received(chunk * members * element);
        std::vector<std::byte> sum(chunk * element);
        MPI_Request request = MPI_REQUEST_NULL;
        detail::mpi_check(MPI_Ialltoall(padded.data(), mpi_chunk, detail::mpi_datatype(type),
                                        received.data(), mpi_chunk, detail::mpi_datatype(type),
                                        op.comm, &request),
                          op.where, "MPI_Ialltoall");
        wait(request, op);
        add_chunks_in_order(received, sum.data(), chunk, type, members);
        detail::mpi_check(MPI_Iallgather(sum.data(), mpi_chunk, detail::mpi_datatype(type),
                                         padded.data(), mpi_chunk, detail::mpi_datatype(type),
                                         op.comm, &request),
                          op.where, "MPI_Iallgather");
        wait(request, op);
        detail::copy_bytes(data, padded.data(), count * element);
    }

    void all_gather(const void* in, void* out, std::size_t count_per_rank, dtype type,
                    const group& g) override {
        const detail::collective_call call{detail::collective::all_gather, type, count_per_rank,
                                           -1};
        const operation op = begin(call, g, in, out);
        const int count = mpi_chunk_count(count_per_rank, g.ranks.size(), op);
        MPI_Request request = MPI_REQUEST_NULL;
        detail::mpi_check(MPI_Iallgather(in, count, detail::mpi_datatype(type), out, count,
                                         detail::mpi_datatype(type), op.comm, &request),
                          op.where, "MPI_Iallgather");
        wait(request, op);
    }

    void reduce_scatter_sum(const void* in, void* out, std::size_t count_per_rank, dtype type,
                            const group& g) override {
        const detail::collective_call call{detail::collective::reduce_scatter_sum, type,
                                           count_per_rank, -1};
        const operation op = begin(call, g, in, out);
        const std::size_t members = g.ranks.size();
        const int count = mpi_chunk_count(count_per_rank, members, op);
        // Not MPI_Ireduce_scatter_block: its order of additions is not ours to fix.
        std::vector<std::byte> received(count_per_rank * members * size_of(type));
        MPI_Request request = MPI_REQUEST_NULL;
        detail::mpi_check(MPI_Ialltoall(in, count, detail::mpi_datatype(type), received.data(),
                                        count, detail::mpi_datatype(type), op.comm, &request),
                          op.where, "MPI_Ialltoall");
        wait(request, op);
        add_chunks_in_order(received, out, count_per_rank, type, members);
    }

    void all_to_all(const void* in, void* out, std::size_t count_per_rank, dtype type,
                    const group& g) override {
        const detail::collective_call call{detail::collective::all_to_all, type, count_per_rank,
                                           -1};
        const operation op = begin(call, g, in, out);
        const int count = mpi_chunk_count(count_per_rank, g.ranks.size(), op);
        MPI_Request request = MPI_REQUEST_NULL;
        detail::mpi_check(MPI_Ialltoall(in, count, detail::mpi_datatype(type), out, count,
                                        detail::mpi_datatype(type), op.comm, &request),
                          op.where, "MPI_Ialltoall");
        wait(request, op);
    }

    void broadcast(void* data, std::size_t count, dtype type, int root_global_rank,
                   const group& g) override {
        const detail::collective_call call{detail::collective::broadcast, type, count,
                                           root_global_rank};
        const operation op = begin(call, g, data, data);
        MPI_Request request = MPI_REQUEST_NULL;
        detail::mpi_check(MPI_Ibcast(data, mpi_count(count, op), detail::mpi_datatype(type),
                                     g.index_of(root_global_rank), op.comm, &request),
                          op.where, "MPI_Ibcast");
        wait(request, op);
    }

    void send(const void* data, std::size_t count, dtype type, int dst_global_rank,
              int tag) override {
        const operation op = begin_point_to_point("send", data, count, type, dst_global_rank, tag);
        const int elements = mpi_count(count, op);
        reap_sends(op);
        pending_send& pending = sends_.emplace_back();
        pending.buffer.resize(count * size_of(type));
        detail::copy_bytes(pending.buffer.data(), data, pending.buffer.size());
        const int code = MPI_Isend(pending.buffer.data(), elements,
                                   detail::mpi_datatype(type), dst_global_rank, tag, world_,
                                   &pending.request);
        if (code != MPI_SUCCESS) sends_.pop_back();
        detail::mpi_check(code, op.where, "MPI_Isend");
    }

    void recv(void* data, std::size_t count, dtype type, int src_global_rank, int tag) override {
        const operation op = begin_point_to_point("recv", data, count, type, src_global_rank, tag);
        reap_sends(op);
        MPI_Request request = MPI_REQUEST_NULL;
        detail::mpi_check(MPI_Irecv(data, mpi_count(count, op), detail::mpi_datatype(type),
                                    src_global_rank, tag, world_, &request),
                          op.where, "MPI_Irecv");
        MPI_Status status{};
        wait(request, op, &status);
        int received = 0;
        MPI_Get_count(&status, detail::mpi_datatype(type), &received);
        if (static_cast<std::size_t>(received) != count) {
            broken_ = true;
            throw comm_error(op.where + " received a message of " + std::to_string(received) +
                             " elements; send and recv must agree on dtype and count (or use "
                             "distinct tags for messages of different shapes)");
        }
    }

    void barrier(const group& g) override {
        const detail::collective_call call{detail::collective::barrier, dtype::f32, 0, -1};
        const operation op = begin(call, g, nullptr, nullptr);
        // Sends reaped here make "after a barrier, my earlier sends are done" hold as often
        // as MPI allows; it does not wait for them.
        reap_sends(op);
        MPI_Request request = MPI_REQUEST_NULL;
        detail::mpi_check(MPI_Ibarrier(op.comm, &request), op.where, "MPI_Ibarrier");
        wait(request, op);
    }

    void abort(std::string reason) override {
        // One write of the whole line: std::cerr is unbuffered, so each << was a write of its
        // own, and mpiexec's abort banner (another process on the same stream) was seen
        // landing between "rank 1" and " failed: ...".
        const std::string line = "rank " + std::to_string(rank_) + " failed: " + reason + "\n";
        std::cerr.write(line.data(), static_cast<std::streamsize>(line.size()));
        std::cerr.flush();
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

   private:
    // One call in progress: its description for messages, its deadline and communicator.
    struct operation {
        std::string where;
        std::chrono::steady_clock::time_point deadline;
        MPI_Comm comm = MPI_COMM_NULL;
        std::vector<int> peers;  // global ranks this operation waits on (liveness checks)
    };

    struct pending_send {
        std::vector<std::byte> buffer;
        MPI_Request request = MPI_REQUEST_NULL;
    };

    operation begin(const detail::collective_call& call, const group& g, const void* in,
                    const void* out) {
        detail::check_collective(rank_, size_, call, g, in, out);
        operation op{detail::context(rank_, call, g),
                     std::chrono::steady_clock::now() + options_.timeout, MPI_COMM_NULL};
        throw_if_broken(op);
        op.comm = communicator_of(g, op);
        for (int r : g.ranks)
            if (r != rank_) op.peers.push_back(r);
        return op;
    }

    operation begin_point_to_point(std::string_view name, const void* data, std::size_t count,
                                   dtype type, int peer, int tag) {
        detail::check_point_to_point(rank_, size_, name, type, count, peer, tag, data);
        operation op{detail::context(rank_, name, type, count, peer, tag),
                     std::chrono::steady_clock::now() + options_.timeout, world_};
        if (tag > max_tag_) {
            throw usage_error(op.where + ": tag " + std::to_string(tag) +
                              " is above MPI_TAG_UB = " + std::to_string(max_tag_) +
                              "; use a smaller tag");
        }
        throw_if_broken(op);
        op.peers = {peer};
        return op;
    }

    void throw_if_broken(const operation& op) const {
        if (broken_) {
            throw comm_error(op.where + ": an earlier call of this rank failed, so MPI may still "
                                        "be working on it; end the program after a comm_error");
        }
    }

    // count as an MPI count; MPI counts are int.
    static int mpi_count(std::size_t count, const operation& op) {
        if (count > static_cast<std::size_t>(INT_MAX)) {
            throw usage_error(op.where + ": " + std::to_string(count) +
                              " elements are more than MPI can count (INT_MAX); split the call");
        }
        return static_cast<int>(count);
    }

    // A per-member count whose total over the group must also fit an MPI count, because
    // MPI addresses the whole buffer with int offsets.
    static int mpi_chunk_count(std::size_t count_per_rank, std::size_t members,
                               const operation& op) {
        static_cast<void>(mpi_count(count_per_rank * members, op));
        return static_cast<int>(count_per_rank);
    }

    // The MPI communicator of a group: the world's duplicate, or one made on first use.
    MPI_Comm communicator_of(const group& g, const operation& op) {
        if (g.size() == size_) return world_;
        if (const auto cached = groups_.find(g.ranks); cached != groups_.end()) {
            return cached->second;
        }
        MPI_Group world_group = MPI_GROUP_NULL;
        MPI_Group members = MPI_GROUP_NULL;
        MPI_Comm made = MPI_COMM_NULL;
        detail::mpi_check(MPI_Comm_group(world_, &world_group), op.where, "MPI_Comm_group");
        int code = MPI_Group_incl(world_group, g.size(), g.ranks.data(), &members);
        if (code == MPI_SUCCESS) {
            // A tag per rank list, so that overlapping groups made one after the other cannot
            // confuse each other's internal messages.
            const int tag = static_cast<int>(std::hash<std::string>{}(g.to_string()) % 32768);
            code = MPI_Comm_create_group(world_, members, tag, &made);
        }
        MPI_Group_free(&world_group);
        if (members != MPI_GROUP_NULL) MPI_Group_free(&members);
        detail::mpi_check(code, op.where, "MPI_Comm_create_group");
        MPI_Comm_set_errhandler(made, MPI_ERRORS_RETURN);
        groups_.emplace(g.ranks, made);
        return made;
    }

    // Polls until the request completes or the deadline passes. Spins briefly (the common
    // case completes within microseconds), then sleeps: ever longer, up to 50 us while the
    // wait is young, up to 1 ms once it has lasted 20 ms. A wait inside a step (a partner
    // still computing) ends within a sleep of when it could, and one that idles (a
    // pipeline's bubble, a slow rank) wakes rarely. (Sleeps of up to 1 ms from the start
    // woke each of a step's hundreds of small collectives up to 1 ms late.)
    void wait(MPI_Request& request, const operation& op, MPI_Status* status = MPI_STATUS_IGNORE) {
        auto pause = std::chrono::microseconds(0);
        const auto started = std::chrono::steady_clock::now();
        for (int polls = 0;; ++polls) {
            int done = 0;
            const int code = MPI_Test(&request, &done, status);
            if (code != MPI_SUCCESS) {
                broken_ = true;
                detail::mpi_check(code, op.where, "MPI_Test");
            }
            if (done) return;
            answer_liveness_checks();
            if (std::chrono::steady_clock::now() >= op.deadline) {
                broken_ = true;
                abandoned_.push_back(std::exchange(request, MPI_REQUEST_NULL));
                const std::string silent = silent_peers(op);
                if (!silent.empty())
                    throw comm_error(op.where + " timed out after " + std::to_string(options_.timeout.count()) +
                                     " ms: " + silent + "; restart the job from its last checkpoint");
                throw comm_error(op.where + " timed out after " +
                                 std::to_string(options_.timeout.count()) +
                                 " ms; every rank is alive, so the ranks called collectives in "
                                 "different orders or one is slow (raise comm_options::timeout if "
                                 "they are only slow)");
            }
            if (polls >= 100) {
                const bool long_wait = std::chrono::steady_clock::now() - started > std::chrono::milliseconds(20);
                pause = std::min(std::chrono::microseconds(long_wait ? 1000 : 50),
                                 std::max(std::chrono::microseconds(10), pause * 2));
                std::this_thread::sleep_for(pause);
            }
        }
    }

    // received holds `members` chunks of `chunk` elements; sum = chunk 0 + chunk 1 + ...
    static void add_chunks_in_order(const std::vector<std::byte>& received, void* sum,
                                    std::size_t chunk, dtype type, std::size_t members) {
        const std::size_t chunk_bytes = chunk * size_of(type);
        detail::copy_bytes(sum, received.data(), chunk_bytes);
        for (std::size_t member = 1; member < members; ++member) {
            detail::add_into(type, sum, received.data() + member * chunk_bytes, chunk);
        }
    }

    // Drops the sends that have completed.
    void reap_sends(const operation& op) {
        for (auto it = sends_.begin(); it != sends_.end();) {
            int done = 0;
            const int code = MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
            if (code != MPI_SUCCESS) {
                broken_ = true;
                detail::mpi_check(code, op.where, "MPI_Test of an earlier send");
            }
            it = done ? sends_.erase(it) : std::next(it);
        }
    }

    void finish_sends(std::chrono::steady_clock::time_point deadline) {
        const operation op{"rank " + std::to_string(rank_) + ": mpi_communicator destructor",
                           deadline, world_};
        while (!sends_.empty()) {
            reap_sends(op);
            if (sends_.empty()) break;
            if (std::chrono::steady_clock::now() >= deadline) {
                throw comm_error(op.where + ": " + std::to_string(sends_.size()) +
                                 " sends were never received; receive every message that is "
                                 "sent before the communicator is destroyed");
            }
            std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
    }

    static constexpr int ping_tag = 1, pong_tag = 2;

    // Answers every liveness check that has arrived (a ping from a rank whose wait timed out).
    void answer_liveness_checks() {
        for (;;) {
            int arrived = 0;
            MPI_Status status;
            if (MPI_Iprobe(MPI_ANY_SOURCE, ping_tag, liveness_, &arrived, &status) != MPI_SUCCESS || !arrived) break;
            char byte = 0;
            MPI_Recv(&byte, 1, MPI_CHAR, status.MPI_SOURCE, ping_tag, liveness_, MPI_STATUS_IGNORE);
            answers_.emplace_back();
            MPI_Isend(&pong_byte_, 1, MPI_CHAR, status.MPI_SOURCE, pong_tag, liveness_, &answers_.back());
        }
        for (auto it = answers_.begin(); it != answers_.end();) {
            int done = 0;
            MPI_Test(&*it, &done, MPI_STATUS_IGNORE);
            it = done ? answers_.erase(it) : std::next(it);
        }
    }

    // Asks every peer of `op` whether it is alive; "" when all answer, else which did not.
    std::string silent_peers(const operation& op) {
        if (op.peers.empty()) return {};
        std::vector<MPI_Request> pings(op.peers.size(), MPI_REQUEST_NULL), pongs(op.peers.size(), MPI_REQUEST_NULL);
        std::vector<char> replies(op.peers.size(), 0);
        for (std::size_t i = 0; i < op.peers.size(); ++i) {
            MPI_Isend(&ping_byte_, 1, MPI_CHAR, op.peers[i], ping_tag, liveness_, &pings[i]);
            MPI_Irecv(&replies[i], 1, MPI_CHAR, op.peers[i], pong_tag, liveness_, &pongs[i]);
        }
        const auto grace = std::min<std::chrono::milliseconds>(options_.timeout / 4, std::chrono::milliseconds(5000));
        const auto until = std::chrono::steady_clock::now() + grace;
        std::vector<bool> answered(op.peers.size(), false);
        for (;;) {
            answer_liveness_checks();
            bool all = true;
            for (std::size_t i = 0; i < op.peers.size(); ++i) {
                if (!answered[i]) {
                    int done = 0;
                    if (MPI_Test(&pongs[i], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) answered[i] = true;
                }
                all = all && answered[i];
            }
            if (all || std::chrono::steady_clock::now() >= until) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        std::string silent, alive;
        int count = 0;
        for (std::size_t i = 0; i < op.peers.size(); ++i) {
            std::string& list = answered[i] ? alive : silent;
            list += (list.empty() ? "" : ", ") + std::to_string(op.peers[i]);
            if (!answered[i]) {
                ++count;
                abandoned_.push_back(pongs[i]);
            }
            abandoned_.push_back(pings[i]);
        }
        if (count == 0) return {};
        return std::string(count == 1 ? "rank " : "ranks ") + silent + " did not answer a liveness check within " +
               std::to_string(grace.count()) + " ms: " + (count == 1 ? "it died or hangs" : "they died or hang") +
               " outside loom's communicator" + (alive.empty() ? std::string() : " (rank(s) " + alive + " answered)");
    }

    comm_options options_;
    MPI_Comm world_ = MPI_COMM_NULL;
    MPI_Comm liveness_ = MPI_COMM_NULL;
    std::list<MPI_Request> answers_;  // answers to liveness checks still being sent
    char ping_byte_ = 1, pong_byte_ = 2;
    int rank_ = 0;
    int size_ = 1;
    int max_tag_ = 32767;  // the least MPI_TAG_UB the standard allows
    bool broken_ = false;
    std::map<std::vector<int>, MPI_Comm> groups_;
    std::list<pending_send> sends_;  // a list: MPI holds pointers to the requests
    std::vector<MPI_Request> abandoned_;  // operations that timed out
};

static_assert(communicator_like<mpi_communicator>);

}  // namespace loom::comm
