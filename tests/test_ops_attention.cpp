// Forward checks of matmul (three layouts), reshape, transpose, split/merge heads and
// attention (causal and not) against references computed here in long double, on both the
// float and the double executor; attention's two kernels against full-matrix references on
// every instruction set this CPU runs; and the shape errors these ops raise.
//
// Tolerances, |out - ref| <= atol + rtol |ref|: double 1e-12 + 1e-12 |ref|; float 1e-5 +
// 1e-5 |ref| (inputs in [-1, 1), contractions of at most a few hundred terms; the observed
// errors are below a tenth of these).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <loom/graph/builder.hpp>
#include <loom/ops/all.hpp>
#include <loom/runtime/compile.hpp>
#include <loom/runtime/host/bound_storage.hpp>
#include <loom/runtime/host/executor.hpp>
#include <loom/runtime/host/kernels/attention.hpp>

using namespace loom;

namespace {

using values = std::vector<double>;
using named_values = std::vector<std::pair<std::string, values>>;

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

// Runs the forward pass of the graph in `b` in precision T and returns `outs`.
template <class T>
std::vector<values> run_forward(graph_builder& b, const std::vector<tensor>& outs, const named_values& inputs) {
    const graph& g = b.view();
    std::vector<tensor_id> ids;
    for (const tensor& t : outs) ids.push_back(t.id);
    const precision prec = std::is_same_v<T, float> ? precision::f32 : precision::f64;
    program p = compile_program(g, {.prec = prec, .include_backward = false, .outputs = ids});
    host::executor<T> ex(p);
    host::bound_storage<T> st(p);
    st.bind_to(ex);
    for (const auto& [name, data] : inputs) {
        auto dst = st.real(name);
        REQUIRE(dst.size() == data.size());
        for (std::size_t i = 0; i < data.size(); ++i) dst[i] = static_cast<T>(data[i]);
    }
    ex.run();
    std::vector<values> result;
    for (tensor_id t : ids) {
        auto src = st.real(t);
        result.emplace_back(src.begin(), src.end());
    }
    return result;
}

template <class T>
void require_close(const values& got, const values& ref, const std::string& what) {
    const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
    REQUIRE(got.size() == ref.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
        INFO(what << " (" << (std::is_same_v<T, float> ? "float" : "double") << ") element " << i << ": got "
                  << got[i] << ", reference " << ref[i]);
        REQUIRE(std::abs(got[i] - ref[i]) <= tol + tol * std::abs(ref[i]));
    }
}

shape bhsd(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) {
    return {{Dim::Batch::id, b}, {Dim::Head::id, h}, {Dim::Seq::id, s}, {Dim::HeadDim::id, d}};
}

// ---- references -------------------------------------------------------------------------

// C[g] = op(A[g]) op(B[g]) with A stored m x k (k x m when ta), B k x n (n x k when tb).
values reference_product(const values& a, const values& b, std::int64_t batch, std::int64_t m, std::int64_t n,
                         std::int64_t k, bool ta, bool tb) {
    values c(static_cast<std::size_t>(batch * m * n));
    for (std::int64_t g = 0; g < batch; ++g)
        for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t j = 0; j < n; ++j) {
                long double sum = 0;
                for (std::int64_t p = 0; p < k; ++p) {
                    const double x = a[static_cast<std::size_t>(g * m * k + (ta ? p * m + i : i * k + p))];
                    const double y = b[static_cast<std::size_t>(g * k * n + (tb ? j * k + p : p * n + j))];
                    sum += static_cast<long double>(x) * y;
                }
                c[static_cast<std::size_t>((g * m + i) * n + j)] = static_cast<double>(sum);
            }
    return c;
}

struct attention_reference {
    values out, lse;
};

