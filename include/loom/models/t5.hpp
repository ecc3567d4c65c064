#pragma once
// T5, the encoder-decoder transformer, with one embedding table shared by the encoder input,
// the decoder input and the LM head; built with the public op API only. nnScaler's language
// workload (Table 9; §4.2 "Constraints for T5"): the multilingual vocabulary makes the shared
// table large, and the interlaced pipeline splits it over every device while the layers are
// staged.
//
//   src = shared[source] + encoder_positions[source_positions]       [batch, source_seq, hidden]
//   tgt = shared[target_in] + decoder_positions[target_positions]    [batch, target_seq, hidden]
//   encoder.i:  x = x + attn(ln_1(x))                                full self-attention
//               x = x + mlp(ln_2(x))
//   decoder.j:  y = y + attn(ln_1(y))                                causal self-attention
//               y = y + cross_attn(ln_cross(y), memory_norm(x))      queries from y, keys and values
//               y = y + mlp(ln_2(y))                                 from the encoder output x
//   mlp:        proj(gelu(fc(h)) * gate(h))                          mT5's gated GELU, fc and gate ffn wide
//   logits = (final_norm(y) / sqrt(hidden)) shared^T                 T5's rescaling of a tied head
//   loss = mean cross-entropy(logits, targets)
//
// As in T5: pre-norm residual blocks, RMS norms with a gain and no bias, linear layers without
// biases, a tied head. Left out of T5: the relative position biases (loom's attention takes no
// bias; learned absolute positions, as GPT's, stand in for them, so "source_positions" and
// "target_positions" are inputs) and dropout. Initialisation: N(0, init_std) weights, output
// projections N(0, init_std / sqrt(2 * layers)), unit norm gains.
//
// Layers. The blocks form ONE repeat, "blocks": encoder.0 .. encoder.{E-1} are its layers
// 0 .. E-1 and decoder.0 .. decoder.{D-1} its layers E .. E+D-1 (scope paths keep the stack
// and the index within it; the repeat's index is the position in the whole model). Why one:
// search::layers_from_scopes folds the largest recorded repeat only, so with two repeats
// ("encoder", "decoder") it would take one stack as the layers and leave the other stack in
// the prologue or the epilogue, one opaque layer the searcher can neither fold nor cut. With
// one repeat it finds E + D layers in two classes (encoder block, decoder block), and plans
// that select "blocks" (plan::stages' default, on_layers<"blocks", a, b>) stage both stacks.
// For the same reason nothing sits between the stacks: T5 normalises the encoder output once
// (its encoder's final norm); here each decoder layer does (cross_attn.memory_norm), which
// keeps the decoder layers identical and adds hidden parameters per decoder layer. A node
// outside every layer but after the first would land in the epilogue.
//
// Every forward op keeps Batch as its leading, splittable dim (no reshape), so data-parallel
// plans split every op. The source and target sequences are both Dim::Seq.
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

struct t5_config {
    std::int64_t encoder_layers = 2;
    std::int64_t decoder_layers = 2;
    std::int64_t hidden = 64;
    std::int64_t heads = 4;
    std::int64_t ffn = 0;  // width of fc and gate; 0: 4 * hidden
    std::int64_t vocab = 256;
    std::int64_t source_seq = 32;
    std::int64_t target_seq = 32;
    std::int64_t batch = 4;
    double init_std = 0.02;
    double norm_eps = 1e-6;

    std::int64_t ffn_size() const { return ffn > 0 ? ffn : 4 * hidden; }
    std::int64_t layers() const { return encoder_layers + decoder_layers; }

