// The fused attention kernels against their host twin (tests/cuda/twins/flash_attention.hpp),
// in float and bf16, head dims 64 and 128, causal and not, on sequence lengths around the
// 64-row tiles. The twin itself is checked against loom's host attention by
// tests/test_flash_attention_twin.cpp.
//
// Both sides start from the same stored inputs; the backward of both reads the twin's out and
// lse, so each kernel is compared on its own. Tolerances, |kernel - twin| <= rel |twin| +
// frac max|twin| + 1e-5 per tensor:
//   float  rel = frac = 2e-5: the float kernels sum each dot product in the twin's order; what
//          differs is exp2f (within 2 ulp), the split of row sums and row dots across lanes,
//          and the order of the P V and dS K sums, a few float ulps of each term;
//   bf16   rel = 2^-7, frac = 2^-8: a stored result may land on the neighbouring bf16 (one
//          ulp, at most 2^-7 relative), and a P or dS element may round to the neighbouring
//          bf16 before its product when the tensor cores' float sums differ from the twin's;
//          on the host the twin's own sensitivity to its compute precision stays below 2^-9
//          of the largest element.
//   lse    1e-5 (1 + |twin|), a float statistic on both sides.
// The absolute 1e-5 covers gradients that cancel to ~0 (one key: dS = P (dP - D) = 0 up to
// the order of two dot products).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/runtime/cuda/attention.hpp>

#include "support.hpp"
#include "twins/flash_attention.hpp"

using namespace loom;
using namespace loom::cuda_test;

namespace {

struct attention_case {
    std::int64_t batch, heads, s, t, d;
    bool causal;
    double scale;  // 0: 1/sqrt(d)
};

std::string describe(const attention_case& c) {
    return "b=" + std::to_string(c.batch) + " h=" + std::to_string(c.heads) + " s=" + std::to_string(c.s) +
           " t=" + std::to_string(c.t) + " d=" + std::to_string(c.d) + (c.causal ? " causal" : " full");
}

cuda::attention_dims dims_of(const attention_case& c) {
    cuda::attention_dims d;
    d.batch = c.batch;
    d.heads = c.heads;
    d.queries = c.s;
    d.keys = c.t;
    d.head_dim = c.d;
    d.causal = c.causal;
    d.scale = c.scale;
    return d;
}

template <class T>
struct tolerance {
    double rel, frac;
};
template <class T>
tolerance<T> tolerance_for() {
    if constexpr (std::is_same_v<T, bfloat16>) return {0x1p-7, 0x1p-8};
    else return {2e-5, 2e-5};
}

template <class T>
void require_matches_twin(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
    const auto tol = tolerance_for<T>();
    const std::vector<float> w = widen(want);
    double largest = 0;
    for (float x : w) largest = std::max(largest, std::fabs(static_cast<double>(x)));
    require_close(got, w, tol.rel, tol.frac * largest + 1e-5, what);
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
void check_attention(const attention_case& c, std::uint64_t seed) {
    INFO(describe(c) << (std::is_same_v<T, bfloat16> ? " bf16" : " float"));
    const std::int64_t pairs = c.batch * c.heads;
    const auto nq = static_cast<std::size_t>(pairs * c.s * c.d), nk = static_cast<std::size_t>(pairs * c.t * c.d);
    const auto rows = static_cast<std::size_t>(pairs * c.s);
    const auto q = random_vector<T>(nq, seed), k = random_vector<T>(nk, seed + 1), v = random_vector<T>(nk, seed + 2),
               dout = random_vector<T>(nq, seed + 3);

    const cuda::attention_dims dims = dims_of(c);
    const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.d));
    const cuda_twin::flash_dims td{pairs, c.s, c.t, c.d, c.causal, scale};
    std::vector<T> out(nq), dq(nq), dk(nk), dv(nk);
    std::vector<float> lse(rows);
    cuda_twin::flash_forward<T, float>(td, q.data(), k.data(), v.data(), out.data(), lse.data());
    cuda_twin::flash_backward<T, float>(td, dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                                        dq.data(), dk.data(), dv.data());

