#pragma once
// Order constraints as values: nnScaler's op-order(op1, op2) ("op1 runs before op2 on the
// device that runs both"), written once for a whole family of block pairs.
//
//   using namespace loom::schedule::var;
//   before{forward(micro + stages - stage - 1), backward(micro)}
//       for every stage s and micro-batch m: F(s, m + S - s - 1) runs before B(s, m)
//       (Table 4's constraint (3) for 1F1B: stage s runs S - s - 1 forwards ahead)
//   before{forward(micro + 2, 0), forward(micro + 1, 1)}
//       Table 7's constraint (1) for 3F1B: F0(s, m+2) before F1(s, m+1)
//   before{forward(micro), forward(micro + 1).on_stage(stage + 1)}
//       a pair from two stages (they must share a device)
//   before{forward(position + 1), backward(position), each_device, {}, unit_order::by_micro_group}
//       per device: its (position+1)-th forward before its position-th backward, where a
//       device's forwards are listed in the given unit order (interleaved 1F1B)
//
// A family ranges over
//   each_stage   every stage s and every integer `micro`;
//   each_device  every device d and every integer `position`,
// and keeps the pairs whose two blocks both exist (an index below 0 or past the end drops the
// pair; .or_last() makes an index past the end mean the last one instead). `when` keeps only
// the members where low <= value <= high. A family whose blocks share no device is an error.
//
// Index expressions are affine in the variables of namespace var: micro / position (the
// family's running index), stage, device (each_stage: the first device of the stage), and the
// shape's stages, micro_batches, devices and chunks (stages per device). Every part is a
// literal type, so constraints are constexpr values and template arguments
// (plan::order<plan::ordered_by<3, before{...}>>, plan/pipeline_parts.hpp).
//
// first_constraint_error(c, rounds) is the one check of a constraint on its own, run at
// compile time by the typed front end and at run time by from_constraints.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

#include <loom/core/linkage.hpp>
#include <loom/core/static_text.hpp>
#include <loom/schedule/block.hpp>
#include <loom/schedule/shape.hpp>

namespace loom::schedule {

// ---- index expressions -----------------------------------------------------------------------

struct affine {
    constexpr affine() = default;
    constexpr affine(int k) : constant(k) {}  // a constant: forward(0), within(stage, 1, 1)

    int constant = 0;
    int index = 0;  // micro (each_stage) or position (each_device)
    int stage = 0;
    int device = 0;
    int stages = 0;
    int micro_batches = 0;
    int devices = 0;
    int chunks = 0;

    friend constexpr bool operator==(const affine&, const affine&) = default;
};

constexpr affine operator+(affine a, const affine& b) {
    a.constant += b.constant, a.index += b.index, a.stage += b.stage, a.device += b.device;
    a.stages += b.stages, a.micro_batches += b.micro_batches, a.devices += b.devices, a.chunks += b.chunks;
    return a;
}
constexpr affine operator*(int k, affine a) {
    a.constant *= k, a.index *= k, a.stage *= k, a.device *= k;
    a.stages *= k, a.micro_batches *= k, a.devices *= k, a.chunks *= k;
    return a;
}
constexpr affine operator-(const affine& a) { return -1 * a; }
constexpr affine operator-(const affine& a, const affine& b) { return a + -b; }
constexpr affine operator+(const affine& a, int k) { return a + affine(k); }
constexpr affine operator+(int k, const affine& a) { return a + k; }
constexpr affine operator-(const affine& a, int k) { return a + -k; }
constexpr affine operator-(int k, const affine& a) { return -a + k; }

namespace detail {
constexpr affine unit(int affine::*variable) {
    affine a;
    a.*variable = 1;
    return a;
}
}  // namespace detail

namespace var {
inline constexpr affine micro = detail::unit(&affine::index);
inline constexpr affine position = detail::unit(&affine::index);
inline constexpr affine stage = detail::unit(&affine::stage);
inline constexpr affine device = detail::unit(&affine::device);
inline constexpr affine stages = detail::unit(&affine::stages);
inline constexpr affine micro_batches = detail::unit(&affine::micro_batches);
inline constexpr affine devices = detail::unit(&affine::devices);
inline constexpr affine chunks = detail::unit(&affine::chunks);
}  // namespace var

struct affine_values {
    int index = 0, stage = 0, device = 0, stages = 0, micro_batches = 0, devices = 0, chunks = 0;
};

constexpr long long evaluate(const affine& a, const affine_values& v) {
    return static_cast<long long>(a.constant) + static_cast<long long>(a.index) * v.index +
           static_cast<long long>(a.stage) * v.stage + static_cast<long long>(a.device) * v.device +
           static_cast<long long>(a.stages) * v.stages + static_cast<long long>(a.micro_batches) * v.micro_batches +
           static_cast<long long>(a.devices) * v.devices + static_cast<long long>(a.chunks) * v.chunks;
}

// ---- block patterns and families -------------------------------------------------------------

struct block_pattern {
    pass_kind pass = pass_kind::forward;
    int round = 0;
    affine index = var::micro;  // the micro-batch (each_stage) or the position on the device (each_device)
    affine stage = var::stage;  // each_stage: the block's stage
    bool or_last_index = false;  // an index past the end means the last block

