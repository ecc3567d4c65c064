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
// loss: no device gathers the logits), with ragged chunks where the degree does not divide
// the vocabulary (plans cut it into near-equal pieces, plan::piece_begin).
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/linkage.hpp>
#include <loom/graph/builder.hpp>
#include <loom/graph/op.hpp>
#include <loom/ops/cross_entropy.hpp>
#include <loom/ops/linear.hpp>
#include <loom/ops/vocab_parallel_cross_entropy.hpp>
#include <loom/plan/op_partition.hpp>

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
        if (t.decompose) decomposing_.insert(&op);
        entries_[{&op, std::move(label)}] = std::move(t);
    }
    // Whether some split of `op` may rebuild it into other ops: false lets a caller skip
    // binding the split's variable and looking it up (the search asks for every op of every
    // candidate plan).
    bool may_decompose(const op_def& op) const {
        std::lock_guard lock(mutex_);
        return decomposing_.count(&op) > 0;
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
    std::set<const op_def*> decomposing_;  // ops with at least one decomposition (never shrinks)
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
// vocabulary pieces. A vocabulary the chunks do not divide is cut into the near-equal pieces
// the plan cuts the logits into (plan::piece_begin, nested as the splits are), and its
// log-sum-exps come from ragged_chunk_logsumexp, whose pieces each hold whole chunks.
LOOM_INLINE std::vector<tensor> vocab_parallel_loss(graph_builder&, const node& n, std::span<const tensor> in,
                                                    const op_partition& p, std::vector<op_partition>& partitions);

}  // namespace detail

// Built in: a linear layer with bias split along its input features (Megatron's
// row-parallel layer): every piece multiplies its slice, and only the first adds the bias.

}  // namespace loom::plan

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::plan::detail {

LOOM_INLINE std::vector<tensor> vocab_parallel_loss(graph_builder&, const node& n, std::span<const tensor> in,
                                                    const op_partition& p, std::vector<op_partition>& partitions) {
    const shape& logits = in[0].dims();
    const std::int64_t vocab = logits.rank() >= 1 ? logits.extent(logits.rank() - 1) : 0;
    std::int64_t chunks = 1;
    std::vector<std::int64_t> boundaries{0, vocab};
    op_partition by_chunk = p, combine = p;
    for (std::size_t s = 0; s < p.splits.size(); ++s) {
        if (!p.splits[s].cuts() || p.splits[s].label != "v") continue;
        chunks *= p.splits[s].degree;
        std::vector<std::int64_t> finer{0};
        for (std::size_t k = 0; k + 1 < boundaries.size(); ++k)
            for (std::int64_t piece = 1; piece <= p.splits[s].degree; ++piece)
                finer.push_back(boundaries[k] + piece_begin(boundaries[k + 1] - boundaries[k], p.splits[s].degree, piece));
        boundaries = std::move(finer);
        by_chunk.splits[s].label = "c";
        combine.splits[s] = {{}, "", p.splits[s].degree, true};
    }
    const auto ignore = n.attrs.get<std::int64_t>("ignore_index");
    tensor lse;
    if (vocab % chunks == 0) {
        lse = ops::chunk_logsumexp(in[0], chunks);
        partitions.push_back(by_chunk);
    } else {
        lse = ops::ragged_chunk_logsumexp(in[0], std::move(boundaries));
        partitions.push_back(p);
    }
    tensor picked = ops::pick_target(in[0], in[1], ignore);
    partitions.push_back(p);
    tensor loss = ops::cross_entropy_from_chunks(lse, picked, in[1], ignore, n.attrs.get<double>("normalizer"));
    partitions.push_back(combine);
    return {loss};
}
}  // namespace loom::plan::detail

namespace loom::plan {

LOOM_INLINE transformation_registry::transformation_registry() {
    // Through add(), which also keeps the set of decomposing ops.
    add(op_def_of<ops::LinearBias>(), "k",
        {"row-parallel: pieces sum partial products, the first piece adds the bias", [](const node& n, const piece_ranges& r) {
             attributes a = n.attrs;
             auto k = static_cast<std::size_t>(*n.sig.find("k"));
             a.set("bias", std::int64_t{r.begin[k] == 0 ? 1 : 0});
             return a;
         }});
    add(op_def_of<ops::CrossEntropy>(), "v",
        {"vocabulary-parallel: per-chunk log-sum-exps and target picks, combined by a small replicated op", nullptr,
         &detail::vocab_parallel_loss});
}

}  // namespace loom::plan
#endif  // LOOM_HEADER_DEFINITIONS
