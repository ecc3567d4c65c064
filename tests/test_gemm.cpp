// Host GEMM (gemm, gemm_fallback with every micro-kernel this CPU runs, gemm_batched) against
// a triple loop in long double, and the thread pool they run on.
//
// Tolerance: for a length-k dot product computed in any order with any blocking, the
// classic forward error bound is |out - ref| <= gamma * (|alpha| sum_p |a_ip b_pj| + |beta c_ij|)
// with gamma = (k + 2) eps (k products and additions, the alpha and beta roundings). The
// check is |out - ref| <= atol + rtol * |ref| with atol = 2 gamma * that absolute sum
// (a factor 2 of slack) and rtol = 4 eps. A wrong index, a dropped or doubled term, or a
// stale C element is off by about |a b| ~ 0.1 and fails it for every size tested here.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/runtime/host/fma_peak.hpp"
#include "loom/runtime/host/gemm.hpp"
#include "loom/runtime/host/thread_pool.hpp"

namespace {

using loom::host::cpu_isa;
using loom::host::transpose;

// A matrix stored row-major with `ld` >= cols; the padding after each row holds a sentinel so
// writes outside the logical matrix are caught.
template <class T>
struct stored_matrix {
    std::int64_t rows = 0, cols = 0, ld = 1;
    std::vector<T> data;

    static constexpr T sentinel = T(-12345.5);

    stored_matrix(std::int64_t r, std::int64_t c, std::int64_t pad, std::mt19937_64& generator)
        : rows(r), cols(c), ld(std::max<std::int64_t>(1, c + pad)) {
        data.assign(static_cast<std::size_t>(std::max<std::int64_t>(1, rows * ld)), sentinel);
        std::uniform_real_distribution<double> uniform(-1.0, 1.0);
        for (std::int64_t i = 0; i < rows; ++i) {
            for (std::int64_t j = 0; j < cols; ++j) at(i, j) = static_cast<T>(uniform(generator));
        }
    }
    T& at(std::int64_t i, std::int64_t j) { return data[static_cast<std::size_t>(i * ld + j)]; }
    T at(std::int64_t i, std::int64_t j) const { return data[static_cast<std::size_t>(i * ld + j)]; }
    T* ptr() { return data.data(); }
    const T* ptr() const { return data.data(); }

