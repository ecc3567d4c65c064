#pragma once
// GPT-2 style decoder-only transformer, built with the public op API only.
//
//   x = wte[tokens] + wpe[positions]
//   blocks.i:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))       (pre-norm)
//   attn:      causal multi-head self-attention with q, k, v and output projections
//   mlp:       proj(gelu(fc(x))), fc: hidden -> ffn (4 * hidden by default)
//   logits = ln_f(x) wte^T   (tied embeddings; or a separate lm_head)
//   loss = mean cross-entropy(logits, targets)
//
// Initialisation follows GPT-2: N(0, 0.02) weights, output projections scaled by
// 1/sqrt(2 * layers), zero biases, unit norm gains.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/autograd/autograd.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/builder.hpp>
#include <loom/ops/all.hpp>

namespace loom::models {

struct gpt_config {
    std::int64_t layers = 4;
    std::int64_t hidden = 128;
    std::int64_t heads = 4;
    std::int64_t vocab = 256;
    std::int64_t seq = 64;
    std::int64_t batch = 8;
    std::int64_t ffn = 0;  // 0: 4 * hidden
    double dropout = 0.0;
    bool tie_embeddings = true;
    double init_std = 0.02;
    double layer_norm_eps = 1e-5;
    std::uint64_t dropout_seed = 1;

    std::int64_t ffn_size() const { return ffn > 0 ? ffn : 4 * hidden; }

    void validate() const {
        auto positive = [](std::int64_t v, const char* what) {
            if (v <= 0) throw usage_error(std::string("gpt_config: ") + what + " is " + std::to_string(v) + "; it must be positive");
        };
        positive(layers, "layers");
        positive(hidden, "hidden");
        positive(heads, "heads");
        positive(vocab, "vocab");
        positive(seq, "seq");
        positive(batch, "batch");
        if (hidden % heads != 0)
            throw usage_error("gpt_config: hidden " + std::to_string(hidden) + " is not divisible by heads " +
                              std::to_string(heads) + "; choose heads that divide hidden");
        if (dropout < 0 || dropout >= 1)
            throw usage_error("gpt_config: dropout " + std::to_string(dropout) + " must lie in [0, 1)");
    }

    // Weights and biases, counted from the architecture (tests compare with the graph).
    std::int64_t parameter_count() const {
        const std::int64_t h = hidden, f = ffn_size();
        std::int64_t per_block = 2 * 2 * h            // two layer norms
                                 + 4 * (h * h + h)    // q, k, v, proj
                                 + (f * h + f) + (h * f + h);
        return vocab * h + seq * h + layers * per_block + 2 * h + (tie_embeddings ? 0 : vocab * h);
    }

    // Floating-point operations of one forward pass over one batch (GEMMs and attention).
    double forward_flops() const {
        const double tokens = static_cast<double>(batch * seq), h = static_cast<double>(hidden),
                     f = static_cast<double>(ffn_size()), s = static_cast<double>(seq);
        const double per_layer = 2 * tokens * (4 * h * h + 2 * h * f) + 2 * tokens * s * h;  // causal: half of 4*T*S*H
        return static_cast<double>(layers) * per_layer + 2 * tokens * h * static_cast<double>(vocab);
    }
};

// A built GPT: the graph builder and the ids of the tensors a trainer feeds and reads.
struct gpt_model {
    std::unique_ptr<graph_builder> builder;
    gpt_config config;
    tensor_id tokens = no_id, positions = no_id, targets = no_id, logits = no_id, loss = no_id;

    const graph& ir() const { return builder->view(); }