// The whole score matrix of every (batch, head), masked and normalised in long double.
attention_reference reference_attention(const values& q, const values& k, const values& v, std::int64_t pairs,
                                        std::int64_t s, std::int64_t t, std::int64_t d, std::int64_t e, bool causal,
                                        double scale) {
    attention_reference r{values(static_cast<std::size_t>(pairs * s * e)), values(static_cast<std::size_t>(pairs * s))};
    std::vector<long double> scores(static_cast<std::size_t>(s * t));
    for (std::int64_t p = 0; p < pairs; ++p) {
        for (std::int64_t i = 0; i < s; ++i)
            for (std::int64_t j = 0; j < t; ++j) {
                long double dot = 0;
                for (std::int64_t x = 0; x < d; ++x)
                    dot += static_cast<long double>(q[static_cast<std::size_t>((p * s + i) * d + x)]) *
                           k[static_cast<std::size_t>((p * t + j) * d + x)];
                scores[static_cast<std::size_t>(i * t + j)] = dot * scale;
            }
        for (std::int64_t i = 0; i < s; ++i) {
            const std::int64_t keys = causal ? i + 1 : t;
            long double top = scores[static_cast<std::size_t>(i * t)];
            for (std::int64_t j = 1; j < keys; ++j) top = std::max(top, scores[static_cast<std::size_t>(i * t + j)]);
            long double total = 0;
            for (std::int64_t j = 0; j < keys; ++j)
                total += std::exp(scores[static_cast<std::size_t>(i * t + j)] - top);
            r.lse[static_cast<std::size_t>(p * s + i)] = static_cast<double>(top + std::log(total));
            for (std::int64_t c = 0; c < e; ++c) {
                long double acc = 0;
                for (std::int64_t j = 0; j < keys; ++j)
                    acc += std::exp(scores[static_cast<std::size_t>(i * t + j)] - top) *
                           v[static_cast<std::size_t>((p * t + j) * e + c)];
                r.out[static_cast<std::size_t>((p * s + i) * e + c)] = static_cast<double>(acc / total);
            }
        }
    }
    return r;
}

// ---- attention ----------------------------------------------------------------------------

struct attention_case {
    std::int64_t b, h, s, t, d, e;
    bool causal;
};

template <class T>
void check_attention(const attention_case& c) {
    graph_builder b;
    auto q = b.input("q", bhsd(c.b, c.h, c.s, c.d));
    auto k = b.input("k", bhsd(c.b, c.h, c.t, c.d));
    auto v = b.input("v", bhsd(c.b, c.h, c.t, c.e));
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
    std::vector<tensor> ins{q, k, v};
    auto outs = b.apply<ops::Attention>(ins, {{"causal", std::int64_t{c.causal}}, {"scale", scale}});
    REQUIRE(outs.size() == 2);
    CHECK(outs[0].dims() == bhsd(c.b, c.h, c.s, c.e));
    CHECK(outs[1].dims() == shape{{Dim::Batch::id, c.b}, {Dim::Head::id, c.h}, {Dim::Seq::id, c.s}});
    const values qv = random_values(c.b * c.h * c.s * c.d, 1), kv = random_values(c.b * c.h * c.t * c.d, 2),
                 vv = random_values(c.b * c.h * c.t * c.e, 3);
    auto got = run_forward<T>(b, outs, {{"q", qv}, {"k", kv}, {"v", vv}});
    auto ref = reference_attention(qv, kv, vv, c.b * c.h, c.s, c.t, c.d, c.e, c.causal, scale);
    INFO("b=" << c.b << " h=" << c.h << " s=" << c.s << " t=" << c.t << " d=" << c.d << " e=" << c.e
              << " causal=" << c.causal);
    require_close<T>(got[0], ref.out, "attention out");
    require_close<T>(got[1], ref.lse, "attention lse");
}

}  // namespace

TEST_CASE("attention matches a full-matrix reference, causal and not", "[ops][attention]") {
    const std::vector<attention_case> cases{
        {1, 1, 1, 1, 1, 1, true},      {2, 3, 5, 5, 4, 4, true},      {2, 2, 37, 37, 16, 8, true},
        {1, 2, 64, 64, 32, 32, true},  {2, 1, 100, 100, 64, 64, true}, {1, 1, 33, 33, 3, 5, true},
        {2, 3, 5, 5, 4, 4, false},     {2, 2, 37, 50, 16, 8, false},  {1, 2, 70, 19, 32, 32, false},
        {1, 1, 1, 7, 2, 3, false},
    };
    for (const auto& c : cases) {
        check_attention<double>(c);
        check_attention<float>(c);
    }
}

