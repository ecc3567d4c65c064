#pragma once
// The in-process communicator: n ranks that are threads of one process, sharing one
// in_process_world. For tests of distributed code, and for running a plan's ranks on one
// machine without MPI.
//
//   loom::comm::run_ranks(4, [&](loom::comm::communicator& c) {
//       std::vector<float> gradient = local_gradient(c.rank());
//       c.all_reduce_sum(std::span(gradient), c.world());
//   });
//
// How calls are matched: every member's k-th collective call on a group (a group is its
// list of ranks) meets the k-th call of every other member in one slot. The member that
// arrives last builds the result (sums in group order, gathers, transposes) from the
// others' buffers while they wait, then every member copies its part out. Everyone
// therefore reads bitwise the same sums, and no member writes its output before all
// inputs have been read, so in-place all_reduce_sum needs no extra synchronization.
//
// Threading contract: each rank's communicator is used by one thread at a time; ranks run
// concurrently. Waiting uses one mutex and condition variable per world with a deadline
// (comm_options::timeout); nothing spins.
//
// Failure: the first failure of any rank (a timeout, calls that do not match, a recv whose
// message has another size, or abort()) fails the whole world: every waiting call and
// every later call throws comm_error naming the failed rank and why. A failed world stays
// failed; make a new one.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/runtime/comm/communicator.hpp>

namespace loom::comm {

namespace detail {

// The state every rank of one in_process_world shares; all of it is guarded by mutex_.
class in_process_state {
   public:
    in_process_state(int size, comm_options options) : size_(size), options_(options) {}

    int size() const noexcept { return size_; }
    const comm_options& options() const noexcept { return options_; }

    // in: this member's input (for all_reduce_sum and broadcast, its data buffer);
    // out: where this member's result goes. Both must stay valid until the call returns.
    void run_collective(int rank, const collective_call& call, const group& g, const void* in,
                        void* out) {
        const std::string where = context(rank, call, g);
        std::unique_lock lock(mutex_);
        throw_if_failed(lock, where);

        group_channel& channel = channels_[g.ranks];
        const std::size_t members = g.ranks.size();
        if (channel.next_call.empty()) channel.next_call.assign(members, 0);
        const std::size_t me = static_cast<std::size_t>(g.index_of(rank));
        const std::uint64_t sequence = channel.next_call[me]++;
        collective_slot& slot = channel.slots[sequence];
        if (slot.calls.empty()) slot.calls.resize(members);

        for (std::size_t other = 0; other < members; ++other) {
            if (slot.calls[other] && slot.calls[other]->call != call) {
                const std::string mismatch =
                    where + " does not match " + describe(slot.calls[other]->call) +
                    " called by rank " + std::to_string(g.ranks[other]) + "; both are call #" +
                    std::to_string(sequence) +
                    " on this group. Every member must make the same collective calls on a "
                    "group, with the same dtype, counts and root, in the same order";
                fail_world(lock, rank, mismatch);
                throw comm_error(mismatch);
            }
        }
        slot.calls[me] = member_call{call, in};

        if (++slot.arrived == members) {
            slot.phase = slot_phase::building;
            lock.unlock();
            std::string build_failure;
            try {
                build_result(slot, call, g);
            } catch (const std::exception& error) {  // std::bad_alloc of the result buffer
                build_failure = where + " could not build the result: " + error.what() +
                                "; free memory or make the call smaller";
            }
            lock.lock();
            if (!build_failure.empty()) {
                slot.phase = slot_phase::failed;
                fail_world(lock, rank, build_failure);
                changed_.notify_all();
                throw comm_error(build_failure);
            }
            slot.phase = slot_phase::ready;
            changed_.notify_all();
        } else {
            const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
            const bool moved_on = changed_.wait_until(lock, deadline, [&] {
                return slot.phase != slot_phase::waiting || failure_.has_value();
            });
            // Once every member has arrived, the builder may be reading this member's input:
            // leave only after it is done, whatever else happened meanwhile.
            if (slot.phase == slot_phase::waiting) {
                if (moved_on) throw comm_error(failure_message(where));
                const std::string timeout =
                    where + " timed out after " + std::to_string(options_.timeout.count()) +
                    " ms waiting for ranks " + missing_members(g, [&](int i) {
                        return slot.calls[static_cast<std::size_t>(i)].has_value();
                    }) +
                    "; a rank stopped or the ranks called collectives in different orders "
                    "(raise comm_options::timeout if they are only slow)";
                fail_world(lock, rank, timeout);
                throw comm_error(timeout);
            }
            changed_.wait(lock, [&] { return slot.phase != slot_phase::building; });
            if (slot.phase == slot_phase::failed) throw comm_error(failure_message(where));
        }

        // The result is read-only from here on and the slot lives until every member has
        // left, so the copy needs no lock.
        lock.unlock();
        copy_result_out(slot, call, g, me, out);
        lock.lock();
        if (++slot.departed == members) channel.slots.erase(sequence);
    }

