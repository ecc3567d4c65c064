#pragma once
// Training one rank of a partitioned plan on one GPU: the host distributed trainer's
// contract (train/distributed_trainer.hpp: same plan, options, feed and step result, the
// parameter pieces initialised from the same counter-based streams, so every plan starts
// from the weights one device would) on the CUDA backend, in f32 or bf16 mixed precision.
//
// A step queues, on one compute stream and without waiting for it:
//   inputs up (this rank's boxes, through pinned memory)
//   the program, whose transfers run on the device communicator; gradient all-reduces go
//     in buckets that start as soon as their last gradient exists and overlap with the rest
//     of the backward (runtime/gradient_buckets.hpp)
//   the global gradient norm (each element counted once, on its owning rank; the sum of
//     squares summed over the ranks) and the clip coefficient, on the device
//   AdamW over the parameter rows this rank updates (all of them; under ZeRO-1/2 its shard),
//     with float master weights for bf16
//   under ZeRO, the updated shards gathered in place into every rank's copy; the next step's
//     program waits for a parameter's gather just before its first reader, so the gathers
//     overlap with the optimizer and the start of the forward
// and then reads the loss and the norm back: the only host synchronisation of a step.
//
// T is float (precision::f32) or loom::bfloat16 (precision::bf16). Every rank of the plan
// constructs one with a communicator of the plan's world size: a nccl_communicator (one
// process per GPU), or a staged_communicator over the in-process world (several ranks as
// threads sharing a GPU; how the tests check plans against one device).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/core/bfloat16.hpp>
#include <loom/core/error.hpp>
#include <loom/partition/deadlock.hpp>
#include <loom/partition/partitioned_graph.hpp>
#include <loom/partition/region_copy.hpp>
#include <loom/runtime/compile.hpp>
#include <loom/runtime/cuda/device.hpp>
#include <loom/runtime/cuda/device_communicator.hpp>
#include <loom/runtime/cuda/elementwise.hpp>
#include <loom/runtime/cuda/executor.hpp>
#include <loom/runtime/cuda/gemm.hpp>
#include <loom/runtime/cuda/optimizer.hpp>
#include <loom/runtime/cuda/region_copy.hpp>
#include <loom/runtime/cuda/transfer_runner.hpp>
#include <loom/runtime/gradient_buckets.hpp>
#include <loom/train/init.hpp>
#include <loom/train/ownership.hpp>
#include <loom/train/trainer.hpp>

namespace loom::cuda {

struct distributed_options {
    int device = 0;                                  // the GPU this rank runs on
    std::int64_t bucket_bytes = std::int64_t{25} << 20;  // gradient all-reduce bucket size
};

template <class T>
class distributed_trainer {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, bfloat16>,
                  "cuda::distributed_trainer: T must be float (precision::f32) or loom::bfloat16 (precision::bf16)");

public:
    static constexpr precision prec = std::is_same_v<T, float> ? precision::f32 : precision::bf16;
    static constexpr bool mixed = std::is_same_v<T, bfloat16>;

