#pragma once
// The well-known plans, each written only with the primitives: rules that split
// (op-trans), place (op-assign) and recompute selected ops, plus the ZeRO rewrites (an
// identity after each parameter or on each gradient, split over the data-parallel
// devices). Nothing here is a special code path: a user can write any of them by hand.
//
// A vocabulary that the tensor-parallel degree does not divide (GPT-2's 50257, any prime) is
// split into near-equal pieces (97 rows over 2 devices: 49 and 48; plan::piece_begin): the
// embedding table, the LM head and the vocabulary-parallel loss alike. Megatron pads the
// vocabulary to a multiple of the degree and lets the padding logits into the softmax; here
// no padding row exists, so training equals one device with the model's own vocabulary, and
// parameters, gradients and checkpoints keep its shapes. Every other dim must divide.
//
// Layer names follow loom's transformer models (models/gpt.hpp): "<repeat>.<i>.attn.{q,k,v,
// proj}", "<repeat>.<i>.mlp.{fc,proj}", layer norms "ln_*". Models that name their layers
// otherwise pass their own transformer_names.
#include <cstdint>
#include <string>
#include <vector>

#include <loom/core/linkage.hpp>
#include <loom/ops/all.hpp>
#include <loom/plan/op_order.hpp>
#include <loom/plan/recompute_policy.hpp>
#include <loom/plan/rules.hpp>