    void send(int source, const void* data, std::size_t count, dtype type, int destination,
              int tag) {
        const std::string where = context(source, "send", type, count, destination, tag);
        message copy{type, count, std::vector<std::byte>(count * size_of(type))};
        copy_bytes(copy.bytes.data(), data, copy.bytes.size());
        std::unique_lock lock(mutex_);
        throw_if_failed(lock, where);
        mailboxes_[{source, destination, tag}].push_back(std::move(copy));
        changed_.notify_all();
    }

    void recv(int destination, void* data, std::size_t count, dtype type, int source, int tag) {
        const std::string where = context(destination, "recv", type, count, source, tag);
        std::unique_lock lock(mutex_);
        throw_if_failed(lock, where);
        std::deque<message>& mailbox = mailboxes_[{source, destination, tag}];
        const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
        const bool arrived = changed_.wait_until(lock, deadline, [&] {
            return !mailbox.empty() || failure_.has_value();
        });
        if (!arrived) {
            const std::string timeout =
                where + " timed out after " + std::to_string(options_.timeout.count()) +
                " ms; no matching send arrived. Rank " + std::to_string(source) +
                " stopped, sent with another tag, or sends fewer messages than are received "
                "(raise comm_options::timeout if it is only slow)";
            fail_world(lock, destination, timeout);
            throw comm_error(timeout);
        }
        if (mailbox.empty()) throw comm_error(failure_message(where));
        message received = std::move(mailbox.front());
        mailbox.pop_front();
        if (received.type != type || received.count != count) {
            const std::string mismatch =
                where + " received a message of " + std::string(to_string(received.type)) +
                ", " + std::to_string(received.count) +
                " elements; send and recv must agree on dtype and count (or use distinct tags "
                "for messages of different shapes)";
            fail_world(lock, destination, mismatch);
            throw comm_error(mismatch);
        }
        lock.unlock();
        copy_bytes(data, received.bytes.data(), received.bytes.size());
    }

    void barrier(int rank, const group& g) {
        run_collective(rank, collective_call{collective::barrier, dtype::f32, 0, -1}, g, nullptr,
                       nullptr);
    }

    // Fails the world; returns true if this was its first failure.
    bool abort(int rank, std::string reason) {
        std::unique_lock lock(mutex_);
        return fail_world(lock, rank, std::move(reason));
    }

    // The rank whose failure failed the world, if it has failed.
    std::optional<int> failed_rank() const {
        std::lock_guard lock(mutex_);
        if (!failure_) return std::nullopt;
        return failure_->rank;
    }

   private:
    enum class slot_phase : std::uint8_t { waiting, building, ready, failed };

    struct member_call {
        collective_call call;
        const void* in = nullptr;
    };

    // The k-th collective call on one group.
    struct collective_slot {
        std::vector<std::optional<member_call>> calls;  // by position in the group
        std::size_t arrived = 0;
        std::size_t departed = 0;
        slot_phase phase = slot_phase::waiting;
        std::vector<std::byte> result;
    };

    struct group_channel {
        std::vector<std::uint64_t> next_call;  // by position: sequence number of its next call
        std::map<std::uint64_t, collective_slot> slots;
    };

    struct message {
        dtype type;
        std::size_t count;
        std::vector<std::byte> bytes;
    };

