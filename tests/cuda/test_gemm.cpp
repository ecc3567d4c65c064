// cuBLASLt GEMMs (loom/runtime/cuda/gemm.hpp) against loom's host GEMM in double, for the
// four transpose combinations, odd sizes and padded leading dimensions, float and bf16, and
// each epilogue.
//
// Tolerances, per element, from the magnitudes the result is made of (mag = sum_p |a_ip b_pj|,
// plus |bias| and |C| where they enter): float accumulation of k terms is within
// (k + 2) 2^-24 mag, taken twice over; bf16 outputs add their rounding, 2^-8 |value|; TF32
// products (10-bit mantissas) are within 2^-10 mag each, taken twice. A bf16 product that C or
// the bias is added to may be rounded before the addition as well. GELU and its derivative
// move an input error by at most 1.13 times, plus what an approximate tanh costs (see
// tanh_error). Bias gradients sum such elements: their tolerances add.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/runtime/cuda/gemm.hpp>
#include <loom/runtime/host/gemm.hpp>
#include <loom/runtime/host/kernels/gelu.hpp>

#include "support.hpp"

using namespace loom;
using namespace loom::cuda_test;
// loom::bfloat16 is spelled out: OpenBLAS's headers (through the host GEMM) declare a global
// bfloat16 of their own.

namespace {

using values = std::vector<double>;

template <class T>
values wide(const std::vector<T>& v) {
    values out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<double>(static_cast<float>(v[i]));
    return out;
}

template <class T>
constexpr bool is_bf16 = std::is_same_v<T, loom::bfloat16>;

// |got - want| <= tol elementwise; reports the worst element.
template <class T>
void require_within(const std::vector<T>& got, std::size_t rows, std::size_t cols, std::size_t ld, const values& want,
                    const values& tol, const std::string& what) {
    double worst = 0;
    std::size_t at = 0;
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) {
            const double g = static_cast<float>(got[i * ld + j]);
            const std::size_t w = i * cols + j;
            if (!std::isfinite(g)) {
                INFO(what << ": element (" << i << ", " << j << ") is " << g);
                REQUIRE(std::isfinite(g));
            }
            const double excess = std::fabs(g - want[w]) - tol[w];
            if (excess > worst) {
                worst = excess;
                at = w;
            }
        }
    INFO(what << ": worst element (" << at / cols << ", " << at % cols << ") got "
              << static_cast<float>(got[at / cols * ld + at % cols]) << " want " << want[at] << " tolerance "
              << tol[at]);
    CHECK(worst == 0.0);
}

struct problem {
    bool ta, tb;
    std::int64_t m, n, k, pad;  // pad: extra elements at the end of every stored row
};

std::string describe(const problem& p, cuda::gemm_epilogue e, bool accumulate, bool bf16) {
    return std::string(bf16 ? "bf16 " : "float ") + (p.ta ? "A^T " : "A ") + (p.tb ? "B^T" : "B") +
           " m=" + std::to_string(p.m) + " n=" + std::to_string(p.n) + " k=" + std::to_string(p.k) +
           " pad=" + std::to_string(p.pad) + " epilogue " + cuda::to_string(e) + (accumulate ? " accumulate" : "");
}

