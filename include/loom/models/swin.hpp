#pragma once
// A Swin-Transformer-style hierarchical vision transformer, built with the public op API only:
// nnScaler's vision workload (Table 9; §4.2 "Constraints for Swin-Transformer"), whose
// high-resolution images make the activations of the first stages large.
//
//   patches [batch, side * side, patch_dim]      already-patched features, row-major over the
//                                                side x side grid (no convolution: the patch
//                                                embedding is a linear over each patch's features)
//   x = patch_embed.norm(patch_embed.proj(windows(patches)))      [batch, windows, tokens, C]
//   stages.s (C_s = embed * 2^s channels, side_s = side / 2^s tokens per side), blocks j:
//     x = x + attn(ln_1(x))     multi-head attention within each window x window window
//     x = x + mlp(ln_2(x))      proj(gelu(fc(h))), fc: C_s -> mlp_ratio * C_s
//   patch_merge, at the end of the last block of every stage but the last: the 2 x 2
//     neighbours' channels concatenated (side halves, 4 C_s channels), norm, then a linear
//     reduction to 2 C_s; the window stays window x window tokens
//   logits = head(mean over tokens of norm(x));  loss = mean cross-entropy(logits, labels)
//
// Linear layers have biases (all but the reduction), layer norms are LayerNorm, initialisation
// N(0, init_std) for weights, zero biases, unit gains.
//
// Left out of Swin: the shifted windows of every other block (a cyclic shift of the grid is
// not a permutation of its axes' factors, and loom has no roll, slice or concatenation; so
// tokens never meet across windows within a stage, only through patch merging), the relative
// position bias (loom's attention takes no bias; there is no position information at all),
// dropout and stochastic depth.
//
// Layout. Within a stage the tokens stay grouped by window, x [b, (hb wb), (wr hr), c]: hb, wb
// the window's row and column, hr, wr the token's row and column inside it. Layer norms, linear
// layers and the residual adds work on any leading axes, so the tokens are partitioned once (the
// input patches, in the prologue) and regrouped only by patch merging, which maps the windows of
// one stage to those of the next; attention reaches its [b, (windows heads), tokens, head_dim]
// layout with two copies per tensor. Shape changes use only transpose, split_heads and
// merge_heads, each a permutation that keeps Batch the leading, splittable dim (no reshape: a
// reshape cannot be split), so data-parallel plans split every op; the laws of to_windows and
// merge_neighbours are below and tested. Those ops name the window axis Head and the token axis
// HeadDim. The mean over tokens is matmul_tn of a constant column [b, tokens, 1] of 1/tokens with
// the tokens [b, tokens, c]: loom has no per-sample reduction, and fill_like makes the column
// from a tensor of its shape, chunk_logsumexp(x, 1) (read for its shape only). Only a reshape
// would drop the unit axis of the pooled [b, 1, c], so the logits are [b, 1, classes] and the
// labels [b, 1].
//
// Layers. Every block is a layer of ONE repeat, "blocks", in model order (stage 0's blocks
// first), while scope paths keep "stages.<s>.blocks.<j>". Per-stage repeats would hide all but
// the deepest stage from search::layers_from_scopes, which folds the largest recorded repeat
// only: the first stages, those with the largest activations, would be prologue. Blocks of one
// stage share a class, except that a stage's last block also merges patches.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/core/random.hpp>
#include <loom/autograd/autograd.hpp>
#include <loom/graph/builder.hpp>
#include <loom/models/record_layers.hpp>
#include <loom/ops/all.hpp>

namespace loom::models {

namespace SwinDim {
using Classes = named_dim<"Classes">;
}  // namespace SwinDim

struct swin_config {
    std::int64_t side = 8;        // tokens (patches) per side of the image at stage 0
    std::int64_t patch_dim = 12;  // features per patch (Swin's 4 x 4 RGB patches: 48)
    std::int64_t window = 2;      // attention windows are window x window tokens at every stage
    std::int64_t embed = 16;      // channels at stage 0; stage s has embed * 2^s
    std::vector<std::int64_t> depths = {2, 2};  // blocks per stage
    std::vector<std::int64_t> heads = {2, 4};   // attention heads per stage
    std::int64_t mlp_ratio = 4;
    std::int64_t classes = 4;
    std::int64_t batch = 2;
    double init_std = 0.02;
    double layer_norm_eps = 1e-5;

