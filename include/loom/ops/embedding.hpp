#pragma once
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

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/builder.hpp>

namespace loom::ops {

namespace detail {
LOOM_INLINE void check_vocabulary_range(std::string_view op, const attributes& a, std::int64_t rows,
                                        const std::string& node_name);
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
LOOM_INLINE tensor embedding_grad(tensor dy, tensor ids, std::int64_t rows, dim_id row_dim, std::int64_t vocab,
                                  std::int64_t row_offset = 0);

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

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::ops::detail {

LOOM_INLINE void check_vocabulary_range(std::string_view op, const attributes& a, std::int64_t rows,
                                        const std::string& node_name) {
    const auto vocab = a.get<std::int64_t>("vocab");
    const auto offset = a.get_or<std::int64_t>("row_offset", 0);
    if (offset < 0 || offset + rows > vocab)
        throw shape_error(std::string(op) + " '" + node_name + "': the table rows [" + std::to_string(offset) + ", " +
                          std::to_string(offset + rows) + ") are not inside the vocabulary [0, " +
                          std::to_string(vocab) + "); set row_offset and vocab so the table is a slice of it");
}
}  // namespace loom::ops::detail

namespace loom::ops {

LOOM_INLINE tensor embedding_grad(tensor dy, tensor ids, std::int64_t rows, dim_id row_dim, std::int64_t vocab,
                                  std::int64_t row_offset) {
    return dy.builder->apply1<EmbeddingGrad>({dy, ids}, {{"vocab", vocab},
                                                         {"row_offset", row_offset},
                                                         {"rows", rows},
                                                         {"row_dim", std::string(row_dim.name())}});
}

}  // namespace loom::ops
#endif  // LOOM_HEADER_DEFINITIONS
