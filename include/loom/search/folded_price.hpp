#pragma once
// Folded prices: what a plan's programs cost on a large model and cluster, from the
// programs of small instances of the same plan. Materializing every device's program of a
// 96-layer model on 1024 GPUs takes minutes and tens of GiB; its devices and layers repeat.
//
//   search::model_family gpt{[](std::int64_t layers, std::int64_t batch) { ... forward graph ... },
//                            96, 1024};
//   search::folded_price f = search::price_folded(gpt, plan, search::dgx_a100(128));
//   f.price          the real plan's price, one entry per real device
//   f.describe()     which instances were priced
//
// Two foldings, both exact where their assumption holds:
// - Layers (TAPAS §4.3): the layers are cut into ranges (S stages, u chunks each under an
//   interleaved order, else 1); each range holds k layers, the smallest range's count, plus
//   its own extra (0 for every range of an even cut; uneven cuts, given or chosen by the
//   search, keep theirs). Instances with k = 4 and 6 (4u and 6u common layers per stage)
//   are priced, and every quantity (step, makespan, each device's compute, communication,
//   memory and optimizer step) is extrapolated linearly in k to the real one. Exact when
//   each further layer per range adds the same work to every range; the prologue and
//   epilogue (embedding, head) and each range's extra layers are in every instance.
// - Micro-batches: with GPipe, 1F1B, interleaved 1F1B or plain accumulation, instances of S
//   and 2S micro-batches (2 and 4 without a pipeline) of the real micro-batch size; with
//   the interlaced pipeline S + 2 and 2(S + 2), since the embedding and the head fill two
//   more stages. The step grows linearly with the micro-batches once they fill the
//   pipeline. Memory grows so under GPipe; otherwise the larger instance's memory is the
//   real one (in-flight micro-batches are bounded by the stages). 3F1B is priced in full.
// - Stages: a deep pipeline (more than 8 stages of an even cut, each on whole nodes or all
//   in one node, as many micro-batches as stages or more, an order whose micro-batches
//   fold) is priced at 4 and 8 stages of the same devices per stage and layers per stage,
//   each folded over its micro-batches as above, and extrapolated linearly in the stages.
//   The stages next to the first and the last take the instances' stages at the same index
//   or the same distance from the last (the embedding, the head, the activations in
//   flight); a stage in between is a line in its index through each instance's stages 1 and
//   S - 2 (under 1F1B the activations in flight fall by one micro-batch per stage, the
//   finish moves by one backward). Exact where every quantity is bilinear in the stage index
//   and the stage count (1F1B and GPipe at 32 stages on 1024 GPUs: equal to the unfolded
//   price). The interlaced pipeline cuts its ends over every device, so their share of
//   each falls as 1/S: a third instance of 16 stages fits that term (32 stages: within 0.3%).
// - Data-parallel replicas: an instance with at most 2 replicas of the same per-replica
//   batch stands for D of them. Replicas run the same programs; only their collectives grow.
//   Each instance device stands for its real device, and a transfer that crosses replicas is
//   priced over the whole real group (replica_fold in program_price.hpp), its placement over
//   nodes and the NICs it shares included. What the replicas shard (ZeRO-2 gradients,
//   ZeRO-3 parameters and their optimizer state) shrinks as 1/D: with ZeRO-2 or 3 and D > 4
//   an instance of 4 replicas is priced too, and memory and the optimizer step are
//   extrapolated linearly in 1/D.
// Layer, micro-batch and stage folding are extrapolations: tests hold them to a few percent of
// the full programs' price; replica folding is exact up to the loss's copies (tested).
// A plan folds when its layer-range selectors either cover every layer or none, and its data-parallel degree (the degree of its
// splits along Dim::Batch) is the same in every rule. Otherwise, or when the model is small
// enough, the instance is the real plan and the price exact.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/dim.hpp>
#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/graph.hpp>
#include <loom/partition/apply.hpp>
#include <loom/partition/piece_layout.hpp>
#include <loom/plan/resolve.hpp>
#include <loom/plan/rules.hpp>
#include <loom/search/hardware.hpp>
#include <loom/search/program_price.hpp>

namespace loom::search {

// A model at any depth and batch: its forward graph with `layers` repeats of `repeat` and a
// batch of `batch` samples. `layers` and `batch` are the real model's.
struct model_family {
    std::function<graph(std::int64_t layers, std::int64_t batch)> forward;
    std::int64_t layers = 0;
    std::int64_t batch = 0;
    std::string repeat = "blocks";