    constexpr block_pattern on_stage(const affine& s) const {
        block_pattern p = *this;
        p.stage = s;
        return p;
    }
    constexpr block_pattern or_last() const {
        block_pattern p = *this;
        p.or_last_index = true;
        return p;
    }
    friend constexpr bool operator==(const block_pattern&, const block_pattern&) = default;
};

// forward(micro + 1) / forward(micro, 2): the forward of round `round` (0 .. rounds-1).
constexpr block_pattern forward(const affine& index, int round = 0) { return {pass_kind::forward, round, index}; }
// backward(micro): the backward (it has no round).
constexpr block_pattern backward(const affine& index) { return {pass_kind::backward, 0, index}; }

enum class family_scope : std::uint8_t { each_stage, each_device };
inline constexpr family_scope each_stage = family_scope::each_stage;
inline constexpr family_scope each_device = family_scope::each_device;

// How an each_device family lists a device's blocks of one pass and round:
//   by_micro        by micro-batch, then stage (forward: ascending; backward: descending)
//   by_micro_group  by (micro / devices, stage as above, micro % devices): Megatron's
//                   interleaved order, `devices` micro-batches through one chunk at a time
enum class unit_order : std::uint8_t { by_micro, by_micro_group };

// A member of a family is kept when low <= value <= high (always, when inactive).
struct condition {
    affine value{};
    affine low{};
    affine high{};
    bool active = false;
    friend constexpr bool operator==(const condition&, const condition&) = default;
};
constexpr condition within(const affine& value, const affine& low, const affine& high) {
    return {value, low, high, true};
}

// op-order for a family: every `first` block runs before its `then` block.
struct before {
    block_pattern first;
    block_pattern then;
    family_scope over = family_scope::each_stage;
    condition when{};
    unit_order order = unit_order::by_micro;