TEST_CASE("causal_attention and attention build the out tensor with the default scale", "[ops][attention]") {
    graph_builder b;
    auto q = b.input("q", bhsd(2, 2, 9, 8));
    auto k = b.input("k", bhsd(2, 2, 9, 8));
    auto v = b.input("v", bhsd(2, 2, 9, 6));
    auto causal = ops::causal_attention(q, k, v);
    auto full = ops::attention(q, k, v);
    CHECK(causal.dims() == bhsd(2, 2, 9, 6));
    const node& n = b.view().at(b.view().tensor(causal.id).producer);
    CHECK(n.attrs.get<std::int64_t>("causal") == 1);
    CHECK(n.attrs.get<double>("scale") == Approx(1.0 / std::sqrt(8.0)));
    const values qv = random_values(2 * 2 * 9 * 8, 4), kv = random_values(2 * 2 * 9 * 8, 5),
                 vv = random_values(2 * 2 * 9 * 6, 6);
    auto got = run_forward<double>(b, {causal, full}, {{"q", qv}, {"k", kv}, {"v", vv}});
    const double scale = 1.0 / std::sqrt(8.0);
    require_close<double>(got[0], reference_attention(qv, kv, vv, 4, 9, 9, 8, 6, true, scale).out, "causal_attention");
    require_close<double>(got[1], reference_attention(qv, kv, vv, 4, 9, 9, 8, 6, false, scale).out, "attention");
}

TEST_CASE("attention is deterministic run to run", "[ops][attention]") {
    graph_builder b;
    auto q = b.input("q", bhsd(3, 2, 45, 16));
    auto k = b.input("k", bhsd(3, 2, 45, 16));
    auto v = b.input("v", bhsd(3, 2, 45, 16));
    auto y = ops::causal_attention(q, k, v);
    const named_values in{{"q", random_values(3 * 2 * 45 * 16, 7)},
                          {"k", random_values(3 * 2 * 45 * 16, 8)},
                          {"v", random_values(3 * 2 * 45 * 16, 9)}};
    auto first = run_forward<float>(b, {y}, in);
    for (int run = 0; run < 3; ++run) CHECK(run_forward<float>(b, {y}, in) == first);
}

