#pragma once
// Alpha-beta costs of collectives on a cluster, split into latency and transmission so that
// overlap factors (TAPAS, section 4.6) discount only the transmission.
//
//   collective_time(dgx_a100(1), collective::all_reduce, 1e9, {.size = 8})
//     == 2*7/8 * 1e9 / 300e9 + 2*7 * 5e-6                      ring inside one node
//   collective_time(dgx1_v100(2), collective::all_reduce, 1e9, {.size = 16}, algorithm::hierarchical)
//     == reduce_scatter in each node + all_reduce of 1/8 across nodes + all_gather in each node
//
// `bytes` is the size of the whole buffer on one device: the output of an all_gather, the
// input of a reduce_scatter, the buffer of an all_reduce, broadcast or send_recv, the input
// (= output) of an all_to_all. With this convention ring all_gather + ring reduce_scatter
// cost exactly a ring all_reduce.
//
// Ranks are numbered node-major: rank r lives on node r / devices_per_node.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <string>
#include <map>
#include <span>
#include <string_view>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/search/hardware.hpp>

namespace loom::search {

// ring: one ring over all members, every step as slow as its slowest hop.
// hierarchical: inside each node, then across nodes on 1/k of the data (k members per
//   node), then inside each node again; defined for all_reduce, all_gather and
//   reduce_scatter, the other collectives have only the ring (or direct) form.
// automatic: the faster of the two.
enum class algorithm { ring, hierarchical, automatic };

// The ranks {first + i*stride : 0 <= i < size}. {.size = 8} is a node of a DGX; on DGX-1,
// {.size = 4, .stride = 8} puts one member on each of 4 nodes.
struct device_group {
    int size = 1;
    int stride = 1;
    int first = 0;
};

// How a group lies over nodes. Members per node can differ at the group's ends (first = 4,
// size = 8 on 8-device nodes: 4 and 4) or when the stride does not divide the node.
struct group_placement {
    int nodes = 1;         // nodes holding at least one member
    int min_per_node = 1;  // members on the emptiest of those nodes
    int max_per_node = 1;  // members on the fullest
    bool uniform() const { return min_per_node == max_per_node; }
};

LOOM_INLINE group_placement placement(const topology& t, device_group g);

// How an arbitrary set of ranks (a materialized transfer's group) lies over nodes.
LOOM_INLINE group_placement placement(const topology& t, std::span<const int> ranks);

inline int nodes_spanned(const topology& t, device_group g) { return placement(t, g).nodes; }

// Members on the fullest node; for uniform groups, the members of every node it spans.
inline int members_per_node(const topology& t, device_group g) { return placement(t, g).max_per_node; }

// Inter-node bandwidth of one member when `members` members of a node send across nodes at
// once: they share the node's NICs, and one member drives at most one NIC (on DGX machines
// each GPU is paired with one NIC on its PCIe switch), so a lone member gets one NIC, not all.
inline double inter_node_bandwidth_per_member(const topology& t, int members) {
    const double nic = t.inter_node_per_nic.bandwidth;
    return std::min(nic, t.nics_per_node * nic / members);
}

struct comm_time {
    double latency = 0;       // s: per-message latencies, not hidden by overlap
    double transmission = 0;  // s: bytes over bandwidth, which overlap can hide
    double total() const { return latency + transmission; }
};

inline comm_time operator+(comm_time a, comm_time b) {
    return {a.latency + b.latency, a.transmission + b.transmission};
}

namespace detail {

LOOM_INLINE void check_link(const cluster& c, const link& l, std::string_view field);

// One level of ring: n members, each step over a link of bandwidth bw and latency lat.
// all_to_all is here the direct exchange (each member sends (n-1)/n of its buffer); its
// n-1 rounds are charged one latency each.
LOOM_INLINE comm_time ring(collective c, double bytes, int n, double bw, double lat);

// `sharing`: how many groups of the same shape send across the same nodes at once (the
// data-parallel groups of every tensor-parallel rank); they share the nodes' NICs.
LOOM_INLINE comm_time ring_cost(const cluster& c, collective k, double bytes, int n, const group_placement& p, int sharing = 1);

inline bool has_hierarchical_form(collective k) {
    return k == collective::all_reduce || k == collective::all_gather || k == collective::reduce_scatter;
}

// k members on each of N nodes. Inside a node the k members reduce-scatter (or gather) the
// whole buffer; across nodes, the k members with the same local index each run a ring over
// the N nodes on their 1/k of the buffer, all k rings at once, sharing the node's NICs.
// all_gather + reduce_scatter == all_reduce holds here as for the ring.
LOOM_INLINE comm_time hierarchical_cost(const cluster& c, collective kind, double bytes, const group_placement& p,
                                        int sharing = 1);

}  // namespace detail

// Latency and transmission of one collective over `size` members placed as `p`. Size-1
// groups cost 0. algorithm::hierarchical on a group whose nodes hold different numbers of
// members throws; algorithm::automatic then uses the ring. For all_to_all, broadcast and
// send_recv the hierarchical form is the ring form. `sharing` groups of this shape cross
// the same nodes at once and share their NICs (1: this group alone).
LOOM_INLINE comm_time collective_cost(const cluster& c, collective kind, double bytes, int size, const group_placement& p,
                                      algorithm a = algorithm::automatic, int sharing = 1);

// The same over the ranks {first + i*stride}.
LOOM_INLINE comm_time collective_cost(const cluster& c, collective kind, double bytes, device_group g,
                                      algorithm a = algorithm::automatic);

inline double collective_time(const cluster& c, collective kind, double bytes, device_group g,
                              algorithm a = algorithm::automatic) {
    return collective_cost(c, kind, bytes, g, a).total();
}

// ---- overlap (TAPAS, section 4.6, eqs. 1-4) --------------------------------------------
//   T_latency = alpha' * W                                    not discounted
//   T_trans   = beta * (N_fwd + gamma * N_bwd) * epsilon        gamma, epsilon in (0, 1]
// gamma: the fraction of backward (gradient) transmission left exposed by overlapping it
// with the rest of the backward pass. epsilon: per collective, the fraction left by
// overlapping reduction and transfer inside the collective; found by profiling. An epsilon
// above 1 is accepted, for a collective measured slower than its alpha-beta estimate.
struct overlap_factors {
    double gamma = 1.0;
    std::array<double, 6> epsilon{1, 1, 1, 1, 1, 1};  // indexed by collective

