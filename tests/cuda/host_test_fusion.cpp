// The CUDA executor's GEMM-epilogue fusion plan (runtime/cuda/fusion.hpp), checked without a
// GPU: which steps of a GPT training program it fuses, that what it absorbs nobody reads,
// that running the groups where it places them reads every tensor's own value (a replay of
// the program over the liveness plan's bytes), and that it declines what it must.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <loom/autograd/autograd.hpp>
#include <loom/models/gpt.hpp>
#include <loom/ops/all.hpp>
#include <loom/runtime/compile.hpp>
#include <loom/runtime/cuda/fusion.hpp>

using namespace loom;
using cuda::fused_gemm;
using cuda::fusion_plan;
using cuda::gemm_epilogue;
using cuda::step_role;

namespace {

models::gpt_config small_gpt(std::int64_t layers) {
    return {.layers = layers, .hidden = 32, .heads = 2, .vocab = 97, .seq = 8, .batch = 2};
}

tensor_id tensor_named(const graph& g, const std::string& name) {
    const auto t = g.find_tensor(name);
    INFO("tensor " << name);
    REQUIRE(t.has_value());
    return *t;
}

tensor_id gradient_of(const graph& g, tensor_id param) {
    for (auto [p, grad] : g.gradients)
        if (p == param) return grad;
    FAIL("no gradient for " << g.tensor(param).name);
    return no_id;
}

std::string step_node(const program& p, std::size_t s) { return p.source->at(p.steps[s].node).name; }

// Steps reading each tensor.
std::vector<std::vector<std::size_t>> readers_of(const program& p) {
    std::vector<std::vector<std::size_t>> out(p.source->tensors.size());
    for (std::size_t s = 0; s < p.steps.size(); ++s)
        for (tensor_id t : p.source->at(p.steps[s].node).inputs) out[static_cast<std::size_t>(t)].push_back(s);
    return out;
}

bool share_storage(const program& p, tensor_id x, tensor_id y) {
    if (x == y) return true;
    const buffer& a = p.buffers[static_cast<std::size_t>(x)];
    const buffer& b = p.buffers[static_cast<std::size_t>(y)];
    return a.where == buffer::place::arena && b.where == buffer::place::arena && a.offset < b.offset + b.bytes &&
           b.offset < a.offset + a.bytes;
}

// What one kernel launch reads and writes.
struct launch {
    std::string what;
    std::vector<tensor_id> reads, writes;
};

// The launches the executor queues under a plan, in order. A fused group is its GEMM's
// operands and outputs, read off the group (not off its steps, as the planner does); with
// `fallback`, it is its steps one by one at the launch position, as when cuBLASLt has no
// kernel for the epilogue.
std::vector<launch> launches(const program& p, const fusion_plan& plan, bool fallback) {
    const graph& g = *p.source;
    auto of_step = [&](std::size_t s) {
        const node& n = g.at(p.steps[s].node);
        return launch{n.name, n.inputs, n.outputs};
    };
    std::vector<launch> out;
    for (std::size_t s = 0; s < p.steps.size(); ++s) {
        const auto& f = plan.steps[s];
        if (f.role == step_role::alone) out.push_back(of_step(s));
        if (f.role != step_role::launch) continue;
        const fused_gemm& group = plan.groups[static_cast<std::size_t>(f.group)];
        if (fallback) {
            for (std::size_t m : group.steps) out.push_back(of_step(m));
        } else if (group.epilogue == gemm_epilogue::bias_gelu) {
            out.push_back({"bias_gelu at " + step_node(p, s), {group.a, group.b, group.bias}, {group.c, group.aux}});
        } else {
            out.push_back(
                {"dgelu_bgrad at " + step_node(p, s), {group.a, group.b, group.aux}, {group.c, group.bias_grad}});
        }
    }
    return out;
}

// Replays the launches over the program's storage: every read must find the bytes last
// written by the tensor's own producer (a tensor the program does not produce, by nobody),
// and no launch may write over what it reads. Returns the first violation.
std::optional<std::string> replay(const program& p, const std::vector<launch>& order) {
    const graph& g = *p.source;
    std::vector<bool> produced(g.tensors.size(), false);
    for (const auto& step : p.steps)
        for (tensor_id t : g.at(step.node).outputs) produced[static_cast<std::size_t>(t)] = true;
    for (std::size_t e = 0; e < order.size(); ++e) {
        for (tensor_id r : order[e].reads) {
            std::optional<tensor_id> last_writer;
            for (std::size_t before = e; before-- > 0 && !last_writer;)
                for (tensor_id w : order[before].writes)
                    if (share_storage(p, w, r)) last_writer = w;
            const bool ok = produced[static_cast<std::size_t>(r)] ? last_writer == r : !last_writer.has_value();
            if (!ok)
                return order[e].what + " reads '" + g.tensor(r).name + "' but finds " +
                       (last_writer ? "'" + g.tensor(*last_writer).name + "'" : std::string("nothing written"));
            for (tensor_id w : order[e].writes)
                if (share_storage(p, w, r))
                    return order[e].what + " writes '" + g.tensor(w).name + "' over its own operand '" +
                           g.tensor(r).name + "'";
        }
    }
    return std::nullopt;
}

// The groups of a GPT program are where they must be: per layer, fc + GELU fused into a
// bias_gelu GEMM launched at the GELU, and proj's input gradient + GELU gradient + fc's bias
// gradient into a dgelu_bgrad GEMM launched at the GELU gradient.
void check_gpt_plan(const graph& g, const program& p, const fusion_plan& plan, std::int64_t layers) {
    const auto c = small_gpt(layers);
    CHECK(plan.declined.empty());
    CHECK(plan.count(gemm_epilogue::bias_gelu) == static_cast<std::size_t>(layers));
    CHECK(plan.count(gemm_epilogue::dgelu_bgrad) == static_cast<std::size_t>(layers));
    REQUIRE(plan.groups.size() == static_cast<std::size_t>(2 * layers));
    REQUIRE(plan.steps.size() == p.steps.size());
    CHECK(plan.description() == std::to_string(layers) + " bias+GELU forward GEMMs, " + std::to_string(layers) +
                                    " dGELU+bias-grad backward GEMMs fused (" + std::to_string(3 * layers) +
                                    " steps absorbed)");
    for (std::int64_t layer = 0; layer < layers; ++layer) {
        const std::string block = "blocks." + std::to_string(layer) + ".mlp";
        INFO(block);
        auto group_named = [&](gemm_epilogue e, const std::string& first_node) -> const fused_gemm& {
            auto it = std::find_if(plan.groups.begin(), plan.groups.end(), [&](const fused_gemm& f) {
                return f.epilogue == e && step_node(p, f.steps.front()) == first_node;
            });
            REQUIRE(it != plan.groups.end());
            return *it;
        };
        const fused_gemm& fwd = group_named(gemm_epilogue::bias_gelu, block + ".fc/linear_bias");
        REQUIRE(fwd.steps.size() == 2);
        CHECK(step_node(p, fwd.steps[1]) == block + "/gelu");
        CHECK(fwd.launch == fwd.steps[1]);
        CHECK(fwd.absorbed.empty());  // the pre-activation is kept: it is the aux output
        CHECK(fwd.aux == tensor_named(g, block + ".fc/linear_bias"));
        CHECK(fwd.c == tensor_named(g, block + "/gelu"));
        CHECK(fwd.bias == tensor_named(g, block + ".fc.bias"));
        CHECK(fwd.b == tensor_named(g, block + ".fc.weight"));
        CHECK(fwd.transpose_b);
        CHECK((fwd.m == c.batch * c.seq && fwd.n == c.ffn_size() && fwd.k == c.hidden));

        const fused_gemm& bwd = group_named(gemm_epilogue::dgelu_bgrad, block + ".proj/grad.linear_grad_input");
        REQUIRE(bwd.steps.size() == 3);
        CHECK(step_node(p, bwd.steps[1]) == block + "/grad.gelu_grad");
        CHECK(step_node(p, bwd.steps[2]) == block + ".fc/grad.sum_leading");
        // fc's weight and input gradients read dpre between the GELU gradient and the bias
        // gradient, so the GEMM runs at the GELU gradient, not at the last step.
        CHECK(bwd.launch == bwd.steps[1]);
        CHECK(bwd.aux == fwd.aux);
        CHECK(bwd.b == tensor_named(g, block + ".proj.weight"));
        CHECK(bwd.bias_grad == gradient_of(g, tensor_named(g, block + ".fc.bias")));
        CHECK(!bwd.transpose_b);
        CHECK((bwd.m == c.batch * c.seq && bwd.n == c.ffn_size() && bwd.k == c.hidden));
        REQUIRE(bwd.absorbed.size() == 1);
        CHECK(bwd.absorbed[0] == tensor_named(g, block + ".proj/grad.linear_grad_input"));
    }
    // Roles agree with the groups: one launch each, the rest absorbed, every other step alone.
    std::vector<int> launches_of(plan.groups.size(), 0);
    for (std::size_t s = 0; s < p.steps.size(); ++s) {
        const auto& f = plan.steps[s];
        if (f.role == step_role::alone) {
            CHECK(f.group == -1);
            continue;
        }
        REQUIRE(f.group >= 0);
        const fused_gemm& group = plan.groups[static_cast<std::size_t>(f.group)];
        CHECK(std::find(group.steps.begin(), group.steps.end(), s) != group.steps.end());
        CHECK((f.role == step_role::launch) == (s == group.launch));
        launches_of[static_cast<std::size_t>(f.group)] += f.role == step_role::launch;
    }
    for (int n : launches_of) CHECK(n == 1);
}

// x -> fc -> GELU -> proj -> sum. With `pre_read_twice`, the pre-activation also feeds the
// residual act + pre, so proj's input gradient is read by that add's backward too.
graph small_mlp(bool pre_read_twice, std::int64_t ffn = 64) {
    graph_builder b;
    const dim_id H = Dim::Hidden::id, F = Dim::FFN::id;
    auto x = b.input("x", {{Dim::Batch::id, 16}, {H, 32}});
    auto dense = [&](const std::string& scope, tensor in, dim_id out_dim, std::int64_t out, dim_id in_dim,
                     std::int64_t width) {
        auto s = b.scope(scope);
        auto w = b.parameter("weight", {{out_dim, out}, {in_dim, width}}, parameter_init::normal(0.1));
        auto bias = b.parameter("bias", {{out_dim, out}}, parameter_init::zeros());
        return ops::linear(in, w, bias);
    };
    tensor pre = dense("fc", x, F, ffn, H, 32);
    tensor act = ops::gelu(pre);
    if (pre_read_twice) act = act + pre;
    b.set_loss(ops::sum(dense("proj", act, H, 32, F, ffn)));
    build_backward(b);
    return std::move(b).take();
}

// Two GELU branches of one input, built branch by branch, fc1 fc2 gelu gelu: their forward
// groups interleave.
graph two_branches() {
    graph_builder b;
    const dim_id H = Dim::Hidden::id, F = Dim::FFN::id;
    auto x = b.input("x", {{Dim::Batch::id, 16}, {H, 32}});
    auto dense = [&](const std::string& scope, tensor in, dim_id out_dim, std::int64_t out, dim_id in_dim,
                     std::int64_t width) {
        auto s = b.scope(scope);
        auto w = b.parameter("weight", {{out_dim, out}, {in_dim, width}}, parameter_init::normal(0.1));
        auto bias = b.parameter("bias", {{out_dim, out}}, parameter_init::zeros());
        return ops::linear(in, w, bias);
    };
    tensor pre1 = dense("fc1", x, F, 64, H, 32);
    tensor pre2 = dense("fc2", x, F, 64, H, 32);
    tensor sum = ops::gelu(pre1) + ops::gelu(pre2);
    b.set_loss(ops::sum(dense("proj", sum, H, 32, F, 64)));
    build_backward(b);
    return std::move(b).take();
}

bool mentions(const std::vector<std::string>& lines, const std::string& a, const std::string& b) {
    return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) {
        return l.find(a) != std::string::npos && l.find(b) != std::string::npos;
    });
}

