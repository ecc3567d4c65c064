#pragma once
// The parameters a plan may leave open, and one point of that space.
//
//   configuration: tensor-parallel degree (innermost, within a node), pipeline stages,
//   data-parallel degree (the rest of the devices), micro-batches, ZeRO stage, schedule
//   (GPipe, 1F1B, interleaved 1F1B with v chunks per device), how many repeated layers
//   each pipeline chunk holds, a recompute choice per repeated layer, and whether the
//   embedding and head are interlaced (on all devices) or on the end stages.
//
//   search_space: the candidates for each parameter; an empty list means "every value
//   that fits" (TP: powers of two up to a node that divide the model's tp_granularity;
//   stages: powers of two up to the number of repeated layers; micro-batches: powers of
//   two dividing the batch of one replica).
//
// Devices are numbered node-major and the degrees nest TP, then DP, then PP (Megatron's
// order): the TP group of a device is contiguous, its DP group has stride tp, and
// consecutive pipeline stages are tp * dp devices apart.
#include <string>
#include <vector>

#include <loom/plan/op_order.hpp>
#include <loom/search/memory.hpp>

namespace loom::search {

// three_f_one_b: nnScaler's 3F1B for models with three forward rounds (recycling); the
// searcher offers it only for such models, and only it when they are pipelined.
struct configuration {
    int tp = 1;
    int pp = 1;
    int dp = 1;
    int micro_batches = 1;
    int chunks = 1;  // pipeline chunks per device: 1, or v for the interleaved schedule
    zero_stage zero = zero_stage::none;
    plan::schedule_kind schedule = plan::schedule_kind::one_f_one_b;
    std::vector<int> layers_per_chunk;  // repeated layers in each of the pp * chunks chunks
    std::vector<plan::recompute_policy> recompute_of;  // per repeated layer
    // The interlaced pipeline (nnScaler Figure 6): the ops before the first layer and after
    // the last (embedding, LM head, loss) run on all devices, split by vocabulary, time-shared
    // with the pipeline of the layers, instead of on the first and last stage.
    bool interlaced = false;
    // Coshard (nnScaler Figure 5): every recomputed layer's ops split into this many more
    // pieces, colocated on each device and run one after another, so that recomputing a layer
    // holds 1/coshard of its intermediates at a time. It changes no communication (the
    // colocated pieces share a device) and, in this model, no time: recomputation already
    // pays the second forward.
    int coshard = 1;

    int devices() const { return tp * pp * dp; }
    // The pipeline device (0..pp-1) chunk c runs on.
    int device_of_chunk(int c) const { return c % pp; }
};

struct search_space {
    std::vector<int> tp;
    std::vector<int> pp;
    std::vector<int> micro_batches;
    std::vector<zero_stage> zero{zero_stage::none, zero_stage::optimizer, zero_stage::gradients,
                                 zero_stage::parameters};
    std::vector<plan::schedule_kind> schedules{plan::schedule_kind::gpipe, plan::schedule_kind::one_f_one_b,
                                         plan::schedule_kind::interleaved, plan::schedule_kind::three_f_one_b};
    std::vector<plan::recompute_policy> recompute_choices{plan::recompute_policy::none, plan::recompute_policy::selective, plan::recompute_policy::full};
    std::vector<bool> interlaced{false};  // add true to consider the interlaced pipeline
    std::vector<int> coshard{1};          // Coshard factors to consider, e.g. {1, 2, 4, 8}
    int interleave_chunks = 2;            // v of the interleaved schedule
    bool search_stage_boundaries = false;  // false: layers split evenly over chunks
    int boundary_slack = 0;  // with boundaries searched: each chunk within this many layers of
                             // the even share (0: any positive count; the count of splits grows
                             // as C(layers - 1, chunks - 1))
    int max_tp = 0;                        // 0: the devices of one node
};

}  // namespace loom::search
