// nnScaler's other two workloads (Table 9): T5 with one shared embedding (models/t5.hpp) and a
// Swin-style hierarchical vision transformer (models/swin.hpp). Parameters and shapes, the one
// repeat that search::layers_from_scopes folds into classes, the laws of Swin's window
// regroupings and the locality of its attention, float64 gradients of whole models against
// central differences, training whose loss falls, config errors, data-parallel plans, and the
// Table 9 sizes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <loom/models/swin.hpp>
#include <loom/models/t5.hpp>
#include <loom/partition/apply.hpp>
#include <loom/plan/presets.hpp>
#include <loom/search/folding.hpp>
#include <loom/train/trainer.hpp>

#include "support/gradcheck.hpp"
#include "support/model_gradcheck.hpp"
#include "support/t5_feed.hpp"

using namespace loom;

namespace {

models::t5_config tiny_t5() {
    return {.encoder_layers = 2,
            .decoder_layers = 3,
            .hidden = 8,
            .heads = 2,
            .ffn = 12,
            .vocab = 11,
            .source_seq = 5,
            .target_seq = 4,
            .batch = 2};
}

// Sides 8, 4, 2: windows of 2 x 2 tokens, 16, 4 and 1 of them.
models::swin_config tiny_swin() {
    return {.side = 8,
            .patch_dim = 6,
            .window = 2,
            .embed = 8,
            .depths = {2, 3, 1},
            .heads = {2, 2, 4},
            .mlp_ratio = 2,
            .classes = 4,
            .batch = 2};
}

train::input_feed feed_of(const models::t5_batch& d) { return testing::t5_feed(d); }

train::input_feed feed_of(const models::swin_batch& d) {
    train::input_feed f;
    f.real["patches"] = d.patches;
    f.index["labels"] = d.labels;
    return f;
}

bool in_scope(const std::string& node_name, const std::string& path) {
    return node_name.rfind(path + ".", 0) == 0 || node_name.rfind(path + "/", 0) == 0;
}

std::vector<std::string> layer_scope_paths(const graph& g) {
    std::vector<std::string> out;
    for (std::int32_t s : g.repeats.at(0).scopes) out.push_back(g.scope_path(s));
    return out;
}

// The class of each repeated layer, in order.
std::vector<int> repeated_classes(const search::layer_partition& p) {
    std::vector<int> out;
    for (int i : p.repeated()) out.push_back(p.layers[static_cast<std::size_t>(i)].class_id);
    return out;
}

// Every repeated layer holds exactly the forward nodes of its scope.
void check_layer_nodes(const graph& g, const search::layer_partition& p) {
    const auto paths = layer_scope_paths(g);
    const auto repeated = p.repeated();
    REQUIRE(repeated.size() == paths.size());
    std::size_t in_layers = 0;
    for (std::size_t k = 0; k < paths.size(); ++k)
        for (node_id n : p.layers[static_cast<std::size_t>(repeated[k])].nodes) {
            INFO("layer " << k << " node " << g.at(n).name);
            CHECK(in_scope(g.at(n).name, paths[k]));
            ++in_layers;
        }
    std::size_t in_scopes = 0;
    for (const node& n : g.nodes)
        for (const auto& path : paths) in_scopes += in_scope(n.name, path) ? 1 : 0;
    CHECK(in_layers == in_scopes);
}

// What a data-parallel plan needs: every forward op binds a splittable Batch and none
// reinterprets its input's layout.
void check_batch_splits_every_op(const graph& g) {
    for (const node& n : g.nodes) {
        bool batch = false;
        for (const auto& v : n.sig.vars) batch = batch || (v.dim == Dim::Batch::id && v.splittable && !v.frozen);
        INFO("op " << n.op->name << " '" << n.name << "'");
        CHECK((batch && !n.op->opaque_layout));
    }
    CHECK_NOTHROW(partition::apply_plan(g, plan::resolve(plan::presets::data_parallel(2), g)));
}

std::int64_t numel_of_parameters(const graph& g) {
    std::int64_t n = 0;
    for (tensor_id p : g.parameters) n += g.tensor(p).dims.numel();
    return n;
}

const node& node_named(const graph& g, std::string_view name) {
    for (const node& n : g.nodes)
        if (n.name == name) return n;
    FAIL("no node named " << name);
    return g.nodes.front();
}


// Runs `build` forward in float64 on input "x"; returns the values of its output.
template <class Build>
std::vector<double> run_forward(Build&& build, const std::vector<double>& input) {
    graph_builder b;
    tensor y = build(b);
    graph g = std::move(b).take();
    program p = compile_program(g, {.prec = precision::f64, .include_backward = false, .outputs = {y.id}});
    host::executor<double> ex(p);
    host::bound_storage<double> st(p);
    st.bind_to(ex);
    auto x = st.real("x");
    REQUIRE(x.size() == input.size());
    std::copy(input.begin(), input.end(), x.begin());
    ex.run();
    auto out = st.real(y.id);
    return {out.begin(), out.end()};
}

std::vector<double> iota_values(std::size_t n) {
    std::vector<double> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<double>(i);
    return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------- T5

TEST_CASE("T5: one shared table, the shapes and parameters its config describes", "[t5]") {
    const auto c = tiny_t5();
    auto m = models::t5(c);
    const graph& g = m.ir();
    CHECK(g.parameter_count() == c.parameter_count());
    CHECK(numel_of_parameters(g) == c.parameter_count());
    CHECK(g.tensor(m.logits).dims.extent(0) == c.batch);
    CHECK(g.tensor(m.logits).dims.extent(1) == c.target_seq);
    CHECK(g.tensor(m.logits).dims.extent(2) == c.vocab);
    CHECK(g.tensor(m.encoder_output).dims.extent(1) == c.source_seq);
    // The table is read by both input lookups and by the head, and by nothing else.
    const auto consumers = g.consumers();
    const tensor_id shared = *g.find_tensor("shared");
    std::map<std::string, int> readers;
    for (node_id n : consumers[static_cast<std::size_t>(shared)]) ++readers[std::string(g.at(n).op->name)];
    CHECK(readers == std::map<std::string, int>{{"embedding", 2}, {"linear", 1}});
    CHECK_FALSE(g.find_tensor("lm_head").has_value());
    // Every decoder layer attends to the encoder output, and causally to itself.
    const auto& memory_readers = consumers[static_cast<std::size_t>(m.encoder_output)];
    REQUIRE(memory_readers.size() == static_cast<std::size_t>(c.decoder_layers));
    for (std::size_t j = 0; j < memory_readers.size(); ++j)
        CHECK(g.at(memory_readers[j]).name == "decoder." + std::to_string(j) + ".cross_attn.memory_norm/rms_norm");
    int causal = 0, full = 0;
    for (const node& n : g.nodes)
        if (n.op->name == "attention") (n.attrs.get<std::int64_t>("causal") ? causal : full) += 1;
    CHECK(causal == c.decoder_layers);
    CHECK(full == c.encoder_layers + c.decoder_layers);
    check_batch_splits_every_op(g);
}

TEST_CASE("T5: both stacks are one repeat, which folding splits into two classes", "[t5][folding]") {
    const auto c = tiny_t5();
    auto m = models::t5(c);
    const graph& g = m.ir();
    REQUIRE(g.repeats.size() == 1);
    CHECK(g.repeats[0].name == "blocks");
    CHECK(layer_scope_paths(g) ==
          std::vector<std::string>{"encoder.0", "encoder.1", "decoder.0", "decoder.1", "decoder.2"});
    CHECK(g.find_tensor("decoder.2.cross_attn.memory_norm.weight").has_value());
    CHECK(g.find_tensor("encoder.1.mlp.gate.weight").has_value());

    const auto p = search::layers_from_scopes(g);
    CHECK(p.found_by == "scopes");
    REQUIRE(p.layers.size() == 2 + static_cast<std::size_t>(c.layers()));
    CHECK(p.layers.front().role == search::layer_role::prologue);
    CHECK(p.layers.back().role == search::layer_role::epilogue);
    const auto classes = repeated_classes(p);
    CHECK(classes[0] == classes[1]);
    CHECK(classes[2] == classes[3]);
    CHECK(classes[3] == classes[4]);
    CHECK(classes[0] != classes[2]);
    CHECK(p.classes == 4);  // prologue, encoder block, decoder block, epilogue
    check_layer_nodes(g, p);
    // The prologue is the four lookups (two in the shared table) and their sums; the
    // epilogue the final norm, the head and the loss.
    int lookups = 0;
    for (node_id n : p.layers.front().nodes) lookups += g.at(n).op->name == "embedding" ? 1 : 0;
    CHECK(lookups == 4);
    CHECK(p.layers.front().nodes.size() == 6);
    CHECK(p.layers.back().nodes.size() == 4);
    // find_layers agrees.
    CHECK(search::find_layers(g).repeated().size() == static_cast<std::size_t>(c.layers()));
}

TEST_CASE("folding takes the largest of two repeats: the other stack becomes prologue", "[t5][folding]") {
    // Why t5() records one repeat: the same two stacks as graph_builder::repeat would record them.
    graph_builder b;
    tensor x = b.input("x", {{Dim::Batch::id, 2}, {Dim::Hidden::id, 4}});
    auto dense = [&](tensor t) {
        const shape square{{Dim::Hidden::id, 4}, {Dim::Hidden::id, 4}};
        return ops::linear(t, b.parameter("w", square, parameter_init::normal(1.0)));
    };
    b.repeat("encoder", 2, [&](std::int64_t) { x = dense(x); });
    b.repeat("decoder", 3, [&](std::int64_t) { x = ops::gelu(dense(x)); });
    b.set_loss(ops::sum(x));
    const auto p = search::layers_from_scopes(b.view());
    CHECK(p.repeated().size() == 3);
    REQUIRE(p.layers.front().role == search::layer_role::prologue);
    CHECK(p.layers.front().nodes.size() == 2);  // both encoder layers, folded into one prologue
    CHECK(p.layers[1].name == "decoder.0");
}

TEST_CASE("gradcheck: a whole T5 in float64", "[t5][grad]") {
    auto c = tiny_t5();
    c.init_std = 0.3;  // larger than usual so every path carries a visible gradient
    auto data = models::t5_synthetic_batch(c, 1);
    train::trainer<double> t(models::t5(c).training_graph(), {});
    CHECK(testing::check_model_gradients(t, feed_of(data)) > 150);
}

TEST_CASE("training T5 is deterministic and the loss falls", "[t5][train]") {
    const auto c = tiny_t5();
    const auto data = models::t5_synthetic_batch(c, 3);
    const auto feed = feed_of(data);
    auto run = [&](std::uint64_t seed) {
        train::trainer_options o;
        o.schedule.peak = 1e-2;
        o.init_seed = seed;
        train::trainer<float> t(models::t5(c).training_graph(), o);
        std::vector<double> losses;
        for (int s = 0; s < 60; ++s) losses.push_back(t.step(feed).loss);
        return losses;
    };
    const auto a = run(3), b = run(3), other = run(4);
    CHECK(a == b);
    CHECK(a != other);
    CHECK(a.front() == Approx(std::log(static_cast<double>(c.vocab))).epsilon(0.05));
    CHECK(a.back() < 0.5 * a.front());
}

TEST_CASE("T5: the synthetic batch reverses the source", "[t5]") {
    const auto c = tiny_t5();
    const auto a = models::t5_synthetic_batch(c, 9), b = models::t5_synthetic_batch(c, 9),
               other = models::t5_synthetic_batch(c, 10);
    CHECK(a.source == b.source);
    CHECK(a.source != other.source);
    REQUIRE(a.source.size() == static_cast<std::size_t>(c.batch * c.source_seq));
    REQUIRE(a.targets.size() == static_cast<std::size_t>(c.batch * c.target_seq));
    for (auto t : a.source) CHECK((t >= 1 && t < c.vocab));
    for (std::int64_t r = 0; r < c.batch; ++r)
        for (std::int64_t t = 0; t < c.target_seq; ++t) {
            const auto at = static_cast<std::size_t>(r * c.target_seq + t);
            CHECK(a.targets[at] == a.source[static_cast<std::size_t>(r * c.source_seq + c.source_seq - 1 - t)]);
            CHECK(a.target_in[at] == (t == 0 ? 0 : a.targets[at - 1]));
            CHECK(a.target_positions[at] == t);
        }
    CHECK(a.source_positions[static_cast<std::size_t>(c.source_seq + 3)] == 3);
}

TEST_CASE("T5: config errors name the field and the fix", "[t5]") {
    auto c = tiny_t5();
    c.heads = 3;
    CHECK_THROWS_WITH(models::t5(c), Catch::Contains("hidden 8 is not divisible by heads 3") &&
                                         Catch::Contains("choose heads that divide hidden"));
    c = tiny_t5();
    c.decoder_layers = 0;
    CHECK_THROWS_WITH(models::t5(c), Catch::Contains("decoder_layers is 0; it must be positive"));
    c = tiny_t5();
    c.vocab = 1;
    CHECK_THROWS_WITH(models::t5(c), Catch::Contains("vocab is 1") && Catch::Contains("start token"));
    c = tiny_t5();
    c.ffn = -4;
    CHECK_THROWS_WITH(models::t5(c), Catch::Contains("ffn is -4") && Catch::Contains("or 0 for 4 * hidden"));
    CHECK_THROWS_WITH(models::t5_table9(4), Catch::Contains("t5_table9: index 4 is out of range"));
}

// -------------------------------------------------------------------------------------- Swin

TEST_CASE("to_windows and merge_neighbours move every element where their laws say", "[swin]") {
    const std::int64_t B = 2, side = 8, w = 2, m = side / w, P = 3;
    const shape grid{{Dim::Batch::id, B}, {Dim::Seq::id, side * side}, {Dim::Channel::id, P}};
    const auto x = iota_values(static_cast<std::size_t>(B * side * side * P));
    const auto windows =
        run_forward([&](graph_builder& b) { return models::detail::swin::to_windows(b.input("x", grid), side, w); }, x);
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t i = 0; i < side; ++i)
            for (std::int64_t j = 0; j < side; ++j)
                for (std::int64_t k = 0; k < P; ++k) {
                    const std::int64_t hb = i / w, hr = i % w, wb = j / w, wr = j % w;
                    const std::int64_t at = ((b * m * m + hb * m + wb) * w * w + wr * w + hr) * P + k;
                    const std::int64_t from = (b * side * side + i * side + j) * P + k;
                    CHECK(windows[static_cast<std::size_t>(at)] == x[static_cast<std::size_t>(from)]);
                }

    // Merging the windowed grid: neighbours (2i' + dh, 2j' + dw) meet at (i', j'), channel block dh 2 + dw.
    const std::int64_t half = side / 2, n = m / 2;
    const shape windowed{{Dim::Batch::id, B}, {Dim::Head::id, m * m}, {Dim::HeadDim::id, w * w}, {Dim::Hidden::id, P}};
    const auto merged = run_forward(
        [&](graph_builder& b) { return models::detail::swin::merge_neighbours(b.input("x", windowed), side, w); },
        windows);
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t i = 0; i < half; ++i)
            for (std::int64_t j = 0; j < half; ++j)
                for (std::int64_t dh = 0; dh < 2; ++dh)
                    for (std::int64_t dw = 0; dw < 2; ++dw)
                        for (std::int64_t k = 0; k < P; ++k) {
                            const std::int64_t window = b * n * n + (i / w) * n + j / w, token = (j % w) * w + i % w;
                            const std::int64_t at = (window * w * w + token) * 4 * P + (dh * 2 + dw) * P + k;
                            const std::int64_t from = (b * side * side + (2 * i + dh) * side + 2 * j + dw) * P + k;
                            CHECK(merged[static_cast<std::size_t>(at)] == x[static_cast<std::size_t>(from)]);
                        }

