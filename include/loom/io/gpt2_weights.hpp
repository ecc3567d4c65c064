#pragma once
// Hugging Face GPT-2 checkpoints (model.safetensors of "gpt2", "gpt2-medium", ...) to and
// from loom's GPT (models/gpt.hpp), so that GPT-2 weights can be fine-tuned with loom and
// loom's weights opened by the transformers library.
//
// Names and layouts (L layers, H hidden, F = 4 H, V vocabulary, P positions):
//   GPT-2                        shape        loom                          shape
//   wte.weight                   [V, H]       wte                           [V, H]
//   wpe.weight                   [P, H]       wpe                           [seq, H]  (first seq rows)
//   h.i.ln_1.{weight,bias}       [H]          blocks.i.ln_1.{weight,bias}   [H]
//   h.i.attn.c_attn.weight       [H, 3H]      blocks.i.attn.{q,k,v}.weight  [H, H] each, transposed
//   h.i.attn.c_attn.bias         [3H]         blocks.i.attn.{q,k,v}.bias    [H] each
//   h.i.attn.c_proj.weight       [H, H]       blocks.i.attn.proj.weight     [H, H] transposed
//   h.i.ln_2.{weight,bias}       [H]          blocks.i.ln_2.{weight,bias}   [H]
//   h.i.mlp.c_fc.weight          [H, F]       blocks.i.mlp.fc.weight        [F, H] transposed
//   h.i.mlp.c_proj.weight        [F, H]       blocks.i.mlp.proj.weight      [H, F] transposed
//   ln_f.{weight,bias}           [H]          ln_f.{weight,bias}            [H]
//   (lm_head.weight              [V, H]       lm_head, only when not tied   [V, H])
// GPT-2's Conv1D stores weights [in, out] (y = x W + b); loom's linear stores [out, in]
// (y = x W^T + b), so every matrix is transposed on the way. c_attn packs q, k and v side
// by side along its output columns.
//
// What is the same: pre-norm blocks, LayerNorm eps 1e-5 (gpt_config::layer_norm_eps),
// GELU's tanh form ("gelu_new"), 1/sqrt(head size) attention scaling, tied embeddings,
// biases everywhere. What differs, and how it is handled:
//  - loom's wpe has one row per position of its sequence length: import takes the first
//    `seq` rows (and refuses a file with fewer positions); export writes `seq` rows, so the
//    exported model's n_positions is loom's seq.
//  - GPT-2 also applies dropout to attention probabilities; loom's GPT drops out after the
//    embeddings, the attention projection and the MLP only. This matters only for training
//    with dropout on, never for the weights or for inference.
//  - The causal-mask buffers some files carry (h.i.attn.bias, h.i.attn.masked_bias) are not
//    weights and are skipped; a "transformer." prefix (GPT2LMHeadModel) is accepted.
// Every mismatch (layers, hidden, vocabulary, a missing tensor, an untied head for a tied
// model) is a loom::data_error naming the file, the tensor and the fix.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/models/gpt.hpp>

namespace loom::io {

namespace detail {

// [rows, cols] row-major -> [cols, rows] row-major.
LOOM_INLINE std::vector<double> transposed(const std::vector<double>& m, std::int64_t rows, std::int64_t cols);

class gpt2_reader {
public:
    explicit gpt2_reader(const std::filesystem::path& path) : file_(path) {
        for (const auto& n : file_.names())
            if (n.rfind("transformer.", 0) == 0) prefix_ = "transformer.";
    }

    bool has(const std::string& name) const { return file_.contains(prefix_ + name) || (name == "lm_head.weight" && file_.contains(name)); }

    const tensor_info& info(const std::string& name) const {
        const std::string full = file_.contains(prefix_ + name) ? prefix_ + name : name;
        if (!file_.contains(full))
            fail("has no tensor '" + prefix_ + name + "'; it is not a GPT-2 checkpoint of this depth, or it was "
                 "saved by another model class; export GPT-2's state_dict with safetensors");
        return file_.info(full);
    }

    // The tensor as doubles, checked against the shape loom's configuration implies.
    std::vector<double> read(const std::string& name, const std::vector<std::int64_t>& shape,
                             const std::string& hint) const {
        const tensor_info& t = info(name);
        if (t.shape != shape)
            fail("holds '" + name + "' with shape " + shape_text(t.shape) + " but loom's GPT expects " +
                 shape_text(shape) + "; " + hint);
        const std::string full = file_.contains(prefix_ + name) ? prefix_ + name : name;
        switch (t.dtype) {
            case dtype::f32: {
                auto v = file_.read<float>(full);
                return {v.begin(), v.end()};
            }
            case dtype::f64: return file_.read<double>(full);
            default:
                fail("stores '" + name + "' as " + std::string(dtype_name(t.dtype)) +
                     "; loom imports F32 or F64 GPT-2 weights: convert with model.float() before saving");
        }
        return {};
    }