namespace loom::plan::presets {

// Where the parts of a transformer block are, as scope globs.
struct transformer_names {
    std::vector<std::string> column = {"*.attn.q", "*.attn.k", "*.attn.v", "*.mlp.fc"};  // split outputs
    std::vector<std::string> row = {"*.attn.proj", "*.mlp.proj"};                        // split inputs
    std::string attention = "*.attn";  // split_heads, attention, merge_heads: split heads
    std::string mlp = "*.mlp";         // the activation between fc and proj: split FFN
};

namespace detail {

inline split_spec split_dim(dim_id d, degree_spec n) { return {d, "", std::move(n), false}; }
inline split_spec split_var(std::string label, degree_spec n) { return {{}, std::move(label), std::move(n), false}; }
inline split_spec replicate(degree_spec n) { return {{}, "", std::move(n), true}; }
inline split_spec split_dim(dim_id d, std::int64_t n) { return split_dim(d, degree_spec{n, "", {}}); }
inline split_spec split_var(std::string label, std::int64_t n) { return split_var(std::move(label), degree_spec{n, "", {}}); }
inline split_spec replicate(std::int64_t n) { return replicate(degree_spec{n, "", {}}); }

LOOM_INLINE selector kinds(std::vector<const op_def*> k, std::string scope = {});
inline selector in_scope(std::string scope) {
    selector s;
    s.scope = std::move(scope);
    return s;
}

// trans rule: the data-parallel split (if any: open, or more than 1) first, then `inner`.
LOOM_INLINE rule trans(selector on, const degree_spec& dp, std::vector<split_spec> inner, std::string origin);
inline rule trans(selector on, std::int64_t dp, std::vector<split_spec> inner, std::string origin) {
    return trans(std::move(on), degree_spec{dp, "", {}}, std::move(inner), std::move(origin));
}

// The parts of a transformer block that tensor parallelism cuts, each with its split over
// tp: column-parallel q, k, v and fc (outputs), row-parallel projections (inputs), the
// attention between them (heads) and the MLP's activation (FFN).
struct block_part {
    selector on;
    split_spec split;
};
LOOM_INLINE std::vector<block_part> block_parts(const degree_spec& tp, const transformer_names& names);

// Coshard's op-assign: c pieces of each device's share, one after another on the device.
inline assign_spec coshard_assign(const degree_spec& c) {
    assign_spec a;
    a.colocate = c;
    a.coshard = true;
    return a;
}

// Vocabulary-parallel embeddings (each device holds rows of the table; partial sums), the LM
// head (a linear outside any layer) split along the vocabulary, and the vocabulary-parallel
// cross-entropy (rebuilt by the transformation registered for its v: each device reduces its
// slice of the logits; no device gathers them). Any degree up to the vocabulary's size: the
// slices are near-equal where it does not divide.
LOOM_INLINE plan_spec vocabulary_rules(const degree_spec& tp, const degree_spec& dp, const std::string& origin);

}  // namespace detail

// Every op split along the batch over n devices; weights replicated, gradients all-reduced.
LOOM_INLINE plan_spec data_parallel(int n);

// Megatron tensor parallelism over tp devices (times dp data-parallel replicas on a
// dp x tp mesh, device = d * tp + t): column-parallel q, k, v and fc, heads and FFN split
// in between, row-parallel output projections (partial sums, all-reduced), a
// vocabulary-parallel embedding, the LM head split along the vocabulary and a
// vocabulary-parallel cross-entropy over its logits (near-equal slices of a vocabulary tp
// does not divide). Everything else (layer norms, residual adds) is replicated within the
// tensor-parallel group; heads and FFN must divide by tp.
// The same with either degree open: megatron({1, "tp", {}}, {1, "dp", {}}) leaves both to
// the searcher (plan/spaces.hpp); the plan's devices are then the caller's to set.
LOOM_INLINE plan_spec megatron(const degree_spec& tp, const degree_spec& dp, const transformer_names& names = {});

inline plan_spec megatron(int tp, int dp = 1, const transformer_names& names = {}) {
    return megatron(degree_spec{tp, "", {}}, degree_spec{dp, "", {}}, names);
}

// The embedding, the LM head and the loss split by vocabulary over n devices (Megatron's
// vocabulary parallelism alone; the interlaced pipeline runs them so on every device).
LOOM_INLINE plan_spec vocabulary_parallel(int n);

// A pipeline of `stages` device groups, each cut by `inner` (a plan for one group: its
// devices are the group's size): the layers of "blocks" split evenly over the stages,
// every op cut into `micro_batches` along the batch, and the blocks ordered by `order`.
//   presets::pipeline(2, 4, {plan::schedule_kind::one_f_one_b}, presets::megatron(2))   // 4 devices
LOOM_INLINE plan_spec pipeline(int stages, int micro_batches, order_policy order = {schedule_kind::one_f_one_b},
                               plan_spec inner = {});

// Megatron's sequence parallelism: as megatron(), and the ops that Megatron replicates
// (layer norms, residual adds, dropout) are split along the sequence instead. The
// all-reduces around the blocks become reduce-scatters and all-gathers.
LOOM_INLINE plan_spec sequence_parallel(int tp, int dp = 1, const transformer_names& names = {});

// ZeRO over n data-parallel devices: stage 1 shards optimizer state, 2 also gradients,
// 3 also parameters (each device stores 1/n of every weight and gathers it when used).
LOOM_INLINE plan_spec zero(int stage, int n);

// Recompute the selected ops' outputs in the backward pass instead of keeping them.
inline plan_spec recompute(selector on) {
    plan_spec p;
    p.add({std::move(on), std::nullopt, std::nullopt, true, "recompute", false});
    return p;
}

// A recompute policy (plan/recompute_policy.hpp) for layers first..last (inclusive; last < 0:
// to the end) of `repeat`: selective recomputes their attention cores (the ops::Attention
// ops), full every op of the layers; none adds no rule.
//   plan.then(presets::recompute_layers(recompute_policy::full, 0, 11))
LOOM_INLINE plan_spec recompute_layers(recompute_policy r, std::int64_t first_layer, std::int64_t last_layer,
                                       std::string repeat = "blocks");

// Coshard: the attention and MLP of the selected layers split into tp * c pieces, c of
// them colocated on each of tp devices and run one after another, with recompute, so that
// a device holds the activations of one piece at a time. Other ops replicate over the tp
// devices (as in megatron()). Either number may be open.
LOOM_INLINE plan_spec coshard(const degree_spec& tp, const degree_spec& c, const transformer_names& names = {});

inline plan_spec coshard(int tp, int c, const transformer_names& names = {}) {
    return coshard(degree_spec{tp, "", {}}, degree_spec{c, "", {}}, names);
}

// Coshard as op-assign alone, over a plan that already splits the layers (megatron()): the
// attention and MLP pieces of every layer cut c times more, c on each device, one after
// another. Colocated pieces must recompute (the plan's colocation_requires_recompute), so
// with c open beside an open recompute choice the search refuses c > 1 without recompute.
//   presets::megatron(open_tp, open_dp).then(presets::coshard_layers({1, "coshard", {1, 2, 4}}))
LOOM_INLINE plan_spec coshard_layers(const degree_spec& c, const transformer_names& names = {});

}  // namespace loom::plan::presets

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::plan::presets::detail {

LOOM_INLINE selector kinds(std::vector<const op_def*> k, std::string scope) {
    selector s;
    s.kinds = std::move(k);
    s.scope = std::move(scope);
    return s;
}

LOOM_INLINE rule trans(selector on, const degree_spec& dp, std::vector<split_spec> inner, std::string origin) {
    std::vector<split_spec> splits;
    if (dp.value > 1 || !dp.open.empty()) splits.push_back(split_dim(Dim::Batch::id, dp));
    for (auto& s : inner) splits.push_back(std::move(s));
    // A preset is a recipe for many models: a part some model lacks is not a mistake.
    return {std::move(on), std::move(splits), std::nullopt, std::nullopt, std::move(origin), true};
}

LOOM_INLINE std::vector<block_part> block_parts(const degree_spec& tp, const transformer_names& names) {
    std::vector<block_part> parts;
    for (const auto& c : names.column) parts.push_back({in_scope(c), split_var("n", tp)});
    for (const auto& r : names.row) parts.push_back({in_scope(r), split_var("k", tp)});
    parts.push_back({kinds({&op_def_of<ops::SplitHeads>(), &op_def_of<ops::Attention>(), &op_def_of<ops::MergeHeads>()},
                           names.attention),
                     split_dim(Dim::Head::id, tp)});
    parts.push_back({kinds({&op_def_of<ops::Gelu>(), &op_def_of<ops::Relu>(), &op_def_of<ops::Silu>(), &op_def_of<ops::Mul>()},
                           names.mlp),
                     split_dim(Dim::FFN::id, tp)});
    return parts;
}

LOOM_INLINE plan_spec vocabulary_rules(const degree_spec& tp, const degree_spec& dp, const std::string& origin) {
    plan_spec p;
    p.add(trans(kinds({&op_def_of<ops::Embedding>()}), dp, {split_var("v", tp)}, origin));
    selector head = kinds({&op_def_of<ops::Linear>()});
    head.name = "linear*";
    p.add(trans(head, dp, {split_var("n", tp)}, origin));
    p.add(trans(kinds({&op_def_of<ops::CrossEntropy>()}), dp, {split_var("v", tp)}, origin));
    return p;
}
}  // namespace loom::plan::presets::detail