std::string joined(const std::vector<std::string>& lines) {
    std::string out;
    for (const auto& l : lines) out += l + "\n";
    return out;
}

}  // namespace

TEST_CASE("a GPT training program fuses one forward and one backward GEMM per layer", "[cuda][fusion]") {
    for (std::int64_t layers : {1, 2})
        for (precision prec : {precision::f32, precision::bf16}) {
            INFO(layers << " layers, " << to_string(prec));
            const graph g = models::gpt(small_gpt(layers)).training_graph();
            const program p = compile_program(g, {.prec = prec});
            const fusion_plan plan = cuda::plan_gemm_fusion(p);
            INFO(joined(plan.declined));
            check_gpt_plan(g, p, plan, layers);
        }
}

TEST_CASE("what a fused GEMM absorbs is read by no step outside its group and not bound", "[cuda][fusion]") {
    for (std::int64_t layers : {1, 2}) {
        const graph g = models::gpt(small_gpt(layers)).training_graph();
        const program p = compile_program(g, {.prec = precision::bf16});
        const fusion_plan plan = cuda::plan_gemm_fusion(p);
        const auto readers = readers_of(p);
        std::size_t absorbed = 0;
        for (const fused_gemm& group : plan.groups)
            for (tensor_id t : group.absorbed) {
                INFO("absorbed " << g.tensor(t).name);
                ++absorbed;
                CHECK(p.buffers[static_cast<std::size_t>(t)].where == buffer::place::arena);
                for (std::size_t r : readers[static_cast<std::size_t>(t)])
                    CHECK(std::find(group.steps.begin(), group.steps.end(), r) != group.steps.end());
                // Nothing the fused GEMM reads or writes is what it absorbs.
                for (tensor_id used : {group.a, group.b, group.c, group.aux, group.bias, group.bias_grad})
                    CHECK(used != t);
            }
        CHECK(absorbed == static_cast<std::size_t>(layers));
    }
}