namespace {

struct attention_grad_reference {
    values dq, dk, dv;
};

// dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(P * dP)), dQ = scale dS K, dK = scale dS^T Q.
attention_grad_reference reference_attention_grad(const values& q, const values& k, const values& v,
                                                  const values& dout, std::int64_t pairs, std::int64_t s,
                                                  std::int64_t t, std::int64_t d, std::int64_t e, bool causal,
                                                  double scale) {
    attention_grad_reference r{values(q.size()), values(k.size()), values(v.size())};
    auto at = [](const values& x, std::int64_t i) { return static_cast<long double>(x[static_cast<std::size_t>(i)]); };
    std::vector<long double> prob(static_cast<std::size_t>(s * t)), ds(static_cast<std::size_t>(s * t));
    for (std::int64_t p = 0; p < pairs; ++p) {
        for (std::int64_t i = 0; i < s; ++i) {
            const std::int64_t keys = causal ? i + 1 : t;
            std::vector<long double> row(static_cast<std::size_t>(t), 0);
            long double top = -INFINITY, total = 0;
            for (std::int64_t j = 0; j < keys; ++j) {
                long double dot = 0;
                for (std::int64_t x = 0; x < d; ++x) dot += at(q, (p * s + i) * d + x) * at(k, (p * t + j) * d + x);
                row[static_cast<std::size_t>(j)] = dot * scale;
                top = std::max(top, row[static_cast<std::size_t>(j)]);
            }
            for (std::int64_t j = 0; j < keys; ++j) total += std::exp(row[static_cast<std::size_t>(j)] - top);
            long double delta = 0;
            for (std::int64_t j = 0; j < t; ++j) {
                const long double pij = j < keys ? std::exp(row[static_cast<std::size_t>(j)] - top) / total : 0;
                long double dp = 0;
                for (std::int64_t c = 0; c < e; ++c) dp += at(dout, (p * s + i) * e + c) * at(v, (p * t + j) * e + c);
                prob[static_cast<std::size_t>(i * t + j)] = pij;
                ds[static_cast<std::size_t>(i * t + j)] = dp;
                delta += pij * dp;
            }
            for (std::int64_t j = 0; j < t; ++j) {
                auto& g = ds[static_cast<std::size_t>(i * t + j)];
                g = prob[static_cast<std::size_t>(i * t + j)] * (g - delta);
            }
        }
        for (std::int64_t i = 0; i < s; ++i)
            for (std::int64_t x = 0; x < d; ++x) {
                long double acc = 0;
                for (std::int64_t j = 0; j < t; ++j)
                    acc += ds[static_cast<std::size_t>(i * t + j)] * at(k, (p * t + j) * d + x);
                r.dq[static_cast<std::size_t>((p * s + i) * d + x)] = static_cast<double>(acc * scale);
            }
        for (std::int64_t j = 0; j < t; ++j) {
            for (std::int64_t x = 0; x < d; ++x) {
                long double acc = 0;
                for (std::int64_t i = 0; i < s; ++i)
                    acc += ds[static_cast<std::size_t>(i * t + j)] * at(q, (p * s + i) * d + x);
                r.dk[static_cast<std::size_t>((p * t + j) * d + x)] = static_cast<double>(acc * scale);
            }
            for (std::int64_t c = 0; c < e; ++c) {
                long double acc = 0;
                for (std::int64_t i = 0; i < s; ++i)
                    acc += prob[static_cast<std::size_t>(i * t + j)] * at(dout, (p * s + i) * e + c);
                r.dv[static_cast<std::size_t>((p * t + j) * e + c)] = static_cast<double>(acc);
            }
        }
    }
    return r;
}

template <class T>
std::vector<T> as(const values& v) {
    return std::vector<T>(v.begin(), v.end());
}

// Runs both kernels on one instruction set, directly on the nodes of a graph; the
// backward reads the reference out and lse, so each kernel is checked on its own.
template <class T>
void check_attention_kernels(const attention_case& c, host::cpu_isa isa) {
    graph_builder b;
    const shape qs = bhsd(c.b, c.h, c.s, c.d), ks = bhsd(c.b, c.h, c.t, c.d), vs = bhsd(c.b, c.h, c.t, c.e),
                os = bhsd(c.b, c.h, c.s, c.e);
    auto q = b.input("q", qs);
    auto k = b.input("k", ks);
    auto v = b.input("v", vs);
    const double scale = 0.8 / std::sqrt(static_cast<double>(c.d));
    const attributes attrs{{"causal", std::int64_t{c.causal}}, {"scale", scale}};
    std::vector<tensor> ins{q, k, v};
    auto outs = b.apply<ops::Attention>(ins, attrs);
    auto dout = b.input("dout", os);
    std::vector<tensor> grad_ins{dout, q, k, v, outs[0], outs[1]};
    auto grads = b.apply<ops::AttentionGrad>(grad_ins, attrs);
    const graph& g = b.view();

    const values qv = random_values(qs.numel(), 51), kv = random_values(ks.numel(), 52),
                 vv = random_values(vs.numel(), 53), dv = random_values(os.numel(), 54);
    const std::int64_t pairs = c.b * c.h;
    const auto ref = reference_attention(qv, kv, vv, pairs, c.s, c.t, c.d, c.e, c.causal, scale);
    const auto ref_grad = reference_attention_grad(qv, kv, vv, dv, pairs, c.s, c.t, c.d, c.e, c.causal, scale);

    std::vector<T> q_t = as<T>(qv), k_t = as<T>(kv), v_t = as<T>(vv), dout_t = as<T>(dv), out_ref = as<T>(ref.out),
                   lse_ref = as<T>(ref.lse);
    std::vector<T> out(ref.out.size()), lse(ref.lse.size()), dq(qv.size()), dk(kv.size()), dvv(vv.size());
    std::vector<void*> fin{q_t.data(), k_t.data(), v_t.data()}, fout{out.data(), lse.data()};
    host::detail::attention::forward<T>({g, g.at(g.tensor(outs[0].id).producer), fin, fout}, isa);
    std::vector<void*> bin{dout_t.data(), q_t.data(), k_t.data(), v_t.data(), out_ref.data(), lse_ref.data()},
        bout{dq.data(), dk.data(), dvv.data()};
    host::detail::attention::backward<T>({g, g.at(g.tensor(grads[0].id).producer), bin, bout}, isa);

    INFO("isa " << host::to_string(isa) << " b=" << c.b << " h=" << c.h << " s=" << c.s << " t=" << c.t
                << " d=" << c.d << " e=" << c.e << " causal=" << c.causal);
    require_close<T>(values(out.begin(), out.end()), ref.out, "attention out");
    require_close<T>(values(lse.begin(), lse.end()), ref.lse, "attention lse");
    require_close<T>(values(dq.begin(), dq.end()), ref_grad.dq, "attention_grad dq");
    require_close<T>(values(dk.begin(), dk.end()), ref_grad.dk, "attention_grad dk");
    require_close<T>(values(dvv.begin(), dvv.end()), ref_grad.dv, "attention_grad dv");
}

}  // namespace