    void validate() const {
        auto positive = [](std::int64_t v, const char* what) {
            if (v <= 0)
                throw usage_error(std::string("t5_config: ") + what + " is " + std::to_string(v) +
                                  "; it must be positive");
        };
        positive(encoder_layers, "encoder_layers");
        positive(decoder_layers, "decoder_layers");
        positive(hidden, "hidden");
        positive(heads, "heads");
        positive(source_seq, "source_seq");
        positive(target_seq, "target_seq");
        positive(batch, "batch");
        if (ffn < 0)
            throw usage_error("t5_config: ffn is " + std::to_string(ffn) +
                              "; pass a positive width, or 0 for 4 * hidden");
        if (hidden % heads != 0)
            throw usage_error("t5_config: hidden " + std::to_string(hidden) + " is not divisible by heads " +
                              std::to_string(heads) + "; choose heads that divide hidden");
        if (vocab < 2)
            throw usage_error("t5_config: vocab is " + std::to_string(vocab) +
                              "; it needs the start token 0 and at least one other token");
        if (!(init_std > 0))
            throw usage_error("t5_config: init_std is " + std::to_string(init_std) + "; it must be positive");
        if (!(norm_eps > 0))
            throw usage_error("t5_config: norm_eps is " + std::to_string(norm_eps) + "; it must be positive");
    }

    // Weights and gains, counted from the architecture (tests compare with the graph).
    std::int64_t parameter_count() const {
        const std::int64_t h = hidden, f = ffn_size();
        const std::int64_t attention = 4 * h * h, mlp = 3 * h * f;
        const std::int64_t encoder_block = 2 * h + attention + mlp;      // ln_1, ln_2
        const std::int64_t decoder_block = 4 * h + 2 * attention + mlp;  // ln_1, ln_cross, memory_norm, ln_2
        return vocab * h + (source_seq + target_seq) * h + encoder_layers * encoder_block +
               decoder_layers * decoder_block + h;
    }
};

// A built T5: the graph builder and the ids of the tensors a trainer feeds and reads.
struct t5_model {
    std::unique_ptr<graph_builder> builder;
    t5_config config;
    // Index inputs: "source" [batch, source_seq] and "target_in" [batch, target_seq] tokens
    // (target_in is the targets shifted right behind the start token 0), "targets"
    // [batch, target_seq], "source_positions" and "target_positions" (0, 1, ... per row).
    tensor_id source = no_id, target_in = no_id, targets = no_id;
    tensor_id source_positions = no_id, target_positions = no_id;
    tensor_id encoder_output = no_id, logits = no_id, loss = no_id;

    const graph& ir() const { return builder->view(); }

    // Appends the backward pass and hands the finished graph over.
    graph training_graph() && {
        build_backward(*builder);
        return std::move(*builder).take();
    }
};

namespace detail::t5 {

struct builder_context {
    graph_builder& b;
    const t5_config& c;
    double proj_std;

    tensor rms_norm(const std::string& scope, tensor x) const {
        auto s = b.scope(scope);
        tensor gain = b.parameter("weight", {{Dim::Hidden::id, c.hidden}}, parameter_init::ones());
        return ops::rms_norm(x, gain, c.norm_eps);
    }

    tensor dense(const std::string& scope, tensor x, dim_id out_dim, std::int64_t out, dim_id in_dim, std::int64_t in,
                 double std) const {
        auto s = b.scope(scope);
        return ops::linear(x, b.parameter("weight", {{out_dim, out}, {in_dim, in}}, parameter_init::normal(std)));
    }

    // Multi-head attention of queries from `h` over keys and values from `memory`.
    tensor attention(const std::string& scope, tensor h, tensor memory, bool causal) const {
        auto s = b.scope(scope);
        const dim_id H = Dim::Hidden::id;
        tensor q = ops::split_heads(dense("q", h, H, c.hidden, H, c.hidden, c.init_std), c.heads);
        tensor k = ops::split_heads(dense("k", memory, H, c.hidden, H, c.hidden, c.init_std), c.heads);
        tensor v = ops::split_heads(dense("v", memory, H, c.hidden, H, c.hidden, c.init_std), c.heads);
        tensor a = ops::merge_heads(causal ? ops::causal_attention(q, k, v) : ops::attention(q, k, v));
        return dense("proj", a, H, c.hidden, H, c.hidden, proj_std);
    }