    bool padding_untouched() const {
        for (std::int64_t i = 0; i < rows; ++i) {
            for (std::int64_t j = cols; j < ld; ++j) {
                if (!(at(i, j) == sentinel)) return false;
            }
        }
        return true;
    }
};

// op(X)[i][j] for X stored as given.
template <class T>
long double op_at(const stored_matrix<T>& x, transpose t, std::int64_t i, std::int64_t j) {
    return t == transpose::no ? x.at(i, j) : x.at(j, i);
}

template <class T>
struct case_setup {
    transpose ta, tb;
    std::int64_t m, n, k;
    std::int64_t pad;  // extra leading-dimension elements for A, B and C
    T alpha, beta;
    bool nan_c;  // fill C with NaN (only meaningful with beta == 0)
};

template <class T>
std::string describe(const case_setup<T>& s) {
    std::ostringstream text;
    text << (s.ta == transpose::no ? "N" : "T") << (s.tb == transpose::no ? "N" : "T") << " m=" << s.m << " n=" << s.n
         << " k=" << s.k << " pad=" << s.pad << " alpha=" << s.alpha << " beta=" << s.beta << (s.nan_c ? " C=NaN" : "");
    return text.str();
}

// The inputs of one case and the reference result with its per-element tolerance.
template <class T>
struct prepared_case {
    stored_matrix<T> a, b, c;
    std::vector<long double> ref, tolerance;
};

template <class T>
prepared_case<T> prepare(const case_setup<T>& s, std::uint64_t seed) {
    std::mt19937_64 generator(seed);
    const auto [a_rows, a_cols] = s.ta == transpose::no ? std::pair{s.m, s.k} : std::pair{s.k, s.m};
    const auto [b_rows, b_cols] = s.tb == transpose::no ? std::pair{s.k, s.n} : std::pair{s.n, s.k};
    prepared_case<T> result{stored_matrix<T>(a_rows, a_cols, s.pad, generator),
                            stored_matrix<T>(b_rows, b_cols, s.pad + 1, generator),
                            stored_matrix<T>(s.m, s.n, s.pad + 2, generator),
                            {},
                            {}};
    if (s.nan_c) {
        for (std::int64_t i = 0; i < s.m; ++i) {
            for (std::int64_t j = 0; j < s.n; ++j) result.c.at(i, j) = std::numeric_limits<T>::quiet_NaN();
        }
    }
    const long double eps = std::numeric_limits<T>::epsilon();
    const long double gamma = (s.k + 2) * eps;
    for (std::int64_t i = 0; i < s.m; ++i) {
        for (std::int64_t j = 0; j < s.n; ++j) {
            long double sum = 0;
            long double absolute = 0;
            for (std::int64_t p = 0; p < s.k; ++p) {
                const long double term = op_at(result.a, s.ta, i, p) * op_at(result.b, s.tb, p, j);
                sum += term;
                absolute += std::fabs(term);
            }
            const long double c_term = s.beta == T(0) ? 0.0L : s.beta * static_cast<long double>(result.c.at(i, j));
            const long double ref = s.alpha * sum + c_term;
            const long double atol =
                2 * gamma * (std::fabs(static_cast<long double>(s.alpha)) * absolute + std::fabs(c_term));
            const long double rtol = 4 * eps;
            result.ref.push_back(ref);
            result.tolerance.push_back(atol + rtol * std::fabs(ref));
        }
    }
    return result;
}

// Runs `multiply` on a prepared case and returns "" when every element is within tolerance
// and the padding of C is untouched, else a description of the first bad element.
template <class T, class Multiply>
std::string check_case(const case_setup<T>& s, const prepared_case<T>& prepared, Multiply&& multiply) {
    stored_matrix<T> c = prepared.c;
    multiply(s.ta, s.tb, s.m, s.n, s.k, s.alpha, prepared.a.ptr(), prepared.a.ld, prepared.b.ptr(), prepared.b.ld,
             s.beta, c.ptr(), c.ld);
    if (!c.padding_untouched()) return describe(s) + ": wrote into the padding of C (ldc > n)";
    for (std::int64_t i = 0; i < s.m; ++i) {
        for (std::int64_t j = 0; j < s.n; ++j) {
            const std::size_t at = static_cast<std::size_t>(i * s.n + j);
            const long double out = c.at(i, j);
            if (!(std::fabs(out - prepared.ref[at]) <= prepared.tolerance[at])) {
                std::ostringstream text;
                text << describe(s) << ": C[" << i << "][" << j << "] = " << static_cast<double>(out) << ", expected "
                     << static_cast<double>(prepared.ref[at]) << " (tolerance "
                     << static_cast<double>(prepared.tolerance[at]) << ")";
                return text.str();
            }
        }
    }
    return "";
}

// Every implementation under test, by name.
template <class T>
struct implementation {
    std::string name;
    void (*run)(cpu_isa, transpose, transpose, std::int64_t, std::int64_t, std::int64_t, T, const T*, std::int64_t,
                const T*, std::int64_t, T, T*, std::int64_t);
    cpu_isa isa;
};

template <class T>
std::vector<implementation<T>> implementations() {
    std::vector<implementation<T>> all;
    all.push_back({"gemm",
                   [](cpu_isa, transpose ta, transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
                      const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                      std::int64_t ldc) { loom::host::gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); },
                   cpu_isa::portable});
    all.push_back({"gemm_fallback(best)",
                   [](cpu_isa, transpose ta, transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
                      const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
                       loom::host::gemm_fallback<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
                   },
                   cpu_isa::portable});
    for (cpu_isa isa : loom::host::supported_cpu_isas()) {
        all.push_back(
            {std::string("gemm_fallback(") + loom::host::to_string(isa) + ")",
             [](cpu_isa chosen, transpose ta, transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
                const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
                 loom::host::gemm_fallback<T>(chosen, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
             },
             isa});
    }
    // A pool of three threads (whatever this machine has) drives the planner's multi-tile
    // path with shared packed B, with row and column splits.
    for (cpu_isa isa : loom::host::supported_cpu_isas()) {
        all.push_back(
            {std::string("gemm_fallback(") + loom::host::to_string(isa) + ", 3-thread pool)",
             [](cpu_isa chosen, transpose ta, transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
                const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
                 static loom::host::thread_pool three(3);
                 loom::host::detail::gemm::fallback_unchecked<T>(chosen, three, ta, tb, m, n, k, alpha, a, lda, b, ldb,
                                                                 beta, c, ldc);
             },
             isa});
    }
    return all;
}

template <class T>
void check_all(const std::vector<case_setup<T>>& cases) {
    const std::vector<implementation<T>> all = implementations<T>();
    std::uint64_t seed = 1;
    for (const case_setup<T>& s : cases) {
        const prepared_case<T> prepared = prepare(s, ++seed);
        for (const implementation<T>& impl : all) {
            const std::string failure =
                check_case<T>(s, prepared, [&](auto&&... args) { impl.run(impl.isa, args...); });
            if (!failure.empty()) FAIL(impl.name << ": " << failure);
        }
    }
    SUCCEED();
}

constexpr transpose both[] = {transpose::no, transpose::yes};

}  // namespace

TEMPLATE_TEST_CASE("gemm matches the reference on odd sizes, every transpose", "[gemm]", float, double) {
    using T = TestType;
    std::vector<case_setup<T>> cases;
    const std::int64_t sizes[] = {1, 3, 17, 65};
    for (transpose ta : both) {
        for (transpose tb : both) {
            for (std::int64_t m : sizes) {
                for (std::int64_t n : sizes) {
                    for (std::int64_t k : sizes) {
                        cases.push_back({ta, tb, m, n, k, (m + n + k) % 3, T(1), T(0), false});
                    }
                }
            }
        }
    }
    check_all(cases);
}

