#pragma once
// How a parameter is initialised. The values themselves are drawn by train/init.hpp from a
// counter-based generator keyed by (seed, parameter name, element index), so any slice of
// a parameter can be initialised on its own and equals the same slice of the whole.
#include <cstdint>
#include <string>

namespace loom {

struct parameter_init {
    enum class kind : std::uint8_t { normal, uniform, constant };
    kind distribution = kind::normal;
    double a = 0.0;  // normal: mean; uniform: low; constant: value
    double b = 0.02; // normal: standard deviation; uniform: high

    static parameter_init normal(double stddev, double mean = 0.0) { return {kind::normal, mean, stddev}; }
    static parameter_init uniform(double low, double high) { return {kind::uniform, low, high}; }
    static parameter_init constant(double value) { return {kind::constant, value, 0.0}; }
    static parameter_init zeros() { return constant(0.0); }
    static parameter_init ones() { return constant(1.0); }

    std::string to_string() const {
        switch (distribution) {
            case kind::normal: return "normal(" + std::to_string(a) + ", " + std::to_string(b) + ")";
            case kind::uniform: return "uniform(" + std::to_string(a) + ", " + std::to_string(b) + ")";
            case kind::constant: return "constant(" + std::to_string(a) + ")";
        }
        return "?";
    }
};

}  // namespace loom
