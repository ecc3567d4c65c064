#pragma once
// Memory per device: model states (parameters, gradients, optimizer states) under ZeRO or
// Megatron's distributed optimizer, activations under recomputation, and buffers.
//
// ZeRO (Rajbhandari et al., 2020, section 5) with Psi parameters, N_d-way data parallelism
// and K optimizer bytes per parameter (mixed-precision Adam: 2 + 2 + 12 bytes):
//   none                      (2 + 2 + K) * Psi
//   zero_stage::optimizer     2 Psi + 2 Psi + K Psi / N_d
//   zero_stage::gradients     2 Psi + (2 + K) Psi / N_d
//   zero_stage::parameters    (2 + 2 + K) Psi / N_d
// The paper's example, Psi = 7.5e9, N_d = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
// Sizes are in bytes; GB here means 1e9 bytes, as in the paper.
#include <cmath>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/plan/op_partition.hpp>
#include <loom/plan/recompute_policy.hpp>

namespace loom::search {

// One ZeRO stage for the plan and the searcher (plan/op_partition.hpp).
using plan::zero_stage;

// Bytes per parameter of each model state. `optimizer` is ZeRO's K: everything the
// optimizer step keeps besides the model's own parameter and gradient.
struct state_bytes {
    double parameter = 0;
    double gradient = 0;
    double optimizer = 0;
    double total() const { return parameter + gradient + optimizer; }

    friend bool operator==(const state_bytes&, const state_bytes&) = default;
};

// f16 parameters and gradients; f32 master parameters, momentum and variance (4+4+4).
inline constexpr state_bytes mixed_precision_adam() { return {2, 2, 12}; }
// f32 parameters and gradients; f32 momentum and variance (4+4).
inline constexpr state_bytes f32_adam() { return {4, 4, 8}; }

namespace detail {

inline std::string memory_number_text(double x) {
    std::ostringstream s;
    s << x;
    return s.str();
}

inline void check_non_negative(std::string_view where, std::string_view what, double x, std::string_view fix) {
    if (!(x >= 0) || !std::isfinite(x))
        throw usage_error(std::string(where) + ": " + std::string(what) + " is " + memory_number_text(x) + "; " +
                          std::string(fix));
}

inline void check_data_parallel(std::string_view where, int data_parallel) {
    if (data_parallel < 1)
        throw usage_error(std::string(where) + ": data_parallel is " + std::to_string(data_parallel) +
                          "; give the data-parallel degree, at least 1");
}

LOOM_INLINE void check_state_bytes(std::string_view where, const state_bytes& s);

// Model-state bytes (not per parameter) on one device; each state is divided by N_d from the
// stage that shards it.
LOOM_INLINE state_bytes model_state_split(double parameters, state_bytes s, zero_stage zero, int data_parallel);

}  // namespace detail

inline double model_state_bytes(double parameters, state_bytes s, zero_stage zero, int data_parallel) {
    return detail::model_state_split(parameters, s, zero, data_parallel).total();
}

// ---- Megatron-LM's distributed optimizer ---------------------------------------------
// Megatron-LM docs, "Distributed Optimizer": bytes per parameter
//                                  non-distributed   distributed (d-way data parallel)
//   f16 params, f16 grads                20              4 + 16/d
//   bf16 params, f32 grads               18              6 + 12/d
//   f32 params, f32 grads                16              8 +  8/d
// They arise from the components below. Megatron keeps f32 main gradients: a separate
// 4-byte copy when the model's gradients are f16; bf16 and f32 gradients are accumulated
// in f32 directly and are themselves the main gradients. Likewise an f32 main copy of the
// parameters exists only when the model's parameters are not f32. Adam adds m and v (4+4).
//   f16/f16:  param 2 + grad 2 | main grad 4 + main param 4 + m 4 + v 4 = 4 + 16 = 20
//   bf16/f32: param 2 + grad 4 | main param 4 + m 4 + v 4              = 6 + 12 = 18
//   f32/f32:  param 4 + grad 4 | m 4 + v 4                             = 8 +  8 = 16
// The distributed optimizer shards what is right of the bar over the d data-parallel ranks:
// ZeRO stage 1 with K = that part.
enum class megatron_precision { f16_params_f16_grads, bf16_params_f32_grads, f32_params_f32_grads };

inline constexpr state_bytes megatron_state_bytes(megatron_precision p) {
    const double param = p == megatron_precision::f32_params_f32_grads ? 4 : 2;
    const double grad = p == megatron_precision::f16_params_f16_grads ? 2 : 4;
    const double main_grad = grad == 4 ? 0 : 4;
    const double main_param = param == 4 ? 0 : 4;
    const double adam_moments = 4 + 4;
    return {param, grad, main_grad + main_param + adam_moments};
}

inline double megatron_bytes_per_parameter(megatron_precision p, bool distributed_optimizer, int data_parallel) {
    return model_state_bytes(1, megatron_state_bytes(p),
                             distributed_optimizer ? zero_stage::optimizer : zero_stage::none, data_parallel);
}

// ---- activations -----------------------------------------------------------------------
// What the backward pass keeps of one micro-batch on this device, under the plan's recompute
// policy (plan/recompute_policy.hpp; Korthikanti et al., 2022):
//   none       everything the forward saves
//   selective  all but the attention scores (softmax, its dropout mask, QK^T), which are
//              recomputed; the 5as/h term of that paper
//   full       only each layer's input; the layer is rerun in the backward
// The profile's figures come from the model (all layers of this device's stage together).
// Under full recomputation one layer's activations are rebuilt during its backward; that
// transient is not included here; count it in the buffers.

struct activation_profile {
    double saved_bytes_per_micro_batch = 0;             // without recomputation
    double layer_input_bytes_per_micro_batch = 0;       // kept under full recomputation
    double attention_scores_bytes_per_micro_batch = 0;  // dropped under selective recomputation
};

LOOM_INLINE double activation_bytes(const activation_profile& a, int in_flight, plan::recompute_policy r);

// ---- the whole device ------------------------------------------------------------------
struct memory_breakdown {
    double parameters = 0;
    double gradients = 0;
    double optimizer = 0;
    double activations = 0;
    double buffers = 0;  // communication buffers, workspaces, transients
    double total() const { return parameters + gradients + optimizer + activations + buffers; }
};

// `parameters` is the count held by this device before ZeRO sharding (after tensor and
// pipeline partitioning); `in_flight` the micro-batches whose activations it holds at once
// (1F1B: up to the number of pipeline stages on the first stage).
LOOM_INLINE memory_breakdown memory_per_device(double parameters, state_bytes s, zero_stage zero, int data_parallel,
                                               const activation_profile& activations, int in_flight, plan::recompute_policy r,
                                               double buffer_bytes);

}  // namespace loom::search

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::search::detail {

LOOM_INLINE void check_state_bytes(std::string_view where, const state_bytes& s) {
    const char* fix = "give bytes per parameter, e.g. mixed_precision_adam()";
    check_non_negative(where, "state_bytes.parameter", s.parameter, fix);
    check_non_negative(where, "state_bytes.gradient", s.gradient, fix);
    check_non_negative(where, "state_bytes.optimizer", s.optimizer, fix);
}

LOOM_INLINE state_bytes model_state_split(double parameters, state_bytes s, zero_stage zero, int data_parallel) {
    constexpr std::string_view where = "model_state_bytes";
    detail::check_non_negative(where, "parameters", parameters, "give the number of parameters on this device");
    detail::check_state_bytes(where, s);
    detail::check_data_parallel(where, data_parallel);
    const double d = data_parallel;
    const int stage = static_cast<int>(zero);
    return {.parameter = s.parameter * parameters / (stage >= 3 ? d : 1),
            .gradient = s.gradient * parameters / (stage >= 2 ? d : 1),
            .optimizer = s.optimizer * parameters / (stage >= 1 ? d : 1)};
}
}  // namespace loom::search::detail

