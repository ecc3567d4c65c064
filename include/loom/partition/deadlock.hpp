#pragma once
// Deadlock check for the device programs of a partitioned graph: do the programs, each
// run in its own order, always make progress?
//
// A transfer completes only when every member device reaches it (a collective waits for
// all of its members; a send/recv is one rendezvous, since the receiver waits for the
// sender). So the programs form one cross-device dependency graph:
//
//   vertices  one per transfer, shared by all of its member devices, and one per local op
//             (piece, assemble) of each device;
//   edges     program order (consecutive steps of each device) and data (the step that
//             produces a local tensor -> each step of the same device that reads it).
//
// An edge u -> v says "v waits for u". The programs deadlock exactly when this graph has a
// cycle, e.g. device 0 runs all_reduce A before all_reduce B while device 1 runs B before
// A. A send of a point-to-point transfer returns once its data is copied (both
// communicators buffer sends), so when the caller says which transfers are point to point,
// the sender's step is a local op of the sender that the receive waits for; otherwise a send
// waits for its receive too (the conservative model). apply_plan emits every transfer in one global order, so its programs pass by
// construction; the check guards reorderings (overlap schedules, pipelines, hand edits).
//
//   check_deadlock_free(pg)               the plan's op-order (pg.order, else graph order)
//   check_deadlock_free(pg, order)        order[d]: the node ids of device d, as it runs them
//   check_deadlock_free(programs, groups) the same over plain step sequences (tests reorder
//                                         these; see device_programs and transfer_groups)
// A cycle is reported as a plan_error that starts with "deadlock:" and names, with their
// devices, the ops on one cycle: the shortest through the first back edge the depth-first
// search meets (local ops between two transfers are listed, elided past five).
#include <algorithm>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/depth_first_search.hpp>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/graph.hpp>
#include <loom/partition/partitioned_graph.hpp>

namespace loom::partition {

// One step of one device's program.
struct program_step {
    std::int64_t id = 0;             // unique within the device (the node id in its graph); >= 0
    std::string name;                // shown in messages
    std::int64_t transfer = -1;      // the shared transfer this step takes part in; -1: a local op
    std::vector<std::int64_t> reads; // ids of the steps of the same device whose outputs it reads
};

// A device's steps in the order it runs them.
using device_program = std::vector<program_step>;

// The devices that must reach each transfer (pg.transfers[t].group).
LOOM_INLINE std::vector<std::vector<int>> transfer_groups(const partitioned_graph& pg);

namespace detail {

LOOM_INLINE std::int64_t transfer_index_of(const node& n, std::size_t transfers, int device);

}  // namespace detail

// The program of every device: its graph's nodes in `order[d]` (empty `order`: graph order).
LOOM_INLINE std::vector<device_program> device_programs(const partitioned_graph& pg,
                                                        const std::vector<std::vector<node_id>>& order = {});

namespace detail {

// Why one vertex waits for another.
struct wait_edge {
    int device = 0;
    bool data = false;  // reads the other's output; otherwise runs after it in program order
};

using wait_graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS, boost::no_property, wait_edge>;
using wait_vertex = boost::graph_traits<wait_graph>::vertex_descriptor;
using wait_edge_handle = boost::graph_traits<wait_graph>::edge_descriptor;

struct cycle_found {
    wait_edge_handle back_edge;
};

struct back_edge_finder : boost::default_dfs_visitor {
    void back_edge(wait_edge_handle e, const wait_graph&) const { throw cycle_found{e}; }
};

// The shortest cycle through edge `closing` (source -> target): a BFS path from its target
// back to its source, then the edge itself. Returns the edges in order.
LOOM_INLINE std::vector<wait_edge_handle> shortest_cycle_through(const wait_graph& g, wait_edge_handle closing);

}  // namespace detail

// Throws plan_error("deadlock: ...") when the programs can wait on each other forever:
// a cycle of waits, or a transfer that one of its member devices never reaches.
// point_to_point[t]: transfer t is a buffered send from groups[t][0] to groups[t][1].
LOOM_INLINE void check_deadlock_free(const std::vector<device_program>& programs, const std::vector<std::vector<int>>& groups,
                                     const std::vector<bool>& point_to_point = {});

namespace detail {

// Whether the programs of pg, each in `order[d]` (empty: graph order), surely make progress:
// every transfer reached exactly once by each member and by nothing else, and no cycle of
// waits (the same vertices and edges as check_deadlock_free's, in flat arrays, ordered
// topologically). False where anything is amiss, and check_deadlock_free then builds the
// named wait graph to say what: a search prices hundreds of plans whose programs pass, and
// naming every step of every device cost more than the check itself.
LOOM_INLINE bool surely_deadlock_free(const partitioned_graph& pg, const std::vector<std::vector<node_id>>& order);

}  // namespace detail

// The device programs of a partitioned graph, each in `order[d]` (empty: graph order).
inline void check_deadlock_free(const partitioned_graph& pg, const std::vector<std::vector<node_id>>& order) {
    if (detail::surely_deadlock_free(pg, order)) return;
    std::vector<bool> point_to_point;
    for (const auto& t : pg.transfers) point_to_point.push_back(t.kind == transfer_kind::send_recv);
    check_deadlock_free(device_programs(pg, order), transfer_groups(pg), point_to_point);
}

// In the plan's own op-order (pg.order; graph order where it is empty).
inline void check_deadlock_free(const partitioned_graph& pg) { check_deadlock_free(pg, pg.order); }

// A fingerprint of the op-order (0 for graph order), to tell an edited order from a checked one.
LOOM_INLINE std::uint64_t order_fingerprint(const partitioned_graph& pg);

// The check of programs whose order was set or edited by hand: every device runs each of its
// nodes exactly once, and the programs together make progress (each node after the
// producers of its inputs, collectives matched in an order that cannot deadlock). The
// trainers run it before their first step when pg.order is not the order apply_plan made
// (pg.checked_order = order_fingerprint(pg) after a check spares them the work).
LOOM_INLINE void check_programs(const partitioned_graph& pg);

}  // namespace loom::partition

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::partition {

LOOM_INLINE std::vector<std::vector<int>> transfer_groups(const partitioned_graph& pg) {
    std::vector<std::vector<int>> groups;
    groups.reserve(pg.transfers.size());
    for (const auto& t : pg.transfers) groups.push_back(t.group);
    return groups;
}
}  // namespace loom::partition