    struct world_failure {
        int rank;
        std::string reason;
    };

    // Runs without the lock: every member has arrived and waits until phase is ready, so
    // all inputs stay valid and nobody else touches slot.result.
    static void build_result(collective_slot& slot, const collective_call& call,
                             const group& g) {
        const std::size_t members = g.ranks.size();
        const std::size_t element = size_of(call.type);
        const std::size_t chunk_bytes = call.count * element;
        const auto input = [&](std::size_t member) {
            return static_cast<const std::byte*>(slot.calls[member]->in);
        };
        switch (call.op) {
            case collective::all_reduce_sum:
            case collective::reduce_scatter_sum: {
                const std::size_t count =
                    call.op == collective::all_reduce_sum ? call.count : call.count * members;
                slot.result.resize(count * element);
                copy_bytes(slot.result.data(), input(0), slot.result.size());
                for (std::size_t member = 1; member < members; ++member) {
                    add_into(call.type, slot.result.data(), input(member), count);
                }
                break;
            }
            case collective::all_gather:
                slot.result.resize(members * chunk_bytes);
                for (std::size_t member = 0; member < members; ++member) {
                    copy_bytes(slot.result.data() + member * chunk_bytes, input(member),
                               chunk_bytes);
                }
                break;
            case collective::all_to_all:
                // Laid out by receiver: block j holds what member j receives, in sender order.
                slot.result.resize(members * members * chunk_bytes);
                for (std::size_t receiver = 0; receiver < members; ++receiver) {
                    for (std::size_t sender = 0; sender < members; ++sender) {
                        copy_bytes(slot.result.data() + (receiver * members + sender) * chunk_bytes,
                                   input(sender) + receiver * chunk_bytes, chunk_bytes);
                    }
                }
                break;
            case collective::broadcast:
                // A copy, because the root may return (and reuse its buffer) before the
                // others have copied.
                slot.result.resize(chunk_bytes);
                copy_bytes(slot.result.data(),
                           input(static_cast<std::size_t>(g.index_of(call.root))), chunk_bytes);
                break;
            case collective::barrier:
                break;
        }
    }

    static void copy_result_out(const collective_slot& slot, const collective_call& call,
                                const group& g, std::size_t me, void* out) {
        const std::size_t members = g.ranks.size();
        const std::size_t chunk_bytes = call.count * size_of(call.type);
        switch (call.op) {
            case collective::all_reduce_sum:
            case collective::all_gather:
                copy_bytes(out, slot.result.data(), slot.result.size());
                break;
            case collective::reduce_scatter_sum:
                copy_bytes(out, slot.result.data() + me * chunk_bytes, chunk_bytes);
                break;
            case collective::all_to_all:
                copy_bytes(out, slot.result.data() + me * members * chunk_bytes,
                           members * chunk_bytes);
                break;
            case collective::broadcast:
                if (g.ranks[me] != call.root) copy_bytes(out, slot.result.data(), chunk_bytes);
                break;
            case collective::barrier:
                break;
        }
    }

    // Records the first failure and wakes every waiter; returns true if it was the first.
    // A reason that starts with "rank R: " for this rank is stored without that prefix.
    bool fail_world(std::unique_lock<std::mutex>&, int rank, std::string reason) {
        if (failure_) return false;
        const std::string own_prefix = "rank " + std::to_string(rank) + ": ";
        if (reason.starts_with(own_prefix)) reason.erase(0, own_prefix.size());
        failure_ = world_failure{rank, std::move(reason)};
        changed_.notify_all();
        return true;
    }

    std::string failure_message(const std::string& where) const {
        return where + ": rank " + std::to_string(failure_->rank) + " failed: " +
               failure_->reason;
    }

    void throw_if_failed(std::unique_lock<std::mutex>&, const std::string& where) const {
        if (failure_) {
            throw comm_error(failure_message(where) +
                             " (the world has failed; no further communication is possible)");
        }
    }

