// Definitions of <loom/runtime/cuda/region_copy.hpp>.
#include <cstdint>
#include <string>
#include <type_traits>

#include <loom/core/error.hpp>
#include <loom/runtime/cuda/region_copy.hpp>

#include "check.cuh"
#include "types.cuh"

namespace loom::cuda {
namespace {

constexpr unsigned threads = 256;

// The copy as the kernel sees it: the region's extents, and for each axis the stride of the
// source and destination pieces, with the region's origin folded into two base offsets.
struct region_layout {
    int rank = 0;
    std::int64_t extent[region_copy_max_rank] = {};
    std::int64_t src_stride[region_copy_max_rank] = {};
    std::int64_t dst_stride[region_copy_max_rank] = {};
    std::int64_t src_base = 0, dst_base = 0, total = 0;
};

// Where element i of the region (row-major over its extents) lies in the source and the
// destination piece.
__device__ __forceinline__ void offsets_of(std::int64_t i, const region_layout& layout, std::int64_t& from,
                                           std::int64_t& to) {
    from = layout.src_base;
    to = layout.dst_base;
    for (int a = layout.rank - 1; a >= 0; --a) {
        const std::int64_t at = i % layout.extent[a];
        i /= layout.extent[a];
        from += at * layout.src_stride[a];
        to += at * layout.dst_stride[a];
    }
}

// One thread per element of the region; consecutive threads take consecutive elements of
// the innermost axis, which is contiguous in both pieces (coalesced on both sides).
template <class E>
__global__ void copy_region_kernel(const E* __restrict__ src, E* __restrict__ dst, region_layout layout) {
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < layout.total;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        std::int64_t from, to;
        offsets_of(i, layout, from, to);
        dst[to] = src[from];
    }
}

// The same walk, adding: reals in float (one rounding per store), token ids as integers.
template <class E, class A>
__global__ void add_region_kernel(const E* __restrict__ src, A* __restrict__ dst, region_layout layout) {
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < layout.total;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        std::int64_t from, to;
        offsets_of(i, layout, from, to);
        if constexpr (std::is_same_v<A, std::int32_t>)
            dst[to] += src[from];
        else
            dst[to] = detail::from_float<A>(detail::to_float(dst[to]) + detail::to_float(src[from]));
    }
}

std::int64_t stride_below(const partition::box& b, std::size_t axis) {
    std::int64_t stride = 1;
    for (std::size_t a = axis + 1; a < b.rank(); ++a) stride *= b.ranges[a].size();
    return stride;
}

unsigned region_blocks(const region_layout& layout) {
    const std::int64_t wanted = (layout.total + threads - 1) / threads;
    return static_cast<unsigned>(wanted < 65535 * 8 ? wanted : 65535 * 8);
}

template <class E>
void launch(const void* src, void* dst, const region_layout& layout, stream_handle s) {
    copy_region_kernel<E><<<region_blocks(layout), threads, 0, s>>>(static_cast<const E*>(src), static_cast<E*>(dst),
                                                                     layout);
    LOOM_CUDA_CHECK_LAUNCH("copy_region");
}

// The checked layout of a region move (`fn` names the caller in errors, `verb` what it does).
region_layout layout_of(const char* fn, const char* verb, const partition::box& src_box, const partition::box& dst_box,
                        const partition::box& region) {
    const std::size_t rank = region.rank();
    if (rank > region_copy_max_rank)
        throw usage_error(std::string(fn) + ": a region of rank " + std::to_string(rank) + " is above the " +
                          std::to_string(region_copy_max_rank) + " axes the kernel handles");
    if (src_box.rank() != rank || dst_box.rank() != rank)
        throw usage_error(std::string(fn) + ": region " + region.to_string() + ", source " + src_box.to_string() +
                          " and destination " + dst_box.to_string() + " differ in rank; pass boxes of one tensor");
    for (std::size_t a = 0; a < rank; ++a) {
        const auto& r = region.ranges[a];
        if (r.size() > 0 && (r.begin < src_box.ranges[a].begin || r.end > src_box.ranges[a].end ||
                             r.begin < dst_box.ranges[a].begin || r.end > dst_box.ranges[a].end))
            throw usage_error(std::string(fn) + ": region " + region.to_string() + " is not inside source " +
                              src_box.to_string() + " and destination " + dst_box.to_string() +
                              "; " + verb + " only the intersection");
    }
    region_layout layout;
    layout.rank = static_cast<int>(rank);
    layout.total = 1;
    for (std::size_t a = 0; a < rank; ++a) {
        layout.extent[a] = region.ranges[a].size();
        layout.src_stride[a] = stride_below(src_box, a);
        layout.dst_stride[a] = stride_below(dst_box, a);
        layout.src_base += (region.ranges[a].begin - src_box.ranges[a].begin) * layout.src_stride[a];
        layout.dst_base += (region.ranges[a].begin - dst_box.ranges[a].begin) * layout.dst_stride[a];
        layout.total *= layout.extent[a];
    }
    // An empty range on two axes would multiply to a positive count.
    for (std::size_t a = 0; a < rank; ++a)
        if (layout.extent[a] <= 0) layout.total = 0;
    return layout;
}

}  // namespace

void copy_region(const void* src, const partition::box& src_box, void* dst, const partition::box& dst_box,
                 const partition::box& region, std::size_t element_bytes, stream_handle s) {
    const region_layout layout = layout_of("cuda::copy_region", "copy", src_box, dst_box, region);
    if (layout.total <= 0) return;
    switch (element_bytes) {
        case 1: return launch<std::uint8_t>(src, dst, layout, s);
        case 2: return launch<std::uint16_t>(src, dst, layout, s);
        case 4: return launch<std::uint32_t>(src, dst, layout, s);
        case 8: return launch<std::uint64_t>(src, dst, layout, s);
        default:
            throw usage_error("cuda::copy_region: elements of " + std::to_string(element_bytes) +
                              " bytes; pass 1, 2, 4 or 8");
    }
}

template <class E, class A>
void add_region(const E* src, const partition::box& src_box, A* dst, const partition::box& dst_box,
                const partition::box& region, stream_handle s) {
    const region_layout layout = layout_of("cuda::add_region", "add", src_box, dst_box, region);
    if (layout.total <= 0) return;
    using DE = detail::device_t<E>;
    using DA = detail::device_t<A>;
    add_region_kernel<DE, DA><<<region_blocks(layout), threads, 0, s>>>(detail::device_ptr(src), detail::device_ptr(dst),
                                                                        layout);
    LOOM_CUDA_CHECK_LAUNCH("add_region");
}

template void add_region<float, float>(const float*, const partition::box&, float*, const partition::box&,
                                       const partition::box&, stream_handle);
template void add_region<bfloat16, bfloat16>(const bfloat16*, const partition::box&, bfloat16*, const partition::box&,
                                             const partition::box&, stream_handle);
template void add_region<bfloat16, float>(const bfloat16*, const partition::box&, float*, const partition::box&,
                                          const partition::box&, stream_handle);
template void add_region<std::int32_t, std::int32_t>(const std::int32_t*, const partition::box&, std::int32_t*,
                                                     const partition::box&, const partition::box&, stream_handle);

}  // namespace loom::cuda