    double epsilon_of(collective c) const { return epsilon[static_cast<std::size_t>(c)]; }
};

// Transmission times only: (forward + gamma * backward) * epsilon(c).
LOOM_INLINE double exposed_time(double forward_transmission, double backward_transmission, collective c,
                                const overlap_factors& f);

// Whole costs: both latencies in full, the transmissions discounted as above.
inline double exposed_time(const comm_time& forward, const comm_time& backward, collective c,
                           const overlap_factors& f) {
    return forward.latency + backward.latency + exposed_time(forward.transmission, backward.transmission, c, f);
}

}  // namespace loom::search

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::search {

LOOM_INLINE group_placement placement(const topology& t, device_group g) {
    if (t.devices_per_node < 1)
        throw profile_error("placement: topology has devices_per_node = " + std::to_string(t.devices_per_node) +
                            "; give at least 1");
    if (g.size < 1)
        throw usage_error("placement: device group of size " + std::to_string(g.size) +
                          "; a group has at least 1 member");
    if (g.stride < 1 || g.first < 0)
        throw usage_error("placement: device group with stride " + std::to_string(g.stride) + " and first rank " +
                          std::to_string(g.first) + "; the stride must be at least 1 and the first rank at least 0");
    const long long last = g.first + static_cast<long long>(g.size - 1) * g.stride;
    if (last >= t.devices())
        throw usage_error("placement: device group of size " + std::to_string(g.size) + ", stride " +
                          std::to_string(g.stride) + " from rank " + std::to_string(g.first) + " reaches rank " +
                          std::to_string(last) + " but the topology has " + std::to_string(t.devices()) +
                          " devices; shrink the group or its stride, or add nodes");
    // Ranks grow with i, so the members of one node are consecutive in i.
    group_placement p{.nodes = 0, .min_per_node = g.size, .max_per_node = 0};
    long long node = -1;
    int run = 0;
    for (int i = 0; i <= g.size; ++i) {
        const long long n = i < g.size ? (g.first + static_cast<long long>(i) * g.stride) / t.devices_per_node : -2;
        if (n == node) {
            ++run;
            continue;
        }
        if (run > 0) {
            ++p.nodes;
            p.min_per_node = std::min(p.min_per_node, run);
            p.max_per_node = std::max(p.max_per_node, run);
        }
        node = n;
        run = 1;
    }
    return p;
}

LOOM_INLINE group_placement placement(const topology& t, std::span<const int> ranks) {
    if (t.devices_per_node < 1)
        throw profile_error("placement: topology has devices_per_node = " + std::to_string(t.devices_per_node) +
                            "; give at least 1");
    if (ranks.empty()) throw usage_error("placement: an empty group of ranks; a group has at least 1 member");
    std::map<int, int> per_node;
    for (int r : ranks) {
        if (r < 0 || r >= t.devices())
            throw usage_error("placement: rank " + std::to_string(r) + " is outside the topology's " +
                              std::to_string(t.devices()) + " devices; plan for a cluster with at least " +
                              std::to_string(r + 1) + " devices");
        ++per_node[r / t.devices_per_node];
    }
    group_placement p{.nodes = static_cast<int>(per_node.size()), .min_per_node = static_cast<int>(ranks.size()),
                      .max_per_node = 0};
    for (auto [node, members] : per_node) {
        p.min_per_node = std::min(p.min_per_node, members);
        p.max_per_node = std::max(p.max_per_node, members);
    }
    return p;
}
}  // namespace loom::search

