#pragma once
// The cost of one configuration (plan_space.hpp) of a profiled model (model_profile.hpp)
// on a cluster (hardware.hpp): step time and memory per device. The searcher minimises
// the step time of the slowest device (nnScaler eq. 1) among the configurations that fit.
//
// Per micro-batch and pipeline chunk c (its layers L_c, a share 1/(dp m) of the batch):
//   forward_c  = sum_{l in L_c} T(fwd_l) / (tp dp m) + joins_c * AR_tp(residual / (dp m))
//   backward_c = sum_{l in L_c} (T(bwd_l) + T(recompute_l)) / (tp dp m) + the same all-reduces
// where T is the roofline time of a layer's nodes (GEMM-like nodes at gemm_efficiency of
// the precision's peak, memory-bound nodes at elementwise_efficiency, each no faster than
// the memory bandwidth allows), and AR_tp the all-reduce over the TP group, discounted by
// the overlap factor epsilon. Sequence parallelism is assumed: every op is 1/tp per device.
//
//   pipeline  = the schedule's makespan (the schedule template's orders, played by
//               schedule::simulate with those chunk times; every message between stages
//               costs a point-to-point transfer of the boundary activation, scattered over
//               the TP group). A model with R forward rounds (model_profile::forward_rounds)
//               runs R forward blocks per micro-batch and stage under 3F1B, each round's
//               output feeding the next round's first stage; on one stage the rounds simply
//               add up in its forward block.
//   step      = pipeline + max over devices (exposed gradient sync + ZeRO-3 gathers
//               + optimizer update)
//   gradient sync: all-reduce over the DP group of the device's gradients, latency in full
//               and transmission times gamma * epsilon (TAPAS eq. 3: it overlaps the
//               backward); ZeRO 1/2 move the same bytes (reduce-scatter + all-gather);
//               ZeRO-3 also all-gathers the parameters in every micro-batch's forward and
//               backward.
//   memory    = model states (memory.hpp: by dtype, ZeRO stage and DP degree) of the
//               device's parameters / tp, + for each chunk its peak in-flight micro-batches
//               (from the schedule's orders) times the activations its layers keep under
//               their recompute choice / tp, + ZeRO-3's gather buffer (two layers),
//               + the transient of recomputation: while one layer of one micro-batch is
//               recomputed, the activations it did not keep are live again; the largest
//               such set on the device / tp / coshard (Coshard recomputes a layer in
//               coshard pieces, one after another).
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <loom/core/linkage.hpp>
#include <loom/schedule/in_flight.hpp>
#include <loom/schedule/simulate.hpp>
#include <loom/schedule/templates.hpp>
#include <loom/search/communication.hpp>
#include <loom/search/hardware.hpp>
#include <loom/search/memory.hpp>
#include <loom/search/model_profile.hpp>
#include <loom/search/plan_space.hpp>

namespace loom::search {

struct search_options {
    double memory_per_device = 0;  // bytes; 0: the device's memory
    precision compute = precision::bf16;
    double activation_bytes = 2;   // per element of activations and messages
    state_bytes states = mixed_precision_adam();
    overlap_factors overlap;
    bool fold = true;              // decide once per class of identical layers
    double time_budget_seconds = 0;  // 0: search to the end
};

struct device_cost {
    double parameters = 0;  // elements of the layers on this device, before TP sharding
    memory_breakdown memory;
    double exposed_communication = 0;  // s per step: gradient sync, ZeRO-3 gathers
    double optimizer = 0;              // s per step
    double transient = 0;              // bytes of recomputation's transient (part of memory.buffers)
};

struct evaluation {
    bool feasible = false;
    std::string why_infeasible;
    double step_time = std::numeric_limits<double>::infinity();
    double pipeline_time = 0;
    std::vector<double> chunk_forward, chunk_backward;  // s per micro-batch (forward: per block)
    int forward_blocks = 1;  // forward blocks per micro-batch and chunk: the rounds under 3F1B, else 1
    std::vector<device_cost> devices;                  // per pipeline device
    double interlaced_per_micro_batch = 0;             // s on every device (interlaced only)
    double peak_memory() const {
        double m = 0;
        for (const auto& d : devices) m = std::max(m, d.memory.total());
        return m;
    }
};

// Per-layer times and the schedules' orders, computed once for a model and cluster.
class cost_context {
public:
    // Keeps its own copy of the profile, so a temporary may be passed.
    cost_context(model_profile model, const cluster& hw, const search_options& options)
        : model_(std::move(model)), hw_(hw), options_(options) {
        memory_cap_ = options.memory_per_device > 0 ? options.memory_per_device : hw.device.memory_bytes;
        const double peak = hw.device.peak_flops(options.compute);
        const auto time_of = [&](const work& w) {
            const double bytes = options.activation_bytes;
            return std::max(w.gemm_flops / (peak * hw.device.gemm_efficiency),
                            w.gemm_elements * bytes / hw.device.memory_bandwidth) +
                   std::max(w.memory_bound_flops / (peak * hw.device.elementwise_efficiency),
                            w.memory_bound_elements * bytes / (hw.device.memory_bandwidth * hw.device.elementwise_efficiency));
        };
        for (const layer_profile& l : model_.layers) {
            times_.push_back({time_of(l.forward), time_of(l.backward), time_of(l.memory_bound_forward)});
        }
        for (std::size_t i = 0; i < model_.layers.size(); ++i)
            if (model_.layers[i].role == layer_role::repeated) repeated_.push_back(static_cast<int>(i));
            else if (model_.layers[i].role == layer_role::prologue) prologue_ = static_cast<int>(i);
            else epilogue_ = static_cast<int>(i);
    }