    friend constexpr bool operator==(const before&, const before&) = default;
};

// ---- spelling (constexpr, shared by compile-time and run-time messages) --------------------

namespace detail {

using plan::detail::text;
using plan::detail::concat;

constexpr void append_term(text& out, int coefficient, std::string_view name) {
    if (coefficient == 0) return;
    const bool first = out.empty();
    const int magnitude = coefficient < 0 ? -coefficient : coefficient;
    if (first)
        out.append(coefficient < 0 ? "-" : "");
    else
        out.append(coefficient < 0 ? " - " : " + ");
    if (name.empty()) {
        out.append(plan::detail::decimal(magnitude).view());
        return;
    }
    if (magnitude != 1) out.append(concat(magnitude, "*").view());
    out.append(name);
}

// "micro + stages - stage - 1"
constexpr text spell(const affine& a, family_scope over = family_scope::each_stage) {
    text out;
    append_term(out, a.index, over == family_scope::each_stage ? "micro" : "position");
    append_term(out, a.stages, "stages");
    append_term(out, a.micro_batches, "micro_batches");
    append_term(out, a.devices, "devices");
    append_term(out, a.chunks, "chunks");
    append_term(out, a.stage, "stage");
    append_term(out, a.device, "device");
    append_term(out, a.constant, "");
    if (out.empty()) out.append("0");
    return out;
}

// "forward(micro + 2, 1)", "backward(micro).on_stage(stage + 1)", "forward(micro + 3).or_last()"
constexpr text spell(const block_pattern& p, family_scope over = family_scope::each_stage) {
    text out = concat(p.pass == pass_kind::forward ? "forward(" : "backward(", spell(p.index, over));
    if (p.pass == pass_kind::forward && p.round != 0) out.append(concat(", ", p.round).view());
    if (p.pass == pass_kind::backward && p.round != 0) out.append(concat(", round ", p.round).view());
    out.append(")");
    if (!(p.stage == var::stage)) out.append(concat(".on_stage(", spell(p.stage, over), ")").view());
    if (p.or_last_index) out.append(".or_last()");
    return out;
}

constexpr text spell(const before& c) {
    text out = concat("before{", spell(c.first, c.over), ", ", spell(c.then, c.over));
    if (c.over == family_scope::each_device || c.when.active || c.order != unit_order::by_micro)
        out.append(c.over == family_scope::each_stage ? ", each_stage" : ", each_device");
    if (c.when.active)
        out.append(concat(", within(", spell(c.when.value, c.over), ", ", spell(c.when.low, c.over), ", ",
                          spell(c.when.high, c.over), ")")
                       .view());
    else if (c.order != unit_order::by_micro)
        out.append(", {}");
    if (c.order == unit_order::by_micro_group) out.append(", by_micro_group");
    out.append("}");
    return out;
}

constexpr bool uses_stage(const affine& a) { return a.stage != 0; }

constexpr text pattern_error(const block_pattern& p, int rounds, const text& where) {
    if (p.pass == pass_kind::backward && p.round != 0)
        return concat(where, " names backward round ", p.round,
                      "; a backward has no round (it follows the last forward); write backward(index)");
    if (p.round < 0) return concat(where, " names forward round ", p.round, "; rounds count from 0");
    if (rounds > 0 && p.round >= rounds)
        return concat(where, " names forward round ", p.round, ", but the pipeline has ", rounds,
                      rounds == 1 ? " forward round (0)" : " forward rounds (0..",
                      rounds == 1 ? text() : concat(rounds - 1, ")"),
                      "; use a round below ", rounds, " or give the pipeline more rounds");
    return {};
}

}  // namespace detail

// The first mistake of constraint c on its own (rounds: the pipeline's forward rounds, 0 when
// not known yet), or "" when there is none. `where` starts the message.
constexpr plan::detail::text first_constraint_error(const before& c, int rounds, std::string_view where) {
    using detail::concat;
    const detail::text at = concat(where, where.empty() ? "" : ": ", detail::spell(c));
    if (auto e = detail::pattern_error(c.first, rounds, at); !e.empty()) return e;
    if (auto e = detail::pattern_error(c.then, rounds, at); !e.empty()) return e;
    if (c.over == family_scope::each_device) {
        if (!(c.first.stage == var::stage) || !(c.then.stage == var::stage))
            return concat(at, ": on_stage means nothing in an each_device family (it names blocks by their position on",
                          " the device); drop on_stage, or make the family each_stage");
        if (detail::uses_stage(c.first.index) || detail::uses_stage(c.then.index) ||
            detail::uses_stage(c.when.value) || detail::uses_stage(c.when.low) || detail::uses_stage(c.when.high))
            return concat(at, ": uses `stage`, which an each_device family does not define; use `device`, or make",
                          " the family each_stage");
    }
    if (c.first == c.then)
        return concat(at, ": orders every block before itself, which no schedule can do; give the two blocks",
                      " different passes, rounds, stages or micro-batch offsets");
    return {};
}

inline std::string to_string(const before& c) { return detail::spell(c).str(); }
inline std::string to_string(const block_pattern& p) { return detail::spell(p).str(); }
inline std::string to_string(const affine& a) { return detail::spell(a).str(); }

// ---- expansion: a family -> the block pairs it orders on one shape -------------------------

struct ordered_pair {
    block first;
    block then;
};

namespace detail {

inline affine_values shape_values(const pipeline_shape& p) {
    return {0, 0, 0, p.stages, p.micro_batches, p.devices, p.chunks()};
}

// The blocks of (pass, round) that device d runs, in unit order `order`.
LOOM_INLINE std::vector<block> device_sequence(const pipeline_shape& p, int d, pass_kind pass, int round, unit_order order);

// The largest |index expression| at index 0. With any non-zero coefficient, an index i with
// |i| > reach + extent puts that expression outside [0, extent), so the window
// [-(reach + extent), reach + extent] holds every member (or_last folds the rest onto it).
LOOM_INLINE long long index_reach(const before& c, const affine_values& at0);

}  // namespace detail

// The block pairs family c orders on shape p, in (stage or device, index) order. Throws
// schedule_error when the constraint is ill-formed for p or a pair shares no device.
LOOM_INLINE std::vector<ordered_pair> expand(const before& c, const pipeline_shape& p, std::string_view where = "");

}  // namespace loom::schedule

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::schedule::detail {

LOOM_INLINE std::vector<block> device_sequence(const pipeline_shape& p, int d, pass_kind pass, int round, unit_order order) {
    std::vector<block> seq;
    for (int s = 0; s < p.stages; ++s) {
        if (!p.runs_on(s, d)) continue;
        for (int m = 0; m < p.micro_batches; ++m)
            seq.push_back(pass == pass_kind::forward ? forward_block(s, m, round) : backward_block(s, m));
    }
    const int group = p.devices > 0 ? p.devices : 1;
    auto key = [&](const block& b) {
        const int chunk = pass == pass_kind::forward ? b.stage : -b.stage;
        struct k3 {
            int a, b, c;
            bool operator<(const k3& o) const { return a != o.a ? a < o.a : b != o.b ? b < o.b : c < o.c; }
        };
        if (order == unit_order::by_micro) return k3{b.micro, chunk, 0};
        return k3{b.micro / group, chunk, b.micro % group};
    };
    std::stable_sort(seq.begin(), seq.end(), [&](const block& a, const block& b) { return key(a) < key(b); });
    return seq;
}

LOOM_INLINE long long index_reach(const before& c, const affine_values& at0) {
    long long reach = 0;
    for (const affine* a : {&c.first.index, &c.then.index}) {
        const long long v = evaluate(*a, at0);
        reach = std::max(reach, v < 0 ? -v : v);
    }
    return reach;
}
}  // namespace loom::schedule::detail

