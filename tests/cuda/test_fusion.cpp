// GEMM-epilogue fusion on the GPU: a GPT training program run by the fused executor (bias +
// GELU in the forward GEMM, GELU gradient + bias gradient in the backward one) and by the
// unfused one (a kernel per step) from the same inputs and parameters gives the same loss,
// logits, pre-activations, GELU outputs and gradients of every parameter, within the
// tolerances stated below; and the fused run is bit-identical run to run.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <loom/models/gpt.hpp>
#include <loom/runtime/compile.hpp>
#include <loom/runtime/cuda/executor.hpp>
#include <loom/train/init.hpp>

#include "support.hpp"

using namespace loom;
using namespace loom::cuda_test;

namespace {

// Head dim 64 (the GPU attention is built for 64 and 128), MLP width 256 (a multiple of 8, as
// the epilogue needs), 48 token rows.
models::gpt_config small_gpt() { return {.layers = 2, .hidden = 64, .heads = 1, .vocab = 97, .seq = 16, .batch = 3}; }

// Host bytes of every bound tensor: token ids, GPT's initial weights with random biases (the
// model starts them at zero, which would leave the bias epilogue untested), zeros elsewhere.
std::map<tensor_id, std::vector<std::byte>> host_values(const graph& g, const program& p) {
    const auto c = small_gpt();
    std::map<tensor_id, std::vector<std::byte>> out;
    std::uint64_t seed = 100;
    for (tensor_id t : p.bound) {
        const tensor_desc& d = g.tensor(t);
        std::vector<std::byte> bytes(static_cast<std::size_t>(p.bytes_of(t)));
        const auto n = static_cast<std::size_t>(d.dims.numel());
        if (d.kind == value_kind::index) {
            std::vector<std::int32_t> ids(n);
            for (std::size_t i = 0; i < n; ++i) {
                const auto at = static_cast<std::int64_t>(i);
                ids[i] = static_cast<std::int32_t>(d.name == "positions" ? at % c.seq
                                                   : d.name == "targets" ? (at * 7 + 10) % c.vocab
                                                                         : (at * 7 + 3) % c.vocab);
            }
            std::memcpy(bytes.data(), ids.data(), bytes.size());
        } else if (d.role == tensor_role::parameter) {
            std::vector<float> values(n);
            const bool bias = d.name.ends_with(".bias") && d.dims.rank() == 1;
            if (bias) values = random_vector<float>(n, seed++, -0.2f, 0.2f);
            else train::initialize(std::span<float>(values), d.init, 7, d.name);
            // Queries and keys 8 times GPT's initial scale, so that the scores spread over about
            // one unit: at the initial scale every row's softmax is nearly uniform, and the
            // query and key gradients are the small differences of nearly equal terms, which
            // one bf16 rounding more or less moves by a large part of themselves.
            if (d.name.ends_with(".attn.q.weight") || d.name.ends_with(".attn.k.weight"))
                for (float& x : values) x *= 8.0f;
            if (storage_precision(g, t, p.prec) == precision::bf16) {
                std::vector<bfloat16> narrow(values.begin(), values.end());
                std::memcpy(bytes.data(), narrow.data(), bytes.size());
            } else {
                std::memcpy(bytes.data(), values.data(), bytes.size());
            }
        }
        out.emplace(t, std::move(bytes));
    }
    return out;
}

// One executor with its own device copy of every bound tensor.
template <class T>
struct bound_run {
    cuda::executor<T> executor;
    std::map<tensor_id, cuda::device_buffer> storage;

    bound_run(const program& p, cuda::stream& s, cuda::gemm_engine& gemm, cuda::executor_options options,
              const std::map<tensor_id, std::vector<std::byte>>& values)
        : executor(p, s.get(), gemm, options) {
        for (const auto& [t, bytes] : values) {
            auto& buffer =
                storage.emplace(t, cuda::device_buffer(std::max<std::size_t>(bytes.size(), 256))).first->second;
            cuda::copy_to_device(buffer.get(), bytes.data(), bytes.size(), s.get());
            executor.bind(t, buffer.get());
        }
        s.synchronize();
    }

