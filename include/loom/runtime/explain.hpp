#pragma once
// A program described for a person: what runs, how much memory it takes and how much
// arithmetic one run does.
#include <cstdio>
#include <map>
#include <string>

#include <loom/core/linkage.hpp>
#include <loom/graph/op.hpp>
#include <loom/runtime/program.hpp>

namespace loom {

LOOM_INLINE std::string human_bytes(double bytes);

LOOM_INLINE double program_flops(const program& p);

LOOM_INLINE std::string explain(const program& p);

}  // namespace loom

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom {

LOOM_INLINE std::string human_bytes(double bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024 && u < 4) {
        bytes /= 1024;
        ++u;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
    return buf;
}

LOOM_INLINE double program_flops(const program& p) {
    double total = 0;
    for (const auto& s : p.steps) {
        const node& n = p.source->at(s.node);
        total += n.op->flops(*p.source, n);
    }
    return total;
}

LOOM_INLINE std::string explain(const program& p) {
    const graph& g = *p.source;
    std::size_t forward = 0, backward = 0;
    std::map<std::string, int> kinds;
    for (const auto& s : p.steps) {
        const node& n = g.at(s.node);
        (n.backward ? backward : forward) += 1;
        kinds[std::string(n.op->name)] += 1;
    }
    double param_bytes = 0, bound_bytes = 0;
    for (tensor_id t : p.bound) {
        bound_bytes += static_cast<double>(p.bytes_of(t));
        if (g.tensor(t).role == tensor_role::parameter) param_bytes += static_cast<double>(p.bytes_of(t));
    }
    std::string out;
    out += "program: " + std::to_string(p.steps.size()) + " instructions (" + std::to_string(forward) + " forward, " +
           std::to_string(backward) + " backward), precision " + std::string(to_string(p.prec)) + "\n";
    out += "  parameters: " + std::to_string(g.parameter_count()) + " (" + human_bytes(param_bytes) + ")\n";
    out += "  memory: " + human_bytes(static_cast<double>(p.arena_bytes)) + " activation arena (liveness plan; " +
           human_bytes(static_cast<double>(p.unplanned_bytes)) + " without reuse) + " + human_bytes(bound_bytes) +
           " bound (inputs, parameters, gradients)\n";
    char flops[64];
    std::snprintf(flops, sizeof flops, "%.3f GFLOP", program_flops(p) / 1e9);
    out += "  work per run: " + std::string(flops) + "\n  ops:";
    for (const auto& [name, count] : kinds) out += " " + name + " x" + std::to_string(count);
    out += "\n";
    return out;
}

}  // namespace loom
#endif  // LOOM_HEADER_DEFINITIONS