TEST_CASE("running the fused groups where the plan puts them reads every tensor's own value", "[cuda][fusion]") {
    for (std::int64_t layers : {1, 2})
        for (precision prec : {precision::f32, precision::bf16})
            for (bool include_backward : {true, false}) {
                INFO(layers << " layers, " << to_string(prec) << (include_backward ? ", training" : ", forward only"));
                const graph g = models::gpt(small_gpt(layers)).training_graph();
                const program p = compile_program(g, {.prec = prec, .include_backward = include_backward});
                const fusion_plan plan = cuda::plan_gemm_fusion(p);
                CHECK(plan.count(gemm_epilogue::bias_gelu) == static_cast<std::size_t>(layers));
                CHECK(plan.count(gemm_epilogue::dgelu_bgrad) ==
                      static_cast<std::size_t>(include_backward ? layers : 0));
                const auto unfused = replay(p, launches(p, cuda::plan_gemm_fusion(p, {.fuse = false}), false));
                INFO("unfused: " << unfused.value_or("ok"));
                CHECK(!unfused.has_value());  // the replay accepts the program as compiled
                const auto fused = replay(p, launches(p, plan, false));
                INFO("fused: " << fused.value_or("ok"));
                CHECK(!fused.has_value());
                const auto fallback = replay(p, launches(p, plan, true));
                INFO("fallback: " << fallback.value_or("ok"));
                CHECK(!fallback.has_value());
            }
}

