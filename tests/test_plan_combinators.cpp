// Typed plan combinators (plan/combinators.hpp): the checks at compile time (well_formed,
// error_message), the lowering to plan_spec and resolved_plan, open parameters, run-time
// degrees and the run-time twins of the static checks.
#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include <loom/models/gpt.hpp>
#include <loom/ops/all.hpp>
#include <loom/partition/apply.hpp>
#include <loom/plan/combinators.hpp>
#include <loom/plan/presets.hpp>

using namespace loom;

namespace {

// The first error the checks find in a plan made of Parts, as text.
template <class... Parts>
std::string error_of() {
    return std::string(plan::error_message<Parts...>.view());
}

models::gpt_model small_gpt() {
    return models::gpt({.layers = 2, .hidden = 32, .heads = 4, .vocab = 64, .seq = 16, .batch = 8});
}

// Same partition for every forward node (the resolved plans' names may differ).
void require_same_partitions(const plan::resolved_plan& a, const plan::resolved_plan& b) {
    REQUIRE(a.devices == b.devices);
    REQUIRE(a.zero == b.zero);
    REQUIRE(a.forward.size() == b.forward.size());
    for (std::size_t i = 0; i < a.forward.size(); ++i) {
        INFO("forward node " << i);
        REQUIRE(a.forward[i] == b.forward[i]);
    }
}

// Ids of the forward nodes that `pick` selects.
std::vector<std::size_t> nodes_where(const graph& g, const plan::resolved_plan& p,
                                     const std::function<bool(const plan::op_partition&)>& pick) {
    std::vector<std::size_t> out;
    for (std::size_t i = 0; i < p.forward.size(); ++i)
        if (p.forward[i] && pick(*p.forward[i])) out.push_back(i);
    (void)g;
    return out;
}

std::vector<std::size_t> nodes_named(const graph& g, std::size_t forward, const std::function<bool(std::string_view)>& pick) {
    std::vector<std::size_t> out;
    for (std::size_t i = 0; i < forward; ++i)
        if (pick(g.nodes[i].name)) out.push_back(i);
    return out;
}

}  // namespace

// ---- compile time: well_formed and the messages -------------------------------------------

// Well-formed plans and parts.
static_assert(plan::well_formed<decltype(plan::compose(plan::devices<4>,
                                                       plan::on_all(plan::trans<Split<Dim::Batch>, 4>{})))>);
static_assert(plan::well_formed<decltype(plan::on<ops::Linear>(plan::trans<Split<Var<"n">>, 2>{}))>);
static_assert(plan::well_formed<decltype(plan::on<ops::LinearBias>(plan::trans<Split<Var<"k">>, 2>{}))>,
              "LinearBias' k is cut by a built-in custom transformation");
static_assert(plan::well_formed<decltype(plan::on<ops::Attention>(
                  plan::trans<Split<Dim::Batch>, 2, Split<Dim::Head>, 2>{}))>);
static_assert(plan::well_formed<decltype(plan::on<ops::SplitHeads, ops::MergeHeads>(plan::trans<Split<Dim::Seq>, 2>{}))>);
static_assert(plan::well_formed<plan::trans<Split<Dim::Batch>, plan::open<Pow2<1, 16>, "dp">>>);
static_assert(plan::well_formed<plan::devices_t<8>, plan::extent_t<Dim::Head, 12>,
                                decltype(plan::on_all(plan::trans<Split<Dim::Head>, plan::open<DivisorsOf<12>>>{}))>);
static_assert(plan::well_formed<plan::devices_t<4>, decltype(plan::on<ops::Attention>(
                                                        plan::trans<Split<Dim::Head>, 8>{}, plan::colocate<2>))>);
static_assert(plan::well_formed<plan::devices_t<2>, plan::colocation_requires_recompute_t,
                                decltype(plan::on<ops::Attention>(plan::trans<Split<Dim::Head>, 4>{}, plan::colocate<2>,
                                                                  plan::recompute))>);

// A frozen variable that a registered transformation cuts (vocabulary-parallel loss).
static_assert(plan::well_formed<decltype(plan::on<ops::CrossEntropy>(plan::trans<Split<Var<"v">>, 2>{}))>);