    distributed_trainer(const partition::partitioned_graph& plan, device_communicator& c,
                        train::trainer_options options, distributed_options placement = {})
        : plan_(plan), comm_(c), options_(options) {
        if (c.size() != plan.world)
            throw usage_error("cuda::distributed_trainer: the plan is for " + std::to_string(plan.world) +
                              " devices but the communicator has " + std::to_string(c.size()) +
                              " ranks; launch as many ranks as the plan has devices");
        // Programs whose order was edited after apply_plan are checked before they run.
        if (partition::order_fingerprint(plan) != plan.checked_order) partition::check_programs(plan);
        adamw_ = std::get_if<train::adamw_options>(&options_.optimizer);
        if (!adamw_)
            throw usage_error("cuda::distributed_trainer: the GPU trainers run AdamW only; choose "
                              "train::adamw_options, or train with SGD on the host distributed trainer");
        rank_ = c.rank();
        part_ = &plan.devices.at(static_cast<std::size_t>(rank_));
        set_device(placement.device);
        stream_ = std::make_unique<stream>();
        gemm_ = std::make_unique<gemm_engine>();

        const graph& g = part_->ir();
        compile_options compile{.prec = prec, .outputs = {part_->loss}, .keep_every_node = true};
        if (!plan.order.empty()) compile.order = plan.order.at(static_cast<std::size_t>(rank_));
        program_ = compile_program(g, compile);
        executor_ = std::make_unique<executor<T>>(program_, stream_->get(), *gemm_);

        lay_out_bound_tensors(placement.bucket_bytes);
        runner_ = std::make_unique<device_transfer_runner>(plan_, program_, comm_, stream_->get(), buckets_, spans_);
        executor_->set_communication([this](const node& n, std::span<void* const> in, std::span<void* const> out,
                                            stream_handle) { runner_->run(n, in, out); });
        executor_->set_before_step([this](std::size_t s) {
            runner_->at_step(s);
            wait_for_gathers_read_at(s);
        });

        initialize_parameters();
        plan_norm();
        scalars_ = device_buffer(2 * sizeof(float) + sizeof(double));
        std::size_t staging = 0;
        for (const auto& s : part_->inputs)
            if (offsets_.count(s.local)) staging += static_cast<std::size_t>(program_.bytes_of(s.local));
        staging = (staging + sizeof(float) - 1) / sizeof(float) * sizeof(float);
        staging_ = pinned_buffer(staging + 2 * sizeof(float));
        // Last: a constructor that throws leaves the communicator without a stream that dies.
        comm_.set_stream(stream_->get());
    }

    distributed_trainer(const distributed_trainer&) = delete;
    distributed_trainer& operator=(const distributed_trainer&) = delete;

    ~distributed_trainer() {
        // Queued gathers and buckets write into memory this object frees, and the
        // communicator outlives the stream it was given.
        try {
            comm_.synchronize();
        } catch (const std::exception& e) {
            std::fprintf(stderr, "cuda::distributed_trainer: rank %d: %s\n", rank_, e.what());
        }
        comm_.set_stream(nullptr);
    }

    train::step_result step(const train::input_feed& feed) {
        const auto start = std::chrono::steady_clock::now();
        set_inputs(feed);
        executor_->run(static_cast<std::uint64_t>(steps_));
        runner_->finish();
        wait_for_all_gathers();  // a parameter no step reads still has its gather pending
        train::step_result r;
        r.lr = options_.schedule.at(steps_);
        pack_owned_gradients();
        norm_->sum_of_squares(sum_of_squares(), stream_->get());
        comm_.all_reduce_sum(sum_of_squares(), 1, comm::dtype::f64, comm::group::world(plan_.world));
        global_norm::finish(sum_of_squares(), static_cast<float>(options_.clip_norm), scalars_.as<float>(),
                            stream_->get());
        if (optimizer_)
            optimizer_->step(static_cast<float>(r.lr), options_.clip_norm > 0 ? scalars_.as<float>() + 1 : nullptr,
                             stream_->get());
        start_gathers();
        const auto [loss, norm] = read_loss_and_norm();
        r.loss = loss;
        r.grad_norm = norm;
        ++steps_;
        r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return r;
    }

    // The whole of a parameter (float master values), assembled from the rows each rank
    // updates. Collective: every rank must call it, in the same order.
    std::vector<float> gather_parameter(std::string_view name) {
        const graph& logical = plan_.ir();
        tensor_id p = no_id;
        for (tensor_id t : logical.parameters)
            if (logical.tensor(t).name == name) p = t;
        if (p == no_id) throw usage_error("cuda::distributed_trainer: no parameter named '" + std::string(name) + "'");
        wait_for_all_gathers();
        const partition::box whole = partition::box::whole(logical.tensor(p).dims);
        std::vector<float> full(static_cast<std::size_t>(whole.numel()), 0.0f);
        for (const auto& u : updates_) {
            if (u.logical != p) continue;
            std::vector<float> values(static_cast<std::size_t>(u.region.numel()));
            copy_to_host(values.data(), u.master, values.size() * sizeof(float), stream_->get());
            stream_->synchronize();
            for (const auto& region : updated_by_me_first(p, u.region))
                partition::copy_region(values.data(), u.region, full.data(), whole, region);
        }
        device_buffer sum(std::max<std::size_t>(full.size(), 1) * sizeof(float));
        copy_to_device(sum.get(), full.data(), full.size() * sizeof(float), stream_->get());
        comm_.all_reduce_sum(sum.get(), full.size(), comm::dtype::f32, comm::group::world(plan_.world));
        copy_to_host(full.data(), sum.get(), full.size() * sizeof(float), stream_->get());
        stream_->synchronize();
        return full;
    }