namespace loom::partition::detail {

LOOM_INLINE std::int64_t transfer_index_of(const node& n, std::size_t transfers, int device) {
    if (n.op == nullptr || !n.attrs.has("transfer")) return -1;
    const auto t = n.attrs.get<std::int64_t>("transfer");
    if (t < 0 || static_cast<std::size_t>(t) >= transfers)
        throw plan_error("check_deadlock_free: node '" + n.name + "' on device " + std::to_string(device) +
                         " names transfer " + std::to_string(t) + " but the plan has " + std::to_string(transfers) +
                         " transfers; the device graph and the transfer list come from different plans");
    return t;
}
}  // namespace loom::partition::detail

namespace loom::partition {

LOOM_INLINE std::vector<device_program> device_programs(const partitioned_graph& pg,
                                                        const std::vector<std::vector<node_id>>& order) {
    if (!order.empty() && order.size() != pg.devices.size())
        throw usage_error("check_deadlock_free: the order covers " + std::to_string(order.size()) +
                          " devices but the plan has " + std::to_string(pg.devices.size()) +
                          "; give one node order per device (or none)");
    std::vector<device_program> programs(pg.devices.size());
    for (std::size_t d = 0; d < pg.devices.size(); ++d) {
        const graph& g = pg.devices[d].ir();
        std::vector<node_id> ids;
        if (order.empty()) {
            ids.resize(g.nodes.size());
            for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<node_id>(i);
        } else {
            ids = order[d];
            std::vector<bool> seen(g.nodes.size(), false);
            for (node_id n : ids) {
                if (n < 0 || static_cast<std::size_t>(n) >= g.nodes.size() || seen[static_cast<std::size_t>(n)])
                    throw usage_error("check_deadlock_free: the order for device " + std::to_string(d) + " lists node " +
                                      std::to_string(n) + (n >= 0 && static_cast<std::size_t>(n) < g.nodes.size()
                                                               ? " twice"
                                                               : ", which its graph does not have") +
                                      "; list each of its " + std::to_string(g.nodes.size()) + " nodes once");
                seen[static_cast<std::size_t>(n)] = true;
            }
            if (ids.size() != g.nodes.size())
                throw usage_error("check_deadlock_free: the order for device " + std::to_string(d) + " lists " +
                                  std::to_string(ids.size()) + " of its " + std::to_string(g.nodes.size()) +
                                  " nodes; list each node once");
        }
        device_program& program = programs[d];
        program.reserve(ids.size());
        for (node_id n : ids) {
            const node& nd = g.at(n);
            program_step step;
            step.id = n;
            step.name = nd.name;
            step.transfer = detail::transfer_index_of(nd, pg.transfers.size(), static_cast<int>(d));
            for (tensor_id t : nd.inputs)
                if (node_id p = g.tensor(t).producer; p != no_id) step.reads.push_back(p);
            program.push_back(std::move(step));
        }
    }
    return programs;
}
}  // namespace loom::partition