    // Both are permutations: their gradients are the inverse permutations.
    testing::check_gradients([&](graph_builder& b) {
        return std::vector{
            models::detail::swin::to_windows(b.parameter("x", grid, parameter_init::normal(1.0)), side, w)};
    });
    testing::check_gradients([&](graph_builder& b) {
        return std::vector{
            models::detail::swin::merge_neighbours(b.parameter("x", windowed, parameter_init::normal(1.0)), side, w)};
    });
}

TEST_CASE("Swin: shapes, parameters, and attention within windows", "[swin]") {
    const auto c = tiny_swin();
    auto m = models::swin(c);
    const graph& g = m.ir();
    CHECK(g.parameter_count() == c.parameter_count());
    CHECK(numel_of_parameters(g) == c.parameter_count());
    CHECK(g.tensor(m.logits).dims.extent(0) == c.batch);
    CHECK(g.tensor(m.logits).dims.extent(1) == 1);
    CHECK(g.tensor(m.logits).dims.extent(2) == c.classes);
    // Attention runs over [b, windows * heads, window^2, head_dim] at every stage: the windows
    // stay 2 x 2 while the side halves.
    const std::int64_t windows[] = {16, 4, 1}, channels[] = {8, 16, 32};
    for (std::int64_t s = 0; s < c.stages(); ++s) {
        const std::int64_t heads = c.heads[static_cast<std::size_t>(s)];
        const node& a = node_named(g, "stages." + std::to_string(s) + ".blocks.0.attn/attention");
        const shape& q = g.tensor(a.inputs[0]).dims;
        CHECK(q.extent(0) == c.batch);
        CHECK(q.extent(1) == windows[s] * heads);
        CHECK(q.extent(2) == c.window * c.window);
        CHECK(q.extent(3) == channels[s] / heads);
    }
    // Patch merging ends every stage but the last.
    int merges = 0;
    for (const node& n : g.nodes)
        if (n.name.find("patch_merge.reduction/") != std::string::npos) {
            ++merges;
            CHECK((in_scope(n.name, "stages.0.blocks.1") || in_scope(n.name, "stages.1.blocks.2")));
        }
    CHECK(merges == 2);
    check_batch_splits_every_op(g);
}