    const program& compiled() const { return program_; }
    const graph& ir() const { return part_->ir(); }
    const gradient_bucket_plan& buckets() const { return buckets_; }
    int rank() const { return rank_; }
    std::int64_t steps() const { return steps_; }
    stream_handle compute_stream() const { return stream_->get(); }

private:
    // The rows of one parameter piece this rank's optimizer updates.
    struct update {
        tensor_id logical = no_id;
        partition::box region;   // in the logical tensor
        float* master = nullptr;  // float values of `region` (the parameter itself in f32)
    };
    struct gather {
        tensor_id local = no_id;
        void* shard = nullptr;  // this rank's rows, inside the piece
        void* piece = nullptr;
        std::size_t count = 0;  // elements per rank
        comm::group replicas;   // the ranks whose shards tile the piece (train::update_group)
    };
    struct packed_region {
        const void* piece = nullptr;
        partition::box piece_box, region;
        void* to = nullptr;
    };

    void* device_pointer(tensor_id t) const {
        auto found = offsets_.find(t);
        if (found == offsets_.end())
            throw usage_error("cuda::distributed_trainer: tensor '" + part_->ir().tensor(t).name +
                              "' is not bound by rank " + std::to_string(rank_) + "'s program");
        return bound_.as<std::byte>() + found->second;
    }

    double* sum_of_squares() const { return reinterpret_cast<double*>(scalars_.as<std::byte>() + 2 * sizeof(float)); }

    // Bound tensors in one allocation, 256-byte aligned: each gradient bucket first, its
    // gradients back to back in bucket order (so a bucket is one span), then the rest.
    void lay_out_bound_tensors(std::int64_t bucket_bytes) {
        buckets_ = plan_gradient_buckets(program_, plan_, bucket_bytes);
        auto padded = [&](tensor_id t) {
            return (static_cast<std::size_t>(program_.bytes_of(t)) + 255) / 256 * 256;
        };
        std::size_t total = 0;
        std::vector<std::pair<std::size_t, std::size_t>> bucket_bytes_at;  // (first offset, end offset)
        for (const auto& b : buckets_.buckets) {
            const std::size_t first = total;
            for (tensor_id t : b.gradients) {
                offsets_[t] = total;
                total += padded(t);
            }
            bucket_bytes_at.push_back({first, offsets_[b.gradients.back()] +
                                                  static_cast<std::size_t>(program_.bytes_of(b.gradients.back()))});
        }
        for (tensor_id t : program_.bound)
            if (!offsets_.count(t)) {
                offsets_[t] = total;
                total += padded(t);
            }
        bound_ = device_buffer(std::max<std::size_t>(total, 256));
        fill_zero(bound_.get(), bound_.bytes(), stream_->get());  // bucket padding must sum to zero
        for (auto& [t, offset] : offsets_) executor_->bind(t, bound_.as<std::byte>() + offset);
        for (const auto& [first, end] : bucket_bytes_at)
            spans_.push_back({bound_.as<std::byte>() + first, (end - first) / sizeof(T)});
    }