TEST_CASE("the replay catches a backward GEMM launched at its last step", "[cuda][fusion]") {
    // Launching at the bias gradient would run fc's weight and input gradients on a dpre not
    // yet written: the replay, which the plans above pass, must see it.
    const graph g = models::gpt(small_gpt(1)).training_graph();
    const program p = compile_program(g);
    fusion_plan plan = cuda::plan_gemm_fusion(p);
    auto bwd = std::find_if(plan.groups.begin(), plan.groups.end(),
                            [](const fused_gemm& f) { return f.epilogue == gemm_epilogue::dgelu_bgrad; });
    REQUIRE(bwd != plan.groups.end());
    plan.steps[bwd->launch].role = step_role::absorbed;
    bwd->launch = bwd->steps.back();
    plan.steps[bwd->launch].role = step_role::launch;
    const auto broken = replay(p, launches(p, plan, false));
    REQUIRE(broken.has_value());
    CHECK_THAT(*broken, Catch::Contains("blocks.0.mlp.fc/grad.linear_grad") &&
                            Catch::Contains("blocks.0.mlp/grad.gelu_grad"));
}

TEST_CASE("the fused GEMMs' arguments are the ops' products with the epilogue's operands", "[cuda][fusion]") {
    const graph g = models::gpt(small_gpt(1)).training_graph();
    const program p = compile_program(g, {.prec = precision::bf16});
    const fusion_plan plan = cuda::plan_gemm_fusion(p);
    // Distinct fake addresses per tensor, never dereferenced.
    std::vector<void*> data(g.tensors.size());
    for (std::size_t t = 0; t < data.size(); ++t) data[t] = reinterpret_cast<void*>(std::uintptr_t{0x10000} * (t + 1));
    auto at = [&](tensor_id t) { return data[static_cast<std::size_t>(t)]; };
    REQUIRE(plan.groups.size() == 2);
    for (const fused_gemm& f : plan.groups) {
        const auto args = cuda::fused_gemm_args<bfloat16>(f, data);
        const node& first = g.at(p.steps[f.steps.front()].node);
        CHECK(args.epilogue == f.epilogue);
        CHECK((args.m == f.m && args.n == f.n && args.k == f.k));
        CHECK((args.lda == 0 && args.ldb == 0 && args.ldc == 0));  // packed, as the program stores them
        CHECK((args.ldaux == f.n && args.ldaux % 8 == 0));
        CHECK(!args.accumulate);
        CHECK(!args.transpose_a);
        if (f.epilogue == gemm_epilogue::bias_gelu) {
            // linear_bias(x, W, b): the same product op_kernels::linear_bias queues.
            const node& gelu = g.at(p.steps[f.steps[1]].node);
            CHECK(args.transpose_b);
            CHECK(args.a == at(first.inputs[0]));
            CHECK(args.b == at(first.inputs[1]));
            CHECK(args.bias == at(first.inputs[2]));
            CHECK(args.aux == at(first.outputs[0]));
            CHECK(args.c == at(gelu.outputs[0]));
            CHECK(args.bias_grad == nullptr);
        } else {
            // linear_grad_input(dy, W2): the same product op_kernels::linear_grad_input queues.
            const node& gelu_grad = g.at(p.steps[f.steps[1]].node);
            const node& sum = g.at(p.steps[f.steps[2]].node);
            CHECK(!args.transpose_b);
            CHECK(args.a == at(first.inputs[0]));
            CHECK(args.b == at(first.inputs[1]));
            CHECK(args.aux == at(gelu_grad.inputs[1]));
            CHECK(args.c == at(gelu_grad.outputs[0]));
            CHECK(args.bias_grad == at(sum.outputs[0]));
            CHECK(args.bias == nullptr);
        }
    }
}