// Ill-formed ones: the trait says so without a hard error.
static_assert(!plan::well_formed<plan::trans<Split<Dim::Batch>, 0>>);
static_assert(!plan::well_formed<decltype(plan::trans<Split<Dim::Batch>, 0>{})>);
static_assert(!plan::well_formed<decltype(plan::on<ops::Linear>(plan::trans<Split<Var<"x">>, 2>{}))>);
static_assert(!plan::well_formed<decltype(plan::on<ops::LayerNorm>(plan::trans<Split<Var<"h">>, 2>{}))>);
static_assert(!plan::well_formed<decltype(plan::on<ops::Softmax>(plan::trans<Split<Var<"n">>, 2>{}))>);
static_assert(!plan::well_formed<decltype(plan::on<ops::Attention>(plan::trans<Split<Dim::Seq>, 2>{}))>);
static_assert(!plan::well_formed<decltype(plan::on<ops::Attention>(plan::trans<Split<Dim::Hidden>, 2>{}))>);
static_assert(!plan::well_formed<decltype(plan::on<ops::SplitHeads>(plan::trans<Split<Dim::Hidden>, 2>{}))>);
static_assert(!plan::well_formed<decltype(plan::on_all(plan::trans<Split<Dim::Head>, 2, Split<Dim::Head>, 2>{}))>);
static_assert(!plan::well_formed<plan::devices_t<8>, plan::devices_t<4>>);
static_assert(!plan::well_formed<plan::devices_t<8>, decltype(plan::on_all(plan::trans<Split<Dim::Batch>, 3>{}))>);
static_assert(!plan::well_formed<plan::devices_t<4>, decltype(plan::on_all(plan::trans<Split<Dim::Batch>, 4,
                                                                                          Split<Dim::Head>, 2>{}))>);
static_assert(!plan::well_formed<plan::extent_t<Dim::Head, 12>, decltype(plan::on_all(plan::trans<Split<Dim::Head>, 8>{}))>);
static_assert(!plan::well_formed<plan::forbid_t<Split<Dim::Seq>>, decltype(plan::on_all(plan::trans<Split<Dim::Seq>, 2>{}))>);
static_assert(!plan::well_formed<plan::trans<Split<Dim::Batch>, plan::open<Pow2<8, 2>>>>);
static_assert(!plan::well_formed<plan::devices_t<8>,
                                 decltype(plan::on_all(plan::trans<Split<Dim::Batch>, plan::open<OneOf<3, 5>>>{}))>);
static_assert(!plan::well_formed<decltype(plan::on_all(plan::trans<Split<Dim::Head>, 4>{}, plan::assign<0, 1, 2>))>);
static_assert(!plan::well_formed<plan::devices_t<4>,
                                 decltype(plan::on_all(plan::trans<Split<Dim::Head>, 4>{}, plan::assign<0, 1, 2, 4>))>);
static_assert(!plan::well_formed<decltype(plan::on_all(plan::trans<Split<Dim::Head>, 4>{}, plan::colocate<3>))>);
static_assert(!plan::well_formed<plan::colocation_requires_recompute_t,
                                 decltype(plan::on_all(plan::trans<Split<Dim::Head>, 4>{}, plan::colocate<2>))>);
static_assert(!plan::well_formed<plan::zero_t<4>>);
static_assert(!plan::well_formed<decltype(plan::on_layers<"blocks", 3, 1>(plan::recompute))>);
static_assert(!plan::well_formed<decltype(plan::on_name<"">(plan::recompute))>);
static_assert(!plan::well_formed<decltype(plan::on_all())>);
static_assert(!plan::well_formed<int>, "a foreign type is not a plan part");

// One name, one range; the same trans in two rules shares its named parameter.
using dp_up_to_8 = plan::trans<Split<Dim::Batch>, plan::open<Pow2<1, 8>, "dp">>;
static_assert(plan::well_formed<decltype(plan::on_all(dp_up_to_8{})), decltype(plan::on<ops::Linear>(dp_up_to_8{}))>);
static_assert(!plan::well_formed<decltype(plan::on_all(dp_up_to_8{})),
                                 decltype(plan::on<ops::Linear>(
                                     plan::trans<Split<Dim::Batch>, plan::open<OneOf<1, 2>, "dp">>{}))>);

