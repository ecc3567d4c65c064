#pragma once
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

#include <loom/core/linkage.hpp>
#include <loom/graph/builder.hpp>

namespace loom::ops {

namespace detail {
LOOM_INLINE void check_dropout_probability(std::string_view op, const attributes& a, const std::string& node_name);

// A piece of a partitioned dropout must draw the mask of its elements' places in the whole
// tensor: it records where its box starts ("origin") and the whole tensor's extents.
LOOM_INLINE attributes dropout_piece_attributes(const node& n, const piece_ranges& r);
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

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::ops::detail {

LOOM_INLINE void check_dropout_probability(std::string_view op, const attributes& a, const std::string& node_name) {
    const double p = a.get<double>("p");
    if (!(p >= 0.0 && p < 1.0)) {
        std::ostringstream msg;
        msg << op << " '" << node_name << "': p = " << p
            << " is not a drop probability; pass 0 <= p < 1 (p = 0 keeps every element)";
        throw usage_error(msg.str());
    }
    (void)a.get<std::int64_t>("seed");
}

LOOM_INLINE attributes dropout_piece_attributes(const node& n, const piece_ranges& r) {
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

}  // namespace loom::ops::detail
#endif  // LOOM_HEADER_DEFINITIONS
