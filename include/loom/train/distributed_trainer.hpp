#pragma once
// Training one rank of a partitioned graph: this device's program, its pieces of the
// parameters (initialised from the same counter-based streams as on one device, so any
// plan starts from the same weights), the communicator for transfers, and the optimizer
// over the parameter pieces this rank updates.
//
// Every rank constructs one and calls step() with the same full batch; each copies the
// boxes of the inputs it stores. The loss and the gradient norm come back identical on
// every rank. Replicated parameter pieces receive identical gradients and make identical
// updates, so they stay equal without communication; under ZeRO-1 and ZeRO-2 a rank
// updates its shard only and the shards are all-gathered after the update.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/partition/deadlock.hpp>
#include <loom/partition/partitioned_graph.hpp>
#include <loom/partition/region_copy.hpp>
#include <loom/runtime/comm/communicator.hpp>
#include <loom/runtime/compile.hpp>
#include <loom/runtime/host/bound_storage.hpp>
#include <loom/runtime/host/executor.hpp>
#include <loom/runtime/transfer_runner.hpp>
#include <loom/train/adamw.hpp>
#include <loom/train/grad_clip.hpp>
#include <loom/train/init.hpp>
#include <loom/train/ownership.hpp>
#include <loom/train/sgd.hpp>
#include <loom/train/trainer.hpp>

namespace loom::train {

template <class T>
class distributed_trainer {
public:
    static constexpr precision prec = std::is_same_v<T, float> ? precision::f32 : precision::f64;

    distributed_trainer(const partition::partitioned_graph& plan, comm::communicator& c, trainer_options options)
        : plan_(plan), comm_(c), options_(options) {
        if (c.size() != plan.world)
            throw usage_error("distributed_trainer: the plan is for " + std::to_string(plan.world) +
                              " devices but the communicator has " + std::to_string(c.size()) +
                              " ranks; launch as many ranks as the plan has devices");
        // Programs whose order was edited after apply_plan are checked before they run: an
        // order that deadlocks or reads before it writes must not start.
        if (partition::order_fingerprint(plan) != plan.checked_order) partition::check_programs(plan);
        rank_ = c.rank();
        part_ = &plan.devices.at(static_cast<std::size_t>(rank_));
        const graph& g = part_->ir();
        compile_options compile{.prec = prec, .outputs = {part_->loss}, .keep_every_node = true};
        if (!plan.order.empty()) compile.order = plan.order.at(static_cast<std::size_t>(rank_));
        program_ = compile_program(g, compile);
        executor_ = std::make_unique<host::executor<T>>(program_);
        storage_ = std::make_unique<host::bound_storage<T>>(program_);
        storage_->bind_to(*executor_);
        executor_->set_communication([this](const node& n, std::span<void* const> in, std::span<void* const> out) {
            const auto id = n.attrs.get<std::int64_t>("transfer");
            run_transfer<T>(plan_.transfers.at(static_cast<std::size_t>(id)), id, comm_, in.empty() ? nullptr : in[0],
                            out.empty() ? nullptr : out[0], scratch_);
        });
        const graph& logical = plan.ir();
        for (const auto& s : part_->parameters) {
            const tensor_desc& d = logical.tensor(s.logical);
            auto values = storage_->real(s.local);
            partition::for_each_region_row(s.region, partition::box::whole(d.dims), s.region,
                                           [&](std::int64_t global, std::int64_t at, std::int64_t n) {
                                               initialize(values.subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(n)),
                                                          d.init, options_.init_seed, d.name, static_cast<std::uint64_t>(global));
                                           });
        }
        plan_optimizer();
        plan_gradient_norm();
    }

    distributed_trainer(const distributed_trainer&) = delete;
    distributed_trainer& operator=(const distributed_trainer&) = delete;

    // With a trace, also records when each instruction of this rank's program ran.
    step_result step(const input_feed& feed, host::instruction_trace* trace = nullptr) {
        auto start = std::chrono::steady_clock::now();
        set_inputs(feed);
        executor_->set_trace(trace);
        executor_->run(static_cast<std::uint64_t>(steps_));
        executor_->set_trace(nullptr);
        step_result r;
        r.loss = static_cast<double>(storage_->real(part_->loss)[0]);
        r.grad_norm = global_gradient_norm();
        r.lr = options_.schedule.at(steps_);
        const double scale = clip_scale(r.grad_norm, options_.clip_norm);
        std::visit([&](auto& opt) { opt.step(r.lr, scale); }, *optimizer_);
        synchronize_shards();
        ++steps_;
        r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return r;
    }

