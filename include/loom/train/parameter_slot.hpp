#pragma once
// What an optimizer updates: one parameter's values and its gradient, by name.
#include <span>
#include <string>

namespace loom::train {

template <class T>
struct parameter_slot {
    std::string name;
    std::span<T> value;
    std::span<const T> grad;
    bool weight_decay = true;  // GPT-2 practice: decay matrices, not biases, norms or gains
};

}  // namespace loom::train
