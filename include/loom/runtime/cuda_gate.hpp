#pragma once
// The one place that looks at LOOM_HAS_CUDA. Linking loom::cuda (built only where CMake
// finds the CUDA toolkit) defines it; everything else asks `has_cuda` and branches with
// `if constexpr`, so code that may run on either backend compiles the same way in both
// configurations. Without loom::cuda, device_count() is 0 and nothing else of the CUDA
// backend can be reached.
#include <loom/core/error.hpp>

#if defined(LOOM_HAS_CUDA) && LOOM_HAS_CUDA
#include <loom/runtime/cuda/device.hpp>
#endif

namespace loom {

#if defined(LOOM_HAS_CUDA) && LOOM_HAS_CUDA
inline constexpr bool has_cuda = true;
// GPUs this process can use (0 on a machine without a GPU or driver).
inline int cuda_device_count() { return cuda::device_count(); }
#else
inline constexpr bool has_cuda = false;
inline int cuda_device_count() { return 0; }
#endif

}  // namespace loom
