#pragma once
// Central differences of a whole model's loss against the trainer's analytic gradients,
// float64, for about `samples` elements spread over every parameter. Returns how many
// elements it compared; each comparison is a Catch2 CHECK.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include <loom/train/trainer.hpp>

namespace loom::testing {

inline int check_model_gradients(train::trainer<double>& t, const train::input_feed& feed, std::size_t samples = 5) {
    t.evaluate(feed);
    std::vector<std::string> names;
    for (tensor_id p : t.ir().parameters) names.push_back(t.ir().tensor(p).name);
    std::map<std::string, std::vector<double>> analytic;
    for (const auto& n : names) analytic[n].assign(t.gradient(n).begin(), t.gradient(n).end());
    const double h = 1e-6;
    int checked = 0;
    for (const auto& n : names) {
        auto x = t.parameter(n);
        for (std::size_t j = 0; j < x.size(); j += 1 + x.size() / samples) {
            const double saved = x[j];
            x[j] = saved + h;
            const double up = t.evaluate(feed);
            x[j] = saved - h;
            const double down = t.evaluate(feed);
            x[j] = saved;
            const double numeric = (up - down) / (2 * h);
            INFO("parameter " << n << " element " << j);
            CHECK(analytic[n][j] == Approx(numeric).epsilon(1e-6).margin(1e-9));
            ++checked;
        }
    }
    return checked;
}

}  // namespace loom::testing
