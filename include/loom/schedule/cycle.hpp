#pragma once
// A cycle in a directed graph of labelled edges, for the checks that name the blocks of a
// deadlock (validate) or of constraints that cannot all hold (from_constraints).
//
//   out[u] = {{v, label}, ...}: an edge u -> v ("v waits for u"), labelled by its reason.
//   find_cycle(out) -> the edges of one cycle in order (u0 -> u1, u1 -> u2, ..., uk -> u0),
//                      empty when the graph is acyclic.
// Deterministic: a depth-first search from vertex 0 up, out-edges in the order given; the
// cycle is the one closed by the first back edge met.
#include <cstddef>
#include <vector>

#include <loom/core/linkage.hpp>

namespace loom::schedule::detail {

struct labelled_edge {
    int to = 0;
    int label = 0;
};

struct cycle_edge {
    int from = 0;
    int to = 0;
    int label = 0;
};

LOOM_INLINE std::vector<cycle_edge> find_cycle(const std::vector<std::vector<labelled_edge>>& out);

}  // namespace loom::schedule::detail

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::schedule::detail {

LOOM_INLINE std::vector<cycle_edge> find_cycle(const std::vector<std::vector<labelled_edge>>& out) {
    enum class colour : unsigned char { white, grey, black };
    const std::size_t n = out.size();
    std::vector<colour> state(n, colour::white);
    struct frame {
        int vertex;
        std::size_t next_edge;
        int arrived_label;  // the label of the edge from the previous frame's vertex
    };
    std::vector<frame> stack;
    for (std::size_t root = 0; root < n; ++root) {
        if (state[root] != colour::white) continue;
        stack.push_back({static_cast<int>(root), 0, -1});
        state[root] = colour::grey;
        while (!stack.empty()) {
            frame& top = stack.back();
            const auto& edges = out[static_cast<std::size_t>(top.vertex)];
            if (top.next_edge == edges.size()) {
                state[static_cast<std::size_t>(top.vertex)] = colour::black;
                stack.pop_back();
                continue;
            }
            const labelled_edge e = edges[top.next_edge++];
            const auto to = static_cast<std::size_t>(e.to);
            if (state[to] == colour::white) {
                state[to] = colour::grey;
                stack.push_back({e.to, 0, e.label});
            } else if (state[to] == colour::grey) {
                std::size_t first = stack.size() - 1;
                while (stack[first].vertex != e.to) --first;
                std::vector<cycle_edge> cycle;
                for (std::size_t i = first + 1; i < stack.size(); ++i)
                    cycle.push_back({stack[i - 1].vertex, stack[i].vertex, stack[i].arrived_label});
                cycle.push_back({stack.back().vertex, e.to, e.label});
                return cycle;
            }
        }
    }
    return {};
}

}  // namespace loom::schedule::detail
#endif  // LOOM_HEADER_DEFINITIONS
