// layer_norm, rms_norm, embedding and cross_entropy: forward (and the fused backward ops)
// against straightforward long-double references in float and double, vocabulary-parallel
// embedding as partial sums, results independent of the thread count, and every error the
// ops raise at build time or run time.
//
// Tolerance: |out - ref| <= tol (1 + |ref|) with tol = 1e-5 for float, 1e-12 for double.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <loom/autograd/autograd.hpp>
#include <loom/graph/builder.hpp>
#include <loom/ops/all.hpp>
#include <loom/runtime/compile.hpp>
#include <loom/runtime/host/bound_storage.hpp>
#include <loom/runtime/host/executor.hpp>
#include <loom/runtime/host/kernels/cross_entropy.hpp>
#include <loom/runtime/host/kernels/layer_norm.hpp>

using namespace loom;
using ld = long double;

namespace {

shape make_shape(std::vector<std::int64_t> extents, dim_id last) {
    static const dim_id leading[] = {Dim::Batch::id, Dim::Seq::id, Dim::Head::id};
    std::vector<axis> axes;
    for (std::size_t i = 0; i + 1 < extents.size(); ++i) axes.push_back({leading[i], extents[i]});
    axes.push_back({last, extents.back()});
    return shape(std::move(axes));
}
shape leading_shape(std::vector<std::int64_t> extents) {
    static const dim_id leading[] = {Dim::Batch::id, Dim::Seq::id, Dim::Head::id};
    std::vector<axis> axes;
    for (std::size_t i = 0; i < extents.size(); ++i) axes.push_back({leading[i], extents[i]});
    return shape(std::move(axes));
}

// Deterministic values in [-1, 1).
struct value_stream {
    std::uint64_t state;
    double next() {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return static_cast<double>(state >> 11) * 0x1.0p-53 * 2.0 - 1.0;
    }
    std::int32_t index(std::int32_t n) { return static_cast<std::int32_t>((next() + 1.0) * 0.5 * n) % n; }
};

template <class T>
void fill(std::span<T> s, std::uint64_t seed, double scale = 1.0, double offset = 0.0) {
    value_stream v{seed};
    for (auto& x : s) x = static_cast<T>(offset + scale * v.next());
}

template <class T>
constexpr double tolerance() {
    return std::is_same_v<T, float> ? 1e-5 : 1e-12;
}

template <class T>
void require_close(std::span<const T> got, const std::vector<ld>& ref, const char* what) {
    REQUIRE(got.size() == ref.size());
    for (std::size_t i = 0; i < ref.size(); ++i) {
        INFO(what << " element " << i << ": got " << got[i] << " reference " << static_cast<double>(ref[i]));
        REQUIRE(std::abs(static_cast<ld>(got[i]) - ref[i]) <= tolerance<T>() * (1 + std::abs(ref[i])));
    }
}

// A graph compiled for T and bound to owned storage. Not movable: the program points at
// the graph and the executor at the program.
template <class T>
struct runner {
    graph g;
    program p;
    host::executor<T> ex;
    host::bound_storage<T> st;

    runner(graph_builder&& b, std::vector<tensor_id> outputs, bool backward = false)
        : g(std::move(b).take()),
          p(compile_program(g, {.prec = std::is_same_v<T, float> ? precision::f32 : precision::f64,
                                .include_backward = backward,
                                .outputs = std::move(outputs)})),
          ex(p),
          st(p) {
        st.bind_to(ex);
    }
    runner(const runner&) = delete;

    std::span<T> real(std::string_view name) { return st.real(name); }
    std::span<T> real(tensor_id t) { return st.real(t); }
    std::span<std::int32_t> index(std::string_view name) { return st.index(name); }
    std::span<T> grad(std::string_view param) { return st.real("grad/" + std::string(param)); }
    void run() { ex.run(); }
    // Runs with every parallel_for inline on this thread: one thread, same blocks.
    void run_single_threaded() {
        host::parallel_for(0, 1, 1, [&](std::int64_t, std::int64_t) { ex.run(); });
    }
};

template <class T>
std::vector<T> copy(std::span<const T> s) {
    return {s.begin(), s.end()};
}
template <class T>
std::vector<T> copy(std::span<T> s) {
    return {s.begin(), s.end()};
}

// ---- references -------------------------------------------------------------------------

template <class T>
std::vector<ld> layer_norm_ref(std::span<const T> x, std::span<const T> gamma, std::span<const T> beta, double eps) {
    const std::size_t h = gamma.size(), rows = x.size() / h;
    std::vector<ld> y(x.size());
    for (std::size_t r = 0; r < rows; ++r) {
        ld mean = 0, var = 0;
        for (std::size_t i = 0; i < h; ++i) mean += x[r * h + i];
        mean /= static_cast<ld>(h);
        for (std::size_t i = 0; i < h; ++i) var += (x[r * h + i] - mean) * (x[r * h + i] - mean);
        var /= static_cast<ld>(h);
        for (std::size_t i = 0; i < h; ++i)
            y[r * h + i] = (x[r * h + i] - mean) / std::sqrt(var + static_cast<ld>(eps)) * gamma[i] + beta[i];
    }
    return y;
}

template <class T>
std::vector<ld> rms_norm_ref(std::span<const T> x, std::span<const T> gamma, double eps) {
    const std::size_t h = gamma.size(), rows = x.size() / h;
    std::vector<ld> y(x.size());
    for (std::size_t r = 0; r < rows; ++r) {
        ld ms = 0;
        for (std::size_t i = 0; i < h; ++i) ms += static_cast<ld>(x[r * h + i]) * x[r * h + i];
        ms /= static_cast<ld>(h);
        for (std::size_t i = 0; i < h; ++i) y[r * h + i] = x[r * h + i] / std::sqrt(ms + static_cast<ld>(eps)) * gamma[i];
    }
    return y;
}

// The gradients of L = sum(y * probe) through layer_norm (rms = false) or rms_norm (rms =
// true, beta unused), by the chain rule on the definition, written out per row.
template <class T>
void norm_grad_ref(bool rms, std::span<const T> x, std::span<const T> gamma, std::span<const T> probe, double eps,
                   std::vector<ld>& dx, std::vector<ld>& dgamma, std::vector<ld>& dbeta) {
    const std::size_t h = gamma.size(), rows = x.size() / h;
    dx.assign(x.size(), 0);
    dgamma.assign(h, 0);
    dbeta.assign(h, 0);
    for (std::size_t r = 0; r < rows; ++r) {
        const T* xr = x.data() + r * h;
        const T* pr = probe.data() + r * h;
        ld mean = 0, var = 0;
        if (!rms) {
            for (std::size_t i = 0; i < h; ++i) mean += xr[i];
            mean /= static_cast<ld>(h);
        }
        for (std::size_t i = 0; i < h; ++i) var += (xr[i] - mean) * (xr[i] - mean);
        var /= static_cast<ld>(h);
        const ld rstd = 1 / std::sqrt(var + static_cast<ld>(eps));
        // d/dx_k of xhat_i = (x_i - mean) rstd is rstd (delta_ik - [!rms]/h) - xhat_i xhat_k rstd / h.
        for (std::size_t k = 0; k < h; ++k) {
            const ld xhat_k = (xr[k] - mean) * rstd;
            ld s = 0;
            for (std::size_t i = 0; i < h; ++i) {
                const ld xhat_i = (xr[i] - mean) * rstd;
                const ld d = rstd * ((i == k ? 1 : 0) - (rms ? 0 : 1) / static_cast<ld>(h)) - xhat_i * xhat_k * rstd / h;
                s += static_cast<ld>(pr[i]) * gamma[i] * d;
            }
            dx[r * h + k] = s;
            dgamma[k] += static_cast<ld>(pr[k]) * xhat_k;
            dbeta[k] += pr[k];
        }
    }
}

template <class T>
ld cross_entropy_ref(std::span<const T> logits, std::span<const std::int32_t> targets, std::int64_t ignore,
                     ld normalizer) {
    const std::size_t v = logits.size() / targets.size();
    ld total = 0;
    for (std::size_t r = 0; r < targets.size(); ++r) {
        if (targets[r] == ignore) continue;
        ld m = logits[r * v];
        for (std::size_t i = 0; i < v; ++i) m = std::max<ld>(m, logits[r * v + i]);
        ld s = 0;
        for (std::size_t i = 0; i < v; ++i) s += std::exp(static_cast<ld>(logits[r * v + i]) - m);
        total += m + std::log(s) - logits[r * v + static_cast<std::size_t>(targets[r])];
    }
    return total / normalizer;
}

template <class T>
std::vector<ld> cross_entropy_grad_ref(std::span<const T> logits, std::span<const std::int32_t> targets,
                                       std::int64_t ignore, ld dloss, ld normalizer) {
    const std::size_t v = logits.size() / targets.size();
    std::vector<ld> d(logits.size(), 0);
    for (std::size_t r = 0; r < targets.size(); ++r) {
        if (targets[r] == ignore) continue;
        ld m = logits[r * v];
        for (std::size_t i = 0; i < v; ++i) m = std::max<ld>(m, logits[r * v + i]);
        ld s = 0;
        for (std::size_t i = 0; i < v; ++i) s += std::exp(static_cast<ld>(logits[r * v + i]) - m);
        for (std::size_t i = 0; i < v; ++i)
            d[r * v + i] = dloss / normalizer *
                           (std::exp(static_cast<ld>(logits[r * v + i]) - m) / s -
                            (static_cast<std::int32_t>(i) == targets[r] ? 1 : 0));
    }
    return d;
}

}  // namespace