TEMPLATE_TEST_CASE("gemm matches the reference across cache blocks and threads", "[gemm]", float, double) {
    using T = TestType;
    std::vector<case_setup<T>> cases;
    for (transpose ta : both) {
        for (transpose tb : both) {
            // Register-tile and edge coverage, several depth blocks (k > kc), several column
            // blocks (n > nc), and shapes the planner splits into many tiles.
            cases.push_back({ta, tb, 63, 129, 63, 0, T(1), T(0), false});
            cases.push_back({ta, tb, 129, 63, 300, 4, T(0.5), T(0), false});
            cases.push_back({ta, tb, 25, 33, 513, 1, T(-1), T(1), false});
            cases.push_back({ta, tb, 13, 1100, 20, 2, T(1), T(0), false});
            cases.push_back({ta, tb, 200, 170, 260, 3, T(1.5), T(-0.5), false});
            cases.push_back({ta, tb, 12, 600, 300, 1, T(1), T(0), true});
            cases.push_back({ta, tb, 40, 1100, 96, 0, T(1), T(0.5), false});
            // Several blocks of packed A rows (m > mc) in one depth slice and across two
            // (k > kc), with edge rows and columns.
            cases.push_back({ta, tb, 601, 70, 400, 1, T(1), T(0.5), false});
            // C cut into several columns of tiles on two and three threads, so A is packed once
            // up front and shared: several blocks of A rows, an edge row, and two depth slices.
            cases.push_back({ta, tb, 301, 300, 400, 2, T(1), T(0.5), false});
        }
    }
    check_all(cases);
}

TEST_CASE("gemm cuts products whose packed B would not fit the kept storage into parts", "[gemm]") {
    // Packed B beyond shared_b_keep_bytes (32 MiB, 8 Mi floats) on several threads: a wide
    // product runs as blocks of columns of C, a deep one as blocks of depth accumulated onto
    // C in order (beta applies once, to the first), like an LM head's forward and input
    // gradient. Small integers keep every partial sum exact in float, so C must equal the
    // integer reference exactly (a rounding bound over 140000 terms would hide a lost part).
    static loom::host::thread_pool three(3);
    const cpu_isa isa = loom::host::best_cpu_isa();
    struct shape {
        std::int64_t m, n, k;
    };
    for (const shape& sh : {shape{3, 3000, 2900}, shape{3, 40, 140000}}) {
        for (transpose ta : both) {
            for (transpose tb : both) {
                const auto [m, n, k] = sh;
                std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n)),
                    c(static_cast<std::size_t>(m * n));
                const auto a_at = [&](std::int64_t i, std::int64_t p) -> float& {
                    return ta == transpose::no ? a[i * k + p] : a[p * m + i];
                };
                const auto b_at = [&](std::int64_t p, std::int64_t j) -> float& {
                    return tb == transpose::no ? b[p * n + j] : b[j * k + p];
                };
                for (std::int64_t i = 0; i < m; ++i)
                    for (std::int64_t p = 0; p < k; ++p) a_at(i, p) = static_cast<float>((i * 7 + p * 3) % 5 - 2);
                for (std::int64_t p = 0; p < k; ++p)
                    for (std::int64_t j = 0; j < n; ++j) b_at(p, j) = static_cast<float>((p * 5 + j * 11) % 7 - 3);
                for (std::int64_t i = 0; i < m * n; ++i) c[i] = static_cast<float>(i % 9 - 4);
                const std::vector<float> c0 = c;
                loom::host::detail::gemm::fallback_unchecked<float>(isa, three, ta, tb, m, n, k, 1.5f, a.data(),
                                                                    ta == transpose::no ? k : m, b.data(),
                                                                    tb == transpose::no ? n : k, 0.5f, c.data(), n);
                std::int64_t wrong = 0;
                for (std::int64_t i = 0; i < m; ++i) {
                    for (std::int64_t j = 0; j < n; ++j) {
                        std::int64_t sum = 0;
                        for (std::int64_t p = 0; p < k; ++p)
                            sum += static_cast<std::int64_t>(a_at(i, p)) * static_cast<std::int64_t>(b_at(p, j));
                        const double expected = 1.5 * static_cast<double>(sum) + 0.5 * c0[i * n + j];
                        if (static_cast<double>(c[i * n + j]) != expected) ++wrong;
                    }
                }
                INFO((ta == transpose::no ? "N" : "T") << (tb == transpose::no ? "N" : "T") << " m=" << m
                                                        << " n=" << n << " k=" << k);
                CHECK(wrong == 0);
            }
        }
    }
}