namespace loom::search::detail {

LOOM_INLINE void check_link(const cluster& c, const link& l, std::string_view field) {
    if (!(l.bandwidth > 0) || !std::isfinite(l.bandwidth) || !(l.latency >= 0) || !std::isfinite(l.latency))
        throw profile_error("collective_cost: cluster '" + c.name + "' has " + std::string(field) + " bandwidth " +
                            number_text(l.bandwidth) + " bytes/s and latency " + number_text(l.latency) +
                            " s; give a positive bandwidth and a non-negative latency");
}

LOOM_INLINE comm_time ring(collective c, double bytes, int n, double bw, double lat) {
    if (n <= 1) return {};
    const double steps = n - 1;
    const double share = steps / n;
    switch (c) {
        case collective::all_reduce: return {2 * steps * lat, 2 * share * bytes / bw};
        case collective::all_gather:
        case collective::reduce_scatter:
        case collective::all_to_all: return {steps * lat, share * bytes / bw};
        case collective::broadcast: return {steps * lat, bytes / bw};  // pipelined in small chunks
        case collective::send_recv: return {lat, bytes / bw};
    }
    return {};
}

LOOM_INLINE comm_time ring_cost(const cluster& c, collective k, double bytes, int n, const group_placement& p, int sharing) {
    const topology& t = c.topo;
    if (p.nodes == 1) return ring(k, bytes, n, t.intra_link(k).bandwidth, t.intra_link(k).latency);
    const link& nic = t.inter_node_per_nic;
    if (k == collective::send_recv) return ring(k, bytes, n, inter_node_bandwidth_per_member(t, sharing), nic.latency);
    if (k == collective::all_to_all) {
        // Each member sends (n-m)/n of its buffer off its node (sharing the node's NICs with
        // the node's m members) and (m-1)/n to its node's members, both at once. Evaluated at
        // the emptiest and the fullest node, the worse of the two.
        auto transmission = [&](int m) {
            const double off_node = (n - m) * bytes / n / inter_node_bandwidth_per_member(t, m * sharing);
            const double on_node = (m - 1) * bytes / n / t.intra_link(k).bandwidth;
            return std::max(off_node, on_node);
        };
        return {(n - 1) * nic.latency, std::max(transmission(p.min_per_node), transmission(p.max_per_node))};
    }
    // A ring crosses each node boundary once per step, so a node sends as much across nodes
    // as one member sends in total. NCCL runs several rings that cross at different members,
    // so the crossing uses min(members, NICs) NICs of the emptiest node. Every step waits for
    // its slowest hop: the crossing, or an NVLink hop when the crossing is faster.
    const int m = p.min_per_node;
    double bw = m * inter_node_bandwidth_per_member(t, m * sharing);
    if (p.max_per_node > 1) bw = std::min(bw, t.intra_link(k).bandwidth);
    return ring(k, bytes, n, bw, nic.latency);
}

LOOM_INLINE comm_time hierarchical_cost(const cluster& c, collective kind, double bytes, const group_placement& p,
                                        int sharing) {
    const topology& t = c.topo;
    const int k = p.max_per_node;
    const int nodes = p.nodes;
    // Inside a node each part runs at its own collective's link.
    auto inside = [&](collective part, double b) {
        const link& l = t.intra_link(part);
        return ring(part, b, k, l.bandwidth, l.latency);
    };
    const double inter_bw = inter_node_bandwidth_per_member(t, k * sharing), inter_lat = t.inter_node_per_nic.latency;
    const double shard = bytes / k;
    switch (kind) {
        case collective::all_reduce:
            return inside(collective::reduce_scatter, bytes) + ring(collective::all_reduce, shard, nodes, inter_bw, inter_lat) +
                   inside(collective::all_gather, bytes);
        case collective::all_gather:
            return ring(collective::all_gather, shard, nodes, inter_bw, inter_lat) +
                   inside(collective::all_gather, bytes);
        case collective::reduce_scatter:
            return inside(collective::reduce_scatter, bytes) +
                   ring(collective::reduce_scatter, shard, nodes, inter_bw, inter_lat);
        default: return {};
    }
}
}  // namespace loom::search::detail