TEST_CASE("Swin: a block mixes tokens within a window and nowhere else", "[swin]") {
    // The output of the first block, [b, 16 windows, 4 tokens, c], after a change of one patch.
    auto c = tiny_swin();
    c.init_std = 0.3;
    auto model = models::swin(c);
    const tensor_id block_out = node_named(model.ir(), "stages.0.blocks.0.mlp/add").outputs[0];
    const graph& g = model.ir();
    program p = compile_program(g, {.prec = precision::f64, .include_backward = false, .outputs = {block_out}});
    host::executor<double> ex(p);
    host::bound_storage<double> st(p);
    st.bind_to(ex);
    for (tensor_id t : g.parameters) train::initialize(st.real(t), g.tensor(t).init, 5, g.tensor(t).name);
    const auto data = models::swin_synthetic_batch(c, 2);
    auto run = [&](std::int64_t i, std::int64_t j, double delta) {
        auto in = st.real("patches");
        std::copy(data.patches.begin(), data.patches.end(), in.begin());
        in[static_cast<std::size_t>((i * c.side + j) * c.patch_dim)] += delta;  // image 0, patch (i, j)
        ex.run();
        auto out = st.real(block_out);
        return std::vector<double>(out.begin(), out.end());
    };
    const auto base = run(0, 0, 0.0);
    const std::int64_t per_window = 4 * c.embed, m = c.side / c.window;
    for (auto [i, j] : {std::pair<std::int64_t, std::int64_t>{0, 0}, {3, 2}, {6, 7}}) {
        const auto changed = run(i, j, 1.0);
        const std::int64_t window = (i / c.window) * m + j / c.window;
        for (std::int64_t w = 0; w < m * m; ++w) {
            int differs = 0;
            for (std::int64_t e = 0; e < per_window; ++e)
                differs += changed[static_cast<std::size_t>(w * per_window + e)] !=
                                   base[static_cast<std::size_t>(w * per_window + e)]
                               ? 1
                               : 0;
            INFO("patch (" << i << ", " << j << "), window " << w);
            if (w == window)
                CHECK(differs == per_window);  // every token of its window sees it
            else
                CHECK(differs == 0);
        }
    }
}