    std::int64_t stages() const { return static_cast<std::int64_t>(depths.size()); }
    std::int64_t channels(std::int64_t stage) const { return embed << stage; }
    std::int64_t side_at(std::int64_t stage) const { return side >> stage; }
    std::int64_t blocks() const {
        std::int64_t n = 0;
        for (auto d : depths) n += d;
        return n;
    }

    void validate() const {
        auto positive = [](std::int64_t v, const std::string& what) {
            if (v <= 0)
                throw usage_error("swin_config: " + what + " is " + std::to_string(v) + "; it must be positive");
        };
        positive(side, "side");
        positive(patch_dim, "patch_dim");
        positive(window, "window");
        positive(embed, "embed");
        positive(mlp_ratio, "mlp_ratio");
        positive(batch, "batch");
        if (depths.empty()) throw usage_error("swin_config: depths is empty; give the blocks of at least one stage");
        if (heads.size() != depths.size())
            throw usage_error("swin_config: depths has " + std::to_string(depths.size()) + " stages but heads has " +
                              std::to_string(heads.size()) + "; give one head count per stage");
        if (stages() > 16)
            throw usage_error("swin_config: " + std::to_string(stages()) + " stages; use at most 16");
        for (std::size_t s = 0; s < depths.size(); ++s) {
            positive(depths[s], "depths[" + std::to_string(s) + "]");
            positive(heads[s], "heads[" + std::to_string(s) + "]");
        }
        if (classes < 2)
            throw usage_error("swin_config: classes is " + std::to_string(classes) + "; a classifier needs at least 2");
        const std::int64_t halvings = std::int64_t{1} << (stages() - 1);
        if (side % halvings != 0)
            throw usage_error("swin_config: side " + std::to_string(side) + " is not divisible by " +
                              std::to_string(halvings) + " = 2^(stages - 1), which patch merging needs (it halves " +
                              "the side between stages); choose a side that is a multiple of " +
                              std::to_string(halvings));
        std::string sides;
        for (std::int64_t s = 0; s < stages(); ++s) sides += (s ? ", " : "") + std::to_string(side_at(s));
        for (std::int64_t s = 0; s < stages(); ++s)
            if (side_at(s) % window != 0)
                throw usage_error("swin_config: stage " + std::to_string(s) + " has " + std::to_string(side_at(s)) +
                                  " tokens per side, which window " + std::to_string(window) +
                                  " does not divide; choose a window that divides every stage's side (" + sides +
                                  ")");
        for (std::int64_t s = 0; s < stages(); ++s)
            if (channels(s) % heads[static_cast<std::size_t>(s)] != 0)
                throw usage_error("swin_config: stage " + std::to_string(s) + " has " + std::to_string(channels(s)) +
                                  " channels (embed * 2^" + std::to_string(s) + "), which heads[" + std::to_string(s) +
                                  "] = " + std::to_string(heads[static_cast<std::size_t>(s)]) +
                                  " does not divide; choose heads that divide it");
        if (!(init_std > 0))
            throw usage_error("swin_config: init_std is " + std::to_string(init_std) + "; it must be positive");
        if (!(layer_norm_eps > 0))
            throw usage_error("swin_config: layer_norm_eps is " + std::to_string(layer_norm_eps) +
                              "; it must be positive");
    }

    // Weights, biases and gains, counted from the architecture (tests compare with the graph).
    std::int64_t parameter_count() const {
        const std::int64_t c0 = embed, cf = channels(stages() - 1), r = mlp_ratio;
        std::int64_t n = patch_dim * c0 + c0 + 2 * c0;  // patch_embed: proj, norm
        for (std::int64_t s = 0; s < stages(); ++s) {
            const std::int64_t c = channels(s);
            const std::int64_t block = 2 * 2 * c + 4 * (c * c + c) + (r * c * c + r * c) + (r * c * c + c);
            n += depths[static_cast<std::size_t>(s)] * block;
            if (s + 1 < stages()) n += 2 * 4 * c + 4 * c * 2 * c;  // patch_merge: norm, reduction
        }
        return n + 2 * cf + classes * cf + classes;  // norm, head
    }
};

// A built Swin: the graph builder and the ids of the tensors a trainer feeds and reads.
struct swin_model {
    std::unique_ptr<graph_builder> builder;
    swin_config config;
    // "patches" [batch, side * side, patch_dim] real; "labels" [batch, 1] index.
    tensor_id patches = no_id, labels = no_id, logits = no_id, loss = no_id;

