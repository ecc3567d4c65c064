#pragma once
// Seeded parameter initialisation. Element i of parameter "p" is a pure function of
// (seed, "p", i): a counter-based generator, so any slice of a parameter, initialised on
// whatever device holds it, equals the same slice of the whole parameter.
#include <cmath>
#include <cstdint>
#include <numbers>
#include <span>
#include <string_view>

#include <loom/core/linkage.hpp>
#include <loom/core/random.hpp>
#include <loom/graph/parameter_init.hpp>

namespace loom::train {

namespace detail {
inline constexpr std::uint64_t hash_name(std::string_view s) {
    std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
    for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
    return h;
}
// Uniform in (0, 1), never 0 (Box-Muller takes a log).
inline double unit_uniform(std::uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53; }
}  // namespace detail

// One value of the stream of parameter `name`: the i-th element.
LOOM_INLINE double init_value(const parameter_init& init, std::uint64_t seed, std::string_view name, std::uint64_t i);

// Fills `out` with elements [first, first + out.size()) of parameter `name`.
template <class T>
void initialize(std::span<T> out, const parameter_init& init, std::uint64_t seed, std::string_view name,
                std::uint64_t first = 0) {
    for (std::size_t j = 0; j < out.size(); ++j) out[j] = static_cast<T>(init_value(init, seed, name, first + j));
}

}  // namespace loom::train

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::train {

LOOM_INLINE double init_value(const parameter_init& init, std::uint64_t seed, std::string_view name, std::uint64_t i) {
    const std::uint64_t key = splitmix64(seed ^ splitmix64(detail::hash_name(name)));
    switch (init.distribution) {
        case parameter_init::kind::constant: return init.a;
        case parameter_init::kind::uniform: {
            double u = detail::unit_uniform(splitmix64(key + 2 * i));
            return init.a + (init.b - init.a) * u;
        }
        case parameter_init::kind::normal: {
            double u1 = detail::unit_uniform(splitmix64(key + 2 * i));
            double u2 = detail::unit_uniform(splitmix64(key + 2 * i + 1));
            double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
            return init.a + init.b * z;
        }
    }
    return 0.0;
}

}  // namespace loom::train
#endif  // LOOM_HEADER_DEFINITIONS
