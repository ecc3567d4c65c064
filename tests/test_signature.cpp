// Signatures: parsed at compile time, bound to shapes at graph-build time, and queried for
// the splits each op admits and what a split does to every operand.
#include <catch2/catch.hpp>

#include <loom/core/signature.hpp>
#include <loom/core/typed_signature.hpp>

using namespace loom;

namespace {
constexpr signature linear_sig = parse_signature("... k, n k -> ... n");
constexpr signature norm_sig = parse_signature("... h^, h^, h^ -> ... h^");
constexpr signature heads_sig = parse_signature("b s (h d) -> b h s d");
constexpr signature loss_sig = parse_signature("... v^, ... -> ");

// The parse happens in the compiler: these are facts about constant expressions.
static_assert(linear_sig.input_count == 2 && linear_sig.output_count == 1);
static_assert(linear_sig.var_count == 2);
static_assert(linear_sig.role(*linear_sig.find("k")) == dim_role::contracted);
static_assert(linear_sig.role(*linear_sig.find("n")) == dim_role::spatial);
static_assert(linear_sig.ellipsis_role() == dim_role::spatial);
static_assert(norm_sig.role(*norm_sig.find("h")) == dim_role::frozen);
static_assert(heads_sig.splittable(*heads_sig.find("h")) && !heads_sig.splittable(*heads_sig.find("d")));
static_assert(loss_sig.output_count == 1 && loss_sig.outputs[0].rank == 0);
static_assert(loss_sig.ellipsis_role() == dim_role::contracted);

}  // namespace

TEST_CASE("signatures reject malformed text", "[signature]") {
    CHECK_THROWS_WITH(parse_signature("a b c"), Catch::Contains("missing '->'"));
    CHECK_THROWS_WITH(parse_signature("a (b) -> a"), Catch::Contains("at least two variables"));
    CHECK_THROWS_WITH(parse_signature("a (b c -> a"), Catch::Contains("unclosed"));
    CHECK_THROWS_WITH(parse_signature("a ... -> a"), Catch::Contains("'...' may only open an operand"));
    CHECK_THROWS_WITH(parse_signature("a -> b -> c"), Catch::Contains("'->' appears twice"));
    CHECK_THROWS_WITH(parse_signature("a $ -> a"), Catch::Contains("unexpected character"));
    CHECK_THROWS_WITH(parse_signature("averyverylongname -> averyverylongname"), Catch::Contains("longer than 16"));
}

TEST_CASE("binding checks extents and names the operand", "[signature]") {
    std::vector<shape> ok{{{Dim::Batch::id, 4}, {Dim::Seq::id, 8}, {Dim::Hidden::id, 16}},
                          {{Dim::FFN::id, 32}, {Dim::Hidden::id, 16}}};
    std::vector<std::string> names{"x", "w"};
    auto b = bind_signature(linear_sig, "linear", "mlp/linear", ok, names);
    REQUIRE(b.vars.size() == 4);  // k, n, ...0, ...1
    CHECK(b.vars[*b.find("k")].extent == 16);
    CHECK(b.vars[*b.find("k")].dim == Dim::Hidden::id);
    CHECK(b.vars[*b.find("n")].dim == Dim::FFN::id);
    CHECK(output_shape(b, 0) == shape{{Dim::Batch::id, 4}, {Dim::Seq::id, 8}, {Dim::FFN::id, 32}});

    std::vector<shape> bad{ok[0], {{Dim::FFN::id, 32}, {Dim::Hidden::id, 12}}};
    CHECK_THROWS_AS(bind_signature(linear_sig, "linear", "mlp/linear", bad, names), shape_error);
    CHECK_THROWS_WITH(bind_signature(linear_sig, "linear", "mlp/linear", bad, names),
                      Catch::Contains("linear 'mlp/linear'") && Catch::Contains("input 1 'w'") &&
                          Catch::Contains("Hidden=12") && Catch::Contains("'k' = 16"));
    std::vector<shape> low_rank{{{Dim::Hidden::id, 16}}, {{Dim::Hidden::id, 16}}};
    CHECK_THROWS_WITH(bind_signature(linear_sig, "linear", "", low_rank, names), Catch::Contains("rank 1"));
    CHECK_THROWS_WITH(bind_signature(linear_sig, "linear", "", std::span<const shape>(ok.data(), 1), names),
                      Catch::Contains("expects 2 inputs, got 1"));
}

TEST_CASE("groups deduce their inner extent from presets", "[signature]") {
    std::vector<shape> in{{{Dim::Batch::id, 2}, {Dim::Seq::id, 5}, {Dim::Hidden::id, 12}}};
    std::vector<preset_variable> presets{{"h", Dim::Head::id, 3}, {"d", Dim::HeadDim::id, 0}};
    auto b = bind_signature(heads_sig, "split_heads", "", in, {}, presets);
    CHECK(b.vars[*b.find("d")].extent == 4);
    CHECK(output_shape(b, 0) ==
          shape{{Dim::Batch::id, 2}, {Dim::Head::id, 3}, {Dim::Seq::id, 5}, {Dim::HeadDim::id, 4}});
    std::vector<preset_variable> five{{"h", Dim::Head::id, 5}};
    CHECK_THROWS_WITH(bind_signature(heads_sig, "split_heads", "", in, {}, five), Catch::Contains("not divisible by 5"));
}