// ---- layer_norm and rms_norm ---------------------------------------------------------------

TEMPLATE_TEST_CASE("layer_norm matches the reference, forward and fused backward", "[norm]", float, double) {
    using T = TestType;
    const std::vector<std::vector<std::int64_t>> shapes{{7}, {3, 5, 37}, {4, 128}, {3, 50, 13}, {2, 1}};
    for (const auto& ext : shapes) {
        for (double eps : {1e-5, 0.25}) {
            INFO("shape " << make_shape(ext, Dim::Hidden::id).to_string() << " eps " << eps);
            graph_builder b;
            const std::int64_t h = ext.back();
            auto x = b.parameter("x", make_shape(ext, Dim::Hidden::id), parameter_init::zeros());
            auto gamma = b.parameter("gamma", {{Dim::Hidden::id, h}}, parameter_init::zeros());
            auto beta = b.parameter("beta", {{Dim::Hidden::id, h}}, parameter_init::zeros());
            auto probe = b.input("probe", x.dims());
            auto y = ops::layer_norm(x, gamma, beta, eps);
            b.set_loss(ops::sum(ops::mul(y, probe)));
            build_backward(b);
            runner<T> r(std::move(b), {y.id}, true);
            fill(r.real("x"), 1, 2.0, 0.5);
            fill(r.real("gamma"), 2, 1.0, 1.0);
            fill(r.real("beta"), 3);
            fill(r.real("probe"), 4);
            r.run();
            auto xs = copy(r.real("x")), gs = copy(r.real("gamma")), bs = copy(r.real("beta")),
                 ps = copy(r.real("probe"));
            require_close<T>(r.real(y.id), layer_norm_ref<T>(xs, gs, bs, eps), "y");
            std::vector<ld> dx, dgamma, dbeta;
            norm_grad_ref<T>(false, xs, gs, ps, eps, dx, dgamma, dbeta);
            // Gradients sum over rows: allow for the row count in float.
            require_close<T>(r.grad("x"), dx, "dx");
            auto dg = copy(r.grad("gamma")), db = copy(r.grad("beta"));
            const ld rows = static_cast<ld>(xs.size() / gs.size());
            for (std::size_t i = 0; i < dgamma.size(); ++i) {
                INFO("dgamma/dbeta element " << i);
                REQUIRE(std::abs(dg[i] - dgamma[i]) <= tolerance<T>() * rows * (1 + std::abs(dgamma[i])));
                REQUIRE(std::abs(db[i] - dbeta[i]) <= tolerance<T>() * rows * (1 + std::abs(dbeta[i])));
            }
        }
    }
}

TEMPLATE_TEST_CASE("rms_norm matches the reference, forward and fused backward", "[norm]", float, double) {
    using T = TestType;
    const std::vector<std::vector<std::int64_t>> shapes{{7}, {3, 5, 37}, {4, 128}, {3, 50, 13}, {2, 1}};
    for (const auto& ext : shapes) {
        for (double eps : {1e-6, 0.25}) {
            INFO("shape " << make_shape(ext, Dim::Hidden::id).to_string() << " eps " << eps);
            graph_builder b;
            const std::int64_t h = ext.back();
            auto x = b.parameter("x", make_shape(ext, Dim::Hidden::id), parameter_init::zeros());
            auto gamma = b.parameter("gamma", {{Dim::Hidden::id, h}}, parameter_init::zeros());
            auto probe = b.input("probe", x.dims());
            auto y = ops::rms_norm(x, gamma, eps);
            b.set_loss(ops::sum(ops::mul(y, probe)));
            build_backward(b);
            runner<T> r(std::move(b), {y.id}, true);
            fill(r.real("x"), 11, 2.0, 0.5);
            fill(r.real("gamma"), 12, 1.0, 1.0);
            fill(r.real("probe"), 14);
            r.run();
            auto xs = copy(r.real("x")), gs = copy(r.real("gamma")), ps = copy(r.real("probe"));
            require_close<T>(r.real(y.id), rms_norm_ref<T>(xs, gs, eps), "y");
            std::vector<ld> dx, dgamma, dbeta;
            norm_grad_ref<T>(true, xs, gs, ps, eps, dx, dgamma, dbeta);
            require_close<T>(r.grad("x"), dx, "dx");
            auto dg = copy(r.grad("gamma"));
            const ld rows = static_cast<ld>(xs.size() / gs.size());
            for (std::size_t i = 0; i < dgamma.size(); ++i) {
                INFO("dgamma element " << i);
                REQUIRE(std::abs(dg[i] - dgamma[i]) <= tolerance<T>() * rows * (1 + std::abs(dgamma[i])));
            }
        }
    }
}

