// The host twin of the fused CUDA attention kernels (tests/cuda/twins/flash_attention.hpp)
// against loom's host attention kernels, run directly on the nodes of a graph: this is what
// proves, on a machine without a GPU, that the tiled algorithm the kernels implement (64 x 64
// tiles, online softmax, the two-pass backward, the masking of partial and causal tiles)
// computes attention and its gradients. The GPU test then compares the kernels with the twin.
//
// Tolerances, |twin - host| <= tol (1 + |host|): double 1e-13 and float 2e-6 (inputs in
// [-1, 1), sums of at most a few hundred terms, the two sides differing only in summation
// order and exp; the largest differences seen are 1e-15 and 4.4e-7). bf16 storage is checked
// against the double kernel on the same bf16 inputs, with the error its roundings make (P and
// dS rounded to 8 bits before their products, outputs rounded once): 2^-7 (1 + |ref|) for
// out and 2^-6 of the largest element for the gradients (seen: 6e-3 and 2^-8.4), a sanity
// bound on where the roundings sit, not a precision claim.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/core/bfloat16.hpp>
#include <loom/graph/builder.hpp>
#include <loom/ops/attention.hpp>
#include <loom/runtime/host/kernels/attention.hpp>

#include "cuda/twins/flash_attention.hpp"

using namespace loom;

namespace {

using values = std::vector<double>;

// Deterministic values in [-1, 1).
values random_values(std::int64_t n, std::uint64_t seed) {
    values v(static_cast<std::size_t>(n));
    std::uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
    for (double& x : v) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        x = static_cast<double>(state >> 11) * 0x1.0p-52 - 1.0;
    }
    return v;
}

values rounded_to_bfloat16(values v) {
    for (double& x : v) x = round_to_bfloat16(static_cast<float>(x));
    return v;
}

// Values stored as T (double, float or bf16, each rounded to nearest) and back.
template <class T>
std::vector<T> as(const values& v) {
    std::vector<T> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
        if constexpr (std::is_same_v<T, double>) out[i] = v[i];
        else out[i] = T(static_cast<float>(v[i]));
    }
    return out;
}

template <class T>
values widen(const std::vector<T>& v) {
    values out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
        if constexpr (std::is_same_v<T, double>) out[i] = v[i];
        else out[i] = static_cast<double>(static_cast<float>(v[i]));
    }
    return out;
}

struct attention_case {
    std::int64_t b, h, s, t, d;
    bool causal;
    double scale_factor;  // scale = scale_factor / sqrt(d)
};

std::string describe(const attention_case& c) {
    return "b=" + std::to_string(c.b) + " h=" + std::to_string(c.h) + " s=" + std::to_string(c.s) +
           " t=" + std::to_string(c.t) + " d=" + std::to_string(c.d) + (c.causal ? " causal" : " full");
}

struct attention_result {
    values out, lse, dq, dk, dv;
};

// loom's host kernels, forward and backward, on one graph; the backward reads `out_in` and
// `lse_in` (when given) rather than the forward's, so both sides see the same inputs.
template <class T>
attention_result host_attention(const attention_case& c, const values& q, const values& k, const values& v,
                                const values& dout, const values* out_in = nullptr, const values* lse_in = nullptr) {
    auto bhsd = [](std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) {
        return shape{{Dim::Batch::id, b}, {Dim::Head::id, h}, {Dim::Seq::id, s}, {Dim::HeadDim::id, d}};
    };
    graph_builder b;
    auto qt = b.input("q", bhsd(c.b, c.h, c.s, c.d));
    auto kt = b.input("k", bhsd(c.b, c.h, c.t, c.d));
    auto vt = b.input("v", bhsd(c.b, c.h, c.t, c.d));
    const attributes attrs{{"causal", std::int64_t{c.causal}}, {"scale", c.scale_factor / std::sqrt(double(c.d))}};
    std::vector<tensor> ins{qt, kt, vt};
    auto outs = b.apply<ops::Attention>(ins, attrs);
    auto dt = b.input("dout", bhsd(c.b, c.h, c.s, c.d));
    std::vector<tensor> grad_ins{dt, qt, kt, vt, outs[0], outs[1]};
    auto grads = b.apply<ops::AttentionGrad>(grad_ins, attrs);
    const graph& g = b.view();

    std::vector<T> q_t = as<T>(q), k_t = as<T>(k), v_t = as<T>(v), dout_t = as<T>(dout);
    std::vector<T> out(q.size()), lse(static_cast<std::size_t>(c.b * c.h * c.s)), dq(q.size()), dk(k.size()),
        dv(v.size());
    std::vector<void*> fin{q_t.data(), k_t.data(), v_t.data()}, fout{out.data(), lse.data()};
    host::detail::attention::forward<T>({g, g.at(g.tensor(outs[0].id).producer), fin, fout});
    std::vector<T> out_b = out_in ? as<T>(*out_in) : out, lse_b = lse_in ? as<T>(*lse_in) : lse;
    std::vector<void*> bin{dout_t.data(), q_t.data(), k_t.data(), v_t.data(), out_b.data(), lse_b.data()},
        bout{dq.data(), dk.data(), dv.data()};
    host::detail::attention::backward<T>({g, g.at(g.tensor(grads[0].id).producer), bin, bout});
    return {widen(out), widen(lse), widen(dq), widen(dk), widen(dv)};
}

