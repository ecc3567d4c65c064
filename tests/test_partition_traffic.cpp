// What the programs of the standard plans move: the collectives that PyTorch's DDP, ZeRO and
// Megatron-LM run, and nothing else. Two parts of partitioning make it so
// (partition/apply.hpp): a backward op mirrors its forward op's splits through the axes of
// the tensors both touch (so a row-parallel weight's gradient is cut along the columns its
// device stores, not along its rows, which have the same dim), and the tied embedding's
// gradient sum adds the two partial gradients summand by summand (so they are reduced once,
// with every other gradient, and never sent point to point per micro-batch). Under ZeRO-2
// and 3 every other gradient is reduced onto the shards once per micro-batch, as made.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include <loom/models/gpt.hpp>
#include <loom/models/t5.hpp>
#include <loom/partition/apply.hpp>
#include <loom/plan/presets.hpp>

#include "support/plan_equivalence.hpp"
#include "support/t5_feed.hpp"

using namespace loom;
namespace presets = loom::plan::presets;
using partition::transfer_kind;

namespace {

const models::gpt_config config{.layers = 2, .hidden = 32, .heads = 4, .vocab = 64, .seq = 16, .batch = 16};

partition::partitioned_graph programs(const plan::plan_spec& spec) {
    auto model = models::gpt(config);
    const graph training = std::move(model).training_graph();
    return partition::apply_plan(training, plan::resolve(spec, training));
}

plan::plan_spec accumulating(int micro_batches, plan::plan_spec inner) {
    return presets::pipeline(1, micro_batches, {plan::schedule_kind::one_f_one_b}, std::move(inner));
}

struct traffic {
    std::map<transfer_kind, int> kinds;                 // every transfer
    std::map<std::string, std::map<transfer_kind, int>> of_gradient;  // by parameter
    std::map<transfer_kind, int> backward_activations;  // backward transfers of other tensors
};

traffic traffic_of(const partition::partitioned_graph& pg) {
    const graph& g = pg.logical->g;
    std::map<tensor_id, std::string> parameter_of;
    for (auto [param, grad] : g.gradients) parameter_of[grad] = g.tensor(param).name;
    traffic t;
    for (const auto& tr : pg.transfers) {
        ++t.kinds[tr.kind];
        if (auto it = parameter_of.find(tr.logical); it != parameter_of.end())
            ++t.of_gradient[it->second][tr.kind];
        else if (tr.backward)
            ++t.backward_activations[tr.kind];
    }
    return t;
}

std::string listing(const std::map<transfer_kind, int>& kinds) {
    std::string s;
    for (auto [k, n] : kinds) s += std::string(partition::to_string(k)) + " x" + std::to_string(n) + " ";
    return s;
}

}  // namespace

TEST_CASE("data parallelism all-reduces each gradient once, whatever the micro-batches", "[partition][traffic]") {
    for (int micro : {1, 2, 4}) {
        const auto pg = programs(micro == 1 ? presets::data_parallel(4) : accumulating(micro, presets::data_parallel(4)));
        const auto t = traffic_of(pg);
        INFO(micro << " micro-batches: " << listing(t.kinds));
        // The gradients and the loss: one all-reduce each, over all four devices.
        CHECK(t.kinds == std::map<transfer_kind, int>{{transfer_kind::all_reduce, static_cast<int>(t.of_gradient.size()) + 1}});
        CHECK(t.of_gradient.size() == pg.logical->g.gradients.size());
        for (const auto& [name, kinds] : t.of_gradient) {
            INFO(name);
            CHECK(kinds == std::map<transfer_kind, int>{{transfer_kind::all_reduce, 1}});
        }
        for (const auto& tr : pg.transfers) CHECK(tr.group == std::vector<int>{0, 1, 2, 3});
        // The tied embedding's two contributions are added where they were made, once per
        // device: its micro-batches' summands are added up first.
        const graph& g = pg.logical->g;
        int adds = 0;
        for (std::size_t i = 0; i < g.nodes.size(); ++i) {
            const auto& split = pg.layouts[i].partition;
            if (std::none_of(split.splits.begin(), split.splits.end(), [](const plan::split_axis& a) { return a.sums; }))
                continue;
            INFO(g.nodes[i].name << ": " << split.describe());
            CHECK(g.nodes[i].op == &op_def_of<ops::Add>());
            CHECK(split.describe() == "split sum x4 on {0,1,2,3}");
            ++adds;
        }
        CHECK(adds == 1);
    }
}

