#pragma once
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

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/core/random.hpp>
#include <loom/autograd/autograd.hpp>
#include <loom/graph/builder.hpp>
#include <loom/ops/all.hpp>

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
LOOM_INLINE tensor swap_middle_axes(tensor t);

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
LOOM_INLINE tensor axial_attention(graph_builder& b, tensor x, const attention_params& p);

// x + attention along axis 2 of x [b, ., ., c] (rows), or along axis 1 (columns: the two
// middle axes swapped there and back).
LOOM_INLINE tensor attention_branch(graph_builder& b, const std::string& scope, tensor x, const attention_params& p,
                                    bool along_columns, const evoformer_config& c);

// Pair-weighted averaging (AlphaFold 3's MSA module), per head h:
//   w[b, i, j] = softmax_j(LN(z)[b, i, j, :] . weights_h),  out[b, s, i] = sum_j w[b, i, j] v_h[b, s, j]
// as one matmul over the MSA with sequences folded into the columns:
//   merge_heads(v) [b, j, (s d)],  w @ it = [b, i, (s d)],  split_heads(., s) = [b, s, i, d].
LOOM_INLINE tensor pair_average_branch(graph_builder& b, tensor m, tensor z, const pair_average_params& p,
                                       const evoformer_config& c);

// A rank-`outer_groups` outer-product mean: group g contributes the pair feature
//   o_g[b, i, j] = 1/s sum_{s, k} a_g[b, s, i, k] b_g[b, s, j, k]
// projected to cz. (AlphaFold's projects all c^2 products of vec(a (x) b); this keeps one
// contraction per group.) With sequences folded into the channels, o_g is one matmul:
//   matmul_nt(merge_heads(b_g) [b, j, (s k)], merge_heads(a_g) [b, i, (s k)]) = [b, j, i],
// and split_heads(., r) turns [b, j, (i 1)] into [b, i, j, 1].
LOOM_INLINE tensor outer_product_branch(graph_builder& b, tensor m, tensor z, const outer_params& p,
                                        const evoformer_config& c);

inline tensor transition_branch(graph_builder& b, const std::string& scope, tensor x, const transition_params& p,
                                const evoformer_config& c) {
    auto s = b.scope(scope);
    return x + linear(ops::relu(linear(layer_norm(x, p.ln, c), p.fc)), p.proj);
}

LOOM_INLINE void evoformer_block(graph_builder& b, tensor& m, tensor& z, const block_params& p, const evoformer_config& c);

}  // namespace detail::evo

LOOM_INLINE evoformer_model evoformer(const evoformer_config& c);

// The pair inputs of one batch from its MSA tokens [batch, s, r] (row-major): the tokens of
// residues i and j of row 0 (the target sequence) and clip(j - i) + clip, each [batch, r, r].
struct evoformer_pair_inputs {
    std::vector<std::int32_t> left, right, relpos;
};

LOOM_INLINE evoformer_pair_inputs evoformer_pair_ids(const evoformer_config& c, std::span<const std::int32_t> msa);

// A deterministic synthetic batch from `seed`, for tests and demos (no downloads). Each
// item is a chain of residues 3.8 apart in random directions; its distogram classes split
// distances [2, 22) into bins - 2 equal classes plus one below and one above. MSA row 0 is
// a random sequence; the other rows mutate each residue with probability 1/4 (a gap, the
// last token, with probability 1/20).
struct evoformer_batch {
    std::vector<std::int32_t> msa, pair_left, pair_right, relpos, targets;
};

LOOM_INLINE evoformer_batch evoformer_synthetic_batch(const evoformer_config& c, std::uint64_t seed);

}  // namespace loom::models

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::models::detail::evo {

LOOM_INLINE tensor swap_middle_axes(tensor t) {
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

LOOM_INLINE tensor axial_attention(graph_builder& b, tensor x, const attention_params& p) {
    std::optional<tensor> sum;
    for (std::size_t h = 0; h < p.q.size(); ++h) {
        auto head = b.scope("head", static_cast<std::int64_t>(h));
        tensor o = ops::attention(ops::linear(x, p.q[h]), ops::linear(x, p.k[h]), ops::linear(x, p.v[h]));
        tensor projected = h == 0 ? ops::linear(o, p.out[h], p.out_bias) : ops::linear(o, p.out[h]);
        sum = sum ? *sum + projected : projected;
    }
    return *sum;
}

LOOM_INLINE tensor attention_branch(graph_builder& b, const std::string& scope, tensor x, const attention_params& p,
                                    bool along_columns, const evoformer_config& c) {
    auto s = b.scope(scope);
    tensor h = layer_norm(x, p.ln, c);
    if (!along_columns) return x + axial_attention(b, h, p);
    return x + swap_middle_axes(axial_attention(b, swap_middle_axes(h), p));
}

LOOM_INLINE tensor pair_average_branch(graph_builder& b, tensor m, tensor z, const pair_average_params& p,
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

LOOM_INLINE tensor outer_product_branch(graph_builder& b, tensor m, tensor z, const outer_params& p,
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

LOOM_INLINE void evoformer_block(graph_builder& b, tensor& m, tensor& z, const block_params& p, const evoformer_config& c) {
    m = attention_branch(b, "msa_row", m, p.msa_row, false, c);
    m = pair_average_branch(b, m, z, p.msa_pair_avg, c);
    m = attention_branch(b, "msa_col", m, p.msa_col, true, c);
    m = transition_branch(b, "msa_transition", m, p.msa_transition, c);
    z = outer_product_branch(b, m, z, p.outer_product, c);
    z = attention_branch(b, "pair_row", z, p.pair_row, false, c);
    z = attention_branch(b, "pair_col", z, p.pair_col, true, c);
    z = transition_branch(b, "pair_transition", z, p.pair_transition, c);
}
}  // namespace loom::models::detail::evo

namespace loom::models {

LOOM_INLINE evoformer_model evoformer(const evoformer_config& c) {
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

LOOM_INLINE evoformer_pair_inputs evoformer_pair_ids(const evoformer_config& c, std::span<const std::int32_t> msa) {
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

LOOM_INLINE evoformer_batch evoformer_synthetic_batch(const evoformer_config& c, std::uint64_t seed) {
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
#endif  // LOOM_HEADER_DEFINITIONS
