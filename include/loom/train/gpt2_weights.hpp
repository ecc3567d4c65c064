#pragma once
// GPT-2 weights in and out of a one-device trainer: the file format and its mapping to loom's
// GPT are io/gpt2_weights.hpp; this is where a trainer's parameters meet it.
//
//   train::trainer<float> t(models::gpt(c).training_graph(), options);
//   train::load_gpt2_weights(t, c, "model.safetensors");   // then fine-tune
#include <cstddef>
#include <filesystem>
#include <string>
#include <type_traits>

#include <loom/core/error.hpp>
#include <loom/io/gpt2_weights.hpp>
#include <loom/models/gpt.hpp>
#include <loom/train/trainer.hpp>

namespace loom::train {

// Fine-tuning GPT-2 weights: copies a GPT-2 file into a one-device trainer built from `c`.
// (To train them under a plan, save a checkpoint of this trainer and load it under the
// plan: checkpoints reshard.)
template <class T>
void load_gpt2_weights(trainer<T>& t, const models::gpt_config& c, const std::filesystem::path& path) {
    for (const auto& [name, values] : io::read_gpt2_weights(path, c)) {
        auto dst = t.parameter(name);
        if (dst.size() != values.size())
            throw data_error("GPT-2 checkpoint '" + path.string() + "': tensor for '" + name + "' has " +
                             std::to_string(values.size()) + " elements but the model's has " + std::to_string(dst.size()) +
                             "; build the model with the file's dimensions");
        for (std::size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<T>(values[i]);
    }
}

// Exports a one-device trainer's weights as a GPT-2 file (the trainer's precision).
template <class T>
void save_gpt2_weights(trainer<T>& t, const models::gpt_config& c, const std::filesystem::path& path) {
    io::write_gpt2_weights(path, c, [&](const std::string& name) { return t.parameter(name); },
                       std::is_same_v<T, float> ? io::dtype::f32 : io::dtype::f64);
}

}  // namespace loom::train
