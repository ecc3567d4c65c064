#pragma once
// The communicator interface: collectives and point-to-point transfers between the ranks
// of a training job, whatever carries them (threads of one process, MPI processes).
//
//   loom::comm::group all = c.world();                       // {0,1,...,size-1}
//   c.all_reduce_sum(std::span(gradients), all);              // in place
//   c.all_gather(shard, std::span(full), all);                // full = shards in rank order
//   c.send(std::span(activations), c.rank() + 1, /*tag=*/0);  // buffered, never blocks
//
// Laws (every implementation):
//  - A group lists global ranks, sorted ascending, and contains the caller. Every member of
//    a group makes the same collective calls on it, in the same order, with the same dtype
//    and counts; calls on different groups are independent.
//  - all_reduce_sum:      out_m           = in_0 + in_1 + ... + in_{n-1}        (every m)
//    reduce_scatter_sum:  out_m           = chunk m of (in_0 + in_1 + ... + in_{n-1})
//    all_gather:          out_m           = in_0 ++ in_1 ++ ... ++ in_{n-1}
//    all_to_all:          chunk i of out_j = chunk j of in_i
//    broadcast:           data_m          = data_root
//    where members are numbered by their position in the group and chunks all hold
//    count_per_rank elements.
//  - Sums are deterministic: element k is ((in_0[k] + in_1[k]) + in_2[k]) + ..., always in
//    group order, and every member receives bitwise the same result. Replicated weights
//    therefore stay identical across ranks and across runs. Integer sums wrap around
//    (two's complement) instead of overflowing.
//  - send copies the data before it returns and never waits for the receiver, so ranks
//    that send to each other and then receive cannot deadlock. Messages between one pair
//    of ranks with one tag arrive in the order they were sent.
//  - A collective, barrier or recv that waits longer than comm_options::timeout throws
//    comm_error. After any comm_error the job is broken: the in-process world fails every
//    later call, an MPI program should exit (mpirun then stops the other ranks).
//
// Threading contract: one communicator object stands for one rank and is used by one
// thread at a time; different ranks' communicators may be used concurrently.
#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <loom/core/bfloat16.hpp>
#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>

namespace loom::comm {

// ---- element types ----------------------------------------------------------------------

// bf16 carries mixed-precision gradients and weights between GPUs; its sums are rounded to
// bf16 after each addition (in float), as NCCL's are.
enum class dtype : std::uint8_t { f32, f64, i32, i64, bf16 };

// The element types a communicator moves; dtype_of<T>() names them at run time.
template <class T>
concept comm_element = std::same_as<T, float> || std::same_as<T, double> ||
                       std::same_as<T, std::int32_t> || std::same_as<T, std::int64_t> ||
                       std::same_as<T, bfloat16>;

template <comm_element T>
constexpr dtype dtype_of() noexcept {
    if constexpr (std::same_as<T, float>) return dtype::f32;
    else if constexpr (std::same_as<T, double>) return dtype::f64;
    else if constexpr (std::same_as<T, std::int32_t>) return dtype::i32;
    else if constexpr (std::same_as<T, bfloat16>) return dtype::bf16;
    else return dtype::i64;
}

constexpr std::size_t size_of(dtype type) noexcept {
    switch (type) {
        case dtype::f32: return 4;
        case dtype::f64: return 8;
        case dtype::i32: return 4;
        case dtype::i64: return 8;
        case dtype::bf16: return 2;
    }
    return 0;
}

constexpr std::string_view to_string(dtype type) noexcept {
    switch (type) {
        case dtype::f32: return "f32";
        case dtype::f64: return "f64";
        case dtype::i32: return "i32";
        case dtype::i64: return "i64";
        case dtype::bf16: return "bf16";
    }
    return "unknown dtype";
}

static_assert(dtype_of<float>() == dtype::f32 && size_of(dtype_of<double>()) == sizeof(double));

// ---- groups -----------------------------------------------------------------------------

// The ranks taking part in a collective, as global ranks sorted ascending. A member's
// position in `ranks` (index_of) is its place in results: chunk order, summation order.
struct group {
    std::vector<int> ranks;