TEMPLATE_TEST_CASE("gemm_bias equals C filled with the bias and beta = 1, bit for bit", "[gemm]", float, double) {
    // The kernels add the bias as they first store each tile; filling C first and
    // accumulating onto it is the same arithmetic, so the two agree exactly: on edge tiles,
    // over several depth slices, on several threads' tiles, and on a product cut into
    // blocks of columns (3 x 3000 x 2900: the bias must follow each block's columns).
    using T = TestType;
    static loom::host::thread_pool three(3);
    struct shape {
        std::int64_t m, n, k;
    };
    const shape shapes[] = {{1, 1, 1}, {13, 37, 19}, {50, 70, 1000}, {300, 200, 64}, {3, 3000, 2900}};
    for (cpu_isa isa : loom::host::supported_cpu_isas()) {
        for (loom::host::thread_pool* pool : {&loom::host::thread_pool::global(), &three}) {
            for (const shape& sh : shapes) {
                // The cut into parts needs several threads; once, with the fastest kernel.
                if (sh.n == 3000 && (pool != &three || isa != loom::host::best_cpu_isa())) continue;
                for (transpose ta : both) {
                    for (transpose tb : both) {
                        const auto [m, n, k] = sh;
                        std::mt19937_64 rng(static_cast<std::uint64_t>(m * 7 + n * 3 + k));
                        std::normal_distribution<double> normal(0.0, 1.0);
                        std::vector<T> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n)),
                            bias(static_cast<std::size_t>(n));
                        for (T& x : a) x = static_cast<T>(normal(rng));
                        for (T& x : b) x = static_cast<T>(normal(rng));
                        for (T& x : bias) x = static_cast<T>(normal(rng));
                        const std::int64_t lda = ta == transpose::no ? k : m, ldb = tb == transpose::no ? n : k;
                        std::vector<T> filled(static_cast<std::size_t>(m * n)), fused(filled.size(), T(0));
                        for (std::int64_t i = 0; i < m; ++i)
                            std::copy(bias.begin(), bias.end(), filled.begin() + i * n);
                        loom::host::detail::gemm::fallback_unchecked<T>(isa, *pool, ta, tb, m, n, k, T(0.75), a.data(),
                                                                        lda, b.data(), ldb, T(1), filled.data(), n);
                        loom::host::detail::gemm::fallback_unchecked<T>(isa, *pool, ta, tb, m, n, k, T(0.75), a.data(),
                                                                        lda, b.data(), ldb, T(0), fused.data(), n,
                                                                        bias.data());
                        INFO(loom::host::to_string(isa) << " on " << pool->size() << " threads, "
                                                        << (ta == transpose::no ? "N" : "T")
                                                        << (tb == transpose::no ? "N" : "T") << " m=" << m << " n=" << n
                                                        << " k=" << k);
                        CHECK(fused == filled);
                    }
                }
            }
        }
    }
    // Through the public entry (OpenBLAS or loom), on a size with nothing to multiply, and
    // without a bias.
    const std::vector<T> a(6, T(1)), b(6, T(2)), bias{T(1), T(-1), T(0.5)};
    std::vector<T> c(6, T(7));
    loom::host::gemm_bias<T>(transpose::no, transpose::yes, 2, 3, 2, T(1), a.data(), 2, b.data(), 2, bias.data(), c.data(), 3);
    CHECK(c == std::vector<T>{T(5), T(3), T(4.5), T(5), T(3), T(4.5)});
    loom::host::gemm_bias<T>(transpose::no, transpose::yes, 2, 3, 0, T(1), a.data(), 2, b.data(), 2, bias.data(), c.data(), 3);
    CHECK(c == std::vector<T>{T(1), T(-1), T(0.5), T(1), T(-1), T(0.5)});
    REQUIRE_THROWS_WITH(loom::host::gemm_bias<T>(transpose::no, transpose::yes, 2, 3, 2, T(1), a.data(), 2, b.data(), 2,
                                                 nullptr, c.data(), 3),
                        Catch::Contains("bias is null"));
}

TEMPLATE_TEST_CASE("gemm applies alpha and beta, and beta == 0 ignores NaN in C", "[gemm]", float, double) {
    using T = TestType;
    std::vector<case_setup<T>> cases;
    for (transpose ta : both) {
        for (transpose tb : both) {
            cases.push_back({ta, tb, 17, 33, 65, 1, T(-0.5), T(0), true});
            cases.push_back({ta, tb, 70, 90, 40, 0, T(2), T(0), true});
            cases.push_back({ta, tb, 17, 33, 65, 1, T(0.75), T(1), false});
            cases.push_back({ta, tb, 17, 33, 65, 2, T(2), T(-1.5), false});
            cases.push_back({ta, tb, 31, 47, 5, 0, T(0), T(0.5), false});
            cases.push_back({ta, tb, 31, 47, 5, 0, T(0), T(0), true});
        }
    }
    check_all(cases);
}

TEMPLATE_TEST_CASE("gemm handles empty sizes", "[gemm]", float, double) {
    using T = TestType;
    std::vector<case_setup<T>> cases;
    for (transpose ta : both) {
        for (transpose tb : both) {
            cases.push_back({ta, tb, 0, 5, 7, 0, T(1), T(0), false});
            cases.push_back({ta, tb, 5, 0, 7, 0, T(1), T(0), false});
            // k == 0: C = beta * C, and beta == 0 clears NaN.
            cases.push_back({ta, tb, 5, 7, 0, 1, T(1), T(0), true});
            cases.push_back({ta, tb, 5, 7, 0, 1, T(1), T(-2), false});
        }
    }
    check_all(cases);
}

TEMPLATE_TEST_CASE("gemm_fallback does not read A or B when alpha == 0", "[gemm]", float, double) {
    using T = TestType;
    const T nan = std::numeric_limits<T>::quiet_NaN();
    std::vector<T> a(12, nan), b(12, nan), c(9, T(2));
    for (cpu_isa isa : loom::host::supported_cpu_isas()) {
        std::fill(c.begin(), c.end(), T(2));
        loom::host::gemm_fallback<T>(isa, transpose::no, transpose::no, 3, 3, 4, T(0), a.data(), 4, b.data(), 3, T(0.5),
                                     c.data(), 3);
        for (T x : c) REQUIRE(x == T(1));
    }
}

