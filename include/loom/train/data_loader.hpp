#pragma once
// data_loader: next-token-prediction batches from one token sequence.
//
// A window is seq + 1 consecutive tokens starting at any position w in
// [0, tokens - seq): its first seq tokens are the inputs, its last seq the targets, so
//   targets[b * seq + i] == inputs[b * seq + i + 1]   for i + 1 < seq
//   targets[b * seq + seq - 1] == tokens[w + seq].
// An epoch visits every window start exactly once: in order 0, 1, 2, ... when shuffle is
// off, in a seeded pseudo-random order that is a different permutation each epoch when it
// is on. Batches run on across epoch boundaries, so no window is dropped.
//
// The order is a keyed Feistel permutation of the window index (own implementation, only
// 64-bit integer arithmetic), so it needs no memory per window and the same (tokens,
// options) give the same batches on every platform. The whole position in the stream is
// data_loader_state, five integers: save state() in a checkpoint and restore() it to
// continue with exactly the batches the first run would have drawn next.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <loom/core/random.hpp>
#include <loom/core/error.hpp>
#include <loom/train/token_file.hpp>

namespace loom::train {

struct data_loader_options {
    std::int64_t batch = 1;
    std::int64_t seq = 1;
    std::uint64_t seed = 0;
    bool shuffle = true;
};

// Row-major [batch, seq] token ids.
struct batch {
    std::vector<std::int32_t> inputs;
    std::vector<std::int32_t> targets;
    std::int64_t batch = 0;
    std::int64_t seq = 0;
};

// Where a data_loader is in its stream; all fields are plain integers so a checkpoint can
// store them anywhere. window_count and shuffle identify the stream and are checked on
// restore; seed, epoch and cursor are adopted.
struct data_loader_state {
    std::uint64_t seed = 0;
    std::uint64_t epoch = 0;         // completed epochs
    std::uint64_t cursor = 0;        // windows already drawn in the current epoch
    std::uint64_t window_count = 0;  // windows per epoch: tokens - seq
    std::uint64_t shuffle = 0;       // 1 when windows are shuffled, else 0

    friend bool operator==(const data_loader_state&, const data_loader_state&) = default;
};

namespace detail {

// A permutation of [0, n) chosen by `key`. A balanced Feistel network permutes
// [0, 2^bits) with 2^bits < 4n; values that land at or above n are sent through again
// ("cycle walking"), which stays inside the cycle of the start value and so ends at a
// value below n, after fewer than 4 rounds on average.
class feistel_permutation {
public:
    constexpr feistel_permutation(std::uint64_t n, std::uint64_t key) noexcept : n_(n), key_(key) {
        while (half_bits_ < 32 && (std::uint64_t{1} << (2 * half_bits_)) < n_) ++half_bits_;
        mask_ = (std::uint64_t{1} << half_bits_) - 1;
    }

    constexpr std::uint64_t operator()(std::uint64_t index) const noexcept {
        if (n_ <= 1) return 0;
        std::uint64_t x = index;
        do {
            x = encrypt(x);
        } while (x >= n_);
        return x;
    }

private:
    static constexpr int rounds = 6;

    constexpr std::uint64_t encrypt(std::uint64_t x) const noexcept {
        std::uint64_t left = x >> half_bits_, right = x & mask_;
        for (int r = 0; r < rounds; ++r) {
            const std::uint64_t next = left ^ (splitmix64(key_ ^ splitmix64(right + 0x100000001b3ULL * static_cast<std::uint64_t>(r))) & mask_);
            left = right;
            right = next;
        }
        return (left << half_bits_) | right;
    }

    std::uint64_t n_;
    std::uint64_t key_;
    int half_bits_ = 1;
    std::uint64_t mask_ = 1;
};

}  // namespace detail

class data_loader {
public:
    // Copies the tokens.
    data_loader(std::span<const std::int32_t> tokens, data_loader_options options)
        : data_loader(std::make_shared<const std::vector<std::int32_t>>(tokens.begin(), tokens.end()), options) {}

    data_loader(std::vector<std::int32_t> tokens, data_loader_options options)
        : data_loader(std::make_shared<const std::vector<std::int32_t>>(std::move(tokens)), options) {}