TEMPLATE_TEST_CASE("norm gradients do not depend on the thread count", "[norm][determinism]", float, double) {
    using T = TestType;
    graph_builder b;
    // 300 rows: five row blocks, more than one range per thread.
    auto x = b.parameter("x", make_shape({6, 50, 96}, Dim::Hidden::id), parameter_init::zeros());
    auto gamma = b.parameter("gamma", {{Dim::Hidden::id, 96}}, parameter_init::zeros());
    auto beta = b.parameter("beta", {{Dim::Hidden::id, 96}}, parameter_init::zeros());
    auto probe = b.input("probe", x.dims());
    auto y = ops::add(ops::layer_norm(x, gamma, beta), ops::rms_norm(x, gamma));
    b.set_loss(ops::sum(ops::mul(y, probe)));
    build_backward(b);
    runner<T> r(std::move(b), {}, true);
    fill(r.real("x"), 21, 3.0);
    fill(r.real("gamma"), 22, 1.0, 1.0);
    fill(r.real("beta"), 23);
    fill(r.real("probe"), 24);
    r.run();
    auto dx = copy(r.grad("x")), dg = copy(r.grad("gamma")), db = copy(r.grad("beta"));
    r.run_single_threaded();
    CHECK(std::memcmp(dx.data(), r.grad("x").data(), dx.size() * sizeof(T)) == 0);
    CHECK(std::memcmp(dg.data(), r.grad("gamma").data(), dg.size() * sizeof(T)) == 0);
    CHECK(std::memcmp(db.data(), r.grad("beta").data(), db.size() * sizeof(T)) == 0);
}

TEST_CASE("norm ops state their laws in their signatures", "[norm]") {
    graph_builder b;
    auto x = b.input("x", make_shape({2, 3, 8}, Dim::Hidden::id));
    auto gamma = b.input("gamma", {{Dim::Hidden::id, 8}});
    auto y = ops::layer_norm(x, gamma, gamma);
    const node& n = b.view().at(b.view().tensor(y.id).producer);
    // Only the leading dims split; hidden is frozen.
    auto splits = n.sig.legal_splits();
    REQUIRE(splits.size() == 2);
    for (const auto& s : splits) CHECK(s.role == dim_role::spatial);
    // The fused backward: a batch split leaves dgamma and dbeta as partial sums.
    auto grads = ops::layer_norm_grad(y, x, gamma, 1e-5);
    const node& gn = b.view().at(b.view().tensor(grads.dx.id).producer);
    auto batch = gn.sig.effect_of_split(*gn.sig.find(Dim::Batch::id));
    CHECK(batch.role == dim_role::contracted);
    CHECK(batch.outputs[0].effect == split_effect::sliced);
    CHECK(batch.outputs[1].effect == split_effect::partial);
    CHECK(batch.outputs[2].effect == split_effect::partial);
    CHECK(grads.dgamma.dims() == shape{{Dim::Hidden::id, 8}});
}

TEST_CASE("norm ops reject mismatched hidden sizes, index inputs and bad eps", "[norm][errors]") {
    graph_builder b;
    auto x = b.input("x", make_shape({2, 3, 8}, Dim::Hidden::id));
    auto gamma = b.input("gamma", {{Dim::Hidden::id, 8}});
    auto gamma7 = b.input("gamma7", {{Dim::Hidden::id, 7}});
    auto ids = b.input("ids", leading_shape({2, 3}), value_kind::index);
    auto ids8 = b.input("ids8", make_shape({2, 8}, Dim::Hidden::id), value_kind::index);
    CHECK_THROWS_AS(ops::layer_norm(x, gamma, gamma7), shape_error);
    CHECK_THROWS_WITH(ops::layer_norm(x, gamma, gamma7), Catch::Contains("layer_norm") && Catch::Contains("'gamma7'") &&
                                                             Catch::Contains("Hidden=7") && Catch::Contains("'h' = 8"));
    CHECK_THROWS_WITH(ops::layer_norm(x, gamma7, gamma), Catch::Contains("'gamma7'") && Catch::Contains("Hidden=7"));
    CHECK_THROWS_WITH(ops::rms_norm(x, gamma7), Catch::Contains("rms_norm") && Catch::Contains("'gamma7'") &&
                                                    Catch::Contains("Hidden=7") && Catch::Contains("'h' = 8"));
    CHECK_THROWS_WITH(ops::layer_norm(x, x, gamma), Catch::Contains("layer_norm") && Catch::Contains("rank"));
    CHECK_THROWS_WITH(ops::layer_norm(ids8, gamma, gamma),
                      Catch::Contains("'ids8'") && Catch::Contains("index tensor"));
    CHECK_THROWS_WITH(ops::rms_norm(ids8, gamma), Catch::Contains("'ids8'") && Catch::Contains("index tensor"));
    CHECK_THROWS_AS(ops::layer_norm(x, gamma, gamma, -1.0), usage_error);
    CHECK_THROWS_WITH(ops::rms_norm(x, gamma, -1e-6), Catch::Contains("rms_norm") && Catch::Contains("eps"));
    (void)ids;
}

// ---- embedding --------------------------------------------------------------------------