TEST_CASE("the LM head's gradient reaches the embedding's stage once per step, whatever the micro-batches",
          "[partition][traffic][pipeline]") {
    // Two stages of data parallelism x2: the tied embedding's gradient is the embedding's
    // (first stage) plus the LM head's (last stage). Each last-stage device adds up its
    // micro-batches' contributions and sends the sum once, to its first-stage counterpart.
    for (int micro : {1, 2, 4, 8}) {
        const auto pg = programs(presets::pipeline(2, micro, {plan::schedule_kind::one_f_one_b}, presets::data_parallel(2)));
        const graph& g = pg.logical->g;
        std::int64_t table = 0;
        for (auto [param, grad] : g.gradients)
            if (g.tensor(param).name == "wte") table = g.tensor(param).dims.numel();
        int sends = 0;
        std::int64_t elements = 0;
        for (const auto& tr : pg.transfers) {
            const tensor_desc& t = g.tensor(tr.logical);
            if (tr.kind != transfer_kind::send_recv || t.dims.numel() != table || !tr.backward) continue;
            ++sends;
            elements += tr.inputs[0].numel();
        }
        INFO(micro << " micro-batches");
        CHECK(sends == 2);
        CHECK(elements == 2 * table);
    }
}

TEST_CASE("T5's shared table: its three gradients are reduced once per step, whatever the micro-batches",
          "[partition][traffic][t5]") {
    // The table is read by the encoder's lookup, the decoder's and the LM head: two adds sum
    // its gradient. The first adds its inputs' summands (one per micro-batch and replica)
    // and merges the micro-batches on each device; the second reads that merged sum beside
    // the third gradient's finer summands. Were it to run replicated instead, every replica
    // would send its partial table to every other, point to point, per micro-batch (2 (r - 1)
    // sends touching each device), and hold them all: memory that grows with the replicas.
    const models::t5_config c{.encoder_layers = 1, .decoder_layers = 1, .hidden = 16, .heads = 2, .vocab = 24,
                              .source_seq = 4, .target_seq = 4, .batch = 8};
    auto model = models::t5(c);
    const graph forward = model.ir();
    const graph training = std::move(model).training_graph();
    const std::int64_t table = c.vocab * c.hidden;
    for (int zero : {0, 3})
        for (int micro : {1, 2, 4}) {
            plan::plan_spec inner = presets::data_parallel(2);
            inner.zero = static_cast<plan::zero_stage>(zero);
            const auto spec = micro == 1 ? inner : accumulating(micro, inner);
            const auto pg = partition::apply_plan(training, plan::resolve(spec, training));
            const auto t = traffic_of(pg);
            INFO("ZeRO " << zero << ", " << micro << " micro-batches: " << listing(t.kinds));
            CHECK(t.kinds.count(transfer_kind::send_recv) == 0);
            // One reduction of every gradient: an all-reduce, or under ZeRO-3 a reduce-scatter
            // onto the shards of each micro-batch's, the shared table's once (its sum merges
            // each device's micro-batches first).
            const int parameters = static_cast<int>(pg.logical->g.gradients.size());
            if (zero == 3)
                CHECK(t.kinds.at(transfer_kind::reduce_scatter) == (parameters - 1) * micro + 1);
            else
                CHECK(t.of_gradient.at("shared") == std::map<transfer_kind, int>{{transfer_kind::all_reduce, 1}});
            // No partial table moves but the gradient's own reduction.
            int table_moves = 0;
            for (const auto& tr : pg.transfers) {
                const tensor_desc& moved = pg.logical->g.tensor(tr.logical);
                if (tr.backward && moved.dims.numel() == table && moved.name.rfind("zero3/", 0) != 0) ++table_moves;
            }
            CHECK(table_moves == 1);
            for (const auto& note : pg.notes) CHECK(note.find("'grad.add") == std::string::npos);
        }
    // And the merged sums are the right ones: two steps equal to one device's.
    std::vector<models::t5_batch> batches{models::t5_synthetic_batch(c, 1), models::t5_synthetic_batch(c, 2)};
    std::vector<train::input_feed> feeds;
    for (const auto& b : batches) feeds.push_back(testing::t5_feed(b));
    for (int zero : {0, 3}) {
        plan::plan_spec inner = presets::data_parallel(2);
        inner.zero = static_cast<plan::zero_stage>(zero);
        const auto e = testing::compare_on_model<double>(forward, models::t5(c).training_graph(), feeds, accumulating(2, inner));
        INFO("ZeRO " << zero << ": loss " << e.loss << ", grad norm " << e.grad_norm << ", parameters " << e.parameters);
        CHECK(e.loss <= 1e-12);
        CHECK(e.grad_norm <= 1e-12);
        CHECK(e.parameters <= 1e-12);
    }
}