    graph real() const { return forward(layers, batch); }
};

struct folded_price {
    program_price price;                          // the real plan's: one device_price per real device
    std::int64_t layers_per_stage = 0;            // the real plan's: the layers every stage has (k per range)
    std::vector<std::int64_t> instance_layers;    // the same, of the instances priced
    std::vector<std::int64_t> instance_replicas;  // data-parallel replicas of the instances priced
    std::int64_t replicas = 1;                    // the real plan's
    std::vector<std::int64_t> instance_stages;    // pipeline stages of the instances priced
    std::int64_t stages = 1;                      // the real plan's
    // Micro-batches of the instances priced, one list per entry of instance_stages (a
    // pipeline fills with its stages' count of them).
    std::vector<std::vector<std::int64_t>> instance_micro_batches;
    std::int64_t micro_batches = 1;  // the real plan's
    bool exact() const {
        return instance_layers.size() == 1 && instance_layers.front() == layers_per_stage && instance_replicas.size() == 1 &&
               instance_replicas.front() == replicas && instance_stages == std::vector<std::int64_t>{stages} &&
               instance_micro_batches.size() == 1 && instance_micro_batches.front() == std::vector<std::int64_t>{micro_batches};
    }
    std::string describe() const;
};

// What folding reads from a plan with every open parameter chosen.
struct fold_shape {
    std::int64_t stages = 1;        // stages (1: no pipeline)
    std::int64_t chunk_layers = 1;  // layer ranges per stage (interleaved chunks)
    std::int64_t range_layers = 1;  // the smallest range's layers (k)
    std::vector<std::int64_t> range_extra;  // each range's layers beyond k (all 0: an even cut)
    bool cut_given = false;         // the plan states its ranges (boundaries given or open)
    std::int64_t replicas = 1;      // the data-parallel degree
    std::int64_t micro_batches = 1;
    bool layers_fold = true;        // selectors that cover every layer or none
    bool micro_batches_fold = true; // no pipeline, or GPipe, 1F1B, interleaved 1F1B or the interlaced pipeline
    bool interlaced = false;
    bool memory_grows_with_micro_batches = false;  // GPipe: every micro-batch's activations at once
    bool replicas_fold = true;      // one data-parallel degree in every rule
    bool stages_fold = false;       // equal ranges, layers and micro-batches that fold, micro-batches >= stages
};

// The stage counts of the instances that fold plan shape s (stages_fold): 4 and 8 for a
// pipeline of more than 8 stages; 4, 8 and 16 for an interlaced pipeline of more than 16
// stages that 16 divides (its ends' share of each device falls as 1/S, a third instance
// fits that term); the real count otherwise. Folding needs even ranges, selectors that
// cover every layer or none, an order whose micro-batches fold and at least as many
// micro-batches as stages (the interlaced pipeline: as its stages and the two ends): with
// fewer, the activations in flight stop growing with the stages, and the line through the
// instances would overshoot them. And it needs links that look the same at every stage count:
// each stage on whole nodes of topology t (every stage boundary, and the tied embedding's
// all-reduce between the first and the last stage, crosses nodes in the instances as in the
// real plan), or every one of the plan's `devices` in one node. Otherwise a boundary that
// runs inside a node in the instances crosses nodes in the real plan, and costs far more.
LOOM_INLINE std::vector<std::int64_t> instance_stages(const fold_shape& s, std::int64_t devices, const topology& t);

// The shape of the same plan cut into `stages` even stages of the same layers per range
// and devices per stage (an instance of stage folding).
LOOM_INLINE fold_shape with_stages(fold_shape s, std::int64_t stages);

LOOM_INLINE fold_shape shape_of(const plan::plan_spec& p, const model_family& m);

// The plan for an instance of shape s (the real plan's, or with_stages of it) with
// `replicas` data-parallel replicas, `micro_batches` micro-batches and `layers_per_stage`
// common layers per stage (one of instance_layers): the same rules, layer-range selectors
// over every layer of the instance, s's stages, the data-parallel degree and the devices
// they need, and ranges of k + their extra layers.
LOOM_INLINE plan::plan_spec instance_plan(const plan::plan_spec& p, const fold_shape& s, std::int64_t replicas,
                                          std::int64_t micro_batches, std::int64_t layers_per_stage);

// The micro-batches of the instances that fold plan shape s: the stages and twice as many
// (2 and 4 without a pipeline), or the real count when that is no more. The step of GPipe,
// 1F1B and interleaved 1F1B grows linearly with the micro-batches once they fill the
// pipeline. Memory grows so under GPipe; otherwise it is the larger instance's (1F1B keeps
// at most the stages' micro-batches in flight, accumulation one).
LOOM_INLINE std::vector<std::int64_t> instance_micro_batches(const fold_shape& s);

// The common layers per stage of the instances that fold plan shape s of model m: 4u and
// 6u (k = 4 and 6), or the real count when that is no more. Not fewer: with few layers per
// stage the peak of memory lies where the logits are, and the line through two such
// instances misses the layers' slope (a 3.6B GPT at TP 2 holds the same arena with 2 and 3
// layers, then grows 0.19 GiB per layer from 4 on).
LOOM_INLINE std::vector<std::int64_t> instance_layers(const model_family& m, const fold_shape& s);

// The real plan's common layers per stage (k u).
inline std::int64_t fold_layers_per_stage(const fold_shape& s) { return s.range_layers * s.chunk_layers; }

// The layers of the instance graph with `layers_per_stage` common layers per stage: every
// range's k, and the extra layers of the uneven ones.
inline std::int64_t instance_depth(const fold_shape& s, std::int64_t layers_per_stage) {
    std::int64_t extra = 0;
    for (std::int64_t e : s.range_extra) extra += e;
    return layers_per_stage * s.stages + extra;
}

// Whether plan p folds its data-parallel replicas: more than 2 of them, one degree in every
// rule, a batch they divide, and, when they shard gradients or parameters (ZeRO-2 or 3),
// more than 4 (the extrapolation in 1/D needs instances of 2 and 4).
LOOM_INLINE bool fold_replicas(const fold_shape& s, const model_family& m, const plan::plan_spec& p);

// The data-parallel replicas of the instances that price plan p: 2 where it folds them (and
// 4 too where ZeRO-2 or 3 shards over them), else its own.
LOOM_INLINE std::vector<std::int64_t> instance_replicas(const fold_shape& s, const model_family& m, const plan::plan_spec& p);

// The samples of one micro-batch of one replica: what every instance keeps. Throws
// plan_error when the replicas and micro-batches do not divide the batch.
LOOM_INLINE std::int64_t micro_batch_samples(const model_family& m, const fold_shape& s);

// The devices of the instance of shape s with `replicas` replicas: plan p's, scaled by the
// stages and the replicas that shape keeps of p's.
LOOM_INLINE std::int64_t instance_devices(const plan::plan_spec& p, const fold_shape& s, std::int64_t replicas);

// Where `real` lies on the line through the instances `at` (one or two of them): 0 at the
// first, 1 at the second.
inline double line_position(const std::vector<std::int64_t>& at, std::int64_t real) {
    return at.size() < 2 ? 0.0 : static_cast<double>(real - at[0]) / static_cast<double>(at[1] - at[0]);
}

// What price_folded materializes for plan p at one instance stage count: the op pieces of
// its largest instance (the most replicas, micro-batches and layers) and how many
// instances it prices there. A price's time and memory grow with the pieces it
// materializes (12 to 20 us and KB a piece), so these estimate its cost before it starts.
struct instance_pieces {
    std::int64_t stages = 1;
    std::int64_t largest = 0;
    std::int64_t instances = 1;
};
// The instance graph of `layers` layers and `batch` samples; a caller that keeps its instance
// graphs passes them, else each is built.
using instance_graph_function = std::function<const graph&(std::int64_t layers, std::int64_t batch)>;
LOOM_INLINE std::vector<instance_pieces> folded_instance_pieces(const model_family& m, const plan::plan_spec& p,
                                                                const cluster& c, const instance_graph_function& graph_of = {});
// Throws the plan_error that price_folded throws, before it materializes anything, for a
// plan whose largest instance at some stage count holds more than o.max_instance_pieces op
// pieces. The search's bound refuses such plans too, so that no descent moves to a plan
// that it cannot price.
LOOM_INLINE void check_instance_pieces(const model_family& m, const plan::plan_spec& p, const cluster& c,
                                       const price_options& o, const instance_graph_function& graph_of = {});

// The price of plan p (every open parameter chosen) for model m on cluster c, folded.
// Throws plan_error when the plan does not fit the model (more stages than it has
// layers, a cut out of range, ...), like plan::resolve.
LOOM_INLINE folded_price price_folded(const model_family& m, const plan::plan_spec& p, const cluster& c,
                                      const price_options& o = {});

}  // namespace loom::search