    const graph& ir() const { return builder->view(); }

    // Appends the backward pass and hands the finished graph over.
    graph training_graph() && {
        build_backward(*builder);
        return std::move(*builder).take();
    }
};

namespace detail::swin {

// Patches to windows. t [b, side * side, p], row-major over the grid, to [b, m * m, w * w, p]
// with m = side / w:
//   out[b, hb m + wb, wr w + hr, k] = t[b, (hb w + hr) side + wb w + wr, k]
// (hb, wb: the window's row and column; hr, wr: the token's inside it). Fifteen copies.
LOOM_INLINE tensor to_windows(tensor t, std::int64_t side, std::int64_t w);

// Patch merging's regrouping. t [b, m * m, w * w, c] in the layout of to_windows at side
// m * w, to the same layout at side m * w / 2 with the 2 x 2 neighbours' channels concatenated,
// [b, (m/2)^2, w * w, 4 c]: with row i = hb w + hr = (hb' w + hr') 2 + dh and column
// j = wb w + wr = (wb' w + wr') 2 + dw (m' = m / 2),
//   out[b, hb' m' + wb', wr' w + hr', (dh 2 + dw) c + k] = t[b, hb m + wb, wr w + hr, k]
// Twenty-two copies; the middle step reads the row (hb hr) as (hb' hr' dh), which is free as
// both are the row-major digits of i.
LOOM_INLINE tensor merge_neighbours(tensor t, std::int64_t side, std::int64_t w);

// [b, windows, tokens, (heads e)] -> [b, (windows heads), tokens, e], attention's layout.
inline tensor split_window_heads(tensor t, std::int64_t heads) {
    const std::int64_t windows = t.extent(1);
    return ops::split_heads(ops::merge_heads(t), windows * heads);  // via [b, tokens, (windows heads e)]
}

// The inverse: [b, (windows heads), tokens, e] -> [b, windows, tokens, (heads e)].
inline tensor merge_window_heads(tensor t, std::int64_t windows) {
    return ops::split_heads(ops::merge_heads(t), windows);  // via [b, tokens, (windows heads e)]
}

// [b, windows, tokens, c] -> [b, (windows tokens), c].
inline tensor flatten_windows(tensor t) {
    t = ops::transpose(t);             // [b, windows, c, tokens]
    t = ops::merge_heads(t);           // [b, c, (windows tokens)]
    return ops::transpose(t);          // [b, (windows tokens), c]
}

// The mean over the tokens of t [b, tokens, c], as [b, 1, c] (see "Layout" above).
inline tensor mean_over_tokens(tensor t) {
    const double tokens = static_cast<double>(t.extent(1));
    tensor column = ops::fill_like(ops::chunk_logsumexp(t, 1), 1.0 / tokens);  // [b, tokens, 1]
    return ops::matmul_tn(column, t);
}

struct builder_context {
    graph_builder& b;
    const swin_config& c;

    tensor layer_norm(const std::string& scope, tensor x, std::int64_t n) const {
        auto s = b.scope(scope);
        tensor gamma = b.parameter("weight", {{Dim::Hidden::id, n}}, parameter_init::ones());
        tensor beta = b.parameter("bias", {{Dim::Hidden::id, n}}, parameter_init::zeros());
        return ops::layer_norm(x, gamma, beta, c.layer_norm_eps);
    }

    tensor dense(const std::string& scope, tensor x, dim_id out_dim, std::int64_t out, dim_id in_dim, std::int64_t in,
                 bool bias = true) const {
        auto s = b.scope(scope);
        tensor w = b.parameter("weight", {{out_dim, out}, {in_dim, in}}, parameter_init::normal(c.init_std));
        if (!bias) return ops::linear(x, w);
        return ops::linear(x, w, b.parameter("bias", {{out_dim, out}}, parameter_init::zeros()));
    }

