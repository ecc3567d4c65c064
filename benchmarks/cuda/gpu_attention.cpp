// loom's fused causal attention, forward plus backward, at GPT-2's shape, timed with CUDA
// events: the peer of F.scaled_dot_product_attention in benchmarks/cuda/gpu_train_torch.py
// (--mode attention), run by the same script on the same GPU. Prints one JSON object.
#include <algorithm>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>

#include <loom/core/bfloat16.hpp>
#include <loom/runtime/cuda/attention.hpp>
#include <loom/runtime/cuda/device.hpp>
#include <loom/runtime/cuda/layout.hpp>

using namespace loom;

int main(int argc, char** argv) {
    CLI::App app{"fused attention forward + backward on one GPU"};
    cuda::attention_dims dims{.batch = 16, .heads = 12, .queries = 1024, .keys = 1024, .head_dim = 64, .causal = true};
    int warmup = 5, runs = 20;
    app.add_option("--batch", dims.batch);
    app.add_option("--heads", dims.heads);
    app.add_option("--seq", dims.queries);
    app.add_option("--head-dim", dims.head_dim);
    app.add_option("--runs", runs);
    CLI11_PARSE(app, argc, argv);
    dims.keys = dims.queries;

    const std::int64_t elements = dims.batch * dims.heads * dims.queries * dims.head_dim;
    const auto bytes = static_cast<std::size_t>(elements) * sizeof(bfloat16);
    cuda::device_buffer q(bytes), k(bytes), v(bytes), out(bytes), dout(bytes), dq(bytes), dk(bytes), dv(bytes);
    cuda::device_buffer lse(static_cast<std::size_t>(dims.batch * dims.heads * dims.queries) * sizeof(float));
    cuda::device_buffer workspace(cuda::attention_backward_workspace_bytes(dims));
    cuda::stream s;
    // Small constant inputs: the timing does not depend on the values.
    for (auto* b : {&q, &k, &v, &dout}) cuda::fill(b->as<bfloat16>(), 0.01f, elements, s.get());

    cuda::event start(true), stop(true);
    std::vector<float> ms;
    for (int r = 0; r < warmup + runs; ++r) {
        start.record(s);
        cuda::attention_forward(q.as<bfloat16>(), k.as<bfloat16>(), v.as<bfloat16>(), out.as<bfloat16>(),
                                lse.as<float>(), dims, s.get());
        cuda::attention_backward(dout.as<bfloat16>(), q.as<bfloat16>(), k.as<bfloat16>(), v.as<bfloat16>(),
                                 out.as<bfloat16>(), lse.as<float>(), dq.as<bfloat16>(), dk.as<bfloat16>(),
                                 dv.as<bfloat16>(), workspace.get(), dims, s.get());
        stop.record(s);
        stop.synchronize();
        if (r >= warmup) ms.push_back(cuda::event::elapsed_ms(start, stop));
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2] / 1e3;
    // Causal: half of 4 b h s^2 d forward FLOPs; the backward is 2.5x the forward.
    const double flops = 3.5 * 2.0 * static_cast<double>(dims.batch * dims.heads) *
                         static_cast<double>(dims.queries * dims.queries * dims.head_dim);
    std::printf("{\"system\": \"loom attention (fwd+bwd, bf16)\", \"device\": \"%s\", \"median_seconds\": %.6f, "
                "\"tflops_per_second\": %.2f}\n",
                cuda::describe(cuda::current_device()).name.c_str(), median, flops / median / 1e12);
    return 0;
}