    // Appends the backward pass and hands the finished graph over.
    graph training_graph() && {
        build_backward(*builder);
        return std::move(*builder).take();
    }
};

namespace detail {

LOOM_INLINE tensor layer_norm_block(graph_builder& b, const std::string& scope, tensor x, const gpt_config& c);

LOOM_INLINE tensor dense(graph_builder& b, const std::string& scope, tensor x, dim_id out_dim, std::int64_t out, dim_id in_dim,
                         std::int64_t in, double std);

inline tensor maybe_dropout(tensor x, const gpt_config& c, std::uint64_t& site) {
    ++site;
    if (c.dropout == 0) return x;
    return ops::dropout(x, c.dropout, static_cast<std::int64_t>(c.dropout_seed * 1000003 + site));
}

}  // namespace detail

LOOM_INLINE gpt_model gpt(const gpt_config& c);

// Position ids for one batch: row-major [batch, seq], each row 0, 1, ..., seq - 1.
inline std::vector<std::int32_t> gpt_positions(const gpt_config& c) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(c.batch * c.seq));
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(static_cast<std::int64_t>(i) % c.seq);
    return ids;
}

}  // namespace loom::models

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::models::detail {

LOOM_INLINE tensor layer_norm_block(graph_builder& b, const std::string& scope, tensor x, const gpt_config& c) {
    auto s = b.scope(scope);
    auto gamma = b.parameter("weight", {{Dim::Hidden::id, c.hidden}}, parameter_init::ones());
    auto beta = b.parameter("bias", {{Dim::Hidden::id, c.hidden}}, parameter_init::zeros());
    return ops::layer_norm(x, gamma, beta, c.layer_norm_eps);
}

LOOM_INLINE tensor dense(graph_builder& b, const std::string& scope, tensor x, dim_id out_dim, std::int64_t out, dim_id in_dim,
                         std::int64_t in, double std) {
    auto s = b.scope(scope);
    auto w = b.parameter("weight", {{out_dim, out}, {in_dim, in}}, parameter_init::normal(std));
    auto bias = b.parameter("bias", {{out_dim, out}}, parameter_init::zeros());
    return ops::linear(x, w, bias);
}
}  // namespace loom::models::detail

namespace loom::models {

LOOM_INLINE gpt_model gpt(const gpt_config& c) {
    c.validate();
    gpt_model m;
    m.config = c;
    m.builder = std::make_unique<graph_builder>();
    graph_builder& b = *m.builder;
    const dim_id H = Dim::Hidden::id, F = Dim::FFN::id;
    const double proj_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.layers));
    std::uint64_t dropout_site = 0;

    tensor tokens = b.input("tokens", {{Dim::Batch::id, c.batch}, {Dim::Seq::id, c.seq}}, value_kind::index);
    tensor positions = b.input("positions", {{Dim::Batch::id, c.batch}, {Dim::Seq::id, c.seq}}, value_kind::index);
    tensor targets = b.input("targets", {{Dim::Batch::id, c.batch}, {Dim::Seq::id, c.seq}}, value_kind::index);
    tensor wte = b.parameter("wte", {{Dim::Vocab::id, c.vocab}, {H, c.hidden}}, parameter_init::normal(c.init_std));
    tensor wpe = b.parameter("wpe", {{Dim::Seq::id, c.seq}, {H, c.hidden}}, parameter_init::normal(c.init_std));

    tensor x = ops::embedding(tokens, wte) + ops::embedding(positions, wpe);
    x = detail::maybe_dropout(x, c, dropout_site);

    b.repeat("blocks", c.layers, [&](std::int64_t) {
        {
            tensor h = detail::layer_norm_block(b, "ln_1", x, c);
            auto attn = b.scope("attn");
            tensor q = ops::split_heads(detail::dense(b, "q", h, H, c.hidden, H, c.hidden, c.init_std), c.heads);
            tensor k = ops::split_heads(detail::dense(b, "k", h, H, c.hidden, H, c.hidden, c.init_std), c.heads);
            tensor v = ops::split_heads(detail::dense(b, "v", h, H, c.hidden, H, c.hidden, c.init_std), c.heads);
            tensor a = ops::merge_heads(ops::causal_attention(q, k, v));
            tensor o = detail::dense(b, "proj", a, H, c.hidden, H, c.hidden, proj_std);
            x = x + detail::maybe_dropout(o, c, dropout_site);
        }
        {
            tensor h = detail::layer_norm_block(b, "ln_2", x, c);
            auto mlp = b.scope("mlp");
            tensor f = ops::gelu(detail::dense(b, "fc", h, F, c.ffn_size(), H, c.hidden, c.init_std));
            tensor o = detail::dense(b, "proj", f, H, c.hidden, F, c.ffn_size(), proj_std);
            x = x + detail::maybe_dropout(o, c, dropout_site);
        }
    });

    x = detail::layer_norm_block(b, "ln_f", x, c);
    tensor head = wte;
    if (!c.tie_embeddings)
        head = b.parameter("lm_head", {{Dim::Vocab::id, c.vocab}, {H, c.hidden}}, parameter_init::normal(c.init_std));
    tensor logits = ops::linear(x, head);
    tensor loss = ops::cross_entropy(logits, targets);
    b.set_loss(loss);

    m.tokens = tokens.id;
    m.positions = positions.id;
    m.targets = targets.id;
    m.logits = logits.id;
    m.loss = loss.id;
    return m;
}

}  // namespace loom::models
#endif  // LOOM_HEADER_DEFINITIONS