namespace loom::schedule {

LOOM_INLINE std::vector<ordered_pair> expand(const before& c, const pipeline_shape& p, std::string_view where) {
    if (auto e = first_constraint_error(c, p.rounds, where); !e.empty()) throw schedule_error(e.str());
    std::vector<ordered_pair> pairs;
    const affine_values base = detail::shape_values(p);
    auto keep = [&](const affine_values& v) {
        if (!c.when.active) return true;
        const long long x = evaluate(c.when.value, v);
        return evaluate(c.when.low, v) <= x && x <= evaluate(c.when.high, v);
    };
    auto clamp_index = [](long long index, long long size, bool or_last) -> long long {
        if (index < 0) return -1;
        if (index >= size) return or_last ? size - 1 : -1;
        return index;
    };
    auto concat_where = [](std::string_view w) { return w.empty() ? std::string() : std::string(w) + ": "; };
    std::set<std::pair<int, int>> seen;
    auto add = [&](const block& a, const block& b, bool saturated) {
        if (a == b) {
            if (saturated) return;  // .or_last() folded the pair onto one block
            throw schedule_error(concat_where(where) + to_string(c) + " orders " + to_string(a, p.rounds) +
                                 " before itself; change the offsets so the two blocks differ");
        }
        bool shared = false;
        for (int d : p.devices_of(a.stage)) shared = shared || p.runs_on(b.stage, d);
        if (!shared)
            throw schedule_error(concat_where(where) + to_string(c) + " orders " + to_string(a, p.rounds) + " before " +
                                 to_string(b, p.rounds) + ", but they share no device (stage " + std::to_string(a.stage) +
                                 " and stage " + std::to_string(b.stage) +
                                 "); op-order orders blocks of one device: fix the stage offsets");
        if (seen.insert({block_index(p, a), block_index(p, b)}).second) pairs.push_back({a, b});
    };
    if (c.over == family_scope::each_stage) {
        for (int s = 0; s < p.stages; ++s) {
            affine_values v = base;
            v.stage = s;
            v.device = p.devices_of(s).front();
            const long long reach = detail::index_reach(c, v) + p.micro_batches;
            for (long long i = -reach; i <= reach; ++i) {
                v.index = static_cast<int>(i);
                if (!keep(v)) continue;
                const long long sa = evaluate(c.first.stage, v), sb = evaluate(c.then.stage, v);
                if (sa < 0 || sa >= p.stages || sb < 0 || sb >= p.stages) continue;
                const long long ia = evaluate(c.first.index, v), ib = evaluate(c.then.index, v);
                const long long ma = clamp_index(ia, p.micro_batches, c.first.or_last_index);
                const long long mb = clamp_index(ib, p.micro_batches, c.then.or_last_index);
                if (ma < 0 || mb < 0) continue;
                const block a{c.first.pass, static_cast<int>(sa), static_cast<int>(ma), c.first.round};
                const block b{c.then.pass, static_cast<int>(sb), static_cast<int>(mb), c.then.round};
                add(a, b, ma != ia || mb != ib);
            }
        }
    } else {
        for (int d = 0; d < p.devices; ++d) {
            const auto seq_a = detail::device_sequence(p, d, c.first.pass, c.first.round, c.order);
            const auto seq_b = detail::device_sequence(p, d, c.then.pass, c.then.round, c.order);
            affine_values v = base;
            v.device = d;
            const long long reach = detail::index_reach(c, v) + static_cast<long long>(seq_a.size() + seq_b.size());
            for (long long i = -reach; i <= reach; ++i) {
                v.index = static_cast<int>(i);
                if (!keep(v)) continue;
                const long long ia = evaluate(c.first.index, v), ib = evaluate(c.then.index, v);
                const long long pa = clamp_index(ia, static_cast<long long>(seq_a.size()), c.first.or_last_index);
                const long long pb = clamp_index(ib, static_cast<long long>(seq_b.size()), c.then.or_last_index);
                if (pa < 0 || pb < 0) continue;
                add(seq_a[static_cast<std::size_t>(pa)], seq_b[static_cast<std::size_t>(pb)], pa != ia || pb != ib);
            }
        }
    }
    return pairs;
}

}  // namespace loom::schedule
#endif  // LOOM_HEADER_DEFINITIONS