    device_vector<T> d_q(q), d_k(k), d_v(v), d_dout(dout), d_out(nq), d_dq(nq), d_dk(nk), d_dv(nk);
    device_vector<T> d_out_twin(out);
    device_vector<float> d_lse(rows), d_lse_twin(lse);
    cuda::device_buffer workspace(std::max<std::size_t>(cuda::attention_backward_workspace_bytes(dims), 16));

    cuda::attention_forward(d_q.get(), d_k.get(), d_v.get(), d_out.get(), d_lse.get(), dims, nullptr);
    const auto got_out = d_out.download();
    const auto got_lse = d_lse.download();
    require_matches_twin(got_out, out, "out");
    require_close(got_lse, lse, 1e-5, 1e-5, "lse");

    cuda::attention_backward(d_dout.get(), d_q.get(), d_k.get(), d_v.get(), d_out_twin.get(), d_lse_twin.get(),
                             d_dq.get(), d_dk.get(), d_dv.get(), workspace.get(), dims, nullptr);
    const auto got_dq = d_dq.download(), got_dk = d_dk.download(), got_dv = d_dv.download();
    require_matches_twin(got_dq, dq, "dq");
    require_matches_twin(got_dk, dk, "dk");
    require_matches_twin(got_dv, dv, "dv");

    // Deterministic: a second run gives the same bits.
    cuda::attention_forward(d_q.get(), d_k.get(), d_v.get(), d_out.get(), d_lse.get(), dims, nullptr);
    cuda::attention_backward(d_dout.get(), d_q.get(), d_k.get(), d_v.get(), d_out_twin.get(), d_lse_twin.get(),
                             d_dq.get(), d_dk.get(), d_dv.get(), workspace.get(), dims, nullptr);
    CHECK(same_bits(d_out.download(), got_out));
    CHECK(same_bits(d_lse.download(), got_lse));
    CHECK(same_bits(d_dq.download(), got_dq));
    CHECK(same_bits(d_dk.download(), got_dk));
    CHECK(same_bits(d_dv.download(), got_dv));
}

// Around the 64-row tiles: one row, part of a tile, exactly one, one past, several with a
// partial last; causal (s == t), and not (t larger and smaller than s).
std::vector<attention_case> cases(std::int64_t d) {
    return {
        {1, 1, 1, 1, d, true, 0},       {2, 3, 37, 37, d, true, 0},    {1, 2, 64, 64, d, true, 0.1},
        {1, 1, 65, 65, d, true, 0},     {1, 2, 130, 130, d, true, 0.2}, {2, 1, 257, 257, d, true, 0},
        {2, 1, 37, 50, d, false, 0},    {1, 1, 70, 19, d, false, 0.15}, {1, 1, 1, 7, d, false, 0},
        {1, 2, 130, 129, d, false, 0},  {1, 1, 64, 128, d, false, 0},
    };
}

}  // namespace

TEMPLATE_TEST_CASE("fused attention matches its host twin, head dim 64", "[cuda][attention]", float, bfloat16) {
    std::uint64_t seed = 10;
    for (const auto& c : cases(64)) check_attention<TestType>(c, seed += 10);
}

TEMPLATE_TEST_CASE("fused attention matches its host twin, head dim 128", "[cuda][attention]", float, bfloat16) {
    std::uint64_t seed = 1000;
    for (const auto& c : cases(128)) check_attention<TestType>(c, seed += 10);
}

