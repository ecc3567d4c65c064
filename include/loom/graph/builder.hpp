#pragma once
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
#include <unordered_map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/op.hpp>

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
        scope_by_path_.clear();
        scopes_indexed_ = 0;
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
    // Edits made through it (renaming tensors) are seen by the builder's duplicate-name checks
    // from the next call of mutable_graph() on: take it afresh for each edit.
    graph& mutable_graph() {
        names_stale_ = true;
        return graph_;
    }

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
    void rename(tensor_id t, std::string name) {
        graph_.tensor(t).name = std::move(name);
        names_stale_ = true;
    }

    graph take() && { return std::move(graph_); }

private:
    std::string qualified(const std::string& name) const {
        std::string path = graph_.scope_path(current_scope_);
        return path.empty() ? name : path + "." + name;
    }

    // Tensors by name, indexed as they are added (a scan per new input or parameter made
    // building a large model quadratic); rebuilt after a rename or an edit through
    // mutable_graph(). A hit is checked against the tensor's current name.
    void check_new_name(const std::string& full, std::string_view what, tensor_id except = no_id) const {
        if (names_stale_) {
            tensors_by_name_.clear();
            tensors_indexed_ = 0;
            names_stale_ = false;
        }
        for (; tensors_indexed_ < graph_.tensors.size(); ++tensors_indexed_)
            tensors_by_name_[graph_.tensors[tensors_indexed_].name].push_back(static_cast<tensor_id>(tensors_indexed_));
        auto found = tensors_by_name_.find(full);
        if (found == tensors_by_name_.end()) return;
        for (tensor_id t : found->second)
            if (t != except && graph_.tensor(t).name == full)
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
        // Scopes by path, indexed as they are added: re-entering a scope finds the first one.
        for (; scopes_indexed_ < graph_.scopes.size(); ++scopes_indexed_)
            scope_by_path_.emplace(graph_.scopes[scopes_indexed_].path, static_cast<std::int32_t>(scopes_indexed_));
        if (auto found = scope_by_path_.find(s.path); found != scope_by_path_.end()) return found->second;
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
    std::unordered_map<std::string, std::int32_t> scope_by_path_;
    std::size_t scopes_indexed_ = 0;
    mutable std::unordered_map<std::string, std::vector<tensor_id>> tensors_by_name_;
    mutable std::size_t tensors_indexed_ = 0;
    mutable bool names_stale_ = false;
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
