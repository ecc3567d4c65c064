#pragma once
// Warp-level building blocks of the tensor-core kernels (sm_80 and later, so sm_90 too): the
// bf16 mma.sync tile, ldmatrix, cp.async copies into shared memory, and the few shuffles the
// kernels need, each a thin wrapper over one PTX instruction.
//
// Fragment layouts of mma.sync.m16n8k16 (PTX ISA, "Matrix fragments for mma.m16n8k16"),
// with g = lane / 4 and t = lane % 4; a 32-bit register holds two bf16, the lower column
// (or row, for B) in its low half:
//   A 16x16, row-major:  a0 = A[g][2t..2t+1]    a1 = A[g+8][2t..2t+1]
//                        a2 = A[g][2t+8..2t+9]  a3 = A[g+8][2t+8..2t+9]
//   B 16x8, by column:   b0 = B[2t..2t+1][g]    b1 = B[2t+8..2t+9][g]
//   C, D 16x8 (float):   c0, c1 = C[g][2t..2t+1]  c2, c3 = C[g+8][2t..2t+1]
// So the C fragments of two adjacent n-tiles, rounded to bf16 pairwise, are the A fragment
// of one 16-deep k-step: the scores of one product feed the next without shared memory.
//
// ldmatrix.x4 loads four 8x8 bf16 matrices: lanes 8i..8i+7 give the row addresses of
// matrix i (16 bytes each), and lane l receives row l / 4, columns 2 (l % 4) and +1 of each
// matrix in its register i; with .trans it receives rows 2 (l % 4) and +1 of column l / 4
// instead, which is the B fragment of a matrix stored row-major as k x n.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace loom::cuda::detail {

// D = A B + C on one 16x8x16 tile, bf16 inputs, float accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                               std::uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ std::uint32_t shared_address(const void* p) {
    return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 matrices; `row` is this lane's row address (16-byte aligned, shared memory).
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const __nv_bfloat16* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const __nv_bfloat16* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
}

// Two floats as a bf16 pair, `lo` in the low half (round to nearest even, as every store).
__device__ __forceinline__ std::uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
}

// 16 bytes from global to shared memory without passing through registers. When `valid` is
// false nothing is read and the 16 bytes are zero (src-size 0), so tiles past the end of a
// tensor arrive as zeros; `src` must still be a valid address.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}

// The same for 4 bytes (one float), through L1.
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(dst)), "l"(src),
                 "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits for every copy this thread issued; a __syncthreads() after it makes them visible to
// the whole block.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ float warp_xor(float v, int lane_mask) {
    return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}

__device__ __forceinline__ float warp_read(float v, int src_lane) { return __shfl_sync(0xffffffffu, v, src_lane); }

// The block's dynamic shared memory (its size is the launch's third argument).
__device__ __forceinline__ unsigned char* dynamic_shared_memory() {
    extern __shared__ __align__(128) unsigned char loom_dynamic_shared[];
    return loom_dynamic_shared;
}

}  // namespace loom::cuda::detail