    std::vector<float> download(const program& p, tensor_id t) const {
        const auto n = static_cast<std::size_t>(p.source->tensor(t).dims.numel());
        std::vector<float> out(n);
        if (storage_precision(*p.source, t, p.prec) == precision::f32) {
            cuda::copy_to_host(out.data(), storage.at(t).get(), n * sizeof(float));
        } else {
            std::vector<bfloat16> narrow(n);
            cuda::copy_to_host(narrow.data(), storage.at(t).get(), n * sizeof(bfloat16));
            std::transform(narrow.begin(), narrow.end(), out.begin(), [](bfloat16 x) { return static_cast<float>(x); });
        }
        return out;
    }
};

template <class T>
void fused_matches_unfused(precision prec, double tolerance) {
    const auto c = small_gpt();
    auto model = models::gpt(c);
    const tensor_id logits = model.logits;
    const graph g = std::move(model).training_graph();
    // The forward's pre-activations (the aux output) and GELU outputs are read back too.
    std::vector<tensor_id> outputs = {logits};
    for (std::int64_t layer = 0; layer < c.layers; ++layer) {
        const std::string block = "blocks." + std::to_string(layer) + ".mlp";
        outputs.push_back(*g.find_tensor(block + ".fc/linear_bias"));
        outputs.push_back(*g.find_tensor(block + "/gelu"));
    }
    const program p = compile_program(g, {.prec = prec, .outputs = outputs});
    const auto values = host_values(g, p);

    cuda::stream stream;
    cuda::gemm_engine gemm;
    bound_run<T> fused(p, stream, gemm, {.fuse_backward = true}, values);
    bound_run<T> unfused(p, stream, gemm, {.fuse = false}, values);
    INFO(fused.executor.fusion().description());
    REQUIRE(fused.executor.fusion().count(cuda::gemm_epilogue::bias_gelu) == static_cast<std::size_t>(c.layers));
    REQUIRE(fused.executor.fusion().count(cuda::gemm_epilogue::dgelu_bgrad) == static_cast<std::size_t>(c.layers));
    REQUIRE(unfused.executor.fusion().empty());

    // The before-step hook sees every step index once, in order, absorbed steps included.
    std::vector<std::size_t> hooked;
    fused.executor.set_before_step([&](std::size_t s) { hooked.push_back(s); });
    fused.executor.run();
    unfused.executor.run();
    stream.synchronize();
    std::vector<std::size_t> every(p.steps.size());
    for (std::size_t s = 0; s < every.size(); ++s) every[s] = s;
    CHECK(hooked == every);
    fused.executor.set_before_step(nullptr);
    // The GEMM tests require these epilogues in bf16 at 16-byte rows; in float cuBLASLt may
    // have no kernel, and the group runs unfused (then this test compares equal programs).
    if (prec == precision::bf16) {
        CHECK(fused.executor.unfused_groups() == 0);
    } else if (fused.executor.unfused_groups() > 0) {
        WARN(fused.executor.unfused_groups() << " fused groups ran unfused: cuBLASLt has no float kernel for them");
    }

    // bf16: both programs are held against the same program in float (unfused, from the
    // same weights before their bf16 rounding).
    constexpr bool in_bf16 = std::is_same_v<T, bfloat16>;
    const program p32 = in_bf16 ? compile_program(g, {.prec = precision::f32, .outputs = outputs}) : program{};
    std::optional<bound_run<float>> reference;
    if constexpr (in_bf16) {
        reference.emplace(p32, stream, gemm, cuda::executor_options{.fuse = false}, host_values(g, p32));
        reference->executor.run();
        stream.synchronize();
    }

    std::size_t compared = 0;
    std::map<tensor_id, std::vector<float>> first_run;
    for (tensor_id t : p.bound) {
        if (g.tensor(t).producer == no_id) continue;  // inputs and parameters
        const auto want = unfused.download(p, t), got = fused.download(p, t);
        const std::string& name = g.tensor(t).name;
        // The key bias's gradient is zero in exact arithmetic (it shifts a row's scores by one
        // constant, which softmax ignores): both programs compute rounding noise of the sums
        // of the key gradient's rows. It is held to the scale of the key weight's gradient,
        // which sums the same rows weighted by the normalized inputs.
        const tensor_id scale_of =
            name.ends_with(".attn.k.bias") ? *g.find_tensor(name.substr(0, name.size() - 4) + "weight") : t;
        double largest = 0;
        for (float w : in_bf16 ? reference->download(p32, scale_of) : unfused.download(p, scale_of))
            largest = std::max(largest, static_cast<double>(std::fabs(w)));
        if constexpr (in_bf16) {
            const auto exact = reference->download(p32, t);
            double fused_off = 0, unfused_off = 0;
            for (std::size_t i = 0; i < exact.size(); ++i) {
                fused_off = std::max(fused_off, static_cast<double>(std::fabs(got[i] - exact[i])));
                unfused_off = std::max(unfused_off, static_cast<double>(std::fabs(want[i] - exact[i])));
            }
            INFO(name << ": off the float program by " << fused_off << " fused, " << unfused_off
                      << " unfused; largest element " << largest);
            CHECK(fused_off <= 1.5 * unfused_off + tolerance * largest);
        } else {
            require_close(got, want, 0.0, tolerance * largest + 1e-30, name);
        }
        first_run.emplace(t, got);
        ++compared;
    }
    CHECK(compared == g.gradients.size() + 2 * static_cast<std::size_t>(c.layers) + 2);  // + loss and logits

    // A second run of the fused program gives the same bits.
    fused.executor.run();
    stream.synchronize();
    for (const auto& [t, before] : first_run) {
        INFO(g.tensor(t).name);
        CHECK(fused.download(p, t) == before);
    }
}

}  // namespace

// Relative to each tensor's largest element. In float the two programs differ by the GEMM
// algorithm cuBLASLt chooses for each epilogue (summation order: about k 2^-24 relative) and
// by its GELU, which may use the hardware tanh approximation (relative error below 2^-10.9,
// see test_gemm.cpp): gelu moves by under 2.6e-4 |pre| and gelu' by under 6 times that for
// |pre| <= 3. 5e-3 lets that pass through two layers; a wrong operand, epilogue or launch
// position changes elements by their own size.
TEST_CASE("fused GEMM epilogues give the unfused program's results, float", "[cuda][fusion]") {
    fused_matches_unfused<float>(precision::f32, 5e-3);
}

// bf16 rounds differently on the two sides: the fused GELU reads the float pre-activation
// (not its bf16 rounding), the fused dGELU the float product (not the rounded gradient of
// the GELU's output), and the bias gradient sums unrounded values. One rounding (2^-8) per
// value either way; but the query and key gradients are differences of nearly equal terms,
// which one rounding moves by 10 to 20% of themselves on either side (seen on an H200). So
// each side is measured against the float program: the fused one may be off it by at most
// 1.5 times what the unfused one is, plus 2% of the tensor's largest element. A wrong operand,
// epilogue or launch position is off by elements' own size.
TEST_CASE("fused GEMM epilogues are as close to float as the unfused program, bf16", "[cuda][fusion][bf16]") {
    fused_matches_unfused<bfloat16>(precision::bf16, 2e-2);
}