    // {0, 1, ..., n-1}
    static group world(int n) {
        if (n < 1) {
            throw usage_error("group::world: n = " + std::to_string(n) +
                              "; a world holds at least one rank");
        }
        group all;
        all.ranks.resize(static_cast<std::size_t>(n));
        for (int r = 0; r < n; ++r) all.ranks[static_cast<std::size_t>(r)] = r;
        return all;
    }

    int size() const noexcept { return static_cast<int>(ranks.size()); }

    bool contains(int rank) const noexcept {
        return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
    }

    // Position of `rank` in the group: group{{2,5,7}}.index_of(5) == 1.
    int index_of(int rank) const {
        const auto found = std::find(ranks.begin(), ranks.end(), rank);
        if (found == ranks.end()) {
            throw usage_error("group::index_of: rank " + std::to_string(rank) +
                              " is not in group " + to_string() +
                              "; pass a rank that is a member of the group");
        }
        return static_cast<int>(found - ranks.begin());
    }

    // "{0,1,2,3}"
    std::string to_string() const {
        std::string text = "{";
        for (std::size_t i = 0; i < ranks.size(); ++i) {
            if (i > 0) text += ',';
            text += std::to_string(ranks[i]);
        }
        return text + "}";
    }

    friend bool operator==(const group&, const group&) = default;
};

struct comm_options {
    // How long a collective, barrier or recv waits for the other side before it throws.
    std::chrono::milliseconds timeout{60000};
};

// ---- helpers shared by the implementations ----------------------------------------------

namespace detail {

enum class collective : std::uint8_t {
    all_reduce_sum,
    all_gather,
    reduce_scatter_sum,
    all_to_all,
    broadcast,
    barrier,
};

constexpr std::string_view to_string(collective op) noexcept {
    switch (op) {
        case collective::all_reduce_sum: return "all_reduce_sum";
        case collective::all_gather: return "all_gather";
        case collective::reduce_scatter_sum: return "reduce_scatter_sum";
        case collective::all_to_all: return "all_to_all";
        case collective::broadcast: return "broadcast";
        case collective::barrier: return "barrier";
    }
    return "unknown collective";
}

// One member's view of a collective call: what must agree between members.
struct collective_call {
    collective op = collective::barrier;
    dtype type = dtype::f32;
    std::size_t count = 0;  // elements; per rank (chunk size) for gather/scatter/all_to_all
    int root = -1;          // broadcast only: global rank of the source