    [[noreturn]] void fail(const std::string& what) const {
        throw data_error("GPT-2 checkpoint '" + file_.path().string() + "' " + what);
    }

    static std::string shape_text(const std::vector<std::int64_t>& s) {
        std::string t = "[";
        for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
        return t + "]";
    }

    int layers_in_file() const {
        int n = 0;
        while (has("h." + std::to_string(n) + ".ln_1.weight")) ++n;
        return n;
    }

private:
    safetensors_file file_;
    std::string prefix_;
};

}  // namespace detail

// The GPT-2 file's weights in loom's names and layouts (as doubles), for a model built with
// `c`. Throws loom::data_error when the file does not fit the configuration.
LOOM_INLINE std::map<std::string, std::vector<double>> read_gpt2_weights(const std::filesystem::path& path,
                                                                         const models::gpt_config& c);

// Writes loom GPT weights (`parameter(name)` returns loom's tensor `name`, row-major, in
// loom's layout) as a GPT-2 safetensors file, in dtype `type` (F32, as GPT-2 ships, or F64).
template <class Get>
void write_gpt2_weights(const std::filesystem::path& path, const models::gpt_config& c, Get&& parameter,
                        dtype type = dtype::f32) {
    if (type != dtype::f32 && type != dtype::f64)
        throw usage_error("write_gpt2_weights: dtype " + std::string(dtype_name(type)) + " is not F32 or F64; pick one");
    const std::int64_t H = c.hidden, F = c.ffn_size(), V = c.vocab;
    safetensors_writer w;
    auto get = [&](const std::string& name) {
        const auto v = parameter(name);
        return std::vector<double>(v.begin(), v.end());
    };
    auto add = [&](const std::string& name, std::vector<std::int64_t> shape, const std::vector<double>& v) {
        if (type == dtype::f64)
            w.add(name, type, std::move(shape), v);
        else
            w.add(name, type, std::move(shape), std::vector<float>(v.begin(), v.end()));
    };
    add("wte.weight", {V, H}, get("wte"));
    add("wpe.weight", {c.seq, H}, get("wpe"));
    for (std::int64_t i = 0; i < c.layers; ++i) {
        const std::string g = "h." + std::to_string(i) + ".", l = "blocks." + std::to_string(i) + ".";
        for (const char* ln : {"ln_1", "ln_2"}) {
            add(g + ln + ".weight", {H}, get(l + ln + ".weight"));
            add(g + ln + ".bias", {H}, get(l + ln + ".bias"));
        }
        std::vector<double> qkv, qkv_bias;
        for (const char* p : {"q", "k", "v"}) {
            const auto wp = get(l + "attn." + p + ".weight");
            const auto bp = get(l + "attn." + p + ".bias");
            qkv.insert(qkv.end(), wp.begin(), wp.end());
            qkv_bias.insert(qkv_bias.end(), bp.begin(), bp.end());
        }
        add(g + "attn.c_attn.weight", {H, 3 * H}, detail::transposed(qkv, 3 * H, H));
        add(g + "attn.c_attn.bias", {3 * H}, qkv_bias);
        add(g + "attn.c_proj.weight", {H, H}, detail::transposed(get(l + "attn.proj.weight"), H, H));
        add(g + "attn.c_proj.bias", {H}, get(l + "attn.proj.bias"));
        add(g + "mlp.c_fc.weight", {H, F}, detail::transposed(get(l + "mlp.fc.weight"), F, H));
        add(g + "mlp.c_fc.bias", {F}, get(l + "mlp.fc.bias"));
        add(g + "mlp.c_proj.weight", {F, H}, detail::transposed(get(l + "mlp.proj.weight"), H, F));
        add(g + "mlp.c_proj.bias", {H}, get(l + "mlp.proj.bias"));
    }
    add("ln_f.weight", {H}, get("ln_f.weight"));
    add("ln_f.bias", {H}, get("ln_f.bias"));
    if (!c.tie_embeddings) add("lm_head.weight", {V, H}, get("lm_head"));
    w.metadata("format", "pt");
    w.write(path);
}

}  // namespace loom::io

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::io::detail {

LOOM_INLINE std::vector<double> transposed(const std::vector<double>& m, std::int64_t rows, std::int64_t cols) {
    std::vector<double> t(m.size());
    for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c)
            t[static_cast<std::size_t>(c * rows + r)] = m[static_cast<std::size_t>(r * cols + c)];
    return t;
}
}  // namespace loom::io::detail