TEST_CASE("a pre-activation with another reader is not fused", "[cuda][fusion]") {
    // The control: the same MLP without the second reader fuses both GEMMs.
    {
        const graph g = small_mlp(false);
        const program p = compile_program(g);
        const fusion_plan plan = cuda::plan_gemm_fusion(p);
        INFO(joined(plan.declined));
        CHECK(plan.count(gemm_epilogue::bias_gelu) == 1);
        CHECK(plan.count(gemm_epilogue::dgelu_bgrad) == 1);
        CHECK(!replay(p, launches(p, plan, false)).has_value());
    }
    const graph g = small_mlp(true);
    for (precision prec : {precision::f32, precision::bf16}) {
        const program p = compile_program(g, {.prec = prec});
        const fusion_plan plan = cuda::plan_gemm_fusion(p);
        INFO(joined(plan.declined));
        CHECK(plan.empty());
        for (const auto& f : plan.steps) CHECK(f.role == step_role::alone);
        // Both declined, each naming the other reader.
        CHECK(mentions(plan.declined, "node 'fc/linear_bias'", "is also read by 'add'"));
        CHECK(mentions(plan.declined, "node 'proj/grad.linear_grad_input'", "is also read by"));
        CHECK(plan.description() == "no GEMM epilogue fused; 2 declined");
    }
}

TEST_CASE("fused groups do not interleave", "[cuda][fusion]") {
    const graph g = two_branches();
    const program p = compile_program(g);
    const fusion_plan plan = cuda::plan_gemm_fusion(p);
    INFO(joined(plan.declined));
    REQUIRE(plan.count(gemm_epilogue::bias_gelu) == 1);
    CHECK(step_node(p, plan.groups[0].steps.front()) == "fc1/linear_bias");
    CHECK(mentions(plan.declined, "node 'fc2/linear_bias'", "interleave"));
    // proj's input gradient feeds both GELU gradients.
    CHECK(plan.count(gemm_epilogue::dgelu_bgrad) == 0);
    CHECK(mentions(plan.declined, "node 'proj/grad.linear_grad_input'", "is also read by"));
    CHECK(!replay(p, launches(p, plan, false)).has_value());
    CHECK(!replay(p, launches(p, plan, true)).has_value());
}

