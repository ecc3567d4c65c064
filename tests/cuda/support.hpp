#pragma once
// What the CUDA tests share: random host data, round trips to the device, and comparison
// with a host twin under a stated tolerance.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <catch2/catch.hpp>

#include <loom/core/bfloat16.hpp>
#include <loom/runtime/cuda/device.hpp>

namespace loom::cuda_test {

// Uniform in [lo, hi), rounded to T (so the twin sees exactly what the device sees).
template <class T>
std::vector<T> random_vector(std::size_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<T> v(n);
    for (auto& x : v) x = T(u(rng));
    return v;
}

template <class T>
std::vector<float> widen(const std::vector<T>& v) {
    std::vector<float> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(v[i]);
    return out;
}

// A device copy of a host vector, and back.
template <class T>
struct device_vector {
    cuda::device_buffer buffer;
    std::size_t size = 0;

    device_vector() = default;
    explicit device_vector(std::size_t n) : buffer(n * sizeof(T)), size(n) { cuda::fill_zero(buffer.get(), n * sizeof(T)); }
    explicit device_vector(const std::vector<T>& host) : buffer(host.size() * sizeof(T)), size(host.size()) {
        cuda::copy_to_device(buffer.get(), host.data(), host.size() * sizeof(T));
    }
    T* get() const { return buffer.as<T>(); }
    std::vector<T> download() const {
        std::vector<T> host(size);
        cuda::copy_to_host(host.data(), buffer.get(), size * sizeof(T));
        cuda::synchronize_device();
        return host;
    }
};

// A device copy of `host` starting `offset` elements into its buffer (offset 1 makes every
// row pointer misaligned for 16-byte vectors, which the kernels must handle).
template <class T>
struct placed {
    device_vector<T> storage;
    std::size_t offset, size;
    placed(const std::vector<T>& host, std::size_t offset_)
        : storage(host.size() + offset_), offset(offset_), size(host.size()) {
        cuda::copy_to_device(storage.get() + offset, host.data(), host.size() * sizeof(T));
    }
    placed(std::size_t n, std::size_t offset_) : storage(n + offset_), offset(offset_), size(n) {}
    T* get() const { return storage.get() + offset; }
    std::vector<T> download() const {
        const auto all = storage.download();
        return {all.begin() + static_cast<std::ptrdiff_t>(offset), all.end()};
    }
};

// |got - want| <= abs_tol + rel_tol * |want| for every element; reports the worst one.
template <class T>
void require_close(const std::vector<T>& got, const std::vector<float>& want, double rel_tol, double abs_tol,
                   const std::string& what) {
    REQUIRE(got.size() == want.size());
    double worst = 0;
    std::size_t worst_at = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        const double g = static_cast<float>(got[i]), w = want[i];
        if (!std::isfinite(g)) {
            INFO(what << ": element " << i << " is " << g << ", want " << w);
            REQUIRE(std::isfinite(g));
        }
        const double excess = std::fabs(g - w) - (abs_tol + rel_tol * std::fabs(w));
        if (excess > worst) {
            worst = excess;
            worst_at = i;
        }
    }
    INFO(what << ": worst element " << worst_at << " got " << static_cast<float>(got[worst_at]) << " want "
              << want[worst_at] << " (rel_tol " << rel_tol << ", abs_tol " << abs_tol << ")");
    CHECK(worst == 0.0);
}

// What storing a float result in T leaves of it: the twins round where the kernels store.
template <class T>
float stored(float value) {
    if constexpr (std::is_same_v<T, loom::bfloat16>) return round_to_bfloat16(value);
    else return value;
}
template <class T>
std::vector<float> stored(std::vector<float> v) {
    for (auto& x : v) x = stored<T>(x);
    return v;
}

// One bf16 rounding step relative to the value: the tolerance of a result rounded once.
inline constexpr double bf16_ulp = 1.0 / 128;

}  // namespace loom::cuda_test