TEMPLATE_TEST_CASE("embedding looks rows up and its gradient sums repeated ids", "[embedding]", float, double) {
    using T = TestType;
    const std::int64_t vocab = 11, h = 13;
    graph_builder b;
    auto ids = b.input("ids", leading_shape({3, 40}), value_kind::index);
    auto table = b.parameter("table", {{Dim::Vocab::id, vocab}, {Dim::Hidden::id, h}}, parameter_init::zeros());
    auto probe = b.input("probe", make_shape({3, 40, h}, Dim::Hidden::id));
    auto y = ops::embedding(ids, table);
    CHECK(y.dims() == make_shape({3, 40, h}, Dim::Hidden::id));
    b.set_loss(ops::sum(ops::mul(y, probe)));
    build_backward(b);
    runner<T> r(std::move(b), {y.id}, true);
    value_stream v{31};
    auto is = r.index("ids");
    for (auto& i : is) i = v.index(static_cast<std::int32_t>(vocab - 2));  // rows 9 and 10 never used
    fill(r.real("table"), 32);
    fill(r.real("probe"), 33);
    r.run();
    auto tab = copy(r.real("table")), pr = copy(r.real("probe"));
    auto out = r.real(y.id);
    for (std::size_t p = 0; p < is.size(); ++p)
        for (std::int64_t j = 0; j < h; ++j)
            REQUIRE(out[p * h + static_cast<std::size_t>(j)] == tab[static_cast<std::size_t>(is[p] * h + j)]);
    std::vector<ld> dtable(tab.size(), 0);
    for (std::size_t p = 0; p < is.size(); ++p)
        for (std::int64_t j = 0; j < h; ++j) dtable[static_cast<std::size_t>(is[p] * h + j)] += pr[p * h + static_cast<std::size_t>(j)];
    require_close<T>(r.grad("table"), dtable, "dtable");
    for (std::int64_t j = 9 * h; j < vocab * h; ++j) CHECK(r.grad("table")[static_cast<std::size_t>(j)] == 0);
    // One thread and many give the same bits.
    auto dt = copy(r.grad("table"));
    r.run_single_threaded();
    CHECK(std::memcmp(dt.data(), r.grad("table").data(), dt.size() * sizeof(T)) == 0);
}

TEMPLATE_TEST_CASE("vocabulary-parallel embedding: pieces with row_offset sum to the full lookup", "[embedding]", float,
                   double) {
    using T = TestType;
    const std::int64_t vocab = 10, h = 5;
    graph_builder b;
    auto ids = b.input("ids", leading_shape({2, 9}), value_kind::index);
    auto full = b.input("full", {{Dim::Vocab::id, vocab}, {Dim::Hidden::id, h}});
    auto low = b.input("low", {{Dim::Vocab::id, 4}, {Dim::Hidden::id, h}});
    auto high = b.input("high", {{Dim::Vocab::id, 6}, {Dim::Hidden::id, h}});
    auto dy = b.input("dy", make_shape({2, 9, h}, Dim::Hidden::id));
    auto y_full = ops::embedding(ids, full);
    auto y_low = b.apply1<ops::Embedding>({ids, low}, {{"vocab", vocab}, {"row_offset", std::int64_t{0}}});
    auto y_high = b.apply1<ops::Embedding>({ids, high}, {{"vocab", vocab}, {"row_offset", std::int64_t{4}}});
    auto g_full = ops::embedding_grad(dy, ids, vocab, Dim::Vocab::id, vocab);
    auto g_high = ops::embedding_grad(dy, ids, 6, Dim::Vocab::id, vocab, 4);
    CHECK(g_high.dims() == shape{{Dim::Vocab::id, 6}, {Dim::Hidden::id, h}});
    runner<T> r(std::move(b), {y_full.id, y_low.id, y_high.id, g_full.id, g_high.id});
    auto is = r.index("ids");
    for (std::size_t p = 0; p < is.size(); ++p) is[p] = static_cast<std::int32_t>((p * 7) % vocab);
    fill(r.real("full"), 41);
    auto f = r.real("full");
    std::copy(f.begin(), f.begin() + 4 * h, r.real("low").begin());
    std::copy(f.begin() + 4 * h, f.end(), r.real("high").begin());
    fill(r.real("dy"), 42);
    r.run();
    auto yf = r.real(y_full.id), yl = r.real(y_low.id), yh = r.real(y_high.id);
    for (std::size_t p = 0; p < is.size(); ++p)
        for (std::size_t j = 0; j < static_cast<std::size_t>(h); ++j) {
            const std::size_t k = p * static_cast<std::size_t>(h) + j;
            // Exactly one piece holds the row; the other contributes zeros.
            CHECK((is[p] < 4 ? yh[k] : yl[k]) == 0);
            CHECK(yl[k] + yh[k] == yf[k]);
        }
    // The high piece's gradient is the full gradient's rows [4, 10).
    auto gf = r.real(g_full.id), gh = r.real(g_high.id);
    for (std::size_t k = 0; k < gh.size(); ++k) CHECK(gh[k] == gf[k + 4 * static_cast<std::size_t>(h)]);
}

TEST_CASE("embedding errors: bad ids at run time, kinds, ranks and row ranges at build time", "[embedding][errors]") {
    {
        graph_builder b;
        auto ids = b.input("tokens", leading_shape({2, 4}), value_kind::index);
        auto table = b.input("table", {{Dim::Vocab::id, 10}, {Dim::Hidden::id, 3}});
        auto y = ops::embedding(ids, table);
        runner<double> r(std::move(b), {y.id});
        auto is = r.index("tokens");
        for (std::size_t p = 0; p < is.size(); ++p) is[p] = static_cast<std::int32_t>(p);
        is[5] = 10;
        is[7] = 12;  // only the first bad position is reported
        CHECK_THROWS_AS(r.run(), usage_error);
        CHECK_THROWS_WITH(r.run(), Catch::Contains("embedding 'embedding'") && Catch::Contains("id 10 ") &&
                                       Catch::Contains("position 5 (Batch 1, Seq 1)") &&
                                       Catch::Contains("'tokens'") && Catch::Contains("[0, 10)"));
        is[5] = -1;
        CHECK_THROWS_WITH(r.run(), Catch::Contains("id -1 ") && Catch::Contains("position 5"));
        is[5] = 0;
        is[7] = 0;
        CHECK_NOTHROW(r.run());
    }
    {
        graph_builder b;
        auto ids = b.input("ids", leading_shape({2, 4}), value_kind::index);
        auto real_ids = b.input("real_ids", leading_shape({2, 4}));
        auto table = b.input("table", {{Dim::Vocab::id, 10}, {Dim::Hidden::id, 3}});
        auto flat = b.input("flat", {{Dim::Hidden::id, 30}});
        CHECK_THROWS_AS(ops::embedding(real_ids, table), shape_error);
        CHECK_THROWS_WITH(ops::embedding(real_ids, table),
                          Catch::Contains("embedding") && Catch::Contains("'real_ids'") && Catch::Contains("index"));
        CHECK_THROWS_WITH(ops::embedding(ids, ids), Catch::Contains("'ids'") && Catch::Contains("real tensor"));
        CHECK_THROWS_WITH(ops::embedding(ids, flat), Catch::Contains("'flat'") && Catch::Contains("rank 1"));
        CHECK_THROWS_WITH((b.apply1<ops::Embedding>({ids, table}, {{"vocab", std::int64_t{12}},
                                                                   {"row_offset", std::int64_t{4}}})),
                          Catch::Contains("rows [4, 14)") && Catch::Contains("[0, 12)"));
    }
}