TEST_CASE("a backward GEMM does not run ahead of a transfer", "[cuda][fusion]") {
    // fc's input gradient, between the GELU gradient (the launch) and the bias gradient,
    // made a transfer: the hooks the launch calls early would include the transfer's.
    graph g = models::gpt(small_gpt(1)).training_graph();
    const program before = compile_program(g);
    const fusion_plan fused = cuda::plan_gemm_fusion(before);
    auto bwd = std::find_if(fused.groups.begin(), fused.groups.end(),
                            [](const fused_gemm& f) { return f.epilogue == gemm_epilogue::dgelu_bgrad; });
    REQUIRE(bwd != fused.groups.end());
    const std::size_t between = bwd->launch + 1;
    REQUIRE(between < bwd->steps.back());
    const node_id id = before.steps[between].node;
    CHECK(g.at(id).name == "blocks.0.mlp.fc/grad.linear_grad_input");
    g.nodes[static_cast<std::size_t>(id)].op = &op_def_of<ops::Transfer>();
    const program p = compile_program(g);
    const fusion_plan plan = cuda::plan_gemm_fusion(p);
    INFO(joined(plan.declined));
    CHECK(plan.count(gemm_epilogue::bias_gelu) == 1);
    CHECK(plan.count(gemm_epilogue::dgelu_bgrad) == 0);
    CHECK(mentions(plan.declined, "blocks.0.mlp.proj/grad.linear_grad_input", "is a transfer"));
}

TEST_CASE("a bound GELU output gradient keeps its backward GEMM unfused", "[cuda][fusion]") {
    // Asked for as an output, the gradient of the GELU's output must be written.
    const graph g = models::gpt(small_gpt(1)).training_graph();
    const tensor_id dact = tensor_named(g, "blocks.0.mlp.proj/grad.linear_grad_input");
    const program p = compile_program(g, {.outputs = {dact}});
    const fusion_plan plan = cuda::plan_gemm_fusion(p);
    CHECK(plan.count(gemm_epilogue::bias_gelu) == 1);
    CHECK(plan.count(gemm_epilogue::dgelu_bgrad) == 0);
    CHECK(mentions(plan.declined, "blocks.0.mlp.proj/grad.linear_grad_input", "is bound"));
    CHECK(!replay(p, launches(p, plan, false)).has_value());
}

TEST_CASE("an MLP width that is not a multiple of 8 is not fused", "[cuda][fusion]") {
    // cuBLASLt needs the pre-activation's rows a multiple of 8 elements apart.
    auto c = small_gpt(1);
    c.ffn = 36;
    const graph g = models::gpt(c).training_graph();
    const fusion_plan plan = cuda::plan_gemm_fusion(compile_program(g));
    CHECK(plan.empty());
    CHECK(plan.declined.size() == 2);
    CHECK(mentions(plan.declined, "blocks.0.mlp.fc/linear_bias", "multiple of 8"));
    CHECK(mentions(plan.declined, "blocks.0.mlp.proj/grad.linear_grad_input", "multiple of 8"));
}

TEST_CASE("fuse = false gives an empty plan", "[cuda][fusion]") {
    const graph g = models::gpt(small_gpt(2)).training_graph();
    const program p = compile_program(g, {.prec = precision::bf16});
    const fusion_plan plan = cuda::plan_gemm_fusion(p, {.fuse = false});
    CHECK(!plan.enabled);
    CHECK(plan.empty());
    CHECK(plan.declined.empty());
    REQUIRE(plan.steps.size() == p.steps.size());
    for (const auto& f : plan.steps) CHECK((f.role == step_role::alone && f.group == -1));
    CHECK(plan.description() == "GEMM epilogue fusion off");
}

TEST_CASE("a float64 program is left unfused, saying why", "[cuda][fusion]") {
    const graph g = models::gpt(small_gpt(1)).training_graph();
    const fusion_plan plan = cuda::plan_gemm_fusion(compile_program(g, {.prec = precision::f64}));
    CHECK(plan.empty());
    CHECK(mentions(plan.declined, "f64", "f32 and bf16"));
}
