#pragma once
// Runs a plan on N in-process ranks and the same model on one device, step by step, and
// reports how far apart they are: loss and gradient norm at every step, on every rank, and
// every parameter after training (gathered from the ranks' pieces).
#include <algorithm>
#include <functional>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <loom/core/random.hpp>
#include <loom/models/gpt.hpp>
#include <loom/partition/apply.hpp>
#include <loom/runtime/comm/in_process.hpp>
#include <loom/train/distributed_trainer.hpp>
#include <loom/train/trainer.hpp>

#include "gpt_batch.hpp"

namespace loom::testing {

struct equivalence {
    double loss = 0;       // worst relative difference of the loss over steps and ranks
    double grad_norm = 0;  // same for the gradient norm
    // Worst difference of a parameter element after training, relative to the parameter's
    // largest element or 0.01, whichever is larger: a parameter whose gradient is zero in
    // exact arithmetic (the key bias under softmax) moves by rounding noise only, which
    // Adam scales up, so its own size is no yardstick.
    double parameters = 0;
    std::string worst_parameter;
    std::size_t transfers = 0;
};

inline double relative(double a, double b) { return std::abs(a - b) / std::max({std::abs(a), std::abs(b), 1e-300}); }

// `plan`: anything partition::apply_plan takes (a plan value, a composed plan, a resolved
// plan), applied to `forward`; `training` is the same model's training graph, trained on one
// device with the same feeds.
template <class T, class Plan>
equivalence compare_on_model(const graph& forward, graph training, const std::vector<train::input_feed>& feeds,
                             const Plan& plan, train::trainer_options options = {}) {
    partition::partitioned_graph pg = partition::apply_plan(forward, plan);
    train::trainer<T> single(std::move(training), options);
    std::vector<train::step_result> reference;
    for (const auto& f : feeds) reference.push_back(single.step(f));

    const graph& logical = pg.ir();
    std::vector<std::string> names;
    for (tensor_id p : logical.parameters) names.push_back(logical.tensor(p).name);
    std::vector<std::vector<train::step_result>> results(static_cast<std::size_t>(pg.world));
    std::vector<std::vector<T>> gathered(names.size());
    comm::run_ranks(pg.world, [&](comm::communicator& comm) {
        train::distributed_trainer<T> rank(pg, comm, options);
        for (const auto& f : feeds) results[static_cast<std::size_t>(comm.rank())].push_back(rank.step(f));
        for (std::size_t i = 0; i < names.size(); ++i) {
            auto full = rank.gather_parameter(names[i]);
            if (comm.rank() == 0) gathered[i] = std::move(full);
        }
    });
    equivalence e;
    e.transfers = pg.transfers.size();
    for (const auto& per_rank : results)
        for (std::size_t s = 0; s < reference.size(); ++s) {
            e.loss = std::max(e.loss, relative(per_rank.at(s).loss, reference[s].loss));
            e.grad_norm = std::max(e.grad_norm, relative(per_rank.at(s).grad_norm, reference[s].grad_norm));
        }
    for (std::size_t i = 0; i < names.size(); ++i) {
        auto want = single.parameter(names[i]);
        double scale = 1e-2, diff = 0;
        for (std::size_t k = 0; k < want.size(); ++k) {
            scale = std::max(scale, std::abs(static_cast<double>(want[k])));
            diff = std::max(diff, std::abs(static_cast<double>(want[k]) - static_cast<double>(gathered[i].at(k))));
        }
        if (diff / scale > e.parameters) {
            e.parameters = diff / scale;
            e.worst_parameter = names[i];
        }
    }
    return e;
}

template <class T, class Plan>
equivalence compare_with_single_device(const models::gpt_config& c, const Plan& plan, int steps,
                                       train::trainer_options options = {}) {
    auto model = models::gpt(c);
    const graph forward = model.ir();
    std::vector<std::vector<std::int32_t>> data;
    std::vector<train::input_feed> feeds;
    for (int s = 0; s < steps; ++s) feeds.push_back(gpt_batch(c, s, data));
    return compare_on_model<T>(forward, std::move(model).training_graph(), feeds, plan, options);
}

}  // namespace loom::testing