namespace loom::search::detail {

inline bool batch_split(const plan::split_spec& s) { return s.label.empty() && s.dim == Dim::Batch::id && !s.replicate; }

// One instance's price, spread over the real devices: real device x gets the price of the
// instance device that stands for it (itself, or its piece in the instance's last replica).
LOOM_INLINE program_price spread_over_real(const program_price& instance, const replica_fold* fold, int real_devices);

// The op pieces the programs of plan rp on graph g hold: each forward op's pieces (its
// micro-batches' too), every device's copy of an op the plan leaves whole.
inline std::int64_t op_pieces(const plan::resolved_plan& rp, const graph& g) {
    std::int64_t pieces = 0;
    for (std::size_t n = 0; n < g.nodes.size(); ++n) {
        const plan::op_partition* p = rp.at(static_cast<node_id>(n));
        pieces += p ? p->pieces() : rp.devices;
    }
    return pieces;
}

// a + (b - a) * t, field by field.
LOOM_INLINE program_price extrapolate(const program_price& a, const program_price& b, double t);

// The sum of devices' prices by their weights, field by field; no field below 0 (a line
// through two instances may cross it beyond them, a device cannot).
LOOM_INLINE device_price weighted_sum(const std::vector<std::pair<const device_price*, double>>& terms);

// The price of `stages` stages of `group` devices each from the prices of instances of
// the same group with stage_counts stages (at least 4 each, increasing): every field a
// combination of the instances' whose weights are exact for quantities of the form
// a + b S (two instances) or a + b S + c / S (three: the interlaced pipeline's ends are cut
// over every device, so their share of each falls as 1/S). A stage within S_min - 2 of the
// first combines the instances' stages at its index, one as near the last their stages at
// its distance from the last (S_min: the fewest stages of an instance); a stage between
// them combines each instance's line through its stages 1 and S - 2, taken at its index.
LOOM_INLINE program_price extend_stages(const std::vector<program_price>& instances, const std::vector<std::int64_t>& stage_counts,
                                        std::int64_t stages, std::int64_t group);

LOOM_INLINE std::optional<replica_fold> match_replicas(const plan::resolved_plan& instance, const plan::resolved_plan& real,
                                                       std::int64_t instance_replicas, std::int64_t real_replicas);

}  // namespace loom::search::detail

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS


namespace loom::search {

LOOM_INLINE std::string folded_price::describe() const {
    if (exact()) return "priced in full";
    auto list = [](const std::vector<std::int64_t>& v) {
        std::string s;
        for (auto x : v) s += (s.empty() ? "" : " and ") + std::to_string(x);
        return s;
    };
    std::string by_stages;
    for (std::size_t i = 0; i < instance_micro_batches.size(); ++i)
        by_stages += (i ? "; " : "") + list(instance_micro_batches[i]) +
                     (instance_stages.size() > 1 ? " at " + std::to_string(instance_stages.at(i)) : "");
    const std::string stages_text = instance_stages.size() > 1 ? list(instance_stages) + " stages (of " +
                                                                     std::to_string(stages) + "), "
                                                               : "";
    return "folded: instances of " + list(instance_layers) + " layers per stage (of " + std::to_string(layers_per_stage) +
           "), " + stages_text + by_stages + " micro-batches (of " + std::to_string(micro_batches) + ") and " +
           list(instance_replicas) + " data-parallel replicas (of " + std::to_string(replicas) + ")";
}

LOOM_INLINE fold_shape shape_of(const plan::plan_spec& p, const model_family& m) {
    fold_shape s;
    if (p.stages) {
        s.stages = plan::degree_value(p.stages->count, p, "the stage count");
        s.cut_given = !p.stages->boundaries.empty() || !p.stages->boundaries_open.empty();
    }
    if (const auto order = plan::detail::chosen_order(p)) {
        if (order->kind == plan::schedule_kind::interleaved) s.chunk_layers = order->virtual_stages;
        s.memory_grows_with_micro_batches = order->kind == plan::schedule_kind::gpipe;
        s.micro_batches_fold = order->kind == plan::schedule_kind::gpipe || order->kind == plan::schedule_kind::one_f_one_b ||
                               order->kind == plan::schedule_kind::interleaved ||
                               order->kind == plan::schedule_kind::interlaced;
        s.interlaced = order->kind == plan::schedule_kind::interlaced;
    }
    // The real ranges, as plan::resolve cuts them (its errors name the parts and the fix).
    const std::int64_t ranges = s.stages * s.chunk_layers;
    if (s.stages < 1 || s.chunk_layers < 1)
        throw plan_error("price_folded: " + std::to_string(s.stages) + " stages of " + std::to_string(s.chunk_layers) +
                         " chunks; use at least one of each");
    const std::vector<std::int64_t> starts =
        plan::detail::stage_starts(p.stages.value_or(plan::stage_spec{}), p.choices, m.layers, static_cast<int>(ranges));
    std::vector<std::int64_t> sizes;
    for (std::size_t r = 0; r < starts.size(); ++r) sizes.push_back((r + 1 < starts.size() ? starts[r + 1] : m.layers) - starts[r]);
    s.range_layers = *std::min_element(sizes.begin(), sizes.end());
    for (std::int64_t size : sizes) s.range_extra.push_back(size - s.range_layers);
    s.micro_batches = plan::degree_value(p.micro_batches, p, "the micro-batch count");
    for (const plan::rule& r : p.rules) {
        if (!r.on.repeat.empty() && !(r.on.first_layer == 0 && (r.on.last_layer < 0 || r.on.last_layer >= m.layers - 1)))
            s.layers_fold = false;
        if (!r.trans) continue;
        for (const plan::split_spec& split : *r.trans) {
            if (!detail::batch_split(split)) continue;
            const std::int64_t d = plan::degree_value(split.degree, p, "a data-parallel split");
            if (s.replicas > 1 && d != s.replicas) s.replicas_fold = false;
            s.replicas = std::max(s.replicas, d);
        }
    }
    bool even = true;  // given or chosen, a cut of equal ranges
    for (std::int64_t e : s.range_extra) even = even && e == 0;
    s.stages_fold = even && s.layers_fold && s.micro_batches_fold && p.devices % s.stages == 0 &&
                    s.micro_batches >= s.stages + (s.interlaced ? 2 : 0);
    return s;
}

LOOM_INLINE std::vector<std::int64_t> instance_stages(const fold_shape& s, std::int64_t devices, const topology& t) {
    const std::int64_t group = devices / s.stages;
    const bool same_links = devices <= t.devices_per_node || group % t.devices_per_node == 0;
    if (!s.stages_fold || !same_links) return {s.stages};
    // The interlaced pipeline's ends are cut over every device: stage counts that divide the
    // real one keep those cuts dividing what they cut.
    if (s.interlaced) return s.stages > 16 && s.stages % 16 == 0 ? std::vector<std::int64_t>{4, 8, 16} : std::vector{s.stages};
    return s.stages > 8 ? std::vector<std::int64_t>{4, 8} : std::vector{s.stages};
}

LOOM_INLINE fold_shape with_stages(fold_shape s, std::int64_t stages) {
    s.stages = stages;
    s.range_extra.assign(static_cast<std::size_t>(stages * s.chunk_layers), 0);
    return s;
}

LOOM_INLINE std::int64_t instance_devices(const plan::plan_spec& p, const fold_shape& s, std::int64_t replicas) {
    const std::int64_t real_stages = p.stages ? plan::degree_value(p.stages->count, p, "the stage count") : 1;
    return p.devices / real_stages * s.stages / s.replicas * replicas;
}

LOOM_INLINE std::vector<std::int64_t> instance_micro_batches(const fold_shape& s) {
    // Without a pipeline 2 and 4: one micro-batch has no gradients to accumulate. The
    // interlaced pipeline fills its stages and the embedding's and head's two more.
    const std::int64_t first = (s.stages > 1 ? s.stages : 2) + (s.interlaced ? 2 : 0);
    if (s.micro_batches_fold && s.micro_batches > 2 * first) return {first, 2 * first};
    return {s.micro_batches};
}

LOOM_INLINE plan::plan_spec instance_plan(const plan::plan_spec& p, const fold_shape& s, std::int64_t replicas,
                                          std::int64_t micro_batches, std::int64_t layers_per_stage) {
    plan::plan_spec out = p;
    bool uneven = s.cut_given;
    for (std::int64_t e : s.range_extra) uneven = uneven || e != 0;
    if (out.stages && uneven) {
        // Each range: the instance's k and the range's extra layers, as explicit boundaries.
        const std::int64_t k = layers_per_stage / s.chunk_layers;
        out.stages->boundaries.clear();
        std::int64_t next = 0;
        for (std::size_t r = 0; r + 1 < s.range_extra.size(); ++r) out.stages->boundaries.push_back(next += k + s.range_extra[r]);
        if (!out.stages->boundaries_open.empty()) out.choices.erase(out.stages->boundaries_open);
        out.stages->boundaries_open.clear();
    }
    // The instance's own values: an open parameter keeps its name (the plan's constraints
    // may read it) but not its range, which the real plan's value satisfies and the
    // instance's fewer micro-batches or replicas need not (a space narrowed to mb = 64).
    auto set = [&out](plan::degree_spec& d, std::int64_t value) {
        if (d.open.empty()) {
            d.value = value;
            return;
        }
        d.allowed.clear();
        out.choices[d.open] = value;
    };
    set(out.micro_batches, micro_batches);
    if (out.stages && plan::degree_value(out.stages->count, out, "the stage count") != s.stages) set(out.stages->count, s.stages);
    for (plan::rule& r : out.rules) {
        if (!r.on.repeat.empty()) r.on.last_layer = -1;  // every layer (shape_of checked they cover them all)
        if (!r.trans) continue;
        for (plan::split_spec& split : *r.trans)
            if (detail::batch_split(split)) set(split.degree, replicas);
    }
    out.devices = static_cast<int>(instance_devices(p, s, replicas));
    if (replicas != s.replicas) {
        if (out.stages) {
            plan::degree_spec& group = out.stages->devices_per_stage;
            const std::int64_t given = plan::degree_value(group, out, "the devices per stage");
            if (given > 0) set(group, given / s.replicas * replicas);
        }
    }
    return out;
}

LOOM_INLINE std::vector<std::int64_t> instance_layers(const model_family&, const fold_shape& s) {
    const std::int64_t u = s.chunk_layers;
    if (s.layers_fold && s.range_layers > 6) return {4 * u, 6 * u};
    return {fold_layers_per_stage(s)};
}

LOOM_INLINE std::int64_t micro_batch_samples(const model_family& m, const fold_shape& s) {
    if (m.batch % (s.replicas * s.micro_batches) != 0)
        throw plan_error("price_folded: a batch of " + std::to_string(m.batch) + " does not split into " +
                         std::to_string(s.replicas) + " replicas of " + std::to_string(s.micro_batches) +
                         " micro-batches; choose degrees whose product divides the batch");
    return m.batch / (s.replicas * s.micro_batches);
}

LOOM_INLINE bool fold_replicas(const fold_shape& s, const model_family& m, const plan::plan_spec& p) {
    if (!s.replicas_fold || s.replicas <= 2 || m.batch % s.replicas != 0) return false;
    return plan::detail::chosen_zero(p) < plan::zero_stage::gradients || s.replicas > 4;
}

LOOM_INLINE std::vector<std::int64_t> instance_replicas(const fold_shape& s, const model_family& m, const plan::plan_spec& p) {
    if (!fold_replicas(s, m, p)) return {s.replicas};
    if (plan::detail::chosen_zero(p) >= plan::zero_stage::gradients) return {2, 4};
    return {2};
}

LOOM_INLINE std::vector<instance_pieces> folded_instance_pieces(const model_family& m, const plan::plan_spec& p,
                                                                const cluster& c, const instance_graph_function& graph_of) {
    const fold_shape s = shape_of(p, m);
    const std::vector<std::int64_t> layer_counts = instance_layers(m, s), replica_counts = instance_replicas(s, m, p);
    const std::int64_t replicas = replica_counts.back();
    const std::int64_t samples = micro_batch_samples(m, s);
    std::vector<instance_pieces> out;
    for (std::int64_t stages : instance_stages(s, p.devices, c.topo)) {
        const fold_shape at = stages == s.stages ? s : with_stages(s, stages);
        const std::vector<std::int64_t> micro_batch_counts = instance_micro_batches(at);
        const std::int64_t micro_batches = micro_batch_counts.back(), layers = layer_counts.back();
        graph built;
        const std::int64_t depth = instance_depth(at, layers), batch = samples * replicas * micro_batches;
        const graph& g = graph_of ? graph_of(depth, batch) : (built = m.forward(depth, batch));
        out.push_back({stages, detail::op_pieces(plan::resolve(instance_plan(p, at, replicas, micro_batches, layers), g), g),
                       static_cast<std::int64_t>(replica_counts.size() * micro_batch_counts.size() * layer_counts.size())});
    }
    return out;
}

LOOM_INLINE void check_instance_pieces(const model_family& m, const plan::plan_spec& p, const cluster& c,
                                       const price_options& o, const instance_graph_function& graph_of) {
    if (o.max_instance_pieces <= 0) return;
    // The largest instance of each stage count: the most replicas, micro-batches and layers.
    const fold_shape s = shape_of(p, m);
    for (const instance_pieces& at : folded_instance_pieces(m, p, c, graph_of))
        if (at.largest > o.max_instance_pieces)
            throw plan_error("price_folded: its instance of " + std::to_string(at.stages) + " stages, " +
                             std::to_string(instance_micro_batches(at.stages == s.stages ? s : with_stages(s, at.stages)).back()) +
                             " micro-batches, " + std::to_string(instance_layers(m, s).back()) + " layers per stage and " +
                             std::to_string(instance_replicas(s, m, p).back()) + " replicas would hold " +
                             std::to_string(at.largest) + " op pieces, more than price_options::max_instance_pieces (" +
                             std::to_string(o.max_instance_pieces) +
                             ", 12 to 20 KB of memory each to materialize); raise the limit on a machine with the "
                             "memory, or price fewer pieces (a smaller Coshard factor, fewer micro-batches)");
}

LOOM_INLINE folded_price price_folded(const model_family& m, const plan::plan_spec& p, const cluster& c,
                                      const price_options& o) {
    if (!m.forward || m.layers < 1 || m.batch < 1)
        throw usage_error("price_folded: the model family needs a forward(layers, batch) builder and the real model's "
                          "layers and batch (both at least 1)");
    const fold_shape s = shape_of(p, m);
    folded_price out;
    out.replicas = s.replicas;
    out.layers_per_stage = fold_layers_per_stage(s);
    out.instance_layers = instance_layers(m, s);
    out.instance_replicas = instance_replicas(s, m, p);
    out.stages = s.stages;
    out.instance_stages = instance_stages(s, p.devices, c.topo);
    out.micro_batches = s.micro_batches;
    const std::int64_t samples = micro_batch_samples(m, s);  // each micro-batch and replica keeps the real plan's
    auto along = [](const std::vector<program_price>& points, const std::vector<std::int64_t>& at, std::int64_t real) {
        return points.size() == 1 ? points.front() : detail::extrapolate(points[0], points[1], line_position(at, real));
    };
    const auto cancelled = [&o] {
        if (o.cancel && o.cancel->load(std::memory_order_relaxed)) throw price_cancelled();
    };

    cancelled();
    check_instance_pieces(m, p, c, o);

    // One price per instance stage count, over its devices with every real replica.
    std::vector<program_price> per_stages;
    for (std::int64_t stages : out.instance_stages) {
        const fold_shape at = stages == s.stages ? s : with_stages(s, stages);
        const auto real_devices = static_cast<int>(instance_devices(p, at, s.replicas));
        const std::vector<std::int64_t>& micro_batch_counts = out.instance_micro_batches.emplace_back(instance_micro_batches(at));
        // priced[r][b][k]: the instance with instance_replicas[r] replicas,
        // micro_batch_counts[b] micro-batches and instance_layers[k] layers per stage.
        std::vector<std::vector<std::vector<program_price>>> priced(out.instance_replicas.size());
        for (std::size_t r = 0; r < out.instance_replicas.size(); ++r) {
            const std::int64_t replicas = out.instance_replicas[r];
            for (std::int64_t micro_batches : micro_batch_counts) {
                auto& row = priced[r].emplace_back();
                for (std::int64_t layers : out.instance_layers) {
                    cancelled();
                    const plan::plan_spec instance = instance_plan(p, at, replicas, micro_batches, layers);
                    const graph g = m.forward(instance_depth(at, layers), samples * replicas * micro_batches);
                    const plan::resolved_plan resolved = plan::resolve(instance, g);
                    std::optional<replica_fold> fold;
                    if (replicas != s.replicas) {
                        const graph real_shape = m.forward(instance_depth(at, layers), samples * s.replicas * micro_batches);
                        const plan::resolved_plan real =
                            plan::resolve(instance_plan(p, at, s.replicas, micro_batches, layers), real_shape);
                        // The real replicas' pieces must fit the real devices before they are
                        // matched to the instance's: the same checks, and refusals, as applying
                        // the plan in full.
                        std::vector<std::string> notes;
                        for (std::size_t n = 0; n < real.forward.size(); ++n)
                            if (const plan::op_partition* part = real.at(static_cast<node_id>(n)))
                                (void)partition::bind_partition(real_shape.nodes[n], *part, real_devices, true, notes);
                        cancelled();
                        fold = detail::match_replicas(resolved, real, replicas, s.replicas);
                        if (!fold)
                            throw plan_error("price_folded: the plan's data-parallel pieces do not line up across replicas "
                                             "(a device holds pieces of different replicas); price it unfolded");
                    }
                    price_options io = o;
                    io.fold = fold ? &*fold : nullptr;
                    io.record_timeline = false;
                    partition::apply_options ao;
                    ao.cancel = o.cancel;
                    std::optional<partition::partitioned_graph> programs;
                    try {
                        programs.emplace(partition::apply_plan(g, resolved, ao));
                    } catch (const partition::apply_cancelled&) {
                        throw price_cancelled();
                    }
                    cancelled();
                    row.push_back(detail::spread_over_real(price_programs(*programs, c, io), io.fold, real_devices));
                }
            }
        }
        // Along the layers, then the micro-batches, then 1/D for what the replicas shard.
        std::vector<program_price> per_replicas;
        for (const auto& by_micro_batches : priced) {
            std::vector<program_price> at_depth;
            for (const auto& by_layers : by_micro_batches)
                at_depth.push_back(along(by_layers, out.instance_layers, out.layers_per_stage));
            program_price at_micro_batches = along(at_depth, micro_batch_counts, s.micro_batches);
            if (!s.memory_grows_with_micro_batches)  // the most micro-batches priced hold what all of them do
                for (std::size_t d = 0; d < at_micro_batches.devices.size(); ++d)
                    at_micro_batches.devices[d].memory = at_depth.back().devices[d].memory;
            per_replicas.push_back(std::move(at_micro_batches));
        }
        program_price price = per_replicas.front();
        if (per_replicas.size() == 2) {
            // value(1/D) through (1/2, two) and (1/4, four): t = (1/D - 1/2) / (1/4 - 1/2).
            const double t = (1.0 / static_cast<double>(s.replicas) - 0.5) / (0.25 - 0.5);
            const program_price sharded = detail::extrapolate(per_replicas[0], per_replicas[1], t);
            double after = 0;
            for (std::size_t d = 0; d < price.devices.size(); ++d) {
                price.devices[d].memory = sharded.devices[d].memory;
                price.devices[d].optimizer = sharded.devices[d].optimizer;
                price.devices[d].gathers = sharded.devices[d].gathers;
                after = std::max(after, sharded.devices[d].optimizer + sharded.devices[d].gathers);
            }
            price.step_seconds = price.makespan + after;
        }
        per_stages.push_back(std::move(price));
    }
    out.price = per_stages.size() == 1 ? std::move(per_stages.front())
                                       : detail::extend_stages(per_stages, out.instance_stages, s.stages, p.devices / s.stages);
    return out;
}

}  // namespace loom::search

