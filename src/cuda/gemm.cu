// Definitions of <loom/runtime/cuda/gemm.hpp>: row-major products mapped onto cuBLASLt's
// column-major ones, one cached plan per problem.
//
// The mapping: row-major C (m x n) read column-major is C^T (n x m), and
// C^T = op(B)^T op(A)^T. A row-major matrix read column-major is its own transpose, so
// cuBLASLt computes with A' = B, B' = A, m' = n, n' = m and the transpose flags unchanged
// (transa' = transpose_b, transb' = transpose_a), every leading dimension as given. The
// epilogues follow: a bias indexed by C's column is indexed by the rows of C^T, which is
// where BIAS and the gradients of DGELU_BGRAD and BGRADA put it; the k-reduction of op(A)
// is cuBLASLt's BGRADB, as our A is its B.
//
// Determinism. cuBLAS documents bit-wise reproducibility run to run for a given toolkit
// version on GPUs of the same architecture and SM count, when each concurrent stream has its
// own workspace ("Results reproducibility" in the cuBLAS guide; cublasLtMatmul with a
// user-owned workspace is its recommended way). Beyond that this file fixes what could vary:
// the algorithm is chosen once per problem (cublasLtMatmulAlgoGetHeuristic, whose inputs are
// the problem, the workspace size and the pointer alignments, all part of the plan's key) and
// reused; the workspace is one buffer of fixed size; and cuBLASLt's split-k reductions do not
// use atomics: INPLACE orders its partial sums with counters ("to guarantee the
// sequentiality", cublasLt.h), COMPUTE_TYPE and OUTPUT_TYPE reduce in a separate pass.
#include <loom/runtime/cuda/gemm.hpp>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <compare>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>

#include <loom/core/error.hpp>

#include "check.cuh"

namespace loom::cuda {
namespace {

[[noreturn]] void throw_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
    const char* fix = "";
    switch (status) {
        case CUBLAS_STATUS_NOT_INITIALIZED:
            fix = "cuBLASLt could not start; check the driver with nvidia-smi and that a device is set";
            break;
        case CUBLAS_STATUS_ALLOC_FAILED:
            fix = "memory ran out; free device memory or make the workspace smaller";
            break;
        case CUBLAS_STATUS_INVALID_VALUE:
            fix = "an argument is out of range (sizes, leading dimensions, epilogue pointers or aux ld); check "
                  "the gemm_args";
            break;
        case CUBLAS_STATUS_ARCH_MISMATCH: fix = "this GPU lacks a feature the product needs (bf16 needs sm_80+)"; break;
        case CUBLAS_STATUS_NOT_SUPPORTED:
            fix = "cuBLASLt has no kernel for this combination of types, transposes, alignments and epilogue; "
                  "align the pointers to 16 bytes or choose another epilogue";
            break;
        case CUBLAS_STATUS_EXECUTION_FAILED:
        case CUBLAS_STATUS_INTERNAL_ERROR:
            fix = "the kernel failed, often after an earlier asynchronous CUDA error; run under compute-sanitizer";
            break;
        default: fix = "see the cuBLAS documentation of this status"; break;
    }
    throw cuda_error(std::string(call) + " failed: " + cublasLtGetStatusName(status) + " (" +
                     cublasLtGetStatusString(status) + ") at " + file + ":" + std::to_string(line) + "; " + fix);
}

#define LOOM_CUBLAS_CHECK(call)                                                                           \
    do {                                                                                                  \
        const cublasStatus_t loom_cublas_status_ = (call);                                                \
        if (loom_cublas_status_ != CUBLAS_STATUS_SUCCESS) throw_cublas(loom_cublas_status_, #call, __FILE__, \
                                                                       __LINE__);                         \
    } while (0)

template <class T>
constexpr cudaDataType_t data_type = std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;

// The largest power of two, up to cuBLASLt's 256, that divides the address.
std::uint32_t alignment_of(const void* p) {
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    std::uint32_t a = 1;
    while (a < 256 && address % (2 * a) == 0) a *= 2;
    return a;
}

bool has_bias(gemm_epilogue e) { return e == gemm_epilogue::bias || e == gemm_epilogue::bias_gelu; }
bool has_bias_grad(gemm_epilogue e) {
    return e == gemm_epilogue::dgelu_bgrad || e == gemm_epilogue::bgrad_a || e == gemm_epilogue::bgrad_b;
}
bool has_aux(gemm_epilogue e) { return e == gemm_epilogue::bias_gelu || e == gemm_epilogue::dgelu_bgrad; }

cublasLtEpilogue_t lt_epilogue(gemm_epilogue e) {
    switch (e) {
        case gemm_epilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
        case gemm_epilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
        case gemm_epilogue::bias_gelu: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
        case gemm_epilogue::dgelu_bgrad: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
        case gemm_epilogue::bgrad_a: return CUBLASLT_EPILOGUE_BGRADB;  // our A is cuBLASLt's B
        case gemm_epilogue::bgrad_b: return CUBLASLT_EPILOGUE_BGRADA;
    }
    return CUBLASLT_EPILOGUE_DEFAULT;
}

// Everything the algorithm choice depends on.
struct plan_key {
    bool bf16, transpose_a, transpose_b, accumulate, tf32;
    gemm_epilogue epilogue;
    std::int64_t m, n, k, lda, ldb, ldc, ldaux;
    std::uint32_t align_a, align_b, align_c, align_vector, align_aux;
    auto operator<=>(const plan_key&) const = default;
};

// Descriptors and the chosen algorithm of one problem; `found` is false when cuBLASLt has
// none (remembered, so the question is not asked again).
struct plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A' (our B), B' (our A), C
    cublasLtMatmulAlgo_t algo{};
    bool found = false;