TEST_CASE("attention kernels match a full-matrix reference on every instruction set", "[ops][attention]") {
    const std::vector<attention_case> cases{
        {1, 1, 1, 1, 1, 1, true},     {2, 1, 37, 37, 16, 8, true},  {1, 2, 64, 64, 32, 32, true},
        {1, 1, 70, 70, 64, 20, true}, {1, 2, 33, 47, 5, 32, false}, {2, 1, 9, 3, 8, 8, false},
    };
    for (auto isa : {host::cpu_isa::portable, host::cpu_isa::avx2_fma, host::cpu_isa::avx512f}) {
        if (!host::cpu_isa_supported(isa)) continue;
        for (const auto& c : cases) {
            check_attention_kernels<double>(c, isa);
            check_attention_kernels<float>(c, isa);
        }
    }
}

TEST_CASE("attention shape errors", "[ops][attention][errors]") {
    graph_builder b;
    auto q = b.input("q", bhsd(2, 2, 8, 4));
    auto k = b.input("k", bhsd(2, 2, 6, 4));
    auto v = b.input("v", bhsd(2, 2, 6, 4));
    CHECK_THROWS_AS(ops::causal_attention(q, k, v), shape_error);
    CHECK_THROWS_WITH(ops::causal_attention(q, k, v),
                      Catch::Contains("causal") && Catch::Contains("8 positions") && Catch::Contains("has 6") &&
                          Catch::Contains("ops::attention"));
    CHECK(ops::attention(q, k, v).dims() == bhsd(2, 2, 8, 4));
    auto k5 = b.input("k5", bhsd(2, 2, 6, 5));
    CHECK_THROWS_WITH(ops::attention(q, k5, v), Catch::Contains("'k5'") && Catch::Contains("HeadDim=5"));
    CHECK_THROWS_WITH(ops::attention(q, k, v, -1.0), Catch::Contains("positive scale"));
}

// ---- matmul ---------------------------------------------------------------------------------

namespace {

template <class T>
void check_products(std::vector<std::int64_t> lead, std::int64_t m, std::int64_t n, std::int64_t k) {
    std::int64_t batch = 1;
    shape la, lb, lc;
    auto lead_shape = [&](std::int64_t r, std::int64_t c) {
        shape s;
        for (std::size_t i = 0; i < lead.size(); ++i) s.push_back({i == 0 ? Dim::Batch::id : Dim::Head::id, lead[i]});
        s.push_back({Dim::Seq::id, r});
        s.push_back({Dim::Hidden::id, c});
        return s;
    };
    for (std::int64_t x : lead) batch *= x;
    graph_builder b;
    auto a_nn = b.input("a_nn", lead_shape(m, k));
    auto b_nn = b.input("b_nn", lead_shape(k, n));
    auto b_nt = b.input("b_nt", lead_shape(n, k));
    auto a_tn = b.input("a_tn", lead_shape(k, m));
    auto c_nn = ops::matmul(a_nn, b_nn);
    auto c_nt = ops::matmul_nt(a_nn, b_nt);
    auto c_tn = ops::matmul_tn(a_tn, b_nn);
    CHECK(c_nn.dims() == lead_shape(m, n));
    CHECK(c_tn.dims().extent(lead.size()) == m);
    const values an = random_values(batch * m * k, 11), bn = random_values(batch * k * n, 12),
                 bt = random_values(batch * n * k, 13), at = random_values(batch * k * m, 14);
    auto got = run_forward<T>(b, {c_nn, c_nt, c_tn}, {{"a_nn", an}, {"b_nn", bn}, {"b_nt", bt}, {"a_tn", at}});
    INFO("leading " << lead.size() << " m=" << m << " n=" << n << " k=" << k);
    require_close<T>(got[0], reference_product(an, bn, batch, m, n, k, false, false), "matmul");
    require_close<T>(got[1], reference_product(an, bt, batch, m, n, k, false, true), "matmul_nt");
    require_close<T>(got[2], reference_product(at, bn, batch, m, n, k, true, false), "matmul_tn");
}

}  // namespace