TEST_CASE("Swin: every block is a layer of one repeat, classed by stage", "[swin][folding]") {
    const auto c = tiny_swin();
    auto m = models::swin(c);
    const graph& g = m.ir();
    REQUIRE(g.repeats.size() == 1);
    CHECK(g.repeats[0].name == "blocks");
    CHECK(layer_scope_paths(g) == std::vector<std::string>{"stages.0.blocks.0", "stages.0.blocks.1",
                                                           "stages.1.blocks.0", "stages.1.blocks.1",
                                                           "stages.1.blocks.2", "stages.2.blocks.0"});
    const auto p = search::layers_from_scopes(g);
    REQUIRE(p.layers.size() == 2 + static_cast<std::size_t>(c.blocks()));
    CHECK(p.layers.front().role == search::layer_role::prologue);
    CHECK(p.layers.back().role == search::layer_role::epilogue);
    // Stage 0: a block, then a block that merges; stage 1: two blocks, then one that merges; stage 2.
    const auto cls = repeated_classes(p);
    CHECK(cls[2] == cls[3]);
    std::vector<int> distinct{cls[0], cls[1], cls[2], cls[4], cls[5]};
    std::sort(distinct.begin(), distinct.end());
    CHECK(std::adjacent_find(distinct.begin(), distinct.end()) == distinct.end());
    CHECK(p.classes == 7);  // with the prologue and the epilogue
    check_layer_nodes(g, p);
}

