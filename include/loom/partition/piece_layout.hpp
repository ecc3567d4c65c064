#pragma once
// From an op's partition to its pieces: which variable each split cuts, the index range of
// every variable in every piece, the box each piece reads from each input and the vTensor
// it writes to each output. Also the checks a plan must pass against a node (the run-time
// twin of the combinators' static_asserts) and the mirroring of a forward op's partition
// onto the ops that differentiate it.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/op.hpp>
#include <loom/partition/vtensor.hpp>
#include <loom/plan/op_partition.hpp>
#include <loom/plan/transformation.hpp>

namespace loom::partition {

struct piece_geometry {
    int device = 0;
    piece_ranges vars;            // per bound variable of the node
    std::vector<box> inputs;      // what the piece reads of each input
    value_chunk summand;          // of each input's partial sums (full: the values themselves)
    std::vector<vtensor> outputs; // what it writes to each output
};

struct node_layout {
    plan::op_partition partition;  // with every split bound to a variable label
    std::vector<piece_geometry> pieces;
};

namespace detail {

inline std::string node_where(const node& n) { return std::string(n.op->name) + " '" + n.name + "'"; }

LOOM_INLINE std::string dims_of(const node& n);

// "1, 2, 3, 6": the divisors of n, in order.
LOOM_INLINE std::string divisors(std::int64_t n);

// The variable a split names: by label if given, else the unique splittable variable with
// that dim (or the first, if several carry it).
LOOM_INLINE std::optional<int> variable_of(const node& n, const plan::split_axis& s);

// Removes from `p` each of `axes` (indices of its splits, ascending) along which every
// piece shares its device with the pieces at the same other coordinates, keeping the
// pieces at coordinate 0 of it.
LOOM_INLINE void drop_axes_on_shared_devices(plan::op_partition& p, const std::vector<std::size_t>& axes);

}  // namespace detail

// Checks `p` against node `n` and binds every split to one of the node's variables (its
// label). `strict`: a plan the user wrote, whose mistakes are errors; otherwise (a mirrored
// backward op) a split that does not apply becomes replication, noted in `notes`, as do the
// splits listed in `absent` (along variables the op is known to lack).
LOOM_INLINE plan::op_partition bind_partition(const node& n, plan::op_partition p, int devices, bool strict,
                                              std::vector<std::string>& notes, const std::vector<std::size_t>& absent = {});

// The partition of op `n` that differentiates (or follows) `forward`, from `forward`'s bound
// partition `p`: the same piece grid, each split bound to the variable of `n` that carries
// the same axis. The variables are matched through the tensors both ops touch: `n` reads or
// writes a tensor of `forward`, or a twin of one (its gradient, a recomputed copy;
// tensor_desc::twin_of), whose axes name a variable in each op. Matching by dim alone would
// confuse a linear's two hidden dims and cut a row-parallel weight's gradient along its
// rows. A split whose variable no operand of `n` carries, when every operand is traced, is
// listed in `absent`; one that cannot be traced is matched by dim among the variables not
// matched otherwise. Summand axes become copies: only an op linear in its inputs may keep
// them (sum_partial_inputs).
struct mirrored_partition {
    plan::op_partition partition;
    std::vector<std::size_t> absent;  // splits along variables `n` lacks
};
LOOM_INLINE mirrored_partition mirror_partition(const graph& g, const plan::op_partition& p, const node* forward,
                                                const node& n);

// How many summands of partial sums each piece of `n` writes to output `o` under the bound
// partition `p` (1: full values): the product of the degrees of its splits along dims that
// the output contracts, and of its summand axes.
LOOM_INLINE std::int64_t summands_of(const node& n, const plan::op_partition& p, std::size_t o);

// For an op linear in its inputs (op_def::linear) with a mirrored partition `m`: the splits
// along variables the op lacks become summand axes when every input arrives as exactly that
// many partial sums (`input_summands`), so that piece k adds summand k of each. Summands on
// one device merge: coarse summand j of J is the sum of every summand f with f % J == j (the
// micro-batch axis, outermost, is the one merged); an input may arrive already merged so.
// Otherwise they stay absent, for
// bind_partition to turn into copies, which need every input reduced whole on every copy:
// the tied embedding's gradient sum under data parallelism would then reduce two whole
// tables, and with micro-batches send every partial point to point.
LOOM_INLINE void sum_partial_inputs(const node& n, mirrored_partition& m, const std::vector<std::int64_t>& input_summands);

// Index ranges and boxes of every piece of node `n` under the bound partition `p`.
LOOM_INLINE node_layout layout_pieces(const graph& g, const node& n, plan::op_partition p);

}  // namespace loom::partition

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::partition::detail {

LOOM_INLINE std::string dims_of(const node& n) {
    std::string s;
    for (const auto& v : n.sig.vars)
        s += (s.empty() ? "" : ", ") + std::string(v.dim.name()) + (v.frozen ? " (frozen)" : "") + "=" +
             std::to_string(v.extent);
    return s.empty() ? "none" : s;
}

LOOM_INLINE std::string divisors(std::int64_t n) {
    std::vector<std::int64_t> low, high;
    for (std::int64_t d = 1; d * d <= n; ++d)
        if (n % d == 0) {
            low.push_back(d);
            if (d * d != n) high.push_back(n / d);
        }
    low.insert(low.end(), high.rbegin(), high.rend());
    std::string s;
    for (std::int64_t d : low) s += (s.empty() ? "" : ", ") + std::to_string(d);
    return s;
}

LOOM_INLINE std::optional<int> variable_of(const node& n, const plan::split_axis& s) {
    if (!s.label.empty()) return n.sig.find(s.label);
    std::optional<int> found;
    for (std::size_t v = 0; v < n.sig.vars.size(); ++v)
        if (n.sig.vars[v].dim == s.dim) {
            if (!found || (!n.sig.vars[static_cast<std::size_t>(*found)].splittable && n.sig.vars[v].splittable))
                found = static_cast<int>(v);
        }
    return found;
}
LOOM_INLINE void drop_axes_on_shared_devices(plan::op_partition& p, const std::vector<std::size_t>& axes) {
    for (auto it = axes.rbegin(); it != axes.rend() && !p.devices.empty(); ++it) {
        const std::size_t axis = *it;
        if (static_cast<std::int64_t>(p.devices.size()) != p.pieces()) break;
        std::vector<int> kept;
        std::map<std::vector<std::int64_t>, int> device_at;
        bool shared = true;
        for (std::int64_t i = 0; i < p.pieces() && shared; ++i) {
            auto c = p.coordinates(i);
            const bool first = c[axis] == 0;
            c[axis] = 0;
            auto [at, inserted] = device_at.try_emplace(c, p.device_of(i));
            shared = at->second == p.device_of(i);
            if (first) kept.push_back(p.device_of(i));
        }
        if (!shared) continue;
        p.splits.erase(p.splits.begin() + static_cast<std::ptrdiff_t>(axis));
        p.devices = std::move(kept);
    }
}

}  // namespace loom::partition::detail

