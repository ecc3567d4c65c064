#pragma once
// LayerNorm and RMSNorm over the last dim of a row-major [rows, cols] tensor: the CUDA
// kernels of ops::layer_norm / layer_norm_grad and ops::rms_norm / rms_norm_grad, with the
// ops' semantics (PyTorch's: biased variance, eps inside the square root). T is float or
// loom::bfloat16; all arithmetic and every sum is in float, bf16 results are rounded once,
// and the statistics (mean, rstd) are float. Host twins: runtime/host/kernels/{layer_norm,
// rms_norm}.hpp.
//
// Deterministic: every sum runs in a fixed order, and dgamma / dbeta are summed per block of
// rows into the workspace, then over the blocks in order (no atomics), so results are
// bit-identical run to run. The backward's workspace, `*_backward_workspace_bytes(rows,
// cols)`, is carved by the caller from its arena (any 16-byte-aligned device memory).
//
// Rows of up to 8192 elements are held in registers (16-byte vector accesses when every
// pointer is 16-byte aligned and cols is a multiple of 16 / sizeof(T)); longer rows are
// read from memory once per pass. Pointers must not overlap, apart from what is stated.
#include <cstddef>
#include <cstdint>

#include <loom/core/bfloat16.hpp>
#include <loom/runtime/cuda/device.hpp>

namespace loom::cuda {

// y = (x - mean) * rstd * gamma + beta per row, rstd = 1 / sqrt(var + eps), var biased.
// x, y: [rows, cols]; gamma, beta: [cols]. mean and rstd ([rows], float) are written when not
// null: what a caller may keep for layer_norm_backward.
template <class T>
void layer_norm_forward(const T* x, const T* gamma, const T* beta, T* y, float* mean, float* rstd, std::int64_t rows,
                        std::int64_t cols, float eps, stream_handle s);

// Workspace of layer_norm_backward: float partial dgamma and dbeta per block of rows.
std::size_t layer_norm_backward_workspace_bytes(std::int64_t rows, std::int64_t cols);

// The fused backward of layer_norm_grad, (dy, x, gamma) -> (dx, dgamma, dbeta). With
// xhat = (x - mean) rstd and g = dy gamma:
//   dx = rstd (g - mean(g) - xhat mean(g xhat)),  dgamma = sum over rows of dy xhat,
//   dbeta = sum over rows of dy.
// mean and rstd: the forward's (same x and eps), or both null to recompute them from x, as
// the op does. dgamma and dbeta are overwritten, not accumulated.
template <class T>
void layer_norm_backward(const T* dy, const T* x, const T* gamma, const float* mean, const float* rstd, T* dx,
                         T* dgamma, T* dbeta, std::int64_t rows, std::int64_t cols, float eps, void* workspace,
                         stream_handle s);

// y = x * rstd * gamma per row, rstd = 1 / sqrt(mean(x^2) + eps). rstd ([rows], float) is
// written when not null.
template <class T>
void rms_norm_forward(const T* x, const T* gamma, T* y, float* rstd, std::int64_t rows, std::int64_t cols, float eps,
                      stream_handle s);

// Workspace of rms_norm_backward: float partial dgamma per block of rows.
std::size_t rms_norm_backward_workspace_bytes(std::int64_t rows, std::int64_t cols);

// The fused backward of rms_norm_grad, (dy, x, gamma) -> (dx, dgamma). With g = dy gamma:
//   dx = rstd (g - x rstd^2 mean(g x)),  dgamma = sum over rows of dy x rstd.
// rstd: the forward's, or null to recompute it from x. dgamma is overwritten.
template <class T>
void rms_norm_backward(const T* dy, const T* x, const T* gamma, const float* rstd, T* dx, T* dgamma,
                       std::int64_t rows, std::int64_t cols, float eps, void* workspace, stream_handle s);

}  // namespace loom::cuda
