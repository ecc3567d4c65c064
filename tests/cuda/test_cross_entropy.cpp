// Cross-entropy CUDA kernels against their host twins, the host backend's row functions
// (runtime/host/kernels/cross_entropy.hpp) run on the same float or bf16-rounded logits, in
// float and bf16: GPT-2's vocabulary of 50257 (rows at every alignment) and a padded 50304,
// small vocabularies, ignored targets, the backward with the forward's log-sum-exp and in
// place over the logits, bit-identical repeats, and the flag for a target out of range.
#include <cmath>
#include <cstring>
#include <type_traits>

#include <loom/runtime/cuda/cross_entropy.hpp>
#include <loom/runtime/host/kernels/cross_entropy.hpp>

#include "support.hpp"

using namespace loom;
using namespace loom::cuda_test;

namespace {

// The kernel's log-sum-exp (online max and sum, expf, logf) against the host's (two passes,
// a polynomial exp): sums of up to 50304 terms in different orders, a few 1e-7 relative, so
// about 1e-6 absolute on values near 10. It is float for both types (only the inputs are
// rounded), so float tolerances hold for bf16 too.
constexpr double lse_rel = 1e-6, lse_abs = 1e-5;
// A row's term lse - x[t] subtracts two values near 10: the same absolute error.
constexpr double row_loss_rel = 1e-5, row_loss_abs = 2e-5;

template <class T>
double tolerance() {
    return std::is_same_v<T, bfloat16> ? bf16_ulp : 1e-5;
}

struct ce_case {
    std::int64_t rows, vocab;
};

const ce_case ce_cases[] = {{64, 50257}, {32, 50304}, {100, 1000}, {9, 5}, {3, 1}};
constexpr std::int64_t ignore = -100;

template <class T>
void check_cross_entropy(const ce_case& c, std::uint64_t seed) {
    const auto rows = c.rows, v = c.vocab;
    const auto n = static_cast<std::size_t>(rows * v), nr = static_cast<std::size_t>(rows);
    INFO("rows " << rows << ", vocab " << v);
    const auto logits = random_vector<T>(n, seed, -8.0f, 8.0f);
    std::vector<std::int32_t> targets(nr);
    for (std::size_t r = 0; r < nr; ++r)
        targets[r] = r % 7 == 3 ? static_cast<std::int32_t>(ignore) : static_cast<std::int32_t>((r * 7919 + seed) % static_cast<std::size_t>(v));
    const double normalizer = static_cast<double>(rows);  // the op's default: every position

    device_vector<T> dlogits(logits), dgrad(n);
    device_vector<float> dloss_out(1);
    device_vector<std::int32_t> dtargets(targets);
    device_vector<float> drow_loss(nr), dlse(nr);
    device_vector<int> invalid(1);
    cuda::cross_entropy_forward(dlogits.get(), dtargets.get(), dloss_out.get(), drow_loss.get(), dlse.get(), rows, v,
                                ignore, normalizer, invalid.get(), nullptr);

    const auto lf = widen(logits);
    std::vector<float> lse(nr), row_loss(nr);
    double total = 0;
    for (std::size_t r = 0; r < nr; ++r) {
        const float* x = lf.data() + r * static_cast<std::size_t>(v);
        lse[r] = host::detail::log_sum_exp(x, v);
        row_loss[r] = targets[r] == ignore ? 0.0f : lse[r] - x[targets[r]];
        total += static_cast<double>(row_loss[r]);
    }
    const auto got_row_loss = drow_loss.download();
    require_close(dlse.download(), lse, lse_rel, lse_abs, "logsumexp");
    require_close(got_row_loss, row_loss, row_loss_rel, row_loss_abs, "row_loss");
    for (std::size_t r = 0; r < nr; ++r)
        if (targets[r] == ignore) CHECK(got_row_loss[r] == 0.0f);
    const auto got_loss = dloss_out.download();
    require_close(got_loss, {static_cast<float>(total / normalizer)}, 1e-6, 1e-6, "loss");
    CHECK(invalid.download()[0] == 0);

    // Backward, recomputing the softmax, into a separate buffer.
    const T dloss_value(1.5f);
    const device_vector<T> ddloss(std::vector<T>{dloss_value});
    cuda::cross_entropy_backward(ddloss.get(), dlogits.get(), dtargets.get(), nullptr, dgrad.get(), rows, v, ignore,
                                 normalizer, invalid.get(), nullptr);
    const auto scale = static_cast<float>(static_cast<double>(static_cast<float>(dloss_value)) / normalizer);
    std::vector<float> want(n, 0.0f);
    for (std::size_t r = 0; r < nr; ++r)
        if (targets[r] != ignore)
            host::detail::cross_entropy_grad_row(lf.data() + r * static_cast<std::size_t>(v),
                                                 want.data() + r * static_cast<std::size_t>(v), v, targets[r], scale);
    for (auto& w : want) w = stored<T>(w);
    // dlogits = scale (p - onehot): relative error as y's; the target's element, scale (p - 1),
    // may cancel: the rounding of scale itself (1e-7 of it) bounds the difference there.
    const double abs_tol = 1e-6 * scale;
    const auto got_grad = dgrad.download();
    require_close(got_grad, want, tolerance<T>(), abs_tol, "dlogits");
    for (std::size_t r = 0; r < nr; ++r)
        if (targets[r] == ignore)
            for (std::int64_t i = 0; i < v; ++i) REQUIRE(static_cast<float>(got_grad[r * static_cast<std::size_t>(v) + static_cast<std::size_t>(i)]) == 0.0f);

    // The same calls give the same bits.
    cuda::cross_entropy_forward(dlogits.get(), dtargets.get(), dloss_out.get(), drow_loss.get(), dlse.get(), rows, v,
                                ignore, normalizer, invalid.get(), nullptr);
    cuda::cross_entropy_backward(ddloss.get(), dlogits.get(), dtargets.get(), nullptr, dgrad.get(), rows, v, ignore,
                                 normalizer, invalid.get(), nullptr);
    CHECK(std::memcmp(got_row_loss.data(), drow_loss.download().data(), nr * sizeof(float)) == 0);
    CHECK(std::memcmp(got_loss.data(), dloss_out.download().data(), sizeof(float)) == 0);
    CHECK(std::memcmp(got_grad.data(), dgrad.download().data(), n * sizeof(T)) == 0);

    // With the forward's log-sum-exp (one pass), in place over the logits.
    cuda::cross_entropy_backward(ddloss.get(), dlogits.get(), dtargets.get(), dlse.get(), dlogits.get(), rows, v,
                                 ignore, normalizer, invalid.get(), nullptr);
    require_close(dlogits.download(), want, tolerance<T>(), abs_tol, "dlogits in place, saved logsumexp");
    CHECK(invalid.download()[0] == 0);
}

}  // namespace