namespace loom::partition {

LOOM_INLINE plan::op_partition bind_partition(const node& n, plan::op_partition p, int devices, bool strict,
                                              std::vector<std::string>& notes, const std::vector<std::size_t>& absent) {
    const std::string where = detail::node_where(n);
    if (p.replicas < 1)
        throw plan_error("plan: " + where + " has " + std::to_string(p.replicas) + " replicas; use at least 1");
    // A list that repeats (a pipeline's micro-batches) is written out: the pieces bound here
    // are materialized one by one, and the checks below read one device per piece.
    if (!p.devices.empty() && p.pieces() % static_cast<std::int64_t>(p.devices.size()) == 0) p.list_every_piece();
    std::vector<std::int64_t> cut(n.sig.vars.size(), 1);
    std::vector<std::size_t> copied;  // splits that became replication here
    for (auto& s : p.splits) {
        if (s.degree < 1)
            throw plan_error("plan: trans<Split<" + (s.label.empty() ? std::string(s.dim.name()) : s.label) + ">, " +
                             std::to_string(s.degree) + "> on " + where + ": the degree must be at least 1");
        if (!s.cuts()) continue;
        auto fail_or_replicate = [&](const std::string& why) {
            if (strict) throw plan_error("plan: trans<Split<" + s.describe() + ">> on " + where + ": " + why);
            notes.push_back(where + ": the mirrored split " + s.describe() + " " + why + "; the op runs replicated instead");
            s.replicate = true;
            copied.push_back(static_cast<std::size_t>(&s - p.splits.data()));
        };
        const auto index = static_cast<std::size_t>(&s - p.splits.data());
        if (std::find(absent.begin(), absent.end(), index) != absent.end()) {
            fail_or_replicate("along a variable the op lacks (none of its operands carries it)");
            continue;
        }
        if (n.op->opaque_layout && n.sig.vars.size() > 0) {
            fail_or_replicate("cannot be split: the op reinterprets its input's layout; replicate it or split the ops around it");
            continue;
        }
        auto v = detail::variable_of(n, s);
        if (!v) {
            fail_or_replicate("the op has no dim " + (s.label.empty() ? std::string(s.dim.name()) : "'" + s.label + "'") +
                              " (its dims: " + detail::dims_of(n) + "); split one of those or select other ops");
            continue;
        }
        const bound_variable& var = n.sig.vars[static_cast<std::size_t>(*v)];
        const bool custom = plan::transformation_registry::instance().find(*n.op, var.label) != nullptr;
        if ((var.frozen && !custom) || (!var.frozen && !var.splittable)) {
            fail_or_replicate("dim " + std::string(var.dim.name()) + " ('" + var.label + "') is " +
                              (var.frozen ? "frozen in this op (splitting it would change the result)"
                                          : "an inner part of a grouped axis (its slices are not contiguous)") +
                              "; split another dim, or register a custom transformation for this op");
            continue;
        }
        // Per piece of the earlier splits of this variable (the smallest, when those were uneven).
        const std::int64_t extent = var.extent / cut[static_cast<std::size_t>(*v)];
        const std::string per_piece =
            cut[static_cast<std::size_t>(*v)] > 1 ? " (" + std::to_string(extent) + " per piece)" : "";
        if (extent % s.degree != 0 && !plan::splits_unevenly(var.dim)) {
            fail_or_replicate("dim " + std::string(var.dim.name()) + " has extent " + std::to_string(var.extent) +
                              per_piece + ", which degree " + std::to_string(s.degree) +
                              " does not divide; choose a divisor of " + std::to_string(extent) + " (" +
                              detail::divisors(extent) +
                              ") as the degree, or change the model so that the degree divides it (only a "
                              "vocabulary is split unevenly, into near-equal pieces, as the Megatron presets "
                              "pad it; no other dim is padded)");
            continue;
        }
        if (extent < s.degree) {
            fail_or_replicate("dim " + std::string(var.dim.name()) + " has extent " + std::to_string(var.extent) +
                              per_piece + ", fewer than degree " + std::to_string(s.degree) +
                              " pieces; some pieces would be empty: use a degree of at most " + std::to_string(extent));
            continue;
        }
        cut[static_cast<std::size_t>(*v)] *= s.degree;
        s.label = var.label;
        s.dim = var.dim;
    }
    // A copy along an axis whose pieces all share their devices (a pipeline's micro-batches
    // of an op without a batch dim, such as a weight's gradient sum) computes the same thing
    // twice on one device: keep one.
    detail::drop_axes_on_shared_devices(p, copied);
    const std::int64_t pieces = p.pieces();
    if (!p.devices.empty() && static_cast<std::int64_t>(p.devices.size()) != pieces)
        throw plan_error("plan: op-assign on " + where + " lists " + std::to_string(p.devices.size()) +
                         " devices for " + std::to_string(pieces) + " pieces (" + p.describe() +
                         "); give one device per piece");
    if (p.devices.empty() && pieces > devices)
        throw plan_error("plan: " + where + " is cut into " + std::to_string(pieces) + " pieces (" + p.describe() +
                         ") but there are only " + std::to_string(devices) +
                         " devices; lower the degrees or colocate pieces (op-assign)");
    for (std::int64_t i = 0; i < pieces; ++i) {
        int d = p.device_of(i);
        if (d < 0 || d >= devices)
            throw plan_error("plan: op-assign on " + where + " puts piece " + std::to_string(i) + " on device " +
                             std::to_string(d) + ", outside 0.." + std::to_string(devices - 1));
    }
    return p;
}

LOOM_INLINE mirrored_partition mirror_partition(const graph& g, const plan::op_partition& p, const node* forward,
                                                const node& n) {
    mirrored_partition m{p, {}};
    m.partition.recompute = false;
    for (auto& s : m.partition.splits)
        if (s.sums) {
            s.sums = false;
            s.replicate = true;
        }
    if (!forward) return m;
    // The axes of a tensor of `forward`, by the variables of `forward` that index them.
    auto forward_axes = [&](tensor_id t) -> const std::vector<std::vector<int>>* {
        for (std::size_t k = 0; k < forward->inputs.size() && k < forward->sig.input_axes.size(); ++k)
            if (forward->inputs[k] == t) return &forward->sig.input_axes[k];
        for (std::size_t o = 0; o < forward->outputs.size() && o < forward->sig.output_axes.size(); ++o)
            if (forward->outputs[o] == t) return &forward->sig.output_axes[o];
        return nullptr;
    };
    std::map<int, int> image;  // variable of `forward` -> variable of `n` on the same axis
    bool traced_all = true;
    auto trace = [&](tensor_id t, const std::vector<std::vector<int>>* mine) {
        const std::vector<std::vector<int>>* theirs = forward_axes(t);
        for (tensor_id twin : g.tensor(t).twin_of)
            if (!theirs) theirs = forward_axes(twin);
        if (!mine || !theirs || theirs->size() != mine->size()) {
            traced_all = false;
            return;
        }
        for (std::size_t a = 0; a < mine->size(); ++a) {
            if ((*theirs)[a].empty() || (*mine)[a].empty()) continue;
            const int from = (*theirs)[a][0], to = (*mine)[a][0];
            if (forward->sig.vars[static_cast<std::size_t>(from)].dim == n.sig.vars[static_cast<std::size_t>(to)].dim)
                image.try_emplace(from, to);
        }
    };
    for (std::size_t k = 0; k < n.inputs.size(); ++k)
        trace(n.inputs[k], k < n.sig.input_axes.size() ? &n.sig.input_axes[k] : nullptr);
    for (std::size_t o = 0; o < n.outputs.size(); ++o)
        trace(n.outputs[o], o < n.sig.output_axes.size() ? &n.sig.output_axes[o] : nullptr);
    std::vector<bool> taken(n.sig.vars.size(), false);
    for (auto [from, to] : image) taken[static_cast<std::size_t>(to)] = true;
    for (std::size_t i = 0; i < m.partition.splits.size(); ++i) {
        plan::split_axis& s = m.partition.splits[i];
        if (s.replicate) continue;
        const auto v = forward->sig.find(s.label);
        if (v) s.dim = forward->sig.vars[static_cast<std::size_t>(*v)].dim;
        if (v && image.count(*v)) {
            s.label = n.sig.vars[static_cast<std::size_t>(image.at(*v))].label;
            continue;
        }
        s.label.clear();
        if (v && traced_all) {
            m.absent.push_back(i);
            continue;
        }
        // Untraced: by dim, among the variables that no other axis claimed.
        for (std::size_t w = 0; w < n.sig.vars.size(); ++w)
            if (!taken[w] && n.sig.vars[w].dim == s.dim && n.sig.vars[w].splittable && !n.sig.vars[w].frozen) {
                s.label = n.sig.vars[w].label;
                taken[w] = true;
                break;
            }
    }
    return m;
}

LOOM_INLINE std::int64_t summands_of(const node& n, const plan::op_partition& p, std::size_t o) {
    std::int64_t count = 1;
    for (const auto& s : p.splits) {
        if (s.sums) count *= s.degree;
        if (!s.cuts()) continue;
        auto v = n.sig.find(s.label);
        if (v && o < n.sig.output_axes.size() && n.sig.effect_on(*v, false, o).effect == split_effect::partial)
            count *= s.degree;
    }
    return count;
}

LOOM_INLINE void sum_partial_inputs(const node& n, mirrored_partition& m, const std::vector<std::int64_t>& input_summands) {
    if (!n.op->linear || input_summands.empty() || m.absent.empty()) return;
    std::int64_t fine = 1;
    for (std::size_t s : m.absent) fine *= m.partition.splits[s].degree;
    // Summands whose pieces share a device (a pipeline's micro-batches) are added up there
    // first: one piece per device reads the sum of its summands, and the summands of an input
    // made on another device (the LM head's, a stage away) are summed there and sent once.
    plan::op_partition merged = m.partition;
    for (std::size_t s : m.absent) merged.splits[s].sums = true;
    detail::drop_axes_on_shared_devices(merged, m.absent);
    std::int64_t coarse = 1;
    for (const auto& s : merged.splits)
        if (s.sums) coarse *= s.degree;
    // An input arrives as the fine summands (one per piece) or as the coarse ones: the sum
    // of an earlier such op, merged on its devices the same way (the second add of a tied
    // embedding's three gradients under micro-batches and data parallelism).
    for (std::int64_t k : input_summands)
        if (k != fine && k != coarse) return;
    m.partition = std::move(merged);
    m.absent.clear();
}

LOOM_INLINE node_layout layout_pieces(const graph& g, const node& n, plan::op_partition p) {
    node_layout layout;
    const auto& vars = n.sig.vars;
    std::vector<int> split_var(p.splits.size(), -1);
    std::vector<split_option> effects(p.splits.size());
    for (std::size_t s = 0; s < p.splits.size(); ++s) {
        if (!p.splits[s].cuts()) continue;
        split_var[s] = *n.sig.find(p.splits[s].label);
        effects[s] = n.sig.effect_of_split(split_var[s]);
    }
    const std::int64_t pieces = p.pieces();
    for (std::int64_t i = 0; i < pieces; ++i) {
        piece_geometry piece;
        piece.device = p.device_of(i);
        const auto coord = p.coordinates(i);
        for (const auto& v : vars) {
            piece.vars.begin.push_back(0);
            piece.vars.end.push_back(v.extent);
        }
        std::vector<value_chunk> chunks(n.outputs.size());
        for (std::size_t s = 0; s < p.splits.size(); ++s) {
            if (p.splits[s].sums) {
                // The same summand of every input and every output.
                const auto degree = static_cast<std::int32_t>(p.splits[s].degree);
                const auto k = static_cast<std::int32_t>(coord[s]);
                piece.summand = {piece.summand.index * degree + k, piece.summand.count * degree};
                for (auto& c : chunks) c = {c.index * degree + k, c.count * degree};
                continue;
            }
            if (split_var[s] < 0) continue;
            auto v = static_cast<std::size_t>(split_var[s]);
            // Equal pieces, or near-equal ones along a vocabulary the degree does not divide.
            const std::int64_t length = piece.vars.end[v] - piece.vars.begin[v], first = piece.vars.begin[v];
            piece.vars.begin[v] = first + plan::piece_begin(length, p.splits[s].degree, coord[s]);
            piece.vars.end[v] = first + plan::piece_begin(length, p.splits[s].degree, coord[s] + 1);
            for (std::size_t o = 0; o < n.outputs.size(); ++o)
                if (effects[s].outputs[o].effect == split_effect::partial) {
                    chunks[o].index = chunks[o].index * static_cast<std::int32_t>(p.splits[s].degree) + static_cast<std::int32_t>(coord[s]);
                    chunks[o].count *= static_cast<std::int32_t>(p.splits[s].degree);
                }
        }
        auto operand_box = [&](const std::vector<std::vector<int>>& axes, const shape& dims) {
            box b;
            for (std::size_t a = 0; a < axes.size(); ++a) {
                const auto& group = axes[a];
                if (group.empty()) {
                    b.ranges.push_back({0, dims.extent(a)});
                    continue;
                }
                std::int64_t inner = 1;
                for (std::size_t k = 1; k < group.size(); ++k) inner *= vars[static_cast<std::size_t>(group[k])].extent;
                auto outer = static_cast<std::size_t>(group[0]);
                b.ranges.push_back({piece.vars.begin[outer] * inner, piece.vars.end[outer] * inner});
            }
            return b;
        };
        for (std::size_t k = 0; k < n.inputs.size(); ++k) {
            const shape& dims = g.tensor(n.inputs[k]).dims;
            piece.inputs.push_back(k < n.sig.input_axes.size() ? operand_box(n.sig.input_axes[k], dims) : box::whole(dims));
        }
        for (std::size_t o = 0; o < n.outputs.size(); ++o) {
            const shape& dims = g.tensor(n.outputs[o]).dims;
            box b = o < n.sig.output_axes.size() ? operand_box(n.sig.output_axes[o], dims) : box::whole(dims);
            piece.outputs.push_back({n.outputs[o], std::move(b), chunks[o]});
        }
        layout.pieces.push_back(std::move(piece));
    }
    layout.partition = std::move(p);
    return layout;
}

}  // namespace loom::partition
#endif  // LOOM_HEADER_DEFINITIONS
