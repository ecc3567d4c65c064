#pragma once
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
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include <loom/graph/op.hpp>
#include <loom/ops/linear.hpp>

namespace loom::plan {

struct transformation {
    std::string description;
    attributes (*piece_attributes)(const node&, const piece_ranges&) = nullptr;
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
}

}  // namespace loom::plan