TEMPLATE_TEST_CASE("gemm rejects bad arguments, naming them", "[gemm]", float, double) {
    using T = TestType;
    std::vector<T> a(64, T(1)), b(64, T(1)), c(64, T(0));
    const auto call = [&](std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda, std::int64_t ldb,
                          std::int64_t ldc, transpose ta = transpose::no, transpose tb = transpose::no) {
        loom::host::gemm<T>(ta, tb, m, n, k, T(1), a.data(), lda, b.data(), ldb, T(0), c.data(), ldc);
    };
    const auto fallback = [&](std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda, std::int64_t ldb,
                              std::int64_t ldc) {
        loom::host::gemm_fallback<T>(transpose::no, transpose::no, m, n, k, T(1), a.data(), lda, b.data(), ldb, T(0),
                                     c.data(), ldc);
    };
    using Catch::Matchers::Contains;
    REQUIRE_THROWS_MATCHES(call(-1, 2, 2, 2, 2, 2), loom::usage_error,
                           Catch::Matchers::Message("gemm: m = -1 is negative; pass m >= 0"));
    REQUIRE_THROWS_WITH(call(2, -3, 2, 2, 2, 2), Contains("n = -3"));
    REQUIRE_THROWS_WITH(call(2, 2, -4, 2, 2, 2), Contains("k = -4"));
    REQUIRE_THROWS_WITH(call(2, 3, 5, 4, 3, 3), Contains("lda = 4") && Contains("lda >= 5"));
    REQUIRE_THROWS_WITH(call(6, 3, 2, 5, 3, 3, transpose::yes), Contains("lda = 5") && Contains("lda >= 6"));
    REQUIRE_THROWS_WITH(call(2, 3, 5, 5, 2, 3), Contains("ldb = 2") && Contains("ldb >= 3"));
    REQUIRE_THROWS_WITH(call(2, 3, 5, 5, 4, 3, transpose::no, transpose::yes),
                        Contains("ldb = 4") && Contains("ldb >= 5"));
    REQUIRE_THROWS_WITH(call(2, 3, 5, 5, 3, 2), Contains("ldc = 2") && Contains("ldc >= 3"));
    REQUIRE_THROWS_WITH(call(0, 0, 0, 0, 1, 1), Contains("lda = 0") && Contains("lda >= 1"));
    REQUIRE_THROWS_AS(fallback(2, 3, 5, 4, 3, 3), loom::usage_error);
    REQUIRE_THROWS_WITH(fallback(2, 3, 5, 4, 3, 3), Contains("gemm_fallback: lda = 4"));
    REQUIRE_THROWS_WITH(
        loom::host::gemm<T>(transpose::no, transpose::no, 2, 2, 2, T(1), nullptr, 2, b.data(), 2, T(0), c.data(), 2),
        Contains("a is null"));
    // Null is fine where nothing is read.
    REQUIRE_NOTHROW(
        loom::host::gemm<T>(transpose::no, transpose::no, 0, 0, 0, T(1), nullptr, 1, nullptr, 1, T(0), nullptr, 1));
}

TEST_CASE("gemm_fallback refuses a micro-kernel this CPU cannot run", "[gemm]") {
    std::vector<float> a(4, 1), b(4, 1), c(4, 0);
    for (cpu_isa isa : {cpu_isa::avx2_fma, cpu_isa::avx512f}) {
        if (loom::host::cpu_isa_supported(isa)) continue;
        REQUIRE_THROWS_AS(loom::host::gemm_fallback<float>(isa, transpose::no, transpose::no, 2, 2, 2, 1.0f, a.data(),
                                                           2, b.data(), 2, 0.0f, c.data(), 2),
                          loom::usage_error);
    }
    REQUIRE(loom::host::cpu_isa_supported(loom::host::best_cpu_isa()));
    // CBLAS is used only when built in; without LOOM_GEMM, CPUs with AVX2 or AVX-512 use
    // loom's kernels.
    if (!loom::host::has_cblas) REQUIRE(!loom::host::gemm_uses_cblas());
    if (std::getenv("LOOM_GEMM") == nullptr && loom::host::best_cpu_isa() != cpu_isa::portable)
        REQUIRE(!loom::host::gemm_uses_cblas());
}

