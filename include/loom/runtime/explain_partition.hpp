#pragma once
// A partitioned graph described for a person: how each group of ops is split and where it
// runs, what every device stores and sends, and which transfers each op needs in the
// forward and the backward pass. Repeated layers are folded ("blocks.*.attn.q"), so a
// 48-layer model reads as one layer.
//
//   explain(pg)             the text
//   device_footprints(pg)   the per-device numbers behind its "devices" table
//
// Bytes sent follow transfer::elements_sent_by (ring and tree algorithms); activation memory
// is the arena peak of compile_program over the device's graph (every node kept, the loss
// as output), so it counts what the liveness plan overlaps only once.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <loom/core/linkage.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/op.hpp>
#include <loom/partition/partitioned_graph.hpp>
#include <loom/partition/transfer.hpp>
#include <loom/runtime/compile.hpp>
#include <loom/runtime/explain.hpp>
#include <loom/runtime/program.hpp>

namespace loom::partition {

// What one device stores, holds while running and sends during one training step.
struct device_footprint {
    int device = 0;
    std::size_t nodes = 0;              // in its graph: pieces, assembles and transfers
    std::int64_t parameter_bytes = 0;   // stored parameter pieces
    std::int64_t gradient_bytes = 0;    // their gradients
    std::int64_t activation_bytes = 0;  // peak of the activation arena
    std::int64_t bytes_sent = 0;        // over all transfers it is a member of
    std::map<transfer_kind, int> transfers;  // how many of each kind it takes part in
};

inline std::int64_t element_bytes(value_kind kind, precision prec) {
    return kind == value_kind::index ? 4 : static_cast<std::int64_t>(real_bytes(prec));
}

// Bytes member `m` of `t` sends.
inline std::int64_t bytes_sent_by(const transfer& t, std::size_t m, precision prec) {
    return t.elements_sent_by(m) * element_bytes(t.values, prec);
}

// Bytes all members of `t` send together.
inline std::int64_t bytes_sent(const transfer& t, precision prec) {
    std::int64_t total = 0;
    for (std::size_t m = 0; m < t.group.size(); ++m) total += bytes_sent_by(t, m, prec);
    return total;
}

LOOM_INLINE std::vector<device_footprint> device_footprints(const partitioned_graph& pg, precision prec = precision::f32);

namespace detail {

// The scope path with the index of every repeat instance replaced by '*':
// "blocks.3.attn.q" -> "blocks.*.attn.q".
LOOM_INLINE std::string folded_scope_path(const graph& g, std::int32_t scope);

// "{0,1,2,3,5}" -> "{0..3,5}": device lists of wide plans stay one short line.
LOOM_INLINE std::string fold_device_lists(const std::string& text);

// Rows of cells printed in aligned columns; `right[c]` right-aligns column c (numbers).
LOOM_INLINE std::string render_table(const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right,
                                     const std::string& indent = "  ");

LOOM_INLINE std::string zero_stage_name(plan::zero_stage z);

// "all_reduce x2 (4.00 KiB)": transfers of each kind and the bytes all their members send.
struct transfer_tally {
    std::map<transfer_kind, std::pair<int, std::int64_t>> by_kind;

    void add(const transfer& t, precision prec) {
        auto& [count, bytes] = by_kind[t.kind];
        count += 1;
        bytes += bytes_sent(t, prec);
    }
    std::string describe() const {
        std::string s;
        for (const auto& [kind, tally] : by_kind)
            s += (s.empty() ? "" : ", ") + std::string(to_string(kind)) + " x" + std::to_string(tally.first) + " (" +
                 human_bytes(static_cast<double>(tally.second)) + ")";
        return s.empty() ? "-" : s;
    }
};

}  // namespace detail

LOOM_INLINE std::string explain(const partitioned_graph& pg, precision prec = precision::f32);

}  // namespace loom::partition

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::partition {

LOOM_INLINE std::vector<device_footprint> device_footprints(const partitioned_graph& pg, precision prec) {
    const graph& logical = pg.ir();
    std::vector<device_footprint> out(pg.devices.size());
    for (std::size_t d = 0; d < pg.devices.size(); ++d) {
        const device_part& part = pg.devices[d];
        device_footprint& f = out[d];
        f.device = static_cast<int>(d);
        f.nodes = part.ir().nodes.size();
        for (const auto& s : part.parameters)
            f.parameter_bytes += s.region.numel() * element_bytes(logical.tensor(s.logical).kind, prec);
        for (const auto& s : part.gradients)
            f.gradient_bytes += s.region.numel() * element_bytes(logical.tensor(s.logical).kind, prec);
        compile_options options;
        options.prec = prec;
        options.keep_every_node = true;
        if (part.loss != no_id) options.outputs = {part.loss};
        f.activation_bytes = compile_program(part.ir(), options).arena_bytes;
    }
    for (const auto& t : pg.transfers)
        for (std::size_t m = 0; m < t.group.size(); ++m) {
            device_footprint& f = out.at(static_cast<std::size_t>(t.group[m]));
            f.bytes_sent += bytes_sent_by(t, m, prec);
            f.transfers[t.kind] += 1;
        }
    return out;
}
}  // namespace loom::partition