// Runs one product on the GPU and checks every output against the host. `required`: the
// combination must be supported when its rows are 16-byte multiples, as a model's are;
// otherwise an unsupported one is reported and skipped (cuBLASLt's epilogue kernels need
// not cover odd leading dimensions).
template <class T>
void check_gemm(cuda::gemm_engine& engine, const problem& p, cuda::gemm_epilogue e, bool accumulate, bool required,
                std::uint64_t seed, bool tf32 = false) {
    const std::string what = describe(p, e, accumulate, is_bf16<T>) + (tf32 ? " tf32" : "");
    INFO(what);
    const std::int64_t a_rows = p.ta ? p.k : p.m, a_cols = p.ta ? p.m : p.k;
    const std::int64_t b_rows = p.tb ? p.n : p.k, b_cols = p.tb ? p.k : p.n;
    const std::int64_t lda = a_cols + p.pad, ldb = b_cols + p.pad, ldc = p.n + p.pad;
    const std::int64_t ldaux = (p.n + 7) / 8 * 8 + (p.pad > 0 ? 8 : 0);
    const auto sz = [](std::int64_t r, std::int64_t ld) { return static_cast<std::size_t>(r * ld); };
    const auto a = random_vector<T>(sz(a_rows, lda), seed), b = random_vector<T>(sz(b_rows, ldb), seed + 1),
               c0 = random_vector<T>(sz(p.m, ldc), seed + 2);
    const auto bias = random_vector<T>(static_cast<std::size_t>(p.n), seed + 3);
    const auto aux_in = random_vector<T>(sz(p.m, ldaux), seed + 4, -3.0f, 3.0f);
    const bool grad_of_a = e == cuda::gemm_epilogue::bgrad_a;
    const auto vector_size = static_cast<std::size_t>(grad_of_a ? p.m : p.n);

    device_vector<T> da(a), db(b), dc(c0), dbias(bias), daux(aux_in), dgrad(vector_size);
    cuda::gemm_args<T> g;
    g.transpose_a = p.ta;
    g.transpose_b = p.tb;
    g.m = p.m;
    g.n = p.n;
    g.k = p.k;
    g.a = da.get();
    g.lda = lda;
    g.b = db.get();
    g.ldb = ldb;
    g.c = dc.get();
    g.ldc = ldc;
    g.accumulate = accumulate;
    g.epilogue = e;
    g.bias = dbias.get();
    g.bias_grad = dgrad.get();
    g.aux = daux.get();
    g.ldaux = ldaux;
    g.allow_tf32 = tf32;
    const bool aligned = (lda * sizeof(T)) % 16 == 0 && (ldb * sizeof(T)) % 16 == 0 && (ldc * sizeof(T)) % 16 == 0;
    if (!engine.supported(g)) {
        if (required && aligned) FAIL("cuBLASLt offers no algorithm for a combination loom relies on: " << what);
        WARN("cuBLASLt offers no algorithm for " << what << "; skipped");
        return;
    }
    engine.run(g, nullptr);
    const auto c = dc.download(), aux = daux.download(), grad = dgrad.download();

    // Reference and magnitudes in double through the host GEMM, on the stored (widened) values.
    const values wa = wide(a), wb = wide(b), wc0 = wide(c0), wbias = wide(bias), waux = wide(aux_in);
    values abs_a(wa.size()), abs_b(wb.size());
    std::transform(wa.begin(), wa.end(), abs_a.begin(), [](double x) { return std::fabs(x); });
    std::transform(wb.begin(), wb.end(), abs_b.begin(), [](double x) { return std::fabs(x); });
    const auto ta = p.ta ? host::transpose::yes : host::transpose::no;
    const auto tb = p.tb ? host::transpose::yes : host::transpose::no;
    const auto mn = static_cast<std::size_t>(p.m * p.n);
    values ref(mn), mag(mn);
    host::gemm<double>(ta, tb, p.m, p.n, p.k, 1.0, wa.data(), lda, wb.data(), ldb, 0.0, ref.data(), p.n);
    host::gemm<double>(ta, tb, p.m, p.n, p.k, 1.0, abs_a.data(), lda, abs_b.data(), ldb, 0.0, mag.data(), p.n);
    const double unit = tf32 ? 0x1p-10 : static_cast<double>(p.k + 2) * 0x1p-24;
    const double rounding = is_bf16<T> ? 0x1p-8 : 0.0;
    auto index = [&](std::int64_t i, std::int64_t j) { return static_cast<std::size_t>(i * p.n + j); };
    const values product = ref;
    const bool adds_to_product = accumulate || e == cuda::gemm_epilogue::bias || e == cuda::gemm_epilogue::bias_gelu;
    for (std::int64_t i = 0; i < p.m; ++i)
        for (std::int64_t j = 0; j < p.n; ++j) {
            if (accumulate) {
                ref[index(i, j)] += wc0[static_cast<std::size_t>(i * ldc + j)];
                mag[index(i, j)] += std::fabs(wc0[static_cast<std::size_t>(i * ldc + j)]);
            }
            if (e == cuda::gemm_epilogue::bias || e == cuda::gemm_epilogue::bias_gelu) {
                ref[index(i, j)] += wbias[static_cast<std::size_t>(j)];
                mag[index(i, j)] += std::fabs(wbias[static_cast<std::size_t>(j)]);
            }
        }
    // The product's own error, before any rounding of the output.
    values err(mn);
    // cuBLASLt may round the product to the output type before it adds C or the bias (seen on
    // an H200, CUDA 13.0: bf16 results up to 1.7 half-ulps off), so a bf16 sum may be rounded
    // twice: once more at the product's magnitude.
    for (std::size_t w = 0; w < mn; ++w)
        err[w] = 2 * unit * mag[w] + (adds_to_product ? rounding * std::fabs(product[w]) : 0.0);
    auto with_rounding = [&](const values& want, const values& before) {
        values tol(want.size());
        for (std::size_t w = 0; w < want.size(); ++w) tol[w] = before[w] + rounding * std::fabs(want[w]) + 1e-30;
        return tol;
    };
    const auto m = static_cast<std::size_t>(p.m), n = static_cast<std::size_t>(p.n);
    // cuBLASLt may evaluate tanh with the hardware approximation (relative error below 2^-10.9).
    // gelu = x (1 + tanh u) / 2 then moves by at most |x| / 2 of it, and
    // gelu' = (1 + tanh u) / 2 + x (1 - tanh^2 u) u' / 2 by at most 6 times it for |x| <= 3.
    constexpr double tanh_error = 0x1p-10;

    switch (e) {
        case cuda::gemm_epilogue::none:
        case cuda::gemm_epilogue::bias: require_within(c, m, n, ldc, ref, with_rounding(ref, err), "C"); break;
        case cuda::gemm_epilogue::bias_gelu: {
            require_within(aux, m, n, ldaux, ref, with_rounding(ref, err), "aux (pre-activation)");
            values want(mn), before(mn);
            for (std::size_t w = 0; w < mn; ++w) {
                want[w] = host::detail::gelu_value(ref[w]);
                before[w] = 1.13 * err[w] + tanh_error * 0.5 * std::fabs(ref[w]);
            }
            require_within(c, m, n, ldc, want, with_rounding(want, before), "C = gelu(aux)");
            break;
        }
        case cuda::gemm_epilogue::dgelu_bgrad: {
            values want(mn), before(mn), column(n, 0.0), column_tol(n, 0.0), column_abs(n, 0.0);
            for (std::size_t i = 0; i < m; ++i)
                for (std::size_t j = 0; j < n; ++j) {
                    const std::size_t w = i * n + j;
                    const double slope = host::detail::gelu_derivative(waux[i * static_cast<std::size_t>(ldaux) + j]);
                    want[w] = ref[w] * slope;
                    before[w] = 1.13 * err[w] + 6 * tanh_error * std::fabs(ref[w]);
                    column[j] += want[w];
                    column_abs[j] += std::fabs(want[w]);
                    column_tol[j] += before[w];
                }
            require_within(c, m, n, ldc, want, with_rounding(want, before), "C = product * gelu'(aux)");
            // Summed before or after the output's rounding, and itself rounded.
            for (std::size_t j = 0; j < n; ++j)
                column_tol[j] += (rounding + static_cast<double>(p.m + 2) * 0x1p-24) * column_abs[j] +
                                 rounding * std::fabs(column[j]);
            require_within(grad, 1, n, n, column, column_tol, "bias_grad = column sums of C");
            break;
        }
        case cuda::gemm_epilogue::bgrad_a:
        case cuda::gemm_epilogue::bgrad_b: {
            require_within(c, m, n, ldc, ref, with_rounding(ref, err), "C");
            // Sum over k of op(A) (one per row i) or of op(B) (one per column j).
            values want(vector_size, 0.0), tol(vector_size, 0.0);
            for (std::size_t r = 0; r < vector_size; ++r) {
                double sum = 0, total = 0;
                for (std::int64_t q = 0; q < p.k; ++q) {
                    const auto i = static_cast<std::int64_t>(r);
                    const double x = grad_of_a ? wa[static_cast<std::size_t>(p.ta ? q * lda + i : i * lda + q)]
                                               : wb[static_cast<std::size_t>(p.tb ? i * ldb + q : q * ldb + i)];
                    sum += x;
                    total += std::fabs(x);
                }
                want[r] = sum;
                tol[r] = 2 * static_cast<double>(p.k + 2) * 0x1p-24 * total + rounding * (std::fabs(sum) + total);
            }
            require_within(grad, 1, vector_size, vector_size, want, tol, "bias_grad = sums over k");
            break;
        }
    }

    // The same problem again: no new plan, the same bits.
    const std::size_t plans = engine.cached_plans();
    device_vector<T> dc2(c0);
    g.c = dc2.get();
    engine.run(g, nullptr);
    CHECK(engine.cached_plans() == plans);
    const auto again = dc2.download();
    CHECK(std::memcmp(again.data(), c.data(), c.size() * sizeof(T)) == 0);
}