TEMPLATE_TEST_CASE("cross_entropy forward and backward match the host twin", "[cuda][cross_entropy]", float,
                   bfloat16) {
    std::uint64_t seed = 60;
    for (const auto& c : ce_cases) check_cross_entropy<TestType>(c, seed += 10);
}

TEST_CASE("cross_entropy: a target out of range flags and gives NaN; a custom ignore_index", "[cuda][cross_entropy]") {
    const std::int64_t rows = 4, v = 10;
    const auto logits = random_vector<float>(static_cast<std::size_t>(rows * v), 70);
    // Row 1's target is the ignore_index 3 (a class, ignored all the same); row 2's is out of range.
    const std::vector<std::int32_t> targets{0, 3, 10, 9};
    device_vector<float> dlogits(logits), loss(1), row_loss(4), grad(static_cast<std::size_t>(rows * v));
    device_vector<std::int32_t> dtargets(targets);
    device_vector<int> invalid(1);
    cuda::cross_entropy_forward(dlogits.get(), dtargets.get(), loss.get(), row_loss.get(), nullptr, rows, v, 3, 4.0,
                                invalid.get(), nullptr);
    CHECK(invalid.download()[0] == 1);
    const auto rl = row_loss.download();
    CHECK(std::isfinite(rl[0]));
    CHECK(rl[1] == 0.0f);
    CHECK(std::isnan(rl[2]));
    CHECK(std::isfinite(rl[3]));
    CHECK(std::isnan(loss.download()[0]));

    device_vector<int> invalid_again(1);
    const device_vector<float> dloss(std::vector<float>{1.0f});
    cuda::cross_entropy_backward(dloss.get(), dlogits.get(), dtargets.get(), nullptr, grad.get(), rows, v, 3, 4.0,
                                 invalid_again.get(), nullptr);
    CHECK(invalid_again.download()[0] == 1);
    const auto g = grad.download();
    for (std::int64_t i = 0; i < v; ++i) {
        CHECK(g[static_cast<std::size_t>(v + i)] == 0.0f);      // ignored
        CHECK(std::isnan(g[static_cast<std::size_t>(2 * v + i)]));  // out of range
        CHECK(std::isfinite(g[static_cast<std::size_t>(3 * v + i)]));
    }

    CHECK_THROWS_WITH(cuda::cross_entropy_forward(dlogits.get(), dtargets.get(), loss.get(), row_loss.get(), nullptr,
                                                  rows, v, -100, 0.0, nullptr, nullptr),
                      Catch::Contains("normalizer = 0"));
    CHECK_THROWS_WITH(cuda::cross_entropy_backward(dloss.get(), dlogits.get(), dtargets.get(), nullptr, grad.get(), rows,
                                                   0, -100, 4.0, nullptr, nullptr),
                      Catch::Contains("vocab = 0"));
}