TEST_CASE("plan combinators: compile-time messages name the combinator, the op and the fix", "[plan][combinators]") {
    CHECK(error_of<decltype(plan::on<ops::Attention>(plan::trans<Split<Dim::Seq>, 2>{}))>() ==
          "plan::trans<Split<Seq>, 2> on attention: Seq is frozen in this op ('s', 't'; splitting it would change the "
          "result); split Batch or Head instead");
    CHECK_THAT(error_of<decltype(plan::on<ops::Linear>(plan::trans<Split<Var<"x">>, 2>{}))>(),
               Catch::StartsWith("plan::trans<Split<Var<\"x\">>, 2> on linear: the op has no variable 'x'") &&
                   Catch::Contains("k, n"));
    CHECK_THAT(error_of<decltype(plan::on<ops::LayerNorm>(plan::trans<Split<Var<"h">>, 2>{}))>(),
               Catch::Contains("on layer_norm: 'h' is frozen in this op"));
    CHECK_THAT(error_of<decltype(plan::on<ops::SplitHeads>(plan::trans<Split<Dim::Hidden>, 2>{}))>(),
               Catch::Contains("Hidden is the grouped axis (h d)") && Catch::Contains("split Head"));
    CHECK_THAT((error_of<plan::trans<Split<Dim::Batch>, 0>>()),
               Catch::StartsWith("plan::trans<Split<Batch>, 0>: the degree of Split<Batch> is 0"));
    CHECK_THAT((error_of<plan::devices_t<8>, decltype(plan::on_all(plan::trans<Split<Dim::Batch>, 3>{}))>()),
               Catch::Contains("does not divide devices<8>; choose a divisor of 8 (1, 2, 4, 8)"));
    CHECK_THAT((error_of<plan::extent_t<Dim::Head, 12>, decltype(plan::on_all(plan::trans<Split<Dim::Head>, 8>{}))>()),
               Catch::Contains("plan::extent<Head, 12> is not divisible by the degree 8") &&
                   Catch::Contains("(1, 2, 3, 4, 6, 12)"));
    CHECK_THAT((error_of<plan::devices_t<8>, plan::devices_t<4>>()),
               Catch::StartsWith("plan::devices<4>: the plan already says plan::devices<8>"));
    CHECK_THAT((error_of<plan::forbid_t<Split<Dim::Seq>>, decltype(plan::on_all(plan::trans<Split<Dim::Seq>, 2>{}))>()),
               Catch::StartsWith("plan::forbid<Split<Seq>>: plan::trans<Split<Seq>, 2> in on_all splits Seq"));
    CHECK(error_of<decltype(plan::on_all(plan::trans<Split<Dim::Batch>, 2>{}))>().empty());
}

// ---- lowering ------------------------------------------------------------------------------

TEST_CASE("plan combinators: data parallelism lowers to what the preset resolves to", "[plan][combinators]") {
    auto model = small_gpt();
    constexpr auto dp = plan::compose(plan::devices<4>, plan::on_all(plan::trans<Split<Dim::Batch>, 4>{}));
    static_assert(plan::well_formed<decltype(dp)>);

    const plan::plan_spec spec = dp.spec();
    CHECK(spec.devices == 4);
    REQUIRE(spec.rules.size() == 1);
    REQUIRE(spec.rules[0].trans);
    CHECK(spec.rules[0].trans->at(0).dim == Dim::Batch::id);
    CHECK(spec.rules[0].trans->at(0).degree.value == 4);
    CHECK(spec.rules[0].origin == "plan::trans<Split<Batch>, 4>");

    const auto resolved = dp.resolve(model.ir());
    require_same_partitions(resolved, plan::resolve(plan::presets::data_parallel(4), model.ir()));
    // And it partitions the model.
    CHECK_NOTHROW(partition::apply_plan(model.ir(), resolved));
}

TEST_CASE("plan combinators: Megatron written with selectors resolves as the preset", "[plan][combinators]") {
    auto model = small_gpt();
    using tp2_n = plan::trans<Split<Var<"n">>, 2>;
    using tp2_k = plan::trans<Split<Var<"k">>, 2>;
    constexpr auto megatron = plan::compose(
        plan::devices<2>,
        plan::on_all(plan::trans<Replicate, 2>{}),
        plan::on_scope<"*.attn.q">(tp2_n{}), plan::on_scope<"*.attn.k">(tp2_n{}), plan::on_scope<"*.attn.v">(tp2_n{}),
        plan::on_scope<"*.mlp.fc">(tp2_n{}),
        plan::on_scope<"*.attn.proj">(tp2_k{}), plan::on_scope<"*.mlp.proj">(tp2_k{}),
        plan::on_scope<"*.attn">(plan::on<ops::SplitHeads, ops::Attention, ops::MergeHeads>(
            plan::trans<Split<Dim::Head>, 2>{})),
        plan::on_scope<"*.mlp">(plan::on<ops::Gelu, ops::Relu, ops::Silu, ops::Mul>(plan::trans<Split<Dim::FFN>, 2>{})),
        plan::on<ops::Embedding>(plan::trans<Split<Var<"v">>, 2>{}),
        plan::on_name<"linear*">(plan::on<ops::Linear>(tp2_n{})),
        plan::on<ops::CrossEntropy>(plan::trans<Split<Var<"v">>, 2>{}));
    static_assert(plan::well_formed<decltype(megatron)>);
    const auto resolved = megatron.resolve(model.ir());
    require_same_partitions(resolved, plan::resolve(plan::presets::megatron(2), model.ir()));
    // LinearBias' k and cross_entropy's v pass the run-time checks too (custom transformations cut them).
    CHECK_NOTHROW(partition::apply_plan(model.ir(), resolved));
}