    struct layer_times {
        double forward = 0, backward = 0, memory_bound_forward = 0;  // s at the graph's batch, one device
    };

    const model_profile& model() const { return model_; }
    const cluster& hardware() const { return hw_; }
    const search_options& options() const { return options_; }
    double memory_cap() const { return memory_cap_; }
    const std::vector<int>& repeated() const { return repeated_; }
    int rounds() const { return std::max(model_.forward_rounds, 1); }
    int prologue() const { return prologue_; }
    int epilogue() const { return epilogue_; }
    const layer_times& times(int layer) const { return times_[static_cast<std::size_t>(layer)]; }

    // Extra backward time (at the graph's batch, one device) and activations kept (elements
    // at the graph's batch) of a layer under a recompute choice.
    double recompute_time(int layer, plan::recompute_policy r) const {
        return r == plan::recompute_policy::full        ? times(layer).forward
               : r == plan::recompute_policy::selective ? times(layer).memory_bound_forward
                                                        : 0.0;
    }
    // Elements a layer's recomputation brings back to life for its backward (at the graph's
    // batch): what it saved minus what it kept.
    double transient_elements(int layer, plan::recompute_policy r) const {
        const layer_profile& l = model_.layers[static_cast<std::size_t>(layer)];
        return std::max(0.0, l.saved_elements - kept_elements(layer, r));
    }
    double kept_elements(int layer, plan::recompute_policy r) const {
        const layer_profile& l = model_.layers[static_cast<std::size_t>(layer)];
        return r == plan::recompute_policy::full        ? l.input_elements
               : r == plan::recompute_policy::selective ? l.saved_elements - l.cheap_saved_elements
                                                        : l.saved_elements;
    }