TEMPLATE_TEST_CASE("gemm_batched multiplies every matrix of the batch", "[gemm]", float, double) {
    using T = TestType;
    std::mt19937_64 generator(7);
    std::uniform_real_distribution<double> uniform(-1.0, 1.0);
    struct batch_case {
        transpose ta, tb;
        std::int64_t batch, m, n, k;
        bool shared_b;  // stride_b == 0: one B for the whole batch
    };
    // Small matrices take the one-matrix-per-thread path, large ones the per-matrix parallel one.
    const batch_case cases[] = {
        {transpose::no, transpose::yes, 6, 17, 9, 33, false},
        {transpose::yes, transpose::no, 3, 5, 65, 7, true},
        {transpose::no, transpose::no, 2, 150, 210, 230, false},
        {transpose::yes, transpose::yes, 5, 1, 1, 1, false},
    };
    for (const batch_case& bc : cases) {
        INFO("batch " << bc.batch << " m=" << bc.m << " n=" << bc.n << " k=" << bc.k);
        const std::int64_t lda = (bc.ta == transpose::no ? bc.k : bc.m) + 1;
        const std::int64_t ldb = (bc.tb == transpose::no ? bc.n : bc.k) + 2;
        const std::int64_t ldc = bc.n + 3;
        const std::int64_t stride_a = (bc.ta == transpose::no ? bc.m : bc.k) * lda + 5;
        const std::int64_t stride_b = bc.shared_b ? 0 : (bc.tb == transpose::no ? bc.k : bc.n) * ldb;
        const std::int64_t stride_c = bc.m * ldc + 1;
        std::vector<T> a(static_cast<std::size_t>(bc.batch * stride_a));
        std::vector<T> b(
            static_cast<std::size_t>(std::max<std::int64_t>(1, bc.batch) *
                                     std::max<std::int64_t>(stride_b, (bc.tb == transpose::no ? bc.k : bc.n) * ldb)));
        std::vector<T> c(static_cast<std::size_t>(bc.batch * stride_c));
        for (T& x : a) x = static_cast<T>(uniform(generator));
        for (T& x : b) x = static_cast<T>(uniform(generator));
        for (T& x : c) x = static_cast<T>(uniform(generator));
        std::vector<T> expected = c;
        const T alpha = T(0.5), beta = T(-1);
        for (std::int64_t g = 0; g < bc.batch; ++g) {
            // Per-matrix gemm_fallback with the portable kernel is the (already tested) reference.
            loom::host::gemm_fallback<T>(cpu_isa::portable, bc.ta, bc.tb, bc.m, bc.n, bc.k, alpha,
                                         a.data() + g * stride_a, lda, b.data() + g * stride_b, ldb, beta,
                                         expected.data() + g * stride_c, ldc);
        }
        loom::host::gemm_batched<T>(bc.ta, bc.tb, bc.batch, bc.m, bc.n, bc.k, alpha, a.data(), lda, stride_a, b.data(),
                                    ldb, stride_b, beta, c.data(), ldc, stride_c);
        const double tolerance = 4.0 * (bc.k + 2) * std::numeric_limits<T>::epsilon() * (bc.k + 1);
        for (std::size_t i = 0; i < c.size(); ++i) {
            if (std::fabs(double(c[i]) - double(expected[i])) > tolerance) {
                FAIL("element " << i << ": " << c[i] << " vs " << expected[i]);
            }
        }
    }
}

TEST_CASE("gemm_batched rejects bad batches", "[gemm]") {
    std::vector<float> a(64, 1), b(64, 1), c(64, 0);
    using Catch::Matchers::Contains;
    REQUIRE_THROWS_WITH(loom::host::gemm_batched<float>(transpose::no, transpose::no, -1, 2, 2, 2, 1.0f, a.data(), 2, 4,
                                                        b.data(), 2, 4, 0.0f, c.data(), 2, 4),
                        Contains("batch = -1"));
    REQUIRE_THROWS_WITH(loom::host::gemm_batched<float>(transpose::no, transpose::no, 2, 2, 2, 2, 1.0f, a.data(), 2, 4,
                                                        b.data(), 2, 4, 0.0f, c.data(), 2, 3),
                        Contains("stride_c = 3") && Contains("stride_c >= 4"));
    REQUIRE_THROWS_WITH(loom::host::gemm_batched<float>(transpose::no, transpose::no, 2, 2, 2, 2, 1.0f, a.data(), 2, -4,
                                                        b.data(), 2, 4, 0.0f, c.data(), 2, 4),
                        Contains("negative"));
    REQUIRE_NOTHROW(loom::host::gemm_batched<float>(transpose::no, transpose::no, 0, 2, 2, 2, 1.0f, a.data(), 2, 4,
                                                    b.data(), 2, 4, 0.0f, c.data(), 2, 4));
}

// ---------------------------------------------------------------------------------------
// thread_pool

namespace {

// Runs parallel_for and checks the law: disjoint ranges covering [begin, end), each at least
// `grain` long unless the whole range is shorter.
void check_cover(loom::host::thread_pool& pool, std::int64_t begin, std::int64_t end, std::int64_t grain) {
    INFO("begin " << begin << " end " << end << " grain " << grain << " threads " << pool.size());
    const std::int64_t length = std::max<std::int64_t>(0, end - begin);
    std::vector<std::atomic<int>> hits(static_cast<std::size_t>(length));
    std::atomic<int> short_ranges{0};
    std::atomic<int> calls{0};
    pool.parallel_for(begin, end, grain, [&](std::int64_t lo, std::int64_t hi) {
        calls.fetch_add(1);
        if (hi - lo < std::max<std::int64_t>(1, grain) && hi - lo < length) short_ranges.fetch_add(1);
        for (std::int64_t i = lo; i < hi; ++i) hits[static_cast<std::size_t>(i - begin)].fetch_add(1);
    });
    REQUIRE(short_ranges.load() == 0);
    for (std::int64_t i = 0; i < length; ++i) REQUIRE(hits[static_cast<std::size_t>(i)].load() == 1);
    if (length == 0) REQUIRE(calls.load() == 0);
}

}  // namespace

TEST_CASE("parallel_for covers the range with disjoint ranges of at least grain", "[thread_pool]") {
    for (unsigned threads : {1u, 2u, 3u, 8u}) {
        loom::host::thread_pool pool(threads);
        REQUIRE(pool.size() == threads);
        check_cover(pool, 0, 0, 1);
        check_cover(pool, 5, 3, 1);
        check_cover(pool, 0, 1, 1);
        check_cover(pool, 0, 1000, 1);
        check_cover(pool, -50, 77, 10);
        check_cover(pool, 0, 1000, 333);
        check_cover(pool, 0, 1000, 499);
        check_cover(pool, 0, 1000, 1000);
        check_cover(pool, 0, 1000, 5000);
        check_cover(pool, 3, 100003, 0);
    }
}