const std::vector<problem>& problems() {
    static const std::vector<problem> all = [] {
        std::vector<problem> v;
        for (bool ta : {false, true})
            for (bool tb : {false, true}) {
                v.push_back({ta, tb, 37, 53, 29, 0});
                v.push_back({ta, tb, 1, 1, 1, 0});
                v.push_back({ta, tb, 65, 48, 130, 3});
                v.push_back({ta, tb, 128, 96, 64, 0});
            }
        return v;
    }();
    return all;
}

// The combinations a transformer's linear layers use, which must work in bf16: the forward
// x W^T (+ bias, + GELU), the weight gradient dy^T x with the bias gradient, the input
// gradient dy W through the GELU. Every size a multiple of 8, as model widths are.
struct needed {
    bool ta, tb;
    cuda::gemm_epilogue e;
};
constexpr needed model_products[] = {
    {false, true, cuda::gemm_epilogue::none},    {false, true, cuda::gemm_epilogue::bias},
    {false, true, cuda::gemm_epilogue::bias_gelu}, {true, false, cuda::gemm_epilogue::bgrad_a},
    {false, false, cuda::gemm_epilogue::dgelu_bgrad}, {false, false, cuda::gemm_epilogue::none},
    {true, false, cuda::gemm_epilogue::none},
};

}  // namespace