    // The block orders of a schedule and its peak in-flight micro-batches per chunk.
    struct orders {
        schedule::schedule order;
        std::vector<int> in_flight;  // per chunk
    };
    const orders& schedule_orders(plan::schedule_kind kind, int pp, int chunks, int micro_batches) {
        const auto key = std::make_tuple(static_cast<int>(kind), pp, chunks, micro_batches);
        auto it = orders_.find(key);
        if (it != orders_.end()) return *it->second;
        auto o = std::make_unique<orders>();
        o->order = kind == plan::schedule_kind::gpipe           ? schedule::gpipe(pp, micro_batches)
                   : kind == plan::schedule_kind::one_f_one_b   ? schedule::one_f_one_b(pp, micro_batches)
                   : kind == plan::schedule_kind::three_f_one_b ? schedule::three_f_one_b(pp, micro_batches)
                                                          : schedule::interleaved_one_f_one_b(pp, chunks, micro_batches);
        o->in_flight = schedule::peak_in_flight(o->order).per_stage;
        ++schedules_built_;
        return *orders_.emplace(key, std::move(o)).first->second;
    }
    int schedules_built() const { return schedules_built_; }

private:
    model_profile model_;
    cluster hw_;
    search_options options_;
    double memory_cap_ = 0;
    std::vector<layer_times> times_;
    std::vector<int> repeated_;
    int prologue_ = -1, epilogue_ = -1;
    std::map<std::tuple<int, int, int, int>, std::unique_ptr<orders>> orders_;
    int schedules_built_ = 0;
};

// Which layers each chunk holds: the prologue on chunk 0, the epilogue on the last chunk
// (unless interlaced: then on no chunk), the repeated layers in order, layers_per_chunk[c]
// of them on chunk c.
LOOM_INLINE std::vector<std::vector<int>> layers_of_chunks(const cost_context& ctx, const configuration& c);

// The recompute choice of layer index `layer` (prologue and epilogue keep everything).
LOOM_INLINE plan::recompute_policy recompute_of_layer(const cost_context& ctx, const configuration& c, int layer);

// One all-reduce of the residual stream of a micro-batch over the TP group (a residual
// join's cost per pass), its transmission discounted by epsilon.
LOOM_INLINE double tensor_parallel_all_reduce_time(const cost_context& ctx, const configuration& c);

// Everything but the pipeline makespan: per-chunk times and per-device memory and comm.
// Split out so that the searcher can bound before it times the schedule.
LOOM_INLINE evaluation evaluate_without_pipeline(cost_context& ctx, const configuration& c);

// The time of one message between consecutive stages: the boundary activation of one
// micro-batch, scattered over the TP group (each of its devices sends 1/tp).
LOOM_INLINE double stage_message_time(const cost_context& ctx, const configuration& c);

inline double step_time_of(const evaluation& e, double pipeline) {
    double slowest = 0;
    for (const auto& d : e.devices) slowest = std::max(slowest, d.exposed_communication + d.optimizer);
    return pipeline + slowest;
}

LOOM_INLINE evaluation evaluate(cost_context& ctx, const configuration& c);

}  // namespace loom::search

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::search {

LOOM_INLINE std::vector<std::vector<int>> layers_of_chunks(const cost_context& ctx, const configuration& c) {
    const int chunks = c.pp * c.chunks;
    std::vector<std::vector<int>> out(static_cast<std::size_t>(chunks));
    if (ctx.prologue() >= 0 && !c.interlaced) out.front().push_back(ctx.prologue());
    std::size_t next = 0;
    for (int k = 0; k < chunks; ++k)
        for (int i = 0; i < c.layers_per_chunk[static_cast<std::size_t>(k)]; ++i)
            out[static_cast<std::size_t>(k)].push_back(ctx.repeated()[next++]);
    if (ctx.epilogue() >= 0 && !c.interlaced) out.back().push_back(ctx.epilogue());
    return out;
}

LOOM_INLINE plan::recompute_policy recompute_of_layer(const cost_context& ctx, const configuration& c, int layer) {
    const auto& r = ctx.repeated();
    const auto it = std::find(r.begin(), r.end(), layer);
    if (it == r.end() || c.recompute_of.empty()) return plan::recompute_policy::none;
    return c.recompute_of[static_cast<std::size_t>(it - r.begin())];
}

LOOM_INLINE double tensor_parallel_all_reduce_time(const cost_context& ctx, const configuration& c) {
    if (c.tp == 1) return 0.0;
    const double bytes = ctx.model().residual_elements / (static_cast<double>(c.dp) * c.micro_batches) *
                         ctx.options().activation_bytes;
    return exposed_time(collective_cost(ctx.hardware(), collective::all_reduce, bytes, {c.tp, 1}), {},
                        collective::all_reduce, {1.0, ctx.options().overlap.epsilon});
}

LOOM_INLINE evaluation evaluate_without_pipeline(cost_context& ctx, const configuration& c) {
    const model_profile& m = ctx.model();
    const cluster& hw = ctx.hardware();
    const search_options& o = ctx.options();
    const int chunks = c.pp * c.chunks;
    evaluation e;
    e.chunk_forward.assign(static_cast<std::size_t>(chunks), 0.0);
    e.chunk_backward.assign(static_cast<std::size_t>(chunks), 0.0);
    e.devices.assign(static_cast<std::size_t>(c.pp), {});
    const double share = 1.0 / (static_cast<double>(c.dp) * c.micro_batches);  // of the graph's batch
    const double tp_all_reduce = tensor_parallel_all_reduce_time(ctx, c);
    const auto layers = layers_of_chunks(ctx, c);
    const auto& sched = ctx.schedule_orders(c.schedule, c.pp, c.chunks, c.micro_batches);
    e.forward_blocks = c.schedule == plan::schedule_kind::three_f_one_b ? ctx.rounds() : 1;
    const double rounds_per_block = c.schedule == plan::schedule_kind::three_f_one_b ? 1.0 : static_cast<double>(ctx.rounds());
    std::vector<std::vector<bool>> on_device(static_cast<std::size_t>(c.pp), std::vector<bool>(m.layers.size(), false));
    for (int k = 0; k < chunks; ++k)
        for (int l : layers[static_cast<std::size_t>(k)]) on_device[static_cast<std::size_t>(c.device_of_chunk(k))][static_cast<std::size_t>(l)] = true;
    std::vector<double> activations(static_cast<std::size_t>(c.pp), 0.0), largest_layer(static_cast<std::size_t>(c.pp), 0.0),
        transient(static_cast<std::size_t>(c.pp), 0.0);
    const double transient_scale = share * o.activation_bytes / (static_cast<double>(c.tp) * std::max(c.coshard, 1));
    for (int k = 0; k < chunks; ++k) {
        const int d = c.device_of_chunk(k);
        double f = 0, f_once = 0, b = 0, kept = 0;  // f_once: the prologue and epilogue, once per micro-batch
        int joins = 0;
        for (int l : layers[static_cast<std::size_t>(k)]) {
            const plan::recompute_policy r = recompute_of_layer(ctx, c, l);
            (l == ctx.prologue() || l == ctx.epilogue() ? f_once : f) += ctx.times(l).forward;
            b += ctx.times(l).backward + ctx.recompute_time(l, r);
            kept += ctx.kept_elements(l, r);
            transient[static_cast<std::size_t>(d)] =
                std::max(transient[static_cast<std::size_t>(d)], ctx.transient_elements(l, r) * transient_scale);
            joins += m.layers[static_cast<std::size_t>(l)].residual_joins;
            const layer_profile& lp = m.layers[static_cast<std::size_t>(l)];
            device_cost& dc = e.devices[static_cast<std::size_t>(d)];
            dc.parameters += lp.parameters;
            if (lp.shared_from >= 0 && !on_device[static_cast<std::size_t>(d)][static_cast<std::size_t>(lp.shared_from)])
                dc.parameters += lp.shared_parameters;
            largest_layer[static_cast<std::size_t>(d)] = std::max(largest_layer[static_cast<std::size_t>(d)], lp.parameters + lp.shared_parameters);
        }
        // The repeated layers run once per round, the prologue and epilogue once. Under 3F1B
        // each round is a block of its own (the prologue and epilogue spread over them, so
        // the blocks sum to the work); otherwise the rounds share one block.
        e.chunk_forward[static_cast<std::size_t>(k)] =
            (f * share / c.tp + joins * tp_all_reduce) * rounds_per_block + f_once * share / c.tp / e.forward_blocks;
        e.chunk_backward[static_cast<std::size_t>(k)] = b * share / c.tp + joins * tp_all_reduce;
        activations[static_cast<std::size_t>(d)] +=
            sched.in_flight[static_cast<std::size_t>(k)] * kept * share * o.activation_bytes / c.tp;
    }
    // Interlaced: the embedding and head of every micro-batch (all replicas' samples) run on
    // all N devices, split by vocabulary: 1/N of their work, an all-reduce of the residual
    // stream over all devices forward (embedding) and backward (the head's input gradient);
    // each device keeps 1/N of their parameters (no gradient sync: nothing is replicated)
    // and activations: the embedding's for the micro-batches in flight on stage 0, the
    // head's for one.
    double interlaced_memory = 0;
    if (c.interlaced) {
        const int all = c.devices();
        const double micro_share = 1.0 / c.micro_batches;
        double work = 0, parameters = 0, kept = 0;
        for (int l : {ctx.prologue(), ctx.epilogue()}) {
            if (l < 0) continue;
            const layer_profile& lp = m.layers[static_cast<std::size_t>(l)];
            work += ctx.times(l).forward + ctx.times(l).backward;
            parameters += lp.parameters + (lp.shared_from == ctx.prologue() ? 0.0 : lp.shared_parameters);
            kept += lp.saved_elements * (l == ctx.prologue() ? sched.in_flight.front() : 1);
        }
        const double all_reduce =
            all > 1 ? exposed_time(collective_cost(hw, collective::all_reduce,
                                                   m.residual_elements * micro_share * o.activation_bytes, {all, 1}),
                                   {}, collective::all_reduce, {1.0, o.overlap.epsilon})
                    : 0.0;
        e.interlaced_per_micro_batch = work * micro_share / all + 2.0 * all_reduce;
        interlaced_memory = model_state_bytes(parameters / all, o.states, zero_stage::none, 1) +
                            kept * micro_share * o.activation_bytes / all;
    }
    e.feasible = true;
    for (int d = 0; d < c.pp; ++d) {
        device_cost& dc = e.devices[static_cast<std::size_t>(d)];
        const double local = dc.parameters / c.tp;
        const state_bytes s = o.states;
        const double buffers = c.zero == zero_stage::parameters ? 2.0 * largest_layer[static_cast<std::size_t>(d)] / c.tp * s.parameter : 0.0;
        dc.memory = memory_per_device(local, s, c.zero, c.dp, activation_profile{}, 0, plan::recompute_policy::none, buffers);
        dc.memory.activations = activations[static_cast<std::size_t>(d)];
        dc.memory.buffers += interlaced_memory + transient[static_cast<std::size_t>(d)];
        dc.transient = transient[static_cast<std::size_t>(d)];
        if (c.dp > 1) {
            const comm_time sync = collective_cost(hw, collective::all_reduce, local * s.gradient, {c.dp, c.tp});
            dc.exposed_communication = exposed_time({}, sync, collective::all_reduce, o.overlap);
            if (c.zero == zero_stage::parameters) {
                const comm_time gather = collective_cost(hw, collective::all_gather, local * s.parameter, {c.dp, c.tp});
                dc.exposed_communication +=
                    c.micro_batches * exposed_time(gather, gather, collective::all_gather, {1.0, o.overlap.epsilon});
            }
        }
        const double updated = c.zero == zero_stage::none ? local : local / c.dp;
        dc.optimizer = 2.0 * updated * (s.parameter + s.gradient + s.optimizer) / hw.device.memory_bandwidth;
        // A relative slack, so that the knapsack's sums and these agree on the boundary.
        if (dc.memory.total() > ctx.memory_cap() * (1 + 1e-12) && e.feasible) {
            e.feasible = false;
            e.why_infeasible = "pipeline device " + std::to_string(d) + " needs " +
                               std::to_string(dc.memory.total() / 1e9) + " GB, more than the " +
                               std::to_string(ctx.memory_cap() / 1e9) + " GB allowed";
        }
    }
    return e;
}

LOOM_INLINE double stage_message_time(const cost_context& ctx, const configuration& c) {
    if (c.pp == 1) return 0.0;
    const double bytes = ctx.model().residual_elements / (static_cast<double>(c.dp) * c.micro_batches) *
                         ctx.options().activation_bytes / c.tp;
    return collective_time(ctx.hardware(), collective::send_recv, bytes, {2, c.tp * c.dp});
}

LOOM_INLINE evaluation evaluate(cost_context& ctx, const configuration& c) {
    evaluation e = evaluate_without_pipeline(ctx, c);
    const auto& sched = ctx.schedule_orders(c.schedule, c.pp, c.chunks, c.micro_batches);
    // Interlaced blocks hold every device, so they add their time to every timeline.
    schedule::cost_model costs;
    costs.forward_per_stage = e.chunk_forward;
    costs.backward_per_stage = e.chunk_backward;
    costs.latency = stage_message_time(ctx, c);
    e.pipeline_time = schedule::simulate(sched.order, costs, {.validated = true, .makespan_only = true}).makespan +
                      c.micro_batches * e.interlaced_per_micro_batch;
    e.step_time = step_time_of(e, e.pipeline_time);
    if (!e.feasible) e.step_time = std::numeric_limits<double>::infinity();
    return e;
}

}  // namespace loom::search
#endif  // LOOM_HEADER_DEFINITIONS