    // Shares the file's tokens; no copy.
    data_loader(const token_file& file, data_loader_options options) : data_loader(file.shared_tokens(), options) {}

    data_loader(std::shared_ptr<const std::vector<std::int32_t>> tokens, data_loader_options options)
        : tokens_(std::move(tokens)), options_(options) {
        if (!tokens_) throw usage_error("data_loader: the token pointer is null; pass a token sequence");
        if (options_.batch < 1 || options_.seq < 1) {
            throw usage_error("data_loader: batch " + std::to_string(options_.batch) + " and seq " +
                              std::to_string(options_.seq) + " must both be at least 1");
        }
        const auto needed = static_cast<std::uint64_t>(options_.seq) + 1;
        if (tokens_->size() < needed) {
            throw data_error("data_loader: " + std::to_string(tokens_->size()) + " tokens are too few for one window of seq " +
                             std::to_string(options_.seq) + ", which needs " + std::to_string(needed) +
                             " tokens (seq inputs plus one target); use more data or a shorter seq");
        }
        window_count_ = tokens_->size() - static_cast<std::uint64_t>(options_.seq);
    }

    const data_loader_options& options() const noexcept { return options_; }
    std::uint64_t windows_per_epoch() const noexcept { return window_count_; }
    std::uint64_t epoch() const noexcept { return epoch_; }
    std::span<const std::int32_t> tokens() const noexcept { return *tokens_; }

    // The start position of the index-th window of an epoch.
    std::uint64_t window_start(std::uint64_t epoch, std::uint64_t index) const noexcept {
        if (!options_.shuffle) return index;
        return detail::feistel_permutation(window_count_, splitmix64(options_.seed ^ splitmix64(epoch)))(index);
    }

    batch next() {
        const auto rows = static_cast<std::size_t>(options_.batch);
        const auto seq = static_cast<std::size_t>(options_.seq);
        batch out{std::vector<std::int32_t>(rows * seq), std::vector<std::int32_t>(rows * seq), options_.batch, options_.seq};
        const std::int32_t* data = tokens_->data();
        for (std::size_t b = 0; b < rows; ++b) {
            const std::uint64_t start = window_start(epoch_, cursor_);
            for (std::size_t i = 0; i < seq; ++i) {
                out.inputs[b * seq + i] = data[start + i];
                out.targets[b * seq + i] = data[start + i + 1];
            }
            if (++cursor_ == window_count_) {
                cursor_ = 0;
                ++epoch_;
            }
        }
        return out;
    }

    data_loader_state state() const noexcept {
        return {options_.seed, epoch_, cursor_, window_count_, options_.shuffle ? 1U : 0U};
    }

    // Continues the stream `saved` came from. Throws loom::usage_error when it belongs to a
    // different stream (other token count or seq, other shuffle setting) or is corrupt.
    void restore(const data_loader_state& saved) {
        if (saved.window_count != window_count_) {
            throw usage_error("data_loader::restore: the saved state has " + std::to_string(saved.window_count) +
                              " windows per epoch but this loader has " + std::to_string(window_count_) +
                              " (tokens - seq); restore with the same token sequence and seq that produced the state");
        }
        if (saved.shuffle != (options_.shuffle ? 1U : 0U)) {
            throw usage_error("data_loader::restore: the saved state has shuffle " + std::to_string(saved.shuffle) +
                              " but this loader has shuffle " + std::string(options_.shuffle ? "1" : "0") +
                              "; construct the loader with the shuffle setting of the run that saved the state");
        }
        if (saved.cursor >= window_count_) {
            throw usage_error("data_loader::restore: the saved cursor " + std::to_string(saved.cursor) +
                              " is not below the " + std::to_string(window_count_) +
                              " windows per epoch; the saved state is corrupt");
        }
        options_.seed = saved.seed;
        epoch_ = saved.epoch;
        cursor_ = saved.cursor;
    }

private:
    std::shared_ptr<const std::vector<std::int32_t>> tokens_;
    data_loader_options options_;
    std::uint64_t window_count_ = 0;
    std::uint64_t epoch_ = 0;
    std::uint64_t cursor_ = 0;
};

}  // namespace loom::train