    // One block on x [b, windows, tokens, c] of stage `stage`.
    tensor block(tensor x, std::int64_t stage) const {
        const dim_id H = Dim::Hidden::id, F = Dim::FFN::id;
        const std::int64_t ch = c.channels(stage), heads = c.heads[static_cast<std::size_t>(stage)];
        const std::int64_t windows = x.extent(1);
        {
            tensor h = layer_norm("ln_1", x, ch);
            auto s = b.scope("attn");
            tensor q = split_window_heads(dense("q", h, H, ch, H, ch), heads);
            tensor k = split_window_heads(dense("k", h, H, ch, H, ch), heads);
            tensor v = split_window_heads(dense("v", h, H, ch, H, ch), heads);
            tensor a = merge_window_heads(ops::attention(q, k, v), windows);
            x = x + dense("proj", a, H, ch, H, ch);
        }
        {
            tensor h = layer_norm("ln_2", x, ch);
            auto s = b.scope("mlp");
            const std::int64_t f = c.mlp_ratio * ch;
            x = x + dense("proj", ops::gelu(dense("fc", h, F, f, H, ch)), H, ch, F, f);
        }
        return x;
    }

    // Halves the side of x [b, windows, tokens, c] of stage `stage` and doubles its channels.
    tensor patch_merge(tensor x, std::int64_t stage) const {
        auto s = b.scope("patch_merge");
        const std::int64_t ch = c.channels(stage);
        tensor t = layer_norm("norm", merge_neighbours(x, c.side_at(stage), c.window), 4 * ch);
        return dense("reduction", t, Dim::Hidden::id, 2 * ch, Dim::Channel::id, 4 * ch, false);
    }
};

}  // namespace detail::swin

LOOM_INLINE swin_model swin(const swin_config& c);

// A deterministic synthetic batch from `seed`, for tests and demos (no downloads): labels
// uniform over the classes, and every patch of an image its class's prototype (N(0, 1) per
// feature, the same for every seed) plus N(0, 1) noise. Row-major: patches
// [batch, side * side, patch_dim], labels [batch, 1].
struct swin_batch {
    std::vector<double> patches;
    std::vector<std::int32_t> labels;
};

LOOM_INLINE swin_batch swin_synthetic_batch(const swin_config& c, std::uint64_t seed);

// The four Swin configurations of nnScaler's Table 9 (index 0 .. 3: 1.8B, 5.0B, 10B and 27B
// parameters; 32, 40, 48, 56 layers; hidden 512, 768, 1K, 1.5K; 16, 24, 32, 32 heads), at
// batch 1. Table 9 gives only those; read here as Swin's stage-0 width and heads, both doubling
// per stage, with the depth in the third stage, {2, 2, layers - 6, 2} (Swin's shape), MLP ratio
// 4, 1536 x 1536 images in 4 x 4 RGB patches (side 384, patch_dim 48), windows of 24 x 24
// (which divides every stage's side: 384, 192, 96, 48) and 1000 classes. The counts then come
// to 1.79B, 4.93B, 10.4B and 27.0B (tests check them against the paper's).
inline swin_config swin_table9(int index) {
    struct row {
        std::int64_t layers, embed, heads;
    };
    static constexpr row rows[] = {{32, 512, 16}, {40, 768, 24}, {48, 1024, 32}, {56, 1536, 32}};
    if (index < 0 || index >= 4)
        throw usage_error("swin_table9: index " + std::to_string(index) +
                          " is out of range; Table 9 lists configurations 0 to 3");
    const row& r = rows[index];
    swin_config c;
    c.side = 384;
    c.patch_dim = 48;
    c.window = 24;
    c.embed = r.embed;
    c.depths = {2, 2, r.layers - 6, 2};
    c.heads = {r.heads, 2 * r.heads, 4 * r.heads, 8 * r.heads};
    c.mlp_ratio = 4;
    c.classes = 1000;
    c.batch = 1;
    return c;
}

// Table 9's label of configuration `index`, its parameter count as the paper prints it.
inline const char* swin_table9_name(int index) {
    static constexpr const char* names[] = {"1.8B", "5.0B", "10B", "27B"};
    if (index < 0 || index >= 4)
        throw usage_error("swin_table9_name: index " + std::to_string(index) +
                          " is out of range; Table 9 lists configurations 0 to 3");
    return names[index];
}

}  // namespace loom::models

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::models::detail::swin {

LOOM_INLINE tensor to_windows(tensor t, std::int64_t side, std::int64_t w) {
    const std::int64_t m = side / w;
    t = ops::transpose(t);                   // [b, p, (hb hr wb wr)]
    t = ops::split_heads(t, m * w);          // [b, (hb hr), p, (wb wr)]
    t = ops::transpose(t);                   // [b, (hb hr), (wb wr), p]
    t = ops::merge_heads(t);                 // [b, (wb wr), (hb hr p)]
    t = ops::split_heads(t, m);              // [b, hb, (wb wr), (hr p)]
    t = ops::transpose(t);                   // [b, hb, (hr p), (wb wr)]
    t = ops::merge_heads(t);                 // [b, (hr p), (hb wb wr)]
    t = ops::split_heads(t, m * m * w);      // [b, (hb wb wr), (hr p), 1]
    t = ops::transpose(t);                   // [b, (hb wb wr), 1, (hr p)]
    t = ops::merge_heads(t);                 // [b, 1, (hb wb wr hr p)]
    t = ops::split_heads(t, m * m * w * w);  // [b, (hb wb wr hr), 1, p]
    t = ops::transpose(t);                   // [b, (hb wb wr hr), p, 1]
    t = ops::merge_heads(t);                 // [b, p, (hb wb wr hr)]
    t = ops::split_heads(t, m * m);          // [b, (hb wb), p, (wr hr)]
    return ops::transpose(t);                // [b, (hb wb), (wr hr), p]
}

LOOM_INLINE tensor merge_neighbours(tensor t, std::int64_t side, std::int64_t w) {
    const std::int64_t m = side / w, n = m / 2;
    t = ops::transpose(t);                       // [b, (hb wb), c, (wr hr)]
    t = ops::merge_heads(t);                     // [b, c, (hb wb wr hr)]
    t = ops::split_heads(t, m * m * w);          // [b, (hb wb wr), c, hr]
    t = ops::transpose(t);                       // [b, (hb wb wr), hr, c]
    t = ops::merge_heads(t);                     // [b, hr, (hb wb wr c)]
    t = ops::split_heads(t, m);                  // [b, hb, hr, (wb wr c)]
    t = ops::transpose(t);                       // [b, hb, (wb wr c), hr]
    t = ops::merge_heads(t);                     // [b, (wb wr c), (hb hr)] = [b, (wb' wr' dw c), (hb' hr' dh)]
    t = ops::split_heads(t, n);                  // [b, hb', (wb' wr' dw c), (hr' dh)]
    t = ops::transpose(t);                       // [b, hb', (hr' dh), (wb' wr' dw c)]
    t = ops::merge_heads(t);                     // [b, (hr' dh), (hb' wb' wr' dw c)]
    t = ops::split_heads(t, n * n * w);          // [b, (hb' wb' wr'), (hr' dh), (dw c)]
    t = ops::transpose(t);                       // [b, (hb' wb' wr'), (dw c), (hr' dh)]
    t = ops::merge_heads(t);                     // [b, (dw c), (hb' wb' wr' hr' dh)]
    t = ops::split_heads(t, n * n * w * w * 2);  // [b, (hb' wb' wr' hr' dh), (dw c), 1]
    t = ops::transpose(t);                       // [b, (hb' wb' wr' hr' dh), 1, (dw c)]
    t = ops::merge_heads(t);                     // [b, 1, (hb' wb' wr' hr' dh dw c)]
    t = ops::split_heads(t, n * n * w * w);      // [b, (hb' wb' wr' hr'), 1, (dh dw c)]
    t = ops::transpose(t);                       // [b, (hb' wb' wr' hr'), (dh dw c), 1]
    t = ops::merge_heads(t);                     // [b, (dh dw c), (hb' wb' wr' hr')]
    t = ops::split_heads(t, n * n);              // [b, (hb' wb'), (dh dw c), (wr' hr')]
    return ops::transpose(t);                    // [b, (hb' wb'), (wr' hr'), (dh dw c)]
}
}  // namespace loom::models::detail::swin