TEMPLATE_TEST_CASE("cuBLASLt GEMMs match the host GEMM, every transpose, odd sizes", "[cuda][gemm]", float,
                   loom::bfloat16) {
    cuda::gemm_engine engine;
    std::uint64_t seed = 1;
    for (const auto& p : problems()) {
        check_gemm<TestType>(engine, p, cuda::gemm_epilogue::none, false, true, seed += 10);
        check_gemm<TestType>(engine, p, cuda::gemm_epilogue::none, true, true, seed += 10);
        check_gemm<TestType>(engine, p, cuda::gemm_epilogue::bias, false, true, seed += 10);
    }
}

TEMPLATE_TEST_CASE("cuBLASLt GEMM epilogues match the host", "[cuda][gemm]", float, loom::bfloat16) {
    cuda::gemm_engine engine;
    std::uint64_t seed = 5000;
    for (const auto& n : model_products)
        for (const problem& p : {problem{n.ta, n.tb, 96, 64, 48, 0}, problem{n.ta, n.tb, 40, 56, 24, 0}})
            check_gemm<TestType>(engine, p, n.e, false, is_bf16<TestType>, seed += 10);
    // Every epilogue on every combination and odd sizes, where cuBLASLt has a kernel.
    for (auto e : {cuda::gemm_epilogue::bias_gelu, cuda::gemm_epilogue::dgelu_bgrad, cuda::gemm_epilogue::bgrad_a,
                   cuda::gemm_epilogue::bgrad_b})
        for (const auto& p : problems()) check_gemm<TestType>(engine, p, e, false, false, seed += 10);
    check_gemm<TestType>(engine, {true, false, 64, 48, 96, 0}, cuda::gemm_epilogue::bgrad_a, true, false, seed += 10);
}

TEST_CASE("float GEMMs may use TF32 when asked", "[cuda][gemm]") {
    cuda::gemm_engine engine;
    check_gemm<float>(engine, {false, true, 128, 96, 256, 0}, cuda::gemm_epilogue::none, false, true, 77, true);
}

