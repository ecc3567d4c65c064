#pragma once
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

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/core/shape.hpp>

namespace loom {

enum class dim_role : std::uint8_t { spatial, contracted, frozen };

LOOM_INLINE std::string_view to_string(dim_role r);

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

    // The effect of splitting variable `v` on one operand: input or output `position`.
    // Allocates nothing (effect_of_split gives every operand's at once).
    operand_effect effect_on(int v, bool input, std::size_t position) const {
        const auto& axes = (input ? input_axes : output_axes)[position];
        for (std::size_t a = 0; a < axes.size(); ++a)
            for (int member : axes[a])
                if (member == v) return operand_effect{split_effect::sliced, static_cast<int>(a)};
        if (!input && vars[static_cast<std::size_t>(v)].in_input) return operand_effect{split_effect::partial, -1};
        return operand_effect{split_effect::replicated, -1};
    }

    // The effect on every operand of splitting variable `v`. An output axis is sliced only
    // when the variable is the outermost of that axis.
    split_option effect_of_split(int v) const {
        split_option opt;
        opt.variable = v;
        opt.label = vars[v].label;
        opt.dim = vars[v].dim;
        opt.extent = vars[v].extent;
        opt.inputs.reserve(input_axes.size());
        opt.outputs.reserve(output_axes.size());
        for (std::size_t k = 0; k < input_axes.size(); ++k) opt.inputs.push_back(effect_on(v, true, k));
        for (std::size_t k = 0; k < output_axes.size(); ++k) opt.outputs.push_back(effect_on(v, false, k));
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
LOOM_INLINE bound_signature bind_signature(const signature& sig, std::string_view op_name, std::string_view node_name,
                                           std::span<const shape> inputs, std::span<const std::string> input_names,
                                           std::span<const preset_variable> presets = {});

// The shape of output `o` from a bound signature. A group axis needs a name: `group_dim`.
LOOM_INLINE shape output_shape(const bound_signature& b, std::size_t o, dim_id group_dim = {});

}  // namespace loom

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom {

LOOM_INLINE std::string_view to_string(dim_role r) {
    switch (r) {
        case dim_role::spatial: return "spatial";
        case dim_role::contracted: return "contracted";
        case dim_role::frozen: return "frozen";
    }
    return "?";
}

LOOM_INLINE bound_signature bind_signature(const signature& sig, std::string_view op_name, std::string_view node_name,
                                           std::span<const shape> inputs, std::span<const std::string> input_names,
                                           std::span<const preset_variable> presets) {
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

LOOM_INLINE shape output_shape(const bound_signature& b, std::size_t o, dim_id group_dim) {
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
#endif  // LOOM_HEADER_DEFINITIONS