    plan() = default;
    plan(const plan&) = delete;
    plan& operator=(const plan&) = delete;
    ~plan() {
        if (c) (void)cublasLtMatrixLayoutDestroy(c);
        if (b) (void)cublasLtMatrixLayoutDestroy(b);
        if (a) (void)cublasLtMatrixLayoutDestroy(a);
        if (desc) (void)cublasLtMatmulDescDestroy(desc);
    }
};

template <class T>
std::string describe(const gemm_args<T>& g) {
    return std::string(std::is_same_v<T, float> ? "float" : "bf16") + " C[" + std::to_string(g.m) + " x " +
           std::to_string(g.n) + "] = " + (g.transpose_a ? "A^T" : "A") + " " + (g.transpose_b ? "B^T" : "B") +
           " (k = " + std::to_string(g.k) + ", lda " + std::to_string(g.lda) + ", ldb " + std::to_string(g.ldb) +
           ", ldc " + std::to_string(g.ldc) + ", epilogue " + to_string(g.epilogue) +
           (g.accumulate ? ", accumulate" : "") + ")";
}

// The arguments with their default leading dimensions filled in, or a usage_error naming
// the one that is wrong.
template <class T>
gemm_args<T> checked(gemm_args<T> g, const char* fn) {
    const std::string where = std::string("cuda::gemm_engine::") + fn + ": ";
    auto fail = [&](const std::string& what) { throw usage_error(where + what); };
    if (g.m < 0 || g.n < 0 || g.k < 0)
        fail("m = " + std::to_string(g.m) + ", n = " + std::to_string(g.n) + ", k = " + std::to_string(g.k) +
             "; sizes must not be negative");
    const std::int64_t a_row = g.transpose_a ? g.m : g.k, b_row = g.transpose_b ? g.k : g.n;
    if (g.lda == 0) g.lda = a_row;
    if (g.ldb == 0) g.ldb = b_row;
    if (g.ldc == 0) g.ldc = g.n;
    if (g.ldaux == 0) g.ldaux = g.n;
    if (g.m == 0 || g.n == 0) return g;
    if (g.k == 0)
        fail("k = 0 leaves C = 0 (or unchanged) with no product to run; handle it without a GEMM");
    if (g.lda < a_row)
        fail("lda = " + std::to_string(g.lda) + " is less than " + (g.transpose_a ? "m" : "k") + " = " +
             std::to_string(a_row) + ", the row length of A as stored" + (g.transpose_a ? " (transposed)" : ""));
    if (g.ldb < b_row)
        fail("ldb = " + std::to_string(g.ldb) + " is less than " + (g.transpose_b ? "k" : "n") + " = " +
             std::to_string(b_row) + ", the row length of B as stored" + (g.transpose_b ? " (transposed)" : ""));
    if (g.ldc < g.n) fail("ldc = " + std::to_string(g.ldc) + " is less than n = " + std::to_string(g.n));
    if (!g.a || !g.b || !g.c) fail(std::string(!g.a ? "a" : !g.b ? "b" : "c") + " is null; pass device pointers");
    if (has_bias(g.epilogue) && !g.bias)
        fail(std::string("epilogue ") + to_string(g.epilogue) + " needs bias (n values)");
    if (has_bias_grad(g.epilogue) && !g.bias_grad)
        fail(std::string("epilogue ") + to_string(g.epilogue) + " needs bias_grad (" +
             (g.epilogue == gemm_epilogue::bgrad_a ? "m" : "n") + " values)");
    if (has_aux(g.epilogue)) {
        if (!g.aux) fail(std::string("epilogue ") + to_string(g.epilogue) + " needs aux (m x n, the pre-activation)");
        if (g.ldaux < g.n || g.ldaux % 8 != 0)
            fail("ldaux = " + std::to_string(g.ldaux) + " with n = " + std::to_string(g.n) +
                 "; cuBLASLt needs the aux rows at least n apart and a multiple of 8: pass ldaux = " +
                 std::to_string((g.n + 7) / 8 * 8) + " and allocate aux accordingly");
        if (g.accumulate)
            fail(std::string("accumulate with epilogue ") + to_string(g.epilogue) +
                 " would apply the GELU to C + product; accumulate separately");
    }
    if constexpr (!std::is_same_v<T, float>) g.allow_tf32 = false;  // bf16 products are exact in float
    return g;
}