namespace loom::io {

LOOM_INLINE std::map<std::string, std::vector<double>> read_gpt2_weights(const std::filesystem::path& path,
                                                                         const models::gpt_config& c) {
    detail::gpt2_reader f(path);
    const std::int64_t H = c.hidden, F = c.ffn_size(), V = c.vocab;
    const int layers = f.layers_in_file();
    if (layers != c.layers)
        f.fail("has " + std::to_string(layers) + " layers (h.0 ... h." + std::to_string(layers - 1) +
               ") but the loom model has " + std::to_string(c.layers) + "; build it with gpt_config::layers = " +
               std::to_string(layers));
    const auto& wte = f.info("wte.weight");
    if (wte.shape.size() != 2 || wte.shape[0] != V || wte.shape[1] != H)
        f.fail("has wte.weight " + detail::gpt2_reader::shape_text(wte.shape) + " (vocabulary x hidden) but the loom model has [" +
               std::to_string(V) + ", " + std::to_string(H) + "]; set gpt_config::vocab and hidden to the file's");
    const auto& wpe = f.info("wpe.weight");
    if (wpe.shape.size() != 2 || wpe.shape[0] < c.seq)
        f.fail("has wpe.weight " + detail::gpt2_reader::shape_text(wpe.shape) + ", fewer positions than the loom model's seq " +
               std::to_string(c.seq) + "; use gpt_config::seq <= " + (wpe.shape.empty() ? "0" : std::to_string(wpe.shape[0])));

    const std::string layout = "the file and the loom configuration disagree: set gpt_config to the file's dimensions";
    std::map<std::string, std::vector<double>> out;
    out["wte"] = f.read("wte.weight", {V, H}, layout);
    auto positions = f.read("wpe.weight", wpe.shape, layout);
    positions.resize(static_cast<std::size_t>(c.seq * H));
    out["wpe"] = std::move(positions);
    for (int i = 0; i < layers; ++i) {
        const std::string g = "h." + std::to_string(i) + ".", l = "blocks." + std::to_string(i) + ".";
        for (const char* ln : {"ln_1", "ln_2"}) {
            out[l + ln + ".weight"] = f.read(g + ln + ".weight", {H}, layout);
            out[l + ln + ".bias"] = f.read(g + ln + ".bias", {H}, layout);
        }
        const auto qkv = detail::transposed(f.read(g + "attn.c_attn.weight", {H, 3 * H}, layout), H, 3 * H);  // [3H, H]
        const auto qkv_bias = f.read(g + "attn.c_attn.bias", {3 * H}, layout);
        const char* parts[] = {"q", "k", "v"};
        for (std::int64_t p = 0; p < 3; ++p) {
            out[l + "attn." + parts[p] + ".weight"] =
                std::vector<double>(qkv.begin() + p * H * H, qkv.begin() + (p + 1) * H * H);
            out[l + "attn." + parts[p] + ".bias"] = std::vector<double>(qkv_bias.begin() + p * H, qkv_bias.begin() + (p + 1) * H);
        }
        out[l + "attn.proj.weight"] = detail::transposed(f.read(g + "attn.c_proj.weight", {H, H}, layout), H, H);
        out[l + "attn.proj.bias"] = f.read(g + "attn.c_proj.bias", {H}, layout);
        out[l + "mlp.fc.weight"] = detail::transposed(f.read(g + "mlp.c_fc.weight", {H, F}, layout), H, F);
        out[l + "mlp.fc.bias"] = f.read(g + "mlp.c_fc.bias", {F}, layout);
        out[l + "mlp.proj.weight"] = detail::transposed(f.read(g + "mlp.c_proj.weight", {F, H}, layout), F, H);
        out[l + "mlp.proj.bias"] = f.read(g + "mlp.c_proj.bias", {H}, layout);
    }
    out["ln_f.weight"] = f.read("ln_f.weight", {H}, layout);
    out["ln_f.bias"] = f.read("ln_f.bias", {H}, layout);
    if (!c.tie_embeddings) {
        if (!f.has("lm_head.weight"))
            f.fail("has no lm_head.weight but the loom model has an untied head; build it with "
                   "gpt_config::tie_embeddings = true (GPT-2 ties its head to wte)");
        out["lm_head"] = f.read("lm_head.weight", {V, H}, layout);
    } else if (f.has("lm_head.weight") && f.read("lm_head.weight", {V, H}, layout) != out["wte"]) {
        f.fail("has an lm_head.weight that differs from wte.weight (an untied head) but the loom model ties them; "
               "build it with gpt_config::tie_embeddings = false");
    }
    return out;
}

}  // namespace loom::io
#endif  // LOOM_HEADER_DEFINITIONS