namespace loom::search::detail {

LOOM_INLINE program_price spread_over_real(const program_price& instance, const replica_fold* fold, int real_devices) {
    if (!fold) return instance;
    program_price out = instance;
    out.devices.assign(static_cast<std::size_t>(real_devices), device_price{});
    std::vector<bool> seen(static_cast<std::size_t>(real_devices), false);
    for (std::size_t f = 0; f < fold->family.size(); ++f)
        for (std::size_t r = 0; r < fold->family[f].size(); ++r) {
            const int instance_replica = static_cast<int>(std::min<std::size_t>(r, static_cast<std::size_t>(fold->instance_replicas - 1)));
            if (fold->replica[f] != instance_replica) continue;
            const auto x = static_cast<std::size_t>(fold->family[f][r]);
            out.devices.at(x) = instance.devices[f];
            seen[x] = true;
        }
    for (std::size_t x = 0; x < seen.size(); ++x)
        if (!seen[x])
            throw error("price_folded: real device " + std::to_string(x) +
                        " stands for no instance device; the plan's data-parallel pieces do not cover every device, so "
                        "it cannot fold its replicas (price it unfolded)");
    return out;
}

LOOM_INLINE device_price weighted_sum(const std::vector<std::pair<const device_price*, double>>& terms) {
    device_price z;
    double instructions = 0;
    for (const auto& [x, w] : terms) {
        z.compute += w * x->compute;
        z.communication += w * x->communication;
        z.finish += w * x->finish;
        z.optimizer += w * x->optimizer;
        z.gathers += w * x->gathers;
        instructions += w * static_cast<double>(x->instructions);
        z.memory.bound += w * x->memory.bound;
        z.memory.arena += w * x->memory.arena;
        z.memory.optimizer += w * x->memory.optimizer;
        z.memory.runtime += w * x->memory.runtime;
    }
    for (double* f : {&z.compute, &z.communication, &z.finish, &z.optimizer, &z.gathers, &z.memory.bound, &z.memory.arena,
                      &z.memory.optimizer, &z.memory.runtime})
        *f = std::max(0.0, *f);
    z.instructions = std::max<std::int64_t>(0, std::llround(instructions));
    return z;
}

// The step of a price whose makespan and devices are set: the slowest device's step after
// the programs, or the line through the instances' steps when the optimizer is not what
// separates them (devices sharing one machine's compute add work terms price_programs
// states in step_seconds).
inline void settle_step(program_price& out, double step_line) {
    double after = 0;
    for (const device_price& z : out.devices) after = std::max(after, z.optimizer + z.gathers);
    out.step_seconds = std::max(step_line, out.makespan + after);
}

LOOM_INLINE program_price extrapolate(const program_price& a, const program_price& b, double t) {
    auto line = [t](double x, double y) { return x + (y - x) * t; };
    program_price out;
    out.makespan = line(a.makespan, b.makespan);
    out.transfers = std::llround(line(static_cast<double>(a.transfers), static_cast<double>(b.transfers)));
    out.transfer_seconds = line(a.transfer_seconds, b.transfer_seconds);
    out.devices.resize(a.devices.size());
    for (std::size_t d = 0; d < a.devices.size(); ++d) out.devices[d] = weighted_sum({{&a.devices[d], 1 - t}, {&b.devices.at(d), t}});
    settle_step(out, line(a.step_seconds, b.step_seconds));
    return out;
}

LOOM_INLINE program_price extend_stages(const std::vector<program_price>& instances, const std::vector<std::int64_t>& stage_counts,
                                        std::int64_t stages, std::int64_t group) {
    const std::size_t n = instances.size();
    bool usable = (n == 2 || n == 3) && stage_counts.size() == n;
    for (std::size_t j = 0; usable && j < n; ++j)
        usable = stage_counts[j] >= 4 && (j == 0 || stage_counts[j] > stage_counts[j - 1]) &&
                 static_cast<std::int64_t>(instances[j].devices.size()) == stage_counts[j] * group;
    if (!usable)
        throw error("price_folded: stage folding needs two or three instances of at least 4 stages, increasing, each of " +
                    std::to_string(group) + " devices per stage");
    // The weights: solve sum_j w_j f(s_j) = f(stages) for f in 1, S (, 1/S), by elimination.
    std::vector<std::vector<double>> system(n, std::vector<double>(n + 1));
    auto basis = [](std::size_t row, double x) { return row == 0 ? 1.0 : row == 1 ? x : 1.0 / x; };
    for (std::size_t row = 0; row < n; ++row) {
        for (std::size_t j = 0; j < n; ++j) system[row][j] = basis(row, static_cast<double>(stage_counts[j]));
        system[row][n] = basis(row, static_cast<double>(stages));
    }
    for (std::size_t c = 0; c < n; ++c) {
        std::size_t pivot = c;
        for (std::size_t r = c + 1; r < n; ++r)
            if (std::abs(system[r][c]) > std::abs(system[pivot][c])) pivot = r;
        std::swap(system[c], system[pivot]);
        for (std::size_t r = 0; r < n; ++r) {
            if (r == c) continue;
            const double f = system[r][c] / system[c][c];
            for (std::size_t k = c; k <= n; ++k) system[r][k] -= f * system[c][k];
        }
    }
    std::vector<double> w(n);
    for (std::size_t j = 0; j < n; ++j) w[j] = system[j][n] / system[j][j];

    program_price out;
    double makespan = 0, transfers = 0, step = 0;
    for (std::size_t j = 0; j < n; ++j) {
        makespan += w[j] * instances[j].makespan;
        transfers += w[j] * static_cast<double>(instances[j].transfers);
        out.transfer_seconds += w[j] * instances[j].transfer_seconds;
        step += w[j] * instances[j].step_seconds;
    }
    out.makespan = makespan;
    out.transfers = std::llround(transfers);
    out.devices.resize(static_cast<std::size_t>(stages * group));
    auto at = [group](const program_price& p, std::int64_t stage, std::int64_t k) {
        return &p.devices[static_cast<std::size_t>(stage * group + k)];
    };
    std::vector<std::pair<const device_price*, double>> terms;
    for (std::int64_t i = 0; i < stages; ++i)
        for (std::int64_t k = 0; k < group; ++k) {
            terms.clear();
            // Stages near the ends: each instance's stage at the same index from the first,
            // or at the same distance from the last (where the activations in flight are
            // those of the real stage). Exact as the line is, and closer where the arena's
            // packing is not quite linear.
            const std::int64_t from_end = stages - 1 - i, near = stage_counts.front() - 2;
            for (std::size_t j = 0; j < n; ++j) {
                const program_price& p = instances[j];
                const std::int64_t s = stage_counts[j];
                if (i < near || from_end < near) {
                    terms.push_back({at(p, i < near ? i : s - 1 - from_end, k), w[j]});
                    continue;
                }
                // Stage i's place on the instance's line through its stages 1 and S - 2.
                const double u = static_cast<double>(i - 1) / static_cast<double>(s - 3);
                terms.push_back({at(p, 1, k), w[j] * (1 - u)});
                terms.push_back({at(p, s - 2, k), w[j] * u});
            }
            out.devices[static_cast<std::size_t>(i * group + k)] = weighted_sum(terms);
        }
    settle_step(out, step);
    return out;
}

LOOM_INLINE std::optional<replica_fold> match_replicas(const plan::resolved_plan& instance, const plan::resolved_plan& real,
                                                       std::int64_t instance_replicas, std::int64_t real_replicas) {
    replica_fold fold;
    fold.instance_replicas = static_cast<int>(instance_replicas);
    fold.real_replicas = static_cast<int>(real_replicas);
    fold.real.assign(static_cast<std::size_t>(instance.devices), -1);
    fold.replica.assign(static_cast<std::size_t>(instance.devices), -1);
    fold.family.assign(static_cast<std::size_t>(instance.devices), {});
    for (std::size_t n = 0; n < instance.forward.size() && n < real.forward.size(); ++n) {
        const plan::op_partition* a = instance.at(static_cast<node_id>(n));
        const plan::op_partition* b = real.at(static_cast<node_id>(n));
        if (!a || !b || a->splits.size() != b->splits.size() || a->replicas != b->replicas) continue;
        // The data-parallel axis: the batch split after the micro-batch split, whose degree
        // is the replica count in each plan.
        const std::size_t first = n < instance.micro_split.size() && instance.micro_split[n] ? 1 : 0;
        std::optional<std::size_t> axis;
        for (std::size_t i = first; i < a->splits.size(); ++i)
            if (a->splits[i].cuts() && a->splits[i].dim == Dim::Batch::id && a->splits[i].degree == instance_replicas &&
                b->splits[i].degree == real_replicas) {
                axis = i;
                break;
            }
        if (!axis) continue;
        auto piece_of = [&](const std::vector<std::int64_t>& coords) {
            std::int64_t k = 0;
            for (std::size_t i = 0; i < b->splits.size(); ++i) k = k * b->splits[i].degree + coords[i];
            return k * b->replicas + coords.back();
        };
        for (std::int64_t k = 0; k < a->pieces(); ++k) {
            const auto d = static_cast<std::size_t>(a->device_of(k));
            if (d >= fold.real.size()) return std::nullopt;  // more pieces than the instance has devices
            std::vector<std::int64_t> coords = a->coordinates(k);
            const int real_device = b->device_of(piece_of(coords));
            if (fold.real[d] >= 0) {
                if (fold.real[d] != real_device || fold.replica[d] != coords[*axis]) return std::nullopt;
                continue;
            }
            fold.real[d] = real_device;
            fold.replica[d] = static_cast<int>(coords[*axis]);
            for (std::int64_t r = 0; r < real_replicas; ++r) {
                coords[*axis] = r;
                fold.family[d].push_back(b->device_of(piece_of(coords)));
            }
        }
    }
    for (std::size_t d = 0; d < fold.real.size(); ++d)
        if (fold.real[d] < 0) return std::nullopt;
    return fold;
}

}  // namespace loom::search::detail
#endif  // LOOM_HEADER_DEFINITIONS