    int size_;
    comm_options options_;
    mutable std::mutex mutex_;
    std::condition_variable changed_;
    std::map<std::vector<int>, group_channel> channels_;
    std::map<std::tuple<int, int, int>, std::deque<message>> mailboxes_;  // (src, dst, tag)
    std::optional<world_failure> failure_;
};

}  // namespace detail

// ---- the communicator of one rank -------------------------------------------------------

class in_process_communicator final : public communicator {
   public:
    in_process_communicator(detail::in_process_state& state, int rank)
        : state_(&state), rank_(rank) {}

    using communicator::all_gather;
    using communicator::all_reduce_sum;
    using communicator::all_to_all;
    using communicator::broadcast;
    using communicator::recv;
    using communicator::reduce_scatter_sum;
    using communicator::send;

    int rank() const override { return rank_; }
    int size() const override { return state_->size(); }

    void all_reduce_sum(void* data, std::size_t count, dtype type, const group& g) override {
        collective(detail::collective_call{detail::collective::all_reduce_sum, type, count, -1},
                   g, data, data);
    }

    void all_gather(const void* in, void* out, std::size_t count_per_rank, dtype type,
                    const group& g) override {
        collective(
            detail::collective_call{detail::collective::all_gather, type, count_per_rank, -1}, g,
            in, out);
    }

    void reduce_scatter_sum(const void* in, void* out, std::size_t count_per_rank, dtype type,
                            const group& g) override {
        collective(detail::collective_call{detail::collective::reduce_scatter_sum, type,
                                           count_per_rank, -1},
                   g, in, out);
    }

    void all_to_all(const void* in, void* out, std::size_t count_per_rank, dtype type,
                    const group& g) override {
        collective(
            detail::collective_call{detail::collective::all_to_all, type, count_per_rank, -1}, g,
            in, out);
    }

    void broadcast(void* data, std::size_t count, dtype type, int root_global_rank,
                   const group& g) override {
        collective(detail::collective_call{detail::collective::broadcast, type, count,
                                           root_global_rank},
                   g, data, data);
    }

    void send(const void* data, std::size_t count, dtype type, int dst_global_rank,
              int tag) override {
        detail::check_point_to_point(rank_, size(), "send", type, count, dst_global_rank, tag,
                                     data);
        state_->send(rank_, data, count, type, dst_global_rank, tag);
    }

    void recv(void* data, std::size_t count, dtype type, int src_global_rank, int tag) override {
        detail::check_point_to_point(rank_, size(), "recv", type, count, src_global_rank, tag,
                                     data);
        state_->recv(rank_, data, count, type, src_global_rank, tag);
    }

    void barrier(const group& g) override {
        collective(detail::collective_call{detail::collective::barrier, dtype::f32, 0, -1}, g,
                   nullptr, nullptr);
    }

    void abort(std::string reason) override { state_->abort(rank_, std::move(reason)); }

   private:
    void collective(const detail::collective_call& call, const group& g, const void* in,
                    void* out) {
        detail::check_collective(rank_, size(), call, g, in, out);
        state_->run_collective(rank_, call, g, in, out);
    }

    detail::in_process_state* state_;
    int rank_;
};

static_assert(communicator_like<in_process_communicator>);

// ---- the world --------------------------------------------------------------------------

// n ranks in one process; rank(r) is the communicator the thread playing rank r uses.
class in_process_world {
   public:
    explicit in_process_world(int n, comm_options options = {})
        : state_(std::make_unique<detail::in_process_state>(checked_size(n), options)) {
        ranks_.reserve(static_cast<std::size_t>(n));
        for (int r = 0; r < n; ++r) {
            ranks_.push_back(std::make_unique<in_process_communicator>(*state_, r));
        }
    }

    int size() const noexcept { return state_->size(); }
    const comm_options& options() const noexcept { return state_->options(); }

    in_process_communicator& rank(int r) {
        if (r < 0 || r >= size()) {
            throw usage_error("in_process_world::rank: rank " + std::to_string(r) +
                              " is outside the world of " + std::to_string(size()) +
                              " ranks; pass a rank in [0, " + std::to_string(size()) + ")");
        }
        return *ranks_[static_cast<std::size_t>(r)];
    }

    // The rank whose failure (timeout, mismatch, abort) failed the world, if any.
    std::optional<int> failed_rank() const { return state_->failed_rank(); }