namespace loom::models {

LOOM_INLINE swin_model swin(const swin_config& c) {
    c.validate();
    swin_model m;
    m.config = c;
    m.builder = std::make_unique<graph_builder>();
    graph_builder& b = *m.builder;
    const detail::swin::builder_context ctx{b, c};
    const dim_id B = Dim::Batch::id, H = Dim::Hidden::id;

    tensor patches =
        b.input("patches", {{B, c.batch}, {Dim::Seq::id, c.side * c.side}, {Dim::Channel::id, c.patch_dim}});
    tensor labels = b.input("labels", {{B, c.batch}, {Dim::Seq::id, 1}}, value_kind::index);

    tensor x;
    {
        auto s = b.scope("patch_embed");
        x = ctx.dense("proj", detail::swin::to_windows(patches, c.side, c.window), H, c.embed, Dim::Channel::id,
                      c.patch_dim);
        x = ctx.layer_norm("norm", x, c.embed);
    }

    std::vector<std::string> layers;
    for (std::int64_t st = 0; st < c.stages(); ++st) {
        auto stage = b.scope("stages", st);
        const std::int64_t depth = c.depths[static_cast<std::size_t>(st)];
        for (std::int64_t j = 0; j < depth; ++j) {
            auto block = b.scope("blocks", j);
            x = ctx.block(x, st);
            if (j + 1 == depth && st + 1 < c.stages()) x = ctx.patch_merge(x, st);
            layers.push_back("stages." + std::to_string(st) + ".blocks." + std::to_string(j));
        }
    }
    record_layers(b, "blocks", layers);

    const std::int64_t cf = c.channels(c.stages() - 1);
    tensor pooled = detail::swin::mean_over_tokens(detail::swin::flatten_windows(ctx.layer_norm("norm", x, cf)));
    tensor logits = ctx.dense("head", pooled, SwinDim::Classes::id, c.classes, H, cf);
    tensor loss = ops::cross_entropy(logits, labels);
    b.set_loss(loss);

    m.patches = patches.id;
    m.labels = labels.id;
    m.logits = logits.id;
    m.loss = loss.id;
    return m;
}

LOOM_INLINE swin_batch swin_synthetic_batch(const swin_config& c, std::uint64_t seed) {
    c.validate();
    auto uniform = [](std::uint64_t key, std::uint64_t i) {
        return static_cast<double>(splitmix64(key * 0x9e3779b97f4a7c15ull + i) >> 11) * 0x1.0p-53;
    };
    auto normal = [&](std::uint64_t key, std::uint64_t i) {
        const double u1 = uniform(key, 2 * i) + 0x1.0p-54, u2 = uniform(key, 2 * i + 1);
        return std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    };
    const std::uint64_t prototype_key = 0x5317, sample_key = seed + 1;
    const auto p = static_cast<std::uint64_t>(c.patch_dim);
    const auto tokens = static_cast<std::uint64_t>(c.side * c.side);
    swin_batch out;
    std::uint64_t noise = 0;
    for (std::int64_t i = 0; i < c.batch; ++i) {
        const double u = uniform(sample_key, static_cast<std::uint64_t>(i));
        const auto label = static_cast<std::int32_t>(
            std::min<std::int64_t>(static_cast<std::int64_t>(u * static_cast<double>(c.classes)), c.classes - 1));
        out.labels.push_back(label);
        for (std::uint64_t t = 0; t < tokens; ++t)
            for (std::uint64_t k = 0; k < p; ++k)
                out.patches.push_back(normal(prototype_key, static_cast<std::uint64_t>(label) * p + k) +
                                      normal(sample_key * 0x100000001b3ull, noise++));
    }
    return out;
}

}  // namespace loom::models
#endif  // LOOM_HEADER_DEFINITIONS