TEST_CASE("matmul, matmul_nt and matmul_tn match a reference", "[ops][matmul]") {
    check_products<double>({}, 5, 7, 3);
    check_products<float>({}, 5, 7, 3);
    check_products<double>({3}, 4, 6, 9);
    check_products<float>({3}, 4, 6, 9);
    check_products<double>({2, 3}, 17, 33, 20);
    check_products<float>({2, 3}, 17, 33, 20);
    check_products<double>({1}, 1, 1, 1);
}

TEST_CASE("matmul shape errors name the operand and the dim", "[ops][matmul][errors]") {
    graph_builder b;
    auto a = b.input("a", {{Dim::Batch::id, 2}, {Dim::Seq::id, 3}, {Dim::Hidden::id, 4}});
    auto w = b.input("w", {{Dim::Batch::id, 2}, {Dim::Hidden::id, 5}, {Dim::FFN::id, 6}});
    CHECK_THROWS_WITH(ops::matmul(a, w), Catch::Contains("matmul") && Catch::Contains("'w'") &&
                                             Catch::Contains("Hidden=5") && Catch::Contains("'k' = 4"));
    auto other_batch = b.input("u", {{Dim::Batch::id, 3}, {Dim::Hidden::id, 4}, {Dim::FFN::id, 6}});
    CHECK_THROWS_WITH(ops::matmul(a, other_batch), Catch::Contains("'u'") && Catch::Contains("leading axis 0"));
}

// ---- reshape, transpose, heads ----------------------------------------------------------------

TEST_CASE("reshape keeps the elements and takes the target's names; round trip", "[ops][reshape]") {
    graph_builder b;
    const shape from{{Dim::Batch::id, 2}, {Dim::Seq::id, 3}, {Dim::Hidden::id, 4}};
    const shape to{{Dim::Batch::id, 6}, {Dim::Head::id, 2}, {Dim::HeadDim::id, 2}};
    auto x = b.input("x", from);
    auto y = ops::reshape(x, to);
    auto back = ops::reshape(y, from);
    auto flat = ops::reshape(x, shape{{dim_id{}, 24}});
    CHECK(y.dims() == to);
    CHECK(back.dims() == from);
    CHECK(flat.dims().rank() == 1);
    const node& n = b.view().at(b.view().tensor(y.id).producer);
    CHECK(n.attrs.get<std::string>("dims") == "Batch,Head,HeadDim");
    CHECK(n.attrs.get<std::vector<std::int64_t>>("extents") == std::vector<std::int64_t>{6, 2, 2});
    static_assert(ops::Reshape::opaque_layout);
    const values xv = random_values(24, 21);
    auto got = run_forward<float>(b, {y, back, flat}, {{"x", xv}});
    require_close<float>(got[0], xv, "reshape");
    require_close<float>(got[1], xv, "reshape round trip");
    require_close<float>(got[2], xv, "reshape to rank 1");
}

TEST_CASE("reshape refuses a target with another element count", "[ops][reshape][errors]") {
    graph_builder b;
    auto x = b.input("x", {{Dim::Batch::id, 2}, {Dim::Hidden::id, 6}});
    CHECK_THROWS_AS(ops::reshape(x, {{Dim::Batch::id, 5}, {Dim::Hidden::id, 2}}), shape_error);
    CHECK_THROWS_WITH(ops::reshape(x, {{Dim::Batch::id, 5}, {Dim::Hidden::id, 2}}),
                      Catch::Contains("[Batch=2, Hidden=6]") && Catch::Contains("12 elements") &&
                          Catch::Contains("[Batch=5, Hidden=2]") && Catch::Contains("10 elements"));
    CHECK_THROWS_WITH(ops::reshape(x, {{dim_id{"a,b"}, 12}}), Catch::Contains("contains ','"));
}