    // The whole of a parameter, assembled from every rank's pieces. Collective: every rank
    // must call it, in the same order.
    std::vector<T> gather_parameter(std::string_view name) {
        const graph& logical = plan_.ir();
        tensor_id p = no_id;
        for (tensor_id t : logical.parameters)
            if (logical.tensor(t).name == name) p = t;
        if (p == no_id) throw usage_error("distributed_trainer: no parameter named '" + std::string(name) + "'");
        const partition::box whole = partition::box::whole(logical.tensor(p).dims);
        std::vector<T> full(static_cast<std::size_t>(whole.numel()), T(0));
        for (const auto& s : part_->parameters) {
            if (s.logical != p) continue;
            const auto owned = owned_rows(p, s.region, /*gradients=*/false);
            auto values = storage_->real(s.local);
            for (const auto& region : owned)
                partition::copy_region(values.data(), s.region, full.data(), whole, region);
        }
        comm_.all_reduce_sum(full.data(), full.size(), comm::dtype_of<T>(), comm::group::world(plan_.world));
        return full;
    }

    const program& compiled() const { return program_; }
    const graph& ir() const { return part_->ir(); }
    int rank() const { return rank_; }
    std::int64_t steps() const { return steps_; }

    // What a checkpoint (train/checkpoint.hpp) saves and restores: the plan, this rank's
    // pieces, their values, the optimizer and, per optimizer slot in order, the logical
    // parameter and the box of it that the slot updates.
    const partition::partitioned_graph& plan() const { return plan_; }
    const partition::device_part& part() const { return *part_; }
    std::span<T> local_values(tensor_id local) { return storage_->real(local); }
    auto& optimizer() { return *optimizer_; }
    const std::vector<std::pair<tensor_id, partition::box>>& optimizer_regions() const { return slot_regions_; }
    const trainer_options& options() const { return options_; }
    comm::communicator& communicator() { return comm_; }
    void set_steps(std::int64_t s) { steps_ = s; }

private:
    std::vector<partition::box> owned_rows(tensor_id p, const partition::box& region, bool gradients) const {
        return owned_regions(plan_, rank_, p, region, gradients);
    }