   private:
    static int checked_size(int n) {
        if (n < 1) {
            throw usage_error("in_process_world: n = " + std::to_string(n) +
                              "; a world holds at least one rank");
        }
        return n;
    }

    std::unique_ptr<detail::in_process_state> state_;
    std::vector<std::unique_ptr<in_process_communicator>> ranks_;
};

// ---- running one function per rank ------------------------------------------------------

namespace detail {

template <class Error>
bool rethrow_prefixed_as(const std::exception& failure, const std::string& prefix) {
    if (dynamic_cast<const Error*>(&failure) == nullptr) return false;
    throw Error(prefix + failure.what());
}

// Rethrows a rank's failure as a loom error whose message starts with "rank R: ", keeping
// the loom error type. Other exceptions become loom::error.
[[noreturn]] inline void rethrow_rank_failure(const std::exception_ptr& failure, int rank) {
    const std::string prefix = "rank " + std::to_string(rank) + ": ";
    try {
        std::rethrow_exception(failure);
    } catch (const loom::error& error) {
        if (std::string_view(error.what()).starts_with(prefix)) throw;
        rethrow_prefixed_as<comm_error>(error, prefix);
        rethrow_prefixed_as<usage_error>(error, prefix);
        rethrow_prefixed_as<shape_error>(error, prefix);
        rethrow_prefixed_as<plan_error>(error, prefix);
        rethrow_prefixed_as<data_error>(error, prefix);
        throw loom::error(prefix + error.what());
    } catch (const std::exception& error) {
        throw loom::error(prefix + error.what());
    } catch (...) {
        throw loom::error(prefix + "threw an exception that is not a std::exception");
    }
}

LOOM_INLINE std::string describe_exception(const std::exception_ptr& failure);

}  // namespace detail

// Runs f(communicator&) for every rank of `world`, each on its own thread (so f is called
// concurrently and must allow that), and joins them.
// If a rank throws, the world is failed so the other ranks stop waiting, and once all
// threads have ended the root failure is rethrown: the exception of the rank that failed
// the world first (for a timeout, the rank that timed out), as a loom error whose message
// starts with "rank R: ".
template <class F>
void run_ranks(in_process_world& world, F f) {
    const int n = world.size();
    std::vector<std::exception_ptr> failures(static_cast<std::size_t>(n));
    std::vector<int> failure_order;  // ranks in the order their exceptions were caught
    std::mutex failures_mutex;
    {
        std::vector<std::jthread> threads;
        threads.reserve(static_cast<std::size_t>(n));
        for (int r = 0; r < n; ++r) {
            try {
                threads.emplace_back([&, r] {
                    in_process_communicator& own = world.rank(r);
                    try {
                        f(static_cast<communicator&>(own));
                    } catch (...) {
                        const std::exception_ptr failure = std::current_exception();
                        {
                            std::lock_guard lock(failures_mutex);
                            failures[static_cast<std::size_t>(r)] = failure;
                            failure_order.push_back(r);
                        }
                        own.abort(detail::describe_exception(failure));
                    }
                });
            } catch (const std::exception& error) {
                // Release the ranks already running before their threads are joined.
                world.rank(r).abort(std::string("could not start its thread: ") + error.what());
                throw;
            }
        }
    }  // the jthreads join here
    if (failure_order.empty()) return;
    const std::optional<int> root = world.failed_rank();
    const int culprit = root && failures[static_cast<std::size_t>(*root)] ? *root
                                                                          : failure_order.front();
    detail::rethrow_rank_failure(failures[static_cast<std::size_t>(culprit)], culprit);
}

template <class F>
void run_ranks(int n, F f, comm_options options = {}) {
    in_process_world world(n, options);
    run_ranks(world, std::move(f));
}

}  // namespace loom::comm

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::comm::detail {

LOOM_INLINE std::string describe_exception(const std::exception_ptr& failure) {
    try {
        std::rethrow_exception(failure);
    } catch (const std::exception& error) {
        return error.what();
    } catch (...) {
        return "an exception that is not a std::exception";
    }
}

}  // namespace loom::comm::detail
#endif  // LOOM_HEADER_DEFINITIONS