    tensor mlp(tensor h) const {
        auto s = b.scope("mlp");
        const dim_id H = Dim::Hidden::id, F = Dim::FFN::id;
        const std::int64_t f = c.ffn_size();
        tensor gated =
            ops::gelu(dense("fc", h, F, f, H, c.hidden, c.init_std)) * dense("gate", h, F, f, H, c.hidden, c.init_std);
        return dense("proj", gated, H, c.hidden, F, f, proj_std);
    }

    tensor encoder_block(tensor x) const {
        tensor h = rms_norm("ln_1", x);
        x = x + attention("attn", h, h, false);
        return x + mlp(rms_norm("ln_2", x));
    }

    tensor decoder_block(tensor y, tensor encoder_output) const {
        tensor h = rms_norm("ln_1", y);
        y = y + attention("attn", h, h, true);
        tensor memory;
        {
            auto s = b.scope("cross_attn");
            memory = rms_norm("memory_norm", encoder_output);
        }
        y = y + attention("cross_attn", rms_norm("ln_cross", y), memory, false);
        return y + mlp(rms_norm("ln_2", y));
    }
};

}  // namespace detail::t5

LOOM_INLINE t5_model t5(const t5_config& c);

// A deterministic synthetic batch from `seed`, for tests and demos (no downloads): source
// tokens uniform in [1, vocab), the targets the source reversed (position t of the target
// is position source_seq - 1 - t of the source, cyclically when target_seq > source_seq),
// target_in the targets shifted right behind the start token 0, and positions 0, 1, ... .
// All row-major [batch, seq].
struct t5_batch {
    std::vector<std::int32_t> source, target_in, targets, source_positions, target_positions;
};

LOOM_INLINE t5_batch t5_synthetic_batch(const t5_config& c, std::uint64_t seed);

// The four T5 configurations of nnScaler's Table 9 (index 0 .. 3: 3.9B, 11B, 21B and 47B
// parameters; 48, 64, 64, 64 layers; hidden 2K, 3K, 4K, 6K; 32, 48, 64, 96 heads), at batch 1.
// Table 9 gives only those; the rest is chosen here: mT5's vocabulary (250112 tokens, the
// table the interlaced pipeline splits), the layers split evenly between encoder and decoder,
// ffn = 4 * hidden in the gated GELU (three hidden x ffn matrices, as mT5's), sequences of 1024.
// The counts then come to 4.14B, 11.6B, 20.4B and 45.0B (tests check them against the paper's).
inline t5_config t5_table9(int index) {
    struct row {
        std::int64_t layers, hidden, heads;
    };
    static constexpr row rows[] = {{48, 2048, 32}, {64, 3072, 48}, {64, 4096, 64}, {64, 6144, 96}};
    if (index < 0 || index >= 4)
        throw usage_error("t5_table9: index " + std::to_string(index) +
                          " is out of range; Table 9 lists configurations 0 to 3");
    const row& r = rows[index];
    t5_config c;
    c.encoder_layers = r.layers / 2;
    c.decoder_layers = r.layers / 2;
    c.hidden = r.hidden;
    c.heads = r.heads;
    c.ffn = 4 * r.hidden;
    c.vocab = 250112;
    c.source_seq = 1024;
    c.target_seq = 1024;
    c.batch = 1;
    return c;
}