TEST_CASE("the GEMM engine caches one plan per problem", "[cuda][gemm]") {
    cuda::gemm_engine engine;
    CHECK(engine.workspace_bytes() == cuda::gemm_engine::default_workspace_bytes);
    device_vector<loom::bfloat16> a(random_vector<loom::bfloat16>(64 * 32, 1)),
        b(random_vector<loom::bfloat16>(32 * 48, 2)), c(64 * 48);
    cuda::gemm_args<loom::bfloat16> g;
    g.m = 64;
    g.n = 48;
    g.k = 32;
    g.a = a.get();
    g.b = b.get();
    g.c = c.get();
    for (int i = 0; i < 3; ++i) engine.run(g, nullptr);
    CHECK(engine.cached_plans() == 1);
    g.transpose_b = true;  // the same buffer read as n x k
    engine.run(g, nullptr);
    CHECK(engine.cached_plans() == 2);
    cuda::synchronize_device();
}

TEST_CASE("the GEMM engine names bad arguments", "[cuda][gemm][errors]") {
    cuda::gemm_engine engine;
    device_vector<float> x(1024);
    cuda::gemm_args<float> g;
    g.m = 8;
    g.n = 8;
    g.k = 16;
    g.a = g.b = x.get();
    g.c = x.get();
    g.lda = 8;
    CHECK_THROWS_AS(engine.run(g, nullptr), usage_error);
    CHECK_THROWS_WITH(engine.run(g, nullptr), Catch::Contains("lda = 8") && Catch::Contains("k = 16"));
    g.lda = 0;
    g.epilogue = cuda::gemm_epilogue::bias_gelu;
    g.bias = x.get();
    g.aux = x.get();
    g.ldaux = 12;
    CHECK_THROWS_WITH(engine.run(g, nullptr), Catch::Contains("ldaux = 12") && Catch::Contains("multiple of 8"));
    g.ldaux = 0;
    g.accumulate = true;
    CHECK_THROWS_WITH(engine.run(g, nullptr), Catch::Contains("accumulate"));
    g.accumulate = false;
    g.bias = nullptr;
    CHECK_THROWS_WITH(engine.run(g, nullptr), Catch::Contains("needs bias"));
}

// Not run by default: `cuda_test_gemm "[perf]"`. GPT-2 124M's linear layers in bf16 at 16 x
// 1024 tokens.
TEST_CASE("GEMM throughput at GPT-2 124M's linear layers", "[.][perf][cuda][gemm]") {
    cuda::gemm_engine engine;
    cuda::stream s;
    const std::int64_t tokens = 16 * 1024, width = 768;
    struct layer {
        const char* name;
        std::int64_t out, in;
        cuda::gemm_epilogue e;
    };
    const layer layers[] = {{"qkv", 3 * width, width, cuda::gemm_epilogue::bias},
                            {"attn proj", width, width, cuda::gemm_epilogue::bias},
                            {"fc", 4 * width, width, cuda::gemm_epilogue::bias_gelu},
                            {"fc proj", width, 4 * width, cuda::gemm_epilogue::bias}};
    for (const auto& l : layers) {
        device_vector<loom::bfloat16> x(random_vector<loom::bfloat16>(static_cast<std::size_t>(tokens * l.in), 1)),
            w(random_vector<loom::bfloat16>(static_cast<std::size_t>(l.out * l.in), 2)),
            bias(random_vector<loom::bfloat16>(static_cast<std::size_t>(l.out), 3)),
            y(static_cast<std::size_t>(tokens * l.out)), pre(static_cast<std::size_t>(tokens * l.out));
        cuda::gemm_args<loom::bfloat16> g;
        g.transpose_b = true;
        g.m = tokens;
        g.n = l.out;
        g.k = l.in;
        g.a = x.get();
        g.b = w.get();
        g.c = y.get();
        g.epilogue = l.e;
        g.bias = bias.get();
        g.aux = pre.get();
        engine.run(g, s.get());
        cuda::event start(true), stop(true);
        start.record(s);
        const int reps = 20;
        for (int r = 0; r < reps; ++r) engine.run(g, s.get());
        stop.record(s);
        stop.synchronize();
        const double ms = cuda::event::elapsed_ms(start, stop) / reps;
        WARN(l.name << " [" << tokens << " x " << l.in << "] x [" << l.in << " x " << l.out << "] "
                    << cuda::to_string(l.e) << ": " << ms << " ms, "
                    << 2.0 * tokens * l.in * l.out / ms * 1e-9 << " TFLOP/s");
    }
}