TEST_CASE("plan combinators: nested splits, assign, colocate, recompute and zero land in the plan", "[plan][combinators]") {
    auto model = small_gpt();
    const graph& g = model.ir();
    constexpr auto p = plan::compose(
        plan::devices<2>, plan::colocation_requires_recompute, plan::zero<2>,
        plan::on<ops::Attention>(plan::trans<Split<Dim::Batch>, 2, Split<Dim::Head>, 2>{}, plan::colocate<2>,
                                 plan::recompute),
        plan::on<ops::MergeHeads>(plan::trans<Split<Dim::Head>, 2>{}, plan::assign<1, 0>));
    const plan::plan_spec spec = p.spec();
    CHECK(spec.colocation_requires_recompute);
    CHECK(spec.zero == plan::zero_stage::gradients);
    const auto resolved = p.resolve(g);
    CHECK(resolved.zero == plan::zero_stage::gradients);
    int attention = 0, merge = 0;
    for (std::size_t i = 0; i < resolved.forward.size(); ++i) {
        const node& n = g.nodes[i];
        if (is_op<ops::Attention>(n)) {
            ++attention;
            REQUIRE(resolved.forward[i]);
            const plan::op_partition& op = *resolved.forward[i];
            REQUIRE(op.splits.size() == 2);
            CHECK(op.splits[0] == plan::split_axis{Dim::Batch::id, "", 2, false});
            CHECK(op.splits[1] == plan::split_axis{Dim::Head::id, "", 2, false});
            CHECK(op.devices == std::vector<int>{0, 0, 1, 1});
            CHECK(op.recompute);
        } else if (is_op<ops::MergeHeads>(n)) {
            ++merge;
            REQUIRE(resolved.forward[i]);
            CHECK(resolved.forward[i]->devices == std::vector<int>{1, 0});
            CHECK_FALSE(resolved.forward[i]->recompute);
        } else {
            CHECK_FALSE(resolved.forward[i].has_value());
        }
    }
    CHECK(attention == 2);
    CHECK(merge == 2);
    CHECK_NOTHROW(partition::apply_plan(g, resolved));
}

// ---- selectors -----------------------------------------------------------------------------

TEST_CASE("plan combinators: on_layers picks only the layers in its range", "[plan][combinators]") {
    auto model = small_gpt();
    const graph& g = model.ir();
    constexpr auto first_layer = plan::compose(plan::devices<2>, plan::on_layers<"blocks", 0, 0>(plan::recompute));
    const auto resolved = first_layer.resolve(g);
    const auto recomputed = nodes_where(g, resolved, [](const plan::op_partition& p) { return p.recompute; });
    const auto in_layer_0 = nodes_named(g, resolved.forward.size(),
                                        [](std::string_view name) { return name.starts_with("blocks.0."); });
    CHECK(!recomputed.empty());
    CHECK(recomputed == in_layer_0);

    constexpr auto from_layer_1 =
        plan::compose(plan::devices<2>, plan::on_layers<"blocks", 1>(plan::trans<Split<Dim::Batch>, 2>{}));
    const auto split = nodes_where(g, from_layer_1.resolve(g), [](const plan::op_partition&) { return true; });
    CHECK(split == nodes_named(g, resolved.forward.size(),
                               [](std::string_view name) { return name.starts_with("blocks.1."); }));
}

TEST_CASE("a recompute policy lowers to recompute rules over its layers", "[plan][presets][recompute]") {
    auto model = small_gpt();
    const graph& g = model.ir();
    const auto recomputed = [&](plan::recompute_policy r) {
        plan::plan_spec p = plan::presets::data_parallel(2).then(plan::presets::recompute_layers(r, 1, 1));
        const auto resolved = plan::resolve(p, g);
        return nodes_where(g, resolved, [](const plan::op_partition& op) { return op.recompute; });
    };
    CHECK(plan::presets::recompute_layers(plan::recompute_policy::none, 0, -1).rules.empty());
    CHECK(recomputed(plan::recompute_policy::none).empty());
    // full: every op of layer 1
    CHECK(recomputed(plan::recompute_policy::full) ==
          nodes_named(g, plan::resolve(plan::presets::data_parallel(2), g).forward.size(),
                      [](std::string_view name) { return name.starts_with("blocks.1."); }));
    // selective: the attention core of layer 1 only
    const auto selective = recomputed(plan::recompute_policy::selective);
    REQUIRE(selective.size() == 1);
    CHECK(g.at(selective.front()).op == &op_def_of<ops::Attention>());
    CHECK(g.at(selective.front()).name.starts_with("blocks.1."));
    CHECK(plan::to_string(plan::recompute_policy::selective) == "selective");
}

