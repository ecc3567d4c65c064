#pragma once
// Per-node attributes: the few scalars an op needs beyond its inputs (a scale factor, an
// epsilon, a dropout seed, a head count). Kept as named values so that plans, traces and
// plan files can print and store them without knowing every op.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <loom/core/error.hpp>

namespace loom {

using attribute_value = std::variant<std::int64_t, double, std::string, std::vector<std::int64_t>>;

class attributes {
public:
    attributes() = default;
    attributes(std::initializer_list<std::pair<std::string, attribute_value>> items) : items_(items) {}

    attributes& set(std::string_view key, attribute_value value) {
        for (auto& [k, v] : items_)
            if (k == key) {
                v = std::move(value);
                return *this;
            }
        items_.emplace_back(std::string(key), std::move(value));
        return *this;
    }

    bool has(std::string_view key) const { return find(key) != nullptr; }

    template <class T>
    T get(std::string_view key) const {
        const attribute_value* v = find(key);
        if (!v) throw usage_error("attributes: no attribute '" + std::string(key) + "'; the op's builder must set it");
        if constexpr (std::is_same_v<T, double>) {
            if (auto* i = std::get_if<std::int64_t>(v)) return static_cast<double>(*i);
        }
        if (auto* t = std::get_if<T>(v)) return *t;
        throw usage_error("attributes: attribute '" + std::string(key) + "' has another type than requested");
    }

    template <class T>
    T get_or(std::string_view key, T fallback) const {
        return has(key) ? get<T>(key) : fallback;
    }

    const std::vector<std::pair<std::string, attribute_value>>& items() const { return items_; }

    friend bool operator==(const attributes&, const attributes&) = default;

private:
    const attribute_value* find(std::string_view key) const {
        for (const auto& [k, v] : items_)
            if (k == key) return &v;
        return nullptr;
    }
    std::vector<std::pair<std::string, attribute_value>> items_;
};

}  // namespace loom