// ---- cross_entropy ----------------------------------------------------------------------

TEMPLATE_TEST_CASE("cross_entropy matches PyTorch's mean and its gradient", "[loss]", float, double) {
    using T = TestType;
    struct config {
        std::vector<std::int64_t> lead;
        std::int64_t v;
        double scale;  // logit magnitude: 300 checks the row-max shift (exp(300) overflows float)
        std::int64_t ignore;
        int ignored_every;  // every k-th position gets ignore_index; 0 = none
    };
    const std::vector<config> configs{{{3, 7}, 11, 3.0, -100, 0},  {{2, 50}, 257, 2.0, -100, 0},
                                      {{5}, 2, 300.0, -100, 0},    {{3, 7}, 11, 3.0, -100, 3},
                                      {{4, 33}, 19, 3.0, 5, 0},    {{1}, 1, 1.0, -100, 0}};
    for (const auto& cfg : configs) {
        INFO("v " << cfg.v << " scale " << cfg.scale << " ignore " << cfg.ignore << " every " << cfg.ignored_every);
        graph_builder b;
        std::vector<std::int64_t> ext = cfg.lead;
        ext.push_back(cfg.v);
        auto logits = b.parameter("logits", make_shape(ext, Dim::Vocab::id), parameter_init::zeros());
        auto targets = b.input("targets", leading_shape(cfg.lead), value_kind::index);
        auto loss = ops::cross_entropy(logits, targets, cfg.ignore);
        CHECK(loss.rank() == 0);
        b.set_loss(ops::scale(loss, 1.75));  // dloss = 1.75 reaches cross_entropy_grad
        build_backward(b);
        runner<T> r(std::move(b), {loss.id}, true);
        fill(r.real("logits"), 51, cfg.scale);
        value_stream v{52};
        auto ts = r.index("targets");
        std::int64_t kept = 0;
        for (std::size_t p = 0; p < ts.size(); ++p) {
            ts[p] = v.index(static_cast<std::int32_t>(cfg.v));
            if (cfg.ignored_every && p % static_cast<std::size_t>(cfg.ignored_every) == 0)
                ts[p] = static_cast<std::int32_t>(cfg.ignore);
            kept += ts[p] != cfg.ignore;
        }
        r.run();
        auto ls = copy(r.real("logits"));
        std::vector<std::int32_t> tv(ts.begin(), ts.end());
        const ld n = static_cast<ld>(ts.size());
        const ld ref = cross_entropy_ref<T>(ls, tv, cfg.ignore, n);
        if (kept == static_cast<std::int64_t>(ts.size())) {
            // PyTorch's mean: sum over positions / number of positions.
            ld mean = 0;
            for (std::size_t p = 0; p < tv.size(); ++p) mean += cross_entropy_ref<T>(
                std::span<const T>(ls).subspan(p * static_cast<std::size_t>(cfg.v), static_cast<std::size_t>(cfg.v)),
                std::span<const std::int32_t>(tv).subspan(p, 1), cfg.ignore, 1);
            CHECK(std::abs(mean / n - ref) <= 1e-15L * (1 + std::abs(ref)));
        }
        require_close<T>(r.real(loss.id), {ref}, "loss");
        CHECK(std::isfinite(static_cast<double>(r.real(loss.id)[0])));
        require_close<T>(r.grad("logits"), cross_entropy_grad_ref<T>(ls, tv, cfg.ignore, 1.75L, n), "dlogits");
    }
}

TEMPLATE_TEST_CASE("cross_entropy's vector builds give the baseline rows' values bit for bit", "[loss]", float,
                   double) {
    // Rows of every length up to three blocks of lanes and one wide ragged row, logits spread
    // wide enough to reach the exp cut-off, with -inf among them.
    using T = TestType;
    for (std::int64_t v : {std::int64_t{1}, std::int64_t{7}, std::int64_t{8}, std::int64_t{9}, std::int64_t{17},
                           std::int64_t{24}, std::int64_t{50257}}) {
        std::vector<T> x(static_cast<std::size_t>(v)), base(x.size()), wide(x.size());
        for (std::int64_t i = 0; i < v; ++i)
            x[static_cast<std::size_t>(i)] = static_cast<T>(40.0 * std::sin(0.37 * static_cast<double>(i * i + 1)));
        if (v > 3) x[3] = -std::numeric_limits<T>::infinity();
        const auto target = static_cast<std::int32_t>(v / 2);
        host::detail::cross_entropy_grad_row(x.data(), base.data(), v, target, T(0.25));
        const T a = host::detail::log_sum_exp(x.data(), v);
        for (host::cpu_isa isa : host::supported_cpu_isas()) {
            INFO("v = " << v << ", instruction set " << host::to_string(isa));
            host::detail::cross_entropy_grad_row_on(isa, x.data(), wide.data(), v, target, T(0.25));
            CHECK(std::memcmp(base.data(), wide.data(), base.size() * sizeof(T)) == 0);
            const T b = host::detail::log_sum_exp_on(isa, x.data(), v);
            CHECK(std::memcmp(&a, &b, sizeof(T)) == 0);
        }
    }
}

TEMPLATE_TEST_CASE("layer_norm's vector builds give the baseline rows' values bit for bit", "[norm]", float, double) {
    // Row lengths around the 8 lanes of the sums and one wide ragged row, with an offset mean
    // (the two-pass variance) and values of mixed scale; dgamma and dbeta accumulate over
    // two rows, as a block of rows does.
    using T = TestType;
    for (std::int64_t h : {std::int64_t{1}, std::int64_t{7}, std::int64_t{8}, std::int64_t{9}, std::int64_t{24},
                           std::int64_t{768}, std::int64_t{1001}}) {
        const auto n = static_cast<std::size_t>(h);
        std::vector<T> x(2 * n), dy(2 * n), gamma(n), beta(n);
        for (std::size_t i = 0; i < 2 * n; ++i) {
            x[i] = static_cast<T>(3.0 + std::sin(0.37 * static_cast<double>(i * i + 1)) * std::pow(10.0, double(i % 3)));
            dy[i] = static_cast<T>(std::cos(0.23 * static_cast<double>(i)));
        }
        for (std::size_t i = 0; i < n; ++i) {
            gamma[i] = static_cast<T>(1.0 + 0.01 * static_cast<double>(i % 17));
            beta[i] = static_cast<T>(0.001 * static_cast<double>(i % 5));
        }
        const T eps = static_cast<T>(1e-5);
        std::vector<T> y(2 * n), dx(2 * n), dgamma(n, T(0)), dbeta(n, T(0));
        for (std::size_t r = 0; r < 2; ++r) {
            host::detail::layer_norm_row(x.data() + r * n, gamma.data(), beta.data(), y.data() + r * n, h, eps);
            host::detail::layer_norm_grad_row(dy.data() + r * n, x.data() + r * n, gamma.data(), dx.data() + r * n,
                                              dgamma.data(), dbeta.data(), h, eps);
        }
        for (host::cpu_isa isa : host::supported_cpu_isas()) {
            INFO("h = " << h << ", instruction set " << host::to_string(isa));
            std::vector<T> y2(2 * n), dx2(2 * n), dgamma2(n, T(0)), dbeta2(n, T(0));
            for (std::size_t r = 0; r < 2; ++r) {
                host::detail::layer_norm_row_on(isa, x.data() + r * n, gamma.data(), beta.data(), y2.data() + r * n, h,
                                                eps);
                host::detail::layer_norm_grad_row_on(isa, dy.data() + r * n, x.data() + r * n, gamma.data(),
                                                     dx2.data() + r * n, dgamma2.data(), dbeta2.data(), h, eps);
            }
            CHECK(std::memcmp(y.data(), y2.data(), y.size() * sizeof(T)) == 0);
            CHECK(std::memcmp(dx.data(), dx2.data(), dx.size() * sizeof(T)) == 0);
            CHECK(std::memcmp(dgamma.data(), dgamma2.data(), dgamma.size() * sizeof(T)) == 0);
            CHECK(std::memcmp(dbeta.data(), dbeta2.data(), dbeta.size() * sizeof(T)) == 0);
        }
    }
}