TEST_CASE("plan combinators: on_name and on_scope select by glob", "[plan][combinators]") {
    auto model = small_gpt();
    const graph& g = model.ir();
    constexpr auto mlp = plan::compose(plan::devices<2>, plan::on_name<"blocks.*.mlp*">(plan::trans<Split<Dim::Batch>, 2>{}));
    const auto resolved = mlp.resolve(g);
    const auto split = nodes_where(g, resolved, [](const plan::op_partition&) { return true; });
    const auto mlp_nodes = nodes_named(g, resolved.forward.size(), [](std::string_view name) {
        return name.starts_with("blocks.") && name.find(".mlp") != std::string_view::npos;
    });
    CHECK(split.size() == 8);  // fc, gelu, proj, add in each of 2 layers
    CHECK(split == mlp_nodes);

    constexpr auto attention = plan::compose(
        plan::devices<2>, plan::on_scope<"*.attn">(plan::on<ops::Attention>(plan::trans<Split<Dim::Head>, 2>{})));
    const auto heads = nodes_where(g, attention.resolve(g), [](const plan::op_partition&) { return true; });
    CHECK(heads == nodes_named(g, resolved.forward.size(),
                               [](std::string_view name) { return name.ends_with("attn/attention"); }));
}

// ---- open parameters -----------------------------------------------------------------------

TEST_CASE("plan combinators: open parameters are named, chosen and checked", "[plan][combinators]") {
    auto model = small_gpt();
    const graph& g = model.ir();
    constexpr auto space =
        plan::compose(plan::devices<8>, plan::on_all(plan::trans<Split<Dim::Batch>, plan::open<Pow2<1, 8>>>{}));
    static_assert(plan::well_formed<decltype(space)>);
    CHECK(space.open_parameters() == std::vector<std::string>{"trans#0.degree"});

    SECTION("a chosen value resolves like a fixed one") {
        auto chosen = space.choose("trans#0.degree", 4).resolve(g);
        auto fixed = plan::compose(plan::devices<8>, plan::on_all(plan::trans<Split<Dim::Batch>, 4>{})).resolve(g);
        require_same_partitions(chosen, fixed);
    }
    SECTION("a missing choice names the parameter") {
        CHECK_THROWS_WITH(space.resolve(g), Catch::Contains("open parameter 'trans#0.degree'") &&
                                                Catch::Contains("has no value") && Catch::Contains("choose"));
    }
    SECTION("a value outside the range is refused with the range") {
        CHECK_THROWS_AS(space.choose("trans#0.degree", 3).spec(), plan_error);
        CHECK_THROWS_WITH(space.choose("trans#0.degree", 3).spec(),
                          Catch::Contains("was given 3, outside its range {1, 2, 4, 8}"));
    }
    SECTION("an unknown name is refused with the known ones") {
        CHECK_THROWS_WITH(space.choose("tp", 2),
                          Catch::Contains("has no open parameter 'tp'") && Catch::Contains("trans#0.degree"));
    }
}

TEST_CASE("plan combinators: one name, one value; chosen values meet the same checks", "[plan][combinators]") {
    auto model = small_gpt();
    const graph& g = model.ir();
    constexpr auto space = plan::compose(
        plan::devices<4>,
        plan::on_all(plan::trans<Split<Dim::Batch>, plan::open<OneOf<1, 2, 3, 4>, "dp">>{}),
        plan::on<ops::Attention>(plan::trans<Split<Dim::Batch>, plan::open<OneOf<1, 2, 3, 4>, "dp">, Split<Dim::Head>,
                                             plan::open<Pow2<1, 4>>>{}));
    CHECK(space.open_parameters() == std::vector<std::string>{"dp", "trans#1.degree1"});

    const auto resolved = space.choose("dp", 2).choose("trans#1.degree1", 2).resolve(g);
    for (std::size_t i = 0; i < resolved.forward.size(); ++i) {
        REQUIRE(resolved.forward[i]);
        CHECK(resolved.forward[i]->splits[0].degree == 2);
        CHECK(resolved.forward[i]->splits.size() == (is_op<ops::Attention>(g.nodes[i]) ? 2u : 1u));
    }
    // 3 is in the range but does not divide devices<4>: the compile-time check, at run time.
    CHECK_THROWS_WITH(space.choose("dp", 3).choose("trans#1.degree1", 1).spec(),
                      Catch::StartsWith("plan::trans<Split<Batch>, open<OneOf<1, 2, 3, 4>, \"dp\">>: the degree 3 of "
                                        "Split<Batch> does not divide devices<4>"));
}

