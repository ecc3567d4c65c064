// What the CUDA backend can run, checked without a GPU: every op of a GPT training graph,
// and of the device programs of the partitioned presets, has a CUDA kernel whose build-time
// check accepts it, and a bf16 program keeps the outputs that need float in float.
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <loom/models/gpt.hpp>
#include <loom/partition/apply.hpp>
#include <loom/plan/presets.hpp>
#include <loom/runtime/compile.hpp>
#include <loom/runtime/cuda/op_kernels.hpp>

using namespace loom;

TEST_CASE("every op of a GPT training graph has a CUDA kernel", "[cuda][coverage]") {
    const graph g = models::gpt({.layers = 2, .hidden = 128, .heads = 2, .vocab = 97, .seq = 16, .batch = 2})
                        .training_graph();
    std::set<std::string> missing;
    for (const node& n : g.nodes)
        if (!n.op->communication && !cuda::find_op_kernel<float>(n.op->name)) missing.insert(std::string(n.op->name));
    INFO("ops without a CUDA kernel: " << [&] {
        std::string all;
        for (const auto& m : missing) all += m + " ";
        return all;
    }());
    CHECK(missing.empty());
    for (const node& n : g.nodes)
        if (!n.op->communication) CHECK(cuda::find_op_kernel<bfloat16>(n.op->name) != nullptr);
    CHECK(cuda::find_op_kernel<float>("no_such_op") == nullptr);
}

TEST_CASE("a bf16 program stores tensors in bf16 and keeps lse and the loss in float", "[cuda][precision]") {
    const graph g = models::gpt({.layers = 1, .hidden = 128, .heads = 2, .vocab = 97, .seq = 16, .batch = 2})
                        .training_graph();
    const program f32 = compile_program(g, {.prec = precision::f32});
    const program bf16 = compile_program(g, {.prec = precision::bf16});
    int lse_seen = 0;
    for (std::size_t t = 0; t < g.tensors.size(); ++t) {
        const tensor_desc& d = g.tensors[t];
        if (bf16.buffers[t].bytes == 0) continue;  // not in the program
        const std::int64_t n = d.dims.numel();
        const bool is_lse = d.producer != no_id && is_op<ops::Attention>(g.at(d.producer)) &&
                            g.at(d.producer).outputs[1] == static_cast<tensor_id>(t);
        const bool is_loss = static_cast<tensor_id>(t) == g.loss;
        lse_seen += is_lse;
        INFO("tensor " << d.name);
        if (d.kind == value_kind::index) CHECK(bf16.buffers[t].bytes == 4 * n);
        else if (is_lse || is_loss) CHECK(bf16.buffers[t].bytes == 4 * n);
        else CHECK(bf16.buffers[t].bytes == 2 * n);
        CHECK(f32.buffers[t].bytes == 4 * n);
    }
    CHECK(lse_seen == 1);
    CHECK(bf16.arena_bytes < f32.arena_bytes);
}

namespace {

// The ops that partitioned plans bring into device programs. Their checks (workspace_bytes,
// what the executor asks when it is built) read only the graph, so they run here without a
// GPU (some other ops' checks ask the CUDA runtime for scratch sizes).
const std::set<std::string> partition_ops{"assemble",
                                          "identity",
                                          "chunk_logsumexp",
                                          "chunk_logsumexp_grad",
                                          "ragged_chunk_logsumexp",
                                          "ragged_chunk_logsumexp_grad",
                                          "pick_target",
                                          "pick_target_grad",
                                          "cross_entropy_from_chunks",
                                          "cross_entropy_from_chunks_grad"};

// The ops of a program without a kernel in the table of T; the partition ops among those
// with one run their checks, which must accept the program's storage of their tensors.
template <class T>
std::set<std::string> ops_without_kernel(const program& p) {
    const graph& g = *p.source;
    std::set<std::string> missing;
    const std::vector<void*> none;
    for (const auto& step : p.steps) {
        const node& n = g.at(step.node);
        if (n.op->communication) continue;
        const cuda::op_kernel<T>* k = cuda::find_op_kernel<T>(n.op->name);
        if (!k) {
            missing.insert(std::string(n.op->name));
            continue;
        }
        INFO("node '" << n.name << "' (" << n.op->name << ")");
        if (k->workspace_bytes && partition_ops.count(std::string(n.op->name)))
            CHECK_NOTHROW(k->workspace_bytes(host::kernel_call<T>{g, n, none, none, 0}));
    }
    return missing;
}

std::string joined(const std::set<std::string>& names) {
    std::string all;
    for (const auto& m : names) all += m + " ";
    return all;
}

}  // namespace