namespace loom::search {

LOOM_INLINE comm_time collective_cost(const cluster& c, collective kind, double bytes, int size, const group_placement& p,
                                      algorithm a, int sharing) {
    if (!(bytes >= 0) || !std::isfinite(bytes))
        throw usage_error("collective_cost: " + std::string(to_string(kind)) + " of " + detail::number_text(bytes) +
                          " bytes; give a finite, non-negative size in bytes");
    if (kind == collective::send_recv && size > 2)
        throw usage_error("collective_cost: send_recv over a group of " + std::to_string(size) +
                          " devices; a send_recv is between 2 devices, give {.size = 2, .stride = <distance>}");
    if (sharing < 1)
        throw usage_error("collective_cost: " + std::to_string(sharing) +
                          " groups sharing the NICs; give at least 1 (the group itself)");
    if (size == 1) return {};
    detail::check_link(c, c.topo.intra_node, "topology.intra_node");
    if (p.nodes > 1) {
        detail::check_link(c, c.topo.inter_node_per_nic, "topology.inter_node_per_nic");
        if (c.topo.nics_per_node < 1)
            throw profile_error("collective_cost: cluster '" + c.name + "' has " +
                                std::to_string(c.topo.nics_per_node) +
                                " NICs per node but the group spans nodes; give at least 1 NIC per node");
    }
    const comm_time ring = detail::ring_cost(c, kind, bytes, size, p, sharing);
    if (a == algorithm::ring || !detail::has_hierarchical_form(kind)) return ring;
    if (!p.uniform()) {
        if (a == algorithm::automatic) return ring;
        throw usage_error("collective_cost: hierarchical " + std::string(to_string(kind)) +
                          " needs the same number of members on every node, but the group has " +
                          std::to_string(p.min_per_node) + " to " + std::to_string(p.max_per_node) +
                          "; use algorithm::ring or align the group to nodes");
    }
    const comm_time hierarchical = detail::hierarchical_cost(c, kind, bytes, p, sharing);
    if (a == algorithm::hierarchical) return hierarchical;
    return hierarchical.total() < ring.total() ? hierarchical : ring;
}

LOOM_INLINE comm_time collective_cost(const cluster& c, collective kind, double bytes, device_group g,
                                      algorithm a) {
    if (!(bytes >= 0) || !std::isfinite(bytes))
        throw usage_error("collective_cost: " + std::string(to_string(kind)) + " of " + detail::number_text(bytes) +
                          " bytes; give a finite, non-negative size in bytes");
    return collective_cost(c, kind, bytes, g.size, placement(c.topo, g), a);
}

LOOM_INLINE double exposed_time(double forward_transmission, double backward_transmission, collective c,
                                const overlap_factors& f) {
    if (!(f.gamma >= 0 && f.gamma <= 1))
        throw usage_error("exposed_time: gamma is " + detail::number_text(f.gamma) +
                          "; give the exposed fraction of backward transmission, between 0 and 1");
    const double epsilon = f.epsilon_of(c);
    if (!(epsilon > 0) || !std::isfinite(epsilon))
        throw usage_error("exposed_time: epsilon of " + std::string(to_string(c)) + " is " +
                          detail::number_text(epsilon) + "; give a positive factor (1: no overlap)");
    return (forward_transmission + f.gamma * backward_transmission) * epsilon;
}

}  // namespace loom::search
#endif  // LOOM_HEADER_DEFINITIONS