template <class T>
plan_key key_of(const gemm_args<T>& g) {
    const void* vector = has_bias(g.epilogue) ? static_cast<const void*>(g.bias)
                         : has_bias_grad(g.epilogue) ? static_cast<const void*>(g.bias_grad)
                                                     : nullptr;
    return {!std::is_same_v<T, float>, g.transpose_a, g.transpose_b, g.accumulate, g.allow_tf32, g.epilogue,
            g.m, g.n, g.k, g.lda, g.ldb, g.ldc, has_aux(g.epilogue) ? g.ldaux : 0,
            alignment_of(g.a), alignment_of(g.b), alignment_of(g.c), vector ? alignment_of(vector) : 256,
            has_aux(g.epilogue) ? alignment_of(g.aux) : 256};
}

template <class V>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t what, const V& value) {
    LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, what, &value, sizeof(value)));
}

// The epilogue's pointers, which change from call to call (the descriptor keeps the last).
template <class T>
void set_pointers(cublasLtMatmulDesc_t desc, const gemm_args<T>& g) {
    if (has_bias(g.epilogue)) set_attribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(g.bias));
    if (has_bias_grad(g.epilogue))
        set_attribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<void*>(g.bias_grad));
    if (has_aux(g.epilogue)) set_attribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(g.aux));
}

}  // namespace

const char* to_string(gemm_epilogue e) noexcept {
    switch (e) {
        case gemm_epilogue::none: return "none";
        case gemm_epilogue::bias: return "bias";
        case gemm_epilogue::bias_gelu: return "bias_gelu";
        case gemm_epilogue::dgelu_bgrad: return "dgelu_bgrad";
        case gemm_epilogue::bgrad_a: return "bgrad_a";
        case gemm_epilogue::bgrad_b: return "bgrad_b";
    }
    return "unknown";
}

struct gemm_engine::state {
    cublasLtHandle_t handle = nullptr;
    device_buffer workspace;
    int device = 0;
    std::map<plan_key, plan> plans;

    ~state() {
        plans.clear();
        if (handle) (void)cublasLtDestroy(handle);
    }

    void require_device(const char* fn) const {
        int now = 0;
        LOOM_CUDA_CHECK(cudaGetDevice(&now));
        if (now != device)
            throw usage_error(std::string("cuda::gemm_engine::") + fn + ": the engine was made on device " +
                              std::to_string(device) + " but device " + std::to_string(now) +
                              " is current; make one engine per device");
    }

    template <class T>
    plan& plan_for(const gemm_args<T>& g) {
        const plan_key key = key_of(g);
        auto [at, inserted] = plans.try_emplace(key);
        if (!inserted) return at->second;
        try {
            build(at->second, key, g);
        } catch (...) {
            plans.erase(at);
            throw;
        }
        return at->second;
    }