TEST_CASE("ZeRO reduce-scatters each micro-batch's gradient onto the shards", "[partition][traffic][zero]") {
    for (int stage : {2, 3})
        for (int micro : {1, 2}) {
            const auto inner = presets::zero(stage, 4);
            const auto pg = programs(micro == 1 ? inner : accumulating(micro, inner));
            const auto t = traffic_of(pg);
            INFO("ZeRO-" << stage << ", " << micro << " micro-batches: " << listing(t.kinds));
            // Every parameter's first dim divides by 4 here: one reduce-scatter of each
            // micro-batch's gradient onto the shards, as it is made (the tied embedding's sum,
            // which merges each device's micro-batches first, once), one all-reduce of the
            // loss, and under ZeRO-3 the parameters gathered for each micro-batch's forward
            // and again for its backward (those a backward op reads), as DeepSpeed does.
            const graph& g = pg.logical->g;
            const int parameters = static_cast<int>(g.gradients.size());
            CHECK(t.kinds.count(transfer_kind::send_recv) == 0);
            CHECK(t.kinds.at(transfer_kind::reduce_scatter) == (parameters - 1) * micro + 1);
            CHECK(t.kinds.at(transfer_kind::all_reduce) == 1);
            if (stage == 3) {
                int read_backward = 0;
                for (auto [param, identity] : pg.logical->zero3_identity) {
                    const tensor_id gathered = g.at(identity).outputs[0];
                    read_backward += std::any_of(g.nodes.begin(), g.nodes.end(), [&](const node& n) {
                        return (n.backward || n.forward_of != no_id) &&
                               std::find(n.inputs.begin(), n.inputs.end(), gathered) != n.inputs.end();
                    });
                }
                CHECK(read_backward > 0);
                int forward_gathers = 0, backward_gathers = 0;
                for (const auto& tr : pg.transfers)
                    if (tr.kind == transfer_kind::all_gather) ++(tr.backward ? backward_gathers : forward_gathers);
                CHECK(forward_gathers == micro * parameters);
                CHECK(backward_gathers == micro * read_backward);
            }
            CHECK(t.kinds.size() == (stage == 3 ? 3u : 2u));
        }
}

TEST_CASE("ZeRO-3 gathers a parameter for each use and frees it after", "[partition][traffic][zero]") {
    // A gathered copy serves one micro-batch's forward, or its backward, never both: a copy
    // kept from the forward to the backward holds the whole unsharded model at once.
    for (int micro : {1, 2, 4}) {
        const auto inner = presets::zero(3, 4);
        const auto pg = programs(micro == 1 ? inner : accumulating(micro, inner));
        for (std::size_t d = 0; d < pg.devices.size(); ++d) {
            const auto& part = pg.devices[d];
            const graph& dg = part.ir();
            std::map<tensor_id, std::set<std::pair<node_id, std::int32_t>>> readers;  // gathered -> logical pieces
            std::map<tensor_id, std::set<bool>> passes;
            std::set<tensor_id> gathered;
            for (std::size_t i = 0; i < dg.nodes.size(); ++i) {
                const node& n = dg.nodes[i];
                if (n.attrs.has("transfer") &&
                    pg.transfers.at(static_cast<std::size_t>(n.attrs.get<std::int64_t>("transfer"))).kind == transfer_kind::all_gather)
                    gathered.insert(n.outputs.begin(), n.outputs.end());
            }
            for (std::size_t i = 0; i < dg.nodes.size(); ++i) {
                const auto src = part.source_of(static_cast<node_id>(i));
                if (src.logical == no_id) continue;
                for (tensor_id in : dg.nodes[i].inputs)
                    if (gathered.count(in)) {
                        readers[in].insert({src.logical, src.piece});
                        passes[in].insert(dg.nodes[i].backward);
                    }
            }
            CHECK(!readers.empty());
            for (const auto& [copy, pieces] : readers) {
                INFO(micro << " micro-batches, device " << d << ": '" << dg.tensor(copy).name << "'");
                CHECK(passes[copy].size() == 1);
                std::map<node_id, int> per_node;
                for (const auto& [logical, piece] : pieces) ++per_node[logical];
                for (const auto& [logical, count] : per_node) CHECK(count == 1);
            }
        }
    }
}

