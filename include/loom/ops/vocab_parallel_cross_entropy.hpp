#pragma once
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
//
// Chunks of unequal sizes. A vocabulary that the chunk count does not divide (97 over 2
// devices) is split by plans into near-equal pieces (49 and 48 columns), which the group
// (c v) cannot state. Its log-sum-exps come from the ragged twins, which take the chunks'
// boundaries {0, b_1, ..., vocab} (chunk k: columns [b_k, b_k+1)):
//
//   ragged_chunk_logsumexp       "... v -> ... c^"                 lse[p, k] = logsumexp(logits[p, chunk k])
//   ragged_chunk_logsumexp_grad  "... c^, ... v, ... c^ -> ... v"  dlogits[p, j] = dlse[p, k] exp(logits[p, j] - lse[p, k]),
//                                                                  k the chunk of column j
//
// with the logits holding columns [row_offset, row_offset + v). v is contracted in the
// forward op: a piece holding some chunks whole writes their log-sum-exps and zeros for the
// other chunks, so the pieces' partial sums are the whole [... c] (what crosses devices is a
// sum of [positions, chunks]). A piece holding part of a chunk is refused when it is built.
// The gradient is local to any piece of v.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/builder.hpp>

namespace loom::ops {

namespace detail {

// The chunk axis keeps the vocabulary's dim (it is the vocabulary, `chunks` entries long),
// so that a split of the logits along Vocab finds it when partitions are mirrored onto the
// backward ops (an axis matches only one of the same dim).
LOOM_INLINE std::vector<preset_variable> chunk_presets(const attributes& a, std::string_view op);

LOOM_INLINE attributes chunk_piece_attributes(const node& n, const piece_ranges& r);

LOOM_INLINE attributes row_offset_piece_attributes(const node& n, const piece_ranges& r);

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
    // The log-sum-exps, in float in bf16 programs: the loss is rebuilt from those of every
    // rank, and a bf16 one would carry its 3 digits into it (as attention's lse).
    static constexpr std::uint32_t float_outputs = 0b1;
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

namespace detail {

// The chunks' boundaries, checked: 0 first, strictly increasing, the logits' columns
// [row_offset, row_offset + v) inside them and made of whole chunks.
LOOM_INLINE std::vector<std::int64_t> ragged_boundaries(const attributes& a, std::string_view op, std::int64_t v,
                                                        const std::string& node_name);

inline std::vector<preset_variable> ragged_presets(const attributes& a, std::string_view op) {
    return {{"c", Dim::Vocab::id, static_cast<std::int64_t>(ragged_boundaries(a, op, -1, {}).size()) - 1}};
}

}  // namespace detail

struct RaggedChunkLogsumexpGrad {
    static constexpr std::string_view name = "ragged_chunk_logsumexp_grad";
    static constexpr signature sig = parse_signature("... c^, ... v, ... c^ -> ... v");
    static std::vector<preset_variable> presets(const attributes& a, std::span<const shape>) {
        return detail::ragged_presets(a, name);
    }
    static void check(const bound_signature& b, const attributes& a, std::span<const shape>, const std::string& node_name) {
        const std::int64_t v = b.vars[static_cast<std::size_t>(*b.find("v"))].extent;
        const auto bounds = detail::ragged_boundaries(a, name, -1, node_name);
        const auto offset = a.get_or<std::int64_t>("row_offset", 0);
        if (offset < 0 || offset + v > bounds.back())
            throw shape_error(std::string(name) + " '" + node_name + "': the logits' columns [" + std::to_string(offset) +
                              ", " + std::to_string(offset + v) + ") are not inside the vocabulary [0, " +
                              std::to_string(bounds.back()) + "); set row_offset so the logits are a slice of it");
    }
    static attributes piece_attributes(const node& n, const piece_ranges& r) {
        return detail::row_offset_piece_attributes(n, r);
    }
    // An exp, a subtraction and a product per logit.
    static double flops(const graph& g, const node& n) {
        return 3.0 * static_cast<double>(g.tensor(n.inputs[1]).dims.numel());
    }
};

// dlogits = dlse[k] * exp(logits - lse[k]) within each chunk k.
inline tensor ragged_chunk_logsumexp_grad(tensor dlse, tensor logits, tensor lse, std::vector<std::int64_t> boundaries,
                                          std::int64_t row_offset) {
    return dlse.builder->apply1<RaggedChunkLogsumexpGrad>(
        {dlse, logits, lse}, {{"boundaries", std::move(boundaries)}, {"row_offset", row_offset}});
}

struct RaggedChunkLogsumexp {
    static constexpr std::string_view name = "ragged_chunk_logsumexp";
    static constexpr signature sig = parse_signature("... v -> ... c^");
    static constexpr std::uint32_t float_outputs = 0b1;  // as chunk_logsumexp's
    static std::vector<preset_variable> presets(const attributes& a, std::span<const shape>) {
        return detail::ragged_presets(a, name);
    }
    static void check(const bound_signature& b, const attributes& a, std::span<const shape>, const std::string& node_name) {
        detail::ragged_boundaries(a, name, b.vars[static_cast<std::size_t>(*b.find("v"))].extent, node_name);
    }
    static attributes piece_attributes(const node& n, const piece_ranges& r) {
        return detail::row_offset_piece_attributes(n, r);
    }
    // About 4 operations per logit (max, exp, sum).
    static double flops(const graph& g, const node& n) {
        return 4.0 * static_cast<double>(g.tensor(n.inputs[0]).dims.numel());
    }
    static gradients backward(backward_context& c) {
        gradients g(1);
        if (c.needs_grad[0])
            g[0] = ragged_chunk_logsumexp_grad(*c.grad_outputs[0], c.inputs[0], c.outputs[0],
                                               c.attrs().get<std::vector<std::int64_t>>("boundaries"),
                                               c.attrs().get_or<std::int64_t>("row_offset", 0));
        return g;
    }
};

// lse [... chunks]: the log-sum-exp of each chunk [b_k, b_k+1) of the last axis of `logits`,
// which holds vocabulary columns [row_offset, row_offset + v) (0 for a chunk it does not hold).
inline tensor ragged_chunk_logsumexp(tensor logits, std::vector<std::int64_t> boundaries, std::int64_t row_offset = 0) {
    return logits.builder->apply1<RaggedChunkLogsumexp>(
        {logits}, {{"boundaries", std::move(boundaries)}, {"row_offset", row_offset}});
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
LOOM_INLINE tensor pick_target_grad(tensor dz, tensor targets, std::int64_t rows, std::int64_t vocab,
                                    std::int64_t row_offset, std::int64_t ignore_index);

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

LOOM_INLINE cross_entropy_from_chunks_grads cross_entropy_from_chunks_grad(tensor dloss, tensor lse, tensor targets,
                                                                           std::int64_t ignore_index, double normalizer);

struct CrossEntropyFromChunks {
    static constexpr std::string_view name = "cross_entropy_from_chunks";
    static constexpr signature sig = parse_signature("... c^, ..., ... -> ");
    static constexpr std::uint32_t float_outputs = 0b1;  // the loss, in float in bf16 programs
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
LOOM_INLINE tensor vocab_parallel_cross_entropy(tensor logits, tensor targets, std::int64_t chunks,
                                                std::int64_t ignore_index = -100,
                                                std::optional<double> normalizer = std::nullopt);

}  // namespace loom::ops

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::ops::detail {

LOOM_INLINE std::vector<preset_variable> chunk_presets(const attributes& a, std::string_view op) {
    const auto chunks = a.get<std::int64_t>("chunks");
    if (chunks <= 0)
        throw shape_error(std::string(op) + ": chunks = " + std::to_string(chunks) +
                          "; pass a positive number of vocabulary chunks");
    return {{"c", Dim::Vocab::id, chunks}};
}

LOOM_INLINE attributes chunk_piece_attributes(const node& n, const piece_ranges& r) {
    attributes a = n.attrs;
    auto c = static_cast<std::size_t>(*n.sig.find("c"));
    a.set("chunks", r.end[c] - r.begin[c]);
    return a;
}

LOOM_INLINE attributes row_offset_piece_attributes(const node& n, const piece_ranges& r) {
    attributes a = n.attrs;
    auto v = static_cast<std::size_t>(*n.sig.find("v"));
    a.set("row_offset", a.get_or<std::int64_t>("row_offset", 0) + r.begin[v]);
    if (a.has("rows")) a.set("rows", r.end[v] - r.begin[v]);
    return a;
}

LOOM_INLINE std::vector<std::int64_t> ragged_boundaries(const attributes& a, std::string_view op, std::int64_t v,
                                                        const std::string& node_name) {
    auto b = a.get<std::vector<std::int64_t>>("boundaries");
    const std::string where = std::string(op) + (node_name.empty() ? "" : " '" + node_name + "'");
    bool increasing = b.size() >= 2 && b.front() == 0;
    for (std::size_t k = 1; increasing && k < b.size(); ++k) increasing = b[k] > b[k - 1];
    if (!increasing)
        throw shape_error(where + ": the chunk boundaries must start at 0 and increase strictly (chunk k is the columns "
                          "[b_k, b_k+1)); give at least one chunk");
    if (v < 0) return b;  // the gradient: any columns
    const auto offset = a.get_or<std::int64_t>("row_offset", 0);
    auto boundary = [&](std::int64_t x) { return std::find(b.begin(), b.end(), x) != b.end(); };
    if (offset < 0 || offset + v > b.back() || !boundary(offset) || !boundary(offset + v))
        throw shape_error(where + ": the logits hold columns [" + std::to_string(offset) + ", " +
                          std::to_string(offset + v) + ") of a vocabulary of " + std::to_string(b.back()) +
                          ", which is not a run of whole chunks; split the logits at the chunk boundaries");
    return b;
}
}  // namespace loom::ops::detail

namespace loom::ops {

LOOM_INLINE tensor pick_target_grad(tensor dz, tensor targets, std::int64_t rows, std::int64_t vocab,
                                    std::int64_t row_offset, std::int64_t ignore_index) {
    return dz.builder->apply1<PickTargetGrad>(
        {dz, targets},
        {{"rows", rows}, {"vocab", vocab}, {"row_offset", row_offset}, {"ignore_index", ignore_index}});
}

LOOM_INLINE cross_entropy_from_chunks_grads cross_entropy_from_chunks_grad(tensor dloss, tensor lse, tensor targets,
                                                                           std::int64_t ignore_index, double normalizer) {
    std::array<tensor, 3> ins{dloss, lse, targets};
    auto outs = dloss.builder->apply<CrossEntropyFromChunksGrad>(
        ins, {{"ignore_index", ignore_index}, {"normalizer", normalizer}});
    return {outs[0], outs[1]};
}

LOOM_INLINE tensor vocab_parallel_cross_entropy(tensor logits, tensor targets, std::int64_t chunks,
                                                std::int64_t ignore_index,
                                                std::optional<double> normalizer) {
    const double n = normalizer ? *normalizer : static_cast<double>(targets.dims().numel());
    if (!(n > 0) || !std::isfinite(n))
        throw usage_error("vocab_parallel_cross_entropy: normalizer = " + std::to_string(n) + " for logits '" +
                          logits.name() + "'; pass a positive finite normalizer (the number of positions the mean is over)");
    tensor lse = chunk_logsumexp(logits, chunks);
    tensor z = pick_target(logits, targets, ignore_index);
    return cross_entropy_from_chunks(lse, z, targets, ignore_index, n);
}

}  // namespace loom::ops
#endif  // LOOM_HEADER_DEFINITIONS
