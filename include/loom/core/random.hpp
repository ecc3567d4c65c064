#pragma once
// The one integer mixer behind every seeded stream in loom (parameter init, dropout masks,
// the corpus, the data loader's permutations): splitmix64. Fully specified, so every
// platform draws the same numbers, and counter-based, so element i of a stream can be
// computed without computing elements 0..i-1.
#include <cstdint>

namespace loom {

inline constexpr std::uint64_t golden_gamma = 0x9e3779b97f4a7c15ull;

// splitmix64's finalizer: a bijection on 64-bit integers with strong avalanche.
constexpr std::uint64_t finalize_mix(std::uint64_t z) noexcept {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// splitmix64(z): the finalizer of z + gamma; the output for counter value z.
constexpr std::uint64_t splitmix64(std::uint64_t z) noexcept { return finalize_mix(z + golden_gamma); }

}  // namespace loom