TEST_CASE("split queries say what a split does to every operand", "[signature]") {
    std::vector<shape> in{{{Dim::Batch::id, 4}, {Dim::Hidden::id, 16}}, {{Dim::FFN::id, 32}, {Dim::Hidden::id, 16}}};
    auto b = bind_signature(linear_sig, "linear", "", in, {});
    auto splits = b.legal_splits();
    REQUIRE(splits.size() == 3);

    auto k = b.effect_of_split(*b.find(Dim::Hidden::id));
    CHECK(k.role == dim_role::contracted);
    CHECK(k.inputs[0].effect == split_effect::sliced);
    CHECK(k.inputs[0].axis == 1);
    CHECK(k.inputs[1].effect == split_effect::sliced);
    CHECK(k.outputs[0].effect == split_effect::partial);

    auto n = b.effect_of_split(*b.find(Dim::FFN::id));
    CHECK(n.role == dim_role::spatial);
    CHECK(n.inputs[0].effect == split_effect::replicated);
    CHECK(n.inputs[1].axis == 0);
    CHECK(n.outputs[0].axis == 1);

    auto batch = b.effect_of_split(*b.find(Dim::Batch::id));
    CHECK(batch.inputs[1].effect == split_effect::replicated);
    CHECK(batch.outputs[0].effect == split_effect::sliced);

    // One operand's effect alone (effect_on, which the searcher asks without allocating) is
    // that operand's entry of the whole answer, for every variable and operand.
    for (std::size_t v = 0; v < b.vars.size(); ++v) {
        const split_option whole = b.effect_of_split(static_cast<int>(v));
        for (std::size_t k = 0; k < whole.inputs.size(); ++k) {
            CHECK(b.effect_on(static_cast<int>(v), true, k).effect == whole.inputs[k].effect);
            CHECK(b.effect_on(static_cast<int>(v), true, k).axis == whole.inputs[k].axis);
        }
        for (std::size_t k = 0; k < whole.outputs.size(); ++k) {
            CHECK(b.effect_on(static_cast<int>(v), false, k).effect == whole.outputs[k].effect);
            CHECK(b.effect_on(static_cast<int>(v), false, k).axis == whole.outputs[k].axis);
        }
    }

    // Frozen dims are never offered.
    std::vector<shape> norm{{{Dim::Batch::id, 4}, {Dim::Hidden::id, 8}}, {{Dim::Hidden::id, 8}}, {{Dim::Hidden::id, 8}}};
    auto nb = bind_signature(norm_sig, "layer_norm", "", norm, {});
    REQUIRE(nb.legal_splits().size() == 1);
    CHECK(nb.legal_splits()[0].dim == Dim::Batch::id);
}

TEST_CASE("dims are tag types and run-time ids at once", "[dim]") {
    using Expert = named_dim<"Expert">;
    static_assert(dim_id_of<Expert> == dim_id{"Expert"});
    static_assert(dim_tag<Dim::Batch>);
    CHECK(dim_id::intern(std::string("Ex") + "pert") == dim_id_of<Expert>);
    CHECK(dim_id::intern("Expert").name().data() == dim_id::intern("Expert").name().data());
}


namespace {
using Dim::Batch, Dim::Hidden, Dim::FFN, Dim::Seq;
constexpr signature typed = signature_from<inputs<dims<Batch, Seq, Hidden>, dims<FFN, Hidden>>, outputs<dims<Batch, Seq, FFN>>>();
static_assert(typed.input_count == 2 && typed.output_count == 1);
static_assert(typed.role(*typed.find("Hidden")) == dim_role::contracted);
static_assert(typed.role(*typed.find("FFN")) == dim_role::spatial);
constexpr signature typed_norm = signature_from<inputs<dims<Batch, frozen<Hidden>>>, outputs<dims<Batch, frozen<Hidden>>>>();
static_assert(typed_norm.role(*typed_norm.find("Hidden")) == dim_role::frozen);
static_assert(typed_norm.role(*typed_norm.find("Batch")) == dim_role::spatial);
}  // namespace

TEST_CASE("signatures built from dim types equal the parsed text", "[signature]") {
    constexpr signature text = parse_signature("Batch Seq Hidden, FFN Hidden -> Batch Seq FFN");
    REQUIRE(typed.var_count == text.var_count);
    for (int v = 0; v < text.var_count; ++v) {
        CHECK(typed.vars[static_cast<std::size_t>(v)].view() == text.vars[static_cast<std::size_t>(v)].view());
        CHECK(typed.role(v) == text.role(v));
    }
    std::vector<shape> in{{{Batch::id, 2}, {Seq::id, 3}, {Hidden::id, 4}}, {{FFN::id, 5}, {Hidden::id, 4}}};
    auto b = bind_signature(typed, "typed", "", in, {});
    CHECK(output_shape(b, 0) == shape{{Batch::id, 2}, {Seq::id, 3}, {FFN::id, 5}});
}