// Table 9's label of configuration `index`, its parameter count as the paper prints it.
inline const char* t5_table9_name(int index) {
    static constexpr const char* names[] = {"3.9B", "11B", "21B", "47B"};
    if (index < 0 || index >= 4)
        throw usage_error("t5_table9_name: index " + std::to_string(index) +
                          " is out of range; Table 9 lists configurations 0 to 3");
    return names[index];
}

}  // namespace loom::models

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::models {

LOOM_INLINE t5_model t5(const t5_config& c) {
    c.validate();
    t5_model m;
    m.config = c;
    m.builder = std::make_unique<graph_builder>();
    graph_builder& b = *m.builder;
    const dim_id B = Dim::Batch::id, S = Dim::Seq::id, H = Dim::Hidden::id;
    const detail::t5::builder_context ctx{b, c, c.init_std / std::sqrt(2.0 * static_cast<double>(c.layers()))};

    tensor source = b.input("source", {{B, c.batch}, {S, c.source_seq}}, value_kind::index);
    tensor target_in = b.input("target_in", {{B, c.batch}, {S, c.target_seq}}, value_kind::index);
    tensor targets = b.input("targets", {{B, c.batch}, {S, c.target_seq}}, value_kind::index);
    tensor source_positions = b.input("source_positions", {{B, c.batch}, {S, c.source_seq}}, value_kind::index);
    tensor target_positions = b.input("target_positions", {{B, c.batch}, {S, c.target_seq}}, value_kind::index);
    tensor shared =
        b.parameter("shared", {{Dim::Vocab::id, c.vocab}, {H, c.hidden}}, parameter_init::normal(c.init_std));
    tensor encoder_positions =
        b.parameter("encoder_positions", {{S, c.source_seq}, {H, c.hidden}}, parameter_init::normal(c.init_std));
    tensor decoder_positions =
        b.parameter("decoder_positions", {{S, c.target_seq}, {H, c.hidden}}, parameter_init::normal(c.init_std));

    // Both lookups come before the first layer: the prologue holds every use of the table
    // but the head's.
    tensor x = ops::embedding(source, shared) + ops::embedding(source_positions, encoder_positions);
    tensor y = ops::embedding(target_in, shared) + ops::embedding(target_positions, decoder_positions);

    std::vector<std::string> layers;
    for (std::int64_t i = 0; i < c.encoder_layers; ++i) {
        auto s = b.scope("encoder", i);
        x = ctx.encoder_block(x);
        layers.push_back("encoder." + std::to_string(i));
    }
    for (std::int64_t j = 0; j < c.decoder_layers; ++j) {
        auto s = b.scope("decoder", j);
        y = ctx.decoder_block(y, x);
        layers.push_back("decoder." + std::to_string(j));
    }
    record_layers(b, "blocks", layers);

    y = ops::scale(ctx.rms_norm("final_norm", y), 1.0 / std::sqrt(static_cast<double>(c.hidden)));
    tensor logits = ops::linear(y, shared);
    tensor loss = ops::cross_entropy(logits, targets);
    b.set_loss(loss);

    m.source = source.id;
    m.target_in = target_in.id;
    m.targets = targets.id;
    m.source_positions = source_positions.id;
    m.target_positions = target_positions.id;
    m.encoder_output = x.id;
    m.logits = logits.id;
    m.loss = loss.id;
    return m;
}

LOOM_INLINE t5_batch t5_synthetic_batch(const t5_config& c, std::uint64_t seed) {
    c.validate();
    std::uint64_t counter = 0;
    auto token = [&] {  // uniform in [1, vocab)
        const auto u = static_cast<double>(splitmix64(seed * 0x9e3779b97f4a7c15ull + counter++) >> 11) * 0x1.0p-53;
        const auto k = static_cast<std::int64_t>(u * static_cast<double>(c.vocab - 1));
        return static_cast<std::int32_t>(1 + std::min<std::int64_t>(k, c.vocab - 2));
    };
    t5_batch out;
    for (std::int64_t r = 0; r < c.batch; ++r) {
        std::vector<std::int32_t> row(static_cast<std::size_t>(c.source_seq));
        for (auto& t : row) t = token();
        out.source.insert(out.source.end(), row.begin(), row.end());
        for (std::int64_t i = 0; i < c.source_seq; ++i) out.source_positions.push_back(static_cast<std::int32_t>(i));
        for (std::int64_t t = 0; t < c.target_seq; ++t) {
            const std::int64_t from = ((c.source_seq - 1 - t) % c.source_seq + c.source_seq) % c.source_seq;
            out.target_in.push_back(t == 0 ? 0 : out.targets.back());
            out.targets.push_back(row[static_cast<std::size_t>(from)]);
            out.target_positions.push_back(static_cast<std::int32_t>(t));
        }
    }
    return out;
}

}  // namespace loom::models
#endif  // LOOM_HEADER_DEFINITIONS
