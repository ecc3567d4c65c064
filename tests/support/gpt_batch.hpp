#pragma once
// A deterministic GPT batch for step s: tokens and targets from a seeded stream, for tests
// that train the same model on several backends or plans and compare them step by step.
#include <cstdint>
#include <vector>

#include <loom/core/random.hpp>
#include <loom/models/gpt.hpp>
#include <loom/train/trainer.hpp>

namespace loom::testing {

// `keep` owns the vectors the feed refers to; it must outlive the feed.
inline train::input_feed gpt_batch(const models::gpt_config& c, int s, std::vector<std::vector<std::int32_t>>& keep) {
    const auto n = static_cast<std::size_t>(c.batch * c.seq);
    std::vector<std::int32_t> tokens(n), targets(n);
    for (std::size_t i = 0; i < n; ++i) {
        tokens[i] = static_cast<std::int32_t>(finalize_mix(0x5eedULL + static_cast<std::uint64_t>(s) * 1000003ULL + i) %
                                              static_cast<std::uint64_t>(c.vocab));
        targets[i] = static_cast<std::int32_t>(finalize_mix(0x7a46ULL + static_cast<std::uint64_t>(s) * 7919ULL + i) %
                                               static_cast<std::uint64_t>(c.vocab));
    }
    keep.push_back(std::move(tokens));
    keep.push_back(std::move(targets));
    keep.push_back(models::gpt_positions(c));
    train::input_feed f;
    f.index["tokens"] = keep[keep.size() - 3];
    f.index["targets"] = keep[keep.size() - 2];
    f.index["positions"] = keep[keep.size() - 1];
    return f;
}

}  // namespace loom::testing