    friend bool operator==(const collective_call&, const collective_call&) = default;
};

constexpr bool counts_per_rank(collective op) noexcept {
    return op == collective::all_gather || op == collective::reduce_scatter_sum ||
           op == collective::all_to_all;
}

// "all_reduce_sum (f32, 1024 elements)", "all_gather (f64, 4 elements per rank)",
// "broadcast (i32, 8 elements from rank 3)", "barrier"
LOOM_INLINE std::string describe(const collective_call& call);

// "rank 2: all_reduce_sum (f32, 1024 elements) on group {0,1,2,3}"
inline std::string context(int rank, const collective_call& call, const group& g) {
    return "rank " + std::to_string(rank) + ": " + describe(call) + " on group " + g.to_string();
}

// "rank 1: send (f32, 8 elements) to rank 2 with tag 0"
LOOM_INLINE std::string context(int rank, std::string_view op, dtype type, std::size_t count,
                                int peer, int tag);

// The ranks of `g` for which `arrived(index)` is false, as "{3,5}".
template <class Arrived>
std::string missing_members(const group& g, Arrived arrived) {
    group missing;
    for (int i = 0; i < g.size(); ++i) {
        if (!arrived(i)) missing.ranks.push_back(g.ranks[static_cast<std::size_t>(i)]);
    }
    return missing.to_string();
}

// Checks what every implementation requires of a collective call; throws usage_error.
LOOM_INLINE void check_collective(int rank, int world_size, const collective_call& call,
                                  const group& g, const void* in, const void* out);

LOOM_INLINE void check_point_to_point(int rank, int world_size, std::string_view op, dtype type,
                                      std::size_t count, int peer, int tag, const void* data);

template <comm_element T>
void add_into(T* sum, const T* term, std::size_t count) noexcept {
    if constexpr (std::is_integral_v<T>) {
        // Unsigned arithmetic wraps; converting back is modular since C++20.
        using U = std::make_unsigned_t<T>;
        for (std::size_t k = 0; k < count; ++k) {
            sum[k] = static_cast<T>(static_cast<U>(sum[k]) + static_cast<U>(term[k]));
        }
    } else if constexpr (std::same_as<T, bfloat16>) {
        for (std::size_t k = 0; k < count; ++k) sum[k] = bfloat16(static_cast<float>(sum[k]) + static_cast<float>(term[k]));
    } else {
        for (std::size_t k = 0; k < count; ++k) sum[k] += term[k];
    }
}

// sum[k] += term[k] for `count` elements of `type`. Called once per member in group order,
// this is the one place that fixes the summation order for every implementation.
LOOM_INLINE void add_into(dtype type, void* sum, const void* term, std::size_t count) noexcept;

inline void copy_bytes(void* to, const void* from, std::size_t bytes) noexcept {
    if (bytes > 0) std::memcpy(to, from, bytes);
}

}  // namespace detail

// ---- the interface ----------------------------------------------------------------------

class communicator {
   public:
    virtual ~communicator() = default;

    // This rank's global rank, and the number of ranks in the world.
    virtual int rank() const = 0;
    virtual int size() const = 0;

    group world() const { return group::world(size()); }

    // Type-erased operations: `count` and `count_per_rank` are element counts of `type`.
    // Input and output buffers of one call must not overlap (all_reduce_sum and broadcast
    // work in place on one buffer).

    // data (count elements) = sum over members, in group order.
    virtual void all_reduce_sum(void* data, std::size_t count, dtype type, const group& g) = 0;
    // out (g.size() * count_per_rank) = the members' inputs concatenated in group order.
    virtual void all_gather(const void* in, void* out, std::size_t count_per_rank, dtype type,
                            const group& g) = 0;
    // in (g.size() * count_per_rank); out (count_per_rank) = chunk index_of(rank()) of the sum.
    virtual void reduce_scatter_sum(const void* in, void* out, std::size_t count_per_rank,
                                    dtype type, const group& g) = 0;
    // in and out (g.size() * count_per_rank): chunk j of member i's in -> chunk i of member
    // j's out.
    virtual void all_to_all(const void* in, void* out, std::size_t count_per_rank, dtype type,
                            const group& g) = 0;
    // data (count) on every member = data on the member whose global rank is root_global_rank.
    virtual void broadcast(void* data, std::size_t count, dtype type, int root_global_rank,
                           const group& g) = 0;
    // Copies the data and returns without waiting for the receiver.
    virtual void send(const void* data, std::size_t count, dtype type, int dst_global_rank,
                      int tag) = 0;
    // Waits for the next message from src with this tag; its dtype and count must match.
    virtual void recv(void* data, std::size_t count, dtype type, int src_global_rank,
                      int tag) = 0;
    // Returns once every member has entered the barrier.
    virtual void barrier(const group& g) = 0;
    // Tells the other ranks that this rank failed, so they stop waiting for it.
    virtual void abort(std::string reason) = 0;

    // Typed forms: the dtype comes from the element type, and buffer sizes are checked.
    // Inputs accept anything that converts to std::span<const T> (a vector, an array).

    template <comm_element T>
    void all_reduce_sum(std::span<T> data, const group& g) {
        all_reduce_sum(data.data(), data.size(), dtype_of<T>(), g);
    }