TEST_CASE("every op of the presets' device programs has a CUDA kernel; bf16 keeps the loss in float",
          "[cuda][coverage][partition]") {
    namespace presets = plan::presets;
    // Heads, FFN, sequence and batch divide by 4; the vocabulary too (64), or not (97: the
    // Megatron presets split it into near-equal pieces, with ragged chunk log-sum-exps).
    std::set<std::string> seen;
    for (std::int64_t vocab : {64, 97})
    for (const auto& spec : {presets::megatron(2), presets::sequence_parallel(2), presets::zero(2, 2),
                             presets::zero(3, 2), presets::megatron(2, 2)}) {
        const models::gpt_config config{.layers = 2, .hidden = 32, .heads = 4, .vocab = vocab, .seq = 16, .batch = 4};
        const graph training = models::gpt(config).training_graph();
        const auto pg = partition::apply_plan(training, plan::resolve(spec, training));
        REQUIRE(pg.devices.size() == static_cast<std::size_t>(spec.devices));
        for (std::size_t d = 0; d < pg.devices.size(); ++d) {
            INFO(spec.name << ", vocabulary " << vocab << ", device " << d);
            const partition::device_part& part = pg.devices[d];
            const graph& g = part.ir();
            compile_options options{.outputs = {part.loss}, .keep_every_node = true};
            if (!pg.order.empty()) options.order = pg.order[d];
            options.prec = precision::f32;
            const program f32 = compile_program(g, options);
            options.prec = precision::bf16;
            const program bf16 = compile_program(g, options);
            const auto missing_f32 = ops_without_kernel<float>(f32);
            const auto missing_bf16 = ops_without_kernel<bfloat16>(bf16);
            INFO("ops without a CUDA kernel: f32 " << joined(missing_f32) << "; bf16 " << joined(missing_bf16));
            CHECK(missing_f32.empty());
            CHECK(missing_bf16.empty());
            for (const auto& step : bf16.steps) seen.insert(std::string(g.at(step.node).op->name));

            // The loss, and every log-sum-exp the loss is rebuilt from, stay float.
            REQUIRE(part.loss != no_id);
            CHECK(storage_precision(g, part.loss, precision::bf16) == precision::f32);
            CHECK(bf16.bytes_of(part.loss) == 4 * g.tensor(part.loss).dims.numel());
            for (const node& n : g.nodes)
                if (is_op<ops::ChunkLogsumexp>(n) || is_op<ops::RaggedChunkLogsumexp>(n))
                    CHECK(storage_precision(g, n.outputs[0], precision::bf16) == precision::f32);
        }
    }
    // The plans put every partition op into the programs: the loop above checked them all.
    for (const auto& op : partition_ops) {
        INFO("op " << op);
        CHECK(seen.count(op) == 1);
    }
}

TEST_CASE("the partition ops' checks refuse a tensor stored otherwise than their kernels read it",
          "[cuda][coverage][partition]") {
    graph_builder b;
    const shape positions{{Dim::Batch::id, 2}, {Dim::Seq::id, 3}};
    // Log-sum-exps fed in as a graph input are stored in bf16 by a bf16 program, but the loss
    // kernel reads them as float (what chunk_logsumexp and its keeps_float copies store).
    const tensor lse = b.input("lse", {{Dim::Batch::id, 2}, {Dim::Seq::id, 3}, {Dim::Vocab::id, 4}});
    const tensor z = b.input("z", positions);
    const tensor targets = b.input("targets", positions, value_kind::index);
    ops::cross_entropy_from_chunks(lse, z, targets, -100, 6.0);
    // An assemble marked keeps_float over pieces the program stores in bf16.
    const tensor piece = b.input("piece", positions);
    b.append_unchecked(op_def_of<ops::Assemble>(), std::vector<tensor>{piece}, {positions},
                       {{"out_box", std::vector<std::int64_t>{0, 2, 0, 3}},
                        {"in_boxes", std::vector<std::int64_t>{0, 2, 0, 3}},
                        {"accumulate", std::int64_t{0}},
                        {"zero", std::int64_t{0}},
                        {"keeps_float", std::int64_t{1}}},
                       "assembled");
    const graph g = std::move(b).take();
    const std::vector<void*> none;
    for (const node& n : g.nodes) {
        INFO("node '" << n.name << "'");
        const auto* f32 = cuda::find_op_kernel<float>(n.op->name);
        const auto* bf16 = cuda::find_op_kernel<bfloat16>(n.op->name);
        REQUIRE(f32 != nullptr);
        REQUIRE(bf16 != nullptr);
        CHECK_NOTHROW(f32->workspace_bytes(host::kernel_call<float>{g, n, none, none, 0}));
        CHECK_THROWS_WITH(bf16->workspace_bytes(host::kernel_call<bfloat16>{g, n, none, none, 0}),
                          Catch::Contains("keeps_float") && Catch::Contains("is stored as bf16"));
    }
}
