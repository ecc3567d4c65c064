#pragma once
// Fused scaled dot-product attention on the GPU, flash-attention style: the semantics and
// layouts of ops::Attention and ops::AttentionGrad (loom/ops/attention.hpp), with no s x t
// matrix in memory. T is float or loom::bfloat16; bf16 runs the products on tensor cores with
// float accumulators, float on plain FMAs (for checking and small runs). Softmax statistics
// (lse, and the backward's row dots) are float whatever T is. Host twin:
// tests/cuda/twins/flash_attention.hpp.
//
//   q [b, h, s, d]   k [b, h, t, d]   v [b, h, t, d]   (dense row-major, device memory)
//   out [b, h, s, d]   lse [b, h, s]:  lse_i = log sum_j exp(scale q_i . k_j),
//                                      out_i = sum_j exp(scale q_i . k_j - lse_i) v_j,
//   j over every key, or over j <= i when causal (causal needs t == s).
//
// Limits, each refused with a usage_error that says what to change: head_dim 64 or 128 (the
// same for q, k and v), tensors and workspace 16-byte aligned (lse 4-byte), b h <= 65535.
// Tiles are 64 queries x 64 keys; any s and t work (partial tiles are masked).
//
// Results are deterministic: no atomics, every sum in a fixed order, so a rerun on the same
// GPU gives the same bits.
#include <cstddef>
#include <cstdint>

#include <loom/core/bfloat16.hpp>
#include <loom/runtime/cuda/device.hpp>

namespace loom::cuda {

struct attention_dims {
    std::int64_t batch = 1;
    std::int64_t heads = 1;
    std::int64_t queries = 0;   // s
    std::int64_t keys = 0;      // t; must equal s when causal
    std::int64_t head_dim = 0;  // d: 64 or 128
    bool causal = true;
    double scale = 0.0;  // > 0; 0 means 1 / sqrt(head_dim), the op's default
};

// out and lse from q, k, v (all on the device, visible to stream s).
template <class T>
void attention_forward(const T* q, const T* k, const T* v, T* out, float* lse, const attention_dims& dims,
                       stream_handle s);

// Device scratch the backward needs: b h s floats (the row dots D_i = sum dout_i * out_i).
std::size_t attention_backward_workspace_bytes(const attention_dims& dims);

// dq, dk, dv from dout and the forward's inputs and outputs (out and lse as the forward wrote
// them). `workspace` holds attention_backward_workspace_bytes(dims) bytes, 16-byte aligned;
// its contents are overwritten. Three kernels: the row dots, then dK and dV (one block per
// key tile, over the query tiles that see it), then dQ (one block per query tile).
template <class T>
void attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* out, const float* lse, T* dq,
                        T* dk, T* dv, void* workspace, const attention_dims& dims, stream_handle s);

}  // namespace loom::cuda