    template <comm_element T>
    void all_gather(std::span<const std::type_identity_t<T>> in, std::span<T> out,
                    const group& g) {
        require_size(detail::collective::all_gather, dtype_of<T>(), in.size(), g, "output",
                     out.size(), in.size() * g.ranks.size(),
                     "size the output to in.size() * g.size()");
        all_gather(in.data(), out.data(), in.size(), dtype_of<T>(), g);
    }

    template <comm_element T>
    void reduce_scatter_sum(std::span<const std::type_identity_t<T>> in, std::span<T> out,
                            const group& g) {
        require_size(detail::collective::reduce_scatter_sum, dtype_of<T>(), out.size(), g,
                     "input", in.size(), out.size() * g.ranks.size(),
                     "size the input to out.size() * g.size()");
        reduce_scatter_sum(in.data(), out.data(), out.size(), dtype_of<T>(), g);
    }

    template <comm_element T>
    void all_to_all(std::span<const std::type_identity_t<T>> in, std::span<T> out,
                    const group& g) {
        const std::size_t members = std::max<std::size_t>(g.ranks.size(), 1);
        const std::size_t chunk = in.size() / members;
        require_size(detail::collective::all_to_all, dtype_of<T>(), chunk, g, "input",
                     in.size(), chunk * members,
                     "size the input to a multiple of g.size() (one chunk per member)");
        require_size(detail::collective::all_to_all, dtype_of<T>(), chunk, g, "output",
                     out.size(), in.size(), "size the output like the input");
        all_to_all(in.data(), out.data(), chunk, dtype_of<T>(), g);
    }

    template <comm_element T>
    void broadcast(std::span<T> data, int root_global_rank, const group& g) {
        broadcast(data.data(), data.size(), dtype_of<T>(), root_global_rank, g);
    }

    // T may be const: send(std::span(const_vector), ...).
    template <class T>
        requires comm_element<std::remove_const_t<T>>
    void send(std::span<T> data, int dst_global_rank, int tag) {
        send(data.data(), data.size(), dtype_of<std::remove_const_t<T>>(), dst_global_rank, tag);
    }

    template <comm_element T>
    void recv(std::span<T> data, int src_global_rank, int tag) {
        recv(data.data(), data.size(), dtype_of<T>(), src_global_rank, tag);
    }

   protected:
    communicator() = default;
    communicator(const communicator&) = default;
    communicator& operator=(const communicator&) = default;