// The twin with storage T and compute C; the backward reads out_in and lse_in when given.
template <class T, class C>
attention_result twin_attention(const attention_case& c, const values& q, const values& k, const values& v,
                                const values& dout, const values* out_in = nullptr, const values* lse_in = nullptr) {
    const cuda_twin::flash_dims d{c.b * c.h, c.s, c.t, c.d, c.causal, c.scale_factor / std::sqrt(double(c.d))};
    std::vector<T> q_t = as<T>(q), k_t = as<T>(k), v_t = as<T>(v), dout_t = as<T>(dout);
    std::vector<T> out(q.size()), dq(q.size()), dk(k.size()), dv(v.size());
    std::vector<C> lse(static_cast<std::size_t>(c.b * c.h * c.s));
    cuda_twin::flash_forward<T, C>(d, q_t.data(), k_t.data(), v_t.data(), out.data(), lse.data());
    std::vector<T> out_b = out_in ? as<T>(*out_in) : out;
    std::vector<C> lse_b = lse;
    if (lse_in)
        for (std::size_t i = 0; i < lse_b.size(); ++i) lse_b[i] = static_cast<C>((*lse_in)[i]);
    cuda_twin::flash_backward<T, C>(d, dout_t.data(), q_t.data(), k_t.data(), v_t.data(), out_b.data(), lse_b.data(),
                                    dq.data(), dk.data(), dv.data());
    return {widen(out), values(lse.begin(), lse.end()), widen(dq), widen(dk), widen(dv)};
}

// |got - want| <= abs_tol + rel_tol |want| everywhere; reports the worst element.
void require_close(const values& got, const values& want, double rel_tol, double abs_tol, const std::string& what) {
    REQUIRE(got.size() == want.size());
    double worst = 0;
    std::size_t at = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        REQUIRE(std::isfinite(got[i]));
        const double excess = std::fabs(got[i] - want[i]) - (abs_tol + rel_tol * std::fabs(want[i]));
        if (excess > worst) {
            worst = excess;
            at = i;
        }
    }
    INFO(what << ": worst element " << at << " got " << got[at] << " want " << want[at] << " (rel_tol " << rel_tol
              << ", abs_tol " << abs_tol << ")");
    CHECK(worst == 0.0);
}

double largest(const values& v) {
    double m = 0;
    for (double x : v) m = std::max(m, std::fabs(x));
    return m;
}

struct inputs {
    values q, k, v, dout;
};

inputs make_inputs(const attention_case& c, std::uint64_t seed) {
    return {random_values(c.b * c.h * c.s * c.d, seed), random_values(c.b * c.h * c.t * c.d, seed + 1),
            random_values(c.b * c.h * c.t * c.d, seed + 2), random_values(c.b * c.h * c.s * c.d, seed + 3)};
}

// Sizes around the 64-row tiles: one row, part of a tile, exactly one, one past, several
// with a partial last; causal (s == t) and not (s != t, either larger).
const std::vector<attention_case>& cases() {
    static const std::vector<attention_case> all{
        {1, 1, 1, 1, 64, true, 1.0},      {2, 1, 37, 37, 64, true, 0.8},   {1, 2, 64, 64, 64, true, 1.0},
        {1, 1, 65, 65, 128, true, 1.0},   {1, 2, 130, 130, 64, true, 2.0}, {1, 1, 200, 200, 128, true, 0.8},
        {2, 1, 37, 50, 64, false, 0.8},   {1, 1, 70, 19, 128, false, 1.0}, {1, 1, 1, 7, 64, false, 1.0},
        {1, 2, 130, 129, 64, false, 1.5}, {1, 1, 64, 128, 128, false, 1.0},
    };
    return all;
}

}  // namespace