namespace loom::partition::detail {

LOOM_INLINE std::string folded_scope_path(const graph& g, std::int32_t scope) {
    std::vector<std::string> parts;
    for (std::int32_t s = scope; s != no_id; s = g.scopes.at(static_cast<std::size_t>(s)).parent) {
        const scope_desc& d = g.scopes.at(static_cast<std::size_t>(s));
        parts.push_back(d.index >= 0 ? d.name + ".*" : d.name);
    }
    std::string path;
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) path += (path.empty() ? "" : ".") + *it;
    return path.empty() ? "(top)" : path;
}

LOOM_INLINE std::string fold_device_lists(const std::string& text) {
    std::string out;
    std::size_t i = 0;
    while (i < text.size()) {
        if (text[i] != '{') {
            out += text[i++];
            continue;
        }
        const std::size_t close = text.find('}', i);
        if (close == std::string::npos) {
            out += text.substr(i);
            break;
        }
        std::vector<long> numbers;
        bool all_numbers = close > i + 1;
        std::size_t p = i + 1;
        while (all_numbers && p < close) {
            std::size_t q = text.find(',', p);
            if (q == std::string::npos || q > close) q = close;
            const std::string item = text.substr(p, q - p);
            all_numbers = !item.empty() && item.find_first_not_of("0123456789") == std::string::npos;
            if (all_numbers) numbers.push_back(std::stol(item));
            p = q + 1;
        }
        if (!all_numbers) {
            out += text.substr(i, close - i + 1);
            i = close + 1;
            continue;
        }
        std::string folded;
        for (std::size_t a = 0; a < numbers.size();) {
            std::size_t b = a;
            while (b + 1 < numbers.size() && numbers[b + 1] == numbers[b] + 1) ++b;
            folded += folded.empty() ? "" : ",";
            if (b >= a + 2)
                folded += std::to_string(numbers[a]) + ".." + std::to_string(numbers[b]);
            else
                for (std::size_t k = a; k <= b; ++k) folded += (k > a ? "," : "") + std::to_string(numbers[k]);
            a = b + 1;
        }
        out += "{" + folded + "}";
        i = close + 1;
    }
    return out;
}

LOOM_INLINE std::string render_table(const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right,
                                     const std::string& indent) {
    std::vector<std::size_t> width;
    for (const auto& row : rows)
        for (std::size_t c = 0; c < row.size(); ++c) {
            if (width.size() <= c) width.push_back(0);
            width[c] = std::max(width[c], row[c].size());
        }
    std::string out;
    for (const auto& row : rows) {
        std::string line = indent;
        for (std::size_t c = 0; c < row.size(); ++c) {
            const std::string pad(width[c] - row[c].size(), ' ');
            const bool last = c + 1 == row.size();
            if (c < right.size() && right[c])
                line += pad + row[c];
            else
                line += row[c] + (last ? "" : pad);
            if (!last) line += "  ";
        }
        while (!line.empty() && line.back() == ' ') line.pop_back();
        out += line + "\n";
    }
    return out;
}

LOOM_INLINE std::string zero_stage_name(plan::zero_stage z) {
    switch (z) {
        case plan::zero_stage::none: return "none";
        case plan::zero_stage::optimizer: return "ZeRO-1 (optimizer state sharded)";
        case plan::zero_stage::gradients: return "ZeRO-2 (gradients sharded)";
        case plan::zero_stage::parameters: return "ZeRO-3 (parameters sharded)";
    }
    return "?";
}
}  // namespace loom::partition::detail