    template <class T>
    void build(plan& p, const plan_key& key, const gemm_args<T>& g) {
        const cublasComputeType_t compute = key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        LOOM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
        const cublasOperation_t op_a = g.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our B
        const cublasOperation_t op_b = g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
        set_attribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
        set_attribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
        set_attribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(g.epilogue));
        if (has_aux(g.epilogue)) set_attribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.ldaux);
        // The heuristic reads the alignment of these pointers, so the plan is keyed on it.
        set_pointers(p.desc, g);

        const cudaDataType_t type = data_type<T>;
        // Column-major shapes: A' = B is n x k (k x n stored when transposed), B' = A is
        // k x m (m x k), C' = C^T is n x m.
        const auto rows_a = static_cast<std::uint64_t>(op_a == CUBLAS_OP_N ? g.n : g.k);
        const auto cols_a = static_cast<std::uint64_t>(op_a == CUBLAS_OP_N ? g.k : g.n);
        const auto rows_b = static_cast<std::uint64_t>(op_b == CUBLAS_OP_N ? g.k : g.m);
        const auto cols_b = static_cast<std::uint64_t>(op_b == CUBLAS_OP_N ? g.m : g.k);
        LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, type, rows_a, cols_a, g.ldb));
        LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, type, rows_b, cols_b, g.lda));
        LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, type, static_cast<std::uint64_t>(g.n),
                                                     static_cast<std::uint64_t>(g.m), g.ldc));

        cublasLtMatmulPreference_t preference = nullptr;
        LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
        cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
        int returned = 0;
        cublasLtMatmulHeuristicResult_t result{};
        try {
            const std::uint64_t bytes = workspace.bytes();
            LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
                preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof(bytes)));
            const std::uint32_t align[4] = {key.align_b, key.align_a, key.align_c, key.align_c};
            const cublasLtMatmulPreferenceAttributes_t which[4] = {
                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
            for (int i = 0; i < 4; ++i)
                LOOM_CUBLAS_CHECK(
                    cublasLtMatmulPreferenceSetAttribute(preference, which[i], &align[i], sizeof(align[i])));
            status = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.c, p.c, preference, 1, &result,
                                                    &returned);
        } catch (...) {
            (void)cublasLtMatmulPreferenceDestroy(preference);
            throw;
        }
        (void)cublasLtMatmulPreferenceDestroy(preference);
        if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && returned == 0)) return;
        LOOM_CUBLAS_CHECK(status);
        p.algo = result.algo;
        p.found = true;
    }
};

gemm_engine::gemm_engine(std::size_t workspace_bytes) : state_(std::make_unique<state>()) {
    LOOM_CUDA_CHECK(cudaGetDevice(&state_->device));
    state_->workspace = device_buffer(workspace_bytes);
    LOOM_CUBLAS_CHECK(cublasLtCreate(&state_->handle));
}

gemm_engine::~gemm_engine() = default;

std::size_t gemm_engine::cached_plans() const { return state_->plans.size(); }
std::size_t gemm_engine::workspace_bytes() const { return state_->workspace.bytes(); }

template <class T>
bool gemm_engine::supported(const gemm_args<T>& args) {
    const gemm_args<T> g = checked(args, "supported");
    if (g.m == 0 || g.n == 0) return true;
    state_->require_device("supported");
    return state_->plan_for(g).found;
}

template <class T>
void gemm_engine::run(const gemm_args<T>& args, stream_handle s) {
    const gemm_args<T> g = checked(args, "run");
    if (g.m == 0 || g.n == 0) return;
    state_->require_device("run");
    plan& p = state_->plan_for(g);
    if (!p.found)
        throw cuda_error("cuda::gemm_engine::run: cuBLASLt has no algorithm for " + describe(g) +
                         " with these pointer alignments; align A, B, C and the epilogue vectors to 16 bytes, or "
                         "run the epilogue as a separate kernel");
    set_pointers(p.desc, g);
    const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
    LOOM_CUBLAS_CHECK(cublasLtMatmul(state_->handle, p.desc, &alpha, g.b, p.a, g.a, p.b, &beta, g.c, p.c, g.c, p.c,
                                     &p.algo, state_->workspace.get(), state_->workspace.bytes(), s));
}

template void gemm_engine::run<float>(const gemm_args<float>&, stream_handle);
template void gemm_engine::run<bfloat16>(const gemm_args<bfloat16>&, stream_handle);
template bool gemm_engine::supported<float>(const gemm_args<float>&);
template bool gemm_engine::supported<bfloat16>(const gemm_args<bfloat16>&);

}  // namespace loom::cuda