TEMPLATE_TEST_CASE("cross_entropy with ignored targets divides by the normalizer", "[loss]", float, double) {
    using T = TestType;
    graph_builder b;
    auto logits = b.input("logits", make_shape({4, 6, 9}, Dim::Vocab::id));
    auto targets = b.input("targets", leading_shape({4, 6}), value_kind::index);
    auto by_positions = ops::cross_entropy(logits, targets);
    auto by_kept = ops::cross_entropy(logits, targets, -100, 16.0);  // PyTorch's mean over the kept 16
    runner<T> r(std::move(b), {by_positions.id, by_kept.id});
    fill(r.real("logits"), 61, 2.0);
    auto ts = r.index("targets");
    for (std::size_t p = 0; p < ts.size(); ++p) ts[p] = p % 3 == 0 ? -100 : static_cast<std::int32_t>(p % 7);
    r.run();
    auto ls = copy(r.real("logits"));
    std::vector<std::int32_t> tv(ts.begin(), ts.end());
    require_close<T>(r.real(by_positions.id), {cross_entropy_ref<T>(ls, tv, -100, 24)}, "loss / positions");
    require_close<T>(r.real(by_kept.id), {cross_entropy_ref<T>(ls, tv, -100, 16)}, "loss / kept");
}

TEMPLATE_TEST_CASE("cross_entropy: ignore_index inside [0, v) is ignored; all ignored gives 0", "[loss]", float,
                   double) {
    using T = TestType;
    graph_builder b;
    auto logits = b.parameter("logits", make_shape({3, 4}, Dim::Vocab::id), parameter_init::zeros());
    auto targets = b.input("targets", leading_shape({3}), value_kind::index);
    auto loss = ops::cross_entropy(logits, targets, 2);
    b.set_loss(loss);
    build_backward(b);
    runner<T> r(std::move(b), {}, true);
    fill(r.real("logits"), 62, 2.0);
    auto ts = r.index("targets");
    ts[0] = 2, ts[1] = 0, ts[2] = 3;
    r.run();
    auto ls = copy(r.real("logits"));
    std::vector<std::int32_t> tv(ts.begin(), ts.end());
    require_close<T>(r.real(loss.id), {cross_entropy_ref<T>(ls, tv, 2, 3)}, "loss");
    for (std::size_t i = 0; i < 4; ++i) CHECK(r.grad("logits")[i] == 0);  // row 0 is ignored
    for (auto& t : ts) t = 2;
    r.run();
    CHECK(r.real(loss.id)[0] == 0);
    for (T g : r.grad("logits")) CHECK(g == 0);
    ts[1] = -100;  // not ignore_index here: out of range
    CHECK_THROWS_WITH(r.run(), Catch::Contains("target -100") && Catch::Contains("ignore_index 2"));
}

TEST_CASE("cross_entropy errors: bad targets at run time, kinds and shapes at build time", "[loss][errors]") {
    {
        graph_builder b;
        auto logits = b.parameter("logits", make_shape({2, 3, 5}, Dim::Vocab::id), parameter_init::zeros());
        auto targets = b.input("targets", leading_shape({2, 3}), value_kind::index);
        b.set_loss(ops::cross_entropy(logits, targets));
        build_backward(b);
        runner<float> r(std::move(b), {}, true);
        auto ts = r.index("targets");
        ts[4] = 5;
        CHECK_THROWS_AS(r.run(), usage_error);
        CHECK_THROWS_WITH(r.run(), Catch::Contains("cross_entropy 'cross_entropy'") && Catch::Contains("target 5 ") &&
                                       Catch::Contains("position 4 (Batch 1, Seq 1)") &&
                                       Catch::Contains("'targets'") && Catch::Contains("[0, 5)"));
        ts[4] = -3;
        CHECK_THROWS_WITH(r.run(), Catch::Contains("target -3 ") && Catch::Contains("ignore_index -100"));
        ts[4] = -100;
        CHECK_NOTHROW(r.run());
    }
    {
        graph_builder b;
        auto logits = b.input("logits", make_shape({2, 3, 5}, Dim::Vocab::id));
        auto targets = b.input("targets", leading_shape({2, 3}), value_kind::index);
        auto real_targets = b.input("real_targets", leading_shape({2, 3}));
        auto short_targets = b.input("short_targets", leading_shape({2, 2}), value_kind::index);
        auto flat_targets = b.input("flat_targets", leading_shape({6}), value_kind::index);
        CHECK_THROWS_AS(ops::cross_entropy(logits, real_targets), shape_error);
        CHECK_THROWS_WITH(ops::cross_entropy(logits, real_targets),
                          Catch::Contains("cross_entropy") && Catch::Contains("'real_targets'") &&
                              Catch::Contains("index"));
        CHECK_THROWS_WITH(ops::cross_entropy(targets, targets), Catch::Contains("'targets'") && Catch::Contains("real"));
        CHECK_THROWS_WITH(ops::cross_entropy(logits, short_targets),
                          Catch::Contains("'short_targets'") && Catch::Contains("Batch=2, Seq=2"));
        CHECK_THROWS_WITH(ops::cross_entropy(logits, flat_targets),
                          Catch::Contains("'flat_targets'") && Catch::Contains("leading axes"));
        CHECK_THROWS_AS(ops::cross_entropy(logits, targets, -100, 0.0), usage_error);
        CHECK_THROWS_WITH(ops::cross_entropy(logits, targets, -100, -2.0), Catch::Contains("normalizer"));
    }
}