    // The norm sums each gradient element once over the ranks: every rank its owned rows
    // of its pieces (owned_regions), as contiguous runs found once; the runs are summed on
    // the thread pool in a fixed order (grad_clip.hpp), so every rank gets the same norm.
    void plan_gradient_norm() {
        for (const auto& s : part_->gradients) {
            auto values = storage_->real(s.local);
            for (const auto& region : owned_rows(s.logical, s.region, true))
                partition::for_each_region_row(region, s.region, s.region, [&](std::int64_t at, std::int64_t, std::int64_t n) {
                    owned_gradients_.push_back(values.subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(n)));
                });
        }
    }

    double global_gradient_norm() {
        double sum = sum_of_squares(owned_gradients_);
        comm_.all_reduce_sum(&sum, 1, comm::dtype::f64, comm::group::world(plan_.world));
        return std::sqrt(sum);
    }

    // The optimizer updates, per gradient piece, the matching part of the parameter piece;
    // under ZeRO-1 only this rank's shard of it (its first dim cut over the piece's replicas).
    void plan_optimizer() {
        const graph& logical = plan_.ir();
        auto make = [&](const auto& o) {
            using opt_t = std::conditional_t<std::is_same_v<std::decay_t<decltype(o)>, adamw_options>, adamw<T>, sgd<T>>;
            auto with_lr = o;
            with_lr.lr = options_.schedule.peak;
            optimizer_ = std::make_unique<std::variant<adamw<T>, sgd<T>>>(std::in_place_type<opt_t>, with_lr);
        };
        std::visit(make, options_.optimizer);
        for (const auto& gp : part_->gradients) {
            const partition::stored_piece* pp = nullptr;
            for (const auto& s : part_->parameters)
                if (s.logical == gp.logical && s.region.contains(gp.region)) pp = &s;
            if (!pp) throw error("distributed_trainer: gradient piece " + gp.region.to_string() + " of '" +
                                 logical.tensor(gp.logical).name + "' has no parameter piece on rank " + std::to_string(rank_));
            const partition::box update = update_region(plan_, rank_, gp.logical, gp.region);
            if (!(update == pp->region)) shards_.push_back({pp, update, comm::group{update_group(plan_, rank_, gp.logical, pp->region)}});
            if (update.numel() == 0) continue;
            auto value = storage_->real(pp->local);
            auto grad = storage_->real(gp.local);
            const auto offset = static_cast<std::size_t>(offset_in(update, pp->region));
            const auto goffset = static_cast<std::size_t>(offset_in(update, gp.region));
            const auto count = static_cast<std::size_t>(update.numel());
            const tensor_desc& d = logical.tensor(gp.logical);
            slot_regions_.emplace_back(gp.logical, update);
            std::visit(
                [&](auto& opt) {
                    opt.add({d.name + update.to_string(), value.subspan(offset, count), grad.subspan(goffset, count),
                             d.dims.rank() >= 2});
                },
                *optimizer_);
        }
    }

    // ZeRO-1/2: every replica updated its shard; gather the shards into every full copy of
    // the piece, among the ranks whose shards tile it in rank order (update_group).
    void synchronize_shards() {
        for (const auto& [piece, shard, replicas] : shards_) {
            auto values = storage_->real(piece->local);
            const auto count = static_cast<std::size_t>(shard.numel());
            const auto offset = static_cast<std::size_t>(offset_in(shard, piece->region));
            if (count * static_cast<std::size_t>(replicas.size()) != values.size() ||
                offset != count * static_cast<std::size_t>(replicas.index_of(rank_)))
                throw error("distributed_trainer: rank " + std::to_string(rank_) + "'s shard " + shard.to_string() + " of " +
                            piece->region.to_string() + " is not part " + std::to_string(replicas.index_of(rank_)) +
                            " of " + std::to_string(replicas.size()) +
                            " equal parts in rank order; shard parameters along rows that divide by their replicas");
            gathered_.resize(count * static_cast<std::size_t>(replicas.size()));
            comm_.all_gather(values.data() + offset, gathered_.data(), count, comm::dtype_of<T>(), replicas);
            std::copy(gathered_.begin(), gathered_.end(), values.begin());
        }
    }

    void set_inputs(const input_feed& feed) {
        const graph& logical = plan_.ir();
        for (const auto& s : part_->inputs) {
            const tensor_desc& d = logical.tensor(s.logical);
            if (!storage_->has(s.local)) continue;
            const partition::box whole = partition::box::whole(d.dims);
            if (d.kind == value_kind::index) {
                auto it = feed.index.find(d.name);
                if (it == feed.index.end())
                    throw usage_error("distributed_trainer: no data fed for input '" + d.name + "'; add it to input_feed::index");
                check_size(d, it->second.size());
                partition::copy_region(it->second.data(), whole, storage_->index(s.local).data(), s.region, s.region);
            } else {
                auto it = feed.real.find(d.name);
                if (it == feed.real.end())
                    throw usage_error("distributed_trainer: no data fed for input '" + d.name + "'; add it to input_feed::real");
                check_size(d, it->second.size());
                auto dst = storage_->real(s.local);
                partition::for_each_region_row(s.region, whole, s.region, [&](std::int64_t from, std::int64_t to, std::int64_t n) {
                    for (std::int64_t i = 0; i < n; ++i)
                        dst[static_cast<std::size_t>(to + i)] = static_cast<T>(it->second[static_cast<std::size_t>(from + i)]);
                });
            }
        }
    }
    static void check_size(const tensor_desc& d, std::size_t got) {
        if (static_cast<std::int64_t>(got) != d.dims.numel())
            throw usage_error("distributed_trainer: input '" + d.name + "' has shape " + d.dims.to_string() + " (" +
                              std::to_string(d.dims.numel()) + " elements) but " + std::to_string(got) +
                              " were fed; feed the whole batch to every rank");
    }

    const partition::partitioned_graph& plan_;
    comm::communicator& comm_;
    trainer_options options_;
    int rank_ = 0;
    const partition::device_part* part_ = nullptr;
    program program_;
    std::unique_ptr<host::executor<T>> executor_;
    std::unique_ptr<host::bound_storage<T>> storage_;
    std::unique_ptr<std::variant<adamw<T>, sgd<T>>> optimizer_;
    transfer_scratch<T> scratch_;
    struct shard {
        const partition::stored_piece* piece;
        partition::box region;
        comm::group replicas;
    };
    std::vector<shard> shards_;
    std::vector<T> gathered_;
    std::vector<std::pair<tensor_id, partition::box>> slot_regions_;
    std::vector<std::span<T>> owned_gradients_;  // the runs of the gradient pieces whose squares this rank sums
    std::int64_t steps_ = 0;
};

}  // namespace loom::train