TEST_CASE("gradcheck: a whole Swin in float64", "[swin][grad]") {
    // Two stages (sides 4 and 2), so that patch merging is in it; smaller than tiny_swin()
    // because every checked element runs the model twice.
    auto c = tiny_swin();
    c.side = 4;
    c.depths = {2, 1};
    c.heads = {2, 2};
    c.init_std = 0.3;
    auto data = models::swin_synthetic_batch(c, 1);
    train::trainer<double> t(models::swin(c).training_graph(), {});
    CHECK(testing::check_model_gradients(t, feed_of(data)) > 150);
}

TEST_CASE("training Swin is deterministic and the loss falls", "[swin][train]") {
    auto c = tiny_swin();
    c.batch = 4;
    const auto data = models::swin_synthetic_batch(c, 3);
    const auto feed = feed_of(data);
    auto run = [&](std::uint64_t seed) {
        train::trainer_options o;
        o.schedule.peak = 1e-2;
        o.init_seed = seed;
        train::trainer<float> t(models::swin(c).training_graph(), o);
        std::vector<double> losses;
        for (int s = 0; s < 20; ++s) losses.push_back(t.step(feed).loss);
        return losses;
    };
    const auto a = run(3), b = run(3), other = run(4);
    CHECK(a == b);
    CHECK(a != other);
    CHECK(a.front() == Approx(std::log(static_cast<double>(c.classes))).epsilon(0.1));
    CHECK(a.back() < 0.5 * a.front());
}