TEST_CASE("cross_entropy's loss does not depend on the thread count", "[loss][determinism]") {
    graph_builder b;
    auto logits = b.parameter("logits", make_shape({16, 100, 31}, Dim::Vocab::id), parameter_init::zeros());
    auto targets = b.input("targets", leading_shape({16, 100}), value_kind::index);
    auto loss = ops::cross_entropy(logits, targets);
    b.set_loss(loss);
    build_backward(b);
    runner<float> r(std::move(b), {}, true);
    fill(r.real("logits"), 71, 4.0);
    value_stream v{72};
    for (auto& t : r.index("targets")) t = v.index(31);
    r.run();
    const float first = r.real(loss.id)[0];
    auto grad = copy(r.grad("logits"));
    r.run_single_threaded();
    CHECK(std::memcmp(&first, r.real(loss.id).data(), sizeof(float)) == 0);
    CHECK(std::memcmp(grad.data(), r.grad("logits").data(), grad.size() * sizeof(float)) == 0);
}

TEMPLATE_TEST_CASE("cross_entropy: -inf logits contribute nothing, NaN logits make the loss NaN", "[loss]", float,
                   double) {
    using T = TestType;
    graph_builder b;
    auto logits = b.parameter("logits", make_shape({2, 5}, Dim::Vocab::id), parameter_init::zeros());
    auto targets = b.input("targets", leading_shape({2}), value_kind::index);
    auto loss = ops::cross_entropy(logits, targets);
    b.set_loss(loss);
    build_backward(b);
    runner<T> r(std::move(b), {}, true);
    auto ls = r.real("logits");
    fill(ls, 81, 2.0);
    ls[1] = -INFINITY;
    ls[7] = -INFINITY;
    auto ts = r.index("targets");
    ts[0] = 2, ts[1] = 4;
    r.run();
    auto lv = copy(ls);
    std::vector<std::int32_t> tv(ts.begin(), ts.end());
    require_close<T>(r.real(loss.id), {cross_entropy_ref<T>(lv, tv, -100, 2)}, "loss");
    require_close<T>(r.grad("logits"), cross_entropy_grad_ref<T>(lv, tv, -100, 1, 2), "dlogits");
    CHECK(r.grad("logits")[1] == 0);
    ls[3] = NAN;
    r.run();
    CHECK(std::isnan(r.real(loss.id)[0]));
}

// ---- vocabulary-parallel cross-entropy ------------------------------------------------------

TEMPLATE_TEST_CASE("vocab_parallel_cross_entropy equals cross_entropy, forward and backward, for any chunk count",
                   "[loss][vocab_parallel]", float, double) {
    using T = TestType;
    struct config {
        std::vector<std::int64_t> lead;
        std::int64_t v, chunks;
        double scale;
        std::int64_t ignore;
    };
    const std::vector<config> configs{{{3, 7}, 12, 1, 3.0, -100}, {{3, 7}, 12, 4, 3.0, -100}, {{2, 5}, 12, 12, 2.0, 3},
                                      {{5}, 6, 3, 300.0, -100},   {{70}, 10, 2, 3.0, -100}};
    for (const auto& cfg : configs) {
        INFO("v " << cfg.v << " chunks " << cfg.chunks << " scale " << cfg.scale << " ignore " << cfg.ignore);
        graph_builder b;
        std::vector<std::int64_t> ext = cfg.lead;
        ext.push_back(cfg.v);
        auto logits = b.parameter("logits", make_shape(ext, Dim::Vocab::id), parameter_init::zeros());
        auto targets = b.input("targets", leading_shape(cfg.lead), value_kind::index);
        auto loss = ops::vocab_parallel_cross_entropy(logits, targets, cfg.chunks, cfg.ignore);
        CHECK(loss.rank() == 0);
        b.set_loss(ops::scale(loss, 1.75));
        build_backward(b);
        runner<T> r(std::move(b), {loss.id}, true);
        fill(r.real("logits"), 71, cfg.scale);
        value_stream v{72};
        auto ts = r.index("targets");
        for (std::size_t p = 0; p < ts.size(); ++p)
            ts[p] = p % 5 == 1 ? static_cast<std::int32_t>(cfg.ignore) : v.index(static_cast<std::int32_t>(cfg.v));
        r.run();
        auto ls = copy(r.real("logits"));
        std::vector<std::int32_t> tv(ts.begin(), ts.end());
        const ld n = static_cast<ld>(ts.size());
        require_close<T>(r.real(loss.id), {cross_entropy_ref<T>(ls, tv, cfg.ignore, n)}, "loss");
        require_close<T>(r.grad("logits"), cross_entropy_grad_ref<T>(ls, tv, cfg.ignore, 1.75L, n), "dlogits");
    }
}

TEMPLATE_TEST_CASE("pick_target pieces with row_offset sum to the whole pick; chunk_logsumexp per chunk",
                   "[loss][vocab_parallel]", float, double) {
    using T = TestType;
    const std::int64_t rows = 6, v = 8, half = v / 2;
    graph_builder b;
    auto logits = b.input("logits", make_shape({rows, v}, Dim::Vocab::id));
    auto low = b.input("low", make_shape({rows, half}, Dim::Vocab::id));
    auto high = b.input("high", make_shape({rows, half}, Dim::Vocab::id));
    auto targets = b.input("targets", leading_shape({rows}), value_kind::index);
    auto whole = ops::pick_target(logits, targets);
    auto a = b.apply1<ops::PickTarget>({low, targets}, {{"vocab", v}, {"row_offset", std::int64_t{0}}, {"ignore_index", std::int64_t{-100}}});
    auto c = b.apply1<ops::PickTarget>({high, targets}, {{"vocab", v}, {"row_offset", half}, {"ignore_index", std::int64_t{-100}}});
    auto lse = ops::chunk_logsumexp(logits, 2);
    CHECK(lse.dims().to_string() == shape({{Dim::Batch::id, rows}, {Dim::Vocab::id, 2}}).to_string());
    runner<T> r(std::move(b), {whole.id, a.id, c.id, lse.id});
    fill(r.real("logits"), 81, 2.0);
    auto ls = copy(r.real("logits"));
    for (std::int64_t p = 0; p < rows; ++p)
        for (std::int64_t i = 0; i < half; ++i) {
            r.real("low")[static_cast<std::size_t>(p * half + i)] = ls[static_cast<std::size_t>(p * v + i)];
            r.real("high")[static_cast<std::size_t>(p * half + i)] = ls[static_cast<std::size_t>(p * v + half + i)];
        }
    auto ts = r.index("targets");
    for (std::size_t p = 0; p < ts.size(); ++p) ts[p] = p == 2 ? -100 : static_cast<std::int32_t>(p * 3 % v);
    r.run();
    for (std::int64_t p = 0; p < rows; ++p) {
        const auto pi = static_cast<std::size_t>(p);
        const T expected = ts[pi] == -100 ? T(0) : ls[static_cast<std::size_t>(p * v + ts[pi])];
        CHECK(r.real(whole.id)[pi] == expected);
        CHECK(r.real(a.id)[pi] + r.real(c.id)[pi] == expected);
        CHECK((r.real(a.id)[pi] == T(0) || r.real(c.id)[pi] == T(0)));
        for (std::int64_t k = 0; k < 2; ++k) {
            ld m = -1e300L, s = 0;
            for (std::int64_t i = 0; i < half; ++i) m = std::max<ld>(m, ls[static_cast<std::size_t>(p * v + k * half + i)]);
            for (std::int64_t i = 0; i < half; ++i) s += std::exp(ls[static_cast<std::size_t>(p * v + k * half + i)] - m);
            require_close<T>(r.real(lse.id).subspan(static_cast<std::size_t>(p * 2 + k), 1), {m + std::log(s)}, "lse");
        }
    }
    ts[4] = static_cast<std::int32_t>(v);
    CHECK_THROWS_WITH(r.run(), Catch::Contains("pick_target") && Catch::Contains("target 8 ") && Catch::Contains("[0, 8)"));
}