TEST_CASE("ZeRO-2 and ZeRO-3 under tensor parallelism reduce (and gather) each piece within its data-parallel group",
          "[partition][traffic][zero]") {
    // DeepSpeed's ZeRO with Megatron's TP: each tensor-parallel piece of a weight (and each
    // tensor-parallel rank's copy of a layer norm or a row-parallel bias) is sharded over the
    // data-parallel replicas that read it. ZeRO-3 shards cut from the whole tensor over all
    // devices left each piece's rows on other pieces' devices: point-to-point sends growing
    // with the square of the data-parallel degree (1876 transfers at DP 4, 7960 at DP 8);
    // ZeRO-2 was refused.
    for (int stage : {2, 3})
        for (int dp : {2, 4, 8}) {
            plan::plan_spec spec = presets::megatron(2, dp);
            spec.zero = static_cast<plan::zero_stage>(stage);
            const auto pg = programs(spec);
            const auto t = traffic_of(pg);
            INFO("ZeRO-" << stage << ", TP 2 x DP " << dp << ": " << listing(t.kinds));
            CHECK(t.kinds.count(transfer_kind::send_recv) == 0);
            CHECK(t.kinds.count(transfer_kind::broadcast) == 0);
            CHECK(t.kinds.count(transfer_kind::all_to_all) == 0);
            // Every gradient reduce-scattered once per tensor-parallel rank, onto the shards;
            // under ZeRO-3 every parameter gathered too.
            const int parameters = static_cast<int>(pg.logical->g.gradients.size());
            CHECK(t.kinds.at(transfer_kind::reduce_scatter) == 2 * parameters);
            if (stage == 3) CHECK(t.kinds.at(transfer_kind::all_gather) >= 2 * parameters);
            for (const auto& tr : pg.transfers)
                if (tr.kind == transfer_kind::reduce_scatter ||
                    (tr.kind == transfer_kind::all_gather && !tr.backward &&
                     pg.logical->g.tensor(tr.logical).name.rfind("zero3/", 0) == 0)) {
                    INFO(partition::to_string(tr.kind) << " of " << pg.logical->g.tensor(tr.logical).name);
                    CHECK(static_cast<int>(tr.group.size()) == dp);
                }
            // Each device holds a 1 / (2 dp) share of every MLP weight (ZeRO-3) or of its
            // gradient (ZeRO-2, which stores the tensor-parallel half).
            int shards = 0;
            for (const auto& part : pg.devices) {
                for (const auto& stored : part.parameters) {
                    const tensor_desc& d = pg.logical->g.tensor(stored.logical);
                    if (d.name.find("mlp.fc.weight") == std::string::npos) continue;
                    CHECK(stored.region.numel() * (stage == 3 ? 2 * dp : 2) == d.dims.numel());
                }
                for (const auto& gradient : part.gradients) {
                    const tensor_desc& d = pg.logical->g.tensor(gradient.logical);
                    if (d.name.find("mlp.fc.weight") == std::string::npos) continue;
                    ++shards;
                    CHECK(gradient.region.numel() * 2 * dp == d.dims.numel());
                }
            }
            CHECK(shards == 2 * dp * static_cast<int>(config.layers));
        }
}

TEST_CASE("Megatron's tensor parallelism moves what Megatron-LM moves", "[partition][traffic][megatron]") {
    for (int micro : {1, 2}) {
        const auto pg = programs(micro == 1 ? presets::megatron(2, 2) : accumulating(micro, presets::megatron(2, 2)));
        const auto t = traffic_of(pg);
        INFO(micro << " micro-batches: " << listing(t.kinds));
        CHECK(t.kinds.count(transfer_kind::send_recv) == 0);
        CHECK(t.kinds.count(transfer_kind::reduce_scatter) == 0);
        CHECK(t.kinds.count(transfer_kind::broadcast) == 0);
        CHECK(t.kinds.count(transfer_kind::all_to_all) == 0);
        // Every gradient: one all-reduce per tensor-parallel rank, over its data-parallel pair.
        CHECK(t.of_gradient.size() == pg.logical->g.gradients.size());
        for (const auto& [name, kinds] : t.of_gradient) {
            INFO(name);
            CHECK(kinds == std::map<transfer_kind, int>{{transfer_kind::all_reduce, 2}});
        }
        // The backward's own collectives: the input gradients of the column-parallel layers
        // (q, k and v together, fc, and the vocabulary-parallel LM head), all-reduced in each
        // tensor-parallel pair, once per micro-batch.
        CHECK(t.backward_activations ==
              std::map<transfer_kind, int>{{transfer_kind::all_reduce, 2 * micro * (2 * config.layers + 1)}});
        // The row-parallel projections' gradients are cut like their weights: along k, the
        // columns each device stores.
        const graph& g = pg.logical->g;
        int row_parallel = 0;
        for (std::size_t i = 0; i < g.nodes.size(); ++i) {
            const node& n = g.nodes[i];
            if (n.name.find(".proj/grad.linear_grad") == std::string::npos) continue;
            ++row_parallel;
            INFO(n.name << ": " << pg.layouts[i].partition.describe());
            bool along_k = false, along_n = false;
            for (const auto& s : pg.layouts[i].partition.splits) {
                along_k = along_k || (s.cuts() && s.label == "k");
                along_n = along_n || (s.cuts() && s.label == "n");
            }
            CHECK(along_k);
            CHECK_FALSE(along_n);
        }
        CHECK(row_parallel == 2 * 2 * config.layers);  // grad_input and grad_weight of attn.proj and mlp.proj
    }
}