TEST_CASE("fused attention refuses what it does not support, saying what to change", "[cuda][attention][errors]") {
    device_vector<bfloat16> x(4096);
    device_vector<float> lse(64);
    cuda::attention_dims dims;
    dims.queries = dims.keys = 16;
    dims.head_dim = 80;
    CHECK_THROWS_AS(cuda::attention_forward(x.get(), x.get(), x.get(), x.get(), lse.get(), dims, nullptr), usage_error);
    CHECK_THROWS_WITH(cuda::attention_forward(x.get(), x.get(), x.get(), x.get(), lse.get(), dims, nullptr),
                      Catch::Contains("head_dim = 80") && Catch::Contains("64 and 128"));
    dims.head_dim = 64;
    dims.keys = 8;
    CHECK_THROWS_WITH(cuda::attention_forward(x.get(), x.get(), x.get(), x.get(), lse.get(), dims, nullptr),
                      Catch::Contains("causal") && Catch::Contains("keys = 8"));
    dims.keys = 16;
    CHECK_THROWS_WITH(cuda::attention_forward(x.get() + 1, x.get(), x.get(), x.get(), lse.get(), dims, nullptr),
                      Catch::Contains("q =") && Catch::Contains("16-byte aligned"));
    dims.scale = -1.0;
    CHECK_THROWS_WITH(cuda::attention_forward(x.get(), x.get(), x.get(), x.get(), lse.get(), dims, nullptr),
                      Catch::Contains("positive scale"));
}

// Not run by default: `cuda_test_attention "[perf]"`. GPT-2 124M's attention (12 heads of 64,
// 1024 positions) in bf16; the FLOP counts are the usual ones (4 s^2 d / 2 per head forward
// under the causal mask, 2.5 times that backward), not what the two-pass backward executes.
TEST_CASE("fused attention throughput at GPT-2 124M's shape", "[.][perf][cuda][attention]") {
    cuda::attention_dims dims;
    dims.batch = 16;
    dims.heads = 12;
    dims.queries = dims.keys = 1024;
    dims.head_dim = 64;
    const std::size_t n = static_cast<std::size_t>(dims.batch * dims.heads * dims.queries * dims.head_dim);
    const std::size_t rows = static_cast<std::size_t>(dims.batch * dims.heads * dims.queries);
    device_vector<bfloat16> q(random_vector<bfloat16>(n, 1)), k(random_vector<bfloat16>(n, 2)),
        v(random_vector<bfloat16>(n, 3)), dout(random_vector<bfloat16>(n, 4)), out(n), dq(n), dk(n), dv(n);
    device_vector<float> lse(rows);
    cuda::device_buffer workspace(cuda::attention_backward_workspace_bytes(dims));
    cuda::stream s;
    cuda::event start(true), mid(true), stop(true);
    const int reps = 10;
    for (int warm = 0; warm < 2; ++warm) {
        cuda::attention_forward(q.get(), k.get(), v.get(), out.get(), lse.get(), dims, s.get());
        cuda::attention_backward(dout.get(), q.get(), k.get(), v.get(), out.get(), lse.get(), dq.get(), dk.get(),
                                 dv.get(), workspace.get(), dims, s.get());
    }
    start.record(s);
    for (int r = 0; r < reps; ++r)
        cuda::attention_forward(q.get(), k.get(), v.get(), out.get(), lse.get(), dims, s.get());
    mid.record(s);
    for (int r = 0; r < reps; ++r)
        cuda::attention_backward(dout.get(), q.get(), k.get(), v.get(), out.get(), lse.get(), dq.get(), dk.get(),
                                 dv.get(), workspace.get(), dims, s.get());
    stop.record(s);
    stop.synchronize();
    const double fwd_ms = cuda::event::elapsed_ms(start, mid) / reps;
    const double bwd_ms = cuda::event::elapsed_ms(mid, stop) / reps;
    const double flops = 4.0 * static_cast<double>(dims.batch * dims.heads) * dims.queries * dims.queries *
                         dims.head_dim / 2;
    WARN("attention b=16 h=12 s=1024 d=64 bf16 causal: forward " << fwd_ms << " ms (" << flops / fwd_ms * 1e-9
                                                                << " TFLOP/s), backward " << bwd_ms << " ms ("
                                                                << 2.5 * flops / bwd_ms * 1e-9 << " TFLOP/s)");
}
