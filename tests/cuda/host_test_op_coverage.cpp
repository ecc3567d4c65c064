// What the CUDA backend can run, checked without a GPU: every op of a GPT training graph
// has a CUDA kernel, and a bf16 program keeps the outputs that need float in float.
#include <set>
#include <string>

#include <catch2/catch.hpp>

#include <loom/models/gpt.hpp>
#include <loom/runtime/compile.hpp>
#include <loom/runtime/cuda/op_kernels.hpp>

using namespace loom;

TEST_CASE("every op of a GPT training graph has a CUDA kernel", "[cuda][coverage]") {
    const graph g = models::gpt({.layers = 2, .hidden = 128, .heads = 2, .vocab = 97, .seq = 16, .batch = 2})
                        .training_graph();
    std::set<std::string> missing;
    for (const node& n : g.nodes)
        if (!n.op->communication && !cuda::find_op_kernel<float>(n.op->name)) missing.insert(std::string(n.op->name));
    INFO("ops without a CUDA kernel: " << [&] {
        std::string all;
        for (const auto& m : missing) all += m + " ";
        return all;
    }());
    CHECK(missing.empty());
    for (const node& n : g.nodes)
        if (!n.op->communication) CHECK(cuda::find_op_kernel<bfloat16>(n.op->name) != nullptr);
    CHECK(cuda::find_op_kernel<float>("no_such_op") == nullptr);
}

TEST_CASE("a bf16 program stores tensors in bf16 and keeps lse and the loss in float", "[cuda][precision]") {
    const graph g = models::gpt({.layers = 1, .hidden = 128, .heads = 2, .vocab = 97, .seq = 16, .batch = 2})
                        .training_graph();
    const program f32 = compile_program(g, {.prec = precision::f32});
    const program bf16 = compile_program(g, {.prec = precision::bf16});
    int lse_seen = 0;
    for (std::size_t t = 0; t < g.tensors.size(); ++t) {
        const tensor_desc& d = g.tensors[t];
        if (bf16.buffers[t].bytes == 0) continue;  // not in the program
        const std::int64_t n = d.dims.numel();
        const bool is_lse = d.producer != no_id && is_op<ops::Attention>(g.at(d.producer)) &&
                            g.at(d.producer).outputs[1] == static_cast<tensor_id>(t);
        const bool is_loss = static_cast<tensor_id>(t) == g.loss;
        lse_seen += is_lse;
        INFO("tensor " << d.name);
        if (d.kind == value_kind::index) CHECK(bf16.buffers[t].bytes == 4 * n);
        else if (is_lse || is_loss) CHECK(bf16.buffers[t].bytes == 4 * n);
        else CHECK(bf16.buffers[t].bytes == 2 * n);
        CHECK(f32.buffers[t].bytes == 4 * n);
    }
    CHECK(lse_seen == 1);
    CHECK(bf16.arena_bytes < f32.arena_bytes);
}
