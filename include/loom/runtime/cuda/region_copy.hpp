#pragma once
// Box-shaped copies between pieces of one logical tensor in device memory: the GPU's
// partition::copy_region (partition/region_copy.hpp, its host twin), the primitive behind
// packing and unpacking the buffers of collectives. A piece holds the elements of its box,
// row-major; the region must lie inside both pieces. Elements are moved as bits, so one
// kernel serves every element type of a given size. add_region sums instead (partial values
// of one box, the assemble op's accumulate), and so needs the element type.
#include <cstddef>
#include <cstdint>

#include <loom/core/bfloat16.hpp>
#include <loom/partition/vtensor.hpp>
#include <loom/runtime/cuda/device.hpp>

namespace loom::cuda {

// The largest rank a region copy handles (loom's tensors have at most 6 dims).
inline constexpr std::size_t region_copy_max_rank = 8;

// Copies `region` from the piece at `src` (box src_box) to the piece at `dst` (box dst_box).
// element_bytes: 1, 2, 4 or 8. Queued on `s`; an empty region queues nothing.
void copy_region(const void* src, const partition::box& src_box, void* dst, const partition::box& dst_box,
                 const partition::box& region, std::size_t element_bytes, stream_handle s);

// dst += src over `region`, the twin of partition::add_region. Real elements are added in
// float and rounded once on the store, so a bf16 dst is rounded once per call; to sum several
// bf16 pieces with one rounding, add them into a float dst (A = float, E = bfloat16) and cast
// at the end. Pairs (E, A): (float, float), (bfloat16, bfloat16), (bfloat16, float) and
// (int32, int32) (token ids, added as integers as on the host). Each element is read and
// written by one thread: deterministic. Queued on `s`; an empty region queues nothing.
template <class E, class A>
void add_region(const E* src, const partition::box& src_box, A* dst, const partition::box& dst_box,
                const partition::box& region, stream_handle s);

}  // namespace loom::cuda