// ---- run-time degrees and device counts ----------------------------------------------------

TEST_CASE("plan combinators: run-time degrees are checked when known", "[plan][combinators]") {
    auto model = small_gpt();
    const graph& g = model.ir();

    SECTION("a degree that divides everything resolves") {
        const int world = 2;
        const auto p = plan::compose(plan::on_all(plan::trans<Split<Dim::Batch>, plan::runtime>{world}));
        require_same_partitions(p.resolve(g, world), plan::resolve(plan::presets::data_parallel(2), g));
    }
    SECTION("a degree that does not divide an extent of the graph: op, dim, extent, degree") {
        const auto p = plan::compose(plan::on_all(plan::trans<Split<Dim::Batch>, plan::runtime>{3}));
        const auto resolved = p.resolve(g, 3);
        CHECK_THROWS_AS(partition::apply_plan(g, resolved), plan_error);
        CHECK_THROWS_WITH(partition::apply_plan(g, resolved),
                          Catch::Contains("embedding") && Catch::Contains("dim Batch has extent 8") &&
                              Catch::Contains("degree 3 does not divide"));
    }
    SECTION("a degree that does not divide a declared extent: the compile-time message") {
        const auto p = plan::compose(plan::extent<Dim::Batch, 8>,
                                     plan::on_all(plan::trans<Split<Dim::Batch>, plan::runtime>{3}));
        CHECK_THROWS_WITH(p.spec(3), Catch::StartsWith("plan::trans<Split<Batch>, runtime>: plan::extent<Batch, 8> is "
                                                       "not divisible by the degree 3 of Split<Batch>"));
    }
    SECTION("a degree below 1") {
        const auto p = plan::compose(plan::on_all(plan::trans<Split<Dim::Batch>, plan::runtime>{0}));
        CHECK_THROWS_WITH(p.spec(2), Catch::Contains("the degree of Split<Batch> is 0"));
    }
    SECTION("more pieces than devices") {
        const auto p = plan::compose(
            plan::on_all(plan::trans<Split<Dim::Batch>, plan::runtime, Split<Dim::Head>, plan::runtime>{2, 2}));
        CHECK_THROWS_WITH(p.spec(2), Catch::Contains("4 pieces but devices<2>"));
    }
    SECTION("all_devices takes the device count") {
        constexpr auto p = plan::compose(plan::on_all(plan::trans<Split<Dim::Batch>, plan::all_devices>{}));
        require_same_partitions(p.resolve(g, 4), plan::resolve(plan::presets::data_parallel(4), g));
    }
    SECTION("a device count that contradicts devices<N>") {
        constexpr auto p = plan::compose(plan::devices<4>, plan::on_all(plan::trans<Split<Dim::Batch>, 4>{}));
        CHECK_THROWS_WITH(p.spec(8), Catch::Contains("the plan says devices<4>"));
        CHECK(p.spec(4).devices == 4);
    }
}

TEST_CASE("plan combinators: extent facts are checked against the graph they resolve on", "[plan][combinators]") {
    auto model = small_gpt();  // 4 heads
    constexpr auto right = plan::compose(plan::devices<4>, plan::extent<Dim::Head, 4>,
                                         plan::on<ops::Attention>(plan::trans<Split<Dim::Head>, 4>{}));
    CHECK_NOTHROW(right.resolve(model.ir()));
    constexpr auto wrong = plan::compose(plan::devices<4>, plan::extent<Dim::Head, 12>,
                                         plan::on<ops::Attention>(plan::trans<Split<Dim::Head>, 4>{}));
    CHECK_THROWS_WITH(wrong.resolve(model.ir()),
                      Catch::StartsWith("plan::extent<Head, 12>: the graph's Head is 4 in split_heads"));
}

