#pragma once
// Cross-entropy fused with the softmax over the vocabulary: the CUDA kernels of
// ops::cross_entropy and ops::cross_entropy_grad, with the ops' semantics:
//   loss = sum over kept rows r of (logsumexp(logits[r, :]) - logits[r, targets[r]]) / normalizer
//   dlogits[r, :] = dloss * (softmax(logits[r, :]) - onehot(targets[r])) / normalizer,
// a row kept unless targets[r] == ignore_index (its gradient row is zero). The normalizer is
// the op's attribute (by default the number of rows of the whole batch, ignored ones
// included): no division by the kept count here. T is float or loom::bfloat16; arithmetic
// in float, the loss summed over rows in double (as the host kernel), bf16 results rounded
// once. Host twin: runtime/host/kernels/cross_entropy.hpp. Every sum runs in a fixed order:
// bit-identical results run to run for the same inputs at the same addresses.
//
// logits: [rows, vocab] row-major, any vocab (50257 included; rows need no alignment: each
// row is read with 16-byte vectors from its first 16-byte boundary on). targets: [rows]
// int32, device memory.
//
// A target outside [0, vocab) that is not ignore_index is a data error. The host kernel
// throws; a kernel cannot, so here the row's loss and its gradient row are NaN (the error
// cannot pass unnoticed into a model) and, when `invalid_target` is not null, the device int
// it points to is set to 1. The caller zeroes it before and reads it when it chooses (one
// copy and a synchronisation), then finds the position on the host (the host kernel's
// check names it).
#include <cstdint>

#include <loom/core/bfloat16.hpp>
#include <loom/runtime/cuda/device.hpp>

namespace loom::cuda {

// loss (device float scalar, whatever T: the op keeps its loss in float) as the op; row_loss [rows] (float) gets each row's unnormalised term,
// 0 for an ignored row; logsumexp [rows] (float) is written when not null, for every row:
// what a caller may keep for cross_entropy_backward. One pass over each row's logits (an
// online max and sum), then one block sums the rows. normalizer > 0 and finite.
template <class T>
void cross_entropy_forward(const T* logits, const std::int32_t* targets, float* loss, float* row_loss, float* logsumexp,
                           std::int64_t rows, std::int64_t vocab, std::int64_t ignore_index, double normalizer,
                           int* invalid_target, stream_handle s);

// dlogits = (softmax(logits) - onehot(target)) * (dloss / normalizer) per kept row, zero rows
// where the target is ignore_index; dloss is a device scalar (the loss's gradient). dlogits
// may be logits itself (in place), nothing else may overlap. logsumexp: the forward's (one
// pass over the logits), or null to recompute it (two passes).
template <class T>
void cross_entropy_backward(const T* dloss, const T* logits, const std::int32_t* targets, const float* logsumexp,
                            T* dlogits, std::int64_t rows, std::int64_t vocab, std::int64_t ignore_index,
                            double normalizer, int* invalid_target, stream_handle s);

}  // namespace loom::cuda