namespace loom::search {

LOOM_INLINE double activation_bytes(const activation_profile& a, int in_flight, plan::recompute_policy r) {
    constexpr std::string_view where = "activation_bytes";
    const char* fix = "give bytes per micro-batch, at least 0";
    detail::check_non_negative(where, "saved_bytes_per_micro_batch", a.saved_bytes_per_micro_batch, fix);
    detail::check_non_negative(where, "layer_input_bytes_per_micro_batch", a.layer_input_bytes_per_micro_batch, fix);
    detail::check_non_negative(where, "attention_scores_bytes_per_micro_batch",
                               a.attention_scores_bytes_per_micro_batch, fix);
    for (const auto& [name, part] :
         {std::pair{"attention_scores_bytes_per_micro_batch", a.attention_scores_bytes_per_micro_batch},
          std::pair{"layer_input_bytes_per_micro_batch", a.layer_input_bytes_per_micro_batch}})
        if (part > a.saved_bytes_per_micro_batch)
            throw usage_error(std::string("activation_bytes: ") + name + " (" + detail::memory_number_text(part) +
                              ") exceeds saved_bytes_per_micro_batch (" +
                              detail::memory_number_text(a.saved_bytes_per_micro_batch) +
                              "), of which it is a part; check the activation profile");
    if (in_flight < 0)
        throw usage_error("activation_bytes: in_flight is " + std::to_string(in_flight) +
                          "; give the number of micro-batches whose activations are held at once, at least 0");
    double per_micro_batch = a.saved_bytes_per_micro_batch;
    switch (r) {
        case plan::recompute_policy::none: break;
        case plan::recompute_policy::selective: per_micro_batch -= a.attention_scores_bytes_per_micro_batch; break;
        case plan::recompute_policy::full: per_micro_batch = a.layer_input_bytes_per_micro_batch; break;
    }
    return per_micro_batch * in_flight;
}

LOOM_INLINE memory_breakdown memory_per_device(double parameters, state_bytes s, zero_stage zero, int data_parallel,
                                               const activation_profile& activations, int in_flight, plan::recompute_policy r,
                                               double buffer_bytes) {
    detail::check_non_negative("memory_per_device", "buffer_bytes", buffer_bytes, "give the buffer size in bytes");
    const state_bytes states = detail::model_state_split(parameters, s, zero, data_parallel);
    return {.parameters = states.parameter,
            .gradients = states.gradient,
            .optimizer = states.optimizer,
            .activations = activation_bytes(activations, in_flight, r),
            .buffers = buffer_bytes};
}

}  // namespace loom::search
#endif  // LOOM_HEADER_DEFINITIONS