namespace loom::partition {

LOOM_INLINE std::string explain(const partitioned_graph& pg, precision prec) {
    const graph& g = pg.ir();
    std::string out;

    // Header.
    std::size_t forward_nodes = 0, device_nodes = 0;
    for (const auto& n : g.nodes) forward_nodes += n.backward ? 0 : 1;
    for (const auto& part : pg.devices) device_nodes += part.ir().nodes.size();
    detail::transfer_tally all;
    for (const auto& t : pg.transfers) all.add(t, prec);
    out += "plan" + (pg.plan_name.empty() ? std::string{} : " '" + pg.plan_name + "'") + ": " + std::to_string(pg.world) +
           " device" + (pg.world == 1 ? "" : "s") + ", ZeRO " + detail::zero_stage_name(pg.zero) + ", precision " +
           std::string(to_string(prec)) + "\n";
    out += "logical graph: " + std::to_string(g.nodes.size()) + " nodes (" + std::to_string(forward_nodes) + " forward, " +
           std::to_string(g.nodes.size() - forward_nodes) + " backward); device graphs: " + std::to_string(device_nodes) +
           " nodes; " + std::to_string(pg.transfers.size()) + " transfers: " + all.describe() + "\n";
    if (!pg.notes.empty()) {
        out += "notes (" + std::to_string(pg.notes.size()) + "):\n";
        const std::size_t shown = std::min<std::size_t>(pg.notes.size(), 8);
        for (std::size_t i = 0; i < shown; ++i) out += "  " + pg.notes[i] + "\n";
        if (shown < pg.notes.size()) out += "  ... and " + std::to_string(pg.notes.size() - shown) + " more\n";
    }

    // Op groups: (folded scope, op kind, pass), in order of first appearance.
    struct op_group {
        std::string scope, op;
        bool backward = false;
        int nodes = 0;
        std::vector<std::pair<std::string, int>> partitions;  // distinct descriptions, with counts
    };
    auto group_key = [&](const node& n) { return std::tuple(detail::folded_scope_path(g, n.scope), std::string(n.op->name), n.backward); };
    std::vector<op_group> groups;
    std::map<std::tuple<std::string, std::string, bool>, std::size_t> group_of;
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
        const node& n = g.nodes[i];
        auto key = group_key(n);
        auto [it, fresh] = group_of.try_emplace(key, groups.size());
        if (fresh) groups.push_back({std::get<0>(key), std::get<1>(key), n.backward, 0, {}});
        op_group& grp = groups[it->second];
        grp.nodes += 1;
        const std::string how = detail::fold_device_lists(pg.layouts.at(i).partition.describe());
        auto p = std::find_if(grp.partitions.begin(), grp.partitions.end(), [&](const auto& e) { return e.first == how; });
        if (p == grp.partitions.end())
            grp.partitions.emplace_back(how, 1);
        else
            p->second += 1;
    }
    out += "\nops ('*': every layer of a repeat):\n";
    std::vector<std::vector<std::string>> rows{{"pass", "scope", "op", "nodes", "split and placement"}};
    for (const auto& grp : groups) {
        std::string how;
        for (const auto& [text, count] : grp.partitions)
            how += (how.empty() ? "" : "; ") + text + (grp.partitions.size() > 1 ? " (" + std::to_string(count) + " nodes)" : "");
        rows.push_back({grp.backward ? "bwd" : "fwd", grp.scope, grp.op, std::to_string(grp.nodes), how});
    }
    out += detail::render_table(rows, {false, false, false, true, false});

    // Devices.
    out += "\ndevices (activations: arena peak of the device program; sent: bytes this device sends per step):\n";
    rows = {{"device", "nodes", "parameters", "gradients", "activations", "sent", "transfers"}};
    for (const auto& f : device_footprints(pg, prec)) {
        std::string kinds;
        for (const auto& [kind, count] : f.transfers)
            kinds += (kinds.empty() ? "" : ", ") + std::string(to_string(kind)) + " x" + std::to_string(count);
        rows.push_back({"device " + std::to_string(f.device), std::to_string(f.nodes),
                        human_bytes(static_cast<double>(f.parameter_bytes)), human_bytes(static_cast<double>(f.gradient_bytes)),
                        human_bytes(static_cast<double>(f.activation_bytes)), human_bytes(static_cast<double>(f.bytes_sent)),
                        kinds.empty() ? "-" : kinds});
    }
    out += detail::render_table(rows, {false, true, true, true, true, true, false});

    // Transfers by the forward op they serve: the backward twins sit beside the forward ones.
    struct transfer_row {
        std::string label;
        std::size_t first = 0;  // the earliest op it serves, for the order
        detail::transfer_tally forward, backward;
    };
    std::vector<transfer_row> transfer_rows;
    std::map<std::string, std::size_t> row_of;
    auto row_for = [&](const std::string& label, std::size_t first) -> transfer_row& {
        auto [it, fresh] = row_of.try_emplace(label, transfer_rows.size());
        if (fresh) transfer_rows.push_back({label, first, {}, {}});
        transfer_row& row = transfer_rows[it->second];
        row.first = std::min(row.first, first);
        return row;
    };
    for (const auto& t : pg.transfers) {
        if (t.consumer == no_id) {
            // Gradients onto their parameters' storage (backward), the loss onto every device.
            transfer_row& row = row_for(t.backward ? "gradients" : "loss", g.nodes.size());
            (t.backward ? row.backward : row.forward).add(t, prec);
            continue;
        }
        node_id served = t.consumer;
        const node& consumer = g.at(t.consumer);
        if ((consumer.backward || t.backward) && consumer.forward_of != no_id) served = consumer.forward_of;
        const node& op = g.at(served);
        const auto key = group_key(op);
        const std::string label = std::get<0>(key) + " " + std::get<1>(key) + (op.backward ? " (backward)" : "");
        transfer_row& row = row_for(label, static_cast<std::size_t>(served));
        (t.backward ? row.backward : row.forward).add(t, prec);
    }
    std::stable_sort(transfer_rows.begin(), transfer_rows.end(),
                     [](const transfer_row& a, const transfer_row& b) { return a.first < b.first; });
    out += "\ntransfers by the forward op they serve (bytes: all members together):\n";
    rows = {{"op", "forward", "backward"}};
    for (const auto& row : transfer_rows) rows.push_back({row.label, row.forward.describe(), row.backward.describe()});
    if (transfer_rows.empty()) rows.push_back({"(none)", "-", "-"});
    out += detail::render_table(rows, {false, false, false});
    return out;
}

}  // namespace loom::partition
#endif  // LOOM_HEADER_DEFINITIONS