TEST_CASE("Swin: the synthetic batch is deterministic and in range", "[swin]") {
    const auto c = tiny_swin();
    const auto a = models::swin_synthetic_batch(c, 9), b = models::swin_synthetic_batch(c, 9),
               other = models::swin_synthetic_batch(c, 10);
    CHECK(a.patches == b.patches);
    CHECK(a.patches != other.patches);
    CHECK(a.patches.size() == static_cast<std::size_t>(c.batch * c.side * c.side * c.patch_dim));
    REQUIRE(a.labels.size() == static_cast<std::size_t>(c.batch));
    for (auto l : a.labels) CHECK((l >= 0 && l < c.classes));
}

TEST_CASE("Swin: config errors name the field and the fix", "[swin]") {
    auto c = tiny_swin();
    c.window = 4;  // sides 8, 4, 2
    CHECK_THROWS_WITH(models::swin(c), Catch::Contains("stage 2 has 2 tokens per side, which window 4 does not "
                                                       "divide; choose a window that divides every stage's side "
                                                       "(8, 4, 2)"));
    c = tiny_swin();
    c.side = 6;
    CHECK_THROWS_WITH(models::swin(c), Catch::Contains("side 6 is not divisible by 4 = 2^(stages - 1)") &&
                                           Catch::Contains("choose a side that is a multiple of 4"));
    c = tiny_swin();
    c.heads = {2, 2};
    CHECK_THROWS_WITH(models::swin(c), Catch::Contains("depths has 3 stages but heads has 2"));
    c = tiny_swin();
    c.heads = {2, 3, 4};
    CHECK_THROWS_WITH(models::swin(c), Catch::Contains("stage 1 has 16 channels") &&
                                           Catch::Contains("heads[1] = 3 does not divide"));
    c = tiny_swin();
    c.depths = {2, 0, 1};
    CHECK_THROWS_WITH(models::swin(c), Catch::Contains("depths[1] is 0; it must be positive"));
    CHECK_THROWS_WITH(models::swin_table9(-1), Catch::Contains("swin_table9: index -1 is out of range"));
}

