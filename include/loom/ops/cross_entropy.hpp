#pragma once
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

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/builder.hpp>

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
    static constexpr std::uint32_t float_outputs = 0b1;  // the loss, in float in bf16 programs
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
LOOM_INLINE tensor cross_entropy(tensor logits, tensor targets, std::int64_t ignore_index = -100,
                                 std::optional<double> normalizer = std::nullopt);

}  // namespace loom::ops

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::ops {

LOOM_INLINE tensor cross_entropy(tensor logits, tensor targets, std::int64_t ignore_index,
                                 std::optional<double> normalizer) {
    const double n = normalizer ? *normalizer : static_cast<double>(targets.dims().numel());
    if (!(n > 0) || !std::isfinite(n))
        throw usage_error("cross_entropy: normalizer = " + std::to_string(n) + " for logits '" + logits.name() +
                          "'; pass a positive finite normalizer (the number of positions the mean is over)");
    return logits.builder->apply1<CrossEntropy>({logits, targets},
                                                {{"ignore_index", ignore_index}, {"normalizer", n}});
}

}  // namespace loom::ops
#endif  // LOOM_HEADER_DEFINITIONS