TEST_CASE("transpose swaps the last two axes; twice is the identity", "[ops][transpose]") {
    for (auto [lead, rows, cols] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
             {1, 1, 1}, {3, 5, 7}, {2, 40, 33}, {4, 64, 70}}) {
        graph_builder b;
        auto x = b.input("x", {{Dim::Batch::id, lead}, {Dim::Seq::id, rows}, {Dim::Hidden::id, cols}});
        auto y = ops::transpose(x);
        auto z = ops::transpose(y);
        CHECK(y.dims() == shape{{Dim::Batch::id, lead}, {Dim::Hidden::id, cols}, {Dim::Seq::id, rows}});
        const values xv = random_values(lead * rows * cols, 31);
        values ref(xv.size());
        for (std::int64_t g = 0; g < lead; ++g)
            for (std::int64_t i = 0; i < rows; ++i)
                for (std::int64_t j = 0; j < cols; ++j)
                    ref[static_cast<std::size_t>((g * cols + j) * rows + i)] =
                        xv[static_cast<std::size_t>((g * rows + i) * cols + j)];
        auto got = run_forward<double>(b, {y, z}, {{"x", xv}});
        require_close<double>(got[0], ref, "transpose");
        require_close<double>(got[1], xv, "transpose twice");
        auto gotf = run_forward<float>(b, {y}, {{"x", xv}});
        require_close<float>(gotf[0], ref, "transpose");
    }
}

TEST_CASE("split_heads and merge_heads move head rows and invert each other", "[ops][heads]") {
    const std::int64_t batch = 2, seq = 5, heads = 3, dim = 4;
    graph_builder b;
    auto x = b.input("x", {{Dim::Batch::id, batch}, {Dim::Seq::id, seq}, {Dim::Hidden::id, heads * dim}});
    auto y = ops::split_heads(x, heads);
    auto z = ops::merge_heads(y);
    CHECK(y.dims() == bhsd(batch, heads, seq, dim));
    CHECK(z.dims() == x.dims());
    const values xv = random_values(batch * seq * heads * dim, 41);
    values ref(xv.size());
    for (std::int64_t bb = 0; bb < batch; ++bb)
        for (std::int64_t s = 0; s < seq; ++s)
            for (std::int64_t h = 0; h < heads; ++h)
                for (std::int64_t d = 0; d < dim; ++d)
                    ref[static_cast<std::size_t>(((bb * heads + h) * seq + s) * dim + d)] =
                        xv[static_cast<std::size_t>((bb * seq + s) * heads * dim + h * dim + d)];
    auto got = run_forward<double>(b, {y, z}, {{"x", xv}});
    require_close<double>(got[0], ref, "split_heads");
    require_close<double>(got[1], xv, "merge_heads of split_heads");
    auto gotf = run_forward<float>(b, {y, z}, {{"x", xv}});
    require_close<float>(gotf[0], ref, "split_heads");
    require_close<float>(gotf[1], xv, "merge_heads of split_heads");
}

TEST_CASE("split_heads refuses a head count that does not divide hidden", "[ops][heads][errors]") {
    graph_builder b;
    auto x = b.input("x", {{Dim::Batch::id, 2}, {Dim::Seq::id, 5}, {Dim::Hidden::id, 10}});
    CHECK_THROWS_AS(ops::split_heads(x, 3), shape_error);
    CHECK_THROWS_WITH(ops::split_heads(x, 3), Catch::Contains("hidden extent 10") && Catch::Contains("heads = 3") &&
                                                  Catch::Contains("choose a head count that divides 10"));
    CHECK_THROWS_WITH(ops::split_heads(x, 0), Catch::Contains("heads = 0"));
    auto four = b.input("four", bhsd(2, 5, 2, 2));
    CHECK_THROWS_WITH(ops::split_heads(four, 2), Catch::Contains("rank 4") && Catch::Contains("rank 3"));
}
