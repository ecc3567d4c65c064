#pragma once
// Embedding lookup and its gradient: the CUDA kernels of ops::embedding and
// ops::embedding_grad, with the ops' semantics. The table [rows, cols] holds the vocabulary
// rows [row_offset, row_offset + rows) of a vocabulary of `vocab` ids (row_offset 0 and rows
// = vocab unless the vocabulary is split): an id in that range reads row id - row_offset,
// any other id gives a zero row (vocabulary parallelism: the pieces' outputs sum to the full
// lookup). ids: [positions] int32, device memory. T is float or loom::bfloat16. Host twin:
// runtime/host/kernels/embedding.hpp.
//
// An id outside [0, vocab) is a data error. The host kernel throws; a kernel cannot, so here
// such an id gives a zero row (forward) and adds nothing (backward), and, when `invalid_id`
// is not null, the device int it points to is set to 1. The caller zeroes it before and
// reads it when it chooses (one copy and a synchronisation), then finds the position on the
// host (the host kernel's check names it).
#include <cstddef>
#include <cstdint>

#include <loom/core/bfloat16.hpp>
#include <loom/runtime/cuda/device.hpp>

namespace loom::cuda {

// out[p, :] = table[ids[p] - row_offset, :], or zeros when the id is not a row of the table.
template <class T>
void embedding_forward(const std::int32_t* ids, const T* table, T* out, std::int64_t positions, std::int64_t rows,
                       std::int64_t cols, std::int64_t vocab, std::int64_t row_offset, int* invalid_id,
                       stream_handle s);

// Workspace of embedding_backward: the (row, position) pairs twice over and the radix
// sort's temporary storage. Asks CUB for the sort's size, so it needs the device (no work
// is launched).
std::size_t embedding_backward_workspace_bytes(std::int64_t positions, std::int64_t rows);

// dtable[r, :] = sum of dy[p, :] over the positions p whose id is row r of the table, in
// increasing p (the host kernel's order: float results are bit-identical to it), summed in
// float and rounded once; rows no id reaches are zero. Deterministic without atomics: a
// stable radix sort of (row, position) pairs groups each row's positions in order, then one
// block per row sums them. dtable is overwritten. positions < 2^31.
template <class T>
void embedding_backward(const T* dy, const std::int32_t* ids, T* dtable, std::int64_t positions, std::int64_t rows,
                        std::int64_t cols, std::int64_t vocab, std::int64_t row_offset, void* workspace,
                        int* invalid_id, stream_handle s);

}  // namespace loom::cuda