TEMPLATE_TEST_CASE("ragged_chunk_logsumexp: chunks of unequal sizes; pieces holding whole chunks sum to the whole",
                   "[loss][vocab_parallel]", float, double) {
    using T = TestType;
    // A vocabulary of 7 in chunks [0, 4) and [4, 7), as a plan splits 7 over 2 devices.
    const std::int64_t rows = 6, v = 7, cut = 4;
    const std::vector<std::int64_t> bounds{0, cut, v};
    graph_builder b;
    auto logits = b.parameter("logits", make_shape({rows, v}, Dim::Vocab::id), parameter_init::zeros());
    auto low = b.input("low", make_shape({rows, cut}, Dim::Vocab::id));
    auto high = b.input("high", make_shape({rows, v - cut}, Dim::Vocab::id));
    auto whole = ops::ragged_chunk_logsumexp(logits, bounds);
    auto a = ops::ragged_chunk_logsumexp(low, bounds, 0);
    auto c = ops::ragged_chunk_logsumexp(high, bounds, cut);
    CHECK(whole.dims().to_string() == shape({{Dim::Batch::id, rows}, {Dim::Vocab::id, 2}}).to_string());
    b.set_loss(ops::sum(ops::mul(whole, whole)));
    build_backward(b);
    runner<T> r(std::move(b), {whole.id, a.id, c.id}, true);
    fill(r.real("logits"), 91, 3.0);
    auto ls = copy(r.real("logits"));
    for (std::int64_t p = 0; p < rows; ++p)
        for (std::int64_t i = 0; i < v; ++i)
            (i < cut ? r.real("low")[static_cast<std::size_t>(p * cut + i)]
                     : r.real("high")[static_cast<std::size_t>(p * (v - cut) + i - cut)]) = ls[static_cast<std::size_t>(p * v + i)];
    r.run();
    std::vector<ld> lse(static_cast<std::size_t>(rows * 2));
    for (std::int64_t p = 0; p < rows; ++p)
        for (std::int64_t k = 0; k < 2; ++k) {
            ld m = -1e300L, s = 0;
            for (std::int64_t i = bounds[k]; i < bounds[k + 1]; ++i) m = std::max<ld>(m, ls[static_cast<std::size_t>(p * v + i)]);
            for (std::int64_t i = bounds[k]; i < bounds[k + 1]; ++i) s += std::exp(ls[static_cast<std::size_t>(p * v + i)] - m);
            lse[static_cast<std::size_t>(p * 2 + k)] = m + std::log(s);
            const auto at = static_cast<std::size_t>(p * 2 + k);
            // Each piece writes the chunk it holds and 0 for the other: their sum is the whole.
            CHECK(r.real(a.id)[at] + r.real(c.id)[at] == r.real(whole.id)[at]);
            CHECK(r.real(k == 0 ? c.id : a.id)[at] == T(0));
        }
    require_close<T>(r.real(whole.id), lse, "lse");
    // d sum(lse^2) / dlogits = 2 lse[k] softmax(chunk k).
    std::vector<ld> grad(ls.size());
    for (std::int64_t p = 0; p < rows; ++p)
        for (std::int64_t i = 0; i < v; ++i) {
            const ld l = lse[static_cast<std::size_t>(p * 2 + (i < cut ? 0 : 1))];
            grad[static_cast<std::size_t>(p * v + i)] = 2 * l * std::exp(ls[static_cast<std::size_t>(p * v + i)] - l);
        }
    require_close<T>(r.grad("logits"), grad, "dlogits");
}

TEST_CASE("ragged_chunk_logsumexp errors: boundaries that do not increase, logits that hold part of a chunk",
          "[loss][errors][vocab_parallel]") {
    graph_builder b;
    auto logits = b.input("logits", make_shape({2, 3}, Dim::Vocab::id));
    CHECK_THROWS_WITH(ops::ragged_chunk_logsumexp(logits, {0, 2, 2, 3}), Catch::Contains("increase strictly"));
    CHECK_THROWS_WITH(ops::ragged_chunk_logsumexp(logits, {1, 3}), Catch::Contains("start at 0"));
    CHECK_THROWS_WITH(ops::ragged_chunk_logsumexp(logits, {0, 4, 7}, 2),
                      Catch::Contains("the logits hold columns [2, 5) of a vocabulary of 7") &&
                          Catch::Contains("not a run of whole chunks"));
    CHECK_NOTHROW(ops::ragged_chunk_logsumexp(logits, {0, 4, 7}, 4));
}

TEST_CASE("vocab_parallel_cross_entropy errors: chunks that do not divide, bad normalizer", "[loss][errors][vocab_parallel]") {
    graph_builder b;
    auto logits = b.input("logits", make_shape({2, 3, 10}, Dim::Vocab::id));
    auto targets = b.input("targets", leading_shape({2, 3}), value_kind::index);
    CHECK_THROWS_WITH(ops::vocab_parallel_cross_entropy(logits, targets, 3),
                      Catch::Contains("chunk_logsumexp") && Catch::Contains("10") && Catch::Contains("3 chunks"));
    CHECK_THROWS_WITH(ops::vocab_parallel_cross_entropy(logits, targets, 0), Catch::Contains("chunks = 0"));
    CHECK_THROWS_WITH(ops::vocab_parallel_cross_entropy(logits, targets, 2, -100, -1.0), Catch::Contains("normalizer"));
}