TEST_CASE("a rule whose selector matches no op of the model is refused; a preset's parts may be absent",
          "[plan][errors]") {
    auto model = models::gpt({.layers = 2, .hidden = 16, .heads = 4, .vocab = 32, .seq = 8, .batch = 8});
    const auto typo = plan::compose(plan::devices<2>, plan::on_scope<"blocks.*.atn">(plan::trans<Split<Dim::Batch>, 2>{}));
    CHECK_THROWS_WITH(partition::apply_plan(model.ir(), typo),
                      Catch::Contains("matches no op") && Catch::Contains("blocks.*.atn"));
    const auto beyond = plan::compose(plan::devices<2>, plan::on_layers<"blocks", 5, 7>(plan::recompute));
    CHECK_THROWS_WITH(partition::apply_plan(model.ir(), beyond), Catch::Contains("matches no op"));
    // megatron() also has rules for SiLU and gated MLPs, which this GPT lacks.
    CHECK_NOTHROW(partition::apply_plan(model.ir(), plan::presets::megatron(2)));
}

// forbid holds whichever way the split is spelled: a dim tag, or an op's own variable of that dim.
static_assert(!plan::well_formed<decltype(plan::devices<2>), decltype(plan::forbid<Split<Dim::Head>>),
                                 decltype(plan::on<ops::Attention>(plan::trans<Split<Var<"h">>, 2>{}))>);
static_assert(!plan::well_formed<decltype(plan::devices<2>), decltype(plan::forbid<Split<Var<"h">>>),
                                 decltype(plan::on<ops::Attention>(plan::trans<Split<Dim::Head>, 2>{}))>);
static_assert(plan::well_formed<decltype(plan::devices<2>), decltype(plan::forbid<Split<Dim::Seq>>),
                                decltype(plan::on<ops::Attention>(plan::trans<Split<Var<"h">>, 2>{}))>);
// colocation_requires_recompute holds whichever part places pieces together: colocate<2>, or
// an assign that names a device twice.
static_assert(!plan::well_formed<decltype(plan::devices<2>), decltype(plan::colocation_requires_recompute),
                                 decltype(plan::on<ops::Attention>(plan::trans<Split<Dim::Head>, 4>{}, plan::assign<0, 0, 1, 1>))>);
static_assert(plan::well_formed<decltype(plan::devices<2>), decltype(plan::colocation_requires_recompute),
                                decltype(plan::on<ops::Attention>(plan::trans<Split<Dim::Head>, 4>{}, plan::assign<0, 0, 1, 1>,
                                                                  plan::recompute))>);

// Coshard: the degrees count devices, the factor colocates more pieces on each; either may be open.
static_assert(plan::well_formed<plan::devices_t<2>, plan::colocation_requires_recompute_t,
                                decltype(plan::on<ops::Attention>(plan::trans<Split<Dim::Head>, 2>{}, plan::coshard<2>,
                                                                  plan::recompute))>);
static_assert(plan::well_formed<plan::devices_t<2>, plan::colocation_requires_recompute_t,
                                decltype(plan::on<ops::Attention>(plan::trans<Split<Dim::Head>, 2>{},
                                                                  plan::coshard<plan::open<OneOf<1, 2>, "cs">>))>,
              "1 colocates nothing: without recompute, the run time refuses only cs = 2");
static_assert(!plan::well_formed<plan::devices_t<2>, plan::colocation_requires_recompute_t,
                                 decltype(plan::on<ops::Attention>(plan::trans<Split<Dim::Head>, 2>{}, plan::coshard<2>))>);
static_assert(!plan::well_formed<plan::devices_t<2>, plan::colocation_requires_recompute_t,
                                 decltype(plan::on<ops::Attention>(plan::trans<Split<Dim::Head>, 2>{},
                                                                   plan::coshard<plan::open<OneOf<2, 4>>>))>);
static_assert(!plan::well_formed<plan::devices_t<2>, decltype(plan::on<ops::Attention>(plan::trans<Split<Dim::Head>, 4>{},
                                                                                         plan::coshard<2>, plan::recompute))>,
              "Coshard's degree counts devices: 4 heads' pieces on 2 devices need colocate, not coshard");
static_assert(!plan::well_formed<decltype(plan::on_all(plan::trans<Split<Dim::Head>, 2>{}, plan::coshard<0>))>);
static_assert(plan::well_formed<plan::devices_t<4>, plan::stages_t<2, plan::open<>>>);
static_assert(!plan::well_formed<plan::devices_t<4>, plan::stages_t<2, 3>>);