TEST_CASE("parallel_for runs a range shorter than two grains inline, in one call", "[thread_pool]") {
    loom::host::thread_pool pool(4);
    std::vector<std::pair<std::int64_t, std::int64_t>> seen;
    std::thread::id where;
    pool.parallel_for(10, 29, 10, [&](std::int64_t lo, std::int64_t hi) {
        seen.emplace_back(lo, hi);
        where = std::this_thread::get_id();
    });
    REQUIRE(seen.size() == 1);
    REQUIRE(seen[0] == std::pair<std::int64_t, std::int64_t>{10, 29});
    REQUIRE(where == std::this_thread::get_id());
}

namespace {

// True when two ranges of one parallel_for ran at the same time: each range waits (up to a
// deadline) until the other one is running, which only concurrent execution satisfies.
bool ranges_overlap(loom::host::thread_pool& pool, std::set<std::thread::id>& ids) {
    std::atomic<int> running{0};
    std::atomic<bool> overlapped{false};
    std::mutex ids_mutex;
    pool.parallel_for(0, 2, 1, [&](std::int64_t, std::int64_t) {
        {
            std::lock_guard<std::mutex> lock(ids_mutex);
            ids.insert(std::this_thread::get_id());
        }
        running.fetch_add(1);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (running.load() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
        if (running.load() >= 2) overlapped = true;
    });
    return overlapped.load();
}

}  // namespace

TEST_CASE("parallel_for runs ranges on several threads at once", "[thread_pool]") {
    loom::host::thread_pool pool(2);
    std::set<std::thread::id> ids;
    REQUIRE(ranges_overlap(pool, ids));
    REQUIRE(ids.size() == 2);
    REQUIRE(ids.count(std::this_thread::get_id()) == 1);

    // A range short enough to run inline leaves the pool free for what it calls.
    bool inner_overlapped = false;
    pool.parallel_for(0, 1, 1, [&](std::int64_t, std::int64_t) {
        std::set<std::thread::id> inner_ids;
        inner_overlapped = ranges_overlap(pool, inner_ids);
    });
    REQUIRE(inner_overlapped);
}

TEST_CASE("nested parallel_for runs serially on the calling thread", "[thread_pool]") {
    loom::host::thread_pool pool(3);
    std::atomic<std::int64_t> total{0};
    std::atomic<int> foreign{0};
    pool.parallel_for(0, 64, 1, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t outer = lo; outer < hi; ++outer) {
            const std::thread::id here = std::this_thread::get_id();
            int inner_calls = 0;
            pool.parallel_for(0, 100, 1, [&](std::int64_t ilo, std::int64_t ihi) {
                ++inner_calls;
                if (std::this_thread::get_id() != here) foreign.fetch_add(1);
                total.fetch_add(ihi - ilo);
            });
            if (inner_calls != 1) foreign.fetch_add(1);
            // The global pool nested inside this one is serial too.
            loom::host::parallel_for(0, 10, 1, [&](std::int64_t ilo, std::int64_t ihi) {
                if (std::this_thread::get_id() != here) foreign.fetch_add(1);
                total.fetch_add(ihi - ilo);
            });
        }
    });
    REQUIRE(foreign.load() == 0);
    REQUIRE(total.load() == 64 * 110);
}

TEST_CASE("parallel_for rethrows the first exception on the caller and stays usable", "[thread_pool]") {
    loom::host::thread_pool pool(2);
    for (int attempt = 0; attempt < 20; ++attempt) {
        REQUIRE_THROWS_WITH(pool.parallel_for(0, 100, 1,
                                              [&](std::int64_t lo, std::int64_t hi) {
                                                  for (std::int64_t i = lo; i < hi; ++i) {
                                                      if (i == 37) throw std::runtime_error("range 37 failed");
                                                  }
                                              }),
                            "range 37 failed");
    }
    // Inline (short) ranges propagate too.
    REQUIRE_THROWS_AS(pool.parallel_for(0, 3, 2, [](std::int64_t, std::int64_t) { throw loom::usage_error("x"); }),
                      loom::usage_error);
    std::atomic<std::int64_t> sum{0};
    pool.parallel_for(0, 1000, 1, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t i = lo; i < hi; ++i) sum.fetch_add(i);
    });
    REQUIRE(sum.load() == 999 * 1000 / 2);
}

TEST_CASE("parallel_for from several user threads at once neither deadlocks nor mixes jobs", "[thread_pool]") {
    loom::host::thread_pool pool(3);
    constexpr int callers = 4;
    constexpr int rounds = 200;
    std::vector<std::int64_t> sums(callers, 0);
    std::vector<std::thread> users;
    for (int u = 0; u < callers; ++u) {
        users.emplace_back([&, u] {
            for (int round = 0; round < rounds; ++round) {
                std::atomic<std::int64_t> sum{0};
                pool.parallel_for(0, 256 + u, 1, [&](std::int64_t lo, std::int64_t hi) {
                    for (std::int64_t i = lo; i < hi; ++i) sum.fetch_add(i + u);
                });
                sums[static_cast<std::size_t>(u)] += sum.load();
            }
        });
    }
    for (std::thread& user : users) user.join();
    for (int u = 0; u < callers; ++u) {
        const std::int64_t n = 256 + u;
        REQUIRE(sums[static_cast<std::size_t>(u)] == rounds * (n * (n - 1) / 2 + n * u));
    }
}

