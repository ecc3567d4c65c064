#pragma once
// The CUDA kernels of the vocabulary-parallel cross-entropy ops (ops/vocab_parallel_cross_entropy.hpp),
// with the ops' semantics. With `chunks` contiguous chunks of `v` logits per position:
//
//   chunk_logsumexp                    lse[p, k] = logsumexp(logits[p, k v : (k + 1) v])
//   chunk_logsumexp_backward           dlogits[p, k v + i] = dlse[p, k] exp(logits[p, k v + i] - lse[p, k])
//   pick_target                        z[p] = logits[p, targets[p] - row_offset], 0 where not held or ignored
//   pick_target_backward               dlogits[p, :] = dz[p] at that column, 0 elsewhere
//   cross_entropy_from_chunks          loss = sum over kept p of (logsumexp_k lse[p, k] - z[p]) / normalizer
//   cross_entropy_from_chunks_backward dlse[p, k] = s softmax_k(lse[p, :]), dz[p] = -s, s = dloss / normalizer
//
// a position kept unless targets[p] == ignore_index (its gradients are zero). The ragged
// twins, for a vocabulary cut into chunks of unequal sizes (chunk k: vocabulary columns
// [b_k, b_k+1)), on logits [rows, v] that hold columns [row_offset, row_offset + v):
//
//   ragged_chunk_logsumexp             lse[p, k] = logsumexp(logits[p, chunk k]), 0 for a chunk not held
//   ragged_chunk_logsumexp_backward    dlogits[p, j] = dlse[p, k] exp(logits[p, j] - lse[p, k]), j in chunk k
//
// The logits hold whole chunks, a run of them (the op checks it when a node is built). T is float or
// loom::bfloat16; arithmetic in float, the loss summed over positions in double (as the host
// kernels), T results rounded once. The log-sum-exps (lse) and the loss are float whatever T:
// the ops keep them in float (float_outputs), since the loss is rebuilt from the lse of every
// rank and a bf16 lse would carry its 3 digits into it. Host twins:
// runtime/host/kernels/vocab_parallel_cross_entropy.hpp. Every sum runs in a fixed order:
// bit-identical results run to run for the same inputs at the same addresses.
//
// Arrays are dense row-major in device memory, at any alignment; targets are int32. A
// target outside [0, vocab) that is not ignore_index is a data error, which the host kernels
// throw; a kernel cannot, so pick_target writes NaN there and pick_target_backward a row of
// NaN (the error cannot pass unnoticed into a model; the host kernels name the position).
#include <cstdint>

#include <loom/core/bfloat16.hpp>
#include <loom/runtime/cuda/device.hpp>

namespace loom::cuda {

// logits [rows, chunks * v] -> lse [rows, chunks]: one pass over each chunk (an online max and
// sum).
template <class T>
void chunk_logsumexp(const T* logits, float* lse, std::int64_t rows, std::int64_t chunks, std::int64_t v,
                     stream_handle s);

// (dlse [rows, chunks], logits [rows, chunks * v], lse [rows, chunks]) -> dlogits [rows, chunks * v].
// dlogits may be logits itself (in place); nothing else may overlap.
template <class T>
void chunk_logsumexp_backward(const T* dlse, const T* logits, const float* lse, T* dlogits, std::int64_t rows,
                              std::int64_t chunks, std::int64_t v, stream_handle s);

// logits [rows, v] -> lse [rows, chunks], with `boundaries` the chunks + 1 bounds of the
// chunks (a host array): one launch per chunk the logits hold, and one for the zeros.
template <class T>
void ragged_chunk_logsumexp(const T* logits, float* lse, std::int64_t rows, std::int64_t v,
                            const std::int64_t* boundaries, std::int64_t chunks, std::int64_t row_offset,
                            stream_handle s);

// (dlse [rows, chunks], logits [rows, v], lse [rows, chunks]) -> dlogits [rows, v]: one launch
// per chunk the logits hold. dlogits may be logits itself (in place); nothing else may overlap.
template <class T>
void ragged_chunk_logsumexp_backward(const T* dlse, const T* logits, const float* lse, T* dlogits, std::int64_t rows,
                                     std::int64_t v, const std::int64_t* boundaries, std::int64_t chunks,
                                     std::int64_t row_offset, stream_handle s);

// (logits [rows, v], targets [rows]) -> z [rows]; this piece holds vocabulary rows
// [row_offset, row_offset + v) of `vocab`.
template <class T>
void pick_target(const T* logits, const std::int32_t* targets, T* z, std::int64_t rows, std::int64_t v,
                 std::int64_t vocab, std::int64_t row_offset, std::int64_t ignore_index, stream_handle s);

// (dz [rows], targets [rows]) -> dlogits [rows, v], the same pieces as pick_target.
template <class T>
void pick_target_backward(const T* dz, const std::int32_t* targets, T* dlogits, std::int64_t rows, std::int64_t v,
                          std::int64_t vocab, std::int64_t row_offset, std::int64_t ignore_index, stream_handle s);

// (lse [rows, chunks], z [rows], targets [rows]) -> loss (a device float scalar). One block
// sums the positions. normalizer > 0 and finite.
template <class T>
void cross_entropy_from_chunks(const float* lse, const T* z, const std::int32_t* targets, float* loss,
                               std::int64_t rows, std::int64_t chunks, std::int64_t ignore_index, double normalizer,
                               stream_handle s);

// (dloss (a device scalar), lse [rows, chunks], targets [rows]) -> (dlse [rows, chunks], dz [rows]).
template <class T>
void cross_entropy_from_chunks_backward(const T* dloss, const float* lse, const std::int32_t* targets, T* dlse, T* dz,
                                        std::int64_t rows, std::int64_t chunks, std::int64_t ignore_index,
                                        double normalizer, stream_handle s);

}  // namespace loom::cuda