TEST_CASE("Coshard's factor and the devices per stage may be open parameters of a composed plan", "[plan][combinators]") {
    auto model = small_gpt();
    const graph& g = model.ir();
    constexpr auto space = plan::compose(
        plan::devices<2>, plan::colocation_requires_recompute,
        plan::on<ops::Attention>(plan::trans<Split<Dim::Head>, 2>{}, plan::coshard<plan::open<OneOf<1, 2>, "cs">>,
                                 plan::recompute_choice<"rc">));
    static_assert(plan::well_formed<decltype(space)>);
    CHECK(space.open_parameters() == std::vector<std::string>{"rc", "cs"});
    CHECK(plan::open_parameters(space.spec()) == std::vector<std::string>{"rc", "cs"});
    auto attention_of = [&](const plan::resolved_plan& resolved) {
        for (std::size_t i = 0; i < resolved.forward.size(); ++i)
            if (is_op<ops::Attention>(g.nodes[i])) return *resolved.forward[i];
        FAIL("no attention");
        return plan::op_partition{};
    };
    // cs = 2: the heads in 4 pieces, 2 on each of the 2 devices; cs = 1: one piece per device.
    const plan::op_partition two = attention_of(space.choose("rc", 1).choose("cs", 2).resolve(g));
    CHECK(two.splits.at(0) == plan::split_axis{Dim::Head::id, "", 4, false});
    CHECK(two.devices == std::vector<int>{0, 0, 1, 1});
    const plan::op_partition one = attention_of(space.choose("rc", 0).choose("cs", 1).resolve(g));
    CHECK(one.splits.at(0) == plan::split_axis{Dim::Head::id, "", 2, false});
    CHECK(one.devices == std::vector<int>{0, 1});
    // Colocated pieces without recompute, and a factor outside the range, are refused naming them.
    CHECK_THROWS_WITH(space.choose("rc", 0).choose("cs", 2).resolve(g),
                      Catch::Contains("coshard<2>") && Catch::Contains("requires colocated ops to recompute"));
    CHECK_THROWS_WITH(space.choose("rc", 1).choose("cs", 4).spec(), Catch::Contains("'cs'") && Catch::Contains("outside its range"));
    CHECK_THROWS_WITH(plan::resolve(space.choose("rc", 1).spec(), g), Catch::Contains("open parameter 'cs'"));
    CHECK_NOTHROW(partition::apply_plan(g, space.choose("rc", 1).choose("cs", 2).resolve(g)));

    // The devices of each stage, open: stages x devices per stage must make the plan's devices.
    constexpr auto pipeline = plan::compose(plan::devices<4>, plan::stages<2, plan::open<>>, plan::micro_batches<2>,
                                            plan::order<plan::OneFOneB>, plan::on_all(plan::trans<Split<Dim::Batch>, 2>{}));
    CHECK(pipeline.open_parameters() == std::vector<std::string>{"devices_per_stage"});
    CHECK_NOTHROW(partition::apply_plan(g, pipeline.choose("devices_per_stage", 2).resolve(g)));
    CHECK_THROWS_WITH(pipeline.choose("devices_per_stage", 4).resolve(g),
                      Catch::Contains("2 stages of 4 devices make 8 devices, but the plan has 4"));
}

TEST_CASE("constraints hold at run time whichever way a split or a placement is spelled", "[plan][errors]") {
    auto model = models::gpt({.layers = 2, .hidden = 16, .heads = 4, .vocab = 32, .seq = 8, .batch = 8});
    // A rule on all ops splits each op's variable "...1" (Seq in most ops): the plan forbids Seq.
    plan::plan_spec p = plan::presets::data_parallel(2);
    p.forbidden.push_back({Dim::Seq::id, "", {1, "", {}}, false});
    CHECK_NOTHROW(plan::resolve(p, model.ir()));
    plan::plan_spec by_label;
    by_label.devices = 2;
    plan::selector attention;
    attention.kinds = {&op_def_of<ops::Attention>()};
    by_label.add({attention, std::vector<plan::split_spec>{{{}, "s", {2, "", {}}, false}}, std::nullopt, std::nullopt, "mine"});
    by_label.forbidden.push_back({Dim::Seq::id, "", {1, "", {}}, false});
    CHECK_THROWS_WITH(plan::resolve(by_label, model.ir()),
                      Catch::Contains("forbid<Split<Seq>>") && Catch::Contains("splits s (dim Seq)"));
    // A placement that puts two pieces on one device, under colocation_requires_recompute.
    plan::plan_spec twice;
    twice.devices = 2;
    twice.colocation_requires_recompute = true;
    twice.add({attention, std::vector<plan::split_spec>{{Dim::Head::id, "", {4, "", {}}, false}},
               plan::assign_spec{{0, 0, 1, 1}, {1, "", {}}, 0}, std::nullopt, "mine"});
    CHECK_THROWS_WITH(plan::resolve(twice, model.ir()), Catch::Contains("several pieces on one device") &&
                                                            Catch::Contains("recompute"));
    twice.rules.back().recompute = true;
    CHECK_NOTHROW(plan::resolve(twice, model.ir()));
}