TEST_CASE("gemm from several user threads at once gives each caller its own product", "[thread_pool][gemm]") {
    constexpr int callers = 3;
    std::vector<std::thread> users;
    std::atomic<int> wrong{0};
    for (int u = 0; u < callers; ++u) {
        users.emplace_back([&, u] {
            const std::int64_t m = 97 + u, n = 80, k = 150;
            std::vector<double> a(static_cast<std::size_t>(m * k), 1.0 + u), b(static_cast<std::size_t>(k * n), 0.5);
            std::vector<double> c(static_cast<std::size_t>(m * n), -1.0);
            for (int round = 0; round < 10; ++round) {
                loom::host::gemm_fallback<double>(transpose::no, transpose::no, m, n, k, 1.0, a.data(), k, b.data(), n,
                                                  0.0, c.data(), n);
                for (double x : c) {
                    if (x != k * (1.0 + u) * 0.5) wrong.fetch_add(1);
                }
            }
        });
    }
    for (std::thread& user : users) user.join();
    REQUIRE(wrong.load() == 0);
}

TEST_CASE("gemm inside parallel_for gives each range its product", "[thread_pool][gemm]") {
    // Nested gemm runs gemm_fallback on the range's thread (never OpenBLAS on top of the
    // pool); small integers make every product exact.
    constexpr std::int64_t items = 8, m = 40, n = 70, k = 300;
    std::vector<float> a(static_cast<std::size_t>(items * m * k)), b(static_cast<std::size_t>(k * n));
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 5);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 3) - 1.0f;
    std::vector<float> c(static_cast<std::size_t>(items * m * n), std::numeric_limits<float>::quiet_NaN());
    loom::host::parallel_for(0, items, 1, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t g = lo; g < hi; ++g) {
            loom::host::gemm<float>(transpose::no, transpose::no, m, n, k, 1.0f, a.data() + g * m * k, k, b.data(), n,
                                    0.0f, c.data() + g * m * n, n);
        }
    });
    for (std::int64_t g = 0; g < items; ++g) {
        for (std::int64_t i = 0; i < m; ++i) {
            for (std::int64_t j = 0; j < n; ++j) {
                double expected = 0;
                for (std::int64_t p = 0; p < k; ++p) {
                    expected += double(a[static_cast<std::size_t>((g * m + i) * k + p)]) *
                                double(b[static_cast<std::size_t>(p * n + j)]);
                }
                REQUIRE(c[static_cast<std::size_t>((g * m + i) * n + j)] == static_cast<float>(expected));
            }
        }
    }
}

TEST_CASE("thread pools start and join their workers", "[thread_pool]") {
    for (int i = 0; i < 50; ++i) {
        loom::host::thread_pool pool(1 + i % 4);
        std::atomic<int> count{0};
        pool.parallel_for(0, 64, 1, [&](std::int64_t lo, std::int64_t hi) { count.fetch_add(int(hi - lo)); });
        REQUIRE(count.load() == 64);
    }
    REQUIRE_THROWS_AS(loom::host::thread_pool(0), loom::usage_error);
    REQUIRE(loom::host::thread_pool::global().size() >= 1);
    REQUIRE(&loom::host::thread_pool::global() == &loom::host::thread_pool::global());
}

TEST_CASE("default_thread_count reads LOOM_NUM_THREADS", "[thread_pool]") {
    const char* saved = std::getenv("LOOM_NUM_THREADS");
    const std::string restore = saved != nullptr ? saved : "";
    setenv("LOOM_NUM_THREADS", "3", 1);
    REQUIRE(loom::host::default_thread_count() == 3);
    setenv("LOOM_NUM_THREADS", "three", 1);
    REQUIRE_THROWS_WITH(loom::host::default_thread_count(), Catch::Matchers::Contains("LOOM_NUM_THREADS='three'"));
    setenv("LOOM_NUM_THREADS", "0", 1);
    REQUIRE_THROWS_AS(loom::host::default_thread_count(), loom::usage_error);
    unsetenv("LOOM_NUM_THREADS");
    REQUIRE(loom::host::default_thread_count() >= 1);
    if (saved != nullptr) setenv("LOOM_NUM_THREADS", restore.c_str(), 1);
}

TEST_CASE("the FMA peak of one thread is a plausible rate for one core", "[gemm][peak]") {
    if (loom::host::best_cpu_isa() == loom::host::cpu_isa::portable) return;  // no vector FMA to measure
    loom::host::thread_pool one(1);
    const double peak = loom::host::measure_fma_peak_flops(one);
    INFO("peak " << peak / 1e9 << " GFLOP/s on one thread");
    // A core with AVX2+FMA does 16 to 64 float FLOPs per cycle at 1 to 6 GHz; the lower
    // bound leaves room for a loaded machine, the upper one catches chains optimised away.
    CHECK(peak > 1e9);
    CHECK(peak < 4e11);
}
