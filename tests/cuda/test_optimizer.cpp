// The fused AdamW and the global norm against their host twins: loom::train::adamw<float>
// with loom::train::global_norm and clip_scale, over tensors of odd sizes, some spanning many chunks.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include <loom/runtime/cuda/optimizer.hpp>
#include <loom/train/adamw.hpp>
#include <loom/train/grad_clip.hpp>

#include "support.hpp"

using namespace loom;
using namespace loom::cuda_test;

namespace {

const std::vector<std::int64_t> sizes = {1, 769, cuda::multi_tensor_chunk * 3 + 5, 4096, 50257};

std::vector<float> download_floats(const float* device, std::int64_t n) {
    std::vector<float> host(static_cast<std::size_t>(n));
    cuda::copy_to_host(host.data(), device, host.size() * sizeof(float));
    cuda::synchronize_device();
    return host;
}

template <class G>
void check_adamw(float max_norm) {
    constexpr cuda::grad_type type = std::is_same_v<G, float> ? cuda::grad_type::f32 : cuda::grad_type::bf16;
    train::adamw_options host_options{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    cuda::adamw_hyperparameters hyper{.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};

    std::vector<std::vector<float>> host_values, host_grads;
    std::vector<device_vector<float>> values;
    std::vector<device_vector<G>> grads;
    std::vector<device_vector<bfloat16>> copies;
    std::vector<cuda::adamw_tensor> tensors;
    std::vector<const void*> grad_pointers;
    train::adamw<float> host(host_options);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
        const auto n = static_cast<std::size_t>(sizes[i]);
        host_values.push_back(random_vector<float>(n, 10 + i));
        values.emplace_back(host_values.back());
        grads.emplace_back(n);
        copies.emplace_back(n);
        host_grads.emplace_back(n);
    }
    for (std::size_t i = 0; i < sizes.size(); ++i) {
        const bool decay = i % 2 == 0;
        tensors.push_back({values[i].get(), grads[i].get(), copies[i].get(), sizes[i], decay});
        grad_pointers.push_back(grads[i].get());
        host.add({"p" + std::to_string(i), std::span(host_values[i]), std::span<const float>(host_grads[i]), decay});
    }
    cuda::fused_adamw device(tensors, type, hyper);
    cuda::global_norm norm(grad_pointers, sizes, type);
    device_vector<float> norm_result(2);

    for (int step = 0; step < 4; ++step) {
        std::vector<std::span<float>> host_grad_spans;
        for (std::size_t i = 0; i < sizes.size(); ++i) {
            // Later steps have larger gradients, so that clipping engages on some steps only.
            auto g = random_vector<G>(host_grads[i].size(), 100 * step + i, -0.5f * (step + 1), 0.5f * (step + 1));
            cuda::copy_to_device(grads[i].get(), g.data(), g.size() * sizeof(G));
            // Copied into the vector the host optimizer's span reads (assigning a new vector
            // would free the memory the span points at).
            const auto wide_g = widen(g);
            std::copy(wide_g.begin(), wide_g.end(), host_grads[i].begin());
            host_grad_spans.emplace_back(host_grads[i]);
        }
        const double want_norm = train::global_norm(host_grad_spans);
        norm.compute(max_norm, norm_result.get(), nullptr);
        device.step(norm_result.get() + 1, nullptr);  // the coefficient
        host.step(host_options.lr, train::clip_scale(want_norm, max_norm));
        const auto got_norm = norm_result.download();
        INFO("step " << step);
        CHECK(std::fabs(got_norm[0] - want_norm) <= 1e-6 * want_norm);
        const double want_coefficient = max_norm > 0 ? std::min(1.0, max_norm / (want_norm + 1e-6)) : 1.0;
        CHECK(std::fabs(got_norm[1] - want_coefficient) <= 1e-6);
        for (std::size_t i = 0; i < sizes.size(); ++i) {
            // float throughout; the only differences are the order of a few roundings (the
            // clip product, the bias corrections in float), each a few ulp of the update.
            require_close(values[i].download(), host_values[i], 1e-5, 1e-6, "adamw value " + std::to_string(i));
            std::vector<float> want_copy(host_values[i].size());
            for (std::size_t k = 0; k < want_copy.size(); ++k) want_copy[k] = host_values[i][k];
            require_close(copies[i].download(), want_copy, bf16_ulp, 1e-6, "bf16 copy " + std::to_string(i));
            require_close(download_floats(device.first_moment(i), sizes[i]), host.first_moment(i), 1e-5, 1e-7,
                          "first moment " + std::to_string(i));
            require_close(download_floats(device.second_moment(i), sizes[i]), host.second_moment(i), 1e-5, 1e-9,
                          "second moment " + std::to_string(i));
        }
    }
}

}  // namespace

TEMPLATE_TEST_CASE("fused AdamW with clipping matches the host optimizer", "[cuda][optimizer]", float, bfloat16) {
    SECTION("clipping at 1") { check_adamw<TestType>(1.0f); }
    SECTION("no clipping") { check_adamw<TestType>(0.0f); }
}

TEST_CASE("the global norm is bit-identical run to run", "[cuda][optimizer]") {
    const std::int64_t n = cuda::multi_tensor_chunk * 7 + 123;
    const auto g = random_vector<float>(static_cast<std::size_t>(n), 77);
    device_vector<float> dg(g), result(2);
    cuda::global_norm norm({dg.get()}, {n}, cuda::grad_type::f32);
    norm.compute(1.0f, result.get(), nullptr);
    const auto first = result.download();
    for (int run = 0; run < 5; ++run) {
        norm.compute(1.0f, result.get(), nullptr);
        const auto again = result.download();
        REQUIRE(std::memcmp(first.data(), again.data(), sizeof(float) * 2) == 0);
    }
}

TEST_CASE("fused AdamW rejects bad hyperparameters and tensors", "[cuda][optimizer]") {
    CHECK_THROWS_WITH(cuda::fused_adamw({}, cuda::grad_type::f32, {.beta1 = 1.0f}),
                      Catch::Contains("betas must lie in [0, 1)"));
    CHECK_THROWS_WITH(cuda::fused_adamw({{nullptr, nullptr, nullptr, 10, true}}, cuda::grad_type::f32, {}),
                      Catch::Contains("tensor 0 has a null value"));
}