    // Each parameter piece from the seeded streams (as one device would initialise the whole
    // tensor); the optimizer over the rows this rank updates; the shards to gather.
    void initialize_parameters() {
        const graph& logical = plan_.ir();
        std::map<tensor_id, std::vector<float>> initial;  // by local tensor
        for (const auto& s : part_->parameters) {
            const tensor_desc& d = logical.tensor(s.logical);
            std::vector<float> values(static_cast<std::size_t>(s.region.numel()));
            std::span<float> all(values);
            partition::for_each_region_row(s.region, partition::box::whole(d.dims), s.region,
                                           [&](std::int64_t global, std::int64_t at, std::int64_t n) {
                                               train::initialize(all.subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(n)),
                                                                 d.init, options_.init_seed, d.name,
                                                                 static_cast<std::uint64_t>(global));
                                           });
            upload_as_stored(device_pointer(s.local), values);
            initial[s.local] = std::move(values);
        }

        std::int64_t master_elements = 0;
        struct planned {
            const partition::stored_piece* param;
            const partition::stored_piece* grad;
            partition::box region;
        };
        std::vector<planned> plans;
        for (const auto& gp : part_->gradients) {
            const partition::stored_piece* pp = nullptr;
            for (const auto& s : part_->parameters)
                if (s.logical == gp.logical && s.region.contains(gp.region)) pp = &s;
            if (!pp)
                throw error("cuda::distributed_trainer: gradient piece " + gp.region.to_string() + " of '" +
                            logical.tensor(gp.logical).name + "' has no parameter piece on rank " + std::to_string(rank_));
            const partition::box region = train::update_region(plan_, rank_, gp.logical, gp.region);
            if (!(region == pp->region)) {
                const auto offset = static_cast<std::size_t>(train::offset_in(region, pp->region));
                comm::group replicas{train::update_group(plan_, rank_, gp.logical, pp->region)};
                const int index = replicas.index_of(rank_);
                gathers_.push_back({pp->local, static_cast<std::byte*>(device_pointer(pp->local)) + offset * sizeof(T),
                                    device_pointer(pp->local), static_cast<std::size_t>(region.numel()), replicas});
                // The gather runs in place: the i-th replica's rows must be the i-th of equal parts.
                if (static_cast<std::int64_t>(region.numel()) * replicas.size() != pp->region.numel() ||
                    offset != static_cast<std::size_t>(index) * static_cast<std::size_t>(region.numel()))
                    throw error("cuda::distributed_trainer: rank " + std::to_string(rank_) + "'s shard " +
                                region.to_string() + " of piece " + pp->region.to_string() + " is not part " +
                                std::to_string(index) + " of " + std::to_string(replicas.size()) +
                                " equal parts in rank order; shard parameters along rows that divide by their replicas");
            }
            if (region.numel() == 0) continue;
            plans.push_back({pp, &gp, region});
            if (mixed) master_elements += region.numel();
        }
        masters_ = device_buffer(static_cast<std::size_t>(std::max<std::int64_t>(master_elements, 1)) * sizeof(float));
        std::vector<adamw_tensor> tensors;
        std::int64_t master_at = 0;
        for (const auto& [pp, gp, region] : plans) {
            const auto offset = static_cast<std::size_t>(train::offset_in(region, pp->region));
            const auto goffset = static_cast<std::size_t>(train::offset_in(region, gp->region));
            const auto count = static_cast<std::size_t>(region.numel());
            T* param = static_cast<T*>(device_pointer(pp->local)) + offset;
            float* master = nullptr;
            if constexpr (mixed) {
                master = masters_.as<float>() + master_at;
                master_at += static_cast<std::int64_t>(count);
                copy_to_device(master, initial.at(pp->local).data() + offset, count * sizeof(float), stream_->get());
            } else {
                master = param;
            }
            tensors.push_back({master, static_cast<const T*>(device_pointer(gp->local)) + goffset,
                               mixed ? reinterpret_cast<bfloat16*>(param) : nullptr, static_cast<std::int64_t>(count),
                               logical.tensor(gp->logical).dims.rank() >= 2});
            updates_.push_back({gp->logical, region, master});
        }
        stream_->synchronize();  // `initial` dies with this function
        if (!tensors.empty()) {
            adamw_hyperparameters hyper{static_cast<float>(options_.schedule.peak), static_cast<float>(adamw_->beta1),
                                        static_cast<float>(adamw_->beta2), static_cast<float>(adamw_->eps),
                                        static_cast<float>(adamw_->weight_decay)};
            optimizer_ = std::make_unique<fused_adamw>(std::move(tensors), mixed ? grad_type::bf16 : grad_type::f32, hyper);
        }
        // The first reader of each gathered piece: where the next step waits for its gather.
        for (std::size_t s = 0; s < program_.steps.size(); ++s)
            for (tensor_id t : part_->ir().at(program_.steps[s].node).inputs)
                for (std::size_t k = 0; k < gathers_.size(); ++k)
                    if (gathers_[k].local == t && !first_reader_.count(k)) first_reader_[k] = s;
    }

    void upload_as_stored(void* device, const std::vector<float>& values) {
        if constexpr (mixed) {
            std::vector<bfloat16> narrow(values.size());
            for (std::size_t i = 0; i < values.size(); ++i) narrow[i] = bfloat16(values[i]);
            copy_to_device(device, narrow.data(), narrow.size() * sizeof(bfloat16), stream_->get());
        } else {
            copy_to_device(device, values.data(), values.size() * sizeof(float), stream_->get());
        }
        stream_->synchronize();
    }

    // The norm counts each gradient element once: on the lowest rank that holds it. Owned
    // parts that are not the whole piece are packed into scratch first.
    void plan_norm() {
        std::vector<const void*> grads;
        std::vector<std::int64_t> numels;
        std::size_t scratch = 0;
        std::vector<std::pair<const partition::stored_piece*, partition::box>> partial;
        for (const auto& gp : part_->gradients)
            for (const auto& region : train::owned_regions(plan_, rank_, gp.logical, gp.region, true)) {
                if (region.numel() == 0) continue;
                if (region == gp.region) {
                    grads.push_back(device_pointer(gp.local));
                    numels.push_back(region.numel());
                } else {
                    partial.push_back({&gp, region});
                    scratch += (static_cast<std::size_t>(region.numel()) * sizeof(T) + 255) / 256 * 256;
                }
            }
        norm_scratch_ = device_buffer(std::max<std::size_t>(scratch, 256));
        std::size_t at = 0;
        for (const auto& [gp, region] : partial) {
            void* to = norm_scratch_.as<std::byte>() + at;
            packed_.push_back({device_pointer(gp->local), gp->region, region, to});
            grads.push_back(to);
            numels.push_back(region.numel());
            at += (static_cast<std::size_t>(region.numel()) * sizeof(T) + 255) / 256 * 256;
        }
        norm_ = std::make_unique<global_norm>(std::move(grads), std::move(numels), mixed ? grad_type::bf16 : grad_type::f32);
    }

    void pack_owned_gradients() {
        for (const auto& p : packed_)
            copy_region(p.piece, p.piece_box, p.to, p.region, p.region, sizeof(T), stream_->get());
    }

    // Parts of `region` (rows rank_ updates of parameter p) that no lower rank updates.
    std::vector<partition::box> updated_by_me_first(tensor_id p, const partition::box& region) const {
        std::vector<partition::box> mine{region};
        for (int r = 0; r < rank_; ++r)
            for (const auto& gp : plan_.devices[static_cast<std::size_t>(r)].gradients) {
                if (gp.logical != p) continue;
                const partition::box theirs = train::update_region(plan_, r, p, gp.region);
                std::vector<partition::box> next;
                for (const auto& b : mine) train::subtract_box(b, theirs, next);
                mine = std::move(next);
            }
        return mine;
    }

    // ZeRO: every rank updated its rows; gather them in place into every copy of the piece.
    void start_gathers() {
        for (std::size_t k = 0; k < gathers_.size(); ++k) {
            const gather& g = gathers_[k];
            pending_gathers_[k] = comm_.begin_all_gather(g.shard, g.piece, g.count, comm::dtype_of<T>(), g.replicas);
        }
    }
    void wait_for_gathers_read_at(std::size_t s) {
        for (auto it = pending_gathers_.begin(); it != pending_gathers_.end();) {
            if (first_reader_.count(it->first) && first_reader_.at(it->first) == s) {
                comm_.wait(it->second);
                it = pending_gathers_.erase(it);
            } else {
                ++it;
            }
        }
    }
    void wait_for_all_gathers() {
        for (auto& [k, t] : pending_gathers_) comm_.wait(t);
        pending_gathers_.clear();
    }

    void set_inputs(const train::input_feed& feed) {
        // A step that threw may have left copies from the staging area queued.
        stream_->synchronize();
        const graph& logical = plan_.ir();
        std::size_t at = 0;
        for (const auto& s : part_->inputs) {
            if (!offsets_.count(s.local)) continue;  // an input this rank's program does not read
            const tensor_desc& d = logical.tensor(s.logical);
            const partition::box whole = partition::box::whole(d.dims);
            const auto bytes = static_cast<std::size_t>(program_.bytes_of(s.local));
            std::byte* staged = staging_.as<std::byte>() + at;
            if (d.kind == value_kind::index) {
                auto it = feed.index.find(d.name);
                if (it == feed.index.end())
                    throw usage_error("cuda::distributed_trainer: no data fed for input '" + d.name +
                                      "'; add it to input_feed::index");
                check_size(d, it->second.size());
                partition::copy_region(it->second.data(), whole, reinterpret_cast<std::int32_t*>(staged), s.region, s.region);
            } else {
                auto it = feed.real.find(d.name);
                if (it == feed.real.end())
                    throw usage_error("cuda::distributed_trainer: no data fed for input '" + d.name +
                                      "'; add it to input_feed::real");
                check_size(d, it->second.size());
                T* dst = reinterpret_cast<T*>(staged);
                partition::for_each_region_row(s.region, whole, s.region, [&](std::int64_t from, std::int64_t to, std::int64_t n) {
                    for (std::int64_t i = 0; i < n; ++i)
                        dst[to + i] = static_cast<T>(static_cast<float>(it->second[static_cast<std::size_t>(from + i)]));
                });
            }
            copy_to_device(device_pointer(s.local), staged, bytes, stream_->get());
            at += bytes;
        }
    }

    static void check_size(const tensor_desc& d, std::size_t got) {
        if (static_cast<std::int64_t>(got) != d.dims.numel())
            throw usage_error("cuda::distributed_trainer: input '" + d.name + "' has shape " + d.dims.to_string() + " (" +
                              std::to_string(d.dims.numel()) + " elements) but " + std::to_string(got) +
                              " were fed; feed the whole batch to every rank");
    }

    std::pair<double, double> read_loss_and_norm() {
        float* host = reinterpret_cast<float*>(staging_.as<std::byte>() + staging_.bytes() - 2 * sizeof(float));
        copy_to_host(host, device_pointer(part_->loss), sizeof(float), stream_->get());
        copy_to_host(host + 1, scalars_.get(), sizeof(float), stream_->get());
        stream_->synchronize();
        return {host[0], host[1]};
    }

    const partition::partitioned_graph& plan_;
    device_communicator& comm_;
    train::trainer_options options_;
    const train::adamw_options* adamw_ = nullptr;
    int rank_ = 0;
    const partition::device_part* part_ = nullptr;
    std::unique_ptr<stream> stream_;
    std::unique_ptr<gemm_engine> gemm_;
    program program_;
    std::unique_ptr<executor<T>> executor_;
    gradient_bucket_plan buckets_;
    std::vector<bucket_span> spans_;
    std::unique_ptr<device_transfer_runner> runner_;
    std::map<tensor_id, std::size_t> offsets_;
    device_buffer bound_, masters_, scalars_, norm_scratch_;
    pinned_buffer staging_;
    std::unique_ptr<fused_adamw> optimizer_;
    std::unique_ptr<global_norm> norm_;
    std::vector<update> updates_;
    std::vector<gather> gathers_;
    std::vector<packed_region> packed_;
    std::map<std::size_t, std::size_t> first_reader_;  // gather index -> step
    std::map<std::size_t, device_communicator::ticket> pending_gathers_;
    std::int64_t steps_ = 0;
};

}  // namespace loom::cuda
