// loom: header-only C++20 library for deep-learning training at scale.
// SPDX-License-Identifier: Apache-2.0
//
// GENERATED FILE, do not edit. It is include/loom/loom.hpp with every loom header inlined.
// Regenerate with: python3 tools/amalgamate.py
#pragma once
// ---- begin loom/loom.hpp ----
// Entry header: includes the whole public API and nothing else.

// core
// ---- begin loom/core/dim.hpp ----
// Named dimensions. A dimension is known to the type system as a tag type
// (`Dim::Batch`, or a user's `named_dim<"Expert">`) and to run-time code as a `dim_id`,
// which is just its name. The two meet in `dim_id_of<Tag>`:
//   dim_id_of<Dim::Hidden> == dim_id{"Hidden"}
#include <deque>
#include <mutex>
#include <ostream>
#include <string>
#include <string_view>

// ---- begin loom/core/fixed_string.hpp ----
// A string literal usable as a template argument: `named_dim<"Batch">`, `scope<"block">`.
#include <algorithm>
#include <cstddef>
#include <string_view>

namespace loom {

template <std::size_t N>
struct fixed_string {
    char data[N]{};

    constexpr fixed_string(const char (&text)[N]) { std::copy_n(text, N, data); }

    constexpr std::string_view view() const { return {data, N - 1}; }
    constexpr std::size_t size() const { return N - 1; }
};

}  // namespace loom
// ---- end loom/core/fixed_string.hpp ----

namespace loom {

// The run-time name of a dimension. Cheap to copy and compare; the characters live in
// static storage (a tag's template argument) or in the intern table.
class dim_id {
public:
    constexpr dim_id() = default;

    // `name` must outlive every copy; use `dim_id::intern` for names built at run time.
    explicit constexpr dim_id(std::string_view name) : name_(name) {}

    // A dim whose name was read at run time (a plan file, a command line).
    static dim_id intern(std::string_view name) {
        static std::mutex mutex;
        static std::deque<std::string> table;  // deque: references stay valid as it grows
        std::lock_guard lock(mutex);
        for (const auto& known : table)
            if (known == name) return dim_id{known};
        return dim_id{table.emplace_back(name)};
    }

    constexpr std::string_view name() const { return name_; }
    constexpr bool empty() const { return name_.empty(); }

    friend constexpr bool operator==(dim_id a, dim_id b) { return a.name_ == b.name_; }
    friend constexpr auto operator<=>(dim_id a, dim_id b) { return a.name_ <=> b.name_; }
    friend std::ostream& operator<<(std::ostream& os, dim_id d) { return os << d.name_; }

private:
    std::string_view name_;
};

// The tag type of a dimension. Users define their own the same way:
//   using Expert = loom::named_dim<"Expert">;
template <fixed_string Name>
struct named_dim {
    static constexpr std::string_view name = Name.view();
    static constexpr dim_id id{Name.view()};
};

template <class T>
concept dim_tag = requires {
    { T::name } -> std::convertible_to<std::string_view>;
    { T::id } -> std::convertible_to<dim_id>;
};

template <dim_tag Tag>
inline constexpr dim_id dim_id_of = Tag::id;

// The dimensions loom's own ops and models speak of.
namespace Dim {
using Batch = named_dim<"Batch">;
using Seq = named_dim<"Seq">;
using Hidden = named_dim<"Hidden">;
using Head = named_dim<"Head">;
using HeadDim = named_dim<"HeadDim">;
using FFN = named_dim<"FFN">;
using Vocab = named_dim<"Vocab">;
using Channel = named_dim<"Channel">;
using Height = named_dim<"Height">;
using Width = named_dim<"Width">;
using Expert = named_dim<"Expert">;
using Scalar = named_dim<"Scalar">;  // never an axis; names the absence of one in messages
}  // namespace Dim

}  // namespace loom
// ---- end loom/core/dim.hpp ----
// ---- begin loom/core/error.hpp ----
// The error types loom throws. Every message names the thing that is wrong, the value
// that was seen and how to fix it, e.g.
//   "linear: input 'x' has inner extent 64 (dim Hidden) but weight 'w' expects 128; ..."
#include <stdexcept>
#include <string>

namespace loom {

// Base of every loom error, so callers can catch one type.
struct error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A graph that cannot be built: extents that disagree, a dim an op does not have.
struct shape_error : error {
    using error::error;
};

// A plan or schedule that cannot be resolved against a graph.
struct plan_error : error {
    using error::error;
};

// A data or checkpoint file that is missing, truncated or of the wrong format.
struct data_error : error {
    using error::error;
};

// Misuse of a run-time object (executor, optimizer, communicator) by the caller.
struct usage_error : error {
    using error::error;
};

// A collective or point-to-point transfer that failed or timed out.
struct comm_error : error {
    using error::error;
};

}  // namespace loom
// ---- end loom/core/error.hpp ----
// ---- begin loom/core/shape.hpp ----
// A shape is a list of named axes: [Batch=8, Seq=64, Hidden=128]. Rank 0 is a scalar.
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>


namespace loom {

struct axis {
    dim_id dim;
    std::int64_t extent = 0;

    friend bool operator==(const axis&, const axis&) = default;
};

class shape {
public:
    shape() = default;
    shape(std::initializer_list<axis> axes) : axes_(axes) {}
    explicit shape(std::vector<axis> axes) : axes_(std::move(axes)) {}

    std::size_t rank() const { return axes_.size(); }
    const axis& operator[](std::size_t i) const { return axes_[i]; }
    axis& operator[](std::size_t i) { return axes_[i]; }
    std::int64_t extent(std::size_t i) const { return axes_[i].extent; }
    dim_id dim(std::size_t i) const { return axes_[i].dim; }
    const std::vector<axis>& axes() const { return axes_; }
    auto begin() const { return axes_.begin(); }
    auto end() const { return axes_.end(); }

    std::int64_t numel() const {
        std::int64_t n = 1;
        for (const auto& a : axes_) n *= a.extent;
        return n;
    }

    // Position of the first axis named `d`, if any.
    std::optional<std::size_t> find(dim_id d) const {
        for (std::size_t i = 0; i < axes_.size(); ++i)
            if (axes_[i].dim == d) return i;
        return std::nullopt;
    }

    // Product of the extents of axes [first, last).
    std::int64_t span_numel(std::size_t first, std::size_t last) const {
        std::int64_t n = 1;
        for (std::size_t i = first; i < last; ++i) n *= axes_[i].extent;
        return n;
    }

    void push_back(axis a) { axes_.push_back(a); }

    std::string to_string() const {
        std::string s = "[";
        for (std::size_t i = 0; i < axes_.size(); ++i) {
            if (i) s += ", ";
            s += std::string(axes_[i].dim.name()) + "=" + std::to_string(axes_[i].extent);
        }
        return s + "]";
    }

    friend bool operator==(const shape&, const shape&) = default;

private:
    std::vector<axis> axes_;
};

// The same extents, ignoring names.
inline bool same_extents(const shape& a, const shape& b) {
    if (a.rank() != b.rank()) return false;
    for (std::size_t i = 0; i < a.rank(); ++i)
        if (a.extent(i) != b.extent(i)) return false;
    return true;
}

}  // namespace loom
// ---- end loom/core/shape.hpp ----
// ---- begin loom/core/signature.hpp ----
// Dimension signatures: an einsum-like statement of what an op does to each dim.
//
//   linear:      "... k, n k -> ... n"
//   layer_norm:  "... h^, h^, h^ -> ... h^"
//   split_heads: "b s (h d) -> b h s d"
//   cross_ent.:  "... v^, ... -> "
//
// Grammar: operands separated by ',', inputs and outputs by '->'. An operand is a list of
// axes; an axis is a dim variable (`k`), or a group `(h d)` whose extent is the product of
// its variables, outermost first. `...` (first in an operand only) stands for any number
// of leading dims, the same in every operand that has it. `^` after a variable freezes it.
//
// The laws a signature states, which partitioning relies on:
//   * a variable in an output is spatial: splitting it into n slices every operand that
//     has it and replicates every input that lacks it;
//   * an output that lacks a variable some input has is a SUM over that variable, so
//     splitting the variable leaves that output as n partial sums (the variable is
//     "contracted" with respect to that output);
//   * a frozen variable, and a variable that is not outermost in a group, cannot be split.
// Ops whose semantics break these laws for some variable must freeze it.
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>


namespace loom {

enum class dim_role : std::uint8_t { spatial, contracted, frozen };

inline std::string_view to_string(dim_role r) {
    switch (r) {
        case dim_role::spatial: return "spatial";
        case dim_role::contracted: return "contracted";
        case dim_role::frozen: return "frozen";
    }
    return "?";
}

struct signature {
    static constexpr int max_vars = 16;
    static constexpr int max_operands = 6;
    static constexpr int max_axes = 8;
    static constexpr int max_group = 4;
    static constexpr int max_name = 16;

    struct variable {
        std::array<char, max_name> name{};
        std::uint8_t length = 0;
        bool frozen = false;
        bool in_input = false;
        bool in_output = false;
        bool inner_of_group = false;  // not outermost in some group: splitting it is not contiguous

        constexpr std::string_view view() const { return {name.data(), length}; }
    };
    struct axis_term {
        std::array<std::uint8_t, max_group> vars{};
        std::uint8_t count = 0;
    };
    struct operand {
        std::array<axis_term, max_axes> axes{};
        std::uint8_t rank = 0;  // explicit axes, not counting the ellipsis
        bool ellipsis = false;  // leading `...`
    };

    std::array<variable, max_vars> vars{};
    std::uint8_t var_count = 0;
    std::array<operand, max_operands> inputs{};
    std::uint8_t input_count = 0;
    std::array<operand, max_operands> outputs{};
    std::uint8_t output_count = 0;

    constexpr std::optional<int> find(std::string_view name) const {
        for (int i = 0; i < var_count; ++i)
            if (vars[i].view() == name) return i;
        return std::nullopt;
    }

    constexpr bool ellipsis_in_inputs() const {
        for (int i = 0; i < input_count; ++i)
            if (inputs[i].ellipsis) return true;
        return false;
    }
    constexpr bool ellipsis_in_outputs() const {
        for (int i = 0; i < output_count; ++i)
            if (outputs[i].ellipsis) return true;
        return false;
    }

    constexpr dim_role role(int v) const {
        const auto& var = vars[v];
        if (var.frozen) return dim_role::frozen;
        return var.in_output ? dim_role::spatial : dim_role::contracted;
    }
    constexpr bool splittable(int v) const { return !vars[v].frozen && !vars[v].inner_of_group; }

    constexpr dim_role ellipsis_role() const {
        return ellipsis_in_outputs() ? dim_role::spatial : dim_role::contracted;
    }
};

namespace detail {

struct signature_parser {
    std::string_view text;
    std::size_t pos = 0;
    signature sig{};

    // Throwing in a constant expression is a compile error that shows this call.
    [[noreturn]] static void fail(const char* why) { throw std::invalid_argument(why); }

    constexpr void skip_space() {
        while (pos < text.size() && text[pos] == ' ') ++pos;
    }
    constexpr bool at(char c) {
        skip_space();
        return pos < text.size() && text[pos] == c;
    }
    static constexpr bool is_name_char(char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    }

    constexpr std::uint8_t variable(bool is_output) {
        skip_space();
        std::size_t start = pos;
        while (pos < text.size() && is_name_char(text[pos])) ++pos;
        if (pos == start) fail("signature: expected a dim variable name");
        std::string_view name = text.substr(start, pos - start);
        if (name.size() > signature::max_name) fail("signature: dim variable name longer than 16 characters");
        bool frozen = pos < text.size() && text[pos] == '^';
        if (frozen) ++pos;
        int index = -1;
        for (int i = 0; i < sig.var_count; ++i)
            if (sig.vars[i].view() == name) index = i;
        if (index < 0) {
            if (sig.var_count == signature::max_vars) fail("signature: more than 16 dim variables");
            index = sig.var_count++;
            for (std::size_t i = 0; i < name.size(); ++i) sig.vars[index].name[i] = name[i];
            sig.vars[index].length = static_cast<std::uint8_t>(name.size());
        }
        auto& var = sig.vars[index];
        var.frozen = var.frozen || frozen;
        (is_output ? var.in_output : var.in_input) = true;
        return static_cast<std::uint8_t>(index);
    }

    constexpr signature::operand operand(bool is_output) {
        signature::operand op{};
        skip_space();
        if (text.substr(pos, 3) == "...") {
            op.ellipsis = true;
            pos += 3;
        }
        while (true) {
            skip_space();
            if (pos >= text.size() || text[pos] == ',' || text[pos] == '-') break;
            if (op.rank == signature::max_axes) fail("signature: more than 8 axes in one operand");
            auto& term = op.axes[op.rank++];
            if (text[pos] == '(') {
                ++pos;
                while (!at(')')) {
                    if (pos >= text.size() || !is_name_char(text[pos])) fail("signature: unclosed '('");
                    if (term.count == signature::max_group) fail("signature: more than 4 variables in a group");
                    term.vars[term.count++] = variable(is_output);
                }
                ++pos;
                if (term.count < 2) fail("signature: a group needs at least two variables");
                for (int i = 1; i < term.count; ++i) sig.vars[term.vars[i]].inner_of_group = true;
            } else if (text[pos] == '.') {
                fail("signature: '...' may only open an operand");
            } else if (!is_name_char(text[pos])) {
                fail("signature: unexpected character");
            } else {
                term.vars[0] = variable(is_output);
                term.count = 1;
            }
        }
        return op;
    }

    constexpr signature parse() {
        bool is_output = false;
        while (true) {
            auto op = operand(is_output);
            if (is_output) {
                if (sig.output_count == signature::max_operands) fail("signature: more than 6 outputs");
                sig.outputs[sig.output_count++] = op;
            } else {
                if (sig.input_count == signature::max_operands) fail("signature: more than 6 inputs");
                sig.inputs[sig.input_count++] = op;
            }
            skip_space();
            if (pos >= text.size()) break;
            if (text[pos] == ',') {
                ++pos;
                continue;
            }
            if (text.substr(pos, 2) == "->") {
                if (is_output) fail("signature: '->' appears twice");
                is_output = true;
                pos += 2;
                continue;
            }
            fail("signature: unexpected character");
        }
        if (!is_output) fail("signature: missing '->'");
        // An empty operand is a scalar (a loss, or the gradient flowing into one).
        return sig;
    }
};

}  // namespace detail

// Parses at compile time when used in a constant expression:
//   static constexpr signature sig = parse_signature("... k, n k -> ... n");
constexpr signature parse_signature(std::string_view text) {
    if (text.size() == 1 && text[0] == '\0') detail::signature_parser::fail("signature: empty");
    detail::signature_parser parser{text};
    return parser.parse();
}

// ---------------------------------------------------------------------------------------
// A signature bound to the shapes of one node: every variable gets a dim and an extent.

struct bound_variable {
    std::string label;  // "k", or "...0" for the first leading dim
    dim_id dim;
    std::int64_t extent = 0;
    bool frozen = false;
    bool splittable = true;
    bool in_input = false;
    bool in_output = false;
};

// What splitting one variable into n parts does to one operand.
enum class split_effect : std::uint8_t {
    sliced,      // the operand is cut along `axis`
    replicated,  // the operand lacks the variable: every part sees all of it
    partial,     // an output that lacks the variable: every part holds a partial sum
};

struct operand_effect {
    split_effect effect = split_effect::replicated;
    int axis = -1;  // for `sliced`
};

struct split_option {
    int variable = -1;
    std::string label;
    dim_id dim;
    std::int64_t extent = 0;
    dim_role role = dim_role::spatial;  // contracted when some output becomes partial
    std::vector<operand_effect> inputs;
    std::vector<operand_effect> outputs;
};

struct bound_signature {
    std::vector<bound_variable> vars;
    // Per operand, per axis: the variables of that axis, outermost first.
    std::vector<std::vector<std::vector<int>>> input_axes;
    std::vector<std::vector<std::vector<int>>> output_axes;

    std::optional<int> find(std::string_view label) const {
        for (std::size_t i = 0; i < vars.size(); ++i)
            if (vars[i].label == label) return static_cast<int>(i);
        return std::nullopt;
    }
    std::optional<int> find(dim_id dim) const {
        for (std::size_t i = 0; i < vars.size(); ++i)
            if (vars[i].dim == dim) return static_cast<int>(i);
        return std::nullopt;
    }

    // The effect on every operand of splitting variable `v`. An output axis is sliced only
    // when the variable is the outermost of that axis.
    split_option effect_of_split(int v) const {
        split_option opt;
        opt.variable = v;
        opt.label = vars[v].label;
        opt.dim = vars[v].dim;
        opt.extent = vars[v].extent;
        auto effect_on = [&](const std::vector<std::vector<int>>& axes, bool is_output) {
            for (std::size_t a = 0; a < axes.size(); ++a)
                for (int member : axes[a])
                    if (member == v) return operand_effect{split_effect::sliced, static_cast<int>(a)};
            if (is_output && vars[v].in_input) return operand_effect{split_effect::partial, -1};
            return operand_effect{split_effect::replicated, -1};
        };
        for (const auto& in : input_axes) opt.inputs.push_back(effect_on(in, false));
        for (const auto& out : output_axes) opt.outputs.push_back(effect_on(out, true));
        opt.role = dim_role::spatial;
        for (const auto& o : opt.outputs)
            if (o.effect == split_effect::partial) opt.role = dim_role::contracted;
        if (vars[v].frozen) opt.role = dim_role::frozen;
        return opt;
    }

    // Every split this node admits (frozen and inner-of-group variables excluded).
    std::vector<split_option> legal_splits() const {
        std::vector<split_option> out;
        for (std::size_t v = 0; v < vars.size(); ++v)
            if (vars[v].splittable && !vars[v].frozen) out.push_back(effect_of_split(static_cast<int>(v)));
        return out;
    }
};

// What a node's builder knows of variables that no input determines (a group's inner
// extent, an output-only dim): label -> dim and extent.
struct preset_variable {
    std::string_view label;
    dim_id dim;
    std::int64_t extent = 0;
};

namespace detail {

inline std::string describe_operand(std::span<const std::string> names, std::size_t i) {
    std::string s = "input " + std::to_string(i);
    if (i < names.size() && !names[i].empty()) s += " '" + names[i] + "'";
    return s;
}

}  // namespace detail

// Binds `sig` to the input shapes of a node of op `op_name`, checking every extent.
// Errors name the op, the input, its shape and the variable, e.g.
//   "linear 'block.0.mlp.fc': input 1 'w' axis 1 (Hidden=64) must equal variable k = 128 ..."
inline bound_signature bind_signature(const signature& sig, std::string_view op_name, std::string_view node_name,
                                      std::span<const shape> inputs, std::span<const std::string> input_names,
                                      std::span<const preset_variable> presets = {}) {
    auto where = [&] {
        std::string s(op_name);
        if (!node_name.empty()) s += " '" + std::string(node_name) + "'";
        return s;
    };
    if (inputs.size() != sig.input_count)
        throw shape_error(where() + ": expects " + std::to_string(sig.input_count) + " inputs, got " +
                          std::to_string(inputs.size()));

    bound_signature b;
    // Named variables first, in declaration order; ellipsis dims are appended as found.
    for (int v = 0; v < sig.var_count; ++v) {
        bound_variable bv;
        bv.label = std::string(sig.vars[v].view());
        bv.frozen = sig.vars[v].frozen;
        bv.splittable = sig.splittable(v);
        bv.in_input = sig.vars[v].in_input;
        bv.in_output = sig.vars[v].in_output;
        b.vars.push_back(bv);
    }
    for (const auto& p : presets) {
        auto v = sig.find(p.label);
        if (!v) throw shape_error(where() + ": preset for unknown dim variable '" + std::string(p.label) + "'");
        b.vars[*v].dim = p.dim;
        b.vars[*v].extent = p.extent;
    }

    std::optional<std::size_t> ellipsis_rank;
    int ellipsis_first_var = static_cast<int>(b.vars.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        const auto& op = sig.inputs[i];
        const shape& s = inputs[i];
        std::size_t lead = 0;
        if (op.ellipsis) {
            if (s.rank() < op.rank)
                throw shape_error(where() + ": " + detail::describe_operand(input_names, i) + " has shape " +
                                  s.to_string() + " but needs at least " + std::to_string(op.rank) + " axes");
            lead = s.rank() - op.rank;
            if (!ellipsis_rank) {
                ellipsis_rank = lead;
                for (std::size_t a = 0; a < lead; ++a) {
                    bound_variable bv;
                    bv.label = "..." + std::to_string(a);
                    bv.dim = s.dim(a);
                    bv.extent = s.extent(a);
                    bv.in_input = true;
                    bv.in_output = sig.ellipsis_in_outputs();
                    b.vars.push_back(bv);
                }
            } else if (*ellipsis_rank != lead) {
                throw shape_error(where() + ": " + detail::describe_operand(input_names, i) + " has shape " +
                                  s.to_string() + " with " + std::to_string(lead) + " leading axes where input 0 has " +
                                  std::to_string(*ellipsis_rank) + "; leading (batch-like) axes must match");
            }
        } else if (s.rank() != op.rank) {
            throw shape_error(where() + ": " + detail::describe_operand(input_names, i) + " has shape " +
                              s.to_string() + " (rank " + std::to_string(s.rank()) + ") but the op expects rank " +
                              std::to_string(op.rank));
        }
        std::vector<std::vector<int>> axes;
        for (std::size_t a = 0; a < lead; ++a) {
            int v = ellipsis_first_var + static_cast<int>(a);
            if (b.vars[v].extent != s.extent(a))
                throw shape_error(where() + ": " + detail::describe_operand(input_names, i) + " has shape " +
                                  s.to_string() + "; leading axis " + std::to_string(a) + " is " +
                                  std::to_string(s.extent(a)) + " but input 0 has " + std::to_string(b.vars[v].extent));
            axes.push_back({v});
        }
        for (std::size_t a = 0; a < op.rank; ++a) {
            const auto& term = op.axes[a];
            const axis& ax = s[lead + a];
            std::vector<int> members(term.vars.begin(), term.vars.begin() + term.count);
            if (term.count == 1) {
                auto& var = b.vars[members[0]];
                if (var.extent == 0) {
                    var.extent = ax.extent;
                    var.dim = ax.dim;
                } else if (var.extent != ax.extent) {
                    throw shape_error(where() + ": " + detail::describe_operand(input_names, i) +
                                      " has shape " + s.to_string() + "; its axis " + std::to_string(lead + a) + " (" +
                                      std::string(ax.dim.name()) + "=" + std::to_string(ax.extent) +
                                      ") must equal dim variable '" + var.label + "' = " + std::to_string(var.extent) +
                                      " (" + std::string(var.dim.name()) + ") as fixed by an earlier operand");
                } else if (var.dim.empty()) {
                    var.dim = ax.dim;
                }
            } else {
                // A group: at most one member may be unknown; it is deduced by division.
                std::int64_t known = 1;
                int unknown = -1;
                for (int m : members) {
                    if (b.vars[m].extent == 0) {
                        if (unknown >= 0)
                            throw shape_error(where() + ": cannot deduce two dims of a group from axis " +
                                              std::to_string(lead + a) + " of " +
                                              detail::describe_operand(input_names, i));
                        unknown = m;
                    } else {
                        known *= b.vars[m].extent;
                    }
                }
                if (unknown >= 0) {
                    if (known == 0 || ax.extent % known != 0)
                        throw shape_error(where() + ": axis " + std::string(ax.dim.name()) + "=" +
                                          std::to_string(ax.extent) + " of " +
                                          detail::describe_operand(input_names, i) +
                                          " is not divisible by " + std::to_string(known) + "; choose extents that divide");
                    b.vars[unknown].extent = ax.extent / known;
                    if (b.vars[unknown].dim.empty()) b.vars[unknown].dim = ax.dim;
                } else if (known != ax.extent) {
                    throw shape_error(where() + ": axis " + std::string(ax.dim.name()) + "=" +
                                      std::to_string(ax.extent) + " of " +
                                      detail::describe_operand(input_names, i) + " must equal " +
                                      std::to_string(known));
                }
            }
            axes.push_back(std::move(members));
        }
        b.input_axes.push_back(std::move(axes));
    }

    // Output axes (shapes are inferred later from these and the variables' extents).
    for (int o = 0; o < sig.output_count; ++o) {
        const auto& op = sig.outputs[o];
        std::vector<std::vector<int>> axes;
        if (op.ellipsis) {
            if (!ellipsis_rank)
                throw shape_error(where() + ": output uses '...' but no input does");
            for (std::size_t a = 0; a < *ellipsis_rank; ++a) axes.push_back({ellipsis_first_var + static_cast<int>(a)});
        }
        for (std::size_t a = 0; a < op.rank; ++a) {
            const auto& term = op.axes[a];
            axes.emplace_back(term.vars.begin(), term.vars.begin() + term.count);
        }
        b.output_axes.push_back(std::move(axes));
    }
    for (const auto& var : b.vars)
        if (var.extent == 0 && var.in_output)
            throw shape_error(where() + ": the extent of output dim variable '" + var.label +
                              "' is not determined by any input; the op must preset it");
    return b;
}

// The shape of output `o` from a bound signature. A group axis needs a name: `group_dim`.
inline shape output_shape(const bound_signature& b, std::size_t o, dim_id group_dim = {}) {
    shape s;
    for (const auto& members : b.output_axes[o]) {
        std::int64_t extent = 1;
        for (int m : members) extent *= b.vars[m].extent;
        dim_id d = members.size() == 1 ? b.vars[members[0]].dim : group_dim;
        s.push_back({d, extent});
    }
    return s;
}

}  // namespace loom
// ---- end loom/core/signature.hpp ----
// ---- begin loom/core/typed_signature.hpp ----
// Signatures built from dim tag types instead of text: each dim variable is named after its
// tag, so the result is exactly what parsing the spelled-out text gives.
//
//   using loom::Dim::Batch, loom::Dim::Hidden, loom::Dim::FFN;
//   constexpr signature s = signature_from<inputs<dims<Batch, Hidden>, dims<FFN, Hidden>>,
//                                          outputs<dims<Batch, FFN>>>();
//   // == parse_signature("Batch Hidden, FFN Hidden -> Batch FFN"): Hidden is contracted.
//
// `frozen<D>` marks a dim that must not be split: dims<Batch, frozen<Hidden>>.
#include <array>
#include <cstddef>
#include <string_view>


namespace loom {

template <dim_tag D>
struct frozen {};

template <class... Dims>
struct dims {};

template <class... Operands>
struct inputs {};

template <class... Operands>
struct outputs {};

namespace detail {

struct signature_text {
    std::array<char, 512> chars{};
    std::size_t size = 0;

    constexpr void append(std::string_view s) {
        for (char c : s) chars[size++] = c;
    }
    constexpr std::string_view view() const { return {chars.data(), size}; }
};

template <class D>
struct dim_spelling {
    static constexpr void write(signature_text& t) { t.append(D::name); }
};
template <class D>
struct dim_spelling<frozen<D>> {
    static constexpr void write(signature_text& t) {
        t.append(D::name);
        t.append("^");
    }
};

template <class Operand>
struct operand_spelling;
template <class... Ds>
struct operand_spelling<dims<Ds...>> {
    static constexpr void write(signature_text& t) {
        bool first = true;
        ((t.append(first ? "" : " "), dim_spelling<Ds>::write(t), first = false), ...);
    }
};

template <class... Operands>
constexpr void write_operands(signature_text& t) {
    bool first = true;
    ((t.append(first ? "" : ", "), operand_spelling<Operands>::write(t), first = false), ...);
}

template <class In, class Out>
struct signature_spelling;
template <class... Ins, class... Outs>
struct signature_spelling<inputs<Ins...>, outputs<Outs...>> {
    static constexpr signature_text text() {
        signature_text t;
        write_operands<Ins...>(t);
        t.append(" -> ");
        write_operands<Outs...>(t);
        return t;
    }
};

}  // namespace detail

template <class Inputs, class Outputs>
constexpr signature signature_from() {
    constexpr detail::signature_text text = detail::signature_spelling<Inputs, Outputs>::text();
    return parse_signature(text.view());
}

}  // namespace loom
// ---- end loom/core/typed_signature.hpp ----

// graph
// ---- begin loom/graph/attributes.hpp ----
// Per-node attributes: the few scalars an op needs beyond its inputs (a scale factor, an
// epsilon, a dropout seed, a head count). Kept as named values so that plans, traces and
// plan files can print and store them without knowing every op.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>


namespace loom {

using attribute_value = std::variant<std::int64_t, double, std::string, std::vector<std::int64_t>>;

class attributes {
public:
    attributes() = default;
    attributes(std::initializer_list<std::pair<std::string, attribute_value>> items) : items_(items) {}

    attributes& set(std::string_view key, attribute_value value) {
        for (auto& [k, v] : items_)
            if (k == key) {
                v = std::move(value);
                return *this;
            }
        items_.emplace_back(std::string(key), std::move(value));
        return *this;
    }

    bool has(std::string_view key) const { return find(key) != nullptr; }

    template <class T>
    T get(std::string_view key) const {
        const attribute_value* v = find(key);
        if (!v) throw usage_error("attributes: no attribute '" + std::string(key) + "'; the op's builder must set it");
        if constexpr (std::is_same_v<T, double>) {
            if (auto* i = std::get_if<std::int64_t>(v)) return static_cast<double>(*i);
        }
        if (auto* t = std::get_if<T>(v)) return *t;
        throw usage_error("attributes: attribute '" + std::string(key) + "' has another type than requested");
    }

    template <class T>
    T get_or(std::string_view key, T fallback) const {
        return has(key) ? get<T>(key) : fallback;
    }

    const std::vector<std::pair<std::string, attribute_value>>& items() const { return items_; }

    friend bool operator==(const attributes&, const attributes&) = default;

private:
    const attribute_value* find(std::string_view key) const {
        for (const auto& [k, v] : items_)
            if (k == key) return &v;
        return nullptr;
    }
    std::vector<std::pair<std::string, attribute_value>> items_;
};

}  // namespace loom
// ---- end loom/graph/attributes.hpp ----
// ---- begin loom/graph/autograd.hpp ----
// Reverse-mode differentiation as a graph transformation: the backward pass is appended
// to the same graph as ordinary nodes (marked `backward`, pointing at the forward node
// they differentiate), so plans partition it and programs run it like the forward pass.
//
// For every parameter p the graph afterwards holds a tensor "grad/<p>" with role
// `gradient`, listed in graph::gradients. A tensor read by several ops accumulates its
// gradient with `add`; a parameter that does not reach the loss gets a zero gradient.
#include <optional>
#include <string>
#include <vector>

// ---- begin loom/graph/builder.hpp ----
// The expression builder: models are ordinary C++ that call op functions on `tensor`
// handles; each call checks shapes against the op's signature and appends one node.
//
//   graph_builder b;
//   auto x = b.input("x", {{Dim::Batch, 4}, {Dim::Hidden, 8}});
//   auto w = b.parameter("w", {{Dim::FFN, 16}, {Dim::Hidden, 8}}, parameter_init::normal(0.02));
//   auto y = ops::gelu(ops::linear(x, w));          // node "linear", node "gelu"
//
// Scopes name layers: inside `auto s = b.scope("mlp");` the parameter above is "mlp.w" and
// the node is "mlp/linear". `b.repeat("blocks", 12, body)` records a repeated block.
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

// ---- begin loom/graph/graph.hpp ----
// The IR: tensors, ops (nodes) and named layer scopes. A graph is built by graph_builder
// (graph/builder.hpp) in topological order, so the node vector is already a valid
// execution order; autograd appends the backward nodes after the forward ones.
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

// ---- begin loom/graph/parameter_init.hpp ----
// How a parameter is initialised. The values themselves are drawn by train/init.hpp from a
// counter-based generator keyed by (seed, parameter name, element index), so any slice of
// a parameter can be initialised on its own and equals the same slice of the whole.
#include <cstdint>
#include <string>

namespace loom {

struct parameter_init {
    enum class kind : std::uint8_t { normal, uniform, constant };
    kind distribution = kind::normal;
    double a = 0.0;  // normal: mean; uniform: low; constant: value
    double b = 0.02; // normal: standard deviation; uniform: high

    static parameter_init normal(double stddev, double mean = 0.0) { return {kind::normal, mean, stddev}; }
    static parameter_init uniform(double low, double high) { return {kind::uniform, low, high}; }
    static parameter_init constant(double value) { return {kind::constant, value, 0.0}; }
    static parameter_init zeros() { return constant(0.0); }
    static parameter_init ones() { return constant(1.0); }

    std::string to_string() const {
        switch (distribution) {
            case kind::normal: return "normal(" + std::to_string(a) + ", " + std::to_string(b) + ")";
            case kind::uniform: return "uniform(" + std::to_string(a) + ", " + std::to_string(b) + ")";
            case kind::constant: return "constant(" + std::to_string(a) + ")";
        }
        return "?";
    }
};

}  // namespace loom
// ---- end loom/graph/parameter_init.hpp ----

namespace loom {

struct op_def;

using tensor_id = std::int32_t;
using node_id = std::int32_t;
inline constexpr std::int32_t no_id = -1;

// What a tensor's elements are. Real tensors take the program's precision (float or
// double); index tensors (token ids, targets) are always int32.
enum class value_kind : std::uint8_t { real, index };

enum class tensor_role : std::uint8_t {
    input,       // fed by the caller every step (tokens, targets)
    parameter,   // trained weights
    activation,  // produced and consumed inside a step
    gradient,    // the gradient of a parameter, read by the optimizer
};

inline std::string_view to_string(tensor_role r) {
    switch (r) {
        case tensor_role::input: return "input";
        case tensor_role::parameter: return "parameter";
        case tensor_role::activation: return "activation";
        case tensor_role::gradient: return "gradient";
    }
    return "?";
}

struct tensor_desc {
    std::string name;
    shape dims;
    value_kind kind = value_kind::real;
    tensor_role role = tensor_role::activation;
    node_id producer = no_id;
    std::int32_t scope = no_id;
    parameter_init init{};        // parameters only
    tensor_id gradient_of = no_id;  // gradients only: the parameter
};

struct node {
    const op_def* op = nullptr;
    std::string name;  // "blocks.3.attn/linear.1"
    std::vector<tensor_id> inputs;
    std::vector<tensor_id> outputs;
    attributes attrs;
    bound_signature sig;
    std::int32_t scope = no_id;
    bool backward = false;       // generated by autograd
    node_id forward_of = no_id;  // for backward nodes: the forward node they differentiate
};

// A named layer scope: "blocks.3.attn" is scope "attn" inside scope "blocks" index 3.
struct scope_desc {
    std::string name;
    std::int64_t index = -1;  // position within a repeat, or -1
    std::int32_t parent = no_id;
    std::string path;
    std::int32_t repeat = no_id;  // the repeat this scope is one instance of
};

// A block recorded `count` times in a row ("blocks.0" ... "blocks.11"). The searcher folds
// these: it decides a plan for one instance and applies it to all.
struct repeat_desc {
    std::string name;
    std::int32_t parent = no_id;
    std::vector<std::int32_t> scopes;
};

class graph {
public:
    std::vector<tensor_desc> tensors;
    std::vector<node> nodes;
    std::vector<scope_desc> scopes;
    std::vector<repeat_desc> repeats;
    std::vector<tensor_id> inputs;
    std::vector<tensor_id> parameters;
    std::vector<std::pair<tensor_id, tensor_id>> gradients;  // (parameter, its gradient)
    tensor_id loss = no_id;
    std::size_t forward_nodes = 0;  // set by build_backward: how many nodes the forward pass has

    const tensor_desc& tensor(tensor_id t) const { return tensors.at(static_cast<std::size_t>(t)); }
    tensor_desc& tensor(tensor_id t) { return tensors.at(static_cast<std::size_t>(t)); }
    const node& at(node_id n) const { return nodes.at(static_cast<std::size_t>(n)); }

    std::string scope_path(std::int32_t scope) const {
        return scope == no_id ? std::string{} : scopes.at(static_cast<std::size_t>(scope)).path;
    }

    // Nodes that read each tensor, in execution order.
    std::vector<std::vector<node_id>> consumers() const {
        std::vector<std::vector<node_id>> out(tensors.size());
        for (std::size_t n = 0; n < nodes.size(); ++n)
            for (tensor_id t : nodes[n].inputs) out[static_cast<std::size_t>(t)].push_back(static_cast<node_id>(n));
        return out;
    }

    std::optional<tensor_id> find_tensor(std::string_view name) const {
        for (std::size_t t = 0; t < tensors.size(); ++t)
            if (tensors[t].name == name) return static_cast<tensor_id>(t);
        return std::nullopt;
    }

    std::int64_t parameter_count() const {
        std::int64_t n = 0;
        for (tensor_id p : parameters) n += tensor(p).dims.numel();
        return n;
    }

    // Nodes of the forward pass: the first ones, before autograd appended the backward pass
    // (whose seed, d loss / d loss = 1, is not marked backward, so flags cannot tell).
    std::size_t forward_node_count() const { return gradients.empty() ? nodes.size() : forward_nodes; }
};

}  // namespace loom
// ---- end loom/graph/graph.hpp ----
// ---- begin loom/graph/op.hpp ----
// What every op kind is at run time: a name, a dimension signature and a backward rule.
// An op kind is written once as a struct (see ops/linear.hpp for the pattern):
//
//   struct Gelu {
//       static constexpr std::string_view name = "gelu";
//       static constexpr signature sig = parse_signature("... -> ...");
//       static gradients backward(backward_context&);   // optional: absent = not differentiable
//   };
//
// and `op_def_of<Gelu>()` is its one run-time description, which nodes point to. Kernels
// are not part of an op: each backend maps the op kind to its own (runtime/host/kernels/).
#include <array>
#include <optional>
#include <span>
#include <string_view>
#include <vector>


namespace loom {

struct backward_context;
struct tensor;
class graph_builder;
class attributes;
using gradients = std::vector<std::optional<tensor>>;

// Where one piece of a partitioned node sits inside the node it was cut from: for every
// variable of the node's bound signature, the half-open range [begin, end) of its extent.
struct piece_ranges {
    std::vector<std::int64_t> begin;
    std::vector<std::int64_t> end;
};

// Appends a node of kind Op to a builder: defined in graph/builder.hpp (needs the builder).
template <class Op>
std::vector<tensor> apply_op_erased(graph_builder& b, std::span<const tensor> inputs, attributes attrs);

struct op_def {
    std::string_view name;
    signature sig;
    gradients (*backward)(backward_context&) = nullptr;
    // Floating-point operations of one node, for the cost model.
    double (*flops)(const graph&, const node&) = nullptr;
    // Appends a node of this kind with new inputs (partitioning rebuilds nodes on pieces).
    std::vector<tensor> (*apply)(graph_builder&, std::span<const tensor>, attributes) = nullptr;
    // The attributes of one piece of a node cut by a plan, for ops whose attributes depend
    // on the extents they see (a head count, a vocabulary offset). Absent: unchanged.
    attributes (*piece_attributes)(const node&, const piece_ranges&) = nullptr;
    // Executed by a communicator, not by a kernel (runtime/host/distributed_runner.hpp).
    bool communication = false;
    // The op reinterprets its input's layout (reshape): no split of it is meaningful.
    bool opaque_layout = false;
    // The op reads its inputs only for their shapes (fill_like): partitioning gives each
    // piece its output shape and moves no data to it.
    bool shape_only_inputs = false;

    bool differentiable() const { return backward != nullptr; }
};

template <class Op>
concept op_kind = requires {
    { Op::name } -> std::convertible_to<std::string_view>;
    { Op::sig } -> std::convertible_to<signature>;
};

namespace detail {

template <class Op>
double default_flops(const graph& g, const node& n) {
    // One operation per output element: right for elementwise ops; GEMM-like ops override.
    double total = 0;
    for (tensor_id t : n.outputs) total += static_cast<double>(g.tensor(t).dims.numel());
    return total;
}

template <op_kind Op>
op_def make_op_def() {
    op_def d{Op::name, Op::sig};
    d.apply = &apply_op_erased<Op>;
    if constexpr (requires { Op::communication; }) d.communication = Op::communication;
    if constexpr (requires { Op::opaque_layout; }) d.opaque_layout = Op::opaque_layout;
    if constexpr (requires { Op::shape_only_inputs; }) d.shape_only_inputs = Op::shape_only_inputs;
    if constexpr (requires(const node& n, const piece_ranges& r) { Op::piece_attributes(n, r); })
        d.piece_attributes = &Op::piece_attributes;
    if constexpr (requires(backward_context & c) { Op::backward(c); }) d.backward = &Op::backward;
    if constexpr (requires(const graph& g, const node& n) { Op::flops(g, n); })
        d.flops = &Op::flops;
    else
        d.flops = &default_flops<Op>;
    return d;
}

}  // namespace detail

// The single run-time description of op kind `Op`; nodes compare op kinds by this address.
template <op_kind Op>
const op_def& op_def_of() {
    static const op_def def = detail::make_op_def<Op>();
    return def;
}

template <op_kind Op>
bool is_op(const node& n) {
    return n.op == &op_def_of<Op>();
}

}  // namespace loom
// ---- end loom/graph/op.hpp ----

namespace loom {

class graph_builder;

// A handle to a tensor of the graph being built.
struct tensor {
    graph_builder* builder = nullptr;
    tensor_id id = no_id;

    const tensor_desc& desc() const;
    const shape& dims() const { return desc().dims; }
    const std::string& name() const { return desc().name; }
    value_kind kind() const { return desc().kind; }
    std::size_t rank() const { return dims().rank(); }
    std::int64_t extent(std::size_t axis) const { return dims().extent(axis); }
};

// Everything a backward rule sees: the forward node, handles to its inputs and outputs,
// and the gradients flowing into its outputs (absent where no gradient flows).
struct backward_context {
    graph_builder& builder;
    node_id forward;
    std::vector<tensor> inputs;
    std::vector<tensor> outputs;
    std::vector<std::optional<tensor>> grad_outputs;
    std::vector<bool> needs_grad;  // per input: does anything upstream want its gradient?

    const attributes& attrs() const;
    const node& forward_node() const;
};

class graph_builder {
public:
    class scope_guard {
    public:
        scope_guard(graph_builder& b, std::int32_t previous) : builder_(&b), previous_(previous) {}
        scope_guard(const scope_guard&) = delete;
        scope_guard& operator=(const scope_guard&) = delete;
        scope_guard(scope_guard&& o) noexcept : builder_(std::exchange(o.builder_, nullptr)), previous_(o.previous_) {}
        ~scope_guard() {
            if (builder_) builder_->current_scope_ = previous_;
        }

    private:
        graph_builder* builder_;
        std::int32_t previous_;
    };

    tensor input(std::string name, shape dims, value_kind kind = value_kind::real) {
        check_new_name(name, "input");
        tensor_id t = add_tensor(qualified(name), std::move(dims), kind, tensor_role::input);
        graph_.inputs.push_back(t);
        return {this, t};
    }

    tensor parameter(std::string name, shape dims, parameter_init init) {
        tensor_id t = add_tensor(qualified(name), std::move(dims), value_kind::real, tensor_role::parameter);
        check_new_name(graph_.tensor(t).name, "parameter", t);
        graph_.tensor(t).init = init;
        graph_.parameters.push_back(t);
        return {this, t};
    }

    // Re-enters an existing scope by id (graph rewrites replay nodes in their own scopes).
    [[nodiscard]] scope_guard enter_scope(std::int32_t scope) {
        return scope_guard(*this, std::exchange(current_scope_, scope));
    }

    // Starts a graph that shares another graph's layer scopes and repeats (for rewrites
    // that rebuild a graph node by node).
    void adopt_scopes(const graph& from) {
        graph_.scopes = from.scopes;
        graph_.repeats = from.repeats;
    }

    [[nodiscard]] scope_guard scope(std::string name, std::int64_t index = -1) {
        return scope_guard(*this, std::exchange(current_scope_, add_scope(std::move(name), index, no_id)));
    }

    // Records `count` instances of one block: body(i) builds instance i inside scope
    // "<name>.<i>". Every instance must build the same structure; the searcher relies on it.
    template <class Body>
    void repeat(std::string name, std::int64_t count, Body&& body) {
        auto r = static_cast<std::int32_t>(graph_.repeats.size());
        graph_.repeats.push_back({name, current_scope_, {}});
        for (std::int64_t i = 0; i < count; ++i) {
            std::int32_t s = add_scope(name, i, r);
            graph_.repeats[static_cast<std::size_t>(r)].scopes.push_back(s);
            scope_guard guard(*this, std::exchange(current_scope_, s));
            body(i);
        }
    }

    // Appends one node of kind `Op`; checks and binds its signature, infers its outputs.
    // Only the op's optional hooks are gathered here; the work is in append_node, which is
    // compiled once rather than once per op kind.
    template <op_kind Op>
    std::vector<tensor> apply(std::span<const tensor> ins, attributes attrs = {}) {
        op_hooks hooks;
        if constexpr (requires { Op::input_kinds; }) hooks.input_kinds = Op::input_kinds;
        if constexpr (requires { Op::output_kinds; }) hooks.output_kinds = Op::output_kinds;
        if constexpr (requires(const attributes& a, std::span<const shape> s) { Op::presets(a, s); })
            hooks.presets = [](const attributes& a, std::span<const shape> s) { return Op::presets(a, s); };
        if constexpr (requires(const bound_signature& b, const attributes& a, std::span<const shape> s,
                               const std::string& name) { Op::check(b, a, s, name); })
            hooks.check = [](const bound_signature& b, const attributes& a, std::span<const shape> s,
                             const std::string& name) { Op::check(b, a, s, name); };
        if constexpr (requires(const bound_signature& b, const attributes& a, std::span<const shape> s) {
                          Op::infer(b, a, s);
                      })
            hooks.infer = [](const bound_signature& b, const attributes& a, std::span<const shape> s) {
                return Op::infer(b, a, s);
            };
        return append_node(op_def_of<Op>(), hooks, ins, std::move(attrs));
    }

    // The optional parts of an op kind, as plain data for append_node.
    struct op_hooks {
        std::span<const value_kind> input_kinds;  // empty: every input is real
        std::span<const value_kind> output_kinds; // empty: every output is real
        std::vector<preset_variable> (*presets)(const attributes&, std::span<const shape>) = nullptr;
        void (*check)(const bound_signature&, const attributes&, std::span<const shape>, const std::string&) = nullptr;
        std::vector<shape> (*infer)(const bound_signature&, const attributes&, std::span<const shape>) = nullptr;
    };

    std::vector<tensor> append_node(const op_def& def, const op_hooks& hooks, std::span<const tensor> ins,
                                    attributes attrs) {
        node n;
        n.op = &def;
        n.name = node_name(def.name);
        n.scope = current_scope_;
        n.backward = backward_of_ != no_id;
        n.forward_of = backward_of_;
        std::vector<shape> shapes;
        std::vector<std::string> names;
        for (const tensor& t : ins) {
            if (t.builder != this)
                throw usage_error(std::string(def.name) + " '" + n.name +
                                  "': an input tensor belongs to another graph_builder (or is empty)");
            n.inputs.push_back(t.id);
            shapes.push_back(t.dims());
            names.push_back(t.name());
        }
        for (std::size_t i = 0; i < ins.size(); ++i) {
            const value_kind want = i < hooks.input_kinds.size() ? hooks.input_kinds[i] : value_kind::real;
            if (ins[i].kind() == want) continue;
            auto kind_name = [](value_kind k) { return k == value_kind::index ? "an index tensor (int32)" : "a real tensor"; };
            throw shape_error(std::string(def.name) + " '" + n.name + "': input " + std::to_string(i) + " '" +
                              names[i] + "' is " + kind_name(ins[i].kind()) + " but must be " + kind_name(want) +
                              "; pass the tensor of the right kind");
        }
        std::vector<preset_variable> presets;
        if (hooks.presets) presets = hooks.presets(attrs, shapes);
        n.sig = bind_signature(def.sig, def.name, n.name, shapes, names, presets);
        if (hooks.check) hooks.check(n.sig, attrs, shapes, n.name);
        std::vector<shape> out_shapes;
        if (hooks.infer) {
            out_shapes = hooks.infer(n.sig, attrs, shapes);
        } else {
            for (std::size_t o = 0; o < n.sig.output_axes.size(); ++o) out_shapes.push_back(output_shape(n.sig, o));
        }
        n.attrs = std::move(attrs);
        auto id = static_cast<node_id>(graph_.nodes.size());
        std::vector<tensor> outs;
        for (std::size_t o = 0; o < out_shapes.size(); ++o) {
            std::string tname = out_shapes.size() == 1 ? n.name : n.name + ":" + std::to_string(o);
            const value_kind kind = o < hooks.output_kinds.size() ? hooks.output_kinds[o] : value_kind::real;
            tensor_id t = add_tensor(std::move(tname), std::move(out_shapes[o]), kind, tensor_role::activation);
            graph_.tensor(t).producer = id;
            n.outputs.push_back(t);
            outs.push_back({this, t});
        }
        ++name_counts_[name_base(def.name)];
        graph_.nodes.push_back(std::move(n));
        return outs;
    }

    // Appends a node without binding a signature: for the ops plans insert between pieces
    // (ops/assemble.hpp), whose number of inputs varies and whose outputs are given.
    std::vector<tensor> append_unchecked(const op_def& def, std::span<const tensor> ins, std::vector<shape> out_shapes,
                                         attributes attrs, std::string name, value_kind kind = value_kind::real) {
        node n;
        n.op = &def;
        n.name = std::move(name);
        n.scope = current_scope_;
        n.backward = backward_of_ != no_id;
        n.forward_of = backward_of_;
        for (const tensor& t : ins) n.inputs.push_back(t.id);
        n.attrs = std::move(attrs);
        auto id = static_cast<node_id>(graph_.nodes.size());
        std::vector<tensor> outs;
        for (std::size_t o = 0; o < out_shapes.size(); ++o) {
            tensor_id t = add_tensor(n.name + (out_shapes.size() == 1 ? "" : ":" + std::to_string(o)),
                                     std::move(out_shapes[o]), kind, tensor_role::activation);
            graph_.tensor(t).producer = id;
            n.outputs.push_back(t);
            outs.push_back({this, t});
        }
        graph_.nodes.push_back(std::move(n));
        return outs;
    }

    // Adds a leaf tensor (input or parameter) without the name-uniqueness scan, for graphs
    // generated by plans that name their tensors themselves.
    tensor add_leaf(std::string name, shape dims, value_kind kind, tensor_role role) {
        tensor_id t = add_tensor(std::move(name), std::move(dims), kind, role);
        (role == tensor_role::parameter ? graph_.parameters : graph_.inputs).push_back(t);
        return {this, t};
    }

    template <op_kind Op>
    tensor apply1(std::initializer_list<tensor> ins, attributes attrs = {}) {
        auto outs = apply<Op>(std::span<const tensor>(ins.begin(), ins.size()), std::move(attrs));
        return outs.at(0);
    }

    void set_loss(tensor loss) {
        if (loss.rank() != 0)
            throw shape_error("set_loss: the loss '" + loss.name() + "' has shape " + loss.dims().to_string() +
                              "; reduce it to a scalar (mean or sum) first");
        graph_.loss = loss.id;
    }

    tensor handle(tensor_id t) { return {this, t}; }

    const graph& view() const { return graph_; }
    graph& mutable_graph() { return graph_; }

    // Marks the nodes appended while the guard lives as the backward of node `forward`.
    class backward_guard {
    public:
        backward_guard(graph_builder& b, node_id forward)
            : builder_(b), previous_(std::exchange(b.backward_of_, forward)),
              previous_scope_(std::exchange(b.current_scope_, b.graph_.at(forward).scope)) {}
        ~backward_guard() {
            builder_.backward_of_ = previous_;
            builder_.current_scope_ = previous_scope_;
        }
        backward_guard(const backward_guard&) = delete;
        backward_guard& operator=(const backward_guard&) = delete;

    private:
        graph_builder& builder_;
        node_id previous_;
        std::int32_t previous_scope_;
    };

    // Renames a tensor (autograd names parameter gradients "grad/<param>").
    void rename(tensor_id t, std::string name) { graph_.tensor(t).name = std::move(name); }

    graph take() && { return std::move(graph_); }

private:
    std::string qualified(const std::string& name) const {
        std::string path = graph_.scope_path(current_scope_);
        return path.empty() ? name : path + "." + name;
    }

    void check_new_name(const std::string& full, std::string_view what, tensor_id except = no_id) const {
        for (std::size_t t = 0; t < graph_.tensors.size(); ++t)
            if (static_cast<tensor_id>(t) != except && graph_.tensors[t].name == full)
                throw usage_error(std::string(what) + " '" + full +
                                  "': a tensor of this name already exists; give it another name or scope");
    }

    tensor_id add_tensor(std::string name, shape dims, value_kind kind, tensor_role role) {
        for (const auto& a : dims)
            if (a.extent <= 0)
                throw shape_error("tensor '" + name + "': extent of dim " + std::string(a.dim.name()) + " is " +
                                  std::to_string(a.extent) + "; every extent must be positive");
        tensor_desc d;
        d.name = std::move(name);
        d.dims = std::move(dims);
        d.kind = kind;
        d.role = role;
        d.scope = current_scope_;
        graph_.tensors.push_back(std::move(d));
        return static_cast<tensor_id>(graph_.tensors.size() - 1);
    }

    std::int32_t add_scope(std::string name, std::int64_t index, std::int32_t repeat) {
        scope_desc s;
        s.parent = current_scope_;
        std::string parent_path = graph_.scope_path(current_scope_);
        s.path = (parent_path.empty() ? "" : parent_path + ".") + name + (index >= 0 ? "." + std::to_string(index) : "");
        s.name = std::move(name);
        s.index = index;
        s.repeat = repeat;
        for (std::size_t i = 0; i < graph_.scopes.size(); ++i)
            if (graph_.scopes[i].path == s.path) return static_cast<std::int32_t>(i);  // re-entering a scope
        graph_.scopes.push_back(std::move(s));
        return static_cast<std::int32_t>(graph_.scopes.size() - 1);
    }

    std::string name_base(std::string_view op) const {
        std::string base = graph_.scope_path(current_scope_);
        return (base.empty() ? "" : base + "/") + (backward_of_ != no_id ? "grad." : "") + std::string(op);
    }

    // "<scope>/<op>", then "<scope>/<op>.1", ... (counted only once a node is added).
    std::string node_name(std::string_view op) const {
        std::string base = name_base(op);
        auto it = name_counts_.find(base);
        return it == name_counts_.end() || it->second == 0 ? base : base + "." + std::to_string(it->second);
    }

    graph graph_;
    std::int32_t current_scope_ = no_id;
    node_id backward_of_ = no_id;
    std::map<std::string, int> name_counts_;
};

inline const tensor_desc& tensor::desc() const {
    if (!builder) throw usage_error("tensor: this handle is empty; build it with a graph_builder");
    return builder->view().tensor(id);
}

template <class Op>
std::vector<tensor> apply_op_erased(graph_builder& b, std::span<const tensor> inputs, attributes attrs) {
    return b.template apply<Op>(inputs, std::move(attrs));
}

inline const attributes& backward_context::attrs() const { return builder.view().at(forward).attrs; }
inline const node& backward_context::forward_node() const { return builder.view().at(forward); }

}  // namespace loom
// ---- end loom/graph/builder.hpp ----
// ---- begin loom/ops/add.hpp ----
// add: y = a + b, same shapes ("..., ... -> ..."). Also what autograd uses to accumulate
// the gradient of a tensor read by several ops.

namespace loom::ops {

struct Add {
    static constexpr std::string_view name = "add";
    static constexpr signature sig = parse_signature("..., ... -> ...");
    static gradients backward(backward_context& c) {
        gradients g(2);
        if (c.needs_grad[0]) g[0] = *c.grad_outputs[0];
        if (c.needs_grad[1]) g[1] = *c.grad_outputs[0];
        return g;
    }
};

inline tensor add(tensor a, tensor b) { return a.builder->apply1<Add>({a, b}); }

}  // namespace loom::ops

namespace loom {
// Found by argument-dependent lookup on loom::tensor.
inline tensor operator+(tensor a, tensor b) { return ops::add(a, b); }
}  // namespace loom
// ---- end loom/ops/add.hpp ----
// ---- begin loom/ops/fill.hpp ----
// fill_like: a tensor of the shape of `like`, every element `value`. Seeds the backward
// pass (d loss / d loss = 1) and gives unused parameters a zero gradient. `like` is read
// only for its shape, so partitioning slices the output exactly as it slices `like`.

namespace loom::ops {

struct FillLike {
    static constexpr std::string_view name = "fill_like";
    static constexpr signature sig = parse_signature("... -> ...");
    // A partitioned fill_like needs no data: the seed of the backward pass does not wait
    // for the loss to be summed (pipelines start backward passes before the last forward).
    static constexpr bool shape_only_inputs = true;
};

inline tensor fill_like(tensor like, double value) {
    return like.builder->apply1<FillLike>({like}, {{"value", value}});
}

}  // namespace loom::ops
// ---- end loom/ops/fill.hpp ----
// ---- begin loom/ops/identity.hpp ----
// identity: y = x. Does nothing to values; exists so that a plan can transform a point in
// the graph on its own (ZeRO partitions parameters by splitting an identity placed after
// them) and so that one tensor can be given two roles (a gradient shared by two parameters).

namespace loom::ops {

struct Identity {
    static constexpr std::string_view name = "identity";
    static constexpr signature sig = parse_signature("... -> ...");
    static gradients backward(backward_context& c);
};

inline tensor identity(tensor x) { return x.builder->apply1<Identity>({x}); }

inline gradients Identity::backward(backward_context& c) { return {identity(*c.grad_outputs[0])}; }

}  // namespace loom::ops
// ---- end loom/ops/identity.hpp ----

namespace loom {

inline void build_backward(graph_builder& b) {
    const graph& g = b.view();
    if (g.loss == no_id) throw usage_error("build_backward: the graph has no loss; call graph_builder::set_loss first");
    if (!g.gradients.empty()) throw usage_error("build_backward: the graph already has a backward pass");

    const std::size_t forward_nodes = g.nodes.size();
    b.mutable_graph().forward_nodes = forward_nodes;
    // Which tensors depend on a parameter (forward sweep) ...
    std::vector<bool> depends(g.tensors.size(), false);
    for (tensor_id p : g.parameters) depends[static_cast<std::size_t>(p)] = true;
    for (std::size_t i = 0; i < forward_nodes; ++i) {
        const node& n = g.nodes[i];
        if (!n.op->differentiable()) continue;
        bool any = false;
        for (tensor_id t : n.inputs) any = any || depends[static_cast<std::size_t>(t)];
        for (tensor_id t : n.outputs) depends[static_cast<std::size_t>(t)] = any;
    }
    // ... and which the loss depends on (backward sweep).
    std::vector<bool> reaches_loss(g.tensors.size(), false);
    reaches_loss[static_cast<std::size_t>(g.loss)] = true;
    for (std::size_t i = forward_nodes; i-- > 0;) {
        const node& n = g.nodes[i];
        bool any = false;
        for (tensor_id t : n.outputs) any = any || reaches_loss[static_cast<std::size_t>(t)];
        if (any)
            for (tensor_id t : n.inputs) reaches_loss[static_cast<std::size_t>(t)] = true;
    }

    std::vector<std::optional<tensor>> grad(g.tensors.size());
    auto accumulate = [&](tensor_id t, tensor contribution, const node& from) {
        const shape& want = b.view().tensor(t).dims;
        if (!same_extents(contribution.dims(), want))
            throw error("build_backward: the backward rule of " + std::string(from.op->name) + " '" + from.name +
                        "' produced a gradient of shape " + contribution.dims().to_string() + " for '" +
                        b.view().tensor(t).name + "' of shape " + want.to_string() + "; the op's backward is wrong");
        auto& slot = grad[static_cast<std::size_t>(t)];
        slot = slot ? ops::add(*slot, contribution) : contribution;
    };

    grad[static_cast<std::size_t>(g.loss)] = ops::fill_like(b.handle(g.loss), 1.0);
    for (std::size_t i = forward_nodes; i-- > 0;) {
        // A copy: the backward rule appends nodes, which may move the node vector.
        const node n = b.view().nodes[i];
        if (!n.op->differentiable()) continue;
        bool any_grad = false;
        for (tensor_id t : n.outputs) any_grad = any_grad || grad[static_cast<std::size_t>(t)].has_value();
        if (!any_grad) continue;
        std::vector<bool> needs;
        bool any_need = false;
        for (tensor_id t : n.inputs) {
            bool need = depends[static_cast<std::size_t>(t)] && reaches_loss[static_cast<std::size_t>(t)];
            needs.push_back(need);
            any_need = any_need || need;
        }
        if (!any_need) continue;

        auto forward = static_cast<node_id>(i);
        graph_builder::backward_guard guard(b, forward);
        backward_context ctx{b, forward, {}, {}, {}, needs};
        for (tensor_id t : n.inputs) ctx.inputs.push_back(b.handle(t));
        for (tensor_id t : n.outputs) {
            ctx.outputs.push_back(b.handle(t));
            const auto& gt = grad[static_cast<std::size_t>(t)];
            // An output no one differentiates still needs a gradient if a sibling has one.
            ctx.grad_outputs.push_back(gt ? gt : std::optional<tensor>(ops::fill_like(b.handle(t), 0.0)));
        }
        gradients result = n.op->backward(ctx);
        if (result.size() != n.inputs.size())
            throw error("build_backward: the backward rule of " + std::string(n.op->name) + " returned " +
                        std::to_string(result.size()) + " gradients for " + std::to_string(n.inputs.size()) +
                        " inputs");
        for (std::size_t k = 0; k < n.inputs.size(); ++k)
            if (needs[k] && result[k]) accumulate(n.inputs[k], *result[k], n);
    }

    graph& mg = b.mutable_graph();
    std::vector<bool> claimed(mg.tensors.size(), false);
    std::vector<tensor_id> params = mg.parameters;
    for (tensor_id p : params) {
        tensor gt = grad[static_cast<std::size_t>(p)] ? *grad[static_cast<std::size_t>(p)] : tensor{};
        // A parameter that does not reach the loss has a zero gradient.
        if (!gt.builder) gt = ops::fill_like(b.handle(p), 0.0);
        claimed.resize(b.view().tensors.size(), false);
        const tensor_desc& d = b.view().tensor(gt.id);
        // A gradient tensor must be owned by one parameter only and be an intermediate.
        if (claimed[static_cast<std::size_t>(gt.id)] || d.role != tensor_role::activation) {
            gt = ops::identity(gt);
            claimed.resize(b.view().tensors.size(), false);
        }
        claimed[static_cast<std::size_t>(gt.id)] = true;
        graph& g2 = b.mutable_graph();
        g2.tensor(gt.id).role = tensor_role::gradient;
        g2.tensor(gt.id).gradient_of = p;
        g2.tensor(gt.id).name = "grad/" + g2.tensor(p).name;
        g2.gradients.emplace_back(p, gt.id);
    }
}

}  // namespace loom
// ---- end loom/graph/autograd.hpp ----

// ops
// ---- begin loom/ops/all.hpp ----
// Every op kind loom ships, as one type list. Backends build their kernel tables from it,
// and plan files look op kinds up in it by name.
#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/list.hpp>

// ---- begin loom/ops/assemble.hpp ----
// The two op kinds a plan adds between the pieces of partitioned ops:
//
//   assemble  builds one piece (box `out_box`) of a logical tensor on one device from local
//             pieces (boxes `in_boxes`): a chunk (one input that contains the box), a
//             concat (inputs that tile it) or a sum (partial values of one box). It copies
//             or adds each input's intersection with the output box.
//   transfer  one device's part in a collective or point-to-point transfer; the executor
//             hands it to a communicator (attribute `transfer` indexes the plan's list).
//
// Neither is written by users or differentiated: plans create them after autograd, and
// their backward twins are created the same way from the gradients' pieces. Both are
// appended without a signature (the number of inputs varies).
#include <cstdint>
#include <string_view>
#include <vector>


namespace loom::ops {

struct Assemble {
    static constexpr std::string_view name = "assemble";
    static constexpr signature sig = parse_signature("... -> ...");
};

struct Transfer {
    static constexpr std::string_view name = "transfer";
    static constexpr signature sig = parse_signature("... -> ...");
    static constexpr bool communication = true;
};

}  // namespace loom::ops
// ---- end loom/ops/assemble.hpp ----
// ---- begin loom/ops/linear.hpp ----
// linear: y = x W^T (+ b), W stored [out, in] as in most frameworks.
//   linear       "... k, n k -> ... n"        k contracted: a split leaves partial sums
//   linear_bias  "... k, n k, n -> ... n"     k frozen: the bias would be added n times
// and the two GEMMs of its backward, whose signatures say how gradients partition:
//   linear_grad_input   "... n, n k -> ... k"   dx = dy W
//   linear_grad_weight  "... n, ... k -> n k"   dW = dy^T x, a sum over the leading dims,
//                                               so a batch split leaves partial sums (DP's all-reduce)
// ---- begin loom/ops/reduce.hpp ----
// Reductions to a scalar and over leading dims.
//   sum          "... -> "        every dim contracted: a split leaves partial sums
//   mean         "... -> "        the same, divided by the full element count (an attribute,
//                                 so a piece of a split still divides by the whole count)
//   sum_leading  "... n -> n"     the bias gradient: sum over every leading dim
//   broadcast_scalar "..., -> ..." d(sum)/dx: the scalar gradient copied to x's shape

namespace loom::ops {

struct SumLeading {
    static constexpr std::string_view name = "sum_leading";
    static constexpr signature sig = parse_signature("... n -> n");
};

struct BroadcastScalar {
    static constexpr std::string_view name = "broadcast_scalar";
    // Input 0 is read only for its shape; input 1 is the scalar; out = scale * scalar.
    static constexpr signature sig = parse_signature("..., -> ...");
};

inline tensor sum_leading(tensor x) { return x.builder->apply1<SumLeading>({x}); }
inline tensor broadcast_scalar(tensor like, tensor scalar, double scale) {
    return like.builder->apply1<BroadcastScalar>({like, scalar}, {{"scale", scale}});
}

struct Sum {
    static constexpr std::string_view name = "sum";
    static constexpr signature sig = parse_signature("... -> ");
    static gradients backward(backward_context& c) {
        return {broadcast_scalar(c.inputs[0], *c.grad_outputs[0], 1.0)};
    }
};

struct Mean {
    static constexpr std::string_view name = "mean";
    static constexpr signature sig = parse_signature("... -> ");
    static gradients backward(backward_context& c) {
        double count = c.attrs().get<double>("count");
        return {broadcast_scalar(c.inputs[0], *c.grad_outputs[0], 1.0 / count)};
    }
};

inline tensor sum(tensor x) { return x.builder->apply1<Sum>({x}); }
inline tensor mean(tensor x) {
    return x.builder->apply1<Mean>({x}, {{"count", static_cast<double>(x.dims().numel())}});
}

}  // namespace loom::ops
// ---- end loom/ops/reduce.hpp ----

namespace loom::ops {

namespace detail {
// 2 * (elements of the output) * (extent of the contracted variable)
inline double gemm_flops(const graph& g, const node& n, std::string_view contracted) {
    double out = static_cast<double>(g.tensor(n.outputs[0]).dims.numel());
    auto k = n.sig.find(contracted);
    return 2.0 * out * static_cast<double>(k ? n.sig.vars[static_cast<std::size_t>(*k)].extent : 1);
}
}  // namespace detail

struct LinearGradInput {
    static constexpr std::string_view name = "linear_grad_input";
    static constexpr signature sig = parse_signature("... n, n k -> ... k");
    static double flops(const graph& g, const node& n) { return detail::gemm_flops(g, n, "n"); }
};

struct LinearGradWeight {
    static constexpr std::string_view name = "linear_grad_weight";
    static constexpr signature sig = parse_signature("... n, ... k -> n k");
    static double flops(const graph& g, const node& n) {
        double lead = static_cast<double>(g.tensor(n.inputs[0]).dims.numel()) /
                      static_cast<double>(n.sig.vars[static_cast<std::size_t>(*n.sig.find("n"))].extent);
        return 2.0 * static_cast<double>(g.tensor(n.outputs[0]).dims.numel()) * lead;
    }
};

inline tensor linear_grad_input(tensor dy, tensor w) { return dy.builder->apply1<LinearGradInput>({dy, w}); }
inline tensor linear_grad_weight(tensor dy, tensor x) { return dy.builder->apply1<LinearGradWeight>({dy, x}); }

struct Linear {
    static constexpr std::string_view name = "linear";
    static constexpr signature sig = parse_signature("... k, n k -> ... n");
    static double flops(const graph& g, const node& n) { return detail::gemm_flops(g, n, "k"); }

    static gradients backward(backward_context& c) {
        const tensor& dy = *c.grad_outputs[0];
        gradients g(2);
        if (c.needs_grad[0]) g[0] = linear_grad_input(dy, c.inputs[1]);
        if (c.needs_grad[1]) g[1] = linear_grad_weight(dy, c.inputs[0]);
        return g;
    }
};

struct LinearBias {
    static constexpr std::string_view name = "linear_bias";
    static constexpr signature sig = parse_signature("... k^, n k^, n -> ... n");
    static double flops(const graph& g, const node& n) { return detail::gemm_flops(g, n, "k"); }

    static gradients backward(backward_context& c) {
        const tensor& dy = *c.grad_outputs[0];
        gradients g(3);
        if (c.needs_grad[0]) g[0] = linear_grad_input(dy, c.inputs[1]);
        if (c.needs_grad[1]) g[1] = linear_grad_weight(dy, c.inputs[0]);
        if (c.needs_grad[2]) g[2] = sum_leading(dy);
        return g;
    }
};

// y = x W^T
inline tensor linear(tensor x, tensor w) { return x.builder->apply1<Linear>({x, w}); }
// y = x W^T + b
inline tensor linear(tensor x, tensor w, tensor b) { return x.builder->apply1<LinearBias>({x, w, b}); }

}  // namespace loom::ops
// ---- end loom/ops/linear.hpp ----
// ---- begin loom/ops/mul.hpp ----
// mul: y = a * b elementwise, same shapes.

namespace loom::ops {

struct Mul {
    static constexpr std::string_view name = "mul";
    static constexpr signature sig = parse_signature("..., ... -> ...");
    static gradients backward(backward_context& c);
};

inline tensor mul(tensor a, tensor b) { return a.builder->apply1<Mul>({a, b}); }

inline gradients Mul::backward(backward_context& c) {
    const tensor& dy = *c.grad_outputs[0];
    gradients g(2);
    if (c.needs_grad[0]) g[0] = mul(dy, c.inputs[1]);
    if (c.needs_grad[1]) g[1] = mul(dy, c.inputs[0]);
    return g;
}

}  // namespace loom::ops

namespace loom {
// Found by argument-dependent lookup on loom::tensor.
inline tensor operator*(tensor a, tensor b) { return ops::mul(a, b); }
}  // namespace loom
// ---- end loom/ops/mul.hpp ----
// ---- begin loom/ops/scale.hpp ----
// scale: y = s * x for a constant s (an attribute, not a tensor).

namespace loom::ops {

struct Scale {
    static constexpr std::string_view name = "scale";
    static constexpr signature sig = parse_signature("... -> ...");
    static gradients backward(backward_context& c);
};

inline tensor scale(tensor x, double s) { return x.builder->apply1<Scale>({x}, {{"factor", s}}); }

inline gradients Scale::backward(backward_context& c) {
    return {scale(*c.grad_outputs[0], c.attrs().get<double>("factor"))};
}

}  // namespace loom::ops
// ---- end loom/ops/scale.hpp ----
// ---- begin loom/ops/stop_gradient.hpp ----
// stop_gradient: y = x in the forward pass, and no gradient flows back through it, as
// jax.lax.stop_gradient or torch's x.detach(). AlphaFold's recycling feeds each round's
// outputs into the next round through it, so only the last round is differentiated.
//
// The op has no backward rule on purpose: autograd treats it as not differentiable, so its
// output depends on no parameter and nothing upstream of it is differentiated through it
// (not even to compute a gradient that would then be dropped).

namespace loom::ops {

struct StopGradient {
    static constexpr std::string_view name = "stop_gradient";
    static constexpr signature sig = parse_signature("... -> ...");
};

inline tensor stop_gradient(tensor x) { return x.builder->apply1<StopGradient>({x}); }

}  // namespace loom::ops
// ---- end loom/ops/stop_gradient.hpp ----
// ops-includes: elementwise
// ---- begin loom/ops/dropout.hpp ----
// dropout: y = x * mask / (1 - p), seeded and deterministic.
//   dropout       "... -> ..."   attributes p (probability of dropping, 0 <= p < 1) and seed
//   dropout_grad  "... -> ..."   input dy: dx = dy * mask / (1 - p), the same mask
// Element i at training step s is kept iff u(seed, s, i) >= p, u a counter-based hash mapped
// to [0, 1) (the law is in runtime/host/kernels/dropout.hpp), so the mask is a pure function
// of (seed, step, element index): it is never stored, and the backward recomputes it. p == 0
// is an exact identity.
//
// The index is the flat row-major index of the element in the tensor the kernel sees. A
// partitioned run, where a kernel sees a slice, must pass each element's index in the whole
// tensor, or the slices draw different masks than the unpartitioned graph.
#include <cmath>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <vector>


namespace loom::ops {

namespace detail {
inline void check_dropout_probability(std::string_view op, const attributes& a, const std::string& node_name) {
    const double p = a.get<double>("p");
    if (!(p >= 0.0 && p < 1.0)) {
        std::ostringstream msg;
        msg << op << " '" << node_name << "': p = " << p
            << " is not a drop probability; pass 0 <= p < 1 (p = 0 keeps every element)";
        throw usage_error(msg.str());
    }
    (void)a.get<std::int64_t>("seed");
}

// A piece of a partitioned dropout must draw the mask of its elements' places in the whole
// tensor: it records where its box starts ("origin") and the whole tensor's extents.
inline attributes dropout_piece_attributes(const node& n, const piece_ranges& r) {
    attributes a = n.attrs;
    std::vector<std::int64_t> origin, whole;
    for (std::size_t v = 0; v < n.sig.vars.size(); ++v) {
        origin.push_back(r.begin[v]);
        whole.push_back(n.sig.vars[v].extent);
    }
    a.set("origin", origin);
    a.set("whole", whole);
    return a;
}
}  // namespace detail

struct DropoutGrad {
    static constexpr std::string_view name = "dropout_grad";
    static constexpr signature sig = parse_signature("... -> ...");
    static void check(const bound_signature&, const attributes& a, std::span<const shape>, const std::string& node) {
        detail::check_dropout_probability(name, a, node);
    }
    static attributes piece_attributes(const node& n, const piece_ranges& r) {
        return detail::dropout_piece_attributes(n, r);
    }
};

inline tensor dropout_grad(tensor dy, double p, std::int64_t seed) {
    return dy.builder->apply1<DropoutGrad>({dy}, {{"p", p}, {"seed", seed}});
}

struct Dropout {
    static constexpr std::string_view name = "dropout";
    static constexpr signature sig = parse_signature("... -> ...");
    static void check(const bound_signature&, const attributes& a, std::span<const shape>, const std::string& node) {
        detail::check_dropout_probability(name, a, node);
    }
    static attributes piece_attributes(const node& n, const piece_ranges& r) {
        return detail::dropout_piece_attributes(n, r);
    }
    static gradients backward(backward_context& c) {
        return {dropout_grad(*c.grad_outputs[0], c.attrs().get<double>("p"), c.attrs().get<std::int64_t>("seed"))};
    }
};

// Drops each element of x with probability p and scales the kept ones by 1 / (1 - p).
inline tensor dropout(tensor x, double p, std::int64_t seed) {
    return x.builder->apply1<Dropout>({x}, {{"p", p}, {"seed", seed}});
}

}  // namespace loom::ops
// ---- end loom/ops/dropout.hpp ----
// ---- begin loom/ops/gelu.hpp ----
// gelu: GELU, tanh approximation, as PyTorch's F.gelu(x, approximate='tanh'):
//   y = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   gelu       "... -> ..."
//   gelu_grad  "..., ... -> ..."   inputs (dy, x): dx = dy * gelu'(x); elementwise in both, so
//                                  a split slices dy and x alike

namespace loom::ops {

struct GeluGrad {
    static constexpr std::string_view name = "gelu_grad";
    static constexpr signature sig = parse_signature("..., ... -> ...");
};

inline tensor gelu_grad(tensor dy, tensor x) { return dy.builder->apply1<GeluGrad>({dy, x}); }

struct Gelu {
    static constexpr std::string_view name = "gelu";
    static constexpr signature sig = parse_signature("... -> ...");
    static gradients backward(backward_context& c) { return {gelu_grad(*c.grad_outputs[0], c.inputs[0])}; }
};

inline tensor gelu(tensor x) { return x.builder->apply1<Gelu>({x}); }

}  // namespace loom::ops
// ---- end loom/ops/gelu.hpp ----
// ---- begin loom/ops/relu.hpp ----
// relu: y = max(x, 0), as PyTorch's F.relu.
//   relu       "... -> ..."
//   relu_grad  "..., ... -> ..."   inputs (dy, x): dx = dy where x > 0, else 0 (0 at x == 0,
//                                  as PyTorch; a NaN x passes dy, as PyTorch's threshold_backward)

namespace loom::ops {

struct ReluGrad {
    static constexpr std::string_view name = "relu_grad";
    static constexpr signature sig = parse_signature("..., ... -> ...");
};

inline tensor relu_grad(tensor dy, tensor x) { return dy.builder->apply1<ReluGrad>({dy, x}); }

struct Relu {
    static constexpr std::string_view name = "relu";
    static constexpr signature sig = parse_signature("... -> ...");
    static gradients backward(backward_context& c) { return {relu_grad(*c.grad_outputs[0], c.inputs[0])}; }
};

inline tensor relu(tensor x) { return x.builder->apply1<Relu>({x}); }

}  // namespace loom::ops
// ---- end loom/ops/relu.hpp ----
// ---- begin loom/ops/silu.hpp ----
// silu: y = x sigmoid(x), as PyTorch's F.silu.
//   silu       "... -> ..."
//   silu_grad  "..., ... -> ..."   inputs (dy, x): dx = dy s (1 + x (1 - s)), s = sigmoid(x)

namespace loom::ops {

struct SiluGrad {
    static constexpr std::string_view name = "silu_grad";
    static constexpr signature sig = parse_signature("..., ... -> ...");
};

inline tensor silu_grad(tensor dy, tensor x) { return dy.builder->apply1<SiluGrad>({dy, x}); }

struct Silu {
    static constexpr std::string_view name = "silu";
    static constexpr signature sig = parse_signature("... -> ...");
    static gradients backward(backward_context& c) { return {silu_grad(*c.grad_outputs[0], c.inputs[0])}; }
};

inline tensor silu(tensor x) { return x.builder->apply1<Silu>({x}); }

}  // namespace loom::ops
// ---- end loom/ops/silu.hpp ----
// ---- begin loom/ops/softmax.hpp ----
// softmax over the last dim, as PyTorch's F.softmax(x, dim=-1):
//   y[..., j] = exp(x[..., j] - m) / sum_k exp(x[..., k] - m),  m = max_k x[..., k]
//   softmax       "... n^ -> ... n^"               n frozen: every output element depends on
//                                                  the whole row, so a slice of n is no softmax
//   softmax_grad  "... n^, ... n^ -> ... n^"       inputs (dy, y): dx = y (dy - sum_k dy[k] y[k])

namespace loom::ops {

struct SoftmaxGrad {
    static constexpr std::string_view name = "softmax_grad";
    static constexpr signature sig = parse_signature("... n^, ... n^ -> ... n^");
};

inline tensor softmax_grad(tensor dy, tensor y) { return dy.builder->apply1<SoftmaxGrad>({dy, y}); }

struct Softmax {
    static constexpr std::string_view name = "softmax";
    static constexpr signature sig = parse_signature("... n^ -> ... n^");
    // The gradient reads the output, not the input: y is what the forward keeps alive anyway.
    static gradients backward(backward_context& c) { return {softmax_grad(*c.grad_outputs[0], c.outputs[0])}; }
};

inline tensor softmax(tensor x) { return x.builder->apply1<Softmax>({x}); }

}  // namespace loom::ops
// ---- end loom/ops/softmax.hpp ----
// ops-includes: normalization
// ---- begin loom/ops/layer_norm.hpp ----
// layer_norm: y = (x - mean) / sqrt(var + eps) * gamma + beta over the last dim, with the
// biased variance, exactly as PyTorch's F.layer_norm(x, (h,), gamma, beta, eps).
//   layer_norm       "... h^, h^, h^ -> ... h^"
//   layer_norm_grad  "... h^, ... h^, h^ -> ... h^, h^, h^"   (dy, x, gamma) -> (dx, dgamma, dbeta)
// h is frozen: mean and variance need the whole row. The backward is one fused op that
// recomputes mean and rstd from x (nothing is stashed); dgamma and dbeta lack the leading
// dims, so a batch split leaves them as partial sums, which is what data parallelism sums.
#include <array>


namespace loom::ops {

struct LayerNormGrad {
    static constexpr std::string_view name = "layer_norm_grad";
    static constexpr signature sig = parse_signature("... h^, ... h^, h^ -> ... h^, h^, h^");
    // About 11 operations per element of x (statistics, dx, dgamma, dbeta).
    static double flops(const graph& g, const node& n) {
        return 11.0 * static_cast<double>(g.tensor(n.inputs[1]).dims.numel());
    }
};

struct layer_norm_grads {
    tensor dx, dgamma, dbeta;
};

// One node computes all three gradients; a caller takes the ones it needs.
inline layer_norm_grads layer_norm_grad(tensor dy, tensor x, tensor gamma, double eps) {
    std::array<tensor, 3> ins{dy, x, gamma};
    auto outs = dy.builder->apply<LayerNormGrad>(ins, {{"eps", eps}});
    return {outs[0], outs[1], outs[2]};
}

struct LayerNorm {
    static constexpr std::string_view name = "layer_norm";
    static constexpr signature sig = parse_signature("... h^, h^, h^ -> ... h^");
    // About 8 operations per element (two statistics passes, normalize, scale, shift).
    static double flops(const graph& g, const node& n) {
        return 8.0 * static_cast<double>(g.tensor(n.inputs[0]).dims.numel());
    }

    static gradients backward(backward_context& c) {
        gradients g(3);
        if (!c.needs_grad[0] && !c.needs_grad[1] && !c.needs_grad[2]) return g;
        auto d = layer_norm_grad(*c.grad_outputs[0], c.inputs[0], c.inputs[1], c.attrs().get<double>("eps"));
        if (c.needs_grad[0]) g[0] = d.dx;
        if (c.needs_grad[1]) g[1] = d.dgamma;
        if (c.needs_grad[2]) g[2] = d.dbeta;
        return g;
    }
};

// PyTorch's default eps is 1e-5 as here.
inline tensor layer_norm(tensor x, tensor gamma, tensor beta, double eps = 1e-5) {
    if (!(eps >= 0))
        throw usage_error("layer_norm: eps = " + std::to_string(eps) + " for input '" + x.name() +
                          "'; pass a non-negative epsilon (PyTorch's default is 1e-5)");
    return x.builder->apply1<LayerNorm>({x, gamma, beta}, {{"eps", eps}});
}

}  // namespace loom::ops
// ---- end loom/ops/layer_norm.hpp ----
// ---- begin loom/ops/rms_norm.hpp ----
// rms_norm: y = x * rsqrt(mean(x^2) + eps) * gamma over the last dim, as PyTorch's
// torch.nn.functional.rms_norm(x, (h,), gamma, eps).
//   rms_norm       "... h^, h^ -> ... h^"
//   rms_norm_grad  "... h^, ... h^, h^ -> ... h^, h^"   (dy, x, gamma) -> (dx, dgamma)
// h is frozen: the statistic needs the whole row. The backward recomputes rstd from x; dgamma
// lacks the leading dims, so a batch split leaves it as partial sums.
//
// eps is always explicit here (default 1e-6). PyTorch's default eps=None means
// torch.finfo(x.dtype).eps (1.19e-7 in float32, 2.22e-16 in float64), which depends on the
// precision; to match a PyTorch model, pass the eps it uses.
#include <array>


namespace loom::ops {

struct RmsNormGrad {
    static constexpr std::string_view name = "rms_norm_grad";
    static constexpr signature sig = parse_signature("... h^, ... h^, h^ -> ... h^, h^");
    // About 8 operations per element of x (statistics, dx, dgamma).
    static double flops(const graph& g, const node& n) {
        return 8.0 * static_cast<double>(g.tensor(n.inputs[1]).dims.numel());
    }
};

struct rms_norm_grads {
    tensor dx, dgamma;
};

// One node computes both gradients; a caller takes the ones it needs.
inline rms_norm_grads rms_norm_grad(tensor dy, tensor x, tensor gamma, double eps) {
    std::array<tensor, 3> ins{dy, x, gamma};
    auto outs = dy.builder->apply<RmsNormGrad>(ins, {{"eps", eps}});
    return {outs[0], outs[1]};
}

struct RmsNorm {
    static constexpr std::string_view name = "rms_norm";
    static constexpr signature sig = parse_signature("... h^, h^ -> ... h^");
    // About 5 operations per element (sum of squares, normalize, scale).
    static double flops(const graph& g, const node& n) {
        return 5.0 * static_cast<double>(g.tensor(n.inputs[0]).dims.numel());
    }

    static gradients backward(backward_context& c) {
        gradients g(2);
        if (!c.needs_grad[0] && !c.needs_grad[1]) return g;
        auto d = rms_norm_grad(*c.grad_outputs[0], c.inputs[0], c.inputs[1], c.attrs().get<double>("eps"));
        if (c.needs_grad[0]) g[0] = d.dx;
        if (c.needs_grad[1]) g[1] = d.dgamma;
        return g;
    }
};

inline tensor rms_norm(tensor x, tensor gamma, double eps = 1e-6) {
    if (!(eps >= 0))
        throw usage_error("rms_norm: eps = " + std::to_string(eps) + " for input '" + x.name() +
                          "'; pass a non-negative epsilon (e.g. 1e-6, or the eps of the model being matched)");
    return x.builder->apply1<RmsNorm>({x, gamma}, {{"eps", eps}});
}

}  // namespace loom::ops
// ---- end loom/ops/rms_norm.hpp ----
// ops-includes: attention and shapes
// ---- begin loom/ops/attention.hpp ----
// Scaled dot-product self-attention, as PyTorch's
// F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale):
//   out[i] = sum_j P_ij v_j,   P_ij = exp(S_ij - lse_i),   S_ij = scale * q_i . k_j,
//   lse_i = log sum_j exp(S_ij), the sums over j <= i when causal and over every key otherwise.
//
//   attention       "b h s^ d^, b h t^ d^, b h t^ e^ -> b h s^ e^, b h s^"
//   attention_grad  "b h s^ e^, b h s^ d^, b h t^ d^, b h t^ e^, b h s^ e^, b h s^
//                      -> b h s^ d^, b h t^ d^, b h t^ e^"
// Batch and heads split cleanly. The sequence and head dims are frozen: a softmax row needs
// every key, and a split of d or e would need the scores (and lse) reduced across parts.
//
// lse is kept for the backward, which recomputes P from q, k and lse (flash-attention
// style), so no s x t matrix outlives a kernel. With D_i = sum_e dout_ie out_ie:
//   dv = P^T dout,   dP = dout v^T,   dS = P * (dP - D),   dq = scale dS k,   dk = scale dS^T q.
// The backward propagates the gradient of `out` only; lse is an output for the backward's
// sake, and a graph that differentiates through it is refused.
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>


namespace loom::ops {

namespace detail {

inline double attention_extent(const node& n, std::string_view var) {
    auto v = n.sig.find(var);
    return v ? static_cast<double>(n.sig.vars[static_cast<std::size_t>(*v)].extent) : 0.0;
}

// Query-key pairs that carry a score: the lower triangle when causal.
inline double attention_scored_pairs(const node& n) {
    const double s = attention_extent(n, "s"), t = attention_extent(n, "t");
    const bool causal = n.attrs.get_or<std::int64_t>("causal", 1) != 0;
    return attention_extent(n, "b") * attention_extent(n, "h") * (causal ? s * (s + 1) / 2 : s * t);
}

}  // namespace detail

struct AttentionGrad {
    static constexpr std::string_view name = "attention_grad";
    static constexpr signature sig = parse_signature(
        "b h s^ e^, b h s^ d^, b h t^ d^, b h t^ e^, b h s^ e^, b h s^ -> b h s^ d^, b h t^ d^, b h t^ e^");
    // The dim each variable always carries, for the plan combinators' compile-time checks.
    static constexpr std::pair<std::string_view, dim_id> variable_dims[] = {
        {"b", Dim::Batch::id}, {"h", Dim::Head::id},    {"s", Dim::Seq::id},
        {"t", Dim::Seq::id},   {"d", Dim::HeadDim::id}, {"e", Dim::HeadDim::id}};
    // Recomputing S, then dv, dP, dq and dk: 2 (3d + 2e) per scored pair.
    static double flops(const graph&, const node& n) {
        const double d = detail::attention_extent(n, "d"), e = detail::attention_extent(n, "e");
        return 2.0 * (3.0 * d + 2.0 * e) * detail::attention_scored_pairs(n);
    }
};

struct Attention {
    static constexpr std::string_view name = "attention";
    static constexpr signature sig = parse_signature("b h s^ d^, b h t^ d^, b h t^ e^ -> b h s^ e^, b h s^");
    // The dim each variable always carries, for the plan combinators' compile-time checks.
    static constexpr std::pair<std::string_view, dim_id> variable_dims[] = {
        {"b", Dim::Batch::id}, {"h", Dim::Head::id},    {"s", Dim::Seq::id},
        {"t", Dim::Seq::id},   {"d", Dim::HeadDim::id}, {"e", Dim::HeadDim::id}};

    static void check(const bound_signature& b, const attributes& a, std::span<const shape> in,
                      const std::string& node_name) {
        const bool causal = a.get_or<std::int64_t>("causal", 1) != 0;
        const std::int64_t s = b.vars[static_cast<std::size_t>(*b.find("s"))].extent;
        const std::int64_t t = b.vars[static_cast<std::size_t>(*b.find("t"))].extent;
        if (causal && s != t)
            throw shape_error("attention '" + node_name +
                              "': causal self-attention needs as many keys as queries, but q " + in[0].to_string() +
                              " has " + std::to_string(s) + " positions and k " + in[1].to_string() + " has " +
                              std::to_string(t) + "; pass k and v with " + std::to_string(s) +
                              " positions, or use ops::attention (not causal)");
        if (a.has("scale") && !(a.get<double>("scale") > 0.0))
            throw shape_error("attention '" + node_name + "': scale = " + std::to_string(a.get<double>("scale")) +
                              "; pass a positive scale (the default is 1/sqrt(" +
                              std::to_string(in[0].extent(3)) + "))");
    }

    // Both matrix products: 2 (d + e) per scored pair.
    static double flops(const graph&, const node& n) {
        const double d = detail::attention_extent(n, "d"), e = detail::attention_extent(n, "e");
        return 2.0 * (d + e) * detail::attention_scored_pairs(n);
    }

    static gradients backward(backward_context& c);
};

namespace detail {

inline tensor attention_out(tensor q, tensor k, tensor v, bool causal, std::optional<double> scale) {
    const double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.rank() == 4 ? q.extent(3) : 1));
    std::array<tensor, 3> ins{q, k, v};
    return q.builder->apply<Attention>(ins, {{"causal", std::int64_t{causal ? 1 : 0}}, {"scale", s}}).at(0);
}

// The backward differentiates `out` only: any gradient reaching lse other than the zeros
// autograd fills in for an unused output would be dropped.
inline void require_no_lse_gradient(const backward_context& c) {
    const graph& g = c.builder.view();
    const tensor_desc& dlse = g.tensor(c.grad_outputs[1]->id);
    if (dlse.producer != no_id) {
        const node& p = g.at(dlse.producer);
        if (is_op<FillLike>(p) && p.attrs.get<double>("value") == 0.0) return;
    }
    const node& fwd = c.forward_node();
    throw usage_error("attention '" + fwd.name + "': its log-sum-exp output '" + c.outputs[1].name() +
                      "' reaches the loss, but attention's backward propagates the gradient of '" +
                      c.outputs[0].name() + "' only; use the lse output outside differentiated computations");
}

}  // namespace detail

// Causal self-attention, as F.scaled_dot_product_attention(q, k, v, is_causal=True):
// q [b, h, s, d], k [b, h, s, d], v [b, h, s, e] -> [b, h, s, e]. scale defaults to 1/sqrt(d).
inline tensor causal_attention(tensor q, tensor k, tensor v, std::optional<double> scale = std::nullopt) {
    return detail::attention_out(q, k, v, true, scale);
}

// Attention over every key: q [b, h, s, d], k [b, h, t, d], v [b, h, t, e] -> [b, h, s, e].
inline tensor attention(tensor q, tensor k, tensor v, std::optional<double> scale = std::nullopt) {
    return detail::attention_out(q, k, v, false, scale);
}

inline gradients Attention::backward(backward_context& c) {
    detail::require_no_lse_gradient(c);
    std::array<tensor, 6> ins{*c.grad_outputs[0], c.inputs[0], c.inputs[1], c.inputs[2], c.outputs[0], c.outputs[1]};
    std::vector<tensor> d = c.builder.apply<AttentionGrad>(ins, c.attrs());
    gradients g(3);
    for (std::size_t i = 0; i < 3; ++i)
        if (c.needs_grad[i]) g[i] = d[i];
    return g;
}

}  // namespace loom::ops
// ---- end loom/ops/attention.hpp ----
// ---- begin loom/ops/heads.hpp ----
// Attention heads as an axis of their own:
//   split_heads  "b s (h d) -> b h s d"   x[b, s, h*D + d] = y[b, h, s, d]; h = attribute heads
//   merge_heads  "b h s d -> b s (h d)"   the inverse; the merged axis is named Hidden
// Heads are the outermost variable of the group, so a split into head slices is contiguous
// in the hidden axis (tensor parallelism by heads); d is inner and cannot be split.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>


namespace loom::ops {

struct SplitHeads {
    static constexpr std::string_view name = "split_heads";
    static constexpr signature sig = parse_signature("b s (h d) -> b h s d");
    // The dim each variable always carries, for the plan combinators' compile-time checks;
    // the grouped input axis (h d) is Hidden.
    static constexpr std::pair<std::string_view, dim_id> variable_dims[] = {
        {"b", Dim::Batch::id}, {"s", Dim::Seq::id}, {"h", Dim::Head::id}, {"d", Dim::HeadDim::id}, {"(h d)", Dim::Hidden::id}};

    static std::vector<preset_variable> presets(const attributes& a, std::span<const shape> in) {
        const std::int64_t heads = a.get<std::int64_t>("heads");
        if (heads <= 0)
            throw shape_error("split_heads: heads = " + std::to_string(heads) + "; pass a positive head count");
        if (in.size() == 1 && in[0].rank() == 3 && in[0].extent(2) % heads != 0) {
            const std::int64_t hidden = in[0].extent(2);
            throw shape_error("split_heads: the hidden extent " + std::to_string(hidden) + " (dim " +
                              std::string(in[0].dim(2).name()) + ") of input " + in[0].to_string() +
                              " is not divisible by heads = " + std::to_string(heads) +
                              "; choose a head count that divides " + std::to_string(hidden) +
                              " or a hidden size that is a multiple of " + std::to_string(heads));
        }
        // d's extent is deduced from the group; only its name is preset.
        return {{"h", Dim::Head::id, heads}, {"d", Dim::HeadDim::id, 0}};
    }

    // A piece split along heads holds fewer of them.
    static attributes piece_attributes(const node& n, const piece_ranges& r) {
        attributes a = n.attrs;
        auto h = static_cast<std::size_t>(*n.sig.find("h"));
        a.set("heads", r.end[h] - r.begin[h]);
        return a;
    }

    static gradients backward(backward_context& c);
};

struct MergeHeads {
    static constexpr std::string_view name = "merge_heads";
    static constexpr signature sig = parse_signature("b h s d -> b s (h d)");
    // The dim each variable always carries, for the plan combinators' compile-time checks;
    // the grouped output axis (h d) is Hidden.
    static constexpr std::pair<std::string_view, dim_id> variable_dims[] = {
        {"b", Dim::Batch::id}, {"h", Dim::Head::id}, {"s", Dim::Seq::id}, {"d", Dim::HeadDim::id}, {"(h d)", Dim::Hidden::id}};

    static std::vector<shape> infer(const bound_signature& b, const attributes&, std::span<const shape>) {
        return {output_shape(b, 0, Dim::Hidden::id)};
    }

    static gradients backward(backward_context& c);
};

// [b, s, heads * d] -> [b, heads, s, d]
inline tensor split_heads(tensor x, std::int64_t heads) {
    return x.builder->apply1<SplitHeads>({x}, {{"heads", heads}});
}
// [b, h, s, d] -> [b, s, h * d]
inline tensor merge_heads(tensor x) { return x.builder->apply1<MergeHeads>({x}); }

inline gradients SplitHeads::backward(backward_context& c) { return {merge_heads(*c.grad_outputs[0])}; }

inline gradients MergeHeads::backward(backward_context& c) {
    return {split_heads(*c.grad_outputs[0], c.inputs[0].extent(1))};
}

}  // namespace loom::ops
// ---- end loom/ops/heads.hpp ----
// ---- begin loom/ops/matmul.hpp ----
// Batched matrix products over shared leading dims, in the three layouts whose gradients
// are again products of these layouts (a closed set under differentiation):
//   matmul     "... m k, ... k n -> ... m n"   C = A B     dA = dC B^T (nt),   dB = A^T dC (tn)
//   matmul_nt  "... m k, ... n k -> ... m n"   C = A B^T   dA = dC B (nn),     dB = dC^T A (tn)
//   matmul_tn  "... k m, ... k n -> ... m n"   C = A^T B   dA = B dC^T (nt),   dB = A dC (nn)
// k is contracted (a split leaves partial sums); m, n and the leading dims are spatial.

namespace loom::ops {

struct Matmul {
    static constexpr std::string_view name = "matmul";
    static constexpr signature sig = parse_signature("... m k, ... k n -> ... m n");
    static double flops(const graph& g, const node& n) { return detail::gemm_flops(g, n, "k"); }
    static gradients backward(backward_context& c);
};

struct MatmulNT {
    static constexpr std::string_view name = "matmul_nt";
    static constexpr signature sig = parse_signature("... m k, ... n k -> ... m n");
    static double flops(const graph& g, const node& n) { return detail::gemm_flops(g, n, "k"); }
    static gradients backward(backward_context& c);
};

struct MatmulTN {
    static constexpr std::string_view name = "matmul_tn";
    static constexpr signature sig = parse_signature("... k m, ... k n -> ... m n");
    static double flops(const graph& g, const node& n) { return detail::gemm_flops(g, n, "k"); }
    static gradients backward(backward_context& c);
};

// C = A B
inline tensor matmul(tensor a, tensor b) { return a.builder->apply1<Matmul>({a, b}); }
// C = A B^T
inline tensor matmul_nt(tensor a, tensor b) { return a.builder->apply1<MatmulNT>({a, b}); }
// C = A^T B
inline tensor matmul_tn(tensor a, tensor b) { return a.builder->apply1<MatmulTN>({a, b}); }

inline gradients Matmul::backward(backward_context& c) {
    const tensor& dc = *c.grad_outputs[0];
    gradients g(2);
    if (c.needs_grad[0]) g[0] = matmul_nt(dc, c.inputs[1]);
    if (c.needs_grad[1]) g[1] = matmul_tn(c.inputs[0], dc);
    return g;
}

inline gradients MatmulNT::backward(backward_context& c) {
    const tensor& dc = *c.grad_outputs[0];
    gradients g(2);
    if (c.needs_grad[0]) g[0] = matmul(dc, c.inputs[1]);
    if (c.needs_grad[1]) g[1] = matmul_tn(dc, c.inputs[0]);
    return g;
}

inline gradients MatmulTN::backward(backward_context& c) {
    const tensor& dc = *c.grad_outputs[0];
    gradients g(2);
    if (c.needs_grad[0]) g[0] = matmul_nt(c.inputs[1], dc);
    if (c.needs_grad[1]) g[1] = matmul(c.inputs[0], dc);
    return g;
}

}  // namespace loom::ops
// ---- end loom/ops/matmul.hpp ----
// ---- begin loom/ops/reshape.hpp ----
// reshape: the same elements in row-major order under another shape (named dims included).
//
// A reshape moves elements between axes, so no dim of it can be split without changing which
// elements a slice holds: it declares no splittable dims. Its signature "... -> " only lets
// it bind to any rank; the target shape comes from `infer`, and `opaque_layout` tells plans
// to refuse every split of a reshape node (the signature's laws do not describe it).
//
// The target is kept in the attributes, so plan files and traces can print it:
//   "extents" = {8, 64, 4, 32}, "dims" = "Batch,Seq,Head,HeadDim"
#include <cstdint>
#include <string>
#include <vector>


namespace loom::ops {

namespace detail {

inline attributes reshape_attributes(const shape& target) {
    std::vector<std::int64_t> extents;
    std::string dims;
    for (std::size_t i = 0; i < target.rank(); ++i) {
        const std::string_view name = target.dim(i).name();
        if (name.find(',') != std::string_view::npos)
            throw usage_error("reshape: dim name '" + std::string(name) + "' of the target " + target.to_string() +
                              " contains ','; name dims without commas");
        if (i) dims += ',';
        dims += name;
        extents.push_back(target.extent(i));
    }
    return {{"extents", std::move(extents)}, {"dims", std::move(dims)}};
}

inline shape reshape_target(const attributes& a) {
    const auto extents = a.get<std::vector<std::int64_t>>("extents");
    const auto dims = a.get<std::string>("dims");
    shape s;
    std::size_t start = 0;
    for (std::size_t i = 0; i < extents.size(); ++i) {
        std::size_t end = dims.find(',', start);
        if (end == std::string::npos) end = dims.size();
        s.push_back({dim_id::intern(std::string_view(dims).substr(start, end - start)), extents[i]});
        start = end + 1;
    }
    return s;
}

}  // namespace detail

struct Reshape {
    static constexpr std::string_view name = "reshape";
    static constexpr signature sig = parse_signature("... -> ");
    // Plans read this and split no dim of a reshape (see the header comment).
    static constexpr bool opaque_layout = true;

    static std::vector<shape> infer(const bound_signature&, const attributes& a, std::span<const shape>) {
        return {detail::reshape_target(a)};
    }

    static void check(const bound_signature&, const attributes& a, std::span<const shape> in,
                      const std::string& node_name) {
        const shape target = detail::reshape_target(a);
        if (target.numel() != in[0].numel())
            throw shape_error("reshape '" + node_name + "': the input has shape " + in[0].to_string() + " (" +
                              std::to_string(in[0].numel()) + " elements) but the target shape " +
                              target.to_string() + " has " + std::to_string(target.numel()) +
                              " elements; choose a target with " + std::to_string(in[0].numel()) + " elements");
    }

    static gradients backward(backward_context& c);
};

// The elements of x, in row-major order, under shape `target` (same element count).
inline tensor reshape(tensor x, const shape& target) {
    return x.builder->apply1<Reshape>({x}, detail::reshape_attributes(target));
}

inline gradients Reshape::backward(backward_context& c) { return {reshape(*c.grad_outputs[0], c.inputs[0].dims())}; }

}  // namespace loom::ops
// ---- end loom/ops/reshape.hpp ----
// ---- begin loom/ops/transpose.hpp ----
// transpose: swaps the last two axes, "... a b -> ... b a"; y[..., j, i] = x[..., i, j].
// Every variable is spatial: a slice of a or b (or a leading dim) of x is the same slice of y.

namespace loom::ops {

struct Transpose {
    static constexpr std::string_view name = "transpose";
    static constexpr signature sig = parse_signature("... a b -> ... b a");
    static gradients backward(backward_context& c);
};

inline tensor transpose(tensor x) { return x.builder->apply1<Transpose>({x}); }

inline gradients Transpose::backward(backward_context& c) { return {transpose(*c.grad_outputs[0])}; }

}  // namespace loom::ops
// ---- end loom/ops/transpose.hpp ----
// ops-includes: embedding and loss
// ---- begin loom/ops/cross_entropy.hpp ----
// cross_entropy: the summed negative log-likelihood of the targets under softmax(logits),
// divided by a fixed normalizer:
//   loss = sum over kept positions p of (logsumexp(logits[p, :]) - logits[p, targets[p]]) / normalizer
// where a position is kept unless targets[p] == ignore_index.
//   cross_entropy       "... v^, ... -> "          (logits [... v], targets [...] index) -> scalar
//   cross_entropy_grad  ", ... v^, ... -> ... v^"  (dloss, logits, targets) -> dlogits
//      dlogits[p, :] = dloss * (softmax(logits[p, :]) - onehot(targets[p])) / normalizer,
//      zero rows at ignored positions.
//
// The normalizer is the attribute `normalizer`, by default the number of positions (numel
// of targets) of the whole batch, fixed when the graph is built. So with no ignored target
// the loss equals PyTorch's F.cross_entropy(logits.view(-1, v), targets.view(-1)) (mean
// reduction); with ignored targets PyTorch divides by the number of kept positions, which
// depends on the data, and loom still divides by the normalizer (pass the kept count as the
// normalizer to reproduce PyTorch for a given batch). Because the normalizer is fixed, the
// leading dims can be contracted: a batch split leaves partial sums of the same mean.
// v is frozen: the softmax needs the whole row.
//
// A target outside [0, v) that is not ignore_index is a data error: the kernel throws
// loom::usage_error naming the node, the position, the target and v.
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>


namespace loom::ops {

struct CrossEntropyGrad {
    static constexpr std::string_view name = "cross_entropy_grad";
    static constexpr signature sig = parse_signature(", ... v^, ... -> ... v^");
    static constexpr std::array<value_kind, 3> input_kinds{value_kind::real, value_kind::real, value_kind::index};
    // About 4 operations per logit (max, exp, sum, scale).
    static double flops(const graph& g, const node& n) {
        return 4.0 * static_cast<double>(g.tensor(n.inputs[1]).dims.numel());
    }
};

inline tensor cross_entropy_grad(tensor dloss, tensor logits, tensor targets, std::int64_t ignore_index,
                                 double normalizer) {
    return dloss.builder->apply1<CrossEntropyGrad>({dloss, logits, targets},
                                                   {{"ignore_index", ignore_index}, {"normalizer", normalizer}});
}

struct CrossEntropy {
    static constexpr std::string_view name = "cross_entropy";
    static constexpr signature sig = parse_signature("... v^, ... -> ");
    static constexpr std::array<value_kind, 2> input_kinds{value_kind::real, value_kind::index};
    // About 4 operations per logit (max, exp, sum, the target's term).
    static double flops(const graph& g, const node& n) {
        return 4.0 * static_cast<double>(g.tensor(n.inputs[0]).dims.numel());
    }

    static gradients backward(backward_context& c) {
        gradients g(2);
        if (c.needs_grad[0])
            g[0] = cross_entropy_grad(*c.grad_outputs[0], c.inputs[0], c.inputs[1],
                                      c.attrs().get<std::int64_t>("ignore_index"),
                                      c.attrs().get<double>("normalizer"));
        return g;
    }
};

// Mean cross-entropy of `targets` under `logits` (see above for ignore_index and the
// normalizer, which defaults to the number of positions).
inline tensor cross_entropy(tensor logits, tensor targets, std::int64_t ignore_index = -100,
                            std::optional<double> normalizer = std::nullopt) {
    const double n = normalizer ? *normalizer : static_cast<double>(targets.dims().numel());
    if (!(n > 0) || !std::isfinite(n))
        throw usage_error("cross_entropy: normalizer = " + std::to_string(n) + " for logits '" + logits.name() +
                          "'; pass a positive finite normalizer (the number of positions the mean is over)");
    return logits.builder->apply1<CrossEntropy>({logits, targets},
                                                {{"ignore_index", ignore_index}, {"normalizer", n}});
}

}  // namespace loom::ops
// ---- end loom/ops/cross_entropy.hpp ----
// ---- begin loom/ops/embedding.hpp ----
// embedding: out[p, :] = table[ids[p], :], as PyTorch's F.embedding(ids, table).
//   embedding       "..., v h -> ... h"     (ids [...] index, table [v h]) -> [... h]
//   embedding_grad  "... h, ... -> v h"     (dy [... h], ids [...]) -> dtable [v h]
//
// Attributes: `vocab`, the full vocabulary size, and `row_offset`, the first vocabulary row
// the table holds (0 unless split). The table holds rows [row_offset, row_offset + v): an
// id in that range reads row id - row_offset, any other id gives a zero row. v is
// contracted, so a vocabulary split leaves the output as partial sums whose sum is the full
// lookup: that is vocabulary-parallel embedding, each piece with its own row_offset.
// An id outside [0, vocab) is a data error: the kernel throws loom::usage_error naming the
// node, the position and the id.
//
// embedding_grad sums dy over the positions of each id (repeated ids accumulate). v is an
// output-only variable: its extent and dim come from the attributes `rows` and `row_dim`
// (the table's), and `vocab` / `row_offset` say which ids land in it, as in the forward.
// The leading dims are contracted: a batch split leaves dtable as partial sums.
#include <array>
#include <cstdint>
#include <string>
#include <vector>


namespace loom::ops {

namespace detail {
inline void check_vocabulary_range(std::string_view op, const attributes& a, std::int64_t rows,
                                   const std::string& node_name) {
    const auto vocab = a.get<std::int64_t>("vocab");
    const auto offset = a.get_or<std::int64_t>("row_offset", 0);
    if (offset < 0 || offset + rows > vocab)
        throw shape_error(std::string(op) + " '" + node_name + "': the table rows [" + std::to_string(offset) + ", " +
                          std::to_string(offset + rows) + ") are not inside the vocabulary [0, " +
                          std::to_string(vocab) + "); set row_offset and vocab so the table is a slice of it");
}
}  // namespace detail

struct EmbeddingGrad {
    static constexpr std::string_view name = "embedding_grad";
    static constexpr signature sig = parse_signature("... h, ... -> v h");
    static constexpr std::array<value_kind, 2> input_kinds{value_kind::real, value_kind::index};

    static std::vector<preset_variable> presets(const attributes& a, std::span<const shape>) {
        return {{"v", dim_id::intern(a.get<std::string>("row_dim")), a.get<std::int64_t>("rows")}};
    }
    static void check(const bound_signature&, const attributes& a, std::span<const shape>,
                      const std::string& node_name) {
        detail::check_vocabulary_range(name, a, a.get<std::int64_t>("rows"), node_name);
    }
    // A piece split along the rows accumulates only its rows of the vocabulary.
    static attributes piece_attributes(const node& n, const piece_ranges& r) {
        attributes a = n.attrs;
        auto v = static_cast<std::size_t>(*n.sig.find("v"));
        a.set("rows", r.end[v] - r.begin[v]);
        a.set("row_offset", a.get_or<std::int64_t>("row_offset", 0) + r.begin[v]);
        return a;
    }
    // One add per element of dy, plus zeroing the rows no id reaches.
    static double flops(const graph& g, const node& n) {
        return static_cast<double>(g.tensor(n.inputs[0]).dims.numel() + g.tensor(n.outputs[0]).dims.numel());
    }
};

// dtable [rows h] for a table of `rows` rows along `row_dim` starting at vocabulary row
// `row_offset` of a vocabulary of `vocab` ids.
inline tensor embedding_grad(tensor dy, tensor ids, std::int64_t rows, dim_id row_dim, std::int64_t vocab,
                             std::int64_t row_offset = 0) {
    return dy.builder->apply1<EmbeddingGrad>({dy, ids}, {{"vocab", vocab},
                                                         {"row_offset", row_offset},
                                                         {"rows", rows},
                                                         {"row_dim", std::string(row_dim.name())}});
}

struct Embedding {
    static constexpr std::string_view name = "embedding";
    static constexpr signature sig = parse_signature("..., v h -> ... h");
    static constexpr std::array<value_kind, 2> input_kinds{value_kind::index, value_kind::real};

    static void check(const bound_signature&, const attributes& a, std::span<const shape> in,
                      const std::string& node_name) {
        detail::check_vocabulary_range(name, a, in[1].extent(0), node_name);
    }
    // A piece split along the vocabulary holds rows [begin, end) of the table: ids outside
    // them give zero rows, and the pieces' outputs are partial sums (vocabulary parallel).
    static attributes piece_attributes(const node& n, const piece_ranges& r) {
        attributes a = n.attrs;
        auto v = static_cast<std::size_t>(*n.sig.find("v"));
        a.set("row_offset", a.get_or<std::int64_t>("row_offset", 0) + r.begin[v]);
        return a;
    }

    static gradients backward(backward_context& c) {
        gradients g(2);
        if (c.needs_grad[1]) {
            const shape& table = c.inputs[1].dims();
            g[1] = embedding_grad(*c.grad_outputs[0], c.inputs[0], table.extent(0), table.dim(0),
                                  c.attrs().get<std::int64_t>("vocab"),
                                  c.attrs().get_or<std::int64_t>("row_offset", 0));
        }
        return g;
    }
};

// out [... h] = table[ids]; the table [v h] holds the whole vocabulary of v ids.
inline tensor embedding(tensor ids, tensor table) {
    const std::int64_t vocab = table.rank() == 2 ? table.extent(0) : 0;
    return ids.builder->apply1<Embedding>({ids, table}, {{"vocab", vocab}, {"row_offset", std::int64_t{0}}});
}

}  // namespace loom::ops
// ---- end loom/ops/embedding.hpp ----
// ---- begin loom/ops/vocab_parallel_cross_entropy.hpp ----
// Vocabulary-parallel cross-entropy: cross_entropy rebuilt from ops whose vocabulary dim can
// be split, so that logits split along the vocabulary (Megatron's LM head) never need to be
// gathered. With the vocabulary cut into `chunks` contiguous chunks:
//
//   chunk_logsumexp          "... (c v) -> ... c"        lse[p, c] = logsumexp(logits[p, chunk c])
//   pick_target              "... v, ... -> ..."         z[p] = logits[p, targets[p]] (0 if not held)
//   cross_entropy_from_chunks "... c^, ..., ... -> "     loss = sum_p kept_p (logsumexp_c lse[p, :] - z[p]) / normalizer
//
// and their backward ops
//
//   chunk_logsumexp_grad            "... c, ... (c v), ... c -> ... (c v)"   dlogits = dlse[c] * exp(logits - lse[c])
//   pick_target_grad                "..., ... -> ... v"                      dlogits = onehot(target) * dz
//   cross_entropy_from_chunks_grad  ", ... c^, ... -> ... c^, ..."           (dlse, dz)
//
// Split along the chunks (c of chunk_logsumexp, v of pick_target), every piece reads only its
// slice of the logits: it reduces its chunk to one log-sum-exp per position and picks the
// target's logit if its slice holds the target (v is contracted, so the picks are partial
// sums with one non-zero term). What crosses devices is [positions, chunks] log-sum-exps and
// [positions] partial sums, not [positions, vocabulary] logits. The backward of a piece is
// local the same way: softmax of its chunk rescaled by exp(lse[c] - logsumexp), minus the
// one-hot of the target where the piece holds it.
//
// The result equals cross_entropy (same normalizer and ignore_index rules) up to rounding:
// logsumexp over chunks of per-chunk log-sum-exps is the log-sum-exp of the row. A plan that
// splits cross_entropy's frozen v gets this decomposition from the transformation registered
// in plan/transformation.hpp; models may also call vocab_parallel_cross_entropy directly.
//
// pick_target and pick_target_grad hold the vocabulary rows [row_offset, row_offset + v) of
// `vocab` (like embedding); a target outside [0, vocab) that is not ignore_index throws
// loom::usage_error naming the node, the position and the target.
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>


namespace loom::ops {

namespace detail {

// The chunk axis keeps the vocabulary's dim (it is the vocabulary, `chunks` entries long),
// so that a split of the logits along Vocab finds it when a plan mirrors partitions by dim.
inline std::vector<preset_variable> chunk_presets(const attributes& a, std::string_view op) {
    const auto chunks = a.get<std::int64_t>("chunks");
    if (chunks <= 0)
        throw shape_error(std::string(op) + ": chunks = " + std::to_string(chunks) +
                          "; pass a positive number of vocabulary chunks");
    return {{"c", Dim::Vocab::id, chunks}};
}

inline attributes chunk_piece_attributes(const node& n, const piece_ranges& r) {
    attributes a = n.attrs;
    auto c = static_cast<std::size_t>(*n.sig.find("c"));
    a.set("chunks", r.end[c] - r.begin[c]);
    return a;
}

inline attributes row_offset_piece_attributes(const node& n, const piece_ranges& r) {
    attributes a = n.attrs;
    auto v = static_cast<std::size_t>(*n.sig.find("v"));
    a.set("row_offset", a.get_or<std::int64_t>("row_offset", 0) + r.begin[v]);
    if (a.has("rows")) a.set("rows", r.end[v] - r.begin[v]);
    return a;
}

}  // namespace detail

struct ChunkLogsumexpGrad {
    static constexpr std::string_view name = "chunk_logsumexp_grad";
    static constexpr signature sig = parse_signature("... c, ... (c v), ... c -> ... (c v)");
    static std::vector<preset_variable> presets(const attributes& a, std::span<const shape>) {
        return detail::chunk_presets(a, name);
    }
    static std::vector<shape> infer(const bound_signature&, const attributes&, std::span<const shape> in) {
        return {in[1]};
    }
    static attributes piece_attributes(const node& n, const piece_ranges& r) {
        return detail::chunk_piece_attributes(n, r);
    }
    // An exp, a subtraction and a product per logit.
    static double flops(const graph& g, const node& n) {
        return 3.0 * static_cast<double>(g.tensor(n.inputs[1]).dims.numel());
    }
};

// dlogits = dlse[c] * exp(logits - lse[c]) within each chunk c.
inline tensor chunk_logsumexp_grad(tensor dlse, tensor logits, tensor lse, std::int64_t chunks) {
    return dlse.builder->apply1<ChunkLogsumexpGrad>({dlse, logits, lse}, {{"chunks", chunks}});
}

struct ChunkLogsumexp {
    static constexpr std::string_view name = "chunk_logsumexp";
    static constexpr signature sig = parse_signature("... (c v) -> ... c");
    static std::vector<preset_variable> presets(const attributes& a, std::span<const shape> in) {
        const auto chunks = a.get<std::int64_t>("chunks");
        if (chunks > 0 && in.size() == 1 && in[0].rank() >= 1 && in[0].extent(in[0].rank() - 1) % chunks != 0)
            throw shape_error("chunk_logsumexp: the vocabulary extent " + std::to_string(in[0].extent(in[0].rank() - 1)) +
                              " of " + in[0].to_string() + " is not divisible into " + std::to_string(chunks) +
                              " chunks; choose a chunk count that divides it");
        return detail::chunk_presets(a, name);
    }
    static attributes piece_attributes(const node& n, const piece_ranges& r) {
        return detail::chunk_piece_attributes(n, r);
    }
    // About 4 operations per logit (max, exp, sum).
    static double flops(const graph& g, const node& n) {
        return 4.0 * static_cast<double>(g.tensor(n.inputs[0]).dims.numel());
    }
    static gradients backward(backward_context& c) {
        gradients g(1);
        if (c.needs_grad[0])
            g[0] = chunk_logsumexp_grad(*c.grad_outputs[0], c.inputs[0], c.outputs[0],
                                        c.attrs().get<std::int64_t>("chunks"));
        return g;
    }
};

// lse [... chunks]: the log-sum-exp of each of `chunks` equal, contiguous slices of the last
// axis of `logits`.
inline tensor chunk_logsumexp(tensor logits, std::int64_t chunks) {
    return logits.builder->apply1<ChunkLogsumexp>({logits}, {{"chunks", chunks}});
}

struct PickTargetGrad {
    static constexpr std::string_view name = "pick_target_grad";
    static constexpr signature sig = parse_signature("..., ... -> ... v");
    static constexpr std::array<value_kind, 2> input_kinds{value_kind::real, value_kind::index};
    static std::vector<preset_variable> presets(const attributes& a, std::span<const shape>) {
        return {{"v", Dim::Vocab::id, a.get<std::int64_t>("rows")}};
    }
    static attributes piece_attributes(const node& n, const piece_ranges& r) {
        return detail::row_offset_piece_attributes(n, r);
    }
    // Zeroing the rows, one write per position.
    static double flops(const graph& g, const node& n) {
        return static_cast<double>(g.tensor(n.outputs[0]).dims.numel());
    }
};

// dlogits [... rows]: dz[p] at the target's column (when rows [row_offset, row_offset + rows)
// hold it), zero elsewhere.
inline tensor pick_target_grad(tensor dz, tensor targets, std::int64_t rows, std::int64_t vocab,
                               std::int64_t row_offset, std::int64_t ignore_index) {
    return dz.builder->apply1<PickTargetGrad>(
        {dz, targets},
        {{"rows", rows}, {"vocab", vocab}, {"row_offset", row_offset}, {"ignore_index", ignore_index}});
}

struct PickTarget {
    static constexpr std::string_view name = "pick_target";
    static constexpr signature sig = parse_signature("... v, ... -> ...");
    static constexpr std::array<value_kind, 2> input_kinds{value_kind::real, value_kind::index};
    static attributes piece_attributes(const node& n, const piece_ranges& r) {
        return detail::row_offset_piece_attributes(n, r);
    }
    // One read per position.
    static double flops(const graph& g, const node& n) {
        return static_cast<double>(g.tensor(n.inputs[1]).dims.numel());
    }
    static gradients backward(backward_context& c) {
        gradients g(2);
        if (c.needs_grad[0]) {
            const shape& logits = c.inputs[0].dims();
            g[0] = pick_target_grad(*c.grad_outputs[0], c.inputs[1], logits.extent(logits.rank() - 1),
                                    c.attrs().get<std::int64_t>("vocab"), c.attrs().get_or<std::int64_t>("row_offset", 0),
                                    c.attrs().get<std::int64_t>("ignore_index"));
        }
        return g;
    }
};

// z [...] = logits[p, targets[p]], 0 at ignored positions.
inline tensor pick_target(tensor logits, tensor targets, std::int64_t ignore_index = -100) {
    const std::int64_t vocab = logits.rank() >= 1 ? logits.extent(logits.rank() - 1) : 0;
    return logits.builder->apply1<PickTarget>(
        {logits, targets}, {{"vocab", vocab}, {"row_offset", std::int64_t{0}}, {"ignore_index", ignore_index}});
}

struct CrossEntropyFromChunksGrad {
    static constexpr std::string_view name = "cross_entropy_from_chunks_grad";
    static constexpr signature sig = parse_signature(", ... c^, ... -> ... c^, ...");
    static constexpr std::array<value_kind, 3> input_kinds{value_kind::real, value_kind::real, value_kind::index};
    // A softmax over the chunks per position.
    static double flops(const graph& g, const node& n) {
        return 4.0 * static_cast<double>(g.tensor(n.inputs[1]).dims.numel());
    }
};

struct cross_entropy_from_chunks_grads {
    tensor dlse, dz;
};

inline cross_entropy_from_chunks_grads cross_entropy_from_chunks_grad(tensor dloss, tensor lse, tensor targets,
                                                                      std::int64_t ignore_index, double normalizer) {
    std::array<tensor, 3> ins{dloss, lse, targets};
    auto outs = dloss.builder->apply<CrossEntropyFromChunksGrad>(
        ins, {{"ignore_index", ignore_index}, {"normalizer", normalizer}});
    return {outs[0], outs[1]};
}

struct CrossEntropyFromChunks {
    static constexpr std::string_view name = "cross_entropy_from_chunks";
    static constexpr signature sig = parse_signature("... c^, ..., ... -> ");
    static constexpr std::array<value_kind, 3> input_kinds{value_kind::real, value_kind::real, value_kind::index};
    // A log-sum-exp over the chunks per position.
    static double flops(const graph& g, const node& n) {
        return 4.0 * static_cast<double>(g.tensor(n.inputs[0]).dims.numel());
    }
    static gradients backward(backward_context& c) {
        gradients g(3);
        if (!c.needs_grad[0] && !c.needs_grad[1]) return g;
        auto d = cross_entropy_from_chunks_grad(*c.grad_outputs[0], c.inputs[0], c.inputs[2],
                                                c.attrs().get<std::int64_t>("ignore_index"),
                                                c.attrs().get<double>("normalizer"));
        if (c.needs_grad[0]) g[0] = d.dlse;
        if (c.needs_grad[1]) g[1] = d.dz;
        return g;
    }
};

// The mean cross-entropy from per-chunk log-sum-exps and the targets' logits.
inline tensor cross_entropy_from_chunks(tensor lse, tensor target_logits, tensor targets, std::int64_t ignore_index,
                                        double normalizer) {
    return lse.builder->apply1<CrossEntropyFromChunks>({lse, target_logits, targets},
                                                       {{"ignore_index", ignore_index}, {"normalizer", normalizer}});
}

// cross_entropy(logits, targets, ignore_index, normalizer) computed through `chunks`
// vocabulary chunks (see the top of this file); a plan splits the chunks.
inline tensor vocab_parallel_cross_entropy(tensor logits, tensor targets, std::int64_t chunks,
                                           std::int64_t ignore_index = -100,
                                           std::optional<double> normalizer = std::nullopt) {
    const double n = normalizer ? *normalizer : static_cast<double>(targets.dims().numel());
    if (!(n > 0) || !std::isfinite(n))
        throw usage_error("vocab_parallel_cross_entropy: normalizer = " + std::to_string(n) + " for logits '" +
                          logits.name() + "'; pass a positive finite normalizer (the number of positions the mean is over)");
    tensor lse = chunk_logsumexp(logits, chunks);
    tensor z = pick_target(logits, targets, ignore_index);
    return cross_entropy_from_chunks(lse, z, targets, ignore_index, n);
}

}  // namespace loom::ops
// ---- end loom/ops/vocab_parallel_cross_entropy.hpp ----

namespace loom::ops {

using core_ops = boost::mp11::mp_list<FillLike, Identity, StopGradient, Add, Mul, Scale, Sum, Mean, SumLeading,
                                      BroadcastScalar, Linear, LinearBias, LinearGradInput, LinearGradWeight>;
using elementwise_ops = boost::mp11::mp_list<Gelu, GeluGrad, Relu, ReluGrad, Silu, SiluGrad, Softmax, SoftmaxGrad, Dropout,
                                              DropoutGrad>;
using normalization_ops = boost::mp11::mp_list<LayerNorm, LayerNormGrad, RmsNorm, RmsNormGrad>;
using attention_ops = boost::mp11::mp_list<Matmul, MatmulNT, MatmulTN, Reshape, Transpose, SplitHeads, MergeHeads,
                                           Attention, AttentionGrad>;
using embedding_loss_ops = boost::mp11::mp_list<Embedding, EmbeddingGrad, CrossEntropy, CrossEntropyGrad, ChunkLogsumexp,
                                                 ChunkLogsumexpGrad, PickTarget, PickTargetGrad, CrossEntropyFromChunks,
                                                 CrossEntropyFromChunksGrad>;

// What plans insert between the pieces of partitioned ops.
using partition_ops = boost::mp11::mp_list<Assemble, Transfer>;

using all_ops = boost::mp11::mp_append<core_ops, elementwise_ops, normalization_ops, attention_ops, embedding_loss_ops,
                                       partition_ops>;

}  // namespace loom::ops
// ---- end loom/ops/all.hpp ----

// plans: combinators' run-time form, presets, custom transformations
// ---- begin loom/plan/combinators.hpp ----
// Typed plan combinators: a parallelization plan written as C++ values whose types carry
// it, checked while it compiles and lowered to the run-time plan_spec (plan/rules.hpp).
//
//   using namespace loom;
//   constexpr auto plan = plan::compose(
//       plan::devices<4>,
//       plan::extent<Dim::Head, 12>,
//       plan::on_all(plan::trans<Split<Dim::Batch>, 2>{}),
//       plan::on<ops::Attention>(plan::trans<Split<Dim::Batch>, 2, Split<Dim::Head>, 2>{}),
//       plan::on_layers<"blocks", 0, 3>(plan::recompute));
//   resolved_plan resolved = plan.resolve(model.ir());
//
// The vocabulary, one header each:
//   plan/degree.hpp       degrees: a number, open<Range[, "name"]>, runtime, all_devices
//   plan/trans.hpp        op-trans: trans<Split<Dim::D> | Split<Var<"v">> | Replicate, degree, ...>
//   plan/assign.hpp       op-assign: assign<devices...>, colocate<C>; recompute
//   plan/selectors.hpp    on<Ops...>, on_name<"glob">, on_scope<"glob">, on_layers<"repeat", a, b>, on_all
//   plan/constraints.hpp  devices<N>, extent<D, E>, forbid<Split<D>>, colocation_requires_recompute, zero<S>
//   plan/compose.hpp      compose(...), .spec(), .resolve(graph), .choose(name, v), well_formed<...>
//   plan/checks.hpp       the checks, shared by compile time and run time
// ---- begin loom/plan/assign.hpp ----
// op-assign and recompute: where the pieces of a rule's ops run, and whether their outputs
// are kept for the backward pass.
//
//   assign<0, 1, 2, 3>    piece i on the i-th listed device (one device per piece)
//   colocate<2>           pieces 2i and 2i+1 on device i, run one after another (Coshard)
//   recompute             recompute the outputs in the backward pass instead of keeping them
//
// Each is a value: on<ops::Attention>(trans<Split<Dim::Head>, 8>{}, colocate<2>, recompute).
#include <array>
#include <cstdint>

// ---- begin loom/plan/static_text.hpp ----
// Text built in constant expressions: the spellings of plan combinators
// ("plan::trans<Split<Batch>, 4>") and the messages of the plan checks.
//
// `text` is a fixed-capacity string with no allocation. It works in every constant
// expression and on every compiler (a constexpr std::string does not: GCC 12 rejects some
// uses of short strings, and Clang 14 with libstdc++ 12 rejects all), and the same
// functions build messages at run time. What must persist is copied into:
//   * static_text: a spelling that views (plan/checks.hpp) point into;
//   * message: an error found at compile time, carried as a template argument of
//     plan::ill_formed_plan, which is how a computed message reaches the compiler's output
//     (static_assert accepts only a literal before C++26). GCC prints
//       In instantiation of 'struct loom::plan::ill_formed_plan<loom::plan::detail::message{"plan::trans<...>: ..."}>'
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace loom::plan::detail {

// A string of at most `capacity` characters; a longer one keeps its start and ends in "...".
class text {
public:
    static constexpr std::size_t capacity = 768;

    constexpr text() = default;
    constexpr text(std::string_view s) { append(s); }
    constexpr text(const char* s) { append(std::string_view(s)); }

    constexpr void push_back(char c) {
        if (size_ < capacity) {
            data_[size_++] = c;
        } else if (data_[capacity - 1] != '.') {
            data_[capacity - 3] = data_[capacity - 2] = data_[capacity - 1] = '.';
        }
    }
    constexpr void append(std::string_view s) {
        for (char c : s) push_back(c);
    }

    constexpr bool empty() const { return size_ == 0; }
    constexpr std::size_t size() const { return size_; }
    constexpr std::string_view view() const { return {data_, size_}; }
    constexpr operator std::string_view() const { return view(); }
    std::string str() const { return std::string(view()); }

private:
    char data_[capacity]{};
    std::size_t size_ = 0;
};

constexpr text decimal(std::int64_t value) {
    char reversed[24]{};
    int n = 0;
    const bool negative = value < 0;
    do {
        const std::int64_t digit = value % 10;
        reversed[n++] = static_cast<char>('0' + (digit < 0 ? -digit : digit));
        value /= 10;
    } while (value != 0);
    text digits;
    if (negative) digits.push_back('-');
    while (n > 0) digits.push_back(reversed[--n]);
    return digits;
}

constexpr void append(text& out, std::string_view s) { out.append(s); }
constexpr void append(text& out, const text& s) { out.append(s.view()); }
constexpr void append(text& out, const char* s) { out.append(std::string_view(s)); }
template <std::integral T>
    requires(!std::same_as<T, char> && !std::same_as<T, bool>)
constexpr void append(text& out, T value) {
    out.append(decimal(static_cast<std::int64_t>(value)).view());
}

// concat("degree ", 4, " of ", name) -> "degree 4 of Batch"
template <class... Parts>
constexpr text concat(const Parts&... parts) {
    text out;
    (append(out, parts), ...);
    return out;
}

// join({1, 2, 4}) -> "1, 2, 4"
constexpr text join(std::span<const std::int64_t> values) {
    text out;
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (i) append(out, ", ");
        append(out, values[i]);
    }
    return out;
}

// divisors_text(12) -> "1, 2, 3, 4, 6, 12"
constexpr text divisors_text(std::int64_t n) {
    text out;
    std::int64_t d = 1;
    for (; d <= n / d; ++d)
        if (n % d == 0) append(out, concat(out.empty() ? "" : ", ", d));
    for (--d; d >= 1; --d)
        if (n % d == 0 && d != n / d) append(out, concat(", ", n / d));
    return out;
}

// A fixed-capacity copy of a text, for spellings that live in static storage.
template <std::size_t Capacity>
struct fixed_text {
    char data[Capacity]{};
    std::size_t size = 0;

    constexpr fixed_text() = default;
    constexpr fixed_text(std::string_view s) {
        size = s.size() < Capacity ? s.size() : Capacity;
        for (std::size_t i = 0; i < size; ++i) data[i] = s[i];
    }
    constexpr fixed_text(const text& t) : fixed_text(t.view()) {}
    constexpr fixed_text(const char* s) : fixed_text(std::string_view(s)) {}

    constexpr std::string_view view() const { return {data, size}; }
    constexpr bool empty() const { return size == 0; }
};

using static_text = fixed_text<256>;

// An error message as a structural value (one array, so GCC prints it as a string).
struct message {
    char chars[text::capacity + 1]{};

    constexpr message() = default;
    constexpr message(std::string_view s) {
        for (std::size_t i = 0; i < s.size() && i < text::capacity; ++i) chars[i] = s[i];
    }
    constexpr message(const text& t) : message(t.view()) {}
    constexpr bool empty() const { return chars[0] == '\0'; }
    constexpr std::string_view view() const { return std::string_view(chars); }
};

}  // namespace loom::plan::detail
// ---- end loom/plan/static_text.hpp ----
// ---- begin loom/plan/trans.hpp ----
// op-trans: how a rule cuts the ops it selects.
//
//   trans<Split<Dim::Batch>, 4>                    4 pieces along the batch
//   trans<Split<Var<"n">>, 2>                      along the signature variable n ("... k, n k -> ... n")
//   trans<Replicate, 4>                            4 whole copies
//   trans<Split<Dim::Batch>, 2, Split<Dim::Head>, 2>   nested, outermost first: 4 pieces,
//                                                  piece (i, j) = batch slice i, head slice j
//
// Each degree is a number, open<Range[, "name"]>, runtime (a constructor argument, in the
// order of the runtime slots) or all_devices; see plan/degree.hpp. Up to four pairs.
// Mistakes of the trans alone (a degree below 1, an empty open range, a dim split twice)
// stop the compilation where the trans is written; those that depend on the ops or on the
// plan's constraints are checked by on<...>(...) and compose(...).
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

// ---- begin loom/plan/checks.hpp ----
// The checks of a typed plan, written once and run at two moments.
//
// Every combinator describes itself as plain constexpr data (a "view": its splits and
// degrees, the op kinds its selector names, its constraints). The predicates below read
// views and return the first mistake as a message, or "" when there is none:
//
//   first_trans_error(rule)  a trans on its own: degree < 1, an empty open range, a dim split twice
//   first_rule_error(rule)   a rule on its own: selector, pieces, assign/colocate against the
//                            pieces, splits against the signatures of the op kinds it names
//   first_plan_error(plan)   the plan's constraints: devices, extents, forbidden splits,
//                            colocation with recompute, open parameters shared by name
//   first_error(plan)        all of the above, in that order
//
// At compile time the combinators report a non-empty message through ill_formed_plan
// (a static_assert) and plan::well_formed reads the same predicate as a bool. At run time
// (compose(...).spec()) the views are refilled with what only then is known (degrees given
// to constructors, chosen open parameters, the device count of spec(n)) and the same
// predicates throw loom::plan_error. Checks against one graph's extents stay where the graph
// is known: plan::resolve (rules.hpp) and partition::resolve_partition (piece_layout.hpp).
//
// Messages start with the combinator and say how to fix the plan:
//   "plan::trans<Split<Seq>, 2> on attention: Seq is frozen in this op ('s', 't'; splitting
//    it would change the result); split Batch or Head instead"
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

// ---- begin loom/plan/degree.hpp ----
// The degree slot of plan::trans: one `auto` template parameter that holds a number fixed
// by the plan, an open parameter that the searcher (or the user, through choose()) fills
// from a range, a value known only at run time, or the plan's device count:
//
//   trans<Split<Dim::Batch>, 4>                          fixed
//   trans<Split<Dim::Batch>, open<Pow2<1, 16>>>          open, named "trans#0.degree" by default
//   trans<Split<Dim::Batch>, open<Pow2<1, 16>, "dp">>    open, named "dp"; every slot that says
//                                                        "dp" takes the same value
//   trans<Split<Dim::Batch>, runtime>{world_size}        given to the constructor
//   trans<Split<Dim::Batch>, all_devices>                the plan's device count
//
// Ranges of open parameters:
//   Pow2<1, 16>      -> 1, 2, 4, 8, 16 (the powers of two in [1, 16])
//   OneOf<1, 2, 3, 6> -> 1, 2, 3, 6
//   DivisorsOf<12>   -> 1, 2, 3, 4, 6, 12
//   AnyPositive      -> any degree >= 1 (the default: open<>)
// The same degree_view describes all of them to the checks (plan/checks.hpp), so one
// predicate judges a fixed degree at compile time and a run-time one when it is known.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>


namespace loom::plan {

namespace detail {

enum class degree_kind : std::uint8_t { fixed, open, runtime, all_devices, missing };

struct degree_view {
    degree_kind kind = degree_kind::fixed;
    std::int64_t value = 0;
    bool known = false;             // value holds the degree (fixed; runtime and open once given)
    std::string_view name;          // open: the user's name; empty: derived from the rule
    std::string_view range;         // open: the range as written, "Pow2<1, 16>"
    std::span<const std::int64_t> allowed;  // open: the range's values
    bool any_positive = false;      // open<> / open<AnyPositive>: no range
};

constexpr std::size_t count_powers_of_two(std::int64_t lo, std::int64_t hi) {
    std::size_t n = 0;
    for (std::int64_t v = 1; v <= hi; v *= 2) {
        if (v >= lo) ++n;
        if (v > hi / 2) break;
    }
    return n;
}

template <std::int64_t Lo, std::int64_t Hi>
constexpr auto powers_of_two() {
    std::array<std::int64_t, count_powers_of_two(Lo, Hi)> values{};
    std::size_t n = 0;
    for (std::int64_t v = 1; v <= Hi; v *= 2) {
        if (v >= Lo) values[n++] = v;
        if (v > Hi / 2) break;
    }
    return values;
}

constexpr std::size_t count_divisors(std::int64_t n) {
    std::size_t count = 0;
    for (std::int64_t d = 1; d <= n; ++d)
        if (n % d == 0) ++count;
    return count;
}

template <std::int64_t N>
constexpr auto divisors() {
    std::array<std::int64_t, count_divisors(N)> values{};
    std::size_t n = 0;
    for (std::int64_t d = 1; d <= N; ++d)
        if (N % d == 0) values[n++] = d;
    return values;
}

}  // namespace detail

// ---- ranges ------------------------------------------------------------------------------

struct AnyPositive {
    static constexpr bool any_positive = true;
    static constexpr std::array<std::int64_t, 0> values{};
    static constexpr detail::static_text spelling{"AnyPositive"};
};

template <std::int64_t Lo, std::int64_t Hi>
struct Pow2 {
    static constexpr bool any_positive = false;
    static constexpr auto values = detail::powers_of_two<Lo, Hi>();
    static constexpr detail::static_text spelling{detail::concat("Pow2<", Lo, ", ", Hi, ">")};
};

template <std::int64_t... Values>
struct OneOf {
    static constexpr bool any_positive = false;
    static constexpr std::array<std::int64_t, sizeof...(Values)> values{Values...};
    static constexpr detail::static_text spelling{
        detail::concat("OneOf<", detail::join(std::array<std::int64_t, sizeof...(Values)>{Values...}), ">")};
};

// Divisors by trial up to N: meant for extents and device counts, not for huge numbers.
template <std::int64_t N>
struct DivisorsOf {
    static constexpr bool any_positive = false;
    static constexpr auto values = detail::divisors<N>();
    static constexpr detail::static_text spelling{detail::concat("DivisorsOf<", N, ">")};
};

// ---- the degree values ---------------------------------------------------------------------

template <class Range, fixed_string Name>
struct open_degree {
    using range = Range;
    static constexpr std::string_view name = Name.view();
};

// An open parameter: the searcher or choose() fills it from Range.
template <class Range = AnyPositive, fixed_string Name = "">
inline constexpr open_degree<Range, Name> open{};

// A degree known at run time, passed to the constructor: trans<Split<Dim::Batch>, runtime>{n}.
struct runtime_degree {};
inline constexpr runtime_degree runtime{};

// The plan's device count (devices<N>, or spec(n)).
struct all_devices_degree {};
inline constexpr all_devices_degree all_devices{};

namespace detail {

// The "nothing here" of trans' optional split pairs.
struct no_degree {};

template <class T>
struct is_open_degree : std::false_type {};
template <class Range, fixed_string Name>
struct is_open_degree<open_degree<Range, Name>> : std::true_type {};

// What a degree slot holds, as seen by the checks, and how it is written.
template <auto Degree>
constexpr degree_view degree_view_of() {
    using D = std::remove_cv_t<decltype(Degree)>;
    if constexpr (std::is_integral_v<D> && !std::is_same_v<D, bool>) {
        return {degree_kind::fixed, static_cast<std::int64_t>(Degree), true, {}, {}, {}, false};
    } else if constexpr (is_open_degree<D>::value) {
        using R = typename D::range;
        return {degree_kind::open, 0, false, D::name, R::spelling.view(), R::values, R::any_positive};
    } else if constexpr (std::is_same_v<D, runtime_degree>) {
        return {degree_kind::runtime, 0, false, {}, {}, {}, false};
    } else if constexpr (std::is_same_v<D, all_devices_degree>) {
        return {degree_kind::all_devices, 0, false, {}, {}, {}, false};
    } else {
        return {degree_kind::missing, 0, false, {}, {}, {}, false};
    }
}

template <auto Degree>
constexpr text degree_spelling() {
    using D = std::remove_cv_t<decltype(Degree)>;
    if constexpr (std::is_integral_v<D> && !std::is_same_v<D, bool>) {
        return decimal(static_cast<std::int64_t>(Degree));
    } else if constexpr (is_open_degree<D>::value) {
        using R = typename D::range;
        text s = "open<";
        if (!std::is_same_v<R, AnyPositive> || !D::name.empty()) append(s, R::spelling.view());
        if (!D::name.empty()) append(s, concat(", \"", D::name, "\""));
        append(s, ">");
        return s;
    } else if constexpr (std::is_same_v<D, runtime_degree>) {
        return "runtime";
    } else if constexpr (std::is_same_v<D, all_devices_degree>) {
        return "all_devices";
    } else {
        return "?";
    }
}

}  // namespace detail

}  // namespace loom::plan

namespace loom {
// The ranges read as vocabulary next to the dims: open<Pow2<1, 16>>.
using plan::AnyPositive;
using plan::DivisorsOf;
using plan::OneOf;
using plan::Pow2;
}  // namespace loom
// ---- end loom/plan/degree.hpp ----

namespace loom::plan {

// A plan mistake found at compile time. The reason is this template's argument; compilers
// print it in the instantiation context and in the note on the failed assertion.
template <detail::message Reason>
struct ill_formed_plan {
    static_assert(Reason.empty(),
                  "plan: the plan is ill-formed; the reason is the message{...} of ill_formed_plan printed with this error");
};

namespace detail {

// ---- views ---------------------------------------------------------------------------------

enum class split_kind : std::uint8_t { dim, variable, replicate };

struct split_view {
    split_kind kind = split_kind::dim;
    std::string_view target;  // the dim's name (Split<Dim::Batch>) or the variable's label (Split<Var<"n">>)
    degree_view degree;
};

// What the checks know of an op kind: its signature and, for ops whose dims never change,
// the dim of each variable ("b" -> Batch, ...; a group "(h d)" names its axis' dim).
struct op_view {
    std::string_view name;
    const signature* sig = nullptr;
    std::span<const std::pair<std::string_view, dim_id>> variable_dims;  // empty: not fixed
    std::span<const std::string_view> transformable;  // frozen variables a custom transformation cuts
};

struct rule_view {
    // the selector
    std::string_view selector;  // how it is written: on_scope<"*.attn">(on<attention>(...))
    std::span<const op_view> kinds;
    int kind_filters = 0, name_filters = 0, scope_filters = 0, layer_filters = 0;
    bool empty_pattern = false;
    std::string_view repeat;
    std::int64_t first_layer = 0, last_layer = -1;
    // the pieces
    int trans_count = 0;
    std::string_view trans;  // "plan::trans<Split<Batch>, 4>"
    std::span<const split_view> splits;
    int assign_count = 0;
    std::string_view assign;  // "plan::assign<0, 1>", "plan::colocate<2>"
    bool explicit_devices = false;
    std::span<const std::int64_t> devices;
    std::int64_t colocate = 1;
    int recompute_count = 0;
};

enum class fact_kind : std::uint8_t { devices, extent, forbid, colocation_requires_recompute, zero };

struct fact_view {
    fact_kind kind = fact_kind::devices;
    std::int64_t value = 0;        // devices<N>, extent<D, E>'s E, zero<S>
    std::string_view dim;          // extent<D, E>'s D
    split_kind target_kind = split_kind::dim;  // forbid<Split<X>>
    std::string_view target;
    std::string_view spelling;     // "plan::extent<Head, 12>"
};

struct plan_view {
    std::span<const rule_view> rules;
    std::span<const fact_view> facts;
    std::int64_t devices = 0;  // the device count given at run time (spec(n)); 0: devices<N> or unknown
};

// ---- small helpers -------------------------------------------------------------------------

// Split<Batch>, Split<Var<"n">>, Replicate
constexpr text target_spelling(split_kind kind, std::string_view target) {
    if (kind == split_kind::dim) return concat("Split<", target, ">");
    if (kind == split_kind::variable) return concat("Split<Var<\"", target, "\">>");
    return "Replicate";
}

constexpr text split_spelling(const split_view& s) { return target_spelling(s.kind, s.target); }

// The degree's value if it is known now (all_devices once the device count is).
constexpr std::optional<std::int64_t> known_degree(const degree_view& d, std::int64_t devices) {
    if (d.kind == degree_kind::all_devices) return devices > 0 ? std::optional<std::int64_t>(devices) : std::nullopt;
    if (d.known) return d.value;
    return std::nullopt;
}

// Pieces of a rule's trans, when every degree is known.
constexpr std::optional<std::int64_t> known_pieces(const rule_view& r, std::int64_t devices) {
    std::int64_t pieces = 1;
    for (const auto& s : r.splits) {
        auto d = known_degree(s.degree, devices);
        if (!d || *d < 1) return std::nullopt;
        pieces *= *d;
    }
    return pieces;
}

constexpr bool range_holds_divisor_of(const degree_view& d, std::int64_t n) {
    if (d.any_positive) return true;
    for (std::int64_t v : d.allowed)
        if (v >= 1 && n % v == 0) return true;
    return false;
}

constexpr std::int64_t declared_devices(const plan_view& p) {
    if (p.devices > 0) return p.devices;
    for (const auto& f : p.facts)
        if (f.kind == fact_kind::devices) return f.value;
    return 0;
}

// "k, n" (+ "and the leading dims '...'")
constexpr text variables_text(const signature& sig) {
    text out;
    for (int v = 0; v < sig.var_count; ++v) append(out, concat(v ? ", " : "", sig.vars[v].view()));
    if (sig.ellipsis_in_inputs()) append(out, out.empty() ? "the leading dims '...'" : " and the leading dims '...'");
    if (out.empty()) append(out, "none");
    return out;
}

// What else a plan may split in this op: "'n'" / "'n' or a leading dim ('...')".
constexpr text splittable_variables_text(const op_view& op) {
    const signature& sig = *op.sig;
    text out;
    for (int v = 0; v < sig.var_count; ++v)
        if (sig.splittable(v)) append(out, concat(out.empty() ? "" : ", ", "'", sig.vars[v].view(), "'"));
    if (sig.ellipsis_in_inputs()) append(out, out.empty() ? "a leading dim ('...')" : " or a leading dim ('...')");
    if (out.empty()) append(out, "nothing else: replicate it");
    return out;
}

constexpr bool is_group_label(std::string_view label) { return !label.empty() && label.front() == '('; }

// Dims of an op with fixed dims that a plan can split: "Batch or Head".
constexpr text splittable_dims_text(const op_view& op) {
    std::string_view found[16];
    int count = 0;
    for (const auto& [label, dim] : op.variable_dims) {
        if (is_group_label(label)) continue;
        auto v = op.sig->find(label);
        if (!v || !op.sig->splittable(*v)) continue;
        bool seen = false;
        for (int i = 0; i < count; ++i) seen = seen || found[i] == dim.name();
        if (!seen && count < 16) found[count++] = dim.name();
    }
    text out;
    for (int i = 0; i < count; ++i) append(out, concat(i == 0 ? "" : i + 1 == count ? " or " : ", ", found[i]));
    if (out.empty()) append(out, "nothing (replicate it)");
    return out;
}

// "b: Batch, h: Head, s: Seq (frozen), ..."
constexpr text dims_text(const op_view& op) {
    text out;
    for (const auto& [label, dim] : op.variable_dims) {
        if (is_group_label(label)) continue;
        auto v = op.sig->find(label);
        const bool frozen = v && op.sig->vars[*v].frozen;
        append(out, concat(out.empty() ? "" : ", ", label, ": ", dim.name(), frozen ? " (frozen)" : ""));
    }
    return out;
}

// ---- a split against one op kind -----------------------------------------------------------

constexpr text variable_split_error(const op_view& op, std::string_view label, std::string_view trans) {
    const signature& sig = *op.sig;
    if (label.starts_with("...")) {
        if (sig.ellipsis_in_inputs()) return {};
        return concat(trans, " on ", op.name, ": '", label, "' names a leading dim, but the op has no '...' (its variables: ",
                      variables_text(sig), "); split one of those");
    }
    auto v = sig.find(label);
    if (!v)
        return concat(trans, " on ", op.name, ": the op has no variable '", label, "' (its variables: ",
                      variables_text(sig), "); split one of those");
    bool transformable = false;
    for (auto t : op.transformable) transformable = transformable || t == label;
    if (sig.vars[*v].frozen && !transformable)
        return concat(trans, " on ", op.name, ": '", label,
                      "' is frozen in this op (splitting it would change the result); split ",
                      splittable_variables_text(op), " instead, or register a custom transformation for ", op.name,
                      " (plan/transformation.hpp) and list '", label, "' in plan::transformable_variables");
    if (sig.vars[*v].inner_of_group)
        return concat(trans, " on ", op.name, ": '", label,
                      "' is an inner part of a grouped axis (its slices are not contiguous); split ",
                      splittable_variables_text(op), " instead");
    return {};
}

constexpr text dim_split_error(const op_view& op, std::string_view dim, std::string_view trans) {
    if (op.variable_dims.empty()) return {};  // the op's dims depend on its inputs: checked at run time
    const signature& sig = *op.sig;
    text labels;
    bool matched = false, frozen = false;
    std::string_view group;
    for (const auto& [label, d] : op.variable_dims) {
        if (d.name() != dim) continue;
        if (is_group_label(label)) {
            group = label;
            continue;
        }
        auto v = sig.find(label);
        if (!v) continue;
        if (sig.splittable(*v)) return {};
        matched = true;
        frozen = frozen || sig.vars[*v].frozen;
        append(labels, concat(labels.empty() ? "" : ", ", "'", label, "'"));
    }
    if (!matched && !group.empty()) {
        // "(h d)": the outermost variable is the one that cuts the axis into contiguous slices.
        std::string_view outer = group.substr(1, group.find(' ') - 1);
        std::string_view outer_dim = "?";
        for (const auto& [label, d] : op.variable_dims)
            if (label == outer) outer_dim = d.name();
        return concat(trans, " on ", op.name, ": ", dim, " is the grouped axis ", group,
                      " of this op, not one of its variables; split ", outer_dim, " (its outermost variable '", outer,
                      "') instead");
    }
    if (!matched)
        return concat(trans, " on ", op.name, ": the op has no dim ", dim, " (its dims: ", dims_text(op), "); split ",
                      splittable_dims_text(op), " instead");
    return concat(trans, " on ", op.name, ": ", dim, " is ",
                  frozen ? "frozen in this op (" : "an inner part of a grouped axis in this op (", labels,
                  frozen ? "; splitting it would change the result" : "; its slices are not contiguous", "); split ",
                  splittable_dims_text(op), " instead");
}

// ---- the predicates ------------------------------------------------------------------------

constexpr text first_trans_error(const rule_view& r, std::int64_t devices = 0) {
    for (std::size_t i = 0; i < r.splits.size(); ++i) {
        const split_view& s = r.splits[i];
        const degree_view& d = s.degree;
        if (d.kind == degree_kind::missing)
            return concat(r.trans, ": ", split_spelling(s), " has no degree; write pairs: trans<Split<A>, 2, Split<B>, 4>");
        if (auto value = known_degree(d, devices); value && *value < 1)
            return concat(r.trans, ": the degree of ", split_spelling(s), " is ", *value,
                          "; a degree must be at least 1 (1 leaves the op whole)");
        if (d.kind == degree_kind::open && !d.known) {
            if (!d.any_positive && d.allowed.empty())
                return concat(r.trans, ": the range ", d.range,
                              " of the open degree is empty; give a range with at least one value, e.g. Pow2<1, 8>");
            for (std::int64_t v : d.allowed)
                if (v < 1)
                    return concat(r.trans, ": the range ", d.range, " holds ", v, "; a degree must be at least 1");
        }
        for (std::size_t j = 0; j < i; ++j) {
            const split_view& earlier = r.splits[j];
            if (earlier.kind != s.kind || earlier.target != s.target) continue;
            if (s.kind == split_kind::replicate)
                return concat(r.trans, ": Replicate appears twice; replicate once, by the product of the degrees");
            return concat(r.trans, ": ", split_spelling(s),
                          " appears twice (the same dim split twice); split it once, by the product of the degrees");
        }
    }
    return {};
}

constexpr text first_rule_error(const rule_view& r, std::int64_t devices = 0) {
    const text selector = concat("plan::", r.selector);
    // the selector
    if (r.kind_filters > 0 && r.kinds.empty())
        return concat(selector, ": name at least one op kind, e.g. on<ops::Linear>(...)");
    if (r.kind_filters > 1)
        return concat(selector, ": two on<...> in one rule; list every op kind in one on<...>");
    if (r.name_filters > 1)
        return concat(selector, ": two name patterns in one rule; give one glob ('*' and '?' match any text)");
    if (r.scope_filters > 1)
        return concat(selector, ": two scope patterns in one rule; give one glob ('*' and '?' match any text)");
    if (r.layer_filters > 1) return concat(selector, ": two layer ranges in one rule; give one");
    if (r.empty_pattern)
        return concat(selector, ": an empty pattern matches nothing; use on_all(...) to select every op");
    if (r.layer_filters > 0 && r.repeat.empty())
        return concat(selector, ": name the repeat whose layers to select, e.g. on_layers<\"blocks\", 0, 3>");
    if (r.layer_filters > 0 && r.first_layer < 0)
        return concat(selector, ": layers are numbered from 0; the first layer is ", r.first_layer);
    if (r.layer_filters > 0 && r.last_layer >= 0 && r.first_layer > r.last_layer)
        return concat(selector, ": the first layer ", r.first_layer, " comes after the last ", r.last_layer,
                      "; write on_layers<\"", r.repeat, "\", ", r.last_layer, ", ", r.first_layer, ">");
    // the pieces
    if (r.trans_count + r.assign_count + r.recompute_count == 0)
        return concat(selector,
                      ": the rule does nothing; give it a plan::trans, plan::assign, plan::colocate or plan::recompute");
    if (r.trans_count > 1)
        return concat(selector, ": two plan::trans in one rule; put every split in one: trans<Split<A>, 2, Split<B>, 2>");
    if (r.assign_count > 1)
        return concat(selector, ": two op-assigns (plan::assign, plan::colocate) in one rule; give one");
    if (r.recompute_count > 1) return concat(selector, ": plan::recompute appears twice; once is enough");
    if (r.assign_count == 1) {
        if (r.explicit_devices && r.devices.empty())
            return concat(r.assign, ": list one device per piece, e.g. plan::assign<0, 1>");
        for (std::int64_t d : r.devices)
            if (d < 0) return concat(r.assign, ": device ", d, " is negative; devices are numbered from 0");
        if (!r.explicit_devices && r.colocate < 1)
            return concat(r.assign,
                          ": at least one piece per device; colocate<1> (or no colocate) runs one piece per device");
        if (r.trans_count == 1) {
            if (auto pieces = known_pieces(r, devices)) {
                if (r.explicit_devices && static_cast<std::int64_t>(r.devices.size()) != *pieces)
                    return concat(r.assign, ": ", r.devices.size(), " devices for the ", *pieces, " pieces of ", r.trans,
                                  "; give one device per piece");
                if (!r.explicit_devices && *pieces % r.colocate != 0)
                    return concat(r.assign, ": the ", *pieces, " pieces of ", r.trans, " cannot be grouped ", r.colocate,
                                  " per device; choose a colocation that divides ", *pieces, " (",
                                  divisors_text(*pieces), ")");
            }
        }
    }
    // the splits against the op kinds the selector names
    for (const auto& op : r.kinds)
        for (const auto& s : r.splits) {
            text e;
            if (s.kind == split_kind::variable) e = variable_split_error(op, s.target, r.trans);
            if (s.kind == split_kind::dim) e = dim_split_error(op, s.target, r.trans);
            if (!e.empty()) return e;
        }
    return {};
}

constexpr text first_plan_error(const plan_view& p) {
    // the constraints themselves
    // Indices, not pointers: compilers with sanitizers cannot compare pointers to static
    // objects in a constant expression.
    std::optional<std::size_t> devices_fact, zero_fact;
    for (std::size_t i = 0; i < p.facts.size(); ++i) {
        const fact_view& f = p.facts[i];
        switch (f.kind) {
            case fact_kind::devices:
                if (f.value < 1) return concat(f.spelling, ": a plan needs at least one device");
                if (devices_fact && p.facts[*devices_fact].value != f.value)
                    return concat(f.spelling, ": the plan already says ", p.facts[*devices_fact].spelling,
                                  "; give the device count once");
                devices_fact = i;
                break;
            case fact_kind::extent:
                if (f.value < 1) return concat(f.spelling, ": an extent is at least 1");
                for (std::size_t j = 0; j < i; ++j)
                    if (p.facts[j].kind == fact_kind::extent && p.facts[j].dim == f.dim && p.facts[j].value != f.value)
                        return concat(f.spelling, ": the plan already says ", p.facts[j].spelling,
                                      "; give each dim's extent once");
                break;
            case fact_kind::zero:
                if (f.value < 1 || f.value > 3) return concat(f.spelling, ": ZeRO has stages 1, 2 and 3");
                if (zero_fact && p.facts[*zero_fact].value != f.value)
                    return concat(f.spelling, ": the plan already says ", p.facts[*zero_fact].spelling,
                                  "; choose one stage");
                zero_fact = i;
                break;
            case fact_kind::forbid:
            case fact_kind::colocation_requires_recompute: break;
        }
    }
    if (p.devices > 0 && devices_fact && p.facts[*devices_fact].value != p.devices)
        return concat(p.facts[*devices_fact].spelling, ": the plan is given ", p.devices,
                      " devices at run time; pass the same count, or leave it out");
    const std::int64_t devices = declared_devices(p);
    const text devices_text = concat("devices<", devices, ">");
    bool requires_recompute = false;
    for (const auto& f : p.facts) requires_recompute = requires_recompute || f.kind == fact_kind::colocation_requires_recompute;

    for (std::size_t ri = 0; ri < p.rules.size(); ++ri) {
        const rule_view& r = p.rules[ri];
        const text where = concat(r.trans, " in ", r.selector);
        for (const auto& s : r.splits) {
            // forbidden splits
            for (const auto& f : p.facts)
                if (f.kind == fact_kind::forbid && s.kind == f.target_kind && s.target == f.target)
                    return concat(f.spelling, ": ", where, " splits ", s.target,
                                  ", which the plan forbids; remove that split or the constraint");
            // extents the plan knows
            if (s.kind == split_kind::dim)
                for (const auto& f : p.facts) {
                    if (f.kind != fact_kind::extent || f.dim != s.target || f.value < 1) continue;
                    if (auto d = known_degree(s.degree, devices); d && *d >= 1 && f.value % *d != 0)
                        return concat(r.trans, ": ", f.spelling, " is not divisible by the degree ", *d, " of ",
                                      split_spelling(s), "; choose a divisor of ", f.value, " (", divisors_text(f.value), ")");
                    if (s.degree.kind == degree_kind::open && !s.degree.known && !range_holds_divisor_of(s.degree, f.value))
                        return concat(r.trans, ": no value of ", s.degree.range, " divides ", f.spelling,
                                      "; give a range that holds a divisor of ", f.value, " (", divisors_text(f.value), ")");
                }
        }
        if (devices > 0) {
            for (std::int64_t d : r.devices)
                if (d >= devices)
                    return concat(r.assign, " in ", r.selector, ": device ", d, " is outside ", devices_text, " (0..",
                                  devices - 1, "); use a device below ", devices, " or raise the device count");
            if (r.trans_count == 1 && !r.explicit_devices) {
                const auto pieces = known_pieces(r, devices);
                if (r.colocate == 1) {
                    for (const auto& s : r.splits) {
                        if (auto d = known_degree(s.degree, devices); d && *d >= 1 && devices % *d != 0)
                            return concat(r.trans, ": the degree ", *d, " of ", split_spelling(s), " does not divide ",
                                          devices_text, "; choose a divisor of ", devices, " (", divisors_text(devices),
                                          "), or colocate pieces (plan::colocate)");
                        if (s.degree.kind == degree_kind::open && !s.degree.known &&
                            !range_holds_divisor_of(s.degree, devices))
                            return concat(r.trans, ": no value of ", s.degree.range, " divides ", devices_text,
                                          "; give a range that holds a divisor of ", devices, " (", divisors_text(devices),
                                          ")");
                    }
                    if (pieces && *pieces > devices)
                        return concat(r.trans, ": ", *pieces, " pieces but ", devices_text,
                                      "; lower the degrees so that their product is at most ", devices,
                                      ", or colocate pieces (plan::colocate<", (*pieces + devices - 1) / devices, ">)");
                } else if (pieces && r.colocate >= 1 && *pieces % r.colocate == 0 && *pieces / r.colocate > devices) {
                    return concat(r.assign, ": the ", *pieces, " pieces of ", r.trans, " make ", *pieces / r.colocate,
                                  " groups of ", r.colocate, " but the plan has ", devices_text,
                                  "; colocate more pieces per device or lower the degrees");
                }
            }
        }
        // Coshard's rule: colocated pieces recompute (in this rule, or in another with the same selector).
        if (requires_recompute && !r.explicit_devices && r.colocate > 1 && r.recompute_count == 0) {
            bool recomputed = false;
            for (const auto& q : p.rules) recomputed = recomputed || (q.selector == r.selector && q.recompute_count > 0);
            if (!recomputed)
                return concat(r.assign, " in ", r.selector,
                              ": the plan requires colocated ops to recompute (plan::colocation_requires_recompute); "
                              "add plan::recompute to the same rule");
        }
        // one name, one range
        for (std::size_t si = 0; si < r.splits.size(); ++si) {
            const split_view& s = r.splits[si];
            if (s.degree.kind != degree_kind::open || s.degree.name.empty()) continue;
            for (std::size_t qi = 0; qi <= ri; ++qi)
                for (std::size_t ti = 0; ti < p.rules[qi].splits.size() && (qi < ri || ti < si); ++ti) {
                    const split_view& t = p.rules[qi].splits[ti];
                    if (t.degree.kind == degree_kind::open && t.degree.name == s.degree.name &&
                        t.degree.range != s.degree.range)
                        return concat(r.trans, ": the open parameter '", s.degree.name, "' is already declared with ",
                                      t.degree.range, " in ", p.rules[qi].trans, "; give one range per name");
                }
        }
    }
    return {};
}

constexpr text first_error(const plan_view& p) {
    const std::int64_t devices = declared_devices(p);
    for (const auto& r : p.rules) {
        if (text e = first_trans_error(r, devices); !e.empty()) return e;
        if (text e = first_rule_error(r, devices); !e.empty()) return e;
    }
    return first_plan_error(p);
}

}  // namespace detail

}  // namespace loom::plan
// ---- end loom/plan/checks.hpp ----

namespace loom::plan {

// A signature variable by its label: Split<Var<"n">>.
template <fixed_string Label>
struct Var {
    static constexpr std::string_view label = Label.view();
};

// What a trans cuts along: a dim tag (Split<Dim::Batch>) or a variable (Split<Var<"n">>).
template <class Target>
struct Split;

template <dim_tag D>
struct Split<D> {
    static constexpr detail::split_kind kind = detail::split_kind::dim;
    static constexpr std::string_view target = D::name;
};

template <fixed_string Label>
struct Split<Var<Label>> {
    static constexpr detail::split_kind kind = detail::split_kind::variable;
    static constexpr std::string_view target = Var<Label>::label;
};

// Whole copies instead of cuts.
struct Replicate {
    static constexpr detail::split_kind kind = detail::split_kind::replicate;
    static constexpr std::string_view target = "";
};

// What a trans pair starts with: Split<Dim::D>, Split<Var<"v">> or Replicate.
template <class T>
concept split_target = requires {
    { T::kind } -> std::convertible_to<detail::split_kind>;
    { T::target } -> std::convertible_to<std::string_view>;
};

namespace detail {

enum class piece_kind : std::uint8_t { trans, assign, colocate, recompute };

// The "nothing here" of trans' optional split pairs.
struct no_split {};

template <class Target, auto Degree>
constexpr split_view split_view_of() {
    return {Target::kind, Target::target, degree_view_of<Degree>()};
}

// Appends ", Split<Head>, 2" (nothing for an absent pair; no degree for a missing one).
template <class Target, auto Degree>
constexpr void append_split_pair(text& out) {
    if constexpr (!std::is_same_v<Target, no_split>) {
        append(out, concat(", ", target_spelling(Target::kind, Target::target)));
        if constexpr (!std::is_same_v<std::remove_cv_t<decltype(Degree)>, no_degree>)
            append(out, concat(", ", degree_spelling<Degree>()));
    }
}

template <std::size_t Given, std::size_t Needed>
concept pass_one_value_per_runtime_degree = Given == Needed;

template <class... Targets>
inline constexpr std::size_t split_count_v =
    (std::size_t{0} + ... + (std::is_same_v<Targets, no_split> ? 0 : 1));

template <class T>
concept split_target_or_none = split_target<T> || std::is_same_v<T, no_split>;

}  // namespace detail

template <split_target T0, auto D0, detail::split_target_or_none T1 = detail::no_split, auto D1 = detail::no_degree{},
          detail::split_target_or_none T2 = detail::no_split, auto D2 = detail::no_degree{},
          detail::split_target_or_none T3 = detail::no_split, auto D3 = detail::no_degree{}>
class trans {
public:
    static constexpr detail::piece_kind piece = detail::piece_kind::trans;

    static constexpr std::size_t split_count = detail::split_count_v<T0, T1, T2, T3>;

    // The splits as the checks see them; runtime degrees are unknown here.
    static constexpr std::array<detail::split_view, split_count> splits = [] {
        std::array<detail::split_view, split_count> out{};
        std::size_t n = 0;
        out[n++] = detail::split_view_of<T0, D0>();
        if constexpr (!std::is_same_v<T1, detail::no_split>) out[n++] = detail::split_view_of<T1, D1>();
        if constexpr (!std::is_same_v<T2, detail::no_split>) out[n++] = detail::split_view_of<T2, D2>();
        if constexpr (!std::is_same_v<T3, detail::no_split>) out[n++] = detail::split_view_of<T3, D3>();
        return out;
    }();

    static constexpr std::size_t runtime_count = [] {
        std::size_t n = 0;
        for (const auto& s : splits) n += s.degree.kind == detail::degree_kind::runtime ? 1 : 0;
        return n;
    }();

    // "plan::trans<Split<Batch>, 2, Split<Head>, open<Pow2<1, 8>>>"
    static constexpr detail::static_text spelling{[] {
        detail::text s;
        detail::append_split_pair<T0, D0>(s);
        detail::append_split_pair<T1, D1>(s);
        detail::append_split_pair<T2, D2>(s);
        detail::append_split_pair<T3, D3>(s);
        return detail::concat("plan::trans<", s.view().substr(2), ">");
    }()};

    // The degrees of the runtime slots, in order.
    std::array<std::int64_t, runtime_count> runtime_degrees{};

    // One value per runtime slot, in order; a count that differs names the constraint
    // pass_one_value_per_runtime_degree<given, needed> in the compiler's message.
    template <std::convertible_to<std::int64_t>... Values>
        requires detail::pass_one_value_per_runtime_degree<sizeof...(Values), runtime_count>
    constexpr trans(Values... values) : runtime_degrees{static_cast<std::int64_t>(values)...} {
        constexpr detail::message error{detail::first_trans_error(alone())};
        if constexpr (!error.empty()) (void)ill_formed_plan<error>{};
    }

    // The trans as a rule of its own, for the checks of the trans alone.
    static constexpr detail::rule_view alone() {
        detail::rule_view r;
        r.selector = "on_all";
        r.trans_count = 1;
        r.trans = spelling.view();
        r.splits = splits;
        return r;
    }
};

}  // namespace loom::plan

namespace loom {
// The split targets read as vocabulary next to the dims: trans<Split<Dim::Batch>, 4>.
using plan::Replicate;
using plan::Split;
using plan::Var;
}  // namespace loom
// ---- end loom/plan/trans.hpp ----

namespace loom::plan {

template <int... Devices>
struct assign_t {
    static constexpr detail::piece_kind piece = detail::piece_kind::assign;
    static constexpr std::array<std::int64_t, sizeof...(Devices)> devices{Devices...};
    static constexpr detail::static_text spelling{detail::concat("plan::assign<", detail::join(devices), ">")};
};

template <int... Devices>
inline constexpr assign_t<Devices...> assign{};

template <std::int64_t PiecesPerDevice>
struct colocate_t {
    static constexpr detail::piece_kind piece = detail::piece_kind::colocate;
    static constexpr std::int64_t pieces_per_device = PiecesPerDevice;
    static constexpr detail::static_text spelling{detail::concat("plan::colocate<", PiecesPerDevice, ">")};
};

template <std::int64_t PiecesPerDevice>
inline constexpr colocate_t<PiecesPerDevice> colocate{};

struct recompute_t {
    static constexpr detail::piece_kind piece = detail::piece_kind::recompute;
};

inline constexpr recompute_t recompute{};

}  // namespace loom::plan
// ---- end loom/plan/assign.hpp ----
// ---- begin loom/plan/compose.hpp ----
// compose(parts...): a plan from rules and constraints, checked whole, and its lowering to
// the run-time plan_spec (plan/rules.hpp).
//
//   constexpr auto space = plan::compose(
//       plan::devices<8>,
//       plan::on_all(plan::trans<Split<Dim::Batch>, plan::open<Pow2<1, 8>, "dp">>{}),
//       plan::on<ops::Attention>(plan::trans<Split<Dim::Batch>, plan::open<Pow2<1, 8>, "dp">,
//                                            Split<Dim::Head>, 2>{}));
//   static_assert(plan::well_formed<decltype(space)>);
//   plan_spec spec = space.choose("dp", 4).spec();     // open parameters filled
//   resolved_plan plan = space.choose("dp", 4).resolve(graph);
//
// The composed type carries its parts; its checks ran when compose(...) was compiled.
// spec() lowers every rule in order (later rules override what they set, as in plan_spec),
// fills what only the run time knows (runtime degrees, all_devices, chosen open
// parameters) and runs the same checks again on those values, throwing plan_error.
//
// Open parameters are named by the user (open<Range, "tp">; one name, one value) or after
// their trans: the k-th trans of the plan (from 0) names its open degrees "trans#k.degree"
// when it has one split, else "trans#k.degree0", "trans#k.degree1", ... by position.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/list.hpp>

// ---- begin loom/plan/constraints.hpp ----
// Constraints and facts a plan states beside its rules:
//
//   devices<8>                      the device count
//   extent<Dim::Head, 12>           an extent known of the model: degrees along Head must divide 12
//   forbid<Split<Dim::Seq>>         no rule may split Seq (or forbid<Split<Var<"k">>>: no rule splits k)
//   colocation_requires_recompute   colocated pieces (colocate<C>, C > 1) must recompute
//   zero<2>                         ZeRO stage 1, 2 or 3 over the data-parallel devices
//
// Each is a value passed to compose(...). The checks (plan/checks.hpp) hold every rule to
// them; a constraint that contradicts another or a rule stops the compilation in compose.
#include <cstdint>

// ---- begin loom/plan/op_partition.hpp ----
// A resolved plan for one op (op-trans + op-assign) and for a whole graph: what plan
// combinators and presets resolve to, what the searcher fills in, and what partitioning
// (partition/apply.hpp) reads. Nothing here is a template: plans of any shape meet here.
//
// An op is cut into pieces by nested splits (outermost first) and then copied `replicas`
// times. Pieces are numbered row-major over (split_0, ..., split_k, replica), and piece i
// runs on devices[i]. Several pieces may share a device: they run one after another
// (colocation, Coshard).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>


namespace loom::plan {

struct split_axis {
    dim_id dim;         // the dim to split (matched against the node's bound variables)
    std::string label;  // or a signature variable by name ("n", "...0"); wins when set
    std::int64_t degree = 1;
    // Copies instead of cuts: the op runs whole `degree` times along this axis of the piece
    // grid (the backward of an op split along a dim that its gradient op lacks).
    bool replicate = false;

    std::string describe() const {
        if (replicate) return "replicate x" + std::to_string(degree);
        return (label.empty() ? std::string(dim.name()) : label) + "x" + std::to_string(degree);
    }
    friend bool operator==(const split_axis&, const split_axis&) = default;
};

struct op_partition {
    std::vector<split_axis> splits;
    std::int64_t replicas = 1;
    std::vector<int> devices;  // one per piece; empty: pieces 0..n-1 on devices 0..n-1
    bool recompute = false;    // recompute the op's outputs in the backward pass

    std::int64_t pieces() const {
        std::int64_t n = replicas;
        for (const auto& s : splits) n *= s.degree;
        return n;
    }
    int device_of(std::int64_t piece) const {
        return devices.empty() ? static_cast<int>(piece) : devices.at(static_cast<std::size_t>(piece));
    }
    // Coordinates of piece i: one per split, then the replica index.
    std::vector<std::int64_t> coordinates(std::int64_t piece) const {
        std::vector<std::int64_t> c(splits.size() + 1);
        c.back() = piece % replicas;
        piece /= replicas;
        for (std::size_t s = splits.size(); s-- > 0;) {
            c[s] = piece % splits[s].degree;
            piece /= splits[s].degree;
        }
        return c;
    }
    std::string describe() const {
        std::string s;
        for (const auto& a : splits) s += (s.empty() ? "split " : ", ") + a.describe();
        if (replicas > 1) s += (s.empty() ? "" : ", ") + std::string("replicate x") + std::to_string(replicas);
        if (s.empty()) s = "whole";
        s += " on {";
        for (std::int64_t p = 0; p < pieces(); ++p) s += (p ? "," : "") + std::to_string(device_of(p));
        s += "}";
        if (recompute) s += ", recompute";
        return s;
    }
    friend bool operator==(const op_partition&, const op_partition&) = default;
};

// How optimizer state, gradients and parameters are sharded over data-parallel replicas.
enum class zero_stage : std::uint8_t { none = 0, optimizer = 1, gradients = 2, parameters = 3 };

// A plan resolved against one graph: a partition for every forward node (by node id of the
// forward graph), plus the settings that are not per op.
struct resolved_plan {
    int devices = 1;
    std::vector<std::optional<op_partition>> forward;  // empty entry: the op runs whole on every device
    zero_stage zero = zero_stage::none;
    std::string name;  // for explanations: "data parallel x4", ...

    const op_partition* at(node_id n) const {
        auto i = static_cast<std::size_t>(n);
        return i < forward.size() && forward[i] ? &*forward[i] : nullptr;
    }
};

}  // namespace loom::plan
// ---- end loom/plan/op_partition.hpp ----
// ---- begin loom/plan/rules.hpp ----
// A plan as data: an ordered list of rules, each a selector (which ops) and what to do to
// them (op-trans: split / replicate; op-assign: devices, colocation; recompute). The
// typed combinators (plan/combinators.hpp) and the presets (plan/presets.hpp) produce
// this; `resolve` applies it to one graph and yields a resolved_plan.
//
// Rules apply in order and a later rule overrides only what it sets, so a preset can be
// refined: data_parallel(8) followed by a rule that recomputes the MLPs.
//
// Open parameters (`open<...>` in the combinators) are named; resolve() takes their values
// from plan_spec::choices, the searcher's or the user's, and fails naming the parameter
// when one is missing or outside its range.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>


namespace loom::plan {

namespace detail {

// Shell-style glob: '*' any run of characters, '?' one character.
inline bool glob_match(std::string_view pattern, std::string_view text) {
    std::size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
    while (t < text.size()) {
        if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
            ++p;
            ++t;
        } else if (p < pattern.size() && pattern[p] == '*') {
            star = p++;
            mark = t;
        } else if (star != std::string_view::npos) {
            p = star + 1;
            t = ++mark;
        } else {
            return false;
        }
    }
    while (p < pattern.size() && pattern[p] == '*') ++p;
    return p == pattern.size();
}

}  // namespace detail

// The index of the layer of `repeat` that node n is in (its innermost enclosing scope that
// is an instance of that repeat), or -1 outside it.
inline std::int64_t layer_index(const graph& g, const node& n, std::string_view repeat) {
    for (std::int32_t s = n.scope; s != no_id;) {
        const scope_desc& sd = g.scopes.at(static_cast<std::size_t>(s));
        if (sd.repeat != no_id && g.repeats.at(static_cast<std::size_t>(sd.repeat)).name == repeat) return sd.index;
        s = sd.parent;
    }
    return -1;
}

// Which ops a rule applies to. Every condition that is set must hold.
struct selector {
    std::vector<const op_def*> kinds;  // op kinds (empty: any)
    std::string name;                  // glob over the node name, "blocks.*.mlp.fc/*" (empty: any)
    std::string scope;                 // glob over the layer scope path, "blocks.*.attn*" (empty: any)
    std::string repeat;                // a repeat's name ("blocks") and a layer range in it
    std::int64_t first_layer = 0, last_layer = -1;  // inclusive; last < 0: to the end

    bool matches(const graph& g, const node& n) const {
        if (!kinds.empty() && std::find(kinds.begin(), kinds.end(), n.op) == kinds.end()) return false;
        if (!name.empty() && !detail::glob_match(name, n.name)) return false;
        if (!scope.empty() && !detail::glob_match(scope, g.scope_path(n.scope))) return false;
        if (!repeat.empty()) {
            const std::int64_t layer = layer_index(g, n, repeat);
            if (layer < 0 || layer < first_layer || (last_layer >= 0 && layer > last_layer)) return false;
        }
        return true;
    }

    std::string describe() const {
        std::string s;
        for (const op_def* k : kinds) s += (s.empty() ? "" : "|") + std::string(k->name);
        if (!name.empty()) s += (s.empty() ? "" : " ") + std::string("name ") + name;
        if (!scope.empty()) s += (s.empty() ? "" : " ") + std::string("scope ") + scope;
        if (!repeat.empty())
            s += (s.empty() ? "" : " ") + repeat + "[" + std::to_string(first_layer) + ".." +
                 (last_layer < 0 ? std::string("end") : std::to_string(last_layer)) + "]";
        return s.empty() ? "all ops" : s;
    }
};

// A split degree: fixed, or an open parameter filled from plan_spec::choices.
struct degree_spec {
    std::int64_t value = 1;
    std::string open;  // name of the open parameter; empty: fixed
    std::vector<std::int64_t> allowed;  // the open parameter's range (empty: any positive)
};

struct split_spec {
    dim_id dim;
    std::string label;  // a signature variable instead of a dim
    degree_spec degree;
    bool replicate = false;
};

// op-assign: where a rule's pieces run.
struct assign_spec {
    std::vector<int> devices;  // explicit, one per piece (wins when set)
    std::int64_t colocate = 1; // pieces per device, run one after another (Coshard)
    int first_device = 0;      // pieces i*colocate..(i+1)*colocate-1 on device first_device + i
};

struct rule {
    selector on;
    std::optional<std::vector<split_spec>> trans;  // set: replaces the op's splits
    std::optional<assign_spec> assign;
    std::optional<bool> recompute;
    std::string origin;  // the combinator or preset that made the rule, for messages
};

struct plan_spec {
    int devices = 1;
    std::vector<rule> rules;
    zero_stage zero = zero_stage::none;
    std::string name;
    std::map<std::string, std::int64_t> choices;  // values of open parameters
    bool colocation_requires_recompute = false;    // a constraint: Coshard must recompute

    plan_spec& add(rule r) {
        rules.push_back(std::move(r));
        return *this;
    }
    plan_spec& then(const plan_spec& more) {
        for (const auto& r : more.rules) rules.push_back(r);
        if (more.zero != zero_stage::none) zero = more.zero;
        for (const auto& [k, v] : more.choices) choices[k] = v;
        colocation_requires_recompute = colocation_requires_recompute || more.colocation_requires_recompute;
        return *this;
    }
    plan_spec& choose(std::string open, std::int64_t value) {
        choices[std::move(open)] = value;
        return *this;
    }
};

inline std::int64_t resolve_degree(const degree_spec& d, const plan_spec& p, const std::string& where) {
    if (d.open.empty()) return d.value;
    auto it = p.choices.find(d.open);
    if (it == p.choices.end())
        throw plan_error("plan: open parameter '" + d.open + "' of " + where +
                         " has no value; choose one (plan_spec::choose(\"" + d.open + "\", n)) or run the searcher");
    if (!d.allowed.empty() && std::find(d.allowed.begin(), d.allowed.end(), it->second) == d.allowed.end()) {
        std::string range;
        for (auto v : d.allowed) range += (range.empty() ? "" : ", ") + std::to_string(v);
        throw plan_error("plan: open parameter '" + d.open + "' of " + where + " was given " +
                         std::to_string(it->second) + ", outside its range {" + range + "}; choose one of those");
    }
    return it->second;
}

// The plan for every forward node of `g` (nodes no rule selects run whole on every device).
inline resolved_plan resolve(const plan_spec& p, const graph& g) {
    if (p.devices < 1) throw plan_error("plan: devices = " + std::to_string(p.devices) + "; use at least one device");
    const std::size_t forward = g.forward_node_count();
    resolved_plan out;
    out.devices = p.devices;
    out.zero = p.zero;
    out.name = p.name;
    out.forward.resize(forward);
    for (std::size_t i = 0; i < forward; ++i) {
        const node& n = g.nodes[i];
        std::optional<std::vector<split_spec>> splits;
        std::optional<assign_spec> assign;
        bool recompute = false;
        std::string origin;
        for (const rule& r : p.rules) {
            if (!r.on.matches(g, n)) continue;
            if (r.trans) splits = r.trans, origin = r.origin;
            if (r.assign) assign = r.assign;
            if (r.recompute) recompute = *r.recompute;
        }
        if (!splits && !assign && !recompute) continue;
        op_partition op;
        const std::string where = (origin.empty() ? std::string("a rule") : origin) + " on " + std::string(n.op->name) +
                                  " '" + n.name + "'";
        if (splits)
            for (const auto& s : *splits) {
                const std::int64_t degree = resolve_degree(s.degree, p, where);
                op.splits.push_back({s.dim, s.label, degree, s.replicate});
            }
        op.recompute = recompute;
        const std::int64_t pieces = op.pieces();
        if (assign) {
            if (!assign->devices.empty()) {
                op.devices = assign->devices;
            } else {
                if (assign->colocate < 1 || pieces % assign->colocate != 0)
                    throw plan_error("plan: colocate<" + std::to_string(assign->colocate) + "> on " + where + ": " +
                                     std::to_string(pieces) + " pieces cannot be grouped " +
                                     std::to_string(assign->colocate) + " per device; choose a colocation that divides " +
                                     std::to_string(pieces));
                for (std::int64_t k = 0; k < pieces; ++k)
                    op.devices.push_back(assign->first_device + static_cast<int>(k / assign->colocate));
            }
            if (assign->colocate > 1 && p.colocation_requires_recompute && !recompute)
                throw plan_error("plan: colocate<" + std::to_string(assign->colocate) + "> on " + where +
                                 " without recompute, but the plan requires colocated ops to recompute; add recompute "
                                 "to the same selector");
        }
        out.forward[i] = std::move(op);
    }
    return out;
}

}  // namespace loom::plan
// ---- end loom/plan/rules.hpp ----

namespace loom::plan {

template <std::int64_t N>
struct devices_t {
    static constexpr detail::static_text spelling{detail::concat("plan::devices<", N, ">")};
    static constexpr detail::fact_view fact{detail::fact_kind::devices, N, {}, {}, {}, spelling.view()};
    static void lower(plan_spec&) {}  // the device count is set by compose(...).spec()
};

template <std::int64_t N>
inline constexpr devices_t<N> devices{};

template <dim_tag D, std::int64_t Extent>
struct extent_t {
    static constexpr detail::static_text spelling{detail::concat("plan::extent<", D::name, ", ", Extent, ">")};
    static constexpr detail::fact_view fact{detail::fact_kind::extent, Extent, D::name, {}, {}, spelling.view()};
    static void lower(plan_spec&) {}  // compose(...).resolve(graph) checks it against the graph
};

template <dim_tag D, std::int64_t Extent>
inline constexpr extent_t<D, Extent> extent{};

template <split_target Target>
struct forbid_t {
    static constexpr detail::static_text spelling{
        detail::concat("plan::forbid<", detail::target_spelling(Target::kind, Target::target), ">")};
    static constexpr detail::fact_view fact{
        detail::fact_kind::forbid, 0, {}, Target::kind, Target::target, spelling.view()};
    static void lower(plan_spec&) {}  // every rule of the plan was checked against it
};

template <split_target Target>
inline constexpr forbid_t<Target> forbid{};

struct colocation_requires_recompute_t {
    static constexpr detail::static_text spelling{"plan::colocation_requires_recompute"};
    static constexpr detail::fact_view fact{
        detail::fact_kind::colocation_requires_recompute, 0, {}, {}, {}, spelling.view()};
    static void lower(plan_spec& p) { p.colocation_requires_recompute = true; }
};

inline constexpr colocation_requires_recompute_t colocation_requires_recompute{};

template <std::int64_t Stage>
struct zero_t {
    static constexpr detail::static_text spelling{detail::concat("plan::zero<", Stage, ">")};
    static constexpr detail::fact_view fact{detail::fact_kind::zero, Stage, {}, {}, {}, spelling.view()};
    static void lower(plan_spec& p) { p.zero = static_cast<zero_stage>(Stage); }
};

template <std::int64_t Stage>
inline constexpr zero_t<Stage> zero{};

namespace detail {

template <class T>
concept plan_fact = requires {
    { T::fact } -> std::convertible_to<fact_view>;
};

}  // namespace detail

}  // namespace loom::plan
// ---- end loom/plan/constraints.hpp ----
// ---- begin loom/plan/selectors.hpp ----
// Selectors: which ops a rule applies to, and the rule they make with their pieces.
//
//   on<ops::Linear, ops::LinearBias>(pieces...)   op kinds
//   on_name<"blocks.*.mlp*">(pieces...)           a glob over node names ('*' any text, '?' one character)
//   on_scope<"*.attn">(pieces...)                 a glob over layer scope paths
//   on_layers<"blocks", 0, 3>(pieces...)          layers 0..3 (inclusive) of the repeat "blocks";
//                                                 on_layers<"blocks", 4>: from layer 4 to the end
//   on_all(pieces...)                             every op
//
// Pieces are a trans, an assign or colocate, and recompute (at most one of each). A
// selector may wrap one rule to narrow it: on_scope<"*.attn">(on<ops::Attention>(...))
// selects attention ops inside attention scopes.
//
// on<...> names op kinds, so its rule's splits are checked against their signatures here:
// a variable the op lacks or freezes, and, for ops that bind their variables to fixed dims
// (a static `variable_dims` table, e.g. ops::Attention), a dim the op lacks or freezes.
// A frozen variable that a custom transformation cuts (plan/transformation.hpp) is allowed
// when it is listed in plan::transformable_variables<Op>.
#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/list.hpp>


namespace loom::ops {
struct LinearBias;
struct CrossEntropy;
}

namespace loom::plan {

// Labels for plan::transformable_variables: variable_labels<"k">::values.
template <fixed_string... Labels>
struct variable_labels {
    static constexpr std::array<std::string_view, sizeof...(Labels)> values{Labels.view()...};
};

// The frozen variables of Op that a registered custom transformation cuts, so that the
// compile-time checks let a plan split them. Specialize next to the registration:
//   template <> inline constexpr std::span<const std::string_view>
//       plan::transformable_variables<MyOp> = plan::variable_labels<"k">::values;
template <class Op>
inline constexpr std::span<const std::string_view> transformable_variables{};

// Built in (plan/transformation.hpp): Megatron's row-parallel linear with bias.
template <>
inline constexpr std::span<const std::string_view> transformable_variables<ops::LinearBias> =
    variable_labels<"k">::values;
// And vocabulary-parallel cross-entropy.
template <>
inline constexpr std::span<const std::string_view> transformable_variables<ops::CrossEntropy> =
    variable_labels<"v">::values;

namespace detail {

template <op_kind Op>
constexpr op_view op_view_of() {
    std::span<const std::pair<std::string_view, dim_id>> dims;
    if constexpr (requires { Op::variable_dims; }) dims = Op::variable_dims;
    return {Op::name, &Op::sig, dims, transformable_variables<Op>};
}

// ---- filters: the conditions a selector ANDs ------------------------------------------------

struct all_filter {
    static constexpr static_text spelling{"on_all"};
    static constexpr void describe(rule_view&) {}
    static void lower(selector&) {}
};

template <op_kind... Ops>
struct kinds_filter {
    static constexpr std::array<op_view, sizeof...(Ops)> ops{op_view_of<Ops>()...};
    static constexpr static_text spelling{[] {
        text s = "on<";
        for (std::size_t i = 0; i < ops.size(); ++i) append(s, concat(i ? ", " : "", ops[i].name));
        append(s, ">");
        return s;
    }()};
    static constexpr void describe(rule_view& r) {
        ++r.kind_filters;
        r.kinds = ops;
    }
    static void lower(selector& s) { s.kinds = {&op_def_of<Ops>()...}; }
};

template <fixed_string Pattern>
struct name_filter {
    static constexpr static_text spelling{concat("on_name<\"", Pattern.view(), "\">")};
    static constexpr void describe(rule_view& r) {
        ++r.name_filters;
        r.empty_pattern = r.empty_pattern || Pattern.size() == 0;
    }
    static void lower(selector& s) { s.name = std::string(Pattern.view()); }
};

template <fixed_string Pattern>
struct scope_filter {
    static constexpr static_text spelling{concat("on_scope<\"", Pattern.view(), "\">")};
    static constexpr void describe(rule_view& r) {
        ++r.scope_filters;
        r.empty_pattern = r.empty_pattern || Pattern.size() == 0;
    }
    static void lower(selector& s) { s.scope = std::string(Pattern.view()); }
};

template <fixed_string Repeat, std::int64_t First, std::int64_t Last>
struct layer_filter {
    static constexpr static_text spelling{[] {
        text s = concat("on_layers<\"", Repeat.view(), "\", ", First);
        if (Last >= 0) append(s, concat(", ", Last));
        append(s, ">");
        return s;
    }()};
    static constexpr void describe(rule_view& r) {
        ++r.layer_filters;
        r.repeat = Repeat.view();
        r.first_layer = First;
        r.last_layer = Last;
    }
    static void lower(selector& s) {
        s.repeat = std::string(Repeat.view());
        s.first_layer = First;
        s.last_layer = Last;
    }
};

// The filters of a rule, outermost first.
template <class... Filters>
struct selector_t {
    // on_scope<"*.attn">(on<attention>(...))
    static constexpr static_text spelling{[] {
        text s;
        std::size_t depth = 0;
        (append(s, concat(depth++ ? "(" : "", Filters::spelling.view())), ...);
        if (depth > 1) append(s, "(...)");
        for (std::size_t i = 1; i < depth; ++i) append(s, ")");
        return s;
    }()};
    static constexpr void describe(rule_view& r) {
        r.selector = spelling.view();
        (Filters::describe(r), ...);
    }
    static selector lower() {
        selector s;
        (Filters::lower(s), ...);
        return s;
    }
};

template <class T>
concept plan_piece = requires {
    { T::piece } -> std::convertible_to<piece_kind>;
};

template <class Piece>
constexpr void describe_piece(rule_view& r) {
    if constexpr (Piece::piece == piece_kind::trans) {
        if (r.trans_count++ == 0) {
            r.trans = Piece::spelling.view();
            r.splits = Piece::splits;
        }
    } else if constexpr (Piece::piece == piece_kind::assign) {
        if (r.assign_count++ == 0) {
            r.assign = Piece::spelling.view();
            r.explicit_devices = true;
            r.devices = Piece::devices;
        }
    } else if constexpr (Piece::piece == piece_kind::colocate) {
        if (r.assign_count++ == 0) {
            r.assign = Piece::spelling.view();
            r.colocate = Piece::pieces_per_device;
        }
    } else {
        ++r.recompute_count;
    }
}

}  // namespace detail

// A rule: a selector and its pieces (a trans, an op-assign, recompute). Made by on(...) and
// the other selectors; `view` is what the checks read.
template <class Selector, class Pieces>
struct rule_t;

template <class Selector, class... Pieces>
struct rule_t<Selector, std::tuple<Pieces...>> {
    using selector_type = Selector;
    std::tuple<Pieces...> pieces;

    static constexpr detail::rule_view view = [] {
        detail::rule_view r;
        Selector::describe(r);
        (detail::describe_piece<Pieces>(r), ...);
        return r;
    }();
};

namespace detail {

template <class T>
struct is_rule : std::false_type {};
template <class S, class P>
struct is_rule<rule_t<S, P>> : std::true_type {};

template <class T>
concept rule_argument = plan_piece<T> || is_rule<T>::value;

template <class T>
struct selector_of {
    using type = selector_t<>;
};
template <class S, class P>
struct selector_of<rule_t<S, P>> {
    using type = S;
};

template <class T>
struct pieces_of {
    using type = std::tuple<T>;
};
template <class S, class P>
struct pieces_of<rule_t<S, P>> {
    using type = P;
};

template <class Filter, class... Args>
using rule_from_t = rule_t<boost::mp11::mp_append<selector_t<Filter>, typename selector_of<Args>::type...>,
                           boost::mp11::mp_append<std::tuple<>, typename pieces_of<Args>::type...>>;

template <class... Args>
inline constexpr std::size_t nested_rules_v = (std::size_t{0} + ... + (is_rule<Args>::value ? 1 : 0));

template <class T>
constexpr auto as_pieces(const T& piece) {
    if constexpr (is_rule<T>::value)
        return piece.pieces;
    else
        return std::tuple<T>(piece);
}

// The rule's own mistakes stop the compilation here (a bad trans already stopped it where
// it was written, so its rules are not reported again).
template <class Rule>
constexpr void report_rule_errors() {
    constexpr message error{[] {
        text e;
        if (first_trans_error(Rule::view).empty()) e = first_rule_error(Rule::view);
        return e;
    }()};
    if constexpr (!error.empty()) (void)ill_formed_plan<error>{};
}

template <class Filter, class... Args>
constexpr rule_from_t<Filter, Args...> make_rule(const Args&... args) {
    using rule_type = rule_from_t<Filter, Args...>;
    report_rule_errors<rule_type>();
    return rule_type{std::tuple_cat(as_pieces(args)...)};
}

}  // namespace detail

template <op_kind... Ops, detail::rule_argument... Args>
    requires(detail::nested_rules_v<Args...> <= 1)
constexpr detail::rule_from_t<detail::kinds_filter<Ops...>, Args...> on(Args... args) {
    return detail::make_rule<detail::kinds_filter<Ops...>>(args...);
}

template <fixed_string Pattern, detail::rule_argument... Args>
    requires(detail::nested_rules_v<Args...> <= 1)
constexpr detail::rule_from_t<detail::name_filter<Pattern>, Args...> on_name(Args... args) {
    return detail::make_rule<detail::name_filter<Pattern>>(args...);
}

template <fixed_string Pattern, detail::rule_argument... Args>
    requires(detail::nested_rules_v<Args...> <= 1)
constexpr detail::rule_from_t<detail::scope_filter<Pattern>, Args...> on_scope(Args... args) {
    return detail::make_rule<detail::scope_filter<Pattern>>(args...);
}

template <fixed_string Repeat, std::int64_t First, std::int64_t Last = -1, detail::rule_argument... Args>
    requires(detail::nested_rules_v<Args...> <= 1)
constexpr detail::rule_from_t<detail::layer_filter<Repeat, First, Last>, Args...> on_layers(Args... args) {
    return detail::make_rule<detail::layer_filter<Repeat, First, Last>>(args...);
}

template <detail::rule_argument... Args>
    requires(detail::nested_rules_v<Args...> <= 1)
constexpr detail::rule_from_t<detail::all_filter, Args...> on_all(Args... args) {
    return detail::make_rule<detail::all_filter>(args...);
}

}  // namespace loom::plan
// ---- end loom/plan/selectors.hpp ----

namespace loom::plan {

template <class... Parts>
class configured_plan;

namespace detail {

template <class T>
struct is_fact : std::bool_constant<plan_fact<T>> {};

template <class T>
struct is_plan_part : std::bool_constant<is_rule<T>::value || plan_fact<T>> {};

template <class... Rules>
constexpr std::array<rule_view, sizeof...(Rules)> rule_views_of(boost::mp11::mp_list<Rules...>) {
    return {Rules::view...};
}
template <class... Facts>
constexpr std::array<fact_view, sizeof...(Facts)> fact_views_of(boost::mp11::mp_list<Facts...>) {
    return {Facts::fact...};
}

// What the checks see of a plan made of Parts (parts that are neither rules nor
// constraints are left out and reported by first_part_error).
template <class... Parts>
struct plan_description {
    using rules = boost::mp11::mp_copy_if<boost::mp11::mp_list<Parts...>, is_rule>;
    using facts = boost::mp11::mp_copy_if<boost::mp11::mp_list<Parts...>, is_fact>;
    static constexpr auto rule_views = rule_views_of(rules{});
    static constexpr auto fact_views = fact_views_of(facts{});
    static constexpr plan_view view{rule_views, fact_views, 0};
};

template <class... Parts>
constexpr text first_part_error() {
    constexpr bool is_piece[] = {plan_piece<Parts>..., false};
    constexpr bool is_part[] = {is_plan_part<Parts>::value..., true};
    for (std::size_t i = 0; i < sizeof...(Parts); ++i) {
        if (is_part[i]) continue;
        if (is_piece[i])
            return concat("plan::compose: argument ", i + 1,
                          " is a trans, assign, colocate or recompute without a selector; wrap it in one: "
                          "on_all(...), on<Op>(...), on_name<\"glob\">(...)");
        return concat("plan::compose: argument ", i + 1,
                      " is not a plan part; pass rules (on..., on_all) and constraints (devices, extent, forbid, zero, "
                      "colocation_requires_recompute)");
    }
    return {};
}

template <class... Parts>
constexpr text first_composed_error() {
    if (text e = first_part_error<Parts...>(); !e.empty()) return e;
    return first_error(plan_description<Parts...>::view);
}

// The plan-level mistakes stop the compilation in compose(...); those of a trans or a rule
// alone already stopped it where they were written.
template <class... Parts>
constexpr void report_plan_errors() {
    constexpr message error{[] {
        if (text e = first_part_error<Parts...>(); !e.empty()) return e;
        const auto& view = plan_description<Parts...>::view;
        for (const auto& r : view.rules)
            if (!first_trans_error(r).empty() || !first_rule_error(r).empty()) return text();
        return first_plan_error(view);
    }()};
    if constexpr (!error.empty()) (void)ill_formed_plan<error>{};
}

template <class... Parts>
constexpr std::int64_t declared_devices_of() {
    return declared_devices(plan_description<Parts...>::view);
}

inline std::string open_parameter_name(std::size_t trans_index, std::size_t split, std::size_t splits,
                                       std::string_view user_name) {
    if (!user_name.empty()) return std::string(user_name);
    std::string name = "trans#" + std::to_string(trans_index) + ".degree";
    return splits == 1 ? name : name + std::to_string(split);
}

// The open parameters of a plan, in order of first appearance, each once.
template <class... Parts>
std::vector<std::string> open_parameters_of() {
    std::vector<std::string> names;
    std::size_t trans_index = 0;
    for (const rule_view& r : plan_description<Parts...>::view.rules) {
        if (r.trans_count == 0) continue;
        for (std::size_t j = 0; j < r.splits.size(); ++j) {
            if (r.splits[j].degree.kind != degree_kind::open) continue;
            std::string name = open_parameter_name(trans_index, j, r.splits.size(), r.splits[j].degree.name);
            if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(std::move(name));
        }
        ++trans_index;
    }
    return names;
}

inline degree_spec lower_degree(const degree_view& d, const std::string& open_name) {
    if (d.kind == degree_kind::open) return {1, open_name, std::vector<std::int64_t>(d.allowed.begin(), d.allowed.end())};
    return {d.value, "", {}};
}

inline split_spec lower_split(const split_view& s, degree_spec degree) {
    switch (s.kind) {
        case split_kind::dim: return {dim_id(s.target), "", std::move(degree), false};
        case split_kind::variable: return {{}, std::string(s.target), std::move(degree), false};
        case split_kind::replicate: return {{}, "", std::move(degree), true};
    }
    return {};
}

// Everything spec() builds: the plan_spec and the views of what it knows at run time.
struct lowering {
    plan_spec spec;
    std::int64_t devices = 0;
    std::deque<std::vector<split_view>> splits;  // per trans; a deque keeps the views' spans valid
    std::vector<rule_view> rules;
    std::vector<fact_view> facts;
    std::size_t trans_index = 0;
};

template <class Trans>
void lower_trans(const Trans& t, lowering& out, rule_view& view, rule& r) {
    std::vector<split_view>& splits = out.splits.emplace_back(Trans::splits.begin(), Trans::splits.end());
    std::vector<split_spec> specs;
    std::size_t runtime_slot = 0;
    const std::string where = std::string(Trans::spelling.view()) + " in " + std::string(view.selector);
    for (std::size_t j = 0; j < splits.size(); ++j) {
        degree_view& d = splits[j].degree;
        std::string open_name;
        if (d.kind == degree_kind::runtime) {
            d.value = t.runtime_degrees[runtime_slot++];
            d.known = true;
        } else if (d.kind == degree_kind::all_devices) {
            d.value = out.devices;
            d.known = true;
        } else if (d.kind == degree_kind::open) {
            open_name = open_parameter_name(out.trans_index, j, splits.size(), d.name);
            if (out.spec.choices.count(open_name)) {
                // Outside its range: the same message as plan::resolve gives.
                d.value = resolve_degree(lower_degree(d, open_name), out.spec, where);
                d.known = true;
            }
        }
        specs.push_back(lower_split(splits[j], lower_degree(d, open_name)));
    }
    view.splits = splits;
    r.trans = std::move(specs);
    r.origin = std::string(Trans::spelling.view());
    ++out.trans_index;
}

template <class Rule>
void lower_rule(const Rule& part, lowering& out) {
    rule_view view = Rule::view;
    rule r;
    r.on = Rule::selector_type::lower();
    std::apply(
        [&](const auto&... pieces) {
            auto lower_piece = [&]<class Piece>(const Piece& piece) {
                if constexpr (Piece::piece == piece_kind::trans) {
                    lower_trans(piece, out, view, r);
                } else if constexpr (Piece::piece == piece_kind::assign) {
                    r.assign = assign_spec{std::vector<int>(Piece::devices.begin(), Piece::devices.end()), 1, 0};
                    if (r.origin.empty()) r.origin = std::string(Piece::spelling.view());
                } else if constexpr (Piece::piece == piece_kind::colocate) {
                    r.assign = assign_spec{{}, Piece::pieces_per_device, 0};
                    if (r.origin.empty()) r.origin = std::string(Piece::spelling.view());
                } else {
                    r.recompute = true;
                    if (r.origin.empty()) r.origin = "plan::recompute";
                }
            };
            (lower_piece(pieces), ...);
        },
        part.pieces);
    out.rules.push_back(view);
    out.spec.add(std::move(r));
}

template <class... Parts>
plan_spec lower(const std::tuple<Parts...>& parts, const std::map<std::string, std::int64_t>& choices,
                std::int64_t devices) {
    constexpr std::int64_t declared = declared_devices_of<Parts...>();
    if (devices > 0 && declared > 0 && devices != declared)
        throw plan_error("plan::compose(...).spec(" + std::to_string(devices) + "): the plan says devices<" +
                         std::to_string(declared) + ">; pass " + std::to_string(declared) + " or leave the count out");
    if (devices <= 0) devices = declared;
    if (devices <= 0)
        throw plan_error("plan::compose(...).spec(): the device count is unknown; add plan::devices<N> to the plan or "
                         "pass it: spec(n)");
    lowering out;
    out.devices = devices;
    out.spec.devices = static_cast<int>(devices);
    out.spec.choices = choices;
    std::apply(
        [&](const auto&... part) {
            auto lower_part = [&]<class Part>(const Part& p) {
                if constexpr (is_rule<Part>::value) {
                    lower_rule(p, out);
                } else {
                    out.facts.push_back(Part::fact);
                    Part::lower(out.spec);
                }
            };
            (lower_part(part), ...);
        },
        parts);
    const text error = first_error(plan_view{out.rules, out.facts, devices});
    if (!error.empty()) throw plan_error(error.str());
    return std::move(out.spec);
}

// The extents a plan states (extent<D, E>), against the graph it is resolved on: the
// compile-time checks relied on them.
inline void check_extents(std::span<const fact_view> facts, const graph& g) {
    for (const fact_view& f : facts) {
        if (f.kind != fact_kind::extent) continue;
        for (const node& n : g.nodes)
            for (const bound_variable& v : n.sig.vars)
                if (v.dim.name() == f.dim && v.extent != f.value)
                    throw plan_error(concat(f.spelling, ": the graph's ", f.dim, " is ", v.extent, " in ", n.op->name,
                                            " '", n.name, "'; state the model's extent, or leave the fact out")
                                         .str());
    }
}

template <class... Parts>
resolved_plan resolve_checked(const plan_spec& spec, const graph& g) {
    check_extents(plan_description<Parts...>::fact_views, g);
    return plan::resolve(spec, g);
}

inline void require_open_parameter(const std::vector<std::string>& names, const std::string& name, std::int64_t value) {
    if (std::find(names.begin(), names.end(), name) != names.end()) return;
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
    throw plan_error("plan::compose(...).choose(\"" + name + "\", " + std::to_string(value) +
                     "): the plan has no open parameter '" + name + "'; " +
                     (known.empty() ? std::string("it has none") : "its open parameters: " + known));
}

}  // namespace detail

// A composed plan: its parts, and what can be done with them at run time.
template <class... Parts>
class composed_plan {
public:
    std::tuple<Parts...> parts;

    // The plan_spec of this plan. Needs plan::devices<N> in the plan.
    plan_spec spec() const {
        static_assert(detail::declared_devices_of<Parts...>() > 0,
                      "plan::compose(...).spec(): the plan has no plan::devices<N>; add one, or pass the device count: "
                      "spec(n)");
        return detail::lower(parts, {}, 0);
    }
    // ... with the device count known only at run time (or the same as devices<N>).
    plan_spec spec(std::int64_t devices) const { return detail::lower(parts, {}, devices); }

    // The resolved plan on `g`; also checks the plan's extent<D, E> facts against g.
    resolved_plan resolve(const graph& g) const { return detail::resolve_checked<Parts...>(spec(), g); }
    resolved_plan resolve(const graph& g, std::int64_t devices) const {
        return detail::resolve_checked<Parts...>(spec(devices), g);
    }

    // Names of the open parameters, in order of first appearance.
    static std::vector<std::string> open_parameters() { return detail::open_parameters_of<Parts...>(); }

    // This plan with an open parameter filled; throws plan_error for a name the plan lacks.
    configured_plan<Parts...> choose(const std::string& name, std::int64_t value) const;
};

// A composed plan with values for some of its open parameters.
template <class... Parts>
class configured_plan {
public:
    composed_plan<Parts...> composed;
    std::map<std::string, std::int64_t> choices;

    plan_spec spec() const {
        static_assert(detail::declared_devices_of<Parts...>() > 0,
                      "plan::compose(...).spec(): the plan has no plan::devices<N>; add one, or pass the device count: "
                      "spec(n)");
        return detail::lower(composed.parts, choices, 0);
    }
    plan_spec spec(std::int64_t devices) const { return detail::lower(composed.parts, choices, devices); }

    // The resolved plan on `g`; also checks the plan's extent<D, E> facts against g.
    resolved_plan resolve(const graph& g) const { return detail::resolve_checked<Parts...>(spec(), g); }
    resolved_plan resolve(const graph& g, std::int64_t devices) const {
        return detail::resolve_checked<Parts...>(spec(devices), g);
    }

    static std::vector<std::string> open_parameters() { return detail::open_parameters_of<Parts...>(); }

    configured_plan choose(const std::string& name, std::int64_t value) const {
        detail::require_open_parameter(open_parameters(), name, value);
        configured_plan more = *this;
        more.choices[name] = value;
        return more;
    }
};

template <class... Parts>
configured_plan<Parts...> composed_plan<Parts...>::choose(const std::string& name, std::int64_t value) const {
    return configured_plan<Parts...>{*this, {}}.choose(name, value);
}

template <class... Parts>
constexpr composed_plan<Parts...> compose(Parts... parts) {
    detail::report_plan_errors<Parts...>();
    return composed_plan<Parts...>{std::tuple<Parts...>(parts...)};
}

namespace detail {

// well_formed's view of its arguments: a composed plan stands for its parts, a bare piece
// for on_all(piece).
template <class T>
struct as_parts {
    using type = boost::mp11::mp_list<T>;
};
template <class... Parts>
struct as_parts<composed_plan<Parts...>> {
    using type = boost::mp11::mp_list<Parts...>;
};
template <class T>
    requires plan_piece<T>
struct as_parts<T> {
    using type = boost::mp11::mp_list<rule_t<selector_t<all_filter>, std::tuple<T>>>;
};

template <class List>
struct well_formed_list;
template <class... Parts>
struct well_formed_list<boost::mp11::mp_list<Parts...>> {
    static constexpr message error{first_composed_error<Parts...>()};
    static constexpr bool value = error.empty();
};

}  // namespace detail

// True when a plan made of these parts (or this composed plan, or this rule or trans alone)
// passes every check that compose(...) would make. Never a hard error:
//   static_assert(!plan::well_formed<decltype(plan::on<ops::LayerNorm>(plan::trans<Split<Var<"h">>, 2>{}))>);
template <class... Parts>
inline constexpr bool well_formed = detail::well_formed_list<
    boost::mp11::mp_append<boost::mp11::mp_list<>, typename detail::as_parts<std::remove_cvref_t<Parts>>::type...>>::value;

// The first mistake such a plan has, as the checks word it ("" when well-formed), for tests
// and tools: plan::error_message<...>.view().
template <class... Parts>
inline constexpr detail::message error_message = detail::well_formed_list<
    boost::mp11::mp_append<boost::mp11::mp_list<>, typename detail::as_parts<std::remove_cvref_t<Parts>>::type...>>::error;

}  // namespace loom::plan
// ---- end loom/plan/compose.hpp ----
// ---- end loom/plan/combinators.hpp ----
// ---- begin loom/plan/pipeline.hpp ----
// Pipeline plans: stages and micro-batches written with the primitives (nnScaler §4).
//
//   * op-trans: every op is cut along the batch into `micro_batches` pieces, outermost;
//     within a stage, the stage's own plan (data parallel, Megatron, ...) cuts each
//     micro-batch further.
//   * op-assign: the pieces of the ops of stage s (a range of the repeated layers; ops
//     before the first layer go to the head stage, ops after the last to the tail stage)
//     are placed on the stage's device group, all micro-batches on the same devices.
//   * op-order: a pipeline schedule (schedule/) orders the (stage, micro-batch, pass)
//     blocks on every device; partition/pipeline_order.hpp turns it into each device's
//     program order.
//
// Because micro-batches are pieces of one logical op, gradient accumulation is the
// ordinary sum of partial gradients that any batch split produces: a pipelined step equals
// the full-batch step. The loss keeps the full batch's normalizer.
//
//   auto spec = plan::even_pipeline(model.ir(), {.stages = 4, .micro_batches = 8});
//   auto pipe = plan::resolve_pipeline(spec, model.ir());          // pipe.plan: a resolved_plan
//   auto pg = partition::apply_plan(model.ir(), pipe.plan);
//   partition::order_by_schedule(pg, pipe, schedule::one_f_one_b(...));
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>


namespace loom::plan {

struct pipeline_stage {
    std::int64_t first_layer = 0, last_layer = -1;  // inclusive range of the repeat's layers (last < 0: none)
    std::vector<int> devices;                       // the stage's device group
    std::optional<plan_spec> inner;                 // how the stage uses its group (default: the spec's)
};

struct pipeline_spec {
    std::string repeat = "blocks";  // the repeated layers that stages divide
    std::vector<pipeline_stage> stages;
    int micro_batches = 1;
    plan_spec inner;      // a plan for one group (devices = group size); none: every op whole on each device
    int head_stage = 0;   // where the ops before the first layer run (embeddings)
    int tail_stage = -1;  // where the ops after the last layer run (-1: the last stage)
    // Forward rounds (3F1B): a node under scope "<rounds_scope>.<r>" belongs to round r;
    // others to the next round after them, else the last. Empty: one round.
    std::string rounds_scope;
    int rounds = 1;
    std::string name;
};

// A pipeline plan resolved against one graph: the partitions (with op-assign to the stage
// groups) plus, per forward node, its stage, round, and whether its first split is the
// micro-batch split.
struct pipeline_plan {
    resolved_plan plan;
    std::vector<int> stage_of;
    std::vector<int> round_of;
    std::vector<bool> micro_split;
    int stages = 1;
    int micro_batches = 1;
    int rounds = 1;
};

namespace detail {

// r for a node under scope "<name>.<r>" (an instance of a repeat called name, or a scope
// named so), or -1.
inline int round_of(const graph& g, const node& n, const std::string& name) {
    if (name.empty()) return -1;
    for (std::int32_t s = n.scope; s != no_id;) {
        const scope_desc& sd = g.scopes.at(static_cast<std::size_t>(s));
        if (sd.name == name && sd.index >= 0) return static_cast<int>(sd.index);
        const std::string prefix = name + ".";
        if (sd.name.size() > prefix.size() && sd.name.compare(0, prefix.size(), prefix) == 0 &&
            sd.name.find_first_not_of("0123456789", prefix.size()) == std::string::npos)
            return std::stoi(sd.name.substr(prefix.size()));
        s = sd.parent;
    }
    return -1;
}

inline bool has_dim(const node& n, dim_id d) {
    for (const auto& v : n.sig.vars)
        if (v.dim == d) return true;
    return false;
}

}  // namespace detail

inline pipeline_plan resolve_pipeline(const pipeline_spec& spec, const graph& g) {
    const auto stages = static_cast<int>(spec.stages.size());
    if (stages < 1) throw plan_error("pipeline: no stages; give at least one stage (a layer range and its devices)");
    if (spec.micro_batches < 1)
        throw plan_error("pipeline: micro_batches = " + std::to_string(spec.micro_batches) + "; use at least 1");
    if (spec.rounds < 1) throw plan_error("pipeline: rounds = " + std::to_string(spec.rounds) + "; use at least 1");
    const int tail = spec.tail_stage < 0 ? stages - 1 : spec.tail_stage;
    if (spec.head_stage < 0 || spec.head_stage >= stages || tail >= stages)
        throw plan_error("pipeline: the head stage " + std::to_string(spec.head_stage) + " or tail stage " +
                         std::to_string(tail) + " is not one of the " + std::to_string(stages) + " stages");
    int world = 0;
    for (int s = 0; s < stages; ++s) {
        const auto& st = spec.stages[static_cast<std::size_t>(s)];
        if (st.devices.empty())
            throw plan_error("pipeline: stage " + std::to_string(s) + " has no devices; give it a device group");
        for (int d : st.devices) {
            if (d < 0) throw plan_error("pipeline: stage " + std::to_string(s) + " lists device " + std::to_string(d));
            world = std::max(world, d + 1);
        }
    }

    // Each stage's inner plan, resolved for its group (once per distinct group size and spec).
    std::vector<resolved_plan> inner(static_cast<std::size_t>(stages));
    for (int s = 0; s < stages; ++s) {
        const auto& st = spec.stages[static_cast<std::size_t>(s)];
        plan_spec p = st.inner ? *st.inner : spec.inner;
        const auto group = static_cast<int>(st.devices.size());
        if (p.devices == 0) p.devices = group;
        if (p.devices != group)
            throw plan_error("pipeline: stage " + std::to_string(s) + " has " + std::to_string(group) +
                             " devices but its plan '" + p.name + "' is for " + std::to_string(p.devices) +
                             "; give the stage a plan for its group size");
        if (p.zero != zero_stage::none)
            throw plan_error("pipeline: stage " + std::to_string(s) + "'s plan uses ZeRO, which pipelines do not combine with yet; "
                             "use a plan without zero<> inside stages");
        inner[static_cast<std::size_t>(s)] = resolve(p, g);
    }

    pipeline_plan out;
    out.stages = stages;
    out.micro_batches = spec.micro_batches;
    out.rounds = spec.rounds;
    out.plan.devices = world;
    out.plan.name = spec.name.empty() ? "pipeline x" + std::to_string(stages) + ", " +
                                            std::to_string(spec.micro_batches) + " micro-batches"
                                      : spec.name;
    const std::size_t forward = g.forward_node_count();
    out.plan.forward.resize(forward);
    out.stage_of.assign(forward, 0);
    out.round_of.assign(forward, spec.rounds - 1);
    out.micro_split.assign(forward, false);

    // Ops outside the layers run on the head stage when layers follow them (embeddings, and
    // the inputs of each recycling round), else on the tail stage (the head and the loss).
    std::vector<std::int64_t> layer(forward);
    std::vector<bool> layers_after(forward + 1, false);
    for (std::size_t i = 0; i < forward; ++i) layer[i] = layer_index(g, g.nodes[i], spec.repeat);
    for (std::size_t i = forward; i-- > 0;) layers_after[i] = layers_after[i + 1] || layer[i] >= 0;
    // Ops outside the rounds join the next round (embeddings: round 0), else the last.
    std::vector<int> round(forward + 1, spec.rounds - 1);
    for (std::size_t i = forward; i-- > 0;) {
        const int r = detail::round_of(g, g.nodes[i], spec.rounds_scope);
        if (r >= spec.rounds)
            throw plan_error("pipeline: node '" + g.nodes[i].name + "' is in round " + std::to_string(r) +
                             " but the plan has " + std::to_string(spec.rounds) + " rounds");
        round[i] = r >= 0 ? r : round[i + 1];
    }
    for (std::size_t i = 0; i < forward; ++i) {
        const node& n = g.nodes[i];
        int stage = -1;
        if (layer[i] >= 0) {
            for (int s = 0; s < stages && stage < 0; ++s) {
                const auto& st = spec.stages[static_cast<std::size_t>(s)];
                if (layer[i] >= st.first_layer && st.last_layer >= 0 && layer[i] <= st.last_layer) stage = s;
            }
            if (stage < 0)
                throw plan_error("pipeline: layer " + std::to_string(layer[i]) + " of '" + spec.repeat + "' (node '" + n.name +
                                 "') is in no stage's layer range; cover every layer");
        } else {
            stage = layers_after[i + 1] ? spec.head_stage : tail;
        }
        out.round_of[i] = round[i];
        out.stage_of[i] = stage;

        const auto& group = spec.stages[static_cast<std::size_t>(stage)].devices;
        op_partition within;
        within.replicas = static_cast<std::int64_t>(group.size());
        if (const op_partition* p = inner[static_cast<std::size_t>(stage)].at(static_cast<node_id>(i))) within = *p;
        op_partition placed;
        placed.recompute = within.recompute;
        placed.replicas = within.replicas;
        const bool micro = spec.micro_batches > 1 && detail::has_dim(n, Dim::Batch::id);
        if (micro) placed.splits.push_back({Dim::Batch::id, "", spec.micro_batches, false});
        for (const auto& s : within.splits) placed.splits.push_back(s);
        const std::int64_t per_micro = within.pieces();
        for (int m = 0; m < (micro ? spec.micro_batches : 1); ++m)
            for (std::int64_t q = 0; q < per_micro; ++q) {
                const int local = within.device_of(q);
                if (local < 0 || local >= static_cast<int>(group.size()))
                    throw plan_error("pipeline: the plan of stage " + std::to_string(stage) + " puts a piece of '" + n.name +
                                     "' on device " + std::to_string(local) + " of a group of " +
                                     std::to_string(group.size()));
                placed.devices.push_back(group[static_cast<std::size_t>(local)]);
            }
        out.micro_split[i] = micro;
        out.plan.forward[i] = std::move(placed);
    }
    return out;
}

struct even_pipeline_options {
    int stages = 2;                // pipeline stages (with virtual > 1: device groups)
    int micro_batches = 4;
    int devices_per_stage = 1;     // group size: the inner plan's device count
    int virtual_stages = 1;        // interleaved 1F1B: stages * virtual_stages model chunks, chunk k on group k % stages
    std::string repeat = "blocks";
    std::optional<plan_spec> inner;  // per group (default: whole ops on each device of the group)
    std::string rounds_scope;        // forward rounds (3F1B): "recycle" for scopes "recycle.<r>"
    int rounds = 1;
};

// The layers split evenly (the first stages take one more when they do not divide) over
// stages * virtual_stages chunks; group k on devices [k * devices_per_stage, (k + 1) * devices_per_stage).
inline pipeline_spec even_pipeline(const graph& g, const even_pipeline_options& o) {
    std::int64_t layers = 0;
    for (const auto& r : g.repeats)
        if (r.name == o.repeat) layers = std::max<std::int64_t>(layers, static_cast<std::int64_t>(r.scopes.size()));
    const int chunks = o.stages * o.virtual_stages;
    // (Models that repeat the layers per round, like recycling, hold the same count in each.)
    if (o.stages < 1 || o.virtual_stages < 1 || o.devices_per_stage < 1)
        throw plan_error("even_pipeline: stages, virtual_stages and devices_per_stage must be at least 1");
    if (layers < chunks)
        throw plan_error("even_pipeline: " + std::to_string(layers) + " layers of '" + o.repeat + "' cannot fill " +
                         std::to_string(chunks) + " stages; use fewer stages or a deeper model");
    pipeline_spec spec;
    spec.repeat = o.repeat;
    spec.micro_batches = o.micro_batches;
    spec.rounds_scope = o.rounds_scope;
    spec.rounds = o.rounds;
    if (o.inner) spec.inner = *o.inner;
    std::int64_t next = 0;
    for (int k = 0; k < chunks; ++k) {
        const std::int64_t size = layers / chunks + (k < layers % chunks ? 1 : 0);
        pipeline_stage st;
        st.first_layer = next;
        st.last_layer = next + size - 1;
        next += size;
        const int group = k % o.stages;
        for (int d = 0; d < o.devices_per_stage; ++d) st.devices.push_back(group * o.devices_per_stage + d);
        spec.stages.push_back(std::move(st));
    }
    spec.name = "pipeline x" + std::to_string(o.stages) + (o.virtual_stages > 1 ? " (x" + std::to_string(o.virtual_stages) + " virtual)" : "") +
                (o.devices_per_stage > 1 ? " of " + std::to_string(o.devices_per_stage) + " devices" : "") + ", " +
                std::to_string(o.micro_batches) + " micro-batches";
    return spec;
}

}  // namespace loom::plan
// ---- end loom/plan/pipeline.hpp ----
// ---- begin loom/plan/presets.hpp ----
// The well-known plans, each written only with the primitives: rules that split
// (op-trans), place (op-assign) and recompute selected ops, plus the ZeRO rewrites (an
// identity after each parameter or on each gradient, split over the data-parallel
// devices). Nothing here is a special code path: a user can write any of them by hand.
//
// Layer names follow loom's transformer models (models/gpt.hpp): "<repeat>.<i>.attn.{q,k,v,
// proj}", "<repeat>.<i>.mlp.{fc,proj}", layer norms "ln_*". Models that name their layers
// otherwise pass their own transformer_names.
#include <cstdint>
#include <string>
#include <vector>


namespace loom::plan::presets {

// Where the parts of a transformer block are, as scope globs.
struct transformer_names {
    std::vector<std::string> column = {"*.attn.q", "*.attn.k", "*.attn.v", "*.mlp.fc"};  // split outputs
    std::vector<std::string> row = {"*.attn.proj", "*.mlp.proj"};                        // split inputs
    std::string attention = "*.attn";  // split_heads, attention, merge_heads: split heads
    std::string mlp = "*.mlp";         // the activation between fc and proj: split FFN
};

namespace detail {

inline split_spec split_dim(dim_id d, std::int64_t n) { return {d, "", {n, "", {}}, false}; }
inline split_spec split_var(std::string label, std::int64_t n) { return {{}, std::move(label), {n, "", {}}, false}; }
inline split_spec replicate(std::int64_t n) { return {{}, "", {n, "", {}}, true}; }

inline selector kinds(std::vector<const op_def*> k, std::string scope = {}) {
    selector s;
    s.kinds = std::move(k);
    s.scope = std::move(scope);
    return s;
}
inline selector in_scope(std::string scope) {
    selector s;
    s.scope = std::move(scope);
    return s;
}

// trans rule: the data-parallel split (if any) first, then `inner`.
inline rule trans(selector on, std::int64_t dp, std::vector<split_spec> inner, std::string origin) {
    std::vector<split_spec> splits;
    if (dp > 1) splits.push_back(split_dim(Dim::Batch::id, dp));
    for (auto& s : inner) splits.push_back(std::move(s));
    return {std::move(on), std::move(splits), std::nullopt, std::nullopt, std::move(origin)};
}

}  // namespace detail

// Every op split along the batch over n devices; weights replicated, gradients all-reduced.
inline plan_spec data_parallel(int n) {
    plan_spec p;
    p.devices = n;
    p.name = "data parallel x" + std::to_string(n);
    p.add(detail::trans({}, n, {}, "data_parallel"));
    return p;
}

// Megatron tensor parallelism over tp devices (times dp data-parallel replicas on a
// dp x tp mesh, device = d * tp + t): column-parallel q, k, v and fc, heads and FFN split
// in between, row-parallel output projections (partial sums, all-reduced), a
// vocabulary-parallel embedding, the LM head split along the vocabulary and a
// vocabulary-parallel cross-entropy over its logits. Everything else (layer norms, residual
// adds) is replicated within the tensor-parallel group.
inline plan_spec megatron(int tp, int dp = 1, const transformer_names& names = {}) {
    using namespace detail;
    plan_spec p;
    p.devices = tp * dp;
    p.name = "megatron tensor parallel x" + std::to_string(tp) + (dp > 1 ? " x data parallel x" + std::to_string(dp) : "");
    const std::string origin = "megatron";
    p.add(trans({}, dp, {replicate(tp)}, origin));
    for (const auto& c : names.column) p.add(trans(in_scope(c), dp, {split_var("n", tp)}, origin));
    for (const auto& r : names.row) p.add(trans(in_scope(r), dp, {split_var("k", tp)}, origin));
    p.add(trans(kinds({&op_def_of<ops::SplitHeads>(), &op_def_of<ops::Attention>(), &op_def_of<ops::MergeHeads>()},
                      names.attention),
                dp, {split_dim(Dim::Head::id, tp)}, origin));
    p.add(trans(kinds({&op_def_of<ops::Gelu>(), &op_def_of<ops::Relu>(), &op_def_of<ops::Silu>(), &op_def_of<ops::Mul>()},
                      names.mlp),
                dp, {split_dim(Dim::FFN::id, tp)}, origin));
    // Vocabulary-parallel embeddings: each device holds rows of the table; partial sums.
    p.add(trans(kinds({&op_def_of<ops::Embedding>()}), dp, {split_var("v", tp)}, origin));
    // The LM head (a linear outside any layer) split along the vocabulary.
    selector head = kinds({&op_def_of<ops::Linear>()});
    head.name = "linear*";
    p.add(trans(head, dp, {split_var("n", tp)}, origin));
    // Vocabulary-parallel cross-entropy (rebuilt by the transformation registered for its v):
    // each device reduces its slice of the logits; no device gathers them.
    p.add(trans(kinds({&op_def_of<ops::CrossEntropy>()}), dp, {split_var("v", tp)}, origin));
    return p;
}

// Megatron's sequence parallelism: as megatron(), and the ops that Megatron replicates
// (layer norms, residual adds, dropout) are split along the sequence instead. The
// all-reduces around the blocks become reduce-scatters and all-gathers.
inline plan_spec sequence_parallel(int tp, int dp = 1, const transformer_names& names = {}) {
    using namespace detail;
    plan_spec p = megatron(tp, dp, names);
    p.name = "sequence parallel x" + std::to_string(tp) + (dp > 1 ? " x data parallel x" + std::to_string(dp) : "");
    p.add(trans(kinds({&op_def_of<ops::LayerNorm>(), &op_def_of<ops::RmsNorm>(), &op_def_of<ops::Add>(),
                       &op_def_of<ops::Dropout>()}),
                dp, {split_dim(Dim::Seq::id, tp)}, "sequence_parallel"));
    return p;
}

// ZeRO over n data-parallel devices: stage 1 shards optimizer state, 2 also gradients,
// 3 also parameters (each device stores 1/n of every weight and gathers it when used).
inline plan_spec zero(int stage, int n) {
    if (stage < 1 || stage > 3)
        throw plan_error("plan: zero<" + std::to_string(stage) + ">: ZeRO has stages 1, 2 and 3");
    plan_spec p = data_parallel(n);
    p.zero = static_cast<zero_stage>(stage);
    p.name = "ZeRO-" + std::to_string(stage) + " x" + std::to_string(n);
    return p;
}

// Recompute the selected ops' outputs in the backward pass instead of keeping them.
inline plan_spec recompute(selector on) {
    plan_spec p;
    p.add({std::move(on), std::nullopt, std::nullopt, true, "recompute"});
    return p;
}

// Coshard: the attention and MLP of the selected layers split into tp * c pieces, c of
// them colocated on each of tp devices and run one after another, with recompute, so that
// a device holds the activations of one piece at a time. Other ops replicate over the tp
// devices (as in megatron()).
inline plan_spec coshard(int tp, int c, const transformer_names& names = {}) {
    using namespace detail;
    plan_spec p;
    p.devices = tp;
    p.colocation_requires_recompute = true;
    p.name = "coshard " + std::to_string(c) + " per device x" + std::to_string(tp);
    const std::string origin = "coshard";
    const std::int64_t pieces = static_cast<std::int64_t>(tp) * c;
    assign_spec together{{}, c, 0};
    auto split = [&](selector on, split_spec s) {
        rule r = trans(std::move(on), 1, {std::move(s)}, origin);
        r.assign = together;
        r.recompute = true;
        p.add(std::move(r));
    };
    p.add(trans({}, 1, {replicate(tp)}, origin));
    for (const auto& col : names.column) split(in_scope(col), split_var("n", pieces));
    for (const auto& row : names.row) split(in_scope(row), split_var("k", pieces));
    split(kinds({&op_def_of<ops::SplitHeads>(), &op_def_of<ops::Attention>(), &op_def_of<ops::MergeHeads>()},
                names.attention),
          split_dim(Dim::Head::id, pieces));
    split(kinds({&op_def_of<ops::Gelu>(), &op_def_of<ops::Relu>(), &op_def_of<ops::Silu>(), &op_def_of<ops::Mul>()},
                names.mlp),
          split_dim(Dim::FFN::id, pieces));
    return p;
}

}  // namespace loom::plan::presets
// ---- end loom/plan/presets.hpp ----
// ---- begin loom/plan/transformation.hpp ----
// Custom transformation algorithms: how to cut an op along a variable its signature
// freezes, for ops where a cut is still possible with a small change to each piece.
// (nnScaler lets users register transformation algorithms per operator; loom's pieces are
// ordinary nodes, so a transformation is the pieces' attributes.)
//
//   plan::register_transformation<ops::LinearBias>("k", "row-parallel with bias on the first piece",
//       [](const node& n, const piece_ranges& r) { ... return attrs; });
//
// With one registered, a plan may split that variable: the signature's laws still say what
// each operand becomes (here: x and w sliced along k, the output a partial sum), and the
// function adjusts each piece (here: only the piece holding k = 0 adds the bias).
//
// Where no piece-local change suffices, a transformation may instead decompose the op:
// rebuild it from several ops that can be split, and give each of them its partition.
//
//   plan::register_decomposition<ops::CrossEntropy>("v", "vocabulary-parallel",
//       [](graph_builder& b, const node& n, std::span<const tensor> inputs,
//          const plan::op_partition& p, std::vector<plan::op_partition>& partitions) {
//           ... build the replacement with b, push one partition per node appended ...
//           return outputs;  // one per output of n
//       });
//
// Applying a plan rebuilds such a node this way (partition/logical_graph.hpp); `p` arrives
// with every split resolved to a variable label of `n`. Built in: cross_entropy split along
// its vocabulary becomes ops/vocab_parallel_cross_entropy.hpp (Megatron's vocabulary-parallel
// loss: no device gathers the logits).
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>


namespace loom::plan {

using decompose_fn = std::vector<tensor> (*)(graph_builder&, const node&, std::span<const tensor>, const op_partition&,
                                             std::vector<op_partition>&);

struct transformation {
    std::string description;
    attributes (*piece_attributes)(const node&, const piece_ranges&) = nullptr;  // adjust each piece, or
    decompose_fn decompose = nullptr;                                             // rebuild the op
};

class transformation_registry {
public:
    static transformation_registry& instance() {
        static transformation_registry registry;
        return registry;
    }
    void add(const op_def& op, std::string label, transformation t) {
        std::lock_guard lock(mutex_);
        entries_[{&op, std::move(label)}] = std::move(t);
    }
    const transformation* find(const op_def& op, const std::string& label) const {
        std::lock_guard lock(mutex_);
        auto it = entries_.find({&op, label});
        return it == entries_.end() ? nullptr : &it->second;
    }

private:
    transformation_registry();
    mutable std::mutex mutex_;
    std::map<std::pair<const op_def*, std::string>, transformation> entries_;
};

template <op_kind Op>
void register_transformation(std::string label, std::string description,
                             attributes (*piece_attributes)(const node&, const piece_ranges&)) {
    transformation_registry::instance().add(op_def_of<Op>(), std::move(label), {std::move(description), piece_attributes});
}

template <op_kind Op>
void register_decomposition(std::string label, std::string description, decompose_fn decompose) {
    transformation t;
    t.description = std::move(description);
    t.decompose = decompose;
    transformation_registry::instance().add(op_def_of<Op>(), std::move(label), std::move(t));
}

namespace detail {

// cross_entropy cut along v into chunks: the chunk log-sum-exps and the target picks split as
// the logits are (the picks become partial sums), the small combining op replicated over the
// vocabulary pieces.
inline std::vector<tensor> vocab_parallel_loss(graph_builder&, const node& n, std::span<const tensor> in,
                                               const op_partition& p, std::vector<op_partition>& partitions) {
    std::int64_t chunks = 1;
    op_partition by_chunk = p, combine = p;
    for (std::size_t s = 0; s < p.splits.size(); ++s) {
        if (p.splits[s].replicate || p.splits[s].label != "v") continue;
        chunks *= p.splits[s].degree;
        by_chunk.splits[s].label = "c";
        combine.splits[s] = {{}, "", p.splits[s].degree, true};
    }
    const auto ignore = n.attrs.get<std::int64_t>("ignore_index");
    tensor lse = ops::chunk_logsumexp(in[0], chunks);
    partitions.push_back(by_chunk);
    tensor picked = ops::pick_target(in[0], in[1], ignore);
    partitions.push_back(p);
    tensor loss = ops::cross_entropy_from_chunks(lse, picked, in[1], ignore, n.attrs.get<double>("normalizer"));
    partitions.push_back(combine);
    return {loss};
}

}  // namespace detail

// Built in: a linear layer with bias split along its input features (Megatron's
// row-parallel layer): every piece multiplies its slice, and only the first adds the bias.
inline transformation_registry::transformation_registry() {
    entries_[{&op_def_of<ops::LinearBias>(), "k"}] = {
        "row-parallel: pieces sum partial products, the first piece adds the bias",
        [](const node& n, const piece_ranges& r) {
            attributes a = n.attrs;
            auto k = static_cast<std::size_t>(*n.sig.find("k"));
            a.set("bias", std::int64_t{r.begin[k] == 0 ? 1 : 0});
            return a;
        }};
    entries_[{&op_def_of<ops::CrossEntropy>(), "v"}] = {
        "vocabulary-parallel: per-chunk log-sum-exps and target picks, combined by a small replicated op",
        nullptr, &detail::vocab_parallel_loss};
}

}  // namespace loom::plan
// ---- end loom/plan/transformation.hpp ----

// partitioning: vTensors, applying plans, communication
// ---- begin loom/partition/apply.hpp ----
// Applying a resolved plan: one logical training graph becomes one graph per device over
// vTensors, with the communication between them materialized.
//
//   1. The logical graph is built (partition/logical_graph.hpp): rewrites, then autograd.
//   2. Every node gets a partition: forward nodes from the plan, backward nodes mirror the
//      forward op they differentiate (the same splits, matched by dim; a split along a
//      dim the backward op lacks or freezes becomes replication, so piece i of the
//      backward runs where piece i of the forward ran).
//   3. Each piece's variables get index ranges; from them the box every input piece needs
//      and the vTensor every output piece produces (partial where a contracted dim is cut).
//   4. Parameters and inputs are stored per device as the smallest box holding what that
//      device's pieces read, so leaves never move.
//   5. Nodes are emitted in graph order; before a node, each input is materialized on the
//      devices of its pieces (partition/materialize.hpp): local chunk/concat/sum where the
//      device holds the data, else the cheapest collective or send/recv. Every device sees
//      the collectives in the same global order, so the programs cannot deadlock by
//      construction; partition/deadlock.hpp checks any reordering.
//   6. Parameter gradients are materialized on the boxes their parameters are stored in
//      (or on the optimizer's shards under ZeRO-2), and the loss on every device.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

// ---- begin loom/partition/logical_graph.hpp ----
// The logical training graph a plan partitions: the model's forward graph, rewritten as
// the plan asks, then differentiated.
//
//   * ZeRO-3 inserts an identity after every parameter ("zero3/<param>"), so the plan can
//     split that identity over the data-parallel devices: each device then stores a shard
//     of the parameter and the pieces that need all of it gather it (nnScaler decouples
//     a tensor's partitioning from its consumer's this way).
//   * ZeRO-2 inserts an identity on every parameter gradient ("zero2/<param>"), split the
//     same way, so each device keeps only its shard of the gradient.
//   * Decomposition: a node whose plan cuts a variable that a registered transformation
//     handles by rebuilding the op (plan/transformation.hpp; cross_entropy along its
//     vocabulary) is replaced by the ops the transformation builds, each with its own
//     partition.
//   * Recompute: backward nodes read recomputed copies of the outputs of ops marked for
//     recompute, so the forward copies die early. The copies are appended right before
//     their first backward reader and marked as backward nodes of the op they copy.
//
// Every rewrite rebuilds the graph node by node (nodes stay in a topological order) and
// reports where each original forward node went.
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>


namespace loom::partition {

struct logical_graph_options {
    bool zero3_identities = false;
    bool zero2_identities = false;
    std::vector<bool> recompute;  // per forward node of the input graph
    // Per forward node of the input graph: the partition (splits resolved to labels) of a
    // node to rebuild by the decomposition registered for one of its split variables.
    std::vector<std::optional<plan::op_partition>> decompose;
};

struct logical_graph {
    graph g;
    std::vector<node_id> forward_node;         // input forward node -> node of g
    std::vector<node_id> source_of;            // node of g -> input forward node (or no_id)
    std::map<tensor_id, node_id> zero3_identity;  // parameter of g -> its inserted identity
    std::map<tensor_id, node_id> zero2_identity;  // parameter of g -> identity on its gradient
    std::map<node_id, plan::op_partition> decomposed;  // node of g built by a decomposition -> its partition
    std::map<node_id, node_id> decomposed_from;         // node of g built by a decomposition -> input forward node
};

// The decomposition a partition asks for on node `n`: that of the first cut variable whose
// registered transformation rebuilds the op. `p`'s splits must be resolved to labels.
inline const plan::transformation* decomposition_for(const node& n, const plan::op_partition& p) {
    for (const auto& s : p.splits) {
        if (s.replicate) continue;
        const auto* t = plan::transformation_registry::instance().find(*n.op, s.label);
        if (t && t->decompose) return t;
    }
    return nullptr;
}

namespace detail {

// Adds `from`'s inputs and parameters to `b` (same names, scopes, initialisers) and
// records where each went in `map`.
inline void copy_leaves(graph_builder& b, const graph& from, std::vector<tensor_id>& map) {
    for (tensor_id t : from.inputs) {
        const tensor_desc& d = from.tensor(t);
        auto scope = b.enter_scope(d.scope);
        map[static_cast<std::size_t>(t)] = b.add_leaf(d.name, d.dims, d.kind, tensor_role::input).id;
    }
    for (tensor_id t : from.parameters) {
        const tensor_desc& d = from.tensor(t);
        auto scope = b.enter_scope(d.scope);
        tensor p = b.add_leaf(d.name, d.dims, d.kind, tensor_role::parameter);
        b.mutable_graph().tensor(p.id).init = d.init;
        map[static_cast<std::size_t>(t)] = p.id;
    }
}

inline node_id replay(graph_builder& b, const node& n, std::span<const tensor> ins, std::vector<tensor_id>& tmap,
                      bool map_outputs = true) {
    auto scope = b.enter_scope(n.scope);
    std::vector<tensor> outs = n.op->apply(b, ins, n.attrs);
    graph& g = b.mutable_graph();
    auto id = static_cast<node_id>(g.nodes.size() - 1);
    g.nodes.back().name = n.name;
    if (map_outputs)
        for (std::size_t o = 0; o < outs.size(); ++o) {
            tmap.at(static_cast<std::size_t>(n.outputs[o])) = outs[o].id;
            g.tensor(outs[o].id).name = n.name + (outs.size() == 1 ? "" : ":" + std::to_string(o));
        }
    return id;
}

}  // namespace detail

// Builds the logical training graph from a model graph (with or without a backward pass:
// an existing backward pass is dropped and rebuilt after the rewrites).
inline logical_graph build_logical_graph(const graph& model, const logical_graph_options& options) {
    if (model.loss == no_id) throw usage_error("partition: the graph has no loss; call graph_builder::set_loss");
    const std::size_t forward = model.forward_node_count();
    if (!options.recompute.empty() && options.recompute.size() != forward)
        throw usage_error("partition: the recompute flags cover " + std::to_string(options.recompute.size()) +
                          " nodes but the graph has " + std::to_string(forward) + " forward nodes");

    logical_graph out;
    graph_builder b;
    b.adopt_scopes(model);
    std::vector<tensor_id> tmap(model.tensors.size(), no_id);
    detail::copy_leaves(b, model, tmap);
    // ZeRO-3: one identity per parameter, placed before the parameter's first reader.
    std::vector<tensor_id> staged(model.tensors.size(), no_id);
    auto stage = [&](tensor_id param) {
        if (staged[static_cast<std::size_t>(param)] != no_id) return;
        const tensor_desc& d = model.tensor(param);
        auto scope = b.enter_scope(d.scope);
        tensor y = ops::identity(b.handle(tmap[static_cast<std::size_t>(param)]));
        graph& g = b.mutable_graph();
        g.nodes.back().name = "zero3/" + d.name;
        g.tensor(y.id).name = "zero3/" + d.name;
        out.zero3_identity[tmap[static_cast<std::size_t>(param)]] = static_cast<node_id>(g.nodes.size() - 1);
        staged[static_cast<std::size_t>(param)] = y.id;
    };

    out.forward_node.assign(forward, no_id);
    for (std::size_t i = 0; i < forward; ++i) {
        const node& n = model.nodes[i];
        std::vector<tensor> ins;
        for (tensor_id t : n.inputs) {
            if (options.zero3_identities && model.tensor(t).role == tensor_role::parameter) {
                stage(t);
                ins.push_back(b.handle(staged[static_cast<std::size_t>(t)]));
            } else {
                tensor_id m = tmap[static_cast<std::size_t>(t)];
                if (m == no_id) throw error("partition: node '" + n.name + "' reads a tensor produced after it");
                ins.push_back(b.handle(m));
            }
        }
        if (i < options.decompose.size() && options.decompose[i]) {
            const plan::op_partition& p = *options.decompose[i];
            const plan::transformation* t = decomposition_for(n, p);
            if (!t) throw error("partition: node '" + n.name + "' has no decomposition for " + p.describe());
            auto scope = b.enter_scope(n.scope);
            const std::size_t first = b.view().nodes.size();
            std::vector<plan::op_partition> parts;
            std::vector<tensor> outs = t->decompose(b, n, ins, p, parts);
            graph& g = b.mutable_graph();
            const std::size_t built = g.nodes.size() - first;
            if (outs.size() != n.outputs.size() || parts.size() != built || built == 0)
                throw error("partition: the decomposition of " + std::string(n.op->name) + " '" + n.name + "' (" +
                            t->description + ") built " + std::to_string(built) + " nodes with " +
                            std::to_string(parts.size()) + " partitions and " + std::to_string(outs.size()) +
                            " outputs; it must give one partition per node it appends and one output per output of the op");
            for (std::size_t k = 0; k < built; ++k) {
                g.nodes[first + k].name = n.name + "/" + std::string(g.nodes[first + k].op->name);
                out.decomposed[static_cast<node_id>(first + k)] = std::move(parts[k]);
                out.decomposed_from[static_cast<node_id>(first + k)] = static_cast<node_id>(i);
            }
            for (std::size_t o = 0; o < outs.size(); ++o) {
                tmap.at(static_cast<std::size_t>(n.outputs[o])) = outs[o].id;
                g.tensor(outs[o].id).name = n.name + (outs.size() == 1 ? "" : ":" + std::to_string(o));
            }
            out.forward_node[i] = g.tensor(outs[0].id).producer;
            continue;
        }
        out.forward_node[i] = detail::replay(b, n, ins, tmap);
    }
    b.set_loss(b.handle(tmap.at(static_cast<std::size_t>(model.loss))));
    build_backward(b);

    // ZeRO-2: the gradient each optimizer shard reads goes through an identity the plan splits.
    if (options.zero2_identities) {
        graph& g0 = b.mutable_graph();
        auto grads = g0.gradients;
        for (auto& [param, grad] : grads) {
            const std::string pname = g0.tensor(param).name;
            graph_builder::backward_guard guard(b, g0.tensor(grad).producer == no_id ? 0 : g0.tensor(grad).producer);
            auto scope = b.enter_scope(g0.tensor(param).scope);
            tensor y = ops::identity(b.handle(grad));
            graph& g = b.mutable_graph();
            g.nodes.back().name = "zero2/" + pname;
            g.nodes.back().forward_of = no_id;
            g.tensor(grad).role = tensor_role::activation;
            g.tensor(grad).gradient_of = no_id;
            g.tensor(grad).name = "grad/" + pname + ".sum";
            g.tensor(y.id).role = tensor_role::gradient;
            g.tensor(y.id).gradient_of = param;
            g.tensor(y.id).name = "grad/" + pname;
            out.zero2_identity[param] = static_cast<node_id>(g.nodes.size() - 1);
        }
        for (auto& [param, grad] : b.mutable_graph().gradients) {
            node_id id = out.zero2_identity.at(param);
            grad = b.view().at(id).outputs[0];
        }
    }

    graph g = std::move(b).take();
    bool any_recompute = false;
    for (bool r : options.recompute) any_recompute = any_recompute || r;
    for (const auto& [n, p] : out.decomposed) any_recompute = any_recompute || p.recompute;
    if (!any_recompute) {
        out.g = std::move(g);
    } else {
        // Rebuild once more, giving backward readers of recomputed outputs fresh copies.
        std::vector<bool> recompute(g.nodes.size(), false);
        for (std::size_t i = 0; i < options.recompute.size(); ++i)
            if (options.recompute[i]) recompute[static_cast<std::size_t>(out.forward_node[i])] = true;
        for (const auto& [n, p] : out.decomposed)
            if (p.recompute) recompute[static_cast<std::size_t>(n)] = true;
        graph_builder r;
        r.adopt_scopes(g);
        std::vector<tensor_id> map(g.tensors.size(), no_id), copy(g.tensors.size(), no_id);
        detail::copy_leaves(r, g, map);
        std::vector<node_id> new_id(g.nodes.size(), no_id);
        // A recomputed copy of tensor t (t produced by a recompute node), made on demand.
        std::function<tensor_id(tensor_id)> recomputed = [&](tensor_id t) -> tensor_id {
            auto ti = static_cast<std::size_t>(t);
            if (copy[ti] != no_id) return copy[ti];
            const node& n = g.at(g.tensor(t).producer);
            std::vector<tensor> ins;
            for (tensor_id in : n.inputs) {
                node_id p = g.tensor(in).producer;
                bool again = p != no_id && recompute[static_cast<std::size_t>(p)];
                ins.push_back(r.handle(again ? recomputed(in) : map[static_cast<std::size_t>(in)]));
            }
            auto forward_of = new_id[static_cast<std::size_t>(g.tensor(t).producer)];
            graph_builder::backward_guard guard(r, forward_of);
            std::vector<tensor_id> scratch(g.tensors.size(), no_id);
            detail::replay(r, n, ins, scratch);
            graph& rg = r.mutable_graph();
            rg.nodes.back().name = n.name + "/recompute";
            for (std::size_t o = 0; o < n.outputs.size(); ++o) {
                copy[static_cast<std::size_t>(n.outputs[o])] = rg.nodes.back().outputs[o];
                rg.tensor(rg.nodes.back().outputs[o]).name = g.tensor(n.outputs[o]).name + "/recompute";
            }
            return copy[ti];
        };
        for (std::size_t i = 0; i < g.nodes.size(); ++i) {
            const node& n = g.nodes[i];
            std::vector<tensor> ins;
            for (tensor_id in : n.inputs) {
                node_id p = g.tensor(in).producer;
                bool use_copy = n.backward && p != no_id && recompute[static_cast<std::size_t>(p)] &&
                                !recompute[i];
                ins.push_back(r.handle(use_copy ? recomputed(in) : map[static_cast<std::size_t>(in)]));
            }
            node_id forward_of = n.forward_of == no_id ? no_id : new_id[static_cast<std::size_t>(n.forward_of)];
            std::optional<graph_builder::backward_guard> guard;
            if (n.backward && forward_of != no_id) guard.emplace(r, forward_of);
            new_id[i] = detail::replay(r, n, ins, map);
            graph& rg = r.mutable_graph();
            rg.nodes.back().backward = n.backward;
            rg.nodes.back().forward_of = forward_of;
            for (tensor_id o : n.outputs) {
                const tensor_desc& d = g.tensor(o);
                tensor_desc& nd = rg.tensor(map[static_cast<std::size_t>(o)]);
                nd.name = d.name;
                nd.role = d.role;
                nd.gradient_of = d.gradient_of == no_id ? no_id : map[static_cast<std::size_t>(d.gradient_of)];
            }
        }
        graph& rg = r.mutable_graph();
        rg.loss = map[static_cast<std::size_t>(g.loss)];
        rg.forward_nodes = g.forward_nodes;  // the replay keeps the node order
        for (auto [param, grad] : g.gradients)
            rg.gradients.emplace_back(map[static_cast<std::size_t>(param)], map[static_cast<std::size_t>(grad)]);
        std::map<tensor_id, node_id> z3, z2;
        for (auto [p, n] : out.zero3_identity) z3[map[static_cast<std::size_t>(p)]] = new_id[static_cast<std::size_t>(n)];
        for (auto [p, n] : out.zero2_identity) z2[map[static_cast<std::size_t>(p)]] = new_id[static_cast<std::size_t>(n)];
        std::map<node_id, plan::op_partition> decomposed;
        for (auto& [n, p] : out.decomposed) decomposed[new_id[static_cast<std::size_t>(n)]] = std::move(p);
        out.decomposed = std::move(decomposed);
        std::map<node_id, node_id> decomposed_from;
        for (auto [n, i] : out.decomposed_from) decomposed_from[new_id[static_cast<std::size_t>(n)]] = i;
        out.decomposed_from = std::move(decomposed_from);
        out.zero3_identity = std::move(z3);
        out.zero2_identity = std::move(z2);
        for (auto& f : out.forward_node) f = new_id[static_cast<std::size_t>(f)];
        out.g = std::move(r).take();
    }
    out.source_of.assign(out.g.nodes.size(), no_id);
    for (std::size_t i = 0; i < out.forward_node.size(); ++i)
        out.source_of[static_cast<std::size_t>(out.forward_node[i])] = static_cast<node_id>(i);
    for (auto [n, i] : out.decomposed_from) out.source_of[static_cast<std::size_t>(n)] = i;
    return out;
}

}  // namespace loom::partition
// ---- end loom/partition/logical_graph.hpp ----
// ---- begin loom/partition/materialize.hpp ----
// Communication materialization: given the pieces of a logical tensor that devices hold
// and the boxes that consumer pieces need (full values), emit the cheapest correct way to
// get every needed box onto its device.
//
// Tried in order, each on the requests still open:
//   local      the device already holds a full-valued piece containing the box: use it,
//              or cut it out (assemble as chunk);
//   partial    the producer left partial sums of one box S on devices P, one chunk each,
//              and every device of P needs part of S: all_reduce (each needs S),
//              reduce_scatter (their boxes tile S), or all_reduce followed by local chunks,
//              whichever the cost model rates cheapest;
//   tiles      devices D need box R and hold full tiles of R along one axis: all_gather;
//              devices hold tiles of S along one axis and need tiles along another:
//              all_to_all;
//   broadcast  several devices need box R that one device holds;
//   generic    send each needed part of every intersecting piece to the device
//              (send_recv), then concat and sum there (assemble). Always correct: the
//              pieces one node produced cover every element once per value chunk.
// A request served by a collective often leaves other requests local (a chunk of what
// just arrived), so the steps repeat until nothing changes.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

// ---- begin loom/partition/partitioned_graph.hpp ----
// The result of applying a plan: the logical training graph with the layout of every node,
// one graph per device (pieces, local assemble ops and transfer nodes), and the transfers.
// Executors and trainers read it; explanations and the searcher's validation print it.
#include <memory>
#include <string>
#include <vector>

// ---- begin loom/partition/piece_layout.hpp ----
// From an op's partition to its pieces: which variable each split cuts, the index range of
// every variable in every piece, the box each piece reads from each input and the vTensor
// it writes to each output. Also the checks a plan must pass against a node (the run-time
// twin of the combinators' static_asserts) and the mirroring of a forward op's partition
// onto the ops that differentiate it.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

// ---- begin loom/partition/vtensor.hpp ----
// pTensor and vTensor: a logical tensor of the model graph (the pTensor, named by its
// tensor_id) and one piece of it that a device holds or needs (the vTensor).
//
// A vTensor is a box (a half-open index range per axis of the logical tensor) and a value
// chunk "i of n": the piece holds chunk i of a sum of n parts. A full value is chunk 0 of
// 1; an op split along a contracted dim produces chunks 0..n-1 of n, whose sum is the
// value. Two vTensors of one pTensor depend on each other where their boxes intersect;
// a consumer always needs full values, so partial chunks must be summed on the way.
//
// vtensor_pool interns vTensors so that a plan refers to each distinct piece once and
// compares pieces by id.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>


namespace loom::partition {

struct index_range {
    std::int64_t begin = 0;
    std::int64_t end = 0;

    std::int64_t size() const { return end - begin; }
    bool empty() const { return end <= begin; }
    bool contains(const index_range& o) const { return begin <= o.begin && o.end <= end; }
    friend bool operator==(const index_range&, const index_range&) = default;
    friend auto operator<=>(const index_range&, const index_range&) = default;
};

// A box in the index space of one logical tensor (rank 0: the empty box of a scalar).
struct box {
    std::vector<index_range> ranges;

    static box whole(const shape& s) {
        box b;
        for (const auto& a : s) b.ranges.push_back({0, a.extent});
        return b;
    }
    std::size_t rank() const { return ranges.size(); }
    std::int64_t numel() const {
        std::int64_t n = 1;
        for (const auto& r : ranges) n *= std::max<std::int64_t>(r.size(), 0);
        return n;
    }
    bool empty() const {
        return std::any_of(ranges.begin(), ranges.end(), [](const index_range& r) { return r.empty(); });
    }
    bool contains(const box& o) const {
        for (std::size_t a = 0; a < ranges.size(); ++a)
            if (!ranges[a].contains(o.ranges[a])) return false;
        return true;
    }
    // The shape of a piece with this box: the logical shape's dims with the box's extents.
    shape shape_of(const shape& logical) const {
        std::vector<axis> axes;
        for (std::size_t a = 0; a < ranges.size(); ++a) axes.push_back({logical.dim(a), ranges[a].size()});
        return shape(std::move(axes));
    }
    std::string to_string() const {
        std::string s = "[";
        for (std::size_t a = 0; a < ranges.size(); ++a)
            s += (a ? ", " : "") + std::to_string(ranges[a].begin) + ":" + std::to_string(ranges[a].end);
        return s + "]";
    }
    friend bool operator==(const box&, const box&) = default;
    friend auto operator<=>(const box&, const box&) = default;
};

inline box intersect(const box& a, const box& b) {
    box r;
    for (std::size_t i = 0; i < a.ranges.size(); ++i)
        r.ranges.push_back({std::max(a.ranges[i].begin, b.ranges[i].begin), std::min(a.ranges[i].end, b.ranges[i].end)});
    return r;
}

inline bool overlaps(const box& a, const box& b) { return !intersect(a, b).empty() || a.rank() == 0; }

// Chunk `index` of a value split into `count` summands.
struct value_chunk {
    std::int32_t index = 0;
    std::int32_t count = 1;

    bool full() const { return count == 1; }
    friend bool operator==(const value_chunk&, const value_chunk&) = default;
    friend auto operator<=>(const value_chunk&, const value_chunk&) = default;
};

struct vtensor {
    tensor_id logical = no_id;  // the pTensor
    box region;
    value_chunk value;

    std::string to_string() const {
        std::string s = "t" + std::to_string(logical) + region.to_string();
        if (!value.full()) s += " part " + std::to_string(value.index) + "/" + std::to_string(value.count);
        return s;
    }
    friend bool operator==(const vtensor&, const vtensor&) = default;
    friend auto operator<=>(const vtensor&, const vtensor&) = default;
};

using vtensor_id = std::int32_t;

// Interns vTensors: equal pieces get one id, so plans compare pieces by integer.
class vtensor_pool {
public:
    vtensor_id intern(const vtensor& v) {
        auto [it, inserted] = ids_.try_emplace(v, static_cast<vtensor_id>(items_.size()));
        if (inserted) items_.push_back(v);
        return it->second;
    }
    const vtensor& operator[](vtensor_id id) const { return items_.at(static_cast<std::size_t>(id)); }
    std::size_t size() const { return items_.size(); }

private:
    std::map<vtensor, vtensor_id> ids_;
    std::vector<vtensor> items_;
};

}  // namespace loom::partition
// ---- end loom/partition/vtensor.hpp ----

namespace loom::partition {

struct piece_geometry {
    int device = 0;
    piece_ranges vars;            // per bound variable of the node
    std::vector<box> inputs;      // what the piece reads of each input (full values)
    std::vector<vtensor> outputs; // what it writes to each output
};

struct node_layout {
    plan::op_partition partition;  // with every split resolved to a variable label
    std::vector<piece_geometry> pieces;
};

namespace detail {

inline std::string node_where(const node& n) { return std::string(n.op->name) + " '" + n.name + "'"; }

inline std::string dims_of(const node& n) {
    std::string s;
    for (const auto& v : n.sig.vars)
        s += (s.empty() ? "" : ", ") + std::string(v.dim.name()) + (v.frozen ? " (frozen)" : "") + "=" +
             std::to_string(v.extent);
    return s.empty() ? "none" : s;
}

// The variable a split names: by label if given, else the unique splittable variable with
// that dim (or the first, if several carry it).
inline std::optional<int> variable_of(const node& n, const plan::split_axis& s) {
    if (!s.label.empty()) return n.sig.find(s.label);
    std::optional<int> found;
    for (std::size_t v = 0; v < n.sig.vars.size(); ++v)
        if (n.sig.vars[v].dim == s.dim) {
            if (!found || (!n.sig.vars[static_cast<std::size_t>(*found)].splittable && n.sig.vars[v].splittable))
                found = static_cast<int>(v);
        }
    return found;
}

}  // namespace detail

// Checks `p` against node `n` and resolves every split to a variable label. `strict`: a
// plan the user wrote, whose mistakes are errors; otherwise (a mirrored backward op) a
// split that does not apply becomes replication, noted in `notes`.
inline plan::op_partition resolve_partition(const node& n, plan::op_partition p, int devices, bool strict,
                                            std::vector<std::string>& notes) {
    const std::string where = detail::node_where(n);
    if (p.replicas < 1)
        throw plan_error("plan: " + where + " has " + std::to_string(p.replicas) + " replicas; use at least 1");
    std::vector<std::int64_t> cut(n.sig.vars.size(), 1);
    std::vector<std::size_t> copied;  // splits that became replication here
    for (auto& s : p.splits) {
        if (s.degree < 1)
            throw plan_error("plan: trans<Split<" + (s.label.empty() ? std::string(s.dim.name()) : s.label) + ">, " +
                             std::to_string(s.degree) + "> on " + where + ": the degree must be at least 1");
        if (s.replicate) continue;
        auto fail_or_replicate = [&](const std::string& why) {
            if (strict) throw plan_error("plan: trans<Split<" + s.describe() + ">> on " + where + ": " + why);
            notes.push_back(where + ": the mirrored split " + s.describe() + " " + why + "; the op runs replicated instead");
            s.replicate = true;
            copied.push_back(static_cast<std::size_t>(&s - p.splits.data()));
        };
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
        const std::int64_t extent = var.extent / cut[static_cast<std::size_t>(*v)];
        if (extent % s.degree != 0) {
            fail_or_replicate("dim " + std::string(var.dim.name()) + " has extent " + std::to_string(var.extent) +
                              (cut[static_cast<std::size_t>(*v)] > 1 ? " (" + std::to_string(extent) + " per piece)" : "") +
                              ", which degree " + std::to_string(s.degree) + " does not divide; choose a divisor of " +
                              std::to_string(extent));
            continue;
        }
        cut[static_cast<std::size_t>(*v)] *= s.degree;
        s.label = var.label;
        s.dim = var.dim;
    }
    // A copy along an axis whose pieces all share their devices (a pipeline's micro-batches
    // of an op without a batch dim, such as a weight's gradient sum) computes the same thing
    // twice on one device: keep one.
    for (auto it = copied.rbegin(); it != copied.rend() && !p.devices.empty(); ++it) {
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

// The partition of an op that differentiates (or follows) `forward`: the same piece grid,
// splits named by dim so that they find the matching variables of the new op.
inline plan::op_partition mirror_partition(const plan::op_partition& p, const node* forward) {
    plan::op_partition m = p;
    m.recompute = false;
    for (auto& s : m.splits) {
        if (s.replicate || !forward) continue;
        if (auto v = forward->sig.find(s.label)) s.dim = forward->sig.vars[static_cast<std::size_t>(*v)].dim;
        s.label.clear();
    }
    return m;
}

// Index ranges and boxes of every piece of node `n` under the resolved partition `p`.
inline node_layout layout_pieces(const graph& g, const node& n, plan::op_partition p) {
    node_layout layout;
    const auto& vars = n.sig.vars;
    std::vector<int> split_var(p.splits.size(), -1);
    std::vector<split_option> effects(p.splits.size());
    for (std::size_t s = 0; s < p.splits.size(); ++s) {
        if (p.splits[s].replicate) continue;
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
            if (split_var[s] < 0) continue;
            auto v = static_cast<std::size_t>(split_var[s]);
            const std::int64_t size = (piece.vars.end[v] - piece.vars.begin[v]) / p.splits[s].degree;
            piece.vars.begin[v] += coord[s] * size;
            piece.vars.end[v] = piece.vars.begin[v] + size;
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
// ---- end loom/partition/piece_layout.hpp ----
// ---- begin loom/partition/transfer.hpp ----
// One movement of data between devices, as partitioning materializes it: which collective
// (or point-to-point pair), over which devices, moving which boxes of which logical
// tensor. Each member device's program holds one `transfer` node pointing here.
//
// Member m of `group` contributes the piece `inputs[m]` (when has_input[m]) and receives
// `outputs[m]` (when has_output[m]); both are boxes of the logical tensor. The collectives
// keep their usual meaning over those pieces:
//   all_reduce      every member: a partial value of one box -> its full value
//   all_gather      members' tiles of a box -> the whole box on every member
//   reduce_scatter  partial values of one box -> member m gets the full value of tile m
//   all_to_all      tiles along one axis -> tiles along another axis
//   broadcast       the root's box -> every member
//   send_recv       group {source, destination}: one box from one device to another
#include <cstdint>
#include <string>
#include <vector>


namespace loom::partition {

enum class transfer_kind : std::uint8_t { all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send_recv };

inline std::string_view to_string(transfer_kind k) {
    switch (k) {
        case transfer_kind::all_reduce: return "all_reduce";
        case transfer_kind::all_gather: return "all_gather";
        case transfer_kind::reduce_scatter: return "reduce_scatter";
        case transfer_kind::all_to_all: return "all_to_all";
        case transfer_kind::broadcast: return "broadcast";
        case transfer_kind::send_recv: return "send_recv";
    }
    return "?";
}

struct transfer {
    transfer_kind kind = transfer_kind::send_recv;
    std::vector<int> group;  // global ranks, ascending (send_recv: {source, destination} in that order)
    tensor_id logical = no_id;
    value_kind values = value_kind::real;
    std::vector<box> inputs, outputs;
    std::vector<bool> has_input, has_output;
    int root = -1;  // broadcast: the global rank that holds the data
    bool backward = false;
    node_id consumer = no_id;  // the logical node whose input this feeds; no_id: gradient or loss

    std::size_t member(int rank) const {
        for (std::size_t m = 0; m < group.size(); ++m)
            if (group[m] == rank) return m;
        return group.size();
    }

    // Elements each member sends, by the usual ring (and tree) algorithms.
    std::int64_t elements_sent_by(std::size_t m) const {
        const auto n = static_cast<std::int64_t>(group.size());
        switch (kind) {
            case transfer_kind::all_reduce: return 2 * (n - 1) * outputs[m].numel() / n;
            case transfer_kind::all_gather: return (n - 1) * inputs[m].numel();
            case transfer_kind::reduce_scatter: return (n - 1) * inputs[m].numel() / n;
            case transfer_kind::all_to_all: return (n - 1) * inputs[m].numel() / n;
            case transfer_kind::broadcast: return group[m] == root ? outputs[m].numel() : 0;
            case transfer_kind::send_recv: return m == 0 ? inputs[0].numel() : 0;
        }
        return 0;
    }
    // Sequential communication steps (latency terms) of the same algorithms.
    std::int64_t steps() const {
        const auto n = static_cast<std::int64_t>(group.size());
        switch (kind) {
            case transfer_kind::all_reduce: return 2 * (n - 1);
            case transfer_kind::all_gather:
            case transfer_kind::reduce_scatter:
            case transfer_kind::all_to_all: return n - 1;
            case transfer_kind::broadcast: {
                std::int64_t s = 0;
                for (std::int64_t k = 1; k < n; k *= 2) ++s;
                return s;
            }
            case transfer_kind::send_recv: return 1;
        }
        return 1;
    }

    std::string describe() const {
        std::string s = std::string(to_string(kind)) + " t" + std::to_string(logical) + " on {";
        for (std::size_t m = 0; m < group.size(); ++m) s += (m ? "," : "") + std::to_string(group[m]);
        s += "}";
        if (kind == transfer_kind::broadcast) s += " from " + std::to_string(root);
        return s;
    }
};

// What a byte and a step cost, to choose between ways of moving the same data. Defaults
// are a generic interconnect (5 us per step, 10 GB/s); the searcher's cost model is richer.
struct transfer_cost_model {
    double seconds_per_step = 5e-6;
    double bytes_per_second = 10e9;

    double cost(std::int64_t bytes, std::int64_t steps) const {
        return static_cast<double>(steps) * seconds_per_step + static_cast<double>(bytes) / bytes_per_second;
    }
};

}  // namespace loom::partition
// ---- end loom/partition/transfer.hpp ----

namespace loom::partition {

// A piece of a logical tensor that lives in a device graph for the whole step.
struct stored_piece {
    tensor_id logical = no_id;  // in the logical graph
    tensor_id local = no_id;    // in the device graph
    box region;
};

// Which piece of which logical node a device node computes (no_id for the transfers and
// assembles that plans insert).
struct piece_source {
    node_id logical = no_id;
    std::int32_t piece = -1;
};

struct device_part {
    std::unique_ptr<graph_builder> builder = std::make_unique<graph_builder>();
    std::vector<stored_piece> parameters;  // the boxes of each parameter this device stores
    std::vector<stored_piece> inputs;      // the boxes of each input it is fed
    std::vector<stored_piece> gradients;   // per parameter piece: its gradient (same order)
    tensor_id loss = no_id;                // the full loss, on every device
    std::vector<piece_source> sources;     // per node of the device graph (shorter: the rest inserted)

    piece_source source_of(node_id n) const {
        auto i = static_cast<std::size_t>(n);
        return i < sources.size() ? sources[i] : piece_source{};
    }

    const graph& ir() const { return builder->view(); }
};

struct partitioned_graph {
    int world = 1;
    plan::zero_stage zero = plan::zero_stage::none;
    std::string plan_name;
    std::unique_ptr<logical_graph> logical;
    std::vector<node_layout> layouts;  // per node of the logical graph
    std::vector<device_part> devices;
    std::vector<transfer> transfers;
    std::vector<std::string> notes;    // where a mirrored split fell back to replication, ...
    // op-order: the node ids of each device's graph in the order it runs them (empty: graph
    // order, which apply_plan makes deadlock-free by construction). Pipeline schedules set it.
    std::vector<std::vector<node_id>> order;

    const graph& ir() const { return logical->g; }
};

}  // namespace loom::partition
// ---- end loom/partition/partitioned_graph.hpp ----
// ---- begin loom/partition/region_copy.hpp ----
// Copying a box-shaped region between dense row-major pieces of one logical tensor: the
// one primitive behind local chunk, concat and sum, and behind packing and unpacking the
// buffers of collectives.
//
// A piece holds the elements of its box `piece` of the logical tensor, row-major; the
// region must lie inside both pieces. The innermost axis is contiguous in both, so the copy
// runs as rows of `region.ranges.back().size()` elements.
#include <cstdint>
#include <vector>


namespace loom::partition {

namespace detail {

// Row-major strides of a piece with box `b`.
inline std::vector<std::int64_t> strides_of(const box& b) {
    std::vector<std::int64_t> s(b.rank(), 1);
    for (std::size_t a = b.rank(); a-- > 1;) s[a - 1] = s[a] * b.ranges[a].size();
    return s;
}

}  // namespace detail

// Calls row(src_offset, dst_offset, length) for every innermost row of `region`, with
// offsets in elements into the src piece (box `src`) and dst piece (box `dst`).
template <class F>
void for_each_region_row(const box& region, const box& src, const box& dst, F&& row) {
    const std::size_t rank = region.rank();
    if (rank == 0) {
        row(std::int64_t{0}, std::int64_t{0}, std::int64_t{1});
        return;
    }
    if (region.empty()) return;
    const auto ss = detail::strides_of(src), ds = detail::strides_of(dst);
    const std::int64_t length = region.ranges[rank - 1].size();
    std::vector<std::int64_t> at(rank);
    for (std::size_t a = 0; a < rank; ++a) at[a] = region.ranges[a].begin;
    while (true) {
        std::int64_t so = 0, dof = 0;
        for (std::size_t a = 0; a < rank; ++a) {
            so += (at[a] - src.ranges[a].begin) * ss[a];
            dof += (at[a] - dst.ranges[a].begin) * ds[a];
        }
        row(so, dof, length);
        // Advance the odometer over every axis but the innermost.
        std::size_t a = rank - 1;
        while (a-- > 0) {
            if (++at[a] < region.ranges[a].end) break;
            at[a] = region.ranges[a].begin;
        }
        if (a == static_cast<std::size_t>(-1)) return;
    }
}

template <class T>
void copy_region(const T* src, const box& src_box, T* dst, const box& dst_box, const box& region) {
    for_each_region_row(region, src_box, dst_box, [&](std::int64_t s, std::int64_t d, std::int64_t n) {
        for (std::int64_t i = 0; i < n; ++i) dst[d + i] = src[s + i];
    });
}

template <class T>
void add_region(const T* src, const box& src_box, T* dst, const box& dst_box, const box& region) {
    for_each_region_row(region, src_box, dst_box, [&](std::int64_t s, std::int64_t d, std::int64_t n) {
        for (std::int64_t i = 0; i < n; ++i) dst[d + i] += src[s + i];
    });
}

// Boxes travel in node attributes as flat lists: begin0, end0, begin1, end1, ...
inline std::vector<std::int64_t> encode_box(const box& b) {
    std::vector<std::int64_t> v;
    for (const auto& r : b.ranges) {
        v.push_back(r.begin);
        v.push_back(r.end);
    }
    return v;
}

inline box decode_box(const std::vector<std::int64_t>& v, std::size_t first, std::size_t rank) {
    box b;
    for (std::size_t a = 0; a < rank; ++a) b.ranges.push_back({v.at(first + 2 * a), v.at(first + 2 * a + 1)});
    return b;
}

}  // namespace loom::partition
// ---- end loom/partition/region_copy.hpp ----

namespace loom::partition {

namespace detail {

// If `parts` tile `whole` along one axis in equal slices (disjoint, covering, every other
// axis whole), that axis.
inline std::optional<std::size_t> tiling_axis(const std::vector<box>& parts, const box& whole) {
    if (parts.size() < 2 || whole.rank() == 0) return std::nullopt;
    for (std::size_t a = 0; a < whole.rank(); ++a) {
        bool others_whole = true;
        for (const auto& p : parts)
            for (std::size_t b = 0; b < whole.rank(); ++b)
                if (b != a && !(p.ranges[b] == whole.ranges[b])) others_whole = false;
        if (!others_whole) continue;
        std::vector<index_range> r;
        for (const auto& p : parts) r.push_back(p.ranges[a]);
        std::sort(r.begin(), r.end());
        bool ok = r.front().begin == whole.ranges[a].begin && r.back().end == whole.ranges[a].end;
        for (std::size_t i = 0; ok && i < r.size(); ++i) {
            ok = r[i].size() == r[0].size() && r[i].size() > 0;
            if (i > 0) ok = ok && r[i].begin == r[i - 1].end;
        }
        if (ok) return a;
    }
    return std::nullopt;
}

inline box bounding(const std::vector<box>& parts) {
    box b = parts.at(0);
    for (const auto& p : parts)
        for (std::size_t a = 0; a < b.rank(); ++a) {
            b.ranges[a].begin = std::min(b.ranges[a].begin, p.ranges[a].begin);
            b.ranges[a].end = std::max(b.ranges[a].end, p.ranges[a].end);
        }
    return b;
}

}  // namespace detail

class materializer {
public:
    materializer(partitioned_graph& out, transfer_cost_model cost) : out_(out), g_(out.logical->g), cost_(cost) {
        out_.devices.resize(static_cast<std::size_t>(out_.world));
        held_.resize(g_.tensors.size());
    }

    // Pipelines: the stage of every logical node (-1: none). A tensor passed from one stage
    // to another moves point to point only: stages run their blocks in different orders,
    // so a collective spanning two stages could be reached in different orders by its
    // members, while buffered sends cannot wait on each other.
    void set_stages(std::vector<int> stage_of_node) { stage_of_node_ = std::move(stage_of_node); }

    // Parameters and inputs: each device stores the bounding box of what its pieces read.
    void store_leaves() {
        std::vector<std::vector<std::optional<box>>> need(g_.tensors.size());
        for (std::size_t n = 0; n < g_.nodes.size(); ++n) {
            const node& nd = g_.nodes[n];
            for (const auto& piece : out_.layouts[n].pieces)
                for (std::size_t k = 0; k < nd.inputs.size(); ++k) {
                    const tensor_desc& t = g_.tensor(nd.inputs[k]);
                    if (t.role != tensor_role::input && t.role != tensor_role::parameter) continue;
                    auto& slot = need[static_cast<std::size_t>(nd.inputs[k])];
                    slot.resize(static_cast<std::size_t>(out_.world));
                    auto& b = slot[static_cast<std::size_t>(piece.device)];
                    b = b ? detail::bounding({*b, piece.inputs[k]}) : piece.inputs[k];
                }
        }
        auto store = [&](tensor_id t) {
            const tensor_desc& d = g_.tensor(t);
            const auto& slot = need[static_cast<std::size_t>(t)];
            for (std::size_t dev = 0; dev < slot.size(); ++dev) {
                if (!slot[dev]) continue;
                device_part& part = out_.devices[dev];
                tensor local = part.builder->add_leaf(d.name + suffix(*slot[dev], d.dims), slot[dev]->shape_of(d.dims),
                                                      d.kind, d.role);
                if (d.role == tensor_role::parameter) part.builder->mutable_graph().tensor(local.id).init = d.init;
                (d.role == tensor_role::parameter ? part.parameters : part.inputs).push_back({t, local.id, *slot[dev]});
                hold(t, {t, *slot[dev], {}}, static_cast<int>(dev), local.id, true);
            }
        };
        for (tensor_id t : g_.inputs) store(t);
        for (tensor_id t : g_.parameters) store(t);
    }

    void emit_node(node_id id) {
        const node& n = g_.at(id);
        const node_layout& layout = out_.layouts[static_cast<std::size_t>(id)];
        const bool backward = n.backward || n.forward_of != no_id;
        std::vector<std::vector<tensor_id>> locals(n.inputs.size());
        for (std::size_t k = 0; k < n.inputs.size() && !n.op->shape_only_inputs; ++k) {
            std::vector<request> reqs;
            for (const auto& piece : layout.pieces) reqs.push_back({piece.device, piece.inputs[k]});
            locals[k] = materialize(n.inputs[k], reqs, id, backward);
        }
        for (std::size_t p = 0; p < layout.pieces.size(); ++p) {
            const piece_geometry& piece = layout.pieces[p];
            graph_builder& b = *out_.devices[static_cast<std::size_t>(piece.device)].builder;
            std::vector<tensor> ins;
            for (std::size_t k = 0; k < n.inputs.size() && !n.op->shape_only_inputs; ++k) ins.push_back(b.handle(locals[k][p]));
            attributes attrs = n.op->piece_attributes ? n.op->piece_attributes(n, piece.vars) : n.attrs;
            for (const auto& s : layout.partition.splits) {
                if (s.replicate) continue;
                const auto* custom = plan::transformation_registry::instance().find(*n.op, s.label);
                if (custom && custom->piece_attributes) {
                    node adjusted = n;
                    adjusted.attrs = attrs;
                    attrs = custom->piece_attributes(adjusted, piece.vars);
                }
            }
            std::vector<tensor> outs;
            try {
                if (n.op->shape_only_inputs) {
                    std::vector<shape> shapes;
                    for (std::size_t o = 0; o < n.outputs.size(); ++o)
                        shapes.push_back(piece.outputs[o].region.shape_of(g_.tensor(n.outputs[o]).dims));
                    outs = b.append_unchecked(*n.op, {}, std::move(shapes), attrs, n.name);
                } else {
                    outs = n.op->apply(b, ins, attrs);
                }
            } catch (const error& e) {
                throw plan_error("plan: piece " + std::to_string(p) + " of " + std::string(n.op->name) + " '" + n.name +
                                 "' (" + layout.partition.describe() + ") cannot be built: " + e.what());
            }
            graph& dg = b.mutable_graph();
            dg.nodes.back().name = n.name + "#" + std::to_string(p);
            dg.nodes.back().backward = backward;
            auto& sources = out_.devices[static_cast<std::size_t>(piece.device)].sources;
            sources.resize(dg.nodes.size());
            sources.back() = {id, static_cast<std::int32_t>(p)};
            for (std::size_t o = 0; o < outs.size(); ++o) {
                const vtensor& v = piece.outputs[o];
                const tensor_desc& logical = g_.tensor(n.outputs[o]);
                if (!same_extents(dg.tensor(outs[o].id).dims, v.region.shape_of(logical.dims)))
                    throw plan_error("plan: piece " + std::to_string(p) + " of " + std::string(n.op->name) + " '" +
                                     n.name + "' produced shape " + dg.tensor(outs[o].id).dims.to_string() +
                                     " where its box " + v.region.to_string() +
                                     " was expected; the op's shape rule does not follow its signature under this split");
                dg.tensor(outs[o].id).name = logical.name + suffix(v.region, logical.dims) + chunk_suffix(v.value);
                hold(n.outputs[o], v, piece.device, outs[o].id, true);
            }
        }
    }

    // Gradients onto the parameters' storage (or the optimizer's shards), the loss everywhere.
    void finish() {
        for (auto [param, grad] : g_.gradients) {
            std::vector<request> reqs;
            std::vector<tensor_id> params;
            if (out_.logical->zero2_identity.count(param)) {
                // ZeRO-2: the gradient identity's pieces are the optimizer's shards, which
                // assumes every device stores the whole parameter (data-parallel replicas).
                const box whole = box::whole(g_.tensor(param).dims);
                for (int d = 0; d < out_.world; ++d) {
                    bool stored = false;
                    for (const auto& s : out_.devices[static_cast<std::size_t>(d)].parameters)
                        stored = stored || (s.logical == param && s.region == whole);
                    if (!stored)
                        throw plan_error("plan: ZeRO-2 shards the gradient of '" + g_.tensor(param).name +
                                         "' over data-parallel replicas, but device " + std::to_string(d) +
                                         " does not store the whole parameter; use ZeRO-3 (which shards parameters "
                                         "too) or replicate the ops that read it");
                }
                for (const auto& piece : out_.layouts[static_cast<std::size_t>(g_.tensor(grad).producer)].pieces)
                    reqs.push_back({piece.device, piece.outputs[0].region});
            } else {
                for (int d = 0; d < out_.world; ++d)
                    for (const auto& s : out_.devices[static_cast<std::size_t>(d)].parameters)
                        if (s.logical == param) reqs.push_back({d, s.region});
            }
            std::vector<tensor_id> locals = materialize(grad, reqs, no_id, true);
            for (std::size_t i = 0; i < reqs.size(); ++i) {
                device_part& part = out_.devices[static_cast<std::size_t>(reqs[i].device)];
                graph& dg = part.builder->mutable_graph();
                tensor_id local = locals[i];
                bool fresh = dg.tensor(local).role == tensor_role::activation &&
                             std::none_of(part.gradients.begin(), part.gradients.end(),
                                          [&](const stored_piece& s) { return s.local == local; });
                if (!fresh) local = assemble(reqs[i].device, grad, reqs[i].region, {{local, reqs[i].region, {}}}, false);
                graph& dg2 = part.builder->mutable_graph();
                tensor_id param_local = no_id;
                for (const auto& s : part.parameters)
                    if (s.logical == param && s.region.contains(reqs[i].region)) param_local = s.local;
                dg2.tensor(local).role = tensor_role::gradient;
                dg2.tensor(local).gradient_of = param_local;
                dg2.tensor(local).name = "grad/" + g_.tensor(param).name + suffix(reqs[i].region, g_.tensor(param).dims);
                if (param_local != no_id) dg2.gradients.emplace_back(param_local, local);
                part.gradients.push_back({param, local, reqs[i].region});
            }
        }
        std::vector<request> reqs;
        for (int d = 0; d < out_.world; ++d) reqs.push_back({d, box{}});
        std::vector<tensor_id> losses = materialize(g_.loss, reqs, no_id, false);
        for (int d = 0; d < out_.world; ++d) {
            device_part& part = out_.devices[static_cast<std::size_t>(d)];
            part.loss = losses[static_cast<std::size_t>(d)];
            part.builder->mutable_graph().loss = part.loss;
        }
    }

private:
    struct request {
        int device;
        box region;
    };
    struct held_piece {
        vtensor v;
        int device;
        tensor_id local;
        bool base;  // one of the pieces its producer wrote (or a stored leaf)
    };

    static std::string suffix(const box& b, const shape& logical) {
        return b == box::whole(logical) ? std::string{} : b.to_string();
    }
    static std::string chunk_suffix(const value_chunk& c) {
        return c.full() ? std::string{} : "{" + std::to_string(c.index) + "/" + std::to_string(c.count) + "}";
    }

    void hold(tensor_id t, vtensor v, int device, tensor_id local, bool base) {
        v.logical = t;
        held_[static_cast<std::size_t>(t)].push_back({std::move(v), device, local, base});
    }

    // Plans are built before the precision is chosen; costs count 4-byte elements (float32
    // values and int32 ids alike), which ranks alternatives the same way as any fixed size.
    static std::int64_t bytes_of(std::int64_t elements) { return elements * 4; }

    // A full-valued piece on `device` holding `region`, cut out if needed.
    std::optional<tensor_id> local(tensor_id t, int device, const box& region) {
        const held_piece* best = nullptr;
        for (const auto& h : held_[static_cast<std::size_t>(t)]) {
            if (h.device != device || !h.v.value.full() || !h.v.region.contains(region)) continue;
            if (h.v.region == region) return h.local;
            if (!best || best->v.region.numel() > h.v.region.numel()) best = &h;
        }
        if (!best) return std::nullopt;
        held_piece source = *best;
        tensor_id cut = assemble(device, t, region, {{source.local, source.v.region, {}}}, false);
        hold(t, {t, region, {}}, device, cut, false);
        return cut;
    }

    struct assemble_input {
        tensor_id local;
        box region;
        value_chunk value;
    };

    tensor_id assemble(int device, tensor_id t, const box& region, const std::vector<assemble_input>& inputs, bool accumulate) {
        graph_builder& b = *out_.devices[static_cast<std::size_t>(device)].builder;
        const tensor_desc& logical = g_.tensor(t);
        std::vector<tensor> ins;
        std::vector<std::int64_t> in_boxes;
        std::int64_t covered = 0;
        for (const auto& in : inputs) {
            ins.push_back(b.handle(in.local));
            auto e = encode_box(in.region);
            in_boxes.insert(in_boxes.end(), e.begin(), e.end());
            covered += intersect(in.region, region).numel();
        }
        const bool zero = accumulate || covered < region.numel();
        attributes attrs{{"out_box", encode_box(region)},
                         {"in_boxes", in_boxes},
                         {"accumulate", std::int64_t{accumulate ? 1 : 0}},
                         {"zero", std::int64_t{zero ? 1 : 0}}};
        auto outs = b.append_unchecked(op_def_of<ops::Assemble>(), ins, {region.shape_of(logical.dims)}, std::move(attrs),
                                       logical.name + suffix(region, logical.dims) + "/assemble", logical.kind);
        b.mutable_graph().nodes.back().backward = emitting_backward_;
        return outs[0].id;
    }

    // Emits one transfer: a node on every member device. Returns each member's output.
    std::vector<tensor_id> emit(transfer tr, const std::vector<tensor_id>& member_inputs) {
        tr.backward = emitting_backward_;
        tr.consumer = emitting_consumer_;
        tr.values = g_.tensor(tr.logical).kind;
        const auto id = static_cast<std::int64_t>(out_.transfers.size());
        std::vector<tensor_id> outs(tr.group.size(), no_id);
        const tensor_desc& logical = g_.tensor(tr.logical);
        for (std::size_t m = 0; m < tr.group.size(); ++m) {
            graph_builder& b = *out_.devices[static_cast<std::size_t>(tr.group[m])].builder;
            std::vector<tensor> ins;
            if (tr.has_input[m]) ins.push_back(b.handle(member_inputs.at(m)));
            std::vector<shape> shapes;
            if (tr.has_output[m]) shapes.push_back(tr.outputs[m].shape_of(logical.dims));
            auto o = b.append_unchecked(op_def_of<ops::Transfer>(), ins, std::move(shapes), {{"transfer", id}},
                                        "transfer/" + std::to_string(id) + "/" + std::string(to_string(tr.kind)) + "/" +
                                            logical.name,
                                        logical.kind);
            b.mutable_graph().nodes.back().backward = emitting_backward_;
            if (tr.has_output[m]) {
                outs[m] = o[0].id;
                hold(tr.logical, {tr.logical, tr.outputs[m], {}}, tr.group[m], outs[m], false);
            }
        }
        out_.transfers.push_back(std::move(tr));
        return outs;
    }

    double cost_of(const transfer& tr) const {
        std::int64_t worst = 0;
        for (std::size_t m = 0; m < tr.group.size(); ++m) worst = std::max(worst, tr.elements_sent_by(m));
        return cost_.cost(bytes_of(worst), tr.steps());
    }
    double generic_cost(const std::vector<request>& reqs) const {
        std::int64_t elements = 0, steps = 0;
        for (const auto& r : reqs) {
            elements += r.region.numel() * 2;  // a conservative guess: each box arrives in pieces from two holders
            ++steps;
        }
        return cost_.cost(bytes_of(elements), steps);
    }

    // ---- strategies ------------------------------------------------------------------

    // Partial sums of one box on distinct devices, each of which needs part of it.
    bool try_partial(tensor_id t, std::vector<std::size_t>& open, const std::vector<request>& reqs) {
        // Copies: emitting appends to held_, which may move its elements.
        std::map<box, std::vector<held_piece>> clusters;
        for (const auto& h : held_[static_cast<std::size_t>(t)])
            if (h.base && !h.v.value.full()) clusters[h.v.region].push_back(h);
        bool emitted = false;
        for (auto& [S, pieces] : clusters) {
            const std::int32_t k = pieces[0].v.value.count;
            // Holders of each chunk, by device. Replicated chunks (a replicated op's partial
            // gradient) give several groups: the r-th holders of every chunk reduce together.
            std::vector<std::vector<const held_piece*>> holders(static_cast<std::size_t>(k));
            for (const held_piece& h : pieces)
                if (h.v.value.count == k) holders[static_cast<std::size_t>(h.v.value.index)].push_back(&h);
            std::size_t replicas = holders[0].size();
            bool regular = replicas > 0;
            for (auto& hs : holders) {
                std::sort(hs.begin(), hs.end(), [](auto* x, auto* y) { return x->device < y->device; });
                regular = regular && hs.size() == replicas;
            }
            if (!regular) continue;
            for (std::size_t r = 0; r < replicas; ++r) {
                std::vector<const held_piece*> by_chunk;
                for (auto& hs : holders) by_chunk.push_back(hs[r]);
                emitted = reduce_group(t, S, by_chunk, open, reqs) || emitted;
            }
            if (emitted) return true;
        }
        return false;
    }

    // One reduction over the holders of chunks 0..k-1 of box S (one chunk each).
    bool reduce_group(tensor_id t, const box& S, const std::vector<const held_piece*>& by_chunk,
                      const std::vector<std::size_t>& open, const std::vector<request>& reqs) {
        {
            std::vector<int> devices;
            for (auto* h : by_chunk) devices.push_back(h->device);
            std::vector<int> sorted = devices;
            std::sort(sorted.begin(), sorted.end());
            if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) return false;
            // One open request per member device, inside S.
            std::map<int, std::size_t> mine;
            bool usable = true;
            for (std::size_t i : open) {
                const request& r = reqs[i];
                if (!std::binary_search(sorted.begin(), sorted.end(), r.device) || !S.contains(r.region)) continue;
                auto [it, inserted] = mine.try_emplace(r.device, i);
                if (!inserted && !(reqs[it->second].region == r.region)) usable = false;
            }
            if (!usable || mine.size() != sorted.size()) return false;
            std::vector<box> wanted;
            bool all_whole = true;
            for (int d : sorted) {
                wanted.push_back(reqs[mine[d]].region);
                all_whole = all_whole && wanted.back() == S;
            }
            std::vector<tensor_id> ins;
            for (int d : sorted)
                for (auto* h : by_chunk)
                    if (h->device == d) ins.push_back(h->local);
            transfer reduce;
            reduce.logical = t;
            reduce.group = sorted;
            reduce.has_input.assign(sorted.size(), true);
            reduce.has_output.assign(sorted.size(), true);
            reduce.inputs.assign(sorted.size(), S);
            reduce.kind = transfer_kind::all_reduce;
            reduce.outputs.assign(sorted.size(), S);
            if (!all_whole && detail::tiling_axis(wanted, S)) {
                transfer scatter = reduce;
                scatter.kind = transfer_kind::reduce_scatter;
                scatter.outputs = wanted;
                if (cost_of(scatter) <= cost_of(reduce)) {
                    emit(std::move(scatter), ins);
                    return true;
                }
            }
            if (!all_whole) {
                std::vector<request> sub;
                for (int d : sorted) sub.push_back(reqs[mine[d]]);
                if (generic_cost(sub) < cost_of(reduce)) return false;
            }
            emit(std::move(reduce), ins);
            return true;
        }
        return false;
    }

    // Full-valued tiles: all_gather into one box, or all_to_all between two tilings.
    bool try_tiles(tensor_id t, std::vector<std::size_t>& open, const std::vector<request>& reqs) {
        // All-gather: devices D all need R and each holds one tile of R.
        std::map<box, std::vector<std::size_t>> by_region;
        for (std::size_t i : open) by_region[reqs[i].region].push_back(i);
        for (auto& [R, idx] : by_region) {
            std::vector<int> devices;
            for (std::size_t i : idx) devices.push_back(reqs[i].device);
            std::sort(devices.begin(), devices.end());
            devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
            if (devices.size() < 2) continue;
            std::vector<box> tiles;
            std::vector<tensor_id> ins;
            for (int d : devices) {
                const held_piece* tile = nullptr;
                for (const auto& h : held_[static_cast<std::size_t>(t)])
                    if (h.device == d && h.v.value.full() && R.contains(h.v.region) && !(h.v.region == R) &&
                        (!tile || tile->v.region.numel() < h.v.region.numel()))
                        tile = &h;
                if (!tile) break;
                tiles.push_back(tile->v.region);
                ins.push_back(tile->local);
            }
            if (tiles.size() != devices.size() || !detail::tiling_axis(tiles, R)) continue;
            transfer gather;
            gather.kind = transfer_kind::all_gather;
            gather.logical = t;
            gather.group = devices;
            gather.inputs = tiles;
            gather.outputs.assign(devices.size(), R);
            gather.has_input.assign(devices.size(), true);
            gather.has_output.assign(devices.size(), true);
            emit(std::move(gather), ins);
            return true;
        }
        // All-to-all: each device of P needs a different tile of S along one axis and
        // holds a tile of S along another.
        std::map<int, std::size_t> one;
        for (std::size_t i : open) one.try_emplace(reqs[i].device, i);
        if (one.size() < 2 || one.size() != open.size()) return false;
        std::vector<int> devices;
        std::vector<box> wanted, tiles;
        std::vector<tensor_id> ins;
        for (auto [d, i] : one) {
            devices.push_back(d);
            wanted.push_back(reqs[i].region);
            const held_piece* tile = nullptr;
            for (const auto& h : held_[static_cast<std::size_t>(t)])
                if (h.device == d && h.base && h.v.value.full()) tile = &h;
            if (!tile) return false;
            tiles.push_back(tile->v.region);
            ins.push_back(tile->local);
        }
        const box S = detail::bounding(wanted);
        auto a = detail::tiling_axis(tiles, S), b = detail::tiling_axis(wanted, S);
        if (!a || !b || *a == *b) return false;
        transfer exchange;
        exchange.kind = transfer_kind::all_to_all;
        exchange.logical = t;
        exchange.group = devices;
        exchange.inputs = tiles;
        exchange.outputs = wanted;
        exchange.has_input.assign(devices.size(), true);
        exchange.has_output.assign(devices.size(), true);
        emit(std::move(exchange), ins);
        return true;
    }

    // Several devices need one box that a single device holds whole.
    bool try_broadcast(tensor_id t, std::vector<std::size_t>& open, const std::vector<request>& reqs) {
        std::map<box, std::vector<int>> by_region;
        for (std::size_t i : open) by_region[reqs[i].region].push_back(reqs[i].device);
        for (auto& [R, devices] : by_region) {
            std::sort(devices.begin(), devices.end());
            devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
            if (devices.size() < 2) continue;
            const held_piece* source = nullptr;
            for (const auto& h : held_[static_cast<std::size_t>(t)])
                if (h.v.value.full() && h.v.region.contains(R) && (!source || h.device < source->device)) source = &h;
            if (!source) continue;
            const int root = source->device;
            tensor_id data = *local(t, root, R);
            transfer cast;
            cast.kind = transfer_kind::broadcast;
            cast.logical = t;
            cast.root = root;
            cast.group = devices;
            cast.group.push_back(root);
            std::sort(cast.group.begin(), cast.group.end());
            std::vector<tensor_id> ins(cast.group.size(), no_id);
            for (std::size_t m = 0; m < cast.group.size(); ++m) {
                const bool is_root = cast.group[m] == root;
                cast.has_input.push_back(is_root);
                cast.has_output.push_back(!is_root);
                cast.inputs.push_back(is_root ? R : box{});
                cast.outputs.push_back(R);
                if (is_root) ins[m] = data;
            }
            emit(std::move(cast), ins);
            return true;
        }
        return false;
    }

    // Point to point from every intersecting piece, then concat and sum on the device.
    tensor_id generic(tensor_id t, const request& r) {
        // Copies: emitting below appends to held_, which may move its elements.
        std::map<vtensor, std::vector<held_piece>> distinct;
        for (const auto& h : held_[static_cast<std::size_t>(t)])
            if (h.base && (r.region.rank() == 0 || !intersect(h.v.region, r.region).empty()))
                distinct[h.v].push_back(h);
        if (distinct.empty())
            throw error("partition: no device holds any part of '" + g_.tensor(t).name + "' " + r.region.to_string() +
                        " needed on device " + std::to_string(r.device));
        std::vector<assemble_input> parts;
        bool accumulate = false;
        for (auto& [v, holders] : distinct) {
            const held_piece* h = &holders[0];
            for (const auto& c : holders)
                if (c.device == r.device) h = &c;
            const box region = r.region.rank() == 0 ? box{} : intersect(v.region, r.region);
            accumulate = accumulate || !v.value.full();
            if (h->device == r.device) {
                parts.push_back({h->local, v.region, v.value});
                continue;
            }
            tensor_id source = h->local;
            if (!(region == v.region)) source = assemble(h->device, t, region, {{h->local, v.region, v.value}}, false);
            transfer p2p;
            p2p.kind = transfer_kind::send_recv;
            p2p.logical = t;
            p2p.group = {h->device, r.device};
            p2p.inputs = {region, box{}};
            p2p.outputs = {box{}, region};
            p2p.has_input = {true, false};
            p2p.has_output = {false, true};
            auto outs = emit(std::move(p2p), {source, no_id});
            held_[static_cast<std::size_t>(t)].back().v.value = v.value;  // what arrived is still partial
            parts.push_back({outs[1], region, v.value});
        }
        if (parts.size() == 1 && parts[0].region == r.region && parts[0].value.full()) return parts[0].local;
        const bool one_box = std::all_of(parts.begin(), parts.end(), [&](const assemble_input& p) { return p.region == r.region; });
        tensor_id whole = no_id;
        if (accumulate && one_box && parts.size() > 2) {
            // Partial sums of one box (a weight's gradient over a pipeline's micro-batches):
            // added one at a time, in the same order as one sum, so that each partial dies
            // as soon as it is added instead of living until the last one is made.
            whole = assemble(r.device, t, r.region, {parts[0], parts[1]}, true);
            for (std::size_t k = 2; k < parts.size(); ++k)
                whole = assemble(r.device, t, r.region, {{whole, r.region, {}}, parts[k]}, true);
        } else {
            whole = assemble(r.device, t, r.region, parts, accumulate);
        }
        hold(t, {t, r.region, {}}, r.device, whole, false);
        return whole;
    }

    std::vector<tensor_id> materialize(tensor_id t, const std::vector<request>& reqs, node_id consumer, bool backward) {
        emitting_backward_ = backward;
        emitting_consumer_ = consumer;
        std::vector<tensor_id> result(reqs.size(), no_id);
        std::vector<std::size_t> open;
        auto resolve_locally = [&] {
            std::vector<std::size_t> still;
            for (std::size_t i : open) {
                if (auto l = local(t, reqs[i].device, reqs[i].region))
                    result[i] = *l;
                else
                    still.push_back(i);
            }
            open = std::move(still);
        };
        for (std::size_t i = 0; i < reqs.size(); ++i) open.push_back(i);
        resolve_locally();
        while (!open.empty() && collectives_allowed(t, consumer)) {
            bool progressed = try_partial(t, open, reqs) || try_tiles(t, open, reqs) || try_broadcast(t, open, reqs);
            if (!progressed) break;
            resolve_locally();
        }
        for (std::size_t i : open) {
            if (auto l = local(t, reqs[i].device, reqs[i].region)) {
                result[i] = *l;
                continue;
            }
            result[i] = generic(t, reqs[i]);
        }
        return result;
    }

    bool collectives_allowed(tensor_id t, node_id consumer) const {
        if (stage_of_node_.empty() || consumer == no_id) return true;
        const node_id producer = g_.tensor(t).producer;
        if (producer == no_id) return true;
        const int from = stage_of_node_.at(static_cast<std::size_t>(producer));
        const int to = stage_of_node_.at(static_cast<std::size_t>(consumer));
        return from < 0 || to < 0 || from == to;
    }

    partitioned_graph& out_;
    const graph& g_;
    transfer_cost_model cost_;
    std::vector<int> stage_of_node_;
    std::vector<std::vector<held_piece>> held_;
    bool emitting_backward_ = false;
    node_id emitting_consumer_ = no_id;
};

}  // namespace loom::partition
// ---- end loom/partition/materialize.hpp ----

namespace loom::partition {

struct apply_options {
    transfer_cost_model cost{};
    // Pipelines: the stage of each forward node of the model (plan::pipeline_plan::stage_of).
    // Tensors that cross stages then move point to point only (see materializer::set_stages).
    std::vector<int> stage_of_forward;
};

inline partitioned_graph apply_plan(const graph& model, const plan::resolved_plan& plan, const apply_options& options = {}) {
    if (plan.devices < 1) throw plan_error("plan: the device count is " + std::to_string(plan.devices) + "; it must be at least 1");
    const std::size_t forward = model.forward_node_count();
    if (plan.forward.size() > forward)
        throw plan_error("plan: it covers " + std::to_string(plan.forward.size()) + " forward nodes but the graph has " +
                         std::to_string(forward) + "; resolve the plan against this graph");

    logical_graph_options lo;
    lo.zero3_identities = plan.zero == plan::zero_stage::parameters;
    lo.zero2_identities = plan.zero == plan::zero_stage::gradients;
    lo.recompute.assign(forward, false);
    lo.decompose.resize(forward);
    std::vector<std::string> notes;
    for (std::size_t i = 0; i < forward; ++i) {
        const auto* p = plan.at(static_cast<node_id>(i));
        if (!p) continue;
        lo.recompute[i] = p->recompute;
        // A cut that a registered transformation makes by rebuilding the op (cross_entropy
        // along its vocabulary): checked against the op as written, then rebuilt.
        const node& n = model.nodes[i];
        plan::op_partition resolved = resolve_partition(n, *p, plan.devices, true, notes);
        if (decomposition_for(n, resolved)) lo.decompose[i] = std::move(resolved);
    }

    partitioned_graph out;
    out.world = plan.devices;
    out.zero = plan.zero;
    out.plan_name = plan.name;
    out.logical = std::make_unique<logical_graph>(build_logical_graph(model, lo));
    out.notes = std::move(notes);
    const graph& g = out.logical->g;

    // 2. Partitions of every node.
    plan::op_partition everywhere;
    everywhere.replicas = plan.devices;
    std::vector<plan::op_partition> parts(g.nodes.size());
    std::vector<bool> assigned(g.nodes.size(), false);
    for (const auto& [n, p] : out.logical->decomposed) {
        parts[static_cast<std::size_t>(n)] = resolve_partition(g.at(n), p, plan.devices, true, out.notes);
        assigned[static_cast<std::size_t>(n)] = true;
    }
    for (std::size_t i = 0; i < forward; ++i) {
        node_id n = out.logical->forward_node[i];
        if (assigned[static_cast<std::size_t>(n)]) continue;
        const plan::op_partition* p = plan.at(static_cast<node_id>(i));
        parts[static_cast<std::size_t>(n)] = resolve_partition(g.at(n), p ? *p : everywhere, plan.devices, true, out.notes);
        assigned[static_cast<std::size_t>(n)] = true;
    }
    // ZeRO identities: split the parameter's first dim over every device.
    auto shard = [&](node_id n) {
        const node& nd = g.at(n);
        const tensor_desc& t = g.tensor(nd.inputs[0]);
        plan::op_partition p;
        if (t.dims.rank() == 0 || t.dims.extent(0) % plan.devices != 0) {
            p.replicas = plan.devices;
            out.notes.push_back("ZeRO: '" + t.name + "' (" + t.dims.to_string() + ") is not divisible into " +
                                std::to_string(plan.devices) + " shards along its first dim; it stays replicated");
        } else {
            p.splits.push_back({t.dims.dim(0), "...0", plan.devices});
        }
        parts[static_cast<std::size_t>(n)] = resolve_partition(nd, p, plan.devices, true, out.notes);
        assigned[static_cast<std::size_t>(n)] = true;
    };
    for (auto [param, n] : out.logical->zero3_identity) shard(n);
    for (auto [param, n] : out.logical->zero2_identity) shard(n);
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
        if (assigned[i]) continue;
        const node& n = g.nodes[i];
        // Mirror the forward op (backward nodes), or the producer of the first input (the
        // seed of the backward pass, zero gradients of unused parameters).
        node_id like = n.forward_of;
        if (like == no_id && !n.inputs.empty()) like = g.tensor(n.inputs[0]).producer;
        const plan::op_partition& source = like != no_id ? parts[static_cast<std::size_t>(like)] : everywhere;
        parts[i] = resolve_partition(n, mirror_partition(source, like == no_id ? nullptr : &g.at(like)),
                                     plan.devices, false, out.notes);
    }

    // 3. Pieces.
    out.layouts.resize(g.nodes.size());
    for (std::size_t i = 0; i < g.nodes.size(); ++i)
        out.layouts[i] = layout_pieces(g, g.nodes[i], std::move(parts[i]));

    // 4-6. Devices, leaves, materialization.
    materializer m(out, options.cost);
    if (!options.stage_of_forward.empty()) {
        const logical_graph& lg = *out.logical;
        std::vector<int> stage(g.nodes.size(), -1);
        for (std::size_t i = 0; i < g.nodes.size(); ++i) {
            const node& n = g.nodes[i];
            const node_id forward = n.forward_of != no_id ? n.forward_of : static_cast<node_id>(i);
            const node_id source = lg.source_of[static_cast<std::size_t>(forward)];
            if (source != no_id && static_cast<std::size_t>(source) < options.stage_of_forward.size())
                stage[i] = options.stage_of_forward[static_cast<std::size_t>(source)];
        }
        m.set_stages(std::move(stage));
    }
    m.store_leaves();
    for (std::size_t i = 0; i < g.nodes.size(); ++i) m.emit_node(static_cast<node_id>(i));
    m.finish();
    return out;
}

}  // namespace loom::partition
// ---- end loom/partition/apply.hpp ----
// ---- begin loom/partition/deadlock.hpp ----
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
inline std::vector<std::vector<int>> transfer_groups(const partitioned_graph& pg) {
    std::vector<std::vector<int>> groups;
    groups.reserve(pg.transfers.size());
    for (const auto& t : pg.transfers) groups.push_back(t.group);
    return groups;
}

namespace detail {

inline std::int64_t transfer_index_of(const node& n, std::size_t transfers, int device) {
    if (n.op == nullptr || !n.attrs.has("transfer")) return -1;
    const auto t = n.attrs.get<std::int64_t>("transfer");
    if (t < 0 || static_cast<std::size_t>(t) >= transfers)
        throw plan_error("check_deadlock_free: node '" + n.name + "' on device " + std::to_string(device) +
                         " names transfer " + std::to_string(t) + " but the plan has " + std::to_string(transfers) +
                         " transfers; the device graph and the transfer list come from different plans");
    return t;
}

}  // namespace detail

// The program of every device: its graph's nodes in `order[d]` (empty `order`: graph order).
inline std::vector<device_program> device_programs(const partitioned_graph& pg,
                                                   const std::vector<std::vector<node_id>>& order = {}) {
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
inline std::vector<wait_edge_handle> shortest_cycle_through(const wait_graph& g, wait_edge_handle closing) {
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

}  // namespace detail

// Throws plan_error("deadlock: ...") when the programs can wait on each other forever:
// a cycle of waits, or a transfer that one of its member devices never reaches.
// point_to_point[t]: transfer t is a buffered send from groups[t][0] to groups[t][1].
inline void check_deadlock_free(const std::vector<device_program>& programs, const std::vector<std::vector<int>>& groups,
                                const std::vector<bool>& point_to_point = {}) {
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

// The device programs of a partitioned graph, each in `order[d]` (empty: graph order).
inline void check_deadlock_free(const partitioned_graph& pg, const std::vector<std::vector<node_id>>& order) {
    std::vector<bool> point_to_point;
    for (const auto& t : pg.transfers) point_to_point.push_back(t.kind == transfer_kind::send_recv);
    check_deadlock_free(device_programs(pg, order), transfer_groups(pg), point_to_point);
}

// In the plan's own op-order (pg.order; graph order where it is empty).
inline void check_deadlock_free(const partitioned_graph& pg) { check_deadlock_free(pg, pg.order); }

}  // namespace loom::partition
// ---- end loom/partition/deadlock.hpp ----
// ---- begin loom/partition/explain.hpp ----
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

// ---- begin loom/runtime/compile.hpp ----
// Turns one device's graph into a program: the nodes that the wanted tensors depend on,
// in graph order (or a given op-order), with every intermediate placed in a shared arena by liveness.
#include <algorithm>
#include <string>
#include <vector>

// ---- begin loom/runtime/memory_planner.hpp ----
// Liveness-based buffer reuse. Each buffer lives from the step that writes it to the last
// step that reads it; buffers whose lifetimes do not overlap may share bytes. Offsets are
// chosen best-fit from a free list, largest buffers placed first in each step so that the
// peak stays close to the true lower bound max_t(sum of live sizes).
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <vector>

namespace loom {

struct buffer_lifetime {
    std::int64_t bytes = 0;
    std::int64_t first = 0;  // step that writes it
    std::int64_t last = 0;   // last step that reads it (>= first)
};

struct memory_plan {
    std::vector<std::int64_t> offsets;  // per request
    std::int64_t peak = 0;              // arena size
    std::int64_t lower_bound = 0;       // max over steps of live bytes: no plan can do better
    std::int64_t unplanned = 0;         // sum of all sizes
};

inline memory_plan plan_memory(const std::vector<buffer_lifetime>& requests, std::int64_t alignment = 64) {
    memory_plan plan;
    plan.offsets.assign(requests.size(), 0);
    auto align = [&](std::int64_t b) { return (b + alignment - 1) / alignment * alignment; };

    std::int64_t steps = 0;
    for (const auto& r : requests) {
        steps = std::max(steps, r.last + 1);
        plan.unplanned += align(r.bytes);
    }
    std::vector<std::vector<std::size_t>> born(static_cast<std::size_t>(steps)), dying(static_cast<std::size_t>(steps));
    for (std::size_t i = 0; i < requests.size(); ++i) {
        born[static_cast<std::size_t>(requests[i].first)].push_back(i);
        dying[static_cast<std::size_t>(requests[i].last)].push_back(i);
    }

    std::map<std::int64_t, std::int64_t> free_blocks;  // offset -> size, coalesced
    std::int64_t top = 0, live = 0;
    auto release = [&](std::int64_t offset, std::int64_t size) {
        auto [it, _] = free_blocks.emplace(offset, size);
        if (auto next = std::next(it); next != free_blocks.end() && it->first + it->second == next->first) {
            it->second += next->second;
            free_blocks.erase(next);
        }
        if (it != free_blocks.begin()) {
            auto prev = std::prev(it);
            if (prev->first + prev->second == it->first) {
                prev->second += it->second;
                free_blocks.erase(it);
                it = prev;
            }
        }
        if (it->first + it->second == top) {  // give the tail back to the top
            top = it->first;
            free_blocks.erase(it);
        }
    };
    for (std::int64_t s = 0; s < steps; ++s) {
        auto& now = born[static_cast<std::size_t>(s)];
        std::sort(now.begin(), now.end(), [&](auto a, auto b) { return requests[a].bytes > requests[b].bytes; });
        for (std::size_t i : now) {
            std::int64_t size = align(requests[i].bytes);
            live += size;
            auto best = free_blocks.end();
            for (auto it = free_blocks.begin(); it != free_blocks.end(); ++it)
                if (it->second >= size && (best == free_blocks.end() || it->second < best->second)) best = it;
            if (best != free_blocks.end()) {
                plan.offsets[i] = best->first;
                std::int64_t rest = best->second - size, at = best->first + size;
                free_blocks.erase(best);
                if (rest > 0) free_blocks.emplace(at, rest);
            } else {
                plan.offsets[i] = top;
                top += size;
            }
            plan.peak = std::max(plan.peak, top);
        }
        plan.lower_bound = std::max(plan.lower_bound, live);
        // Outputs of a step and its inputs coexist during the step; release after it.
        for (std::size_t i : dying[static_cast<std::size_t>(s)]) {
            live -= align(requests[i].bytes);
            release(plan.offsets[i], align(requests[i].bytes));
        }
    }
    return plan;
}

}  // namespace loom
// ---- end loom/runtime/memory_planner.hpp ----
// ---- begin loom/runtime/program.hpp ----
// A per-device instruction program: the form every plan compiles to, and the only thing
// an executor reads. On one device it is the graph's nodes in order; plans (partition/)
// add communication instructions between them.
#include <cstdint>
#include <string>
#include <vector>


namespace loom {

enum class precision : std::uint8_t { f32, f64 };

inline std::size_t real_bytes(precision p) { return p == precision::f32 ? 4 : 8; }
inline std::string_view to_string(precision p) { return p == precision::f32 ? "f32" : "f64"; }

// Where a tensor's bytes live while the program runs.
struct buffer {
    enum class place : std::uint8_t {
        none,   // never materialised by this program
        arena,  // inside the program's arena, at `offset`, reused once dead
        bound,  // caller-owned storage bound before running (inputs, parameters, gradients, outputs)
    };
    place where = place::none;
    std::int64_t offset = 0;
    std::int64_t bytes = 0;
};

struct instruction {
    enum class kind : std::uint8_t { compute };
    kind what = kind::compute;
    node_id node = no_id;
};

struct program {
    const graph* source = nullptr;
    precision prec = precision::f32;
    std::vector<instruction> steps;
    std::vector<buffer> buffers;       // indexed by tensor_id
    std::vector<tensor_id> bound;      // tensors the caller must bind
    std::int64_t arena_bytes = 0;      // peak of the liveness plan
    std::int64_t unplanned_bytes = 0;  // what one buffer per tensor would take

    std::int64_t bytes_of(tensor_id t) const { return buffers.at(static_cast<std::size_t>(t)).bytes; }
};

inline std::int64_t tensor_bytes(const tensor_desc& t, precision p) {
    return t.dims.numel() * static_cast<std::int64_t>(t.kind == value_kind::index ? 4 : real_bytes(p));
}

}  // namespace loom
// ---- end loom/runtime/program.hpp ----

namespace loom {

struct compile_options {
    precision prec = precision::f32;
    bool include_backward = true;       // false: the forward pass only (evaluation)
    std::vector<tensor_id> outputs;     // extra tensors the caller wants to read after a run
    // Keep every node even if no wanted tensor depends on it: a device's part of a
    // partitioned graph sends pieces other devices need.
    bool keep_every_node = false;
    // The order to run the nodes in (op-order: a pipeline schedule's); empty: graph order.
    // Must list every node once and run each after the producers of its inputs.
    std::vector<node_id> order;
};

inline program compile_program(const graph& g, const compile_options& options = {}) {
    program p;
    p.source = &g;
    p.prec = options.prec;
    p.buffers.resize(g.tensors.size());

    // Wanted tensors: the loss, parameter gradients (when training) and explicit outputs.
    std::vector<bool> wanted(g.tensors.size(), false);
    auto want = [&](tensor_id t) {
        if (t < 0 || static_cast<std::size_t>(t) >= g.tensors.size())
            throw usage_error("compile_program: output tensor id " + std::to_string(t) + " is not in the graph");
        wanted[static_cast<std::size_t>(t)] = true;
    };
    if (g.loss != no_id) want(g.loss);
    if (options.include_backward)
        for (auto [param, grad] : g.gradients) want(grad);
    for (tensor_id t : options.outputs) want(t);

    // Keep the nodes some wanted tensor depends on (reverse sweep over a topological order).
    std::vector<bool> needed = wanted;
    std::vector<bool> keep(g.nodes.size(), false);
    for (std::size_t i = g.nodes.size(); i-- > 0;) {
        const node& n = g.nodes[i];
        if (n.backward && !options.include_backward) continue;
        bool any = options.keep_every_node || std::any_of(n.outputs.begin(), n.outputs.end(),
                               [&](tensor_id t) { return needed[static_cast<std::size_t>(t)]; });
        if (!any) continue;
        keep[i] = true;
        for (tensor_id t : n.inputs) needed[static_cast<std::size_t>(t)] = true;
    }
    if (options.order.empty()) {
        for (std::size_t i = 0; i < g.nodes.size(); ++i)
            if (keep[i]) p.steps.push_back({instruction::kind::compute, static_cast<node_id>(i)});
    } else {
        if (options.order.size() != g.nodes.size())
            throw usage_error("compile_program: the node order lists " + std::to_string(options.order.size()) +
                              " nodes but the graph has " + std::to_string(g.nodes.size()) + "; list every node once");
        std::vector<bool> done(g.nodes.size(), false);
        for (node_id id : options.order) {
            if (id < 0 || static_cast<std::size_t>(id) >= g.nodes.size() || done[static_cast<std::size_t>(id)])
                throw usage_error("compile_program: the node order lists node " + std::to_string(id) +
                                  (id >= 0 && static_cast<std::size_t>(id) < g.nodes.size() ? " twice" : ", which is not in the graph") +
                                  "; list every node once");
            const node& n = g.at(id);
            for (tensor_id t : n.inputs) {
                node_id producer = g.tensor(t).producer;
                if (producer != no_id && !done[static_cast<std::size_t>(producer)])
                    throw usage_error("compile_program: the node order runs '" + n.name + "' before '" +
                                      g.at(producer).name + "', which produces its input '" + g.tensor(t).name +
                                      "'; order every node after the producers of its inputs");
            }
            done[static_cast<std::size_t>(id)] = true;
            if (keep[static_cast<std::size_t>(id)]) p.steps.push_back({instruction::kind::compute, id});
        }
    }

    // Bound: everything that outlives a step or is fed from outside.
    for (std::size_t t = 0; t < g.tensors.size(); ++t) {
        const tensor_desc& d = g.tensors[t];
        if (!needed[t]) continue;
        bool external = d.role != tensor_role::activation || wanted[t];
        p.buffers[t].bytes = tensor_bytes(d, p.prec);
        if (external) {
            p.buffers[t].where = buffer::place::bound;
            p.bound.push_back(static_cast<tensor_id>(t));
        } else if (d.producer == no_id) {
            throw usage_error("compile_program: tensor '" + d.name + "' is read but nothing produces it");
        }
    }

    // Lifetimes of arena tensors in step indices.
    std::vector<std::int64_t> first(g.tensors.size(), -1), last(g.tensors.size(), -1);
    for (std::size_t s = 0; s < p.steps.size(); ++s) {
        const node& n = g.at(p.steps[s].node);
        for (tensor_id t : n.outputs) {
            first[static_cast<std::size_t>(t)] = static_cast<std::int64_t>(s);
            last[static_cast<std::size_t>(t)] = std::max<std::int64_t>(last[static_cast<std::size_t>(t)], static_cast<std::int64_t>(s));
        }
        for (tensor_id t : n.inputs) last[static_cast<std::size_t>(t)] = static_cast<std::int64_t>(s);
    }
    std::vector<buffer_lifetime> requests;
    std::vector<tensor_id> owners;
    for (std::size_t t = 0; t < g.tensors.size(); ++t) {
        if (p.buffers[t].where == buffer::place::bound || first[t] < 0) continue;
        p.buffers[t].where = buffer::place::arena;
        p.buffers[t].bytes = tensor_bytes(g.tensors[t], p.prec);
        requests.push_back({p.buffers[t].bytes, first[t], std::max(first[t], last[t])});
        owners.push_back(static_cast<tensor_id>(t));
    }
    memory_plan plan = plan_memory(requests);
    for (std::size_t i = 0; i < owners.size(); ++i) p.buffers[static_cast<std::size_t>(owners[i])].offset = plan.offsets[i];
    p.arena_bytes = plan.peak;
    p.unplanned_bytes = plan.unplanned;
    return p;
}

}  // namespace loom
// ---- end loom/runtime/compile.hpp ----
// ---- begin loom/runtime/explain.hpp ----
// A program described for a person: what runs, how much memory it takes and how much
// arithmetic one run does.
#include <cstdio>
#include <map>
#include <string>


namespace loom {

inline std::string human_bytes(double bytes) {
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

inline double program_flops(const program& p) {
    double total = 0;
    for (const auto& s : p.steps) {
        const node& n = p.source->at(s.node);
        total += n.op->flops(*p.source, n);
    }
    return total;
}

inline std::string explain(const program& p) {
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
// ---- end loom/runtime/explain.hpp ----

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

inline std::vector<device_footprint> device_footprints(const partitioned_graph& pg, precision prec = precision::f32) {
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

namespace detail {

// The scope path with the index of every repeat instance replaced by '*':
// "blocks.3.attn.q" -> "blocks.*.attn.q".
inline std::string folded_scope_path(const graph& g, std::int32_t scope) {
    std::vector<std::string> parts;
    for (std::int32_t s = scope; s != no_id; s = g.scopes.at(static_cast<std::size_t>(s)).parent) {
        const scope_desc& d = g.scopes.at(static_cast<std::size_t>(s));
        parts.push_back(d.index >= 0 ? d.name + ".*" : d.name);
    }
    std::string path;
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) path += (path.empty() ? "" : ".") + *it;
    return path.empty() ? "(top)" : path;
}

// "{0,1,2,3,5}" -> "{0..3,5}": device lists of wide plans stay one short line.
inline std::string fold_device_lists(const std::string& text) {
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

// Rows of cells printed in aligned columns; `right[c]` right-aligns column c (numbers).
inline std::string render_table(const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right,
                                const std::string& indent = "  ") {
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

inline std::string zero_stage_name(plan::zero_stage z) {
    switch (z) {
        case plan::zero_stage::none: return "none";
        case plan::zero_stage::optimizer: return "ZeRO-1 (optimizer state sharded)";
        case plan::zero_stage::gradients: return "ZeRO-2 (gradients sharded)";
        case plan::zero_stage::parameters: return "ZeRO-3 (parameters sharded)";
    }
    return "?";
}

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

inline std::string explain(const partitioned_graph& pg, precision prec = precision::f32) {
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
// ---- end loom/partition/explain.hpp ----
// ---- begin loom/partition/pipeline_order.hpp ----
// op-order for pipelines: a schedule (schedule/) orders the (stage, micro-batch, pass)
// blocks of every device; this turns it into the order each device runs its program in.
//
// Every piece a plan put on a device belongs to one block: its op's stage and round
// (plan/pipeline.hpp), its micro-batch (the piece's coordinate along the outermost,
// micro-batch split) and its pass (a backward op runs in the backward block of the op it
// differentiates). The transfers and assembles the plan inserted between pieces have no
// op of their own; each joins the earliest block on its device that reads what it makes (a
// receive runs where its data is needed, a ZeRO gather before its first reader), else the
// latest block whose output it reads (a send runs right after its data is made, gradient
// sums after the last micro-batch), else the end of the step (the loss gathered to every
// device). Within a block, nodes keep their plan order, so the collectives of a device group
// stay in one order on all its members.
//
// The result is checked: every node runs after the producers of its inputs (else the
// schedule contradicts the program's data flow, and the error names both blocks), and the
// programs together cannot deadlock (partition/deadlock.hpp).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

// ---- begin loom/schedule/schedule.hpp ----
// A pipeline schedule: the order in which every device runs its blocks.
//
//   schedule s = one_f_one_b(2, 4);    // templates.hpp, or written by hand:
//   schedule t{pipeline_shape::linear(2, 4),
//              {{F(s0,m0), F(s0,m1), B(s0,m0), ...}, {F(s1,m0), B(s1,m0), ...}}, "mine"};
//   validate(t);                       // validate.hpp: every block once, dependencies, messages,
//                                      // deadlock, memory
//
// device_order[d] lists what device d runs, first to last; a block of a stage on several
// devices appears in the order of each of them (see shape.hpp).
#include <cstddef>
#include <ostream>
#include <string>
#include <vector>

// ---- begin loom/schedule/block.hpp ----
// One unit of pipeline work: a stage's forward or backward pass on one micro-batch, and the
// error every schedule check throws.
//
//   block{pass_kind::forward, 1, 3}      F(s1,m3)    stage 1, micro-batch 3
//   block{pass_kind::forward, 1, 3, 2}   F2(s1,m3)   the third forward round (3F1B recycling)
//   block{pass_kind::backward, 1, 3}     B(s1,m3)    a backward has no round: it follows the last
//
// Blocks compare member-wise and order by (pass, stage, micro, round), so they can key maps.
// In a pipeline with several forward rounds, to_string(b, rounds) spells round 0 as F0 too.
#include <compare>
#include <cstdint>
#include <ostream>
#include <string>


namespace loom::schedule {

// A pipeline schedule that cannot be built, validated or run as written. A plan_error, so
// callers that catch plan mistakes catch these too.
struct schedule_error : plan_error {
    using plan_error::plan_error;
};

enum class pass_kind : std::uint8_t { forward, backward };

struct block {
    pass_kind pass = pass_kind::forward;
    int stage = 0;
    int micro = 0;
    int round = 0;  // forward: 0 .. rounds-1; backward: 0 (it needs the activations of the last round)

    friend constexpr bool operator==(const block&, const block&) = default;
    friend constexpr auto operator<=>(const block&, const block&) = default;
};

constexpr block forward_block(int stage, int micro, int round = 0) { return {pass_kind::forward, stage, micro, round}; }
constexpr block backward_block(int stage, int micro) { return {pass_kind::backward, stage, micro, 0}; }

constexpr bool is_forward(const block& b) { return b.pass == pass_kind::forward; }
constexpr bool is_backward(const block& b) { return b.pass == pass_kind::backward; }

// "F(s1,m3)", "F2(s1,m3)", "B(s1,m3)". With rounds > 1 every forward names its round ("F0(s1,m3)").
inline std::string to_string(const block& b, int rounds = 1) {
    std::string out = is_forward(b) ? "F" : "B";
    if (b.round != 0 || (is_forward(b) && rounds > 1)) out += std::to_string(b.round);
    out += "(s" + std::to_string(b.stage) + ",m" + std::to_string(b.micro) + ")";
    return out;
}

inline std::ostream& operator<<(std::ostream& os, const block& b) { return os << to_string(b); }

inline std::string to_string(pass_kind p) { return p == pass_kind::forward ? "forward" : "backward"; }

}  // namespace loom::schedule
// ---- end loom/schedule/block.hpp ----
// ---- begin loom/schedule/shape.hpp ----
// The shape of a pipeline: how many stages, micro-batches and forward rounds, which devices
// run each stage, and the data dependencies between blocks that follow from it.
//
//   pipeline_shape::linear(4, 8)           stage s on device s (GPipe, 1F1B)
//   pipeline_shape::linear(4, 8, 3)        three forward rounds per micro-batch (3F1B recycling)
//   pipeline_shape::interleaved(4, 2, 8)   8 virtual stages, stage s on device s % 4
//   pipeline_shape::interlaced(4, 8)       6 stages: the embedding (stage 0) on all 4 devices,
//                                          stages 1..4 on devices 0..3, the LM head (stage 5,
//                                          the same embedding table) on all 4 devices again
//
// A stage on several devices is one SPMD block per micro-batch: it appears in the order of
// each of those devices and starts when all of them reach it (its own collectives, e.g. the
// all-reduce of a tensor-parallel embedding, are inside the block; its output is complete on
// each of its devices when it ends).
//
// Data dependencies, for S stages, R rounds, micro-batch m (every other pair is independent):
//   activation        F(r, s-1, m)  -> F(r, s, m)         s > 0
//   recycle           F(r-1, S-1, m) -> F(r, 0, m)        r > 0 (the output of the last stage
//                                                         feeds the next round's first stage)
//   loss              F(R-1, S-1, m) -> B(S-1, m)
//   gradient          B(s+1, m)     -> B(s, m)           s < S-1
//   saved_activation  F(R-1, s, m)  -> B(s, m)           s < S-1 (the activations it differentiates)
// The interlaced pipeline is a plain chain too: its embedding and LM head are stages 0 and S-1
// that happen to run on the same devices. Tying their weights adds no dependency within a
// batch (both gradients accumulate into one buffer, read after the schedule ends).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>


namespace loom::schedule {

struct pipeline_shape {
    int stages = 1;
    int micro_batches = 1;
    int rounds = 1;
    std::vector<std::vector<int>> stage_devices;  // stage s runs on stage_devices[s]
    int devices = 1;

    // Stage s on device s.
    static pipeline_shape linear(int stages, int micro_batches, int rounds = 1) {
        pipeline_shape p{stages, micro_batches, rounds, {}, stages};
        for (int s = 0; s < stages; ++s) p.stage_devices.push_back({s});
        return p;
    }
    // devices * chunks virtual stages; stage s on device s % devices (interleaved 1F1B).
    static pipeline_shape interleaved(int devices, int chunks, int micro_batches) {
        pipeline_shape p{devices * chunks, micro_batches, 1, {}, devices};
        for (int s = 0; s < devices * chunks; ++s) p.stage_devices.push_back({devices > 0 ? s % devices : 0});
        return p;
    }
    // The interlaced pipeline (nnScaler, Figure 6): pipeline_stages stages of devices_per_stage
    // devices each, between an embedding stage and an LM head stage on every device.
    static pipeline_shape interlaced(int pipeline_stages, int micro_batches, int devices_per_stage = 1) {
        const int devices = pipeline_stages * devices_per_stage;
        pipeline_shape p{pipeline_stages + 2, micro_batches, 1, {}, devices};
        std::vector<int> all;
        for (int d = 0; d < devices; ++d) all.push_back(d);
        p.stage_devices.push_back(all);
        for (int s = 0; s < pipeline_stages; ++s) {
            std::vector<int> group;
            for (int k = 0; k < devices_per_stage; ++k) group.push_back(s * devices_per_stage + k);
            p.stage_devices.push_back(group);
        }
        p.stage_devices.push_back(all);
        return p;
    }

    const std::vector<int>& devices_of(int stage) const { return stage_devices.at(static_cast<std::size_t>(stage)); }
    bool runs_on(int stage, int device) const {
        const auto& g = devices_of(stage);
        return std::find(g.begin(), g.end(), device) != g.end();
    }
    // Stages per device when every device runs the same number (interleaved: its chunks).
    int chunks() const { return devices > 0 ? stages / devices : 0; }
};

// Throws schedule_error naming the first field that makes no pipeline.
inline void check_shape(const pipeline_shape& p, const std::string& where = "pipeline_shape") {
    auto fail = [&](const std::string& why) { throw schedule_error(where + ": " + why); };
    if (p.stages < 1) fail(std::to_string(p.stages) + " stages; a pipeline needs at least one stage");
    if (p.micro_batches < 1)
        fail(std::to_string(p.micro_batches) + " micro-batches; a pipeline needs at least one micro-batch");
    if (p.rounds < 1)
        fail(std::to_string(p.rounds) + " forward rounds; every micro-batch runs at least one forward (rounds = 1)");
    if (p.devices < 1) fail(std::to_string(p.devices) + " devices; a pipeline runs on at least one device");
    if (p.stage_devices.size() != static_cast<std::size_t>(p.stages))
        fail("stage_devices lists " + std::to_string(p.stage_devices.size()) + " stages but stages = " +
             std::to_string(p.stages) + "; give one device list per stage");
    std::vector<bool> used(static_cast<std::size_t>(p.devices), false);
    for (int s = 0; s < p.stages; ++s) {
        const auto& g = p.devices_of(s);
        if (g.empty())
            fail("stage " + std::to_string(s) + " runs on no device; list at least one in stage_devices[" +
                 std::to_string(s) + "]");
        for (std::size_t i = 0; i < g.size(); ++i) {
            if (g[i] < 0 || g[i] >= p.devices)
                fail("stage " + std::to_string(s) + " lists device " + std::to_string(g[i]) + ", outside 0.." +
                     std::to_string(p.devices - 1) + "; use a device below " + std::to_string(p.devices) +
                     " or raise devices");
            const auto end = g.begin() + static_cast<std::ptrdiff_t>(i);
            if (std::find(g.begin(), end, g[i]) != end)
                fail("stage " + std::to_string(s) + " lists device " + std::to_string(g[i]) +
                     " twice; list each device of a stage once");
            used[static_cast<std::size_t>(g[i])] = true;
        }
    }
    for (int d = 0; d < p.devices; ++d)
        if (!used[static_cast<std::size_t>(d)])
            fail("device " + std::to_string(d) + " runs no stage; give it a stage or lower devices to " +
                 std::to_string(p.devices - 1));
}

// ---- blocks of a shape -----------------------------------------------------------------------

// Is b one of the shape's blocks (stage, micro-batch and round in range; a backward has round 0)?
inline bool contains(const pipeline_shape& p, const block& b) {
    if (b.stage < 0 || b.stage >= p.stages || b.micro < 0 || b.micro >= p.micro_batches) return false;
    return is_forward(b) ? b.round >= 0 && b.round < p.rounds : b.round == 0;
}

// Why b is not one of the shape's blocks, or "" when it is.
inline std::string why_not_contained(const pipeline_shape& p, const block& b) {
    const std::string name = to_string(b, p.rounds);
    if (b.stage < 0 || b.stage >= p.stages)
        return name + ": stage " + std::to_string(b.stage) + " is outside 0.." + std::to_string(p.stages - 1);
    if (b.micro < 0 || b.micro >= p.micro_batches)
        return name + ": micro-batch " + std::to_string(b.micro) + " is outside 0.." + std::to_string(p.micro_batches - 1);
    if (is_backward(b) && b.round != 0)
        return name + ": a backward has no round (it follows the last forward round); write round 0";
    if (is_forward(b) && (b.round < 0 || b.round >= p.rounds))
        return name + ": forward round " + std::to_string(b.round) + " is outside 0.." + std::to_string(p.rounds - 1);
    return {};
}

// Dense numbering of the shape's blocks: forwards by (round, stage, micro), then backwards.
inline int block_count(const pipeline_shape& p) { return (p.rounds + 1) * p.stages * p.micro_batches; }

inline int block_index(const pipeline_shape& p, const block& b) {
    const int r = is_forward(b) ? b.round : p.rounds;
    return (r * p.stages + b.stage) * p.micro_batches + b.micro;
}

inline block block_at(const pipeline_shape& p, int index) {
    const int micro = index % p.micro_batches;
    const int stage = (index / p.micro_batches) % p.stages;
    const int r = index / (p.micro_batches * p.stages);
    return r == p.rounds ? backward_block(stage, micro) : forward_block(stage, micro, r);
}

// Every block, in block_index order.
inline std::vector<block> all_blocks(const pipeline_shape& p) {
    std::vector<block> out;
    out.reserve(static_cast<std::size_t>(block_count(p)));
    for (int i = 0; i < block_count(p); ++i) out.push_back(block_at(p, i));
    return out;
}

// The blocks device d runs, in block_index order.
inline std::vector<block> blocks_on(const pipeline_shape& p, int device) {
    std::vector<block> out;
    for (const block& b : all_blocks(p))
        if (p.runs_on(b.stage, device)) out.push_back(b);
    return out;
}

// ---- data dependencies -----------------------------------------------------------------------

enum class dependency_kind : std::uint8_t { activation, recycle, loss, gradient, saved_activation };

inline std::string to_string(dependency_kind k) {
    switch (k) {
        case dependency_kind::activation: return "activation";
        case dependency_kind::recycle: return "recycled output";
        case dependency_kind::loss: return "loss";
        case dependency_kind::gradient: return "gradient";
        case dependency_kind::saved_activation: return "saved activations";
    }
    return "?";
}

struct dependency {
    block producer;
    block consumer;
    dependency_kind kind = dependency_kind::activation;

    friend bool operator==(const dependency&, const dependency&) = default;
};

// What b reads (b must be one of the shape's blocks).
inline std::vector<dependency> inputs_of(const pipeline_shape& p, const block& b) {
    std::vector<dependency> in;
    const int last_stage = p.stages - 1, last_round = p.rounds - 1;
    if (is_forward(b)) {
        if (b.stage > 0)
            in.push_back({forward_block(b.stage - 1, b.micro, b.round), b, dependency_kind::activation});
        else if (b.round > 0)
            in.push_back({forward_block(last_stage, b.micro, b.round - 1), b, dependency_kind::recycle});
    } else if (b.stage == last_stage) {
        in.push_back({forward_block(last_stage, b.micro, last_round), b, dependency_kind::loss});
    } else {
        in.push_back({backward_block(b.stage + 1, b.micro), b, dependency_kind::gradient});
        in.push_back({forward_block(b.stage, b.micro, last_round), b, dependency_kind::saved_activation});
    }
    return in;
}

// Every dependency of the shape, by consumer in block_index order.
inline std::vector<dependency> dependencies(const pipeline_shape& p) {
    std::vector<dependency> out;
    for (const block& b : all_blocks(p))
        for (const dependency& d : inputs_of(p, b)) out.push_back(d);
    return out;
}

// Does this block hold activations until its backward (a forward of the last round)?
inline bool holds_activations(const pipeline_shape& p, const block& b) { return is_forward(b) && b.round == p.rounds - 1; }

}  // namespace loom::schedule
// ---- end loom/schedule/shape.hpp ----

namespace loom::schedule {

struct schedule {
    pipeline_shape shape;
    std::vector<std::vector<block>> device_order;
    std::string name;
};

// "1F1B: 2 stages, 4 micro-batches, 2 devices
//    device 0: F(s0,m0) F(s0,m1) B(s0,m0) F(s0,m2) B(s0,m1) F(s0,m3) B(s0,m2) B(s0,m3)
//    device 1: ..."
inline std::string to_string(const schedule& s) {
    std::string out = (s.name.empty() ? std::string("schedule") : s.name) + ": " + std::to_string(s.shape.stages) +
                      " stages, " + std::to_string(s.shape.micro_batches) + " micro-batches, ";
    if (s.shape.rounds > 1) out += std::to_string(s.shape.rounds) + " forward rounds, ";
    out += std::to_string(s.shape.devices) + " devices";
    for (std::size_t d = 0; d < s.device_order.size(); ++d) {
        out += "\n  device " + std::to_string(d) + ":";
        for (const block& b : s.device_order[d]) out += " " + to_string(b, s.shape.rounds);
    }
    return out;
}

inline std::ostream& operator<<(std::ostream& os, const schedule& s) { return os << to_string(s); }

// position[d][block_index(shape, b)]: where device d runs b, or -1 when it does not. Blocks
// outside the shape are left out (validate reports them).
inline std::vector<std::vector<int>> order_positions(const schedule& s) {
    std::vector<std::vector<int>> position(s.device_order.size(),
                                           std::vector<int>(static_cast<std::size_t>(block_count(s.shape)), -1));
    for (std::size_t d = 0; d < s.device_order.size(); ++d)
        for (std::size_t i = 0; i < s.device_order[d].size(); ++i) {
            const block& b = s.device_order[d][i];
            if (!contains(s.shape, b)) continue;
            int& slot = position[d][static_cast<std::size_t>(block_index(s.shape, b))];
            if (slot < 0) slot = static_cast<int>(i);
        }
    return position;
}

}  // namespace loom::schedule
// ---- end loom/schedule/schedule.hpp ----
// ---- begin loom/schedule/validate.hpp ----
// Is a schedule runnable? validate(s, options) throws schedule_error with the first problem,
// naming the blocks and how to fix it; validation_error(s, options) returns the same message
// ("" when the schedule is valid). The checks, in order:
//
//   1. the shape makes a pipeline (check_shape) and there is one order per device;
//   2. every entry is one of the shape's blocks, on a device that runs its stage, at most once;
//   3. every block is on each device of its stage (an SPMD block on all of them);
//   4. no device runs a block before a block it depends on (same device);
//   5. no deadlock: the graph of "v waits for u" edges (consecutive blocks of one device, and
//      every data dependency) has no cycle; a cycle is reported block by block;
//   6. messages do not cross: on each channel (device a -> device b) the receiving blocks run
//      on b in the order their producers run on a (transfers.hpp), else a receive would take
//      another block's message;
//   7. memory: the activations a device holds (in_flight.hpp) stay within
//        max_in_flight_per_stage   micro-batches per stage, and/or
//        memory_cap_bytes          bytes per device, with activation_bytes[s] the bytes one
//                                  micro-batch of stage s keeps on each of its devices.
// Sends are buffered (they never wait) and receives wait, as in loom's communicators, so a
// send/receive pair adds no wait of the sender on the receiver.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

// ---- begin loom/schedule/cycle.hpp ----
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

inline std::vector<cycle_edge> find_cycle(const std::vector<std::vector<labelled_edge>>& out) {
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
// ---- end loom/schedule/cycle.hpp ----
// ---- begin loom/schedule/in_flight.hpp ----
// Activations in flight: a forward of the last round keeps its activations from its start
// until its backward ends, so walking a device's order counts what it holds at each block.
// Earlier forward rounds (3F1B recycling) keep nothing past their end.
//
//   GPipe      every stage holds all m micro-batches before its first backward
//   1F1B       stage s holds p - s (at most m)
//   interleaved device d holds 2(p - d - 1) + (v - 1)p + 1 chunks' activations (at most v m)
#include <algorithm>
#include <cstddef>
#include <functional>
#include <vector>


namespace loom::schedule {

struct in_flight_peaks {
    std::vector<int> per_stage;   // most micro-batches whose activations one device of stage s holds at once
    std::vector<int> per_device;  // most (stage, micro-batch) activations device d holds at once
};

namespace detail {

// Calls visit(device, position, block, held_per_stage) after each block of each device's
// order, with held_per_stage[s] the micro-batches of stage s that device holds just then
// (a forward counts from its start, so this is the high-water mark of the block).
inline void walk_in_flight(const schedule& s,
                           const std::function<void(int, std::size_t, const block&, const std::vector<int>&)>& visit) {
    for (std::size_t d = 0; d < s.device_order.size(); ++d) {
        std::vector<int> held(static_cast<std::size_t>(std::max(s.shape.stages, 0)), 0);
        for (std::size_t i = 0; i < s.device_order[d].size(); ++i) {
            const block& b = s.device_order[d][i];
            if (b.stage < 0 || b.stage >= s.shape.stages) continue;
            auto& h = held[static_cast<std::size_t>(b.stage)];
            if (holds_activations(s.shape, b)) ++h;
            visit(static_cast<int>(d), i, b, held);
            if (is_backward(b)) h = std::max(h - 1, 0);
        }
    }
}

}  // namespace detail

inline in_flight_peaks peak_in_flight(const schedule& s) {
    in_flight_peaks peaks{std::vector<int>(static_cast<std::size_t>(std::max(s.shape.stages, 0)), 0),
                          std::vector<int>(s.device_order.size(), 0)};
    detail::walk_in_flight(s, [&](int d, std::size_t, const block& b, const std::vector<int>& held) {
        auto& stage_peak = peaks.per_stage[static_cast<std::size_t>(b.stage)];
        stage_peak = std::max(stage_peak, held[static_cast<std::size_t>(b.stage)]);
        int total = 0;
        for (int h : held) total += h;
        auto& device_peak = peaks.per_device[static_cast<std::size_t>(d)];
        device_peak = std::max(device_peak, total);
    });
    return peaks;
}

}  // namespace loom::schedule
// ---- end loom/schedule/in_flight.hpp ----
// ---- begin loom/schedule/transfers.hpp ----
// The messages a pipeline sends: one per dependency and consumer device that does not run the
// producer.
//
// Devices talk over FIFO channels, one per ordered pair (from -> to); a send is buffered and
// never waits (as loom's communicators do), a receive waits for its message. Where a message
// goes in the device programs (program.hpp):
//   send     on `from`, right after the producer (several: by destination, then by the
//            position of the consumer on it);
//   receive  on `to`, right before the consumer (several: by source, then by the position of
//            the producer on it).
// So a channel delivers the messages of its producers in their order on `from`, and `to` must
// run their consumers in that same order; validate() rejects a schedule whose channel would
// deliver a message to the wrong receive ("crossed messages").
//
// Which device sends: the consumer device c receives from the producer's device at c's
// position in the consumer's device list, modulo the producer's list length. A consumer device
// that also runs the producer reads the output locally (an SPMD block's output is complete on
// each of its devices).
//   F(s0,m) on {0} -> F(s1,m) on {1}          one message 0 -> 1
//   F(s4,m) on {3} -> F(s5,m) on {0,1,2,3}    messages 3 -> 0, 3 -> 1, 3 -> 2; device 3 is local
//   F(s0,m) on {0,1,2,3} -> F(s1,m) on {0}    local
#include <cstddef>
#include <string>
#include <vector>


namespace loom::schedule {

struct transfer {
    block producer;
    block consumer;
    int from = 0;
    int to = 0;
    dependency_kind kind = dependency_kind::activation;

    friend bool operator==(const transfer&, const transfer&) = default;
};

// "F(s0,m2) -> F(s1,m2) (activation, device 0 -> device 1)"
inline std::string to_string(const transfer& t, int rounds = 1) {
    return to_string(t.producer, rounds) + " -> " + to_string(t.consumer, rounds) + " (" + to_string(t.kind) +
           ", device " + std::to_string(t.from) + " -> device " + std::to_string(t.to) + ")";
}

// The messages one dependency needs (none when every consumer device runs the producer).
inline std::vector<transfer> transfers_of(const pipeline_shape& p, const dependency& dep) {
    std::vector<transfer> out;
    const auto& from = p.devices_of(dep.producer.stage);
    const auto& to = p.devices_of(dep.consumer.stage);
    for (std::size_t i = 0; i < to.size(); ++i) {
        if (p.runs_on(dep.producer.stage, to[i])) continue;
        out.push_back({dep.producer, dep.consumer, from[i % from.size()], to[i], dep.kind});
    }
    return out;
}

// Every message of the shape, by consumer in block_index order.
inline std::vector<transfer> all_transfers(const pipeline_shape& p) {
    std::vector<transfer> out;
    for (const dependency& d : dependencies(p))
        for (const transfer& t : transfers_of(p, d)) out.push_back(t);
    return out;
}

}  // namespace loom::schedule
// ---- end loom/schedule/transfers.hpp ----

namespace loom::schedule {

struct validation_options {
    int max_in_flight_per_stage = 0;          // 0: no cap
    std::int64_t memory_cap_bytes = 0;        // 0: no cap
    std::vector<std::int64_t> activation_bytes;  // per stage, with memory_cap_bytes
};

namespace detail {

inline std::string devices_text(const std::vector<int>& devices) {
    std::string out = devices.size() == 1 ? "device " : "devices {";
    for (std::size_t i = 0; i < devices.size(); ++i) out += (i ? ", " : "") + std::to_string(devices[i]);
    return devices.size() == 1 ? out : out + "}";
}

inline std::string reads_text(dependency_kind k) {
    switch (k) {
        case dependency_kind::activation: return "its input activation";
        case dependency_kind::recycle: return "the previous round's output (recycling)";
        case dependency_kind::loss: return "the loss of its forward";
        case dependency_kind::gradient: return "its output gradient";
        case dependency_kind::saved_activation: return "its saved activations";
    }
    return "?";
}

class validator {
public:
    validator(const schedule& s, const validation_options& o)
        : s_(s), o_(o), rounds_(s.shape.rounds),
          where_("validate(" + (s.name.empty() ? std::string("schedule") : "'" + s.name + "'") + ")") {}

    void run() {
        check_shape(s_.shape, where_ + ": shape");
        check_entries();
        check_complete();
        position_ = order_positions(s_);
        check_local_dependencies();
        check_deadlock();
        check_channels();
        check_memory();
    }

private:
    const schedule& s_;
    const validation_options& o_;
    int rounds_;
    std::string where_;
    std::vector<std::vector<int>> position_;

    std::string name(const block& b) const { return to_string(b, rounds_); }
    [[noreturn]] void fail(const std::string& why) const { throw schedule_error(where_ + ": " + why); }
    int pos(int device, const block& b) const {
        return position_[static_cast<std::size_t>(device)][static_cast<std::size_t>(block_index(s_.shape, b))];
    }

    void check_entries() const {
        const auto& p = s_.shape;
        if (s_.device_order.size() != static_cast<std::size_t>(p.devices))
            fail("device_order has " + std::to_string(s_.device_order.size()) + " device orders but the shape has " +
                 std::to_string(p.devices) + " devices; give one order per device");
        for (int d = 0; d < p.devices; ++d) {
            const auto& order = s_.device_order[static_cast<std::size_t>(d)];
            std::vector<int> first_at(static_cast<std::size_t>(block_count(p)), -1);
            for (std::size_t i = 0; i < order.size(); ++i) {
                const block& b = order[i];
                if (auto why = why_not_contained(p, b); !why.empty())
                    fail("device " + std::to_string(d) + " runs " + why + "; remove it or fix the block");
                if (!p.runs_on(b.stage, d))
                    fail("device " + std::to_string(d) + " runs " + name(b) + ", but stage " + std::to_string(b.stage) +
                         " runs on " + devices_text(p.devices_of(b.stage)) + "; move " + name(b) +
                         " into the order of " + devices_text(p.devices_of(b.stage)));
                int& first = first_at[static_cast<std::size_t>(block_index(p, b))];
                if (first >= 0)
                    fail("device " + std::to_string(d) + " runs " + name(b) + " twice (positions " + std::to_string(first) +
                         " and " + std::to_string(i) + "); run each block once on each of its devices");
                first = static_cast<int>(i);
            }
        }
    }

    void check_complete() const {
        const auto& p = s_.shape;
        const auto position = order_positions(s_);
        std::string first;
        int missing = 0;
        for (const block& b : all_blocks(p))
            for (int d : p.devices_of(b.stage))
                if (position[static_cast<std::size_t>(d)][static_cast<std::size_t>(block_index(p, b))] < 0) {
                    if (missing++ == 0)
                        first = "device " + std::to_string(d) + " never runs " + name(b) + " (stage " +
                                std::to_string(b.stage) + " runs on " + devices_text(p.devices_of(b.stage)) +
                                "); add it to device " + std::to_string(d) + "'s order";
                }
        if (missing == 1) fail(first);
        if (missing > 1) fail(first + " (" + std::to_string(missing) + " blocks are missing in all; this is the first)");
    }

    void check_local_dependencies() const {
        const auto& p = s_.shape;
        for (const dependency& dep : dependencies(p))
            for (int d : p.devices_of(dep.consumer.stage)) {
                if (!p.runs_on(dep.producer.stage, d)) continue;
                const int pc = pos(d, dep.consumer), pp = pos(d, dep.producer);
                if (pc < pp)
                    fail("device " + std::to_string(d) + " runs " + name(dep.consumer) + " (position " +
                         std::to_string(pc) + ") before " + name(dep.producer) + " (position " + std::to_string(pp) +
                         "), but " + name(dep.consumer) + " needs " + reads_text(dep.kind) + " from " +
                         name(dep.producer) + "; move " + name(dep.producer) + " before " + name(dep.consumer));
            }
    }

    // Labels of wait edges: >= 0 a dependency kind, < 0 "runs after it on device -label-1".
    void check_deadlock() const {
        const auto& p = s_.shape;
        std::vector<std::vector<labelled_edge>> out(static_cast<std::size_t>(block_count(p)));
        for (int d = 0; d < p.devices; ++d) {
            const auto& order = s_.device_order[static_cast<std::size_t>(d)];
            for (std::size_t i = 1; i < order.size(); ++i)
                out[static_cast<std::size_t>(block_index(p, order[i - 1]))].push_back({block_index(p, order[i]), -d - 1});
        }
        for (const dependency& dep : dependencies(p))
            out[static_cast<std::size_t>(block_index(p, dep.producer))].push_back(
                {block_index(p, dep.consumer), static_cast<int>(dep.kind)});
        const auto cycle = find_cycle(out);
        if (cycle.empty()) return;
        std::string text;
        std::string fix;
        for (const auto& e : cycle) {
            const block u = block_at(p, e.from), v = block_at(p, e.to);
            if (!text.empty()) text += "; ";
            if (e.label < 0) {
                const int d = -e.label - 1;
                text += name(v) + " waits for " + name(u) + " (device " + std::to_string(d) + " runs it first)";
                if (fix.empty())
                    fix = "e.g. run " + name(v) + " before " + name(u) + " on device " + std::to_string(d);
            } else {
                text += name(v) + " waits for " + name(u) + " (" + reads_text(static_cast<dependency_kind>(e.label)) + ")";
            }
        }
        fail("deadlock: these blocks wait for each other in a cycle: " + text +
             "; reorder a device so that no block runs before one it waits for (" + fix + ")");
    }

    void check_channels() const {
        const auto& p = s_.shape;
        std::map<std::pair<int, int>, std::vector<transfer>> channels;
        for (const transfer& t : all_transfers(p)) channels[{t.from, t.to}].push_back(t);
        for (auto& [ends, messages] : channels) {
            const auto [from, to] = ends;
            auto send_key = [&, from = from, to = to](const transfer& t) {
                return std::pair{pos(from, t.producer), pos(to, t.consumer)};
            };
            std::sort(messages.begin(), messages.end(),
                      [&](const transfer& a, const transfer& b) { return send_key(a) < send_key(b); });
            for (std::size_t i = 1; i < messages.size(); ++i) {
                const transfer& a = messages[i - 1];
                const transfer& b = messages[i];
                if (pos(to, a.consumer) <= pos(to, b.consumer)) continue;
                fail("crossed messages on channel device " + std::to_string(from) + " -> device " + std::to_string(to) +
                     ": device " + std::to_string(from) + " sends " + name(a.producer) + " -> " + name(a.consumer) +
                     " (" + to_string(a.kind) + ") before " + name(b.producer) + " -> " + name(b.consumer) + " (" +
                     to_string(b.kind) + "), but device " + std::to_string(to) + " runs " + name(b.consumer) +
                     " before " + name(a.consumer) + ", so " + name(b.consumer) + " would receive the message meant for " +
                     name(a.consumer) + "; on device " + std::to_string(to) + " run " + name(a.consumer) + " before " +
                     name(b.consumer) + ", or on device " + std::to_string(from) + " run " + name(b.producer) +
                     " before " + name(a.producer));
            }
        }
    }

    void check_memory() const {
        const auto& p = s_.shape;
        const bool bytes = o_.memory_cap_bytes > 0;
        if (bytes && o_.activation_bytes.size() != static_cast<std::size_t>(p.stages))
            throw usage_error(where_ + ": memory_cap_bytes needs activation_bytes for each of the " +
                              std::to_string(p.stages) + " stages; it has " + std::to_string(o_.activation_bytes.size()));
        if (o_.max_in_flight_per_stage <= 0 && !bytes) return;
        // What a device holds at a block, for messages: "stage 1: m0, m1, m2".
        auto held_list = [&](int d, std::size_t upto, int stage) {
            std::vector<int> held;
            const auto& order = s_.device_order[static_cast<std::size_t>(d)];
            for (std::size_t i = 0; i <= upto; ++i) {
                const block& b = order[i];
                if (b.stage != stage) continue;
                if (holds_activations(p, b)) held.push_back(b.micro);
                if (is_backward(b) && i < upto) std::erase(held, b.micro);
            }
            return held;
        };
        auto earliest_backward = [&](int d, std::size_t at, int stage) {
            const auto held = held_list(d, at, stage);
            return held.empty() ? std::string("a backward") : name(backward_block(stage, held.front()));
        };
        detail::walk_in_flight(s_, [&](int d, std::size_t i, const block& b, const std::vector<int>& held) {
            if (!holds_activations(p, b)) return;
            const int count = held[static_cast<std::size_t>(b.stage)];
            if (o_.max_in_flight_per_stage > 0 && count > o_.max_in_flight_per_stage) {
                std::string micros;
                for (int m : held_list(d, i, b.stage)) micros += (micros.empty() ? "m" : ", m") + std::to_string(m);
                fail("device " + std::to_string(d) + " holds the activations of " + std::to_string(count) +
                     " micro-batches of stage " + std::to_string(b.stage) + " at " + name(b) + " (" + micros +
                     "), over the cap of " + std::to_string(o_.max_in_flight_per_stage) +
                     " (max_in_flight_per_stage); run " + earliest_backward(d, i, b.stage) + " before " + name(b) +
                     ", or raise the cap");
            }
            if (!bytes) return;
            std::int64_t total = 0;
            std::string parts;
            for (int s = 0; s < p.stages; ++s) {
                const int h = held[static_cast<std::size_t>(s)];
                if (h == 0) continue;
                total += h * o_.activation_bytes[static_cast<std::size_t>(s)];
                parts += (parts.empty() ? "" : ", ") + std::string("stage ") + std::to_string(s) + ": " +
                         std::to_string(h) + " x " + std::to_string(o_.activation_bytes[static_cast<std::size_t>(s)]);
            }
            if (total > o_.memory_cap_bytes)
                fail("device " + std::to_string(d) + " holds " + std::to_string(total) + " bytes of activations at " +
                     name(b) + " (" + parts + "), over the cap of " + std::to_string(o_.memory_cap_bytes) +
                     " bytes (memory_cap_bytes); run " + earliest_backward(d, i, b.stage) + " before " + name(b) +
                     ", or raise the cap");
        });
    }
};

}  // namespace detail

inline void validate(const schedule& s, const validation_options& options = {}) {
    detail::validator(s, options).run();
}

// validate's message, or "" when the schedule is valid.
inline std::string validation_error(const schedule& s, const validation_options& options = {}) {
    try {
        validate(s, options);
    } catch (const schedule_error& e) {
        return e.what();
    }
    return {};
}

}  // namespace loom::schedule
// ---- end loom/schedule/validate.hpp ----

namespace loom::partition {

// How to apply a pipeline plan: tensors crossing stages move point to point.
//   auto pg = partition::apply_plan(model, pp.plan, partition::pipeline_apply_options(pp));
inline apply_options pipeline_apply_options(const plan::pipeline_plan& pp) {
    apply_options o;
    o.stage_of_forward = pp.stage_of;
    return o;
}

// The block of a piece of logical node `n`, or none for nodes no forward op accounts for.
inline std::optional<schedule::block> pipeline_block(const partitioned_graph& pg, const plan::pipeline_plan& pp,
                                                     node_id n, std::int32_t piece) {
    const logical_graph& lg = *pg.logical;
    const node& nd = lg.g.at(n);
    const bool backward = nd.backward || nd.forward_of != no_id;
    const node_id forward = nd.forward_of != no_id ? nd.forward_of : n;
    const node_id source = lg.source_of.at(static_cast<std::size_t>(forward));
    if (source == no_id || static_cast<std::size_t>(source) >= pp.stage_of.size()) return std::nullopt;
    const auto src = static_cast<std::size_t>(source);
    schedule::block b;
    b.pass = backward ? schedule::pass_kind::backward : schedule::pass_kind::forward;
    b.stage = pp.stage_of[src];
    b.round = backward ? 0 : pp.round_of[src];
    if (pp.micro_split[src]) {
        // The micro-batch is the outermost coordinate, unless the op lacks the batch (a
        // weight's gradient sum): then its copies per micro-batch were merged into one
        // piece, which runs where its data flow puts it.
        const auto& mine = pg.layouts.at(static_cast<std::size_t>(n)).partition;
        const auto& of_forward = pg.layouts.at(static_cast<std::size_t>(forward)).partition;
        if (mine.pieces() != of_forward.pieces()) return std::nullopt;
        b.micro = static_cast<int>(mine.coordinates(piece).at(0));
    }
    return b;
}

// Orders every device's program by the schedule (pg.order). The schedule must be for the
// plan's stages, micro-batches and rounds, on the plan's devices.
inline void order_by_schedule(partitioned_graph& pg, const plan::pipeline_plan& pp, const schedule::schedule& s) {
    const std::string what = "pipeline order (" + (s.name.empty() ? std::string("schedule") : s.name) + ")";
    if (s.shape.stages != pp.stages || s.shape.micro_batches != pp.micro_batches || s.shape.rounds != pp.rounds)
        throw schedule::schedule_error(what + ": the schedule has " + std::to_string(s.shape.stages) + " stages, " +
                                       std::to_string(s.shape.micro_batches) + " micro-batches and " +
                                       std::to_string(s.shape.rounds) + " rounds, the plan " + std::to_string(pp.stages) +
                                       ", " + std::to_string(pp.micro_batches) + " and " + std::to_string(pp.rounds) +
                                       "; build both for the same pipeline");
    if (static_cast<int>(s.device_order.size()) != pg.world)
        throw schedule::schedule_error(what + ": the schedule orders " + std::to_string(s.device_order.size()) +
                                       " devices but the plan has " + std::to_string(pg.world) +
                                       "; give the schedule's stages the plan's device groups");
    schedule::validate(s);

    constexpr long unset = std::numeric_limits<long>::min();
    pg.order.assign(static_cast<std::size_t>(pg.world), {});
    for (int d = 0; d < pg.world; ++d) {
        const device_part& part = pg.devices[static_cast<std::size_t>(d)];
        const graph& dg = part.ir();
        const std::size_t count = dg.nodes.size();
        std::map<schedule::block, long> position;
        const auto& blocks = s.device_order[static_cast<std::size_t>(d)];
        for (std::size_t k = 0; k < blocks.size(); ++k) position[blocks[k]] = static_cast<long>(k);
        const long end = static_cast<long>(blocks.size());

        std::vector<long> pos(count, unset);
        std::vector<std::optional<schedule::block>> tag(count);
        for (std::size_t i = 0; i < count; ++i) {
            const piece_source src = part.source_of(static_cast<node_id>(i));
            if (src.logical == no_id) continue;
            tag[i] = pipeline_block(pg, pp, src.logical, src.piece);
            if (!tag[i]) continue;
            auto it = position.find(*tag[i]);
            if (it == position.end())
                throw schedule::schedule_error(
                    what + ": the plan puts '" + dg.nodes[i].name + "' (block " + schedule::to_string(*tag[i], pp.rounds) +
                    ") on device " + std::to_string(d) + ", but the schedule does not run that block there; place the stage on the "
                    "devices the schedule gives it");
            pos[i] = it->second;
        }
        // Inserted nodes: the earliest block that reads them, ...
        std::vector<std::vector<std::size_t>> consumers(count);
        for (std::size_t i = 0; i < count; ++i)
            for (tensor_id t : dg.nodes[i].inputs)
                if (node_id p = dg.tensor(t).producer; p != no_id) consumers[static_cast<std::size_t>(p)].push_back(i);
        std::vector<long> by_consumer(pos);
        for (std::size_t i = count; i-- > 0;) {
            if (by_consumer[i] != unset) continue;
            for (std::size_t c : consumers[i])
                if (by_consumer[c] != unset) by_consumer[i] = by_consumer[i] == unset ? by_consumer[c] : std::min(by_consumer[i], by_consumer[c]);
        }
        // ... else the latest block they read from, else the end of the step.
        std::vector<long> placed(count, unset);
        for (std::size_t i = 0; i < count; ++i) {
            if (by_consumer[i] != unset) {
                placed[i] = by_consumer[i];
                continue;
            }
            for (tensor_id t : dg.nodes[i].inputs)
                if (node_id p = dg.tensor(t).producer; p != no_id)
                    placed[i] = std::max(placed[i], placed[static_cast<std::size_t>(p)]);
            if (placed[i] == unset) placed[i] = end;
        }
        // Data flow within the device must agree with the block order.
        auto block_text = [&](std::size_t i) {
            if (tag[i]) return schedule::to_string(*tag[i], pp.rounds);
            return placed[i] == end ? std::string("the end of the step")
                                   : "block " + schedule::to_string(blocks[static_cast<std::size_t>(placed[i])], pp.rounds);
        };
        for (std::size_t i = 0; i < count; ++i)
            for (tensor_id t : dg.nodes[i].inputs) {
                const node_id p = dg.tensor(t).producer;
                if (p == no_id || placed[static_cast<std::size_t>(p)] <= placed[i]) continue;
                throw schedule::schedule_error(what + ": on device " + std::to_string(d) + ", '" + dg.nodes[i].name + "' in " +
                                               block_text(i) + " reads '" + dg.tensor(t).name + "', made by '" +
                                               dg.nodes[static_cast<std::size_t>(p)].name + "' in " +
                                               block_text(static_cast<std::size_t>(p)) +
                                               ", which the schedule runs later; order the blocks so that data flows forward");
            }
        std::vector<node_id> order(count);
        for (std::size_t i = 0; i < count; ++i) order[i] = static_cast<node_id>(i);
        std::stable_sort(order.begin(), order.end(),
                         [&](node_id a, node_id b) { return placed[static_cast<std::size_t>(a)] < placed[static_cast<std::size_t>(b)]; });
        pg.order[static_cast<std::size_t>(d)] = std::move(order);
    }
    check_deadlock_free(pg);
}

// A schedule for stages of one device each, spread over groups of `devices_per_stage`:
// stage s runs on devices [g * k, (g + 1) * k) of its device g, every member in the same
// block order (SPMD within the group).
inline schedule::schedule spread_over_groups(const schedule::schedule& s, int devices_per_stage) {
    if (devices_per_stage == 1) return s;
    schedule::schedule out = s;
    out.shape.devices = s.shape.devices * devices_per_stage;
    out.device_order.clear();
    for (int d = 0; d < s.shape.devices; ++d)
        for (int k = 0; k < devices_per_stage; ++k) out.device_order.push_back(s.device_order.at(static_cast<std::size_t>(d)));
    for (auto& group : out.shape.stage_devices) {
        std::vector<int> spread;
        for (int d : group)
            for (int k = 0; k < devices_per_stage; ++k) spread.push_back(d * devices_per_stage + k);
        group = std::move(spread);
    }
    return out;
}

}  // namespace loom::partition
// ---- end loom/partition/pipeline_order.hpp ----

// op-order: pipeline schedules, their checks, simulation and pictures
// ---- begin loom/schedule/all.hpp ----
// Pipeline schedules (op-order): blocks and shapes, order constraints, the list scheduler,
// the templates (GPipe, 1F1B, interleaved 1F1B, 3F1B, interlaced) and their typed front end,
// validation, device programs, simulation and export. One concept per header:
//
//   block.hpp             block{pass, stage, micro, round}, schedule_error
//   shape.hpp             pipeline_shape, data dependencies
//   schedule.hpp          schedule{shape, device_order, name}
//   transfers.hpp         the messages between devices (FIFO channels)
//   constraints.hpp       before{pattern, pattern}: op-order families with offsets
//   from_constraints.hpp  the list scheduler; schedule_spec
//   checks.hpp            the checks of a template, at compile time and at run time
//   templates.hpp         gpipe, one_f_one_b, interleaved_one_f_one_b, three_f_one_b, interlaced
//   order.hpp             order<OneFOneB<4>>::make(8), well_formed<...>
//   validate.hpp          validate(schedule, validation_options)
//   program.hpp           device_programs(schedule): compute / send / receive steps
//   in_flight.hpp         activations held per stage and device
//   costs.hpp             cost_model
//   simulate.hpp          simulate(schedule, cost_model): timeline, bubble, peaks
//   chrome_trace.hpp      chrome_trace_json(simulation)
//   svg_timeline.hpp      svg_timeline(simulation)
// ---- begin loom/schedule/checks.hpp ----
// The checks of a pipeline template, written once and run at two moments: at compile time by
// the typed front end (order<OneFOneB<4>>, order.hpp: a mistake is a static_assert through
// ill_formed_schedule, and schedule::well_formed reads the same predicate as a bool), and at
// run time by the functions of templates.hpp (one_f_one_b(0, 4) throws schedule_error).
//
//   first_policy_error(view) -> the first mistake, or "" when there is none:
//     a stage count below 1; Virtual < 1 (interleaved); micro-batches below 1, or, for
//     interleaved 1F1B, not a multiple of the pipeline stages (when the count is known);
//     rounds below 1; a constraint that names a round the pipeline does not have, or is
//     ill-formed on its own (constraints.hpp).
//
// Messages start with the template as written and say how to fix it:
//   "order<Interleaved<4, 2>>::make<6>: 6 micro-batches is not a multiple of the 4 pipeline
//    stages; interleaved 1F1B moves micro-batches through each virtual stage in groups of 4;
//    use 4 or 8 micro-batches"
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

// ---- begin loom/schedule/constraints.hpp ----
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
// (order<FromConstraints<4, 3, before{...}>>, order.hpp).
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
inline std::vector<block> device_sequence(const pipeline_shape& p, int d, pass_kind pass, int round, unit_order order) {
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

// The largest |index expression| at index 0. With any non-zero coefficient, an index i with
// |i| > reach + extent puts that expression outside [0, extent), so the window
// [-(reach + extent), reach + extent] holds every member (or_last folds the rest onto it).
inline long long index_reach(const before& c, const affine_values& at0) {
    long long reach = 0;
    for (const affine* a : {&c.first.index, &c.then.index}) {
        const long long v = evaluate(*a, at0);
        reach = std::max(reach, v < 0 ? -v : v);
    }
    return reach;
}

}  // namespace detail

// The block pairs family c orders on shape p, in (stage or device, index) order. Throws
// schedule_error when the constraint is ill-formed for p or a pair shares no device.
inline std::vector<ordered_pair> expand(const before& c, const pipeline_shape& p, std::string_view where = "") {
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
// ---- end loom/schedule/constraints.hpp ----

namespace loom::schedule {

// A schedule mistake found at compile time. The reason is this template's argument; compilers
// print it in the instantiation context and in the note on the failed assertion.
template <plan::detail::message Reason>
struct ill_formed_schedule {
    static_assert(Reason.empty(),
                  "schedule: the pipeline schedule is ill-formed; the reason is the message{...} of ill_formed_schedule "
                  "printed with this error");
};

namespace detail {

enum class policy_kind : std::uint8_t { gpipe, one_f_one_b, interleaved, three_f_one_b, interlaced, from_constraints };

struct policy_view {
    policy_kind kind = policy_kind::one_f_one_b;
    std::string_view spelling;  // how the user wrote it: "order<OneFOneB<4>>", "one_f_one_b(4, 8)"
    int stages = 1;             // pipeline stages (interleaved: devices; interlaced: without embedding and head)
    int chunks = 1;             // interleaved: virtual stages per device
    int rounds = 1;
    bool micro_batches_known = false;
    int micro_batches = 0;
    std::span<const before> constraints{};
};

constexpr text first_policy_error(const policy_view& v) {
    if (v.stages < 1)
        return concat(v.spelling, ": ", v.stages, " pipeline stages; a pipeline needs at least one stage; use 1 or more");
    if (v.kind == policy_kind::interleaved && v.chunks < 1)
        return concat(v.spelling, ": ", v.chunks,
                      " virtual stages per device; each device needs at least one; use 1 or more (1 is plain 1F1B)");
    if (v.rounds < 1)
        return concat(v.spelling, ": ", v.rounds, " forward rounds; every micro-batch runs at least one forward; use 1 or more");
    if (v.micro_batches_known && v.micro_batches < 1)
        return concat(v.spelling, ": ", v.micro_batches, " micro-batches; a pipeline needs at least one micro-batch");
    if (v.kind == policy_kind::interleaved && v.micro_batches_known && v.micro_batches % v.stages != 0) {
        const int below = v.micro_batches / v.stages * v.stages, above = below + v.stages;
        return concat(v.spelling, ": ", v.micro_batches, " micro-batches is not a multiple of the ", v.stages,
                      " pipeline stages; interleaved 1F1B moves micro-batches through each virtual stage in groups of ",
                      v.stages, "; use ", below > 0 ? concat(below, " or ") : text(), above, " micro-batches");
    }
    for (std::size_t i = 0; i < v.constraints.size(); ++i) {
        const text where = concat(v.spelling, ": constraint #", static_cast<int>(i));
        if (text e = first_constraint_error(v.constraints[i], v.rounds, where.view()); !e.empty()) return e;
    }
    return {};
}

}  // namespace detail

}  // namespace loom::schedule
// ---- end loom/schedule/checks.hpp ----
// ---- begin loom/schedule/chrome_trace.hpp ----
// A simulated schedule as a Chrome trace (chrome://tracing, ui.perfetto.dev): the
// "traceEvents" format, one complete event (ph "X") per block and device, one thread per
// device (pid 0, tid = device, named "device d"), times scaled from model units to
// microseconds.
//
//   std::ofstream("1f1b.json") << chrome_trace_json(simulate(one_f_one_b(4, 8)));
//
//   {"traceEvents": [
//      {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "1F1B"}},
//      {"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "device 0"}}, ...
//      {"name": "F(s0,m0)", "cat": "forward", "ph": "X", "ts": 0, "dur": 1000, "pid": 0, "tid": 0,
//       "args": {"stage": 0, "micro": 0, "round": 0}}, ...],
//    "displayTimeUnit": "ms"}
// Block events are listed by device, then start time.
#include <algorithm>
#include <cstddef>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

// ---- begin loom/schedule/simulate.hpp ----
// An event-driven run of a schedule under a cost model: each device runs its order in
// sequence; a block starts when all of its devices have finished what comes before it and
// its inputs have arrived (the producer's end, plus the model's latency when the dependency
// crosses devices).
//
//   simulation r = simulate(one_f_one_b(4, 8), cost_model{.forward = 1, .backward = 2});
//   r.makespan, r.bubble_fraction, r.at(backward_block(0, 7)).end, r.peak_in_flight_per_stage
//
// Quantities, with busy_d the time device d computes and idle_d = makespan - busy_d:
//   bubble_fraction  sum idle_d / (devices * makespan): the share of device time that is
//                    bubble. GPipe and 1F1B with uniform costs: (p - 1) / (m + p - 1).
//   bubble_overhead  sum idle_d / sum busy_d: bubble time per unit of work, Megatron's
//                    "bubble time fraction". 1F1B: (p - 1) / m; interleaved with v chunks
//                    per device (each 1/v of a stage): (p - 1) / (v m).
//   peak in flight   in_flight.hpp, from the orders (the same as from the timeline, since a
//                    device holds activations from a forward's start to its backward's end).
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

// ---- begin loom/schedule/costs.hpp ----
// How long blocks take, for the simulator and the list scheduler.
//
//   cost_model{}                                  every block 1, no latency
//   cost_model{.forward = 1, .backward = 2}       a backward costs two forwards
//   cost_model{.forward_per_stage = {1, 1, 2}}    per-stage times (the stage count must match)
//   cost_model{.latency = 0.5}                    every message adds 0.5 between its blocks
//   cost_model{.duration = [](const block& b) { ... }}   anything else
// Times are in arbitrary units (the Chrome trace scales them; chrome_trace.hpp).
#include <functional>
#include <string>
#include <vector>


namespace loom::schedule {

struct cost_model {
    double forward = 1.0;
    double backward = 1.0;
    std::vector<double> forward_per_stage;   // when not empty: the forward time of each stage
    std::vector<double> backward_per_stage;  // when not empty: the backward time of each stage
    double latency = 0.0;                    // added to every dependency that crosses devices
    std::function<double(const block&)> duration;  // when set: the time of every block

    double of(const block& b) const {
        if (duration) return duration(b);
        const auto& per_stage = is_forward(b) ? forward_per_stage : backward_per_stage;
        if (!per_stage.empty()) {
            if (b.stage < 0 || static_cast<std::size_t>(b.stage) >= per_stage.size())
                throw schedule_error("cost_model: " + std::string(is_forward(b) ? "forward" : "backward") +
                                     "_per_stage has " + std::to_string(per_stage.size()) + " entries but " +
                                     to_string(b) + " is on stage " + std::to_string(b.stage) +
                                     "; give one time per stage");
            return per_stage[static_cast<std::size_t>(b.stage)];
        }
        return is_forward(b) ? forward : backward;
    }
};

}  // namespace loom::schedule
// ---- end loom/schedule/costs.hpp ----

namespace loom::schedule {

struct timed_block {
    block what;
    std::vector<int> devices;
    double start = 0.0;
    double end = 0.0;
};

struct simulation {
    schedule source;
    std::vector<timed_block> blocks;  // in block_index order
    std::vector<double> busy;         // per device
    std::vector<double> idle;         // per device, over [0, makespan]
    double makespan = 0.0;
    double bubble_fraction = 0.0;
    double bubble_overhead = 0.0;
    std::vector<int> peak_in_flight_per_stage;
    std::vector<int> peak_in_flight_per_device;

    const timed_block& at(const block& b) const {
        if (!contains(source.shape, b))
            throw usage_error("simulation::at: " + why_not_contained(source.shape, b));
        return blocks[static_cast<std::size_t>(block_index(source.shape, b))];
    }
    double total_idle() const {
        double sum = 0.0;
        for (double x : idle) sum += x;
        return sum;
    }
    double total_busy() const {
        double sum = 0.0;
        for (double x : busy) sum += x;
        return sum;
    }
};

// Validates the schedule first (throws schedule_error), then plays it.
inline simulation simulate(const schedule& s, const cost_model& costs = {}) {
    validate(s);
    const auto& p = s.shape;
    simulation r;
    r.source = s;
    r.blocks.resize(static_cast<std::size_t>(block_count(p)));
    std::vector<bool> done(r.blocks.size(), false);
    std::vector<std::size_t> next(static_cast<std::size_t>(p.devices), 0);
    std::vector<double> free(static_cast<std::size_t>(p.devices), 0.0);
    r.busy.assign(static_cast<std::size_t>(p.devices), 0.0);
    auto at_head = [&](const block& b) {
        for (int g : p.devices_of(b.stage)) {
            const auto& order = s.device_order[static_cast<std::size_t>(g)];
            const std::size_t i = next[static_cast<std::size_t>(g)];
            if (i >= order.size() || !(order[i] == b)) return false;
        }
        return true;
    };
    for (std::size_t placed = 0; placed < r.blocks.size();) {
        bool progress = false;
        for (int d = 0; d < p.devices; ++d) {
            const auto& order = s.device_order[static_cast<std::size_t>(d)];
            if (next[static_cast<std::size_t>(d)] >= order.size()) continue;
            const block b = order[next[static_cast<std::size_t>(d)]];
            if (!at_head(b)) continue;
            const auto inputs = inputs_of(p, b);
            bool ready = true;
            for (const dependency& dep : inputs)
                ready = ready && done[static_cast<std::size_t>(block_index(p, dep.producer))];
            if (!ready) continue;
            double start = 0.0;
            for (int g : p.devices_of(b.stage)) {
                start = std::max(start, free[static_cast<std::size_t>(g)]);
                for (const dependency& dep : inputs) {
                    const double latency = p.runs_on(dep.producer.stage, g) ? 0.0 : costs.latency;
                    start = std::max(start, r.blocks[static_cast<std::size_t>(block_index(p, dep.producer))].end + latency);
                }
            }
            const double duration = costs.of(b);
            if (!(duration >= 0.0))
                throw usage_error("simulate: the cost model gives " + to_string(b) + " the time " +
                                  std::to_string(duration) + "; times must be zero or more");
            const auto index = static_cast<std::size_t>(block_index(p, b));
            r.blocks[index] = {b, p.devices_of(b.stage), start, start + duration};
            done[index] = true;
            for (int g : p.devices_of(b.stage)) {
                free[static_cast<std::size_t>(g)] = start + duration;
                r.busy[static_cast<std::size_t>(g)] += duration;
                ++next[static_cast<std::size_t>(g)];
            }
            ++placed;
            progress = true;
        }
        if (!progress)
            throw schedule_error("simulate('" + s.name + "'): no device can run its next block; validate() should have "
                                 "reported a deadlock (this is a bug)");
    }
    for (const timed_block& t : r.blocks) r.makespan = std::max(r.makespan, t.end);
    r.idle.resize(r.busy.size());
    for (std::size_t d = 0; d < r.busy.size(); ++d) r.idle[d] = r.makespan - r.busy[d];
    if (r.makespan > 0.0) r.bubble_fraction = r.total_idle() / (p.devices * r.makespan);
    if (r.total_busy() > 0.0) r.bubble_overhead = r.total_idle() / r.total_busy();
    const auto peaks = peak_in_flight(s);
    r.peak_in_flight_per_stage = peaks.per_stage;
    r.peak_in_flight_per_device = peaks.per_device;
    return r;
}

}  // namespace loom::schedule
// ---- end loom/schedule/simulate.hpp ----

namespace loom::schedule {

inline std::string chrome_trace_json(const simulation& r, double microseconds_per_unit = 1000.0) {
    using json = nlohmann::ordered_json;
    const auto& p = r.source.shape;
    json events = json::array();
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"tid", 0},
                      {"args", {{"name", r.source.name.empty() ? std::string("schedule") : r.source.name}}}});
    for (int d = 0; d < p.devices; ++d)
        events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", d},
                          {"args", {{"name", "device " + std::to_string(d)}}}});
    for (int d = 0; d < p.devices; ++d) {
        std::vector<const timed_block*> row;
        for (const block& b : r.source.device_order[static_cast<std::size_t>(d)]) row.push_back(&r.at(b));
        std::stable_sort(row.begin(), row.end(),
                         [](const timed_block* a, const timed_block* b) { return a->start < b->start; });
        for (const timed_block* t : row)
            events.push_back({{"name", to_string(t->what, p.rounds)},
                              {"cat", to_string(t->what.pass)},
                              {"ph", "X"},
                              {"ts", t->start * microseconds_per_unit},
                              {"dur", (t->end - t->start) * microseconds_per_unit},
                              {"pid", 0},
                              {"tid", d},
                              {"args", {{"stage", t->what.stage}, {"micro", t->what.micro}, {"round", t->what.round}}}});
    }
    json trace = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
    return trace.dump();
}

}  // namespace loom::schedule
// ---- end loom/schedule/chrome_trace.hpp ----
// ---- begin loom/schedule/from_constraints.hpp ----
// A schedule from order constraints alone: a deterministic list scheduler.
//
//   schedule s = from_constraints(pipeline_shape::linear(4, 8), {
//       before{forward(micro), forward(micro + 1)},
//       before{backward(micro), backward(micro + 1)},
//       before{forward(micro + stages - stage - 1).or_last(), backward(micro)},
//       before{backward(micro), forward(micro + stages - stage)}}, "my 1F1B");
//
// The scheduler plays the pipeline forward in time under a cost model (uniform by default):
// among the blocks whose data dependencies and constrained predecessors are all placed, it
// places the one that can start earliest on all of its devices; ties go to the block on more
// devices (an SPMD block takes the moment every device is free), then the oldest micro-batch,
// then backward before forward, then the later forward round, then the lower stage.
//
// Messages on one channel (device a -> device b) arrive in the order a sends them, so once a
// has sent for X' and then for X, X' must run before X on b. Before placing a block, the
// scheduler follows what its messages would force down the pipeline and skips the block when
// that contradicts an order already forced; what it returns passes validate() (which it runs).
//
// Constraints that fix each device's order (GPipe, 1F1B, interleaved 1F1B) give exactly that
// order whatever the costs; where they leave freedom (3F1B's warm-up, the interlaced
// pipeline's embedding and head), the costs decide, standing in for nnScaler's temporal-order
// search. The scheduler is greedy: it can report crossed messages for constraints that some
// other order would satisfy.
//
// Throws schedule_error when a constraint is ill-formed, when the constraints and the data
// dependencies order blocks in a cycle (the blocks and the constraints are named), or when
// they leave no way to avoid crossed messages.
#include <algorithm>
#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>


namespace loom::schedule {

// A named shape with its constraints: what the templates (templates.hpp) produce.
struct schedule_spec {
    std::string name;
    pipeline_shape shape;
    std::vector<before> constraints;
};

namespace detail {

class list_scheduler {
public:
    list_scheduler(const pipeline_shape& p, const std::vector<before>& constraints, std::string name,
                   const cost_model& costs)
        : p_(p), constraints_(constraints), name_(std::move(name)), costs_(costs),
          where_(name_.empty() ? std::string("from_constraints") : "from_constraints('" + name_ + "')"),
          n_(static_cast<std::size_t>(block_count(p))), preds_(n_), deps_(n_) {}

    schedule run() {
        check_shape(p_, where_ + ": shape");
        collect_edges();
        check_acyclic();
        std::map<std::pair<int, int>, std::size_t> channel_ids;
        for (const transfer& t : all_transfers(p_)) {
            const auto [it, added] = channel_ids.try_emplace({t.from, t.to}, channels_.size());
            if (added) channels_.emplace_back();
            channels_[it->second].push_back(messages_.size());
            channel_of_.push_back(it->second);
            messages_.push_back(t);
        }
        place_all();
        schedule s{p_, order_, name_};
        validate(s);
        return s;
    }

private:
    const pipeline_shape& p_;
    const std::vector<before>& constraints_;
    std::string name_;
    const cost_model& costs_;
    std::string where_;
    std::size_t n_;
    std::vector<std::vector<std::pair<std::size_t, int>>> preds_;  // (block, constraint #) placed before
    std::vector<std::vector<dependency>> deps_;
    std::vector<transfer> messages_;
    std::vector<std::size_t> channel_of_;                // message id -> channel id
    std::vector<std::vector<std::size_t>> channels_;     // channel id -> its message ids
    std::vector<std::vector<block>> order_;
    std::vector<bool> placed_;
    std::vector<std::vector<std::size_t>> fifo_preds_;  // blocks that must run first because of message order
    std::vector<std::vector<std::size_t>> sent_;        // channel id -> message ids sent so far, in order
    std::vector<std::vector<std::size_t>> out_of_;      // message ids each block sends

    std::size_t index(const block& b) const { return static_cast<std::size_t>(block_index(p_, b)); }
    std::string name(const block& b) const { return to_string(b, p_.rounds); }

    void collect_edges() {
        for (std::size_t c = 0; c < constraints_.size(); ++c) {
            const std::string at = where_ + ": constraint #" + std::to_string(c);
            for (const ordered_pair& q : expand(constraints_[c], p_, at))
                preds_[index(q.then)].push_back({index(q.first), static_cast<int>(c)});
        }
        for (const dependency& d : dependencies(p_)) deps_[index(d.consumer)].push_back(d);
    }

    // Edge labels: >= 0 a dependency kind, < 0 constraint #(-label - 1).
    void check_acyclic() const {
        std::vector<std::vector<labelled_edge>> out(n_);
        for (std::size_t v = 0; v < n_; ++v) {
            for (const auto& [u, c] : preds_[v]) out[u].push_back({static_cast<int>(v), -c - 1});
            for (const dependency& d : deps_[v])
                out[index(d.producer)].push_back({static_cast<int>(v), static_cast<int>(d.kind)});
        }
        const auto cycle = find_cycle(out);
        if (cycle.empty()) return;
        std::string text;
        for (const auto& e : cycle) {
            const block u = block_at(p_, e.from), v = block_at(p_, e.to);
            if (!text.empty()) text += "; ";
            if (e.label < 0) {
                const auto c = static_cast<std::size_t>(-e.label - 1);
                text += name(u) + " before " + name(v) + " by constraint #" + std::to_string(c) + " " +
                        to_string(constraints_[c]);
            } else {
                text += name(v) + " needs " + name(u) + " (" + reads_text(static_cast<dependency_kind>(e.label)) + ")";
            }
        }
        throw schedule_error(where_ + ": the constraints cannot all hold; with the data dependencies they order "
                                      "these blocks in a cycle: " + text + "; drop or change one of the constraints named");
    }

    // Placing blocks in time order. Messages add order too: once P' has sent to X' on a
    // channel, a later message to X on it makes X' a predecessor of X (fifo_preds_). A block
    // is placed only if that cannot contradict what is already forced: a producer P sending
    // to X goes first only if no consumer X'' of a producer still to come on the channel
    // must run before X (fifo_conflict).
    void place_all() {
        const int devices = p_.devices;
        order_.assign(static_cast<std::size_t>(devices), {});
        std::vector<double> free(static_cast<std::size_t>(devices), 0.0), finish(n_, 0.0);
        placed_.assign(n_, false);
        fifo_preds_.assign(n_, {});
        sent_.assign(channels_.size(), {});
        out_of_.assign(n_, {});
        for (std::size_t id = 0; id < messages_.size(); ++id) out_of_[index(messages_[id].producer)].push_back(id);
        const auto blocks = all_blocks(p_);
        using key = std::tuple<double, int, int, int, int, int, std::size_t>;
        for (std::size_t count = 0; count < n_; ++count) {
            std::vector<key> candidates;
            for (std::size_t x = 0; x < n_; ++x) {
                if (placed_[x] || !predecessors_placed(x)) continue;
                const block& b = blocks[x];
                double start = 0.0;
                for (int g : p_.devices_of(b.stage)) {
                    start = std::max(start, free[static_cast<std::size_t>(g)]);
                    for (const dependency& d : deps_[x]) {
                        const double latency = p_.runs_on(d.producer.stage, g) ? 0.0 : costs_.latency;
                        start = std::max(start, finish[index(d.producer)] + latency);
                    }
                }
                const int spmd_first = -static_cast<int>(p_.devices_of(b.stage).size());
                candidates.push_back({start, spmd_first, b.micro, is_backward(b) ? 0 : 1, -b.round, b.stage, x});
            }
            std::sort(candidates.begin(), candidates.end());
            std::size_t best = n_;
            double start = 0.0;
            std::size_t first_blocked = n_;
            std::pair<std::size_t, std::size_t> first_conflict{n_, n_};
            for (const key& k : candidates) {
                const std::size_t x = std::get<6>(k);
                if (auto conflict = fifo_conflict(x); conflict.first < n_) {
                    if (first_blocked == n_) first_blocked = x, first_conflict = conflict;
                    continue;
                }
                best = x;
                start = std::get<0>(k);
                break;
            }
            if (best == n_) stall(first_blocked, first_conflict);
            place(best, blocks[best], start, finish, free);
        }
    }

    bool predecessors_placed(std::size_t x) const {
        for (const auto& [u, c] : preds_[x])
            if (!placed_[u]) return false;
        for (const dependency& d : deps_[x])
            if (!placed_[index(d.producer)]) return false;
        for (std::size_t u : fifo_preds_[x])
            if (!placed_[u]) return false;
        return true;
    }

    // The unplaced blocks that must run before x (constraints, dependencies, FIFO order), x included.
    std::vector<bool> forced_before(std::size_t x) const {
        std::vector<bool> seen(n_, false);
        std::vector<std::size_t> stack{x};
        seen[x] = true;
        auto visit = [&](std::size_t u) {
            if (placed_[u] || seen[u]) return;
            seen[u] = true;
            stack.push_back(u);
        };
        while (!stack.empty()) {
            const std::size_t v = stack.back();
            stack.pop_back();
            for (const auto& [u, c] : preds_[v]) visit(u);
            for (const dependency& d : deps_[v]) visit(index(d.producer));
            for (std::size_t u : fifo_preds_[v]) visit(u);
        }
        return seen;
    }

    // Placing producer x now sends its messages before those of every producer still to come
    // on the same channels, so their consumers must run in that order too, and so must the
    // consumers of those consumers' messages, down the pipeline. Returns the first implied
    // pair (must-run-first, must-run-second) that contradicts an order already forced, or
    // (n_, n_) when there is none.
    std::pair<std::size_t, std::size_t> fifo_conflict(std::size_t x) const {
        std::vector<std::pair<std::size_t, std::size_t>> implied;
        for (std::size_t mine : out_of_[x]) {
            const std::size_t consumer = index(messages_[mine].consumer);
            for (std::size_t theirs : channels_[channel_of_[mine]]) {
                const transfer& t = messages_[theirs];
                if (placed_[index(t.producer)] || index(t.producer) == x || index(t.consumer) == consumer) continue;
                implied.push_back({consumer, index(t.consumer)});
            }
        }
        std::set<std::pair<std::size_t, std::size_t>> seen(implied.begin(), implied.end());
        std::map<std::size_t, std::vector<bool>> forced;  // block -> the unplaced blocks forced before it
        for (std::size_t i = 0; i < implied.size(); ++i) {
            const auto [first, second] = implied[i];
            auto it = forced.find(first);
            if (it == forced.end()) it = forced.emplace(first, forced_before(first)).first;
            if (it->second[second]) return {first, second};
            for (std::size_t a : out_of_[first])
                for (std::size_t z : out_of_[second]) {
                    if (channel_of_[a] != channel_of_[z]) continue;
                    const std::pair next{index(messages_[a].consumer), index(messages_[z].consumer)};
                    if (next.first != next.second && seen.insert(next).second) implied.push_back(next);
                }
        }
        return {n_, n_};
    }

    void place(std::size_t x, const block& b, double start, std::vector<double>& finish, std::vector<double>& free) {
        finish[x] = start + costs_.of(b);
        placed_[x] = true;
        for (int g : p_.devices_of(b.stage)) {
            order_[static_cast<std::size_t>(g)].push_back(b);
            free[static_cast<std::size_t>(g)] = finish[x];
        }
        for (std::size_t mine : out_of_[x]) {
            const std::size_t consumer = index(messages_[mine].consumer);
            auto& sent = sent_[channel_of_[mine]];
            for (std::size_t earlier : sent) {
                const std::size_t their_consumer = index(messages_[earlier].consumer);
                if (!placed_[their_consumer] && their_consumer != consumer) fifo_preds_[consumer].push_back(their_consumer);
            }
            sent.push_back(mine);
        }
    }

    [[noreturn]] void stall(std::size_t blocked, std::pair<std::size_t, std::size_t> conflict) const {
        if (blocked >= n_)
            throw schedule_error(where_ + ": no block can run next; the constraints leave no order (this is a bug if "
                                          "no cycle was reported)");
        const block x = block_at(p_, static_cast<int>(blocked));
        const block first = block_at(p_, static_cast<int>(conflict.first));
        const block second = block_at(p_, static_cast<int>(conflict.second));
        throw schedule_error(where_ + ": the constraints force crossed messages: every block that can run next, such as " +
                             name(x) + ", sends a message that would make " + name(first) + " run before " +
                             name(second) + " (messages on one channel arrive in the order they are sent), but " +
                             name(second) + " must run before " + name(first) +
                             "; loosen the constraints that order these blocks");
    }

    static std::string reads_text(dependency_kind k) { return detail::reads_text(k); }
};

}  // namespace detail

inline schedule from_constraints(const pipeline_shape& shape, const std::vector<before>& constraints,
                                 std::string name = "", const cost_model& costs = {}) {
    return detail::list_scheduler(shape, constraints, std::move(name), costs).run();
}

inline schedule from_constraints(const schedule_spec& spec, const cost_model& costs = {}) {
    return from_constraints(spec.shape, spec.constraints, spec.name, costs);
}

}  // namespace loom::schedule
// ---- end loom/schedule/from_constraints.hpp ----
// ---- begin loom/schedule/order.hpp ----
// The typed front end: a pipeline template as a type, checked when it is compiled.
//
//   schedule a = order<OneFOneB<4>>::make(8);            // micro-batches known at run time
//   schedule b = order<Interleaved<4, 2>>::make<8>();    // ... or at compile time
//   schedule c = order<ThreeFOneB<4>>::make(8);
//   schedule d = order<Interlaced<4>>::make(8);           // 4 pipeline stages + embedding and head
//   schedule e = order<GPipe<2>>::make(4, cost_model{.forward = 1, .backward = 2});
//
//   using namespace loom::schedule::var;
//   constexpr before f0_first{forward(micro + 1, 0), forward(micro, 1)};
//   schedule g = order<FromConstraints<4, 2, f0_first>>::make(8);   // 4 stages, 2 rounds
//
// Every mistake decidable at compile time is a static_assert whose message names the
// template and the fix (checks.hpp, e.g. "order<OneFOneB<0>>: 0 pipeline stages; a pipeline
// needs at least one stage; use 1 or more"); make(m) runs the same predicate on m and throws
// schedule_error. schedule::well_formed<Policy[, MicroBatches]> answers the same question as a
// bool, without a hard error (MicroBatches = 0: the count is not given).
#include <array>
#include <optional>
#include <string>
#include <span>
#include <string_view>

// ---- begin loom/schedule/templates.hpp ----
// The classic pipeline schedules, each written as order constraints (nnScaler's op-order with
// offsets) and built by the list scheduler (from_constraints.hpp). With S stages, stage s,
// m micro-batches, p devices, v virtual stages per device, w the warm-up forwards of a stage
// or device:
//
//   gpipe(S, m)        every forward before any backward, both in micro-batch order
//   one_f_one_b(S, m)  Table 4: forwards and backwards in micro-batch order, and
//                        F(s, i + w) before B(s, i), B(s, i) before F(s, i + w + 1), w = S - s - 1
//                      (the paper's ofst = |D| - i with stages counted from 1)
//   interleaved_one_f_one_b(p, v, m)
//                      the same four constraints per device over its blocks in Megatron's
//                      order (p micro-batches through one chunk at a time, chunks ascending for
//                      forwards and descending for backwards), w = 2(p - d - 1) + (v - 1) p
//                      (w = p - d - 1 when v = 1: plain 1F1B); m must be a multiple of p
//   three_f_one_b(S, m)
//                      Table 7 (AlphaFold2's recycling: three forward rounds, one backward):
//                        F0(s, i+2) before F1(s, i+1), F1(s, i+1) before F2(s, i) (for every
//                        i >= 0; the paper writes i > 0 for the second, i = 0 changes nothing),
//                        F2(s, i + w) before B(s, i), w = S - s - 1,
//                      plus each round's forwards and the backwards in micro-batch order and
//                        B(s, i) before F0(s, i + w + 3)
//                      which closes the steady state (F0, F1, F2, B of four micro-batches);
//                      the warm-up and cool-down are left to the scheduler, as in the paper.
//                      The rounds of one micro-batch start 4f + b apart on a stage (one cycle
//                      and a forward), so the steady state has no bubble while the recycling
//                      trip through all stages fits: S f <= 4f + b (S <= 5 when b = f, S <= 6
//                      when b = 2f); deeper pipelines idle in every cycle
//   interlaced(p, m)   Figure 6: the embedding (stage 0) and the LM head (stage p + 1) on
//                      every device, the p stages between as 1F1B (w = p - k for stage k);
//                      the embedding forward of micro-batch i + 1 waits for the first stage's
//                      forward of i, and the rest of the time sharing is the scheduler's
//                      (ties go to the SPMD blocks, so with f = b they run when every device
//                      is free and the steady state has no bubble; with b != f the greedy
//                      leaves some per micro-batch, which a search could remove)
//
// Each has a *_constraints() (the family, independent of sizes), a *_spec(...) (shape and
// constraints: what the executor needs to rebuild it) and a builder returning the schedule.
// The builders check their arguments with the predicates of checks.hpp, as the typed front
// end (order.hpp) does at compile time.
#include <initializer_list>
#include <string>
#include <vector>


namespace loom::schedule {

// Per stage: each round's forwards in micro-batch order, and the backwards too (Table 4 (1), (2)).
inline std::vector<before> micro_order_constraints(int rounds = 1) {
    using namespace var;
    std::vector<before> c;
    for (int r = 0; r < rounds; ++r) c.push_back(before{forward(micro, r), forward(micro + 1, r)});
    c.push_back(before{backward(micro), backward(micro + 1)});
    return c;
}

inline std::vector<before> gpipe_constraints() {
    using namespace var;
    auto c = micro_order_constraints();
    // the last forward before the first backward
    c.push_back(before{forward(micro + micro_batches - 1), backward(micro)});
    return c;
}

inline std::vector<before> one_f_one_b_constraints() {
    using namespace var;
    auto c = micro_order_constraints();
    c.push_back(before{forward(micro + stages - stage - 1).or_last(), backward(micro)});  // (3), ofst = S - s - 1
    c.push_back(before{backward(micro), forward(micro + stages - stage)});                // (4), ofst + 1
    return c;
}

// Per device d over its blocks in by_micro_group order; `chunks` is v.
inline std::vector<before> interleaved_constraints(int chunks) {
    using namespace var;
    // w = 2(p - d - 1) + (v - 1) p = stages + devices - 2 device - 2 (v > 1); p - d - 1 (v = 1)
    const affine warmup = chunks > 1 ? stages + devices - 2 * device - 2 : devices - device - 1;
    constexpr condition always{};
    constexpr auto grouped = unit_order::by_micro_group;
    return {
        before{forward(position), forward(position + 1), each_device, always, grouped},
        before{backward(position), backward(position + 1), each_device, always, grouped},
        before{forward(position + warmup).or_last(), backward(position), each_device, always, grouped},
        before{backward(position), forward(position + warmup + 1), each_device, always, grouped},
    };
}

// Table 7, for `rounds` forward rounds (3F1B: 3).
inline std::vector<before> recycling_constraints(int rounds = 3) {
    using namespace var;
    auto c = micro_order_constraints(rounds);
    for (int r = 0; r + 1 < rounds; ++r) c.push_back(before{forward(micro + 1, r), forward(micro, r + 1)});  // (1), (2)
    c.push_back(before{forward(micro + stages - stage - 1, rounds - 1).or_last(), backward(micro)});        // (3)
    c.push_back(before{backward(micro), forward(micro + stages - stage + rounds - 1, 0)});                  // next cycle
    return c;
}

// Stages 0 (embedding) and S-1 (LM head) on every device; stages 1..S-2 a 1F1B pipeline.
inline std::vector<before> interlaced_constraints() {
    using namespace var;
    auto c = micro_order_constraints();
    const condition pipeline_stages = within(stage, 1, stages - 2);
    // stage k of the p = S - 2 pipeline stages runs w = p - k forwards ahead
    c.push_back(before{forward(micro + stages - stage - 2).or_last(), backward(micro), each_stage, pipeline_stages});
    c.push_back(before{backward(micro), forward(micro + stages - stage - 1), each_stage, pipeline_stages});
    // the embedding runs one micro-batch ahead of the first pipeline stage
    c.push_back(before{forward(micro).on_stage(1), forward(micro + 1), each_stage, within(stage, 0, 0)});
    return c;
}

// ---- specs and builders ----------------------------------------------------------------------

namespace detail {

inline void check_policy(policy_kind kind, const std::string& spelling, int stages, int chunks, int micro_batches,
                         int rounds = 1) {
    const policy_view v{kind, spelling, stages, chunks, rounds, true, micro_batches, {}};
    if (text e = first_policy_error(v); !e.empty()) throw schedule_error(e.str());
}

inline std::string call_text(const char* function, std::initializer_list<int> args) {
    std::string out = std::string(function) + "(";
    bool first = true;
    for (int a : args) out += (first ? "" : ", ") + std::to_string(a), first = false;
    return out + ")";
}

}  // namespace detail

inline schedule_spec gpipe_spec(int stages, int micro_batches) {
    detail::check_policy(detail::policy_kind::gpipe, detail::call_text("gpipe", {stages, micro_batches}), stages, 1,
                         micro_batches);
    return {"GPipe", pipeline_shape::linear(stages, micro_batches), gpipe_constraints()};
}

inline schedule_spec one_f_one_b_spec(int stages, int micro_batches) {
    detail::check_policy(detail::policy_kind::one_f_one_b, detail::call_text("one_f_one_b", {stages, micro_batches}),
                         stages, 1, micro_batches);
    return {"1F1B", pipeline_shape::linear(stages, micro_batches), one_f_one_b_constraints()};
}

inline schedule_spec interleaved_spec(int devices, int chunks, int micro_batches) {
    detail::check_policy(detail::policy_kind::interleaved,
                         detail::call_text("interleaved_one_f_one_b", {devices, chunks, micro_batches}), devices, chunks,
                         micro_batches);
    return {"interleaved 1F1B (" + std::to_string(chunks) + " virtual stages per device)",
            pipeline_shape::interleaved(devices, chunks, micro_batches), interleaved_constraints(chunks)};
}

inline schedule_spec three_f_one_b_spec(int stages, int micro_batches) {
    detail::check_policy(detail::policy_kind::three_f_one_b, detail::call_text("three_f_one_b", {stages, micro_batches}),
                         stages, 1, micro_batches, 3);
    return {"3F1B", pipeline_shape::linear(stages, micro_batches, 3), recycling_constraints(3)};
}

inline schedule_spec interlaced_spec(int pipeline_stages, int micro_batches, int devices_per_stage = 1) {
    const std::string call = detail::call_text("interlaced", {pipeline_stages, micro_batches, devices_per_stage});
    detail::check_policy(detail::policy_kind::interlaced, call, pipeline_stages, 1, micro_batches);
    if (devices_per_stage < 1)
        throw schedule_error(call + ": " + std::to_string(devices_per_stage) +
                             " devices per stage; each pipeline stage needs at least one device");
    return {"interlaced", pipeline_shape::interlaced(pipeline_stages, micro_batches, devices_per_stage),
            interlaced_constraints()};
}

inline schedule gpipe(int stages, int micro_batches, const cost_model& costs = {}) {
    return from_constraints(gpipe_spec(stages, micro_batches), costs);
}
inline schedule one_f_one_b(int stages, int micro_batches, const cost_model& costs = {}) {
    return from_constraints(one_f_one_b_spec(stages, micro_batches), costs);
}
inline schedule interleaved_one_f_one_b(int devices, int chunks, int micro_batches, const cost_model& costs = {}) {
    return from_constraints(interleaved_spec(devices, chunks, micro_batches), costs);
}
inline schedule three_f_one_b(int stages, int micro_batches, const cost_model& costs = {}) {
    return from_constraints(three_f_one_b_spec(stages, micro_batches), costs);
}
inline schedule interlaced(int pipeline_stages, int micro_batches, int devices_per_stage = 1,
                           const cost_model& costs = {}) {
    return from_constraints(interlaced_spec(pipeline_stages, micro_batches, devices_per_stage), costs);
}

}  // namespace loom::schedule
// ---- end loom/schedule/templates.hpp ----

namespace loom::schedule {

namespace detail {

using plan::detail::static_text;

// What every policy type provides: kind, stages, chunks, rounds, its spelling, its
// constraints (user ones; templates keep theirs in templates.hpp) and spec(micro_batches).
template <class Policy>
constexpr policy_view policy_view_of(std::string_view spelling, std::optional<int> micro_batches = std::nullopt) {
    return {Policy::kind,
            spelling,
            Policy::stages,
            Policy::chunks,
            Policy::rounds,
            micro_batches.has_value(),
            micro_batches.value_or(0),
            std::span<const before>(Policy::constraints)};
}

inline constexpr std::array<before, 0> no_constraints{};

}  // namespace detail

template <int Stages>
struct GPipe {
    static constexpr detail::policy_kind kind = detail::policy_kind::gpipe;
    static constexpr int stages = Stages, chunks = 1, rounds = 1;
    static constexpr detail::static_text spelling{detail::concat("GPipe<", Stages, ">")};
    static constexpr const auto& constraints = detail::no_constraints;
    static schedule_spec spec(int micro_batches) { return gpipe_spec(Stages, micro_batches); }
};

template <int Stages>
struct OneFOneB {
    static constexpr detail::policy_kind kind = detail::policy_kind::one_f_one_b;
    static constexpr int stages = Stages, chunks = 1, rounds = 1;
    static constexpr detail::static_text spelling{detail::concat("OneFOneB<", Stages, ">")};
    static constexpr const auto& constraints = detail::no_constraints;
    static schedule_spec spec(int micro_batches) { return one_f_one_b_spec(Stages, micro_batches); }
};

// Stages pipeline stages (devices), Virtual chunks per device.
template <int Stages, int Virtual>
struct Interleaved {
    static constexpr detail::policy_kind kind = detail::policy_kind::interleaved;
    static constexpr int stages = Stages, chunks = Virtual, rounds = 1;
    static constexpr detail::static_text spelling{detail::concat("Interleaved<", Stages, ", ", Virtual, ">")};
    static constexpr const auto& constraints = detail::no_constraints;
    static schedule_spec spec(int micro_batches) { return interleaved_spec(Stages, Virtual, micro_batches); }
};

template <int Stages>
struct ThreeFOneB {
    static constexpr detail::policy_kind kind = detail::policy_kind::three_f_one_b;
    static constexpr int stages = Stages, chunks = 1, rounds = 3;
    static constexpr detail::static_text spelling{detail::concat("ThreeFOneB<", Stages, ">")};
    static constexpr const auto& constraints = detail::no_constraints;
    static schedule_spec spec(int micro_batches) { return three_f_one_b_spec(Stages, micro_batches); }
};

// Stages pipeline stages, one device each, between an embedding and an LM head on all devices.
template <int Stages>
struct Interlaced {
    static constexpr detail::policy_kind kind = detail::policy_kind::interlaced;
    static constexpr int stages = Stages, chunks = 1, rounds = 1;
    static constexpr detail::static_text spelling{detail::concat("Interlaced<", Stages, ">")};
    static constexpr const auto& constraints = detail::no_constraints;
    static schedule_spec spec(int micro_batches) { return interlaced_spec(Stages, micro_batches); }
};

// Stages stages on one device each, Rounds forward rounds, ordered by Constraints alone.
template <int Stages, int Rounds, before... Constraints>
struct FromConstraints {
    static constexpr detail::policy_kind kind = detail::policy_kind::from_constraints;
    static constexpr int stages = Stages, chunks = 1, rounds = Rounds;
    static constexpr detail::static_text spelling{
        detail::concat("FromConstraints<", Stages, ", ", Rounds, sizeof...(Constraints) ? ", ...>" : ">")};
    static constexpr std::array<before, sizeof...(Constraints)> constraints{Constraints...};
    static schedule_spec spec(int micro_batches) {
        return {"FromConstraints", pipeline_shape::linear(Stages, micro_batches, Rounds),
                std::vector<before>(constraints.begin(), constraints.end())};
    }
};

namespace detail {

template <class Policy>
inline constexpr static_text order_spelling{concat("order<", Policy::spelling.view(), ">")};

template <class Policy>
inline constexpr plan::detail::message policy_error{
    first_policy_error(policy_view_of<Policy>(order_spelling<Policy>.view()))};

// A base of order<Policy>: instantiating order<Policy> checks Policy.
template <class Policy>
struct checked_policy : ill_formed_schedule<policy_error<Policy>> {};

}  // namespace detail

template <class Policy>
struct order : detail::checked_policy<Policy> {
    static constexpr std::string_view name() { return detail::order_spelling<Policy>.view(); }

    // The shape and constraints for this many micro-batches (throws schedule_error when m
    // does not fit the template, with the same message as a compile-time count).
    static schedule_spec spec(int micro_batches) {
        const std::string spelling = std::string(name()) + "::make(" + std::to_string(micro_batches) + ")";
        const auto view = detail::policy_view_of<Policy>(spelling, micro_batches);
        if (auto e = detail::first_policy_error(view); !e.empty()) throw schedule_error(e.str());
        return Policy::spec(micro_batches);
    }

    static schedule make(int micro_batches, const cost_model& costs = {}) {
        return from_constraints(spec(micro_batches), costs);
    }

    template <int MicroBatches>
    static schedule make(const cost_model& costs = {}) {
        static constexpr detail::static_text spelling{detail::concat(name(), "::make<", MicroBatches, ">")};
        constexpr plan::detail::message error{
            detail::first_policy_error(detail::policy_view_of<Policy>(spelling.view(), MicroBatches))};
        if constexpr (!error.empty()) (void)ill_formed_schedule<error>{};
        return make(MicroBatches, costs);
    }
};

namespace detail {
template <class Policy, int MicroBatches>
constexpr text well_formed_error() {
    return first_policy_error(policy_view_of<Policy>(
        order_spelling<Policy>.view(), MicroBatches == 0 ? std::nullopt : std::optional<int>(MicroBatches)));
}
}  // namespace detail

// Does order<Policy> (and make<MicroBatches>, when given) pass every compile-time check?
// MicroBatches = 0: the count is not given.
template <class Policy, int MicroBatches = 0>
inline constexpr bool well_formed = detail::well_formed_error<Policy, MicroBatches>().empty();

// The first mistake, as the checks word it ("" when well-formed): error_message<...>.view().
template <class Policy, int MicroBatches = 0>
inline constexpr plan::detail::message error_message{detail::well_formed_error<Policy, MicroBatches>()};

}  // namespace loom::schedule
// ---- end loom/schedule/order.hpp ----
// ---- begin loom/schedule/program.hpp ----
// A validated schedule lowered to what each device does, messages included:
//
//   auto programs = device_programs(one_f_one_b(2, 4));
//   programs[0]: compute F(s0,m0), send F(s0,m0) -> F(s1,m0) to 1, compute F(s0,m1), ...,
//                receive B(s1,m0) -> B(s0,m0) from 1, compute B(s0,m0), ...
//
// Sends follow their producer, receives precede their consumer (transfers.hpp gives the
// order among several); an executor runs each program front to back with buffered sends and
// one FIFO channel per (from, to) pair, and validate() has shown that this cannot deadlock or
// hand a message to the wrong receive.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>


namespace loom::schedule {

enum class step_kind : std::uint8_t { compute, send, receive };

struct step {
    step_kind kind = step_kind::compute;
    block target;        // compute: the block; send: the producer; receive: the consumer
    transfer message{};  // send / receive: the message (unused for compute)

    friend bool operator==(const step&, const step&) = default;
};

// "compute F(s0,m0)", "send F(s0,m0) -> F(s1,m0) to device 1", "receive ... from device 1"
inline std::string to_string(const step& s, int rounds = 1) {
    switch (s.kind) {
        case step_kind::compute: return "compute " + to_string(s.target, rounds);
        case step_kind::send:
            return "send " + to_string(s.message.producer, rounds) + " -> " + to_string(s.message.consumer, rounds) +
                   " to device " + std::to_string(s.message.to);
        case step_kind::receive:
            return "receive " + to_string(s.message.producer, rounds) + " -> " + to_string(s.message.consumer, rounds) +
                   " from device " + std::to_string(s.message.from);
    }
    return "?";
}

// One program per device; validates the schedule first (throws schedule_error).
inline std::vector<std::vector<step>> device_programs(const schedule& s) {
    validate(s);
    const auto& p = s.shape;
    const auto position = order_positions(s);
    auto pos = [&](int d, const block& b) {
        return position[static_cast<std::size_t>(d)][static_cast<std::size_t>(block_index(p, b))];
    };
    std::vector<std::vector<transfer>> into(static_cast<std::size_t>(block_count(p)));
    std::vector<std::vector<transfer>> out_of(static_cast<std::size_t>(block_count(p)));
    for (const transfer& t : all_transfers(p)) {
        into[static_cast<std::size_t>(block_index(p, t.consumer))].push_back(t);
        out_of[static_cast<std::size_t>(block_index(p, t.producer))].push_back(t);
    }
    std::vector<std::vector<step>> programs(static_cast<std::size_t>(p.devices));
    for (int d = 0; d < p.devices; ++d) {
        auto& program = programs[static_cast<std::size_t>(d)];
        for (const block& b : s.device_order[static_cast<std::size_t>(d)]) {
            std::vector<transfer> receives, sends;
            for (const transfer& t : into[static_cast<std::size_t>(block_index(p, b))])
                if (t.to == d) receives.push_back(t);
            for (const transfer& t : out_of[static_cast<std::size_t>(block_index(p, b))])
                if (t.from == d) sends.push_back(t);
            std::sort(receives.begin(), receives.end(), [&](const transfer& x, const transfer& y) {
                return std::tuple{x.from, pos(x.from, x.producer)} < std::tuple{y.from, pos(y.from, y.producer)};
            });
            std::sort(sends.begin(), sends.end(), [&](const transfer& x, const transfer& y) {
                return std::tuple{x.to, pos(x.to, x.consumer)} < std::tuple{y.to, pos(y.to, y.consumer)};
            });
            for (const transfer& t : receives) program.push_back({step_kind::receive, b, t});
            program.push_back({step_kind::compute, b, {}});
            for (const transfer& t : sends) program.push_back({step_kind::send, b, t});
        }
    }
    return programs;
}

}  // namespace loom::schedule
// ---- end loom/schedule/program.hpp ----
// ---- begin loom/schedule/svg_timeline.hpp ----
// A simulated schedule as an SVG timeline, like Figure 2 of the nnScaler paper: one row per
// device, one rectangle per block (forward rounds in shades of blue, backwards in orange),
// labelled with its micro-batch, and a time axis underneath.
//
//   std::ofstream("1f1b.svg") << svg_timeline(simulate(one_f_one_b(4, 8)));
//
// Geometry (svg_options, pixels): a block that runs [start, end) on device d is
//   <rect class="block" data-block="F(s1,m3)" data-device="d"
//         x="left + start * pixels_per_unit" y="top + d * (row_height + row_gap)"
//         width="(end - start) * pixels_per_unit" height="row_height" .../>
// Numbers are written with at most three decimals ("40", "12.5").
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>


namespace loom::schedule {

struct svg_options {
    double pixels_per_unit = 40.0;
    double row_height = 28.0;
    double row_gap = 6.0;
    double left = 80.0;    // room for the device labels
    double top = 30.0;     // room for the title
    double right = 20.0;
    double bottom = 40.0;  // room for the time axis
};

namespace detail {

// 40 -> "40", 12.5 -> "12.5", 1/3 -> "0.333"
inline std::string svg_number(double x) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%.3f", x);
    std::string s = buffer;
    while (!s.empty() && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s == "-0" ? "0" : s;
}

inline std::string xml_escape(std::string_view text) {
    std::string out;
    for (char c : text) {
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&quot;"; break;
            default: out += c;
        }
    }
    return out;
}

inline std::string block_colour(const block& b) {
    static constexpr const char* forward_rounds[] = {"#4e79a7", "#76a5d6", "#a8c8ea", "#2f4b6e"};
    if (is_backward(b)) return "#f28e2b";
    return forward_rounds[static_cast<std::size_t>(b.round) % 4];
}

// A tick step of 1, 2, 5, 10, 20, 50, ... units that gives at most 20 ticks.
inline double tick_step(double makespan) {
    double step = 1.0;
    for (int i = 0; makespan / step > 20.0; ++i) step *= (i % 3 == 1) ? 2.5 : 2.0;
    return step;
}

}  // namespace detail

inline std::string svg_timeline(const simulation& r, const svg_options& o = {}) {
    using detail::svg_number;
    const auto& p = r.source.shape;
    const double plot_width = r.makespan * o.pixels_per_unit;
    const double rows = p.devices * (o.row_height + o.row_gap);
    const double width = o.left + plot_width + o.right, height = o.top + rows + o.bottom;
    std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + svg_number(width) + "\" height=\"" +
                      svg_number(height) + "\" viewBox=\"0 0 " + svg_number(width) + " " + svg_number(height) +
                      "\" font-family=\"sans-serif\" font-size=\"12\">\n";
    svg += "<text x=\"" + svg_number(o.left) + "\" y=\"" + svg_number(o.top - 10) + "\" font-size=\"14\">" +
           detail::xml_escape(r.source.name.empty() ? "schedule" : r.source.name) + " (makespan " +
           svg_number(r.makespan) + ", bubble " + svg_number(100.0 * r.bubble_fraction) + "%)</text>\n";
    for (int d = 0; d < p.devices; ++d) {
        const double y = o.top + d * (o.row_height + o.row_gap);
        svg += "<text x=\"" + svg_number(o.left - 8) + "\" y=\"" + svg_number(y + o.row_height / 2 + 4) +
               "\" text-anchor=\"end\">device " + std::to_string(d) + "</text>\n";
        for (const block& b : r.source.device_order[static_cast<std::size_t>(d)]) {
            const timed_block& t = r.at(b);
            const double x = o.left + t.start * o.pixels_per_unit, w = (t.end - t.start) * o.pixels_per_unit;
            const std::string name = to_string(b, p.rounds);
            svg += "<rect class=\"block\" data-block=\"" + name + "\" data-device=\"" + std::to_string(d) + "\" x=\"" +
                   svg_number(x) + "\" y=\"" + svg_number(y) + "\" width=\"" + svg_number(w) + "\" height=\"" +
                   svg_number(o.row_height) + "\" fill=\"" + detail::block_colour(b) +
                   "\" stroke=\"white\"><title>" + name + " [" + svg_number(t.start) + ", " + svg_number(t.end) +
                   ")</title></rect>\n";
            svg += "<text x=\"" + svg_number(x + w / 2) + "\" y=\"" + svg_number(y + o.row_height / 2 + 4) +
                   "\" text-anchor=\"middle\" fill=\"" + (is_backward(b) ? "black" : "white") + "\">" +
                   std::to_string(b.micro) + "</text>\n";
        }
    }
    // the time axis
    const double axis_y = o.top + rows;
    svg += "<line class=\"axis\" x1=\"" + svg_number(o.left) + "\" y1=\"" + svg_number(axis_y) + "\" x2=\"" +
           svg_number(o.left + plot_width) + "\" y2=\"" + svg_number(axis_y) + "\" stroke=\"black\"/>\n";
    const double step = detail::tick_step(r.makespan);
    for (int k = 0; k * step <= r.makespan + 1e-9; ++k) {
        const double x = o.left + k * step * o.pixels_per_unit;
        svg += "<line class=\"tick\" x1=\"" + svg_number(x) + "\" y1=\"" + svg_number(axis_y) + "\" x2=\"" +
               svg_number(x) + "\" y2=\"" + svg_number(axis_y + 5) + "\" stroke=\"black\"/>\n";
        svg += "<text x=\"" + svg_number(x) + "\" y=\"" + svg_number(axis_y + 18) + "\" text-anchor=\"middle\">" +
               svg_number(k * step) + "</text>\n";
    }
    svg += "<text x=\"" + svg_number(o.left + plot_width / 2) + "\" y=\"" + svg_number(axis_y + 34) +
           "\" text-anchor=\"middle\">time</text>\n";
    svg += "</svg>\n";
    return svg;
}

}  // namespace loom::schedule
// ---- end loom/schedule/svg_timeline.hpp ----
// ---- end loom/schedule/all.hpp ----
// the plan searcher: hardware profiles, cost model, folding, branch-and-bound
// ---- begin loom/search/all.hpp ----
// The plan searcher: hardware, cost model, folding, branch-and-bound. One concept per
// header:
//
//   hardware.hpp          device_profile, topology, cluster; DGX presets; JSON profiles
//   communication.hpp     alpha-beta costs per collective, ring and hierarchical; overlap factors
//   memory.hpp            model states by dtype and ZeRO stage, Megatron's bytes per parameter,
//                         activations under recompute
//   folding.hpp           layers from scopes or from structure, classes of identical layers
//   model_profile.hpp     per-layer work, parameters, saved activations of a training graph
//   plan_space.hpp        configuration (TP, PP, DP, micro-batches, ZeRO, schedule, ...) and
//                         search_space
//   schedule_orders.hpp   GPipe, 1F1B and interleaved block orders in linear time
//   evaluate.hpp          cost_context, evaluate(configuration): step time and memory
//   branch_and_bound.hpp  branch_and_bound, enumerate_all, search_result::explain
//   apply_configuration.hpp  a configuration as per-device programs; executable_space()
//   calibrate_host.hpp    the host backend measured as a cluster of in-process ranks
// ---- begin loom/search/apply_configuration.hpp ----
// From a searched configuration to per-device programs that run: the plan presets and the
// pipeline machinery of plan/ and partition/, ordered by the configuration's schedule.
//
//   auto found = search::branch_and_bound(ctx, search::executable_space());
//   partition::partitioned_graph pg = search::apply_configuration(model.ir(), found.best);
//   comm::run_ranks(pg.world, [&](comm::communicator& c) { train::distributed_trainer<float> t(pg, c, {}); ... });
//
// Inside a pipeline stage (tp * dp devices) the plan is Megatron's tensor parallelism with
// data parallelism around it (plan::presets::megatron(tp, dp)), or plain data parallelism
// when tp is 1. Several micro-batches without pipeline stages are a one-stage pipeline
// (gradient accumulation). The executor does not yet run ZeRO or recomputation inside a
// pipeline, so executable_space() leaves them out and apply_configuration refuses them.
#include <string>

// ---- begin loom/search/plan_space.hpp ----
// The parameters a plan may leave open, and one point of that space.
//
//   configuration: tensor-parallel degree (innermost, within a node), pipeline stages,
//   data-parallel degree (the rest of the devices), micro-batches, ZeRO stage, schedule
//   (GPipe, 1F1B, interleaved 1F1B with v chunks per device), how many repeated layers
//   each pipeline chunk holds, and a recompute choice per repeated layer.
//
//   search_space: the candidates for each parameter; an empty list means "every value
//   that fits" (TP: powers of two up to a node that divide the model's tp_granularity;
//   stages: powers of two up to the number of repeated layers; micro-batches: powers of
//   two dividing the batch of one replica).
//
// Devices are numbered node-major and the degrees nest TP, then DP, then PP (Megatron's
// order): the TP group of a device is contiguous, its DP group has stride tp, and
// consecutive pipeline stages are tp * dp devices apart.
#include <string>
#include <vector>

// ---- begin loom/search/memory.hpp ----
// Memory per device: model states (parameters, gradients, optimizer states) under ZeRO or
// Megatron's distributed optimizer, activations under recomputation, and buffers.
//
// ZeRO (Rajbhandari et al., 2020, section 5) with Psi parameters, N_d-way data parallelism
// and K optimizer bytes per parameter (mixed-precision Adam: 2 + 2 + 12 bytes):
//   none                      (2 + 2 + K) * Psi
//   zero_stage::optimizer     2 Psi + 2 Psi + K Psi / N_d
//   zero_stage::gradients     2 Psi + (2 + K) Psi / N_d
//   zero_stage::parameters    (2 + 2 + K) Psi / N_d
// The paper's example, Psi = 7.5e9, N_d = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
// Sizes are in bytes; GB here means 1e9 bytes, as in the paper.
#include <cmath>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>


namespace loom::search {

enum class zero_stage { none = 0, optimizer = 1, gradients = 2, parameters = 3 };

// Bytes per parameter of each model state. `optimizer` is ZeRO's K: everything the
// optimizer step keeps besides the model's own parameter and gradient.
struct state_bytes {
    double parameter = 0;
    double gradient = 0;
    double optimizer = 0;
    double total() const { return parameter + gradient + optimizer; }

    friend bool operator==(const state_bytes&, const state_bytes&) = default;
};

// fp16 parameters and gradients; fp32 master parameters, momentum and variance (4+4+4).
inline constexpr state_bytes mixed_precision_adam() { return {2, 2, 12}; }
// fp32 parameters and gradients; fp32 momentum and variance (4+4).
inline constexpr state_bytes fp32_adam() { return {4, 4, 8}; }

namespace detail {

inline std::string memory_number_text(double x) {
    std::ostringstream s;
    s << x;
    return s.str();
}

inline void check_non_negative(std::string_view where, std::string_view what, double x, std::string_view fix) {
    if (!(x >= 0) || !std::isfinite(x))
        throw usage_error(std::string(where) + ": " + std::string(what) + " is " + memory_number_text(x) + "; " +
                          std::string(fix));
}

inline void check_data_parallel(std::string_view where, int data_parallel) {
    if (data_parallel < 1)
        throw usage_error(std::string(where) + ": data_parallel is " + std::to_string(data_parallel) +
                          "; give the data-parallel degree, at least 1");
}

inline void check_state_bytes(std::string_view where, const state_bytes& s) {
    const char* fix = "give bytes per parameter, e.g. mixed_precision_adam()";
    check_non_negative(where, "state_bytes.parameter", s.parameter, fix);
    check_non_negative(where, "state_bytes.gradient", s.gradient, fix);
    check_non_negative(where, "state_bytes.optimizer", s.optimizer, fix);
}

// Model-state bytes (not per parameter) on one device; each state is divided by N_d from the
// stage that shards it.
inline state_bytes model_state_split(double parameters, state_bytes s, zero_stage zero, int data_parallel) {
    constexpr std::string_view where = "model_state_bytes";
    detail::check_non_negative(where, "parameters", parameters, "give the number of parameters on this device");
    detail::check_state_bytes(where, s);
    detail::check_data_parallel(where, data_parallel);
    const double d = data_parallel;
    const int stage = static_cast<int>(zero);
    return {.parameter = s.parameter * parameters / (stage >= 3 ? d : 1),
            .gradient = s.gradient * parameters / (stage >= 2 ? d : 1),
            .optimizer = s.optimizer * parameters / (stage >= 1 ? d : 1)};
}

}  // namespace detail

inline double model_state_bytes(double parameters, state_bytes s, zero_stage zero, int data_parallel) {
    return detail::model_state_split(parameters, s, zero, data_parallel).total();
}

// ---- Megatron-LM's distributed optimizer ---------------------------------------------
// Megatron-LM docs, "Distributed Optimizer": bytes per parameter
//                                  non-distributed   distributed (d-way data parallel)
//   fp16 params, fp16 grads              20              4 + 16/d
//   bf16 params, fp32 grads              18              6 + 12/d
//   fp32 params, fp32 grads              16              8 +  8/d
// They arise from the components below. Megatron keeps fp32 main gradients: a separate
// 4-byte copy when the model's gradients are fp16; bf16 and fp32 gradients are accumulated
// in fp32 directly and are themselves the main gradients. Likewise an fp32 main copy of the
// parameters exists only when the model's parameters are not fp32. Adam adds m and v (4+4).
//   fp16/fp16: param 2 + grad 2 | main grad 4 + main param 4 + m 4 + v 4 = 4 + 16 = 20
//   bf16/fp32: param 2 + grad 4 | main param 4 + m 4 + v 4              = 6 + 12 = 18
//   fp32/fp32: param 4 + grad 4 | m 4 + v 4                             = 8 +  8 = 16
// The distributed optimizer shards what is right of the bar over the d data-parallel ranks:
// ZeRO stage 1 with K = that part.
enum class megatron_precision { fp16_params_fp16_grads, bf16_params_fp32_grads, fp32_params_fp32_grads };

inline constexpr state_bytes megatron_state_bytes(megatron_precision p) {
    const double param = p == megatron_precision::fp32_params_fp32_grads ? 4 : 2;
    const double grad = p == megatron_precision::fp16_params_fp16_grads ? 2 : 4;
    const double main_grad = grad == 4 ? 0 : 4;
    const double main_param = param == 4 ? 0 : 4;
    const double adam_moments = 4 + 4;
    return {param, grad, main_grad + main_param + adam_moments};
}

inline double megatron_bytes_per_parameter(megatron_precision p, bool distributed_optimizer, int data_parallel) {
    return model_state_bytes(1, megatron_state_bytes(p),
                             distributed_optimizer ? zero_stage::optimizer : zero_stage::none, data_parallel);
}

// ---- activations -----------------------------------------------------------------------
// What the backward pass keeps of one micro-batch on this device, under recomputation
// (Korthikanti et al., 2022, "Reducing Activation Recomputation in Large Transformer Models"):
//   recompute::none       everything the forward saves
//   recompute::selective  all but the attention scores (softmax, its dropout mask, QK^T),
//                         which are recomputed; the 5as/h term of that paper
//   recompute::full       only each layer's input; the layer is rerun in the backward
// The profile's figures come from the model (all layers of this device's stage together).
// Under full recomputation one layer's activations are rebuilt during its backward; that
// transient is not included here; count it in the buffers.
enum class recompute { none, selective, full };

struct activation_profile {
    double saved_bytes_per_micro_batch = 0;             // without recomputation
    double layer_input_bytes_per_micro_batch = 0;       // kept under full recomputation
    double attention_scores_bytes_per_micro_batch = 0;  // dropped under selective recomputation
};

inline double activation_bytes(const activation_profile& a, int in_flight, recompute r) {
    constexpr std::string_view where = "activation_bytes";
    const char* fix = "give bytes per micro-batch, at least 0";
    detail::check_non_negative(where, "saved_bytes_per_micro_batch", a.saved_bytes_per_micro_batch, fix);
    detail::check_non_negative(where, "layer_input_bytes_per_micro_batch", a.layer_input_bytes_per_micro_batch, fix);
    detail::check_non_negative(where, "attention_scores_bytes_per_micro_batch",
                               a.attention_scores_bytes_per_micro_batch, fix);
    for (const auto& [name, part] :
         {std::pair{"attention_scores_bytes_per_micro_batch", a.attention_scores_bytes_per_micro_batch},
          std::pair{"layer_input_bytes_per_micro_batch", a.layer_input_bytes_per_micro_batch}})
        if (part > a.saved_bytes_per_micro_batch)
            throw usage_error(std::string("activation_bytes: ") + name + " (" + detail::memory_number_text(part) +
                              ") exceeds saved_bytes_per_micro_batch (" +
                              detail::memory_number_text(a.saved_bytes_per_micro_batch) +
                              "), of which it is a part; check the activation profile");
    if (in_flight < 0)
        throw usage_error("activation_bytes: in_flight is " + std::to_string(in_flight) +
                          "; give the number of micro-batches whose activations are held at once, at least 0");
    double per_micro_batch = a.saved_bytes_per_micro_batch;
    switch (r) {
        case recompute::none: break;
        case recompute::selective: per_micro_batch -= a.attention_scores_bytes_per_micro_batch; break;
        case recompute::full: per_micro_batch = a.layer_input_bytes_per_micro_batch; break;
    }
    return per_micro_batch * in_flight;
}

// ---- the whole device ------------------------------------------------------------------
struct memory_breakdown {
    double parameters = 0;
    double gradients = 0;
    double optimizer = 0;
    double activations = 0;
    double buffers = 0;  // communication buffers, workspaces, transients
    double total() const { return parameters + gradients + optimizer + activations + buffers; }
};

// `parameters` is the count held by this device before ZeRO sharding (after tensor and
// pipeline partitioning); `in_flight` the micro-batches whose activations it holds at once
// (1F1B: up to the number of pipeline stages on the first stage).
inline memory_breakdown memory_per_device(double parameters, state_bytes s, zero_stage zero, int data_parallel,
                                          const activation_profile& activations, int in_flight, recompute r,
                                          double buffer_bytes) {
    detail::check_non_negative("memory_per_device", "buffer_bytes", buffer_bytes, "give the buffer size in bytes");
    const state_bytes states = detail::model_state_split(parameters, s, zero, data_parallel);
    return {.parameters = states.parameter,
            .gradients = states.gradient,
            .optimizer = states.optimizer,
            .activations = activation_bytes(activations, in_flight, r),
            .buffers = buffer_bytes};
}

}  // namespace loom::search
// ---- end loom/search/memory.hpp ----

namespace loom::search {

enum class schedule_kind { gpipe, one_f_one_b, interleaved };

inline std::string to_string(schedule_kind s) {
    switch (s) {
        case schedule_kind::gpipe: return "GPipe";
        case schedule_kind::one_f_one_b: return "1F1B";
        case schedule_kind::interleaved: return "interleaved 1F1B";
    }
    return "?";
}

inline std::string to_string(recompute r) {
    switch (r) {
        case recompute::none: return "none";
        case recompute::selective: return "selective";
        case recompute::full: return "full";
    }
    return "?";
}

struct configuration {
    int tp = 1;
    int pp = 1;
    int dp = 1;
    int micro_batches = 1;
    int chunks = 1;  // pipeline chunks per device: 1, or v for the interleaved schedule
    zero_stage zero = zero_stage::none;
    schedule_kind schedule = schedule_kind::one_f_one_b;
    std::vector<int> layers_per_chunk;  // repeated layers in each of the pp * chunks chunks
    std::vector<recompute> recompute_of;  // per repeated layer

    int devices() const { return tp * pp * dp; }
    // The pipeline device (0..pp-1) chunk c runs on.
    int device_of_chunk(int c) const { return c % pp; }
};

struct search_space {
    std::vector<int> tp;
    std::vector<int> pp;
    std::vector<int> micro_batches;
    std::vector<zero_stage> zero{zero_stage::none, zero_stage::optimizer, zero_stage::gradients,
                                 zero_stage::parameters};
    std::vector<schedule_kind> schedules{schedule_kind::gpipe, schedule_kind::one_f_one_b,
                                         schedule_kind::interleaved};
    std::vector<recompute> recompute_choices{recompute::none, recompute::selective, recompute::full};
    int interleave_chunks = 2;            // v of the interleaved schedule
    bool search_stage_boundaries = false;  // false: layers split evenly over chunks
    int max_tp = 0;                        // 0: the devices of one node
};

}  // namespace loom::search
// ---- end loom/search/plan_space.hpp ----
// ---- begin loom/search/schedule_orders.hpp ----
// Block orders of the three schedule families the searcher times, written out directly.
// The templates in schedule/templates.hpp derive the same schedules from order constraints
// with a list scheduler, which is general but grows quickly with stages x micro-batches
// (1F1B with 16 stages and 1024 micro-batches takes tens of seconds); the searcher visits
// hundreds of such shapes, so it generates them in linear time here.
//
//   gpipe_orders(p, m)        device s: F(s,0..m-1), then B(s,0..m-1)
//   one_f_one_b_orders(p, m)  device s: w = min(p - s, m) forwards, then B(i) followed by
//                             F(w + i) while forwards remain, then the last backwards
//                             (equal to schedule::one_f_one_b, which a test checks)
//   interleaved_orders(p, v, m)  Megatron's interleaved 1F1B (m a multiple of p): device
//                             r runs chunks r, r + p, ..., forward k is micro-batch
//                             (k / (p v)) p + k % p of chunk (k / p) % v, backward k the same
//                             micro-batch of chunk v - 1 - (k / p) % v; it warms up with
//                             min((p - r - 1) 2 + (v - 1) p, m v) forwards, then alternates,
//                             then drains. The ordering differs from the constraint
//                             template's greedy one; tests validate it (schedule::validate).
#include <algorithm>
#include <string>
#include <vector>


namespace loom::search {

inline schedule::schedule gpipe_orders(int p, int m) {
    schedule::schedule s{schedule::pipeline_shape::linear(p, m), {}, "GPipe"};
    s.device_order.resize(static_cast<std::size_t>(p));
    for (int d = 0; d < p; ++d) {
        auto& order = s.device_order[static_cast<std::size_t>(d)];
        for (int i = 0; i < m; ++i) order.push_back(schedule::forward_block(d, i));
        for (int i = 0; i < m; ++i) order.push_back(schedule::backward_block(d, i));
    }
    return s;
}

inline schedule::schedule one_f_one_b_orders(int p, int m) {
    schedule::schedule s{schedule::pipeline_shape::linear(p, m), {}, "1F1B"};
    s.device_order.resize(static_cast<std::size_t>(p));
    for (int d = 0; d < p; ++d) {
        auto& order = s.device_order[static_cast<std::size_t>(d)];
        const int warmup = std::min(p - d, m);
        for (int i = 0; i < warmup; ++i) order.push_back(schedule::forward_block(d, i));
        for (int i = 0; i < m; ++i) {
            order.push_back(schedule::backward_block(d, i));
            if (warmup + i < m) order.push_back(schedule::forward_block(d, warmup + i));
        }
    }
    return s;
}

inline schedule::schedule interleaved_orders(int p, int v, int m) {
    if (p < 1 || v < 1 || m < 1 || m % p != 0)
        throw usage_error("interleaved_orders: " + std::to_string(m) + " micro-batches over " + std::to_string(p) +
                          " devices; the interleaved schedule needs a positive multiple of the device count");
    schedule::schedule s{schedule::pipeline_shape::interleaved(p, v, m), {}, "interleaved 1F1B"};
    s.device_order.resize(static_cast<std::size_t>(p));
    const int total = m * v;
    const auto micro = [&](int k) { return (k / (p * v)) * p + k % p; };
    for (int r = 0; r < p; ++r) {
        auto& order = s.device_order[static_cast<std::size_t>(r)];
        const auto forward = [&](int k) { return schedule::forward_block(((k / p) % v) * p + r, micro(k)); };
        const auto backward = [&](int k) { return schedule::backward_block((v - 1 - (k / p) % v) * p + r, micro(k)); };
        const int warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
        int f = 0, b = 0;
        for (; f < warmup; ++f) order.push_back(forward(f));
        while (f < total) {
            order.push_back(forward(f++));
            order.push_back(backward(b++));
        }
        while (b < total) order.push_back(backward(b++));
    }
    return s;
}

}  // namespace loom::search
// ---- end loom/search/schedule_orders.hpp ----

namespace loom::search {

// The parameters the executor runs today: TP, PP, DP, micro-batches and the three
// schedules, layers split evenly.
inline search_space executable_space() {
    search_space s;
    s.zero = {zero_stage::none};
    s.recompute_choices = {recompute::none};
    s.search_stage_boundaries = false;
    return s;
}

inline partition::partitioned_graph apply_configuration(const graph& forward, const configuration& c) {
    if (c.zero != zero_stage::none)
        throw plan_error("apply_configuration: the configuration uses ZeRO stage " + std::to_string(static_cast<int>(c.zero)) +
                         ", which the executor does not run with this plan yet; search executable_space()");
    for (recompute r : c.recompute_of)
        if (r != recompute::none)
            throw plan_error("apply_configuration: the configuration recomputes layers (" + to_string(r) +
                             "), which the executor does not run with this plan yet; search executable_space()");
    for (int n : c.layers_per_chunk)
        if (n != c.layers_per_chunk.front())
            throw plan_error("apply_configuration: the configuration splits the layers unevenly over the pipeline "
                             "chunks; the executor's pipelines split them evenly, search with search_stage_boundaries off");
    const plan::plan_spec inner = c.tp > 1 ? plan::presets::megatron(c.tp, c.dp) : plan::presets::data_parallel(c.dp);
    if (c.pp == 1 && c.micro_batches == 1) return partition::apply_plan(forward, plan::resolve(inner, forward));

    const int group = c.tp * c.dp;
    plan::even_pipeline_options stages;
    stages.stages = c.pp;
    stages.micro_batches = c.micro_batches;
    stages.devices_per_stage = group;
    stages.virtual_stages = c.chunks;
    stages.inner = inner;
    const auto pp = plan::resolve_pipeline(plan::even_pipeline(forward, stages), forward);
    auto pg = partition::apply_plan(forward, pp.plan, partition::pipeline_apply_options(pp));
    schedule::schedule order = c.schedule == schedule_kind::gpipe         ? gpipe_orders(c.pp, c.micro_batches)
                               : c.schedule == schedule_kind::one_f_one_b ? one_f_one_b_orders(c.pp, c.micro_batches)
                                                                          : interleaved_orders(c.pp, c.chunks, c.micro_batches);
    if (group > 1) order = partition::spread_over_groups(order, group);
    partition::order_by_schedule(pg, pp, order);
    return pg;
}

}  // namespace loom::search
// ---- end loom/search/apply_configuration.hpp ----
// ---- begin loom/search/branch_and_bound.hpp ----
// Branch-and-bound over a search space (plan_space.hpp) with the cost model of
// evaluate.hpp, and the exhaustive enumeration it must agree with.
//
//   cost_context ctx(profile_model(g), dgx2_v100(2), {.memory_per_device = 32e9});
//   search_result r = branch_and_bound(ctx, search_space{});
//   r.best, r.cost.step_time, r.stats.nodes, r.stats.pruned_by_bound, r.explain()
//
// The tree fixes, in order: TP degree, pipeline stages (DP is what is left), ZeRO stage,
// micro-batches, schedule, stage boundaries; then the recompute choices, which no longer
// interact: the makespan only grows when a block grows, gradient sync does not depend on
// them, and memory is per device, so each pipeline device independently takes the choices
// that fit its memory with the least extra backward time (an exact small knapsack).
//
// Pruning, each bound valid for every completion of the node:
//   work        no device finishes before its share of all forward and backward work
//               (total / devices) plus the exposed communication that is already fixed;
//   pipeline    a device with stages S runs m micro-batches of each: m * sum_S (f + b),
//               and in a linear pipeline stage s also waits for one micro-batch to cross
//               the stages before it, forward and back;
//   memory      model states plus the activations left when every layer recomputes as
//               much as the space allows must fit, or the whole subtree is infeasible.
// A node whose bound reaches the best step time found so far is cut.
//
// Folding (search_options::fold): layers of one class (folding.hpp) on one chunk are
// interchangeable, so the knapsack decides how many of them take each choice instead of
// deciding layer by layer: polynomial in the layers per device instead of exponential.
// The answer is the same (tests check it against the unfolded search and against
// enumerate_all on small spaces).
//
// Deterministic: candidates are visited in a fixed order and ties keep the first found.
// With a time budget the search stops where it is and reports the best configuration so far
// and its proven gap: (best - the least lower bound of the parts not searched) / best.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

// ---- begin loom/search/evaluate.hpp ----
// The cost of one configuration (plan_space.hpp) of a profiled model (model_profile.hpp)
// on a cluster (hardware.hpp): step time and memory per device. The searcher minimises
// the step time of the slowest device (nnScaler eq. 1) among the configurations that fit.
//
// Per micro-batch and pipeline chunk c (its layers L_c, a share 1/(dp m) of the batch):
//   forward_c  = sum_{l in L_c} T(fwd_l) / (tp dp m) + joins_c * AR_tp(residual / (dp m))
//   backward_c = sum_{l in L_c} (T(bwd_l) + T(recompute_l)) / (tp dp m) + the same all-reduces
// where T is the roofline time of a layer's nodes (GEMM-like nodes at gemm_efficiency of
// the precision's peak, memory-bound nodes at elementwise_efficiency, each no faster than
// the memory bandwidth allows), and AR_tp the all-reduce over the TP group, discounted by
// the overlap factor epsilon. Sequence parallelism is assumed: every op is 1/tp per device.
//
//   pipeline  = the schedule's makespan (schedule/ orders, timed here with those chunk
//               times; every message between stages costs a point-to-point transfer of the
//               boundary activation, scattered over the TP group)
//   step      = pipeline + max over devices (exposed gradient sync + ZeRO-3 gathers
//               + optimizer update)
//   gradient sync: all-reduce over the DP group of the device's gradients, latency in full
//               and transmission times gamma * epsilon (TAPAS eq. 3: it overlaps the
//               backward); ZeRO 1/2 move the same bytes (reduce-scatter + all-gather);
//               ZeRO-3 also all-gathers the parameters in every micro-batch's forward and
//               backward.
//   memory    = model states (memory.hpp: by dtype, ZeRO stage and DP degree) of the
//               device's parameters / tp, + for each chunk its peak in-flight micro-batches
//               (from the schedule's orders) times the activations its layers keep under
//               their recompute choice / tp, + ZeRO-3's gather buffer (two layers).
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

// ---- begin loom/search/communication.hpp ----
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
#include <string_view>

// ---- begin loom/search/hardware.hpp ----
// Hardware profiles for the plan searcher's cost model: what one device computes and holds,
// and how devices, nodes and NICs are wired.
//
//   cluster c = dgx_a100(4);                      32 A100s, 8 per node, 8 HDR NICs per node
//   c.device.peak_flops(precision::bf16)          312e12
//   c.topo.inter_node_bandwidth_per_device()      8 * 25e9 / 8 = 25e9 bytes/s
//   save_cluster(c, "a100x4.json");               edit the file after calibrating, then
//   cluster d = load_cluster("a100x4.json");      load it back (a round trip is exact)
//
// Units are SI throughout: bytes, seconds, FLOP/s, bytes/s; a bandwidth is one direction
// of one device's (or one NIC's) link. The JSON keys carry the unit in their names.
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>


namespace loom::search {

// A hardware profile that is incomplete or impossible: a missing or negative field, a
// precision the device lacks, a profile file that is not JSON.
struct profile_error : error {
    using error::error;
};

enum class precision { fp32, fp16, bf16 };

inline std::string_view to_string(precision p) {
    switch (p) {
        case precision::fp32: return "fp32";
        case precision::fp16: return "fp16";
        case precision::bf16: return "bf16";
    }
    return "?";
}

namespace detail {

// Numbers in messages: "1.25e+10", not std::to_string's "12500000000.000000".
inline std::string number_text(double x) {
    std::ostringstream s;
    s << x;
    return s.str();
}

}  // namespace detail

struct device_profile {
    std::string name;
    double peak_flops_fp32 = 0;  // FLOP/s without tensor cores
    double peak_flops_fp16 = 0;  // FLOP/s on tensor cores, fp16 and bf16 alike; 0: the device has none
    double memory_bytes = 0;
    double memory_bandwidth = 0;  // bytes/s
    // Fractions of peak that real kernels reach; guesses until calibration overwrites them.
    double gemm_efficiency = 0.6;
    double elementwise_efficiency = 0.7;

    // bf16 shares the fp16 figure because the tensor cores of A100 and H100 run both at one
    // rate. V100 has no bf16 tensor cores, so for V100 this figure is optimistic for bf16.
    double peak_flops(precision p) const {
        const double peak = p == precision::fp32 ? peak_flops_fp32 : peak_flops_fp16;
        if (!(peak > 0))
            throw profile_error("device_profile::peak_flops: device '" + name + "' has no " +
                                std::string(to_string(p)) + " peak (" +
                                (p == precision::fp32 ? "peak_flops_fp32" : "peak_flops_fp16") + " = " +
                                detail::number_text(peak) + "); set it in the profile or plan in another precision");
        return peak;
    }

    friend bool operator==(const device_profile&, const device_profile&) = default;
};

struct link {
    double bandwidth = 0;  // bytes/s, one direction, per device (per NIC for inter_node_per_nic)
    double latency = 0;    // s, per message

    friend bool operator==(const link&, const link&) = default;
};

struct topology {
    int devices_per_node = 1;
    int nodes = 1;
    link intra_node;
    link inter_node_per_nic;
    int nics_per_node = 1;

    int devices() const { return devices_per_node * nodes; }
    // The share of the node's NICs each device gets when every device of the node sends at once.
    double inter_node_bandwidth_per_device() const {
        return nics_per_node * inter_node_per_nic.bandwidth / devices_per_node;
    }

    friend bool operator==(const topology&, const topology&) = default;
};

struct cluster {
    std::string name;
    device_profile device;
    topology topo;

    int devices() const { return topo.devices(); }

    friend bool operator==(const cluster&, const cluster&) = default;
};

// ---- presets -------------------------------------------------------------------------
// Figures from the vendors' public datasheets. Tensor-core peaks are dense (no 2:4
// sparsity). Memory sizes are the binary sizes of the HBM stacks (32 GB = 32 GiB).
// A bandwidth is per direction: NVIDIA quotes NVLink as the bidirectional total over all of
// a GPU's links, so 300 GB/s becomes 150e9 bytes/s. InfiniBand is quoted per direction in
// bits: EDR 100 Gb/s = 12.5e9, HDR 200 Gb/s = 25e9, NDR 400 Gb/s = 50e9 bytes/s.
// The latencies are assumptions, not datasheet figures: about what one NCCL ring step costs
// within a node (5 us) and across InfiniBand (10 us). Calibration should overwrite them.
namespace detail {

inline constexpr double gib = 1024.0 * 1024.0 * 1024.0;
inline constexpr double intra_node_latency = 5e-6;
inline constexpr double inter_node_latency = 10e-6;

inline void check_preset(std::string_view preset, int nodes, int nics_per_node) {
    if (nodes < 1)
        throw profile_error(std::string(preset) + ": nodes is " + std::to_string(nodes) + "; give at least 1 node");
    if (nics_per_node < 1)
        throw profile_error(std::string(preset) + ": nics_per_node is " + std::to_string(nics_per_node) +
                            "; give at least 1 NIC per node");
}

inline std::string preset_name(std::string_view machine, int nodes) {
    return std::string(machine) + " x" + std::to_string(nodes);
}

inline device_profile v100_sxm2_32gb() {
    // V100 SXM2 datasheet: 15.7 TFLOP/s fp32, 125 TFLOP/s tensor (fp16), 900 GB/s HBM2.
    return {.name = "V100-SXM2-32GB",
            .peak_flops_fp32 = 15.7e12,
            .peak_flops_fp16 = 125e12,
            .memory_bytes = 32 * gib,
            .memory_bandwidth = 900e9};
}

}  // namespace detail

// DGX-1 with V100: 8 GPUs per node. Each V100 has 6 NVLink2 links of 25 GB/s per direction
// (150e9 bytes/s, the datasheet's "300 GB/s"); in the hybrid cube-mesh not every pair is
// linked, so rings reach somewhat less, which calibration corrects. The machine has 4 EDR
// NICs; the NIC count is a parameter so that 1 and 8 NICs per node can be studied.
inline cluster dgx1_v100(int nodes, int nics_per_node = 1) {
    detail::check_preset("dgx1_v100", nodes, nics_per_node);
    return {.name = detail::preset_name("DGX-1 V100", nodes) + ", " + std::to_string(nics_per_node) +
                    (nics_per_node == 1 ? " NIC" : " NICs") + " per node",
            .device = detail::v100_sxm2_32gb(),
            .topo = {.devices_per_node = 8,
                     .nodes = nodes,
                     .intra_node = {150e9, detail::intra_node_latency},
                     .inter_node_per_nic = {12.5e9, detail::inter_node_latency},
                     .nics_per_node = nics_per_node}};
}

// DGX-2: 16 V100 32GB behind NVSwitch, 300 GB/s bidirectional per GPU to any other GPU
// (150e9 per direction), and 8 EDR InfiniBand NICs per node.
inline cluster dgx2_v100(int nodes) {
    detail::check_preset("dgx2_v100", nodes, 8);
    return {.name = detail::preset_name("DGX-2 V100", nodes),
            .device = detail::v100_sxm2_32gb(),
            .topo = {.devices_per_node = 16,
                     .nodes = nodes,
                     .intra_node = {150e9, detail::intra_node_latency},
                     .inter_node_per_nic = {12.5e9, detail::inter_node_latency},
                     .nics_per_node = 8}};
}

// DGX A100 80GB: A100 SXM datasheet 19.5 TFLOP/s fp32, 312 TFLOP/s bf16/fp16 tensor,
// 2039 GB/s HBM2e; NVLink3 600 GB/s bidirectional (300e9 per direction) through NVSwitch;
// 8 HDR 200 Gb/s NICs for the compute fabric.
inline cluster dgx_a100(int nodes) {
    detail::check_preset("dgx_a100", nodes, 8);
    return {.name = detail::preset_name("DGX A100", nodes),
            .device = {.name = "A100-SXM4-80GB",
                       .peak_flops_fp32 = 19.5e12,
                       .peak_flops_fp16 = 312e12,
                       .memory_bytes = 80 * detail::gib,
                       .memory_bandwidth = 2039e9},
            .topo = {.devices_per_node = 8,
                     .nodes = nodes,
                     .intra_node = {300e9, detail::intra_node_latency},
                     .inter_node_per_nic = {25e9, detail::inter_node_latency},
                     .nics_per_node = 8}};
}

// DGX H100: H100 SXM5 datasheet 67 TFLOP/s fp32, 989 TFLOP/s bf16/fp16 tensor (dense),
// 3.35 TB/s HBM3; NVLink4 900 GB/s bidirectional (450e9 per direction) through NVSwitch;
// 8 ConnectX-7 NDR 400 Gb/s NICs for the compute fabric.
inline cluster dgx_h100(int nodes) {
    detail::check_preset("dgx_h100", nodes, 8);
    return {.name = detail::preset_name("DGX H100", nodes),
            .device = {.name = "H100-SXM5-80GB",
                       .peak_flops_fp32 = 67e12,
                       .peak_flops_fp16 = 989e12,
                       .memory_bytes = 80 * detail::gib,
                       .memory_bandwidth = 3.35e12},
            .topo = {.devices_per_node = 8,
                     .nodes = nodes,
                     .intra_node = {450e9, detail::intra_node_latency},
                     .inter_node_per_nic = {50e9, detail::inter_node_latency},
                     .nics_per_node = 8}};
}

// ---- JSON ----------------------------------------------------------------------------
// {
//   "name": "DGX A100 x2",
//   "device": {"name": "A100-SXM4-80GB", "peak_flops_fp32_per_s": 1.95e13,
//              "peak_flops_fp16_per_s": 3.12e14, "memory_bytes": 85899345920,
//              "memory_bandwidth_bytes_per_s": 2.039e12,
//              "gemm_efficiency": 0.6, "elementwise_efficiency": 0.7},     (both optional)
//   "topology": {"devices_per_node": 8, "nodes": 2, "nics_per_node": 8,
//                "intra_node": {"bandwidth_bytes_per_s": 3e11, "latency_s": 5e-06},
//                "inter_node_per_nic": {"bandwidth_bytes_per_s": 2.5e10, "latency_s": 1e-05}}
// }
// Every field is required except the two efficiencies. Peaks and latencies may be 0 (a
// device without tensor cores, an idealised link); every other number must be positive.
// Unknown keys are rejected so that a misspelt optional key does not go unnoticed.

inline nlohmann::json to_json(const link& l) {
    return {{"bandwidth_bytes_per_s", l.bandwidth}, {"latency_s", l.latency}};
}

inline nlohmann::json to_json(const cluster& c) {
    const device_profile& d = c.device;
    const topology& t = c.topo;
    return {{"name", c.name},
            {"device",
             {{"name", d.name},
              {"peak_flops_fp32_per_s", d.peak_flops_fp32},
              {"peak_flops_fp16_per_s", d.peak_flops_fp16},
              {"memory_bytes", d.memory_bytes},
              {"memory_bandwidth_bytes_per_s", d.memory_bandwidth},
              {"gemm_efficiency", d.gemm_efficiency},
              {"elementwise_efficiency", d.elementwise_efficiency}}},
            {"topology",
             {{"devices_per_node", t.devices_per_node},
              {"nodes", t.nodes},
              {"nics_per_node", t.nics_per_node},
              {"intra_node", to_json(t.intra_node)},
              {"inter_node_per_nic", to_json(t.inter_node_per_nic)}}}};
}

namespace detail {

// Reads one JSON object and names every problem by its path from the root, e.g.
// "load_cluster: a100.json: topology.inter_node_per_nic.bandwidth_bytes_per_s is -1; ...".
class profile_reader {
public:
    profile_reader(const nlohmann::json& object, std::string where, std::string path)
        : object_(object), where_(std::move(where)), path_(std::move(path)) {
        if (!object_.is_object())
            fail(path_.empty() ? "the profile" : path_, "is not a JSON object", "write it as {...}");
    }

    profile_reader child(const std::string& key) const { return {required(key), where_, full(key)}; }

    std::string text(const std::string& key) const {
        const nlohmann::json& v = required(key);
        if (!v.is_string()) fail(full(key), "is " + v.dump() + ", not a string", "write it in double quotes");
        return v.get<std::string>();
    }

    // `unit` says what the number measures, for the fix: "bytes per second (per direction)".
    double number(const std::string& key, const std::string& unit, bool zero_allowed = false) const {
        return checked_number(key, required(key), unit, zero_allowed);
    }

    double number_or(const std::string& key, double fallback, const std::string& unit) const {
        const auto it = object_.find(key);
        return it == object_.end() ? fallback : checked_number(key, *it, unit, false);
    }

    int count(const std::string& key, const std::string& what) const {
        const nlohmann::json& v = required(key);
        if (!v.is_number_integer() || v.get<long long>() < 1 || v.get<long long>() > 1'000'000)
            fail(full(key), "is " + v.dump(), "give the number of " + what + " as a whole number of at least 1");
        return v.get<int>();
    }

    void only(std::initializer_list<std::string_view> keys) const {
        for (const auto& [key, value] : object_.items()) {
            bool known = false;
            for (std::string_view k : keys) known = known || k == key;
            if (known) continue;
            std::string expected;
            for (std::string_view k : keys) expected += (expected.empty() ? "" : ", ") + std::string(k);
            fail(full(key), "is not a known field",
                 "remove it or correct its spelling; the fields here are " + expected);
        }
    }

private:
    const nlohmann::json& object_;
    std::string where_;
    std::string path_;

    std::string full(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

    [[noreturn]] void fail(const std::string& field, const std::string& problem, const std::string& fix) const {
        throw profile_error(where_ + ": " + field + " " + problem + "; " + fix);
    }

    const nlohmann::json& required(const std::string& key) const {
        const auto it = object_.find(key);
        if (it == object_.end()) fail(full(key), "is missing", "add it (see loom/search/hardware.hpp for the format)");
        return *it;
    }

    double checked_number(const std::string& key, const nlohmann::json& v, const std::string& unit,
                          bool zero_allowed) const {
        const std::string fix =
            "give a " + std::string(zero_allowed ? "non-negative" : "positive") + " number of " + unit;
        if (!v.is_number()) fail(full(key), "is " + v.dump() + ", not a number", fix);
        const double x = v.get<double>();
        if (!std::isfinite(x) || x < 0 || (x == 0 && !zero_allowed)) fail(full(key), "is " + number_text(x), fix);
        return x;
    }
};

inline link link_from_json(const profile_reader& r) {
    r.only({"bandwidth_bytes_per_s", "latency_s"});
    return {.bandwidth = r.number("bandwidth_bytes_per_s", "bytes per second, one direction"),
            .latency = r.number("latency_s", "seconds", true)};
}

inline cluster cluster_from_json(const nlohmann::json& j, const std::string& where) {
    const profile_reader root(j, where, "");
    root.only({"name", "device", "topology"});
    const profile_reader d = root.child("device");
    d.only({"name", "peak_flops_fp32_per_s", "peak_flops_fp16_per_s", "memory_bytes", "memory_bandwidth_bytes_per_s",
            "gemm_efficiency", "elementwise_efficiency"});
    const profile_reader t = root.child("topology");
    t.only({"devices_per_node", "nodes", "nics_per_node", "intra_node", "inter_node_per_nic"});
    cluster c{.name = root.text("name"),
              .device = {.name = d.text("name"),
                         .peak_flops_fp32 = d.number("peak_flops_fp32_per_s", "FLOP/s", true),
                         .peak_flops_fp16 = d.number("peak_flops_fp16_per_s", "FLOP/s (0 if none)", true),
                         .memory_bytes = d.number("memory_bytes", "bytes"),
                         .memory_bandwidth = d.number("memory_bandwidth_bytes_per_s", "bytes per second"),
                         .gemm_efficiency = d.number_or("gemm_efficiency", device_profile{}.gemm_efficiency,
                                                        "the fraction of peak reached, e.g. 0.6"),
                         .elementwise_efficiency =
                             d.number_or("elementwise_efficiency", device_profile{}.elementwise_efficiency,
                                         "the fraction of peak reached, e.g. 0.7")},
              .topo = {.devices_per_node = t.count("devices_per_node", "devices in a node"),
                       .nodes = t.count("nodes", "nodes"),
                       .intra_node = link_from_json(t.child("intra_node")),
                       .inter_node_per_nic = link_from_json(t.child("inter_node_per_nic")),
                       .nics_per_node = t.count("nics_per_node", "NICs in a node")}};
    return c;
}

}  // namespace detail

inline cluster cluster_from_json(const nlohmann::json& j) { return detail::cluster_from_json(j, "cluster_from_json"); }

inline cluster load_cluster(const std::string& path) {
    std::ifstream file(path);
    if (!file)
        throw profile_error("load_cluster: cannot open '" + path +
                            "'; check the path (save_cluster writes such files)");
    const std::string where = "load_cluster: " + path;
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(file), {}));
    } catch (const nlohmann::json::parse_error& e) {
        throw profile_error(where + " is not valid JSON (" + e.what() +
                            "); write a cluster profile as save_cluster does (format in loom/search/hardware.hpp)");
    }
    return detail::cluster_from_json(j, where);
}

inline void save_cluster(const cluster& c, const std::string& path) {
    std::ofstream file(path);
    file << to_json(c).dump(2) << '\n';
    file.close();
    if (!file)
        throw profile_error("save_cluster: cannot write '" + path + "'; check that its folder exists and is writable");
}

}  // namespace loom::search
// ---- end loom/search/hardware.hpp ----

namespace loom::search {

enum class collective { all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send_recv };

inline std::string_view to_string(collective c) {
    switch (c) {
        case collective::all_reduce: return "all_reduce";
        case collective::all_gather: return "all_gather";
        case collective::reduce_scatter: return "reduce_scatter";
        case collective::all_to_all: return "all_to_all";
        case collective::broadcast: return "broadcast";
        case collective::send_recv: return "send_recv";
    }
    return "?";
}

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

inline group_placement placement(const topology& t, device_group g) {
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

inline void check_link(const cluster& c, const link& l, std::string_view field) {
    if (!(l.bandwidth > 0) || !std::isfinite(l.bandwidth) || !(l.latency >= 0) || !std::isfinite(l.latency))
        throw profile_error("collective_cost: cluster '" + c.name + "' has " + std::string(field) + " bandwidth " +
                            number_text(l.bandwidth) + " bytes/s and latency " + number_text(l.latency) +
                            " s; give a positive bandwidth and a non-negative latency");
}

// One level of ring: n members, each step over a link of bandwidth bw and latency lat.
// all_to_all is here the direct exchange (each member sends (n-1)/n of its buffer); its
// n-1 rounds are charged one latency each.
inline comm_time ring(collective c, double bytes, int n, double bw, double lat) {
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

inline comm_time ring_cost(const cluster& c, collective k, double bytes, int n, const group_placement& p) {
    const topology& t = c.topo;
    if (p.nodes == 1) return ring(k, bytes, n, t.intra_node.bandwidth, t.intra_node.latency);
    const link& nic = t.inter_node_per_nic;
    if (k == collective::send_recv) return ring(k, bytes, n, inter_node_bandwidth_per_member(t, 1), nic.latency);
    if (k == collective::all_to_all) {
        // Each member sends (n-m)/n of its buffer off its node (sharing the node's NICs with
        // the node's m members) and (m-1)/n to its node's members, both at once. Evaluated at
        // the emptiest and the fullest node, the worse of the two.
        auto transmission = [&](int m) {
            const double off_node = (n - m) * bytes / n / inter_node_bandwidth_per_member(t, m);
            const double on_node = (m - 1) * bytes / n / t.intra_node.bandwidth;
            return std::max(off_node, on_node);
        };
        return {(n - 1) * nic.latency, std::max(transmission(p.min_per_node), transmission(p.max_per_node))};
    }
    // A ring crosses each node boundary once per step, so a node sends as much across nodes
    // as one member sends in total. NCCL runs several rings that cross at different members,
    // so the crossing uses min(members, NICs) NICs of the emptiest node. Every step waits for
    // its slowest hop: the crossing, or an NVLink hop when the crossing is faster.
    const int m = p.min_per_node;
    double bw = m * inter_node_bandwidth_per_member(t, m);
    if (p.max_per_node > 1) bw = std::min(bw, t.intra_node.bandwidth);
    return ring(k, bytes, n, bw, nic.latency);
}

inline bool has_hierarchical_form(collective k) {
    return k == collective::all_reduce || k == collective::all_gather || k == collective::reduce_scatter;
}

// k members on each of N nodes. Inside a node the k members reduce-scatter (or gather) the
// whole buffer; across nodes, the k members with the same local index each run a ring over
// the N nodes on their 1/k of the buffer, all k rings at once, sharing the node's NICs.
// all_gather + reduce_scatter == all_reduce holds here as for the ring.
inline comm_time hierarchical_cost(const cluster& c, collective kind, double bytes, const group_placement& p) {
    const topology& t = c.topo;
    const int k = p.max_per_node;
    const int nodes = p.nodes;
    const double intra_bw = t.intra_node.bandwidth, intra_lat = t.intra_node.latency;
    const double inter_bw = inter_node_bandwidth_per_member(t, k), inter_lat = t.inter_node_per_nic.latency;
    const double shard = bytes / k;
    switch (kind) {
        case collective::all_reduce:
            return ring(collective::reduce_scatter, bytes, k, intra_bw, intra_lat) +
                   ring(collective::all_reduce, shard, nodes, inter_bw, inter_lat) +
                   ring(collective::all_gather, bytes, k, intra_bw, intra_lat);
        case collective::all_gather:
            return ring(collective::all_gather, shard, nodes, inter_bw, inter_lat) +
                   ring(collective::all_gather, bytes, k, intra_bw, intra_lat);
        case collective::reduce_scatter:
            return ring(collective::reduce_scatter, bytes, k, intra_bw, intra_lat) +
                   ring(collective::reduce_scatter, shard, nodes, inter_bw, inter_lat);
        default: return {};
    }
}

}  // namespace detail

// Latency and transmission of one collective over group g. Size-1 groups cost 0.
// algorithm::hierarchical on a group whose nodes hold different numbers of members throws;
// algorithm::automatic then uses the ring. For all_to_all, broadcast and send_recv the
// hierarchical form is the ring form.
inline comm_time collective_cost(const cluster& c, collective kind, double bytes, device_group g,
                                 algorithm a = algorithm::automatic) {
    if (!(bytes >= 0) || !std::isfinite(bytes))
        throw usage_error("collective_cost: " + std::string(to_string(kind)) + " of " + detail::number_text(bytes) +
                          " bytes; give a finite, non-negative size in bytes");
    const group_placement p = placement(c.topo, g);
    if (kind == collective::send_recv && g.size > 2)
        throw usage_error("collective_cost: send_recv over a group of " + std::to_string(g.size) +
                          " devices; a send_recv is between 2 devices, give {.size = 2, .stride = <distance>}");
    if (g.size == 1) return {};
    detail::check_link(c, c.topo.intra_node, "topology.intra_node");
    if (p.nodes > 1) {
        detail::check_link(c, c.topo.inter_node_per_nic, "topology.inter_node_per_nic");
        if (c.topo.nics_per_node < 1)
            throw profile_error("collective_cost: cluster '" + c.name + "' has " +
                                std::to_string(c.topo.nics_per_node) +
                                " NICs per node but the group spans nodes; give at least 1 NIC per node");
    }
    const comm_time ring = detail::ring_cost(c, kind, bytes, g.size, p);
    if (a == algorithm::ring || !detail::has_hierarchical_form(kind)) return ring;
    if (!p.uniform()) {
        if (a == algorithm::automatic) return ring;
        throw usage_error("collective_cost: hierarchical " + std::string(to_string(kind)) +
                          " needs the same number of members on every node, but the group has " +
                          std::to_string(p.min_per_node) + " to " + std::to_string(p.max_per_node) +
                          "; use algorithm::ring or align the group to nodes");
    }
    const comm_time hierarchical = detail::hierarchical_cost(c, kind, bytes, p);
    if (a == algorithm::hierarchical) return hierarchical;
    return hierarchical.total() < ring.total() ? hierarchical : ring;
}

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
inline double exposed_time(double forward_transmission, double backward_transmission, collective c,
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

// Whole costs: both latencies in full, the transmissions discounted as above.
inline double exposed_time(const comm_time& forward, const comm_time& backward, collective c,
                           const overlap_factors& f) {
    return forward.latency + backward.latency + exposed_time(forward.transmission, backward.transmission, c, f);
}

}  // namespace loom::search
// ---- end loom/search/communication.hpp ----
// ---- begin loom/search/model_profile.hpp ----
// What the searcher knows about a model: per layer (folding.hpp), the work of its forward
// and backward ops, its parameters, the activations its backward keeps, the residual
// stream it reads, and how finely tensor parallelism can cut it. Everything is read off a
// training graph (forward + backward, graph/autograd.hpp) at the graph's batch; the
// searcher scales it to micro-batches and shards.
//
//   auto g = models::gpt(cfg).training_graph();
//   model_profile m = profile_model(g);          // layers found by find_layers(g)
//   m.layers[1].forward.flops, m.layers[1].saved_elements, m.classes()
//
// Rules (each is a modelling choice, stated once here):
// - A node's work is its op's FLOPs (op_def::flops) and the elements it reads and writes.
//   An op is "GEMM-like" when it does at least 16 FLOPs per element it writes; the others
//   are memory-bound (norms, activations, adds, softmax).
// - Saved activations: forward outputs that a backward node reads. Selective recompute
//   drops those made by memory-bound ops and recomputes them (their forward work again);
//   full recompute keeps only the layer's input and reruns its whole forward.
// - Tensor parallelism (Megatron's rules) costs one all-reduce of the residual stream per
//   residual join (an `add` whose output has the residual stream's shape) in the forward,
//   and one per join in the backward. The degree must divide every parameter extent and
//   every attention head count of the model (`tp_granularity`).
// - Backward nodes belong to the layer of the forward node they differentiate; the other
//   backward nodes (the loss seed, gradient sums) to the epilogue.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

// ---- begin loom/search/folding.hpp ----
// Folding: which parts of a model are layers, and which layers are the same. The searcher
// decides once per class of identical layers and applies the decision to every repeat
// (TAPAS §4.3), so its work grows with the number of distinct layers, not the depth.
//
// Two ways to find the layers of a graph's forward pass:
//   layers_from_scopes(g)     the instances of the graph's largest recorded repeat
//                             ("blocks.0" ... "blocks.95"); everything before the first
//                             instance is the prologue, everything after the epilogue.
//   layers_from_structure(g)  no scopes needed: cut the forward pass where a single
//                             activation is live (the residual stream between blocks),
//                             hash each segment by its ops, shapes and wiring, and find the
//                             longest run of a repeated segment sequence; each repetition
//                             is a layer.
//   find_layers(g)            scopes when the graph recorded a repeat, structure otherwise.
//
// Either way, layers with equal structural hashes get the same class id, so a prologue that
// happens to equal a block would join its class.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>


namespace loom::search {

enum class layer_role { prologue, repeated, epilogue };

struct layer_span {
    std::string name;                  // "blocks.3", "prologue", "epilogue"
    layer_role role = layer_role::repeated;
    std::vector<node_id> nodes;        // forward nodes, in graph order
    std::uint64_t hash = 0;            // structure: op kinds, shapes, wiring
    int class_id = 0;                  // equal hashes, equal classes
};

struct layer_partition {
    std::vector<layer_span> layers;    // prologue (if any), repeated layers, epilogue (if any)
    int classes = 0;
    std::string found_by;              // "scopes" or "structure"

    // Indices (into layers) of the repeated layers, in order.
    std::vector<int> repeated() const {
        std::vector<int> out;
        for (std::size_t i = 0; i < layers.size(); ++i)
            if (layers[i].role == layer_role::repeated) out.push_back(static_cast<int>(i));
        return out;
    }
};

namespace detail {

inline std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
    // splitmix64 finaliser over the running hash: order-sensitive and well spread.
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    return h;
}

inline std::uint64_t hash_text(std::string_view s) { return std::hash<std::string_view>{}(s); }

inline std::size_t forward_count(const graph& g) { return g.forward_nodes ? g.forward_nodes : g.nodes.size(); }

// The hash of a run of forward nodes [first, last): each node's op and output shapes, and
// for each input whether it is a parameter (with its shape), a graph input, an activation
// made inside the run (by its offset back from the consumer) or one from before the run.
inline std::uint64_t hash_nodes(const graph& g, const std::vector<node_id>& nodes) {
    std::map<tensor_id, std::int64_t> made_at;  // tensor -> position in the run
    std::uint64_t h = 0x1234567;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
        const node& n = g.at(nodes[i]);
        h = mix(h, hash_text(n.op->name));
        for (tensor_id t : n.inputs) {
            const tensor_desc& td = g.tensor(t);
            if (td.role == tensor_role::parameter) {
                h = mix(h, 1);
                for (const auto& a : td.dims) h = mix(h, static_cast<std::uint64_t>(a.extent));
            } else if (td.role == tensor_role::input) {
                h = mix(h, 2);
            } else if (auto it = made_at.find(t); it != made_at.end()) {
                h = mix(h, 3 + static_cast<std::uint64_t>(static_cast<std::int64_t>(i) - it->second));
            } else {
                h = mix(h, 0xabcdef);
                for (const auto& a : td.dims) h = mix(h, static_cast<std::uint64_t>(a.extent));
            }
        }
        for (tensor_id t : n.outputs) {
            made_at[t] = static_cast<std::int64_t>(i);
            for (const auto& a : g.tensor(t).dims) h = mix(h, static_cast<std::uint64_t>(a.extent));
        }
    }
    return h;
}

inline void assign_classes(const graph& g, layer_partition& p) {
    std::map<std::uint64_t, int> class_of;
    for (layer_span& l : p.layers) {
        l.hash = hash_nodes(g, l.nodes);
        auto [it, fresh] = class_of.try_emplace(l.hash, static_cast<int>(class_of.size()));
        l.class_id = it->second;
    }
    p.classes = static_cast<int>(class_of.size());
}

// Splits forward nodes into prologue / repeated layers / epilogue given each node's layer
// index (-1 outside the repeat).
inline layer_partition partition_by_layer(const graph& g, const std::vector<std::int64_t>& layer_of,
                                          std::string_view layer_prefix) {
    layer_partition p;
    std::int64_t layers = 0;
    for (std::int64_t l : layer_of) layers = std::max(layers, l + 1);
    layer_span prologue{"prologue", layer_role::prologue, {}, 0, 0};
    layer_span epilogue{"epilogue", layer_role::epilogue, {}, 0, 0};
    std::vector<layer_span> repeated(static_cast<std::size_t>(layers));
    for (std::int64_t l = 0; l < layers; ++l)
        repeated[static_cast<std::size_t>(l)].name = std::string(layer_prefix) + "." + std::to_string(l);
    bool seen_layer = false;
    for (std::size_t i = 0; i < layer_of.size(); ++i) {
        const node_id n = static_cast<node_id>(i);
        if (layer_of[i] >= 0) {
            seen_layer = true;
            repeated[static_cast<std::size_t>(layer_of[i])].nodes.push_back(n);
        } else {
            (seen_layer ? epilogue : prologue).nodes.push_back(n);
        }
    }
    if (!prologue.nodes.empty()) p.layers.push_back(std::move(prologue));
    for (auto& l : repeated) p.layers.push_back(std::move(l));
    if (!epilogue.nodes.empty()) p.layers.push_back(std::move(epilogue));
    assign_classes(g, p);
    return p;
}

}  // namespace detail

// Layers from the graph's largest recorded repeat (most instances; ties: the first).
inline layer_partition layers_from_scopes(const graph& g) {
    std::int32_t best = no_id;
    for (std::size_t r = 0; r < g.repeats.size(); ++r)
        if (best == no_id || g.repeats[r].scopes.size() > g.repeats[static_cast<std::size_t>(best)].scopes.size())
            best = static_cast<std::int32_t>(r);
    if (best == no_id)
        throw usage_error("layers_from_scopes: the graph recorded no repeated scope; build the layers inside "
                          "graph_builder::repeat (or use layers_from_structure)");
    const std::size_t forward = detail::forward_count(g);
    std::vector<std::int64_t> layer_of(forward, -1);
    for (std::size_t i = 0; i < forward; ++i) {
        for (std::int32_t s = g.nodes[i].scope; s != no_id;) {
            const scope_desc& sd = g.scopes.at(static_cast<std::size_t>(s));
            if (sd.repeat == best) {
                layer_of[i] = sd.index;
                break;
            }
            s = sd.parent;
        }
    }
    auto p = detail::partition_by_layer(g, layer_of, g.repeats[static_cast<std::size_t>(best)].name);
    p.found_by = "scopes";
    return p;
}

// Layers from structure alone (scopes ignored).
inline layer_partition layers_from_structure(const graph& g) {
    const std::size_t forward = detail::forward_count(g);
    // live[i]: activations made before node i and read at or after it (forward reads only).
    std::vector<int> delta(forward + 1, 0);
    std::vector<std::int64_t> last_read(g.tensors.size(), -1);
    for (std::size_t i = 0; i < forward; ++i)
        for (tensor_id t : g.nodes[i].inputs) last_read[static_cast<std::size_t>(t)] = static_cast<std::int64_t>(i);
    for (std::size_t t = 0; t < g.tensors.size(); ++t) {
        const tensor_desc& td = g.tensors[t];
        if (td.role != tensor_role::activation || td.producer == no_id) continue;
        const auto made = static_cast<std::int64_t>(td.producer);
        if (made >= static_cast<std::int64_t>(forward) || last_read[t] <= made) continue;
        ++delta[static_cast<std::size_t>(made + 1)];
        --delta[static_cast<std::size_t>(last_read[t] + 1)];
    }
    // Segments start at 0 and at every node before which exactly one activation is live.
    std::vector<std::size_t> starts{0};
    int live = 0;
    for (std::size_t i = 1; i < forward; ++i) {
        live += delta[i];
        if (live == 1) starts.push_back(i);
    }
    starts.push_back(forward);
    std::vector<std::vector<node_id>> segments;
    std::vector<std::uint64_t> segment_hash;
    for (std::size_t s = 0; s + 1 < starts.size(); ++s) {
        std::vector<node_id> nodes;
        for (std::size_t i = starts[s]; i < starts[s + 1]; ++i) nodes.push_back(static_cast<node_id>(i));
        segment_hash.push_back(detail::hash_nodes(g, nodes));
        segments.push_back(std::move(nodes));
    }
    // The longest run of a repeated unit of `period` segments (ties: the shortest period,
    // then the earliest start).
    const std::size_t k = segments.size();
    std::size_t best_start = 0, best_period = 0, best_count = 0;
    for (std::size_t period = 1; period * 2 <= k; ++period) {
        for (std::size_t start = 0; start + 2 * period <= k; ++start) {
            std::size_t count = 1;
            while (start + (count + 1) * period <= k) {
                bool same = true;
                for (std::size_t j = 0; j < period && same; ++j)
                    same = segment_hash[start + j] == segment_hash[start + count * period + j];
                if (!same) break;
                ++count;
            }
            if (count >= 2 && count * period > best_count * best_period) {
                best_start = start;
                best_period = period;
                best_count = count;
            }
        }
    }
    std::vector<std::int64_t> layer_of(forward, -1);
    for (std::size_t c = 0; c < best_count; ++c)
        for (std::size_t j = 0; j < best_period; ++j)
            for (node_id n : segments[best_start + c * best_period + j])
                layer_of[static_cast<std::size_t>(n)] = static_cast<std::int64_t>(c);
    auto p = detail::partition_by_layer(g, layer_of, "layer");
    p.found_by = "structure";
    return p;
}

inline layer_partition find_layers(const graph& g) {
    return g.repeats.empty() ? layers_from_structure(g) : layers_from_scopes(g);
}

}  // namespace loom::search
// ---- end loom/search/folding.hpp ----

namespace loom::search {

// Work of a set of nodes, split by kind.
struct work {
    double flops = 0;                 // all FLOPs
    double gemm_flops = 0;            // of GEMM-like nodes
    double gemm_elements = 0;         // elements GEMM-like nodes read and write
    double memory_bound_flops = 0;
    double memory_bound_elements = 0;  // elements memory-bound nodes read and write

    work& operator+=(const work& o) {
        flops += o.flops;
        gemm_flops += o.gemm_flops;
        gemm_elements += o.gemm_elements;
        memory_bound_flops += o.memory_bound_flops;
        memory_bound_elements += o.memory_bound_elements;
        return *this;
    }
};

struct layer_profile {
    std::string name;
    layer_role role = layer_role::repeated;
    int class_id = 0;
    work forward;                    // at the graph's batch
    work backward;
    work memory_bound_forward;       // the part of `forward` selective recompute reruns
    double parameters = 0;           // elements of the parameters this layer reads first
    double shared_parameters = 0;    // elements of parameters an earlier layer owns (tied weights)
    int shared_from = -1;            // that layer
    double saved_elements = 0;       // activations the backward reads
    double cheap_saved_elements = 0;  // ... of them made by memory-bound ops
    double input_elements = 0;       // activations entering the layer
    double output_elements = 0;      // activations leaving it for later layers
    int residual_joins = 0;
};

struct model_profile {
    layer_partition partition;
    std::vector<layer_profile> layers;  // parallel to partition.layers
    std::int64_t batch = 1;             // samples in the graph's batch
    double residual_elements = 0;       // one residual-stream tensor at the graph's batch
    std::int64_t tp_granularity = 1;    // a TP degree must divide it
    double parameters = 0;

    int classes() const { return partition.classes; }
    bool allows_tp(std::int64_t degree) const { return degree >= 1 && tp_granularity % degree == 0; }
};

namespace detail {

inline double numel(const graph& g, tensor_id t) { return static_cast<double>(g.tensor(t).dims.numel()); }

inline bool gemm_like(double flops, double written) { return written > 0 && flops >= 16.0 * written; }

inline void add_node_work(const graph& g, const node& n, work& w, work* memory_bound_part = nullptr) {
    const double flops = n.op->flops ? n.op->flops(g, n) : 0.0;
    double written = 0, read = 0;
    for (tensor_id t : n.outputs) written += numel(g, t);
    for (tensor_id t : n.inputs) read += numel(g, t);
    w.flops += flops;
    if (gemm_like(flops, written)) {
        w.gemm_flops += flops;
        w.gemm_elements += read + written;
    } else {
        w.memory_bound_flops += flops;
        w.memory_bound_elements += read + written;
        if (memory_bound_part) {
            memory_bound_part->flops += flops;
            memory_bound_part->memory_bound_flops += flops;
            memory_bound_part->memory_bound_elements += read + written;
        }
    }
}

}  // namespace detail

inline model_profile profile_model(const graph& g, layer_partition partition) {
    if (g.forward_nodes == 0)
        throw usage_error("profile_model: the graph has no backward pass; pass the training graph "
                          "(model.training_graph()), whose backward the profile measures");
    model_profile m;
    m.partition = std::move(partition);
    const std::size_t forward = g.forward_nodes;
    std::vector<int> layer_of_node(g.nodes.size(), -1);
    for (std::size_t l = 0; l < m.partition.layers.size(); ++l)
        for (node_id n : m.partition.layers[l].nodes) layer_of_node[static_cast<std::size_t>(n)] = static_cast<int>(l);
    const int last = static_cast<int>(m.partition.layers.size()) - 1;
    for (std::size_t i = forward; i < g.nodes.size(); ++i) {
        const node_id f = g.nodes[i].forward_of;
        layer_of_node[i] = f != no_id && layer_of_node[static_cast<std::size_t>(f)] >= 0
                               ? layer_of_node[static_cast<std::size_t>(f)]
                               : last;
    }

    m.layers.resize(m.partition.layers.size());
    for (std::size_t l = 0; l < m.layers.size(); ++l) {
        m.layers[l].name = m.partition.layers[l].name;
        m.layers[l].role = m.partition.layers[l].role;
        m.layers[l].class_id = m.partition.layers[l].class_id;
    }
    // Which tensors the backward reads, and which later layers read.
    std::vector<bool> read_by_backward(g.tensors.size(), false);
    std::vector<int> last_reader_layer(g.tensors.size(), -1);
    for (std::size_t i = 0; i < g.nodes.size(); ++i)
        for (tensor_id t : g.nodes[i].inputs) {
            if (i >= forward) read_by_backward[static_cast<std::size_t>(t)] = true;
            else last_reader_layer[static_cast<std::size_t>(t)] =
                std::max(last_reader_layer[static_cast<std::size_t>(t)], layer_of_node[i]);
        }

    std::int64_t granularity = 0;
    std::vector<bool> entered(g.tensors.size(), false);
    int entered_layer = -1;
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
        const node& n = g.nodes[i];
        const int l = layer_of_node[i];
        if (l < 0) continue;
        layer_profile& lp = m.layers[static_cast<std::size_t>(l)];
        if (i >= forward) {
            detail::add_node_work(g, n, lp.backward);
            continue;
        }
        if (l != entered_layer) {
            std::fill(entered.begin(), entered.end(), false);
            entered_layer = l;
        }
        detail::add_node_work(g, n, lp.forward, &lp.memory_bound_forward);
        double written = 0;
        for (tensor_id t : n.outputs) written += detail::numel(g, t);
        const bool cheap = !detail::gemm_like(n.op->flops ? n.op->flops(g, n) : 0.0, written);
        for (tensor_id t : n.outputs) {
            if (read_by_backward[static_cast<std::size_t>(t)]) {
                lp.saved_elements += detail::numel(g, t);
                if (cheap) lp.cheap_saved_elements += detail::numel(g, t);
            }
            if (last_reader_layer[static_cast<std::size_t>(t)] > l) lp.output_elements += detail::numel(g, t);
        }
        for (tensor_id t : n.inputs) {
            const tensor_desc& td = g.tensor(t);
            if (td.role == tensor_role::activation && td.producer != no_id &&
                layer_of_node[static_cast<std::size_t>(td.producer)] != l && !entered[static_cast<std::size_t>(t)]) {
                entered[static_cast<std::size_t>(t)] = true;  // counted once per layer: layers read it in order
                lp.input_elements += detail::numel(g, t);
            }
        }
        if (n.op->name == "attention")
            if (auto h = n.sig.find("h")) granularity = std::gcd(granularity, n.sig.vars[static_cast<std::size_t>(*h)].extent);
    }
    for (tensor_id p : g.parameters) {
        m.parameters += detail::numel(g, p);
        for (const auto& a : g.tensor(p).dims) granularity = std::gcd(granularity, a.extent);
    }
    // A parameter belongs to the first layer that reads it; a later layer that reads it too
    // (the LM head of a tied embedding) holds a copy when it sits on another stage.
    std::vector<int> owner(g.tensors.size(), -1), counted_in(g.tensors.size(), -1);
    for (std::size_t i = 0; i < forward; ++i) {
        const int l = layer_of_node[i];
        if (l < 0) continue;
        for (tensor_id t : g.nodes[i].inputs) {
            if (g.tensor(t).role != tensor_role::parameter) continue;
            if (counted_in[static_cast<std::size_t>(t)] == l) continue;
            counted_in[static_cast<std::size_t>(t)] = l;
            int& o = owner[static_cast<std::size_t>(t)];
            layer_profile& lp = m.layers[static_cast<std::size_t>(l)];
            if (o < 0) {
                o = l;
                lp.parameters += detail::numel(g, t);
            } else {
                lp.shared_from = o;
                lp.shared_parameters += detail::numel(g, t);
            }
        }
    }
    m.tp_granularity = granularity > 0 ? granularity : 1;

    // The residual stream: the activation entering the first repeated layer.
    const auto repeated = m.partition.repeated();
    if (!repeated.empty()) {
        const layer_profile& first = m.layers[static_cast<std::size_t>(repeated.front())];
        m.residual_elements = first.input_elements;
    }
    // Residual joins: adds whose output is as large as the residual stream.
    for (std::size_t i = 0; i < forward; ++i) {
        const node& n = g.nodes[i];
        if (layer_of_node[i] < 0 || n.op->name != "add" || m.residual_elements <= 0) continue;
        if (detail::numel(g, n.outputs[0]) == m.residual_elements) ++m.layers[static_cast<std::size_t>(layer_of_node[i])].residual_joins;
    }
    // The batch: the leading extent of the first graph input (tokens [batch, seq]).
    if (!g.inputs.empty() && g.tensor(g.inputs.front()).dims.rank() > 0)
        m.batch = g.tensor(g.inputs.front()).dims.extent(0);
    return m;
}

inline model_profile profile_model(const graph& g) { return profile_model(g, find_layers(g)); }

}  // namespace loom::search
// ---- end loom/search/model_profile.hpp ----

namespace loom::search {

struct search_options {
    double memory_per_device = 0;  // bytes; 0: the device's memory
    precision compute = precision::bf16;
    double activation_bytes = 2;   // per element of activations and messages
    state_bytes states = mixed_precision_adam();
    overlap_factors overlap;
    bool fold = true;              // decide once per class of identical layers
    double time_budget_seconds = 0;  // 0: search to the end
};

struct device_cost {
    double parameters = 0;  // elements of the layers on this device, before TP sharding
    memory_breakdown memory;
    double exposed_communication = 0;  // s per step: gradient sync, ZeRO-3 gathers
    double optimizer = 0;              // s per step
};

struct evaluation {
    bool feasible = false;
    std::string why_infeasible;
    double step_time = std::numeric_limits<double>::infinity();
    double pipeline_time = 0;
    std::vector<double> chunk_forward, chunk_backward;  // s per micro-batch
    std::vector<device_cost> devices;                  // per pipeline device
    double peak_memory() const {
        double m = 0;
        for (const auto& d : devices) m = std::max(m, d.memory.total());
        return m;
    }
};

// Per-layer times and the schedules' orders, computed once for a model and cluster.
class cost_context {
public:
    // Keeps its own copy of the profile, so a temporary may be passed.
    cost_context(model_profile model, const cluster& hw, const search_options& options)
        : model_(std::move(model)), hw_(hw), options_(options) {
        memory_cap_ = options.memory_per_device > 0 ? options.memory_per_device : hw.device.memory_bytes;
        const double peak = hw.device.peak_flops(options.compute);
        const auto time_of = [&](const work& w) {
            const double bytes = options.activation_bytes;
            return std::max(w.gemm_flops / (peak * hw.device.gemm_efficiency),
                            w.gemm_elements * bytes / hw.device.memory_bandwidth) +
                   std::max(w.memory_bound_flops / (peak * hw.device.elementwise_efficiency),
                            w.memory_bound_elements * bytes / (hw.device.memory_bandwidth * hw.device.elementwise_efficiency));
        };
        for (const layer_profile& l : model_.layers) {
            times_.push_back({time_of(l.forward), time_of(l.backward), time_of(l.memory_bound_forward)});
        }
        for (std::size_t i = 0; i < model_.layers.size(); ++i)
            if (model_.layers[i].role == layer_role::repeated) repeated_.push_back(static_cast<int>(i));
            else if (model_.layers[i].role == layer_role::prologue) prologue_ = static_cast<int>(i);
            else epilogue_ = static_cast<int>(i);
    }

    struct layer_times {
        double forward = 0, backward = 0, memory_bound_forward = 0;  // s at the graph's batch, one device
    };

    const model_profile& model() const { return model_; }
    const cluster& hardware() const { return hw_; }
    const search_options& options() const { return options_; }
    double memory_cap() const { return memory_cap_; }
    const std::vector<int>& repeated() const { return repeated_; }
    int prologue() const { return prologue_; }
    int epilogue() const { return epilogue_; }
    const layer_times& times(int layer) const { return times_[static_cast<std::size_t>(layer)]; }

    // Extra backward time (at the graph's batch, one device) and activations kept (elements
    // at the graph's batch) of a layer under a recompute choice.
    double recompute_time(int layer, recompute r) const {
        return r == recompute::full ? times(layer).forward
               : r == recompute::selective ? times(layer).memory_bound_forward
                                           : 0.0;
    }
    double kept_elements(int layer, recompute r) const {
        const layer_profile& l = model_.layers[static_cast<std::size_t>(layer)];
        return r == recompute::full ? l.input_elements
               : r == recompute::selective ? l.saved_elements - l.cheap_saved_elements
                                           : l.saved_elements;
    }

    // The block orders of a schedule and its peak in-flight micro-batches per chunk.
    struct orders {
        schedule::schedule order;
        std::vector<int> in_flight;  // per chunk
    };
    const orders& schedule_orders(schedule_kind kind, int pp, int chunks, int micro_batches) {
        const auto key = std::make_tuple(static_cast<int>(kind), pp, chunks, micro_batches);
        auto it = orders_.find(key);
        if (it != orders_.end()) return *it->second;
        auto o = std::make_unique<orders>();
        o->order = kind == schedule_kind::gpipe         ? gpipe_orders(pp, micro_batches)
                   : kind == schedule_kind::one_f_one_b ? one_f_one_b_orders(pp, micro_batches)
                                                        : interleaved_orders(pp, chunks, micro_batches);
        o->in_flight = schedule::peak_in_flight(o->order).per_stage;
        ++schedules_built_;
        return *orders_.emplace(key, std::move(o)).first->second;
    }
    int schedules_built() const { return schedules_built_; }

private:
    model_profile model_;
    cluster hw_;
    search_options options_;
    double memory_cap_ = 0;
    std::vector<layer_times> times_;
    std::vector<int> repeated_;
    int prologue_ = -1, epilogue_ = -1;
    std::map<std::tuple<int, int, int, int>, std::unique_ptr<orders>> orders_;
    int schedules_built_ = 0;
};

// The makespan of fixed per-device block orders with per-chunk block times: each block
// starts when its device is free and its inputs have arrived (a message between devices
// adds `message`). The orders were validated when they were built, so this is a plain
// event sweep.
inline double pipeline_makespan(const schedule::schedule& s, const std::vector<double>& forward,
                                const std::vector<double>& backward, double message) {
    const int stages = s.shape.stages, micro = s.shape.micro_batches;
    const auto index = [&](int stage, int m) { return static_cast<std::size_t>(stage) * static_cast<std::size_t>(micro) + static_cast<std::size_t>(m); };
    const double never = -1.0;
    std::vector<double> forward_end(static_cast<std::size_t>(stages * micro), never);
    std::vector<double> backward_end(forward_end.size(), never);
    const auto device_of = [&](int stage) { return s.shape.stage_devices[static_cast<std::size_t>(stage)].front(); };
    std::vector<std::size_t> next(s.device_order.size(), 0);
    std::vector<double> free(s.device_order.size(), 0.0);
    std::size_t remaining = 0;
    for (const auto& o : s.device_order) remaining += o.size();
    double makespan = 0;
    while (remaining > 0) {
        bool progressed = false;
        for (std::size_t d = 0; d < s.device_order.size(); ++d) {
            while (next[d] < s.device_order[d].size()) {
                const schedule::block& b = s.device_order[d][next[d]];
                double ready = free[d];
                const auto arrive = [&](double end, int from_stage) {
                    return end + (device_of(from_stage) == static_cast<int>(d) ? 0.0 : message);
                };
                if (schedule::is_forward(b)) {
                    if (b.stage > 0) {
                        const double e = forward_end[index(b.stage - 1, b.micro)];
                        if (e == never) break;
                        ready = std::max(ready, arrive(e, b.stage - 1));
                    }
                } else {
                    const double own = forward_end[index(b.stage, b.micro)];
                    if (own == never) break;
                    ready = std::max(ready, own);
                    if (b.stage + 1 < stages) {
                        const double e = backward_end[index(b.stage + 1, b.micro)];
                        if (e == never) break;
                        ready = std::max(ready, arrive(e, b.stage + 1));
                    }
                }
                const bool fwd = schedule::is_forward(b);
                const double end = ready + (fwd ? forward : backward)[static_cast<std::size_t>(b.stage)];
                (fwd ? forward_end : backward_end)[index(b.stage, b.micro)] = end;
                free[d] = end;
                makespan = std::max(makespan, end);
                ++next[d];
                --remaining;
                progressed = true;
            }
        }
        if (!progressed)
            throw usage_error("pipeline_makespan: the block orders deadlock; build them with the schedule templates "
                              "(schedule::validate rejects such orders)");
    }
    return makespan;
}

// Which layers each chunk holds: the prologue on chunk 0, the epilogue on the last chunk,
// the repeated layers in order, layers_per_chunk[c] of them on chunk c.
inline std::vector<std::vector<int>> layers_of_chunks(const cost_context& ctx, const configuration& c) {
    const int chunks = c.pp * c.chunks;
    std::vector<std::vector<int>> out(static_cast<std::size_t>(chunks));
    if (ctx.prologue() >= 0) out.front().push_back(ctx.prologue());
    std::size_t next = 0;
    for (int k = 0; k < chunks; ++k)
        for (int i = 0; i < c.layers_per_chunk[static_cast<std::size_t>(k)]; ++i)
            out[static_cast<std::size_t>(k)].push_back(ctx.repeated()[next++]);
    if (ctx.epilogue() >= 0) out.back().push_back(ctx.epilogue());
    return out;
}

// The recompute choice of layer index `layer` (prologue and epilogue keep everything).
inline recompute recompute_of_layer(const cost_context& ctx, const configuration& c, int layer) {
    const auto& r = ctx.repeated();
    const auto it = std::find(r.begin(), r.end(), layer);
    if (it == r.end() || c.recompute_of.empty()) return recompute::none;
    return c.recompute_of[static_cast<std::size_t>(it - r.begin())];
}

// Everything but the pipeline makespan: per-chunk times and per-device memory and comm.
// Split out so that the searcher can bound before it times the schedule.
inline evaluation evaluate_without_pipeline(cost_context& ctx, const configuration& c) {
    const model_profile& m = ctx.model();
    const cluster& hw = ctx.hardware();
    const search_options& o = ctx.options();
    const int chunks = c.pp * c.chunks;
    evaluation e;
    e.chunk_forward.assign(static_cast<std::size_t>(chunks), 0.0);
    e.chunk_backward.assign(static_cast<std::size_t>(chunks), 0.0);
    e.devices.assign(static_cast<std::size_t>(c.pp), {});
    const double share = 1.0 / (static_cast<double>(c.dp) * c.micro_batches);  // of the graph's batch
    const double residual_bytes = m.residual_elements * share * o.activation_bytes;
    const double tp_all_reduce =
        c.tp > 1 ? exposed_time(collective_cost(hw, collective::all_reduce, residual_bytes, {c.tp, 1}), {}, collective::all_reduce,
                                {1.0, o.overlap.epsilon})
                 : 0.0;
    const auto layers = layers_of_chunks(ctx, c);
    const auto& sched = ctx.schedule_orders(c.schedule, c.pp, c.chunks, c.micro_batches);
    std::vector<std::vector<bool>> on_device(static_cast<std::size_t>(c.pp), std::vector<bool>(m.layers.size(), false));
    for (int k = 0; k < chunks; ++k)
        for (int l : layers[static_cast<std::size_t>(k)]) on_device[static_cast<std::size_t>(c.device_of_chunk(k))][static_cast<std::size_t>(l)] = true;
    std::vector<double> activations(static_cast<std::size_t>(c.pp), 0.0), largest_layer(static_cast<std::size_t>(c.pp), 0.0);
    for (int k = 0; k < chunks; ++k) {
        const int d = c.device_of_chunk(k);
        double f = 0, b = 0, kept = 0;
        int joins = 0;
        for (int l : layers[static_cast<std::size_t>(k)]) {
            const recompute r = recompute_of_layer(ctx, c, l);
            f += ctx.times(l).forward;
            b += ctx.times(l).backward + ctx.recompute_time(l, r);
            kept += ctx.kept_elements(l, r);
            joins += m.layers[static_cast<std::size_t>(l)].residual_joins;
            const layer_profile& lp = m.layers[static_cast<std::size_t>(l)];
            device_cost& dc = e.devices[static_cast<std::size_t>(d)];
            dc.parameters += lp.parameters;
            if (lp.shared_from >= 0 && !on_device[static_cast<std::size_t>(d)][static_cast<std::size_t>(lp.shared_from)])
                dc.parameters += lp.shared_parameters;
            largest_layer[static_cast<std::size_t>(d)] = std::max(largest_layer[static_cast<std::size_t>(d)], lp.parameters + lp.shared_parameters);
        }
        e.chunk_forward[static_cast<std::size_t>(k)] = f * share / c.tp + joins * tp_all_reduce;
        e.chunk_backward[static_cast<std::size_t>(k)] = b * share / c.tp + joins * tp_all_reduce;
        activations[static_cast<std::size_t>(d)] +=
            sched.in_flight[static_cast<std::size_t>(k)] * kept * share * o.activation_bytes / c.tp;
    }
    e.feasible = true;
    for (int d = 0; d < c.pp; ++d) {
        device_cost& dc = e.devices[static_cast<std::size_t>(d)];
        const double local = dc.parameters / c.tp;
        const state_bytes s = o.states;
        const double buffers = c.zero == zero_stage::parameters ? 2.0 * largest_layer[static_cast<std::size_t>(d)] / c.tp * s.parameter : 0.0;
        dc.memory = memory_per_device(local, s, c.zero, c.dp, activation_profile{}, 0, recompute::none, buffers);
        dc.memory.activations = activations[static_cast<std::size_t>(d)];
        if (c.dp > 1) {
            const comm_time sync = collective_cost(hw, collective::all_reduce, local * s.gradient, {c.dp, c.tp});
            dc.exposed_communication = exposed_time({}, sync, collective::all_reduce, o.overlap);
            if (c.zero == zero_stage::parameters) {
                const comm_time gather = collective_cost(hw, collective::all_gather, local * s.parameter, {c.dp, c.tp});
                dc.exposed_communication +=
                    c.micro_batches * exposed_time(gather, gather, collective::all_gather, {1.0, o.overlap.epsilon});
            }
        }
        const double updated = c.zero == zero_stage::none ? local : local / c.dp;
        dc.optimizer = 2.0 * updated * (s.parameter + s.gradient + s.optimizer) / hw.device.memory_bandwidth;
        // A relative slack, so that the knapsack's sums and these agree on the boundary.
        if (dc.memory.total() > ctx.memory_cap() * (1 + 1e-12) && e.feasible) {
            e.feasible = false;
            e.why_infeasible = "pipeline device " + std::to_string(d) + " needs " +
                               std::to_string(dc.memory.total() / 1e9) + " GB, more than the " +
                               std::to_string(ctx.memory_cap() / 1e9) + " GB allowed";
        }
    }
    return e;
}

// The time of one message between consecutive stages: the boundary activation of one
// micro-batch, scattered over the TP group (each of its devices sends 1/tp).
inline double stage_message_time(const cost_context& ctx, const configuration& c) {
    if (c.pp == 1) return 0.0;
    const double bytes = ctx.model().residual_elements / (static_cast<double>(c.dp) * c.micro_batches) *
                         ctx.options().activation_bytes / c.tp;
    return collective_time(ctx.hardware(), collective::send_recv, bytes, {2, c.tp * c.dp});
}

inline double step_time_of(const evaluation& e, double pipeline) {
    double slowest = 0;
    for (const auto& d : e.devices) slowest = std::max(slowest, d.exposed_communication + d.optimizer);
    return pipeline + slowest;
}

inline evaluation evaluate(cost_context& ctx, const configuration& c) {
    evaluation e = evaluate_without_pipeline(ctx, c);
    const auto& sched = ctx.schedule_orders(c.schedule, c.pp, c.chunks, c.micro_batches);
    e.pipeline_time = pipeline_makespan(sched.order, e.chunk_forward, e.chunk_backward, stage_message_time(ctx, c));
    e.step_time = step_time_of(e, e.pipeline_time);
    if (!e.feasible) e.step_time = std::numeric_limits<double>::infinity();
    return e;
}

}  // namespace loom::search
// ---- end loom/search/evaluate.hpp ----

namespace loom::search {

struct search_statistics {
    long nodes = 0;              // tree nodes visited
    long pruned_by_bound = 0;    // cut because their lower bound reached the best time
    long pruned_by_memory = 0;   // cut because nothing below them fits in memory
    long leaves = 0;             // complete configurations timed
    long knapsack_nodes = 0;     // nodes of the recompute subproblems
    int schedules_built = 0;
    double seconds = 0;
    bool complete = true;        // false: the time budget ran out
    double gap = 0;              // proven relative gap of the answer (0 when complete)
};

struct search_result {
    bool found = false;
    configuration best;
    evaluation cost;
    search_statistics stats;
    std::string model_summary;
    std::string cluster_name;

    std::string explain() const;
};

namespace detail {

inline std::vector<int> powers_of_two_up_to(int limit) {
    std::vector<int> out;
    for (int v = 1; v <= limit; v *= 2) out.push_back(v);
    return out;
}

// The candidates of each level, in visiting order.
struct candidates {
    const cost_context& ctx;
    const search_space& space;

    std::vector<int> tp() const {
        const int devices = ctx.hardware().devices();
        const int limit = space.max_tp > 0 ? space.max_tp : ctx.hardware().topo.devices_per_node;
        std::vector<int> out;
        for (int t : space.tp.empty() ? powers_of_two_up_to(limit) : space.tp)
            if (t >= 1 && devices % t == 0 && ctx.model().allows_tp(t)) out.push_back(t);
        return out;
    }
    std::vector<int> pp(int tp) const {
        const int devices = ctx.hardware().devices();
        const int layers = static_cast<int>(ctx.repeated().size());
        std::vector<int> out;
        for (int p : space.pp.empty() ? powers_of_two_up_to(std::max(layers, 1)) : space.pp) {
            if (p < 1 || devices % (tp * p) != 0) continue;
            if (p > std::max(layers, 1)) continue;
            if (ctx.model().batch % (devices / (tp * p)) != 0) continue;  // DP splits the batch
            out.push_back(p);
        }
        return out;
    }
    std::vector<zero_stage> zero(int dp) const {
        std::vector<zero_stage> out;
        for (zero_stage z : space.zero)
            if (dp > 1 || z == zero_stage::none) out.push_back(z);  // without DP every stage is "none"
        if (out.empty() && dp == 1) out.push_back(zero_stage::none);
        return out;
    }
    std::vector<int> micro_batches(int dp) const {
        const std::int64_t per_replica = ctx.model().batch / dp;
        std::vector<int> out;
        for (int m : space.micro_batches.empty() ? powers_of_two_up_to(static_cast<int>(per_replica)) : space.micro_batches)
            if (m >= 1 && per_replica % m == 0) out.push_back(m);
        return out;
    }
    // (schedule, chunks per device) pairs.
    std::vector<std::pair<schedule_kind, int>> schedules(int pp, int m) const {
        std::vector<std::pair<schedule_kind, int>> out;
        const int layers = static_cast<int>(ctx.repeated().size());
        for (schedule_kind s : space.schedules) {
            if (pp == 1) {  // one stage: every schedule is the same sequence of micro-batches
                if (out.empty()) out.push_back({schedule_kind::one_f_one_b, 1});
                continue;
            }
            if (s == schedule_kind::interleaved) {
                const int v = space.interleave_chunks;
                if (v < 2 || m % pp != 0 || layers < pp * v) continue;
                if (!space.search_stage_boundaries && layers % (pp * v) != 0) continue;
                out.push_back({s, v});
            } else {
                if (!space.search_stage_boundaries && layers % pp != 0) continue;
                out.push_back({s, 1});
            }
        }
        return out;
    }
};

// Every split of `layers` into `parts` positive counts (the even split first).
inline void for_each_split(int layers, int parts, bool all, const std::function<bool(const std::vector<int>&)>& visit) {
    if (!all) {
        visit(std::vector<int>(static_cast<std::size_t>(parts), layers / parts));
        return;
    }
    std::vector<int> split(static_cast<std::size_t>(parts), 0);
    if (layers % parts == 0 && !visit(std::vector<int>(static_cast<std::size_t>(parts), layers / parts))) return;
    std::function<bool(int, int)> go = [&](int k, int left) {
        if (k == parts - 1) {
            split[static_cast<std::size_t>(k)] = left;
            if (layers % parts == 0 && std::all_of(split.begin(), split.end(), [&](int x) { return x == layers / parts; }))
                return true;  // visited first
            return visit(split);
        }
        for (int n = 1; n <= left - (parts - 1 - k); ++n) {
            split[static_cast<std::size_t>(k)] = n;
            if (!go(k + 1, left - n)) return false;
        }
        return true;
    };
    go(0, layers);
}

// A group of interchangeable layers on one device: same class, same chunk.
struct recompute_group {
    std::vector<int> layers;    // repeated-layer positions (into ctx.repeated())
    double weight = 0;          // bytes per kept element (in-flight * share * bytes / tp)
    double time_scale = 0;      // seconds per unit of layer time (share / tp)
};

// The least extra backward time over groups, with memory <= budget. Choices per group:
// counts of each recompute option (folded) or per layer (groups of one).
struct recompute_solver {
    recompute_solver(const cost_context& c, const std::vector<recompute>& r) : ctx(c), choices(r) {}

    const cost_context& ctx;
    const std::vector<recompute>& choices;
    std::vector<recompute_group> groups;
    double budget = 0;
    long* nodes = nullptr;
    std::function<bool()> out_of_time;  // checked every 4096 nodes; true: give up
    bool gave_up = false;

    std::vector<std::vector<int>> best_counts, counts;  // per group: count per choice
    double best_time = std::numeric_limits<double>::infinity();
    std::vector<double> least_memory_after;  // least memory of groups i.. (all max-saving)

    // Representative numbers of a group (its layers are identical in folded mode; in
    // unfolded mode groups hold one layer).
    double memory_of(const recompute_group& g, recompute r) const {
        return g.weight * ctx.kept_elements(ctx.repeated()[static_cast<std::size_t>(g.layers.front())], r);
    }
    double time_of(const recompute_group& g, recompute r) const {
        return g.time_scale * ctx.recompute_time(ctx.repeated()[static_cast<std::size_t>(g.layers.front())], r);
    }

    bool solve() {
        least_memory_after.assign(groups.size() + 1, 0.0);
        for (std::size_t i = groups.size(); i-- > 0;) {
            double least = std::numeric_limits<double>::infinity();
            for (recompute r : choices) least = std::min(least, memory_of(groups[i], r));
            least_memory_after[i] = least_memory_after[i + 1] + least * static_cast<double>(groups[i].layers.size());
        }
        if (least_memory_after[0] > budget) return false;
        counts.assign(groups.size(), std::vector<int>(choices.size(), 0));
        go(0, 0.0, 0.0);
        return best_time < std::numeric_limits<double>::infinity();
    }

    void go(std::size_t i, double memory, double time) {
        if (gave_up) return;
        if (nodes && (++*nodes & 4095) == 0 && out_of_time && out_of_time()) {
            gave_up = true;
            return;
        }
        if (time >= best_time) return;
        if (memory + least_memory_after[i] > budget) return;
        if (i == groups.size()) {
            best_time = time;
            best_counts = counts;
            return;
        }
        const int n = static_cast<int>(groups[i].layers.size());
        // Counts per choice summing to n, choices earlier in the list first and in larger numbers.
        std::function<void(std::size_t, int, double, double)> split = [&](std::size_t k, int left, double mem, double t) {
            if (k + 1 == choices.size()) {
                counts[i][k] = left;
                go(i + 1, mem + left * memory_of(groups[i], choices[k]), t + left * time_of(groups[i], choices[k]));
                return;
            }
            for (int c = left; c >= 0; --c) {
                counts[i][k] = c;
                split(k + 1, left - c, mem + c * memory_of(groups[i], choices[k]), t + c * time_of(groups[i], choices[k]));
            }
        };
        split(0, n, memory, time);
    }
};

}  // namespace detail

class branch_and_bound_search {
public:
    branch_and_bound_search(cost_context& ctx, const search_space& space) : ctx_(ctx), space_(space) {}

    search_result run() {
        const auto start = std::chrono::steady_clock::now();
        start_ = start;
        detail::candidates cand{ctx_, space_};
        const int devices = ctx_.hardware().devices();
        double total_work = 0;
        for (std::size_t l = 0; l < ctx_.model().layers.size(); ++l)
            total_work += ctx_.times(static_cast<int>(l)).forward + ctx_.times(static_cast<int>(l)).backward;
        for (int tp : cand.tp()) {
            for (int pp : cand.pp(tp)) {
                ++stats_.nodes;
                const int dp = devices / (tp * pp);
                const double work_bound = total_work / devices;
                if (cut(work_bound)) continue;
                for (zero_stage z : cand.zero(dp))
                    for (int m : cand.micro_batches(dp))
                        for (auto [kind, chunks] : cand.schedules(pp, m)) {
                            configuration c;
                            c.tp = tp;
                            c.pp = pp;
                            c.dp = dp;
                            c.zero = z;
                            c.micro_batches = m;
                            c.schedule = kind;
                            c.chunks = chunks;
                            const int layers = static_cast<int>(ctx_.repeated().size());
                            detail::for_each_split(layers, pp * chunks, space_.search_stage_boundaries,
                                                   [&](const std::vector<int>& split) {
                                                       c.layers_per_chunk = split;
                                                       visit(c, work_bound);
                                                       return true;
                                                   });
                        }
            }
        }
        result_.stats = stats_;
        result_.stats.schedules_built = ctx_.schedules_built();
        result_.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (!result_.stats.complete && result_.found)
            result_.stats.gap = std::max(0.0, (result_.cost.step_time - open_bound_) / result_.cost.step_time);
        result_.cluster_name = ctx_.hardware().name;
        return result_;
    }

private:
    bool out_of_time() {
        if (ctx_.options().time_budget_seconds <= 0) return false;
        if (!stats_.complete) return true;
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        if (elapsed > ctx_.options().time_budget_seconds) stats_.complete = false;
        return !stats_.complete;
    }

    // True when a node with this lower bound cannot beat the best (or time is up).
    bool cut(double bound) {
        if (out_of_time()) {
            open_bound_ = std::min(open_bound_, bound);
            return true;
        }
        if (result_.found && bound >= result_.cost.step_time) {
            ++stats_.pruned_by_bound;
            return true;
        }
        return false;
    }

    void visit(configuration& c, double work_bound) {
        ++stats_.nodes;
        // Costs with no recompute: the least time any completion can have.
        c.recompute_of.assign(ctx_.repeated().size(), recompute::none);
        evaluation base = evaluate_without_pipeline(ctx_, c);
        double fixed = 0;  // exposed communication and optimizer: the same for every completion
        for (const auto& d : base.devices) fixed = std::max(fixed, d.exposed_communication + d.optimizer);
        if (cut(std::max(work_bound, pipeline_bound(c, base)) + fixed)) return;

        // Recompute: per device, the least extra time that fits.
        const auto layers = layers_of_chunks(ctx_, c);
        const auto& sched = ctx_.schedule_orders(c.schedule, c.pp, c.chunks, c.micro_batches);
        const double share = 1.0 / (static_cast<double>(c.dp) * c.micro_batches);
        std::vector<int> position(ctx_.model().layers.size(), -1);
        for (std::size_t i = 0; i < ctx_.repeated().size(); ++i) position[static_cast<std::size_t>(ctx_.repeated()[i])] = static_cast<int>(i);
        for (int d = 0; d < c.pp; ++d) {
            const device_cost& dc = base.devices[static_cast<std::size_t>(d)];
            double fixed_memory = dc.memory.total() - dc.memory.activations;
            detail::recompute_solver solver(ctx_, space_.recompute_choices);
            solver.nodes = &stats_.knapsack_nodes;
            solver.out_of_time = [this] { return out_of_time(); };
            for (int k = d; k < c.pp * c.chunks; k += c.pp) {
                const double weight = sched.in_flight[static_cast<std::size_t>(k)] * share * ctx_.options().activation_bytes / c.tp;
                std::vector<detail::recompute_group> chunk_groups;
                std::vector<int> group_class;
                for (int l : layers[static_cast<std::size_t>(k)]) {
                    const int pos = position[static_cast<std::size_t>(l)];
                    if (pos < 0) {  // prologue, epilogue: keep everything
                        fixed_memory += weight * ctx_.kept_elements(l, recompute::none);
                        continue;
                    }
                    const int cls = ctx_.model().layers[static_cast<std::size_t>(l)].class_id;
                    auto it = std::find(group_class.begin(), group_class.end(), cls);
                    if (ctx_.options().fold && it != group_class.end()) {
                        chunk_groups[static_cast<std::size_t>(it - group_class.begin())].layers.push_back(pos);
                    } else {
                        group_class.push_back(cls);
                        chunk_groups.push_back({{pos}, weight, share / c.tp});
                    }
                }
                for (auto& g : chunk_groups) solver.groups.push_back(std::move(g));
            }
            solver.budget = ctx_.memory_cap() - fixed_memory;
            const bool solved = solver.solve();
            if (solver.gave_up) {  // the budget ran out inside: this node stays open
                open_bound_ = std::min(open_bound_, std::max(work_bound, pipeline_bound(c, base)) + fixed);
                return;
            }
            if (!solved) {
                ++stats_.pruned_by_memory;
                return;
            }
            for (std::size_t gi = 0; gi < solver.groups.size(); ++gi) {
                std::size_t next = 0;
                for (std::size_t k = 0; k < space_.recompute_choices.size(); ++k)
                    for (int n = 0; n < solver.best_counts[gi][k]; ++n)
                        c.recompute_of[static_cast<std::size_t>(solver.groups[gi].layers[next++])] = space_.recompute_choices[k];
            }
        }
        ++stats_.leaves;
        evaluation e = evaluate(ctx_, c);
        if (e.feasible && (!result_.found || e.step_time < result_.cost.step_time)) {
            result_.found = true;
            result_.best = c;
            result_.cost = std::move(e);
        }
    }

    // Lower bound of the pipeline makespan from per-chunk times without recompute.
    static double pipeline_bound(const configuration& c, const evaluation& base) {
        const int chunks = c.pp * c.chunks;
        double bound = 0;
        for (int d = 0; d < c.pp; ++d) {
            double work = 0;
            for (int k = d; k < chunks; k += c.pp)
                work += base.chunk_forward[static_cast<std::size_t>(k)] + base.chunk_backward[static_cast<std::size_t>(k)];
            bound = std::max(bound, c.micro_batches * work);
        }
        if (c.chunks == 1) {
            double before = 0;
            for (int s = 0; s < c.pp; ++s) {
                const double own = base.chunk_forward[static_cast<std::size_t>(s)] + base.chunk_backward[static_cast<std::size_t>(s)];
                bound = std::max(bound, before + c.micro_batches * own);
                before += own;
            }
        }
        return bound;
    }

    cost_context& ctx_;
    const search_space& space_;
    search_statistics stats_;
    search_result result_;
    double open_bound_ = std::numeric_limits<double>::infinity();
    std::chrono::steady_clock::time_point start_;
};

inline search_result branch_and_bound(cost_context& ctx, const search_space& space) {
    return branch_and_bound_search(ctx, space).run();
}

// Every configuration of the space, each layer's recompute choice on its own: the answer
// branch_and_bound must reproduce. Exponential in the layers; for small spaces only.
inline search_result enumerate_all(cost_context& ctx, const search_space& space) {
    const auto start = std::chrono::steady_clock::now();
    search_result best;
    detail::candidates cand{ctx, space};
    const int devices = ctx.hardware().devices();
    const int layers = static_cast<int>(ctx.repeated().size());
    for (int tp : cand.tp())
        for (int pp : cand.pp(tp)) {
            const int dp = devices / (tp * pp);
            for (zero_stage z : cand.zero(dp))
                for (int m : cand.micro_batches(dp))
                    for (auto [kind, chunks] : cand.schedules(pp, m)) {
                        configuration c{tp, pp, dp, m, chunks, z, kind, {}, {}};
                        detail::for_each_split(layers, pp * chunks, space.search_stage_boundaries, [&](const std::vector<int>& split) {
                            c.layers_per_chunk = split;
                            c.recompute_of.assign(static_cast<std::size_t>(layers), space.recompute_choices.front());
                            std::vector<std::size_t> choice(static_cast<std::size_t>(layers), 0);
                            while (true) {
                                ++best.stats.leaves;
                                for (int l = 0; l < layers; ++l)
                                    c.recompute_of[static_cast<std::size_t>(l)] = space.recompute_choices[choice[static_cast<std::size_t>(l)]];
                                evaluation e = evaluate(ctx, c);
                                if (e.feasible && (!best.found || e.step_time < best.cost.step_time)) {
                                    best.found = true;
                                    best.best = c;
                                    best.cost = std::move(e);
                                }
                                int l = 0;
                                while (l < layers && ++choice[static_cast<std::size_t>(l)] == space.recompute_choices.size())
                                    choice[static_cast<std::size_t>(l++)] = 0;
                                if (l == layers) break;
                            }
                            return true;
                        });
                    }
        }
    best.stats.nodes = best.stats.leaves;
    best.stats.schedules_built = ctx.schedules_built();
    best.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best.cluster_name = ctx.hardware().name;
    return best;
}

inline std::string search_result::explain() const {
    std::ostringstream out;
    if (!found) {
        out << "no configuration of the space fits in memory on " << cluster_name
            << "; allow more recompute, ZeRO stages or devices\n";
        return out.str();
    }
    const configuration& c = best;
    out << "plan for " << cluster_name << ": TP " << c.tp << " x PP " << c.pp << " x DP " << c.dp << ", "
        << c.micro_batches << " micro-batches, " << to_string(c.schedule);
    if (c.chunks > 1) out << " (" << c.chunks << " chunks per device)";
    out << ", ZeRO " << static_cast<int>(c.zero) << "\n  layers per chunk:";
    for (int n : c.layers_per_chunk) out << ' ' << n;
    int counts[3] = {0, 0, 0};
    for (recompute r : c.recompute_of) ++counts[static_cast<int>(r)];
    out << "\n  recompute: " << counts[0] << " layers none, " << counts[1] << " selective, " << counts[2] << " full\n";
    out << "  predicted step " << cost.step_time * 1e3 << " ms (pipeline " << cost.pipeline_time * 1e3 << " ms)";
    out << ", peak memory " << cost.peak_memory() / 1e9 << " GB\n";
    for (std::size_t d = 0; d < cost.devices.size(); ++d) {
        const auto& dc = cost.devices[d];
        out << "  stage " << d << ": memory " << dc.memory.total() / 1e9 << " GB (states "
            << (dc.memory.parameters + dc.memory.gradients + dc.memory.optimizer) / 1e9 << ", activations "
            << dc.memory.activations / 1e9 << "), exposed comm " << dc.exposed_communication * 1e3 << " ms\n";
    }
    out << "  search: " << stats.nodes << " nodes, " << stats.pruned_by_bound << " cut by bound, " << stats.pruned_by_memory
        << " by memory, " << stats.leaves << " timed, " << stats.seconds * 1e3 << " ms";
    if (!stats.complete) out << ", stopped by the time budget with a proven gap of " << stats.gap * 100 << "%";
    out << "\n";
    return out.str();
}

}  // namespace loom::search
// ---- end loom/search/branch_and_bound.hpp ----
// ---- begin loom/search/calibrate_host.hpp ----
// Calibration of the host backend as a cluster the searcher can plan for: n in-process
// ranks on this machine. The only search header that runs kernels: it times loom's host
// GEMM and a streaming copy, and writes what it measured into a profile.
//
//   search::cluster hw = search::calibrate_host(4);   // about 0.3 s
//   search::save_cluster(hw, "host.json");            // or plan with it directly
//
// What is measured and what is assumed:
// - peak_flops_fp32: float GEMMs of 512^3 on the whole thread pool, best of three, divided
//   by the ranks (in-process ranks share the cores); gemm_efficiency 1 since this is what
//   loom's kernels reach. No fp16: plan in precision::fp32.
// - memory_bandwidth: a 64 MiB copy (read + write), best of three, divided by the ranks;
//   elementwise_efficiency 1.
// - memory_bytes: the machine's available memory divided by the ranks.
// - the "intra-node link" is the copy bandwidth of one rank (in-process messages are
//   memory copies) with a 20 us latency per message (a thread hand-off: assumed, not
//   measured). One node, no NICs used.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

// ---- begin loom/runtime/host/gemm.hpp ----
// Row-major GEMM for the host backend.
//
//   C = alpha * op(A) * op(B) + beta * C,   op(A): m x k,  op(B): k x n,  C: m x n
//
// Every matrix is row-major with a leading dimension (the distance between rows as stored):
// A is stored m x k (lda >= k) for transpose::no and k x m (lda >= m) for transpose::yes,
// likewise B is k x n (ldb >= n) or n x k (ldb >= k), and C is m x n (ldc >= n). As in BLAS,
// beta == 0 overwrites C without reading it (NaN in C does not propagate), and alpha == 0 or
// k == 0 gives C = beta * C without reading A or B.
//
// gemm() calls OpenBLAS when the build has it (see cblas_gate.hpp) and gemm_fallback()
// otherwise; inside a parallel_for range it always runs gemm_fallback() on the calling
// thread, so OpenBLAS's threads never pile onto the pool's.
//
// gemm_fallback() is the portable path: op(B) packed once and shared, A packed per panel,
// cache-blocked (an mr x kc panel of A in L1 sweeps a kc x nc block of B in L2), register-
// tiled micro-kernels, and C cut into tiles that the threads of thread_pool::global() take
// first come first served. The AVX-512F or AVX2+FMA micro-kernels are chosen at run time
// (the header needs no -march flag); a plain C++ micro-kernel runs everywhere else. They
// use GCC/Clang target attributes and <immintrin.h>, so this header is for x86-64.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>

// ---- begin loom/runtime/host/cblas_gate.hpp ----
// The one place that looks at LOOM_HAS_CBLAS. The build defines it (to 1) when it links
// OpenBLAS and puts OpenBLAS's cblas.h on the include path; everything else in loom asks
// `has_cblas` and branches with `if constexpr`, so both configurations compile the same code
// and the wrappers in loom::host::cblas exist (and throw) even without CBLAS.
#include <string>


#if defined(LOOM_HAS_CBLAS) && LOOM_HAS_CBLAS
#include <cblas.h>
#endif

namespace loom::host {

#if defined(LOOM_HAS_CBLAS) && LOOM_HAS_CBLAS
inline constexpr bool has_cblas = true;
#else
inline constexpr bool has_cblas = false;
#endif

namespace cblas {

// Row-major GEMM through CBLAS: C = alpha * op(A) * op(B) + beta * C. Sizes are the CBLAS
// `int`; callers check that their 64-bit sizes fit before calling.
#if defined(LOOM_HAS_CBLAS) && LOOM_HAS_CBLAS

inline void sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                  int ldb, float beta, float* c, int ldc) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha,
                a, lda, b, ldb, beta, c, ldc);
}

inline void dgemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a, int lda,
                  const double* b, int ldb, double beta, double* c, int ldc) {
    cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha,
                a, lda, b, ldb, beta, c, ldc);
}

// OpenBLAS keeps its own worker threads; these let callers see and bound them.
inline int library_threads() { return openblas_get_num_threads(); }
inline void set_library_threads(int threads) { openblas_set_num_threads(threads); }

// e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH ... Haswell MAX_THREADS=64" plus the core it picked.
inline std::string library_description() {
    return std::string(openblas_get_config()) + " core=" + openblas_get_corename();
}

#else

[[noreturn]] inline void missing(const char* what) {
    throw usage_error(std::string("cblas::") + what +
                      ": loom was built without CBLAS; build with LOOM_HAS_CBLAS=1 and OpenBLAS's cblas.h, "
                      "or check loom::host::has_cblas first");
}

inline void sgemm(bool, bool, int, int, int, float, const float*, int, const float*, int, float, float*, int) {
    missing("sgemm");
}
inline void dgemm(bool, bool, int, int, int, double, const double*, int, const double*, int, double, double*, int) {
    missing("dgemm");
}
inline int library_threads() { return 0; }
inline void set_library_threads(int) {}
inline std::string library_description() { return "none"; }

#endif

}  // namespace cblas
}  // namespace loom::host
// ---- end loom/runtime/host/cblas_gate.hpp ----
// ---- begin loom/runtime/host/thread_pool.hpp ----
// A fork-join thread pool for the host backend: persistent workers, one parallel_for.
//
//   loom::host::parallel_for(0, rows, 64, [&](std::int64_t lo, std::int64_t hi) { ... });
//
// Law: f is called on disjoint ranges [lo, hi) whose union is [begin, end); every range is at
// least `grain` long except when the whole range is shorter than `grain`. The call returns
// after every range is done, and the calling thread works on ranges too.
//
// Threading contract:
//  - Nested calls (from inside f, on a worker or on the calling thread, into this pool or
//    any other loom pool) run f(begin, end) serially on the thread that makes them, so a
//    parallel kernel may call another parallel kernel without deadlock or oversubscription.
//  - A range shorter than two grains runs inline as f(begin, end), without touching the
//    pool (which stays free for whatever f calls).
//  - Calls from several user threads at once are serialized: one job owns the pool at a
//    time and the other callers block until it finishes. A job never waits for another
//    caller's job, so concurrent callers cannot deadlock (unless f itself blocks on one).
//  - The first exception thrown by f is rethrown on the caller once every range has ended;
//    ranges not yet started when it was thrown are skipped.
//  - The destructor joins the workers. thread_pool::global() lives until static
//    destruction, so do not call parallel_for from other static destructors.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>


namespace loom::host {

namespace detail {

// True while this thread runs a range of some pool's job (or is a pool worker), so nested
// parallel_for calls run inline instead of waiting on a pool that is busy with their parent.
inline bool& inside_parallel_region() noexcept {
    thread_local bool inside = false;
    return inside;
}

class region_guard {
   public:
    region_guard() noexcept : previous_(inside_parallel_region()) { inside_parallel_region() = true; }
    ~region_guard() { inside_parallel_region() = previous_; }
    region_guard(const region_guard&) = delete;
    region_guard& operator=(const region_guard&) = delete;

   private:
    bool previous_;
};

// Parses LOOM_NUM_THREADS; 0 when unset or empty.
inline unsigned thread_count_from_environment() {
    const char* text = std::getenv("LOOM_NUM_THREADS");
    if (text == nullptr || *text == '\0') return 0;
    char* end = nullptr;
    const long value = std::strtol(text, &end, 10);
    if (*end != '\0' || value < 1 || value > 4096) {
        throw usage_error(std::string("thread_pool: LOOM_NUM_THREADS='") + text +
                          "' is not a thread count; set it to an integer in [1, 4096] or unset it");
    }
    return static_cast<unsigned>(value);
}

}  // namespace detail

// LOOM_NUM_THREADS when set, otherwise the number of hardware threads (at least 1).
inline unsigned default_thread_count() {
    if (const unsigned from_environment = detail::thread_count_from_environment()) {
        return from_environment;
    }
    const unsigned hardware = std::thread::hardware_concurrency();
    return hardware == 0 ? 1u : hardware;
}

class thread_pool {
   public:
    // `threads` counts the calling thread, so thread_pool(1) starts no worker at all.
    explicit thread_pool(unsigned threads = default_thread_count()) : size_(threads) {
        if (threads == 0) {
            throw usage_error("thread_pool: threads = 0; pass at least 1 (the calling thread)");
        }
        workers_.reserve(threads - 1);
        try {
            for (unsigned i = 1; i < threads; ++i) {
                workers_.emplace_back([this] { worker_loop(); });
            }
        } catch (...) {
            shut_down();
            throw;
        }
    }

    ~thread_pool() { shut_down(); }

    thread_pool(const thread_pool&) = delete;
    thread_pool& operator=(const thread_pool&) = delete;

    unsigned size() const noexcept { return size_; }

    template <class F>
    void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain, F&& f) {
        if (end <= begin) return;
        if (grain < 1) grain = 1;
        const std::int64_t length = end - begin;
        // Below two grains there is only one legal range (length / 2 < grain is
        // length < 2 * grain without overflow); nested calls must not wait on a pool whose
        // workers may be busy with their parent job. An inline call does not mark the thread
        // as inside a region: f may still use the (idle) pool.
        if (length / 2 < grain || size_ == 1 || detail::inside_parallel_region()) {
            f(begin, end);
            return;
        }
        // A few ranges per thread, handed out first come first served, so a thread that
        // starts late or runs on a busy core takes fewer of them.
        const std::int64_t most_ranges = length / grain;
        const std::int64_t ranges = std::min<std::int64_t>(most_ranges, ranges_per_thread * std::int64_t{size_});

        using functor = std::remove_reference_t<F>;
        job_description description;
        description.invoke = [](void* context, std::int64_t lo, std::int64_t hi) {
            (*static_cast<functor*>(context))(lo, hi);
        };
        description.context = const_cast<void*>(static_cast<const void*>(std::addressof(f)));
        description.begin = begin;
        description.length = length;
        description.ranges = ranges;
        run(description);
    }

    // The process-wide pool, created on first use with default_thread_count() threads.
    static thread_pool& global() {
        static thread_pool pool;
        return pool;
    }

   private:
    struct job_description {
        void (*invoke)(void*, std::int64_t, std::int64_t) = nullptr;
        void* context = nullptr;
        std::int64_t begin = 0;
        std::int64_t length = 0;
        std::int64_t ranges = 0;
    };

    // Spins this many polls before blocking: a worker woken for back-to-back jobs (the
    // layers of one step) skips the futex round trip, and gives its core back soon after.
    static constexpr int spin_polls = 1 << 14;
    static constexpr std::int64_t ranges_per_thread = 4;

    void run(const job_description& description) {
        std::lock_guard<std::mutex> one_job_at_a_time(submit_mutex_);
        {
            std::unique_lock<std::mutex> lock(mutex_);
            // Workers that took part in the previous job may still be leaving it.
            idle_cv_.wait(lock, [this] { return busy_workers_ == 0; });
            job_ = description;
            next_range_.store(0, std::memory_order_relaxed);
            unfinished_ranges_.store(description.ranges, std::memory_order_relaxed);
            failed_.store(false, std::memory_order_relaxed);
            failure_ = nullptr;
            generation_.store(generation_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
        }
        work_cv_.notify_all();

        {
            detail::region_guard guard;
            work_on(description);
        }

        for (int poll = 0; poll < spin_polls; ++poll) {
            if (unfinished_ranges_.load(std::memory_order_acquire) == 0) break;
        }
        std::unique_lock<std::mutex> lock(mutex_);
        done_cv_.wait(lock, [this] { return unfinished_ranges_.load(std::memory_order_acquire) == 0; });
        if (failure_) {
            std::exception_ptr failure = std::move(failure_);
            failure_ = nullptr;
            std::rethrow_exception(failure);
        }
    }

    // Takes ranges until none is left. Range r is [begin + r*length/ranges, begin + (r+1)*length/ranges),
    // so every range has floor or ceil of length/ranges >= grain elements.
    void work_on(const job_description& description) {
        for (;;) {
            const std::int64_t r = next_range_.fetch_add(1, std::memory_order_relaxed);
            if (r >= description.ranges) return;
            if (!failed_.load(std::memory_order_relaxed)) {
                const std::int64_t lo = description.begin + r * description.length / description.ranges;
                const std::int64_t hi = description.begin + (r + 1) * description.length / description.ranges;
                try {
                    description.invoke(description.context, lo, hi);
                } catch (...) {
                    std::lock_guard<std::mutex> lock(mutex_);
                    if (!failure_) failure_ = std::current_exception();
                    failed_.store(true, std::memory_order_relaxed);
                }
            }
            if (unfinished_ranges_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
                // Taking the mutex orders this notify after the caller's predicate check.
                std::lock_guard<std::mutex> lock(mutex_);
                done_cv_.notify_all();
            }
        }
    }

    void worker_loop() {
        detail::inside_parallel_region() = true;
        std::uint64_t seen = 0;
        for (;;) {
            for (int poll = 0; poll < spin_polls; ++poll) {
                if (generation_.load(std::memory_order_acquire) != seen) break;
            }
            job_description description;
            {
                std::unique_lock<std::mutex> lock(mutex_);
                work_cv_.wait(lock, [&] { return stopping_ || generation_.load(std::memory_order_relaxed) != seen; });
                if (stopping_) return;
                seen = generation_.load(std::memory_order_relaxed);
                description = job_;
                ++busy_workers_;
            }
            work_on(description);
            {
                std::lock_guard<std::mutex> lock(mutex_);
                --busy_workers_;
                if (busy_workers_ == 0) idle_cv_.notify_all();
            }
        }
    }

    void shut_down() noexcept {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
        }
        work_cv_.notify_all();
        for (std::thread& worker : workers_) {
            if (worker.joinable()) worker.join();
        }
        workers_.clear();
    }

    unsigned size_;
    std::vector<std::thread> workers_;

    std::mutex submit_mutex_;
    std::mutex mutex_;
    std::condition_variable work_cv_;
    std::condition_variable done_cv_;
    std::condition_variable idle_cv_;

    // Guarded by mutex_ (generation_ is also polled without it while spinning).
    job_description job_;
    std::atomic<std::uint64_t> generation_{0};
    unsigned busy_workers_ = 0;
    bool stopping_ = false;
    std::exception_ptr failure_;

    std::atomic<std::int64_t> next_range_{0};
    std::atomic<std::int64_t> unfinished_ranges_{0};
    std::atomic<bool> failed_{false};
};

// parallel_for on thread_pool::global().
template <class F>
void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain, F&& f) {
    thread_pool::global().parallel_for(begin, end, grain, std::forward<F>(f));
}

}  // namespace loom::host
// ---- end loom/runtime/host/thread_pool.hpp ----

namespace loom::host {

enum class transpose : bool { no, yes };

// The instruction sets gemm_fallback has micro-kernels for.
enum class gemm_isa { portable, avx2_fma, avx512f };

inline const char* to_string(gemm_isa isa) noexcept {
    switch (isa) {
        case gemm_isa::portable: return "portable";
        case gemm_isa::avx2_fma: return "avx2_fma";
        case gemm_isa::avx512f: return "avx512f";
    }
    return "unknown";
}

// Whether this CPU (and OS) can run the micro-kernel for `isa`.
inline bool gemm_isa_supported(gemm_isa isa) noexcept {
    // Needed before main (static initializers); cheap and idempotent after.
    __builtin_cpu_init();
    switch (isa) {
        case gemm_isa::portable: return true;
        case gemm_isa::avx2_fma: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        case gemm_isa::avx512f: return __builtin_cpu_supports("avx512f");
    }
    return false;
}

// The fastest supported micro-kernel, decided once per process.
inline gemm_isa gemm_best_isa() noexcept {
    static const gemm_isa best = gemm_isa_supported(gemm_isa::avx512f)    ? gemm_isa::avx512f
                                 : gemm_isa_supported(gemm_isa::avx2_fma) ? gemm_isa::avx2_fma
                                                                          : gemm_isa::portable;
    return best;
}

// Which implementation gemm() uses outside parallel regions.
//   LOOM_GEMM=cblas | loom   chooses explicitly (cblas needs a build with OpenBLAS);
//   otherwise                loom's kernels on CPUs with AVX-512, where they measured faster
//                            than OpenBLAS 0.3.21's default kernels and do not keep spinning
//                            threads that compete with loom's pool (benchmarks/RESULTS.md),
//                            else CBLAS when built with it, else loom's kernels.
enum class gemm_backend { cblas, loom };

inline gemm_backend selected_gemm_backend() {
    static const gemm_backend chosen = [] {
        if (const char* env = std::getenv("LOOM_GEMM"); env && *env) {
            const std::string_view v(env);
            if (v == "loom") return gemm_backend::loom;
            if (v == "cblas") {
                if (!has_cblas)
                    throw usage_error("LOOM_GEMM=cblas: this build has no CBLAS; install libopenblas-dev and "
                                      "configure with LOOM_USE_CBLAS=ON, or unset LOOM_GEMM");
                return gemm_backend::cblas;
            }
            throw usage_error("LOOM_GEMM=" + std::string(v) + ": expected 'cblas' or 'loom'");
        }
        if (!has_cblas || gemm_best_isa() == gemm_isa::avx512f) return gemm_backend::loom;
        return gemm_backend::cblas;
    }();
    return chosen;
}

// True when gemm() calls CBLAS (OpenBLAS) rather than gemm_fallback() (outside parallel regions).
inline bool gemm_uses_cblas() { return selected_gemm_backend() == gemm_backend::cblas; }

namespace detail::gemm {

// ---------------------------------------------------------------------------------------
// Micro-kernels. Each computes one MR x NR tile of C from packed panels:
//   C[i][j] = alpha * sum_p a[p*MR + i] * b[p*NR + j] + beta * C[i][j]   (0 <= i < MR, 0 <= j < NR)
// and does not read C when beta == 0.

template <class T, int MR, int NR>
void micro_kernel_portable(std::int64_t kc, const T* __restrict a, const T* __restrict b, T* __restrict c,
                           std::int64_t ldc, T alpha, T beta) {
    T acc[MR][NR] = {};
    for (std::int64_t p = 0; p < kc; ++p) {
        for (int i = 0; i < MR; ++i) {
            const T ai = a[i];
            for (int j = 0; j < NR; ++j) acc[i][j] += ai * b[j];
        }
        a += MR;
        b += NR;
    }
    for (int i = 0; i < MR; ++i) {
        T* row = c + i * ldc;
        if (beta == T(0)) {
            for (int j = 0; j < NR; ++j) row[j] = alpha * acc[i][j];
        } else {
            for (int j = 0; j < NR; ++j) row[j] = alpha * acc[i][j] + beta * row[j];
        }
    }
}

// Thin overloads over the intrinsics so one kernel body serves float and double.
struct avx2_ops {
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline __m256 zero(float) { return _mm256_setzero_ps(); }
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline __m256d zero(double) { return _mm256_setzero_pd(); }
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline __m256 load(const float* p) {
        return _mm256_loadu_ps(p);
    }
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline __m256d load(const double* p) {
        return _mm256_loadu_pd(p);
    }
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline void store(float* p, __m256 v) {
        _mm256_storeu_ps(p, v);
    }
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline void store(double* p, __m256d v) {
        _mm256_storeu_pd(p, v);
    }
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline __m256 broadcast(float x) {
        return _mm256_set1_ps(x);
    }
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline __m256d broadcast(double x) {
        return _mm256_set1_pd(x);
    }
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline __m256 mul(__m256 x, __m256 y) {
        return _mm256_mul_ps(x, y);
    }
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline __m256d mul(__m256d x, __m256d y) {
        return _mm256_mul_pd(x, y);
    }
    // x * y + z with one rounding.
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline __m256 fma(__m256 x, __m256 y, __m256 z) {
        return _mm256_fmadd_ps(x, y, z);
    }
    [[gnu::always_inline, gnu::target("avx2,fma")]] static inline __m256d fma(__m256d x, __m256d y, __m256d z) {
        return _mm256_fmadd_pd(x, y, z);
    }
};

struct avx512_ops {
    [[gnu::always_inline, gnu::target("avx512f")]] static inline __m512 zero(float) { return _mm512_setzero_ps(); }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline __m512d zero(double) { return _mm512_setzero_pd(); }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline __m512 load(const float* p) {
        return _mm512_loadu_ps(p);
    }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline __m512d load(const double* p) {
        return _mm512_loadu_pd(p);
    }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline void store(float* p, __m512 v) {
        _mm512_storeu_ps(p, v);
    }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline void store(double* p, __m512d v) {
        _mm512_storeu_pd(p, v);
    }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline __m512 broadcast(float x) { return _mm512_set1_ps(x); }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline __m512d broadcast(double x) {
        return _mm512_set1_pd(x);
    }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline __m512 mul(__m512 x, __m512 y) {
        return _mm512_mul_ps(x, y);
    }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline __m512d mul(__m512d x, __m512d y) {
        return _mm512_mul_pd(x, y);
    }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline __m512 fma(__m512 x, __m512 y, __m512 z) {
        return _mm512_fmadd_ps(x, y, z);
    }
    [[gnu::always_inline, gnu::target("avx512f")]] static inline __m512d fma(__m512d x, __m512d y, __m512d z) {
        return _mm512_fmadd_pd(x, y, z);
    }
};

// The SIMD kernel bodies are identical up to the ops type; the target attribute cannot be a
// template argument, so there is one body per instruction set. NV vectors span NR columns.
template <class T, int MR, int NV>
[[gnu::target("avx2,fma")]] void micro_kernel_avx2(std::int64_t kc, const T* __restrict a, const T* __restrict b,
                                                   T* __restrict c, std::int64_t ldc, T alpha, T beta) {
    using ops = avx2_ops;
    using vec = decltype(ops::zero(T{}));
    constexpr int width = static_cast<int>(sizeof(vec) / sizeof(T));
    vec acc[MR][NV];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[i][v] = ops::zero(T{});
    for (std::int64_t p = 0; p < kc; ++p) {
        vec bv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) bv[v] = ops::load(b + v * width);
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) {
            const vec ai = ops::broadcast(a[i]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) acc[i][v] = ops::fma(ai, bv[v], acc[i][v]);
        }
        a += MR;
        b += NV * width;
    }
    const vec alpha_v = ops::broadcast(alpha);
    const vec beta_v = ops::broadcast(beta);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
        T* row = c + i * ldc;
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            const vec scaled = ops::mul(alpha_v, acc[i][v]);
            ops::store(row + v * width, beta == T(0) ? scaled : ops::fma(beta_v, ops::load(row + v * width), scaled));
        }
    }
}

template <class T, int MR, int NV>
[[gnu::target("avx512f")]] void micro_kernel_avx512(std::int64_t kc, const T* __restrict a, const T* __restrict b,
                                                    T* __restrict c, std::int64_t ldc, T alpha, T beta) {
    using ops = avx512_ops;
    using vec = decltype(ops::zero(T{}));
    constexpr int width = static_cast<int>(sizeof(vec) / sizeof(T));
    vec acc[MR][NV];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[i][v] = ops::zero(T{});
    for (std::int64_t p = 0; p < kc; ++p) {
        vec bv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) bv[v] = ops::load(b + v * width);
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) {
            const vec ai = ops::broadcast(a[i]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) acc[i][v] = ops::fma(ai, bv[v], acc[i][v]);
        }
        a += MR;
        b += NV * width;
    }
    const vec alpha_v = ops::broadcast(alpha);
    const vec beta_v = ops::broadcast(beta);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
        T* row = c + i * ldc;
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            const vec scaled = ops::mul(alpha_v, acc[i][v]);
            ops::store(row + v * width, beta == T(0) ? scaled : ops::fma(beta_v, ops::load(row + v * width), scaled));
        }
    }
}

// Copies `panels` runs of NV vectors from src (contiguous) to dst + q * panel_stride: one row
// of B dealt out to its packed panels. Written with the ISA's vectors because a plain copy
// loop becomes a memmove call per run.
template <class T, int NV>
[[gnu::target("avx2,fma")]] void deal_row_avx2(const T* __restrict src, T* __restrict dst, std::int64_t panels,
                                               std::int64_t panel_stride) {
    using ops = avx2_ops;
    constexpr int width = static_cast<int>(sizeof(decltype(ops::zero(T{}))) / sizeof(T));
    for (std::int64_t q = 0; q < panels; ++q) {
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v)
            ops::store(dst + q * panel_stride + v * width, ops::load(src + (q * NV + v) * width));
    }
}

template <class T, int NV>
[[gnu::target("avx512f")]] void deal_row_avx512(const T* __restrict src, T* __restrict dst, std::int64_t panels,
                                                std::int64_t panel_stride) {
    using ops = avx512_ops;
    constexpr int width = static_cast<int>(sizeof(decltype(ops::zero(T{}))) / sizeof(T));
    for (std::int64_t q = 0; q < panels; ++q) {
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v)
            ops::store(dst + q * panel_stride + v * width, ops::load(src + (q * NV + v) * width));
    }
}

template <class T, int NR>
void deal_row_portable(const T* __restrict src, T* __restrict dst, std::int64_t panels, std::int64_t panel_stride) {
    for (std::int64_t q = 0; q < panels; ++q) {
        for (int j = 0; j < NR; ++j) dst[q * panel_stride + j] = src[q * NR + j];
    }
}

// Packs rows [i0, i0 + rows) x columns [p0, p0 + depth) of a row-major A into an MR-wide
// panel (out[p*MR + i], zero past `rows`): a transpose. The rows are read a cache line at a
// time in step, so their misses overlap, and lines ahead are prefetched: A is often read
// from memory exactly once (when n <= nc).
template <int MR, class T>
void pack_a_rows_scalar(const T* a, std::int64_t lda, std::int64_t i0, std::int64_t rows, std::int64_t p0,
                        std::int64_t depth, T* __restrict out) {
    constexpr std::int64_t line = 64 / sizeof(T);
    for (std::int64_t pl = 0; pl < depth; pl += line) {
        const std::int64_t pe = std::min(depth, pl + line);
        for (std::int64_t i = 0; i < rows; ++i) {
            const T* src = a + (i0 + i) * lda + p0;
            __builtin_prefetch(src + pl + 4 * line);
            for (std::int64_t p = pl; p < pe; ++p) out[p * MR + i] = src[p];
        }
        for (std::int64_t i = rows; i < MR; ++i) {
            for (std::int64_t p = pl; p < pe; ++p) out[p * MR + i] = T(0);
        }
    }
}

// The same with one AVX-512 gather per column of the panel (two for double): about twice
// the scalar rate, which stores one element per instruction.
template <int MR, class T>
[[gnu::target("avx512f")]] void pack_a_rows_avx512(const T* a, std::int64_t lda, std::int64_t i0, std::int64_t rows,
                                                   std::int64_t p0, std::int64_t depth, T* __restrict out) {
    static_assert(MR <= 16, "pack_a_rows_avx512: one 16-lane index vector covers at most 16 rows");
    // Gather offsets are 32-bit.
    if ((MR - 1) * lda > INT32_MAX) {
        pack_a_rows_scalar<MR>(a, lda, i0, rows, p0, depth, out);
        return;
    }
    alignas(64) std::int32_t offsets[16] = {};
    for (int i = 0; i < MR; ++i) offsets[i] = static_cast<std::int32_t>(i * lda);
    const T* base = a + i0 * lda + p0;
    if constexpr (std::is_same_v<T, float>) {
        const __m512i index = _mm512_load_si512(offsets);
        const __mmask16 present = static_cast<__mmask16>((1u << rows) - 1);
        const __mmask16 panel = static_cast<__mmask16>((1u << MR) - 1);
        for (std::int64_t p = 0; p < depth; ++p) {
            const __m512 column = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), present, index, base + p, 4);
            _mm512_mask_storeu_ps(out + p * MR, panel, column);
        }
    } else {
        const __m256i index_low = _mm256_load_si256(reinterpret_cast<const __m256i*>(offsets));
        const __m256i index_high = _mm256_load_si256(reinterpret_cast<const __m256i*>(offsets + 8));
        const unsigned present = (1u << rows) - 1;
        const __mmask8 present_low = static_cast<__mmask8>(present & 0xff);
        const __mmask8 present_high = static_cast<__mmask8>(present >> 8);
        const __mmask8 panel_low = static_cast<__mmask8>(((1u << MR) - 1) & 0xff);
        const __mmask8 panel_high = static_cast<__mmask8>(((1u << MR) - 1) >> 8);
        for (std::int64_t p = 0; p < depth; ++p) {
            const __m512d low = _mm512_mask_i32gather_pd(_mm512_setzero_pd(), present_low, index_low, base + p, 8);
            _mm512_mask_storeu_pd(out + p * MR, panel_low, low);
            if constexpr (MR > 8) {
                const __m512d high =
                    _mm512_mask_i32gather_pd(_mm512_setzero_pd(), present_high, index_high, base + p, 8);
                _mm512_mask_storeu_pd(out + p * MR + 8, panel_high, high);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Kernel descriptions: tile shape, cache blocking and the kernel itself.
//   mr x nr: the register tile. kc: depth of one packed block, so an mr x kc panel of A
//   stays in L1 while it sweeps the packed kc x nc block of B, which stays in L2.

template <class T, gemm_isa Isa>
struct kernel_config;

template <class T>
struct kernel_config<T, gemm_isa::portable> {
    static constexpr int mr = 4;
    static constexpr int nr = 32 / static_cast<int>(sizeof(T));
    static constexpr std::int64_t kc = 256;
    static constexpr std::int64_t nc = 1024;
    static void run(std::int64_t k, const T* a, const T* b, T* c, std::int64_t ldc, T alpha, T beta) {
        micro_kernel_portable<T, mr, nr>(k, a, b, c, ldc, alpha, beta);
    }
    static void deal_row(const T* src, T* dst, std::int64_t panels, std::int64_t panel_stride) {
        deal_row_portable<T, nr>(src, dst, panels, panel_stride);
    }
    static void pack_a_rows(const T* a, std::int64_t lda, std::int64_t i0, std::int64_t rows, std::int64_t p0,
                            std::int64_t depth, T* out) {
        pack_a_rows_scalar<mr>(a, lda, i0, rows, p0, depth, out);
    }
};

template <class T>
struct kernel_config<T, gemm_isa::avx2_fma> {
    // 6 x 2 vectors: 12 accumulators + 2 B vectors + 1 broadcast of the 16 ymm registers.
    static constexpr int mr = 6;
    static constexpr int nr = 2 * 32 / static_cast<int>(sizeof(T));
    static constexpr std::int64_t kc = 256;
    static constexpr std::int64_t nc = 1024;
    static void run(std::int64_t k, const T* a, const T* b, T* c, std::int64_t ldc, T alpha, T beta) {
        micro_kernel_avx2<T, mr, 2>(k, a, b, c, ldc, alpha, beta);
    }
    static void deal_row(const T* src, T* dst, std::int64_t panels, std::int64_t panel_stride) {
        deal_row_avx2<T, 2>(src, dst, panels, panel_stride);
    }
    static void pack_a_rows(const T* a, std::int64_t lda, std::int64_t i0, std::int64_t rows, std::int64_t p0,
                            std::int64_t depth, T* out) {
        pack_a_rows_scalar<mr>(a, lda, i0, rows, p0, depth, out);
    }
};

template <class T>
struct kernel_config<T, gemm_isa::avx512f> {
    // 12 x 2 vectors: 24 accumulators + 2 B vectors + 1 broadcast of the 32 zmm registers.
    static constexpr int mr = 12;
    static constexpr int nr = 2 * 64 / static_cast<int>(sizeof(T));
    static constexpr std::int64_t kc = 256;
    static constexpr std::int64_t nc = 1024;
    static void run(std::int64_t k, const T* a, const T* b, T* c, std::int64_t ldc, T alpha, T beta) {
        micro_kernel_avx512<T, mr, 2>(k, a, b, c, ldc, alpha, beta);
    }
    static void deal_row(const T* src, T* dst, std::int64_t panels, std::int64_t panel_stride) {
        deal_row_avx512<T, 2>(src, dst, panels, panel_stride);
    }
    static void pack_a_rows(const T* a, std::int64_t lda, std::int64_t i0, std::int64_t rows, std::int64_t p0,
                            std::int64_t depth, T* out) {
        pack_a_rows_avx512<mr>(a, lda, i0, rows, p0, depth, out);
    }
};

// ---------------------------------------------------------------------------------------
// Packing. A packed A panel holds op(A)[i0 + i][p0 + p] at a[p*MR + i]. A packed slice of B
// (depth rows of op(B) starting at p0) is a row of NR-wide panels, panel q holding
// op(B)[p0 + p][q*NR + j] at q*NR*depth + p*NR + j. Rows and columns past the matrix edge
// are zero, so edge tiles run the full kernel. Full-width runs use fixed trip counts so the
// compiler vectorizes them at any -march.

template <class Config, class T>
void pack_a(transpose ta, const T* a, std::int64_t lda, std::int64_t i0, std::int64_t rows, std::int64_t p0,
            std::int64_t depth, T* __restrict out) {
    constexpr int MR = Config::mr;
    if (ta == transpose::no) {
        Config::pack_a_rows(a, lda, i0, rows, p0, depth, out);
    } else {
        // op(A)[i][p] = a[p*lda + i]: each column of the panel is contiguous in A.
        for (std::int64_t p = 0; p < depth; ++p) {
            const T* src = a + (p0 + p) * lda + i0;
            T* dst = out + p * MR;
            if (rows == MR) {
                // A constant-size memcpy is expanded inline; the equivalent loop would
                // become a memmove call.
                std::memcpy(dst, src, MR * sizeof(T));
            } else {
                for (std::int64_t i = 0; i < MR; ++i) dst[i] = i < rows ? src[i] : T(0);
            }
        }
    }
}

// Packs the panels of columns [j0, j0 + cols) of a slice; j0 is a multiple of NR.
template <class Config, class T>
void pack_b(transpose tb, const T* b, std::int64_t ldb, std::int64_t p0, std::int64_t depth, std::int64_t j0,
            std::int64_t cols, T* __restrict out) {
    constexpr int NR = Config::nr;
    const std::int64_t full_panels = cols / NR;
    const std::int64_t tail = cols - full_panels * NR;
    if (tb == transpose::no) {
        // op(B)[p][j] = b[p*ldb + j]: read B row by row (sequential, so prefetched) and deal
        // each row out to the panels.
        for (std::int64_t p = 0; p < depth; ++p) {
            const T* src = b + (p0 + p) * ldb + j0;
            T* dst = out + p * NR;
            Config::deal_row(src, dst, full_panels, NR * depth);
            if (tail > 0) {
                T* last = dst + full_panels * NR * depth;
                for (std::int64_t j = 0; j < NR; ++j) last[j] = j < tail ? src[full_panels * NR + j] : T(0);
            }
        }
        return;
    }
    // op(B)[p][j] = b[j*ldb + p]: columns of a panel are contiguous in B; a cache line of
    // depth at a time keeps the writes within a few lines.
    constexpr std::int64_t step = 64 / sizeof(T);
    for (std::int64_t q = 0; q * NR < cols; ++q) {
        const std::int64_t width = q < full_panels ? NR : tail;
        T* panel = out + q * NR * depth;
        for (std::int64_t pl = 0; pl < depth; pl += step) {
            const std::int64_t pe = std::min(depth, pl + step);
            for (std::int64_t j = 0; j < width; ++j) {
                const T* src = b + (j0 + q * NR + j) * ldb + p0;
                for (std::int64_t p = pl; p < pe; ++p) panel[p * NR + j] = src[p];
            }
            for (std::int64_t j = width; j < NR; ++j) {
                for (std::int64_t p = pl; p < pe; ++p) panel[p * NR + j] = T(0);
            }
        }
    }
}

// Packing storage kept between calls, so steady-state GEMMs neither allocate nor fault in
// fresh pages. Grows to the largest request seen; 64-byte aligned.
class pack_storage {
   public:
    pack_storage() = default;
    pack_storage(const pack_storage&) = delete;
    pack_storage& operator=(const pack_storage&) = delete;
    ~pack_storage() { release(); }

    void* get(std::size_t bytes) {
        if (bytes > capacity_) {
            release();
            data_ = ::operator new (bytes, std::align_val_t{64});
            capacity_ = bytes;
        }
        return data_;
    }

   private:
    void release() noexcept {
        if (data_ != nullptr) ::operator delete (data_, std::align_val_t{64});
        data_ = nullptr;
        capacity_ = 0;
    }
    void* data_ = nullptr;
    std::size_t capacity_ = 0;
};

// One A panel per thread.
inline pack_storage& a_panel_storage() {
    thread_local pack_storage storage;
    return storage;
}
// One B slice per thread, for single-tile products.
inline pack_storage& b_slice_storage() {
    thread_local pack_storage storage;
    return storage;
}
// All of op(B), packed by the calling thread's team and shared by its tiles. Kept only up
// to shared_b_keep_bytes; a larger packed B (an LM head's vocabulary projection) is
// allocated for the one call, so the cache never pins that much memory.
inline constexpr std::size_t shared_b_keep_bytes = std::size_t{32} << 20;
inline pack_storage& b_shared_storage() {
    thread_local pack_storage storage;
    return storage;
}

struct problem {
    transpose ta, tb;
    std::int64_t m, n, k;
    std::int64_t lda, ldb, ldc;
};

// Where a tile finds packed B: either all of op(B) packed up front (slice pc at
// shared + pc * padded_n, so column j's panel sits at shared + pc * padded_n + j * depth),
// or nothing, and the tile packs each slice it needs into its own buffer.
template <class T>
struct packed_b_source {
    const T* shared = nullptr;
    std::int64_t padded_n = 0;
};

// C[i0..i1, j0..j1] on the calling thread; i0 and j0 are multiples of the register tile.
// Needs alpha != 0 and k > 0.
template <class T, gemm_isa Isa>
void multiply_tile(const problem& s, T alpha, const T* a, const T* b, T beta, T* c, std::int64_t i0, std::int64_t i1,
                   std::int64_t j0, std::int64_t j1, packed_b_source<T> source) {
    using config = kernel_config<T, Isa>;
    constexpr int mr = config::mr;
    constexpr int nr = config::nr;
    const std::int64_t block_depth = std::min<std::int64_t>(config::kc, s.k);
    T* packed_a = static_cast<T*>(a_panel_storage().get(sizeof(T) * static_cast<std::size_t>(mr * block_depth)));
    T* local_b = nullptr;
    if (source.shared == nullptr) {
        const std::int64_t block_cols = std::min<std::int64_t>(config::nc, (j1 - j0 + nr - 1) / nr * nr);
        local_b =
            static_cast<T*>(b_slice_storage().get(sizeof(T) * static_cast<std::size_t>(block_cols * block_depth)));
    }
    alignas(64) T edge[mr * nr];

    for (std::int64_t jc = j0; jc < j1; jc += config::nc) {
        const std::int64_t cols = std::min<std::int64_t>(config::nc, j1 - jc);
        for (std::int64_t pc = 0; pc < s.k; pc += config::kc) {
            const std::int64_t depth = std::min<std::int64_t>(config::kc, s.k - pc);
            // Later depth blocks accumulate onto what the first one wrote.
            const T beta_block = pc == 0 ? beta : T(1);
            const T* slice = nullptr;
            if (source.shared != nullptr) {
                slice = source.shared + pc * source.padded_n + jc * depth;
            } else {
                pack_b<config>(s.tb, b, s.ldb, pc, depth, jc, cols, local_b);
                slice = local_b;
            }
            for (std::int64_t ic = i0; ic < i1; ic += mr) {
                const std::int64_t rows = std::min<std::int64_t>(mr, i1 - ic);
                pack_a<config>(s.ta, a, s.lda, ic, rows, pc, depth, packed_a);
                for (std::int64_t jr = 0; jr < cols; jr += nr) {
                    const std::int64_t width = std::min<std::int64_t>(nr, cols - jr);
                    T* c_tile = c + ic * s.ldc + jc + jr;
                    const T* b_panel = slice + jr * depth;
                    if (rows == mr && width == nr) {
                        config::run(depth, packed_a, b_panel, c_tile, s.ldc, alpha, beta_block);
                        continue;
                    }
                    config::run(depth, packed_a, b_panel, edge, nr, T(1), T(0));
                    for (std::int64_t i = 0; i < rows; ++i) {
                        T* row = c_tile + i * s.ldc;
                        const T* sum = edge + i * nr;
                        if (beta_block == T(0)) {
                            for (std::int64_t j = 0; j < width; ++j) row[j] = alpha * sum[j];
                        } else {
                            for (std::int64_t j = 0; j < width; ++j) row[j] = alpha * sum[j] + beta_block * row[j];
                        }
                    }
                }
            }
        }
    }
}

// C = beta * C over m x n, not reading C when beta == 0.
template <class T>
void scale_c(std::int64_t m, std::int64_t n, T beta, T* c, std::int64_t ldc) {
    if (beta == T(1)) return;
    for (std::int64_t i = 0; i < m; ++i) {
        T* row = c + i * ldc;
        if (beta == T(0)) {
            std::fill(row, row + n, T(0));
        } else {
            for (std::int64_t j = 0; j < n; ++j) row[j] *= beta;
        }
    }
}

// How C is cut into tiles: row_parts x col_parts tiles of whole register tiles, handed out
// one at a time to the threads that are free, so a slow or busy core takes fewer of them.
struct tile_plan {
    std::int64_t row_parts = 1;
    std::int64_t col_parts = 1;
    std::int64_t tiles() const { return row_parts * col_parts; }
};

// Picks the plan with the least estimated time, counted in flops of kernel work:
//   one tile:   the tile, packing its own B
//   many tiles: packing op(B) once, shared by the threads, + the work of all tiles / threads
//               + the largest tile * (threads - 1) / threads (the expected tail of the join)
// where a tile costs its (padded) multiply-adds, packing its A panels once per nc-wide block
// of its columns, reading its packed B, and a fixed start-up.
inline tile_plan plan_tiles(std::int64_t m, std::int64_t n, std::int64_t k, int mr, int nr, std::int64_t nc,
                            unsigned threads) {
    constexpr double pack_cost = 30;        // flops per packed element
    constexpr double stream_cost = 12;      // flops per element of packed B read back from L3
    constexpr double tile_cost = 2e4;       // flops to start a tile
    constexpr double fork_join_cost = 4e5;  // flops per fork-join of the pool (twice: pack, multiply)
    const std::int64_t row_units = (m + mr - 1) / mr;
    const std::int64_t col_units = (n + nr - 1) / nr;
    const double depth = static_cast<double>(k);
    const auto cost_of_tile = [&](std::int64_t rows, std::int64_t cols, bool packs_b) {
        const double column_blocks = static_cast<double>((cols + nc - 1) / nc);
        return 2.0 * rows * cols * depth + pack_cost * depth * rows * column_blocks +
               (packs_b ? pack_cost : stream_cost) * depth * cols + tile_cost;
    };
    tile_plan best;
    double best_cost = cost_of_tile(row_units * mr, col_units * nr, true);
    if (threads <= 1) return best;
    const double team = threads;
    const double shared_pack = pack_cost * depth * col_units * nr / team + 2 * fork_join_cost;
    const std::int64_t most = 8 * static_cast<std::int64_t>(threads);
    for (std::int64_t row_parts = 1; row_parts <= std::min(row_units, most); ++row_parts) {
        for (std::int64_t col_parts = 1; col_parts <= std::min(col_units, most); ++col_parts) {
            if (row_parts * col_parts == 1) continue;
            const std::int64_t rows = (row_units + row_parts - 1) / row_parts * mr;
            const std::int64_t cols = (col_units + col_parts - 1) / col_parts * nr;
            const double one = cost_of_tile(rows, cols, false);
            const double cost = shared_pack + row_parts * col_parts * one / team + one * (team - 1) / team;
            if (cost < best_cost) {
                best = {row_parts, col_parts};
                best_cost = cost;
            }
        }
    }
    return best;
}

template <class T, gemm_isa Isa>
void multiply(thread_pool& pool, const problem& s, T alpha, const T* a, const T* b, T beta, T* c) {
    using config = kernel_config<T, Isa>;
    constexpr int mr = config::mr;
    constexpr int nr = config::nr;
    // A gemm inside a parallel region runs on its own thread (parallel_for would be serial).
    const unsigned threads = host::detail::inside_parallel_region() ? 1u : pool.size();
    const tile_plan plan = plan_tiles(s.m, s.n, s.k, mr, nr, config::nc, threads);
    if (plan.tiles() == 1) {
        multiply_tile<T, Isa>(s, alpha, a, b, beta, c, 0, s.m, 0, s.n, {});
        return;
    }

    // Phase 1: pack all of op(B), one (slice, nc-wide column block) per job.
    const std::int64_t col_units = (s.n + nr - 1) / nr;
    const std::int64_t padded_n = col_units * nr;
    const std::size_t shared_bytes = sizeof(T) * static_cast<std::size_t>(padded_n * s.k);
    pack_storage one_call;
    pack_storage& storage = shared_bytes <= shared_b_keep_bytes ? b_shared_storage() : one_call;
    T* shared = static_cast<T*>(storage.get(shared_bytes));
    const std::int64_t slices = (s.k + config::kc - 1) / config::kc;
    const std::int64_t column_blocks = (s.n + config::nc - 1) / config::nc;
    pool.parallel_for(0, slices * column_blocks, 1, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t job = lo; job < hi; ++job) {
            const std::int64_t pc = job / column_blocks * config::kc;
            const std::int64_t jc = job % column_blocks * config::nc;
            const std::int64_t depth = std::min<std::int64_t>(config::kc, s.k - pc);
            const std::int64_t cols = std::min<std::int64_t>(config::nc, s.n - jc);
            pack_b<config>(s.tb, b, s.ldb, pc, depth, jc, cols, shared + pc * padded_n + jc * depth);
        }
    });

    // Phase 2: the tiles, column block by column block so the threads share B in cache.
    const std::int64_t row_units = (s.m + mr - 1) / mr;
    const std::int64_t tiles = plan.tiles();
    std::atomic<std::int64_t> next_tile{0};
    const packed_b_source<T> source{shared, padded_n};
    pool.parallel_for(0, std::min<std::int64_t>(threads, tiles), 1, [&](std::int64_t, std::int64_t) {
        for (std::int64_t tile = next_tile.fetch_add(1); tile < tiles; tile = next_tile.fetch_add(1)) {
            const std::int64_t q = tile / plan.row_parts;
            const std::int64_t r = tile % plan.row_parts;
            const std::int64_t i0 = row_units * r / plan.row_parts * mr;
            const std::int64_t i1 = std::min(s.m, row_units * (r + 1) / plan.row_parts * mr);
            const std::int64_t j0 = col_units * q / plan.col_parts * nr;
            const std::int64_t j1 = std::min(s.n, col_units * (q + 1) / plan.col_parts * nr);
            if (i0 < i1 && j0 < j1) multiply_tile<T, Isa>(s, alpha, a, b, beta, c, i0, i1, j0, j1, source);
        }
    });
}

// Throws usage_error naming the first argument that BLAS would reject.
inline void check_arguments(const char* op, transpose ta, transpose tb, std::int64_t m, std::int64_t n, std::int64_t k,
                            const void* a, std::int64_t lda, const void* b, std::int64_t ldb, const void* c,
                            std::int64_t ldc) {
    const auto fail = [op](const std::string& what) { throw usage_error(std::string(op) + ": " + what); };
    const auto check_size = [&](const char* name, std::int64_t value) {
        if (value < 0) fail(std::string(name) + " = " + std::to_string(value) + " is negative; pass " + name + " >= 0");
    };
    check_size("m", m);
    check_size("n", n);
    check_size("k", k);
    const auto check_leading = [&](const char* name, std::int64_t value, std::int64_t row_length,
                                   const std::string& layout) {
        const std::int64_t least = std::max<std::int64_t>(1, row_length);
        if (value < least) {
            fail(std::string(name) + " = " + std::to_string(value) + " is smaller than the row length " +
                 std::to_string(row_length) + " of " + layout + "; pass " + name + " >= " + std::to_string(least));
        }
    };
    const std::string ms = std::to_string(m), ns = std::to_string(n), ks = std::to_string(k);
    if (ta == transpose::no) {
        check_leading("lda", lda, k, "A stored m x k = " + ms + " x " + ks + " (transpose::no)");
    } else {
        check_leading("lda", lda, m, "A stored k x m = " + ks + " x " + ms + " (transpose::yes)");
    }
    if (tb == transpose::no) {
        check_leading("ldb", ldb, n, "B stored k x n = " + ks + " x " + ns + " (transpose::no)");
    } else {
        check_leading("ldb", ldb, k, "B stored n x k = " + ns + " x " + ks + " (transpose::yes)");
    }
    check_leading("ldc", ldc, n, "C (m x n = " + ms + " x " + ns + ")");
    const auto check_pointer = [&](const char* name, const void* pointer, std::int64_t rows, std::int64_t cols,
                                   const char* matrix) {
        if (pointer == nullptr && rows > 0 && cols > 0) {
            fail(std::string(name) + " is null but " + matrix + " is " + std::to_string(rows) + " x " +
                 std::to_string(cols) + "; pass its data");
        }
    };
    check_pointer("a", a, m, k, "op(A)");
    check_pointer("b", b, k, n, "op(B)");
    check_pointer("c", c, m, n, "C");
}

template <class T>
inline constexpr bool is_gemm_element_v = std::is_same_v<T, float> || std::is_same_v<T, double>;

// The fallback after validation, on `pool` (tests pass pools of other sizes).
template <class T>
void fallback_unchecked(gemm_isa isa, thread_pool& pool, transpose ta, transpose tb, std::int64_t m, std::int64_t n,
                        std::int64_t k, T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta,
                        T* c, std::int64_t ldc) {
    if (m == 0 || n == 0) return;
    if (k == 0 || alpha == T(0)) {
        scale_c(m, n, beta, c, ldc);
        return;
    }
    const problem s{ta, tb, m, n, k, lda, ldb, ldc};
    switch (isa) {
        case gemm_isa::avx512f: multiply<T, gemm_isa::avx512f>(pool, s, alpha, a, b, beta, c); return;
        case gemm_isa::avx2_fma: multiply<T, gemm_isa::avx2_fma>(pool, s, alpha, a, b, beta, c); return;
        case gemm_isa::portable: multiply<T, gemm_isa::portable>(pool, s, alpha, a, b, beta, c); return;
    }
}

inline bool fits_in_int(std::int64_t value) { return value <= INT_MAX; }

template <class T>
void gemm_unchecked(transpose ta, transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
                    std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
    if constexpr (has_cblas) {
        // CBLAS takes int sizes; larger problems take the fallback rather than overflow.
        // Inside a parallel region every core is already busy with this job, and OpenBLAS
        // would add its own threads on top: the fallback runs on this thread instead.
        if (gemm_uses_cblas() && !host::detail::inside_parallel_region() && fits_in_int(m) && fits_in_int(n) && fits_in_int(k) &&
            fits_in_int(lda) && fits_in_int(ldb) && fits_in_int(ldc)) {
            if (m == 0 || n == 0) return;
            const bool trans_a = ta == transpose::yes;
            const bool trans_b = tb == transpose::yes;
            if constexpr (std::is_same_v<T, float>) {
                cblas::sgemm(trans_a, trans_b, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c,
                             int(ldc));
            } else {
                cblas::dgemm(trans_a, trans_b, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c,
                             int(ldc));
            }
            return;
        }
    }
    fallback_unchecked(gemm_best_isa(), thread_pool::global(), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace detail::gemm

// C = alpha * op(A) * op(B) + beta * C, through OpenBLAS when selected (gemm_uses_cblas()),
// otherwise (and inside a parallel_for range) through gemm_fallback. T is float or double.
template <class T>
void gemm(transpose ta, transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
          std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
    static_assert(detail::gemm::is_gemm_element_v<T>, "loom::host::gemm: T must be float or double");
    detail::gemm::check_arguments("gemm", ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
    detail::gemm::gemm_unchecked(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// The portable path with an explicit micro-kernel (tests and benchmarks pin one this way).
// Throws usage_error when this CPU cannot run `isa`.
template <class T>
void gemm_fallback(gemm_isa isa, transpose ta, transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
                   const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
    static_assert(detail::gemm::is_gemm_element_v<T>, "loom::host::gemm_fallback: T must be float or double");
    detail::gemm::check_arguments("gemm_fallback", ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
    if (!gemm_isa_supported(isa)) {
        throw usage_error(std::string("gemm_fallback: this CPU cannot run the ") + to_string(isa) +
                          " micro-kernel; pass gemm_best_isa() or check gemm_isa_supported() first");
    }
    detail::gemm::fallback_unchecked(isa, thread_pool::global(), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// The portable path with the best micro-kernel for this CPU; always available.
template <class T>
void gemm_fallback(transpose ta, transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
                   std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
    gemm_fallback(gemm_best_isa(), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// For every g in [0, batch): gemm on a + g*stride_a, b + g*stride_b, c + g*stride_c.
// A stride of 0 for A or B reuses one matrix for the whole batch; the C matrices must not
// overlap (stride_c >= (m - 1) * ldc + n when batch > 1).
template <class T>
void gemm_batched(transpose ta, transpose tb, std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k,
                  T alpha, const T* a, std::int64_t lda, std::int64_t stride_a, const T* b, std::int64_t ldb,
                  std::int64_t stride_b, T beta, T* c, std::int64_t ldc, std::int64_t stride_c) {
    static_assert(detail::gemm::is_gemm_element_v<T>, "loom::host::gemm_batched: T must be float or double");
    const auto fail = [](const std::string& what) { throw usage_error("gemm_batched: " + what); };
    if (batch < 0) fail("batch = " + std::to_string(batch) + " is negative; pass batch >= 0");
    detail::gemm::check_arguments("gemm_batched", ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
    if (stride_a < 0 || stride_b < 0 || stride_c < 0) {
        fail("strides (" + std::to_string(stride_a) + ", " + std::to_string(stride_b) + ", " +
             std::to_string(stride_c) + ") must not be negative; pass the distance between consecutive matrices");
    }
    if (batch > 1 && m > 0 && n > 0 && stride_c < (m - 1) * ldc + n) {
        fail("stride_c = " + std::to_string(stride_c) + " makes the " + std::to_string(m) + " x " + std::to_string(n) +
             " outputs (ldc = " + std::to_string(ldc) +
             ") overlap; pass stride_c >= " + std::to_string((m - 1) * ldc + n));
    }
    if (batch == 0 || m == 0 || n == 0) return;
    const auto one = [&](std::int64_t g) {
        // A and B may be null when k == 0; no offset is applied to a null pointer.
        const T* a_g = a == nullptr ? a : a + g * stride_a;
        const T* b_g = b == nullptr ? b : b + g * stride_b;
        detail::gemm::gemm_unchecked(ta, tb, m, n, k, alpha, a_g, lda, b_g, ldb, beta, c + g * stride_c, ldc);
    };
    // Small matrices (attention heads) go one per thread, each multiplied serially by the
    // fallback (a gemm nested in parallel_for runs on its own thread); large ones use every
    // thread (or OpenBLAS) each.
    const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    const thread_pool& pool = thread_pool::global();
    if (batch >= pool.size() && flops <= 2.0 * 192 * 192 * 192) {
        parallel_for(0, batch, 1, [&](std::int64_t lo, std::int64_t hi) {
            for (std::int64_t g = lo; g < hi; ++g) one(g);
        });
        return;
    }
    for (std::int64_t g = 0; g < batch; ++g) one(g);
}

}  // namespace loom::host
// ---- end loom/runtime/host/gemm.hpp ----

namespace loom::search {

namespace detail {

template <class F>
double best_seconds(int repeats, F&& f) {
    double best = 1e300;
    for (int r = 0; r < repeats; ++r) {
        const auto start = std::chrono::steady_clock::now();
        f();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return best;
}

// MemAvailable from /proc/meminfo, in bytes (0 when unknown).
inline double available_memory_bytes() {
    std::ifstream in("/proc/meminfo");
    std::string key;
    double kib = 0;
    std::string unit;
    while (in >> key >> kib >> unit)
        if (key == "MemAvailable:") return kib * 1024.0;
    return 0;
}

}  // namespace detail

inline cluster calibrate_host(int ranks) {
    if (ranks < 1)
        throw usage_error("calibrate_host: " + std::to_string(ranks) + " ranks; give the number of in-process ranks, at least 1");
    const std::int64_t n = 512;
    std::vector<float> a(static_cast<std::size_t>(n * n), 1.0f), b(a.size(), 0.5f), c(a.size(), 0.0f);
    const auto run_gemm = [&] {
        host::gemm<float>(host::transpose::no, host::transpose::no, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    };
    run_gemm();  // warm up: pack buffers, thread pool
    const double gemm_seconds = detail::best_seconds(3, run_gemm);
    const double flops = 2.0 * static_cast<double>(n) * n * n / gemm_seconds;

    const std::size_t bytes = 64u << 20;
    std::vector<char> from(bytes, 1), to(bytes, 0);
    const double copy_seconds = detail::best_seconds(3, [&] { std::memcpy(to.data(), from.data(), bytes); });
    const double bandwidth = 2.0 * static_cast<double>(bytes) / copy_seconds;

    cluster hw;
    hw.name = "host x" + std::to_string(ranks) + " (calibrated)";
    hw.device.name = "host rank";
    hw.device.peak_flops_fp32 = flops / ranks;
    hw.device.peak_flops_fp16 = 0;
    hw.device.memory_bandwidth = bandwidth / ranks;
    const double memory = detail::available_memory_bytes();
    hw.device.memory_bytes = (memory > 0 ? memory : 8.0 * (1ull << 30)) / ranks;
    hw.device.gemm_efficiency = 1.0;
    hw.device.elementwise_efficiency = 1.0;
    hw.topo.devices_per_node = ranks;
    hw.topo.nodes = 1;
    hw.topo.intra_node = {bandwidth / 2.0 / ranks, 20e-6};
    hw.topo.inter_node_per_nic = {bandwidth / 2.0 / ranks, 20e-6};
    hw.topo.nics_per_node = 1;
    return hw;
}

}  // namespace loom::search
// ---- end loom/search/calibrate_host.hpp ----
// ---- end loom/search/all.hpp ----

// runtime
// ---- begin loom/runtime/comm/communicator.hpp ----
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


namespace loom::comm {

// ---- element types ----------------------------------------------------------------------

enum class dtype : std::uint8_t { f32, f64, i32, i64 };

// The element types a communicator moves; dtype_of<T>() names them at run time.
template <class T>
concept comm_element = std::same_as<T, float> || std::same_as<T, double> ||
                       std::same_as<T, std::int32_t> || std::same_as<T, std::int64_t>;

template <comm_element T>
constexpr dtype dtype_of() noexcept {
    if constexpr (std::same_as<T, float>) return dtype::f32;
    else if constexpr (std::same_as<T, double>) return dtype::f64;
    else if constexpr (std::same_as<T, std::int32_t>) return dtype::i32;
    else return dtype::i64;
}

constexpr std::size_t size_of(dtype type) noexcept {
    switch (type) {
        case dtype::f32: return 4;
        case dtype::f64: return 8;
        case dtype::i32: return 4;
        case dtype::i64: return 8;
    }
    return 0;
}

constexpr std::string_view to_string(dtype type) noexcept {
    switch (type) {
        case dtype::f32: return "f32";
        case dtype::f64: return "f64";
        case dtype::i32: return "i32";
        case dtype::i64: return "i64";
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
inline std::string describe(const collective_call& call) {
    std::string text(to_string(call.op));
    if (call.op == collective::barrier) return text;
    text += " (";
    text += to_string(call.type);
    text += ", " + std::to_string(call.count) + (call.count == 1 ? " element" : " elements");
    if (counts_per_rank(call.op)) text += " per rank";
    if (call.op == collective::broadcast) text += " from rank " + std::to_string(call.root);
    return text + ")";
}

// "rank 2: all_reduce_sum (f32, 1024 elements) on group {0,1,2,3}"
inline std::string context(int rank, const collective_call& call, const group& g) {
    return "rank " + std::to_string(rank) + ": " + describe(call) + " on group " + g.to_string();
}

// "rank 1: send (f32, 8 elements) to rank 2 with tag 0"
inline std::string context(int rank, std::string_view op, dtype type, std::size_t count,
                           int peer, int tag) {
    std::string text = "rank " + std::to_string(rank) + ": " + std::string(op) + " (";
    text += to_string(type);
    text += ", " + std::to_string(count) + (count == 1 ? " element" : " elements") + ") ";
    text += op == "send" ? "to" : "from";
    return text + " rank " + std::to_string(peer) + " with tag " + std::to_string(tag);
}

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
inline void check_collective(int rank, int world_size, const collective_call& call,
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

inline void check_point_to_point(int rank, int world_size, std::string_view op, dtype type,
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

template <comm_element T>
void add_into(T* sum, const T* term, std::size_t count) noexcept {
    if constexpr (std::is_integral_v<T>) {
        // Unsigned arithmetic wraps; converting back is modular since C++20.
        using U = std::make_unsigned_t<T>;
        for (std::size_t k = 0; k < count; ++k) {
            sum[k] = static_cast<T>(static_cast<U>(sum[k]) + static_cast<U>(term[k]));
        }
    } else {
        for (std::size_t k = 0; k < count; ++k) sum[k] += term[k];
    }
}

// sum[k] += term[k] for `count` elements of `type`. Called once per member in group order,
// this is the one place that fixes the summation order for every implementation.
inline void add_into(dtype type, void* sum, const void* term, std::size_t count) noexcept {
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
    }
}

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
// ---- end loom/runtime/comm/communicator.hpp ----
// ---- begin loom/runtime/comm/in_process.hpp ----
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

inline std::string describe_exception(const std::exception_ptr& failure) {
    try {
        std::rethrow_exception(failure);
    } catch (const std::exception& error) {
        return error.what();
    } catch (...) {
        return "an exception that is not a std::exception";
    }
}

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
// ---- end loom/runtime/comm/in_process.hpp ----
// ---- begin loom/runtime/transfer_runner.hpp ----
// Runs one device's part of a transfer (partition/transfer.hpp) on a communicator: packs
// the boxes a collective moves into contiguous buffers, calls the collective, and unpacks
// what arrived into the output piece. Backend-neutral: it only copies host memory, so the
// host executor uses it as is; a device backend packs with kernels of its own.
#include <cstdint>
#include <string>
#include <vector>


namespace loom {

namespace detail {

template <class E>
void run_transfer_typed(const partition::transfer& tr, std::int64_t id, int rank, comm::communicator& c,
                        const void* in_raw, void* out_raw, std::vector<E>& staging) {
    using partition::box;
    const std::size_t m = tr.member(rank);
    if (m == tr.group.size())
        throw usage_error("transfer " + std::to_string(id) + " (" + tr.describe() + "): rank " + std::to_string(rank) +
                          " is not a member; the device programs do not match the plan");
    const comm::group g{tr.group};
    const auto n = tr.group.size();
    const E* in = static_cast<const E*>(in_raw);
    E* out = static_cast<E*>(out_raw);
    constexpr comm::dtype type = comm::dtype_of<E>();
    switch (tr.kind) {
        case partition::transfer_kind::all_reduce: {
            const auto count = static_cast<std::size_t>(tr.outputs[m].numel());
            std::copy(in, in + count, out);
            c.all_reduce_sum(out, count, type, g);
            return;
        }
        case partition::transfer_kind::all_gather: {
            const auto count = static_cast<std::size_t>(tr.inputs[m].numel());
            staging.resize(count * n);
            c.all_gather(in, staging.data(), count, type, g);
            for (std::size_t j = 0; j < n; ++j)
                partition::copy_region(staging.data() + j * count, tr.inputs[j], out, tr.outputs[m], tr.inputs[j]);
            return;
        }
        case partition::transfer_kind::reduce_scatter: {
            const auto count = static_cast<std::size_t>(tr.outputs[m].numel());
            staging.resize(count * n);
            for (std::size_t j = 0; j < n; ++j)
                partition::copy_region(in, tr.inputs[m], staging.data() + j * count, tr.outputs[j], tr.outputs[j]);
            c.reduce_scatter_sum(staging.data(), out, count, type, g);
            return;
        }
        case partition::transfer_kind::all_to_all: {
            const auto count = static_cast<std::size_t>(partition::intersect(tr.inputs[m], tr.outputs[0]).numel());
            staging.resize(2 * count * n);
            E* send = staging.data();
            E* recv = staging.data() + count * n;
            for (std::size_t j = 0; j < n; ++j) {
                const box part = partition::intersect(tr.inputs[m], tr.outputs[j]);
                partition::copy_region(in, tr.inputs[m], send + j * count, part, part);
            }
            c.all_to_all(send, recv, count, type, g);
            for (std::size_t i = 0; i < n; ++i) {
                const box part = partition::intersect(tr.inputs[i], tr.outputs[m]);
                partition::copy_region(recv + i * count, part, out, tr.outputs[m], part);
            }
            return;
        }
        case partition::transfer_kind::broadcast: {
            const auto count = static_cast<std::size_t>(tr.outputs[m].numel());
            if (tr.group[m] == tr.root) {
                staging.assign(in, in + count);
                c.broadcast(staging.data(), count, type, tr.root, g);
            } else {
                c.broadcast(out, count, type, tr.root, g);
            }
            return;
        }
        case partition::transfer_kind::send_recv: {
            // Transfers between one pair run in the same order on both sides, so a tag that
            // repeats every 30000 transfers cannot pair the wrong messages.
            const int tag = static_cast<int>(id % 30000);
            if (m == 0)
                c.send(in, static_cast<std::size_t>(tr.inputs[0].numel()), type, tr.group[1], tag);
            else
                c.recv(out, static_cast<std::size_t>(tr.outputs[1].numel()), type, tr.group[0], tag);
            return;
        }
    }
}

}  // namespace detail

// Scratch buffers reused across transfers of one executor.
template <class T>
struct transfer_scratch {
    std::vector<T> real;
    std::vector<std::int32_t> index;
};

// Runs this rank's part of transfer `id`. `in` / `out`: the node's input and output storage
// (absent where the member sends or receives nothing).
template <class T>
void run_transfer(const partition::transfer& tr, std::int64_t id, comm::communicator& c, const void* in, void* out,
                  transfer_scratch<T>& scratch) {
    if (tr.values == value_kind::index)
        detail::run_transfer_typed<std::int32_t>(tr, id, c.rank(), c, in, out, scratch.index);
    else
        detail::run_transfer_typed<T>(tr, id, c.rank(), c, in, out, scratch.real);
}

}  // namespace loom
// ---- end loom/runtime/transfer_runner.hpp ----
// ---- begin loom/runtime/host/bound_storage.hpp ----
// Owned storage for every tensor a program binds (inputs, parameters, gradients, outputs),
// zero-initialised and bound to an executor in one call. What tests and the single-device
// trainer use; plans give each device its own.
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

// ---- begin loom/runtime/host/executor.hpp ----
// Runs a program on the host: one arena for intermediates, caller-bound storage for
// inputs, parameters, gradients and outputs, and one kernel call per instruction.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

// ---- begin loom/runtime/host/kernel_table.hpp ----
// From op kind to host kernel. Built-in ops are registered from ops::all_ops the first time
// the table is used; a user's own op registers with `register_host_kernel<MyOp>()`.
#include <mutex>
#include <string>
#include <unordered_map>

#include <boost/mp11/algorithm.hpp>

// ---- begin loom/runtime/host/kernel_call.hpp ----
// What a host kernel receives: the node, typed views of its input and output buffers, and
// the step number (dropout masks are a pure function of seed, step and element index).
// Every tensor is dense row-major. Kernels overwrite their outputs completely.
#include <cstdint>
#include <span>


namespace loom::host {

template <class T>
struct kernel_call {
    const graph& g;
    const node& n;
    std::span<void* const> in;
    std::span<void* const> out;
    std::uint64_t step = 0;

    const T* input(std::size_t i) const { return static_cast<const T*>(in[i]); }
    const std::int32_t* index_input(std::size_t i) const { return static_cast<const std::int32_t*>(in[i]); }
    T* output(std::size_t i) const { return static_cast<T*>(out[i]); }
    const shape& input_shape(std::size_t i) const { return g.tensor(n.inputs[i]).dims; }
    const shape& output_shape(std::size_t i) const { return g.tensor(n.outputs[i]).dims; }
    std::int64_t input_numel(std::size_t i) const { return input_shape(i).numel(); }
    std::int64_t output_numel(std::size_t i) const { return output_shape(i).numel(); }
    const attributes& attrs() const { return n.attrs; }
    // Extent of a bound signature variable ("k", "n", "...0").
    std::int64_t extent(std::string_view label) const {
        auto v = n.sig.find(label);
        return v ? n.sig.vars[static_cast<std::size_t>(*v)].extent : 0;
    }
    // Product of the extents of the leading dims that `...` stood for.
    std::int64_t leading_numel(std::size_t input = 0) const {
        const shape& s = input_shape(input);
        std::size_t explicit_rank = n.op->sig.inputs[input].rank;
        return s.span_numel(0, s.rank() - explicit_rank);
    }
};

// Specialised once per op kind in runtime/host/kernels/<op>.hpp:
//   template <> struct host_kernel<ops::Gelu> { template <class T> static void run(const kernel_call<T>&); };
template <class Op>
struct host_kernel;

}  // namespace loom::host
// ---- end loom/runtime/host/kernel_call.hpp ----
// ---- begin loom/runtime/host/kernels/all.hpp ----
// Every host kernel loom ships (one specialisation of host_kernel per op kind).
// ---- begin loom/runtime/host/kernels/assemble.hpp ----
// Host kernel of assemble (ops/assemble.hpp): copy or add the inputs' intersections with
// the output box. The output is zeroed first when the inputs are summed or do not cover it.
#include <algorithm>
#include <cstdint>


namespace loom::host {

template <>
struct host_kernel<ops::Assemble> {
    // Index tensors (token ids) are assembled too: the element type follows the tensor.
    template <class T>
    static void run(const kernel_call<T>& c) {
        if (c.g.tensor(c.n.outputs[0]).kind == value_kind::index)
            assemble<std::int32_t>(c);
        else
            assemble<T>(c);
    }

    template <class E, class T>
    static void assemble(const kernel_call<T>& c) {
        const auto& out_flat = c.attrs().template get<std::vector<std::int64_t>>("out_box");
        const auto& in_flat = c.attrs().template get<std::vector<std::int64_t>>("in_boxes");
        const bool accumulate = c.attrs().template get<std::int64_t>("accumulate") != 0;
        const bool zero = accumulate || c.attrs().template get<std::int64_t>("zero") != 0;
        const std::size_t rank = out_flat.size() / 2;
        const partition::box out = partition::decode_box(out_flat, 0, rank);
        E* y = static_cast<E*>(c.out[0]);
        if (zero) std::fill(y, y + c.output_numel(0), E(0));
        for (std::size_t i = 0; i < c.in.size(); ++i) {
            const partition::box in = partition::decode_box(in_flat, 2 * rank * i, rank);
            const partition::box region = partition::intersect(in, out);
            if (rank > 0 && region.empty()) continue;
            const E* x = static_cast<const E*>(c.in[i]);
            if (accumulate)
                partition::add_region(x, in, y, out, region);
            else
                partition::copy_region(x, in, y, out, region);
        }
    }
};

}  // namespace loom::host
// ---- end loom/runtime/host/kernels/assemble.hpp ----
// ---- begin loom/runtime/host/kernels/basic.hpp ----
// Kernels of the structural ops: fill_like, identity, add, mul, scale and the reductions.
#include <algorithm>
#include <cstring>
#include <vector>

// ---- begin loom/runtime/host/kernels/elementwise.hpp ----
// Shared helpers for elementwise host kernels: a parallel loop over elements with a grain
// large enough that the pool pays for itself.
#include <cstdint>
#include <cstring>


namespace loom::host {

inline constexpr std::int64_t elementwise_grain = 1 << 14;

// f(i) for every i in [0, n), in parallel chunks.
template <class F>
void for_each_index(std::int64_t n, F&& f) {
    parallel_for(0, n, elementwise_grain, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t i = lo; i < hi; ++i) f(i);
    });
}

// y = x over n elements, in parallel chunks; nothing when they share storage (a copy op whose
// output the planner placed on its input).
template <class T>
void copy_elements(const T* x, T* y, std::int64_t n) {
    if (x == y) return;
    parallel_for(0, n, elementwise_grain, [&](std::int64_t lo, std::int64_t hi) {
        std::memcpy(y + lo, x + lo, static_cast<std::size_t>(hi - lo) * sizeof(T));
    });
}

// f(row) for every row in [0, rows); `row_cost` elements of work per row sets the grain.
template <class F>
void for_each_row(std::int64_t rows, std::int64_t row_cost, F&& f) {
    std::int64_t grain = row_cost >= elementwise_grain ? 1 : elementwise_grain / (row_cost > 0 ? row_cost : 1);
    parallel_for(0, rows, grain, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t r = lo; r < hi; ++r) f(r);
    });
}

}  // namespace loom::host
// ---- end loom/runtime/host/kernels/elementwise.hpp ----

namespace loom::host {

template <>
struct host_kernel<ops::FillLike> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const T value = static_cast<T>(c.attrs().template get<double>("value"));
        T* y = c.output(0);
        for_each_index(c.output_numel(0), [&](std::int64_t i) { y[i] = value; });
    }
};

template <>
struct host_kernel<ops::Identity> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const T* x = c.input(0);
        T* y = c.output(0);
        if (x != y) std::memcpy(y, x, static_cast<std::size_t>(c.output_numel(0)) * sizeof(T));
    }
};

template <>
struct host_kernel<ops::Add> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const T *a = c.input(0), *b = c.input(1);
        T* y = c.output(0);
        for_each_index(c.output_numel(0), [&](std::int64_t i) { y[i] = a[i] + b[i]; });
    }
};

template <>
struct host_kernel<ops::Mul> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const T *a = c.input(0), *b = c.input(1);
        T* y = c.output(0);
        for_each_index(c.output_numel(0), [&](std::int64_t i) { y[i] = a[i] * b[i]; });
    }
};

template <>
struct host_kernel<ops::Scale> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const T s = static_cast<T>(c.attrs().template get<double>("factor"));
        const T* x = c.input(0);
        T* y = c.output(0);
        for_each_index(c.output_numel(0), [&](std::int64_t i) { y[i] = s * x[i]; });
    }
};

namespace detail {
// A deterministic parallel sum: fixed-size chunks summed in order, then the partials in
// order, so the result does not depend on how many threads ran.
template <class T>
T deterministic_sum(const T* x, std::int64_t n) {
    constexpr std::int64_t chunk = 1 << 12;
    const std::int64_t chunks = (n + chunk - 1) / chunk;
    std::vector<T> partial(static_cast<std::size_t>(std::max<std::int64_t>(chunks, 1)), T(0));
    parallel_for(0, chunks, 4, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t b = lo; b < hi; ++b) {
            T s = 0;
            const std::int64_t end = std::min(n, (b + 1) * chunk);
            for (std::int64_t i = b * chunk; i < end; ++i) s += x[i];
            partial[static_cast<std::size_t>(b)] = s;
        }
    });
    T total = 0;
    for (T p : partial) total += p;
    return total;
}
}  // namespace detail

template <>
struct host_kernel<ops::Sum> {
    template <class T>
    static void run(const kernel_call<T>& c) { *c.output(0) = detail::deterministic_sum(c.input(0), c.input_numel(0)); }
};

template <>
struct host_kernel<ops::Mean> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const double count = c.attrs().template get<double>("count");
        *c.output(0) = static_cast<T>(detail::deterministic_sum(c.input(0), c.input_numel(0)) / count);
    }
};

template <>
struct host_kernel<ops::BroadcastScalar> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const T value = *c.input(1) * static_cast<T>(c.attrs().template get<double>("scale"));
        T* y = c.output(0);
        for_each_index(c.output_numel(0), [&](std::int64_t i) { y[i] = value; });
    }
};

// db[j] = sum_r dy[r, j]; columns split across threads, rows summed in order.
template <>
struct host_kernel<ops::SumLeading> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t n = c.extent("n");
        const std::int64_t rows = c.input_numel(0) / n;
        const T* x = c.input(0);
        T* y = c.output(0);
        parallel_for(0, n, 16, [&](std::int64_t lo, std::int64_t hi) {
            for (std::int64_t j = lo; j < hi; ++j) y[j] = 0;
            for (std::int64_t r = 0; r < rows; ++r)
                for (std::int64_t j = lo; j < hi; ++j) y[j] += x[r * n + j];
        });
    }
};

}  // namespace loom::host
// ---- end loom/runtime/host/kernels/basic.hpp ----
// ---- begin loom/runtime/host/kernels/linear.hpp ----

namespace loom::host {

namespace detail {
// x [m, k] · w[n, k]^T -> y [m, n]
template <class T>
void linear_forward(const kernel_call<T>& c, const T* bias) {
    const std::int64_t k = c.extent("k"), n = c.extent("n");
    const std::int64_t m = c.input_numel(0) / k;
    T* y = c.output(0);
    if (bias) {
        for_each_row(m, n, [&](std::int64_t r) {
            for (std::int64_t j = 0; j < n; ++j) y[r * n + j] = bias[j];
        });
    }
    host::gemm<T>(transpose::no, transpose::yes, m, n, k, T(1), c.input(0), k, c.input(1), k, bias ? T(1) : T(0), y, n);
}
}  // namespace detail

template <>
struct host_kernel<ops::Linear> {
    template <class T>
    static void run(const kernel_call<T>& c) { detail::linear_forward<T>(c, nullptr); }
};

template <>
struct host_kernel<ops::LinearBias> {
    template <class T>
    // Attribute bias = 0: a piece of a row-parallel split that leaves the bias to piece 0.
    static void run(const kernel_call<T>& c) {
        detail::linear_forward<T>(c, c.attrs().template get_or<std::int64_t>("bias", 1) != 0 ? c.input(2) : nullptr);
    }
};

// dx [m, k] = dy [m, n] · w [n, k]
template <>
struct host_kernel<ops::LinearGradInput> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t k = c.extent("k"), n = c.extent("n");
        const std::int64_t m = c.input_numel(0) / n;
        gemm<T>(transpose::no, transpose::no, m, k, n, T(1), c.input(0), n, c.input(1), k, T(0), c.output(0), k);
    }
};

// dW [n, k] = dy [m, n]^T · x [m, k]
template <>
struct host_kernel<ops::LinearGradWeight> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t k = c.extent("k"), n = c.extent("n");
        const std::int64_t m = c.input_numel(0) / n;
        gemm<T>(transpose::yes, transpose::no, n, k, m, T(1), c.input(0), n, c.input(1), k, T(0), c.output(0), k);
    }
};

}  // namespace loom::host
// ---- end loom/runtime/host/kernels/linear.hpp ----
// ---- begin loom/runtime/host/kernels/stop_gradient.hpp ----
// Kernel of stop_gradient: in the forward pass it is the identity, a copy.

namespace loom::host {

template <>
struct host_kernel<ops::StopGradient> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        copy_elements(c.input(0), c.output(0), c.output_numel(0));
    }
};

}  // namespace loom::host
// ---- end loom/runtime/host/kernels/stop_gradient.hpp ----
// kernels-includes: elementwise
// ---- begin loom/runtime/host/kernels/dropout.hpp ----
// Host kernels of dropout and dropout_grad: y = x * (keep ? 1 / (1 - p) : 0), the scale
// rounded to T as PyTorch's noise.div_(1 - p), and a dropped element multiplied by 0 as
// PyTorch's input * noise (so a NaN stays NaN).
//
// The mask law: element i at step s is kept iff b_i >= t, t = min(ceil(p 2^32), 2^32 - 1), with
//   key = mix64(mix64(seed) ^ mix64(s + golden)),  h_j = mix64(key + (j + 1) golden),
//   b_i = the low 32 bits of h_(i/2) for even i, the high 32 bits for odd i,
// mix64 the splitmix64 finalizer and golden = 2^64 / phi: h_j is the j-th output of the
// splitmix64 stream that starts at `key`, so b_i / 2^32 is uniform on [0, 1) and an element
// is kept with probability 1 - p (to 2^-32). One hash serves two elements. i is the flat index
// in the tensor this kernel sees; a partitioned run must hand each slice its global indices
// (ops/dropout.hpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

// ---- begin loom/core/random.hpp ----
// The one integer mixer behind every seeded stream in loom (parameter init, dropout masks,
// the corpus, the data loader's permutations): splitmix64. Fully specified, so every
// platform draws the same numbers, and counter-based, so element i of a stream can be
// computed without computing elements 0..i-1.
#include <cstdint>

namespace loom {

inline constexpr std::uint64_t golden_gamma = 0x9e3779b97f4a7c15ull;

// splitmix64's finalizer: a bijection on 64-bit integers with strong avalanche.
constexpr std::uint64_t finalize_mix(std::uint64_t z) noexcept {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// splitmix64(z): the finalizer of z + gamma; the output for counter value z.
constexpr std::uint64_t splitmix64(std::uint64_t z) noexcept { return finalize_mix(z + golden_gamma); }

}  // namespace loom
// ---- end loom/core/random.hpp ----
// ---- begin loom/runtime/host/kernels/vector_math.hpp ----
// Float math for host kernels, written so that g++ -O2 vectorizes the loops that call it,
// for whatever instruction set the build targets (SSE2 by default, AVX2/AVX-512 under -march):
//  * inner loops have a compile-time trip count: -O2's "very cheap" cost model vectorizes
//    only loops that need no scalar epilogue;
//  * no branches and no conditionally executed floating-point operation: under the default
//    -ftrapping-math g++ refuses to if-convert `c ? a * b : d`, so choices are bit selects
//    between values computed on every lane;
//  * no calls, tables or float-to-int conversions of unbounded values.
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>


namespace loom::host {

// Elements per fixed-trip-count block of map_blocks (and lanes of the row reductions).
inline constexpr std::int64_t simd_block = 32;

// c ? a : b on the bits of both values, both always computed.
inline float select_bits(bool c, float a, float b) {
    const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
    return std::bit_cast<float>((std::bit_cast<std::uint32_t>(a) & m) | (std::bit_cast<std::uint32_t>(b) & ~m));
}
inline double select_bits(bool c, double a, double b) {
    const std::uint64_t m = 0u - static_cast<std::uint64_t>(c);
    return std::bit_cast<double>((std::bit_cast<std::uint64_t>(a) & m) | (std::bit_cast<std::uint64_t>(b) & ~m));
}

// exp(x) for x <= 0 (and NaN), to relative error 1e-7 (measured 8.3e-8); 0 below
// ln(2^-126) ~ -87.34, where the true value is subnormal (< 1.2e-38).
// Law: exp(x) = 2^n exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2] (ln 2 split
// in two so that n * ln2_hi is exact), exp(r) by the degree-7 polynomial of Cephes' expf.
inline float exp_nonpositive(float x) {
    constexpr float lowest = -87.33654f;
    const float xc = select_bits(x >= lowest, x, lowest);  // NaN -> lowest: the conversion below stays defined
    const auto n = static_cast<std::int32_t>(xc * 1.44269504088896341f - 0.5f);  // round(xc / ln 2), xc <= 0
    const auto nf = static_cast<float>(n);
    float r = xc - nf * 0.693359375f;
    r = r - nf * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const float two_to_n = std::bit_cast<float>(static_cast<std::uint32_t>(n + 127) << 23);  // n in [-126, 0]
    return select_bits(x >= lowest, p * two_to_n, select_bits(x < lowest, 0.0f, x));
}

// sigmoid(z) and 1 - sigmoid(z) from e = exp(-|z|) <= 1, so nothing overflows or cancels:
//   z >= 0: s = 1 / (1 + e), 1 - s = e / (1 + e);   z < 0: the two swap.
struct sigmoid_parts {
    float s;
    float one_minus_s;
};
inline sigmoid_parts sigmoid_float(float z) {
    const float e = exp_nonpositive(-std::fabs(z));
    const float d = 1.0f / (1.0f + e);
    const float ed = e * d;
    const bool positive = z >= 0.0f;
    return {select_bits(positive, d, ed), select_bits(positive, ed, d)};
}

namespace detail {
template <class T, class Block, std::size_t... I>
void map_tail(const Block& block, T* out, std::int64_t count, const std::array<const T*, sizeof...(I)>& in,
              std::index_sequence<I...>) {
    // Padded copies: the tail runs the very code of a full block, so an element's value never
    // depends on where a thread's range ends.
    T pad_in[sizeof...(I) > 0 ? sizeof...(I) : 1][simd_block] = {};
    T pad_out[simd_block];
    for (std::size_t k = 0; k < sizeof...(I); ++k)
        for (std::int64_t j = 0; j < count; ++j) pad_in[k][j] = in[k][j];
    block(pad_out, static_cast<const T*>(pad_in[I])...);
    for (std::int64_t j = 0; j < count; ++j) out[j] = pad_out[j];
}
}  // namespace detail

// out[i] = f(in0[i], in1[i], ...) for i in [0, n), in parallel. `block(out, in...)` maps exactly
// simd_block elements (declare its pointers __restrict and loop j < simd_block); ranges are
// cut into such blocks, the last one padded with zeros.
template <class T, class Block, class... In>
void map_blocks(std::int64_t n, const Block& block, T* out, const In*... in) {
    static_assert((std::is_same_v<T, In> && ...), "map_blocks: every input must have the output's element type");
    parallel_for(0, n, elementwise_grain, [&](std::int64_t lo, std::int64_t hi) {
        std::int64_t i = lo;
        for (; i + simd_block <= hi; i += simd_block) block(out + i, (in + i)...);
        if (i < hi)
            detail::map_tail<T>(block, out + i, hi - i, std::array<const T*, sizeof...(In)>{(in + i)...},
                                std::index_sequence_for<In...>{});
    });
}

}  // namespace loom::host
// ---- end loom/runtime/host/kernels/vector_math.hpp ----

namespace loom::host {

// The keep-or-drop decision of every element for one (seed, step, p).
class dropout_mask {
public:
    static constexpr std::uint64_t golden = golden_gamma;
    static constexpr std::uint64_t mix64(std::uint64_t z) { return finalize_mix(z); }

    dropout_mask(std::int64_t seed, std::uint64_t step, double p)
        : key_(mix64(mix64(static_cast<std::uint64_t>(seed)) ^ mix64(step + golden))), threshold_(threshold_of(p)) {}

    // h_pair: the hash shared by elements 2 pair and 2 pair + 1.
    std::uint64_t pair_hash(std::uint64_t pair) const { return mix64(key_ + (pair + 1) * golden); }
    std::uint32_t bits(std::uint64_t index) const {
        return static_cast<std::uint32_t>(pair_hash(index >> 1) >> (32 * (index & 1)));
    }
    bool keeps(std::uint64_t index) const { return bits(index) >= threshold_; }
    std::uint32_t threshold() const { return threshold_; }

private:
    // p 2^32 is exact in a double, so its ceil is exact too.
    static std::uint32_t threshold_of(double p) {
        const double t = std::ceil(p * 0x1.0p32);
        return t >= 0x1.0p32 - 1 ? 0xffffffffu : static_cast<std::uint32_t>(t);
    }

    std::uint64_t key_;
    std::uint32_t threshold_;
};

namespace detail {
template <class T>
void apply_dropout(const kernel_call<T>& c) {
    const double p = c.attrs().template get<double>("p");
    const T* x = c.input(0);
    T* y = c.output(0);
    const std::int64_t n = c.output_numel(0);
    if (p == 0.0) {
        if (x != y) std::memcpy(y, x, static_cast<std::size_t>(n) * sizeof(T));
        return;
    }
    const dropout_mask mask(c.attrs().template get<std::int64_t>("seed"), c.step, p);
    const T scale = T(1) / static_cast<T>(1.0 - p);
    if (c.attrs().has("origin")) {
        // A piece of a partitioned tensor: element i's index in the whole tensor decides.
        const auto& origin = c.attrs().template get<std::vector<std::int64_t>>("origin");
        const auto& whole = c.attrs().template get<std::vector<std::int64_t>>("whole");
        const shape& local = c.output_shape(0);
        const std::size_t rank = local.rank();
        const std::int64_t row = rank ? local.extent(rank - 1) : 1;
        parallel_for(0, n / std::max<std::int64_t>(row, 1), std::max<std::int64_t>(1, elementwise_grain / std::max<std::int64_t>(row, 1)),
                     [&](std::int64_t lo, std::int64_t hi) {
                         for (std::int64_t r = lo; r < hi; ++r) {
                             // Global flat index of the row's first element.
                             std::int64_t rest = r, global = 0, stride = 1;
                             for (std::size_t a = rank; a-- > 0;) {
                                 const std::int64_t at = a + 1 == rank ? 0 : rest % local.extent(a);
                                 if (a + 1 != rank) rest /= local.extent(a);
                                 global += (at + origin[a]) * stride;
                                 stride *= whole[a];
                             }
                             for (std::int64_t j = 0; j < row; ++j) {
                                 const std::int64_t i = r * row + j;
                                 y[i] = x[i] * (mask.keeps(static_cast<std::uint64_t>(global + j)) ? scale : T(0));
                             }
                         }
                     });
        return;
    }
    // Unsigned b >= t as signed (b ^ 2^31) >= (t ^ 2^31): SSE2 compares only signed lanes.
    constexpr std::uint32_t sign = 0x80000000u;
    const auto threshold = static_cast<std::int32_t>(mask.threshold() ^ sign);
    auto one = [&](std::int64_t i) { y[i] = x[i] * (mask.keeps(static_cast<std::uint64_t>(i)) ? scale : T(0)); };
    parallel_for(0, n, elementwise_grain, [&](std::int64_t lo, std::int64_t hi) {
        std::int64_t i = lo;
        for (; i < hi && i % simd_block != 0; ++i) one(i);
        // Whole blocks start at an even index: simd_block / 2 hashes give their bits.
        for (; i + simd_block <= hi; i += simd_block) {
            std::int32_t biased[simd_block];
            const auto first_pair = static_cast<std::uint64_t>(i) / 2;
            for (std::int64_t j = 0; j < simd_block / 2; ++j) {
                const std::uint64_t h = mask.pair_hash(first_pair + static_cast<std::uint64_t>(j));
                biased[2 * j] = static_cast<std::int32_t>(static_cast<std::uint32_t>(h) ^ sign);
                biased[2 * j + 1] = static_cast<std::int32_t>(static_cast<std::uint32_t>(h >> 32) ^ sign);
            }
            const T* __restrict xb = x + i;
            T* __restrict yb = y + i;
            // A branch here would mispredict on a random mask; a select vectorizes.
            for (std::int64_t j = 0; j < simd_block; ++j) yb[j] = xb[j] * select_bits(biased[j] >= threshold, scale, T(0));
        }
        for (; i < hi; ++i) one(i);
    });
}
}  // namespace detail

template <>
struct host_kernel<ops::Dropout> {
    template <class T>
    static void run(const kernel_call<T>& c) { detail::apply_dropout(c); }
};

template <>
struct host_kernel<ops::DropoutGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) { detail::apply_dropout(c); }
};

}  // namespace loom::host
// ---- end loom/runtime/host/kernels/dropout.hpp ----
// ---- begin loom/runtime/host/kernels/gelu.hpp ----
// Host kernels of gelu and gelu_grad.
//
// double follows PyTorch's formula operation for operation (std::tanh), so float64 models
// match it to a few ulp. float, the hot path of a GPT MLP, uses
//   0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + exp(-2u)),
// one exp and one division per element, vectorized. It is more accurate than evaluating
// 1 + tanh(u) in float, which cancels for x < 0 (at x = -5 the float formula loses every digit):
// within 2e-7 relative for x >= 0, and for x < 0 within the effect of rounding u to float
// (tests/test_ops_elementwise.cpp states the bound).
#include <cmath>


namespace loom::host {

namespace detail {

inline constexpr double gelu_beta = 0.7978845608028654;  // sqrt(2/pi), PyTorch's M_SQRT2 * M_2_SQRTPI * 0.5
inline constexpr double gelu_kappa = 0.044715;

// x sigmoid(z) = x / (1 + e) for z >= 0 and x e / (1 + e) for z < 0, e = exp(-|z|): one
// rounding fewer than x * sigmoid(z).
inline float gelu_value(float x) {
    const float z = static_cast<float>(2 * gelu_beta) * (x + static_cast<float>(gelu_kappa) * (x * x * x));
    const float e = exp_nonpositive(-std::fabs(z));
    return (x * select_bits(z >= 0.0f, 1.0f, e)) / (1.0f + e);
}

// gelu'(x) = s + x s (1 - s) z'(x),  z = 2u, s = sigmoid(z)
inline float gelu_derivative(float x) {
    const float x2 = x * x;
    const float z = static_cast<float>(2 * gelu_beta) * (x + static_cast<float>(gelu_kappa) * (x2 * x));
    const float dz = static_cast<float>(2 * gelu_beta) * (1.0f + static_cast<float>(3 * gelu_kappa) * x2);
    const sigmoid_parts g = sigmoid_float(z);
    return g.s + x * (g.s * g.one_minus_s) * dz;
}

inline double gelu_value(double x) {
    const double x_cube = x * x * x;
    const double inner = gelu_beta * (x + gelu_kappa * x_cube);
    return 0.5 * x * (1.0 + std::tanh(inner));
}

inline double gelu_derivative(double x) {
    const double x_sq = x * x;
    const double x_cube = x_sq * x;
    const double inner = gelu_beta * (x + gelu_kappa * x_cube);
    const double tanh_inner = std::tanh(inner);
    const double left = 0.5 * x;
    const double right = 1.0 + tanh_inner;
    const double left_derivative = 0.5 * right;
    const double tanh_derivative = 1.0 - tanh_inner * tanh_inner;
    const double inner_derivative = gelu_beta * (1.0 + 3.0 * gelu_kappa * x_sq);
    const double right_derivative = left * tanh_derivative * inner_derivative;
    return left_derivative + right_derivative;
}

}  // namespace detail

template <>
struct host_kernel<ops::Gelu> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        map_blocks(
            c.output_numel(0),
            [](T* __restrict y, const T* __restrict x) {
                for (std::int64_t j = 0; j < simd_block; ++j) y[j] = detail::gelu_value(x[j]);
            },
            c.output(0), c.input(0));
    }
};

template <>
struct host_kernel<ops::GeluGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        map_blocks(
            c.output_numel(0),
            [](T* __restrict dx, const T* __restrict dy, const T* __restrict x) {
                for (std::int64_t j = 0; j < simd_block; ++j) dx[j] = dy[j] * detail::gelu_derivative(x[j]);
            },
            c.output(0), c.input(0), c.input(1));
    }
};

}  // namespace loom::host
// ---- end loom/runtime/host/kernels/gelu.hpp ----
// ---- begin loom/runtime/host/kernels/relu.hpp ----
// Host kernels of relu and relu_grad.

namespace loom::host {

template <>
struct host_kernel<ops::Relu> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        map_blocks(
            c.output_numel(0),
            [](T* __restrict y, const T* __restrict x) {
                // NaN stays NaN, as in PyTorch.
                for (std::int64_t j = 0; j < simd_block; ++j) y[j] = x[j] < T(0) ? T(0) : x[j];
            },
            c.output(0), c.input(0));
    }
};

template <>
struct host_kernel<ops::ReluGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        map_blocks(
            c.output_numel(0),
            [](T* __restrict dx, const T* __restrict dy, const T* __restrict x) {
                for (std::int64_t j = 0; j < simd_block; ++j) {
                    const T g = dy[j];  // read on every lane: g++ does not if-convert a conditional load
                    dx[j] = x[j] <= T(0) ? T(0) : g;
                }
            },
            c.output(0), c.input(0), c.input(1));
    }
};

}  // namespace loom::host
// ---- end loom/runtime/host/kernels/relu.hpp ----
// ---- begin loom/runtime/host/kernels/silu.hpp ----
// Host kernels of silu and silu_grad. The sigmoid and 1 - sigmoid come from e = exp(-|x|) <= 1
// (see sigmoid_float), so no exp overflows and neither tail loses digits. double uses
// std::exp (PyTorch's x / (1 + exp(-x)) to a few ulp); float the vectorized exp_nonpositive.
#include <cmath>


namespace loom::host {

namespace detail {

inline float silu_value(float x) { return x * sigmoid_float(x).s; }

// d/dx x s(x) = s (1 + x (1 - s))
inline float silu_derivative(float x) {
    const sigmoid_parts g = sigmoid_float(x);
    return g.s * (1.0f + x * g.one_minus_s);
}

inline double silu_value(double x) {
    const double e = std::exp(-std::fabs(x));
    return x >= 0.0 ? x / (1.0 + e) : x * e / (1.0 + e);
}

inline double silu_derivative(double x) {
    const double e = std::exp(-std::fabs(x));
    const double d = 1.0 / (1.0 + e);
    const double s = x >= 0.0 ? d : e * d;
    const double one_minus_s = x >= 0.0 ? e * d : d;
    return s * (1.0 + x * one_minus_s);
}

}  // namespace detail

template <>
struct host_kernel<ops::Silu> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        map_blocks(
            c.output_numel(0),
            [](T* __restrict y, const T* __restrict x) {
                for (std::int64_t j = 0; j < simd_block; ++j) y[j] = detail::silu_value(x[j]);
            },
            c.output(0), c.input(0));
    }
};

template <>
struct host_kernel<ops::SiluGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        map_blocks(
            c.output_numel(0),
            [](T* __restrict dx, const T* __restrict dy, const T* __restrict x) {
                for (std::int64_t j = 0; j < simd_block; ++j) dx[j] = dy[j] * detail::silu_derivative(x[j]);
            },
            c.output(0), c.input(0), c.input(1));
    }
};

}  // namespace loom::host
// ---- end loom/runtime/host/kernels/silu.hpp ----
// ---- begin loom/runtime/host/kernels/softmax.hpp ----
// Host kernels of softmax and softmax_grad over the last dim, one row per task. As PyTorch:
//   y = exp(x - max) * (1 / sum exp(x - max)),   dx = (dy - sum(dy * y)) * y.
// Row sums run in simd_block lanes combined in a fixed order, so a row's result never depends
// on the thread count. double uses std::exp, float the vectorized exp_nonpositive.
#include <cmath>


namespace loom::host {

namespace detail {

inline float softmax_exp_shifted(float x_minus_max) { return exp_nonpositive(x_minus_max); }
inline double softmax_exp_shifted(double x_minus_max) { return std::exp(x_minus_max); }

template <class T>
T softmax_row_max(const T* __restrict x, std::int64_t n) {
    T m = x[0];
    std::int64_t i = 0;
    if (n >= simd_block) {
        T lane[simd_block];
        for (std::int64_t j = 0; j < simd_block; ++j) lane[j] = x[j];
        for (i = simd_block; i + simd_block <= n; i += simd_block)
            for (std::int64_t j = 0; j < simd_block; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
        for (std::int64_t j = 0; j < simd_block; ++j) m = lane[j] > m ? lane[j] : m;
    }
    for (; i < n; ++i) m = x[i] > m ? x[i] : m;
    return m;
}

// y = exp(x - m); returns sum(y).
template <class T>
T softmax_exp_row(const T* __restrict x, T m, T* __restrict y, std::int64_t n) {
    T lane[simd_block] = {};
    std::int64_t i = 0;
    for (; i + simd_block <= n; i += simd_block)
        for (std::int64_t j = 0; j < simd_block; ++j) {
            const T e = softmax_exp_shifted(x[i + j] - m);
            y[i + j] = e;
            lane[j] += e;
        }
    T sum = 0;
    for (std::int64_t j = 0; j < simd_block; ++j) sum += lane[j];
    for (; i < n; ++i) {
        y[i] = softmax_exp_shifted(x[i] - m);
        sum += y[i];
    }
    return sum;
}

template <class T>
T softmax_dot_row(const T* __restrict a, const T* __restrict b, std::int64_t n) {
    T lane[simd_block] = {};
    std::int64_t i = 0;
    for (; i + simd_block <= n; i += simd_block)
        for (std::int64_t j = 0; j < simd_block; ++j) lane[j] += a[i + j] * b[i + j];
    T sum = 0;
    for (std::int64_t j = 0; j < simd_block; ++j) sum += lane[j];
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

template <class T>
void softmax_scale_row(T* __restrict y, T factor, std::int64_t n) {
    std::int64_t i = 0;
    for (; i + simd_block <= n; i += simd_block)
        for (std::int64_t j = 0; j < simd_block; ++j) y[i + j] *= factor;
    for (; i < n; ++i) y[i] *= factor;
}

// dx = (dy - dot) * y
template <class T>
void softmax_grad_row(const T* __restrict dy, const T* __restrict y, T dot, T* __restrict dx, std::int64_t n) {
    std::int64_t i = 0;
    for (; i + simd_block <= n; i += simd_block)
        for (std::int64_t j = 0; j < simd_block; ++j) dx[i + j] = (dy[i + j] - dot) * y[i + j];
    for (; i < n; ++i) dx[i] = (dy[i] - dot) * y[i];
}

}  // namespace detail

template <>
struct host_kernel<ops::Softmax> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t n = c.extent("n");
        const std::int64_t rows = c.leading_numel(0);
        const T* x = c.input(0);
        T* y = c.output(0);
        for_each_row(rows, n, [&](std::int64_t r) {
            const T* xr = x + r * n;
            T* yr = y + r * n;
            const T sum = detail::softmax_exp_row(xr, detail::softmax_row_max(xr, n), yr, n);
            detail::softmax_scale_row(yr, T(1) / sum, n);
        });
    }
};

template <>
struct host_kernel<ops::SoftmaxGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t n = c.extent("n");
        const std::int64_t rows = c.leading_numel(0);
        const T* dy = c.input(0);
        const T* y = c.input(1);
        T* dx = c.output(0);
        for_each_row(rows, n, [&](std::int64_t r) {
            const T* dyr = dy + r * n;
            const T* yr = y + r * n;
            detail::softmax_grad_row(dyr, yr, detail::softmax_dot_row(dyr, yr, n), dx + r * n, n);
        });
    }
};

}  // namespace loom::host
// ---- end loom/runtime/host/kernels/softmax.hpp ----
// kernels-includes: normalization
// ---- begin loom/runtime/host/kernels/layer_norm.hpp ----
// Host kernels of layer_norm and layer_norm_grad. Rows are independent for y and dx; dgamma
// and dbeta sum over rows per fixed block of rows (rowwise.hpp), then over blocks in order,
// so every result is the same for any thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>

// ---- begin loom/runtime/host/kernels/rowwise.hpp ----
// Building blocks of row-wise host kernels (normalizations, embedding, cross-entropy):
// loops over a row that g++ -O2 vectorises, reductions in a fixed order, exp in either
// precision, sums over rows that do not depend on the thread count, reusable scratch, and
// positions for error messages.
//
// Why fixed 8-wide blocks: at -O2, g++'s very-cheap cost model vectorises only loops with
// no scalar epilogue, so `for (i < n)` stays scalar, while the fully unrolled 8-iteration
// body of `for_lanes` is vectorised. Call them from functions whose pointer parameters are
// `__restrict`, with lambdas that capture by value ([=]): restrict on a local variable, or a
// by-reference capture, does not reach the vectoriser, which then assumes aliasing.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>


namespace loom::host::detail {

inline constexpr int row_lanes = 8;

// f(i) for i in [0, n).
template <class F>
[[gnu::always_inline]] inline void for_lanes(std::int64_t n, F f) {
    std::int64_t i = 0;
    for (; i + row_lanes <= n; i += row_lanes)
        for (int j = 0; j < row_lanes; ++j) f(i + j);
    for (; i < n; ++i) f(i);
}

// sum of f(i) over [0, n): element i goes to accumulator i % 8 (in order), then the eight
// are combined as ((a0+a4)+(a1+a5))+((a2+a6)+(a3+a7)). A fixed order: deterministic.
template <class T, class F>
[[gnu::always_inline]] inline T lane_sum(std::int64_t n, F f) {
    T acc[row_lanes] = {};
    std::int64_t i = 0;
    for (; i + row_lanes <= n; i += row_lanes)
        for (int j = 0; j < row_lanes; ++j) acc[j] += f(i + j);
    for (int j = 0; i < n; ++i, ++j) acc[j] += f(i);
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// max of x[0, n), n >= 1 (a NaN in x may or may not propagate).
template <class T>
[[gnu::always_inline]] inline T lane_max(const T* __restrict x, std::int64_t n) {
    T acc[row_lanes];
    for (int j = 0; j < row_lanes; ++j) acc[j] = x[0];
    std::int64_t i = 0;
    for (; i + row_lanes <= n; i += row_lanes)
        for (int j = 0; j < row_lanes; ++j) acc[j] = acc[j] > x[i + j] ? acc[j] : x[i + j];
    for (int j = 0; i < n; ++i, ++j) acc[j] = acc[j] > x[i] ? acc[j] : x[i];
    T m = acc[0];
    for (int j = 1; j < row_lanes; ++j) m = m > acc[j] ? m : acc[j];
    return m;
}

// exp(x) for x <= 0 (x - row max) in the kernel's precision: float takes the vectorisable
// exp_nonpositive (vector_math.hpp; 0 below -87.3, NaN stays NaN, -inf gives 0), double
// keeps the library's exp, since the double path is what is cross-checked against PyTorch.
[[gnu::always_inline]] inline float lane_exp(float x) { return exp_nonpositive(x); }
[[gnu::always_inline]] inline double lane_exp(double x) { return std::exp(x); }

// Sums over rows are taken per block of this many rows, then block by block in order: the
// result depends on the row count only, never on how many threads ran the blocks.
inline constexpr std::int64_t block_rows = 64;

inline std::int64_t row_blocks(std::int64_t rows) { return (rows + block_rows - 1) / block_rows; }

// A per-thread buffer of at least n elements, reused across calls so kernels in a training
// loop stop allocating after the first step. `slot` separates buffers used at once. The
// contents are unspecified; the pointer is valid until the next call with the same slot on
// this thread.
template <class T, int slot = 0>
T* scratch(std::size_t n) {
    thread_local std::vector<T> buffer;
    if (buffer.size() < n) buffer.resize(n);
    return buffer.data();
}

// The sum of row_value(r) over rows [0, rows), in double, per block of block_rows rows and
// then block by block in order (the same for any thread count); `row_cost` elements of work
// per row sets the grain.
template <class F>
double sum_over_rows(std::int64_t rows, std::int64_t row_cost, F&& row_value) {
    const std::int64_t blocks = row_blocks(rows);
    double* partial = scratch<double>(static_cast<std::size_t>(std::max<std::int64_t>(blocks, 1)));
    const std::int64_t grain = std::max<std::int64_t>(1, elementwise_grain / (block_rows * std::max<std::int64_t>(row_cost, 1)));
    parallel_for(0, blocks, grain, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t b = lo; b < hi; ++b) {
            double s = 0;
            const std::int64_t end = std::min(rows, (b + 1) * block_rows);
            for (std::int64_t r = b * block_rows; r < end; ++r) s += row_value(r);
            partial[b] = s;
        }
    });
    double total = 0;
    for (std::int64_t b = 0; b < blocks; ++b) total += partial[b];
    return total;
}

// out[i] += in[i] for i in [0, n). A function, not a lambda, so the __restrict on its
// parameters reaches the vectoriser.
template <class T>
void add_row(T* __restrict out, const T* __restrict in, std::int64_t n) {
    for_lanes(n, [=](std::int64_t i) { out[i] += in[i]; });
}

// out[j] = sum over b in [0, blocks) of partial[b * stride + j], for j in [0, width), with b
// ascending. Columns are split across threads; each column's order is fixed.
template <class T>
void sum_blocks(const T* partial, std::int64_t blocks, std::int64_t stride, std::int64_t width, T* out) {
    const std::int64_t grain = std::max<std::int64_t>(row_lanes, (std::int64_t{1} << 14) / std::max<std::int64_t>(blocks, 1));
    parallel_for(0, width, grain, [=](std::int64_t lo, std::int64_t hi) {
        std::copy(partial + lo, partial + hi, out + lo);
        for (std::int64_t b = 1; b < blocks; ++b) add_row(out + lo, partial + b * stride + lo, hi - lo);
    });
}

// "position 13 (Batch 1, Seq 5) of 'tokens' [Batch=2, Seq=8]": a flat row-major position
// with its index along each axis.
inline std::string describe_position(std::int64_t flat, const shape& s, const std::string& tensor_name) {
    std::string index;
    std::int64_t rest = flat;
    for (std::size_t a = s.rank(); a-- > 0;) {
        const std::int64_t e = s.extent(a);
        std::string part = std::string(s.dim(a).name()) + " " + std::to_string(e > 0 ? rest % e : 0);
        index = index.empty() ? part : part + ", " + index;
        rest = e > 0 ? rest / e : 0;
    }
    std::string out = "position " + std::to_string(flat);
    if (!index.empty()) out += " (" + index + ")";
    return out + " of '" + tensor_name + "' " + s.to_string();
}

}  // namespace loom::host::detail
// ---- end loom/runtime/host/kernels/rowwise.hpp ----

namespace loom::host {

namespace detail {

template <class T>
struct row_moments {
    T mean;
    T rstd;
};

// Two-pass mean and biased variance of one row.
template <class T>
[[gnu::always_inline]] inline row_moments<T> layer_norm_moments(const T* __restrict x, std::int64_t h, T eps) {
    const T mean = lane_sum<T>(h, [=](std::int64_t i) { return x[i]; }) / static_cast<T>(h);
    const T var = lane_sum<T>(h, [=](std::int64_t i) {
                      const T d = x[i] - mean;
                      return d * d;
                  }) /
                  static_cast<T>(h);
    return {mean, T(1) / std::sqrt(var + eps)};
}

template <class T>
void layer_norm_row(const T* __restrict x, const T* __restrict gamma, const T* __restrict beta, T* __restrict y,
                    std::int64_t h, T eps) {
    const auto [mean, rstd] = layer_norm_moments(x, h, eps);
    for_lanes(h, [=](std::int64_t i) { y[i] = (x[i] - mean) * rstd * gamma[i] + beta[i]; });
}

// With xhat = (x - mean) rstd and g = dy gamma:
//   dx = rstd (g - mean(g) - xhat mean(g xhat)),  dgamma += dy xhat,  dbeta += dy.
template <class T>
void layer_norm_grad_row(const T* __restrict dy, const T* __restrict x, const T* __restrict gamma, T* __restrict dx,
                         T* __restrict dgamma, T* __restrict dbeta, std::int64_t h, T eps) {
    const auto [mean, rstd] = layer_norm_moments(x, h, eps);
    const T mean_g = lane_sum<T>(h, [=](std::int64_t i) { return dy[i] * gamma[i]; }) / static_cast<T>(h);
    const T mean_gx = lane_sum<T>(h, [=](std::int64_t i) { return dy[i] * gamma[i] * ((x[i] - mean) * rstd); }) /
                      static_cast<T>(h);
    for_lanes(h, [=](std::int64_t i) {
        const T xhat = (x[i] - mean) * rstd;
        dx[i] = rstd * (dy[i] * gamma[i] - mean_g - xhat * mean_gx);
        dgamma[i] += dy[i] * xhat;
        dbeta[i] += dy[i];
    });
}

}  // namespace detail

template <>
struct host_kernel<ops::LayerNorm> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t h = c.extent("h");
        const std::int64_t rows = c.input_numel(0) / h;
        const T eps = static_cast<T>(c.attrs().template get<double>("eps"));
        const T *x = c.input(0), *gamma = c.input(1), *beta = c.input(2);
        T* y = c.output(0);
        for_each_row(rows, h, [&](std::int64_t r) { detail::layer_norm_row(x + r * h, gamma, beta, y + r * h, h, eps); });
    }
};

template <>
struct host_kernel<ops::LayerNormGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t h = c.extent("h");
        const std::int64_t rows = c.input_numel(1) / h;
        const T eps = static_cast<T>(c.attrs().template get<double>("eps"));
        const T *dy = c.input(0), *x = c.input(1), *gamma = c.input(2);
        T *dx = c.output(0), *dgamma = c.output(1), *dbeta = c.output(2);
        const std::int64_t blocks = detail::row_blocks(rows);
        // Block b's partial dgamma at partial[b * 2h], its partial dbeta right after.
        T* partial = detail::scratch<T>(static_cast<std::size_t>(blocks * 2 * h));
        const std::int64_t grain = std::max<std::int64_t>(1, elementwise_grain / (detail::block_rows * h));
        parallel_for(0, blocks, grain, [&](std::int64_t lo, std::int64_t hi) {
            for (std::int64_t b = lo; b < hi; ++b) {
                T* pg = partial + b * 2 * h;
                T* pb = pg + h;
                std::fill(pg, pg + 2 * h, T(0));
                const std::int64_t end = std::min(rows, (b + 1) * detail::block_rows);
                for (std::int64_t r = b * detail::block_rows; r < end; ++r)
                    detail::layer_norm_grad_row(dy + r * h, x + r * h, gamma, dx + r * h, pg, pb, h, eps);
            }
        });
        detail::sum_blocks(partial, blocks, 2 * h, h, dgamma);
        detail::sum_blocks(partial + h, blocks, 2 * h, h, dbeta);
    }
};

}  // namespace loom::host
// ---- end loom/runtime/host/kernels/layer_norm.hpp ----
// ---- begin loom/runtime/host/kernels/rms_norm.hpp ----
// Host kernels of rms_norm and rms_norm_grad. Rows are independent for y and dx; dgamma sums
// over rows per fixed block of rows (rowwise.hpp), then over blocks in order, so every
// result is the same for any thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>


namespace loom::host {

namespace detail {

// 1 / sqrt(mean(x^2) + eps) of one row.
template <class T>
[[gnu::always_inline]] inline T rms_norm_rstd(const T* __restrict x, std::int64_t h, T eps) {
    const T mean_sq = lane_sum<T>(h, [=](std::int64_t i) { return x[i] * x[i]; }) / static_cast<T>(h);
    return T(1) / std::sqrt(mean_sq + eps);
}

template <class T>
void rms_norm_row(const T* __restrict x, const T* __restrict gamma, T* __restrict y, std::int64_t h, T eps) {
    const T rstd = rms_norm_rstd(x, h, eps);
    for_lanes(h, [=](std::int64_t i) { y[i] = x[i] * rstd * gamma[i]; });
}

// With g = dy gamma:  dx = rstd (g - x rstd^2 mean(g x)),  dgamma += dy x rstd.
template <class T>
void rms_norm_grad_row(const T* __restrict dy, const T* __restrict x, const T* __restrict gamma, T* __restrict dx,
                       T* __restrict dgamma, std::int64_t h, T eps) {
    const T rstd = rms_norm_rstd(x, h, eps);
    const T mean_gx = lane_sum<T>(h, [=](std::int64_t i) { return dy[i] * gamma[i] * x[i]; }) / static_cast<T>(h);
    const T c = rstd * rstd * mean_gx;
    for_lanes(h, [=](std::int64_t i) {
        dx[i] = rstd * (dy[i] * gamma[i] - x[i] * c);
        dgamma[i] += dy[i] * (x[i] * rstd);
    });
}

}  // namespace detail

template <>
struct host_kernel<ops::RmsNorm> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t h = c.extent("h");
        const std::int64_t rows = c.input_numel(0) / h;
        const T eps = static_cast<T>(c.attrs().template get<double>("eps"));
        const T *x = c.input(0), *gamma = c.input(1);
        T* y = c.output(0);
        for_each_row(rows, h, [&](std::int64_t r) { detail::rms_norm_row(x + r * h, gamma, y + r * h, h, eps); });
    }
};

template <>
struct host_kernel<ops::RmsNormGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t h = c.extent("h");
        const std::int64_t rows = c.input_numel(1) / h;
        const T eps = static_cast<T>(c.attrs().template get<double>("eps"));
        const T *dy = c.input(0), *x = c.input(1), *gamma = c.input(2);
        T *dx = c.output(0), *dgamma = c.output(1);
        const std::int64_t blocks = detail::row_blocks(rows);
        // Block b's partial dgamma at partial[b * h].
        T* partial = detail::scratch<T>(static_cast<std::size_t>(blocks * h));
        const std::int64_t grain = std::max<std::int64_t>(1, elementwise_grain / (detail::block_rows * h));
        parallel_for(0, blocks, grain, [&](std::int64_t lo, std::int64_t hi) {
            for (std::int64_t b = lo; b < hi; ++b) {
                T* pg = partial + b * h;
                std::fill(pg, pg + h, T(0));
                const std::int64_t end = std::min(rows, (b + 1) * detail::block_rows);
                for (std::int64_t r = b * detail::block_rows; r < end; ++r)
                    detail::rms_norm_grad_row(dy + r * h, x + r * h, gamma, dx + r * h, pg, h, eps);
            }
        });
        detail::sum_blocks(partial, blocks, h, h, dgamma);
    }
};

}  // namespace loom::host
// ---- end loom/runtime/host/kernels/rms_norm.hpp ----
// kernels-includes: attention and shapes
// ---- begin loom/runtime/host/kernels/attention.hpp ----
// Kernels of attention and attention_grad, flash-attention style: queries are taken in tiles
// of 32, the scores of a tile live only in a per-thread scratch of keys x 32, and under the
// causal mask no key after a tile's last query is computed.
//
// The scratch is key-major: row j holds the scores of key j against the tile's queries, so
// the softmax of each query (a column) is elementwise work over rows, with no reduction
// across vector lanes. Per (batch, head) and tile of queries [i0, i1), keys j < kn
// (kn = i1 when causal, t otherwise):
//   forward   S^T = scale K Q^T,  P^T = exp(S^T - max) column by column (causal: j <= i),
//             O = P V / sum,  lse = max + log(sum)
//   backward  P^T = exp(scale K Q^T - lse),  D = rowsum(dO * O),
//             dV += P^T dO,  dP^T = V dO^T,  dS^T = P^T * (dP^T - D),
//             dQ = scale dS K,  dK += scale dS^T Q
// Only the tile's Q (and dO) are transposed, into d x 32 (e x 32) scratch.
//
// Determinism: forward tiles are independent, a (batch, head)'s backward runs on one thread
// with its tiles in order, and every sum has a fixed order: results do not depend on the
// thread count.
//
// Vector code is written with GCC vector extensions (also understood by Clang), compiled for
// AVX-512, AVX2 and baseline x86-64 and chosen at run time as gemm chooses its micro-kernel.
// exp is a Cephes polynomial: within 1 ulp (float) and 2 ulp (double) of the correctly
// rounded value; inputs below about -88 (float) or -709 (double) flush to 0.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>


namespace loom::host {

namespace detail::attention {

// Queries per tile: the row length of the key-major scratch.
inline constexpr std::int64_t query_tile = 32;
// Elements per block of the column passes.
inline constexpr std::int64_t lanes = 16;
inline constexpr std::int64_t blocks_per_row = query_tile / lanes;

template <class T>
struct simd;
template <>
struct simd<float> {
    using real = float __attribute__((vector_size(64)));
    using integer = std::int32_t __attribute__((vector_size(64)));
};
template <>
struct simd<double> {
    using real = double __attribute__((vector_size(128)));
    using integer = std::int64_t __attribute__((vector_size(128)));
    using narrow = std::int32_t __attribute__((vector_size(64)));
};
template <class T>
using block = typename simd<T>::real;

// Blocks pass by reference: a vector passed by value would change the ABI between the
// instruction sets this code is compiled for.
template <class T>
[[gnu::always_inline]] inline void load(block<T>& v, const T* p) {
    std::memcpy(&v, p, sizeof v);
}
template <class T>
[[gnu::always_inline]] inline void store(T* p, const block<T>& v) {
    std::memcpy(p, &v, sizeof v);
}

// x = exp(x) lane by lane: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by a polynomial, 2^n
// built in the exponent bits. Inputs below the range flush to +0 (n reaches the zero
// exponent); NaN stays NaN.
[[gnu::always_inline]] inline void exp_block(simd<float>::real& x) {
    using V = simd<float>::real;
    using I = simd<float>::integer;
    const V zero = {};
    x = x > 88.0f ? zero + 88.0f : x;
    x = x < -88.0f ? zero - 88.0f : x;
    // n = floor(x log2(e) + 1/2): the offset keeps the truncated value non-negative.
    const I n = __builtin_convertvector(x * 1.44269504088896341f + 127.5f, I) - 127;
    const V fn = __builtin_convertvector(n, V);
    V r = x - fn * 0.693359375f;
    r = r - fn * -2.12194440e-4f;
    V p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    x = p * __builtin_bit_cast(V, (n + 127) << 23);
}

[[gnu::always_inline]] inline void exp_block(simd<double>::real& x) {
    using V = simd<double>::real;
    using I = simd<double>::integer;
    using N = simd<double>::narrow;
    const V zero = {};
    x = x > 709.0 ? zero + 709.0 : x;
    x = x < -709.0 ? zero - 709.0 : x;
    const N n = __builtin_convertvector(x * 1.4426950408889634074 + 1023.5, N) - 1023;
    const V fn = __builtin_convertvector(n, V);
    V r = x - fn * 6.93145751953125e-1;
    r = r - fn * 1.42860682030941723212e-6;
    // exp(r) = 1 + 2 r P(r^2) / (Q(r^2) - r P(r^2))
    const V rr = r * r;
    const V pr = r * ((rr * 1.26177193074810590878e-4 + 3.02994407707441961300e-2) * rr + 9.99999999999999999910e-1);
    const V q = ((rr * 3.00198505138664455042e-6 + 2.52448340349684104192e-3) * rr + 2.27265548208155028766e-1) * rr +
                2.00000000000000000009e0;
    const V e = pr / (q - pr) * 2.0 + 1.0;
    const I bits = (__builtin_convertvector(n, I) + 1023) << 52;
    x = e * __builtin_bit_cast(V, bits);
}

template <class T>
[[gnu::always_inline]] inline void fill(block<T>& v, T value) {
    v = block<T>{} + value;
}

// The lane numbers of the blocks of a scratch row: 0, 1, ..., query_tile - 1.
template <class T>
struct lane_numbers {
    block<T> of[blocks_per_row];
    lane_numbers() {
        for (std::int64_t b = 0; b < blocks_per_row; ++b)
            for (std::int64_t l = 0; l < lanes; ++l) of[b][l] = static_cast<T>(b * lanes + l);
    }
};

// Under the causal mask, query i0 + i sees key j only when j <= i0 + i: in key row j, the
// lanes i < j - i0 are masked (set to `masked`). Keys j <= i0 mask nothing.
template <class T>
[[gnu::always_inline]] inline void mask_future(block<T>& x, const block<T>& lane, std::int64_t first_seen, T masked) {
    x = lane < static_cast<T>(first_seen) ? block<T>{} + masked : x;
}

// Forward: st (kn rows of query_tile) becomes exp(S^T - max) column by column; top and sum
// receive each column's max and sum of exponentials.
template <class T>
[[gnu::always_inline]] inline void softmax_columns(T* __restrict st, std::int64_t kn, std::int64_t i0, bool causal,
                                                   T* __restrict top, T* __restrict sum) {
    const T minus_inf = -std::numeric_limits<T>::infinity();
    const std::int64_t unmasked = causal ? std::min(kn, i0 + 1) : kn;
    const lane_numbers<T> lane;
    block<T> m[blocks_per_row], x;
    for (auto& v : m) fill<T>(v, minus_inf);
    for (std::int64_t j = 0; j < unmasked; ++j)
        for (std::int64_t b = 0; b < blocks_per_row; ++b) {
            load(x, st + j * query_tile + b * lanes);
            m[b] = x > m[b] ? x : m[b];
        }
    for (std::int64_t j = unmasked; j < kn; ++j)
        for (std::int64_t b = 0; b < blocks_per_row; ++b) {
            T* at = st + j * query_tile + b * lanes;
            load(x, at);
            mask_future<T>(x, lane.of[b], j - i0, minus_inf);
            store(at, x);
            m[b] = x > m[b] ? x : m[b];
        }
    block<T> total[blocks_per_row];
    for (auto& v : total) v = block<T>{};
    for (std::int64_t j = 0; j < kn; ++j)
        for (std::int64_t b = 0; b < blocks_per_row; ++b) {
            T* at = st + j * query_tile + b * lanes;
            load(x, at);
            x -= m[b];
            exp_block(x);
            total[b] += x;
            store(at, x);
        }
    for (std::int64_t b = 0; b < blocks_per_row; ++b) {
        store(top + b * lanes, m[b]);
        store(sum + b * lanes, total[b]);
    }
}

// Backward: st = exp(S^T - lse) column by column, 0 where masked.
template <class T>
[[gnu::always_inline]] inline void probabilities_columns(T* __restrict st, std::int64_t kn, std::int64_t i0,
                                                         bool causal, const T* __restrict lse) {
    const std::int64_t unmasked = causal ? std::min(kn, i0 + 1) : kn;
    const lane_numbers<T> lane;
    block<T> shift[blocks_per_row], x;
    for (std::int64_t b = 0; b < blocks_per_row; ++b) load(shift[b], lse + b * lanes);
    for (std::int64_t j = 0; j < kn; ++j)
        for (std::int64_t b = 0; b < blocks_per_row; ++b) {
            T* at = st + j * query_tile + b * lanes;
            load(x, at);
            x -= shift[b];
            exp_block(x);
            if (j >= unmasked) mask_future<T>(x, lane.of[b], j - i0, T(0));
            store(at, x);
        }
}

// Backward: dst = pt * (dst - D) column by column; masked entries of pt are 0, so dS is too.
template <class T>
[[gnu::always_inline]] inline void score_grad_columns(const T* __restrict pt, T* __restrict dst, std::int64_t kn,
                                                      const T* __restrict delta) {
    block<T> d[blocks_per_row], x, y;
    for (std::int64_t b = 0; b < blocks_per_row; ++b) load(d[b], delta + b * lanes);
    for (std::int64_t j = 0; j < kn; ++j)
        for (std::int64_t b = 0; b < blocks_per_row; ++b) {
            const std::int64_t at = j * query_tile + b * lanes;
            load(x, pt + at);
            load(y, dst + at);
            y = x * (y - d[b]);
            store(dst + at, y);
        }
}

// sum_c x[c] y[c]: blocks of lanes, then the lanes pairwise, then the remainder in order.
template <class T>
[[gnu::always_inline]] inline T dot(const T* __restrict x, const T* __restrict y, std::int64_t n) {
    block<T> acc = {}, a, b;
    std::int64_t c = 0;
    for (; c + lanes <= n; c += lanes) {
        load(a, x + c);
        load(b, y + c);
        acc += a * b;
    }
    T partial[lanes];
    std::memcpy(partial, &acc, sizeof acc);
    for (std::int64_t width = lanes / 2; width > 0; width /= 2)
        for (std::int64_t l = 0; l < width; ++l) partial[l] += partial[l + width];
    T sum = partial[0];
    for (; c < n; ++c) sum += x[c] * y[c];
    return sum;
}

// ---- products of a tile ----------------------------------------------------------------
// The operands are small (a tile of 32 queries, head dims of 32..128), so the products run
// on them in place, without gemm's packing: B's rows are contiguous and A is read one
// element at a time through two strides, which also reads S^T as S.

template <class T, int W>
struct native {
    typedef T type __attribute__((vector_size(W * sizeof(T))));
};

// A(i, p) = data[i * row + p * col]
template <class T>
struct strided {
    const T* data;
    std::int64_t row, col;
};

// C[0, R) x [0, CV W) = alpha A B (+ C when accumulate), B's rows ldb apart. With
// row_scale, row r is scaled by alpha row_scale[r] instead.
template <class T, int W, int R, int CV>
[[gnu::always_inline]] inline void product_block(std::int64_t k, const T* __restrict a, std::int64_t a_row,
                                                 std::int64_t a_col, const T* __restrict b, std::int64_t ldb,
                                                 T* __restrict c, std::int64_t ldc, T alpha, const T* row_scale,
                                                 bool accumulate) {
    using V = typename native<T, W>::type;
    V acc[R][CV];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int v = 0; v < CV; ++v) acc[r][v] = V{};
    for (std::int64_t p = 0; p < k; ++p) {
        V bv[CV];
#pragma GCC unroll 4
        for (int v = 0; v < CV; ++v) std::memcpy(&bv[v], b + p * ldb + v * W, sizeof(V));
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            const T av = a[r * a_row + p * a_col];
#pragma GCC unroll 4
            for (int v = 0; v < CV; ++v) acc[r][v] += av * bv[v];
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        const T factor = row_scale ? alpha * row_scale[r] : alpha;
#pragma GCC unroll 4
        for (int v = 0; v < CV; ++v) {
            V result = acc[r][v] * factor;
            T* out = c + r * ldc + v * W;
            if (accumulate) {
                V old;
                std::memcpy(&old, out, sizeof(V));
                result += old;
            }
            std::memcpy(out, &result, sizeof(V));
        }
    }
}

// Columns [j, j + CV W) of product(): R rows at a time, then the remaining rows one by one.
// (A helper function rather than a lambda: a lambda would not take its caller's target.)
template <class T, int W, int R, int CV>
[[gnu::always_inline]] inline void product_columns(std::int64_t j, std::int64_t m, std::int64_t k, strided<T> a,
                                                   const T* b, std::int64_t ldb, T* c, std::int64_t ldc, T alpha,
                                                   bool accumulate, const T* row_scale) {
    std::int64_t i = 0;
    for (; i + R <= m; i += R)
        product_block<T, W, R, CV>(k, a.data + i * a.row, a.row, a.col, b + j, ldb, c + i * ldc + j, ldc, alpha,
                                   row_scale ? row_scale + i : nullptr, accumulate);
    for (; i < m; ++i)
        product_block<T, W, 1, CV>(k, a.data + i * a.row, a.row, a.col, b + j, ldb, c + i * ldc + j, ldc, alpha,
                                   row_scale ? row_scale + i : nullptr, accumulate);
}

// C (m x n, rows ldc apart) = alpha A B (+ C when accumulate); A is m x k, B is k x n.
// With row_scale, row i of the product is scaled by alpha row_scale[i]. Register tiles of
// R rows by 2 W columns, then W columns, then the last n mod W columns one by one; every
// element sums over p in order.
template <class T, int W, int R>
[[gnu::always_inline]] inline void product(std::int64_t m, std::int64_t n, std::int64_t k, strided<T> a,
                                           const T* b, std::int64_t ldb, T* c, std::int64_t ldc, T alpha,
                                           bool accumulate, const T* row_scale = nullptr) {
    std::int64_t j = 0;
    for (; j + 2 * W <= n; j += 2 * W)
        product_columns<T, W, R, 2>(j, m, k, a, b, ldb, c, ldc, alpha, accumulate, row_scale);
    for (; j + W <= n; j += W) product_columns<T, W, R, 1>(j, m, k, a, b, ldb, c, ldc, alpha, accumulate, row_scale);
    for (std::int64_t i = 0; i < m && j < n; ++i) {
        const T factor = row_scale ? alpha * row_scale[i] : alpha;
        for (std::int64_t jj = j; jj < n; ++jj) {
            T sum = 0;
            for (std::int64_t p = 0; p < k; ++p) sum += a.data[i * a.row + p * a.col] * b[p * ldb + jj];
            c[i * ldc + jj] = accumulate ? c[i * ldc + jj] + factor * sum : factor * sum;
        }
    }
}

// ---- the kernels ---------------------------------------------------------------------------

// The extents of one node: `pairs` (batch, head) pairs of s queries and t keys.
struct problem {
    std::int64_t pairs, s, t, d, e;
    bool causal;
    double scale;

    std::int64_t tiles() const { return (s + query_tile - 1) / query_tile; }
    // Keys seen by the tile whose queries end at i1.
    std::int64_t keys(std::int64_t i1) const { return causal ? i1 : t; }
};

template <class T>
problem problem_of(const kernel_call<T>& c) {
    problem p;
    p.pairs = c.extent("b") * c.extent("h");
    p.s = c.extent("s");
    p.t = c.extent("t");
    p.d = c.extent("d");
    p.e = c.extent("e");
    p.causal = c.attrs().template get_or<std::int64_t>("causal", 1) != 0;
    p.scale = c.attrs().template get_or<double>("scale", 1.0 / std::sqrt(static_cast<double>(p.d)));
    return p;
}

// Per-thread scratch. Lanes of a partial tile past its last query hold zeros (or finite
// leftovers) and are never read back.
template <class T>
struct workspace {
    std::vector<T> scores, score_grads, queries_t, grads_t, lanes_a, lanes_b;
    workspace(const problem& p, bool backward)
        : scores(static_cast<std::size_t>(p.t * query_tile)),
          score_grads(backward ? scores.size() : 0),
          queries_t(static_cast<std::size_t>(p.d * query_tile)),
          grads_t(backward ? static_cast<std::size_t>(p.e * query_tile) : 0),
          lanes_a(static_cast<std::size_t>(query_tile)),
          lanes_b(static_cast<std::size_t>(query_tile)) {}
};

// xt[p, i] = x[i, p] for the `rows` rows of x (cols wide); rows of xt are query_tile long,
// and lanes past `rows` are zero.
template <class T>
[[gnu::always_inline]] inline void transpose_tile(const T* __restrict x, std::int64_t rows, std::int64_t cols,
                                                  T* __restrict xt) {
    for (std::int64_t p = 0; p < cols; ++p) {
        T* __restrict row = xt + p * query_tile;
        for (std::int64_t i = 0; i < rows; ++i) row[i] = x[i * cols + p];
        for (std::int64_t i = rows; i < query_tile; ++i) row[i] = T(0);
    }
}

template <class T>
struct tensors {
    const T *q, *k, *v, *out, *lse, *dout;
    T *out_w, *lse_w, *dq, *dk, *dv;
};

// Forward tiles [lo, hi), numbered pair * tiles + tile. W: lanes of a vector register,
// R: rows of a register tile.
template <class T, int W, int R>
[[gnu::always_inline]] inline void forward_tiles(const problem& p, const tensors<T>& x, std::int64_t lo,
                                                 std::int64_t hi, workspace<T>& ws) {
    const std::int64_t tiles = p.tiles();
    const T scale = static_cast<T>(p.scale);
    T* st = ws.scores.data();
    T* top = ws.lanes_a.data();
    T* sum = ws.lanes_b.data();
    for (std::int64_t item = lo; item < hi; ++item) {
        const std::int64_t pair = item / tiles;
        const std::int64_t i0 = item % tiles * query_tile;
        const std::int64_t rows = std::min(query_tile, p.s - i0);
        const std::int64_t kn = p.keys(i0 + rows);
        transpose_tile(x.q + (pair * p.s + i0) * p.d, rows, p.d, ws.queries_t.data());
        product<T, W, R>(kn, query_tile, p.d, {x.k + pair * p.t * p.d, p.d, 1}, ws.queries_t.data(), query_tile, st,
                         query_tile, scale, false);
        softmax_columns(st, kn, i0, p.causal, top, sum);
        T* lse = x.lse_w + pair * p.s + i0;
        for (std::int64_t i = 0; i < rows; ++i) {
            lse[i] = top[i] + std::log(sum[i]);
            sum[i] = T(1) / sum[i];
        }
        // O = P V / sum
        product<T, W, R>(rows, p.e, kn, {st, 1, query_tile}, x.v + pair * p.t * p.e, p.e,
                         x.out_w + (pair * p.s + i0) * p.e, p.e, T(1), false, sum);
    }
}

// The backward of pairs [lo, hi), the tiles of a pair in order.
template <class T, int W, int R>
[[gnu::always_inline]] inline void backward_pairs(const problem& p, const tensors<T>& x, std::int64_t lo,
                                                  std::int64_t hi, workspace<T>& ws) {
    const std::int64_t tiles = p.tiles();
    const T scale = static_cast<T>(p.scale);
    T* st = ws.scores.data();
    T* dst = ws.score_grads.data();
    T* lse = ws.lanes_a.data();
    T* delta = ws.lanes_b.data();
    for (std::int64_t pair = lo; pair < hi; ++pair) {
        const T* k = x.k + pair * p.t * p.d;
        const T* v = x.v + pair * p.t * p.e;
        T* dk = x.dk + pair * p.t * p.d;
        T* dv = x.dv + pair * p.t * p.e;
        std::fill(dk, dk + p.t * p.d, T(0));
        std::fill(dv, dv + p.t * p.e, T(0));
        for (std::int64_t tile = 0; tile < tiles; ++tile) {
            const std::int64_t i0 = tile * query_tile;
            const std::int64_t rows = std::min(query_tile, p.s - i0);
            const std::int64_t kn = p.keys(i0 + rows);
            const T* q = x.q + (pair * p.s + i0) * p.d;
            const T* dout = x.dout + (pair * p.s + i0) * p.e;
            const T* out = x.out + (pair * p.s + i0) * p.e;
            for (std::int64_t i = 0; i < query_tile; ++i) {
                delta[i] = i < rows ? dot(dout + i * p.e, out + i * p.e, p.e) : T(0);
                lse[i] = i < rows ? x.lse[pair * p.s + i0 + i] : T(0);
            }
            transpose_tile(q, rows, p.d, ws.queries_t.data());
            transpose_tile(dout, rows, p.e, ws.grads_t.data());
            // P^T = exp(scale K Q^T - lse)
            product<T, W, R>(kn, query_tile, p.d, {k, p.d, 1}, ws.queries_t.data(), query_tile, st, query_tile, scale,
                             false);
            probabilities_columns(st, kn, i0, p.causal, lse);
            // dV += P^T dO
            product<T, W, R>(kn, p.e, rows, {st, query_tile, 1}, dout, p.e, dv, p.e, T(1), true);
            // dS^T = P^T * (V dO^T - D)
            product<T, W, R>(kn, query_tile, p.e, {v, p.e, 1}, ws.grads_t.data(), query_tile, dst, query_tile, T(1),
                             false);
            score_grad_columns(st, dst, kn, delta);
            // dQ = scale dS K,  dK += scale dS^T Q
            product<T, W, R>(rows, p.d, kn, {dst, 1, query_tile}, k, p.d, x.dq + (pair * p.s + i0) * p.d, p.d, scale,
                             false);
            product<T, W, R>(kn, p.d, rows, {dst, query_tile, 1}, q, p.d, dk, p.d, scale, true);
        }
    }
}

// One entry per instruction set, chosen at run time as gemm chooses its micro-kernel:
// W fills one vector register, R rows keep the 2 R accumulators in registers.
// optimize("O2"): at -O0, g++ 12 cannot lower these wide generic vectors ("unrecognizable
// insn", an internal compiler error), so a user's debug build would not compile.
template <class T>
[[gnu::target("avx512f"), gnu::optimize("O2")]] void forward_avx512(const problem& p, const tensors<T>& x, std::int64_t lo,
                                               std::int64_t hi, workspace<T>& ws) {
    forward_tiles<T, 64 / sizeof(T), 8>(p, x, lo, hi, ws);
}
template <class T>
[[gnu::target("avx2,fma"), gnu::optimize("O2")]] void forward_avx2(const problem& p, const tensors<T>& x, std::int64_t lo,
                                              std::int64_t hi, workspace<T>& ws) {
    forward_tiles<T, 32 / sizeof(T), 4>(p, x, lo, hi, ws);
}
template <class T>
void forward_portable(const problem& p, const tensors<T>& x, std::int64_t lo, std::int64_t hi, workspace<T>& ws) {
    forward_tiles<T, 16 / sizeof(T), 4>(p, x, lo, hi, ws);
}
template <class T>
[[gnu::target("avx512f"), gnu::optimize("O2")]] void backward_avx512(const problem& p, const tensors<T>& x, std::int64_t lo,
                                                std::int64_t hi, workspace<T>& ws) {
    backward_pairs<T, 64 / sizeof(T), 8>(p, x, lo, hi, ws);
}
template <class T>
[[gnu::target("avx2,fma"), gnu::optimize("O2")]] void backward_avx2(const problem& p, const tensors<T>& x, std::int64_t lo,
                                               std::int64_t hi, workspace<T>& ws) {
    backward_pairs<T, 32 / sizeof(T), 4>(p, x, lo, hi, ws);
}
template <class T>
void backward_portable(const problem& p, const tensors<T>& x, std::int64_t lo, std::int64_t hi, workspace<T>& ws) {
    backward_pairs<T, 16 / sizeof(T), 4>(p, x, lo, hi, ws);
}

// The kernels; `isa` must be supported by this CPU (tests pin each one this way).
inline void require_supported(gemm_isa isa) {
    if (!gemm_isa_supported(isa))
        throw usage_error(std::string("attention kernels: this CPU cannot run the ") + to_string(isa) +
                          " variant; pass gemm_best_isa() or check gemm_isa_supported() first");
}

template <class T>
void forward(const kernel_call<T>& c, gemm_isa isa = gemm_best_isa()) {
    require_supported(isa);
    const problem p = problem_of(c);
    tensors<T> x{};
    x.q = c.input(0);
    x.k = c.input(1);
    x.v = c.input(2);
    x.out_w = c.output(0);
    x.lse_w = c.output(1);
    parallel_for(0, p.pairs * p.tiles(), 1, [&](std::int64_t lo, std::int64_t hi) {
        workspace<T> ws(p, false);
        switch (isa) {
            case gemm_isa::avx512f: forward_avx512<T>(p, x, lo, hi, ws); return;
            case gemm_isa::avx2_fma: forward_avx2<T>(p, x, lo, hi, ws); return;
            case gemm_isa::portable: forward_portable<T>(p, x, lo, hi, ws); return;
        }
    });
}

template <class T>
void backward(const kernel_call<T>& c, gemm_isa isa = gemm_best_isa()) {
    require_supported(isa);
    const problem p = problem_of(c);
    tensors<T> x{};
    x.dout = c.input(0);
    x.q = c.input(1);
    x.k = c.input(2);
    x.v = c.input(3);
    x.out = c.input(4);
    x.lse = c.input(5);
    x.dq = c.output(0);
    x.dk = c.output(1);
    x.dv = c.output(2);
    parallel_for(0, p.pairs, 1, [&](std::int64_t lo, std::int64_t hi) {
        workspace<T> ws(p, true);
        switch (isa) {
            case gemm_isa::avx512f: backward_avx512<T>(p, x, lo, hi, ws); return;
            case gemm_isa::avx2_fma: backward_avx2<T>(p, x, lo, hi, ws); return;
            case gemm_isa::portable: backward_portable<T>(p, x, lo, hi, ws); return;
        }
    });
}

}  // namespace detail::attention

template <>
struct host_kernel<ops::Attention> {
    template <class T>
    static void run(const kernel_call<T>& c) { detail::attention::forward<T>(c); }
};

template <>
struct host_kernel<ops::AttentionGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) { detail::attention::backward<T>(c); }
};

}  // namespace loom::host
// ---- end loom/runtime/host/kernels/attention.hpp ----
// ---- begin loom/runtime/host/kernels/heads.hpp ----
// Kernels of split_heads and merge_heads: each moves rows of head_dim contiguous elements
// between [batch, seq, heads, head_dim] and [batch, heads, seq, head_dim] order.
#include <cstring>


namespace loom::host {

namespace detail {
// Row (b, h, s) of the head-major tensor <-> row (b, s, h) of the sequence-major one.
template <class T>
void move_head_rows(const kernel_call<T>& c, bool to_head_major) {
    const std::int64_t batch = c.extent("b"), seq = c.extent("s"), heads = c.extent("h"), dim = c.extent("d");
    const T* x = c.input(0);
    T* y = c.output(0);
    const auto bytes = static_cast<std::size_t>(dim) * sizeof(T);
    for_each_row(batch * heads * seq, dim, [&](std::int64_t r) {
        const std::int64_t s = r % seq, h = r / seq % heads, b = r / (seq * heads);
        const std::int64_t sequence_major = ((b * seq + s) * heads + h) * dim;
        if (to_head_major)
            std::memcpy(y + r * dim, x + sequence_major, bytes);
        else
            std::memcpy(y + sequence_major, x + r * dim, bytes);
    });
}
}  // namespace detail

template <>
struct host_kernel<ops::SplitHeads> {
    template <class T>
    static void run(const kernel_call<T>& c) { detail::move_head_rows<T>(c, true); }
};

template <>
struct host_kernel<ops::MergeHeads> {
    template <class T>
    static void run(const kernel_call<T>& c) { detail::move_head_rows<T>(c, false); }
};

}  // namespace loom::host
// ---- end loom/runtime/host/kernels/heads.hpp ----
// ---- begin loom/runtime/host/kernels/matmul.hpp ----
// Kernels of matmul, matmul_nt and matmul_tn: one GEMM per leading index, row-major.

namespace loom::host {

namespace detail {
// C[g] = op(A[g]) op(B[g]) for every leading index g; A is m x k (or k x m when ta), B is
// k x n (or n x k when tb), so the leading dimensions are the stored row lengths.
template <class T>
void batched_product(const kernel_call<T>& c, transpose ta, transpose tb) {
    const std::int64_t m = c.extent("m"), n = c.extent("n"), k = c.extent("k");
    const std::int64_t batch = c.leading_numel(0);
    const std::int64_t lda = ta == transpose::no ? k : m;
    const std::int64_t ldb = tb == transpose::no ? n : k;
    if (batch == 1) {
        host::gemm<T>(ta, tb, m, n, k, T(1), c.input(0), lda, c.input(1), ldb, T(0), c.output(0), n);
        return;
    }
    host::gemm_batched<T>(ta, tb, batch, m, n, k, T(1), c.input(0), lda, m * k, c.input(1), ldb, k * n, T(0),
                          c.output(0), n, m * n);
}
}  // namespace detail

template <>
struct host_kernel<ops::Matmul> {
    template <class T>
    static void run(const kernel_call<T>& c) { detail::batched_product<T>(c, transpose::no, transpose::no); }
};

template <>
struct host_kernel<ops::MatmulNT> {
    template <class T>
    static void run(const kernel_call<T>& c) { detail::batched_product<T>(c, transpose::no, transpose::yes); }
};

template <>
struct host_kernel<ops::MatmulTN> {
    template <class T>
    static void run(const kernel_call<T>& c) { detail::batched_product<T>(c, transpose::yes, transpose::no); }
};

}  // namespace loom::host
// ---- end loom/runtime/host/kernels/matmul.hpp ----
// ---- begin loom/runtime/host/kernels/reshape.hpp ----
// Kernel of reshape: a row-major reshape keeps every element where it is, so it is a copy.

namespace loom::host {

template <>
struct host_kernel<ops::Reshape> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        copy_elements(c.input(0), c.output(0), c.output_numel(0));
    }
};

}  // namespace loom::host
// ---- end loom/runtime/host/kernels/reshape.hpp ----
// ---- begin loom/runtime/host/kernels/transpose.hpp ----
// Kernel of transpose: y[g, j, i] = x[g, i, j], in square blocks so that both the rows read
// and the rows written stay in cache.
#include <algorithm>


namespace loom::host {

template <>
struct host_kernel<ops::Transpose> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        constexpr std::int64_t block = 32;
        const std::int64_t rows = c.extent("a"), cols = c.extent("b");
        const std::int64_t batch = c.leading_numel(0);
        const std::int64_t row_blocks = (rows + block - 1) / block;
        const T* x = c.input(0);
        T* y = c.output(0);
        for_each_row(batch * row_blocks, block * cols, [&](std::int64_t item) {
            const std::int64_t g = item / row_blocks;
            const std::int64_t i0 = item % row_blocks * block, i1 = std::min(rows, i0 + block);
            const T* __restrict xg = x + g * rows * cols;
            T* __restrict yg = y + g * rows * cols;
            for (std::int64_t j0 = 0; j0 < cols; j0 += block) {
                const std::int64_t j1 = std::min(cols, j0 + block);
                for (std::int64_t j = j0; j < j1; ++j)
                    for (std::int64_t i = i0; i < i1; ++i) yg[j * rows + i] = xg[i * cols + j];
            }
        });
    }
};

}  // namespace loom::host
// ---- end loom/runtime/host/kernels/transpose.hpp ----
// kernels-includes: embedding and loss
// ---- begin loom/runtime/host/kernels/cross_entropy.hpp ----
// Host kernels of cross_entropy and cross_entropy_grad. Rows are independent; each row's
// log-sum-exp is taken around the row max, so no exp overflows (and lane_exp, whose float
// version vectorises, only sees x - max <= 0). The loss sums rows per fixed block of rows
// (rowwise.hpp), in double, then the blocks in order: the same for any thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>


namespace loom::host {

namespace detail {

// Throws usage_error for the first target outside [0, v) that is not ignore_index.
template <class T>
void check_targets(const kernel_call<T>& c, std::size_t which, std::int64_t v, std::int64_t ignore_index) {
    const std::int32_t* targets = c.index_input(which);
    const std::int64_t n = c.input_numel(which);
    for (std::int64_t p = 0; p < n; ++p) {
        if ((targets[p] >= 0 && targets[p] < v) || targets[p] == ignore_index) continue;
        throw usage_error(std::string(c.n.op->name) + " '" + c.n.name + "': target " + std::to_string(targets[p]) +
                          " at " + describe_position(p, c.input_shape(which), c.g.tensor(c.n.inputs[which]).name) +
                          " is outside [0, " + std::to_string(v) + ") (v = " + std::to_string(v) +
                          " classes) and is not ignore_index " + std::to_string(ignore_index) +
                          "; every target must be a class of the logits or ignore_index");
    }
}

// max + log(sum(exp(x - max))) of one row of v >= 1 logits.
template <class T>
T log_sum_exp(const T* __restrict x, std::int64_t v) {
    const T m = lane_max(x, v);
    const T s = lane_sum<T>(v, [=](std::int64_t i) { return lane_exp(x[i] - m); });
    return m + std::log(s);
}

// dlogits = scale * (softmax(x) - onehot(target)) for one row.
template <class T>
void cross_entropy_grad_row(const T* __restrict x, T* __restrict out, std::int64_t v, std::int32_t target, T scale) {
    const T m = lane_max(x, v);
    const T sum = lane_sum<T>(v, [=](std::int64_t i) { return out[i] = lane_exp(x[i] - m); });
    const T k = scale / sum;
    for_lanes(v, [=](std::int64_t i) { out[i] *= k; });
    out[target] -= scale;
}

}  // namespace detail

template <>
struct host_kernel<ops::CrossEntropy> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t v = c.extent("v");
        const std::int64_t rows = c.input_numel(1);
        const auto ignore = c.attrs().template get<std::int64_t>("ignore_index");
        const double normalizer = c.attrs().template get<double>("normalizer");
        detail::check_targets(c, 1, v, ignore);
        const T* logits = c.input(0);
        const std::int32_t* targets = c.index_input(1);
        const double total = detail::sum_over_rows(rows, v, [&](std::int64_t r) {
            if (targets[r] == ignore) return 0.0;
            const T* x = logits + r * v;
            return static_cast<double>(detail::log_sum_exp(x, v) - x[targets[r]]);
        });
        *c.output(0) = static_cast<T>(total / normalizer);
    }
};

template <>
struct host_kernel<ops::CrossEntropyGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t v = c.extent("v");
        const std::int64_t rows = c.input_numel(2);
        const auto ignore = c.attrs().template get<std::int64_t>("ignore_index");
        const T scale = static_cast<T>(static_cast<double>(*c.input(0)) / c.attrs().template get<double>("normalizer"));
        detail::check_targets(c, 2, v, ignore);
        const T* logits = c.input(1);
        const std::int32_t* targets = c.index_input(2);
        T* dlogits = c.output(0);
        for_each_row(rows, v, [&](std::int64_t r) {
            T* out = dlogits + r * v;
            if (targets[r] == ignore)
                std::fill(out, out + v, T(0));
            else
                detail::cross_entropy_grad_row(logits + r * v, out, v, targets[r], scale);
        });
    }
};

}  // namespace loom::host
// ---- end loom/runtime/host/kernels/cross_entropy.hpp ----
// ---- begin loom/runtime/host/kernels/embedding.hpp ----
// Host kernels of embedding and embedding_grad. The gradient is deterministic without
// atomics: positions are bucketed by id (a stable counting sort), then each table row is
// owned by one thread and sums its positions in increasing order.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>


namespace loom::host {

namespace detail {

// Throws usage_error for the first id outside [0, vocab), input `which` of the node.
template <class T>
void check_ids(const kernel_call<T>& c, std::size_t which, std::int64_t vocab) {
    const std::int32_t* ids = c.index_input(which);
    const std::int64_t n = c.input_numel(which);
    for (std::int64_t p = 0; p < n; ++p) {
        if (ids[p] >= 0 && ids[p] < vocab) continue;
        throw usage_error(std::string(c.n.op->name) + " '" + c.n.name + "': id " + std::to_string(ids[p]) + " at " +
                          describe_position(p, c.input_shape(which), c.g.tensor(c.n.inputs[which]).name) +
                          " is outside the vocabulary [0, " + std::to_string(vocab) +
                          "); every id must be a row of the embedding table (check the data's vocabulary size "
                          "against the table's rows)");
    }
}

}  // namespace detail

template <>
struct host_kernel<ops::Embedding> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t h = c.extent("h"), rows = c.extent("v");
        const auto vocab = c.attrs().template get<std::int64_t>("vocab");
        const auto offset = c.attrs().template get_or<std::int64_t>("row_offset", 0);
        detail::check_ids(c, 0, vocab);
        const std::int32_t* ids = c.index_input(0);
        const T* table = c.input(1);
        T* out = c.output(0);
        for_each_row(c.input_numel(0), h, [&](std::int64_t p) {
            const std::int64_t row = ids[p] - offset;
            if (row >= 0 && row < rows)
                std::memcpy(out + p * h, table + row * h, static_cast<std::size_t>(h) * sizeof(T));
            else
                std::fill(out + p * h, out + (p + 1) * h, T(0));
        });
    }
};

template <>
struct host_kernel<ops::EmbeddingGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t h = c.extent("h"), rows = c.extent("v");
        const auto vocab = c.attrs().template get<std::int64_t>("vocab");
        const auto offset = c.attrs().template get_or<std::int64_t>("row_offset", 0);
        detail::check_ids(c, 1, vocab);
        const T* dy = c.input(0);
        const std::int32_t* ids = c.index_input(1);
        const std::int64_t n = c.input_numel(1);
        T* dtable = c.output(0);

        // Stable counting sort of the positions whose id is a row of this table. Afterwards
        // row r's positions are order[bucket_end[r - 1] .. bucket_end[r]) (from 0 for r = 0).
        std::int64_t* bucket_end = detail::scratch<std::int64_t, 0>(static_cast<std::size_t>(rows + 1));
        std::int64_t* order = detail::scratch<std::int64_t, 1>(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)));
        std::fill(bucket_end, bucket_end + rows + 1, std::int64_t{0});
        for (std::int64_t p = 0; p < n; ++p) {
            const std::int64_t row = ids[p] - offset;
            if (row >= 0 && row < rows) ++bucket_end[row + 1];
        }
        for (std::int64_t r = 1; r <= rows; ++r) bucket_end[r] += bucket_end[r - 1];
        for (std::int64_t p = 0; p < n; ++p) {
            const std::int64_t row = ids[p] - offset;
            if (row >= 0 && row < rows) order[bucket_end[row]++] = p;
        }

        for_each_row(rows, h, [&](std::int64_t r) {
            T* out = dtable + r * h;
            const std::int64_t first = r == 0 ? 0 : bucket_end[r - 1], last = bucket_end[r];
            if (first == last) {
                std::fill(out, out + h, T(0));
                return;
            }
            std::memcpy(out, dy + order[first] * h, static_cast<std::size_t>(h) * sizeof(T));
            for (std::int64_t k = first + 1; k < last; ++k) detail::add_row(out, dy + order[k] * h, h);
        });
    }
};

}  // namespace loom::host
// ---- end loom/runtime/host/kernels/embedding.hpp ----
// ---- begin loom/runtime/host/kernels/vocab_parallel_cross_entropy.hpp ----
// Host kernels of the vocabulary-parallel cross-entropy ops (ops/vocab_parallel_cross_entropy.hpp).
// Each chunk's log-sum-exp is taken around the chunk's max, and the loss around the max of
// the chunks' log-sum-exps, so no exp overflows. The loss sums rows with sum_over_rows:
// the same for any thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>


namespace loom::host {

namespace detail {

// For pick_target and its gradient: checks the targets (input 1) against the whole
// vocabulary, then maps a position to its target's column among this piece's rows
// [row_offset, row_offset + v), or -1 where the piece does not hold it or it is ignored.
template <class T>
auto target_columns(const kernel_call<T>& c) {
    const std::int64_t v = c.extent("v");
    const auto offset = c.attrs().template get_or<std::int64_t>("row_offset", 0);
    const auto ignore = c.attrs().template get<std::int64_t>("ignore_index");
    check_targets(c, 1, c.attrs().template get<std::int64_t>("vocab"), ignore);
    const std::int32_t* targets = c.index_input(1);
    return [=](std::int64_t r) -> std::int64_t {
        const std::int64_t col = targets[r] == ignore ? -1 : targets[r] - offset;
        return col >= 0 && col < v ? col : -1;
    };
}

}  // namespace detail

template <>
struct host_kernel<ops::ChunkLogsumexp> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t chunks = c.extent("c"), v = c.extent("v");
        const std::int64_t rows = c.output_numel(0) / std::max<std::int64_t>(chunks, 1);
        const T* logits = c.input(0);
        T* lse = c.output(0);
        for_each_row(rows, chunks * v, [&](std::int64_t r) {
            for (std::int64_t k = 0; k < chunks; ++k) lse[r * chunks + k] = detail::log_sum_exp(logits + (r * chunks + k) * v, v);
        });
    }
};

template <>
struct host_kernel<ops::ChunkLogsumexpGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t chunks = c.extent("c"), v = c.extent("v");
        const std::int64_t rows = c.input_numel(0) / std::max<std::int64_t>(chunks, 1);
        const T* dlse = c.input(0);
        const T* logits = c.input(1);
        const T* lse = c.input(2);
        T* dlogits = c.output(0);
        for_each_row(rows, chunks * v, [&](std::int64_t r) {
            for (std::int64_t k = 0; k < chunks; ++k) {
                const std::int64_t at = r * chunks + k;
                const T* x = logits + at * v;
                T* out = dlogits + at * v;
                const T m = lse[at], scale = dlse[at];
                detail::for_lanes(v, [=](std::int64_t i) { out[i] = scale * detail::lane_exp(x[i] - m); });
            }
        });
    }
};

template <>
struct host_kernel<ops::PickTarget> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t v = c.extent("v");
        const auto column = detail::target_columns(c);
        const T* logits = c.input(0);
        T* z = c.output(0);
        for (std::int64_t r = 0, rows = c.input_numel(1); r < rows; ++r) {
            const std::int64_t col = column(r);
            z[r] = col >= 0 ? logits[r * v + col] : T(0);
        }
    }
};

template <>
struct host_kernel<ops::PickTargetGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t v = c.extent("v");
        const auto column = detail::target_columns(c);
        const T* dz = c.input(0);
        T* dlogits = c.output(0);
        for_each_row(c.input_numel(1), v, [&](std::int64_t r) {
            T* out = dlogits + r * v;
            std::fill(out, out + v, T(0));
            if (const std::int64_t col = column(r); col >= 0) out[col] = dz[r];
        });
    }
};

template <>
struct host_kernel<ops::CrossEntropyFromChunks> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t chunks = c.extent("c");
        const std::int64_t rows = c.input_numel(2);
        const auto ignore = c.attrs().template get<std::int64_t>("ignore_index");
        const double normalizer = c.attrs().template get<double>("normalizer");
        const T* lse = c.input(0);
        const T* z = c.input(1);
        const std::int32_t* targets = c.index_input(2);
        const double total = detail::sum_over_rows(rows, chunks, [&](std::int64_t r) {
            if (targets[r] == ignore) return 0.0;
            return static_cast<double>(detail::log_sum_exp(lse + r * chunks, chunks) - z[r]);
        });
        *c.output(0) = static_cast<T>(total / normalizer);
    }
};

template <>
struct host_kernel<ops::CrossEntropyFromChunksGrad> {
    template <class T>
    static void run(const kernel_call<T>& c) {
        const std::int64_t chunks = c.extent("c");
        const std::int64_t rows = c.input_numel(2);
        const auto ignore = c.attrs().template get<std::int64_t>("ignore_index");
        const T scale = static_cast<T>(static_cast<double>(*c.input(0)) / c.attrs().template get<double>("normalizer"));
        const T* lse = c.input(1);
        const std::int32_t* targets = c.index_input(2);
        T* dlse = c.output(0);
        T* dz = c.output(1);
        for_each_row(rows, chunks, [&](std::int64_t r) {
            T* out = dlse + r * chunks;
            if (targets[r] == ignore) {
                std::fill(out, out + chunks, T(0));
                dz[r] = T(0);
                return;
            }
            // d/dlse_k of logsumexp_k lse_k is softmax_k(lse).
            const T total = detail::log_sum_exp(lse + r * chunks, chunks);
            for (std::int64_t k = 0; k < chunks; ++k) out[k] = scale * std::exp(lse[r * chunks + k] - total);
            dz[r] = -scale;
        });
    }
};

}  // namespace loom::host
// ---- end loom/runtime/host/kernels/vocab_parallel_cross_entropy.hpp ----
// ---- end loom/runtime/host/kernels/all.hpp ----

namespace loom::host {

template <class T>
using kernel_fn = void (*)(const kernel_call<T>&);

template <class Op>
concept has_host_kernel = requires(const kernel_call<float>& f, const kernel_call<double>& d) {
    host_kernel<Op>::template run<float>(f);
    host_kernel<Op>::template run<double>(d);
};

// One table per precision, so that a program computing only in float never instantiates
// (or compiles) the double kernels.
template <class T>
class kernel_table {
public:
    static kernel_table& instance() {
        static kernel_table table;
        return table;
    }

    template <op_kind Op>
    void add() {
        static_assert(has_host_kernel<Op>,
                      "register_host_kernel: the op has no host kernel; specialise loom::host::host_kernel<Op> with "
                      "template <class T> static void run(const kernel_call<T>&)");
        std::lock_guard lock(mutex_);
        entries_[&op_def_of<Op>()] = &host_kernel<Op>::template run<T>;
    }

    kernel_fn<T> find(const op_def& op) {
        std::lock_guard lock(mutex_);
        auto it = entries_.find(&op);
        if (it == entries_.end())
            throw usage_error("host backend: no kernel for op '" + std::string(op.name) +
                              "'; include its kernel header and call loom::host::register_host_kernel<Op>()");
        return it->second;
    }

private:
    kernel_table();
    std::mutex mutex_;
    std::unordered_map<const op_def*, kernel_fn<T>> entries_;
};

// Out of the class body, so that an explicit instantiation declaration (below) keeps it,
// and with it every built-in kernel, out of the translation unit.
template <class T>
kernel_table<T>::kernel_table() {
    boost::mp11::mp_for_each<boost::mp11::mp_transform<boost::mp11::mp_identity, ops::all_ops>>([this](auto op) {
        using Op = typename decltype(op)::type;
        // Communication ops run on a communicator, not on a kernel.
        if constexpr (!requires { Op::communication; }) add<Op>();
    });
}

// Compiled kernels: a program linking loom::host_kernels (src/host_kernels.cpp, which
// defines LOOM_HOST_KERNELS_COMPILED for its users) compiles the built-in kernels of both
// precisions once, there, instead of in every translation unit that runs a program. Without
// it loom stays header-only and each translation unit instantiates what it uses.
#if defined(LOOM_HOST_KERNELS_COMPILED)
extern template class kernel_table<float>;
extern template class kernel_table<double>;
#endif

template <op_kind Op>
void register_host_kernel() {
    kernel_table<float>::instance().template add<Op>();
    kernel_table<double>::instance().template add<Op>();
}

template <class T>
kernel_fn<T> kernel_for(const op_def& op) {
    return kernel_table<T>::instance().find(op);
}

}  // namespace loom::host
// ---- end loom/runtime/host/kernel_table.hpp ----

namespace loom::host {

// Runs one communication node (ops::Transfer): the node and its input and output storage.
using communication_handler = std::function<void(const node&, std::span<void* const>, std::span<void* const>)>;

template <class T>
class executor {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "executor: T must be float or double");

public:
    explicit executor(const program& p) : program_(p) {
        constexpr precision mine = std::is_same_v<T, float> ? precision::f32 : precision::f64;
        if (p.prec != mine)
            throw usage_error(std::string("executor: the program was compiled for ") + std::string(to_string(p.prec)) +
                              " but this executor computes in " + std::string(to_string(mine)) +
                              "; compile with the matching precision");
        arena_.reset(static_cast<std::byte*>(::operator new[](static_cast<std::size_t>(std::max<std::int64_t>(p.arena_bytes, 64)), std::align_val_t{64})));
        pointers_.assign(p.buffers.size(), nullptr);
        for (std::size_t t = 0; t < p.buffers.size(); ++t)
            if (p.buffers[t].where == buffer::place::arena) pointers_[t] = arena_.get() + p.buffers[t].offset;
        kernels_.reserve(p.steps.size());
        for (const auto& step : p.steps) {
            const op_def& op = *p.source->at(step.node).op;
            kernels_.push_back(op.communication ? nullptr : kernel_for<T>(op));
        }
    }

    // Binds caller storage (at least the tensor's bytes) to a bound tensor.
    void bind(tensor_id t, void* data) {
        const auto& b = program_.buffers.at(static_cast<std::size_t>(t));
        if (b.where != buffer::place::bound)
            throw usage_error("executor::bind: tensor '" + program_.source->tensor(t).name +
                              "' is not bound by this program (it is an intermediate or unused)");
        pointers_[static_cast<std::size_t>(t)] = data;
    }

    // Who runs communication nodes; a program that has some cannot run without one.
    void set_communication(communication_handler handler) { communicate_ = std::move(handler); }

    void run(std::uint64_t step_number = 0) {
        for (tensor_id t : program_.bound)
            if (!pointers_[static_cast<std::size_t>(t)])
                throw usage_error("executor::run: tensor '" + program_.source->tensor(t).name +
                                  "' has no storage; bind it first");
        const graph& g = *program_.source;
        std::vector<void*> ins, outs;
        for (std::size_t s = 0; s < program_.steps.size(); ++s) {
            const node& n = g.at(program_.steps[s].node);
            ins.clear();
            outs.clear();
            for (tensor_id t : n.inputs) ins.push_back(pointers_[static_cast<std::size_t>(t)]);
            for (tensor_id t : n.outputs) outs.push_back(pointers_[static_cast<std::size_t>(t)]);
            if (!kernels_[s]) {
                if (!communicate_)
                    throw usage_error("executor::run: node '" + n.name +
                                      "' is a transfer between devices; set a communication handler "
                                      "(a distributed runner does) before running a partitioned program");
                communicate_(n, ins, outs);
                continue;
            }
            kernel_call<T> call{g, n, ins, outs, step_number};
            kernels_[s](call);
        }
    }

    // Storage of any tensor (valid for intermediates only while the tensor is live).
    void* data(tensor_id t) const { return pointers_.at(static_cast<std::size_t>(t)); }
    const program& source() const { return program_; }

private:
    struct aligned_delete {
        void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{64}); }
    };
    const program& program_;
    std::unique_ptr<std::byte[], aligned_delete> arena_;
    std::vector<void*> pointers_;
    std::vector<kernel_fn<T>> kernels_;
    communication_handler communicate_;
};

}  // namespace loom::host
// ---- end loom/runtime/host/executor.hpp ----

namespace loom::host {

template <class T>
class bound_storage {
public:
    explicit bound_storage(const program& p) : program_(&p) {
        const graph& g = *p.source;
        for (tensor_id t : p.bound) {
            const tensor_desc& d = g.tensor(t);
            auto n = static_cast<std::size_t>(d.dims.numel());
            if (d.kind == value_kind::index)
                index_[t].assign(n, 0);
            else
                real_[t].assign(n, T(0));
        }
    }

    std::span<T> real(tensor_id t) {
        auto it = real_.find(t);
        if (it == real_.end()) throw usage_error("bound_storage: '" + name(t) + "' is not a bound real tensor");
        return it->second;
    }
    std::span<std::int32_t> index(tensor_id t) {
        auto it = index_.find(t);
        if (it == index_.end()) throw usage_error("bound_storage: '" + name(t) + "' is not a bound index tensor");
        return it->second;
    }
    std::span<T> real(std::string_view tensor_name) { return real(find(tensor_name)); }
    std::span<std::int32_t> index(std::string_view tensor_name) { return index(find(tensor_name)); }
    bool has(tensor_id t) const { return real_.count(t) || index_.count(t); }

    void bind_to(executor<T>& e) {
        for (auto& [t, v] : real_) e.bind(t, v.data());
        for (auto& [t, v] : index_) e.bind(t, v.data());
    }

private:
    std::string name(tensor_id t) const { return program_->source->tensor(t).name; }
    tensor_id find(std::string_view tensor_name) const {
        if (auto t = program_->source->find_tensor(tensor_name)) return *t;
        throw usage_error("bound_storage: no tensor named '" + std::string(tensor_name) + "'");
    }
    const program* program_;
    std::unordered_map<tensor_id, std::vector<T>> real_;
    std::unordered_map<tensor_id, std::vector<std::int32_t>> index_;
};

}  // namespace loom::host
// ---- end loom/runtime/host/bound_storage.hpp ----

// io
// ---- begin loom/io/safetensors.hpp ----
// safetensors: the tensor file format of the Hugging Face ecosystem, read and written
// without the Python or Rust package.
//
// Layout:
//   u64 little-endian  N, the header length in bytes
//   N bytes            a JSON object, padded with spaces so that N % 8 == 0:
//                        {"__metadata__": {"k": "v", ...},            (optional, strings only)
//                         "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
//   the data section   every tensor's bytes, little-endian, row-major; [begin, end) is
//                      relative to the start of this section
// The data section has no holes and no overlaps: sorted by begin, each tensor starts where
// the previous one ended, the first at 0 and the last ends at the end of the file.
//
// safetensors_writer lays tensors out as the reference writer does, by descending dtype
// (8-byte types, then 4, 2 and 1) and then by name, and writes each header entry as
// {"dtype", "shape", "data_offsets"}. Because the header is padded to a multiple of 8 and
// larger dtypes come first, every tensor starts at an address aligned to its element size
// when the file is mapped, and the same tensors always give the same bytes.
//
// Example:
//   loom::io::safetensors_writer w;
//   w.add("wte", loom::io::dtype::f32, {256, 64}, weights);   // std::vector<float>
//   w.metadata("format", "pt");
//   w.write("model.safetensors");
//   loom::io::safetensors_file f("model.safetensors");
//   std::vector<float> back = f.read<float>("wte");
#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>


namespace loom::io {

// Declared in the reference format's order of increasing alignment; the writer sorts on it.
enum class dtype { u8, f16, bf16, i32, f32, f64, i64 };

inline constexpr std::array<dtype, 7> all_dtypes{dtype::u8,  dtype::f16, dtype::bf16, dtype::i32,
                                                 dtype::f32, dtype::f64, dtype::i64};

// The name the format uses: dtype::bf16 -> "BF16".
constexpr std::string_view dtype_name(dtype type) noexcept {
    switch (type) {
        case dtype::u8: return "U8";
        case dtype::f16: return "F16";
        case dtype::bf16: return "BF16";
        case dtype::i32: return "I32";
        case dtype::f32: return "F32";
        case dtype::f64: return "F64";
        case dtype::i64: return "I64";
    }
    return "?";
}

constexpr std::size_t dtype_size(dtype type) noexcept {
    switch (type) {
        case dtype::u8: return 1;
        case dtype::f16:
        case dtype::bf16: return 2;
        case dtype::i32:
        case dtype::f32: return 4;
        case dtype::f64:
        case dtype::i64: return 8;
    }
    return 0;
}

constexpr std::optional<dtype> dtype_from_name(std::string_view name) noexcept {
    for (dtype type : all_dtypes) {
        if (dtype_name(type) == name) return type;
    }
    return std::nullopt;
}

// Which C++ element types may be read from / written as which dtypes. F16 and BF16 travel
// as their 16-bit patterns in std::uint16_t; a half-precision type elsewhere in loom can be
// added by specializing this template with `name` and `accepts`.
template <class T>
struct dtype_traits;

template <>
struct dtype_traits<float> {
    static constexpr std::string_view name = "float";
    static constexpr bool accepts(dtype t) noexcept { return t == dtype::f32; }
};
template <>
struct dtype_traits<double> {
    static constexpr std::string_view name = "double";
    static constexpr bool accepts(dtype t) noexcept { return t == dtype::f64; }
};
template <>
struct dtype_traits<std::int32_t> {
    static constexpr std::string_view name = "std::int32_t";
    static constexpr bool accepts(dtype t) noexcept { return t == dtype::i32; }
};
template <>
struct dtype_traits<std::int64_t> {
    static constexpr std::string_view name = "std::int64_t";
    static constexpr bool accepts(dtype t) noexcept { return t == dtype::i64; }
};
template <>
struct dtype_traits<std::uint8_t> {
    static constexpr std::string_view name = "std::uint8_t";
    static constexpr bool accepts(dtype t) noexcept { return t == dtype::u8; }
};
template <>
struct dtype_traits<std::uint16_t> {
    static constexpr std::string_view name = "std::uint16_t (F16 or BF16 bits)";
    static constexpr bool accepts(dtype t) noexcept { return t == dtype::f16 || t == dtype::bf16; }
};

template <class T>
concept safetensors_element = std::is_trivially_copyable_v<T> && requires(dtype t) {
    { dtype_traits<T>::accepts(t) } -> std::same_as<bool>;
    { dtype_traits<T>::name } -> std::convertible_to<std::string_view>;
};

// One tensor's entry in the header. begin and end are byte offsets into the data section.
struct tensor_info {
    io::dtype dtype = io::dtype::u8;
    std::vector<std::int64_t> shape;
    std::uint64_t begin = 0;
    std::uint64_t end = 0;

    // The product of the shape; 1 for a scalar (shape []).
    std::uint64_t element_count() const noexcept {
        std::uint64_t n = 1;
        for (std::int64_t d : shape) n *= static_cast<std::uint64_t>(d);
        return n;
    }
    std::uint64_t byte_size() const noexcept { return end - begin; }
};

namespace detail {

// The reference reader refuses headers above this size; so do we, so that a corrupt
// length cannot make us allocate gigabytes.
inline constexpr std::uint64_t safetensors_max_header_bytes = 100'000'000;

inline std::string safetensors_quote(const std::filesystem::path& path) { return "'" + path.string() + "'"; }

inline std::string safetensors_shape_text(const std::vector<std::int64_t>& shape) {
    std::string text = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
    return text + "]";
}

// Copies elements to or from little-endian bytes; a plain copy on little-endian hosts.
template <class T>
void safetensors_copy_le(const void* from, void* to, std::size_t count) noexcept {
    if (count == 0) return;  // an empty vector's data() may be null, which memcpy forbids
    std::memcpy(to, from, count * sizeof(T));
    if constexpr (std::endian::native == std::endian::big && sizeof(T) > 1) {
        auto* bytes = static_cast<unsigned char*>(to);
        for (std::size_t i = 0; i < count; ++i) std::reverse(bytes + i * sizeof(T), bytes + (i + 1) * sizeof(T));
    }
}

inline constexpr std::string_view safetensors_rewrite =
    "write it again with loom::io::safetensors_writer or safetensors.torch.save_file";
inline constexpr std::string_view safetensors_fix =
    "the file is corrupt or was not written by a safetensors writer; write it again with "
    "loom::io::safetensors_writer or safetensors.torch.save_file";

}  // namespace detail

class safetensors_writer {
public:
    // Adds a tensor from raw little-endian bytes. Throws loom::usage_error for an empty,
    // reserved or repeated name, a negative extent, or a byte count that is not
    // product(shape) * dtype_size(type).
    void add(std::string name, dtype type, std::vector<std::int64_t> shape, std::span<const std::byte> bytes) {
        check_name(name);
        std::uint64_t elements = 1;
        for (std::int64_t d : shape) {
            if (d < 0) {
                throw usage_error("safetensors_writer::add: tensor '" + name + "' has negative extent " + std::to_string(d) +
                                  " in shape " + detail::safetensors_shape_text(shape) + "; extents must be >= 0");
            }
            elements *= static_cast<std::uint64_t>(d);
        }
        if (elements * dtype_size(type) != bytes.size()) {
            throw usage_error("safetensors_writer::add: tensor '" + name + "' of dtype " + std::string(dtype_name(type)) +
                              " and shape " + detail::safetensors_shape_text(shape) + " needs " +
                              std::to_string(elements * dtype_size(type)) + " bytes but " + std::to_string(bytes.size()) +
                              " were given; pass data of exactly product(shape) elements");
        }
        entries_.emplace(std::move(name), entry{type, std::move(shape), std::vector<std::byte>(bytes.begin(), bytes.end())});
    }

    // Adds a tensor from typed values, e.g. a std::vector<float> as dtype::f32. The element
    // type must match the dtype (dtype_traits<T>::accepts).
    template <std::ranges::contiguous_range R>
        requires safetensors_element<std::ranges::range_value_t<R>>
    void add(std::string name, dtype type, std::vector<std::int64_t> shape, const R& values) {
        using T = std::ranges::range_value_t<R>;
        if (!dtype_traits<T>::accepts(type)) {
            throw usage_error("safetensors_writer::add: tensor '" + name + "' is declared " + std::string(dtype_name(type)) +
                              " but its elements are " + std::string(dtype_traits<T>::name) +
                              "; pass elements of the matching type (F32 float, F64 double, I32 std::int32_t, "
                              "I64 std::int64_t, U8 std::uint8_t, F16/BF16 std::uint16_t)");
        }
        const std::size_t count = static_cast<std::size_t>(std::ranges::size(values));
        std::vector<std::byte> bytes(count * sizeof(T));
        detail::safetensors_copy_le<T>(std::ranges::data(values), bytes.data(), count);
        add(std::move(name), type, std::move(shape), std::span<const std::byte>(bytes));
    }

    // Sets a "__metadata__" entry; a later call with the same key replaces the value.
    void metadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }

    std::size_t size() const noexcept { return entries_.size(); }

    // The whole file, as write() stores it.
    std::vector<std::byte> serialize() const {
        std::vector<std::pair<const std::string*, const entry*>> order;
        order.reserve(entries_.size());
        for (const auto& [name, e] : entries_) order.emplace_back(&name, &e);
        std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
            return static_cast<int>(a.second->type) > static_cast<int>(b.second->type);
        });  // entries_ is already sorted by name, so ties stay in name order

        nlohmann::ordered_json header = nlohmann::ordered_json::object();
        if (!metadata_.empty()) header["__metadata__"] = metadata_;
        std::uint64_t offset = 0;
        for (const auto& [name, e] : order) {
            nlohmann::ordered_json info = nlohmann::ordered_json::object();
            info["dtype"] = dtype_name(e->type);
            info["shape"] = e->shape;
            info["data_offsets"] = {offset, offset + e->bytes.size()};
            header[*name] = std::move(info);
            offset += e->bytes.size();
        }
        std::string text;
        try {
            text = header.dump();
        } catch (const nlohmann::json::exception& ex) {
            throw usage_error(std::string("safetensors_writer: a tensor name or metadata string is not valid UTF-8 (") +
                              ex.what() + "); use UTF-8 names and values");
        }
        text.append((8 - text.size() % 8) % 8, ' ');

        std::vector<std::byte> file(8 + text.size() + offset);
        const std::uint64_t n = text.size();
        for (int i = 0; i < 8; ++i) file[static_cast<std::size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xFF);
        std::memcpy(file.data() + 8, text.data(), text.size());
        std::size_t at = 8 + text.size();
        for (const auto& [name, e] : order) {
            if (!e->bytes.empty()) std::memcpy(file.data() + at, e->bytes.data(), e->bytes.size());
            at += e->bytes.size();
        }
        return file;
    }

    // Writes beside `path` and renames into place, so a reader never sees half a file.
    // Throws loom::data_error when the file cannot be written.
    void write(const std::filesystem::path& path) const {
        const std::vector<std::byte> file = serialize();
        std::filesystem::path partial = path;
        partial += ".partial";
        {
            std::ofstream out(partial, std::ios::binary | std::ios::trunc);
            if (!out) {
                throw data_error("safetensors_writer::write: cannot create " + detail::safetensors_quote(partial) +
                                 "; check that the directory exists and is writable");
            }
            out.write(reinterpret_cast<const char*>(file.data()), static_cast<std::streamsize>(file.size()));
            out.close();
            if (!out) {
                throw data_error("safetensors_writer::write: writing " + std::to_string(file.size()) + " bytes to " +
                                 detail::safetensors_quote(partial) + " failed; check free disk space");
            }
        }
        std::error_code ec;
        std::filesystem::rename(partial, path, ec);
        if (ec) {
            throw data_error("safetensors_writer::write: cannot rename " + detail::safetensors_quote(partial) + " to " +
                             detail::safetensors_quote(path) + ": " + ec.message() + "; check that the target is writable");
        }
    }

private:
    struct entry {
        dtype type;
        std::vector<std::int64_t> shape;
        std::vector<std::byte> bytes;
    };

    void check_name(const std::string& name) const {
        if (name.empty()) throw usage_error("safetensors_writer::add: a tensor name is empty; give every tensor a name");
        if (name == "__metadata__") {
            throw usage_error("safetensors_writer::add: '__metadata__' is reserved for the metadata map; rename the "
                              "tensor and use safetensors_writer::metadata for string entries");
        }
        if (entries_.contains(name)) {
            throw usage_error("safetensors_writer::add: tensor '" + name + "' was already added; tensor names must be unique");
        }
    }

    std::map<std::string, entry, std::less<>> entries_;
    std::map<std::string, std::string> metadata_;
};

// A safetensors file whose header is read and fully validated on construction; tensor
// data is read on demand. Every error is a loom::data_error naming the file, the tensor
// where there is one, what is wrong and how to get a good file.
class safetensors_file {
public:
    explicit safetensors_file(std::filesystem::path path) : path_(std::move(path)) { load(); }

    const std::filesystem::path& path() const noexcept { return path_; }

    // Tensor names in sorted order.
    std::vector<std::string> names() const {
        std::vector<std::string> out;
        out.reserve(tensors_.size());
        for (const auto& [name, info] : tensors_) out.push_back(name);
        return out;
    }

    std::size_t size() const noexcept { return tensors_.size(); }
    bool contains(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }

    const tensor_info& info(std::string_view name) const {
        const auto it = tensors_.find(name);
        if (it == tensors_.end()) {
            std::string known;
            std::size_t shown = 0;
            for (const auto& [n, i] : tensors_) {
                if (shown++ == 8) {
                    known += ", ...";
                    break;
                }
                known += (known.empty() ? "" : ", ") + n;
            }
            fail("has no tensor '" + std::string(name) + "'; it holds " + std::to_string(tensors_.size()) + " tensors" +
                 (known.empty() ? std::string() : ": " + known) + "; check the name");
        }
        return it->second;
    }

    const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }

    // The tensor's bytes as stored (little-endian, row-major).
    std::vector<std::byte> read_bytes(std::string_view name) const {
        const tensor_info& t = info(name);
        std::vector<std::byte> bytes(static_cast<std::size_t>(t.byte_size()));
        if (bytes.empty()) return bytes;
        std::ifstream in(path_, std::ios::binary);
        if (!in) fail("cannot be opened to read tensor '" + std::string(name) + "'; check that it still exists");
        in.seekg(static_cast<std::streamoff>(data_start_ + t.begin));
        in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
        if (static_cast<std::size_t>(in.gcount()) != bytes.size()) {
            fail("ended while reading tensor '" + std::string(name) + "' (bytes " + std::to_string(data_start_ + t.begin) +
                 " to " + std::to_string(data_start_ + t.end) + "); it was truncated after it was opened, " +
                 std::string(detail::safetensors_fix));
        }
        return bytes;
    }

    // The tensor's elements; T must match its dtype (see dtype_traits).
    template <safetensors_element T>
    std::vector<T> read(std::string_view name) const {
        const tensor_info& t = info(name);
        if (!dtype_traits<T>::accepts(t.dtype)) {
            fail("stores tensor '" + std::string(name) + "' as " + std::string(dtype_name(t.dtype)) + " but it was read as " +
                 std::string(dtype_traits<T>::name) + "; read it with the element type of its dtype (F32 float, F64 double, "
                 "I32 std::int32_t, I64 std::int64_t, U8 std::uint8_t, F16/BF16 std::uint16_t)");
        }
        const std::vector<std::byte> bytes = read_bytes(name);
        std::vector<T> values(bytes.size() / sizeof(T));
        detail::safetensors_copy_le<T>(bytes.data(), values.data(), values.size());
        return values;
    }

private:
    [[noreturn]] void fail(const std::string& what) const {
        throw data_error("safetensors_file: " + detail::safetensors_quote(path_) + " " + what);
    }

    [[noreturn]] void fail_tensor(const std::string& name, const std::string& what) const {
        fail("tensor '" + name + "' " + what + "; " + std::string(detail::safetensors_fix));
    }

    void load() {
        std::error_code ec;
        const auto status = std::filesystem::status(path_, ec);
        if (!std::filesystem::exists(status)) {
            fail("does not exist; check the path or write it with loom::io::safetensors_writer");
        }
        if (!std::filesystem::is_regular_file(status)) fail("is not a regular file; pass the path of a .safetensors file");
        const std::uint64_t file_bytes = std::filesystem::file_size(path_, ec);
        if (ec) fail("cannot be sized: " + ec.message());
        if (file_bytes < 8) {
            fail("is " + std::to_string(file_bytes) + " bytes long, too short for the 8-byte header length; " +
                 std::string(detail::safetensors_fix));
        }
        std::ifstream in(path_, std::ios::binary);
        if (!in) fail("cannot be opened for reading; check its permissions");
        unsigned char length_bytes[8] = {};
        in.read(reinterpret_cast<char*>(length_bytes), 8);
        std::uint64_t header_bytes = 0;
        for (int i = 0; i < 8; ++i) header_bytes |= static_cast<std::uint64_t>(length_bytes[i]) << (8 * i);
        if (header_bytes > file_bytes - 8) {
            fail("declares a header of " + std::to_string(header_bytes) + " bytes, but only " +
                 std::to_string(file_bytes - 8) + " bytes follow the length field, so the file is truncated or is not "
                 "a safetensors file; " + std::string(detail::safetensors_rewrite));
        }
        if (header_bytes > detail::safetensors_max_header_bytes) {
            fail("declares a header of " + std::to_string(header_bytes) + " bytes, above the " +
                 std::to_string(detail::safetensors_max_header_bytes) + "-byte limit that safetensors readers enforce; " +
                 std::string(detail::safetensors_fix));
        }
        std::string text(static_cast<std::size_t>(header_bytes), '\0');
        in.read(text.data(), static_cast<std::streamsize>(text.size()));
        if (static_cast<std::size_t>(in.gcount()) != text.size()) fail("could not be read; check the disk");
        data_start_ = 8 + header_bytes;

        nlohmann::json header;
        try {
            header = nlohmann::json::parse(text);
        } catch (const nlohmann::json::parse_error& ex) {
            fail("has a header that is not valid JSON (" + std::string(ex.what()) + "); " +
                 std::string(detail::safetensors_fix));
        }
        if (!header.is_object()) {
            fail("has a JSON header that is a " + std::string(header.type_name()) + ", not an object; " +
                 std::string(detail::safetensors_fix));
        }

        std::vector<std::pair<std::string, const tensor_info*>> by_offset;
        for (const auto& [name, value] : header.items()) {
            if (name == "__metadata__") {
                read_metadata(value);
                continue;
            }
            const auto [it, inserted] = tensors_.emplace(name, parse_entry(name, value));
            by_offset.emplace_back(name, &it->second);
        }
        std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
            return std::pair(a.second->begin, a.second->end) < std::pair(b.second->begin, b.second->end);
        });

        const std::uint64_t data_bytes = file_bytes - data_start_;
        std::uint64_t expected_begin = 0;
        std::string previous;
        for (const auto& [name, t] : by_offset) {
            if (t->end > data_bytes) {
                fail_tensor(name, "has data_offsets [" + std::to_string(t->begin) + ", " + std::to_string(t->end) +
                                      ") beyond the data section of " + std::to_string(data_bytes) + " bytes");
            }
            if (t->begin < expected_begin) {
                fail_tensor(name, "has data_offsets [" + std::to_string(t->begin) + ", " + std::to_string(t->end) +
                                      ") that overlap tensor '" + previous + "', which ends at " +
                                      std::to_string(expected_begin));
            }
            if (t->begin > expected_begin) {
                fail_tensor(name, "starts at data offset " + std::to_string(t->begin) + ", leaving a hole after " +
                                      (previous.empty() ? std::string("the start of the data section")
                                                        : "tensor '" + previous + "'") +
                                      " at " + std::to_string(expected_begin) + "; the data section must have no gaps");
            }
            expected_begin = t->end;
            previous = name;
        }
        if (expected_begin != data_bytes) {
            fail("has " + std::to_string(data_bytes - expected_begin) + " bytes after the last tensor" +
                 (previous.empty() ? std::string() : " '" + previous + "'") + " (data section of " +
                 std::to_string(data_bytes) + " bytes, tensors cover " + std::to_string(expected_begin) + "); " +
                 std::string(detail::safetensors_fix));
        }
    }

    void read_metadata(const nlohmann::json& value) {
        if (!value.is_object()) {
            fail("has a \"__metadata__\" entry that is a " + std::string(value.type_name()) +
                 ", not an object of strings; " + std::string(detail::safetensors_fix));
        }
        for (const auto& [key, v] : value.items()) {
            if (!v.is_string()) {
                fail("has metadata \"" + key + "\" that is a " + std::string(v.type_name()) +
                     ", but metadata values must be strings; " + std::string(detail::safetensors_fix));
            }
            metadata_[key] = v.get<std::string>();
        }
    }

    tensor_info parse_entry(const std::string& name, const nlohmann::json& value) const {
        if (!value.is_object()) fail_tensor(name, "is a " + std::string(value.type_name()) + ", not an object");
        tensor_info t;

        const auto dtype_it = value.find("dtype");
        if (dtype_it == value.end() || !dtype_it->is_string()) fail_tensor(name, "has no string \"dtype\"");
        const std::string type_name = dtype_it->get<std::string>();
        const std::optional<dtype> type = dtype_from_name(type_name);
        if (!type) {
            fail("tensor '" + name + "' has dtype \"" + type_name +
                 "\", which loom does not read (it reads F32, F64, I32, I64, BF16, F16, U8); convert the tensor to one of "
                 "these before saving");
        }
        t.dtype = *type;

        const auto shape_it = value.find("shape");
        if (shape_it == value.end() || !shape_it->is_array()) fail_tensor(name, "has no array \"shape\"");
        std::uint64_t elements = 1;
        bool overflow = false;
        for (const auto& d : *shape_it) {
            if (!d.is_number_unsigned() || d.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
                fail_tensor(name, "has shape " + shape_it->dump() + " with an extent that is not a non-negative integer");
            }
            const std::uint64_t extent = d.get<std::uint64_t>();
            if (extent != 0 && elements > std::numeric_limits<std::uint64_t>::max() / extent) overflow = true;
            elements *= extent;
            t.shape.push_back(static_cast<std::int64_t>(extent));
        }
        const std::size_t width = dtype_size(t.dtype);
        if (overflow || elements > std::numeric_limits<std::uint64_t>::max() / width) {
            fail_tensor(name, "has shape " + shape_it->dump() + ", whose byte size overflows 64 bits");
        }

        const auto offsets_it = value.find("data_offsets");
        if (offsets_it == value.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
            !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
            fail_tensor(name, "has no \"data_offsets\" of two non-negative integers [begin, end)");
        }
        t.begin = (*offsets_it)[0].get<std::uint64_t>();
        t.end = (*offsets_it)[1].get<std::uint64_t>();
        if (t.end < t.begin) {
            fail_tensor(name, "has data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                                  ") that end before they begin");
        }
        if (t.end - t.begin != elements * width) {
            fail_tensor(name, "has " + std::to_string(t.end - t.begin) + " bytes (data_offsets [" + std::to_string(t.begin) +
                                  ", " + std::to_string(t.end) + ")) but dtype " + type_name + " and shape " +
                                  detail::safetensors_shape_text(t.shape) + " need " + std::to_string(elements) + " x " +
                                  std::to_string(width) + " = " + std::to_string(elements * width) + " bytes");
        }
        return t;
    }

    std::filesystem::path path_;
    std::map<std::string, tensor_info, std::less<>> tensors_;
    std::map<std::string, std::string> metadata_;
    std::uint64_t data_start_ = 0;
};

}  // namespace loom::io
// ---- end loom/io/safetensors.hpp ----

// train
// ---- begin loom/train/adamw.hpp ----
// AdamW with PyTorch's torch.optim.AdamW semantics (decoupled weight decay):
//   p <- p * (1 - lr * wd)
//   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   p <- p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
#include <cmath>
#include <cstdint>
#include <vector>

// ---- begin loom/train/parameter_slot.hpp ----
// What an optimizer updates: one parameter's values and its gradient, by name.
#include <span>
#include <string>

namespace loom::train {

template <class T>
struct parameter_slot {
    std::string name;
    std::span<T> value;
    std::span<const T> grad;
    bool weight_decay = true;  // GPT-2 practice: decay matrices, not biases, norms or gains
};

}  // namespace loom::train
// ---- end loom/train/parameter_slot.hpp ----

namespace loom::train {

struct adamw_options {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.01;
};

template <class T>
class adamw {
public:
    explicit adamw(adamw_options options) : options_(options) {
        if (!(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1))
            throw usage_error("adamw: betas must lie in [0, 1); got beta1=" + std::to_string(options.beta1) +
                              ", beta2=" + std::to_string(options.beta2));
        if (options.lr < 0 || options.eps <= 0 || options.weight_decay < 0)
            throw usage_error("adamw: lr and weight_decay must be >= 0 and eps > 0");
    }

    void add(parameter_slot<T> slot) {
        m_.emplace_back(slot.value.size(), T(0));
        v_.emplace_back(slot.value.size(), T(0));
        slots_.push_back(std::move(slot));
    }

    void step(double lr) {
        ++steps_;
        const double t = static_cast<double>(steps_);
        const T b1 = static_cast<T>(options_.beta1), b2 = static_cast<T>(options_.beta2);
        const T step_size = static_cast<T>(lr / (1 - std::pow(options_.beta1, t)));
        const T bias2_sqrt = static_cast<T>(std::sqrt(1 - std::pow(options_.beta2, t)));
        const T eps = static_cast<T>(options_.eps);
        for (std::size_t s = 0; s < slots_.size(); ++s) {
            auto& slot = slots_[s];
            T* __restrict m = m_[s].data();
            T* __restrict v = v_[s].data();
            T* __restrict p = slot.value.data();
            const T* __restrict g = slot.grad.data();
            const T decay = slot.weight_decay ? static_cast<T>(1 - lr * options_.weight_decay) : T(1);
            host::parallel_for(0, static_cast<std::int64_t>(slot.value.size()), 1 << 14,
                               [&](std::int64_t lo, std::int64_t hi) {
                                   for (std::int64_t i = lo; i < hi; ++i) {
                                       p[i] *= decay;
                                       m[i] = b1 * m[i] + (1 - b1) * g[i];
                                       v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
                                       p[i] -= step_size * m[i] / (std::sqrt(v[i]) / bias2_sqrt + eps);
                                   }
                               });
        }
    }
    void step() { step(options_.lr); }

    std::int64_t steps() const { return steps_; }
    void set_steps(std::int64_t steps) { steps_ = steps; }
    const adamw_options& options() const { return options_; }
    std::vector<T>& first_moment(std::size_t s) { return m_.at(s); }
    std::vector<T>& second_moment(std::size_t s) { return v_.at(s); }
    const std::vector<parameter_slot<T>>& slots() const { return slots_; }

private:
    adamw_options options_;
    std::vector<parameter_slot<T>> slots_;
    std::vector<std::vector<T>> m_, v_;
    std::int64_t steps_ = 0;
};

}  // namespace loom::train
// ---- end loom/train/adamw.hpp ----
// ---- begin loom/train/corpus.hpp ----
// make_corpus: a deterministic English-like training text that loom writes itself, so
// examples and tests train on real-looking language without downloads or copied text.
//
// The text is drawn from hand-written templates with a splitmix64 generator implemented
// here: only 64-bit integer arithmetic, no std::*_distribution (whose output differs between
// standard libraries), so a given (bytes, seed) yields the same string on every platform.
// It has structure a small model can learn quickly:
//   - fixed facts that recur ("A spider has eight legs.", "The baker works at the bakery."),
//   - arithmetic that is always right ("Three plus four is seven.", "12 + 7 = 19."),
//   - short stories whose counts add up ("... bought five red apples. ... so now she has
//     seven apples."), dialogue with quotes, and paragraphs separated by a blank line.
// Laws: make_corpus(n, s).size() == n; make_corpus(n, s) is a prefix of make_corpus(m, s)
// for n <= m (the text is generated in order, then cut to length).
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>


namespace loom::train {

namespace detail {

// splitmix64: a 64-bit counter passed through a bijective mixer. Small, fast and fully
// specified, which is what cross-platform determinism needs.
class corpus_rng {
public:
    explicit constexpr corpus_rng(std::uint64_t seed) noexcept : state_(seed) {}

    constexpr std::uint64_t next() noexcept {
        return finalize_mix(state_ += golden_gamma);
    }

    // Uniform on [0, n) up to a bias below n / 2^64, invisible for the small n used here.
    constexpr std::size_t below(std::size_t n) noexcept { return static_cast<std::size_t>(next() % n); }

    // Uniform on [lo, hi].
    constexpr int between(int lo, int hi) noexcept { return lo + static_cast<int>(below(static_cast<std::size_t>(hi - lo + 1))); }

    constexpr bool percent(int p) noexcept { return below(100) < static_cast<std::size_t>(p); }

    template <class T, std::size_t N>
    constexpr const T& pick(const std::array<T, N>& items) noexcept {
        return items[below(N)];
    }

private:
    std::uint64_t state_;
};

struct corpus_person {
    std::string_view name, subject, object, possessive;
};

struct corpus_animal {
    std::string_view singular, plural;
    int legs;
    std::string_view sound;  // empty: the animal makes no sound worth a sentence
    std::string_view home, food;
};

struct corpus_job {
    std::string_view title, workplace, duty;
};

struct corpus_pair {
    std::string_view first, second;
};

inline constexpr std::array<corpus_person, 30> corpus_people{{
    {"Anna", "she", "her", "her"},   {"Ben", "he", "him", "his"},     {"Clara", "she", "her", "her"},
    {"David", "he", "him", "his"},   {"Emma", "she", "her", "her"},   {"Felix", "he", "him", "his"},
    {"Grace", "she", "her", "her"},  {"Hugo", "he", "him", "his"},    {"Iris", "she", "her", "her"},
    {"Jack", "he", "him", "his"},    {"Kate", "she", "her", "her"},   {"Leo", "he", "him", "his"},
    {"Maya", "she", "her", "her"},   {"Noah", "he", "him", "his"},    {"Olga", "she", "her", "her"},
    {"Peter", "he", "him", "his"},   {"Rosa", "she", "her", "her"},   {"Sam", "he", "him", "his"},
    {"Tara", "she", "her", "her"},   {"Omar", "he", "him", "his"},    {"Vera", "she", "her", "her"},
    {"Will", "he", "him", "his"},    {"Yara", "she", "her", "her"},   {"Zeno", "he", "him", "his"},
    {"Lucy", "she", "her", "her"},   {"Mark", "he", "him", "his"},    {"Nina", "she", "her", "her"},
    {"Paul", "he", "him", "his"},    {"Ruth", "she", "her", "her"},   {"Tom", "he", "him", "his"},
}};

inline constexpr std::array<std::string_view, 8> corpus_towns{
    "Ashby", "Brindle", "Carrow", "Dunmore", "Elmstead", "Fernley", "Glenmoor", "Hollins"};

inline constexpr std::array<std::string_view, 12> corpus_colours{
    "red", "blue", "green", "yellow", "white", "black", "brown", "orange", "purple", "pink", "grey", "silver"};

// Small things; plurals follow corpus_plural's rules.
inline constexpr std::array<std::string_view, 40> corpus_objects{
    "ball",   "cup",    "book",   "box",    "hat",     "key",     "lamp",   "pen",    "spoon",  "bowl",
    "bottle", "bag",    "coat",   "shoe",   "clock",   "plate",   "basket", "candle", "kite",   "drum",
    "bell",   "brush",  "ring",   "mirror", "pillow",  "blanket", "map",    "letter", "jar",    "bucket",
    "ladder", "rope",   "coin",   "stone",  "shell",   "feather", "ribbon", "button", "glass",  "sock"};

inline constexpr std::array<std::string_view, 12> corpus_surfaces{
    "table", "shelf", "desk", "bed", "sofa", "chair", "bench", "stool", "cupboard", "counter", "windowsill", "floor"};

inline constexpr std::array<std::string_view, 7> corpus_prepositions{
    "on", "under", "next to", "behind", "in front of", "near", "beside"};

inline constexpr std::array<std::string_view, 28> corpus_places{
    "kitchen", "garden",  "park",   "market", "school",   "library", "station",  "harbour", "forest", "village",
    "river",   "hill",    "beach",  "farm",   "bakery",   "museum",  "bridge",   "square",  "field",  "lake",
    "castle",  "tower",   "shop",   "cafe",   "hospital", "zoo",     "workshop", "island"};

inline constexpr std::array<std::string_view, 20> corpus_fruit_and_snacks{
    "apple", "pear",  "plum",  "bun",  "cake", "egg",   "carrot",  "onion", "lemon",  "grape",
    "melon", "cherry", "nut",  "bean", "pie",  "peach", "biscuit", "fig",   "cookie", "sandwich"};

inline constexpr std::array<std::string_view, 12> corpus_meals{
    "bread", "cheese", "soup", "rice", "honey", "milk", "tea", "butter", "jam", "porridge", "juice", "water"};

inline constexpr std::array<corpus_animal, 22> corpus_animals{{
    {"cat", "cats", 4, "meow", "house", "fish"},
    {"dog", "dogs", 4, "woof", "house", "bones"},
    {"cow", "cows", 4, "moo", "field", "grass"},
    {"sheep", "sheep", 4, "baa", "meadow", "grass"},
    {"horse", "horses", 4, "neigh", "stable", "hay"},
    {"pig", "pigs", 4, "oink", "sty", "turnips"},
    {"duck", "ducks", 2, "quack", "pond", "seeds"},
    {"hen", "hens", 2, "cluck", "coop", "corn"},
    {"owl", "owls", 2, "hoot", "forest", "mice"},
    {"frog", "frogs", 4, "croak", "pond", "flies"},
    {"bee", "bees", 6, "buzz", "hive", "nectar"},
    {"lion", "lions", 4, "roar", "savanna", "meat"},
    {"mouse", "mice", 4, "squeak", "barn", "cheese"},
    {"goat", "goats", 4, "bleat", "mountain", "leaves"},
    {"fox", "foxes", 4, "yip", "den", "berries"},
    {"bear", "bears", 4, "growl", "cave", "honey"},
    {"spider", "spiders", 8, "", "web", "flies"},
    {"ant", "ants", 6, "", "nest", "crumbs"},
    {"crow", "crows", 2, "caw", "tree", "worms"},
    {"snake", "snakes", 0, "hiss", "desert", "eggs"},
    {"wolf", "wolves", 4, "howl", "forest", "meat"},
    {"goose", "geese", 2, "honk", "lake", "grass"},
}};

inline constexpr std::array<corpus_job, 18> corpus_jobs{{
    {"baker", "bakery", "bakes bread"},
    {"farmer", "farm", "grows wheat"},
    {"teacher", "school", "teaches children"},
    {"doctor", "hospital", "helps sick people"},
    {"sailor", "harbour", "sails a boat"},
    {"painter", "workshop", "paints pictures"},
    {"builder", "building site", "builds houses"},
    {"driver", "bus station", "drives the bus"},
    {"librarian", "library", "lends books"},
    {"gardener", "park", "waters the flowers"},
    {"fisher", "lake", "catches fish"},
    {"cook", "cafe", "makes soup"},
    {"nurse", "hospital", "cares for patients"},
    {"pilot", "airport", "flies the plane"},
    {"shopkeeper", "shop", "sells sweets"},
    {"guard", "castle", "watches the gate"},
    {"miller", "mill", "grinds flour"},
    {"postman", "post office", "carries letters"},
}};

// (thing, its colour): facts that never change, so they are learnable.
inline constexpr std::array<corpus_pair, 20> corpus_colour_facts{{
    {"the sky", "blue"},          {"grass", "green"},        {"snow", "white"},      {"coal", "black"},
    {"the sun", "yellow"},        {"a ripe banana", "yellow"}, {"a ripe tomato", "red"}, {"a carrot", "orange"},
    {"milk", "white"},            {"the sea", "blue"},       {"a lemon", "yellow"},  {"a cherry", "red"},
    {"chocolate", "brown"},       {"an elephant", "grey"},   {"a frog", "green"},    {"a plum", "purple"},
    {"a flamingo", "pink"},       {"the night sky", "black"}, {"a leaf in summer", "green"},
    {"a leaf in autumn", "brown"},
}};

inline constexpr std::array<corpus_pair, 20> corpus_opposites{{
    {"hot", "cold"},   {"big", "small"},  {"tall", "short"}, {"old", "young"}, {"happy", "sad"},
    {"fast", "slow"},  {"open", "closed"}, {"full", "empty"}, {"light", "dark"}, {"up", "down"},
    {"left", "right"}, {"early", "late"}, {"wet", "dry"},    {"loud", "quiet"}, {"soft", "hard"},
    {"clean", "dirty"}, {"near", "far"},  {"strong", "weak"}, {"first", "last"}, {"day", "night"},
}};

inline constexpr std::array<std::string_view, 7> corpus_days{
    "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"};

inline constexpr std::array<std::string_view, 12> corpus_months{
    "January", "February", "March",     "April",   "May",      "June",
    "July",    "August",   "September", "October", "November", "December"};

// Season of each month, in month order (northern hemisphere).
inline constexpr std::array<std::string_view, 12> corpus_month_seasons{
    "winter", "winter", "spring", "spring", "spring", "summer",
    "summer", "summer", "autumn", "autumn", "autumn", "winter"};

inline constexpr std::array<std::string_view, 4> corpus_seasons{"spring", "summer", "autumn", "winter"};
inline constexpr std::array<std::string_view, 4> corpus_times{"morning", "afternoon", "evening", "night"};
inline constexpr std::array<std::string_view, 6> corpus_weather{"sunny", "rainy", "windy", "cloudy", "foggy", "snowy"};
inline constexpr std::array<std::string_view, 7> corpus_movements{
    "walked", "ran", "cycled", "drove", "went", "hurried", "wandered"};
inline constexpr std::array<std::string_view, 14> corpus_actions{
    "found", "bought", "counted", "collected", "picked", "carried", "washed",
    "painted", "wrapped", "sorted", "gathered", "packed", "saw", "kept"};
inline constexpr std::array<std::string_view, 14> corpus_adjectives{
    "big", "small", "old", "new", "heavy", "soft", "round", "shiny", "tiny", "long", "wooden", "broken", "clean", "pretty"};
inline constexpr std::array<std::string_view, 8> corpus_feelings{
    "happy", "tired", "sleepy", "hungry", "proud", "calm", "glad", "busy"};

inline constexpr std::array<std::string_view, 20> corpus_small_numbers{
    "zero",    "one",     "two",       "three",    "four",     "five",    "six",
    "seven",   "eight",   "nine",      "ten",      "eleven",   "twelve",  "thirteen",
    "fourteen", "fifteen", "sixteen",  "seventeen", "eighteen", "nineteen"};
inline constexpr std::array<std::string_view, 10> corpus_tens{
    "", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"};

// 0..100 in words: 42 -> "forty-two", 100 -> "one hundred".
inline std::string corpus_number(int n) {
    if (n >= 100) return "one hundred";
    if (n < 20) return std::string(corpus_small_numbers[static_cast<std::size_t>(n)]);
    std::string words(corpus_tens[static_cast<std::size_t>(n / 10)]);
    if (n % 10 != 0) {
        words += '-';
        words += corpus_small_numbers[static_cast<std::size_t>(n % 10)];
    }
    return words;
}

// box -> boxes, brush -> brushes, cherry -> cherries, cup -> cups.
inline std::string corpus_plural(std::string_view noun) {
    std::string word(noun);
    const auto ends_with = [&](std::string_view tail) { return noun.ends_with(tail); };
    if (ends_with("s") || ends_with("x") || ends_with("ch") || ends_with("sh")) return word + "es";
    if (ends_with("y") && noun.size() > 1 && std::string_view("aeiou").find(noun[noun.size() - 2]) == std::string_view::npos) {
        word.pop_back();
        return word + "ies";
    }
    return word + "s";
}

// "<count> <noun>" with agreement: 1 -> "one apple", 3 -> "three apples".
inline std::string corpus_count(int count, std::string_view noun) {
    return corpus_number(count) + " " + (count == 1 ? std::string(noun) : corpus_plural(noun));
}

inline std::string corpus_article(std::string_view word) {
    return (std::string_view("aeiou").find(word.front()) != std::string_view::npos ? "an " : "a ") + std::string(word);
}

inline std::string corpus_capitalized(std::string text) {
    for (char& c : text) {
        if (c >= 'a' && c <= 'z') {
            c = static_cast<char>(c - 'a' + 'A');
            break;
        }
        if (c >= 'A' && c <= 'Z') break;
    }
    return text;
}

class corpus_writer {
public:
    explicit corpus_writer(std::uint64_t seed) : rng_(seed) {}

    // Appends one paragraph followed by a blank line.
    void paragraph(std::string& out) {
        sentences_ = 0;
        const std::size_t kind = rng_.below(100);
        if (kind < 36) {
            story();
        } else if (kind < 66) {
            facts();
        } else if (kind < 86) {
            arithmetic();
        } else {
            scene();
        }
        out += text_;
        out += "\n\n";
        text_.clear();
    }

private:
    void say(std::string sentence) {
        if (sentences_++ != 0) text_ += ' ';
        text_ += corpus_capitalized(std::move(sentence));
    }

    // Every draw goes into a named local before it is used: the operands of `+` are
    // unsequenced, so `a + rng_.pick(x) + rng_.pick(y)` could draw in a different order on
    // another compiler and change the text.

    // A person, a place and a count that the later sentences keep consistent.
    void story() {
        const corpus_person& hero = rng_.pick(corpus_people);
        const corpus_person* other = &rng_.pick(corpus_people);
        while (other->name == hero.name) other = &rng_.pick(corpus_people);
        const corpus_job& job = rng_.pick(corpus_jobs);
        const std::string name(hero.name), subject(hero.subject), friend_name(other->name);

        const std::string town(rng_.pick(corpus_towns));
        if (rng_.percent(50)) {
            say(name + " is " + corpus_article(job.title) + " who lives in " + town + ".");
        } else {
            say(name + " lives in " + town + " and works at the " + std::string(job.workplace) + ".");
        }
        if (rng_.percent(40)) say("Every day " + subject + " " + std::string(job.duty) + ".");
        if (rng_.percent(40)) {
            const std::string weather(rng_.pick(corpus_weather));
            const std::string time(rng_.pick(corpus_times));
            say("It was a " + weather + " " + time + ", so " + subject + " took " + std::string(hero.possessive) +
                (weather == "sunny" ? " hat." : " coat."));
        }
        const std::string day(rng_.pick(corpus_days));
        const std::string movement(rng_.pick(corpus_movements));
        const std::string place(rng_.pick(corpus_places));
        say("On " + day + " " + subject + " " + movement + " to the " + place + ".");

        const bool food = rng_.percent(50);
        const std::string_view item = food ? rng_.pick(corpus_fruit_and_snacks) : rng_.pick(corpus_objects);
        const std::string colour = food ? std::string() : std::string(rng_.pick(corpus_colours)) + " ";
        const std::string action(rng_.pick(corpus_actions));
        int count = rng_.between(2, 12);
        say("There " + subject + " " + action + " " + corpus_number(count) + " " + colour + corpus_plural(item) + ".");
        if (rng_.percent(50)) {
            const int more = rng_.between(1, 9);
            say(friend_name + " gave " + std::string(hero.object) + " " + corpus_number(more) + " more, so now " + subject +
                " has " + corpus_count(count + more, item) + ".");
            count += more;
        } else {
            const int given = rng_.between(1, count - 1);
            say(name + " gave " + corpus_number(given) + " to " + friend_name + ", so " + subject + " has " +
                corpus_count(count - given, item) + " left.");
            count -= given;
        }
        if (rng_.percent(35)) {
            say("How many " + corpus_plural(item) + " does " + name + " have? " + corpus_capitalized(subject) + " has " +
                corpus_number(count) + ".");
        }
        if (rng_.percent(45)) {
            const std::string object(rng_.pick(corpus_objects));
            const std::string preposition(rng_.pick(corpus_prepositions));
            const std::string surface(rng_.pick(corpus_surfaces));
            say("\"Where is my " + object + "?\" asked " + name + ". \"It is " + preposition + " the " + surface +
                ",\" said " + friend_name + ".");
        }
        if (rng_.percent(50)) {
            const std::string meal(rng_.pick(corpus_meals));
            say("In the evening " + subject + " went home and had some " + meal + ".");
        }
        const std::string feeling(rng_.pick(corpus_feelings));
        say(subject + " was " + feeling + ".");
    }

    void facts() {
        const int n = rng_.between(3, 6);
        const std::size_t topic = rng_.below(5);
        for (int i = 0; i < n; ++i) {
            switch (topic) {
                case 0: animal_fact(); break;
                case 1: colour_fact(); break;
                case 2: opposite_fact(); break;
                case 3: job_fact(); break;
                default: calendar_fact(); break;
            }
        }
    }

    void animal_fact() {
        const corpus_animal& a = rng_.pick(corpus_animals);
        const std::string one(a.singular), many(a.plural);
        switch (rng_.below(5)) {
            case 0:
                say(corpus_article(one) + " has " + (a.legs == 0 ? std::string("no") : corpus_number(a.legs)) + " legs.");
                break;
            case 1:
                if (!a.sound.empty()) {
                    say("The " + one + " says " + std::string(a.sound) + ".");
                } else {
                    say(corpus_article(one) + " makes no sound.");
                }
                break;
            case 2: say(corpus_article(one) + " lives in " + corpus_article(a.home) + "."); break;
            case 3: say(many + " like to eat " + std::string(a.food) + "."); break;
            default: {
                const int count = rng_.between(2, 5);
                say(corpus_number(count) + " " + many + " have " +
                    (a.legs == 0 ? std::string("no") : corpus_number(count * a.legs)) + " legs.");
                break;
            }
        }
    }

    void colour_fact() {
        const corpus_pair& fact = rng_.pick(corpus_colour_facts);
        const std::string thing(fact.first), colour(fact.second);
        if (rng_.percent(50)) {
            say("What colour is " + thing + "? " + corpus_capitalized(thing) + " is " + colour + ".");
        } else {
            say(thing + " is " + colour + ".");
        }
    }

    void opposite_fact() {
        const corpus_pair& pair = rng_.pick(corpus_opposites);
        const bool forward = rng_.percent(50);
        const std::string from(forward ? pair.first : pair.second), to(forward ? pair.second : pair.first);
        say("The opposite of " + from + " is " + to + ".");
    }

    void job_fact() {
        const corpus_job& job = rng_.pick(corpus_jobs);
        const std::string title(job.title), workplace(job.workplace);
        switch (rng_.below(3)) {
            case 0: say("The " + title + " works at the " + workplace + "."); break;
            case 1: say("The " + title + " " + std::string(job.duty) + "."); break;
            default: {
                const corpus_person& person = rng_.pick(corpus_people);
                say(std::string(person.name) + " is " + corpus_article(title) + ", so " + std::string(person.subject) +
                    " works at the " + workplace + ".");
                break;
            }
        }
    }

    void calendar_fact() {
        switch (rng_.below(4)) {
            case 0: {
                const std::size_t d = rng_.below(7);
                say("The day after " + std::string(corpus_days[d]) + " is " + std::string(corpus_days[(d + 1) % 7]) + ".");
                break;
            }
            case 1: {
                const std::size_t m = rng_.below(12);
                say("The month after " + std::string(corpus_months[m]) + " is " +
                    std::string(corpus_months[(m + 1) % 12]) + ".");
                break;
            }
            case 2: {
                const std::size_t m = rng_.below(12);
                say(std::string(corpus_months[m]) + " is in " + std::string(corpus_month_seasons[m]) + ".");
                break;
            }
            default: {
                const std::size_t s = rng_.below(4);
                say(std::string(corpus_seasons[(s + 1) % 4]) + " comes after " + std::string(corpus_seasons[s]) + ".");
                break;
            }
        }
    }

    void arithmetic() {
        const int n = rng_.between(3, 6);
        for (int i = 0; i < n; ++i) {
            switch (rng_.below(8)) {
                case 0: {
                    const int a = rng_.between(0, 10);
                    const int b = rng_.between(0, 10);
                    say(corpus_number(a) + " plus " + corpus_number(b) + " is " + corpus_number(a + b) + ".");
                    break;
                }
                case 1: {
                    const int a = rng_.between(1, 20);
                    const int b = rng_.between(0, a);
                    say(corpus_number(a) + " minus " + corpus_number(b) + " is " + corpus_number(a - b) + ".");
                    break;
                }
                case 2: {
                    const int a = rng_.between(1, 10);
                    const int b = rng_.between(1, 10);
                    say(corpus_number(a) + " times " + corpus_number(b) + " is " + corpus_number(a * b) + ".");
                    break;
                }
                case 3: {
                    const int a = rng_.between(0, 50);
                    const int b = rng_.between(0, 49);
                    say(std::to_string(a) + " + " + std::to_string(b) + " = " + std::to_string(a + b) + ".");
                    break;
                }
                case 4: {
                    const int a = rng_.between(1, 20);
                    const int b = rng_.between(0, a - 1);
                    if (rng_.percent(50)) {
                        say(corpus_number(a) + " is more than " + corpus_number(b) + ".");
                    } else {
                        say(corpus_number(b) + " is less than " + corpus_number(a) + ".");
                    }
                    break;
                }
                case 5: {
                    const int a = rng_.between(1, 10);
                    say("Half of " + corpus_number(2 * a) + " is " + corpus_number(a) + ".");
                    break;
                }
                case 6: {
                    const int from = rng_.between(1, 15);
                    const int length = rng_.between(3, 6);
                    std::string line = "Count from " + corpus_number(from) + " to " + corpus_number(from + length - 1) + ":";
                    for (int k = 0; k < length; ++k) line += (k == 0 ? " " : ", ") + corpus_number(from + k);
                    say(line + ".");
                    break;
                }
                default: {
                    const std::string_view item = rng_.pick(corpus_fruit_and_snacks);
                    const int have = rng_.between(2, 12);
                    const int eaten = rng_.between(1, have - 1);
                    say("If you have " + corpus_count(have, item) + " and eat " + corpus_number(eaten) + ", you have " +
                        corpus_count(have - eaten, item) + " left.");
                    break;
                }
            }
        }
    }

    // A room or place described object by object.
    void scene() {
        const std::string place(rng_.pick(corpus_places));
        const std::string adjective(rng_.pick(corpus_adjectives));
        const std::string colour(rng_.pick(corpus_colours));
        const std::string object(rng_.pick(corpus_objects));
        say("In the " + place + " there is " + corpus_article(adjective) + " " + colour + " " + object + ".");
        const std::string preposition(rng_.pick(corpus_prepositions));
        const std::string surface(rng_.pick(corpus_surfaces));
        say("The " + object + " is " + preposition + " the " + surface + ".");
        const std::string_view other = rng_.pick(corpus_objects);
        const int count = rng_.between(1, 9);
        say("Next to it " + std::string(count == 1 ? "there is " : "there are ") + corpus_count(count, other) + ".");
        if (rng_.percent(50)) {
            const std::string other_colour(rng_.pick(corpus_colours));
            say(std::string(count == 1 ? "It is " : "They are ") + other_colour + ".");
        }
        if (rng_.percent(50)) {
            const corpus_person& visitor = rng_.pick(corpus_people);
            const std::string action(rng_.pick(corpus_actions));
            say(std::string(visitor.name) + " " + action + " the " + object + " and put it in " +
                std::string(visitor.possessive) + " bag.");
        }
    }

    corpus_rng rng_;
    std::string text_;
    int sentences_ = 0;
};

}  // namespace detail

// Returns exactly `bytes` characters of generated text (ASCII only: letters, digits,
// spaces, newlines and . , : ? " + =). The same (bytes, seed) gives the same text
// everywhere; a different seed gives a different text.
inline std::string make_corpus(std::size_t bytes = 200'000, std::uint64_t seed = 1) {
    detail::corpus_writer writer(seed);
    std::string text;
    text.reserve(bytes + 1024);
    while (text.size() < bytes) writer.paragraph(text);
    text.resize(bytes);
    return text;
}

}  // namespace loom::train
// ---- end loom/train/corpus.hpp ----
// ---- begin loom/train/data_loader.hpp ----
// data_loader: next-token-prediction batches from one token sequence.
//
// A window is seq + 1 consecutive tokens starting at any position w in
// [0, tokens - seq): its first seq tokens are the inputs, its last seq the targets, so
//   targets[b * seq + i] == inputs[b * seq + i + 1]   for i + 1 < seq
//   targets[b * seq + seq - 1] == tokens[w + seq].
// An epoch visits every window start exactly once: in order 0, 1, 2, ... when shuffle is
// off, in a seeded pseudo-random order that is a different permutation each epoch when it
// is on. Batches run on across epoch boundaries, so no window is dropped.
//
// The order is a keyed Feistel permutation of the window index (own implementation, only
// 64-bit integer arithmetic), so it needs no memory per window and the same (tokens,
// options) give the same batches on every platform. The whole position in the stream is
// data_loader_state, five integers: save state() in a checkpoint and restore() it to
// continue with exactly the batches the first run would have drawn next.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

// ---- begin loom/train/token_file.hpp ----
// A binary token file: a pre-tokenized corpus that training reads without re-tokenizing.
//
// Layout (all integers little-endian), 32-byte header then the tokens:
//   offset  0  8 bytes  magic "LOOMTOKS"
//   offset  8  u32      format version, 1
//   offset 12  u32      bytes per token, 2 (vocab_size <= 65536) or 4
//   offset 16  u32      vocab_size; every token is in [0, vocab_size)
//   offset 20  u32      reserved, 0
//   offset 24  u64      token count N
//   offset 32  N * bytes_per_token bytes of tokens
// So a file of N tokens is exactly 32 + N * bytes_per_token bytes long; anything else is
// truncated or has trailing bytes, and is rejected.
//
// Make one with write_token_file(path, tokens, vocab_size), e.g. from
// byte_tokenizer{}.encode(make_corpus()) with vocab_size 256.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>


namespace loom::train {

inline constexpr std::string_view token_file_magic = "LOOMTOKS";
inline constexpr std::uint32_t token_file_version = 1;
inline constexpr std::size_t token_file_header_bytes = 32;

namespace detail {

inline void token_file_put(std::string& out, std::uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

inline std::uint64_t token_file_get(const unsigned char* in, int bytes) {
    std::uint64_t value = 0;
    for (int i = 0; i < bytes; ++i) value |= static_cast<std::uint64_t>(in[i]) << (8 * i);
    return value;
}

inline std::string token_file_quote(const std::filesystem::path& path) { return "'" + path.string() + "'"; }

// Shows bytes as text where printable: "PK\x03\x04" for a zip file.
inline std::string token_file_printable(std::span<const unsigned char> bytes) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string text = "\"";
    for (unsigned char b : bytes) {
        if (b >= 0x20 && b < 0x7f && b != '"' && b != '\\') {
            text.push_back(static_cast<char>(b));
        } else {
            text += "\\x";
            text.push_back(hex[b >> 4]);
            text.push_back(hex[b & 0xF]);
        }
    }
    return text + "\"";
}

inline constexpr std::string_view token_file_fix =
    "write it with loom::train::write_token_file(path, tokens, vocab_size)";

}  // namespace detail

// Writes `tokens` in the format above: 2 bytes per token when vocab_size <= 65536, else 4.
// Throws loom::usage_error for a vocab_size of 0 or above 2^31 (ids are int32) and for a
// token outside [0, vocab_size); loom::data_error when the file cannot be written.
// The file is written beside `path` and renamed into place, so a reader never sees half of it.
inline void write_token_file(const std::filesystem::path& path, std::span<const std::int32_t> tokens,
                             std::uint32_t vocab_size) {
    if (vocab_size == 0 || vocab_size > (std::uint32_t{1} << 31)) {
        throw usage_error("write_token_file: vocab_size " + std::to_string(vocab_size) + " for " +
                          detail::token_file_quote(path) + " is outside [1, 2^31]; pass the tokenizer's vocab_size "
                          "(256 for byte_tokenizer)");
    }
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] < 0 || static_cast<std::uint32_t>(tokens[i]) >= vocab_size) {
            throw usage_error("write_token_file: token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                              " is outside [0, " + std::to_string(vocab_size) + ") for " +
                              detail::token_file_quote(path) + "; pass the vocab_size of the tokenizer that produced "
                              "the tokens");
        }
    }
    const int width = vocab_size <= 65536 ? 2 : 4;

    std::string bytes;
    bytes.reserve(token_file_header_bytes + tokens.size() * static_cast<std::size_t>(width));
    bytes += token_file_magic;
    detail::token_file_put(bytes, token_file_version, 4);
    detail::token_file_put(bytes, static_cast<std::uint64_t>(width), 4);
    detail::token_file_put(bytes, vocab_size, 4);
    detail::token_file_put(bytes, 0, 4);
    detail::token_file_put(bytes, tokens.size(), 8);
    for (std::int32_t t : tokens) detail::token_file_put(bytes, static_cast<std::uint32_t>(t), width);

    std::filesystem::path partial = path;
    partial += ".partial";
    {
        std::ofstream out(partial, std::ios::binary | std::ios::trunc);
        if (!out) {
            throw data_error("write_token_file: cannot create " + detail::token_file_quote(partial) +
                             "; check that the directory exists and is writable");
        }
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        out.close();
        if (!out) {
            throw data_error("write_token_file: writing " + std::to_string(bytes.size()) + " bytes to " +
                             detail::token_file_quote(partial) + " failed; check free disk space");
        }
    }
    std::error_code ec;
    std::filesystem::rename(partial, path, ec);
    if (ec) {
        throw data_error("write_token_file: cannot rename " + detail::token_file_quote(partial) + " to " +
                         detail::token_file_quote(path) + ": " + ec.message() + "; check that the target is writable");
    }
}

// A token file read into memory and validated: every error names the path, what is wrong
// and how to make a good file. The tokens are shared, not copied, with data_loaders built
// from this file, so they stay alive as long as any of them.
class token_file {
public:
    explicit token_file(std::filesystem::path path) : path_(std::move(path)) { load(); }

    const std::filesystem::path& path() const noexcept { return path_; }
    std::size_t size() const noexcept { return tokens_->size(); }
    bool empty() const noexcept { return tokens_->empty(); }
    std::uint32_t vocab_size() const noexcept { return vocab_size_; }
    std::uint32_t bytes_per_token() const noexcept { return bytes_per_token_; }

    std::int32_t operator[](std::size_t i) const noexcept { return (*tokens_)[i]; }
    std::span<const std::int32_t> tokens() const noexcept { return *tokens_; }
    const std::shared_ptr<const std::vector<std::int32_t>>& shared_tokens() const noexcept { return tokens_; }

private:
    [[noreturn]] void fail(const std::string& what) const {
        throw data_error("token_file: " + detail::token_file_quote(path_) + " " + what);
    }

    void load() {
        std::error_code ec;
        const auto status = std::filesystem::status(path_, ec);
        if (!std::filesystem::exists(status)) fail("does not exist; " + std::string(detail::token_file_fix));
        if (!std::filesystem::is_regular_file(status)) fail("is not a regular file; pass the path of a token file");
        const std::uintmax_t file_bytes = std::filesystem::file_size(path_, ec);
        if (ec) fail("cannot be sized: " + ec.message());
        if (file_bytes == 0) fail("is empty (0 bytes), not a loom token file; " + std::string(detail::token_file_fix));

        std::ifstream in(path_, std::ios::binary);
        if (!in) fail("cannot be opened for reading; check its permissions");
        std::array<unsigned char, token_file_header_bytes> header{};
        const std::size_t header_read = static_cast<std::size_t>(std::min<std::uintmax_t>(file_bytes, header.size()));
        in.read(reinterpret_cast<char*>(header.data()), static_cast<std::streamsize>(header_read));
        if (static_cast<std::size_t>(in.gcount()) != header_read) fail("could not be read; check the disk");

        const std::size_t magic_read = std::min(header_read, token_file_magic.size());
        if (!std::equal(header.begin(), header.begin() + static_cast<std::ptrdiff_t>(magic_read), token_file_magic.begin())) {
            fail("starts with " + detail::token_file_printable({header.data(), magic_read}) + " instead of the magic \"" +
                 std::string(token_file_magic) + "\", so it is not a loom token file; " +
                 std::string(detail::token_file_fix));
        }
        if (header_read < token_file_header_bytes) {
            fail("is truncated: " + std::to_string(file_bytes) + " bytes, shorter than the " +
                 std::to_string(token_file_header_bytes) + "-byte header; " + std::string(detail::token_file_fix));
        }

        const auto version = static_cast<std::uint32_t>(detail::token_file_get(&header[8], 4));
        const auto width = static_cast<std::uint32_t>(detail::token_file_get(&header[12], 4));
        vocab_size_ = static_cast<std::uint32_t>(detail::token_file_get(&header[16], 4));
        const auto reserved = static_cast<std::uint32_t>(detail::token_file_get(&header[20], 4));
        const std::uint64_t count = detail::token_file_get(&header[24], 8);

        if (version != token_file_version) {
            fail("has format version " + std::to_string(version) + ", but this build reads only version " +
                 std::to_string(token_file_version) + "; rewrite it with this build's loom::train::write_token_file");
        }
        if (width != 2 && width != 4) {
            fail("declares " + std::to_string(width) + " bytes per token, but only 2 and 4 are valid; the header is "
                 "corrupt, " + std::string(detail::token_file_fix));
        }
        if (reserved != 0) {
            fail("has reserved header field " + std::to_string(reserved) + " instead of 0; the header is corrupt, " +
                 std::string(detail::token_file_fix));
        }
        if (vocab_size_ == 0 || vocab_size_ > (std::uint32_t{1} << 31)) {
            fail("declares vocab_size " + std::to_string(vocab_size_) + ", outside [1, 2^31]; the header is corrupt, " +
                 std::string(detail::token_file_fix));
        }
        bytes_per_token_ = width;

        const std::uintmax_t payload = file_bytes - token_file_header_bytes;
        const bool fits = count <= payload / width;  // count * width <= payload, without overflow
        if (!fits || payload != count * width) {
            const bool overflows = count > (std::numeric_limits<std::uint64_t>::max() - token_file_header_bytes) / width;
            const std::string expected =
                overflows ? std::string("more bytes than any file can hold")
                          : std::to_string(token_file_header_bytes + count * width) + " bytes";
            fail(std::string(fits ? "has trailing bytes" : "is truncated") + ": the header says " + std::to_string(count) +
                 " tokens of " + std::to_string(width) + " bytes, so expected " + expected + ", found " +
                 std::to_string(file_bytes) + " bytes; the file was " + (fits ? "appended to" : "cut short") + ", " +
                 std::string(detail::token_file_fix));
        }

        std::vector<unsigned char> raw(static_cast<std::size_t>(payload));
        in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size()));
        if (static_cast<std::size_t>(in.gcount()) != raw.size()) {
            fail("could not be read past byte " + std::to_string(token_file_header_bytes + in.gcount()) +
                 " of " + std::to_string(file_bytes) + "; check the disk");
        }
        auto tokens = std::make_shared<std::vector<std::int32_t>>(static_cast<std::size_t>(count));
        const int w = static_cast<int>(width);
        for (std::size_t i = 0; i < tokens->size(); ++i) {
            const std::uint64_t id = detail::token_file_get(&raw[i * width], w);
            if (id >= vocab_size_) {
                fail("has token " + std::to_string(id) + " at position " + std::to_string(i) + ", not below its vocab_size " +
                     std::to_string(vocab_size_) + "; the tokens are corrupt or the vocab_size is wrong, " +
                     std::string(detail::token_file_fix));
            }
            (*tokens)[i] = static_cast<std::int32_t>(id);
        }
        tokens_ = std::move(tokens);
    }

    std::filesystem::path path_;
    std::shared_ptr<const std::vector<std::int32_t>> tokens_ = std::make_shared<const std::vector<std::int32_t>>();
    std::uint32_t vocab_size_ = 0;
    std::uint32_t bytes_per_token_ = 0;
};

}  // namespace loom::train
// ---- end loom/train/token_file.hpp ----

namespace loom::train {

struct data_loader_options {
    std::int64_t batch = 1;
    std::int64_t seq = 1;
    std::uint64_t seed = 0;
    bool shuffle = true;
};

// Row-major [batch, seq] token ids.
struct batch {
    std::vector<std::int32_t> inputs;
    std::vector<std::int32_t> targets;
    std::int64_t batch = 0;
    std::int64_t seq = 0;
};

// Where a data_loader is in its stream; all fields are plain integers so a checkpoint can
// store them anywhere. window_count and shuffle identify the stream and are checked on
// restore; seed, epoch and cursor are adopted.
struct data_loader_state {
    std::uint64_t seed = 0;
    std::uint64_t epoch = 0;         // completed epochs
    std::uint64_t cursor = 0;        // windows already drawn in the current epoch
    std::uint64_t window_count = 0;  // windows per epoch: tokens - seq
    std::uint64_t shuffle = 0;       // 1 when windows are shuffled, else 0

    friend bool operator==(const data_loader_state&, const data_loader_state&) = default;
};

namespace detail {

// A permutation of [0, n) chosen by `key`. A balanced Feistel network permutes
// [0, 2^bits) with 2^bits < 4n; values that land at or above n are sent through again
// ("cycle walking"), which stays inside the cycle of the start value and so ends at a
// value below n, after fewer than 4 rounds on average.
class feistel_permutation {
public:
    constexpr feistel_permutation(std::uint64_t n, std::uint64_t key) noexcept : n_(n), key_(key) {
        while (half_bits_ < 32 && (std::uint64_t{1} << (2 * half_bits_)) < n_) ++half_bits_;
        mask_ = (std::uint64_t{1} << half_bits_) - 1;
    }

    constexpr std::uint64_t operator()(std::uint64_t index) const noexcept {
        if (n_ <= 1) return 0;
        std::uint64_t x = index;
        do {
            x = encrypt(x);
        } while (x >= n_);
        return x;
    }

private:
    static constexpr int rounds = 6;

    constexpr std::uint64_t encrypt(std::uint64_t x) const noexcept {
        std::uint64_t left = x >> half_bits_, right = x & mask_;
        for (int r = 0; r < rounds; ++r) {
            const std::uint64_t next = left ^ (splitmix64(key_ ^ splitmix64(right + 0x100000001b3ULL * static_cast<std::uint64_t>(r))) & mask_);
            left = right;
            right = next;
        }
        return (left << half_bits_) | right;
    }

    std::uint64_t n_;
    std::uint64_t key_;
    int half_bits_ = 1;
    std::uint64_t mask_ = 1;
};

}  // namespace detail

class data_loader {
public:
    // Copies the tokens.
    data_loader(std::span<const std::int32_t> tokens, data_loader_options options)
        : data_loader(std::make_shared<const std::vector<std::int32_t>>(tokens.begin(), tokens.end()), options) {}

    data_loader(std::vector<std::int32_t> tokens, data_loader_options options)
        : data_loader(std::make_shared<const std::vector<std::int32_t>>(std::move(tokens)), options) {}

    // Shares the file's tokens; no copy.
    data_loader(const token_file& file, data_loader_options options) : data_loader(file.shared_tokens(), options) {}

    data_loader(std::shared_ptr<const std::vector<std::int32_t>> tokens, data_loader_options options)
        : tokens_(std::move(tokens)), options_(options) {
        if (!tokens_) throw usage_error("data_loader: the token pointer is null; pass a token sequence");
        if (options_.batch < 1 || options_.seq < 1) {
            throw usage_error("data_loader: batch " + std::to_string(options_.batch) + " and seq " +
                              std::to_string(options_.seq) + " must both be at least 1");
        }
        const auto needed = static_cast<std::uint64_t>(options_.seq) + 1;
        if (tokens_->size() < needed) {
            throw data_error("data_loader: " + std::to_string(tokens_->size()) + " tokens are too few for one window of seq " +
                             std::to_string(options_.seq) + ", which needs " + std::to_string(needed) +
                             " tokens (seq inputs plus one target); use more data or a shorter seq");
        }
        window_count_ = tokens_->size() - static_cast<std::uint64_t>(options_.seq);
    }

    const data_loader_options& options() const noexcept { return options_; }
    std::uint64_t windows_per_epoch() const noexcept { return window_count_; }
    std::uint64_t epoch() const noexcept { return epoch_; }
    std::span<const std::int32_t> tokens() const noexcept { return *tokens_; }

    // The start position of the index-th window of an epoch.
    std::uint64_t window_start(std::uint64_t epoch, std::uint64_t index) const noexcept {
        if (!options_.shuffle) return index;
        return detail::feistel_permutation(window_count_, splitmix64(options_.seed ^ splitmix64(epoch)))(index);
    }

    batch next() {
        const auto rows = static_cast<std::size_t>(options_.batch);
        const auto seq = static_cast<std::size_t>(options_.seq);
        batch out{std::vector<std::int32_t>(rows * seq), std::vector<std::int32_t>(rows * seq), options_.batch, options_.seq};
        const std::int32_t* data = tokens_->data();
        for (std::size_t b = 0; b < rows; ++b) {
            const std::uint64_t start = window_start(epoch_, cursor_);
            for (std::size_t i = 0; i < seq; ++i) {
                out.inputs[b * seq + i] = data[start + i];
                out.targets[b * seq + i] = data[start + i + 1];
            }
            if (++cursor_ == window_count_) {
                cursor_ = 0;
                ++epoch_;
            }
        }
        return out;
    }

    data_loader_state state() const noexcept {
        return {options_.seed, epoch_, cursor_, window_count_, options_.shuffle ? 1U : 0U};
    }

    // Continues the stream `saved` came from. Throws loom::usage_error when it belongs to a
    // different stream (other token count or seq, other shuffle setting) or is corrupt.
    void restore(const data_loader_state& saved) {
        if (saved.window_count != window_count_) {
            throw usage_error("data_loader::restore: the saved state has " + std::to_string(saved.window_count) +
                              " windows per epoch but this loader has " + std::to_string(window_count_) +
                              " (tokens - seq); restore with the same token sequence and seq that produced the state");
        }
        if (saved.shuffle != (options_.shuffle ? 1U : 0U)) {
            throw usage_error("data_loader::restore: the saved state has shuffle " + std::to_string(saved.shuffle) +
                              " but this loader has shuffle " + std::string(options_.shuffle ? "1" : "0") +
                              "; construct the loader with the shuffle setting of the run that saved the state");
        }
        if (saved.cursor >= window_count_) {
            throw usage_error("data_loader::restore: the saved cursor " + std::to_string(saved.cursor) +
                              " is not below the " + std::to_string(window_count_) +
                              " windows per epoch; the saved state is corrupt");
        }
        options_.seed = saved.seed;
        epoch_ = saved.epoch;
        cursor_ = saved.cursor;
    }

private:
    std::shared_ptr<const std::vector<std::int32_t>> tokens_;
    data_loader_options options_;
    std::uint64_t window_count_ = 0;
    std::uint64_t epoch_ = 0;
    std::uint64_t cursor_ = 0;
};

}  // namespace loom::train
// ---- end loom/train/data_loader.hpp ----
// ---- begin loom/train/distributed_trainer.hpp ----
// Training one rank of a partitioned graph: this device's program, its pieces of the
// parameters (initialised from the same counter-based streams as on one device, so any
// plan starts from the same weights), the communicator for transfers, and the optimizer
// over the parameter pieces this rank updates.
//
// Every rank constructs one and calls step() with the same full batch; each copies the
// boxes of the inputs it stores. The loss and the gradient norm come back identical on
// every rank. Replicated parameter pieces receive identical gradients and make identical
// updates, so they stay equal without communication; under ZeRO-1 and ZeRO-2 a rank
// updates its shard only and the shards are all-gathered after the update.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

// ---- begin loom/train/init.hpp ----
// Seeded parameter initialisation. Element i of parameter "p" is a pure function of
// (seed, "p", i): a counter-based generator, so any slice of a parameter, initialised on
// whatever device holds it, equals the same slice of the whole parameter.
#include <cmath>
#include <cstdint>
#include <numbers>
#include <span>
#include <string_view>


namespace loom::train {

namespace detail {
inline constexpr std::uint64_t hash_name(std::string_view s) {
    std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
    for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
    return h;
}
// Uniform in (0, 1), never 0 (Box-Muller takes a log).
inline double unit_uniform(std::uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53; }
}  // namespace detail

// One value of the stream of parameter `name`: the i-th element.
inline double init_value(const parameter_init& init, std::uint64_t seed, std::string_view name, std::uint64_t i) {
    const std::uint64_t key = splitmix64(seed ^ splitmix64(detail::hash_name(name)));
    switch (init.distribution) {
        case parameter_init::kind::constant: return init.a;
        case parameter_init::kind::uniform: {
            double u = detail::unit_uniform(splitmix64(key + 2 * i));
            return init.a + (init.b - init.a) * u;
        }
        case parameter_init::kind::normal: {
            double u1 = detail::unit_uniform(splitmix64(key + 2 * i));
            double u2 = detail::unit_uniform(splitmix64(key + 2 * i + 1));
            double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
            return init.a + init.b * z;
        }
    }
    return 0.0;
}

// Fills `out` with elements [first, first + out.size()) of parameter `name`.
template <class T>
void initialize(std::span<T> out, const parameter_init& init, std::uint64_t seed, std::string_view name,
                std::uint64_t first = 0) {
    for (std::size_t j = 0; j < out.size(); ++j) out[j] = static_cast<T>(init_value(init, seed, name, first + j));
}

}  // namespace loom::train
// ---- end loom/train/init.hpp ----
// ---- begin loom/train/sgd.hpp ----
// SGD with momentum, with PyTorch's torch.optim.SGD semantics:
//   g <- g + wd * p
//   buf <- g                                 on the first step
//   buf <- momentum * buf + (1 - dampening) * g   afterwards
//   p <- p - lr * (nesterov ? g + momentum * buf : buf)
#include <cstdint>
#include <string>
#include <vector>


namespace loom::train {

struct sgd_options {
    double lr = 0.1;
    double momentum = 0.9;
    double dampening = 0.0;
    double weight_decay = 0.0;
    bool nesterov = false;
};

template <class T>
class sgd {
public:
    explicit sgd(sgd_options options) : options_(options) {
        if (options.momentum < 0 || options.lr < 0 || options.weight_decay < 0)
            throw usage_error("sgd: lr, momentum and weight_decay must be >= 0");
        if (options.nesterov && (options.momentum <= 0 || options.dampening != 0))
            throw usage_error("sgd: nesterov momentum needs momentum > 0 and dampening == 0");
    }

    void add(parameter_slot<T> slot) {
        momentum_.emplace_back(slot.value.size(), T(0));
        slots_.push_back(std::move(slot));
    }

    // One update of every parameter; `lr` overrides the configured rate (for schedules).
    void step(double lr) {
        const T mu = static_cast<T>(options_.momentum), damp = static_cast<T>(1 - options_.dampening);
        for (std::size_t s = 0; s < slots_.size(); ++s) {
            auto& slot = slots_[s];
            auto& buf = momentum_[s];
            const T wd = slot.weight_decay ? static_cast<T>(options_.weight_decay) : T(0);
            for (std::size_t i = 0; i < slot.value.size(); ++i) {
                T g = slot.grad[i] + wd * slot.value[i];
                T update = g;
                if (options_.momentum != 0) {
                    buf[i] = steps_ == 0 ? g : mu * buf[i] + damp * g;
                    update = options_.nesterov ? g + mu * buf[i] : buf[i];
                }
                slot.value[i] -= static_cast<T>(lr) * update;
            }
        }
        ++steps_;
    }
    void step() { step(options_.lr); }

    std::int64_t steps() const { return steps_; }
    const sgd_options& options() const { return options_; }
    // Checkpointing: the momentum buffer of slot s.
    std::vector<T>& momentum(std::size_t s) { return momentum_.at(s); }
    const std::vector<parameter_slot<T>>& slots() const { return slots_; }
    void set_steps(std::int64_t steps) { steps_ = steps; }

private:
    sgd_options options_;
    std::vector<parameter_slot<T>> slots_;
    std::vector<std::vector<T>> momentum_;
    std::int64_t steps_ = 0;
};

}  // namespace loom::train
// ---- end loom/train/sgd.hpp ----
// ---- begin loom/train/trainer.hpp ----
// Single-device training on the host backend: one compiled program (forward + backward),
// parameters initialised from their seeded streams, an optimizer, optional global-norm
// clipping and a learning-rate schedule. Inputs are fed by tensor name every step.
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

// ---- begin loom/train/grad_clip.hpp ----
// Global-norm gradient clipping with torch.nn.utils.clip_grad_norm_ semantics:
//   total = sqrt(sum over every gradient element of g^2)
//   if max_norm / (total + 1e-6) < 1, every gradient is scaled by that factor.
// The norm is accumulated in double in a fixed order, so it is the same whatever the
// thread count.
#include <cmath>
#include <span>
#include <vector>

namespace loom::train {

template <class T>
double global_norm(const std::vector<std::span<T>>& grads) {
    double sum = 0;
    for (const auto& g : grads) {
        double part = 0;
        for (T x : g) part += static_cast<double>(x) * static_cast<double>(x);
        sum += part;
    }
    return std::sqrt(sum);
}

// Returns the norm before clipping.
template <class T>
double clip_global_norm(const std::vector<std::span<T>>& grads, double max_norm) {
    const double total = global_norm(grads);
    const double coefficient = max_norm / (total + 1e-6);
    if (coefficient < 1)
        for (const auto& g : grads)
            for (T& x : g) x = static_cast<T>(x * coefficient);
    return total;
}

}  // namespace loom::train
// ---- end loom/train/grad_clip.hpp ----
// ---- begin loom/train/lr_schedule.hpp ----
// Learning-rate schedule: linear warm-up, then cosine decay to `min_lr` at `total_steps`
// (constant after). With total_steps == 0 the rate is constant after warm-up.
#include <cmath>
#include <cstdint>
#include <numbers>

namespace loom::train {

struct lr_schedule {
    double peak = 1e-3;
    double min_lr = 0.0;
    std::int64_t warmup_steps = 0;
    std::int64_t total_steps = 0;

    // Rate for step `step`, counted from 0.
    double at(std::int64_t step) const {
        if (step < warmup_steps) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
        if (total_steps <= warmup_steps) return peak;
        if (step >= total_steps) return min_lr;
        const double progress =
            static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
        return min_lr + 0.5 * (peak - min_lr) * (1 + std::cos(std::numbers::pi * progress));
    }
};

}  // namespace loom::train
// ---- end loom/train/lr_schedule.hpp ----

namespace loom::train {

struct trainer_options {
    std::variant<adamw_options, sgd_options> optimizer = adamw_options{};
    lr_schedule schedule{};         // schedule.peak is the learning rate
    double clip_norm = 1.0;         // <= 0: no clipping
    std::uint64_t init_seed = 1234;
};

// Inputs for one step, by tensor name.
struct input_feed {
    std::map<std::string, std::span<const std::int32_t>> index;
    std::map<std::string, std::span<const double>> real;
};

struct step_result {
    double loss = 0;
    double grad_norm = 0;  // before clipping
    double lr = 0;
    double seconds = 0;
};

template <class T>
class trainer {
public:
    static constexpr precision prec = std::is_same_v<T, float> ? precision::f32 : precision::f64;

    trainer(graph g, trainer_options options) : graph_(std::make_unique<graph>(std::move(g))), options_(options) {
        if (graph_->loss == no_id) throw usage_error("trainer: the graph has no loss; call graph_builder::set_loss");
        if (graph_->gradients.empty())
            throw usage_error("trainer: the graph has no backward pass; call build_backward before training");
        program_ = compile_program(*graph_, {.prec = prec});
        executor_ = std::make_unique<host::executor<T>>(program_);
        storage_ = std::make_unique<host::bound_storage<T>>(program_);
        storage_->bind_to(*executor_);
        for (tensor_id p : graph_->parameters) {
            const tensor_desc& d = graph_->tensor(p);
            initialize(storage_->real(p), d.init, options_.init_seed, d.name);
        }
        std::visit([&](const auto& o) { make_optimizer(o); }, options_.optimizer);
        for (auto [param, grad] : graph_->gradients) grads_.push_back(storage_->real(grad));
    }

    // The executor keeps references into this object.
    trainer(const trainer&) = delete;
    trainer& operator=(const trainer&) = delete;

    step_result step(const input_feed& feed) {
        auto start = std::chrono::steady_clock::now();
        set_inputs(feed);
        executor_->run(static_cast<std::uint64_t>(steps_));
        step_result r;
        r.loss = static_cast<double>(storage_->real(graph_->loss)[0]);
        r.grad_norm = options_.clip_norm > 0 ? clip_global_norm(grads_, options_.clip_norm) : global_norm(grads_);
        r.lr = options_.schedule.at(steps_);
        std::visit([&](auto& opt) { opt.step(r.lr); }, *optimizer_);
        ++steps_;
        r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return r;
    }

    // The loss of a forward + backward pass without updating anything.
    double evaluate(const input_feed& feed) {
        set_inputs(feed);
        executor_->run(static_cast<std::uint64_t>(steps_));
        return static_cast<double>(storage_->real(graph_->loss)[0]);
    }

    std::span<T> parameter(std::string_view name) { return storage_->real(find(name, tensor_role::parameter)); }
    std::span<T> gradient(std::string_view name) {
        tensor_id p = find(name, tensor_role::parameter);
        for (auto [param, grad] : graph_->gradients)
            if (param == p) return storage_->real(grad);
        throw usage_error("trainer: parameter '" + std::string(name) + "' has no gradient");
    }

    const graph& ir() const { return *graph_; }
    const program& compiled() const { return program_; }
    std::int64_t steps() const { return steps_; }
    void set_steps(std::int64_t s) { steps_ = s; }
    auto& optimizer() { return *optimizer_; }

private:
    template <class Options>
    void make_optimizer(const Options& o) {
        using opt_t = std::conditional_t<std::is_same_v<Options, adamw_options>, adamw<T>, sgd<T>>;
        Options with_lr = o;
        with_lr.lr = options_.schedule.peak;
        optimizer_ = std::make_unique<std::variant<adamw<T>, sgd<T>>>(std::in_place_type<opt_t>, with_lr);
        for (auto [param, grad] : graph_->gradients) {
            const tensor_desc& d = graph_->tensor(param);
            std::visit(
                [&](auto& opt) {
                    opt.add({d.name, storage_->real(param), storage_->real(grad), d.dims.rank() >= 2});
                },
                *optimizer_);
        }
    }

    void set_inputs(const input_feed& feed) {
        for (tensor_id t : graph_->inputs) {
            const tensor_desc& d = graph_->tensor(t);
            if (!storage_->has(t)) continue;  // an input the loss does not depend on
            if (d.kind == value_kind::index) {
                auto it = feed.index.find(d.name);
                if (it == feed.index.end())
                    throw usage_error("trainer: no data fed for input '" + d.name + "'; add it to input_feed::index");
                copy_checked(d, it->second, storage_->index(t));
            } else {
                auto it = feed.real.find(d.name);
                if (it == feed.real.end())
                    throw usage_error("trainer: no data fed for input '" + d.name + "'; add it to input_feed::real");
                auto dst = storage_->real(t);
                if (it->second.size() != dst.size()) throw size_mismatch(d, it->second.size());
                for (std::size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<T>(it->second[i]);
            }
        }
    }
    static usage_error size_mismatch(const tensor_desc& d, std::size_t got) {
        return usage_error("trainer: input '" + d.name + "' has shape " + d.dims.to_string() + " (" +
                           std::to_string(d.dims.numel()) + " elements) but " + std::to_string(got) +
                           " were fed; feed one value per element");
    }
    static void copy_checked(const tensor_desc& d, std::span<const std::int32_t> src, std::span<std::int32_t> dst) {
        if (src.size() != dst.size()) throw size_mismatch(d, src.size());
        std::copy(src.begin(), src.end(), dst.begin());
    }
    tensor_id find(std::string_view name, tensor_role role) const {
        for (tensor_id t : graph_->parameters)
            if (graph_->tensor(t).name == name && graph_->tensor(t).role == role) return t;
        throw usage_error("trainer: no parameter named '" + std::string(name) + "'");
    }

    std::unique_ptr<graph> graph_;
    trainer_options options_;
    program program_;
    std::unique_ptr<host::executor<T>> executor_;
    std::unique_ptr<host::bound_storage<T>> storage_;
    std::unique_ptr<std::variant<adamw<T>, sgd<T>>> optimizer_;
    std::vector<std::span<T>> grads_;
    std::int64_t steps_ = 0;
};

}  // namespace loom::train
// ---- end loom/train/trainer.hpp ----

namespace loom::train {

template <class T>
class distributed_trainer {
public:
    static constexpr precision prec = std::is_same_v<T, float> ? precision::f32 : precision::f64;

    distributed_trainer(const partition::partitioned_graph& plan, comm::communicator& c, trainer_options options)
        : plan_(plan), comm_(c), options_(options) {
        if (c.size() != plan.world)
            throw usage_error("distributed_trainer: the plan is for " + std::to_string(plan.world) +
                              " devices but the communicator has " + std::to_string(c.size()) +
                              " ranks; launch as many ranks as the plan has devices");
        rank_ = c.rank();
        part_ = &plan.devices.at(static_cast<std::size_t>(rank_));
        const graph& g = part_->ir();
        compile_options compile{.prec = prec, .outputs = {part_->loss}, .keep_every_node = true};
        if (!plan.order.empty()) compile.order = plan.order.at(static_cast<std::size_t>(rank_));
        program_ = compile_program(g, compile);
        executor_ = std::make_unique<host::executor<T>>(program_);
        storage_ = std::make_unique<host::bound_storage<T>>(program_);
        storage_->bind_to(*executor_);
        executor_->set_communication([this](const node& n, std::span<void* const> in, std::span<void* const> out) {
            const auto id = n.attrs.get<std::int64_t>("transfer");
            run_transfer<T>(plan_.transfers.at(static_cast<std::size_t>(id)), id, comm_, in.empty() ? nullptr : in[0],
                            out.empty() ? nullptr : out[0], scratch_);
        });
        const graph& logical = plan.ir();
        for (const auto& s : part_->parameters) {
            const tensor_desc& d = logical.tensor(s.logical);
            auto values = storage_->real(s.local);
            partition::for_each_region_row(s.region, partition::box::whole(d.dims), s.region,
                                           [&](std::int64_t global, std::int64_t at, std::int64_t n) {
                                               initialize(values.subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(n)),
                                                          d.init, options_.init_seed, d.name, static_cast<std::uint64_t>(global));
                                           });
        }
        plan_optimizer();
    }

    distributed_trainer(const distributed_trainer&) = delete;
    distributed_trainer& operator=(const distributed_trainer&) = delete;

    step_result step(const input_feed& feed) {
        auto start = std::chrono::steady_clock::now();
        set_inputs(feed);
        executor_->run(static_cast<std::uint64_t>(steps_));
        step_result r;
        r.loss = static_cast<double>(storage_->real(part_->loss)[0]);
        r.grad_norm = global_gradient_norm();
        if (options_.clip_norm > 0 && r.grad_norm > options_.clip_norm) {
            const T factor = static_cast<T>(options_.clip_norm / (r.grad_norm + 1e-6));
            for (const auto& s : part_->gradients)
                for (T& x : storage_->real(s.local)) x *= factor;
        }
        r.lr = options_.schedule.at(steps_);
        std::visit([&](auto& opt) { opt.step(r.lr); }, *optimizer_);
        synchronize_shards();
        ++steps_;
        r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return r;
    }

    // The whole of a parameter, assembled from every rank's pieces. Collective: every rank
    // must call it, in the same order.
    std::vector<T> gather_parameter(std::string_view name) {
        const graph& logical = plan_.ir();
        tensor_id p = no_id;
        for (tensor_id t : logical.parameters)
            if (logical.tensor(t).name == name) p = t;
        if (p == no_id) throw usage_error("distributed_trainer: no parameter named '" + std::string(name) + "'");
        const partition::box whole = partition::box::whole(logical.tensor(p).dims);
        std::vector<T> full(static_cast<std::size_t>(whole.numel()), T(0));
        for (const auto& s : part_->parameters) {
            if (s.logical != p) continue;
            const auto owned = owned_rows(p, s.region, /*gradients=*/false);
            auto values = storage_->real(s.local);
            for (const auto& region : owned)
                partition::copy_region(values.data(), s.region, full.data(), whole, region);
        }
        comm_.all_reduce_sum(full.data(), full.size(), comm::dtype_of<T>(), comm::group::world(plan_.world));
        return full;
    }

    const program& compiled() const { return program_; }
    const graph& ir() const { return part_->ir(); }
    int rank() const { return rank_; }
    std::int64_t steps() const { return steps_; }

private:
    // Parts of `region` (a piece of parameter p, or of its gradient) that this rank counts
    // as its own: the parts no lower rank holds. Pieces are equal or disjoint in every
    // plan loom builds; a partial overlap is cut along the boxes.
    std::vector<partition::box> owned_rows(tensor_id p, const partition::box& region, bool gradients) const {
        std::vector<partition::box> mine{region};
        for (int r = 0; r < rank_; ++r) {
            const auto& other = gradients ? plan_.devices[static_cast<std::size_t>(r)].gradients
                                          : plan_.devices[static_cast<std::size_t>(r)].parameters;
            for (const auto& s : other) {
                if (s.logical != p) continue;
                std::vector<partition::box> next;
                for (const auto& b : mine) subtract(b, s.region, next);
                mine = std::move(next);
            }
        }
        return mine;
    }

    // b minus c, as disjoint boxes appended to out.
    static void subtract(const partition::box& b, const partition::box& c, std::vector<partition::box>& out) {
        const partition::box common = partition::intersect(b, c);
        if (b.rank() == 0) {
            return;  // a scalar held by a lower rank is theirs
        }
        if (common.empty()) {
            out.push_back(b);
            return;
        }
        partition::box rest = b;
        for (std::size_t a = 0; a < b.rank(); ++a) {
            if (rest.ranges[a].begin < common.ranges[a].begin) {
                partition::box below = rest;
                below.ranges[a].end = common.ranges[a].begin;
                out.push_back(below);
            }
            if (common.ranges[a].end < rest.ranges[a].end) {
                partition::box above = rest;
                above.ranges[a].begin = common.ranges[a].end;
                out.push_back(above);
            }
            rest.ranges[a] = common.ranges[a];
        }
    }

    double global_gradient_norm() {
        double sum = 0;
        for (const auto& s : part_->gradients) {
            auto values = storage_->real(s.local);
            for (const auto& region : owned_rows(s.logical, s.region, true))
                partition::for_each_region_row(region, s.region, s.region, [&](std::int64_t at, std::int64_t, std::int64_t n) {
                    for (std::int64_t i = 0; i < n; ++i) {
                        const double x = static_cast<double>(values[static_cast<std::size_t>(at + i)]);
                        sum += x * x;
                    }
                });
        }
        comm_.all_reduce_sum(&sum, 1, comm::dtype::f64, comm::group::world(plan_.world));
        return std::sqrt(sum);
    }

    // The optimizer updates, per gradient piece, the matching part of the parameter piece;
    // under ZeRO-1 only this rank's shard of it (the first dim cut over all ranks).
    void plan_optimizer() {
        const graph& logical = plan_.ir();
        auto make = [&](const auto& o) {
            using opt_t = std::conditional_t<std::is_same_v<std::decay_t<decltype(o)>, adamw_options>, adamw<T>, sgd<T>>;
            auto with_lr = o;
            with_lr.lr = options_.schedule.peak;
            optimizer_ = std::make_unique<std::variant<adamw<T>, sgd<T>>>(std::in_place_type<opt_t>, with_lr);
        };
        std::visit(make, options_.optimizer);
        for (const auto& gp : part_->gradients) {
            const partition::stored_piece* pp = nullptr;
            for (const auto& s : part_->parameters)
                if (s.logical == gp.logical && s.region.contains(gp.region)) pp = &s;
            if (!pp) throw error("distributed_trainer: gradient piece " + gp.region.to_string() + " of '" +
                                 logical.tensor(gp.logical).name + "' has no parameter piece on rank " + std::to_string(rank_));
            partition::box update = gp.region;
            if (plan_.zero == plan::zero_stage::optimizer && stored_whole_everywhere(gp.logical))
                update = zero1_shard(gp.region);
            if (!(update == pp->region)) shards_.push_back({pp, update});
            if (update.numel() == 0) continue;
            auto value = storage_->real(pp->local);
            auto grad = storage_->real(gp.local);
            const auto offset = static_cast<std::size_t>(offset_in(update, pp->region));
            const auto goffset = static_cast<std::size_t>(offset_in(update, gp.region));
            const auto count = static_cast<std::size_t>(update.numel());
            const tensor_desc& d = logical.tensor(gp.logical);
            std::visit(
                [&](auto& opt) {
                    opt.add({d.name + update.to_string(), value.subspan(offset, count), grad.subspan(goffset, count),
                             d.dims.rank() >= 2});
                },
                *optimizer_);
        }
    }

    // ZeRO-1 shards the optimizer over data-parallel replicas: ranks that all store the
    // whole parameter. Other parameters are updated wherever they are stored.
    bool stored_whole_everywhere(tensor_id p) const {
        const partition::box whole = partition::box::whole(plan_.ir().tensor(p).dims);
        for (const auto& device : plan_.devices) {
            bool stored = false;
            for (const auto& s : device.parameters) stored = stored || (s.logical == p && s.region == whole);
            if (!stored) return false;
        }
        return true;
    }

    // Rows of the first dim that rank r updates under ZeRO-1.
    partition::box zero1_shard(const partition::box& region) const {
        partition::box b = region;
        if (b.rank() == 0 || b.ranges[0].size() % plan_.world != 0) return b;
        const std::int64_t rows = b.ranges[0].size() / plan_.world;
        b.ranges[0].begin += rows * rank_;
        b.ranges[0].end = b.ranges[0].begin + rows;
        return b;
    }

    // Offset of the first element of `inner` in a piece with box `outer`, for an `inner`
    // that is whole on every axis but the first (so that it is contiguous there).
    static std::int64_t offset_in(const partition::box& inner, const partition::box& outer) {
        if (inner.rank() == 0) return 0;
        for (std::size_t a = 1; a < inner.rank(); ++a)
            if (!(inner.ranges[a] == outer.ranges[a]))
                throw error("distributed_trainer: the updated part " + inner.to_string() + " of piece " +
                            outer.to_string() + " is not contiguous; shard parameters along their first dim");
        std::int64_t row = 1;
        for (std::size_t a = 1; a < outer.rank(); ++a) row *= outer.ranges[a].size();
        return (inner.ranges[0].begin - outer.ranges[0].begin) * row;
    }

    // ZeRO-1/2: every rank updated its shard; gather the shards into every full copy.
    void synchronize_shards() {
        for (const auto& [piece, shard] : shards_) {
            auto values = storage_->real(piece->local);
            const auto count = static_cast<std::size_t>(shard.numel());
            gathered_.resize(count * static_cast<std::size_t>(plan_.world));
            const auto offset = static_cast<std::size_t>(offset_in(shard, piece->region));
            comm_.all_gather(values.data() + offset, gathered_.data(), count, comm::dtype_of<T>(),
                             comm::group::world(plan_.world));
            std::copy(gathered_.begin(), gathered_.end(), values.begin());
        }
    }

    void set_inputs(const input_feed& feed) {
        const graph& logical = plan_.ir();
        for (const auto& s : part_->inputs) {
            const tensor_desc& d = logical.tensor(s.logical);
            if (!storage_->has(s.local)) continue;
            const partition::box whole = partition::box::whole(d.dims);
            if (d.kind == value_kind::index) {
                auto it = feed.index.find(d.name);
                if (it == feed.index.end())
                    throw usage_error("distributed_trainer: no data fed for input '" + d.name + "'; add it to input_feed::index");
                check_size(d, it->second.size());
                partition::copy_region(it->second.data(), whole, storage_->index(s.local).data(), s.region, s.region);
            } else {
                auto it = feed.real.find(d.name);
                if (it == feed.real.end())
                    throw usage_error("distributed_trainer: no data fed for input '" + d.name + "'; add it to input_feed::real");
                check_size(d, it->second.size());
                auto dst = storage_->real(s.local);
                partition::for_each_region_row(s.region, whole, s.region, [&](std::int64_t from, std::int64_t to, std::int64_t n) {
                    for (std::int64_t i = 0; i < n; ++i)
                        dst[static_cast<std::size_t>(to + i)] = static_cast<T>(it->second[static_cast<std::size_t>(from + i)]);
                });
            }
        }
    }
    static void check_size(const tensor_desc& d, std::size_t got) {
        if (static_cast<std::int64_t>(got) != d.dims.numel())
            throw usage_error("distributed_trainer: input '" + d.name + "' has shape " + d.dims.to_string() + " (" +
                              std::to_string(d.dims.numel()) + " elements) but " + std::to_string(got) +
                              " were fed; feed the whole batch to every rank");
    }

    const partition::partitioned_graph& plan_;
    comm::communicator& comm_;
    trainer_options options_;
    int rank_ = 0;
    const partition::device_part* part_ = nullptr;
    program program_;
    std::unique_ptr<host::executor<T>> executor_;
    std::unique_ptr<host::bound_storage<T>> storage_;
    std::unique_ptr<std::variant<adamw<T>, sgd<T>>> optimizer_;
    transfer_scratch<T> scratch_;
    std::vector<std::pair<const partition::stored_piece*, partition::box>> shards_;
    std::vector<T> gathered_;
    std::int64_t steps_ = 0;
};

}  // namespace loom::train
// ---- end loom/train/distributed_trainer.hpp ----
// ---- begin loom/train/tokenizer.hpp ----
// byte_tokenizer: one token per byte, so any text round-trips and the vocabulary is
// fixed at 256 without a trained merge table.
//   encode("Hi") -> {72, 105};  decode({72, 105}) -> "Hi";  decode(encode(s)) == s
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>


namespace loom::train {

class byte_tokenizer {
public:
    static constexpr std::int32_t vocab_size() noexcept { return 256; }

    // Bytes are read as unsigned, so UTF-8 continuation bytes map to 128..255.
    std::vector<std::int32_t> encode(std::string_view text) const {
        std::vector<std::int32_t> ids;
        ids.reserve(text.size());
        for (char c : text) ids.push_back(static_cast<std::int32_t>(static_cast<unsigned char>(c)));
        return ids;
    }

    // Throws loom::usage_error on an id outside [0, 256): such an id comes from a model or
    // token file with a larger vocabulary, not from this tokenizer.
    std::string decode(std::span<const std::int32_t> ids) const {
        std::string text;
        text.reserve(ids.size());
        for (std::size_t i = 0; i < ids.size(); ++i) {
            const std::int32_t id = ids[i];
            if (id < 0 || id >= vocab_size()) {
                throw usage_error("byte_tokenizer::decode: id " + std::to_string(id) + " at position " +
                                  std::to_string(i) + " is outside the byte vocabulary [0, 256); decode only ids "
                                  "produced by byte_tokenizer::encode or a model whose vocab_size is 256");
            }
            text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
        }
        return text;
    }
};

}  // namespace loom::train
// ---- end loom/train/tokenizer.hpp ----

// models
// ---- begin loom/models/evoformer.hpp ----
// A small Evoformer (AlphaFold 2's trunk) with recycling, built with the public op API only.
//
//   m = msa_embedding[msa]                                       [batch, s, r, cm]
//   z = left[msa row 0]_i + right[msa row 0]_j + relpos[j - i]   [batch, r, r, cz]
//   round 0 .. recycles-1, every round through the SAME blocks:
//     m = m + LN(stop_gradient(previous m));  z = z + LN(stop_gradient(previous z))
//     blocks.i (pre-norm residual branches, each x = x + f(LN(x))):
//       msa_row         attention along residues, for every MSA sequence
//       msa_pair_avg    pair-weighted averaging of the MSA along residues (AlphaFold 3):
//                       the pair's only way into the MSA, as the attention op takes no bias
//       msa_col         attention along sequences, for every residue
//       msa_transition  MLP (relu)
//       outer_product   the pair += a low-rank outer-product mean of the MSA
//       pair_row        attention along j, for every i
//       pair_col        attention along i, for every j
//       pair_transition MLP (relu)
//   logits = linear(LN(z of the last round)) over `bins` distance classes
//   loss = mean cross-entropy(logits, distogram targets [batch, r, r])
//
// Round 0 recycles zeros (or the inputs "prev_msa" and "prev_pair", see recycle_inputs).
// Rounds 0 .. recycles-2 carry no gradient: AlphaFold's stop-gradient, so only the last
// round is differentiated, and the forward of the earlier rounds runs without keeping
// anything for a backward pass (nnScaler's 3F1B pipelines these forward-only rounds).
//
// Left out of AlphaFold: triangle multiplications and triangle-attention biases, gating,
// the MSA row attention's pair bias (replaced by pair-weighted averaging), the recycled
// distances and the distogram's symmetrisation. The whole MSA is recycled rather than its
// first row: the MSA is not resampled between rounds here.
//
// Scopes, for plans that select "round r, layers a..b":
//   parameters "embed.*", "recycled_msa_norm.*", "recycled_pair_norm.*", "blocks.<i>.*",
//   "distogram.*", created once and shared by every round; nodes "embed/...",
//   "recycle.<r>.input/...", "recycle.<r>.blocks.<i>.<branch>[.head.<h>]/...",
//   "distogram/...". Rounds are the repeat "recycle" and each round's blocks a repeat
//   "blocks", so on_scope<"recycle.2.*"> with on_layers<"blocks", 0, 1> selects layers
//   0..1 of round 2. Every round builds the same structure (the searcher's contract).
//
// What a plan can split: Batch, in every forward op. Every tensor keeps it as its leading
// dim and no reshape (which no plan can split) is used; the tests train data-parallel
// against one device. Heads are separate nodes, one per head, so tensor parallelism by
// heads places nodes rather than splitting one. The inner axes keep their names (Msa,
// Residue, ResidueJ) in the row-wise ops only: merge_heads and split_heads, which swap
// axes and fold sequences into channels here, name their axes Hidden, Head and HeadDim.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>


namespace loom::models {

// The dims the Evoformer adds to loom's own.
namespace EvoDim {
using Msa = named_dim<"Msa">;            // MSA sequences (s)
using Residue = named_dim<"Residue">;    // residues (r); the pair's first axis (i)
using ResidueJ = named_dim<"ResidueJ">;  // the pair's second axis (j)
using RelPos = named_dim<"RelPos">;      // clipped relative positions j - i
using Bins = named_dim<"Bins">;          // distogram classes
}  // namespace EvoDim

struct evoformer_config {
    std::int64_t batch = 2;
    std::int64_t msa_seqs = 8;           // s
    std::int64_t residues = 16;          // r
    std::int64_t msa_channels = 32;      // cm
    std::int64_t pair_channels = 16;     // cz
    std::int64_t heads = 4;              // of every attention; divides cm and cz
    std::int64_t blocks = 2;             // Evoformer blocks, shared by every round
    std::int64_t recycles = 3;           // forward rounds; the last one is differentiated
    std::int64_t bins = 16;              // distogram classes
    std::int64_t vocab = 23;             // MSA tokens (AlphaFold: 20 amino acids, unknown, gap, mask)
    std::int64_t relpos_clip = 8;        // relative positions j - i clipped to [-clip, clip]
    std::int64_t outer_groups = 4;       // rank of the outer-product mean: one pair feature per group
    std::int64_t outer_channels = 8;     // MSA channels each group projects to
    std::int64_t transition_factor = 4;  // MLP hidden = factor * channels
    double init_std = 0.02;
    double layer_norm_eps = 1e-5;
    // false: round 0 recycles zeros (AlphaFold). true: the real inputs "prev_msa" [batch, s,
    // r, cm] and "prev_pair" [batch, r, r, cz] are recycled into round 0, so that rounds
    // can run as separate graphs (and tests can feed recycled values as constants).
    bool recycle_inputs = false;

    std::int64_t msa_head_dim() const { return msa_channels / heads; }
    std::int64_t pair_head_dim() const { return pair_channels / heads; }
    std::int64_t relpos_ids() const { return 2 * relpos_clip + 1; }

    void validate() const {
        auto positive = [](std::int64_t v, const char* what) {
            if (v <= 0)
                throw usage_error(std::string("evoformer_config: ") + what + " is " + std::to_string(v) +
                                  "; it must be positive");
        };
        positive(batch, "batch");
        positive(msa_seqs, "msa_seqs");
        positive(residues, "residues");
        positive(msa_channels, "msa_channels");
        positive(pair_channels, "pair_channels");
        positive(heads, "heads");
        positive(blocks, "blocks");
        positive(recycles, "recycles");
        positive(outer_groups, "outer_groups");
        positive(outer_channels, "outer_channels");
        positive(transition_factor, "transition_factor");
        auto divisible = [&](std::int64_t channels, const char* what) {
            if (channels % heads != 0)
                throw usage_error(std::string("evoformer_config: ") + what + " " + std::to_string(channels) +
                                  " is not divisible by heads " + std::to_string(heads) +
                                  "; choose heads that divide both msa_channels and pair_channels");
        };
        divisible(msa_channels, "msa_channels");
        divisible(pair_channels, "pair_channels");
        if (bins < 2)
            throw usage_error("evoformer_config: bins is " + std::to_string(bins) +
                              "; a distogram needs at least 2 classes");
        if (vocab < 2)
            throw usage_error("evoformer_config: vocab is " + std::to_string(vocab) +
                              "; it needs at least one residue kind and the gap token");
        if (relpos_clip < 0)
            throw usage_error("evoformer_config: relpos_clip is " + std::to_string(relpos_clip) +
                              "; it must be 0 or more");
        if (!(init_std >= 0))
            throw usage_error("evoformer_config: init_std is " + std::to_string(init_std) + "; it must be 0 or more");
        if (!(layer_norm_eps >= 0))
            throw usage_error("evoformer_config: layer_norm_eps is " + std::to_string(layer_norm_eps) +
                              "; it must be 0 or more");
    }

    // Weights and biases, counted from the architecture (tests compare with the graph).
    std::int64_t parameter_count() const {
        const std::int64_t cm = msa_channels, cz = pair_channels, f = transition_factor;
        auto norm = [](std::int64_t c) { return 2 * c; };
        // q, k, v and the output projection of every head (no biases but the output's).
        auto attention = [&](std::int64_t c) { return norm(c) + 4 * c * c + c; };
        auto transition = [&](std::int64_t c) { return norm(c) + (f * c * c + f * c) + (c * f * c + c); };
        const std::int64_t pair_avg = norm(cm) + norm(cz) + heads * cz + 2 * cm * cm + cm;
        const std::int64_t outer =
            norm(cm) + outer_groups * 2 * (outer_channels * cm + outer_channels) + outer_groups * cz + cz;
        const std::int64_t per_block = attention(cm) + pair_avg + attention(cm) + transition(cm) + outer +
                                       attention(cz) + attention(cz) + transition(cz);
        const std::int64_t embed = vocab * cm + 2 * vocab * cz + relpos_ids() * cz;
        return embed + norm(cm) + norm(cz) + blocks * per_block + norm(cz) + bins * cz + bins;
    }
};

// A built Evoformer: the graph builder and the ids of the tensors a trainer feeds and reads.
struct evoformer_model {
    std::unique_ptr<graph_builder> builder;
    evoformer_config config;
    // Index inputs: "msa" [batch, s, r] tokens; "pair_left" / "pair_right" [batch, r, r] the
    // token of residue i / j of MSA row 0; "relpos" [batch, r, r] clip(j - i) + clip;
    // "targets" [batch, r, r] distogram classes. See evoformer_pair_ids.
    tensor_id msa = no_id, pair_left = no_id, pair_right = no_id, relpos = no_id, targets = no_id;
    tensor_id prev_msa = no_id, prev_pair = no_id;  // real inputs, with recycle_inputs only
    std::vector<tensor_id> round_msa, round_pair;   // each round's outputs, [round]
    tensor_id logits = no_id, loss = no_id;

    const graph& ir() const { return builder->view(); }

    // Appends the backward pass and hands the finished graph over.
    graph training_graph() && {
        build_backward(*builder);
        return std::move(*builder).take();
    }
};

namespace detail::evo {

// [b, x, y, c] -> [b, y, x, c] with shape ops that keep b leading and splittable: loom has
// no permutation op, and a reshape could not be split. Ten copies, each a law of its op:
//   transpose "... a b -> ... b a", merge_heads "b h s d -> b s (h d)",
//   split_heads "b s (h d) -> b h s d" (a head count of 1 or of the whole group is allowed).
inline tensor swap_middle_axes(tensor t) {
    const std::int64_t x = t.extent(1), y = t.extent(2);
    t = ops::transpose(t);           // b x c y
    t = ops::merge_heads(t);         // b c (x y)
    t = ops::split_heads(t, x * y);  // b (x y) c 1
    t = ops::transpose(t);           // b (x y) 1 c
    t = ops::merge_heads(t);         // b 1 (x y c)
    t = ops::split_heads(t, x);      // b x 1 (y c)
    t = ops::transpose(t);           // b x (y c) 1
    t = ops::merge_heads(t);         // b (y c) x
    t = ops::transpose(t);           // b x (y c)
    return ops::split_heads(t, y);   // b y x c
}

struct norm {
    tensor gamma, beta;
};

struct dense {
    tensor weight;
    std::optional<tensor> bias;
};

// Per-head projections: heads are separate nodes (see the header comment).
struct attention_params {
    norm ln;
    std::vector<tensor> q, k, v, out;  // q, k, v [head_dim, c]; out [c, head_dim]
    tensor out_bias;
};

struct pair_average_params {
    norm ln_msa, ln_pair;
    std::vector<tensor> weights, v, out;  // weights [1, cz]; v [head_dim, cm]; out [cm, head_dim]
    tensor out_bias;
};

struct outer_params {
    norm ln;
    std::vector<dense> a, b;  // [outer_channels, cm]
    std::vector<tensor> out;  // [cz, 1]
    tensor out_bias;
};

struct transition_params {
    norm ln;
    dense fc, proj;
};

struct block_params {
    attention_params msa_row;
    pair_average_params msa_pair_avg;
    attention_params msa_col;
    transition_params msa_transition;
    outer_params outer_product;
    attention_params pair_row, pair_col;
    transition_params pair_transition;
};

struct parameter_maker {
    graph_builder& b;
    const evoformer_config& c;
    double proj_std;  // output projections, scaled down by the number of residual branches

    norm make_norm(const std::string& scope, dim_id d, std::int64_t n) const {
        auto s = b.scope(scope);
        return {b.parameter("weight", {{d, n}}, parameter_init::ones()),
                b.parameter("bias", {{d, n}}, parameter_init::zeros())};
    }
    tensor weight(const std::string& scope, dim_id out_dim, std::int64_t out, dim_id in_dim, std::int64_t in,
                  double std) const {
        auto s = b.scope(scope);
        return b.parameter("weight", {{out_dim, out}, {in_dim, in}}, parameter_init::normal(std));
    }
    dense make_dense(const std::string& scope, dim_id out_dim, std::int64_t out, dim_id in_dim, std::int64_t in,
                     double std) const {
        auto s = b.scope(scope);
        return {b.parameter("weight", {{out_dim, out}, {in_dim, in}}, parameter_init::normal(std)),
                b.parameter("bias", {{out_dim, out}}, parameter_init::zeros())};
    }
    tensor bias(const std::string& name, dim_id d, std::int64_t n) const {
        return b.parameter(name, {{d, n}}, parameter_init::zeros());
    }

    attention_params make_attention(const std::string& scope, dim_id cd, std::int64_t ch) const {
        auto s = b.scope(scope);
        const dim_id hd = Dim::HeadDim::id;
        const std::int64_t d = ch / c.heads;
        attention_params p;
        p.ln = make_norm("norm", cd, ch);
        for (std::int64_t h = 0; h < c.heads; ++h) {
            auto head = b.scope("head", h);
            p.q.push_back(weight("q", hd, d, cd, ch, c.init_std));
            p.k.push_back(weight("k", hd, d, cd, ch, c.init_std));
            p.v.push_back(weight("v", hd, d, cd, ch, c.init_std));
            p.out.push_back(weight("out", cd, ch, hd, d, proj_std));
        }
        p.out_bias = bias("out_bias", cd, ch);
        return p;
    }

    pair_average_params make_pair_average(const std::string& scope) const {
        auto s = b.scope(scope);
        const dim_id cm = Dim::Hidden::id, cz = Dim::Channel::id, hd = Dim::HeadDim::id;
        const std::int64_t d = c.msa_head_dim();
        pair_average_params p;
        p.ln_msa = make_norm("msa_norm", cm, c.msa_channels);
        p.ln_pair = make_norm("pair_norm", cz, c.pair_channels);
        for (std::int64_t h = 0; h < c.heads; ++h) {
            auto head = b.scope("head", h);
            p.weights.push_back(weight("weights", Dim::Head::id, 1, cz, c.pair_channels, c.init_std));
            p.v.push_back(weight("v", hd, d, cm, c.msa_channels, c.init_std));
            p.out.push_back(weight("out", cm, c.msa_channels, hd, d, proj_std));
        }
        p.out_bias = bias("out_bias", cm, c.msa_channels);
        return p;
    }

    outer_params make_outer(const std::string& scope) const {
        auto s = b.scope(scope);
        const dim_id cm = Dim::Hidden::id, cz = Dim::Channel::id, hd = Dim::HeadDim::id;
        outer_params p;
        p.ln = make_norm("norm", cm, c.msa_channels);
        for (std::int64_t g = 0; g < c.outer_groups; ++g) {
            auto group = b.scope("group", g);
            p.a.push_back(make_dense("a", hd, c.outer_channels, cm, c.msa_channels, c.init_std));
            p.b.push_back(make_dense("b", hd, c.outer_channels, cm, c.msa_channels, c.init_std));
            p.out.push_back(weight("out", cz, c.pair_channels, hd, 1, proj_std));
        }
        p.out_bias = bias("out_bias", cz, c.pair_channels);
        return p;
    }

    transition_params make_transition(const std::string& scope, dim_id cd, std::int64_t ch) const {
        auto s = b.scope(scope);
        const std::int64_t f = c.transition_factor * ch;
        return {make_norm("norm", cd, ch), make_dense("fc", Dim::FFN::id, f, cd, ch, c.init_std),
                make_dense("proj", cd, ch, Dim::FFN::id, f, proj_std)};
    }

    block_params make_block() const {
        const dim_id cm = Dim::Hidden::id, cz = Dim::Channel::id;
        block_params p;
        p.msa_row = make_attention("msa_row", cm, c.msa_channels);
        p.msa_pair_avg = make_pair_average("msa_pair_avg");
        p.msa_col = make_attention("msa_col", cm, c.msa_channels);
        p.msa_transition = make_transition("msa_transition", cm, c.msa_channels);
        p.outer_product = make_outer("outer_product");
        p.pair_row = make_attention("pair_row", cz, c.pair_channels);
        p.pair_col = make_attention("pair_col", cz, c.pair_channels);
        p.pair_transition = make_transition("pair_transition", cz, c.pair_channels);
        return p;
    }
};

inline tensor layer_norm(tensor x, const norm& n, const evoformer_config& c) {
    return ops::layer_norm(x, n.gamma, n.beta, c.layer_norm_eps);
}

inline tensor linear(tensor x, const dense& d) {
    return d.bias ? ops::linear(x, d.weight, *d.bias) : ops::linear(x, d.weight);
}

// Multi-head attention of x [b, a, n, c] along n, for every (b, a): q, k, v [b, a, n, d]
// bind attention's "b h s d" with a in the place of heads. The heads' outputs are projected
// separately and summed, which is the usual concatenation followed by one projection.
inline tensor axial_attention(graph_builder& b, tensor x, const attention_params& p) {
    std::optional<tensor> sum;
    for (std::size_t h = 0; h < p.q.size(); ++h) {
        auto head = b.scope("head", static_cast<std::int64_t>(h));
        tensor o = ops::attention(ops::linear(x, p.q[h]), ops::linear(x, p.k[h]), ops::linear(x, p.v[h]));
        tensor projected = h == 0 ? ops::linear(o, p.out[h], p.out_bias) : ops::linear(o, p.out[h]);
        sum = sum ? *sum + projected : projected;
    }
    return *sum;
}

// x + attention along axis 2 of x [b, ., ., c] (rows), or along axis 1 (columns: the two
// middle axes swapped there and back).
inline tensor attention_branch(graph_builder& b, const std::string& scope, tensor x, const attention_params& p,
                               bool along_columns, const evoformer_config& c) {
    auto s = b.scope(scope);
    tensor h = layer_norm(x, p.ln, c);
    if (!along_columns) return x + axial_attention(b, h, p);
    return x + swap_middle_axes(axial_attention(b, swap_middle_axes(h), p));
}

// Pair-weighted averaging (AlphaFold 3's MSA module), per head h:
//   w[b, i, j] = softmax_j(LN(z)[b, i, j, :] . weights_h),  out[b, s, i] = sum_j w[b, i, j] v_h[b, s, j]
// as one matmul over the MSA with sequences folded into the columns:
//   merge_heads(v) [b, j, (s d)],  w @ it = [b, i, (s d)],  split_heads(., s) = [b, s, i, d].
inline tensor pair_average_branch(graph_builder& b, tensor m, tensor z, const pair_average_params& p,
                                  const evoformer_config& c) {
    auto s = b.scope("msa_pair_avg");
    tensor hm = layer_norm(m, p.ln_msa, c), hz = layer_norm(z, p.ln_pair, c);
    std::optional<tensor> sum;
    for (std::size_t h = 0; h < p.v.size(); ++h) {
        auto head = b.scope("head", static_cast<std::int64_t>(h));
        // [b, i, j, 1] -> merge_heads [b, j, i] -> transpose [b, i, j]
        tensor w = ops::softmax(ops::transpose(ops::merge_heads(ops::linear(hz, p.weights[h]))));
        tensor v = ops::merge_heads(ops::linear(hm, p.v[h]));
        tensor o = ops::split_heads(ops::matmul(w, v), c.msa_seqs);
        tensor projected = h == 0 ? ops::linear(o, p.out[h], p.out_bias) : ops::linear(o, p.out[h]);
        sum = sum ? *sum + projected : projected;
    }
    return m + *sum;
}

// A rank-`outer_groups` outer-product mean: group g contributes the pair feature
//   o_g[b, i, j] = 1/s sum_{s, k} a_g[b, s, i, k] b_g[b, s, j, k]
// projected to cz. (AlphaFold's projects all c^2 products of vec(a (x) b); this keeps one
// contraction per group.) With sequences folded into the channels, o_g is one matmul:
//   matmul_nt(merge_heads(b_g) [b, j, (s k)], merge_heads(a_g) [b, i, (s k)]) = [b, j, i],
// and split_heads(., r) turns [b, j, (i 1)] into [b, i, j, 1].
inline tensor outer_product_branch(graph_builder& b, tensor m, tensor z, const outer_params& p,
                                   const evoformer_config& c) {
    auto s = b.scope("outer_product");
    tensor h = layer_norm(m, p.ln, c);
    std::optional<tensor> sum;
    for (std::size_t g = 0; g < p.a.size(); ++g) {
        auto group = b.scope("group", static_cast<std::int64_t>(g));
        tensor a = ops::merge_heads(linear(h, p.a[g])), bb = ops::merge_heads(linear(h, p.b[g]));
        tensor o =
            ops::split_heads(ops::scale(ops::matmul_nt(bb, a), 1.0 / static_cast<double>(c.msa_seqs)), c.residues);
        tensor projected = g == 0 ? ops::linear(o, p.out[g], p.out_bias) : ops::linear(o, p.out[g]);
        sum = sum ? *sum + projected : projected;
    }
    return z + *sum;
}

inline tensor transition_branch(graph_builder& b, const std::string& scope, tensor x, const transition_params& p,
                                const evoformer_config& c) {
    auto s = b.scope(scope);
    return x + linear(ops::relu(linear(layer_norm(x, p.ln, c), p.fc)), p.proj);
}

inline void evoformer_block(graph_builder& b, tensor& m, tensor& z, const block_params& p, const evoformer_config& c) {
    m = attention_branch(b, "msa_row", m, p.msa_row, false, c);
    m = pair_average_branch(b, m, z, p.msa_pair_avg, c);
    m = attention_branch(b, "msa_col", m, p.msa_col, true, c);
    m = transition_branch(b, "msa_transition", m, p.msa_transition, c);
    z = outer_product_branch(b, m, z, p.outer_product, c);
    z = attention_branch(b, "pair_row", z, p.pair_row, false, c);
    z = attention_branch(b, "pair_col", z, p.pair_col, true, c);
    z = transition_branch(b, "pair_transition", z, p.pair_transition, c);
}

}  // namespace detail::evo

inline evoformer_model evoformer(const evoformer_config& c) {
    c.validate();
    evoformer_model model;
    model.config = c;
    model.builder = std::make_unique<graph_builder>();
    graph_builder& b = *model.builder;
    const dim_id B = Dim::Batch::id, S = EvoDim::Msa::id, R = EvoDim::Residue::id, RJ = EvoDim::ResidueJ::id;
    const dim_id CM = Dim::Hidden::id, CZ = Dim::Channel::id;
    // Output projections N(0, init_std / sqrt(branches)): eight residual branches per block.
    const double proj_std = c.init_std / std::sqrt(8.0 * static_cast<double>(c.blocks));

    const shape pair_ids{{B, c.batch}, {R, c.residues}, {RJ, c.residues}};
    tensor msa = b.input("msa", {{B, c.batch}, {S, c.msa_seqs}, {R, c.residues}}, value_kind::index);
    tensor left = b.input("pair_left", pair_ids, value_kind::index);
    tensor right = b.input("pair_right", pair_ids, value_kind::index);
    tensor relpos = b.input("relpos", pair_ids, value_kind::index);
    tensor targets = b.input("targets", pair_ids, value_kind::index);
    std::optional<tensor> prev_m, prev_z;
    if (c.recycle_inputs) {
        prev_m = b.input("prev_msa", {{B, c.batch}, {S, c.msa_seqs}, {R, c.residues}, {CM, c.msa_channels}});
        prev_z = b.input("prev_pair", {{B, c.batch}, {R, c.residues}, {RJ, c.residues}, {CZ, c.pair_channels}});
    }

    // Parameters, created once: every round's nodes use these.
    detail::evo::parameter_maker make{b, c, proj_std};
    tensor msa_table, left_table, right_table, relpos_table;
    {
        auto s = b.scope("embed");
        msa_table =
            b.parameter("msa", {{Dim::Vocab::id, c.vocab}, {CM, c.msa_channels}}, parameter_init::normal(c.init_std));
        left_table = b.parameter("pair_left", {{Dim::Vocab::id, c.vocab}, {CZ, c.pair_channels}},
                                 parameter_init::normal(c.init_std));
        right_table = b.parameter("pair_right", {{Dim::Vocab::id, c.vocab}, {CZ, c.pair_channels}},
                                  parameter_init::normal(c.init_std));
        relpos_table = b.parameter("relpos", {{EvoDim::RelPos::id, c.relpos_ids()}, {CZ, c.pair_channels}},
                                   parameter_init::normal(c.init_std));
    }
    const detail::evo::norm recycled_msa_norm = make.make_norm("recycled_msa_norm", CM, c.msa_channels);
    const detail::evo::norm recycled_pair_norm = make.make_norm("recycled_pair_norm", CZ, c.pair_channels);
    std::vector<detail::evo::block_params> blocks;
    for (std::int64_t i = 0; i < c.blocks; ++i) {
        auto s = b.scope("blocks", i);
        blocks.push_back(make.make_block());
    }
    detail::evo::norm head_norm;
    detail::evo::dense head;
    {
        auto s = b.scope("distogram");
        head_norm = make.make_norm("norm", CZ, c.pair_channels);
        head = make.make_dense("logits", EvoDim::Bins::id, c.bins, CZ, c.pair_channels, c.init_std);
    }

    tensor m0, z0;
    {
        auto s = b.scope("embed");
        m0 = ops::embedding(msa, msa_table);
        z0 = ops::embedding(left, left_table) + ops::embedding(right, right_table) +
             ops::embedding(relpos, relpos_table);
        if (!prev_m) {
            prev_m = ops::fill_like(m0, 0.0);
            prev_z = ops::fill_like(z0, 0.0);
        }
    }

    tensor m = *prev_m, z = *prev_z;
    b.repeat("recycle", c.recycles, [&](std::int64_t) {
        {
            auto s = b.scope("input");
            m = m0 + detail::evo::layer_norm(ops::stop_gradient(m), recycled_msa_norm, c);
            z = z0 + detail::evo::layer_norm(ops::stop_gradient(z), recycled_pair_norm, c);
        }
        b.repeat("blocks", c.blocks, [&](std::int64_t i) {
            detail::evo::evoformer_block(b, m, z, blocks[static_cast<std::size_t>(i)], c);
        });
        model.round_msa.push_back(m.id);
        model.round_pair.push_back(z.id);
    });

    tensor logits, loss;
    {
        auto s = b.scope("distogram");
        logits = detail::evo::linear(detail::evo::layer_norm(z, head_norm, c), head);
        loss = ops::cross_entropy(logits, targets);
    }
    b.set_loss(loss);

    model.msa = msa.id;
    model.pair_left = left.id;
    model.pair_right = right.id;
    model.relpos = relpos.id;
    model.targets = targets.id;
    if (c.recycle_inputs) {
        model.prev_msa = prev_m->id;
        model.prev_pair = prev_z->id;
    }
    model.logits = logits.id;
    model.loss = loss.id;
    return model;
}

// The pair inputs of one batch from its MSA tokens [batch, s, r] (row-major): the tokens of
// residues i and j of row 0 (the target sequence) and clip(j - i) + clip, each [batch, r, r].
struct evoformer_pair_inputs {
    std::vector<std::int32_t> left, right, relpos;
};

inline evoformer_pair_inputs evoformer_pair_ids(const evoformer_config& c, std::span<const std::int32_t> msa) {
    const auto need = static_cast<std::size_t>(c.batch * c.msa_seqs * c.residues);
    if (msa.size() != need)
        throw usage_error("evoformer_pair_ids: the MSA has " + std::to_string(msa.size()) +
                          " tokens but batch x msa_seqs x residues is " + std::to_string(need) +
                          "; pass one token per position");
    const std::int64_t r = c.residues;
    evoformer_pair_inputs out;
    for (std::int64_t b = 0; b < c.batch; ++b) {
        const std::int32_t* row0 = msa.data() + b * c.msa_seqs * r;
        for (std::int64_t i = 0; i < r; ++i)
            for (std::int64_t j = 0; j < r; ++j) {
                out.left.push_back(row0[i]);
                out.right.push_back(row0[j]);
                const std::int64_t d = std::clamp<std::int64_t>(j - i, -c.relpos_clip, c.relpos_clip);
                out.relpos.push_back(static_cast<std::int32_t>(d + c.relpos_clip));
            }
    }
    return out;
}

// A deterministic synthetic batch from `seed`, for tests and demos (no downloads). Each
// item is a chain of residues 3.8 apart in random directions; its distogram classes split
// distances [2, 22) into bins - 2 equal classes plus one below and one above. MSA row 0 is
// a random sequence; the other rows mutate each residue with probability 1/4 (a gap, the
// last token, with probability 1/20).
struct evoformer_batch {
    std::vector<std::int32_t> msa, pair_left, pair_right, relpos, targets;
};

inline evoformer_batch evoformer_synthetic_batch(const evoformer_config& c, std::uint64_t seed) {
    c.validate();
    std::uint64_t counter = 0;
    auto uniform = [&] {
        return static_cast<double>(splitmix64(seed * 0x9e3779b97f4a7c15ull + counter++) >> 11) * 0x1.0p-53;
    };
    auto below = [&](std::int64_t n) { return static_cast<std::int32_t>(std::min<double>(uniform() * n, n - 1)); };
    const std::int64_t r = c.residues, s = c.msa_seqs;
    const std::int32_t gap = static_cast<std::int32_t>(c.vocab - 1);
    const std::int64_t kinds = std::max<std::int64_t>(1, std::min<std::int64_t>(20, c.vocab - 1));
    evoformer_batch out;
    for (std::int64_t b = 0; b < c.batch; ++b) {
        std::vector<std::int32_t> target(static_cast<std::size_t>(r));
        for (auto& t : target) t = below(kinds);
        for (std::int64_t q = 0; q < s; ++q)
            for (std::int64_t i = 0; i < r; ++i) {
                std::int32_t t = target[static_cast<std::size_t>(i)];
                if (q > 0 && uniform() < 0.25) t = uniform() < 0.2 ? gap : below(kinds);
                out.msa.push_back(t);
            }
        std::vector<double> x(static_cast<std::size_t>(3 * r), 0.0);
        for (std::int64_t i = 1; i < r; ++i) {
            const double cos_theta = 2 * uniform() - 1, phi = 6.283185307179586 * uniform();
            const double sin_theta = std::sqrt(1 - cos_theta * cos_theta);
            const double step[3] = {sin_theta * std::cos(phi), sin_theta * std::sin(phi), cos_theta};
            for (int k = 0; k < 3; ++k)
                x[static_cast<std::size_t>(3 * i + k)] = x[static_cast<std::size_t>(3 * (i - 1) + k)] + 3.8 * step[k];
        }
        const double lo = 2.0, hi = 22.0,
                     width = (hi - lo) / static_cast<double>(std::max<std::int64_t>(1, c.bins - 2));
        for (std::int64_t i = 0; i < r; ++i)
            for (std::int64_t j = 0; j < r; ++j) {
                double d2 = 0;
                for (int k = 0; k < 3; ++k) {
                    const double e = x[static_cast<std::size_t>(3 * i + k)] - x[static_cast<std::size_t>(3 * j + k)];
                    d2 += e * e;
                }
                const double d = std::sqrt(d2);
                std::int64_t bin = d < lo ? 0 : 1 + static_cast<std::int64_t>((d - lo) / width);
                out.targets.push_back(static_cast<std::int32_t>(std::min<std::int64_t>(bin, c.bins - 1)));
            }
    }
    auto pair = evoformer_pair_ids(c, out.msa);
    out.pair_left = std::move(pair.left);
    out.pair_right = std::move(pair.right);
    out.relpos = std::move(pair.relpos);
    return out;
}

}  // namespace loom::models
// ---- end loom/models/evoformer.hpp ----
// ---- begin loom/models/gpt.hpp ----
// GPT-2 style decoder-only transformer, built with the public op API only.
//
//   x = wte[tokens] + wpe[positions]
//   blocks.i:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))       (pre-norm)
//   attn:      causal multi-head self-attention with q, k, v and output projections
//   mlp:       proj(gelu(fc(x))), fc: hidden -> ffn (4 * hidden by default)
//   logits = ln_f(x) wte^T   (tied embeddings; or a separate lm_head)
//   loss = mean cross-entropy(logits, targets)
//
// Initialisation follows GPT-2: N(0, 0.02) weights, output projections scaled by
// 1/sqrt(2 * layers), zero biases, unit norm gains.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>


namespace loom::models {

struct gpt_config {
    std::int64_t layers = 4;
    std::int64_t hidden = 128;
    std::int64_t heads = 4;
    std::int64_t vocab = 256;
    std::int64_t seq = 64;
    std::int64_t batch = 8;
    std::int64_t ffn = 0;  // 0: 4 * hidden
    double dropout = 0.0;
    bool tie_embeddings = true;
    double init_std = 0.02;
    double layer_norm_eps = 1e-5;
    std::uint64_t dropout_seed = 1;

    std::int64_t ffn_size() const { return ffn > 0 ? ffn : 4 * hidden; }

    void validate() const {
        auto positive = [](std::int64_t v, const char* what) {
            if (v <= 0) throw usage_error(std::string("gpt_config: ") + what + " is " + std::to_string(v) + "; it must be positive");
        };
        positive(layers, "layers");
        positive(hidden, "hidden");
        positive(heads, "heads");
        positive(vocab, "vocab");
        positive(seq, "seq");
        positive(batch, "batch");
        if (hidden % heads != 0)
            throw usage_error("gpt_config: hidden " + std::to_string(hidden) + " is not divisible by heads " +
                              std::to_string(heads) + "; choose heads that divide hidden");
        if (dropout < 0 || dropout >= 1)
            throw usage_error("gpt_config: dropout " + std::to_string(dropout) + " must lie in [0, 1)");
    }

    // Weights and biases, counted from the architecture (tests compare with the graph).
    std::int64_t parameter_count() const {
        const std::int64_t h = hidden, f = ffn_size();
        std::int64_t per_block = 2 * 2 * h            // two layer norms
                                 + 4 * (h * h + h)    // q, k, v, proj
                                 + (f * h + f) + (h * f + h);
        return vocab * h + seq * h + layers * per_block + 2 * h + (tie_embeddings ? 0 : vocab * h);
    }

    // Floating-point operations of one forward pass over one batch (GEMMs and attention).
    double forward_flops() const {
        const double tokens = static_cast<double>(batch * seq), h = static_cast<double>(hidden),
                     f = static_cast<double>(ffn_size()), s = static_cast<double>(seq);
        const double per_layer = 2 * tokens * (4 * h * h + 2 * h * f) + 2 * tokens * s * h;  // causal: half of 4*T*S*H
        return static_cast<double>(layers) * per_layer + 2 * tokens * h * static_cast<double>(vocab);
    }
};

// A built GPT: the graph builder and the ids of the tensors a trainer feeds and reads.
struct gpt_model {
    std::unique_ptr<graph_builder> builder;
    gpt_config config;
    tensor_id tokens = no_id, positions = no_id, targets = no_id, logits = no_id, loss = no_id;

    const graph& ir() const { return builder->view(); }

    // Appends the backward pass and hands the finished graph over.
    graph training_graph() && {
        build_backward(*builder);
        return std::move(*builder).take();
    }
};

namespace detail {

inline tensor layer_norm_block(graph_builder& b, const std::string& scope, tensor x, const gpt_config& c) {
    auto s = b.scope(scope);
    auto gamma = b.parameter("weight", {{Dim::Hidden::id, c.hidden}}, parameter_init::ones());
    auto beta = b.parameter("bias", {{Dim::Hidden::id, c.hidden}}, parameter_init::zeros());
    return ops::layer_norm(x, gamma, beta, c.layer_norm_eps);
}

inline tensor dense(graph_builder& b, const std::string& scope, tensor x, dim_id out_dim, std::int64_t out, dim_id in_dim,
                    std::int64_t in, double std) {
    auto s = b.scope(scope);
    auto w = b.parameter("weight", {{out_dim, out}, {in_dim, in}}, parameter_init::normal(std));
    auto bias = b.parameter("bias", {{out_dim, out}}, parameter_init::zeros());
    return ops::linear(x, w, bias);
}

inline tensor maybe_dropout(tensor x, const gpt_config& c, std::uint64_t& site) {
    ++site;
    if (c.dropout == 0) return x;
    return ops::dropout(x, c.dropout, static_cast<std::int64_t>(c.dropout_seed * 1000003 + site));
}

}  // namespace detail

inline gpt_model gpt(const gpt_config& c) {
    c.validate();
    gpt_model m;
    m.config = c;
    m.builder = std::make_unique<graph_builder>();
    graph_builder& b = *m.builder;
    const dim_id H = Dim::Hidden::id, F = Dim::FFN::id;
    const double proj_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.layers));
    std::uint64_t dropout_site = 0;

    tensor tokens = b.input("tokens", {{Dim::Batch::id, c.batch}, {Dim::Seq::id, c.seq}}, value_kind::index);
    tensor positions = b.input("positions", {{Dim::Batch::id, c.batch}, {Dim::Seq::id, c.seq}}, value_kind::index);
    tensor targets = b.input("targets", {{Dim::Batch::id, c.batch}, {Dim::Seq::id, c.seq}}, value_kind::index);
    tensor wte = b.parameter("wte", {{Dim::Vocab::id, c.vocab}, {H, c.hidden}}, parameter_init::normal(c.init_std));
    tensor wpe = b.parameter("wpe", {{Dim::Seq::id, c.seq}, {H, c.hidden}}, parameter_init::normal(c.init_std));

    tensor x = ops::embedding(tokens, wte) + ops::embedding(positions, wpe);
    x = detail::maybe_dropout(x, c, dropout_site);

    b.repeat("blocks", c.layers, [&](std::int64_t) {
        {
            tensor h = detail::layer_norm_block(b, "ln_1", x, c);
            auto attn = b.scope("attn");
            tensor q = ops::split_heads(detail::dense(b, "q", h, H, c.hidden, H, c.hidden, c.init_std), c.heads);
            tensor k = ops::split_heads(detail::dense(b, "k", h, H, c.hidden, H, c.hidden, c.init_std), c.heads);
            tensor v = ops::split_heads(detail::dense(b, "v", h, H, c.hidden, H, c.hidden, c.init_std), c.heads);
            tensor a = ops::merge_heads(ops::causal_attention(q, k, v));
            tensor o = detail::dense(b, "proj", a, H, c.hidden, H, c.hidden, proj_std);
            x = x + detail::maybe_dropout(o, c, dropout_site);
        }
        {
            tensor h = detail::layer_norm_block(b, "ln_2", x, c);
            auto mlp = b.scope("mlp");
            tensor f = ops::gelu(detail::dense(b, "fc", h, F, c.ffn_size(), H, c.hidden, c.init_std));
            tensor o = detail::dense(b, "proj", f, H, c.hidden, F, c.ffn_size(), proj_std);
            x = x + detail::maybe_dropout(o, c, dropout_site);
        }
    });

    x = detail::layer_norm_block(b, "ln_f", x, c);
    tensor head = wte;
    if (!c.tie_embeddings)
        head = b.parameter("lm_head", {{Dim::Vocab::id, c.vocab}, {H, c.hidden}}, parameter_init::normal(c.init_std));
    tensor logits = ops::linear(x, head);
    tensor loss = ops::cross_entropy(logits, targets);
    b.set_loss(loss);

    m.tokens = tokens.id;
    m.positions = positions.id;
    m.targets = targets.id;
    m.logits = logits.id;
    m.loss = loss.id;
    return m;
}

// Position ids for one batch: row-major [batch, seq], each row 0, 1, ..., seq - 1.
inline std::vector<std::int32_t> gpt_positions(const gpt_config& c) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(c.batch * c.seq));
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(static_cast<std::int64_t>(i) % c.seq);
    return ids;
}

}  // namespace loom::models
// ---- end loom/models/gpt.hpp ----
// ---- end loom/loom.hpp ----