   private:
    void require_size(detail::collective op, dtype type, std::size_t count_per_rank,
                      const group& g, std::string_view which, std::size_t actual,
                      std::size_t expected, std::string_view fix) const {
        if (actual == expected) return;
        const detail::collective_call call{op, type, count_per_rank, -1};
        throw usage_error(detail::context(rank(), call, g) + ": the " + std::string(which) +
                          " holds " + std::to_string(actual) + " elements but needs " +
                          std::to_string(expected) + "; " + std::string(fix));
    }
};

// The typed interface, as code that is generic over the backend uses it.
template <class C>
concept communicator_like =
    requires(C& c, const C& const_c, const group& g, std::span<float> data,
             std::span<const float> input, int peer, int tag, std::string reason) {
        { const_c.rank() } -> std::same_as<int>;
        { const_c.size() } -> std::same_as<int>;
        c.all_reduce_sum(data, g);
        c.all_gather(input, data, g);
        c.reduce_scatter_sum(input, data, g);
        c.all_to_all(input, data, g);
        c.broadcast(data, peer, g);
        c.send(input, peer, tag);
        c.recv(data, peer, tag);
        c.barrier(g);
        c.abort(reason);
    };

static_assert(communicator_like<communicator>);

}  // namespace loom::comm

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::comm::detail {

LOOM_INLINE std::string describe(const collective_call& call) {
    std::string text(to_string(call.op));
    if (call.op == collective::barrier) return text;
    text += " (";
    text += to_string(call.type);
    text += ", " + std::to_string(call.count) + (call.count == 1 ? " element" : " elements");
    if (counts_per_rank(call.op)) text += " per rank";
    if (call.op == collective::broadcast) text += " from rank " + std::to_string(call.root);
    return text + ")";
}

LOOM_INLINE std::string context(int rank, std::string_view op, dtype type, std::size_t count,
                                int peer, int tag) {
    std::string text = "rank " + std::to_string(rank) + ": " + std::string(op) + " (";
    text += to_string(type);
    text += ", " + std::to_string(count) + (count == 1 ? " element" : " elements") + ") ";
    text += op == "send" ? "to" : "from";
    return text + " rank " + std::to_string(peer) + " with tag " + std::to_string(tag);
}

LOOM_INLINE void check_collective(int rank, int world_size, const collective_call& call,
                                  const group& g, const void* in, const void* out) {
    const auto fail = [&](const std::string& why) {
        throw usage_error(context(rank, call, g) + ": " + why);
    };
    if (g.ranks.empty()) {
        fail("the group is empty; list the ranks that take part, e.g. group::world(size())");
    }
    for (std::size_t i = 0; i < g.ranks.size(); ++i) {
        const int member = g.ranks[i];
        if (member < 0 || member >= world_size) {
            fail("rank " + std::to_string(member) + " is outside the world of " +
                 std::to_string(world_size) + " ranks; use global ranks in [0, " +
                 std::to_string(world_size) + ")");
        }
        if (i > 0 && g.ranks[i - 1] >= member) {
            fail("ranks must be sorted ascending without repeats; sort the rank list and drop "
                 "duplicates");
        }
    }
    if (!g.contains(rank)) {
        fail("rank " + std::to_string(rank) +
             " is not a member; call a collective only on groups that contain the calling rank");
    }
    if (call.op == collective::broadcast && !g.contains(call.root)) {
        fail("root rank " + std::to_string(call.root) +
             " is not a member; pass the global rank of a member as the root");
    }
    if (call.count > 0 && call.op != collective::barrier && (in == nullptr || out == nullptr)) {
        fail("a buffer is null; pass buffers that hold the elements");
    }
}

LOOM_INLINE void check_point_to_point(int rank, int world_size, std::string_view op, dtype type,
                                      std::size_t count, int peer, int tag, const void* data) {
    const auto fail = [&](const std::string& why) {
        throw usage_error(context(rank, op, type, count, peer, tag) + ": " + why);
    };
    if (peer < 0 || peer >= world_size) {
        fail("rank " + std::to_string(peer) + " is outside the world of " +
             std::to_string(world_size) + " ranks; use a global rank in [0, " +
             std::to_string(world_size) + ")");
    }
    if (tag < 0) fail("tags must be non-negative; use a tag >= 0");
    if (count > 0 && data == nullptr) {
        fail("the buffer is null; pass a buffer that holds the elements");
    }
}

LOOM_INLINE void add_into(dtype type, void* sum, const void* term, std::size_t count) noexcept {
    switch (type) {
        case dtype::f32:
            add_into(static_cast<float*>(sum), static_cast<const float*>(term), count);
            break;
        case dtype::f64:
            add_into(static_cast<double*>(sum), static_cast<const double*>(term), count);
            break;
        case dtype::i32:
            add_into(static_cast<std::int32_t*>(sum), static_cast<const std::int32_t*>(term),
                     count);
            break;
        case dtype::i64:
            add_into(static_cast<std::int64_t*>(sum), static_cast<const std::int64_t*>(term),
                     count);
            break;
        case dtype::bf16:
            add_into(static_cast<bfloat16*>(sum), static_cast<const bfloat16*>(term), count);
            break;
    }
}

}  // namespace loom::comm::detail
#endif  // LOOM_HEADER_DEFINITIONS