// ------------------------------------------------------------------------------------ Table 9

TEST_CASE("Table 9: the parameter counts of the built graphs are the paper's within 10%", "[t5][swin][table9]") {
    // Forward graphs at batch 1 only: shapes, no storage. The paper's counts are rounded
    // (1.8B, 3.9B, ...); the configurations' other choices are in t5_table9 and swin_table9.
    const double t5_paper[] = {3.9e9, 11e9, 21e9, 47e9}, swin_paper[] = {1.8e9, 5.0e9, 10e9, 27e9};
    for (int i = 0; i < 4; ++i) {
        const auto tc = models::t5_table9(i);
        const auto t5 = models::t5(tc);
        const std::int64_t t5_count = numel_of_parameters(t5.ir());
        CHECK(t5_count == tc.parameter_count());
        INFO("T5 configuration " << i << ": " << t5_count << " parameters");
        CHECK(static_cast<double>(t5_count) == Approx(t5_paper[i]).epsilon(0.10));
        CHECK(std::stod(models::t5_table9_name(i)) * 1e9 == Approx(t5_paper[i]));
        CHECK(tc.layers() == (i == 0 ? 48 : 64));
        const auto t5_layers = search::layers_from_scopes(t5.ir());
        CHECK(t5_layers.repeated().size() == static_cast<std::size_t>(tc.layers()));
        CHECK(t5_layers.classes == 4);

        const auto sc = models::swin_table9(i);
        const auto swin = models::swin(sc);
        const std::int64_t swin_count = numel_of_parameters(swin.ir());
        CHECK(swin_count == sc.parameter_count());
        INFO("Swin configuration " << i << ": " << swin_count << " parameters");
        CHECK(static_cast<double>(swin_count) == Approx(swin_paper[i]).epsilon(0.10));
        CHECK(std::stod(models::swin_table9_name(i)) * 1e9 == Approx(swin_paper[i]));
        CHECK(sc.blocks() == 32 + 8 * i);
        // Classes: stage 0's two blocks (the second merges), stage 1's, stage 2's plain and last
        // blocks, stage 3's block; with the prologue and the epilogue.
        const auto swin_layers = search::layers_from_scopes(swin.ir());
        CHECK(swin_layers.repeated().size() == static_cast<std::size_t>(sc.blocks()));
        CHECK(swin_layers.classes == 9);
    }
}