namespace loom::plan::presets {

LOOM_INLINE plan_spec data_parallel(int n) {
    plan_spec p;
    p.devices = n;
    p.name = "data parallel x" + std::to_string(n);
    p.add(detail::trans({}, n, {}, "data_parallel"));
    return p;
}

LOOM_INLINE plan_spec megatron(const degree_spec& tp, const degree_spec& dp, const transformer_names& names) {
    using namespace detail;
    plan_spec p;
    const auto text = [](const degree_spec& d) { return d.open.empty() ? std::to_string(d.value) : "<" + d.open + ">"; };
    p.devices = tp.open.empty() && dp.open.empty() ? static_cast<int>(tp.value * dp.value) : 1;
    p.name = "megatron tensor parallel x" + text(tp) +
             (dp.value > 1 || !dp.open.empty() ? " x data parallel x" + text(dp) : "");
    const std::string origin = "megatron";
    p.add(trans({}, dp, {replicate(tp)}, origin));
    for (block_part& part : block_parts(tp, names)) p.add(trans(std::move(part.on), dp, {std::move(part.split)}, origin));
    p.then(detail::vocabulary_rules(tp, dp, origin));
    return p;
}

LOOM_INLINE plan_spec vocabulary_parallel(int n) {
    plan_spec p = detail::vocabulary_rules(degree_spec{n, "", {}}, degree_spec{1, "", {}}, "vocabulary_parallel");
    p.devices = n;
    p.name = "vocabulary parallel x" + std::to_string(n);
    return p;
}

LOOM_INLINE plan_spec pipeline(int stages, int micro_batches, order_policy order,
                               plan_spec inner) {
    plan_spec p = std::move(inner);
    const int group = p.devices;
    p.devices = stages * group;
    stage_spec s;
    s.count = {stages, "", {}};
    s.devices_per_stage = {group, "", {}};
    p.stages = s;
    p.micro_batches = {micro_batches, "", {}};
    p.order.alternatives = {std::move(order)};
    p.name = "pipeline x" + std::to_string(stages) + (p.name.empty() ? std::string() : " of " + p.name) + ", " +
             std::to_string(micro_batches) + " micro-batches, " + p.order.alternatives.front().describe();
    return p;
}

LOOM_INLINE plan_spec sequence_parallel(int tp, int dp, const transformer_names& names) {
    using namespace detail;
    plan_spec p = megatron(tp, dp, names);
    p.name = "sequence parallel x" + std::to_string(tp) + (dp > 1 ? " x data parallel x" + std::to_string(dp) : "");
    p.add(trans(kinds({&op_def_of<ops::LayerNorm>(), &op_def_of<ops::RmsNorm>(), &op_def_of<ops::Add>(),
                       &op_def_of<ops::Dropout>()}),
                dp, {split_dim(Dim::Seq::id, tp)}, "sequence_parallel"));
    return p;
}

LOOM_INLINE plan_spec zero(int stage, int n) {
    if (stage < 1 || stage > 3)
        throw plan_error("plan: zero<" + std::to_string(stage) + ">: ZeRO has stages 1, 2 and 3");
    plan_spec p = data_parallel(n);
    p.zero = static_cast<zero_stage>(stage);
    p.name = "ZeRO-" + std::to_string(stage) + " x" + std::to_string(n);
    return p;
}

LOOM_INLINE plan_spec recompute_layers(recompute_policy r, std::int64_t first_layer, std::int64_t last_layer,
                                       std::string repeat) {
    plan_spec p;
    if (r == recompute_policy::none) return p;
    selector on;
    on.repeat = std::move(repeat);
    on.first_layer = first_layer;
    on.last_layer = last_layer;
    if (r == recompute_policy::selective) on.kinds = {&op_def_of<ops::Attention>()};
    p.add({std::move(on), std::nullopt, std::nullopt, true, to_string(r) + " recompute", false});
    return p;
}

LOOM_INLINE plan_spec coshard(const degree_spec& tp, const degree_spec& c, const transformer_names& names) {
    using namespace detail;
    plan_spec p;
    const auto text = [](const degree_spec& d) { return d.open.empty() ? std::to_string(d.value) : "<" + d.open + ">"; };
    p.devices = tp.open.empty() ? static_cast<int>(tp.value) : 1;
    p.colocation_requires_recompute = true;
    p.name = "coshard " + text(c) + " per device x" + text(tp);
    p.add(trans({}, 1, {replicate(tp)}, "coshard"));
    for (block_part& part : block_parts(tp, names)) {
        rule r = trans(std::move(part.on), 1, {std::move(part.split)}, "coshard");
        r.assign = coshard_assign(c);
        r.recompute = true;
        p.add(std::move(r));
    }
    return p;
}

LOOM_INLINE plan_spec coshard_layers(const degree_spec& c, const transformer_names& names) {
    using namespace detail;
    plan_spec p;
    p.colocation_requires_recompute = true;
    p.name = "coshard " + (c.open.empty() ? std::to_string(c.value) : "<" + c.open + ">") + " per device";
    for (block_part& part : block_parts(degree_spec{1, "", {}}, names)) {
        rule r;
        r.on = std::move(part.on);
        r.assign = coshard_assign(c);
        r.origin = "coshard";
        r.optional = true;  // a preset is a recipe for many models
        p.add(std::move(r));
    }
    return p;
}

}  // namespace loom::plan::presets
#endif  // LOOM_HEADER_DEFINITIONS