namespace loom::partition::detail {

LOOM_INLINE std::vector<wait_edge_handle> shortest_cycle_through(const wait_graph& g, wait_edge_handle closing) {
    const wait_vertex from = boost::target(closing, g), to = boost::source(closing, g);
    std::vector<wait_edge_handle> arrived_by(boost::num_vertices(g));
    std::vector<bool> reached(boost::num_vertices(g), false);
    std::deque<wait_vertex> queue{from};
    reached[from] = true;
    while (!queue.empty() && !reached[to]) {
        const wait_vertex u = queue.front();
        queue.pop_front();
        for (auto [e, end] = boost::out_edges(u, g); e != end; ++e) {
            const wait_vertex v = boost::target(*e, g);
            if (reached[v]) continue;
            reached[v] = true;
            arrived_by[v] = *e;
            queue.push_back(v);
        }
    }
    std::vector<wait_edge_handle> cycle;
    for (wait_vertex v = to; v != from; v = boost::source(arrived_by[v], g)) cycle.push_back(arrived_by[v]);
    std::reverse(cycle.begin(), cycle.end());
    cycle.push_back(closing);
    return cycle;
}
}  // namespace loom::partition::detail

namespace loom::partition {

LOOM_INLINE void check_deadlock_free(const std::vector<device_program>& programs, const std::vector<std::vector<int>>& groups,
                                     const std::vector<bool>& point_to_point) {
    const std::size_t transfers = groups.size();
    auto buffered_sender = [&](std::int64_t t) {
        return t >= 0 && static_cast<std::size_t>(t) < point_to_point.size() && point_to_point[static_cast<std::size_t>(t)] &&
                       groups[static_cast<std::size_t>(t)].size() == 2
                   ? groups[static_cast<std::size_t>(t)][0]
                   : -1;
    };
    std::vector<std::size_t> send_vertex(transfers, static_cast<std::size_t>(-1));
    // Vertices: transfers first, then every local step of device 0, 1, ...
    std::vector<std::size_t> first_local(programs.size() + 1, transfers);
    for (std::size_t d = 0; d < programs.size(); ++d) first_local[d + 1] = first_local[d] + programs[d].size();
    const std::size_t vertices = first_local.back();

    // Where each transfer appears, to check membership and to name it.
    std::vector<std::vector<int>> reached_by(transfers);
    std::vector<std::string> transfer_name(transfers);
    for (std::size_t d = 0; d < programs.size(); ++d)
        for (const auto& step : programs[d]) {
            if (step.transfer < 0) continue;
            if (static_cast<std::size_t>(step.transfer) >= transfers)
                throw usage_error("check_deadlock_free: step '" + step.name + "' on device " + std::to_string(d) +
                                  " takes part in transfer " + std::to_string(step.transfer) + " but only " +
                                  std::to_string(transfers) + " transfer groups were given");
            auto& devices = reached_by[static_cast<std::size_t>(step.transfer)];
            if (std::find(devices.begin(), devices.end(), static_cast<int>(d)) != devices.end())
                throw plan_error("deadlock: device " + std::to_string(d) + " reaches '" + step.name +
                                 "' twice; each member takes part in a transfer exactly once");
            devices.push_back(static_cast<int>(d));
            if (transfer_name[static_cast<std::size_t>(step.transfer)].empty())
                transfer_name[static_cast<std::size_t>(step.transfer)] = step.name;
        }
    for (std::size_t t = 0; t < transfers; ++t) {
        const std::string name = transfer_name[t].empty() ? "transfer " + std::to_string(t) : "'" + transfer_name[t] + "'";
        for (int member : groups[t])
            if (std::find(reached_by[t].begin(), reached_by[t].end(), member) == reached_by[t].end())
                throw plan_error("deadlock: " + name + " waits for device " + std::to_string(member) +
                                 ", a member whose program never reaches it; add the transfer to that device's "
                                 "program or drop the device from the group");
        for (int d : reached_by[t])
            if (std::find(groups[t].begin(), groups[t].end(), d) == groups[t].end())
                throw plan_error("deadlock: device " + std::to_string(d) + " reaches " + name +
                                 ", whose group does not include it, so the members never wait for it; "
                                 "remove the step or add the device to the group");
    }

    std::vector<std::string> vertex_name(vertices);
    for (std::size_t t = 0; t < transfers; ++t) vertex_name[t] = transfer_name[t];

    detail::wait_graph g(vertices);
    for (std::size_t d = 0; d < programs.size(); ++d) {
        const device_program& program = programs[d];
        std::int64_t largest_id = -1;
        for (const auto& step : program) {
            if (step.id < 0)
                throw usage_error("check_deadlock_free: step '" + step.name + "' on device " + std::to_string(d) +
                                  " has id " + std::to_string(step.id) + "; ids must be non-negative");
            largest_id = std::max(largest_id, step.id);
        }
        constexpr std::size_t absent = static_cast<std::size_t>(-1);
        std::vector<std::size_t> vertex_of_id(static_cast<std::size_t>(largest_id + 1), absent);
        for (std::size_t s = 0; s < program.size(); ++s) {
            const program_step& step = program[s];
            const bool sends = step.transfer >= 0 && buffered_sender(step.transfer) == static_cast<int>(d);
            std::size_t v = step.transfer >= 0 && !sends ? static_cast<std::size_t>(step.transfer) : first_local[d] + s;
            if (sends) send_vertex[static_cast<std::size_t>(step.transfer)] = v;
            if (vertex_of_id[static_cast<std::size_t>(step.id)] != absent)
                throw usage_error("check_deadlock_free: device " + std::to_string(d) + " has two steps with id " +
                                  std::to_string(step.id) + "; give each step of a device its own id");
            vertex_of_id[static_cast<std::size_t>(step.id)] = v;
            if (v >= transfers) vertex_name[v] = step.name;
        }
        for (std::size_t s = 0; s < program.size(); ++s) {
            const program_step& step = program[s];
            const std::size_t v = vertex_of_id[static_cast<std::size_t>(step.id)];
            if (s > 0) boost::add_edge(vertex_of_id[static_cast<std::size_t>(program[s - 1].id)], v,
                                       detail::wait_edge{static_cast<int>(d), false}, g);
            for (std::int64_t r : step.reads) {
                if (r < 0 || r > largest_id || vertex_of_id[static_cast<std::size_t>(r)] == absent)
                    throw usage_error("check_deadlock_free: step '" + step.name + "' on device " + std::to_string(d) +
                                      " reads step " + std::to_string(r) + ", which that device's program lacks");
                boost::add_edge(vertex_of_id[static_cast<std::size_t>(r)], v, detail::wait_edge{static_cast<int>(d), true}, g);
            }
        }
    }

    // A receive waits for its buffered send.
    for (std::size_t t = 0; t < transfers; ++t)
        if (send_vertex[t] != static_cast<std::size_t>(-1))
            boost::add_edge(send_vertex[t], t, detail::wait_edge{buffered_sender(static_cast<std::int64_t>(t)), true}, g);

    std::vector<boost::default_color_type> colors(vertices);
    try {
        boost::depth_first_search(
            g, boost::visitor(detail::back_edge_finder{})
                   .color_map(boost::make_iterator_property_map(colors.begin(), boost::get(boost::vertex_index, g))));
        return;
    } catch (const detail::cycle_found& found) {
        std::vector<detail::wait_edge_handle> cycle = detail::shortest_cycle_through(g, found.back_edge);
        // Start the story at a transfer where there is one: cycles across devices pass through
        // transfers, and the local ops between two of them run on one device.
        auto starts_at_transfer = [&](const detail::wait_edge_handle& e) { return boost::source(e, g) < transfers; };
        if (auto it = std::find_if(cycle.begin(), cycle.end(), starts_at_transfer); it != cycle.end())
            std::rotate(cycle.begin(), it, cycle.end());

        auto quoted = [&](std::size_t v) { return "'" + vertex_name[v] + "'"; };
        bool crosses_devices = false;
        for (const auto& e : cycle) crosses_devices = crosses_devices || boost::source(e, g) < transfers;
        std::vector<std::string> lines;
        if (!crosses_devices) {
            for (const auto& e : cycle)
                lines.push_back("device " + std::to_string(g[e].device) + ": " + quoted(boost::target(e, g)) +
                                (g[e].data ? " reads the output of " : " runs after ") + quoted(boost::source(e, g)));
        } else {
            // One line per stretch between two transfers: "device d: 'B' waits for 'A' (...)";
            // the local ops of a stretch all run on one device.
            std::size_t i = 0;
            while (i < cycle.size()) {
                const std::size_t begin = boost::source(cycle[i], g);
                const int device = g[cycle[i]].device;
                bool through_data = g[cycle[i]].data;
                std::size_t end = boost::target(cycle[i], g);
                std::vector<std::size_t> between;
                for (++i; end >= transfers && i < cycle.size(); ++i) {
                    between.push_back(end);
                    through_data = through_data || g[cycle[i]].data;
                    end = boost::target(cycle[i], g);
                }
                std::string line = "device " + std::to_string(device) + ": " + quoted(end) + " waits for " + quoted(begin);
                if (between.empty()) {
                    line += through_data ? " (reads its output)" : " (runs after it)";
                } else {
                    line += " (runs after it, through " + std::to_string(between.size()) + " local op" +
                            (between.size() == 1 ? "" : "s") + ": ";
                    const std::size_t shown = between.size() <= 5 ? between.size() : 4;
                    for (std::size_t k = 0; k < shown; ++k) line += (k ? ", " : "") + quoted(between[k]);
                    if (shown < between.size()) line += ", ..., " + quoted(between.back());
                    line += ")";
                }
                lines.push_back(std::move(line));
            }
        }
        // Read against the edges: each line's subject is the previous line's object.
        std::reverse(lines.begin(), lines.end());
        std::string message = "deadlock: the device programs wait on each other in a cycle:";
        for (const auto& line : lines) message += "\n  " + line;
        message += crosses_devices
                       ? "\na transfer completes only when all of its member devices reach it, so none of these can run. "
                         "Fix: reorder the device programs so that every device reaches the transfers it shares in the "
                         "same relative order (apply_plan emits one global order), or change the placement so that "
                         "these ops do not share devices"
                       : "\na device runs an op before an op whose output it reads. Fix: reorder that device's program "
                         "so that producers run before their readers";
        throw plan_error(message);
    }
}

namespace detail {

LOOM_INLINE bool surely_deadlock_free(const partitioned_graph& pg, const std::vector<std::vector<node_id>>& order) {
    if (!order.empty() && order.size() != pg.devices.size()) return false;
    const std::size_t transfers = pg.transfers.size();
    std::size_t vertices = transfers;
    for (const device_part& part : pg.devices) vertices += part.ir().nodes.size();
    std::vector<std::uint32_t> reached(transfers, 0);  // members that reached each transfer
    std::vector<int> last_reached_by(transfers, -1);   // the last device that reached it
    std::vector<std::size_t> send_vertex(transfers, static_cast<std::size_t>(-1));
    std::vector<std::pair<std::size_t, std::size_t>> edges;  // (waited for, waiting)
    std::vector<std::size_t> vertex_of;                      // per node of one device
    std::size_t next_local = transfers;
    for (std::size_t d = 0; d < pg.devices.size(); ++d) {
        const graph& g = pg.devices[d].ir();
        const std::size_t count = g.nodes.size();
        if (!order.empty() && order[d].size() != count) return false;
        constexpr std::size_t absent = static_cast<std::size_t>(-1);
        vertex_of.assign(count, absent);
        std::size_t previous = absent;
        for (std::size_t s = 0; s < count; ++s) {
            const node_id id = order.empty() ? static_cast<node_id>(s) : order[d][s];
            if (id < 0 || static_cast<std::size_t>(id) >= count || vertex_of[static_cast<std::size_t>(id)] != absent) return false;
            const node& n = g.nodes[static_cast<std::size_t>(id)];
            std::size_t v = next_local++;
            if (n.op != nullptr && n.attrs.has("transfer")) {
                const auto t = n.attrs.get<std::int64_t>("transfer");
                if (t < 0 || static_cast<std::size_t>(t) >= transfers) return false;
                const transfer& tr = pg.transfers[static_cast<std::size_t>(t)];
                if (last_reached_by[static_cast<std::size_t>(t)] == static_cast<int>(d) ||
                    std::find(tr.group.begin(), tr.group.end(), static_cast<int>(d)) == tr.group.end())
                    return false;
                last_reached_by[static_cast<std::size_t>(t)] = static_cast<int>(d);
                ++reached[static_cast<std::size_t>(t)];
                const bool sends = tr.kind == transfer_kind::send_recv && tr.group.size() == 2 && tr.group[0] == static_cast<int>(d);
                if (sends)
                    send_vertex[static_cast<std::size_t>(t)] = v;
                else
                    v = static_cast<std::size_t>(t);
            }
            vertex_of[static_cast<std::size_t>(id)] = v;
            if (previous != absent) edges.emplace_back(previous, v);
            previous = v;
        }
        for (std::size_t i = 0; i < count; ++i)
            for (tensor_id t : g.nodes[i].inputs)
                if (node_id p = g.tensor(t).producer; p != no_id) edges.emplace_back(vertex_of[static_cast<std::size_t>(p)], vertex_of[i]);
    }
    // Each member reached each transfer, once (no device twice, none outside the group).
    for (std::size_t t = 0; t < transfers; ++t) {
        if (reached[t] != pg.transfers[t].group.size()) return false;
        if (send_vertex[t] != static_cast<std::size_t>(-1)) edges.emplace_back(send_vertex[t], t);
    }
    // Kahn's order over the edges, gathered per vertex.
    std::vector<std::size_t> first(vertices + 1, 0), waiting(edges.size());
    std::vector<std::uint32_t> waits_for(vertices, 0);
    for (const auto& [u, v] : edges) {
        ++first[u + 1];
        ++waits_for[v];
    }
    for (std::size_t v = 0; v < vertices; ++v) first[v + 1] += first[v];
    {
        std::vector<std::size_t> at(first.begin(), first.end() - 1);
        for (const auto& [u, v] : edges) waiting[at[u]++] = v;
    }
    std::vector<std::size_t> ready;
    for (std::size_t v = 0; v < vertices; ++v)
        if (waits_for[v] == 0) ready.push_back(v);
    std::size_t done = 0;
    while (!ready.empty()) {
        const std::size_t u = ready.back();
        ready.pop_back();
        ++done;
        for (std::size_t k = first[u]; k < first[u + 1]; ++k)
            if (--waits_for[waiting[k]] == 0) ready.push_back(waiting[k]);
    }
    return done == vertices;
}

}  // namespace detail

LOOM_INLINE std::uint64_t order_fingerprint(const partitioned_graph& pg) {
    std::uint64_t h = 0;
    for (const auto& device : pg.order) {
        h = (h ^ 0x9e3779b97f4a7c15ull) * 1099511628211ull;
        for (node_id n : device) h = (h ^ static_cast<std::uint64_t>(n)) * 1099511628211ull;
    }
    return h;
}

LOOM_INLINE void check_programs(const partitioned_graph& pg) {
    if (!pg.order.empty()) {
        if (static_cast<int>(pg.order.size()) != pg.world)
            throw plan_error("programs: the op-order lists " + std::to_string(pg.order.size()) + " devices, the plan has " +
                             std::to_string(pg.world) + "; give one order per device (or none: graph order)");
        for (int d = 0; d < pg.world; ++d) {
            const auto& order = pg.order[static_cast<std::size_t>(d)];
            const std::size_t count = pg.devices[static_cast<std::size_t>(d)].ir().nodes.size();
            std::vector<bool> seen(count, false);
            for (node_id n : order) {
                const auto i = static_cast<std::size_t>(n);
                if (n < 0 || i >= count || seen[i])
                    throw plan_error("programs: device " + std::to_string(d) + "'s order " +
                                     (n < 0 || i >= count ? "names node " + std::to_string(n) + ", which it does not have"
                                                          : "runs node " + std::to_string(n) + " twice") +
                                     "; give every node of the device exactly once");
                seen[i] = true;
            }
            if (order.size() != count)
                throw plan_error("programs: device " + std::to_string(d) + "'s order runs " + std::to_string(order.size()) +
                                 " of its " + std::to_string(count) + " nodes; give every node exactly once");
        }
    }
    check_deadlock_free(pg);
}

}  // namespace loom::partition
#endif  // LOOM_HEADER_DEFINITIONS