TEST_CASE("the flash-attention twin matches loom's host attention in double", "[cuda_twin][attention]") {
    std::uint64_t seed = 100;
    for (const auto& c : cases()) {
        INFO(describe(c));
        const inputs in = make_inputs(c, seed += 10);
        const auto host = host_attention<double>(c, in.q, in.k, in.v, in.dout);
        const auto twin = twin_attention<double, double>(c, in.q, in.k, in.v, in.dout, &host.out, &host.lse);
        require_close(twin.out, host.out, 1e-13, 1e-13, "out");
        require_close(twin.lse, host.lse, 1e-13, 1e-13, "lse");
        require_close(twin.dq, host.dq, 1e-13, 1e-13, "dq");
        require_close(twin.dk, host.dk, 1e-13, 1e-13, "dk");
        require_close(twin.dv, host.dv, 1e-13, 1e-13, "dv");
    }
}

TEST_CASE("the flash-attention twin matches loom's host attention in float", "[cuda_twin][attention]") {
    std::uint64_t seed = 200;
    for (const auto& c : cases()) {
        INFO(describe(c));
        const inputs in = make_inputs(c, seed += 10);
        const auto host = host_attention<float>(c, in.q, in.k, in.v, in.dout);
        const auto twin = twin_attention<float, float>(c, in.q, in.k, in.v, in.dout, &host.out, &host.lse);
        require_close(twin.out, host.out, 2e-6, 2e-6, "out");
        require_close(twin.lse, host.lse, 2e-6, 2e-6, "lse");
        require_close(twin.dq, host.dq, 2e-6, 2e-6, "dq");
        require_close(twin.dk, host.dk, 2e-6, 2e-6, "dk");
        require_close(twin.dv, host.dv, 2e-6, 2e-6, "dv");
    }
}

TEST_CASE("the flash-attention twin in bf16 stays within its rounding of the double result",
          "[cuda_twin][attention]") {
    std::uint64_t seed = 300;
    for (const auto& c : cases()) {
        INFO(describe(c));
        inputs in = make_inputs(c, seed += 10);
        in.q = rounded_to_bfloat16(in.q);
        in.k = rounded_to_bfloat16(in.k);
        in.v = rounded_to_bfloat16(in.v);
        in.dout = rounded_to_bfloat16(in.dout);
        const auto host = host_attention<double>(c, in.q, in.k, in.v, in.dout);
        // The backward reads out as stored in bf16, like the kernels' backward after their forward.
        const values out_stored = rounded_to_bfloat16(host.out);
        const auto host_grad = host_attention<double>(c, in.q, in.k, in.v, in.dout, &out_stored, &host.lse);
        // Spelled out: OpenBLAS's headers (through the host kernels) declare a global bfloat16.
        const auto twin = twin_attention<loom::bfloat16, float>(c, in.q, in.k, in.v, in.dout, &out_stored, &host.lse);
        require_close(twin.out, host.out, 0x1p-7, 0x1p-7, "out");
        require_close(twin.lse, host.lse, 1e-5, 1e-5, "lse");
        require_close(twin.dq, host_grad.dq, 0, 0x1p-6 * largest(host_grad.dq), "dq");
        require_close(twin.dk, host_grad.dk, 0, 0x1p-6 * largest(host_grad.dk), "dk");
        require_close(twin.dv, host_grad.dv, 0, 0x1p-6 * largest(host_grad.dv), "dv");
    }
}

TEST_CASE("the flash-attention twin is deterministic and keeps the causal future out", "[cuda_twin][attention]") {
    // Changing the keys and values after a query must not change that query's out or lse.
    const attention_case c{1, 1, 100, 100, 64, true, 1.0};
    inputs in = make_inputs(c, 400);
    const auto first = twin_attention<float, float>(c, in.q, in.k, in.v, in.dout);
    CHECK(twin_attention<float, float>(c, in.q, in.k, in.v, in.dout).out == first.out);
    const std::int64_t cut = 70;
    for (std::int64_t i = cut * c.d; i < c.t * c.d; ++i) {
        in.k[static_cast<std::size_t>(i)] = 0.5;
        in.v[static_cast<std::size_t>(i)] = -0.25;
    }
    const auto changed = twin_attention<float, float>(c, in.q, in.k, in.v, in.dout);
    for (std::int64_t i = 0; i < cut; ++i) {
        CHECK(changed.lse[static_cast<std::size_t>(i)] == first.lse[static_cast<std::size_t>(i)]);
        for (std::int64_t e = 0; e < c.d; ++e) {
            const auto at = static_cast<std::size_t>(i * c.d + e);
            CHECK(changed.out[at] == first.out[at]);
        }
    }
}
